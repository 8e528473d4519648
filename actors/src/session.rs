//! `SessionActor`: one conversation with one user.
//!
//! - **Owns:** the session-scoped toolsets, which agent is current (its activity), the
//!   stack of activities paused for sub-tasks, the queue of turns and handoffs, and the
//!   one pending deferred reply of the session.
//! - **Parent of:** every activity and session-scoped `ToolsetActor`.
//! - **Starts** with `Session::builder().start(..)` (`StartSession`); **stops** on
//!   `CloseSession` once all its children are gone.
//! - **Handles:** `StartSession`, `RunTurn`, `QueueReply`, `Handoff`, `RunTask`,
//!   `CompleteTask`, `DeliverToolItems`, `SpeechPlayedOut`, `ReadChat`, `ReadAgent`, `CloseSession`.
//!
//! Guarantees, each tested:
//! - Turns run one at a time per activity, in the order they were asked for; a handoff
//!   waits for the turn before it (it runs "after the current speech").
//! - During a handoff (old `on_exit`, close, new `on_enter`) tool items wait, then go to
//!   the incoming agent; items of an agent-scoped run go only to their own activity.
//! - Tool items arriving while a deferred reply is pending join that one reply; the
//!   reply is asked for only when the session is inactive.
//! - After `CloseSession` answers, no actor of the session is alive.

mod switch;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use actix::prelude::*;
use serde_json::Value;
use tokio::sync::oneshot;

use crate::activity::{
    ActivityActor, AppendItems, CloseActivity, GetChat, PlayoutFinished, StartTurn, TurnKind,
    TurnOutcome,
};
use crate::agent::Agent;
use crate::chat::{ChatContext, ChatItem, FunctionCall};
use crate::error::{SessionError, TaskError, UpdateError};
use crate::events::{RunResult, SessionEvent};
use crate::ids::ActorId;
use crate::io::SpeechId;
use crate::lifecycle::{wait_all, AliveToken, AliveWaiter};
use crate::llm::ToolSchema;
use crate::mailbox::{counted_handlers, Mailbox, Probe};
use crate::outcome::terminal_pair;
use crate::session_handle::Session;
use crate::shared::SessionShared;
use crate::tool::{Tool, Toolset};
use crate::toolset::{StopToolset, ToolsetActor};

/// Which scope a tool run belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Scope {
    /// A session-scoped toolset: items go to the agent current at delivery time.
    Session,
    /// An agent-scoped toolset of this activity: items go only there.
    Activity(ActorId),
}

/// A tool output waiting for the deferred reply.
#[derive(Clone, Debug)]
pub(crate) struct PendingItem {
    pub(crate) scope: Scope,
    /// The output's call id (`{id}/update_n` or `{id}/finished`).
    pub(crate) call_id: String,
    pub(crate) items: Arc<[ChatItem]>,
}

/// A session-scoped toolset as activities see it.
pub(crate) struct SessionToolset {
    pub(crate) name: String,
    pub(crate) tools: Vec<Tool>,
    pub(crate) schemas: Vec<ToolSchema>,
    pub(crate) mailbox: Mailbox<ToolsetActor>,
}

struct ActivityRef {
    mailbox: Mailbox<ActivityActor>,
    agent: Agent,
    waiter: Option<AliveWaiter>,
}

impl ActivityRef {
    fn id(&self) -> &ActorId {
        self.mailbox.id()
    }
}

struct PausedActivity {
    activity: ActivityRef,
    result: oneshot::Sender<Result<Value, TaskError>>,
}

type Reply<T> = oneshot::Sender<Result<T, SessionError>>;
type TaskReply = oneshot::Sender<Result<Value, TaskError>>;

enum Job {
    Turn(TurnKind, Option<Reply<RunResult>>),
    Handoff(Handoff, Option<Reply<()>>),
    /// A background tool of the current sub-task agent completed it.
    EndTask(Value),
}

