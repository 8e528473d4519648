//! The engine of [switchboard](https://docs.rs/switchboard): the four actors of a
//! conversational-agent session and the messages between them.
//!
//! Most users want the `switchboard` crate, which re-exports the public surface of this
//! one and adds the testing harness. This crate is split out so the actor internals stay
//! `pub(crate)`: what is public here is what a user touches.
//!
//! # Layout
//!
//! The module tree follows the actor tree (see `ARCHITECTURE.md`): `session` (the
//! `SessionActor` and its schedule), `activity` (an `ActivityActor` and its activation
//! machine), `toolset`, `tool_run`; the vocabulary (chat items, the model trait, events,
//! errors, speech and output), the types users write agents with (agents, tools, their
//! contexts), and the host's side ([`Session`], [`Engine`], [`Inspector`]). Every module
//! is private: each public type has one path, the crate root.
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use switchboard::futures::stream;
//! use switchboard::prelude::*;
//! use switchboard::{LlmChunk, LlmRequest, LlmStream};
//!
//! /// A model that always says hello.
//! struct Hello;
//! impl Llm for Hello {
//!     fn chat(&self, _request: LlmRequest) -> LlmStream {
//!         Box::pin(stream::iter([Ok(LlmChunk::Text("hello".into()))]))
//!     }
//! }
//!
//! #[tokio::main(flavor = "current_thread")]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let engine = Engine::start()?;
//!     let agent = Agent::builder("greeter").instructions("Greet.").build()?;
//!     let session = Session::builder().llm(Arc::new(Hello)).agent(agent).start(&engine).await?;
//!     let result = session.run("hi").await?;
//!     assert_eq!(result.assistant_messages().collect::<Vec<_>>(), ["hello"]);
//!     let history = session.close().await?;
//!     assert_eq!(history.agents.len(), 1);
//!     Ok(())
//! }
//! ```

// Every public type has one path: the crate root. The modules are the engine's layout
// (see `ARCHITECTURE.md`), not part of its surface.
mod activity;
mod agent;
mod audio_input;
mod call_ids;
mod chat;
mod control;
mod delivery;
mod error;
mod error_policy;
mod events;
mod handoff;
mod heartbeat;
mod history;
mod host_input;
mod host_session;
mod idle_release;
mod ids;
mod input_ledger;
mod inspector;
mod latency;
mod lifecycle;
mod llm;
mod llm_guard;
mod mailbox;
mod memory;
mod outcome;
mod output;
mod prompts;
mod realtime;
mod realtime_link;
mod reentry;
mod registry;
mod restore;
mod run_context;
mod runtime;
mod session;
mod session_handle;
mod shared;
mod snapshot;
mod snapshot_chain;
mod snapshot_store;
mod speech;
mod starting_chat;
mod telemetry;
mod tool;
mod tool_run;
mod toolset;
mod turn_handling;
mod usage;

pub use agent::{Agent, AgentBuilder, HookContext, TurnDecision};
pub use audio_input::AudioInput;
pub use chat::{ChatContext, ChatItem, ChatMessage, ChatRole, FunctionCall, FunctionCallOutput};
pub use control::SessionControl;
pub use error::{BlockingError, BuildError, EngineError, SessionError, TurnFailure, UpdateError};
pub use error_policy::{ErrorPolicy, ErrorRoute};
pub use events::{
    AgentHook, AgentState, AgentWork, DeferredReplyDecision, IgnoredWords, LlmMetrics, RunResult,
    SessionEvent, TurnMetrics, Unfinished, UserState,
};
pub use handoff::Handoff;
pub use heartbeat::StalledTool;
pub use history::{AgentChat, SessionHistory, SubTaskOf};
pub use host_input::{HostInput, InputAnswer};
pub use host_session::{EventsMissed, HostSession, SessionEvents};
pub use idle_release::{IdleRelease, IdleReleased, IdleReleases};
pub use ids::{ActorId, SessionId};
pub use input_ledger::{InputId, RecordedAnswer};
pub use inspector::{InspectError, Inspector};
pub use latency::{AgentLatency, LatencyStats, SessionLatency, TurnLatency};
pub use llm::{
    Llm, LlmChunk, LlmError, LlmRequest, LlmStream, LlmTimeouts, LlmUsage, TimeoutStage,
    ToolCallChunk, ToolChoice, ToolSchema,
};
pub use mailbox::{ActorSnapshot, Received};
pub use memory::MemoryRelease;
/// The OpenTelemetry API crate this one records on (feature `telemetry`), so a host
/// makes its meter provider with the same version.
#[cfg(feature = "telemetry")]
pub use opentelemetry;
pub use output::{NullOutput, Playout, PlayoutReporter, SpeechId, SpeechOutput};
pub use prompts::{
    DuplicatePromptArgs, PromptArgs, Prompts, ReplyPromptArgs, Template, UpdatePromptArgs,
    DEFAULT_CONFIRM, DEFAULT_REJECT, DEFAULT_REPLY, DEFAULT_UPDATE,
};
pub use realtime::{
    response_event_id, response_tag, AudioFormat, ClientEvent, OutputKind, Place,
    RealtimeCapabilities, RealtimeConnection, RealtimeError, RealtimeModel, RealtimeSettings,
    Reconnect, RemoteItem, ResponseStatus, ServerEvent, SessionUpdate, TurnDetection, VadKind,
};
pub use restore::AgentRegistry;
#[allow(deprecated)]
pub use run_context::AsyncRunContext;
pub use run_context::{RunContext, UpdateMessage};
pub use runtime::{
    ArbiterStall, DrainEnd, DrainReport, DrainedSession, Engine, EngineStats, SessionState,
    SessionSummary, StallReports,
};
pub use session::SnapshotUpdate;
pub use session_handle::{Session, SessionAddress, SessionBuilder, WeakSession};
pub use snapshot::{SessionSnapshot, SnapshotDelta, SnapshotError, StoreError, SNAPSHOT_VERSION};
pub use snapshot_chain::{ChainEnd, LinkRead, SnapshotChain};
pub use snapshot_store::{
    Claim, ClaimRule, Claimed, FileStore, MemoryStore, SnapshotStore, StoreVersion,
};
pub use speech::{
    SayOptions, SpeechControl, SpeechHandle, SpeechOutcome, SpeechPriority, SpeechReport,
};
pub use starting_chat::{GivenChat, StartingChat};
#[cfg(feature = "telemetry")]
pub use telemetry::Telemetry;
#[allow(deprecated)]
pub use tool::StopResponse;
pub use tool::{
    DuplicatePolicy, NoArgs, RestorePolicy, Tool, ToolError, ToolFailure, ToolPanic, ToolResult,
    ToolReturn, Toolset, CONFIRM_DUPLICATE_PARAM,
};
pub use turn_handling::{
    Backchannel, EndOfTurn, Endpointing, EndpointingMode, Interruption, Overlap, OverlapVerdict,
    PreemptiveGeneration, TurnClassifier, TurnHandling, UserTurnLimit, DEFAULT_CUT_IN,
    ENGLISH_BACKCHANNELS,
};
pub use usage::{Cost, ModelPrice, PriceTable, SessionUsage, Usage, UsageLine};

#[allow(dead_code)]
fn _assert_handles_are_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<Session>();
    check::<RunContext>();
    check::<SessionAddress>();
    check::<WeakSession>();
    check::<EngineStats>();
    check::<SessionSummary>();
    check::<DrainReport>();
    check::<Engine>();
    check::<Agent>();
    check::<Tool>();
    check::<SessionControl>();
    check::<SpeechHandle>();
    check::<PlayoutReporter>();
}
