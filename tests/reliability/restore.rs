//! The restore property's harness (issues 25 and 34, SPEC §14 "the property that defines
//! it", "Exactly once, without exceptions"): a conversation generated from the
//! model-based harness's ops runs on a session under paused time; where the generated ops
//! end it is snapshotted (`snapshot()` through JSON or the binary frame, or a chain of
//! `snapshot_update()` deltas taken after every op); then the uninterrupted session and a
//! session restored from the snapshot on a fresh engine (its own actix system, its own
//! paused clock) are fed the same further ops, and both drain and close.
//! [`run_restore_case`] checks that
//!
//! - the restored session makes the same further LLM requests as the uninterrupted one
//!   (agent, instructions, extra instructions, chat items, tool choice, deferred call ids,
//!   tool names), a step whose model had not answered asked again first (see
//!   [`run_restore_case`] for what it is compared with) — unless a call the snapshot held
//!   running is of a tool whose policy abandons it: from there the two differ by design;
//! - per call id, how many times its body ran against its tool's restore policy
//!   ([`check_body_runs`]): once at most in the uninterrupted session; after the restore
//!   once more for a call running at the snapshot whose policy runs it again, never for
//!   one it abandons or whose body awaited a sub-task, never for one that had finished;
//! - a snapshot of the restored session taken at once is the snapshot it was restored
//!   from, byte for byte but for what a restore changes on purpose (see
//!   [`same_snapshot`]);
//! - on the delta path, a full snapshot taken right after the last delta is the chain's;
//! - both sessions keep every invariant of the model-based test (the harness checks them
//!   after every op and at the end).
//!
//! **What makes the comparison exact.** The world is the model-based test's, in its
//! restorable flavour: the model answers as a function of the request (a redone step gets
//! the same answer, with the same call ids); agents a tool makes are named after its
//! call, those the host makes after a counter the restored copy goes on from; tools have
//! restore policies (see [`restore_policy`]): `Resume` bodies read their checkpoint and go
//! on where they were, `Restart` ones start over and repeat what they said, which the
//! engine does not deliver again (a gate their first run passed, the host had opened: it
//! is open), `kit_job`'s calls are abandoned; gates and leaked
//! contexts are picked by call id among runs alive and not cancelled, the runs a restored
//! copy has too; between ops each session runs until nothing moves (the two may take
//! different paths to the same place).
//!
//! **Where the snapshot is taken** ([`Point`]). Where the host can stand for what a
//! snapshot does not hold. `Quiet`: once the host quiesced — the user not speaking, barge-in
//! windows run out, every speech whose text ended reported played out. `AsItIs`: the
//! session as it is once its actors rest — the user maybe speaking over the agent, a
//! barge-in window open, speeches playing; the host then says of each speech still playing
//! what the snapshot writes of it (interrupted, heard unknown). Either way inside a step
//! whose calls started before any update (the step stays open), or mid-stream (a stream
//! that stalled before or after its first chunks, the snapshot taken as the stall began:
//! the step asked again streams the same chunks under the same speech id and stalls there,
//! with a playout report that came meanwhile). Not a point: a host turn or sub-task waiting
//! unstarted (the host would send it again), a session that moved while the snapshot was
//! taken, a step still generating at an `AsItIs` point with speeches playing, a stream
//! that stalled at an earlier instant (its timer is the uninterrupted session's), a
//! stopped run still in its grace period (the uninterrupted session waits for it). Then
//! the host drains and takes it again. `RESTORE_ANYWHERE=1` takes the snapshot at every
//! generated point, to explore what is left out.
//!
//! **Left out, because a restore changes them on purpose:** `Op::Advance` (a timer running
//! at the snapshot restarts with the restored session's clock); host `say` and
//! `generate_reply` (a snapshot holds no host turn that has not started, and the host
//! cannot tell those apart); `age_seconds` in `get_running_tasks` outputs (a restored
//! run's age starts again), which the comparison blanks.
//!
//! **Raced:** the host lets a tool body go on (a gate, a late update) or starts a
//! sub-task while a switch is under way, as it comes. A caller resuming from its sub-task
//! completes its paused step through the run that awaits the task in both sessions (a
//! restored one has a run standing for the call, which hears the result after the same
//! hops as the body did, and whose output reaches the step through its toolset as the
//! body's did), so a body's items land on the same side of the step.

use std::collections::{HashMap, HashSet};

use proptest::prelude::*;
use serde_json::Value;
use switchboard::snapshot::{SessionSnapshot, SnapshotUpdate};
use switchboard::LlmRequest;

use super::*;

/// How the snapshot reaches the restoring side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// `Session::snapshot`, written as JSON and read back.
    Json,
    /// `Session::snapshot`, written in the binary frame and read back.
    Bytes,
    /// `Session::snapshot_update` after the start and after every op, each delta (and the
    /// first, full, one) through its binary frame, applied in order.
    Deltas,
}

/// Where the snapshot is taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Point {
    /// Where the host has quiesced: the user not speaking, every speech reported played
    /// out, barge-in windows run out.
    Quiet,
    /// The session as it is once its actors rest: the user maybe speaking over the agent,
    /// a barge-in window open, speeches playing (the host then reports each as the
    /// snapshot writes it: interrupted, heard unknown). Falls back to `Quiet` when the
    /// session is not at a point there.
    AsItIs,
}

