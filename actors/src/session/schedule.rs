//! What the session does next: a plain state machine the session actor carries out.
//!
//! The session's control flow as data. Its [`Stage`] says which agent is current and what
//! it owns — there is no "running with no current agent": work can start only in
//! [`Stage::Live`], and every other stage either ends in `Live` or in `Closed`. The
//! schedule decides what runs next ([`Schedule::next`]), where tool items go
//! ([`Schedule::route`]), what an interruption stops, and what a close must fail or stop;
//! the actor sends the messages. It is generic over the actor's handles ([`Work`]), so
//! every transition is unit-tested below without a running system.
//!
//! Decisions, each with a test:
//! - Queued work (turns, handoffs, a background tool's task completion) runs in order, one
//!   at a time, when the current agent has no turn in flight; a sub-task starts at once,
//!   even mid-turn (its caller's turn waits inside a tool); a preempting handoff jumps
//!   the queue and names the turn to interrupt.
//! - The deferred reply starts only when nothing else is queued, the current agent is
//!   idle and the user is not speaking, and only after the actor has let the tool
//!   deliveries already on their way land (`Next::Settle`, then `settled`). The schedule
//!   knows only *that* one is wanted — items that ask for a reply were routed to the
//!   current agent, or an agent took over pending items; which items, and whether the
//!   reply is still due, the activity decides. A switch hands the wish to the agent that
//!   takes over.
//! - During a switch, session-scoped tool items wait and go to the incoming agent;
//!   agent-scoped ones are refused (their activity never takes items again).
//! - A handoff or task end decided by a turn runs before anything queued.
//! - A sub-task asked for by an agent-scoped run whose activity paused or closed since
//!   (the run stopped with it) does not start. A pause spares the run that asked for the
//!   sub-task, and the caller's run that was handed its last sub-task's result (its
//!   output may still be on its way: stopping it would lose the result).
//! - A close hands back every activity to stop and everything to fail, once.
//!
//! It writes its own part of a session snapshot ([`Schedule::state`], a [`ScheduleState`])
//! and is built again from it ([`Schedule::restored`]): the frames of the live
//! activations, the queued work the engine started, whether a deferred reply is wanted,
//! whether the user speaks.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::delivery::{Scope, TaskAsker};
use crate::events::UserState;
use crate::handoff::HandoffState;
use crate::ids::ActorId;
use crate::speech::SpeechPriority;

/// The actor's handles the schedule moves around.
pub(crate) trait Work {
    /// A handle of an activity actor.
    type Activity: Clone;
    /// A queued turn: what to run and who waits for its result.
    type Turn;
    /// A queued handoff: the (checked) agent and who waits.
    type Handoff;
    /// A sub-task to start: the (checked) agent and the run exempt from the pause.
    type Task;
    /// Who waits for a sub-task's result.
    type TaskReply;
    /// Tool items on their way, with the run waiting for them.
    type Delivery;
}

/// Identifies a turn: one a host awaits (and may cancel by dropping its future), or one
/// the engine runs for itself (a deferred reply, a reply a tool or hook queued).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TurnId {
    Host(u64),
    Engine,
}

/// An activity the schedule knows, and the turn running in it.
pub(crate) struct Frame<W: Work> {
    pub(crate) id: ActorId,
    pub(crate) activity: W::Activity,
    turn: Option<TurnId>,
    /// What a turn of it that ended while it was pausing or paused under a sub-task asked
    /// for (its own task's end, a handoff): it runs once this activity is current again,
    /// never on the sub-task that runs on top of it.
    after: Vec<Job<W>>,
    /// The run of its own that was handed the result of its last sub-task: its output may
    /// still be on its way when another sub-task pauses this activity, and that pause
    /// spares it, so the result reaches the step instead of a "cancelled" output.
    returning: Option<u64>,
}

impl<W: Work> Frame<W> {
    pub(crate) fn new(id: ActorId, activity: W::Activity) -> Self {
        Self {
            id,
            activity,
            turn: None,
            after: Vec::new(),
            returning: None,
        }
    }
}

/// A caller paused for a sub-task, and who waits for the task's result: the reply, and
/// the caller's run that asked (none for the host).
struct Paused<W: Work> {
    frame: Frame<W>,
    reply: W::TaskReply,
    run: Option<u64>,
}

/// A sub-task asked for and not started yet.
struct TaskRequest<W: Work> {
    task: W::Task,
    reply: W::TaskReply,
    asker: Option<TaskAsker>,
}

enum Stage<W: Work> {
    /// An agent is current and can take work.
    Live {
        current: Frame<W>,
        paused: Vec<Paused<W>>,
    },
    /// The current agent is changing.
    Switching {
        paused: Vec<Paused<W>>,
        switch: Switch<W>,
    },
    /// Closing or closed: everything is refused.
    Closed,
}

enum Switch<W: Work> {
    /// The first agent is about to start.
    Starting,
    /// The outgoing agent of a handoff is closing.
    HandingOff { outgoing: Frame<W> },
    /// The caller of a sub-task is pausing; `run` is its run that asked.
    Pausing {
        caller: Frame<W>,
        reply: W::TaskReply,
        run: Option<u64>,
    },
    /// A completed sub-task's agent is closing; its caller resumes with `value`.
    EndingTask { task: Frame<W>, value: Value },
    /// The next agent is starting (`on_enter`).
    Entering { incoming: Frame<W> },
}

enum Job<W: Work> {
    Turn(TurnId, SpeechPriority, W::Turn),
    Handoff(W::Handoff),
    EndTask(Value),
}

impl<W: Work> Job<W> {
    fn view(&self) -> JobView<'_, W> {
        match self {
            Self::Turn(id, _, turn) => JobView::Turn(*id, turn),
            Self::Handoff(handoff) => JobView::Handoff(handoff),
            Self::EndTask(value) => JobView::EndTask(value),
        }
    }

    fn priority(&self) -> SpeechPriority {
        match self {
            Self::Turn(_, priority, _) => *priority,
            Self::Handoff(_) | Self::EndTask(_) => SpeechPriority::Normal,
        }
    }
}

/// What to run now.
pub(crate) enum Next<W: Work> {
    /// Run this turn in the current activity.
    Turn {
        activity: W::Activity,
        turn: W::Turn,
    },
    /// Run the coalesced reply to the tool items pending in the current activity.
    Deferred { activity: W::Activity },
    /// Close `outgoing`, then start the handoff's agent (`entering`, then `entered`).
    Handoff {
        outgoing: W::Activity,
        handoff: W::Handoff,
    },
    /// Pause `caller` (all its agent-scoped runs stop but those in `spare`: the run that
    /// asked, and the one still returning the result of the caller's last sub-task), then
    /// start the task's agent (`entering`, then `entered`).
    Task {
        caller: W::Activity,
        task: W::Task,
        spare: Vec<u64>,
    },
    /// A sub-task asked for by an agent-scoped run whose activity is no longer current:
    /// the run was stopped with its activity's pause or close, so nobody waits for the
    /// task and it does not start. Answer `reply` that it did not.
    DropTask { reply: W::TaskReply },
    /// Close the completed sub-task's activity, then resume its caller (`task_closed`).
    EndTask { task: W::Activity },
    /// A deferred reply is due: first let the tool deliveries already on their way land
    /// (they join it), then call `settled`.
    Settle,
}

