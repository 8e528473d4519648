//! Ready-made [`EventMatcher`]s for [`EventWaiter::next`] and [`next_event`]: each picks
//! one kind of [`SessionEvent`] and describes itself in a failure message.
//!
//! ```
//! use switchboard::testing::event;
//! # async fn check(events: &mut switchboard::testing::EventWaiter) -> Result<(), switchboard::testing::WaitError> {
//! let speech = events.next(event::speech_created()).await?; // a SpeechHandle
//! let output = events.next(event::output_added("call_1/finished")).await?;
//! assert_eq!(output.output, "3 flights found");
//! // Any other event, with a description for the failure message:
//! events
//!     .next(event::matching("a false interruption", |event| match event {
//!         switchboard::SessionEvent::AgentFalseInterruption { resumed } => Some(*resumed),
//!         _ => None,
//!     }))
//!     .await?;
//! # let _ = speech;
//! # Ok(())
//! # }
//! ```
//!
//! [`EventWaiter::next`]: super::EventWaiter::next
//! [`next_event`]: super::next_event

use switchboard_actors::{
    AgentState, AgentWork, ChatItem, FunctionCallOutput, SessionEvent, SpeechHandle, Unfinished,
    UserState,
};

use super::expect::summary;
use super::EventMatcher;

/// A matcher with a description: what [`matching`] and the functions of this module return.
#[derive(Clone, Debug)]
pub struct Matching<F> {
    what: String,
    pick: F,
}

impl<T, F> EventMatcher for Matching<F>
where
    F: FnMut(&SessionEvent) -> Option<T>,
{
    type Output = T;

    fn pick(&mut self, event: &SessionEvent) -> Option<T> {
        (self.pick)(event)
    }

    fn describe(&self) -> String {
        self.what.clone()
    }
}

/// The events `pick` returns `Some` for, described as `what` in a failure message.
pub fn matching<T, F>(what: impl Into<String>, pick: F) -> Matching<F>
where
    F: FnMut(&SessionEvent) -> Option<T>,
{
    Matching {
        what: what.into(),
        pick,
    }
}

/// A new speech (`SessionEvent::SpeechCreated`), giving its handle.
pub fn speech_created() -> Matching<impl FnMut(&SessionEvent) -> Option<SpeechHandle>> {
    matching("a new speech (SpeechCreated)", |event| match event {
        SessionEvent::SpeechCreated { speech, .. } => Some(speech.clone()),
        _ => None,
    })
}

/// The function call output with this call id added to a chat context
/// (`ConversationItemAdded`), giving the output: `"call_1"` for the immediate output,
/// `"call_1/update_1"`, `"call_1/finished"` for what an async tool sends later.
pub fn output_added(
    call_id: impl Into<String>,
) -> Matching<impl FnMut(&SessionEvent) -> Option<FunctionCallOutput>> {
    let call_id = call_id.into();
    matching(
        format!("the output of call {call_id}"),
        move |event| match event {
            SessionEvent::ConversationItemAdded {
                item: ChatItem::FunctionCallOutput(output),
                ..
            } if output.call_id == call_id => Some(output.clone()),
            _ => None,
        },
    )
}

/// Any item added to a chat context that `pick` returns `Some` for, giving the agent whose
/// chat context grew along with what `pick` returned.
pub fn item_added<T>(
    what: impl Into<String>,
    mut pick: impl FnMut(&ChatItem) -> Option<T>,
) -> Matching<impl FnMut(&SessionEvent) -> Option<(String, T)>> {
    matching(what, move |event| match event {
        SessionEvent::ConversationItemAdded { agent, item } => {
            pick(item).map(|found| (agent.clone(), found))
        }
        _ => None,
    })
}

/// A handoff to the agent named `to` (`SessionEvent::AgentHandoff`), giving the agent it
/// came from.
pub fn handoff_to(
    to: impl Into<String>,
) -> Matching<impl FnMut(&SessionEvent) -> Option<Option<String>>> {
    let to = to.into();
    matching(format!("a handoff to {to}"), move |event| match event {
        SessionEvent::AgentHandoff { from, to: new } if *new == to => Some(from.clone()),
        _ => None,
    })
}

/// An agent entering `state` (`SessionEvent::AgentStateChanged`), giving the agent.
pub fn agent_state(state: AgentState) -> Matching<impl FnMut(&SessionEvent) -> Option<String>> {
    matching(format!("the agent {state:?}"), move |event| match event {
        SessionEvent::AgentStateChanged { agent, state: new } if *new == state => {
            Some(agent.clone())
        }
        _ => None,
    })
}

/// The user entering `state` (`SessionEvent::UserStateChanged`).
pub fn user_state(state: UserState) -> Matching<impl FnMut(&SessionEvent) -> Option<()>> {
    matching(format!("the user {state:?}"), move |event| match event {
        SessionEvent::UserStateChanged { state: new } if *new == state => Some(()),
        _ => None,
    })
}

