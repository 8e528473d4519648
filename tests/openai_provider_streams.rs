//! SPEC §13: the OpenAI-compatible provider against a real HTTP server on 127.0.0.1 that
//! replays recorded streams — text forwarded as it arrives, tool-call fragments joined,
//! parallel calls, usage, and requests the API accepts.
#![cfg(feature = "openai")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/openai_server.rs"]
mod openai_server;

use std::sync::Arc;
use std::time::Duration;

use openai_server::{reply, Answer, FakeOpenAi, Part};
use serde_json::{json, Value};
use switchboard::futures::StreamExt;
use switchboard::providers::openai::{OpenAiLlm, RetryPolicy};
use switchboard::{
    ChatContext, ChatItem, ChatRole, FunctionCall, FunctionCallOutput, Llm, LlmChunk, LlmError,
    LlmRequest, LlmStream, LlmUsage, ToolCallChunk, ToolChoice, ToolSchema,
};
use tokio::sync::watch;

const WAIT: Duration = Duration::from_secs(5);

fn llm(server: &FakeOpenAi) -> OpenAiLlm {
    OpenAiLlm::builder()
        .base_url(server.base_url())
        .api_key("sk-test")
        .model("gpt-4.1-mini")
        .retry(RetryPolicy::none())
        .build()
        .unwrap()
}

fn weather_tool() -> ToolSchema {
    ToolSchema {
        name: "get_weather".into(),
        description: "Current weather".into(),
        parameters: json!({
            "type": "object",
            "properties": {"location": {"type": "string"}, "unit": {"type": "string"}},
            "required": ["location"]
        }),
    }
}

fn ask(text: &str) -> LlmRequest {
    LlmRequest {
        agent: "assistant".into(),
        instructions: "You are brief.".into(),
        extra_instructions: None,
        chat: ChatContext::from(vec![ChatItem::message(ChatRole::User, text)]),
        tools: Arc::from(vec![weather_tool()]),
        tool_choice: ToolChoice::Auto,
        deferred_call_ids: Vec::new(),
    }
}

/// The next chunk, or a failure saying what did not come.
async fn next(stream: &mut LlmStream) -> Option<Result<LlmChunk, LlmError>> {
    tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("no chunk within 5 s")
}

/// Every chunk until the end, and the error that ended the stream, if any.
async fn collect(mut stream: LlmStream) -> (Vec<LlmChunk>, Option<LlmError>) {
    let mut chunks = Vec::new();
    while let Some(item) = next(&mut stream).await {
        match item {
            Ok(chunk) => chunks.push(chunk),
            Err(e) => {
                assert!(next(&mut stream).await.is_none(), "items after an error");
                return (chunks, Some(e));
            }
        }
    }
    (chunks, None)
}

fn text_of(chunks: &[LlmChunk]) -> String {
    chunks
        .iter()
        .filter_map(|c| match c {
            LlmChunk::Text(t) => Some(t.as_str()),
            _ => None,
        })
        .collect()
}

fn calls_of(chunks: &[LlmChunk]) -> Vec<ToolCallChunk> {
    chunks
        .iter()
        .filter_map(|c| match c {
            LlmChunk::ToolCall(call) => Some(call.clone()),
            _ => None,
        })
        .collect()
}

