//! SPEC §2a, §16, issue 29: blocking work has a home, and stalls are reported.
//!
//! A tool body runs on its session's arbiter, a thread shared with other sessions. One
//! that blocks holds them all: the engine's stall monitor (`Engine::monitor_stalls`,
//! opt-in) reports the stalled arbiter, how long, and the session and tool call it was
//! polling. The same work handed to `RunContext::run_blocking` runs on tokio's blocking
//! pool: the other sessions of the arbiter go on meanwhile, and a cancelled call's await
//! returns at once.
//!
//! These tests block real threads — that is their point — so they run on an engine of two
//! arbiters in real time. No timing decides a pass: the blocking work waits on a latch the
//! test opens, and a turn that must be held is checked against a latch that is still
//! closed. Timeouts only bound a failure.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{Reply, ScriptedLlm};
use switchboard::{ArbiterStall, BlockingError, NoArgs, StallReports};
use tokio::sync::mpsc;
use tokio::time::timeout;

/// What bounds a wait that should end at once: a failure, never a pass.
const BOUND: Duration = Duration::from_secs(20);
/// The stall monitor's threshold: far above a loaded machine's scheduling delays.
const THRESHOLD: Duration = Duration::from_millis(200);

/// A latch a blocking thread waits on until the test opens it (bounded: a failed test
/// never leaves a thread behind for long).
#[derive(Clone, Default)]
struct Latch(Arc<(Mutex<bool>, Condvar)>);

impl Latch {
    fn open(&self) {
        *self.0 .0.lock().unwrap() = true;
        self.0 .1.notify_all();
    }

    /// Blocks the calling thread until the latch opens (or `BOUND` passes).
    fn wait(&self) -> bool {
        let (open, changed) = &*self.0;
        let guard = open.lock().unwrap();
        let (guard, _) = changed
            .wait_timeout_while(guard, BOUND, |open| !*open)
            .unwrap();
        *guard
    }
}

/// A model that calls `work` on a user's first message and then answers; any other
/// session's turn just answers.
fn model() -> Arc<ScriptedLlm> {
    let llm = ScriptedLlm::new([]);
    llm.rule(|req| {
        let asks_for_work = matches!(
            req.chat.items().last(),
            Some(ChatItem::Message(m)) if m.role == ChatRole::User && m.content == "do the work"
        );
        asks_for_work.then(|| Reply::tool_call("work", json!({})))
    });
    llm.otherwise(Reply::text("Done."));
    llm
}

async fn start(engine: &Engine, llm: Arc<ScriptedLlm>, tools: Vec<Tool>) -> Session {
    let mut agent = Agent::builder("agent");
    for tool in tools {
        agent = agent.tool(tool);
    }
    Session::builder()
        .llm(llm)
        .agent(agent.build().unwrap())
        .grace_period(BOUND * 2)
        .start(engine)
        .await
        .unwrap()
}

/// Waits for the first report `pick` accepts (other reports — a loaded machine's — are
/// skipped).
async fn report(stalls: &mut StallReports, pick: impl Fn(&ArbiterStall) -> bool) -> ArbiterStall {
    timeout(BOUND, async {
        loop {
            let stall = stalls.next().await.expect("the engine is alive");
            if pick(&stall) {
                return stall;
            }
        }
    })
    .await
    .expect("the stall was reported")
}

