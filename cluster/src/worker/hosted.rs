//! A hosted session: the loop that runs one session on its worker, from its claim to its
//! release, hand-over or fence. It is a driver: what the session does next is decided by
//! its [`Tenure`] (`tenure.rs`, a plain machine with a unit test for each decision); the
//! loop turns what happens into the tenure's events and carries out its actions.
//!
//! It owns the engine's `Session` and everything that session needs on the network: the
//! subscription to the session's input subject, its ownership, the session's snapshot
//! writer, and the publishing of its events. One task, one `select!`,
//! so the order of what it does is the order it appears on the wire:
//!
//! * the session is named by its cluster key (`SessionBuilder::id`) and saves itself to its
//!   snapshot writer after every settled turn, under the writer's claim (`save_claimed`:
//!   its epoch is the claim's); a resumed one is restored from its snapshot with the
//!   agents the factory builds;
//! * an input is applied in the order it came: the engine call that applies it is made
//!   (its first poll sends the engine message) before the next request is read, even when
//!   its answer takes a whole turn (then its outcome comes later as an `InputDone` event);
//!   the input and its id go to the session in one call (`Session::apply`), so a snapshot
//!   holds an input exactly when its ledger holds the id, and an input the restored
//!   snapshot's ledger holds is answered from it (`Session::applied`), never applied again;
//! * engine events and speech are published as they come, each numbered by the event
//!   log; what is ready at one wake of the loop goes out as one message (a batch). Each
//!   source keeps its order (the engine's events; a speech's start, chunks and end);
//!   between the two there is no common clock, and when both have something ready the
//!   speech goes first (a voice front's TTS waits on it). Whatever the session said before
//!   a piece of work ended is taken before that work's end (the loop prefers it: `biased`,
//!   and so does its gathering of what is ready): a turn's `InputDone` follows the events
//!   and speech it produced, and a drain's quiet begins after what the session said before
//!   its last snapshot;
//! * what takes time runs beside the loop, as work whose end is an event of the tenure:
//!   the engine calls whose answers take a turn, a save an answer waits for, the close,
//!   the drain's settling and last snapshot, and the writes of an end or a hand-over;
//! * the session runs under its worker's lease (`lease.rs`): the worker renews it, the
//!   loop hears each renewal (what waited for a trusted lease goes out) and its loss (the
//!   session stops at once, as when fenced). It is trusted only on a connection that has
//!   been up since the renewal was sent (a dropped connection may have let another worker
//!   fence the lease at once, `tests/cluster/a_cut_off_owner_is_not_doubled.rs`).
//!
//! Guarantees, each with its test: an input id is applied once however often it is sent
//! (`tests/cluster/inputs_apply_exactly_once.rs`, and across a move:
//! `tests/cluster/a_crashed_worker_s_sessions_go_on_elsewhere.rs`); a gateway gets every
//! event in order across a server restart (`tests/cluster/sessions_survive_a_server_restart.rs`);
//! a drained session goes on on another worker (`tests/cluster/drain_moves_sessions.rs`); a
//! fenced owner writes nothing (`tests/cluster/a_paused_worker_is_fenced.rs`); all of it at
//! once, at random (`tests/cluster/a_fault_campaign_loses_nothing.rs`).

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use async_nats::jetstream;
use async_nats::{Subject, Subscriber};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use switchboard::snapshot::{AgentRegistry, SessionSnapshot};
use switchboard::{Engine, InputId, Session, SessionError, SessionEvent};
use tokio::sync::{broadcast, mpsc, watch, Mutex, OwnedSemaphorePermit};
use tokio::time::Instant;

use super::apply::{apply, Applying};
use super::counts::Counts;
use super::event_log::EventLog;
use super::ledger::InputLedger;
use super::output::PublishingOutput;
use super::residents::Residents;
use super::tenure::{Action, Applied, Event, Setup, State, Tenure};
use crate::connect::ClusterClient;
use crate::dispatch;
use crate::lease::{LeaseStatus, Tenancy};
use crate::namespace::{Namespace, SessionKey};
use crate::ownership::Ownership;
use crate::protocol::{Answer, Input, Reply, Request, EPOCH_HEADER};
use crate::remote_event::RemoteEventKind;
use crate::snapshots::SnapshotWriter;
use crate::spec::{FactoryError, SessionFactory, SessionSpec};

