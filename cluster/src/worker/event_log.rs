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
//!
//! No message exceeds the server's `max_payload`: an event too big for one (a close's
//! answer carries the whole history) is recorded as parts, each with its own number (see
//! `protocol.rs`), and kept or dropped as one.

use std::collections::VecDeque;

use serde::Serialize;

use crate::protocol::{WireElement, WireEvent, WireEventKind};
use crate::remote_event::RemoteEventKind;

/// The most bytes of events one message carries (a replay reply, a batch) when the
/// server allows that much.
const MESSAGE_BYTES: usize = 256 * 1024;

/// What a message needs beside its events: a reply's wrapping, the array's brackets, the
/// headers; and the least a message may carry whatever the server says.
const ROOM: usize = 1024;

/// What a part needs beside its text: its numbers and field names.
const PART_ROOM: usize = 256;

/// The numbered events of one session, the newest of them, and how far they were sent.
#[derive(Debug)]
pub(crate) struct EventLog {
    epoch: u64,
    last_seq: u64,
    /// The last event sent on the events subject (later ones wait for the next batch, or
    /// are held while the lease cannot be trusted).
    sent: u64,
    /// Oldest first: each event's (or part's) number and JSON. The sent ones up to the
    /// budget, and every unsent one (up to `held_bytes`).
    kept: VecDeque<(u64, Vec<u8>)>,
    kept_bytes: usize,
    unsent_bytes: usize,
    budget: usize,
    /// The first number of the newest event: it (all its parts) is never dropped.
    newest: u64,
    /// The most bytes of events one message carries: under the server's `max_payload`.
    message_bytes: usize,
    /// The last event held back ([`hold`](Self::hold)), and the bytes of those held.
    held_through: u64,
    held_now: usize,
    /// The most bytes of events held back (while the lease cannot be trusted), beyond the
    /// budget; past it the oldest held ones are dropped, and the gateway reports them
    /// lost. What one wake of the loop records is never dropped before it is sent.
    held_bytes: usize,
    /// The owner's first event, number 1, when it is `SessionStarted` or `SessionResumed`
    /// (a few bytes): kept for replay whatever the budget drops. It says where the owner's
    /// snapshot left the inputs, which a gateway must hear to send it those it lacks (a
    /// gateway that missed the owner's first batches asks for its events from 1).
    first: Option<Vec<u8>>,
    /// The first number kept whatever the budget, once the session says its last words
    /// ([`keep_from_next`](Self::keep_from_next)).
    kept_from: Option<u64>,
}

/// A part as it is written (its text borrowed from the event's JSON).
#[derive(Serialize)]
struct PartOut<'a> {
    seq: u64,
    epoch: u64,
    part: PartText<'a>,
}

#[derive(Serialize)]
struct PartText<'a> {
    index: u32,
    count: u32,
    text: &'a str,
}

impl EventLog {
    /// An empty log for an owner at `epoch`, keeping up to `budget` bytes of events, for
    /// a server whose messages carry at most `max_payload` bytes.
    pub(crate) fn new(epoch: u64, budget: usize, max_payload: usize) -> Self {
        let message_bytes = MESSAGE_BYTES
            .min(max_payload.saturating_sub(ROOM))
            .max(ROOM);
        Self {
            epoch,
            last_seq: 0,
            sent: 0,
            kept: VecDeque::new(),
            kept_bytes: 0,
            unsent_bytes: 0,
            budget,
            newest: 1,
            message_bytes,
            held_through: 0,
            held_now: 0,
            held_bytes: 4 * message_bytes,
            first: None,
            kept_from: None,
        }
    }

    /// What is recorded from now on is kept for replay whatever the budget: a session's
    /// last words (a close's answer, the whole history, then `SessionClosed`), which a
    /// gateway that missed one of their parts asks for again while the owner lingers. No
    /// later event ever pushes them out.
    pub(crate) fn keep_from_next(&mut self) {
        self.kept_from.get_or_insert(self.last_seq + 1);
    }

    /// Numbers `kind` as the next event (the next ones, for an event recorded in parts)
    /// and keeps it, to be sent with the next batch.
    pub(crate) fn record(&mut self, kind: impl Into<WireEventKind>) {
        self.newest = self.last_seq + 1;
        let event = WireEvent {
            seq: self.newest,
            epoch: self.epoch,
            kind: kind.into(),
        };
        // A derived `Serialize` of plain data with string keys cannot fail.
        let json = serde_json::to_vec(&event).unwrap_or_default();
        if json.len() <= self.message_bytes {
            self.last_seq += 1;
            let says_resume_point = matches!(
                event.kind,
                WireEventKind::Event(
                    RemoteEventKind::SessionStarted | RemoteEventKind::SessionResumed { .. }
                )
            );
            if self.last_seq == 1 && says_resume_point {
                self.first = Some(json.clone());
            }
            self.keep(json);
        } else {
            let text = serde_json::to_string(&event.kind).unwrap_or_default();
            let pieces = cut(&text, self.message_bytes - PART_ROOM);
            let count = u32::try_from(pieces.len()).unwrap_or(u32::MAX);
            for (index, text) in (0..count).zip(pieces) {
                self.last_seq += 1;
                let part = PartOut {
                    seq: self.last_seq,
                    epoch: self.epoch,
                    part: PartText { index, count, text },
                };
                self.keep(serde_json::to_vec(&part).unwrap_or_default());
            }
        }
        self.trim();
    }

