//! How a voice agent takes turns with its caller: when the user's words make a turn
//! (endpointing), when their voice over the agent's speech is an interruption and when it
//! is only a backchannel ("uh-huh", "right"), whether the model may start before the turn
//! is confirmed (preemptive generation), and how long the user may speak without an
//! answer (user-turn limits).
//!
//! The knobs are LiveKit Agents' `TurnHandlingOptions`, with the same meanings where ours
//! can have them. A session sets its default ([`SessionBuilder::turn_handling`]); an agent
//! may set its own ([`AgentBuilder::turn_handling`]), which overrides the session's group
//! by group: an agent that sets only [`Interruption`] keeps the session's endpointing.
//!
//! Every group's default keeps the engine's behaviour of before these knobs existed: a
//! fixed 0.5 s endpointing delay, an interruption after 0.5 s of the user's voice or at
//! their first words, no backchannel words, no preemptive generation, no user-turn limit.
//!
//! [`SessionBuilder::turn_handling`]: crate::SessionBuilder::turn_handling
//! [`AgentBuilder::turn_handling`]: crate::AgentBuilder::turn_handling

pub(crate) mod words;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use words::Phrases;

/// How an agent takes turns (see the module docs): four groups, each set or inherited,
/// and the host's own classifier, if any.
///
/// ```
/// use std::time::Duration;
/// use switchboard::{Backchannel, Endpointing, Interruption, TurnHandling};
///
/// let turns = TurnHandling::new()
///     .endpointing(Endpointing::dynamic(Duration::from_millis(400), Duration::from_secs(2)))
///     .interruption(Interruption::new().min_words(2).backchannel(Backchannel::english()));
/// # let _ = turns;
/// ```
#[derive(Clone, Debug, Default)]
pub struct TurnHandling {
    pub(crate) endpointing: Option<Endpointing>,
    pub(crate) interruption: Option<Interruption>,
    pub(crate) preemptive_generation: Option<PreemptiveGeneration>,
    pub(crate) user_turn_limit: Option<UserTurnLimit>,
    pub(crate) classifier: Option<Classifier>,
}

impl TurnHandling {
    /// Nothing set: every group inherited (from the session, or the defaults).
    pub fn new() -> Self {
        Self::default()
    }

    /// When the user's words make a turn.
    pub fn endpointing(mut self, endpointing: Endpointing) -> Self {
        self.endpointing = Some(endpointing);
        self
    }

    /// When the user's voice over the agent's speech interrupts it.
    pub fn interruption(mut self, interruption: Interruption) -> Self {
        self.interruption = Some(interruption);
        self
    }

    /// Whether the model starts before the user's turn is confirmed.
    pub fn preemptive_generation(mut self, preemptive: PreemptiveGeneration) -> Self {
        self.preemptive_generation = Some(preemptive);
        self
    }

    /// How long the user may speak without an answer.
    pub fn user_turn_limit(mut self, limit: UserTurnLimit) -> Self {
        self.user_turn_limit = Some(limit);
        self
    }

    /// The host's own classifier, asked about the user's words over the agent and about
    /// the end of the user's turn (see [`TurnClassifier`]). Setting one makes the words
    /// decide an interruption, as a backchannel list does.
    pub fn classifier(mut self, classifier: Arc<dyn TurnClassifier>) -> Self {
        self.classifier = Some(Classifier(classifier));
        self
    }

    /// `self`'s groups where set, `base`'s elsewhere.
    pub(crate) fn over(&self, base: &TurnHandling) -> TurnHandling {
        TurnHandling {
            endpointing: self.endpointing.or(base.endpointing),
            interruption: self
                .interruption
                .clone()
                .or_else(|| base.interruption.clone()),
            preemptive_generation: self.preemptive_generation.or(base.preemptive_generation),
            user_turn_limit: self
                .user_turn_limit
                .clone()
                .or_else(|| base.user_turn_limit.clone()),
            classifier: self.classifier.clone().or_else(|| base.classifier.clone()),
        }
    }

