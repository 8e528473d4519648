//! The engine of [switchboard](https://docs.rs/switchboard): the four actors of a
//! conversational-agent session and the messages between them.
//!
//! Most users want the `switchboard` crate, which re-exports the public surface of this
//! one and adds the testing harness. This crate is split out so the actor internals stay
//! `pub(crate)`: what is public here is what a user touches.
//!
//! # Layout
//!
//! The module tree follows the actor tree (see `ARCHITECTURE.md`):
//!
//! - `session` — `SessionActor`: one conversation; owns session-scoped toolsets and the
//!   schedule (which agent is current, queued work, the deferred reply).
//! - `activity` — `ActivityActor`: one activation of an agent; owns its chat context, its
//!   agent-scoped toolsets and the LLM turn loop.
//! - `toolset` — `ToolsetActor`: a group of tools with its registry of running calls.
//! - `tool_run` — `ToolRunActor`: one running tool call.
//!
//! Vocabulary: [`chat`], [`llm`], [`tool`], [`agent`], [`events`], [`output`], [`speech`]. Handles given
//! to user code: [`Session`] and [`RunContext`]. Inspection: [`Inspector`] over the
//! per-session journal kept by the counted mailboxes in `mailbox`.
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use futures_util::stream;
//! use switchboard_actors::*;
//!
//! /// A model that always says hello.
//! struct Hello;
//! impl Llm for Hello {
//!     fn chat(&self, _request: LlmRequest) -> LlmStream {
//!         Box::pin(stream::iter([Ok(LlmChunk::Text("hello".into()))]))
//!     }
//! }
//!
//! #[actix::main]
//! async fn main() -> Result<(), SessionError> {
//!     let engine = Engine::current()?;
//!     let agent = Agent::builder("greeter").instructions("Greet.").build()?;
//!     let session = Session::builder().llm(Arc::new(Hello)).agent(agent).start(&engine).await?;
//!     let result = session.run("hi").await?;
//!     assert_eq!(result.assistant_messages().collect::<Vec<_>>(), ["hello"]);
//!     let history = session.close().await?;
//!     assert_eq!(history.agents.len(), 1);
//!     Ok(())
//! }
//! ```

pub mod agent;
pub mod chat;
pub mod control;
pub mod error;
pub mod error_policy;
pub mod events;
pub mod handoff;
pub mod history;
pub mod ids;
pub mod inspector;
pub mod llm;
pub mod memory;
pub mod output;
pub mod prompts;
pub mod run_context;
pub mod runtime;
pub mod session_handle;
pub mod speech;
pub mod starting_chat;
pub mod tool;

mod activity;
mod call_ids;
mod delivery;
mod idle_release;
mod lifecycle;
mod llm_guard;
mod mailbox;
mod outcome;
mod reentry;
mod session;
mod shared;
mod tool_run;
mod toolset;

pub use agent::{Agent, AgentBuilder, HookContext, TurnDecision};
pub use chat::{ChatContext, ChatItem, ChatMessage, ChatRole, FunctionCall, FunctionCallOutput};
pub use control::SessionControl;
pub use error::{BuildError, SessionError, SpeechError, TaskError, TurnFailure, UpdateError};
pub use error_policy::{ErrorPolicy, ErrorRoute};
pub use events::{
    AgentState, DeferredReplyDecision, LlmMetrics, RunResult, SessionEvent, UserState,
};
pub use handoff::Handoff;
pub use history::{AgentChat, SessionHistory, SubTaskOf};
pub use idle_release::{IdleRelease, IdleReleased, IdleReleases};
pub use ids::{ActorId, SessionId};
pub use inspector::{InspectError, Inspector};
pub use llm::{
    Llm, LlmChunk, LlmError, LlmRequest, LlmStream, LlmTimeouts, LlmUsage, TimeoutStage,
    ToolCallChunk, ToolChoice, ToolSchema,
};
pub use mailbox::{ActorSnapshot, Received};
pub use memory::MemoryRelease;
pub use output::{NullOutput, Playout, PlayoutReporter, SpeechId, SpeechOutput};
pub use prompts::{
    DuplicatePromptArgs, PromptArgs, Prompts, ReplyPromptArgs, Template, UpdatePromptArgs,
};
pub use run_context::{AsyncRunContext, RunContext, UpdateMessage};
pub use runtime::Engine;
pub use session_handle::{Session, SessionAddress, SessionBuilder};
pub use speech::{SayOptions, SpeechHandle, SpeechOutcome, SpeechPriority};
pub use starting_chat::{GivenChat, StartingChat};
pub use tool::{
    DuplicatePolicy, NoArgs, StopResponse, Tool, ToolError, ToolFailure, ToolPanic, ToolResult,
    ToolReturn, Toolset, CONFIRM_DUPLICATE_PARAM,
};

#[allow(dead_code)]
fn _assert_handles_are_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<Session>();
    check::<RunContext>();
    check::<SessionAddress>();
    check::<Engine>();
    check::<Agent>();
    check::<Tool>();
    check::<SessionControl>();
    check::<SpeechHandle>();
    check::<PlayoutReporter>();
}
