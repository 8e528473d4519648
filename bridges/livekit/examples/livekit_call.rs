//! A phone call through the LiveKit bridge on one machine, with no LiveKit server and no
//! key: switchboard runs a concierge and a supervisor on a scripted model behind a
//! `LiveKitBridge`, and the Python worker (livekit-agents 1.8.9, installed into the target
//! directory on the first run, about half a minute) plays the caller with fake STT, VAD,
//! TTS and audio.
//!
//! ```text
//! cargo run -p switchboard-livekit --example livekit_call
//! ```
//!
//! It shows a greeting from `on_enter`, an async tool whose result is spoken after its
//! turn, a handoff, and a barge-in after which the supervisor's message holds only what
//! the caller heard; it checks each of these at the end and exits non-zero when one did not
//! happen (CI runs it). `docs/livekit.md` has the steps to put the same bridge in front of a
//! real LiveKit Cloud or server project.

use std::time::Duration;

use serde_json::{json, Value};
use switchboard::prelude::*;
use switchboard::testing::{Reply, ScriptedLlm};
use switchboard::{ChatItem, ChatRole, LlmRequest};
use switchboard_livekit::{
    worker_python, BridgeOptions, BridgeToken, CallInfo, LiveKitBridge, SpeechSink,
};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let engine = Engine::start()?;
    // A real deployment reads a long random secret from its secret store.
    let token = "demo-token-not-for-production";
    let bridge =
        LiveKitBridge::bind("127.0.0.1:0", BridgeOptions::new(BridgeToken::new(token)?)).await?;
    let url = format!("ws://{}", bridge.local_addr().ok_or("no local address")?);
    let (calls, mut call_started) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(bridge.serve(move |call: CallInfo, speech: SpeechSink| {
        let (engine, calls) = (engine.clone(), calls.clone());
        async move {
            println!(
                "switchboard: a call from {:?} in room {:?}",
                call.participant.map(|p| p.identity),
                call.room
            );
            let session = Session::builder()
                .id(call.session)
                .llm(model())
                .agent(concierge().map_err(|e| e.to_string())?)
                .output(speech.output())
                .endpointing_delay(Duration::from_millis(200))
                .start(&engine)
                .await
                .map_err(|e| e.to_string())?;
            let _ = calls.send(session.clone());
            Ok(speech.local(session))
        }
    }));

    println!("installing or finding the LiveKit worker's venv (livekit-agents 1.8.9)...");
    let python = tokio::task::spawn_blocking(worker_python).await??;
    let status = tokio::process::Command::from(python.command())
        .args(["-m", "switchboard_livekit.demo"])
        .env("SWITCHBOARD_BRIDGE_URL", &url)
        .env("SWITCHBOARD_BRIDGE_TOKEN", token)
        .status()
        .await?;
    let session = call_started.recv().await.ok_or("no call came")?;
    println!("\nswitchboard's transcript (worker exited with {status}):");
    let history = session.history().await;
    let transcript = history.transcript();
    for &(agent, item) in &transcript {
        match item {
            ChatItem::Message(m) => println!(
                "  {agent:>10} {:?}: {}{}",
                m.role,
                m.content,
                if m.interrupted { " [interrupted]" } else { "" }
            ),
            ChatItem::FunctionCall(c) => println!("  {agent:>10} calls {}", c.name),
            ChatItem::FunctionCallOutput(o) => println!("  {agent:>10} {} -> {}", o.name, o.output),
            ChatItem::AgentHandoff { from, to } => println!("  handoff {from:?} -> {to}"),
            _ => {}
        }
    }
    // What the example claims to show, checked (CI runs it): a failure exits non-zero.
    let said = |agent: &str, text: &str| {
        transcript.iter().any(|(a, item)| {
            *a == agent
                && matches!(item, ChatItem::Message(m) if m.role == ChatRole::Assistant && m.content.contains(text))
        })
    };
    let claims = [
        ("the worker ending well", status.success()),
        ("the greeting from on_enter", said("concierge", "this is the concierge")),
        ("the async tool's result spoken after its turn", said("concierge", "your table for two is booked")),
        (
            "the handoff to the supervisor",
            transcript.iter().any(|(_, item)| {
                matches!(item, ChatItem::AgentHandoff { to, .. } if to == "supervisor")
            }),
        ),
        (
            "a barge-in that kept what the caller heard",
            transcript.iter().any(|(_, item)| {
                matches!(item, ChatItem::Message(m) if m.interrupted && m.content.starts_with("Once upon a time"))
            }),
        ),
    ];
    for (claim, held) in claims {
        if !held {
            return Err(format!("the example did not show {claim}").into());
        }
    }
    Ok(())
}

fn concierge() -> Result<Agent, BuildError> {
    let book_table = Tool::new(
        "book_table",
        "Books a table",
        |ctx: RunContext, _: Value| async move {
            ctx.update("Checking the book.").await?;
            tokio::time::sleep(Duration::from_millis(1500)).await;
            Ok::<_, ToolFailure>("Booked: a table for two at 8pm.")
        },
    );
    let transfer = Tool::new(
        "transfer",
        "Hands over to the supervisor",
        |_: RunContext, _: Value| async move {
            let supervisor = Agent::builder("supervisor")
                .instructions("You are the shift supervisor.")
                .on_enter(|ctx| async move {
                    let _ = ctx.session().say("Supervisor here. How can I help?").await;
                })
                .build()?;
            Ok::<_, ToolFailure>(supervisor)
        },
    );
    Agent::builder("concierge")
        .instructions("You answer the phone and book tables.")
        .tool(book_table)
        .tool(transfer)
        .on_enter(|ctx| async move {
            let _ = ctx
                .session()
                .say("Hello, this is the concierge. How can I help?")
                .await;
        })
        .build()
}

/// A scripted model that answers the last thing in the conversation.
fn model() -> std::sync::Arc<ScriptedLlm> {
    let llm = ScriptedLlm::new([]);
    llm.rule(|req: &LlmRequest| {
        let reply = match req.chat.items().last()? {
            ChatItem::FunctionCallOutput(o) if o.output.contains("Booked") => {
                Reply::text("Good news: your table for two is booked for 8pm.")
            }
            ChatItem::FunctionCallOutput(_) => Reply::text("One moment, I am checking the book."),
            ChatItem::Message(m) if m.role == ChatRole::User => match m.content.as_str() {
                text if text.contains("Book") => Reply::tool_call("book_table", json!({})),
                text if text.contains("supervisor") => Reply::tool_call("transfer", json!({})),
                text if text.contains("story") => Reply::text(
                    "Once upon a time there was a cook who wrote down every table ever \
                     booked, and read a page of her book to the last guests each night.",
                ),
                _ => Reply::text("All right, I will stop there."),
            },
            _ => Reply::text("Anything else?"),
        };
        Some(reply)
    });
    llm
}
