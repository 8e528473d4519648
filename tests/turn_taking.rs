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

use common::{assert_invariant, spawn_turn, wait_event, wait_on};
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

fn user_messages(chat: &ChatContext) -> Vec<String> {
    chat.items()
        .iter()
        .filter_map(|item| match item {
            ChatItem::Message(m) if m.role == ChatRole::User => Some(m.content.clone()),
            _ => None,
        })
        .collect()
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
    let out = RecordingOutput::manual_playout().pausable();
    let llm = ScriptedLlm::new([Reply::text(LONG_ANSWER)]);
    llm.otherwise(Reply::text("Anything else?"));
    let session = start(
        llm.clone(),
        Agent::builder("support").build().unwrap(),
        &out,
        backchannels(),
    )
    .await;
    let mut events = session.subscribe();
    let turn = spawn_turn(&session, "where is my order?");
    let speech = wait_on(&mut events, event::speech_created()).await.id();

    // Two seconds into the answer the caller acknowledges, twice.
    sleep(ms(2000)).await;
    for words in ["Uh-huh.", "Yeah, right."] {
        session.user_started_speaking();
        session.transcript(words.to_lowercase(), false);
        sleep(ms(400)).await;
        session.user_stopped_speaking();
        session.transcript(words, true);
        assert_eq!(
            ignored(&mut events).await,
            (words.to_owned(), IgnoredWords::Backchannel)
        );
    }
    assert!(
        !stopped_or_paused(&out, speech),
        "the speech went on: {:?}",
        out.calls()
    );
    assert_eq!(session.agent_state(), AgentState::Speaking);

    out.played_out(speech);
    let result = turn.await.unwrap().unwrap();
    assert!(!result.interrupted);
    common::settled(&session).await;
    assert_eq!(llm.request_count(), 1, "no turn for the backchannels");
    let chat = session.chat_context().await.unwrap();
    assert_eq!(user_messages(&chat), ["where is my order?"]);
    assert_invariant(&chat);
    session.close().await.unwrap();
}

#[actix::test]
async fn stop_wait_over_the_agent_interrupts_it_and_is_the_next_turn() {
    tokio::time::pause();
    let out = RecordingOutput::manual_playout().pausable();
    let llm = ScriptedLlm::new([Reply::text(LONG_ANSWER)]);
    llm.when_user_says("stop, wait", Reply::text("Sure, go ahead."));
    let session = start(
        llm.clone(),
        Agent::builder("support").build().unwrap(),
        &out,
        backchannels(),
    )
    .await;
    let mut events = session.subscribe();
    let turn = spawn_turn(&session, "where is my order?");
    let speech = wait_on(&mut events, event::speech_created()).await.id();
    sleep(ms(2000)).await;
    session.user_started_speaking();
    session.transcript("stop, wait", false);
    // Words that pass the rules, once the user has spoken the minimum 0.5 s.
    wait_on(&mut events, event::turn_interrupted()).await;
    assert!(out.calls().contains(&OutputCall::Interrupt(speech)));
    out.heard(speech, "Your order left the warehouse");
    assert!(turn.await.unwrap().unwrap().interrupted);
    session.user_stopped_speaking();
    session.transcript("stop, wait", true);
    let answer = wait_on(&mut events, event::speech_created()).await.id();
    out.played_out(answer);
    common::settled(&session).await;
    let chat = session.chat_context().await.unwrap();
    assert_eq!(user_messages(&chat), ["where is my order?", "stop, wait"]);
    assert_eq!(llm.request_count(), 2);
    assert_invariant(&chat);
    session.close().await.unwrap();
}

