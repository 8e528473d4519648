//! `InputLedger`: which host inputs a session has applied, so a retried input is answered
//! again instead of applied again.
//!
//! A gateway numbers a session's inputs 1, 2, 3, … and sends the next only after the
//! previous one was answered, so the owner needs only the last applied id and its answer:
//! the next id is applied, the last one is answered again (a retry whose first answer was
//! lost), an older one is a late duplicate nobody waits for, and a later one means inputs
//! went missing. (The last applied id is what a snapshot carries in phase 2.)

use crate::protocol::Answer;

/// What to do with an input id.
#[derive(Debug, PartialEq)]
pub(crate) enum Admission {
    /// The next input: apply it, then [`InputLedger::record`] its answer.
    Apply,
    /// A retry of the last input: send this answer again, apply nothing.
    Repeat(Answer),
    /// An older input again, which nobody waits for: apply nothing, answer nothing.
    Stale,
    /// Inputs before this one never came.
    OutOfOrder {
        /// The id that should have come.
        expected: u64,
    },
}

/// The last applied input of one session and its answer.
#[derive(Debug, Default)]
pub(crate) struct InputLedger {
    last_applied: u64,
    last_answer: Option<Answer>,
}

impl InputLedger {
    /// Decides what input `id` needs.
    pub(crate) fn admit(&self, id: u64) -> Admission {
        if id == self.last_applied + 1 {
            Admission::Apply
        } else if id == self.last_applied && id > 0 {
            Admission::Repeat(self.last_answer.clone().unwrap_or(Answer::Done))
        } else if id < self.last_applied {
            Admission::Stale
        } else {
            Admission::OutOfOrder {
                expected: self.last_applied + 1,
            }
        }
    }

    /// Records that `id` was applied with `answer`.
    pub(crate) fn record(&mut self, id: u64, answer: Answer) {
        self.last_applied = id;
        self.last_answer = Some(answer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_id_is_applied_once_and_a_retry_gets_the_same_answer() {
        let mut ledger = InputLedger::default();
        assert_eq!(ledger.admit(1), Admission::Apply);
        ledger.record(1, Answer::Pending);
        assert_eq!(ledger.admit(1), Admission::Repeat(Answer::Pending));
        assert_eq!(ledger.admit(2), Admission::Apply);
        ledger.record(2, Answer::Done);
        assert_eq!(ledger.admit(1), Admission::Stale);
        assert_eq!(ledger.admit(2), Admission::Repeat(Answer::Done));
    }

    #[test]
    fn a_missing_input_is_named() {
        let ledger = InputLedger::default();
        assert_eq!(ledger.admit(0), Admission::OutOfOrder { expected: 1 });
        assert_eq!(ledger.admit(3), Admission::OutOfOrder { expected: 1 });
    }
}
