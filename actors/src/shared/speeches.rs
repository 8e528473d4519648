//! Which activity owns each speech still going, so the session routes a playout report to
//! that activity alone; and, from the same entries, whether the agent holds the floor (some
//! speech plays), which the session reads to judge the user's words over it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

use crate::ids::ActorId;
use crate::output::SpeechId;
use crate::speech::Interruptibility;

/// Speech → the activity that speaks it, from the speech's start to its end. Each
/// activity writes the entries of its own speeches only (disjoint keys); the session reads
/// it when a report comes. A report for a speech that has ended finds no entry and is
/// dropped: a playout report is final once recorded.
#[derive(Default)]
pub(crate) struct SpeechBook(Mutex<Book>);

#[derive(Default)]
struct Book {
    playing: HashMap<SpeechId, Playing>,
    /// When the floor was last taken (no speech playing → one): kept after it ends.
    taken: Option<Instant>,
    /// When the floor was last given back (the last speech ended); none while it is held.
    given_back: Option<Instant>,
}

struct Playing {
    activity: ActorId,
    interruptibility: Arc<Interruptibility>,
}

/// The agent holds the floor: some speech of the session plays (from its first text to
/// its playout report).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Floor {
    /// Since when (the first of the speeches playing now started).
    pub(crate) since: Instant,
    /// Whether every speech playing may be interrupted now.
    pub(crate) interruptible: bool,
}

/// When the agent last began and stopped speaking (for a dynamic endpointing delay).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct AgentSpeech {
    /// The last time the floor was taken.
    pub(crate) started: Option<Instant>,
    /// The last time it was given back; none while it is held.
    pub(crate) ended: Option<Instant>,
}

impl SpeechBook {
    /// `speech` started in `activity`, interruptible as `interruptibility` says.
    pub(crate) fn started(
        &self,
        speech: SpeechId,
        activity: &ActorId,
        interruptibility: &Arc<Interruptibility>,
    ) {
        let mut book = self.lock();
        if book.playing.is_empty() {
            book.taken = Some(Instant::now());
            book.given_back = None;
        }
        book.playing.insert(
            speech,
            Playing {
                activity: activity.clone(),
                interruptibility: interruptibility.clone(),
            },
        );
    }

    /// `speech` ended: later reports of it change nothing.
    pub(crate) fn ended(&self, speech: SpeechId) {
        let mut book = self.lock();
        if book.playing.remove(&speech).is_some() && book.playing.is_empty() {
            book.given_back = Some(Instant::now());
        }
    }

    /// The activity that speaks `speech`, while it goes on.
    pub(crate) fn owner(&self, speech: SpeechId) -> Option<ActorId> {
        self.lock().playing.get(&speech).map(|p| p.activity.clone())
    }

    /// The floor, while the agent holds it.
    pub(crate) fn floor(&self) -> Option<Floor> {
        let book = self.lock();
        if book.playing.is_empty() {
            return None;
        }
        Some(Floor {
            since: book.taken.unwrap_or_else(Instant::now),
            interruptible: book.playing.values().all(|p| p.interruptibility.allows()),
        })
    }

    /// When the agent last began and stopped speaking.
    pub(crate) fn agent_speech(&self) -> AgentSpeech {
        let book = self.lock();
        AgentSpeech {
            started: book.taken,
            ended: book.given_back,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Book> {
        // A map of ids and two instants: a panic elsewhere cannot leave it half-written.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}