    fn keep(&mut self, json: Vec<u8>) {
        self.kept_bytes += json.len();
        self.unsent_bytes += json.len();
        self.kept.push_back((self.last_seq, json));
    }

    /// The events not sent yet are held back (the lease cannot be trusted): from now on
    /// the cap on held events applies to them.
    pub(crate) fn hold(&mut self) {
        if self.held_through != self.last_seq {
            self.held_through = self.last_seq;
            self.held_now = self.unsent_bytes;
            self.trim();
        }
    }

    /// Drops the oldest sent events over the budget, and the oldest held ones over
    /// `held_bytes`; always keeps the newest event (all its parts), even if it alone is
    /// over both.
    fn trim(&mut self) {
        while let Some((seq, json)) = self.kept.front() {
            let seq = *seq;
            if seq >= self.newest || self.kept_from.is_some_and(|from| seq >= from) {
                break;
            }
            let sent = seq <= self.sent;
            let held_over = self.held_now > self.held_bytes;
            // Held events over their cap go, and every sent one older than them.
            let over = if sent {
                held_over || self.kept_bytes - self.unsent_bytes > self.budget
            } else {
                held_over && seq <= self.held_through
            };
            if !over {
                break;
            }
            let size = json.len();
            self.kept.pop_front();
            self.kept_bytes -= size;
            if !sent {
                self.unsent_bytes -= size;
                self.held_now -= size;
            }
        }
    }

    /// Whether events were recorded since the last [`take_unsent`](Self::take_unsent).
    pub(crate) fn has_unsent(&self) -> bool {
        self.sent != self.last_seq
    }

    /// The events recorded since the last call, as messages for the events subject (each
    /// a JSON array of consecutive events or parts, at most one message's worth, and at
    /// least one); they count as sent from now on. Those the held cap dropped before they
    /// were sent are not there: the gateway sees the hole and asks for a replay.
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
            if !message.is_empty() && message.len() + json.len() + 1 > self.message_bytes {
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
        self.held_now = 0;
        self.trim();
        messages
    }

    /// The kept events from `from` on, at most one reply's worth; `true` when they reach
    /// the newest. Events older than the oldest kept are simply not there (but the first
    /// one, always kept): the gateway sees the hole and reports them lost.
    pub(crate) fn since(&self, from: u64) -> (Vec<WireElement>, bool) {
        let mut bytes = 0;
        let mut out = Vec::new();
        let oldest = self.kept.front().map_or(1, |(seq, _)| *seq);
        if let Some(first) = self.first.as_ref().filter(|_| from <= 1 && oldest > 1) {
            bytes += first.len();
            // Serialized from a `WireEvent` in `record`.
            if let Ok(event) = serde_json::from_slice(first) {
                out.push(event);
            }
        }
        let first = usize::try_from(from.saturating_sub(oldest)).unwrap_or(usize::MAX);
        for (_, json) in self.kept.range(first.min(self.kept.len())..) {
            if bytes + json.len() > self.message_bytes && !out.is_empty() {
                return (out, false);
            }
            bytes += json.len();
            // It was serialized from a `WireEvent` or a part just above.
            if let Ok(event) = serde_json::from_slice(json) {
                out.push(event);
            }
        }
        (out, true)
    }
}

