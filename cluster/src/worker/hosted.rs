//! A hosted session: the loop that runs one session on its worker, from its claim to its
//! release or hand-over.
//!
//! It owns the engine's `Session` and everything that session needs on the network: the
//! subscription to the session's input subject, the event log, the input ledger, the
//! lease and the session's snapshot writer. One task, one `select!` loop, so the order of
//! what it does is the order it appears on the wire:
//!
//! * the session is named by its cluster key (`SessionBuilder::id`) and saves itself to its
//!   snapshot writer after every settled turn, under the writer's claim (`save_claimed`:
//!   its epoch is the claim's); a resumed one is
//!   restored from its snapshot with the agents the factory builds;
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
//!   speech goes first (a voice front's TTS waits on it). A turn's `InputDone` follows
//!   the events and speech it produced (the loop prefers both: `biased`, and so does its
//!   gathering of what is ready);
//! * the lease is renewed every third of its length, and at once after a reconnection;
//!   it is trusted only on a connection that has been up since the renewal was sent (a
//!   dropped connection may have let another worker claim the session,
//!   `tests/cluster/a_cut_off_owner_is_not_doubled.rs`); while it cannot be trusted the
//!   loop answers no request (the gateway retries) and holds its events back (published
//!   once the lease is renewed); once its clock runs out the snapshot writer writes
//!   nothing either (a newer owner's claim fences it in the store before); a lease lost to
//!   another worker, or a snapshot write the store refused, ends the session at once,
//!   and nothing more is written;
//! * it ends on `close`, the idle timeout, or a lost lease: then it publishes what
//!   remains, the `InputDone` of the close, `SessionClosed`, writes the snapshots'
//!   tombstone and the `Ended` owner record;
//! * on the worker's drain it moves: it answers inputs `Moving` (the gateway sends them
//!   to the next owner), lets the session settle until the drain's deadline (interrupting
//!   it there), stores its last snapshot, publishes the outcomes still due and
//!   `SessionMoving`, writes the `Moving` owner record and queues a resume job.
//!
//! Guarantees, each with its test: an input id is applied once however often it is sent
//! (`tests/cluster/inputs_apply_exactly_once.rs`, and across a move:
//! `tests/cluster/a_crashed_worker_s_sessions_go_on_elsewhere.rs`); a gateway gets every
//! event in order across a server restart (`tests/cluster/sessions_survive_a_server_restart.rs`);
//! a drained session goes on on another worker (`tests/cluster/drain_moves_sessions.rs`); a
//! fenced owner writes nothing (`tests/cluster/a_paused_worker_is_fenced.rs`).

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use async_nats::Subscriber;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use std::sync::atomic::{AtomicBool, Ordering};

use async_nats::jetstream;
use switchboard::snapshot::{AgentRegistry, SessionSnapshot, StoreError};
use switchboard::{
    Engine, HostInput, InputAnswer, InputId, RunResult, SayOptions, Session, SessionEvent,
    SessionHistory,
};
use tokio::sync::{broadcast, mpsc, watch};
use tokio::time::Instant;

use super::counts::Counts;
use super::event_log::EventLog;
use super::ledger::{Admission, InputLedger};
use super::output::PublishingOutput;
use crate::connect::ClusterClient;
use crate::dispatch;
use crate::namespace::{Namespace, SessionKey};
use crate::ownership::{LeaseClock, LeaseError, Ownership};
use crate::protocol::{Answer, Failure, Input, InputOutcome, Reply, Request, WireEventKind};
use crate::remote_event::{CloseReason, RemoteEventKind};
use crate::snapshots::SnapshotWriter;
use crate::spec::{FactoryError, SessionFactory, SessionSpec};

/// The most things a session said that one wake of its loop gathers into a batch.
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

