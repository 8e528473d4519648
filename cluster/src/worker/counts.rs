//! `Counts`: what a worker did, as atomics its tasks bump and its info subject reports.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use crate::protocol::WorkerInfo;

/// A worker's counters (see [`WorkerInfo`] for what each means).
#[derive(Debug, Default)]
pub(crate) struct Counts {
    pub(crate) live: AtomicUsize,
    pub(crate) max_live: AtomicUsize,
    pub(crate) jobs_pulled: AtomicU64,
    pub(crate) started: AtomicU64,
    pub(crate) ended: AtomicU64,
    pub(crate) refused: AtomicU64,
    pub(crate) inputs_applied: AtomicU64,
    pub(crate) inputs_repeated: AtomicU64,
    pub(crate) fenced: AtomicU64,
    pub(crate) resumed: AtomicU64,
    pub(crate) moved: AtomicU64,
    pub(crate) snapshot_writes_refused: AtomicU64,
    pub(crate) draining: AtomicBool,
}

impl Counts {
    /// A session became live.
    pub(crate) fn session_live(&self) {
        let live = self.live.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_live.fetch_max(live, Ordering::SeqCst);
        self.started.fetch_add(1, Ordering::Relaxed);
    }

    /// A live session ended.
    pub(crate) fn session_ended(&self) {
        self.live.fetch_sub(1, Ordering::SeqCst);
        self.ended.fetch_add(1, Ordering::Relaxed);
    }

    /// Bumps a counter by one.
    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The counts now.
    pub(crate) fn info(&self, name: &str, capacity: usize) -> WorkerInfo {
        WorkerInfo {
            name: name.to_owned(),
            capacity,
            live: self.live.load(Ordering::SeqCst),
            max_live: self.max_live.load(Ordering::SeqCst),
            jobs_pulled: self.jobs_pulled.load(Ordering::Relaxed),
            started: self.started.load(Ordering::Relaxed),
            ended: self.ended.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            inputs_applied: self.inputs_applied.load(Ordering::Relaxed),
            inputs_repeated: self.inputs_repeated.load(Ordering::Relaxed),
            fenced: self.fenced.load(Ordering::Relaxed),
            resumed: self.resumed.load(Ordering::Relaxed),
            moved: self.moved.load(Ordering::Relaxed),
            snapshot_writes_refused: self.snapshot_writes_refused.load(Ordering::Relaxed),
            // The snapshots stream counts its writes; the worker adds them.
            snapshot_writes: 0,
            snapshot_write_failures: 0,
            draining: self.draining.load(Ordering::SeqCst),
        }
    }
}
