//! A turn of an activity as plain data, and the decisions about it that depend on nothing
//! but their arguments: which of a step's calls may not run, and what follows a step once
//! its outputs are in. The activation machine (`activation.rs`) owns the turn and asks.
//!
//! Decisions, each with a unit test below:
//! - One size rule for everything a model sends ([`bound_call`], [`bound_text`]): each
//!   part has a limit — a call id or a tool name [`MAX_NAME_BYTES`], a call's arguments
//!   `max_argument_bytes`, a step's text `max_reply_bytes` — checked as the part arrives,
//!   before anything keeps it. A part over its limit never enters the chat whole: an id
//!   is cut (ids are the engine's to choose, and the call still runs); a name becomes
//!   its first 60 bytes, marked `_cut`, in the characters providers accept in a tool
//!   name (they check the names in a request's history too: a stand-in they reject would
//!   fail every later request); arguments become a short JSON stand-in saying their size
//!   and that they were left out; text stops at the limit and fails the turn. What stays
//!   is bounded, so every later request stays small.
//! - A call is refused, in this order of reasons, when the request allowed no tools, when
//!   the step already has `max_calls_per_step` calls, or when its name or arguments were
//!   over their limit: each gets an error output and nothing runs. Only the first two
//!   ask for nothing more (answering a model that called where it may not would let it
//!   loop); an oversized call reads as an error the model can act on.
//! - After a committed step, another LLM step runs only if some output asks for a reply,
//!   nothing ends the turn (a handoff, a task completion, a propagated failure, an
//!   interruption, a pause or close), and steps remain. A step ends its agent at most once.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::chat::{ChatItem, FunctionCall};
use crate::error::{SessionError, TurnFailure};
use crate::handoff::Handoff;
use crate::latency::TurnLatency;
use crate::llm::{LlmUsage, ToolCallChunk, ToolChoice};
use crate::outcome::{excerpt, CallOutput, Effect, QUOTE_LIMIT};
use crate::speech::{Interruptibility, SpeechHandle};
use crate::telemetry::Cause;
use crate::usage::Usage;

use super::latency::TurnTimer;

/// Which toolset runs a tool: an index into the activity's list of toolsets it sees (its
/// own first, then the session's), so the machine names a toolset without holding one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ToolsetKey(pub(crate) usize);

/// What kind of turn to run.
#[derive(Debug)]
pub(crate) enum TurnKind {
    /// A user message.
    User(String),
    /// The user's turn as a realtime model heard it (its server detected the end of the
    /// user's speech, item `item`, and is answering): the user's words as transcribed so
    /// far (empty until the transcript comes), and the first step adopts the answer the
    /// server started.
    Heard { item: String, text: String },
    /// A reply with optional extra instructions (`generate_reply`).
    Reply(Option<String>),
    /// The coalesced reply to the tool items pending in the activity.
    Deferred,
    /// A step that was in flight when the session was snapshotted, asked again after the
    /// restore (the user's message is in the chat already).
    Redo(Redo),
    /// A text the agent says as it is (`Session::say`).
    Say {
        text: String,
        speech: SpeechHandle,
        add_to_chat: bool,
    },
    /// Words the user said over the agent that made no turn, kept in the chat as the host
    /// asked (`Backchannel::keep_in_transcript`): a user message, no reply.
    Backchannel(String),
    /// The user spoke past the user-turn limit: their words so far, answered at once by a
    /// reply under `instructions` that the user cannot interrupt.
    CutIn {
        text: String,
        instructions: Arc<str>,
    },
}

impl TurnKind {
    /// A short name, for spans and logs.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::User(_) => "user",
            Self::Heard { .. } => "heard",
            Self::Reply(_) => "reply",
            Self::Deferred => "deferred",
            Self::Redo(_) => "redo",
            Self::Say { .. } => "say",
            Self::Backchannel(_) => "backchannel",
            Self::CutIn { .. } => "cut_in",
        }
    }
}

/// What a finished turn reports to the session.
#[derive(Debug, Default)]
pub(crate) struct TurnOutcome {
    pub(crate) events: Vec<ChatItem>,
    pub(crate) handoff: Option<Handoff>,
    pub(crate) task_result: Option<Value>,
    pub(crate) failure: Option<SessionError>,
    pub(crate) interrupted: bool,
    /// With a handoff: the turn's span, the handoff's parent (telemetry).
    pub(crate) cause: Cause,
    /// What its LLM requests used and how fast it answered, set as it ends. Boxed: a
    /// turn's phase holds an outcome, moved at every step, and most are placeholders.
    pub(crate) report: Option<Box<TurnReport>>,
}

