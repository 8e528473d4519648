//! # switchboard
//!
//! An engine that runs conversational AI agents (voice or chat bots) as a tree of actix
//! actors: one actor for the session, one per agent activity, one per toolset, one per
//! running tool call. They talk only by messages, so a session-scoped toolset outlives
//! agent handoffs while an agent's own tool runs stop when its activity pauses or closes.
//!
//! # Layout
//!
//! Every public type has one path. The types an agent program names are at the crate
//! root; modules remain only where they group a family a user navigates as a whole:
//!
//! - The root: [`Engine`] (where sessions run; its counts, [`EngineStats`], and
//!   [`Engine::drain`]), [`Session`] (one conversation: `run`, `update_agent`, `run_task`,
//!   `say`, `close`, events, the mailbox [`Inspector`], its [`SessionSummary`], and a
//!   [`WeakSession`] for host parts that must not keep it alive), [`HostSession`] (the
//!   host API as one trait, which a `Session` and the cluster's remote session implement,
//!   so a front is written once),
//!   [`Agent`] (instructions, tools, an [`Llm`], hooks), [`Tool`] / [`Toolset`] (typed
//!   arguments with a JSON schema, an async body with a [`RunContext`] that can `update`
//!   the conversation while it keeps running), the chat vocabulary ([`ChatContext`],
//!   [`ChatItem`]), the model interface ([`Llm`], [`LlmRequest`], [`LlmChunk`]), events,
//!   errors, speech handles and outputs.
//! - [`prelude`] — `use switchboard::prelude::*;` brings what an agent program usually
//!   names (the same items as at the root, not other ones).
//! - [`prompts`] — the texts the engine writes into the conversation: [`prompts::Prompts`],
//!   one [`prompts::Template`] per text, the argument struct of each and the default texts.
//!   Only a program that rewords them goes there.
//! - [`realtime`] — realtime speech-to-speech models: the [`RealtimeModel`](realtime::RealtimeModel)
//!   an agent uses in place of an [`Llm`], its settings (audio formats, voice, turn
//!   detection), and the events a provider moves over its connection; the host's
//!   microphone goes in through [`AudioInput`] (`Session::audio_input`).
//! - [`memory`] — handing the memory of a drained traffic peak back to the system.
//! - `telemetry` (cargo feature `telemetry`) — OpenTelemetry metrics, and spans under the
//!   host's.
//! - [`providers`] — real models: `providers::openai::OpenAiLlm` (cargo feature `openai`,
//!   on by default) for OpenAI and compatible servers, `providers::openai_realtime::OpenAiRealtime`
//!   (cargo feature `realtime`, on by default) for the OpenAI Realtime API over a WebSocket,
//!   [`providers::FallbackLlm`] (several
//!   models as one, moving to the next when one fails before answering), and the call-id
//!   mapping any provider adapter needs.
//! - [`testing`] — a scripted model, a recording speech output, fluent assertions on a
//!   turn, a gate, bounded waits on events, a front's script run over any
//!   [`HostSession`], a scripted realtime model and a loopback realtime server that
//!   check their client as the service does: for tests without network.
//! - [`futures`] — the `futures-util` crate the [`LlmStream`] type comes from, so an
//!   [`Llm`] of your own can name `futures::stream::BoxStream` without a dependency.
//! - [`test`] — the attribute for tests, `#[switchboard::test]` (see [Runtimes](#runtimes)).
//! - The actors themselves live in the `switchboard-actors` crate (ARCHITECTURE.md in the
//!   repository maps them).
//!
//! # Runtimes
//!
//! switchboard runs on actix, which runs on tokio. Use one of three recipes:
//!
//! | where | entry point | engine | what you get |
//! |---|---|---|---|
//! | a host program (server, voice pipeline, CLI) | `#[tokio::main]`, any tokio runtime | [`Engine::start`] | the engine owns an actix system on its own threads (one per core) and spreads sessions over them; your program needs no actix |
//! | a program already in an actix system (actix-web, `#[actix::main]`) | the system's | [`Engine::current`] | sessions run on the current arbiter, beside your actors |
//! | tests | `#[switchboard::test]` | [`Engine::current`] | the session's actors run on the test's thread: a deterministic order, and `tokio::time::pause()` reaches them, so timeouts and grace periods pass at once in virtual time |
//!
//! `#[switchboard::test]` is actix's test attribute reached through this crate: a test
//! needs no `actix` dependency (`#[actix::test]` is the same thing). Under a plain
//! `#[tokio::test]`, [`Engine::current`] fails with [`SessionError::Engine`] (there is no
//! actix system); [`Engine::start`] works there but runs the session on other threads,
//! which paused time does not reach. Inside a test, spawn a turn with `tokio::spawn` or
//! `actix::spawn`: both run it on the test's thread.
//!
//! A session's actors, tool bodies and hooks share their arbiter thread with other
//! sessions: blocking or CPU-bound work in a tool goes in [`RunContext::run_blocking`]
//! (tokio's blocking pool), and [`Engine::monitor_stalls`] (off by default) reports an
//! arbiter held longer than a threshold ([`ArbiterStall`]), with the tool call that held
//! it.
//!
//! ```
//! use switchboard::prelude::*;
//! use switchboard::testing::{Reply, ScriptedLlm};
//!
//! #[switchboard::test]
//! async fn greets() {
//!     tokio::time::pause(); // optional: virtual time for the session too
//!     let session = Session::builder()
//!         .llm(ScriptedLlm::new([Reply::text("Hello!")]))
//!         .agent(Agent::builder("greeter").build().unwrap())
//!         .start(&Engine::current().unwrap())
//!         .await
//!         .unwrap();
//!     let result = session.run("hi").await.unwrap();
//!     assert_eq!(result.assistant_messages().collect::<Vec<_>>(), ["Hello!"]);
//!     session.close().await.unwrap();
//! }
//! # fn main() {}
//! ```
//!
//! # Example
//!
//! A host program: an async tool answers the model at once with its first update and
//! finishes in the background; the agent then tells the user.
//!
//! ```
//! use switchboard::prelude::*;
//! use switchboard::testing::{Gate, Reply, ScriptedLlm};
//!
//! #[derive(serde::Deserialize, schemars::JsonSchema)]
//! struct Order { item: String }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let kitchen = Gate::new(); // stands for the kitchen taking its time
//!     let ready = kitchen.clone();
//!     let order = Tool::new("order", "Orders an item", move |ctx: RunContext, args: Order| {
//!         let ready = ready.clone();
//!         async move {
//!             ctx.update(format!("ordering {}", args.item)).await?; // first update: the answer for now
//!             ready.wait().await;
//!             Ok::<_, ToolFailure>(format!("{} ordered", args.item)) // later: `/finished`
//!         }
//!     });
//!     let llm = ScriptedLlm::new([
//!         Reply::tool_call("order", serde_json::json!({"item": "tea"})),
//!         Reply::text("Ordering your tea."),
//!         Reply::text("Your tea is ordered."),
//!     ]);
//!     let agent = Agent::builder("barista").instructions("Take orders.").tool(order).build()?;
//!     let engine = Engine::start()?; // the engine's own actix threads
//!     let session = Session::builder().llm(llm.clone()).agent(agent).start(&engine).await?;
//!     session.run("a tea please").await?; // "Ordering your tea."
//!     kitchen.open();
//!     session.wait_for_settled().await?; // the tool finished and the deferred reply ran
//!     let chat = session.chat_context().await?;
//!     assert!(chat.output_of("call_1/finished").is_some());
//!     assert_eq!(llm.request_count(), 3);
//!     session.close().await?;
//!     Ok(())
//! }
//! ```

