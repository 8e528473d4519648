//! Realtime speech-to-speech models: audio in, audio out, one connection per session, the
//! model deciding when the user's turn ends.
//!
//! An agent uses a [`RealtimeModel`] in place of an [`Llm`](crate::Llm)
//! (`AgentBuilder::realtime`, `SessionBuilder::realtime`). Everything else stays: the same
//! tools and toolsets, async tools and their updates, handoffs, sub-tasks, the one-output
//! rule, events and snapshots. The engine keeps the protocol's rules (one response at a
//! time, every call answered before the next response, a truncation never past the audio
//! received); a provider only moves the events of this module over its connection:
//!
//! - [`RealtimeModel`]: what the model can do ([`RealtimeCapabilities`]), how its session
//!   is set up ([`RealtimeSettings`]) and how to open a connection.
//! - [`RealtimeConnection`]: one open connection (a WebSocket): it sends [`ClientEvent`]s
//!   and yields [`ServerEvent`]s, encoded the provider's way.
//!
//! The events follow the OpenAI Realtime API (GA): a conversation of items with ids,
//! responses the server runs one at a time, audio appended to an input buffer. A provider
//! with another shape maps onto them as far as its [`RealtimeCapabilities`] say.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::future::BoxFuture;

use crate::chat::ChatRole;
use crate::llm::{Llm, LlmUsage, ToolChoice, ToolSchema};

/// A realtime speech-to-speech model (OpenAI Realtime; a scripted one for tests).
///
/// One instance may serve many sessions; each session opens its own connection and keeps
/// it across handoffs between agents that use the same model (a handoff updates the
/// connection's session instead). A new connection is opened only when the model changes,
/// after the connection drops, and before the provider's session time limit.
pub trait RealtimeModel: Send + Sync + 'static {
    /// A short name for logs and metrics.
    fn name(&self) -> &str;

    /// What the model's protocol supports.
    fn capabilities(&self) -> RealtimeCapabilities;

    /// How its sessions are set up: audio formats, voice, turn detection, transcription,
    /// the connection's lifetime.
    fn settings(&self) -> &RealtimeSettings;

    /// Opens one connection. The engine sends a [`ClientEvent::UpdateSession`] first.
    fn connect(&self) -> BoxFuture<'static, Result<Box<dyn RealtimeConnection>, RealtimeError>>;
}

impl fmt::Debug for dyn RealtimeModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RealtimeModel({})", self.name())
    }
}

/// One open connection to a realtime model. The engine drives it from one task: it queues
/// events with `send`, pushes them out with `poll_flush`, and reads the server's events
/// with `poll_next` until it yields `None` (closed) or an error (the engine reconnects).
pub trait RealtimeConnection: Send + 'static {
    /// Queues one event; a failure to send shows in the next `poll_flush`.
    fn send(&mut self, event: ClientEvent);

    /// Sends what is queued.
    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), RealtimeError>>;

    /// The next event from the server; `None` once the connection is closed.
    fn poll_next(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<ServerEvent, RealtimeError>>>;

    /// Closes the connection (a close frame, then the socket); called once, at the end.
    fn poll_close(&mut self, _cx: &mut Context<'_>) -> Poll<()> {
        Poll::Ready(())
    }
}

/// What a realtime model's protocol supports; the engine does only what it says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RealtimeCapabilities {
    /// The server detects the user's turns from the audio (its VAD) and may start a
    /// response by itself; with it off the host commits the audio (`AudioInput::commit`).
    pub server_turn_detection: bool,
    /// An item of the model's audio can be cut to the audio the user heard
    /// ([`ClientEvent::TruncateItem`]).
    pub truncation: bool,
    /// The voice can change after the model has spoken (a handoff to an agent with
    /// another voice); OpenAI refuses it.
    pub voice_change_after_audio: bool,
    /// A response can carry instructions of its own (the deferred reply's).
    pub response_instructions: bool,
}

impl RealtimeCapabilities {
    /// The OpenAI Realtime API (GA).
    pub const OPENAI: Self = Self {
        server_turn_detection: true,
        truncation: true,
        voice_change_after_audio: false,
        response_instructions: true,
    };
}

/// How a realtime session is set up. Built by a provider's builder; the engine reads it.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct RealtimeSettings {
    /// The format of the host's microphone audio (`AudioInput`). The engine does not
    /// resample: the host sends this format.
    pub input_format: AudioFormat,
    /// The format of the model's audio, as the host's output gets it.
    pub output_format: AudioFormat,
    /// The voice, unless an agent sets its own (`AgentBuilder::voice`).
    pub voice: Option<String>,
    /// How the server finds the end of the user's turn; `None`: the host commits the
    /// audio itself (push to talk).
    pub turn_detection: Option<TurnDetection>,
    /// The model that transcribes the user's audio (the user's words in the chat
    /// context, the history, a replay after a reconnect); `None`: no transcripts.
    pub transcription: Option<String>,
    /// A connection is replaced by a new one (the conversation replayed) once it is this
    /// old, at the next quiet moment, before the provider's own limit.
    pub max_connection_age: Duration,
    /// The host's audio goes to the model in pieces of this length (fewer, larger
    /// messages; the peers send 100 ms).
    pub input_chunk: Duration,
    /// How a dropped connection is opened again.
    pub reconnect: Reconnect,
}

