//! SPEC §8 "Barge-in": the user talking over the agent. A pausable output pauses at
//! once; the interruption becomes real after `min_interruption_duration` or with a
//! transcript; a short overlap without words resumes after `false_interruption_timeout`.
//! A real interruption stops the output and the LLM stream, no further step runs, the
//! calls of the step get their outputs, and the chat keeps only what was heard — checked
//! while streaming, during a tool step, during a deferred reply and on the first of two
//! speeches of a turn. Paused time throughout; time moves only by `advance`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{assert_invariant, output, spawn_turn, wait_event, wait_on, Query};
use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{event, Gate, OutputCall, RecordingOutput, Reply, ScriptedLlm};
use switchboard::SpeechId;
use tokio::sync::mpsc;
use tokio::time::advance;

const BOUND: Duration = Duration::from_secs(30);

async fn session_with(
    llm: std::sync::Arc<ScriptedLlm>,
    agent: Agent,
    out: &RecordingOutput,
) -> Session {
    Session::builder()
        .llm(llm)
        .agent(agent)
        .output(out.clone())
        .inspect(true)
        .start(&Engine::current().unwrap())
        .await
        .unwrap()
}

/// Waits until the (first) activity of `agent` has handled its `n`-th `kind`.
async fn handled(inspector: &Inspector, agent: &str, kind: &str, n: usize) {
    inspector
        .wait_for_nth(&format!("activity/s1/{agent}#1"), kind, n, BOUND)
        .await
        .unwrap();
}

async fn speech_created(events: &mut tokio::sync::broadcast::Receiver<SessionEvent>) -> SpeechId {
    wait_on(events, event::speech_created()).await.id()
}

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

#[actix::test]
async fn a_barge_in_while_the_model_streams_pauses_then_interrupts_and_keeps_what_was_heard() {
    tokio::time::pause();
    let out = RecordingOutput::manual_playout().pausable();
    let llm = ScriptedLlm::new([Reply::text("Today we have soup, fish and").and_stall()]);
    let session = session_with(llm.clone(), Agent::builder("waiter").build().unwrap(), &out).await;
    let inspector = session.inspector().unwrap();
    let mut events = session.subscribe();
    let turn = spawn_turn(&session, "what is on the menu?");
    let speech = speech_created(&mut events).await;

    session.user_started_speaking();
    handled(&inspector, "waiter", "UserStartedSpeaking", 1).await;
    assert_eq!(
        out.calls().last(),
        Some(&OutputCall::Pause(speech)),
        "paused at once"
    );
    assert_eq!(session.agent_state(), AgentState::Listening);

    // Half a second of the user's voice: a real interruption.
    advance(Duration::from_millis(500)).await;
    wait_event(&mut events, |e| {
        matches!(e, SessionEvent::TurnInterrupted { .. }).then_some(())
    })
    .await;
    assert!(out.calls().contains(&OutputCall::Interrupt(speech)));
    // The output says what the user heard before it stopped.
    out.heard(speech, "Today we have soup");
    let result = tokio::time::timeout(BOUND, turn)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(result.interrupted);
    assert_eq!(
        result.assistant_messages().collect::<Vec<_>>(),
        ["Today we have soup"]
    );
    let chat = session.chat_context().await.unwrap();
    assert_eq!(said(&chat), [("Today we have soup".to_owned(), true)]);
    assert_eq!(llm.request_count(), 1, "no further step");
    assert_invariant(&chat);
    session.close().await.unwrap();
}

/// A tool that reports it started, then waits for its gate.
fn gated(name: &'static str, gate: Gate, started: mpsc::UnboundedSender<&'static str>) -> Tool {
    Tool::new(
        name,
        "Waits for its gate",
        move |ctx: RunContext, _: Query| {
            let (gate, started) = (gate.clone(), started.clone());
            async move {
                let _ = started.send(name);
                match ctx.wait_if_not_cancelled(gate.wait()).await {
                    Some(()) => Ok::<_, ToolFailure>(format!("{name} done")),
                    None => Ok(format!("{name} undone")),
                }
            }
        },
    )
}

