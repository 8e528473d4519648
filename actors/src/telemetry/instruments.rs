//! The engine's OpenTelemetry instruments (feature `telemetry`).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::metrics::{Counter, Histogram, Meter, MeterProvider, UpDownCounter};
use opentelemetry::{InstrumentationScope, KeyValue};

use crate::events::DeferredReplyDecision;
use crate::llm::LlmUsage;

/// Bucket bounds of the latency histograms, in seconds. OpenTelemetry's default bounds
/// (0, 5, 10, 25, … 10,000) suit milliseconds; in seconds they would put every turn in
/// the first two buckets. These cover what a voice turn takes, 5 ms to 30 s, finest
/// around the 0.2–2 s where a conversation feels fast or slow.
const LATENCY_BOUNDS: [f64; 16] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0,
];

/// The engine's metrics, as OpenTelemetry instruments made by the host's meter provider.
///
/// Give it to an engine with [`Engine::set_telemetry`](crate::Engine::set_telemetry);
/// an engine starts with [`Telemetry::global`]. Cheap to clone: the instruments are
/// shared. Each instrument's name is an associated constant below; their attributes
/// are the agent's, model's or tool's name (names from your code, so few series), never
/// a session id.
#[derive(Clone)]
pub struct Telemetry {
    inner: Arc<Instruments>,
}

struct Instruments {
    turn_e2e: Histogram<f64>,
    llm_ttft: Histogram<f64>,
    tool_duration: Histogram<f64>,
    interruptions: Counter<u64>,
    deferred_replies: Counter<u64>,
    prompt_tokens: Counter<u64>,
    completion_tokens: Counter<u64>,
    cached_prompt_tokens: Counter<u64>,
    audio_prompt_tokens: Counter<u64>,
    audio_completion_tokens: Counter<u64>,
    preemptive: Counter<u64>,
    turn_tools: Histogram<f64>,
    sessions_live: UpDownCounter<i64>,
}

impl fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Telemetry")
    }
}

impl Telemetry {
    /// The instrumentation scope's name: the meter the instruments come from.
    pub const SCOPE: &'static str = "switchboard";
    /// Histogram, seconds, attributes `agent` and `kind` (`user`, `reply`, `deferred`,
    /// …): from the end of the user's speech (their `user_stopped_speaking` before the
    /// words that made the turn, else the final transcript), or the host's call that
    /// asked for the turn (`run`), to the first text of its reply handed to the output.
    /// Recorded for the agent that ran the turn, also the first turn after a handoff.
    /// LiveKit: `lk.agents.turn.e2e_latency`.
    pub const TURN_E2E_LATENCY: &'static str = "switchboard.turn.e2e_latency";
    /// Histogram, seconds, attributes `agent` and `llm`: from an LLM request to its first
    /// chunk. LiveKit: `llm_ttft`.
    pub const LLM_TTFT: &'static str = "switchboard.llm.ttft";
    /// Histogram, seconds, attribute `tool`: from a tool run's start to its end (its body
    /// returned, or it was cancelled and stopped). LiveKit has a span (`function_tool`),
    /// no metric.
    pub const TOOL_DURATION: &'static str = "switchboard.tool.duration";
    /// Counter, attribute `agent`: turns interrupted (by the host, a barge-in, a
    /// preempting handoff, a dropped `run` future).
    pub const TURN_INTERRUPTIONS: &'static str = "switchboard.turn.interruptions";
    /// Counter, attributes `agent` and `decision` (`requested`, `already_answered`):
    /// deferred replies to tool items that came after their step.
    pub const DEFERRED_REPLIES: &'static str = "switchboard.turn.deferred_replies";
    /// Counter, tokens, attributes `agent` and `llm`: prompt tokens the model reported.
    /// LiveKit's LLM metrics: `prompt_tokens`.
    pub const LLM_PROMPT_TOKENS: &'static str = "switchboard.llm.prompt_tokens";
    /// Counter, tokens, attributes `agent` and `llm`: completion tokens the model reported.
    /// LiveKit: `completion_tokens`.
    pub const LLM_COMPLETION_TOKENS: &'static str = "switchboard.llm.completion_tokens";
    /// Counter, tokens, attributes `agent` and `llm`: prompt tokens served from the
    /// provider's cache, when it says. LiveKit: `prompt_cached_tokens`.
    pub const LLM_PROMPT_CACHED_TOKENS: &'static str = "switchboard.llm.prompt_cached_tokens";
    /// Counter, tokens, attributes `agent` and `llm`: prompt tokens that were audio.
    pub const LLM_AUDIO_PROMPT_TOKENS: &'static str = "switchboard.llm.audio_prompt_tokens";
    /// Counter, tokens, attributes `agent` and `llm`: completion tokens that were audio.
    pub const LLM_AUDIO_COMPLETION_TOKENS: &'static str = "switchboard.llm.audio_completion_tokens";
    /// Counter, attributes `agent` and `outcome` (`adopted`, `discarded`): preemptive
    /// requests, used by the turn they were made for or thrown away because the user
    /// went on (each discarded one is a paid request that answered nobody).
    pub const LLM_PREEMPTIVE: &'static str = "switchboard.llm.preemptive";
    /// Histogram, seconds, attribute `agent`: how long a turn waited for its tool calls'
    /// outputs (turns that called tools).
    pub const TURN_TOOL_TIME: &'static str = "switchboard.turn.tool_time";
    /// Up-down counter: sessions whose actor runs, summed over every engine that records
    /// here.
    pub const SESSIONS_LIVE: &'static str = "switchboard.sessions.live";

