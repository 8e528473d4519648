//! The fault campaign's harness: a cluster of worker processes, each behind its own
//! [`Proxy`], fronts that talk all the time and record what they sent and what they got,
//! faults drawn from a seeded generator, and a checker over the record.
//!
//! **Faults**, one kind at a time drawn at random, on a random worker that is healthy
//! (at least one stays healthy): SIGKILL (a new worker process takes its place),
//! SIGSTOP (then SIGCONT), a drain (SIGTERM; a new process takes its place once it
//! exits), a partition (its proxy stops forwarding, then forwards again), and a restart
//! of the NATS server itself (only while no other fault is under way). A freeze or a
//! partition lasts from a quarter of the lease (its inputs wait, and retries pile up
//! behind them) to twice the lease (its sessions go on elsewhere, and it is fenced).
//!
//! **Fronts**: each session's front sends, one after the other, a plain turn, a turn that
//! calls the async tool `lookup` (policy `Restart`, it sends an update), a turn that waits
//! on the tool `wait` (policy `Abandon`), or a `say`, each with a text that names it.
//!
//! **The checker**, over each session's final history, the record and the tools' effect
//! lines (`effect <tool> <what> start`, printed by the worker processes):
//!
//! * every input is in the conversation at most once (applied once);
//! * every input whose call answered is in it exactly once (no answered input lost) — but
//!   a `say` whose owner died before a snapshot held it, which is cut as a barge-in cuts a
//!   speech (counted apart);
//! * the inputs are in it in the order they were sent, and nothing else is (continuous);
//! * each answer is the answer to its own input;
//! * no tool body of policy `Abandon` ran twice for one request; no model request broke
//!   the one-output rule; no front had to give its session up.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use switchboard::{ChatItem, ChatRole, SessionEvent};
use switchboard_cluster::local::NatsServer;
use switchboard_cluster::{
    ClusterClient, GatewayError, GatewayOptions, Namespace, RemoteEventKind, RemoteEvents,
    RemoteEventsError, RemoteSession, SessionSpec,
};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::common::{self, WorkerProcess, PATIENCE};
use crate::proxy::Proxy;

/// A seeded generator (splitmix64): a seed names the faults a run draws and the inputs
/// each front sends (their timing is the machine's).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number below `n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// A duration between `low` and `high`.
    pub fn between(&mut self, low: Duration, high: Duration) -> Duration {
        let span = u64::try_from((high - low).as_millis()).unwrap_or(0);
        low + Duration::from_millis(self.below(span + 1))
    }
}

/// What a campaign does.
#[derive(Clone, Debug)]
pub struct Plan {
    pub seed: u64,
    pub sessions: usize,
    pub workers: usize,
    /// How long faults are drawn.
    pub faults_for: Duration,
    pub lease_secs: u64,
    /// How long each tool works.
    pub tool_ms: u64,
}

/// The kinds of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    Kill,
    Freeze,
    Partition,
    Drain,
    ServerRestart,
}

/// What a front sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sent {
    /// A turn whose reply is plain.
    Run(String),
    /// A turn that calls `lookup` (`Restart`) about this.
    Lookup(String),
    /// A turn that waits on `wait` (`Abandon`) for this.
    Wait(String),
    /// A `say`.
    Say(String),
}

impl Sent {
    /// What the conversation holds when the input was applied: the user's message, or
    /// the assistant's for a `say`.
    fn text(&self) -> String {
        match self {
            Self::Run(text) | Self::Say(text) => text.clone(),
            Self::Lookup(what) => format!("look up {what}"),
            Self::Wait(what) => format!("wait for {what}"),
        }
    }
}

/// What a front got back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Got {
    /// A turn's assistant messages.
    Reply(Vec<String>),
    /// A turn interrupted before it said anything (a drain's deadline interrupts a turn
    /// that has not settled, and its outcome says so).
    Interrupted,
    /// A `say` was queued.
    Speech,
    /// The call failed: the error's kind and words.
    Failed { kind: &'static str, error: String },
}

