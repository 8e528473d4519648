//! A fake OpenAI-compatible server on 127.0.0.1, for the provider's tests and benchmark.
//!
//! It answers `POST /v1/chat/completions` with scripted answers: a recorded SSE body
//! (`tests/fixtures/openai/*.sse`) or one built here, sent chunk by chunk, with waits,
//! gates, a stall, a cut connection or an endless stream in between. Before answering it
//! checks each request as the real API does and refuses it with a 400 and OpenAI's error
//! JSON when it would be refused there: every tool message answers a tool call of the
//! assistant message before it (and every call is answered), call ids match
//! `^[a-zA-Z0-9_-]{1,40}$`, no assistant message is empty, `tool_choice` and
//! `parallel_tool_calls` come only with tools. Every request, refused or not, is recorded
//! for the test to read, and the server counts bodies that were dropped before they were
//! sent in full (the client went away).
//!
//! Include it with `#[path = "support/openai_server.rs"] mod openai_server;`. It lives in
//! `tests/` rather than in `switchboard::testing` because it needs an HTTP server (axum), a
//! dependency users of the library should not pay for; users test agents with
//! `ScriptedLlm`, which needs no network.
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    unreachable_pub,
    missing_docs
)]

use std::collections::{HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::post;
use axum::serve::ListenerExt;
use axum::Router;
use serde_json::{json, Value};
use tokio::sync::watch;

/// One piece of an answer's body.
#[derive(Clone)]
pub enum Part {
    /// Bytes sent as one HTTP chunk.
    Bytes(Bytes),
    /// A pause before the next part (simulates a slow model).
    Wait(Duration),
    /// Holds the next part until the test opens the gate.
    Gate(watch::Receiver<bool>),
    /// Sends nothing more and keeps the connection open.
    Stall,
    /// Breaks the connection without ending the body.
    Cut,
    /// Sends this event every `interval`, forever (until the client goes away).
    Endless { event: Bytes, interval: Duration },
}

/// One scripted answer.
#[derive(Clone)]
pub struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    parts: Vec<Part>,
}

/// The SSE frame of one event's data.
pub fn frame(data: &str) -> Bytes {
    Bytes::from(format!("data: {data}\n\n"))
}

impl Answer {
    /// A 200 whose body is these events' data, one event per HTTP chunk.
    pub fn sse<S: AsRef<str>>(events: impl IntoIterator<Item = S>) -> Self {
        Self {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            parts: events
                .into_iter()
                .map(|e| Part::Bytes(frame(e.as_ref())))
                .collect(),
        }
    }

    /// A recorded body from `tests/fixtures/openai/{name}.sse`, one event per HTTP chunk.
    pub fn recorded(name: &str) -> Self {
        let path = format!(
            "{}/tests/fixtures/openai/{name}.sse",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let events: Vec<String> = text
            .split("\n\n")
            .filter_map(|block| block.trim().strip_prefix("data: ").map(str::to_owned))
            .collect();
        assert!(!events.is_empty(), "{path} holds no `data:` event");
        Self::sse(events)
    }

    /// An error status with OpenAI's error JSON.
    pub fn error(status: u16, kind: &str, code: Option<&str>, message: &str) -> Self {
        let body =
            json!({"error": {"message": message, "type": kind, "param": null, "code": code}});
        Self {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            parts: vec![Part::Bytes(Bytes::from(body.to_string()))],
        }
    }

    /// Adds a response header.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Sends the same bytes in HTTP chunks of at most `size` bytes, cutting events (and
    /// UTF-8 characters) anywhere.
    pub fn split_every(mut self, size: usize) -> Self {
        let mut parts = Vec::new();
        let mut pending: Vec<u8> = Vec::new();
        let flush = |pending: &mut Vec<u8>, parts: &mut Vec<Part>| {
            for piece in pending.chunks(size) {
                parts.push(Part::Bytes(Bytes::copy_from_slice(piece)));
            }
            pending.clear();
        };
        for part in self.parts {
            match part {
                Part::Bytes(b) => pending.extend_from_slice(&b),
                other => {
                    flush(&mut pending, &mut parts);
                    parts.push(other);
                }
            }
        }
        flush(&mut pending, &mut parts);
        self.parts = parts;
        self
    }

    /// Keeps only the first `n` parts.
    pub fn truncate(mut self, n: usize) -> Self {
        self.parts.truncate(n);
        self
    }

    /// Inserts a part before part `index`.
    pub fn insert(mut self, index: usize, part: Part) -> Self {
        self.parts.insert(index, part);
        self
    }

    /// Appends a part.
    pub fn then(mut self, part: Part) -> Self {
        self.parts.push(part);
        self
    }

    /// How many parts the body has.
    pub fn len(&self) -> usize {
        self.parts.len()
    }
}

/// Builds answers in OpenAI's chunk format (what the recorded fixtures hold).
pub mod reply {
    use super::*;

