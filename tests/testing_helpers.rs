//! The helpers of `switchboard::testing` that hold and wait: a gate on a tool, bounded
//! waits on session events and on the session settling, a model request held in flight, a reply that pauses
//! mid-stream, and finding the output of a given call in a turn.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{
    event, next_event, settled, EventWaiter, Gate, RecordingOutput, Reply, RunResultExt,
    ScriptedLlm, WaitError,
};
use switchboard::{NoArgs, ToolChoice};

const BOUND: Duration = Duration::from_secs(5);

/// Updates, then returns once `gate` opens.
fn search(gate: Gate) -> Tool {
    Tool::new("search", "Searches", move |ctx: RunContext, _: NoArgs| {
        let gate = gate.clone();
        async move {
            ctx.update("searching").await?;
            gate.wait().await;
            Ok::<_, ToolFailure>("3 results")
        }
    })
}

async fn start(llm: std::sync::Arc<ScriptedLlm>, agent: Agent) -> Session {
    Session::builder()
        .llm(llm)
        .agent(agent)
        .start(&Engine::current().unwrap())
        .await
        .unwrap()
}

/// A session whose model calls `search` (behind the returned gate) and says "Searching.";
/// every later request answers "Found 3.".
async fn gated_search() -> (Gate, std::sync::Arc<ScriptedLlm>, Session) {
    let gate = Gate::new();
    let llm = ScriptedLlm::new([
        Reply::tool_call("search", json!({})),
        Reply::text("Searching."),
    ]);
    llm.otherwise(Reply::text("Found 3."));
    let session = start(
        llm.clone(),
        Agent::builder("agent-a")
            .tool(search(gate.clone()))
            .build()
            .unwrap(),
    )
    .await;
    (gate, llm, session)
}

#[actix::test]
async fn a_gate_holds_a_tool_until_the_test_opens_it_and_the_waiter_sees_its_result() {
    let (gate, llm, session) = gated_search().await;
    let mut events = EventWaiter::new(&session);

    session.run("search").await.unwrap();
    assert!(!gate.is_open());
    assert_eq!(
        llm.request_count(),
        2,
        "the tool still runs behind the gate"
    );
    gate.open();
    assert!(gate.is_open() && gate == gate.clone());
    let output = events
        .next(event::output_added("call_1/finished"))
        .await
        .unwrap();
    assert_eq!(output.output, "3 results");
    let said = events
        .next(event::item_added("the deferred reply", |item| {
            item.text()
                .filter(|text| text.starts_with("Found"))
                .map(str::to_owned)
        }))
        .await
        .unwrap();
    assert_eq!(said, ("agent-a".to_owned(), "Found 3.".to_owned()));
    gate.wait().await; // open: at once
    session.close().await.unwrap();
}