/// One input and its answer.
#[derive(Clone, Debug)]
pub struct Exchange {
    pub sent: Sent,
    pub got: Got,
}

/// What a campaign did and found.
#[derive(Debug, Default)]
pub struct Report {
    pub seed: u64,
    pub took: Duration,
    pub faults: BTreeMap<String, u64>,
    pub inputs: u64,
    pub answered: u64,
    /// Calls that failed, by kind.
    pub failed: BTreeMap<&'static str, u64>,
    /// Tool bodies started, and started again for the same request, by tool.
    pub tool_starts: BTreeMap<String, u64>,
    pub tool_restarts: BTreeMap<String, u64>,
    /// Lookups the tool refused because one still ran (its duplicate policy).
    pub lookups_refused: u64,
    /// Waits refused the same way (beside one resent to a new owner, which runs again).
    pub waits_refused: u64,
    /// Waits not made because their call could not be recorded (its owner's store write
    /// failed: its lease could not be trusted for a moment, a write before it failed): an
    /// `Abandon` body runs only once a stored snapshot holds its call, and the model is
    /// told it was not made.
    pub waits_unrecorded: u64,
    /// Turns interrupted before they said anything (a drain's deadline came first).
    pub turns_interrupted: u64,
    /// `say`s answered whose speech an owner lost before a snapshot held it: cut, as a
    /// barge-in cuts a speech.
    pub says_cut: u64,
    pub resumes: u64,
    pub events_lost: u64,
    pub violations: Vec<String>,
    /// Bodies of the `Abandon` tool that ran again for one request (each a violation too).
    pub abandon_reruns: Vec<String>,
}

impl Report {
    /// The figures, as a table.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "| seed | {} |", self.seed);
        let _ = writeln!(out, "| took | {:.0?} |", self.took);
        for (kind, n) in &self.faults {
            let _ = writeln!(out, "| faults: {kind} | {n} |");
        }
        let _ = writeln!(out, "| inputs sent | {} |", self.inputs);
        let _ = writeln!(out, "| inputs answered | {} |", self.answered);
        for (kind, n) in &self.failed {
            let _ = writeln!(out, "| calls failed: {kind} | {n} |");
        }
        for (tool, n) in &self.tool_starts {
            let again = self.tool_restarts.get(tool).copied().unwrap_or(0);
            let _ = writeln!(out, "| tool bodies started: {tool} | {n} ({again} again) |");
        }
        let _ = writeln!(
            out,
            "| lookups refused as duplicates | {} |",
            self.lookups_refused
        );
        let _ = writeln!(
            out,
            "| waits refused as duplicates | {} |",
            self.waits_refused
        );
        let _ = writeln!(
            out,
            "| waits not made: their call could not be recorded | {} |",
            self.waits_unrecorded
        );
        let _ = writeln!(
            out,
            "| turns interrupted by a drain's deadline before they said anything | {} |",
            self.turns_interrupted
        );
        let _ = writeln!(out, "| says cut by a move | {} |", self.says_cut);
        let _ = writeln!(
            out,
            "| Abandon bodies run again | {} |",
            self.abandon_reruns.len()
        );
        let _ = writeln!(out, "| sessions resumed elsewhere | {} |", self.resumes);
        let _ = writeln!(out, "| events reported lost | {} |", self.events_lost);
        let _ = writeln!(out, "| violations | {} |", self.violations.len());
        out
    }
}

/// One place for a worker: its proxy, and the process there now.
struct Slot {
    index: usize,
    proxy: Proxy,
    process: Option<WorkerProcess>,
    generation: u32,
    fault: Option<Active>,
}

/// A fault under way on a slot, and when it ends.
#[derive(Clone, Copy, Debug)]
enum Active {
    Frozen(Instant),
    Cut(Instant),
    Draining,
}

struct Cluster {
    server: NatsServer,
    slots: Vec<Slot>,
    /// Processes that died or left, kept for their lines.
    retired: Vec<WorkerProcess>,
    worker_args: Vec<String>,
    capacity: usize,
}

