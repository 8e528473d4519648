//! User code cannot hang a close or a drain. Every await on code the engine does not own —
//! a snapshot store, an `on_enter`/`on_exit` hook, a tool body, an output, a model stream —
//! has a bound at close and at drain: the grace period, as tools have, or the drain's own
//! interruption. What did not finish is dropped and reported (`SessionEvent::Unfinished`,
//! `DrainedSession::unfinished`), and no actor of the session is left.
//!
//! Each test runs its sessions on the test's arbiter in paused time, where "never answers"
//! is a future that is never woken, and measures how long the close or drain took in
//! virtual time against the documented bound.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{spawn_turn, wait_on, DropGuard, Log, Query};
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use serde_json::json;
use switchboard::prelude::*;
use switchboard::snapshot::{
    Claim, ClaimRule, Claimed, SessionSnapshot, SnapshotDelta, SnapshotStore, StoreError,
    StoreVersion,
};
use switchboard::testing::{event, Gate, RecordingOutput, Reply, ScriptedLlm};
use switchboard::{AgentHook, DrainEnd, DrainReport, LlmTimeouts, Unfinished};
use tokio::time::{timeout, Instant};

/// The grace period of every session here.
const GRACE: Duration = Duration::from_secs(1);
/// What tokio's timers add to a wait: each deadline is rounded up to the next millisecond.
const TIMER_ROUNDING: Duration = Duration::from_millis(10);
/// Bounds a wait that the engine must end by itself (virtual time): a failure, never a pass.
const NEVER: Duration = Duration::from_secs(3600);

/// A snapshot store that never answers: every write waits for ever. Each write's future
/// carries a drop guard, so the test sees it dropped once the session is gone.
#[derive(Clone, Default)]
struct DeafStore {
    writes: Arc<AtomicUsize>,
    log: Log,
}

impl DeafStore {
    fn write(&self) -> BoxFuture<'static, Result<StoreVersion, StoreError>> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        let guard = DropGuard(self.log.clone(), "write dropped");
        async move {
            let _guard = guard;
            futures_util::future::pending::<()>().await;
            Ok(StoreVersion::new(0))
        }
        .boxed()
    }
}

impl SnapshotStore for DeafStore {
    /// The claim answers (the session starts); only the writes after it never do.
    fn claim(
        &self,
        session: &str,
        _rule: ClaimRule,
    ) -> BoxFuture<'static, Result<Claimed, StoreError>> {
        let claim = Claim::new(session, 1, StoreVersion::new(1));
        async move { Ok(Claimed::new(claim, None)) }.boxed()
    }

    fn save(
        &self,
        _snapshot: SessionSnapshot,
        _after: StoreVersion,
    ) -> BoxFuture<'static, Result<StoreVersion, StoreError>> {
        self.write()
    }

    fn append(
        &self,
        _delta: SnapshotDelta,
        _after: StoreVersion,
    ) -> BoxFuture<'static, Result<StoreVersion, StoreError>> {
        self.write()
    }

    fn load(
        &self,
        _session: &str,
    ) -> BoxFuture<'static, Result<Option<SessionSnapshot>, StoreError>> {
        futures_util::future::pending().boxed()
    }

    fn remove(&self, _session: &str) -> BoxFuture<'static, Result<(), StoreError>> {
        futures_util::future::pending().boxed()
    }
}

fn greeter() -> Agent {
    Agent::builder("greeter").build().unwrap()
}

fn session(agent: Agent) -> SessionBuilder {
    let llm = ScriptedLlm::new([]);
    llm.otherwise(Reply::text("Hello."));
    Session::builder().llm(llm).agent(agent).grace_period(GRACE)
}

/// Closes `session`, returning how long the close took and what it reported unfinished.
async fn close_timed(session: &Session) -> (Duration, Vec<Unfinished>) {
    let mut events = session.subscribe();
    let began = Instant::now();
    timeout(NEVER, session.close())
        .await
        .expect("the close never returned")
        .unwrap();
    let took = began.elapsed();
    let mut unfinished = Vec::new();
    while let Ok(event) = events.try_recv() {
        if let SessionEvent::Unfinished(what) = event {
            unfinished.push(what);
        }
    }
    (took, unfinished)
}