/// Runs the session under `ownership` until it ends or moves; see the module docs.
pub(crate) async fn host(
    hosting: Arc<Hosting>,
    key: SessionKey,
    start: Start,
    ownership: Ownership,
    writer: SnapshotWriter,
) {
    let events_subject = hosting.namespace.session_events(&key);
    let mut log = EventLog::new(ownership.epoch(), hosting.replay_bytes);
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
            .map_err(|err| format!("the session did not start: {err}")),
        Err(err) => Err(format!("the worker cannot build it: {err}")),
    };
    let running = match started {
        Ok((session, last_input)) => {
            let subject = hosting.namespace.session_inputs(&key);
            match hosting.client.nats().subscribe(subject).await {
                Ok(inputs) => Ok((session, inputs, last_input)),
                Err(err) => {
                    writer.seal().await;
                    let _ = session.close().await;
                    Err(format!("cannot subscribe to its inputs: {err}"))
                }
            }
        }
        Err(reason) => Err(reason),
    };
    let (session, inputs, last_input) = match running {
        Ok(running) => running,
        Err(reason) => {
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
    let mut connections = hosting.client.connections();
    connections.borrow_and_update();
    let hosted = Hosted {
        engine_events: session.subscribe(),
        session,
        speech,
        speech_open: true,
        events_open: true,
        inputs,
        drain: hosting.drain.clone(),
        lease: ownership.clock(),
        lease_sent: ownership.sent(),
        connections,
        connections_open: true,
        renew_every: ownership.renew_every(),
        epoch: ownership.epoch(),
        ownership: Some(ownership),
        renewal: None,
        events_subject,
        log,
        ledger: InputLedger::resumed(last_input),
        running: FuturesUnordered::new(),
        ending: None,
        last_input: Instant::now(),
        fenced: writer.fenced(),
        writer,
        quiet: Arc::new(AtomicBool::new(false)),
        key,
        hosting: hosting.clone(),
    };
    hosted.run(first).await;
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

/// A piece of work under way in the loop, and what it gives when done.
enum Finished {
    /// An input's outcome, for its `InputDone`.
    Input { id: u64, outcome: InputOutcome },
    /// The session closed (a close input, the idle timeout).
    Ended {
        reason: CloseReason,
        close_input: Option<u64>,
        history: SessionHistory,
    },
    /// The drain settled the session and stored its last snapshot (or tried to).
    Moved { saved: Result<(), StoreError> },
}

/// How the loop ended.
enum Exit {
    Ended {
        reason: CloseReason,
        close_input: Option<u64>,
        history: SessionHistory,
    },
    /// Its last snapshot is stored: hand it over.
    Moved,
    /// Another worker owns the session now.
    Fenced(String),
    /// The connection is closed for good (the worker's client was dropped).
    Disconnected,
}

/// Why new inputs are no longer applied.
#[derive(Clone, Debug)]
enum Ending {
    /// The session ends.
    End(CloseReason),
    /// It moves to another worker.
    Moving,
}

struct Hosted {
    hosting: Arc<Hosting>,
    key: SessionKey,
    events_subject: String,
    session: Session,
    engine_events: broadcast::Receiver<SessionEvent>,
    events_open: bool,
    speech: mpsc::UnboundedReceiver<RemoteEventKind>,
    speech_open: bool,
    inputs: Subscriber,
    drain: watch::Receiver<Option<Instant>>,
    /// Away while a renewal is under way (`renewal` has it then).
    ownership: Option<Ownership>,
    /// The lease's validity, readable while the ownership is away.
    lease: LeaseClock,
    /// When the write the lease counts from was sent: the lease is trusted only on a
    /// connection that was up then (see `lease_trusted`).
    lease_sent: std::time::Instant,
    /// Counts the connection's (re)connections: a renewal goes out at once after one.
    connections: watch::Receiver<u64>,
    connections_open: bool,
    renew_every: Duration,
    /// A renewal under way, beside the loop: a request lost in an outage must not stall
    /// the session's inputs and events once the server is back.
    renewal: Option<BoxFuture<'static, (Ownership, Result<(), LeaseError>)>>,
    log: EventLog,
    ledger: InputLedger,
    running: FuturesUnordered<BoxFuture<'static, Finished>>,
    /// Set once the session is closing or moving: new inputs are refused.
    ending: Option<Ending>,
    last_input: Instant,
    /// The owner's epoch.
    epoch: u64,
    writer: SnapshotWriter,
    /// Changes to true when the store refused a write: a newer owner has the session.
    fenced: watch::Receiver<bool>,
    /// Set once a drain's last snapshot is taken: what the session does after it is not
    /// the conversation the next owner resumes, so it is not published.
    quiet: Arc<AtomicBool>,
}

impl Hosted {
    async fn run(mut self, first: RemoteEventKind) {
        self.emit(first);
        let every = self.renew_every;
        let mut renew = tokio::time::interval_at(Instant::now() + every, every);
        renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // A drain that began before this session started applies to it too.
        let mut drain_now = self.drain.borrow().is_some();
        self.renew_if_reconnected();
        let exit = loop {
            self.send_events().await;
            if drain_now && self.ending.is_none() {
                self.begin_drain();
            }
            drain_now = false;
            let idle_at = self.hosting.idle_timeout.map(|idle| self.last_input + idle);
            tokio::select! {
                biased;
                // Speech first: it is what a voice front's TTS waits on.
                speech = self.speech.recv(), if self.speech_open => match speech {
                    Some(kind) => self.emit_from_session(kind),
                    None => self.speech_open = false,
                },
                event = self.engine_events.recv(), if self.events_open => self.on_engine_event(event),
                Some(finished) = self.running.next(), if !self.running.is_empty() => {
                    if let Some(exit) = self.on_finished(finished) {
                        break exit;
                    }
                }
                changed = self.fenced.changed() => {
                    if changed.is_ok() && *self.fenced.borrow() {
                        break Exit::Fenced("a newer owner wrote the session's snapshots".into());
                    }
                    if changed.is_err() {
                        // The writer is gone: the session is too.
                        std::future::pending::<()>().await;
                    }
                }
                request = self.inputs.next() => match request {
                    Some(request) => self.on_request(request).await,
                    None => break Exit::Disconnected,
                },
                _ = renew.tick(), if self.renewal.is_none() => self.begin_renewal(),
                changed = self.connections.changed(), if self.connections_open => match changed {
                    Ok(()) => self.renew_if_reconnected(),
                    // The client is gone: its subscription to the inputs ends the session.
                    Err(_) => self.connections_open = false,
                },
                (ownership, renewed) = finish_renewal(&mut self.renewal), if self.renewal.is_some() => {
                    if renewed.is_ok() {
                        self.lease_sent = ownership.sent();
                    }
                    self.ownership = Some(ownership);
                    match renewed {
                        // Events held while the lease could not be trusted go with the
                        // next batch (a renewal sent before a reconnection is followed
                        // by one sent after it).
                        Ok(()) => self.renew_if_reconnected(),
                        Err(LeaseError::Lost { now, .. }) => break Exit::Fenced(now),
                        Err(err @ LeaseError::Unreachable { .. }) => {
                            tracing::warn!(session = %self.key, error = %err, valid = self.lease.is_valid(), "lease not renewed");
                        }
                    }
                }
                changed = self.drain.changed(), if self.ending.is_none() => {
                    // A closed channel means the worker is gone: drain as well.
                    drain_now = changed.is_err() || self.drain.borrow().is_some();
                }
                _ = sleep_until(idle_at), if self.ending.is_none() && idle_at.is_some() => {
                    self.begin_ending(CloseReason::Idle, None);
                }
            }
            // Whatever else the session has said by now goes in the same batch.
            if let Some(exit) = self.gather_ready() {
                break exit;
            }
        };
        self.finish(exit).await;
    }

    fn on_engine_event(&mut self, event: Result<SessionEvent, broadcast::error::RecvError>) {
        match event {
            Ok(event) => {
                self.emit_from_session(RemoteEventKind::Session { event });
            }
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                self.emit(RemoteEventKind::EventsDropped { missed });
            }
            Err(broadcast::error::RecvError::Closed) => self.events_open = false,
        }
    }

    /// A piece of work under way is done: its `InputDone`, or the loop's end.
    fn on_finished(&mut self, finished: Finished) -> Option<Exit> {
        match finished {
            Finished::Input { id, outcome } => {
                self.emit(WireEventKind::InputDone { input: id, outcome });
                None
            }
            Finished::Ended {
                reason,
                close_input,
                history,
            } => Some(Exit::Ended {
                reason,
                close_input,
                history,
            }),
            Finished::Moved { saved } => Some(match saved {
                Err(StoreError::Fenced { reason, .. }) => Exit::Fenced(reason),
                Err(err) => {
                    // The store keeps the last settled state the session saved; the
                    // gateway sends the inputs after it again.
                    tracing::warn!(session = %self.key, error = %err, "the drain's last snapshot was not stored: moving with the one before");
                    Exit::Moved
                }
                Ok(()) => Exit::Moved,
            }),
        }
    }

    /// Takes what the session has ready without waiting, in the loop's order (speech,
    /// then events, then finished work: a turn's `InputDone` after what it said), so it
    /// goes out in one batch.
    fn gather_ready(&mut self) -> Option<Exit> {
        // Bounded: a session that streams faster than this drains must not hold off its
        // inputs and its lease's renewal.
        for _ in 0..GATHER_AT_MOST {
            if self.take_said() {
                continue;
            }
            if self.running.is_empty() {
                return None;
            }
            // Polled with a no-op waker: the loop's `select!` polls it again with its own
            // before it waits.
            match self.running.next().now_or_never() {
                Some(Some(finished)) => {
                    if let Some(exit) = self.on_finished(finished) {
                        return Some(exit);
                    }
                }
                _ => return None,
            }
        }
        None
    }

    /// Takes one thing the session said, if one is ready (speech first); whether it did.
    fn take_said(&mut self) -> bool {
        if self.speech_open {
            match self.speech.try_recv() {
                Ok(kind) => {
                    self.emit_from_session(kind);
                    return true;
                }
                Err(mpsc::error::TryRecvError::Disconnected) => self.speech_open = false,
                Err(mpsc::error::TryRecvError::Empty) => {}
            }
        }
        if self.events_open {
            match self.engine_events.try_recv() {
                Ok(event) => {
                    self.on_engine_event(Ok(event));
                    return true;
                }
                Err(broadcast::error::TryRecvError::Lagged(missed)) => {
                    self.on_engine_event(Err(broadcast::error::RecvError::Lagged(missed)));
                    return true;
                }
                Err(broadcast::error::TryRecvError::Closed) => self.events_open = false,
                Err(broadcast::error::TryRecvError::Empty) => {}
            }
        }
        false
    }

    /// Whether the session may act as its owner: its lease is valid on its own clock, and
    /// the connection has stayed up since the write the lease counts from was sent. A
    /// connection that dropped took the session's subscriptions with it, so a gateway
    /// found the owner silent and another worker may have claimed the session at once
    /// (`worker/silent_owner.rs`), its lease notwithstanding; the client subscribes
    /// again by itself when it reconnects, so until a renewal sent after that succeeds
    /// (it fails if another worker claimed), this owner answers nothing and publishes
    /// nothing: two owners never both apply an input.
    fn lease_trusted(&self) -> bool {
        self.lease.is_valid()
            && self
                .hosting
                .client
                .up_since()
                .is_some_and(|up| up <= self.lease_sent)
    }

    /// Begins a renewal at once if the connection came back after the write the lease
    /// counts from was sent (and none is under way): the session answers again as soon as
    /// it knows it still owns the session.
    fn renew_if_reconnected(&mut self) {
        let reconnected = self
            .hosting
            .client
            .up_since()
            .is_some_and(|up| up > self.lease_sent);
        if reconnected && self.renewal.is_none() {
            self.begin_renewal();
        }
    }

    /// Renews the lease beside the loop, bounded by the renewal period.
    fn begin_renewal(&mut self) {
        let Some(mut ownership) = self.ownership.take() else {
            return;
        };
        let every = self.renew_every;
        let key = self.key.clone();
        self.renewal = Some(
            async move {
                let renewed = tokio::time::timeout(every, ownership.renew())
                    .await
                    .unwrap_or_else(|_| {
                        Err(LeaseError::Unreachable {
                            session: key,
                            reason: format!("no answer within {every:?}"),
                        })
                    });
                (ownership, renewed)
            }
            .boxed(),
        );
    }

    /// Publishes what remains and releases or hands over the session (or, fenced, just
    /// stops).
    async fn finish(mut self, exit: Exit) {
        // No longer live from here: counted before the owner record says it ended (or
        // moved), so whoever reads that record then reads the worker's count without it.
        self.hosting.counts.session_ended();
        // A renewal under way has the ownership: wait for it (bounded by its own timeout).
        if self.renewal.is_some() {
            let (ownership, renewed) = finish_renewal(&mut self.renewal).await;
            self.ownership = Some(ownership);
            if let Err(LeaseError::Lost { now, .. }) = renewed {
                if matches!(exit, Exit::Ended { .. } | Exit::Moved) {
                    return self.finish_fenced(now).await;
                }
            }
        }
        match exit {
            Exit::Ended {
                reason,
                close_input,
                history,
            } => {
                // What the session said while closing, then the answers of inputs still
                // under way (they end quickly on a closed session), then the close.
                while self.take_said() {}
                self.emit_outcomes_due().await;
                if let Some(id) = close_input {
                    let outcome = InputOutcome::History { history };
                    self.emit(WireEventKind::InputDone { input: id, outcome });
                }
                self.emit(RemoteEventKind::SessionClosed { reason });
                self.send_events().await;
                let _ = self.inputs.unsubscribe().await;
                // The snapshots first: a stale owner's tombstone is refused, and then it
                // writes no record either.
                if let Err(err) = self.writer.end().await {
                    if let StoreError::Fenced { reason, .. } = err {
                        return self.finish_fenced(reason).await;
                    }
                    tracing::warn!(session = %self.key, error = %err, "cannot end the session's snapshots");
                }
                if let Some(ownership) = self.ownership.take() {
                    if let Err(err) = ownership.release().await {
                        tracing::warn!(session = %self.key, error = %err, "cannot write the ended record");
                    }
                }
                self.count_refused_writes();
            }
            Exit::Moved => self.hand_over().await,
            Exit::Fenced(now) => self.finish_fenced(now).await,
            Exit::Disconnected => {
                self.writer.seal().await;
                self.running.clear();
                let _ = self.session.close().await;
                self.count_refused_writes();
            }
        }
    }

    /// The `InputDone` of inputs still under way (they end quickly on a settled or closed
    /// session; bounded).
    async fn emit_outcomes_due(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(2);
        while let Ok(Some(finished)) = tokio::time::timeout_at(deadline, self.running.next()).await
        {
            if let Finished::Input { id, outcome } = finished {
                self.emit(WireEventKind::InputDone { input: id, outcome });
            }
        }
    }

    /// The drain stored the session's last snapshot: tell the front, write the `Moving`
    /// record and queue the resume job. Whoever pulls it claims over that record.
    async fn hand_over(mut self) {
        // The outcomes of inputs applied before the drain belong to the old owner: the
        // new one does not run them again (they are in the snapshot).
        self.emit_outcomes_due().await;
        self.send_events().await;
        // Closing is not the conversation: the snapshot is stored, nothing of it is
        // written or published.
        self.quiet.store(true, Ordering::SeqCst);
        self.writer.seal().await;
        self.events_open = false;
        self.speech_open = false;
        let _ = self.session.close().await;
        self.emit(RemoteEventKind::SessionMoving);
        self.send_events().await;
        let _ = self.inputs.unsubscribe().await;
        let _ = self.hosting.client.nats().flush().await;
        let Some(ownership) = self.ownership.take() else {
            return;
        };
        match ownership.hand_over().await {
            Ok(revision) => {
                let id = format!("{}.moved.{revision}", self.key);
                let queued = dispatch::publish_resume(
                    &self.hosting.js,
                    &self.hosting.namespace,
                    &self.key,
                    &id,
                    None,
                )
                .await;
                if let Err(err) = queued {
                    // The `Moving` record expires after a lease; the workers that see it
                    // queue the resume then.
                    tracing::warn!(session = %self.key, error = %err, "resume job not queued; the record's expiry will be");
                }
                Counts::bump(&self.hosting.counts.moved);
            }
            Err(LeaseError::Lost { now, .. }) => {
                tracing::warn!(session = %self.key, %now, "fenced while handing over");
                Counts::bump(&self.hosting.counts.fenced);
            }
            Err(err) => {
                tracing::warn!(session = %self.key, error = %err, "cannot write the moving record; the lease's expiry hands it over");
            }
        }
        self.count_refused_writes();
    }

    /// Another worker owns the session: stop without writing anything more.
    async fn finish_fenced(mut self, now: String) {
        tracing::warn!(session = %self.key, %now, "fenced: another worker owns the session; stopping without writing");
        Counts::bump(&self.hosting.counts.fenced);
        self.quiet.store(true, Ordering::SeqCst);
        self.writer.seal().await;
        let _ = self.inputs.unsubscribe().await;
        self.running.clear();
        let _ = self.session.close().await;
        self.count_refused_writes();
    }

    fn count_refused_writes(&self) {
        self.hosting
            .counts
            .snapshot_writes_refused
            .fetch_add(self.writer.refused(), Ordering::Relaxed);
    }

    /// [`emit`](Self::emit) for what the session said (its events and speech): dropped
    /// once a drain's last snapshot is taken.
    fn emit_from_session(&mut self, kind: RemoteEventKind) {
        if !self.quiet.load(Ordering::SeqCst) {
            self.emit(kind);
        }
    }

    /// Numbers `kind` and keeps it; it goes out with the next batch.
    fn emit(&mut self, kind: impl Into<WireEventKind>) {
        self.log.record(kind);
    }

    /// Publishes the events not sent yet, as one message (more for a big batch) — unless
    /// the lease cannot be trusted: then they wait (bounded by the log's budget) for the
    /// lease's renewal.
    async fn send_events(&mut self) {
        // Every wake of the loop comes here: nothing new is the common case.
        if !self.log.has_unsent() || !self.lease_trusted() {
            return;
        }
        for message in self.log.take_unsent() {
            self.publish(message).await;
        }
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

    fn reply(
        &self,
        to: async_nats::Subject,
        reply: &Reply,
    ) -> impl Future<Output = ()> + Send + 'static {
        let client = self.hosting.client.nats().clone();
        let json = serde_json::to_vec(reply).unwrap_or_default();
        let key = self.key.clone();
        async move {
            if let Err(err) = client.publish(to, Bytes::from(json)).await {
                tracing::warn!(session = %key, error = %err, "cannot answer a request");
            }
        }
    }

    async fn on_request(&mut self, message: async_nats::Message) {
        let Some(reply_to) = message.reply.clone() else {
            return;
        };
        if !self.lease_trusted() {
            // Not sure it still owns the session: stay silent, the gateway retries and
            // reaches whoever owns it once this is settled.
            return;
        }
        let request: Request = match serde_json::from_slice(&message.payload) {
            Ok(request) => request,
            Err(err) => {
                tracing::warn!(session = %self.key, error = %err, "unreadable request");
                return;
            }
        };
        match request {
            Request::Replay { from, epoch } => {
                // A gateway still counting in an older owner's numbers gets all of ours.
                let from = if epoch < self.epoch { 1 } else { from };
                let (events, complete) = self.log.since(from);
                self.reply(reply_to, &Reply::Replay { events, complete })
                    .await;
            }
            Request::Input { id, input } => match self.ledger.admit(id) {
                Admission::Repeat(answer) => {
                    Counts::bump(&self.hosting.counts.inputs_repeated);
                    let saved = self.writer.saved_input();
                    self.reply(reply_to, &Reply::Applied { id, answer, saved })
                        .await;
                }
                Admission::Earlier { last } => {
                    Counts::bump(&self.hosting.counts.inputs_repeated);
                    // Its answer, when the session's ledger keeps it.
                    let recorded = self.session.applied(InputId::new(id));
                    match recorded.and_then(Answer::recorded) {
                        Some(answer) => {
                            let saved = self.writer.saved_input();
                            self.reply(reply_to, &Reply::Applied { id, answer, saved })
                                .await;
                        }
                        None => self.reply(reply_to, &Reply::Earlier { id, last }).await,
                    }
                }
                Admission::OutOfOrder { expected } => {
                    self.reply(reply_to, &Reply::OutOfOrder { expected }).await;
                }
                Admission::Apply => {
                    match self.ending.clone() {
                        Some(Ending::End(reason)) => {
                            self.reply(reply_to, &Reply::Closed { reason }).await;
                            return;
                        }
                        Some(Ending::Moving) => {
                            self.reply(reply_to, &Reply::Moving).await;
                            return;
                        }
                        None => {}
                    }
                    // Applied by the owner whose snapshot this session restored, after the
                    // snapshot's last contiguous input: answered from the session's ledger.
                    let recorded = match input {
                        Input::Close => None,
                        _ => self.session.applied(InputId::new(id)),
                    };
                    let answer = match recorded {
                        Some(recorded) => Answer::recorded(recorded).unwrap_or(Answer::Done),
                        None => self.apply(id, input).await,
                    };
                    self.ledger.record(id, answer.clone());
                    Counts::bump(&self.hosting.counts.inputs_applied);
                    self.last_input = Instant::now();
                    let saved = self.writer.saved_input();
                    self.reply(reply_to, &Reply::Applied { id, answer, saved })
                        .await;
                }
            },
        }
    }

    /// Hands `input` to the engine with its id (`Session::apply`); returns what the
    /// gateway hears at once.
    async fn apply(&mut self, id: u64, input: Input) -> Answer {
        let session = self.session.clone();
        let input_id = InputId::new(id);
        let at_once = |answer: Result<InputAnswer, switchboard::SessionError>| match answer {
            Ok(InputAnswer::Speech(speech)) => Answer::Speech {
                speech: speech.id(),
            },
            Ok(_) => Answer::Done,
            Err(err) => Answer::Failed {
                failure: err.into(),
            },
        };
        match input {
            Input::Run { text } => self.under_way(async move {
                let outcome = turn_outcome(session.apply(input_id, HostInput::Run { text }).await);
                Finished::Input { id, outcome }
            }),
            Input::GenerateReply { instructions } => self.under_way(async move {
                let reply = HostInput::GenerateReply { instructions };
                let outcome = turn_outcome(session.apply(input_id, reply).await);
                Finished::Input { id, outcome }
            }),
            Input::Say {
                text,
                allow_interruptions,
                add_to_chat,
            } => {
                let mut options = SayOptions::new().add_to_chat(add_to_chat);
                if let Some(allow) = allow_interruptions {
                    options = options.allow_interruptions(allow);
                }
                at_once(
                    session
                        .apply(input_id, HostInput::Say { text, options })
                        .await,
                )
            }
            Input::Transcript { text, is_final } => {
                let transcript = HostInput::Transcript { text, is_final };
                at_once(session.apply(input_id, transcript).await)
            }
            Input::UserStartedSpeaking => at_once(
                session
                    .apply(input_id, HostInput::UserStartedSpeaking)
                    .await,
            ),
            Input::UserStoppedSpeaking => at_once(
                session
                    .apply(input_id, HostInput::UserStoppedSpeaking)
                    .await,
            ),
            Input::Interrupt { force } => self.under_way(async move {
                let result = session
                    .apply(input_id, HostInput::Interrupt { force })
                    .await;
                Finished::Input {
                    id,
                    outcome: done_outcome(result.map(|_| ())),
                }
            }),
            Input::UpdateAgent { agent, data } => match self.hosting.factory.agent(&agent, &data) {
                Ok(agent) => self.under_way(async move {
                    let update = HostInput::UpdateAgent { agent };
                    let outcome = done_outcome(session.apply(input_id, update).await.map(|_| ()));
                    Finished::Input { id, outcome }
                }),
                Err(error) => Answer::Failed {
                    failure: Failure::Factory { error },
                },
            },
            Input::PlayoutFinished {
                speech,
                interrupted,
                heard,
            } => {
                let report = HostInput::PlayoutFinished {
                    speech,
                    interrupted,
                    heard,
                };
                at_once(session.apply(input_id, report).await)
            }
            Input::History => self.under_way(async move {
                let history = match session.apply(input_id, HostInput::History).await {
                    Ok(InputAnswer::History(history)) => history,
                    _ => SessionHistory::default(),
                };
                Finished::Input {
                    id,
                    outcome: InputOutcome::History { history },
                }
            }),
            Input::Answered => at_once(session.apply(input_id, HostInput::AlreadyAnswered).await),
            Input::Close => {
                self.begin_ending(CloseReason::Host, Some(id));
                Answer::Pending
            }
        }
    }

    /// Starts an engine call whose answer takes time. It is polled once at once: the
    /// engine message is sent on the first poll, before the loop reads the next input, so
    /// the engine sees inputs in the order they came.
    fn under_way(&mut self, work: impl Future<Output = Finished> + Send + 'static) -> Answer {
        let mut work: BoxFuture<'static, Finished> = work.boxed();
        // The real waker comes with the `FuturesUnordered`'s next poll, which polls every
        // newly pushed future.
        let mut cx = Context::from_waker(Waker::noop());
        match work.as_mut().poll(&mut cx) {
            Poll::Ready(done) => self.running.push(futures_util::future::ready(done).boxed()),
            Poll::Pending => self.running.push(work),
        }
        Answer::Pending
    }

    /// Closes the session (after the drain's settle, for a drain); new inputs are refused
    /// from now on.
    fn begin_ending(&mut self, reason: CloseReason, close_input: Option<u64>) {
        self.ending = Some(Ending::End(reason));
        let session = self.session.clone();
        self.under_way(async move {
            let history = session.close().await.unwrap_or_default();
            Finished::Ended {
                reason,
                close_input,
                history,
            }
        });
    }

    /// The worker drains: let the session settle until the deadline (interrupt it there),
    /// take its last snapshot and store it; the loop then hands the session over.
    fn begin_drain(&mut self) {
        let deadline = (*self.drain.borrow()).unwrap_or_else(Instant::now);
        self.ending = Some(Ending::Moving);
        let session = self.session.clone();
        let writer = self.writer.clone();
        let quiet = self.quiet.clone();
        let key = self.key.clone();
        self.under_way(async move {
            if tokio::time::timeout_at(deadline, session.wait_for_settled())
                .await
                .is_err()
            {
                tracing::info!(session = %key, "not settled at the drain's deadline: interrupting");
                let _ = session.force_interrupt().await;
            }
            let snapshot = session.snapshot().await;
            // From here on the session's doings are not the conversation the next owner
            // resumes: not published, not saved (the session's own saving is sealed; this
            // snapshot is written past the seal).
            quiet.store(true, Ordering::SeqCst);
            writer.seal().await;
            let saved = match snapshot {
                Ok(snapshot) => writer.save_last(&snapshot).await,
                Err(err) => Err(StoreError::Unavailable {
                    session: key.to_string(),
                    reason: format!("no snapshot to store: {err}"),
                }),
            };
            Finished::Moved { saved }
        });
    }
}

fn turn_outcome(answer: Result<InputAnswer, switchboard::SessionError>) -> InputOutcome {
    let result = answer.map(|answer| match answer {
        InputAnswer::Turn(result) => result,
        _ => RunResult::default(),
    });
    InputOutcome::Turn {
        result: result.map_err(Failure::from),
    }
}

fn done_outcome(result: Result<(), switchboard::SessionError>) -> InputOutcome {
    InputOutcome::Done {
        result: result.map_err(Failure::from),
    }
}

/// The renewal under way, once it is done (never, without one: the branch is off then).
async fn finish_renewal(
    renewal: &mut Option<BoxFuture<'static, (Ownership, Result<(), LeaseError>)>>,
) -> (Ownership, Result<(), LeaseError>) {
    match renewal {
        Some(under_way) => {
            let done = under_way.await;
            *renewal = None;
            done
        }
        None => std::future::pending().await,
    }
}

/// Sleeps until `at` (never, for `None`: the branch is off then anyway).
pub(super) async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
