//! Which activity owns each speech still going, so the session routes a playout report to
//! that activity alone.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::ids::ActorId;
use crate::output::SpeechId;

/// Speech → the activity that speaks it, from the speech's start to its end. Each
/// activity writes the entries of its own speeches only (disjoint keys); the session reads
/// it when a report comes. A report for a speech that has ended finds no entry and is
/// dropped: a playout report is final once recorded.
#[derive(Default)]
pub(crate) struct SpeechBook(Mutex<HashMap<SpeechId, ActorId>>);

impl SpeechBook {
    /// `speech` started in `activity`.
    pub(crate) fn started(&self, speech: SpeechId, activity: &ActorId) {
        self.lock().insert(speech, activity.clone());
    }

    /// `speech` ended: later reports of it change nothing.
    pub(crate) fn ended(&self, speech: SpeechId) {
        self.lock().remove(&speech);
    }

    /// The activity that speaks `speech`, while it goes on.
    pub(crate) fn owner(&self, speech: SpeechId) -> Option<ActorId> {
        self.lock().get(&speech).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SpeechId, ActorId>> {
        // A map of ids: a panic elsewhere cannot leave it half-written.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}