pub mod providers;
pub mod testing;

/// The `futures-util` crate, re-exported: [`LlmStream`] is its `BoxStream`, and an
/// [`Llm`] of your own builds one with `futures::stream::iter`, `StreamExt::boxed`, ….
/// (`futures-util` rather than the `futures` facade: it holds everything a stream needs,
/// and the engine depends on it already, so the versions always match.)
pub use futures_util as futures;

/// Runs an `async fn` test in an actix system on the test's thread, where
/// [`Engine::current`] starts sessions and paused tokio time reaches them (see
/// [Runtimes](crate#runtimes)). No `actix` dependency needed.
pub use switchboard_macros::test;

/// What `#[switchboard::test]` expands to refers to these; not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use actix::System;
    pub use actix_macros::test;
}

pub use switchboard_actors::{
    ActorId, ActorSnapshot, Agent, AgentBuilder, AgentChat, AgentHook, AgentState, AgentWork,
    ArbiterStall, AudioInput, BlockingError, BuildError, ChatContext, ChatItem, ChatMessage,
    ChatRole, DeferredReplyDecision, DrainEnd, DrainReport, DrainedSession, DuplicatePolicy,
    Engine, EngineError, EngineStats, ErrorPolicy, ErrorRoute, EventsMissed, FunctionCall,
    FunctionCallOutput, GivenChat, Handoff, HookContext, HostInput, HostSession, InputAnswer,
    InputId, InspectError, Inspector, Llm, LlmChunk, LlmError, LlmMetrics, LlmRequest, LlmStream,
    LlmTimeouts, LlmUsage, NoArgs, NullOutput, Playout, PlayoutReporter, Received, RecordedAnswer,
    RestorePolicy, RunContext, RunResult, SayOptions, Session, SessionAddress, SessionBuilder,
    SessionControl, SessionError, SessionEvent, SessionEvents, SessionHistory, SessionId,
    SessionState, SessionSummary, SpeechControl, SpeechHandle, SpeechId, SpeechOutcome,
    SpeechOutput, SpeechPriority, SpeechReport, StallReports, StalledTool, StartingChat, SubTaskOf,
    TimeoutStage, Tool, ToolCallChunk, ToolChoice, ToolError, ToolFailure, ToolPanic, ToolResult,
    ToolReturn, ToolSchema, Toolset, TurnDecision, TurnFailure, Unfinished, UpdateError,
    UpdateMessage, UserState, WeakSession, CONFIRM_DUPLICATE_PARAM,
};
#[allow(deprecated)]
pub use switchboard_actors::{AsyncRunContext, StopResponse};
// Turn handling, usage and latency (voice teams' asks: backchannels, cost per call,
// latency across handoffs).
pub use switchboard_actors::{
    AgentLatency, Backchannel, Cost, EndOfTurn, Endpointing, EndpointingMode, IgnoredWords,
    Interruption, LatencyStats, ModelPrice, Overlap, OverlapVerdict, PreemptiveGeneration,
    PriceTable, SessionLatency, SessionUsage, TurnClassifier, TurnHandling, TurnLatency,
    TurnMetrics, Usage, UsageLine, UserTurnLimit, DEFAULT_CUT_IN, ENGLISH_BACKCHANNELS,
};

