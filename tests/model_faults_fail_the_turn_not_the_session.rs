//! SPEC §2a: a fault of the model — a stream that never yields, one that stalls midway,
//! one that errors after some text, an adapter that panics — fails that turn with a clear
//! error and an error event, in bounded (virtual) time. The speech that was streaming is
//! finished on the output, what was said stays in the chat context, and the session's
//! next turn works.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use common::{wait_event, Query};
use futures_util::{stream, StreamExt};
use switchboard::prelude::*;
use switchboard::testing::{RecordingOutput, Reply, ScriptedLlm};
use switchboard::{
    ChatMessage, LlmChunk, LlmError, LlmRequest, LlmStream, LlmTimeouts, LlmUsage, TimeoutStage,
};
use tokio::time::Instant;

const TIMEOUTS: LlmTimeouts = LlmTimeouts {
    first_chunk: Duration::from_secs(5),
    between_chunks: Duration::from_secs(2),
};

fn assistant_messages(chat: &switchboard::ChatContext) -> Vec<ChatMessage> {
    chat.items()
        .iter()
        .filter_map(|item| match item {
            ChatItem::Message(m) if m.role == ChatRole::Assistant => Some(m.clone()),
            _ => None,
        })
        .collect()
}

#[actix::test]
async fn a_stream_that_never_yields_fails_the_turn_at_the_first_chunk_timeout() {
    tokio::time::pause();
    let llm = ScriptedLlm::new([Reply::stall(), Reply::text("Back again.")]);
    let session = Session::builder()
        .llm(llm)
        .agent(Agent::builder("agent").build().unwrap())
        .llm_timeouts(TIMEOUTS)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let mut events = session.subscribe();
    let started = Instant::now();
    match session.run("hello").await {
        Err(SessionError::TurnFailed {
            failure: TurnFailure::Llm(LlmError::Timeout { stage, after }),
            ..
        }) => {
            assert_eq!(stage, TimeoutStage::FirstChunk);
            assert_eq!(after, TIMEOUTS.first_chunk);
        }
        other => panic!("expected a first-chunk timeout, got {other:?}"),
    }
    // Virtual time: the timer wheel rounds up to the next millisecond.
    let waited = started.elapsed();
    assert!(
        waited >= TIMEOUTS.first_chunk && waited < TIMEOUTS.first_chunk + Duration::from_millis(5),
        "{waited:?}"
    );
    let message = wait_event(&mut events, |e| match e {
        SessionEvent::Error { message } => Some(message.clone()),
        _ => None,
    })
    .await;
    assert!(message.contains("timed out"), "{message}");
    let result = session.run("still there?").await.unwrap();
    assert_eq!(
        result.assistant_messages().collect::<Vec<_>>(),
        ["Back again."]
    );
    session.close().await.unwrap();
}

#[actix::test]
async fn a_stream_that_stalls_midway_times_out_and_keeps_what_was_said() {
    tokio::time::pause();
    let io = RecordingOutput::new();
    let llm = ScriptedLlm::new([Reply::text("Let me check").and_stall()]);
    let session = Session::builder()
        .llm(llm)
        .agent(
            Agent::builder("agent")
                .llm_timeouts(TIMEOUTS)
                .build()
                .unwrap(),
        )
        .output(io.clone())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    match session.run("hello").await {
        Err(SessionError::TurnFailed {
            failure: TurnFailure::Llm(LlmError::Timeout { stage, .. }),
            result,
        }) => {
            assert_eq!(stage, TimeoutStage::BetweenChunks);
            // What was said before the stall is in the failed turn's result, cut.
            assert_eq!(
                result.assistant_messages().collect::<Vec<_>>(),
                ["Let me check"]
            );
        }
        other => panic!("expected a between-chunks timeout, got {other:?}"),
    }
    let speech = io.last_speech().unwrap();
    assert_eq!(speech.text, "Let me check");
    assert!(speech.finished, "the speech was finished on the output");
    let said = assistant_messages(&session.chat_context().await.unwrap());
    assert_eq!(said.len(), 1);
    assert_eq!(said[0].content, "Let me check");
    assert!(said[0].interrupted);
    session.close().await.unwrap();
}