    fn chunk(delta: Value, finish: Option<&str>) -> String {
        json!({
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 1_763_900_000,
            "model": "gpt-4.1-mini-2025-04-14",
            "system_fingerprint": "fp_fake",
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
            "usage": null
        })
        .to_string()
    }

    fn usage(prompt: u32, completion: u32) -> String {
        json!({
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 1_763_900_000,
            "model": "gpt-4.1-mini-2025-04-14",
            "choices": [],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0}
            }
        })
        .to_string()
    }

    /// The events of a text answer in these pieces, with usage and `[DONE]`.
    pub fn text_events(pieces: &[&str]) -> Vec<String> {
        let mut events = vec![chunk(
            json!({"role": "assistant", "content": "", "refusal": null}),
            None,
        )];
        events.extend(pieces.iter().map(|p| chunk(json!({"content": p}), None)));
        events.push(chunk(json!({}), Some("stop")));
        events.push(usage(20, pieces.len() as u32));
        events.push("[DONE]".into());
        events
    }

    /// A text answer.
    pub fn text(pieces: &[&str]) -> Answer {
        Answer::sse(text_events(pieces))
    }

    /// The events of an answer calling tools, `(id, name, arguments)`, each call's
    /// arguments sent in fragments of `fragment` characters, calls one after the other.
    pub fn tool_call_events(calls: &[(&str, &str, &str)], fragment: usize) -> Vec<String> {
        let mut events = vec![chunk(
            json!({"role": "assistant", "content": null, "refusal": null}),
            None,
        )];
        for (index, (id, name, arguments)) in calls.iter().enumerate() {
            events.push(chunk(
                json!({"tool_calls": [{"index": index, "id": id, "type": "function",
                    "function": {"name": name, "arguments": ""}}]}),
                None,
            ));
            let chars: Vec<char> = arguments.chars().collect();
            for piece in chars.chunks(fragment.max(1)) {
                let piece: String = piece.iter().collect();
                events.push(chunk(
                    json!({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}),
                    None,
                ));
            }
        }
        events.push(chunk(json!({}), Some("tool_calls")));
        events.push(usage(40, 12));
        events.push("[DONE]".into());
        events
    }

    /// An answer calling tools.
    pub fn tool_calls(calls: &[(&str, &str, &str)]) -> Answer {
        Answer::sse(tool_call_events(calls, 8))
    }
}

/// A request as the server received it.
#[derive(Clone, Debug)]
pub struct Recorded {
    /// The JSON body (`Value::Null` if it was not JSON).
    pub body: Value,
    /// The raw body.
    pub raw: Bytes,
    /// The `Authorization` header.
    pub authorization: Option<String>,
    /// When it arrived.
    pub at: Instant,
    /// Why the server refused it, if it did.
    pub refused: Option<String>,
}

type Responder = Box<dyn Fn(&Value) -> Option<Answer> + Send + Sync>;

struct Shared {
    answers: Mutex<VecDeque<Answer>>,
    responder: Mutex<Option<Responder>>,
    requests: Mutex<Vec<Recorded>>,
    arrived: watch::Sender<usize>,
    /// Bodies dropped before their last part was sent.
    aborted: watch::Sender<usize>,
    completed: AtomicUsize,
}

/// The running server; it stops when dropped.
pub struct FakeOpenAi {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeOpenAi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

const WAIT: Duration = Duration::from_secs(5);

impl FakeOpenAi {
    /// Starts on 127.0.0.1 with an ephemeral port, on the current tokio runtime.
    pub async fn start() -> Self {
        let shared = Arc::new(Shared {
            answers: Mutex::new(VecDeque::new()),
            responder: Mutex::new(None),
            requests: Mutex::new(Vec::new()),
            arrived: watch::channel(0).0,
            aborted: watch::channel(0).0,
            completed: AtomicUsize::new(0),
        });
        let app = Router::new()
            .route("/v1/chat/completions", post(handle))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // Each event goes out when it is written, as from a real API: without this, Nagle's
        // algorithm holds small writes until the client's delayed ACK (~40 ms).
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { addr, shared, task }
    }

    /// The base URL to give the provider: `http://127.0.0.1:{port}/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Queues answers, used in order.
    pub fn push(&self, answers: impl IntoIterator<Item = Answer>) {
        self.shared.answers.lock().unwrap().extend(answers);
    }