/// A caller resumed after its sub-task: who waits for the result, the result, and the
/// tool items held during the switch (to route again).
pub(crate) struct Resumed<W: Work> {
    pub(crate) caller: W::Activity,
    pub(crate) reply: W::TaskReply,
    pub(crate) value: Value,
    pub(crate) held: Vec<W::Delivery>,
}

/// What a finished turn asks for before anything queued.
pub(crate) enum After<W: Work> {
    Nothing,
    Handoff(W::Handoff),
    EndTask(Value),
}

/// Where tool items go.
pub(crate) enum Route<W: Work> {
    /// Insert them into this activity's chat context.
    To(W::Activity, W::Delivery),
    /// Held until the switch under way ends (`entered` hands them back).
    Held,
    /// They will never land: their scope is gone.
    ScopeClosed(W::Delivery),
    /// They will never land: the session is closed.
    SessionClosed(W::Delivery),
}

/// A queued job, as a snapshot reads it.
pub(crate) enum JobView<'a, W: Work> {
    Turn(TurnId, &'a W::Turn),
    Handoff(&'a W::Handoff),
    EndTask(&'a Value),
}

/// A live activation restored from a snapshot: its frame, whether a turn of it is in
/// flight, and what waits for it to be current again.
pub(crate) struct RestoredFrame<W: Work> {
    pub(crate) id: ActorId,
    pub(crate) activity: W::Activity,
    pub(crate) in_turn: bool,
    pub(crate) after: Vec<RestoredJob<W>>,
}

/// A job restored from a snapshot.
pub(crate) enum RestoredJob<W: Work> {
    Turn(W::Turn),
    Handoff(W::Handoff),
    EndTask(Value),
}

impl<W: Work> From<RestoredJob<W>> for Job<W> {
    fn from(job: RestoredJob<W>) -> Self {
        match job {
            RestoredJob::Turn(turn) => Job::Turn(TurnId::Engine, SpeechPriority::Normal, turn),
            RestoredJob::Handoff(handoff) => Job::Handoff(handoff),
            RestoredJob::EndTask(value) => Job::EndTask(value),
        }
    }
}

/// The schedule's part of a session snapshot (see the module docs). Turns a host awaits,
/// and a `say`, are the host's to send again: they are not in it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct ScheduleState {
    /// The live activations' frames: the callers paused under sub-tasks, outermost
    /// first, then the current one.
    pub(crate) frames: Vec<FrameState>,
    /// Work queued for the current agent that the engine started, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) jobs: Vec<JobState>,
    /// Tool items asked for a deferred reply that has not started.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) reply_wanted: bool,
    /// The user was speaking: a deferred reply waits until they stop.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) user_speaking: bool,
}

/// A live activation's frame in a snapshot.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct FrameState {
    /// What a turn of it asked for that waits for it to be current again (a handoff, its
    /// task's end).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) after: Vec<JobState>,
    /// For a paused caller, the key of its run that awaits its sub-task's result (none
    /// when the host asked for the task).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) asker: Option<u64>,
}

/// A queued job in a snapshot.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "job", rename_all = "snake_case")]
pub(crate) enum JobState {
    /// A handoff (its agent built again by the registry).
    Handoff(HandoffState),
    /// A reply a tool or hook asked for.
    Reply {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        instructions: Option<String>,
    },
    /// The end of the current sub-task, with its result.
    EndTask { value: Value },
}

/// Why work was not queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    Closed,
    QueueFull { limit: usize },
}

/// What `cancel_turn` found.
pub(crate) enum Cancelled<W: Work> {
    /// It was still queued: dropped from the queue.
    Dequeued(W::Turn),
    /// It is running in this activity: interrupt it.
    Running(W::Activity),
    /// Not queued nor running (it ended, or never came).
    NotFound,
}

/// Everything a close must stop or fail.
pub(crate) struct Closing<W: Work> {
    /// Every activity of the session, the current (or incoming) one first.
    pub(crate) activities: Vec<W::Activity>,
    pub(crate) turns: Vec<W::Turn>,
    pub(crate) handoffs: Vec<W::Handoff>,
    pub(crate) tasks: Vec<(W::Task, W::TaskReply)>,
    /// Callers waiting for a sub-task's result.
    pub(crate) task_replies: Vec<W::TaskReply>,
    pub(crate) held: Vec<W::Delivery>,
}

/// How much work may wait behind the current turn: a tool or hook queueing replies in a
/// loop must not grow the session without bound.
pub(crate) const MAX_QUEUED: usize = 64;

pub(crate) struct Schedule<W: Work> {
    stage: Stage<W>,
    jobs: VecDeque<Job<W>>,
    tasks: VecDeque<TaskRequest<W>>,
    held: Vec<W::Delivery>,
    /// Tool items that ask for a reply reached the current agent (or it took over pending
    /// ones) since its last deferred reply started.
    reply_wanted: bool,
    /// What the user does, as the host's input says: while they speak the deferred reply
    /// waits and the session is not inactive. The one place it is kept; the host reads a
    /// published copy.
    user: UserState,
    settle: Settle,
}

/// Where the deferred reply is in letting updates already on their way join it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Settle {
    /// Nothing asked yet.
    Idle,
    /// The actor lets the arbiter run until no tool delivery is on its way.
    Settling,
    /// Done: the next `next()` starts the reply.
    Settled,
}

impl<W: Work> Default for Schedule<W> {
    fn default() -> Self {
        Self::new()
    }
}

impl<W: Work> Schedule<W> {
    /// A session whose first agent is about to start.
    pub(crate) fn new() -> Self {
        Self {
            stage: Stage::Switching {
                paused: Vec::new(),
                switch: Switch::Starting,
            },
            jobs: VecDeque::new(),
            tasks: VecDeque::new(),
            held: Vec::new(),
            reply_wanted: false,
            user: UserState::Listening,
            settle: Settle::Idle,
        }
    }

    pub(crate) fn is_closed(&self) -> bool {
        matches!(self.stage, Stage::Closed)
    }

    /// A session restored from a snapshot: `paused` callers (outermost first, each with
    /// who waits for its sub-task's result and the key of the run that stands for the
    /// call awaiting it, if one does) under the `current` agent, the jobs queued for it,
    /// and whether a deferred reply is wanted. What waits for the current agent to be
    /// current again runs first: it is.
    pub(crate) fn restored(
        mut paused: Vec<(RestoredFrame<W>, W::TaskReply, Option<u64>)>,
        mut current: RestoredFrame<W>,
        mut jobs: Vec<RestoredJob<W>>,
        reply_wanted: bool,
    ) -> Self {
        let first = std::mem::take(&mut current.after);
        jobs.splice(0..0, first);
        let frame = |restored: RestoredFrame<W>| Frame {
            id: restored.id,
            activity: restored.activity,
            turn: restored.in_turn.then_some(TurnId::Engine),
            after: restored.after.into_iter().map(Job::from).collect(),
            returning: None,
        };
        let mut schedule = Self::new();
        schedule.stage = Stage::Live {
            current: frame(current),
            paused: paused
                .drain(..)
                .map(|(restored, reply, run)| Paused {
                    frame: frame(restored),
                    reply,
                    run,
                })
                .collect(),
        };
        schedule.jobs = jobs.into_iter().map(Job::from).collect();
        schedule.reply_wanted = reply_wanted;
        schedule
    }

