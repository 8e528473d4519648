//! Issue 39, SPEC §19 "Turn-taking": a caller's backchannel ("uh-huh", "right") while the
//! agent speaks neither interrupts it nor starts a turn, "stop, wait" does; a word minimum
//! and a duration minimum each hold an interruption back; the host's classifier hears the
//! interim transcript and its timing and decides; a backchannel said as the agent finishes
//! is the user's turn; words over an uninterruptible speech can be discarded; a dynamic
//! endpointing delay learns a slow speaker's pauses; a user who speaks past the limit is
//! cut in on. Every test on paused time, through the public API: time passes by `sleep`,
//! which lets the session handle what the test sent before the clock moves on.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{assert_invariant, said, spawn_turn, user_messages, wait_event, wait_on};
use switchboard::prelude::*;
use switchboard::testing::{event, OutputCall, RecordingOutput, Reply, ScriptedLlm};
use switchboard::{
    Backchannel, EndOfTurn, Endpointing, IgnoredWords, Interruption, Overlap, OverlapVerdict,
    SpeechId, ToolChoice, TurnClassifier, TurnHandling, UserTurnLimit, DEFAULT_CUT_IN,
};
use tokio::time::sleep;

const LONG_ANSWER: &str = "Your order left the warehouse on Monday and arrives by Thursday.";

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

async fn start(
    llm: Arc<ScriptedLlm>,
    agent: Agent,
    out: &RecordingOutput,
    turns: TurnHandling,
) -> Session {
    Session::builder()
        .llm(llm)
        .agent(agent)
        .output(out.clone())
        .turn_handling(turns)
        .start(&Engine::current().unwrap())
        .await
        .unwrap()
}

/// A session whose agent speaks (its speech still playing) in answer to "where is my
/// order?", `after` into its speech.
struct Speaking {
    session: Session,
    llm: Arc<ScriptedLlm>,
    out: RecordingOutput,
    events: tokio::sync::broadcast::Receiver<SessionEvent>,
    turn: tokio::task::JoinHandle<Result<RunResult, SessionError>>,
    speech: SpeechId,
}

async fn speaking(agent: Agent, turns: TurnHandling, answer: &str, after: Duration) -> Speaking {
    let out = RecordingOutput::manual_playout().pausable();
    let llm = ScriptedLlm::new([Reply::text(answer)]);
    llm.otherwise(Reply::text("Okay."));
    let session = start(llm.clone(), agent, &out, turns).await;
    let mut events = session.subscribe();
    let turn = spawn_turn(&session, "where is my order?");
    let speech = wait_on(&mut events, event::speech_created()).await.id();
    sleep(after).await;
    Speaking {
        session,
        llm,
        out,
        events,
        turn,
        speech,
    }
}

fn support() -> Agent {
    Agent::builder("support").build().unwrap()
}

impl Speaking {
    /// The user's words made the agent stop: what the user heard, and the turn's end.
    async fn interrupted(mut self) -> Self {
        wait_on(&mut self.events, event::turn_interrupted()).await;
        assert!(self
            .out
            .calls()
            .contains(&OutputCall::Interrupt(self.speech)));
        self.out.heard(self.speech, "Your order");
        assert!((&mut self.turn).await.unwrap().unwrap().interrupted);
        self
    }

    /// Whether the output was told to pause or stop the speech.
    fn stopped_or_paused(&self) -> bool {
        stopped_or_paused(&self.out, self.speech)
    }
}

fn backchannels() -> TurnHandling {
    TurnHandling::new().interruption(Interruption::new().backchannel(Backchannel::english()))
}

fn stopped_or_paused(out: &RecordingOutput, speech: SpeechId) -> bool {
    out.calls()
        .iter()
        .any(|c| matches!(c, OutputCall::Pause(s) | OutputCall::Interrupt(s) if *s == speech))
}

async fn ignored(
    events: &mut tokio::sync::broadcast::Receiver<SessionEvent>,
) -> (String, IgnoredWords) {
    wait_event(events, |e| match e {
        SessionEvent::UserWordsIgnored { text, reason } => Some((text.clone(), *reason)),
        _ => None,
    })
    .await
}