    /// Answers requests the queue has nothing for: the first answer the function gives
    /// for the request's JSON.
    pub fn respond_with(&self, f: impl Fn(&Value) -> Option<Answer> + Send + Sync + 'static) {
        *self.shared.responder.lock().unwrap() = Some(Box::new(f));
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.requests.lock().unwrap().clone()
    }

    /// Panics with the reasons if any request was refused.
    pub fn assert_none_refused(&self) {
        let refused: Vec<String> = self
            .requests()
            .into_iter()
            .enumerate()
            .filter_map(|(i, r)| {
                r.refused
                    .map(|why| format!("request {i}: {why}\n{}", r.body))
            })
            .collect();
        assert!(
            refused.is_empty(),
            "the server refused requests:\n{}",
            refused.join("\n")
        );
    }

    /// Waits (up to 5 s) until `n` requests have arrived.
    pub async fn wait_for_requests(&self, n: usize) {
        let mut rx = self.shared.arrived.subscribe();
        tokio::time::timeout(WAIT, rx.wait_for(|count| *count >= n))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "waited 5 s for {n} requests to arrive; {} did",
                    *self.shared.arrived.borrow()
                )
            })
            .unwrap();
    }

    /// Waits (up to 5 s) until `n` answer bodies were dropped before their end: the
    /// client closed the connection.
    pub async fn wait_for_aborted(&self, n: usize) {
        let mut rx = self.shared.aborted.subscribe();
        tokio::time::timeout(WAIT, rx.wait_for(|count| *count >= n))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "waited 5 s for the server to see {n} connection(s) closed mid-answer; \
                     it saw {}",
                    *self.shared.aborted.borrow()
                )
            })
            .unwrap();
    }

    /// Answer bodies sent to their end.
    pub fn completed(&self) -> usize {
        self.shared.completed.load(Ordering::SeqCst)
    }
}

async fn handle(State(shared): State<Arc<Shared>>, headers: HeaderMap, raw: Bytes) -> Response {
    let parsed: Result<Value, _> = serde_json::from_slice(&raw);
    let refused = match &parsed {
        Ok(body) => check_request(body).err(),
        Err(e) => Some(format!(
            "We could not parse the JSON body of your request. ({e})"
        )),
    };
    let body = parsed.unwrap_or(Value::Null);
    let answer = if refused.is_none() {
        let queued = shared.answers.lock().unwrap().pop_front();
        queued.or_else(|| {
            let responder = shared.responder.lock().unwrap();
            responder.as_ref().and_then(|f| f(&body))
        })
    } else {
        None
    };
    let refused = match (&refused, &answer) {
        (None, None) => Some("fake server: no scripted answer left for this request".to_owned()),
        _ => refused,
    };
    shared.requests.lock().unwrap().push(Recorded {
        body,
        raw,
        authorization: headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        at: Instant::now(),
        refused: refused.clone(),
    });
    shared.arrived.send_modify(|n| *n += 1);
    let answer = match (refused, answer) {
        (Some(why), _) => Answer::error(400, "invalid_request_error", None, &why),
        (None, Some(answer)) => answer,
        (None, None) => unreachable!(),
    };
    respond(shared, answer)
}

/// Counts the body as aborted if it is dropped before its last part.
struct BodyGuard {
    shared: Arc<Shared>,
    finished: bool,
}

impl BodyGuard {
    fn finish(&mut self) {
        self.finished = true;
    }
}

impl Drop for BodyGuard {
    fn drop(&mut self) {
        if self.finished {
            self.shared.completed.fetch_add(1, Ordering::SeqCst);
        } else {
            self.shared.aborted.send_modify(|n| *n += 1);
        }
    }
}

fn respond(shared: Arc<Shared>, answer: Answer) -> Response {
    let mut builder = Response::builder().status(StatusCode::from_u16(answer.status).unwrap());
    for (name, value) in &answer.headers {
        builder = builder.header(name.as_str(), value.as_str());
    }
    let state = (
        VecDeque::from(answer.parts),
        BodyGuard {
            shared,
            finished: false,
        },
    );
    let stream = futures_util::stream::unfold(state, |(mut parts, mut guard)| async move {
        loop {
            let Some(part) = parts.pop_front() else {
                guard.finish();
                return None;
            };
            match part {
                Part::Bytes(bytes) => {
                    return Some((Ok::<_, std::io::Error>(bytes), (parts, guard)));
                }
                Part::Wait(d) => tokio::time::sleep(d).await,
                Part::Gate(mut rx) => {
                    let _ = rx.wait_for(|open| *open).await;
                }
                Part::Stall => std::future::pending::<()>().await,
                Part::Cut => {
                    return Some((
                        Err(std::io::Error::other("fake server: connection cut")),
                        (parts, guard),
                    ))
                }
                Part::Endless { event, interval } => {
                    tokio::time::sleep(interval).await;
                    parts.push_front(Part::Endless {
                        event: event.clone(),
                        interval,
                    });
                    return Some((Ok(event), (parts, guard)));
                }
            }
        }
    });
    builder.body(Body::from_stream(stream)).unwrap()
}