#[actix::test]
async fn a_barge_in_during_a_tool_step_cancels_or_backgrounds_the_calls_and_the_result_comes_later()
{
    tokio::time::pause();
    let out = RecordingOutput::manual_playout().pausable();
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let booking_gate = Gate::new();
    let booking = gated("book_table", booking_gate.clone(), started_tx.clone());
    let search = gated("search_menu", Gate::new(), started_tx).cancel_on_interruption(true);
    let llm = ScriptedLlm::new([
        Reply::text("One moment.")
            .and_tool_call("book_table", json!({"q": "8pm"}))
            .and_tool_call("search_menu", json!({"q": "vegan"})),
        Reply::text("Your table is booked."),
    ]);
    let agent = Agent::builder("host")
        .tool(booking)
        .tool(search)
        .build()
        .unwrap();
    let session = session_with(llm.clone(), agent, &out).await;
    let inspector = session.inspector().unwrap();
    let mut events = session.subscribe();
    let turn = spawn_turn(&session, "a table at 8 and something vegan");
    let speech = speech_created(&mut events).await;
    started.recv().await.unwrap();
    started.recv().await.unwrap();

    session.user_started_speaking();
    session.transcript("wait", false); // words: the interruption is real at once
    handled(&inspector, "host", "UserTranscript", 1).await;
    out.heard(speech, "One moment.");
    let result = tokio::time::timeout(BOUND, turn)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(result.interrupted);
    let chat = session.chat_context().await.unwrap();
    assert_invariant(&chat);
    assert_eq!(
        output(&chat, "call_1"),
        "Still running; the result will follow."
    );
    assert_eq!(output(&chat, "call_2"), "Cancelled: the user interrupted.");
    assert_eq!(llm.request_count(), 1);

    // The booking finishes while the user still speaks: its reply waits for them.
    booking_gate.open();
    wait_on(&mut events, event::output_added("call_1/finished")).await;
    assert_eq!(llm.request_count(), 1, "no reply while the user speaks");
    session.user_stopped_speaking();
    let reply = speech_created(&mut events).await;
    out.played_out(reply);
    tokio::time::timeout(BOUND, session.wait_for_settled())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(llm.request_count(), 2);
    let chat = session.chat_context().await.unwrap();
    assert_invariant(&chat);
    assert_eq!(output(&chat, "call_1/finished"), "book_table done");
    session.close().await.unwrap();
}

#[actix::test]
async fn a_barge_in_during_a_deferred_reply_cuts_it() {
    tokio::time::pause();
    let out = RecordingOutput::manual_playout().pausable();
    // Finishes once the turn has replied, so that its `/finished` asks for a deferred reply.
    let ordered = Gate::new();
    let finish = ordered.clone();
    let progress = Tool::new("order", "Orders", move |ctx: RunContext, _: Query| {
        let finish = finish.clone();
        async move {
            ctx.update("ordering").await?;
            finish.wait().await;
            Ok::<_, ToolFailure>("ordered")
        }
    });
    let llm = ScriptedLlm::new([
        Reply::tool_call("order", json!({"q": "tea"})),
        Reply::text("Ordering."),
        Reply::text("Your tea is ordered and will").and_stall(),
    ]);
    let session = session_with(
        llm.clone(),
        Agent::builder("barista").tool(progress).build().unwrap(),
        &out,
    )
    .await;
    let inspector = session.inspector().unwrap();
    let mut events = session.subscribe();
    let turn = spawn_turn(&session, "tea please");
    let first = speech_created(&mut events).await;
    out.played_out(first);
    tokio::time::timeout(BOUND, turn)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    ordered.open();
    let deferred = speech_created(&mut events).await;
    assert_eq!(llm.request_count(), 3);

    session.user_started_speaking();
    handled(&inspector, "barista", "UserStartedSpeaking", 1).await;
    advance(Duration::from_millis(600)).await;
    wait_event(&mut events, |e| {
        matches!(e, SessionEvent::TurnInterrupted { .. }).then_some(())
    })
    .await;
    out.heard(deferred, "");
    session.user_stopped_speaking();
    tokio::time::timeout(BOUND, session.wait_for_inactive())
        .await
        .unwrap();
    let chat = session.chat_context().await.unwrap();
    assert_invariant(&chat);
    assert_eq!(
        said(&chat),
        [("Ordering.".to_owned(), false)],
        "nothing heard: not kept"
    );
    session.close().await.unwrap();
}

