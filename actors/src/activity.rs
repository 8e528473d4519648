//! `ActivityActor`: one activation of an agent in a session.
//!
//! - **Owns:** the agent's chat context, its agent-scoped toolsets (a `ToolsetActor` for
//!   the bare tools, `tools`, and one per agent toolset) and the LLM turn loop.
//! - **Parent:** the session. Sends nothing to it but replies; talks to toolsets (its
//!   own and the session's) with `RunTool`.
//! - **Starts** on `StartActivity` (runs `on_enter`); **pauses** on `PauseActivity` (a
//!   sub-task agent runs) and **resumes** on `ResumeActivity`; **stops** on
//!   `CloseActivity` (runs `on_exit`, stops its toolsets).
//! - **Handles:** `StartActivity`, `StartTurn`, `InsertToolItems`, `AppendItems`,
//!   `PauseActivity`, `ResumeActivity`, `CloseActivity`, `PlayoutFinished`, `GetChat`.
//!
//! Guarantees, each tested:
//! - Every function call in the chat context has exactly one output after it, whatever
//!   happens (cancel, error, handoff, pause, close).
//! - A call's later items (`/update_n`, `/finished`) are held until its step's pairs are
//!   in the chat context.
//! - When `PauseActivity` or `CloseActivity` answers, every tool run of its own toolsets
//!   (but the one awaiting a sub-task, on pause) has stopped and been dropped.
//! - Once paused or closed, it accepts no tool items: they are refused, never redirected.

mod companions;
mod turn;

use std::collections::HashSet;
use std::sync::Arc;

use actix::prelude::*;
use serde_json::Value;
use tokio::sync::oneshot;

use crate::agent::{check_tools, effective_policy, Agent, HookContext};
use crate::chat::{ChatContext, ChatItem, ChatRole, FunctionCall};
use crate::error::{BuildError, SessionError, UpdateError};
use crate::events::{AgentState, SessionEvent};
use crate::ids::ActorId;
use crate::io::{Playout, SpeechId};
use crate::lifecycle::{alive_pair, wait_all, AliveToken, AliveWaiter};
use crate::llm::{Llm, ToolChoice, ToolSchema};
use crate::mailbox::{counted_handlers, Mailbox, Probe};
use crate::outcome::CallOutput;
use crate::prompts::Prompts;
use crate::session::{Handoff, PendingItem, Scope, SessionToolset};
use crate::session_handle::Session;
use crate::tool::DuplicatePolicy;
use crate::toolset::{StopRuns, StopToolset, ToolsetActor};

/// What a finished turn reports to the session.
#[derive(Debug, Default)]
pub(crate) struct TurnOutcome {
    pub(crate) events: Vec<ChatItem>,
    pub(crate) handoff: Option<Handoff>,
    pub(crate) task_result: Option<Value>,
    pub(crate) failure: Option<SessionError>,
}

/// What kind of turn to run.
#[derive(Debug)]
pub(crate) enum TurnKind {
    /// A user message.
    User(String),
    /// A reply with optional extra instructions (`generate_reply`).
    Reply(Option<String>),
    /// The coalesced reply to background tool items.
    Deferred(Vec<PendingItem>),
}

struct Slot {
    call: FunctionCall,
    output: Option<CallOutput>,
}

struct Turn {
    events: Vec<ChatItem>,
    steps: u32,
    step_key: u64,
    slots: Vec<Slot>,
    tool_choice: ToolChoice,
    extra_instructions: Option<String>,
    awaiting_playout: Option<SpeechId>,
    finished: Option<TurnOutcome>,
    done: Option<oneshot::Sender<TurnOutcome>>,
}

struct Held {
    base_call_id: String,
    items: Vec<ChatItem>,
    /// The tool's `ctx.update` waiting for the items; none for the engine's own terminal
    /// items.
    reply: Option<oneshot::Sender<Result<(), UpdateError>>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    Starting,
    Active,
    Paused,
    Closed,
}

/// The LLM's complete answer to one request.
struct LlmReply {
    text: String,
    calls: Vec<crate::llm::ToolCallChunk>,
    speech: Option<SpeechId>,
    playout: Playout,
    #[allow(dead_code)]
    usage: Option<crate::llm::LlmUsage>,
}

