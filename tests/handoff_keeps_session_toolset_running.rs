//! SPEC §4: a session-scoped toolset outlives a handoff; its later updates and final
//! result go to the agent current at delivery time, never to the old one.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{assert_invariant, call_ids, output, wait_on, Query};
use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{event, Gate, Reply, ScriptedLlm};
use switchboard::{NoArgs, ToolChoice};

#[actix::test]
async fn a_session_tool_finishes_under_the_new_agent() {
    let gate = Gate::new();
    let g = gate.clone();
    let book = Tool::new(
        "book",
        "Books a table",
        move |ctx: RunContext, args: Query| {
            let g = g.clone();
            async move {
                ctx.update(format!("booking {}", args.q)).await?;
                g.wait().await;
                ctx.update("restaurant answered").await?;
                Ok::<_, ToolFailure>("table confirmed")
            }
        },
    );
    let agent_b = Agent::builder("agent-b")
        .instructions("Concierge.")
        .build()
        .unwrap();
    let b = agent_b.clone();
    let transfer = Tool::new(
        "transfer",
        "Transfers to B",
        move |_ctx: RunContext, _: NoArgs| {
            let b = b.clone();
            async move { Ok::<_, ToolFailure>(Handoff::to(b).with_message("Transferring you.")) }
        },
    );
    let agent_a = Agent::builder("agent-a").tool(transfer).build().unwrap();
    let llm = ScriptedLlm::new([
        Reply::tool_call("book", json!({"q": "8pm"})),
        Reply::text("Booking now."),
        Reply::tool_call("transfer", json!({})),
    ]);
    llm.otherwise(Reply::text("Your table is confirmed."));
    let session = Session::builder()
        .llm(llm.clone())
        .agent(agent_a)
        .toolset(Toolset::new("booking").tool(book))
        .inspect(true)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let mut events = session.subscribe();

    session.run("book a table at 8").await.unwrap();
    let result = session.run("let me talk to the concierge").await.unwrap();
    assert_eq!(result.handoff(), Some("agent-b"));
    // The handing-off call got its output in agent A's context.
    let transfer_out = result.function_outputs().next().unwrap();
    assert_eq!(transfer_out.output, "Transferring you.");
    assert_eq!(session.current_agent().await.unwrap(), "agent-b");
    let requests_before = llm.request_count();
    assert_eq!(requests_before, 3);

    // The booking run is still alive under the session, and A's tool actors are gone.
    let inspector = session.inspector().unwrap();
    assert!(inspector.is_alive("tool/s1/1:call_1"));
    inspector.assert_stopped("activity/s1/agent-a#1").unwrap();
    assert!(inspector.is_alive("toolset/s1/booking"));

    gate.open();
    wait_on(&mut events, event::output_added("call_1/finished")).await;
    common::settled(&session).await;

    let chat_b = session.chat_context().await.unwrap();
    assert_eq!(
        call_ids(&chat_b),
        [
            "call call_1/update_1",
            "out call_1/update_1",
            "call call_1/finished",
            "out call_1/finished"
        ]
    );
    assert_eq!(output(&chat_b, "call_1/finished"), "table confirmed");
    assert_invariant(&chat_b);
    // Only B answered the later items, with tools off; its last reply had them all in
    // view. (The session was idle, so `/update_1` was answered as it came and
    // `/finished`, arriving during that reply, got the next one.)
    let replies = &llm.requests()[requests_before..];
    assert!(!replies.is_empty());
    assert!(replies
        .iter()
        .all(|r| &*r.agent == "agent-b" && r.tool_choice == ToolChoice::None));
    assert!(replies
        .last()
        .unwrap()
        .chat
        .contains_call("call_1/finished"));
    session.close().await.unwrap();
}

#[actix::test]
async fn nothing_reaches_the_old_agent_after_the_handoff() {
    let gate = Gate::new();
    let g = gate.clone();
    let watch = Tool::new("watch", "Watches", move |ctx: RunContext, _: Query| {
        let g = g.clone();
        async move {
            ctx.update("watching").await?;
            g.wait().await;
            ctx.update("changed").await?;
            Ok::<_, ToolFailure>("stopped watching")
        }
    });
    let agent_a = Agent::builder("agent-a").build().unwrap();
    let agent_b = Agent::builder("agent-b").build().unwrap();
    let llm = ScriptedLlm::new([
        Reply::tool_call("watch", json!({"q": "door"})),
        Reply::text("Watching."),
    ]);
    llm.otherwise(Reply::text("Noted."));
    let session = Session::builder()
        .llm(llm.clone())
        .agent(agent_a)
        .toolset(Toolset::new("watchers").tool(watch))
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("watch the door").await.unwrap();
    let mut events = session.subscribe();
    // Handoff by message to the session's address.
    session.address().send(Handoff::to(agent_b)).await.unwrap();
    gate.open();
    common::settled(&session).await;
    let mut after_handoff = Vec::new();
    while let Ok(event) = events.try_recv() {
        if let SessionEvent::ConversationItemAdded { agent, item } = event {
            after_handoff.push((agent, item));
        }
    }
    assert!(
        after_handoff.iter().all(|(agent, _)| agent == "agent-b"),
        "items reached the old agent: {after_handoff:#?}"
    );
    assert!(after_handoff
        .iter()
        .any(|(_, item)| item.call_id() == Some("call_1/finished")));
    assert!(llm.requests()[2..].iter().all(|r| &*r.agent == "agent-b"));
    session.close().await.unwrap();
}

#[actix::test]
async fn an_update_during_the_handoff_waits_for_the_incoming_agent() {
    // B's on_enter is held on a gate while the tool sends its update: the update must
    // wait and then land in B's context, never A's.
    let tool_gate = Gate::new();
    let enter_gate = Gate::new();
    let g = tool_gate.clone();
    let watch = Tool::new("watch", "Watches", move |ctx: RunContext, _: Query| {
        let g = g.clone();
        async move {
            ctx.update("watching").await?;
            g.wait().await;
            ctx.update("changed").await?;
            Ok::<_, ToolFailure>(())
        }
    });
    let eg = enter_gate.clone();
    let agent_b = Agent::builder("agent-b")
        .on_enter(move |_ctx| {
            let eg = eg.clone();
            async move { eg.wait().await }
        })
        .build()
        .unwrap();
    let llm = ScriptedLlm::new([
        Reply::tool_call("watch", json!({"q": "door"})),
        Reply::text("Watching."),
    ]);
    llm.otherwise(Reply::text("It changed."));
    let session = Session::builder()
        .llm(llm.clone())
        .agent(Agent::builder("agent-a").build().unwrap())
        .toolset(Toolset::new("watchers").tool(watch))
        .inspect(true)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("watch").await.unwrap();
    let s = session.clone();
    let handoff = actix::spawn(async move { s.update_agent(agent_b).await });
    let inspector = session.inspector().unwrap();
    inspector
        .wait_for(
            "activity/s1/agent-b#1",
            "StartActivity",
            std::time::Duration::from_secs(5),
        )
        .await
        .unwrap();
    tool_gate.open();
    // The update reaches the session, which holds it while B starts.
    inspector
        .wait_for(
            "session/s1",
            "DeliverToolItems",
            std::time::Duration::from_secs(5),
        )
        .await
        .unwrap();
    enter_gate.open();
    handoff.await.unwrap().unwrap();
    common::settled(&session).await;
    let chat_b = session.chat_context().await.unwrap();
    assert!(
        chat_b.contains_call("call_1/update_1"),
        "{:#?}",
        chat_b.items()
    );
    assert_invariant(&chat_b);
    session.close().await.unwrap();
}
