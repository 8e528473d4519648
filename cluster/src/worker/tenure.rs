//! `Tenure`: one worker's hold on one session, from its claim to its release, its
//! hand-over or its fence, as a plain machine. The session's loop (`hosted.rs`) turns
//! what happens — a request, something the session said, an answer of the engine, of the
//! store or of the owners bucket, the drain, the clock — into an [`Event`], feeds it to
//! [`Tenure::on`] and carries out the [`Action`]s it returns. Nothing here sends, spawns,
//! waits or reads the clock.
//!
//! # States
//!
//! ```text
//!        ┌─ close input, idle ─▶ Ending: Closing ─▶ WindingUp ─▶ Burying ─▶ Releasing ─▶ Lingering ─▶ Done(Ended)
//!  Live ─┤
//!        └─ drain ─▶ Moving: Settling ─▶ SavingLast ─▶ WindingUp ─▶ Leaving ─▶ HandingOver ─▶ Done(Moved)
//!
//!  any state but Done ── a newer owner (store or bucket) ──▶ Done(Fenced)
//!                     ── the connection closed for good ──▶ Done(Disconnected)
//! ```
//!
//! Each state owns what it holds: the reason of an end, the close input and the history
//! it answers with, the deadline of the wait for outcomes still due. The lease's clock
//! (the worker's, shared with its renewals and the snapshot writer), the event log, the
//! input ledger and the inputs whose outcome is still due are kept across the states.
//!
//! # Decisions, each with a unit test (`tenure/tests.rs`)
//!
//! - While the lease cannot be trusted no request is answered (the gateway retries and
//!   reaches whoever owns the session once that is settled), and what the session says is
//!   held back, to go out with the first batch after the lease is trusted again. A lease
//!   is trusted while its time runs and the connection has stayed up since its write was
//!   sent (`LeaseClock`): after a drop, only a renewal sent since the reconnection makes
//!   it trusted again. The worker renews it; the tenure hears each renewal
//!   ([`Event::LeaseRenewed`]) and its loss (as [`Event::Fenced`]).
//! - An input id is applied once: the next id is applied, the last one answered again,
//!   an older one answered `earlier` (or with its answer, when the session's ledger keeps
//!   it), a later one `out_of_order` — in every state. One the session's ledger holds (the
//!   restored snapshot had it) is answered from there and never applied again.
//! - A new input is applied only while `Live`; an ending session answers `closed` with its
//!   reason, a moving one `moving` (the gateway sends it to the next owner).
//! - A turn's outcome (its `InputDone`) reaches the front only once a stored snapshot
//!   holds the turn (the writer's saved input id reached it; the session saves when a
//!   turn settles): a turn the front heard the end of is never lost with an owner that
//!   dies before saving, and one whose end it did not hear is sent to the next owner,
//!   which runs it (once, in the conversation that goes on). An outcome that waited
//!   [`SAVE_WAIT`] for the session's own save asks the session to save, and asks again
//!   after each further wait until a save holds it (a failed save is not made again
//!   before the session next goes idle, and a session kept busy after the turn saves
//!   only once idle).
//!   Other outcomes (a read, an interruption, an agent update, a failed turn) go at once:
//!   they may change nothing the session would save. An end releases what waits (no
//!   owner follows); a move what its stored last snapshot holds, and never the outcome of
//!   a turn that snapshot lacks (one still queued when the drain's deadline came: it may
//!   end here, but the next owner resumes without it and runs it); a fenced owner
//!   releases nothing.
//! - A close input ends the session at once (the close's answer is its history, in its
//!   `InputDone`); no input for the idle timeout ends it too.
//! - A drain settles the session until its deadline and stores its last snapshot; from
//!   the moment that snapshot is taken, what the session says is not the conversation the
//!   next owner resumes, and is not published.
//! - Before its last words (`SessionClosed`, `SessionMoving`) a session waits, at most
//!   [`OUTCOMES_WAIT`], for the outcomes of inputs still under way, and an ending one for a
//!   lease it can trust: the front hears every answer the session gave, then the end.
//! - The last words of an end (the close's answer, the whole history, then
//!   `SessionClosed`) stay in the log whatever its budget, and the owner lingers
//!   [`LINGER`] after its `Ended` record (or until the worker drains), answering replays
//!   and inputs (`closed`): core NATS delivers at most once, and a gateway that missed one
//!   part of a 5 MiB answer asks for it again, which a gone owner could not give.
//! - The snapshots' tombstone is written before the `Ended` owner record (a stale owner's
//!   tombstone is refused, and then it writes no record either); a moving session is
//!   closed (quietly) before its `Moving` record, so no tool of it runs beside the next
//!   owner's.
//! - A newer owner — the worker's lease lost, a snapshot write the store refused, a record
//!   written over — stops the session at once, and nothing more is written or published.
//! - The worker's live count drops once per session, before the record that says it ended
//!   or moved.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::Subject;
use switchboard::snapshot::StoreError;
use switchboard::SessionHistory;
use tokio::time::Instant;

