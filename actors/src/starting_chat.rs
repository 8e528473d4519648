//! `StartingChat`: what chat context an agent starts with when it becomes current.
//!
//! Three places may say it, the most specific wins: the handoff
//! ([`Handoff::with_chat`](crate::Handoff::with_chat)), then the agent
//! ([`AgentBuilder::starting_chat`](crate::AgentBuilder::starting_chat)), then the session
//! ([`SessionBuilder::inherit_chat_context`](crate::SessionBuilder::inherit_chat_context),
//! for handoffs only). The choice is a pure function of the previous agent's chat, so it is
//! a plain type with unit tests; the session only carries it out.

use std::collections::HashSet;

use crate::chat::{ChatContext, ChatItem};
use crate::error::BuildError;

/// The chat context an agent starts with. LiveKit's `Agent(chat_ctx=...)`.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum StartingChat {
    /// Nothing: the agent starts with an empty chat context.
    Empty,
    /// Everything the agent before it had (for a sub-task: its caller, less the call
    /// that waits for the sub-task, which has no output yet).
    All,
    /// The last `n` items the agent before it had; fewer where taking exactly `n` would
    /// keep a tool call's output without its call (outputs never outlive their call).
    LastItems(usize),
    /// This chat context, whatever came before. Made by [`StartingChat::given`], which
    /// checks it.
    Given(GivenChat),
}

/// A chat context checked to be one the engine can continue: every tool call has exactly
/// one output, after it. Made by [`StartingChat::given`].
#[derive(Clone, Debug, PartialEq)]
pub struct GivenChat(ChatContext);

impl GivenChat {
    /// The chat context.
    pub fn chat(&self) -> &ChatContext {
        &self.0
    }
}

impl StartingChat {
    /// Starts from `chat`. Fails when a tool call in it has no output, two outputs, or an
    /// output before it: providers reject such a context, and the engine keeps one output
    /// per call everywhere.
    pub fn given(chat: ChatContext) -> Result<Self, BuildError> {
        chat.check_invariant()
            .map_err(|reason| BuildError::InvalidChat { reason })?;
        Ok(Self::Given(GivenChat(chat)))
    }

    /// The chat context to start with, from what the agent before had.
    pub(crate) fn apply(&self, previous: ChatContext) -> ChatContext {
        match self {
            Self::Empty => ChatContext::new(),
            // A handoff's outgoing chat has an output for every call: share it as it is
            // (no scan that grows with the history). Only a paused caller's chat has an
            // open call to leave out.
            Self::All if every_call_answered(previous.items()) => previous,
            Self::All => last_items(&previous, usize::MAX),
            Self::LastItems(n) => last_items(&previous, *n),
            Self::Given(given) => given.0.clone(),
        }
    }

    /// Which choice applies: the handoff's, else the agent's, else `fallback`.
    pub(crate) fn resolve(
        handoff: Option<&StartingChat>,
        agent: Option<&StartingChat>,
        fallback: StartingChat,
    ) -> StartingChat {
        handoff.or(agent).cloned().unwrap_or(fallback)
    }
}

/// A starting chat as a snapshot writes it (a queued handoff's): the choice, and a given
/// chat's items.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "from", rename_all = "snake_case")]
pub(crate) enum StartingChatState {
    All,
    Empty,
    LastItems { n: usize },
    Given { items: Vec<ChatItem> },
}

impl StartingChat {
    /// What a snapshot writes of it.
    pub(crate) fn state(&self) -> StartingChatState {
        match self {
            Self::All => StartingChatState::All,
            Self::Empty => StartingChatState::Empty,
            Self::LastItems(n) => StartingChatState::LastItems { n: *n },
            Self::Given(given) => StartingChatState::Given {
                items: given.0.items().to_vec(),
            },
        }
    }
}

impl StartingChatState {
    /// The choice again. A given chat was checked when it was first given; one a snapshot
    /// changed since no longer passes the check and reads as empty.
    pub(crate) fn restore(&self) -> StartingChat {
        match self {
            Self::All => StartingChat::All,
            Self::Empty => StartingChat::Empty,
            Self::LastItems { n } => StartingChat::LastItems(*n),
            Self::Given { items } => {
                let mut chat = ChatContext::new();
                chat.extend(items.iter().cloned());
                StartingChat::given(chat).unwrap_or(StartingChat::Empty)
            }
        }
    }
}

