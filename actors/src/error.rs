//! Errors a user of the engine can act on, one enum per area.
//!
//! Each serializes (serde; JSON: a variant's name in snake case, with its fields) so that
//! an error of a session on another machine reaches its host as the same error. A cause
//! that is not data (an I/O error, a JSON error) travels as its message.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

/// Errors of session operations (`run`, `update_agent`, `close`, …).
#[derive(Debug, thiserror::Error, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum SessionError {
    /// The session is gone: closed (by `close()`, or because every host handle was
    /// dropped) or its engine shut down. Start a new one.
    #[error("the session is closed")]
    Closed,
    /// A host call made from inside a tool or hook of this same session, which would wait
    /// on the turn or handoff it runs in. Use the tool's or hook's `session()`
    /// (`SessionControl`), which queues the work and returns, or `RunContext::run_task`.
    #[error("{operation} was called on the host's Session from inside a tool or hook of the same session; awaiting it would wait on itself. Use ctx.session(), which queues the work, or ctx.run_task")]
    WouldDeadlock {
        /// The host call (`run`, `generate_reply`, `update_agent`, …).
        operation: Cow<'static, str>,
    },
    /// The current speech does not allow interruptions (its `say` options, the agent's or
    /// the session's setting, or a tool holding them off); `Session::force_interrupt` and
    /// `SpeechHandle::force_interrupt` interrupt it anyway.
    #[error("the current speech does not allow interruptions")]
    Uninterruptible,
    /// Too much work is queued behind the current turn; try again once it has run.
    #[error("the session already has {limit} jobs queued")]
    QueueFull {
        /// How many jobs a session queues at most.
        limit: usize,
    },
    /// The agents already started as much work on their own since the last user input
    /// as `SessionBuilder::max_agent_work` allows, so this reply or handoff was refused
    /// (a chain of replies and handoffs no user asked for). The session is still up: the
    /// next user input (`run`, `generate_reply`, a final transcript) lets the agents go
    /// on; raise the limit if a flow needs more steps on its own.
    #[error("{work} was refused: the agents already started {limit} replies and handoffs on their own since the last user input (SessionBuilder::max_agent_work); the next user input lets them go on")]
    AgentWorkLimit {
        /// What was refused.
        work: crate::events::AgentWork,
        /// The limit that was reached.
        limit: u32,
    },
    /// The session or an agent is misconfigured; for a handoff or a sub-task, its agent
    /// cannot start here (a tool-name clash, no LLM) and the current agent stays.
    #[error(transparent)]
    Build(#[from] BuildError),
    /// The turn failed (the model, or a tool whose error is routed `propagate`); the
    /// session is still up. `result` holds what the turn did before it failed: its items
    /// are in the chat context too.
    #[error("{failure}")]
    TurnFailed {
        /// Why it failed.
        failure: TurnFailure,
        /// What the turn added before it failed.
        result: Box<crate::events::RunResult>,
    },
    /// The engine cannot run the session (no actix system here, or it shut down).
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// A snapshot could not be read or restored (nothing was started).
    #[error(transparent)]
    Snapshot(#[from] crate::snapshot::SnapshotError),
    /// The snapshot store refused or failed the session's claim at its start
    /// (`save_snapshots`, `save_claimed`, `restore_from`): nothing was started.
    #[error(transparent)]
    Store(#[from] crate::snapshot::StoreError),
    /// `RunContext::run_task` from a tool run that was stopped with its agent (paused for
    /// another sub-task, handed off, closed) before the sub-task could start: it did not
    /// start, since nobody would wait for its result.
    #[error(
        "the sub-task did not start: the tool run that asked for it was stopped with its agent"
    )]
    TaskNotStarted,
    /// A sub-task's result did not have the type `run_task` asked for.
    #[error("the sub-task's result has an unexpected shape: {0}")]
    TaskResult(
        #[source]
        #[serde(with = "as_text::json")]
        serde_json::Error,
    ),
    /// Another session with this id is live on the same engine (`SessionBuilder::id`).
    /// Nothing was started. An id names one live session: pick another, or start this
    /// one once the other is gone (its `close()` returned, or every handle of it was
    /// dropped and it closed).
    #[error("a session with id {id} is already live on this engine; ids name live sessions: choose another id, or close that session first")]
    DuplicateSession {
        /// The id asked for.
        id: crate::ids::SessionId,
    },
}

