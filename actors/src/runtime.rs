//! `Engine`: where sessions run.
//!
//! In a plain `#[tokio::main]` program, [`Engine::start`] owns an actix system on its own
//! threads (one arbiter per core by default) and places each new session on the next
//! arbiter; all actors of one session live on that arbiter, so a tool turn never hops
//! threads. Inside an existing actix system (`#[actix::test]`, an actix-web app),
//! [`Engine::current`] places sessions on the current arbiter, where paused test time
//! reaches them.
//!
//! The engine keeps a registry of its live sessions (`registry.rs`): it refuses an id a
//! live session holds, counts and summarises its sessions for monitoring
//! ([`Engine::stats`], [`Engine::sessions`]; `runtime/stats.rs`) and drains them
//! ([`Engine::drain`]; `runtime/drain.rs`).

mod drain;
mod stalls;
mod stats;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use actix::prelude::*;

use crate::error::{EngineError, SessionError};
use crate::idle_release::{IdleMemory, IdleRelease, IdleReleases};
use crate::ids::SessionId;
use crate::memory::{self, MemoryRelease};
use crate::registry::{LiveSession, Registry, SessionLease};

pub use drain::{DrainEnd, DrainReport, DrainedSession};
pub use stalls::{ArbiterStall, StallReports};
pub use stats::{EngineStats, SessionState, SessionSummary};

/// actix's default mailbox capacity, as `Actor::start_in_arbiter` gives an actor.
const MAILBOX_CAPACITY: usize = 16;

/// Runs sessions. Cheap to clone; each session keeps a clone, so the engine's own threads
/// stop when the last clone — the host's and every session's — is dropped, or on
/// [`Engine::shutdown`].
#[derive(Clone, Debug)]
pub struct Engine {
    inner: Arc<EngineInner>,
}

#[derive(Debug)]
struct EngineInner {
    arbiters: Vec<ArbiterHandle>,
    next: AtomicUsize,
    /// Set by [`Engine::shutdown`]: its arbiters may still be draining their queues for a
    /// moment, and a session started on one then would only find its mailbox gone.
    shut_down: AtomicBool,
    owned: Mutex<Option<OwnedSystem>>,
    /// Its own `Arc`: each running session holds it, and must not keep the engine (and so
    /// its threads) alive after the host dropped its last handle.
    idle: Arc<IdleMemory>,
    /// The live sessions; its own `Arc` for the same reason (each session's lease holds it).
    registry: Arc<Registry>,
    /// The instruments new sessions record on (read once per session start).
    #[cfg(feature = "telemetry")]
    telemetry: std::sync::RwLock<Option<crate::telemetry::Telemetry>>,
    /// The stall monitor, once the host turned it on (`Engine::monitor_stalls`).
    stalls: Mutex<Option<stalls::StallMonitor>>,
}

#[derive(Debug)]
struct OwnedSystem {
    system: System,
    thread: Option<JoinHandle<()>>,
}

impl Drop for EngineInner {
    fn drop(&mut self) {
        if let Some(owned) = self.owned.get_mut().ok().and_then(Option::take) {
            owned.system.stop();
        }
    }
}

