//! The engine giving the memory of closed sessions back by itself, once it is idle.
//!
//! `malloc_trim` holds each arena's lock while it walks it (0.2–0.3 s for 480 MB of free
//! memory here), so run after some close while other sessions are live it would stall
//! their arbiter. Once the engine's last session is gone no arbiter has a session to
//! stall, and a burst that has just drained is exactly when the pages are worth handing
//! back. So the engine counts its live sessions and the most that were live at once since
//! the last release, and when the count falls to zero after a high enough peak
//! ([`IdleRelease`]) it trims on a thread of its own. A session counts as live until its
//! memory can be given back: its actors gone and the host's last handle of it dropped. The
//! peak, not the number of sessions
//! gone, is the measure: sessions one after another reuse the same memory and leave
//! nothing to give back, and a release returns pages the next sessions fault in again.
//! Checking twice (at the drop and again on the release thread) keeps a session started
//! meanwhile from being stalled by it.

use std::num::NonZeroU64;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::watch;

use crate::memory::{self, MemoryRelease};

/// When an [`Engine`](crate::Engine) gives the memory of closed sessions back to the system
/// by itself; set with [`Engine::set_idle_release`](crate::Engine::set_idle_release).
///
/// Off by default ([`IdleRelease::Never`]): a library does no process-wide work unasked. A
/// release runs glibc's `malloc_trim` for the whole process (see
/// [`Engine::release_memory`](crate::Engine::release_memory)), on a thread of its own,
/// only once the engine has no live session: the moment a traffic peak has fully drained.
/// Allocations in an arena wait while it is walked (0.2–0.3 s after 100,000 idle sessions
/// here), a session started during the walk included, and the walk covers the host's
/// arenas too. It pays for a host whose peaks leave many MB it wants back and that can
/// afford that pause once the peak is over: [`IdleRelease::AFTER_BURST`] turns it on
/// after a peak of a thousand sessions. A host with plans of its own calls
/// [`Engine::release_memory`](crate::Engine::release_memory) when it suits it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdleRelease {
    /// The engine never releases by itself.
    Never,
    /// When the engine's last live session is gone, if at least this many were live at
    /// once since the last release (by the engine or by the host). Sessions that follow
    /// each other reuse one another's memory, so a trickle of calls that passes through
    /// zero never trims; a peak of this many leaves about this many idle sessions' memory
    /// (about 6.3 KiB each) to give back.
    AfterPeak(NonZeroU64),
}

impl IdleRelease {
    /// The engines' default: `Never` (no process-wide work unasked).
    pub const DEFAULT: Self = Self::Never;

    /// A release after a peak of 1,000 live sessions (about 6 MB of idle sessions): the
    /// setting for a host that wants the memory of its traffic peaks back.
    pub const AFTER_BURST: Self = match NonZeroU64::new(1000) {
        Some(n) => Self::AfterPeak(n),
        // Evaluated when the crate compiles: a zero here would fail the build, not a run.
        None => panic!("the peak is not zero"),
    };

    /// Whether a session going now, leaving `live` sessions after a `peak` of live ones
    /// since the last release, is the moment to release.
    fn releases_at(self, live: u64, peak: u64) -> bool {
        match self {
            Self::Never => false,
            Self::AfterPeak(enough) => live == 0 && peak >= enough.get(),
        }
    }

    fn encode(self) -> u64 {
        match self {
            Self::Never => 0,
            Self::AfterPeak(n) => n.get(),
        }
    }

    fn decode(raw: u64) -> Self {
        NonZeroU64::new(raw).map_or(Self::Never, Self::AfterPeak)
    }
}

impl Default for IdleRelease {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// A release the engine made by itself, as [`IdleReleases`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdleReleased {
    /// Which of the engine's own releases this is, from 1.
    pub nth: u64,
    /// The most sessions live at once since the release before this one.
    pub peak_live: u64,
    /// What the allocator did.
    pub release: MemoryRelease,
}

/// The engine's releases as they happen, from
/// [`Engine::idle_releases`](crate::Engine::idle_releases).
#[derive(Debug)]
pub struct IdleReleases {
    reports: watch::Receiver<Option<IdleReleased>>,
}

impl IdleReleases {
    /// Waits for the next release after the last one this receiver saw (or after it was
    /// made); `None` once the engine and every session it ran are dropped (nothing is left
    /// to release). Releases that follow each other before this is awaited are reported as
    /// the latest one.
    pub async fn next(&mut self) -> Option<IdleReleased> {
        self.reports.changed().await.ok()?;
        *self.reports.borrow_and_update()
    }
}

