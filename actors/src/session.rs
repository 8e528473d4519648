//! `SessionActor`: one conversation with one user.
//!
//! - **Owns:** the session-scoped toolsets and the [`Schedule`] (which agent is current,
//!   the activities paused for sub-tasks, queued work, whether a deferred reply is wanted,
//!   what the user is doing). The history is written by each activity as it stops
//!   (`SessionShared::history`); the session reads it.
//! - **Parent of:** every activity and session-scoped `ToolsetActor`.
//! - **Starts** with `Session::builder().start(..)` (`StartSession`); **stops** on
//!   `CloseSession` — sent by `Session::close` or when the host's last `Session` handle
//!   is dropped — once all its children are gone.
//! - **Handles:** `StartSession`, `RunTurn`, `QueueReply`, `Handoff`, `QueueHandoff`,
//!   `RunTask`, `CompleteTask`, `DeliverToolItems`, `InterruptTurn`, `InterruptSpeech`,
//!   `Say`, `UserStartedSpeaking`, `UserStoppedSpeaking`, `UserTranscript`, `CancelTurn`,
//!   `PlayoutFinished`, `ReadChat`, `ReadHistory`, `ReadAgent`, `CloseSession`,
//!   `TakeSnapshot`, `RecordCall`, `ApplyInput`, `AwaitTask`. Those it
//!   relays to an activity keep their name on the way: `DeliverToolItems`,
//!   `InterruptTurn`, `InterruptSpeech`, the three user inputs, `PlayoutFinished`,
//!   `ReadChat`.
//! - **Children reach it** only through [`SessionLinks`]: one counted address with a
//!   method per message a child may send, never the host's handle.
//!
//! Guarantees, each tested:
//! - Turns run one at a time, in the order they were asked for; a handoff waits for the
//!   turn before it, unless it interrupts; a sub-task starts at once.
//! - During a handoff (old `on_exit`, close, new `on_enter`) tool items wait, then go to
//!   the incoming agent; items of an agent-scoped run go only to their own activity.
//! - An agent that cannot start here is refused before anything is stopped for it: the
//!   current agent stays current and working.
//! - Tool items arriving while a deferred reply is pending join that one reply.
//! - `Interrupt` stops the current turn now; every call of it gets an output.
//! - After `CloseSession`, and once the host's last handle is dropped, no actor of the
//!   session stays alive.
//! - Work the agents start on their own (replies a hook or tool queues, handoffs) is
//!   bounded per user input (`max_agent_work`): past it, refused with an error and one
//!   event per input, and the next user input is answered.
//! - Words the user says over a playing speech are judged once, here (`overlap.rs`):
//!   backchannels and words that do not pass the turn rules neither interrupt nor make a
//!   turn, and the activity hears the same judgement the endpointing acts on.

mod agent_work;
mod alarm;
mod apply;
mod close;
mod endpoint;
mod overlap;
mod pauses;
mod preemption;
mod realtime;
mod restore;
mod saver;
mod schedule;
mod snapshot;
mod switch;
mod turn_limit;

use std::collections::HashMap;
use std::sync::Arc;

use actix::prelude::*;
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::activity::{
    ActivityActor, DeliverToolItems, InterruptSpeech, InterruptTurn, PlayoutFinished, Preflight,
    ReadChat, ReadHistoryEntry, StartTurn, TurnKind, TurnOutcome, UserStartedSpeaking,
    UserStoppedSpeaking, UserTranscript,
};
use crate::agent::Agent;
use crate::chat::{ChatContext, ChatItem};
use crate::control::ControlPort;
use crate::delivery::{Scope, TaskAsker};
use crate::error::{SessionError, UpdateError};
use crate::events::UserState;
use crate::events::{AgentWork, IgnoredWords, RunResult, SessionEvent};
use crate::handoff::Handoff;
use crate::history::{SessionHistory, SubTaskOf};
use crate::ids::ActorId;
use crate::lifecycle::{AliveToken, Child};
use crate::llm::ToolSchema;
use crate::mailbox::{counted_handlers, plain_response, Mailbox, Probe};
use crate::output::{PlayoutPort, PlayoutReporter, SpeechId};
use crate::realtime::Model;
use crate::realtime_link::RealtimeLink;
use crate::registry::SessionLease;
use crate::shared::SessionShared;
use crate::speech::{
    Interruptibility, SayOptions, SpeechHandle, SpeechOutcome, SpeechPort, SpeechPriority,
    SpeechStatus,
};
use crate::starting_chat::StartingChat;
use crate::telemetry::Cause;
use crate::tool::{Tool, Toolset};
use crate::toolset::ToolsetActor;
use crate::turn_handling::{EndOfTurn, TurnRules};

use agent_work::{Admission, AgentWorkBound};
pub(crate) use apply::ApplyInput;
pub(crate) use close::CloseSession;
use endpoint::Heard;
use overlap::{Ignored, Judged, OverlapJudge};
use realtime::{HeardTurn, Transcribed};
pub(crate) use restore::{AwaitTask, RestorePlan};
use schedule::{After, Cancelled, Next, Refusal, Route, Schedule, TurnId, Work};
pub use snapshot::SnapshotUpdate;
pub(crate) use snapshot::{RecordCall, TakeSnapshot};
use switch::Entry;

/// A session-scoped toolset as activities see it.
pub(crate) struct SessionToolset {
    /// Its name (a snapshot names the toolset of a background call).
    pub(crate) name: String,
    pub(crate) tools: Vec<Tool>,
    pub(crate) schemas: Vec<ToolSchema>,
    pub(crate) mailbox: Mailbox<ToolsetActor>,
    /// Its runs, for snapshots: the session reads them as it asks the activations for
    /// their parts.
    pub(crate) book: Arc<crate::toolset::RunBook>,
}

/// An activity as the session holds it.
#[derive(Clone)]
pub(crate) struct ActivityRef {
    child: Child<ActivityActor>,
    agent: Agent,
    /// The sub-task it runs in (an agent handed to inside a sub-task runs in it too).
    sub_task_of: Option<SubTaskOf>,
}

impl ActivityRef {
    fn id(&self) -> &ActorId {
        self.child.id()
    }
}

type Reply<T> = oneshot::Sender<Result<T, SessionError>>;
type TaskReply = oneshot::Sender<Result<Value, SessionError>>;

/// A turn waiting for its agent.
pub(crate) struct QueuedTurn {
    kind: TurnKind,
    reply: Option<Reply<RunResult>>,
    /// Who asked, for the turn's span and latency.
    cause: Cause,
    /// The host input it is the effect of (`Session::apply`).
    tie: snapshot::Tie,
}

/// A handoff whose agent was checked: it can start here.
pub(crate) struct PlannedHandoff {
    handoff: Handoff,
    llm: Model,
    done: HandoffDone,
    /// Who asked, for the handoff's span.
    cause: Cause,
}

/// Who learns that a handoff completed.
enum HandoffDone {
    /// Nobody waits (a tool or hook queued it).
    Nobody,
    /// The host (`update_agent`, `SessionAddress::send`): once the new `on_enter` ran.
    Host(Reply<()>),
    /// The turn whose tool handed off: its result, with the handoff in it (boxed: a
    /// result with its usage and latency is the largest thing a planned handoff holds).
    Turn {
        reply: Option<Reply<RunResult>>,
        result: Box<RunResult>,
        failure: Option<SessionError>,
    },
}

