//! The user's words over the agent's speech: whether they interrupt it, and whether a
//! final transcript of them makes a turn. A plain type: the session feeds it the user's
//! voice, each transcript, the floor (whether a speech plays, since when) and the time,
//! and relays what it answers to the activity (which carries out the barge-in) and the
//! endpointing (which makes turns).
//!
//! The rules, each a unit test below:
//! - While the agent does not hold the floor, words are ordinary input (a final makes a
//!   turn, and interrupts a turn that runs).
//! - Without a word rule (no word minimum, backchannel words or classifier), words over
//!   the agent interrupt it: the behaviour before these rules.
//! - With one, words over the agent interrupt when they pass: at least `min_words`
//!   words (at least one), not all of them backchannel words — unless the user began
//!   within the start boundary of the agent's speech (they spoke before hearing it) —
//!   and the classifier, if any, agreeing. An interim that does not pass changes nothing.
//! - A final that does not pass makes no turn yet: its words are held for the end
//!   boundary. A later final of the same overlap that passes takes them with it; the
//!   agent's speech ending within the boundary makes them the user's turn ("Shall I book
//!   it?" — "Yeah."); else, at the boundary, they are ignored (reported, and kept in the
//!   chat or dropped as the host chose).
//! - Over a speech that cannot be interrupted, with `discard_audio_if_uninterruptible`,
//!   words are dropped.

use tokio::time::Instant;

use crate::events::IgnoredWords;
use crate::shared::Floor;
use crate::turn_handling::{words, Overlap, OverlapVerdict, TurnRules};

/// What the session does with a transcript.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Judged {
    /// Words that interrupt the agent (or ordinary words: the agent does not speak). A
    /// final one makes a turn of `text` (the held words of the overlap, then these).
    Interrupts { text: Option<String> },
    /// Words over the agent that do not interrupt it (yet). A final one is held.
    Holds,
    /// Dropped: the agent speaks and cannot be interrupted, and the rules discard.
    Discarded,
}

/// Words the user said over the agent that made no turn when their boundary passed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Ignored {
    pub(crate) text: String,
    pub(crate) reason: IgnoredWords,
}

/// The user's current overlap with the agent's speech, and words held from it.
#[derive(Debug, Default)]
pub(crate) struct OverlapJudge {
    /// Since when the user speaks (the host's voice detection), if they do.
    user_since: Option<Instant>,
    open: Option<Open>,
    held: Option<Held>,
}

#[derive(Debug)]
struct Open {
    /// When the user began talking over the agent.
    started: Instant,
    /// When the agent's floor began.
    floor_since: Instant,
}

#[derive(Debug)]
struct Held {
    text: String,
    reason: IgnoredWords,
    /// When they are ignored, unless the floor ends or more words take them first.
    until: Instant,
}

impl OverlapJudge {
    /// The user started speaking at `now`.
    pub(crate) fn user_started(&mut self, now: Instant, floor: Option<Floor>) {
        self.user_since = Some(now);
        match floor {
            Some(floor) => self.open_at(now, floor),
            None => self.open = None,
        }
    }

    /// The user stopped speaking.
    pub(crate) fn user_stopped(&mut self) {
        self.user_since = None;
    }

    /// Judges a transcript with words, at `now`.
    pub(crate) fn transcript(
        &mut self,
        text: &str,
        is_final: bool,
        now: Instant,
        floor: Option<Floor>,
        rules: &TurnRules,
    ) -> Judged {
        let Some(floor) = floor else {
            self.open = None;
            return Judged::Interrupts {
                text: is_final.then(|| self.take_held(text)),
            };
        };
        if rules.interruption.discard_audio_if_uninterruptible && !floor.interruptible {
            return Judged::Discarded;
        }
        if !rules.needs_words() {
            return Judged::Interrupts {
                text: is_final.then(|| self.take_held(text)),
            };
        }
        self.open_at(self.user_since.unwrap_or(now), floor);
        let started = self.open.as_ref().map_or(now, |open| open.started);
        let all = match &self.held {
            Some(held) => format!("{} {text}", held.text),
            None => text.to_owned(),
        };
        let count = words::count(&all);
        let interruption = &rules.interruption;
        let collision =
            started.saturating_duration_since(floor.since) < interruption.backchannel_boundary.0;
        let backchannel = !collision
            && interruption
                .backchannel
                .as_ref()
                .is_some_and(|b| b.matches(&all));
        let min_words = usize::try_from(interruption.min_words.max(1)).unwrap_or(usize::MAX);
        let (rule, why) = if backchannel {
            (OverlapVerdict::Ignore, IgnoredWords::Backchannel)
        } else if count < min_words {
            let verdict = if is_final {
                OverlapVerdict::Ignore
            } else {
                OverlapVerdict::Wait
            };
            (verdict, IgnoredWords::TooFewWords)
        } else {
            (OverlapVerdict::Interrupt, IgnoredWords::Classifier)
        };
        let verdict = match &rules.classifier {
            Some(classifier) => {
                let asked = classifier.0.overlap(&Overlap {
                    transcript: &all,
                    is_final,
                    words: count,
                    user_speaking_for: now.saturating_duration_since(started),
                    agent_spoke_for: started.saturating_duration_since(floor.since),
                    user_speaking: self.user_since.is_some(),
                    rule,
                });
                if is_final && asked == OverlapVerdict::Wait {
                    rule
                } else {
                    asked
                }
            }
            None => rule,
        };
        let reason = if verdict == rule {
            why
        } else {
            IgnoredWords::Classifier
        };
        if !is_final {
            return match verdict {
                OverlapVerdict::Interrupt => Judged::Interrupts { text: None },
                OverlapVerdict::Ignore | OverlapVerdict::Wait => Judged::Holds,
            };
        }
        if self.user_since.is_none() {
            self.open = None;
        }
        match verdict {
            OverlapVerdict::Interrupt => {
                self.held = None;
                Judged::Interrupts { text: Some(all) }
            }
            OverlapVerdict::Ignore | OverlapVerdict::Wait => {
                self.held = Some(Held {
                    text: all,
                    reason,
                    until: now + interruption.backchannel_boundary.1,
                });
                Judged::Holds
            }
        }
    }

