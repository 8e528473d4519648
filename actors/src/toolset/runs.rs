//! The calls a toolset runs, as it writes them into a session snapshot and reads them
//! back: the toolset's own state.
//!
//! A call is here from the moment its body may start — its run is spawned — until the run
//! stops or its body returns, so every restore policy applies to it, whether its step
//! still waits for its output or it runs in the background.
//!
//! Three things share one run: the run actor (its immediate output, its updates), its
//! body's context (its checkpoint, the answer to each update) and the toolset. They share a
//! [`Progress`]; the toolset keeps every progress of its runs in its [`RunBook`], which the
//! toolset's parent (the activity, or the session for a session toolset) reads when the
//! session is snapshotted — in the same handler as its own state, without a message. Only
//! the toolset adds and removes entries; only the run and its body write one.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::chat::FunctionCall;

/// One call of a toolset as a snapshot writes it.
///
/// Whether it runs in the background or its step still waits for its output is not
/// written here: its activation's open step says it (a call of it without an output),
/// and the session makes both agree when it assembles a snapshot (an output on its way
/// counts as not given).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct RunState {
    /// Its run's key: the run a restore makes gets the same (a toolset lists its runs by
    /// key, in the order they started).
    pub(crate) key: u64,
    /// The step that made the call: calls of one step are not duplicates of each other,
    /// and an interruption of the step reaches its calls.
    pub(crate) step: u64,
    pub(crate) call: FunctionCall,
    /// The later updates it delivered (`/update_1` …): a body run again numbers its next
    /// one after them.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) updates: u32,
    /// For a tool whose policy is `Restart`: a digest of each update of its body that was
    /// delivered, in order (the first one may be the call's immediate output). The body
    /// run again starts over, and its updates that repeat these, in order, are not
    /// delivered again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) said: Vec<u64>,
    /// What it saved last with `ctx.checkpoint`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) checkpoint: Option<Value>,
    /// A digest of its newest update when that update was delivered (in a chat context, or
    /// held until its step is in) but its answer had not reached the body: the body's own
    /// record (a `Resume` body's checkpoint) does not count it, so the body run again says
    /// it again, and it is not delivered twice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) repeat: Option<u64>,
    /// Its newest update was sent and not answered yet when the state was read: whether
    /// it landed is for the session to find in what it assembles (not written).
    #[serde(skip)]
    pub(crate) unanswered: bool,
    /// A digest of its newest update (not written: `repeat` is, when it applies).
    #[serde(skip)]
    pub(crate) last_said: Option<u64>,
}

