//! SPEC §4: `run_task` pauses the calling agent (its other agent-scoped runs stop), runs
//! a sub-task agent to a typed result, then resumes the caller, whose awaiting tool call
//! produces its output.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{assert_invariant, output, spawn_turn, wait_started, DropGuard, Log, Query};
use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{Reply, ScriptedLlm};
use switchboard::{NoArgs, ToolChoice};

#[derive(Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
struct Contact {
    email: String,
}

#[actix::test]
async fn a_sub_task_pauses_the_caller_and_resumes_it_with_a_typed_result() {
    tokio::time::pause();
    let log = Log::default();
    let save = Tool::new(
        "save_email",
        "Saves the email",
        |_ctx: RunContext, args: Contact| async move { ToolReturn::complete_task(&args) },
    );
    let collector = Agent::builder("collector")
        .instructions("Ask for the email.")
        .tool(save)
        .build()
        .unwrap();
    let c = collector.clone();
    let ask_email = Tool::new(
        "ask_email",
        "Collects an email",
        move |ctx: RunContext, _: NoArgs| {
            let c = c.clone();
            async move {
                let contact: Contact = ctx.run_task(c).await?;
                Ok::<_, ToolFailure>(format!("email is {}", contact.email))
            }
        },
    );
    let l = log.clone();
    let sibling = Tool::new("watch", "Watches", move |ctx: RunContext, _: Query| {
        let l = l.clone();
        async move {
            let _guard = DropGuard(l, "sibling dropped");
            ctx.update("watching").await?;
            std::future::pending::<()>().await;
            Ok::<_, ToolFailure>(())
        }
    });
    let main = Agent::builder("main")
        .tool(ask_email)
        .tool(sibling)
        .build()
        .unwrap();
    let llm = ScriptedLlm::new([
        // main: start the watcher
        Reply::tool_call("watch", json!({"q": "x"})),
        Reply::text("Watching."),
        // main: collect the email (pauses main)
        Reply::tool_call("ask_email", json!({})),
        // collector: on the user's next turn, saves it
        Reply::tool_call("save_email", json!({"email": "a@b.c"})),
        // main, resumed: answers with the result
        Reply::text("Thanks, got a@b.c."),
    ]);
    let session = Session::builder()
        .llm(llm.clone())
        .agent(main)
        .inspect(true)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("watch").await.unwrap();
    let main_turn = spawn_turn(&session, "take my email");
    let inspector = session.inspector().unwrap();
    wait_started(&inspector, "activity/s1/collector#1").await;
    session.wait_for_inactive().await;
    assert_eq!(session.current_agent().await.unwrap(), "collector");
    // Pausing stopped main's other agent-scoped run, but not the one awaiting the task.
    assert_eq!(log.entries(), ["sibling dropped"]);
    inspector.assert_stopped("tool/s1/1:call_1").unwrap();
    assert!(inspector.is_alive("tool/s1/2:call_2"));

    let task_turn = session.run("it is a@b.c").await.unwrap();
    assert_eq!(
        task_turn.function_calls().next().unwrap().name,
        "save_email"
    );
    let resumed = main_turn.await.unwrap().unwrap();
    assert_eq!(
        resumed.assistant_messages().collect::<Vec<_>>(),
        ["Thanks, got a@b.c."]
    );
    assert_eq!(session.current_agent().await.unwrap(), "main");
    inspector.assert_stopped("activity/s1/collector#1").unwrap();
    let chat = session.chat_context().await.unwrap();
    assert_eq!(output(&chat, "call_2"), "email is a@b.c");
    assert!(chat
        .output_of("call_1/finished")
        .unwrap()
        .output
        .contains("paused"));
    assert_invariant(&chat);
    // The collector's request was its own: its tools, its context.
    let collector_req = &llm.requests()[3];
    assert_eq!(&*collector_req.agent, "collector");
    assert_eq!(collector_req.tool_choice, ToolChoice::Auto);
    assert!(collector_req.tools.iter().any(|t| t.name == "save_email"));
    assert!(!collector_req.tools.iter().any(|t| t.name == "ask_email"));
    session.close().await.unwrap();
}

