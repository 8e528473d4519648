//! What a tool call produced, as the engine records it: the text for the model and what
//! it makes happen next (another LLM step, a handoff, nothing).

use std::any::Any;
use std::error::Error as StdError;

use serde_json::Value;

use crate::chat::{ChatItem, FunctionCall, FunctionCallOutput};
use crate::error_policy::{describe_chain, ErrorPolicy, ErrorRoute};
use crate::handoff::{Handoff, HandoffState};
use crate::tool::{ToolPanic, ToolResult, ToolReturn};

/// What a recorded output makes happen.
#[derive(Debug)]
pub(crate) enum Effect {
    /// The model should see it: another LLM step (or a deferred reply) follows.
    Reply,
    /// Recorded, nothing follows (no reply, a terminal "cancelled").
    Quiet,
    /// Hand the conversation to another agent.
    Handoff(Handoff),
    /// End the current sub-task with this result.
    CompleteTask(Value),
    /// An error routed `propagate`: the turn fails with this description.
    Propagate(String),
}

/// One output for the model plus its effect.
#[derive(Debug)]
pub(crate) struct CallOutput {
    pub(crate) output: String,
    pub(crate) is_error: bool,
    pub(crate) effect: Effect,
}

impl CallOutput {
    pub(crate) fn reply(output: String) -> Self {
        Self {
            output,
            is_error: false,
            effect: Effect::Reply,
        }
    }

    /// An output the model reads with whatever it is asked next; no step on its account.
    pub(crate) fn quiet(output: String) -> Self {
        Self {
            output,
            is_error: false,
            effect: Effect::Quiet,
        }
    }

    pub(crate) fn error(output: String) -> Self {
        Self {
            output,
            is_error: true,
            effect: Effect::Reply,
        }
    }

    /// An error output that asks for no further step: the model misbehaved (a call where
    /// none is allowed, too many calls), and answering it again would let it loop.
    pub(crate) fn refused(output: String) -> Self {
        Self {
            output,
            is_error: true,
            effect: Effect::Quiet,
        }
    }

    /// The immediate output of a call moved to the background by an interruption: its
    /// result arrives later as `/finished`, with a deferred reply.
    pub(crate) fn moved_to_background() -> Self {
        Self {
            output: BACKGROUND_PLACEHOLDER.to_owned(),
            is_error: false,
            effect: Effect::Quiet,
        }
    }

    /// The terminal output of a call that did not finish.
    pub(crate) fn ended(reason: &str) -> Self {
        Self {
            output: format!("Cancelled: {reason}."),
            is_error: false,
            effect: Effect::Quiet,
        }
    }

    /// Whether the output is nothing at all (a unit return).
    pub(crate) fn is_unit(&self) -> bool {
        self.output.is_empty() && matches!(self.effect, Effect::Quiet) && !self.is_error
    }
}

/// A call's immediate output as a snapshot writes it (the output of a call of a step still
/// open): its text, and what it makes happen once its step is in — a handoff by its
/// agent's name and data, which the restoring side's registry builds again.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct OutputState {
    pub(crate) output: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) is_error: bool,
    pub(crate) effect: EffectState,
}

/// What an output makes happen, as a snapshot writes it (see [`Effect`]).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum EffectState {
    Reply,
    Quiet,
    Handoff(HandoffState),
    CompleteTask(Value),
    Propagate(String),
}

impl CallOutput {
    /// What a snapshot writes of it.
    pub(crate) fn state(&self) -> OutputState {
        OutputState {
            output: self.output.clone(),
            is_error: self.is_error,
            effect: match &self.effect {
                Effect::Reply => EffectState::Reply,
                Effect::Quiet => EffectState::Quiet,
                Effect::Handoff(handoff) => EffectState::Handoff(handoff.state()),
                Effect::CompleteTask(value) => EffectState::CompleteTask(value.clone()),
                Effect::Propagate(why) => EffectState::Propagate(why.clone()),
            },
        }
    }
}

impl OutputState {
    /// The output again; a handoff's agent is `agent`, built by the restoring side's
    /// registry (checked before the restore started, so it is there).
    pub(crate) fn restore(self, agent: Option<crate::agent::Agent>) -> CallOutput {
        let effect = match (self.effect, agent) {
            (EffectState::Handoff(state), Some(agent)) => Effect::Handoff(state.restore(agent)),
            (EffectState::Handoff(_), None) | (EffectState::Reply, _) => Effect::Reply,
            (EffectState::Quiet, _) => Effect::Quiet,
            (EffectState::CompleteTask(value), _) => Effect::CompleteTask(value),
            (EffectState::Propagate(why), _) => Effect::Propagate(why),
        };
        CallOutput {
            output: self.output,
            is_error: self.is_error,
            effect,
        }
    }
}

