//! The ledger of the host inputs a session applied, by id, with what each answered
//! ([`InputLedger`]): what makes a host input apply exactly once across restores
//! (`Session::apply`, SPEC §15 "Every input exactly once, whatever its kind").
//!
//! An input applied with its id is in the ledger from the moment the session applies it.
//! A snapshot writes the ledger with what the inputs changed: an input whose effect is in
//! the snapshot is in its ledger, with its answer once known; one whose effect is not (a
//! `run` or `say` still queued: a queued host job is not in a snapshot) is written as not
//! held, so the restored session applies it when the host sends it again. After a restore
//! an input the ledger holds is answered from it and never applied again, whatever its
//! kind — a turn, a transcript, a read.
//!
//! **The bound.** The ledger keeps the last [`KEEP`] ids with their answers (a host sends
//! its inputs one at a time and asks again only for the one in flight, and, after a move,
//! for those the new owner's snapshot does not hold; 16 is far more than either). Past
//! it, every id at or below the oldest kept one counts as applied, its answer no longer
//! known ([`RecordedAnswer::Unknown`]). An entry whose job still waits in the queue is
//! never forgotten, so the ledger outgrows the bound while the oldest one waits.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::output::SpeechId;

/// How many applied ids the ledger keeps with their answers.
pub(crate) const KEEP: usize = 16;

/// The id a host gives one of its inputs to a session (`Session::apply`): the session
/// applies each id once, across restores. A host numbers its inputs 1, 2, 3, … (a
/// cluster's gateway does); any increasing numbers work.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct InputId(u64);

impl InputId {
    /// Input number `n`.
    pub const fn new(n: u64) -> Self {
        Self(n)
    }

    /// Its number.
    pub const fn get(self) -> u64 {
        self.0
    }
}

/// What an applied input answered, as the session's ledger keeps it (and its snapshots
/// write it): compact, so a snapshot never copies a conversation for it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RecordedAnswer {
    /// Applied, nothing to say back: a transcript, the user speaking, a playout report, an
    /// interruption, an agent update, an input answered elsewhere.
    Done,
    /// A turn ran (`run`, `generate_reply`): its result went to the call that applied it,
    /// and what it added is in the chat.
    Turn,
    /// A `say`, queued as this speech.
    Speech(SpeechId),
    /// A read (the history): answered when it was applied, not kept.
    Read,
    /// Refused or failed, with the error's message.
    Failed(String),
    /// Applied, its answer not known here: a turn under way when the snapshot was taken,
    /// or an id older than those the ledger keeps.
    Unknown,
}

/// One id of the ledger as a snapshot writes it: its answer, or `None` when the snapshot
/// does not hold its effect (apply it again after a restore).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LedgerRecord(pub(crate) u64, pub(crate) Option<RecordedAnswer>);

/// What the session does with an input id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Not applied yet: apply it.
    Apply,
    /// Applied before: answer with this, apply nothing.
    Earlier(RecordedAnswer),
}

/// One id the ledger keeps.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Entry {
    /// Applied: its job waits in the queue (not in a snapshot until it starts).
    Queued,
    /// Applied and in the session's state, with its answer once known.
    In(Option<RecordedAnswer>),
    /// Written as not held by the snapshot this session was restored from: applied by the
    /// session before, but not here. Applied when it comes again.
    NotHeld,
}

/// The ledger: see the module docs. A plain value; the session actor is its one writer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct InputLedger {
    /// Every id up to this one was applied (0: none); their answers are in `entries`
    /// while kept.
    floor: u64,
    /// The ids kept, ascending.
    entries: VecDeque<(u64, Entry)>,
}

impl InputLedger {
    /// The ledger a snapshot wrote: every id up to `last_input` applied, and `records`.
    pub(crate) fn restored(last_input: Option<u64>, records: &[LedgerRecord]) -> Self {
        let mut entries: Vec<(u64, Entry)> = records
            .iter()
            .map(|LedgerRecord(id, answer)| {
                let entry = match answer {
                    Some(answer) => Entry::In(Some(answer.clone())),
                    None => Entry::NotHeld,
                };
                (*id, entry)
            })
            .collect();
        entries.sort_by_key(|(id, _)| *id);
        entries.dedup_by_key(|(id, _)| *id);
        Self {
            floor: last_input.unwrap_or(0),
            entries: entries.into(),
        }
    }

