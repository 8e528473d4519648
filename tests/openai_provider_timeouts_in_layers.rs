//! SPEC §16 "Timeouts in layers": the session's LLM timeouts are the outer bound, the
//! provider's bound on one attempt the inner one, and with every default left alone a
//! provider attempt that stalls before its first chunk is retried, and the retry answers,
//! inside the session's bound.
#![cfg(feature = "openai")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
#[path = "support/openai_server.rs"]
mod openai_server;

use std::sync::Arc;

use common::wait_event;
use openai_server::{reply, Answer, FakeOpenAi, Part};
use switchboard::prelude::*;
use switchboard::providers::openai::{OpenAiLlm, RetryPolicy, DEFAULT_ATTEMPT_TIMEOUTS};
use switchboard::LlmTimeouts;

#[switchboard::test]
async fn a_first_attempt_that_stalls_is_retried_inside_the_sessions_default_bound() {
    // Paused time: the server, the provider and the session share the test's thread, so
    // while the stalled attempt waits nothing is runnable and the clock jumps to the
    // attempt's deadline; the loopback bytes of the retry are in the kernel before the
    // runtime looks for work again, so no deadline passes while they travel.
    tokio::time::pause();
    let server = FakeOpenAi::start().await;
    server.push([
        // Headers, then nothing: the model never starts answering.
        Answer::sse(Vec::<String>::new()).then(Part::Stall),
        reply::text(&["Hello", "!"]),
    ]);
    // Every timeout and the retry policy left at their defaults, on both layers.
    let llm = OpenAiLlm::builder()
        .base_url(server.base_url())
        .api_key("sk-test")
        .model("gpt-4.1-mini")
        .build()
        .unwrap();
    let session = Session::builder()
        .llm(Arc::new(llm))
        .agent(Agent::builder("assistant").build().unwrap())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let mut events = session.subscribe();

    let result = session.run("hi").await.unwrap();

    assert_eq!(result.assistant_messages().collect::<Vec<_>>(), ["Hello!"]);
    assert_eq!(
        server.requests().len(),
        2,
        "the stalled attempt and its retry"
    );
    server.wait_for_aborted(1).await; // the stalled attempt's connection was closed
    let metrics = wait_event(&mut events, |e| match e {
        SessionEvent::LlmMetrics(m) => Some(m.clone()),
        _ => None,
    })
    .await;
    // The answer came after the first attempt's bound and the backoff, and before the
    // session's bound.
    let first_chunk = metrics.time_to_first_chunk.unwrap();
    let retried_at = DEFAULT_ATTEMPT_TIMEOUTS.first_chunk + RetryPolicy::default().initial_backoff;
    assert!(first_chunk >= retried_at, "{first_chunk:?}");
    assert!(
        first_chunk < LlmTimeouts::default().first_chunk,
        "{first_chunk:?}"
    );
    session.close().await.unwrap();
}