/// The most things one wake of the loop gathers into a batch.
const GATHER_AT_MOST: usize = 256;

/// What every session of a worker shares.
pub(crate) struct Hosting {
    pub(crate) client: ClusterClient,
    /// For resume jobs.
    pub(crate) js: jetstream::Context,
    pub(crate) namespace: Namespace,
    pub(crate) engine: Engine,
    pub(crate) factory: Arc<dyn SessionFactory>,
    pub(crate) counts: Arc<Counts>,
    /// Set to the drain's deadline when the worker drains.
    pub(crate) drain: watch::Receiver<Option<Instant>>,
    pub(crate) idle_timeout: Option<Duration>,
    pub(crate) replay_bytes: usize,
    /// The sessions hosted here, by key.
    pub(crate) residents: Arc<Residents>,
}

/// How a hosted session begins.
pub(crate) enum Start {
    /// A new session, from its spec.
    Fresh(SessionSpec),
    /// A session that ran before, from its last snapshot (none: it never saved one, so it
    /// starts again from its spec).
    Resume {
        spec: SessionSpec,
        snapshot: Option<Box<SessionSnapshot>>,
    },
}

/// Runs the session under `ownership` until it ends, moves or is fenced; see the module
/// docs.
pub(crate) async fn host(
    hosting: Arc<Hosting>,
    key: SessionKey,
    start: Start,
    mut ownership: Ownership,
    writer: SnapshotWriter,
    tenancy: Tenancy,
    slot: OwnedSemaphorePermit,
) {
    // Held until the session is closed: a newer hosting of the key on this worker waits
    // for it (the engine names live sessions by their keys).
    let _residence = hosting.residents.move_in(&key, &writer).await;
    let events_subject = hosting.namespace.session_events(&key);
    let mut log = EventLog::new(
        ownership.epoch(),
        hosting.replay_bytes,
        hosting.client.nats().max_payload(),
    );
    let (speech_tx, speech) = mpsc::unbounded_channel();
    let resumed = matches!(start, Start::Resume { .. });
    let started = match build(hosting.factory.clone(), start) {
        Ok((builder, output, last_input)) => builder
            .id(key.as_str())
            .save_claimed(Arc::new(writer.clone()), writer.held())
            .output(PublishingOutput::new(speech_tx, output))
            .start(&hosting.engine)
            .await
            .map(|session| (session, last_input))
            .map_err(|err| match err {
                // Its old hosting here did not stop in time.
                SessionError::DuplicateSession { .. } => {
                    NotStarted::ForNow(format!("the session did not start: {err}"))
                }
                err => NotStarted::Refused(format!("the session did not start: {err}")),
            }),
        Err(err) => Err(NotStarted::Refused(format!(
            "the worker cannot build it: {err}"
        ))),
    };
    let running = match started {
        Ok((session, last_input)) => {
            let subject = hosting.namespace.session_inputs(&key);
            match hosting.client.nats().subscribe(subject).await {
                Ok(inputs) => Ok((session, inputs, last_input)),
                Err(err) => {
                    writer.seal().await;
                    let _ = session.close().await;
                    Err(NotStarted::ForNow(format!(
                        "cannot subscribe to its inputs: {err}"
                    )))
                }
            }
        }
        Err(not_started) => Err(not_started),
    };
    let (session, inputs, last_input) = match running {
        Ok(running) => running,
        Err(NotStarted::Refused(reason)) => {
            tracing::warn!(session = %key, %reason, resumed, "session not started");
            log.record(RemoteEventKind::StartFailed { reason });
            for message in log.take_unsent() {
                let _ = hosting
                    .client
                    .nats()
                    .publish(events_subject.clone(), message.into())
                    .await;
            }
            Counts::bump(&hosting.counts.refused);
            if let Err(err) = writer.end().await {
                tracing::warn!(session = %key, error = %err, "cannot end the snapshots of a session that did not start");
            }
            if let Err(err) = ownership.release().await {
                tracing::warn!(session = %key, error = %err, "cannot release a session that did not start");
            }
            return;
        }
        Err(NotStarted::ForNow(reason)) => {
            // Handed back whole, as a drain does: its snapshots stay, and the next owner
            // resumes them.
            tracing::warn!(session = %key, %reason, resumed, "session not started here: handed back");
            writer.seal().await;
            match ownership.hand_over().await {
                Ok(revision) => {
                    if queue_resume(&hosting, &key, revision).await {
                        ownership.unindex().await;
                    }
                }
                Err(err) => {
                    tracing::warn!(session = %key, error = %err, "cannot hand it back; the sweep of this worker's lease will, once it is dead");
                }
            }
            return;
        }
    };
    hosting.counts.session_live();
    if resumed {
        Counts::bump(&hosting.counts.resumed);
    }
    let first = if resumed {
        RemoteEventKind::SessionResumed { last_input }
    } else {
        RemoteEventKind::SessionStarted
    };
    let tenure = Tenure::new(Setup {
        key: key.clone(),
        epoch: ownership.epoch(),
        // Trusted only on a connection up since the lease's write was sent: see
        // `LeaseClock`.
        lease: tenancy.clock,
        log,
        ledger: InputLedger::resumed(last_input),
        idle_timeout: hosting.idle_timeout,
        counts: hosting.counts.clone(),
        first,
        now: Instant::now(),
    });
    let hosted = Hosted {
        said: Said::new(speech, session.subscribe()),
        session,
        inputs,
        listening: true,
        lease: tenancy.status,
        ownership: Arc::new(Mutex::new(ownership)),
        events_subject,
        work: FuturesUnordered::new(),
        fenced: writer.fenced(),
        saved: writer.saved(),
        writer,
        slot: Some(slot),
        tenure,
        key,
        hosting,
    };
    hosted.run().await;
}