    fn find(&self, id: u64) -> Option<&Entry> {
        let at = self.entries.binary_search_by_key(&id, |(i, _)| *i).ok()?;
        Some(&self.entries[at].1)
    }

    fn find_mut(&mut self, id: u64) -> Option<&mut Entry> {
        let at = self.entries.binary_search_by_key(&id, |(i, _)| *i).ok()?;
        Some(&mut self.entries[at].1)
    }

    /// What input `id` needs.
    pub(crate) fn admit(&self, id: u64) -> Admit {
        match self.find(id) {
            Some(Entry::In(answer)) => {
                Admit::Earlier(answer.clone().unwrap_or(RecordedAnswer::Unknown))
            }
            // Its job waits here: it was applied, its answer comes with the job.
            Some(Entry::Queued) => Admit::Earlier(RecordedAnswer::Unknown),
            Some(Entry::NotHeld) => Admit::Apply,
            None if id <= self.floor => Admit::Earlier(RecordedAnswer::Unknown),
            None => Admit::Apply,
        }
    }

    /// The answer of input `id`, if it was applied.
    pub(crate) fn answer(&self, id: u64) -> Option<RecordedAnswer> {
        match self.admit(id) {
            Admit::Earlier(answer) => Some(answer),
            Admit::Apply => None,
        }
    }

    /// Input `id` is applied: its effect is in the session now, or (`queued`) once the job
    /// it queued starts.
    pub(crate) fn applied(&mut self, id: u64, queued: bool) {
        let entry = if queued {
            Entry::Queued
        } else {
            Entry::In(None)
        };
        match self.entries.binary_search_by_key(&id, |(i, _)| *i) {
            Ok(at) => self.entries[at].1 = entry,
            Err(at) => self.entries.insert(at, (id, entry)),
        }
        self.trim();
    }

    /// The job input `id` queued left the queue (it started, or was dropped before it
    /// could): its effect is in.
    pub(crate) fn job_left_queue(&mut self, id: u64) {
        if let Some(entry @ Entry::Queued) = self.find_mut(id) {
            *entry = Entry::In(None);
        }
        self.trim();
    }

    /// Input `id` answered `answer`.
    pub(crate) fn answered(&mut self, id: u64, answer: RecordedAnswer) {
        match self.find_mut(id) {
            Some(Entry::In(kept)) => *kept = Some(answer),
            // Refused before its job was queued: in, with its refusal.
            Some(entry @ Entry::Queued) if matches!(answer, RecordedAnswer::Failed(_)) => {
                *entry = Entry::In(Some(answer));
            }
            _ => {}
        }
    }

    /// The last id up to which every input is in: the floor, then each id in order while
    /// its effect is in (ids count in the order they were applied; one whose job waits
    /// holds back those after it).
    pub(crate) fn last_input(&self) -> Option<u64> {
        let mut last = self.floor;
        for (id, entry) in &self.entries {
            if *id <= last {
                continue;
            }
            match entry {
                Entry::In(_) => last = *id,
                Entry::Queued | Entry::NotHeld => break,
            }
        }
        (last > 0).then_some(last)
    }

    /// The ledger as a snapshot writes it (with [`last_input`](Self::last_input)).
    pub(crate) fn records(&self) -> Vec<LedgerRecord> {
        self.entries
            .iter()
            .map(|(id, entry)| match entry {
                Entry::In(answer) => {
                    LedgerRecord(*id, Some(answer.clone().unwrap_or(RecordedAnswer::Unknown)))
                }
                Entry::Queued | Entry::NotHeld => LedgerRecord(*id, None),
            })
            .collect()
    }

