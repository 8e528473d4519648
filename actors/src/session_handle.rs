//! `Session`: the host's handle on one conversation, and its builder.
//!
//! A thin `Send + Clone` wrapper over the session actor's counted address: each method
//! is one message and one reply, so a host on another thread crosses into the engine once
//! per operation, never per event or per chunk (events come through a channel).

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use tokio::sync::{broadcast, watch};

use crate::agent::Agent;
use crate::chat::ChatContext;
use crate::error::{BuildError, SessionError, TaskError};
use crate::error_policy::ErrorPolicy;
use crate::events::{RunResult, SessionEvent};
use crate::ids::{ActorId, SessionId};
use crate::inspector::Inspector;
use crate::io::{Io, NullIo, SpeechId};
use crate::lifecycle::alive_pair;
use crate::llm::Llm;
use crate::mailbox::{Journal, Mailbox, Probe};
use crate::prompts::Prompts;
use crate::run_context::RunContext;
use crate::runtime::Engine;
use crate::session::{
    CloseSession, Handoff, QueueReply, ReadAgent, ReadChat, RunTask, RunTurn, SessionActor,
    SpeechPlayedOut, StartSession,
};
use crate::shared::{SessionConfig, SessionShared};
use crate::tool::{mock_body, MockBody, ToolFailure, ToolReturn, Toolset};
use serde_json::Value;
use std::collections::HashMap;
use std::future::Future;

/// A running session. Cheap to clone; every clone talks to the same session actor.
#[derive(Clone)]
pub struct Session {
    pub(crate) mailbox: Mailbox<SessionActor>,
    pub(crate) shared: Arc<SessionShared>,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.shared.id)
            .finish()
    }
}

impl Session {
    /// Starts configuring a session.
    pub fn builder() -> SessionBuilder {
        SessionBuilder::default()
    }

    /// The session's id (`s1`, `s2`, …).
    pub fn id(&self) -> &SessionId {
        &self.shared.id
    }

    /// Runs one user turn and returns what it produced, after any handoff it caused.
    pub async fn run(&self, user_input: impl Into<String>) -> Result<RunResult, SessionError> {
        self.mailbox
            .ask(
                &ActorId::host(),
                RunTurn {
                    input: user_input.into(),
                },
            )
            .await?
    }

    /// Asks the current agent for a reply (no user message), with optional instructions.
    pub async fn generate_reply(
        &self,
        instructions: Option<String>,
    ) -> Result<RunResult, SessionError> {
        self.mailbox
            .ask(&ActorId::host(), QueueReply { instructions })
            .await?
    }

    /// Queues a reply without waiting for it (used by hooks).
    pub(crate) fn queue_reply(&self, from: &ActorId, instructions: String) {
        self.mailbox.tell(
            from,
            QueueReply {
                instructions: Some(instructions),
            },
        );
    }

    /// Hands the conversation to `agent` after the current turn; resolves once its
    /// `on_enter` has run.
    pub async fn update_agent(&self, agent: Agent) -> Result<(), SessionError> {
        self.address().send(Handoff::to(agent)).await
    }

    /// Runs a sub-task agent until a tool of it returns `ToolReturn::CompleteTask`,
    /// pausing the current agent meanwhile; returns the typed result.
    pub async fn run_task<T: DeserializeOwned>(&self, agent: Agent) -> Result<T, TaskError> {
        self.run_task_from(agent, None).await
    }

    pub(crate) async fn run_task_from<T: DeserializeOwned>(
        &self,
        agent: Agent,
        exempt: Option<u64>,
    ) -> Result<T, TaskError> {
        let value = self
            .mailbox
            .ask(&ActorId::host(), RunTask { agent, exempt })
            .await??;
        Ok(serde_json::from_value(value)?)
    }

    /// Closes the session: cancels tool runs (with their grace period), writes their
    /// terminal outputs, stops every actor of the session. Resolves once all are gone.
    pub async fn close(&self) -> Result<(), SessionError> {
        let waiter = self
            .shared
            .session_gone
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if self.mailbox.connected() {
            // An error here means it stopped meanwhile, which is what we want.
            let _ = self.mailbox.ask(&ActorId::host(), CloseSession).await;
        }
        if let Some(waiter) = waiter {
            waiter.wait().await;
        }
        Ok(())
    }

    /// Resolves when the session is inactive: the current agent runs no turn and none is
    /// queued, no handoff is under way, no deferred reply is pending. (Tools may still run
    /// in the background: see [`Session::wait_for_settled`].)
    pub async fn wait_for_inactive(&self) {
        let mut rx = self.shared.inactive.subscribe();
        let _ = rx.wait_for(|inactive| *inactive).await;
    }