impl RunState {
    /// The call id of its newest update (`{id}/update_n`), which `repeat` is of.
    pub(crate) fn newest_update(&self) -> String {
        format!("{}/update_{}", self.call.call_id, self.updates)
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A toolset's calls in a snapshot, under its name (`tools` for an agent's bare tools).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct ToolsetState {
    pub(crate) name: String,
    pub(crate) runs: Vec<RunState>,
}

/// A digest of an update's text, to know a restarted body's update that repeats one
/// already delivered (FNV-1a: stable across builds and processes, unlike `std`'s hasher).
pub(crate) fn digest(text: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// Whether a body run again said again what the call had said (see [`Progress::replays`]).
#[derive(Debug)]
pub(crate) enum Replayed {
    /// No: it goes out.
    No,
    /// Yes, and it is in a chat context: not delivered again, answered at once.
    Landed,
    /// Yes, and it is held until its step is in: not delivered again, answered when it
    /// lands.
    WhenHeldLands(RepeatAnswer),
}

/// What a run, its body's context and its toolset share of one run (see the module docs).
#[derive(Debug)]
pub(crate) struct Progress {
    key: u64,
    step: u64,
    call: Arc<FunctionCall>,
    /// Its tool's policy is `Restart`: it keeps the digests of what its body said.
    keeps_said: bool,
    live: Mutex<Live>,
    /// For a run restored from a snapshot: the checkpoint it starts from (maybe none).
    restored: Option<Option<Value>>,
    /// For a run restored with a `repeat` held until its step is in: the answer to that
    /// update, which the body saying it again waits for.
    repeat_answer: Mutex<Option<RepeatAnswer>>,
}

/// The answer to an update held until its step is in.
pub(crate) type RepeatAnswer = Arc<crate::delivery::AnswerSlot>;

#[derive(Debug, Default)]
struct Live {
    /// Stopped, or its body returned: its last output is its stopper's to write, or on
    /// its way; a snapshot no longer holds it.
    over: bool,
    updates: u32,
    /// An update was sent and its answer has not come (one at a time: `ctx.update` awaits).
    unanswered: bool,
    said: Vec<u64>,
    /// The digest of its newest update.
    last_said: Option<u64>,
    checkpoint: Option<Value>,
    /// A body run again: the digests of what the call said before that it may say again,
    /// still to be matched, in order.
    replay: VecDeque<u64>,
    /// The update delivered whose answer had not reached the body at the snapshot, while
    /// the body run again has not said it again.
    repeat: Option<u64>,
    /// A call-long run stopped in the background whose body then returned: what it
    /// returned, for whoever stopped it to write down (`None` inside: nothing to write).
    kept: Option<Option<(String, bool)>>,
}

impl Progress {
    /// A run about to start.
    pub(crate) fn new(key: u64, step: u64, call: Arc<FunctionCall>, keeps_said: bool) -> Self {
        Self {
            key,
            step,
            call,
            keeps_said,
            live: Mutex::default(),
            restored: None,
            repeat_answer: Mutex::default(),
        }
    }

    /// A run restored from `state`, its body run again: its updates go on after those it
    /// delivered, and what it says again of what the call said is not delivered twice — a
    /// body that starts over (`starts_over`, which keeps what it says) may repeat it all, in
    /// order; one that goes on from its checkpoint, the update it was not told had landed.
    pub(crate) fn restored(
        state: &RunState,
        call: Arc<FunctionCall>,
        starts_over: bool,
        repeat_answer: Option<RepeatAnswer>,
    ) -> Self {
        let replay = if starts_over {
            state.said.iter().copied().collect()
        } else {
            state.repeat.into_iter().collect()
        };
        Self {
            key: state.key,
            step: state.step,
            call,
            keeps_said: starts_over,
            live: Mutex::new(Live {
                updates: state.updates,
                said: state.said.clone(),
                last_said: state.said.last().copied().or(state.repeat),
                checkpoint: state.checkpoint.clone(),
                replay,
                repeat: state.repeat,
                ..Live::default()
            }),
            restored: Some(state.checkpoint.clone()),
            repeat_answer: Mutex::new(repeat_answer),
        }
    }

    fn live(&self) -> MutexGuard<'_, Live> {
        // Only plain data behind it: a panic elsewhere leaves it consistent.
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn key(&self) -> u64 {
        self.key
    }

    /// Whether a body run again says, in its place, what the call delivered before the
    /// snapshot (`digest` of its update): then it is not delivered again. The first that
    /// does not ends the replay.
    pub(crate) fn replays(&self, digest: u64) -> Replayed {
        let mut live = self.live();
        if live.replay.front() == Some(&digest) {
            live.replay.pop_front();
            if live.replay.is_empty() && live.repeat.take().is_some() {
                // The update the body had not been told had landed: its answer is the
                // held item's, once it lands.
                let held = self
                    .repeat_answer
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take();
                if let Some(held) = held {
                    return Replayed::WhenHeldLands(held);
                }
            }
            return Replayed::Landed;
        }
        live.replay.clear();
        live.repeat = None;
        Replayed::No
    }

    /// The body's first update became the call's immediate output.
    pub(crate) fn first_update(&self, digest: u64) {
        let mut live = self.live();
        live.last_said = Some(digest);
        if self.keeps_said {
            live.said.push(digest);
        }
    }

    /// A later update goes out: its number (`/update_n`).
    pub(crate) fn next_update(&self, digest: u64) -> u32 {
        let mut live = self.live();
        live.updates += 1;
        live.unanswered = true;
        live.last_said = Some(digest);
        if self.keeps_said {
            live.said.push(digest);
        }
        live.updates
    }

    /// The answer to the update on its way came: refused, it never landed, and its number
    /// is free again.
    pub(crate) fn answered(&self, landed: bool) {
        let mut live = self.live();
        if std::mem::take(&mut live.unanswered) && !landed {
            live.updates = live.updates.saturating_sub(1);
            if self.keeps_said {
                live.said.pop();
            }
        }
    }

    /// The run stopped or its body returned.
    pub(crate) fn over(&self) {
        self.live().over = true;
    }

    /// A call-long run stopped in the background returned after its stop: `kept` is its
    /// own result, `None` when it returned nothing to write down.
    pub(crate) fn keep(&self, kept: Option<(String, bool)>) {
        self.live().kept = Some(kept);
    }

    /// What a call-long run returned after its stop, once the run is gone: `None` when it
    /// did not return (or is not call-long), `Some(None)` when it returned nothing to
    /// write down.
    pub(crate) fn take_kept(&self) -> Option<Option<(String, bool)>> {
        self.live().kept.take()
    }

    pub(crate) fn checkpoint(&self, value: Value) {
        self.live().checkpoint = Some(value);
    }

    /// For a run restored from a snapshot, the checkpoint it starts from (maybe none).
    pub(crate) fn restored_checkpoint(&self) -> Option<&Option<Value>> {
        self.restored.as_ref()
    }

    /// What a snapshot writes of it; nothing once it is over.
    pub(crate) fn state(&self) -> Option<RunState> {
        let live = self.live();
        (!live.over).then(|| RunState {
            key: self.key,
            step: self.step,
            call: (*self.call).clone(),
            updates: live.updates,
            said: live.said.clone(),
            checkpoint: live.checkpoint.clone(),
            repeat: live.repeat,
            unanswered: live.unanswered,
            last_said: live.last_said,
        })
    }
}

/// A toolset's runs, by key, for snapshots (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct RunBook {
    runs: Mutex<BTreeMap<u64, Arc<Progress>>>,
}

impl RunBook {
    fn runs(&self) -> MutexGuard<'_, BTreeMap<u64, Arc<Progress>>> {
        // Only a map of handles behind it: a panic elsewhere leaves it consistent.
        self.runs.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn add(&self, progress: Arc<Progress>) {
        self.runs().insert(progress.key(), progress);
    }