struct Delivery {
    scope: Scope,
    base_call_id: String,
    items: Vec<ChatItem>,
    reply: bool,
    done: oneshot::Sender<Result<(), UpdateError>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Starting,
    Running,
    /// A handoff or sub-task switch is under way: tool items and jobs wait.
    Switching,
    Closing,
}

pub(crate) struct SessionActor {
    probe: Arc<Probe>,
    shared: Arc<SessionShared>,
    handle: Option<Session>,
    first_agent: Option<Agent>,
    toolset_defs: Vec<Toolset>,
    toolsets: Arc<[SessionToolset]>,
    toolset_waiters: Vec<AliveWaiter>,
    current: Option<ActivityRef>,
    paused: Vec<PausedActivity>,
    generations: HashMap<String, u32>,
    phase: Phase,
    jobs: VecDeque<Job>,
    /// Activities with a turn in flight.
    busy: Vec<ActorId>,
    waiting: Vec<Delivery>,
    tasks_waiting: Vec<(Agent, Option<u64>, TaskReply)>,
    pending: Vec<PendingItem>,
    _alive: AliveToken,
}

impl SessionActor {
    pub(crate) fn new(
        shared: Arc<SessionShared>,
        probe: Arc<Probe>,
        first_agent: Agent,
        toolsets: Vec<Toolset>,
        alive: AliveToken,
    ) -> Self {
        Self {
            probe,
            shared,
            handle: None,
            first_agent: Some(first_agent),
            toolset_defs: toolsets,
            toolsets: Arc::from(Vec::new()),
            toolset_waiters: Vec::new(),
            current: None,
            paused: Vec::new(),
            generations: HashMap::new(),
            phase: Phase::Starting,
            jobs: VecDeque::new(),
            busy: Vec::new(),
            waiting: Vec::new(),
            tasks_waiting: Vec::new(),
            pending: Vec::new(),
            _alive: alive,
        }
    }

    fn id(&self) -> ActorId {
        self.probe.id().clone()
    }

    fn session(&self) -> Option<Session> {
        self.handle.clone()
    }

    fn set_inactive(&self, inactive: bool) {
        self.shared.inactive.send_if_modified(|v| {
            let changed = *v != inactive;
            *v = inactive;
            changed
        });
    }

    /// Spawns an activity of `agent` with its next generation number.
    fn spawn_activity(&mut self, agent: Agent) -> Result<ActivityRef, SessionError> {
        let session = self.session().ok_or(SessionError::Closed)?;
        let generation = self.generations.entry(agent.name().to_owned()).or_insert(0);
        *generation += 1;
        let (mailbox, waiter) =
            ActivityActor::spawn(agent.clone(), *generation, session, self.toolsets.clone())?;
        Ok(ActivityRef {
            mailbox,
            agent,
            waiter: Some(waiter),
        })
    }

    /// Runs the next thing due: a queued job, or the deferred reply, or nothing (then the
    /// session is inactive).
    fn pump(&mut self, ctx: &mut Context<Self>) {
        if self.phase != Phase::Running {
            return;
        }
        if !self.tasks_waiting.is_empty() {
            let (agent, exempt, result) = self.tasks_waiting.remove(0);
            self.start_task(agent, exempt, result, ctx);
            return;
        }
        let Some(current) = self.current.as_ref() else {
            return;
        };
        if self.busy.contains(current.id()) {
            self.set_inactive(false);
            return;
        }
        match self.jobs.pop_front() {
            Some(Job::Turn(kind, reply)) => self.dispatch_turn(kind, reply, ctx),
            Some(Job::Handoff(handoff, reply)) => self.start_handoff(handoff, reply, ctx),
            Some(Job::EndTask(value)) if !self.paused.is_empty() => self.end_task(value, ctx),
            Some(Job::EndTask(_)) => {
                tracing::warn!("a tool completed a task, but no sub-task is running");
                self.pump(ctx);
            }
            None if !self.pending.is_empty() => {
                let pending = std::mem::take(&mut self.pending);
                self.dispatch_turn(TurnKind::Deferred(pending), None, ctx);
            }
            // A turn still open in an activity paused for a sub-task does not make the
            // session active: the sub-task's agent is listening.
            None => self.set_inactive(true),
        }
    }