    /// Every group resolved: set, or its default.
    pub(crate) fn rules(&self) -> TurnRules {
        TurnRules {
            endpointing: self.endpointing.unwrap_or_default(),
            interruption: self.interruption.clone().unwrap_or_default(),
            preemptive: self.preemptive_generation.unwrap_or_default(),
            user_turn_limit: self.user_turn_limit.clone().unwrap_or_default(),
            classifier: self.classifier.clone(),
        }
    }
}

/// A session's or an agent's turn handling with every group resolved.
#[derive(Clone, Debug, Default)]
pub(crate) struct TurnRules {
    pub(crate) endpointing: Endpointing,
    pub(crate) interruption: Interruption,
    pub(crate) preemptive: PreemptiveGeneration,
    pub(crate) user_turn_limit: UserTurnLimit,
    pub(crate) classifier: Option<Classifier>,
}

impl TurnRules {
    /// Whether an interruption needs the user's words (a word minimum, backchannel words
    /// or a classifier): then the user's voice alone neither pauses nor interrupts the
    /// agent, and only words that pass the rules do.
    pub(crate) fn needs_words(&self) -> bool {
        self.interruption.min_words > 0
            || self.interruption.backchannel.is_some()
            || self.classifier.is_some()
    }

    /// Whether the session judges the user's words over the agent at all (a word rule,
    /// or discarding words over an uninterruptible speech).
    pub(crate) fn judges_words(&self) -> bool {
        self.needs_words() || self.interruption.discard_audio_if_uninterruptible
    }

    /// Whether ignored words go into the chat (`Backchannel::keep_in_transcript`).
    pub(crate) fn keeps_ignored_words(&self) -> bool {
        self.interruption
            .backchannel
            .as_ref()
            .is_some_and(|b| b.keep)
    }
}

// ---- Endpointing --------------------------------------------------------------------

/// How the endpointing delay is chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum EndpointingMode {
    /// Always the minimum delay (the maximum when the classifier says the user is
    /// unlikely to be done).
    Fixed,
    /// Learned from the caller's pauses: a moving average of the pauses between their
    /// utterances (and of a pause the agent answered too early, when the user went on at
    /// once over its answer), kept between the minimum and the maximum delay. `alpha`
    /// (0 < alpha ≤ 1) is the weight of the history: 0.9 moves a tenth of the way to
    /// each new pause.
    Dynamic {
        /// Weight of the history in the moving average.
        alpha: f64,
    },
}

/// When the user's words make a turn: a final transcript waits this long for more of
/// the user's words, finals within it join one user message, and the user speaking again
/// inside it holds it until they stop.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Endpointing {
    pub(crate) mode: EndpointingMode,
    pub(crate) min_delay: Duration,
    pub(crate) max_delay: Duration,
}

/// Fixed, 0.5 s (maximum 3 s).
impl Default for Endpointing {
    fn default() -> Self {
        Self {
            mode: EndpointingMode::Fixed,
            min_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(3),
        }
    }
}

impl Endpointing {
    /// A fixed delay (zero: every final is a turn at once). The maximum (3 s) applies
    /// when the classifier says the user is unlikely to be done.
    pub fn fixed(delay: Duration) -> Self {
        Self {
            min_delay: delay,
            max_delay: delay.max(Self::default().max_delay),
            ..Self::default()
        }
    }

    /// A delay learned from the caller's pauses, between `min` and `max` (alpha 0.9).
    pub fn dynamic(min: Duration, max: Duration) -> Self {
        Self {
            mode: EndpointingMode::Dynamic { alpha: 0.9 },
            min_delay: min,
            max_delay: max.max(min),
        }
    }

    /// The maximum delay (at least the minimum).
    pub fn max_delay(mut self, max: Duration) -> Self {
        self.max_delay = max.max(self.min_delay);
        self
    }

