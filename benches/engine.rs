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
//! With `--features telemetry` the run records telemetry through an OpenTelemetry
//! pipeline (`install_telemetry`; `BENCH_OTEL=none`: the feature built in, no pipeline;
//! `BENCH_OTEL=metrics`: metrics only).
//!
//! `BENCH_TURNS=on` gives every session of the latency and voice rows the turn handling
//! with every feature on (`turns_on`: a dynamic endpointing delay, backchannel words, a
//! zero minimum duration, preemptive generation, a user-turn limit): the "on" column of
//! BENCHMARKS.md's turn-handling table. V1_barge_in then times the words that interrupt
//! (an interim transcript), since with a word rule the voice alone does not;
//! `V3_backchannel` (only with it on) times a backchannel final from `transcript()` to its
//! `UserWordsIgnored` event.
//!
//! Knobs: `BENCH_N` (timed iterations per latency scenario, default 2000), `BENCH_WARMUP`
//! (200), `BENCH_S3_SESSIONS` (1000), `BENCH_SCALE_SESSIONS` (100000), `BENCH_SCALE_TASKS`
//! (16), `BENCH_S4_SESSIONS` (100), `BENCH_S4_CALLS` (10), `BENCH_S4_UPDATES` (3),
//! `BENCH_INSPECT_ROUNDS` (4), `BENCH_STALLS_ROUNDS` (4), `BENCH_HISTORY_ROUNDS` (4), `BENCH_ARBITER_ROUNDS` (7),
//! `BENCH_ARBITER_TURNS` (30),
//! `BENCH_S4_ROUNDS` (5: S4, S4_parallel and their host rows report the median round),
//! `BENCH_SCRIPTED` (1: the throughput rows on `ScriptedLlm` instead of the counting fake),
//! `BENCH_SNAPSHOT_N` (200 timed samples per snapshot row and size), `BENCH_SNAPSHOT_ROUNDS`
//! (4: the sizes alternate in rounds), `BENCH_SNAPSHOT_WARMUP` (5 per round and size),
//! `BENCH_SNAPSHOT_CHAIN` (64), `BENCH_SNAPSHOT_SAVE_TURNS` (128), `BENCH_SNAPSHOT_DIR`
//! (the file store's folder; default a fresh one in the temporary folder, removed after),
//! `BENCH_SCENARIOS` (comma list, default all of: S1, S1_agent, S1b, S1c, S2, round_trip,
//! S1_idle, S1b_idle, S1c_idle, S1_history, S1b_inspect, S1_stalls, snapshot_full, snapshot_delta,
//! snapshot_delta_chain, snapshot_restore, snapshot_restore_reply, snapshot_save_turn,
//! snapshot_file_append, V1_barge_in, V2_streaming, V3_backchannel (with `BENCH_TURNS=on`),
//! S3, S3_abandoned, S4, S4_1000,
//! S4_parallel, S4_burst, round_trip_host, S1_host, S1b_host, S1c_host, S2_host, S4_host,
//! S4_parallel_host, S3_scale, S4_arbiters_mt, S4_arbiters).
//!
//! The latency scenarios (S1, S1_agent, S1b, S1c, S2) run from a task on the session's
//! own arbiter (`Engine::current()` inside an actix `System`), as the peer runs inside its
//! own event loop. S1, S1b, S1c and S2 run again (`*_host`) from a task of a multi-thread
//! tokio runtime with `Engine::start()`, which is what an embedding pays to cross threads.
//! Each latency iteration uses a fresh session, like the peer; starting and closing it is
//! not timed. `round_trip` and `round_trip_host` time one bare actix message and its
//! answer (no engine code) the same two ways: the floor a latency row stands on.
//! `S1_idle`, `S1b_idle` and `S1c_idle` are S1, S1b and S1c on the same arbiter with the
//! driving task asleep for a moment (tokio's 1 ms tick) before each timed turn: the
//! arbiter parks, as it does between a host's calls, and the turn runs on a thread that
//! just woke. (The peer's harness does the same with `asyncio.sleep(0.001)` before its
//! timed `run()`: see docs/benchmark-history.md, "the turn after a wake".)
//!
//! Scaling scenarios:
//!
//! - `S1_history`: the S1 turn on a session whose chat context already holds 10, 100,
//!   1,000 and 10,000 items (one line per size, sizes alternated in `BENCH_HISTORY_ROUNDS`
//!   rounds). The goal: the turn costs the same, within 20 %, at every size.
//! - `S3_scale`: `BENCH_SCALE_SESSIONS` idle sessions in one process, started and closed
//!   from `BENCH_SCALE_TASKS` tasks of a tokio host over `Engine::start()`'s arbiters:
//!   start and close rates, RSS per session, RSS after the engine's own release once the
//!   last session is gone (`IdleRelease::AFTER_BURST`), a second batch with that off:
//!   RSS after close and after `Engine::release_memory`, and (in a third, inspected
//!   batch) the live actors while held and after close.
//! - `S4_1000`: S4 with 1,000 sessions, whatever `BENCH_S4_SESSIONS` says.
//! - `S4_arbiters`: S4 (`BENCH_ARBITER_TURNS` turns per session, default 30) from a
//!   current-thread tokio host on an engine of 1 arbiter and one of 2, in
//!   `BENCH_ARBITER_ROUNDS` (7) alternating rounds; the throughput of each, the ratio (the
//!   goal: 2 arbiters do at least 1.7 times the work of one) and the vCPUs the arbiters
//!   and the host used. `S4_arbiters_mt`: the same from the multi-thread host.
//!
//! Snapshot scenarios (SPEC §14), on the same arbiter, one line per history size (10, 100,
//! 1,000 and 10,000 chat items when the snapshot is taken; the sizes alternate in
//! `BENCH_SNAPSHOT_ROUNDS` rounds). A session is S1's (an async tool in a session toolset)
//! given its history at start (`StartingChat::given`), then one settled S1 turn, untimed.
//!
//! - `snapshot_full`: `Session::snapshot()` + `to_bytes()`; `to_json()` timed apart; the
//!   size of both encodings.
//! - `snapshot_delta`: after a full snapshot (the chain's start), one more settled S1 turn
//!   (7 items), then `Session::snapshot_update()` (a delta) + `to_bytes()`, a fresh session
//!   per sample. The goal: flat within 20 % across the sizes.
//! - `snapshot_delta_chain`: the same, 64 turns in a row on one session (a delta after
//!   each), so the chat's log moves to a larger one during the chain at some sizes.
//! - `snapshot_restore`: `SessionSnapshot::from_bytes` + `SessionBuilder::restore(..)
//!   .start()` until the restored session answers (`chat_context()`, which the restored
//!   activity answers). `snapshot_restore_reply`: the same until the first `run()` on a
//!   `ScriptedLlm` has its `RunResult`.
//! - `snapshot_save_turn`: S1 turns back to back on one session at 10 and 10,000 items,
//!   without and with `save_snapshots(MemoryStore)` (alternating rounds): what saving
//!   after every settled turn costs a turn.
//! - `snapshot_file_append`: `FileStore::append` of one turn's delta (encoding, the
//!   blocking pool, the write and its `fsync`).
//! - `abandon_call_record`: a turn with one call of a tool whose body returns at once, then
//!   the model's text, until settled; the tool's restore policy `Restart` or `Abandon`, the
//!   session saving to no store, a `MemoryStore` or a `FileStore` (alternating rounds):
//!   what waiting for a stored snapshot holding the call before an `Abandon` body starts
//!   adds to a turn (`BENCH_RECORD_TURNS`, 128 per round and setting).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::json;
use switchboard::memory::IdleRelease;
use switchboard::prelude::*;
use switchboard::snapshot::{
    AgentRegistry, ClaimRule, FileStore, MemoryStore, SessionSnapshot, SnapshotStore,
    SnapshotUpdate,
};
use switchboard::testing::{Reply, ScriptedLlm};
use switchboard::RestorePolicy;
use switchboard::{
    AgentBuilder, ChatItem, ChatRole, LlmChunk, LlmError, LlmRequest, LlmStream, NoArgs,
    SessionBuilder, ToolCallChunk, ToolChoice,
};
use switchboard::{
    Backchannel, Endpointing, Interruption, PreemptiveGeneration, TurnHandling, UserTurnLimit,
};
use tokio::sync::{mpsc, watch};

/// Whether the turn handling's features are on (`BENCH_TURNS=on`).
fn turns_on() -> bool {
    std::env::var("BENCH_TURNS").as_deref() == Ok("on")
}

