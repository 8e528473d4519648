//! # switchboard
//!
//! An engine that runs conversational AI agents (voice or chat bots) as a tree of actix
//! actors: one actor for the session, one per agent activity, one per toolset, one per
//! running tool call. They talk only by messages, so a session-scoped toolset outlives
//! agent handoffs while an agent's own tool runs stop when its activity pauses or closes.
//!
//! # Layout
//!
//! - [`Engine`] — where sessions run: its own actix threads from a `#[tokio::main]`
//!   program, or the current arbiter inside `#[actix::test]`.
//! - [`Session`] — the handle of one conversation: `run`, `update_agent`, `run_task`,
//!   `close`, events, the mailbox [`Inspector`].
//! - [`Agent`] — instructions, tools, an [`Llm`], hooks.
//! - [`Tool`] / [`Toolset`] — typed arguments (serde + JSON schema), an async body with a
//!   [`RunContext`] that can `update` the conversation while it keeps running.
//! - [`providers`] — real models: [`providers::openai::OpenAiLlm`] (cargo feature `openai`,
//!   on by default) for OpenAI and compatible servers, and the call-id mapping any provider
//!   adapter needs.
//! - [`testing`] — [`testing::ScriptedLlm`] and recording I/O, for tests without network.
//! - [`futures`] — the `futures-util` crate the [`LlmStream`] type comes from, so an
//!   [`Llm`] of your own can name `futures::stream::BoxStream` without a dependency.
//! - The actors themselves live in the `switchboard-actors` crate; see `ARCHITECTURE.md`.
//!
//! # Example
//!
//! ```
//! use switchboard::prelude::*;
//! use switchboard::testing::{Reply, ScriptedLlm};
//!
//! #[derive(serde::Deserialize, schemars::JsonSchema)]
//! struct Order { item: String }
//!
//! #[actix::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let order = Tool::new("order", "Orders an item", |ctx: RunContext, args: Order| async move {
//!         ctx.update(format!("ordering {}", args.item)).await?; // first update: the answer for now
//!         Ok::<_, ToolFailure>(format!("{} ordered", args.item)) // later: `/finished`
//!     });
//!     let llm = ScriptedLlm::new([
//!         Reply::tool_call("order", serde_json::json!({"item": "tea"})),
//!         Reply::text("Ordering your tea."),
//!         Reply::text("Your tea is ordered."),
//!     ]);
//!     let agent = Agent::builder("barista").instructions("Take orders.").tool(order).build()?;
//!     let engine = Engine::current()?;
//!     let session = Session::builder().llm(llm.clone()).agent(agent).start(&engine).await?;
//!     session.run("a tea please").await?;
//!     session.wait_for_inactive().await; // the deferred reply to `/finished` has run
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

pub use switchboard_actors::{
    agent, chat, control, error, error_policy, events, handoff, history, ids, inspector, llm,
    output, prompts, run_context, speech, tool,
};
pub use switchboard_actors::{
    ActorId, ActorSnapshot, Agent, AgentBuilder, AgentChat, AgentState, AsyncRunContext,
    BuildError, ChatContext, ChatItem, ChatMessage, ChatRole, DuplicatePolicy, DuplicatePromptArgs,
    Engine, ErrorPolicy, ErrorRoute, FunctionCall, FunctionCallOutput, Handoff, HookContext,
    InspectError, Inspector, Journal, Llm, LlmChunk, LlmError, LlmMetrics, LlmRequest, LlmStream,
    LlmTimeouts, LlmUsage, NoArgs, NullOutput, Playout, PlayoutReporter, PromptArgs, Prompts,
    Received, ReplyPromptArgs, RunContext, RunResult, SayOptions, Session, SessionAddress,
    SessionBuilder, SessionControl, SessionError, SessionEvent, SessionHistory, SessionId,
    SpeechError, SpeechHandle, SpeechId, SpeechOutcome, SpeechOutput, SpeechPriority, StopResponse,
    TaskError, Template, TimeoutStage, Tool, ToolCallChunk, ToolChoice, ToolError, ToolFailure,
    ToolPanic, ToolResult, ToolReturn, ToolSchema, Toolset, TurnDecision, UpdateError,
    UpdateMessage, UpdatePromptArgs, UserState, CONFIRM_DUPLICATE_PARAM,
};

/// The names an agent program usually needs: `use switchboard::prelude::*;`.
pub mod prelude {
    pub use switchboard_actors::{
        Agent, AgentState, ChatContext, ChatItem, ChatRole, DuplicatePolicy, Engine, ErrorPolicy,
        ErrorRoute, Handoff, Inspector, Llm, NoArgs, RunContext, RunResult, SayOptions, Session,
        SessionControl, SessionError, SessionEvent, SpeechHandle, SpeechOutcome, SpeechOutput,
        StopResponse, Tool, ToolError, ToolFailure, ToolReturn, Toolset, UserState,
    };
}
