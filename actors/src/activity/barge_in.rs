//! Barge-in: what the user talking over the agent does to its speech, as a
//! plain state machine the activity feeds with the user's input and its timers.
//!
//! The rules, each a unit test below. Without a word rule (the voice decides):
//! - The user starts speaking over an interruptible turn: a pausable output pauses at
//!   once; nothing else happens yet (with a zero `min_duration`: interrupted at once).
//! - The interruption becomes real once the user has spoken for `min_duration`, or a
//!   transcript (interim or final, with words) arrives: the turn is interrupted.
//! - The user stops before `min_duration` with no transcript: after
//!   `false_timeout` without one, the interruption was false — a paused speech resumes
//!   (`AgentFalseInterruption { resumed: true }`), an unpaused one was simply never
//!   stopped (`resumed: false`). Without a `false_timeout` the pause becomes an
//!   interruption when the user stops.
//! - Over an uninterruptible turn, or with no turn, the user's speech does nothing here.
//!
//! With a word rule (a word minimum, backchannel words or the host's classifier: the
//! session judges each transcript and says whether its words interrupt):
//! - The user's voice alone neither pauses nor interrupts the speech.
//! - Words that interrupt make it real once the user has also spoken `min_duration`
//!   (at once if they have); words that do not (a backchannel) change nothing.
//! - A final transcript whose words do not interrupt ends the barge-in.
//!
//! Time comes in as arguments, and the one deadline that matters now goes out
//! ([`BargeIn::deadline`]): the activation machine keeps at most one timer for it and
//! calls [`BargeIn::tick`] when it fires, so a storm of starts and stops arms no timer
//! per event.

use std::time::Duration;

use tokio::time::Instant;

/// The settings of barge-in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BargeInRules {
    /// How long the user must speak over the agent before it is a real interruption.
    pub(crate) min_duration: Duration,
    /// How long after the user stops, with no transcript, a paused speech waits before it
    /// resumes; `None`: it never resumes (the pause becomes an interruption).
    pub(crate) false_timeout: Option<Duration>,
    /// Whether the output may be paused on the user's voice (resuming false
    /// interruptions); false: as if it could not pause.
    pub(crate) pause: bool,
    /// Whether an interruption needs words that pass the session's rules.
    pub(crate) needs_words: bool,
}

/// Where a barge-in is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum BargeIn {
    /// Nobody talks over the agent.
    #[default]
    Quiet,
    /// The user talks over the agent since `since`; the output is paused if `paused`;
    /// `words`: their words passed the rules (with a word rule).
    Overlapping {
        since: Instant,
        paused: bool,
        words: bool,
    },
    /// The user stopped (at `at`) before it counted; waiting for a transcript until the
    /// false-interruption timeout.
    Stopped {
        at: Instant,
        paused: bool,
        words: bool,
    },
}

/// A barge-in under way, as a snapshot writes it (the activation's): how long ago the
/// user started talking over the turn, or stopped before it counted, whether the output
/// was paused and whether their words had passed the rules. Restored, its deadline is
/// that much nearer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum BargeInState {
    Overlapping {
        elapsed: Duration,
        paused: bool,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        words: bool,
    },
    Stopped {
        elapsed: Duration,
        paused: bool,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        words: bool,
    },
}

impl BargeIn {
    /// What a snapshot taken at `now` writes of it (none while quiet).
    pub(crate) fn state(&self, now: Instant) -> Option<BargeInState> {
        match *self {
            Self::Quiet => None,
            Self::Overlapping {
                since,
                paused,
                words,
            } => Some(BargeInState::Overlapping {
                elapsed: now.saturating_duration_since(since),
                paused,
                words,
            }),
            Self::Stopped { at, paused, words } => Some(BargeInState::Stopped {
                elapsed: now.saturating_duration_since(at),
                paused,
                words,
            }),
        }
    }

