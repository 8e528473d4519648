//! What a gateway and a worker say to each other, as JSON: the job that starts a session,
//! the requests on a session's input subject (inputs, each with its id, and replays of
//! missed events) and their replies, and a worker's counts.
//!
//! Events go the other way as [`WireEvent`]s: the front's
//! [`RemoteEvent`](crate::RemoteEvent)s, and the answers of inputs that take time
//! (`InputDone`), in batches: each message on a session's events subject is a JSON array
//! of consecutive [`WireElement`]s (`worker/event_log.rs`); the subjects are in
//! `namespace.rs`. What they carry of the engine (results, histories, errors, events) is
//! the engine's own types, as serde writes them.
//!
//! **No message over the server's `max_payload`.** An event too big for one message (a
//! close's or a history read's answer carries the whole conversation) travels as parts:
//! its kind's JSON text cut in pieces, each a [`WireElement`] with its own number, which
//! the gateway joins back into the event (`remote_session/events.rs`). Being numbered, a
//! part is ordered, replayed and reported lost like any event.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use switchboard::{RecordedAnswer, RunResult, SessionError, SessionHistory, SpeechId};

use crate::namespace::SessionKey;
use crate::remote_event::{CloseReason, RemoteEventKind};
use crate::spec::{FactoryError, SessionSpec};

/// One event on a session's events subject, numbered by its owner: whole (one sent in
/// parts is joined back into it, see [`WireElement`]).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct WireEvent {
    /// 1, 2, 3, … per owner, without gaps between elements: an event sent in parts has
    /// one number per part, and takes its last part's.
    pub(crate) seq: u64,
    /// The owner's epoch.
    pub(crate) epoch: u64,
    /// What happened.
    pub(crate) kind: WireEventKind,
}

/// What a [`WireEvent`] says: an event the front sees, or the answer of an input whose
/// answer takes time, which goes to the call waiting for it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum WireEventKind {
    /// An event the front sees, as it sees it.
    Event(RemoteEventKind),
    /// A host input whose answer takes time (a turn, a handoff, the history, a close)
    /// has its answer.
    InputDone {
        /// The input's id.
        input: u64,
        /// Its answer.
        outcome: InputOutcome,
    },
}

impl From<RemoteEventKind> for WireEventKind {
    fn from(kind: RemoteEventKind) -> Self {
        Self::Event(kind)
    }
}

/// The answer to a host input that takes time, as [`WireEventKind::InputDone`] carries it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum InputOutcome {
    /// A turn (`run`, `generate_reply`) ended.
    Turn { result: Result<RunResult, Failure> },
    /// An operation with no value (`interrupt`, `update_agent`) ended.
    Done { result: Result<(), Failure> },
    /// The conversation so far (`history`, and `close`, which returns it at the end).
    History { history: SessionHistory },
}

/// Why an input was refused or failed, as the owner says it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "by", rename_all = "snake_case")]
pub(crate) enum Failure {
    /// The session said so: the engine's own error.
    Session { error: SessionError },
    /// The worker's factory could not build the agent asked for.
    Factory { error: FactoryError },
    /// The input was applied before this owner took the session over, and failed; its
    /// ledger kept only the error's message.
    Earlier { message: String },
}

/// An owner keeps the last answer it gave, to give it again to a retry. The engine's
/// errors are not `Clone` (a cause that is not data travels as its message); a copy is
/// made through the serde form, which is what the retry sends anyway.
impl Clone for Failure {
    fn clone(&self) -> Self {
        match self {
            Self::Session { error } => serde_json::to_value(error)
                .and_then(serde_json::from_value)
                .map(|error| Self::Session { error })
                // A derived serde form reads back; should it not, the message stays.
                .unwrap_or_else(|_| Self::Earlier {
                    message: error.to_string(),
                }),
            Self::Factory { error } => Self::Factory {
                error: error.clone(),
            },
            Self::Earlier { message } => Self::Earlier {
                message: message.clone(),
            },
        }
    }
}

impl From<SessionError> for Failure {
    fn from(error: SessionError) -> Self {
        Self::Session { error }
    }
}

/// A session to run, on the jobs subject: to start (from a gateway, with the spec; the
/// session id is its `Nats-Msg-Id`, so a retried publish is dropped by the stream as a
/// duplicate), or to resume from its snapshots (from a draining worker, or a worker that
/// found a worker's lease dead; no spec: the snapshots have it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct SessionJob {
    /// The session's id.
    pub(crate) session: SessionKey,
    /// What to start; none for a resume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) spec: Option<SessionSpec>,
    /// For a resume a gateway asks for because its request to the session's owner found
    /// nobody subscribed ("no responders": the owner's process is gone, its connection
    /// closed): the owner's epoch as the gateway last saw it. The worker that takes the job
    /// checks the owning worker does not answer it either, then fences that worker's lease
    /// and claims the session at once, instead of waiting for the lease to lapse.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) silent: Option<u64>,
}

