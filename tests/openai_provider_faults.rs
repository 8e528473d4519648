//! SPEC §13 "Faults": the provider against a loopback server that cuts, stalls, refuses
//! and rate-limits — typed errors with the provider's message, retries only before
//! anything was forwarded, timeouts, and the connection closed when the stream is dropped.
#![cfg(feature = "openai")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/openai_server.rs"]
mod openai_server;

use std::sync::Arc;
use std::time::Duration;

use openai_server::{frame, reply, Answer, FakeOpenAi, Part};
use switchboard::futures::StreamExt;
use switchboard::providers::openai::{OpenAiLlm, RetryPolicy};
use switchboard::{
    ChatContext, ChatItem, ChatRole, Llm, LlmChunk, LlmError, LlmRequest, LlmStream, LlmTimeouts,
    TimeoutStage, ToolChoice,
};

const WAIT: Duration = Duration::from_secs(5);

/// Retries with a short backoff, so a test that retries does not wait long.
fn quick_retries(max_retries: u32) -> RetryPolicy {
    RetryPolicy {
        max_retries,
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(1),
        ..RetryPolicy::default()
    }
}

fn llm(server: &FakeOpenAi, retry: RetryPolicy) -> OpenAiLlm {
    OpenAiLlm::builder()
        .base_url(server.base_url())
        .api_key("sk-test")
        .model("gpt-4.1-mini")
        .retry(retry)
        .build()
        .unwrap()
}

fn ask() -> LlmRequest {
    LlmRequest {
        agent: "assistant".into(),
        instructions: "You are brief.".into(),
        extra_instructions: None,
        chat: ChatContext::from(vec![ChatItem::message(ChatRole::User, "hi")]),
        tools: Arc::from(Vec::new()),
        tool_choice: ToolChoice::Auto,
        deferred_call_ids: Vec::new(),
    }
}

async fn next(stream: &mut LlmStream) -> Option<Result<LlmChunk, LlmError>> {
    tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("no chunk within 5 s")
}

async fn collect(mut stream: LlmStream) -> (String, Option<LlmError>) {
    let mut text = String::new();
    while let Some(item) = next(&mut stream).await {
        match item {
            Ok(LlmChunk::Text(t)) => text.push_str(&t),
            Ok(_) => {}
            Err(e) => {
                assert!(next(&mut stream).await.is_none(), "items after an error");
                return (text, Some(e));
            }
        }
    }
    (text, None)
}

#[tokio::test]
async fn a_stream_cut_midway_fails_after_what_was_forwarded_and_is_not_retried() {
    let server = FakeOpenAi::start().await;
    let (gate, held) = tokio::sync::watch::channel(false);
    // role, "Hello", "!", " How", then (once the client has read them) a broken connection:
    // bytes still in the server's buffers when it breaks would never reach the client.
    server.push([Answer::recorded("text")
        .truncate(4)
        .then(Part::Gate(held))
        .then(Part::Cut)]);
    server.push([reply::text(&["never asked for"])]);
    let mut stream = llm(&server, quick_retries(2)).chat(ask());
    let mut text = String::new();
    for _ in 0..3 {
        match next(&mut stream).await {
            Some(Ok(LlmChunk::Text(t))) => text.push_str(&t),
            other => panic!("expected text, got {other:?}"),
        }
    }
    gate.send_replace(true);
    let (rest, error) = collect(stream).await;
    assert_eq!(text + &rest, "Hello! How");
    assert!(
        matches!(&error, Some(LlmError::MalformedStream { message }) if message.contains("broke off")),
        "{error:?}"
    );
    assert_eq!(server.requests().len(), 1, "text was forwarded: no retry");
}

