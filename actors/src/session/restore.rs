//! Starting a session again from a snapshot: the host side checks everything
//! first ([`RestorePlan`]: schema, the session's part, every agent from the registry,
//! every running call's toolset and tool, user data), so nothing starts on a snapshot that
//! cannot be restored. Then the session hands each machine its own part back: it
//! rebuilds its history, ids and counters, starts its toolsets with the calls they were
//! running, spawns the live activations where they were (no `on_enter`) with theirs, puts
//! its schedule back, and asks again the LLM step whose model had not answered.
//!
//! Each running call follows its tool's restore policy, in its toolset: a call of a step
//! still open gets its output into that step — a step whose calls started is never asked
//! again — and a call in the background goes on there, or ends. A call whose body awaited
//! a sub-task still running gets a run that stands for it: the task's result is its
//! output, after the same hops as the body's `run_task` answer.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use actix::prelude::*;
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::schedule::{JobState, RestoredFrame, RestoredJob, Schedule};
use super::snapshot::{Counters, LiveState, SessionState, Tie, Written};
use super::{ActivityRef, HandoffDone, PlannedHandoff, QueuedTurn, SessionActor};
use crate::activity::{
    ActivityActor, ActivitySpec, Restored, RestoredActivity, RestoredCalls, TaskResult, TurnKind,
    TurnOutcome,
};
use crate::agent::Agent;
use crate::chat::ChatContext;
use crate::delivery::DeliveryAnswer;
use crate::error::SessionError;
use crate::history::{AgentChat, SubTaskOf};
use crate::ids::ActorId;
use crate::input_ledger::InputLedger;
use crate::realtime::Model;
use crate::snapshot::{ActivationRecord, SessionSnapshot, SnapshotError};
use crate::speech::Interruptibility;
use crate::telemetry::Cause;
use crate::tool::Toolset;
use crate::toolset::{RestoredRun, RunState, ToolsetState};

/// What a restore starts from: the snapshot and the session's part of it, and the agents
/// it names, built from the registry and checked against this session before anything
/// started.
pub(crate) struct RestorePlan {
    snapshot: SessionSnapshot,
    state: SessionState,
    /// The agents of the live activations, in stack order.
    live: Vec<(Agent, Model)>,
    /// The agents of the queued handoffs, in the order the snapshot lists them: the
    /// session's jobs, then each live activation's frame.
    handoffs: VecDeque<(Agent, Model)>,
    /// Per live activation, the agents that outputs of its open step hand off to, in call
    /// order.
    output_handoffs: Vec<VecDeque<Agent>>,
}

fn corrupt(reason: impl Into<String>) -> SessionError {
    SnapshotError::Corrupt {
        reason: reason.into(),
    }
    .into()
}

