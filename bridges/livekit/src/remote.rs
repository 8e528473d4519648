//! [`RemoteCall`]: a session of a switchboard worker pool (`switchboard-cluster`'s
//! `RemoteSession`, reached through its `Gateway`) as a bridge host, so a LiveKit worker
//! fronts the pool as it fronts a session in this process.
//!
//! Inputs go through the remote session's own exactly-once submission (each is queued on
//! the first poll of its future, so they keep their order); its speech comes back as the
//! session's speech events, which a task forwards to the call. When the remote session
//! ends, the task ends and drops the call's sink, and the call ends.

use std::future::Future;

use switchboard::SpeechId;
use switchboard_cluster::{RemoteEventKind, RemoteEventsError, RemoteSession};
use tokio::task::AbortHandle;

use crate::host::{BridgeHost, HostError, SpeechSink};
use crate::protocol::{CallOutput, TurnOutcome};

/// A remote session as a bridge host; see the module docs.
pub struct RemoteCall {
    session: RemoteSession,
    forward: AbortHandle,
}

impl std::fmt::Debug for RemoteCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteCall")
            .field("session", self.session.id())
            .finish()
    }
}

impl Drop for RemoteCall {
    fn drop(&mut self) {
        self.forward.abort();
    }
}

impl RemoteCall {
    /// Fronts `session`, forwarding its speech to `speech`. Start the session with
    /// `OutputMode::Voice { pausable: speech.can_pause() }` in its `SessionSpec`, so the
    /// pool's worker waits for the LiveKit worker's playout reports.
    pub fn new(session: RemoteSession, speech: SpeechSink) -> Self {
        // From its first event: a greeting spoken before this call was made is not missed.
        let mut events = session.subscribe_from(1);
        let forward = tokio::spawn(async move {
            loop {
                let event = match events.recv().await {
                    Ok(event) => event,
                    Err(RemoteEventsError::Lagged { missed }) => {
                        tracing::warn!(missed, "a bridged remote session's speech fell behind");
                        continue;
                    }
                    // Closed, or a kind of error added later: either way no more speech.
                    Err(_) => return,
                };
                let output = match event.kind {
                    RemoteEventKind::SpeechStarted { speech, agent } => {
                        CallOutput::SpeechStarted { speech, agent }
                    }
                    RemoteEventKind::SpeechChunk { speech, text } => {
                        CallOutput::SpeechChunk { speech, text }
                    }
                    RemoteEventKind::SpeechFinished { speech } => {
                        CallOutput::SpeechFinished { speech }
                    }
                    RemoteEventKind::SpeechInterrupted { speech } => {
                        CallOutput::Interrupt { speech }
                    }
                    RemoteEventKind::SpeechPaused { speech } => CallOutput::Pause { speech },
                    RemoteEventKind::SpeechResumed { speech } => CallOutput::Resume { speech },
                    RemoteEventKind::SessionClosed { .. } => return,
                    _ => continue,
                };
                speech.send(output);
            }
        })
        .abort_handle();
        Self { session, forward }
    }

    /// The remote session.
    pub fn session(&self) -> &RemoteSession {
        &self.session
    }
}

fn refused<E: std::fmt::Display>(result: Result<(), E>) -> Result<(), HostError> {
    result.map_err(|error| HostError(error.to_string()))
}

impl BridgeHost for RemoteCall {
    fn user_started_speaking(
        &self,
    ) -> impl Future<Output = Result<(), HostError>> + Send + 'static {
        let session = self.session.clone();
        async move { refused(session.user_started_speaking().await) }
    }

    fn user_stopped_speaking(
        &self,
    ) -> impl Future<Output = Result<(), HostError>> + Send + 'static {
        let session = self.session.clone();
        async move { refused(session.user_stopped_speaking().await) }
    }

    fn transcript(
        &self,
        text: String,
        is_final: bool,
    ) -> impl Future<Output = Result<(), HostError>> + Send + 'static {
        let session = self.session.clone();
        async move { refused(session.transcript(text, is_final).await) }
    }

    fn run(&self, text: String) -> impl Future<Output = TurnOutcome> + Send + 'static {
        let session = self.session.clone();
        async move {
            match session.run(text).await {
                Ok(result) => TurnOutcome::Done {
                    events: result.events,
                    interrupted: result.interrupted,
                },
                Err(error) => TurnOutcome::Failed {
                    error: error.to_string(),
                },
            }
        }
    }

    fn playout_finished(
        &self,
        speech: SpeechId,
        interrupted: bool,
        heard: Option<String>,
    ) -> impl Future<Output = Result<(), HostError>> + Send + 'static {
        let session = self.session.clone();
        async move { refused(session.playout_finished(speech, interrupted, heard).await) }
    }

    fn close(&self) -> impl Future<Output = ()> + Send + 'static {
        let session = self.session.clone();
        async move {
            // Closed already (it ended on its worker): nothing left to close.
            let _ = session.close().await;
        }
    }
}
