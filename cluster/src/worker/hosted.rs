//! A hosted session: the loop that runs one session on its worker, from its claim to its
//! release.
//!
//! It owns the engine's `Session` and everything that session needs on the network: the
//! subscription to the session's input subject, the event log, the input ledger and the
//! lease. One task, one `select!` loop, so the order of what it does is the order it
//! appears on the wire:
//!
//! * an input is applied in the order it came: the engine call that applies it is made
//!   (its first poll sends the engine message) before the next request is read, even when
//!   its answer takes a whole turn (then its outcome comes later as an `InputDone` event);
//! * engine events and speech are published as they come, each numbered by the event
//!   log. Each source keeps its order (the engine's events; a speech's start, chunks and
//!   end); between the two there is no common clock, and when both have something ready
//!   the speech goes first (a voice front's TTS waits on it). A turn's `InputDone`
//!   follows the events and speech it produced (the loop prefers both: `biased`);
//! * the lease is renewed every third of its length; while it cannot be trusted the loop
//!   answers no request (the gateway retries) and holds its events back (published once
//!   the lease is renewed); a lease lost to another worker ends the session at once, and
//!   nothing more is written;
//! * it ends on `close`, the worker's drain (settle, or interrupt at the deadline, then
//!   close), the idle timeout, or a lost lease; then it publishes what remains, the
//!   `InputDone` of the close, `SessionEnded`, and writes the `Ended` owner record.
//!
//! Guarantees, each with its test: an input id is applied once however often it is sent
//! (`tests/cluster/inputs_apply_exactly_once.rs`); a gateway gets every event in order across a
//! server restart (`tests/cluster/sessions_survive_a_server_restart.rs`); a drained session ends
//! with `SessionEnded { reason: Drained }` and its owner record says `Ended`
//! (`tests/cluster/drain_closes_and_releases.rs`).

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use async_nats::Subscriber;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use switchboard::{Engine, PlayoutReporter, SayOptions, Session, SessionEvent};
use tokio::sync::{broadcast, mpsc, watch};
use tokio::time::Instant;

use super::counts::Counts;
use super::event_log::EventLog;
use super::ledger::{Admission, InputLedger};
use super::output::PublishingOutput;
use crate::connect::ClusterClient;
use crate::namespace::{Namespace, SessionKey};
use crate::ownership::{LeaseClock, LeaseError, Ownership};
use crate::protocol::{Answer, Input, Reply, Request};
use crate::remote_event::{
    EndReason, InputOutcome, RemoteEventKind, RemoteFailure, RemoteHistory, RemoteRunResult,
};
use crate::spec::{SessionFactory, SessionSpec};

/// What every session of a worker shares.
pub(crate) struct Hosting {
    pub(crate) client: ClusterClient,
    pub(crate) namespace: Namespace,
    pub(crate) engine: Engine,
    pub(crate) factory: Arc<dyn SessionFactory>,
    pub(crate) counts: Arc<Counts>,
    /// Set to the drain's deadline when the worker drains.
    pub(crate) drain: watch::Receiver<Option<Instant>>,
    pub(crate) idle_timeout: Option<Duration>,
    pub(crate) replay_bytes: usize,
}

