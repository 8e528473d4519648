//! The base URL mistakes people make, each read as what to fix: no `http://`, a wrong
//! path (the error shows the URL that was requested), and the whole endpoint given as the
//! base URL (taken as meant: the suffix is not added twice).
#![cfg(feature = "openai")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/openai_server.rs"]
mod openai_server;

use std::sync::Arc;

use openai_server::{reply, FakeOpenAi};
use switchboard::futures::StreamExt;
use switchboard::providers::openai::{OpenAiConfigError, OpenAiLlm, RetryPolicy};
use switchboard::{
    ChatContext, ChatItem, ChatRole, Llm, LlmChunk, LlmError, LlmRequest, ToolChoice,
};

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

/// The text of the answer, or its error.
async fn answer(llm: &OpenAiLlm) -> Result<String, LlmError> {
    let mut stream = llm.chat(ask());
    let mut text = String::new();
    let read = async {
        while let Some(chunk) = stream.next().await {
            if let LlmChunk::Text(t) = chunk? {
                text.push_str(&t);
            }
        }
        Ok(())
    };
    tokio::time::timeout(std::time::Duration::from_secs(5), read)
        .await
        .expect("no answer within 5 s")?;
    Ok(text)
}

#[test]
fn a_base_url_without_a_scheme_says_to_write_http_in_front() {
    for url in ["127.0.0.1:28732/v1", "localhost:11434/v1"] {
        let error = OpenAiLlm::builder()
            .base_url(url)
            .model("m")
            .build()
            .unwrap_err();
        assert_eq!(error, OpenAiConfigError::MissingScheme { url: url.into() });
        assert!(
            error.to_string().contains(&format!("\"http://{url}\"")),
            "{error}"
        );
    }
}

#[tokio::test]
async fn a_wrong_path_fails_showing_the_url_that_was_requested() {
    let server = FakeOpenAi::start().await; // it answers /v1/chat/completions only
    let base = server.base_url().replace("/v1", "/v2");
    let llm = OpenAiLlm::builder()
        .base_url(&base)
        .model("gpt-4.1-mini")
        .retry(RetryPolicy::none())
        .build()
        .unwrap();
    let error = answer(&llm).await.unwrap_err();
    let LlmError::BadRequest {
        status: 404,
        message,
    } = &error
    else {
        panic!("expected a 404, got {error:?}")
    };
    assert!(
        message.contains(&format!("{base}/chat/completions")),
        "{message}"
    );
    assert!(message.contains("check the base URL"), "{message}");
    assert!(server.requests().is_empty());
}

#[tokio::test]
async fn a_base_url_ending_in_chat_completions_is_taken_as_the_endpoint_itself() {
    let server = FakeOpenAi::start().await;
    let endpoint = format!("{}/chat/completions", server.base_url());
    for base in [endpoint.clone(), format!("{endpoint}/")] {
        server.push([reply::text(&["Hello", "!"])]);
        let llm = OpenAiLlm::builder()
            .base_url(&base)
            .model("gpt-4.1-mini")
            .retry(RetryPolicy::none())
            .build()
            .unwrap();
        assert_eq!(llm.endpoint(), endpoint);
        assert_eq!(answer(&llm).await.unwrap(), "Hello!");
    }
    assert_eq!(server.requests().len(), 2);
}
