//! What an engine and its sessions report for monitoring: [`EngineStats`] and
//! [`SessionSummary`], read without a message to any session.
//!
//! Every figure is read from what the session's actors already publish for the host —
//! its journal's two counters (live actors, queued messages), its host view (inactivity,
//! tool runs, turns, the current agent) — so a summary answers also for a session whose
//! arbiter is stuck, which is the session an operator wants to see. An engine's figures
//! are the sum over its registry: the cost of a call grows with the number of live
//! sessions (a few milliseconds for 100,000), and nothing is counted per engine on the
//! hot path, where actors on different arbiters would write one shared counter.

use std::time::Duration;

use crate::ids::SessionId;
use crate::shared::SessionShared;

/// An engine's counts now, from [`Engine::stats`](crate::Engine::stats).
///
/// What to watch: `sessions` against the capacity you plan for; `backlog` that stays
/// above zero across several reads (a session, or an arbiter, that cannot keep up);
/// `actors` per session rising over time (tool runs that never end); `rss_bytes` after a
/// traffic peak (see [`Engine::release_memory`](crate::Engine::release_memory)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct EngineStats {
    /// Sessions live on the engine: from the start of `SessionBuilder::start` until the
    /// last actor of the session is gone, so a session still closing counts.
    pub sessions: usize,
    /// Actors of those sessions that started and have not stopped: the session, each
    /// agent activity (current, or paused under a sub-task), each toolset, each tool run.
    /// An idle session with one agent and no tools has 2.
    pub actors: usize,
    /// Messages sent to those actors and not yet handled: the engine's queues. Near zero
    /// on a healthy engine; work a session has queued for later (a turn waiting for the
    /// one before it) is not a message and not counted here.
    pub backlog: usize,
    /// Tool calls running in those sessions, in a turn or in the background.
    pub tool_runs: usize,
    /// The process's resident memory in bytes (`VmRSS` of `/proc/self/status`), where the
    /// system tells it (Linux); `None` elsewhere. The whole process, not only the engine.
    pub rss_bytes: Option<u64>,
    /// Whether the engine is draining ([`Engine::drain`](crate::Engine::drain)): it starts
    /// no new session.
    pub draining: bool,
    /// Stalls of its arbiters seen since the stall monitor started
    /// ([`Engine::monitor_stalls`](crate::Engine::monitor_stalls)); 0 while it is off.
    /// Each one held every session of its arbiter for longer than the threshold.
    pub arbiter_stalls: u64,
    /// The longest of those stalls that has ended.
    pub longest_arbiter_stall: Duration,
    /// Arbiters stalled now.
    pub stalled_arbiters: usize,
}

/// What one session is doing, from [`Session::summary`](crate::Session::summary) or, for
/// every live session of an engine, [`Engine::sessions`](crate::Engine::sessions).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionSummary {
    /// The session's id.
    pub id: SessionId,
    /// Whether it has work, is idle, or is closing.
    pub state: SessionState,
    /// The current agent; `None` before the first one entered, and the last one during a
    /// handoff or after close.
    pub agent: Option<String>,
    /// Turns that asked the model so far: user turns, replies and deferred replies (a
    /// `say` is not one).
    pub turns: u64,
    /// How long since the session was started (tokio's clock: paused test time moves it).
    pub age: Duration,
    /// Tool calls running in it now, in a turn or in the background.
    pub tool_runs: usize,
    /// Its actors that started and have not stopped.
    pub actors: usize,
    /// Messages sent to its actors and not yet handled.
    pub backlog: usize,
}

/// Whether a session has work, as a [`SessionSummary`] says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SessionState {
    /// It has work: it is starting, a turn runs or is queued, a speech is queued or
    /// playing, a handoff is under way, a deferred reply is wanted, or the user speaks.
    Active,
    /// No work (what `Session::wait_for_inactive` waits for); tools may still run in the
    /// background (`tool_runs`). Inactive with no tool run is settled: a drain closes it.
    Inactive,
    /// It is closing: `close()` was called, its last host handle was dropped, or a drain
    /// closes it.
    Closing,
    /// Every actor of it is gone (only a host still holding its `Session` sees this).
    Closed,
}

impl SessionSummary {
    /// The summary of the session whose shared state this is.
    pub(crate) fn of(shared: &SessionShared) -> Self {
        let view = &shared.host_view;
        let state = if shared.gone.is_gone() {
            SessionState::Closed
        } else if view.is_closing() {
            SessionState::Closing
        } else if *view.inactive.borrow() {
            SessionState::Inactive
        } else {
            SessionState::Active
        };
        Self {
            id: shared.id().clone(),
            state,
            agent: view.agent_name(),
            turns: u64::from(view.turns()),
            age: shared.started_at.elapsed(),
            tool_runs: view.running_tools(),
            actors: shared.journal.live_actors(),
            backlog: shared.journal.backlog(),
        }
    }
}

impl EngineStats {
    /// The sums over the sessions whose shared states these are.
    pub(crate) fn of(sessions: &[std::sync::Arc<SessionShared>], draining: bool) -> Self {
        let mut stats = Self {
            sessions: sessions.len(),
            actors: 0,
            backlog: 0,
            tool_runs: 0,
            rss_bytes: rss_bytes(),
            draining,
            // The engine fills these in when its stall monitor runs.
            arbiter_stalls: 0,
            longest_arbiter_stall: Duration::ZERO,
            stalled_arbiters: 0,
        };
        for shared in sessions {
            stats.actors += shared.journal.live_actors();
            stats.backlog += shared.journal.backlog();
            stats.tool_runs += shared.host_view.running_tools();
        }
        stats
    }
}

/// The process's resident set size, from `/proc/self/status` (in KiB there).
fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_is_read_where_the_system_has_it() {
        let rss = rss_bytes();
        if cfg!(target_os = "linux") {
            assert!(rss.is_some_and(|bytes| bytes > 0), "{rss:?}");
        }
    }
}