impl Cluster {
    fn start_worker(&mut self, index: usize) {
        let slot = &mut self.slots[index];
        let name = format!("w{}-g{}", slot.index, slot.generation);
        slot.generation += 1;
        let url = slot.proxy.url();
        let args = self.worker_args.clone();
        let capacity = self.capacity;
        let process =
            tokio::task::block_in_place(|| WorkerProcess::start_with(&url, &name, capacity, &args));
        slot.process = Some(process);
    }

    fn retire(&mut self, index: usize) {
        if let Some(process) = self.slots[index].process.take() {
            self.retired.push(process);
        }
    }

    fn healthy(&self) -> Vec<usize> {
        self.slots
            .iter()
            .filter(|s| s.fault.is_none() && s.process.is_some())
            .map(|s| s.index)
            .collect()
    }

    /// Ends the faults that are due (all of them with `all`).
    fn recover(&mut self, all: bool) {
        let now = Instant::now();
        for index in 0..self.slots.len() {
            match self.slots[index].fault {
                Some(Active::Frozen(until)) if all || now >= until => {
                    if let Some(process) = &self.slots[index].process {
                        process.thaw();
                    }
                    self.slots[index].fault = None;
                }
                Some(Active::Cut(until)) if all || now >= until => {
                    self.slots[index].proxy.heal();
                    self.slots[index].fault = None;
                }
                Some(Active::Draining) => {
                    let wait = if all { PATIENCE } else { Duration::ZERO };
                    let exited = self.slots[index]
                        .process
                        .as_mut()
                        .map_or(Some(()), |p| p.wait_exit(wait).map(|_| ()));
                    if exited.is_some() {
                        self.retire(index);
                        self.start_worker(index);
                        self.slots[index].fault = None;
                    } else if all {
                        panic!("worker slot {index} did not finish draining");
                    }
                }
                _ => {}
            }
        }
    }

    /// Every line the worker processes printed, old and new.
    fn lines(&mut self) -> Vec<String> {
        let mut lines = Vec::new();
        for process in &mut self.retired {
            lines.extend(process.lines_so_far());
        }
        for slot in &mut self.slots {
            if let Some(process) = &mut slot.process {
                lines.extend(process.lines_so_far());
            }
        }
        lines
    }
}

