//! SPEC §2a: a tool or hook runs inside a turn or a handoff, so what it asks of its
//! session is queued and answered at once; a host handle smuggled into it fails at once
//! instead of waiting on its own turn. Every wait here is bounded, and fails saying what
//! it waited for.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use common::Query;
use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{settled, Reply, ScriptedLlm};

const BOUND: Duration = Duration::from_secs(30);

async fn bounded<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, fut)
        .await
        .unwrap_or_else(|_| panic!("{what} did not answer within {BOUND:?}"))
}

#[actix::test]
async fn a_tool_that_awaits_a_handoff_queues_it_and_the_handoff_follows_its_turn() {
    tokio::time::pause();
    let specialist = Agent::builder("specialist").build().unwrap();
    let transfer = Tool::new(
        "transfer",
        "Hands over",
        move |ctx: RunContext, _: Query| {
            let specialist = specialist.clone();
            async move {
                ctx.session().update_agent(specialist).await?;
                Ok::<_, ToolFailure>("The specialist will take over.")
            }
        },
    );
    let llm = ScriptedLlm::new([
        Reply::tool_call("transfer", json!({"q": "x"})),
        Reply::text("Transferring you now."),
        Reply::text("Specialist here."),
    ]);
    let session = Session::builder()
        .llm(llm.clone())
        .agent(Agent::builder("front").tool(transfer).build().unwrap())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let result = bounded("the turn", session.run("help")).await.unwrap();
    assert_eq!(
        result.assistant_messages().collect::<Vec<_>>(),
        ["Transferring you now."]
    );
    assert_eq!(
        bounded("current_agent", session.current_agent())
            .await
            .unwrap(),
        "specialist"
    );
    let result = bounded("the next turn", session.run("hi")).await.unwrap();
    assert_eq!(
        result.assistant_messages().collect::<Vec<_>>(),
        ["Specialist here."]
    );
    session.close().await.unwrap();
}

#[actix::test]
async fn a_tool_that_awaits_a_reply_queues_it_after_its_turn() {
    tokio::time::pause();
    let nudge = Tool::new(
        "nudge",
        "Asks for a reply",
        |ctx: RunContext, _: Query| async move {
            ctx.session().generate_reply("Mention the weather.").await?;
            Ok::<_, ToolFailure>(())
        },
    );
    let llm = ScriptedLlm::new([
        Reply::tool_call("nudge", json!({"q": "x"})),
        Reply::text("It is sunny."),
    ]);
    let session = Session::builder()
        .llm(llm.clone())
        .agent(Agent::builder("agent").tool(nudge).build().unwrap())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    bounded("the turn", session.run("hi")).await.unwrap();
    bounded("the queued reply", session.wait_for_inactive()).await;
    let requests = llm.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        requests[1].extra_instructions.as_deref(),
        Some("Mention the weather.")
    );
    session.close().await.unwrap();
}

#[actix::test]
async fn an_on_enter_hook_that_awaits_a_reply_does_not_hold_up_the_start() {
    tokio::time::pause();
    let llm = ScriptedLlm::new([Reply::text("Hello, how can I help?")]);
    let agent = Agent::builder("greeter")
        .on_enter(|ctx| async move {
            ctx.session()
                .generate_reply("Greet the user.")
                .await
                .unwrap();
        })
        .build()
        .unwrap();
    let session = bounded(
        "start",
        Session::builder()
            .llm(llm.clone())
            .agent(agent)
            .start(&Engine::current().unwrap()),
    )
    .await
    .unwrap();
    bounded("the greeting", session.wait_for_inactive()).await;
    assert_eq!(llm.request_count(), 1);
    session.close().await.unwrap();
}

#[actix::test]
async fn a_host_handle_used_inside_its_own_tool_or_hook_fails_at_once() {
    tokio::time::pause();
    let host: Arc<OnceLock<Session>> = Arc::new(OnceLock::new());
    let seen: Arc<OnceLock<Vec<String>>> = Arc::new(OnceLock::new());
    let (tool_host, tool_seen) = (host.clone(), seen.clone());
    let misuse = Tool::new(
        "misuse",
        "Uses the host handle",
        move |_ctx: RunContext, _: Query| {
            let (host, seen) = (tool_host.clone(), tool_seen.clone());
            async move {
                let session = host.get().unwrap().clone();
                let other = Agent::builder("other").build().unwrap();
                let answers = vec![
                    format!("{:?}", session.run("again").await.map(|_| ())),
                    format!("{:?}", session.generate_reply(None).await.map(|_| ())),
                    format!("{:?}", session.update_agent(other.clone()).await),
                    // It would wait on this very run.
                    format!("{:?}", session.wait_for_settled().await),
                    format!("{:?}", session.run_task::<u32>(other).await.map(|_| ())),
                    // The bounded wait of `switchboard::testing` is refused the same way.
                    format!("{:?}", settled(&session, BOUND).await),
                ];
                let _ = seen.set(answers);
                Ok::<_, ToolFailure>("done")
            }
        },
    );
    let llm = ScriptedLlm::new([
        Reply::tool_call("misuse", json!({"q": "x"})),
        Reply::text("Done."),
    ]);
    let session = Session::builder()
        .llm(llm)
        .agent(Agent::builder("agent").tool(misuse).build().unwrap())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    host.set(session.clone()).unwrap();
    bounded("the turn", session.run("go")).await.unwrap();
    let answers = seen.get().unwrap();
    for answer in &answers[..4] {
        assert!(answer.contains("WouldDeadlock"), "{answer}");
    }
    assert_eq!(
        answers[4],
        format!(
            "{:?}",
            Err::<(), _>(SessionError::WouldDeadlock {
                operation: "run_task".into()
            })
        )
    );
    assert!(
        answers[5].starts_with(
            "Err(refused at once, waiting for the session to settle: wait_for_settled was called"
        ),
        "{}",
        answers[5]
    );
    session.close().await.unwrap();
}

#[actix::test]
async fn an_on_exit_hook_that_runs_a_turn_on_the_host_handle_fails_instead_of_hanging() {
    tokio::time::pause();
    let host: Arc<OnceLock<Session>> = Arc::new(OnceLock::new());
    let seen: Arc<OnceLock<String>> = Arc::new(OnceLock::new());
    let (hook_host, hook_seen) = (host.clone(), seen.clone());
    let agent = Agent::builder("first")
        .on_exit(move |_ctx| {
            let (host, seen) = (hook_host.clone(), hook_seen.clone());
            async move {
                let session = host.get().unwrap().clone();
                let _ = seen.set(format!("{:?}", session.run("bye").await.map(|_| ())));
            }
        })
        .build()
        .unwrap();
    let session = Session::builder()
        .llm(ScriptedLlm::new([]))
        .agent(agent)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    host.set(session.clone()).unwrap();
    bounded(
        "the handoff",
        session.update_agent(Agent::builder("second").build().unwrap()),
    )
    .await
    .unwrap();
    assert!(
        seen.get().unwrap().contains("WouldDeadlock"),
        "{:?}",
        seen.get()
    );
    session.close().await.unwrap();
}