/// What a turn used and how fast it answered.
#[derive(Debug, Default)]
pub(crate) struct TurnReport {
    pub(crate) usage: Usage,
    pub(crate) latency: TurnLatency,
}

impl TurnOutcome {
    pub(crate) fn failed(failure: SessionError) -> Self {
        Self {
            failure: Some(failure),
            ..Self::default()
        }
    }
}

/// Who waits for an interruption to take effect: answered once the turn has ended (or at
/// once, refused, when it may not be interrupted).
pub(crate) type InterruptWaiter = oneshot::Sender<Result<(), SessionError>>;

/// A turn in flight. It exists only inside the states that run one (running, paused,
/// closing), so "a turn without its activity" cannot be built.
pub(crate) struct Turn {
    /// What the turn added, for its `RunResult`.
    pub(crate) events: Vec<ChatItem>,
    /// LLM steps taken so far.
    pub(crate) steps: u32,
    /// What each of its LLM requests asks.
    pub(crate) ask: Ask,
    /// Sticky: set by the first interruption; no further step runs.
    pub(crate) interrupted: bool,
    /// Whether the turn may be interrupted now (shared with its speeches and calls).
    pub(crate) interruptibility: Arc<Interruptibility>,
    /// The turn's speeches, oldest first (done or still playing).
    pub(crate) speeches: Vec<SpeechHandle>,
    /// The session's `StartTurn`, answered once when the turn ends.
    pub(crate) done: oneshot::Sender<TurnOutcome>,
    /// Interruptions waiting for the turn to end.
    pub(crate) waiters: Vec<InterruptWaiter>,
    /// `turn` span (session, agent, kind): the parent of its LLM requests' spans.
    pub(crate) span: tracing::Span,
    /// Its latency: when it was asked for, its first text, its tool waits.
    pub(crate) timer: TurnTimer,
    /// What its LLM requests used so far.
    pub(crate) usage: Usage,
    pub(crate) phase: Phase,
}

impl Turn {
    /// The latest speech still playing, if any.
    pub(crate) fn playing(&self) -> Option<&SpeechHandle> {
        self.speeches.iter().rev().find(|s| !s.is_done())
    }

    /// Whether the user may interrupt it now.
    pub(crate) fn interruptible(&self) -> bool {
        !self.interrupted && self.interruptibility.allows()
    }

    /// Whether `speech` is one of its speeches.
    pub(crate) fn owns(&self, speech: crate::output::SpeechId) -> bool {
        self.speeches.iter().any(|s| s.id() == speech)
    }
}

/// What a turn's LLM requests ask for, besides the chat context. Written into snapshots
/// as it is (a step under way asks it again).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Ask {
    pub(crate) tool_choice: ToolChoice,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) extra_instructions: Option<String>,
    /// The later tool items a deferred reply answers (empty for other turns).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) deferred_call_ids: Vec<String>,
}

/// An LLM step whose model had not finished answering when the session was snapshotted
/// (its calls, if any came, not started): asked again after the restore, under the same
/// step id, and — when its text had begun — spoken under the same speech id (the
/// snapshot's counters already count both).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Redo {
    pub(crate) step: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) speech: Option<u64>,
    /// What the output reported of that speech while its text still streamed: the first
    /// report is final, so the step asked again applies it when its stream ends, as the
    /// step would have.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) heard: Option<EarlyReport>,
    /// The chat length the step was first asked from. Asked again, the step sees what
    /// landed since (a background call's end), but its answer counts as generated from
    /// this length, as it would have: a deferred reply those items asked for is still due.
    pub(crate) view: usize,
    pub(crate) ask: Ask,
}

/// A playout report that came while its speech's text still streamed.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct EarlyReport {
    pub(crate) interrupted: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) heard: Option<String>,
}

/// Where a turn is.
pub(crate) enum Phase {
    /// The model streams the answer of one step.
    Generating(Generation),
    /// The step's calls wait for their immediate outputs (the ledger holds them).
    Calling {
        step: u64,
        toolsets: Vec<ToolsetKey>,
    },
    /// The turn is over; its speeches still play. An interrupted turn gives up waiting
    /// for the output to report what was heard at `give_up_at`.
    Playing {
        outcome: TurnOutcome,
        give_up_at: Option<Instant>,
    },
}