/// What the model reads for a call the user interrupted while it ran: kept short, since a
/// long explanation makes models re-call tools with invented results.
pub(crate) const BACKGROUND_PLACEHOLDER: &str = "Still running; the result will follow.";

/// At most this many bytes of the model's own input are quoted in an error text.
pub(crate) const QUOTE_LIMIT: usize = 160;

/// A prefix of `text` of at most `max` bytes (on a character boundary), marked `…` when
/// cut: error texts quote the model's input, which can be megabytes.
pub(crate) fn excerpt(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!("{}…", &text[..end]))
}

/// Checks what a tool's result asks the engine to do against where it ran: a handoff to
/// an agent that could not start here, or a `CompleteTask` from an agent that is not a
/// sub-task, becomes an error output the model reads (the agent stays).
pub(crate) fn vet(
    out: CallOutput,
    is_task: bool,
    check_agent: impl FnOnce(&crate::agent::Agent) -> Result<(), String>,
) -> CallOutput {
    match &out.effect {
        Effect::Handoff(handoff) => match check_agent(&handoff.agent) {
            Ok(()) => out,
            Err(why) => CallOutput::error(format!(
                "Error: cannot hand off to {}: {why}",
                handoff.agent.name()
            )),
        },
        Effect::CompleteTask(_) if !is_task => CallOutput::error(
            "Error: this agent is not running as a sub-task, so there is no task to complete"
                .to_owned(),
        ),
        _ => out,
    }
}

/// One step ends its agent at most once: the first handoff or task completion, in call
/// order, is carried out; each later one becomes an error output asking for nothing, so
/// the chat never says "Transferred" or "Task completed" for something that did not
/// happen.
pub(crate) fn keep_first_ending<'a>(outputs: impl IntoIterator<Item = &'a mut CallOutput>) {
    let mut ending: Option<String> = None;
    for out in outputs {
        let what = match &out.effect {
            Effect::Handoff(handoff) => format!("hands off to {}", handoff.agent.name()),
            Effect::CompleteTask(_) => "completes the task".to_owned(),
            _ => continue,
        };
        match &ending {
            None => ending = Some(what),
            Some(first) => {
                tracing::warn!(ignored = %what, kept = %first, "a second ending in one step");
                *out = CallOutput::refused(format!(
                    "Error: not done: an earlier call in this step already {first}"
                ));
            }
        }
    }
}

/// What a call that finished in the background — after its first update, or moved there
/// by an interruption — asks for with its result.
#[derive(Debug)]
pub(crate) enum BackgroundFinish {
    /// Nothing: a unit return after updates adds nothing more.
    Nothing,
    /// A `/finished` output; once it is in a chat context, `then` follows.
    Finished {
        output: String,
        is_error: bool,
        /// Whether it asks for a deferred reply: a value or an error the model should
        /// answer (not a quiet output, a handoff or a task's end).
        reply: bool,
        then: AfterFinished,
        /// An error routed `propagate`: the session's error event says it.
        error_event: Option<String>,
    },
}

/// What a background call's result asks of the session after its `/finished` landed.
#[derive(Debug)]
pub(crate) enum AfterFinished {
    Nothing,
    Handoff(Handoff),
    CompleteTask(Value),
}

/// Decides what a background finish of `tool` does with its output (see
/// [`BackgroundFinish`]).
pub(crate) fn finish_in_background(tool: &str, out: CallOutput) -> BackgroundFinish {
    if out.is_unit() {
        return BackgroundFinish::Nothing;
    }
    let (reply, then, error_event) = match out.effect {
        Effect::Handoff(handoff) => (false, AfterFinished::Handoff(handoff), None),
        Effect::CompleteTask(value) => (false, AfterFinished::CompleteTask(value), None),
        Effect::Quiet => (false, AfterFinished::Nothing, None),
        Effect::Reply => (true, AfterFinished::Nothing, None),
        Effect::Propagate(message) => (
            true,
            AfterFinished::Nothing,
            Some(format!("tool {tool} failed: {message}")),
        ),
    };
    BackgroundFinish::Finished {
        output: out.output,
        is_error: out.is_error,
        reply,
        then,
        error_event,
    }
}

