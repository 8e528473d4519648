//! `RemoteSession`: a session running on some worker, with the host API of a local
//! `Session` ([`HostSession`]: run, generate_reply, say, transcript, user speaking,
//! interrupt, update_agent, events, history, close), in the engine's own types (results,
//! histories, events, errors), plus playout reports and events with sequence numbers.
//!
//! Two tasks serve it:
//!
//! * **inputs** (`remote_session/inputs.rs`) sends the session's inputs one at a time, in
//!   the order they were given, each with the next id (1, 2, 3, …), and retries an input
//!   with the same id until its owner answers: core NATS may lose a request, and the
//!   owner applies each id once. It keeps the inputs no stored snapshot holds yet, and
//!   sends them again to a new owner that lacks them.
//! * **events** (`remote_session/events.rs`) receives the session's events, delivers them
//!   in order once each (numbered afresh, so the numbers go on without a gap when the
//!   session moves to another owner), asks the owner again for any it missed (a gap, a
//!   reconnection, or a periodic check while an answer is awaited), and hands each
//!   `InputDone` to the call waiting for it. A speech the front meets, in a `say`'s
//!   answer or its `SessionEvent::SpeechCreated`, gets one handle linked to this session
//!   (`remote_session/speeches.rs`): interrupting it asks the worker to interrupt that
//!   speech alone, and the session's `SpeechPlayedOut` ends it.
//!
//! When the session moves (its worker drains, dies or loses its lease) the front sees a
//! pause, then `SessionResumed` and the session going on: inputs sent meanwhile reach the
//! new owner, and a turn that was under way runs again there and answers its caller.
//!
//! Dropping the last handle closes the session, as dropping a local `Session` does.

mod events;
mod inputs;
mod speeches;

/// The gateway's joiner of parts, for the worker's tests to read what an owner publishes as
/// a gateway does.
#[cfg(test)]
pub(crate) use events::EventOrder;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use switchboard::{
    EventsMissed, HostSession, RunResult, SessionEvent, SessionEvents, SessionHistory,
    SpeechControl, SpeechHandle, SpeechId, SpeechOutcome,
};
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::dispatch;
use crate::gateway::{GatewayError, GatewayInner};
use crate::namespace::SessionKey;
use crate::protocol::{Answer, Failure, Input, InputOutcome, SessionJob, WireEvent, WireEventKind};
use crate::remote_event::{CloseReason, RemoteEvent, RemoteEventKind};
use crate::spec::AgentSpec;
use inputs::Submission;
use speeches::Speeches;

/// Where a session's start is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum StartState {
    Waiting,
    Started,
    Failed(String),
}

/// Why a subscriber got no event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteEventsError {
    /// It fell behind by this many events, which it will not see (subscribe again with
    /// `subscribe_from` to read the kept ones).
    #[error("the subscriber fell behind and missed {missed} events")]
    Lagged {
        /// How many.
        missed: u64,
    },
    /// The session closed and every event was delivered.
    #[error("the session closed; no more events")]
    Closed,
}

/// A subscription to a remote session's events, in sequence order: the kept events it
/// asked for, then the live ones. (Both are taken under one lock, the one every delivery
/// takes, so none is missed or seen twice between them.)
#[derive(Debug)]
pub struct RemoteEvents {
    backlog: VecDeque<RemoteEvent>,
    live: broadcast::Receiver<RemoteEvent>,
}

impl RemoteEvents {
    /// The next event; waits for it.
    pub async fn recv(&mut self) -> Result<RemoteEvent, RemoteEventsError> {
        if let Some(event) = self.backlog.pop_front() {
            return Ok(event);
        }
        match self.live.recv().await {
            Ok(event) => Ok(event),
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                Err(RemoteEventsError::Lagged { missed })
            }
            Err(broadcast::error::RecvError::Closed) => Err(RemoteEventsError::Closed),
        }
    }

    /// The next event if one is here already, without waiting: `None` when none is.
    pub fn try_recv(&mut self) -> Option<Result<RemoteEvent, RemoteEventsError>> {
        if let Some(event) = self.backlog.pop_front() {
            return Some(Ok(event));
        }
        match self.live.try_recv() {
            Ok(event) => Some(Ok(event)),
            Err(broadcast::error::TryRecvError::Lagged(missed)) => {
                Some(Err(RemoteEventsError::Lagged { missed }))
            }
            Err(broadcast::error::TryRecvError::Closed) => Some(Err(RemoteEventsError::Closed)),
            Err(broadcast::error::TryRecvError::Empty) => None,
        }
    }
}