/// Runs a campaign; see the module docs.
pub async fn run(plan: Plan) -> Report {
    let began = Instant::now();
    let mut rng = Rng::new(plan.seed);
    let server = NatsServer::start().unwrap();
    let mut worker_args = common::credentials(&server);
    worker_args.extend([
        "--lease-secs".to_owned(),
        plan.lease_secs.to_string(),
        "--drain-secs".to_owned(),
        "1".to_owned(),
    ]);
    let mut slots = Vec::new();
    for index in 0..plan.workers {
        slots.push(Slot {
            index,
            proxy: Proxy::start(&server.url()).await,
            process: None,
            generation: 0,
            fault: None,
        });
    }
    let mut cluster = Cluster {
        server,
        slots,
        retired: Vec::new(),
        worker_args,
        capacity: plan.sessions + 10,
    };
    for index in 0..plan.workers {
        cluster.start_worker(index);
    }
    let gateway = common::gateway(&cluster.server, GatewayOptions::new()).await;
    let observer = common::client(&cluster.server, "observer").await;

    // The sessions, then their fronts.
    let mut sessions = Vec::new();
    for _ in 0..plan.sessions {
        let spec = SessionSpec::new("greeter").data(json!({ "tool_ms": plan.tool_ms }));
        let session = common::within("a session to start", gateway.start_session(spec))
            .await
            .unwrap();
        sessions.push(session);
    }
    // What each session's owners said of their inputs, as it happened (the gateway keeps
    // only its last events): which owner answered each turn, and what each new owner's
    // snapshot held. What a violation's explanation needs.
    let mut witnesses = Vec::new();
    let mut recorders = JoinSet::new();
    for session in &sessions {
        let witness = Arc::new(Mutex::new(Witness::default()));
        witnesses.push(witness.clone());
        recorders.spawn(witness_events(session.subscribe(), witness));
    }
    let (stop, stopping) = watch::channel(false);
    let mut fronts = JoinSet::new();
    let mut logs = Vec::new();
    for (i, session) in sessions.iter().enumerate() {
        let log = Arc::new(Mutex::new(FrontLog::default()));
        logs.push(log.clone());
        let front = talk(
            i,
            session.clone(),
            Rng::new(plan.seed ^ (i as u64 + 1).wrapping_mul(0x1000_0001)),
            stopping.clone(),
            log,
        );
        fronts.spawn(front);
    }

    // The faults.
    let lease = Duration::from_secs(plan.lease_secs);
    let mut faults: BTreeMap<String, u64> = BTreeMap::new();
    let end = Instant::now() + plan.faults_for;
    while Instant::now() < end {
        cluster.recover(false);
        let healthy = cluster.healthy();
        let any_active = cluster.slots.iter().any(|s| s.fault.is_some());
        let kind = match rng.below(100) {
            0..=21 => Fault::Kill,
            22..=43 => Fault::Freeze,
            44..=65 => Fault::Partition,
            66..=87 => Fault::Drain,
            _ => Fault::ServerRestart,
        };
        let started = match kind {
            Fault::ServerRestart if !any_active => {
                let down = rng.between(Duration::from_millis(100), Duration::from_millis(1500));
                cluster.server.kill();
                tokio::time::sleep(down).await;
                tokio::task::block_in_place(|| cluster.server.start_again()).unwrap();
                true
            }
            Fault::ServerRestart => false,
            _ if healthy.len() < 2 => false,
            _ => {
                let index = healthy[usize::try_from(rng.below(healthy.len() as u64)).unwrap()];
                // Shorter than the lease (a pause its inputs wait out: retries pile up in
                // its socket) or past it (its sessions go on elsewhere).
                let past_lease = rng.between(lease / 4, 2 * lease);
                match kind {
                    Fault::Kill => {
                        if let Some(process) = &mut cluster.slots[index].process {
                            tokio::task::block_in_place(|| process.kill());
                        }
                        cluster.retire(index);
                        tokio::time::sleep(
                            rng.between(Duration::from_millis(50), Duration::from_millis(500)),
                        )
                        .await;
                        cluster.start_worker(index);
                    }
                    Fault::Freeze => {
                        if let Some(process) = &cluster.slots[index].process {
                            tokio::task::block_in_place(|| process.freeze());
                        }
                        cluster.slots[index].fault =
                            Some(Active::Frozen(Instant::now() + past_lease));
                    }
                    Fault::Partition => {
                        cluster.slots[index].proxy.cut();
                        cluster.slots[index].fault = Some(Active::Cut(Instant::now() + past_lease));
                    }
                    Fault::Drain => {
                        if let Some(process) = &cluster.slots[index].process {
                            process.terminate();
                        }
                        cluster.slots[index].fault = Some(Active::Draining);
                    }
                    Fault::ServerRestart => {}
                }
                true
            }
        };
        if started {
            *faults.entry(format!("{kind:?}")).or_default() += 1;
        }
        tokio::time::sleep(rng.between(Duration::from_millis(300), Duration::from_millis(1200)))
            .await;
    }
    cluster.recover(true);

    // The fronts go on a little on a healed cluster (what moved settles), then stop.
    tokio::time::sleep(2 * lease).await;
    stop.send_replace(true);
    // Each front's last input is answered within the gateway's input deadline (30 s) on
    // a healed cluster; a front still waiting past it is stuck.
    let _ = tokio::time::timeout(Duration::from_secs(40), async {
        while fronts.join_next().await.is_some() {}
    })
    .await;
    fronts.abort_all();

    // The checker.
    let mut report = Report {
        seed: plan.seed,
        faults,
        ..Report::default()
    };
    let mut records: Vec<(usize, Vec<Exchange>)> = Vec::new();
    recorders.abort_all();
    for (i, (log, session)) in logs.iter().zip(&sessions).enumerate() {
        let log = std::mem::take(&mut *log.lock().unwrap());
        if let Some((sent, since)) = &log.busy {
            report.violations.push(format!(
                "session {i}: its front still waits on {sent:?} after {:.0?}; its last events: {}\n  its snapshots: {}",
                since.elapsed(),
                last_events(session).await,
                snapshot_records(&observer, session).await,
            ));
            continue;
        }
        let witness = std::mem::take(&mut *witnesses[i].lock().unwrap());
        check_session(i, session, &log.exchanges, &witness, &observer, &mut report).await;
        records.push((i, log.exchanges));
    }
    let lines = cluster.lines();
    check_effects(&lines, &records, &mut report);
    let stats = gateway.stats();
    report.resumes = stats.resumes;
    report.events_lost = stats.events_lost;
    if stats.stale_replies > 0 {
        report.violations.push(format!(
            "{} replies came from owners older than the newest (fenced owners that answered)",
            stats.stale_replies
        ));
    }
    // A close through the gateway ends, answered or failed, within the gateway's bounds.
    for (i, session) in sessions.iter().enumerate() {
        if tokio::time::timeout(GATEWAY_BOUND, session.close())
            .await
            .is_err()
        {
            report.violations.push(format!(
                "session {i} ({}): its close neither answered nor failed within {GATEWAY_BOUND:?}; its last events: {}",
                session.id(),
                last_events(session).await,
            ));
        }
    }
    report.took = began.elapsed();
    report
}

