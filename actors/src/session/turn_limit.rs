//! User-turn limits: how long the user has spoken without the agent answering. The user's
//! final words are counted, and the time since they began, from the first of their words
//! after the agent last began to speak; the agent speaking again starts the count over.
//! A plain type: the session feeds it each final that makes (or joins) a turn and when the
//! agent last spoke; past a limit it answers what was exceeded, once, and starts over.

use std::time::Duration;

use tokio::time::Instant;

use crate::turn_handling::{words, UserTurnLimit};

/// The user's words since the agent last spoke.
#[derive(Debug, Default)]
pub(crate) struct UserTurnTracker {
    /// When the user began (their first start of speech, or first final, in the window).
    started: Option<Instant>,
    words: u32,
    transcript: String,
}

/// A limit was passed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Exceeded {
    pub(crate) transcript: String,
    pub(crate) words: u32,
    pub(crate) duration: Duration,
}

impl UserTurnTracker {
    /// The user started speaking at `now`.
    pub(crate) fn user_started(&mut self, now: Instant, agent_spoke: Option<Instant>) {
        self.start_over_if_answered(agent_spoke);
        self.started.get_or_insert(now);
    }

    /// A final of the user's, at `now`; `agent_spoke`: when the agent last began to speak.
    pub(crate) fn final_words(
        &mut self,
        text: &str,
        now: Instant,
        agent_spoke: Option<Instant>,
        limit: &UserTurnLimit,
    ) -> Option<Exceeded> {
        if !limit.is_set() {
            return None;
        }
        self.start_over_if_answered(agent_spoke);
        let started = *self.started.get_or_insert(now);
        let count = u32::try_from(words::count(text)).unwrap_or(u32::MAX);
        self.words = self.words.saturating_add(count);
        if !self.transcript.is_empty() {
            self.transcript.push(' ');
        }
        self.transcript.push_str(text);
        let duration = now.saturating_duration_since(started);
        let too_many = limit.max_words.is_some_and(|max| self.words >= max);
        let too_long = limit.max_duration.is_some_and(|max| duration >= max);
        if !(too_many || too_long) {
            return None;
        }
        let exceeded = Exceeded {
            transcript: std::mem::take(&mut self.transcript),
            words: self.words,
            duration,
        };
        *self = Self::default();
        Some(exceeded)
    }

    /// The agent spoke after the user began: their count starts over.
    fn start_over_if_answered(&mut self, agent_spoke: Option<Instant>) {
        if let (Some(started), Some(spoke)) = (self.started, agent_spoke) {
            if spoke > started {
                *self = Self::default();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn words_add_up_over_finals_until_the_limit() {
        let t0 = Instant::now();
        let limit = UserTurnLimit::new().max_words(6);
        let mut t = UserTurnTracker::default();
        assert_eq!(t.final_words("one two three", t0, None, &limit), None);
        assert_eq!(
            t.final_words("four five six", t0 + ms(900), None, &limit),
            Some(Exceeded {
                transcript: "one two three four five six".into(),
                words: 6,
                duration: ms(900),
            })
        );
        assert_eq!(
            t.final_words("seven", t0 + ms(1000), None, &limit),
            None,
            "starts over"
        );
    }

    #[test]
    fn time_counts_from_the_start_of_speech_and_the_agent_speaking_resets_it() {
        let t0 = Instant::now();
        let limit = UserTurnLimit::new().max_duration(ms(10_000));
        let mut t = UserTurnTracker::default();
        t.user_started(t0, None);
        assert_eq!(t.final_words("a", t0 + ms(5000), None, &limit), None);
        // The agent spoke at 6 s: the user's next words count from their own start.
        t.user_started(t0 + ms(8000), Some(t0 + ms(6000)));
        assert_eq!(
            t.final_words("b", t0 + ms(12_000), Some(t0 + ms(6000)), &limit),
            None
        );
        assert!(t
            .final_words("c", t0 + ms(18_000), Some(t0 + ms(6000)), &limit)
            .is_some());
    }

    #[test]
    fn without_a_limit_nothing_is_counted() {
        let mut t = UserTurnTracker::default();
        let t0 = Instant::now();
        for _ in 0..100 {
            assert_eq!(
                t.final_words("many words here", t0, None, &UserTurnLimit::new()),
                None
            );
        }
        assert!(t.transcript.is_empty());
    }
}
