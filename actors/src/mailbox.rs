//! The mailbox probe: counted addresses and the per-session journal that the
//! `Inspector` and the engine's counts read.
//!
//! actix 0.13 does not say how many messages wait in a mailbox, so the engine counts
//! them itself. Every send inside the engine goes through [`Mailbox`], which adds one to
//! the receiver's count and wraps the message in a [`Counted`] envelope whose guard
//! subtracts one when the message is handled *or dropped unhandled* (a stopped actor's
//! queue is dropped with the guards in it). No raw `Addr` leaves this module's users:
//! each actor lists the messages it takes in one [`counted_handlers!`] line.
//!
//! Every probe of a session reports to the session's [`Journal`], which always keeps two
//! totals — how many of the session's actors are live, how many messages wait for them —
//! for `Engine::stats` and `Session::summary`, and, when inspection is on, a record per
//! actor for the `Inspector` ([`Records`]).
//!
//! When inspection is off, the probe is a counter per actor and the journal two counters
//! per session, and nothing else: no clock read, no lock, no allocation per message.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use actix::dev::ToEnvelope;
use actix::prelude::*;
use chrono::{DateTime, Utc};
use dashmap::DashMap;
use tokio::sync::Notify;

use crate::ids::ActorId;

/// One message an actor received, as the journal recorded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Received {
    /// Per-session sequence number: the order in which the session's actors handled
    /// their messages.
    pub seq: u64,
    /// The message type (`RunTool`, `ToolUpdate`, `Handoff`, …).
    pub kind: &'static str,
    /// Who sent it (`host` for the program embedding the engine).
    pub from: ActorId,
    /// The receiving actor.
    pub to: ActorId,
    /// When it was handled.
    pub at: DateTime<Utc>,
}

/// What the journal knows of one actor.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ActorSnapshot {
    /// The actor's id.
    pub id: ActorId,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// When it stopped, if it has.
    pub stopped_at: Option<DateTime<Utc>>,
    /// Messages queued for it now (sent, not yet handled or dropped).
    pub pending: usize,
    /// The messages it handled, oldest first (the last `capacity` of them).
    pub received: Vec<Received>,
    /// How many older messages the ring buffer dropped.
    pub overwritten: u64,
    /// For a tool run: the name of the tool it runs (its id names only the call).
    pub tool: Option<String>,
    /// For a tool run: the agent whose model made the call (a run of a session-scoped
    /// toolset can outlive that agent's activity).
    pub agent: Option<String>,
}

/// The probe of one actor: its queue count, the session's journal it reports to, and,
/// when inspecting, its record there.
#[derive(Debug)]
pub(crate) struct Probe {
    id: ActorId,
    /// Messages queued for the actor now, and in the top bit ([`STOPPED`]) whether it
    /// stopped: a flag of its own would grow every actor by a word.
    pending: AtomicUsize,
    journal: Arc<Journal>,
    record: Option<Arc<ActorRecord>>,
}

/// The bit of [`Probe::pending`] that says the actor stopped. No queue holds half the
/// address space in messages, so counting them never reaches it.
const STOPPED: usize = 1 << (usize::BITS - 1);

/// What the journal records of a tool run beyond its id: the tool and the calling agent.
#[derive(Debug)]
struct RunLabel {
    tool: Arc<str>,
    agent: Arc<str>,
}

impl Probe {
    /// The probe of an actor about to start; the session's journal counts it live until
    /// it stops.
    pub(crate) fn new(id: ActorId, journal: Arc<Journal>) -> Arc<Self> {
        Self::labeled(id, journal, None)
    }

    /// The probe of a tool run: the journal also records the tool's name and the agent
    /// that called it, so a test can find the run without knowing the provider's call id.
    pub(crate) fn tool_run(
        id: ActorId,
        journal: Arc<Journal>,
        tool: &str,
        agent: &str,
    ) -> Arc<Self> {
        // Allocated only when inspecting: without records the label is never built.
        let label = journal.records.is_some().then(|| RunLabel {
            tool: tool.into(),
            agent: agent.into(),
        });
        Self::labeled(id, journal, label)
    }

    fn labeled(id: ActorId, journal: Arc<Journal>, label: Option<RunLabel>) -> Arc<Self> {
        journal.live.fetch_add(1, Ordering::Relaxed);
        // The journal's record reads the queue count through a weak reference, so the
        // count lives inline in the probe: one allocation per actor, not two.
        Arc::new_cyclic(|probe| {
            let record = journal
                .records
                .as_ref()
                .map(|records| records.register(&id, probe.clone(), label));
            Self {
                id,
                pending: AtomicUsize::new(0),
                journal,
                record,
            }
        })
    }

    pub(crate) fn id(&self) -> &ActorId {
        &self.id
    }