/// Why a session did not start.
enum NotStarted {
    /// For good: what it is built from cannot be (the front hears `StartFailed`, and the
    /// session ends).
    Refused(String),
    /// For now: the engine still runs its old hosting, or the connection failed. It is
    /// handed back, for whoever pulls its resume job.
    ForNow(String),
}

/// Queues the job that resumes `key` over its `Moving` record at `revision`; whether it
/// was queued.
async fn queue_resume(hosting: &Hosting, key: &SessionKey, revision: u64) -> bool {
    let id = format!("{key}.moved.{revision}");
    let queued = dispatch::publish_resume(&hosting.js, &hosting.namespace, key, &id).await;
    if let Err(err) = &queued {
        // The session stays in the worker's index: the sweep of its lease, once dead (a
        // drain ends it), queues the resume.
        tracing::warn!(session = %key, error = %err, "resume job not queued; the sweep of this worker's lease will");
    }
    queued.is_ok()
}

/// The builder of a session as `start` asks for it (without its id and output), the
/// output mode its front plays, and the last input id it holds.
fn build(
    factory: Arc<dyn SessionFactory>,
    start: Start,
) -> Result<(switchboard::SessionBuilder, crate::spec::OutputMode, u64), FactoryError> {
    match start {
        Start::Fresh(spec) => {
            let agent = factory.agent(&spec.agent, &spec.data)?;
            Ok((factory.builder(&spec)?.agent(agent), spec.output, 0))
        }
        Start::Resume {
            spec,
            snapshot: None,
        } => {
            let agent = factory.agent(&spec.agent, &spec.data)?;
            Ok((factory.builder(&spec)?.agent(agent), spec.output, 0))
        }
        Start::Resume {
            spec,
            snapshot: Some(snapshot),
        } => {
            let last_input = snapshot.last_input().unwrap_or(0);
            let agents = AgentRegistry::new().fallback({
                let factory = factory.clone();
                move |name: &str, data: &serde_json::Value| factory.agent(name, data)
            });
            let (builder, agents) = factory.restoring(&spec, agents)?;
            Ok((builder.restore(*snapshot, agents), spec.output, last_input))
        }
    }
}

/// What the session says: its speech and its engine events, speech first (a voice
/// front's TTS waits on it).
struct Said {
    speech: mpsc::UnboundedReceiver<RemoteEventKind>,
    speech_open: bool,
    events: broadcast::Receiver<SessionEvent>,
    events_open: bool,
}

