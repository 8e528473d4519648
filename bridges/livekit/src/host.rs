//! The seam between the bridge and what it fronts: [`BridgeHost`], the host API a call's
//! inputs are applied to, and the [`SpeechSink`] through which the session's speech comes
//! back. A session in this process ([`LocalCall`]) and a session of a worker pool
//! (`RemoteSession`, feature `cluster`) are both hosts.

use std::future::Future;
use std::sync::{Arc, OnceLock};

use switchboard::{Playout, PlayoutReporter, Session, SpeechId, SpeechOutput};
use tokio::sync::mpsc;

use crate::protocol::{CallOutput, Participant, TurnOutcome};

/// Who is calling: what the worker's hello said, for the factory that starts the session.
#[derive(Clone, Debug, PartialEq)]
pub struct CallInfo {
    /// The call's session id (the same on every reconnection).
    pub session: String,
    /// The LiveKit room, when there is one.
    pub room: Option<String>,
    /// The caller, when known.
    pub participant: Option<Participant>,
    /// Anything else the worker passed on.
    pub metadata: serde_json::Value,
}

/// Why a host refused an input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct HostError(pub String);

/// The host API a call drives, one method per input of the worker. The bridge calls them
/// in the order the inputs came and polls each returned future once at once, before it
/// reads the next input: an implementation sends its input to the session on that first
/// poll (or before returning), so the session sees the inputs in order.
pub trait BridgeHost: Send + Sync + 'static {
    /// The user started speaking.
    fn user_started_speaking(&self)
        -> impl Future<Output = Result<(), HostError>> + Send + 'static;
    /// The user stopped speaking.
    fn user_stopped_speaking(&self)
        -> impl Future<Output = Result<(), HostError>> + Send + 'static;
    /// A transcript, interim or final.
    fn transcript(
        &self,
        text: String,
        is_final: bool,
    ) -> impl Future<Output = Result<(), HostError>> + Send + 'static;
    /// A typed user turn; resolves when the turn ends.
    fn run(&self, text: String) -> impl Future<Output = TurnOutcome> + Send + 'static;
    /// A speech's playout ended.
    fn playout_finished(
        &self,
        speech: SpeechId,
        interrupted: bool,
        heard: Option<String>,
    ) -> impl Future<Output = Result<(), HostError>> + Send + 'static;
    /// The call is over: close the session.
    fn close(&self) -> impl Future<Output = ()> + Send + 'static;
}

/// Where a session's speech goes: the call's outputs, in order. Handed to the factory
/// that starts the session; a local session takes its [`output`](Self::output), a remote
/// one forwards its speech events here. The call ends when the sink and every output made
/// from it are dropped (the session is gone).
#[derive(Clone, Debug)]
pub struct SpeechSink {
    tx: mpsc::UnboundedSender<CallOutput>,
    can_pause: bool,
    reporter: Arc<OnceLock<PlayoutReporter>>,
}

impl SpeechSink {
    pub(crate) fn new(can_pause: bool) -> (Self, mpsc::UnboundedReceiver<CallOutput>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let sink = Self {
            tx,
            can_pause,
            reporter: Arc::new(OnceLock::new()),
        };
        (sink, rx)
    }

    /// Whether the worker's audio output can pause.
    pub fn can_pause(&self) -> bool {
        self.can_pause
    }

    /// Sends one speech output to the call (dropped once the call is gone).
    pub fn send(&self, output: CallOutput) {
        // Fails only once the call's link is gone: then nobody listens.
        let _ = self.tx.send(output);
    }

    /// The [`SpeechOutput`] to give a local session (`SessionBuilder::output`).
    pub fn output(&self) -> BridgeOutput {
        BridgeOutput { sink: self.clone() }
    }

    /// The host for a local session started with [`output`](Self::output).
    pub fn local(&self, session: Session) -> LocalCall {
        LocalCall {
            session,
            reporter: self.reporter.clone(),
        }
    }
}

/// The [`SpeechOutput`] of a bridged local session: each call only queues the output for
/// the call's link (an unbounded channel, since the engine calls it on its arbiter thread
/// and must not block), and every playout is reported by the worker.
#[derive(Debug)]
pub struct BridgeOutput {
    sink: SpeechSink,
}

impl SpeechOutput for BridgeOutput {
    fn attach(&mut self, reporter: PlayoutReporter) {
        let _ = self.sink.reporter.set(reporter);
    }

    fn speech_started(&mut self, speech: SpeechId, agent: &str) {
        self.sink.send(CallOutput::SpeechStarted {
            speech,
            agent: agent.to_owned(),
        });
    }

    fn speech_chunk(&mut self, speech: SpeechId, text: &str) {
        self.sink.send(CallOutput::SpeechChunk {
            speech,
            text: text.to_owned(),
        });
    }

    fn speech_finished(&mut self, speech: SpeechId) -> Playout {
        self.sink.send(CallOutput::SpeechFinished { speech });
        Playout::Pending
    }

    fn interrupt(&mut self, speech: SpeechId) {
        self.sink.send(CallOutput::Interrupt { speech });
    }

    fn can_pause(&self) -> bool {
        self.sink.can_pause
    }

    fn pause(&mut self, speech: SpeechId) {
        self.sink.send(CallOutput::Pause { speech });
    }

    fn resume(&mut self, speech: SpeechId) {
        self.sink.send(CallOutput::Resume { speech });
    }
}

/// A session of this process as a bridge host: `Session` and the playout reporter its
/// [`BridgeOutput`] was given.
#[derive(Clone)]
pub struct LocalCall {
    session: Session,
    reporter: Arc<OnceLock<PlayoutReporter>>,
}

impl std::fmt::Debug for LocalCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalCall")
            .field("session", self.session.id())
            .finish()
    }
}

impl LocalCall {
    /// The session.
    pub fn session(&self) -> &Session {
        &self.session
    }
}

fn done() -> std::future::Ready<Result<(), HostError>> {
    std::future::ready(Ok(()))
}

impl BridgeHost for LocalCall {
    fn user_started_speaking(
        &self,
    ) -> impl Future<Output = Result<(), HostError>> + Send + 'static {
        self.session.user_started_speaking();
        done()
    }

    fn user_stopped_speaking(
        &self,
    ) -> impl Future<Output = Result<(), HostError>> + Send + 'static {
        self.session.user_stopped_speaking();
        done()
    }

    fn transcript(
        &self,
        text: String,
        is_final: bool,
    ) -> impl Future<Output = Result<(), HostError>> + Send + 'static {
        self.session.transcript(text, is_final);
        done()
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
        let result = match self.reporter.get() {
            Some(reporter) => {
                reporter.playout_finished(speech, interrupted, heard);
                Ok(())
            }
            None => Err(HostError(
                "the session was not started with the call's SpeechSink::output()".to_owned(),
            )),
        };
        std::future::ready(result)
    }

    fn close(&self) -> impl Future<Output = ()> + Send + 'static {
        let session = self.session.clone();
        async move {
            // Closed already (the engine drained it): nothing left to close.
            let _ = session.close().await;
        }
    }
}