    /// Its part of a session snapshot, once a switch under way has ended (none while one
    /// is, or once closed): `job` writes a queued job, or leaves it out.
    pub(crate) fn state(
        &self,
        job: impl Fn(JobView<'_, W>) -> Option<JobState>,
    ) -> Option<ScheduleState> {
        let Stage::Live { current, paused } = &self.stage else {
            return None;
        };
        let frame = |frame: &Frame<W>, asker: Option<u64>| FrameState {
            after: frame.after.iter().filter_map(|j| job(j.view())).collect(),
            asker,
        };
        Some(ScheduleState {
            frames: paused
                .iter()
                .map(|p| frame(&p.frame, p.run))
                .chain(std::iter::once(frame(current, None)))
                .collect(),
            jobs: self.jobs.iter().filter_map(|j| job(j.view())).collect(),
            reply_wanted: self.reply_wanted,
            user_speaking: self.user_speaking(),
        })
    }

    /// The live activations, outermost paused caller first and the current one last;
    /// `None` while a switch is under way or once closed (a snapshot waits for the switch).
    pub(crate) fn live(&self) -> Option<Vec<&W::Activity>> {
        let Stage::Live { current, paused } = &self.stage else {
            return None;
        };
        Some(
            paused
                .iter()
                .map(|p| &p.frame.activity)
                .chain(std::iter::once(&current.activity))
                .collect(),
        )
    }

    /// The current activity, when one is (not during a switch).
    pub(crate) fn current(&self) -> Option<&W::Activity> {
        match &self.stage {
            Stage::Live { current, .. } => Some(&current.activity),
            _ => None,
        }
    }

    /// Every activity the schedule knows: the current one (or the one a switch moves),
    /// then the callers paused under sub-tasks. Playout reports go to all of them: a
    /// speech of a paused caller's turn can end while its sub-task runs.
    pub(crate) fn activities(&self) -> Vec<&W::Activity> {
        let (first, paused) = match &self.stage {
            Stage::Live { current, paused } => (Some(current), paused),
            Stage::Switching { paused, switch } => (
                match switch {
                    Switch::HandingOff { outgoing } => Some(outgoing),
                    Switch::Pausing { caller, .. } => Some(caller),
                    Switch::EndingTask { task, .. } => Some(task),
                    Switch::Entering { incoming } => Some(incoming),
                    Switch::Starting => None,
                },
                paused,
            ),
            Stage::Closed => return Vec::new(),
        };
        first
            .into_iter()
            .chain(paused.iter().map(|p| &p.frame))
            .map(|frame| &frame.activity)
            .collect()
    }

    /// The jobs queued for the current agent, in order.
    pub(crate) fn queued(&self) -> impl Iterator<Item = JobView<'_, W>> {
        self.jobs.iter().map(Job::view)
    }

    /// Whether a deferred reply is wanted.
    pub(crate) fn reply_wanted(&self) -> bool {
        self.reply_wanted
    }

    /// Whether an agent started now would be a sub-task (callers are paused under it):
    /// only a sub-task may complete a task.
    pub(crate) fn in_task(&self) -> bool {
        match &self.stage {
            Stage::Live { paused, .. } => !paused.is_empty(),
            Stage::Switching { paused, switch } => {
                !paused.is_empty() || matches!(switch, Switch::Pausing { .. })
            }
            Stage::Closed => false,
        }
    }

    /// Whether nothing runs, waits or is pending: the current agent has no turn in
    /// flight (a turn open in a paused caller does not count: the task's agent listens),
    /// nothing is queued, no deferred reply is due, no switch is under way, and the user
    /// is not speaking.
    pub(crate) fn is_inactive(&self) -> bool {
        match &self.stage {
            Stage::Live { current, .. } => {
                !self.user_speaking()
                    && current.turn.is_none()
                    && self.jobs.is_empty()
                    && self.tasks.is_empty()
                    && self.held.is_empty()
                    && !self.reply_wanted
            }
            Stage::Switching { .. } => false,
            Stage::Closed => true,
        }
    }

    fn queued_count(&self) -> usize {
        self.jobs.len() + self.tasks.len()
    }

    fn admit(&self) -> Result<(), Refusal> {
        if self.is_closed() {
            Err(Refusal::Closed)
        } else if self.queued_count() >= MAX_QUEUED {
            Err(Refusal::QueueFull { limit: MAX_QUEUED })
        } else {
            Ok(())
        }
    }

    /// Queues a turn after the work already queued with its priority or a higher one.
    pub(crate) fn queue_turn(
        &mut self,
        id: TurnId,
        turn: W::Turn,
        priority: SpeechPriority,
    ) -> Result<(), (W::Turn, Refusal)> {
        if let Err(why) = self.admit() {
            return Err((turn, why));
        }
        let at = self
            .jobs
            .iter()
            .position(|job| job.priority() < priority)
            .unwrap_or(self.jobs.len());
        self.jobs.insert(at, Job::Turn(id, priority, turn));
        Ok(())
    }

    /// The first queued turn that `matches`, to change before it starts (the user's words
    /// joining their turn still waiting).
    pub(crate) fn queued_turn_mut(
        &mut self,
        matches: impl Fn(&W::Turn) -> bool,
    ) -> Option<&mut W::Turn> {
        self.jobs.iter_mut().find_map(|job| match job {
            Job::Turn(_, _, turn) if matches(turn) => Some(turn),
            _ => None,
        })
    }

    /// Takes a queued turn out of the queue (a `say` interrupted before it played).
    pub(crate) fn remove_turn(&mut self, matches: impl Fn(&W::Turn) -> bool) -> Option<W::Turn> {
        let index = self
            .jobs
            .iter()
            .position(|job| matches!(job, Job::Turn(_, _, turn) if matches(turn)))?;
        match self.jobs.remove(index) {
            Some(Job::Turn(_, _, turn)) => Some(turn),
            _ => None,
        }
    }

    /// The settling asked for by `Next::Settle` is over: the deferred reply may start (with
    /// every item pending by then).
    pub(crate) fn settled(&mut self) {
        if self.settle == Settle::Settling {
            self.settle = Settle::Settled;
        }
    }

    /// What the user does now (the host's input, or away after a silence).
    pub(crate) fn set_user(&mut self, user: UserState) {
        self.user = user;
    }

    /// What the user does, as the schedule knows it.
    pub(crate) fn user(&self) -> UserState {
        self.user
    }

    fn user_speaking(&self) -> bool {
        self.user == UserState::Speaking
    }

    /// Tool items that ask for a reply were routed to the current agent: a deferred reply
    /// is wanted once it is idle.
    pub(crate) fn wants_reply(&mut self) {
        if matches!(self.stage, Stage::Live { .. }) {
            self.reply_wanted = true;
        }
    }

    /// Queues a handoff; a preempting one goes first and names the activity whose turn
    /// to interrupt (if one runs).
    pub(crate) fn queue_handoff(
        &mut self,
        handoff: W::Handoff,
        preempt: bool,
    ) -> Result<Option<W::Activity>, (W::Handoff, Refusal)> {
        if let Err(why) = self.admit() {
            return Err((handoff, why));
        }
        if !preempt {
            self.jobs.push_back(Job::Handoff(handoff));
            return Ok(None);
        }
        self.jobs.push_front(Job::Handoff(handoff));
        Ok(self.interrupt_target())
    }

