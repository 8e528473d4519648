//! SPEC §8: the engine runs inside a plain `#[tokio::main]` program on its own actix
//! threads; handles are `Send` and cross into the engine once per operation.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{assert_invariant, Query};
use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{Reply, ScriptedLlm};
use switchboard::EngineError;

fn search() -> Tool {
    Tool::new(
        "search",
        "Searches",
        |ctx: RunContext, args: Query| async move {
            ctx.update(format!("searching {}", args.q)).await?;
            Ok::<_, ToolFailure>(format!("found {}", args.q))
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_run_on_engine_threads_from_a_tokio_host() {
    let engine = Engine::with_arbiters(2).unwrap();
    assert_eq!(engine.arbiters(), 2);
    let llm = ScriptedLlm::new([]);
    llm.rule(|req| {
        let last_user = req.chat.items().iter().rev().find_map(|i| match i {
            ChatItem::Message(m) if m.role == ChatRole::User => Some(m.content.clone()),
            _ => None,
        })?;
        // First step of a turn: call the tool; afterwards: answer.
        let answered = !matches!(
            req.chat.items().last(),
            Some(ChatItem::Message(m)) if m.role == ChatRole::User
        );
        Some(if answered {
            Reply::text("done")
        } else {
            Reply::tool_call("search", json!({"q": last_user}))
        })
    });
    llm.otherwise(Reply::text("done"));
    // Several sessions at once, from tasks on the host's worker threads.
    let mut tasks = Vec::new();
    for n in 0..4 {
        let engine = engine.clone();
        let llm = llm.clone();
        tasks.push(tokio::spawn(async move {
            let agent = Agent::builder("agent-a").tool(search()).build().unwrap();
            let session = Session::builder()
                .llm(llm)
                .agent(agent)
                .start(&engine)
                .await
                .unwrap();
            let result = session.run(format!("q{n}")).await.unwrap();
            // The model's one call (its `/update_n` and `/finished` pairs may land
            // within the turn too: the tool finishes at once).
            let model_calls = result
                .function_calls()
                .filter(|c| !c.call_id.contains('/'))
                .count();
            assert_eq!(model_calls, 1);
            common::settled(&session).await;
            let chat = session.chat_context().await.unwrap();
            assert_invariant(&chat);
            assert!(chat.outputs().any(|o| o.call_id.ends_with("/finished")));
            let id = session.id().to_string();
            session.close().await.unwrap();
            id
        }));
    }
    let mut ids = Vec::new();
    for task in tasks {
        ids.push(task.await.unwrap());
    }
    ids.sort();
    assert_eq!(ids, ["s1", "s2", "s3", "s4"]);
    engine.shutdown();
}

#[test]
fn engine_current_outside_actix_is_a_clear_error() {
    let err = Engine::current().unwrap_err();
    assert!(err.to_string().contains("Engine::start()"), "{err}");
}

/// After `shutdown`, starting a session is a clear error, not a handle to nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_started_after_shutdown_is_a_clear_error() {
    let engine = Engine::with_arbiters(1).unwrap();
    engine.shutdown();
    let agent = Agent::builder("agent-a").build().unwrap();
    let err = Session::builder()
        .llm(ScriptedLlm::new([]))
        .agent(agent)
        .start(&engine)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, SessionError::Engine(EngineError::ShutDown)),
        "{err}"
    );
}