/// One thing the session said.
enum Heard {
    Said(RemoteEventKind),
    /// The loop fell behind the engine's event channel by this many events.
    Lagged(u64),
}

impl Said {
    fn new(
        speech: mpsc::UnboundedReceiver<RemoteEventKind>,
        events: broadcast::Receiver<SessionEvent>,
    ) -> Self {
        Self {
            speech,
            speech_open: true,
            events,
            events_open: true,
        }
    }

    /// The next thing said; never, once both sources are closed.
    async fn next(&mut self) -> Heard {
        loop {
            tokio::select! {
                biased;
                speech = self.speech.recv(), if self.speech_open => match speech {
                    Some(kind) => return Heard::Said(kind),
                    None => self.speech_open = false,
                },
                event = self.events.recv(), if self.events_open => match event {
                    Ok(event) => return Heard::Said(RemoteEventKind::Session { event }),
                    Err(broadcast::error::RecvError::Lagged(missed)) => return Heard::Lagged(missed),
                    Err(broadcast::error::RecvError::Closed) => self.events_open = false,
                },
                else => std::future::pending::<()>().await,
            }
        }
    }

    /// The next thing said, if one is ready.
    fn try_next(&mut self) -> Option<Heard> {
        if self.speech_open {
            match self.speech.try_recv() {
                Ok(kind) => return Some(Heard::Said(kind)),
                Err(mpsc::error::TryRecvError::Disconnected) => self.speech_open = false,
                Err(mpsc::error::TryRecvError::Empty) => {}
            }
        }
        if self.events_open {
            match self.events.try_recv() {
                Ok(event) => return Some(Heard::Said(RemoteEventKind::Session { event })),
                Err(broadcast::error::TryRecvError::Lagged(missed)) => {
                    return Some(Heard::Lagged(missed))
                }
                Err(broadcast::error::TryRecvError::Closed) => self.events_open = false,
                Err(broadcast::error::TryRecvError::Empty) => return None,
            }
        }
        None
    }
}

/// What woke the loop.
enum Wake {
    Heard(Heard),
    /// (Boxed: an event is large beside what the session says, which wakes the loop most.)
    Event(Box<Event<SessionSnapshot>>),
    /// Nothing for the tenure (an unreadable request, a watch that changed to nothing).
    Nothing,
}

/// The session's loop: the driver of its [`Tenure`].
struct Hosted {
    hosting: Arc<Hosting>,
    key: SessionKey,
    events_subject: String,
    session: Session,
    said: Said,
    inputs: Subscriber,
    /// Whether `inputs` is still subscribed (not after the hand-over's unsubscribe).
    listening: bool,
    /// Shared with the work that writes its record.
    ownership: Arc<Mutex<Ownership>>,
    /// The worker's lease: each renewal, and its loss.
    lease: watch::Receiver<LeaseStatus>,
    writer: SnapshotWriter,
    /// Changes to true when the store refused a write: a newer owner has the session.
    fenced: watch::Receiver<bool>,
    /// The last input id a stored snapshot holds.
    saved: watch::Receiver<u64>,
    /// What runs beside the loop; each ends in an event of the tenure.
    work: FuturesUnordered<BoxFuture<'static, Event<SessionSnapshot>>>,
    /// The worker's slot this session takes, given back once the session has ended (its
    /// owner lingers without one) or the loop is over.
    slot: Option<OwnedSemaphorePermit>,
    tenure: Tenure,
}