/// A remote session's events as a local session's subscriber gets them
/// ([`HostSession::events`]): the engine's [`SessionEvent`]s, in order, ending with
/// `Closed`. Events the gateway could not get back, or the worker dropped, come as
/// [`EventsMissed`]. The speech stream and the cluster's own events (moving, resumed) are
/// left out: [`RemoteSession::subscribe`] has them all.
#[derive(Debug)]
pub struct RemoteSessionEvents {
    events: RemoteEvents,
    /// Whether the last event, `Closed`, was handed out.
    closed: bool,
}

impl RemoteSessionEvents {
    /// What `event` is to a reader of session events: `None` to skip it.
    fn session_event(
        &mut self,
        event: Result<RemoteEvent, RemoteEventsError>,
    ) -> Option<Option<Result<SessionEvent, EventsMissed>>> {
        let kind = match event {
            Ok(event) => event.kind,
            Err(RemoteEventsError::Lagged { missed }) => {
                return Some(Some(Err(EventsMissed { count: missed })))
            }
            Err(RemoteEventsError::Closed) => return Some(None),
        };
        match kind {
            RemoteEventKind::Session { event } => {
                if matches!(event, SessionEvent::Closed) {
                    self.closed = true;
                }
                Some(Some(Ok(event)))
            }
            RemoteEventKind::EventsLost { from, to } => Some(Some(Err(EventsMissed {
                count: to.saturating_sub(from) + 1,
            }))),
            RemoteEventKind::EventsDropped { missed } => {
                Some(Some(Err(EventsMissed { count: missed })))
            }
            // The engine's own `Closed` did not come (the session closed while its worker
            // drained, or never started): the end is said all the same.
            RemoteEventKind::SessionClosed { .. } | RemoteEventKind::StartFailed { .. }
                if !self.closed =>
            {
                self.closed = true;
                Some(Some(Ok(SessionEvent::Closed)))
            }
            _ => None,
        }
    }
}

impl SessionEvents for RemoteSessionEvents {
    async fn next(&mut self) -> Option<Result<SessionEvent, EventsMissed>> {
        loop {
            let event = self.events.recv().await;
            if let Some(next) = self.session_event(event) {
                return next;
            }
        }
    }

    fn try_next(&mut self) -> Option<Result<SessionEvent, EventsMissed>> {
        loop {
            let event = self.events.try_recv()?;
            if let Some(next) = self.session_event(event) {
                return next;
            }
        }
    }
}

/// Which owner runs the session, as the events showed it: its epoch and the last input
/// its snapshot held when it took over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct OwnerSeen {
    pub(crate) epoch: u64,
    pub(crate) last_input: u64,
}

type Waiter = oneshot::Sender<Result<InputOutcome, GatewayError>>;

/// Inputs whose outcome (`InputDone`) was delivered, above the ones the inputs task forgot.
#[derive(Default)]
struct Outcomes {
    /// The inputs task keeps no input up to this one.
    forgotten: u64,
    delivered: std::collections::BTreeSet<u64>,
}

/// The events delivered so far (the newest), and the channel of the next ones.
struct EventBook {
    /// The number of the last event delivered (the gateway's numbering).
    delivered: u64,
    kept: VecDeque<RemoteEvent>,
    capacity: usize,
    /// Dropped once the session ended and its last event went out: subscribers then end.
    live: Option<broadcast::Sender<RemoteEvent>>,
}

/// What a remote session's handle and its two tasks share.
pub(crate) struct RemoteShared {
    pub(crate) gateway: Arc<GatewayInner>,
    pub(crate) key: SessionKey,
    pub(crate) inputs_subject: String,
    /// Calls waiting for an input's `InputDone`, by input id.
    waiters: Mutex<HashMap<u64, Waiter>>,
    /// The inputs whose `InputDone` was delivered and that the inputs task still keeps
    /// (it forgets them with the inputs): their answers are the front's, so they are never
    /// sent again.
    outcomes: Mutex<Outcomes>,
    book: Mutex<EventBook>,
    /// The handles of the speeches the front met (in a `say`'s answer or an event).
    speeches: Mutex<Speeches>,
    started: watch::Sender<StartState>,
    closed: watch::Sender<Option<CloseReason>>,
    /// Changed at each `SessionResumed`: the inputs task sends the new owner what it lacks.
    pub(crate) owner: watch::Sender<OwnerSeen>,
    /// The highest owner epoch any event came with.
    epoch_seen: AtomicU64,
    /// The highest owner epoch heard from, in an event delivered or in an answer taken
    /// (an input's or a replay's): an answer from an owner below it is a stale owner's
    /// (fenced, or about to be) and is not the session's, even when the newer owner's
    /// `SessionResumed` has not been delivered yet (it may come late, or be lost).
    newest_owner: AtomicU64,
    /// Set once a close was sent: the owner unsubscribing then is no sign of its death.
    pub(crate) closing: AtomicBool,
    /// The last time the pool was asked to check a silent owner (which owner, which ask).
    silent_asked: std::sync::Mutex<Option<SilentAsk>>,
}