    /// Resolves when the session has settled: no tool call is running anywhere in it and
    /// the session is inactive (every deferred reply has run). What a test awaits after
    /// letting background tools finish.
    pub async fn wait_for_settled(&self) {
        let mut tools = self.shared.running_tools.subscribe();
        let mut inactive = self.shared.inactive.subscribe();
        loop {
            if *tools.borrow_and_update() == 0 && *inactive.borrow_and_update() {
                return;
            }
            tokio::select! {
                changed = tools.changed() => if changed.is_err() { return },
                changed = inactive.changed() => if changed.is_err() { return },
            }
        }
    }

    /// Whether the session is inactive now.
    pub fn is_inactive(&self) -> bool {
        *self.shared.inactive.borrow()
    }

    /// A watch of the session's inactivity, for hosts that select over it.
    pub fn inactivity(&self) -> watch::Receiver<bool> {
        self.shared.inactive.subscribe()
    }

    /// Subscribes to the session's events (from now on).
    pub fn subscribe(&self) -> broadcast::Receiver<SessionEvent> {
        self.shared.subscribe()
    }

    /// A copy of the current agent's chat context.
    pub async fn chat_context(&self) -> Result<ChatContext, SessionError> {
        self.mailbox.ask(&ActorId::host(), ReadChat).await?
    }

    /// The current agent's name.
    pub async fn current_agent(&self) -> Result<String, SessionError> {
        self.mailbox
            .ask(&ActorId::host(), ReadAgent)
            .await?
            .ok_or(SessionError::Closed)
    }

    /// Tells the session that a speech's playout ended (voice I/O whose
    /// `Io::speech_finished` returned `Playout::Pending`); `heard` is what the user
    /// actually heard, when it was cut short.
    pub fn playout_finished(&self, speech: SpeechId, heard: Option<String>) {
        self.mailbox
            .tell(&ActorId::host(), SpeechPlayedOut { speech, heard });
    }

    /// The session actor's address, for sending it messages (`Handoff`).
    pub fn address(&self) -> SessionAddress {
        SessionAddress {
            mailbox: self.mailbox.clone(),
        }
    }

    /// The mailbox inspector, when the session was built with `.inspect(true)`.
    pub fn inspector(&self) -> Option<Inspector> {
        self.shared
            .journal
            .as_ref()
            .map(|journal| Inspector::new(journal.clone(), self.shared.id.clone()))
    }

    /// The session's user data, if it is a `T`.
    pub fn userdata<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        self.shared.userdata.clone()?.downcast().ok()
    }
}

/// The session actor's address as users see it: counted like every engine send, and
/// limited to the messages users may send.
#[derive(Clone)]
pub struct SessionAddress {
    mailbox: Mailbox<SessionActor>,
}

impl fmt::Debug for SessionAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SessionAddress({})", self.mailbox.id())
    }
}

impl SessionAddress {
    /// Sends a `Handoff` and waits for it to complete (after the current turn).
    pub async fn send(&self, handoff: Handoff) -> Result<(), SessionError> {
        self.mailbox.ask(&ActorId::host(), handoff).await?
    }

    /// The session actor's id.
    pub fn id(&self) -> &ActorId {
        self.mailbox.id()
    }
}

/// Configures and starts a [`Session`].
pub struct SessionBuilder {
    llm: Option<Arc<dyn Llm>>,
    agent: Option<Agent>,
    toolsets: Vec<Toolset>,
    io: Box<dyn Io>,
    userdata: Option<Arc<dyn Any + Send + Sync>>,
    max_tool_steps: u32,
    grace_period: Duration,
    inherit_chat_context: bool,
    inspect: bool,
    journal_capacity: usize,
    event_capacity: usize,
    error_policy: ErrorPolicy,
    prompts: Prompts,
    mocks: HashMap<String, MockBody>,
}

impl Default for SessionBuilder {
    fn default() -> Self {
        Self {
            llm: None,
            agent: None,
            toolsets: Vec::new(),
            io: Box::new(NullIo),
            userdata: None,
            max_tool_steps: 3,
            grace_period: Duration::from_secs(2),
            inherit_chat_context: false,
            inspect: false,
            journal_capacity: 1024,
            event_capacity: 1024,
            error_policy: ErrorPolicy::new(),
            prompts: Prompts::new(),
            mocks: HashMap::new(),
        }
    }
}

impl fmt::Debug for SessionBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionBuilder")
            .field("agent", &self.agent)
            .field("toolsets", &self.toolsets)
            .finish_non_exhaustive()
    }
}

impl SessionBuilder {
    /// The model agents use unless they set their own.
    pub fn llm(mut self, llm: Arc<dyn Llm>) -> Self {
        self.llm = Some(llm);
        self
    }

    /// The first agent.
    pub fn agent(mut self, agent: Agent) -> Self {
        self.agent = Some(agent);
        self
    }

    /// Adds a session-scoped toolset: its runs survive handoffs and deliver to the agent
    /// current at delivery time.
    pub fn toolset(mut self, toolset: Toolset) -> Self {
        self.toolsets.push(toolset);
        self
    }

