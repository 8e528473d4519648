//! The test attribute the crate offers: `#[switchboard::test]` needs no `actix` import,
//! runs the test where `Engine::current()` works, and paused time reaches the session.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use switchboard::prelude::*;
use switchboard::testing::{Reply, ScriptedLlm};

#[switchboard::test]
async fn the_crate_test_attribute_runs_a_session_on_the_current_engine() {
    let llm = ScriptedLlm::new([Reply::text("Hello!")]);
    let session = Session::builder()
        .llm(llm)
        .agent(Agent::builder("agent-a").build().unwrap())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let result = session.run("hi").await.unwrap();
    assert_eq!(result.assistant_messages().collect::<Vec<_>>(), ["Hello!"]);
    session.close().await.unwrap();
}

#[switchboard::test]
async fn paused_time_reaches_the_session_under_the_crate_test_attribute() {
    tokio::time::pause();
    // A model that never answers: the first-chunk timeout (10 s by default) fails the turn
    // at once in virtual time.
    let llm = ScriptedLlm::new([Reply::stall()]);
    let session = Session::builder()
        .llm(llm)
        .agent(Agent::builder("agent-a").build().unwrap())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    let error = session.run("hi").await.unwrap_err();
    assert!(error.llm_error().is_some(), "{error}");
    assert!(started.elapsed() >= Duration::from_secs(10));
    // A spawned turn runs on the same thread: tokio's spawn works, no actix needed.
    let s = session.clone();
    let turn = tokio::spawn(async move { s.current_agent().await });
    assert_eq!(turn.await.unwrap().unwrap(), "agent-a");
    session.close().await.unwrap();
}
