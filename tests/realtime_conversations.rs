//! Realtime agents end to end, against the scripted realtime model (the simulated OpenAI
//! Realtime server in memory, which refuses what the service refuses): the user speaks
//! through the session's audio input, the model's server hears the turn and answers in
//! audio, tools run, and nothing the engine sends is refused.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{
    event, silence, tone, EventWaiter, RealtimeReply, RealtimeScript, RecordingOutput,
    ScriptedRealtime,
};

mod common;
use common::Query;

const WAIT: Duration = Duration::from_secs(30);

/// Plays one user turn into the session: speech, then enough silence to end it.
fn speak(session: &Session) {
    let mut mic = session.audio_input();
    for _ in 0..15 {
        mic.push(&tone(20));
    }
    for _ in 0..15 {
        mic.push(&silence(20));
    }
    mic.flush();
}

fn weather() -> Tool {
    Tool::new(
        "get_weather",
        "The weather in a city",
        |_ctx: RunContext, q: Query| async move { Ok::<_, ToolFailure>(format!("sunny in {}", q.q)) },
    )
}

async fn assistant_said(events: &mut EventWaiter) -> String {
    events
        .next(event::item_added("an assistant message", |item| match item {
            ChatItem::Message(m) if m.role == ChatRole::Assistant => Some(m.content.clone()),
            _ => None,
        }))
        .await
        .unwrap()
        .1
}

#[switchboard::test]
async fn the_model_hears_the_user_and_answers_in_audio() {
    tokio::time::pause();
    let model = ScriptedRealtime::new(
        RealtimeScript::new([RealtimeReply::speech("Hello there, how can I help?")])
            .user_transcript("hi"),
    );
    let output = RecordingOutput::new();
    let agent = Agent::builder("assistant").instructions("Be brief.").build().unwrap();
    let session = Session::builder()
        .realtime(model.shared())
        .agent(agent)
        .output(output.clone())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let mut events = EventWaiter::new(&session).with_timeout(WAIT);
    speak(&session);
    assert_eq!(assistant_said(&mut events).await, "Hello there, how can I help?");
    session.wait_for_settled().await.unwrap();
    let chat = session.chat_context().await.unwrap();
    let texts: Vec<_> = chat.items().iter().filter_map(ChatItem::text).collect();
    assert_eq!(texts, ["hi", "Hello there, how can I help?"]);
    let speech = output.last_speech().unwrap();
    assert_eq!(speech.text, "Hello there, how can I help?");
    assert_eq!(speech.audio_bytes, 6 * 960, "six chunks of 20 ms");
    let report = model.report();
    assert_eq!(report.violations_total(), 0, "{report:#?}");
    assert_eq!(report.responses.get("created_vad"), Some(&1));
    session.close().await.unwrap();
}

#[switchboard::test]
async fn a_tool_call_is_answered_and_one_response_follows() {
    tokio::time::pause();
    let model = ScriptedRealtime::new(RealtimeScript::new([
        RealtimeReply::call("get_weather", json!({"q": "Paris"})),
        RealtimeReply::speech("It is sunny in Paris."),
    ]));
    let agent = Agent::builder("assistant")
        .instructions("Answer about the weather.")
        .tool(weather())
        .build()
        .unwrap();
    let session = Session::builder()
        .realtime(model.shared())
        .agent(agent)
        .output(RecordingOutput::new())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let mut events = EventWaiter::new(&session).with_timeout(WAIT);
    speak(&session);
    assert_eq!(assistant_said(&mut events).await, "It is sunny in Paris.");
    session.wait_for_settled().await.unwrap();
    let report = model.report();
    assert_eq!(report.violations_total(), 0, "{report:#?}");
    let outputs = report.events_of("conversation.item.create");
    assert_eq!(outputs.len(), 1, "{outputs:#?}");
    assert_eq!(outputs[0]["item"]["type"], "function_call_output");
    assert_eq!(outputs[0]["item"]["output"], "sunny in Paris");
    assert_eq!(report.events_of("response.create").len(), 1);
    let chat = session.chat_context().await.unwrap();
    common::assert_invariant(&chat);
    session.close().await.unwrap();
}