#[tokio::test]
async fn a_stream_that_ends_without_done_or_finish_reason_is_malformed() {
    let server = FakeOpenAi::start().await;
    server.push([Answer::recorded("text").truncate(4)]);
    let (text, error) = collect(llm(&server, RetryPolicy::none()).chat(ask())).await;
    assert_eq!(text, "Hello! How");
    assert!(
        matches!(&error, Some(LlmError::MalformedStream { message }) if message.contains("[DONE]")),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_cut_before_anything_was_forwarded_is_retried() {
    let server = FakeOpenAi::start().await;
    // Only the role chunk (nothing to forward), then the cut.
    server.push([Answer::recorded("text").truncate(1).then(Part::Cut)]);
    server.push([Answer::recorded("text")]);
    let (text, error) = collect(llm(&server, quick_retries(2)).chat(ask())).await;
    assert_eq!(error, None);
    assert_eq!(text, "Hello! How can I help you today?");
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn rate_limited_then_success_waits_what_the_server_asked() {
    let server = FakeOpenAi::start().await;
    let limited = || {
        Answer::error(
            429,
            "requests",
            Some("rate_limit_exceeded"),
            "Rate limit reached for gpt-4.1-mini",
        )
    };
    server.push([
        limited().header("retry-after-ms", "300"),
        limited().header("retry-after", "1"),
        Answer::recorded("text"),
    ]);
    let (text, error) = collect(llm(&server, quick_retries(2)).chat(ask())).await;
    assert_eq!(error, None);
    assert_eq!(text, "Hello! How can I help you today?");
    let requests = server.requests();
    assert_eq!(requests.len(), 3);
    // A lower bound only: the retry came no sooner than the server asked (backoff is 1 ms).
    let gaps = [
        requests[1].at - requests[0].at,
        requests[2].at - requests[1].at,
    ];
    assert!(gaps[0] >= Duration::from_millis(300), "{gaps:?}");
    assert!(gaps[1] >= Duration::from_secs(1), "{gaps:?}");
}

#[tokio::test]
async fn a_retry_after_longer_than_the_policy_allows_fails_at_once_with_the_wait() {
    let server = FakeOpenAi::start().await;
    server.push([
        Answer::error(429, "tokens", Some("rate_limit_exceeded"), "Slow down")
            .header("retry-after", "120"),
    ]);
    let (_, error) = collect(llm(&server, quick_retries(2)).chat(ask())).await;
    assert_eq!(
        error,
        Some(LlmError::RateLimited {
            message: "Slow down".into(),
            retry_after: Some(Duration::from_secs(120)),
        })
    );
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn unauthorized_is_an_auth_error_with_the_providers_message_and_is_not_retried() {
    let server = FakeOpenAi::start().await;
    let message = "Incorrect API key provided: sk-test. You can find your API key at https://platform.openai.com/account/api-keys.";
    server.push([Answer::error(
        401,
        "invalid_request_error",
        Some("invalid_api_key"),
        message,
    )]);
    let (_, error) = collect(llm(&server, quick_retries(2)).chat(ask())).await;
    assert_eq!(
        error,
        Some(LlmError::Auth {
            message: message.into()
        })
    );
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn a_context_that_is_too_long_is_typed() {
    let server = FakeOpenAi::start().await;
    server.push([Answer::error(
        400,
        "invalid_request_error",
        Some("context_length_exceeded"),
        "This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens.",
    )]);
    let (_, error) = collect(llm(&server, quick_retries(2)).chat(ask())).await;
    assert!(
        matches!(&error, Some(LlmError::ContextTooLong { message }) if message.contains("128000")),
        "{error:?}"
    );
}

#[tokio::test]
async fn server_errors_are_retried_a_bounded_number_of_times_then_reported() {
    let server = FakeOpenAi::start().await;
    let failing = || Answer::error(500, "server_error", None, "The server had an error");
    server.push([failing(), failing(), failing(), reply::text(&["too late"])]);
    let (_, error) = collect(llm(&server, quick_retries(2)).chat(ask())).await;
    assert_eq!(
        error,
        Some(LlmError::Server {
            status: 500,
            message: "The server had an error".into()
        })
    );
    assert_eq!(
        server.requests().len(),
        3,
        "the first attempt and 2 retries"
    );
}

#[tokio::test]
async fn a_first_token_that_never_comes_times_out_and_the_request_is_closed() {
    let server = FakeOpenAi::start().await;
    server.push([Answer::sse(Vec::<String>::new()).then(Part::Stall)]);
    let first_chunk = Duration::from_millis(200);
    let llm = OpenAiLlm::builder()
        .base_url(server.base_url())
        .model("gpt-4.1-mini")
        .retry(RetryPolicy::none())
        .timeouts(LlmTimeouts {
            first_chunk,
            between_chunks: Duration::from_secs(30),
        })
        .build()
        .unwrap();
    let (_, error) = collect(llm.chat(ask())).await;
    assert_eq!(
        error,
        Some(LlmError::Timeout {
            stage: TimeoutStage::FirstChunk,
            after: first_chunk
        })
    );
    server.wait_for_aborted(1).await;
}

#[tokio::test]
async fn a_stall_between_chunks_times_out_after_the_text_already_forwarded() {
    let server = FakeOpenAi::start().await;
    server.push([Answer::recorded("text").truncate(3).then(Part::Stall)]);
    let between = Duration::from_millis(500);
    let llm = OpenAiLlm::builder()
        .base_url(server.base_url())
        .model("gpt-4.1-mini")
        .retry(quick_retries(2))
        .timeouts(LlmTimeouts {
            first_chunk: Duration::from_secs(30),
            between_chunks: between,
        })
        .build()
        .unwrap();
    let (text, error) = collect(llm.chat(ask())).await;
    assert_eq!(text, "Hello!");
    assert_eq!(
        error,
        Some(LlmError::Timeout {
            stage: TimeoutStage::BetweenChunks,
            after: between
        })
    );
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn headers_that_never_come_time_out_as_connect() {
    // A server that accepts the connection and never answers.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (accepted, mut accepted_rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let _ = accepted.send(socket).await; // kept open by the receiver
        }
    });
    let connect = Duration::from_millis(200);
    let llm = OpenAiLlm::builder()
        .base_url(format!("http://{addr}/v1"))
        .model("m")
        .connect_timeout(connect)
        .retry(RetryPolicy::none())
        .build()
        .unwrap();
    let (_, error) = collect(llm.chat(ask())).await;
    assert_eq!(
        error,
        Some(LlmError::Timeout {
            stage: TimeoutStage::Connect,
            after: connect
        })
    );
    assert!(accepted_rx.recv().await.is_some());
}

#[tokio::test]
async fn headers_held_back_past_the_first_chunk_bound_time_out_as_first_chunk() {
    // A proxy that sends its headers only once the model answers: the attempt's
    // first-chunk bound covers the headers too, even with a longer connect timeout.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (accepted, mut accepted_rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let _ = accepted.send(socket).await; // kept open by the receiver
        }
    });
    let first_chunk = Duration::from_millis(200);
    let llm = OpenAiLlm::builder()
        .base_url(format!("http://{addr}/v1"))
        .model("m")
        .connect_timeout(Duration::from_secs(30))
        .timeouts(LlmTimeouts {
            first_chunk,
            between_chunks: Duration::from_secs(30),
        })
        .retry(RetryPolicy::none())
        .build()
        .unwrap();
    let (_, error) = collect(llm.chat(ask())).await;
    assert_eq!(
        error,
        Some(LlmError::Timeout {
            stage: TimeoutStage::FirstChunk,
            after: first_chunk
        })
    );
    assert!(accepted_rx.recv().await.is_some());
}

