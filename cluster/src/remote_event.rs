//! What a session says to its front, across machines: [`RemoteEvent`]s, each with its
//! sequence number and its owner's epoch. What the engine says is the engine's own
//! [`SessionEvent`], as a local session's subscriber gets it; beside it come the speech
//! the session streams to its output (what a local `SpeechOutput` is told) and the
//! cluster's own lifecycle (started, moving, resumed, closed, events lost).

use serde::{Deserialize, Serialize};
use switchboard::{SessionEvent, SpeechId};

/// One event of a remote session, in the order the owner published it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RemoteEvent {
    /// 1, 2, 3, … per session, without gaps: the gateway delivers them in this order,
    /// once each, asking the owner again for any it missed. Each owner numbers the
    /// events it publishes from 1; the gateway numbers what it delivers, so the numbers
    /// go on across a move to another owner.
    pub seq: u64,
    /// The owner's epoch when it published: a higher epoch means a newer owner, whose
    /// events win over a stale one's.
    pub epoch: u64,
    /// What happened.
    pub kind: RemoteEventKind,
}

/// What happened in a remote session: an event of the engine ([`SessionEvent`], as a
/// local session sends it), the speech the session streams to its output, or the
/// cluster's own lifecycle.
///
/// New kinds may be added: match with a wildcard arm.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum RemoteEventKind {
    /// What the engine said: every [`SessionEvent`] of the session, as a local session's
    /// subscriber gets it. A speech's handle in it (`SpeechCreated`) is linked to the
    /// remote session: interrupting it asks the worker, and it learns how the speech
    /// ended from the session's `SpeechPlayedOut`.
    Session {
        /// The event.
        event: SessionEvent,
    },
    /// A worker owns the session and it runs: the first event of every session.
    SessionStarted,
    /// No worker could start the session (its spec names an unknown agent, the factory
    /// failed, its id was taken); no event follows.
    StartFailed {
        /// Why.
        reason: String,
    },
    /// Its worker drains: the session settled (or was interrupted at the drain's
    /// deadline), its last snapshot is stored, and it is moving to another worker. Inputs
    /// sent meanwhile wait for the new owner; `SessionResumed` follows.
    SessionMoving,
    /// A new owner runs the session, restored from its last snapshot (after a drain, or
    /// because the worker before died or lost its lease): the first event of that owner,
    /// at a higher epoch. The snapshot held every input up to `last_input`; the gateway
    /// sends the later ones again. A turn that was under way runs again.
    SessionResumed {
        /// The last input id the restored snapshot holds (0: none).
        last_input: u64,
    },
    /// The session is closed on its worker: the last event.
    SessionClosed {
        /// Why it closed.
        reason: CloseReason,
    },
    /// Events the gateway could not get back after an outage (the owner no longer had
    /// them): `from..=to` are missing. Delivered with `seq == to`.
    EventsLost {
        /// The first missing sequence number.
        from: u64,
        /// The last missing one.
        to: u64,
    },
    /// The worker fell behind the session's own event channel and missed this many.
    EventsDropped {
        /// How many.
        missed: u64,
    },

    /// Speech output: a speech starts (what a TTS begins).
    SpeechStarted {
        /// The speech.
        speech: SpeechId,
        /// The agent speaking.
        agent: String,
    },
    /// Speech output: a piece of a speech's text, in order.
    SpeechChunk {
        /// The speech.
        speech: SpeechId,
        /// The text.
        text: String,
    },
    /// Speech output: the speech's text is complete. A voice front reports its playout
    /// with `RemoteSession::playout_finished` once the audio ends.
    SpeechFinished {
        /// The speech.
        speech: SpeechId,
    },
    /// Speech output: stop playing this speech now, then report what was heard.
    SpeechInterrupted {
        /// The speech.
        speech: SpeechId,
    },
    /// Speech output: pause this speech (the user talks over it).
    SpeechPaused {
        /// The speech.
        speech: SpeechId,
    },
    /// Speech output: resume a paused speech (the interruption was false).
    SpeechResumed {
        /// The speech.
        speech: SpeechId,
    },
}

/// Why a session closed on its worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
#[non_exhaustive]
pub enum CloseReason {
    /// The host closed it (`close`, or its last handle was dropped), or it never started.
    Host,
    /// Its worker drained (a deploy, a scale-down) and no other took it: the session
    /// settled, or was interrupted at the drain's deadline, and closed.
    Drained,
    /// No input came for the worker's idle timeout.
    Idle,
    /// Its worker lost ownership (its lease expired and another owner took it): it
    /// stopped without writing anything more.
    Fenced,
}
