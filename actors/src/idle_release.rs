//! The engine giving the memory of closed sessions back by itself, once it is idle.
//!
//! `malloc_trim` holds each arena's lock while it walks it (0.2–0.3 s for 480 MB of free
//! memory here), so run after some close while other sessions are live it would stall
//! their arbiter. Once the engine's last session is gone no arbiter has a session to
//! stall, and a burst that has just drained is exactly when the pages are worth handing
//! back. So the engine counts its live sessions and the sessions gone since the last
//! release, and when the count of live ones falls to zero with enough gone
//! ([`IdleRelease`]) it trims on a thread of its own. Checking twice (at the drop and again
//! on the release thread) keeps a session started meanwhile from being stalled by it.

use std::num::NonZeroU64;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::watch;

use crate::memory::{self, MemoryRelease};

/// When an [`Engine`](crate::Engine) gives the memory of closed sessions back to the system
/// by itself; set with [`Engine::set_idle_release`](crate::Engine::set_idle_release).
///
/// A release runs glibc's `malloc_trim` for the whole process (see [`crate::memory`]), on a
/// thread of its own, only once the engine has no live session: the moment a traffic peak
/// has fully drained. Allocations in an arena wait while it is walked, so a host that
/// keeps large free memory of its own and cannot afford that pause chooses
/// [`IdleRelease::Never`] and calls [`Engine::release_memory`](crate::Engine::release_memory)
/// when it suits it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdleRelease {
    /// The engine never releases by itself.
    Never,
    /// When the engine's last live session is gone and at least this many sessions have
    /// gone since the last release (by the engine or by the host). A few sessions leave
    /// little to give back (4.8 KiB each when idle), so a steady trickle of calls that
    /// passes through zero does not trim after each one.
    AfterClosing(NonZeroU64),
}

impl IdleRelease {
    /// The engines' default: `AfterClosing(1000)`, about 5 MB of idle sessions.
    pub const DEFAULT: Self = match NonZeroU64::new(1000) {
        Some(n) => Self::AfterClosing(n),
        None => Self::Never,
    };

    /// Whether a session going now, leaving `live` sessions and `gone` sessions gone since
    /// the last release, is the moment to release.
    fn releases_at(self, live: u64, gone: u64) -> bool {
        match self {
            Self::Never => false,
            Self::AfterClosing(enough) => live == 0 && gone >= enough.get(),
        }
    }

    fn encode(self) -> u64 {
        match self {
            Self::Never => 0,
            Self::AfterClosing(n) => n.get(),
        }
    }

    fn decode(raw: u64) -> Self {
        NonZeroU64::new(raw).map_or(Self::Never, Self::AfterClosing)
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
    /// How many sessions had gone since the release before this one.
    pub sessions_gone: u64,
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
    /// made); `None` once the engine is dropped. Releases that follow each other before
    /// this is awaited are reported as the latest one.
    pub async fn next(&mut self) -> Option<IdleReleased> {
        self.reports.changed().await.ok()?;
        *self.reports.borrow_and_update()
    }
}

/// An engine's count of live sessions and of sessions gone since the last release.
#[derive(Debug)]
pub(crate) struct IdleMemory {
    policy: AtomicU64,
    live: AtomicU64,
    gone: AtomicU64,
    /// A release thread is running; one at a time covers every session gone before it.
    releasing: AtomicBool,
    reports: watch::Sender<Option<IdleReleased>>,
}

impl IdleMemory {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            policy: AtomicU64::new(IdleRelease::DEFAULT.encode()),
            live: AtomicU64::new(0),
            gone: AtomicU64::new(0),
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

    /// A session about to start; it counts as live until the lease is dropped.
    pub(crate) fn lease(self: &Arc<Self>) -> SessionLease {
        self.live.fetch_add(1, Ordering::AcqRel);
        SessionLease(self.clone())
    }

    /// The host released: sessions gone before it no longer count toward the next one.
    pub(crate) fn released_by_host(&self) {
        self.gone.store(0, Ordering::Release);
    }

    fn session_gone(self: &Arc<Self>) {
        let gone = self.gone.fetch_add(1, Ordering::AcqRel) + 1;
        let live = self.live.fetch_sub(1, Ordering::AcqRel) - 1;
        if !self.policy().releases_at(live, gone) || self.releasing.swap(true, Ordering::AcqRel) {
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
            let sessions_gone = self.gone.swap(0, Ordering::AcqRel);
            let release = memory::trim();
            self.reports.send_replace(Some(IdleReleased {
                sessions_gone,
                release,
            }));
        }
        self.releasing.store(false, Ordering::Release);
    }
}

/// Held for as long as a session's actor runs (dropped after the actor and everything it
/// spawned); dropping it counts the session as gone.
#[derive(Debug)]
pub(crate) struct SessionLease(Arc<IdleMemory>);

impl Drop for SessionLease {
    fn drop(&mut self) {
        self.0.session_gone();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn after(n: u64) -> IdleRelease {
        IdleRelease::AfterClosing(NonZeroU64::new(n).unwrap())
    }

    #[test]
    fn releases_only_when_no_session_is_live_and_enough_have_gone() {
        assert!(after(3).releases_at(0, 3));
        assert!(after(3).releases_at(0, 10));
        assert!(!after(3).releases_at(0, 2), "too few gone");
        assert!(!after(3).releases_at(1, 10), "a session is still live");
        assert!(!IdleRelease::Never.releases_at(0, u64::MAX));
    }

    #[test]
    fn the_policy_round_trips_through_its_atomic() {
        for policy in [IdleRelease::Never, after(1), after(1000), after(u64::MAX)] {
            assert_eq!(IdleRelease::decode(policy.encode()), policy);
        }
        assert_eq!(IdleRelease::default(), after(1000));
    }
}
