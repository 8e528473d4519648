//! The session's usage ledger and each agent's latency, for the whole call: written by
//! each activity as its LLM requests and turns end, read by the host (`Session::usage`,
//! `Session::latency`) and by snapshots, which carry it so a restored session goes on
//! counting where it was.

use std::sync::Mutex;

use crate::latency::{SessionLatency, TurnLatency};
use crate::usage::{SessionUsage, Usage};

/// The usage ledger and the latency per agent (see the module docs).
#[derive(Default)]
pub(crate) struct MetricsBook(Mutex<Book>);

#[derive(Default)]
struct Book {
    usage: SessionUsage,
    latency: SessionLatency,
}

impl MetricsBook {
    /// One LLM request of `agent`, served by `model`, ended (or was dropped).
    pub(crate) fn request(&self, agent: &str, model: &str, usage: &Usage) {
        self.lock().usage.add(agent, model, usage);
    }

    /// A turn of `agent` ended.
    pub(crate) fn turn(&self, agent: &str, latency: &TurnLatency) {
        let mut book = self.lock();
        match book.latency.get_mut(agent) {
            Some(entry) => entry.record(latency),
            None => {
                let mut entry = crate::latency::AgentLatency::default();
                entry.record(latency);
                book.latency.insert(agent.to_owned(), entry);
            }
        }
    }

    /// The ledger now.
    pub(crate) fn usage(&self) -> SessionUsage {
        self.lock().usage.clone()
    }

    /// Each agent's latency now.
    pub(crate) fn latency(&self) -> SessionLatency {
        self.lock().latency.clone()
    }

    /// Starts from what a snapshot held.
    pub(crate) fn restore(&self, usage: SessionUsage, latency: SessionLatency) {
        let mut book = self.lock();
        book.usage = usage;
        book.latency = latency;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Book> {
        // Counters: a panic elsewhere cannot leave them half-written.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}