impl RealtimeSettings {
    /// PCM16 at 24 kHz both ways, server VAD that answers and interrupts, input
    /// transcription with `gpt-4o-mini-transcribe`, connections replaced after 55 min,
    /// 100 ms input pieces, three reconnection attempts.
    pub fn new() -> Self {
        Self {
            input_format: AudioFormat::PCM16_24K,
            output_format: AudioFormat::PCM16_24K,
            voice: None,
            turn_detection: Some(TurnDetection::default()),
            transcription: Some("gpt-4o-mini-transcribe".to_owned()),
            max_connection_age: Duration::from_secs(55 * 60),
            input_chunk: Duration::from_millis(100),
            reconnect: Reconnect::default(),
        }
    }

    /// Whether the server answers the user's turns by itself.
    pub(crate) fn server_answers(&self) -> bool {
        self.turn_detection
            .as_ref()
            .is_some_and(|t| t.create_response)
    }

    /// Whether the server cancels its response when the user starts speaking.
    pub(crate) fn server_interrupts(&self) -> bool {
        self.turn_detection
            .as_ref()
            .is_some_and(|t| t.interrupt_response)
    }
}

impl Default for RealtimeSettings {
    fn default() -> Self {
        Self::new()
    }
}

/// How a dropped connection is opened again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reconnect {
    /// Attempts after a drop before the session gives the model up (an error event; the
    /// turn in flight fails).
    pub attempts: u32,
    /// The wait before the first attempt; it doubles with each.
    pub backoff: Duration,
}

impl Default for Reconnect {
    fn default() -> Self {
        Self {
            attempts: 3,
            backoff: Duration::from_millis(100),
        }
    }
}

/// How the server detects the end of the user's turn.
#[derive(Clone, Debug, PartialEq)]
pub struct TurnDetection {
    /// Which detector.
    pub kind: VadKind,
    /// The server answers a turn it detected by itself (the lowest latency; the engine
    /// adopts that response as the user turn's reply).
    pub create_response: bool,
    /// The server cancels its response when the user starts speaking (the engine then
    /// sends no `response.cancel` of its own).
    pub interrupt_response: bool,
    /// Silence that ends a turn (server VAD), if not the provider's default.
    pub silence: Option<Duration>,
    /// Activation threshold, 0 to 1 (server VAD), if not the provider's default.
    pub threshold: Option<f32>,
}

impl Default for TurnDetection {
    fn default() -> Self {
        Self {
            kind: VadKind::Server,
            create_response: true,
            interrupt_response: true,
            silence: None,
            threshold: None,
        }
    }
}

/// A server-side turn detector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum VadKind {
    /// Voice activity: a turn ends after a silence.
    Server,
    /// A model that judges whether the user finished their thought.
    Semantic,
}

/// An audio format on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AudioFormat {
    /// 16-bit little-endian PCM, mono, at `rate` Hz (OpenAI takes 24 000).
    Pcm16 {
        /// Samples per second.
        rate: u32,
    },
    /// G.711 µ-law, 8 kHz mono (telephony).
    G711Ulaw,
    /// G.711 A-law, 8 kHz mono (telephony).
    G711Alaw,
}

impl AudioFormat {
    /// PCM16 at 24 kHz, mono.
    pub const PCM16_24K: Self = Self::Pcm16 { rate: 24_000 };

    /// Bytes of one millisecond of audio.
    pub fn bytes_per_ms(&self) -> u32 {
        match self {
            Self::Pcm16 { rate } => (rate / 1000).max(1) * 2,
            Self::G711Ulaw | Self::G711Alaw => 8,
        }
    }

    /// How long `bytes` of this format play.
    pub fn duration_of(&self, bytes: usize) -> Duration {
        let ms = bytes as u64 / u64::from(self.bytes_per_ms());
        let rest = bytes as u64 % u64::from(self.bytes_per_ms());
        Duration::from_millis(ms)
            + Duration::from_nanos(rest * 1_000_000 / u64::from(self.bytes_per_ms()))
    }
}