/// Past the gateway's own bounds on a call: its input deadline (30 s) for an owner to take
/// an input, and as long again of the owner's silence for an outcome; a loaded machine
/// gets a margin.
const GATEWAY_BOUND: Duration = Duration::from_secs(75);

/// What a front sent and got so far, and the input it waits on.
#[derive(Debug, Default)]
struct FrontLog {
    exchanges: Vec<Exchange>,
    busy: Option<(Sent, Instant)>,
}

/// One front: inputs, one after the other, until told to stop or its session is lost.
async fn talk(
    i: usize,
    session: RemoteSession,
    mut rng: Rng,
    stop: watch::Receiver<bool>,
    log: Arc<Mutex<FrontLog>>,
) {
    let mut n = 0;
    while !*stop.borrow() {
        n += 1;
        let sent = match rng.below(100) {
            0..=54 => Sent::Run(format!("s{i} t{n}")),
            55..=69 => Sent::Lookup(format!("s{i}-{n}")),
            70..=84 => Sent::Wait(format!("s{i}-{n}")),
            _ => Sent::Say(format!("s{i} said {n}")),
        };
        log.lock().unwrap().busy = Some((sent.clone(), Instant::now()));
        let got = match &sent {
            Sent::Say(text) => match session.say(text.clone()).await {
                Ok(_) => Got::Speech,
                Err(err) => failed(&err),
            },
            other => match session.run(other.text()).await {
                Ok(turn) if turn.interrupted && turn.assistant_messages().next().is_none() => {
                    Got::Interrupted
                }
                Ok(turn) => Got::Reply(turn.assistant_messages().map(str::to_owned).collect()),
                Err(err) => failed(&err),
            },
        };
        let give_up = matches!(
            got,
            Got::Failed {
                kind: "unreachable" | "ended" | "inputs lost" | "nats",
                ..
            }
        );
        let mut log = log.lock().unwrap();
        log.busy = None;
        log.exchanges.push(Exchange { sent, got });
        if give_up {
            break;
        }
    }
}

fn failed(err: &GatewayError) -> Got {
    let kind = match err {
        GatewayError::Unreachable { .. } => "unreachable",
        GatewayError::AnswerLost { .. } => "answer lost",
        GatewayError::Closed { .. } => "closed",
        GatewayError::InputsLost { .. } => "inputs lost",
        GatewayError::Session { .. } => "session",
        GatewayError::Nats { .. } => "nats",
        _ => "other",
    };
    Got::Failed {
        kind,
        error: err.to_string(),
    }
}

