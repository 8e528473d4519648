//! Endpointing: when the user's words make a turn.
//!
//! A final transcript does not start a turn at once: the session waits `endpointing_delay`
//! for more of the user's words, and finals within it join one user message, so an STT
//! that splits a sentence in two costs one LLM request. The user speaking again inside
//! the delay holds it until they stop; the delay runs again from there. A plain type: the
//! session feeds it what the host says and the time, and carries out what it answers.
//!
//! The text one user turn gathers is bounded ([`MAX_USER_TEXT`]): words past it are
//! refused with a reason the session reports, never dropped silently and never kept
//! without bound.

use std::time::Duration;

use tokio::time::Instant;

/// How many bytes of the user's words one user turn may gather.
pub(crate) const MAX_USER_TEXT: usize = 64 * 1024;

/// The user's words waiting for the end of their turn.
#[derive(Debug)]
pub(crate) struct Endpointing {
    delay: Duration,
    pending: Option<Pending>,
}

#[derive(Debug)]
struct Pending {
    text: String,
    /// When the turn ends, unless more words come; none while the user speaks.
    deadline: Option<Instant>,
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
    /// Endpointing with `delay` (zero: every final is a turn at once).
    pub(crate) fn new(delay: Duration) -> Self {
        Self {
            delay,
            pending: None,
        }
    }

    /// A final transcript with words, at `now`, with the user speaking or not.
    pub(crate) fn final_words(&mut self, text: &str, now: Instant, speaking: bool) -> Heard {
        let held = self.pending.as_ref().map_or(0, |p| p.text.len() + 1);
        if held + text.len() > MAX_USER_TEXT {
            return Heard::Refused {
                bytes: held + text.len(),
            };
        }
        if self.delay.is_zero() && self.pending.is_none() {
            return Heard::Now(text.to_owned());
        }
        let deadline = (!speaking).then(|| now + self.delay);
        match &mut self.pending {
            Some(pending) => {
                pending.text.push(' ');
                pending.text.push_str(text);
                pending.deadline = deadline;
            }
            None => {
                self.pending = Some(Pending {
                    text: text.to_owned(),
                    deadline,
                })
            }
        }
        Heard::Held
    }

    /// The user started speaking: a pending turn waits for them to stop.
    pub(crate) fn user_started(&mut self) {
        if let Some(pending) = &mut self.pending {
            pending.deadline = None;
        }
    }

    /// The user stopped speaking at `now`: a pending turn ends after the delay.
    pub(crate) fn user_stopped(&mut self, now: Instant) {
        if let Some(pending) = &mut self.pending {
            pending.deadline = Some(now + self.delay);
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
            deadline: Some(now + self.delay),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DELAY: Duration = Duration::from_millis(500);

    #[test]
    fn restored_words_end_their_turn_a_delay_after_the_restore_and_take_more_words() {
        let mut e = Endpointing::new(DELAY);
        let t0 = Instant::now();
        e.restore("I want".into(), t0);
        assert_eq!(e.held(), Some("I want"));
        assert_eq!(e.deadline(), Some(t0 + DELAY));
        assert_eq!(e.final_words("a table", t0, false), Heard::Held);
        assert_eq!(e.due(t0 + DELAY), Some("I want a table".into()));
        assert_eq!(e.held(), None);
    }

    #[test]
    fn restored_words_with_no_delay_are_due_at_once() {
        let mut e = Endpointing::new(Duration::ZERO);
        let t0 = Instant::now();
        e.restore("hello".into(), t0);
        assert_eq!(e.due(t0), Some("hello".into()));
    }

    #[test]
    fn with_no_delay_a_final_is_a_turn_at_once() {
        let mut e = Endpointing::new(Duration::ZERO);
        let now = Instant::now();
        assert_eq!(e.final_words("hi", now, false), Heard::Now("hi".into()));
        assert!(!e.is_pending());
    }

    #[test]
    fn finals_within_the_delay_join_one_turn() {
        let mut e = Endpointing::new(DELAY);
        let t0 = Instant::now();
        assert_eq!(e.final_words("I want", t0, false), Heard::Held);
        assert_eq!(e.deadline(), Some(t0 + DELAY));
        let t1 = t0 + Duration::from_millis(300);
        assert_eq!(e.due(t1), None);
        assert_eq!(e.final_words("a table", t1, false), Heard::Held);
        // The second final moved the end of the turn.
        assert_eq!(e.due(t0 + DELAY), None);
        assert_eq!(e.due(t1 + DELAY), Some("I want a table".into()));
        assert!(!e.is_pending());
    }

    #[test]
    fn speech_inside_the_delay_holds_it_until_the_user_stops() {
        let mut e = Endpointing::new(DELAY);
        let t0 = Instant::now();
        e.final_words("I want", t0, false);
        e.user_started();
        assert_eq!(e.deadline(), None);
        assert_eq!(e.due(t0 + Duration::from_secs(60)), None);
        let t1 = t0 + Duration::from_secs(61);
        e.user_stopped(t1);
        assert_eq!(e.due(t1), None);
        assert_eq!(e.due(t1 + DELAY), Some("I want".into()));
    }

    #[test]
    fn a_final_while_the_user_still_speaks_waits_for_them_to_stop() {
        let mut e = Endpointing::new(DELAY);
        let t0 = Instant::now();
        assert_eq!(e.final_words("hello", t0, true), Heard::Held);
        assert_eq!(e.deadline(), None);
        // Speech that starts or stops with nothing pending changes nothing.
        let mut idle = Endpointing::new(DELAY);
        idle.user_started();
        idle.user_stopped(t0);
        assert!(!idle.is_pending());
    }

    #[test]
    fn words_past_the_bound_are_refused_and_the_turn_keeps_what_it_had() {
        let mut e = Endpointing::new(DELAY);
        let t0 = Instant::now();
        let chunk = "x".repeat(MAX_USER_TEXT / 2);
        assert_eq!(e.final_words(&chunk, t0, false), Heard::Held);
        assert!(matches!(
            e.final_words(&chunk, t0, false),
            Heard::Refused { .. }
        ));
        assert_eq!(e.due(t0 + DELAY), Some(chunk));
        let mut zero = Endpointing::new(Duration::ZERO);
        assert!(matches!(
            zero.final_words(&"y".repeat(MAX_USER_TEXT + 1), t0, false),
            Heard::Refused { .. }
        ));
    }
}
