//! `EventLog`: the events a session published, numbered, with the newest kept for replay,
//! and those not yet sent, as batches.
//!
//! Core NATS delivers at most once: an event published while a gateway was reconnecting is
//! gone for that gateway. So the owner numbers every event (1, 2, 3, … per session, with its
//! epoch) and keeps the newest ones, up to a byte budget, to send again when a gateway asks
//! from the first one it lacks. The budget bounds memory per session whatever the model
//! streams.
//!
//! What the session says between two wakes of its loop goes out as one message: a JSON
//! array of consecutive events. A turn says ten or so things (its user message, states,
//! speech start, chunks and end, its assistant message, its `InputDone`); one message per
//! event made each turn a dozen trips through the server and as many wakes of the gateway.

use std::collections::VecDeque;

use crate::protocol::{WireEvent, WireEventKind};

/// The most bytes of events one message carries (a replay reply, a batch): well under
/// NATS's default 1 MiB payload limit.
const MESSAGE_BYTES: usize = 256 * 1024;

/// The most bytes of events held unsent (while the lease cannot be trusted), beyond the
/// budget; past it the oldest held ones are dropped, and the gateway reports them lost.
const HELD_BYTES: usize = 4 * MESSAGE_BYTES;

/// The numbered events of one session, the newest of them, and how far they were sent.
#[derive(Debug)]
pub(crate) struct EventLog {
    epoch: u64,
    last_seq: u64,
    /// The last event sent on the events subject (later ones wait for the next batch, or
    /// are held while the lease cannot be trusted).
    sent: u64,
    /// Oldest first: each event's number and JSON. The sent ones up to the budget, and
    /// every unsent one (up to `HELD_BYTES`).
    kept: VecDeque<(u64, Vec<u8>)>,
    kept_bytes: usize,
    unsent_bytes: usize,
    budget: usize,
}

impl EventLog {
    /// An empty log for an owner at `epoch`, keeping up to `budget` bytes of events.
    pub(crate) fn new(epoch: u64, budget: usize) -> Self {
        Self {
            epoch,
            last_seq: 0,
            sent: 0,
            kept: VecDeque::new(),
            kept_bytes: 0,
            unsent_bytes: 0,
            budget,
        }
    }

    /// Numbers `kind` as the next event and keeps it, to be sent with the next batch.
    pub(crate) fn record(&mut self, kind: impl Into<WireEventKind>) {
        self.last_seq += 1;
        let event = WireEvent {
            seq: self.last_seq,
            epoch: self.epoch,
            kind: kind.into(),
        };
        // A derived `Serialize` of plain data with string keys cannot fail.
        let json = serde_json::to_vec(&event).unwrap_or_default();
        self.kept_bytes += json.len();
        self.unsent_bytes += json.len();
        self.kept.push_back((event.seq, json));
        self.trim();
    }

    /// Drops the oldest sent events over the budget, and the oldest unsent ones over
    /// `HELD_BYTES`; always keeps the newest, even if it alone is over both.
    fn trim(&mut self) {
        while self.kept.len() > 1 {
            let Some((seq, json)) = self.kept.front() else {
                break;
            };
            let sent = *seq <= self.sent;
            // Held events over their cap go, and every sent one older than them.
            let over = self.unsent_bytes > HELD_BYTES
                || (sent && self.kept_bytes - self.unsent_bytes > self.budget);
            if !over {
                break;
            }
            let size = json.len();
            self.kept.pop_front();
            self.kept_bytes -= size;
            if !sent {
                self.unsent_bytes -= size;
            }
        }
    }

    /// Whether events were recorded since the last [`take_unsent`](Self::take_unsent).
    pub(crate) fn has_unsent(&self) -> bool {
        self.sent != self.last_seq
    }

    /// The events recorded since the last call, as messages for the events subject (each
    /// a JSON array of consecutive events, at most one message's worth, and at least one
    /// event); they count as sent from now on. Those the budget dropped before they were
    /// sent are not there: the gateway sees the hole and asks for a replay.
    pub(crate) fn take_unsent(&mut self) -> Vec<Vec<u8>> {
        if !self.has_unsent() {
            return Vec::new();
        }
        let mut messages = Vec::new();
        let mut message: Vec<u8> = Vec::new();
        // The kept events are consecutive, the newest last.
        let unsent = usize::try_from(self.last_seq - self.sent).unwrap_or(usize::MAX);
        let first = self.kept.len().saturating_sub(unsent);
        for (_, json) in self.kept.range(first..) {
            if !message.is_empty() && message.len() + json.len() + 1 > MESSAGE_BYTES {
                message.push(b']');
                messages.push(std::mem::take(&mut message));
            }
            message.push(if message.is_empty() { b'[' } else { b',' });
            message.extend_from_slice(json);
        }
        if !message.is_empty() {
            message.push(b']');
            messages.push(message);
        }
        self.sent = self.last_seq;
        self.unsent_bytes = 0;
        self.trim();
        messages
    }