    /// Forgets the oldest ids past the bound; an entry whose effect is not in stops it.
    fn trim(&mut self) {
        while self.entries.len() > KEEP {
            match self.entries.front() {
                Some((id, Entry::In(_))) => {
                    self.floor = self.floor.max(*id);
                    self.entries.pop_front();
                }
                _ => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_id_is_applied_once_and_answered_from_the_ledger_after() {
        let mut ledger = InputLedger::default();
        assert_eq!(ledger.last_input(), None);
        assert_eq!(ledger.admit(1), Admit::Apply);
        ledger.applied(1, false);
        assert_eq!(ledger.admit(1), Admit::Earlier(RecordedAnswer::Unknown));
        ledger.answered(1, RecordedAnswer::Done);
        assert_eq!(ledger.admit(1), Admit::Earlier(RecordedAnswer::Done));
        assert_eq!(ledger.last_input(), Some(1));
        assert_eq!(ledger.answer(2), None);
    }

    #[test]
    fn a_queued_job_holds_back_the_ids_after_it_and_a_snapshot_marks_it_not_held() {
        let mut ledger = InputLedger::default();
        ledger.applied(1, false);
        ledger.applied(2, true);
        ledger.applied(3, false);
        ledger.answered(3, RecordedAnswer::Done);
        assert_eq!(ledger.last_input(), Some(1));
        // Applied here: a retry of the queued one applies nothing.
        assert_eq!(ledger.admit(2), Admit::Earlier(RecordedAnswer::Unknown));
        let records = ledger.records();
        assert_eq!(
            records,
            [
                LedgerRecord(1, Some(RecordedAnswer::Unknown)),
                LedgerRecord(2, None),
                LedgerRecord(3, Some(RecordedAnswer::Done)),
            ]
        );
        // Restored: 2 is applied again when it comes, 3 is not.
        let restored = InputLedger::restored(ledger.last_input(), &records);
        assert_eq!(restored.admit(2), Admit::Apply);
        assert_eq!(restored.admit(3), Admit::Earlier(RecordedAnswer::Done));
        assert_eq!(restored.admit(1), Admit::Earlier(RecordedAnswer::Unknown));
        assert_eq!(restored.last_input(), Some(1));
        let mut restored = restored;
        restored.applied(2, false);
        assert_eq!(restored.last_input(), Some(3));
        // The job started: the ids after it count.
        ledger.job_left_queue(2);
        assert_eq!(ledger.last_input(), Some(3));
    }

    #[test]
    fn a_refusal_is_kept_as_the_answer() {
        let mut ledger = InputLedger::default();
        ledger.applied(1, true);
        ledger.answered(1, RecordedAnswer::Failed("queue full".into()));
        assert_eq!(
            ledger.admit(1),
            Admit::Earlier(RecordedAnswer::Failed("queue full".into()))
        );
        assert_eq!(ledger.last_input(), Some(1));
    }

    #[test]
    fn past_the_bound_the_oldest_ids_count_as_applied_without_their_answers() {
        let mut ledger = InputLedger::default();
        for id in 1..=40 {
            ledger.applied(id, false);
            ledger.answered(id, RecordedAnswer::Speech(SpeechId(id)));
        }
        assert_eq!(ledger.records().len(), KEEP);
        assert_eq!(ledger.admit(3), Admit::Earlier(RecordedAnswer::Unknown));
        assert_eq!(
            ledger.admit(40),
            Admit::Earlier(RecordedAnswer::Speech(SpeechId(40)))
        );
        assert_eq!(ledger.last_input(), Some(40));
        let restored = InputLedger::restored(ledger.last_input(), &ledger.records());
        assert_eq!(restored, ledger_with_floor(&ledger));
    }

    /// `ledger` as a restore reads it back: its floor is the last input.
    fn ledger_with_floor(ledger: &InputLedger) -> InputLedger {
        InputLedger {
            floor: ledger.last_input().unwrap_or(0),
            entries: ledger.entries.clone(),
        }
    }

    #[test]
    fn a_job_that_waits_keeps_its_entry_past_the_bound() {
        let mut ledger = InputLedger::default();
        ledger.applied(1, true);
        for id in 2..=30 {
            ledger.applied(id, false);
        }
        assert_eq!(ledger.records().len(), 30);
        assert_eq!(ledger.last_input(), None);
        ledger.job_left_queue(1);
        assert_eq!(ledger.records().len(), KEEP);
        assert_eq!(ledger.last_input(), Some(30));
    }
}