#[actix::test]
async fn a_barge_in_on_the_first_of_two_speeches_cuts_each_to_what_was_heard() {
    tokio::time::pause();
    let out = RecordingOutput::manual_playout().pausable();
    let lookup = Tool::new(
        "lookup",
        "Looks up",
        |_ctx: RunContext, _: Query| async move { Ok::<_, ToolFailure>("found") },
    );
    let llm = ScriptedLlm::new([
        Reply::text("Let me look that up.").and_tool_call("lookup", json!({"q": "x"})),
        Reply::text("I found it: it is on the second floor.").and_stall(),
    ]);
    let session = session_with(
        llm.clone(),
        Agent::builder("guide").tool(lookup).build().unwrap(),
        &out,
    )
    .await;
    let inspector = session.inspector().unwrap();
    let mut events = session.subscribe();
    let turn = spawn_turn(&session, "where is the shop?");
    let first = speech_created(&mut events).await;
    let second = speech_created(&mut events).await;
    // The first speech still plays (no report yet) while the second streams.
    session.user_started_speaking();
    session.transcript("no wait", true);
    handled(&inspector, "guide", "UserTranscript", 1).await;
    let calls = out.calls();
    assert!(calls.contains(&OutputCall::Interrupt(first)), "{calls:?}");
    assert!(calls.contains(&OutputCall::Interrupt(second)), "{calls:?}");
    // Reports come in any order, each for its own speech.
    out.heard(second, "");
    out.heard(first, "Let me look");
    let result = tokio::time::timeout(BOUND, turn)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(result.interrupted);
    assert_eq!(
        result.assistant_messages().collect::<Vec<_>>(),
        ["Let me look"]
    );
    session.user_stopped_speaking();
    let chat = session.chat_context().await.unwrap();
    assert_invariant(&chat);
    assert_eq!(said(&chat)[0], ("Let me look".to_owned(), true));
    assert_eq!(output(&chat, "call_1"), "found");
    session.close().await.unwrap();
}

#[actix::test]
async fn a_short_overlap_without_words_is_a_false_interruption_and_the_speech_resumes() {
    tokio::time::pause();
    let out = RecordingOutput::manual_playout().pausable();
    let llm = ScriptedLlm::new([Reply::text("Welcome to the museum.")]);
    let session = session_with(llm, Agent::builder("guide").build().unwrap(), &out).await;
    let inspector = session.inspector().unwrap();
    let mut events = session.subscribe();
    let turn = spawn_turn(&session, "hello");
    let speech = speech_created(&mut events).await;
    session.user_started_speaking();
    handled(&inspector, "guide", "UserStartedSpeaking", 1).await;
    advance(Duration::from_millis(200)).await; // a cough
    session.user_stopped_speaking();
    handled(&inspector, "guide", "UserStoppedSpeaking", 1).await;
    advance(Duration::from_secs(2)).await; // no transcript within the timeout
    let resumed = wait_event(&mut events, |e| match e {
        SessionEvent::AgentFalseInterruption { resumed } => Some(*resumed),
        _ => None,
    })
    .await;
    assert!(resumed);
    assert_eq!(
        out.calls()
            .into_iter()
            .filter(|c| matches!(
                c,
                OutputCall::Pause(_) | OutputCall::Resume(_) | OutputCall::Interrupt(_)
            ))
            .collect::<Vec<_>>(),
        [OutputCall::Pause(speech), OutputCall::Resume(speech)]
    );
    out.played_out(speech);
    let result = tokio::time::timeout(BOUND, turn)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(!result.interrupted);
    assert_eq!(
        result.assistant_messages().collect::<Vec<_>>(),
        ["Welcome to the museum."]
    );
    session.close().await.unwrap();
}