/// The last `n` items of `chat` (all of it for `usize::MAX`), less any output whose call
/// was cut off and any call without an output (a paused caller's open call): what is
/// left can be sent to a provider as it is.
fn last_items(chat: &ChatContext, n: usize) -> ChatContext {
    let items = chat.items();
    let tail = &items[items.len().saturating_sub(n)..];
    let calls: HashSet<&str> = tail
        .iter()
        .filter_map(|item| match item {
            ChatItem::FunctionCall(call) => Some(call.call_id.as_str()),
            _ => None,
        })
        .collect();
    let answered: HashSet<&str> = tail
        .iter()
        .filter_map(|item| match item {
            ChatItem::FunctionCallOutput(out) if calls.contains(out.call_id.as_str()) => {
                Some(out.call_id.as_str())
            }
            _ => None,
        })
        .collect();
    let kept: Vec<ChatItem> = tail
        .iter()
        .filter(|item| match item {
            ChatItem::FunctionCall(call) => answered.contains(call.call_id.as_str()),
            ChatItem::FunctionCallOutput(out) => answered.contains(out.call_id.as_str()),
            _ => true,
        })
        .cloned()
        .collect();
    ChatContext::from(kept)
}

/// Whether as many outputs as calls: with the engine's invariant (every output after its
/// call, at most one per call) that is every call answered. A context a hook broke is
/// passed on as the hook left it, as it always was.
fn every_call_answered(items: &[ChatItem]) -> bool {
    let balance = items.iter().fold(0isize, |balance, item| match item {
        ChatItem::FunctionCall(_) => balance + 1,
        ChatItem::FunctionCallOutput(_) => balance - 1,
        _ => balance,
    });
    balance == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::{ChatRole, FunctionCall, FunctionCallOutput};

    fn call(id: &str) -> ChatItem {
        ChatItem::FunctionCall(FunctionCall {
            call_id: id.into(),
            name: "t".into(),
            arguments: "{}".into(),
        })
    }

    fn out(id: &str) -> ChatItem {
        ChatItem::FunctionCallOutput(FunctionCallOutput {
            call_id: id.into(),
            name: "t".into(),
            output: "ok".into(),
            is_error: false,
        })
    }

    fn say(text: &str) -> ChatItem {
        ChatItem::message(ChatRole::User, text)
    }

    fn labels(chat: &ChatContext) -> Vec<String> {
        chat.items()
            .iter()
            .map(|item| match item {
                ChatItem::FunctionCall(c) => format!("call {}", c.call_id),
                ChatItem::FunctionCallOutput(o) => format!("out {}", o.call_id),
                other => other.text().unwrap_or("?").to_owned(),
            })
            .collect()
    }

    /// hi, [call a, call b, out a, out b], bye
    fn previous() -> ChatContext {
        ChatContext::from(vec![
            say("hi"),
            call("a"),
            call("b"),
            out("a"),
            out("b"),
            say("bye"),
        ])
    }

    #[test]
    fn last_items_never_keeps_an_output_without_its_call() {
        let cases: [(usize, &[&str]); 7] = [
            (0, &[]),
            (1, &["bye"]),
            (2, &["bye"]),
            (3, &["bye"]),
            (4, &["call b", "out b", "bye"]),
            (6, &["hi", "call a", "call b", "out a", "out b", "bye"]),
            (60, &["hi", "call a", "call b", "out a", "out b", "bye"]),
        ];
        for (n, expected) in cases {
            let chat = StartingChat::LastItems(n).apply(previous());
            assert_eq!(labels(&chat), expected, "last {n}");
            assert_eq!(chat.check_invariant(), Ok(()), "last {n}");
        }
    }

    #[test]
    fn a_call_still_waiting_for_its_output_is_left_out() {
        let paused = ChatContext::from(vec![say("verify"), call("a"), out("a"), call("b")]);
        let chat = StartingChat::All.apply(paused);
        assert_eq!(labels(&chat), ["verify", "call a", "out a"]);
        assert_eq!(chat.check_invariant(), Ok(()));
    }

    #[test]
    fn each_choice_starts_where_it_says() {
        assert!(StartingChat::Empty.apply(previous()).is_empty());
        assert_eq!(StartingChat::All.apply(previous()), previous());
        // A whole chat with every call answered is shared, not copied.
        let whole = previous();
        assert!(StartingChat::All.apply(whole.clone()).extends(&whole));
        let given = ChatContext::from(vec![say("summary: wants a refund")]);
        let start = StartingChat::given(given.clone()).unwrap();
        assert_eq!(start.apply(previous()), given);
    }

    #[test]
    fn a_given_chat_with_a_call_and_no_output_is_refused() {
        let broken = ChatContext::from(vec![say("hi"), call("a")]);
        let err = StartingChat::given(broken).unwrap_err();
        assert!(err.to_string().contains("call a"), "{err}");
        let orphan = ChatContext::from(vec![out("a")]);
        assert!(StartingChat::given(orphan).is_err());
    }

    #[test]
    fn the_handoff_beats_the_agent_which_beats_the_session() {
        let (handoff, agent) = (StartingChat::LastItems(2), StartingChat::Empty);
        assert_eq!(
            StartingChat::resolve(Some(&handoff), Some(&agent), StartingChat::All),
            handoff
        );
        assert_eq!(
            StartingChat::resolve(None, Some(&agent), StartingChat::All),
            agent
        );
        assert_eq!(
            StartingChat::resolve(None, None, StartingChat::All),
            StartingChat::All
        );
    }
}