#[actix::test]
async fn a_stream_that_errors_after_some_text_finishes_the_speech_and_keeps_the_text() {
    let io = RecordingOutput::new();
    let llm = ScriptedLlm::new([
        Reply::text("Your balance is").and_error(LlmError::Server {
            status: 502,
            message: "bad gateway".into(),
        }),
        Reply::text("Sorry, let me try again."),
    ]);
    let session = Session::builder()
        .llm(llm)
        .agent(Agent::builder("agent").build().unwrap())
        .output(io.clone())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    assert!(matches!(
        session.run("my balance?").await,
        Err(SessionError::TurnFailed {
            failure: TurnFailure::Llm(LlmError::Server { status: 502, .. }),
            ..
        })
    ));
    let speech = io.last_speech().unwrap();
    assert_eq!(
        (speech.text.as_str(), speech.finished),
        ("Your balance is", true)
    );
    let said = assistant_messages(&session.chat_context().await.unwrap());
    assert_eq!(said[0].content, "Your balance is");
    session.run("well?").await.unwrap();
    let said = assistant_messages(&session.chat_context().await.unwrap());
    assert_eq!(said[1].content, "Sorry, let me try again.");
    session.close().await.unwrap();
}

/// A model adapter with a bug: it panics in `chat` on odd requests and mid-stream on even
/// ones, except every third request, which answers.
struct Buggy {
    requests: AtomicUsize,
}

impl Llm for Buggy {
    fn chat(&self, _request: LlmRequest) -> LlmStream {
        let n = self.requests.fetch_add(1, Ordering::Relaxed);
        match n % 3 {
            0 => panic!("bug in chat()"),
            1 => stream::once(async { Ok(LlmChunk::Text("Hel".into())) })
                .chain(stream::poll_fn(
                    |_| -> Poll<Option<Result<LlmChunk, LlmError>>> { panic!("bug mid-stream") },
                ))
                .boxed(),
            _ => stream::iter([Ok(LlmChunk::Text("Fine now.".into()))]).boxed(),
        }
    }
}

#[actix::test]
async fn a_panicking_adapter_fails_its_turns_and_the_session_and_its_close_still_work() {
    let job = Tool::new("job", "A job", |_ctx: RunContext, _: Query| async move {
        Ok::<_, ToolFailure>("ok")
    });
    let session = Session::builder()
        .llm(Arc::new(Buggy {
            requests: AtomicUsize::new(0),
        }))
        .agent(Agent::builder("agent").tool(job).build().unwrap())
        .inspect(true)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    match session.run("one").await {
        Err(SessionError::TurnFailed {
            failure: TurnFailure::Llm(LlmError::Panicked { message }),
            ..
        }) => {
            assert_eq!(message, "bug in chat()")
        }
        other => panic!("expected the adapter's panic, got {other:?}"),
    }
    match session.run("two").await {
        Err(SessionError::TurnFailed {
            failure: TurnFailure::Llm(LlmError::Panicked { message }),
            ..
        }) => {
            assert_eq!(message, "bug mid-stream")
        }
        other => panic!("expected the adapter's panic, got {other:?}"),
    }
    let result = session.run("three").await.unwrap();
    assert_eq!(
        result.assistant_messages().collect::<Vec<_>>(),
        ["Fine now."]
    );
    let inspector = session.inspector().unwrap();
    session.close().await.unwrap();
    assert!(
        inspector.live_actors().is_empty(),
        "{:?}",
        inspector.live_actors()
    );
}

#[actix::test]
async fn each_request_reports_its_metrics() {
    let usage = LlmUsage {
        prompt_tokens: 120,
        completion_tokens: 8,
        cached_prompt_tokens: Some(100),
        ..Default::default()
    };
    let llm = ScriptedLlm::new([Reply::text("Hi").and_text(" there.").and_usage(usage)]);
    let session = Session::builder()
        .llm(llm)
        .agent(Agent::builder("agent").build().unwrap())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let mut events = session.subscribe();
    session.run("hello").await.unwrap();
    let metrics = wait_event(&mut events, |e| match e {
        SessionEvent::LlmMetrics(m) => Some(m.clone()),
        _ => None,
    })
    .await;
    assert_eq!(metrics.agent, "agent");
    assert_eq!(metrics.text_chunks, 2);
    assert_eq!(metrics.usage, Some(usage));
    assert!(metrics.time_to_first_chunk.is_some());
    assert!(!metrics.cancelled);
    session.close().await.unwrap();
}
