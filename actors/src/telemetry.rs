//! Telemetry: what a piece of work was caused by, and the session's metrics.
//!
//! Two things, both built only with the `telemetry` feature; without it every type here
//! is empty and every method does nothing, so the engine compiles to what it was before
//! (the fields are zero-sized, the calls inline to nothing: measured in BENCHMARKS.md,
//! "Telemetry").
//!
//! - [`Cause`]: the span current where a piece of work was asked for (the host's, at
//!   `run`, `transcript`, `say` or `update_agent`; a tool's, when its body hands off) and
//!   when. It rides in the message that asks for the work, so the work's span — a turn, a
//!   handoff, a tool run — is a child of the asker's span although it runs later, on the
//!   session's arbiter, where the asker's span is not current. A span is the only way to
//!   carry that: actix runs the handler in the actor's own task.
//! - [`SessionTelemetry`]: the engine's [`Telemetry`] instruments as one session records
//!   on them, and the span the session was started under (see [`Cause::parent`]).
//!
//! The spans themselves are `tracing` spans (`session`, `turn`, `llm_request`, `tool_run`,
//! `handoff`), there with or without the feature; a host turns them into OpenTelemetry
//! spans with `tracing-opentelemetry`. The metrics are OpenTelemetry instruments
//! (`telemetry/instruments.rs`).

#[cfg(feature = "telemetry")]
mod instruments;

#[cfg(feature = "telemetry")]
pub use instruments::Telemetry;

use std::sync::Arc;
use std::time::Duration;

use crate::events::DeferredReplyDecision;
use crate::llm::LlmUsage;

/// What caused a piece of work: the span current where it was asked for (with the
/// feature; empty without) and when (tokio's clock, so paused test time moves it). The
/// time is kept with or without the feature: a turn's latency counts from it.
#[derive(Clone, Debug)]
pub(crate) struct Cause {
    #[cfg(feature = "telemetry")]
    span: tracing::Span,
    at: Option<tokio::time::Instant>,
}

/// No cause: work the engine began itself (a deferred reply, a restored job).
impl Default for Cause {
    #[inline]
    fn default() -> Self {
        Self {
            #[cfg(feature = "telemetry")]
            span: tracing::Span::none(),
            at: None,
        }
    }
}

impl Cause {
    /// The span current here and now: called in the public API, on the asker's task,
    /// before the message leaves it.
    #[inline]
    pub(crate) fn here() -> Self {
        Self {
            #[cfg(feature = "telemetry")]
            span: tracing::Span::current(),
            at: Some(tokio::time::Instant::now()),
        }
    }

    /// Work caused by the engine's own `span` (a turn's tool runs, a turn's handoff).
    #[inline]
    pub(crate) fn of(_span: &tracing::Span) -> Self {
        Self {
            #[cfg(feature = "telemetry")]
            span: _span.clone(),
            at: None,
        }
    }

    /// When the work was asked for, if someone asked (none: the engine began it).
    #[inline]
    pub(crate) fn at(&self) -> Option<tokio::time::Instant> {
        self.at
    }

    /// The same cause, asked for at `at` instead (a user turn counts from the end of the
    /// user's speech, not from the transcript that came after it).
    #[inline]
    pub(crate) fn asked_at(mut self, at: tokio::time::Instant) -> Self {
        self.at = Some(at);
        self
    }

    /// The parent of the work's span: the cause's span, or `session` (the session's span)
    /// when there is none, or when the cause's span is the very one the session was
    /// started under — the usual host with one span per call — so the tree reads
    /// `call > session > turn` rather than putting turns beside their session. Either way
    /// the work's span is under the asker's. Without the feature: always `session`.
    #[inline]
    pub(crate) fn parent<'a>(
        &'a self,
        session: &'a tracing::Span,
        telemetry: &SessionTelemetry,
    ) -> &'a tracing::Span {
        if self.is_elsewhere(telemetry) {
            #[cfg(feature = "telemetry")]
            return &self.span;
        }
        session
    }

    /// Makes `span`, made under [`Cause::parent`], follow from the session's span when it
    /// is not under it, so a trace viewer links the two (an OpenTelemetry span link).
    #[inline]
    pub(crate) fn link(
        &self,
        _span: &tracing::Span,
        _session: &tracing::Span,
        _telemetry: &SessionTelemetry,
    ) {
        #[cfg(feature = "telemetry")]
        if self.is_elsewhere(_telemetry) {
            _span.follows_from(_session);
        }
    }

    /// Whether the work's span goes under the cause's span rather than the session's.
    #[inline]
    fn is_elsewhere(&self, _telemetry: &SessionTelemetry) -> bool {
        #[cfg(feature = "telemetry")]
        if let Some(id) = self.span.id() {
            return _telemetry.host_parent.as_ref() != Some(&id);
        }
        false
    }
}

