//! Agent output: the session streams each speech's text to a [`SpeechOutput`] the host
//! provides — a console, a chat UI, a TTS pipeline.
//!
//! A text output finishes playout at once. A voice output returns [`Playout::Pending`]
//! from `speech_finished` and reports the end later through the [`PlayoutReporter`] it was
//! given when the session attached it: played out, or cut short with what the user heard.
//! Reports are accepted for any speech at any time, also while its text still streams.
//! The agent counts as speaking until then, so deferred replies to tool updates wait for
//! the user to hear the current speech.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Identifies one speech of a session (`speech_1`, `speech_2`, … in creation order).
/// Only the session makes them: a speech id names a speech it created.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct SpeechId(pub(crate) u64);

impl fmt::Display for SpeechId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "speech_{}", self.0)
    }
}

/// Whether a speech whose text is complete has been played out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Playout {
    /// Played (or there is nothing to play): the speech is done.
    #[default]
    Done,
    /// Still playing; the output reports the end through its [`PlayoutReporter`].
    Pending,
}

/// Where the agent's speech goes. The host implements it; the session calls it from its
/// arbiter thread, once per chunk: keep each call short (hand the text to a channel).
///
/// Speeches come one at a time, in order: a speech's chunks, then its `speech_finished`,
/// may overlap with the playing of the speech before it, which the output plays first.
pub trait SpeechOutput: Send + 'static {
    /// Called once when the session starts: how to report playout (keep it; it does not
    /// keep the session alive).
    fn attach(&mut self, _reporter: PlayoutReporter) {}
    /// A speech starts.
    fn speech_started(&mut self, _speech: SpeechId, _agent: &str) {}
    /// A piece of the speech's text (with a realtime model: the transcript of its audio).
    fn speech_chunk(&mut self, speech: SpeechId, text: &str);
    /// A piece of the speech's audio, from a realtime model, in the format its settings
    /// name for output (PCM16 at 24 kHz unless set otherwise). A voice output plays it and
    /// reports what was heard with [`PlayoutReporter::audio_finished`]; a text output
    /// ignores it (the default).
    fn speech_audio(&mut self, _speech: SpeechId, _audio: &[u8]) {}
    /// The speech's text is complete; say whether playout is done.
    fn speech_finished(&mut self, _speech: SpeechId) -> Playout {
        Playout::Done
    }
    /// Stop playing `speech` now (the user interrupted it, or the host asked): drop what
    /// is buffered, then report what was heard (`playout_finished(speech, true, heard)`).
    fn interrupt(&mut self, _speech: SpeechId) {}
    /// Whether `pause` and `resume` work: a pausable output lets a barge-in pause the
    /// speech first and resume it if the interruption was false.
    fn can_pause(&self) -> bool {
        false
    }
    /// Pause playing `speech` (the user started talking over it).
    fn pause(&mut self, _speech: SpeechId) {}
    /// Resume a paused `speech` (the interruption was false).
    fn resume(&mut self, _speech: SpeechId) {}
}

/// A [`SpeechOutput`] that drops the speech: for sessions driven only through
/// `RunResult` and events.
#[derive(Debug, Default, Clone, Copy)]
pub struct NullOutput;

impl SpeechOutput for NullOutput {
    fn speech_chunk(&mut self, _speech: SpeechId, _text: &str) {}
}

/// What a playout report says to the engine (implemented by the session's links).
pub(crate) trait PlayoutPort: Send + Sync + 'static {
    fn report(
        &self,
        speech: SpeechId,
        interrupted: bool,
        heard: Option<String>,
        heard_audio: Option<Duration>,
    );
}

/// How an output reports that a speech's playout ended. Cheap to clone; handed to the
/// output by [`SpeechOutput::attach`].
#[derive(Clone)]
pub struct PlayoutReporter {
    port: Arc<dyn PlayoutPort>,
}

impl fmt::Debug for PlayoutReporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PlayoutReporter")
    }
}

impl PlayoutReporter {
    pub(crate) fn new(port: Arc<dyn PlayoutPort>) -> Self {
        Self { port }
    }

    /// The playout of `speech` ended: fully (`interrupted == false`), or cut short, with
    /// `heard` the text the user heard (`None` when the output cannot tell). The speech's
    /// message in the chat context is cut to `heard`; a speech of which nothing was heard
    /// leaves no message. Accepted for any speech, at any time; ignored once the session
    /// is gone.
    pub fn playout_finished(&self, speech: SpeechId, interrupted: bool, heard: Option<String>) {
        self.port.report(speech, interrupted, heard, None);
    }

    /// The playout of `speech`'s audio (a realtime model's) ended after `played` of it:
    /// in full (`interrupted == false`), or cut short. A cut speech's audio is cut at the
    /// model at `played` (clamped to the audio the session received; nothing played
    /// removes it), and its message in the chat context keeps the same share of its text.
    /// Accepted for any speech, at any time; ignored once the session is gone.
    pub fn audio_finished(&self, speech: SpeechId, interrupted: bool, played: Duration) {
        self.port.report(speech, interrupted, None, Some(played));
    }
}
