//! `ScriptedLlm`: a model for tests and demos, without network. It answers from a
//! script and records every request, so a test can assert what the model was shown.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::{future, stream, StreamExt};
use serde_json::Value;
use switchboard_actors::{
    ChatItem, ChatRole, Llm, LlmChunk, LlmError, LlmRequest, LlmStream, LlmUsage, ToolCallChunk,
};
use tokio::sync::watch;

use super::{Gate, WaitError};

/// One scripted answer: text and tool calls, in order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reply {
    chunks: Vec<ReplyChunk>,
}

#[derive(Clone, Debug, PartialEq)]
enum ReplyChunk {
    Text(String),
    Call {
        id: Option<String>,
        name: String,
        arguments: String,
    },
    Usage(LlmUsage),
    /// The stream fails here.
    Error(LlmError),
    /// The stream yields nothing more and never ends, like a stalled provider.
    Stall,
    /// The stream waits here until the gate opens.
    Wait(Gate),
}

impl Reply {
    /// An answer that says `text`.
    pub fn text(text: impl Into<String>) -> Self {
        Self::default().and_text(text)
    }

    /// An answer whose stream never yields a chunk nor ends: a provider that stalls
    /// (the engine's first-chunk timeout, or an interruption, ends the turn).
    pub fn stall() -> Self {
        Self::default().and_stall()
    }

    /// An answer that calls `name` with `arguments` (a call id is assigned).
    pub fn tool_call(name: impl Into<String>, arguments: Value) -> Self {
        Self::default().and_tool_call(name, arguments)
    }

    /// An answer that calls `name` with this call id and raw argument text (which may be
    /// invalid JSON, to test argument errors); see [`Reply::and_raw_tool_call`].
    pub fn raw_tool_call(
        call_id: impl Into<String>,
        name: impl Into<String>,
        arguments: impl Into<String>,
    ) -> Self {
        Self::default().and_raw_tool_call(call_id, name, arguments)
    }

    /// Adds text.
    pub fn and_text(mut self, text: impl Into<String>) -> Self {
        self.chunks.push(ReplyChunk::Text(text.into()));
        self
    }

    /// Adds a tool call (a call id is assigned: `call_1`, `call_2`, … per model).
    pub fn and_tool_call(mut self, name: impl Into<String>, arguments: Value) -> Self {
        self.chunks.push(ReplyChunk::Call {
            id: None,
            name: name.into(),
            arguments: arguments.to_string(),
        });
        self
    }

    /// Then the stream waits until the test opens `gate`: what came before is streamed
    /// (a speech has started), what comes after is not yet. To hold a whole request
    /// instead, use [`ScriptedLlm::hold`].
    ///
    /// ```
    /// use switchboard::testing::{Gate, Reply};
    /// let gate = Gate::new();
    /// let reply = Reply::text("Hello there, ").and_wait(&gate).and_text("how are you?");
    /// # let _ = reply;
    /// ```
    pub fn and_wait(mut self, gate: &Gate) -> Self {
        self.chunks.push(ReplyChunk::Wait(gate.clone()));
        self
    }

    /// Then the stream stalls: no more chunks, no end.
    pub fn and_stall(mut self) -> Self {
        self.chunks.push(ReplyChunk::Stall);
        self
    }

    /// Then the stream fails with `error` (what came before it was streamed).
    pub fn and_error(mut self, error: LlmError) -> Self {
        self.chunks.push(ReplyChunk::Error(error));
        self
    }

    /// Adds a usage report (what a provider sends last).
    pub fn and_usage(mut self, usage: LlmUsage) -> Self {
        self.chunks.push(ReplyChunk::Usage(usage));
        self
    }

    /// Adds a tool call with this call id and raw argument text (which may be invalid
    /// JSON, to test argument errors).
    pub fn and_raw_tool_call(
        mut self,
        call_id: impl Into<String>,
        name: impl Into<String>,
        arguments: impl Into<String>,
    ) -> Self {
        self.chunks.push(ReplyChunk::Call {
            id: Some(call_id.into()),
            name: name.into(),
            arguments: arguments.into(),
        });
        self
    }
}

type Rule = Box<dyn Fn(&LlmRequest) -> Option<Reply> + Send + Sync>;