/// A call that ran in the background when a stop of its scope (a pause, a handoff, a
/// close) ended it, as its toolset answers the stop: its `/finished` says why, unless its
/// tool is call-long and returned a result within the grace period, which is kept.
#[derive(Clone, Debug)]
pub(crate) struct StoppedCall {
    pub(crate) call: FunctionCall,
    /// A call-long tool's own result (its output and whether it is an error).
    pub(crate) kept: Option<(String, bool)>,
}

impl StoppedCall {
    /// A call that ended without a result of its own.
    pub(crate) fn stopped(call: FunctionCall) -> Self {
        Self { call, kept: None }
    }
}

/// The `/finished` pair of a background call a stop ended: its kept result, or why it
/// ended without one; either asks for no reply.
pub(crate) fn terminal_pair(stopped: StoppedCall, reason: &str) -> [ChatItem; 2] {
    let StoppedCall { call, kept } = stopped;
    let (output, is_error) = kept.unwrap_or_else(|| (CallOutput::ended(reason).output, false));
    finished_pair(call, output, is_error)
}

/// A call's `/finished` pair with `output`.
pub(crate) fn finished_pair(call: FunctionCall, output: String, is_error: bool) -> [ChatItem; 2] {
    let call_id = format!("{}/finished", call.call_id);
    [
        ChatItem::FunctionCall(FunctionCall {
            call_id: call_id.clone(),
            name: call.name.clone(),
            arguments: call.arguments,
        }),
        ChatItem::FunctionCallOutput(FunctionCallOutput {
            call_id,
            name: call.name,
            output,
            is_error,
        }),
    ]
}

/// The policies consulted for one call's unexpected errors, most specific first.
pub(crate) struct ErrorPolicies<'a> {
    pub(crate) levels: [&'a ErrorPolicy; 3],
}

