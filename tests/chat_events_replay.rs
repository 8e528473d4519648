//! Every change to an agent's chat context is an event: a subscriber that applies
//! `ChatContextSet`, `ConversationItemAdded`, `ConversationItemChanged` and
//! `ConversationItemRemoved` in order ends with exactly the chat each agent has. Checked
//! across a step with an async update, a speech cut to what was heard, a speech nobody
//! heard, a hook that appends, a hook that rewrites, and a handoff that inherits.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{spawn_turn, wait_on, Query};
use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{event, Gate, RecordingOutput, Reply, ScriptedLlm};
use tokio::sync::broadcast;

const BOUND: Duration = Duration::from_secs(30);

/// Per agent, the chat context rebuilt from events alone.
#[derive(Default)]
struct Replay {
    chats: HashMap<String, Vec<ChatItem>>,
}

impl Replay {
    /// Applies one event; false once the session has closed.
    fn apply(&mut self, event: SessionEvent) -> bool {
        match event {
            SessionEvent::ChatContextSet { agent, chat } => {
                self.chats.insert(agent, chat.items().to_vec());
            }
            SessionEvent::ConversationItemAdded { agent, item } => {
                self.chat(&agent).push(item);
            }
            SessionEvent::ConversationItemChanged { agent, index, item } => {
                let chat = self.chat(&agent);
                assert!(index < chat.len(), "{agent}: change at {index} of {chat:?}");
                chat[index] = item;
            }
            SessionEvent::ConversationItemRemoved { agent, index } => {
                let chat = self.chat(&agent);
                assert!(
                    index < chat.len(),
                    "{agent}: removal at {index} of {chat:?}"
                );
                chat.remove(index);
            }
            SessionEvent::Closed => return false,
            _ => {}
        }
        true
    }

    fn chat(&mut self, agent: &str) -> &mut Vec<ChatItem> {
        self.chats
            .get_mut(agent)
            .unwrap_or_else(|| panic!("{agent}: an item event before its chat was set"))
    }

    /// Reads events until the session's `Closed`.
    async fn follow(mut self, mut events: broadcast::Receiver<SessionEvent>) -> Self {
        loop {
            match tokio::time::timeout(BOUND, events.recv()).await {
                Ok(Ok(event)) => {
                    if !self.apply(event) {
                        return self;
                    }
                }
                Ok(Err(e)) => panic!("the event stream broke: {e}"),
                Err(_) => panic!("no Closed event within {BOUND:?}"),
            }
        }
    }
}

fn texts(items: &[ChatItem]) -> Vec<String> {
    items
        .iter()
        .map(|item| match item {
            ChatItem::Message(m) => format!("{:?} {}", m.role, m.content),
            other => format!("{:?}", other.call_id()),
        })
        .collect()
}

/// Runs a turn that makes `speeches` speeches, hands their ids to `report` (what the
/// output reports of them), and awaits the turn.
async fn spoken_turn(
    session: &Session,
    events: &mut broadcast::Receiver<SessionEvent>,
    (text, speeches): (&str, usize),
    report: impl FnOnce(&[SpeechId]),
) {
    let turn = spawn_turn(session, text);
    let mut ids = Vec::new();
    for _ in 0..speeches {
        ids.push(wait_on(events, event::speech_created()).await.id());
    }
    report(&ids);
    tokio::time::timeout(BOUND, turn)
        .await
        .expect("the turn did not end")
        .unwrap()
        .unwrap();
}