impl Hosted {
    async fn run(mut self) {
        let mut drain = self.hosting.drain.clone();
        let mut drain_open = true;
        // Lost before this session started listening: it stops at once.
        let lost = match &*self.lease.borrow_and_update() {
            LeaseStatus::Lost(reason) => Some(reason.clone()),
            LeaseStatus::Held { .. } => None,
        };
        if let Some(reason) = lost {
            self.feed(Event::Fenced(reason)).await;
        }
        // A drain that began before this session started applies to it too.
        let draining = *drain.borrow_and_update();
        if let Some(deadline) = draining {
            self.feed(Event::Drain(deadline)).await;
        }
        while !self.tenure.is_done() {
            self.publish_batch().await;
            let timer = self.tenure.timer();
            let wake = tokio::select! {
                biased;
                heard = self.said.next() => Wake::Heard(heard),
                Some(event) = self.work.next(), if !self.work.is_empty() => Wake::Event(Box::new(event)),
                Ok(()) = self.saved.changed() => {
                    let saved = *self.saved.borrow_and_update();
                    Wake::Event(Box::new(Event::Saved(saved)))
                }
                Ok(()) = self.fenced.changed() => {
                    if *self.fenced.borrow() {
                        Wake::Event(Box::new(Event::Fenced("a newer owner wrote the session's snapshots".into())))
                    } else {
                        Wake::Nothing
                    }
                }
                request = self.inputs.next(), if self.listening => match request {
                    Some(message) => self.request(message),
                    None => Wake::Event(Box::new(Event::Disconnected)),
                },
                changed = self.lease.changed() => Wake::Event(Box::new(match (changed, &*self.lease.borrow_and_update()) {
                    (Ok(()), LeaseStatus::Held { .. }) => Event::LeaseRenewed,
                    (_, LeaseStatus::Lost(reason)) => Event::Fenced(reason.clone()),
                    // The incarnation was replaced (only ever after it was lost).
                    (Err(_), LeaseStatus::Held { .. }) => Event::Fenced("the worker's lease was lost".into()),
                })),
                changed = drain.changed(), if drain_open => {
                    let deadline = match changed {
                        Ok(()) => *drain.borrow(),
                        // The worker is gone: drain as well.
                        Err(_) => {
                            drain_open = false;
                            Some(Instant::now())
                        }
                    };
                    deadline.map_or(Wake::Nothing, |at| Wake::Event(Box::new(Event::Drain(at))))
                }
                () = sleep_until(timer), if timer.is_some() => Wake::Event(Box::new(Event::Timer)),
            };
            match wake {
                Wake::Heard(heard) => self.hear(heard),
                Wake::Event(event) => self.feed(*event).await,
                Wake::Nothing => {}
            }
            self.gather().await;
            if self.tenure.lingering() {
                self.slot = None;
            }
        }
        if self.listening {
            let _ = self.inputs.unsubscribe().await;
        }
        if let State::Done(exit) = self.tenure.state() {
            tracing::debug!(session = %self.key, ?exit, "the session left this worker");
            if self.tenure.fenced_before_last_words() {
                self.hand_back_if_still_ours().await;
            }
        }
        self.hosting
            .counts
            .snapshot_writes_refused
            .fetch_add(self.writer.refused(), std::sync::atomic::Ordering::Relaxed);
    }

    /// After a fence by the snapshots store while the worker's lease still holds: a
    /// claimant that fenced the snapshots but lost the owner record to this worker (its
    /// own lease was lost in between) leaves the session with nobody running it and a
    /// record that names this worker under a live lease, which no claim may take. Whoever
    /// holds the record hands it back (`moving` and a resume job); when a newer owner
    /// holds it, the write fails and nothing happens.
    async fn hand_back_if_still_ours(&mut self) {
        if matches!(*self.lease.borrow(), LeaseStatus::Lost(_)) {
            return;
        }
        let mut ownership = self.ownership.lock().await;
        match ownership.hand_over().await {
            Ok(revision) => {
                tracing::warn!(session = %self.key, "fenced by the snapshots while its record was still this worker's: handed back");
                if queue_resume(&self.hosting, &self.key, revision).await {
                    ownership.unindex().await;
                }
            }
            Err(err) => {
                tracing::debug!(session = %self.key, error = %err, "fenced: the record is not this worker's");
            }
        }
    }

    fn hear(&mut self, heard: Heard) {
        match heard {
            Heard::Said(kind) => self.tenure.said(kind),
            Heard::Lagged(missed) => self.tenure.lagged(missed),
        }
    }

    /// Feeds `event` to the tenure and carries out what it says, the events that carrying
    /// out gives at once included (an input's immediate answer).
    async fn feed(&mut self, event: Event<SessionSnapshot>) {
        let mut next = Some(event);
        while let Some(event) = next.take() {
            for action in self.tenure.on(event, Instant::now()) {
                if let Some(follow) = self.carry_out(action).await {
                    next = Some(follow);
                }
            }
        }
    }

