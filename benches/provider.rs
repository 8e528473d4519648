//! The OpenAI provider's own cost, per request and per streamed chunk, against a loopback
//! server, beside LiveKit Agents' OpenAI plugin against the same server in the same sitting.
//!
//! ```text
//! cargo bench --bench provider
//! BENCH_PEER_PYTHON=/tmp/lkp/.venv/bin/python cargo bench --bench provider   # and the peer
//! ```
//!
//! The server is `tests/support/openai_server.rs` in a child process (this binary with
//! `PROVIDER_BENCH_SERVE` set), so its work is not counted in the client's CPU time and both
//! sides talk to the very same process. It answers by the last message: `text1000` → 1,000
//! text chunks, `text10` → 10, `tool` → one `get_weather` call whose ~100-character
//! arguments come in 4-character fragments, a tool result → 10 text chunks. Every chunk is
//! OpenAI's full chunk JSON (~230 bytes), then a usage chunk and `[DONE]`.
//!
//! Scenarios (one JSON line each): `P_text1000`, `P_text10`, `P_tool` call `Llm::chat`
//! directly and read the stream to its end; `P_turn` is a whole tool turn through a
//! `Session` (`run("tool")`: the call, the tool, a 10-chunk answer: 2 requests), a fresh
//! session per turn. Reported: wall time per request (mean / p50 / p99), the client's CPU
//! time per request (this process's main thread, where the single-threaded runtime runs
//! everything, from `/proc/self/schedstat`), and for `P_text1000` CPU per chunk.
//!
//! Knobs: `BENCH_N` (requests per scenario, default 300; `P_text1000` uses a fifth),
//! `BENCH_WARMUP` (30), `BENCH_PEER_PYTHON` (a python with `livekit-plugins-openai`; runs
//! `benches/peer/openai_plugin.py` against the same server after ours).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

#[path = "../tests/support/openai_server.rs"]
mod openai_server;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openai_server::{reply, Answer, FakeOpenAi};
use serde_json::{json, Value};
use switchboard::futures::StreamExt;
use switchboard::prelude::*;
use switchboard::providers::openai::OpenAiLlm;
use switchboard::{ChatContext, ChatItem, ChatRole, LlmChunk, LlmRequest, ToolChoice, ToolSchema};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

const WEATHER_ARGS: &str = r#"{"location":"Paris, France","unit":"celsius","date":"2026-11-23","details":["wind","humidity","uv"]}"#;

/// The server's answers, built once.
fn answers() -> impl Fn(&Value) -> Option<Answer> + Send + Sync + 'static {
    let words: Vec<String> = (0..1000).map(|i| format!("w{} ", i % 10)).collect();
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    let text1000 = reply::text(&words);
    let text10 = reply::text(&words[..10]);
    let tool = Answer::sse(reply::tool_call_events(
        &[("call_Vx3kQm8TzR2bLp9WnY4cHd7A", "get_weather", WEATHER_ARGS)],
        4,
    ));
    move |body| {
        let last = body["messages"].as_array()?.last()?;
        let content = last["content"].as_str().unwrap_or_default();
        Some(match last["role"].as_str()? {
            "user" if content.contains("text1000") => text1000.clone(),
            "user" if content.contains("tool") => tool.clone(),
            _ => text10.clone(),
        })
    }
}

/// Serve mode: print the base URL, serve until stdin closes.
fn serve() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let server = FakeOpenAi::start().await;
        server.respond_with(answers());
        println!("{}", server.base_url());
        std::io::stdout().flush().unwrap();
        // stdin closes when the parent ends (or kills) us.
        let _ = tokio::task::spawn_blocking(|| {
            let mut line = String::new();
            while std::io::stdin().read_line(&mut line).is_ok_and(|n| n > 0) {}
        })
        .await;
        let refused = server
            .requests()
            .iter()
            .filter(|r| r.refused.is_some())
            .count();
        eprintln!(
            "server: {} requests, {refused} refused",
            server.requests().len()
        );
        if let Some(r) = server.requests().iter().find(|r| r.refused.is_some()) {
            eprintln!("first refusal: {:?}\n{}", r.refused, r.body);
        }
    });
}

/// CPU time of this thread, from the scheduler's own account (ns).
fn thread_cpu() -> Duration {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    let ns = text
        .split_whitespace()
        .next()
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0);
    Duration::from_nanos(ns)
}

struct Stats {
    mean: f64,
    p50: f64,
    p99: f64,
}

fn stats(samples: &mut [f64]) -> Stats {
    samples.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let rank =
        |p: f64| samples[((p * samples.len() as f64).ceil() as usize).clamp(1, samples.len()) - 1];
    Stats {
        mean: samples.iter().sum::<f64>() / samples.len() as f64,
        p50: rank(0.5),
        p99: rank(0.99),
    }
}

fn request(text: &str) -> LlmRequest {
    LlmRequest {
        agent: "bench".into(),
        instructions: "You are a weather bot.".into(),
        extra_instructions: None,
        chat: ChatContext::from(vec![ChatItem::message(ChatRole::User, text)]),
        tools: Arc::from(vec![ToolSchema {
            name: "get_weather".into(),
            description: "Current weather".into(),
            parameters: json!({"type": "object", "properties": {"location": {"type": "string"}}}),
        }]),
        tool_choice: ToolChoice::Auto,
        deferred_call_ids: Vec::new(),
    }
}

