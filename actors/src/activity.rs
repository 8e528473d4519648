//! `ActivityActor`: one activation of an agent in a session.
//!
//! - **Owns:** the agent's chat context and its step ledger (`activity/ledger.rs`), its
//!   agent-scoped toolsets (a `ToolsetActor` for the bare tools, `tools`, and one per
//!   agent toolset) and the LLM turn loop (`activity/turn.rs`).
//! - **Parent:** the session. Sends it nothing but replies; its hooks reach the session
//!   only through `SessionControl` (narrow links that queue work). Talks to toolsets (its
//!   own and the session's) with `RunTool`, `InterruptStep`, `ListRuns`, `CancelRun`.
//! - **Starts** on `StartActivity` (runs `on_enter`); **pauses** on `PauseActivity` (a
//!   sub-task agent runs) and **resumes** on `ResumeActivity`; **stops** on
//!   `CloseActivity` (runs `on_exit`, stops its toolsets).
//! - **Handles:** `StartActivity`, `StartTurn`, `InterruptTurn`, `InterruptSpeech`,
//!   `UserStartedSpeaking`, `UserStoppedSpeaking`, `UserWords`, `InsertToolItems`,
//!   `AppendItems`, `PauseActivity`, `ResumeActivity`, `CloseActivity`,
//!   `PlayoutFinished`, `GetChat`, `ReadHistoryEntry`.
//! - **Records** its final chat context in the session's history when it stops.
//!
//! Guarantees, each tested:
//! - Every function call in the chat context has exactly one output after it, whatever
//!   happens (cancel, error, handoff, pause, interruption, close): the ledger's rules.
//! - A call's later items (`/update_n`, `/finished`) are held until its step's pairs are
//!   in the chat context.
//! - When `PauseActivity` or `CloseActivity` answers, every tool run of its own toolsets
//!   (but the one awaiting a sub-task, on pause) has stopped and been dropped.
//! - Once paused or closed, it accepts no tool items: they are refused, never redirected.
//! - A panic in a hook or the LLM adapter, a stalled or failing model stream, fails the
//!   turn with an error event; the activity takes the next turn.
//! - Every assistant message knows its speech; a playout report cuts that message to what
//!   was heard, and a speech nobody heard leaves no message.
//! - A barge-in over an interruptible turn pauses a pausable output at once, interrupts
//!   after the minimum duration or a transcript, and resumes after a false interruption.

mod barge_in;
mod companions;
mod ledger;
mod speaking;
mod turn;

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use actix::prelude::*;
use futures_util::FutureExt;
use serde_json::Value;
use tokio::sync::oneshot;

use crate::agent::{effective_policy, Agent, Hook, HookContext};
use crate::chat::{ChatContext, ChatItem};
use crate::control::SessionControl;
use crate::error::{SessionError, UpdateError};
use crate::events::{AgentState, SessionEvent};
use crate::handoff::Handoff;
use crate::history::{AgentChat, SubTaskOf};
use crate::ids::ActorId;
use crate::lifecycle::{alive_pair, stop_all, AliveToken, Child};
use crate::llm::{Llm, LlmTimeouts, ToolSchema};
use crate::mailbox::{counted_handlers, plain_response, Mailbox, Probe};
use crate::outcome::panic_message;
use crate::output::SpeechId;
use crate::prompts::Prompts;
use crate::reentry;
use crate::session::{PendingItem, Scope, SessionLinks, SessionToolset};
use crate::shared::SessionShared;
use crate::speech::SpeechHandle;
use crate::tool::DuplicatePolicy;
use crate::toolset::{StopRuns, StopToolset, ToolsetActor};

use barge_in::{BargeIn, BargeInRules};
use ledger::{ItemsWaiter, Ledger, Sink};
use turn::Turn;

/// What a finished turn reports to the session.
#[derive(Debug, Default)]
pub(crate) struct TurnOutcome {
    pub(crate) events: Vec<ChatItem>,
    pub(crate) handoff: Option<Handoff>,
    pub(crate) task_result: Option<Value>,
    pub(crate) failure: Option<SessionError>,
    pub(crate) interrupted: bool,
}