impl Engine {
    /// Starts an engine with its own actix system and one arbiter per core.
    pub fn start() -> Result<Self, EngineError> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::with_arbiters(cores)
    }

    /// Starts an engine with its own actix system and `arbiters` arbiter threads.
    pub fn with_arbiters(arbiters: usize) -> Result<Self, EngineError> {
        let arbiters = arbiters.max(1);
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("switchboard-system".into())
            .spawn(move || {
                let runner = System::new();
                let owned: Vec<Arbiter> = runner.block_on(async {
                    let owned: Vec<Arbiter> = (0..arbiters).map(|_| Arbiter::new()).collect();
                    let handles: Vec<ArbiterHandle> = owned.iter().map(Arbiter::handle).collect();
                    let _ = tx.send((System::current(), handles));
                    owned
                });
                let _ = runner.run();
                drop(owned);
            })
            .map_err(EngineError::Spawn)?;
        let (system, handles) = rx.recv().map_err(|_| EngineError::NotStarted)?;
        Ok(Self::with_parts(
            handles,
            Some(OwnedSystem {
                system,
                thread: Some(thread),
            }),
        ))
    }

    fn with_parts(arbiters: Vec<ArbiterHandle>, owned: Option<OwnedSystem>) -> Self {
        let idle = IdleMemory::new();
        Self {
            inner: Arc::new(EngineInner {
                arbiters,
                next: AtomicUsize::new(0),
                shut_down: AtomicBool::new(false),
                owned: Mutex::new(owned),
                registry: Registry::new(idle.clone()),
                idle,
                #[cfg(feature = "telemetry")]
                telemetry: std::sync::RwLock::new(Some(crate::telemetry::Telemetry::global())),
                stalls: Mutex::new(None),
            }),
        }
    }

    /// An engine that places sessions on the current actix arbiter (inside
    /// `#[actix::test]`, `#[actix::main]` or an actix system you run).
    pub fn current() -> Result<Self, EngineError> {
        let arbiter = Arbiter::try_current().ok_or(EngineError::NoArbiter)?;
        Ok(Self::with_parts(vec![arbiter], None))
    }

    /// How many arbiters sessions are spread over.
    pub fn arbiters(&self) -> usize {
        self.inner.arbiters.len()
    }

    /// Stops the engine's own threads (sessions still running are dropped); a session
    /// started afterwards fails with [`EngineError::ShutDown`]. Does nothing for an engine
    /// from [`Engine::current`].
    pub fn shutdown(&self) {
        let owned = self
            .inner
            .owned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(mut owned) = owned {
            self.inner.shut_down.store(true, Ordering::Release);
            // Stopped arbiters beat no more: not a stall to report.
            self.stall_monitor().take();
            owned.system.stop();
            if let Some(thread) = owned.thread.take() {
                let _ = thread.join();
            }
        }
    }

    /// Gives the memory of closed sessions back to the system, and says whether there was
    /// any to give.
    ///
    /// After a burst of sessions closes, the process keeps its RSS: glibc holds the freed
    /// pages for the next sessions (see [`MemoryRelease`](crate::MemoryRelease)). Call this at a quiet moment
    /// after such a burst, for example once a traffic peak is over. It runs glibc's
    /// `malloc_trim` on a thread of its own, so the caller's task only awaits it; but
    /// meanwhile allocations in the arena being walked wait (0.2–0.3 s for 480 MB of
    /// free memory measured here), including an arbiter's, so do not call it per session.
    /// It affects the whole process, not only this engine; with an allocator other than
    /// glibc's it finds nothing to release, and on targets without glibc it answers
    /// [`MemoryRelease::Unsupported`].
    ///
    /// ```no_run
    /// # async fn demo(engine: switchboard::Engine, calls: Vec<switchboard::Session>)
    /// # -> Result<(), switchboard::SessionError> {
    /// for session in calls {
    ///     session.close().await?;
    /// }
    /// // The peak is over: hand the pages of those sessions back.
    /// let released = engine.release_memory().await;
    /// println!("memory after the peak: {released:?}");
    /// # Ok(()) }
    /// ```
    pub async fn release_memory(&self) -> MemoryRelease {
        self.drain_arbiters().await;
        self.inner.idle.released_by_host();
        memory::release().await
    }

    /// Waits until each arbiter has run a job queued now: what a `close()` that just
    /// returned left for an arbiter to drop (the session's context, its mailbox) is freed
    /// before the walk, or its pages would stay with the allocator.
    async fn drain_arbiters(&self) {
        let queued: Vec<_> = self
            .inner
            .arbiters
            .iter()
            .filter_map(|arbiter| {
                let (tx, rx) = tokio::sync::oneshot::channel::<()>();
                // A stopped arbiter takes no job; there is nothing of it to wait for.
                arbiter
                    .spawn_fn(move || {
                        let _ = tx.send(());
                    })
                    .then_some(rx)
            })
            .collect();
        for ran in queued {
            // An error means the arbiter stopped with the job unrun: nothing left to wait for.
            let _ = ran.await;
        }
    }

    /// Sets when the engine gives the memory of closed sessions back by itself (default
    /// [`IdleRelease::DEFAULT`], which is [`IdleRelease::Never`]: the engine does no
    /// process-wide work unasked; [`IdleRelease::AFTER_BURST`] releases once no session is
    /// left after a peak of 1,000). A session counts until its memory can be given back:
    /// its actors gone and the host's last handle of it dropped. Applies from the next
    /// session that goes.
    ///
    /// ```
    /// # fn demo(engine: &switchboard::Engine) {
    /// use switchboard::memory::IdleRelease;
    /// // This host trims at moments of its own choosing, with `release_memory()`.
    /// engine.set_idle_release(IdleRelease::Never);
    /// assert_eq!(engine.idle_release(), IdleRelease::Never);
    /// # }
    /// ```
    pub fn set_idle_release(&self, policy: IdleRelease) {
        self.inner.idle.set_policy(policy);
    }

    /// When the engine gives memory back by itself (see [`Engine::set_idle_release`]).
    pub fn idle_release(&self) -> IdleRelease {
        self.inner.idle.policy()
    }

    /// The releases the engine makes by itself from now on, for a host that logs them or
    /// measures RSS after one.
    ///
    /// ```no_run
    /// # async fn demo(engine: switchboard::Engine, calls: Vec<switchboard::Session>)
    /// # -> Result<(), switchboard::SessionError> {
    /// let mut releases = engine.idle_releases();
    /// for session in calls {
    ///     session.close().await?;
    /// }
    /// // The last session is gone: the engine trims on a thread of its own.
    /// if let Some(done) = releases.next().await {
    ///     println!("release {} after a peak of {}: {:?}", done.nth, done.peak_live, done.release);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn idle_releases(&self) -> IdleReleases {
        self.inner.idle.subscribe()
    }

    /// The engine's counts now: live sessions, their live actors, the messages queued for
    /// them, running tool calls, the process's resident memory, whether it drains.
    ///
    /// Read without a message to any session, so it answers also when a session is
    /// stuck. It visits every live session (a few milliseconds for 100,000): call it from
    /// a metrics endpoint or every few seconds, not per turn.
    ///
    /// ```no_run
    /// # fn demo(engine: &switchboard::Engine) {
    /// let stats = engine.stats();
    /// println!(
    ///     "{} sessions, {} actors, {} messages queued, {} tools running, rss {:?}",
    ///     stats.sessions, stats.actors, stats.backlog, stats.tool_runs, stats.rss_bytes,
    /// );
    /// # }
    /// ```
    pub fn stats(&self) -> EngineStats {
        let registry = &self.inner.registry;
        let mut stats = EngineStats::of(&registry.shared_states(), registry.is_draining());
        if let Some(monitor) = self.stall_monitor().as_ref() {
            let (stalls, longest, stalled_now) = monitor.counts();
            stats.arbiter_stalls = stalls;
            stats.longest_arbiter_stall = longest;
            stats.stalled_arbiters = stalled_now;
        }
        stats
    }

    /// Turns on the stall monitor and returns its reports: an arbiter that runs nothing
    /// else for longer than `threshold` — a tool body computing without awaiting, a
    /// blocking call in a hook — holds every session placed on it, and is reported with
    /// how long, and with the session and tool call it was polling when that was a tool
    /// body. Also counted in [`Engine::stats`] (`arbiter_stalls`,
    /// `longest_arbiter_stall`, `stalled_arbiters`) and logged at `warn`.
    ///
    /// Off by default: it is work the host did not ask for — a timer on every arbiter
    /// every quarter `threshold`, and a thread of its own that checks them at the same
    /// pace. The hot path pays nothing for it (no count per message or turn; two relaxed
    /// stores per poll of a tool body while it is on; see BENCHMARKS.md). A `threshold`
    /// of 100–500 ms finds the stalls a caller hears; it is at least 4 ms. The monitor
    /// runs until the engine is dropped; a second call returns another reader of the same
    /// monitor, with the first threshold. It measures wall-clock time, so a test under
    /// paused tokio time learns nothing from it. The fix for a stall it finds in a tool is
    /// [`RunContext::run_blocking`](crate::RunContext::run_blocking).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), switchboard::EngineError> {
    /// use std::time::Duration;
    /// let engine = switchboard::Engine::start()?;
    /// let mut stalls = engine.monitor_stalls(Duration::from_millis(250))?;
    /// tokio::spawn(async move {
    ///     while let Some(stall) = stalls.next().await {
    ///         if let (true, Some(tool)) = (stall.ended, &stall.tool) {
    ///             eprintln!(
    ///                 "arbiter {} stalled {:?} in {} of session {}: move it to ctx.run_blocking",
    ///                 stall.arbiter, stall.stalled_for, tool.tool, tool.session
    ///             );
    ///         }
    ///     }
    /// });
    /// # Ok(()) }
    /// ```
    pub fn monitor_stalls(&self, threshold: Duration) -> Result<StallReports, EngineError> {
        let mut monitor = self.stall_monitor();
        let running = match monitor.take() {
            Some(running) => {
                if running.threshold() != threshold.max(stalls::MIN_THRESHOLD) {
                    tracing::debug!(
                        asked = ?threshold,
                        running = ?running.threshold(),
                        "the stall monitor already runs: its first threshold stays"
                    );
                }
                monitor.insert(running)
            }
            None => monitor.insert(stalls::StallMonitor::start(
                &self.inner.arbiters,
                threshold,
            )?),
        };
        Ok(running.subscribe())
    }

    fn stall_monitor(&self) -> std::sync::MutexGuard<'_, Option<stalls::StallMonitor>> {
        // The monitor has no invariant a panic could break: keep it after one.
        self.inner.stalls.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A summary of every live session of the engine (the same as each one's
    /// [`Session::summary`](crate::Session::summary)), oldest first: for an operator's view
    /// of who is on a call, with which agent, for how long, and whether it has work.
    pub fn sessions(&self) -> Vec<SessionSummary> {
        let mut all: Vec<SessionSummary> = self
            .inner
            .registry
            .shared_states()
            .iter()
            .map(|shared| SessionSummary::of(shared))
            .collect();
        all.sort_by_key(|summary| std::cmp::Reverse(summary.age));
        all
    }

    /// Drains the engine before it goes (a deploy, a scale-down, SIGTERM): from this call
    /// on it starts no new session ([`EngineError::Draining`]); every live session is let
    /// settle — no turn, no queued work, no deferred reply, no tool run (calls of call-long
    /// tools aside: see `Tool::call_long`) — and then closed; one still unsettled
    /// `deadline` after the call has its turn force-interrupted and is closed (its running
    /// tools are cancelled and get their terminal outputs, as on any close). Returns once
    /// every session is gone, with the history of each (what its `close()` would return)
    /// and what its close stopped waiting for ([`DrainedSession::unfinished`]).
    ///
    /// It takes at most `deadline`, plus the interruption's wait for the output to say
    /// what the user heard of a cut speech (2 s at most), plus a close: at most four grace
    /// periods (`SessionBuilder::grace_period`: the session's tools, each agent's
    /// `on_exit` and its tools, the snapshot store), whatever the host's code does — see
    /// [`Session::close`](crate::Session::close). With the default grace of 2 s, 10 s past
    /// the deadline. The engine keeps refusing sessions afterwards; its threads stop with
    /// [`Engine::shutdown`] or the last clone. Works the same for sessions of
    /// [`Engine::start`] and [`Engine::current`]; a second call drains the same sessions.
    ///
    /// ```no_run
    /// # async fn demo(engine: switchboard::Engine) {
    /// use std::time::Duration;
    /// let report = engine.drain(Duration::from_secs(20)).await;
    /// for drained in &report.sessions {
    ///     println!("{}: {:?}, {} agents", drained.id, drained.ended, drained.history.agents.len());
    /// }
    /// # }
    /// ```
    pub async fn drain(&self, deadline: Duration) -> DrainReport {
        drain::drain(&self.inner.registry, deadline).await
    }

    /// Whether the engine is draining ([`Engine::drain`]): it starts no new session.
    pub fn is_draining(&self) -> bool {
        self.inner.registry.is_draining()
    }

    /// Takes an id for a session about to start (see `registry.rs`): `chosen` if no live
    /// session of this engine has it (its form checked by the caller), else the next free
    /// `s<n>`. The lease holds it, and counts the session live for [`IdleRelease`], until
    /// it is dropped: hand it to [`Engine::start_session_actor`], whose actor keeps it.
    pub(crate) fn reserve_session(
        &self,
        chosen: Option<String>,
    ) -> Result<SessionLease, SessionError> {
        if self.inner.shut_down.load(Ordering::Acquire) {
            return Err(EngineError::ShutDown.into());
        }
        self.inner.registry.reserve(chosen)
    }

    /// Records the metrics of sessions started from now on on `telemetry`'s instruments
    /// (`None`: records none). An engine starts with [`Telemetry::global`], the global
    /// meter provider as it was when the engine was made.
    ///
    /// [`Telemetry::global`]: crate::Telemetry::global
    #[cfg(feature = "telemetry")]
    pub fn set_telemetry(&self, telemetry: Option<crate::telemetry::Telemetry>) {
        // A poisoned lock held only a clone being written: the value is whole.
        *self
            .inner
            .telemetry
            .write()
            .unwrap_or_else(|p| p.into_inner()) = telemetry;
    }

    /// The instruments a session started now records on.
    #[cfg(feature = "telemetry")]
    pub(crate) fn telemetry(&self) -> Option<crate::telemetry::Telemetry> {
        self.inner
            .telemetry
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Fills in a started session's place in the registry once its host handle exists.
    pub(crate) fn register_session(&self, id: &SessionId, live: LiveSession) {
        self.inner.registry.fill(id, live);
    }

    /// Starts a session's actor on the next arbiter, round robin; `make` builds it inside
    /// its own context (so it can hand out links to itself) and keeps the `lease` (from
    /// [`Engine::reserve_session`]) until the actor is dropped. If the actor never starts,
    /// the lease is dropped with the job.
    pub(crate) fn start_session_actor<A, F>(
        &self,
        lease: SessionLease,
        make: F,
    ) -> Result<Addr<A>, SessionError>
    where
        A: Actor<Context = Context<A>>,
        F: FnOnce(&mut Context<A>, SessionLease) -> A + Send + 'static,
    {
        if self.inner.shut_down.load(Ordering::Acquire) {
            return Err(EngineError::ShutDown.into());
        }
        let index = self.inner.next.fetch_add(1, Ordering::Relaxed) % self.inner.arbiters.len();
        let arbiter = &self.inner.arbiters[index];
        // What `Actor::start_in_arbiter` does, but it drops the arbiter's answer to whether
        // it took the job; asking that with a job of its own cost a second message (and
        // task) on the arbiter per session.
        let (tx, rx) = actix::dev::channel::channel(MAILBOX_CAPACITY);
        let taken = arbiter.spawn_fn(move || {
            let mut ctx = Context::with_receiver(rx);
            let actor = make(&mut ctx, lease);
            actix::spawn(ctx.into_future(actor));
        });
        if !taken {
            return Err(EngineError::ShutDown.into());
        }
        Ok(Addr::new(tx))
    }
}