/// A case of the restore property.
#[derive(Clone, Debug)]
pub struct RestoreCase {
    pub config: Config,
    /// The conversation up to the snapshot.
    pub before: Vec<Op>,
    /// What both sessions are fed after it; then both drain and close.
    pub after: Vec<Op>,
    pub path: Path,
    /// Where the snapshot is taken.
    pub point: Point,
    /// Take the snapshot where `before` ends (after the host quiesced), even at a point
    /// the property leaves out — a step in flight past its model's answer, a paused
    /// step's call still running, a stopped run in its grace period, a session that moved
    /// during the snapshot: for regression tests of what a restore does there.
    pub anywhere: bool,
}

// ---------------------------------------------------------------------------------------
// Strategies: the model-based test's ops, less what a restore changes on purpose.
// ---------------------------------------------------------------------------------------

fn chunk() -> impl Strategy<Value = Chunk> {
    prop_oneof![
        3 => "[a-z ]{1,12}".prop_map(Chunk::Text),
        8 => (0..TOOLS.len(), behaviour(), id_pick(), any::<bool>())
            .prop_map(|(tool, behaviour, id, confirm)| Chunk::Call { tool, behaviour, id, confirm }),
        1 => any::<u8>().prop_map(Chunk::CancelTask),
        1 => Just(Chunk::GetRunning),
        1 => any::<u8>().prop_map(Chunk::Junk),
        1 => Just(Chunk::Error),
        1 => Just(Chunk::Panic),
    ]
}

/// A step of a plan; a stall before the first chunk (a model that has not answered yet)
/// or after some (mid-stream), which a snapshot taken at once can stand for: the step asked
/// again streams the same chunks and stalls there too.
fn step() -> impl Strategy<Value = Vec<Chunk>> {
    prop_oneof![
        12 => prop::collection::vec(chunk(), 1..4),
        1 => Just(vec![Chunk::Stall]),
        1 => prop::collection::vec(chunk(), 1..3).prop_map(|mut chunks| {
            chunks.push(Chunk::Stall);
            chunks
        }),
    ]
}

fn plan() -> impl Strategy<Value = Plan> {
    prop::collection::vec(step(), 1..3)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => plan().prop_map(Op::Run),
        2 => any::<bool>().prop_map(|force| Op::Interrupt { force }),
        2 => Just(Op::UserStarts),
        2 => Just(Op::UserStops),
        1 => Just(Op::Interim),
        2 => plan().prop_map(Op::Final),
        1 => role().prop_map(Op::HandoffApi),
        1 => (role(), any::<bool>())
            .prop_map(|(role, interrupting)| Op::HandoffMessage { role, interrupting }),
        1 => Just(Op::HostTask),
        5 => any::<u8>().prop_map(Op::OpenGate),
        4 => (any::<u8>(), prop_oneof![Just(None), Just(Some("")), Just(Some("Ok"))])
            .prop_map(|(pick, heard)| Op::Playout { pick, heard }),
        1 => any::<u8>().prop_map(Op::LateUpdate),
        1 => Just(Op::Abandon),
        1 => Just(Op::ReadChat),
        1 => Just(Op::Drain),
    ]
}

/// A case of up to `max_before` ops before the snapshot and `max_after` after it.
pub fn restore_case(max_before: usize, max_after: usize) -> impl Strategy<Value = RestoreCase> {
    (
        config(),
        prop::collection::vec(op(), 1..max_before),
        prop::collection::vec(op(), 0..max_after),
        prop_oneof![Just(Path::Json), Just(Path::Bytes), Just(Path::Deltas)],
        prop_oneof![2 => Just(Point::Quiet), 1 => Just(Point::AsItIs)],
    )
        .prop_map(|(config, before, after, path, point)| RestoreCase {
            config,
            before,
            after,
            path,
            point,
            // `RESTORE_ANYWHERE=1` explores what the property leaves out (see `anywhere`).
            anywhere: std::env::var_os("RESTORE_ANYWHERE").is_some(),
        })
}

// ---------------------------------------------------------------------------------------
// Running a case.
// ---------------------------------------------------------------------------------------

/// What a case did, for the verbose log and the tests' counts.
#[derive(Clone, Debug, Default)]
pub struct RestoreReport {
    /// How often the host drained (and then finished the sub-tasks) before the snapshot,
    /// the generated point not being one.
    pub retakes: u32,
    /// No point could be found (the reason): nothing was compared.
    pub no_point: Option<String>,
    /// The snapshot had a step in flight, asked again after the restore.
    pub redo: bool,
    /// Calls running in the background at the snapshot.
    pub running: usize,
    /// Live activations at the snapshot (more than one: a sub-task).
    pub live: usize,
    /// LLM requests of the restored session.
    pub requests: usize,
    /// Why snapshot → restore → snapshot was not checked, if it was not.
    pub identity_not_checked: Option<&'static str>,
    /// The snapshot held a running call its policy abandons: requests were not compared.
    pub abandoned: bool,
    /// Open steps at the snapshot: steps whose calls had started, none of which is asked
    /// again.
    pub open_steps: usize,
    /// Whether the snapshot was taken as the session was (see [`Point::AsItIs`]).
    pub as_it_is: bool,
    /// Whether the user was speaking at the snapshot.
    pub user_speaking: bool,
    /// Whether a step asked again had begun to speak (a stream stalled mid-way).
    pub mid_stream: bool,
}

