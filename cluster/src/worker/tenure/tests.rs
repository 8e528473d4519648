//! Every decision of the tenure, as a unit test: no server, no engine, no clock but the
//! instants the tests hand it. `TRANSITIONS` says where every (state, event) pair leads,
//! checked over every state × every event.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::Ordering;

use serde::Serialize;
use serde_json::Value;
use switchboard::{RunResult, SessionError};

use super::*;
use crate::protocol::{Failure, WireElement, WireEvent};
use crate::remote_session::EventOrder;

/// A drain's last snapshot, as the tests see it.
type Snap = &'static str;

const LEASE: Duration = Duration::from_secs(8);
const IDLE: Duration = Duration::from_secs(60);

struct Fixture {
    tenure: Tenure,
    lease: LeaseClock,
    counts: Arc<Counts>,
    /// When the test began: every instant is an offset of it.
    t0: Instant,
    now: Instant,
    /// Every event published so far, in order.
    published: Vec<WireEvent>,
    /// Joins the parts of a big event, as the gateway does.
    joining: EventOrder,
    /// The next input id (one past the last one applied).
    next: u64,
}

impl Fixture {
    fn new() -> Self {
        Self::with_lease(|lease| lease)
    }

    /// A tenure whose lease clock is `watch`ed (the connection, as the worker's is).
    fn with_lease(watch: impl FnOnce(LeaseClock) -> LeaseClock) -> Self {
        let t0 = Instant::now();
        let lease = watch(LeaseClock::until((t0 + LEASE).into_std()));
        let counts = Arc::new(Counts::default());
        counts.session_live();
        let tenure = Tenure::new(Setup {
            key: SessionKey::new("call-1").unwrap(),
            epoch: 2,
            lease: lease.clone(),
            log: EventLog::new(2, 64 * 1024, 1 << 20),
            ledger: InputLedger::resumed(0),
            idle_timeout: Some(IDLE),
            counts: counts.clone(),
            first: RemoteEventKind::SessionStarted,
            now: t0,
        });
        Self {
            tenure,
            lease,
            counts,
            t0,
            now: t0,
            published: Vec::new(),
            joining: EventOrder::default(),
            next: 1,
        }
    }

    /// Moves the clock `by` on.
    fn wait(&mut self, by: Duration) {
        self.now += by;
    }

    /// The lease, renewed now.
    fn renew_lease(&mut self) {
        self.lease
            .renewed(self.now.into_std(), (self.now + LEASE).into_std());
    }

    /// Feeds `event`; publishes what the actions publish, then the batch (as the loop
    /// does); returns the actions.
    fn on(&mut self, event: Event<Snap>) -> Vec<Action<Snap>> {
        let actions = self.tenure.on(event, self.now);
        for action in &actions {
            match action {
                Action::Publish(messages) => self.read(messages),
                Action::Reply {
                    reply: Reply::Applied { id, .. },
                    ..
                } => self.next = self.next.max(id + 1),
                _ => {}
            }
        }
        self.flush();
        actions
    }

    /// The loop's batch at the end of a wake.
    fn flush(&mut self) {
        let messages = self.tenure.batch(self.now);
        self.read(&messages);
    }

    /// Takes published messages, parts joined into their event (numbered as its last).
    fn read(&mut self, messages: &[Vec<u8>]) {
        for message in messages {
            let elements: Vec<WireElement> = serde_json::from_slice(message).unwrap();
            self.published.extend(join(&mut self.joining, elements));
        }
    }

    fn said(&mut self, text: &str) {
        self.tenure.said(chunk(text));
        self.flush();
    }

    /// Input `id` arrives.
    fn input(&mut self, id: u64, input: Input) -> Vec<Action<Snap>> {
        self.on(request(id, input))
    }

    /// Input `id` arrives and, when the tenure applies it, the engine answers `answer`.
    fn apply(&mut self, id: u64, input: Input, answer: Answer) -> Vec<Action<Snap>> {
        let actions = self.input(id, input);
        assert!(
            matches!(actions.as_slice(), [Action::Apply { id: applied, .. }] if *applied == id),
            "input {id} applied: {actions:?}"
        );
        self.on(Event::Applied {
            id,
            answer,
            reply_to: reply_to(id),
            saved: 0,
        })
    }

    /// A turn under way: input `id`, answered `pending`.
    fn turn(&mut self, id: u64) {
        self.apply(id, run("hi"), Answer::Pending);
    }

    /// What was published, each event's kind as JSON (what the front reads).
    fn kinds(&self) -> Vec<Value> {
        self.published.iter().map(|e| json(&e.kind)).collect()
    }

    /// Where the `InputDone` of input `id` was published, if it was.
    fn done_at(&self, id: u64) -> Option<usize> {
        self.published
            .iter()
            .position(|e| matches!(e.kind, WireEventKind::InputDone { input, .. } if input == id))
    }

    /// Whether the `InputDone` of input `id` was published.
    fn done(&self, id: u64) -> bool {
        self.done_at(id).is_some()
    }

    /// When the tenure last took an input (its idle timeout counts from there).
    fn last_input_at(&self) -> Instant {
        self.tenure.last_input
    }

    fn live(&self) -> usize {
        self.counts.live.load(Ordering::SeqCst)
    }
}

/// A turn's outcome: it ended.
fn turn_done() -> InputOutcome {
    InputOutcome::Turn {
        result: Ok(RunResult::default()),
    }
}

/// A turn's outcome: it failed, the session closed.
fn turn_failed() -> InputOutcome {
    InputOutcome::Turn {
        result: Err(Failure::Session {
            error: SessionError::Closed,
        }),
    }
}