fn weather_call(id: &str, location: &str) -> ToolCallChunk {
    ToolCallChunk {
        call_id: id.into(),
        name: "get_weather".into(),
        arguments: format!(r#"{{"location":"{location}","unit":"celsius"}}"#),
    }
}

#[tokio::test]
async fn plain_text_is_forwarded_event_by_event_before_the_answer_ends() {
    let server = FakeOpenAi::start().await;
    let (gate, held) = watch::channel(false);
    // Parts: role, "Hello", "!", then the rest only once the test opens the gate.
    server.push([Answer::recorded("text").insert(3, Part::Gate(held))]);
    let mut stream = llm(&server).chat(ask("hi"));
    assert_eq!(
        next(&mut stream).await.unwrap().unwrap(),
        LlmChunk::Text("Hello".into())
    );
    assert_eq!(
        next(&mut stream).await.unwrap().unwrap(),
        LlmChunk::Text("!".into())
    );
    // Both came while the server still holds the rest of the answer.
    gate.send_replace(true);
    let (rest, error) = collect(stream).await;
    assert_eq!(error, None);
    assert_eq!(text_of(&rest), " How can I help you today?");
    assert_eq!(
        rest.last(),
        Some(&LlmChunk::Usage(LlmUsage {
            prompt_tokens: 18,
            completion_tokens: 9,
            cached_prompt_tokens: Some(0),
            // The recorded answer's `prompt_tokens_details` and
            // `completion_tokens_details` say no audio.
            audio_prompt_tokens: Some(0),
            audio_completion_tokens: Some(0),
        }))
    );
    server.assert_none_refused();
}

#[tokio::test]
async fn a_tool_call_split_across_many_chunks_is_one_whole_call() {
    let server = FakeOpenAi::start().await;
    // Re-split every 7 bytes: events and their JSON are cut anywhere.
    let answer = Answer::recorded("tool_call_split").split_every(7);
    assert!(answer.len() > 1000);
    server.push([answer]);
    let (chunks, error) = collect(llm(&server).chat(ask("weather in Paris?"))).await;
    assert_eq!(error, None);
    assert_eq!(
        chunks,
        [
            LlmChunk::ToolCall(weather_call(
                "call_Vx3kQm8TzR2bLp9WnY4cHd7A",
                "Paris, France"
            )),
            LlmChunk::Usage(LlmUsage {
                prompt_tokens: 81,
                completion_tokens: 23,
                cached_prompt_tokens: Some(64),
                audio_prompt_tokens: Some(0),
                audio_completion_tokens: Some(0),
            }),
        ]
    );
}

#[tokio::test]
async fn two_parallel_tool_calls_come_whole_in_index_order() {
    let server = FakeOpenAi::start().await;
    server.push([Answer::recorded("parallel_tool_calls")]);
    let (chunks, error) = collect(llm(&server).chat(ask("Paris and Rome?"))).await;
    assert_eq!(error, None);
    assert_eq!(
        calls_of(&chunks),
        [
            weather_call("call_Vx3kQm8TzR2bLp9WnY4cHd7A", "Paris, France"),
            weather_call("call_N5fJ2sLq7XwE1tKc8PzM3bRg", "Rome, Italy"),
        ]
    );
}

#[tokio::test]
async fn fragments_of_parallel_calls_interleaved_by_the_server_are_joined_by_index() {
    let server = FakeOpenAi::start().await;
    let fragment = |index: u32, extra: Value| {
        let mut call = json!({"index": index});
        call.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": null}]})
            .to_string()
    };
    let args = |s: &str| json!({"function": {"arguments": s}});
    server.push([Answer::sse([
        fragment(0, json!({"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": ""}})),
        fragment(1, json!({"id": "call_b", "type": "function", "function": {"name": "get_weather", "arguments": "{\"location\":"}})),
        fragment(0, args("{\"location\":\"Paris, France\",")),
        fragment(1, args("\"Rome, Italy\",\"unit\":\"celsius\"}")),
        fragment(0, args("\"unit\":\"celsius\"}")),
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}).to_string(),
        "[DONE]".into(),
    ])]);
    let (chunks, error) = collect(llm(&server).chat(ask("Paris and Rome?"))).await;
    assert_eq!(error, None);
    assert_eq!(
        calls_of(&chunks),
        [
            weather_call("call_a", "Paris, France"),
            weather_call("call_b", "Rome, Italy")
        ]
    );
}

#[tokio::test]
async fn text_then_a_tool_call_keeps_their_order() {
    let server = FakeOpenAi::start().await;
    server.push([Answer::recorded("text_then_tool_call")]);
    let (chunks, error) = collect(llm(&server).chat(ask("weather?"))).await;
    assert_eq!(error, None);
    let kinds: Vec<&str> = chunks
        .iter()
        .map(|c| match c {
            LlmChunk::Text(_) => "text",
            LlmChunk::ToolCall(_) => "call",
            LlmChunk::Usage(_) => "usage",
            _ => "other",
        })
        .collect();
    assert_eq!(kinds, [vec!["text"; 8], vec!["call", "usage"]].concat());
    assert_eq!(text_of(&chunks), "Let me check the weather in Paris.");
}

#[tokio::test]
async fn the_usage_chunk_is_a_usage_chunk() {
    let server = FakeOpenAi::start().await;
    server.push([reply::text(&["a", "b", "c"])]);
    let (chunks, error) = collect(llm(&server).chat(ask("hi"))).await;
    assert_eq!(error, None);
    let usage: Vec<&LlmChunk> = chunks
        .iter()
        .filter(|c| matches!(c, LlmChunk::Usage(_)))
        .collect();
    assert_eq!(
        usage,
        [&LlmChunk::Usage(LlmUsage {
            prompt_tokens: 20,
            completion_tokens: 3,
            cached_prompt_tokens: Some(0),
            // This answer's details name audio prompt tokens only.
            audio_prompt_tokens: Some(0),
            audio_completion_tokens: None,
        })]
    );
}

fn call(id: &str) -> ChatItem {
    ChatItem::FunctionCall(FunctionCall {
        call_id: id.into(),
        name: "get_weather".into(),
        arguments: r#"{"location":"Paris"}"#.into(),
    })
}

fn output(id: &str, text: &str) -> ChatItem {
    ChatItem::FunctionCallOutput(FunctionCallOutput {
        call_id: id.into(),
        name: "get_weather".into(),
        output: text.into(),
        is_error: text.starts_with("Error"),
    })
}

