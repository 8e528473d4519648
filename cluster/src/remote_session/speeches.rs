//! `Speeches`: the handles a remote session gives its front, one per speech, each linked to
//! the session (its `interrupt` asks the owner to interrupt that speech) and ended when the
//! session's events say the speech ended.
//!
//! A front meets a speech in the answer of the `say` that queued it, in its
//! `SpeechCreated` event, or both. The two travel apart (a reply and an event) and either
//! may be read first, so both get the same handle, made at the first sighting. A speech
//! whose end was read before its handle was asked for (a short `say`, whose events came in
//! before its answer) gets a handle that has ended, from the newest ended speeches kept.
//! A new owner numbers speeches from its snapshot, so a number may come again: at a move
//! the speeches still going end (interrupted, heard unknown: the old owner took them
//! along), and the ended ones are forgotten.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use switchboard::{SpeechControl, SpeechHandle, SpeechId, SpeechOutcome, SpeechReport};

/// How many ended speeches are kept for a handle asked for after its speech's end.
const ENDED_KEPT: usize = 64;

/// A remote session's speech handles.
pub(super) struct Speeches {
    /// What every handle interrupts its speech through.
    control: Arc<dyn SpeechControl>,
    /// The speeches not ended yet: each handle, and the report that ends it.
    going: HashMap<SpeechId, (SpeechHandle, SpeechReport)>,
    /// The newest ended speeches' handles, oldest first.
    ended: VecDeque<SpeechHandle>,
}

impl Speeches {
    pub(super) fn new(control: Arc<dyn SpeechControl>) -> Self {
        Self {
            control,
            going: HashMap::new(),
            ended: VecDeque::new(),
        }
    }

    /// The handle of `speech`, made at its first sighting with `allow_interruptions` (a
    /// `say`'s answer says what the speech allows).
    pub(super) fn link(&mut self, speech: SpeechId, allow_interruptions: bool) -> SpeechHandle {
        if let Some((handle, _)) = self.going.get(&speech) {
            return handle.clone();
        }
        if let Some(handle) = self.ended.iter().find(|h| h.id() == speech) {
            return handle.clone();
        }
        let (handle, report) =
            SpeechHandle::remote(speech, allow_interruptions, self.control.clone());
        self.going.insert(speech, (handle.clone(), report));
        handle
    }

    /// The speech's `SpeechCreated` names `named` (read back from the wire, linked to
    /// nothing): its linked handle, which allows interruptions as the speech does.
    pub(super) fn created(&mut self, named: &SpeechHandle) -> SpeechHandle {
        let allow = named.allow_interruptions();
        let handle = self.link(named.id(), allow);
        handle.set_allow_interruptions(allow);
        handle
    }

    /// The speech ended (its `SpeechPlayedOut`): its handle says how from now on.
    pub(super) fn ended(&mut self, speech: SpeechId, outcome: SpeechOutcome) {
        let handle = match self.going.remove(&speech) {
            Some((handle, report)) => {
                report.ended(outcome);
                handle
            }
            None if self.ended.iter().any(|h| h.id() == speech) => return,
            // Not met yet: kept ended, for the `say` whose answer is still on its way.
            None => {
                let (handle, report) = SpeechHandle::remote(speech, true, self.control.clone());
                report.ended(outcome);
                handle
            }
        };
        if self.ended.len() == ENDED_KEPT {
            self.ended.pop_front();
        }
        self.ended.push_back(handle);
    }

    /// A new owner took the session over: the speeches still going end (interrupted, heard
    /// unknown), and the ended ones are forgotten, since the new owner may number a speech
    /// as one of them.
    pub(super) fn moved(&mut self) {
        self.end_all();
    }

    /// The session ended: the speeches still going end (interrupted, heard unknown).
    pub(super) fn closed(&mut self) {
        self.end_all();
    }

