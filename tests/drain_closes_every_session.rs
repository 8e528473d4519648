//! SPEC §16 "Drain": `Engine::drain(deadline)` refuses new sessions from the call on,
//! lets live sessions settle and closes them, force-interrupts and closes those still
//! unsettled at the deadline, and returns every session's id and history; a running tool
//! gets its terminal output, and no actor is left. For sessions of `Engine::current()`
//! (on the test's arbiter, in virtual time) and of `Engine::start()` (own threads, the
//! host on tokio).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{spawn_turn, wait_on, Query};
use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{event, Gate, Reply, ScriptedLlm};
use switchboard::{DrainEnd, DrainReport, EngineError, SessionState};

/// A tool that answers with an update and then holds its run until `gate` opens, deaf to
/// cancellation: only the close's grace period ends it.
fn gated_job(gate: &Gate) -> Tool {
    let gate = gate.clone();
    Tool::new("job", "Holds its run", move |ctx: RunContext, _: Query| {
        let gate = gate.clone();
        async move {
            ctx.update("started").await?;
            gate.wait().await;
            Ok::<_, ToolFailure>("done")
        }
    })
}

/// A model that calls `job` for each user message and then says it started.
fn job_model() -> Arc<ScriptedLlm> {
    let llm = ScriptedLlm::new([]);
    llm.rule(|request| {
        let after_user = matches!(
            request.chat.items().last(),
            Some(ChatItem::Message(m)) if m.role == ChatRole::User
        );
        after_user.then(|| Reply::tool_call("job", json!({"q": "a"})))
    });
    llm.otherwise(Reply::text("Started."));
    llm
}

fn busy_session(llm: &Arc<ScriptedLlm>, gate: &Gate, grace: Duration) -> SessionBuilder {
    Session::builder()
        .llm(llm.clone())
        .agent(
            Agent::builder("worker")
                .tool(gated_job(gate))
                .build()
                .unwrap(),
        )
        .grace_period(grace)
}

fn idle_session() -> SessionBuilder {
    Session::builder()
        .llm(ScriptedLlm::new([Reply::text("hello")]))
        .agent(Agent::builder("greeter").build().unwrap())
}

/// What tokio's timers add to a wait: each deadline is rounded up to the next millisecond.
const TIMER_ROUNDING: Duration = Duration::from_millis(5);

/// The drained session's terminal output of its job, from its history.
fn job_output(report: &DrainReport, id: &str) -> String {
    let drained = report
        .sessions
        .iter()
        .find(|drained| drained.id.as_str() == id)
        .unwrap_or_else(|| panic!("{id} is not in the drain's report"));
    let chat = drained
        .history
        .chat_of("worker")
        .unwrap_or_else(|| panic!("{id}: no worker in {:?}", drained.history));
    common::assert_invariant(chat);
    // The model is shared, so each session's call has its own id: find it by its name.
    chat.outputs()
        .find(|output| output.name == "job" && output.call_id.ends_with("/finished"))
        .unwrap_or_else(|| panic!("{id}: the job has no terminal output in {chat:?}"))
        .output
        .clone()
}

#[switchboard::test]
async fn a_thousand_sessions_with_running_tools_are_drained_by_the_deadline() {
    tokio::time::pause();
    let engine = Engine::current().unwrap();
    let never = Gate::new();
    let llm = job_model();
    let grace = Duration::from_millis(200);
    let mut sessions = Vec::new();
    for n in 0..1_000 {
        let session = busy_session(&llm, &never, grace)
            .id(format!("call-{n}"))
            .start(&engine)
            .await
            .unwrap();
        session.run("start the job").await.unwrap();
        sessions.push(session);
    }
    let stats = engine.stats();
    assert_eq!(
        (stats.sessions, stats.actors, stats.tool_runs),
        (1_000, 4_000, 1_000),
        "{stats:?}"
    );

    let deadline = Duration::from_secs(30);
    let began = tokio::time::Instant::now();
    // The drain is polled first: from then on a new session is refused.
    let (report, late) = tokio::join!(engine.drain(deadline), idle_session().start(&engine));
    let took = began.elapsed();
    assert!(
        matches!(late, Err(SessionError::Engine(EngineError::Draining))),
        "{late:?}"
    );
    assert!(engine.is_draining());

    // No tool ever finishes, so only the deadline ends the wait; each close then gives a
    // tool its grace period (tokio's timers round each up to the next millisecond).
    assert!(took >= deadline, "{took:?}");
    assert!(took <= deadline + grace + TIMER_ROUNDING, "{took:?}");
    assert!(report.took >= deadline && report.took <= took, "{report:?}");
    assert_eq!(report.sessions.len(), 1_000);
    for n in 0..1_000 {
        let id = format!("call-{n}");
        assert_eq!(
            job_output(&report, &id),
            "Cancelled: the session closed.",
            "{id}"
        );
    }
    assert!(report
        .sessions
        .iter()
        .all(|drained| drained.ended == DrainEnd::Interrupted));
    let stats = engine.stats();
    assert_eq!(
        (stats.sessions, stats.actors, stats.backlog, stats.tool_runs),
        (0, 0, 0, 0),
        "{stats:?}"
    );
    assert!(stats.draining);
    // The hosts' handles see their sessions closed.
    assert_eq!(sessions[0].summary().state, SessionState::Closed);
    assert!(matches!(
        sessions[0].run("hello?").await,
        Err(SessionError::Closed)
    ));
}