/// The uninterrupted session's side of a case.
struct Original {
    snapshot: SessionSnapshot,
    carry: HarnessCarry,
    /// Requests made before the snapshot was asked for and after it answered.
    before: (usize, usize),
    retakes: u32,
    requests: Vec<LlmRequest>,
    /// The current agent's chat context right after the snapshot.
    chat: ChatContext,
    /// How many times each call's body ran, by the end.
    runs: HashMap<String, u32>,
    /// Whether the snapshot was taken as the session was.
    as_it_is: bool,
}

fn trace(what: impl fmt::Display) {
    if std::env::var_os("RELIABILITY_TRACE").is_some() {
        eprintln!("{what}");
    }
}

/// Runs one case: the uninterrupted session in one actix system, the restored one in
/// another; the first difference or broken invariant, as a sentence.
///
/// The restored session's requests are compared with the uninterrupted session's from
/// the snapshot on; when a step was in flight at the snapshot, with that step's request
/// first, its chat context as it is at the snapshot (items that landed while the step was
/// in flight — a background call's update or end — are in the request asked again, before
/// the step's answer, where the uninterrupted session's chat has them too; a message a
/// playout report cut meanwhile is cut).
pub fn run_restore_case(case: &RestoreCase) -> Result<RestoreReport, String> {
    watch_panics();
    UNEXPECTED_PANICS.with(|n| n.set(0));
    let original = match actix::System::new()
        .block_on(original(case))
        .map_err(|e| format!("the uninterrupted session: {e}"))?
    {
        Ok(original) => original,
        Err(why) => {
            return Ok(RestoreReport {
                no_point: Some(why),
                ..RestoreReport::default()
            })
        }
    };
    let snapshot_json: Value = serde_json::from_slice(&original.snapshot.to_json())
        .map_err(|e| format!("the snapshot's JSON does not read back: {e}"))?;
    let stack = &snapshot_json["head"]["state"]["stack"];
    let redo = has_redo(&original.snapshot);
    let report = RestoreReport {
        retakes: original.retakes,
        no_point: None,
        redo,
        running: runs_of(&snapshot_json).len(),
        live: stack.as_array().map_or(0, Vec::len),
        requests: 0,
        identity_not_checked: None,
        abandoned: false,
        open_steps: stack.as_array().map_or(0, |s| {
            s.iter()
                .filter(|l| !l["activation"]["step"].is_null())
                .count()
        }),
        as_it_is: original.as_it_is,
        user_speaking: snapshot_json["head"]["state"]["schedule"]["user_speaking"] == json!(true),
        mid_stream: stack.as_array().is_some_and(|s| {
            s.iter()
                .any(|l| !l["activation"]["redo"]["speech"].is_null())
        }),
    };
    trace(format_args!(
        "snapshot: {}",
        String::from_utf8_lossy(&original.snapshot.to_json())
    ));
    let Restored {
        requests: restored,
        identity,
        runs,
    } = actix::System::new()
        .block_on(restored(case, &original))
        .map_err(|e| format!("the restored session: {e}"))?;
    check_body_runs(
        &snapshot_json,
        &original.carry.world.runs,
        &original.runs,
        &runs,
    )?;
    if holds_abandoned_call(&snapshot_json) {
        // The restored session ended a call the uninterrupted one let run: from there the
        // two differ by design. What is checked is that its body never ran again.
        return Ok(RestoreReport {
            requests: restored.len(),
            abandoned: true,
            identity_not_checked: match identity {
                IdentityCheck::NotChecked(why) => Some(why),
                _ => None,
            },
            ..report
        });
    }
    // The step in flight at the snapshot is the uninterrupted session's last request
    // before it; the restored session asks it again, first.
    let (asked, answered) = original.before;
    let mut last_difference = String::new();
    for n in asked..=answered {
        let Some(from) = n.checked_sub(usize::from(redo)) else {
            continue;
        };
        let mut expected = original.requests[from.min(original.requests.len())..].to_vec();
        if redo {
            // The step asked again is asked with the chat context as it is at the
            // snapshot: items that landed while the step was in flight (a background
            // call's update or end) are in it, before the step's answer — where the
            // uninterrupted session's chat has them too — and a playout report that cut
            // a message meanwhile has cut it.
            if let Some(first) = expected.first_mut() {
                first.chat = original.chat.clone();
            }
        }
        match same_requests(&expected, &restored) {
            Ok(()) => {
                return Ok(RestoreReport {
                    requests: restored.len(),
                    identity_not_checked: match identity {
                        IdentityCheck::NotChecked(why) => Some(why),
                        _ => None,
                    },
                    ..report
                })
            }
            Err(difference) => last_difference = difference,
        }
    }
    Err(format!(
        "the restored session's LLM requests differ from the uninterrupted session's \
         after the snapshot (redo: {redo}, {} requests before it): {last_difference}",
        original.before.0
    ))
}

