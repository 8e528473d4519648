//! `RemoteSession`: a session running on some worker, with the host API of a local
//! `Session`: run, generate_reply, say, transcript, user speaking, interrupt,
//! update_agent, playout reports, events with sequence numbers, history, close.
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
//!   `InputDone` to the call waiting for it.
//!
//! When the session moves (its worker drains, dies or loses its lease) the front sees a
//! pause, then `SessionResumed` and the session going on: inputs sent meanwhile reach the
//! new owner, and a turn that was under way runs again there and answers its caller.
//!
//! Dropping the last handle closes the session, as dropping a local `Session` does.

mod events;
mod inputs;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;
use switchboard::SpeechId;
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::gateway::{GatewayError, GatewayInner};
use crate::namespace::SessionKey;
use crate::protocol::{Answer, Input};
use crate::remote_event::{
    EndReason, InputOutcome, RemoteEvent, RemoteFailure, RemoteHistory, RemoteRunResult,
};
use inputs::Submission;

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
    /// The session ended and every event was delivered.
    #[error("the session ended; no more events")]
    Ended,
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
            Err(broadcast::error::RecvError::Closed) => Err(RemoteEventsError::Ended),
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
    started: watch::Sender<StartState>,
    ended: watch::Sender<Option<EndReason>>,
    /// Changed at each `SessionResumed`: the inputs task sends the new owner what it lacks.
    pub(crate) owner: watch::Sender<OwnerSeen>,
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

    /// Why the session ended, once it did.
    pub(crate) fn ended(&self) -> Option<EndReason> {
        self.ended.borrow().clone()
    }

    pub(crate) fn ended_error(&self, reason: EndReason) -> GatewayError {
        GatewayError::Ended {
            session: self.key.clone(),
            reason,
        }
    }

    /// Whether an owner said the session started (or resumed it).
    pub(crate) fn has_started(&self) -> bool {
        *self.started.borrow() == StartState::Started
    }

    /// Whether some call waits for an `InputDone`.
    pub(crate) fn awaits_outcomes(&self) -> bool {
        !self.waiters().is_empty()
    }

    /// Hands out an event in order, numbered after the one before: to its waiter, the
    /// book and the subscribers.
    pub(crate) fn deliver(&self, mut event: RemoteEvent) {
        use crate::remote_event::RemoteEventKind as Kind;
        let mut last = false;
        match &event.kind {
            Kind::InputDone { input, outcome } => {
                if let Some(waiter) = self.waiters().remove(input) {
                    let _ = waiter.send(Ok(outcome.clone()));
                }
                let mut outcomes = self.outcomes();
                if *input > outcomes.forgotten {
                    outcomes.delivered.insert(*input);
                }
            }
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
                        .filter(|id| id <= last_input)
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
                self.started.send_replace(StartState::Started);
                self.owner.send_replace(OwnerSeen {
                    epoch: event.epoch,
                    last_input: *last_input,
                });
            }
            Kind::StartFailed { reason } => {
                self.started
                    .send_replace(StartState::Failed(reason.clone()));
                self.ended.send_replace(Some(EndReason::Closed));
                last = true;
            }
            Kind::SessionEnded { reason } => {
                self.ended.send_replace(Some(reason.clone()));
                last = true;
            }
            _ => {}
        }
        let mut book = self.book();
        book.delivered += 1;
        event.seq = book.delivered;
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
            // Nobody will answer them now: their calls fail with `Ended`.
            self.waiters().clear();
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
        if self.started_here.load(Ordering::SeqCst) && self.shared.ended().is_none() {
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
            .field("ended", &self.inner.shared.ended())
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
            started: watch::channel(StartState::Waiting).0,
            ended: watch::channel(None).0,
            owner: watch::channel(OwnerSeen::default()).0,
            key,
            gateway,
        });
        let (submit, submissions) = mpsc::unbounded_channel();
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

    /// Why the session ended, once it did.
    pub fn ended(&self) -> Option<EndReason> {
        self.inner.shared.ended()
    }

    /// Sends `input`; resolves with the owner's immediate answer.
    async fn send(&self, input: Input, outcome: Option<Waiter>) -> Result<Answer, GatewayError> {
        let name = input.name();
        let (answer, answered) = oneshot::channel();
        let ended =
            |shared: &RemoteShared| shared.ended_error(shared.ended().unwrap_or(EndReason::Closed));
        self.inner
            .submit
            .send(Submission {
                input,
                outcome,
                answer: Some(answer),
            })
            .map_err(|_| ended(&self.inner.shared))?;
        let answer = answered.await.map_err(|_| ended(&self.inner.shared))??;
        match answer {
            Answer::Failed { failure } => Err(GatewayError::Session {
                session: self.id().clone(),
                input: name,
                failure,
            }),
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
            Err(_) => Err(match self.inner.shared.ended() {
                Some(reason) => self.inner.shared.ended_error(reason),
                None => GatewayError::Unreachable {
                    session: self.id().clone(),
                    input: name,
                    waited: self.inner.shared.gateway.options.input_deadline,
                },
            }),
        }
    }

    fn session_error(&self, input: &'static str, failure: RemoteFailure) -> GatewayError {
        GatewayError::Session {
            session: self.id().clone(),
            input,
            failure,
        }
    }

    async fn turn(&self, input: Input) -> Result<RemoteRunResult, GatewayError> {
        let name = input.name();
        match self.send_and_wait(input).await? {
            InputOutcome::Turn { result } => result.map_err(|f| self.session_error(name, f)),
            other => Err(self.unexpected(name, &other)),
        }
    }

    async fn operation(&self, input: Input) -> Result<(), GatewayError> {
        let name = input.name();
        match self.send_and_wait(input).await? {
            InputOutcome::Done { result } => result.map_err(|f| self.session_error(name, f)),
            other => Err(self.unexpected(name, &other)),
        }
    }

    fn unexpected(&self, input: &'static str, outcome: &InputOutcome) -> GatewayError {
        GatewayError::Protocol {
            session: self.id().clone(),
            detail: format!("{input} ended with {outcome:?}"),
        }
    }

    /// Runs one user turn from text and returns what it did (`Session::run`).
    pub async fn run(
        &self,
        user_input: impl Into<String>,
    ) -> Result<RemoteRunResult, GatewayError> {
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
    ) -> Result<RemoteRunResult, GatewayError> {
        self.turn(Input::GenerateReply { instructions }).await
    }

    /// Queues `text` for the agent to say (`Session::say`); returns its speech once
    /// queued.
    pub async fn say(&self, text: impl Into<String>) -> Result<SpeechId, GatewayError> {
        self.say_with(text, RemoteSay::default()).await
    }

    /// [`RemoteSession::say`] with options.
    pub async fn say_with(
        &self,
        text: impl Into<String>,
        options: RemoteSay,
    ) -> Result<SpeechId, GatewayError> {
        let input = Input::Say {
            text: text.into(),
            allow_interruptions: options.allow_interruptions,
            add_to_chat: options.add_to_chat,
        };
        match self.send(input, None).await? {
            Answer::Speech { speech } => Ok(speech),
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

    /// Hands the conversation to the agent the worker's factory builds from `agent` and
    /// `data` (`Session::update_agent`); resolves once its `on_enter` ran.
    pub async fn update_agent(
        &self,
        agent: impl Into<String>,
        data: Value,
    ) -> Result<(), GatewayError> {
        self.operation(Input::UpdateAgent {
            agent: agent.into(),
            data,
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
    pub async fn history(&self) -> Result<RemoteHistory, GatewayError> {
        match self.send_and_wait(Input::History).await? {
            InputOutcome::History { history } => Ok(history),
            other => Err(self.unexpected("history", &other)),
        }
    }

    /// Closes the session on its worker (`Session::close`) and returns its transcript.
    pub async fn close(&self) -> Result<RemoteHistory, GatewayError> {
        let outcome = self.send_and_wait(Input::Close).await?;
        // Closed: dropping the handle has nothing left to close (its `SessionEnded` may
        // still be on its way).
        self.inner.started_here.store(false, Ordering::SeqCst);
        match outcome {
            InputOutcome::History { history } => Ok(history),
            other => Err(self.unexpected("close", &other)),
        }
    }

    /// Subscribes to the session's events from now on.
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
            // Ended: a closed channel, so `recv` ends after the backlog.
            None => broadcast::channel(1).1,
        };
        RemoteEvents { backlog, live }
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
