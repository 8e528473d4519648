//! SPEC §5 `on_duplicate`: what happens when the model calls a tool while an earlier call
//! of it still runs in the same toolset.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{assert_invariant, output, Query};
use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{Reply, ScriptedLlm};
use switchboard::CONFIRM_DUPLICATE_PARAM;

/// A tool that answers with an update and then runs until cancelled; counts bodies run.
fn long_running(name: &'static str, runs: Arc<AtomicUsize>) -> Tool {
    Tool::new(name, "Runs a while", move |ctx: RunContext, args: Query| {
        let runs = runs.clone();
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            ctx.update(format!("started {}", args.q)).await?;
            ctx.cancelled().await;
            Ok::<_, ToolFailure>(())
        }
    })
}

async fn start(agent: Agent, toolsets: Vec<Toolset>, llm: Arc<ScriptedLlm>) -> Session {
    let mut builder = Session::builder()
        .llm(llm)
        .agent(agent)
        .grace_period(Duration::ZERO);
    for ts in toolsets {
        builder = builder.toolset(ts);
    }
    builder.start(&Engine::current().unwrap()).await.unwrap()
}

fn two_turns(tool: &str) -> Arc<ScriptedLlm> {
    let llm = ScriptedLlm::new([
        Reply::tool_call(tool, json!({"q": "a"})),
        Reply::text("Started."),
        Reply::tool_call(tool, json!({"q": "b"})),
    ]);
    llm.otherwise(Reply::text("OK."));
    llm
}

