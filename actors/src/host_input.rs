//! A host input as data ([`HostInput`]) and what applying it gave ([`InputAnswer`]): what
//! `Session::apply` takes and returns, so one call ties an input to its id.

use crate::agent::Agent;
use crate::events::RunResult;
use crate::history::SessionHistory;
use crate::input_ledger::RecordedAnswer;
use crate::output::SpeechId;
use crate::speech::{SayOptions, SpeechHandle};

/// Every input a host gives a session, as data: [`Session::apply`](crate::Session::apply)
/// applies one with its id, exactly once across restores. Each is what the `Session`
/// method of the same name does.
#[derive(Debug)]
#[non_exhaustive]
pub enum HostInput {
    /// `Session::run`: a user turn from text.
    Run {
        /// What the user said.
        text: String,
    },
    /// `Session::generate_reply`.
    GenerateReply {
        /// Instructions for this reply.
        instructions: Option<String>,
    },
    /// `Session::say_with`.
    Say {
        /// What the agent says.
        text: String,
        /// How.
        options: SayOptions,
    },
    /// `Session::transcript`: an interim or final transcript.
    Transcript {
        /// What the user said.
        text: String,
        /// Whether it is final (a user turn) or interim.
        is_final: bool,
    },
    /// `Session::user_started_speaking`.
    UserStartedSpeaking,
    /// `Session::user_stopped_speaking`.
    UserStoppedSpeaking,
    /// `PlayoutReporter::playout_finished`, for a host whose front reports playout with
    /// the other inputs (a cluster's voice front).
    PlayoutFinished {
        /// The speech.
        speech: SpeechId,
        /// Whether it was cut short.
        interrupted: bool,
        /// What the user heard of it, when cut short.
        heard: Option<String>,
    },
    /// `PlayoutReporter::audio_finished`: the playout of a realtime model's audio ended
    /// after `played` of it.
    AudioFinished {
        /// The speech.
        speech: SpeechId,
        /// Whether it was cut short.
        interrupted: bool,
        /// How much of its audio played.
        played: std::time::Duration,
    },
    /// `Session::interrupt`, or `Session::force_interrupt` with `force`.
    Interrupt {
        /// Even when the speech does not allow interruptions.
        force: bool,
    },
    /// `SpeechHandle::interrupt` of the speech `speech` (`SpeechHandle::force_interrupt`
    /// with `force`), for a host that names the speech by its id (a cluster's gateway,
    /// relaying a call on its handle of a speech played elsewhere): a queued speech leaves
    /// the queue and never plays; a speech under way stops, and its turn with it; every
    /// other speech goes on. A speech that ended, or that the session never made, is left
    /// alone (nothing else is interrupted in its place). Without `force`, a speech that
    /// does not allow interruptions is left alone too.
    InterruptSpeech {
        /// The speech.
        speech: SpeechId,
        /// Even when the speech does not allow interruptions.
        force: bool,
    },
    /// `Session::update_agent`.
    UpdateAgent {
        /// The agent to hand over to.
        agent: Agent,
    },
    /// `Session::history`: a read, answered with the history as it is now.
    History,
    /// An input the host already has the answer of, from a session this one was not
    /// restored from the snapshot of (it took the conversation over after that input was
    /// applied and answered): the id counts as applied, and nothing is applied. A cluster's
    /// gateway sends it in place of such an input, so the input is never applied twice.
    AlreadyAnswered,
}

impl HostInput {
    /// Whether it is a turn (`Run`, `GenerateReply`), which dropping its `apply` future
    /// cancels, as dropping `run` does.
    pub(crate) fn is_turn(&self) -> bool {
        matches!(self, Self::Run { .. } | Self::GenerateReply { .. })
    }
}

/// What [`Session::apply`](crate::Session::apply) gave for an input.
#[derive(Debug)]
#[non_exhaustive]
pub enum InputAnswer {
    /// Applied, nothing to say back (a transcript, the user speaking, a playout report, an
    /// interruption, an agent update, an input already answered).
    Done,
    /// A turn (`Run`, `GenerateReply`) ended: its result.
    Turn(RunResult),
    /// A `Say` was queued: the speech's handle.
    Speech(SpeechHandle),
    /// The history (`History`).
    History(SessionHistory),
    /// The id was applied before — by this session, or by the one whose snapshot it was
    /// restored from — so nothing was applied now: what it answered then, as the ledger
    /// keeps it ([`RecordedAnswer::Unknown`] when it no longer does).
    AppliedEarlier(RecordedAnswer),
}
