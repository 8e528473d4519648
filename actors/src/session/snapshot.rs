//! Snapshots of a session: taking one, in full or as a delta, saving after
//! every settled turn, and starting a session again from one.
//!
//! **Taking one.** The session waits for a switch under way to end (a handoff or a
//! sub-task's start or end: the snapshot is of a settled stack of agents), holds new work
//! back while it collects, asks each live activation for its part (its chat context as
//! committed, its live state, its own background calls) and each session toolset for its
//! background calls, and adds what it keeps itself: the pause stack, queued work, whether a
//! deferred reply is wanted, the closed activations from the history, the ids and
//! counters. An activation answers in its mailbox order, after every tool item relayed to
//! it before.
//!
//! **The chain.** Each snapshot or delta is a link: a full one starts the chain at its
//! `seq`, a delta moves it on by one. The session remembers what it wrote of each
//! activation's chat context (a reference-counted clone: nothing is copied), so a delta
//! carries only the items appended since — or, after a chat was cut (a playout report,
//! a hook's rewrite), those after the first that changed.
//!
//! **Restoring.** The host side checks everything first (schema, agents from the registry,
//! user data): nothing starts on a snapshot that cannot be restored. Then the session
//! rebuilds its history, ids and counters, spawns the live activations where they were
//! (no `on_enter`), puts its schedule back, runs again the LLM step that was in flight,
//! and hands each background call to its tool's restore policy.

use std::collections::HashMap;
use std::sync::Arc;

use actix::prelude::*;
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::saver::{SaveNow, Saver};
use super::schedule::{JobView, RestoredFrame, RestoredJob, Schedule, TurnId};
use super::{ActivityRef, HandoffDone, PlannedHandoff, QueuedTurn, SessionActor};
use crate::activity::{
    ended, finished_pair, ActivationSnapshot, ActivityActor, ActivitySpec, Ask, CallToRestore,
    Decided, DeliverToolItems, PendingItem, RestoreCalls, Restored, SnapshotActivation, TaskResult,
    TurnKind, TurnOutcome,
};
use crate::agent::Agent;
use crate::chat::{ChatContext, ChatItem, FunctionCall};
use crate::delivery::{DeliveryAnswer, Scope};
use crate::error::SessionError;
use crate::handoff::Handoff;
use crate::history::{AgentChat, SubTaskOf};
use crate::ids::ActorId;
use crate::input_ledger::{InputLedger, LedgerRecord};
use crate::latency::SessionLatency;
use crate::realtime::Model;
use crate::shared::SessionShared;
use crate::snapshot::{
    ActivationRecord, ChatChange, Counters, JobRecord, RunningRecord, ScopeRecord, SessionSnapshot,
    SnapshotDelta, SnapshotHead, StartingChatRecord, StoreError, SubTaskRecord, SNAPSHOT_VERSION,
};
use crate::snapshot_store::{Claim, SnapshotStore};
use crate::speech::Interruptibility;
use crate::starting_chat::StartingChat;
use crate::telemetry::Cause;
use crate::toolset::{AwaitedTask, BackgroundCall, ListBackground, ResumeRun};
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
    seq: u64,
    /// Whether one was taken (a delta needs one before it).
    started: bool,
    /// Per activation order: the chat as written, and from which item it was stored.
    written: HashMap<u32, Written>,
    /// How many call ids were written.
    call_ids: usize,
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
    /// Per activation order, the restore data its agent was built with (not `null`):
    /// a closed activation's record holds it too, whenever it is first written.
    data: HashMap<u32, Value>,
}