fn valid_id(id: &str) -> bool {
    (1..=40).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The checks the real API makes that a client can get wrong; the messages are the API's.
pub fn check_request(body: &Value) -> Result<(), String> {
    let obj = body.as_object().ok_or("the body must be a JSON object")?;
    match obj.get("model") {
        Some(Value::String(m)) if !m.is_empty() => {}
        _ => return Err("you must provide a model parameter".into()),
    }
    if obj.get("stream") != Some(&Value::Bool(true)) {
        return Err("this fake server only streams: `stream` must be true".into());
    }
    let has_tools = match obj.get("tools") {
        None => false,
        Some(Value::Array(tools)) if !tools.is_empty() => {
            for (i, tool) in tools.iter().enumerate() {
                if tool["type"] != "function" || !tool["function"]["name"].is_string() {
                    return Err(format!("Invalid 'tools[{i}]': expected a function tool"));
                }
            }
            true
        }
        Some(_) => return Err("Invalid 'tools': empty array. Expected an array with minimum length 1, but got an empty array instead.".into()),
    };
    if !has_tools {
        for field in ["tool_choice", "parallel_tool_calls"] {
            if obj.contains_key(field) {
                return Err(format!(
                    "Invalid value for '{field}': '{field}' is only allowed when 'tools' are specified."
                ));
            }
        }
    }
    let messages = obj
        .get("messages")
        .and_then(Value::as_array)
        .filter(|m| !m.is_empty())
        .ok_or("Invalid 'messages': expected a non-empty array")?;
    // Calls of the latest assistant message still waiting for their tool message.
    let mut open: Vec<String> = Vec::new();
    let mut answered: HashSet<String> = HashSet::new();
    let mut last_calls: HashSet<String> = HashSet::new();
    for (i, message) in messages.iter().enumerate() {
        let role = message["role"].as_str().unwrap_or_default();
        if role != "tool" && !open.is_empty() {
            return Err(format!(
                "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have response messages: {}",
                open.join(", ")
            ));
        }
        match role {
            "system" | "user" => {
                if !message["content"].is_string() {
                    return Err(format!(
                        "Invalid 'messages[{i}].content': expected a string"
                    ));
                }
            }
            "assistant" => {
                let calls = message["tool_calls"].as_array();
                let text = message["content"].as_str().unwrap_or_default();
                let no_calls = calls.is_none_or(|c| c.is_empty());
                if text.is_empty() && no_calls {
                    return Err(format!(
                        "Invalid 'messages[{i}]': an assistant message must have content or tool_calls"
                    ));
                }
                last_calls.clear();
                answered.clear();
                for (j, call) in calls.into_iter().flatten().enumerate() {
                    let id = call["id"].as_str().unwrap_or_default();
                    if !valid_id(id) {
                        return Err(format!(
                            "Invalid 'messages[{i}].tool_calls[{j}].id': '{id}' must match ^[a-zA-Z0-9_-]{{1,40}}$"
                        ));
                    }
                    if call["type"] != "function"
                        || !call["function"]["name"].is_string()
                        || !call["function"]["arguments"].is_string()
                    {
                        return Err(format!(
                            "Invalid 'messages[{i}].tool_calls[{j}]': expected a function call with name and arguments"
                        ));
                    }
                    if !last_calls.insert(id.to_owned()) {
                        return Err(format!("Duplicate tool call id '{id}' in messages[{i}]"));
                    }
                    open.push(id.to_owned());
                }
            }
            "tool" => {
                let id = message["tool_call_id"].as_str().unwrap_or_default();
                if !last_calls.contains(id) || answered.contains(id) {
                    return Err(format!(
                        "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls' (messages[{i}], tool_call_id '{id}')"
                    ));
                }
                if !message["content"].is_string() {
                    return Err(format!(
                        "Invalid 'messages[{i}].content': expected a string"
                    ));
                }
                answered.insert(id.to_owned());
                open.retain(|o| o != id);
            }
            other => return Err(format!("Invalid 'messages[{i}].role': '{other}'")),
        }
    }
    if !open.is_empty() {
        return Err(format!(
            "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have response messages: {}",
            open.join(", ")
        ));
    }
    Ok(())
}