    /// The barge-in `state` said, restored at `now`.
    pub(crate) fn restored(state: BargeInState, now: Instant) -> Self {
        let back = |elapsed: Duration| now.checked_sub(elapsed).unwrap_or(now);
        match state {
            BargeInState::Overlapping {
                elapsed,
                paused,
                words,
            } => Self::Overlapping {
                since: back(elapsed),
                paused,
                words,
            },
            BargeInState::Stopped {
                elapsed,
                paused,
                words,
            } => Self::Stopped {
                at: back(elapsed),
                paused,
                words,
            },
        }
    }
}

/// What the activity does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BargeAction {
    Nothing,
    /// Pause the output.
    Pause,
    /// Interrupt the turn.
    Interrupt,
    /// The interruption was false: resume the output if `resume` is set.
    FalseInterruption {
        resume: bool,
    },
}

impl BargeIn {
    /// The user started speaking. `interruptible`: a turn runs and allows interruptions.
    /// Without a word rule and with a zero `min_duration`, any speech of the user is a
    /// real interruption at once.
    pub(crate) fn user_started(
        &mut self,
        now: Instant,
        interruptible: bool,
        can_pause: bool,
        rules: &BargeInRules,
    ) -> BargeAction {
        if !interruptible {
            return BargeAction::Nothing;
        }
        if rules.min_duration.is_zero() && !rules.needs_words {
            *self = Self::Quiet;
            return BargeAction::Interrupt;
        }
        match *self {
            Self::Quiet => {
                let paused = can_pause && rules.pause && !rules.needs_words;
                *self = Self::Overlapping {
                    since: now,
                    paused,
                    words: false,
                };
                if paused {
                    BargeAction::Pause
                } else {
                    BargeAction::Nothing
                }
            }
            // Speaking again before the false-interruption timeout: the same barge-in.
            Self::Stopped { paused, words, .. } => {
                *self = Self::Overlapping {
                    since: now,
                    paused,
                    words,
                };
                BargeAction::Nothing
            }
            Self::Overlapping { .. } => BargeAction::Nothing,
        }
    }

    /// The user stopped speaking.
    pub(crate) fn user_stopped(&mut self, now: Instant, rules: &BargeInRules) -> BargeAction {
        let Self::Overlapping {
            since,
            paused,
            words,
        } = *self
        else {
            return BargeAction::Nothing;
        };
        let long_enough = now.duration_since(since) >= rules.min_duration;
        if long_enough && (words || !rules.needs_words) {
            *self = Self::Quiet;
            return BargeAction::Interrupt;
        }
        match rules.false_timeout {
            Some(_) => {
                *self = Self::Stopped {
                    at: now,
                    paused,
                    words,
                };
                BargeAction::Nothing
            }
            None if paused => {
                *self = Self::Quiet;
                BargeAction::Interrupt
            }
            None => {
                *self = Self::Quiet;
                BargeAction::FalseInterruption { resume: false }
            }
        }
    }

    /// A transcript arrived whose words interrupt (without a word rule: any words).
    pub(crate) fn words_interrupt(&mut self, now: Instant, rules: &BargeInRules) -> BargeAction {
        match *self {
            Self::Quiet => BargeAction::Nothing,
            _ if !rules.needs_words => {
                *self = Self::Quiet;
                BargeAction::Interrupt
            }
            Self::Overlapping { since, paused, .. } => {
                if now.duration_since(since) >= rules.min_duration {
                    *self = Self::Quiet;
                    return BargeAction::Interrupt;
                }
                *self = Self::Overlapping {
                    since,
                    paused,
                    words: true,
                };
                BargeAction::Nothing
            }
            // The user stopped before the minimum: the final transcript decides.
            Self::Stopped { at, paused, .. } => {
                *self = Self::Stopped {
                    at,
                    paused,
                    words: true,
                };
                BargeAction::Nothing
            }
        }
    }