impl RemoteShared {
    fn waiters(&self) -> MutexGuard<'_, HashMap<u64, Waiter>> {
        // Plain maps and lists: a panic elsewhere cannot leave them half-written.
        self.waiters.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn outcomes(&self) -> MutexGuard<'_, Outcomes> {
        self.outcomes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether input `id`'s outcome (`InputDone`) was delivered.
    pub(crate) fn outcome_delivered(&self, id: u64) -> bool {
        self.outcomes().delivered.contains(&id)
    }

    /// The inputs task keeps no input up to `id` any more.
    pub(crate) fn forget_outcomes_through(&self, id: u64) {
        let mut outcomes = self.outcomes();
        outcomes.forgotten = outcomes.forgotten.max(id);
        let kept = outcomes.delivered.split_off(&(id + 1));
        outcomes.delivered = kept;
    }

    fn book(&self) -> MutexGuard<'_, EventBook> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn speeches(&self) -> MutexGuard<'_, Speeches> {
        self.speeches.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Why the session closed, once it did.
    pub(crate) fn closed(&self) -> Option<CloseReason> {
        *self.closed.borrow()
    }

    pub(crate) fn closed_error(&self, reason: CloseReason) -> GatewayError {
        GatewayError::Closed {
            session: self.key.clone(),
            reason,
        }
    }

    /// The error of `input` that `failure` says.
    pub(crate) fn failed(&self, input: &'static str, failure: Failure) -> GatewayError {
        let session = self.key.clone();
        match failure {
            Failure::Session { error } => GatewayError::Session {
                session,
                input,
                failure: Arc::new(error),
            },
            Failure::Factory { error } => GatewayError::Factory {
                session,
                input,
                error,
            },
            Failure::Earlier { message } => GatewayError::FailedEarlier {
                session,
                input,
                message,
            },
        }
    }

    /// Links the speech an engine event names to this session, and ends the one whose
    /// playout it reports.
    fn follow_speech(&self, event: &mut SessionEvent) {
        match event {
            SessionEvent::SpeechCreated { speech, .. } => {
                *speech = self.speeches().created(speech);
            }
            SessionEvent::SpeechPlayedOut {
                speech,
                interrupted,
                heard,
            } => {
                let outcome = if *interrupted {
                    SpeechOutcome::Interrupted {
                        heard: heard.clone(),
                    }
                } else {
                    SpeechOutcome::Played
                };
                self.speeches().ended(*speech, outcome);
            }
            _ => {}
        }
    }

    /// Whether an owner said the session started (or resumed it).
    pub(crate) fn has_started(&self) -> bool {
        *self.started.borrow() == StartState::Started
    }

    /// A request to the owner found nobody subscribed ("no responders"): its process is
    /// gone, or it is reconnecting. Once this gateway's connection is settled (after a
    /// server restart the owner is back by then), asks the pool to check the owner and
    /// claim the session at once instead of waiting for its lease: at once for an owner
    /// not asked about yet, and again while it stays silent, 1, 2, 4 then every 8 s (a
    /// job the pool could not act on — its check failed, the dead owner's sweep did not
    /// reach the session — must not leave a talking session unowned).
    pub(crate) fn owner_silent(&self) {
        if !self.has_started()
            || self.closed().is_some()
            || self.closing.load(Ordering::SeqCst)
            || !self.gateway.client.settled()
        {
            return;
        }
        let epoch = self.epoch_seen.load(Ordering::SeqCst);
        let asked = {
            let now = Instant::now();
            let mut last = self.silent_asked.lock().unwrap_or_else(|p| p.into_inner());
            let Some(asked) = silent_ask_due(*last, epoch, now) else {
                return;
            };
            *last = Some(SilentAsk {
                epoch,
                asked,
                at: now,
            });
            asked
        };
        self.gateway.count(|s| s.silent_owners += 1);
        let gateway = self.gateway.clone();
        let job = SessionJob {
            session: self.key.clone(),
            spec: None,
            silent: Some(epoch),
        };
        tokio::spawn(async move {
            let id = format!("{}.silent.{epoch}.{asked}", job.session);
            let namespace = &gateway.options.namespace;
            if let Err(err) = dispatch::publish_resume_job(&gateway.js, namespace, &job, &id).await
            {
                // The lease still moves the session, later.
                tracing::warn!(session = %job.session, error = %err, "cannot ask the pool to claim a session whose owner is silent");
            }
        });
    }

    /// Whether an answer from the owner at `epoch` is the session's: not when a newer
    /// owner was heard from (in an event, or in an answer taken before). One that is
    /// raises the newest epoch heard to its own.
    pub(crate) fn answer_is_current(&self, epoch: u64) -> bool {
        self.newest_owner.fetch_max(epoch, Ordering::SeqCst) <= epoch
    }

    /// The highest owner epoch heard from (in an event, or in an answer taken).
    pub(crate) fn newest_owner(&self) -> u64 {
        self.newest_owner.load(Ordering::SeqCst)
    }

    /// Whether some call waits for an `InputDone`.
    pub(crate) fn awaits_outcomes(&self) -> bool {
        !self.waiters().is_empty()
    }

    /// Hands out an event in order: an input's answer to the call waiting for it, any
    /// other numbered after the one before to the book and the subscribers.
    pub(crate) fn deliver(&self, event: WireEvent) {
        use crate::remote_event::RemoteEventKind as Kind;
        self.epoch_seen.fetch_max(event.epoch, Ordering::SeqCst);
        self.newest_owner.fetch_max(event.epoch, Ordering::SeqCst);
        let mut kind = match event.kind {
            WireEventKind::InputDone { input, outcome } => {
                let waiter = self.waiters().remove(&input);
                match waiter {
                    Some(waiter) => {
                        let _ = waiter.send(Ok(outcome));
                    }
                    None => self.gateway.count(|s| s.answers_unclaimed += 1),
                }
                let mut outcomes = self.outcomes();
                if input > outcomes.forgotten {
                    outcomes.delivered.insert(input);
                }
                return;
            }
            WireEventKind::Event(kind) => kind,
        };
        let mut last = false;
        match &mut kind {
            Kind::Session { event } => self.follow_speech(event),
            Kind::SessionStarted => {
                self.started.send_replace(StartState::Started);
            }
            Kind::SessionResumed { last_input } => {
                // A new owner, from a snapshot holding the inputs up to `last_input`. A
                // call waiting on one of those will not hear its answer: the old owner
                // gave it, or died before it could.
                let lost: Vec<(u64, Waiter)> = {
                    let mut waiters = self.waiters();
                    let ids: Vec<u64> = waiters
                        .keys()
                        .copied()
                        .filter(|id| *id <= *last_input)
                        .collect();
                    ids.into_iter()
                        .filter_map(|id| waiters.remove(&id).map(|w| (id, w)))
                        .collect()
                };
                for (_, waiter) in lost {
                    let _ = waiter.send(Err(GatewayError::AnswerLost {
                        session: self.key.clone(),
                        input: "input",
                    }));
                }
                self.gateway.count(|s| s.resumes += 1);
                // What the old owner was saying went with it.
                self.speeches().moved();
                self.started.send_replace(StartState::Started);
                self.owner.send_replace(OwnerSeen {
                    epoch: event.epoch,
                    last_input: *last_input,
                });
            }
            Kind::StartFailed { reason } => {
                self.started
                    .send_replace(StartState::Failed(reason.clone()));
                self.closed.send_replace(Some(CloseReason::Host));
                last = true;
            }
            Kind::SessionClosed { reason } => {
                self.closed.send_replace(Some(*reason));
                last = true;
            }
            _ => {}
        }
        let mut book = self.book();
        book.delivered += 1;
        let event = RemoteEvent {
            seq: book.delivered,
            epoch: event.epoch,
            kind,
        };
        if book.kept.len() == book.capacity {
            book.kept.pop_front();
        }
        book.kept.push_back(event.clone());
        if let Some(live) = &book.live {
            let _ = live.send(event);
        }
        if last {
            book.live = None;
            drop(book);
            // Nobody will answer them now: their calls fail with `Closed`; the speeches
            // still going count as interrupted.
            self.waiters().clear();
            self.speeches().closed();
        }
    }

    /// Fails every waiting call (the owner is unreachable): their receivers see the drop.
    pub(crate) fn abandon_waiters(&self) {
        self.waiters().clear();
    }

    fn register(&self, id: u64, waiter: Waiter) {
        self.waiters().insert(id, waiter);
    }

    /// Fails the call waiting on input `id` with `err`.
    fn fail(&self, id: u64, err: GatewayError) {
        if let Some(waiter) = self.waiters().remove(&id) {
            let _ = waiter.send(Err(err));
        }
    }

    fn forget(&self, id: u64) {
        self.waiters().remove(&id);
    }
}

/// A session on the cluster: the host API of a local session, over NATS. Cheap to clone;
/// every clone talks to the same session.
///
/// Inputs go out one at a time, in the order they were given, each with the next id, and
/// an unanswered one is sent again with the same id (the owner applies each id once). A
/// call whose answer takes time (a turn, a handoff, the history, a close) resolves when
/// its `InputDone` event arrives. Events arrive in sequence order, once each; missed ones
/// are asked for again. Dropping the last handle of a session this gateway started
/// closes it, as dropping a local `Session` does.
#[derive(Clone)]
pub struct RemoteSession {
    inner: Arc<Remote>,
}

struct Remote {
    shared: Arc<RemoteShared>,
    submit: mpsc::UnboundedSender<Submission>,
    pump: AbortHandle,
    /// Set once this gateway started the session: only then does dropping the handle
    /// close it (a refused duplicate start must not close the session that has the id).
    started_here: AtomicBool,
}

impl Drop for Remote {
    fn drop(&mut self) {
        if self.started_here.load(Ordering::SeqCst) && self.shared.closed().is_none() {
            // The inputs task sends it and then ends, as its channel is closed.
            let _ = self.submit.send(Submission {
                input: Input::Close,
                outcome: None,
                answer: None,
            });
        }
        self.pump.abort();
    }
}

impl std::fmt::Debug for RemoteSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteSession")
            .field("id", &self.inner.shared.key)
            .field("closed", &self.inner.shared.closed())
            .finish()
    }
}