impl RestorePlan {
    /// Builds every agent the snapshot names with `build` (the registry) and checks it can
    /// start here with `check` (its model, its tool names), and that every running call's
    /// toolset and tool are here — the session's `toolsets`, or its agent's: a snapshot
    /// that cannot be restored fails here, before anything starts.
    pub(crate) fn new(
        snapshot: SessionSnapshot,
        build: impl Fn(&str, &Value) -> Result<Agent, SessionError>,
        check: impl Fn(&Agent) -> Result<Model, SessionError>,
        toolsets: &[Toolset],
    ) -> Result<Self, SessionError> {
        let state: SessionState = serde_json::from_value(snapshot.head.state.clone())
            .map_err(|err| corrupt(format!("the session's state does not read: {err}")))?;
        if state.stack.is_empty() {
            return Err(corrupt("no agent is current"));
        }
        if state.stack.len() != state.schedule.frames.len() {
            return Err(corrupt(format!(
                "{} live activations and {} frames",
                state.stack.len(),
                state.schedule.frames.len()
            )));
        }
        let mut live = Vec::with_capacity(state.stack.len());
        for entry in &state.stack {
            let record = record_of(&snapshot, entry.order)?;
            let agent = build(&record.agent, &record.data)?;
            let llm = check(&agent)?;
            for toolset in &entry.toolsets {
                check_calls(toolset, agent_toolset(&agent, &toolset.name))?;
            }
            live.push((agent, llm));
        }
        for toolset in &state.toolsets {
            let found = toolsets
                .iter()
                .find(|t| t.name == toolset.name)
                .map(|t| t.tools.as_slice());
            check_calls(toolset, found)?;
        }
        let mut handoffs = VecDeque::new();
        let queued = state
            .schedule
            .jobs
            .iter()
            .chain(state.schedule.frames.iter().flat_map(|f| f.after.iter()));
        for job in queued {
            if let JobState::Handoff(handoff) = job {
                let agent = build(&handoff.agent, &handoff.data)?;
                let llm = check(&agent)?;
                handoffs.push_back((agent, llm));
            }
        }
        let mut output_handoffs = Vec::with_capacity(state.stack.len());
        for entry in &state.stack {
            let mut agents = VecDeque::new();
            let outputs = entry
                .activation
                .step
                .iter()
                .flat_map(|step| step.outputs.iter().flatten());
            for output in outputs {
                if let crate::outcome::EffectState::Handoff(handoff) = &output.effect {
                    let agent = build(&handoff.agent, &handoff.data)?;
                    check(&agent)?;
                    agents.push_back(agent);
                }
            }
            output_handoffs.push(agents);
        }
        Ok(Self {
            snapshot,
            state,
            live,
            handoffs,
            output_handoffs,
        })
    }
}

/// The record of the activation with this order.
fn record_of(snapshot: &SessionSnapshot, order: u32) -> Result<&ActivationRecord, SessionError> {
    snapshot
        .activations
        .iter()
        .find(|a| a.order == order)
        .ok_or_else(|| corrupt(format!("live activation {order} has no record")))
}

/// The tools of `agent`'s own toolset `name` (`tools`: its bare tools), if it has it.
fn agent_toolset<'a>(agent: &'a Agent, name: &str) -> Option<&'a [crate::tool::Tool]> {
    if name == "tools" && !agent.def.tools.is_empty() {
        return Some(&agent.def.tools);
    }
    agent
        .def
        .toolsets
        .iter()
        .find(|t| t.name == name)
        .map(|t| t.tools.as_slice())
}

