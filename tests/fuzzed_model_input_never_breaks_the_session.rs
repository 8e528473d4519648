//! Issue 12, fuzzed model input through the public `Llm` trait: whatever the model sends
//! — random tool names, argument texts (JSON and not, huge, deeply nested), call ids
//! (repeated, colliding with derived ids, odd characters), any chunking of its text, tool
//! calls in a reply that allows none — every call gets exactly one output, a call that
//! cannot run gets an error output the model can read (never a panic), a call that can
//! run runs, and the session's next turn and its close work.
//!
//! `RELIABILITY_CASES=5000 cargo test --release --test fuzzed_model_input_never_breaks_the_session`
//! runs more cases. The same input, as raw bytes, is a `cargo fuzz` target in
//! `fuzz/fuzz_targets/model_input.rs` (see `RELIABILITY.md`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod reliability;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{stream, StreamExt};
use proptest::prelude::*;
use reliability::{cases, watch_panics};
use serde_json::{json, Value};
use switchboard::prelude::*;
use switchboard::{LlmChunk, LlmError, LlmRequest, LlmStream, ToolCallChunk, ToolChoice};

const BOUND: Duration = Duration::from_secs(60);
/// The session's argument limit in these tests (the default is 64 KiB).
const MAX_ARGUMENT_BYTES: usize = 16 * 1024;
const MAX_CALLS: usize = 8;

/// What the model streams for one request.
#[derive(Clone, Debug)]
enum Piece {
    Text(String),
    Call {
        id: String,
        name: String,
        args: String,
    },
}

/// A model that replays generated pieces: the first request of the turn gets `first`, a
/// request with tools off (the deferred reply) gets `deferred`, every other one text.
struct Replay {
    first: Mutex<Option<Vec<Piece>>>,
    deferred: Vec<Piece>,
    requests: Mutex<Vec<LlmRequest>>,
}

impl Llm for Replay {
    fn chat(&self, request: LlmRequest) -> LlmStream {
        let pieces = if request.tool_choice == ToolChoice::None {
            self.deferred.clone()
        } else {
            self.first
                .lock()
                .unwrap()
                .take()
                .unwrap_or_else(|| vec![Piece::Text("Done.".into())])
        };
        self.requests.lock().unwrap().push(request);
        let chunks: Vec<Result<LlmChunk, LlmError>> = pieces
            .into_iter()
            .map(|piece| {
                Ok(match piece {
                    Piece::Text(text) => LlmChunk::Text(text),
                    Piece::Call { id, name, args } => LlmChunk::ToolCall(ToolCallChunk {
                        call_id: id,
                        name,
                        arguments: args,
                    }),
                })
            })
            .collect();
        stream::iter(chunks).boxed()
    }
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct Query {
    q: String,
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct Nested {
    v: Value,
}

/// The tools the model may name, and whether `args` would parse for each.
fn parses(name: &str, args: &str) -> bool {
    if args.len() > MAX_ARGUMENT_BYTES {
        return false;
    }
    let value: Value = if args.trim().is_empty() {
        json!({})
    } else {
        match serde_json::from_str(args) {
            Ok(value) => value,
            Err(_) => return false,
        }
    };
    let mut value = value;
    if let Some(object) = value.as_object_mut() {
        object.remove(switchboard::CONFIRM_DUPLICATE_PARAM);
    }
    match name {
        "echo" | "progress" => serde_json::from_value::<Query>(value).is_ok(),
        "nested" => serde_json::from_value::<Nested>(value).is_ok(),
        _ => false,
    }
}

fn tools() -> Vec<Tool> {
    vec![
        Tool::new(
            "echo",
            "Echoes",
            |_ctx: RunContext, args: Query| async move {
                Ok::<_, ToolFailure>(format!("echo {}", args.q.len()))
            },
        )
        .on_duplicate(DuplicatePolicy::Allow),
        Tool::new(
            "nested",
            "Takes any value",
            |_ctx: RunContext, args: Nested| async move {
                Ok::<_, ToolFailure>(format!("nested {}", args.v.is_object()))
            },
        )
        .on_duplicate(DuplicatePolicy::Allow),
        Tool::new(
            "progress",
            "Updates, then returns",
            |ctx: RunContext, _: Query| async move {
                ctx.update("working").await?;
                Ok::<_, ToolFailure>("finished")
            },
        )
        .on_duplicate(DuplicatePolicy::Allow),
    ]
}

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop_oneof![Just("echo"), Just("nested"), Just("progress")].prop_map(String::from),
        1 => Just("cancel_task".to_owned()),
        1 => Just("get_running_tasks".to_owned()),
        2 => "[a-zA-Z0-9_\\-]{0,70}",
        1 => "\\PC{0,20}",
        1 => Just("echo\u{0}".to_owned()),
        1 => (1usize..3000).prop_map(|n| "e".repeat(n)),
    ]
}