    /// The weight of the history in a dynamic delay's moving average, kept in (0, 1];
    /// ignored by a fixed delay.
    pub fn alpha(mut self, alpha: f64) -> Self {
        if let EndpointingMode::Dynamic { alpha: a } = &mut self.mode {
            *a = if alpha > 0.0 && alpha <= 1.0 {
                alpha
            } else {
                0.9
            };
        }
        self
    }

    /// The minimum delay.
    pub fn min(&self) -> Duration {
        self.min_delay
    }

    /// The maximum delay.
    pub fn max(&self) -> Duration {
        self.max_delay
    }

    /// The mode.
    pub fn mode(&self) -> EndpointingMode {
        self.mode
    }
}

// ---- Interruption -------------------------------------------------------------------

/// Words that acknowledge without taking the turn ("uh-huh", "yeah", "right"). While the
/// agent speaks, a transcript made only of them neither interrupts it nor starts a turn.
/// Matched as whole words, ignoring case and punctuation; a phrase may have several words
/// ("i see"), and "uh-huh" matches "uh huh".
#[derive(Clone, PartialEq, Eq)]
pub struct Backchannel {
    pub(crate) phrases: Arc<Phrases>,
    pub(crate) keep: bool,
}

impl fmt::Debug for Backchannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backchannel")
            .field("phrases", &self.phrases.len())
            .field("keep", &self.keep)
            .finish()
    }
}

/// The English backchannels [`Backchannel::english`] knows.
pub const ENGLISH_BACKCHANNELS: &[&str] = &[
    "uh-huh",
    "uh huh",
    "mm-hmm",
    "mhm",
    "mm",
    "hmm",
    "yeah",
    "yep",
    "yes",
    "right",
    "okay",
    "ok",
    "sure",
    "i see",
    "got it",
    "alright",
    "all right",
    "cool",
    "nice",
    "great",
    "oh",
    "ah",
    "wow",
    "exactly",
    "totally",
    "indeed",
    "true",
    "makes sense",
];

impl Backchannel {
    /// These words and phrases (dropped from the chat, see
    /// [`keep_in_transcript`](Self::keep_in_transcript)).
    pub fn words<S: AsRef<str>>(words: impl IntoIterator<Item = S>) -> Self {
        Self {
            phrases: Arc::new(Phrases::new(words)),
            keep: false,
        }
    }

    /// [`ENGLISH_BACKCHANNELS`].
    pub fn english() -> Self {
        Self::words(ENGLISH_BACKCHANNELS)
    }

    /// Whether a backchannel the user said over the agent goes into the chat, as a user
    /// message after what the agent was saying, that asks for no reply (`true`), or is
    /// dropped (`false`, the default; the `UserWordsIgnored` event still reports it).
    pub fn keep_in_transcript(mut self, keep: bool) -> Self {
        self.keep = keep;
        self
    }

    /// Whether `text` is made only of these words (and has some).
    pub fn matches(&self, text: &str) -> bool {
        self.phrases.covers(text)
    }
}

/// When the user's voice over the agent's speech interrupts it.
///
/// Without a word rule (no `min_words`, no backchannel words, no classifier) the voice
/// decides, as before: a pausable output pauses at once; `min_duration` of the user's
/// voice, or a transcript with words, interrupts; a shorter overlap with no words within
/// `false_interruption_timeout` resumes the speech. With a word rule the words decide:
/// the agent keeps speaking until a transcript passes the rules (at least `min_words`
/// words, not all backchannel words, the classifier agreeing), and then interrupts once
/// the user has also spoken `min_duration` (a final transcript at once).
#[derive(Clone, Debug)]
pub struct Interruption {
    pub(crate) min_duration: Duration,
    pub(crate) min_words: u32,
    pub(crate) backchannel: Option<Backchannel>,
    pub(crate) backchannel_boundary: (Duration, Duration),
    pub(crate) false_interruption_timeout: Option<Duration>,
    pub(crate) resume_false_interruption: bool,
    pub(crate) discard_audio_if_uninterruptible: bool,
}

