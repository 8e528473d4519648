//! Agents: user code the engine runs. An agent is a definition (instructions, tools, an
//! LLM, hooks); each time it becomes current, the session starts an *activity* of it.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;

use crate::chat::{ChatContext, ChatMessage};
use crate::control::SessionControl;
use crate::error::{BuildError, SessionError};
use crate::error_policy::ErrorPolicy;
use crate::llm::{Llm, LlmTimeouts};
use crate::prompts::Prompts;
use crate::realtime::RealtimeModel;
use crate::starting_chat::StartingChat;
use crate::tool::{valid_tool_name, DuplicatePolicy, Tool, Toolset};
use crate::turn_handling::TurnHandling;

pub(crate) use crate::tool::COMPANION_TOOLS;

/// What `on_user_turn_completed` decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TurnDecision {
    /// Ask the model for a reply.
    Reply,
    /// Keep the user's message but do not reply.
    NoReply,
    /// Keep the user's message but do not reply.
    #[deprecated(
        since = "0.1.0",
        note = "use TurnDecision::NoReply: \"no reply\" is said one way"
    )]
    StopResponse,
}

/// What a lifecycle hook (`on_enter`, `on_exit`) gets.
#[derive(Clone)]
pub struct HookContext {
    pub(crate) session: SessionControl,
    pub(crate) agent: Arc<str>,
}

impl HookContext {
    /// The session, for queueing work (a reply, a handoff) and reading its user data.
    /// Its requests return once queued: a hook runs inside a handoff, so nothing it asks
    /// for can run before it returns.
    pub fn session(&self) -> &SessionControl {
        &self.session
    }

    /// The agent's name.
    pub fn agent(&self) -> &str {
        &self.agent
    }

    /// Queues a reply of the agent, run once the hook has returned and the handoff is
    /// complete. Returns once it is queued.
    pub async fn generate_reply(
        &self,
        instructions: impl Into<String>,
    ) -> Result<(), SessionError> {
        self.session.generate_reply(instructions).await
    }
}

impl fmt::Debug for HookContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HookContext")
            .field("agent", &self.agent)
            .finish()
    }
}

pub(crate) type Hook = Arc<dyn Fn(HookContext) -> BoxFuture<'static, ()> + Send + Sync>;
pub(crate) type TurnHook =
    Arc<dyn Fn(&mut ChatContext, &mut ChatMessage) -> TurnDecision + Send + Sync>;

/// An agent definition. Cheap to clone; build with [`Agent::builder`].
#[derive(Clone)]
pub struct Agent {
    pub(crate) def: Arc<AgentDef>,
}

pub(crate) struct AgentDef {
    pub(crate) name: Arc<str>,
    pub(crate) instructions: Arc<str>,
    pub(crate) llm: Option<Arc<dyn Llm>>,
    /// The realtime model this agent uses instead of an LLM, if it sets one.
    pub(crate) realtime: Option<Arc<dyn RealtimeModel>>,
    /// The voice of its realtime model, if not the model's.
    pub(crate) voice: Option<String>,
    pub(crate) tools: Vec<Tool>,
    pub(crate) toolsets: Vec<Toolset>,
    pub(crate) on_enter: Option<Hook>,
    pub(crate) on_exit: Option<Hook>,
    pub(crate) on_user_turn_completed: Option<TurnHook>,
    pub(crate) error_policy: ErrorPolicy,
    pub(crate) prompts: Prompts,
    pub(crate) llm_timeouts: Option<LlmTimeouts>,
    pub(crate) allow_interruptions: Option<bool>,
    pub(crate) max_reply_bytes: Option<usize>,
    pub(crate) starting_chat: Option<StartingChat>,
    /// How it takes turns, over the session's (group by group).
    pub(crate) turn_handling: Option<TurnHandling>,
    /// What the agent was built with, for a snapshot (`AgentBuilder::restore_data`).
    pub(crate) restore_data: serde_json::Value,
}

impl fmt::Debug for Agent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Agent")
            .field("name", &self.def.name)
            .field("tools", &self.def.tools.len())
            .field("toolsets", &self.def.toolsets.len())
            .finish()
    }
}

impl Agent {
    /// Starts building an agent with this name (part of its activities' actor ids).
    pub fn builder(name: impl Into<String>) -> AgentBuilder {
        AgentBuilder {
            def: AgentDef {
                name: Arc::from(name.into()),
                instructions: Arc::from(""),
                llm: None,
                realtime: None,
                voice: None,
                tools: Vec::new(),
                toolsets: Vec::new(),
                on_enter: None,
                on_exit: None,
                on_user_turn_completed: None,
                error_policy: ErrorPolicy::new(),
                prompts: Prompts::new(),
                llm_timeouts: None,
                allow_interruptions: None,
                max_reply_bytes: None,
                starting_chat: None,
                turn_handling: None,
                restore_data: serde_json::Value::Null,
            },
        }
    }

