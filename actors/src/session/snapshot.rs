//! Snapshots of a session: taking one, in full or as a delta, and saving after every
//! settled turn. Restoring is `restore.rs`.
//!
//! **Taking one.** The session waits for a switch under way to end (a handoff or a
//! sub-task's start or end: the snapshot is of a settled stack of agents), holds new work
//! back while it collects, and assembles the snapshot from its machines' own parts: each
//! live activation's (`SnapshotActivation`: its state, its chat as committed, its own
//! toolsets' calls read from their books in the same handler, answered in mailbox order
//! after every item relayed to it before), each session toolset's (read from its book as
//! the activations are asked), the schedule's, and what the session keeps itself — the
//! closed activations from the history, the user's words waiting, the ids and counters.
//! The parts agree by construction but for outputs on their way while it collected: a
//! call whose immediate output had not reached its step is written as a call of its step
//! still (its tool's restore policy decides again), and an update sent and not yet in a
//! chat context is not counted as delivered.
//!
//! **Recording a call.** In a session that saves to a store, the body of an `Abandon`
//! tool's call starts only once a stored snapshot holds the call (`RecordCall`, from the
//! call's run, after its toolset entered it in its book): the session gathers the calls
//! asking (a few yields to the arbiter, so the calls of one step ask together), takes one
//! snapshot — a delta when the store holds what it follows, decided as it is written — and
//! queues it for its writer; each call hears how the write went. A call that asks while
//! one is collected joins it when that snapshot holds it, else the next.
//!
//! **The chain.** Each snapshot or delta is a link: a full one starts the chain at its
//! `seq`, a delta moves it on by one. The session remembers what it wrote of each
//! activation's chat context (a reference-counted clone: nothing is copied), so a delta
//! carries only the items appended since — or, after a chat was cut (a playout report,
//! a hook's rewrite), those after the first that changed.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use actix::prelude::*;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::oneshot;

use super::saver::{SaveNow, Saver, Waiter};
use super::schedule::{JobState, JobView, ScheduleState, TurnId};
use super::{ActivityRef, SessionActor};
use crate::activity::{ActivationSnapshot, ActivationState, Decided, SnapshotActivation, TurnKind};
use crate::chat::{ChatContext, ChatItem};
use crate::error::SessionError;
use crate::history::{AgentChat, SubTaskOf};
use crate::input_ledger::LedgerRecord;
use crate::latency::SessionLatency;
use crate::shared::SessionShared;
use crate::snapshot::{
    ActivationRecord, ChatChange, SessionSnapshot, SnapshotDelta, SnapshotHead, StoreError,
    SubTaskRecord, SNAPSHOT_VERSION,
};
use crate::snapshot_store::{Claim, SnapshotStore};
use crate::toolset::ToolsetState;
use crate::usage::SessionUsage;

/// A snapshot as the host asked for it: in full, or what changed since the last one.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum SnapshotUpdate {
    /// The whole session (the first of a chain, or when asked for in full).
    Full(SessionSnapshot),
    /// What changed since the snapshot or delta taken before it.
    Delta(SnapshotDelta),
}

/// Sent by the host (`Session::snapshot`, `Session::snapshot_update`, `Session::save`):
/// takes a snapshot at the last consistent point, in full or as a delta on the chain.
/// Answered once the parts are in (and, to `save`, once the session's store wrote it);
/// during a switch, once the switch has ended.
pub(crate) struct TakeSnapshot {
    pub(crate) full: bool,
    /// Written to the session's store (`Session::save`): in full, through its saving.
    pub(crate) save: bool,
}

impl Message for TakeSnapshot {
    type Result = Result<SnapshotUpdate, SessionError>;
}

impl Handler<TakeSnapshot> for SessionActor {
    type Result = ResponseFuture<Result<SnapshotUpdate, SessionError>>;

    fn handle(&mut self, msg: TakeSnapshot, ctx: &mut Self::Context) -> Self::Result {
        let (tx, rx) = oneshot::channel();
        let taker = if msg.save {
            Taker::Save(tx)
        } else {
            Taker::Host(tx)
        };
        self.snapshot(msg.full || msg.save, taker, ctx);
        Box::pin(async move { rx.await.unwrap_or(Err(SessionError::Closed)) })
    }
}