    /// A transcript arrived whose words do not interrupt (a backchannel, too few words).
    /// A final one ends a barge-in whose user stopped; one the user is still speaking
    /// after leaves it waiting for their next words.
    pub(crate) fn words_hold(&mut self, is_final: bool) -> BargeAction {
        match *self {
            Self::Stopped { paused, .. } if is_final => {
                *self = Self::Quiet;
                if paused {
                    BargeAction::FalseInterruption { resume: true }
                } else {
                    BargeAction::Nothing
                }
            }
            Self::Overlapping { since, paused, .. } if is_final => {
                *self = Self::Overlapping {
                    since,
                    paused,
                    words: false,
                };
                BargeAction::Nothing
            }
            _ => BargeAction::Nothing,
        }
    }

    /// When the barge-in next decides something by itself: the end of the minimum
    /// duration (once words passed, with a word rule), or of the false-interruption
    /// timeout.
    pub(crate) fn deadline(&self, rules: &BargeInRules) -> Option<Instant> {
        match *self {
            Self::Quiet => None,
            Self::Overlapping { since, words, .. } => {
                (words || !rules.needs_words).then(|| since + rules.min_duration)
            }
            Self::Stopped { at, .. } => rules.false_timeout.map(|timeout| at + timeout),
        }
    }

    /// Time passed: a long enough overlap is a real interruption; a stop with no
    /// transcript until the timeout was a false one. Early (a stale timer): nothing.
    pub(crate) fn tick(&mut self, now: Instant, rules: &BargeInRules) -> BargeAction {
        match self.deadline(rules) {
            Some(due) if now >= due => {}
            _ => return BargeAction::Nothing,
        }
        match std::mem::take(self) {
            Self::Overlapping { .. } => BargeAction::Interrupt,
            Self::Stopped { paused, .. } => BargeAction::FalseInterruption { resume: paused },
            Self::Quiet => BargeAction::Nothing,
        }
    }

    /// The turn ended (or was interrupted another way): nothing is left to barge in on.
    pub(crate) fn turn_ended(&mut self) {
        *self = Self::Quiet;
    }

