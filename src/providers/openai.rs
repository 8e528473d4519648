//! OpenAI-compatible chat completions, streamed.
//!
//! [`OpenAiLlm`] is an [`Llm`] for OpenAI's API and every server that speaks its
//! streaming chat-completions format: vLLM, Ollama, Groq, LiteLLM, …. It assumes nothing
//! beyond that format.
//!
//! ```no_run
//! use std::sync::Arc;
//! use switchboard::prelude::*;
//! use switchboard::providers::openai::OpenAiLlm;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! // OPENAI_API_KEY (and optionally OPENAI_BASE_URL, OPENAI_MODEL) from the environment:
//! let llm = OpenAiLlm::from_env()?;
//! // or explicitly, e.g. a local Ollama:
//! let local = OpenAiLlm::builder()
//!     .base_url("http://localhost:11434/v1")
//!     .model("llama3.2")
//!     .temperature(0.3)
//!     .build()?;
//! let agent = Agent::builder("assistant").instructions("Be brief.").build()?;
//! let session = Session::builder().llm(Arc::new(llm)).agent(agent).start(&Engine::start()?).await?;
//! # let _ = local; Ok(()) }
//! ```
//!
//! What a request carries and how the answer is read:
//!
//! - `request` — the chat context as messages: instructions as the system message, each
//!   step's text and calls as one assistant message, each `/update_n` and `/finished`
//!   pair as its own assistant message and tool message; call ids mapped by
//!   [`CallIdMap`](crate::providers::CallIdMap); tools and `tool_choice` as given.
//! - `stream` — text forwarded event by event, tool-call fragments joined by index,
//!   usage as [`LlmChunk::Usage`](crate::LlmChunk::Usage).
//! - `exchange` — timeouts (connect, first chunk, between chunks), retries before the
//!   first forwarded chunk ([`RetryPolicy`]), typed errors, and the HTTP connection closed
//!   when the stream is dropped.
//!
//! # Timeouts in layers
//!
//! Two layers bound the wait for a model, and with the defaults they nest:
//!
//! | layer | first chunk | between chunks | set with |
//! |---|---|---|---|
//! | the session (outer): the whole request, every attempt | 10 s | 10 s | `SessionBuilder::llm_timeouts`, `AgentBuilder::llm_timeouts` |
//! | this provider: one attempt | 4 s ([`DEFAULT_ATTEMPT_TIMEOUTS`]) | 10 s | [`OpenAiBuilder::timeouts`], [`OpenAiBuilder::connect_timeout`] |
//!
//! - The session's bound is the outer one. Its first-chunk wait starts when the engine
//!   asks and runs over every attempt and backoff; when it ends, the turn fails with
//!   [`LlmError::Timeout`] and the request is dropped, whatever the provider was doing.
//! - An attempt that hears nothing within its own bound (the headers included) is dropped
//!   and retried after a backoff ([`RetryPolicy`]: 0.5 s, then 1 s). With the defaults a
//!   stalled attempt and its retry take at most 4 + 0.5 + 4 = 8.5 s, inside the session's
//!   10 s; a third attempt would start at 9.5 s and is cut by the session. A request that
//!   fails fast (a 5xx, a refused connection) gets all three attempts.
//! - Retries happen only before anything was forwarded to the engine. After the first
//!   chunk a stall or a cut fails the turn: a retry would make the agent say its words
//!   twice. So between chunks there is nothing to leave room for, and both layers wait
//!   10 s.
//! - To change one layer, keep the sum in mind: the session's first-chunk bound should
//!   exceed the attempts you want to fit times the attempt's bound, plus the backoffs.
//!   For a model that thinks before it speaks, raise both (e.g. attempt 20 s, one retry,
//!   session 45 s); to fail fast instead, lower the session's and set
//!   [`RetryPolicy::none`].
//!
//! Each request runs in a `tracing` span `llm_request` (provider, model, host, and once
//! known the attempt, HTTP status, time to first token and token usage); events are logged
//! at debug and trace level only, except a warning per retry.

mod builder;
mod error;
mod exchange;
mod request;
mod retry;
mod stream;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream as futures_stream;
use serde_json::{Map, Value};

pub use builder::{
    OpenAiBuilder, OpenAiConfigError, DEFAULT_ATTEMPT_TIMEOUTS, DEFAULT_BASE_URL, DEFAULT_MODEL,
};
pub use retry::RetryPolicy;

use crate::{Llm, LlmError, LlmRequest, LlmStream, LlmTimeouts};