#[switchboard::test]
async fn a_store_that_never_answers_holds_a_close_for_the_grace_period_only() {
    tokio::time::pause();
    let engine = Engine::current().unwrap();
    let store = DeafStore::default();
    let session = session(greeter())
        .save_snapshots(Arc::new(store.clone()))
        .start(&engine)
        .await
        .unwrap();
    session.run("hi").await.unwrap();
    common::settled(&session).await;
    // The start settled and saved (the writer is stuck on that write ever since); the
    // turn's save waits behind it.
    assert_eq!(store.writes.load(Ordering::SeqCst), 1);

    let (took, unfinished) = close_timed(&session).await;

    assert!(took >= GRACE && took <= GRACE + TIMER_ROUNDING, "{took:?}");
    assert_eq!(unfinished, [Unfinished::SnapshotStore { unwritten: 2 }]);
    assert_eq!(engine.stats().actors, 0);
    // The write stuck in the store is dropped with the session, not left running.
    tokio::task::yield_now().await;
    assert_eq!(store.log.entries(), ["write dropped"]);
}

#[switchboard::test]
async fn a_store_that_falls_behind_holds_a_bounded_queue_and_gets_the_last_state_in_full() {
    tokio::time::pause();
    let engine = Engine::current().unwrap();
    // A store whose writes wait at a gate: it falls behind by a hundred turns.
    #[derive(Clone)]
    struct SlowStore {
        inner: switchboard::snapshot::MemoryStore,
        gate: Gate,
        writes: Arc<AtomicUsize>,
    }
    impl SnapshotStore for SlowStore {
        fn claim(
            &self,
            session: &str,
            rule: ClaimRule,
        ) -> BoxFuture<'static, Result<Claimed, StoreError>> {
            self.inner.claim(session, rule)
        }
        fn save(
            &self,
            snapshot: SessionSnapshot,
            after: StoreVersion,
        ) -> BoxFuture<'static, Result<StoreVersion, StoreError>> {
            self.writes.fetch_add(1, Ordering::SeqCst);
            let (inner, gate) = (self.inner.clone(), self.gate.clone());
            async move {
                gate.wait().await;
                inner.save(snapshot, after).await
            }
            .boxed()
        }
        fn append(
            &self,
            delta: SnapshotDelta,
            after: StoreVersion,
        ) -> BoxFuture<'static, Result<StoreVersion, StoreError>> {
            self.writes.fetch_add(1, Ordering::SeqCst);
            let (inner, gate) = (self.inner.clone(), self.gate.clone());
            async move {
                gate.wait().await;
                inner.append(delta, after).await
            }
            .boxed()
        }
        fn load(
            &self,
            session: &str,
        ) -> BoxFuture<'static, Result<Option<SessionSnapshot>, StoreError>> {
            self.inner.load(session)
        }
        fn remove(&self, session: &str) -> BoxFuture<'static, Result<(), StoreError>> {
            self.inner.remove(session)
        }
    }
    let store = SlowStore {
        inner: switchboard::snapshot::MemoryStore::new(),
        gate: Gate::new(),
        writes: Arc::default(),
    };
    let session = session(greeter())
        .id("slow")
        .save_snapshots(Arc::new(store.clone()))
        .start(&engine)
        .await
        .unwrap();
    for n in 0..100 {
        session.run(format!("turn {n}")).await.unwrap();
        common::settled(&session).await;
    }
    assert_eq!(
        store.writes.load(Ordering::SeqCst),
        1,
        "only the first write started"
    );
    store.gate.open();
    let (took, unfinished) = close_timed(&session).await;
    assert!(took < GRACE, "{took:?}");
    assert!(unfinished.is_empty(), "{unfinished:?}");
    // The first write, and then at most the bound of the queue (16 deltas and the full
    // snapshot that replaced them), not one write per turn.
    let writes = store.writes.load(Ordering::SeqCst);
    assert!(writes <= 1 + 17, "{writes} writes for 100 turns");
    // The store holds the last settled state: every turn's two messages.
    let stored = store.inner.load("slow").await.unwrap().unwrap();
    assert_eq!(stored.items(), 200);
}

#[switchboard::test]
async fn an_on_exit_hook_that_never_returns_holds_a_close_for_the_grace_period_only() {
    tokio::time::pause();
    let engine = Engine::current().unwrap();
    let log = Log::default();
    let guard_log = log.clone();
    let agent = Agent::builder("greeter")
        .on_exit(move |_ctx| {
            let guard = DropGuard(guard_log.clone(), "on_exit dropped");
            async move {
                let _guard = guard;
                futures_util::future::pending::<()>().await;
            }
        })
        .build()
        .unwrap();
    let session = session(agent).start(&engine).await.unwrap();
    session.run("hi").await.unwrap();

    let (took, unfinished) = close_timed(&session).await;

    assert!(took >= GRACE && took <= GRACE + TIMER_ROUNDING, "{took:?}");
    assert_eq!(
        unfinished,
        [Unfinished::Hook {
            agent: "greeter".into(),
            hook: AgentHook::OnExit
        }]
    );
    assert_eq!(log.entries(), ["on_exit dropped"]);
    assert_eq!(engine.stats().actors, 0);
    // The agent's final chat context is in the history all the same.
    let history = session.close().await.unwrap();
    assert!(history.chat_of("greeter").is_some(), "{history:?}");
}