#[actix::test]
async fn events_alone_rebuild_every_agents_chat_context() {
    let billing = Agent::builder("billing").build().unwrap();
    let transfer = Tool::new(
        "transfer",
        "Hands the caller to billing",
        move |_ctx: RunContext, _: Query| {
            let billing = billing.clone();
            async move { Ok::<_, ToolFailure>(ToolReturn::from(billing)) }
        },
    );
    // The result waits for the test, so its deferred reply comes when the test says.
    let archive = Gate::new();
    let lookup = {
        let archive = archive.clone();
        Tool::new(
            "lookup",
            "Looks up an order",
            move |ctx: RunContext, _: Query| {
                let archive = archive.clone();
                async move {
                    ctx.update("looking in the archive").await?;
                    archive.wait().await;
                    Ok::<_, ToolFailure>("shipped on Monday")
                }
            },
        )
    };
    let host = Agent::builder("host")
        .tool(lookup)
        .tool(transfer)
        .on_user_turn_completed(|chat, message| {
            if message.content.contains("hello") {
                chat.push(ChatItem::message(ChatRole::System, "The caller is known."));
            }
            if message.content.contains("forget") {
                chat.edit(|items| {
                    items.retain(|item| {
                        !matches!(item, ChatItem::Message(m) if m.content.contains("my order"))
                    })
                });
            }
            TurnDecision::Reply
        })
        .build()
        .unwrap();
    let llm = ScriptedLlm::new([
        Reply::text("First part.").and_tool_call("lookup", json!({"q": "order"})),
        Reply::text("Second part."),
        Reply::text("It shipped on Monday."),
        Reply::text("Words nobody heard."),
        Reply::text("Forgotten."),
        Reply::tool_call("transfer", json!({"q": "billing"})),
        Reply::text("Billing here."),
    ]);
    let out = RecordingOutput::manual_playout();
    let session = Session::builder()
        .llm(llm)
        .agent(host)
        .output(out.clone())
        .inherit_chat_context(true)
        .event_capacity(4096)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    // A subscriber starts from the chat as it is when it subscribes (here, before any turn).
    let mut replay = Replay::default();
    let events_from_now = session.subscribe();
    replay.chats.insert(
        "host".into(),
        session.chat_context().await.unwrap().items().to_vec(),
    );
    let follower = actix::spawn(replay.follow(events_from_now));
    let mut events = session.subscribe();

    // A step with an async update; its first speech is cut, the second plays out.
    spoken_turn(
        &session,
        &mut events,
        ("hello, where is my order?", 2),
        |speeches| {
            out.played_out(speeches[1]);
            out.heard(speeches[0], "First");
        },
    )
    .await;
    // The result lands in the background: a deferred reply, spoken and heard.
    archive.open();
    let deferred = wait_on(&mut events, event::speech_created()).await.id();
    out.played_out(deferred);
    common::settled(&session).await;
    // A speech the user heard none of leaves the chat.
    spoken_turn(&session, &mut events, ("and then?", 1), |s| {
        out.heard(s[0], "")
    })
    .await;
    // The hook rewrites the context; then a handoff that inherits it.
    spoken_turn(
        &session,
        &mut events,
        ("forget what I said first", 1),
        |s| out.played_out(s[0]),
    )
    .await;
    session.run("transfer me").await.unwrap();
    spoken_turn(&session, &mut events, ("what do I owe?", 1), |s| {
        out.played_out(s[0])
    })
    .await;

    let history = session.close().await.unwrap();
    let replay = tokio::time::timeout(BOUND, follower)
        .await
        .expect("the follower saw Closed")
        .unwrap();
    for agent in ["host", "billing"] {
        let chat = &history.activations_of(agent).last().unwrap().chat;
        assert_eq!(
            texts(&replay.chats[agent]),
            texts(chat.items()),
            "{agent}: replayed chat differs"
        );
        assert_eq!(replay.chats[agent].as_slice(), chat.items());
    }
    // The scenario did exercise each kind of change.
    let host = texts(&replay.chats["host"]);
    assert!(host.contains(&"Assistant First".to_owned()), "{host:?}");
    assert!(!host.iter().any(|t| t.contains("nobody heard")), "{host:?}");
    assert!(
        !host.iter().any(|t| t.contains("where is my order")),
        "the hook removed the first question: {host:?}"
    );
    assert!(host.contains(&"System The caller is known.".to_owned()));
    assert!(host.contains(&"Assistant It shipped on Monday.".to_owned()));
    assert!(
        host.contains(&"Some(\"call_1/finished\")".to_owned()),
        "{host:?}"
    );
    let billing = texts(&replay.chats["billing"]);
    assert!(billing.contains(&"Assistant Billing here.".to_owned()));
    assert!(
        billing.contains(&"Assistant Forgotten.".to_owned()),
        "inherited"
    );
}