pub(crate) struct ActivityActor {
    probe: Arc<Probe>,
    agent: Agent,
    session: Session,
    llm: Arc<dyn Llm>,
    chat: ChatContext,
    session_toolsets: Arc<[SessionToolset]>,
    own_toolsets: Vec<(Mailbox<ToolsetActor>, Option<AliveWaiter>)>,
    /// Tool name → toolset that runs it.
    routes: std::collections::HashMap<String, Mailbox<ToolsetActor>>,
    schemas: Arc<[ToolSchema]>,
    turn: Option<Turn>,
    step_seq: u64,
    uncommitted: HashSet<String>,
    held: Vec<Held>,
    /// Chat length the latest assistant message was generated from.
    last_reply_view: usize,
    status: Status,
    /// Whether `get_running_tasks` and `cancel_task` are exposed.
    companions: bool,
    llm_task: Option<SpawnHandle>,
    generation: u32,
    _alive: AliveToken,
}

impl ActivityActor {
    /// Starts an activity actor (idle until `StartActivity`) on the current arbiter.
    pub(crate) fn spawn(
        agent: Agent,
        generation: u32,
        session: Session,
        session_toolsets: Arc<[SessionToolset]>,
    ) -> Result<(Mailbox<ActivityActor>, AliveWaiter), BuildError> {
        let shared = session.shared.clone();
        let llm = agent
            .def
            .llm
            .clone()
            .or_else(|| shared.llm.clone())
            .ok_or_else(|| BuildError::NoLlm {
                agent: agent.name().to_owned(),
            })?;
        let companions = agent
            .def
            .tools
            .iter()
            .chain(agent.def.toolsets.iter().flat_map(|ts| ts.tools.iter()))
            .chain(session_toolsets.iter().flat_map(|ts| ts.tools.iter()))
            .any(|t| t.allows_cancellation());
        let companion_names = companions
            .then(|| companions::schemas().map(|s| (s.name, "companion tools".to_owned())))
            .into_iter()
            .flatten()
            .collect::<Vec<_>>();
        // Names are unique among everything this activity sees (SPEC §5).
        check_tools(
            agent
                .tool_owners()
                .chain(session_toolsets.iter().flat_map(|ts| {
                    ts.tools
                        .iter()
                        .map(move |t| (t.name(), format!("session toolset {}", ts.name)))
                }))
                .chain(companion_names.iter().map(|(n, o)| (n.as_str(), o.clone()))),
        )?;
        let probe = Probe::new(
            ActorId::activity(&shared.id, agent.name(), generation),
            shared.journal.clone(),
        );
        let (alive, waiter) = alive_pair();
        let actor = ActivityActor {
            probe: probe.clone(),
            agent,
            session,
            llm,
            chat: ChatContext::new(),
            session_toolsets,
            own_toolsets: Vec::new(),
            routes: Default::default(),
            schemas: Arc::from(Vec::new()),
            turn: None,
            step_seq: 0,
            uncommitted: HashSet::new(),
            held: Vec::new(),
            last_reply_view: 0,
            status: Status::Starting,
            companions,
            llm_task: None,
            generation,
            _alive: alive,
        };
        Ok((Mailbox::new(actor.start(), probe), waiter))
    }

    fn id(&self) -> &ActorId {
        self.probe.id()
    }

    fn agent_name(&self) -> String {
        self.agent.name().to_owned()
    }

    fn hook_ctx(&self) -> HookContext {
        HookContext {
            session: self.session.clone(),
            agent: self.agent.def.name.clone(),
            activity: self.id().clone(),
        }
    }

    fn set_state(&self, state: AgentState) {
        self.session
            .shared
            .emit_with(|| SessionEvent::AgentStateChanged {
                agent: self.agent_name(),
                state,
            });
    }

    /// Appends an item to the chat context and, during a turn, to the turn's events.
    fn record(&mut self, item: ChatItem) {
        self.session
            .shared
            .emit_with(|| SessionEvent::ConversationItemAdded {
                agent: self.agent_name(),
                item: item.clone(),
            });
        if let Some(turn) = self.turn.as_mut() {
            turn.events.push(item.clone());
        }
        self.chat.push(item);
    }