#[actix::test]
async fn backchannel_words_during_a_speech_neither_interrupt_it_nor_start_a_turn() {
    tokio::time::pause();
    // Two seconds into the answer the caller acknowledges, twice.
    let mut s = speaking(support(), backchannels(), LONG_ANSWER, ms(2000)).await;
    for words in ["Uh-huh.", "Yeah, right."] {
        s.session.user_started_speaking();
        s.session.transcript(words.to_lowercase(), false);
        sleep(ms(400)).await;
        s.session.user_stopped_speaking();
        s.session.transcript(words, true);
        assert_eq!(
            ignored(&mut s.events).await,
            (words.to_owned(), IgnoredWords::Backchannel)
        );
    }
    assert!(
        !s.stopped_or_paused(),
        "the speech went on: {:?}",
        s.out.calls()
    );
    assert_eq!(s.session.agent_state(), AgentState::Speaking);

    s.out.played_out(s.speech);
    assert!(!s.turn.await.unwrap().unwrap().interrupted);
    common::settled(&s.session).await;
    assert_eq!(s.llm.request_count(), 1, "no turn for the backchannels");
    let chat = s.session.chat_context().await.unwrap();
    assert_eq!(user_messages(&chat), ["where is my order?"]);
    assert_invariant(&chat);
    s.session.close().await.unwrap();
}

#[actix::test]
async fn stop_wait_over_the_agent_interrupts_it_and_is_the_next_turn() {
    tokio::time::pause();
    let s = speaking(support(), backchannels(), LONG_ANSWER, ms(2000)).await;
    s.session.user_started_speaking();
    s.session.transcript("stop, wait", false);
    // Words that pass the rules, once the user has spoken the minimum 0.5 s.
    let mut s = s.interrupted().await;
    s.session.user_stopped_speaking();
    s.session.transcript("stop, wait", true);
    let answer = wait_on(&mut s.events, event::speech_created()).await.id();
    s.out.played_out(answer);
    common::settled(&s.session).await;
    let chat = s.session.chat_context().await.unwrap();
    assert_eq!(user_messages(&chat), ["where is my order?", "stop, wait"]);
    assert_eq!(s.llm.request_count(), 2);
    assert_invariant(&chat);
    s.session.close().await.unwrap();
}

#[actix::test]
async fn a_backchannel_kept_in_the_transcript_follows_the_agents_words_and_asks_no_reply() {
    tokio::time::pause();
    let turns = TurnHandling::new().interruption(
        Interruption::new().backchannel(Backchannel::english().keep_in_transcript(true)),
    );
    let mut s = speaking(support(), turns, LONG_ANSWER, ms(3000)).await;
    s.session.user_started_speaking();
    s.session.user_stopped_speaking();
    s.session.transcript("mm-hmm", true);
    ignored(&mut s.events).await;
    s.out.played_out(s.speech);
    common::settled(&s.session).await;
    let chat = s.session.chat_context().await.unwrap();
    assert_eq!(
        said(&chat),
        [
            (ChatRole::User, "where is my order?".to_owned()),
            (ChatRole::Assistant, LONG_ANSWER.to_owned()),
            (ChatRole::User, "mm-hmm".to_owned()),
        ]
    );
    assert_eq!(
        s.llm.request_count(),
        1,
        "a kept backchannel asks for no reply"
    );
    s.session.close().await.unwrap();
}

#[actix::test]
async fn yeah_as_the_agent_finishes_is_the_users_answer() {
    tokio::time::pause();
    let question = "Shall I book it for eight?";
    let mut s = speaking(support(), backchannels(), question, ms(2000)).await;
    s.session.user_started_speaking();
    s.session.user_stopped_speaking();
    s.session.transcript("Yeah.", true);
    // The question ends within the end boundary (1 s) of the word.
    sleep(ms(300)).await;
    s.out.played_out(s.speech);
    let answer = wait_on(&mut s.events, event::speech_created()).await.id();
    s.out.played_out(answer);
    common::settled(&s.session).await;
    let chat = s.session.chat_context().await.unwrap();
    assert_eq!(user_messages(&chat), ["where is my order?", "Yeah."]);
    assert_eq!(s.llm.request_count(), 2);
    s.session.close().await.unwrap();
}

#[actix::test]
async fn with_a_two_word_rule_one_word_does_not_interrupt_and_two_do() {
    tokio::time::pause();
    let turns = TurnHandling::new().interruption(Interruption::new().min_words(2));
    let s = speaking(support(), turns, LONG_ANSWER, ms(1500)).await;
    s.session.user_started_speaking();
    s.session.transcript("stop", false);
    sleep(ms(1500)).await;
    assert!(
        !s.stopped_or_paused(),
        "one word in 1.5 s of voice: {:?}",
        s.out.calls()
    );
    s.session.transcript("stop please", false);
    s.interrupted().await.session.close().await.unwrap();
}

#[actix::test]
async fn with_a_duration_rule_words_wait_until_the_user_has_spoken_long_enough() {
    tokio::time::pause();
    let turns = TurnHandling::new().interruption(
        Interruption::new()
            .min_words(1)
            .min_duration(Duration::from_secs(1)),
    );
    let s = speaking(support(), turns, LONG_ANSWER, ms(1500)).await;
    s.session.user_started_speaking();
    sleep(ms(200)).await;
    s.session.transcript("hold on", false);
    sleep(ms(700)).await;
    assert!(
        !s.stopped_or_paused(),
        "words after 0.2 s, still under 1 s of voice at 0.9 s"
    );
    sleep(ms(100)).await;
    s.interrupted().await.session.close().await.unwrap();
}