/// An event the engine sends to the model.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum ClientEvent {
    /// Sets up or changes the session: the first one of a connection carries the
    /// settings; a handoff's carries the new agent's instructions and tools (and voice,
    /// where the protocol allows it).
    UpdateSession(SessionUpdate),
    /// A piece of the user's audio, in the session's input format.
    AppendAudio(Vec<u8>),
    /// Ends the user's turn (when the server does not detect turns).
    CommitAudio,
    /// Adds an item to the conversation.
    CreateItem {
        /// The item's id, chosen by the engine.
        id: String,
        /// Where it goes.
        previous: Place,
        /// What it is.
        item: RemoteItem,
    },
    /// Removes an item.
    DeleteItem {
        /// The item's id.
        id: String,
    },
    /// Cuts an item of the model's audio to what the user heard.
    TruncateItem {
        /// The item's id.
        id: String,
        /// The audio kept, in milliseconds (more than zero and at most what was received).
        audio_end_ms: u32,
    },
    /// Asks for a response; `tag` comes back in [`ServerEvent::ResponseCreated`] and in
    /// an error about this request.
    CreateResponse {
        /// The engine's number for the request.
        tag: u64,
        /// Instructions for this response only (the session's are replaced by them).
        instructions: Option<String>,
        /// Whether it may call tools.
        tool_choice: ToolChoice,
    },
    /// Cancels the response `response_id`.
    CancelResponse {
        /// The server's id of the response.
        response_id: String,
    },
}

/// What a [`ClientEvent::UpdateSession`] sets; `None` fields are left as they are.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionUpdate {
    /// The agent's instructions.
    pub instructions: Option<Arc<str>>,
    /// The tools the agent sees.
    pub tools: Option<Arc<[ToolSchema]>>,
    /// The voice.
    pub voice: Option<String>,
    /// The connection's settings (formats, turn detection, transcription): sent in the
    /// first update of each connection.
    pub settings: Option<RealtimeSettings>,
}

/// Where a created item goes in the conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Place {
    /// First.
    Start,
    /// Right after this item.
    After(String),
    /// Last.
    End,
}

/// An item the engine adds to the model's conversation.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum RemoteItem {
    /// A text message: the user's typed words, what the agent said (replayed or said with
    /// `say`), or system text.
    Message {
        /// Who said it.
        role: ChatRole,
        /// The text.
        text: String,
    },
    /// A tool call (a replayed one, or the call half of a later tool item).
    FunctionCall {
        /// The call id on the wire.
        call_id: String,
        /// The tool.
        name: String,
        /// The arguments (JSON text).
        arguments: String,
    },
    /// The output of a call already in the conversation.
    FunctionCallOutput {
        /// The call id on the wire.
        call_id: String,
        /// The output text.
        output: String,
    },
}

/// An event from the model.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum ServerEvent {
    /// The connection's session is ready (the first event).
    SessionCreated,
    /// A session update was applied.
    SessionUpdated,
    /// The server's VAD heard the user start speaking; with `interrupt_response` on, it
    /// has cancelled its active response.
    SpeechStarted {
        /// The item the user's speech will become.
        item_id: String,
    },
    /// The server's VAD heard the user stop.
    SpeechStopped {
        /// The item the user's speech becomes.
        item_id: String,
    },
    /// The user's audio became an item of the conversation (a user turn).
    AudioCommitted {
        /// The user's item.
        item_id: String,
    },
    /// The transcript of a user item, complete.
    InputTranscript {
        /// The user's item.
        item_id: String,
        /// What the user said.
        transcript: String,
    },
    /// An item was added to the conversation (the server's, or one the engine created).
    ItemAdded {
        /// The item.
        item_id: String,
    },
    /// An item was removed.
    ItemDeleted {
        /// The item.
        item_id: String,
    },
    /// An item of the model's audio was cut.
    ItemTruncated {
        /// The item.
        item_id: String,
        /// The audio kept, in milliseconds.
        audio_end_ms: u32,
    },
    /// A response started: one the engine asked for (`tag`), or one the server started by
    /// itself after the user's turn (`tag: None`).
    ResponseCreated {
        /// The server's id of the response.
        response_id: String,
        /// The engine's tag, for a response it asked for.
        tag: Option<u64>,
    },
    /// A response added an output item.
    OutputItemAdded {
        /// The response.
        response_id: String,
        /// The item.
        item_id: String,
        /// A message, or a call with its id and tool.
        kind: OutputKind,
    },
    /// A piece of the model's audio (of the active response), decoded, in the session's
    /// output format.
    AudioDelta {
        /// The message item the audio belongs to.
        item_id: String,
        /// The audio.
        audio: Vec<u8>,
    },
    /// A piece of the text of what the model says (the transcript of its audio, or its
    /// text in a text-only session), in the active response.
    TextDelta {
        /// The message item.
        item_id: String,
        /// The text.
        delta: String,
    },
    /// A tool call's arguments are complete: the call can run.
    FunctionCall {
        /// The response.
        response_id: String,
        /// The call's item.
        item_id: String,
        /// The call id (the model's).
        call_id: String,
        /// The tool.
        name: String,
        /// The arguments (JSON text).
        arguments: String,
    },
    /// A response ended.
    ResponseDone {
        /// The response.
        response_id: String,
        /// How it ended.
        status: ResponseStatus,
        /// Its token usage, when reported.
        usage: Option<LlmUsage>,
    },
    /// The server refused a client event or failed.
    Error {
        /// The error's code, when it has one.
        code: Option<String>,
        /// The server's message.
        message: String,
        /// The id of the client event it refers to, when it says; the engine's events
        /// carry their tag there (`CreateResponse`: `sb_response_<tag>`).
        event_id: Option<String>,
    },
    /// Anything the engine does not act on.
    Other,
}