/// Sent by a run (`SessionLinks::record_call`) before the body of an `Abandon` tool's call
/// starts, in a session that saves to a store: answered once a snapshot holding the call
/// is written to the store, or with why it was not (no store, fenced, the write failed, the
/// session closed). One per such call.
pub(crate) struct RecordCall {
    pub(crate) call_id: String,
    pub(crate) answer: Waiter,
}

impl Message for RecordCall {
    type Result = ();
}

impl Handler<RecordCall> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: RecordCall, ctx: &mut Self::Context) {
        self.record_call(msg, ctx);
    }
}

/// How many yields to the arbiter the session waits for the other calls of a step to ask
/// to be recorded before it takes the snapshot: each call's run asks a task hop or two
/// after its toolset took the call.
const GATHER_ROUNDS: u32 = 4;

/// Calls waiting for a stored snapshot that holds them.
#[derive(Default)]
pub(super) enum Recording {
    /// None.
    #[default]
    Idle,
    /// Gathering the calls of a step before the snapshot is taken.
    Gathering(Vec<RecordCall>),
    /// A snapshot is collected for the calls gathered; these asked meanwhile.
    Collecting(Vec<RecordCall>),
}

/// What ties a queued turn to a host input id.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Tie {
    /// None: the engine's own turns, and host turns sent without an id.
    #[default]
    None,
    /// The host input it is the effect of (`Session::apply`).
    Input(u64),
}

impl Tie {
    /// The tie of a job queued for host input `input`, if any.
    pub(crate) fn of(input: Option<u64>) -> Self {
        input.map_or(Self::None, Self::Input)
    }
}

impl SessionActor {
    /// A queued turn leaves the queue (it starts, or it was dropped before it did): the
    /// host input it is the effect of, if any, is in.
    pub(super) fn input_in(&mut self, tie: Tie) {
        if let Tie::Input(id) = tie {
            self.shared.host_view.inputs().job_left_queue(id);
        }
    }
}

/// Who a snapshot being collected is for.
pub(super) enum Taker {
    /// The host, waiting for it.
    Host(oneshot::Sender<Result<SnapshotUpdate, SessionError>>),
    /// The host, waiting for it to be written to the session's store (`Session::save`).
    Save(oneshot::Sender<Result<SnapshotUpdate, SessionError>>),
    /// The session's own store, after a settled turn.
    Store,
    /// The session's own store, for the calls waiting for it to hold them.
    Record(Vec<RecordCall>),
}

impl Taker {
    fn answer(
        self,
        taken: Result<SnapshotUpdate, SessionError>,
        actor: &mut SessionActor,
        ctx: &mut Context<SessionActor>,
    ) {
        match self {
            Self::Host(tx) => {
                let _ = tx.send(taken);
            }
            Self::Save(tx) => {
                let session = actor.shared.id().to_string();
                let Some(saver) = actor.chain.saver.as_mut() else {
                    let _ = tx.send(Err(StoreError::Unavailable {
                        session,
                        reason: "the session saves to no store (SessionBuilder::save_snapshots)"
                            .to_owned(),
                    }
                    .into()));
                    return;
                };
                let update = match taken {
                    Ok(update) => update,
                    Err(err) => {
                        let _ = tx.send(Err(err));
                        return;
                    }
                };
                // The host gets what was written; the writer gets its own (a copy, once,
                // at the host's asking).
                let written = saver.save(update.clone());
                actix::spawn(async move {
                    let answer = match written.await {
                        Ok(Ok(())) => Ok(update),
                        Ok(Err(err)) => Err(err.into()),
                        Err(_) => Err(SessionError::Closed),
                    };
                    let _ = tx.send(answer);
                });
            }
            Self::Record(calls) => actor.recorded(calls, taken, ctx),
            Self::Store => {
                if let Err(err) = &taken {
                    tracing::debug!(%err, "no snapshot to save");
                }
                let again = actor
                    .chain
                    .saver
                    .as_mut()
                    .is_some_and(|saver| saver.taken(taken.ok()));
                if again {
                    actor.save_settled(ctx);
                }
            }
        }
    }
}

