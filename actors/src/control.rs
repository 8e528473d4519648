//! `SessionControl`: what a tool body or a lifecycle hook may ask of its session.
//!
//! Engine code never holds the host's `Session`: a tool or hook runs *inside* a turn or a
//! handoff, so awaiting a host call that queues behind that turn would wait on itself.
//! `SessionControl` offers only requests that are answered as soon as the work is queued
//! (a reply after the current turn, a handoff after it, a text to say), and holds no
//! handle that keeps the session alive: when the host drops its last `Session`, the
//! session closes even if a tool still has its context.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use futures_util::future::BoxFuture;

use crate::agent::Agent;
use crate::error::SessionError;
use crate::handoff::Handoff;
use crate::ids::{ActorId, SessionId};
use crate::speech::{SayOptions, SpeechHandle};

/// The requests a tool or hook may send to its session, carried by narrow links (the
/// session implements it; see `session.rs`). Each resolves once the work is queued.
pub(crate) trait ControlPort: Send + Sync + 'static {
    /// Queues a reply of the current agent after the current turn.
    fn queue_reply(
        &self,
        from: &ActorId,
        instructions: Option<String>,
    ) -> BoxFuture<'static, Result<(), SessionError>>;

    /// Queues a handoff after the current turn (or at once when it interrupts).
    fn queue_handoff(
        &self,
        from: &ActorId,
        handoff: Handoff,
    ) -> BoxFuture<'static, Result<(), SessionError>>;

    /// Queues a text to say as it is, like the host's `say`.
    fn say(
        &self,
        from: &ActorId,
        text: String,
        options: SayOptions,
    ) -> BoxFuture<'static, Result<SpeechHandle, SessionError>>;
}

/// A tool's or hook's view of its session: queue a reply or a handoff, read the session's
/// id and user data. Cheap to clone.
///
/// Every request returns as soon as the session has queued it: awaiting it inside a tool
/// or hook never waits for the turn that tool or hook runs in.
#[derive(Clone)]
pub struct SessionControl {
    inner: Arc<ControlInner>,
}

struct ControlInner {
    session: SessionId,
    from: ActorId,
    port: Arc<dyn ControlPort>,
    userdata: Option<Arc<dyn Any + Send + Sync>>,
}

impl fmt::Debug for SessionControl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionControl")
            .field("session", &self.inner.session)
            .field("from", &self.inner.from)
            .finish()
    }
}

impl SessionControl {
    pub(crate) fn new(
        session: SessionId,
        from: ActorId,
        port: Arc<dyn ControlPort>,
        userdata: Option<Arc<dyn Any + Send + Sync>>,
    ) -> Self {
        Self {
            inner: Arc::new(ControlInner {
                session,
                from,
                port,
                userdata,
            }),
        }
    }

    /// The session's id.
    pub fn id(&self) -> &SessionId {
        &self.inner.session
    }

    /// The session's user data, if it is a `T`.
    pub fn userdata<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        self.inner.userdata.clone()?.downcast().ok()
    }

    /// Queues a reply of the current agent, with these extra instructions, after the
    /// current turn. Returns once it is queued ([`SessionError::Closed`] when the session
    /// is gone, [`SessionError::QueueFull`] when too much work waits).
    pub async fn generate_reply(
        &self,
        instructions: impl Into<String>,
    ) -> Result<(), SessionError> {
        self.inner
            .port
            .queue_reply(&self.inner.from, Some(instructions.into()))
            .await
    }

    /// Queues a handoff to `agent` after the current turn. Returns once it is queued;
    /// an agent that could not start here (a tool-name clash, no LLM) is refused at once
    /// with [`SessionError::Build`] and the current agent stays.
    pub async fn update_agent(&self, agent: Agent) -> Result<(), SessionError> {
        self.handoff(Handoff::to(agent)).await
    }

    /// Queues a handoff (see [`SessionControl::update_agent`]); one built with
    /// [`Handoff::interrupting`] stops the current turn first.
    pub async fn handoff(&self, handoff: Handoff) -> Result<(), SessionError> {
        self.inner
            .port
            .queue_handoff(&self.inner.from, handoff)
            .await
    }

    /// Says `text` as it is, like the host's [`Session::say`](crate::Session::say): queued
    /// by priority behind what the agents are saying, in the current agent's chat once it
    /// has played. Returns its handle once queued (never waiting for the turn the tool or
    /// hook runs in); await [`SpeechHandle::wait_for_playout`] for its end, from a
    /// background tool or a task, not from a tool of the turn it queues behind.
    pub async fn say(&self, text: impl Into<String>) -> Result<SpeechHandle, SessionError> {
        self.say_with(text, SayOptions::new()).await
    }

    /// [`say`](Self::say) with options: whether it may be interrupted, whether it goes
    /// into the chat context, its priority.
    pub async fn say_with(
        &self,
        text: impl Into<String>,
        options: SayOptions,
    ) -> Result<SpeechHandle, SessionError> {
        self.inner
            .port
            .say(&self.inner.from, text.into(), options)
            .await
    }
}