fn in_tool(stall: &ArbiterStall, tool: &str) -> bool {
    stall.tool.as_ref().is_some_and(|t| t.tool == tool)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_that_blocks_its_arbiter_is_reported_with_its_session_and_duration() {
    let engine = Engine::with_arbiters(2).unwrap();
    let mut stalls = engine.monitor_stalls(THRESHOLD).unwrap();
    let latch = Latch::default();
    let (started, mut blocking) = mpsc::unbounded_channel();
    let (l, s) = (latch.clone(), started.clone());
    let work = Tool::new("work", "Blocks", move |_ctx: RunContext, _: NoArgs| {
        let (latch, started) = (l.clone(), s.clone());
        async move {
            // The mistake under test: a blocking call right in the async body.
            started.send(()).unwrap();
            assert!(latch.wait(), "the test opened the latch");
            Ok::<_, ToolFailure>("worked")
        }
    });
    // Round robin over two arbiters: the first and third session share arbiter 0.
    let busy = start(&engine, model(), vec![work]).await;
    let other = start(&engine, model(), vec![]).await;
    let neighbour = start(&engine, model(), vec![]).await;

    let turn = tokio::spawn({
        let busy = busy.clone();
        async move { busy.run("do the work").await }
    });
    timeout(BOUND, blocking.recv()).await.unwrap().unwrap();
    // The neighbour's turn cannot run while the arbiter is held (the latch is closed),
    // the other arbiter's can.
    assert_eq!(
        timeout(BOUND, other.run("hi"))
            .await
            .unwrap()
            .unwrap()
            .assistant_messages()
            .collect::<Vec<_>>(),
        ["Done."]
    );
    let began = report(&mut stalls, |s| !s.ended && in_tool(s, "work")).await;
    assert_eq!(began.arbiter, 0);
    assert!(began.stalled_for > THRESHOLD, "{began:?}");
    let tool = began.tool.clone().unwrap();
    assert_eq!(&tool.session, busy.id());
    assert_eq!(tool.call_id, "call_1");
    let stats = engine.stats();
    assert!(
        stats.arbiter_stalls >= 1 && stats.stalled_arbiters >= 1,
        "{stats:?}"
    );
    let held = neighbour.clone();
    let neighbour_turn = tokio::spawn(async move { held.run("hi").await });

    // Still held: a second threshold passes and the neighbour has no answer.
    tokio::time::sleep(THRESHOLD * 2).await;
    assert!(!neighbour_turn.is_finished(), "the arbiter was held");
    let held_for = began.stalled_for + THRESHOLD * 2;
    latch.open();

    let ended = report(&mut stalls, |s| s.ended && in_tool(s, "work")).await;
    assert_eq!(ended.arbiter, 0);
    assert!(
        ended.stalled_for >= held_for,
        "{ended:?} after {held_for:?}"
    );
    assert!(engine.stats().longest_arbiter_stall >= held_for);
    // Everything goes on once the tool lets go.
    let answered = timeout(BOUND, neighbour_turn)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(answered.assistant_messages().collect::<Vec<_>>(), ["Done."]);
    timeout(BOUND, turn).await.unwrap().unwrap().unwrap();
    for session in [busy, other, neighbour] {
        session.close().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_work_in_run_blocking_leaves_the_arbiter_to_the_other_sessions() {
    let engine = Engine::with_arbiters(2).unwrap();
    let mut stalls = engine.monitor_stalls(THRESHOLD).unwrap();
    let latch = Latch::default();
    let (started, mut blocking) = mpsc::unbounded_channel();
    let (l, s) = (latch.clone(), started.clone());
    let work = Tool::new(
        "work",
        "Blocks, where it may",
        move |ctx: RunContext, _: NoArgs| {
            let (latch, started) = (l.clone(), s.clone());
            async move {
                let opened = ctx
                    .run_blocking(move || {
                        started.send(()).unwrap();
                        latch.wait()
                    })
                    .await?;
                Ok::<_, ToolFailure>(if opened { "worked" } else { "timed out" })
            }
        },
    );
    let busy = start(&engine, model(), vec![work]).await;
    let _other = start(&engine, model(), vec![]).await;
    let neighbour = start(&engine, model(), vec![]).await;

    let turn = tokio::spawn({
        let busy = busy.clone();
        async move { busy.run("do the work").await }
    });
    timeout(BOUND, blocking.recv()).await.unwrap().unwrap();
    // The latch is closed, the work blocks its thread: and the neighbour on the same
    // arbiter has its turn.
    for _ in 0..3 {
        let answered = timeout(BOUND, neighbour.run("hi"))
            .await
            .expect("the neighbour's turn ran while the work blocked")
            .unwrap();
        assert_eq!(answered.assistant_messages().collect::<Vec<_>>(), ["Done."]);
    }
    latch.open();
    let result = timeout(BOUND, turn).await.unwrap().unwrap().unwrap();
    assert_eq!(result.function_outputs().next().unwrap().output, "worked");
    // No stall of the tool was seen (a loaded machine's stalls elsewhere may be).
    while let Ok(Some(stall)) = timeout(Duration::from_millis(10), stalls.next()).await {
        assert!(!in_tool(&stall, "work"), "{stall:?}");
    }
    busy.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_call_stops_awaiting_its_blocking_work_at_once() {
    let engine = Engine::with_arbiters(1).unwrap();
    let latch = Latch::default();
    let (started, mut blocking) = mpsc::unbounded_channel();
    let (outcome_tx, mut outcome) = mpsc::unbounded_channel();
    let l = latch.clone();
    let work = Tool::new("work", "Blocks", move |ctx: RunContext, _: NoArgs| {
        let (latch, started, outcome) = (l.clone(), started.clone(), outcome_tx.clone());
        async move {
            let done = ctx
                .run_blocking(move || {
                    started.send(()).unwrap();
                    latch.wait()
                })
                .await;
            outcome.send(done.clone()).unwrap();
            Ok::<_, ToolFailure>(format!("{done:?}"))
        }
    });
    let session = start(&engine, model(), vec![work]).await;
    let turn = tokio::spawn({
        let session = session.clone();
        async move { session.run("do the work").await }
    });
    timeout(BOUND, blocking.recv()).await.unwrap().unwrap();
    // Close cancels the call; its grace period (twice BOUND) would outlast the timeout,
    // so close returns within it only because the tool's await returned.
    timeout(BOUND, session.close())
        .await
        .expect("the tool's await returned on cancel")
        .unwrap();
    assert_eq!(
        outcome.recv().await.unwrap(),
        Err(BlockingError::Cancelled {
            call_id: "call_1".into()
        })
    );
    let _ = turn.await.unwrap();
    // The closure runs on until it returns: let its thread go.
    latch.open();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_blocking_work_is_the_tools_panic() {
    let engine = Engine::with_arbiters(1).unwrap();
    let work = Tool::new("work", "Panics", |ctx: RunContext, _: NoArgs| async move {
        ctx.run_blocking(|| panic!("the parser broke")).await?;
        Ok::<_, ToolFailure>("unreachable")
    });
    let session = start(&engine, model(), vec![work]).await;
    let result = timeout(BOUND, session.run("do the work"))
        .await
        .unwrap()
        .unwrap();
    let output = result.function_outputs().next().unwrap();
    assert!(output.is_error, "{output:?}");
    // The session goes on.
    let answered = timeout(BOUND, session.run("hi")).await.unwrap().unwrap();
    assert_eq!(answered.assistant_messages().collect::<Vec<_>>(), ["Done."]);
    session.close().await.unwrap();
}

/// A tool that hands `jobs` blocking jobs to the pool at once, each waiting on `latch`;
/// it counts the jobs that started and ended, and the most that ran at once.
#[derive(Clone)]
struct Flood {
    started: Arc<tokio::sync::watch::Sender<usize>>,
    ended: Arc<tokio::sync::watch::Sender<usize>>,
    most: Arc<std::sync::atomic::AtomicUsize>,
}

impl Flood {
    fn new() -> Self {
        Self {
            started: Arc::new(tokio::sync::watch::channel(0).0),
            ended: Arc::new(tokio::sync::watch::channel(0).0),
            most: Arc::default(),
        }
    }

    fn tool(&self, jobs: usize, latch: &Latch) -> Tool {
        let (flood, latch) = (self.clone(), latch.clone());
        Tool::new(
            "work",
            "Floods the pool",
            move |ctx: RunContext, _: NoArgs| {
                let (flood, latch) = (flood.clone(), latch.clone());
                async move {
                    ctx.update("flooding").await?;
                    let all = (0..jobs).map(|_| {
                        let (flood, latch) = (flood.clone(), latch.clone());
                        ctx.run_blocking(move || {
                            flood.started.send_modify(|n| *n += 1);
                            let running = *flood.started.borrow() - *flood.ended.borrow();
                            flood
                                .most
                                .fetch_max(running, std::sync::atomic::Ordering::SeqCst);
                            latch.wait();
                            flood.ended.send_modify(|n| *n += 1);
                        })
                    });
                    futures_util::future::join_all(all).await;
                    Ok::<_, ToolFailure>("flooded")
                }
            },
        )
    }

    /// Waits until `n` jobs started (bounded).
    async fn started(&self, n: usize) {
        let mut started = self.started.subscribe();
        timeout(BOUND, started.wait_for(|started| *started >= n))
            .await
            .unwrap_or_else(|_| panic!("{n} jobs did not start"))
            .unwrap();
    }

    /// Waits until `n` jobs ended (bounded).
    async fn ended(&self, n: usize) {
        let mut ended = self.ended.subscribe();
        timeout(BOUND, ended.wait_for(|ended| *ended >= n))
            .await
            .unwrap_or_else(|_| panic!("{n} jobs did not end"))
            .unwrap();
    }

    fn ran(&self) -> usize {
        *self.started.borrow()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sessions_flood_of_blocking_work_does_not_delay_a_neighbours_job() {
    // One arbiter: both sessions share its blocking pool.
    let engine = Engine::with_arbiters(1).unwrap();
    let latch = Latch::default();
    let flood = Flood::new();
    // A thousand jobs that block until the test opens the latch: more than the pool's
    // 512 threads, which alone would hold every other job behind them.
    let flooding = start(&engine, model(), vec![flood.tool(1_000, &latch)]).await;
    timeout(BOUND, flooding.run("do the work"))
        .await
        .unwrap()
        .unwrap();
    // Its jobs hold their slots: all four run, blocked.
    flood
        .started(SessionBuilder::DEFAULT_MAX_BLOCKING_JOBS)
        .await;

    // The neighbour's job runs while the flood's are all blocked.
    let quick = Tool::new(
        "work",
        "A quick job",
        |ctx: RunContext, _: NoArgs| async move {
            let sum = ctx.run_blocking(|| (1..=100u64).sum::<u64>()).await?;
            Ok::<_, ToolFailure>(format!("{sum}"))
        },
    );
    let neighbour = start(&engine, model(), vec![quick]).await;
    let result = timeout(BOUND, neighbour.run("do the work"))
        .await
        .expect("the neighbour's blocking job waited behind the flood")
        .unwrap();
    assert_eq!(result.function_outputs().next().unwrap().output, "5050");
    // The flooding session never had more than its slots on the pool.
    assert_eq!(flood.ran(), SessionBuilder::DEFAULT_MAX_BLOCKING_JOBS);
    assert_eq!(
        flood.most.load(std::sync::atomic::Ordering::SeqCst),
        SessionBuilder::DEFAULT_MAX_BLOCKING_JOBS
    );
    latch.open();
    neighbour.close().await.unwrap();
    flooding.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_calls_unstarted_blocking_jobs_never_start() {
    let engine = Engine::with_arbiters(1).unwrap();
    let latch = Latch::default();
    let flood = Flood::new();
    let session = Session::builder()
        .llm(model())
        .agent(
            Agent::builder("agent")
                .tool(flood.tool(200, &latch))
                .build()
                .unwrap(),
        )
        .max_blocking_jobs(2)
        .grace_period(Duration::ZERO)
        .start(&engine)
        .await
        .unwrap();
    timeout(BOUND, session.run("do the work"))
        .await
        .unwrap()
        .unwrap();
    flood.started(2).await;
    // The call ends with its session: its body, and the jobs it had not handed to the
    // pool yet, are dropped.
    timeout(BOUND, session.close()).await.unwrap().unwrap();
    latch.open();
    // The two that ran end and give their slots back; nothing is left to take them.
    flood.ended(2).await;
    assert_eq!(flood.ran(), 2);
}