use super::counts::Counts;
use super::event_log::EventLog;
use super::ledger::{Admission, InputLedger};
use crate::lease::LeaseClock;
use crate::namespace::SessionKey;
use crate::ownership::LeaseError;
use crate::protocol::{Answer, Input, InputOutcome, Reply, Request, WireEventKind};
use crate::remote_event::{CloseReason, RemoteEventKind};

/// The longest a session that ends or moves waits for the outcomes of inputs still under
/// way (they end quickly on a settled or closed session).
pub(crate) const OUTCOMES_WAIT: Duration = Duration::from_secs(2);

/// How long an outcome waits for the session's own save (made when the session goes idle
/// after the turn) before the session is asked to save: a save that failed is not made
/// again until the session next goes idle, and the front waits on this one.
pub(crate) const SAVE_WAIT: Duration = Duration::from_secs(1);

/// How long an ended session's owner still answers replays after its `Ended` record: a
/// gateway sees a hole in the last words when `SessionClosed` comes, at its reconnection,
/// or at its next check (every 2 s by default) while the close waits.
pub(crate) const LINGER: Duration = Duration::from_secs(5);

/// What the session's own ledger (`Session::applied`) says of an input id.
#[derive(Clone, Debug)]
pub(crate) enum Applied {
    /// Not applied.
    No,
    /// Applied (here, or by the owner whose snapshot this session restored), with its
    /// answer when the ledger keeps one the gateway can hear again.
    Yes(Option<Answer>),
}

/// What happens to a hosted session. `S` is the snapshot a drain takes.
#[derive(Debug)]
pub(crate) enum Event<S> {
    /// A request on the session's input subject, the last input id a stored snapshot
    /// holds now (for the answer), and what the session's own ledger says of the input.
    Request {
        request: Request,
        reply_to: Subject,
        saved: u64,
        applied: Applied,
    },
    /// The engine took input `id` (its [`Action::Apply`]) and answered at once.
    Applied {
        id: u64,
        answer: Answer,
        reply_to: Subject,
        saved: u64,
    },
    /// An input whose answer took time has its outcome.
    Outcome { id: u64, outcome: InputOutcome },
    /// A stored snapshot holds every input up to this id (the writer saved it).
    Saved(u64),
    /// The worker renewed its lease (it may be trusted again).
    LeaseRenewed,
    /// A newer owner: the store refused a snapshot write, or the worker's lease is lost.
    Fenced(String),
    /// The worker drains; sessions settle until `deadline`.
    Drain(Instant),
    /// The time [`Tenure::timer`] asked for has come.
    Timer,
    /// The session closed (its `Action::Close`), with the history it answered.
    Closed(SessionHistory),
    /// A drain's session settled and its last snapshot was taken (or could not be).
    Settled(Result<S, String>),
    /// A drain's last snapshot was stored, holding every input up to this id (or it was
    /// not stored).
    LastSaved(Result<u64, StoreError>),
    /// The snapshots' tombstone was written (or not).
    SnapshotsEnded(Result<(), StoreError>),
    /// The `Ended` owner record was written (or not).
    Released(Result<(), LeaseError>),
    /// The `Moving` owner record was written, at this revision (or not).
    HandedOver(Result<u64, LeaseError>),
    /// The input subscription ended: the connection is closed for good.
    Disconnected,
}