/// What the session remembers of the snapshots it took: where its chain is, and what it
/// wrote of each activation and of the call ids.
#[derive(Default)]
pub(super) struct Chain {
    /// The `seq` of the last snapshot or delta taken.
    pub(super) seq: u64,
    /// Whether one was taken (a delta needs one before it).
    pub(super) started: bool,
    /// Per activation order: the chat as written, and from which item it was stored.
    pub(super) written: HashMap<u32, Written>,
    /// How many call ids were written.
    pub(super) call_ids: usize,
    /// The session's saving to a store, when it saves after settled turns.
    saver: Option<Saver>,
    /// Requests waiting for a switch to end.
    waiting: Vec<(bool, Taker)>,
    /// Snapshots being collected: new work waits meanwhile.
    collecting: u32,
    /// A close asked for while a snapshot was being collected (its reason): it begins once
    /// the snapshot is in. The snapshot is of the point before the close; written once the
    /// close had taken the activations away, it would hold none of them.
    close_after: Option<String>,
    /// Calls waiting for a stored snapshot holding them.
    recording: Recording,
    /// Per activation order, the restore data its agent was built with (not `null`):
    /// a closed activation's record holds it too, whenever it is first written.
    data: HashMap<u32, Value>,
}

pub(super) struct Written {
    pub(super) chat: ChatContext,
    pub(super) from: usize,
}

impl Chain {
    /// Whether new work waits (a snapshot is being collected).
    pub(super) fn holds_work(&self) -> bool {
        self.collecting > 0
    }

    /// Whether a close must wait for the snapshot being collected; if so, it is kept (with
    /// `reason`) and begins once the snapshot is in.
    pub(super) fn holds_close(&mut self, reason: &str) -> bool {
        if self.collecting == 0 {
            return false;
        }
        self.close_after.get_or_insert_with(|| reason.to_owned());
        true
    }

    /// Starts the session's saving to `store`, under `claim`.
    pub(super) fn save_to(
        &mut self,
        store: Arc<dyn SnapshotStore>,
        claim: Claim,
        session: Arc<SessionShared>,
    ) {
        self.saver = Some(Saver::start(store, claim, session));
    }

    /// Resolves once every snapshot taken for the store is written (at once without one).
    pub(super) fn flushed(&self) -> impl std::future::Future<Output = ()> + 'static {
        let flushed = self.saver.as_ref().map(Saver::flushed);
        async move {
            if let Some(flushed) = flushed {
                flushed.await;
            }
        }
    }

    /// Whether a snapshot for calls waiting to be recorded is written in full: decided as
    /// it is written, so that a link taken meanwhile (a settled turn's, the host's) is
    /// counted.
    fn record_full(&mut self) -> bool {
        let (seq, started) = (self.seq, self.started);
        self.saver
            .as_mut()
            .is_none_or(|saver| saver.record_full(seq, started))
    }

    /// Snapshots taken for the store and not written yet.
    pub(super) fn unwritten(&self) -> usize {
        self.saver.as_ref().map_or(0, Saver::unwritten)
    }

    /// An activation started, its agent built with `data`.
    pub(super) fn activation_started(&mut self, order: u32, data: &Value) {
        if !data.is_null() {
            self.data.insert(order, data.clone());
        }
    }

    /// The restore data of the activation with this order.
    fn data_of(&self, order: u32) -> Value {
        self.data.get(&order).cloned().unwrap_or(Value::Null)
    }
}

/// One activation as the chain reads it.
struct View {
    order: u32,
    activity: String,
    agent: String,
    data: Value,
    chat: ChatContext,
    inherited: usize,
    sub_task_of: Option<SubTaskOf>,
    /// Messages of speeches still playing (marked interrupted in the snapshot).
    playing: Vec<usize>,
    closed: bool,
}

/// The session's part of a snapshot's head: its machines' own states, assembled (see the
/// module docs). Written as the head's `state`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(super) struct SessionState {
    /// The schedule's: the live activations' frames, queued work, the deferred reply, the
    /// user.
    pub(super) schedule: ScheduleState,
    /// The live activations, in the order of the schedule's frames: each one's own state
    /// and its own toolsets' calls.
    pub(super) stack: Vec<LiveState>,
    /// The session toolsets' calls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) toolsets: Vec<ToolsetState>,
    /// The user's words waiting for the end of their turn (endpointing): input the
    /// session accepted and has not made a turn of yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) user_words: Option<String>,
    /// Per agent name, the last activation's generation (actor ids carry it).
    pub(super) generations: Vec<(String, u32)>,
    pub(super) counters: Counters,
}

