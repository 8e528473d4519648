//! Giving the memory of closed sessions back to the system.
//!
//! A session's actors allocate on their arbiter's thread, so glibc serves them from that
//! thread's arena, in many small chunks (about 6.3 KiB per idle session in all). When a burst of
//! sessions closes, every chunk is freed, but glibc keeps the pages: small frees wait in
//! its fast bins unmerged, and the merged free space lies between chunks still in use (its
//! per-thread caches, the arbiter's own state), so an arena's top is never free enough to
//! shrink. The memory is reused by the next sessions, not leaked; only `malloc_trim` hands
//! it back, and it holds each arena's lock while it walks that arena's free chunks (0.2–0.3
//! s for 480 MB here). So the engine calls it by itself only once it has no live session
//! left ([`IdleRelease`](crate::IdleRelease)); the host can also ask, at a moment it
//! chooses, with [`Engine::release_memory`](crate::Engine::release_memory).

/// What [`Engine::release_memory`](crate::Engine::release_memory) did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryRelease {
    /// The allocator gave free pages back to the system.
    Released,
    /// The allocator had no free pages it could give back.
    NothingToRelease,
    /// This build's allocator offers no such call (only glibc on Linux does); the memory
    /// stays with the allocator, which reuses it for the next sessions.
    Unsupported,
}

/// Asks the allocator to give its free pages back, on a thread of its own: the call blocks
/// for as long as the walk over the free memory takes, which must not stall the host's
/// async worker or an arbiter.
pub(crate) async fn release() -> MemoryRelease {
    if !cfg!(all(target_os = "linux", target_env = "gnu")) {
        return MemoryRelease::Unsupported;
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("switchboard-release-memory".into())
        .spawn(move || {
            let _ = tx.send(trim());
        });
    match spawned {
        Ok(_) => {
            // The thread only calls `trim`, which cannot panic, so the sender is never
            // dropped unsent.
            rx.await.unwrap_or(MemoryRelease::NothingToRelease)
        }
        // Out of threads: release on the caller's thread rather than not at all.
        Err(_) => trim(),
    }
}

/// Runs the release on the calling thread, which it blocks for the walk.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(crate) fn trim() -> MemoryRelease {
    extern "C" {
        fn malloc_trim(pad: usize) -> std::os::raw::c_int;
    }
    // SAFETY: `malloc_trim` takes no pointer and only returns pages of chunks that are
    // free; glibc locks each arena while it walks it, so threads allocating meanwhile are
    // safe (those allocating in that arena wait).
    if unsafe { malloc_trim(0) } == 1 {
        MemoryRelease::Released
    } else {
        MemoryRelease::NothingToRelease
    }
}

/// Runs the release on the calling thread: nothing to do without glibc.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(crate) fn trim() -> MemoryRelease {
    MemoryRelease::Unsupported
}
