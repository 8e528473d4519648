//! `InputLedger`: which host inputs a session has applied, so a retried input is answered
//! again instead of applied again.
//!
//! A gateway numbers a session's inputs 1, 2, 3, … and sends the next only after the
//! previous one was answered, so the owner needs only the last applied id and its answer:
//! the next id is applied, the last one is answered again (a retry whose first answer was
//! lost), an older one is answered as applied earlier, and a later one means inputs went
//! missing. A session resumed from its snapshot starts from the snapshot's last input id
//! (`SessionSnapshot::last_input`: every input up to it is in the snapshot), without its
//! answer: the old owner gave it. The session's own ledger (`Session::applied`) is what
//! answers an earlier id when it keeps the answer, and what spots an input after that id
//! that the snapshot holds all the same (it is answered from there, not applied again).

use crate::protocol::Answer;

/// What to do with an input id.
#[derive(Debug)]
pub(crate) enum Admission {
    /// The next input: apply it, then [`InputLedger::record`] its answer.
    Apply,
    /// A retry of the last input: send this answer again, apply nothing.
    Repeat(Answer),
    /// Applied earlier (by this owner, or in the snapshot it resumed from) and its answer
    /// is not kept: apply nothing; this owner has every input up to `last`.
    Earlier {
        /// The last applied id.
        last: u64,
    },
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
    /// The ledger of a session resumed from a snapshot holding inputs up to `last`.
    pub(crate) fn resumed(last: u64) -> Self {
        Self {
            last_applied: last,
            last_answer: None,
        }
    }

    /// Decides what input `id` needs.
    pub(crate) fn admit(&self, id: u64) -> Admission {
        if id == self.last_applied + 1 {
            Admission::Apply
        } else if id == self.last_applied && id > 0 {
            match &self.last_answer {
                Some(answer) => Admission::Repeat(answer.clone()),
                None => Admission::Earlier {
                    last: self.last_applied,
                },
            }
        } else if id < self.last_applied {
            Admission::Earlier {
                last: self.last_applied,
            }
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
        assert!(matches!(ledger.admit(1), Admission::Apply));
        ledger.record(1, Answer::Pending);
        assert!(matches!(
            ledger.admit(1),
            Admission::Repeat(Answer::Pending)
        ));
        assert!(matches!(ledger.admit(2), Admission::Apply));
        ledger.record(2, Answer::Done);
        assert!(matches!(ledger.admit(1), Admission::Earlier { last: 2 }));
        assert!(matches!(ledger.admit(2), Admission::Repeat(Answer::Done)));
    }

    #[test]
    fn a_missing_input_is_named() {
        let ledger = InputLedger::default();
        assert!(matches!(
            ledger.admit(0),
            Admission::OutOfOrder { expected: 1 }
        ));
        assert!(matches!(
            ledger.admit(3),
            Admission::OutOfOrder { expected: 1 }
        ));
    }

    #[test]
    fn a_resumed_session_goes_on_after_its_snapshot_and_knows_no_answer_before() {
        let ledger = InputLedger::resumed(7);
        assert!(matches!(ledger.admit(8), Admission::Apply));
        assert!(matches!(ledger.admit(7), Admission::Earlier { last: 7 }));
        assert!(matches!(ledger.admit(3), Admission::Earlier { last: 7 }));
        assert!(matches!(
            ledger.admit(9),
            Admission::OutOfOrder { expected: 8 }
        ));
    }
}