/// Something the session said: a piece of a speech.
/// The events of `elements`, a big one's parts joined by `order` (it may hold the first
/// parts of one from elements before).
fn join(order: &mut EventOrder, elements: Vec<WireElement>) -> Vec<WireEvent> {
    elements
        .into_iter()
        .filter_map(|element| order.join(element).unwrap())
        .collect()
}

fn chunk(text: &str) -> RemoteEventKind {
    RemoteEventKind::SpeechChunk {
        speech: serde_json::from_str("1").unwrap(),
        text: text.to_owned(),
    }
}

/// A value as JSON: what the tests compare (the wire's types hold the engine's errors,
/// which have no equality).
fn json(value: &impl Serialize) -> Value {
    serde_json::to_value(value).unwrap()
}

/// An event's kind as JSON, as [`Fixture::kinds`] gives it.
fn kind(kind: impl Into<WireEventKind>) -> Value {
    json(&kind.into())
}

fn run(text: &str) -> Input {
    Input::Run {
        text: text.to_owned(),
    }
}

fn reply_to(id: u64) -> Subject {
    Subject::from(format!("_INBOX.{id}"))
}

fn request(id: u64, input: Input) -> Event<Snap> {
    Event::Request {
        request: Request::Input { id, input },
        reply_to: reply_to(id),
        saved: 0,
        applied: Applied::No,
    }
}

fn replay(from: u64) -> Event<Snap> {
    Event::Request {
        request: Request::Replay { from, epoch: 2 },
        reply_to: Subject::from("_INBOX.replay"),
        saved: 0,
        applied: Applied::No,
    }
}

fn lost() -> LeaseError {
    LeaseError::Lost {
        session: SessionKey::new("call-1").unwrap(),
        now: "Running on w2 at epoch 3".into(),
    }
}

fn store_fenced() -> StoreError {
    StoreError::Fenced {
        session: "call-1".into(),
        reason: "w2 wrote it".into(),
    }
}

fn store_away() -> StoreError {
    StoreError::Unavailable {
        session: "call-1".into(),
        reason: "the server is away".into(),
    }
}

/// The reply among `actions`.
fn reply(actions: &[Action<Snap>]) -> Option<&Reply> {
    actions.iter().find_map(|a| match a {
        Action::Reply { reply, .. } => Some(reply),
        _ => None,
    })
}

/// The reply among `actions`, as JSON.
fn reply_json(actions: &[Action<Snap>]) -> Option<Value> {
    reply(actions).map(json)
}

fn names(actions: &[Action<Snap>]) -> Vec<&'static str> {
    actions
        .iter()
        .map(|a| match a {
            Action::Reply { .. } => "reply",
            Action::Apply { .. } => "apply",
            Action::Close => "close",
            Action::Settle { .. } => "settle",
            Action::SaveLast(_) => "save last",
            Action::Save => "save",
            Action::Publish(_) => "publish",
            Action::EndSnapshots => "end snapshots",
            Action::Release => "release",
            Action::HandOver => "hand over",
            Action::QueueResume { .. } => "queue resume",
            Action::Stop => "stop",
        })
        .collect()
}

/// Where the tenure is.
fn describe(f: &Fixture) -> &'static str {
    match f.tenure.state() {
        State::Live => "live",
        State::Ending { step, .. } => match step {
            EndStep::Closing { .. } => "closing",
            EndStep::WindingUp { .. } => "winding up to end",
            EndStep::Burying => "burying",
            EndStep::Releasing => "releasing",
            EndStep::Lingering { .. } => "lingering",
        },
        State::Moving(step) => match step {
            MoveStep::Settling => "settling",
            MoveStep::SavingLast => "saving last",
            MoveStep::WindingUp { .. } => "winding up to move",
            MoveStep::Leaving => "leaving",
            MoveStep::HandingOver => "handing over",
        },
        State::Done(Exit::Ended) => "ended",
        State::Done(Exit::Moved) => "moved",
        State::Done(Exit::Fenced) => "fenced",
        State::Done(Exit::Disconnected) => "disconnected",
    }
}