/// The uninterrupted session, or (`Ok(Err(why))`) why no snapshot point was found.
async fn original(case: &RestoreCase) -> Result<Result<Original, String>, String> {
    tokio::time::pause();
    let mut a = Harness::start_with(&case.config, true).await?;
    let mut chain: Option<SessionSnapshot> = None;
    if case.path == Path::Deltas {
        step_chain(&a, &mut chain).await?;
    }
    for (index, op) in case.before.iter().enumerate() {
        a.apply(op)
            .await
            .map_err(|e| format!("op {index} ({op:?}): {e}"))?;
        a.settle_fully().await;
        a.observe()
            .map_err(|e| format!("after op {index} ({op:?}): {e}"))?;
        if case.path == Path::Deltas {
            step_chain(&a, &mut chain)
                .await
                .map_err(|e| format!("after op {index} ({op:?}): {e}"))?;
        }
    }
    let mut retakes = 0;
    let mut as_it_is = case.point == Point::AsItIs;
    let (snapshot, asked, answered) = loop {
        let quiet = if as_it_is {
            a.rest().await?
        } else {
            a.quiesce().await?
        };
        if case.anywhere {
            let asked = a.llm.request_count();
            let (snapshot, _) = take_snapshot(&a, case.path, &mut chain).await?;
            break (snapshot, asked, a.llm.request_count());
        }
        let why = if quiet {
            let asked = a.llm.request_count();
            let (speeches, events) = (a.out.count(), a.events_seen);
            let (snapshot, full) = take_snapshot(&a, case.path, &mut chain).await?;
            let answered = a.llm.request_count();
            a.observe()?;
            let why =
                not_a_point(&a, &snapshot, (speeches, events, asked, answered)).or_else(|| {
                    // A speech of a step still generating is not in the snapshot: the
                    // host cannot stand for it as the snapshot writes it.
                    (as_it_is && has_redo(&snapshot))
                        .then(|| "a step generating, with speeches playing".to_owned())
                });
            match why {
                Some(why) => why,
                None => {
                    if let Some(full) = full {
                        // Nothing moved: the full snapshot taken right after the chain's
                        // last delta is the chain's, but for its place in the chain.
                        if let Some(difference) = snapshot_difference(&full, &snapshot, &["seq"]) {
                            return Err(format!(
                                "the snapshot built from deltas differs from a full one: \
                                 {difference}"
                            ));
                        }
                    }
                    break (snapshot, asked, answered);
                }
            }
        } else {
            "the host could not quiesce (an input waits unstarted)".to_owned()
        };
        trace(format_args!("not a snapshot point: {why}"));
        if std::mem::take(&mut as_it_is) {
            // Not as it is: as the host quiesces it, then.
            continue;
        }
        // Not a point a snapshot can stand for: the host drains; then it also tells each
        // sub-task to finish; then the case has no point.
        retakes += 1;
        match retakes {
            1 => a.drain_restorable().await?,
            2 => finish_sub_tasks(&mut a).await?,
            _ => {
                // The session still ends as every case does, its invariants checked.
                a.end(&End::DrainThenClose).await?;
                return Ok(Err(why));
            }
        }
    };
    trace(format_args!(
        "snapshot taken after {asked}..{answered} requests"
    ));
    // What the snapshot holds happened before it answered: the tracker follows it. The
    // restored copy starts from here (its world's counts: what ran before the snapshot).
    a.observe()?;
    let carry = a.carry();
    if as_it_is {
        // What the snapshot writes of the speeches still playing, the host says of them:
        // interrupted, heard unknown (a restored session has none of them).
        a.stand_for_playing_speeches().await?;
    }
    let chat = bounded("chat_context()", a.session().chat_context())
        .await?
        .map_err(|e| format!("chat_context() after the snapshot failed: {e}"))?;
    a.detach_outstanding();
    run_after(&mut a, &case.after).await?;
    Ok(Ok(Original {
        snapshot,
        carry,
        before: (asked, answered),
        retakes,
        requests: a.llm.requests(),
        chat,
        runs: a.body_runs(),
        as_it_is,
    }))
}

/// Every call the snapshot's toolsets hold (the session's and each live activation's).
pub fn runs_of(json: &Value) -> Vec<Value> {
    let state = &json["head"]["state"];
    let session = state["toolsets"].as_array().cloned().unwrap_or_default();
    let live = state["stack"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|l| l["toolsets"].as_array().cloned().unwrap_or_default());
    session
        .into_iter()
        .chain(live)
        .flat_map(|t| t["runs"].as_array().cloned().unwrap_or_default())
        .collect()
}

/// Whether tool runs are alive that the snapshot does not hold: runs stopped but still
/// in their grace period. It holds every run whose body may still run.
fn lingering_runs(a: &Harness, snapshot: &SessionSnapshot) -> bool {
    let json: Value = serde_json::from_slice(&snapshot.to_json()).unwrap_or_default();
    let held = runs_of(&json).len();
    let alive = a
        .inspector
        .live_actors()
        .iter()
        .filter(|id| id.as_str().starts_with("tool/"))
        .count();
    alive > held
}

/// Why the snapshot just taken is not a point the property can stand for, if it is not.
/// `before`: the speeches, events and requests before it was taken, and the requests
/// after.
fn not_a_point(
    a: &Harness,
    snapshot: &SessionSnapshot,
    before: (usize, usize, usize, usize),
) -> Option<String> {
    let (speeches, events, asked, answered) = before;
    if a.out.count() != speeches || answered != asked || a.events_seen != events {
        // Work queued before it started: what the snapshot holds may be a speech still
        // playing.
        return Some("the session moved during the snapshot".into());
    }
    // A step in flight is asked again after a restore. Only one whose model has not
    // answered yet (a stall before the first chunk, made at this very instant: no timer
    // of it has run) is a point the property can stand for: the calls of a step past its
    // answer already run, and what they did (a cancel, a duplicate replaced, a reply
    // queued, a body in the background) is in the snapshot while the step is asked again
    // (see `RestoreCase::anywhere`).
    let stalled_now = a.llm.last_stalled() == Some(tokio::time::Instant::now());
    if has_redo(snapshot) && !stalled_now {
        return Some("a step was in flight past its answer".into());
    }
    if lingering_runs(a, snapshot) {
        // The uninterrupted session waits for it where the restored one (which holds
        // no stopped run) does not.
        return Some("a stopped run was still in its grace period".into());
    }
    None
}

