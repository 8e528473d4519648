//! SPEC §8 "Speech", "Observable state": every utterance has a `SpeechHandle`; `say`
//! speaks a text as it is, by priority then arrival; playout reports are accepted for any
//! speech at any time and cut that speech's own message; a tool can hold interruptions
//! off (and `cancel_task` then refuses its call); agent and user states are observable.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{assert_invariant, output, spawn_turn, wait_event, wait_on, Query};
use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{event, Gate, OutputCall, RecordingOutput, Reply, ScriptedLlm};
use switchboard::{HostInput, InputAnswer, InputId, SpeechId, SpeechPriority};
use tokio::sync::mpsc;
use tokio::time::advance;

const BOUND: Duration = Duration::from_secs(30);

async fn session_with(
    llm: std::sync::Arc<ScriptedLlm>,
    agent: Agent,
    out: &RecordingOutput,
) -> Session {
    Session::builder()
        .llm(llm)
        .agent(agent)
        .output(out.clone())
        .inspect(true)
        .start(&Engine::current().unwrap())
        .await
        .unwrap()
}

/// A session with no model whose output plays speech until the test says it was heard.
async fn speaker() -> (RecordingOutput, Session) {
    let out = RecordingOutput::manual_playout();
    let agent = Agent::builder("agent").build().unwrap();
    let session = session_with(ScriptedLlm::new([]), agent, &out).await;
    (out, session)
}

async fn speech_created(
    events: &mut tokio::sync::broadcast::Receiver<SessionEvent>,
) -> SpeechHandle {
    wait_on(events, event::speech_created()).await
}

fn messages(chat: &ChatContext) -> Vec<(String, Option<SpeechId>, bool)> {
    chat.items()
        .iter()
        .filter_map(|item| match item {
            ChatItem::Message(m) if m.role == ChatRole::Assistant => {
                Some((m.content.clone(), m.speech, m.interrupted))
            }
            _ => None,
        })
        .collect()
}

#[actix::test]
async fn say_speaks_a_text_as_it_is_and_its_handle_knows_when_it_was_heard() {
    let out = RecordingOutput::manual_playout();
    let llm = ScriptedLlm::new([]);
    let session = session_with(llm.clone(), Agent::builder("agent").build().unwrap(), &out).await;
    let mut events = session.subscribe();
    let hello = session.say("Hello, welcome.").await.unwrap();
    let quiet = session
        .say_with("(not recorded)", SayOptions::new().add_to_chat(false))
        .await
        .unwrap();
    let waiter = {
        let hello = hello.clone();
        actix::spawn(async move { hello.wait_for_playout().await })
    };
    assert_eq!(speech_created(&mut events).await, hello);
    assert!(!quiet.is_done());
    // Speeches play one at a time: the second starts once the first was heard.
    out.played_out(hello.id());
    assert_eq!(
        tokio::time::timeout(BOUND, waiter).await.unwrap().unwrap(),
        SpeechOutcome::Played
    );
    assert_eq!(speech_created(&mut events).await, quiet);
    out.played_out(quiet.id());
    assert_eq!(quiet.wait_for_playout().await, SpeechOutcome::Played);
    assert_eq!(llm.request_count(), 0, "say asks no model");
    let chat = session.chat_context().await.unwrap();
    assert_eq!(
        messages(&chat),
        [("Hello, welcome.".to_owned(), Some(hello.id()), false)]
    );
    session.close().await.unwrap();
}

