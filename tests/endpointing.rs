//! SPEC §8 "Endpointing": a final transcript waits `endpointing_delay` for more of the
//! user's words; finals within it make one user message and one LLM request, speech
//! resuming inside it holds it, zero keeps a final a turn at once, and the settle waits
//! cover a pending endpoint and every input sent before them. Issue 29: no final is lost
//! while the agent cannot be interrupted. Paused time throughout.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{assert_invariant, spawn_turn, user_messages, wait_on};
use switchboard::prelude::*;
use switchboard::testing::{event, RecordingOutput, Reply, ScriptedLlm};
use tokio::time::advance;

async fn voice_session(llm: Arc<ScriptedLlm>, delay: Option<Duration>) -> Session {
    let mut builder = Session::builder()
        .llm(llm)
        .agent(Agent::builder("receptionist").build().unwrap());
    if let Some(delay) = delay {
        builder = builder.endpointing_delay(delay);
    }
    builder.start(&Engine::current().unwrap()).await.unwrap()
}

#[actix::test]
async fn finals_within_the_delay_make_one_user_message_and_one_request() {
    tokio::time::pause();
    let llm = ScriptedLlm::new([]);
    llm.otherwise(Reply::text("For how many?"));
    let session = voice_session(llm.clone(), None).await;
    session.transcript("I would like", true);
    advance(Duration::from_millis(300)).await;
    session.transcript("a table for tonight", true);
    // Both finals are in before the settle wait looks: it covers the pending endpoint.
    common::settled(&session).await;
    assert_eq!(llm.request_count(), 1);
    let chat = session.chat_context().await.unwrap();
    assert_eq!(user_messages(&chat), ["I would like a table for tonight"]);
    assert_invariant(&chat);
    session.close().await.unwrap();
}

#[actix::test]
async fn the_turn_starts_when_the_delay_has_passed_not_before() {
    tokio::time::pause();
    let llm = ScriptedLlm::new([]);
    llm.otherwise(Reply::text("Hello."));
    let session = voice_session(llm.clone(), Some(Duration::from_secs(1))).await;
    session.transcript("hello", true);
    advance(Duration::from_millis(900)).await;
    tokio::task::yield_now().await;
    assert_eq!(llm.request_count(), 0, "still inside the delay");
    assert!(
        !session.is_inactive(),
        "a pending endpoint is a turn to come"
    );
    advance(Duration::from_millis(200)).await;
    common::settled(&session).await;
    assert_eq!(llm.request_count(), 1);
    session.close().await.unwrap();
}

#[actix::test]
async fn speech_resuming_inside_the_delay_holds_it_until_the_user_stops() {
    tokio::time::pause();
    let llm = ScriptedLlm::new([]);
    llm.otherwise(Reply::text("Sure."));
    let session = voice_session(llm.clone(), None).await;
    session.user_started_speaking();
    session.transcript("I need", true);
    session.user_stopped_speaking();
    advance(Duration::from_millis(400)).await;
    // The user goes on: the endpoint waits as long as they speak.
    session.user_started_speaking();
    advance(Duration::from_secs(5)).await;
    session.transcript("a taxi", true);
    tokio::task::yield_now().await;
    assert_eq!(llm.request_count(), 0);
    session.user_stopped_speaking();
    common::settled(&session).await;
    assert_eq!(llm.request_count(), 1);
    let chat = session.chat_context().await.unwrap();
    assert_eq!(user_messages(&chat), ["I need a taxi"]);
    session.close().await.unwrap();
}

#[actix::test]
async fn a_zero_delay_keeps_each_final_a_turn_of_its_own() {
    tokio::time::pause();
    let llm = ScriptedLlm::new([]);
    llm.otherwise(Reply::text("Noted."));
    let session = voice_session(llm.clone(), Some(Duration::ZERO)).await;
    session.transcript("first", true);
    common::settled(&session).await;
    session.transcript("second", true);
    common::settled(&session).await;
    assert_eq!(llm.request_count(), 2);
    let chat = session.chat_context().await.unwrap();
    assert_eq!(user_messages(&chat), ["first", "second"]);
    session.close().await.unwrap();
}

