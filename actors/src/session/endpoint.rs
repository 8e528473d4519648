//! Endpointing: when the user's words make a turn.
//!
//! A final transcript does not start a turn at once: the session waits the endpointing
//! delay for more of the user's words, and finals within it join one user message, so an
//! STT that splits a sentence in two costs one LLM request. The user speaking again inside
//! the delay holds it until they stop; the delay runs again from there. The delay is fixed,
//! or learned from the caller's pauses (`pauses.rs`); a final the host's classifier finds
//! unlikely to end the turn waits the maximum delay instead. A plain type: the session
//! feeds it what the host says and the time, and carries out what it answers.
//!
//! The text one user turn gathers is bounded ([`MAX_USER_TEXT`]): words past it are
//! refused with a reason the session reports, never dropped silently and never kept
//! without bound.

use std::time::Duration;

use tokio::time::Instant;

use super::pauses::Pauses;
use crate::shared::AgentSpeech;
use crate::turn_handling::{EndOfTurn, Endpointing as Rules, EndpointingMode};

/// How many bytes of the user's words one user turn may gather.
pub(crate) const MAX_USER_TEXT: usize = 64 * 1024;

/// The user's words waiting for the end of their turn.
#[derive(Debug)]
pub(crate) struct Endpointing {
    rules: Rules,
    delay: Delay,
    pending: Option<Pending>,
}

/// Where the delay comes from.
#[derive(Debug)]
enum Delay {
    Fixed,
    Dynamic(Pauses),
}

#[derive(Debug)]
struct Pending {
    text: String,
    /// When the turn ends, unless more words come; none while the user speaks.
    deadline: Option<Instant>,
    /// The classifier found the words unlikely to end the turn: the maximum delay.
    unlikely: bool,
}

/// What becomes of a final transcript.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Heard {
    /// The user's turn is complete now (no delay): start it with this text.
    Now(String),
    /// Held until the deadline (none while the user speaks).
    Held,
    /// Too many words for one turn: these were not kept.
    Refused {
        /// The size the words would have made.
        bytes: usize,
    },
}

impl Endpointing {
    /// Endpointing by `rules` (a zero fixed delay: every final is a turn at once).
    pub(crate) fn new(rules: &Rules) -> Self {
        Self {
            rules: *rules,
            delay: Delay::of(rules),
            pending: None,
        }
    }

    /// Takes the current agent's rules; a change starts the learning again (the words
    /// waiting stay).
    pub(crate) fn set_rules(&mut self, rules: &Rules) {
        if self.rules != *rules {
            self.rules = *rules;
            self.delay = Delay::of(rules);
        }
    }

    /// The delay a final waits now (`unlikely`: the classifier doubts the turn ended).
    pub(crate) fn delay(&self, unlikely: bool) -> Duration {
        if unlikely {
            return self.rules.max_delay;
        }
        match &self.delay {
            Delay::Fixed => self.rules.min_delay,
            Delay::Dynamic(pauses) => pauses.delay(),
        }
    }

    /// A final transcript with words, at `now`, with the user speaking or not; `end` is
    /// the classifier's view of the words so far.
    pub(crate) fn final_words(
        &mut self,
        text: &str,
        now: Instant,
        speaking: bool,
        end: EndOfTurn,
    ) -> Heard {
        let held = self.pending.as_ref().map_or(0, |p| p.text.len() + 1);
        if held + text.len() > MAX_USER_TEXT {
            return Heard::Refused {
                bytes: held + text.len(),
            };
        }
        let unlikely = end == EndOfTurn::Unlikely;
        let delay = self.delay(unlikely);
        if delay.is_zero() && self.pending.is_none() {
            return Heard::Now(text.to_owned());
        }
        let deadline = (!speaking).then(|| now + delay);
        match &mut self.pending {
            Some(pending) => {
                pending.text.push(' ');
                pending.text.push_str(text);
                pending.deadline = deadline;
                pending.unlikely = unlikely;
            }
            None => {
                self.pending = Some(Pending {
                    text: text.to_owned(),
                    deadline,
                    unlikely,
                })
            }
        }
        Heard::Held
    }

