//! `AudioInput`: the host's microphone, into the current agent's realtime model.

use std::fmt;
use std::sync::Arc;

use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::mpsc::Sender;

use crate::realtime_link::AudioIn;
use crate::shared::SessionShared;

/// Where the host pushes the user's audio when an agent talks through a realtime model
/// ([`Session::audio_input`](crate::Session::audio_input)).
///
/// The audio goes to the current agent's model, in the format its settings name for input
/// (PCM16 at 24 kHz unless set otherwise; nothing is resampled), gathered into pieces of
/// the model's `input_chunk` (100 ms by default) so that a 20 ms frame costs a copy, not a
/// message. Pushing never waits: when the model's connection is behind by more than about
/// two seconds (a reconnection), pieces are dropped and counted ([`dropped`](Self::dropped)).
/// While the current agent uses a text LLM, the audio is dropped without counting (a voice
/// host feeds its STT instead).
///
/// It follows the session: after a handoff to an agent of another realtime model, the
/// audio goes there. It does not keep the session alive.
pub struct AudioInput {
    shared: Arc<SessionShared>,
    generation: u64,
    sender: Option<Sender<AudioIn>>,
    piece: Vec<u8>,
    piece_bytes: usize,
    dropped: u64,
}

impl fmt::Debug for AudioInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AudioInput")
            .field("connected", &self.sender.is_some())
            .field("dropped", &self.dropped)
            .finish()
    }
}

impl AudioInput {
    pub(crate) fn new(shared: Arc<SessionShared>) -> Self {
        let mut input = Self {
            shared,
            generation: u64::MAX,
            sender: None,
            piece: Vec::new(),
            piece_bytes: 0,
            dropped: 0,
        };
        input.follow();
        input
    }

    /// Pushes the user's audio (any length; it is gathered into the model's pieces).
    pub fn push(&mut self, audio: &[u8]) {
        if self.shared.audio.generation() != self.generation {
            self.follow();
        }
        if self.sender.is_none() {
            return;
        }
        let mut rest = audio;
        while !rest.is_empty() {
            let room = self.piece_bytes - self.piece.len();
            let (now, later) = rest.split_at(room.min(rest.len()));
            self.piece.extend_from_slice(now);
            rest = later;
            if self.piece.len() == self.piece_bytes {
                let piece =
                    std::mem::replace(&mut self.piece, Vec::with_capacity(self.piece_bytes));
                self.send(AudioIn::Audio(piece));
            }
        }
    }

    /// Sends what was pushed and not yet sent (less than a piece).
    pub fn flush(&mut self) {
        if !self.piece.is_empty() {
            let piece = std::mem::replace(&mut self.piece, Vec::with_capacity(self.piece_bytes));
            self.send(AudioIn::Audio(piece));
        }
    }

    /// Ends the user's turn now (push to talk): what was pushed goes, and the model takes
    /// it as the user's turn. Only for a model without server turn detection; with it, the
    /// server ends turns by itself.
    pub fn commit(&mut self) {
        self.flush();
        self.send(AudioIn::Commit);
    }

    /// Pieces dropped because the model's connection was behind.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    fn send(&mut self, audio: AudioIn) {
        let Some(sender) = &self.sender else {
            return;
        };
        match sender.try_send(audio) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                self.dropped += 1;
                if self.dropped == 1 || self.dropped % 100 == 0 {
                    tracing::warn!(session = %self.shared.id(), dropped = self.dropped, "the realtime model's connection is behind: audio dropped");
                }
            }
            Err(TrySendError::Closed(_)) => self.sender = None,
        }
    }

    /// Takes the current agent's connection (the slot moved).
    fn follow(&mut self) {
        let (generation, link) = self.shared.audio.current();
        self.generation = generation;
        self.piece.clear();
        match link {
            Some(link) => {
                let settings = link.model().settings();
                let bytes_per_ms = settings.input_format.bytes_per_ms() as usize;
                let ms = settings.input_chunk.as_millis().max(1) as usize;
                self.piece_bytes = (bytes_per_ms * ms).max(1);
                self.piece = Vec::with_capacity(self.piece_bytes);
                self.sender = Some(link.audio());
            }
            None => self.sender = None,
        }
    }
}
