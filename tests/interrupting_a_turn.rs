//! SPEC §8 "Preemption", §2a: `Session::interrupt()` stops the current turn now — its LLM
//! stream is dropped, no further step runs, every call of the step gets its output — and
//! `run()` returns `Ok` marked interrupted while queued work goes on. Dropping a `run`
//! future cancels its turn; a supervisor's handoff preempts; `close()` never waits behind
//! a turn.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{assert_invariant, output, spawn_turn, wait_event, DropGuard, Log, Query};
use futures_util::{stream, StreamExt};
use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{Gate, RecordingOutput, Reply, ScriptedLlm};
use switchboard::{LlmChunk, LlmRequest, LlmStream};
use tokio::sync::mpsc;

const BOUND: Duration = Duration::from_secs(30);

async fn bounded<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, fut)
        .await
        .unwrap_or_else(|_| panic!("{what} did not happen within {BOUND:?}"))
}

/// Says "Let me see", then stalls; logs when its stream is dropped. Later requests answer.
struct SaysThenStalls {
    log: Log,
    answered: std::sync::atomic::AtomicBool,
}

impl Llm for SaysThenStalls {
    fn chat(&self, _request: LlmRequest) -> LlmStream {
        if self
            .answered
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            return stream::iter([Ok(LlmChunk::Text("Next answer.".into()))]).boxed();
        }
        let guard = DropGuard(self.log.clone(), "stream dropped");
        stream::iter([Ok(LlmChunk::Text("Let me see".into()))])
            .chain(stream::pending())
            .map(move |chunk| {
                let _keep = &guard;
                chunk
            })
            .boxed()
    }
}

#[actix::test]
async fn interrupt_drops_the_stream_and_the_turn_returns_interrupted_with_what_was_said() {
    tokio::time::pause();
    let log = Log::default();
    let io = RecordingOutput::new();
    let session = Session::builder()
        .llm(Arc::new(SaysThenStalls {
            log: log.clone(),
            answered: Default::default(),
        }))
        .agent(Agent::builder("agent").build().unwrap())
        .output(io.clone())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let mut events = session.subscribe();
    let turn = spawn_turn(&session, "what is my balance?");
    let queued = spawn_turn(&session, "never mind");
    wait_event(&mut events, |e| {
        matches!(e, SessionEvent::SpeechCreated { .. }).then_some(())
    })
    .await;
    bounded("interrupt", session.interrupt()).await.unwrap();
    assert_eq!(log.entries(), ["stream dropped"]);
    let result = turn.await.unwrap().unwrap();
    assert!(result.interrupted);
    assert_eq!(
        result.assistant_messages().collect::<Vec<_>>(),
        ["Let me see"]
    );
    assert!(
        io.speeches()[0].finished,
        "the speech was finished on the output"
    );
    let next = bounded("the queued turn", queued).await.unwrap().unwrap();
    assert!(!next.interrupted);
    assert_eq!(
        next.assistant_messages().collect::<Vec<_>>(),
        ["Next answer."]
    );
    // Nothing to interrupt: answered at once.
    bounded("an idle interrupt", session.interrupt())
        .await
        .unwrap();
    session.close().await.unwrap();
}

/// A tool that reports it started, then waits for its gate; logs when its body is dropped
/// and when it notices cancellation.
fn gated(
    name: &'static str,
    gate: Gate,
    started: mpsc::UnboundedSender<&'static str>,
    log: Log,
) -> Tool {
    Tool::new(
        name,
        "Waits for its gate",
        move |ctx: RunContext, _: Query| {
            let (gate, started, log) = (gate.clone(), started.clone(), log.clone());
            async move {
                let _guard = DropGuard(log.clone(), name);
                let _ = started.send(name);
                match ctx.wait_if_not_cancelled(gate.wait()).await {
                    Some(()) => Ok::<_, ToolFailure>(format!("{name} done")),
                    None => {
                        log.push(format!("{name} saw the cancellation"));
                        Ok(format!("{name} undone"))
                    }
                }
            }
        },
    )
}

#[actix::test]
async fn interrupting_a_tool_step_cancels_some_calls_and_moves_the_others_to_the_background() {
    tokio::time::pause();
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let log = Log::default();
    let booking_gate = Gate::new();
    let booking = gated(
        "book_table",
        booking_gate.clone(),
        started_tx.clone(),
        log.clone(),
    );
    let search =
        gated("search_menu", Gate::new(), started_tx, log.clone()).cancel_on_interruption(true);
    let llm = ScriptedLlm::new([
        Reply::tool_call("book_table", json!({"q": "8pm"}))
            .and_tool_call("search_menu", json!({"q": "vegan"})),
        // The deferred reply to the booking's result.
        Reply::text("Your table is booked."),
    ]);
    let session = Session::builder()
        .llm(llm.clone())
        .agent(
            Agent::builder("agent")
                .tool(booking)
                .tool(search)
                .build()
                .unwrap(),
        )
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let turn = spawn_turn(&session, "book a table and find vegan dishes");
    let mut seen = vec![started.recv().await.unwrap(), started.recv().await.unwrap()];
    seen.sort();
    assert_eq!(seen, ["book_table", "search_menu"]);
    bounded("interrupt", session.interrupt()).await.unwrap();
    let result = turn.await.unwrap().unwrap();
    assert!(result.interrupted);
    assert_eq!(llm.request_count(), 1, "no further step ran");
    let chat = session.chat_context().await.unwrap();
    assert_invariant(&chat);
    assert_eq!(
        output(&chat, "call_1"),
        "Still running; the result will follow."
    );
    assert_eq!(output(&chat, "call_2"), "Cancelled: the user interrupted.");
    // The cancelled call noticed, the other runs on and its result comes later.
    booking_gate.open();
    bounded("the deferred reply", session.wait_for_settled())
        .await
        .unwrap();
    let chat = session.chat_context().await.unwrap();
    assert_invariant(&chat);
    assert_eq!(output(&chat, "call_1/finished"), "book_table done");
    assert!(chat.output_of("call_2/finished").is_none());
    assert!(log
        .entries()
        .contains(&"search_menu saw the cancellation".to_owned()));
    assert_eq!(llm.request_count(), 2);
    session.close().await.unwrap();
}