/// 0.5 s, no word rule, boundaries of 1 s, false interruptions resumed after 2 s, words
/// over an uninterruptible speech kept.
impl Default for Interruption {
    fn default() -> Self {
        Self {
            min_duration: Duration::from_millis(500),
            min_words: 0,
            backchannel: None,
            backchannel_boundary: (Duration::from_secs(1), Duration::from_secs(1)),
            false_interruption_timeout: Some(Duration::from_secs(2)),
            resume_false_interruption: true,
            discard_audio_if_uninterruptible: false,
        }
    }
}

impl Interruption {
    /// The defaults (see [`Default`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// How long the user must speak over the agent before it is an interruption
    /// (default 0.5 s; zero: at once).
    pub fn min_duration(mut self, duration: Duration) -> Self {
        self.min_duration = duration;
        self
    }

    /// How many words the user must say over the agent before it is an interruption
    /// (default 0: no word rule). Counted over the overlap's transcripts; a final
    /// transcript with fewer is ignored like a backchannel.
    pub fn min_words(mut self, words: u32) -> Self {
        self.min_words = words;
        self
    }

    /// Words that never interrupt the agent nor start a turn while it speaks.
    pub fn backchannel(mut self, backchannel: Backchannel) -> Self {
        self.backchannel = Some(backchannel);
        self
    }

    /// The seconds near the start and the end of the agent's speech where backchannel
    /// words count as ordinary words (default 1 s and 1 s; `None`: no boundary). At the
    /// start, the user began before hearing the agent: their words are a turn, not an
    /// acknowledgement. At the end, words the user said as the agent finished are kept
    /// for their turn: a backchannel final is held this long, and becomes the user's turn
    /// if the agent's turn ends meanwhile ("Shall I book it?" — "Yeah.").
    pub fn backchannel_boundary(mut self, boundary: Option<(Duration, Duration)>) -> Self {
        self.backchannel_boundary = boundary.unwrap_or((Duration::ZERO, Duration::ZERO));
        self
    }

    /// After the user stopped talking over the agent too briefly and without words, how
    /// long to wait for a transcript before the interruption counts as false (default
    /// 2 s); `None`: a paused speech never resumes (the pause becomes an interruption).
    pub fn false_interruption_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.false_interruption_timeout = timeout;
        self
    }

    /// Whether a false interruption resumes the paused speech (default true). False: the
    /// output is never paused on the user's voice, as if it could not pause.
    pub fn resume_false_interruption(mut self, resume: bool) -> Self {
        self.resume_false_interruption = resume;
        self
    }

    /// Whether the user's transcripts are dropped while the agent speaks and cannot be
    /// interrupted (default false: they make a turn that runs after the speech). The
    /// host owns the audio; a host that also stops feeding its STT then reads
    /// `Session::agent_state` and the speech's `allow_interruptions`.
    pub fn discard_audio_if_uninterruptible(mut self, discard: bool) -> Self {
        self.discard_audio_if_uninterruptible = discard;
        self
    }
}

// ---- Preemptive generation ------------------------------------------------------------

/// Whether the model starts before the user's turn is confirmed: at a final transcript,
/// while the endpointing delay still waits for more words, the agent asks the model with
/// the words so far. If the turn is confirmed with the same words (and the chat did not
/// change meanwhile), the answer is already under way and the model's latency is saved;
/// if the user goes on, the request is dropped and leaves no trace in the chat — its cost
/// is counted ([`Usage::discarded_preemptive`](crate::Usage)). Only the model runs ahead:
/// nothing reaches the output before the turn is confirmed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreemptiveGeneration {
    pub(crate) enabled: bool,
    pub(crate) max_speech_duration: Duration,
    pub(crate) max_retries: u32,
}

