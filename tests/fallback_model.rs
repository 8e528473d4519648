//! SPEC §16 "Model fallback": a `FallbackLlm` moves to the next model on a failure of the
//! model before anything was forwarded, passes every other failure through, skips a model
//! that failed for a cool-down and asks it first again after it; the metrics event names
//! the model that answered.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::wait_event;
use switchboard::prelude::*;
use switchboard::providers::{FallbackError, FallbackLlm};
use switchboard::testing::{Reply, ScriptedLlm};
use switchboard::{LlmError, LlmMetrics, TimeoutStage};

fn overloaded() -> LlmError {
    LlmError::Server {
        status: 503,
        message: "The engine is currently overloaded, please try again later".into(),
    }
}

fn refuses(error: LlmError) -> Reply {
    Reply::default().and_error(error)
}

fn fallback(models: &[&Arc<ScriptedLlm>]) -> Arc<FallbackLlm> {
    let mut builder = FallbackLlm::builder().cool_down(Duration::from_secs(30));
    for model in models {
        builder = builder.model((*model).clone());
    }
    Arc::new(builder.build().unwrap())
}

async fn start(llm: Arc<FallbackLlm>) -> Session {
    Session::builder()
        .llm(llm)
        .agent(Agent::builder("assistant").build().unwrap())
        .start(&Engine::current().unwrap())
        .await
        .unwrap()
}

async fn metrics(events: &mut tokio::sync::broadcast::Receiver<SessionEvent>) -> LlmMetrics {
    wait_event(events, |e| match e {
        SessionEvent::LlmMetrics(m) => Some(m.clone()),
        _ => None,
    })
    .await
}

#[switchboard::test]
async fn a_model_that_refuses_before_answering_hands_the_request_to_the_next() {
    let primary = ScriptedLlm::named("primary", [refuses(overloaded())]);
    let backup = ScriptedLlm::named("backup", [Reply::text("Hello from the backup.")]);
    let session = start(fallback(&[&primary, &backup])).await;
    let mut events = session.subscribe();

    let result = session.run("hi").await.unwrap();

    assert_eq!(
        result.assistant_messages().collect::<Vec<_>>(),
        ["Hello from the backup."]
    );
    let metrics = metrics(&mut events).await;
    assert_eq!(metrics.llm, "backup");
    assert!(!metrics.cancelled);
    assert_eq!(metrics.text_chunks, 1);
    // The backup was asked the very request the primary was.
    assert_eq!(primary.requests()[0].chat, backup.requests()[0].chat);
    session.close().await.unwrap();
}

#[switchboard::test]
async fn a_model_that_breaks_off_after_forwarding_text_fails_the_turn_without_fallback() {
    let broke_off = LlmError::MalformedStream {
        message: "the stream broke off: connection reset".into(),
    };
    let primary = ScriptedLlm::named(
        "primary",
        [Reply::text("Our specials today").and_error(broke_off.clone())],
    );
    let backup = ScriptedLlm::named("backup", [Reply::text("never asked")]);
    let session = start(fallback(&[&primary, &backup])).await;
    let mut events = session.subscribe();

    let error = session.run("what are the specials?").await.unwrap_err();

    assert_eq!(error.llm_error(), Some(&broke_off));
    assert_eq!(
        backup.request_count(),
        0,
        "text was forwarded: no other model"
    );
    assert_eq!(metrics(&mut events).await.llm, "primary");
    session.close().await.unwrap();
}

#[switchboard::test]
async fn a_model_that_stalls_after_forwarding_text_fails_the_turn_without_fallback() {
    tokio::time::pause(); // the session's between-chunk timeout passes in virtual time
    let primary = ScriptedLlm::named("primary", [Reply::text("Our specials").and_stall()]);
    let backup = ScriptedLlm::named("backup", [Reply::text("never asked")]);
    let session = start(fallback(&[&primary, &backup])).await;

    let error = session.run("what are the specials?").await.unwrap_err();

    assert!(
        matches!(
            error.llm_error(),
            Some(LlmError::Timeout {
                stage: TimeoutStage::BetweenChunks,
                ..
            })
        ),
        "{error}"
    );
    assert_eq!(backup.request_count(), 0);
    session.close().await.unwrap();
}

