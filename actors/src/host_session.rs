//! `HostSession`: the host API of a session as one trait (the trait's docs say more).

use std::future::Future;

use tokio::sync::broadcast;

use crate::agent::Agent;
use crate::error::SessionError;
use crate::events::{RunResult, SessionEvent};
use crate::history::SessionHistory;
use crate::session_handle::Session;
use crate::speech::SpeechHandle;

/// The host API of a session as one trait — what a front (a WebSocket
/// server, a telephony edge, a chat backend) drives — implemented by a session on this
/// engine ([`Session`]) and by one on another machine (the cluster's remote session), so
/// front code written once runs over either.
///
/// The calls are the host API's: a turn from text (`run`), a reply the agent makes on its
/// own (`generate_reply`), words to speak (`say`), the user's voice as the host's VAD and
/// STT report it (`user_started_speaking`, `transcript`, `user_stopped_speaking`), a
/// barge-in (`interrupt`), another agent (`update_agent`), the events, the conversation so
/// far (`history`) and the end (`close`). Every call answers with a `Result`: on another
/// machine even a report of the user's speech can fail to arrive, and a front must learn
/// it. Turns, histories, events and speech handles are the engine's own types (a speech's
/// handle interrupts that speech alone and learns how it ended, wherever it plays); what
/// differs by where the session runs is named by the associated types (how a failure
/// looks, how an agent is given).
///
/// A front generic over it:
///
/// ```
/// use switchboard::{HostSession, SessionEvents, SessionEvent};
///
/// /// Greets the caller, then answers one question; returns what the agent said.
/// async fn front<S: HostSession>(session: &S) -> Result<Vec<String>, S::Error> {
///     let mut events = session.events();
///     let greeting = session.generate_reply(Some("Greet the caller.".into())).await?;
///     let answer = session.run("When do you open?").await?;
///     // Whatever else happened, in order (speech for a TTS, states, …).
///     while let Some(Ok(event)) = events.try_next() {
///         if let SessionEvent::AgentStateChanged { .. } = event { /* show it */ }
///     }
///     Ok(greeting.assistant_messages().chain(answer.assistant_messages()).map(str::to_owned).collect())
/// }
/// ```
pub trait HostSession: Send + Sync {
    /// Why a call failed: [`SessionError`] for a local session; a remote one adds the
    /// failures of the way there.
    type Error: std::error::Error + Send + Sync + 'static;
    /// An agent to switch to, as this session takes one: the [`Agent`] itself here; on a
    /// remote worker, what its factory builds one from.
    type Agent: Send;
    /// The session's events, from the moment [`events`](Self::events) is called.
    type Events: SessionEvents;

    /// A user turn from text: the model answers (calling tools, handing off) and the
    /// turn's items come back. Queued behind a turn under way.
    fn run(
        &self,
        text: impl Into<String> + Send,
    ) -> impl Future<Output = Result<RunResult, Self::Error>> + Send;

    /// A turn without user input: the agent speaks on its own, told `instructions`.
    fn generate_reply(
        &self,
        instructions: Option<String>,
    ) -> impl Future<Output = Result<RunResult, Self::Error>> + Send;

    /// Speaks `text` as the agent (added to the chat), after what is being said; the
    /// speech's handle: [`SpeechHandle::interrupt`] stops that speech alone (queued, it
    /// never plays), [`SpeechHandle::wait_for_playout`] says how it ended.
    fn say(
        &self,
        text: impl Into<String> + Send,
    ) -> impl Future<Output = Result<SpeechHandle, Self::Error>> + Send;