/// Realtime speech-to-speech models: the [`RealtimeModel`](realtime::RealtimeModel) an agent
/// uses in place of an [`Llm`] (`AgentBuilder::realtime`, `SessionBuilder::realtime`), how
/// its sessions are set up ([`RealtimeSettings`](realtime::RealtimeSettings)), and the
/// events a provider moves over its [`RealtimeConnection`](realtime::RealtimeConnection).
/// The provider for OpenAI is `providers::openai_realtime::OpenAiRealtime`; the host's
/// microphone goes in through [`Session::audio_input`] ([`AudioInput`]) and the model's
/// audio comes out through [`SpeechOutput::speech_audio`].
pub mod realtime {
    pub use switchboard_actors::{
        response_event_id, response_tag, AudioFormat, ClientEvent, OutputKind, Place,
        RealtimeCapabilities, RealtimeConnection, RealtimeError, RealtimeModel, RealtimeSettings,
        Reconnect, RemoteItem, ResponseStatus, ServerEvent, SessionUpdate, TurnDetection, VadKind,
    };
}

/// The texts the engine writes into the conversation — the `update` wrapper, the two
/// duplicate answers, the deferred `reply` instructions — and how to reword them: a
/// [`Prompts`](prompts::Prompts) set on the session, an agent or a toolset, one
/// [`Template`](prompts::Template) per text (a format string with named fields, checked
/// when built, or a closure over the text's typed arguments), and the default texts.
pub mod prompts {
    pub use switchboard_actors::{
        DuplicatePromptArgs, PromptArgs, Prompts, ReplyPromptArgs, Template, UpdatePromptArgs,
        DEFAULT_CONFIRM, DEFAULT_REJECT, DEFAULT_REPLY, DEFAULT_UPDATE,
    };
}