#[actix::test]
async fn with_a_duration_rule_and_no_word_rule_a_short_overlap_resumes_and_a_long_one_interrupts() {
    tokio::time::pause();
    let turns =
        TurnHandling::new().interruption(Interruption::new().min_duration(Duration::from_secs(1)));
    let mut s = speaking(support(), turns, LONG_ANSWER, Duration::ZERO).await;
    s.session.user_started_speaking();
    sleep(ms(800)).await;
    s.session.user_stopped_speaking();
    let resumed = wait_event(&mut s.events, |e| match e {
        SessionEvent::AgentFalseInterruption { resumed } => Some(*resumed),
        _ => None,
    })
    .await;
    assert!(resumed, "0.8 s of voice is under the 1 s minimum");
    assert!(s.out.calls().contains(&OutputCall::Resume(s.speech)));
    s.session.user_started_speaking();
    sleep(ms(1000)).await;
    s.interrupted().await.session.close().await.unwrap();
}

/// One question the classifier was asked.
#[derive(Clone, Debug)]
struct Asked {
    text: String,
    is_final: bool,
    words: usize,
    user_for: Duration,
    agent_for: Duration,
    rule: OverlapVerdict,
}

/// What the classifier was asked, and its answers: it ignores hesitations.
#[derive(Default)]
struct HesitationClassifier {
    asked: Mutex<Vec<Asked>>,
}

impl TurnClassifier for HesitationClassifier {
    fn overlap(&self, overlap: &Overlap<'_>) -> OverlapVerdict {
        self.asked.lock().unwrap().push(Asked {
            text: overlap.transcript.to_owned(),
            is_final: overlap.is_final,
            words: overlap.words,
            user_for: overlap.user_speaking_for,
            agent_for: overlap.agent_spoke_for,
            rule: overlap.rule,
        });
        if overlap.transcript.starts_with("hmm") {
            OverlapVerdict::Ignore
        } else {
            overlap.rule
        }
    }
}

#[actix::test]
async fn the_hosts_classifier_hears_the_interim_transcript_and_its_timing_and_decides() {
    tokio::time::pause();
    let classifier = Arc::new(HesitationClassifier::default());
    let turns = TurnHandling::new().classifier(classifier.clone());
    let s = speaking(support(), turns, LONG_ANSWER, ms(2000)).await;
    s.session.user_started_speaking();
    sleep(ms(300)).await;
    s.session.transcript("hmm let me think", false);
    sleep(ms(1000)).await;
    assert!(!s.stopped_or_paused(), "the classifier ignored it");
    s.session.transcript("cancel my order", false);
    let s = s.interrupted().await;
    let asked = classifier.asked.lock().unwrap().clone();
    let seen: Vec<_> = asked
        .iter()
        .map(|a| (a.text.as_str(), a.is_final, a.words, a.rule))
        .collect();
    assert_eq!(
        seen,
        [
            ("hmm let me think", false, 4, OverlapVerdict::Interrupt),
            ("cancel my order", false, 3, OverlapVerdict::Interrupt),
        ],
        "each interim transcript, its words, and what the built-in rule says"
    );
    // The timing: the user 0.3 s and 1.3 s over the agent, which had spoken 2 s when they
    // began (tokio's timer rounds each sleep up to its next millisecond).
    let close =
        |actual: Duration, expected: Duration| actual >= expected && actual <= expected + ms(5);
    assert!(
        close(asked[0].user_for, ms(300)) && close(asked[1].user_for, ms(1300)),
        "{asked:?}"
    );
    assert!(
        close(asked[0].agent_for, ms(2000)) && close(asked[1].agent_for, ms(2000)),
        "{asked:?}"
    );
    s.session.close().await.unwrap();
}

#[actix::test]
async fn words_over_an_uninterruptible_speech_are_discarded_when_the_host_asks() {
    tokio::time::pause();
    let turns = TurnHandling::new()
        .interruption(Interruption::new().discard_audio_if_uninterruptible(true));
    let agent = Agent::builder("legal")
        .allow_interruptions(false)
        .build()
        .unwrap();
    let mut s = speaking(
        agent,
        turns,
        "Please listen to these terms in full.",
        ms(500),
    )
    .await;
    s.session.transcript("what about refunds", true);
    assert_eq!(
        ignored(&mut s.events).await,
        (
            "what about refunds".to_owned(),
            IgnoredWords::Uninterruptible
        )
    );
    s.out.played_out(s.speech);
    common::settled(&s.session).await;
    assert_eq!(s.llm.request_count(), 1);
    s.session.close().await.unwrap();
}