fn args() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "\\PC{0,24}".prop_map(|q| json!({ "q": q }).to_string()),
        2 => any::<i64>().prop_map(|v| json!({ "v": v, "q": "x" }).to_string()),
        2 => "\\PC{0,40}",
        1 => Just(String::new()),
        1 => Just("null".to_owned()),
        1 => Just(r#"{"q": "x", "confirm_duplicate": true}"#.to_owned()),
        1 => Just(r#"{"q": 12}"#.to_owned()),
        1 => (1usize..5000).prop_map(|depth| {
            format!("{{\"v\": {}0{}}}", "[".repeat(depth), "]".repeat(depth))
        }),
        1 => (1usize..5000).prop_map(|depth| "[".repeat(depth)),
        1 => (MAX_ARGUMENT_BYTES - 16..MAX_ARGUMENT_BYTES * 4).prop_map(|n| {
            format!("{{\"q\": \"{}\"}}", "A".repeat(n))
        }),
        1 => (1usize..200).prop_map(|n| format!("{{\"q\": \"{}", "\u{1F600}".repeat(n))),
    ]
}

fn id() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => (1u32..6).prop_map(|n| format!("call_{n}")),
        2 => Just("same".to_owned()),
        1 => Just(String::new()),
        1 => prop_oneof![
            Just("call_1/update_1"),
            Just("call_1/finished"),
            Just("call_1~2"),
            Just("same/finished"),
            Just("same~2"),
            Just("/"),
            Just("~"),
        ]
        .prop_map(String::from),
        2 => "\\PC{0,30}",
        1 => (1usize..2000).prop_map(|n| "i".repeat(n)),
    ]
}

fn piece() -> impl Strategy<Value = Piece> {
    prop_oneof![
        1 => "\\PC{0,12}".prop_map(Piece::Text),
        3 => (id(), name(), args()).prop_map(|(id, name, args)| Piece::Call { id, name, args }),
    ]
}

/// One generated model: its answer to the turn, and to the deferred reply.
#[derive(Clone, Debug)]
struct Model {
    first: Vec<Piece>,
    deferred: Vec<Piece>,
}

fn model() -> impl Strategy<Value = Model> {
    (
        prop::collection::vec(piece(), 0..12),
        prop::collection::vec(piece(), 0..4),
    )
        .prop_map(|(first, deferred)| Model { first, deferred })
}

fn check_chat(what: &str, chat: &ChatContext) -> Result<(), String> {
    chat.check_invariant()
        .map_err(|breach| format!("{what}: chat invariant broken: {breach}"))
}