/// The host tells each sub-task to finish (the user says what it asked for; the model
/// completes it), draining after each.
async fn finish_sub_tasks(a: &mut Harness) -> Result<(), String> {
    a.drain_restorable().await?;
    for _ in 0..8 {
        if !a.tracker.in_task() {
            break;
        }
        let text = a.text("finish");
        let finish = Chunk::Call {
            tool: TOOLS.len() - 1,
            behaviour: Behaviour::Return,
            id: IdPick::Fresh,
            confirm: false,
        };
        a.llm.plan(&text, vec![vec![finish]]);
        let session = a.session().clone();
        let input = Input::Turn(text.clone());
        a.spawn_input(format!("run({text})"), input, async move {
            format!("{:?}", session.run(text).await.map(|_| ()))
        });
        a.drain_restorable().await?;
    }
    Ok(())
}

/// Whether the snapshot's current activation has a step in flight (asked again on restore).
pub fn has_redo(snapshot: &SessionSnapshot) -> bool {
    let json: Value = serde_json::from_slice(&snapshot.to_json()).unwrap_or_default();
    json["head"]["state"]["stack"]
        .as_array()
        .and_then(|s| s.last())
        .is_some_and(|current| !current["activation"]["redo"].is_null())
}

/// Takes the snapshot the way the case says, read back from its encoding; on the
/// `Deltas` path, also a full snapshot right after the chain's last delta.
async fn take_snapshot(
    a: &Harness,
    path: Path,
    chain: &mut Option<SessionSnapshot>,
) -> Result<(SessionSnapshot, Option<SessionSnapshot>), String> {
    let full = || async {
        bounded("snapshot()", a.session().snapshot())
            .await?
            .map_err(|e| format!("snapshot() failed: {e}"))
    };
    Ok(match path {
        Path::Json => {
            let taken = SessionSnapshot::from_json(&full().await?.to_json())
                .map_err(|e| format!("the snapshot's JSON does not read back: {e}"))?;
            (taken, None)
        }
        Path::Bytes => {
            let taken = SessionSnapshot::from_bytes(&full().await?.to_bytes())
                .map_err(|e| format!("the snapshot's bytes do not read back: {e}"))?;
            (taken, None)
        }
        Path::Deltas => {
            step_chain(a, chain).await?;
            let chained = chain.clone().ok_or("no snapshot chain")?;
            let taken = full().await?;
            // A full snapshot starts the chain again: later deltas follow it.
            *chain = Some(taken.clone());
            (chained, Some(taken))
        }
    })
}

/// Takes the next link of the session's snapshot chain, through its binary frame, and
/// applies it.
async fn step_chain(a: &Harness, chain: &mut Option<SessionSnapshot>) -> Result<(), String> {
    let update = bounded("snapshot_update()", a.session().snapshot_update())
        .await?
        .map_err(|e| format!("snapshot_update() failed: {e}"))?;
    match update {
        SnapshotUpdate::Full(full) => {
            let full = SessionSnapshot::from_bytes(&full.to_bytes())
                .map_err(|e| format!("a full snapshot's bytes do not read back: {e}"))?;
            *chain = Some(full);
        }
        SnapshotUpdate::Delta(delta) => {
            let delta = switchboard::snapshot::SnapshotDelta::from_bytes(&delta.to_bytes())
                .map_err(|e| format!("a delta's bytes do not read back: {e}"))?;
            chain
                .as_mut()
                .ok_or("a delta came before any full snapshot")?
                .apply(&delta)
                .map_err(|e| format!("a delta does not apply: {e}"))?;
        }
        other => return fail(format!("an unknown snapshot update: {other:?}")),
    }
    Ok(())
}

/// The ops after the snapshot, then the end: the same for both sessions.
async fn run_after(h: &mut Harness, after: &[Op]) -> Result<(), String> {
    for (index, op) in after.iter().enumerate() {
        trace(format_args!("op {index} after the snapshot: {op:?}"));
        h.apply(op)
            .await
            .map_err(|e| format!("op {index} after the snapshot ({op:?}): {e}"))?;
        h.settle_fully().await;
        h.observe()
            .map_err(|e| format!("after op {index} after the snapshot ({op:?}): {e}"))?;
    }
    trace("the end: drain, then close");
    h.end(&End::DrainThenClose)
        .await
        .map_err(|e| format!("at the end: {e}"))
}

/// What the restored session did: its requests, the identity check, and how many times
/// each call's body ran (with the counts carried from the snapshot's world).
struct Restored {
    requests: Vec<LlmRequest>,
    identity: IdentityCheck,
    runs: HashMap<String, u32>,
}

async fn restored(case: &RestoreCase, original: &Original) -> Result<Restored, String> {
    tokio::time::pause();
    let mut b = Harness::restore(&case.config, &original.carry, original.snapshot.clone()).await?;
    if b.session().epoch() != original.snapshot.epoch() + 1 {
        return Err(format!(
            "the restored session's epoch is {}, its snapshot's {}",
            b.session().epoch(),
            original.snapshot.epoch()
        ));
    }
    let again = bounded("snapshot() of the restored session", b.session().snapshot())
        .await?
        .map_err(|e| format!("snapshot() of the restored session failed: {e}"))?;
    trace(format_args!(
        "snapshot of the restored session: {}",
        String::from_utf8_lossy(&again.to_json())
    ));
    let identity = same_snapshot(&original.snapshot, &again);
    if let IdentityCheck::Differs(difference) = &identity {
        return Err(format!(
            "snapshot → restore → snapshot is not the identity: {difference}"
        ));
    }
    b.llm.hold(false);
    // What the restore started runs as far as it goes before the host does anything, as
    // it had in the uninterrupted session before the snapshot.
    b.settle_fully().await;
    b.observe()?;
    run_after(&mut b, &case.after).await?;
    Ok(Restored {
        requests: b.llm.requests(),
        identity,
        runs: b.body_runs(),
    })
}