#[actix::test]
async fn bare_tools_reject_a_duplicate_by_default() {
    let runs = Arc::new(AtomicUsize::new(0));
    let agent = Agent::builder("agent-a")
        .tool(long_running("watch", runs.clone()))
        .build()
        .unwrap();
    let session = start(agent, vec![], two_turns("watch")).await;
    session.run("watch a").await.unwrap();
    let second = session.run("watch b").await.unwrap();
    let out = second.function_outputs().next().unwrap();
    assert!(!out.is_error, "a duplicate answer is a plain output");
    assert!(out
        .output
        .starts_with("watch is already running; not started again."));
    assert!(
        out.output.contains(r#""call_id":"call_1""#),
        "{}",
        out.output
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_invariant(&session.chat_context().await.unwrap());
    session.close().await.unwrap();
}

#[actix::test]
async fn named_toolsets_ask_for_confirmation_and_a_confirmed_duplicate_runs() {
    let runs = Arc::new(AtomicUsize::new(0));
    let toolset = Toolset::new("jobs").tool(long_running("export", runs.clone()));
    let llm = ScriptedLlm::new([
        Reply::tool_call("export", json!({"q": "a"})),
        Reply::text("Exporting."),
        Reply::tool_call("export", json!({"q": "b"})),
        Reply::text("It is already running; run it again?"),
        Reply::tool_call("export", json!({"q": "b", "confirm_duplicate": true})),
    ]);
    llm.otherwise(Reply::text("OK."));
    let session = start(
        Agent::builder("agent-a").build().unwrap(),
        vec![toolset],
        llm.clone(),
    )
    .await;
    session.run("export a").await.unwrap();
    // The schema the model sees carries the confirm parameter.
    let schema = llm.requests()[0]
        .tools
        .iter()
        .find(|t| t.name == "export")
        .unwrap()
        .parameters
        .clone();
    assert_eq!(
        schema["properties"][CONFIRM_DUPLICATE_PARAM]["type"],
        "boolean"
    );

    let asked = session.run("export b").await.unwrap();
    let out = asked.function_outputs().next().unwrap();
    assert!(
        out.output.contains("confirm_duplicate=true"),
        "{}",
        out.output
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let confirmed = session.run("yes, again").await.unwrap();
    let out = confirmed.function_outputs().next().unwrap();
    assert_eq!(out.output, "Update from export: started b");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the confirmed duplicate ran"
    );
    session.close().await.unwrap();
}

#[actix::test]
async fn allow_runs_both_and_calls_of_one_step_are_never_duplicates() {
    let runs = Arc::new(AtomicUsize::new(0));
    let agent = Agent::builder("agent-a")
        .tool(long_running("watch", runs.clone()).on_duplicate(DuplicatePolicy::Reject))
        .tool(long_running("poll", runs.clone()).on_duplicate(DuplicatePolicy::Allow))
        .build()
        .unwrap();
    let llm = ScriptedLlm::new([
        // Same step: both `watch` calls run although `watch` rejects duplicates.
        Reply::tool_call("watch", json!({"q": "paris"}))
            .and_tool_call("watch", json!({"q": "london"})),
        Reply::text("Watching both."),
        Reply::tool_call("poll", json!({"q": "1"})),
        Reply::text("Polling."),
        Reply::tool_call("poll", json!({"q": "2"})),
    ]);
    llm.otherwise(Reply::text("OK."));
    let session = start(agent, vec![], llm).await;
    let first = session.run("watch both").await.unwrap();
    assert!(first
        .function_outputs()
        .all(|o| o.output.starts_with("Update from watch")));
    session.run("poll").await.unwrap();
    let again = session.run("poll again").await.unwrap();
    assert_eq!(
        again.function_outputs().next().unwrap().output,
        "Update from poll: started 2"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 4);
    session.close().await.unwrap();
}

#[actix::test]
async fn replace_cancels_the_running_call_which_still_gets_its_output() {
    let runs = Arc::new(AtomicUsize::new(0));
    let agent = Agent::builder("agent-a")
        .tool(long_running("watch", runs.clone()).on_duplicate(DuplicatePolicy::Replace))
        .build()
        .unwrap();
    let session = Session::builder()
        .llm(two_turns("watch"))
        .agent(agent)
        .grace_period(Duration::ZERO)
        .inspect(true)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("watch a").await.unwrap();
    let second = session.run("watch b").await.unwrap();
    assert_eq!(
        second.function_outputs().next().unwrap().output,
        "Update from watch: started b"
    );
    let inspector = session.inspector().unwrap();
    inspector.assert_stopped("tool/s1/1:call_1").unwrap();
    assert!(inspector.is_alive("tool/s1/2:call_2"));
    let chat = session.chat_context().await.unwrap();
    assert_eq!(
        output(&chat, "call_1/finished"),
        "Cancelled: replaced by a newer call."
    );
    assert_invariant(&chat);
    session.close().await.unwrap();
}

#[actix::test]
async fn a_malformed_replace_call_cancels_nothing() {
    let runs = Arc::new(AtomicUsize::new(0));
    let agent = Agent::builder("agent-a")
        .tool(long_running("watch", runs.clone()).on_duplicate(DuplicatePolicy::Replace))
        .build()
        .unwrap();
    let llm = ScriptedLlm::new([
        Reply::tool_call("watch", json!({"q": "a"})),
        Reply::text("Started."),
        Reply::raw_tool_call("bad", "watch", r#"{"query": 1}"#),
    ]);
    llm.otherwise(Reply::text("OK."));
    let session = Session::builder()
        .llm(llm)
        .agent(agent)
        .inspect(true)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("watch").await.unwrap();
    let bad = session.run("again").await.unwrap();
    assert!(bad
        .function_outputs()
        .next()
        .unwrap()
        .output
        .starts_with("Error parsing arguments for watch"));
    assert!(session.inspector().unwrap().is_alive("tool/s1/1:call_1"));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    session.close().await.unwrap();
}

#[actix::test]
async fn a_running_call_in_another_toolset_is_no_duplicate() {
    let runs = Arc::new(AtomicUsize::new(0));
    let agent = Agent::builder("agent-a")
        .tool(long_running("watch", runs.clone()))
        .build()
        .unwrap();
    let other = Toolset::new("others").tool(long_running("export", runs.clone()));
    let llm = ScriptedLlm::new([
        Reply::tool_call("export", json!({"q": "a"})),
        Reply::text("Exporting."),
        Reply::tool_call("watch", json!({"q": "b"})),
    ]);
    llm.otherwise(Reply::text("OK."));
    let session = start(agent, vec![other], llm).await;
    session.run("export").await.unwrap();
    let watch = session.run("watch").await.unwrap();
    assert_eq!(
        watch.function_outputs().next().unwrap().output,
        "Update from watch: started b"
    );
    session.close().await.unwrap();
}

#[test]
fn a_confirm_tool_with_its_own_confirm_duplicate_argument_is_a_build_error() {
    #[derive(serde::Deserialize, schemars::JsonSchema)]
    #[allow(dead_code)]
    struct Clashing {
        confirm_duplicate: bool,
    }
    let tool = Tool::new(
        "clash",
        "Clashes",
        |_ctx: RunContext, _: Clashing| async move { Ok::<_, ToolFailure>(()) },
    );
    let err = Agent::builder("agent-a")
        .toolset(Toolset::new("jobs").tool(tool.clone()))
        .build()
        .unwrap_err();
    assert_eq!(
        err,
        BuildError::ConfirmParameterClash {
            tool: "clash".into()
        }
    );
    // Under `reject` (bare tools' default) the name is the tool's own business.
    assert!(Agent::builder("agent-a").tool(tool).build().is_ok());
}

#[test]
#[allow(deprecated)]
fn a_toolset_wide_policy_only_fills_in_tools_that_set_none() {
    let runs = Arc::new(AtomicUsize::new(0));
    let toolset = Toolset::new("jobs")
        .tool(long_running("a", runs.clone()))
        .tool(long_running("b", runs).on_duplicate(DuplicatePolicy::Allow))
        .on_duplicate(DuplicatePolicy::Reject);
    // Neither tool gets a confirm parameter: `a` takes the toolset's reject, `b` keeps allow.
    assert_eq!(
        toolset.tools()[1].duplicate_policy(),
        Some(DuplicatePolicy::Allow)
    );
    assert_eq!(toolset.tools()[0].duplicate_policy(), None);
}
use switchboard::BuildError;
