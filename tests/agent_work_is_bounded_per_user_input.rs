//! SPEC §2a, issue 29: work the agents start on their own — replies a hook or tool queues,
//! handoffs a tool, hook or turn asks for — is bounded per user input
//! (`SessionBuilder::max_agent_work`). Two agents whose `on_enter` asks for a reply (the
//! pattern of `examples/voice_bot.rs`) and a model that always transfers used to hand the
//! call back and forth without end; now the chain stops at the limit, the host gets one
//! `AgentWorkRefused` event, the hook gets `AgentWorkLimit`, and the next user input is
//! answered.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::{Arc, Mutex};

use common::{assert_invariant, settled, wait_event};
use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{event, Reply, ScriptedLlm};
use switchboard::{AgentWork, NoArgs};
use tokio::sync::broadcast;

/// What the hooks were told when they asked for a reply or a handoff.
type Answers = Arc<Mutex<Vec<Result<(), String>>>>;

/// An agent that greets on entering (`on_enter` asks for a reply) and has a `transfer`
/// tool handing the call to `other`, built the same way.
fn greeter(name: &'static str, other: &'static str, answers: Answers) -> Agent {
    let hook_answers = answers.clone();
    Agent::builder(name)
        .on_enter(move |ctx| {
            let answers = hook_answers.clone();
            async move {
                let asked = ctx.generate_reply("Introduce yourself.").await;
                answers
                    .lock()
                    .unwrap()
                    .push(asked.map_err(|err| err.to_string()));
            }
        })
        .tool(Tool::new(
            "transfer",
            "Transfers the caller to the other desk",
            move |_ctx: RunContext, _: NoArgs| {
                let answers = answers.clone();
                async move { Ok::<_, ToolFailure>(greeter(other, name, answers)) }
            },
        ))
        .build()
        .unwrap()
}

/// A model that transfers every time, except when the user asks whether it is there.
fn always_transfers() -> Arc<ScriptedLlm> {
    let llm = ScriptedLlm::new([]);
    llm.when_user_says("are you there", Reply::text("Yes, I am here."));
    llm.otherwise(Reply::tool_call("transfer", json!({})));
    llm
}

async fn refused(events: &mut broadcast::Receiver<SessionEvent>) -> (String, AgentWork, u32) {
    wait_event(events, |event| match event {
        SessionEvent::AgentWorkRefused { agent, work, limit } => {
            Some((agent.clone(), work.clone(), *limit))
        }
        _ => None,
    })
    .await
}

fn refusals(events: &mut broadcast::Receiver<SessionEvent>) -> usize {
    let mut count = 0;
    while let Ok(event) = events.try_recv() {
        count += usize::from(matches!(event, SessionEvent::AgentWorkRefused { .. }));
    }
    count
}

#[actix::test]
async fn a_handoff_ping_pong_stops_at_the_limit_and_the_next_user_message_is_answered() {
    tokio::time::pause();
    const LIMIT: u32 = 6;
    let llm = always_transfers();
    let answers = Answers::default();
    let mut builder = Session::builder()
        .llm(llm.clone())
        .agent(greeter("alice", "bob", answers.clone()))
        .max_agent_work(LIMIT);
    let mut events = builder.subscribe();
    let session = builder.start(&Engine::current().unwrap()).await.unwrap();

    // With no user input at all, alice's greeting starts the ping-pong: reply, handoff,
    // reply, handoff, … six pieces of work, and bob's next greeting is refused.
    let (agent, work, limit) = refused(&mut events).await;
    assert_eq!(
        (agent.as_str(), work, limit),
        ("bob", AgentWork::Reply, LIMIT)
    );
    settled(&session).await;
    assert_eq!(session.current_agent().await.unwrap(), "bob");
    // Three replies asked the model (alice, bob, alice); the refused one did not.
    assert_eq!(llm.request_count(), 3);
    assert_eq!(refusals(&mut events), 0, "one event per user input");

    // One user message: the chain runs again from its start — the user's turn hands
    // off, then greeting, handoff, … — and stops at the limit: alice's transfer is refused.
    let result = session.run("please transfer me").await.unwrap();
    assert_eq!(result.handoff(), Some("alice"));
    let (agent, work, _) = refused(&mut events).await;
    assert_eq!(
        (agent.as_str(), work),
        (
            "alice",
            AgentWork::Handoff {
                to: "bob".to_owned()
            }
        )
    );
    settled(&session).await;
    assert_eq!(session.current_agent().await.unwrap(), "alice");
    // The user's request, then one per greeting admitted: bounded by the limit.
    let after_one_message = llm.request_count() - 3;
    assert_eq!(after_one_message, 1 + LIMIT as usize / 2);
    assert_eq!(refusals(&mut events), 0);

    // The session is usable: the next user message is answered.
    let result = session.run("hello, are you there?").await.unwrap();
    assert_eq!(
        result.assistant_messages().collect::<Vec<_>>(),
        ["Yes, I am here."]
    );
    assert_eq!(session.current_agent().await.unwrap(), "alice");
    assert_invariant(&session.chat_context().await.unwrap());

    // The refused greeting's hook was told why.
    let answers = answers.lock().unwrap().clone();
    let limited: Vec<_> = answers.iter().filter_map(|a| a.as_ref().err()).collect();
    assert_eq!(limited.len(), 1, "{answers:?}");
    assert!(limited[0].contains("max_agent_work"), "{}", limited[0]);
    session.close().await.unwrap();
}

