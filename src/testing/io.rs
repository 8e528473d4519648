//! I/O for tests and demos.

use std::sync::{Arc, Mutex, MutexGuard};

use switchboard_actors::{Io, Playout, SpeechId};

/// What a [`RecordingIo`] saw of one speech.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedSpeech {
    /// The speech.
    pub id: SpeechId,
    /// The agent that spoke.
    pub agent: String,
    /// Its text.
    pub text: String,
    /// Whether its text is complete.
    pub finished: bool,
}

/// An [`Io`] that records every speech. With [`RecordingIo::manual_playout`], playout is
/// reported by the test (`Session::playout_finished`), like a voice pipeline would.
#[derive(Clone, Debug, Default)]
pub struct RecordingIo {
    speeches: Arc<Mutex<Vec<RecordedSpeech>>>,
    manual: bool,
}

impl RecordingIo {
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

    fn lock(&self) -> MutexGuard<'_, Vec<RecordedSpeech>> {
        self.speeches.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every speech so far.
    pub fn speeches(&self) -> Vec<RecordedSpeech> {
        self.lock().clone()
    }

    /// The newest speech, if any.
    pub fn last_speech(&self) -> Option<RecordedSpeech> {
        self.lock().last().cloned()
    }
}

impl Io for RecordingIo {
    fn speech_started(&mut self, speech: SpeechId, agent: &str) {
        self.lock().push(RecordedSpeech {
            id: speech,
            agent: agent.to_owned(),
            text: String::new(),
            finished: false,
        });
    }

    fn speech_chunk(&mut self, speech: SpeechId, text: &str) {
        if let Some(s) = self.lock().iter_mut().rev().find(|s| s.id == speech) {
            s.text.push_str(text);
        }
    }

    fn speech_finished(&mut self, speech: SpeechId) -> Playout {
        if let Some(s) = self.lock().iter_mut().rev().find(|s| s.id == speech) {
            s.finished = true;
        }
        if self.manual {
            Playout::Pending
        } else {
            Playout::Done
        }
    }
}

/// An [`Io`] that prints each speech to stdout as `agent> text`, each chunk as it comes.
#[derive(Clone, Copy, Debug, Default)]
pub struct ConsoleIo;

impl Io for ConsoleIo {
    fn speech_started(&mut self, _speech: SpeechId, agent: &str) {
        print!("{agent}> ");
        flush_stdout();
    }

    fn speech_chunk(&mut self, _speech: SpeechId, text: &str) {
        print!("{text}");
        // A streamed answer shows word by word, not when the line ends.
        flush_stdout();
    }

    fn speech_finished(&mut self, _speech: SpeechId) -> Playout {
        println!();
        Playout::Done
    }
}

fn flush_stdout() {
    use std::io::Write;
    // A closed stdout is not the session's problem.
    let _ = std::io::stdout().flush();
}
