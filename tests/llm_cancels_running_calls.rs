//! SPEC §5 `allow_cancellation`: the companion tools `get_running_tasks` and
//! `cancel_task` appear (byte-identical in every request) once any visible tool allows
//! cancellation; `cancel_task` answers clearly in every case.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{assert_invariant, output, Log, Query};
use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{Reply, ScriptedLlm};

fn job(name: &'static str, cancellable: bool, log: Log) -> Tool {
    Tool::new(name, "A long job", move |ctx: RunContext, args: Query| {
        let log = log.clone();
        async move {
            ctx.update(format!("started {}", args.q)).await?;
            if ctx
                .wait_if_not_cancelled(std::future::pending::<()>())
                .await
                .is_none()
            {
                log.push(format!("{} cancelled", args.q));
            }
            Ok::<_, ToolFailure>(())
        }
    })
    .allow_cancellation(cancellable)
}

#[actix::test]
async fn the_model_lists_and_cancels_running_calls() {
    let log = Log::default();
    let agent_b = Agent::builder("agent-b").build().unwrap();
    let llm = ScriptedLlm::new([
        Reply::tool_call("export", json!({"q": "a"})).and_tool_call("audit", json!({"q": "b"})),
        Reply::text("Both started."),
        Reply::tool_call("get_running_tasks", json!({})),
        Reply::text("One job can be cancelled."),
        Reply::tool_call("cancel_task", json!({"call_id": "call_1"}))
            .and_tool_call("cancel_task", json!({"call_id": "call_2"}))
            .and_tool_call("cancel_task", json!({"call_id": "nope"})),
        Reply::text("Done."),
    ]);
    llm.otherwise(Reply::text("OK."));
    let session = Session::builder()
        .llm(llm.clone())
        .agent(
            Agent::builder("agent-a")
                .tool(job("audit", false, log.clone()))
                .build()
                .unwrap(),
        )
        .toolset(Toolset::new("jobs").tool(job("export", true, log.clone())))
        .grace_period(Duration::ZERO)
        .inspect(true)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("start both").await.unwrap();

    let listed = session.run("what is running?").await.unwrap();
    let list: serde_json::Value =
        serde_json::from_str(&listed.function_outputs().next().unwrap().output).unwrap();
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 1, "only calls the model could cancel: {list:?}");
    assert_eq!(list[0]["call_id"], "call_1");
    assert_eq!(list[0]["name"], "export");
    assert!(list[0]["age_seconds"].is_number());

    let cancelled = session.run("cancel everything").await.unwrap();
    let outs: Vec<_> = cancelled.function_outputs().cloned().collect();
    assert_eq!(outs[0].output, "Cancelled call_1.");
    assert!(!outs[0].is_error);
    assert_eq!(outs[1].output, "Error: call_2 (audit) cannot be cancelled");
    assert!(outs[1].is_error);
    assert_eq!(
        outs[2].output,
        "Error: no running call nope (unknown or already finished)"
    );
    assert!(outs[2].is_error);
    assert_eq!(log.entries(), ["a cancelled"]);
    let inspector = session.inspector().unwrap();
    inspector.assert_stopped("tool/s1/1:call_1").unwrap();
    assert!(inspector.is_alive("tool/s1/2:call_2"));

    // A second cancel of the finished call is an unknown id now.
    llm.push([
        Reply::tool_call("cancel_task", json!({"call_id": "call_1"})),
        Reply::text("Already gone."),
    ]);
    let again = session.run("cancel it again").await.unwrap();
    assert!(again
        .function_outputs()
        .next()
        .unwrap()
        .output
        .contains("unknown or already finished"));

    let chat = session.chat_context().await.unwrap();
    assert_eq!(
        output(&chat, "call_1/finished"),
        "Cancelled: cancelled by the model."
    );
    assert_invariant(&chat);

    // The companion schemas are in every request, byte-identical, also after a handoff.
    session.update_agent(agent_b).await.unwrap();
    session.run("hello b").await.unwrap();
    let companion = |r: &switchboard::LlmRequest| {
        r.tools
            .iter()
            .filter(|t| t.name == "get_running_tasks" || t.name == "cancel_task")
            .map(|t| serde_json::to_string(t).unwrap())
            .collect::<Vec<_>>()
    };
    let requests = llm.requests();
    let first = companion(&requests[0]);
    assert_eq!(first.len(), 2);
    for request in &requests {
        assert_eq!(companion(request), first, "request of {}", request.agent);
    }
    assert_eq!(&*requests.last().unwrap().agent, "agent-b");
    session.close().await.unwrap();
}

#[actix::test]
async fn no_companion_tools_when_nothing_allows_cancellation() {
    let llm = ScriptedLlm::new([Reply::text("Hi.")]);
    let session = Session::builder()
        .llm(llm.clone())
        .agent(
            Agent::builder("agent-a")
                .tool(job("audit", false, Log::default()))
                .build()
                .unwrap(),
        )
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("hi").await.unwrap();
    let names: Vec<String> = llm.requests()[0]
        .tools
        .iter()
        .map(|t| t.name.clone())
        .collect();
    assert_eq!(names, ["audit"]);
    session.close().await.unwrap();
}

#[actix::test]
async fn a_tool_named_like_a_companion_clashes_when_they_are_exposed() {
    let clash = Tool::new(
        "cancel_task",
        "Mine",
        |_ctx: RunContext, _: Query| async move { Ok::<_, ToolFailure>(()) },
    );
    let err = Session::builder()
        .llm(ScriptedLlm::new([]))
        .agent(
            Agent::builder("agent-a")
                .tool(clash)
                .tool(job("export", true, Log::default()))
                .build()
                .unwrap(),
        )
        .start(&Engine::current().unwrap())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("companion tools"), "{err}");
}