    /// Queues the end of the current sub-task (a tool of it completed the task in the
    /// background): it runs once the task's agent is idle.
    pub(crate) fn queue_end_task(&mut self, value: Value) -> Result<(), Refusal> {
        self.admit()?;
        self.jobs.push_back(Job::EndTask(value));
        Ok(())
    }

    /// Asks for a sub-task: it starts at once when an agent is current (even mid-turn),
    /// else as soon as the switch under way ends. `asker`: the tool run that asks (none
    /// for the host).
    pub(crate) fn request_task(
        &mut self,
        task: W::Task,
        asker: Option<TaskAsker>,
        reply: W::TaskReply,
    ) -> Result<(), (W::TaskReply, Refusal)> {
        if let Err(why) = self.admit() {
            return Err((reply, why));
        }
        self.tasks.push_back(TaskRequest { task, reply, asker });
        Ok(())
    }

    /// What to run now, if anything. The actor calls it after every change until it
    /// answers `None`.
    pub(crate) fn next(&mut self) -> Option<Next<W>> {
        let in_task = self.in_task();
        let Stage::Live { current, .. } = &mut self.stage else {
            return None;
        };
        if let Some(TaskRequest { task, reply, asker }) = self.tasks.pop_front() {
            if let Some(TaskAsker {
                scope: Scope::Activity(owner),
                ..
            }) = &asker
            {
                if *owner != current.id {
                    // Asked for by a run of an activity that paused or closed since (two
                    // calls of one step asking for sub-tasks: the first one's pause stops
                    // the second): that run is stopped, and the task would run for nobody.
                    return Some(Next::DropTask { reply });
                }
            }
            let activity = current.activity.clone();
            let run = asker.map(|asker| asker.run);
            let spare = run.into_iter().chain(current.returning).collect();
            // The caller hands its pending items to the task's agent.
            self.reply_wanted = false;
            self.switch(|caller| Switch::Pausing { caller, reply, run });
            return Some(Next::Task {
                caller: activity,
                task,
                spare,
            });
        }
        if current.turn.is_some() {
            return None;
        }
        match self.jobs.pop_front() {
            Some(Job::Turn(id, _, turn)) => {
                // A settling under way is for a reply that now waits behind this turn:
                // it settles again after it.
                self.settle = Settle::Idle;
                current.turn = Some(id);
                Some(Next::Turn {
                    activity: current.activity.clone(),
                    turn,
                })
            }
            Some(Job::Handoff(handoff)) => {
                let outgoing = current.activity.clone();
                // The outgoing agent hands its pending items to the one that takes over.
                self.reply_wanted = false;
                self.switch(|outgoing| Switch::HandingOff { outgoing });
                Some(Next::Handoff { outgoing, handoff })
            }
            Some(Job::EndTask(value)) => {
                if !in_task {
                    tracing::warn!("a tool completed a sub-task, but none is running");
                    return self.next();
                }
                let task = current.activity.clone();
                self.reply_wanted = false;
                self.switch(|task| Switch::EndingTask { task, value });
                Some(Next::EndTask { task })
            }
            None if self.reply_wanted && self.user != UserState::Speaking => match self.settle {
                Settle::Idle => {
                    self.settle = Settle::Settling;
                    Some(Next::Settle)
                }
                Settle::Settling => None,
                Settle::Settled => {
                    self.settle = Settle::Idle;
                    self.reply_wanted = false;
                    current.turn = Some(TurnId::Engine);
                    Some(Next::Deferred {
                        activity: current.activity.clone(),
                    })
                }
            },
            None => None,
        }
    }

    /// Moves from `Live` to `Switching`, the current frame going into the switch.
    fn switch(&mut self, make: impl FnOnce(Frame<W>) -> Switch<W>) {
        if let Stage::Live { current, paused } = std::mem::replace(&mut self.stage, Stage::Closed) {
            self.stage = Stage::Switching {
                paused,
                switch: make(current),
            };
        }
    }

    /// The activity spawned to end the switch under way. Returns `false` when the
    /// session closed meanwhile (the actor then stops the new activity itself).
    pub(crate) fn entering(&mut self, id: ActorId, activity: W::Activity) -> bool {
        let Stage::Switching { paused, switch } = &mut self.stage else {
            return false;
        };
        let incoming = Frame::new(id, activity);
        match std::mem::replace(switch, Switch::Starting) {
            Switch::Pausing { caller, reply, run } => {
                paused.push(Paused {
                    frame: caller,
                    reply,
                    run,
                });
            }
            Switch::Starting | Switch::HandingOff { .. } => {}
            // Not reached: an ended task resumes its caller (`task_closed`), it starts
            // no activity. Keep the switch as it was.
            other @ (Switch::EndingTask { .. } | Switch::Entering { .. }) => {
                *switch = other;
                return false;
            }
        }
        *switch = Switch::Entering { incoming };
        true
    }

    /// The incoming activity has started: it is current. `reply_wanted`: it took over
    /// items pending for a deferred reply. Returns the tool items held during the switch,
    /// to route again.
    pub(crate) fn entered(&mut self, reply_wanted: bool) -> Vec<W::Delivery> {
        let Stage::Switching {
            paused,
            switch: Switch::Entering { .. },
        } = &mut self.stage
        else {
            return Vec::new();
        };
        let paused = std::mem::take(paused);
        if let Stage::Switching {
            switch: Switch::Entering { incoming },
            ..
        } = std::mem::replace(&mut self.stage, Stage::Closed)
        {
            self.stage = Stage::Live {
                current: incoming,
                paused,
            };
            self.reply_wanted = reply_wanted;
        }
        std::mem::take(&mut self.held)
    }

    /// The completed sub-task's activity is gone: its caller is current again.
    /// `reply_wanted`: the caller takes over items pending for a deferred reply.
    pub(crate) fn task_closed(&mut self, reply_wanted: bool) -> Option<Resumed<W>> {
        let Stage::Switching {
            switch: Switch::EndingTask { .. },
            paused,
        } = &mut self.stage
        else {
            return None;
        };
        let caller = paused.pop()?;
        let paused = std::mem::take(paused);
        let Stage::Switching {
            switch: Switch::EndingTask { value, .. },
            ..
        } = std::mem::replace(&mut self.stage, Stage::Closed)
        else {
            return None;
        };
        let mut frame = caller.frame;
        if caller.run.is_some() {
            frame.returning = caller.run;
        }
        let activity = frame.activity.clone();
        for job in std::mem::take(&mut frame.after).into_iter().rev() {
            self.jobs.push_front(job);
        }
        self.stage = Stage::Live {
            current: frame,
            paused,
        };
        self.reply_wanted = reply_wanted;
        Some(Resumed {
            caller: activity,
            reply: caller.reply,
            value,
            held: std::mem::take(&mut self.held),
        })
    }

