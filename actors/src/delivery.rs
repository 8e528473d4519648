//! Tool items on their way to a chat context: which scope a run belongs to, and the answer
//! the run waits for.
//!
//! A run's later items (`/update_n`, `/finished`) travel once down — run → session (which
//! knows the current agent) → activity — and the activity answers the run directly once
//! they are in its chat context, or says why they never will be.

use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::error::UpdateError;
use crate::ids::ActorId;

/// Which scope a tool run belongs to. Written into snapshots as it is: a restored
/// activity has the id it had.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Scope {
    /// A session-scoped toolset: items go to the agent current at delivery time.
    Session,
    /// An agent-scoped toolset of this activity: items go only there.
    Activity(ActorId),
}

/// A tool run that asks for a sub-task (`ctx.run_task`): its key, which its caller's pause
/// spares, and its scope — an agent-scoped run stops with its activity's pause or close,
/// and a sub-task asked for by a run that stopped is not started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TaskAsker {
    pub(crate) run: u64,
    pub(crate) scope: Scope,
}

/// Where the answer to one delivery of tool items goes: sent once, when the items are in
/// a chat context or refused. Dropped unanswered — the session or activity stopped with
/// the delivery still queued or held — it answers [`UpdateError::Closed`], so whoever
/// waits always hears.
#[derive(Debug)]
pub(crate) struct DeliveryAnswer(Option<Target>);

#[derive(Debug)]
enum Target {
    Channel(oneshot::Sender<Result<(), UpdateError>>),
    Slot(Arc<AnswerSlot>),
}

impl DeliveryAnswer {
    /// An answer that goes to `to`.
    pub(crate) fn to(to: oneshot::Sender<Result<(), UpdateError>>) -> Self {
        Self(Some(Target::Channel(to)))
    }

    /// An answer that goes to `slot`, for whoever waits there, now or later.
    pub(crate) fn to_slot(slot: Arc<AnswerSlot>) -> Self {
        Self(Some(Target::Slot(slot)))
    }

    /// An answer for whoever awaits the returned future (`Closed` if it never comes).
    pub(crate) fn awaited() -> (
        Self,
        impl std::future::Future<Output = Result<(), UpdateError>> + Send + 'static,
    ) {
        let (tx, rx) = oneshot::channel();
        let heard = async move { rx.await.unwrap_or(Err(UpdateError::Closed)) };
        (Self::to(tx), heard)
    }

    /// An answer nobody waits for (a run's terminal output written as it is stopped, the
    /// engine's own items).
    pub(crate) fn unheard() -> Self {
        Self(None)
    }

    /// Whether somebody waits for it (a tool's `ctx.update`).
    pub(crate) fn is_heard(&self) -> bool {
        self.0.is_some()
    }

    /// Answers (a waiter that went away is no one's concern).
    pub(crate) fn send(mut self, result: Result<(), UpdateError>) {
        if let Some(target) = self.0.take() {
            target.send(result);
        }
    }
}

impl Target {
    fn send(self, result: Result<(), UpdateError>) {
        match self {
            Self::Channel(tx) => {
                let _ = tx.send(result);
            }
            Self::Slot(slot) => slot.land(result),
        }
    }
}

impl Drop for DeliveryAnswer {
    fn drop(&mut self) {
        if let Some(target) = self.0.take() {
            target.send(Err(UpdateError::Closed));
        }
    }
}

/// Where the answer to an update held until its step is in meets a body that asks for it
/// later: a restored run's body that says that update again waits for the item restored
/// with the step, whichever comes first — the item landing or the body asking.
#[derive(Debug, Default)]
pub(crate) struct AnswerSlot(Mutex<Slot>);

#[derive(Debug, Default)]
enum Slot {
    #[default]
    Empty,
    Landed(Result<(), UpdateError>),
    Waiting(oneshot::Sender<Result<(), UpdateError>>),
}

impl AnswerSlot {
    fn slot(&self) -> std::sync::MutexGuard<'_, Slot> {
        // Only plain data behind it: a panic elsewhere leaves it consistent.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The item's answer: to the body waiting, or kept until it asks.
    fn land(&self, result: Result<(), UpdateError>) {
        let mut slot = self.slot();
        match std::mem::take(&mut *slot) {
            Slot::Waiting(tx) => {
                let _ = tx.send(result);
            }
            _ => *slot = Slot::Landed(result),
        }
    }

    /// The body asks: answered at once if the item landed, else when it does.
    pub(crate) fn wait(&self, answer: oneshot::Sender<Result<(), UpdateError>>) {
        let mut slot = self.slot();
        match std::mem::take(&mut *slot) {
            Slot::Landed(result) => {
                let _ = answer.send(result);
            }
            _ => *slot = Slot::Waiting(answer),
        }
    }
}