impl RemoteSession {
    /// Subscribes to the session's events and starts its two tasks (before the job is
    /// published, so no event is missed).
    pub(crate) async fn open(
        gateway: Arc<GatewayInner>,
        key: SessionKey,
    ) -> Result<Self, GatewayError> {
        let namespace = &gateway.options.namespace;
        let events_subject = namespace.session_events(&key);
        let subscription = gateway
            .client
            .nats()
            .subscribe(events_subject.clone())
            .await
            .map_err(|err| GatewayError::Nats {
                reason: format!("cannot subscribe to {events_subject}: {err}"),
            })?;
        let (submit, submissions) = mpsc::unbounded_channel();
        let shared = Arc::new(RemoteShared {
            inputs_subject: namespace.session_inputs(&key),
            book: Mutex::new(EventBook {
                delivered: 0,
                kept: VecDeque::new(),
                capacity: gateway.options.kept_events,
                live: Some(broadcast::channel(gateway.options.event_capacity).0),
            }),
            waiters: Mutex::new(HashMap::new()),
            outcomes: Mutex::new(Outcomes::default()),
            speeches: Mutex::new(Speeches::new(Arc::new(RemoteSpeechControl {
                submit: submit.downgrade(),
            }))),
            started: watch::channel(StartState::Waiting).0,
            closed: watch::channel(None).0,
            owner: watch::channel(OwnerSeen::default()).0,
            epoch_seen: AtomicU64::new(0),
            newest_owner: AtomicU64::new(0),
            closing: AtomicBool::new(false),
            silent_asked: std::sync::Mutex::new(None),
            key,
            gateway,
        });
        tokio::spawn(inputs::send_inputs(shared.clone(), submissions));
        let pump = tokio::spawn(events::pump(shared.clone(), subscription)).abort_handle();
        Ok(Self {
            inner: Arc::new(Remote {
                shared,
                submit,
                pump,
                started_here: AtomicBool::new(false),
            }),
        })
    }