    /// Whether the output is paused by this barge-in.
    #[cfg(test)]
    fn paused(&self) -> bool {
        matches!(
            self,
            Self::Overlapping { paused: true, .. } | Self::Stopped { paused: true, .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: BargeInRules = BargeInRules {
        min_duration: Duration::from_millis(500),
        false_timeout: Some(Duration::from_secs(2)),
        pause: true,
        needs_words: false,
    };

    const WORDS: BargeInRules = BargeInRules {
        needs_words: true,
        ..RULES
    };

    fn at(ms: u64, base: Instant) -> Instant {
        base + Duration::from_millis(ms)
    }

    #[test]
    fn a_pausable_output_pauses_at_once_and_a_long_overlap_interrupts() {
        let t0 = Instant::now();
        let mut b = BargeIn::default();
        assert_eq!(b.user_started(t0, true, true, &RULES), BargeAction::Pause);
        assert!(b.paused());
        assert_eq!(b.deadline(&RULES), Some(at(500, t0)));
        assert_eq!(b.tick(at(499, t0), &RULES), BargeAction::Nothing);
        assert_eq!(b.tick(at(500, t0), &RULES), BargeAction::Interrupt);
        assert_eq!(b, BargeIn::Quiet);
        assert_eq!(b.deadline(&RULES), None);
    }

    #[test]
    fn without_pause_support_the_same_rule_interrupts() {
        let t0 = Instant::now();
        let mut b = BargeIn::default();
        assert_eq!(
            b.user_started(t0, true, false, &RULES),
            BargeAction::Nothing
        );
        assert!(!b.paused());
        assert_eq!(b.tick(at(600, t0), &RULES), BargeAction::Interrupt);
    }

    #[test]
    fn a_transcript_makes_it_real_at_once() {
        let t0 = Instant::now();
        let mut b = BargeIn::default();
        b.user_started(t0, true, true, &RULES);
        assert_eq!(b.words_interrupt(t0, &RULES), BargeAction::Interrupt);
        let mut b = BargeIn::default();
        b.user_started(t0, true, true, &RULES);
        b.user_stopped(at(100, t0), &RULES);
        assert_eq!(
            b.words_interrupt(t0, &RULES),
            BargeAction::Interrupt,
            "also after the user stopped"
        );
    }

    #[test]
    fn a_short_overlap_without_words_resumes_after_the_false_timeout() {
        let t0 = Instant::now();
        let mut b = BargeIn::default();
        b.user_started(t0, true, true, &RULES);
        assert_eq!(b.user_stopped(at(200, t0), &RULES), BargeAction::Nothing);
        assert_eq!(b.deadline(&RULES), Some(at(2200, t0)));
        assert_eq!(b.tick(at(500, t0), &RULES), BargeAction::Nothing);
        assert_eq!(
            b.tick(at(2200, t0), &RULES),
            BargeAction::FalseInterruption { resume: true }
        );
        assert_eq!(b, BargeIn::Quiet);
    }

    #[test]
    fn a_short_overlap_on_an_unpausable_output_is_ignored() {
        let t0 = Instant::now();
        let mut b = BargeIn::default();
        b.user_started(t0, true, false, &RULES);
        b.user_stopped(at(200, t0), &RULES);
        assert_eq!(
            b.tick(at(2200, t0), &RULES),
            BargeAction::FalseInterruption { resume: false }
        );
    }

    #[test]
    fn stopping_after_the_min_duration_interrupts_even_before_the_timer() {
        let t0 = Instant::now();
        let mut b = BargeIn::default();
        b.user_started(t0, true, true, &RULES);
        assert_eq!(b.user_stopped(at(700, t0), &RULES), BargeAction::Interrupt);
    }

    #[test]
    fn speaking_again_before_the_false_timeout_keeps_the_pause() {
        let t0 = Instant::now();
        let mut b = BargeIn::default();
        b.user_started(t0, true, true, &RULES);
        b.user_stopped(at(100, t0), &RULES);
        assert_eq!(
            b.user_started(at(300, t0), true, true, &RULES),
            BargeAction::Nothing
        );
        assert!(b.paused());
        assert_eq!(
            b.tick(at(2100, t0), &RULES),
            BargeAction::Interrupt,
            "the overlap that started again at 300 ms has lasted long enough"
        );
    }

    #[test]
    fn a_stale_tick_decides_nothing() {
        let t0 = Instant::now();
        let mut b = BargeIn::default();
        b.user_started(t0, true, true, &RULES);
        b.user_stopped(at(100, t0), &RULES);
        b.user_started(at(300, t0), true, true, &RULES);
        // The timer armed for the first overlap's minimum fires at 500 ms.
        assert_eq!(b.tick(at(500, t0), &RULES), BargeAction::Nothing);
        assert_eq!(b.deadline(&RULES), Some(at(800, t0)));
    }

    #[test]
    fn without_a_false_timeout_a_paused_speech_stays_interrupted() {
        let rules = BargeInRules {
            false_timeout: None,
            ..RULES
        };
        let t0 = Instant::now();
        let mut b = BargeIn::default();
        b.user_started(t0, true, true, &RULES);
        assert_eq!(b.user_stopped(at(100, t0), &rules), BargeAction::Interrupt);
    }

    #[test]
    fn an_uninterruptible_turn_or_no_turn_ignores_the_user() {
        let t0 = Instant::now();
        let mut b = BargeIn::default();
        assert_eq!(
            b.user_started(t0, false, true, &RULES),
            BargeAction::Nothing
        );
        assert_eq!(b.words_interrupt(t0, &RULES), BargeAction::Nothing);
        assert_eq!(b.user_stopped(at(900, t0), &RULES), BargeAction::Nothing);
        assert_eq!(b, BargeIn::Quiet);
    }

    #[test]
    fn with_no_minimum_duration_the_user_interrupts_at_once() {
        let rules = BargeInRules {
            min_duration: Duration::ZERO,
            ..RULES
        };
        let mut b = BargeIn::default();
        assert_eq!(
            b.user_started(Instant::now(), true, true, &rules),
            BargeAction::Interrupt
        );
        assert_eq!(b, BargeIn::Quiet);
    }

    #[test]
    fn a_turn_that_ends_clears_the_barge_in() {
        let t0 = Instant::now();
        let mut b = BargeIn::default();
        b.user_started(t0, true, true, &RULES);
        b.turn_ended();
        assert_eq!(b.tick(at(900, t0), &RULES), BargeAction::Nothing);
    }

    #[test]
    fn with_a_word_rule_the_voice_alone_neither_pauses_nor_interrupts() {
        let t0 = Instant::now();
        let mut b = BargeIn::default();
        assert_eq!(b.user_started(t0, true, true, &WORDS), BargeAction::Nothing);
        assert!(!b.paused());
        assert_eq!(
            b.deadline(&WORDS),
            None,
            "no duration deadline without words"
        );
        assert_eq!(b.tick(at(5000, t0), &WORDS), BargeAction::Nothing);
        // A zero minimum does not make the voice enough either.
        let zero = BargeInRules {
            min_duration: Duration::ZERO,
            ..WORDS
        };
        let mut b = BargeIn::default();
        assert_eq!(b.user_started(t0, true, true, &zero), BargeAction::Nothing);
    }

    #[test]
    fn words_that_interrupt_wait_for_the_minimum_duration_then_interrupt() {
        let t0 = Instant::now();
        let mut b = BargeIn::default();
        b.user_started(t0, true, false, &WORDS);
        assert_eq!(
            b.words_interrupt(at(200, t0), &WORDS),
            BargeAction::Nothing,
            "words, but only 200 ms of voice"
        );
        assert_eq!(b.deadline(&WORDS), Some(at(500, t0)));
        assert_eq!(b.tick(at(500, t0), &WORDS), BargeAction::Interrupt);
        let mut b = BargeIn::default();
        b.user_started(t0, true, false, &WORDS);
        assert_eq!(
            b.words_interrupt(at(700, t0), &WORDS),
            BargeAction::Interrupt,
            "words after the minimum interrupt at once"
        );
    }

    #[test]
    fn words_that_do_not_interrupt_change_nothing_and_a_final_one_ends_the_barge_in() {
        let t0 = Instant::now();
        let mut b = BargeIn::default();
        b.user_started(t0, true, false, &WORDS);
        assert_eq!(b.words_hold(false), BargeAction::Nothing);
        assert!(matches!(b, BargeIn::Overlapping { .. }));
        assert_eq!(b.user_stopped(at(300, t0), &WORDS), BargeAction::Nothing);
        assert_eq!(b.words_hold(true), BargeAction::Nothing);
        assert_eq!(b, BargeIn::Quiet, "the backchannel's final ended it");
        assert_eq!(b.tick(at(3000, t0), &WORDS), BargeAction::Nothing);
    }

    #[test]
    fn with_a_word_rule_a_user_who_stopped_early_leaves_it_to_the_final() {
        let t0 = Instant::now();
        let mut b = BargeIn::default();
        b.user_started(t0, true, false, &WORDS);
        b.words_interrupt(at(100, t0), &WORDS);
        assert_eq!(b.user_stopped(at(300, t0), &WORDS), BargeAction::Nothing);
        assert!(matches!(b, BargeIn::Stopped { words: true, .. }));
        // No final within the timeout: a false interruption (nothing was paused).
        assert_eq!(
            b.tick(at(2300, t0), &WORDS),
            BargeAction::FalseInterruption { resume: false }
        );
    }

    #[test]
    fn without_resuming_false_interruptions_the_output_is_never_paused() {
        let rules = BargeInRules {
            pause: false,
            ..RULES
        };
        let t0 = Instant::now();
        let mut b = BargeIn::default();
        assert_eq!(b.user_started(t0, true, true, &rules), BargeAction::Nothing);
        assert!(!b.paused());
        assert_eq!(b.tick(at(500, t0), &rules), BargeAction::Interrupt);
    }
}