#[actix::test]
async fn without_pause_support_a_short_overlap_is_ignored_and_a_long_one_interrupts() {
    tokio::time::pause();
    let out = RecordingOutput::manual_playout();
    let llm = ScriptedLlm::new([Reply::text("First."), Reply::text("Second, longer.")]);
    let session = session_with(llm, Agent::builder("guide").build().unwrap(), &out).await;
    let inspector = session.inspector().unwrap();
    let mut events = session.subscribe();
    let turn = spawn_turn(&session, "one");
    let speech = speech_created(&mut events).await;
    session.user_started_speaking();
    handled(&inspector, "guide", "UserStartedSpeaking", 1).await;
    advance(Duration::from_millis(100)).await;
    session.user_stopped_speaking();
    handled(&inspector, "guide", "UserStoppedSpeaking", 1).await;
    advance(Duration::from_secs(2)).await;
    let resumed = wait_event(&mut events, |e| match e {
        SessionEvent::AgentFalseInterruption { resumed } => Some(*resumed),
        _ => None,
    })
    .await;
    assert!(!resumed, "nothing was paused");
    out.played_out(speech);
    assert!(!turn.await.unwrap().unwrap().interrupted);

    let turn = spawn_turn(&session, "two");
    let speech = speech_created(&mut events).await;
    session.user_started_speaking();
    handled(&inspector, "guide", "UserStartedSpeaking", 2).await;
    advance(Duration::from_millis(500)).await;
    wait_event(&mut events, |e| {
        matches!(e, SessionEvent::TurnInterrupted { .. }).then_some(())
    })
    .await;
    assert!(!out.calls().contains(&OutputCall::Pause(speech)));
    assert!(out.calls().contains(&OutputCall::Interrupt(speech)));
    out.heard(speech, "Second");
    assert!(turn.await.unwrap().unwrap().interrupted);
    session.close().await.unwrap();
}

#[actix::test]
async fn an_uninterruptible_speech_ignores_the_user() {
    tokio::time::pause();
    let out = RecordingOutput::manual_playout().pausable();
    let llm = ScriptedLlm::new([Reply::text("Please listen to these terms.")]);
    let agent = Agent::builder("legal")
        .allow_interruptions(false)
        .build()
        .unwrap();
    let session = session_with(llm, agent, &out).await;
    let inspector = session.inspector().unwrap();
    let mut events = session.subscribe();
    let turn = spawn_turn(&session, "go on");
    let speech = speech_created(&mut events).await;
    session.user_started_speaking();
    session.transcript("stop", false);
    handled(&inspector, "legal", "UserTranscript", 1).await;
    advance(Duration::from_secs(3)).await;
    assert!(
        !out.calls()
            .iter()
            .any(|c| matches!(c, OutputCall::Pause(_) | OutputCall::Interrupt(_))),
        "{:?}",
        out.calls()
    );
    assert!(matches!(
        session.interrupt().await,
        Err(SessionError::Uninterruptible)
    ));
    session.user_stopped_speaking();
    out.played_out(speech);
    let result = tokio::time::timeout(BOUND, turn)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(!result.interrupted);
    session.close().await.unwrap();
}

#[actix::test]
async fn a_final_transcript_preempts_a_slow_tool_step_and_the_users_turn_runs_next() {
    tokio::time::pause();
    let out = RecordingOutput::new();
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let slow = gated("slow_search", Gate::new(), started_tx);
    let llm = ScriptedLlm::new([Reply::tool_call("slow_search", json!({"q": "flights"}))]);
    llm.when_user_says("cancel that", Reply::text("Okay, cancelled."));
    let session = session_with(
        llm.clone(),
        Agent::builder("travel").tool(slow).build().unwrap(),
        &out,
    )
    .await;
    let turn = spawn_turn(&session, "find flights");
    started.recv().await.unwrap();
    session.user_started_speaking();
    session.user_stopped_speaking();
    session.transcript("cancel that", true);
    let result = tokio::time::timeout(BOUND, turn)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(result.interrupted);
    tokio::time::timeout(BOUND, session.wait_for_inactive())
        .await
        .unwrap();
    let requests = llm.requests();
    assert_eq!(requests.len(), 2);
    let last_user = requests[1].chat.items().iter().rev().find_map(|i| match i {
        ChatItem::Message(m) if m.role == ChatRole::User => Some(m.content.clone()),
        _ => None,
    });
    assert_eq!(last_user.as_deref(), Some("cancel that"));
    let chat = session.chat_context().await.unwrap();
    assert_invariant(&chat);
    assert_eq!(
        output(&chat, "call_1"),
        "Still running; the result will follow."
    );
    session.close().await.unwrap();
}