/// The header an owner stamps its epoch in on every reply: a gateway ignores a reply from
/// an owner older than the newest it has seen (one that should have been fenced).
pub(crate) const EPOCH_HEADER: &str = "Sb-Epoch";

/// A request on `<ns>.session.<id>.in`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "snake_case")]
pub(crate) enum Request {
    /// A host input. Ids are 1, 2, 3, … per session, sent one at a time; a retry repeats
    /// the id, and the owner applies each id once.
    Input {
        /// The input's id.
        id: u64,
        /// The input.
        input: Input,
    },
    /// The events from `from` on that the owner still has (a gateway that missed some).
    Replay {
        /// The first sequence number wanted.
        from: u64,
        /// The epoch the gateway counts `from` in: an owner with a newer epoch numbers
        /// its events afresh, and sends them all.
        #[serde(default)]
        epoch: u64,
    },
}

/// A host input: the host API of a session (what `Session` offers the host), as data.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "input", rename_all = "snake_case")]
pub(crate) enum Input {
    /// `Session::run`: a user turn from text.
    Run { text: String },
    /// `Session::generate_reply`.
    GenerateReply { instructions: Option<String> },
    /// `Session::say_with`.
    Say {
        text: String,
        allow_interruptions: Option<bool>,
        add_to_chat: bool,
    },
    /// `Session::transcript`.
    Transcript { text: String, is_final: bool },
    /// `Session::user_started_speaking`.
    UserStartedSpeaking,
    /// `Session::user_stopped_speaking`.
    UserStoppedSpeaking,
    /// `Session::interrupt` / `force_interrupt`.
    Interrupt { force: bool },
    /// `SpeechHandle::interrupt` / `force_interrupt` of one speech, from a front's handle
    /// of it: that speech alone (queued, it never plays; playing, it stops with its turn);
    /// one that ended is left alone.
    InterruptSpeech { speech: SpeechId, force: bool },
    /// `Session::update_agent` with the agent the worker's factory builds.
    UpdateAgent { agent: String, data: Value },
    /// `PlayoutReporter::playout_finished`, from a voice front.
    PlayoutFinished {
        speech: SpeechId,
        interrupted: bool,
        heard: Option<String>,
    },
    /// `Session::history`.
    History,
    /// `Session::close`.
    Close,
    /// In place of an input whose answer the front already has, sent to an owner that
    /// took the session over from a snapshot that does not hold it: the owner counts its
    /// id and applies nothing (`HostInput::AlreadyAnswered`), so the input is never applied
    /// twice.
    Answered,
}

impl Input {
    /// The input's name, for errors and logs.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::Run { .. } => "run",
            Self::GenerateReply { .. } => "generate_reply",
            Self::Say { .. } => "say",
            Self::Transcript { .. } => "transcript",
            Self::UserStartedSpeaking => "user_started_speaking",
            Self::UserStoppedSpeaking => "user_stopped_speaking",
            Self::Interrupt { .. } => "interrupt",
            Self::InterruptSpeech { .. } => "interrupt_speech",
            Self::UpdateAgent { .. } => "update_agent",
            Self::PlayoutFinished { .. } => "playout_finished",
            Self::History => "history",
            Self::Close => "close",
            Self::Answered => "answered",
        }
    }
}

/// The owner's reply to a [`Request`].
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub(crate) enum Reply {
    /// The input is applied (now, or earlier when this is a retry: the same answer).
    /// `saved`: the last input id the session's stored snapshot holds (the gateway may
    /// forget the inputs up to it: a new owner will have them).
    Applied {
        id: u64,
        answer: Answer,
        #[serde(default)]
        saved: u64,
    },
    /// The input was applied before this owner took the session over (its answer is not
    /// kept); this owner has every input up to `last`.
    Earlier { id: u64, last: u64 },
    /// The session is closing or closed: nothing was applied.
    Closed { reason: CloseReason },
    /// The session is moving to another worker (its worker drains): nothing was applied;
    /// send it again once the new owner has it (`SessionResumed`).
    Moving,
    /// The id is not the next one: this owner needs the inputs from `expected` on first
    /// (the gateway sends them again).
    OutOfOrder { expected: u64 },
    /// Events for a [`Request::Replay`], in order. `complete` is false when more follow
    /// (ask again from after the last one).
    Replay {
        events: Vec<WireElement>,
        complete: bool,
    },
}