/// Cuts `text` at character boundaries into pieces whose JSON string forms (quoted, with
/// their escapes) take at most `budget` bytes each.
fn cut(text: &str, budget: usize) -> Vec<&str> {
    let mut pieces = Vec::new();
    let mut start = 0;
    // The quotes.
    let mut cost = 2;
    for (at, c) in text.char_indices() {
        let escaped = match c {
            '"' | '\\' => 2,
            c if u32::from(c) < 0x20 => 6,
            c => c.len_utf8(),
        };
        if cost + escaped > budget && at > start {
            pieces.push(&text[start..at]);
            start = at;
            cost = 2;
        }
        cost += escaped;
    }
    pieces.push(&text[start..]);
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::WireBody;

    fn chunk(text: &str) -> RemoteEventKind {
        RemoteEventKind::StartFailed {
            reason: text.to_owned(),
        }
    }

    /// The text of an event made by [`chunk`].
    fn text(kind: &WireEventKind) -> &str {
        match kind {
            WireEventKind::Event(RemoteEventKind::StartFailed { reason }) => reason,
            other => panic!("not a chunk: {other:?}"),
        }
    }

    /// The texts of `events`, made by [`chunk`].
    fn texts(events: &[WireEvent]) -> Vec<&str> {
        events.iter().map(|e| text(&e.kind)).collect()
    }

    /// 600 KB of events, more than one message carries.
    fn sixty_big_events() -> EventLog {
        let mut log = EventLog::new(1, 4 << 20, 1 << 20);
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

    /// The events of `messages`, parts joined (as the gateway joins them).
    fn joined(messages: &[Vec<u8>]) -> Vec<WireEvent> {
        let mut events = Vec::new();
        let mut text = String::new();
        for message in messages {
            let wire: Vec<WireElement> = serde_json::from_slice(message).unwrap();
            for element in wire {
                let (seq, epoch) = (element.seq, element.epoch);
                match element.body().unwrap() {
                    WireBody::Whole(kind) => events.push(WireEvent { seq, epoch, kind }),
                    WireBody::Part(part) => {
                        text.push_str(&part.text);
                        if part.index + 1 == part.count {
                            let kind = serde_json::from_str(&std::mem::take(&mut text)).unwrap();
                            events.push(WireEvent { seq, epoch, kind });
                        }
                    }
                }
            }
        }
        events
    }

    #[test]
    fn events_are_numbered_from_one_with_the_epoch() {
        let mut log = EventLog::new(3, 1 << 20, 1 << 20);
        log.record(chunk("a"));
        log.record(chunk("b"));
        let messages = log.take_unsent();
        assert_eq!(messages.len(), 1, "one batch");
        let events = read(&messages[0]);
        assert_eq!(
            events.iter().map(|e| (e.seq, e.epoch)).collect::<Vec<_>>(),
            [(1, 3), (2, 3)]
        );
        assert_eq!(text(&events[1].kind), "b");
    }

    #[test]
    fn each_batch_holds_what_was_recorded_since_the_last() {
        let mut log = EventLog::new(1, 1 << 20, 1 << 20);
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

        // Held past their cap (a lease that could not be trusted, wake after wake): the
        // oldest are gone.
        let mut log = EventLog::new(1, 300, 1 << 20);
        for _ in 0..150 {
            log.record(chunk(&text));
            log.hold();
        }
        let seqs = sent_seqs(&mut log);
        assert_eq!(seqs.last(), Some(&150));
        assert!(seqs[0] > 1, "the oldest were dropped");
        assert!(seqs.len() * 10_000 <= log.held_bytes);
    }

    #[test]
    fn the_budget_never_drops_an_event_before_it_is_sent() {
        // A close's answer carries the whole history, over the replay budget; the
        // `SessionClosed` after it must not push it out before the batch goes.
        let mut log = EventLog::new(1, 300, 1 << 20);
        log.record(chunk(&"h".repeat(1_000)));
        log.record(chunk("ended"));
        let seqs = sent_seqs(&mut log);
        assert_eq!(seqs, [1, 2]);
        // Once sent, the budget applies: the big one is gone from the replay.
        let (events, _) = log.since(1);
        assert_eq!(events.iter().map(|e| e.seq).collect::<Vec<_>>(), [2]);
    }

    #[test]
    fn an_event_over_a_message_goes_in_parts_none_over_the_server_s_limit() {
        // A server that takes 64 KiB per message, and a history of 200 KB full of what
        // JSON escapes, and of characters of several bytes.
        let max_payload = 64 * 1024;
        let mut log = EventLog::new(1, 1 << 20, max_payload);
        log.record(chunk("before"));
        let big = "\"quoted\" \\ é 漢字 \n".repeat(12_000);
        log.record(chunk(&big));
        log.record(chunk("after"));
        let messages = log.take_unsent();
        assert!(messages.len() >= 3, "{} messages", messages.len());
        for message in &messages {
            assert!(
                message.len() <= max_payload - ROOM,
                "{} bytes",
                message.len()
            );
        }
        let events = joined(&messages);
        assert_eq!(texts(&events), ["before", big.as_str(), "after"]);
        // Each part has its number: the one after the big event follows its last part.
        assert_eq!(events[0].seq, 1);
        assert!(events[2].seq > 3 && events[2].seq == events[1].seq + 1);
        // A replay from the first part brings them again, in replies under the limit.
        let mut from = 2;
        let mut replayed = Vec::new();
        loop {
            let (events, complete) = log.since(from);
            from = events.last().unwrap().seq + 1;
            let elements = serde_json::to_vec(&events).unwrap();
            let reply =
                serde_json::to_vec(&crate::protocol::Reply::Replay { events, complete }).unwrap();
            assert!(reply.len() <= max_payload, "{} bytes", reply.len());
            replayed.push(elements);
            if complete {
                break;
            }
        }
        assert_eq!(joined(&replayed).len(), 2);
    }

    #[test]
    fn the_parts_of_the_newest_event_are_never_dropped_before_they_are_sent() {
        // Held (the lease could not be trusted) past the cap: the oldest events go, the
        // big newest one stays whole.
        let mut log = EventLog::new(1, 300, 64 * 1024);
        for i in 0..300 {
            log.record(chunk(&format!("{i}").repeat(1_000)));
            log.hold();
        }
        let big = "h".repeat(1 << 20);
        log.record(chunk(&big));
        log.hold();
        let events = joined(&log.take_unsent());
        assert_eq!(events.last().map(|e| text(&e.kind)), Some(big.as_str()));
        assert!(events.len() < 301, "the oldest held ones were dropped");
        // Nor, within one wake, before the events recorded after it.
        let mut log = EventLog::new(1, 300, 64 * 1024);
        log.record(chunk(&big));
        log.record(chunk("ended"));
        let events = joined(&log.take_unsent());
        assert_eq!(texts(&events), [big.as_str(), "ended"]);
    }

    #[test]
    fn a_cut_keeps_characters_whole_and_counts_escapes() {
        let text = "aé\"漢\\b";
        for budget in 3..20 {
            let pieces = cut(text, budget);
            assert_eq!(pieces.concat(), text, "budget {budget}");
            for piece in &pieces {
                let quoted = serde_json::to_string(piece).unwrap();
                assert!(
                    quoted.len() <= budget || piece.chars().count() == 1,
                    "budget {budget}: {quoted}"
                );
            }
        }
    }

    #[test]
    fn a_replay_sends_what_is_kept_from_the_asked_number() {
        let mut log = EventLog::new(1, 1 << 20, 1 << 20);
        for i in 0..5 {
            log.record(chunk(&i.to_string()));
        }
        let (events, complete) = log.since(3);
        assert!(complete);
        assert_eq!(events.iter().map(|e| e.seq).collect::<Vec<_>>(), [3, 4, 5]);
        assert_eq!(events[0].kind.as_ref().map(text), Some("2"));
        assert!(log.since(6).0.is_empty());
    }

    #[test]
    fn the_budget_drops_the_oldest_and_a_replay_says_where_it_starts() {
        let mut log = EventLog::new(1, 300, 1 << 20);
        log.record(RemoteEventKind::SessionResumed { last_input: 7 });
        for i in 1..20 {
            log.record(chunk(&format!("event number {i}")));
            log.take_unsent();
        }
        let (events, complete) = log.since(1);
        assert!(complete);
        assert!(events.len() < 20 && !events.is_empty());
        assert_eq!(events.last().map(|e| e.seq), Some(20));
        // The first event stays (it says where the owner's snapshot left the inputs);
        // a hole follows it.
        let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
        assert_eq!(seqs[0], 1);
        assert!(matches!(
            events[0].kind,
            Some(WireEventKind::Event(RemoteEventKind::SessionResumed {
                last_input: 7
            }))
        ));
        assert!(
            seqs[1] > 2,
            "the oldest but the first were dropped: {seqs:?}"
        );
        assert!(
            log.since(2).0.first().map_or(0, |e| e.seq) > 2,
            "a replay from after the first does not bring it"
        );
    }

    #[test]
    fn the_last_words_stay_for_replay_whatever_the_budget() {
        // A budget of 300 bytes, and a close's answer of 600 KB in parts, then the end.
        let mut log = EventLog::new(1, 300, 1 << 20);
        log.record(chunk("before"));
        log.take_unsent();
        log.keep_from_next();
        let answer = "h".repeat(600_000);
        log.record(chunk(&answer));
        log.record(chunk("closed"));
        let sent = joined(&log.take_unsent());
        assert_eq!(texts(&sent), [answer.as_str(), "closed"]);
        // Sent, and far over the budget: a gateway that missed a part gets them all, from
        // the answer's first part (number 2) on.
        let mut replayed = Vec::new();
        let mut from = 2;
        loop {
            let (events, complete) = log.since(from);
            from = events.last().map_or(from, |e| e.seq + 1);
            replayed.extend(events);
            if complete {
                break;
            }
        }
        let message = serde_json::to_vec(&replayed).unwrap();
        assert_eq!(texts(&joined(&[message])), [answer.as_str(), "closed"]);
        // Without it the budget drops the answer's parts once they are sent.
        let mut log = EventLog::new(1, 300, 1 << 20);
        log.record(chunk(&answer));
        log.record(chunk("closed"));
        log.take_unsent();
        let (events, _) = log.since(1);
        assert_eq!(events.len(), 1, "only the newest is kept");
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