    /// Instruments made by `meter`.
    pub fn new(meter: &Meter) -> Self {
        let latency = |name: &'static str, description: &'static str| {
            meter
                .f64_histogram(name)
                .with_unit("s")
                .with_description(description)
                .with_boundaries(LATENCY_BOUNDS.to_vec())
                .build()
        };
        let tokens = |name: &'static str, description: &'static str| {
            meter
                .u64_counter(name)
                .with_unit("{token}")
                .with_description(description)
                .build()
        };
        Self {
            inner: Arc::new(Instruments {
                turn_e2e: latency(
                    Self::TURN_E2E_LATENCY,
                    "From the call that asked for a turn to the first text of its reply",
                ),
                llm_ttft: latency(Self::LLM_TTFT, "From an LLM request to its first chunk"),
                tool_duration: latency(Self::TOOL_DURATION, "How long a tool call ran"),
                interruptions: meter
                    .u64_counter(Self::TURN_INTERRUPTIONS)
                    .with_unit("{turn}")
                    .with_description("Turns interrupted")
                    .build(),
                deferred_replies: meter
                    .u64_counter(Self::DEFERRED_REPLIES)
                    .with_unit("{reply}")
                    .with_description("Deferred replies to tool items that came after their step")
                    .build(),
                prompt_tokens: tokens(Self::LLM_PROMPT_TOKENS, "Prompt tokens of LLM requests"),
                completion_tokens: tokens(
                    Self::LLM_COMPLETION_TOKENS,
                    "Completion tokens of LLM requests",
                ),
                cached_prompt_tokens: tokens(
                    Self::LLM_PROMPT_CACHED_TOKENS,
                    "Prompt tokens served from the provider's cache",
                ),
                audio_prompt_tokens: tokens(
                    Self::LLM_AUDIO_PROMPT_TOKENS,
                    "Prompt tokens that were audio",
                ),
                audio_completion_tokens: tokens(
                    Self::LLM_AUDIO_COMPLETION_TOKENS,
                    "Completion tokens that were audio",
                ),
                preemptive: meter
                    .u64_counter(Self::LLM_PREEMPTIVE)
                    .with_unit("{request}")
                    .with_description("Preemptive LLM requests, adopted or discarded")
                    .build(),
                turn_tools: latency(
                    Self::TURN_TOOL_TIME,
                    "How long a turn waited for its tool calls",
                ),
                sessions_live: meter
                    .i64_up_down_counter(Self::SESSIONS_LIVE)
                    .with_unit("{session}")
                    .with_description("Sessions running")
                    .build(),
            }),
        }
    }

