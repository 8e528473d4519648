//! Exactly-once across reconnections, as two plain types the call's link drives: the
//! [`Outbox`] of outputs the worker has not acknowledged, and the [`InputLedger`] of the
//! worker's inputs applied so far.
//!
//! The rules, both ways: a sender numbers its frames 1, 2, 3, …; keeps each until the
//! other side acknowledges it; after a reconnection resends every frame after the number
//! the other side says it applied last. A receiver applies the next number only, drops a
//! number it already applied (a resend that crossed an acknowledgement), and treats a
//! number past the next as a broken connection (the sender then reconnects and resends).

use std::collections::VecDeque;

/// The numbered outputs not yet acknowledged, oldest first.
#[derive(Debug)]
pub(crate) struct Outbox<T> {
    /// The number the next output gets.
    next: u64,
    unacked: VecDeque<(u64, T)>,
}

impl<T> Default for Outbox<T> {
    fn default() -> Self {
        Self {
            next: 1,
            unacked: VecDeque::new(),
        }
    }
}

impl<T> Outbox<T> {
    /// Numbers `frame` and keeps it until acknowledged; returns its number.
    pub(crate) fn push(&mut self, frame: T) -> u64 {
        let seq = self.next;
        self.next += 1;
        self.unacked.push_back((seq, frame));
        seq
    }

    /// The peer applied every output up to `upto`: forget them. An acknowledgement of a
    /// number never sent is capped at the last one sent.
    pub(crate) fn ack(&mut self, upto: u64) {
        while self.unacked.front().is_some_and(|(seq, _)| *seq <= upto) {
            self.unacked.pop_front();
        }
    }

    /// The outputs to send again after a reconnection, oldest first.
    pub(crate) fn unacked(&self) -> impl Iterator<Item = (u64, &T)> {
        self.unacked.iter().map(|(seq, frame)| (*seq, frame))
    }

    /// The output pushed last, while unacknowledged.
    pub(crate) fn newest(&self) -> Option<(u64, &T)> {
        self.unacked.back().map(|(seq, frame)| (*seq, frame))
    }

    /// How many outputs wait for an acknowledgement.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.unacked.len()
    }
}

/// The worker's inputs applied so far: every number up to `last`, each once.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InputLedger {
    last: u64,
}

/// What to do with an input number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// The next one: apply it (the ledger now counts it).
    Apply,
    /// Applied before: drop it, and acknowledge again.
    Duplicate,
    /// Some before it never came: the connection lost frames; drop the connection, so
    /// the worker reconnects and resends from the last acknowledged number.
    Gap {
        /// The number that should have come.
        expected: u64,
    },
}

impl InputLedger {
    /// The last input number applied (0: none).
    pub(crate) fn last(&self) -> u64 {
        self.last
    }

    /// Decides on input `id`, counting it when it is to be applied.
    pub(crate) fn admit(&mut self, id: u64) -> Admission {
        let expected = self.last + 1;
        if id == expected {
            self.last = id;
            Admission::Apply
        } else if id < expected {
            Admission::Duplicate
        } else {
            Admission::Gap { expected }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_outbox_keeps_what_was_not_acknowledged() {
        let mut outbox = Outbox::default();
        assert_eq!(outbox.push("a"), 1);
        assert_eq!(outbox.push("b"), 2);
        assert_eq!(outbox.push("c"), 3);
        outbox.ack(1);
        assert_eq!(outbox.unacked().collect::<Vec<_>>(), [(2, &"b"), (3, &"c")]);
        // An old acknowledgement changes nothing; one past the end empties it.
        outbox.ack(1);
        assert_eq!(outbox.len(), 2);
        outbox.ack(99);
        assert_eq!(outbox.len(), 0);
        // Numbers go on after an acknowledgement: never reused.
        assert_eq!(outbox.push("d"), 4);
    }

    #[test]
    fn the_ledger_applies_each_number_once_and_in_order() {
        let mut ledger = InputLedger::default();
        assert_eq!(ledger.admit(1), Admission::Apply);
        assert_eq!(ledger.admit(2), Admission::Apply);
        // A resend of what was applied (its acknowledgement was lost with the connection).
        assert_eq!(ledger.admit(1), Admission::Duplicate);
        assert_eq!(ledger.admit(2), Admission::Duplicate);
        // A lost frame: nothing is applied past it.
        assert_eq!(ledger.admit(4), Admission::Gap { expected: 3 });
        assert_eq!(ledger.last(), 2);
        assert_eq!(ledger.admit(3), Admission::Apply);
        assert_eq!(ledger.admit(4), Admission::Apply);
        assert_eq!(ledger.last(), 4);
    }
}
