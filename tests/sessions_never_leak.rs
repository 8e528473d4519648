//! SPEC §2a: a session whose host handles are all dropped closes itself exactly as
//! `close()` would; several `close()` calls all return only once no actor is alive; a
//! tool that keeps its context keeps nothing alive; `close()` returns the transcript.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{DropGuard, Log, Query};
use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{Reply, ScriptedLlm};
use switchboard::{ChatItem, SessionControl};
use tokio::sync::mpsc;

/// A tool that updates once, then runs until it is dropped, logging its drop.
fn forever(name: &'static str, log: Log) -> Tool {
    Tool::new(
        name,
        "Runs until stopped",
        move |ctx: RunContext, _: Query| {
            let log = log.clone();
            async move {
                let _guard = DropGuard(log, "body dropped");
                ctx.update("started").await?;
                std::future::pending::<()>().await;
                Ok::<_, ToolFailure>(())
            }
        },
    )
}

const BOUND: Duration = Duration::from_secs(60);

#[actix::test]
async fn a_session_whose_handles_are_dropped_closes_itself_and_stops_every_actor() {
    tokio::time::pause();
    let log = Log::default();
    let llm = ScriptedLlm::new([
        Reply::tool_call("session_job", json!({"q": "a"}))
            .and_tool_call("agent_job", json!({"q": "b"})),
        Reply::text("Both started."),
    ]);
    let session = Session::builder()
        .llm(llm)
        .agent(
            Agent::builder("agent-a")
                .tool(forever("agent_job", log.clone()))
                .build()
                .unwrap(),
        )
        .toolset(Toolset::new("jobs").tool(forever("session_job", log.clone())))
        .inspect(true)
        .grace_period(Duration::from_millis(200))
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("start both").await.unwrap();
    let inspector = session.inspector().unwrap();
    assert_eq!(
        inspector.live_actors().len(),
        6,
        "{:?}",
        inspector.live_actors()
    );
    let address = session.address();
    drop(session);
    // The address is a host handle too: the session lives while it does.
    tokio::task::yield_now().await;
    assert!(inspector.is_alive("session/s1"));
    drop(address);
    inspector.wait_until_all_stopped(BOUND).await.unwrap();
    assert_eq!(log.entries(), ["body dropped", "body dropped"]);
}

#[actix::test]
async fn a_thousand_abandoned_sessions_leave_no_live_actor() {
    tokio::time::pause();
    let engine = Engine::current().unwrap();
    let llm = ScriptedLlm::new([]);
    llm.otherwise(Reply::text("hello"));
    let mut inspectors = Vec::new();
    for _ in 0..1_000 {
        let session = Session::builder()
            .llm(llm.clone())
            .agent(
                Agent::builder("agent")
                    .tool(forever("job", Log::default()))
                    .build()
                    .unwrap(),
            )
            .inspect(true)
            .start(&engine)
            .await
            .unwrap();
        session.run("hi").await.unwrap();
        inspectors.push(session.inspector().unwrap());
        // Dropped here, without close().
    }
    for inspector in &inspectors {
        inspector.wait_until_all_stopped(BOUND).await.unwrap();
    }
}

#[actix::test]
async fn concurrent_closes_all_return_only_once_no_actor_is_alive() {
    tokio::time::pause();
    // A body that ignores cancellation: the close waits for its grace period.
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
            Reply::tool_call("stubborn", json!({"q": "x"})),
            Reply::text("On it."),
        ]))
        .agent(Agent::builder("agent").tool(stubborn).build().unwrap())
        .inspect(true)
        .grace_period(Duration::from_secs(1))
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("go").await.unwrap();
    let inspector = session.inspector().unwrap();
    let close = |session: Session| {
        let inspector = inspector.clone();
        async move {
            let history = session.close().await.unwrap();
            (history, inspector.live_actors())
        }
    };
    let ((first, live_first), (second, live_second), (third, live_third)) = tokio::join!(
        close(session.clone()),
        close(session.clone()),
        close(session.clone())
    );
    assert!(live_first.is_empty(), "{live_first:?}");
    assert!(live_second.is_empty(), "{live_second:?}");
    assert!(live_third.is_empty(), "{live_third:?}");
    assert_eq!(first, second);
    assert_eq!(second, third);
    // A close after the close has nothing left to do and says the same.
    assert_eq!(session.close().await.unwrap(), first);
    assert!(matches!(
        session.run("more").await,
        Err(SessionError::Closed)
    ));
}

#[actix::test]
async fn close_returns_the_chat_of_every_agent_the_session_ran() {
    let llm = ScriptedLlm::new([Reply::text("Welcome."), Reply::text("Billing here.")]);
    let session = Session::builder()
        .llm(llm)
        .agent(Agent::builder("reception").build().unwrap())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("hello").await.unwrap();
    session
        .update_agent(Agent::builder("billing").build().unwrap())
        .await
        .unwrap();
    session.run("my invoice").await.unwrap();
    let history = session.close().await.unwrap();
    let agents: Vec<_> = history
        .agents
        .iter()
        .map(|a| (a.agent.as_str(), a.activity.to_string()))
        .collect();
    assert_eq!(
        agents,
        [
            ("reception", "activity/s1/reception#1".to_owned()),
            ("billing", "activity/s1/billing#1".to_owned())
        ]
    );
    let said = |agent: &str| -> Vec<String> {
        history
            .chat_of(agent)
            .unwrap()
            .items()
            .iter()
            .filter_map(|item| match item {
                ChatItem::Message(m) => Some(m.content.clone()),
                _ => None,
            })
            .collect()
    };
    assert_eq!(said("reception"), ["hello", "Welcome."]);
    assert_eq!(said("billing"), ["my invoice", "Billing here."]);
}

#[actix::test]
async fn a_tool_that_keeps_its_context_keeps_nothing_alive() {
    tokio::time::pause();
    let (tx, mut rx) = mpsc::unbounded_channel::<(RunContext, SessionControl)>();
    let leaky = Tool::new(
        "leaky",
        "Hands its context out",
        move |ctx: RunContext, _: Query| {
            let tx = tx.clone();
            async move {
                let _ = tx.send((ctx.clone(), ctx.session().clone()));
                Ok::<_, ToolFailure>("done")
            }
        },
    );
    let session = Session::builder()
        .llm(ScriptedLlm::new([
            Reply::tool_call("leaky", json!({"q": "x"})),
            Reply::text("Done."),
        ]))
        .agent(Agent::builder("agent").tool(leaky).build().unwrap())
        .inspect(true)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("go").await.unwrap();
    let (ctx, control) = rx.recv().await.unwrap();
    let inspector = session.inspector().unwrap();
    drop(session);
    inspector.wait_until_all_stopped(BOUND).await.unwrap();
    assert!(ctx.update("late").await.is_err());
    assert!(matches!(
        control.generate_reply("anyone?").await,
        Err(SessionError::Closed)
    ));
}