    /// The agent's name.
    pub fn name(&self) -> &str {
        &self.def.name
    }

    /// Its instructions.
    pub fn instructions(&self) -> &str {
        &self.def.instructions
    }

    /// The data it was built with (`AgentBuilder::restore_data`), what a snapshot records
    /// so that an [`AgentRegistry`](crate::AgentRegistry) builds the same agent again.
    pub fn restore_data(&self) -> &serde_json::Value {
        &self.def.restore_data
    }

    /// The chat context it asked to start with, if it did.
    pub(crate) fn starting_chat(&self) -> Option<&StartingChat> {
        self.def.starting_chat.as_ref()
    }

    /// Whether any tool the agent brings allows the model to cancel it.
    pub(crate) fn any_cancellable(&self) -> bool {
        self.def
            .tools
            .iter()
            .chain(self.def.toolsets.iter().flat_map(|ts| ts.tools.iter()))
            .any(Tool::allows_cancellation)
    }

    /// The tool names this agent brings (bare tools and agent-scoped toolsets) with where
    /// each comes from.
    pub(crate) fn tool_owners(&self) -> impl Iterator<Item = (&str, String)> {
        let agent = &self.def.name;
        self.def
            .tools
            .iter()
            .map(move |t| (t.name(), format!("agent {agent}")))
            .chain(self.def.toolsets.iter().flat_map(move |ts| {
                ts.tools
                    .iter()
                    .map(move |t| (t.name(), format!("toolset {} of agent {agent}", ts.name)))
            }))
    }
}

/// Builds an [`Agent`]; [`AgentBuilder::build`] checks tool names and schemas.
pub struct AgentBuilder {
    def: AgentDef,
}

impl fmt::Debug for AgentBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentBuilder")
            .field("name", &self.def.name)
            .finish()
    }
}

impl AgentBuilder {
    /// The data this agent was built from, when it was built with data of the call (a
    /// booking agent for "party of 2"): a session snapshot records it, and restoring the
    /// session hands it to the agent's builder in the
    /// [`AgentRegistry`](crate::AgentRegistry), so the agent comes back the same. Any
    /// serde value (default: none). A value that does not serialize is recorded as none.
    pub fn restore_data<T: serde::Serialize>(mut self, data: &T) -> Self {
        self.def.restore_data = serde_json::to_value(data).unwrap_or(serde_json::Value::Null);
        self
    }

    /// The agent's instructions (its system prompt).
    pub fn instructions(mut self, instructions: impl Into<String>) -> Self {
        self.def.instructions = Arc::from(instructions.into());
        self
    }

    /// The chat context this agent starts with whenever it becomes current: none, all or
    /// the last items of the agent before it (for a sub-task, its caller's), or one given.
    /// Default: for a handoff the session's `inherit_chat_context`, for a sub-task and
    /// the first agent an empty one. A handoff's own choice (`Handoff::with_chat`) wins.
    pub fn starting_chat(mut self, chat: StartingChat) -> Self {
        self.def.starting_chat = Some(chat);
        self
    }

    /// The model this agent uses (default: the session's).
    pub fn llm(mut self, llm: Arc<dyn Llm>) -> Self {
        self.def.llm = Some(llm);
        self
    }

    /// The realtime speech-to-speech model this agent uses instead of an LLM (default: the
    /// session's model). Its tools, handoffs, sub-tasks and async tools work as with an
    /// LLM; the model hears the user's audio and speaks through the host's output. A
    /// handoff to an agent of the same model keeps the model's connection.
    pub fn realtime(mut self, model: Arc<dyn RealtimeModel>) -> Self {
        self.def.realtime = Some(model);
        self
    }

    /// The voice this agent speaks with on a realtime model (default: the model's). A
    /// model that cannot change its voice once it has spoken (OpenAI) keeps the voice it
    /// started with when a later agent asks for another.
    pub fn voice(mut self, voice: impl Into<String>) -> Self {
        self.def.voice = Some(voice.into());
        self
    }

    /// How long this agent's LLM requests may wait for their first and their next chunk
    /// (default: the session's, see `SessionBuilder::llm_timeouts`).
    pub fn llm_timeouts(mut self, timeouts: LlmTimeouts) -> Self {
        self.def.llm_timeouts = Some(timeouts);
        self
    }

    /// Whether the user may interrupt this agent's speech (default: the session's
    /// setting; a `say` may set its own).
    pub fn allow_interruptions(mut self, allow: bool) -> Self {
        self.def.allow_interruptions = Some(allow);
        self
    }