#[actix::test]
async fn a_barge_in_with_words_still_interrupts_at_once() {
    tokio::time::pause();
    let out = RecordingOutput::manual_playout().pausable();
    let llm = ScriptedLlm::new([Reply::text("Today we have soup, fish and chips.")]);
    llm.otherwise(Reply::text("The fish."));
    let session = Session::builder()
        .llm(llm.clone())
        .agent(Agent::builder("waiter").build().unwrap())
        .output(out.clone())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let mut events = session.subscribe();
    let turn = spawn_turn(&session, "what is on the menu?");
    let speech = wait_on(&mut events, event::speech_created()).await;
    session.user_started_speaking();
    session.transcript("the fish", true);
    // Words make the interruption real now; the user's turn waits for the endpoint.
    wait_on(&mut events, event::turn_interrupted()).await;
    out.heard(speech.id(), "Today we have");
    assert!(turn.await.unwrap().unwrap().interrupted);
    session.user_stopped_speaking();
    let answer = wait_on(&mut events, event::speech_created()).await;
    out.played_out(answer.id());
    common::settled(&session).await;
    let chat = session.chat_context().await.unwrap();
    assert_eq!(user_messages(&chat), ["what is on the menu?", "the fish"]);
    assert_eq!(llm.request_count(), 2);
    assert_invariant(&chat);
    session.close().await.unwrap();
}

#[actix::test]
async fn finals_while_the_agent_cannot_be_interrupted_are_all_kept() {
    tokio::time::pause();
    let out = RecordingOutput::manual_playout();
    let llm = ScriptedLlm::new([Reply::text("Please listen to the whole notice.")]);
    llm.otherwise(Reply::text("Understood."));
    let session = Session::builder()
        .llm(llm.clone())
        .agent(
            Agent::builder("notice")
                .allow_interruptions(false)
                .build()
                .unwrap(),
        )
        .output(out.clone())
        .endpointing_delay(Duration::ZERO)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let mut events = session.subscribe();
    let _turn = spawn_turn(&session, "go on");
    let speech = wait_on(&mut events, event::speech_created()).await;
    for i in 0..200 {
        session.transcript(format!("w{i}"), true);
    }
    out.played_out(speech.id());
    // The words that waited make one turn; its answer plays out too.
    let answer = wait_on(&mut events, event::speech_created()).await;
    out.played_out(answer.id());
    common::settled(&session).await;
    let chat = session.chat_context().await.unwrap();
    let users = user_messages(&chat);
    let words: Vec<String> = users[1..]
        .iter()
        .flat_map(|m| m.split(' ').map(str::to_owned))
        .collect();
    let expected: Vec<String> = (0..200).map(|i| format!("w{i}")).collect();
    assert_eq!(words, expected, "every final is kept, in order");
    assert!(users.len() <= 3, "they joined one waiting turn: {users:?}");
    session.close().await.unwrap();
}

/// Start/stop-speaking pairs through the whole session (host → session → activity),
/// settled: how long `pairs` of them take.
async fn storm(pairs: u32) -> Duration {
    let llm = ScriptedLlm::new([]);
    llm.otherwise(Reply::text("Hello."));
    let session = voice_session(llm, None).await;
    let started = std::time::Instant::now();
    for _ in 0..pairs {
        session.user_started_speaking();
        session.user_stopped_speaking();
    }
    session.wait_for_inactive().await;
    let took = started.elapsed();
    session.close().await.unwrap();
    took
}

#[actix::test]
async fn speaking_storms_cost_time_linear_in_their_length() {
    // The best of two runs of each size, so a busy machine does not decide.
    let small = storm(10_000).await.min(storm(10_000).await);
    let large = storm(40_000).await.min(storm(40_000).await);
    let ratio = large.as_secs_f64() / small.as_secs_f64();
    // Linear is 4; a timer spawned and cancelled per pair made it 14 and growing.
    assert!(
        ratio < 8.0,
        "4x the pairs took {ratio:.1}x the time ({small:?} → {large:?})"
    );
}