/// A live activation in a snapshot.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(super) struct LiveState {
    /// Its place in start order (its record in the body).
    pub(super) order: u32,
    pub(super) activation: ActivationState,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) toolsets: Vec<ToolsetState>,
}

/// The session's counters, so ids issued after a restore never repeat one in the chat or
/// in an actor's name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Counters {
    /// Activations started (each one's place in the history).
    pub(super) activations: u32,
    pub(super) speech: u64,
    pub(super) step: u64,
    pub(super) run: u64,
}

impl SessionActor {
    /// The session settled after a turn: save to the store, if it has one (a delta, or a
    /// full snapshot when the store may lack what a delta would follow).
    pub(super) fn save_settled(&mut self, ctx: &mut Context<Self>) {
        let (seq, started) = (self.chain.seq, self.chain.started);
        let Some(saver) = self.chain.saver.as_mut() else {
            return;
        };
        if let SaveNow::Take { full } = saver.settled(seq, started) {
            self.snapshot(full, Taker::Store, ctx);
        }
    }

    /// A call asks to be recorded before its body starts (see the module docs).
    fn record_call(&mut self, call: RecordCall, ctx: &mut Context<Self>) {
        let session = self.shared.id().to_string();
        let refused = match self.chain.saver.as_ref() {
            None => Some(StoreError::Unavailable {
                session,
                reason: "the session saves to no store".to_owned(),
            }),
            Some(saver) if saver.fenced() => Some(StoreError::Fenced {
                session,
                reason: "the session's saving stopped: a newer claim holds it".to_owned(),
            }),
            Some(_) => None,
        };
        if let Some(err) = refused {
            let _ = call.answer.send(Err(err));
            return;
        }
        match &mut self.chain.recording {
            Recording::Gathering(calls) | Recording::Collecting(calls) => calls.push(call),
            Recording::Idle => {
                self.chain.recording = Recording::Gathering(vec![call]);
                let gather = async {
                    for _ in 0..GATHER_ROUNDS {
                        super::yield_to_ready_tasks().await;
                    }
                };
                ctx.spawn(
                    gather
                        .into_actor(self)
                        .map(|(), act, ctx| act.take_record(ctx)),
                );
            }
        }
    }

    /// Takes the snapshot for the calls gathered.
    fn take_record(&mut self, ctx: &mut Context<Self>) {
        let Recording::Gathering(calls) = std::mem::take(&mut self.chain.recording) else {
            return;
        };
        self.chain.recording = Recording::Collecting(Vec::new());
        self.snapshot(false, Taker::Record(calls), ctx);
    }

    /// The snapshot for `calls` was taken: queued for the writer, each call hearing how
    /// its write went. Calls that asked meanwhile join it when it holds them; the others
    /// get the next.
    fn recorded(
        &mut self,
        mut calls: Vec<RecordCall>,
        taken: Result<SnapshotUpdate, SessionError>,
        ctx: &mut Context<Self>,
    ) {
        let meanwhile = match std::mem::take(&mut self.chain.recording) {
            Recording::Collecting(calls) | Recording::Gathering(calls) => calls,
            Recording::Idle => Vec::new(),
        };
        let later = match (taken, self.chain.saver.as_mut()) {
            (Ok(update), Some(saver)) => {
                let (held, later): (Vec<_>, Vec<_>) = meanwhile
                    .into_iter()
                    .partition(|call| holds_call(&update, &call.call_id));
                calls.extend(held);
                saver.record(update, calls.into_iter().map(|call| call.answer).collect());
                later
            }
            (taken, _) => {
                let reason = match taken {
                    Err(err) => format!("no snapshot could be taken: {err}"),
                    Ok(_) => "the session saves to no store".to_owned(),
                };
                for call in calls {
                    let _ = call.answer.send(Err(StoreError::Unavailable {
                        session: self.shared.id().to_string(),
                        reason: reason.clone(),
                    }));
                }
                meanwhile
            }
        };
        if !later.is_empty() {
            self.chain.recording = Recording::Gathering(later);
            self.take_record(ctx);
        }
    }