/// What the session's loop must do.
#[derive(Debug)]
pub(crate) enum Action<S> {
    /// Answers a request.
    Reply { to: Subject, reply: Reply },
    /// Hands an input to the engine, then feeds back [`Event::Applied`] before anything
    /// else (the engine sees inputs in the order they came).
    Apply {
        id: u64,
        input: Input,
        reply_to: Subject,
    },
    /// Closes the session: [`Event::Closed`].
    Close,
    /// Lets the session settle until `deadline` (interrupts it there), takes its last
    /// snapshot and seals the session's own saving: [`Event::Settled`].
    Settle { deadline: Instant },
    /// Stores the drain's last snapshot past the seal: [`Event::LastSaved`].
    SaveLast(S),
    /// Asks the session to save now (an outcome waits for it): [`Event::Saved`] follows
    /// once it is stored.
    Save,
    /// Publishes these messages on the events subject, in order.
    Publish(Vec<Vec<u8>>),
    /// Writes the snapshots' tombstone: [`Event::SnapshotsEnded`].
    EndSnapshots,
    /// Writes the `Ended` owner record: [`Event::Released`].
    Release,
    /// Stops listening to inputs, then writes the `Moving` owner record:
    /// [`Event::HandedOver`].
    HandOver,
    /// Queues the job that resumes the session elsewhere.
    QueueResume { revision: u64 },
    /// Stops without a word: seals the snapshot writer, stops listening, drops the work
    /// under way and closes the session.
    Stop,
}

/// How a tenure ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Exit {
    /// The session ended here.
    Ended,
    /// It was handed over.
    Moved,
    /// Another worker owns it.
    Fenced,
    /// The connection closed for good.
    Disconnected,
}

/// Where a tenure is; each state owns what it holds.
#[derive(Debug)]
pub(crate) enum State {
    /// Inputs are applied.
    Live,
    /// The session ends; new inputs are answered `closed` with `reason`.
    Ending { reason: CloseReason, step: EndStep },
    /// The session moves to another worker; new inputs are answered `moving`.
    Moving(MoveStep),
    /// Nothing more happens.
    Done(Exit),
}

/// The steps of an end.
#[derive(Debug)]
pub(crate) enum EndStep {
    /// The session closes.
    Closing { close_input: Option<u64> },
    /// Closed: waits for the outcomes still due (until `until`) and a trusted lease, then
    /// says its last words.
    WindingUp {
        close_input: Option<u64>,
        history: SessionHistory,
        until: Instant,
    },
    /// The last words are out; the tombstone is being written.
    Burying,
    /// The `Ended` record is being written.
    Releasing,
    /// The `Ended` record is written: replays are still answered (the last words kept
    /// whole) until `until`, or the worker drains.
    Lingering { until: Instant },
}

/// The steps of a move.
#[derive(Debug)]
pub(crate) enum MoveStep {
    /// The session settles; then its last snapshot is taken.
    Settling,
    /// The last snapshot is being stored (quiet from here on).
    SavingLast,
    /// Waits for the outcomes still due, until `until`.
    WindingUp { until: Instant },
    /// The session closes.
    Leaving,
    /// `SessionMoving` is out; the `Moving` record is being written.
    HandingOver,
}

/// When an input's outcome may go to the front.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Release {
    /// At once.
    AtOnce,
    /// Once a stored snapshot holds the input: a turn, which the session saves once it
    /// settles.
    WhenSaved,
}

impl Release {
    fn of(input: &Input) -> Self {
        match input {
            Input::Run { .. } | Input::GenerateReply { .. } => Self::WhenSaved,
            // A read changes nothing; an interruption or an agent update may change
            // nothing the session would save, and their outcome would wait for ever.
            _ => Self::AtOnce,
        }
    }
}

/// What a tenure starts from.
pub(crate) struct Setup {
    pub(crate) key: SessionKey,
    pub(crate) epoch: u64,
    pub(crate) lease: LeaseClock,
    pub(crate) log: EventLog,
    pub(crate) ledger: InputLedger,
    pub(crate) idle_timeout: Option<Duration>,
    pub(crate) counts: Arc<Counts>,
    /// `SessionStarted` or `SessionResumed`: the first event.
    pub(crate) first: RemoteEventKind,
    pub(crate) now: Instant,
}