#[switchboard::test]
async fn a_close_during_a_handoff_whose_on_exit_never_returns_is_bounded() {
    tokio::time::pause();
    let engine = Engine::current().unwrap();
    let next = Agent::builder("next").build().unwrap();
    let hand_off = Tool::new(
        "transfer",
        "Transfers",
        move |_ctx: RunContext, _: Query| {
            let next = next.clone();
            async move { Ok::<_, ToolFailure>(next) }
        },
    );
    let first = Agent::builder("first")
        .tool(hand_off)
        .on_exit(|_ctx| futures_util::future::pending::<()>())
        .build()
        .unwrap();
    let llm = ScriptedLlm::new([Reply::tool_call("transfer", json!({"q": "x"}))]);
    llm.otherwise(Reply::text("Hello."));
    let session = Session::builder()
        .llm(llm)
        .agent(first)
        .grace_period(GRACE)
        .start(&engine)
        .await
        .unwrap();
    let mut events = session.subscribe();
    // The turn hands off; the handoff waits on the old agent's `on_exit` for ever.
    let turn = spawn_turn(&session, "transfer me");
    wait_on(
        &mut events,
        event::matching("the handoff's on_exit running", |e| {
            matches!(e, SessionEvent::FunctionToolsExecuted { .. }).then_some(())
        }),
    )
    .await;

    let (took, unfinished) = close_timed(&session).await;

    assert!(took <= GRACE + TIMER_ROUNDING, "{took:?}");
    assert_eq!(
        unfinished,
        [Unfinished::Hook {
            agent: "first".into(),
            hook: AgentHook::OnExit
        }]
    );
    assert!(
        turn.await.unwrap().is_err(),
        "the turn's handoff never completed"
    );
    assert_eq!(engine.stats().actors, 0);
}

#[switchboard::test]
async fn an_on_enter_hook_that_never_returns_is_dropped_by_a_drain() {
    tokio::time::pause();
    let engine = Engine::current().unwrap();
    let agent = Agent::builder("greeter")
        .on_enter(|_ctx| futures_util::future::pending::<()>())
        .build()
        .unwrap();
    // The start waits for `on_enter`: it never answers on its own.
    let start = {
        let (engine, builder) = (engine.clone(), session(agent).id("entering"));
        actix::spawn(async move { builder.start(&engine).await })
    };
    tokio::task::yield_now().await;
    assert_eq!(engine.stats().sessions, 1);

    let deadline = Duration::from_secs(5);
    let (took, report) = drain_timed(&engine, deadline).await;

    assert!(
        took >= deadline && took <= deadline + GRACE + TIMER_ROUNDING,
        "{took:?}"
    );
    assert_eq!(report.sessions.len(), 1);
    let drained = &report.sessions[0];
    assert_eq!(drained.ended, DrainEnd::Interrupted);
    assert_eq!(
        drained.unfinished,
        [Unfinished::Hook {
            agent: "greeter".into(),
            hook: AgentHook::OnEnter
        }]
    );
    assert!(matches!(start.await.unwrap(), Err(SessionError::Closed)));
    assert_eq!(engine.stats().actors, 0);
}

/// Drains the engine with `deadline`, returning how long it took and its report.
async fn drain_timed(engine: &Engine, deadline: Duration) -> (Duration, DrainReport) {
    let began = Instant::now();
    let report = timeout(NEVER, engine.drain(deadline))
        .await
        .expect("the drain never returned");
    (began.elapsed(), report)
}

