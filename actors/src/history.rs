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
}

/// The history as the session builds it: each activation's final chat context, recorded
/// when it closes (nothing is kept for a running one), put in start order at the end.
#[derive(Debug, Default)]
pub(crate) struct HistoryBook {
    closed: Vec<(u32, AgentChat)>,
}

impl HistoryBook {
    /// Records the final context of the activation started `order`-th; a second record of
    /// the same activation (a close racing a handoff) replaces the first.
    pub(crate) fn record(&mut self, order: u32, entry: AgentChat) {
        match self
            .closed
            .iter_mut()
            .find(|(_, e)| e.activity == entry.activity)
        {
            Some(existing) => *existing = (order, entry),
            None => self.closed.push((order, entry)),
        }
    }

    /// The history, activations in the order they started.
    pub(crate) fn finish(&mut self) -> SessionHistory {
        let mut closed = std::mem::take(&mut self.closed);
        closed.sort_by_key(|(order, _)| *order);
        SessionHistory {
            agents: closed.into_iter().map(|(_, entry)| entry).collect(),
        }
    }
}
