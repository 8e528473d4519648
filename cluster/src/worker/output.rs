//! `PublishingOutput`: the `SpeechOutput` a worker gives each session. It forwards the
//! speech (start, chunks, end, interrupt, pause, resume) to the session's loop, which
//! publishes it in order with the session's events. The front's playout reports come back
//! as inputs with ids (`Session::apply`), not through the `PlayoutReporter`.
//!
//! The engine calls it on its arbiter thread, once per chunk: each call only sends on an
//! unbounded channel (it must not block, and a bounded one would drop speech). The channel
//! holds at most what the session streams before its loop publishes it.

use switchboard::{Playout, PlayoutReporter, SpeechId, SpeechOutput};
use tokio::sync::mpsc;

use crate::remote_event::RemoteEventKind;
use crate::spec::OutputMode;

/// Forwards speech to the session's loop; see the module docs.
pub(crate) struct PublishingOutput {
    speech: mpsc::UnboundedSender<RemoteEventKind>,
    mode: OutputMode,
}

impl PublishingOutput {
    /// An output for a front that plays speech as `mode` says.
    pub(crate) fn new(speech: mpsc::UnboundedSender<RemoteEventKind>, mode: OutputMode) -> Self {
        Self { speech, mode }
    }

    fn send(&self, kind: RemoteEventKind) {
        // Fails only once the session's loop is gone: then nobody listens.
        let _ = self.speech.send(kind);
    }
}

impl SpeechOutput for PublishingOutput {
    // The playout reports come as the front's inputs, with ids: the reporter is not
    // needed.
    fn attach(&mut self, _reporter: PlayoutReporter) {}

    fn speech_started(&mut self, speech: SpeechId, agent: &str) {
        self.send(RemoteEventKind::SpeechStarted {
            speech,
            agent: agent.to_owned(),
        });
    }

    fn speech_chunk(&mut self, speech: SpeechId, text: &str) {
        self.send(RemoteEventKind::SpeechChunk {
            speech,
            text: text.to_owned(),
        });
    }

    fn speech_finished(&mut self, speech: SpeechId) -> Playout {
        self.send(RemoteEventKind::SpeechFinished { speech });
        match self.mode {
            OutputMode::Voice { .. } => Playout::Pending,
            _ => Playout::Done,
        }
    }

    fn interrupt(&mut self, speech: SpeechId) {
        self.send(RemoteEventKind::SpeechInterrupted { speech });
    }

    fn can_pause(&self) -> bool {
        matches!(self.mode, OutputMode::Voice { pausable: true })
    }

    fn pause(&mut self, speech: SpeechId) {
        self.send(RemoteEventKind::SpeechPaused { speech });
    }

    fn resume(&mut self, speech: SpeechId) {
        self.send(RemoteEventKind::SpeechResumed { speech });
    }
}
