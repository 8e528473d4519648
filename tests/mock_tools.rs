//! SPEC §10, §12 mocks: a tool's body replaced for one session, keeping its schema and
//! policies; the mock may update, return or fail like the real body.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::{assert_invariant, output, Query};
use serde_json::{json, Value};
use switchboard::prelude::*;
use switchboard::testing::{Reply, ScriptedLlm};
use switchboard::NoArgs;

fn real_weather(real_runs: Arc<AtomicUsize>) -> Tool {
    Tool::new(
        "get_weather",
        "Weather in a city",
        move |_ctx: RunContext, args: Query| {
            let real_runs = real_runs.clone();
            async move {
                real_runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, ToolFailure>(format!("real weather in {}", args.q))
            }
        },
    )
}

fn weather_script() -> Arc<ScriptedLlm> {
    let llm = ScriptedLlm::new([Reply::tool_call("get_weather", json!({"q": "Paris"}))]);
    llm.otherwise(Reply::text("OK."));
    llm
}

#[actix::test]
async fn two_sessions_mock_the_same_tool_differently() {
    let real_runs = Arc::new(AtomicUsize::new(0));
    let engine = Engine::current().unwrap();
    let mut outputs = Vec::new();
    for forecast in ["sunny", "rainy"] {
        let llm = weather_script();
        let session = Session::builder()
            .llm(llm.clone())
            .agent(
                Agent::builder("agent-a")
                    .tool(real_weather(real_runs.clone()))
                    .build()
                    .unwrap(),
            )
            .mock_tool(
                "get_weather",
                move |_ctx: RunContext, args: Value| async move {
                    Ok::<_, ToolFailure>(format!("{forecast} in {}", args["q"].as_str().unwrap()))
                },
            )
            .start(&engine)
            .await
            .unwrap();
        let result = session.run("weather?").await.unwrap();
        outputs.push(result.function_outputs().next().unwrap().output.clone());
        // The schema the model saw is the real tool's.
        let schema = &llm.requests()[0].tools[0];
        assert_eq!(schema.name, "get_weather");
        assert_eq!(schema.parameters["required"], json!(["q"]));
        session.close().await.unwrap();
    }
    assert_eq!(outputs, ["sunny in Paris", "rainy in Paris"]);
    assert_eq!(
        real_runs.load(Ordering::SeqCst),
        0,
        "the real body never ran"
    );
}

#[actix::test]
async fn a_mock_with_no_arguments() {
    let ping = Tool::new("ping", "Pings", |_ctx: RunContext, _: NoArgs| async move {
        Ok::<_, ToolFailure>("real pong")
    });
    let llm = ScriptedLlm::new([Reply::tool_call("ping", json!({}))]);
    llm.otherwise(Reply::text("OK."));
    let session = Session::builder()
        .llm(llm)
        .agent(Agent::builder("agent-a").tool(ping).build().unwrap())
        .mock_tool("ping", |_ctx: RunContext, _args: Value| async move {
            Ok::<_, ToolFailure>("mock pong")
        })
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let result = session.run("ping").await.unwrap();
    assert_eq!(
        result.function_outputs().next().unwrap().output,
        "mock pong"
    );
    session.close().await.unwrap();
}

#[actix::test]
async fn a_mock_that_updates_runs_in_the_background_like_the_real_body() {
    let llm = weather_script();
    let session = Session::builder()
        .llm(llm)
        .agent(Agent::builder("agent-a").build().unwrap())
        .toolset(Toolset::new("weather").tool(real_weather(Arc::default())))
        .mock_tool("get_weather", |ctx: RunContext, _args: Value| async move {
            ctx.update("checking").await?;
            Ok::<_, ToolFailure>("mocked: cloudy")
        })
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let result = session.run("weather?").await.unwrap();
    assert_eq!(
        result.function_outputs().next().unwrap().output,
        "Update from get_weather: checking"
    );
    common::settled(&session).await;
    let chat = session.chat_context().await.unwrap();
    assert_eq!(output(&chat, "call_1/finished"), "mocked: cloudy");
    assert_invariant(&chat);
    session.close().await.unwrap();
}

#[actix::test]
async fn a_mock_that_fails_before_updating_gives_an_error_output() {
    let llm = weather_script();
    let session = Session::builder()
        .llm(llm)
        .agent(
            Agent::builder("agent-a")
                .tool(real_weather(Arc::default()))
                .build()
                .unwrap(),
        )
        .mock_tool("get_weather", |_ctx: RunContext, _args: Value| async move {
            Err::<(), _>(ToolError::new("weather service down").into())
        })
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let result = session.run("weather?").await.unwrap();
    let out = result.function_outputs().next().unwrap();
    assert!(out.is_error);
    assert_eq!(out.output, "Error: weather service down");
    session.close().await.unwrap();
}

#[actix::test]
async fn a_mocked_call_with_bad_arguments_fails_like_the_real_one() {
    let mock_runs = Arc::new(AtomicUsize::new(0));
    let m = mock_runs.clone();
    let llm = ScriptedLlm::new([Reply::tool_call("get_weather", json!({"city": "Paris"}))]);
    llm.otherwise(Reply::text("OK."));
    let session = Session::builder()
        .llm(llm)
        .agent(
            Agent::builder("agent-a")
                .tool(real_weather(Arc::default()))
                .build()
                .unwrap(),
        )
        .mock_tool("get_weather", move |_ctx: RunContext, _args: Value| {
            m.fetch_add(1, Ordering::SeqCst);
            async move { Ok::<_, ToolFailure>("never") }
        })
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let result = session.run("weather?").await.unwrap();
    let out = result.function_outputs().next().unwrap();
    assert!(out
        .output
        .starts_with("Error parsing arguments for get_weather"));
    assert_eq!(mock_runs.load(Ordering::SeqCst), 0);
    session.close().await.unwrap();
}

#[actix::test]
async fn end_to_end_a_mock_that_returns_directly() {
    let llm = ScriptedLlm::new([
        Reply::tool_call("get_weather", json!({"q": "Oslo"})),
        Reply::text("It is snowing in Oslo."),
    ]);
    let session = Session::builder()
        .llm(llm.clone())
        .agent(
            Agent::builder("agent-a")
                .tool(real_weather(Arc::default()))
                .build()
                .unwrap(),
        )
        .mock_tool("get_weather", |_ctx: RunContext, _args: Value| async move {
            Ok::<_, ToolFailure>("snow")
        })
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let result = session.run("weather in Oslo?").await.unwrap();
    assert_eq!(
        result.assistant_messages().collect::<Vec<_>>(),
        ["It is snowing in Oslo."]
    );
    common::settled(&session).await;
    assert_eq!(llm.request_count(), 2);
    session.close().await.unwrap();
}