    /// Spawns the agent's own toolsets and computes the tool schemas (stable order:
    /// bare tools, agent toolsets, session toolsets).
    fn start_toolsets(&mut self) {
        let shared = self.session.shared.clone();
        let scope = Scope::Activity(self.id().clone());
        let mut schemas = Vec::new();
        type Group = (String, Vec<(crate::tool::Tool, DuplicatePolicy)>, Prompts);
        let mut groups: Vec<Group> = Vec::new();
        let agent_prompts = self.agent.def.prompts.or(&shared.prompts);
        if !self.agent.def.tools.is_empty() {
            let tools = self
                .agent
                .def
                .tools
                .iter()
                .map(|t| {
                    (
                        t.clone(),
                        t.duplicate_policy().unwrap_or(DuplicatePolicy::Reject),
                    )
                })
                .collect();
            groups.push(("tools".to_owned(), tools, agent_prompts.clone()));
        }
        for toolset in &self.agent.def.toolsets {
            let tools = toolset
                .tools
                .iter()
                .map(|t| (t.clone(), effective_policy(t, toolset)))
                .collect();
            groups.push((
                toolset.name.clone(),
                tools,
                toolset.prompts.or(&agent_prompts),
            ));
        }
        for (name, tools, prompts) in groups {
            schemas.extend(tools.iter().map(|(t, p)| t.schema(*p)));
            let names: Vec<String> = tools.iter().map(|(t, _)| t.name().to_owned()).collect();
            let (mailbox, waiter) = ToolsetActor::spawn(
                ActorId::agent_toolset(&shared.id, self.agent.name(), self.generation, &name),
                scope.clone(),
                tools,
                prompts,
                self.session.clone(),
            );
            for tool in names {
                self.routes.insert(tool, mailbox.clone());
            }
            self.own_toolsets.push((mailbox, Some(waiter)));
        }
        for toolset in self.session_toolsets.iter() {
            schemas.extend(toolset.schemas.iter().cloned());
            for tool in &toolset.tools {
                self.routes
                    .insert(tool.name().to_owned(), toolset.mailbox.clone());
            }
        }
        if self.companions {
            schemas.extend(companions::schemas());
        }
        self.schemas = Arc::from(schemas);
    }

    /// Every toolset this activity sees: its own, then the session's.
    fn visible_toolsets(&self) -> Vec<Mailbox<ToolsetActor>> {
        self.own_toolsets
            .iter()
            .map(|(ts, _)| ts.clone())
            .chain(self.session_toolsets.iter().map(|ts| ts.mailbox.clone()))
            .collect()
    }
}

impl Actor for ActivityActor {
    type Context = Context<Self>;

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        self.status = Status::Closed;
        self.refuse_held();
        self.probe.stopped();
    }
}

/// Sent by the session once, right after it spawned the activity: starts the agent's
/// toolsets and runs `on_enter`. The reply comes after `on_enter` returned.
pub(crate) struct StartActivity {
    /// The chat context to start from (inherited from the previous agent, or empty).
    pub(crate) chat: ChatContext,
    /// The agent this one takes over from, recorded as a handoff item.
    pub(crate) handoff_from: Option<Option<String>>,
}

impl Message for StartActivity {
    type Result = ();
}

impl Handler<StartActivity> for ActivityActor {
    type Result = ResponseActFuture<Self, ()>;

    fn handle(&mut self, msg: StartActivity, _ctx: &mut Self::Context) -> Self::Result {
        self.chat = msg.chat;
        if let Some(from) = msg.handoff_from {
            self.record_outside_turn(ChatItem::AgentHandoff {
                from,
                to: self.agent_name(),
            });
        }
        self.start_toolsets();
        self.set_state(AgentState::Initializing);
        let hook = self.agent.def.on_enter.clone();
        let hook_ctx = self.hook_ctx();
        Box::pin(
            async move {
                if let Some(hook) = hook {
                    hook(hook_ctx).await;
                }
            }
            .into_actor(self)
            .map(|(), act, _| {
                if act.status == Status::Starting {
                    act.status = Status::Active;
                }
                act.set_state(AgentState::Listening);
            }),
        )
    }
}

/// Sent by the session to run one turn; the session sends the next only after this one
/// answered, so an activity runs one turn at a time. The reply is the turn's outcome.
pub(crate) struct StartTurn {
    pub(crate) kind: TurnKind,
}