impl HandoffDone {
    fn finish(self, handed: Result<(), SessionError>, from: &str, to: &str) {
        match self {
            Self::Nobody => {
                if let Err(err) = handed {
                    tracing::warn!(%err, from, to, "a queued handoff did not complete");
                }
            }
            Self::Host(reply) => {
                let _ = reply.send(handed);
            }
            Self::Turn {
                reply,
                mut result,
                failure,
            } => {
                if handed.is_ok() {
                    result.events.push(ChatItem::AgentHandoff {
                        from: Some(from.to_owned()),
                        to: to.to_owned(),
                    });
                }
                let answer = match (failure, handed) {
                    (Some(failure), _) => turn_answer(*result, Some(failure)),
                    (None, handed) => handed.map(|()| *result),
                };
                if let Some(reply) = reply {
                    let _ = reply.send(answer);
                }
            }
        }
    }
}

/// A turn's answer: its result, or its failure carrying what it did.
fn turn_answer(
    result: RunResult,
    failure: Option<SessionError>,
) -> Result<RunResult, SessionError> {
    match failure {
        None => Ok(result),
        Some(SessionError::TurnFailed { failure, .. }) => Err(SessionError::TurnFailed {
            failure,
            result: Box::new(result),
        }),
        Some(other) => Err(other),
    }
}

/// A handoff that was not queued: who waited for it, and why.
type Refused = Box<(HandoffDone, SessionError)>;

/// A sub-task whose agent was checked.
pub(crate) struct PlannedTask {
    agent: Agent,
    llm: Model,
}

/// The session actor's handles, as the schedule moves them.
pub(crate) struct Actors;

impl Work for Actors {
    type Activity = ActivityRef;
    type Turn = QueuedTurn;
    type Handoff = PlannedHandoff;
    type Task = PlannedTask;
    type TaskReply = TaskReply;
    type Delivery = DeliverToolItems;
}

/// What children may send to their session, and nothing else: one method per message a
/// tool run, a tool's or hook's `SessionControl`, a `SpeechHandle` or the output's
/// `PlayoutReporter` may send. It holds the session's counted address privately (this
/// module is the only one that can reach it), so a child cannot send a turn, a close or
/// an interrupt — the messages whose answer could wait on the child's own turn — and it is
/// one address clone per session rather than one boxed recipient per message.
pub(crate) struct SessionLinks {
    session: Mailbox<SessionActor>,
}

impl SessionLinks {
    /// A run's later items (`/update_n`, `/finished`); resolves once they are in a chat
    /// context (or why they never will be).
    pub(crate) fn deliver(&self, from: &ActorId, items: DeliverToolItems) {
        // One per update or finished run, each awaited before the next (see the message).
        self.session.tell(from, items);
    }

    /// A handoff a finished background run or a tool asks for; resolves once queued.
    pub(crate) fn queue_handoff(
        &self,
        from: &ActorId,
        handoff: Handoff,
    ) -> impl std::future::Future<Output = Result<(), SessionError>> + Send + 'static {
        // Called on the asker's task (a tool body, a hook): its span is current.
        let ask = self.session.ask(
            from,
            QueueHandoff {
                handoff,
                cause: Cause::here(),
            },
        );
        async move { ask.await.unwrap_or(Err(SessionError::Closed)) }
    }

    /// A background run completed the current sub-task (one per run).
    pub(crate) fn complete_task(&self, from: &ActorId, value: Value) {
        self.session.tell(from, CompleteTask { value });
    }

    /// An `Abandon` tool's call whose body waits to start: resolves once a snapshot
    /// holding the call is in the session's store (or why it is not). The call is in its
    /// toolset's book before this is sent, so any snapshot collected after it arrives holds
    /// the call.
    pub(crate) fn record_call(
        &self,
        from: &ActorId,
        call_id: &str,
    ) -> impl std::future::Future<Output = Result<(), String>> + Send + 'static {
        let (answer, heard) = oneshot::channel();
        // One per call of an `Abandon` tool, before its body starts.
        self.session.tell(
            from,
            RecordCall {
                call_id: call_id.to_owned(),
                answer,
            },
        );
        async move {
            match heard.await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(err)) => Err(err.to_string()),
                Err(_) => Err("the session stopped before the call was recorded".to_owned()),
            }
        }
    }

    /// A tool runs a sub-task, exempt from its caller's pause.
    pub(crate) fn run_task(
        &self,
        from: &ActorId,
        agent: Agent,
        asker: TaskAsker,
    ) -> impl std::future::Future<Output = Result<Value, SessionError>> + Send + 'static {
        let ask = self.session.ask(
            from,
            RunTask {
                agent,
                asker: Some(asker),
            },
        );
        async move { ask.await.unwrap_or(Err(SessionError::Closed)) }
    }
}

impl SpeechPort for SessionLinks {
    fn interrupt(&self, speech: SpeechId, force: bool) {
        // One per handle call, at the pace of whoever holds the handle.
        self.session
            .tell(&ActorId::host(), InterruptSpeech { speech, force });
    }
}

impl PlayoutPort for SessionLinks {
    fn report(
        &self,
        speech: SpeechId,
        interrupted: bool,
        heard: Option<String>,
        heard_audio: Option<std::time::Duration>,
    ) {
        // One per report, at the host's pace; a report of a speech that has ended is
        // dropped at the session.
        self.session.tell(
            &ActorId::host(),
            PlayoutFinished {
                speech,
                interrupted,
                heard,
                heard_audio,
            },
        );
    }
}

impl ControlPort for SessionLinks {
    fn queue_reply(
        &self,
        from: &ActorId,
        instructions: Option<String>,
    ) -> BoxFuture<'static, Result<(), SessionError>> {
        let ask = self.session.ask(
            from,
            QueueReply {
                instructions,
                cause: Cause::here(),
            },
        );
        async move { ask.await.unwrap_or(Err(SessionError::Closed)) }.boxed()
    }

    fn queue_handoff(
        &self,
        from: &ActorId,
        handoff: Handoff,
    ) -> BoxFuture<'static, Result<(), SessionError>> {
        SessionLinks::queue_handoff(self, from, handoff).boxed()
    }

    fn say(
        &self,
        from: &ActorId,
        text: String,
        options: SayOptions,
    ) -> BoxFuture<'static, Result<SpeechHandle, SessionError>> {
        let ask = self.session.ask(
            from,
            Say {
                text,
                options,
                cause: Cause::here(),
                input: None,
            },
        );
        async move { ask.await.unwrap_or(Err(SessionError::Closed)) }.boxed()
    }
}

pub(crate) struct SessionActor {
    probe: Arc<Probe>,
    shared: Arc<SessionShared>,
    links: Arc<SessionLinks>,
    /// What `StartSession` starts: the first agent (checked by the builder), or a
    /// snapshot to restore (checked too).
    start: Option<Start>,
    toolset_defs: Vec<Toolset>,
    toolsets: Arc<[SessionToolset]>,
    toolset_children: Vec<Child<ToolsetActor>>,
    schedule: Schedule<Actors>,
    generations: HashMap<String, u32>,
    /// How many activities the session started (each one's place in the history).
    started: u32,
    /// Voice input was seen: the user can go away (text sessions never do).
    voice: bool,
    /// Tool deliveries received so far: what a settling deferred reply watches.
    deliveries_seen: u64,
    /// The session's one timer, set to the earliest of the deadlines below.
    alarm: alarm::Alarm,
    /// The user's words waiting for the end of their turn.
    endpoint: endpoint::Endpointing,
    /// How the current agent takes turns (its own groups over the session's).
    turn_rules: TurnRules,
    /// The user's words over the agent's speech: whether they interrupt, and make turns.
    judge: OverlapJudge,
    /// How long the user has spoken without an answer.
    turn_limit: turn_limit::UserTurnTracker,
    /// The preemptive requests of the user's turn under way.
    preemption: preemption::Preemption,
    /// When the user last stopped speaking, until a turn of their words takes it: where a
    /// user turn's latency counts from.
    user_stopped_at: Option<Instant>,
    /// The work agents started on their own since the last user input, against its limit.
    agent_work: AgentWorkBound,
    /// When the user of an idle voice session counts as away.
    away_at: Option<Instant>,
    /// The snapshots it took, and its saving to a store.
    chain: snapshot::Chain,
    /// Whether the session was inactive at the last pump (a settled turn saves when it
    /// becomes so).
    was_inactive: bool,
    /// The current agent as last published in the host view, for summaries: compared by
    /// pointer at each pump, written there only when it changed.
    published_agent: Option<Agent>,
    /// Declared before `_alive`, so dropped first: once `close()` returns, the engine
    /// counts the session as gone and its id is free.
    /// The latest final transcript's cause, for the user turn its words make (telemetry;
    /// empty without the feature).
    transcript_cause: Cause,
    /// The connections to the realtime models live activities use, one per model.
    realtime_links: Vec<RealtimeLink>,
    _lease: SessionLease,
    _alive: AliveToken,
}