impl TurnOutcome {
    pub(crate) fn failed(failure: SessionError) -> Self {
        Self {
            failure: Some(failure),
            ..Self::default()
        }
    }
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
    /// A text the agent says as it is (`Session::say`).
    Say {
        text: String,
        speech: SpeechHandle,
        add_to_chat: bool,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    Starting,
    Active,
    Paused,
    Closed,
}

/// An activation's place in the session's history.
#[derive(Clone, Debug)]
struct HistoryPlace {
    /// Its place in start order.
    order: u32,
    /// How many items it was given at start.
    inherited: usize,
    sub_task_of: Option<SubTaskOf>,
}

/// Everything an activity is started with.
pub(crate) struct ActivitySpec {
    pub(crate) agent: Agent,
    /// The model, already resolved (the agent's or the session's).
    pub(crate) llm: Arc<dyn Llm>,
    pub(crate) generation: u32,
    /// Whether it runs as a sub-task (only a sub-task may complete a task).
    pub(crate) is_task: bool,
    pub(crate) shared: Arc<SessionShared>,
    pub(crate) links: Arc<SessionLinks>,
    pub(crate) session_toolsets: Arc<[SessionToolset]>,
}

pub(crate) struct ActivityActor {
    probe: Arc<Probe>,
    agent: Agent,
    llm: Arc<dyn Llm>,
    timeouts: LlmTimeouts,
    is_task: bool,
    shared: Arc<SessionShared>,
    links: Arc<SessionLinks>,
    ledger: Ledger,
    session_toolsets: Arc<[SessionToolset]>,
    own_toolsets: Vec<Child<ToolsetActor>>,
    /// Tool name → toolset that runs it.
    routes: HashMap<String, Mailbox<ToolsetActor>>,
    schemas: Arc<[ToolSchema]>,
    turn: Option<Turn>,
    /// Chat length the latest assistant message was generated from.
    last_reply_view: usize,
    status: Status,
    /// Whether `get_running_tasks` and `cancel_task` are exposed.
    companions: bool,
    generation: u32,
    /// Whether its turns may be interrupted, unless a `say` says otherwise (agent's
    /// setting, else the session's).
    allow_interruptions: bool,
    barge_in: BargeIn,
    barge_rules: BargeInRules,
    barge_timer: Option<SpawnHandle>,
    /// Where this activation goes in the session's history: set when it starts (one
    /// spawned but never started is no part of the conversation).
    history_place: Option<HistoryPlace>,
    _alive: AliveToken,
}

impl ActivityActor {
    /// Starts an activity actor (idle until `StartActivity`) on the current arbiter.
    pub(crate) fn spawn(spec: ActivitySpec) -> Child<ActivityActor> {
        let probe = Probe::new(
            ActorId::activity(&spec.shared.id, spec.agent.name(), spec.generation),
            spec.shared.journal.clone(),
        );
        let (alive, gone) = alive_pair();
        let companions = spec.shared.exposes_companions(&spec.agent);
        let timeouts = spec
            .agent
            .def
            .llm_timeouts
            .unwrap_or(spec.shared.config.llm_timeouts);
        let allow_interruptions = spec
            .agent
            .def
            .allow_interruptions
            .unwrap_or(spec.shared.config.allow_interruptions);
        let barge_rules = BargeInRules {
            min_duration: spec.shared.config.min_interruption_duration,
            false_timeout: spec.shared.config.false_interruption_timeout,
        };
        let actor = ActivityActor {
            probe: probe.clone(),
            agent: spec.agent,
            llm: spec.llm,
            timeouts,
            is_task: spec.is_task,
            shared: spec.shared,
            links: spec.links,
            ledger: Ledger::default(),
            session_toolsets: spec.session_toolsets,
            own_toolsets: Vec::new(),
            routes: HashMap::new(),
            schemas: Arc::from(Vec::new()),
            turn: None,
            last_reply_view: 0,
            status: Status::Starting,
            companions,
            generation: spec.generation,
            allow_interruptions,
            barge_in: BargeIn::Quiet,
            barge_rules,
            barge_timer: None,
            history_place: None,
            _alive: alive,
        };
        Child::new(Mailbox::new(actor.start(), probe), gone)
    }