/// One LLM request being consumed.
pub(crate) struct Generation {
    pub(crate) step: u64,
    /// The `llm_request` span (its `speech` field is set when the speech starts).
    pub(crate) span: tracing::Span,
    /// Chat length the request was made from.
    pub(crate) view: usize,
    pub(crate) started: Instant,
    pub(crate) first_chunk: Option<Duration>,
    pub(crate) text: String,
    pub(crate) text_chunks: u32,
    /// The step's calls as they arrived, each already bounded ([`bound_call`]).
    pub(crate) calls: Vec<ModelCall>,
    pub(crate) speech: Option<SpeechHandle>,
    pub(crate) usage: Option<LlmUsage>,
    /// The model a wrapper said serves the request (`LlmChunk::ServedBy`).
    pub(crate) llm: Option<String>,
    /// A playout report that came while the text still streamed: applied at the end.
    pub(crate) early_report: Option<(bool, Option<String>)>,
    /// For a step asked again after a restore whose text had begun: the id its speech had.
    pub(crate) redone_speech: Option<u64>,
}

impl Generation {
    /// A request of step `step`, made from a chat of `view` items at `started`; nothing
    /// received yet but, for a request taken over, its first chunk's time.
    pub(crate) fn new(
        step: u64,
        span: tracing::Span,
        view: usize,
        started: Instant,
        first_chunk: Option<Duration>,
    ) -> Self {
        Self {
            step,
            span,
            view,
            started,
            first_chunk,
            text: String::new(),
            text_chunks: 0,
            calls: Vec::new(),
            speech: None,
            usage: None,
            llm: None,
            early_report: None,
            redone_speech: None,
        }
    }
}

/// How a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ending {
    /// The stream ended on its own.
    Complete,
    /// The stream failed or timed out: what was said plays out.
    Failed,
    /// The turn was interrupted, paused or closed: the output is told to stop.
    Cut,
}

/// How much a model may send in one step: the limits of the size rule (see the module
/// docs) and how many calls run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct InputLimits {
    pub(crate) max_calls_per_step: usize,
    pub(crate) max_argument_bytes: usize,
    pub(crate) max_reply_bytes: usize,
}

/// The longest call id or tool name kept from the model. No tool may have a longer name
/// (`BuildError::InvalidToolName` allows 1–64 ASCII characters, as providers do), and ids
/// name actors and travel in every request (`call_ids.rs` cuts them to the same length).
pub(crate) const MAX_NAME_BYTES: usize = 64;

/// The part of a call that was over its limit, with the size the model sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Oversized {
    Name { bytes: usize },
    Arguments { bytes: usize },
}

/// A call as the model sent it, bounded: what goes into the chat, and what was cut.
#[derive(Debug)]
pub(crate) struct ModelCall {
    pub(crate) chunk: ToolCallChunk,
    pub(crate) oversized: Option<Oversized>,
}

/// Applies the size rule to a call as it arrives (see the module docs): an id over
/// [`MAX_NAME_BYTES`] is cut; a name over it becomes [`name_stand_in`], and the call is
/// refused; arguments
/// over `max_argument_bytes` become a JSON stand-in, and the call is refused. The name
/// is checked first: a call refused for its name keeps arguments within their limit.
pub(crate) fn bound_call(mut chunk: ToolCallChunk, limits: &InputLimits) -> ModelCall {
    if chunk.call_id.len() > MAX_NAME_BYTES {
        let end = char_floor(&chunk.call_id, MAX_NAME_BYTES);
        chunk.call_id.truncate(end);
    }
    let mut oversized = None;
    if chunk.name.len() > MAX_NAME_BYTES {
        oversized = Some(Oversized::Name {
            bytes: chunk.name.len(),
        });
        chunk.name = name_stand_in(&chunk.name);
    }
    let max = limits.max_argument_bytes;
    if chunk.arguments.len() > max {
        let bytes = chunk.arguments.len();
        oversized.get_or_insert(Oversized::Arguments { bytes });
        chunk.arguments = serde_json::json!({
            "omitted": format!("{bytes} bytes of arguments, over the limit of {max}; the call did not run")
        })
        .to_string();
    }
    ModelCall { chunk, oversized }
}