/// What a response added.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum OutputKind {
    /// A message (audio and its transcript, or text).
    Message,
    /// A tool call.
    FunctionCall {
        /// The call id.
        call_id: String,
        /// The tool.
        name: String,
    },
    /// Another kind of item.
    Other,
}

/// How a response ended.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResponseStatus {
    /// In full.
    Completed,
    /// Cancelled: by the server when the user spoke (`turn_detected`), or at the client's
    /// request.
    Cancelled {
        /// The server's reason.
        reason: String,
    },
    /// Cut short (a token limit, a content filter).
    Incomplete {
        /// The server's reason.
        reason: String,
    },
    /// The response failed.
    Failed {
        /// The server's message.
        message: String,
    },
}

/// The id the engine gives its `CreateResponse` event `tag` on the wire, so an error
/// about it can be tied back.
pub fn response_event_id(tag: u64) -> String {
    format!("sb_response_{tag}")
}

/// The tag of an event id made by [`response_event_id`].
pub fn response_tag(event_id: &str) -> Option<u64> {
    event_id.strip_prefix("sb_response_")?.parse().ok()
}

/// A failure of a realtime model or its connection.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RealtimeError {
    /// The provider refused the credentials: check the API key.
    #[error("the realtime model refused the credentials: {message}")]
    Auth {
        /// The provider's message.
        message: String,
    },
    /// The connection could not be opened.
    #[error("cannot connect to the realtime model: {message}")]
    Connect {
        /// What the attempt reported.
        message: String,
    },
    /// The connection broke or was closed by the server.
    #[error("the realtime connection dropped: {message}")]
    Dropped {
        /// What was seen.
        message: String,
    },
    /// The server sent something the provider cannot read.
    #[error("the realtime model sent a malformed event: {message}")]
    Malformed {
        /// What was wrong, with a short prefix of the event.
        message: String,
    },
    /// The model could not be reached again after a drop.
    #[error("the realtime model is gone: {message}")]
    Gone {
        /// The last failure.
        message: String,
    },
}

/// The model an activity asks: a text LLM, or a realtime model.
#[derive(Clone)]
pub(crate) enum Model {
    Text(Arc<dyn Llm>),
    Realtime(Arc<dyn RealtimeModel>),
}

impl Model {
    /// Its name, for spans and metrics.
    pub(crate) fn name(&self) -> &str {
        match self {
            Self::Text(llm) => llm.name(),
            Self::Realtime(model) => model.name(),
        }
    }

    /// Whether two agents' models are the same instance (a handoff between them keeps
    /// the realtime connection).
    pub(crate) fn same(&self, other: &Model) -> bool {
        match (self, other) {
            (Self::Text(a), Self::Text(b)) => Arc::ptr_eq(a, b),
            (Self::Realtime(a), Self::Realtime(b)) => {
                std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
            }
            _ => false,
        }
    }
}

impl From<Arc<dyn Llm>> for Model {
    fn from(llm: Arc<dyn Llm>) -> Self {
        Self::Text(llm)
    }
}

impl fmt::Debug for Model {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Text(llm) => write!(f, "Text({})", llm.name()),
            Self::Realtime(model) => write!(f, "Realtime({})", model.name()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_know_their_byte_rate() {
        assert_eq!(AudioFormat::PCM16_24K.bytes_per_ms(), 48);
        assert_eq!(AudioFormat::G711Ulaw.bytes_per_ms(), 8);
        assert_eq!(
            AudioFormat::PCM16_24K.duration_of(960),
            Duration::from_millis(20)
        );
        assert_eq!(
            AudioFormat::G711Alaw.duration_of(12),
            Duration::from_micros(1500)
        );
    }

    #[test]
    fn response_tags_survive_the_wire() {
        assert_eq!(response_tag(&response_event_id(42)), Some(42));
        assert_eq!(response_tag("event_abc"), None);
    }
}