    /// The kept events from `from` on, at most one reply's worth; `true` when they reach
    /// the newest. Events older than the oldest kept are simply not there: the gateway
    /// sees the hole and reports them lost.
    pub(crate) fn since(&self, from: u64) -> (Vec<WireEvent>, bool) {
        let mut bytes = 0;
        let mut out = Vec::new();
        let oldest = self.kept.front().map_or(1, |(seq, _)| *seq);
        let first = usize::try_from(from.saturating_sub(oldest)).unwrap_or(usize::MAX);
        for (_, json) in self.kept.range(first.min(self.kept.len())..) {
            if bytes + json.len() > MESSAGE_BYTES && !out.is_empty() {
                return (out, false);
            }
            bytes += json.len();
            // It was serialized from a `WireEvent` just above.
            if let Ok(event) = serde_json::from_slice(json) {
                out.push(event);
            }
        }
        (out, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote_event::RemoteEventKind;

    fn chunk(text: &str) -> RemoteEventKind {
        RemoteEventKind::StartFailed {
            reason: text.to_owned(),
        }
    }

    /// The text of an event made by [`chunk`].
    fn text(event: &WireEvent) -> &str {
        match &event.kind {
            WireEventKind::Event(RemoteEventKind::StartFailed { reason }) => reason,
            other => panic!("not a chunk: {other:?}"),
        }
    }

    /// 600 KB of events, more than one message carries.
    fn sixty_big_events() -> EventLog {
        let mut log = EventLog::new(1, 4 << 20);
        let text = "x".repeat(10_000);
        for _ in 0..60 {
            log.record(chunk(&text));
        }
        log
    }

    /// The numbers of the events the next batches carry.
    fn sent_seqs(log: &mut EventLog) -> Vec<u64> {
        log.take_unsent()
            .iter()
            .flat_map(|m| read(m))
            .map(|e| e.seq)
            .collect()
    }

    fn read(message: &[u8]) -> Vec<WireEvent> {
        serde_json::from_slice(message).unwrap()
    }

    #[test]
    fn events_are_numbered_from_one_with_the_epoch() {
        let mut log = EventLog::new(3, 1 << 20);
        log.record(chunk("a"));
        log.record(chunk("b"));
        let messages = log.take_unsent();
        assert_eq!(messages.len(), 1, "one batch");
        let events = read(&messages[0]);
        assert_eq!(
            events.iter().map(|e| (e.seq, e.epoch)).collect::<Vec<_>>(),
            [(1, 3), (2, 3)]
        );
        assert_eq!(text(&events[1]), "b");
    }

    #[test]
    fn each_batch_holds_what_was_recorded_since_the_last() {
        let mut log = EventLog::new(1, 1 << 20);
        assert!(log.take_unsent().is_empty());
        log.record(chunk("a"));
        assert_eq!(read(&log.take_unsent()[0]).len(), 1);
        for i in 0..3 {
            log.record(chunk(&i.to_string()));
        }
        let messages = log.take_unsent();
        let seqs: Vec<u64> = read(&messages[0]).iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [2, 3, 4]);
        assert!(log.take_unsent().is_empty(), "nothing new");
    }

    #[test]
    fn a_big_batch_comes_in_parts_and_dropped_events_are_left_out() {
        let mut log = sixty_big_events();
        let text = "x".repeat(10_000);
        let messages = log.take_unsent();
        assert!(
            messages.len() > 1,
            "600 KB of events do not fit one message"
        );
        let seqs: Vec<u64> = messages
            .iter()
            .flat_map(|m| read(m))
            .map(|e| e.seq)
            .collect();
        assert_eq!(seqs, (1..=60).collect::<Vec<u64>>());

        // Held past their cap (a lease that could not be trusted): the oldest are gone.
        let mut log = EventLog::new(1, 300);
        for _ in 0..150 {
            log.record(chunk(&text));
        }
        let seqs = sent_seqs(&mut log);
        assert_eq!(seqs.last(), Some(&150));
        assert!(seqs[0] > 1, "the oldest were dropped");
        assert!(seqs.len() * 10_000 <= HELD_BYTES);
    }

    #[test]
    fn the_budget_never_drops_an_event_before_it_is_sent() {
        // A close's answer carries the whole history, over the replay budget; the
        // `SessionClosed` after it must not push it out before the batch goes.
        let mut log = EventLog::new(1, 300);
        log.record(chunk(&"h".repeat(1_000)));
        log.record(chunk("ended"));
        let seqs = sent_seqs(&mut log);
        assert_eq!(seqs, [1, 2]);
        // Once sent, the budget applies: the big one is gone from the replay.
        let (events, _) = log.since(1);
        assert_eq!(events.iter().map(|e| e.seq).collect::<Vec<_>>(), [2]);
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
        assert_eq!(text(&events[0]), "2");
        assert!(log.since(6).0.is_empty());
    }

    #[test]
    fn the_budget_drops_the_oldest_and_a_replay_says_where_it_starts() {
        let mut log = EventLog::new(1, 300);
        for i in 0..20 {
            log.record(chunk(&format!("event number {i}")));
            log.take_unsent();
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
        let log = sixty_big_events();
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