/// Checks one session's record against its final history.
async fn check_session(
    i: usize,
    session: &RemoteSession,
    exchanges: &[Exchange],
    witness: &Witness,
    observer: &ClusterClient,
    report: &mut Report,
) {
    let mut found = Vec::new();
    let key = session.id().to_string();
    let mut violation = |what: String| found.push(format!("session {i} ({key}): {what}"));
    // Each answer is its own input's.
    let mut answered = 0;
    let mut failed: Vec<&'static str> = Vec::new();
    for exchange in exchanges {
        match (&exchange.sent, &exchange.got) {
            // Interrupted before it said anything (a drain's deadline): its tool ran at
            // most once, which `check_effects` counts.
            (Sent::Run(_) | Sent::Wait(_) | Sent::Lookup(_), Got::Reply(reply))
                if reply.is_empty() =>
            {
                report.turns_interrupted += 1;
            }
            (Sent::Run(text), Got::Reply(reply)) => {
                if reply != &[format!("You said: {text}")] {
                    violation(format!("{text:?} answered {reply:?}"));
                }
            }
            (Sent::Wait(what), Got::Reply(reply)) => {
                // Refused beside a wait still running: one resent to a new owner (its
                // answer was heard from the old one) runs again there.
                if refused_as_duplicate(reply) {
                    report.waits_refused += 1;
                } else if not_recorded(reply) {
                    report.waits_unrecorded += 1;
                } else if reply != &[format!("Lookup says: waited for {what}")] {
                    violation(format!("wait for {what:?} answered {reply:?}"));
                }
            }
            (Sent::Lookup(what), Got::Reply(reply)) => {
                if refused_as_duplicate(reply) {
                    report.lookups_refused += 1;
                } else if !reply.iter().any(|r| r.contains(what.as_str())) {
                    violation(format!("look up {what:?} answered {reply:?}"));
                }
            }
            (Sent::Say(_), Got::Speech) => {}
            (_, Got::Interrupted) => report.turns_interrupted += 1,
            (_, Got::Failed { kind, error }) => {
                failed.push(kind);
                if matches!(
                    *kind,
                    "unreachable" | "ended" | "inputs lost" | "nats" | "other"
                ) {
                    violation(format!(
                        "the front gave its session up at {:?}: {error}",
                        exchange.sent
                    ));
                }
                continue;
            }
            (sent, got) => violation(format!("{sent:?} got {got:?}")),
        }
        answered += 1;
    }
    report.violations.append(&mut found);
    report.inputs += exchanges.len() as u64;
    report.answered += answered;
    for kind in failed {
        *report.failed.entry(kind).or_default() += 1;
    }

    // The conversation.
    // A read through the gateway answers or fails within the gateway's own bounds (the
    // input deadline for an owner to take it, the same again of an owner's silence for
    // its outcome): waited for past them, so that what the gateway says is what the
    // checker reports, and a read that stays unanswered beyond them (a liveness gap)
    // is reported as one, naming the session and what it last saw.
    let read = tokio::time::timeout(GATEWAY_BOUND, session.history()).await;
    let history = match read {
        Ok(Ok(history)) => history,
        Err(_) => {
            // Not a panic: which session, who owns it and under what lease say why.
            report.violations.push(format!(
                "session {i} ({key}): the final history read neither answered nor failed \
                 within {GATEWAY_BOUND:?} (beyond the gateway's own bounds); its owner record: \
                 {:?}, that worker's lease: {:?}; its last events: {}\n  its resumes: {}\n  \
                 its snapshots: {}",
                common::owner_of(observer, session.id()).await,
                common::lease_of_owner(observer, session.id()).await,
                last_events(session).await,
                witness.resumes_around(u64::MAX),
                snapshot_records(observer, session).await,
            ));
            return;
        }
        Ok(Err(err)) => {
            report.violations.push(format!(
                "session {i} ({key}): no final history: {err}; its last events: {}\n  its first resumes: {}",
                last_events(session).await,
                witness.resumes_around(0),
            ));
            return;
        }
    };
    let mut violation = |what: String| {
        report
            .violations
            .push(format!("session {i} ({key}): {what}"))
    };
    let user = history.user_messages();
    let assistant = history.assistant_messages();
    let mut count: HashMap<&str, usize> = HashMap::new();
    for text in user.iter().chain(&assistant) {
        *count.entry(text).or_default() += 1;
    }
    let mut sent_user = Vec::new();
    let mut missing: Vec<&Sent> = Vec::new();
    for exchange in exchanges {
        let text = exchange.sent.text();
        let times = count.get(text.as_str()).copied().unwrap_or(0);
        if times > 1 {
            violation(format!("{text:?} applied {times} times"));
        }
        if times == 0 && !matches!(exchange.got, Got::Failed { .. }) {
            if matches!(exchange.sent, Sent::Say(_)) {
                // A speech its owner lost before a snapshot held it is cut as a barge-in
                // cuts one (to nothing, here): what a restore does with speech not yet
                // stored. Applied at most once still holds.
                report.says_cut += 1;
            } else {
                missing.push(&exchange.sent);
            }
        }
        if !matches!(exchange.sent, Sent::Say(_)) {
            sent_user.push(text);
        }
    }
    for sent in missing {
        report.violations.push(format!(
            "session {i} ({key}): {:?} answered but not in the conversation; {}",
            sent.text(),
            witness.explain(sent)
        ));
    }
    let mut violation = |what: String| {
        report
            .violations
            .push(format!("session {i} ({key}): {what}"))
    };
    // In the order sent, and nothing else.
    let mut next = 0;
    for text in &user {
        match sent_user[next..].iter().position(|s| s == text) {
            Some(at) => next += at + 1,
            None => violation(format!(
                "{text:?} is in the conversation out of order or never sent"
            )),
        }
    }
}

