//! How fast the agents answered: each turn's latency, and each agent's over the call.
//!
//! A turn's latency is measured by the agent that runs it, from the moment the user was
//! done asking — the end of their speech (the host's `user_stopped_speaking` before the
//! words that made the turn; the final transcript when no speech was reported) or the
//! host's `run` — to the first text handed to the speech output. The session keeps each
//! agent's sums across handoffs and sub-tasks (by agent name) and in its snapshots.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The latency of one turn.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnLatency {
    /// From the end of the user's speech (or the host's call that asked for the turn) to
    /// the first text of the answer handed to the output — what the caller waits before
    /// the agent starts to speak, less the host's text-to-speech. None when the turn said
    /// nothing.
    pub end_to_first_audio: Option<Duration>,
    /// From the turn's first LLM request to its first chunk (for a preemptive request,
    /// from when it started ahead of the turn). None when no request answered.
    pub time_to_first_token: Option<Duration>,
    /// How long the turn waited for its tool calls' outputs, summed over its steps.
    pub tools: Duration,
    /// Whether the turn's first request was a preemptive one, started before the user's
    /// turn was confirmed.
    pub preemptive: bool,
}

impl TurnLatency {
    /// Whether nothing was measured.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// Sums of one latency over some turns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatencyStats {
    /// Turns measured.
    pub count: u32,
    /// The sum over them.
    pub total: Duration,
    /// The longest.
    pub max: Duration,
}

impl LatencyStats {
    /// Adds one measurement.
    pub fn record(&mut self, latency: Duration) {
        self.count = self.count.saturating_add(1);
        self.total = self.total.saturating_add(latency);
        self.max = self.max.max(latency);
    }

    /// The mean, if anything was measured.
    pub fn mean(&self) -> Option<Duration> {
        (self.count > 0).then(|| self.total / self.count)
    }
}

/// One agent's latency over the call (every activation of it: an agent handed back to
/// after a handoff goes on adding here).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentLatency {
    /// Turns the agent ran.
    pub turns: u32,
    /// End of the user's speech to the first text out ([`TurnLatency::end_to_first_audio`]).
    pub end_to_first_audio: LatencyStats,
    /// Time to the first token of each turn's first request.
    pub time_to_first_token: LatencyStats,
    /// Time the turns waited for tools.
    pub tools: LatencyStats,
    /// Turns whose first request was a preemptive one.
    pub preemptive_turns: u32,
}

impl AgentLatency {
    /// Adds one turn.
    pub fn record(&mut self, turn: &TurnLatency) {
        self.turns = self.turns.saturating_add(1);
        if let Some(e2e) = turn.end_to_first_audio {
            self.end_to_first_audio.record(e2e);
        }
        if let Some(ttft) = turn.time_to_first_token {
            self.time_to_first_token.record(ttft);
        }
        if !turn.tools.is_zero() {
            self.tools.record(turn.tools);
        }
        if turn.preemptive {
            self.preemptive_turns = self.preemptive_turns.saturating_add(1);
        }
    }
}

/// Each agent's latency over the call, by agent name (`Session::latency()`).
pub type SessionLatency = BTreeMap<String, AgentLatency>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_sums_its_turns_and_keeps_the_longest() {
        let mut agent = AgentLatency::default();
        agent.record(&TurnLatency {
            end_to_first_audio: Some(Duration::from_millis(800)),
            time_to_first_token: Some(Duration::from_millis(300)),
            tools: Duration::ZERO,
            preemptive: false,
        });
        agent.record(&TurnLatency {
            end_to_first_audio: Some(Duration::from_millis(400)),
            time_to_first_token: None,
            tools: Duration::from_secs(1),
            preemptive: true,
        });
        agent.record(&TurnLatency::default());
        assert_eq!(agent.turns, 3);
        assert_eq!(agent.end_to_first_audio.count, 2);
        assert_eq!(
            agent.end_to_first_audio.mean(),
            Some(Duration::from_millis(600))
        );
        assert_eq!(agent.end_to_first_audio.max, Duration::from_millis(800));
        assert_eq!(agent.time_to_first_token.count, 1);
        assert_eq!(agent.tools.count, 1);
        assert_eq!(agent.preemptive_turns, 1);
        assert_eq!(LatencyStats::default().mean(), None);
    }
}