    /// Waits for `SessionStarted` or `StartFailed` until `deadline`; a started session
    /// is this handle's to close.
    pub(crate) async fn wait_started(&self, deadline: Instant) -> StartState {
        let mut started = self.inner.shared.started.subscribe();
        let wait = started.wait_for(|state| *state != StartState::Waiting);
        let state = match tokio::time::timeout_at(deadline, wait).await {
            Ok(Ok(state)) => state.clone(),
            _ => StartState::Waiting,
        };
        if state == StartState::Started {
            self.inner.started_here.store(true, Ordering::SeqCst);
        }
        state
    }

    /// The session's id in the cluster.
    pub fn id(&self) -> &SessionKey {
        &self.inner.shared.key
    }

    /// Why the session closed, once it did.
    pub fn closed(&self) -> Option<CloseReason> {
        self.inner.shared.closed()
    }

    /// Sends `input`; resolves with the owner's immediate answer.
    async fn send(&self, input: Input, outcome: Option<Waiter>) -> Result<Answer, GatewayError> {
        let name = input.name();
        let (answer, answered) = oneshot::channel();
        let closed = |shared: &RemoteShared| {
            shared.closed_error(shared.closed().unwrap_or(CloseReason::Host))
        };
        self.inner
            .submit
            .send(Submission {
                input,
                outcome,
                answer: Some(answer),
            })
            .map_err(|_| closed(&self.inner.shared))?;
        let answer = answered.await.map_err(|_| closed(&self.inner.shared))??;
        match answer {
            Answer::Failed { failure } => Err(self.inner.shared.failed(name, failure)),
            answer => Ok(answer),
        }
    }