    /// Where speech goes (default: dropped; read turns from `RunResult` and events).
    pub fn io(mut self, io: impl Io) -> Self {
        self.io = Box::new(io);
        self
    }

    /// Data tools and hooks can read (`ctx.userdata::<T>()`).
    pub fn userdata<T: Any + Send + Sync>(mut self, data: T) -> Self {
        self.userdata = Some(Arc::new(data));
        self
    }

    /// How many LLM steps with tool calls one turn may take (default 3).
    pub fn max_tool_steps(mut self, steps: u32) -> Self {
        self.max_tool_steps = steps.max(1);
        self
    }

    /// How long a cancelled tool may take to finish before its future is dropped
    /// (default 2 s).
    pub fn grace_period(mut self, grace: Duration) -> Self {
        self.grace_period = grace;
        self
    }

    /// Whether a new agent starts with a copy of the previous agent's chat context
    /// (default false: each agent has its own).
    pub fn inherit_chat_context(mut self, inherit: bool) -> Self {
        self.inherit_chat_context = inherit;
        self
    }

    /// Records every actor's traffic for `Session::inspector` (default off: then the
    /// probe only counts queued messages).
    pub fn inspect(mut self, on: bool) -> Self {
        self.inspect = on;
        self
    }

    /// How many messages the journal keeps per actor (default 1024).
    pub fn journal_capacity(mut self, capacity: usize) -> Self {
        self.journal_capacity = capacity;
        self
    }

    /// How many events a slow subscriber may fall behind before it is told it lagged
    /// (default 1024).
    pub fn event_capacity(mut self, capacity: usize) -> Self {
        self.event_capacity = capacity;
        self
    }

    /// Routes unexpected tool errors (after tool and agent rules; default: hide).
    pub fn error_policy(mut self, policy: ErrorPolicy) -> Self {
        self.error_policy = policy;
        self
    }

    /// Prompt templates for the whole session (agents and toolsets may override them).
    pub fn prompts(mut self, prompts: Prompts) -> Self {
        self.prompts = prompts;
        self
    }

    /// Replaces the body of every tool named `name` in this session (whichever agent or
    /// toolset has it) by `mock`, keeping the tool's schema and policies. The arguments
    /// are still checked against the tool's own type first (a call that would not parse
    /// gets the same error as without the mock); the mock gets them as JSON, and a
    /// `RunContext` with which it may `update`, return or fail like the real body.
    /// Mocks belong to this session only: another session can mock the same tool
    /// differently.
    pub fn mock_tool<F, Fut, R>(mut self, name: impl Into<String>, mock: F) -> Self
    where
        F: Fn(RunContext, Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, ToolFailure>> + Send + 'static,
        R: Into<ToolReturn>,
    {
        self.mocks.insert(name.into(), mock_body(mock));
        self
    }

    /// Starts the session on one of the engine's arbiters and runs the first agent's
    /// `on_enter`.
    pub async fn start(self, engine: &Engine) -> Result<Session, SessionError> {
        let agent = self.agent.ok_or(BuildError::NoAgent)?;
        if agent.def.llm.is_none() && self.llm.is_none() {
            return Err(BuildError::NoLlm {
                agent: agent.name().to_owned(),
            }
            .into());
        }
        for toolset in &self.toolsets {
            for tool in &toolset.tools {
                crate::agent::check_confirm(tool, crate::agent::effective_policy(tool, toolset))?;
            }
        }
        crate::agent::check_tools(self.toolsets.iter().flat_map(|ts| {
            ts.tools
                .iter()
                .map(move |t| (t.name(), format!("session toolset {}", ts.name)))
        }))?;
        let id = engine.next_session_id();
        let journal = self.inspect.then(|| Journal::new(self.journal_capacity));
        let shared = Arc::new(SessionShared::new(
            id.clone(),
            SessionConfig {
                max_tool_steps: self.max_tool_steps,
                grace_period: self.grace_period,
                inherit_chat_context: self.inherit_chat_context,
            },
            self.llm,
            self.error_policy,
            self.prompts,
            self.mocks,
            self.userdata,
            journal.clone(),
            self.io,
            self.event_capacity,
        ));
        let probe = Probe::new(ActorId::session_actor(&id), journal);
        let (alive, waiter) = alive_pair();
        *shared
            .session_gone
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(waiter);
        let toolsets = self.toolsets;
        let actor_shared = shared.clone();
        let actor_probe = probe.clone();
        let addr = engine.start_actor(move || {
            SessionActor::new(actor_shared, actor_probe, agent, toolsets, alive)
        })?;
        let session = Session {
            mailbox: Mailbox::new(addr, probe),
            shared,
        };
        session
            .mailbox
            .ask(
                &ActorId::host(),
                StartSession {
                    handle: session.clone(),
                },
            )
            .await??;
        Ok(session)
    }
}
