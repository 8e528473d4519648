//! `RunContext`: what a tool body gets. A thin `Send + Clone` handle over narrow links to
//! its run actor and its session; it holds no host handle, so a tool that keeps its
//! context (even past its own end) keeps nothing alive and can wait on nothing of its own
//! turn.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::watch;

use crate::agent::Agent;
use crate::chat::FunctionCall;
use crate::control::SessionControl;
use crate::error::{BlockingError, SessionError, UpdateError};
use crate::ids::ActorId;
use crate::speech::SpeechHandle;

/// An update's content: text (wrapped by the `update` template) or a structured value
/// (passed as is).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum UpdateMessage {
    /// Text, wrapped by the update template.
    Text(String),
    /// A JSON value, recorded as is.
    Json(Value),
}

impl From<String> for UpdateMessage {
    fn from(text: String) -> Self {
        Self::Text(text)
    }
}
impl From<&str> for UpdateMessage {
    fn from(text: &str) -> Self {
        Self::Text(text.to_owned())
    }
}
impl From<Value> for UpdateMessage {
    fn from(value: Value) -> Self {
        Self::Json(value)
    }
}

/// What a tool's context may ask of its run (implemented by the run actor's links).
pub(crate) trait RunPort: Send + Sync + 'static {
    /// The run actor's id (`tool/s1/7:call_3`).
    fn id(&self) -> &ActorId;
    /// Sends one update through the run; resolves once it is in a chat context.
    fn update(
        &self,
        message: UpdateMessage,
        reply: bool,
    ) -> BoxFuture<'static, Result<(), UpdateError>>;
    /// Holds the calling turn's interruptions off until the run ends.
    fn disallow_interruptions(&self);
    /// The session's slots on the blocking pool (`run_blocking`); none once the session
    /// is gone.
    fn blocking_slots(&self) -> Option<Arc<tokio::sync::Semaphore>>;
    /// The speech of the step that made the call, if it said something.
    fn speech(&self) -> Option<&SpeechHandle>;
    /// Runs a sub-task agent, pausing the caller (this run exempt).
    fn run_task(&self, agent: Agent) -> BoxFuture<'static, Result<Value, SessionError>>;
    /// Saves the run's checkpoint (what a snapshot records for it).
    fn checkpoint(&self, value: Value);
    /// For a run restored from a snapshot, the checkpoint it starts from (maybe none).
    fn restored(&self) -> Option<&Option<Value>>;
}

/// The context of one tool call: send updates, notice cancellation, queue work on the
/// session.
#[derive(Clone)]
pub struct RunContext {
    port: Arc<dyn RunPort>,
    session: SessionControl,
    call: Arc<FunctionCall>,
    cancelled: watch::Receiver<bool>,
}

/// The peer's name for the context of an async tool. Every tool may update and keep
/// running, so there is no special context type.
#[deprecated(
    since = "0.1.0",
    note = "use RunContext: async tools need no special context"
)]
pub type AsyncRunContext = RunContext;

impl fmt::Debug for RunContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunContext")
            .field("run", self.port.id())
            .field("call_id", &self.call.call_id)
            .finish()
    }
}

impl RunContext {
    pub(crate) fn new(
        port: Arc<dyn RunPort>,
        session: SessionControl,
        call: Arc<FunctionCall>,
        cancelled: watch::Receiver<bool>,
    ) -> Self {
        Self {
            port,
            session,
            call,
            cancelled,
        }
    }

    /// Reports progress. The first update is the call's output for the current LLM step
    /// (the tool goes on in the background); each later one is added to the current
    /// agent's chat context as `{call_id}/update_{n}` and answered by one coalesced reply
    /// once the session is idle.
    ///
    /// Resolves once the update is in a chat context. Returns `Err` once the run has
    /// returned or been stopped (cancelled, replaced, its agent paused or closed).
    pub async fn update(&self, message: impl Into<UpdateMessage>) -> Result<(), UpdateError> {
        self.port.update(message.into(), true).await
    }

    /// Reports progress the model should see without answering it: like
    /// [`update`](Self::update), but no reply is asked for it (the model reads it with
    /// whatever it is asked next). A first update with no reply is the call's output for
    /// the current step and asks for no further step on its own account; a later one
    /// lands in the chat context and schedules no deferred reply. LiveKit's
    /// `ctx.update(msg, silent=True)`; the update form of [`ToolReturn::NoReply`](crate::ToolReturn::NoReply).
    pub async fn update_no_reply(
        &self,
        message: impl Into<UpdateMessage>,
    ) -> Result<(), UpdateError> {
        self.port.update(message.into(), false).await
    }

