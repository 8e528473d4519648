//! The conversation of a call across agents: `Session::history` while the session runs
//! (during a sub-task and during a switch too) and the transcript `close()` returns.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{spawn_turn, wait_started};
use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{Gate, Reply, ScriptedLlm};
use switchboard::NoArgs;

/// The virtual-time bound of every wait here.
const BOUND: Duration = Duration::from_secs(30);

#[derive(Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
struct Contact {
    email: String,
}

fn agents(history: &SessionHistory) -> Vec<(String, bool)> {
    history
        .agents
        .iter()
        .map(|entry| (entry.agent.clone(), entry.live))
        .collect()
}

fn user_said(chat: &ChatContext, text: &str) -> bool {
    chat.items().iter().any(
        |item| matches!(item, ChatItem::Message(m) if m.role == ChatRole::User && m.content == text),
    )
}

#[actix::test]
async fn the_history_follows_a_call_across_a_sub_task_and_a_handoff_without_repeating_items() {
    tokio::time::pause();
    let save = Tool::new(
        "save_email",
        "Saves the email",
        |_ctx: RunContext, args: Contact| async move { ToolReturn::complete_task(&args) },
    );
    let collector = Agent::builder("collector").tool(save).build().unwrap();
    let ask_email = Tool::new(
        "ask_email",
        "Collects an email",
        move |ctx: RunContext, _: NoArgs| {
            let collector = collector.clone();
            async move {
                let contact: Contact = ctx.run_task(collector).await?;
                Ok::<_, ToolFailure>(format!("email is {}", contact.email))
            }
        },
    );
    let billing = Agent::builder("billing").build().unwrap();
    let transfer = Tool::new(
        "transfer",
        "To billing",
        move |_ctx: RunContext, _: NoArgs| {
            let billing = billing.clone();
            async move { Ok::<_, ToolFailure>(Handoff::to(billing)) }
        },
    );
    let front = Agent::builder("front")
        .tool(ask_email)
        .tool(transfer)
        .build()
        .unwrap();
    let llm = ScriptedLlm::new([
        Reply::tool_call("ask_email", json!({})),
        Reply::tool_call("save_email", json!({"email": "a@b.c"})),
        Reply::text("Got a@b.c."),
        Reply::tool_call("transfer", json!({})),
        Reply::text("Billing here."),
    ]);
    let session = Session::builder()
        .llm(llm)
        .agent(front)
        .inherit_chat_context(true)
        .inspect(true)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let inspector = session.inspector().unwrap();

    // During the sub-task: the paused caller and the task agent, both running.
    let caller_turn = spawn_turn(&session, "take my email");
    wait_started(&inspector, "activity/s1/collector#1").await;
    session.wait_for_inactive().await;
    let during = tokio::time::timeout(BOUND, session.history())
        .await
        .expect("history answers");
    assert_eq!(
        agents(&during),
        [("front".into(), true), ("collector".into(), true)]
    );
    assert!(user_said(&during.agents[0].chat, "take my email"));
    // The task agent starts with its own context: only the handoff marker.
    assert_eq!(
        during.agents[1].chat.items(),
        [ChatItem::AgentHandoff {
            from: Some("front".into()),
            to: "collector".into()
        }]
    );

    // The task ends: the collector's final context is kept, the caller runs on.
    session.run("it is a@b.c").await.unwrap();
    caller_turn.await.unwrap().unwrap();
    let after_task = session.history().await;
    assert_eq!(
        agents(&after_task),
        [("front".into(), true), ("collector".into(), false)]
    );
    assert!(user_said(&after_task.agents[1].chat, "it is a@b.c"));
    let task_of = after_task.agents[1].sub_task_of.as_ref().unwrap();
    assert_eq!(task_of.caller.as_str(), "activity/s1/front#1");
    assert_eq!(
        task_of.after, 1,
        "front had the user's message when it paused"
    );

    // A handoff that inherits the context: billing starts with front's items.
    session.run("transfer me").await.unwrap();
    session.run("hi").await.unwrap();
    let live = session.history().await;
    assert_eq!(
        agents(&live),
        [
            ("front".into(), false),
            ("collector".into(), false),
            ("billing".into(), true)
        ]
    );
    let front_final = &live.agents[0];
    let billing = &live.agents[2];
    assert_eq!(billing.inherited, front_final.chat.len());
    assert_eq!(
        &billing.chat.items()[..billing.inherited],
        front_final.chat.items()
    );
    assert!(user_said(&billing.chat, "take my email"), "inherited");
    assert_eq!(live.activations_of("front").count(), 1);
    assert_eq!(live.chat_of("billing"), Some(&billing.chat));

    // The transcript has every item once, with the agent whose context it went to.
    let said: Vec<(&str, &str)> = live
        .transcript()
        .into_iter()
        .filter_map(|(agent, item)| match item {
            ChatItem::Message(m) if m.role == ChatRole::User => Some((agent, m.content.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(
        said,
        [
            ("front", "take my email"),
            ("collector", "it is a@b.c"),
            ("front", "transfer me"),
            ("billing", "hi")
        ]
    );

    // After close: the same activations, none running; `history()` agrees.
    let closed = session.close().await.unwrap();
    assert_eq!(
        agents(&closed),
        [
            ("front".into(), false),
            ("collector".into(), false),
            ("billing".into(), false)
        ]
    );
    assert_eq!(closed.agents[2].chat, billing.chat);
    assert_eq!(session.history().await, closed);
}

#[actix::test]
async fn the_history_answers_while_a_handoff_is_under_way() {
    tokio::time::pause();
    let entering = Gate::new();
    let gate = entering.clone();
    let billing = Agent::builder("billing")
        .on_enter(move |_ctx| {
            let gate = gate.clone();
            async move { gate.wait().await }
        })
        .build()
        .unwrap();
    let llm = ScriptedLlm::new([Reply::text("Hello.")]);
    let session = Session::builder()
        .llm(llm)
        .agent(Agent::builder("front").build().unwrap())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("hi").await.unwrap();
    let address = session.address();
    let handoff = tokio::spawn(async move { address.send(Handoff::to(billing)).await });
    // The switch waits on billing's on_enter: no current agent, but a history.
    let history = loop {
        let history = tokio::time::timeout(BOUND, session.history())
            .await
            .expect("history answers during a switch");
        if history.agents.len() == 2 {
            break history;
        }
        tokio::task::yield_now().await;
    };
    assert_eq!(
        agents(&history),
        [("front".into(), false), ("billing".into(), true)]
    );
    assert!(user_said(&history.agents[0].chat, "hi"));
    assert!(
        !handoff.is_finished(),
        "billing's on_enter still holds the switch"
    );
    entering.open();
    tokio::time::timeout(BOUND, handoff)
        .await
        .expect("the handoff ends once on_enter returns")
        .unwrap()
        .unwrap();
    assert_eq!(session.current_agent().await.unwrap(), "billing");
    session.close().await.unwrap();
}