/// Checks per call how many times its body ran against its tool's restore policy: in the
/// uninterrupted session once at most; after the restore, a call running at the snapshot
/// once more if its policy runs it again (`Restart`, `Resume`) and never if it is
/// `Abandon` or its body awaited a sub-task (a run stands for it); a call that had
/// finished, never again; a call made after the snapshot, once at most.
pub fn check_body_runs(
    snapshot: &Value,
    carried: &HashMap<String, u32>,
    uninterrupted: &HashMap<String, u32>,
    restored: &HashMap<String, u32>,
) -> Result<(), String> {
    if let Some((call, n)) = uninterrupted.iter().find(|(_, n)| **n > 1) {
        return Err(format!(
            "the uninterrupted session ran the body of {call} {n} times"
        ));
    }
    let askers = askers(snapshot);
    let running: HashMap<String, u32> = runs_of(snapshot)
        .iter()
        .map(|run| {
            let call = run["call"]["call_id"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let stands_in = run["key"].as_u64().is_some_and(|k| askers.contains(&k));
            let policy = restore_policy(run["call"]["name"].as_str().unwrap_or_default());
            let again = u32::from(!stands_in && policy != RestorePolicy::Abandon);
            (call, again)
        })
        .collect();
    for (call, n) in restored {
        let before = carried.get(call).copied().unwrap_or(0);
        let extra = n.saturating_sub(before);
        let (allowed, why) = match (running.get(call), before) {
            (Some(again), _) => (*again, "running at the snapshot"),
            (None, 0) => (1, "made after the snapshot"),
            (None, _) => (0, "finished before the snapshot"),
        };
        let exact = running.contains_key(call);
        if extra > allowed || (exact && extra != allowed) {
            return Err(format!(
                "after the restore the body of {call} ({why}) ran {extra} more times, \
                 where its policy says {allowed}"
            ));
        }
    }
    for (call, again) in &running {
        if *again == 1
            && restored.get(call).copied().unwrap_or(0) == carried.get(call).copied().unwrap_or(0)
        {
            return Err(format!(
                "{call} was running at the snapshot and its policy runs it again, but its \
                 body did not run after the restore"
            ));
        }
    }
    Ok(())
}

/// The keys of the runs that await a paused caller's sub-task (a run stands for each
/// after a restore: its body does not run again).
fn askers(snapshot: &Value) -> HashSet<u64> {
    snapshot["head"]["state"]["schedule"]["frames"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f["asker"].as_u64())
        .collect()
}

/// Whether the snapshot holds a running call its tool's policy abandons (not one whose
/// body awaited a sub-task: a run stands for that one).
fn holds_abandoned_call(snapshot: &Value) -> bool {
    let askers = askers(snapshot);
    runs_of(snapshot).iter().any(|run| {
        restore_policy(run["call"]["name"].as_str().unwrap_or_default()) == RestorePolicy::Abandon
            && !run["key"].as_u64().is_some_and(|k| askers.contains(&k))
    })
}

// ---------------------------------------------------------------------------------------
// Equality.
// ---------------------------------------------------------------------------------------

/// Whether a snapshot of the restored session, taken at once (its model held before the
/// first chunk, so no step it starts can move), is the snapshot it was restored from; the
/// first difference if not. Where the restore started nothing, the check is byte for
/// byte, in both encodings, the epoch and `seq` put back. What a restore changes on
/// purpose is left out or accounted for:
///
/// - `head.epoch`: one more at every restore (fencing);
/// - `seq`: the restored session's chain goes on from the snapshot's, and a full snapshot
///   moves it on by one;
/// - work queued for the current agent starts at once: a queued reply (or the deferred
///   reply to pending items) shows as the current agent's step in flight, asking what the
///   reply asks, under the next step id.
///
/// Nothing else: a restored run keeps its key, a step asked again or still open its id,
/// and a running call its updates, what it said and its checkpoint.
///
/// A queued handoff or task end starts a switch at once, which the second snapshot waits
/// for: those cases are not checked (`Err` with the reason in `Ok`'s place: see
/// [`IdentityCheck`]).
pub fn same_snapshot(before: &SessionSnapshot, after: &SessionSnapshot) -> IdentityCheck {
    let read =
        |s: &SessionSnapshot| serde_json::from_slice::<Value>(&s.to_json()).unwrap_or_default();
    let (original, restored) = (before, after);
    let (before, mut after) = (read(before), read(after));
    if holds_abandoned_call(&before) {
        return IdentityCheck::NotChecked("a call its policy abandons ends at once");
    }
    if runs_of(&before).iter().any(|run| !run["repeat"].is_null()) {
        // Its body was waiting for the answer to an update that had landed; run again, it
        // goes on at once (says it again, not delivered twice, and what follows).
        return IdentityCheck::NotChecked("a body run again goes on past an update at once");
    }
    let mut expected = match started_at_once(&before) {
        Ok(expected) => expected,
        Err(why) => return IdentityCheck::NotChecked(why),
    };
    for v in [&mut expected, &mut after] {
        if let Some(map) = v.as_object_mut() {
            map.remove("seq");
        }
        if let Some(map) = v["head"].as_object_mut() {
            map.remove("epoch");
        }
    }
    if let Some(difference) = json_difference("", &expected, &after) {
        return IdentityCheck::Differs(difference);
    }
    if expected == {
        let mut unchanged = before.clone();
        if let Some(map) = unchanged.as_object_mut() {
            map.remove("seq");
        }
        if let Some(map) = unchanged["head"].as_object_mut() {
            map.remove("epoch");
        }
        unchanged
    } {
        // Nothing started at once: the two encodings are the same bytes, the restored
        // snapshot's epoch and seq put back to the original's.
        let mut back = read(restored);
        back["seq"] = json!(original.seq());
        back["head"]["epoch"] = json!(original.epoch());
        let Ok(back) = SessionSnapshot::from_json(&serde_json::to_vec(&back).unwrap_or_default())
        else {
            return IdentityCheck::Differs("the restored snapshot does not read back".into());
        };
        if back.to_bytes() != original.to_bytes() || back.to_json() != original.to_json() {
            return IdentityCheck::Differs("the same values, but not the same bytes".into());
        }
    }
    IdentityCheck::Same
}

/// The outcome of the snapshot → restore → snapshot check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IdentityCheck {
    /// The same snapshot, but for what a restore changes on purpose.
    Same,
    /// Not checked, for this reason.
    NotChecked(&'static str),
    /// The first difference.
    Differs(String),
}

/// A snapshot's JSON as a restored session's snapshot taken at once shows it (see
/// [`same_snapshot`]).
fn started_at_once(before: &Value) -> Result<Value, &'static str> {
    let mut v = before.clone();
    // The current activation's chat length: what a turn started at once is asked from.
    let current_order = v["head"]["state"]["stack"]
        .as_array()
        .and_then(|s| s.last())
        .map(|l| l["order"].clone())
        .ok_or("no current activation")?;
    let current_len = chat_of(&mut v.clone(), &current_order)?.0.len();
    let state = &mut v["head"]["state"];
    // The next step id, should the restore start a turn at once (a step asked again keeps
    // its own).
    let next_step = state["counters"]["step"].as_u64().unwrap_or(0) + 1;
    let mut started = false;
    let jobs = state["schedule"]["jobs"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let user_speaking = state["schedule"]["user_speaking"] == json!(true);
    let Some(current) = state["stack"].as_array_mut().and_then(|s| s.last_mut()) else {
        return Err("no current activation");
    };
    let current = &mut current["activation"];
    if !current["redo"].is_null() || !current["step"].is_null() {
        // A step under way goes on (asked again under its id, or open): nothing else
        // starts before it.
    } else if let Some(job) = jobs.first() {
        match job["job"].as_str() {
            Some("reply") => {
                let mut ask = json!({"tool_choice": "auto"});
                if !job["instructions"].is_null() {
                    ask["extra_instructions"] = job["instructions"].clone();
                }
                current["redo"] = json!({"step": next_step, "view": current_len, "ask": ask});
                started = true;
                let rest: Vec<Value> = jobs[1..].to_vec();
                let schedule = state["schedule"]
                    .as_object_mut()
                    .ok_or("a schedule that is not an object")?;
                if rest.is_empty() {
                    schedule.remove("jobs");
                } else {
                    schedule.insert("jobs".into(), Value::Array(rest));
                }
            }
            _ => return Err("a queued switch starts at once"),
        }
    } else if user_speaking {
        // The deferred reply waits until the user stops speaking.
    } else {
        let pending = current["pending"].as_array().cloned().unwrap_or_default();
        let last_reply_view = current["last_reply_view"].as_u64().unwrap_or(0) as usize;
        if let Some(map) = current.as_object_mut() {
            map.remove("pending");
        }
        if let Some(map) = state["schedule"].as_object_mut() {
            map.remove("reply_wanted");
        }
        let order = state["stack"]
            .as_array()
            .and_then(|s| s.last())
            .map(|l| l["order"].clone())
            .ok_or("no current activation")?;
        if !pending.is_empty() {
            // The deferred reply: the items the agent lacks are appended first; the model
            // is asked unless the agent already spoke with the newest item in view.
            let (mut chat, record) = chat_of(&mut v, &order)?;
            let mut newest = 0;
            let mut ids = Vec::new();
            for p in &pending {
                let call_id = &p["call_id"];
                let at = chat.iter().position(|item| {
                    item["type"] == "function_call" && item["call_id"] == *call_id
                });
                let at = match at {
                    Some(at) => at,
                    None => {
                        let items = p["items"].as_array().cloned().unwrap_or_default();
                        chat.extend(items.iter().cloned());
                        if let Some(record) = record.as_array_mut() {
                            record.extend(items);
                        }
                        chat.len() - 1
                    }
                };
                newest = newest.max(at);
                ids.push(call_id.clone());
            }
            if last_reply_view <= newest {
                let names: Vec<&str> = ids.iter().filter_map(Value::as_str).collect();
                let current = v["head"]["state"]["stack"]
                    .as_array_mut()
                    .and_then(|s| s.last_mut())
                    .ok_or("no current activation")?;
                current["activation"]["redo"] = json!({
                    "step": next_step,
                    "view": chat.len(),
                    "ask": {
                        "tool_choice": "none",
                        "extra_instructions": format!(
                            "New results from running tools arrived:\n{}\nTell the user what changed, briefly.",
                            names.join("\n")
                        ),
                        "deferred_call_ids": ids,
                    },
                });
                started = true;
            }
        }
    }
    if started {
        v["head"]["state"]["counters"]["step"] = json!(next_step);
    }
    Ok(v)
}

/// The whole chat context of the activation with this order in a snapshot's JSON (its
/// inherited items read from the activation they were written with), and its record's
/// own items, to append to.
fn chat_of<'v>(
    v: &'v mut Value,
    order: &Value,
) -> Result<(Vec<Value>, &'v mut Value), &'static str> {
    let records = v["activations"].as_array().cloned().unwrap_or_default();
    let record = records
        .iter()
        .find(|r| r["order"] == *order)
        .ok_or("no record of the current activation")?;
    let mut chat = Vec::new();
    if let Some(from) = record.get("inherited_from") {
        let (source, _) = chat_of(v, from)?;
        let inherited = record["inherited"].as_u64().unwrap_or(0) as usize;
        chat.extend(source.into_iter().take(inherited));
    }
    chat.extend(record["items"].as_array().cloned().unwrap_or_default());
    let items = v["activations"]
        .as_array_mut()
        .and_then(|records| records.iter_mut().find(|r| r["order"] == *order))
        .map(|r| &mut r["items"])
        .ok_or("no record of the current activation")?;
    Ok((chat, items))
}

/// The first difference between two snapshots' JSON, the paths in `ignore` left out.
fn snapshot_difference(
    a: &SessionSnapshot,
    b: &SessionSnapshot,
    ignore: &[&str],
) -> Option<String> {
    let read =
        |s: &SessionSnapshot| serde_json::from_slice::<Value>(&s.to_json()).unwrap_or_default();
    let (mut a, mut b) = (read(a), read(b));
    for path in ignore {
        for v in [&mut a, &mut b] {
            let mut at = &mut *v;
            let parts: Vec<&str> = path.split('.').collect();
            for part in &parts[..parts.len() - 1] {
                at = &mut at[*part];
            }
            if let Some(map) = at.as_object_mut() {
                map.remove(parts[parts.len() - 1]);
            }
        }
    }
    json_difference("", &a, &b)
}

/// The first place two JSON values differ, with both sides.
pub fn json_difference(path: &str, a: &Value, b: &Value) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            keys.into_iter().find_map(|k| {
                json_difference(
                    &format!("{path}.{k}"),
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                )
            })
        }
        (Value::Array(x), Value::Array(y)) => {
            let common = x
                .iter()
                .zip(y)
                .enumerate()
                .find_map(|(i, (p, q))| json_difference(&format!("{path}[{i}]"), p, q));
            common.or_else(|| {
                (x.len() != y.len()).then(|| {
                    let longer = if x.len() > y.len() { x } else { y };
                    format!(
                        "{path}: {} items against {}; the first extra one: {}",
                        x.len(),
                        y.len(),
                        longer[x.len().min(y.len())]
                    )
                })
            })
        }
        _ if a == b => None,
        _ => Some(format!("{path}: {a} against {b}")),
    }
}