#[actix::test]
async fn queued_speeches_play_by_priority_then_arrival_and_an_interrupted_one_never_plays() {
    let out = RecordingOutput::new();
    let gate = Gate::new();
    let hold = {
        let gate = gate.clone();
        Tool::new(
            "hold",
            "Holds the turn",
            move |_ctx: RunContext, _: Query| {
                let gate = gate.clone();
                async move {
                    gate.wait().await;
                    Ok::<_, ToolFailure>(())
                }
            },
        )
    };
    let llm = ScriptedLlm::new([Reply::tool_call("hold", json!({"q": "x"}))]);
    let session = session_with(
        llm,
        Agent::builder("agent").tool(hold).build().unwrap(),
        &out,
    )
    .await;
    let inspector = session.inspector().unwrap();
    let turn = spawn_turn(&session, "go");
    inspector
        .wait_for("toolset/s1/agent#1/tools", "RunTool", BOUND)
        .await
        .unwrap();
    // The turn runs (its tool holds it): the speeches below queue behind it.
    let low = session
        .say_with("low", SayOptions::new().priority(SpeechPriority::Low))
        .await
        .unwrap();
    let normal = session.say("normal").await.unwrap();
    let dropped = session.say("never said").await.unwrap();
    let high = session
        .say_with("high", SayOptions::new().priority(SpeechPriority::High))
        .await
        .unwrap();
    dropped.interrupt().unwrap();
    assert_eq!(
        dropped.wait_for_playout().await,
        SpeechOutcome::Interrupted {
            heard: Some(String::new())
        }
    );
    gate.open();
    turn.await.unwrap().unwrap();
    tokio::time::timeout(BOUND, session.wait_for_inactive())
        .await
        .unwrap();
    let said: Vec<String> = out.speeches().into_iter().map(|s| s.text).collect();
    assert_eq!(said, ["high", "normal", "low"]);
    for speech in [high, normal, low] {
        assert_eq!(speech.outcome(), Some(SpeechOutcome::Played));
    }
    session.close().await.unwrap();
}

#[actix::test]
async fn an_uninterruptible_say_refuses_interrupt_but_not_force() {
    let (out, session) = speaker().await;
    let mut events = session.subscribe();
    let terms = session
        .say_with(
            "These are the terms.",
            SayOptions::new().allow_interruptions(false),
        )
        .await
        .unwrap();
    let playing = speech_created(&mut events).await;
    assert_eq!(playing, terms);
    assert!(!terms.allow_interruptions());
    assert!(terms.interrupt().is_err());
    assert!(matches!(
        session.interrupt().await,
        Err(SessionError::Uninterruptible)
    ));
    terms.force_interrupt();
    wait_event(&mut events, |e| {
        matches!(e, SessionEvent::TurnInterrupted { .. }).then_some(())
    })
    .await;
    assert!(out.calls().contains(&OutputCall::Interrupt(terms.id())));
    out.heard(terms.id(), "These are");
    assert_eq!(
        terms.wait_for_playout().await,
        SpeechOutcome::Interrupted {
            heard: Some("These are".into())
        }
    );
    let chat = session.chat_context().await.unwrap();
    assert_eq!(
        messages(&chat),
        [("These are".to_owned(), Some(terms.id()), true)]
    );
    session.close().await.unwrap();
}