    /// Takes a snapshot for `taker`: at once when an agent is current, after the switch
    /// under way otherwise.
    pub(super) fn snapshot(&mut self, full: bool, taker: Taker, ctx: &mut Context<Self>) {
        if self.schedule.is_closed() {
            taker.answer(Err(SessionError::Closed), self, ctx);
            return;
        }
        let Some(live) = self.schedule.live() else {
            self.chain.waiting.push((full, taker));
            return;
        };
        let me = self.id();
        let stack: Vec<ActivityRef> = live.into_iter().cloned().collect();
        let parts: Vec<_> = stack
            .iter()
            .map(|activity| activity.child.mailbox.ask(&me, SnapshotActivation))
            .collect();
        // Read as the parts are asked for: an update a session toolset's run sent before
        // was relayed before them (it is in their answer) or is on its way (unanswered).
        let session_toolsets = books(
            self.toolsets
                .iter()
                .map(|toolset| (toolset.name.as_str(), toolset.book.as_ref())),
        );
        // Read now: the inputs it holds are in what the parts were asked for; so are the
        // requests the usage ledger counts (a step still in flight is asked again after a
        // restore, and counted then).
        let inputs = {
            let ledger = self.shared.host_view.inputs();
            (ledger.last_input(), ledger.records())
        };
        let metrics = (self.shared.metrics.usage(), self.shared.metrics.latency());
        self.chain.collecting += 1;
        let parts = futures_util::future::join_all(parts);
        ctx.spawn(parts.into_actor(self).map(move |parts, act, ctx| {
            act.chain.collecting -= 1;
            let full = match &taker {
                Taker::Record(_) => act.chain.record_full(),
                _ => full,
            };
            let taken = match parts.into_iter().collect::<Result<Vec<_>, _>>() {
                Ok(parts) => Ok(act.write(full, &stack, parts, session_toolsets, inputs, metrics)),
                // An activation stopped meanwhile: the session is closing.
                Err(_) => Err(SessionError::Closed),
            };
            taker.answer(taken, act, ctx);
            if act.chain.collecting == 0 {
                if let Some(reason) = act.chain.close_after.take() {
                    act.begin_close(&reason, ctx);
                }
            }
            act.pump(ctx);
        }));
    }

    /// Snapshots asked for during a switch, once it has ended.
    pub(super) fn take_waiting_snapshots(&mut self, ctx: &mut Context<Self>) {
        for (full, taker) in std::mem::take(&mut self.chain.waiting) {
            self.snapshot(full, taker, ctx);
        }
    }

    /// Builds the snapshot (or delta) from the parts collected.
    fn write(
        &mut self,
        full: bool,
        stack: &[ActivityRef],
        parts: Vec<ActivationSnapshot>,
        session_toolsets: Vec<ToolsetState>,
        (last_input, inputs): (Option<u64>, Vec<LedgerRecord>),
        (usage, latency): (SessionUsage, SessionLatency),
    ) -> SnapshotUpdate {
        let mut schedule = self
            .schedule
            .state(|job| job_state(&job))
            .unwrap_or_default();
        let mut views: Vec<View> = self
            .shared
            .history
            .closed()
            .into_iter()
            .map(|(order, entry)| {
                let data = self.chain.data_of(order);
                view_of(order, entry, data, Vec::new(), true)
            })
            .collect();
        let mut live = Vec::with_capacity(parts.len());
        let frames = std::mem::take(&mut schedule.frames);
        let depth = frames.len();
        for (index, ((activity, snapshot), mut frame)) in
            stack.iter().zip(parts).zip(frames).enumerate()
        {
            let ActivationSnapshot { part, toolsets } = snapshot;
            // What a turn decided, waiting for its speech: the current agent's runs before
            // anything queued; a paused caller's once it is current again.
            let decided = part.decided.map(|decided| match decided {
                Decided::Handoff(handoff) => JobState::Handoff(handoff.state()),
                Decided::EndTask(value) => JobState::EndTask { value },
            });
            match decided {
                Some(job) if index + 1 == depth => schedule.jobs.insert(0, job),
                Some(job) => frame.after.insert(0, job),
                None => {}
            }
            // A live activation has started (a switch ends only once it has).
            let Some((order, entry)) = part.entry else {
                continue;
            };
            schedule.frames.push(frame);
            views.push(view_of(
                order,
                entry,
                activity.agent.restore_data().clone(),
                part.playing,
                false,
            ));
            live.push(LiveState {
                order,
                activation: part.state,
                toolsets,
            });
        }
        let mut toolsets = session_toolsets;
        agree(&mut live, &mut toolsets, &views);
        views.sort_by_key(|v| v.order);
        let (speech, step, run) = self.shared.ids.counters();
        let mut generations: Vec<(String, u32)> = self
            .generations
            .iter()
            .map(|(name, generation)| (name.clone(), *generation))
            .collect();
        generations.sort();
        let state = SessionState {
            schedule,
            stack: live,
            toolsets,
            user_words: self.endpoint.held().map(str::to_owned),
            generations,
            counters: Counters {
                activations: self.started,
                speech,
                step,
                run,
            },
        };
        let head = SnapshotHead {
            session: self.shared.id().to_string(),
            epoch: self.shared.settings.epoch,
            last_input,
            inputs,
            userdata: match (
                &self.shared.settings.userdata_json,
                &self.shared.settings.userdata,
            ) {
                (Some(write), Some(data)) => write(data.as_ref()),
                _ => None,
            },
            // Plain data with derived impls and string keys: serializing it cannot fail.
            state: serde_json::to_value(&state).unwrap_or_default(),
            usage,
            latency,
        };
        let from = if full || !self.chain.started {
            0
        } else {
            self.chain.call_ids
        };
        let (issued, call_ids) = self.shared.ids.call_ids_since(from);
        self.chain.call_ids = issued.max(from);
        if full || !self.chain.started {
            SnapshotUpdate::Full(self.chain.full(head, views, call_ids))
        } else {
            SnapshotUpdate::Delta(self.chain.delta(head, views, call_ids))
        }
    }
}

