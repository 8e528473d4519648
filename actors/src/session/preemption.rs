//! When the session asks the current agent for a preemptive request: at a final transcript
//! whose words wait for the endpointing delay, while the agent is idle, at most
//! `max_retries` times per user turn, and only while the user has spoken less than
//! `max_speech_duration` in the turn. A plain type: the session feeds it the user's voice
//! and finals, and the turns it confirms.

use tokio::time::Instant;

use crate::turn_handling::PreemptiveGeneration;

/// What the session asks of the current agent at a final.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ask {
    /// Start a preemptive request on the words so far (one under way is replaced).
    Start,
    /// Drop the one under way: the user went on and no new try is allowed.
    Drop,
    /// Nothing.
    Nothing,
}

/// Preemptive requests asked for in the user's turn under way.
#[derive(Debug, Default)]
pub(crate) struct Preemption {
    /// Requests asked for since the last confirmed turn.
    tries: u32,
    /// When the user began this turn (their first speech or final since the last).
    began: Option<Instant>,
}

impl Preemption {
    /// The user started speaking at `now`.
    pub(crate) fn user_started(&mut self, now: Instant) {
        self.began.get_or_insert(now);
    }

    /// A final's words wait for the end of the turn at `now`, the agent idle or not:
    /// whether to start a preemptive request on them now (counted when so), or to drop the
    /// one under way (its words are stale and no new try is allowed).
    pub(crate) fn ask(&mut self, now: Instant, idle: bool, rules: &PreemptiveGeneration) -> Ask {
        let began = *self.began.get_or_insert(now);
        let allowed = rules.enabled
            && idle
            && self.tries < rules.max_retries
            && now.saturating_duration_since(began) <= rules.max_speech_duration;
        if allowed {
            self.tries += 1;
            Ask::Start
        } else if self.tries > 0 {
            Ask::Drop
        } else {
            Ask::Nothing
        }
    }

    /// The user's turn was confirmed (or cut short): the next one starts afresh.
    pub(crate) fn turn_confirmed(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn at_most_three_tries_per_user_turn_and_only_when_idle() {
        let t0 = Instant::now();
        let on = PreemptiveGeneration::on();
        let mut p = Preemption::default();
        assert_eq!(
            p.ask(t0, false, &on),
            Ask::Nothing,
            "a turn runs: no request"
        );
        assert_eq!(p.ask(t0, true, &on), Ask::Start);
        assert_eq!(p.ask(t0, true, &on), Ask::Start);
        assert_eq!(p.ask(t0, true, &on), Ask::Start);
        assert_eq!(
            p.ask(t0, true, &on),
            Ask::Drop,
            "the fourth try is refused, and the third's words are stale"
        );
        p.turn_confirmed();
        assert_eq!(p.ask(t0, true, &on), Ask::Start);
        let off = PreemptiveGeneration::off();
        assert_eq!(Preemption::default().ask(t0, true, &off), Ask::Nothing);
    }

    #[test]
    fn only_for_speech_under_the_maximum_duration() {
        let t0 = Instant::now();
        let on = PreemptiveGeneration::on();
        let mut p = Preemption::default();
        p.user_started(t0);
        assert_eq!(p.ask(t0 + Duration::from_secs(9), true, &on), Ask::Start);
        assert_eq!(p.ask(t0 + Duration::from_secs(11), true, &on), Ask::Drop);
    }
}