/// A host that names a speech by its id (`HostInput::InterruptSpeech`, what a cluster's
/// gateway sends for a handle of a speech played elsewhere) interrupts that speech and no
/// other, as the speech's own handle does: a queued one leaves the queue while the one
/// playing goes on; the one playing stops, its turn with it; one that ended is left alone,
/// and so is the speech playing then.
#[actix::test]
async fn a_speech_named_by_its_id_is_interrupted_and_no_other() {
    let (out, session) = speaker().await;
    let mut events = session.subscribe();
    let interrupt = |id: u64, speech: &SpeechHandle| {
        let input = HostInput::InterruptSpeech {
            speech: speech.id(),
            force: false,
        };
        session.apply(InputId::new(id), input)
    };
    let playing = session.say("First, the menu.").await.unwrap();
    let queued = session.say("Then the wine list.").await.unwrap();
    let terms = session
        .say_with("The terms.", SayOptions::new().allow_interruptions(false))
        .await
        .unwrap();
    assert_eq!(speech_created(&mut events).await, playing);

    // The queued one: it never plays, and its end is told as a speech's end is; the one
    // playing goes on. A queued one that disallows interruptions is left alone.
    assert!(matches!(
        interrupt(1, &queued).await.unwrap(),
        InputAnswer::Done
    ));
    assert_eq!(
        queued.wait_for_playout().await,
        SpeechOutcome::Interrupted {
            heard: Some(String::new())
        }
    );
    let ended = wait_event(&mut events, |e| match e {
        SessionEvent::SpeechPlayedOut {
            speech,
            interrupted,
            heard,
        } => Some((*speech, *interrupted, heard.clone())),
        _ => None,
    })
    .await;
    assert_eq!(ended, (queued.id(), true, Some(String::new())));
    interrupt(2, &terms).await.unwrap();
    assert!(!terms.is_done(), "not forced: an uninterruptible one stays");
    let forced = HostInput::InterruptSpeech {
        speech: terms.id(),
        force: true,
    };
    session.apply(InputId::new(3), forced).await.unwrap();
    terms.wait_for_playout().await;
    assert!(!playing.is_done());
    assert!(!out.calls().contains(&OutputCall::Interrupt(playing.id())));

    // The one playing: it stops.
    interrupt(4, &playing).await.unwrap();
    wait_event(&mut events, |e| {
        matches!(e, SessionEvent::TurnInterrupted { .. }).then_some(())
    })
    .await;
    assert!(out.calls().contains(&OutputCall::Interrupt(playing.id())));
    out.heard(playing.id(), "First,");
    assert_eq!(
        playing.wait_for_playout().await,
        SpeechOutcome::Interrupted {
            heard: Some("First,".into())
        }
    );

    // Those that ended: nothing happens, the speech playing now goes on.
    let next = session.say("Welcome back.").await.unwrap();
    assert_eq!(speech_created(&mut events).await, next);
    interrupt(5, &playing).await.unwrap();
    interrupt(6, &queued).await.unwrap();
    // A read after them: the session took both before it.
    let chat = session.chat_context().await.unwrap();
    assert!(!next.is_done());
    assert!(!out.calls().contains(&OutputCall::Interrupt(next.id())));
    out.played_out(next.id());
    assert_eq!(next.wait_for_playout().await, SpeechOutcome::Played);
    assert_eq!(
        messages(&chat),
        [
            ("First,".to_owned(), Some(playing.id()), true),
            ("Welcome back.".to_owned(), Some(next.id()), false)
        ]
    );
    session.close().await.unwrap();
}

#[actix::test]
async fn reports_come_for_any_speech_at_any_time_and_cut_only_their_own_message() {
    let out = RecordingOutput::manual_playout();
    let lookup = Tool::new(
        "lookup",
        "Looks up",
        |_ctx: RunContext, _: Query| async move { Ok::<_, ToolFailure>("found") },
    );
    let llm = ScriptedLlm::new([
        Reply::text("First part.").and_tool_call("lookup", json!({"q": "x"})),
        Reply::text("Second part."),
    ]);
    let session = session_with(
        llm,
        Agent::builder("agent").tool(lookup).build().unwrap(),
        &out,
    )
    .await;
    let mut events = session.subscribe();
    let turn = spawn_turn(&session, "tell me");
    let first = speech_created(&mut events).await;
    let second = speech_created(&mut events).await;
    // The later speech is reported first, then the output says the first one was cut.
    out.played_out(second.id());
    out.heard(first.id(), "First");
    let result = tokio::time::timeout(BOUND, turn)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(!result.interrupted);
    let chat = session.chat_context().await.unwrap();
    assert_eq!(
        messages(&chat),
        [
            ("First".to_owned(), Some(first.id()), true),
            ("Second part.".to_owned(), Some(second.id()), false)
        ]
    );
    assert_eq!(
        result.assistant_messages().collect::<Vec<_>>(),
        ["First", "Second part."]
    );
    assert_invariant(&chat);
    session.close().await.unwrap();
}

#[actix::test]
async fn a_report_that_comes_while_the_text_still_streams_applies_when_it_ends() {
    let out = RecordingOutput::manual_playout();
    let gate = Gate::new();
    let llm = ScriptedLlm::new([Reply::text("Hello there, ")
        .and_wait(&gate)
        .and_text("how are you?")]);
    let session = Session::builder()
        .llm(llm)
        .agent(Agent::builder("agent").build().unwrap())
        .output(out.clone())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let mut events = session.subscribe();
    let turn = spawn_turn(&session, "hi");
    let speech = speech_created(&mut events).await;
    // The output reports before the model has finished the text.
    out.heard(speech.id(), "Hello there");
    gate.open();
    let result = tokio::time::timeout(BOUND, turn)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        result.assistant_messages().collect::<Vec<_>>(),
        ["Hello there"]
    );
    session.close().await.unwrap();
}