#[actix::test]
async fn a_handoff_a_turn_asks_for_past_the_limit_leaves_the_current_agent() {
    tokio::time::pause();
    let llm = always_transfers();
    let mut builder = Session::builder()
        .llm(llm.clone())
        .agent(greeter("alice", "bob", Answers::default()))
        .max_agent_work(1);
    let mut events = builder.subscribe();
    let session = builder.start(&Engine::current().unwrap()).await.unwrap();

    // Alice's greeting is the one piece of work allowed; the transfer its turn asks for
    // is refused and alice stays, her chat still holding the call and its output.
    let (agent, work, limit) = refused(&mut events).await;
    assert_eq!(
        (agent.as_str(), work, limit),
        (
            "alice",
            AgentWork::Handoff {
                to: "bob".to_owned()
            },
            1
        )
    );
    settled(&session).await;
    assert_eq!(session.current_agent().await.unwrap(), "alice");
    assert_eq!(llm.request_count(), 1);
    let chat = session.chat_context().await.unwrap();
    assert_invariant(&chat);
    assert_eq!(
        chat.items()
            .iter()
            .filter(|i| matches!(i, ChatItem::FunctionCall(_)))
            .count(),
        1
    );

    // The user's own turn hands off (the one piece of work), bob's greeting is refused.
    let result = session.run("please transfer me").await.unwrap();
    assert_eq!(result.handoff(), Some("bob"));
    let (_, work, _) = refused(&mut events).await;
    assert_eq!(work, AgentWork::Reply);
    let result = session.run("are you there?").await.unwrap();
    assert_eq!(
        result.assistant_messages().collect::<Vec<_>>(),
        ["Yes, I am here."]
    );
    session.close().await.unwrap();
}

/// An agent whose `on_enter` hands straight on to `other`: no model involved at all.
fn relay(name: &'static str, other: &'static str, answers: Answers) -> Agent {
    Agent::builder(name)
        .on_enter(move |ctx| {
            let answers = answers.clone();
            async move {
                let asked = ctx
                    .session()
                    .update_agent(relay(other, name, answers.clone()))
                    .await;
                answers
                    .lock()
                    .unwrap()
                    .push(asked.map_err(|err| err.to_string()));
            }
        })
        .build()
        .unwrap()
}

#[actix::test]
async fn hooks_that_hand_off_to_each_other_stop_at_the_limit() {
    tokio::time::pause();
    let llm = ScriptedLlm::new([]);
    llm.otherwise(Reply::text("Hello."));
    let answers = Answers::default();
    let mut builder = Session::builder()
        .llm(llm.clone())
        .agent(relay("left", "right", answers.clone()))
        .max_agent_work(4);
    let mut events = builder.subscribe();
    let session = builder.start(&Engine::current().unwrap()).await.unwrap();
    let work = common::wait_on(&mut events, event::agent_work_refused()).await;
    assert!(matches!(work, AgentWork::Handoff { .. }));
    settled(&session).await;
    let answers = answers.lock().unwrap().clone();
    assert_eq!(answers.iter().filter(|a| a.is_ok()).count(), 4);
    assert_eq!(answers.iter().filter(|a| a.is_err()).count(), 1);
    // Four handoffs from `left`: `left` is current again; the user is answered.
    assert_eq!(session.current_agent().await.unwrap(), "left");
    let result = session.run("hi").await.unwrap();
    assert_eq!(result.assistant_messages().collect::<Vec<_>>(), ["Hello."]);
    assert_eq!(llm.request_count(), 1);
    session.close().await.unwrap();
}

#[actix::test]
async fn by_default_one_spoken_message_costs_a_handful_of_requests_not_thousands() {
    tokio::time::pause();
    let llm = always_transfers();
    let mut builder = Session::builder()
        .llm(llm.clone())
        .agent(greeter("alice", "bob", Answers::default()))
        .endpointing_delay(std::time::Duration::ZERO);
    let mut events = builder.subscribe();
    let session = builder.start(&Engine::current().unwrap()).await.unwrap();
    refused(&mut events).await;
    settled(&session).await;
    // Eight pieces of work: four greetings (requests) and four handoffs.
    let at_start = llm.request_count();
    assert_eq!(at_start, 4, "requests before any input");

    // A final transcript is user input: the chain runs once more, bounded the same way.
    session.transcript("please transfer me", true);
    refused(&mut events).await;
    settled(&session).await;
    // The user's turn, then four greetings; the fifth handoff is refused.
    let after = llm.request_count() - at_start;
    assert_eq!(after, 5, "requests after one message");

    session.transcript("are you there?", true);
    wait_event(&mut events, |event| match event {
        SessionEvent::ConversationItemAdded {
            item: ChatItem::Message(m),
            ..
        } if m.content == "Yes, I am here." => Some(()),
        _ => None,
    })
    .await;
    session.close().await.unwrap();
}
