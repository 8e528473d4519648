//! Agent output: the session streams each speech's text to an [`Io`] the host provides.
//!
//! Text I/O finishes playout at once; a voice I/O returns [`Playout::Pending`] and
//! reports the end (or the interruption, with what was heard) through
//! `Session::playout_finished`. The agent counts as speaking until then, so deferred
//! replies to tool updates wait for the user to hear the current speech.

use std::fmt;

/// Identifies one speech of a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpeechId(pub u64);

impl fmt::Display for SpeechId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "speech_{}", self.0)
    }
}

/// Whether a finished speech has been played out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Playout {
    /// Played (or there is nothing to play): the speech is done.
    #[default]
    Done,
    /// Still playing; the host calls `Session::playout_finished` when it ends.
    Pending,
}

/// Where the agent's speech goes: a console, a chat UI, a TTS pipeline.
///
/// Called from the session's arbiter thread, once per chunk: keep each call short (hand
/// the text to a channel or buffer).
pub trait Io: Send + 'static {
    /// A speech starts.
    fn speech_started(&mut self, _speech: SpeechId, _agent: &str) {}
    /// A piece of the speech's text.
    fn speech_chunk(&mut self, speech: SpeechId, text: &str);
    /// The speech's text is complete; say whether playout is done.
    fn speech_finished(&mut self, _speech: SpeechId) -> Playout {
        Playout::Done
    }
}

/// An [`Io`] that drops the speech: for sessions driven only through `RunResult` and
/// events.
#[derive(Debug, Default, Clone, Copy)]
pub struct NullIo;

impl Io for NullIo {
    fn speech_chunk(&mut self, _speech: SpeechId, _text: &str) {}
}