/// The messages of `session`'s snapshots subject (what a failed check shows).
async fn snapshot_records(observer: &ClusterClient, session: &RemoteSession) -> String {
    common::snapshot_records(observer, &Namespace::default(), session.id())
        .await
        .iter()
        .map(|r| format!("{}@{}/{}", r.kind, r.epoch, r.worker))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What a session's owners said of its inputs, in the order the gateway delivered it.
#[derive(Debug, Default)]
struct Witness {
    /// Each owner's epoch and the last input its snapshot held, as it took over.
    resumes: Vec<(u64, u64)>,
    /// Each assistant message and the epoch of the owner that said it (its first: a turn
    /// that ran again on a next owner says it again). A turn's own answer (its
    /// `InputDone`) goes to the call that waits for it, not to the events a front sees.
    answers: HashMap<String, u64>,
    /// Events the recorder missed (it fell behind).
    missed: u64,
}

impl Witness {
    /// Which owner answered the turn `sent`, and what the owners that followed it resumed
    /// from.
    fn explain(&self, sent: &Sent) -> String {
        let answer = match sent {
            Sent::Run(text) => self.answers.get(&format!("You said: {text}")),
            Sent::Wait(what) => self.answers.get(&format!("Lookup says: waited for {what}")),
            Sent::Lookup(what) | Sent::Say(what) => self
                .answers
                .iter()
                .find(|(reply, _)| reply.contains(what.as_str()))
                .map(|(_, answer)| answer),
        };
        match answer {
            Some(&epoch) => format!(
                "its answer said by the owner at epoch {epoch}; the owners around it resumed from (epoch, last input) {} (recorder missed {} events)",
                self.resumes_around(epoch),
                self.missed
            ),
            None => format!(
                "its answer was not seen among the events (recorder missed {})",
                self.missed
            ),
        }
    }

    fn resumes_around(&self, epoch: u64) -> String {
        let at = self.resumes.partition_point(|&(e, _)| e < epoch);
        let from = at.saturating_sub(2);
        let to = (at + 4).min(self.resumes.len());
        format!("{:?}", &self.resumes[from..to])
    }
}

/// Records what `events` say of inputs into `witness`, until they end.
async fn witness_events(mut events: RemoteEvents, witness: Arc<Mutex<Witness>>) {
    loop {
        match events.recv().await {
            Ok(event) => {
                let mut witness = witness.lock().unwrap();
                match event.kind {
                    RemoteEventKind::SessionResumed { last_input } => {
                        witness.resumes.push((event.epoch, last_input));
                    }
                    RemoteEventKind::Session {
                        event:
                            SessionEvent::ConversationItemAdded {
                                item: ChatItem::Message(message),
                                ..
                            },
                    } if message.role == ChatRole::Assistant => {
                        witness
                            .answers
                            .entry(message.content.to_string())
                            .or_insert(event.epoch);
                    }
                    _ => {}
                }
            }
            Err(RemoteEventsError::Lagged { missed }) => witness.lock().unwrap().missed += missed,
            Err(_) => return,
        }
    }
}

/// The last events a front got of `session` (what a failed check shows).
async fn last_events(session: &RemoteSession) -> String {
    let mut events = session.subscribe_from(1);
    let mut kinds = Vec::new();
    while let Ok(Ok(event)) = tokio::time::timeout(Duration::from_millis(100), events.recv()).await
    {
        let kind = format!("{:?}", event.kind);
        let kind: String = kind.chars().take(160).collect();
        kinds.push(format!("{}@{}: {kind}", event.seq, event.epoch));
    }
    let from = kinds.len().saturating_sub(12);
    kinds[from..].join("\n    ")
}

/// Whether a lookup's answer is the tool's refusal to run beside the lookup still running
/// (its duplicate policy): no body runs for it.
fn refused_as_duplicate(reply: &[String]) -> bool {
    reply
        .iter()
        .any(|r| r.contains("is already running; not started again"))
}

/// Whether a wait's answer is the engine's refusal to start an `Abandon` body whose call
/// no stored snapshot could be made to hold (the promise is at most once: a body that
/// could run again after a crash does not run at all). Its owner's store refused the
/// write for the moment — a lease not trusted while a renewal is late, as under a freeze
/// or a loaded machine — and the model was told.
fn not_recorded(reply: &[String]) -> bool {
    reply
        .iter()
        .any(|r| r.contains("the call could not be recorded, so it was not made"))
}

/// Checks the tools' side effects against their policies.
fn check_effects(lines: &[String], records: &[(usize, Vec<Exchange>)], report: &mut Report) {
    let mut starts: HashMap<(String, String), u64> = HashMap::new();
    for line in lines {
        if let Some(why) = line.strip_prefix("one-output broken: ") {
            report
                .violations
                .push(format!("a model request broke the one-output rule: {why}"));
        }
        let mut words = line.split(' ');
        if let (Some("effect"), Some(tool), Some(what), Some("start")) =
            (words.next(), words.next(), words.next(), words.next())
        {
            *starts
                .entry((tool.to_owned(), what.to_owned()))
                .or_default() += 1;
        }
    }
    for ((tool, what), n) in &starts {
        *report.tool_starts.entry(tool.clone()).or_default() += n;
        if *n > 1 {
            *report.tool_restarts.entry(tool.clone()).or_default() += n - 1;
            if tool == "wait" {
                // An Abandon body starts only once a stored snapshot holds its call, so
                // the next owner abandons it instead of running it again
                // (`an_abandoned_call_s_body_never_runs_twice`).
                let rerun = format!("the Abandon tool `wait` ran {n} times for {what:?}");
                report.violations.push(rerun.clone());
                report.abandon_reruns.push(rerun);
            }
        }
    }
    // A turn that answered ran its tool.
    for (_, exchanges) in records {
        for exchange in exchanges {
            let (tool, what) = match &exchange.sent {
                Sent::Lookup(what) => ("lookup", what),
                Sent::Wait(what) => ("wait", what),
                _ => continue,
            };
            let ran = matches!(
                &exchange.got,
                Got::Reply(reply) if !reply.is_empty() && !refused_as_duplicate(reply) && !not_recorded(reply)
            );
            if ran && !starts.contains_key(&(tool.to_owned(), what.clone())) {
                report.violations.push(format!(
                    "{tool} for {what:?} answered but its body never ran"
                ));
            }
        }
    }
}