/// What a tool name over [`MAX_NAME_BYTES`] leaves in the chat: its first 60 bytes, each
/// character providers do not accept in a name (`^[a-zA-Z0-9_-]{1,64}$`, checked in a
/// request's history too) as `_`, then `_cut`. The call is refused for its size whatever
/// tool the stand-in may look like.
pub(crate) fn name_stand_in(name: &str) -> String {
    const MARK: &str = "_cut";
    let kept = &name[..char_floor(name, MAX_NAME_BYTES - MARK.len())];
    let mut stand_in: String = kept
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    stand_in.push_str(MARK);
    stand_in
}

/// Applies the size rule to a chunk of a step's text, given how much of it came before:
/// the part of `text` that fits within `max_reply_bytes` (cut on a character boundary),
/// and whether the step went over.
#[inline]
pub(crate) fn bound_text<'a>(
    text: &'a str,
    before: usize,
    limits: &InputLimits,
) -> (&'a str, bool) {
    // The per-token path: one comparison when the text fits.
    let room = limits.max_reply_bytes.saturating_sub(before);
    if text.len() <= room {
        return (text, false);
    }
    over_the_limit(text, room)
}

#[cold]
fn over_the_limit(text: &str, room: usize) -> (&str, bool) {
    (&text[..char_floor(text, room)], true)
}

/// The largest character boundary of `text` at or below `at`.
fn char_floor(text: &str, at: usize) -> usize {
    let mut end = at.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    end
}

/// The output of call number `index` of a step when it may not run, or `None` when it
/// may (see the module docs for the rule). `oversized` is what [`bound_call`] cut.
pub(crate) fn refusal(
    call: &FunctionCall,
    oversized: Option<Oversized>,
    index: usize,
    tool_choice: ToolChoice,
    limits: &InputLimits,
) -> Option<CallOutput> {
    let name = excerpt(&call.name, QUOTE_LIMIT);
    if tool_choice == ToolChoice::None {
        return Some(CallOutput::refused(format!(
            "Error: no tool may be called in this reply; {name} did not run."
        )));
    }
    let limit = limits.max_calls_per_step;
    if index >= limit {
        return Some(CallOutput::refused(format!(
            "Error: too many tool calls in one step (at most {limit}); {name} did not run."
        )));
    }
    match oversized? {
        Oversized::Name { bytes } => Some(CallOutput::error(format!(
            "Error: the tool name was {bytes} bytes, over the limit of {MAX_NAME_BYTES} (shown cut, as {name}); it did not run."
        ))),
        Oversized::Arguments { bytes } => Some(CallOutput::error(format!(
            "Error: the arguments for {name} are {bytes} bytes, over the limit of {}; it did not run.",
            limits.max_argument_bytes
        ))),
    }
}

/// What a committed step's outputs ask for.
#[derive(Debug, Default)]
pub(crate) struct StepEnd {
    /// Some output is a value the model should answer.
    pub(crate) wants_reply: bool,
    /// What the turn reports if it ends here (a handoff, a task result, a failure).
    pub(crate) outcome: TurnOutcome,
    /// The failures routed `propagate`, as `(tool, message)`, for error events.
    pub(crate) propagated: Vec<(String, String)>,
}

impl StepEnd {
    /// Reads the effects of a committed step's outputs, in call order.
    pub(crate) fn of(calls: &[FunctionCall], effects: Vec<Effect>) -> Self {
        let mut end = Self::default();
        for (call, effect) in calls.iter().zip(effects) {
            match effect {
                Effect::Reply => end.wants_reply = true,
                Effect::Quiet => {}
                // The ledger left at most one of these two per step (`keep_first_ending`).
                Effect::Handoff(handoff) => end.outcome.handoff = Some(handoff),
                Effect::CompleteTask(value) => end.outcome.task_result = Some(value),
                Effect::Propagate(message) => {
                    end.outcome.failure.get_or_insert(SessionError::turn_failed(
                        TurnFailure::Tool {
                            tool: call.name.clone(),
                            call_id: call.call_id.clone(),
                            message: message.clone(),
                        },
                    ));
                    end.propagated.push((call.name.clone(), message));
                }
            }
        }
        end
    }