    pub(crate) fn remove(&self, key: u64) {
        self.runs().remove(&key);
    }

    /// The calls running now, in the order they started.
    pub(crate) fn states(&self) -> Vec<RunState> {
        self.runs().values().filter_map(|p| p.state()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call() -> Arc<FunctionCall> {
        Arc::new(FunctionCall {
            call_id: "c1".into(),
            name: "search".into(),
            arguments: "{}".into(),
        })
    }

    #[test]
    fn the_digest_is_fnv_1a() {
        assert_eq!(digest(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(digest("a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn a_refused_update_frees_its_number_and_a_landed_one_keeps_it() {
        let progress = Progress::new(1, 1, call(), true);
        progress.first_update(digest("one"));
        assert_eq!(progress.next_update(digest("two")), 1);
        progress.answered(true);
        assert_eq!(progress.next_update(digest("three")), 2);
        assert!(progress.state().unwrap().unanswered);
        progress.answered(false);
        let state = progress.state().unwrap();
        assert_eq!(state.updates, 1);
        assert_eq!(state.said, [digest("one"), digest("two")]);
        assert!(!state.unanswered);
    }

    #[test]
    fn a_restarted_body_repeats_in_order_until_it_says_something_new() {
        let state = RunState {
            key: 7,
            step: 2,
            call: (*call()).clone(),
            updates: 1,
            said: vec![digest("one"), digest("two")],
            checkpoint: None,
            repeat: None,
            unanswered: false,
            last_said: None,
        };
        let progress = Progress::restored(&state, call(), true, None);
        assert!(matches!(progress.replays(digest("one")), Replayed::Landed));
        assert!(
            matches!(progress.replays(digest("new")), Replayed::No),
            "a new update ends it"
        );
        assert!(
            matches!(progress.replays(digest("two")), Replayed::No),
            "past the first new one, nothing is held back"
        );
    }

    #[test]
    fn a_resumed_body_does_not_say_twice_the_update_it_was_not_told_had_landed() {
        let state = RunState {
            key: 7,
            step: 2,
            call: (*call()).clone(),
            updates: 2,
            said: Vec::new(),
            checkpoint: Some(serde_json::json!(1)),
            repeat: Some(digest("two")),
            unanswered: false,
            last_said: None,
        };
        let progress = Progress::restored(&state, call(), false, None);
        assert_eq!(progress.state().unwrap().repeat, Some(digest("two")));
        assert!(matches!(progress.replays(digest("two")), Replayed::Landed));
        assert_eq!(progress.state().unwrap().repeat, None);
        assert!(
            matches!(progress.replays(digest("two")), Replayed::No),
            "said again after that, it goes out"
        );
    }

    #[test]
    fn a_run_that_is_over_is_not_in_the_book_s_states() {
        let book = RunBook::default();
        let running = Arc::new(Progress::new(2, 1, call(), false));
        let over = Arc::new(Progress::new(1, 1, call(), false));
        over.over();
        book.add(running);
        book.add(over);
        let keys: Vec<u64> = book.states().iter().map(|s| s.key).collect();
        assert_eq!(keys, [2]);
    }
}