impl SessionActor {
    /// Builds the actor inside its context (its links need its address).
    pub(crate) fn new(
        ctx: &mut Context<Self>,
        shared: Arc<SessionShared>,
        probe: Arc<Probe>,
        start: Start,
        toolsets: Vec<Toolset>,
        store: Option<(
            Arc<dyn crate::snapshot_store::SnapshotStore>,
            crate::snapshot_store::Claim,
        )>,
        (lease, alive): (SessionLease, AliveToken),
    ) -> Self {
        let links = Arc::new(SessionLinks {
            session: Mailbox::new(ctx.address(), probe.clone()),
        });
        let mut chain = snapshot::Chain::default();
        if let Some((store, claim)) = store {
            chain.save_to(store, claim, shared.clone());
        }
        let (alarm, rings) = alarm::Alarm::new();
        ctx.add_stream(rings);
        let turn_rules = shared.settings.config.turn_handling.rules();
        let max_agent_work = shared.settings.config.max_agent_work;
        Self {
            probe,
            shared,
            links,
            start: Some(start),
            toolset_defs: toolsets,
            toolsets: Arc::from(Vec::new()),
            toolset_children: Vec::new(),
            schedule: Schedule::new(),
            generations: HashMap::new(),
            started: 0,
            voice: false,
            deliveries_seen: 0,
            alarm,
            endpoint: endpoint::Endpointing::new(&turn_rules.endpointing),
            turn_rules,
            judge: OverlapJudge::default(),
            turn_limit: turn_limit::UserTurnTracker::default(),
            preemption: preemption::Preemption::default(),
            user_stopped_at: None,
            agent_work: AgentWorkBound::new(max_agent_work),
            away_at: None,
            chain,
            was_inactive: false,
            published_agent: None,
            transcript_cause: Cause::default(),
            realtime_links: Vec::new(),
            _lease: lease,
            _alive: alive,
        }
    }

    fn id(&self) -> ActorId {
        self.probe.id().clone()
    }

    /// Runs everything due now, then publishes whether the session is inactive (and
    /// saves a snapshot when it just became so, if it saves to a store). While a snapshot
    /// is collected, new work waits: the snapshot is of one point.
    fn pump(&mut self, ctx: &mut Context<Self>) {
        if self.chain.holds_work() {
            return;
        }
        // Words held over the agent's speech are the user's once the speech is over.
        if self.judge.holds_words() && self.shared.speeches.floor().is_none() {
            if let Some(text) = self.judge.floor_ended() {
                self.final_words(text, Cause::default(), Instant::now());
            }
        }
        while let Some(next) = self.schedule.next() {
            match next {
                Next::Turn { activity, turn } => {
                    self.input_in(turn.tie);
                    self.start_turn(activity, turn.kind, turn.reply, turn.cause, ctx)
                }
                Next::Deferred { activity } => {
                    self.start_turn(activity, TurnKind::Deferred, None, Cause::default(), ctx)
                }
                Next::Handoff { outgoing, handoff } => self.begin_handoff(outgoing, handoff, ctx),
                Next::Task {
                    caller,
                    task,
                    spare,
                } => self.begin_task(caller, task, spare, ctx),
                Next::DropTask { reply } => {
                    let _ = reply.send(Err(SessionError::TaskNotStarted));
                }
                Next::EndTask { task } => self.begin_end_task(task, ctx),
                Next::Settle => self.settle(0, 0, ctx),
            }
        }
        // Words waiting for the end of the user's turn are a turn to come.
        let inactive = self.schedule.is_inactive() && !self.endpoint.is_pending();
        self.shared.host_view.publish_inactive(inactive);
        self.watch_for_away(inactive);
        self.publish_agent();
        // Both halves evaluated: `was_inactive` must follow every pump, active ones too.
        let was_inactive = std::mem::replace(&mut self.was_inactive, inactive);
        let settled = inactive && !was_inactive;
        if settled && !self.schedule.is_closed() {
            self.save_settled(ctx);
        }
    }

    /// Publishes the current agent for summaries when it changed (a handoff, a sub-task's
    /// start or end); during a switch the last one stays.
    fn publish_agent(&mut self) {
        let Some(current) = self.schedule.current() else {
            return;
        };
        let same = self
            .published_agent
            .as_ref()
            .is_some_and(|shown| Arc::ptr_eq(&shown.def, &current.agent.def));
        if !same {
            self.shared.host_view.publish_agent(&current.agent);
            self.turn_rules = self.shared.settings.turn_rules(&current.agent);
            self.endpoint.set_rules(&self.turn_rules.endpointing);
            self.published_agent = Some(current.agent.clone());
        }
    }

    /// Lets the tool deliveries already on their way land before the deferred reply starts,
    /// so they join it: yields to the arbiter (every ready task — a tool body about to send
    /// its next update — runs once per yield) until `QUIET_ROUNDS` yields in a row pass
    /// with no new delivery, at most `SETTLE_ROUNDS` yields in all. A delivery relayed to
    /// the activity before the reply is in the reply: the activity's mailbox keeps the
    /// order. No timer: when nothing is on its way, the reply starts after a few yields
    /// (about a microsecond).
    fn settle(&mut self, rounds: u32, quiet: u32, ctx: &mut Context<Self>) {
        let seen = self.deliveries_seen;
        ctx.spawn(
            fut::wrap_future::<_, Self>(yield_to_ready_tasks()).map(move |(), act, ctx| {
                let busy = act.deliveries_seen != seen;
                let quiet = if busy { 0 } else { quiet + 1 };
                if quiet < QUIET_ROUNDS && rounds < SETTLE_ROUNDS {
                    act.settle(rounds + 1, quiet, ctx);
                } else {
                    act.schedule.settled();
                    act.pump(ctx);
                }
            }),
        );
    }

    /// A voice session whose user stays silent while the agent is idle for
    /// `user_away_timeout` marks the user away.
    fn watch_for_away(&mut self, inactive: bool) {
        let Some(timeout) = self.shared.settings.config.user_away_timeout else {
            return;
        };
        if !self.voice {
            return;
        }
        if !inactive {
            self.away_at = None;
        } else if self.away_at.is_none() && self.schedule.user() != UserState::Away {
            self.away_at = Some(Instant::now() + timeout);
        }
        self.arm();
    }

    /// Sets the alarm to the earliest deadline.
    fn arm(&self) {
        let at = [
            self.endpoint.deadline(),
            self.away_at,
            self.judge.deadline(),
        ]
        .into_iter()
        .flatten()
        .min();
        self.alarm.set(at);
    }