    fn dispatch_turn(
        &mut self,
        kind: TurnKind,
        reply: Option<Reply<RunResult>>,
        ctx: &mut Context<Self>,
    ) {
        let Some(current) = self.current.as_ref() else {
            return;
        };
        self.set_inactive(false);
        let activity = current.id().clone();
        self.busy.push(activity.clone());
        let ask = current.mailbox.ask(self.probe.id(), StartTurn { kind });
        ctx.spawn(ask.into_actor(self).map(move |outcome, act, ctx| {
            let outcome = outcome.unwrap_or(TurnOutcome {
                failure: Some(SessionError::Closed),
                ..Default::default()
            });
            act.turn_done(activity, outcome, reply, ctx);
        }));
    }

    fn turn_done(
        &mut self,
        activity: ActorId,
        outcome: TurnOutcome,
        reply: Option<Reply<RunResult>>,
        ctx: &mut Context<Self>,
    ) {
        self.busy.retain(|id| *id != activity);
        let result = RunResult {
            events: outcome.events,
        };
        // A failed turn (a propagated tool error) still performs the handoff or task end
        // it asked for: a handoff is never dropped because another call failed.
        let failure = outcome.failure;
        let answer = move |reply: Option<Reply<RunResult>>,
                           result: Result<RunResult, SessionError>| {
            if let Some(reply) = reply {
                let _ = reply.send(result);
            }
        };
        if self.phase == Phase::Closing {
            answer(reply, Err(failure.unwrap_or(SessionError::Closed)));
            return;
        }
        if let Some(handoff) = outcome.handoff {
            // The handoff runs now, before anything queued: the reply waits for it.
            let from = self
                .current
                .as_ref()
                .map(|c| c.agent.name().to_owned())
                .unwrap_or_default();
            let (tx, rx) = oneshot::channel();
            self.start_handoff(handoff, Some(tx), ctx);
            ctx.spawn(
                async move {
                    let handed = rx.await.unwrap_or(Err(SessionError::Closed));
                    (handed, result)
                }
                .into_actor(self)
                .map(move |(handed, mut result), act, _| {
                    if let (Ok(()), Some(current)) = (&handed, act.current.as_ref()) {
                        result.events.push(ChatItem::AgentHandoff {
                            from: Some(from),
                            to: current.agent.name().to_owned(),
                        });
                    }
                    let result = match failure {
                        Some(failure) => Err(failure),
                        None => handed.map(|()| result),
                    };
                    answer(reply, result);
                }),
            );
            return;
        }
        if let Some(value) = outcome.task_result {
            self.end_task(value, ctx);
            answer(reply, failure.map_or(Ok(result), Err));
            return;
        }
        answer(reply, failure.map_or(Ok(result), Err));
        self.pump(ctx);
    }

    fn deliver(&mut self, delivery: Delivery, ctx: &mut Context<Self>) {
        let target = match (&delivery.scope, self.current.as_ref()) {
            (_, None) => None,
            (Scope::Session, Some(current)) => Some(current),
            (Scope::Activity(owner), Some(current)) if owner == current.id() => Some(current),
            (Scope::Activity(_), Some(_)) => None,
        };
        let Some(target) = target else {
            let _ = delivery.done.send(Err(UpdateError::ScopeClosed {
                call_id: delivery.base_call_id,
            }));
            return;
        };
        let output_id = delivery.items.iter().rev().find_map(|i| match i {
            ChatItem::FunctionCallOutput(o) => Some(o.call_id.clone()),
            _ => None,
        });
        let pending = match (delivery.reply, output_id) {
            (true, Some(call_id)) => Some(PendingItem {
                scope: delivery.scope.clone(),
                call_id,
                items: Arc::from(delivery.items.clone()),
            }),
            _ => None,
        };
        let insert = target.mailbox.ask(
            self.probe.id(),
            crate::activity::InsertToolItems {
                base_call_id: delivery.base_call_id,
                items: delivery.items,
            },
        );
        let done = delivery.done;
        ctx.spawn(insert.into_actor(self).map(move |res, act, ctx| {
            let res = res.unwrap_or(Err(UpdateError::SessionClosed));
            if res.is_ok() {
                if let Some(item) = pending {
                    if act.phase != Phase::Closing {
                        act.pending.push(item);
                        act.set_inactive(false);
                    }
                }
            }
            let _ = done.send(res);
            act.pump(ctx);
        }));
    }