/// An interrupted turn (`SessionEvent::TurnInterrupted`), giving the agent whose turn it
/// was.
pub fn turn_interrupted() -> Matching<impl FnMut(&SessionEvent) -> Option<String>> {
    matching(
        "an interrupted turn (TurnInterrupted)",
        |event| match event {
            SessionEvent::TurnInterrupted { agent } => Some(agent.clone()),
            _ => None,
        },
    )
}

/// Agent-started work refused past `SessionBuilder::max_agent_work`
/// (`SessionEvent::AgentWorkRefused`), giving what was refused.
pub fn agent_work_refused() -> Matching<impl FnMut(&SessionEvent) -> Option<AgentWork>> {
    matching(
        "agent-started work refused (AgentWorkRefused)",
        |event| match event {
            SessionEvent::AgentWorkRefused { work, .. } => Some(work.clone()),
            _ => None,
        },
    )
}

/// An error event (`SessionEvent::Error`), giving its message.
pub fn error() -> Matching<impl FnMut(&SessionEvent) -> Option<String>> {
    matching("an error event", |event| match event {
        SessionEvent::Error { message } => Some(message.clone()),
        _ => None,
    })
}

/// Code the session stopped waiting for (`SessionEvent::Unfinished`): a tool body, a
/// hook or a snapshot write that outlived its grace period.
pub fn unfinished() -> Matching<impl FnMut(&SessionEvent) -> Option<Unfinished>> {
    matching(
        "something dropped unfinished (Unfinished)",
        |event| match event {
            SessionEvent::Unfinished(what) => Some(what.clone()),
            _ => None,
        },
    )
}

/// How many characters of a text an event description shows before cutting it.
const TEXT_LIMIT: usize = 60;

/// One line describing an event, for a failure message.
pub(crate) fn describe(event: &SessionEvent) -> String {
    match event {
        SessionEvent::UserInputTranscribed { text, is_final } => format!(
            "UserInputTranscribed {} ({})",
            cut(text),
            if *is_final { "final" } else { "interim" }
        ),
        SessionEvent::UserStateChanged { state } => format!("UserStateChanged {state:?}"),
        SessionEvent::ConversationItemAdded { agent, item } => {
            format!("ConversationItemAdded {agent}: {}", summary(item))
        }
        SessionEvent::ConversationItemChanged { agent, index, item } => {
            format!(
                "ConversationItemChanged {agent} [{index}]: {}",
                summary(item)
            )
        }
        SessionEvent::ConversationItemRemoved { agent, index } => {
            format!("ConversationItemRemoved {agent} [{index}]")
        }
        SessionEvent::ChatContextSet { agent, chat } => {
            format!("ChatContextSet {agent}: {} items", chat.len())
        }
        SessionEvent::FunctionToolsExecuted { agent, calls, .. } => format!(
            "FunctionToolsExecuted {agent}: {}",
            calls
                .iter()
                .map(|c| format!("{} ({})", c.name, c.call_id))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        SessionEvent::AgentStateChanged { agent, state } => {
            format!("AgentStateChanged {agent}: {state:?}")
        }
        SessionEvent::SpeechCreated { agent, speech } => {
            format!("SpeechCreated {agent}: {}", speech.id())
        }
        SessionEvent::SpeechPlayedOut {
            speech,
            interrupted,
            heard,
        } => match (interrupted, heard) {
            (false, _) => format!("SpeechPlayedOut {speech}"),
            (true, Some(heard)) => format!("SpeechPlayedOut {speech} cut, heard {}", cut(heard)),
            (true, None) => format!("SpeechPlayedOut {speech} cut"),
        },
        SessionEvent::AgentFalseInterruption { resumed } => {
            format!("AgentFalseInterruption resumed: {resumed}")
        }
        SessionEvent::AgentHandoff { from, to } => format!(
            "AgentHandoff {} -> {to}",
            from.as_deref().unwrap_or("(none)")
        ),
        SessionEvent::LlmMetrics(metrics) => format!("LlmMetrics {}", metrics.agent),
        SessionEvent::TurnInterrupted { agent } => format!("TurnInterrupted {agent}"),
        SessionEvent::AgentWorkRefused { agent, work, limit } => {
            format!("AgentWorkRefused {agent}: {work}, limit {limit}")
        }
        SessionEvent::Error { message } => format!("Error {}", cut(message)),
        SessionEvent::Unfinished(what) => format!("Unfinished: {what}"),
        SessionEvent::Closed => "Closed".to_owned(),
        other => {
            let debug = format!("{other:?}");
            match debug.char_indices().nth(TEXT_LIMIT * 2) {
                Some((end, _)) => format!("{}…", &debug[..end]),
                None => debug,
            }
        }
    }
}

/// `text` quoted, cut to [`TEXT_LIMIT`] characters.
fn cut(text: &str) -> String {
    match text.char_indices().nth(TEXT_LIMIT) {
        Some((end, _)) => format!("{:?}…", &text[..end]),
        None => format!("{text:?}"),
    }
}
