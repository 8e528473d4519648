//! SPEC §16 "Counts": the engine reports its live sessions, their live actors, the
//! messages queued for them and the process's memory; each session its state, current
//! agent, turn count and age — read without a message to the session.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{spawn_turn, wait_on, Query};
use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{event, Gate, Reply, ScriptedLlm};
use switchboard::SessionState;

/// A tool that answers with an update and then holds its run until `gate` opens.
fn gated_job(gate: &Gate) -> Tool {
    let gate = gate.clone();
    Tool::new("job", "Holds its run", move |ctx: RunContext, _: Query| {
        let gate = gate.clone();
        async move {
            ctx.update("started").await?;
            gate.wait().await;
            Ok::<_, ToolFailure>("done")
        }
    })
}

#[switchboard::test]
async fn stats_count_sessions_actors_tool_runs_and_queued_messages() {
    tokio::time::pause();
    let engine = Engine::current().unwrap();
    let empty = engine.stats();
    assert_eq!(
        (empty.sessions, empty.actors, empty.backlog, empty.tool_runs),
        (0, 0, 0, 0)
    );
    assert!(!empty.draining);
    if cfg!(target_os = "linux") {
        assert!(empty.rss_bytes.is_some_and(|rss| rss > 0), "{empty:?}");
    }

    // A session whose tool holds its run in the background: the session, its agent's
    // activity, the agent's toolset and the run.
    let gate = Gate::new();
    let busy = Session::builder()
        .id("busy")
        .llm(ScriptedLlm::new([
            Reply::tool_call("job", json!({"q": "a"})),
            Reply::text("Working on it."),
        ]))
        .agent(
            Agent::builder("worker")
                .tool(gated_job(&gate))
                .build()
                .unwrap(),
        )
        .inspect(true)
        .start(&engine)
        .await
        .unwrap();
    busy.run("start the job").await.unwrap();
    assert_eq!(busy.inspector().unwrap().live_actors().len(), 4);

    tokio::time::advance(Duration::from_secs(1)).await;
    // An idle session: the session and its agent's activity.
    let idle = Session::builder()
        .id("idle")
        .llm(ScriptedLlm::new([Reply::text("hello")]))
        .agent(Agent::builder("greeter").build().unwrap())
        .start(&engine)
        .await
        .unwrap();

    let stats = engine.stats();
    assert_eq!(
        (stats.sessions, stats.actors, stats.backlog, stats.tool_runs),
        (2, 6, 0, 1),
        "{stats:?}"
    );

    // Input the session has not handled yet: the sessions run on this thread, so three
    // interim transcripts wait in the idle session's queue until the test awaits.
    for words in ["I", "I would", "I would like"] {
        idle.transcript(words, false);
    }
    assert_eq!(engine.stats().backlog, 3);
    assert_eq!(idle.summary().backlog, 3);
    assert_eq!(busy.summary().backlog, 0);
    // A read goes through the same queues behind them: once it answers, all were handled.
    idle.history().await;
    assert_eq!(engine.stats().backlog, 0);

    // The run ends: one actor fewer.
    gate.open();
    common::settled(&busy).await;
    let stats = engine.stats();
    assert_eq!((stats.actors, stats.tool_runs), (5, 0), "{stats:?}");

    busy.close().await.unwrap();
    idle.close().await.unwrap();
    let stats = engine.stats();
    assert_eq!(
        (stats.sessions, stats.actors, stats.backlog, stats.tool_runs),
        (0, 0, 0, 0),
        "{stats:?}"
    );
}

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
        .id("call-7")
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
    assert_eq!(summary.id.as_str(), "call-7");
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
    assert_eq!(engine.sessions(), [summary]);

    // Closing: the close waits the tool's grace period, and the summary says so.
    let closing = {
        let session = session.clone();
        actix::spawn(async move { session.close().await })
    };
    session
        .inspector()
        .unwrap()
        .wait_for("session/call-7", "CloseSession", Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(session.summary().state, SessionState::Closing);
    closing.await.unwrap().unwrap();
    let summary = session.summary();
    assert_eq!((summary.state, summary.actors), (SessionState::Closed, 0));
    assert!(engine.sessions().is_empty());
}

#[switchboard::test]
async fn sessions_are_listed_oldest_first() {
    tokio::time::pause();
    let engine = Engine::current().unwrap();
    let mut sessions = Vec::new();
    for id in ["first", "second", "third"] {
        sessions.push(
            Session::builder()
                .id(id)
                .llm(ScriptedLlm::new([]))
                .agent(Agent::builder("agent").build().unwrap())
                .start(&engine)
                .await
                .unwrap(),
        );
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    let listed: Vec<String> = engine
        .sessions()
        .into_iter()
        .map(|summary| summary.id.to_string())
        .collect();
    assert_eq!(listed, ["first", "second", "third"]);
    for session in sessions {
        session.close().await.unwrap();
    }
}