    /// Words held from a final are ignored once their boundary passed.
    pub(crate) fn due(&mut self, now: Instant) -> Option<Ignored> {
        if self.held.as_ref()?.until > now {
            return None;
        }
        self.held.take().map(|held| Ignored {
            text: held.text,
            reason: held.reason,
        })
    }

    /// When held words are ignored, if some are held.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.held.as_ref().map(|held| held.until)
    }

    /// The agent's speech ended: held words are the user's (their turn's words), and the
    /// overlap is over.
    pub(crate) fn floor_ended(&mut self) -> Option<String> {
        self.open = None;
        self.held.take().map(|held| held.text)
    }

    /// Whether words are held.
    pub(crate) fn holds_words(&self) -> bool {
        self.held.is_some()
    }

    /// An overlap is open from `started` under `floor` (kept if one is open under it).
    fn open_at(&mut self, started: Instant, floor: Floor) {
        let same = self
            .open
            .as_ref()
            .is_some_and(|open| open.floor_since == floor.since);
        if !same {
            self.open = Some(Open {
                // A user already speaking when the agent began: from the agent's start.
                started: started.max(floor.since),
                floor_since: floor.since,
            });
        }
    }

    /// `text` after the words held, which it takes with it.
    fn take_held(&mut self, text: &str) -> String {
        match self.held.take() {
            Some(held) => format!("{} {text}", held.text),
            None => text.to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;
    use crate::turn_handling::{Backchannel, Interruption, TurnClassifier, TurnHandling};

    fn rules(interruption: Interruption) -> TurnRules {
        TurnHandling::new().interruption(interruption).rules()
    }

    fn backchannels() -> TurnRules {
        rules(Interruption::new().backchannel(Backchannel::english()))
    }

    fn floor(since: Instant) -> Option<Floor> {
        Some(Floor {
            since,
            interruptible: true,
        })
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn without_the_floor_or_a_word_rule_words_are_ordinary_input() {
        let t0 = Instant::now();
        let mut j = OverlapJudge::default();
        let plain = Judged::Interrupts {
            text: Some("yeah".into()),
        };
        assert_eq!(j.transcript("yeah", true, t0, None, &backchannels()), plain);
        let no_rule = TurnRules::default();
        assert_eq!(j.transcript("yeah", true, t0, floor(t0), &no_rule), plain);
    }

    #[test]
    fn a_backchannel_over_the_agent_holds_and_is_ignored_at_the_boundary() {
        let t0 = Instant::now();
        let mut j = OverlapJudge::default();
        let r = backchannels();
        j.user_started(t0 + ms(2000), floor(t0));
        assert_eq!(
            j.transcript("uh-huh", false, t0 + ms(2200), floor(t0), &r),
            Judged::Holds
        );
        j.user_stopped();
        assert_eq!(
            j.transcript("Uh huh.", true, t0 + ms(2400), floor(t0), &r),
            Judged::Holds
        );
        assert_eq!(j.deadline(), Some(t0 + ms(3400)));
        assert_eq!(j.due(t0 + ms(3399)), None);
        assert_eq!(
            j.due(t0 + ms(3400)),
            Some(Ignored {
                text: "Uh huh.".into(),
                reason: IgnoredWords::Backchannel
            })
        );
        assert!(!j.holds_words());
    }

    #[test]
    fn stop_wait_over_the_agent_interrupts() {
        let t0 = Instant::now();
        let mut j = OverlapJudge::default();
        let r = backchannels();
        j.user_started(t0 + ms(2000), floor(t0));
        assert_eq!(
            j.transcript("stop", false, t0 + ms(2100), floor(t0), &r),
            Judged::Interrupts { text: None }
        );
        assert_eq!(
            j.transcript("stop, wait", true, t0 + ms(2300), floor(t0), &r),
            Judged::Interrupts {
                text: Some("stop, wait".into())
            }
        );
    }

    #[test]
    fn at_the_start_of_the_agents_speech_a_backchannel_word_is_a_turn() {
        let t0 = Instant::now();
        let mut j = OverlapJudge::default();
        j.user_started(t0 + ms(300), floor(t0));
        assert_eq!(
            j.transcript("yes", true, t0 + ms(600), floor(t0), &backchannels()),
            Judged::Interrupts {
                text: Some("yes".into())
            },
            "the user began 0.3 s into the speech: they answered before hearing it"
        );
    }

    #[test]
    fn held_words_become_the_turn_when_the_speech_ends_within_the_boundary() {
        let t0 = Instant::now();
        let mut j = OverlapJudge::default();
        let r = backchannels();
        j.user_started(t0 + ms(5000), floor(t0));
        j.user_stopped();
        assert_eq!(
            j.transcript("yeah", true, t0 + ms(5300), floor(t0), &r),
            Judged::Holds
        );
        assert_eq!(j.floor_ended(), Some("yeah".into()));
        assert_eq!(j.due(t0 + ms(9000)), None);
    }

    #[test]
    fn two_words_are_needed_and_a_held_word_counts_with_the_next() {
        let t0 = Instant::now();
        let mut j = OverlapJudge::default();
        let r = rules(Interruption::new().min_words(2));
        j.user_started(t0 + ms(2000), floor(t0));
        assert_eq!(
            j.transcript("stop", false, t0 + ms(2100), floor(t0), &r),
            Judged::Holds
        );
        assert_eq!(
            j.transcript("stop", true, t0 + ms(2200), floor(t0), &r),
            Judged::Holds
        );
        assert_eq!(
            j.transcript("now", true, t0 + ms(2500), floor(t0), &r),
            Judged::Interrupts {
                text: Some("stop now".into())
            }
        );
        assert!(!j.holds_words());
        j.user_stopped();
        assert_eq!(
            j.transcript("ok", true, t0 + ms(4000), floor(t0), &r),
            Judged::Holds
        );
        assert_eq!(
            j.due(t0 + ms(5000)).map(|i| i.reason),
            Some(IgnoredWords::TooFewWords)
        );
    }

    #[test]
    fn words_over_an_uninterruptible_speech_are_discarded_when_asked() {
        let t0 = Instant::now();
        let mut j = OverlapJudge::default();
        let r = rules(Interruption::new().discard_audio_if_uninterruptible(true));
        let locked = Some(Floor {
            since: t0,
            interruptible: false,
        });
        assert_eq!(
            j.transcript("hello", true, t0, locked, &r),
            Judged::Discarded
        );
        assert_eq!(
            j.transcript("hello", true, t0, floor(t0), &r),
            Judged::Interrupts {
                text: Some("hello".into())
            }
        );
    }

    struct Recording {
        seen: Mutex<Vec<(String, bool, OverlapVerdict, Duration)>>,
        answer: OverlapVerdict,
    }

    impl TurnClassifier for Recording {
        fn overlap(&self, overlap: &Overlap<'_>) -> OverlapVerdict {
            self.seen.lock().unwrap().push((
                overlap.transcript.to_owned(),
                overlap.is_final,
                overlap.rule,
                overlap.user_speaking_for,
            ));
            self.answer
        }
    }

    #[test]
    fn the_classifier_hears_the_words_and_the_rule_and_decides() {
        let t0 = Instant::now();
        let classifier = Arc::new(Recording {
            seen: Mutex::new(Vec::new()),
            answer: OverlapVerdict::Ignore,
        });
        let r = TurnHandling::new().classifier(classifier.clone()).rules();
        let mut j = OverlapJudge::default();
        j.user_started(t0 + ms(2000), floor(t0));
        assert_eq!(
            j.transcript("please stop", false, t0 + ms(2400), floor(t0), &r),
            Judged::Holds
        );
        j.user_stopped();
        assert_eq!(
            j.transcript("please stop", true, t0 + ms(2600), floor(t0), &r),
            Judged::Holds
        );
        assert_eq!(
            j.due(t0 + ms(3600)).map(|i| i.reason),
            Some(IgnoredWords::Classifier)
        );
        let seen = classifier.seen.lock().unwrap().clone();
        assert_eq!(
            seen,
            [
                (
                    "please stop".into(),
                    false,
                    OverlapVerdict::Interrupt,
                    ms(400)
                ),
                (
                    "please stop".into(),
                    true,
                    OverlapVerdict::Interrupt,
                    ms(600)
                ),
            ]
        );
    }

    #[test]
    fn a_final_never_waits_the_rule_decides_it() {
        let t0 = Instant::now();
        let classifier = Arc::new(Recording {
            seen: Mutex::new(Vec::new()),
            answer: OverlapVerdict::Wait,
        });
        let r = TurnHandling::new().classifier(classifier).rules();
        let mut j = OverlapJudge::default();
        j.user_started(t0 + ms(2000), floor(t0));
        j.user_stopped();
        assert_eq!(
            j.transcript("hold on a second", true, t0 + ms(2500), floor(t0), &r),
            Judged::Interrupts {
                text: Some("hold on a second".into())
            }
        );
    }
}