    fn end_all(&mut self) {
        for (_, (_, report)) in self.going.drain() {
            report.ended(SpeechOutcome::Interrupted { heard: None });
        }
        self.ended.clear();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use std::sync::Mutex;

    use super::*;

    /// Records the interruptions asked for.
    #[derive(Default)]
    struct Asked(Mutex<Vec<(SpeechId, bool)>>);

    impl SpeechControl for Asked {
        fn interrupt(&self, speech: SpeechId, force: bool) {
            self.0.lock().unwrap().push((speech, force));
        }
    }

    fn id(n: u64) -> SpeechId {
        serde_json::from_value(serde_json::json!(n)).unwrap()
    }

    fn named(n: u64, allow: bool) -> SpeechHandle {
        serde_json::from_value(serde_json::json!({ "id": n, "allow_interruptions": allow }))
            .unwrap()
    }

    fn speeches() -> (Speeches, Arc<Asked>) {
        let asked = Arc::new(Asked::default());
        (Speeches::new(asked.clone()), asked)
    }

    #[test]
    fn a_say_s_answer_and_its_event_give_one_handle_whichever_comes_first() {
        let (mut speeches, asked) = speeches();
        let said = speeches.link(id(1), true);
        let created = speeches.created(&named(1, true));
        let event_first = speeches.created(&named(2, true));
        let said_later = speeches.link(id(2), true);
        created.interrupt().unwrap();
        said_later.interrupt().unwrap();
        assert_eq!(*asked.0.lock().unwrap(), [(id(1), false), (id(2), false)]);
        speeches.ended(id(1), SpeechOutcome::Played);
        speeches.ended(
            id(2),
            SpeechOutcome::Interrupted {
                heard: Some("One".into()),
            },
        );
        assert_eq!(said.outcome(), Some(SpeechOutcome::Played));
        assert_eq!(
            event_first.outcome(),
            Some(SpeechOutcome::Interrupted {
                heard: Some("One".into())
            })
        );
    }

    #[test]
    fn the_event_says_whether_the_speech_allows_interruptions() {
        let (mut speeches, asked) = speeches();
        let said = speeches.link(id(1), true);
        speeches.created(&named(1, false));
        assert!(said.interrupt().is_err());
        said.force_interrupt();
        assert_eq!(*asked.0.lock().unwrap(), [(id(1), true)]);
    }

    #[test]
    fn a_handle_asked_for_after_its_speech_ended_has_ended_and_asks_nothing() {
        let (mut speeches, asked) = speeches();
        speeches.created(&named(1, true));
        speeches.ended(id(1), SpeechOutcome::Played);
        // A speech never created (a queued one interrupted) ends too.
        let heard_nothing = SpeechOutcome::Interrupted {
            heard: Some(String::new()),
        };
        speeches.ended(id(2), heard_nothing.clone());
        let late = speeches.link(id(1), true);
        assert_eq!(late.outcome(), Some(SpeechOutcome::Played));
        late.interrupt().unwrap();
        assert_eq!(speeches.link(id(2), true).outcome(), Some(heard_nothing));
        assert!(
            asked.0.lock().unwrap().is_empty(),
            "an ended speech asks nothing"
        );
    }

    #[test]
    fn at_a_move_the_speeches_going_end_and_their_numbers_are_free_again() {
        let (mut speeches, _) = speeches();
        let going = speeches.link(id(1), true);
        speeches.created(&named(2, true));
        speeches.ended(id(2), SpeechOutcome::Played);
        speeches.moved();
        assert_eq!(
            going.outcome(),
            Some(SpeechOutcome::Interrupted { heard: None })
        );
        assert!(!speeches.link(id(1), true).is_done(), "a new speech 1");
        assert!(!speeches.link(id(2), true).is_done(), "a new speech 2");
    }

    #[test]
    fn only_the_newest_ended_speeches_are_kept() {
        let (mut speeches, _) = speeches();
        for n in 1..=ENDED_KEPT as u64 + 1 {
            speeches.ended(id(n), SpeechOutcome::Played);
        }
        assert_eq!(speeches.ended.len(), ENDED_KEPT);
        assert!(!speeches.link(id(1), true).is_done(), "forgotten");
        assert!(speeches.link(id(2), true).is_done());
    }
}