    /// Takes what is ready without waiting, in the loop's order (what the session said,
    /// then finished work), so it goes out in one batch. Bounded: a session that streams
    /// faster than this drains must not hold off its inputs and its lease's renewal.
    async fn gather(&mut self) {
        for _ in 0..GATHER_AT_MOST {
            if self.tenure.is_done() {
                return;
            }
            if let Some(heard) = self.said.try_next() {
                self.hear(heard);
                continue;
            }
            if self.work.is_empty() {
                return;
            }
            // Polled with a no-op waker: the loop's `select!` polls it again with its own
            // before it waits.
            match self.work.next().now_or_never() {
                Some(Some(event)) => self.feed(event).await,
                _ => return,
            }
        }
    }

    /// Publishes the events not sent yet (none while the lease cannot be trusted).
    async fn publish_batch(&mut self) {
        // Every wake of the loop comes here: nothing new is the common case, and then no
        // clock is read.
        if !self.tenure.has_unsent() {
            return;
        }
        for message in self.tenure.batch(Instant::now()) {
            self.publish(message).await;
        }
    }

    /// A request from the input subject, as the tenure's event.
    fn request(&self, message: async_nats::Message) -> Wake {
        let Some(reply_to) = message.reply else {
            return Wake::Nothing;
        };
        match serde_json::from_slice::<Request>(&message.payload) {
            Ok(request) => {
                // What the session's own ledger says of it: an input the restored
                // snapshot holds is answered from there, never applied again. (A close is
                // not the session's to apply.)
                let applied = match &request {
                    Request::Input {
                        input: Input::Close,
                        ..
                    }
                    | Request::Replay { .. } => Applied::No,
                    Request::Input { id, .. } => match self.session.applied(InputId::new(*id)) {
                        Some(recorded) => Applied::Yes(Answer::recorded(recorded)),
                        None => Applied::No,
                    },
                };
                Wake::Event(Box::new(Event::Request {
                    request,
                    reply_to,
                    saved: self.writer.saved_input(),
                    applied,
                }))
            }
            Err(err) => {
                tracing::warn!(session = %self.key, error = %err, "unreadable request");
                Wake::Nothing
            }
        }
    }

    /// Carries out one action of the tenure; returns the event it gave at once, if any.
    async fn carry_out(
        &mut self,
        action: Action<SessionSnapshot>,
    ) -> Option<Event<SessionSnapshot>> {
        match action {
            Action::Reply { to, reply } => self.reply(to, &reply).await,
            Action::Apply {
                id,
                input,
                reply_to,
            } => {
                let answer = self.apply(id, input).await;
                return Some(Event::Applied {
                    id,
                    answer,
                    reply_to,
                    saved: self.writer.saved_input(),
                });
            }
            Action::Close => {
                let session = self.session.clone();
                self.work.push(
                    async move { Event::Closed(session.close().await.unwrap_or_default()) }.boxed(),
                );
            }
            Action::Settle { deadline } => {
                let session = self.session.clone();
                let writer = self.writer.clone();
                let key = self.key.clone();
                self.work.push(
                    async move {
                        if tokio::time::timeout_at(deadline, session.wait_for_settled())
                            .await
                            .is_err()
                        {
                            tracing::info!(session = %key, "not settled at the drain's deadline: interrupting");
                            let _ = session.force_interrupt().await;
                        }
                        // The next owner resumes the snapshot taken next: the session's
                        // own saving writes nothing from now on (the drain writes it past
                        // the seal). Sealed before it is taken, so that a call recorded
                        // meanwhile (an `Abandon` body waits for a stored snapshot that
                        // holds its call) is in it, and one asked after is refused — not
                        // stored behind the snapshot the next owner resumes without it,
                        // its body then run here and again there.
                        writer.seal().await;
                        let snapshot = session.snapshot().await;
                        Event::Settled(snapshot.map_err(|err| format!("no snapshot to store: {err}")))
                    }
                    .boxed(),
                );
            }
            Action::Save => {
                let session = self.session.clone();
                let writer = self.writer.clone();
                let key = self.key.clone();
                self.work.push(
                    async move {
                        if let Err(err) = session.save().await {
                            tracing::warn!(session = %key, error = %err, "the save an answer waits for failed; asked again later");
                        }
                        Event::Saved(writer.saved_input())
                    }
                    .boxed(),
                );
            }
            Action::SaveLast(snapshot) => {
                let writer = self.writer.clone();
                self.work.push(
                    async move {
                        let holds = snapshot.last_input().unwrap_or(0);
                        Event::LastSaved(writer.save_last(&snapshot).await.map(|()| holds))
                    }
                    .boxed(),
                );
            }
            Action::Publish(messages) => {
                for message in messages {
                    self.publish(message).await;
                }
            }
            Action::EndSnapshots => {
                let writer = self.writer.clone();
                self.work
                    .push(async move { Event::SnapshotsEnded(writer.end().await) }.boxed());
            }
            Action::Release => {
                let ownership = self.ownership.clone();
                self.work.push(
                    async move { Event::Released(ownership.lock().await.release().await) }.boxed(),
                );
            }
            Action::HandOver => {
                // Whoever resumes the session subscribes to its inputs: this owner is no
                // longer there by then.
                self.listening = false;
                let _ = self.inputs.unsubscribe().await;
                let _ = self.hosting.client.nats().flush().await;
                let ownership = self.ownership.clone();
                self.work.push(
                    async move { Event::HandedOver(ownership.lock().await.hand_over().await) }
                        .boxed(),
                );
            }
            Action::QueueResume { revision } => {
                if queue_resume(&self.hosting, &self.key, revision).await {
                    self.ownership.lock().await.unindex().await;
                }
            }
            Action::Stop => {
                self.writer.seal().await;
                if self.listening {
                    self.listening = false;
                    let _ = self.inputs.unsubscribe().await;
                }
                self.work.clear();
                let _ = self.session.close().await;
            }
        }
        None
    }

