//! `Handoff`: the conversation moves to another agent.

use serde_json::Value;

use crate::agent::Agent;
use crate::starting_chat::{StartingChat, StartingChatState};

/// Hands the conversation to another agent. Return it (or the agent) from a tool, call
/// `Session::update_agent`, or send it to the session's address
/// (`session.address().send(Handoff::to(agent))`).
///
/// By default it waits for the current turn (it runs "after the current speech");
/// [`Handoff::interrupting`] makes it a supervisor's handoff that stops the current turn
/// first and runs before anything queued.
#[derive(Debug, Clone)]
pub struct Handoff {
    /// The agent to hand off to.
    pub agent: Agent,
    /// What the handing-off call's output says (default: `Transferred to <agent>.`).
    pub message: Option<String>,
    /// Whether it interrupts the current turn instead of waiting for it.
    pub interrupt: bool,
    /// The chat context the new agent starts with (default: the agent's own choice, else
    /// the session's `inherit_chat_context`).
    pub chat: Option<StartingChat>,
}

impl Handoff {
    /// A handoff to `agent`, after the current turn.
    pub fn to(agent: Agent) -> Self {
        Self {
            agent,
            message: None,
            interrupt: false,
            chat: None,
        }
    }

    /// Sets the message the handing-off tool call returns to the model.
    pub fn with_message(mut self, message: impl Into<String>) -> Self {
        self.message = Some(message.into());
        self
    }

    /// Sets the chat context the new agent starts with: none, all or the last items of
    /// the current agent's, or one given. Wins over the agent's and the session's choice.
    pub fn with_chat(mut self, chat: StartingChat) -> Self {
        self.chat = Some(chat);
        self
    }

    /// Interrupts the current turn (its speech and LLM step stop, its calls get their
    /// outputs) and runs before anything queued: what a supervisor taking over sends.
    pub fn interrupting(mut self) -> Self {
        self.interrupt = true;
        self
    }
}

/// A handoff as a snapshot writes it: its agent by name with the data it was built with
/// (the restoring side's agent registry builds it again), its message and starting chat.
/// Whether it interrupts is not kept: a handoff in a snapshot is queued, or asked for by an
/// output, and runs when its turn comes.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct HandoffState {
    pub(crate) agent: String,
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub(crate) data: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) chat: Option<StartingChatState>,
}

impl Handoff {
    /// What a snapshot writes of it.
    pub(crate) fn state(&self) -> HandoffState {
        HandoffState {
            agent: self.agent.name().to_owned(),
            data: self.agent.restore_data().clone(),
            message: self.message.clone(),
            chat: self.chat.as_ref().map(StartingChat::state),
        }
    }
}

impl HandoffState {
    /// The handoff again, to `agent` (built from its name and data by the registry).
    pub(crate) fn restore(&self, agent: Agent) -> Handoff {
        let mut handoff = Handoff::to(agent);
        handoff.message = self.message.clone();
        handoff.chat = self.chat.as_ref().map(StartingChatState::restore);
        handoff
    }
}
