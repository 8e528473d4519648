//! SPEC §10: the scripted LLM's matchers; SPEC §1: `on_user_turn_completed` may edit the
//! user's message or stop the reply.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use switchboard::prelude::*;
use switchboard::testing::{Reply, ScriptedLlm};
use switchboard::TurnDecision;

async fn session(agent: Agent, llm: std::sync::Arc<ScriptedLlm>) -> Session {
    Session::builder()
        .llm(llm)
        .agent(agent)
        .start(&Engine::current().unwrap())
        .await
        .unwrap()
}

#[actix::test]
async fn replies_by_turn_by_user_message_and_by_closure() {
    let llm = ScriptedLlm::new([Reply::text("from the script")]);
    llm.on_turn(1, Reply::text("second turn"));
    llm.when_user_says("weather", Reply::text("sunny"));
    llm.rule(|req| {
        req.instructions
            .contains("pirate")
            .then(|| Reply::text("arr"))
    });
    let s = session(Agent::builder("a").build().unwrap(), llm.clone()).await;
    let say = |r: RunResult| {
        r.assistant_messages()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(say(s.run("hello").await.unwrap()), ["from the script"]);
    assert_eq!(say(s.run("and now?").await.unwrap()), ["second turn"]);
    assert_eq!(say(s.run("the weather?").await.unwrap()), ["sunny"]);
    // Nothing left: the turn fails with the request printed, the session goes on.
    match s.run("anything else?").await {
        Err(SessionError::TurnFailed {
            failure: TurnFailure::Llm(err),
            ..
        }) => {
            let message = err.to_string();
            assert!(message.contains("index 3"), "{message}");
            assert!(message.contains("anything else?"), "{message}");
        }
        other => panic!("expected an LLM error, got {other:?}"),
    }
    s.close().await.unwrap();

    let pirate = Agent::builder("p")
        .instructions("Talk like a pirate.")
        .build()
        .unwrap();
    let s = session(pirate, llm).await;
    assert_eq!(say(s.run("hi").await.unwrap()), ["arr"]);
    s.close().await.unwrap();
}

#[actix::test]
async fn on_user_turn_completed_edits_the_message_or_stops_the_reply() {
    let agent = Agent::builder("a")
        .on_user_turn_completed(|_chat, message| {
            if message.content.contains("secret") {
                message.content = "[redacted]".into();
                return TurnDecision::NoReply;
            }
            TurnDecision::Reply
        })
        .build()
        .unwrap();
    let llm = ScriptedLlm::new([Reply::text("ok")]);
    let s = session(agent, llm.clone()).await;
    let quiet = s.run("my secret is 42").await.unwrap();
    assert_eq!(quiet.assistant_messages().count(), 0);
    assert_eq!(llm.request_count(), 0, "no reply was asked for");
    s.run("hello").await.unwrap();
    let chat = s.chat_context().await.unwrap();
    let first = &chat.items()[0];
    assert!(matches!(first, ChatItem::Message(m) if m.content == "[redacted]"));
    assert!(llm.requests()[0]
        .chat
        .items()
        .iter()
        .all(|i| !matches!(i, ChatItem::Message(m) if m.content.contains("42"))));
    s.close().await.unwrap();
}
