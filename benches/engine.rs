//! Engine overhead, scenario by scenario, beside LiveKit Agents' figures (SPEC §11,
//! `../shared/bench/livekit/RESULTS.md`). Text only, an instant scripted LLM, no network:
//! only engine time is measured. A hand-written harness (no criterion): warm-up, then N
//! timed iterations, mean / p50 / p99 (nearest rank). One JSON line per scenario on stdout.
//!
//! ```text
//! cargo bench --bench engine
//! BENCH_N=5000 BENCH_SCENARIOS=S1,S1_host cargo bench --bench engine
//! ```
//!
//! Knobs: `BENCH_N` (timed iterations per latency scenario, default 2000), `BENCH_WARMUP`
//! (200), `BENCH_S3_SESSIONS` (1000), `BENCH_S4_SESSIONS` (100), `BENCH_S4_CALLS` (10),
//! `BENCH_S4_UPDATES` (3), `BENCH_INSPECT_ROUNDS` (4), `BENCH_SCENARIOS` (comma list, default
//! all of: S1, S1_agent, S1b, S1c, S2, S1b_inspect, V1_barge_in, V2_streaming, S3, S3_abandoned,
//! S4, S4_parallel, S4_burst, S1_host, S1b_host,
//! S1c_host, S2_host, S4_host, S4_parallel_host).
//!
//! The latency scenarios (S1, S1_agent, S1b, S1c, S2) run from a task on the session's
//! own arbiter (`Engine::current()` inside an actix `System`), as the peer runs inside its
//! own event loop. S1, S1b, S1c and S2 run again (`*_host`) from a task of a multi-thread
//! tokio runtime with `Engine::start()`, which is what an embedding pays to cross threads.
//! Each latency iteration uses a fresh session, like the peer; starting and closing it is
//! not timed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

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

/// Like the peer's FakeLLM: when the last item is the user's message (and tools are
/// allowed), `calls` calls to `tool`; otherwise text. Never runs out.
fn llm_calling(tool: Option<&'static str>, calls: usize) -> Arc<ScriptedLlm> {
    llm_timed(tool, calls, None)
}

/// When each LLM request arrived (the last one is kept).
type LastRequest = Arc<Mutex<Option<Instant>>>;

fn llm_timed(
    tool: Option<&'static str>,
    calls: usize,
    last_request: Option<LastRequest>,
) -> Arc<ScriptedLlm> {
    let llm = ScriptedLlm::new([]);
    if let Some(last) = last_request {
        llm.rule(move |_| {
            *last.lock().unwrap() = Some(Instant::now());
            None
        });
    }
    if let Some(name) = tool {
        llm.rule(move |req| {
            let user_last = matches!(
                req.chat.items().last(),
                Some(ChatItem::Message(m)) if m.role == ChatRole::User
            );
            (user_last && req.tool_choice == ToolChoice::Auto)
                .then(|| (0..calls).fold(Reply::default(), |r, _| r.and_tool_call(name, json!({}))))
        });
    }
    llm.otherwise(Reply::text("ok"));
    llm
}

