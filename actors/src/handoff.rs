//! `Handoff`: the conversation moves to another agent.

use crate::agent::Agent;
use crate::starting_chat::StartingChat;

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
