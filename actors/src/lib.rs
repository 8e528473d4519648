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
//! - [`session`] — `SessionActor`: one conversation; owns session-scoped toolsets, which
//!   agent is current, the turn queue and the deferred reply.
//! - `activity` — `ActivityActor`: one activation of an agent; owns its chat context, its
//!   agent-scoped toolsets and the LLM turn loop.
//! - `toolset` — `ToolsetActor`: a group of tools with its registry of running calls.
//! - `tool_run` — `ToolRunActor`: one running tool call.
//!
//! Vocabulary: [`chat`], [`llm`], [`tool`], [`agent`], [`events`], [`io`]. Handles given
//! to user code: [`Session`] and [`RunContext`]. Inspection: [`Inspector`] over the
//! per-session [`Journal`] kept by the counted mailboxes in `mailbox`.
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
//!     session.close().await
//! }
//! ```

pub mod agent;
pub mod chat;
pub mod error;
pub mod error_policy;
pub mod events;
pub mod ids;
pub mod inspector;
pub mod io;
pub mod llm;
pub mod prompts;
pub mod run_context;
pub mod runtime;
pub mod session;
pub mod session_handle;
pub mod tool;

mod activity;
mod lifecycle;
mod mailbox;
mod outcome;
mod shared;
mod tool_run;
mod toolset;

pub use agent::{Agent, AgentBuilder, HookContext, TurnDecision};
pub use chat::{ChatContext, ChatItem, ChatMessage, ChatRole, FunctionCall, FunctionCallOutput};
pub use error::{BuildError, SessionError, TaskError, UpdateError};
pub use error_policy::{ErrorPolicy, ErrorRoute};
pub use events::{AgentState, RunResult, SessionEvent};
pub use ids::{ActorId, SessionId};
pub use inspector::{InspectError, Inspector};
pub use io::{Io, NullIo, Playout, SpeechId};
pub use llm::{
    Llm, LlmChunk, LlmError, LlmRequest, LlmStream, LlmTimeouts, LlmUsage, TimeoutStage,
    ToolCallChunk, ToolChoice, ToolSchema,
};
pub use mailbox::{ActorSnapshot, Journal, Received};
pub use prompts::{
    DuplicatePromptArgs, PromptArgs, Prompts, ReplyPromptArgs, Template, UpdatePromptArgs,
};
pub use run_context::{AsyncRunContext, RunContext};
pub use runtime::Engine;
pub use session::Handoff;
pub use session_handle::{Session, SessionAddress, SessionBuilder};
pub use tool::{
    DuplicatePolicy, NoArgs, StopResponse, Tool, ToolError, ToolFailure, ToolPanic, ToolResult,
    ToolReturn, Toolset, CONFIRM_DUPLICATE_PARAM,
};
pub use tool_run::UpdateMessage;

#[allow(dead_code)]
fn _assert_handles_are_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<Session>();
    check::<RunContext>();
    check::<SessionAddress>();
    check::<Engine>();
    check::<Agent>();
    check::<Tool>();
}
