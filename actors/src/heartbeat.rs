//! An arbiter's heartbeat, for the engine's opt-in stall monitor (`runtime/stalls.rs`).
//!
//! Every session's actors run on one arbiter thread, shared with other sessions: a tool
//! body that computes for 2 s without awaiting holds every session there for 2 s. To see
//! that happen without a cost on the hot path, the monitor starts on each arbiter a task
//! that writes the time into its [`ArbiterBeat`] every few milliseconds; a watchdog thread
//! reads it, and an arbiter whose beat is older than the threshold is stalled. Nothing is
//! written per message, per turn or per token: the beat is one timer per arbiter.
//!
//! To name what stalls, a tool body run on a watched arbiter is wrapped ([`watched`]) so
//! that each poll writes its run's number into the beat and clears it after (two relaxed
//! atomic stores per poll of a tool body, only while the monitor is on; without it, the
//! body is polled as is). A stall seen while the number is set is that tool's. Stalls in
//! other code (a hook, a model adapter that parses without awaiting) are reported without
//! a name.

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use futures_util::future::Either;

use crate::chat::FunctionCall;
use crate::ids::SessionId;

/// The tool body a stalled arbiter was polling.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StalledTool {
    /// The session the call runs in.
    pub session: SessionId,
    /// The tool's name.
    pub tool: String,
    /// The call's id.
    pub call_id: String,
}

/// One arbiter's heartbeat: when it last ran its beat task, and which tool body it polls.
#[derive(Debug)]
pub(crate) struct ArbiterBeat {
    /// The monitor's clock (a monotonic `Instant` both threads read).
    epoch: Instant,
    /// When the beat task last ran, in microseconds since `epoch`.
    last: AtomicU64,
    /// The number of the tool run being polled now; 0 for none.
    running: AtomicU64,
    next_run: AtomicU64,
    /// The tool runs alive on the arbiter, by number: written when one starts and ends
    /// (only while the monitor is on), read when a stall is seen. Shared handles only
    /// (two reference counts per run); the names are copied out at a stall.
    runs: Mutex<HashMap<u64, RunName>>,
}

impl ArbiterBeat {
    pub(crate) fn new(epoch: Instant) -> Arc<Self> {
        let beat = Arc::new(Self {
            epoch,
            last: AtomicU64::new(0),
            running: AtomicU64::new(0),
            next_run: AtomicU64::new(1),
            runs: Mutex::new(HashMap::new()),
        });
        // Beaten at its birth: an arbiter is not stalled before its beat task could run.
        beat.beat();
        beat
    }

    /// Records that the arbiter ran its beat task now.
    pub(crate) fn beat(&self) {
        self.last
            .store(micros(self.epoch.elapsed()), Ordering::Relaxed);
    }

    /// When the arbiter last beat, on the monitor's clock.
    pub(crate) fn last(&self) -> Duration {
        Duration::from_micros(self.last.load(Ordering::Relaxed))
    }

    /// The tool body being polled now, if any.
    pub(crate) fn running_tool(&self) -> Option<StalledTool> {
        let run = self.running.load(Ordering::Relaxed);
        if run == 0 {
            return None;
        }
        let runs = lock(&self.runs);
        let (session, call) = runs.get(&run)?;
        Some(StalledTool {
            session: session.clone(),
            tool: call.name.clone(),
            call_id: call.call_id.clone(),
        })
    }

    /// Makes this arbiter's beat the one tool runs started on this thread report to.
    pub(crate) fn install(self: &Arc<Self>) {
        CURRENT.with(|current| *current.borrow_mut() = Some(Arc::downgrade(self)));
    }

    /// Stops tool runs started on this thread from now on reporting to it, unless another
    /// monitor's beat took its place (two engines of `Engine::current` on one arbiter).
    pub(crate) fn uninstall(self: &Arc<Self>) {
        CURRENT.with(|current| {
            let mut current = current.borrow_mut();
            if current
                .as_ref()
                .is_some_and(|beat| std::ptr::eq(beat.as_ptr(), Arc::as_ptr(self)))
            {
                *current = None;
            }
        });
    }

    fn enter(self: &Arc<Self>, tool: RunName) -> RunMark {
        let number = self.next_run.fetch_add(1, Ordering::Relaxed);
        lock(&self.runs).insert(number, tool);
        RunMark {
            beat: self.clone(),
            number,
        }
    }
}

fn micros(elapsed: Duration) -> u64 {
    u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX)
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A name table stays usable after a panic elsewhere: it holds no invariant.
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

thread_local! {
    /// The beat of the arbiter this thread runs, while a stall monitor watches it.
    static CURRENT: RefCell<Option<Weak<ArbiterBeat>>> = const { RefCell::new(None) };
}

/// A tool run registered with its arbiter's beat; unregistered when dropped.
pub(crate) struct RunMark {
    beat: Arc<ArbiterBeat>,
    number: u64,
}

impl Drop for RunMark {
    fn drop(&mut self) {
        lock(&self.beat.runs).remove(&self.number);
    }
}

/// A tool run as its beat knows it: its session and its call.
pub(crate) type RunName = (SessionId, Arc<FunctionCall>);

/// The mark of a tool run about to start on this thread, named by `describe`, when a
/// stall monitor watches this thread's arbiter; `None` otherwise (the common case costs
/// one thread-local read per run).
pub(crate) fn mark(describe: impl FnOnce() -> RunName) -> Option<RunMark> {
    let beat = CURRENT.with(|current| current.borrow().as_ref().and_then(Weak::upgrade))?;
    Some(beat.enter(describe()))
}

/// `body`, with `mark` (from [`mark`]) written into the beat while it is polled; `body`
/// itself without a mark, polled as is.
pub(crate) fn watched<F: Future>(
    body: F,
    mark: Option<RunMark>,
) -> impl Future<Output = F::Output> {
    let Some(mark) = mark else {
        return Either::Left(body);
    };
    Either::Right(async move {
        let mut body = std::pin::pin!(body);
        std::future::poll_fn(|cx| {
            mark.beat.running.store(mark.number, Ordering::Relaxed);
            let polled = body.as_mut().poll(cx);
            mark.beat.running.store(0, Ordering::Relaxed);
            polled
        })
        .await
    })
}
