//! The model: a streaming trait the activity calls once per LLM step.

use std::fmt;
use std::sync::Arc;

use futures_util::stream::BoxStream;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::chat::ChatContext;

/// What the model may do with tools on this request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    /// The model decides.
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
pub enum LlmChunk {
    /// Text for the user, streamed to I/O as it comes.
    Text(String),
    /// A tool call.
    ToolCall(ToolCallChunk),
}

/// A failure of the model provider.
#[derive(Debug, Clone, thiserror::Error)]
#[error("LLM request failed: {message}")]
pub struct LlmError {
    /// What went wrong.
    pub message: String,
}

impl LlmError {
    /// An error with this message.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
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