struct Written {
    chat: ChatContext,
    from: usize,
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
        let stack: Vec<ActivityRef> = live.iter().map(|view| view.activity.clone()).collect();
        let parts: Vec<_> = stack
            .iter()
            .map(|activity| activity.child.mailbox.ask(&me, SnapshotActivation))
            .collect();
        let session_background: Vec<_> = self
            .toolsets
            .iter()
            .map(|toolset| {
                let ask = toolset.mailbox.ask(&me, ListBackground);
                let name = toolset.name.clone();
                async move { (name, ask.await.unwrap_or_default()) }
            })
            .collect();
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
        let background = futures_util::future::join_all(session_background);
        ctx.spawn(
            async move { (parts.await, background.await) }
                .into_actor(self)
                .map(move |(parts, background), act, ctx| {
                    act.chain.collecting -= 1;
                    let taken = match parts.into_iter().collect::<Result<Vec<_>, _>>() {
                        Ok(parts) => {
                            Ok(act.write(full, &stack, parts, background, inputs, metrics))
                        }
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
                }),
        );
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
        session_background: Vec<(String, Vec<BackgroundCall>)>,
        (last_input, inputs): (Option<u64>, Vec<LedgerRecord>),
        (usage, latency): (SessionUsage, SessionLatency),
    ) -> SnapshotUpdate {
        let live_after = self.schedule.live().unwrap_or_default();
        // The runs that await a paused caller's sub-task, by key: the caller's order.
        let askers: HashMap<u64, u32> = live_after
            .iter()
            .zip(&parts)
            .filter_map(|(frame, part)| Some((frame.asker?, part.part.live.order)))
            .collect();
        let record = |scope: ScopeRecord, toolset: String, c: BackgroundCall| RunningRecord {
            scope,
            toolset,
            task_of: askers.get(&c.key).copied(),
            call: c.call,
            updates: c.updates,
            checkpoint: c.checkpoint,
        };
        // With each record, its run's key (keys rise as runs start): see below.
        let mut running: Vec<(u64, RunningRecord)> = session_background
            .into_iter()
            .flat_map(|(toolset, calls)| {
                calls
                    .into_iter()
                    .map(|c| (c.key, record(ScopeRecord::Session, toolset.clone(), c)))
                    .collect::<Vec<_>>()
            })
            .collect();
        let mut records = Vec::with_capacity(parts.len());
        let in_flight_call_ids: usize = parts.iter().map(|p| p.part.in_flight_call_ids).sum();
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
        for ((activity, part), frame) in stack.iter().zip(parts).zip(&live_after) {
            let ActivationSnapshot { part, background } = part;
            let mut live = part.live;
            if let Some(waiting) = live.waiting.as_mut() {
                for (index, handoff) in &part.waiting_handoffs {
                    if let Some(Some(out)) = waiting.outputs.get_mut(*index) {
                        out.ends = Some(handoff_record(handoff));
                    }
                }
            }
            running.extend(background.into_iter().map(|(toolset, c)| {
                (
                    c.key,
                    record(ScopeRecord::Activation(live.order), toolset, c),
                )
            }));
            live.after = frame.after.iter().filter_map(job_record).collect();
            match part.decided {
                Some(Decided::Handoff(handoff)) => live.after.insert(0, handoff_record(&handoff)),
                Some(Decided::EndTask(value)) => live.after.insert(0, JobRecord::EndTask { value }),
                None => {}
            }
            if let Some((_, entry)) = part.entry {
                views.push(view_of(
                    live.order,
                    entry,
                    activity.agent.restore_data().clone(),
                    part.playing,
                    false,
                ));
            }
            records.push(live);
        }
        // The runs in the order they started, and each paused step's awaiting call placed
        // among them: a restore gives the runs it makes keys in this order, so a toolset
        // lists its runs as it did before (it lists them by key).
        running.sort_by_key(|(key, _)| *key);
        for (live, frame) in records.iter_mut().zip(&live_after) {
            if let (Some(waiting), Some(asker)) = (live.waiting.as_mut(), frame.asker) {
                if waiting.awaiting.is_some() {
                    waiting.runs_before = running.iter().filter(|(key, _)| *key < asker).count();
                }
            }
        }
        let running: Vec<RunningRecord> = running.into_iter().map(|(_, r)| r).collect();
        views.sort_by_key(|v| v.order);
        let (speech, step, run) = self.shared.ids.counters();
        let mut generations: Vec<(String, u32)> = self
            .generations
            .iter()
            .map(|(name, generation)| (name.clone(), *generation))
            .collect();
        generations.sort();
        let head = SnapshotHead {
            session: self.shared.id().to_string(),
            epoch: self.shared.settings.epoch,
            last_input,
            inputs,
            stack: records,
            jobs: self
                .schedule
                .queued()
                .filter_map(|job| job_record(&job))
                .collect(),
            reply_wanted: self.schedule.reply_wanted(),
            user_words: self.endpoint.held().map(str::to_owned),
            running,
            userdata: match (
                &self.shared.settings.userdata_json,
                &self.shared.settings.userdata,
            ) {
                (Some(write), Some(data)) => write(data.as_ref()),
                _ => None,
            },
            generations,
            counters: Counters {
                activations: self.started,
                speech,
                step,
                run,
            },
            usage,
            latency,
        };
        let from = if full || !self.chain.started {
            0
        } else {
            self.chain.call_ids
        };
        let (issued, mut call_ids) = self.shared.ids.call_ids_since(from);
        // The ids a step in flight issued are the last ones issued; the step is not in
        // the snapshot, and asked again after a restore it issues them again.
        let held = issued.saturating_sub(in_flight_call_ids).max(from);
        call_ids.truncate(held - from);
        self.chain.call_ids = held;
        if full || !self.chain.started {
            SnapshotUpdate::Full(self.chain.full(head, views, call_ids))
        } else {
            SnapshotUpdate::Delta(self.chain.delta(head, views, call_ids))
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

/// A queued job as a snapshot records it; turns the host awaits are the host's to send
/// again (the cluster's gateway does), so they are left out, and so is a `say`.
fn job_record(job: &JobView<'_, super::Actors>) -> Option<JobRecord> {
    match job {
        JobView::Handoff(planned) => Some(handoff_record(&planned.handoff)),
        JobView::EndTask(value) => Some(JobRecord::EndTask {
            value: (*value).clone(),
        }),
        JobView::Turn(TurnId::Engine, turn) => match &turn.kind {
            TurnKind::Reply(instructions) if turn.reply.is_none() => Some(JobRecord::Reply {
                instructions: instructions.clone(),
            }),
            _ => None,
        },
        JobView::Turn(TurnId::Host(_), _) => None,
    }
}

fn handoff_record(handoff: &Handoff) -> JobRecord {
    JobRecord::Handoff {
        agent: handoff.agent.name().to_owned(),
        data: handoff.agent.restore_data().clone(),
        message: handoff.message.clone(),
        chat: handoff.chat.as_ref().map(starting_chat_record),
    }
}

fn starting_chat_record(chat: &StartingChat) -> StartingChatRecord {
    match chat {
        StartingChat::All => StartingChatRecord::All,
        StartingChat::Empty => StartingChatRecord::Empty,
        StartingChat::LastItems(n) => StartingChatRecord::LastItems { n: *n },
        StartingChat::Given(given) => StartingChatRecord::Given {
            items: given.chat().items().to_vec(),
        },
    }
}

fn starting_chat(record: &StartingChatRecord) -> StartingChat {
    match record {
        StartingChatRecord::All => StartingChat::All,
        StartingChatRecord::Empty => StartingChat::Empty,
        StartingChatRecord::LastItems { n } => StartingChat::LastItems(*n),
        StartingChatRecord::Given { items } => {
            let mut chat = ChatContext::new();
            chat.extend(items.iter().cloned());
            // Checked when it was first given; a snapshot changed since reads as empty.
            StartingChat::given(chat).unwrap_or(StartingChat::Empty)
        }
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

/// What a restore starts from: the snapshot, and the agents it names, built from the
/// registry and checked against this session before anything started.
pub(crate) struct RestorePlan {
    pub(crate) snapshot: SessionSnapshot,
    /// The agents of the live activations, by order.
    pub(crate) live: HashMap<u32, (Agent, Model)>,
    /// The agents of the queued handoffs, in the order the snapshot lists them: the
    /// session's jobs, then each live activation's `after`.
    pub(crate) handoffs: std::collections::VecDeque<(Agent, Model)>,
    /// The agents that outputs of paused steps hand off to, in stack and call order.
    pub(crate) output_handoffs: std::collections::VecDeque<Agent>,
}

impl RestorePlan {
    /// Builds every agent the snapshot names with `build` (the registry) and checks it can
    /// start here with `check` (its model, its tool names): a snapshot that cannot be
    /// restored fails here, before anything starts.
    pub(crate) fn new(
        snapshot: SessionSnapshot,
        build: impl Fn(&str, &Value) -> Result<Agent, SessionError>,
        check: impl Fn(&Agent) -> Result<Model, SessionError>,
    ) -> Result<Self, SessionError> {
        let mut live = HashMap::new();
        for record in &snapshot.head.stack {
            let activation = snapshot
                .activations
                .iter()
                .find(|a| a.order == record.order)
                .ok_or_else(|| {
                    SessionError::from(crate::snapshot::SnapshotError::Corrupt {
                        reason: format!("live activation {} has no record", record.order),
                    })
                })?;
            let agent = build(&activation.agent, &activation.data)?;
            let llm = check(&agent)?;
            live.insert(record.order, (agent, llm));
        }
        if live.is_empty() {
            return Err(crate::snapshot::SnapshotError::Corrupt {
                reason: "no agent is current".to_owned(),
            }
            .into());
        }
        let mut handoffs = std::collections::VecDeque::new();
        let queued = snapshot
            .head
            .jobs
            .iter()
            .chain(snapshot.head.stack.iter().flat_map(|r| r.after.iter()));
        for job in queued {
            if let JobRecord::Handoff { agent, data, .. } = job {
                let agent = build(agent, data)?;
                let llm = check(&agent)?;
                handoffs.push_back((agent, llm));
            }
        }
        let mut output_handoffs = std::collections::VecDeque::new();
        let ends = snapshot
            .head
            .stack
            .iter()
            .filter_map(|r| r.waiting.as_ref())
            .flat_map(|w| w.outputs.iter().flatten())
            .filter_map(|out| out.ends.as_ref());
        for end in ends {
            if let JobRecord::Handoff { agent, data, .. } = end {
                let agent = build(agent, data)?;
                check(&agent)?;
                output_handoffs.push_back(agent);
            }
        }
        Ok(Self {
            snapshot,
            live,
            handoffs,
            output_handoffs,
        })
    }
}

/// Each activation's whole chat, its inherited items taken from the activation they were
/// written with.
fn chats(records: &[ActivationRecord]) -> HashMap<u32, ChatContext> {
    let mut chats: HashMap<u32, ChatContext> = HashMap::new();
    for record in records {
        let mut chat = match record.inherited_from.and_then(|from| chats.get(&from)) {
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

impl SessionActor {
    /// Starts the session again from a snapshot (see the module docs).
    pub(super) fn restore(&mut self, plan: RestorePlan, ctx: &mut Context<Self>) {
        let RestorePlan {
            snapshot,
            mut live,
            mut handoffs,
            mut output_handoffs,
        } = plan;
        let head = snapshot.head;
        let Counters {
            activations,
            speech,
            step,
            run,
        } = head.counters;
        self.shared.ids.restore_counters(speech, step, run);
        self.shared.ids.reserve_issued(&snapshot.call_ids);
        *self.shared.host_view.inputs() = InputLedger::restored(head.last_input, &head.inputs);
        self.shared.metrics.restore(&head.usage, &head.latency);
        if let Some(words) = head.user_words.clone() {
            self.endpoint.restore(words, Instant::now());
            self.arm();
        }
        self.started = activations;
        self.generations = head.generations.iter().cloned().collect();
        let chats = chats(&snapshot.activations);
        let live_orders: Vec<u32> = head.stack.iter().map(|r| r.order).collect();
        let session_id = self.shared.id().clone();
        let sub_task_of = |record: &ActivationRecord| {
            record.sub_task_of.as_ref().map(|s| SubTaskOf {
                caller: ActorId::new(s.caller.as_str()),
                after: s.after,
            })
        };
        // The chain goes on from the snapshot: the next delta follows it.
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
            if !live_orders.contains(&record.order) {
                self.shared.history.record(
                    record.order,
                    AgentChat {
                        agent: record.agent.clone(),
                        activity: ActorId::new(record.activity.as_str()),
                        chat,
                        inherited: record.inherited,
                        live: false,
                        sub_task_of: sub_task_of(record),
                    },
                );
            }
        }
        let mut next_handoff = |job: &JobRecord| -> Option<RestoredJob<super::Actors>> {
            Some(match job {
                JobRecord::Handoff { message, chat, .. } => {
                    let (agent, llm) = handoffs.pop_front()?;
                    let mut handoff = Handoff::to(agent);
                    handoff.message = message.clone();
                    handoff.chat = chat.as_ref().map(starting_chat);
                    RestoredJob::Handoff(PlannedHandoff {
                        handoff,
                        llm,
                        done: HandoffDone::Nobody,
                        cause: Cause::default(),
                    })
                }
                JobRecord::Reply { instructions } => RestoredJob::Turn(QueuedTurn {
                    kind: TurnKind::Reply(instructions.clone()),
                    reply: None,
                    cause: Cause::default(),
                    tie: Tie::None,
                }),
                JobRecord::EndTask { value } => RestoredJob::EndTask(value.clone()),
            })
        };
        let mut jobs: Vec<RestoredJob<super::Actors>> =
            head.jobs.iter().filter_map(&mut next_handoff).collect();
        let depth = head.stack.len();
        // A call in the background whose body awaits a paused caller's sub-task, by the
        // caller's order: its index in `running`.
        let background_askers: HashMap<u32, usize> = head
            .running
            .iter()
            .enumerate()
            .filter_map(|(index, r)| Some((r.task_of?, index)))
            .collect();
        // What the runs standing for those calls await, by index in `running`.
        let mut awaited: HashMap<usize, BoxFuture<'static, TaskResult>> = HashMap::new();
        // Keys for the runs the restore makes, given in the order the runs started (the
        // order of `running`, each paused step's awaiting call in its place among them):
        // a toolset lists its runs by key — a duplicate's answer, `get_running_tasks` —
        // and lists them as it did before the snapshot. A key given to a call that ends
        // instead (an abandoned one) is not used.
        let mut step_keys: HashMap<u32, u64> = HashMap::new();
        let mut running_keys: Vec<u64> = Vec::with_capacity(head.running.len());
        let mut in_steps: Vec<(usize, u32)> = head
            .stack
            .iter()
            .filter_map(|r| {
                let waiting = r.waiting.as_ref()?;
                waiting.awaiting?;
                Some((waiting.runs_before, r.order))
            })
            .collect();
        in_steps.sort_by_key(|(before, _)| *before);
        let mut in_steps = in_steps.into_iter().peekable();
        for index in 0..=head.running.len() {
            while let Some((_, order)) = in_steps.next_if(|(before, _)| *before <= index) {
                step_keys.insert(order, self.shared.ids.next_run());
            }
            if index < head.running.len() {
                running_keys.push(self.shared.ids.next_run());
            }
        }
        let mut paused = Vec::new();
        let mut current = None;
        let mut by_order: HashMap<u32, ActivityRef> = HashMap::new();
        for (index, record) in head.stack.into_iter().enumerate() {
            let is_current = index + 1 == depth;
            let Some(activation) = snapshot
                .activations
                .iter()
                .find(|a| a.order == record.order)
            else {
                continue;
            };
            let Some((agent, llm)) = live.remove(&record.order) else {
                continue;
            };
            let generation = generation_of(&activation.activity);
            let id = ActorId::activity(&session_id, agent.name(), generation);
            let in_turn = record.waiting.is_some();
            // The handoffs its paused step's outputs ask for, built in the plan.
            let mut handoffs_asked = Vec::new();
            let outputs = record
                .waiting
                .iter()
                .flat_map(|w| w.outputs.iter().enumerate());
            for (index, out) in outputs {
                if let Some(JobRecord::Handoff { message, chat, .. }) =
                    out.as_ref().and_then(|o| o.ends.as_ref())
                {
                    let Some(agent) = output_handoffs.pop_front() else {
                        continue;
                    };
                    let mut handoff = Handoff::to(agent);
                    handoff.message = message.clone();
                    handoff.chat = chat.as_ref().map(starting_chat);
                    handoffs_asked.push((index, handoff));
                }
            }
            // Who awaits this caller's sub-task: its paused step's call, a call in the
            // background, or (a host's `run_task`) nobody here — the host was in the old
            // process. A run stands for an awaiting call, under a key the schedule keeps:
            // a later pause of the caller spares it.
            let in_step = record
                .waiting
                .as_ref()
                .is_some_and(|w| w.awaiting.is_some());
            let in_background = background_askers.get(&record.order).copied();
            let (task_reply, task_result, asker) = if in_step || in_background.is_some() {
                let (reply, result) = oneshot::channel::<TaskResult>();
                let result = self.task_answer(result);
                match in_background.filter(|_| !in_step) {
                    Some(index) => {
                        awaited.insert(index, result);
                        (reply, None, running_keys.get(index).copied())
                    }
                    None => {
                        // Not reached without a key: `in_step` is what gave it one.
                        let key = step_keys
                            .get(&record.order)
                            .copied()
                            .unwrap_or_else(|| self.shared.ids.next_run());
                        (reply, Some((key, result)), Some(key))
                    }
                }
            } else {
                (oneshot::channel().0, None, None)
            };
            let (waiting, turn_done) = match record.waiting {
                Some(waiting) => {
                    let (done, outcome) = oneshot::channel::<TurnOutcome>();
                    (Some((waiting, done)), Some(outcome))
                }
                None => (None, None),
            };
            let carried: Vec<PendingItem> = record
                .pending
                .iter()
                .map(|p| PendingItem {
                    scope: match p.scope {
                        ScopeRecord::Session => Scope::Session,
                        ScopeRecord::Activation(_) => Scope::Activity(id.clone()),
                    },
                    call_id: p.call_id.clone(),
                    items: Arc::from(p.items.clone()),
                })
                .collect();
            let realtime = self.realtime_link(&llm);
            let child = ActivityActor::spawn(ActivitySpec {
                agent: agent.clone(),
                llm,
                realtime,
                generation,
                is_task: record.is_task,
                shared: self.shared.clone(),
                links: self.links.clone(),
                session_toolsets: self.toolsets.clone(),
                chat: chats.get(&record.order).cloned().unwrap_or_default(),
                order: record.order,
                inherited: Some(activation.inherited),
                sub_task_of: sub_task_of(activation),
                handoff_from: None,
                carried,
                restored: Some((
                    Restored {
                        last_reply_view: record.last_reply_view,
                        paused: !is_current,
                        waiting,
                        handoffs: handoffs_asked,
                    },
                    task_result,
                )),
            });
            let activity = ActivityRef {
                child,
                agent: agent.clone(),
                sub_task_of: sub_task_of(activation),
            };
            by_order.insert(record.order, activity.clone());
            if let Some(outcome) = turn_done {
                let (waiting_id, name) = (id.clone(), agent.name().to_owned());
                ctx.spawn(outcome.into_actor(self).map(move |outcome, act, ctx| {
                    let outcome =
                        outcome.unwrap_or_else(|_| TurnOutcome::failed(SessionError::Closed));
                    act.turn_done(&waiting_id, &name, outcome, None, ctx);
                }));
            }
            let after = record.after.iter().filter_map(&mut next_handoff).collect();
            let frame = RestoredFrame {
                id: id.clone(),
                activity,
                in_turn,
                after,
            };
            if is_current {
                if let Some(ask) = record.redo {
                    // The step in flight at the snapshot is asked again, first.
                    jobs.insert(
                        0,
                        RestoredJob::Turn(QueuedTurn {
                            kind: TurnKind::Redo(Ask {
                                tool_choice: ask.tool_choice,
                                extra_instructions: ask.extra_instructions,
                                deferred_call_ids: ask.deferred_call_ids,
                            }),
                            reply: None,
                            cause: Cause::default(),
                            tie: Tie::None,
                        }),
                    );
                }
                current = Some((frame, !record.pending.is_empty()));
            } else {
                paused.push((frame, task_reply, asker));
            }
        }
        let Some((current, pending)) = current else {
            // Not reached: the plan checked that an agent is current.
            self.begin_close("the snapshot has no current agent", ctx);
            return;
        };
        let current_activity = current.activity.clone();
        self.schedule = Schedule::restored(paused, current, jobs, head.reply_wanted || pending);
        // Background calls: each tool's restore policy says what becomes of them.
        let me = self.id();
        let mut restore_calls: HashMap<u32, Vec<CallToRestore>> = HashMap::new();
        for (index, running) in head.running.into_iter().enumerate() {
            let awaits = awaited.remove(&index).map(|result| AwaitedTask {
                step: 0,
                interruptibility: Interruptibility::new(true),
                result,
                immediate: None,
            });
            let restore = CallToRestore {
                // One per record, given above.
                key: running_keys
                    .get(index)
                    .copied()
                    .unwrap_or_else(|| self.shared.ids.next_run()),
                toolset: running.toolset,
                call: running.call,
                updates: running.updates,
                checkpoint: running.checkpoint,
                awaits,
            };
            match running.scope {
                ScopeRecord::Activation(order) => {
                    restore_calls.entry(order).or_default().push(restore)
                }
                ScopeRecord::Session => self.restore_session_call(restore, &current_activity, ctx),
            }
        }
        for (order, calls) in restore_calls {
            // An agent-scoped call of an activation that is not live had stopped with it.
            let Some(target) = by_order.get(&order) else {
                continue;
            };
            let restoring = Restoring::new(&self.shared, calls.len());
            let scope = Scope::Activity(target.child.mailbox.id().clone());
            // Once per activation.
            let ask = target.child.mailbox.ask(&me, RestoreCalls { calls });
            ctx.spawn(ask.into_actor(self).map(move |ended, act, ctx| {
                for (call, output, is_error) in ended.unwrap_or_default() {
                    act.deliver_ended(scope.clone(), call, output, is_error);
                }
                act.pump(ctx);
                drop(restoring);
            }));
        }
        self.switched(ctx);
        self.pump(ctx);
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

    /// A session-scoped call that was running in the background at the snapshot: its
    /// tool's restore policy runs it again, or it ends in the current agent's chat.
    fn restore_session_call(
        &mut self,
        restore: CallToRestore,
        current: &ActivityRef,
        ctx: &mut Context<Self>,
    ) {
        let me = self.id();
        let target = self
            .toolsets
            .iter()
            .find(|t| t.name == restore.toolset)
            .map(|t| t.mailbox.clone());
        let call = restore.call.clone();
        let resume = ResumeRun {
            key: restore.key,
            call: restore.call,
            agent: current.agent.clone(),
            is_task: self.schedule.in_task(),
            updates: restore.updates,
            checkpoint: restore.checkpoint,
            awaits: restore.awaits,
        };
        let ask = target.map(|toolset| toolset.ask(&me, resume));
        let restoring = Restoring::new(&self.shared, 1);
        ctx.spawn(
            async move {
                match ask {
                    Some(ask) => ask.await.ok(),
                    None => None,
                }
            }
            .into_actor(self)
            .map(move |resumed, act, ctx| {
                if let Some((call, output, is_error)) = ended(call, resumed) {
                    act.deliver_ended(Scope::Session, call, output, is_error);
                    act.pump(ctx);
                }
                drop(restoring);
            }),
        );
    }

    /// A restored call's terminal output, with a deferred reply to tell the user.
    fn deliver_ended(&mut self, scope: Scope, call: FunctionCall, output: String, is_error: bool) {
        self.deliver(DeliverToolItems {
            scope,
            base_call_id: call.call_id.clone(),
            items: finished_pair(call, output, is_error),
            reply: true,
            answer: DeliveryAnswer::unheard(),
        });
    }
}

/// Restored calls whose fate is not known yet count as running tools, so a session does
/// not look settled before their outputs (and the reply they ask for) are in; dropped
/// once the session has taken them, after it wants the reply.
struct Restoring {
    shared: Arc<SessionShared>,
    calls: usize,
}

impl Restoring {
    fn new(shared: &Arc<SessionShared>, calls: usize) -> Self {
        for _ in 0..calls {
            shared.host_view.tool_run_started(false);
        }
        Self {
            shared: shared.clone(),
            calls,
        }
    }
}

impl Drop for Restoring {
    fn drop(&mut self) {
        for _ in 0..self.calls {
            self.shared.host_view.tool_run_ended(false);
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