/// A request as the property compares it: tools by name; `get_running_tasks` outputs
/// without their runs' ages (a restored run's age starts again).
fn comparable(request: &LlmRequest) -> Value {
    let items: Vec<Value> = request
        .chat
        .items()
        .iter()
        .map(|item| {
            let mut item = serde_json::to_value(item).unwrap_or_default();
            if item["name"] == "get_running_tasks" {
                if let Some(output) = item["output"].as_str() {
                    item["output"] = Value::String(blank_ages(output));
                }
            }
            item
        })
        .collect();
    json!({
        "agent": &*request.agent,
        "instructions": &*request.instructions,
        "extra_instructions": request.extra_instructions,
        "chat": items,
        "tool_choice": request.tool_choice,
        "deferred_call_ids": request.deferred_call_ids,
        "tools": request.tools.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
    })
}

/// `"age_seconds":12.5` → `"age_seconds":_`.
fn blank_ages(output: &str) -> String {
    let key = "\"age_seconds\":";
    let mut out = String::with_capacity(output.len());
    let mut rest = output;
    while let Some(at) = rest.find(key) {
        out.push_str(&rest[..at + key.len()]);
        out.push('_');
        rest = &rest[at + key.len()..];
        let end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == 'e' || c == '-' || c == ' '))
            .unwrap_or(rest.len());
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// Whether the restored session's requests are the expected ones; the first difference.
fn same_requests(expected: &[LlmRequest], restored: &[LlmRequest]) -> Result<(), String> {
    for (index, (e, r)) in expected.iter().zip(restored).enumerate() {
        let (e, r) = (comparable(e), comparable(r));
        if let Some(difference) = json_difference("", &e, &r) {
            return Err(format!(
                "request {index} (uninterrupted against restored): {difference}\n  \
                 uninterrupted: {e}\n  restored:      {r}"
            ));
        }
    }
    if expected.len() != restored.len() {
        let longer = if expected.len() > restored.len() {
            ("uninterrupted", &expected[restored.len()])
        } else {
            ("restored", &restored[expected.len()])
        };
        return Err(format!(
            "{} requests against {}; the first the {} session made alone: {}",
            expected.len(),
            restored.len(),
            longer.0,
            comparable(longer.1)
        ));
    }
    Ok(())
}