    /// Sends an input whose answer comes as an `InputDone` event; waits for it.
    async fn send_and_wait(&self, input: Input) -> Result<InputOutcome, GatewayError> {
        let name = input.name();
        let (outcome, done) = oneshot::channel();
        match self.send(input, Some(outcome)).await? {
            Answer::Pending => {}
            other => {
                return Err(GatewayError::Protocol {
                    session: self.id().clone(),
                    detail: format!("{name} answered {other:?}, not pending"),
                })
            }
        }
        match done.await {
            Ok(Ok(outcome)) => Ok(outcome),
            Ok(Err(GatewayError::AnswerLost { session, .. })) => Err(GatewayError::AnswerLost {
                session,
                input: name,
            }),
            Ok(Err(err)) => Err(err),
            Err(_) => Err(match self.inner.shared.closed() {
                Some(reason) => self.inner.shared.closed_error(reason),
                None => GatewayError::Unreachable {
                    session: self.id().clone(),
                    input: name,
                    waited: self.inner.shared.gateway.options.input_deadline,
                },
            }),
        }
    }

    async fn turn(&self, input: Input) -> Result<RunResult, GatewayError> {
        let name = input.name();
        match self.send_and_wait(input).await? {
            InputOutcome::Turn { result } => {
                result.map_err(|failure| self.inner.shared.failed(name, failure))
            }
            other => Err(self.unexpected(name, &other)),
        }
    }

    async fn operation(&self, input: Input) -> Result<(), GatewayError> {
        let name = input.name();
        match self.send_and_wait(input).await? {
            InputOutcome::Done { result } => {
                result.map_err(|failure| self.inner.shared.failed(name, failure))
            }
            other => Err(self.unexpected(name, &other)),
        }
    }

    fn unexpected(&self, input: &'static str, outcome: &InputOutcome) -> GatewayError {
        GatewayError::Protocol {
            session: self.id().clone(),
            detail: format!("{input} ended with {outcome:?}"),
        }
    }

    /// Runs one user turn from text and returns what it did, after any handoff it caused
    /// (`Session::run`).
    pub async fn run(&self, user_input: impl Into<String>) -> Result<RunResult, GatewayError> {
        self.turn(Input::Run {
            text: user_input.into(),
        })
        .await
    }

    /// Asks the current agent for a reply, with optional instructions
    /// (`Session::generate_reply`).
    pub async fn generate_reply(
        &self,
        instructions: Option<String>,
    ) -> Result<RunResult, GatewayError> {
        self.turn(Input::GenerateReply { instructions }).await
    }

    /// Queues `text` for the agent to say (`Session::say`); returns its speech's handle
    /// once queued, linked to this session as a local session's is: `interrupt` stops that
    /// speech alone (queued, it never plays), `wait_for_playout` and `outcome` say how it
    /// ended (from the session's `SpeechPlayedOut`). It is the handle the speech's
    /// `SpeechCreated` event carries.
    pub async fn say(&self, text: impl Into<String>) -> Result<SpeechHandle, GatewayError> {
        self.say_with(text, RemoteSay::default()).await
    }

    /// [`RemoteSession::say`] with options.
    pub async fn say_with(
        &self,
        text: impl Into<String>,
        options: RemoteSay,
    ) -> Result<SpeechHandle, GatewayError> {
        let input = Input::Say {
            text: text.into(),
            allow_interruptions: options.allow_interruptions,
            add_to_chat: options.add_to_chat,
        };
        match self.send(input, None).await? {
            Answer::Speech {
                speech,
                allow_interruptions,
            } => Ok(self
                .inner
                .shared
                .speeches()
                .link(speech, allow_interruptions)),
            other => Err(GatewayError::Protocol {
                session: self.id().clone(),
                detail: format!("say answered {other:?}"),
            }),
        }
    }