    /// A turn of activity `id` ended; what it asks for runs before anything queued — or,
    /// when `id` is a caller paused under a sub-task, once it is current again.
    pub(crate) fn turn_done(&mut self, id: &ActorId, after: After<W>) {
        let job = match after {
            After::Nothing => None,
            After::Handoff(handoff) => Some(Job::Handoff(handoff)),
            After::EndTask(value) => Some(Job::EndTask(value)),
        };
        // A caller pausing or paused under a sub-task keeps what its turn asked for.
        let caller = match &mut self.stage {
            Stage::Live { paused, .. } => paused
                .iter_mut()
                .map(|p| &mut p.frame)
                .find(|f| f.id == *id),
            Stage::Switching { paused, switch } => {
                let pausing = match switch {
                    Switch::Pausing { caller, .. } => Some(caller),
                    _ => None,
                };
                pausing
                    .into_iter()
                    .chain(paused.iter_mut().map(|p| &mut p.frame))
                    .find(|f| f.id == *id)
            }
            Stage::Closed => None,
        };
        if let Some(caller) = caller {
            caller.turn = None;
            caller.after.extend(job);
            return;
        }
        let frames: Vec<&mut Frame<W>> = match &mut self.stage {
            Stage::Live { current, paused } => std::iter::once(current)
                .chain(paused.iter_mut().map(|p| &mut p.frame))
                .collect(),
            Stage::Switching { paused, switch } => {
                let in_switch = match switch {
                    Switch::HandingOff { outgoing } => Some(outgoing),
                    Switch::Pausing { caller, .. } => Some(caller),
                    Switch::EndingTask { task, .. } => Some(task),
                    Switch::Entering { incoming } => Some(incoming),
                    Switch::Starting => None,
                };
                in_switch
                    .into_iter()
                    .chain(paused.iter_mut().map(|p| &mut p.frame))
                    .collect()
            }
            Stage::Closed => return,
        };
        for frame in frames {
            if frame.id == *id {
                frame.turn = None;
            }
        }
        if let Some(job) = job {
            self.jobs.push_front(job);
        }
    }

    /// Where tool items of a run in `scope` go now.
    pub(crate) fn route(&mut self, scope: &Scope, delivery: W::Delivery) -> Route<W> {
        match (&self.stage, scope) {
            (Stage::Closed, _) => Route::SessionClosed(delivery),
            (Stage::Live { current, .. }, Scope::Session) => {
                Route::To(current.activity.clone(), delivery)
            }
            (Stage::Live { current, .. }, Scope::Activity(owner)) if *owner == current.id => {
                Route::To(current.activity.clone(), delivery)
            }
            (Stage::Live { .. }, Scope::Activity(_)) => Route::ScopeClosed(delivery),
            (Stage::Switching { .. }, Scope::Session) => {
                self.held.push(delivery);
                Route::Held
            }
            // An agent-scoped run delivering mid-switch belongs to the activity being
            // closed or paused, which will never take items again: refuse at once rather
            // than hold the run (and so the switch waiting for it) until its grace period.
            (Stage::Switching { .. }, Scope::Activity(_)) => Route::ScopeClosed(delivery),
        }
    }

    /// The activity whose turn an interruption stops, if a turn runs in the current one.
    pub(crate) fn interrupt_target(&self) -> Option<W::Activity> {
        match &self.stage {
            Stage::Live { current, .. } if current.turn.is_some() => Some(current.activity.clone()),
            _ => None,
        }
    }

    /// A host dropped its `run` future: drop the turn if it is queued, interrupt it if it
    /// runs in the current activity.
    pub(crate) fn cancel_turn(&mut self, id: u64) -> Cancelled<W> {
        let wanted = TurnId::Host(id);
        if let Some(index) = self
            .jobs
            .iter()
            .position(|job| matches!(job, Job::Turn(turn, _, _) if *turn == wanted))
        {
            if let Some(Job::Turn(_, _, turn)) = self.jobs.remove(index) {
                return Cancelled::Dequeued(turn);
            }
        }
        match &self.stage {
            Stage::Live { current, .. } if current.turn == Some(wanted) => {
                Cancelled::Running(current.activity.clone())
            }
            _ => Cancelled::NotFound,
        }
    }