    /// How this agent takes turns: each group it sets (endpointing, interruption,
    /// preemptive generation, user-turn limit, classifier) replaces the session's, the
    /// others are the session's (see `SessionBuilder::turn_handling`).
    pub fn turn_handling(mut self, turn_handling: TurnHandling) -> Self {
        self.def.turn_handling = Some(turn_handling);
        self
    }

    /// How much text one of this agent's LLM steps may stream, in bytes (default: the
    /// session's, see `SessionBuilder::max_reply_bytes`).
    pub fn max_reply_bytes(mut self, bytes: usize) -> Self {
        self.def.max_reply_bytes = Some(bytes);
        self
    }

    /// Adds a bare tool (in the agent's implicit, agent-scoped toolset `tools`).
    pub fn tool(mut self, tool: Tool) -> Self {
        self.def.tools.push(tool);
        self
    }

    /// Adds an agent-scoped toolset: its running calls stop when the agent's activity
    /// pauses or closes.
    pub fn toolset(mut self, toolset: Toolset) -> Self {
        self.def.toolsets.push(toolset);
        self
    }

    /// Runs when an activity of this agent starts.
    pub fn on_enter<F, Fut>(mut self, hook: F) -> Self
    where
        F: Fn(HookContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.def.on_enter = Some(Arc::new(move |ctx| hook(ctx).boxed()));
        self
    }

    /// Runs when an activity of this agent closes, before its tools are stopped.
    pub fn on_exit<F, Fut>(mut self, hook: F) -> Self
    where
        F: Fn(HookContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.def.on_exit = Some(Arc::new(move |ctx| hook(ctx).boxed()));
        self
    }

    /// Runs on each user turn before the reply: may edit the chat context and the new
    /// message, or stop the reply.
    pub fn on_user_turn_completed(
        mut self,
        hook: impl Fn(&mut ChatContext, &mut ChatMessage) -> TurnDecision + Send + Sync + 'static,
    ) -> Self {
        self.def.on_user_turn_completed = Some(Arc::new(hook));
        self
    }

    /// Routes unexpected errors of this agent's tools (after each tool's own rules).
    pub fn error_policy(mut self, policy: ErrorPolicy) -> Self {
        self.def.error_policy = policy;
        self
    }

    /// Prompt templates of this agent: `update` and the duplicate texts for its own
    /// toolsets, `reply` while it is current.
    pub fn prompts(mut self, prompts: Prompts) -> Self {
        self.def.prompts = prompts;
        self
    }

    /// Checks the agent and builds it: tool names valid and unique among its own tools and
    /// toolsets, and no `confirm` tool declaring its own `confirm_duplicate` argument.
    pub fn build(self) -> Result<Agent, BuildError> {
        let agent = Agent {
            def: Arc::new(self.def),
        };
        check_tools(agent.tool_owners())?;
        for tool in &agent.def.tools {
            check_confirm(tool, DuplicatePolicy::Reject)?;
        }
        for toolset in &agent.def.toolsets {
            for tool in &toolset.tools {
                check_confirm(tool, effective_policy(tool, toolset))?;
            }
        }
        Ok(agent)
    }
}

/// The duplicate policy a tool of a named toolset runs with.
pub(crate) fn effective_policy(tool: &Tool, toolset: &Toolset) -> DuplicatePolicy {
    tool.duplicate_policy()
        .or(toolset.default_duplicate)
        .unwrap_or(DuplicatePolicy::Confirm)
}

pub(crate) fn check_confirm(tool: &Tool, policy: DuplicatePolicy) -> Result<(), BuildError> {
    let policy = tool.duplicate_policy().unwrap_or(policy);
    if policy == DuplicatePolicy::Confirm && tool.declares_confirm_param() {
        return Err(BuildError::ConfirmParameterClash {
            tool: tool.name().to_owned(),
        });
    }
    Ok(())
}

/// Checks names are valid and unique; `owners` yields (tool name, where it comes from).
pub(crate) fn check_tools<'a>(
    owners: impl IntoIterator<Item = (&'a str, String)>,
) -> Result<(), BuildError> {
    let mut seen: HashMap<&str, String> = HashMap::new();
    for (name, owner) in owners {
        if !valid_tool_name(name) {
            return Err(BuildError::InvalidToolName {
                name: name.to_owned(),
            });
        }
        if let Some(first) = seen.get(name) {
            return Err(BuildError::DuplicateToolName {
                name: name.to_owned(),
                first: first.clone(),
                second: owner,
            });
        }
        seen.insert(name, owner);
    }
    Ok(())
}