    /// The user started speaking at `now`: a pending turn waits for them to stop.
    pub(crate) fn user_started(&mut self, now: Instant) {
        if let Delay::Dynamic(pauses) = &mut self.delay {
            pauses.user_started(now);
        }
        if let Some(pending) = &mut self.pending {
            pending.deadline = None;
        }
    }

    /// The user stopped speaking at `now`: a pending turn ends after the delay.
    pub(crate) fn user_stopped(&mut self, now: Instant, agent: AgentSpeech) {
        if let Delay::Dynamic(pauses) = &mut self.delay {
            pauses.user_stopped(now, agent);
        }
        let unlikely = self.pending.as_ref().is_some_and(|p| p.unlikely);
        let delay = self.delay(unlikely);
        if let Some(pending) = &mut self.pending {
            pending.deadline = Some(now + delay);
        }
    }

    /// The user's words, if their turn has ended by `now`.
    pub(crate) fn due(&mut self, now: Instant) -> Option<String> {
        let deadline = self.pending.as_ref()?.deadline?;
        if deadline > now {
            return None;
        }
        self.pending.take().map(|p| p.text)
    }

    /// The words waiting, now, whatever the deadline (the user's turn was cut short).
    pub(crate) fn take(&mut self) -> Option<String> {
        self.pending.take().map(|p| p.text)
    }

    /// When the pending turn ends, if one is pending and the user is not speaking.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.pending.as_ref()?.deadline
    }

    /// Whether words are waiting for the end of the user's turn.
    pub(crate) fn is_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// The words waiting for the end of the user's turn, for a snapshot: accepted input
    /// the host will not send again.
    pub(crate) fn held(&self) -> Option<&str> {
        self.pending.as_ref().map(|p| p.text.as_str())
    }

    /// Words a snapshot held, at `now` in a restored session. Whether the user was
    /// speaking is not kept (the host reports it again), so the turn ends a delay after
    /// the restore unless more words or speech come first.
    pub(crate) fn restore(&mut self, text: String, now: Instant) {
        self.pending = Some(Pending {
            text,
            deadline: Some(now + self.delay(false)),
            unlikely: false,
        });
    }
}