    fn id(&self) -> &ActorId {
        self.probe.id()
    }

    fn agent_name(&self) -> String {
        self.agent.name().to_owned()
    }

    /// This activation's entry in the session's history, with its chat context now.
    fn history_entry(&self, place: &HistoryPlace, live: bool) -> AgentChat {
        AgentChat {
            agent: self.agent_name(),
            activity: self.id().clone(),
            chat: self.ledger.chat().clone(),
            inherited: place.inherited,
            live,
            sub_task_of: place.sub_task_of.clone(),
        }
    }

    fn set_state(&self, state: AgentState) {
        self.shared.set_agent_state(self.agent.name(), state);
    }

    /// Runs `f` on the ledger with a sink that emits each appended item and, when
    /// `in_turn`, adds it to the running turn's events.
    fn with_ledger<R>(&mut self, in_turn: bool, f: impl FnOnce(&mut Ledger, Sink<'_>) -> R) -> R {
        let shared = &self.shared;
        let agent = &self.agent;
        let turn = &mut self.turn;
        let mut sink = |item: &ChatItem| {
            shared.emit_with(|| SessionEvent::ConversationItemAdded {
                agent: agent.name().to_owned(),
                item: item.clone(),
            });
            if in_turn {
                if let Some(turn) = turn.as_mut() {
                    turn.events.push(item.clone());
                }
            }
        };
        f(&mut self.ledger, &mut sink)
    }

    /// Appends an item that belongs to the running turn (a message).
    fn record(&mut self, item: ChatItem) {
        self.with_ledger(true, |ledger, sink| ledger.append(item, sink));
    }

    /// Runs a lifecycle hook: marked as engine code of this session (so a host call made
    /// from it fails instead of waiting on itself) and with its panics caught.
    fn run_hook(
        &self,
        hook: Option<Hook>,
        which: &'static str,
    ) -> impl std::future::Future<Output = ()> + 'static {
        // Built only when there is a hook: most agents have none.
        let call = hook.map(|hook| {
            let ctx = HookContext {
                session: SessionControl::new(
                    self.shared.id.clone(),
                    self.id().clone(),
                    self.links.clone(),
                    self.shared.userdata.clone(),
                ),
                agent: self.agent.def.name.clone(),
            };
            // The hook's closure runs here, in the handler: its panic is caught too.
            let made = std::panic::catch_unwind(AssertUnwindSafe(|| hook(ctx)));
            (made, self.shared.clone(), self.agent_name())
        });
        async move {
            let Some((made, shared, agent)) = call else {
                return;
            };
            let outcome = match made {
                Ok(run) => {
                    reentry::inside(shared.id.clone(), AssertUnwindSafe(run).catch_unwind()).await
                }
                Err(panic) => Err(panic),
            };
            if let Err(panic) = outcome {
                let message = format!(
                    "{which} hook of {agent} panicked: {}",
                    panic_message(&*panic)
                );
                tracing::error!(session = %shared.id, %agent, "{message}");
                shared.emit(SessionEvent::Error { message });
            }
        }
    }

    /// Spawns the agent's own toolsets and computes the tool schemas (stable order:
    /// bare tools, agent toolsets, session toolsets, companions).
    fn start_toolsets(&mut self) {
        let scope = Scope::Activity(self.id().clone());
        let mut schemas = Vec::new();
        type Group = (String, Vec<(crate::tool::Tool, DuplicatePolicy)>, Prompts);
        let mut groups: Vec<Group> = Vec::new();
        let agent_prompts = self.agent.def.prompts.or(&self.shared.prompts);
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
            let child = ToolsetActor::spawn(
                ActorId::agent_toolset(&self.shared.id, self.agent.name(), self.generation, &name),
                scope.clone(),
                tools,
                prompts,
                self.shared.clone(),
                self.links.clone(),
            );
            for tool in names {
                self.routes.insert(tool, child.mailbox.clone());
            }
            self.own_toolsets.push(child);
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
            .map(|ts| ts.mailbox.clone())
            .chain(self.session_toolsets.iter().map(|ts| ts.mailbox.clone()))
            .collect()
    }
}

impl Actor for ActivityActor {
    type Context = Context<Self>;

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        self.status = Status::Closed;
        self.ledger.refuse_held();
        // Recorded here, whoever stopped it (a handoff, the end of a task, the session's
        // close, or several of them racing): the session reads the book once every
        // activity is gone, so no final chat context depends on whose reply arrived.
        if let Some(place) = self.history_place.take() {
            self.shared
                .record_history(place.order, self.history_entry(&place, false));
        }
        self.probe.stopped();
    }
}