fn run_model(model: &Model) -> Result<(), String> {
    watch_panics();
    actix::System::new().block_on(async {
        tokio::time::pause();
        let llm = Arc::new(Replay {
            first: Mutex::new(Some(model.first.clone())),
            deferred: model.deferred.clone(),
            requests: Mutex::new(Vec::new()),
        });
        let mut agent = Agent::builder("agent");
        for tool in tools() {
            agent = agent.tool(tool);
        }
        let session = Session::builder()
            .llm(llm.clone())
            .agent(agent.build().unwrap())
            .max_argument_bytes(MAX_ARGUMENT_BYTES)
            .max_calls_per_step(MAX_CALLS)
            .inspect(true)
            .start(&Engine::current().unwrap())
            .await
            .map_err(|e| e.to_string())?;
        let inspector = session.inspector().unwrap();
        let bounded = |what: &'static str| {
            move |r: Result<_, tokio::time::error::Elapsed>| {
                r.map_err(|_| format!("{what} did not answer within {BOUND:?}"))
            }
        };
        let first = tokio::time::timeout(BOUND, session.run("go"))
            .await
            .map_err(|_| "run() did not answer".to_owned())?
            .map_err(|e| format!("run() failed: {e}"))?;
        tokio::time::timeout(BOUND, session.wait_for_settled())
            .await
            .map_err(|_| "the session did not settle".to_owned())?
            .map_err(|e| format!("wait_for_settled: {e}"))?;
        // The calls the model made in the turn's first step, in order: the calls before
        // the first output (the turn's events also hold background items that came in
        // while it still ran).
        let step_calls: Vec<_> = first
            .events
            .iter()
            .skip_while(|item| !matches!(item, ChatItem::FunctionCall(_)))
            .map_while(|item| match item {
                ChatItem::FunctionCall(call) => Some(call.clone()),
                _ => None,
            })
            .collect();
        let chat = tokio::time::timeout(BOUND, session.chat_context())
            .await
            .map_err(|_| "chat_context() did not answer".to_owned())?
            .map_err(|e| e.to_string())?;
        check_chat("the chat", &chat)?;
        for (index, request) in llm.requests.lock().unwrap().iter().enumerate() {
            check_chat(&format!("request {index}"), &request.chat)?;
        }
        let deferred_ids: Vec<String> = chat
            .items()
            .iter()
            .filter_map(|item| match item {
                ChatItem::FunctionCall(c)
                    if !step_calls.iter().any(|s| s.call_id == c.call_id)
                        && !c.call_id.contains('/') =>
                {
                    Some(c.call_id.clone())
                }
                _ => None,
            })
            .collect();
        for (index, call) in step_calls.iter().enumerate() {
            let out = chat
                .output_of(&call.call_id)
                .ok_or_else(|| format!("call {:?} has no output", call.call_id))?;
            if out.output.len() > 2_000 {
                return Err(format!(
                    "the output of {:?} quotes too much ({} bytes)",
                    call.call_id,
                    out.output.len()
                ));
            }
            // `cancel_task` and `get_running_tasks` are not exposed here (no tool allows
            // cancellation): unknown tools like any other name.
            let should_run = index < MAX_CALLS && parses(&call.name, &call.arguments);
            if should_run && out.is_error {
                return Err(format!(
                    "the valid call {} {:?} got an error: {}",
                    call.name,
                    excerpt(&call.arguments),
                    out.output
                ));
            }
            let error_output = out.is_error && out.output.starts_with("Error");
            if !should_run && !error_output {
                let items: Vec<String> = chat
                    .items()
                    .iter()
                    .map(|i| excerpt(&serde_json::to_string(i).unwrap_or_default()))
                    .collect();
                return Err(format!(
                    "the call {:?} ({}, index {index}) {:?} cannot run but its output is not \
                     an error: {:?}\n  {}",
                    excerpt(&call.name),
                    call.call_id,
                    excerpt(&call.arguments),
                    out.output,
                    items.join("\n  ")
                ));
            }
        }
        // Calls in the reply that allowed none: never run, each an error.
        for id in deferred_ids {
            let out = chat
                .output_of(&id)
                .ok_or_else(|| format!("deferred call {id:?} has no output"))?;
            let error_output = out.is_error && out.output.starts_with("Error");
            if !error_output {
                return Err(format!(
                    "a call in a reply without tools got {:?}",
                    out.output
                ));
            }
        }
        // The session still works, and closes.
        *llm.first.lock().unwrap() = Some(vec![Piece::Text("Still here.".into())]);
        let next = tokio::time::timeout(BOUND, session.run("still there?"))
            .await
            .map_err(|_| "the next run() did not answer".to_owned())?
            .map_err(|e| format!("the next turn failed: {e}"))?;
        if next.assistant_messages().next() != Some("Still here.") {
            return Err("the next turn did not answer".into());
        }
        let history = bounded("close()")(tokio::time::timeout(BOUND, session.close()).await)?
            .map_err(|e| e.to_string())?;
        for agent in &history.agents {
            check_chat("the history", &agent.chat)?;
        }
        let live = inspector.live_actors();
        if !live.is_empty() {
            return Err(format!("live actors after close: {live:?}"));
        }
        Ok(())
    })
}

fn excerpt(text: &str) -> String {
    text.chars().take(60).collect()
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(128),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn whatever_the_model_sends_every_call_gets_one_output_and_bad_ones_an_error(
        model in model()
    ) {
        if let Err(broken) = run_model(&model) {
            prop_assert!(false, "{}", broken);
        }
    }
}
