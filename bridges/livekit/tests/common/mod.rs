//! The switchboard side of the bridged calls the tests make: a concierge and a supervisor
//! on a scripted model, a bridge on a free loopback port, and the Python worker run
//! against it.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers; each test file uses its part

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{Reply, ScriptedLlm};
use switchboard::{ChatItem, ChatRole, LlmRequest};
use switchboard_livekit::{
    worker_python, BridgeOptions, BridgeToken, CallInfo, LiveKitBridge, SpeechSink,
};

/// What the supervisor tells when asked for a story: long enough to be cut short.
pub(crate) const STORY: &str =
    "Once upon a time, in a restaurant by the sea, a cook kept a book of \
     every table ever booked, and every night she read one page of it aloud to the guests \
     who stayed late, and they all lived happily ever after.";

/// The token the tests' bridges take.
pub(crate) const TOKEN: &str = "test-bridge-token-7f3a";

/// A running bridge and the sessions it started, by call.
pub(crate) struct Harness {
    pub(crate) url: String,
    pub(crate) sessions: Arc<Mutex<HashMap<String, Session>>>,
    pub(crate) info: Arc<Mutex<HashMap<String, CallInfo>>>,
    pub(crate) llm: Arc<ScriptedLlm>,
}

impl Harness {
    pub(crate) fn session(&self, call: &str) -> Session {
        self.sessions.lock().unwrap()[call].clone()
    }
}

/// Starts a bridge on a free port whose calls run the concierge on the scripted model.
pub(crate) async fn start_bridge(options: impl FnOnce(BridgeOptions) -> BridgeOptions) -> Harness {
    let engine = Engine::start().expect("engine");
    let token = BridgeToken::new(TOKEN).unwrap();
    let bridge = LiveKitBridge::bind("127.0.0.1:0", options(BridgeOptions::new(token)))
        .await
        .expect("bind");
    let url = format!("ws://{}", bridge.local_addr().unwrap());
    let llm = script();
    let sessions: Arc<Mutex<HashMap<String, Session>>> = Arc::default();
    let info: Arc<Mutex<HashMap<String, CallInfo>>> = Arc::default();
    let (sessions2, info2, llm2) = (sessions.clone(), info.clone(), llm.clone());
    tokio::spawn(bridge.serve(move |call: CallInfo, speech: SpeechSink| {
        let (engine, sessions, info, llm) = (
            engine.clone(),
            sessions2.clone(),
            info2.clone(),
            llm2.clone(),
        );
        async move {
            let session = Session::builder()
                .id(call.session.clone())
                .llm(llm)
                .agent(concierge())
                .output(speech.output())
                .endpointing_delay(Duration::from_millis(100))
                .start(&engine)
                .await
                .map_err(|e| e.to_string())?;
            sessions
                .lock()
                .unwrap()
                .insert(call.session.clone(), session.clone());
            info.lock().unwrap().insert(call.session.clone(), call);
            Ok(speech.local(session))
        }
    }));
    Harness {
        url,
        sessions,
        info,
        llm,
    }
}

fn concierge() -> Agent {
    let book_table = Tool::new(
        "book_table",
        "Books a table",
        |ctx: RunContext, _: serde_json::Value| async move {
            ctx.update("Checking the book.").await?;
            tokio::time::sleep(Duration::from_millis(300)).await;
            Ok::<_, ToolFailure>("Booked: a table for two at 8pm.")
        },
    );
    let reserve = Tool::new(
        "reserve",
        "Reserves a table at once",
        |_: RunContext, _: serde_json::Value| async move {
            Ok::<_, ToolFailure>("Reserved: a table for two.")
        },
    );
    let transfer = Tool::new(
        "transfer",
        "Hands the caller to the supervisor",
        |_: RunContext, _: serde_json::Value| async move { Ok::<_, ToolFailure>(supervisor()) },
    );
    Agent::builder("concierge")
        .instructions("You answer the phone and book tables.")
        .tool(book_table)
        .tool(reserve)
        .tool(transfer)
        .on_enter(|ctx| async move {
            let _ = ctx.session().say("Hello, this is the concierge.").await;
        })
        .build()
        .unwrap()
}

