//! SPEC §4, §12: when an activity closes, every tool run of its own toolsets is stopped
//! and awaited before the next agent's `on_enter`; a late `ctx.update` from such a run
//! fails and touches no other agent.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{assert_invariant, DropGuard, Log, Query};
use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{Reply, ScriptedLlm};
use switchboard::UpdateError;
use tokio::sync::mpsc;

fn agent_b(log: &Log) -> Agent {
    let log = log.clone();
    Agent::builder("agent-b")
        .on_enter(move |_ctx| {
            let log = log.clone();
            async move { log.push("b entered") }
        })
        .build()
        .unwrap()
}

#[actix::test]
async fn a_body_that_ignores_cancellation_is_dropped_before_the_next_agent_enters() {
    tokio::time::pause();
    let log = Log::default();
    let (leak_tx, mut leak_rx) = mpsc::unbounded_channel::<RunContext>();
    let l = log.clone();
    let watch = Tool::new("watch", "Watches", move |ctx: RunContext, _: Query| {
        let (l, leak) = (l.clone(), leak_tx.clone());
        async move {
            let _guard = DropGuard(l, "body dropped");
            leak.send(ctx.clone()).unwrap();
            ctx.update("watching").await?;
            std::future::pending::<()>().await; // ignores cancellation
            Ok::<_, ToolFailure>(())
        }
    });
    let l = log.clone();
    let agent_a = Agent::builder("agent-a")
        .tool(watch)
        .on_exit(move |_ctx| {
            let l = l.clone();
            async move { l.push("a exited") }
        })
        .build()
        .unwrap();
    let llm = ScriptedLlm::new([
        Reply::tool_call("watch", json!({"q": "door"})),
        Reply::text("Watching."),
    ]);
    let session = Session::builder()
        .llm(llm.clone())
        .agent(agent_a)
        .inspect(true)
        .grace_period(Duration::from_secs(2))
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("watch the door").await.unwrap();
    let inspector = session.inspector().unwrap();
    let run_id = "tool/s1/1:call_1";
    assert!(inspector.is_alive(run_id));
    let leaked = leak_rx.recv().await.unwrap();

    let started = tokio::time::Instant::now();
    session.update_agent(agent_b(&log)).await.unwrap();
    // The body ignored cancellation, so it was dropped at the grace period.
    assert!(started.elapsed() >= Duration::from_secs(2));
    assert_eq!(log.entries(), ["a exited", "body dropped", "b entered"]);
    inspector.assert_stopped(run_id).unwrap();
    inspector
        .assert_stopped("toolset/s1/agent-a#1/tools")
        .unwrap();
    inspector.assert_stopped("activity/s1/agent-a#1").unwrap();
    assert!(inspector.assert_stopped("activity/s1/agent-b#1").is_err());

    // A late update from the stopped run fails and changes nothing.
    let chat_before = session.chat_context().await.unwrap();
    let requests_before = llm.request_count();
    let late = leaked.update("too late").await;
    assert_eq!(
        late,
        Err(UpdateError::RunEnded {
            call_id: "call_1".into()
        })
    );
    common::settled(&session).await;
    assert_eq!(session.chat_context().await.unwrap(), chat_before);
    assert_eq!(llm.request_count(), requests_before);
    assert_invariant(&chat_before);
    session.close().await.unwrap();
}

#[actix::test]
async fn a_cooperative_body_undoes_its_work_before_the_next_agent_enters() {
    tokio::time::pause();
    let log = Log::default();
    let l = log.clone();
    let write = Tool::new("write", "Writes", move |ctx: RunContext, _: Query| {
        let l = l.clone();
        async move {
            ctx.update("writing").await?;
            ctx.cancelled().await;
            l.push("undone");
            Ok::<_, ToolFailure>("written")
        }
    });
    let agent_a = Agent::builder("agent-a").tool(write).build().unwrap();
    let llm = ScriptedLlm::new([
        Reply::tool_call("write", json!({"q": "row"})),
        Reply::text("Writing."),
    ]);
    let session = Session::builder()
        .llm(llm.clone())
        .agent(agent_a)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("write it").await.unwrap();
    let started = tokio::time::Instant::now();
    session.update_agent(agent_b(&log)).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "a cooperative body must not wait for the grace period"
    );
    assert_eq!(log.entries(), ["undone", "b entered"]);
    // Its result after cancellation goes nowhere: the new agent has no items of it.
    common::settled(&session).await;
    let chat_b = session.chat_context().await.unwrap();
    assert!(!chat_b.contains_call("call_1/finished"));
    assert_eq!(llm.request_count(), 2);
    session.close().await.unwrap();
}