/// One element of an events message (a batch, a replay): a whole [`WireEvent`], or a
/// part of one too big for a message. A whole one is written as the [`WireEvent`] is.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct WireElement {
    /// Its number (a part's own; the joined event takes its last part's).
    pub(crate) seq: u64,
    /// The owner's epoch.
    pub(crate) epoch: u64,
    /// The event, when it is whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) kind: Option<WireEventKind>,
    /// The part, when it is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) part: Option<EventPart>,
}

/// A piece of the JSON text of one event's kind (a [`WireEventKind`]); the pieces of one
/// event have consecutive numbers, `index` 0 to `count - 1`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct EventPart {
    pub(crate) index: u32,
    pub(crate) count: u32,
    pub(crate) text: String,
}

/// What an element of an events message is.
#[derive(Debug)]
pub(crate) enum WireBody {
    Whole(WireEventKind),
    Part(EventPart),
}

impl WireElement {
    /// The event or the part it carries (`None`: neither, or both: not ours).
    pub(crate) fn body(self) -> Option<WireBody> {
        match (self.kind, self.part) {
            (Some(kind), None) => Some(WireBody::Whole(kind)),
            (None, Some(part)) => Some(WireBody::Part(part)),
            _ => None,
        }
    }
}

impl From<WireEvent> for WireElement {
    fn from(event: WireEvent) -> Self {
        Self {
            seq: event.seq,
            epoch: event.epoch,
            kind: Some(event.kind),
            part: None,
        }
    }
}

/// What applying an input gave at once.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub(crate) enum Answer {
    /// Done: nothing more comes.
    Done,
    /// Under way: its outcome comes as an `InputDone` event with this input's id.
    Pending,
    /// A `say` was queued as this speech, which allows interruptions or not (the say's
    /// option, or its agent's or session's setting). Answered again from a ledger that
    /// keeps only the speech's id (an owner that took the session over), it reads as
    /// allowing them; the speech's `SpeechCreated`, when it starts, says.
    Speech {
        speech: SpeechId,
        #[serde(default = "allowed")]
        allow_interruptions: bool,
    },
    /// Refused (the factory does not know the agent, the session refused it).
    Failed { failure: Failure },
}

impl Answer {
    /// The answer a session's ledger kept for an input applied before, as the gateway hears
    /// it; `None` when it cannot be told again (a turn's or a read's outcome went out as an
    /// `InputDone` event; an answer not kept).
    pub(crate) fn recorded(recorded: RecordedAnswer) -> Option<Self> {
        match recorded {
            RecordedAnswer::Done => Some(Self::Done),
            RecordedAnswer::Speech(speech) => Some(Self::Speech {
                speech,
                allow_interruptions: allowed(),
            }),
            RecordedAnswer::Failed(message) => Some(Self::Failed {
                failure: Failure::Earlier { message },
            }),
            _ => None,
        }
    }
}

/// A speech's interruptibility when nothing says otherwise.
fn allowed() -> bool {
    true
}

/// A worker's counts, answered on `<ns>.worker.<name>.info`. (A count an older worker
/// does not send reads as 0.)
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct WorkerInfo {
    /// The worker's name.
    pub name: String,
    /// How many sessions it may hold at once.
    pub capacity: usize,
    /// How many it holds now.
    pub live: usize,
    /// The most it ever held at once.
    pub max_live: usize,
    /// Jobs it pulled from the jobs stream (each took a free slot: a start or a resume,
    /// run or refused).
    pub jobs_pulled: u64,
    /// Sessions it started.
    pub started: u64,
    /// Sessions that ended on it.
    pub ended: u64,
    /// Jobs it took that it could not start (claimed elsewhere, a factory error).
    pub refused: u64,
    /// Inputs it applied.
    pub inputs_applied: u64,
    /// Retried inputs it recognised and did not apply again.
    pub inputs_repeated: u64,
    /// Sessions it stopped because another worker took them over (its lease had run
    /// out), without writing anything more.
    pub fenced: u64,
    /// Of the sessions it started, those it resumed from their snapshots (moved off a
    /// draining worker, or left by one that died).
    pub resumed: u64,
    /// Sessions it handed over to other workers at its drain.
    pub moved: u64,
    /// Snapshot writes its sessions did not make: refused by the store (a newer owner
    /// wrote the session) or held back while a lease could not be trusted.
    pub snapshot_writes_refused: u64,
    /// Snapshot messages its sessions wrote to the store (claims, full snapshots, deltas,
    /// ends).
    pub snapshot_writes: u64,
    /// Snapshot writes that did not land, counted as they fail: refused (fenced, or the
    /// lease not trusted) or the store unreachable.
    pub snapshot_write_failures: u64,
    /// Whether it is draining (takes no new sessions).
    pub draining: bool,
}