impl Message for StartTurn {
    type Result = TurnOutcome;
}

impl Handler<StartTurn> for ActivityActor {
    type Result = ResponseFuture<TurnOutcome>;

    fn handle(&mut self, msg: StartTurn, ctx: &mut Self::Context) -> Self::Result {
        let (tx, rx) = oneshot::channel();
        if self.turn.is_some() || self.status != Status::Active {
            return Box::pin(async {
                TurnOutcome {
                    failure: Some(SessionError::Closed),
                    ..Default::default()
                }
            });
        }
        self.begin_turn(msg.kind, tx, ctx);
        Box::pin(async move {
            rx.await.unwrap_or(TurnOutcome {
                failure: Some(SessionError::Closed),
                ..Default::default()
            })
        })
    }
}

/// Sent by the session to deliver a tool's later items (`/update_n`, `/finished`) to this
/// agent's chat context. Held while the call's own step is not yet in the chat context;
/// refused when the activity is paused or closed. The reply comes once the items are in.
pub(crate) struct InsertToolItems {
    pub(crate) base_call_id: String,
    pub(crate) items: Vec<ChatItem>,
}

impl Message for InsertToolItems {
    type Result = Result<(), UpdateError>;
}

impl Handler<InsertToolItems> for ActivityActor {
    type Result = ResponseFuture<Result<(), UpdateError>>;

    fn handle(&mut self, msg: InsertToolItems, _ctx: &mut Self::Context) -> Self::Result {
        if !matches!(self.status, Status::Active | Status::Starting) {
            let err = UpdateError::ScopeClosed {
                call_id: msg.base_call_id,
            };
            return Box::pin(async move { Err(err) });
        }
        if self.uncommitted.contains(&msg.base_call_id)
            || self.held.iter().any(|h| h.base_call_id == msg.base_call_id)
        {
            let (tx, rx) = oneshot::channel();
            self.held.push(Held {
                base_call_id: msg.base_call_id,
                items: msg.items,
                reply: Some(tx),
            });
            return Box::pin(async move { rx.await.unwrap_or(Err(UpdateError::SessionClosed)) });
        }
        for item in msg.items {
            self.record_outside_turn(item);
        }
        Box::pin(async { Ok(()) })
    }
}

/// Sent by the session to append items it produced (terminal outputs of session-scoped
/// runs stopped at close).
pub(crate) struct AppendItems {
    pub(crate) items: Vec<ChatItem>,
}

impl Message for AppendItems {
    type Result = ();
}

impl Handler<AppendItems> for ActivityActor {
    type Result = ();

    fn handle(&mut self, msg: AppendItems, _ctx: &mut Self::Context) {
        for item in msg.items {
            self.record_outside_turn(item);
        }
    }
}

/// Sent by the session before a sub-task agent starts: stops the runs of this agent's
/// toolsets (all but `exempt`, the run awaiting the sub-task) and awaits them. The turn
/// in progress stays open and goes on after `ResumeActivity`.
pub(crate) struct PauseActivity {
    pub(crate) exempt: Option<u64>,
}

impl Message for PauseActivity {
    type Result = ();
}

impl Handler<PauseActivity> for ActivityActor {
    type Result = ResponseActFuture<Self, ()>;

    fn handle(&mut self, msg: PauseActivity, _ctx: &mut Self::Context) -> Self::Result {
        self.status = Status::Paused;
        self.refuse_held();
        let reason: Arc<str> = Arc::from("the agent was paused for a sub-task");
        let stops: Vec<_> = self
            .own_toolsets
            .iter()
            .map(|(ts, _)| {
                ts.ask(
                    self.probe.id(),
                    StopRuns {
                        reason: reason.clone(),
                        except: msg.exempt,
                    },
                )
            })
            .collect();
        Box::pin(futures_util::future::join_all(stops).into_actor(self).map(
            move |results, act, _| {
                let calls = results.into_iter().flatten().flatten().collect();
                act.write_terminal(calls, &reason);
            },
        ))
    }
}

/// Sent by the session when the sub-task this activity waited for has ended.
pub(crate) struct ResumeActivity;

impl Message for ResumeActivity {
    type Result = ();
}

impl Handler<ResumeActivity> for ActivityActor {
    type Result = ();

