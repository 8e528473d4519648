//! SPEC §2a: a handoff or sub-task whose agent cannot start here (a tool-name clash with a
//! session toolset) fails with that error before anything is stopped: the previous agent
//! stays current and working. `CompleteTask` from an agent that is not a sub-task is an
//! error output to the model.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{assert_invariant, output, Query};
use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{Reply, ScriptedLlm};
use switchboard::BuildError;

fn lookup() -> Tool {
    Tool::new(
        "lookup",
        "Looks things up",
        |_ctx: RunContext, _: Query| async move { Ok::<_, ToolFailure>("found") },
    )
}

/// An agent whose own `lookup` clashes with the session toolset's.
fn clashing() -> Agent {
    Agent::builder("clashing").tool(lookup()).build().unwrap()
}

async fn session_with(llm: std::sync::Arc<ScriptedLlm>, agent: Agent) -> Session {
    Session::builder()
        .llm(llm)
        .agent(agent)
        .toolset(Toolset::new("shared").tool(lookup()))
        .start(&Engine::current().unwrap())
        .await
        .unwrap()
}

#[actix::test]
async fn a_host_handoff_to_an_agent_that_cannot_start_is_refused_and_the_agent_stays() {
    let llm = ScriptedLlm::new([Reply::text("Still me.")]);
    let session = session_with(llm, Agent::builder("front").build().unwrap()).await;
    match session.update_agent(clashing()).await {
        Err(SessionError::Build(BuildError::DuplicateToolName { name, .. })) => {
            assert_eq!(name, "lookup")
        }
        other => panic!("expected a tool-name clash, got {other:?}"),
    }
    assert_eq!(session.current_agent().await.unwrap(), "front");
    let result = session.run("are you there?").await.unwrap();
    assert_eq!(
        result.assistant_messages().collect::<Vec<_>>(),
        ["Still me."]
    );
    session.close().await.unwrap();
}

#[actix::test]
async fn a_tool_that_returns_an_agent_that_cannot_start_gets_an_error_output() {
    let transfer = Tool::new(
        "transfer",
        "Hands over",
        |_ctx: RunContext, _: Query| async move { Ok::<_, ToolFailure>(clashing()) },
    );
    let llm = ScriptedLlm::new([
        Reply::tool_call("transfer", json!({"q": "x"})),
        Reply::text("I could not transfer you."),
    ]);
    let session = session_with(llm, Agent::builder("front").tool(transfer).build().unwrap()).await;
    let result = session.run("transfer me").await.unwrap();
    assert!(result.handoff().is_none());
    assert_eq!(
        result.assistant_messages().collect::<Vec<_>>(),
        ["I could not transfer you."]
    );
    let chat = session.chat_context().await.unwrap();
    let out = output(&chat, "call_1");
    assert!(
        out.starts_with("Error: cannot hand off to clashing:"),
        "{out}"
    );
    assert!(chat.output_of("call_1").unwrap().is_error);
    assert_invariant(&chat);
    assert_eq!(session.current_agent().await.unwrap(), "front");
    session.close().await.unwrap();
}

#[actix::test]
async fn a_handoff_a_tool_queues_is_refused_to_the_tool() {
    let transfer = Tool::new(
        "transfer",
        "Hands over",
        |ctx: RunContext, _: Query| async move {
            match ctx.session().update_agent(clashing()).await {
                Ok(()) => Ok::<_, ToolFailure>("transferring".to_owned()),
                Err(err) => Ok(format!("refused: {err}")),
            }
        },
    );
    let llm = ScriptedLlm::new([
        Reply::tool_call("transfer", json!({"q": "x"})),
        Reply::text("No."),
    ]);
    let session = session_with(llm, Agent::builder("front").tool(transfer).build().unwrap()).await;
    session.run("transfer me").await.unwrap();
    let chat = session.chat_context().await.unwrap();
    assert!(output(&chat, "call_1").starts_with("refused: tool name \"lookup\" is used twice"));
    assert_eq!(session.current_agent().await.unwrap(), "front");
    session.close().await.unwrap();
}

#[actix::test]
async fn a_sub_task_that_cannot_start_fails_its_caller_which_stays_current() {
    let ask = Tool::new(
        "survey",
        "Runs a survey",
        |ctx: RunContext, _: Query| async move {
            match ctx.run_task::<String>(clashing()).await {
                Ok(answer) => Ok::<_, ToolFailure>(answer),
                Err(SessionError::Build(err)) => Ok(format!("no survey: {err}")),
                Err(other) => Err(other.into()),
            }
        },
    );
    let llm = ScriptedLlm::new([
        Reply::tool_call("survey", json!({"q": "x"})),
        Reply::text("The survey is not available."),
    ]);
    let session = session_with(llm, Agent::builder("front").tool(ask).build().unwrap()).await;
    let result = session.run("survey me").await.unwrap();
    assert_eq!(
        result.assistant_messages().collect::<Vec<_>>(),
        ["The survey is not available."]
    );
    let chat = session.chat_context().await.unwrap();
    assert!(output(&chat, "call_1").starts_with("no survey:"));
    assert_eq!(session.current_agent().await.unwrap(), "front");
    session.close().await.unwrap();
}

#[actix::test]
async fn completing_a_task_outside_a_sub_task_is_an_error_output_and_the_agent_stays() {
    let finish = Tool::new(
        "finish",
        "Completes the task",
        |_ctx: RunContext, _: Query| async move { ToolReturn::complete_task(&"done") },
    );
    let llm = ScriptedLlm::new([
        Reply::tool_call("finish", json!({"q": "x"})),
        Reply::text("There was no task."),
        Reply::text("Still here."),
    ]);
    let session = Session::builder()
        .llm(llm)
        .agent(Agent::builder("main").tool(finish).build().unwrap())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("finish it").await.unwrap();
    let chat = session.chat_context().await.unwrap();
    let out = chat.output_of("call_1").unwrap();
    assert!(out.is_error);
    assert!(
        out.output.contains("not running as a sub-task"),
        "{}",
        out.output
    );
    let result = session.run("hello?").await.unwrap();
    assert_eq!(
        result.assistant_messages().collect::<Vec<_>>(),
        ["Still here."]
    );
    assert_eq!(session.current_agent().await.unwrap(), "main");
    session.close().await.unwrap();
}

#[actix::test]
async fn a_clash_with_the_session_names_the_agent_that_owns_the_toolset() {
    let llm = ScriptedLlm::new([]);
    let session = session_with(llm, Agent::builder("front").build().unwrap()).await;
    let concierge = Agent::builder("concierge")
        .toolset(Toolset::new("booking").tool(lookup()))
        .build()
        .unwrap();
    let error = session.update_agent(concierge).await.unwrap_err();
    assert_eq!(
        error.to_string(),
        "tool name \"lookup\" is used twice: by toolset booking of agent concierge and by \
         session toolset shared"
    );
    session.close().await.unwrap();
}
