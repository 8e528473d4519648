//! SPEC §8 "Speech", "Barge-in": what the host's output reports about playout cannot
//! rewrite the conversation. A report is final once recorded: a late or repeated one
//! changes nothing (a late "interrupted, heard nothing" for a speech that played in full
//! does not delete its message). Heard text only finds where the agent's own words were
//! cut, by words, tolerant of a TTS reading "$5" as "five dollars"; it never becomes the
//! agent's words. A close tells an output that a barge-in paused to stop.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{spawn_turn, wait_on};
use switchboard::prelude::*;
use switchboard::testing::{event, OutputCall, RecordingOutput, Reply, ScriptedLlm};

const BOUND: Duration = Duration::from_secs(30);

async fn session_with(llm: std::sync::Arc<ScriptedLlm>, out: &RecordingOutput) -> Session {
    Session::builder()
        .llm(llm)
        .agent(Agent::builder("agent").build().unwrap())
        .output(out.clone())
        .start(&Engine::current().unwrap())
        .await
        .unwrap()
}

/// The assistant messages of a chat context: text and whether it was cut short.
fn said(chat: &ChatContext) -> Vec<(String, bool)> {
    chat.items()
        .iter()
        .filter_map(|item| match item {
            ChatItem::Message(m) if m.role == ChatRole::Assistant => {
                Some((m.content.clone(), m.interrupted))
            }
            _ => None,
        })
        .collect()
}

/// Runs a turn whose one speech the test reports with `report`, and returns its handle.
async fn turn_reported(
    session: &Session,
    events: &mut tokio::sync::broadcast::Receiver<SessionEvent>,
    text: &str,
    report: impl FnOnce(SpeechId),
) -> (SpeechHandle, RunResult) {
    let turn = spawn_turn(session, text);
    let speech = wait_on(events, event::speech_created()).await;
    report(speech.id());
    let result = tokio::time::timeout(BOUND, turn)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    (speech, result)
}

#[actix::test]
async fn a_late_report_for_a_speech_that_played_in_full_changes_nothing() {
    let out = RecordingOutput::manual_playout();
    let llm = ScriptedLlm::new([
        Reply::text("Your table is booked."),
        Reply::text("See you at eight."),
    ]);
    let session = session_with(llm.clone(), &out).await;
    let mut events = session.subscribe();
    let (first, _) = turn_reported(&session, &mut events, "book it", |s| out.played_out(s)).await;
    turn_reported(&session, &mut events, "when?", |s| out.played_out(s)).await;
    // After a later turn, the output reports the first speech again: cut, nothing heard.
    out.heard(first.id(), "");
    out.heard(first.id(), "Your");
    // The reports went to the session before this read: it sees what they did.
    let chat = session.chat_context().await.unwrap();
    assert_eq!(
        said(&chat),
        [
            ("Your table is booked.".to_owned(), false),
            ("See you at eight.".to_owned(), false)
        ]
    );
    assert_eq!(first.outcome(), Some(SpeechOutcome::Played));
    while let Ok(event) = events.try_recv() {
        assert!(
            !matches!(
                event,
                SessionEvent::ConversationItemRemoved { .. }
                    | SessionEvent::ConversationItemChanged { .. }
            ),
            "{event:?}"
        );
    }
    session.close().await.unwrap();
}

#[actix::test]
async fn a_repeated_report_changes_nothing() {
    let out = RecordingOutput::manual_playout();
    let llm = ScriptedLlm::new([Reply::text("Hello there, how can I help?")]);
    let session = session_with(llm, &out).await;
    let mut events = session.subscribe();
    let (speech, result) = turn_reported(&session, &mut events, "hi", |s| {
        out.heard(s, "Hello there");
        out.heard(s, "");
        out.played_out(s);
    })
    .await;
    assert_eq!(
        result.assistant_messages().collect::<Vec<_>>(),
        ["Hello there"]
    );
    assert_eq!(
        speech.outcome(),
        Some(SpeechOutcome::Interrupted {
            heard: Some("Hello there".into())
        })
    );
    let chat = session.chat_context().await.unwrap();
    assert_eq!(said(&chat), [("Hello there".to_owned(), true)]);
    session.close().await.unwrap();
}

#[actix::test]
async fn heard_text_that_is_not_a_prefix_finds_the_cut_and_never_becomes_the_agents_words() {
    let out = RecordingOutput::manual_playout();
    let llm = ScriptedLlm::new([
        Reply::text("Please hold while I check."),
        Reply::text("Your refund of $5 is approved today."),
        Reply::text("Is there anything else?"),
    ]);
    let session = session_with(llm.clone(), &out).await;
    let mut events = session.subscribe();
    // A careless output: heard text from somewhere else entirely.
    let (_, first) = turn_reported(&session, &mut events, "refund?", |s| {
        out.heard(s, "Your refund of 5,000 dollars is approved.")
    })
    .await;
    assert_eq!(
        first.assistant_messages().collect::<Vec<_>>(),
        ["Please hold while I check."],
        "the cut is unknown: the agent's words stay, marked cut short"
    );
    // A TTS that read "$5" as "five dollars": the cut is found in the agent's words.
    let (_, second) = turn_reported(&session, &mut events, "and?", |s| {
        out.heard(s, "your refund of five dollars is")
    })
    .await;
    assert_eq!(
        second.assistant_messages().collect::<Vec<_>>(),
        ["Your refund of $5 is"]
    );
    let chat = session.chat_context().await.unwrap();
    assert_eq!(
        said(&chat),
        [
            ("Please hold while I check.".to_owned(), true),
            ("Your refund of $5 is".to_owned(), true)
        ]
    );
    // The next request carries none of the heard words the agent did not say.
    let turn = spawn_turn(&session, "ok");
    let speech = wait_on(&mut events, event::speech_created()).await;
    out.played_out(speech.id());
    turn.await.unwrap().unwrap();
    let request = llm.requests().pop().unwrap();
    for item in request.chat.items() {
        if let ChatItem::Message(m) = item {
            assert!(!m.content.contains("5,000"), "{m:?}");
            assert!(!m.content.contains("five dollars"), "{m:?}");
        }
    }
    session.close().await.unwrap();
}

#[actix::test]
async fn a_close_while_a_false_interruption_is_pending_tells_the_paused_output_to_stop() {
    let out = RecordingOutput::manual_playout().pausable();
    let llm = ScriptedLlm::new([Reply::text("Today we have soup and salad.")]);
    let session = session_with(llm, &out).await;
    let mut events = session.subscribe();
    let turn = spawn_turn(&session, "menu?");
    let speech = wait_on(&mut events, event::speech_created()).await.id();
    // The user talks over the speech for a moment, without words: the output pauses,
    // and the speech would resume after the false-interruption timeout (2 s).
    session.user_started_speaking();
    session.user_stopped_speaking();
    wait_on(&mut events, event::agent_state(AgentState::Listening)).await;
    assert!(out.calls().contains(&OutputCall::Pause(speech)));
    session.close().await.unwrap();
    let calls = out.calls();
    let paused = calls
        .iter()
        .position(|c| *c == OutputCall::Pause(speech))
        .unwrap();
    assert!(
        calls[paused..].contains(&OutputCall::Interrupt(speech)),
        "the paused output was told to stop: {calls:?}"
    );
    assert!(!calls.contains(&OutputCall::Resume(speech)), "{calls:?}");
    assert!(matches!(
        turn.await.unwrap(),
        Err(SessionError::Closed) | Ok(_)
    ));
}
