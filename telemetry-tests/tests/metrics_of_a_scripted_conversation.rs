//! SPEC §16, telemetry: each metric's value after a scripted conversation, read through
//! the OpenTelemetry SDK's in-memory exporter. The model answers after exact pauses in
//! paused tokio time, so latencies are known to the nanosecond.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use switchboard::prelude::*;
use switchboard::telemetry::Telemetry;
use switchboard::testing::{event, EventWaiter};
use switchboard::{LlmChunk, LlmUsage, NoArgs, ToolCallChunk};
use switchboard_telemetry_tests::{PacedLlm, Pipeline, Point};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn call(name: &str, id: &str) -> LlmChunk {
    LlmChunk::ToolCall(ToolCallChunk {
        call_id: id.into(),
        name: name.into(),
        arguments: "{}".into(),
    })
}

fn text(t: &str) -> LlmChunk {
    LlmChunk::Text(t.into())
}

fn usage(prompt: u32, completion: u32, cached: Option<u32>) -> LlmChunk {
    LlmChunk::Usage(LlmUsage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        cached_prompt_tokens: cached,
        ..Default::default()
    })
}

/// The single point of `name` whose attribute `key` is `value`.
fn point(pipeline: &Pipeline, name: &str, key: &str, value: &str) -> Point {
    let points = pipeline.metric(name);
    let mut found = points.iter().filter(|p| p.attr(key) == Some(value));
    let point = found
        .next()
        .unwrap_or_else(|| panic!("{name}: no point with {key}={value} in {points:?}"))
        .clone();
    assert!(
        found.next().is_none(),
        "{name}: one point with {key}={value}"
    );
    point
}

/// The only point of `name` (a metric without attributes).
fn only(pipeline: &Pipeline, name: &str) -> Point {
    let points = pipeline.metric(name);
    assert_eq!(points.len(), 1, "{name}: {points:?}");
    points[0].clone()
}

/// `actual` seconds are `expected` made of `sleeps` pauses. Paused time is exact but
/// tokio's timer wheel has millisecond ticks and rounds each deadline up to its next tick,
/// so each pause may end up to 1 ms late (never early).
fn assert_secs(actual: f64, expected: Duration, sleeps: u32) {
    let late = actual - expected.as_secs_f64();
    assert!(
        (-1e-9..=f64::from(sleeps) * 1e-3 + 1e-9).contains(&late),
        "{actual} s, expected {expected:?} (+ at most {sleeps} ms)"
    );
}

#[switchboard::test]
async fn a_tool_turn_records_latency_ttft_tool_time_tokens_and_live_sessions() {
    tokio::time::pause();
    let pipeline = Pipeline::install();
    let engine = Engine::current().unwrap();
    engine.set_telemetry(Some(pipeline.telemetry()));
    let lookup = Tool::new("lookup", "Looks up", |_ctx: RunContext, _: NoArgs| async {
        tokio::time::sleep(ms(1500)).await;
        Ok::<_, ToolFailure>("42")
    });
    // Step 1 calls the tool after 200 ms, step 2 speaks after 300 ms.
    let llm = PacedLlm::new([
        (
            ms(200),
            vec![call("lookup", "call_1"), usage(100, 10, Some(40))],
        ),
        (ms(300), vec![text("You have 42."), usage(150, 8, None)]),
    ]);
    let session = Session::builder()
        .llm(llm)
        .agent(Agent::builder("reception").tool(lookup).build().unwrap())
        .start(&engine)
        .await
        .unwrap();
    assert_eq!(
        only(&pipeline, Telemetry::SESSIONS_LIVE).count,
        1.0,
        "one session live"
    );

    session.run("my balance?").await.unwrap();

    // From `run` to the first text: 200 ms + 1.5 s of tool + 300 ms.
    let e2e = point(&pipeline, Telemetry::TURN_E2E_LATENCY, "kind", "user");
    assert_eq!(e2e.attr("agent"), Some("reception"));
    assert_eq!(e2e.count, 1.0);
    assert_secs(e2e.sum, ms(2000), 3);
    // Each request's own wait.
    let ttft = point(&pipeline, Telemetry::LLM_TTFT, "llm", "paced");
    assert_eq!(ttft.count, 2.0);
    assert_secs(ttft.sum, ms(500), 2);
    let tool = point(&pipeline, Telemetry::TOOL_DURATION, "tool", "lookup");
    assert_eq!(tool.count, 1.0);
    assert_secs(tool.sum, ms(1500), 1);
    let prompt = point(
        &pipeline,
        Telemetry::LLM_PROMPT_TOKENS,
        "agent",
        "reception",
    );
    assert_eq!(prompt.count, 250.0);
    let completion = point(
        &pipeline,
        Telemetry::LLM_COMPLETION_TOKENS,
        "agent",
        "reception",
    );
    assert_eq!(completion.count, 18.0);
    let cached = point(
        &pipeline,
        Telemetry::LLM_PROMPT_CACHED_TOKENS,
        "llm",
        "paced",
    );
    assert_eq!(cached.count, 40.0);

    session.close().await.unwrap();
    assert_eq!(
        only(&pipeline, Telemetry::SESSIONS_LIVE).count,
        0.0,
        "none live after close"
    );
}