    fn flush_waiting(&mut self, ctx: &mut Context<Self>) {
        for delivery in std::mem::take(&mut self.waiting) {
            self.deliver(delivery, ctx);
        }
    }
}

impl Actor for SessionActor {
    type Context = Context<Self>;

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        self.probe.stopped();
    }
}

/// Sent by `SessionBuilder::start`: starts the session-scoped toolsets and the first
/// agent's activity (its `on_enter` included).
pub(crate) struct StartSession {
    pub(crate) handle: Session,
}

impl Message for StartSession {
    type Result = Result<(), SessionError>;
}

impl Handler<StartSession> for SessionActor {
    type Result = ResponseActFuture<Self, Result<(), SessionError>>;

    fn handle(&mut self, msg: StartSession, ctx: &mut Self::Context) -> Self::Result {
        self.handle = Some(msg.handle.clone());
        let mut toolsets = Vec::new();
        for def in std::mem::take(&mut self.toolset_defs) {
            let tools: Vec<_> = def
                .tools
                .iter()
                .map(|t| (t.clone(), crate::agent::effective_policy(t, &def)))
                .collect();
            let schemas = tools.iter().map(|(t, p)| t.schema(*p)).collect();
            let (mailbox, waiter) = ToolsetActor::spawn(
                ActorId::session_toolset(&self.shared.id, &def.name),
                Scope::Session,
                tools,
                def.prompts.or(&self.shared.prompts),
                msg.handle.clone(),
            );
            self.toolset_waiters.push(waiter);
            toolsets.push(SessionToolset {
                name: def.name.clone(),
                tools: def.tools.clone(),
                schemas,
                mailbox,
            });
        }
        self.toolsets = Arc::from(toolsets);
        let Some(agent) = self.first_agent.take() else {
            return Box::pin(fut::ready(Err(SessionError::Closed)));
        };
        let (tx, rx) = oneshot::channel();
        self.enter(agent, ChatContext::new(), None, ctx, move |_, res| {
            let _ = tx.send(res);
        });
        Box::pin(
            async move { rx.await.unwrap_or(Err(SessionError::Closed)) }
                .into_actor(self)
                .map(|res, act, ctx| {
                    if res.is_err() {
                        // Nothing runs without a first agent: stop what was started.
                        let me = act.id();
                        for toolset in act.toolsets.iter() {
                            toolset.mailbox.tell(
                                &me,
                                StopToolset {
                                    reason: Arc::from("the session did not start"),
                                },
                            );
                        }
                        act.phase = Phase::Closing;
                        ctx.stop();
                    }
                    res
                }),
        )
    }
}

/// Sent by the host (`Session::run`) with a user's message; the reply is the turn's
/// result, after any handoff it caused. One message and one reply per turn.
pub(crate) struct RunTurn {
    pub(crate) input: String,
}

impl Message for RunTurn {
    type Result = Result<RunResult, SessionError>;
}

impl Handler<RunTurn> for SessionActor {
    type Result = ResponseFuture<Result<RunResult, SessionError>>;

    fn handle(&mut self, msg: RunTurn, ctx: &mut Self::Context) -> Self::Result {
        self.queue_turn(TurnKind::User(msg.input), ctx)
    }
}