    // The two below return futures that borrow nothing of `self`: `Hosted` is `Send` but
    // not `Sync` (its futures are not), so a `&self` held across an await would make the
    // session's task not `Send`.

    fn publish(&self, json: Vec<u8>) -> impl Future<Output = ()> + Send + 'static {
        let client = self.hosting.client.nats().clone();
        let subject = self.events_subject.clone();
        let key = self.key.clone();
        async move {
            if let Err(err) = client.publish(subject, json.into()).await {
                tracing::warn!(session = %key, error = %err, "cannot publish an event");
            }
        }
    }

    fn reply(&self, to: Subject, reply: &Reply) -> impl Future<Output = ()> + Send + 'static {
        let client = self.hosting.client.nats().clone();
        let json = serde_json::to_vec(reply).unwrap_or_default();
        let key = self.key.clone();
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(EPOCH_HEADER, self.tenure.epoch().to_string().as_str());
        async move {
            if let Err(err) = client
                .publish_with_headers(to, headers, Bytes::from(json))
                .await
            {
                tracing::warn!(session = %key, error = %err, "cannot answer a request");
            }
        }
    }

    /// Hands `input` to the engine with its id; returns what the gateway hears at once
    /// (an answer that takes time comes later, as the work's outcome).
    async fn apply(&mut self, id: u64, input: Input) -> Answer {
        match apply(&self.session, self.hosting.factory.as_ref(), id, input).await {
            Applying::Answered(answer) => answer,
            Applying::UnderWay(work) => self.under_way(work),
        }
    }

    /// Starts an engine call whose answer takes time. It is polled once at once: the
    /// engine message is sent on the first poll, before the loop reads the next input, so
    /// the engine sees inputs in the order they came.
    fn under_way(&mut self, mut work: BoxFuture<'static, Event<SessionSnapshot>>) -> Answer {
        // The real waker comes with the `FuturesUnordered`'s next poll, which polls every
        // newly pushed future.
        let mut cx = Context::from_waker(Waker::noop());
        match work.as_mut().poll(&mut cx) {
            Poll::Ready(done) => self.work.push(futures_util::future::ready(done).boxed()),
            Poll::Pending => self.work.push(work),
        }
        Answer::Pending
    }
}

/// Sleeps until `at` (never, for `None`: the branch is off then anyway).
pub(super) async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