/// Why the engine cannot run sessions.
#[derive(Debug, thiserror::Error, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum EngineError {
    /// `Engine::current()` outside an actix system.
    #[error("no actix arbiter on this thread: use Engine::start() from a tokio program, or write the test with #[switchboard::test]")]
    NoArbiter,
    /// The engine was shut down (`Engine::shutdown`): start a new one.
    #[error("the engine has shut down")]
    ShutDown,
    /// The operating system refused the engine's thread.
    #[error("cannot start the engine's thread: {0}")]
    Spawn(
        #[source]
        #[serde(with = "as_text::io")]
        std::io::Error,
    ),
    /// The engine's thread stopped before its actix system started.
    #[error("the engine's thread stopped before its actix system started")]
    NotStarted,
    /// The engine is draining (`Engine::drain`): it starts no new session. Start it on
    /// another engine or process; this one is about to go.
    #[error("the engine is draining and starts no new session: start it on another engine")]
    Draining,
}

impl SessionError {
    /// A failed turn, before the session adds what the turn did.
    pub(crate) fn turn_failed(failure: TurnFailure) -> Self {
        Self::TurnFailed {
            failure,
            result: Box::default(),
        }
    }

    /// What the turn did before it failed, for a failed turn.
    pub fn run_result(&self) -> Option<&crate::events::RunResult> {
        match self {
            Self::TurnFailed { result, .. } => Some(result),
            _ => None,
        }
    }

    /// The model's error, when the model failed the turn.
    pub fn llm_error(&self) -> Option<&crate::llm::LlmError> {
        match self {
            Self::TurnFailed {
                failure: TurnFailure::Llm(err),
                ..
            } => Some(err),
            _ => None,
        }
    }
}

/// Why a turn failed.
#[derive(Debug, thiserror::Error, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum TurnFailure {
    /// The model failed: an error from the provider, a timeout, a broken stream, a panic
    /// in the adapter. The turn's partial text is kept, marked interrupted.
    #[error(transparent)]
    Llm(#[from] crate::llm::LlmError),
    /// A tool failed with an error whose route is `propagate` (see `ErrorPolicy`): the
    /// call got an error output and an error event was sent.
    #[error("tool {tool} failed: {message}")]
    Tool {
        /// The tool's name.
        tool: String,
        /// The call that failed.
        call_id: String,
        /// The error with its cause chain.
        message: String,
    },
    /// One LLM step streamed more text than the limit (`SessionBuilder::max_reply_bytes`,
    /// `AgentBuilder::max_reply_bytes`): a runaway model. Its text up to the limit was
    /// spoken and is kept, marked interrupted; its stream was dropped and none of its tool
    /// calls ran. Raise the limit if the agent is meant to write that much.
    #[error("the model's reply went over the limit of {limit} bytes for one step; the text up to it is kept, the rest was dropped")]
    ReplyTooLong {
        /// The limit, in bytes.
        limit: usize,
    },
}