/// Reads one answer to its end: (text chunks, tool calls).
async fn one_request(llm: &OpenAiLlm, text: &str) -> (usize, usize) {
    use switchboard::Llm;
    let mut stream = llm.chat(request(text));
    let (mut texts, mut calls) = (0, 0);
    while let Some(chunk) = stream.next().await {
        match chunk.unwrap() {
            LlmChunk::Text(_) => texts += 1,
            LlmChunk::ToolCall(_) => calls += 1,
            _ => {}
        }
    }
    (texts, calls)
}

fn emit(scenario: &str, n: usize, wall: &mut [f64], cpu: Duration, per: usize, extra: Value) {
    let s = stats(wall);
    let cpu_per_request_us = cpu.as_secs_f64() * 1e6 / n as f64;
    let mut line = json!({
        "side": "switchboard",
        "scenario": scenario,
        "n": n,
        "wall_mean_us": (s.mean * 10.0).round() / 10.0,
        "wall_p50_us": (s.p50 * 10.0).round() / 10.0,
        "wall_p99_us": (s.p99 * 10.0).round() / 10.0,
        "cpu_per_request_us": (cpu_per_request_us * 10.0).round() / 10.0,
    });
    if per >= 100 {
        line["cpu_per_chunk_us"] =
            json!((cpu_per_request_us / per as f64 * 1000.0).round() / 1000.0);
    }
    line.as_object_mut()
        .unwrap()
        .extend(extra.as_object().cloned().unwrap_or_default());
    println!("{line}");
}

async fn direct(llm: &OpenAiLlm, scenario: &str, text: &str, n: usize, warmup: usize) {
    let expect = one_request(llm, text).await;
    for _ in 0..warmup {
        assert_eq!(one_request(llm, text).await, expect);
    }
    let mut wall = Vec::with_capacity(n);
    let cpu0 = thread_cpu();
    for _ in 0..n {
        let t0 = Instant::now();
        let got = one_request(llm, text).await;
        wall.push(t0.elapsed().as_secs_f64() * 1e6);
        assert_eq!(got, expect);
    }
    let cpu = thread_cpu() - cpu0;
    emit(
        scenario,
        n,
        &mut wall,
        cpu,
        expect.0,
        json!({"text_chunks": expect.0, "tool_calls": expect.1}),
    );
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Weather {
    #[allow(dead_code)]
    location: String,
}

async fn turn(llm: Arc<OpenAiLlm>, n: usize, warmup: usize) {
    let engine = Engine::current().unwrap();
    let mut wall = Vec::with_capacity(n);
    let mut cpu = Duration::ZERO;
    for i in 0..warmup + n {
        let tool = Tool::new(
            "get_weather",
            "Current weather",
            |_ctx: RunContext, _: Weather| async move { Ok::<_, ToolFailure>("sunny, 22 °C") },
        );
        let agent = Agent::builder("bench")
            .instructions("You are a weather bot.")
            .tool(tool)
            .build()
            .unwrap();
        let session = Session::builder()
            .llm(llm.clone())
            .agent(agent)
            .start(&engine)
            .await
            .unwrap();
        let cpu0 = thread_cpu();
        let t0 = Instant::now();
        let result = session.run("tool: the weather in Paris").await.unwrap();
        let elapsed = t0.elapsed();
        let spent = thread_cpu() - cpu0;
        assert_eq!(result.function_calls().count(), 1);
        assert_eq!(result.assistant_messages().count(), 1);
        session.close().await.unwrap();
        if i >= warmup {
            wall.push(elapsed.as_secs_f64() * 1e6);
            cpu += spent;
        }
    }
    emit(
        "P_turn",
        n,
        &mut wall,
        cpu,
        1,
        json!({"llm_requests_per_turn": 2}),
    );
}

fn main() {
    if std::env::var_os("PROVIDER_BENCH_SERVE").is_some() {
        serve();
        return;
    }
    let n = env("BENCH_N", 300);
    let warmup = env("BENCH_WARMUP", 30);
    let mut server = Command::new(std::env::current_exe().unwrap())
        .env("PROVIDER_BENCH_SERVE", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut base_url = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut base_url)
        .unwrap();
    let base_url = base_url.trim().to_owned();
    eprintln!("server at {base_url}");

    actix::System::new().block_on(async {
        let llm = OpenAiLlm::builder()
            .base_url(&base_url)
            .api_key("sk-bench")
            .model("gpt-4.1-mini")
            .build()
            .unwrap();
        direct(&llm, "P_text1000", "text1000", (n / 5).max(1), warmup / 5).await;
        direct(&llm, "P_text10", "text10", n, warmup).await;
        direct(&llm, "P_tool", "tool", n, warmup).await;
        turn(Arc::new(llm), n, warmup).await;
    });

    if let Ok(python) = std::env::var("BENCH_PEER_PYTHON") {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/peer/openai_plugin.py");
        let status = Command::new(python)
            .arg(script)
            .arg(&base_url)
            .env("BENCH_N", n.to_string())
            .env("BENCH_WARMUP", warmup.to_string())
            .status()
            .unwrap();
        assert!(status.success(), "the peer's driver failed: {status}");
    }
    // Closing its stdin ends the server, which reports what it saw on stderr.
    drop(server.stdin.take());
    let _ = server.wait();
}
