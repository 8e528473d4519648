//! SPEC §4 close, §9: after `close()` no actor of the session is alive, every call has
//! its output, and the session refuses further work with a clear error.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{assert_invariant, spawn_turn, Query};
use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{Gate, Reply, ScriptedLlm};

#[actix::test]
async fn close_leaves_no_live_actor_and_gives_running_calls_their_outputs() {
    tokio::time::pause();
    let forever = |name: &'static str| {
        Tool::new(
            name,
            "Runs for a long time",
            |ctx: RunContext, _: Query| async move {
                ctx.update("started").await?;
                std::future::pending::<()>().await;
                Ok::<_, ToolFailure>(())
            },
        )
    };
    let llm = ScriptedLlm::new([
        Reply::tool_call("session_job", json!({"q": "a"}))
            .and_tool_call("agent_job", json!({"q": "b"})),
        Reply::text("Both started."),
    ]);
    let session = Session::builder()
        .llm(llm)
        .agent(
            Agent::builder("agent-a")
                .tool(forever("agent_job"))
                .build()
                .unwrap(),
        )
        .toolset(Toolset::new("jobs").tool(forever("session_job")))
        .inherit_chat_context(true)
        .inspect(true)
        .grace_period(Duration::from_millis(500))
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("start both").await.unwrap();
    let inspector = session.inspector().unwrap();
    assert_eq!(
        inspector
            .live_actors()
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>(),
        [
            "activity/s1/agent-a#1",
            "session/s1",
            "tool/s1/1:call_1",
            "tool/s1/2:call_2",
            "toolset/s1/agent-a#1/tools",
            "toolset/s1/jobs",
        ]
    );
    let mut events = session.subscribe();
    session.close().await.unwrap();
    assert!(
        inspector.live_actors().is_empty(),
        "{:?}",
        inspector.live_actors()
    );
    for actor in inspector.actors() {
        inspector.assert_stopped(actor.as_str()).unwrap();
    }
    // Both background calls got a terminal output before their agent closed.
    let mut outputs = Vec::new();
    while let Ok(event) = events.try_recv() {
        if let SessionEvent::ConversationItemAdded {
            item: ChatItem::FunctionCallOutput(o),
            ..
        } = event
        {
            outputs.push((o.call_id, o.output));
        }
    }
    outputs.sort();
    assert_eq!(
        outputs,
        [
            (
                "call_1/finished".to_owned(),
                "Cancelled: the session closed.".to_owned()
            ),
            (
                "call_2/finished".to_owned(),
                "Cancelled: the session closed.".to_owned()
            ),
        ]
    );
    assert!(matches!(
        session.run("hello?").await,
        Err(SessionError::Closed)
    ));
    assert!(session.chat_context().await.is_err());
}

#[actix::test]
async fn close_mid_step_answers_every_call_with_session_closed() {
    let gate = Gate::new();
    let g = gate.clone();
    let slow = Tool::new("slow", "Slow", move |_ctx: RunContext, _: Query| {
        let g = g.clone();
        async move {
            g.wait().await;
            Ok::<_, ToolFailure>("late")
        }
    });
    let llm = ScriptedLlm::new([Reply::tool_call("slow", json!({"q": "a"}))]);
    let session = Session::builder()
        .llm(llm)
        .agent(Agent::builder("agent-a").tool(slow).build().unwrap())
        .inspect(true)
        .grace_period(Duration::ZERO)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let mut events = session.subscribe();
    let turn = spawn_turn(&session, "go");
    let inspector = session.inspector().unwrap();
    inspector
        .wait_for(
            "toolset/s1/agent-a#1/tools",
            "RunTool",
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    session.close().await.unwrap();
    assert!(matches!(turn.await.unwrap(), Err(SessionError::Closed)));
    let mut chat = switchboard::ChatContext::new();
    while let Ok(event) = events.try_recv() {
        if let SessionEvent::ConversationItemAdded { item, .. } = event {
            chat.push(item);
        }
    }
    assert_eq!(
        chat.output_of("call_1").unwrap().output,
        "Cancelled: the session closed."
    );
    assert_invariant(&chat);
    assert!(inspector.live_actors().is_empty());
}