    /// What the user said, from the front's STT (`Session::transcript`): a final one is a
    /// user turn.
    pub async fn transcript(
        &self,
        text: impl Into<String>,
        is_final: bool,
    ) -> Result<(), GatewayError> {
        self.send(
            Input::Transcript {
                text: text.into(),
                is_final,
            },
            None,
        )
        .await
        .map(drop)
    }

    /// The user started speaking (the front's VAD).
    pub async fn user_started_speaking(&self) -> Result<(), GatewayError> {
        self.send(Input::UserStartedSpeaking, None).await.map(drop)
    }

    /// The user stopped speaking.
    pub async fn user_stopped_speaking(&self) -> Result<(), GatewayError> {
        self.send(Input::UserStoppedSpeaking, None).await.map(drop)
    }

    /// Interrupts the current turn (`Session::interrupt`); resolves once it ended.
    pub async fn interrupt(&self) -> Result<(), GatewayError> {
        self.operation(Input::Interrupt { force: false }).await
    }

    /// Interrupts even an uninterruptible speech (`Session::force_interrupt`).
    pub async fn force_interrupt(&self) -> Result<(), GatewayError> {
        self.operation(Input::Interrupt { force: true }).await
    }

    /// Hands the conversation to the agent the worker's factory builds from `agent`
    /// (`Session::update_agent`); resolves once its `on_enter` ran. An agent the factory
    /// cannot build is refused with [`GatewayError::Factory`], and the current agent
    /// stays.
    pub async fn update_agent(&self, agent: AgentSpec) -> Result<(), GatewayError> {
        self.operation(Input::UpdateAgent {
            agent: agent.name,
            data: agent.data,
        })
        .await
    }

    /// A voice front's playout report (`PlayoutReporter::playout_finished`): `speech`
    /// ended, in full or cut short after the user heard `heard`.
    pub async fn playout_finished(
        &self,
        speech: SpeechId,
        interrupted: bool,
        heard: Option<String>,
    ) -> Result<(), GatewayError> {
        self.send(
            Input::PlayoutFinished {
                speech,
                interrupted,
                heard,
            },
            None,
        )
        .await
        .map(drop)
    }

    /// The conversation so far (`Session::history`).
    pub async fn history(&self) -> Result<SessionHistory, GatewayError> {
        match self.send_and_wait(Input::History).await? {
            InputOutcome::History { history } => Ok(history),
            other => Err(self.unexpected("history", &other)),
        }
    }

    /// Closes the session on its worker (`Session::close`) and returns its conversation.
    pub async fn close(&self) -> Result<SessionHistory, GatewayError> {
        let outcome = self.send_and_wait(Input::Close).await?;
        // Closed: dropping the handle has nothing left to close (its `SessionClosed` may
        // still be on its way).
        self.inner.started_here.store(false, Ordering::SeqCst);
        match outcome {
            InputOutcome::History { history } => Ok(history),
            other => Err(self.unexpected("close", &other)),
        }
    }

    /// The session's engine events from now on, as a local session's subscriber gets
    /// them ([`HostSession::events`]).
    pub fn events(&self) -> RemoteSessionEvents {
        RemoteSessionEvents {
            events: self.subscribe(),
            closed: false,
        }
    }

    /// Subscribes to all the session's events from now on: the engine's, the speech
    /// stream and the cluster's own, with their sequence numbers.
    pub fn subscribe(&self) -> RemoteEvents {
        self.subscribe_from(u64::MAX)
    }

    /// Subscribes from event `seq` on: the events the gateway still keeps from there
    /// (every one, for a session younger than the gateway's `kept_events`), then the live
    /// ones. `subscribe_from(1)` sees the session from its start.
    pub fn subscribe_from(&self, seq: u64) -> RemoteEvents {
        let book = self.inner.shared.book();
        let backlog: VecDeque<RemoteEvent> =
            book.kept.iter().filter(|e| e.seq >= seq).cloned().collect();
        let live = match &book.live {
            Some(live) => live.subscribe(),
            // Closed: a closed channel, so `recv` ends after the backlog.
            None => broadcast::channel(1).1,
        };
        RemoteEvents { backlog, live }
    }
}

/// A remote session is driven as a local one: front code generic over [`HostSession`]
/// runs over either. Each call is the inherent method of the same name; an agent is
/// given as what the worker's factory builds it from ([`AgentSpec`]), and a speech as
/// its id (its handle comes with the `SpeechCreated` event).
impl HostSession for RemoteSession {
    type Error = GatewayError;
    type Agent = AgentSpec;
    type Events = RemoteSessionEvents;

    async fn run(&self, text: impl Into<String> + Send) -> Result<RunResult, GatewayError> {
        RemoteSession::run(self, text).await
    }

