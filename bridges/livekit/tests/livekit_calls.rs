//! Calls through the real livekit-agents 1.8.9 (installed by `worker_python` into the
//! target directory) and a `LiveKitBridge`, with no LiveKit server: a text-only
//! `AgentSession`, and audio calls with fake STT, VAD, TTS and audio I/O. Each test runs
//! one `tests/worker_scenarios.py` scenario, which checks LiveKit's side; the test checks
//! switchboard's.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{messages, run_worker, said_by, start_bridge, STORY};
use switchboard::{ChatItem, ChatRole};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_mode_runs_typed_turns_through_switchboard() {
    let harness = start_bridge(|o| o).await;
    let observed = run_worker(&harness, "text_mode", "text-1").await;
    assert_eq!(observed["end"], "the caller hung up", "{observed}");

    let call = harness.info.lock().unwrap()["text-1"].clone();
    assert_eq!(call.room.as_deref(), Some("text-room"));
    let history = harness.session("text-1").history().await;
    let said = messages(&history, "concierge");
    let users = said_by(&said, ChatRole::User);
    assert_eq!(users, ["What time do you open?", "Reserve a table for two"]);
    let chat = history.chat_of("concierge").unwrap();
    assert!(
        chat.items()
            .iter()
            .any(|i| matches!(i, ChatItem::FunctionCall(c) if c.name == "reserve")),
        "the tool turn called the tool: {chat:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_audio_call_with_tools_a_handoff_and_a_barge_in() {
    let harness = start_bridge(|o| o).await;
    let observed = run_worker(&harness, "audio_call", "audio-1").await;
    let heard = observed["heard"].as_str().unwrap().to_owned();
    assert!(
        !heard.is_empty() && STORY.starts_with(heard.trim_end()) && heard.len() < STORY.len(),
        "heard a part of the story: {heard:?}"
    );

    let call = harness.info.lock().unwrap()["audio-1"].clone();
    assert_eq!(call.participant.unwrap().identity, "caller-1");
    let history = harness.session("audio-1").history().await;
    // The async tool's result was spoken after its turn, by the concierge.
    let concierge = messages(&history, "concierge");
    let spoken = said_by(&concierge, ChatRole::Assistant);
    assert_eq!(
        spoken,
        [
            "Hello, this is the concierge.",
            "Checking the book for you.",
            "Your table is booked for two at 8pm."
        ],
        "{concierge:?}"
    );
    // The handoff: the supervisor greeted, told the story, and was cut to what was heard.
    let supervisor = messages(&history, "supervisor");
    let story = supervisor
        .iter()
        .find(|m| m.0 == ChatRole::Assistant && STORY.starts_with(m.1.trim_end()) && m.1.len() > 10)
        .unwrap_or_else(|| panic!("the story in the supervisor's chat: {supervisor:?}"));
    assert_eq!(
        (story.1.as_str(), story.2),
        (heard.as_str(), true),
        "{supervisor:?}"
    );
    assert!(
        supervisor
            .iter()
            .any(|m| m.0 == ChatRole::User && m.1 == "stop"),
        "{supervisor:?}"
    );
    assert!(
        supervisor.iter().any(|m| m.1 == "Okay, I will stop."),
        "{supervisor:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_mid_call_loses_and_doubles_nothing() {
    let harness = start_bridge(|o| o).await;
    let observed = run_worker(&harness, "reconnect", "reconnect-1").await;
    assert!(observed["connections"].as_u64().unwrap() >= 2, "{observed}");

    let history = harness.session("reconnect-1").history().await;
    let said = messages(&history, "concierge");
    let users = said_by(&said, ChatRole::User);
    assert_eq!(
        users,
        ["What time do you open?", "And on Sundays?"],
        "{said:?}"
    );
    let answers = said
        .iter()
        .filter(|m| m.1 == "On Sundays we open at ten.")
        .count();
    assert_eq!(answers, 1, "{said:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_is_refused() {
    let harness = start_bridge(|mut o| {
        o.resume_window = Duration::from_secs(5);
        o
    })
    .await;
    let observed = run_worker(&harness, "refused", "refused-1").await;
    assert_eq!(observed["refused"], "wrong token");
    assert!(harness.sessions.lock().unwrap().is_empty());
}