#[switchboard::test]
async fn a_failed_model_is_skipped_for_its_cool_down_then_asked_first_again() {
    tokio::time::pause();
    let primary = ScriptedLlm::named(
        "primary",
        [refuses(overloaded()), Reply::text("The primary again.")],
    );
    let backup = ScriptedLlm::named("backup", []);
    backup.otherwise(Reply::text("The backup."));
    let session = start(fallback(&[&primary, &backup])).await;
    let mut events = session.subscribe();

    session.run("one").await.unwrap();
    assert_eq!(metrics(&mut events).await.llm, "backup");

    // Within the cool-down the primary is not asked at all.
    tokio::time::advance(Duration::from_secs(29)).await;
    session.run("two").await.unwrap();
    assert_eq!(metrics(&mut events).await.llm, "backup");
    assert_eq!(primary.request_count(), 1);

    // After it, the primary is asked first again, and answers.
    tokio::time::advance(Duration::from_secs(1)).await;
    let result = session.run("three").await.unwrap();
    assert_eq!(
        result.assistant_messages().collect::<Vec<_>>(),
        ["The primary again."]
    );
    assert_eq!(metrics(&mut events).await.llm, "primary");
    assert_eq!((primary.request_count(), backup.request_count()), (2, 2));
    session.close().await.unwrap();
}

#[switchboard::test]
async fn a_refused_key_is_not_retried_on_the_next_model() {
    let refused = LlmError::Auth {
        message: "Incorrect API key provided: sk-old.".into(),
    };
    let primary = ScriptedLlm::named("primary", []);
    primary.otherwise(refuses(refused.clone()));
    let backup = ScriptedLlm::named("backup", []);
    backup.otherwise(Reply::text("never asked"));
    let session = start(fallback(&[&primary, &backup])).await;
    let mut events = session.subscribe();

    let error = session.run("hi").await.unwrap_err();
    assert_eq!(error.llm_error(), Some(&refused));
    assert_eq!(metrics(&mut events).await.llm, "primary");

    // No cool-down either: the mistake shows on every turn until it is fixed.
    let error = session.run("hello?").await.unwrap_err();
    assert_eq!(error.llm_error(), Some(&refused));
    assert_eq!((primary.request_count(), backup.request_count()), (2, 0));
    session.close().await.unwrap();
}

#[switchboard::test]
async fn when_every_model_fails_the_turn_fails_with_the_last_ones_error_and_all_are_asked_again() {
    tokio::time::pause();
    let limited = LlmError::RateLimited {
        message: "Rate limit reached".into(),
        retry_after: Some(Duration::from_secs(20)),
    };
    let primary = ScriptedLlm::named("primary", []);
    primary.otherwise(refuses(overloaded()));
    let backup = ScriptedLlm::named("backup", []);
    backup.otherwise(refuses(limited.clone()));
    let session = start(fallback(&[&primary, &backup])).await;
    let mut events = session.subscribe();

    let error = session.run("hi").await.unwrap_err();
    assert_eq!(error.llm_error(), Some(&limited));
    assert_eq!(metrics(&mut events).await.llm, "backup");

    // Both cool down; a cool-down is a preference, not a ban: both are asked again, in
    // order, rather than the turn failing without a request.
    let error = session.run("hello?").await.unwrap_err();
    assert_eq!(error.llm_error(), Some(&limited));
    assert_eq!((primary.request_count(), backup.request_count()), (2, 2));
    session.close().await.unwrap();
}

#[test]
fn a_fallback_needs_a_model_and_is_named_after_its_models() {
    assert_eq!(
        FallbackLlm::builder().build().unwrap_err(),
        FallbackError::NoModels
    );
    let llm = FallbackLlm::builder()
        .model(ScriptedLlm::named("primary", []))
        .model(ScriptedLlm::named("backup", []))
        .build()
        .unwrap();
    assert_eq!(llm.name(), "fallback(primary, backup)");
    assert_eq!(llm.cool_down(), FallbackLlm::DEFAULT_COOL_DOWN);
}
