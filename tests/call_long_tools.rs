//! A tool may run for the whole call (a recorder): declared call-long
//! (`Tool::call_long`), it does not hold the session's settling or a drain, it is told
//! when the call ends (`ctx.cancelled()`), it gets the grace period to finish, and what it
//! returns then is its `/finished` output in the history — not "Cancelled: the session
//! closed.".
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{Reply, ScriptedLlm};
use switchboard::{DrainEnd, Unfinished};
use tokio::time::{timeout, Instant};

const GRACE: Duration = Duration::from_secs(1);

/// A recorder: says it records, then records until the call ends, and returns what it
/// saved. `deaf` ones never look at the end of the call.
fn recorder(deaf: bool) -> Tool {
    Tool::new(
        "record_call",
        "Records the call",
        move |ctx: RunContext, _: NoArgs| async move {
            ctx.update("recording").await?;
            let began = Instant::now();
            if deaf {
                futures_util::future::pending::<()>().await;
            }
            ctx.cancelled().await;
            Ok::<_, ToolFailure>(format!("recording saved, {} s", began.elapsed().as_secs()))
        },
    )
    .call_long(true)
}

/// A session whose first turn starts the recorder (session-scoped), then talks.
async fn recorded_session(engine: &Engine, id: &str, tool: Tool) -> Session {
    let llm = ScriptedLlm::new([
        Reply::tool_call("record_call", json!({})),
        Reply::text("This call is recorded. How can I help?"),
    ]);
    llm.otherwise(Reply::text("Sure."));
    let session = Session::builder()
        .id(id)
        .llm(llm)
        .agent(Agent::builder("agent").build().unwrap())
        .toolset(Toolset::new("recording").tool(tool))
        .grace_period(GRACE)
        .start(engine)
        .await
        .unwrap();
    session.run("hello").await.unwrap();
    session
}

/// The recorder's `/finished` output in `history`.
fn finished(history: &SessionHistory) -> Option<String> {
    let chat = history.chat_of("agent").unwrap();
    common::assert_invariant(chat);
    chat.outputs()
        .find(|out| out.name == "record_call" && out.call_id.ends_with("/finished"))
        .map(|out| out.output.clone())
}

#[switchboard::test]
async fn a_recorder_does_not_hold_settling_and_its_result_is_kept_at_close() {
    tokio::time::pause();
    let engine = Engine::current().unwrap();
    let session = recorded_session(&engine, "call", recorder(false)).await;
    // The call goes on for a minute with the recorder running.
    tokio::time::sleep(Duration::from_secs(60)).await;
    session.run("what time is it?").await.unwrap();

    timeout(Duration::from_secs(5), session.wait_for_settled())
        .await
        .expect("a call-long tool held the session's settling")
        .unwrap();
    assert_eq!(engine.stats().tool_runs, 1, "the recorder still runs");

    let history = session.close().await.unwrap();
    assert_eq!(
        finished(&history).as_deref(),
        Some("recording saved, 60 s"),
        "{history:?}"
    );
    assert_eq!(engine.stats().actors, 0);
}

#[switchboard::test]
async fn a_recorder_does_not_hold_a_drain_and_ends_with_it() {
    tokio::time::pause();
    let engine = Engine::current().unwrap();
    let _session = recorded_session(&engine, "call", recorder(false)).await;
    let deadline = Duration::from_secs(20);
    let began = Instant::now();
    let report = engine.drain(deadline).await;
    assert!(
        began.elapsed() < Duration::from_secs(1),
        "the drain waited {:?} for the recorder",
        began.elapsed()
    );
    let drained = &report.sessions[0];
    assert_eq!(drained.ended, DrainEnd::Settled);
    assert!(drained.unfinished.is_empty(), "{:?}", drained.unfinished);
    assert_eq!(
        finished(&drained.history).as_deref(),
        Some("recording saved, 0 s")
    );
    assert_eq!(engine.stats().actors, 0);
}

#[switchboard::test]
async fn a_recorder_that_ignores_the_end_of_the_call_is_dropped_after_the_grace_period() {
    tokio::time::pause();
    let engine = Engine::current().unwrap();
    let session = recorded_session(&engine, "call", recorder(true)).await;
    let mut events = session.subscribe();
    let began = Instant::now();
    let history = session.close().await.unwrap();
    let took = began.elapsed();
    assert!(took >= GRACE && took < GRACE * 2, "{took:?}");
    assert_eq!(
        finished(&history).as_deref(),
        Some("Cancelled: the session closed.")
    );
    let mut dropped = Vec::new();
    while let Ok(event) = events.try_recv() {
        if let SessionEvent::Unfinished(what) = event {
            dropped.push(what);
        }
    }
    assert!(
        matches!(&dropped[..], [Unfinished::ToolBody { tool, .. }] if tool == "record_call"),
        "{dropped:?}"
    );
    assert_eq!(engine.stats().actors, 0);
}

#[switchboard::test]
async fn an_agent_recorder_keeps_its_result_when_its_agent_hands_off() {
    tokio::time::pause();
    let engine = Engine::current().unwrap();
    let next = Agent::builder("next").build().unwrap();
    let transfer = Tool::new(
        "transfer",
        "Transfers",
        move |_ctx: RunContext, _: NoArgs| {
            let next = next.clone();
            async move { Ok::<_, ToolFailure>(next) }
        },
    );
    let llm = ScriptedLlm::new([
        Reply::tool_call("record_call", json!({})),
        Reply::text("Recording."),
        Reply::tool_call("transfer", json!({})),
    ]);
    llm.otherwise(Reply::text("Hello from next."));
    let session = Session::builder()
        .llm(llm)
        .agent(
            Agent::builder("agent")
                .tool(recorder(false))
                .tool(transfer)
                .build()
                .unwrap(),
        )
        .grace_period(GRACE)
        .start(&engine)
        .await
        .unwrap();
    session.run("hello").await.unwrap();
    session.run("transfer me").await.unwrap();
    let history = session.close().await.unwrap();
    assert_eq!(
        finished(&history).as_deref(),
        Some("recording saved, 0 s"),
        "{history:?}"
    );
}

#[switchboard::test]
async fn a_recorder_that_returns_nothing_adds_nothing() {
    tokio::time::pause();
    let engine = Engine::current().unwrap();
    let quiet = Tool::new(
        "record_call",
        "Records the call",
        |ctx: RunContext, _: NoArgs| async move {
            ctx.update("recording").await?;
            ctx.cancelled().await;
            Ok::<_, ToolFailure>(())
        },
    )
    .call_long(true);
    let session = recorded_session(&engine, "call", quiet).await;
    let history = session.close().await.unwrap();
    assert_eq!(finished(&history), None, "{history:?}");
}