impl Delay {
    fn of(rules: &Rules) -> Self {
        match rules.mode {
            EndpointingMode::Fixed => Self::Fixed,
            EndpointingMode::Dynamic { alpha } => {
                Self::Dynamic(Pauses::new(rules.min_delay, rules.max_delay, alpha))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::turn_handling::EndOfTurn;

    const DELAY: Duration = Duration::from_millis(500);

    #[test]
    fn restored_words_end_their_turn_a_delay_after_the_restore_and_take_more_words() {
        let mut e = Endpointing::new(&Rules::fixed(DELAY));
        let t0 = Instant::now();
        e.restore("I want".into(), t0);
        assert_eq!(e.held(), Some("I want"));
        assert_eq!(e.deadline(), Some(t0 + DELAY));
        assert_eq!(
            e.final_words("a table", t0, false, EndOfTurn::Likely),
            Heard::Held
        );
        assert_eq!(e.due(t0 + DELAY), Some("I want a table".into()));
        assert_eq!(e.held(), None);
    }

    #[test]
    fn restored_words_with_no_delay_are_due_at_once() {
        let mut e = Endpointing::new(&Rules::fixed(Duration::ZERO));
        let t0 = Instant::now();
        e.restore("hello".into(), t0);
        assert_eq!(e.due(t0), Some("hello".into()));
    }

    #[test]
    fn with_no_delay_a_final_is_a_turn_at_once() {
        let mut e = Endpointing::new(&Rules::fixed(Duration::ZERO));
        let now = Instant::now();
        assert_eq!(
            e.final_words("hi", now, false, EndOfTurn::Likely),
            Heard::Now("hi".into())
        );
        assert!(!e.is_pending());
    }

    #[test]
    fn finals_within_the_delay_join_one_turn() {
        let mut e = Endpointing::new(&Rules::fixed(DELAY));
        let t0 = Instant::now();
        assert_eq!(
            e.final_words("I want", t0, false, EndOfTurn::Likely),
            Heard::Held
        );
        assert_eq!(e.deadline(), Some(t0 + DELAY));
        let t1 = t0 + Duration::from_millis(300);
        assert_eq!(e.due(t1), None);
        assert_eq!(
            e.final_words("a table", t1, false, EndOfTurn::Likely),
            Heard::Held
        );
        // The second final moved the end of the turn.
        assert_eq!(e.due(t0 + DELAY), None);
        assert_eq!(e.due(t1 + DELAY), Some("I want a table".into()));
        assert!(!e.is_pending());
    }

    #[test]
    fn speech_inside_the_delay_holds_it_until_the_user_stops() {
        let mut e = Endpointing::new(&Rules::fixed(DELAY));
        let t0 = Instant::now();
        e.final_words("I want", t0, false, EndOfTurn::Likely);
        e.user_started(t0);
        assert_eq!(e.deadline(), None);
        assert_eq!(e.due(t0 + Duration::from_secs(60)), None);
        let t1 = t0 + Duration::from_secs(61);
        e.user_stopped(t1, AgentSpeech::default());
        assert_eq!(e.due(t1), None);
        assert_eq!(e.due(t1 + DELAY), Some("I want".into()));
    }

    #[test]
    fn a_final_while_the_user_still_speaks_waits_for_them_to_stop() {
        let mut e = Endpointing::new(&Rules::fixed(DELAY));
        let t0 = Instant::now();
        assert_eq!(
            e.final_words("hello", t0, true, EndOfTurn::Likely),
            Heard::Held
        );
        assert_eq!(e.deadline(), None);
        // Speech that starts or stops with nothing pending changes nothing.
        let mut idle = Endpointing::new(&Rules::fixed(DELAY));
        idle.user_started(t0);
        idle.user_stopped(t0, AgentSpeech::default());
        assert!(!idle.is_pending());
    }

    #[test]
    fn words_past_the_bound_are_refused_and_the_turn_keeps_what_it_had() {
        let mut e = Endpointing::new(&Rules::fixed(DELAY));
        let t0 = Instant::now();
        let chunk = "x".repeat(MAX_USER_TEXT / 2);
        assert_eq!(
            e.final_words(&chunk, t0, false, EndOfTurn::Likely),
            Heard::Held
        );
        assert!(matches!(
            e.final_words(&chunk, t0, false, EndOfTurn::Likely),
            Heard::Refused { .. }
        ));
        assert_eq!(e.due(t0 + DELAY), Some(chunk));
        let mut zero = Endpointing::new(&Rules::fixed(Duration::ZERO));
        assert!(matches!(
            zero.final_words(&"y".repeat(MAX_USER_TEXT + 1), t0, false, EndOfTurn::Likely),
            Heard::Refused { .. }
        ));
    }

    #[test]
    fn words_the_classifier_finds_unfinished_wait_the_maximum_delay() {
        let rules = Rules::fixed(DELAY).max_delay(Duration::from_secs(2));
        let mut e = Endpointing::new(&rules);
        let t0 = Instant::now();
        assert_eq!(
            e.final_words("I want to", t0, false, EndOfTurn::Unlikely),
            Heard::Held
        );
        assert_eq!(e.deadline(), Some(t0 + Duration::from_secs(2)));
        // More words that sound finished bring the usual delay back.
        let t1 = t0 + Duration::from_millis(800);
        e.final_words("book a table", t1, false, EndOfTurn::Likely);
        assert_eq!(e.deadline(), Some(t1 + DELAY));
    }

    #[test]
    fn a_dynamic_delay_follows_the_callers_pauses() {
        let rules = Rules::dynamic(DELAY, Duration::from_secs(3)).alpha(0.5);
        let mut e = Endpointing::new(&rules);
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        e.user_started(t0);
        e.user_stopped(t0 + ms(1000), AgentSpeech::default());
        e.user_started(t0 + ms(2500));
        e.user_stopped(t0 + ms(3000), AgentSpeech::default());
        assert_eq!(e.delay(false), ms(1000));
        assert_eq!(
            e.final_words("and then", t0 + ms(3100), false, EndOfTurn::Likely),
            Heard::Held
        );
        assert_eq!(e.deadline(), Some(t0 + ms(4100)));
        // The same rules again keep what was learned; other rules start over.
        e.set_rules(&rules);
        assert_eq!(e.delay(false), ms(1000));
        e.set_rules(&Rules::fixed(DELAY));
        assert_eq!(e.delay(false), DELAY);
    }
}