    /// Instruments from `provider`'s meter for the `switchboard` scope (with the crate's
    /// version): what a host that keeps its own provider (and tests) pass.
    pub fn from_provider(provider: &impl MeterProvider) -> Self {
        Self::new(&provider.meter_with_scope(scope()))
    }

    /// Instruments from OpenTelemetry's global meter provider, as it is now: set yours
    /// (`opentelemetry::global::set_meter_provider`) before you make the engine, or these
    /// record on the no-op provider for good.
    pub fn global() -> Self {
        Self::new(&opentelemetry::global::meter_with_scope(scope()))
    }

    pub(crate) fn session_started(&self) {
        self.inner.sessions_live.add(1, &[]);
    }

    pub(crate) fn session_ended(&self) {
        self.inner.sessions_live.add(-1, &[]);
    }

    pub(crate) fn turn_e2e(&self, latency: Duration, agent: &Arc<str>, kind: &'static str) {
        self.inner.turn_e2e.record(
            latency.as_secs_f64(),
            &[
                KeyValue::new("agent", agent.clone()),
                KeyValue::new("kind", kind),
            ],
        );
    }

    pub(crate) fn llm_request(
        &self,
        agent: &Arc<str>,
        llm: &str,
        ttft: Option<Duration>,
        usage: Option<&LlmUsage>,
    ) {
        let attributes = [
            KeyValue::new("agent", agent.clone()),
            KeyValue::new("llm", llm.to_owned()),
        ];
        if let Some(ttft) = ttft {
            self.inner.llm_ttft.record(ttft.as_secs_f64(), &attributes);
        }
        if let Some(usage) = usage {
            let i = &self.inner;
            i.prompt_tokens
                .add(u64::from(usage.prompt_tokens), &attributes);
            i.completion_tokens
                .add(u64::from(usage.completion_tokens), &attributes);
            if let Some(cached) = usage.cached_prompt_tokens {
                i.cached_prompt_tokens.add(u64::from(cached), &attributes);
            }
            if let Some(audio) = usage.audio_prompt_tokens {
                i.audio_prompt_tokens.add(u64::from(audio), &attributes);
            }
            if let Some(audio) = usage.audio_completion_tokens {
                i.audio_completion_tokens.add(u64::from(audio), &attributes);
            }
        }
    }

    pub(crate) fn preemptive(&self, agent: &Arc<str>, adopted: bool) {
        self.inner.preemptive.add(
            1,
            &[
                KeyValue::new("agent", agent.clone()),
                KeyValue::new("outcome", if adopted { "adopted" } else { "discarded" }),
            ],
        );
    }

    pub(crate) fn turn_tools(&self, tools: Duration, agent: &Arc<str>) {
        self.inner.turn_tools.record(
            tools.as_secs_f64(),
            &[KeyValue::new("agent", agent.clone())],
        );
    }

    pub(crate) fn tool_duration(&self, duration: Duration, tool: &str) {
        self.inner.tool_duration.record(
            duration.as_secs_f64(),
            &[KeyValue::new("tool", tool.to_owned())],
        );
    }

    pub(crate) fn interruption(&self, agent: &Arc<str>) {
        self.inner
            .interruptions
            .add(1, &[KeyValue::new("agent", agent.clone())]);
    }

    pub(crate) fn deferred_reply(&self, agent: &Arc<str>, decision: DeferredReplyDecision) {
        let decision = match decision {
            DeferredReplyDecision::Requested => "requested",
            DeferredReplyDecision::AlreadyAnswered => "already_answered",
        };
        self.inner.deferred_replies.add(
            1,
            &[
                KeyValue::new("agent", agent.clone()),
                KeyValue::new("decision", decision),
            ],
        );
    }
}

/// The `switchboard` scope, with this crate's version.
fn scope() -> InstrumentationScope {
    InstrumentationScope::builder(Telemetry::SCOPE)
        .with_version(env!("CARGO_PKG_VERSION"))
        .build()
}