/// Every call of `toolset` needs the toolset (`tools`) and its tool on the restoring side:
/// else its restore policy cannot be honoured, which is refused, not silently abandoned.
fn check_calls(
    toolset: &ToolsetState,
    tools: Option<&[crate::tool::Tool]>,
) -> Result<(), SessionError> {
    for run in &toolset.runs {
        let call_id = run.call.call_id.clone();
        let tool = run.call.name.clone();
        let name = toolset.name.clone();
        match tools {
            None => {
                return Err(SnapshotError::UnknownToolset {
                    call_id,
                    tool,
                    toolset: name,
                }
                .into())
            }
            Some(tools) if !tools.iter().any(|t| t.name() == tool) => {
                return Err(SnapshotError::UnknownTool {
                    call_id,
                    tool,
                    toolset: name,
                }
                .into())
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// Each activation's whole chat, its inherited items taken from the activation they were
/// written with. An activation that inherited the whole of its source's chat goes on from
/// that chat itself (the items are appended in place, as they were when it started): the
/// two share their items again, so the next snapshot writes the inherited ones once, as a
/// reference, as the snapshot restored from did.
fn chats(records: &[ActivationRecord]) -> HashMap<u32, ChatContext> {
    let mut chats: HashMap<u32, ChatContext> = HashMap::new();
    for record in records {
        let mut chat = match record.inherited_from.and_then(|from| chats.get(&from)) {
            Some(source) if source.len() == record.inherited => source.clone(),
            Some(source) => {
                let mut chat = ChatContext::new();
                chat.extend(
                    source.items()[..record.inherited.min(source.len())]
                        .iter()
                        .cloned(),
                );
                chat
            }
            None => ChatContext::new(),
        };
        chat.extend(record.items.iter().cloned());
        chats.insert(record.order, chat);
    }
    chats
}

/// The generation an activity id carries (`activity/s1/booker#2` → 2).
fn generation_of(activity: &str) -> u32 {
    activity
        .rsplit('#')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
}

/// For a restored call whose `repeat` (an update whose answer had not reached its body) is
/// held in a live activation's open step: the answer the body saying it again waits for,
/// its sender put with that activation's held items (`held_answers`, in stack order).
pub(super) fn held_repeat(
    state: &RunState,
    stack: &[LiveState],
    held_answers: &mut [HashMap<String, DeliveryAnswer>],
) -> Option<crate::toolset::RepeatAnswer> {
    state.repeat?;
    let id = state.newest_update();
    let at = stack.iter().position(|live| {
        live.activation
            .step
            .as_ref()
            .is_some_and(|step| step.holds(&id))
    })?;
    let slot = Arc::new(crate::delivery::AnswerSlot::default());
    held_answers
        .get_mut(at)?
        .insert(id, DeliveryAnswer::to_slot(slot.clone()));
    Some(slot)
}

/// Sent by the session to itself as it restores a call that awaits a sub-task (see
/// `SessionActor::task_answer`): answered with the task's result once `result` hears it,
/// as `RunTask` is.
pub(crate) struct AwaitTask {
    result: oneshot::Receiver<TaskResult>,
}

impl Message for AwaitTask {
    type Result = TaskResult;
}

impl Handler<AwaitTask> for SessionActor {
    type Result = ResponseFuture<TaskResult>;

    fn handle(&mut self, msg: AwaitTask, _ctx: &mut Self::Context) -> Self::Result {
        Box::pin(async move { msg.result.await.unwrap_or(Err(SessionError::Closed)) })
    }
}

/// A live activation on its way back: what the session prepares for it before it spawns.
struct Returning {
    /// Outputs of its open step's calls of session toolsets, by call id.
    step_outputs: HashMap<String, oneshot::Receiver<crate::outcome::CallOutput>>,
    /// Whether its open step's turn may be interrupted (shared with its calls' runs).
    interruptibility: Arc<Interruptibility>,
}

impl SessionActor {
    /// Starts the session again from a snapshot (see the module docs).
    pub(super) fn restore(&mut self, plan: RestorePlan, ctx: &mut Context<Self>) {
        let RestorePlan {
            snapshot,
            state,
            live,
            mut handoffs,
            output_handoffs,
        } = plan;
        let SessionState {
            schedule,
            stack,
            toolsets,
            user_words,
            generations,
            counters,
        } = state;
        let Counters {
            activations,
            speech,
            step,
            run,
        } = counters;
        self.shared.ids.restore_counters(speech, step, run);
        self.shared.ids.reserve_issued(&snapshot.call_ids);
        *self.shared.host_view.inputs() =
            InputLedger::restored(snapshot.head.last_input, &snapshot.head.inputs);
        self.shared
            .metrics
            .restore(&snapshot.head.usage, &snapshot.head.latency);
        if let Some(words) = user_words {
            self.endpoint.restore(words, Instant::now());
            self.arm();
        }
        self.started = activations;
        self.generations = generations.into_iter().collect();
        let chats = chats(&snapshot.activations);
        let live_orders: HashSet<u32> = stack.iter().map(|l| l.order).collect();
        self.restore_chain(&snapshot, &chats, &live_orders);
        let mut next_handoff = |job: &JobState| -> Option<RestoredJob<super::Actors>> {
            Some(match job {
                JobState::Handoff(state) => {
                    let (agent, llm) = handoffs.pop_front()?;
                    RestoredJob::Handoff(PlannedHandoff {
                        handoff: state.restore(agent),
                        llm,
                        done: HandoffDone::Nobody,
                        cause: Cause::default(),
                    })
                }
                JobState::Reply { instructions } => RestoredJob::Turn(QueuedTurn {
                    kind: TurnKind::Reply(instructions.clone()),
                    reply: None,
                    cause: Cause::default(),
                    tie: Tie::None,
                }),
                JobState::EndTask { value } => RestoredJob::EndTask(value.clone()),
            })
        };
        let mut jobs: Vec<RestoredJob<super::Actors>> =
            schedule.jobs.iter().filter_map(&mut next_handoff).collect();
        let depth = stack.len();
        let in_task = depth > 1;
        // Who waits for each paused caller's sub-task: its run that asked (a run stands
        // for it, awaiting the task's result), or — a host's `run_task` — nobody here: the
        // host was in the old process.
        let mut awaits: HashMap<u64, BoxFuture<'static, TaskResult>> = HashMap::new();
        let mut task_replies = Vec::with_capacity(depth);
        for frame in &schedule.frames[..depth.saturating_sub(1)] {
            let (reply, result) = oneshot::channel::<TaskResult>();
            if let Some(key) = frame.asker {
                awaits.insert(key, self.task_answer(result));
            }
            task_replies.push(reply);
        }
        // The session toolsets' calls: those of an open step go there (through a channel
        // the step's activity listens on), the others run on in the background.
        let session_tools: HashMap<String, String> = self
            .toolset_defs
            .iter()
            .flat_map(|def| {
                def.tools
                    .iter()
                    .map(|t| (t.name().to_owned(), def.name.clone()))
            })
            .collect();
        let mut written: HashMap<String, (String, RunState)> = toolsets
            .into_iter()
            .flat_map(|toolset| {
                let name = toolset.name;
                toolset
                    .runs
                    .into_iter()
                    .map(move |run| (run.call.call_id.clone(), (name.clone(), run)))
            })
            .collect();
        let mut session_runs: HashMap<String, Vec<RestoredRun>> = HashMap::new();
        let mut returning = Vec::with_capacity(depth);
        // Whether a step's turn may be interrupted is one thing its calls share (a tool that
        // holds interruptions off holds them for its siblings too): one per step, whichever
        // toolsets its calls run in.
        let allows = |agent: &Agent| {
            agent
                .def
                .allow_interruptions
                .unwrap_or(self.shared.settings.config.allow_interruptions)
        };
        let mut steps: HashMap<u64, Arc<Interruptibility>> = HashMap::new();
        for (index, entry) in stack.iter().enumerate() {
            let agent = &live[index].0;
            let interruptibility = match &entry.activation.step {
                Some(open) => steps
                    .entry(open.step)
                    .or_insert_with(|| Interruptibility::new(allows(agent)))
                    .clone(),
                None => Interruptibility::new(allows(agent)),
            };
            let mut step_outputs = HashMap::new();
            let waiting = entry
                .activation
                .step
                .iter()
                .flat_map(|s| s.waiting().map(move |(_, call)| (s.step, call)));
            for (step, call) in waiting {
                let Some(toolset) = session_tools.get(&call.name) else {
                    continue;
                };
                let state = match written.remove(&call.call_id) {
                    Some((_, state)) => state,
                    // It had not started: it starts now, under its tool's policy.
                    None => RunState {
                        key: self.shared.ids.next_run(),
                        step,
                        call: call.clone(),
                        updates: 0,
                        said: Vec::new(),
                        checkpoint: None,
                        repeat: None,
                        unanswered: false,
                        last_said: None,
                    },
                };
                let (tx, rx) = oneshot::channel();
                step_outputs.insert(call.call_id.clone(), rx);
                let awaits = awaits.remove(&state.key);
                session_runs
                    .entry(toolset.clone())
                    .or_default()
                    .push(RestoredRun {
                        state,
                        agent: agent.clone(),
                        is_task: index > 0,
                        step: Some(tx),
                        interruptibility: interruptibility.clone(),
                        awaits,
                        repeat_answer: None,
                    });
            }
            returning.push(Returning {
                step_outputs,
                interruptibility,
            });
        }
        let current_agent = live[depth - 1].0.clone();
        let background_steps = written.values().map(|(_, state)| state.step).chain(
            stack
                .iter()
                .flat_map(|l| l.toolsets.iter().flat_map(|t| t.runs.iter()))
                .map(|run| run.step),
        );
        for step in background_steps.collect::<Vec<_>>() {
            steps
                .entry(step)
                .or_insert_with(|| Interruptibility::new(allows(&current_agent)));
        }
        // An update a call delivered, held until its step is in, whose answer had not
        // reached the body: the body saying it again waits for that item to land.
        let mut held_answers: Vec<HashMap<String, DeliveryAnswer>> =
            std::iter::repeat_with(HashMap::new).take(depth).collect();
        for (_, (toolset, state)) in written {
            let awaits = awaits.remove(&state.key);
            let repeat_answer = held_repeat(&state, &stack, &mut held_answers);
            session_runs
                .entry(toolset)
                .or_default()
                .push(RestoredRun::in_background(
                    state,
                    current_agent.clone(),
                    in_task,
                    &steps,
                    awaits,
                    repeat_answer,
                ));
        }
        for runs in session_runs.values_mut() {
            runs.sort_by_key(|run| run.state.key);
        }
        self.start_toolsets(session_runs);
        let session_id = self.shared.id().clone();
        let sub_task_of = |record: &ActivationRecord| {
            record.sub_task_of.as_ref().map(|s| SubTaskOf {
                caller: ActorId::new(s.caller.as_str()),
                after: s.after,
            })
        };
        let mut paused = Vec::new();
        let mut current = None;
        let mut task_replies = task_replies.into_iter();
        let parts = stack
            .into_iter()
            .zip(live)
            .zip(schedule.frames)
            .zip(returning)
            .zip(output_handoffs)
            .zip(held_answers);
        for (index, (((((entry, (agent, llm)), frame), returning), handoffs), held_answers)) in
            parts.enumerate()
        {
            let is_current = index + 1 == depth;
            let Some(record) = snapshot.activations.iter().find(|a| a.order == entry.order) else {
                continue;
            };
            let generation = generation_of(&record.activity);
            let id = ActorId::activity(&session_id, agent.name(), generation);
            let LiveState {
                order,
                activation,
                toolsets,
            } = entry;
            let (turn_done, outcome) = match activation.step {
                Some(_) => {
                    let (done, outcome) = oneshot::channel::<TurnOutcome>();
                    (Some(done), Some(outcome))
                }
                None => (None, None),
            };
            let in_turn = turn_done.is_some();
            let redo = activation.redo.clone().filter(|_| is_current);
            let pending = !activation.pending.is_empty();
            // The results of the sub-tasks its own runs awaited.
            let own_awaits = toolsets
                .iter()
                .flat_map(|t| t.runs.iter())
                .filter_map(|run| Some((run.key, awaits.remove(&run.key)?)))
                .collect();
            // A realtime agent's connection: the one the session keeps for its model (a
            // caller and its sub-task share it), new to this process.
            let realtime = self.realtime_link(&llm);
            let child = ActivityActor::spawn(ActivitySpec {
                agent: agent.clone(),
                llm,
                realtime,
                generation,
                is_task: index > 0,
                shared: self.shared.clone(),
                links: self.links.clone(),
                session_toolsets: self.toolsets.clone(),
                chat: chats.get(&order).cloned().unwrap_or_default(),
                order,
                inherited: Some(record.inherited),
                sub_task_of: sub_task_of(record),
                handoff_from: None,
                carried: Vec::new(),
                restored: Some(RestoredActivity {
                    machine: Restored {
                        state: activation,
                        paused: !is_current,
                        turn_done,
                        handoffs,
                        interruptibility: returning.interruptibility,
                        held_answers,
                    },
                    calls: RestoredCalls {
                        toolsets,
                        step_outputs: returning.step_outputs,
                        awaits: own_awaits,
                        steps: steps.clone(),
                        repeats: HashMap::new(),
                    },
                }),
            });
            let activity = ActivityRef {
                child,
                agent: agent.clone(),
                sub_task_of: sub_task_of(record),
            };
            if let Some(outcome) = outcome {
                let (waiting_id, name) = (id.clone(), agent.name().to_owned());
                ctx.spawn(outcome.into_actor(self).map(move |outcome, act, ctx| {
                    let outcome =
                        outcome.unwrap_or_else(|_| TurnOutcome::failed(SessionError::Closed));
                    act.turn_done(&waiting_id, &name, outcome, None, ctx);
                }));
            }
            let after = frame.after.iter().filter_map(&mut next_handoff).collect();
            let restored = RestoredFrame {
                id,
                activity,
                in_turn,
                after,
            };
            if is_current {
                if let Some(redo) = redo {
                    // The step whose model had not answered is asked again, first.
                    jobs.insert(
                        0,
                        RestoredJob::Turn(QueuedTurn {
                            kind: TurnKind::Redo(redo),
                            reply: None,
                            cause: Cause::default(),
                            tie: Tie::None,
                        }),
                    );
                }
                current = Some((restored, pending));
            } else {
                let reply = task_replies.next().unwrap_or_else(|| oneshot::channel().0);
                paused.push((restored, reply, frame.asker));
            }
        }
        let Some((current, pending)) = current else {
            // Not reached: the plan checked that an agent is current.
            self.begin_close("the snapshot has no current agent", ctx);
            return;
        };
        self.schedule = Schedule::restored(paused, current, jobs, schedule.reply_wanted || pending);
        if schedule.user_speaking {
            // The user still speaks (a barge-in under way is the activation's, restored
            // with it).
            self.user_started(Instant::now());
        }
        self.switched(ctx);
        self.pump(ctx);
    }

    /// The chain goes on from the snapshot (the next delta follows it), what it wrote of
    /// each activation remembered; the closed activations go back into the history.
    fn restore_chain(
        &mut self,
        snapshot: &SessionSnapshot,
        chats: &HashMap<u32, ChatContext>,
        live: &HashSet<u32>,
    ) {
        self.chain.started = true;
        self.chain.seq = snapshot.seq;
        self.chain.call_ids = snapshot.call_ids.len();
        for record in &snapshot.activations {
            self.chain.activation_started(record.order, &record.data);
            let chat = chats.get(&record.order).cloned().unwrap_or_default();
            let from = if record.inherited_from.is_some() {
                record.inherited
            } else {
                0
            };
            self.chain.written.insert(
                record.order,
                Written {
                    chat: chat.clone(),
                    from,
                },
            );
            if !live.contains(&record.order) {
                self.shared.history.record(
                    record.order,
                    AgentChat {
                        agent: record.agent.clone(),
                        activity: ActorId::new(record.activity.as_str()),
                        chat,
                        inherited: record.inherited,
                        live: false,
                        sub_task_of: record.sub_task_of.as_ref().map(|s| SubTaskOf {
                            caller: ActorId::new(s.caller.as_str()),
                            after: s.after,
                        }),
                    },
                );
            }
        }
    }

    /// What a run standing for a restored call that awaits a sub-task hears: the task's
    /// result, as the session's answer to an `AwaitTask` it sends itself. Why not hand
    /// the run `result` itself: a body's `ctx.run_task` hears the result as the session's
    /// answer to its `RunTask`, and the standing run must hear it after the same hops, or
    /// a background tool's items racing the caller's resume land on the other side of the
    /// caller's step than they would have before the snapshot.
    fn task_answer(&self, result: oneshot::Receiver<TaskResult>) -> BoxFuture<'static, TaskResult> {
        // Once per restored call awaiting a sub-task.
        let ask = self
            .links
            .session
            .ask(self.probe.id(), AwaitTask { result });
        async move { ask.await.unwrap_or(Err(SessionError::Closed)) }.boxed()
    }
}