    /// The user's words make a turn: it joins the user turn from transcripts still queued,
    /// if there is one (so the queue never holds two), or is queued first. Words that
    /// cannot be kept are reported, never dropped silently.
    fn user_words(&mut self, text: String) {
        self.agent_work.user_input();
        self.preemption.turn_confirmed();
        let mut refused = None;
        // The latest final transcript asked for the turn; its latency counts from the end
        // of the user's speech when the host reported it, else from that transcript.
        let cause = std::mem::take(&mut self.transcript_cause);
        let cause = match self.user_stopped_at.take() {
            Some(at) if self.schedule.user() != UserState::Speaking => cause.asked_at(at),
            _ => cause,
        };
        let joined = self.schedule.queued_turn_mut(|turn: &QueuedTurn| {
            turn.reply.is_none() && matches!(turn.kind, TurnKind::User(_))
        });
        if let Some(QueuedTurn {
            kind: TurnKind::User(words),
            cause: joined_cause,
            ..
        }) = joined
        {
            *joined_cause = cause;
            if words.len() + 1 + text.len() <= endpoint::MAX_USER_TEXT {
                words.push(' ');
                words.push_str(&text);
            } else {
                refused = Some(format!(
                    "the user's words were not kept: the user turn waiting to start would hold {} bytes, over {}",
                    words.len() + 1 + text.len(),
                    endpoint::MAX_USER_TEXT
                ));
            }
        } else {
            let turn = QueuedTurn {
                kind: TurnKind::User(text),
                reply: None,
                cause,
                tie: snapshot::Tie::None,
            };
            if let Err((_, why)) =
                self.schedule
                    .queue_turn(TurnId::Engine, turn, SpeechPriority::High)
            {
                refused = Some(format!("the user's words were not kept: {}", refusal(why)));
            }
        }
        if let Some(message) = refused {
            tracing::warn!(session = %self.shared.id(), "{message}");
            self.shared.events.emit(SessionEvent::Error { message });
        }
    }

    /// Relays a judged transcript to the current agent (its barge-in).
    fn relay_transcript(&self, msg: UserTranscript) {
        if let Some(current) = self.schedule.current() {
            current.child.mailbox.tell(self.probe.id(), msg);
        }
    }

    /// A final transcript's words that make (or join) a user turn, caused by `cause`: the
    /// user-turn limit, then the endpointing (which may hold them, and then a preemptive
    /// request may start).
    fn final_words(&mut self, text: String, cause: Cause, now: Instant) {
        self.transcript_cause = cause;
        let limit = &self.turn_rules.user_turn_limit;
        if limit.is_set() {
            let spoke = self.shared.speeches.agent_speech().started;
            if let Some(exceeded) = self.turn_limit.final_words(&text, now, spoke, limit) {
                let cut_in = limit.cut_in.then(|| limit.instructions.clone());
                self.shared.events.emit(SessionEvent::UserTurnExceeded {
                    transcript: exceeded.transcript,
                    words: exceeded.words,
                    duration: exceeded.duration,
                });
                if let Some(instructions) = cut_in {
                    let words = match self.endpoint.take() {
                        Some(held) => format!("{held} {text}"),
                        None => text,
                    };
                    self.cut_in(words, instructions);
                    return;
                }
            }
        }
        let end = match &self.turn_rules.classifier {
            Some(classifier) => match self.endpoint.held() {
                Some(held) => classifier.0.end_of_turn(&format!("{held} {text}")),
                None => classifier.0.end_of_turn(&text),
            },
            None => EndOfTurn::Likely,
        };
        let speaking = self.schedule.user() == UserState::Speaking;
        match self.endpoint.final_words(&text, now, speaking, end) {
            Heard::Now(text) => self.user_words(text),
            Heard::Held => self.preflight(now),
            Heard::Refused { bytes } => {
                let message = format!(
                    "the user's words were not kept: their turn would hold {bytes} bytes, over {}",
                    endpoint::MAX_USER_TEXT
                );
                tracing::warn!(session = %self.shared.id(), "{message}");
                self.shared.events.emit(SessionEvent::Error { message });
            }
        }
    }

    /// Words wait for the end of the user's turn: with preemptive generation, and the
    /// current agent idle, it starts the model on them now (within the tries and speech
    /// length the turn handling allows); past those, a request under way on older words
    /// is dropped.
    fn preflight(&mut self, now: Instant) {
        if !self.turn_rules.preemptive.enabled {
            return;
        }
        let idle = self.schedule.interrupt_target().is_none()
            && self.schedule.queued().next().is_none()
            && !self.schedule.reply_wanted();
        let Some(current) = self.schedule.current() else {
            return;
        };
        let Some(text) = self.endpoint.held() else {
            return;
        };
        let text = match self.preemption.ask(now, idle, &self.turn_rules.preemptive) {
            preemption::Ask::Start => Some(text.to_owned()),
            preemption::Ask::Drop => None,
            preemption::Ask::Nothing => return,
        };
        current
            .child
            .mailbox
            .tell(self.probe.id(), Preflight { text });
    }

    /// The user spoke past their limit: their words so far become their turn, answered at
    /// once by a reply under `instructions` they cannot interrupt.
    fn cut_in(&mut self, text: String, instructions: Arc<str>) {
        self.agent_work.user_input();
        self.preemption.turn_confirmed();
        self.user_stopped_at = None;
        let turn = QueuedTurn {
            kind: TurnKind::CutIn { text, instructions },
            reply: None,
            cause: std::mem::take(&mut self.transcript_cause),
            tie: snapshot::Tie::None,
        };
        if let Err((_, why)) = self
            .schedule
            .queue_turn(TurnId::Engine, turn, SpeechPriority::High)
        {
            let message = format!("the user's words were not kept: {}", refusal(why));
            tracing::warn!(session = %self.shared.id(), "{message}");
            self.shared.events.emit(SessionEvent::Error { message });
        }
    }

    /// Words the user said over the agent made no turn: reported, and kept in the chat
    /// (after the agent's turn, as a message that asks for no reply) when the host chose so.
    fn words_ignored(&mut self, ignored: Ignored) {
        let keep = self.turn_rules.keeps_ignored_words();
        let kept = keep.then(|| ignored.text.clone());
        self.shared.events.emit(SessionEvent::UserWordsIgnored {
            text: ignored.text,
            reason: ignored.reason,
        });
        if let Some(text) = kept {
            let turn = QueuedTurn {
                kind: TurnKind::Backchannel(text),
                reply: None,
                cause: Cause::default(),
                tie: snapshot::Tie::None,
            };
            if let Err((_, why)) =
                self.schedule
                    .queue_turn(TurnId::Engine, turn, SpeechPriority::Normal)
            {
                tracing::debug!(session = %self.shared.id(), why = %refusal(why), "a kept backchannel was dropped");
            }
        }
    }

    /// Whether an agent may start `work` on its own now (see `agent_work.rs`): counted
    /// when it may; refused past the limit, the first refusal since the last user input
    /// reported with an event.
    fn admit_agent_work(&mut self, work: AgentWork) -> Result<(), SessionError> {
        let Admission::Refused { limit, report } = self.agent_work.admit() else {
            return Ok(());
        };
        // During a switch the incoming agent is the one asking (its `on_enter`).
        let agent = self
            .schedule
            .activities()
            .first()
            .map(|activity| activity.agent.name().to_owned())
            .unwrap_or_default();
        if report {
            tracing::warn!(session = %self.shared.id(), %agent, %work, limit, "agent-started work refused: the limit per user input is reached");
            self.shared.events.emit(SessionEvent::AgentWorkRefused {
                agent,
                work: work.clone(),
                limit,
            });
        } else {
            tracing::debug!(session = %self.shared.id(), %agent, %work, limit, "agent-started work refused again");
        }
        Err(SessionError::AgentWorkLimit { work, limit })
    }