/// `updates` calls of `ctx.update`, then `RESULT 42`; counts finished updates and calls.
fn async_tool(updates: usize, counter: Option<Arc<(AtomicUsize, AtomicUsize)>>) -> Tool {
    Tool::new("work", "Works", move |ctx: RunContext, _: NoArgs| {
        let counter = counter.clone();
        async move {
            for n in 0..updates {
                ctx.update(format!("step {n}")).await?;
                if let Some(c) = &counter {
                    c.0.fetch_add(1, Ordering::Relaxed);
                }
            }
            if let Some(c) = &counter {
                c.1.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, ToolFailure>("RESULT 42")
        }
    })
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
) -> (
    Session,
    Arc<ScriptedLlm>,
    LastRequest,
    mpsc::UnboundedReceiver<Instant>,
) {
    let (entered_tx, entered) = mpsc::unbounded_channel();
    let last: LastRequest = Arc::default();
    let llm_calling = |tool, calls| llm_timed(tool, calls, Some(last.clone()));
    let (agent, toolsets, llm) = match scenario {
        Scenario::S1 => (
            Agent::builder("a").build().unwrap(),
            vec![Toolset::new("async").tool(async_tool(1, None))],
            llm_calling(Some("work"), 1),
        ),
        Scenario::S1Agent => (
            Agent::builder("a")
                .tool(async_tool(1, None))
                .build()
                .unwrap(),
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
    (builder.start(engine).await.unwrap(), llm, last, entered)
}

struct Stats {
    mean: f64,
    p50: f64,
    p99: f64,
    max: f64,
    /// Samples over 1 ms (scheduler stalls on a busy VM, not engine work).
    over_1ms: usize,
}

fn stats(samples: &[f64]) -> Stats {
    let mut s = samples.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let rank = |p: f64| s[((p * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1];
    Stats {
        mean: s.iter().sum::<f64>() / s.len() as f64,
        p50: rank(0.50),
        p99: rank(0.99),
        max: s[s.len() - 1],
        over_1ms: s.iter().filter(|v| **v > 1000.0).count(),
    }
}

#[derive(Default)]
struct Measured {
    /// `run()` until the scenario's end point, µs.
    samples: Vec<f64>,
    /// `run()` until it returned, µs.
    run_returned: Vec<f64>,
    /// `run()` until the last LLM request reached the model, µs (engine side, no wake-up).
    last_request: Vec<f64>,
    /// LLM requests per timed turn: index = count.
    requests: [usize; 5],
}

/// Times `n` turns after `warmup` untimed ones, a fresh session each.
async fn measure(
    engine: &Engine,
    scenario: Scenario,
    inspect: bool,
    n: usize,
    warmup: usize,
    into: &mut Measured,
) {
    for i in 0..warmup + n {
        let (session, llm, last, mut entered) = session_for(engine, scenario, inspect).await;
        let start = Instant::now();
        session.run("go").await.unwrap();
        let returned = Instant::now();
        let end = match scenario {
            Scenario::S2 => entered.recv().await.unwrap(),
            Scenario::S1 | Scenario::S1Agent => {
                // The deferred reply to `/finished` (or its skip) has run.
                session.wait_for_settled().await;
                Instant::now()
            }
            Scenario::S1b | Scenario::S1c => returned,
        };
        if i >= warmup {
            into.samples.push((end - start).as_secs_f64() * 1e6);
            into.run_returned
                .push((returned - start).as_secs_f64() * 1e6);
            let last = last.lock().unwrap().unwrap();
            into.last_request.push((last - start).as_secs_f64() * 1e6);
            let requests = llm.requests();
            into.requests[requests.len().min(4)] += 1;
            if matches!(scenario, Scenario::S1 | Scenario::S1Agent | Scenario::S1b) {
                // As the peer checks: the last reply had the tool's result in view.
                let last = requests.last().unwrap();
                assert!(
                    last.chat.items().iter().any(|item| matches!(
                        item, ChatItem::FunctionCallOutput(o) if o.output.contains("RESULT 42")
                    )),
                    "{scenario:?}: the last LLM request did not see the result"
                );
            }
        }
        session.close().await.unwrap();
    }
}

fn report(label: &str, m: &Measured) {
    let s = stats(&m.samples);
    let r = stats(&m.run_returned);
    let l = stats(&m.last_request);
    let n = m.samples.len();
    let total: usize = m.requests.iter().enumerate().map(|(k, c)| k * c).sum();
    let histogram: Vec<String> = m
        .requests
        .iter()
        .enumerate()
        .filter(|(_, c)| **c > 0)
        .map(|(k, c)| format!(r#""{k}":{c}"#))
        .collect();
    println!(
        r#"{{"scenario":"{label}","n":{n},"mean_us":{:.1},"p50_us":{:.1},"p99_us":{:.1},"max_us":{:.1},"over_1ms":{},"run_returned_mean_us":{:.1},"last_llm_request_mean_us":{:.1},"llm_requests_per_turn":{:.2},"turns_by_llm_requests":{{{}}}}}"#,
        s.mean,
        s.p50,
        s.p99,
        s.max,
        s.over_1ms,
        r.mean,
        l.mean,
        total as f64 / n as f64,
        histogram.join(",")
    );
}

async fn latency(engine: &Engine, scenario: Scenario, label: &str) {
    let mut m = Measured::default();
    measure(
        engine,
        scenario,
        false,
        env("BENCH_N", 2000),
        env("BENCH_WARMUP", 200),
        &mut m,
    )
    .await;
    report(label, &m);
}

/// S1b with mailbox inspection off and on, in alternating rounds so drift hits both.
async fn inspect_on_off(engine: &Engine) {
    let rounds = env("BENCH_INSPECT_ROUNDS", 4).max(1);
    let n = env("BENCH_N", 2000).div_ceil(rounds);
    let warmup = env("BENCH_WARMUP", 200);
    let (mut off, mut on) = (Measured::default(), Measured::default());
    for _ in 0..rounds {
        measure(engine, Scenario::S1b, false, n, warmup, &mut off).await;
        measure(engine, Scenario::S1b, true, n, warmup, &mut on).await;
    }
    report("S1b_inspect_off", &off);
    report("S1b_inspect_on", &on);
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
    let start_one = || {
        Session::builder()
            .llm(llm_calling(None, 0))
            .agent(agent.clone())
            .start(engine)
    };
    // Warm the code paths outside the measurement, like the peer.
    for _ in 0..5 {
        start_one().await.unwrap().close().await.unwrap();
    }
    let before = rss_kib();
    let mut sessions = Vec::with_capacity(count);
    let mut starts = Vec::with_capacity(count);
    let wall = Instant::now();
    for _ in 0..count {
        let t = Instant::now();
        let session = start_one().await.unwrap();
        starts.push(t.elapsed().as_secs_f64() * 1e6);
        sessions.push(session);
    }
    let start_wall = wall.elapsed().as_secs_f64();
    let after = rss_kib();
    let mut closes = Vec::with_capacity(count);
    for session in sessions {
        let t = Instant::now();
        session.close().await.unwrap();
        closes.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let after_close = rss_kib();
    // RSS does not shrink on close (the allocator keeps its pages); a second batch of
    // start + close shows whether the memory is reused or leaked.
    let mut again = Vec::with_capacity(count);
    for _ in 0..count {
        again.push(start_one().await.unwrap());
    }
    for session in again {
        session.close().await.unwrap();
    }
    let after_second = rss_kib();
    let (s, c) = (stats(&starts), stats(&closes));
    println!(
        r#"{{"scenario":"S3","sessions":{count},"start_mean_us":{:.1},"start_p50_us":{:.1},"start_p99_us":{:.1},"start_wall_s":{start_wall:.3},"rss_before_kib":{before},"rss_after_start_kib":{after},"rss_per_session_kib":{:.2},"close_mean_us":{:.1},"close_p50_us":{:.1},"close_p99_us":{:.1},"rss_after_close_kib":{after_close},"rss_after_second_batch_kib":{after_second}}}"#,
        s.mean,
        s.p50,
        s.p99,
        after.saturating_sub(before) as f64 / count as f64,
        c.mean,
        c.p50,
        c.p99,
    );
}

/// S3_abandoned: `BENCH_S3_SESSIONS` sessions, each with a tool still running in the
/// background, dropped without `close()`: how long until no actor of any of them is
/// alive, and the RSS before, with them alive, after the cleanup and after a second
/// batch (memory reused, not leaked).
async fn abandoned_sessions(engine: &Engine) {
    let count = env("BENCH_S3_SESSIONS", 1000);
    let background = Tool::new(
        "background",
        "Runs on",
        |ctx: RunContext, _: NoArgs| async move {
            ctx.update("started").await?;
            std::future::pending::<()>().await;
            Ok::<_, ToolFailure>(())
        },
    );
    let agent = Agent::builder("a").tool(background).build().unwrap();
    let llm = llm_calling(Some("background"), 1);
    let batch = |count: usize| {
        let (agent, llm) = (agent.clone(), llm.clone());
        async move {
            let mut inspectors = Vec::with_capacity(count);
            for _ in 0..count {
                let session = Session::builder()
                    .llm(llm.clone())
                    .agent(agent.clone())
                    .inspect(true)
                    .journal_capacity(1)
                    .grace_period(std::time::Duration::ZERO)
                    .start(engine)
                    .await
                    .unwrap();
                session.run("go").await.unwrap();
                inspectors.push(session.inspector().unwrap());
                // Dropped here, without close().
            }
            inspectors
        }
    };
    let before = rss_kib();
    let inspectors = batch(count).await;
    let with_them = rss_kib();
    let live_before: usize = inspectors.iter().map(|i| i.live_actors().len()).sum();
    let wall = Instant::now();
    for inspector in &inspectors {
        inspector
            .wait_until_all_stopped(std::time::Duration::from_secs(60))
            .await
            .unwrap();
    }
    let cleanup = wall.elapsed().as_secs_f64();
    let live_after: usize = inspectors.iter().map(|i| i.live_actors().len()).sum();
    drop(inspectors);
    let after_cleanup = rss_kib();
    let second = batch(count).await;
    for inspector in &second {
        inspector
            .wait_until_all_stopped(std::time::Duration::from_secs(60))
            .await
            .unwrap();
    }
    drop(second);
    let after_second = rss_kib();
    println!(
        r#"{{"scenario":"S3_abandoned","sessions":{count},"live_actors_before_drop":{live_before},"live_actors_after":{live_after},"cleanup_wall_s":{cleanup:.3},"rss_before_kib":{before},"rss_with_sessions_kib":{with_them},"rss_after_cleanup_kib":{after_cleanup},"rss_after_second_batch_kib":{after_second}}}"#
    );
}

/// Marks when the engine told the output to stop a speech.
#[derive(Clone, Default)]
struct StopWatchOutput {
    interrupted: Arc<Mutex<Option<Instant>>>,
}

impl switchboard::SpeechOutput for StopWatchOutput {
    fn speech_chunk(&mut self, _speech: switchboard::SpeechId, _text: &str) {}
    fn interrupt(&mut self, _speech: switchboard::SpeechId) {
        *self.interrupted.lock().unwrap() = Some(Instant::now());
    }
}

/// Says "Hello" then stalls, and marks when its stream is dropped.
struct HelloThenStall {
    dropped: Arc<Mutex<Option<Instant>>>,
}

struct MarkDrop(Arc<Mutex<Option<Instant>>>);

impl Drop for MarkDrop {
    fn drop(&mut self) {
        *self.0.lock().unwrap() = Some(Instant::now());
    }
}

impl Llm for HelloThenStall {
    fn chat(&self, _request: switchboard::LlmRequest) -> switchboard::LlmStream {
        use futures_util::StreamExt;
        let mark = MarkDrop(self.dropped.clone());
        futures_util::stream::iter([Ok(switchboard::LlmChunk::Text("Hello".into()))])
            .chain(futures_util::stream::pending())
            .map(move |chunk| {
                let _keep = &mark;
                chunk
            })
            .boxed()
    }
}

/// V1 barge-in: a turn streams a speech (then its model stalls); the host reports that
/// the user started speaking (`min_interruption_duration` zero: a real interruption at
/// once). Timed: from `user_started_speaking()` until both the output was told to stop and
/// the LLM stream was dropped.
async fn barge_in(engine: &Engine) {
    let (n, warmup) = (env("BENCH_N", 2000), env("BENCH_WARMUP", 200));
    let mut samples = Vec::with_capacity(n);
    for i in 0..warmup + n {
        let dropped = Arc::new(Mutex::new(None));
        let output = StopWatchOutput::default();
        let session = Session::builder()
            .llm(Arc::new(HelloThenStall {
                dropped: dropped.clone(),
            }))
            .agent(Agent::builder("a").build().unwrap())
            .output(output.clone())
            .min_interruption_duration(std::time::Duration::ZERO)
            .start(engine)
            .await
            .unwrap();
        let mut events = session.subscribe();
        let turn = {
            let session = session.clone();
            actix::spawn(async move { session.run("go").await })
        };
        while let Ok(event) = events.recv().await {
            if matches!(event, SessionEvent::SpeechCreated { .. }) {
                break;
            }
        }
        let start = Instant::now();
        session.user_started_speaking();
        let result = turn.await.unwrap().unwrap();
        assert!(result.interrupted);
        let stopped = output.interrupted.lock().unwrap().unwrap();
        let dropped_at = dropped.lock().unwrap().unwrap();
        if i >= warmup {
            samples.push((stopped.max(dropped_at) - start).as_secs_f64() * 1e6);
        }
        session.close().await.unwrap();
    }
    let s = stats(&samples);
    println!(
        r#"{{"scenario":"V1_barge_in","n":{n},"mean_us":{:.1},"p50_us":{:.1},"p99_us":{:.1},"max_us":{:.1},"over_1ms":{}}}"#,
        s.mean, s.p50, s.p99, s.max, s.over_1ms
    );
}

/// V2 streaming: one plain text turn whose reply comes in `BENCH_CHUNKS` chunks (1,000),
/// against the same turn in one chunk; the difference per chunk is the engine's cost of
/// taking a chunk from the model's stream to the output.
async fn streaming(engine: &Engine) {
    let chunks = env("BENCH_CHUNKS", 1000);
    let n = env("BENCH_N", 2000) / 10;
    let warmup = env("BENCH_WARMUP", 200) / 10;
    let one_turn = |pieces: usize| async move {
        let llm = ScriptedLlm::new([]);
        llm.otherwise((0..pieces).fold(Reply::default(), |r, _| r.and_text("word ")));
        let session = Session::builder()
            .llm(llm)
            .agent(Agent::builder("a").build().unwrap())
            .output(StopWatchOutput::default())
            .start(engine)
            .await
            .unwrap();
        let start = Instant::now();
        session.run("go").await.unwrap();
        let took = start.elapsed().as_secs_f64() * 1e6;
        session.close().await.unwrap();
        took
    };
    let (mut many, mut one) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..warmup + n {
        let (a, b) = (one_turn(chunks).await, one_turn(1).await);
        if i >= warmup {
            many.push(a);
            one.push(b);
        }
    }
    let (m, o) = (stats(&many), stats(&one));
    println!(
        r#"{{"scenario":"V2_streaming","chunks":{chunks},"n":{n},"turn_mean_us":{:.1},"one_chunk_turn_mean_us":{:.1},"per_chunk_us":{:.3},"per_chunk_p50_us":{:.3}}}"#,
        m.mean,
        o.mean,
        (m.mean - o.mean) / (chunks - 1) as f64,
        (m.p50 - o.p50) / (chunks - 1) as f64
    );
}

/// S4_burst: one tool call that sends K updates in a row and returns; how many LLM
/// requests the turn and its deferred replies cost (the peer's event loop coalesces a
/// burst into one reply; ours settles before each deferred reply).
async fn burst(engine: &Engine) {
    for k in [1usize, 10, 100, 1_000, 4_000] {
        let llm = llm_calling(Some("work"), 1);
        let session = Session::builder()
            .llm(llm.clone())
            .agent(
                Agent::builder("a")
                    .tool(async_tool(k, None))
                    .build()
                    .unwrap(),
            )
            .start(engine)
            .await
            .unwrap();
        let start = Instant::now();
        session.run("go").await.unwrap();
        session.wait_for_settled().await;
        let wall = start.elapsed().as_secs_f64();
        println!(
            r#"{{"scenario":"S4_burst","updates":{k},"llm_requests":{},"wall_ms":{:.2}}}"#,
            llm.request_count(),
            wall * 1e3
        );
        session.close().await.unwrap();
    }
}

/// S4: `BENCH_S4_SESSIONS` sessions started first (untimed, like the peer), then all
/// driven at once: `turns` turns each of `calls` tool calls with `BENCH_S4_UPDATES`
/// updates per call. Each turn is `run()` then `wait_for_settled()` (the peer's `run()`
/// waits for the deferred reply). The clock stops when every session has settled.
async fn throughput(engine: &Engine, label: &str, turns: usize, calls: usize, on_tokio: bool) {
    let sessions = env("BENCH_S4_SESSIONS", 100);
    let updates = env("BENCH_S4_UPDATES", 3);
    let counter = Arc::new((AtomicUsize::new(0), AtomicUsize::new(0)));
    let mut started = Vec::with_capacity(sessions);
    for _ in 0..sessions {
        let llm = llm_calling(Some("work"), calls);
        let tool = async_tool(updates, Some(counter.clone())).on_duplicate(DuplicatePolicy::Allow);
        let session = Session::builder()
            .llm(llm.clone())
            .agent(Agent::builder("a").build().unwrap())
            .toolset(Toolset::new("async").tool(tool))
            .start(engine)
            .await
            .unwrap();
        started.push((session, llm));
    }
    let start = Instant::now();
    let drive = |session: Session| async move {
        for _ in 0..turns {
            session.run("go").await.unwrap();
            session.wait_for_settled().await;
        }
    };
    if on_tokio {
        let tasks: Vec<_> = started
            .iter()
            .map(|(s, _)| tokio::spawn(drive(s.clone())))
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    } else {
        let tasks: Vec<_> = started
            .iter()
            .map(|(s, _)| actix::spawn(drive(s.clone())))
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    }
    let wall = start.elapsed().as_secs_f64();
    let llm_requests: usize = started.iter().map(|(_, llm)| llm.request_count()).sum();
    for (session, _) in &started {
        session.close().await.unwrap();
    }
    let total_calls = sessions * turns * calls;
    let (done_updates, done_calls) = (
        counter.0.load(Ordering::Relaxed),
        counter.1.load(Ordering::Relaxed),
    );
    assert_eq!(
        (done_updates, done_calls),
        (total_calls * updates, total_calls),
        "{label}: updates and calls done"
    );
    println!(
        r#"{{"scenario":"{label}","sessions":{sessions},"wall_s":{wall:.4},"updates":{done_updates},"tool_calls":{done_calls},"updates_per_s":{:.0},"tool_calls_per_s":{:.0},"llm_requests":{llm_requests},"llm_requests_per_session":{:.2}}}"#,
        done_updates as f64 / wall,
        done_calls as f64 / wall,
        llm_requests as f64 / sessions as f64,
    );
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_default()
}

fn meta() {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_default();
    let nproc = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        r#"{{"meta":true,"nproc":{nproc},"cpu":{},"loadavg_1m":{},"n":{},"warmup":{}}}"#,
        json!(cpu),
        json!(loadavg()),
        env("BENCH_N", 2000),
        env("BENCH_WARMUP", 200)
    );
}

fn main() {
    let only = std::env::var("BENCH_SCENARIOS").ok();
    let wanted = |name: &str| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|s| s.trim() == name))
    };
    meta();
    let total = Instant::now();
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
                latency(&engine, scenario, label).await;
            }
        }
        if wanted("S1b_inspect") {
            inspect_on_off(&engine).await;
        }
        if wanted("S3") {
            idle_sessions(&engine).await;
        }
        if wanted("V1_barge_in") {
            barge_in(&engine).await;
        }
        if wanted("V2_streaming") {
            streaming(&engine).await;
        }
        if wanted("S3_abandoned") {
            abandoned_sessions(&engine).await;
        }
        if wanted("S4") {
            throughput(&engine, "S4", env("BENCH_S4_CALLS", 10), 1, false).await;
        }
        if wanted("S4_parallel") {
            throughput(&engine, "S4_parallel", 1, env("BENCH_S4_CALLS", 10), false).await;
        }
        if wanted("S4_burst") {
            burst(&engine).await;
        }
    });
    // A tokio host: the engine on its own threads (one arbiter per core), driven from
    // tasks of the host's runtime.
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
                tokio::spawn(async move { latency(&engine, scenario, label).await })
                    .await
                    .unwrap();
            }
        }
        for (label, parallel) in [("S4_host", false), ("S4_parallel_host", true)] {
            if wanted(label) {
                let calls = env("BENCH_S4_CALLS", 10);
                let (turns, per_turn) = if parallel { (1, calls) } else { (calls, 1) };
                throughput(&engine, label, turns, per_turn, true).await;
            }
        }
        engine.shutdown();
    });
    println!(
        r#"{{"meta":true,"total_wall_s":{:.2},"loadavg_1m":{}}}"#,
        total.elapsed().as_secs_f64(),
        json!(loadavg())
    );
}
