//! SPEC §16 "Model fallback": a `FallbackLlm` moves to the next model on a failure of the
//! model before anything the user could hear or see was forwarded (text or a tool call;
//! usage and `ServedBy` do not count), a panic of the model included; passes every other
//! failure through, skips a model that failed for a cool-down and asks it first again
//! after it; fallbacks nest; the metrics event names the model that answered.
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

/// A model that panics — in `chat` itself, or while its stream is polled — and counts how
/// often it was asked.
struct Panicking {
    in_chat: bool,
    asked: std::sync::atomic::AtomicUsize,
}

impl Panicking {
    fn new(in_chat: bool) -> Arc<Self> {
        Arc::new(Self {
            in_chat,
            asked: Default::default(),
        })
    }

    fn asked(&self) -> usize {
        self.asked.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl switchboard::Llm for Panicking {
    fn chat(&self, _request: switchboard::LlmRequest) -> switchboard::LlmStream {
        self.asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if self.in_chat {
            panic!("the adapter panicked in chat");
        }
        Box::pin(futures_util::stream::poll_fn(
            |_| -> std::task::Poll<Option<Result<switchboard::LlmChunk, LlmError>>> {
                panic!("the adapter panicked in its stream")
            },
        ))
    }

    fn name(&self) -> &str {
        if self.in_chat {
            "panics-in-chat"
        } else {
            "panics-in-stream"
        }
    }
}

#[switchboard::test]
async fn a_panicking_model_is_marked_failed_and_the_backup_answers() {
    tokio::time::pause();
    for in_chat in [true, false] {
        let primary = Panicking::new(in_chat);
        let backup = ScriptedLlm::named("backup", []);
        backup.otherwise(Reply::text("The backup."));
        let llm = Arc::new(
            FallbackLlm::builder()
                .model(primary.clone())
                .model(backup.clone())
                .build()
                .unwrap(),
        );
        let session = start(llm).await;
        let mut events = session.subscribe();

        let result = session.run("one").await.unwrap();
        assert_eq!(
            result.assistant_messages().collect::<Vec<_>>(),
            ["The backup."]
        );
        assert_eq!(metrics(&mut events).await.llm, "backup");
        // Marked failed: within its cool-down the next turn goes to the backup at once.
        session.run("two").await.unwrap();
        assert_eq!((primary.asked(), backup.request_count()), (1, 2));
        session.close().await.unwrap();
    }
}

#[switchboard::test]
async fn usage_before_a_failure_is_not_an_answer_and_the_backup_answers() {
    // As Anthropic's `message_start` does: usage first, then the failure.
    let primary = ScriptedLlm::named(
        "primary",
        [Reply::default()
            .and_usage(switchboard::LlmUsage {
                prompt_tokens: 12,
                completion_tokens: 0,
                cached_prompt_tokens: None,
                ..Default::default()
            })
            .and_error(overloaded())],
    );
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
    // The failed model's usage is not reported as the answer's.
    assert_eq!(metrics.usage, None);
    session.close().await.unwrap();
}

#[switchboard::test]
async fn a_tool_call_before_a_failure_is_an_answer_and_is_not_asked_again() {
    let primary = ScriptedLlm::named(
        "primary",
        [Reply::tool_call("lookup", serde_json::json!({})).and_error(overloaded())],
    );
    let backup = ScriptedLlm::named("backup", []);
    backup.otherwise(Reply::text("never asked"));
    let session = start(fallback(&[&primary, &backup])).await;

    let error = session.run("hi").await.unwrap_err();

    assert_eq!(error.llm_error(), Some(&overloaded()));
    assert_eq!(backup.request_count(), 0);
    session.close().await.unwrap();
}

/// `fallback(fallback(a, b), c)`.
fn nested(a: &Arc<ScriptedLlm>, b: &Arc<ScriptedLlm>, c: &Arc<ScriptedLlm>) -> Arc<FallbackLlm> {
    let inner = FallbackLlm::builder()
        .model(a.clone())
        .model(b.clone())
        .build()
        .unwrap();
    Arc::new(
        FallbackLlm::builder()
            .model(Arc::new(inner))
            .model(c.clone())
            .build()
            .unwrap(),
    )
}

/// Runs one turn on a session of `llm`: what the agent said, and which model served.
async fn one_turn(llm: Arc<FallbackLlm>) -> (Vec<String>, String) {
    let session = start(llm).await;
    let mut events = session.subscribe();
    let result = session.run("hi").await.unwrap();
    let said = result.assistant_messages().map(str::to_owned).collect();
    let served = metrics(&mut events).await.llm;
    session.close().await.unwrap();
    (said, served)
}

#[switchboard::test]
async fn fallbacks_nest() {
    let a = ScriptedLlm::named("a", [refuses(overloaded())]);
    let b = ScriptedLlm::named("b", [refuses(overloaded())]);
    let c = ScriptedLlm::named("c", [Reply::text("Hello from c.")]);
    let outer = nested(&a, &b, &c);
    assert_eq!(outer.name(), "fallback(fallback(a, b), c)");
    // The inner fallback fails only once both its models did: then the outer moves on.
    assert_eq!(
        one_turn(outer).await,
        (vec!["Hello from c.".to_owned()], "c".to_owned())
    );
    assert_eq!(
        (a.request_count(), b.request_count(), c.request_count()),
        (1, 1, 1)
    );

    // An inner model that answers is named as the one that served.
    let a = ScriptedLlm::named("a", [refuses(overloaded())]);
    let b = ScriptedLlm::named("b", [Reply::text("Hello from b.")]);
    let c = ScriptedLlm::named("c", []);
    assert_eq!(
        one_turn(nested(&a, &b, &c)).await,
        (vec!["Hello from b.".to_owned()], "b".to_owned())
    );
    assert_eq!(c.request_count(), 0);
}