/// Errors found when an agent, toolset or session is built or an activity starts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum BuildError {
    /// Two tools an activity would see have the same name.
    #[error("tool name {name:?} is used twice: by {first} and by {second}")]
    DuplicateToolName {
        /// The clashing name.
        name: String,
        /// Where the first tool comes from: `agent booker` (its bare tools),
        /// `toolset booking of agent booker`, `session toolset booking`, `companion tools`.
        first: String,
        /// Where the second one comes from.
        second: String,
    },
    /// A tool name providers would reject.
    #[error("tool name {name:?} is invalid: use 1-64 ASCII letters, digits, '_' or '-'")]
    InvalidToolName {
        /// The name.
        name: String,
    },
    /// A tool with `on_duplicate = confirm` has its own argument named `confirm_duplicate`.
    #[error("tool {tool:?} has its own argument `confirm_duplicate`, which its on_duplicate = confirm policy adds")]
    ConfirmParameterClash {
        /// The tool.
        tool: String,
    },
    /// Neither the agent nor the session has an LLM.
    #[error("agent {agent:?} has no LLM and the session sets none")]
    NoLlm {
        /// The agent.
        agent: String,
    },
    /// A chat context given to start an agent with breaks the one-output-per-call rule.
    #[error("the given chat context cannot be continued: {reason}")]
    InvalidChat {
        /// What is wrong, naming the call and the item.
        reason: String,
    },
    /// The session has no starting agent.
    #[error("the session has no agent: call `.agent(..)` on the builder")]
    NoAgent,
    /// A restored session was also given a first agent: its agents come from the
    /// snapshot.
    #[error(
        "a restored session's agents come from its snapshot: drop `.agent(..)` from the builder"
    )]
    AgentWithRestore,
    /// A session id the host chose (`SessionBuilder::id`) that the engine cannot use.
    #[error("session id {id:?} is invalid: {reason}; use 1 to 128 bytes with no '/', whitespace or control character")]
    InvalidSessionId {
        /// The id asked for: its first 64 characters, with `…` when it was longer.
        id: String,
        /// What is wrong with it.
        reason: Cow<'static, str>,
    },
    /// A prompt template names a field its kind does not have.
    #[error("prompt template {template} names unknown field {{{field}}}; known fields: {known}")]
    UnknownTemplateField {
        /// Which template (`update`, `reply`, …).
        template: Cow<'static, str>,
        /// The unknown field.
        field: String,
        /// The fields it may use.
        known: String,
    },
}

/// Why `ctx.run_blocking(..)` gave no result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum BlockingError {
    /// The call was cancelled while its blocking work ran. The tool's await returned at
    /// once; the work itself cannot be stopped from outside and runs on in the blocking
    /// pool until it returns (its result is dropped). Return from the body; a closure
    /// that takes long can check a clone of the context's `is_cancelled()` to end early.
    #[error("tool call {call_id} was cancelled while its blocking work ran; the work goes on in the blocking pool until it returns, and its result is dropped")]
    Cancelled {
        /// The call id.
        call_id: String,
    },
    /// The runtime is shutting down (the engine stopped) and dropped the work before it
    /// ran to its end.
    #[error("the runtime is shutting down: the blocking work of tool call {call_id} did not run to its end")]
    ShutDown {
        /// The call id.
        call_id: String,
    },
}

/// Why `ctx.update(..)` failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum UpdateError {
    /// The run already returned, was cancelled, or was stopped with its scope.
    #[error("the tool run {call_id} has ended; its updates go nowhere")]
    RunEnded {
        /// The call id.
        call_id: String,
    },
    /// The agent that owns this run's scope is no longer current (paused or closed).
    #[error("the agent owning tool run {call_id} is no longer active")]
    ScopeClosed {
        /// The call id.
        call_id: String,
    },
    /// The session is closed.
    #[error("the session is closed")]
    Closed,
}

/// Causes that are not data, carried as their message.
mod as_text {
    /// An I/O error as its message; read back as an error of kind `Other` with it.
    pub(super) mod io {
        use serde::{Deserialize, Deserializer, Serializer};

        pub(crate) fn serialize<S: Serializer>(
            err: &std::io::Error,
            serializer: S,
        ) -> Result<S::Ok, S::Error> {
            serializer.collect_str(err)
        }

        pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
            deserializer: D,
        ) -> Result<std::io::Error, D::Error> {
            Ok(std::io::Error::other(String::deserialize(deserializer)?))
        }
    }

    /// A JSON error as its message; read back as a JSON error with it.
    pub(super) mod json {
        use serde::{Deserialize, Deserializer, Serializer};

        pub(crate) fn serialize<S: Serializer>(
            err: &serde_json::Error,
            serializer: S,
        ) -> Result<S::Ok, S::Error> {
            serializer.collect_str(err)
        }

        pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
            deserializer: D,
        ) -> Result<serde_json::Error, D::Error> {
            let message = String::deserialize(deserializer)?;
            Ok(<serde_json::Error as serde::de::Error>::custom(message))
        }
    }
}