/// One worker's hold on one session; see the module docs.
#[derive(Debug)]
pub(crate) struct Tenure {
    key: SessionKey,
    epoch: u64,
    lease: LeaseClock,
    log: EventLog,
    ledger: InputLedger,
    /// Inputs answered `pending` whose outcome has not come yet, and when their outcome
    /// may go to the front.
    under_way: BTreeMap<u64, Release>,
    /// Inputs handed to the engine and not yet answered, with when their outcome may go.
    applying: BTreeMap<u64, Release>,
    /// Outcomes waiting for a stored snapshot to hold their input.
    held: BTreeMap<u64, InputOutcome>,
    /// While outcomes are held: when the session is asked to save if no save came by then.
    ask_save_at: Option<Instant>,
    /// The last input id a stored snapshot holds.
    saved: u64,
    idle_timeout: Option<Duration>,
    last_input: Instant,
    counts: Arc<Counts>,
    state: State,
    /// Whether the last words (`SessionClosed`, `SessionMoving`) were out when it was
    /// fenced: then nothing may hand the session back.
    fenced_after_last_words: bool,
}

impl Tenure {
    /// A live tenure whose first event (`SessionStarted` or `SessionResumed`) waits in the
    /// log.
    pub(crate) fn new(setup: Setup) -> Self {
        let mut log = setup.log;
        log.record(setup.first);
        Self {
            key: setup.key,
            epoch: setup.epoch,
            lease: setup.lease,
            log,
            ledger: setup.ledger,
            under_way: BTreeMap::new(),
            applying: BTreeMap::new(),
            held: BTreeMap::new(),
            ask_save_at: None,
            saved: 0,
            idle_timeout: setup.idle_timeout,
            last_input: setup.now,
            counts: setup.counts,
            state: State::Live,
            fenced_after_last_words: false,
        }
    }

    /// The owner's epoch.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Where it is.
    pub(crate) fn state(&self) -> &State {
        &self.state
    }

    /// Whether it was fenced before its last words were out (a fenced session whose record
    /// is still this worker's may be handed back then; see `hosted.rs`).
    pub(crate) fn fenced_before_last_words(&self) -> bool {
        matches!(self.state, State::Done(Exit::Fenced)) && !self.fenced_after_last_words
    }

    /// Whether it is over: the loop stops.
    pub(crate) fn is_done(&self) -> bool {
        matches!(self.state, State::Done(_))
    }

    /// Whether the session has ended and its owner only lingers for replays: it takes
    /// none of the worker's slots.
    pub(crate) fn lingering(&self) -> bool {
        matches!(
            self.state,
            State::Ending {
                step: EndStep::Lingering { .. },
                ..
            }
        )
    }

    /// When to feed [`Event::Timer`]: the idle timeout, or sooner the time to ask for a
    /// save that held outcomes wait for, while live; the end of the wait for outcomes
    /// while winding up.
    pub(crate) fn timer(&self) -> Option<Instant> {
        match &self.state {
            State::Live => {
                let idle = self.idle_timeout.map(|idle| self.last_input + idle);
                match (idle, self.ask_save_at) {
                    (Some(idle), Some(save)) => Some(idle.min(save)),
                    (idle, save) => idle.or(save),
                }
            }
            State::Ending {
                step: EndStep::WindingUp { until, .. } | EndStep::Lingering { until },
                ..
            }
            | State::Moving(MoveStep::WindingUp { until }) => Some(*until),
            _ => None,
        }
    }

    /// Something the session said (an engine event, speech): numbered and kept for the
    /// next batch, unless the session is quiet. No action follows; no clock is read (it
    /// comes once per streamed chunk).
    pub(crate) fn said(&mut self, kind: RemoteEventKind) {
        if !self.quiet() {
            self.log.record(kind);
        }
    }

    /// The loop fell behind the session's event channel and missed `missed` events.
    pub(crate) fn lagged(&mut self, missed: u64) {
        self.said(RemoteEventKind::EventsDropped { missed });
    }

    /// Whether events wait to be published.
    pub(crate) fn has_unsent(&self) -> bool {
        self.log.has_unsent() && !self.is_done()
    }

    /// The events to publish now, as messages: none while the lease cannot be trusted
    /// (they wait, bounded by the log's budget), none once the tenure is over.
    pub(crate) fn batch(&mut self, now: Instant) -> Vec<Vec<u8>> {
        if self.is_done() {
            return Vec::new();
        }
        if !self.lease.is_trusted_at(now.into_std()) {
            self.log.hold();
            return Vec::new();
        }
        self.log.take_unsent()
    }