    /// [`update_no_reply`](Self::update_no_reply), under its earlier name.
    #[deprecated(
        since = "0.1.0",
        note = "use update_no_reply: \"no reply\" is said one way"
    )]
    pub async fn update_silently(
        &self,
        message: impl Into<UpdateMessage>,
    ) -> Result<(), UpdateError> {
        self.update_no_reply(message).await
    }

    /// Resolves when the call is cancelled (by the model, a `replace` duplicate, the stop
    /// of its scope — a handoff, a pause, the session's close — or the user interrupting a
    /// tool that cancels on interruption). After it resolves the tool has the grace period
    /// to undo half-done work before its future is dropped. For a call-long tool
    /// (`Tool::call_long`) the stop of its scope is the end of the call it ran for: what it
    /// returns within the grace period is kept as its result.
    pub async fn cancelled(&self) {
        let mut rx = self.cancelled.clone();
        // An error means the run actor is gone, which is a cancellation too.
        let _ = rx.wait_for(|cancelled| *cancelled).await;
    }

    /// Whether the call has been cancelled.
    pub fn is_cancelled(&self) -> bool {
        *self.cancelled.borrow()
    }

    /// Runs `fut` unless the call is cancelled first: `None` on cancellation.
    pub async fn wait_if_not_cancelled<F: Future>(&self, fut: F) -> Option<F::Output> {
        tokio::select! {
            biased;
            () = self.cancelled() => None,
            out = fut => Some(out),
        }
    }

    /// Runs blocking or CPU-bound work — parsing a PDF, a synchronous database client,
    /// compressing a file — on tokio's blocking pool, and awaits its result.
    ///
    /// A tool body runs on its session's arbiter, one thread shared by many sessions:
    /// while a body computes without awaiting, no other session of that arbiter moves (a
    /// 2 s parse held the turns of every other session there for 2 s). Work handed here
    /// runs on a thread of the blocking pool instead, and the arbiter goes on with the
    /// other sessions meanwhile. An async client (`reqwest`, `sqlx`) needs none of this:
    /// await it in the body directly.
    ///
    /// Cancellation: when the call is cancelled (by the model, a duplicate that replaces
    /// it, the stop of its scope, a close) this returns
    /// [`BlockingError::Cancelled`] at once, so the body can clean up within its grace
    /// period. The closure itself cannot be stopped from outside: it runs on until it
    /// returns and its result is dropped. Work that takes long should look at a clone of
    /// the context between pieces ([`is_cancelled`](Self::is_cancelled)) and give up
    /// early. A job whose call is cancelled before it started — waiting for a slot of its
    /// session, or queued on a busy pool — never starts. A panic in the closure is the
    /// tool's panic (an error output, never the session's).
    ///
    /// Fairness: the pool is shared by the sessions of an arbiter (512 threads, first come
    /// first served), so each session has a few slots of it
    /// (`SessionBuilder::max_blocking_jobs`, 4 by default): at most that many of its jobs
    /// are on the pool at once, running or queued, and its further jobs wait for one of its
    /// own slots. One session's flood of jobs (or its jobs stuck for ever) then delays
    /// another session's job by at most one job's time, never by the flood. It is for work
    /// that ends, not for loops that wait for ever: a job that never returns keeps its slot.
    ///
    /// ```
    /// use switchboard::prelude::*;
    ///
    /// #[derive(serde::Deserialize, schemars::JsonSchema)]
    /// struct Document {
    ///     /// The document's text.
    ///     text: String,
    /// }
    ///
    /// /// A CPU-bound step: counts words the slow way.
    /// fn count_words(text: &str) -> usize {
    ///     text.split_whitespace().count()
    /// }
    ///
    /// let count = Tool::new(
    ///     "count_words",
    ///     "Counts the words of a document",
    ///     |ctx: RunContext, doc: Document| async move {
    ///         // A clone looks for cancellation from inside the work.
    ///         let watch = ctx.clone();
    ///         let words = ctx
    ///             .run_blocking(move || {
    ///                 let mut words = 0;
    ///                 for line in doc.text.lines() {
    ///                     if watch.is_cancelled() {
    ///                         break;
    ///                     }
    ///                     words += count_words(line);
    ///                 }
    ///                 words
    ///             })
    ///             .await?;
    ///         Ok::<_, ToolFailure>(format!("{words} words"))
    ///     },
    /// );
    /// # let _ = count;
    /// ```
    pub async fn run_blocking<F, T>(&self, work: F) -> Result<T, BlockingError>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let Some(slots) = self.port.blocking_slots() else {
            // The session is gone: so is the call.
            return Err(BlockingError::Cancelled {
                call_id: self.call.call_id.clone(),
            });
        };
        let cancelled = self.cancelled.clone();
        let job = async move {
            // A slot of the session, not a thread: further jobs of a session that has its
            // slots taken wait here, where a cancellation drops them unstarted.
            let slot = slots.acquire_owned().await.ok();
            tokio::task::spawn_blocking(move || {
                // Held until the work ends, not until the tool stops awaiting it: a
                // cancelled call's work still runs, and still counts.
                let _slot = slot;
                // Queued behind other sessions' work on a busy pool, the call may have
                // been cancelled (or its run gone) meanwhile: then it does not start.
                if *cancelled.borrow() || cancelled.has_changed().is_err() {
                    return None;
                }
                Some(work())
            })
            .await
        };
        tokio::select! {
            // A result that is there wins over a cancellation that came with it.
            biased;
            joined = job => match joined {
                Ok(Some(value)) => Ok(value),
                Ok(None) => Err(BlockingError::Cancelled {
                    call_id: self.call.call_id.clone(),
                }),
                // The tool's own panic: the run turns it into an error output, as a panic
                // in the body would be.
                Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
                Err(_) => Err(BlockingError::ShutDown {
                    call_id: self.call.call_id.clone(),
                }),
            },
            () = self.cancelled() => Err(BlockingError::Cancelled {
                call_id: self.call.call_id.clone(),
            }),
        }
    }

    /// The session this call runs in: queue a reply or a handoff, read its user data.
    /// Its requests return once queued, so a tool can ask for a handoff and go on.
    pub fn session(&self) -> &SessionControl {
        &self.session
    }

    /// The session's user data, if it is a `T`.
    pub fn userdata<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        self.session.userdata()
    }

    /// The call as recorded: canonical call id, tool name, raw arguments.
    pub fn function_call(&self) -> &FunctionCall {
        &self.call
    }

    /// Makes the speech of the calling turn uninterruptible while this tool runs: the user
    /// cannot barge in on it and `cancel_task` refuses this call (as LiveKit's
    /// `ctx.disallow_interruptions()`). Released when the tool ends.
    pub fn disallow_interruptions(&self) {
        self.port.disallow_interruptions();
    }

    /// The speech of the LLM step that made this call, if the model said something
    /// before calling (wait for it to be heard with `wait_for_playout`).
    pub fn speech(&self) -> Option<&SpeechHandle> {
        self.port.speech()
    }

    /// The run actor's id, as the mailbox inspector shows it (`tool/s1/7:call_3`).
    pub fn actor_id(&self) -> &ActorId {
        self.port.id()
    }

    /// Saves how far this call got, as serde data: a session snapshot taken while it runs
    /// records the last one saved, and after the session is restored the body run again
    /// ([`RestorePolicy::Resume`](crate::RestorePolicy::Resume) or
    /// [`Restart`](crate::RestorePolicy::Restart)) reads it back with
    /// [`restored_checkpoint`](Self::restored_checkpoint).
    pub fn checkpoint<T: serde::Serialize>(&self, value: &T) -> Result<(), serde_json::Error> {
        self.port.checkpoint(serde_json::to_value(value)?);
        Ok(())
    }

    /// Whether this call was restored from a snapshot (its body runs again, by the tool's
    /// [`RestorePolicy`](crate::RestorePolicy)).
    pub fn is_restored(&self) -> bool {
        self.port.restored().is_some()
    }

    /// The checkpoint this call saved before its session was snapshotted and restored:
    /// `Ok(None)` for a call that was not restored or saved none.
    pub fn restored_checkpoint<T: DeserializeOwned>(&self) -> Result<Option<T>, serde_json::Error> {
        match self.port.restored() {
            Some(Some(value)) => serde_json::from_value(value.clone()).map(Some),
            _ => Ok(None),
        }
    }

    /// Runs a sub-task agent and returns its typed result. The calling agent is paused
    /// meanwhile (its other agent-scoped runs stop); this run is exempt and produces its
    /// output when the caller resumes. If the session restores from a snapshot taken while
    /// the task runs, this body is not run again: the call's output is the task's result
    /// as JSON. An agent-scoped run stopped before its sub-task started (another call of
    /// its step paused the agent first) gets [`SessionError::TaskNotStarted`].
    pub async fn run_task<T: DeserializeOwned>(&self, agent: Agent) -> Result<T, SessionError> {
        let value = self.port.run_task(agent).await?;
        serde_json::from_value(value).map_err(SessionError::TaskResult)
    }
}
