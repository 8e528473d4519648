//! `Engine::drain`: the engine's orderly end (a deploy, a scale-down, SIGTERM).
//!
//! From the call on the registry refuses new sessions (`EngineError::Draining`); every
//! session live then — also one whose start is under way — is let settle (no turn, no
//! queued work, no deferred reply, no tool run but call-long ones) until the deadline,
//! then closed; one not settled at the deadline has its turn force-interrupted first. The
//! close is bounded as every close is (the grace period per wait on user code), so a drain
//! returns within its deadline, the interruption's wait for what the user heard of a cut
//! speech (2 s at most) and a close. Each session is drained
//! by one future, all of them polled by the caller's task: a session waits on its own
//! settle signal (`HostView::settled`) and its `gone` signal, so a thousand sessions cost
//! a thousand idle futures, not a thousand timers or threads. The drain holds a session's
//! shared state (not an address: it keeps no actor alive) so that its history is there
//! once it is gone, and reaches its host end only through the registry's weak
//! [`DrainPort`] at the moment it interrupts or closes it.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;

use crate::events::Unfinished;
use crate::history::SessionHistory;
use crate::ids::SessionId;
use crate::registry::{LiveSession, Registry};
use crate::shared::SessionShared;

/// What [`Engine::drain`](crate::Engine::drain) did.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct DrainReport {
    /// Every session that was live when the drain began (or starting then), in the order
    /// they were gone, each with its transcript.
    pub sessions: Vec<DrainedSession>,
    /// How long the drain took, from the call until the last session was gone.
    pub took: Duration,
}

/// One session a drain closed.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct DrainedSession {
    /// The session's id.
    pub id: SessionId,
    /// How it ended.
    pub ended: DrainEnd,
    /// What `close()` returns: the final chat context of every agent it ran. A tool that
    /// was still running has its terminal output in it.
    pub history: SessionHistory,
    /// What its close stopped waiting for: tool bodies, hooks or snapshot writes that had
    /// not finished within the grace period (each was also a
    /// [`SessionEvent::Unfinished`](crate::SessionEvent::Unfinished) event). Empty when
    /// everything finished.
    pub unfinished: Vec<Unfinished>,
}

/// How a drained session ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DrainEnd {
    /// It settled before the deadline, and the drain closed it.
    Settled,
    /// It had not settled at the deadline: the drain force-interrupted its turn, then
    /// closed it (running tools were cancelled with their grace period and got their
    /// terminal outputs).
    Interrupted,
    /// It was closing already when the drain came to it: its host closed it, or dropped
    /// its last handle (or an earlier drain, still under way, closed it).
    ClosedByHost,
}

/// Drains every session of `registry` (see the module docs).
pub(crate) async fn drain(registry: &Registry, deadline: Duration) -> DrainReport {
    let began = Instant::now();
    let until = began + deadline;
    registry.start_draining();
    let mut seen: HashSet<SessionId> = HashSet::new();
    let mut closing = FuturesUnordered::new();
    let mut sessions = Vec::new();
    // Created before each listing and kept until it fires: a start that completes (or
    // fails) between the listing and the wait is not missed.
    let mut changed = Box::pin(registry.changed());
    let mut relist = true;
    let mut starting = false;
    loop {
        if relist {
            changed = Box::pin(registry.changed());
            relist = false;
            starting = false;
            for (id, place) in registry.list() {
                match place {
                    // Reserved before the drain began; its start will fill the place in
                    // (or free it, if it fails): wait for that.
                    None => starting = true,
                    Some(live) => {
                        if seen.insert(id.clone()) {
                            closing.push(drain_one(id, live, until));
                        }
                    }
                }
            }
        }
        if closing.is_empty() && !starting {
            break;
        }
        tokio::select! {
            Some(done) = closing.next(), if !closing.is_empty() => sessions.push(done),
            () = changed.as_mut(), if starting => relist = true,
            else => break,
        }
    }
    DrainReport {
        sessions,
        took: began.elapsed(),
    }
}

/// Lets one session settle until `until`, closes it (interrupting it first if it did not
/// settle), and waits until it is gone.
async fn drain_one(id: SessionId, live: LiveSession, until: Instant) -> DrainedSession {
    let Some(shared) = live.shared.upgrade() else {
        // Gone since the listing, with no host holding its state: nothing to report.
        return DrainedSession {
            id,
            ended: DrainEnd::ClosedByHost,
            history: SessionHistory::default(),
            unfinished: Vec::new(),
        };
    };
    // A session that closes meanwhile (its host closed it) ends the wait too.
    let _ = tokio::time::timeout_at(until, async {
        tokio::select! {
            () = settled(&shared) => {}
            () = shared.gone.clone().wait() => {}
        }
    })
    .await;
    let ended = match live.host.upgrade() {
        // No host handle left: the session closes itself, as `close()` would.
        None => DrainEnd::ClosedByHost,
        Some(_) if shared.host_view.is_closing() => DrainEnd::ClosedByHost,
        Some(host) => {
            let ended = if shared.host_view.is_settled() {
                DrainEnd::Settled
            } else {
                host.force_interrupt().await;
                DrainEnd::Interrupted
            };
            host.close();
            ended
        }
    };
    shared.gone.clone().wait().await;
    DrainedSession {
        id,
        ended,
        // Every activity recorded its final chat context as it stopped.
        history: shared.history.read(Vec::new()),
        unfinished: shared.unfinished.read(),
    }
}

/// Resolves once the session is settled: inactive, and no tool run alive.
async fn settled(shared: &Arc<SessionShared>) {
    loop {
        // Created before the check: a settle in between is not missed.
        let settled = shared.host_view.settled();
        if shared.host_view.is_settled() {
            return;
        }
        settled.await;
    }
}