/// Whether `update` holds the call `call_id` as running (in a toolset's runs: the session's
/// or a live activation's).
fn holds_call(update: &SnapshotUpdate, call_id: &str) -> bool {
    let head = match update {
        SnapshotUpdate::Full(snapshot) => &snapshot.head,
        SnapshotUpdate::Delta(delta) => &delta.head,
    };
    let in_toolsets = |toolsets: &Value| {
        toolsets
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|toolset| toolset["runs"].as_array().into_iter().flatten())
            .any(|run| run["call"]["call_id"] == call_id)
    };
    in_toolsets(&head.state["toolsets"])
        || head.state["stack"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|live| in_toolsets(&live["toolsets"]))
}

/// The calls in toolsets' books, under the toolsets' names (those with none left out).
pub(super) fn books<'a>(
    toolsets: impl Iterator<Item = (&'a str, &'a crate::toolset::RunBook)>,
) -> Vec<ToolsetState> {
    toolsets
        .map(|(name, book)| ToolsetState {
            name: name.to_owned(),
            runs: book.states(),
        })
        .filter(|toolset| !toolset.runs.is_empty())
        .collect()
}

/// Makes the toolsets' calls agree with the activations' steps where outputs were on their
/// way as the parts were read. A call of an open step without an output is a call of its
/// step, whatever its run's book says: its immediate output, on its way, is not in the
/// step, so it delivered nothing yet (its tool's policy decides again). An update sent and
/// not answered is delivered once it is in a chat context or held until its step is in;
/// one still on its way is not counted (the body run again sends it again). One delivered
/// whose answer had not reached the body is its `repeat`: the body's own record (a
/// `Resume` body's checkpoint) does not count it, and said again it is not delivered twice.
fn agree(live: &mut [LiveState], session: &mut [ToolsetState], views: &[View]) {
    let in_steps: HashSet<String> = live
        .iter()
        .filter_map(|l| l.activation.step.as_ref())
        .flat_map(|step| step.waiting().map(|(_, call)| call.call_id.clone()))
        .collect();
    let held: HashSet<String> = live
        .iter()
        .filter_map(|l| l.activation.step.as_ref())
        .flat_map(|step| step.held.iter())
        .flat_map(|held| held.items.iter().filter_map(|item| item.call_id()))
        .map(str::to_owned)
        .collect();
    let landed = |call_id: &str| {
        held.contains(call_id)
            || views
                .iter()
                .filter(|v| !v.closed)
                .any(|v| v.chat.position_of_call(call_id).is_some())
    };
    let runs = live
        .iter_mut()
        .flat_map(|l| l.toolsets.iter_mut())
        .chain(session.iter_mut())
        .flat_map(|t| t.runs.iter_mut());
    for run in runs {
        if in_steps.contains(&run.call.call_id) {
            run.updates = 0;
            run.said.clear();
            run.repeat = None;
        } else if std::mem::take(&mut run.unanswered) {
            let newest = format!("{}/update_{}", run.call.call_id, run.updates);
            if landed(&newest) {
                run.repeat = run.last_said;
            } else {
                run.updates = run.updates.saturating_sub(1);
                run.said.pop();
            }
        }
    }
}