#[tokio::test]
async fn requests_carry_what_the_api_expects_and_the_server_accepts_them() {
    let server = FakeOpenAi::start().await;
    server.push([reply::text(&["ok"]), reply::text(&["ok"])]);
    let llm = OpenAiLlm::builder()
        .base_url(server.base_url())
        .api_key("sk-test")
        .model("gpt-4.1-mini")
        .temperature(0.2)
        .parallel_tool_calls(false)
        .extra_body("max_completion_tokens", json!(256))
        .build()
        .unwrap();
    let long = "call_AbCdEfGhIjKlMnOpQrStUvWx~2"; // a real id made unique by the engine
    let chat = ChatContext::from(vec![
        ChatItem::message(ChatRole::User, "weather?"),
        ChatItem::message(ChatRole::Assistant, "Checking."),
        call(long),
        call("call_2"),
        output(long, "looking it up"),
        output("call_2", "Error: unknown city"),
        ChatItem::message(ChatRole::Assistant, ""),
        call(&format!("{long}/update_1")),
        output(&format!("{long}/update_1"), "sunny"),
        ChatItem::AgentHandoff {
            from: Some("a".into()),
            to: "b".into(),
        },
        call(&format!("{long}/finished")),
        output(&format!("{long}/finished"), "22 °C"),
    ]);
    let mut first = ask("x");
    first.chat = chat.clone();
    first.extra_instructions = Some("Tell the user about the weather.".into());
    first.tool_choice = ToolChoice::None;
    let mut second = first.clone();
    second
        .chat
        .push(ChatItem::message(ChatRole::User, "thanks"));
    second.tool_choice = ToolChoice::Auto;
    assert_eq!(collect(llm.chat(first)).await.1, None);
    assert_eq!(collect(llm.chat(second)).await.1, None);
    server.assert_none_refused();
    let requests = server.requests();
    let body = &requests[0].body;
    assert_eq!(requests[0].authorization.as_deref(), Some("Bearer sk-test"));
    assert_eq!(body["model"], "gpt-4.1-mini");
    assert_eq!(body["stream_options"], json!({"include_usage": true}));
    assert_eq!(body["temperature"], 0.2);
    assert_eq!(body["parallel_tool_calls"], false);
    assert_eq!(body["max_completion_tokens"], 256);
    assert_eq!(body["tool_choice"], "none");
    assert_eq!(requests[1].body["tool_choice"], "auto");
    assert_eq!(
        body["messages"][0]["content"],
        "You are brief.\n\nTell the user about the weather."
    );
    let roles: Vec<&str> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles,
        [
            "system",
            "user",
            "assistant",
            "tool",
            "tool",
            "assistant",
            "tool",
            "assistant",
            "tool"
        ]
    );
    let ids: Vec<&str> = [3, 4, 6, 8]
        .iter()
        .map(|&i| body["messages"][i]["tool_call_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids[0], "call_AbCdEfGhIjKlMnOpQrStUvWx-t2");
    assert_eq!(ids[1], "call_2");
    // `{long}/update_1` escaped is 41 characters: hashed, with a readable head.
    assert!(ids[2].starts_with("call_AbCdEfGhIjKlMnOpQrS") && ids[2].contains("-h"));
    assert_ne!(ids[2], ids[3]);
    // The tools are the same bytes in both requests.
    let tools = |raw: &[u8]| {
        let text = std::str::from_utf8(raw).unwrap();
        let start = text.find("\"tools\":").unwrap();
        let end = text[start..].find("]").unwrap();
        text[start..start + end].to_owned()
    };
    assert_eq!(tools(&requests[0].raw), tools(&requests[1].raw));
}

#[tokio::test]
async fn the_fake_server_refuses_what_the_real_api_refuses() {
    // The checks the conversation tests rely on, proven to bite.
    use openai_server::check_request;
    let base = |messages: Value| json!({"model": "m", "stream": true, "messages": messages});
    let refused = [
        base(json!([{"role": "assistant", "content": ""}])),
        base(json!([{"role": "assistant", "content": null}])),
        base(json!([{"role": "tool", "tool_call_id": "c1", "content": "x"}])),
        base(json!([
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c/1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c/1", "content": "x"}
        ])),
        base(json!([
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "user", "content": "hi"}
        ])),
        base(json!([
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "x"},
            {"role": "assistant", "content": "ok"},
            {"role": "tool", "tool_call_id": "c1", "content": "again"}
        ])),
        base(json!([{"role": "user", "content": "hi"}]))
            .as_object()
            .map(|o| {
                let mut o = o.clone();
                o.insert("tool_choice".into(), json!("none"));
                Value::Object(o)
            })
            .unwrap(),
    ];
    for body in refused {
        assert!(check_request(&body).is_err(), "accepted: {body}");
    }
    let long_id = "x".repeat(41);
    assert!(check_request(&base(json!([
        {"role": "assistant", "content": null, "tool_calls": [{"id": long_id, "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": long_id, "content": "x"}
    ])))
    .is_err());
}