/// A slow speaker: utterances with 1.5 s pauses (interim words only), then a final, a
/// 1 s pause, and the rest of the sentence.
async fn slow_speaker(endpointing: Endpointing) -> Vec<String> {
    let llm = ScriptedLlm::new([]);
    llm.otherwise(Reply::text("For four, noted."));
    let session = Session::builder()
        .llm(llm.clone())
        .agent(Agent::builder("host").build().unwrap())
        .turn_handling(TurnHandling::new().endpointing(endpointing))
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.user_started_speaking();
    session.transcript("I'd", false);
    sleep(ms(500)).await;
    session.user_stopped_speaking();
    for _ in 0..2 {
        sleep(ms(1500)).await;
        session.user_started_speaking();
        sleep(ms(500)).await;
        session.user_stopped_speaking();
    }
    session.transcript("I'd like a table", true);
    sleep(ms(1000)).await;
    session.user_started_speaking();
    session.transcript("for four", true);
    sleep(ms(400)).await;
    session.user_stopped_speaking();
    common::settled(&session).await;
    let chat = session.chat_context().await.unwrap();
    session.close().await.unwrap();
    user_messages(&chat)
}

#[actix::test]
async fn a_dynamic_endpointing_delay_adapts_to_a_slow_speaker() {
    tokio::time::pause();
    // A fixed half second cuts the slow speaker's sentence in two.
    assert_eq!(
        slow_speaker(Endpointing::fixed(ms(500))).await,
        ["I'd like a table", "for four"]
    );
    // A learned delay heard their 1.5 s pauses and waits for the rest.
    assert_eq!(
        slow_speaker(Endpointing::dynamic(ms(500), Duration::from_secs(3)).alpha(0.5)).await,
        ["I'd like a table for four"]
    );
}

struct Unfinished;

impl TurnClassifier for Unfinished {
    fn end_of_turn(&self, transcript: &str) -> EndOfTurn {
        if transcript.ends_with("and") {
            EndOfTurn::Unlikely
        } else {
            EndOfTurn::Likely
        }
    }
}

#[actix::test]
async fn words_the_classifier_finds_unfinished_wait_the_maximum_delay() {
    tokio::time::pause();
    let llm = ScriptedLlm::new([]);
    llm.otherwise(Reply::text("Noted."));
    let turns = TurnHandling::new()
        .endpointing(Endpointing::fixed(ms(500)).max_delay(ms(2500)))
        .classifier(Arc::new(Unfinished));
    let session = Session::builder()
        .llm(llm.clone())
        .agent(Agent::builder("host").build().unwrap())
        .turn_handling(turns)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.transcript("a table for two and", true);
    sleep(ms(2000)).await;
    session.transcript("a high chair", true);
    common::settled(&session).await;
    let chat = session.chat_context().await.unwrap();
    assert_eq!(
        user_messages(&chat),
        ["a table for two and a high chair"],
        "2 s after an unfinished sentence the turn still waited"
    );
    session.close().await.unwrap();
}

#[actix::test]
async fn a_user_who_speaks_past_the_limit_is_cut_in_on_with_a_reply_they_cannot_interrupt() {
    tokio::time::pause();
    let out = RecordingOutput::manual_playout();
    let llm = ScriptedLlm::new([Reply::text("Sorry to cut in: let me help with that.")]);
    let turns = TurnHandling::new().user_turn_limit(UserTurnLimit::new().max_words(12));
    let session = start(
        llm.clone(),
        Agent::builder("support").build().unwrap(),
        &out,
        turns,
    )
    .await;
    let mut events = session.subscribe();
    session.user_started_speaking();
    session.transcript("so first I ordered the blue one", true);
    sleep(ms(2000)).await;
    session.transcript("and then it came in red instead", true);
    let (words, transcript) = wait_event(&mut events, |e| match e {
        SessionEvent::UserTurnExceeded {
            words, transcript, ..
        } => Some((*words, transcript.clone())),
        _ => None,
    })
    .await;
    assert_eq!(words, 14);
    assert_eq!(
        transcript,
        "so first I ordered the blue one and then it came in red instead"
    );
    let cut_in = wait_on(&mut events, event::speech_created()).await;
    assert!(
        !cut_in.allow_interruptions(),
        "the user cannot talk over the cut-in"
    );
    let request = &llm.requests()[0];
    assert_eq!(request.extra_instructions.as_deref(), Some(DEFAULT_CUT_IN));
    assert_eq!(request.tool_choice, ToolChoice::None);
    session.user_stopped_speaking();
    out.played_out(cut_in.id());
    common::settled(&session).await;
    let chat = session.chat_context().await.unwrap();
    assert_eq!(
        user_messages(&chat),
        ["so first I ordered the blue one and then it came in red instead"]
    );
    session.close().await.unwrap();
}