/// An activation's history entry as the chain reads it.
fn view_of(order: u32, entry: AgentChat, data: Value, playing: Vec<usize>, closed: bool) -> View {
    View {
        order,
        activity: entry.activity.to_string(),
        agent: entry.agent,
        data,
        chat: entry.chat,
        inherited: entry.inherited,
        sub_task_of: entry.sub_task_of,
        playing,
        closed,
    }
}

/// A queued job as a snapshot writes it; turns the host awaits are the host's to send
/// again (the cluster's gateway does), so they are left out, and so is a `say`.
fn job_state(job: &JobView<'_, super::Actors>) -> Option<JobState> {
    match job {
        JobView::Handoff(planned) => Some(JobState::Handoff(planned.handoff.state())),
        JobView::EndTask(value) => Some(JobState::EndTask {
            value: (*value).clone(),
        }),
        JobView::Turn(TurnId::Engine, turn) => match &turn.kind {
            TurnKind::Reply(instructions) if turn.reply.is_none() => Some(JobState::Reply {
                instructions: instructions.clone(),
            }),
            _ => None,
        },
        JobView::Turn(TurnId::Host(_), _) => None,
    }
}

/// The items of a view, messages of speeches still playing marked interrupted.
fn marked_items(view: &View) -> Vec<ChatItem> {
    let mut items = view.chat.items().to_vec();
    for &at in &view.playing {
        if let Some(ChatItem::Message(message)) = items.get_mut(at) {
            message.interrupted = true;
        }
    }
    items
}

impl Chain {
    /// A full snapshot: the chain starts again at its `seq`.
    fn full(
        &mut self,
        head: SnapshotHead,
        views: Vec<View>,
        call_ids: Vec<String>,
    ) -> SessionSnapshot {
        if self.started {
            self.seq += 1;
        }
        self.started = true;
        self.written.clear();
        let closed: HashMap<u32, ChatContext> = views
            .iter()
            .filter(|v| v.closed)
            .map(|v| (v.order, v.chat.clone()))
            .collect();
        let activations = views
            .iter()
            .map(|view| self.record(view, &closed))
            .collect();
        SessionSnapshot {
            version: SNAPSHOT_VERSION,
            seq: self.seq,
            head,
            activations,
            call_ids,
        }
    }

    /// A delta: what changed since the chain's last link.
    fn delta(
        &mut self,
        head: SnapshotHead,
        views: Vec<View>,
        call_ids: Vec<String>,
    ) -> SnapshotDelta {
        let base = self.seq;
        self.seq += 1;
        let closed: HashMap<u32, ChatContext> = views
            .iter()
            .filter(|v| v.closed)
            .map(|v| (v.order, v.chat.clone()))
            .collect();
        let mut chats = Vec::new();
        let mut activations = Vec::new();
        for view in &views {
            let Some(written) = self.written.get(&view.order) else {
                activations.push(self.record(view, &closed));
                continue;
            };
            let unmarked = view.playing.is_empty();
            if unmarked && view.chat.extends(&written.chat) {
                if view.chat.len() == written.chat.len() {
                    continue;
                }
                let from = written.from;
                chats.push(ChatChange {
                    order: view.order,
                    keep: written.chat.len() - from,
                    append: view.chat.items()[written.chat.len()..].to_vec(),
                });
                self.written.insert(
                    view.order,
                    Written {
                        chat: view.chat.clone(),
                        from,
                    },
                );
                continue;
            }
            // Cut or rewritten since, marked, or only moved to a larger log (an append
            // past the log's capacity moves it, so the log alone cannot tell): what
            // follows the first item that changed. Unmarked, the items are compared in
            // place and the view's own chat is remembered, so the next delta is an
            // append on its log again; a chat kept as a copy here would never share the
            // log, and every later delta would compare and copy the whole history.
            let from = written.from;
            let marked = (!unmarked).then(|| marked_items(view));
            let items = marked.as_deref().unwrap_or(view.chat.items());
            let same = written
                .chat
                .items()
                .iter()
                .zip(items)
                .take_while(|(a, b)| a == b)
                .count();
            let unchanged = same == written.chat.len() && same == items.len();
            if !unchanged && same < from {
                // The part written once for all (the inherited items) changed: write the
                // activation again.
                activations.push(self.record(view, &closed));
                continue;
            }
            if !unchanged {
                chats.push(ChatChange {
                    order: view.order,
                    keep: same - from,
                    append: items[same..].to_vec(),
                });
            }
            let chat = match marked {
                None => view.chat.clone(),
                Some(items) => {
                    let mut chat = ChatContext::new();
                    chat.extend(items);
                    chat
                }
            };
            self.written.insert(view.order, Written { chat, from });
        }
        SnapshotDelta {
            version: SNAPSHOT_VERSION,
            base,
            head,
            chats,
            activations,
            call_ids,
        }
    }

