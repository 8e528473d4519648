//! `EventLog`: the events a session published, numbered, with the newest kept for replay.
//!
//! Core NATS delivers at most once: an event published while a gateway was reconnecting is
//! gone for that gateway. So the owner numbers every event (1, 2, 3, … per session, with its
//! epoch) and keeps the newest ones, up to a byte budget, to send again when a gateway asks
//! from the first one it lacks. The budget bounds memory per session whatever the model
//! streams.

use std::collections::VecDeque;

use crate::remote_event::{RemoteEvent, RemoteEventKind};

/// The most bytes of events one replay reply carries: well under NATS's default 1 MiB
/// payload limit.
const REPLAY_REPLY_BYTES: usize = 256 * 1024;

/// The numbered events of one session and the newest of them.
#[derive(Debug)]
pub(crate) struct EventLog {
    epoch: u64,
    last_seq: u64,
    /// Oldest first, each with its serialized size.
    kept: VecDeque<(RemoteEvent, usize)>,
    kept_bytes: usize,
    budget: usize,
}

impl EventLog {
    /// An empty log for an owner at `epoch`, keeping up to `budget` bytes of events.
    pub(crate) fn new(epoch: u64, budget: usize) -> Self {
        Self {
            epoch,
            last_seq: 0,
            kept: VecDeque::new(),
            kept_bytes: 0,
            budget,
        }
    }

    /// Numbers `kind` as the next event and keeps it; returns it with its JSON.
    pub(crate) fn record(&mut self, kind: RemoteEventKind) -> (RemoteEvent, Vec<u8>) {
        self.last_seq += 1;
        let event = RemoteEvent {
            seq: self.last_seq,
            epoch: self.epoch,
            kind,
        };
        // A derived `Serialize` of plain data with string keys cannot fail.
        let json = serde_json::to_vec(&event).unwrap_or_default();
        self.kept.push_back((event.clone(), json.len()));
        self.kept_bytes += json.len();
        // Always keep the newest, even if it alone is over the budget.
        while self.kept_bytes > self.budget && self.kept.len() > 1 {
            if let Some((_, size)) = self.kept.pop_front() {
                self.kept_bytes -= size;
            }
        }
        (event, json)
    }

    /// The sequence number of the newest event (0 before the first).
    pub(crate) fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// The kept events from `from` on, at most one reply's worth; `true` when they reach
    /// the newest. Events older than the oldest kept are simply not there: the gateway
    /// sees the hole and reports them lost.
    pub(crate) fn since(&self, from: u64) -> (Vec<RemoteEvent>, bool) {
        let mut bytes = 0;
        let mut out = Vec::new();
        for (event, size) in self.kept.iter().filter(|(e, _)| e.seq >= from) {
            if bytes + size > REPLAY_REPLY_BYTES && !out.is_empty() {
                return (out, false);
            }
            bytes += size;
            out.push(event.clone());
        }
        (out, true)
    }

    /// The kept events after `seq` (those not yet published), oldest first.
    pub(crate) fn after(&self, seq: u64) -> impl Iterator<Item = &RemoteEvent> {
        self.kept
            .iter()
            .map(|(e, _)| e)
            .filter(move |e| e.seq > seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(text: &str) -> RemoteEventKind {
        RemoteEventKind::Error {
            message: text.to_owned(),
        }
    }

    #[test]
    fn events_are_numbered_from_one_with_the_epoch() {
        let mut log = EventLog::new(3, 1 << 20);
        let (first, _) = log.record(chunk("a"));
        let (second, json) = log.record(chunk("b"));
        assert_eq!((first.seq, first.epoch), (1, 3));
        assert_eq!(second.seq, 2);
        let parsed: RemoteEvent = serde_json::from_slice(&json).unwrap_or(first);
        assert_eq!(parsed, second);
        assert_eq!(log.last_seq(), 2);
    }

    #[test]
    fn a_replay_sends_what_is_kept_from_the_asked_number() {
        let mut log = EventLog::new(1, 1 << 20);
        for i in 0..5 {
            log.record(chunk(&i.to_string()));
        }
        let (events, complete) = log.since(3);
        assert!(complete);
        assert_eq!(events.iter().map(|e| e.seq).collect::<Vec<_>>(), [3, 4, 5]);
        assert_eq!(log.after(4).map(|e| e.seq).collect::<Vec<_>>(), [5]);
    }

    #[test]
    fn the_budget_drops_the_oldest_and_a_replay_says_where_it_starts() {
        let mut log = EventLog::new(1, 300);
        for i in 0..20 {
            log.record(chunk(&format!("event number {i}")));
        }
        let (events, complete) = log.since(1);
        assert!(complete);
        assert!(events.len() < 20 && !events.is_empty());
        assert_eq!(events.last().map(|e| e.seq), Some(20));
        assert!(
            events.first().map_or(0, |e| e.seq) > 1,
            "the oldest were dropped"
        );
    }

    #[test]
    fn a_long_replay_comes_in_parts() {
        let mut log = EventLog::new(1, 4 << 20);
        let text = "x".repeat(10_000);
        for _ in 0..60 {
            log.record(chunk(&text));
        }
        let mut parts = 0;
        let mut seen = Vec::new();
        loop {
            let from = seen.last().map_or(1, |seq| seq + 1);
            let (events, complete) = log.since(from);
            parts += 1;
            seen.extend(events.iter().map(|e| e.seq));
            if complete {
                break;
            }
        }
        assert!(parts > 1, "600 KB of events do not fit one reply");
        assert_eq!(seen, (1..=60).collect::<Vec<u64>>());
    }
}