/// An engine's count of live sessions and their peak since the last release.
#[derive(Debug)]
pub(crate) struct IdleMemory {
    policy: AtomicU64,
    live: AtomicU64,
    peak: AtomicU64,
    /// A release thread is running; one at a time, since one walk frees all there is.
    releasing: AtomicBool,
    reports: watch::Sender<Option<IdleReleased>>,
}

impl IdleMemory {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            policy: AtomicU64::new(IdleRelease::DEFAULT.encode()),
            live: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            releasing: AtomicBool::new(false),
            reports: watch::Sender::new(None),
        })
    }

    pub(crate) fn set_policy(&self, policy: IdleRelease) {
        self.policy.store(policy.encode(), Ordering::Relaxed);
    }

    pub(crate) fn policy(&self) -> IdleRelease {
        IdleRelease::decode(self.policy.load(Ordering::Relaxed))
    }

    pub(crate) fn subscribe(&self) -> IdleReleases {
        IdleReleases {
            reports: self.reports.subscribe(),
        }
    }

    /// A session about to start: it counts as live until the returned hold is dropped.
    /// The session's shared state keeps it, so a session counts until its memory can be
    /// given back: its last actor gone *and* the host's last handle dropped (a closed
    /// session whose `Session` the host keeps still holds its history, and a release then
    /// would find nothing of it to hand back).
    pub(crate) fn hold(self: &Arc<Self>) -> IdleHold {
        let live = self.live.fetch_add(1, Ordering::AcqRel) + 1;
        self.peak.fetch_max(live, Ordering::AcqRel);
        IdleHold {
            memory: self.clone(),
        }
    }

    /// The host released: the peak before it no longer counts toward the next release;
    /// the sessions live now still do, their memory is not free yet.
    pub(crate) fn released_by_host(&self) {
        self.peak
            .store(self.live.load(Ordering::Acquire), Ordering::Release);
    }

    /// A session counted in by [`Self::hold`] is gone.
    fn session_gone(self: &Arc<Self>) {
        // Never below zero: every hold was counted in by `hold()`.
        let live = self.live.fetch_sub(1, Ordering::AcqRel) - 1;
        let peak = self.peak.load(Ordering::Acquire);
        if !self.policy().releases_at(live, peak) || self.releasing.swap(true, Ordering::AcqRel) {
            return;
        }
        let memory = self.clone();
        let spawned = std::thread::Builder::new()
            .name("switchboard-idle-release".into())
            .spawn(move || memory.release_if_still_idle());
        if spawned.is_err() {
            // Out of threads: skip this one; the next time the engine drains tries again.
            self.releasing.store(false, Ordering::Release);
        }
    }

    /// Runs on the release thread. A session started since the drop would wait on the
    /// arena lock, so the release is left to the next time the engine drains.
    fn release_if_still_idle(&self) {
        if self.live.load(Ordering::Acquire) == 0 {
            // A session started since the check is live after the release: it counts.
            let peak_live = self
                .peak
                .swap(self.live.load(Ordering::Acquire), Ordering::AcqRel);
            let release = memory::trim();
            // Only this thread sends, one at a time: the last report numbers the next.
            self.reports.send_modify(|last| {
                let nth = last.map_or(0, |r| r.nth) + 1;
                *last = Some(IdleReleased {
                    nth,
                    peak_live,
                    release,
                });
            });
        }
        self.releasing.store(false, Ordering::Release);
    }
}

/// One session's memory as the engine counts it for idle release (see
/// [`IdleMemory::hold`]); dropping it counts the session gone.
#[derive(Debug)]
pub(crate) struct IdleHold {
    memory: Arc<IdleMemory>,
}

impl Drop for IdleHold {
    fn drop(&mut self) {
        self.memory.session_gone();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn after(n: u64) -> IdleRelease {
        IdleRelease::AfterPeak(NonZeroU64::new(n).unwrap())
    }

    #[test]
    fn releases_only_when_no_session_is_live_after_a_high_enough_peak() {
        assert!(after(3).releases_at(0, 3));
        assert!(after(3).releases_at(0, 10));
        assert!(!after(3).releases_at(0, 2), "too low a peak");
        assert!(!after(3).releases_at(1, 10), "a session is still live");
        assert!(!IdleRelease::Never.releases_at(0, u64::MAX));
    }

    #[test]
    fn the_policy_round_trips_through_its_atomic() {
        for policy in [IdleRelease::Never, after(1), after(1000), after(u64::MAX)] {
            assert_eq!(IdleRelease::decode(policy.encode()), policy);
        }
        assert_eq!(IdleRelease::default(), IdleRelease::Never);
        assert_eq!(IdleRelease::AFTER_BURST, after(1000));
    }
}