/// Off (LiveKit's is on: here a host turns it on knowing each retry is a paid request),
/// 10 s, 3 tries.
impl Default for PreemptiveGeneration {
    fn default() -> Self {
        Self {
            enabled: false,
            max_speech_duration: Duration::from_secs(10),
            max_retries: 3,
        }
    }
}

impl PreemptiveGeneration {
    /// On, at most 3 tries per user turn, for speech under 10 s.
    pub fn on() -> Self {
        Self {
            enabled: true,
            ..Self::default()
        }
    }

    /// Off.
    pub fn off() -> Self {
        Self::default()
    }

    /// How long the user may have been speaking in the turn for a preemptive request to
    /// start (default 10 s): a long utterance is likely to change.
    pub fn max_speech_duration(mut self, duration: Duration) -> Self {
        self.max_speech_duration = duration;
        self
    }

    /// How many preemptive requests one user turn may start (default 3).
    pub fn max_retries(mut self, tries: u32) -> Self {
        self.max_retries = tries;
        self
    }
}

// ---- User-turn limit ------------------------------------------------------------------

/// How long the user may speak without the agent answering: counted over the user's
/// words since the agent last spoke (their finals' words, and the time since they began).
/// Past a limit the session emits `UserTurnExceeded` and, unless told not to, cuts in:
/// the user's words so far become their turn at once, answered by a short reply they
/// cannot interrupt. No limit by default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserTurnLimit {
    pub(crate) max_words: Option<u32>,
    pub(crate) max_duration: Option<Duration>,
    pub(crate) cut_in: bool,
    pub(crate) instructions: Arc<str>,
}

/// The instructions of the reply that cuts in, unless the host gives its own (LiveKit's).
pub const DEFAULT_CUT_IN: &str = "The user has been speaking too long without giving a chance to reply. Politely cut in with a short reply or notice. Keep it short since the user cannot interrupt it.";

impl Default for UserTurnLimit {
    fn default() -> Self {
        Self {
            max_words: None,
            max_duration: None,
            cut_in: true,
            instructions: Arc::from(DEFAULT_CUT_IN),
        }
    }
}

impl UserTurnLimit {
    /// No limit yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// At most this many words.
    pub fn max_words(mut self, words: u32) -> Self {
        self.max_words = Some(words);
        self
    }

    /// At most this long since the user began.
    pub fn max_duration(mut self, duration: Duration) -> Self {
        self.max_duration = Some(duration);
        self
    }

    /// Whether the agent cuts in (default true); false: only the event.
    pub fn cut_in(mut self, cut_in: bool) -> Self {
        self.cut_in = cut_in;
        self
    }

    /// The instructions of the reply that cuts in (default [`DEFAULT_CUT_IN`]).
    pub fn instructions(mut self, instructions: impl Into<String>) -> Self {
        self.instructions = Arc::from(instructions.into());
        self
    }

    /// Whether any limit is set.
    pub(crate) fn is_set(&self) -> bool {
        self.max_words.is_some() || self.max_duration.is_some()
    }
}

// ---- The host's classifier ------------------------------------------------------------

/// What the user said over the agent, as the classifier sees it.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct Overlap<'a> {
    /// The user's words over the agent so far: the finals of this overlap joined, then
    /// the latest interim transcript.
    pub transcript: &'a str,
    /// Whether the latest transcript was final.
    pub is_final: bool,
    /// How many words `transcript` has.
    pub words: usize,
    /// How long the user has been speaking over the agent.
    pub user_speaking_for: Duration,
    /// How long the agent had been speaking when the user began.
    pub agent_spoke_for: Duration,
    /// Whether the user is still speaking (as the host's voice detection said last).
    pub user_speaking: bool,
    /// What the built-in rules answer (`min_words`, the backchannel words, the
    /// boundaries): return it to keep their decision.
    pub rule: OverlapVerdict,
}

