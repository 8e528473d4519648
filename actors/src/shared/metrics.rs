//! The session's usage ledger and each agent's latency, for the whole call: written by
//! each activity as its LLM requests and turns end, read by the host (`Session::usage`,
//! `Session::latency`) and by snapshots, which carry it so a restored session goes on
//! counting where it was.
//!
//! Kept by the agents' and models' shared names (`Arc<str>`: the agent's is its
//! definition's), with room for a few lines made when the session is: a request or turn
//! that ends costs a lock and a short scan, and no allocation once its agent and model
//! have a line. The host's reads build the public types.

use std::sync::{Arc, Mutex};

use crate::latency::{AgentLatency, SessionLatency, TurnLatency};
use crate::usage::{SessionUsage, Usage};

/// The usage ledger and the latency per agent (see the module docs).
pub(crate) struct MetricsBook(Mutex<Book>);

struct Book {
    /// (agent, model, usage), in the order first used.
    usage: Vec<(Arc<str>, Arc<str>, Usage)>,
    /// (agent, latency), in the order first used.
    latency: Vec<(Arc<str>, AgentLatency)>,
}

impl Default for MetricsBook {
    fn default() -> Self {
        // Most calls have one or two agents and one model.
        Self(Mutex::new(Book {
            usage: Vec::with_capacity(2),
            latency: Vec::with_capacity(2),
        }))
    }
}

impl MetricsBook {
    /// One LLM request of `agent`, served by `model`, ended (or was dropped).
    pub(crate) fn request(&self, agent: &Arc<str>, model: &str, usage: &Usage) {
        let mut book = self.lock();
        match book
            .usage
            .iter_mut()
            .find(|(a, m, _)| **a == **agent && &**m == model)
        {
            Some((_, _, line)) => *line += usage,
            None => book.usage.push((agent.clone(), Arc::from(model), *usage)),
        }
    }

    /// A turn of `agent` ended.
    pub(crate) fn turn(&self, agent: &Arc<str>, latency: &TurnLatency) {
        let mut book = self.lock();
        match book.latency.iter_mut().find(|(a, _)| **a == **agent) {
            Some((_, entry)) => entry.record(latency),
            None => {
                let mut entry = AgentLatency::default();
                entry.record(latency);
                book.latency.push((agent.clone(), entry));
            }
        }
    }

    /// The ledger now.
    pub(crate) fn usage(&self) -> SessionUsage {
        let book = self.lock();
        let mut out = SessionUsage::default();
        for (agent, model, usage) in &book.usage {
            out.add(agent, model, usage);
        }
        out
    }

    /// Each agent's latency now.
    pub(crate) fn latency(&self) -> SessionLatency {
        self.lock()
            .latency
            .iter()
            .map(|(agent, latency)| (agent.to_string(), *latency))
            .collect()
    }

    /// Starts from what a snapshot held.
    pub(crate) fn restore(&self, usage: &SessionUsage, latency: &SessionLatency) {
        let mut book = self.lock();
        book.usage = usage
            .lines()
            .iter()
            .map(|line| {
                (
                    Arc::from(line.agent.as_str()),
                    Arc::from(line.model.as_str()),
                    line.usage,
                )
            })
            .collect();
        book.latency = latency
            .iter()
            .map(|(agent, latency)| (Arc::from(agent.as_str()), *latency))
            .collect();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Book> {
        // Counters: a panic elsewhere cannot leave them half-written.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restored_book_reads_back_what_it_was_given_and_goes_on_counting() {
        let book = MetricsBook::default();
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("reception"), Arc::from("billing"));
        let one = Usage {
            requests: 1,
            prompt_tokens: 10,
            ..Usage::default()
        };
        book.request(&a, "fast", &one);
        book.request(&b, "smart", &one);
        book.request(&a, "fast", &one);
        book.turn(&b, &TurnLatency::default());
        let (usage, latency) = (book.usage(), book.latency());
        assert_eq!(usage.agent("reception").requests, 2);
        assert_eq!(usage.lines().len(), 2);
        let restored = MetricsBook::default();
        restored.restore(&usage, &latency);
        assert_eq!(restored.usage(), usage);
        assert_eq!(restored.latency(), latency);
        restored.request(&b, "smart", &one);
        assert_eq!(restored.usage().agent("billing").requests, 2);
    }
}