/// When a tool run started, for its duration. Empty without the feature.
#[derive(Debug)]
pub(crate) struct Stopwatch {
    #[cfg(feature = "telemetry")]
    since: tokio::time::Instant,
}

impl Stopwatch {
    /// Starts now.
    #[inline]
    pub(crate) fn start() -> Self {
        Self {
            #[cfg(feature = "telemetry")]
            since: tokio::time::Instant::now(),
        }
    }
}

/// A session's view of the engine's instruments, and the span it was started under.
/// Empty without the feature.
#[derive(Debug, Default)]
pub(crate) struct SessionTelemetry {
    #[cfg(feature = "telemetry")]
    telemetry: Option<Telemetry>,
    /// The id of the span current when the session started (its span's parent): a host
    /// call made under the same span puts its work under the session's span.
    #[cfg(feature = "telemetry")]
    host_parent: Option<tracing::Id>,
}

impl SessionTelemetry {
    /// For a session started now, on an engine that records on `telemetry`. Reads the
    /// current span: call it where the session's own span is made.
    #[cfg(feature = "telemetry")]
    pub(crate) fn new(telemetry: Option<Telemetry>) -> Self {
        Self {
            telemetry,
            host_parent: tracing::Span::current().id(),
        }
    }

    /// The session's actor started.
    #[inline]
    pub(crate) fn session_started(&self) {
        #[cfg(feature = "telemetry")]
        if let Some(t) = &self.telemetry {
            t.session_started();
        }
    }

    /// The session's actor stopped.
    #[inline]
    pub(crate) fn session_ended(&self) {
        #[cfg(feature = "telemetry")]
        if let Some(t) = &self.telemetry {
            t.session_ended();
        }
    }

    /// A turn of `kind` handed its first text to the output, `latency` after it was asked
    /// for (the end of the user's speech, or the host's call).
    #[inline]
    pub(crate) fn turn_e2e(&self, _latency: Duration, _agent: &Arc<str>, _kind: &'static str) {
        #[cfg(feature = "telemetry")]
        if let Some(t) = &self.telemetry {
            t.turn_e2e(_latency, _agent, _kind);
        }
    }

    /// A preemptive request was used by the turn it was made for (`adopted`) or thrown
    /// away because the user went on.
    #[inline]
    pub(crate) fn preemptive(&self, _agent: &Arc<str>, _adopted: bool) {
        #[cfg(feature = "telemetry")]
        if let Some(t) = &self.telemetry {
            t.preemptive(_agent, _adopted);
        }
    }

    /// A turn waited `_tools` for its tool calls.
    #[inline]
    pub(crate) fn turn_tools(&self, _tools: Duration, _agent: &Arc<str>) {
        #[cfg(feature = "telemetry")]
        if let Some(t) = &self.telemetry {
            t.turn_tools(_tools, _agent);
        }
    }

    /// An LLM request ended: its time to first token and its usage.
    #[inline]
    pub(crate) fn llm_request(
        &self,
        _agent: &Arc<str>,
        _llm: &str,
        _ttft: Option<Duration>,
        _usage: Option<&LlmUsage>,
    ) {
        #[cfg(feature = "telemetry")]
        if let Some(t) = &self.telemetry {
            t.llm_request(_agent, _llm, _ttft, _usage);
        }
    }

    /// A tool run ended (its body returned, or it was stopped).
    #[inline]
    pub(crate) fn tool_ended(&self, _watch: &Stopwatch, _tool: &str) {
        #[cfg(feature = "telemetry")]
        if let Some(t) = &self.telemetry {
            t.tool_duration(_watch.since.elapsed(), _tool);
        }
    }

    /// A turn was interrupted.
    #[inline]
    pub(crate) fn interrupted(&self, _agent: &Arc<str>) {
        #[cfg(feature = "telemetry")]
        if let Some(t) = &self.telemetry {
            t.interruption(_agent);
        }
    }

    /// The session decided on a deferred reply.
    #[inline]
    pub(crate) fn deferred_reply(&self, _agent: &Arc<str>, _decision: DeferredReplyDecision) {
        #[cfg(feature = "telemetry")]
        if let Some(t) = &self.telemetry {
            t.deferred_reply(_agent, _decision);
        }
    }
}