/// Runs the session `spec` asks for under `ownership` until it ends; see the module docs.
pub(crate) async fn host(
    hosting: Arc<Hosting>,
    key: SessionKey,
    spec: SessionSpec,
    ownership: Ownership,
) {
    let events_subject = hosting.namespace.session_events(&key);
    let mut log = EventLog::new(ownership.epoch(), hosting.replay_bytes);
    let (speech_tx, speech) = mpsc::unbounded_channel();
    let reporter = Arc::new(OnceLock::new());
    let started = match hosting.factory.session(&spec) {
        Ok(builder) => builder
            .output(PublishingOutput::new(
                speech_tx,
                spec.output,
                reporter.clone(),
            ))
            .start(&hosting.engine)
            .await
            .map_err(|err| format!("the session did not start: {err}")),
        Err(err) => Err(format!("the worker cannot build it: {err}")),
    };
    let running = match started {
        Ok(session) => {
            let subject = hosting.namespace.session_inputs(&key);
            match hosting.client.nats().subscribe(subject).await {
                Ok(inputs) => Ok((session, inputs)),
                Err(err) => {
                    let _ = session.close().await;
                    Err(format!("cannot subscribe to its inputs: {err}"))
                }
            }
        }
        Err(reason) => Err(reason),
    };
    let (session, inputs) = match running {
        Ok(running) => running,
        Err(reason) => {
            tracing::warn!(session = %key, %reason, "session not started");
            let (_, json) = log.record(RemoteEventKind::StartFailed { reason });
            let _ = hosting
                .client
                .nats()
                .publish(events_subject, json.into())
                .await;
            Counts::bump(&hosting.counts.refused);
            if let Err(err) = ownership.release().await {
                tracing::warn!(session = %key, error = %err, "cannot release a session that did not start");
            }
            return;
        }
    };
    hosting.counts.session_live();
    let hosted = Hosted {
        engine_events: session.subscribe(),
        session,
        speech,
        speech_open: true,
        events_open: true,
        reporter,
        inputs,
        drain: hosting.drain.clone(),
        lease: ownership.clock(),
        renew_every: ownership.renew_every(),
        ownership: Some(ownership),
        renewal: None,
        events_subject,
        log,
        published: 0,
        ledger: InputLedger::default(),
        running: FuturesUnordered::new(),
        ending: None,
        last_input: Instant::now(),
        key,
        hosting: hosting.clone(),
    };
    hosted.run().await;
    hosting.counts.session_ended();
}

/// A piece of work under way in the loop, and what it gives when done.
enum Finished {
    /// An input's outcome, for its `InputDone`.
    Input { id: u64, outcome: InputOutcome },
    /// The session closed (a close input, a drain, the idle timeout).
    Ended {
        reason: EndReason,
        close_input: Option<u64>,
        history: RemoteHistory,
    },
}

/// How the loop ended.
enum Exit {
    Ended {
        reason: EndReason,
        close_input: Option<u64>,
        history: RemoteHistory,
    },
    /// Another worker owns the session now.
    Fenced(String),
    /// The connection is closed for good (the worker's client was dropped).
    Disconnected,
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
    reporter: Arc<OnceLock<PlayoutReporter>>,
    inputs: Subscriber,
    drain: watch::Receiver<Option<Instant>>,
    /// Away while a renewal is under way (`renewal` has it then).
    ownership: Option<Ownership>,
    /// The lease's validity, readable while the ownership is away.
    lease: LeaseClock,
    renew_every: Duration,
    /// A renewal under way, beside the loop: a request lost in an outage must not stall
    /// the session's inputs and events once the server is back.
    renewal: Option<BoxFuture<'static, (Ownership, Result<(), LeaseError>)>>,
    log: EventLog,
    /// The last event sent on the events subject (later ones are held while the lease
    /// cannot be trusted).
    published: u64,
    ledger: InputLedger,
    running: FuturesUnordered<BoxFuture<'static, Finished>>,
    /// Set once the session is closing: new inputs are refused.
    ending: Option<EndReason>,
    last_input: Instant,
}