    fn handle(&mut self, _msg: ResumeActivity, ctx: &mut Self::Context) {
        if self.status == Status::Paused {
            self.status = Status::Active;
            self.maybe_commit(ctx);
        }
    }
}

/// Sent by the session to end this activity (handoff, end of a sub-task, session close):
/// runs `on_exit`, stops its toolsets (every run cancelled, given the grace period and
/// awaited), gives unfinished calls their terminal outputs, then stops. The reply is the
/// final chat context, sent once every tool actor of this activity is gone.
pub(crate) struct CloseActivity {
    pub(crate) reason: Arc<str>,
}

impl Message for CloseActivity {
    type Result = ChatContext;
}

impl Handler<CloseActivity> for ActivityActor {
    type Result = ResponseActFuture<Self, ChatContext>;

    fn handle(&mut self, msg: CloseActivity, ctx: &mut Self::Context) -> Self::Result {
        let was_active = self.status != Status::Closed;
        self.status = Status::Closed;
        if let Some(task) = self.llm_task.take() {
            ctx.cancel_future(task);
        }
        self.refuse_held();
        let hook = if was_active {
            self.agent.def.on_exit.clone()
        } else {
            None
        };
        let hook_ctx = self.hook_ctx();
        let reason = msg.reason;
        Box::pin(
            async move {
                if let Some(hook) = hook {
                    hook(hook_ctx).await;
                }
            }
            .into_actor(self)
            .then(move |(), act, _| {
                let mut stops = Vec::new();
                let mut waiters = Vec::new();
                for (toolset, waiter) in act.own_toolsets.iter_mut() {
                    stops.push(toolset.ask(
                        act.probe.id(),
                        StopToolset {
                            reason: reason.clone(),
                        },
                    ));
                    waiters.extend(waiter.take());
                }
                async move {
                    let results = futures_util::future::join_all(stops).await;
                    wait_all(waiters).await;
                    (results, reason)
                }
                .into_actor(act)
            })
            .map(|(results, reason), act, ctx| {
                let calls = results.into_iter().flatten().flatten().collect();
                act.abort_step(&reason);
                act.write_terminal(calls, &reason);
                if let Some(turn) = act.turn.as_mut() {
                    turn.awaiting_playout = None;
                }
                act.finish_turn(TurnOutcome {
                    failure: Some(SessionError::Closed),
                    ..Default::default()
                });
                ctx.stop();
                act.chat.clone()
            }),
        )
    }
}

/// Sent by the session when the host reports a speech's playout ended; `heard`, when
/// given, replaces the message text with what the user actually heard.
pub(crate) struct PlayoutFinished {
    pub(crate) speech: SpeechId,
    pub(crate) heard: Option<String>,
}

impl Message for PlayoutFinished {
    type Result = ();
}

impl Handler<PlayoutFinished> for ActivityActor {
    type Result = ();

    fn handle(&mut self, msg: PlayoutFinished, _ctx: &mut Self::Context) {
        let Some(turn) = self.turn.as_mut() else {
            return;
        };
        if turn.awaiting_playout != Some(msg.speech) {
            return;
        }
        turn.awaiting_playout = None;
        if let Some(heard) = msg.heard {
            if let Some(ChatItem::Message(m)) = self
                .chat
                .items_mut()
                .iter_mut()
                .rev()
                .find(|i| matches!(i, ChatItem::Message(m) if m.role == ChatRole::Assistant))
            {
                m.content = heard;
            }
        }
        if let Some(outcome) = turn.finished.take() {
            self.finish_turn(outcome);
        }
    }
}

/// Asks for a copy of the chat context (for the host or a test).
pub(crate) struct GetChat;

impl Message for GetChat {
    type Result = Option<ChatContext>;
}

impl Handler<GetChat> for ActivityActor {
    type Result = Option<ChatContext>;

    fn handle(&mut self, _msg: GetChat, _ctx: &mut Self::Context) -> Self::Result {
        Some(self.chat.clone())
    }
}

counted_handlers!(
    ActivityActor: StartActivity,
    StartTurn,
    InsertToolItems,
    AppendItems,
    PauseActivity,
    ResumeActivity,
    CloseActivity,
    PlayoutFinished,
    GetChat,
);