#[actix::test]
async fn a_wait_that_cannot_succeed_fails_at_once_under_paused_time_saying_what_it_saw() {
    tokio::time::pause();
    let llm = ScriptedLlm::new([Reply::text("Hello!")]);
    let session = start(llm, Agent::builder("agent-a").build().unwrap()).await;
    let mut events = session.subscribe();
    session.run("hi").await.unwrap();

    let started = tokio::time::Instant::now();
    let error = next_event(
        &mut events,
        event::output_added("call_9"),
        Duration::from_secs(60),
    )
    .await
    .unwrap_err();
    assert!(started.elapsed() >= Duration::from_secs(60), "virtual time");
    let WaitError::Timeout {
        waited_for, saw, ..
    } = &error
    else {
        panic!("expected a timeout, got {error}");
    };
    assert_eq!(waited_for, "the output of call call_9");
    assert!(
        saw.iter()
            .any(|seen| seen == r#"ConversationItemAdded agent-a: message assistant "Hello!""#),
        "{error}"
    );
    let message = error.to_string();
    assert!(
        message.starts_with("no event within 60s: waited for the output of call call_9; saw "),
        "{message}"
    );
    assert!(
        message.contains("\n  SpeechCreated agent-a: speech_1"),
        "{message}"
    );

    // A closure matcher: described generically. A closed session ends the wait at once.
    session.close().await.unwrap();
    let error = next_event(&mut events, |_: &SessionEvent| None::<()>, BOUND)
        .await
        .unwrap_err();
    assert!(matches!(error, WaitError::Closed { .. }), "{error}");
    assert!(
        error
            .to_string()
            .contains("waited for an event the test's closure picks"),
        "{error}"
    );
}

/// `settled` waits for the tool and the deferred reply; when the session cannot settle, it
/// fails at once under paused time, saying what was missing and what it saw.
#[actix::test]
async fn a_bounded_settle_waits_for_the_tools_and_fails_saying_which_half_was_missing() {
    tokio::time::pause();
    let (gate, llm, session) = gated_search().await;
    session.run("search").await.unwrap();

    // The gate stays shut: the session is inactive, but the tool still runs.
    let started = tokio::time::Instant::now();
    let error = settled(&session, Duration::from_secs(60))
        .await
        .unwrap_err();
    assert!(started.elapsed() >= Duration::from_secs(60), "virtual time");
    let WaitError::Timeout { waited_for, .. } = &error else {
        panic!("expected a timeout, got {error}");
    };
    assert_eq!(
        waited_for,
        "the session to settle (it is inactive, but a tool call still runs)"
    );

    // Open, the tool finishes and its deferred reply runs before the wait ends.
    gate.open();
    settled(&session, BOUND).await.unwrap();
    assert_eq!(
        llm.request_count(),
        3,
        "the turn's two and the deferred reply"
    );
    let chat = session.chat_context().await.unwrap();
    assert_eq!(
        chat.items().last().and_then(|item| item.text()),
        Some("Found 3.")
    );
    session.close().await.unwrap();
}

#[actix::test]
async fn a_lagging_receiver_fails_the_wait_instead_of_missing_the_event() {
    let llm = ScriptedLlm::new([Reply::text("One."), Reply::text("Two.")]);
    let session = Session::builder()
        .llm(llm)
        .agent(Agent::builder("agent-a").build().unwrap())
        .event_capacity(2)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let mut events = EventWaiter::new(&session).with_timeout(BOUND);
    session.run("one").await.unwrap();
    session.run("two").await.unwrap();
    let error = events.next(event::speech_created()).await.unwrap_err();
    assert!(
        matches!(error, WaitError::Lagged { missed, .. } if missed > 0),
        "{error}"
    );
    session.close().await.unwrap();
}

#[actix::test]
async fn a_held_request_keeps_the_model_in_flight_until_the_test_releases_it() {
    tokio::time::pause();
    let llm = ScriptedLlm::new([
        Reply::tool_call("search", json!({})),
        Reply::text("Searching now."),
    ]);
    let held = llm.hold(1); // the step after the tool call
    assert_eq!(held.index(), 1);
    assert!(!held.is_requested());
    let gate = Gate::new();
    gate.open();
    let session = start(
        llm.clone(),
        Agent::builder("agent-a")
            .tool(search(gate))
            .build()
            .unwrap(),
    )
    .await;
    let s = session.clone();
    let turn = actix::spawn(async move { s.run("search").await });

    let request = held.requested(BOUND).await.unwrap();
    assert!(held.is_requested());
    assert_eq!(
        request.chat.output_of("call_1").unwrap().output,
        "Update from search: searching"
    );
    // The model is in flight: the turn waits on it, whatever the clock does.
    tokio::time::advance(Duration::from_secs(3)).await;
    assert!(!turn.is_finished());
    assert_eq!(session.agent_state(), AgentState::Thinking);
    held.release();
    assert!(held.is_released());
    let result = turn.await.unwrap().unwrap();
    assert_eq!(
        result.assistant_messages().collect::<Vec<_>>(),
        ["Searching now."]
    );

    // A hold on a request that never comes: the wait says which one.
    let never = llm.hold(7);
    let error = never.requested(Duration::from_secs(1)).await.unwrap_err();
    assert_eq!(
        error.to_string(),
        "no event within 1s: waited for request 7 to the scripted model; saw nothing"
    );
    session.close().await.unwrap();
}

#[actix::test]
async fn an_interruption_while_a_request_is_held_drops_it() {
    let llm = ScriptedLlm::new([Reply::text("Never said.")]);
    let held = llm.hold(0);
    let session = start(llm.clone(), Agent::builder("agent-a").build().unwrap()).await;
    let s = session.clone();
    let turn = actix::spawn(async move { s.run("hi").await });
    held.requested(BOUND).await.unwrap();
    session.interrupt().await.unwrap();
    let result = turn.await.unwrap().unwrap();
    assert!(result.interrupted);
    assert_eq!(result.assistant_messages().count(), 0);
    session.close().await.unwrap();
}

#[actix::test]
async fn a_reply_can_wait_on_a_gate_mid_stream() {
    let gate = Gate::new();
    let out = RecordingOutput::new();
    let llm = ScriptedLlm::new([Reply::text("Hello there, ")
        .and_wait(&gate)
        .and_text("how are you?")]);
    let session = Session::builder()
        .llm(llm)
        .agent(Agent::builder("agent-a").build().unwrap())
        .output(out.clone())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let mut events = EventWaiter::new(&session);
    let s = session.clone();
    let turn = actix::spawn(async move { s.run("hi").await });
    let speech = events.next(event::speech_created()).await.unwrap();
    // The first chunk is out; the rest waits for the gate.
    events
        .next(event::agent_state(AgentState::Speaking))
        .await
        .unwrap();
    assert!(!turn.is_finished());
    gate.open();
    let result = turn.await.unwrap().unwrap();
    assert_eq!(
        result.assistant_messages().collect::<Vec<_>>(),
        ["Hello there, how are you?"]
    );
    assert_eq!(out.last_speech().unwrap().id, speech.id());
    session.close().await.unwrap();
}

#[actix::test]
async fn the_output_of_a_given_call_is_found_wherever_it_is_in_the_turn() {
    let lookup = Tool::new(
        "lookup",
        "Looks up",
        |_ctx: RunContext, args: serde_json::Value| async move {
            Ok::<_, ToolFailure>(format!("found {}", args["q"]))
        },
    );
    // Two calls in one step, the interesting one second; its id is the model's own.
    let llm = ScriptedLlm::new([
        Reply::raw_tool_call("first", "lookup", r#"{"q": "a"}"#).and_raw_tool_call(
            "second",
            "lookup",
            r#"{"q": "b"}"#,
        ),
        Reply::text("Both found."),
    ]);
    let session = start(
        llm.clone(),
        Agent::builder("agent-a").tool(lookup).build().unwrap(),
    )
    .await;
    let result = session.run("look up a and b").await.unwrap();

    let expect = result.expect();
    expect
        .contains_function_call_output_for("second")
        .for_tool("lookup")
        .with_output(r#"found "b""#);
    expect
        .contains_function_call_with_args("lookup", json!({"q": "b"}))
        .has_output()
        .for_call("second")
        .with_output(r#"found "b""#);
    // The first output in the turn is the other call's.
    expect
        .contains_function_call_output()
        .with_output(r#"found "a""#);
    let missing = expect
        .try_contains_function_call_output_for("third")
        .unwrap_err();
    assert_eq!(
        missing.expected(),
        "the output of call `third` among the events"
    );
    assert_eq!(llm.requests()[0].tool_choice, ToolChoice::Auto);
    session.close().await.unwrap();
}