impl Hosted {
    async fn run(mut self) {
        self.emit(RemoteEventKind::SessionStarted).await;
        let every = self.renew_every;
        let mut renew = tokio::time::interval_at(Instant::now() + every, every);
        renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // A drain that began before this session started applies to it too.
        let mut drain_now = self.drain.borrow().is_some();
        let exit = loop {
            if drain_now && self.ending.is_none() {
                self.begin_drain();
            }
            drain_now = false;
            let idle_at = self.hosting.idle_timeout.map(|idle| self.last_input + idle);
            tokio::select! {
                biased;
                // Speech first: it is what a voice front's TTS waits on.
                speech = self.speech.recv(), if self.speech_open => match speech {
                    Some(kind) => self.emit(kind).await,
                    None => self.speech_open = false,
                },
                event = self.engine_events.recv(), if self.events_open => match event {
                    Ok(event) => {
                        if let Some(kind) = RemoteEventKind::from_session_event(&event) {
                            self.emit(kind).await;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        self.emit(RemoteEventKind::EventsDropped { missed }).await;
                    }
                    Err(broadcast::error::RecvError::Closed) => self.events_open = false,
                },
                Some(finished) = self.running.next(), if !self.running.is_empty() => match finished {
                    Finished::Input { id, outcome } => {
                        self.emit(RemoteEventKind::InputDone { input: id, outcome }).await;
                    }
                    Finished::Ended { reason, close_input, history } => {
                        break Exit::Ended { reason, close_input, history };
                    }
                },
                request = self.inputs.next() => match request {
                    Some(request) => self.on_request(request).await,
                    None => break Exit::Disconnected,
                },
                _ = renew.tick(), if self.renewal.is_none() => self.begin_renewal(),
                (ownership, renewed) = finish_renewal(&mut self.renewal), if self.renewal.is_some() => {
                    self.ownership = Some(ownership);
                    match renewed {
                        Ok(()) => self.publish_held().await,
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
                    self.begin_ending(EndReason::Idle, None);
                }
            }
        };
        self.finish(exit).await;
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

    /// Publishes what remains and releases the session (or, fenced, just stops).
    async fn finish(mut self, exit: Exit) {
        // A renewal under way has the ownership: wait for it (bounded by its own timeout).
        if self.renewal.is_some() {
            let (ownership, renewed) = finish_renewal(&mut self.renewal).await;
            self.ownership = Some(ownership);
            if let Err(LeaseError::Lost { now, .. }) = renewed {
                if matches!(exit, Exit::Ended { .. }) {
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
                while let Ok(kind) = self.speech.try_recv() {
                    self.emit(kind).await;
                }
                while let Ok(event) = self.engine_events.try_recv() {
                    if let Some(kind) = RemoteEventKind::from_session_event(&event) {
                        self.emit(kind).await;
                    }
                }
                let deadline = Instant::now() + Duration::from_secs(2);
                while let Ok(Some(Finished::Input { id, outcome })) =
                    tokio::time::timeout_at(deadline, self.running.next()).await
                {
                    self.emit(RemoteEventKind::InputDone { input: id, outcome })
                        .await;
                }
                if let Some(id) = close_input {
                    let outcome = InputOutcome::History { history };
                    self.emit(RemoteEventKind::InputDone { input: id, outcome })
                        .await;
                }
                self.emit(RemoteEventKind::SessionEnded { reason }).await;
                let _ = self.inputs.unsubscribe().await;
                if let Some(ownership) = self.ownership.take() {
                    if let Err(err) = ownership.release().await {
                        tracing::warn!(session = %self.key, error = %err, "cannot write the ended record");
                    }
                }
            }
            Exit::Fenced(now) => self.finish_fenced(now).await,
            Exit::Disconnected => {
                self.running.clear();
                let _ = self.session.close().await;
            }
        }
    }

    /// Another worker owns the session: stop without writing anything more.
    async fn finish_fenced(mut self, now: String) {
        tracing::warn!(session = %self.key, %now, "fenced: another worker owns the session; stopping without writing");
        Counts::bump(&self.hosting.counts.fenced);
        let _ = self.inputs.unsubscribe().await;
        self.running.clear();
        let _ = self.session.close().await;
    }

    /// Numbers `kind`, keeps it, and publishes it unless the lease cannot be trusted.
    async fn emit(&mut self, kind: RemoteEventKind) {
        let (event, json) = self.log.record(kind);
        if self.lease.is_valid() && self.published + 1 == event.seq {
            self.publish(json).await;
            self.published = event.seq;
        }
    }

    /// Publishes the events held back while the lease could not be trusted.
    async fn publish_held(&mut self) {
        if self.published == self.log.last_seq() {
            return;
        }
        let held: Vec<Vec<u8>> = self
            .log
            .after(self.published)
            .map(|event| serde_json::to_vec(event).unwrap_or_default())
            .collect();
        for json in held {
            self.publish(json).await;
        }
        self.published = self.log.last_seq();
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
        if !self.lease.is_valid() {
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
            Request::Replay { from } => {
                let (events, complete) = self.log.since(from);
                self.reply(reply_to, &Reply::Replay { events, complete })
                    .await;
            }
            Request::Input { id, input } => match self.ledger.admit(id) {
                Admission::Repeat(answer) => {
                    Counts::bump(&self.hosting.counts.inputs_repeated);
                    self.reply(reply_to, &Reply::Applied { id, answer }).await;
                }
                Admission::Stale => Counts::bump(&self.hosting.counts.inputs_repeated),
                Admission::OutOfOrder { expected } => {
                    self.reply(reply_to, &Reply::OutOfOrder { expected }).await;
                }
                Admission::Apply => {
                    if let Some(reason) = self.ending.clone() {
                        self.reply(reply_to, &Reply::Ended { reason }).await;
                        return;
                    }
                    let answer = self.apply(id, input).await;
                    self.ledger.record(id, answer.clone());
                    Counts::bump(&self.hosting.counts.inputs_applied);
                    self.last_input = Instant::now();
                    self.reply(reply_to, &Reply::Applied { id, answer }).await;
                }
            },
        }
    }

    /// Hands `input` to the engine; returns what the gateway hears at once.
    async fn apply(&mut self, id: u64, input: Input) -> Answer {
        let session = self.session.clone();
        match input {
            Input::Run { text } => self.under_way(async move {
                let outcome = turn_outcome(session.run(text).await);
                Finished::Input { id, outcome }
            }),
            Input::GenerateReply { instructions } => self.under_way(async move {
                let outcome = turn_outcome(session.generate_reply(instructions).await);
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
                match session.say_with(text, options).await {
                    Ok(speech) => Answer::Speech {
                        speech: speech.id(),
                    },
                    Err(err) => Answer::Failed {
                        failure: (&err).into(),
                    },
                }
            }
            Input::Transcript { text, is_final } => {
                session.transcript(text, is_final);
                Answer::Done
            }
            Input::UserStartedSpeaking => {
                session.user_started_speaking();
                Answer::Done
            }
            Input::UserStoppedSpeaking => {
                session.user_stopped_speaking();
                Answer::Done
            }
            Input::Interrupt { force } => self.under_way(async move {
                let result = if force {
                    session.force_interrupt().await
                } else {
                    session.interrupt().await
                };
                Finished::Input {
                    id,
                    outcome: done_outcome(result),
                }
            }),
            Input::UpdateAgent { agent, data } => match self.hosting.factory.agent(&agent, &data) {
                Ok(agent) => self.under_way(async move {
                    let outcome = done_outcome(session.update_agent(agent).await);
                    Finished::Input { id, outcome }
                }),
                Err(err) => Answer::Failed {
                    failure: RemoteFailure::Factory {
                        message: err.to_string(),
                    },
                },
            },
            Input::PlayoutFinished {
                speech,
                interrupted,
                heard,
            } => {
                if let Some(reporter) = self.reporter.get() {
                    reporter.playout_finished(speech, interrupted, heard);
                }
                Answer::Done
            }
            Input::History => self.under_way(async move {
                let history = RemoteHistory::from(&session.history().await);
                Finished::Input {
                    id,
                    outcome: InputOutcome::History { history },
                }
            }),
            Input::Close => {
                self.begin_ending(EndReason::Closed, Some(id));
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
    fn begin_ending(&mut self, reason: EndReason, close_input: Option<u64>) {
        self.ending = Some(reason.clone());
        let session = self.session.clone();
        self.under_way(async move {
            let history = match session.close().await {
                Ok(history) => RemoteHistory::from(&history),
                Err(_) => RemoteHistory::default(),
            };
            Finished::Ended {
                reason,
                close_input,
                history,
            }
        });
    }

    /// The worker drains: let the session settle until the deadline, interrupt it there,
    /// then close.
    fn begin_drain(&mut self) {
        let deadline = (*self.drain.borrow()).unwrap_or_else(Instant::now);
        self.ending = Some(EndReason::Drained);
        let session = self.session.clone();
        let key = self.key.clone();
        self.under_way(async move {
            if tokio::time::timeout_at(deadline, session.wait_for_settled())
                .await
                .is_err()
            {
                tracing::info!(session = %key, "not settled at the drain's deadline: interrupting");
                let _ = session.force_interrupt().await;
            }
            let history = match session.close().await {
                Ok(history) => RemoteHistory::from(&history),
                Err(_) => RemoteHistory::default(),
            };
            Finished::Ended {
                reason: EndReason::Drained,
                close_input: None,
                history,
            }
        });
    }
}

fn turn_outcome(result: Result<switchboard::RunResult, switchboard::SessionError>) -> InputOutcome {
    InputOutcome::Turn {
        result: result
            .as_ref()
            .map(RemoteRunResult::from)
            .map_err(RemoteFailure::from),
    }
}

fn done_outcome(result: Result<(), switchboard::SessionError>) -> InputOutcome {
    InputOutcome::Done {
        result: result.as_ref().map(|_| ()).map_err(RemoteFailure::from),
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
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
