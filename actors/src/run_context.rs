//! `RunContext`: what a tool body gets. A thin `Send + Clone` handle over its run actor.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use tokio::sync::watch;

use crate::agent::Agent;
use crate::chat::FunctionCall;
use crate::error::{TaskError, UpdateError};
use crate::mailbox::Mailbox;
use crate::session_handle::Session;
use crate::tool_run::{ToolRunActor, ToolUpdate, UpdateMessage};

/// The context of one tool call: send updates, notice cancellation, reach the session.
#[derive(Clone)]
pub struct RunContext {
    run: Mailbox<ToolRunActor>,
    session: Session,
    call: Arc<FunctionCall>,
    key: u64,
    cancelled: watch::Receiver<bool>,
}

/// Kept for users of the peer's name: async tools need no special context type.
pub type AsyncRunContext = RunContext;

impl fmt::Debug for RunContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunContext")
            .field("run", self.run.id())
            .field("call_id", &self.call.call_id)
            .finish()
    }
}

impl RunContext {
    pub(crate) fn new(
        run: Mailbox<ToolRunActor>,
        session: Session,
        call: FunctionCall,
        key: u64,
        cancelled: watch::Receiver<bool>,
    ) -> Self {
        Self {
            run,
            session,
            call: Arc::new(call),
            key,
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
        let ended = || UpdateError::RunEnded {
            call_id: self.call.call_id.clone(),
        };
        if !self.run.connected() {
            return Err(ended());
        }
        self.run
            .ask(
                self.run.id(),
                ToolUpdate {
                    message: message.into(),
                },
            )
            .await
            .map_err(|_| ended())?
    }

    /// Resolves when the call is cancelled (by the model, a `replace` duplicate, or the
    /// stop of its scope). After it resolves the tool has the grace period to undo
    /// half-done work before its future is dropped.
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

    /// The session this call runs in.
    pub fn session(&self) -> &Session {
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

    /// Runs a sub-task agent and returns its typed result. The calling agent is paused
    /// meanwhile (its other agent-scoped runs stop); this run is exempt and produces its
    /// output when the caller resumes.
    pub async fn run_task<T: DeserializeOwned>(&self, agent: Agent) -> Result<T, TaskError> {
        self.session.run_task_from(agent, Some(self.key)).await
    }
}