    /// Takes `event`; returns what the loop must do, in order.
    pub(crate) fn on<S>(&mut self, event: Event<S>, now: Instant) -> Vec<Action<S>> {
        let mut actions = Vec::new();
        if self.is_done() {
            return actions;
        }
        let out = &mut actions;
        match event {
            Event::Request {
                request,
                reply_to,
                saved,
                applied,
            } => self.on_request(request, reply_to, saved, applied, now, out),
            Event::Applied {
                id,
                answer,
                reply_to,
                saved,
            } => self.on_applied(id, answer, reply_to, saved, now, out),
            Event::Outcome { id, outcome } => self.on_outcome(id, outcome, now),
            Event::Saved(saved) => self.on_saved(saved),
            // What waited for a trusted lease moves on below, and goes out with the
            // next batch.
            Event::LeaseRenewed => {}
            // An ended session is not fenced: its lingering is over, and no more.
            Event::Fenced(_) if self.lingering() => self.state = State::Done(Exit::Ended),
            Event::Fenced(reason) => self.stop_fenced(&reason, out),
            Event::Drain(deadline) => self.on_drain(deadline, out),
            Event::Timer => self.on_timer(now, out),
            Event::Closed(history) => self.on_closed(history, now, out),
            Event::Settled(settled) => self.on_settled(settled, now, out),
            Event::LastSaved(saved) => self.on_last_saved(saved, now, out),
            Event::SnapshotsEnded(ended) => self.on_snapshots_ended(ended, out),
            Event::Released(released) => self.on_released(released, now),
            Event::HandedOver(handed) => self.on_handed_over(handed, out),
            Event::Disconnected => self.on_disconnected(out),
        }
        self.advance(now, &mut actions);
        actions
    }

    /// The engine took an input: recorded, answered, and awaited when its answer takes
    /// time.
    fn on_applied<S>(
        &mut self,
        id: u64,
        answer: Answer,
        reply_to: Subject,
        saved: u64,
        now: Instant,
        out: &mut Vec<Action<S>>,
    ) {
        self.ledger.record(id, answer.clone());
        let release = self.applying.remove(&id).unwrap_or(Release::WhenSaved);
        if matches!(answer, Answer::Pending) {
            self.under_way.insert(id, release);
        }
        Counts::bump(&self.counts.inputs_applied);
        self.last_input = now;
        out.push(Action::Reply {
            to: reply_to,
            reply: Reply::Applied { id, answer, saved },
        });
    }

    /// An input's outcome: its `InputDone` — once a stored snapshot holds the input,
    /// unless it is a read — unless the last words are out.
    fn on_outcome(&mut self, id: u64, outcome: InputOutcome, now: Instant) {
        let release = self.under_way.remove(&id).unwrap_or(Release::WhenSaved);
        if self.last_words_said() {
            return;
        }
        // A turn that failed is answered at once: it may have changed nothing to save.
        let turn_done = matches!(&outcome, InputOutcome::Turn { result: Ok(_) });
        if release == Release::AtOnce || !turn_done || id <= self.saved {
            self.log
                .record(WireEventKind::InputDone { input: id, outcome });
        } else {
            self.held.insert(id, outcome);
            self.ask_save_at.get_or_insert(now + SAVE_WAIT);
        }
    }

    /// A stored snapshot holds the inputs up to `saved`: their outcomes go.
    fn on_saved(&mut self, saved: u64) {
        self.saved = self.saved.max(saved);
        let later = self.held.split_off(&self.saved.saturating_add(1));
        let due = std::mem::replace(&mut self.held, later);
        if self.held.is_empty() {
            self.ask_save_at = None;
        }
        if !self.last_words_said() {
            self.release(due);
        }
    }

    /// Publishes outcomes that waited, in their inputs' order.
    fn release(&mut self, outcomes: BTreeMap<u64, InputOutcome>) {
        for (input, outcome) in outcomes {
            self.log.record(WireEventKind::InputDone { input, outcome });
        }
    }

    fn on_drain<S>(&mut self, deadline: Instant, out: &mut Vec<Action<S>>) {
        match self.state {
            State::Live => {
                self.state = State::Moving(MoveStep::Settling);
                out.push(Action::Settle { deadline });
            }
            // The worker's exit is not held up by a session that has ended.
            State::Ending {
                step: EndStep::Lingering { .. },
                ..
            } => self.state = State::Done(Exit::Ended),
            _ => {}
        }
    }