    /// The user's state changed: the schedule keeps it, the host reads the published copy.
    fn set_user(&mut self, user: UserState) {
        self.schedule.set_user(user);
        self.shared
            .host_view
            .publish_user_state(&self.shared.events, user);
    }

    /// The agent whose settings a new speech takes (the current one, else the session's).
    fn allows_interruptions(&self) -> bool {
        self.schedule
            .current()
            .and_then(|current| current.agent.def.allow_interruptions)
            .unwrap_or(self.shared.settings.config.allow_interruptions)
    }

    fn start_turn(
        &mut self,
        activity: ActivityRef,
        kind: TurnKind,
        reply: Option<Reply<RunResult>>,
        cause: Cause,
        ctx: &mut Context<Self>,
    ) {
        if !matches!(kind, TurnKind::Say { .. } | TurnKind::Backchannel(_)) {
            self.shared.host_view.turn_started();
        }
        let (done, outcome) = oneshot::channel();
        // One per turn, and the session sends the next only after this one answered.
        activity
            .child
            .mailbox
            .tell(self.probe.id(), StartTurn { kind, done, cause });
        let id = activity.id().clone();
        let agent = activity.agent.name().to_owned();
        ctx.spawn(outcome.into_actor(self).map(move |outcome, act, ctx| {
            // No answer: the activity stopped with the turn queued or running.
            let outcome = outcome.unwrap_or_else(|_| TurnOutcome::failed(SessionError::Closed));
            act.turn_done(&id, &agent, outcome, reply, ctx);
        }));
    }

    fn turn_done(
        &mut self,
        activity: &ActorId,
        agent: &str,
        outcome: TurnOutcome,
        reply: Option<Reply<RunResult>>,
        ctx: &mut Context<Self>,
    ) {
        let report = outcome.report.map(|report| *report).unwrap_or_default();
        let result = RunResult {
            events: outcome.events,
            interrupted: outcome.interrupted,
            usage: report.usage,
            latency: report.latency,
        };
        let failure = outcome.failure;
        let answer = |reply: Option<Reply<RunResult>>, answer| {
            if let Some(reply) = reply {
                let _ = reply.send(answer);
            }
        };
        if self.schedule.is_closed() {
            let failure = failure.unwrap_or(SessionError::Closed);
            answer(reply, turn_answer(result, Some(failure)));
            return;
        }
        // A failed turn (a propagated tool error) still performs the handoff or task end
        // it asked for: a handoff is never dropped because another call failed.
        let after = if let Some(handoff) = outcome.handoff {
            let done = HandoffDone::Turn {
                reply,
                result: Box::new(result),
                failure,
            };
            let work = AgentWork::Handoff {
                to: handoff.agent.name().to_owned(),
            };
            // Over the limit the agent stays: its chat keeps the tool's output that named
            // the new agent, and the event (or the host's `run`) says why it stayed.
            let planned = match self.admit_agent_work(work) {
                Ok(()) => self.plan_handoff(handoff, done, outcome.cause),
                Err(err) => Err(Box::new((done, err))),
            };
            match planned {
                Ok(planned) => After::Handoff(planned),
                Err(refused) => {
                    // Over the limit; a refused agent is not reached here (the run
                    // checked it before it answered).
                    let (done, err) = *refused;
                    tracing::debug!(%err, "a tool's handoff was refused");
                    done.finish(Err(err), agent, agent);
                    After::Nothing
                }
            }
        } else if let Some(value) = outcome.task_result {
            answer(reply, turn_answer(result, failure));
            After::EndTask(value)
        } else {
            answer(reply, turn_answer(result, failure));
            After::Nothing
        };
        self.schedule.turn_done(activity, after);
        self.pump(ctx);
    }

    /// Checks that the handoff's agent can start here (before anything is stopped).
    fn plan_handoff(
        &self,
        handoff: Handoff,
        done: HandoffDone,
        cause: Cause,
    ) -> Result<PlannedHandoff, Refused> {
        match self.shared.settings.check_agent(&handoff.agent) {
            Ok(llm) => Ok(PlannedHandoff {
                handoff,
                llm,
                done,
                cause,
            }),
            Err(err) => Err(Box::new((done, err.into()))),
        }
    }

    fn queue_handoff(
        &mut self,
        handoff: Handoff,
        done: HandoffDone,
        cause: Cause,
        ctx: &mut Context<Self>,
    ) -> Result<(), Refused> {
        let preempt = handoff.interrupt;
        let planned = self.plan_handoff(handoff, done, cause)?;
        match self.schedule.queue_handoff(planned, preempt) {
            Ok(interrupt) => {
                if let Some(activity) = interrupt {
                    activity
                        .child
                        .mailbox
                        .tell(self.probe.id(), InterruptTurn { force: true });
                }
                self.pump(ctx);
                Ok(())
            }
            Err((planned, why)) => Err(Box::new((planned.done, refusal(why)))),
        }
    }

    /// Relays tool items to the activity they belong in (which answers the run), or holds
    /// or refuses them; items that ask for a reply make one wanted.
    fn deliver(&mut self, delivery: DeliverToolItems) {
        let scope = delivery.scope.clone();
        match self.schedule.route(&scope, delivery) {
            Route::To(activity, delivery) => {
                if delivery.reply {
                    self.schedule.wants_reply();
                }
                // One per delivery; whoever delivers awaits its answer before the next.
                activity.child.mailbox.tell(self.probe.id(), delivery);
            }
            Route::Held => {}
            Route::ScopeClosed(delivery) => {
                delivery.answer.send(Err(UpdateError::ScopeClosed {
                    call_id: delivery.base_call_id,
                }));
            }
            Route::SessionClosed(delivery) => {
                delivery.answer.send(Err(UpdateError::Closed));
            }
        }
    }
}