impl SessionActor {
    fn queue_turn(
        &mut self,
        kind: TurnKind,
        ctx: &mut Context<Self>,
    ) -> ResponseFuture<Result<RunResult, SessionError>> {
        if self.phase == Phase::Closing {
            return Box::pin(async { Err(SessionError::Closed) });
        }
        let (tx, rx) = oneshot::channel();
        self.jobs.push_back(Job::Turn(kind, Some(tx)));
        self.set_inactive(false);
        self.pump(ctx);
        Box::pin(async move { rx.await.unwrap_or(Err(SessionError::Closed)) })
    }
}

/// Sent by the host (`Session::generate_reply`) or a hook: asks the current agent for a
/// reply, with optional extra instructions.
pub(crate) struct QueueReply {
    pub(crate) instructions: Option<String>,
}

impl Message for QueueReply {
    type Result = Result<RunResult, SessionError>;
}

impl Handler<QueueReply> for SessionActor {
    type Result = ResponseFuture<Result<RunResult, SessionError>>;

    fn handle(&mut self, msg: QueueReply, ctx: &mut Self::Context) -> Self::Result {
        self.queue_turn(TurnKind::Reply(msg.instructions), ctx)
    }
}

/// Hands the conversation to another agent, after the current turn. Send it to the
/// session's address (`session.address().send(Handoff::to(agent))`), call
/// `Session::update_agent`, or return it from a tool. The reply comes once the new
/// agent's `on_enter` has run.
#[derive(Debug, Clone)]
pub struct Handoff {
    /// The agent to hand off to.
    pub agent: Agent,
    /// What the handing-off call's output says (default: `Transferred to <agent>.`).
    pub message: Option<String>,
}

impl Handoff {
    /// A handoff to `agent`.
    pub fn to(agent: Agent) -> Self {
        Self {
            agent,
            message: None,
        }
    }

    /// Sets the message the handing-off tool call returns to the model.
    pub fn with_message(mut self, message: impl Into<String>) -> Self {
        self.message = Some(message.into());
        self
    }
}

impl Message for Handoff {
    type Result = Result<(), SessionError>;
}

impl Handler<Handoff> for SessionActor {
    type Result = ResponseFuture<Result<(), SessionError>>;

    fn handle(&mut self, msg: Handoff, ctx: &mut Self::Context) -> Self::Result {
        if self.phase == Phase::Closing {
            return Box::pin(async { Err(SessionError::Closed) });
        }
        let (tx, rx) = oneshot::channel();
        self.jobs.push_back(Job::Handoff(msg, Some(tx)));
        self.set_inactive(false);
        self.pump(ctx);
        Box::pin(async move { rx.await.unwrap_or(Err(SessionError::Closed)) })
    }
}

/// Sent by a tool (`ctx.run_task`) or the host (`Session::run_task`): pauses the current
/// agent and runs `agent` until it completes with a result. Acts at once, even mid-turn:
/// the calling tool waits inside a turn.
pub(crate) struct RunTask {
    pub(crate) agent: Agent,
    pub(crate) exempt: Option<u64>,
}

impl Message for RunTask {
    type Result = Result<Value, TaskError>;
}

impl Handler<RunTask> for SessionActor {
    type Result = ResponseFuture<Result<Value, TaskError>>;

    fn handle(&mut self, msg: RunTask, ctx: &mut Self::Context) -> Self::Result {
        let (tx, rx) = oneshot::channel();
        match self.phase {
            Phase::Closing => {
                let _ = tx.send(Err(TaskError::SessionClosed));
            }
            Phase::Running => self.start_task(msg.agent, msg.exempt, tx, ctx),
            Phase::Starting | Phase::Switching => {
                self.tasks_waiting.push((msg.agent, msg.exempt, tx));
            }
        }
        Box::pin(async move { rx.await.unwrap_or(Err(TaskError::SessionClosed)) })
    }
}