fn supervisor() -> Agent {
    Agent::builder("supervisor")
        .instructions("You are the shift supervisor.")
        .on_enter(|ctx| async move {
            let _ = ctx.session().say("Supervisor here. How can I help?").await;
        })
        .build()
        .unwrap()
}

/// The model: answers from the conversation, whoever asks and whenever.
fn script() -> Arc<ScriptedLlm> {
    let llm = ScriptedLlm::new([]);
    llm.rule(answer);
    llm
}

fn answer(req: &LlmRequest) -> Option<Reply> {
    let items = req.chat.items();
    let last_user = items
        .iter()
        .rposition(|i| matches!(i, ChatItem::Message(m) if m.role == ChatRole::User))?;
    let since: &[ChatItem] = &items[last_user + 1..];
    let ChatItem::Message(user) = &items[last_user] else {
        return None;
    };
    let outputs: Vec<&str> = since
        .iter()
        .filter_map(|i| match i {
            ChatItem::FunctionCallOutput(o) => Some(o.output.as_str()),
            _ => None,
        })
        .collect();
    let said = |text: &str| {
        since
            .iter()
            .any(|i| matches!(i, ChatItem::Message(m) if m.role == ChatRole::Assistant && m.content.contains(text)))
    };
    let reply = if outputs.iter().any(|o| o.contains("Booked:")) {
        if said("Your table is booked") {
            return Some(Reply::text("Anything else?"));
        }
        Reply::text("Your table is booked for two at 8pm.")
    } else if outputs.iter().any(|o| o.contains("Reserved:")) {
        Reply::text("Booked: a table for two.")
    } else if outputs.iter().any(|o| o.contains("Checking the book")) {
        Reply::text("Checking the book for you.")
    } else if !since.is_empty() {
        Reply::text("Anything else?")
    } else {
        match user.content.as_str() {
            "What time do you open?" => Reply::text("We open at nine."),
            "And on Sundays?" => Reply::text("On Sundays we open at ten."),
            "Reserve a table for two" => Reply::tool_call("reserve", json!({})),
            "Book a table for two" => Reply::tool_call("book_table", json!({})),
            "Transfer me to a supervisor" => Reply::tool_call("transfer", json!({})),
            "Tell me a long story" => Reply::text(STORY),
            text if text.contains("stop") => Reply::text("Okay, I will stop."),
            _ => Reply::text("Sorry?"),
        }
    };
    Some(reply)
}

/// Runs `worker_scenarios.py <scenario> <call>` in the pinned livekit-agents venv against
/// the bridge; returns what it printed, or panics with its stderr.
pub(crate) async fn run_worker(harness: &Harness, scenario: &str, call: &str) -> serde_json::Value {
    let python = tokio::task::spawn_blocking(worker_python)
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{e}"));
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/worker_scenarios.py");
    let mut command = tokio::process::Command::from(python.command());
    command
        .arg(script)
        .args([scenario, call])
        .env("SB_BRIDGE_URL", &harness.url)
        .env("SB_BRIDGE_TOKEN", TOKEN)
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(90), command.output())
        .await
        .unwrap_or_else(|_| panic!("the {scenario} worker did not finish in 90 s"))
        .expect("run the worker");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the {scenario} worker failed ({}):\n{stderr}\n{stdout}",
        output.status
    );
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| {
        panic!("the {scenario} worker printed no JSON ({e}):\n{stdout}\n{stderr}")
    })
}

/// The messages of `agent`'s latest activation: (role, content, interrupted).
pub(crate) fn messages(
    history: &switchboard::SessionHistory,
    agent: &str,
) -> Vec<(ChatRole, String, bool)> {
    history
        .chat_of(agent)
        .map(|chat| {
            chat.items()
                .iter()
                .filter_map(|i| match i {
                    ChatItem::Message(m) => Some((m.role, m.content.clone(), m.interrupted)),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The texts of the messages by `role`, in order.
pub(crate) fn said_by(messages: &[(ChatRole, String, bool)], role: ChatRole) -> Vec<&str> {
    messages
        .iter()
        .filter(|m| m.0 == role)
        .map(|m| m.1.as_str())
        .collect()
}
