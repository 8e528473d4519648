//! `Handoff`: the conversation moves to another agent.

use crate::agent::Agent;

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
}

impl Handoff {
    /// A handoff to `agent`, after the current turn.
    pub fn to(agent: Agent) -> Self {
        Self {
            agent,
            message: None,
            interrupt: false,
        }
    }

    /// Sets the message the handing-off tool call returns to the model.
    pub fn with_message(mut self, message: impl Into<String>) -> Self {
        self.message = Some(message.into());
        self
    }

    /// Interrupts the current turn (its speech and LLM step stop, its calls get their
    /// outputs) and runs before anything queued: what a supervisor taking over sends.
    pub fn interrupting(mut self) -> Self {
        self.interrupt = true;
        self
    }
}