/// Sent by the session once, right after it spawned the activity: starts the agent's
/// toolsets and runs `on_enter`. The reply comes after `on_enter` returned.
pub(crate) struct StartActivity {
    /// The chat context to start from (inherited from the previous agent, or empty).
    pub(crate) chat: ChatContext,
    /// Its place among the session's activations, for the history.
    pub(crate) order: u32,
    /// The sub-task it runs in, if any, for the history.
    pub(crate) sub_task_of: Option<SubTaskOf>,
    /// The agent this one takes over from, recorded as a handoff item.
    pub(crate) handoff_from: Option<String>,
}

impl Message for StartActivity {
    type Result = ();
}

impl Handler<StartActivity> for ActivityActor {
    type Result = ResponseActFuture<Self, ()>;

    fn handle(&mut self, msg: StartActivity, _ctx: &mut Self::Context) -> Self::Result {
        self.history_place = Some(HistoryPlace {
            order: msg.order,
            inherited: msg.chat.len(),
            sub_task_of: msg.sub_task_of,
        });
        self.shared.emit_with(|| SessionEvent::ChatContextSet {
            agent: self.agent_name(),
            chat: msg.chat.clone(),
        });
        self.ledger = Ledger::new(msg.chat);
        if let Some(from) = msg.handoff_from {
            let item = ChatItem::AgentHandoff {
                from: Some(from),
                to: self.agent_name(),
            };
            self.with_ledger(false, |ledger, sink| ledger.append(item, sink));
        }
        self.start_toolsets();
        self.set_state(AgentState::Initializing);
        let hook = self.run_hook(self.agent.def.on_enter.clone(), "on_enter");
        Box::pin(hook.into_actor(self).map(|(), act, _| {
            if act.status == Status::Starting {
                act.status = Status::Active;
            }
            act.set_state(AgentState::Listening);
        }))
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
        if self.turn.is_some() || self.status != Status::Active {
            return Box::pin(async { TurnOutcome::failed(SessionError::Closed) });
        }
        let (tx, rx) = oneshot::channel();
        self.begin_turn(msg.kind, tx, ctx);
        Box::pin(async move {
            rx.await
                .unwrap_or_else(|_| TurnOutcome::failed(SessionError::Closed))
        })
    }
}

/// Sent by the session to stop the running turn now (`Session::interrupt`, a preempting
/// handoff, a dropped `run` future, a user turn): the LLM stream is dropped, the output
/// told to stop, no further step runs, and each call of the open step gets its output (a
/// call that cancels on interruption is cancelled, the others move to the background).
/// Refused (`Uninterruptible`) when the turn does not allow interruptions and `force` is
/// not set. The reply comes once the turn ended (at once when none runs).
pub(crate) struct InterruptTurn {
    pub(crate) force: bool,
}

impl Message for InterruptTurn {
    type Result = Result<(), SessionError>;
}

impl Handler<InterruptTurn> for ActivityActor {
    type Result = ResponseFuture<Result<(), SessionError>>;

    fn handle(&mut self, msg: InterruptTurn, ctx: &mut Self::Context) -> Self::Result {
        let ended = self.interrupt(msg.force, ctx);
        Box::pin(async move {
            if let Some(ended) = ended? {
                let _ = ended.await;
            }
            Ok(())
        })
    }
}