    fn on_timer<S>(&mut self, now: Instant, out: &mut Vec<Action<S>>) {
        if let Some(at) = self.ask_save_at {
            if now >= at && matches!(self.state, State::Live) {
                // Asked again after another wait, until a save comes.
                self.ask_save_at = Some(now + SAVE_WAIT);
                out.push(Action::Save);
            }
        }
        let idle = matches!(self.state, State::Live)
            && self
                .idle_timeout
                .is_some_and(|idle| now >= self.last_input + idle);
        if idle {
            self.state = State::Ending {
                reason: CloseReason::Idle,
                step: EndStep::Closing { close_input: None },
            };
            out.push(Action::Close);
        }
        let lingered = matches!(
            self.state,
            State::Ending { step: EndStep::Lingering { until }, .. } if now >= until
        );
        if lingered {
            self.state = State::Done(Exit::Ended);
        }
        // A wind-up's deadline is `advance`'s.
    }

    /// The session closed: an end winds up; a move says its last words and hands over.
    fn on_closed<S>(&mut self, history: SessionHistory, now: Instant, out: &mut Vec<Action<S>>) {
        match &mut self.state {
            State::Ending { step, .. } => {
                if let EndStep::Closing { close_input } = *step {
                    *step = EndStep::WindingUp {
                        close_input,
                        history,
                        until: now + OUTCOMES_WAIT,
                    };
                }
            }
            State::Moving(MoveStep::Leaving) => {
                self.log.record(RemoteEventKind::SessionMoving);
                self.publish_now(now, out);
                self.leave();
                self.state = State::Moving(MoveStep::HandingOver);
                out.push(Action::HandOver);
            }
            _ => {}
        }
    }

    /// A drain's session settled: its last snapshot is stored, or it moves with the one
    /// before.
    fn on_settled<S>(
        &mut self,
        settled: Result<S, String>,
        now: Instant,
        out: &mut Vec<Action<S>>,
    ) {
        if !matches!(self.state, State::Moving(MoveStep::Settling)) {
            return;
        }
        match settled {
            Ok(snapshot) => {
                self.state = State::Moving(MoveStep::SavingLast);
                out.push(Action::SaveLast(snapshot));
            }
            Err(reason) => {
                // The store keeps the last settled state the session saved; the gateway
                // sends the inputs after it again (what waits for a snapshot among them).
                tracing::warn!(session = %self.key, %reason, "no last snapshot at the drain: moving with the one before");
                self.held.clear();
                self.state = State::Moving(MoveStep::WindingUp {
                    until: now + OUTCOMES_WAIT,
                });
            }
        }
    }

    fn on_last_saved<S>(
        &mut self,
        saved: Result<u64, StoreError>,
        now: Instant,
        out: &mut Vec<Action<S>>,
    ) {
        if !matches!(self.state, State::Moving(MoveStep::SavingLast)) {
            return;
        }
        match saved {
            Err(StoreError::Fenced { reason, .. }) => self.stop_fenced(&reason, out),
            other => {
                match other {
                    Err(err) => {
                        // What waits for a snapshot never comes: its inputs are sent to
                        // the next owner again, which applies them.
                        tracing::warn!(session = %self.key, error = %err, "the drain's last snapshot was not stored: moving with the one before");
                        self.held.clear();
                    }
                    Ok(holds) => {
                        // What the last snapshot holds goes, now and as it comes. A turn
                        // still queued when it was taken (the drain's deadline interrupted
                        // the one before it) is not in it: it may end here, but its outcome
                        // never goes — the next owner resumes without it and runs it again.
                        self.on_saved(holds);
                        self.held.clear();
                    }
                }
                self.state = State::Moving(MoveStep::WindingUp {
                    until: now + OUTCOMES_WAIT,
                });
            }
        }
    }

