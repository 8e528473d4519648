//! One request and its answer, as the [`LlmStream`] the engine reads: send, retry while
//! nothing was forwarded, read events under the timeouts, forward chunks as they come.
//!
//! The stream owns the HTTP response. Dropping it (a barge-in cancels the LLM step, a
//! session closes) drops the response body mid-way, and an HTTP/1.1 connection with an
//! unread body cannot go back to the pool: it is closed at once, so the server stops
//! generating. Nothing is spawned, so nothing outlives the stream.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use eventsource_stream::{Event, EventStreamError, Eventsource};
use futures_util::stream::{self, Stream, StreamExt};
use reqwest::header::{ACCEPT, CONTENT_TYPE};
use tokio::time::{timeout, Instant};
use tracing::Instrument;

use super::error::{chain, from_status, Failure};
use super::stream::StreamDecoder;
use super::Config;
use crate::{LlmChunk, LlmError, LlmStream, TimeoutStage};

type Events = Pin<Box<dyn Stream<Item = Result<Event, EventStreamError<reqwest::Error>>> + Send>>;

/// The state of one request, advanced by each poll of its stream.
struct Exchange {
    config: Arc<Config>,
    client: reqwest::Client,
    body: bytes::Bytes,
    span: tracing::Span,
    /// Attempts made so far (1 after the first send).
    attempt: u32,
    /// When the current attempt was sent: the first-chunk wait runs from here.
    sent_at: Instant,
    /// When the request started, for time to first token.
    started: Instant,
    events: Option<Events>,
    decoder: StreamDecoder,
    /// Whether any event of the current attempt came (the next wait is between chunks).
    got_event: bool,
    /// Whether a chunk went to the engine: from then on, no retry.
    forwarded: bool,
    ready: VecDeque<LlmChunk>,
    done: bool,
}

/// Starts nothing yet: the request is sent when the engine first polls the stream.
pub(super) fn start(
    config: Arc<Config>,
    client: reqwest::Client,
    body: Vec<u8>,
    span: tracing::Span,
) -> LlmStream {
    let now = Instant::now();
    let exchange = Exchange {
        config,
        client,
        body: bytes::Bytes::from(body),
        span,
        attempt: 0,
        sent_at: now,
        started: now,
        events: None,
        decoder: StreamDecoder::default(),
        got_event: false,
        forwarded: false,
        ready: VecDeque::new(),
        done: false,
    };
    Box::pin(stream::unfold(exchange, |mut exchange| async move {
        let span = exchange.span.clone();
        let item = exchange.next().instrument(span).await?;
        Some((item, exchange))
    }))
}

impl Exchange {
    async fn next(&mut self) -> Option<Result<LlmChunk, LlmError>> {
        loop {
            if let Some(chunk) = self.ready.pop_front() {
                self.on_forward(&chunk);
                return Some(Ok(chunk));
            }
            if self.done {
                return None;
            }
            let step = match self.events.take() {
                None => self.send().await.map(|events| {
                    self.events = Some(events);
                }),
                Some(events) => self.read(events).await,
            };
            if let Err(failure) = step {
                self.events = None;
                if let Some(delay) = self.retry_delay(&failure) {
                    tracing::warn!(
                        attempt = self.attempt,
                        error = %failure.error,
                        ?delay,
                        "LLM request failed before its first chunk; retrying"
                    );
                    tokio::time::sleep(delay).await;
                    continue;
                }
                self.done = true;
                tracing::debug!(error = %failure.error, "LLM request failed");
                return Some(Err(failure.error));
            }
        }
    }

    fn on_forward(&mut self, chunk: &LlmChunk) {
        if !self.forwarded && !matches!(chunk, LlmChunk::Usage(_)) {
            let ttft = self.started.elapsed();
            self.span.record("ttft_ms", ttft.as_millis() as u64);
        }
        if let LlmChunk::Usage(usage) = chunk {
            self.span.record("prompt_tokens", usage.prompt_tokens);
            self.span
                .record("completion_tokens", usage.completion_tokens);
        }
        self.forwarded = true;
    }

    fn retry_delay(&self, failure: &Failure) -> Option<Duration> {
        if self.forwarded || !failure.retryable {
            return None;
        }
        self.config.retry.delay(self.attempt, failure.retry_after)
    }