/// One held request: the gate its answer waits on, and the request once it came.
#[derive(Debug)]
struct Hold {
    gate: Gate,
    request: watch::Sender<Option<LlmRequest>>,
}

/// A request of a [`ScriptedLlm`] held in flight until the test releases it: from
/// [`ScriptedLlm::hold`].
///
/// The request is answered as usual (its reply is chosen when it arrives), but the
/// answer's stream yields nothing until [`HeldRequest::release`]: the engine waits on the
/// model, as it would on a slow provider. Meanwhile the test can act: interrupt, speak,
/// hand off, close. Dropping the handle does not release the request.
#[derive(Debug)]
pub struct HeldRequest {
    index: usize,
    hold: Arc<Hold>,
}

impl HeldRequest {
    /// The index of the held request (0 for the model's first request).
    pub fn index(&self) -> usize {
        self.index
    }

    /// Whether the engine has sent the request yet.
    pub fn is_requested(&self) -> bool {
        self.hold.request.borrow().is_some()
    }

    /// Waits until the engine has sent the request (at once if it has), for at most
    /// `timeout`; returns it. Under paused time the timeout is virtual.
    pub async fn requested(&self, timeout: Duration) -> Result<LlmRequest, WaitError> {
        let mut request = self.hold.request.subscribe();
        let wait = async {
            // The sender lives in `self.hold`, so the channel cannot close while we wait.
            match request.wait_for(Option::is_some).await {
                Ok(request) => request.clone(),
                Err(_) => None,
            }
        };
        match tokio::time::timeout(timeout, wait).await {
            Ok(Some(request)) => Ok(request),
            Ok(None) | Err(_) => Err(WaitError::Timeout {
                waited_for: format!("request {} to the scripted model", self.index),
                timeout,
                saw: Vec::new(),
            }),
        }
    }

    /// Lets the answer stream (at once if the request has not come yet: it will not wait).
    pub fn release(&self) {
        self.hold.gate.open();
    }

    /// Whether the request was released.
    pub fn is_released(&self) -> bool {
        self.hold.gate.is_open()
    }
}

/// A scripted model: answers a request with, in this order, the reply set for its index
/// ([`ScriptedLlm::on_request`]), the first rule that matches it ([`ScriptedLlm::rule`],
/// [`ScriptedLlm::when_user_says`]), the next scripted [`Reply`], or the fallback
/// ([`ScriptedLlm::otherwise`]). With none of them, the request fails the turn with an
/// error that prints the request (`TurnFailure::Llm`), so an unexpected request fails
/// the test with what the model was shown.
///
/// ```
/// use switchboard::testing::{Reply, ScriptedLlm};
/// let llm = ScriptedLlm::new([
///     Reply::tool_call("get_weather", serde_json::json!({"city": "Paris"})),
///     Reply::text("It is sunny in Paris."),
/// ]);
/// assert_eq!(llm.requests().len(), 0);
/// ```
pub struct ScriptedLlm {
    script: Mutex<VecDeque<Reply>>,
    rules: Mutex<Vec<Rule>>,
    by_index: Mutex<HashMap<usize, Reply>>,
    holds: Mutex<HashMap<usize, Arc<Hold>>>,
    fallback: Mutex<Option<Reply>>,
    requests: Mutex<Vec<LlmRequest>>,
    next_call: AtomicU64,
    name: String,
}

