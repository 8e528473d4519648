//! What a simulated realtime model says: a script of replies, one per response, in order.

use std::time::Duration;

use serde_json::Value;

use super::g711;
use crate::realtime::AudioFormat;

/// One response of a simulated realtime model: an audio answer with its transcript, calls
/// after it, or both (the usual shape of `gpt-realtime`: a spoken preamble, then a call).
#[derive(Clone, Debug, PartialEq)]
pub struct RealtimeReply {
    pub(crate) chunks: u32,
    pub(crate) chunk: Duration,
    pub(crate) pace: Duration,
    pub(crate) transcript: String,
    pub(crate) calls: Vec<(String, String)>,
    pub(crate) drop_after: Option<u32>,
}

impl RealtimeReply {
    /// An answer that says `transcript` in 20 ms audio chunks, one per word (at least
    /// one), sent in a burst as the real service does.
    pub fn speech(transcript: impl Into<String>) -> Self {
        let transcript = transcript.into();
        let words = transcript.split_whitespace().count().max(1);
        Self {
            chunks: u32::try_from(words).unwrap_or(u32::MAX),
            chunk: Duration::from_millis(20),
            pace: Duration::ZERO,
            transcript,
            calls: Vec::new(),
            drop_after: None,
        }
    }

    /// A response that only calls `name` with `arguments`.
    pub fn call(name: impl Into<String>, arguments: Value) -> Self {
        Self {
            chunks: 0,
            chunk: Duration::from_millis(20),
            pace: Duration::ZERO,
            transcript: String::new(),
            calls: Vec::new(),
            drop_after: None,
        }
        .and_call(name, arguments)
    }

    /// Adds a call after the answer.
    pub fn and_call(mut self, name: impl Into<String>, arguments: Value) -> Self {
        self.calls.push((name.into(), arguments.to_string()));
        self
    }

    /// The answer's audio is `chunks` chunks (its transcript spread over them).
    pub fn chunks(mut self, chunks: u32) -> Self {
        self.chunks = chunks;
        self
    }

    /// One chunk every `pace` (default: a burst), so the response is still active
    /// while the caller hears it.
    pub fn paced(mut self, pace: Duration) -> Self {
        self.pace = pace;
        self
    }

    /// The server drops the connection after `chunks` audio chunks of this answer (a
    /// network fault mid-response).
    pub fn drop_after(mut self, chunks: u32) -> Self {
        self.drop_after = Some(chunks);
        self
    }
}

/// The simulated model's script: its replies in order (one per response, whether the
/// server's VAD or the client asked for it), what the user is heard saying, and how its
/// voice detector hears the caller's audio.
#[derive(Clone, Debug, PartialEq)]
pub struct RealtimeScript {
    pub(crate) replies: Vec<RealtimeReply>,
    pub(crate) repeat: bool,
    pub(crate) user_transcript: String,
    /// A 16-bit sample at least this loud is speech.
    pub(crate) vad_threshold: i16,
    /// Silence after speech that ends the user's turn.
    pub(crate) vad_silence: Duration,
}

impl RealtimeScript {
    /// These replies, then the last one's shape again for any further response ("(the
    /// script is exhausted)", one chunk).
    pub fn new(replies: impl IntoIterator<Item = RealtimeReply>) -> Self {
        Self {
            replies: replies.into_iter().collect(),
            repeat: false,
            user_transcript: "hello".to_owned(),
            vad_threshold: 1000,
            vad_silence: Duration::from_millis(200),
        }
    }

    /// Starts over after the last reply.
    pub fn repeat(mut self) -> Self {
        self.repeat = true;
        self
    }

    /// What the server's transcription hears the user say in each turn of audio
    /// (default "hello").
    pub fn user_transcript(mut self, text: impl Into<String>) -> Self {
        self.user_transcript = text.into();
        self
    }

    /// The voice detector: a sample at least `threshold` loud is speech, and `silence`
    /// after speech ends the turn (default 1000 and 200 ms).
    pub fn vad(mut self, threshold: i16, silence: Duration) -> Self {
        self.vad_threshold = threshold;
        self.vad_silence = silence;
        self
    }
}

/// `ms` of a tone loud enough to be speech (PCM16, 24 kHz), for a test that plays the
/// caller: push it into an `AudioInput` while the user speaks, [`silence`] after.
pub fn tone(ms: u32) -> Vec<u8> {
    tone_in(AudioFormat::PCM16_24K, ms)
}

/// `ms` of silence (PCM16, 24 kHz).
pub fn silence(ms: u32) -> Vec<u8> {
    silence_in(AudioFormat::PCM16_24K, ms)
}

/// `ms` of a tone loud enough to be speech in `format` (a telephony caller's G.711, or
/// PCM16 at its rate).
pub fn tone_in(format: AudioFormat, ms: u32) -> Vec<u8> {
    samples_in(format, ms, |rate, i| {
        let phase = 2.0 * std::f64::consts::PI * 440.0 * i as f64 / f64::from(rate);
        (6000.0 * phase.sin()) as i16
    })
}

/// `ms` of silence in `format`.
pub fn silence_in(format: AudioFormat, ms: u32) -> Vec<u8> {
    samples_in(format, ms, |_, _| 0)
}

fn samples_in(format: AudioFormat, ms: u32, sample: impl Fn(u32, usize) -> i16) -> Vec<u8> {
    let rate = match format {
        AudioFormat::Pcm16 { rate } => rate,
        _ => 8_000,
    };
    let samples = (rate / 1000) as usize * ms as usize;
    let mut audio = Vec::with_capacity(samples * 2);
    for i in 0..samples {
        match format {
            AudioFormat::Pcm16 { .. } => audio.extend_from_slice(&sample(rate, i).to_le_bytes()),
            _ => audio.push(g711::encode(format, sample(rate, i))),
        }
    }
    audio
}