#[actix::test]
async fn closing_during_a_sub_task_fails_the_awaiting_tool_cleanly() {
    let collector = Agent::builder("collector").build().unwrap();
    let c = collector.clone();
    let ask = Tool::new("ask", "Asks", move |ctx: RunContext, _: NoArgs| {
        let c = c.clone();
        async move {
            let value: serde_json::Value = ctx.run_task(c).await?;
            Ok::<_, ToolFailure>(value)
        }
    });
    let llm = ScriptedLlm::new([Reply::tool_call("ask", json!({}))]);
    let session = Session::builder()
        .llm(llm)
        .agent(Agent::builder("main").tool(ask).build().unwrap())
        .inspect(true)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let turn = spawn_turn(&session, "go");
    let inspector = session.inspector().unwrap();
    wait_started(&inspector, "activity/s1/collector#1").await;
    session.close().await.unwrap();
    assert!(turn.await.unwrap().is_err());
    assert!(
        inspector.live_actors().is_empty(),
        "{:?}",
        inspector.live_actors()
    );
}

#[actix::test]
async fn a_task_tool_that_updates_first_still_completes_the_task() {
    let save = Tool::new(
        "save_email",
        "Saves the email",
        |ctx: RunContext, args: Contact| async move {
            ctx.update("saving").await?;
            ToolReturn::complete_task(&args)
        },
    );
    let collector = Agent::builder("collector").tool(save).build().unwrap();
    let c = collector.clone();
    let ask_email = Tool::new(
        "ask_email",
        "Collects an email",
        move |ctx: RunContext, _: NoArgs| {
            let c = c.clone();
            async move {
                let contact: Contact = ctx.run_task(c).await?;
                Ok::<_, ToolFailure>(format!("email is {}", contact.email))
            }
        },
    );
    let llm = ScriptedLlm::new([
        Reply::tool_call("ask_email", json!({})),
        Reply::tool_call("save_email", json!({"email": "x@y.z"})),
        Reply::text("Saving your email."),
        Reply::text("Thanks, got x@y.z."),
    ]);
    let session = Session::builder()
        .llm(llm.clone())
        .agent(Agent::builder("main").tool(ask_email).build().unwrap())
        .inspect(true)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let main_turn = spawn_turn(&session, "take my email");
    session
        .inspector()
        .unwrap()
        .wait_for(
            "activity/s1/collector#1",
            "StartActivity",
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    session.run("x@y.z").await.unwrap();
    let resumed = main_turn.await.unwrap().unwrap();
    assert_eq!(
        resumed.assistant_messages().collect::<Vec<_>>(),
        ["Thanks, got x@y.z."]
    );
    assert_eq!(session.current_agent().await.unwrap(), "main");
    assert_eq!(llm.request_count(), 4);
    assert_invariant(&session.chat_context().await.unwrap());
    session.close().await.unwrap();
}

/// Two calls of one step each ask for a sub-task: the first one's pause stops the second
/// call's run, so the sub-task that run asked for never starts — it would run for nobody,
/// on top of the first, its result lost.
#[actix::test]
async fn of_two_calls_of_one_step_asking_for_sub_tasks_only_the_first_task_starts() {
    tokio::time::pause();
    let save = Tool::new(
        "save_email",
        "Saves the email",
        |_ctx: RunContext, args: Contact| async move { ToolReturn::complete_task(&args) },
    );
    let collector = Agent::builder("collector").tool(save).build().unwrap();
    let c = collector.clone();
    let ask_email = Tool::new(
        "ask_email",
        "Collects an email",
        move |ctx: RunContext, _: NoArgs| {
            let c = c.clone();
            async move {
                let contact: Contact = ctx.run_task(c).await?;
                Ok::<_, ToolFailure>(format!("email is {}", contact.email))
            }
        },
    );
    let main = Agent::builder("main").tool(ask_email).build().unwrap();
    let llm = ScriptedLlm::new([
        Reply::tool_call("ask_email", json!({})).and_tool_call("ask_email", json!({})),
        Reply::tool_call("save_email", json!({"email": "a@b.c"})),
        Reply::text("Thanks."),
    ]);
    let session = Session::builder()
        .llm(llm.clone())
        .agent(main)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let main_turn = spawn_turn(&session, "take my email");
    // Inactive once the collector listens: the pause waited for the stopped run, and a
    // sub-task that run asked for would have started on top by then.
    session.wait_for_inactive().await;
    assert_eq!(session.current_agent().await.unwrap(), "collector");
    session.run("it is a@b.c").await.unwrap();
    main_turn.await.unwrap().unwrap();
    assert_eq!(session.current_agent().await.unwrap(), "main");
    let chat = session.chat_context().await.unwrap();
    assert_eq!(output(&chat, "call_1"), "email is a@b.c");
    assert!(output(&chat, "call_2").contains("paused"));
    assert_invariant(&chat);
    let history = session.close().await.unwrap();
    assert_eq!(history.activations_of("collector").count(), 1);
    assert_eq!(llm.requests().len(), 3);
}