    /// An activation's record, written once; its inherited items are not written again
    /// when they are the chat of an activation that had closed.
    fn record(&mut self, view: &View, closed: &HashMap<u32, ChatContext>) -> ActivationRecord {
        let source = closed.iter().find(|(order, chat)| {
            **order < view.order
                && view.inherited > 0
                && chat.len() == view.inherited
                && view.chat.extends(chat)
        });
        let (inherited_from, from) = match (source, view.playing.is_empty()) {
            (Some((order, _)), true) => (Some(*order), view.inherited),
            _ => (None, 0),
        };
        let items = if view.playing.is_empty() {
            view.chat.items()[from..].to_vec()
        } else {
            marked_items(view)
        };
        let chat = if view.playing.is_empty() {
            view.chat.clone()
        } else {
            let mut chat = ChatContext::new();
            chat.extend(items.iter().cloned());
            chat
        };
        self.written.insert(view.order, Written { chat, from });
        ActivationRecord {
            order: view.order,
            activity: view.activity.clone(),
            agent: view.agent.clone(),
            data: view.data.clone(),
            inherited: view.inherited,
            inherited_from,
            items,
            sub_task_of: view.sub_task_of.as_ref().map(|s| SubTaskRecord {
                caller: s.caller.to_string(),
                after: s.after,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::ChatRole;

    fn said(text: &str) -> ChatItem {
        ChatItem::message(ChatRole::User, text)
    }

    /// The live activation of order 1 as the chain reads it, its chat `chat`.
    fn view(chat: &ChatContext) -> View {
        View {
            order: 1,
            activity: "activity/s1/a#1".to_owned(),
            agent: "a".to_owned(),
            data: Value::Null,
            chat: chat.clone(),
            inherited: 0,
            sub_task_of: None,
            playing: Vec::new(),
            closed: false,
        }
    }

    #[test]
    fn after_the_chat_moved_to_a_larger_log_the_next_delta_is_an_append_again() {
        let mut chain = Chain::default();
        let mut chat = ChatContext::new();
        // The first log holds 8 items: the ninth moves the chat to a log of 16.
        for n in 0..8 {
            chat.push(said(&format!("m{n}")));
        }
        chain.full(SnapshotHead::default(), vec![view(&chat)], Vec::new());
        chat.push(said("m8"));
        let moved = chain.delta(SnapshotHead::default(), vec![view(&chat)], Vec::new());
        assert_eq!(
            moved.chats,
            [ChatChange {
                order: 1,
                keep: 8,
                append: vec![said("m8")],
            }]
        );
        let written = &chain.written[&1].chat;
        assert!(
            chat.extends(written),
            "the chain remembers the chat on its new log, not a copy of it"
        );
        chat.push(said("m9"));
        let next = chain.delta(SnapshotHead::default(), vec![view(&chat)], Vec::new());
        assert_eq!(
            next.chats,
            [ChatChange {
                order: 1,
                keep: 9,
                append: vec![said("m9")],
            }]
        );
        assert_eq!(next.base, moved.base + 1);
    }
}
