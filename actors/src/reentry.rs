//! Knowing whether code runs inside a tool body or lifecycle hook of a session.
//!
//! Tool bodies and hooks run inside a turn or a handoff of their session. If one of them
//! got hold of the host's `Session` (captured from the host program) and awaited `run`,
//! `generate_reply`, `update_agent` or `run_task` on it, the call would queue behind the
//! very turn it runs in and never answer; `wait_for_settled` would wait for its own run
//! to end. The engine marks every tool body and hook it
//! polls with its session's id (a task-local), and those host calls fail at once with
//! `SessionError::WouldDeadlock` when they find their own session's mark.

use std::future::Future;

use crate::ids::SessionId;

tokio::task_local! {
    static INSIDE: SessionId;
}

/// Runs `fut` marked as engine code of `session`.
pub(crate) fn inside<F: Future>(session: SessionId, fut: F) -> impl Future<Output = F::Output> {
    INSIDE.scope(session, fut)
}

/// Whether the caller runs inside a tool body or hook of `session`.
pub(crate) fn is_inside(session: &SessionId) -> bool {
    INSIDE.try_with(|inside| inside == session).unwrap_or(false)
}
