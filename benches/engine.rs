//! Engine overhead, scenario by scenario, beside LiveKit Agents' figures (SPEC §11,
//! `../shared/bench/livekit/RESULTS.md`). Text only, an instant scripted LLM, no network:
//! only engine time is measured.
//!
//! ```text
//! cargo bench --bench engine            # BENCH_N=300 iterations per latency scenario
//! ```
//!
//! Each latency scenario runs from a task on the session's own arbiter (as the peer runs
//! inside its own event loop), and S1/S1b/S2 again from a `#[tokio::main]`-style host
//! with `Engine::start()`, to show what crossing threads costs an embedding. One JSON line
//! per scenario goes to stdout.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{Reply, ScriptedLlm};
use switchboard::{ChatItem, ChatRole, NoArgs, ToolChoice};
use tokio::sync::mpsc;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Answers a tool call to `tool` when the last item is the user's message, text otherwise.
fn llm_calling(tool: Option<&'static str>, calls: usize) -> Arc<ScriptedLlm> {
    let llm = ScriptedLlm::new([]);
    llm.rule(move |req| {
        let user_last = matches!(req.chat.items().last(), Some(ChatItem::Message(m)) if m.role == ChatRole::User);
        Some(match (tool, user_last && req.tool_choice == ToolChoice::Auto) {
            (Some(name), true) => (0..calls).fold(Reply::default(), |r, _| r.and_tool_call(name, json!({}))),
            _ => Reply::text("ok"),
        })
    });
    llm
}

fn async_tool(updates: usize) -> Tool {
    Tool::new(
        "work",
        "Works",
        move |ctx: RunContext, _: NoArgs| async move {
            for n in 0..updates {
                ctx.update(format!("step {n}")).await?;
            }
            Ok::<_, ToolFailure>("RESULT 42")
        },
    )
}