#[actix::test]
async fn dropping_a_run_future_interrupts_its_turn_and_the_next_turn_runs() {
    tokio::time::pause();
    let llm = ScriptedLlm::new([Reply::stall(), Reply::text("Here now.")]);
    let session = Session::builder()
        .llm(llm.clone())
        .agent(Agent::builder("agent").build().unwrap())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let mut events = session.subscribe();
    // The host gives up on the turn after a second (the model's own timeout is 10 s).
    let gave_up = tokio::time::timeout(Duration::from_secs(1), session.run("hello")).await;
    assert!(gave_up.is_err());
    wait_event(&mut events, |e| {
        matches!(e, SessionEvent::TurnInterrupted { .. }).then_some(())
    })
    .await;
    let started = tokio::time::Instant::now();
    let result = session.run("anyone?").await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "it did not wait for the stalled turn"
    );
    assert_eq!(
        result.assistant_messages().collect::<Vec<_>>(),
        ["Here now."]
    );
    session.close().await.unwrap();
}

#[actix::test]
async fn a_queued_turn_whose_future_is_dropped_never_runs() {
    tokio::time::pause();
    let gate = Gate::new();
    let wait = {
        let gate = gate.clone();
        Tool::new("wait", "Waits", move |_ctx: RunContext, _: Query| {
            let gate = gate.clone();
            async move {
                gate.wait().await;
                Ok::<_, ToolFailure>(())
            }
        })
    };
    let llm = ScriptedLlm::new([Reply::tool_call("wait", json!({"q": "x"}))]);
    llm.otherwise(Reply::text("ok"));
    let session = Session::builder()
        .llm(llm.clone())
        .agent(Agent::builder("agent").tool(wait).build().unwrap())
        .inspect(true)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let inspector = session.inspector().unwrap();
    let first = spawn_turn(&session, "first");
    inspector
        .wait_for("activity/s1/agent#1", "StartTurn", BOUND)
        .await
        .unwrap();
    // Queued behind the first turn, then given up.
    let second = spawn_turn(&session, "second");
    inspector
        .wait_for("session/s1", "RunTurn", BOUND)
        .await
        .unwrap();
    // Queued in the session (its `RunTurn` handled), then the host gives up on it.
    let gave_up = tokio::time::timeout(Duration::from_secs(1), session.run("dropped")).await;
    assert!(gave_up.is_err());
    let run_turns = inspector
        .received("session/s1")
        .unwrap()
        .iter()
        .filter(|r| r.kind == "RunTurn")
        .count();
    assert_eq!(run_turns, 3, "the dropped turn reached the session's queue");
    gate.open();
    first.await.unwrap().unwrap();
    second.await.unwrap().unwrap();
    session.wait_for_inactive().await;
    let users: Vec<String> = session
        .chat_context()
        .await
        .unwrap()
        .items()
        .iter()
        .filter_map(|item| match item {
            ChatItem::Message(m) if m.role == ChatRole::User => Some(m.content.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(users, ["first", "second"]);
    session.close().await.unwrap();
}

#[actix::test]
async fn a_supervisors_handoff_preempts_a_slow_turn() {
    tokio::time::pause();
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let log = Log::default();
    let slow = gated("slow_lookup", Gate::new(), started_tx, log.clone());
    let llm = ScriptedLlm::new([Reply::tool_call("slow_lookup", json!({"q": "x"}))]);
    let session = Session::builder()
        .llm(llm.clone())
        .agent(Agent::builder("bot").tool(slow).build().unwrap())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let turn = spawn_turn(&session, "look it up");
    started.recv().await.unwrap();
    let supervisor = Agent::builder("supervisor").build().unwrap();
    bounded(
        "the preempting handoff",
        session
            .address()
            .send(Handoff::to(supervisor).interrupting()),
    )
    .await
    .unwrap();
    let result = turn.await.unwrap().unwrap();
    assert!(result.interrupted);
    assert_eq!(session.current_agent().await.unwrap(), "supervisor");
    let history = session.close().await.unwrap();
    let bot = history.chat_of("bot").unwrap();
    assert_invariant(bot);
    assert_eq!(
        output(bot, "call_1"),
        "Still running; the result will follow."
    );
    // The bot's own run stopped with its agent.
    assert!(output(bot, "call_1/finished").starts_with("Cancelled: the agent handed off"));
    assert!(
        log.entries().contains(&"slow_lookup".to_owned()),
        "its body was dropped"
    );
}

#[actix::test]
async fn close_does_not_wait_behind_a_stalled_turn() {
    tokio::time::pause();
    let llm = ScriptedLlm::new([Reply::stall()]);
    let session = Session::builder()
        .llm(llm)
        .agent(Agent::builder("agent").build().unwrap())
        .inspect(true)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let inspector = session.inspector().unwrap();
    let turn = spawn_turn(&session, "hello");
    inspector
        .wait_for("activity/s1/agent#1", "StartTurn", BOUND)
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    session.close().await.unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(10),
        "{:?}",
        started.elapsed()
    );
    assert!(matches!(turn.await.unwrap(), Err(SessionError::Closed)));
    assert!(inspector.live_actors().is_empty());
}
