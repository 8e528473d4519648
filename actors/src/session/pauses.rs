//! A dynamic endpointing delay, learned from the caller's pauses (LiveKit's
//! `DynamicEndpointing`): a moving average of
//!
//! 1. the pauses between the user's utterances with no agent speech in between
//!    (`[utterance] [pause] [utterance]`: the delay should cover such a pause), and
//! 2. a pause the agent answered too early: the user paused, the agent began to speak,
//!    and the user went on at once over it (within the current delay of the agent's
//!    start) — that pause was not the end of their turn either.
//!
//! A pause across an agent turn the user did not talk over is not learned (it is a turn
//! taken, not a pause within one). The average starts at the minimum delay and stays
//! between the minimum and the maximum. A plain type, fed the user's voice and when the
//! agent last spoke; each rule is a unit test below.

use std::time::Duration;

use tokio::time::Instant;

use crate::shared::AgentSpeech;

/// The learned delay and the user's last utterance.
#[derive(Debug)]
pub(crate) struct Pauses {
    alpha: f64,
    min: Duration,
    max: Duration,
    /// The moving average, seconds.
    average: f64,
    utterance_started: Option<Instant>,
    utterance_ended: Option<Instant>,
}

impl Pauses {
    pub(crate) fn new(min: Duration, max: Duration, alpha: f64) -> Self {
        Self {
            alpha,
            min,
            max,
            average: min.as_secs_f64(),
            utterance_started: None,
            utterance_ended: None,
        }
    }

    /// The delay now.
    pub(crate) fn delay(&self) -> Duration {
        Duration::from_secs_f64(self.average).clamp(self.min, self.max)
    }

    /// The user began an utterance at `at`.
    pub(crate) fn user_started(&mut self, at: Instant) {
        self.utterance_started = Some(at);
    }

    /// The user ended an utterance at `at`; `agent` says when the agent last began and
    /// stopped speaking.
    pub(crate) fn user_stopped(&mut self, at: Instant, agent: AgentSpeech) {
        if let (Some(start), Some(previous_end)) = (self.utterance_started, self.utterance_ended) {
            let pause = start.saturating_duration_since(previous_end);
            match agent.started.filter(|began| *began > previous_end) {
                // The agent spoke since the user's previous utterance.
                Some(agent_start) => {
                    let talked_over = agent.ended.is_none_or(|ended| ended > start);
                    let answer_delay = agent_start.saturating_duration_since(previous_end);
                    let went_on_after = if start >= agent_start {
                        start - agent_start
                    } else {
                        agent_start - start
                    };
                    if talked_over
                        && !went_on_after.is_zero()
                        && went_on_after <= self.delay()
                        && !answer_delay.is_zero()
                        && answer_delay <= self.max
                        && !pause.is_zero()
                    {
                        self.learn(pause);
                    }
                }
                None if !pause.is_zero() => self.learn(pause),
                None => {}
            }
        }
        self.utterance_ended = Some(at);
        self.utterance_started = None;
    }

    fn learn(&mut self, pause: Duration) {
        let average = self.alpha * self.average + (1.0 - self.alpha) * pause.as_secs_f64();
        self.average = average.clamp(self.min.as_secs_f64(), self.max.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn pauses() -> Pauses {
        Pauses::new(ms(500), ms(3000), 0.5)
    }

    const SILENT: AgentSpeech = AgentSpeech {
        started: None,
        ended: None,
    };

    #[test]
    fn pauses_between_utterances_move_the_delay_toward_them() {
        let t0 = Instant::now();
        let mut p = pauses();
        assert_eq!(p.delay(), ms(500));
        p.user_started(t0);
        p.user_stopped(t0 + ms(1000), SILENT);
        // A 1.5 s pause, then the user goes on.
        p.user_started(t0 + ms(2500));
        p.user_stopped(t0 + ms(3000), SILENT);
        assert_eq!(p.delay(), ms(1000), "halfway from 0.5 s to 1.5 s");
        p.user_started(t0 + ms(4500));
        p.user_stopped(t0 + ms(5000), SILENT);
        assert_eq!(p.delay(), ms(1250));
    }

    #[test]
    fn the_delay_stays_between_its_bounds() {
        let t0 = Instant::now();
        let mut p = pauses();
        p.user_started(t0);
        p.user_stopped(t0 + ms(100), SILENT);
        p.user_started(t0 + ms(200));
        p.user_stopped(t0 + ms(300), SILENT);
        assert_eq!(p.delay(), ms(500), "never below the minimum");
        for i in 0..20u64 {
            p.user_started(t0 + ms(10_000 * (i + 1)));
            p.user_stopped(t0 + ms(10_000 * (i + 1) + 100), SILENT);
        }
        assert_eq!(p.delay(), ms(3000), "never above the maximum");
    }

    #[test]
    fn a_pause_the_agent_answered_too_early_is_learned() {
        let t0 = Instant::now();
        let mut p = pauses();
        p.user_started(t0);
        p.user_stopped(t0 + ms(1000), SILENT);
        // The agent answered 600 ms later; the user went on 300 ms into its speech.
        let agent = AgentSpeech {
            started: Some(t0 + ms(1600)),
            ended: None,
        };
        p.user_started(t0 + ms(1900));
        p.user_stopped(t0 + ms(2500), agent);
        assert_eq!(p.delay(), ms(700), "the 900 ms pause, averaged with 500 ms");
    }

    #[test]
    fn a_turn_the_agent_took_and_finished_is_not_a_pause() {
        let t0 = Instant::now();
        let mut p = pauses();
        p.user_started(t0);
        p.user_stopped(t0 + ms(1000), SILENT);
        let agent = AgentSpeech {
            started: Some(t0 + ms(1500)),
            ended: Some(t0 + ms(4000)),
        };
        p.user_started(t0 + ms(5000));
        p.user_stopped(t0 + ms(6000), agent);
        assert_eq!(p.delay(), ms(500));
        // Talking over the agent long after it began is an interruption, not a pause.
        let agent = AgentSpeech {
            started: Some(t0 + ms(6500)),
            ended: None,
        };
        p.user_started(t0 + ms(9000));
        p.user_stopped(t0 + ms(9500), agent);
        assert_eq!(p.delay(), ms(500));
    }
}