/// Lets every task of the arbiter that is ready now run before the caller goes on: wakes
/// itself and is pending once, so it goes to the back of the arbiter's queue. Not
/// `tokio::task::yield_now`, which also makes the runtime poll its I/O driver — a system
/// call per yield, five or more per deferred reply — for events a settle does not wait for.
fn yield_to_ready_tasks() -> impl std::future::Future<Output = ()> {
    let mut yielded = false;
    std::future::poll_fn(move |cx| {
        if yielded {
            return std::task::Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    })
}

/// How many yields a deferred reply waits at most for deliveries still on their way: a
/// tool that updates without pause must not hold the reply back for ever.
const SETTLE_ROUNDS: u32 = 512;

/// How many yields in a row without a delivery mean nothing more is on its way: a tool's
/// next update takes a few task hops (its run's reply, its body, its run's mailbox) to
/// reach the session.
const QUIET_ROUNDS: u32 = 8;

fn refusal(why: Refusal) -> SessionError {
    match why {
        Refusal::Closed => SessionError::Closed,
        Refusal::QueueFull { limit } => SessionError::QueueFull { limit },
    }
}

impl Actor for SessionActor {
    type Context = Context<Self>;

    fn started(&mut self, _ctx: &mut Self::Context) {
        self.shared.telemetry.session_started();
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        self.shared.telemetry.session_ended();
        self.probe.stopped();
    }
}

/// The session's alarm rang: the user's turn may have ended, or the user gone away.
impl StreamHandler<alarm::Rang> for SessionActor {
    fn handle(&mut self, _rang: alarm::Rang, ctx: &mut Self::Context) {
        let now = Instant::now();
        if let Some(ignored) = self.judge.due(now) {
            self.words_ignored(ignored);
        }
        if let Some(text) = self.endpoint.due(now) {
            self.user_words(text);
        }
        if self.away_at.is_some_and(|at| at <= now) {
            self.away_at = None;
            if self.schedule.is_inactive() && !self.endpoint.is_pending() {
                self.set_user(UserState::Away);
            }
        }
        self.arm();
        self.pump(ctx);
    }

    /// The alarm lives as long as the session: its end is the session's, not a reason to
    /// stop.
    fn finished(&mut self, _ctx: &mut Self::Context) {}
}

/// What a session starts from.
pub(crate) enum Start {
    /// Its first agent, with the model it uses.
    Fresh(Agent, Model),
    /// A snapshot, with the agents it names.
    Restore(Box<RestorePlan>),
}

/// Sent once by `SessionBuilder::start`: starts the session-scoped toolsets and the first
/// agent's activity (the reply comes after its `on_enter` returned), or restores a
/// snapshot (no `on_enter`: the agents go on where they were).
pub(crate) struct StartSession;

impl Message for StartSession {
    type Result = Result<(), SessionError>;
}

impl Handler<StartSession> for SessionActor {
    type Result = ResponseActFuture<Self, Result<(), SessionError>>;

    fn handle(&mut self, _msg: StartSession, ctx: &mut Self::Context) -> Self::Result {
        let reporter = PlayoutReporter::new(self.links.clone());
        self.shared.output.call(|output| output.attach(reporter));
        let (agent, llm) = match self.start.take() {
            Some(Start::Fresh(agent, llm)) => (agent, llm),
            Some(Start::Restore(plan)) => {
                // Its toolsets start with the calls they were running.
                self.restore(*plan, ctx);
                return Box::pin(fut::ready(Ok(())));
            }
            None => return Box::pin(fut::ready(Err(SessionError::Closed))),
        };
        self.start_toolsets(HashMap::new());
        let (tx, rx) = oneshot::channel();
        let start = StartingChat::resolve(None, agent.starting_chat(), StartingChat::Empty);
        let chat = self.starting_chat(&start, ChatContext::new());
        let first = Entry {
            agent,
            llm,
            chat,
            handoff_from: None,
            sub_task_of: None,
            carried: Vec::new(),
        };
        self.enter(first, ctx, move |_, res| {
            let _ = tx.send(res);
        });
        Box::pin(
            async move { rx.await.unwrap_or(Err(SessionError::Closed)) }
                .into_actor(self)
                .map(|res, act, ctx| {
                    if res.is_err() {
                        act.begin_close("the session did not start", ctx);
                    }
                    res
                }),
        )
    }
}

/// Sent by the host (`Session::run`, `Session::generate_reply`): one turn. The reply is
/// the turn's result, after any handoff it caused. One message and one reply per turn.
pub(crate) struct RunTurn {
    /// The host's ticket for the turn: dropping the `run` future sends `CancelTurn` with it.
    pub(crate) id: u64,
    pub(crate) kind: TurnKind,
    /// The host's span at the call, and when (telemetry).
    pub(crate) cause: Cause,
    /// The host input it applies (`Session::apply`), if any.
    pub(crate) input: Option<u64>,
}

impl Message for RunTurn {
    type Result = Result<RunResult, SessionError>;
}

impl Handler<RunTurn> for SessionActor {
    type Result = ResponseFuture<Result<RunResult, SessionError>>;

    fn handle(&mut self, msg: RunTurn, ctx: &mut Self::Context) -> Self::Result {
        self.agent_work.user_input();
        let (tx, rx) = oneshot::channel();
        let turn = QueuedTurn {
            kind: msg.kind,
            reply: Some(tx),
            cause: msg.cause,
            tie: snapshot::Tie::of(msg.input),
        };
        if let Err((turn, why)) =
            self.schedule
                .queue_turn(TurnId::Host(msg.id), turn, SpeechPriority::Normal)
        {
            if let Some(reply) = turn.reply {
                let _ = reply.send(Err(refusal(why)));
            }
        }
        self.pump(ctx);
        Box::pin(async move { rx.await.unwrap_or(Err(SessionError::Closed)) })
    }
}

/// Sent by a tool or hook (`SessionControl::generate_reply`): queues a reply of the
/// current agent. Answered once queued, never after the turn, so it cannot wait on the
/// turn it was sent from; refused (`AgentWorkLimit`) past the agents' limit of work per
/// user input.
pub(crate) struct QueueReply {
    pub(crate) instructions: Option<String>,
    /// The asker's span (a tool run's, a hook's) at the call (telemetry).
    pub(crate) cause: Cause,
}

impl Message for QueueReply {
    type Result = Result<(), SessionError>;
}

impl Handler<QueueReply> for SessionActor {
    type Result = Result<(), SessionError>;

    fn handle(&mut self, msg: QueueReply, ctx: &mut Self::Context) -> Self::Result {
        if self.schedule.is_closed() {
            return Err(SessionError::Closed);
        }
        self.admit_agent_work(AgentWork::Reply)?;
        let turn = QueuedTurn {
            kind: TurnKind::Reply(msg.instructions),
            reply: None,
            cause: msg.cause,
            tie: snapshot::Tie::None,
        };
        let queued = self
            .schedule
            .queue_turn(TurnId::Engine, turn, SpeechPriority::Normal)
            .map_err(|(_, why)| refusal(why));
        self.pump(ctx);
        queued
    }
}

/// Sent by the host (`Session::update_agent`, `SessionAddress::send`): a [`Handoff`].
/// Refused at once (`SessionError::Build`) when the agent cannot start here; otherwise
/// the reply comes once the new agent's `on_enter` has run.
pub(crate) struct UpdateAgent {
    pub(crate) handoff: Handoff,
    /// The host's span at the call (telemetry).
    pub(crate) cause: Cause,
}

impl Message for UpdateAgent {
    type Result = Result<(), SessionError>;
}

impl Handler<UpdateAgent> for SessionActor {
    type Result = ResponseFuture<Result<(), SessionError>>;

    fn handle(&mut self, msg: UpdateAgent, ctx: &mut Self::Context) -> Self::Result {
        self.agent_work.user_input();
        let (tx, rx) = oneshot::channel();
        let done = HandoffDone::Host(tx);
        if let Err(refused) = self.queue_handoff(msg.handoff, done, msg.cause, ctx) {
            let (done, err) = *refused;
            done.finish(Err(err), "", "");
        }
        Box::pin(async move { rx.await.unwrap_or(Err(SessionError::Closed)) })
    }
}

/// Sent by a tool or hook (`SessionControl::update_agent`) or by a tool run whose body
/// returned an agent after updating: queues a handoff. Answered once queued (or refused:
/// the agent cannot start here, or `AgentWorkLimit` past the agents' limit of work per
/// user input).
pub(crate) struct QueueHandoff {
    pub(crate) handoff: Handoff,
    /// The asker's span (a tool run's, a hook's) at the call (telemetry).
    pub(crate) cause: Cause,
}

impl Message for QueueHandoff {
    type Result = Result<(), SessionError>;
}

impl Handler<QueueHandoff> for SessionActor {
    type Result = Result<(), SessionError>;

    fn handle(&mut self, msg: QueueHandoff, ctx: &mut Self::Context) -> Self::Result {
        if self.schedule.is_closed() {
            return Err(SessionError::Closed);
        }
        self.admit_agent_work(AgentWork::Handoff {
            to: msg.handoff.agent.name().to_owned(),
        })?;
        self.queue_handoff(msg.handoff, HandoffDone::Nobody, msg.cause, ctx)
            .map_err(|refused| refused.1)
    }
}

/// Sent by a tool (`ctx.run_task`) or the host (`Session::run_task`): pauses the current
/// agent and runs `agent` until it completes with a result. Acts at once, even mid-turn:
/// the calling tool waits inside a turn. Refused at once when the agent cannot start.
pub(crate) struct RunTask {
    pub(crate) agent: Agent,
    /// The run awaiting the task (exempt from the pause), none for the host.
    pub(crate) asker: Option<TaskAsker>,
}

impl Message for RunTask {
    type Result = Result<Value, SessionError>;
}

impl Handler<RunTask> for SessionActor {
    type Result = ResponseFuture<Result<Value, SessionError>>;

    fn handle(&mut self, msg: RunTask, ctx: &mut Self::Context) -> Self::Result {
        // The host's sub-task (a tool's names the run that awaits it) is user input.
        if msg.asker.is_none() {
            self.agent_work.user_input();
        }
        let (tx, rx) = oneshot::channel();
        match self.shared.settings.check_agent(&msg.agent) {
            Err(err) => {
                let _ = tx.send(Err(SessionError::Build(err)));
            }
            Ok(llm) => {
                let task = PlannedTask {
                    agent: msg.agent,
                    llm,
                };
                if let Err((reply, _)) = self.schedule.request_task(task, msg.asker, tx) {
                    let _ = reply.send(Err(SessionError::Closed));
                }
                self.pump(ctx);
            }
        }
        Box::pin(async move { rx.await.unwrap_or(Err(SessionError::Closed)) })
    }
}

/// Sent by a tool run whose body completed the current sub-task after it had sent
/// updates (in the background): ends the task once its agent's current turn is done.
/// One per run.
pub(crate) struct CompleteTask {
    pub(crate) value: Value,
}

impl Message for CompleteTask {
    type Result = ();
}

impl Handler<CompleteTask> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: CompleteTask, ctx: &mut Self::Context) {
        if self.schedule.queue_end_task(msg.value).is_ok() {
            self.pump(ctx);
        }
    }
}