    /// Sends the request; the events of a successful answer. Waits for the headers at most
    /// the connect timeout or the first-chunk bound, whichever is shorter.
    async fn send(&mut self) -> Result<Events, Failure> {
        self.attempt += 1;
        self.span.record("attempt", self.attempt);
        self.decoder = StreamDecoder::default();
        self.got_event = false;
        self.sent_at = Instant::now();
        // A reference count: every attempt sends the same bytes.
        let body = self.body.clone();
        let mut request = self
            .client
            .post(self.config.endpoint.clone())
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "text/event-stream")
            .body(body);
        if let Some(key) = &self.config.api_key {
            request = request.bearer_auth(key);
        }
        // The headers come before the first chunk, so the attempt's first-chunk bound
        // covers them too: a server (or proxy) that holds them back until the model
        // answers is given up on, and retried, as soon as one that sends them at once.
        let connect = self.config.connect_timeout;
        let first_chunk = self.config.timeouts.first_chunk;
        let (stage, wait) = if first_chunk < connect {
            (TimeoutStage::FirstChunk, first_chunk)
        } else {
            (TimeoutStage::Connect, connect)
        };
        let response = match timeout(wait, request.send()).await {
            Err(_) => return Err(Failure::retryable(LlmError::Timeout { stage, after: wait })),
            Ok(Err(error)) => {
                return Err(Failure::retryable(LlmError::Connect {
                    message: chain(&error),
                }))
            }
            Ok(Ok(response)) => response,
        };
        let status = response.status();
        self.span.record("status", status.as_u16());
        if !status.is_success() {
            let headers = response.headers().clone();
            // The error body is short; bound its read like the headers'.
            let text = match timeout(connect, response.text()).await {
                Ok(Ok(text)) => text,
                _ => String::new(),
            };
            return Err(from_status(
                status.as_u16(),
                &headers,
                &text,
                &self.config.shown,
            ));
        }
        tracing::debug!(status = status.as_u16(), "LLM answer streaming");
        Ok(Box::pin(response.bytes_stream().eventsource()))
    }

    /// Reads the next event into `ready`; puts `events` back unless the answer ended.
    async fn read(&mut self, mut events: Events) -> Result<(), Failure> {
        let (stage, wait) = if self.got_event {
            (
                TimeoutStage::BetweenChunks,
                self.config.timeouts.between_chunks,
            )
        } else {
            let deadline = self.sent_at + self.config.timeouts.first_chunk;
            (
                TimeoutStage::FirstChunk,
                deadline.saturating_duration_since(Instant::now()),
            )
        };
        let after = match stage {
            TimeoutStage::FirstChunk => self.config.timeouts.first_chunk,
            _ => wait,
        };
        let event = match timeout(wait, events.next()).await {
            Err(_) => return Err(Failure::retryable(LlmError::Timeout { stage, after })),
            Ok(None) if self.decoder.finished() => {
                // Some servers end after `finish_reason` without `[DONE]`: complete.
                self.ready
                    .extend(self.decoder.finish().map_err(Failure::fatal)?);
                self.done = true;
                return Ok(());
            }
            Ok(None) => {
                return Err(Failure::retryable(LlmError::MalformedStream {
                    message: "the stream ended before [DONE] or a finish reason".into(),
                }))
            }
            Ok(Some(Err(EventStreamError::Transport(error)))) => {
                return Err(Failure::retryable(LlmError::MalformedStream {
                    message: format!("the stream broke off: {}", chain(&error)),
                }))
            }
            Ok(Some(Err(error))) => {
                return Err(Failure::fatal(LlmError::MalformedStream {
                    message: format!("unreadable server-sent event: {error}"),
                }))
            }
            Ok(Some(Ok(event))) => event,
        };
        self.got_event = true;
        tracing::trace!(data = %event.data, "LLM event");
        let decoded = self.decoder.decode(&event.data).map_err(Failure::fatal)?;
        self.ready.extend(decoded.chunks);
        if decoded.done {
            self.done = true;
            tracing::debug!(elapsed = ?self.started.elapsed(), "LLM answer complete");
        } else {
            self.events = Some(events);
        }
        Ok(())
    }
}