/// The turn handling of a session: every feature on with `BENCH_TURNS=on`, the defaults
/// otherwise.
fn turn_handling() -> TurnHandling {
    if !turns_on() {
        return TurnHandling::new();
    }
    TurnHandling::new()
        .endpointing(Endpointing::dynamic(
            std::time::Duration::from_millis(500),
            std::time::Duration::from_secs(3),
        ))
        .interruption(
            Interruption::new()
                .min_duration(std::time::Duration::ZERO)
                .backchannel(Backchannel::english())
                .backchannel_boundary(None),
        )
        .preemptive_generation(PreemptiveGeneration::on())
        .user_turn_limit(UserTurnLimit::new().max_words(200))
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Like the peer's FakeLLM: when the last item is the user's message (and tools are
/// allowed), `calls` calls to `tool`; otherwise text. Never runs out.
fn llm_calling(tool: Option<&'static str>, calls: usize) -> Arc<ScriptedLlm> {
    llm_timed(tool, calls, None, None)
}

/// How many requests a session's model has had: a tool of [`async_tool`] waits on it.
type RequestCount = watch::Sender<usize>;

/// When each LLM request arrived (the last one is kept).
type LastRequest = Arc<Mutex<Option<Instant>>>;

fn llm_timed(
    tool: Option<&'static str>,
    calls: usize,
    last_request: Option<LastRequest>,
    count: Option<RequestCount>,
) -> Arc<ScriptedLlm> {
    let llm = ScriptedLlm::new([]);
    if let Some(count) = count {
        llm.rule(move |_| {
            count.send_modify(|n| *n += 1);
            None
        });
    }
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

/// The peer's `FakeLLM` for the throughput rows: the same answers as [`llm_calling`] (when
/// the last item is the user's message and tools are allowed, `calls` calls to `tool`;
/// otherwise "ok"), but it only counts requests. `ScriptedLlm` keeps every request it
/// got, and with it a reference to each request's chat log: a log that is still shared
/// when it must grow is copied item by item, work a real provider (which drops the
/// request once sent) never causes. `BENCH_SCRIPTED=1` runs these rows on `ScriptedLlm`.
struct CountingLlm {
    tool: &'static str,
    calls: usize,
    requests: RequestCount,
    next_call: AtomicUsize,
}

impl Llm for CountingLlm {
    fn chat(&self, request: LlmRequest) -> LlmStream {
        use switchboard::futures::StreamExt;
        self.requests.send_modify(|n| *n += 1);
        let user_last = matches!(
            request.chat.items().last(),
            Some(ChatItem::Message(m)) if m.role == ChatRole::User
        );
        let chunks: Vec<Result<LlmChunk, LlmError>> =
            if user_last && request.tool_choice == ToolChoice::Auto {
                (0..self.calls)
                    .map(|_| {
                        let n = self.next_call.fetch_add(1, Ordering::Relaxed) + 1;
                        Ok(LlmChunk::ToolCall(ToolCallChunk {
                            call_id: format!("call_{n}"),
                            name: self.tool.to_owned(),
                            arguments: "{}".to_owned(),
                        }))
                    })
                    .collect()
            } else {
                vec![Ok(LlmChunk::Text("ok".to_owned()))]
            };
        switchboard::futures::stream::iter(chunks).boxed()
    }
}

/// The model of a throughput row and its request count.
fn throughput_llm(calls: usize) -> (Arc<dyn Llm>, watch::Receiver<usize>) {
    let (count, requests) = watch::channel(0);
    if env("BENCH_SCRIPTED", 0) == 1 {
        return (llm_timed(Some("work"), calls, None, Some(count)), requests);
    }
    let llm = Arc::new(CountingLlm {
        tool: "work",
        calls,
        requests: count,
        next_call: AtomicUsize::new(0),
    });
    (llm, requests)
}

/// `updates` calls of `ctx.update`, then `RESULT 42`; counts finished updates and calls.
///
/// With `requests` (the session model's request count), the body waits after its first
/// update, which answers the step, until the model has had the step's next request: the
/// peer's tool goes on only after that request, so its later updates and `/finished` are
/// answered by deferred replies. Ours, going on at once, races its own step, and a
/// `/finished` that lands before the step's next request is answered by that request —
/// one request fewer than the peer, and not the same work.
fn async_tool(
    updates: usize,
    counter: Option<Arc<(AtomicUsize, AtomicUsize)>>,
    requests: Option<watch::Receiver<usize>>,
) -> Tool {
    Tool::new("work", "Works", move |ctx: RunContext, _: NoArgs| {
        let (counter, mut requests) = (counter.clone(), requests.clone());
        async move {
            // The request that made this call is counted already.
            let asked = requests.as_mut().map(|r| *r.borrow_and_update());
            for n in 0..updates {
                ctx.update(format!("step {n}")).await?;
                if let (0, Some(requests), Some(asked)) = (n, requests.as_mut(), asked) {
                    let _ = requests.wait_for(|count| *count > asked).await;
                }
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

/// `count` items of an earlier conversation, as a chat context holds them: turns of a user
/// message and the agent's answer, every fifth turn with a tool call and its output
/// between them (never a call without its output).
fn past_conversation(count: usize) -> Arc<[ChatItem]> {
    let mut items = Vec::with_capacity(count);
    let mut turn = 0;
    while items.len() < count {
        items.push(ChatItem::message(
            ChatRole::User,
            format!("Earlier question {turn}: what about the order I placed?"),
        ));
        if turn % 5 == 4 && items.len() + 2 <= count {
            let call_id = format!("past_{turn}");
            items.push(ChatItem::FunctionCall(switchboard::FunctionCall {
                call_id: call_id.clone(),
                name: "lookup".into(),
                arguments: r#"{"order":"A-1234"}"#.into(),
            }));
            items.push(ChatItem::FunctionCallOutput(
                switchboard::FunctionCallOutput {
                    call_id,
                    name: "lookup".into(),
                    output: "shipped on Monday".into(),
                    is_error: false,
                },
            ));
        }
        if items.len() < count {
            items.push(ChatItem::message(
                ChatRole::Assistant,
                format!("Answer {turn}: it shipped on Monday and arrives tomorrow."),
            ));
        }
        turn += 1;
    }
    items.into()
}

/// The user message that gives a fresh session its starting history (see [`with_history`]).
const FILL: &str = "<fill history>";

/// There is no builder option for a starting chat context, so an `on_user_turn_completed`
/// hook gives one: on the message [`FILL`] it appends `past` so that, with `FILL` itself
/// (recorded after the hook), the chat holds `past.len() + 1` items, and stops the reply
/// (no LLM request). On any other message it does nothing; that check and the hook's
/// call (a reference-counted snapshot of the chat, to see what the hook changed) are in
/// the timed turn.
fn with_history(agent: AgentBuilder, past: Option<Arc<[ChatItem]>>) -> AgentBuilder {
    let Some(past) = past else {
        return agent;
    };
    agent.on_user_turn_completed(move |chat, message| {
        if message.content != FILL {
            return TurnDecision::Reply;
        }
        let missing = past.len().saturating_sub(chat.len());
        chat.extend(past.iter().take(missing).cloned());
        TurnDecision::NoReply
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
    past: Option<Arc<[ChatItem]>>,
) -> (
    Session,
    Arc<ScriptedLlm>,
    LastRequest,
    mpsc::UnboundedReceiver<Instant>,
) {
    let (entered_tx, entered) = mpsc::unbounded_channel();
    let last: LastRequest = Arc::default();
    let (count, requests) = watch::channel(0);
    let llm_calling = |tool, calls| llm_timed(tool, calls, Some(last.clone()), Some(count.clone()));
    let a = || with_history(Agent::builder("a"), past.clone());
    let timed_tool = || async_tool(1, None, Some(requests.clone()));
    let (agent, toolsets, llm) = match scenario {
        Scenario::S1 => (
            a().build().unwrap(),
            vec![Toolset::new("async").tool(timed_tool())],
            llm_calling(Some("work"), 1),
        ),
        Scenario::S1Agent => (
            a().tool(timed_tool()).build().unwrap(),
            vec![],
            llm_calling(Some("work"), 1),
        ),
        Scenario::S1b => (
            a().tool(plain_tool()).build().unwrap(),
            vec![],
            llm_calling(Some("work"), 1),
        ),
        Scenario::S1c => (a().build().unwrap(), vec![], llm_calling(None, 0)),
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
                a().tool(transfer).build().unwrap(),
                vec![],
                llm_calling(Some("work"), 1),
            )
        }
    };
    let mut builder = Session::builder()
        .llm(llm.clone())
        .agent(agent)
        .turn_handling(turn_handling())
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

/// Chat items one S1 turn adds: the user's message, the call and its output (the first
/// update), the reply, the `/finished` call and output, the deferred reply.
const S1_TURN_ITEMS: usize = 7;

/// How the sessions of a latency row are set up before the timed turn.
#[derive(Clone, Default)]
struct Setup {
    /// Mailbox inspection on.
    inspect: bool,
    /// S1 only: each session first gets this history (see [`with_history`]) and runs one
    /// S1 turn, both untimed, so the timed turn starts on a chat of
    /// `past.len() + 1 + S1_TURN_ITEMS` items.
    past: Option<Arc<[ChatItem]>>,
    /// The driving task sleeps [`IDLE`] right before each timed turn, so the arbiter has
    /// nothing to do and parks (its vCPU goes idle) as it would between a host's calls.
    idle_before: bool,
}

/// The pause of [`Setup::idle_before`]; tokio rounds a sleep up to its 1 ms tick.
const IDLE: std::time::Duration = std::time::Duration::from_micros(200);

/// Times `n` turns after `warmup` untimed ones, a fresh session each, set up as `setup`
/// says.
async fn measure(
    engine: &Engine,
    scenario: Scenario,
    setup: &Setup,
    n: usize,
    warmup: usize,
    into: &mut Measured,
) {
    let (inspect, past) = (setup.inspect, &setup.past);
    assert!(
        past.is_none() || scenario == Scenario::S1,
        "history is for S1"
    );
    let history = past.as_ref().map(|p| p.len() + 1 + S1_TURN_ITEMS);
    for i in 0..warmup + n {
        let (session, llm, last, mut entered) =
            session_for(engine, scenario, inspect, past.clone()).await;
        if history.is_some() {
            session.run(FILL).await.unwrap();
            // The turn before: filling thousands of items just now leaves the caches full
            // of them, which a session whose history grew turn by turn would not see.
            // Timed right after the fill, the 10,000-item turn cost 1.4-1.7 times the
            // 10-item one; timed one turn later, 1.02-1.11 times (p50); 10 to 60 turns
            // later on the same session, p50 19.5-19.8 µs at 10, 10,000 and 30,000 items.
            session.run("go").await.unwrap();
            session.wait_for_settled().await.unwrap();
        }
        if setup.idle_before {
            tokio::time::sleep(IDLE).await;
        }
        let earlier_requests = llm.request_count();
        let start = Instant::now();
        session.run("go").await.unwrap();
        let returned = Instant::now();
        let end = match scenario {
            Scenario::S2 => entered.recv().await.unwrap(),
            Scenario::S1 | Scenario::S1Agent => {
                // The deferred reply to `/finished` (or its skip) has run.
                session.wait_for_settled().await.unwrap();
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
            let requests = &llm.requests()[earlier_requests..];
            into.requests[requests.len().min(4)] += 1;
            if let Some(history) = history {
                // The turn's first request saw the whole history, then its own message.
                let first = &requests[0].chat;
                assert_eq!(
                    first.len(),
                    history + 1,
                    "{scenario:?}: history not in place"
                );
                if i == warmup {
                    first.check_invariant().unwrap();
                }
            }
            if matches!(scenario, Scenario::S1 | Scenario::S1Agent | Scenario::S1b) {
                // As the peer checks: the last reply had the tool's result in view.
                let last = requests.last().unwrap();
                assert!(
                    last.chat.items().iter().rev().any(|item| matches!(
                        item, ChatItem::FunctionCallOutput(o) if o.output.contains("RESULT 42")
                    )),
                    "{scenario:?}: the last LLM request did not see the result"
                );
            }
        }
        session.close().await.unwrap();
    }
}

/// One latency line; `fields` are extra JSON fields put after the label (`"k":v,` each).
fn report(label: &str, fields: &str, m: &Measured) {
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
        r#"{{"scenario":"{label}",{fields}"n":{n},"mean_us":{:.1},"p50_us":{:.1},"p99_us":{:.1},"max_us":{:.1},"over_1ms":{},"run_returned_mean_us":{:.1},"last_llm_request_mean_us":{:.1},"llm_requests_per_turn":{:.2},"turns_by_llm_requests":{{{}}}}}"#,
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

async fn latency(engine: &Engine, scenario: Scenario, setup: Setup, label: &str) {
    let mut m = Measured::default();
    measure(
        engine,
        scenario,
        &setup,
        env("BENCH_N", 2000),
        env("BENCH_WARMUP", 200),
        &mut m,
    )
    .await;
    report(label, "", &m);
}

/// S1b with mailbox inspection off and on, in alternating rounds so drift hits both.
async fn inspect_on_off(engine: &Engine) {
    let rounds = env("BENCH_INSPECT_ROUNDS", 4).max(1);
    let n = env("BENCH_N", 2000).div_ceil(rounds);
    let warmup = env("BENCH_WARMUP", 200);
    let (mut off, mut on) = (Measured::default(), Measured::default());
    let (plain, inspected) = (
        Setup::default(),
        Setup {
            inspect: true,
            ..Setup::default()
        },
    );
    for _ in 0..rounds {
        measure(engine, Scenario::S1b, &plain, n, warmup, &mut off).await;
        measure(engine, Scenario::S1b, &inspected, n, warmup, &mut on).await;
    }
    report("S1b_inspect_off", "", &off);
    report("S1b_inspect_on", "", &on);
}

/// S1 with the engine's stall monitor off and on (`Engine::monitor_stalls`, 100 ms: a beat
/// every 25 ms on the arbiter, and each poll of the tool body marked), in alternating
/// rounds so drift hits both, each side first in half of them. Each round uses an engine
/// of its own on the same arbiter; a watched one is dropped after its round and its beat
/// task given time to end, so the unwatched rounds run with no beat and no mark.
async fn stalls_on_off() {
    let rounds = env("BENCH_STALLS_ROUNDS", 4).max(1);
    let n = env("BENCH_N", 2000).div_ceil(rounds);
    let warmup = env("BENCH_WARMUP", 200);
    let (mut off, mut on) = (Measured::default(), Measured::default());
    let mut stalls = 0;
    for round in 0..rounds {
        for watched in [round % 2 == 1, round % 2 == 0] {
            let engine = Engine::current().unwrap();
            if !watched {
                measure(
                    &engine,
                    Scenario::S1,
                    &Setup::default(),
                    n,
                    warmup,
                    &mut off,
                )
                .await;
                continue;
            }
            let _reports = engine
                .monitor_stalls(std::time::Duration::from_millis(100))
                .unwrap();
            measure(&engine, Scenario::S1, &Setup::default(), n, warmup, &mut on).await;
            stalls += engine.stats().arbiter_stalls;
            drop(engine);
            // The beat task sees the monitor gone at its next beat (every 25 ms) and ends.
            tokio::time::sleep(std::time::Duration::from_millis(60)).await;
        }
    }
    report("S1_stalls_off", "", &off);
    report("S1_stalls_on", &format!(r#""stalls_seen":{stalls},"#), &on);
}

/// S1_history: the S1 turn (an async tool in a session toolset, one `ctx.update`, then
/// its `/finished` and the deferred reply) on a session whose chat context already holds
/// `size` items, for each size; the sizes alternate in rounds so drift hits all. Each
/// iteration is a fresh session given its history by a hook, then one untimed S1 turn,
/// then the timed one (see [`measure`]): so the rows are a session's second turn, which
/// costs less than S1's first turn of a session.
///
/// What the history can cost here is the engine's own: the scripted LLM's work per
/// request does not grow with the chat. It keeps each request (its `chat` is a snapshot,
/// a reference count, not a copy), and the bench's rules read only the chat's last item;
/// the check that the result was in view runs after the clock stops. A real provider
/// serializes the whole chat into each request, which grows with the history and is not
/// in these figures. The chat's log doubles its capacity when full (an amortized copy
/// of the items); the timed turn adds 7 items, so only the 10-item size (16 slots) copies
/// its log once, 16 items, inside the timed turn.
async fn history_sizes(engine: &Engine) {
    const SIZES: [usize; 4] = [10, 100, 1_000, 10_000];
    let rounds = env("BENCH_HISTORY_ROUNDS", 4).max(1);
    let n = env("BENCH_N", 2000).div_ceil(rounds);
    let warmup = env("BENCH_WARMUP", 200);
    // The hook adds `size - 1 - S1_TURN_ITEMS` items, then `FILL` and an untimed turn.
    let pasts: Vec<Arc<[ChatItem]>> = SIZES
        .iter()
        .map(|s| past_conversation(s - 1 - S1_TURN_ITEMS))
        .collect();
    let mut measured: Vec<Measured> = SIZES.iter().map(|_| Measured::default()).collect();
    for _ in 0..rounds {
        for (past, into) in pasts.iter().zip(&mut measured) {
            let setup = Setup {
                past: Some(past.clone()),
                ..Setup::default()
            };
            measure(engine, Scenario::S1, &setup, n, warmup, into).await;
        }
    }
    let (first_mean, first_p50) = {
        let s = stats(&measured[0].samples);
        (s.mean, s.p50)
    };
    for (size, m) in SIZES.iter().zip(&measured) {
        let s = stats(&m.samples);
        let fields = format!(
            r#""history_items":{size},"mean_vs_10_items":{:.3},"p50_vs_10_items":{:.3},"#,
            s.mean / first_mean,
            s.p50 / first_p50
        );
        report("S1_history", &fields, m);
    }
}

// Snapshot and restore (SPEC §14): the rows of issue 25.

/// The history sizes of the snapshot rows: chat items when the snapshot is taken.
const SNAPSHOT_SIZES: [usize; 4] = [10, 100, 1_000, 10_000];

/// The snapshot rows' knobs: rounds (the sizes alternate in them, so drift hits all),
/// timed samples per round and size, untimed ones before them.
fn snapshot_knobs() -> (usize, usize, usize) {
    let rounds = env("BENCH_SNAPSHOT_ROUNDS", 4).max(1);
    let n = env("BENCH_SNAPSHOT_N", 200).div_ceil(rounds).max(1);
    (rounds, n, env("BENCH_SNAPSHOT_WARMUP", 5))
}

fn micros(from: Instant, to: Instant) -> f64 {
    (to - from).as_secs_f64() * 1e6
}

/// A snapshot row's session: S1's agent and session toolset (an async tool, one update,
/// its `/finished` and the deferred reply), with `past` as its chat from the start
/// (`StartingChat::given`: the history is in place before the first turn, without a turn
/// or a hook per item), saving to `store` if given.
async fn snapshot_session(
    engine: &Engine,
    past: &[ChatItem],
    store: Option<Arc<dyn SnapshotStore>>,
) -> Session {
    let (count, requests) = watch::channel(0);
    let given = StartingChat::given(ChatContext::from(past.to_vec())).unwrap();
    let mut builder = Session::builder()
        .llm(llm_timed(Some("work"), 1, None, Some(count)))
        .agent(Agent::builder("a").starting_chat(given).build().unwrap())
        .toolset(Toolset::new("async").tool(async_tool(1, None, Some(requests))));
    if let Some(store) = store {
        builder = builder.save_snapshots(store);
    }
    builder.start(engine).await.unwrap()
}

/// One S1 turn until the session settled: `S1_TURN_ITEMS` more chat items.
async fn s1_turn(session: &Session) {
    session.run("go").await.unwrap();
    session.wait_for_settled().await.unwrap();
}

/// The past of a session that holds `size` items after one S1 turn.
fn snapshot_pasts() -> Vec<Arc<[ChatItem]>> {
    SNAPSHOT_SIZES
        .iter()
        .map(|size| past_conversation(size.saturating_sub(S1_TURN_ITEMS)))
        .collect()
}

/// A session holding `past.len() + S1_TURN_ITEMS` items: `past` given, then one settled
/// S1 turn (untimed: the session has run and its tool has finished, as a session being
/// saved between turns has).
async fn session_at(
    engine: &Engine,
    past: &[ChatItem],
    store: Option<Arc<dyn SnapshotStore>>,
) -> Session {
    let session = snapshot_session(engine, past, store).await;
    s1_turn(&session).await;
    session
}

/// One line of a snapshot row: `total` as mean / p50 / p99 / max, each of `parts` as its
/// mean, then `extra` (`,"k":v` each).
fn snapshot_line(label: &str, size: usize, total: &[f64], parts: &[(&str, &[f64])], extra: &str) {
    let s = stats(total);
    let parts: String = parts
        .iter()
        .map(|(name, samples)| format!(r#","{name}_mean_us":{:.1}"#, stats(samples).mean))
        .collect();
    println!(
        r#"{{"scenario":"{label}","history_items":{size},"n":{},"mean_us":{:.1},"p50_us":{:.1},"p99_us":{:.1},"max_us":{:.1}{parts}{extra}}}"#,
        total.len(),
        s.mean,
        s.p50,
        s.p99,
        s.max
    );
}

/// `snapshot_full`: `Session::snapshot()` then `to_bytes()` on a settled session of each
/// size (one session per size and round, asked again and again: each ask writes the whole
/// snapshot anew); `to_json()` timed apart, and both sizes.
async fn snapshot_full(engine: &Engine, pasts: &[Arc<[ChatItem]>]) {
    let (rounds, n, warmup) = snapshot_knobs();
    let mut taken: Vec<[Vec<f64>; 4]> = SNAPSHOT_SIZES.iter().map(|_| Default::default()).collect();
    let mut sizes = vec![(0, 0); SNAPSHOT_SIZES.len()];
    for _ in 0..rounds {
        for (i, past) in pasts.iter().enumerate() {
            let session = session_at(engine, past, None).await;
            for k in 0..warmup + n {
                let start = Instant::now();
                let snapshot = session.snapshot().await.unwrap();
                let asked = Instant::now();
                let bytes = snapshot.to_bytes();
                let encoded = Instant::now();
                let json = snapshot.to_json();
                let written = Instant::now();
                if k >= warmup {
                    let [total, ask, binary, text] = &mut taken[i];
                    total.push(micros(start, encoded));
                    ask.push(micros(start, asked));
                    binary.push(micros(asked, encoded));
                    text.push(micros(encoded, written));
                    sizes[i] = (bytes.len(), json.len());
                }
            }
            let items = session.chat_context().await.unwrap().len();
            assert_eq!(items, SNAPSHOT_SIZES[i], "history not in place");
            session.close().await.unwrap();
        }
    }
    for ((size, [total, ask, binary, text]), (bytes, json)) in
        SNAPSHOT_SIZES.iter().zip(&taken).zip(&sizes)
    {
        let extra = format!(r#","bytes":{bytes},"json_bytes":{json}"#);
        snapshot_line(
            "snapshot_full",
            *size,
            total,
            &[("snapshot", ask), ("to_bytes", binary), ("to_json", text)],
            &extra,
        );
    }
}

/// `snapshot_delta` (and `snapshot_file_append` with `file`): a fresh session per sample at
/// each size, its chain started with a full snapshot (and, with `file`, that snapshot
/// saved to it), one more settled S1 turn, then `Session::snapshot_update()` (a delta)
/// and `to_bytes()`, timed; with `file`, `FileStore::append` of the delta is timed.
async fn snapshot_delta(engine: &Engine, pasts: &[Arc<[ChatItem]>], file: Option<&FileStore>) {
    let (rounds, n, warmup) = snapshot_knobs();
    let mut taken: Vec<[Vec<f64>; 3]> = SNAPSHOT_SIZES.iter().map(|_| Default::default()).collect();
    let mut sizes = vec![(0, 0); SNAPSHOT_SIZES.len()];
    for _ in 0..rounds {
        for (i, past) in pasts.iter().enumerate() {
            for k in 0..warmup + n {
                let session = session_at(engine, past, None).await;
                let full = session.snapshot().await.unwrap();
                // A writer claims the session, then saves the full snapshot after its claim.
                let mut after = None;
                if let Some(store) = file {
                    let claim = store
                        .claim(session.id().as_str(), ClaimRule::Takeover { at_least: 0 })
                        .await
                        .unwrap()
                        .claim;
                    after = Some(store.save(full.clone(), claim.version()).await.unwrap());
                }
                // Kept only for the check below: a host that saved it would have let it go.
                let full = (file.is_some() && k == warmup).then_some(full);
                s1_turn(&session).await;
                let start = Instant::now();
                let update = session.snapshot_update().await.unwrap();
                let asked = Instant::now();
                let SnapshotUpdate::Delta(delta) = update else {
                    panic!("a full snapshot after the chain started")
                };
                let bytes = delta.to_bytes();
                let encoded = Instant::now();
                assert_eq!(delta.items(), S1_TURN_ITEMS, "the delta is the turn");
                let json = delta.to_json().len();
                // Kept for the check below only (outside the timed append).
                let check = full.as_ref().map(|_| delta.clone());
                let appending = Instant::now();
                let appended = match file {
                    Some(store) => {
                        let after = after.expect("saved above");
                        store.append(delta, after).await.unwrap();
                        Instant::now()
                    }
                    None => appending,
                };
                if k >= warmup {
                    let [ask, binary, append] = &mut taken[i];
                    ask.push(micros(start, asked));
                    binary.push(micros(asked, encoded));
                    append.push(micros(appending, appended));
                    sizes[i] = (bytes.len(), json);
                }
                if let Some(store) = file {
                    if let (Some(mut expected), Some(delta)) = (full, check) {
                        // What the files hold reads back as the snapshot with the delta.
                        expected.apply(&delta).unwrap();
                        let loaded = store.load(session.id().as_str()).await.unwrap();
                        assert_eq!(loaded, Some(expected), "the file store lost the delta");
                    }
                    store.remove(session.id().as_str()).await.unwrap();
                }
                session.close().await.unwrap();
            }
        }
    }
    let first = stats(&taken[0][0]).mean + stats(&taken[0][1]).mean;
    for ((size, [ask, binary, append]), (bytes, json)) in
        SNAPSHOT_SIZES.iter().zip(&taken).zip(&sizes)
    {
        let extra =
            format!(r#","delta_items":{S1_TURN_ITEMS},"bytes":{bytes},"json_bytes":{json}"#);
        match file {
            None => {
                let total: Vec<f64> = ask.iter().zip(binary).map(|(a, b)| a + b).collect();
                let ratio = stats(&total).mean / first;
                let extra = format!(r#"{extra},"mean_vs_10_items":{ratio:.3}"#);
                snapshot_line(
                    "snapshot_delta",
                    *size,
                    &total,
                    &[("snapshot_update", ask), ("to_bytes", binary)],
                    &extra,
                );
            }
            Some(_) => snapshot_line("snapshot_file_append", *size, append, &[], &extra),
        }
    }
}

/// `snapshot_delta_chain`: per size and round, one session, a full snapshot, then
/// `BENCH_SNAPSHOT_CHAIN` (64) settled S1 turns each followed by a timed
/// `snapshot_update()` + `to_bytes()`, as a session saving after every turn does. The
/// history grows by 7 items a turn, so the chat's log fills and moves (it doubles) during
/// the chain at some sizes: the delta right after such a move cannot tell appended items
/// from rewritten ones by the log alone. The first link (the `snapshot_delta` case: right
/// after the full snapshot) is reported apart from the later ones.
async fn snapshot_delta_chain(engine: &Engine, pasts: &[Arc<[ChatItem]>]) {
    let (rounds, _, _) = snapshot_knobs();
    let turns = env("BENCH_SNAPSHOT_CHAIN", 64).max(1);
    let mut taken: Vec<Vec<f64>> = SNAPSHOT_SIZES.iter().map(|_| Vec::new()).collect();
    for _ in 0..rounds {
        for (i, past) in pasts.iter().enumerate() {
            let session = session_at(engine, past, None).await;
            session.snapshot().await.unwrap();
            for _ in 0..turns {
                s1_turn(&session).await;
                let start = Instant::now();
                let SnapshotUpdate::Delta(delta) = session.snapshot_update().await.unwrap() else {
                    panic!("a full snapshot after the chain started")
                };
                let _bytes = delta.to_bytes();
                taken[i].push(micros(start, Instant::now()));
                assert_eq!(delta.items(), S1_TURN_ITEMS, "the delta is the turn");
            }
            session.close().await.unwrap();
        }
    }
    for (size, total) in SNAPSHOT_SIZES.iter().zip(&taken) {
        // The first link of each chain (right after the full snapshot) apart from the rest.
        let first: Vec<f64> = total.iter().copied().step_by(turns).collect();
        let later: Vec<f64> = total
            .iter()
            .enumerate()
            .filter(|(at, _)| at % turns != 0)
            .map(|(_, us)| *us)
            .collect();
        let mean = |links: &[f64]| links.iter().sum::<f64>() / links.len().max(1) as f64;
        let later_p50 = if later.is_empty() {
            0.0
        } else {
            stats(&later).p50
        };
        let extra = format!(
            r#","turns":{turns},"history_items_at_end":{},"first_link_mean_us":{:.1},"later_links_mean_us":{:.1},"later_links_p50_us":{later_p50:.1}"#,
            size + turns * S1_TURN_ITEMS,
            mean(&first),
            mean(&later),
        );
        snapshot_line("snapshot_delta_chain", *size, total, &[], &extra);
    }
}

/// `snapshot_restore` and `snapshot_restore_reply`: per size, the binary snapshot of a
/// settled session (taken once per round), then per sample `SessionSnapshot::from_bytes` +
/// `SessionBuilder::restore(..).start()` on the same arbiter, then until it answers:
/// `chat_context()` (relayed to the restored activity) or, with `reply`, a `run()` on a
/// `ScriptedLlm` answering text until its `RunResult`. The restoring builder has the
/// original's session toolset (code, not state).
async fn snapshot_restore(engine: &Engine, pasts: &[Arc<[ChatItem]>], reply: bool) {
    let (rounds, n, warmup) = snapshot_knobs();
    let agents = AgentRegistry::new().agent("a", |_| Agent::builder("a").build());
    let mut taken: Vec<[Vec<f64>; 3]> = SNAPSHOT_SIZES.iter().map(|_| Default::default()).collect();
    let mut sizes = vec![0; SNAPSHOT_SIZES.len()];
    for _ in 0..rounds {
        for (i, past) in pasts.iter().enumerate() {
            let bytes = {
                let session = session_at(engine, past, None).await;
                let bytes = session.snapshot().await.unwrap().to_bytes();
                session.close().await.unwrap();
                bytes
            };
            sizes[i] = bytes.len();
            for k in 0..warmup + n {
                let llm = llm_calling(None, 0);
                let start = Instant::now();
                let snapshot = SessionSnapshot::from_bytes(&bytes).unwrap();
                let read = Instant::now();
                let session = Session::builder()
                    .llm(llm.clone())
                    .toolset(Toolset::new("async").tool(async_tool(1, None, None)))
                    .restore(snapshot, agents.clone())
                    .start(engine)
                    .await
                    .unwrap();
                let started = Instant::now();
                if reply {
                    session.run("and now?").await.unwrap();
                } else {
                    let chat = session.chat_context().await.unwrap();
                    assert_eq!(chat.len(), SNAPSHOT_SIZES[i], "restored history");
                }
                let answered = Instant::now();
                if reply {
                    let requests = llm.requests();
                    assert_eq!(requests.len(), 1, "one request for the first reply");
                    assert_eq!(requests[0].chat.len(), SNAPSHOT_SIZES[i] + 1);
                }
                if k >= warmup {
                    let [total, from_bytes, start_] = &mut taken[i];
                    total.push(micros(start, answered));
                    from_bytes.push(micros(start, read));
                    start_.push(micros(read, started));
                }
                session.close().await.unwrap();
            }
        }
    }
    let label = if reply {
        "snapshot_restore_reply"
    } else {
        "snapshot_restore"
    };
    for ((size, [total, from_bytes, start]), bytes) in SNAPSHOT_SIZES.iter().zip(&taken).zip(&sizes)
    {
        snapshot_line(
            label,
            *size,
            total,
            &[("from_bytes", from_bytes), ("restore_start", start)],
            &format!(r#","bytes":{bytes}"#),
        );
    }
}

/// `snapshot_save_turn`: S1 turns back to back on one session, without and with
/// `save_snapshots(MemoryStore)`, in alternating rounds; per round and setting a fresh
/// session at 10 and at 10,000 items (one untimed turn, whose save is the chain's full
/// snapshot), then `BENCH_SNAPSHOT_SAVE_TURNS` (128) timed turns. A save starts when the
/// turn settles and new work waits until its parts are collected, so its cost lands in
/// the next turn's time (the driving task runs nothing between two turns).
async fn snapshot_save_turn(engine: &Engine, pasts: &[Arc<[ChatItem]>]) {
    let (rounds, _, _) = snapshot_knobs();
    let turns = env("BENCH_SNAPSHOT_SAVE_TURNS", 128).max(1);
    for (i, past) in pasts.iter().enumerate() {
        if i != 0 && i != pasts.len() - 1 {
            continue;
        }
        let mut taken = [Vec::new(), Vec::new()];
        let mut links = 0;
        for _ in 0..rounds {
            for (saving, into) in taken.iter_mut().enumerate() {
                let store = (saving == 1).then(MemoryStore::new);
                let session = session_at(
                    engine,
                    past,
                    store.clone().map(|s| Arc::new(s) as Arc<dyn SnapshotStore>),
                )
                .await;
                s1_turn(&session).await;
                for _ in 0..turns {
                    let start = Instant::now();
                    s1_turn(&session).await;
                    into.push(micros(start, Instant::now()));
                }
                if let Some(store) = store {
                    // The chain's last link in the store: one per settled turn.
                    let saved = store.load(session.id().as_str()).await.unwrap().unwrap();
                    links = saved.seq() + 1;
                }
                session.close().await.unwrap();
            }
        }
        let off = stats(&taken[0]).mean;
        for (saving, samples) in taken.iter().enumerate() {
            let extra = if saving == 1 {
                format!(
                    r#","saving":true,"turns":{turns},"links_saved":{links},"overhead_mean_us":{:.1}"#,
                    stats(samples).mean - off
                )
            } else {
                format!(r#","saving":false,"turns":{turns}"#)
            };
            snapshot_line(
                "snapshot_save_turn",
                SNAPSHOT_SIZES[i],
                samples,
                &[],
                &extra,
            );
        }
    }
}

/// `abandon_call_record`: see the module docs.
async fn abandon_call_record(engine: &Engine) {
    let (rounds, _, _) = snapshot_knobs();
    let turns = env("BENCH_RECORD_TURNS", 128).max(1);
    let dir = std::env::var("BENCH_SNAPSHOT_DIR").map_or_else(
        |_| std::env::temp_dir().join(format!("switchboard-record-{}", std::process::id())),
        std::path::PathBuf::from,
    );
    const STORES: [&str; 3] = ["none", "memory", "file"];
    const POLICIES: [RestorePolicy; 2] = [RestorePolicy::Restart, RestorePolicy::Abandon];
    let mut taken: Vec<Vec<f64>> = vec![Vec::new(); STORES.len() * POLICIES.len()];
    let mut n = 0;
    for _ in 0..rounds {
        for (s, store) in STORES.iter().enumerate() {
            for (p, policy) in POLICIES.iter().enumerate() {
                n += 1;
                let tool = Tool::new("charge", "Charges", |_ctx: RunContext, _: NoArgs| async {
                    Ok::<_, ToolFailure>("charged")
                })
                .on_restore(*policy);
                let mut builder = Session::builder()
                    .llm(llm_calling(Some("charge"), 1))
                    .agent(Agent::builder("a").tool(tool).build().unwrap())
                    .id(format!("record-{n}"));
                builder = match *store {
                    "memory" => builder.save_snapshots(Arc::new(MemoryStore::new())),
                    "file" => builder.save_snapshots(Arc::new(FileStore::new(&dir).unwrap())),
                    _ => builder,
                };
                let session = builder.start(engine).await.unwrap();
                // Untimed: the first turn (the store's first full snapshot).
                session.run("go").await.unwrap();
                session.wait_for_settled().await.unwrap();
                for _ in 0..turns {
                    let start = Instant::now();
                    session.run("go").await.unwrap();
                    session.wait_for_settled().await.unwrap();
                    taken[s * POLICIES.len() + p].push(micros(start, Instant::now()));
                }
                session.close().await.unwrap();
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    for (s, store) in STORES.iter().enumerate() {
        let restart = stats(&taken[s * POLICIES.len()]);
        for (p, policy) in POLICIES.iter().enumerate() {
            let samples = &taken[s * POLICIES.len() + p];
            let st = stats(samples);
            println!(
                r#"{{"scenario":"abandon_call_record","store":"{store}","policy":"{policy:?}","n":{},"mean_us":{:.1},"p50_us":{:.1},"p99_us":{:.1},"max_us":{:.1},"over_restart_p50_us":{:.1}}}"#,
                samples.len(),
                st.mean,
                st.p50,
                st.p99,
                st.max,
                st.p50 - restart.p50
            );
        }
    }
}

/// The snapshot rows `BENCH_SCENARIOS` asks for.
async fn snapshot_rows(engine: &Engine) {
    const LABELS: [&str; 8] = [
        "snapshot_full",
        "snapshot_delta",
        "snapshot_delta_chain",
        "snapshot_restore",
        "snapshot_restore_reply",
        "snapshot_save_turn",
        "snapshot_file_append",
        "abandon_call_record",
    ];
    if !LABELS.iter().any(|label| wanted(label)) {
        return;
    }
    let pasts = snapshot_pasts();
    if wanted("snapshot_full") {
        snapshot_full(engine, &pasts).await;
    }
    if wanted("snapshot_delta") {
        snapshot_delta(engine, &pasts, None).await;
    }
    if wanted("snapshot_delta_chain") {
        snapshot_delta_chain(engine, &pasts).await;
    }
    if wanted("snapshot_restore") {
        snapshot_restore(engine, &pasts, false).await;
    }
    if wanted("snapshot_restore_reply") {
        snapshot_restore(engine, &pasts, true).await;
    }
    if wanted("snapshot_save_turn") {
        snapshot_save_turn(engine, &pasts).await;
    }
    if wanted("abandon_call_record") {
        abandon_call_record(engine).await;
    }
    if wanted("snapshot_file_append") {
        let dir = std::env::var("BENCH_SNAPSHOT_DIR").map_or_else(
            |_| std::env::temp_dir().join(format!("switchboard-bench-{}", std::process::id())),
            std::path::PathBuf::from,
        );
        let store = FileStore::new(&dir).unwrap();
        snapshot_delta(engine, &pasts, Some(&store)).await;
        let _ = std::fs::remove_dir_all(&dir);
    }
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

/// Starts `count` sessions from `tasks` tasks of the current tokio runtime, each task
/// starting its share one after another (as a host accepting calls on several
/// connections would); the engine places them round robin over its arbiters. Returns
/// each task's sessions and the wall time.
async fn start_many(
    engine: &Engine,
    session: impl Fn() -> SessionBuilder + Clone + Send + 'static,
    count: usize,
    tasks: usize,
) -> (Vec<Vec<Session>>, f64) {
    let wall = Instant::now();
    let started: Vec<_> = (0..tasks)
        .map(|t| {
            let share = count / tasks + usize::from(t < count % tasks);
            let (engine, session) = (engine.clone(), session.clone());
            tokio::spawn(async move {
                let mut mine = Vec::with_capacity(share);
                for _ in 0..share {
                    mine.push(session().start(&engine).await.unwrap());
                }
                mine
            })
        })
        .collect();
    let mut all = Vec::with_capacity(tasks);
    for task in started {
        all.push(task.await.unwrap());
    }
    (all, wall.elapsed().as_secs_f64())
}

/// Closes every session, each task of [`start_many`]'s its own share; `close()` resolves
/// once every actor of its session is gone. Returns the wall time.
async fn close_many(sessions: Vec<Vec<Session>>) -> f64 {
    let wall = Instant::now();
    let closing: Vec<_> = sessions
        .into_iter()
        .map(|mine| {
            tokio::spawn(async move {
                for session in mine {
                    session.close().await.unwrap();
                }
            })
        })
        .collect();
    for task in closing {
        task.await.unwrap();
    }
    wall.elapsed().as_secs_f64()
}

/// S3_scale: `BENCH_SCALE_SESSIONS` idle sessions in one process, from a tokio host
/// over `Engine::start()` (one arbiter per core, sessions round robin). All sessions share
/// one agent and one model, as an embedding shares its provider client (S3 gives each
/// session a model of its own). Three batches, each started in full and then closed:
///
/// 1. the engine as a host gets it: start and close rates, RSS growth per session, and
///    RSS once the engine has released by itself (`IdleRelease::AFTER_BURST`, set for
///    this batch: the default is `Never`; the last session is gone) with how long after the last `close()` returned that came, against
///    RSS before the batch (itself taken after a release, so that memory freed by earlier
///    scenarios does not absorb the growth);
/// 2. the same with `IdleRelease::Never`: RSS after close shows what the allocator keeps
///    without a release, and whether the pages are reused (about the first batch's peak)
///    or leaked (growing); then `Engine::release_memory`, how long it took, RSS after;
/// 3. inspection on (journal of 1 message per actor), only to count live actors: while
///    the sessions are held, and after they closed. Its RSS includes the journals.
async fn scale(engine: &Engine) {
    let count = env("BENCH_SCALE_SESSIONS", 100_000).max(1);
    let tasks = env("BENCH_SCALE_TASKS", 16).clamp(1, count);
    let agent = Agent::builder("a").build().unwrap();
    let llm: Arc<dyn Llm> = llm_calling(None, 0);
    let plain = {
        let (agent, llm) = (agent.clone(), llm.clone());
        move || Session::builder().llm(llm.clone()).agent(agent.clone())
    };
    let inspected = move || {
        Session::builder()
            .llm(llm.clone())
            .agent(agent.clone())
            .inspect(true)
            .journal_capacity(1)
    };
    let policy = engine.idle_release();
    // Warm the code paths and each thread's allocator outside the measurement.
    let (warm, _) = start_many(engine, plain.clone(), tasks * 4, tasks).await;
    close_many(warm).await;
    // Free memory kept from the scenarios before this one would hide the growth.
    engine.release_memory().await;

    engine.set_idle_release(IdleRelease::AFTER_BURST);
    let before = rss_kib();
    let mut releases = engine.idle_releases();
    let (sessions, start_wall) = start_many(engine, plain.clone(), count, tasks).await;
    let with_them = rss_kib();
    assert_eq!(sessions.iter().map(Vec::len).sum::<usize>(), count);
    let close_wall = close_many(sessions).await;
    let closed_at = Instant::now();
    // Bounded: a session another scenario left live would hold the release back for ever.
    let idle = tokio::time::timeout(std::time::Duration::from_secs(60), releases.next())
        .await
        .expect("no idle release within 60 s of the last close: is a session still live?")
        .expect("the engine is alive");
    let idle_release_ms = closed_at.elapsed().as_secs_f64() * 1e3;
    let after_idle_release = rss_kib();

    engine.set_idle_release(IdleRelease::Never);
    let (again, _) = start_many(engine, plain, count, tasks).await;
    let with_second = rss_kib();
    close_many(again).await;
    let after_close = rss_kib();
    let release_wall = Instant::now();
    let released = engine.release_memory().await;
    let release_ms = release_wall.elapsed().as_secs_f64() * 1e3;
    let after_release = rss_kib();
    engine.set_idle_release(policy);

    let (sessions, _) = start_many(engine, inspected, count, tasks).await;
    let rss_inspected = rss_kib();
    let inspectors: Vec<Inspector> = sessions
        .iter()
        .flatten()
        .map(|s| s.inspector().unwrap())
        .collect();
    let live_held: usize = inspectors.iter().map(|i| i.live_actors().len()).sum();
    close_many(sessions).await;
    let live_after: usize = inspectors.iter().map(|i| i.live_actors().len()).sum();
    drop(inspectors);
    let after_inspected = rss_kib();
    engine.release_memory().await;

    let growth = with_them.saturating_sub(before);
    println!(
        r#"{{"scenario":"S3_scale","sessions":{count},"tasks":{tasks},"arbiters":{},"start_wall_s":{start_wall:.3},"start_per_s":{:.0},"close_wall_s":{close_wall:.3},"close_per_s":{:.0},"rss_before_kib":{before},"rss_with_sessions_kib":{with_them},"rss_per_session_kib":{:.2},"idle_release":"{:?}","idle_release_peak_live":{},"idle_release_ms":{idle_release_ms:.1},"rss_after_idle_release_kib":{after_idle_release},"rss_after_idle_release_over_before":{:.3},"rss_with_second_batch_kib":{with_second},"rss_after_close_kib":{after_close},"rss_after_close_over_before":{:.3},"rss_kept_of_growth":{:.3},"release_memory":"{released:?}","release_ms":{release_ms:.1},"rss_after_release_kib":{after_release},"rss_after_release_over_before":{:.3},"live_actors_held":{live_held},"live_actors_per_session":{:.2},"live_actors_after_close":{live_after},"rss_with_inspected_sessions_kib":{rss_inspected},"rss_per_inspected_session_kib":{:.2},"rss_after_inspected_batch_kib":{after_inspected}}}"#,
        engine.arbiters(),
        count as f64 / start_wall,
        count as f64 / close_wall,
        growth as f64 / count as f64,
        idle.release,
        idle.peak_live,
        after_idle_release as f64 / before as f64,
        after_close as f64 / before as f64,
        after_close.saturating_sub(before) as f64 / growth.max(1) as f64,
        after_release as f64 / before as f64,
        live_held as f64 / count as f64,
        rss_inspected.saturating_sub(after_release) as f64 / count as f64,
    );
}

/// S3_abandoned: `BENCH_S3_SESSIONS` sessions, each with a tool still running in the
/// background, held, then all their handles dropped at once without `close()`: the live
/// actors while they are held, how long after the drop until no actor of any of them is
/// alive, and the RSS before, with them held, after the cleanup and after a second batch
/// (memory reused, not leaked).
///
/// The handles are kept until every session has started: the host's last handle dropping
/// is what closes a session (like `close()`), so a batch that dropped each one as it went
/// would count and weigh sessions that were already stopping.
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
    // Each session with its tool running, and its inspector (which keeps no actor alive).
    // A model per batch: it keeps every request it answered (with its chat snapshot),
    // which must go with the batch, not count as memory the engine kept.
    let batch = |count: usize| {
        let (agent, llm) = (agent.clone(), llm_calling(Some("background"), 1));
        async move {
            let mut held = Vec::with_capacity(count);
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
                let inspector = session.inspector().unwrap();
                held.push((session, inspector));
            }
            held
        }
    };
    let live = |inspectors: &[Inspector]| -> usize {
        inspectors.iter().map(|i| i.live_actors().len()).sum()
    };
    // Drops every handle, then waits until every actor of every session is gone.
    let abandon = |held: Vec<(Session, Inspector)>| async move {
        let (sessions, inspectors): (Vec<Session>, Vec<Inspector>) = held.into_iter().unzip();
        let wall = Instant::now();
        drop(sessions);
        for inspector in &inspectors {
            inspector
                .wait_until_all_stopped(std::time::Duration::from_secs(60))
                .await
                .unwrap();
        }
        (wall.elapsed().as_secs_f64(), inspectors)
    };
    // Warm the code paths outside the measurement, like S3.
    let (_, warm) = abandon(batch(5).await).await;
    drop(warm);

    let before = rss_kib();
    let held = batch(count).await;
    let with_them = rss_kib();
    let inspectors: Vec<Inspector> = held.iter().map(|(_, i)| i.clone()).collect();
    let live_before = live(&inspectors);
    drop(inspectors);
    let (cleanup, inspectors) = abandon(held).await;
    let live_after = live(&inspectors);
    drop(inspectors);
    let after_cleanup = rss_kib();
    let (_, second) = abandon(batch(count).await).await;
    drop(second);
    let after_second = rss_kib();
    println!(
        r#"{{"scenario":"S3_abandoned","sessions":{count},"live_actors_before_drop":{live_before},"live_actors_per_session":{:.2},"live_actors_after":{live_after},"cleanup_wall_s":{cleanup:.4},"rss_before_kib":{before},"rss_with_sessions_kib":{with_them},"rss_per_session_kib":{:.2},"rss_after_cleanup_kib":{after_cleanup},"rss_after_second_batch_kib":{after_second}}}"#,
        live_before as f64 / count as f64,
        with_them.saturating_sub(before) as f64 / count as f64,
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

/// A session whose turn streams a speech, then its model stalls (marking `dropped` when
/// its stream is dropped): once the speech is announced, the session, its events and the
/// turn.
async fn stalled_speech(
    engine: &Engine,
    output: StopWatchOutput,
    dropped: Arc<Mutex<Option<Instant>>>,
) -> (
    Session,
    tokio::sync::broadcast::Receiver<SessionEvent>,
    tokio::task::JoinHandle<Result<switchboard::RunResult, switchboard::SessionError>>,
) {
    let session = Session::builder()
        .llm(Arc::new(HelloThenStall { dropped }))
        .agent(Agent::builder("a").build().unwrap())
        .output(output)
        .min_interruption_duration(std::time::Duration::ZERO)
        .turn_handling(turn_handling())
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
    (session, events, turn)
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
        let (session, _events, turn) =
            stalled_speech(engine, output.clone(), dropped.clone()).await;
        // With a word rule the voice alone does not interrupt: the words do.
        let start = if turns_on() {
            session.user_started_speaking();
            let start = Instant::now();
            session.transcript("wait, stop", false);
            start
        } else {
            let start = Instant::now();
            session.user_started_speaking();
            start
        };
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

/// V3 backchannel (with `BENCH_TURNS=on`): a speech plays (its model stalls after the
/// first text); the user says "uh-huh" over it. Timed: from the final `transcript()` to
/// the `UserWordsIgnored` event (the boundary is off, so the words are judged at once).
async fn backchannel(engine: &Engine) {
    let (n, warmup) = (env("BENCH_N", 2000), env("BENCH_WARMUP", 200));
    let mut samples = Vec::with_capacity(n);
    let (session, mut events, turn) =
        stalled_speech(engine, StopWatchOutput::default(), Arc::default()).await;
    for i in 0..warmup + n {
        session.user_started_speaking();
        session.user_stopped_speaking();
        let start = Instant::now();
        session.transcript("uh-huh", true);
        while let Ok(event) = events.recv().await {
            if matches!(event, SessionEvent::UserWordsIgnored { .. }) {
                break;
            }
        }
        if i >= warmup {
            samples.push(start.elapsed().as_secs_f64() * 1e6);
        }
    }
    session.close().await.unwrap();
    let _ = turn.await;
    let s = stats(&samples);
    println!(
        r#"{{"scenario":"V3_backchannel","n":{n},"mean_us":{:.1},"p50_us":{:.1},"p99_us":{:.1},"max_us":{:.1},"over_1ms":{}}}"#,
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
            .turn_handling(turn_handling())
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
        let (count, requests) = watch::channel(0);
        let llm = llm_timed(Some("work"), 1, None, Some(count));
        let session = Session::builder()
            .llm(llm.clone())
            .agent(
                Agent::builder("a")
                    .tool(async_tool(k, None, Some(requests)))
                    .build()
                    .unwrap(),
            )
            .start(engine)
            .await
            .unwrap();
        let start = Instant::now();
        session.run("go").await.unwrap();
        session.wait_for_settled().await.unwrap();
        let wall = start.elapsed().as_secs_f64();
        println!(
            r#"{{"scenario":"S4_burst","updates":{k},"llm_requests":{},"wall_ms":{:.2}}}"#,
            llm.request_count(),
            wall * 1e3
        );
        session.close().await.unwrap();
    }
}

/// What one S4 run did.
struct Throughput {
    sessions: usize,
    wall: f64,
    updates: usize,
    calls: usize,
    llm_requests: usize,
    /// Of several rounds: how many, and the slowest and fastest round's updates/s.
    rounds: Option<(usize, f64, f64)>,
}

impl Throughput {
    fn updates_per_s(&self) -> f64 {
        self.updates as f64 / self.wall
    }

    fn print(&self, label: &str) {
        let Self {
            sessions,
            wall,
            updates,
            calls,
            llm_requests,
            rounds,
        } = self;
        let rounds = match rounds {
            Some((n, slowest, fastest)) => {
                format!(r#","rounds":{n},"updates_per_s_range":[{slowest:.0},{fastest:.0}]"#)
            }
            None => String::new(),
        };
        println!(
            r#"{{"scenario":"{label}","sessions":{sessions},"wall_s":{wall:.4},"updates":{updates},"tool_calls":{calls},"updates_per_s":{:.0},"tool_calls_per_s":{:.0},"llm_requests":{llm_requests},"llm_requests_per_session":{:.2}{rounds}}}"#,
            self.updates_per_s(),
            *calls as f64 / wall,
            *llm_requests as f64 / *sessions as f64,
        );
    }
}

/// [`throughput`] `BENCH_S4_ROUNDS` times (fresh sessions each round): the median round by
/// wall time, with the number of rounds and the slowest and fastest round's updates/s. One
/// round of S4 lasts a few tens of milliseconds, short enough for one descheduling of
/// the VM to halve it.
async fn throughput_rounds(engine: &Engine, label: &str, load: Load) -> Throughput {
    let rounds = env("BENCH_S4_ROUNDS", 5).max(1);
    let mut runs = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        runs.push(throughput(engine, label, load).await);
    }
    runs.sort_by(|a, b| a.wall.total_cmp(&b.wall));
    let fastest = runs[0].updates_per_s();
    let slowest = runs[rounds - 1].updates_per_s();
    let mut median = runs.swap_remove(rounds / 2);
    median.rounds = Some((rounds, slowest, fastest));
    median
}

/// The work of one throughput round: named, because S4 and S4_parallel differ only in
/// which of `turns` and `calls` is 1.
#[derive(Clone, Copy)]
struct Load {
    /// Sessions, all driven at once.
    sessions: usize,
    /// Turns per session, one after another.
    turns: usize,
    /// Tool calls the model makes in each turn (run in parallel).
    calls: usize,
    /// Driven from tasks of the tokio host (`tokio::spawn`) rather than actix tasks.
    on_tokio: bool,
}

/// S4: `sessions` sessions started first (untimed, like the peer), then all driven at
/// once: `turns` turns each of `calls` tool calls with `BENCH_S4_UPDATES` updates per
/// call. Each turn is `run()` then `wait_for_settled()` (the peer's `run()` waits for the
/// deferred reply). The clock stops when every session has settled.
async fn throughput(engine: &Engine, label: &str, load: Load) -> Throughput {
    let Load {
        sessions,
        turns,
        calls,
        on_tokio,
    } = load;
    let updates = env("BENCH_S4_UPDATES", 3);
    let counter = Arc::new((AtomicUsize::new(0), AtomicUsize::new(0)));
    let mut started = Vec::with_capacity(sessions);
    for _ in 0..sessions {
        let (llm, requests) = throughput_llm(calls);
        let tool = async_tool(updates, Some(counter.clone()), Some(requests.clone()))
            .on_duplicate(DuplicatePolicy::Allow);
        let session = Session::builder()
            .llm(llm)
            .agent(Agent::builder("a").build().unwrap())
            .toolset(Toolset::new("async").tool(tool))
            .start(engine)
            .await
            .unwrap();
        started.push((session, requests));
    }
    let start = Instant::now();
    let drive = |session: Session| async move {
        for _ in 0..turns {
            session.run("go").await.unwrap();
            session.wait_for_settled().await.unwrap();
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
    let llm_requests: usize = started.iter().map(|(_, requests)| *requests.borrow()).sum();
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
    Throughput {
        sessions,
        wall,
        updates: done_updates,
        calls: done_calls,
        llm_requests,
        rounds: None,
    }
}

/// CPU time (ns) used so far by each thread of this process, by thread id: which of the
/// engine's arbiters (actix names them `actix-rt|system:…`, slot 0), the workers of a
/// multi-thread tokio host (slot 1) and the rest (slot 2: the main thread, which is the
/// host of a current-thread runtime; the engine's system thread) it is, from
/// `/proc/self/task/*/schedstat`. Linux only; elsewhere empty.
fn thread_cpu_ns() -> std::collections::HashMap<String, (usize, u64)> {
    let mut threads = std::collections::HashMap::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return threads;
    };
    for task in tasks.flatten() {
        let path = task.path();
        let name = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        let ran: u64 = std::fs::read_to_string(path.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next().and_then(|n| n.parse().ok()))
            .unwrap_or(0);
        let slot = if name.starts_with("actix-rt") {
            0
        } else if name.starts_with("tokio-rt") {
            1
        } else {
            2
        };
        threads.insert(task.file_name().to_string_lossy().into_owned(), (slot, ran));
    }
    threads
}

/// CPU time per slot of [`thread_cpu_ns`] between two readings; a thread that ended in
/// between (an earlier engine's) is left out.
fn cpu_between(
    before: &std::collections::HashMap<String, (usize, u64)>,
    after: &std::collections::HashMap<String, (usize, u64)>,
) -> [u64; 3] {
    let mut split = [0; 3];
    for (tid, (slot, ran)) in after {
        let earlier = before.get(tid).map_or(0, |(_, ran)| *ran);
        split[*slot] += ran.saturating_sub(earlier);
    }
    split
}

/// S4_arbiters: S4 (sequential turns, one call each, `BENCH_ARBITER_TURNS` turns per
/// session) from tasks of a tokio host, on an engine of 1 arbiter and one of 2
/// (`Engine::with_arbiters`), alternating in `BENCH_ARBITER_ROUNDS` rounds after one
/// warm-up round (a fresh engine each run); the median updates/s of each and their ratio,
/// and the CPU the arbiters and the host used over the counted rounds (in vCPUs): the
/// host runs on the same 2 vCPUs as the arbiters, so what the host uses with one arbiter
/// is what two arbiters cannot have. `label` says which host: `S4_arbiters` a
/// current-thread runtime, `S4_arbiters_mt` a multi-thread one (2 workers).
async fn arbiter_scaling(label: &str) {
    let rounds = env("BENCH_ARBITER_ROUNDS", 7).max(1);
    let sessions = env("BENCH_S4_SESSIONS", 100);
    let turns = env("BENCH_ARBITER_TURNS", 30);
    let mut runs: [(Vec<f64>, [u64; 3], f64); 2] = Default::default();
    // Round 0 warms up (the first run of a process is slower) and is not counted.
    for round in 0..=rounds {
        for (arbiters, into) in [1, 2].into_iter().zip(runs.iter_mut()) {
            let engine = Engine::with_arbiters(arbiters).unwrap();
            assert_eq!(engine.arbiters(), arbiters);
            let before = thread_cpu_ns();
            let load = Load {
                sessions,
                turns,
                calls: 1,
                on_tokio: true,
            };
            let t = throughput(&engine, label, load).await;
            let after = thread_cpu_ns();
            if round > 0 {
                into.0.push(t.updates_per_s());
                for (sum, used) in into.1.iter_mut().zip(cpu_between(&before, &after)) {
                    *sum += used;
                }
                into.2 += t.wall;
            }
            engine.shutdown();
        }
    }
    let fields = |(per_round, cpu, wall): &mut (Vec<f64>, [u64; 3], f64)| {
        per_round.sort_by(|a, b| a.total_cmp(b));
        let median = per_round[per_round.len() / 2];
        let list = per_round
            .iter()
            .map(|x| format!("{x:.0}"))
            .collect::<Vec<_>>()
            .join(",");
        let share = |ns: u64| ns as f64 / 1e9 / *wall;
        let cpu = format!(
            r#"{{"arbiters":{:.2},"host_workers":{:.2},"main_and_rest":{:.2}}}"#,
            share(cpu[0]),
            share(cpu[1]),
            share(cpu[2])
        );
        (median, list, cpu)
    };
    let [one, two] = &mut runs;
    let ((m1, rounds_one, cpu_one), (m2, rounds_two, cpu_two)) = (fields(one), fields(two));
    println!(
        r#"{{"scenario":"{label}","sessions":{sessions},"turns":{turns},"rounds":{rounds},"updates_per_s_1_arbiter":{m1:.0},"updates_per_s_2_arbiters":{m2:.0},"ratio_2_to_1":{:.2},"rounds_1_arbiter":[{rounds_one}],"rounds_2_arbiters":[{rounds_two}],"vcpus_1_arbiter":{cpu_one},"vcpus_2_arbiters":{cpu_two}}}"#,
        m2 / m1
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

/// An actor that answers [`Ping`] and does nothing else: the floor under every row that
/// sends a message and awaits the answer.
struct Echo;

impl actix::Actor for Echo {
    type Context = actix::Context<Self>;
}

struct Ping;

impl actix::Message for Ping {
    type Result = ();
}

impl actix::Handler<Ping> for Echo {
    type Result = ();
    fn handle(&mut self, _: Ping, _: &mut Self::Context) {}
}

/// `round_trip` / `round_trip_host`: one actix message to an [`Echo`] actor and its answer,
/// awaited, with no engine code in it. Same arbiter: the actor on the arbiter of the
/// task that sends. Host: the actor on an arbiter thread started as `Engine::start()`
/// starts its own (an actix system thread, then `Arbiter::new()`), the sender a task of
/// the multi-thread tokio host. What a host row pays to cross threads and back before
/// any engine work, whichever engine; `run()` is one such round trip.
async fn round_trip(arbiter: Option<actix::ArbiterHandle>, label: &str) {
    use actix::Actor;
    let echo = match &arbiter {
        Some(arbiter) => Echo::start_in_arbiter(arbiter, |_| Echo),
        None => Echo.start(),
    };
    let (n, warmup) = (env("BENCH_N", 2000), env("BENCH_WARMUP", 200));
    let mut m = Measured::default();
    for i in 0..warmup + n {
        let start = Instant::now();
        echo.send(Ping).await.unwrap();
        let took = start.elapsed().as_secs_f64() * 1e6;
        if i >= warmup {
            m.samples.push(took);
            m.run_returned.push(took);
            // No model in this row: its report says 0 requests, and 0 µs to the last.
            m.last_request.push(0.0);
        }
    }
    report(label, "", &m);
}

/// An arbiter thread as `Engine::start()` makes one, for [`round_trip`]; stopped with
/// the returned system.
fn echo_arbiter() -> (actix::System, actix::ArbiterHandle) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runner = actix::System::new();
        let arbiter = runner.block_on(async {
            let arbiter = actix::Arbiter::new();
            tx.send((actix::System::current(), arbiter.handle()))
                .unwrap();
            arbiter
        });
        runner.run().unwrap();
        drop(arbiter);
    });
    rx.recv().unwrap()
}

/// Whether `BENCH_SCENARIOS` (a comma list; unset: all) asks for scenario `name`.
fn wanted(name: &str) -> bool {
    std::env::var("BENCH_SCENARIOS")
        .ok()
        .as_deref()
        .is_none_or(|o| o.split(',').any(|s| s.trim() == name))
}

/// The `telemetry` rows (docs/benchmark-history.md, the telemetry sitting): built with `--features telemetry`,
/// the run installs what a production host installs — `tracing-opentelemetry` over the
/// SDK's tracer with a batch span processor, and an SDK meter provider as the global one,
/// which the engine picks up when it is made — unless `BENCH_OTEL=none` (the feature
/// compiled in, no pipeline: `tracing` has no subscriber, the meter is the no-op one;
/// `BENCH_OTEL=metrics`: the meter provider only, no span pipeline).
/// Spans go to an exporter that drops them, metrics to an in-memory exporter read every
/// 60 s: the rows measure recording, not a network.
#[cfg(feature = "telemetry")]
fn install_telemetry() -> &'static str {
    use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
    use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
    use switchboard::telemetry::opentelemetry::{global, trace::TracerProvider as _};
    use tracing_subscriber::layer::SubscriberExt as _;

    /// Drops every span: the cost of making and ending them stays, the export's goes.
    #[derive(Debug)]
    struct Discard;
    impl SpanExporter for Discard {
        async fn export(&self, _batch: Vec<SpanData>) -> opentelemetry_sdk::error::OTelSdkResult {
            Ok(())
        }
    }

    let otel = std::env::var("BENCH_OTEL").unwrap_or_default();
    if otel == "none" {
        return "compiled";
    }
    let meter = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(InMemoryMetricExporter::default()).build())
        .build();
    global::set_meter_provider(meter);
    if otel == "metrics" {
        return "metrics";
    }
    let tracer = SdkTracerProvider::builder()
        .with_batch_exporter(Discard)
        .build();
    let layer = tracing_opentelemetry::layer().with_tracer(tracer.tracer("bench"));
    let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer));
    // Kept for the whole run: its batch processor's thread exports.
    static TRACER: std::sync::OnceLock<SdkTracerProvider> = std::sync::OnceLock::new();
    let _ = TRACER.set(tracer);
    "pipeline"
}

#[cfg(not(feature = "telemetry"))]
fn install_telemetry() -> &'static str {
    "off"
}

fn main() {
    let telemetry = install_telemetry();
    println!(r#"{{"telemetry":"{telemetry}"}}"#);
    println!(
        r#"{{"turns":"{}"}}"#,
        if turns_on() { "on" } else { "default" }
    );
    meta();
    let total = Instant::now();
    // Same arbiter: the session runs on the arbiter of the task that drives it. The driver
    // is a task spawned on the arbiter, as a host's code is, not the `block_on` future
    // itself: tokio polls the I/O driver (a system call) each time that one is woken, which
    // would charge every await of the driver with an `epoll_wait` no spawned task pays.
    let same_arbiter = async move {
        let engine = Engine::current().unwrap();
        for (scenario, label) in [
            (Scenario::S1, "S1"),
            (Scenario::S1Agent, "S1_agent"),
            (Scenario::S1b, "S1b"),
            (Scenario::S1c, "S1c"),
            (Scenario::S2, "S2"),
        ] {
            if wanted(label) {
                latency(&engine, scenario, Setup::default(), label).await;
            }
        }
        if wanted("round_trip") {
            round_trip(None, "round_trip").await;
        }
        let idle = Setup {
            idle_before: true,
            ..Setup::default()
        };
        for (scenario, label) in [
            (Scenario::S1, "S1_idle"),
            (Scenario::S1b, "S1b_idle"),
            (Scenario::S1c, "S1c_idle"),
        ] {
            if wanted(label) {
                latency(&engine, scenario, idle.clone(), label).await;
            }
        }
        if wanted("S1_history") {
            history_sizes(&engine).await;
        }
        if wanted("S1b_inspect") {
            inspect_on_off(&engine).await;
        }
        if wanted("S1_stalls") {
            stalls_on_off().await;
        }
        snapshot_rows(&engine).await;
        if wanted("S3") {
            idle_sessions(&engine).await;
        }
        if wanted("V1_barge_in") {
            barge_in(&engine).await;
        }
        if wanted("V2_streaming") {
            streaming(&engine).await;
        }
        if turns_on() && wanted("V3_backchannel") {
            backchannel(&engine).await;
        }
        if wanted("S3_abandoned") {
            abandoned_sessions(&engine).await;
        }
        let (sessions, calls) = (env("BENCH_S4_SESSIONS", 100), env("BENCH_S4_CALLS", 10));
        let sequential = Load {
            sessions,
            turns: calls,
            calls: 1,
            on_tokio: false,
        };
        if wanted("S4") {
            throughput_rounds(&engine, "S4", sequential)
                .await
                .print("S4");
        }
        if wanted("S4_1000") {
            let load = Load {
                sessions: 1000,
                ..sequential
            };
            throughput(&engine, "S4_1000", load).await.print("S4_1000");
        }
        if wanted("S4_parallel") {
            let load = Load {
                turns: 1,
                calls,
                ..sequential
            };
            throughput_rounds(&engine, "S4_parallel", load)
                .await
                .print("S4_parallel");
        }
        if wanted("S4_burst") {
            burst(&engine).await;
        }
    };
    actix::System::new().block_on(async {
        actix::spawn(same_arbiter)
            .await
            .expect("a same-arbiter scenario panicked")
    });
    // A tokio host: the engine on its own threads (one arbiter per core), driven from
    // tasks of the host's runtime.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        if wanted("round_trip_host") {
            let (system, arbiter) = echo_arbiter();
            tokio::spawn(async move { round_trip(Some(arbiter), "round_trip_host").await })
                .await
                .unwrap();
            system.stop();
        }
        let engine = Engine::start().unwrap();
        for (scenario, label) in [
            (Scenario::S1, "S1_host"),
            (Scenario::S1b, "S1b_host"),
            (Scenario::S1c, "S1c_host"),
            (Scenario::S2, "S2_host"),
        ] {
            if wanted(label) {
                let engine = engine.clone();
                tokio::spawn(
                    async move { latency(&engine, scenario, Setup::default(), label).await },
                )
                .await
                .unwrap();
            }
        }
        for (label, parallel) in [("S4_host", false), ("S4_parallel_host", true)] {
            if wanted(label) {
                let (sessions, calls) = (env("BENCH_S4_SESSIONS", 100), env("BENCH_S4_CALLS", 10));
                let (turns, per_turn) = if parallel { (1, calls) } else { (calls, 1) };
                let load = Load {
                    sessions,
                    turns,
                    calls: per_turn,
                    on_tokio: true,
                };
                throughput_rounds(&engine, label, load).await.print(label);
            }
        }
        if wanted("S3_scale") {
            scale(&engine).await;
        }
        engine.shutdown();
        if wanted("S4_arbiters_mt") {
            arbiter_scaling("S4_arbiters_mt").await;
        }
    });
    // The same from a current-thread tokio host: one host thread, no workers waking each
    // other, so the engine's own scaling shows.
    if wanted("S4_arbiters") {
        let host = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        host.block_on(async { tokio::spawn(arbiter_scaling("S4_arbiters")).await.unwrap() });
    }
    println!(
        r#"{{"meta":true,"total_wall_s":{:.2},"loadavg_1m":{}}}"#,
        total.elapsed().as_secs_f64(),
        json!(loadavg())
    );
}