#[tokio::test]
async fn an_unreachable_server_is_a_connect_error_after_the_retries() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    }; // closed again: nothing listens there
    let llm = OpenAiLlm::builder()
        .base_url(format!("http://127.0.0.1:{port}/v1"))
        .model("m")
        .retry(quick_retries(1))
        .build()
        .unwrap();
    let (_, error) = collect(llm.chat(ask())).await;
    assert!(
        matches!(&error, Some(LlmError::Connect { .. })),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_malformed_chunk_is_a_malformed_stream_after_the_text_before_it() {
    let server = FakeOpenAi::start().await;
    let mut events = reply::text_events(&["Hi"]);
    events.truncate(2);
    events.push(r#"{"choices":[{"index":0,"delta":{"content":"#.into());
    events.push("[DONE]".into());
    server.push([Answer::sse(events)]);
    let (text, error) = collect(llm(&server, quick_retries(2)).chat(ask())).await;
    assert_eq!(text, "Hi");
    assert!(
        matches!(&error, Some(LlmError::MalformedStream { message }) if message.contains("unreadable chunk")),
        "{error:?}"
    );
}

#[tokio::test]
async fn dropping_the_stream_closes_the_connection_and_the_server_sees_it() {
    let server = FakeOpenAi::start().await;
    let event =
        frame(r#"{"choices":[{"index":0,"delta":{"content":"la "},"finish_reason":null}]}"#);
    server.push([Answer::sse(Vec::<String>::new()).then(Part::Endless {
        event,
        interval: Duration::from_millis(5),
    })]);
    let mut stream = llm(&server, RetryPolicy::none()).chat(ask());
    for _ in 0..3 {
        assert_eq!(
            next(&mut stream).await.unwrap().unwrap(),
            LlmChunk::Text("la ".into())
        );
    }
    drop(stream); // a barge-in cancels the LLM step
    server.wait_for_aborted(1).await;
    assert_eq!(server.completed(), 0);
}