#[actix::test]
async fn a_tool_can_hold_interruptions_off_while_it_runs() {
    tokio::time::pause();
    let out = RecordingOutput::manual_playout().pausable();
    let gate = Gate::new();
    let (speech_tx, mut speech_rx) = mpsc::unbounded_channel::<Option<SpeechId>>();
    let pay = {
        let gate = gate.clone();
        Tool::new(
            "pay",
            "Charges the card",
            move |ctx: RunContext, _: Query| {
                let (gate, speech_tx) = (gate.clone(), speech_tx.clone());
                async move {
                    ctx.disallow_interruptions();
                    let _ = speech_tx.send(ctx.speech().map(SpeechHandle::id));
                    ctx.update("charging").await?;
                    gate.wait().await;
                    Ok::<_, ToolFailure>("charged")
                }
            },
        )
        .allow_cancellation(true)
    };
    let llm = ScriptedLlm::new([
        Reply::text("Paying now.").and_tool_call("pay", json!({"q": "card"})),
        Reply::tool_call("cancel_task", json!({"call_id": "call_1"})),
        Reply::text("I cannot stop it now."),
    ]);
    let session = session_with(
        llm,
        Agent::builder("cashier").tool(pay).build().unwrap(),
        &out,
    )
    .await;
    let inspector = session.inspector().unwrap();
    let mut events = session.subscribe();
    let turn = spawn_turn(&session, "pay");
    let speech = speech_created(&mut events).await;
    assert_eq!(
        speech_rx.recv().await.unwrap(),
        Some(speech.id()),
        "ctx.speech() is the step's"
    );
    assert!(!speech.allow_interruptions());
    session.user_started_speaking();
    inspector
        .wait_for("activity/s1/cashier#1", "UserStartedSpeaking", BOUND)
        .await
        .unwrap();
    advance(Duration::from_secs(1)).await;
    assert!(!out
        .calls()
        .iter()
        .any(|c| matches!(c, OutputCall::Pause(_) | OutputCall::Interrupt(_))));
    session.user_stopped_speaking();
    out.played_out(speech.id());
    let second = speech_created(&mut events).await;
    out.played_out(second.id());
    let result = tokio::time::timeout(BOUND, turn)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(!result.interrupted);
    let chat = session.chat_context().await.unwrap();
    let refused = chat.output_of("call_2").unwrap();
    assert!(refused.is_error);
    assert!(
        refused.output.contains("does not allow interruptions"),
        "{}",
        refused.output
    );
    gate.open();
    wait_on(&mut events, event::output_added("call_1/finished")).await;
    let chat = session.chat_context().await.unwrap();
    assert_eq!(output(&chat, "call_1/finished"), "charged");
    assert_invariant(&chat);
    session.close().await.unwrap();
}

#[actix::test]
async fn agent_and_user_states_follow_the_conversation_and_a_silent_user_goes_away() {
    tokio::time::pause();
    let out = RecordingOutput::manual_playout();
    let llm = ScriptedLlm::new([Reply::text("Hi!")]);
    let session = Session::builder()
        .llm(llm)
        .agent(Agent::builder("agent").build().unwrap())
        .output(out.clone())
        .user_away_timeout(Some(Duration::from_secs(15)))
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    assert_eq!(session.agent_state(), AgentState::Listening);
    assert_eq!(session.user_state(), UserState::Listening);
    let mut events = session.subscribe();
    session.user_started_speaking();
    let user = |state: UserState| {
        move |e: &SessionEvent| match e {
            SessionEvent::UserStateChanged { state: s } if *s == state => Some(()),
            _ => None,
        }
    };
    wait_event(&mut events, user(UserState::Speaking)).await;
    session.user_stopped_speaking();
    session.transcript("hel", false);
    session.transcript("hello", true);
    let speech = speech_created(&mut events).await;
    assert_eq!(session.agent_state(), AgentState::Speaking);
    out.played_out(speech.id());
    wait_event(&mut events, |e| match e {
        SessionEvent::AgentStateChanged {
            state: AgentState::Listening,
            ..
        } => Some(()),
        _ => None,
    })
    .await;
    // Fifteen silent seconds with the agent idle: the user is away.
    advance(Duration::from_secs(15)).await;
    wait_event(&mut events, user(UserState::Away)).await;
    assert_eq!(session.user_state(), UserState::Away);
    session.close().await.unwrap();
}