    /// Marks the actor stopped: the journal counts it gone, and records its stop when
    /// inspecting (called from `Actor::stopped`; a second call changes nothing).
    pub(crate) fn stopped(&self) {
        if self.pending.fetch_or(STOPPED, Ordering::Relaxed) & STOPPED == 0 {
            self.journal.live.fetch_sub(1, Ordering::Relaxed);
        }
        if let (Some(records), Some(record)) = (&self.journal.records, &self.record) {
            records.mark_stopped(record);
        }
    }

    /// Messages queued for the actor now.
    fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed) & !STOPPED
    }

    fn handled(&self, kind: &'static str, from: &ActorId) {
        if let (Some(records), Some(record)) = (&self.journal.records, &self.record) {
            records.record(record, kind, from, &self.id);
        }
    }
}

impl Drop for Probe {
    /// An actor that never ran `stopped()` (its arbiter never started it, or its system
    /// was shut down under it) stops counting as live once nothing refers to it.
    fn drop(&mut self) {
        if *self.pending.get_mut() & STOPPED == 0 {
            self.journal.live.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// A session's mailbox journal: every probe of the session reports to it.
///
/// It always keeps two totals, each one atomic counter, so that `Engine::stats` and
/// `Session::summary` read a session without a message to it (a wedged session still
/// answers): how many of its actors are live (started, not stopped), and how many
/// messages wait in their queues (sent, not yet handled or dropped). They are per
/// session, not per engine, so that actors on different arbiters never write one shared
/// counter. With inspection on it also holds each actor's [`Records`].
#[derive(Debug)]
pub(crate) struct Journal {
    live: AtomicUsize,
    backlog: AtomicUsize,
    records: Option<Arc<Records>>,
}

impl Journal {
    /// A session's journal; with `records`, each actor's messages are recorded too, the
    /// last `records` of them per actor.
    pub(crate) fn new(records: Option<usize>) -> Arc<Self> {
        Arc::new(Self {
            live: AtomicUsize::new(0),
            backlog: AtomicUsize::new(0),
            records: records.map(Records::new),
        })
    }

    /// How many of the session's actors are live now.
    pub(crate) fn live_actors(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    /// How many messages wait in the queues of the session's actors now.
    pub(crate) fn backlog(&self) -> usize {
        self.backlog.load(Ordering::Relaxed)
    }

    /// Each actor's record, when inspection is on.
    pub(crate) fn records(&self) -> Option<&Arc<Records>> {
        self.records.as_ref()
    }
}

/// A message on its way, with the guard that keeps the receiver's queue count right.
pub(crate) struct Counted<M> {
    pub(crate) msg: M,
    pub(crate) from: ActorId,
    guard: PendingGuard,
}

impl<M: Message> Message for Counted<M> {
    type Result = M::Result;
}

impl<M> Counted<M> {
    /// Records the receipt and hands out the message (the count drops with the guard).
    pub(crate) fn open(self, kind: &'static str) -> M {
        self.guard.probe.handled(kind, &self.from);
        self.msg
    }
}

struct PendingGuard {
    probe: Arc<Probe>,
}

impl Drop for PendingGuard {
    fn drop(&mut self) {
        self.probe.pending.fetch_sub(1, Ordering::Relaxed);
        self.probe.journal.backlog.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Counts a message on its way to `probe`'s actor, in its queue and in its session's
/// backlog; the guard takes it off both.
fn count(probe: &Arc<Probe>) -> PendingGuard {
    probe.pending.fetch_add(1, Ordering::Relaxed);
    probe.journal.backlog.fetch_add(1, Ordering::Relaxed);
    PendingGuard {
        probe: probe.clone(),
    }
}

/// The engine's address of an actor: a counted, journaled `Addr`.
pub(crate) struct Mailbox<A: Actor> {
    addr: Addr<A>,
    probe: Arc<Probe>,
}

impl<A: Actor> Clone for Mailbox<A> {
    fn clone(&self) -> Self {
        Self {
            addr: self.addr.clone(),
            probe: self.probe.clone(),
        }
    }
}

impl<A: Actor> std::fmt::Debug for Mailbox<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mailbox({})", self.probe.id)
    }
}

impl<A: Actor> Mailbox<A> {
    pub(crate) fn new(addr: Addr<A>, probe: Arc<Probe>) -> Self {
        Self { addr, probe }
    }

    pub(crate) fn id(&self) -> &ActorId {
        &self.probe.id
    }

    fn wrap<M>(&self, from: &ActorId, msg: M) -> Counted<M> {
        Counted {
            msg,
            from: from.clone(),
            guard: count(&self.probe),
        }
    }

    /// Queues a message without waiting. Only for messages bounded by construction (one
    /// per call, per step or per lifecycle event): `do_send` ignores the mailbox limit.
    pub(crate) fn tell<M>(&self, from: &ActorId, msg: M)
    where
        M: Message + Send + 'static,
        M::Result: Send,
        A: Handler<Counted<M>>,
        A::Context: ToEnvelope<A, Counted<M>>,
    {
        self.addr.do_send(self.wrap(from, msg));
    }

    /// Sends a message and waits for the reply; waits for room when the mailbox is full.
    pub(crate) fn ask<M>(
        &self,
        from: &ActorId,
        msg: M,
    ) -> impl Future<Output = Result<M::Result, MailboxError>> + Send + 'static
    where
        M: Message + Send + 'static,
        M::Result: Send,
        A: Handler<Counted<M>>,
        A::Context: ToEnvelope<A, Counted<M>>,
    {
        self.addr.send(self.wrap(from, msg))
    }
}

impl<A: Actor> Mailbox<A> {
    /// A link that can send only `M` to this actor: what a child gets of its parent, so
    /// it can send what it may and nothing else (actix's `Recipient`, counted).
    pub(crate) fn link<M>(&self) -> Link<M>
    where
        M: Message + Send + 'static,
        M::Result: Send,
        A: Handler<Counted<M>>,
        A::Context: ToEnvelope<A, Counted<M>>,
    {
        Link {
            recipient: self.addr.clone().recipient(),
            probe: self.probe.clone(),
        }
    }
}

/// A counted address that carries one kind of message, `M`, to one actor.
///
/// Children reach their parents only through links: a tool run holds a link for its
/// items and one for a handoff, never the session's whole address, so it cannot send
/// what it has no business sending (a close, a turn) and does not keep the host's
/// handle alive.
pub(crate) struct Link<M>
where
    M: Message + Send + 'static,
    M::Result: Send,
{
    recipient: Recipient<Counted<M>>,
    probe: Arc<Probe>,
}

impl<M> Clone for Link<M>
where
    M: Message + Send + 'static,
    M::Result: Send,
{
    fn clone(&self) -> Self {
        Self {
            recipient: self.recipient.clone(),
            probe: self.probe.clone(),
        }
    }
}

impl<M> std::fmt::Debug for Link<M>
where
    M: Message + Send + 'static,
    M::Result: Send,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Link({})", self.probe.id)
    }
}

impl<M> Link<M>
where
    M: Message + Send + 'static,
    M::Result: Send,
{
    fn wrap(&self, from: &ActorId, msg: M) -> Counted<M> {
        Counted {
            msg,
            from: from.clone(),
            guard: count(&self.probe),
        }
    }

    /// Queues a message without waiting (bounded-by-construction messages only, as
    /// [`Mailbox::tell`]).
    pub(crate) fn tell(&self, from: &ActorId, msg: M) {
        self.recipient.do_send(self.wrap(from, msg));
    }
}

/// Lets a handler answer with a plain value of one of the engine's own types, whichever
/// envelope (`M` or `Counted<M>`) carried the request: actix's `MessageResult<M>` names the
/// one message type and so would not do for the counted envelope.
macro_rules! plain_response {
    ($($ty:ty),+ $(,)?) => {
        $(
            impl<A: ::actix::Actor, M: ::actix::Message<Result = $ty>>
                ::actix::dev::MessageResponse<A, M> for $ty
            {
                fn handle(
                    self,
                    _ctx: &mut A::Context,
                    tx: Option<::actix::dev::OneshotSender<M::Result>>,
                ) {
                    if let Some(tx) = tx {
                        let _ = tx.send(self);
                    }
                }
            }
        )+
    };
}
pub(crate) use plain_response;

/// Lists the messages an actor takes: for each, a handler of its [`Counted`] envelope
/// that records the receipt and calls the plain handler beside the message.
macro_rules! counted_handlers {
    ($actor:ty : $($msg:ident),+ $(,)?) => {
        $(
            impl ::actix::Handler<$crate::mailbox::Counted<$msg>> for $actor {
                type Result = <$actor as ::actix::Handler<$msg>>::Result;
                fn handle(
                    &mut self,
                    counted: $crate::mailbox::Counted<$msg>,
                    ctx: &mut Self::Context,
                ) -> Self::Result {
                    let msg = counted.open(stringify!($msg));
                    <$actor as ::actix::Handler<$msg>>::handle(self, msg, ctx)
                }
            }
        )+
    };
}
pub(crate) use counted_handlers;

#[derive(Debug)]
pub(crate) struct ActorRecord {
    id: ActorId,
    /// The actor's probe, for its queue count; gone once the actor and every message
    /// queued for it are (then nothing is pending).
    probe: std::sync::Weak<Probe>,
    started_at: DateTime<Utc>,
    label: Option<RunLabel>,
    state: Mutex<RecordState>,
}

#[derive(Debug, Default)]
struct RecordState {
    stopped_at: Option<DateTime<Utc>>,
    received: VecDeque<Received>,
    overwritten: u64,
}

/// What the journal records of one session's actors when inspection is on: who is alive,
/// what each received.
///
/// Each actor keeps its last `capacity` messages in a ring buffer that counts what it
/// overwrote, so a long session never grows the journal without bound and a test can
/// tell when the journal wrapped.
#[derive(Debug)]
pub(crate) struct Records {
    capacity: usize,
    seq: AtomicU64,
    actors: DashMap<ActorId, Arc<ActorRecord>>,
    changed: Notify,
}

impl Records {
    /// Records keeping the last `capacity` messages of each actor.
    fn new(capacity: usize) -> Arc<Self> {
        Arc::new(Self {
            capacity: capacity.max(1),
            seq: AtomicU64::new(0),
            actors: DashMap::new(),
            changed: Notify::new(),
        })
    }

    fn register(
        &self,
        id: &ActorId,
        probe: std::sync::Weak<Probe>,
        label: Option<RunLabel>,
    ) -> Arc<ActorRecord> {
        let record = Arc::new(ActorRecord {
            id: id.clone(),
            probe,
            started_at: Utc::now(),
            label,
            state: Mutex::new(RecordState::default()),
        });
        self.actors.insert(id.clone(), record.clone());
        self.changed.notify_waiters();
        record
    }

    fn lock(record: &ActorRecord) -> MutexGuard<'_, RecordState> {
        // A poisoned journal only means a panic elsewhere while recording; the data is
        // still a list of plain values, so keep using it.
        record
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn record(&self, record: &ActorRecord, kind: &'static str, from: &ActorId, to: &ActorId) {
        let entry = Received {
            seq: self.seq.fetch_add(1, Ordering::Relaxed),
            kind,
            from: from.clone(),
            to: to.clone(),
            at: Utc::now(),
        };
        {
            let mut state = Self::lock(record);
            if state.received.len() == self.capacity {
                state.received.pop_front();
                state.overwritten += 1;
            }
            state.received.push_back(entry);
        }
        self.changed.notify_waiters();
    }

    fn mark_stopped(&self, record: &ActorRecord) {
        Self::lock(record).stopped_at.get_or_insert_with(Utc::now);
        self.changed.notify_waiters();
    }

    /// Ids of the actors that started and have not stopped, sorted.
    pub(crate) fn live_actors(&self) -> Vec<ActorId> {
        let mut live: Vec<ActorId> = self
            .actors
            .iter()
            .filter(|entry| Self::lock(entry.value()).stopped_at.is_none())
            .map(|entry| entry.key().clone())
            .collect();
        live.sort();
        live
    }

    /// Ids of every actor the journal has seen, alive or not, sorted.
    pub(crate) fn actors(&self) -> Vec<ActorId> {
        let mut all: Vec<ActorId> = self.actors.iter().map(|e| e.key().clone()).collect();
        all.sort();
        all
    }

    /// What the journal knows of one actor.
    pub(crate) fn snapshot(&self, id: &str) -> Option<ActorSnapshot> {
        let record = self.actors.get(&ActorId::new(id))?.value().clone();
        let state = Self::lock(&record);
        Some(ActorSnapshot {
            id: record.id.clone(),
            started_at: record.started_at,
            stopped_at: state.stopped_at,
            pending: record.probe.upgrade().map_or(0, |probe| probe.pending()),
            received: state.received.iter().cloned().collect(),
            overwritten: state.overwritten,
            tool: record.label.as_ref().map(|l| l.tool.to_string()),
            agent: record.label.as_ref().map(|l| l.agent.to_string()),
        })
    }

    /// Every recorded message of every actor, in handling order.
    pub(crate) fn all_received(&self) -> Vec<Received> {
        let mut all: Vec<Received> = self
            .actors
            .iter()
            .flat_map(|entry| {
                Self::lock(entry.value())
                    .received
                    .iter()
                    .cloned()
                    .collect::<Vec<_>>()
            })
            .collect();
        all.sort_by_key(|r| r.seq);
        all
    }

    /// The tool runs the journal knows, alive or not: id, tool name, calling agent.
    pub(crate) fn runs(&self) -> Vec<(ActorId, Arc<str>, Arc<str>)> {
        self.actors
            .iter()
            .filter_map(|entry| {
                let label = entry.value().label.as_ref()?;
                Some((entry.key().clone(), label.tool.clone(), label.agent.clone()))
            })
            .collect()
    }

    /// A future that resolves on the next change; created before a check so that a
    /// change between the check and the wait is not missed.
    pub(crate) fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.changed.notified()
    }
}