impl Handler<DeliverToolItems> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: DeliverToolItems, ctx: &mut Self::Context) {
        self.deliveries_seen += 1;
        self.deliver(msg);
        self.pump(ctx);
    }
}

/// From the host (`Session::interrupt`, `Session::force_interrupt`): relayed to the
/// current agent when a turn of it runs; answered at once when none does.
impl Handler<InterruptTurn> for SessionActor {
    type Result = ResponseFuture<Result<(), SessionError>>;

    fn handle(&mut self, msg: InterruptTurn, _ctx: &mut Self::Context) -> Self::Result {
        let Some(activity) = self.schedule.interrupt_target() else {
            return Box::pin(async { Ok(()) });
        };
        let ask = activity.child.mailbox.ask(self.probe.id(), msg);
        Box::pin(async move { ask.await.unwrap_or(Ok(())) })
    }
}

/// From a `SpeechHandle` (or a host naming the speech, `HostInput::InterruptSpeech`): a
/// queued `say` leaves the queue, unless it disallows interruptions and this is not forced
/// (a handle refuses that itself; a host that names the speech by its id may not know),
/// and its end is told as a speech's end is (`SpeechPlayedOut`, heard nothing: a handle
/// made off this engine learns it from that event); a speech under way is relayed to the
/// activity that speaks it.
impl Handler<InterruptSpeech> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: InterruptSpeech, ctx: &mut Self::Context) {
        let queued = self.schedule.remove_turn(|turn| {
            matches!(&turn.kind, TurnKind::Say { speech, .. }
                if speech.id() == msg.speech && (msg.force || speech.allow_interruptions()))
        });
        if let Some(QueuedTurn {
            kind: TurnKind::Say { speech, .. },
            tie,
            ..
        }) = queued
        {
            self.input_in(tie);
            let heard = Some(String::new());
            speech.set_status(SpeechStatus::Done(SpeechOutcome::Interrupted {
                heard: heard.clone(),
            }));
            self.shared.events.emit(SessionEvent::SpeechPlayedOut {
                speech: msg.speech,
                interrupted: true,
                heard,
            });
            self.pump(ctx);
            return;
        }
        if let Some(owner) = self.speaker(msg.speech) {
            owner.child.mailbox.tell(self.probe.id(), msg);
        }
    }
}

impl SessionActor {
    /// The activity that speaks `speech`, while the speech goes on.
    fn speaker(&self, speech: SpeechId) -> Option<ActivityRef> {
        let owner = self.shared.speeches.owner(speech)?;
        self.schedule
            .activities()
            .into_iter()
            .find(|activity| *activity.id() == owner)
            .cloned()
    }
}

/// Sent by the host (`Session::say`): queues a text the agent says as it is. Answered with
/// the speech's handle once it is queued.
pub(crate) struct Say {
    pub(crate) text: String,
    pub(crate) options: SayOptions,
    /// The asker's span at the call (telemetry).
    pub(crate) cause: Cause,
    /// The host input it applies (`Session::apply`), if any.
    pub(crate) input: Option<u64>,
}

impl Message for Say {
    type Result = Result<SpeechHandle, SessionError>;
}

impl Handler<Say> for SessionActor {
    type Result = Result<SpeechHandle, SessionError>;

    fn handle(&mut self, msg: Say, ctx: &mut Self::Context) -> Self::Result {
        let allow = msg
            .options
            .allow_interruptions
            .unwrap_or_else(|| self.allows_interruptions());
        let speech = SpeechHandle::new(
            SpeechId(self.shared.ids.next_speech()),
            Interruptibility::new(allow),
            SpeechStatus::Queued,
            self.links.clone(),
            self.shared.gone.clone(),
        );
        let turn = QueuedTurn {
            kind: TurnKind::Say {
                text: msg.text,
                speech: speech.clone(),
                add_to_chat: msg.options.add_to_chat,
            },
            reply: None,
            cause: msg.cause,
            tie: snapshot::Tie::of(msg.input),
        };
        let queued = self
            .schedule
            .queue_turn(TurnId::Engine, turn, msg.options.priority);
        self.pump(ctx);
        match queued {
            Ok(()) => Ok(speech),
            Err((_, why)) => {
                speech.set_status(SpeechStatus::Done(SpeechOutcome::Interrupted {
                    heard: Some(String::new()),
                }));
                Err(refusal(why))
            }
        }
    }
}

/// From the host: the user is speaking (deferred replies wait), and the current agent's
/// turn may be barged in on.
impl Handler<UserStartedSpeaking> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: UserStartedSpeaking, ctx: &mut Self::Context) {
        self.user_started(Instant::now());
        if let Some(current) = self.schedule.current() {
            current.child.mailbox.tell(self.probe.id(), msg);
        }
        self.pump(ctx);
    }
}

impl SessionActor {
    /// The user speaks since `now`, as the session's own machines see it (the current
    /// agent's barge-in is the activation's): the host said so, or a restored session's
    /// user was speaking at the snapshot.
    fn user_started(&mut self, now: Instant) {
        self.voice = true;
        self.set_user(UserState::Speaking);
        self.user_stopped_at = None;
        self.endpoint.user_started(now);
        self.preemption.user_started(now);
        if self.turn_rules.judges_words() {
            self.judge.user_started(now, self.shared.speeches.floor());
        }
        if self.turn_rules.user_turn_limit.is_set() {
            let spoke = self.shared.speeches.agent_speech().started;
            self.turn_limit.user_started(now, spoke);
        }
    }
}