/// Sent by the session for `SpeechHandle::interrupt`: the running turn stops if the
/// speech is one of its own.
pub(crate) struct InterruptSpeech {
    pub(crate) speech: SpeechId,
    pub(crate) force: bool,
}

impl Message for InterruptSpeech {
    type Result = ();
}

impl Handler<InterruptSpeech> for ActivityActor {
    type Result = ();

    fn handle(&mut self, msg: InterruptSpeech, ctx: &mut Self::Context) {
        self.interrupt_speech(msg.speech, msg.force, ctx);
    }
}

/// Forwarded host input: the user started speaking. Over an interruptible turn this
/// starts a barge-in (the output pauses if it can).
pub(crate) struct UserStartedSpeaking;

impl Message for UserStartedSpeaking {
    type Result = ();
}

impl Handler<UserStartedSpeaking> for ActivityActor {
    type Result = ();

    fn handle(&mut self, _msg: UserStartedSpeaking, ctx: &mut Self::Context) {
        self.user_started(ctx);
    }
}

/// Forwarded host input: the user stopped speaking.
pub(crate) struct UserStoppedSpeaking;

impl Message for UserStoppedSpeaking {
    type Result = ();
}

impl Handler<UserStoppedSpeaking> for ActivityActor {
    type Result = ();

    fn handle(&mut self, _msg: UserStoppedSpeaking, ctx: &mut Self::Context) {
        self.user_stopped(ctx);
    }
}

/// Forwarded host input: a transcript with words (interim or final) arrived, which makes
/// a barge-in under way a real interruption.
pub(crate) struct UserWords;

impl Message for UserWords {
    type Result = ();
}

impl Handler<UserWords> for ActivityActor {
    type Result = ();

    fn handle(&mut self, _msg: UserWords, ctx: &mut Self::Context) {
        self.user_words(ctx);
    }
}

/// Sent by the session to deliver a tool's later items (`/update_n`, `/finished`) to this
/// agent's chat context. Held while the call's own step is not yet in the chat context;
/// refused when the activity is paused or closed. `inserted` hears once the items are in
/// (dropped unanswered if this activity stops with the message queued).
pub(crate) struct InsertToolItems {
    pub(crate) base_call_id: String,
    pub(crate) items: Vec<ChatItem>,
    pub(crate) inserted: ItemsWaiter,
}

impl Message for InsertToolItems {
    type Result = ();
}

impl Handler<InsertToolItems> for ActivityActor {
    type Result = ();

    fn handle(&mut self, msg: InsertToolItems, _ctx: &mut Self::Context) {
        if !matches!(self.status, Status::Active | Status::Starting) {
            let _ = msg.inserted.send(Err(UpdateError::ScopeClosed {
                call_id: msg.base_call_id,
            }));
            return;
        }
        self.with_ledger(false, |ledger, sink| {
            ledger.insert(&msg.base_call_id, msg.items, Some(msg.inserted), sink)
        });
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
        self.with_ledger(false, |ledger, sink| {
            for item in msg.items {
                ledger.append(item, sink);
            }
        });
    }
}

/// Sent by the session before a sub-task agent starts: stops the runs of this agent's
/// toolsets (all but `exempt`, the run awaiting the sub-task) and awaits them. The turn
/// in progress stays open and goes on after `ResumeActivity` (a turn still generating
/// text is interrupted: its speech stops where it was).
pub(crate) struct PauseActivity {
    pub(crate) exempt: Option<u64>,
}

/// The reply is the chat context once paused: its length is where the sub-task's items go
/// in the call's transcript, and a sub-task agent may start from it.
impl Message for PauseActivity {
    type Result = ChatContext;
}

impl Handler<PauseActivity> for ActivityActor {
    type Result = ResponseActFuture<Self, ChatContext>;