#[actix::test]
async fn a_backchannel_kept_in_the_transcript_follows_the_agents_words_and_asks_no_reply() {
    tokio::time::pause();
    let out = RecordingOutput::manual_playout();
    let llm = ScriptedLlm::new([Reply::text(LONG_ANSWER)]);
    let turns = TurnHandling::new().interruption(
        Interruption::new().backchannel(Backchannel::english().keep_in_transcript(true)),
    );
    let session = start(
        llm.clone(),
        Agent::builder("support").build().unwrap(),
        &out,
        turns,
    )
    .await;
    let mut events = session.subscribe();
    let _turn = spawn_turn(&session, "where is my order?");
    let speech = wait_on(&mut events, event::speech_created()).await.id();
    sleep(ms(3000)).await;
    session.user_started_speaking();
    session.user_stopped_speaking();
    session.transcript("mm-hmm", true);
    ignored(&mut events).await;
    out.played_out(speech);
    common::settled(&session).await;
    let chat = session.chat_context().await.unwrap();
    let said: Vec<(ChatRole, String)> = chat
        .items()
        .iter()
        .filter_map(|item| match item {
            ChatItem::Message(m) => Some((m.role, m.content.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        said,
        [
            (ChatRole::User, "where is my order?".to_owned()),
            (ChatRole::Assistant, LONG_ANSWER.to_owned()),
            (ChatRole::User, "mm-hmm".to_owned()),
        ]
    );
    assert_eq!(
        llm.request_count(),
        1,
        "a kept backchannel asks for no reply"
    );
    session.close().await.unwrap();
}

#[actix::test]
async fn yeah_as_the_agent_finishes_is_the_users_answer() {
    tokio::time::pause();
    let out = RecordingOutput::manual_playout();
    let llm = ScriptedLlm::new([Reply::text("Shall I book it for eight?")]);
    llm.when_user_says("Yeah.", Reply::text("Booked."));
    let session = start(
        llm.clone(),
        Agent::builder("host").build().unwrap(),
        &out,
        backchannels(),
    )
    .await;
    let mut events = session.subscribe();
    let _turn = spawn_turn(&session, "a table tonight");
    let speech = wait_on(&mut events, event::speech_created()).await.id();
    sleep(ms(2000)).await;
    session.user_started_speaking();
    session.user_stopped_speaking();
    session.transcript("Yeah.", true);
    // The question ends within the end boundary (1 s) of the word.
    sleep(ms(300)).await;
    out.played_out(speech);
    let answer = wait_on(&mut events, event::speech_created()).await.id();
    out.played_out(answer);
    common::settled(&session).await;
    let chat = session.chat_context().await.unwrap();
    assert_eq!(user_messages(&chat), ["a table tonight", "Yeah."]);
    assert_eq!(llm.request_count(), 2);
    session.close().await.unwrap();
}

#[actix::test]
async fn with_a_two_word_rule_one_word_does_not_interrupt_and_two_do() {
    tokio::time::pause();
    let out = RecordingOutput::manual_playout().pausable();
    let llm = ScriptedLlm::new([Reply::text(LONG_ANSWER)]);
    llm.otherwise(Reply::text("Okay."));
    let turns = TurnHandling::new().interruption(Interruption::new().min_words(2));
    let session = start(
        llm.clone(),
        Agent::builder("support").build().unwrap(),
        &out,
        turns,
    )
    .await;
    let mut events = session.subscribe();
    let turn = spawn_turn(&session, "where is my order?");
    let speech = wait_on(&mut events, event::speech_created()).await.id();
    sleep(ms(1500)).await;
    session.user_started_speaking();
    session.transcript("stop", false);
    sleep(ms(1500)).await;
    assert!(
        !stopped_or_paused(&out, speech),
        "one word in 1.5 s of voice: {:?}",
        out.calls()
    );
    session.transcript("stop please", false);
    wait_on(&mut events, event::turn_interrupted()).await;
    out.heard(speech, "Your order left");
    assert!(turn.await.unwrap().unwrap().interrupted);
    session.close().await.unwrap();
}

#[actix::test]
async fn with_a_duration_rule_words_wait_until_the_user_has_spoken_long_enough() {
    tokio::time::pause();
    let out = RecordingOutput::manual_playout().pausable();
    let llm = ScriptedLlm::new([Reply::text(LONG_ANSWER)]);
    llm.otherwise(Reply::text("Okay."));
    let turns = TurnHandling::new().interruption(
        Interruption::new()
            .min_words(1)
            .min_duration(Duration::from_secs(1)),
    );
    let session = start(
        llm.clone(),
        Agent::builder("support").build().unwrap(),
        &out,
        turns,
    )
    .await;
    let mut events = session.subscribe();
    let turn = spawn_turn(&session, "where is my order?");
    let speech = wait_on(&mut events, event::speech_created()).await.id();
    sleep(ms(1500)).await;
    session.user_started_speaking();
    sleep(ms(200)).await;
    session.transcript("hold on", false);
    sleep(ms(700)).await;
    assert!(
        !stopped_or_paused(&out, speech),
        "words after 0.2 s, still under 1 s of voice at 0.9 s"
    );
    sleep(ms(100)).await;
    wait_on(&mut events, event::turn_interrupted()).await;
    out.heard(speech, "Your order");
    assert!(turn.await.unwrap().unwrap().interrupted);
    session.close().await.unwrap();
}

#[actix::test]
async fn with_a_duration_rule_and_no_word_rule_a_short_overlap_resumes_and_a_long_one_interrupts() {
    tokio::time::pause();
    let out = RecordingOutput::manual_playout().pausable();
    let llm = ScriptedLlm::new([Reply::text(LONG_ANSWER)]);
    let turns =
        TurnHandling::new().interruption(Interruption::new().min_duration(Duration::from_secs(1)));
    let session = start(
        llm.clone(),
        Agent::builder("support").build().unwrap(),
        &out,
        turns,
    )
    .await;
    let mut events = session.subscribe();
    let turn = spawn_turn(&session, "where is my order?");
    let speech = wait_on(&mut events, event::speech_created()).await.id();
    session.user_started_speaking();
    sleep(ms(800)).await;
    session.user_stopped_speaking();
    let resumed = wait_event(&mut events, |e| match e {
        SessionEvent::AgentFalseInterruption { resumed } => Some(*resumed),
        _ => None,
    })
    .await;
    assert!(resumed, "0.8 s of voice is under the 1 s minimum");
    assert!(out.calls().contains(&OutputCall::Resume(speech)));
    session.user_started_speaking();
    sleep(ms(1000)).await;
    wait_on(&mut events, event::turn_interrupted()).await;
    out.heard(speech, "Your order left");
    assert!(turn.await.unwrap().unwrap().interrupted);
    session.close().await.unwrap();
}

/// What the classifier was asked, and its answers: it ignores hesitations.
#[derive(Default)]
struct HesitationClassifier {
    asked: Mutex<Vec<(String, bool, usize, Duration, Duration, OverlapVerdict)>>,
}

impl TurnClassifier for HesitationClassifier {
    fn overlap(&self, overlap: &Overlap<'_>) -> OverlapVerdict {
        self.asked.lock().unwrap().push((
            overlap.transcript.to_owned(),
            overlap.is_final,
            overlap.words,
            overlap.user_speaking_for,
            overlap.agent_spoke_for,
            overlap.rule,
        ));
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
    let out = RecordingOutput::manual_playout().pausable();
    let llm = ScriptedLlm::new([Reply::text(LONG_ANSWER)]);
    llm.otherwise(Reply::text("Cancelled."));
    let classifier = Arc::new(HesitationClassifier::default());
    let turns = TurnHandling::new().classifier(classifier.clone());
    let session = start(
        llm.clone(),
        Agent::builder("support").build().unwrap(),
        &out,
        turns,
    )
    .await;
    let mut events = session.subscribe();
    let turn = spawn_turn(&session, "where is my order?");
    let speech = wait_on(&mut events, event::speech_created()).await.id();
    sleep(ms(2000)).await;
    session.user_started_speaking();
    sleep(ms(300)).await;
    session.transcript("hmm let me think", false);
    sleep(ms(1000)).await;
    assert!(
        !stopped_or_paused(&out, speech),
        "the classifier ignored it"
    );
    session.transcript("cancel my order", false);
    wait_on(&mut events, event::turn_interrupted()).await;
    out.heard(speech, "Your order");
    assert!(turn.await.unwrap().unwrap().interrupted);
    let asked = classifier.asked.lock().unwrap().clone();
    let seen: Vec<_> = asked
        .iter()
        .map(|(text, is_final, words, _, _, rule)| (text.as_str(), *is_final, *words, *rule))
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
        close(asked[0].3, ms(300)) && close(asked[1].3, ms(1300)),
        "{asked:?}"
    );
    assert!(
        close(asked[0].4, ms(2000)) && close(asked[1].4, ms(2000)),
        "{asked:?}"
    );
    session.close().await.unwrap();
}

#[actix::test]
async fn words_over_an_uninterruptible_speech_are_discarded_when_the_host_asks() {
    tokio::time::pause();
    let out = RecordingOutput::manual_playout();
    let llm = ScriptedLlm::new([Reply::text("Please listen to these terms in full.")]);
    let turns = TurnHandling::new()
        .interruption(Interruption::new().discard_audio_if_uninterruptible(true));
    let agent = Agent::builder("legal")
        .allow_interruptions(false)
        .build()
        .unwrap();
    let session = start(llm.clone(), agent, &out, turns).await;
    let mut events = session.subscribe();
    let _turn = spawn_turn(&session, "go on");
    let speech = wait_on(&mut events, event::speech_created()).await.id();
    session.transcript("what about refunds", true);
    assert_eq!(
        ignored(&mut events).await,
        (
            "what about refunds".to_owned(),
            IgnoredWords::Uninterruptible
        )
    );
    out.played_out(speech);
    common::settled(&session).await;
    assert_eq!(llm.request_count(), 1);
    session.close().await.unwrap();
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