/// Turns a body's result (or panic) into the recorded output, logging each error once:
/// `ToolError` at warn without backtrace, `StopResponse` at debug, anything else once
/// with its cause chain.
pub(crate) fn classify(
    tool: &str,
    call_id: &str,
    result: Result<ToolResult, Box<dyn Any + Send>>,
    policies: &ErrorPolicies<'_>,
) -> CallOutput {
    let failure = match result {
        Ok(Ok(value)) => return from_return(value),
        Ok(Err(failure)) => failure,
        Err(panic) => {
            let message = panic_message(&*panic);
            let err = ToolPanic { message };
            let route = match decide(&err, policies) {
                ErrorRoute::Propagate => ErrorRoute::Propagate,
                // Panics are never shown to the model.
                ErrorRoute::Show | ErrorRoute::Hide => ErrorRoute::Hide,
            };
            return unexpected(tool, call_id, &err, route);
        }
    };
    if let Some(err) = failure.as_tool_error() {
        tracing::warn!(tool, call_id, error = %err, "tool error returned to the model");
        return CallOutput::error(error_text(&err.0));
    }
    #[allow(deprecated)] // The deprecated signal still works as it always did.
    if let Some(stop) = failure.as_stop_response() {
        tracing::debug!(tool, call_id, "tool stopped the response");
        return CallOutput {
            output: stop.output.clone(),
            is_error: false,
            effect: Effect::Quiet,
        };
    }
    let err: &(dyn StdError + 'static) = failure.error();
    let route = decide(err, policies);
    unexpected(tool, call_id, err, route)
}

fn decide(err: &(dyn StdError + 'static), policies: &ErrorPolicies<'_>) -> ErrorRoute {
    policies
        .levels
        .iter()
        .find_map(|policy| policy.decide(err))
        .unwrap_or(ErrorRoute::Hide)
}

fn unexpected(
    tool: &str,
    call_id: &str,
    err: &(dyn StdError + 'static),
    route: ErrorRoute,
) -> CallOutput {
    let chain = describe_chain(err);
    tracing::error!(tool, call_id, route = ?route, error = %chain, "tool failed");
    match route {
        ErrorRoute::Show => CallOutput::error(error_text(&err.to_string())),
        ErrorRoute::Hide => CallOutput::error(internal_error(tool)),
        ErrorRoute::Propagate => CallOutput {
            output: internal_error(tool),
            is_error: true,
            effect: Effect::Propagate(chain),
        },
    }
}

/// `Error: <text>`, unless the text already starts with `Error` (never `Error: Error …`).
pub(crate) fn error_text(text: &str) -> String {
    if text.starts_with("Error") {
        text.to_owned()
    } else {
        format!("Error: {text}")
    }
}

pub(crate) fn internal_error(tool: &str) -> String {
    format!("Error: internal error in {tool}")
}

fn from_return(value: ToolReturn) -> CallOutput {
    match value {
        #[allow(deprecated)]
        ToolReturn::Unit => CallOutput::quiet(String::new()),
        ToolReturn::Text(text) => CallOutput::reply(text),
        ToolReturn::Json(value) => CallOutput::reply(value.to_string()),
        ToolReturn::NoReply(text) => CallOutput::quiet(text),
        ToolReturn::Handoff(handoff) => CallOutput {
            output: handoff
                .message
                .clone()
                .unwrap_or_else(|| format!("Transferred to {}.", handoff.agent.name())),
            is_error: false,
            effect: Effect::Handoff(handoff),
        },
        ToolReturn::CompleteTask(value) => CallOutput {
            output: "Task completed.".to_owned(),
            is_error: false,
            effect: Effect::CompleteTask(value),
        },
    }
}

pub(crate) fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::Agent;

    fn handoff(to: &str) -> CallOutput {
        // A name-only agent always builds.
        let agent = Agent::builder(to).build().expect("a plain agent builds");
        from_return(ToolReturn::Handoff(Handoff::to(agent)))
    }

    fn complete() -> CallOutput {
        from_return(ToolReturn::CompleteTask(Value::Null))
    }

    fn kinds(outputs: &[CallOutput]) -> Vec<&str> {
        outputs
            .iter()
            .map(|o| match &o.effect {
                Effect::Handoff(_) => "handoff",
                Effect::CompleteTask(_) => "complete",
                Effect::Reply => "reply",
                Effect::Quiet if o.is_error => "refused",
                Effect::Quiet => "quiet",
                Effect::Propagate(_) => "propagate",
            })
            .collect()
    }

    #[test]
    fn the_first_ending_of_a_step_wins_and_later_ones_read_as_refused() {
        let mut outputs = vec![
            CallOutput::reply("42".into()),
            complete(),
            handoff("billing"),
            complete(),
        ];
        keep_first_ending(&mut outputs);
        assert_eq!(kinds(&outputs), ["reply", "complete", "refused", "refused"]);
        assert_eq!(
            outputs[2].output,
            "Error: not done: an earlier call in this step already completes the task"
        );

        let mut outputs = vec![handoff("billing"), handoff("support"), complete()];
        keep_first_ending(&mut outputs);
        assert_eq!(kinds(&outputs), ["handoff", "refused", "refused"]);
        assert!(outputs[1].output.ends_with("already hands off to billing"));
    }

    /// `(reply, then, error event)` of a background finish.
    fn finish(out: CallOutput) -> Option<(bool, &'static str, bool)> {
        match finish_in_background("search", out) {
            BackgroundFinish::Nothing => None,
            BackgroundFinish::Finished {
                reply,
                then,
                error_event,
                ..
            } => Some((
                reply,
                match then {
                    AfterFinished::Nothing => "nothing",
                    AfterFinished::Handoff(_) => "handoff",
                    AfterFinished::CompleteTask(_) => "complete",
                },
                error_event.is_some(),
            )),
        }
    }

    #[test]
    fn a_background_finish_asks_for_a_reply_only_for_what_the_model_should_answer() {
        assert_eq!(
            finish(from_return(ToolReturn::from(()))),
            None,
            "unit adds nothing"
        );
        assert_eq!(
            finish(CallOutput::reply("found".into())),
            Some((true, "nothing", false))
        );
        assert_eq!(
            finish(CallOutput::quiet("noted".into())),
            Some((false, "nothing", false))
        );
        assert_eq!(
            finish(CallOutput::error("Error: no table".into())),
            Some((true, "nothing", false)),
            "an error the model reads"
        );
        let propagated = CallOutput {
            output: "Error: internal error in search".into(),
            is_error: true,
            effect: Effect::Propagate("db down".into()),
        };
        assert_eq!(finish(propagated), Some((true, "nothing", true)));
    }

    #[test]
    fn a_background_handoff_or_task_end_follows_its_finished_output_and_asks_no_reply() {
        assert_eq!(finish(handoff("billing")), Some((false, "handoff", false)));
        assert_eq!(finish(complete()), Some((false, "complete", false)));
    }

    #[test]
    fn a_step_with_one_ending_is_left_alone() {
        let mut outputs = vec![CallOutput::reply("a".into()), handoff("billing")];
        keep_first_ending(&mut outputs);
        assert_eq!(kinds(&outputs), ["reply", "handoff"]);
        assert_eq!(outputs[1].output, "Transferred to billing.");
    }
}