    /// Whether another LLM step follows: some output wants a reply, nothing ended the
    /// turn, the turn was not interrupted and the activity is current, and fewer than
    /// `max_steps` steps ran.
    pub(crate) fn goes_on(
        &self,
        steps: u32,
        max_steps: u32,
        interrupted: bool,
        current: bool,
    ) -> bool {
        self.wants_reply
            && self.outcome.handoff.is_none()
            && self.outcome.task_result.is_none()
            && self.outcome.failure.is_none()
            && !interrupted
            && current
            && steps < max_steps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: InputLimits = InputLimits {
        max_calls_per_step: 2,
        max_argument_bytes: 10,
        max_reply_bytes: 8,
    };

    /// A call as the model sent it, through the size rule, refused or not.
    fn sent(call: FunctionCall, index: usize, choice: ToolChoice) -> Option<CallOutput> {
        let bounded = bound_call(
            ToolCallChunk {
                call_id: call.call_id,
                name: call.name,
                arguments: call.arguments,
            },
            &LIMITS,
        );
        let call = FunctionCall {
            call_id: bounded.chunk.call_id,
            name: bounded.chunk.name,
            arguments: bounded.chunk.arguments,
        };
        refusal(&call, bounded.oversized, index, choice, &LIMITS)
    }

    fn call(arguments: &str) -> FunctionCall {
        FunctionCall {
            call_id: "c".into(),
            name: "search".into(),
            arguments: arguments.into(),
        }
    }

    #[test]
    fn a_call_in_a_reply_without_tools_is_refused_and_asks_for_nothing() {
        let out = sent(call("{}"), 0, ToolChoice::None).unwrap();
        assert!(out.is_error);
        assert!(matches!(out.effect, Effect::Quiet));
        assert!(
            out.output.contains("no tool may be called"),
            "{}",
            out.output
        );
    }

    #[test]
    fn calls_past_the_limit_are_refused_and_ask_for_nothing() {
        assert!(sent(call("{}"), 1, ToolChoice::Auto).is_none());
        let out = sent(call("{}"), 2, ToolChoice::Auto).unwrap();
        assert!(matches!(out.effect, Effect::Quiet));
        assert!(out.output.contains("at most 2"), "{}", out.output);
    }

    #[test]
    fn oversized_arguments_are_refused_as_an_error_the_model_reads() {
        let out = sent(call(r#"{"q": "far too long"}"#), 0, ToolChoice::Auto).unwrap();
        assert!(out.is_error);
        assert!(matches!(out.effect, Effect::Reply));
        assert!(
            out.output.contains("over the limit of 10"),
            "{}",
            out.output
        );
    }

    #[test]
    fn the_first_reason_wins() {
        let out = sent(call(r#"{"q": "far too long"}"#), 5, ToolChoice::None).unwrap();
        assert!(
            out.output.contains("no tool may be called"),
            "{}",
            out.output
        );
    }

    #[test]
    fn a_long_name_is_quoted_short() {
        let mut long = call("{}");
        long.name = "x".repeat(10_000);
        let out = sent(long, 9, ToolChoice::Auto).unwrap();
        assert!(out.output.len() < 400, "{} bytes", out.output.len());
    }

    #[test]
    fn an_oversized_name_is_cut_and_marked_so_it_matches_no_tool_and_is_refused() {
        let huge = "n".repeat(1 << 20);
        let bounded = bound_call(
            ToolCallChunk {
                call_id: "c".into(),
                name: huge,
                arguments: "{}".into(),
            },
            &LIMITS,
        );
        assert_eq!(bounded.oversized, Some(Oversized::Name { bytes: 1 << 20 }));
        assert_eq!(bounded.chunk.name, format!("{}_cut", "n".repeat(60)));
        assert_eq!(
            bounded.chunk.arguments, "{}",
            "arguments within the limit stay"
        );
        let call = FunctionCall {
            call_id: "c".into(),
            name: bounded.chunk.name,
            arguments: "{}".into(),
        };
        let out = refusal(&call, bounded.oversized, 0, ToolChoice::Auto, &LIMITS).unwrap();
        assert!(out.is_error);
        assert!(
            out.output
                .contains("was 1048576 bytes, over the limit of 64 (shown cut, as nnnn"),
            "{}",
            out.output
        );
        assert!(out.output.len() < 300, "{} bytes", out.output.len());
    }

    #[test]
    fn a_name_stand_in_is_a_name_providers_accept_in_a_later_request() {
        for name in ["é".repeat(1000), "get.weather ".repeat(100), "x".repeat(65)] {
            let stand_in = name_stand_in(&name);
            assert!(stand_in.len() <= MAX_NAME_BYTES, "{stand_in}");
            assert!(stand_in.ends_with("_cut"));
            assert!(
                stand_in
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'),
                "{stand_in}"
            );
        }
        assert_eq!(
            name_stand_in(&"get.weather ".repeat(100))[..12],
            *"get_weather_"
        );
    }

    #[test]
    fn oversized_arguments_leave_a_short_json_stand_in_with_their_size() {
        let bounded = bound_call(
            ToolCallChunk {
                call_id: "c".into(),
                name: "search".into(),
                arguments: "A".repeat(10_000_000),
            },
            &LIMITS,
        );
        assert_eq!(
            bounded.oversized,
            Some(Oversized::Arguments { bytes: 10_000_000 })
        );
        let stand_in: Value = serde_json::from_str(&bounded.chunk.arguments).unwrap();
        assert_eq!(
            stand_in["omitted"],
            "10000000 bytes of arguments, over the limit of 10; the call did not run"
        );
        assert_eq!(bounded.chunk.name, "search");
    }

    #[test]
    fn an_oversized_call_id_is_cut_and_the_call_still_runs() {
        let bounded = bound_call(
            ToolCallChunk {
                call_id: "é".repeat(1000),
                name: "search".into(),
                arguments: "{}".into(),
            },
            &LIMITS,
        );
        assert!(bounded.chunk.call_id.len() <= MAX_NAME_BYTES);
        assert!(bounded.chunk.call_id.chars().all(|c| c == 'é'));
        assert_eq!(bounded.oversized, None);
    }

    #[test]
    fn a_steps_text_stops_at_the_limit_on_a_character_boundary() {
        assert_eq!(bound_text("hello", 0, &LIMITS), ("hello", false));
        assert_eq!(
            bound_text("abc", 5, &LIMITS),
            ("abc", false),
            "exactly full"
        );
        assert_eq!(bound_text("abcd", 5, &LIMITS), ("abc", true));
        // 'é' is two bytes: the one that would straddle the limit is left out.
        assert_eq!(bound_text("aéé", 5, &LIMITS), ("aé", true));
        assert_eq!(bound_text("more", 8, &LIMITS), ("", true));
        assert_eq!(bound_text("more", 9, &LIMITS), ("", true));
    }

    fn calls(n: usize) -> Vec<FunctionCall> {
        (0..n).map(|_| call("{}")).collect()
    }

    #[test]
    fn a_step_goes_on_only_when_an_output_wants_a_reply_and_steps_remain() {
        let quiet = StepEnd::of(&calls(2), vec![Effect::Quiet, Effect::Quiet]);
        assert!(!quiet.goes_on(1, 3, false, true));
        let reply = StepEnd::of(&calls(2), vec![Effect::Quiet, Effect::Reply]);
        assert!(reply.goes_on(1, 3, false, true));
        assert!(!reply.goes_on(3, 3, false, true), "no step left");
        assert!(!reply.goes_on(1, 3, true, true), "interrupted");
        assert!(!reply.goes_on(1, 3, false, false), "paused or closed");
    }

    #[test]
    fn a_handoff_a_task_end_or_a_propagated_failure_ends_the_turn() {
        let agent = crate::agent::Agent::builder("billing").build().unwrap();
        let handoff = StepEnd::of(
            &calls(2),
            vec![Effect::Reply, Effect::Handoff(Handoff::to(agent))],
        );
        assert!(handoff.outcome.handoff.is_some());
        assert!(!handoff.goes_on(1, 3, false, true));
        let task = StepEnd::of(&calls(1), vec![Effect::CompleteTask(Value::Null)]);
        assert!(task.outcome.task_result.is_some());
        assert!(!task.goes_on(1, 3, false, true));
        let failed = StepEnd::of(
            &calls(2),
            vec![Effect::Reply, Effect::Propagate("db down".into())],
        );
        assert_eq!(
            failed.propagated,
            [("search".to_owned(), "db down".to_owned())]
        );
        assert!(matches!(
            failed.outcome.failure,
            Some(SessionError::TurnFailed {
                failure: TurnFailure::Tool { .. },
                ..
            })
        ));
        assert!(!failed.goes_on(1, 3, false, true));
    }
}
