//! SPEC §8 "Speaking from inside": a tool body and a hook say a text with the host's
//! options and get its handle, without the host's `Session`; a subscriber made before
//! `start` sees the first agent's `on_enter`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{assert_invariant, output, wait_on};
use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{event, RecordingOutput, Reply, ScriptedLlm};
use switchboard::{NoArgs, SpeechOutcome};

#[actix::test]
async fn a_tool_says_an_uninterruptible_text_and_gets_its_handle() {
    let confirm = Tool::new(
        "confirm_booking",
        "Confirms the booking aloud",
        |ctx: RunContext, _: NoArgs| async move {
            let speech = ctx
                .session()
                .say_with(
                    "Your table for two is booked for 8 pm.",
                    SayOptions::new().allow_interruptions(false),
                )
                .await?;
            Ok::<_, ToolFailure>(format!("confirmation said as speech {}", speech.id()))
        },
    );
    let llm = ScriptedLlm::new([
        Reply::tool_call("confirm_booking", json!({})),
        Reply::text("Anything else?"),
    ]);
    let out = RecordingOutput::new();
    let session = Session::builder()
        .llm(llm)
        .agent(Agent::builder("booker").tool(confirm).build().unwrap())
        .output(out.clone())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let mut events = session.subscribe();
    session.run("book it").await.unwrap();
    // The turn's own speeches may be interrupted; the tool's confirmation may not.
    let said = wait_on(
        &mut events,
        event::matching("the uninterruptible speech", |e| match e {
            SessionEvent::SpeechCreated { speech, .. } if !speech.allow_interruptions() => {
                Some(speech.clone())
            }
            _ => None,
        }),
    )
    .await;
    assert!(matches!(
        said.wait_for_playout().await,
        SpeechOutcome::Played
    ));
    common::settled(&session).await;
    let chat = session.chat_context().await.unwrap();
    assert!(output(&chat, "call_1").starts_with("confirmation said as speech"));
    let assistant: Vec<_> = chat
        .items()
        .iter()
        .filter_map(|i| match i {
            ChatItem::Message(m) if m.role == ChatRole::Assistant => Some(m.content.clone()),
            _ => None,
        })
        .collect();
    assert!(
        assistant.contains(&"Your table for two is booked for 8 pm.".to_owned()),
        "{assistant:?}"
    );
    assert!(out
        .speeches()
        .iter()
        .any(|s| s.text == "Your table for two is booked for 8 pm."));
    assert_invariant(&chat);
    session.close().await.unwrap();
}

#[actix::test]
async fn a_hook_greets_and_a_subscriber_made_before_start_hears_it() {
    let greeter = Agent::builder("greeter")
        .on_enter(|ctx| async move {
            ctx.session()
                .say("Welcome to Luigi's, how can I help?")
                .await
                .expect("the greeting is queued");
        })
        .build()
        .unwrap();
    let out = RecordingOutput::new();
    let mut builder = Session::builder()
        .llm(ScriptedLlm::new([]))
        .agent(greeter)
        .output(out.clone());
    let mut events = builder.subscribe();
    let session = builder.start(&Engine::current().unwrap()).await.unwrap();
    let greeting = wait_on(&mut events, event::speech_created()).await;
    assert!(matches!(
        greeting.wait_for_playout().await,
        SpeechOutcome::Played
    ));
    wait_on(
        &mut events,
        event::item_added("the greeting in the chat", |item| {
            (item.text() == Some("Welcome to Luigi's, how can I help?")).then_some(())
        }),
    )
    .await;
    assert_eq!(
        out.speeches()[0].text,
        "Welcome to Luigi's, how can I help?"
    );
    session.close().await.unwrap();
}