impl<'a> Overlap<'a> {
    /// An overlap of `transcript` (its words counted), with no timing yet and the rule's
    /// answer `rule`: for testing a classifier.
    pub fn new(transcript: &'a str, is_final: bool, rule: OverlapVerdict) -> Self {
        Self {
            transcript,
            is_final,
            words: words::count(transcript),
            user_speaking_for: Duration::ZERO,
            agent_spoke_for: Duration::ZERO,
            user_speaking: !is_final,
            rule,
        }
    }

    /// The same overlap with its timing: how long the user has spoken over the agent, how
    /// long the agent had spoken before, whether the user still speaks.
    pub fn timing(
        mut self,
        user_speaking_for: Duration,
        agent_spoke_for: Duration,
        user_speaking: bool,
    ) -> Self {
        self.user_speaking_for = user_speaking_for;
        self.agent_spoke_for = agent_spoke_for;
        self.user_speaking = user_speaking;
        self
    }
}

/// What the user's words over the agent are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OverlapVerdict {
    /// A real interruption: the agent yields.
    Interrupt,
    /// Not an interruption (a backchannel, a cough transcribed): the agent goes on, and a
    /// final transcript with this verdict makes no turn.
    Ignore,
    /// Not sure yet: the agent goes on, and the next transcript is asked about again. A
    /// final transcript is never left waiting: the built-in rule decides it.
    Wait,
}

/// Whether the user is done speaking.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndOfTurn {
    /// Probably done: the turn ends after the endpointing delay.
    Likely,
    /// Probably not (a sentence cut mid-way): the turn waits the maximum delay.
    Unlikely,
}

/// The host's own turn classifier (LiveKit's adaptive interruption and turn detector are
/// models; here the host brings its own). Both methods have defaults that keep the
/// built-in rules, so a host implements the one it has.
///
/// Called on the session's thread as transcripts arrive: answer fast (a model that needs
/// I/O should keep its latest answer at hand and return it).
pub trait TurnClassifier: Send + Sync + 'static {
    /// What the user's words over the agent's speech are; asked at each transcript with
    /// words while the agent speaks.
    fn overlap(&self, overlap: &Overlap<'_>) -> OverlapVerdict {
        overlap.rule
    }

    /// Whether the user is done, at a final transcript (`transcript`: their words so far
    /// in this turn).
    fn end_of_turn(&self, transcript: &str) -> EndOfTurn {
        let _ = transcript;
        EndOfTurn::Likely
    }
}

/// A classifier as the settings hold it.
#[derive(Clone)]
pub(crate) struct Classifier(pub(crate) Arc<dyn TurnClassifier>);

impl fmt::Debug for Classifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TurnClassifier")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_overrides_the_session_group_by_group() {
        let session = TurnHandling::new()
            .endpointing(Endpointing::fixed(Duration::from_millis(300)))
            .interruption(Interruption::new().min_words(2));
        let agent = TurnHandling::new().interruption(Interruption::new().min_words(3));
        let rules = agent.over(&session).rules();
        assert_eq!(rules.endpointing.min_delay, Duration::from_millis(300));
        assert_eq!(rules.interruption.min_words, 3);
        assert!(!rules.preemptive.enabled);
        assert!(!rules.user_turn_limit.is_set());
        assert!(rules.needs_words());
        assert!(
            !TurnHandling::new().rules().needs_words(),
            "defaults: voice decides"
        );
    }

    #[test]
    fn delays_stay_ordered_and_alpha_in_range() {
        let e = Endpointing::dynamic(Duration::from_secs(2), Duration::from_secs(1));
        assert_eq!(e.max_delay, Duration::from_secs(2));
        let e = Endpointing::dynamic(Duration::from_millis(500), Duration::from_secs(3)).alpha(7.0);
        assert_eq!(e.mode, EndpointingMode::Dynamic { alpha: 0.9 });
        let e = Endpointing::fixed(Duration::from_secs(5));
        assert_eq!(e.max_delay, Duration::from_secs(5));
    }
}