/// Sent by a tool run whose body completed the current sub-task after it had sent
/// updates (in the background): ends the task once its agent's current turn is done.
pub(crate) struct CompleteTask {
    pub(crate) value: Value,
}

impl Message for CompleteTask {
    type Result = ();
}

impl Handler<CompleteTask> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: CompleteTask, ctx: &mut Self::Context) {
        if self.phase == Phase::Closing {
            return;
        }
        self.jobs.push_back(Job::EndTask(msg.value));
        self.set_inactive(false);
        self.pump(ctx);
    }
}

/// Sent by a tool run with its later items (`/update_n`, `/finished`). The reply comes
/// once they are in a chat context (or says why they never will be). Bounded: the run
/// awaits each reply before its next update.
pub(crate) struct DeliverToolItems {
    pub(crate) scope: Scope,
    pub(crate) base_call_id: String,
    pub(crate) items: Vec<ChatItem>,
    /// Whether the items call for a deferred reply.
    pub(crate) reply: bool,
}

impl Message for DeliverToolItems {
    type Result = Result<(), UpdateError>;
}

impl Handler<DeliverToolItems> for SessionActor {
    type Result = ResponseFuture<Result<(), UpdateError>>;

    fn handle(&mut self, msg: DeliverToolItems, ctx: &mut Self::Context) -> Self::Result {
        let (tx, rx) = oneshot::channel();
        let delivery = Delivery {
            scope: msg.scope,
            base_call_id: msg.base_call_id,
            items: msg.items,
            reply: msg.reply,
            done: tx,
        };
        match self.phase {
            Phase::Closing => {
                let _ = delivery.done.send(Err(UpdateError::SessionClosed));
            }
            // An agent-scoped run delivering mid-switch belongs to the activity being
            // closed or paused, which will never take items again: refuse at once rather
            // than hold the run (and so the switch waiting for it) until its grace period.
            Phase::Starting | Phase::Switching if matches!(delivery.scope, Scope::Activity(_)) => {
                let _ = delivery.done.send(Err(UpdateError::ScopeClosed {
                    call_id: delivery.base_call_id,
                }));
            }
            Phase::Starting | Phase::Switching => self.waiting.push(delivery),
            Phase::Running => self.deliver(delivery, ctx),
        }
        Box::pin(async move { rx.await.unwrap_or(Err(UpdateError::SessionClosed)) })
    }
}

/// Sent by the host when a speech's playout ended (voice I/O); forwarded to the current
/// activity.
pub(crate) struct SpeechPlayedOut {
    pub(crate) speech: SpeechId,
    pub(crate) heard: Option<String>,
}

impl Message for SpeechPlayedOut {
    type Result = ();
}

impl Handler<SpeechPlayedOut> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: SpeechPlayedOut, _ctx: &mut Self::Context) {
        if let Some(current) = &self.current {
            current.mailbox.tell(
                self.probe.id(),
                PlayoutFinished {
                    speech: msg.speech,
                    heard: msg.heard,
                },
            );
        }
    }
}

/// Asks for a copy of the current agent's chat context.
pub(crate) struct ReadChat;

impl Message for ReadChat {
    type Result = Result<ChatContext, SessionError>;
}

impl Handler<ReadChat> for SessionActor {
    type Result = ResponseFuture<Result<ChatContext, SessionError>>;

    fn handle(&mut self, _msg: ReadChat, _ctx: &mut Self::Context) -> Self::Result {
        let Some(current) = &self.current else {
            return Box::pin(async { Err(SessionError::Closed) });
        };
        let ask = current.mailbox.ask(self.probe.id(), GetChat);
        Box::pin(async move { ask.await?.ok_or(SessionError::Closed) })
    }
}

/// Asks for the current agent's name.
pub(crate) struct ReadAgent;

impl Message for ReadAgent {
    type Result = Option<String>;
}

impl Handler<ReadAgent> for SessionActor {
    type Result = Option<String>;

