//! What a session reports for monitoring: [`SessionSummary`], read without a message to
//! the session.
//!
//! Every figure is read from what the session's actors already publish for the host —
//! its journal's two counters (live actors, queued messages), its host view (inactivity,
//! tool runs, turns, the current agent) — so a summary answers also for a session whose
//! arbiter is stuck, which is the session an operator wants to see.

use std::time::Duration;

use crate::ids::SessionId;
use crate::shared::SessionShared;

/// What one session is doing, from [`Session::summary`](crate::Session::summary).
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
    /// background (`tool_runs`). Inactive with no tool run is settled.
    Inactive,
    /// It is closing: `close()` was called, or its last host handle was dropped.
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