impl fmt::Debug for ScriptedLlm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScriptedLlm")
            .field("name", &self.name)
            .field("remaining", &lock(&self.script).len())
            .field("requests", &lock(&self.requests).len())
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Test helper state stays usable after a panicking test thread.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl ScriptedLlm {
    /// A model that answers with these replies, in order.
    pub fn new(replies: impl IntoIterator<Item = Reply>) -> Arc<Self> {
        Self::named("scripted", replies)
    }

    /// A model named `name` ([`Llm::name`]; `scripted` for [`ScriptedLlm::new`]) that
    /// answers with these replies, in order: tells several models apart in
    /// [`LlmMetrics`](switchboard_actors::LlmMetrics), e.g. the models of a
    /// [`FallbackLlm`](crate::providers::FallbackLlm).
    pub fn named(name: impl Into<String>, replies: impl IntoIterator<Item = Reply>) -> Arc<Self> {
        Arc::new(Self {
            script: Mutex::new(replies.into_iter().collect()),
            rules: Mutex::new(Vec::new()),
            by_index: Mutex::new(Default::default()),
            holds: Mutex::new(Default::default()),
            fallback: Mutex::new(None),
            requests: Mutex::new(Vec::new()),
            next_call: AtomicU64::new(0),
            name: name.into(),
        })
    }

    /// Appends replies to the script.
    pub fn push(&self, replies: impl IntoIterator<Item = Reply>) {
        lock(&self.script).extend(replies);
    }

    /// Adds a rule consulted before the script: the first rule returning a reply answers.
    pub fn rule(&self, rule: impl Fn(&LlmRequest) -> Option<Reply> + Send + Sync + 'static) {
        lock(&self.rules).push(Box::new(rule));
    }

    /// Answers request number `index` (0 for the first request this model receives) with
    /// `reply`, before rules and script.
    pub fn on_request(&self, index: usize, reply: Reply) {
        lock(&self.by_index).insert(index, reply);
    }

    /// Answers the first request of user turn `turn` (0 for the first user message this
    /// model sees in a session) with `reply`: the request whose chat context ends with
    /// that turn's user message. Later steps of the turn fall through to the other rules
    /// and the script.
    pub fn on_turn(&self, turn: usize, reply: Reply) {
        self.rule(move |req| {
            let items = req.chat.items();
            let ends_with_user =
                matches!(items.last(), Some(ChatItem::Message(m)) if m.role == ChatRole::User);
            let user_turns = items
                .iter()
                .filter(|i| matches!(i, ChatItem::Message(m) if m.role == ChatRole::User))
                .count();
            (ends_with_user && user_turns == turn + 1).then(|| reply.clone())
        });
    }

    /// Answers `reply` whenever the last user message contains `text`.
    pub fn when_user_says(&self, text: impl Into<String>, reply: Reply) {
        let text = text.into();
        self.rule(move |req| {
            let last_user = req.chat.items().iter().rev().find_map(|item| match item {
                ChatItem::Message(m) if m.role == ChatRole::User => Some(m.content.as_str()),
                _ => None,
            });
            last_user
                .is_some_and(|m| m.contains(&text))
                .then(|| reply.clone())
        });
    }

    /// Answers `reply` whenever the script and the rules have nothing (default: fail).
    pub fn otherwise(&self, reply: Reply) {
        *lock(&self.fallback) = Some(reply);
    }

    /// Holds request number `index` (0 for the model's first request) in flight: its
    /// answer streams only once the test calls [`HeldRequest::release`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use switchboard::prelude::*;
    /// use switchboard::testing::{Reply, ScriptedLlm};
    ///
    /// # #[actix::main]
    /// # async fn main() {
    /// let llm = ScriptedLlm::new([Reply::text("Hello!")]);
    /// let held = llm.hold(0);
    /// let session = Session::builder()
    ///     .llm(llm.clone())
    ///     .agent(Agent::builder("agent-a").build().unwrap())
    ///     .start(&Engine::current().unwrap())
    ///     .await
    ///     .unwrap();
    /// let s = session.clone();
    /// let turn = tokio::spawn(async move { s.run("hi").await });
    /// let request = held.requested(Duration::from_secs(5)).await.unwrap();
    /// assert_eq!(session.agent_state(), AgentState::Thinking); // waiting on the model
    /// # let _ = request;
    /// held.release();
    /// let result = turn.await.unwrap().unwrap();
    /// assert_eq!(result.assistant_messages().collect::<Vec<_>>(), ["Hello!"]);
    /// session.close().await.unwrap();
    /// # }
    /// ```
    pub fn hold(&self, index: usize) -> HeldRequest {
        let hold = lock(&self.holds)
            .entry(index)
            .or_insert_with(|| {
                Arc::new(Hold {
                    gate: Gate::new(),
                    request: watch::channel(None).0,
                })
            })
            .clone();
        HeldRequest { index, hold }
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<LlmRequest> {
        lock(&self.requests).clone()
    }

    /// How many requests were received.
    pub fn request_count(&self) -> usize {
        lock(&self.requests).len()
    }

    /// How many scripted replies are left.
    pub fn remaining(&self) -> usize {
        lock(&self.script).len()
    }

    fn answer(&self, request: &LlmRequest) -> Option<Reply> {
        let index = lock(&self.requests).len();
        if let Some(reply) = lock(&self.by_index).remove(&index) {
            return Some(reply);
        }
        if let Some(reply) = lock(&self.rules).iter().find_map(|rule| rule(request)) {
            return Some(reply);
        }
        if let Some(reply) = lock(&self.script).pop_front() {
            return Some(reply);
        }
        lock(&self.fallback).clone()
    }
}

impl Llm for ScriptedLlm {
    fn chat(&self, request: LlmRequest) -> LlmStream {
        let index = lock(&self.requests).len();
        let hold = lock(&self.holds).get(&index).cloned();
        let stream = self.stream(request, hold.as_ref());
        match hold {
            // Nothing streams until the test releases the request.
            Some(hold) => stream::once(async move {
                hold.gate.wait().await;
                stream
            })
            .flatten()
            .boxed(),
            None => stream,
        }
    }

    fn name(&self) -> &str {
        &self.name
    }
}

impl ScriptedLlm {
    /// Records `request` and builds the stream of its answer.
    fn stream(&self, request: LlmRequest, hold: Option<&Arc<Hold>>) -> LlmStream {
        let reply = self.answer(&request);
        let described = reply.is_none().then(|| describe(&request));
        if let Some(hold) = hold {
            hold.request.send_replace(Some(request.clone()));
        }
        lock(&self.requests).push(request);
        let Some(reply) = reply else {
            let message = format!(
                "ScriptedLlm: unexpected request (index {}, counting from 0 like `on_request`): \
                 no reply set for its index, no rule matched, the script is exhausted and \
                 there is no `otherwise` reply. The request:\n{}",
                self.request_count() - 1,
                described.unwrap_or_default()
            );
            return Box::pin(stream::iter([Err(LlmError::new(message))]));
        };
        let mut chunks: Vec<Step> = Vec::new();
        let mut stalls = false;
        for chunk in reply.chunks {
            chunks.push(Step::Chunk(match chunk {
                ReplyChunk::Text(text) => Ok(LlmChunk::Text(text)),
                ReplyChunk::Call {
                    id,
                    name,
                    arguments,
                } => Ok(LlmChunk::ToolCall(ToolCallChunk {
                    call_id: id.unwrap_or_else(|| {
                        format!(
                            "call_{}",
                            self.next_call.fetch_add(1, Ordering::Relaxed) + 1
                        )
                    }),
                    name,
                    arguments,
                })),
                ReplyChunk::Usage(usage) => Ok(LlmChunk::Usage(usage)),
                ReplyChunk::Error(error) => Err(error),
                ReplyChunk::Wait(gate) => {
                    chunks.push(Step::Wait(gate));
                    continue;
                }
                ReplyChunk::Stall => {
                    stalls = true;
                    break;
                }
            }));
        }
        let head = stream::iter(chunks)
            .then(|step| async move {
                match step {
                    Step::Chunk(chunk) => Some(chunk),
                    Step::Wait(gate) => {
                        gate.wait().await;
                        None
                    }
                }
            })
            .filter_map(future::ready);
        if stalls {
            head.chain(stream::pending()).boxed()
        } else {
            head.boxed()
        }
    }
}

/// One step of a scripted answer's stream.
enum Step {
    /// A chunk to yield.
    Chunk(Result<LlmChunk, LlmError>),
    /// A gate to wait on before the next chunk.
    Wait(Gate),
}

fn describe(request: &LlmRequest) -> String {
    let mut out = format!(
        "agent: {}\ntool_choice: {:?}\ntools: {}\n",
        request.agent,
        request.tool_choice,
        request
            .tools
            .iter()
            .map(|t| t.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    if let Some(extra) = &request.extra_instructions {
        out.push_str(&format!("extra instructions: {extra}\n"));
    }
    for item in request.chat.items() {
        out.push_str(&format!(
            "  {}\n",
            serde_json::to_string(item).unwrap_or_default()
        ));
    }
    out
}