    /// Closes the schedule: everything to stop or fail, once (`None` when already closed).
    pub(crate) fn close(&mut self) -> Option<Closing<W>> {
        let stage = std::mem::replace(&mut self.stage, Stage::Closed);
        let (first, paused, mut task_replies) = match stage {
            Stage::Closed => return None,
            Stage::Live { current, paused } => (Some(current), paused, Vec::new()),
            Stage::Switching { paused, switch } => match switch {
                Switch::Starting => (None, paused, Vec::new()),
                Switch::HandingOff { outgoing } => (Some(outgoing), paused, Vec::new()),
                Switch::Pausing { caller, reply, .. } => (Some(caller), paused, vec![reply]),
                Switch::EndingTask { task, .. } => (Some(task), paused, Vec::new()),
                Switch::Entering { incoming } => (Some(incoming), paused, Vec::new()),
            },
        };
        let mut turns = Vec::new();
        let mut handoffs = Vec::new();
        let mut frames: Vec<Frame<W>> = first.into_iter().collect();
        // Innermost caller first: the order they would have resumed in.
        for paused in paused.into_iter().rev() {
            frames.push(paused.frame);
            task_replies.push(paused.reply);
        }
        let mut activities = Vec::with_capacity(frames.len());
        for frame in frames {
            activities.push(frame.activity);
            for job in frame.after {
                if let Job::Handoff(handoff) = job {
                    handoffs.push(handoff);
                }
            }
        }
        for job in self.jobs.drain(..) {
            match job {
                Job::Turn(_, _, turn) => turns.push(turn),
                Job::Handoff(handoff) => handoffs.push(handoff),
                Job::EndTask(_) => {}
            }
        }
        self.reply_wanted = false;
        Some(Closing {
            activities,
            turns,
            handoffs,
            tasks: self
                .tasks
                .drain(..)
                .map(|request| (request.task, request.reply))
                .collect(),
            task_replies,
            held: std::mem::take(&mut self.held),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plain stand-ins for the actor's handles.
    struct Plain;
    impl Work for Plain {
        type Activity = &'static str;
        type Turn = &'static str;
        type Handoff = &'static str;
        type Task = &'static str;
        type TaskReply = &'static str;
        type Delivery = &'static str;
    }

    type S = Schedule<Plain>;

    const N: SpeechPriority = SpeechPriority::Normal;

    fn id(name: &str) -> ActorId {
        ActorId::new(format!("activity/s1/{name}"))
    }

    /// A schedule whose first agent `a` has started.
    fn live() -> S {
        let mut s = S::new();
        assert!(s.entering(id("a"), "a"));
        assert!(s.entered(false).is_empty());
        assert_eq!(s.current(), Some(&"a"));
        s
    }

    #[test]
    fn nothing_runs_before_the_first_agent_started() {
        let mut s = S::new();
        s.queue_turn(TurnId::Host(1), "hello", N).unwrap();
        assert!(s.next().is_none());
        assert!(!s.is_inactive());
        assert!(s.entering(id("a"), "a"));
        assert!(s.next().is_none(), "on_enter still runs");
        s.entered(false);
        assert!(matches!(
            s.next(),
            Some(Next::Turn {
                activity: "a",
                turn: "hello"
            })
        ));
    }

    #[test]
    fn turns_run_one_at_a_time_in_order() {
        let mut s = live();
        s.queue_turn(TurnId::Host(1), "one", N).unwrap();
        s.queue_turn(TurnId::Host(2), "two", N).unwrap();
        assert!(matches!(s.next(), Some(Next::Turn { turn: "one", .. })));
        assert!(s.next().is_none(), "one runs");
        s.turn_done(&id("a"), After::Nothing);
        assert!(matches!(s.next(), Some(Next::Turn { turn: "two", .. })));
        s.turn_done(&id("a"), After::Nothing);
        assert!(s.next().is_none());
        assert!(s.is_inactive());
    }

    #[test]
    fn a_handoff_waits_for_the_turn_before_it_and_items_wait_for_the_handoff() {
        let mut s = live();
        s.queue_turn(TurnId::Host(1), "one", N).unwrap();
        s.queue_handoff("to b", false).unwrap();
        assert!(matches!(s.next(), Some(Next::Turn { .. })));
        assert!(s.next().is_none());
        s.turn_done(&id("a"), After::Nothing);
        assert!(matches!(
            s.next(),
            Some(Next::Handoff {
                outgoing: "a",
                handoff: "to b"
            })
        ));
        assert!(s.current().is_none(), "no agent is current mid-switch");
        assert!(matches!(s.route(&Scope::Session, "update"), Route::Held));
        assert!(matches!(
            s.route(&Scope::Activity(id("a")), "late"),
            Route::ScopeClosed("late")
        ));
        s.queue_turn(TurnId::Host(2), "two", N).unwrap();
        assert!(s.next().is_none());
        assert!(s.entering(id("b"), "b"));
        assert_eq!(s.entered(false), vec!["update"]);
        assert!(matches!(
            s.route(&Scope::Session, "next"),
            Route::To("b", "next")
        ));
        assert!(matches!(
            s.next(),
            Some(Next::Turn {
                activity: "b",
                turn: "two"
            })
        ));
    }

    #[test]
    fn a_handoff_a_turn_asks_for_runs_before_anything_queued() {
        let mut s = live();
        s.queue_turn(TurnId::Host(1), "one", N).unwrap();
        assert!(matches!(s.next(), Some(Next::Turn { .. })));
        s.queue_turn(TurnId::Host(2), "two", N).unwrap();
        s.turn_done(&id("a"), After::Handoff("to b"));
        assert!(matches!(
            s.next(),
            Some(Next::Handoff {
                handoff: "to b",
                ..
            })
        ));
    }

    #[test]
    fn a_preempting_handoff_jumps_the_queue_and_names_the_turn_to_interrupt() {
        let mut s = live();
        s.queue_turn(TurnId::Host(1), "slow", N).unwrap();
        s.queue_turn(TurnId::Host(2), "queued", N).unwrap();
        assert!(matches!(s.next(), Some(Next::Turn { turn: "slow", .. })));
        assert_eq!(s.queue_handoff("supervisor", true).unwrap(), Some("a"));
        assert!(s.next().is_none(), "the interrupted turn still has to end");
        s.turn_done(&id("a"), After::Nothing);
        assert!(matches!(
            s.next(),
            Some(Next::Handoff {
                handoff: "supervisor",
                ..
            })
        ));
        // Idle: nothing to interrupt.
        let mut idle = live();
        assert_eq!(idle.queue_handoff("supervisor", true).unwrap(), None);
    }

    #[test]
    fn a_sub_task_starts_at_once_even_mid_turn_and_its_end_resumes_the_caller() {
        let mut s = live();
        s.queue_turn(TurnId::Host(1), "book", N).unwrap();
        assert!(matches!(s.next(), Some(Next::Turn { .. })));
        s.request_task("survey", None, "tool waits").unwrap();
        assert!(matches!(
            s.next(),
            Some(Next::Task {
                caller: "a",
                task: "survey",
                ..
            })
        ));
        assert!(s.in_task());
        assert!(s.entering(id("t"), "t"));
        s.entered(false);
        assert_eq!(s.current(), Some(&"t"));
        assert!(
            s.is_inactive(),
            "the caller's open turn does not make the session busy"
        );
        // User turns go to the task's agent.
        s.queue_turn(TurnId::Host(2), "answer", N).unwrap();
        assert!(matches!(s.next(), Some(Next::Turn { activity: "t", .. })));
        s.turn_done(&id("t"), After::EndTask(Value::from(42)));
        assert!(matches!(s.next(), Some(Next::EndTask { task: "t" })));
        let resumed = s.task_closed(false).unwrap();
        assert_eq!(resumed.caller, "a");
        assert_eq!(resumed.reply, "tool waits");
        assert_eq!(resumed.value, Value::from(42));
        assert!(resumed.held.is_empty());
        assert!(!s.in_task());
        assert!(s.next().is_none(), "the caller's turn is still open");
        s.turn_done(&id("a"), After::Nothing);
        assert!(s.is_inactive());
    }

    fn run_of(run: u64, owner: &str) -> Option<TaskAsker> {
        Some(TaskAsker {
            run,
            scope: Scope::Activity(id(owner)),
        })
    }

    #[test]
    fn a_sub_task_asked_by_a_run_its_callers_pause_stopped_does_not_start() {
        // Two calls of one step of `a` ask for sub-tasks: the first pauses `a`, which
        // stops the second call's run.
        let mut s = live();
        s.queue_turn(TurnId::Host(1), "book", N).unwrap();
        assert!(matches!(s.next(), Some(Next::Turn { .. })));
        s.request_task("first", run_of(1, "a"), "run 1 waits")
            .unwrap();
        assert!(matches!(
            s.next(),
            Some(Next::Task { task: "first", spare, .. }) if spare == [1]
        ));
        s.request_task("second", run_of(2, "a"), "run 2 waits")
            .unwrap();
        // A session-scoped run of `a`'s step is not stopped by the pause; the host waits.
        let session_run = Some(TaskAsker {
            run: 3,
            scope: Scope::Session,
        });
        s.request_task("third", session_run, "run 3 waits").unwrap();
        assert!(s.next().is_none(), "the caller still pauses");
        assert!(s.entering(id("t"), "t"));
        s.entered(false);
        assert!(matches!(
            s.next(),
            Some(Next::DropTask {
                reply: "run 2 waits"
            })
        ));
        assert!(matches!(
            s.next(),
            Some(Next::Task {
                caller: "t",
                task: "third",
                ..
            })
        ));
        // A run of the current agent still asks as before.
        assert!(s.entering(id("u"), "u"));
        s.entered(false);
        s.request_task("fourth", run_of(4, "u"), "run 4 waits")
            .unwrap();
        assert!(matches!(
            s.next(),
            Some(Next::Task {
                caller: "u",
                task: "fourth",
                ..
            })
        ));
    }

    #[test]
    fn a_caller_paused_again_as_it_resumes_spares_the_run_it_handed_the_result_to() {
        let mut s = live();
        s.queue_turn(TurnId::Host(1), "book", N).unwrap();
        assert!(matches!(s.next(), Some(Next::Turn { .. })));
        s.request_task("survey", run_of(1, "a"), "run 1 waits")
            .unwrap();
        assert!(matches!(s.next(), Some(Next::Task { .. })));
        assert!(s.entering(id("t"), "t"));
        s.entered(false);
        s.turn_done(&id("t"), After::EndTask(Value::from(42)));
        assert!(matches!(s.next(), Some(Next::EndTask { .. })));
        assert_eq!(s.task_closed(false).unwrap().reply, "run 1 waits");
        // Run 1 has the result but has not returned its output when the host starts
        // another sub-task: the pause spares it, so the result reaches the step.
        s.request_task("host's", None, "host waits").unwrap();
        assert!(matches!(
            s.next(),
            Some(Next::Task { caller: "a", task: "host's", spare }) if spare == [1]
        ));
    }

    #[test]
    fn playout_reports_reach_the_paused_callers_too() {
        let mut s = live();
        assert_eq!(s.activities(), [&"a"]);
        s.request_task("survey", None, "tool waits").unwrap();
        assert!(matches!(s.next(), Some(Next::Task { .. })));
        assert_eq!(s.activities(), [&"a"], "the caller, while it pauses");
        assert!(s.entering(id("t"), "t"));
        assert_eq!(
            s.activities(),
            [&"t", &"a"],
            "the task's agent, while it enters"
        );
        s.entered(false);
        assert_eq!(
            s.activities(),
            [&"t", &"a"],
            "the task's agent and its paused caller"
        );
        s.close();
        assert!(s.activities().is_empty());
    }

    /// A first sub-task `t1` runs a turn (that will complete it) when a second sub-task is
    /// asked for on top of it, with `t1` as its caller.
    fn second_task_over_a_turn_of_the_first() -> S {
        let mut s = live();
        s.request_task("first task", None, "a waits").unwrap();
        assert!(matches!(s.next(), Some(Next::Task { .. })));
        assert!(s.entering(id("t1"), "t1"));
        s.entered(false);
        s.queue_turn(TurnId::Host(1), "finish", N).unwrap();
        assert!(matches!(s.next(), Some(Next::Turn { activity: "t1", .. })));
        s.request_task("second task", None, "host waits").unwrap();
        assert!(matches!(s.next(), Some(Next::Task { caller: "t1", .. })));
        s
    }

    #[test]
    fn a_paused_task_that_finished_ends_after_the_sub_task_it_started_not_instead_of_it() {
        // The first task's agent runs a turn that completes it, still playing out, when a
        // second sub-task starts on top of it.
        let mut s = second_task_over_a_turn_of_the_first();
        assert!(s.entering(id("t2"), "t2"));
        s.entered(false);
        // The paused turn ends asking to end its task: not the one running now.
        s.turn_done(&id("t1"), After::EndTask(Value::from(1)));
        assert!(s.next().is_none(), "the second task goes on");
        assert_eq!(s.current(), Some(&"t2"));
        s.queue_turn(TurnId::Host(2), "done", N).unwrap();
        assert!(matches!(s.next(), Some(Next::Turn { activity: "t2", .. })));
        s.turn_done(&id("t2"), After::EndTask(Value::from(2)));
        assert!(matches!(s.next(), Some(Next::EndTask { task: "t2" })));
        let resumed = s.task_closed(false).unwrap();
        assert_eq!((resumed.caller, resumed.reply), ("t1", "host waits"));
        assert_eq!(resumed.value, Value::from(2));
        // Now the first task's own end runs, and its caller gets its value.
        assert!(matches!(s.next(), Some(Next::EndTask { task: "t1" })));
        let resumed = s.task_closed(false).unwrap();
        assert_eq!((resumed.caller, resumed.reply), ("a", "a waits"));
        assert_eq!(resumed.value, Value::from(1));
    }

    #[test]
    fn a_task_end_from_a_caller_still_pausing_waits_for_it_too() {
        let mut s = second_task_over_a_turn_of_the_first();
        // t1's turn ends while it is still pausing.
        s.turn_done(&id("t1"), After::EndTask(Value::from(1)));
        assert!(s.entering(id("t2"), "t2"));
        s.entered(false);
        assert!(s.next().is_none(), "the second task goes on");
        s.queue_turn(TurnId::Host(2), "done", N).unwrap();
        assert!(matches!(s.next(), Some(Next::Turn { activity: "t2", .. })));
        s.turn_done(&id("t2"), After::EndTask(Value::from(2)));
        assert!(matches!(s.next(), Some(Next::EndTask { task: "t2" })));
        assert_eq!(s.task_closed(false).unwrap().value, Value::from(2));
        assert!(matches!(s.next(), Some(Next::EndTask { task: "t1" })));
        assert_eq!(s.task_closed(false).unwrap().value, Value::from(1));
    }

    #[test]
    fn a_task_end_with_no_task_running_is_dropped() {
        let mut s = live();
        s.queue_end_task(Value::Null).unwrap();
        s.queue_turn(TurnId::Host(1), "next", N).unwrap();
        assert!(matches!(s.next(), Some(Next::Turn { turn: "next", .. })));
    }

    #[test]
    fn a_handoff_during_a_sub_task_replaces_the_task_agent_and_the_caller_stays_paused() {
        let mut s = live();
        s.request_task("survey", None, "tool waits").unwrap();
        assert!(matches!(s.next(), Some(Next::Task { .. })));
        s.entering(id("t"), "t");
        s.entered(false);
        s.queue_handoff("to t2", false).unwrap();
        assert!(matches!(
            s.next(),
            Some(Next::Handoff { outgoing: "t", .. })
        ));
        assert!(s.in_task(), "the agent that takes over is still a sub-task");
        s.entering(id("t2"), "t2");
        s.entered(false);
        s.queue_end_task(Value::from("done")).unwrap();
        assert!(matches!(s.next(), Some(Next::EndTask { task: "t2" })));
        assert_eq!(s.task_closed(false).unwrap().caller, "a");
    }

    #[test]
    fn deferred_items_coalesce_and_wait_for_an_idle_agent() {
        let mut s = live();
        s.queue_turn(TurnId::Host(1), "one", N).unwrap();
        assert!(matches!(s.next(), Some(Next::Turn { .. })));
        s.wants_reply();
        s.wants_reply();
        assert!(s.next().is_none(), "the turn runs");
        assert!(!s.is_inactive());
        s.turn_done(&id("a"), After::Nothing);
        assert!(matches!(s.next(), Some(Next::Settle)));
        assert!(s.next().is_none(), "settling");
        // An update that lands while the session settles joins the same reply.
        s.wants_reply();
        s.settled();
        assert!(matches!(s.next(), Some(Next::Deferred { activity: "a" })));
        assert!(s.next().is_none(), "the reply runs");
        s.wants_reply();
        s.turn_done(&id("a"), After::Nothing);
        assert!(
            matches!(s.next(), Some(Next::Settle)),
            "one more reply, settled first"
        );
        s.settled();
        assert!(matches!(s.next(), Some(Next::Deferred { .. })));
        s.turn_done(&id("a"), After::Nothing);
        assert!(s.next().is_none(), "nothing more was wanted");
        assert!(s.is_inactive());
    }

    #[test]
    fn a_turn_queued_while_the_session_settles_goes_first() {
        let mut s = live();
        s.wants_reply();
        assert!(matches!(s.next(), Some(Next::Settle)));
        s.queue_turn(TurnId::Host(1), "user", N).unwrap();
        assert!(matches!(s.next(), Some(Next::Turn { turn: "user", .. })));
        s.settled();
        assert!(s.next().is_none(), "the turn runs");
        s.turn_done(&id("a"), After::Nothing);
        assert!(
            matches!(s.next(), Some(Next::Settle)),
            "settles again after the turn"
        );
        s.settled();
        assert!(matches!(s.next(), Some(Next::Deferred { .. })));
    }

    #[test]
    fn queued_turns_go_before_the_deferred_reply() {
        let mut s = live();
        s.wants_reply();
        s.queue_turn(TurnId::Host(1), "user", N).unwrap();
        assert!(matches!(s.next(), Some(Next::Turn { .. })));
    }

    #[test]
    fn a_switch_hands_the_wanted_reply_to_the_agent_that_takes_over() {
        let mut s = live();
        s.wants_reply();
        s.queue_handoff("to b", false).unwrap();
        assert!(matches!(s.next(), Some(Next::Handoff { .. })));
        // Mid-switch nothing is current: a wish for a reply has nowhere to go.
        s.wants_reply();
        s.entering(id("b"), "b");
        // The outgoing agent had only its own items pending: none came over.
        s.entered(false);
        assert!(s.next().is_none());
        assert!(s.is_inactive());
        s.queue_handoff("to c", false).unwrap();
        assert!(matches!(s.next(), Some(Next::Handoff { .. })));
        s.entering(id("c"), "c");
        // Session-scoped items came over with the switch: c answers them.
        s.entered(true);
        assert!(matches!(s.next(), Some(Next::Settle)));
        s.settled();
        assert!(matches!(s.next(), Some(Next::Deferred { activity: "c" })));
    }

    #[test]
    fn a_task_hands_the_wanted_reply_back_to_its_caller() {
        let mut s = live();
        s.wants_reply();
        s.request_task("survey", None, "tool waits").unwrap();
        assert!(matches!(s.next(), Some(Next::Task { .. })));
        s.entering(id("t"), "t");
        s.entered(true);
        s.queue_end_task(Value::Null).unwrap();
        assert!(matches!(s.next(), Some(Next::EndTask { .. })));
        s.task_closed(true).unwrap();
        s.turn_done(&id("a"), After::Nothing);
        assert!(matches!(s.next(), Some(Next::Settle)));
    }

    #[test]
    fn a_dropped_run_future_dequeues_or_interrupts_its_turn() {
        let mut s = live();
        s.queue_turn(TurnId::Host(1), "running", N).unwrap();
        s.queue_turn(TurnId::Host(2), "queued", N).unwrap();
        assert!(matches!(s.next(), Some(Next::Turn { .. })));
        assert!(matches!(s.cancel_turn(2), Cancelled::Dequeued("queued")));
        assert!(matches!(s.cancel_turn(1), Cancelled::Running("a")));
        assert!(matches!(s.cancel_turn(9), Cancelled::NotFound));
        s.turn_done(&id("a"), After::Nothing);
        assert!(s.next().is_none(), "the cancelled turn is gone");
    }

    #[test]
    fn turns_run_by_priority_then_arrival() {
        let mut s = live();
        s.queue_turn(TurnId::Host(1), "running", N).unwrap();
        assert!(matches!(s.next(), Some(Next::Turn { .. })));
        s.queue_turn(TurnId::Engine, "normal 1", N).unwrap();
        s.queue_turn(TurnId::Engine, "low", SpeechPriority::Low)
            .unwrap();
        s.queue_turn(TurnId::Engine, "normal 2", N).unwrap();
        s.queue_turn(TurnId::Engine, "high", SpeechPriority::High)
            .unwrap();
        let mut order = Vec::new();
        loop {
            s.turn_done(&id("a"), After::Nothing);
            match s.next() {
                Some(Next::Turn { turn, .. }) => order.push(turn),
                _ => break,
            }
        }
        assert_eq!(order, ["high", "normal 1", "normal 2", "low"]);
    }

    #[test]
    fn a_queued_turn_can_be_taken_back() {
        let mut s = live();
        s.queue_turn(TurnId::Host(1), "running", N).unwrap();
        assert!(matches!(s.next(), Some(Next::Turn { .. })));
        s.queue_turn(TurnId::Engine, "say hello", N).unwrap();
        s.queue_turn(TurnId::Engine, "say bye", N).unwrap();
        assert_eq!(s.remove_turn(|t| *t == "say hello"), Some("say hello"));
        assert_eq!(s.remove_turn(|t| *t == "say hello"), None);
        s.turn_done(&id("a"), After::Nothing);
        assert!(matches!(
            s.next(),
            Some(Next::Turn {
                turn: "say bye",
                ..
            })
        ));
    }

    #[test]
    fn the_deferred_reply_waits_while_the_user_speaks() {
        let mut s = live();
        s.set_user(UserState::Speaking);
        s.wants_reply();
        assert!(s.next().is_none());
        assert!(!s.is_inactive(), "the user speaking is not inactive");
        // A user turn still runs (it is how the user's words get in).
        s.queue_turn(TurnId::Engine, "user", N).unwrap();
        assert!(matches!(s.next(), Some(Next::Turn { turn: "user", .. })));
        s.turn_done(&id("a"), After::Nothing);
        assert!(s.next().is_none());
        s.set_user(UserState::Listening);
        assert!(matches!(s.next(), Some(Next::Settle)));
        s.settled();
        assert!(matches!(s.next(), Some(Next::Deferred { .. })));
    }

    #[test]
    fn the_queue_is_bounded() {
        let mut s = live();
        for _ in 0..MAX_QUEUED {
            s.queue_turn(TurnId::Engine, "reply", N).unwrap();
        }
        assert!(matches!(
            s.queue_turn(TurnId::Engine, "one too many", N),
            Err(("one too many", Refusal::QueueFull { .. }))
        ));
    }

    #[test]
    fn close_hands_back_every_activity_and_everything_waiting_once() {
        let mut s = live();
        s.request_task("survey", None, "tool waits").unwrap();
        assert!(matches!(s.next(), Some(Next::Task { .. })));
        s.entering(id("t"), "t");
        s.entered(false);
        s.queue_handoff("to b", false).unwrap();
        assert!(matches!(s.next(), Some(Next::Handoff { .. })));
        s.queue_turn(TurnId::Host(1), "waiting", N).unwrap();
        assert!(matches!(s.route(&Scope::Session, "held"), Route::Held));
        let closing = s.close().unwrap();
        assert_eq!(closing.activities, ["t", "a"]);
        assert_eq!(closing.turns, ["waiting"]);
        assert_eq!(closing.task_replies, ["tool waits"]);
        assert_eq!(closing.held, ["held"]);
        assert!(s.close().is_none(), "a second close has nothing to do");
        assert!(matches!(
            s.queue_turn(TurnId::Host(2), "late", N),
            Err((_, Refusal::Closed))
        ));
        assert!(matches!(
            s.route(&Scope::Session, "late"),
            Route::SessionClosed(_)
        ));
        assert!(
            !s.entering(id("b"), "b"),
            "a switch finishing after close starts nothing"
        );
        assert!(s.next().is_none());
    }

    #[test]
    fn a_close_while_a_caller_pauses_fails_its_task() {
        let mut s = live();
        s.request_task("survey", None, "tool waits").unwrap();
        assert!(matches!(s.next(), Some(Next::Task { .. })));
        let closing = s.close().unwrap();
        assert_eq!(closing.activities, ["a"]);
        assert_eq!(closing.task_replies, ["tool waits"]);
    }
}