#[switchboard::test]
async fn interruptions_and_deferred_replies_are_counted() {
    tokio::time::pause();
    let pipeline = Pipeline::install();
    let engine = Engine::current().unwrap();
    engine.set_telemetry(Some(pipeline.telemetry()));
    let book = Tool::new("book", "Books", |ctx: RunContext, _: NoArgs| async move {
        ctx.update("booking").await?;
        tokio::time::sleep(ms(3000)).await;
        Ok::<_, ToolFailure>("booked")
    });
    let llm = PacedLlm::new([
        // Turn 1: the tool answers with its update; the agent speaks; the tool finishes
        // 3 s later and a deferred reply is asked.
        (ms(100), vec![call("book", "call_1")]),
        (ms(100), vec![text("Booking now.")]),
        (ms(100), vec![text("Your table is booked.")]),
        // Turn 2 never answers: the host interrupts it.
    ]);
    let session = Session::builder()
        .llm(llm)
        .agent(Agent::builder("reception").tool(book).build().unwrap())
        .start(&engine)
        .await
        .unwrap();
    session.run("book a table").await.unwrap();
    session.wait_for_settled().await.unwrap();
    let deferred = point(
        &pipeline,
        Telemetry::DEFERRED_REPLIES,
        "decision",
        "requested",
    );
    assert_eq!(deferred.count, 1.0);
    assert_eq!(deferred.attr("agent"), Some("reception"));
    // The deferred reply is a turn too: 100 ms from its start to its text.
    let e2e = point(&pipeline, Telemetry::TURN_E2E_LATENCY, "kind", "deferred");
    assert_secs(e2e.sum, ms(100), 1);

    let mut waiter = EventWaiter::new(&session);
    let turn = {
        let session = session.clone();
        tokio::spawn(async move { session.run("and a taxi").await })
    };
    waiter
        .next(event::agent_state(AgentState::Thinking))
        .await
        .unwrap();
    session.interrupt().await.unwrap();
    assert!(turn.await.unwrap().unwrap().interrupted);
    let interrupted = point(
        &pipeline,
        Telemetry::TURN_INTERRUPTIONS,
        "agent",
        "reception",
    );
    assert_eq!(interrupted.count, 1.0);
    // The interrupted request never had a first token.
    assert_eq!(
        point(&pipeline, Telemetry::LLM_TTFT, "llm", "paced").count,
        3.0
    );
    session.close().await.unwrap();
}

#[switchboard::test]
async fn an_engine_without_telemetry_records_nothing() {
    let pipeline = Pipeline::install();
    let engine = Engine::current().unwrap();
    engine.set_telemetry(None);
    let llm = PacedLlm::new([(ms(0), vec![text("Hi.")])]);
    let session = Session::builder()
        .llm(llm)
        .agent(Agent::builder("reception").build().unwrap())
        .start(&engine)
        .await
        .unwrap();
    session.run("hi").await.unwrap();
    session.close().await.unwrap();
    assert!(pipeline.metric(Telemetry::TURN_E2E_LATENCY).is_empty());
    assert!(pipeline.metric(Telemetry::SESSIONS_LIVE).is_empty());
}