/// A fixture in every state, each with input 1 under way where that holds a state (a
/// winding-up one waits for its outcome): each state is the one before it on its path,
/// after one more event.
fn every_state() -> Vec<(&'static str, Fixture)> {
    type Step = (&'static str, fn() -> Event<Snap>);
    type Path<'a> = (&'static str, &'a dyn Fn() -> Fixture, &'a [Step]);
    fn done_1() -> Event<Snap> {
        Event::Outcome {
            id: 1,
            outcome: InputOutcome::Done { result: Ok(()) },
        }
    }
    fn closed() -> Event<Snap> {
        Event::Closed(SessionHistory::default())
    }
    let closing = || {
        let mut f = Fixture::new();
        f.turn(1);
        f.input(2, Input::Close);
        f
    };
    let settling = || {
        let mut f = Fixture::new();
        f.turn(1);
        let deadline = f.now + Duration::from_secs(5);
        f.on(Event::Drain(deadline));
        f
    };
    let end: &[Step] = &[
        ("winding up to end", closed),
        ("burying", done_1),
        ("releasing", || Event::SnapshotsEnded(Ok(()))),
        ("lingering", || Event::Released(Ok(()))),
        ("ended", || Event::Drain(Instant::now())),
    ];
    let moving: &[Step] = &[
        ("saving last", || Event::Settled(Ok("snapshot"))),
        ("winding up to move", || Event::LastSaved(Ok(1))),
        ("leaving", done_1),
        ("handing over", closed),
        ("moved", || Event::HandedOver(Ok(7))),
    ];
    let paths: [Path<'_>; 2] = [("closing", &closing, end), ("settling", &settling, moving)];
    let mut states = vec![("live", Fixture::new())];
    for (first, start, path) in paths {
        states.push((first, start()));
        for at in 0..path.len() {
            let mut f = start();
            for (_, event) in &path[..=at] {
                f.on(event());
            }
            states.push((path[at].0, f));
        }
    }
    for (name, event) in [
        ("fenced", Event::Fenced("w2 wrote it".into())),
        ("disconnected", Event::Disconnected),
    ] {
        let mut f = Fixture::new();
        f.on(event);
        states.push((name, f));
    }
    for (name, f) in &states {
        assert_eq!(describe(f), *name, "the fixture for {name}");
    }
    states
}

/// Every event the tenure takes, by name.
fn every_event(f: &Fixture) -> Vec<(&'static str, Event<Snap>)> {
    vec![
        ("next input", request(f.next, run("next"))),
        ("close input", request(f.next, Input::Close)),
        ("replay", replay(1)),
        (
            "applied",
            Event::Applied {
                id: f.next,
                answer: Answer::Done,
                reply_to: reply_to(f.next),
                saved: 0,
            },
        ),
        (
            "outcome",
            Event::Outcome {
                id: 1,
                outcome: InputOutcome::Done { result: Ok(()) },
            },
        ),
        ("saved", Event::Saved(9)),
        ("lease renewed", Event::LeaseRenewed),
        ("fenced", Event::Fenced("w2 wrote it".into())),
        ("drain", Event::Drain(f.now + Duration::from_secs(5))),
        ("timer", Event::Timer),
        ("closed", Event::Closed(SessionHistory::default())),
        ("settled", Event::Settled(Ok("snapshot"))),
        ("no snapshot", Event::Settled(Err("closed".into()))),
        ("last saved", Event::LastSaved(Ok(1))),
        ("last not saved", Event::LastSaved(Err(store_away()))),
        ("last refused", Event::LastSaved(Err(store_fenced()))),
        ("snapshots ended", Event::SnapshotsEnded(Ok(()))),
        (
            "tombstone refused",
            Event::SnapshotsEnded(Err(store_fenced())),
        ),
        ("released", Event::Released(Ok(()))),
        ("handed over", Event::HandedOver(Ok(7))),
        ("hand-over lost", Event::HandedOver(Err(lost()))),
        ("disconnected", Event::Disconnected),
    ]
}

/// Where each (state, event) pair leads; a pair not listed leaves the state as it was.
const TRANSITIONS: &[(&str, &str, &str)] = &[
    ("live", "close input", "closing"),
    ("live", "drain", "settling"),
    ("live", "fenced", "fenced"),
    ("live", "disconnected", "disconnected"),
    // Input 1 is under way: its outcome is what the wind-up waits for.
    ("closing", "closed", "winding up to end"),
    ("closing", "fenced", "fenced"),
    ("closing", "disconnected", "disconnected"),
    ("winding up to end", "outcome", "burying"),
    ("winding up to end", "fenced", "fenced"),
    ("winding up to end", "disconnected", "disconnected"),
    ("burying", "snapshots ended", "releasing"),
    // A tombstone the store could not take is logged; the end goes on.
    ("burying", "tombstone refused", "fenced"),
    ("burying", "fenced", "fenced"),
    ("burying", "disconnected", "disconnected"),
    ("releasing", "released", "lingering"),
    ("releasing", "fenced", "fenced"),
    ("releasing", "disconnected", "disconnected"),
    // Its timer comes at the end of `LINGER` (below): a drain ends it at once.
    ("lingering", "drain", "ended"),
    // The worker's lease lost after the end: the end stands (no fence is counted).
    ("lingering", "fenced", "ended"),
    ("lingering", "disconnected", "disconnected"),
    ("settling", "settled", "saving last"),
    ("settling", "no snapshot", "winding up to move"),
    ("settling", "fenced", "fenced"),
    ("settling", "disconnected", "disconnected"),
    ("saving last", "last saved", "winding up to move"),
    ("saving last", "last not saved", "winding up to move"),
    ("saving last", "last refused", "fenced"),
    ("saving last", "fenced", "fenced"),
    ("saving last", "disconnected", "disconnected"),
    ("winding up to move", "outcome", "leaving"),
    ("winding up to move", "fenced", "fenced"),
    ("winding up to move", "disconnected", "disconnected"),
    ("leaving", "closed", "handing over"),
    ("leaving", "fenced", "fenced"),
    ("leaving", "disconnected", "disconnected"),
    ("handing over", "handed over", "moved"),
    ("handing over", "hand-over lost", "fenced"),
    ("handing over", "fenced", "fenced"),
    ("handing over", "disconnected", "disconnected"),
];

fn expected(state: &'static str, event: &str) -> &'static str {
    TRANSITIONS
        .iter()
        .find(|(from, on, _)| *from == state && *on == event)
        .map_or(state, |(_, _, to)| to)
}

#[test]
fn every_state_takes_every_event() {
    let events = every_event(&Fixture::new()).len();
    for index in 0..events {
        for (state, mut f) in every_state() {
            let (event_name, event) = every_event(&f).swap_remove(index);
            let live_before = f.live();
            let published_before = f.published.len();
            let actions = f.on(event);
            let now = describe(&f);
            assert_eq!(now, expected(state, event_name), "{state} × {event_name}");
            // The live count drops once, on the way out.
            assert!(f.live() <= live_before, "{state} × {event_name}");
            if matches!(state, "ended" | "moved" | "fenced" | "disconnected") {
                assert!(
                    actions.is_empty() && f.published.len() == published_before,
                    "{state} × {event_name}: a tenure that is over does nothing: {:?}",
                    names(&actions)
                );
            }
            if now == "fenced" || now == "disconnected" {
                assert_eq!(f.live(), 0, "{state} × {event_name}");
                // A session handing over is closed, sealed and unsubscribed already.
                if state != now && state != "handing over" {
                    assert_eq!(
                        names(&actions).last(),
                        Some(&"stop"),
                        "{state} × {event_name}"
                    );
                }
            }
        }
    }
}

#[test]
fn every_path_out_drops_the_live_count_once() {
    for (state, f) in every_state() {
        let left = matches!(
            state,
            "releasing"
                | "lingering"
                | "ended"
                | "handing over"
                | "moved"
                | "fenced"
                | "disconnected"
        );
        assert_eq!(f.live(), usize::from(!left), "{state}");
    }
}

#[test]
fn the_first_event_goes_out_with_the_first_batch() {
    let mut f = Fixture::new();
    f.flush();
    assert_eq!(f.kinds(), [kind(RemoteEventKind::SessionStarted)]);
    assert_eq!(f.published[0].epoch, 2);
}

#[test]
fn while_the_lease_cannot_be_trusted_nothing_is_answered_or_published() {
    let mut f = Fixture::new();
    f.flush();
    f.wait(LEASE);
    f.said("held back");
    assert!(f.input(1, run("hi")).is_empty(), "no request is answered");
    assert!(f.on(replay(1)).is_empty(), "no replay either");
    assert_eq!(f.published.len(), 1, "only SessionStarted went out");

    // Renewed: the held events go out with the next batch, and inputs are applied.
    f.renew_lease();
    f.on(Event::LeaseRenewed);
    assert_eq!(f.kinds().last(), Some(&kind(chunk("held back"))));
    assert_eq!(names(&f.input(1, run("hi"))), ["apply"]);
}

#[test]
fn a_dropped_connection_is_trusted_again_only_after_a_renewal_sent_since() {
    let up_since = Arc::new(std::sync::Mutex::new(Some(std::time::Instant::now())));
    let mut f = Fixture::with_lease(|lease| lease.watching(up_since.clone()));
    f.flush();
    f.said("before");
    assert_eq!(
        f.kinds().last(),
        Some(&kind(chunk("before"))),
        "trusted while up"
    );

    // The connection drops: another worker may fence the lease at once (it looks dead).
    *up_since.lock().unwrap() = None;
    f.said("held back");
    assert!(
        f.input(1, run("hi")).is_empty(),
        "nothing answered while down"
    );

    // Back, but the lease rests on a write sent before the drop: still nothing, even when
    // a renewal sent before the reconnection is heard.
    *up_since.lock().unwrap() = Some(std::time::Instant::now());
    assert!(f.on(Event::LeaseRenewed).is_empty());
    assert!(
        f.input(1, run("hi")).is_empty(),
        "nothing answered after the reconnection"
    );
    assert_eq!(
        f.kinds().last(),
        Some(&kind(chunk("before"))),
        "nothing published"
    );

    // A renewal sent after the reconnection succeeded: the held events go out, inputs
    // are applied. (Had another worker fenced the lease, it would have failed: lost.)
    f.wait(Duration::from_secs(1));
    f.renew_lease();
    assert!(f.on(Event::LeaseRenewed).is_empty());
    assert_eq!(f.kinds().last(), Some(&kind(chunk("held back"))));
    assert_eq!(names(&f.input(1, run("hi"))), ["apply"]);
}

#[test]
fn an_input_id_is_applied_once_in_every_state() {
    for (state, mut f) in every_state() {
        if matches!(f.tenure.state(), State::Done(_)) {
            assert!(f.input(1, run("hi")).is_empty(), "{state}: over");
            continue;
        }
        if state == "live" {
            f.turn(1);
        }
        // The last input (a turn, or the close) was answered `pending`: a retry gets that
        // answer again.
        let last = f.next - 1;
        let actions = f.input(last, run("hi"));
        assert_eq!(
            reply_json(&actions),
            Some(json(&Reply::Applied {
                id: last,
                answer: Answer::Pending,
                saved: 0
            })),
            "{state}"
        );
        assert!(!names(&actions).contains(&"apply"), "{state}");
        let actions = f.input(9, run("hi"));
        let expected = f.next;
        assert!(
            matches!(reply(&actions), Some(Reply::OutOfOrder { expected: e }) if *e == expected),
            "{state}: {actions:?}"
        );
        let actions = f.input(0, run("hi"));
        assert!(
            matches!(
                reply(&actions),
                Some(Reply::OutOfOrder { .. } | Reply::Earlier { .. })
            ),
            "{state}: {actions:?}"
        );
    }
    let mut f = Fixture::new();
    f.turn(1);
    f.apply(2, run("again"), Answer::Done);
    let actions = f.input(1, run("hi"));
    assert_eq!(
        reply_json(&actions),
        Some(json(&Reply::Earlier { id: 1, last: 2 }))
    );
    assert_eq!(f.counts.inputs_applied.load(Ordering::Relaxed), 2);
    assert_eq!(f.counts.inputs_repeated.load(Ordering::Relaxed), 1);
}

#[test]
fn a_new_input_is_applied_while_live_refused_while_ending_or_moving() {
    for (state, mut f) in every_state() {
        let actions = f.input(f.next, run("next"));
        let got = match (names(&actions).as_slice(), reply(&actions)) {
            (["apply"], None) => "applied",
            (_, Some(Reply::Closed { reason })) => {
                assert_eq!(*reason, CloseReason::Host, "{state}");
                "closed"
            }
            (_, Some(Reply::Moving)) => "moving",
            ([], None) => "nothing",
            _ => panic!("{state}: {actions:?}"),
        };
        let want = match state {
            "live" => "applied",
            "closing" | "winding up to end" | "burying" | "releasing" | "lingering" => "closed",
            "settling" | "saving last" | "winding up to move" | "leaving" | "handing over" => {
                "moving"
            }
            _ => "nothing",
        };
        assert_eq!(got, want, "{state}");
    }
}

#[test]
fn a_close_answers_with_the_history_after_what_the_session_said_and_ends_it() {
    let mut f = Fixture::new();
    let actions = f.input(1, Input::Close);
    assert_eq!(names(&actions), ["close", "reply"]);
    assert_eq!(
        reply_json(&actions),
        Some(json(&Reply::Applied {
            id: 1,
            answer: Answer::Pending,
            saved: 0
        }))
    );
    f.said("said while closing");
    let history = SessionHistory::default();
    let actions = f.on(Event::Closed(history.clone()));
    assert_eq!(names(&actions), ["publish", "end snapshots"]);
    assert_eq!(
        f.kinds()[1..],
        [
            kind(chunk("said while closing")),
            kind(WireEventKind::InputDone {
                input: 1,
                outcome: InputOutcome::History { history }
            }),
            kind(RemoteEventKind::SessionClosed {
                reason: CloseReason::Host
            }),
        ]
    );
    // Nothing is said after the last words.
    f.said("too late");
    assert_eq!(f.published.len(), 4);
    // The tombstone first, then the record.
    assert_eq!(names(&f.on(Event::SnapshotsEnded(Ok(())))), ["release"]);
    assert!(f
        .on(Event::Released(Err(LeaseError::Unreachable {
            session: SessionKey::new("call-1").unwrap(),
            reason: "no answer".into(),
        })))
        .is_empty());
    assert_eq!(describe(&f), "lingering");
    assert_eq!(f.live(), 0);
    f.wait(LINGER);
    assert!(f.on(Event::Timer).is_empty());
    assert_eq!(describe(&f), "ended");
}

#[test]
fn an_idle_session_is_closed_at_its_timeout_and_not_before() {
    let mut f = Fixture::new();
    assert_eq!(f.tenure.timer(), Some(f.t0 + IDLE));
    f.wait(IDLE / 2);
    f.renew_lease();
    f.apply(
        1,
        Input::Transcript {
            text: "hm".into(),
            is_final: false,
        },
        Answer::Done,
    );
    assert_eq!(f.tenure.timer(), Some(f.now + IDLE), "an input restarts it");
    f.wait(IDLE / 2);
    assert!(f.on(Event::Timer).is_empty(), "early");
    f.wait(IDLE / 2);
    f.renew_lease();
    assert_eq!(names(&f.on(Event::Timer)), ["close"]);
    f.on(Event::Closed(SessionHistory::default()));
    assert_eq!(
        f.kinds().last(),
        Some(&kind(RemoteEventKind::SessionClosed {
            reason: CloseReason::Idle
        }))
    );
    let actions = f.input(2, run("late"));
    assert_eq!(
        reply_json(&actions),
        Some(json(&Reply::Closed {
            reason: CloseReason::Idle
        }))
    );
}

#[test]
fn the_last_words_wait_for_the_outcomes_due_at_most_their_wait() {
    // An outcome that comes: before the end.
    let mut f = Fixture::new();
    f.turn(1);
    f.input(2, Input::Close);
    f.on(Event::Closed(SessionHistory::default()));
    assert_eq!(f.tenure.timer(), Some(f.now + OUTCOMES_WAIT));
    f.on(Event::Outcome {
        id: 1,
        outcome: turn_failed(),
    });
    let done = f.done_at(1).unwrap();
    let closed = f
        .published
        .iter()
        .position(|e| {
            matches!(
                e.kind,
                WireEventKind::Event(RemoteEventKind::SessionClosed { .. })
            )
        })
        .unwrap();
    assert!(done < closed);

    // One that does not: the end goes on at the wait's end.
    let mut f = Fixture::new();
    f.turn(1);
    f.input(2, Input::Close);
    f.on(Event::Closed(SessionHistory::default()));
    f.wait(OUTCOMES_WAIT / 2);
    assert!(f.on(Event::Timer).is_empty());
    f.wait(OUTCOMES_WAIT);
    assert_eq!(names(&f.on(Event::Timer)), ["publish", "end snapshots"]);
}

#[test]
fn an_end_waits_for_a_lease_it_can_trust() {
    let mut f = Fixture::new();
    f.input(1, Input::Close);
    f.wait(LEASE);
    assert!(f.on(Event::Closed(SessionHistory::default())).is_empty());
    assert_eq!(describe(&f), "winding up to end");
    f.renew_lease();
    assert_eq!(
        names(&f.on(Event::LeaseRenewed)),
        ["publish", "end snapshots"]
    );
    // Or it finds a newer owner, and says nothing.
    let mut f = Fixture::new();
    f.flush();
    f.input(1, Input::Close);
    f.wait(LEASE);
    f.on(Event::Closed(SessionHistory::default()));
    assert_eq!(
        names(&f.on(Event::Fenced("the worker's lease was lost".into()))),
        ["stop"]
    );
    assert_eq!(f.kinds(), [kind(RemoteEventKind::SessionStarted)]);
}

#[test]
fn a_drain_settles_stores_the_last_snapshot_and_hands_over_quietly_after_it() {
    let mut f = Fixture::new();
    f.turn(1);
    let deadline = f.now + Duration::from_secs(5);
    let actions = f.on(Event::Drain(deadline));
    assert!(matches!(actions.as_slice(), [Action::Settle { deadline: d }] if *d == deadline));
    assert!(f.on(Event::Drain(deadline)).is_empty(), "one drain");
    f.said("said before the snapshot");
    f.on(Event::Outcome {
        id: 1,
        outcome: InputOutcome::Done { result: Ok(()) },
    });
    let actions = f.on(Event::Settled(Ok("snapshot")));
    assert!(matches!(actions.as_slice(), [Action::SaveLast("snapshot")]));
    f.said("said after the snapshot");
    assert_eq!(names(&f.on(Event::LastSaved(Ok(1)))), ["close"]);
    let actions = f.on(Event::Closed(SessionHistory::default()));
    assert_eq!(names(&actions), ["publish", "hand over"]);
    assert_eq!(f.live(), 0, "counted out before the moving record");
    let actions = f.on(Event::HandedOver(Ok(7)));
    assert!(matches!(
        actions.as_slice(),
        [Action::QueueResume { revision: 7 }]
    ));
    assert_eq!(describe(&f), "moved");
    assert_eq!(f.counts.moved.load(Ordering::Relaxed), 1);
    assert_eq!(
        f.kinds()[1..],
        [
            kind(chunk("said before the snapshot")),
            kind(WireEventKind::InputDone {
                input: 1,
                outcome: InputOutcome::Done { result: Ok(()) }
            }),
            kind(RemoteEventKind::SessionMoving),
        ]
    );
}

#[test]
fn a_drain_releases_only_what_its_last_snapshot_holds_and_says_nothing_after_it() {
    let mut f = Fixture::new();
    // Turn 2 waits in the session's queue behind turn 1 when the drain's deadline comes:
    // the last snapshot holds turn 1 only.
    f.turn(1);
    f.turn(2);
    f.on(Event::Drain(f.now));
    f.on(Event::Settled(Ok("snapshot")));
    f.on(Event::LastSaved(Ok(1)));
    assert_eq!(describe(&f), "winding up to move");
    f.said("turn 2 speaks after the snapshot");
    f.on(Event::Outcome {
        id: 1,
        outcome: turn_done(),
    });
    // Turn 2 ran here after the snapshot: the next owner resumes without it and runs it,
    // so its outcome must not reach the front (which would never send it again).
    let actions = f.on(Event::Outcome {
        id: 2,
        outcome: turn_done(),
    });
    assert_eq!(names(&actions), ["close"]);
    f.on(Event::Closed(SessionHistory::default()));
    assert_eq!(
        f.kinds()[1..],
        [
            kind(WireEventKind::InputDone {
                input: 1,
                outcome: turn_done()
            }),
            kind(RemoteEventKind::SessionMoving),
        ]
    );
}

#[test]
fn a_drain_whose_last_snapshot_fails_moves_with_the_one_before_and_a_refused_one_stops() {
    let mut f = Fixture::new();
    f.on(Event::Drain(f.now));
    assert_eq!(
        names(&f.on(Event::Settled(Err("closed".into())))),
        ["close"]
    );

    let mut f = Fixture::new();
    f.on(Event::Drain(f.now));
    f.on(Event::Settled(Ok("snapshot")));
    assert_eq!(names(&f.on(Event::LastSaved(Err(store_away())))), ["close"]);

    let mut f = Fixture::new();
    f.on(Event::Drain(f.now));
    f.on(Event::Settled(Ok("snapshot")));
    assert_eq!(
        names(&f.on(Event::LastSaved(Err(store_fenced())))),
        ["stop"]
    );
    assert_eq!(describe(&f), "fenced");
}

#[test]
fn a_moving_session_is_closed_before_its_moving_record() {
    let mut f = Fixture::new();
    f.on(Event::Drain(f.now));
    f.on(Event::Settled(Ok("snapshot")));
    let actions = f.on(Event::LastSaved(Ok(1)));
    assert_eq!(names(&actions), ["close"], "the close comes first");
    assert_eq!(describe(&f), "leaving");
    assert_eq!(
        names(&f.on(Event::Closed(SessionHistory::default()))),
        ["publish", "hand over"]
    );
}

#[test]
fn a_newer_owner_stops_the_session_without_a_word() {
    for (state, mut f) in every_state() {
        if matches!(f.tenure.state(), State::Done(_)) {
            continue;
        }
        let before = f.published.len();
        f.tenure.said(chunk("after the fence"));
        let lingering = f.tenure.lingering();
        let actions = f.on(Event::Fenced("w2 wrote it".into()));
        // An ended session that lingers for replays just stops lingering: nothing of it
        // runs, and its end is not a fence.
        let (stops, fenced) = if lingering {
            (vec![], 0)
        } else {
            (vec!["stop"], 1)
        };
        assert_eq!(names(&actions), stops, "{state}");
        assert_eq!(
            f.published.len(),
            before,
            "{state}: nothing published after the fence"
        );
        assert!(f.input(5, run("late")).is_empty(), "{state}");
        assert_eq!(f.counts.fenced.load(Ordering::Relaxed), fenced, "{state}");
    }
}

#[test]
fn a_tombstone_the_store_refused_stops_before_the_ended_record() {
    let mut f = Fixture::new();
    f.input(1, Input::Close);
    f.on(Event::Closed(SessionHistory::default()));
    let actions = f.on(Event::SnapshotsEnded(Err(store_fenced())));
    assert_eq!(names(&actions), ["stop"]);
    assert_eq!(describe(&f), "fenced");
    // Its last words were out: it is not handed back.
    assert!(!f.tenure.fenced_before_last_words());
    // One the store could not take (away) goes on to the record.
    let mut f = Fixture::new();
    f.input(1, Input::Close);
    f.on(Event::Closed(SessionHistory::default()));
    assert_eq!(
        names(&f.on(Event::SnapshotsEnded(Err(store_away())))),
        ["release"]
    );
}

#[test]
fn a_session_fenced_before_its_last_words_may_be_handed_back_one_after_them_not() {
    let mut f = Fixture::new();
    assert!(!f.tenure.fenced_before_last_words(), "not fenced");
    f.turn(1);
    assert_eq!(names(&f.on(Event::Fenced("w2 wrote it".into()))), ["stop"]);
    assert!(f.tenure.fenced_before_last_words());
    // Fenced while handing over: `SessionMoving` was out.
    let mut f = Fixture::new();
    f.on(Event::Drain(f.now + Duration::from_secs(5)));
    f.on(Event::Settled(Ok("snapshot")));
    f.on(Event::LastSaved(Ok(0)));
    f.on(Event::Closed(SessionHistory::default()));
    assert_eq!(describe(&f), "handing over");
    f.on(Event::Fenced("w2 wrote it".into()));
    assert!(!f.tenure.fenced_before_last_words());
}

#[test]
fn a_replay_sends_what_is_kept_and_a_newer_epoch_s_gateway_gets_all() {
    let mut f = Fixture::new();
    f.said("one");
    f.said("two");
    let actions = f.on(replay(2));
    let Some(Reply::Replay { events, complete }) = reply(&actions) else {
        panic!("{actions:?}");
    };
    assert!(complete);
    assert_eq!(events.iter().map(|e| e.seq).collect::<Vec<_>>(), [2, 3]);
    // A gateway that counts in an older owner's numbers.
    let actions = f.on(Event::Request {
        request: Request::Replay { from: 3, epoch: 1 },
        reply_to: Subject::from("_INBOX.r"),
        saved: 0,
        applied: Applied::No,
    });
    let Some(Reply::Replay { events, .. }) = reply(&actions) else {
        panic!("{actions:?}");
    };
    assert_eq!(events.first().map(|e| e.seq), Some(1));
}

#[test]
fn an_ending_session_still_answers_replays_so_its_last_words_can_be_fetched() {
    let mut f = Fixture::new();
    f.input(1, Input::Close);
    f.on(Event::Closed(SessionHistory::default()));
    assert_eq!(describe(&f), "burying");
    let actions = f.on(replay(1));
    let Some(Reply::Replay { events, .. }) = reply(&actions) else {
        panic!("{actions:?}");
    };
    assert!(matches!(
        events.last().and_then(|e| e.kind.as_ref()),
        Some(WireEventKind::Event(RemoteEventKind::SessionClosed { .. }))
    ));
}

#[test]
fn an_ended_owner_lingers_with_its_last_words_whole_for_a_gateway_that_missed_a_part() {
    let mut f = Fixture::new();
    f.turn(1);
    f.on(Event::Outcome {
        id: 1,
        outcome: turn_done(),
    });
    f.on(Event::Saved(1));
    f.input(2, Input::Close);
    // A history far over the log's 64 KiB budget: its answer goes in parts.
    let history: SessionHistory = serde_json::from_value(serde_json::json!({
        "agents": [{
            "agent": "greeter",
            "activity": "activity/call-1/greeter#1",
            "chat": [switchboard::ChatItem::message(
                switchboard::ChatRole::User,
                "n".repeat(300 * 1024),
            )],
            "inherited": 0,
            "live": true
        }]
    }))
    .unwrap();
    f.on(Event::Closed(history.clone()));
    let answered_at = f.done_at(2).expect("the close's answer went out");
    // Its first part's number: one past the event before it.
    let from = f.published[answered_at - 1].seq + 1;
    f.on(Event::SnapshotsEnded(Ok(())));
    f.on(Event::Released(Ok(())));
    assert_eq!(describe(&f), "lingering");
    assert!(f.tenure.lingering(), "it gives its slot back");
    assert_eq!(f.tenure.timer(), Some(f.now + LINGER));
    // A gateway that lost a part of the answer asks from it: it gets the answer whole
    // (every part), then the end, however far over the budget.
    f.wait(LINGER - Duration::from_millis(1));
    f.on(Event::Timer);
    let mut order = EventOrder::default();
    let mut replayed = Vec::new();
    let mut next = from;
    loop {
        let replies = f
            .on(replay(next))
            .into_iter()
            .filter_map(|action| match action {
                Action::Reply {
                    reply: Reply::Replay { events, complete },
                    ..
                } => Some((events, complete)),
                _ => None,
            });
        let Some((events, complete)) = replies.last() else {
            panic!("a lingering owner answers replays");
        };
        next = events.last().map_or(next, |e| e.seq + 1);
        replayed.extend(join(&mut order, events));
        if complete {
            break;
        }
    }
    let kinds: Vec<Value> = replayed.iter().map(|e| json(&e.kind)).collect();
    assert_eq!(
        kinds,
        [
            kind(WireEventKind::InputDone {
                input: 2,
                outcome: InputOutcome::History { history },
            }),
            kind(RemoteEventKind::SessionClosed {
                reason: CloseReason::Host
            }),
        ]
    );
    // A resent close is answered as before; a new input `closed`.
    assert!(matches!(
        reply(&f.input(2, Input::Close)),
        Some(Reply::Applied { id: 2, .. })
    ));
    assert!(matches!(
        reply(&f.input(3, run("late"))),
        Some(Reply::Closed { .. })
    ));
    // Then it is over, and answers nothing.
    f.wait(Duration::from_millis(1));
    f.on(Event::Timer);
    assert_eq!(describe(&f), "ended");
    assert!(f.on(replay(from)).is_empty());
}

#[test]
fn an_input_the_session_s_ledger_holds_is_answered_from_it_and_never_applied_again() {
    // A session resumed from a snapshot holding inputs up to 4 contiguously, whose ledger
    // also holds 5 (applied after a turn still queued at the snapshot).
    let mut f = Fixture::new();
    f.tenure.ledger = InputLedger::resumed(4);
    let ledger_holds = |id, answer| Event::Request {
        request: Request::Input {
            id,
            input: Input::Transcript {
                text: "hm".into(),
                is_final: false,
            },
        },
        reply_to: reply_to(id),
        saved: 0,
        applied: Applied::Yes(answer),
    };
    let actions = f.on(ledger_holds(5, None));
    assert_eq!(
        actions.len(),
        1,
        "answered, nothing applied: {:?}",
        names(&actions)
    );
    assert_eq!(
        reply_json(&actions),
        Some(json(&Reply::Applied {
            id: 5,
            answer: Answer::Done,
            saved: 0
        }))
    );
    // An earlier one: with its answer when the ledger keeps it, `earlier` when not.
    // (serde is how a worker gets a speech id it did not make.)
    let speech = Answer::Speech {
        speech: serde_json::from_str("3").unwrap(),
        allow_interruptions: true,
    };
    let actions = f.on(ledger_holds(3, Some(speech.clone())));
    assert_eq!(
        reply_json(&actions),
        Some(json(&Reply::Applied {
            id: 3,
            answer: speech,
            saved: 0
        }))
    );
    let actions = f.on(ledger_holds(2, None));
    assert_eq!(
        reply_json(&actions),
        Some(json(&Reply::Earlier { id: 2, last: 5 }))
    );
    // The next one the ledger does not hold is applied.
    assert_eq!(names(&f.input(6, run("next"))), ["apply"]);
}

#[test]
fn an_outcome_reaches_the_front_once_a_stored_snapshot_holds_its_input() {
    let mut f = Fixture::new();
    f.turn(1);
    f.apply(2, Input::History, Answer::Pending);
    f.flush();
    let done = |f: &Fixture, id| f.done(id);
    f.on(Event::Outcome {
        id: 1,
        outcome: turn_done(),
    });
    assert!(!done(&f, 1), "the turn's outcome waits for its snapshot");
    // A read changes nothing to save: its outcome goes at once.
    f.on(Event::Outcome {
        id: 2,
        outcome: InputOutcome::History {
            history: SessionHistory::default(),
        },
    });
    assert!(done(&f, 2));
    f.on(Event::Saved(1));
    assert!(done(&f, 1), "stored: it goes");
    // An outcome whose input is stored already goes at once.
    f.turn(3);
    f.on(Event::Saved(3));
    f.on(Event::Outcome {
        id: 3,
        outcome: turn_done(),
    });
    assert!(done(&f, 3));
    // A failed turn, an interruption: at once (they may change nothing to save).
    f.turn(4);
    f.on(Event::Outcome {
        id: 4,
        outcome: turn_failed(),
    });
    assert!(done(&f, 4));
    f.apply(5, Input::Interrupt { force: false }, Answer::Pending);
    f.on(Event::Outcome {
        id: 5,
        outcome: InputOutcome::Done { result: Ok(()) },
    });
    assert!(done(&f, 5));
}

#[test]
fn what_waits_for_a_snapshot_goes_at_an_end_and_a_stored_move_and_never_from_a_fenced_owner() {
    let published = |f: &Fixture| f.done(1);
    // Turn 1 ended, and waits for a snapshot that holds it.
    let waiting = || {
        let mut f = Fixture::new();
        f.turn(1);
        f.on(Event::Outcome {
            id: 1,
            outcome: turn_done(),
        });
        f
    };
    let drained = || {
        let mut f = waiting();
        f.on(Event::Drain(f.now));
        f.on(Event::Settled(Ok("snapshot")));
        f
    };
    // An end: no owner follows.
    let mut f = waiting();
    f.input(2, Input::Close);
    f.on(Event::Closed(SessionHistory::default()));
    assert!(published(&f));
    // A move whose last snapshot is stored.
    let mut f = drained();
    assert!(!published(&f));
    f.on(Event::LastSaved(Ok(1)));
    assert!(published(&f));
    // A move whose last snapshot is not: the next owner applies the input again.
    let mut f = drained();
    f.on(Event::LastSaved(Err(store_away())));
    f.on(Event::Closed(SessionHistory::default()));
    assert!(!published(&f));
    // A fenced owner.
    let mut f = waiting();
    f.on(Event::Fenced("w2 wrote it".into()));
    f.on(Event::Saved(1));
    assert!(!published(&f));
}

#[test]
fn an_outcome_that_waits_too_long_for_the_session_s_save_asks_for_one_until_it_comes() {
    let mut f = Fixture::new();
    f.turn(1);
    f.on(Event::Outcome {
        id: 1,
        outcome: turn_done(),
    });
    assert_eq!(f.tenure.timer(), Some(f.now + SAVE_WAIT));
    f.wait(SAVE_WAIT);
    assert_eq!(names(&f.on(Event::Timer)), ["save"]);
    // The save failed (the lease, the store): asked again after another wait.
    f.wait(SAVE_WAIT / 2);
    assert!(f.on(Event::Timer).is_empty());
    f.wait(SAVE_WAIT / 2);
    f.renew_lease();
    assert_eq!(names(&f.on(Event::Timer)), ["save"]);
    f.on(Event::Saved(1));
    assert!(f.done(1));
    assert_eq!(
        f.tenure.timer(),
        Some(f.last_input_at() + IDLE),
        "nothing waits now"
    );
}