#[switchboard::test]
async fn a_drain_lets_a_turn_in_progress_finish_and_closes_idle_sessions_at_once() {
    tokio::time::pause();
    let engine = Engine::current().unwrap();
    // A turn whose model is still answering when the drain begins.
    let answering = Gate::new();
    let talking = Session::builder()
        .id("talking")
        .llm(ScriptedLlm::new([Reply::text("One moment, ")
            .and_wait(&answering)
            .and_text("here it is.")]))
        .agent(Agent::builder("greeter").build().unwrap())
        .start(&engine)
        .await
        .unwrap();
    let mut events = talking.subscribe();
    let turn = spawn_turn(&talking, "tell me");
    wait_on(&mut events, event::agent_state(AgentState::Speaking)).await;
    // An idle session, and one whose host closes it during the drain.
    let idle = idle_session().id("idle").start(&engine).await.unwrap();
    let never = Gate::new();
    let hung_up = busy_session(&job_model(), &never, Duration::ZERO)
        .id("hung-up")
        .start(&engine)
        .await
        .unwrap();
    hung_up.run("start the job").await.unwrap();

    let deadline = Duration::from_secs(60);
    let began = tokio::time::Instant::now();
    let drain = {
        let engine = engine.clone();
        actix::spawn(async move { engine.drain(deadline).await })
    };
    // The idle session goes at once; the talking one is let finish its turn.
    let mut closed = idle.subscribe();
    wait_on(
        &mut closed,
        event::matching("Closed", |e| {
            matches!(e, SessionEvent::Closed).then_some(())
        }),
    )
    .await;
    assert_eq!(talking.summary().state, SessionState::Active);
    answering.open();
    let result = turn.await.unwrap().unwrap();
    assert!(!result.interrupted);
    assert_eq!(
        result.assistant_messages().collect::<Vec<_>>(),
        ["One moment, here it is."]
    );
    hung_up.close().await.unwrap();

    let report = tokio::time::timeout(Duration::from_secs(5), drain)
        .await
        .expect("the drain waited for the deadline though every session settled")
        .unwrap();
    assert!(began.elapsed() < deadline, "{report:?}");
    let ended = |id: &str| {
        report
            .sessions
            .iter()
            .find(|drained| drained.id.as_str() == id)
            .map(|drained| drained.ended)
    };
    assert_eq!(ended("idle"), Some(DrainEnd::Settled));
    assert_eq!(ended("talking"), Some(DrainEnd::Settled));
    assert_eq!(ended("hung-up"), Some(DrainEnd::ClosedByHost));
    assert_eq!(report.sessions.len(), 3);
    // The talking session's history holds the whole answer.
    let talked = report
        .sessions
        .iter()
        .find(|drained| drained.id.as_str() == "talking")
        .unwrap();
    let chat = talked.history.chat_of("greeter").unwrap();
    assert!(
        chat.items().iter().any(|item| matches!(
            item,
            ChatItem::Message(m) if m.content == "One moment, here it is."
        )),
        "{chat:?}"
    );
    assert_eq!(engine.stats().actors, 0);
}

#[switchboard::test]
async fn a_session_whose_start_is_under_way_when_the_drain_begins_is_drained_too() {
    tokio::time::pause();
    let engine = Engine::current().unwrap();
    // The start is polled first: its id is taken before the drain begins.
    let (started, report) = tokio::join!(
        idle_session().id("early").start(&engine),
        engine.drain(Duration::from_secs(10))
    );
    let session = started.unwrap();
    assert_eq!(report.sessions.len(), 1);
    assert_eq!(report.sessions[0].id.as_str(), "early");
    assert_eq!(report.sessions[0].ended, DrainEnd::Settled);
    assert_eq!(session.summary().state, SessionState::Closed);
    assert_eq!(engine.stats().actors, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_on_the_engine_threads_are_drained_from_a_tokio_host() {
    let engine = Engine::with_arbiters(2).unwrap();
    let never = Gate::new();
    let llm = job_model();
    let grace = Duration::from_millis(50);
    let mut sessions = Vec::new();
    for n in 0..50 {
        let session = busy_session(&llm, &never, grace)
            .id(format!("call-{n}"))
            .start(&engine)
            .await
            .unwrap();
        session.run("start the job").await.unwrap();
        sessions.push(session);
    }
    let idle = idle_session().id("idle").start(&engine).await.unwrap();
    assert_eq!(engine.stats().actors, 50 * 4 + 2);

    let deadline = Duration::from_millis(300);
    let began = std::time::Instant::now();
    // The drain is polled first: the start beside it is refused.
    let (report, refused) = tokio::time::timeout(Duration::from_secs(30), async {
        tokio::join!(engine.drain(deadline), idle_session().start(&engine))
    })
    .await
    .expect("the drain did not end within 30 s");
    let took = began.elapsed();
    assert!(
        matches!(refused, Err(SessionError::Engine(EngineError::Draining))),
        "{refused:?}"
    );
    assert!(took >= deadline, "{took:?}");
    assert_eq!(report.sessions.len(), 51);
    for n in 0..50 {
        assert_eq!(
            job_output(&report, &format!("call-{n}")),
            "Cancelled: the session closed."
        );
    }
    let idle_end = report
        .sessions
        .iter()
        .find(|drained| drained.id.as_str() == "idle")
        .unwrap()
        .ended;
    assert_eq!(idle_end, DrainEnd::Settled);
    assert_eq!(idle.summary().state, SessionState::Closed);
    let stats = engine.stats();
    assert_eq!((stats.sessions, stats.actors, stats.backlog), (0, 0, 0));
    engine.shutdown();
}