    /// The tombstone is written (or could not be, for a reason that is not a newer
    /// owner): the `Ended` record follows.
    fn on_snapshots_ended<S>(&mut self, ended: Result<(), StoreError>, out: &mut Vec<Action<S>>) {
        let State::Ending {
            step: step @ EndStep::Burying,
            ..
        } = &mut self.state
        else {
            return;
        };
        match ended {
            Err(StoreError::Fenced { reason, .. }) => self.stop_fenced(&reason, out),
            other => {
                if let Err(err) = other {
                    tracing::warn!(session = %self.key, error = %err, "cannot end the session's snapshots");
                }
                *step = EndStep::Releasing;
                self.leave();
                out.push(Action::Release);
            }
        }
    }

    fn on_released(&mut self, released: Result<(), LeaseError>, now: Instant) {
        let State::Ending {
            reason,
            step: EndStep::Releasing,
        } = self.state
        else {
            return;
        };
        if let Err(err) = released {
            tracing::warn!(session = %self.key, error = %err, "cannot write the ended record");
        }
        self.state = State::Ending {
            reason,
            step: EndStep::Lingering {
                until: now + LINGER,
            },
        };
    }

    fn on_handed_over<S>(&mut self, handed: Result<u64, LeaseError>, out: &mut Vec<Action<S>>) {
        if !matches!(self.state, State::Moving(MoveStep::HandingOver)) {
            return;
        }
        self.state = State::Done(match handed {
            Ok(revision) => {
                Counts::bump(&self.counts.moved);
                out.push(Action::QueueResume { revision });
                Exit::Moved
            }
            Err(LeaseError::Lost { now: owner, .. }) => {
                tracing::warn!(session = %self.key, %owner, "fenced while handing over");
                Counts::bump(&self.counts.fenced);
                Exit::Fenced
            }
            Err(err) => {
                // The session stays in the worker's index: once the worker's lease is dead
                // (the drain ends it), a sweep queues its resume.
                tracing::warn!(session = %self.key, error = %err, "cannot write the moving record; the sweep of this worker's lease hands it over");
                Exit::Moved
            }
        });
    }

    fn on_disconnected<S>(&mut self, out: &mut Vec<Action<S>>) {
        if !self.left() {
            self.counts.session_ended();
        }
        self.state = State::Done(Exit::Disconnected);
        out.push(Action::Stop);
    }

    fn on_request<S>(
        &mut self,
        request: Request,
        reply_to: Subject,
        saved: u64,
        applied: Applied,
        now: Instant,
        actions: &mut Vec<Action<S>>,
    ) {
        if !self.lease.is_trusted_at(now.into_std()) {
            // Not sure it still owns the session: stay silent, the gateway retries and
            // reaches whoever owns it once this is settled.
            return;
        }
        let reply = match request {
            Request::Replay { from, epoch } => {
                // A gateway still counting in an older owner's numbers gets all of ours.
                let from = if epoch < self.epoch { 1 } else { from };
                let (events, complete) = self.log.since(from);
                Reply::Replay { events, complete }
            }
            Request::Input { id, input } => match self.ledger.admit(id) {
                Admission::Repeat(answer) => {
                    Counts::bump(&self.counts.inputs_repeated);
                    Reply::Applied { id, answer, saved }
                }
                Admission::Earlier { last } => {
                    Counts::bump(&self.counts.inputs_repeated);
                    // Its answer, when the session's ledger keeps it.
                    match applied {
                        Applied::Yes(Some(answer)) => Reply::Applied { id, answer, saved },
                        _ => Reply::Earlier { id, last },
                    }
                }
                Admission::OutOfOrder { expected } => Reply::OutOfOrder { expected },
                // Applied by the owner whose snapshot this session restored, after the
                // snapshot's last contiguous input: answered from the session's ledger,
                // never applied again.
                Admission::Apply if !matches!(applied, Applied::No) => {
                    let answer = match applied {
                        Applied::Yes(Some(answer)) => answer,
                        _ => Answer::Done,
                    };
                    self.ledger.record(id, answer.clone());
                    Counts::bump(&self.counts.inputs_applied);
                    self.last_input = now;
                    Reply::Applied { id, answer, saved }
                }
                Admission::Apply => match &self.state {
                    State::Ending { reason, .. } => Reply::Closed { reason: *reason },
                    State::Moving(_) => Reply::Moving,
                    State::Done(_) => return,
                    State::Live => {
                        if !matches!(input, Input::Close) {
                            self.applying.insert(id, Release::of(&input));
                            actions.push(Action::Apply {
                                id,
                                input,
                                reply_to,
                            });
                            return;
                        }
                        self.ledger.record(id, Answer::Pending);
                        Counts::bump(&self.counts.inputs_applied);
                        self.last_input = now;
                        self.state = State::Ending {
                            reason: CloseReason::Host,
                            step: EndStep::Closing {
                                close_input: Some(id),
                            },
                        };
                        actions.push(Action::Close);
                        Reply::Applied {
                            id,
                            answer: Answer::Pending,
                            saved,
                        }
                    }
                },
            },
        };
        actions.push(Action::Reply {
            to: reply_to,
            reply,
        });
    }