/// Two sessions `start` makes, each with a turn under way that cannot end by itself: a
/// close of the first returns at once (nothing of the turn is awaited), a drain of the
/// second returns at its deadline plus at most `then`, the turn interrupted; nothing is
/// reported unfinished and no actor is left.
async fn mid_turn_close_and_drain<F, Fut>(engine: &Engine, start: F, then: Duration)
where
    F: Fn(&'static str) -> Fut,
    Fut: std::future::Future<Output = Result<Session, SessionError>>,
{
    let closed = start("closed").await.unwrap();
    let turn = spawn_turn(&closed, "hi");
    tokio::task::yield_now().await;
    let (took, unfinished) = close_timed(&closed).await;
    assert!(took <= TIMER_ROUNDING, "{took:?}");
    assert!(unfinished.is_empty(), "{unfinished:?}");
    assert!(turn.await.unwrap().is_err());

    let drained = start("drained").await.unwrap();
    let turn = spawn_turn(&drained, "hi");
    tokio::task::yield_now().await;
    let deadline = Duration::from_secs(5);
    let (took, report) = drain_timed(engine, deadline).await;
    assert!(
        took >= deadline && took <= deadline + then + TIMER_ROUNDING,
        "{took:?}"
    );
    assert_eq!(report.sessions[0].ended, DrainEnd::Interrupted);
    assert!(report.sessions[0].unfinished.is_empty());
    assert!(turn.await.unwrap().unwrap().interrupted);
    assert_eq!(engine.stats().actors, 0);
}

#[switchboard::test]
async fn an_output_that_never_reports_playout_holds_neither_a_close_nor_a_drain() {
    tokio::time::pause();
    let engine = Engine::current().unwrap();
    // A voice output that never says the speech played.
    let output = RecordingOutput::manual_playout();
    let start = |id: &'static str| {
        session(greeter())
            .id(id)
            .output(output.clone())
            .start(&engine)
    };
    // A drain's interrupted turn waits 2 s at most for what the user heard.
    mid_turn_close_and_drain(&engine, start, Duration::from_secs(2)).await;
}

#[switchboard::test]
async fn a_model_that_never_answers_holds_neither_a_close_nor_a_drain() {
    tokio::time::pause();
    let engine = Engine::current().unwrap();
    // A model that never sends a chunk, and timeouts that would not end it within an hour.
    let patient = LlmTimeouts {
        first_chunk: NEVER * 2,
        between_chunks: NEVER * 2,
    };
    let start = |id: &'static str| {
        let llm = ScriptedLlm::new([]);
        llm.otherwise(Reply::stall());
        Session::builder()
            .id(id)
            .llm(llm)
            .agent(greeter())
            .grace_period(GRACE)
            .llm_timeouts(patient)
            .start(&engine)
    };
    mid_turn_close_and_drain(&engine, start, Duration::ZERO).await;
}

/// Everything at once: a session tool deaf to cancellation, an agent whose `on_exit` and
/// own tool never end, and a store that never answers. The close gives each its grace
/// period in turn — the session's tools, the agent's `on_exit`, its tools, the store —
/// and returns within four of them, naming all four.
#[switchboard::test]
async fn a_close_returns_within_four_grace_periods_whatever_user_code_does() {
    tokio::time::pause();
    let engine = Engine::current().unwrap();
    // `Restart` tools: an `Abandon` body in a session whose store never answers would
    // never start (it waits for the store to hold its call), and the close would have no
    // body to wait for.
    let deaf = |name: &'static str| {
        Tool::new(name, "Never ends", |ctx: RunContext, _: Query| async move {
            ctx.update("started").await?;
            futures_util::future::pending::<()>().await;
            Ok::<_, ToolFailure>("done")
        })
        .on_restore(switchboard::RestorePolicy::Restart)
    };
    let agent = Agent::builder("greeter")
        .tool(deaf("agent_job"))
        .on_exit(|_ctx| futures_util::future::pending::<()>())
        .build()
        .unwrap();
    let llm = ScriptedLlm::new([
        Reply::tool_call("session_job", json!({"q": "a"}))
            .and_tool_call("agent_job", json!({"q": "b"})),
        Reply::text("Both started."),
    ]);
    let store = DeafStore::default();
    let session = Session::builder()
        .llm(llm)
        .agent(agent)
        .toolset(Toolset::new("jobs").tool(deaf("session_job")))
        .save_snapshots(Arc::new(store.clone()))
        .grace_period(GRACE)
        .start(&engine)
        .await
        .unwrap();
    session.run("start both").await.unwrap();
    session.wait_for_inactive().await;

    let (took, unfinished) = close_timed(&session).await;

    assert!(
        took >= 4 * GRACE && took <= 4 * GRACE + TIMER_ROUNDING,
        "{took:?}"
    );
    let names: Vec<String> = unfinished
        .iter()
        .map(|what| match what {
            Unfinished::ToolBody { tool, .. } => tool.clone(),
            Unfinished::Hook { hook, .. } => hook.to_string(),
            Unfinished::SnapshotStore { .. } => "store".into(),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(names, ["session_job", "on_exit", "agent_job", "store"]);
    assert_eq!(engine.stats().actors, 0);
    // The chat context keeps its invariant: both calls have their terminal outputs.
    let history = session.close().await.unwrap();
    common::assert_invariant(history.chat_of("greeter").unwrap());
}