    async fn generate_reply(
        &self,
        instructions: Option<String>,
    ) -> Result<RunResult, GatewayError> {
        RemoteSession::generate_reply(self, instructions).await
    }

    async fn say(&self, text: impl Into<String> + Send) -> Result<SpeechHandle, GatewayError> {
        RemoteSession::say(self, text).await
    }

    async fn transcript(
        &self,
        text: impl Into<String> + Send,
        is_final: bool,
    ) -> Result<(), GatewayError> {
        RemoteSession::transcript(self, text, is_final).await
    }

    async fn user_started_speaking(&self) -> Result<(), GatewayError> {
        RemoteSession::user_started_speaking(self).await
    }

    async fn user_stopped_speaking(&self) -> Result<(), GatewayError> {
        RemoteSession::user_stopped_speaking(self).await
    }

    async fn interrupt(&self) -> Result<(), GatewayError> {
        RemoteSession::interrupt(self).await
    }

    async fn update_agent(&self, agent: AgentSpec) -> Result<(), GatewayError> {
        RemoteSession::update_agent(self, agent).await
    }

    fn events(&self) -> RemoteSessionEvents {
        RemoteSession::events(self)
    }

    async fn history(&self) -> Result<SessionHistory, GatewayError> {
        RemoteSession::history(self).await
    }

    async fn close(&self) -> Result<SessionHistory, GatewayError> {
        RemoteSession::close(self).await
    }
}

/// How a remote speech's handle interrupts it: an input naming the speech, which the
/// worker interrupts alone, as a local handle does (queued, it never plays; playing, it
/// stops with its turn; ended, nothing happens). It holds the inputs channel weakly: a
/// speech's handle does not keep the session open.
struct RemoteSpeechControl {
    submit: mpsc::WeakUnboundedSender<Submission>,
}

impl SpeechControl for RemoteSpeechControl {
    fn interrupt(&self, speech: SpeechId, force: bool) {
        if let Some(submit) = self.submit.upgrade() {
            // Nobody waits for its answer: the speech's end comes as its event.
            let _ = submit.send(Submission {
                input: Input::InterruptSpeech { speech, force },
                outcome: None,
                answer: None,
            });
        }
    }
}

/// Options of [`RemoteSession::say_with`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteSay {
    /// Whether the user may interrupt it (`None`: the agent's, else the session's setting).
    pub allow_interruptions: Option<bool>,
    /// Whether it goes into the chat context (default true).
    pub add_to_chat: bool,
}

impl Default for RemoteSay {
    fn default() -> Self {
        Self {
            allow_interruptions: None,
            add_to_chat: true,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;

/// When the pool was last asked to check a silent owner, and how many times for it.
#[derive(Clone, Copy, Debug)]
struct SilentAsk {
    epoch: u64,
    asked: u32,
    at: Instant,
}

/// Whether to ask the pool about the silent owner at `epoch` now, and which ask it is
/// (1 for the first about this owner): at once for a new owner, and again after 1, 2, 4,
/// then every 8 s.
fn silent_ask_due(last: Option<SilentAsk>, epoch: u64, now: Instant) -> Option<u32> {
    match last {
        Some(last) if last.epoch == epoch => {
            let wait = std::time::Duration::from_secs(1 << last.asked.saturating_sub(1).min(3));
            (now.saturating_duration_since(last.at) >= wait).then_some(last.asked + 1)
        }
        _ => Some(1),
    }
}

#[cfg(test)]
mod silent_ask_tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_silent_owner_is_asked_about_at_once_then_less_and_less_often() {
        let t0 = Instant::now();
        assert_eq!(silent_ask_due(None, 3, t0), Some(1));
        let mut last = SilentAsk {
            epoch: 3,
            asked: 1,
            at: t0,
        };
        assert_eq!(
            silent_ask_due(Some(last), 3, t0 + Duration::from_millis(999)),
            None
        );
        let mut at = t0;
        for (asked, wait) in [(1, 1), (2, 2), (3, 4), (4, 8), (5, 8), (6, 8)] {
            last = SilentAsk {
                epoch: 3,
                asked,
                at,
            };
            let due = at + Duration::from_secs(wait);
            assert_eq!(
                silent_ask_due(Some(last), 3, due - Duration::from_millis(1)),
                None
            );
            assert_eq!(silent_ask_due(Some(last), 3, due), Some(asked + 1));
            at = due;
        }
        // A new owner: at once.
        assert_eq!(silent_ask_due(Some(last), 4, at), Some(1));
    }
}
