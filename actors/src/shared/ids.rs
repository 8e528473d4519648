//! The ids a session hands out: tool runs, speeches, LLM steps, host turns, and the
//! canonical call ids of the model's tool calls.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::call_ids::CallIds;
use crate::chat::{ChatContext, ChatItem};

/// Counters and the call-id table. Any actor that makes a run, a speech, a step or a turn
/// takes the next number (atomics); activities canonicalize the model's call ids and the
/// session reserves the ids of a given chat context (behind a lock, never contended: one
/// arbiter).
#[derive(Default)]
pub(crate) struct Ids {
    run: AtomicU64,
    speech: AtomicU64,
    step: AtomicU64,
    turn: AtomicU64,
    call_ids: Mutex<CallIds>,
}

impl Ids {
    pub(crate) fn next_run(&self) -> u64 {
        self.run.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub(crate) fn next_speech(&self) -> u64 {
        self.speech.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// A step key unique in the session: toolsets serve several activities, and an
    /// interruption names the step whose calls it resolves.
    pub(crate) fn next_step(&self) -> u64 {
        self.step.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub(crate) fn next_turn(&self) -> u64 {
        self.turn.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The last speech, step and run numbers given out, for a snapshot.
    pub(crate) fn counters(&self) -> (u64, u64, u64) {
        (
            self.speech.load(Ordering::Relaxed),
            self.step.load(Ordering::Relaxed),
            self.run.load(Ordering::Relaxed),
        )
    }

    /// Goes on from a snapshot's counters, so no id repeats one in its chat contexts.
    pub(crate) fn restore_counters(&self, speech: u64, step: u64, run: u64) {
        self.speech.store(speech, Ordering::Relaxed);
        self.step.store(step, Ordering::Relaxed);
        self.run.store(run, Ordering::Relaxed);
    }

    /// How many call ids were issued or reserved, and those after the first `from`.
    pub(crate) fn call_ids_since(&self, from: usize) -> (usize, Vec<String>) {
        let ids = self.call_ids.lock().unwrap_or_else(|p| p.into_inner());
        (ids.len(), ids.since(from))
    }

    /// Reserves call ids a snapshot issued, in order.
    pub(crate) fn reserve_issued(&self, issued: &[String]) {
        let mut ids = self.call_ids.lock().unwrap_or_else(|p| p.into_inner());
        for id in issued {
            ids.reserve(id);
        }
    }

    /// The session-unique canonical id of a call the model made (see `call_ids`).
    pub(crate) fn canonical_call_id(&self, provider_id: &str) -> String {
        self.call_ids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .canonical(provider_id)
    }

    /// Marks the call ids of a chat context from outside the session as issued: a model's
    /// later call with one of them gets a fresh id.
    pub(crate) fn reserve_call_ids(&self, chat: &ChatContext) {
        let mut ids = self.call_ids.lock().unwrap_or_else(|p| p.into_inner());
        for item in chat.items() {
            if let ChatItem::FunctionCall(call) = item {
                ids.reserve(&call.call_id);
            }
        }
    }
}