    fn handle(&mut self, _msg: ReadAgent, _ctx: &mut Self::Context) -> Option<String> {
        self.current.as_ref().map(|c| c.agent.name().to_owned())
    }
}

/// Sent by the host (`Session::close`): cancels every tool run (grace period included),
/// drops the pending reply, writes `session closed` outputs where a call has none, then
/// stops toolsets, activities and itself. The reply comes once all children are gone.
pub(crate) struct CloseSession;

impl Message for CloseSession {
    type Result = ();
}

impl Handler<CloseSession> for SessionActor {
    type Result = ResponseActFuture<Self, ()>;

    fn handle(&mut self, _msg: CloseSession, _ctx: &mut Self::Context) -> Self::Result {
        if self.phase == Phase::Closing {
            return Box::pin(fut::ready(()));
        }
        self.phase = Phase::Closing;
        self.pending.clear();
        for job in self.jobs.drain(..) {
            match job {
                Job::Turn(_, Some(reply)) => {
                    let _ = reply.send(Err(SessionError::Closed));
                }
                Job::Handoff(_, Some(reply)) => {
                    let _ = reply.send(Err(SessionError::Closed));
                }
                _ => {}
            }
        }
        for delivery in self.waiting.drain(..) {
            let _ = delivery.done.send(Err(UpdateError::SessionClosed));
        }
        for (_, _, result) in self.tasks_waiting.drain(..) {
            let _ = result.send(Err(TaskError::SessionClosed));
        }
        let reason: Arc<str> = Arc::from("the session closed");
        let me = self.id();
        // 1. Session-scoped runs: stop them and their toolsets.
        let stops: Vec<_> = self
            .toolsets
            .iter()
            .map(|ts| {
                ts.mailbox.ask(
                    &me,
                    StopToolset {
                        reason: reason.clone(),
                    },
                )
            })
            .collect();
        let toolset_waiters = std::mem::take(&mut self.toolset_waiters);
        Box::pin(
            async move {
                let background = futures_util::future::join_all(stops).await;
                wait_all(toolset_waiters).await;
                background
            }
            .into_actor(self)
            .then(move |background, act, _| {
                // 2. Their terminal outputs go to the current agent, then every activity
                //    closes (the current one and any paused for a sub-task).
                let calls: Vec<FunctionCall> = background.into_iter().flatten().flatten().collect();
                let mut activities: Vec<ActivityRef> = act.current.take().into_iter().collect();
                if let Some(current) = activities.first() {
                    let items = terminal_items(calls, &reason);
                    if !items.is_empty() {
                        current.mailbox.tell(&me, AppendItems { items });
                    }
                }
                for paused in act.paused.drain(..).rev() {
                    let _ = paused.result.send(Err(TaskError::SessionClosed));
                    activities.push(paused.activity);
                }
                let mut closes = Vec::new();
                let mut waiters = Vec::new();
                for mut activity in activities {
                    closes.push(activity.mailbox.ask(
                        &me,
                        CloseActivity {
                            reason: reason.clone(),
                        },
                    ));
                    waiters.extend(activity.waiter.take());
                }
                async move {
                    futures_util::future::join_all(closes).await;
                    wait_all(waiters).await;
                }
                .into_actor(act)
            })
            .map(|(), act, ctx| {
                act.shared.emit(SessionEvent::Closed);
                act.set_inactive(true);
                act.handle = None;
                ctx.stop();
            }),
        )
    }
}

fn terminal_items(calls: Vec<FunctionCall>, reason: &str) -> Vec<ChatItem> {
    calls
        .into_iter()
        .flat_map(|call| terminal_pair(call, reason))
        .collect()
}

counted_handlers!(
    SessionActor: StartSession,
    CompleteTask,
    RunTurn,
    QueueReply,
    Handoff,
    RunTask,
    DeliverToolItems,
    SpeechPlayedOut,
    ReadChat,
    ReadAgent,
    CloseSession,
);