    fn handle(&mut self, msg: PauseActivity, ctx: &mut Self::Context) -> Self::Result {
        self.stop_generation_for_pause(ctx);
        self.status = Status::Paused;
        self.ledger.refuse_held();
        let reason: Arc<str> = Arc::from("the agent was paused for a sub-task");
        let stops: Vec<_> = self
            .own_toolsets
            .iter()
            .map(|ts| {
                ts.mailbox.ask(
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
                act.with_ledger(false, |ledger, sink| {
                    ledger.write_terminal(calls, &reason, sink)
                });
                act.ledger.chat().clone()
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
/// final chat context, sent once every tool actor of this activity is gone. A second
/// `CloseActivity` (a session closing during a handoff) gets the same context.
pub(crate) struct CloseActivity {
    pub(crate) reason: Arc<str>,
}

impl Message for CloseActivity {
    type Result = ChatContext;
}

impl Handler<CloseActivity> for ActivityActor {
    type Result = ResponseActFuture<Self, ChatContext>;

    fn handle(&mut self, msg: CloseActivity, ctx: &mut Self::Context) -> Self::Result {
        let was_open = self.status != Status::Closed;
        self.status = Status::Closed;
        self.stop_generation_for_close(ctx);
        self.ledger.refuse_held();
        let hook = self.run_hook(
            was_open.then(|| self.agent.def.on_exit.clone()).flatten(),
            "on_exit",
        );
        let reason = msg.reason;
        Box::pin(
            hook.into_actor(self)
                .then(move |(), act, _| {
                    let each = reason.clone();
                    let stops = stop_all(act.own_toolsets.clone(), act.probe.id(), move || {
                        StopToolset {
                            reason: each.clone(),
                        }
                    });
                    async move { (stops.await, reason) }.into_actor(act)
                })
                .map(|(results, reason), act, ctx| {
                    let calls = results.into_iter().flatten().flatten().collect();
                    act.with_ledger(true, |ledger, sink| {
                        ledger.abort(&reason, sink);
                        ledger.write_terminal(calls, &reason, sink);
                    });
                    act.finish_turn_now(TurnOutcome::failed(SessionError::Closed));
                    ctx.stop();
                    act.ledger.chat().clone()
                }),
        )
    }
}

/// Forwarded from the output's `PlayoutReporter`: a speech's playout ended, in full or
/// cut short with what was heard. Accepted for any speech at any time.
pub(crate) struct PlayoutFinished {
    pub(crate) speech: SpeechId,
    pub(crate) interrupted: bool,
    pub(crate) heard: Option<String>,
}

impl Message for PlayoutFinished {
    type Result = ();
}

impl Handler<PlayoutFinished> for ActivityActor {
    type Result = ();

    fn handle(&mut self, msg: PlayoutFinished, ctx: &mut Self::Context) {
        self.playout_finished(msg.speech, msg.interrupted, msg.heard, ctx);
    }
}

/// Asks for a copy of the chat context (for the host or a test).
pub(crate) struct GetChat;

impl Message for GetChat {
    type Result = ChatContext;
}

plain_response!(ChatContext);

impl Handler<GetChat> for ActivityActor {
    type Result = ChatContext;

    fn handle(&mut self, _msg: GetChat, _ctx: &mut Self::Context) -> Self::Result {
        self.ledger.chat().clone()
    }
}

/// Asks for this activation's history entry as it is now (none before it started).
pub(crate) struct ReadHistoryEntry;

impl Message for ReadHistoryEntry {
    type Result = LiveEntry;
}

/// A running activation's history entry and its place in start order.
pub(crate) struct LiveEntry(pub(crate) Option<(u32, AgentChat)>);

plain_response!(LiveEntry);

impl Handler<ReadHistoryEntry> for ActivityActor {
    type Result = LiveEntry;

    fn handle(&mut self, _msg: ReadHistoryEntry, _ctx: &mut Self::Context) -> Self::Result {
        LiveEntry(
            self.history_place
                .as_ref()
                .map(|place| (place.order, self.history_entry(place, true))),
        )
    }
}

counted_handlers!(
    ActivityActor: StartActivity,
    StartTurn,
    InterruptTurn,
    InterruptSpeech,
    UserStartedSpeaking,
    UserStoppedSpeaking,
    UserWords,
    InsertToolItems,
    AppendItems,
    PauseActivity,
    ResumeActivity,
    CloseActivity,
    PlayoutFinished,
    GetChat,
    ReadHistoryEntry,
);
