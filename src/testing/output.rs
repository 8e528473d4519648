//! Speech outputs for tests and demos.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use switchboard_actors::{Playout, PlayoutReporter, SpeechId, SpeechOutput};

/// What a [`RecordingOutput`] saw of one speech.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedSpeech {
    /// The speech.
    pub id: SpeechId,
    /// The agent that spoke.
    pub agent: String,
    /// Its text, as streamed.
    pub text: String,
    /// Whether its text is complete.
    pub finished: bool,
    /// Whether the engine told the output to stop playing it.
    pub interrupted: bool,
    /// Whether it is paused now.
    pub paused: bool,
    /// How much audio a realtime model played through it, in bytes.
    pub audio_bytes: usize,
}

/// One call the engine made on a [`RecordingOutput`], in order. New kinds may come as
/// `SpeechOutput` grows: match with a wildcard arm.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum OutputCall {
    /// `speech_started`.
    Started(SpeechId),
    /// `speech_chunk`, with the text.
    Chunk(SpeechId, String),
    /// `speech_finished`.
    Finished(SpeechId),
    /// `interrupt`.
    Interrupt(SpeechId),
    /// `pause`.
    Pause(SpeechId),
    /// `resume`.
    Resume(SpeechId),
}

#[derive(Debug, Default)]
struct Recorded {
    speeches: Vec<RecordedSpeech>,
    calls: Vec<OutputCall>,
    reporter: Option<PlayoutReporter>,
}

/// A [`SpeechOutput`] that records every speech and every call. Cheap to clone: keep a
/// clone in the test and give one to the session builder.
///
/// By default playout is done as soon as a speech's text is complete, like a chat UI.
/// [`RecordingOutput::manual_playout`] leaves it pending, like a voice pipeline: the test
/// then reports it with [`RecordingOutput::played_out`] or [`RecordingOutput::heard`].
/// [`RecordingOutput::pausable`] makes it accept `pause` and `resume`, so barge-ins pause
/// before they interrupt.
#[derive(Clone, Debug, Default)]
pub struct RecordingOutput {
    recorded: Arc<Mutex<Recorded>>,
    manual: bool,
    pausable: bool,
}

impl RecordingOutput {
    /// Records speeches; playout is done as soon as the text is complete.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records speeches; playout stays pending until the test reports it.
    pub fn manual_playout() -> Self {
        Self {
            manual: true,
            ..Self::default()
        }
    }

    /// Accepts `pause` and `resume` (`can_pause` is true).
    pub fn pausable(mut self) -> Self {
        self.pausable = true;
        self
    }

    fn lock(&self) -> MutexGuard<'_, Recorded> {
        self.recorded.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every speech so far.
    pub fn speeches(&self) -> Vec<RecordedSpeech> {
        self.lock().speeches.clone()
    }

    /// The newest speech, if any.
    pub fn last_speech(&self) -> Option<RecordedSpeech> {
        self.lock().speeches.last().cloned()
    }

    /// Every call the engine made, in order.
    pub fn calls(&self) -> Vec<OutputCall> {
        self.lock().calls.clone()
    }

    /// Reports that `speech` played out in full (what a voice pipeline does when its audio
    /// ends). Does nothing before the session attached the output.
    pub fn played_out(&self, speech: SpeechId) {
        if let Some(reporter) = self.lock().reporter.clone() {
            reporter.playout_finished(speech, false, None);
        }
    }

    /// Reports that `speech`'s audio (a realtime model's) was cut short after the user
    /// heard `played` of it.
    pub fn audio_heard(&self, speech: SpeechId, played: Duration) {
        if let Some(reporter) = self.lock().reporter.clone() {
            reporter.audio_finished(speech, true, played);
        }
    }

    /// Reports that `speech` was cut short after the user heard `heard` (empty: nothing).
    pub fn heard(&self, speech: SpeechId, heard: &str) {
        if let Some(reporter) = self.lock().reporter.clone() {
            reporter.playout_finished(speech, true, Some(heard.to_owned()));
        }
    }

    fn with_speech(&self, speech: SpeechId, f: impl FnOnce(&mut RecordedSpeech)) {
        if let Some(s) = self
            .lock()
            .speeches
            .iter_mut()
            .rev()
            .find(|s| s.id == speech)
        {
            f(s);
        }
    }
}

impl SpeechOutput for RecordingOutput {
    fn attach(&mut self, reporter: PlayoutReporter) {
        self.lock().reporter = Some(reporter);
    }

    fn speech_started(&mut self, speech: SpeechId, agent: &str) {
        let mut recorded = self.lock();
        recorded.calls.push(OutputCall::Started(speech));
        recorded.speeches.push(RecordedSpeech {
            id: speech,
            agent: agent.to_owned(),
            text: String::new(),
            finished: false,
            interrupted: false,
            paused: false,
            audio_bytes: 0,
        });
    }

    fn speech_chunk(&mut self, speech: SpeechId, text: &str) {
        self.lock()
            .calls
            .push(OutputCall::Chunk(speech, text.to_owned()));
        self.with_speech(speech, |s| s.text.push_str(text));
    }

    fn speech_audio(&mut self, speech: SpeechId, audio: &[u8]) {
        self.with_speech(speech, |s| s.audio_bytes += audio.len());
    }

    fn speech_finished(&mut self, speech: SpeechId) -> Playout {
        self.lock().calls.push(OutputCall::Finished(speech));
        self.with_speech(speech, |s| s.finished = true);
        if self.manual {
            Playout::Pending
        } else {
            Playout::Done
        }
    }

    fn interrupt(&mut self, speech: SpeechId) {
        self.lock().calls.push(OutputCall::Interrupt(speech));
        self.with_speech(speech, |s| s.interrupted = true);
    }

    fn can_pause(&self) -> bool {
        self.pausable
    }

    fn pause(&mut self, speech: SpeechId) {
        self.lock().calls.push(OutputCall::Pause(speech));
        self.with_speech(speech, |s| s.paused = true);
    }

    fn resume(&mut self, speech: SpeechId) {
        self.lock().calls.push(OutputCall::Resume(speech));
        self.with_speech(speech, |s| s.paused = false);
    }
}

/// A [`SpeechOutput`] that prints each speech to stdout as `agent> text`, streaming it as
/// it comes.
#[derive(Clone, Copy, Debug, Default)]
pub struct ConsoleOutput;

impl SpeechOutput for ConsoleOutput {
    fn speech_started(&mut self, _speech: SpeechId, agent: &str) {
        print!("{agent}> ");
    }

    fn speech_chunk(&mut self, _speech: SpeechId, text: &str) {
        use std::io::Write;
        print!("{text}");
        let _ = std::io::stdout().flush();
    }

    fn speech_finished(&mut self, _speech: SpeechId) -> Playout {
        println!();
        Playout::Done
    }
}
