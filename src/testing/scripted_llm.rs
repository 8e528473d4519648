//! `ScriptedLlm`: a model for tests and demos, without network. It answers from a
//! script and records every request, so a test can assert what the model was shown.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use futures_util::{stream, StreamExt};
use serde_json::Value;
use switchboard_actors::{
    ChatItem, ChatRole, Llm, LlmChunk, LlmError, LlmRequest, LlmStream, LlmUsage, ToolCallChunk,
};

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

/// A scripted model: answers a request with, in this order, the reply set for its index
/// ([`ScriptedLlm::on_request`]), the first rule that matches it ([`ScriptedLlm::rule`],
/// [`ScriptedLlm::when_user_says`]), the next scripted [`Reply`], or the fallback
/// ([`ScriptedLlm::otherwise`]). With none of them, the request fails the turn with an
/// error that prints the request (`SessionError::Llm`), so an unexpected request fails
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
    by_index: Mutex<std::collections::HashMap<usize, Reply>>,
    fallback: Mutex<Option<Reply>>,
    requests: Mutex<Vec<LlmRequest>>,
    next_call: AtomicU64,
}

impl fmt::Debug for ScriptedLlm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScriptedLlm")
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
        Arc::new(Self {
            script: Mutex::new(replies.into_iter().collect()),
            rules: Mutex::new(Vec::new()),
            by_index: Mutex::new(Default::default()),
            fallback: Mutex::new(None),
            requests: Mutex::new(Vec::new()),
            next_call: AtomicU64::new(0),
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
        let reply = self.answer(&request);
        let described = reply.is_none().then(|| describe(&request));
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
        let mut chunks: Vec<Result<LlmChunk, LlmError>> = Vec::new();
        let mut stalls = false;
        for chunk in reply.chunks {
            chunks.push(match chunk {
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
                ReplyChunk::Stall => {
                    stalls = true;
                    break;
                }
            });
        }
        let head = stream::iter(chunks);
        if stalls {
            head.chain(stream::pending()).boxed()
        } else {
            head.boxed()
        }
    }

    fn name(&self) -> &str {
        "scripted"
    }
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