/// Sessions that outlive their process (a deploy, a crash, a move to another machine): a
/// [`SessionSnapshot`](snapshot::SessionSnapshot)
/// taken with [`Session::snapshot`] (or the [`SnapshotDelta`](snapshot::SnapshotDelta)s of
/// [`Session::snapshot_update`]), saved by the session itself after every settled turn to a
/// [`SnapshotStore`](snapshot::SnapshotStore) ([`SessionBuilder::save_snapshots`]), and
/// started again with [`SessionBuilder::restore`] and an
/// [`AgentRegistry`](snapshot::AgentRegistry) that builds back the agents it names. A tool's
/// [`RestorePolicy`] says what happens to a call of it that was running.
pub mod snapshot {
    pub use switchboard_actors::{
        AgentRegistry, ChainEnd, Claim, ClaimRule, Claimed, FileStore, LinkRead, MemoryStore,
        SessionSnapshot, SnapshotChain, SnapshotDelta, SnapshotError, SnapshotStore,
        SnapshotUpdate, StoreError, StoreVersion, SNAPSHOT_VERSION,
    };
}

/// The memory of closed sessions: glibc keeps the pages of a drained traffic peak unless
/// they are handed back. [`Engine::release_memory`] does it when the host asks
/// ([`MemoryRelease`](memory::MemoryRelease) says what it found);
/// [`Engine::set_idle_release`] with an [`IdleRelease`](memory::IdleRelease) lets the
/// engine do it by itself once its last session of a peak is gone (off by default), and
/// [`Engine::idle_releases`] reports each such release
/// ([`IdleReleases`](memory::IdleReleases), [`IdleReleased`](memory::IdleReleased)).
pub mod memory {
    pub use switchboard_actors::{IdleRelease, IdleReleased, IdleReleases, MemoryRelease};
}

/// OpenTelemetry (cargo feature `telemetry`): the engine's metrics on the instruments of
/// a [`Telemetry`](telemetry::Telemetry) made from your meter provider
/// ([`Engine::set_telemetry`]), and the [`opentelemetry`](telemetry::opentelemetry) API
/// crate they come from, so your provider is of the same version. The spans are the
/// engine's `tracing` spans (`session`, `turn`, `llm_request`, `tool_run`, `handoff`),
/// each under the span that was current where its work was asked for; bridge them to
/// OpenTelemetry with `tracing-opentelemetry`. Set-up, names and attributes:
/// `docs/production.md`, "Telemetry".
#[cfg(feature = "telemetry")]
pub mod telemetry {
    pub use switchboard_actors::{opentelemetry, Telemetry};
}

/// The names an agent program usually needs: `use switchboard::prelude::*;`. Each is the
/// crate-root item of the same name.
pub mod prelude {
    pub use switchboard_actors::{
        Agent, AgentChat, AgentState, BuildError, ChatContext, ChatItem, ChatMessage, ChatRole,
        DeferredReplyDecision, DuplicatePolicy, Engine, ErrorPolicy, ErrorRoute, Handoff,
        HookContext, Inspector, Llm, NoArgs, Playout, PlayoutReporter, RunContext, RunResult,
        SayOptions, Session, SessionBuilder, SessionControl, SessionError, SessionEvent,
        SessionHistory, SpeechHandle, SpeechId, SpeechOutcome, SpeechOutput, StartingChat, Tool,
        ToolError, ToolFailure, ToolReturn, Toolset, TurnDecision, TurnFailure, UserState,
    };
}
