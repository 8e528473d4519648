//! The model: a streaming trait the activity calls once per LLM step.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::BoxStream;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::chat::ChatContext;

/// What the model may do with tools on this request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    /// The model decides.
    #[default]
    Auto,
    /// The model must answer in text (used for the deferred reply to tool updates).
    None,
}

/// A tool as the model sees it: name, description and JSON schema of its parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolSchema {
    /// The tool's name, unique among the tools an activity sees.
    pub name: String,
    /// What the tool does, for the model.
    pub description: String,
    /// JSON schema of the arguments object.
    pub parameters: Value,
}

/// One request to the model.
#[derive(Clone, Debug)]
pub struct LlmRequest {
    /// The agent that asks (its name).
    pub agent: Arc<str>,
    /// The agent's instructions (the system prompt).
    pub instructions: Arc<str>,
    /// Extra instructions for this request only (e.g. the deferred reply's `reply` text).
    pub extra_instructions: Option<String>,
    /// The chat context the model answers (a snapshot: see [`ChatContext`]).
    pub chat: ChatContext,
    /// Every tool the activity sees, in a stable order (shared, byte-identical across
    /// requests so a provider's prompt cache stays warm).
    pub tools: Arc<[ToolSchema]>,
    /// Whether tools may be called on this request.
    pub tool_choice: ToolChoice,
    /// For a deferred reply, the call ids of the later tool items it answers
    /// (`call_1/update_1`, `call_1/finished`, …), oldest first; empty for any other request.
    pub deferred_call_ids: Vec<String>,
}

/// A tool call as the model streams it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCallChunk {
    /// The provider's call id (the engine makes it unique in the session).
    pub call_id: String,
    /// The tool's name.
    pub name: String,
    /// The arguments, JSON text.
    pub arguments: String,
}

/// One piece of the model's streamed answer.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum LlmChunk {
    /// Text for the user, streamed to the output as it comes.
    Text(String),
    /// A complete tool call (a provider that streams calls in fragments joins them first).
    ToolCall(ToolCallChunk),
    /// Token usage of the request, when the provider reports it (usually last). The
    /// engine puts it in the request's [`SessionEvent::LlmMetrics`](crate::SessionEvent)
    /// event.
    Usage(LlmUsage),
    /// Which model serves this request, when the [`Llm`] is a wrapper over several (a
    /// fallback chain says which of its models answered). The engine puts the name in the
    /// request's [`LlmMetrics::llm`](crate::LlmMetrics); without it, the name is the
    /// [`Llm::name`] the agent uses. Not text: nothing of it reaches the user.
    ServedBy(String),
}

/// Token usage of one LLM request, as the provider reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LlmUsage {
    /// Tokens of the request (instructions, chat context, tool schemas).
    pub prompt_tokens: u32,
    /// Tokens the model generated.
    pub completion_tokens: u32,
    /// Prompt tokens served from the provider's prompt cache, when it says (counted in
    /// `prompt_tokens` too, as providers report them).
    pub cached_prompt_tokens: Option<u32>,
    /// Prompt tokens that were audio, when the provider says (counted in `prompt_tokens`
    /// too): a speech-to-speech or audio-input model bills them apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audio_prompt_tokens: Option<u32>,
    /// Completion tokens that were audio, when the provider says (counted in
    /// `completion_tokens` too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audio_completion_tokens: Option<u32>,
}

/// Which wait of an LLM request ran out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum TimeoutStage {
    /// Opening the connection and getting the response headers.
    Connect,
    /// From sending the request to the first chunk of the answer.
    FirstChunk,
    /// Between two chunks of the answer.
    BetweenChunks,
}

impl fmt::Display for TimeoutStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Connect => "connecting",
            Self::FirstChunk => "waiting for the first chunk",
            Self::BetweenChunks => "waiting for the next chunk",
        })
    }
}

/// How long the engine waits on a model: a request whose first chunk does not
/// come within `first_chunk`, or whose next chunk does not come within `between_chunks`,
/// fails the turn with [`LlmError::Timeout`] and an error event. Set on the session
/// (`SessionBuilder::llm_timeouts`) or an agent (`AgentBuilder::llm_timeouts`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LlmTimeouts {
    /// From the request to its first chunk (default 10 s, as LiveKit's request timeout).
    pub first_chunk: Duration,
    /// Between two chunks (default 10 s).
    pub between_chunks: Duration,
}

impl Default for LlmTimeouts {
    fn default() -> Self {
        Self {
            first_chunk: Duration::from_secs(10),
            between_chunks: Duration::from_secs(10),
        }
    }
}

/// A failure of the model provider, by what a caller can do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum LlmError {
    /// The provider refused the credentials (HTTP 401/403): check the API key.
    #[error("the LLM provider refused the credentials: {message}")]
    Auth {
        /// The provider's message.
        message: String,
    },
    /// Too many requests (HTTP 429), after the adapter's retries.
    #[error("the LLM provider is rate limiting: {message}")]
    RateLimited {
        /// The provider's message.
        message: String,
        /// How long the provider asked to wait, if it said.
        retry_after: Option<Duration>,
    },
    /// The request does not fit the model's context window: shorten the chat context.
    #[error("the request is longer than the model's context: {message}")]
    ContextTooLong {
        /// The provider's message.
        message: String,
    },
    /// The provider rejected the request as malformed (HTTP 4xx).
    #[error("the LLM provider rejected the request (HTTP {status}): {message}")]
    BadRequest {
        /// The HTTP status.
        status: u16,
        /// The provider's message.
        message: String,
    },
    /// The provider failed (HTTP 5xx), after the adapter's retries.
    #[error("the LLM provider failed (HTTP {status}): {message}")]
    Server {
        /// The HTTP status.
        status: u16,
        /// The provider's message.
        message: String,
    },
    /// The provider could not be reached.
    #[error("cannot reach the LLM provider: {message}")]
    Connect {
        /// What the connection attempt reported.
        message: String,
    },
    /// A wait ran out (see [`LlmTimeouts`]).
    #[error("the LLM request timed out {stage} (after {after:?})")]
    Timeout {
        /// Which wait ran out.
        stage: TimeoutStage,
        /// How long it waited.
        after: Duration,
    },
    /// The answer's stream broke off or could not be read.
    #[error("the LLM stream is malformed: {message}")]
    MalformedStream {
        /// What was wrong with it.
        message: String,
    },
    /// The model adapter panicked; the engine caught it and failed the turn.
    #[error("the LLM adapter panicked: {message}")]
    Panicked {
        /// The panic's message.
        message: String,
    },
    /// Any other failure.
    #[error("LLM request failed: {message}")]
    Other {
        /// What went wrong.
        message: String,
    },
}

impl LlmError {
    /// A failure with this message ([`LlmError::Other`]).
    pub fn new(message: impl Into<String>) -> Self {
        Self::Other {
            message: message.into(),
        }
    }
}

/// The stream of one answer.
pub type LlmStream = BoxStream<'static, Result<LlmChunk, LlmError>>;

/// A language model the activity asks for replies.
///
/// Implementations are providers (an HTTP client) or a scripted model for tests
/// (`switchboard::testing::ScriptedLlm`). One instance may serve many sessions at once.
pub trait Llm: Send + Sync + 'static {
    /// Starts one request; the stream yields text and tool calls.
    fn chat(&self, request: LlmRequest) -> LlmStream;

    /// A short name for logs.
    fn name(&self) -> &str {
        "llm"
    }
}

impl fmt::Debug for dyn Llm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Llm({})", self.name())
    }
}
