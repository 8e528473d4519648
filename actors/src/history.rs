//! `SessionHistory`: what was said in a session, agent by agent.

use crate::chat::ChatContext;
use crate::ids::ActorId;

/// The chat context one activation of an agent ended with (or has now).
#[derive(Clone, Debug, PartialEq)]
pub struct AgentChat {
    /// The agent's name.
    pub agent: String,
    /// The activity (one activation of the agent): `activity/s1/booker#2`.
    pub activity: ActorId,
    /// Its chat context.
    pub chat: ChatContext,
}

/// The transcript of a session: the final chat context of every activation of every
/// agent, in the order they started. `Session::close` returns it, so a host can store
/// what was said on a call.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SessionHistory {
    /// One entry per activation, oldest first.
    pub agents: Vec<AgentChat>,
}

impl SessionHistory {
    /// The chat context of the latest activation of `agent`, if it ran.
    pub fn chat_of(&self, agent: &str) -> Option<&ChatContext> {
        self.agents
            .iter()
            .rev()
            .find(|entry| entry.agent == agent)
            .map(|entry| &entry.chat)
    }

    /// Records an activation's chat context: a new entry when it starts (so the order is
    /// the start order), replaced by its final context when it closes.
    pub(crate) fn record(&mut self, entry: AgentChat) {
        match self
            .agents
            .iter_mut()
            .find(|e| e.activity == entry.activity)
        {
            Some(existing) => *existing = entry,
            None => self.agents.push(entry),
        }
    }
}
