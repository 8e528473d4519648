//! SPEC §16 "Counts": each session reports its state, current agent, turn count and age
//! — read without a message to the session.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{spawn_turn, wait_on, Query};
use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{event, Gate, Reply, ScriptedLlm};
use switchboard::SessionState;

#[switchboard::test]
async fn a_summary_follows_the_session_through_turns_handoffs_and_close() {
    tokio::time::pause();
    let engine = Engine::current().unwrap();
    let thinking = Gate::new();
    // Ignores cancellation: a close waits its grace period for it.
    let stubborn = Tool::new(
        "stubborn",
        "Ignores cancellation",
        |ctx: RunContext, _: Query| async move {
            ctx.update("working").await?;
            std::future::pending::<()>().await;
            Ok::<_, ToolFailure>(())
        },
    );
    let session = Session::builder()
        .llm(ScriptedLlm::new([
            Reply::text("Let me see. ")
                .and_wait(&thinking)
                .and_text("Hello!"),
            Reply::tool_call("stubborn", json!({"q": "a"})),
            Reply::text("On it."),
        ]))
        .agent(Agent::builder("greeter").build().unwrap())
        .grace_period(Duration::from_secs(1))
        .inspect(true)
        .start(&engine)
        .await
        .unwrap();
    let summary = session.summary();
    assert_eq!(summary.id.as_str(), "s1");
    assert_eq!(summary.state, SessionState::Inactive);
    assert_eq!(summary.agent.as_deref(), Some("greeter"));
    assert_eq!(
        (summary.turns, summary.actors, summary.tool_runs),
        (0, 2, 0)
    );

    // A turn under way: active, counted.
    let mut events = session.subscribe();
    let turn = spawn_turn(&session, "hi");
    wait_on(&mut events, event::agent_state(AgentState::Speaking)).await;
    let summary = session.summary();
    assert_eq!((summary.state, summary.turns), (SessionState::Active, 1));
    thinking.open();
    turn.await.unwrap().unwrap();
    assert_eq!(session.summary().state, SessionState::Inactive);

    // Time passes; another agent takes over and starts a tool that runs on.
    tokio::time::advance(Duration::from_secs(90)).await;
    session
        .update_agent(Agent::builder("helper").tool(stubborn).build().unwrap())
        .await
        .unwrap();
    session.run("help me").await.unwrap();
    let summary = session.summary();
    assert_eq!(summary.agent.as_deref(), Some("helper"));
    assert_eq!(summary.turns, 2);
    assert_eq!(summary.tool_runs, 1);
    assert!(summary.age >= Duration::from_secs(90), "{summary:?}");

    // Closing: the close waits the tool's grace period, and the summary says so.
    let closing = {
        let session = session.clone();
        actix::spawn(async move { session.close().await })
    };
    session
        .inspector()
        .unwrap()
        .wait_for("session/s1", "CloseSession", Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(session.summary().state, SessionState::Closing);
    closing.await.unwrap().unwrap();
    let summary = session.summary();
    assert_eq!((summary.state, summary.actors), (SessionState::Closed, 0));
}