    /// What the user said, as the host's STT heard it: an interim transcript
    /// (`is_final == false`, shown only) or a final one, which makes a turn once the user
    /// stops speaking.
    fn transcript(
        &self,
        text: impl Into<String> + Send,
        is_final: bool,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// The host's VAD heard the user start speaking: a speech playing pauses, and is
    /// interrupted if the user goes on.
    fn user_started_speaking(&self) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// The host's VAD heard the user stop speaking.
    fn user_stopped_speaking(&self) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Interrupts what the agent is saying and the turn behind it (refused while the
    /// speech does not allow interruptions).
    fn interrupt(&self) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Hands the conversation to `agent`, after the turn under way.
    fn update_agent(
        &self,
        agent: Self::Agent,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// The session's events from now on, in order.
    fn events(&self) -> Self::Events;

    /// The conversation so far, agent by agent.
    fn history(&self) -> impl Future<Output = Result<SessionHistory, Self::Error>> + Send;

    /// Ends the session once its agents closed; the whole conversation.
    fn close(&self) -> impl Future<Output = Result<SessionHistory, Self::Error>> + Send;
}

/// A session's events, in the order the session sent them.
pub trait SessionEvents: Send {
    /// The next event; `Err` when events were missed (the reader fell behind, or they were
    /// lost on the way); `None` once the session is gone and every event was read.
    fn next(&mut self) -> impl Future<Output = Option<Result<SessionEvent, EventsMissed>>> + Send;

    /// The next event if one is here already, without waiting.
    fn try_next(&mut self) -> Option<Result<SessionEvent, EventsMissed>>;
}

/// Events a reader did not get: it fell behind the session's bounded channel, or they were
/// lost on the way from another machine. The events after them come as usual.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{count} events were missed")]
pub struct EventsMissed {
    /// How many.
    pub count: u64,
}

/// A local session's events: its broadcast channel.
impl SessionEvents for broadcast::Receiver<SessionEvent> {
    async fn next(&mut self) -> Option<Result<SessionEvent, EventsMissed>> {
        match self.recv().await {
            Ok(event) => Some(Ok(event)),
            Err(broadcast::error::RecvError::Lagged(count)) => Some(Err(EventsMissed { count })),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }

    fn try_next(&mut self) -> Option<Result<SessionEvent, EventsMissed>> {
        match self.try_recv() {
            Ok(event) => Some(Ok(event)),
            Err(broadcast::error::TryRecvError::Lagged(count)) => Some(Err(EventsMissed { count })),
            Err(_) => None,
        }
    }
}

/// A session on this engine: each call is the inherent method of the same name.
impl HostSession for Session {
    type Error = SessionError;
    type Agent = Agent;
    type Events = broadcast::Receiver<SessionEvent>;

    async fn run(&self, text: impl Into<String> + Send) -> Result<RunResult, SessionError> {
        Session::run(self, text).await
    }

    async fn generate_reply(
        &self,
        instructions: Option<String>,
    ) -> Result<RunResult, SessionError> {
        Session::generate_reply(self, instructions).await
    }

    async fn say(&self, text: impl Into<String> + Send) -> Result<SpeechHandle, SessionError> {
        Session::say(self, text).await
    }

    async fn transcript(
        &self,
        text: impl Into<String> + Send,
        is_final: bool,
    ) -> Result<(), SessionError> {
        Session::transcript(self, text, is_final);
        Ok(())
    }

    async fn user_started_speaking(&self) -> Result<(), SessionError> {
        Session::user_started_speaking(self);
        Ok(())
    }

    async fn user_stopped_speaking(&self) -> Result<(), SessionError> {
        Session::user_stopped_speaking(self);
        Ok(())
    }

    async fn interrupt(&self) -> Result<(), SessionError> {
        Session::interrupt(self).await
    }

    async fn update_agent(&self, agent: Agent) -> Result<(), SessionError> {
        Session::update_agent(self, agent).await
    }

    fn events(&self) -> broadcast::Receiver<SessionEvent> {
        Session::subscribe(self)
    }

    async fn history(&self) -> Result<SessionHistory, SessionError> {
        Ok(Session::history(self).await)
    }

    async fn close(&self) -> Result<SessionHistory, SessionError> {
        Session::close(self).await
    }
}