/// From the host: the user stopped speaking.
impl Handler<UserStoppedSpeaking> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: UserStoppedSpeaking, ctx: &mut Self::Context) {
        let now = Instant::now();
        self.voice = true;
        self.set_user(UserState::Listening);
        self.user_stopped_at = Some(now);
        self.endpoint
            .user_stopped(now, self.shared.speeches.agent_speech());
        self.judge.user_stopped();
        if let Some(current) = self.schedule.current() {
            current.child.mailbox.tell(self.probe.id(), msg);
        }
        self.arm();
        self.pump(ctx);
    }
}

/// From the host: an interim transcript is an event; a final one with words is a user
/// turn, which goes first — unless its words, said over the agent, do not pass the turn
/// rules (a backchannel, too few words, the classifier's call), or were said over an
/// uninterruptible speech that discards them. A transcript with words is relayed to the
/// current agent with whether its words interrupt: its running turn stops for a final
/// that does, if it allows it (words also make a barge-in real).
impl Handler<UserTranscript> for SessionActor {
    type Result = ();

    fn handle(&mut self, mut msg: UserTranscript, ctx: &mut Self::Context) {
        self.voice = true;
        let has_words = !msg.text.trim().is_empty();
        let now = Instant::now();
        let judged = if !has_words {
            None
        } else if self.turn_rules.judges_words() || self.judge.holds_words() {
            let floor = self.shared.speeches.floor();
            Some(
                self.judge
                    .transcript(&msg.text, msg.is_final, now, floor, &self.turn_rules),
            )
        } else {
            Some(Judged::Interrupts {
                text: msg.is_final.then(|| msg.text.clone()),
            })
        };
        if !msg.is_final && !matches!(judged, Some(Judged::Discarded)) {
            self.shared
                .events
                .emit_with(|| SessionEvent::UserInputTranscribed {
                    text: msg.text.clone(),
                    is_final: false,
                });
        }
        let cause = std::mem::take(&mut msg.cause);
        let mut words = None;
        match judged {
            None => {}
            Some(Judged::Discarded) if msg.is_final => {
                self.shared.events.emit(SessionEvent::UserWordsIgnored {
                    text: msg.text,
                    reason: IgnoredWords::Uninterruptible,
                });
            }
            Some(Judged::Discarded) => {}
            Some(Judged::Holds) => {
                msg.interrupts = false;
                self.relay_transcript(msg);
            }
            Some(Judged::Interrupts { text }) => {
                msg.interrupts = true;
                self.relay_transcript(msg);
                words = text;
            }
        }
        if let Some(text) = words {
            self.final_words(text, cause, now);
        }
        // Words held for no boundary are ignored now, not at the next timer tick.
        if let Some(ignored) = self.judge.due(now) {
            self.words_ignored(ignored);
        }
        self.arm();
        self.pump(ctx);
    }
}

/// Sent by the host before it waits for the session to be inactive or settled: answered
/// once handled, so every input the host told before it has been handled too (a mailbox
/// keeps a sender's order).
pub(crate) struct InputsHandled;

impl Message for InputsHandled {
    type Result = ();
}

impl Handler<InputsHandled> for SessionActor {
    type Result = ();

    fn handle(&mut self, _msg: InputsHandled, _ctx: &mut Self::Context) {}
}

/// Sent when a host drops its `run` future before the answer: the turn leaves the queue,
/// or is interrupted if it runs. One per dropped future.
pub(crate) struct CancelTurn {
    pub(crate) id: u64,
}

impl Message for CancelTurn {
    type Result = ();
}

impl Handler<CancelTurn> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: CancelTurn, ctx: &mut Self::Context) {
        match self.schedule.cancel_turn(msg.id) {
            Cancelled::Dequeued(turn) => {
                self.input_in(turn.tie);
                self.pump(ctx)
            }
            Cancelled::Running(activity) => activity
                .child
                .mailbox
                .tell(self.probe.id(), InterruptTurn { force: true }),
            Cancelled::NotFound => {}
        }
    }
}

/// From the output's `PlayoutReporter`: relayed to the activity that speaks the speech,
/// while it goes on; a report of a speech that has ended (or of none the session made)
/// changes nothing.
impl Handler<PlayoutFinished> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: PlayoutFinished, _ctx: &mut Self::Context) {
        if let Some(owner) = self.speaker(msg.speech) {
            // One per report: bounded by the host's reports.
            owner.child.mailbox.tell(self.probe.id(), msg);
        }
    }
}

/// A read of the current agent: answered now, or after the switch under way.
pub(crate) enum Read<T> {
    Now(T),
    /// No agent is current while a handoff or sub-task switch runs: ask again once
    /// `SessionShared::switched` moves.
    AfterSwitch,
    Closed,
}

impl SessionActor {
    fn read_current<T>(&self, read: impl FnOnce(&ActivityRef) -> T) -> Read<T> {
        match self.schedule.current() {
            Some(current) => Read::Now(read(current)),
            None if self.schedule.is_closed() => Read::Closed,
            None => Read::AfterSwitch,
        }
    }
}

/// From the host (`Session::chat_context`): relayed to the current agent; during a switch,
/// "ask again after it".
impl Handler<ReadChat> for SessionActor {
    type Result = ResponseFuture<Read<ChatContext>>;

    fn handle(&mut self, msg: ReadChat, _ctx: &mut Self::Context) -> Self::Result {
        let me = self.probe.id().clone();
        match self.read_current(|current| current.child.mailbox.ask(&me, msg)) {
            Read::Now(ask) => Box::pin(async move { ask.await.unwrap_or(Read::Closed) }),
            Read::AfterSwitch => Box::pin(async { Read::AfterSwitch }),
            Read::Closed => Box::pin(async { Read::Closed }),
        }
    }
}

/// Asks for the history as it is now: the closed activations and the running ones.
pub(crate) struct ReadHistory;

impl Message for ReadHistory {
    type Result = SessionHistory;
}

impl Handler<ReadHistory> for SessionActor {
    type Result = ResponseFuture<SessionHistory>;

    fn handle(&mut self, _msg: ReadHistory, _ctx: &mut Self::Context) -> Self::Result {
        let me = self.probe.id().clone();
        let asks: Vec<_> = self
            .schedule
            .activities()
            .into_iter()
            .map(|activity| activity.child.mailbox.ask(&me, ReadHistoryEntry))
            .collect();
        let shared = self.shared.clone();
        Box::pin(async move {
            // An activity that stopped meanwhile answers nothing: it recorded itself in
            // the book before its mailbox closed.
            let live = futures_util::future::join_all(asks)
                .await
                .into_iter()
                .filter_map(|entry| entry.ok().and_then(|live| live.0))
                .collect();
            shared.history.read(live)
        })
    }
}

/// Asks for the current agent's name.
pub(crate) struct ReadAgent;

impl Message for ReadAgent {
    type Result = Read<String>;
}

plain_response!(Read<String>, Read<ChatContext>);

impl Handler<ReadAgent> for SessionActor {
    type Result = Read<String>;

    fn handle(&mut self, _msg: ReadAgent, _ctx: &mut Self::Context) -> Self::Result {
        self.read_current(|current| current.agent.name().to_owned())
    }
}

counted_handlers!(
    SessionActor: StartSession,
    RunTurn,
    QueueReply,
    UpdateAgent,
    QueueHandoff,
    RunTask,
    CompleteTask,
    DeliverToolItems,
    InterruptTurn,
    InterruptSpeech,
    Say,
    UserStartedSpeaking,
    UserStoppedSpeaking,
    UserTranscript,
    CancelTurn,
    PlayoutFinished,
    ReadChat,
    ReadHistory,
    ReadAgent,
    CloseSession,
    TakeSnapshot,
    RecordCall,
    AwaitTask,
    ApplyInput,
    InputsHandled,
    HeardTurn,
    Transcribed,
);