    /// Moves a winding-up session on once its outcomes are in (or their wait is over) and,
    /// for its last words, its lease can be trusted.
    fn advance<S>(&mut self, now: Instant, actions: &mut Vec<Action<S>>) {
        let waited = |until: Instant, under_way: &BTreeMap<u64, Release>| {
            under_way.is_empty() || now >= until
        };
        match &mut self.state {
            State::Ending {
                reason,
                step:
                    EndStep::WindingUp {
                        close_input,
                        history,
                        until,
                    },
            } => {
                if !waited(*until, &self.under_way) || !self.lease.is_trusted_at(now.into_std()) {
                    return;
                }
                let reason = *reason;
                let close_input = *close_input;
                let history = std::mem::take(history);
                // Kept for replay while the owner lingers.
                self.log.keep_from_next();
                // No owner follows an end: what waited for a snapshot goes now.
                let due = std::mem::take(&mut self.held);
                self.release(due);
                if let Some(id) = close_input {
                    self.log.record(WireEventKind::InputDone {
                        input: id,
                        outcome: InputOutcome::History { history },
                    });
                }
                self.log.record(RemoteEventKind::SessionClosed { reason });
                self.publish_now(now, actions);
                self.state = State::Ending {
                    reason,
                    step: EndStep::Burying,
                };
                actions.push(Action::EndSnapshots);
            }
            State::Moving(MoveStep::WindingUp { until }) if waited(*until, &self.under_way) => {
                self.state = State::Moving(MoveStep::Leaving);
                actions.push(Action::Close);
            }
            _ => {}
        }
    }

    /// Another worker owns the session: stop without writing or publishing anything more.
    fn stop_fenced<S>(&mut self, owner: &str, actions: &mut Vec<Action<S>>) {
        tracing::warn!(session = %self.key, %owner, "fenced: another worker owns the session; stopping without writing");
        Counts::bump(&self.counts.fenced);
        if !self.left() {
            self.counts.session_ended();
        }
        self.fenced_after_last_words = self.last_words_said();
        self.state = State::Done(Exit::Fenced);
        actions.push(Action::Stop);
    }

    /// Pushes what waits in the log as one `Publish`, if the lease can be trusted.
    fn publish_now<S>(&mut self, now: Instant, actions: &mut Vec<Action<S>>) {
        let messages = self.batch(now);
        if !messages.is_empty() {
            actions.push(Action::Publish(messages));
        }
    }

    /// The session leaves the worker's live count (before the record that says so).
    fn leave(&self) {
        self.counts.session_ended();
    }

    /// Whether the live count already dropped.
    fn left(&self) -> bool {
        matches!(
            self.state,
            State::Ending {
                step: EndStep::Releasing | EndStep::Lingering { .. },
                ..
            } | State::Moving(MoveStep::HandingOver)
                | State::Done(_)
        )
    }

    /// Whether what the session says now is dropped: once a drain's last snapshot is
    /// taken, and once the last words are out.
    fn quiet(&self) -> bool {
        matches!(
            self.state,
            State::Moving(
                MoveStep::SavingLast
                    | MoveStep::WindingUp { .. }
                    | MoveStep::Leaving
                    | MoveStep::HandingOver
            )
        ) || self.last_words_said()
    }

    /// Whether `SessionClosed` or `SessionMoving` is out: nothing follows it.
    fn last_words_said(&self) -> bool {
        matches!(
            self.state,
            State::Ending {
                step: EndStep::Burying | EndStep::Releasing | EndStep::Lingering { .. },
                ..
            } | State::Moving(MoveStep::HandingOver)
                | State::Done(_)
        )
    }
}

#[cfg(test)]
mod tests;
