//! SPEC §2.4, §4, §12: a background tool that hands off after updating, and agents that
//! come back get a new generation in their actor ids.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{assert_invariant, output, Query};
use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{Gate, Reply, ScriptedLlm};
use switchboard::NoArgs;

#[actix::test]
async fn a_tool_that_already_updated_can_still_hand_off() {
    let gate = Gate::new();
    let g = gate.clone();
    let agent_b = Agent::builder("agent-b").build().unwrap();
    let b = agent_b.clone();
    let escalate = Tool::new("escalate", "Escalates", move |ctx: RunContext, _: Query| {
        let (g, b) = (g.clone(), b.clone());
        async move {
            ctx.update("looking for a specialist").await?;
            g.wait().await;
            Ok::<_, ToolFailure>(Handoff::to(b))
        }
    });
    let llm = ScriptedLlm::new([
        Reply::tool_call("escalate", json!({"q": "billing"})),
        Reply::text("Finding a specialist."),
    ]);
    let session = Session::builder()
        .llm(llm.clone())
        .agent(Agent::builder("agent-a").tool(escalate).build().unwrap())
        .inherit_chat_context(true)
        .inspect(true)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let mut events = session.subscribe();
    session.run("I need billing help").await.unwrap();
    gate.open();
    common::wait_event(&mut events, |e| match e {
        SessionEvent::AgentHandoff { to, .. } => Some(to.clone()),
        _ => None,
    })
    .await;
    common::settled(&session).await;
    assert_eq!(session.current_agent().await.unwrap(), "agent-b");
    // The old agent's context (inherited here) got the `/finished` naming the new agent,
    // and no reply was asked for it.
    let chat = session.chat_context().await.unwrap();
    assert_eq!(output(&chat, "call_1/finished"), "Transferred to agent-b.");
    assert_eq!(llm.request_count(), 2);
    assert_invariant(&chat);
    let inspector = session.inspector().unwrap();
    inspector.assert_stopped("tool/s1/1:call_1").unwrap();
    inspector.assert_stopped("activity/s1/agent-a#1").unwrap();
    session.close().await.unwrap();
}

#[actix::test]
async fn an_agent_that_comes_back_gets_a_new_generation() {
    let llm = ScriptedLlm::new([]);
    llm.otherwise(Reply::text("Hi."));
    let ping = || {
        Tool::new("ping", "Pings", |_ctx: RunContext, _: NoArgs| async move {
            Ok::<_, ToolFailure>("pong")
        })
    };
    let a = Agent::builder("agent-a").tool(ping()).build().unwrap();
    let b = Agent::builder("agent-b").build().unwrap();
    let session = Session::builder()
        .llm(llm)
        .agent(a.clone())
        .inspect(true)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.update_agent(b).await.unwrap();
    session.update_agent(a).await.unwrap();
    let inspector = session.inspector().unwrap();
    let ids: Vec<String> = inspector.actors().iter().map(|a| a.to_string()).collect();
    assert_eq!(
        ids,
        [
            "activity/s1/agent-a#1",
            "activity/s1/agent-a#2",
            "activity/s1/agent-b#1",
            "session/s1",
            "toolset/s1/agent-a#1/tools",
            "toolset/s1/agent-a#2/tools",
        ]
    );
    assert_eq!(
        inspector
            .live_actors()
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>(),
        [
            "activity/s1/agent-a#2",
            "session/s1",
            "toolset/s1/agent-a#2/tools"
        ]
    );
    session.close().await.unwrap();
}

#[derive(Debug, thiserror::Error)]
#[error("inventory offline")]
struct InventoryOffline;

#[actix::test]
async fn a_handoff_is_not_dropped_when_a_parallel_call_fails() {
    let b = Agent::builder("agent-b").build().unwrap();
    let to_b = b.clone();
    let transfer = Tool::new(
        "transfer",
        "Transfers",
        move |_ctx: RunContext, _: NoArgs| {
            let b = to_b.clone();
            async move { Ok::<_, ToolFailure>(Handoff::to(b).with_message("Over to B.")) }
        },
    );
    let stock = Tool::new(
        "stock",
        "Checks stock",
        |_ctx: RunContext, _: NoArgs| async move { Err::<(), _>(InventoryOffline.into()) },
    );
    let llm = ScriptedLlm::new([
        Reply::tool_call("stock", json!({})).and_tool_call("transfer", json!({}))
    ]);
    let session = Session::builder()
        .llm(llm.clone())
        .agent(
            Agent::builder("agent-a")
                .tool(transfer)
                .tool(stock)
                .error_policy(ErrorPolicy::new().route::<InventoryOffline>(ErrorRoute::Propagate))
                .build()
                .unwrap(),
        )
        .inherit_chat_context(true)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let err = session
        .run("check stock and transfer me")
        .await
        .unwrap_err();
    let SessionError::TurnFailed {
        failure: TurnFailure::Tool { ref tool, .. },
        ref result,
    } = err
    else {
        panic!("expected the stock tool to fail the turn, got {err}");
    };
    assert_eq!(tool, "stock");
    // The failed turn still says what it did, the handoff included.
    let outputs: Vec<&str> = result
        .function_outputs()
        .map(|o| o.output.as_str())
        .collect();
    assert_eq!(outputs, ["Error: internal error in stock", "Over to B."]);
    assert!(
        matches!(result.events.last(), Some(ChatItem::AgentHandoff { to, .. }) if to == "agent-b"),
        "{result:?}"
    );
    assert_eq!(session.current_agent().await.unwrap(), "agent-b");
    let chat = session.chat_context().await.unwrap();
    assert_eq!(output(&chat, "call_1"), "Error: internal error in stock");
    assert_eq!(output(&chat, "call_2"), "Over to B.");
    assert_invariant(&chat);
    assert_eq!(
        llm.request_count(),
        1,
        "no further LLM step after a handoff"
    );
    session.close().await.unwrap();
}

/// Two handoffs asked for in one step: the first (in call order) is carried out, and the
/// second's output tells the model it was not done, instead of a "Transferred" that lies.
#[actix::test]
async fn of_two_handoffs_in_one_step_the_first_is_done_and_the_second_reads_refused() {
    let transfer = |tool: &'static str, to: Agent| {
        Tool::new(tool, "Transfers", move |_ctx: RunContext, _: NoArgs| {
            let to = to.clone();
            async move { Ok::<_, ToolFailure>(Handoff::to(to)) }
        })
    };
    let billing = Agent::builder("billing").build().unwrap();
    let support = Agent::builder("support").build().unwrap();
    let llm = ScriptedLlm::new([
        Reply::tool_call("to_billing", json!({})).and_tool_call("to_support", json!({}))
    ]);
    llm.otherwise(Reply::text("Hello."));
    let session = Session::builder()
        .llm(llm.clone())
        .agent(
            Agent::builder("front")
                .tool(transfer("to_billing", billing))
                .tool(transfer("to_support", support))
                .build()
                .unwrap(),
        )
        .inherit_chat_context(true)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("help").await.unwrap();
    common::settled(&session).await;
    assert_eq!(session.current_agent().await.unwrap(), "billing");
    let chat = session.chat_context().await.unwrap();
    assert_eq!(output(&chat, "call_1"), "Transferred to billing.");
    assert_eq!(
        output(&chat, "call_2"),
        "Error: not done: an earlier call in this step already hands off to billing"
    );
    assert_invariant(&chat);
    let history = session.close().await.unwrap();
    assert!(
        history.agents.iter().all(|a| a.agent != "support"),
        "support never started: {history:?}"
    );
}