/// A streaming chat-completions model. Cheap to clone; clones share one connection pool,
/// and one instance may serve many sessions at once.
///
/// Keep one per [`Engine`](crate::Engine): a pooled connection is driven by the runtime
/// that opened it (an engine's arbiters live as long as the engine). A connection left
/// dead by a runtime that stopped fails its next request before anything is forwarded, so
/// that request is retried on a new connection.
#[derive(Clone)]
pub struct OpenAiLlm {
    config: Arc<Config>,
    client: reqwest::Client,
}

/// The settings of an [`OpenAiLlm`], fixed when it is built.
struct Config {
    endpoint: reqwest::Url,
    /// The endpoint as logs and errors show it: without a user or password, query values
    /// elided (some servers take a key in the query).
    shown: String,
    /// The base URL's host, for the request span.
    host: String,
    api_key: Option<String>,
    model: String,
    /// `openai/{model}`: what [`Llm::name`] says, so metrics and a fallback over two
    /// models tell them apart.
    name: String,
    temperature: Option<f64>,
    parallel_tool_calls: Option<bool>,
    extra: Map<String, Value>,
    connect_timeout: Duration,
    timeouts: LlmTimeouts,
    retry: RetryPolicy,
}

impl OpenAiLlm {
    /// A builder; only the model is required (the base URL defaults to OpenAI's API).
    pub fn builder() -> OpenAiBuilder {
        OpenAiBuilder::default()
    }

    /// A model configured from the environment (`OPENAI_BASE_URL`, `OPENAI_API_KEY`,
    /// `OPENAI_MODEL`; see [`OpenAiBuilder::from_env`]). The error names the missing
    /// variable.
    pub fn from_env() -> Result<Self, OpenAiConfigError> {
        OpenAiBuilder::from_env()?.build()
    }

    /// The model name sent with each request.
    pub fn model(&self) -> &str {
        &self.config.model
    }

    /// Where requests go: `{base_url}/chat/completions` (a base URL that already ends in
    /// `/chat/completions` is this endpoint itself).
    pub fn endpoint(&self) -> &str {
        self.config.endpoint.as_str()
    }
}

impl fmt::Debug for OpenAiLlm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The key stays out of logs.
        f.debug_struct("OpenAiLlm")
            .field("endpoint", &self.config.shown)
            .field("model", &self.config.model)
            .field("api_key", &self.config.api_key.as_ref().map(|_| "…"))
            .finish_non_exhaustive()
    }
}

/// `url` as a log line or an error may show it: a user and password (`https://u:p@host`)
/// become `…@`, and each query value (`?key=…`, which some servers take a key in) `…`.
pub(crate) fn shown_url(url: &str) -> String {
    let (before_query, query) = match url.split_once('?') {
        Some((before, query)) => (before, Some(query)),
        None => (url, None),
    };
    let mut shown = match before_query.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = match rest.find('/') {
                Some(at) => rest.split_at(at),
                None => (rest, ""),
            };
            match authority.rsplit_once('@') {
                Some((_, host)) => format!("{scheme}://…@{host}{path}"),
                None => before_query.to_owned(),
            }
        }
        None => before_query.to_owned(),
    };
    if let Some(query) = query {
        let names: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((name, _)) => format!("{name}=…"),
                None => pair.to_owned(),
            })
            .collect();
        shown.push('?');
        shown.push_str(&names.join("&"));
    }
    shown
}

impl Llm for OpenAiLlm {
    fn chat(&self, request: LlmRequest) -> LlmStream {
        let span = tracing::info_span!(
            "llm_request",
            provider = "openai",
            agent = %request.agent,
            model = %self.config.model,
            host = %self.config.host,
            attempt = tracing::field::Empty,
            status = tracing::field::Empty,
            ttft_ms = tracing::field::Empty,
            prompt_tokens = tracing::field::Empty,
            completion_tokens = tracing::field::Empty,
        );
        let body = match request::body(&self.config, &request) {
            Ok((body, _ids)) => body,
            Err(e) => {
                let error = LlmError::new(format!("cannot write the request body: {e}"));
                return Box::pin(futures_stream::iter([Err(error)]));
            }
        };
        exchange::start(self.config.clone(), self.client.clone(), body, span)
    }

    /// `openai/{model}`, e.g. `openai/gpt-4.1-mini` (the provider is the wire format; the
    /// model tells two instances apart in [`LlmMetrics`](crate::LlmMetrics) and in a
    /// fallback over several models).
    fn name(&self) -> &str {
        &self.config.name
    }
}