#[actix::test]
async fn the_old_agent_records_why_its_background_call_ended() {
    // With chat inheritance on, the old agent's final context is visible in the new
    // one: its background call got a terminal `/finished` output, and the invariant holds.
    let watch = Tool::new("watch", "Watches", |ctx: RunContext, _: Query| async move {
        ctx.update("watching").await?;
        std::future::pending::<()>().await;
        Ok::<_, ToolFailure>(())
    });
    let llm = ScriptedLlm::new([
        Reply::tool_call("watch", json!({"q": "door"})),
        Reply::text("Watching."),
    ]);
    let session = Session::builder()
        .llm(llm)
        .agent(Agent::builder("agent-a").tool(watch).build().unwrap())
        .inherit_chat_context(true)
        .grace_period(Duration::ZERO)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("watch").await.unwrap();
    session
        .update_agent(Agent::builder("agent-b").build().unwrap())
        .await
        .unwrap();
    let chat = session.chat_context().await.unwrap();
    let finished = chat.output_of("call_1/finished").unwrap();
    assert_eq!(
        finished.output,
        "Cancelled: the agent handed off to agent-b."
    );
    assert!(matches!(
        chat.items().last(),
        Some(ChatItem::AgentHandoff { to, .. }) if to == "agent-b"
    ));
    assert_invariant(&chat);
    session.close().await.unwrap();
}

/// Found by the restore property (issue 25): a call the user's interruption cancelled
/// already has its terminal output ("Cancelled: the user interrupted."); its body,
/// ignoring the cancellation, lives on for the grace period. A handoff meanwhile stopped
/// that run a second time, took it for a call running in the background, and wrote it a
/// second terminal output (`call_1/finished`, "Cancelled: the agent handed off").
#[actix::test]
async fn a_call_the_interruption_cancelled_gets_no_second_end_from_the_handoff() {
    tokio::time::pause();
    let hold = Tool::new("hold", "Holds", |_ctx: RunContext, _: Query| async move {
        std::future::pending::<()>().await; // ignores cancellation
        Ok::<_, ToolFailure>(())
    })
    .cancel_on_interruption(true);
    let llm = ScriptedLlm::new([Reply::tool_call("hold", json!({"q": "line"}))]);
    let session = Session::builder()
        .llm(llm)
        .agent(Agent::builder("agent-a").tool(hold).build().unwrap())
        .inspect(true)
        .grace_period(Duration::from_secs(10))
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let inspector = session.inspector().unwrap();
    let turn = common::spawn_turn(&session, "hold the line");
    inspector
        .wait_for(
            "toolset/s1/agent-a#1/tools",
            "RunTool",
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    for _ in 0..16 {
        tokio::task::yield_now().await;
    }
    assert!(inspector.is_alive("tool/s1/1:call_1"));
    session.interrupt().await.unwrap();
    turn.await.unwrap().unwrap();
    assert!(
        inspector.is_alive("tool/s1/1:call_1"),
        "the body ignores its cancellation: it lives for the grace period"
    );
    session
        .update_agent(Agent::builder("agent-b").build().unwrap())
        .await
        .unwrap();
    let history = session.close().await.unwrap();
    let chat_a = &history.agents[0].chat;
    assert_eq!(
        chat_a.output_of("call_1").unwrap().output,
        "Cancelled: the user interrupted."
    );
    assert!(
        !chat_a.contains_call("call_1/finished"),
        "one terminal output per call: {:?}",
        chat_a.items()
    );
    assert_invariant(chat_a);
}