fn plain_tool() -> Tool {
    Tool::new("work", "Works", |_ctx: RunContext, _: NoArgs| async move {
        Ok::<_, ToolFailure>("RESULT 42")
    })
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Scenario {
    S1,
    S1Agent,
    S1b,
    S1c,
    S2,
}

async fn session_for(
    engine: &Engine,
    scenario: Scenario,
    inspect: bool,
) -> (Session, Arc<ScriptedLlm>, mpsc::UnboundedReceiver<Instant>) {
    let (entered_tx, entered) = mpsc::unbounded_channel();
    let (agent, toolsets, llm) = match scenario {
        Scenario::S1 => (
            Agent::builder("a").build().unwrap(),
            vec![Toolset::new("async").tool(async_tool(1))],
            llm_calling(Some("work"), 1),
        ),
        Scenario::S1Agent => (
            Agent::builder("a").tool(async_tool(1)).build().unwrap(),
            vec![],
            llm_calling(Some("work"), 1),
        ),
        Scenario::S1b => (
            Agent::builder("a").tool(plain_tool()).build().unwrap(),
            vec![],
            llm_calling(Some("work"), 1),
        ),
        Scenario::S1c => (
            Agent::builder("a").build().unwrap(),
            vec![],
            llm_calling(None, 0),
        ),
        Scenario::S2 => {
            let b = Agent::builder("b")
                .on_enter(move |_ctx| {
                    let tx = entered_tx.clone();
                    async move {
                        let _ = tx.send(Instant::now());
                    }
                })
                .build()
                .unwrap();
            let transfer = Tool::new("work", "Transfers", move |_ctx: RunContext, _: NoArgs| {
                let b = b.clone();
                async move { Ok::<_, ToolFailure>(Handoff::to(b)) }
            });
            (
                Agent::builder("a").tool(transfer).build().unwrap(),
                vec![],
                llm_calling(Some("work"), 1),
            )
        }
    };
    let mut builder = Session::builder()
        .llm(llm.clone())
        .agent(agent)
        .inspect(inspect);
    for ts in toolsets {
        builder = builder.toolset(ts);
    }
    (builder.start(engine).await.unwrap(), llm, entered)
}

struct Stats {
    mean: f64,
    p50: f64,
    p99: f64,
}

fn stats(mut samples: Vec<f64>) -> Stats {
    samples.sort_by(|a, b| a.total_cmp(b));
    let rank =
        |p: f64| samples[((p * samples.len() as f64).ceil() as usize).clamp(1, samples.len()) - 1];
    Stats {
        mean: samples.iter().sum::<f64>() / samples.len() as f64,
        p50: rank(0.50),
        p99: rank(0.99),
    }
}

/// One latency scenario: a fresh session per iteration (start and close not timed).
async fn latency(engine: &Engine, scenario: Scenario, inspect: bool, label: &str) {
    let n = env("BENCH_N", 300);
    let warmup = env("BENCH_WARMUP", 30);
    let mut samples = Vec::with_capacity(n);
    let mut requests = 0;
    for i in 0..warmup + n {
        let (session, llm, mut entered) = session_for(engine, scenario, inspect).await;
        let start = Instant::now();
        session.run("go").await.unwrap();
        let end = match scenario {
            Scenario::S2 => entered.recv().await.unwrap(),
            Scenario::S1 | Scenario::S1Agent => {
                session.wait_for_settled().await;
                Instant::now()
            }
            _ => Instant::now(),
        };
        if i >= warmup {
            samples.push((end - start).as_secs_f64() * 1e6);
            requests += llm.request_count();
        }
        session.close().await.unwrap();
    }
    let s = stats(samples);
    println!(
        r#"{{"scenario":"{label}","n":{n},"mean_us":{:.1},"p50_us":{:.1},"p99_us":{:.1},"llm_requests_per_turn":{:.2}}}"#,
        s.mean,
        s.p50,
        s.p99,
        requests as f64 / n as f64
    );
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

async fn idle_sessions(engine: &Engine) {
    let count = env("BENCH_S3_SESSIONS", 1000);
    let agent = Agent::builder("a").build().unwrap();
    let llm = llm_calling(None, 0);
    let before = rss_kib();
    let mut sessions = Vec::with_capacity(count);
    let mut starts = Vec::with_capacity(count);
    for _ in 0..count {
        let t = Instant::now();
        let session = Session::builder()
            .llm(llm.clone())
            .agent(agent.clone())
            .start(engine)
            .await
            .unwrap();
        starts.push(t.elapsed().as_secs_f64() * 1e6);
        sessions.push(session);
    }
    let after = rss_kib();
    let mut closes = Vec::with_capacity(count);
    for session in sessions {
        let t = Instant::now();
        session.close().await.unwrap();
        closes.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let (s, c) = (stats(starts), stats(closes));
    println!(
        r#"{{"scenario":"S3","sessions":{count},"start_mean_us":{:.1},"start_p99_us":{:.1},"rss_per_session_kib":{:.2},"close_mean_us":{:.1},"close_p99_us":{:.1}}}"#,
        s.mean,
        s.p99,
        (after.saturating_sub(before)) as f64 / count as f64,
        c.mean,
        c.p99
    );
}

/// S4: `sessions` concurrent sessions, each `turns` turns of `calls` tool calls doing
/// `updates` updates each.
async fn throughput(engine: &Engine, label: &str, turns: usize, calls: usize) {
    let sessions = env("BENCH_S4_SESSIONS", 100);
    let updates = env("BENCH_S4_UPDATES", 3);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..sessions {
        let engine = engine.clone();
        tasks.push(actix::spawn(async move {
            let agent = Agent::builder("a").build().unwrap();
            let tool = async_tool(updates).on_duplicate(DuplicatePolicy::Allow);
            let session = Session::builder()
                .llm(llm_calling(Some("work"), calls))
                .agent(agent)
                .toolset(Toolset::new("async").tool(tool))
                .start(&engine)
                .await
                .unwrap();
            for _ in 0..turns {
                session.run("go").await.unwrap();
                session.wait_for_settled().await;
            }
            session.close().await.unwrap();
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let wall = start.elapsed().as_secs_f64();
    let total_calls = (sessions * turns * calls) as f64;
    println!(
        r#"{{"scenario":"{label}","wall_s":{wall:.3},"updates_per_s":{:.0},"tool_calls_per_s":{:.0}}}"#,
        total_calls * updates as f64 / wall,
        total_calls / wall
    );
}

fn main() {
    let only = std::env::var("BENCH_SCENARIOS").ok();
    let wanted = |name: &str| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|s| s == name))
    };
    // Same arbiter: the session runs on the arbiter of the task that drives it.
    actix::System::new().block_on(async {
        let engine = Engine::current().unwrap();
        for (scenario, label) in [
            (Scenario::S1, "S1"),
            (Scenario::S1Agent, "S1_agent"),
            (Scenario::S1b, "S1b"),
            (Scenario::S1c, "S1c"),
            (Scenario::S2, "S2"),
        ] {
            if wanted(label) {
                latency(&engine, scenario, false, label).await;
            }
        }
        if wanted("S1b_inspect") {
            latency(&engine, Scenario::S1b, true, "S1b_inspect").await;
        }
        if wanted("S3") {
            idle_sessions(&engine).await;
        }
        if wanted("S4") {
            throughput(&engine, "S4", env("BENCH_S4_CALLS", 10), 1).await;
        }
        if wanted("S4_parallel") {
            throughput(&engine, "S4_parallel", 1, env("BENCH_S4_CALLS", 10)).await;
        }
    });
    // A tokio host: the engine on its own threads, driven from a host task.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let engine = Engine::start().unwrap();
        for (scenario, label) in [
            (Scenario::S1, "S1_host"),
            (Scenario::S1b, "S1b_host"),
            (Scenario::S1c, "S1c_host"),
            (Scenario::S2, "S2_host"),
        ] {
            if wanted(label) {
                let engine = engine.clone();
                tokio::spawn(async move { latency(&engine, scenario, false, label).await })
                    .await
                    .unwrap();
            }
        }
        engine.shutdown();
    });
    let _ = Duration::ZERO;
}
