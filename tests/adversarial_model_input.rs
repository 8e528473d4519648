//! SPEC §2a: a model cannot make the engine loop, flood it, or break the one-output
//! invariant. Calls in a reply requested with `tool_choice = none` do not run; a step
//! holds at most a configured number of calls; oversized arguments are refused unparsed;
//! error texts quote only a short prefix of the model's input; call ids stay unique,
//! derived ones included, however the model reuses or forges them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::{assert_invariant, output, Query};
use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{Gate, Reply, ScriptedLlm};
use switchboard::{ChatContext, ToolChoice};

/// An async tool: answers with an update, then returns once `finish` is open; counts its
/// runs.
fn progress(runs: Arc<AtomicUsize>, finish: Gate) -> Tool {
    Tool::new(
        "progress",
        "Reports progress",
        move |ctx: RunContext, _: Query| {
            let (runs, finish) = (runs.clone(), finish.clone());
            async move {
                runs.fetch_add(1, Ordering::Relaxed);
                ctx.update("working on it").await?;
                finish.wait().await;
                Ok::<_, ToolFailure>("finished")
            }
        },
    )
}

/// A gate already open: the tool finishes right after its update.
fn open_gate() -> Gate {
    let gate = Gate::new();
    gate.open();
    gate
}

fn call_ids(chat: &ChatContext) -> Vec<String> {
    chat.items()
        .iter()
        .filter_map(|item| match item {
            ChatItem::FunctionCall(c) => Some(c.call_id.clone()),
            _ => None,
        })
        .collect()
}

#[actix::test]
async fn calls_in_a_reply_that_allows_no_tools_do_not_run_and_nothing_loops() {
    let runs = Arc::new(AtomicUsize::new(0));
    let finish = Gate::new();
    let llm = ScriptedLlm::new([
        Reply::tool_call("progress", json!({"q": "a"})),
        Reply::text("Started."),
    ]);
    // Every later request — the deferred reply to `/finished` among them — calls the
    // async tool again, ignoring `tool_choice = none`.
    llm.otherwise(Reply::tool_call("progress", json!({"q": "again"})));
    let session = Session::builder()
        .llm(llm.clone())
        .agent(
            Agent::builder("agent")
                .tool(progress(runs.clone(), finish.clone()))
                .build()
                .unwrap(),
        )
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("start").await.unwrap();
    // Finished after the turn's reply, so that `/finished` asks for a deferred reply of
    // its own (had it landed before the second step, "Started." would answer it).
    finish.open();
    common::settled(&session).await;
    assert_eq!(runs.load(Ordering::Relaxed), 1, "only the first call ran");
    let requests = llm.requests();
    assert_eq!(
        requests.len(),
        3,
        "turn, its second step, one deferred reply"
    );
    assert_eq!(requests[2].tool_choice, ToolChoice::None);
    let chat = session.chat_context().await.unwrap();
    assert_invariant(&chat);
    let refused = chat.output_of("call_2").unwrap();
    assert!(refused.is_error);
    assert_eq!(
        refused.output,
        "Error: no tool may be called in this reply; progress did not run."
    );
    session.close().await.unwrap();
}

#[actix::test]
async fn a_model_call_id_forging_a_derived_id_stays_unique() {
    let runs = Arc::new(AtomicUsize::new(0));
    let llm = ScriptedLlm::new([
        Reply::raw_tool_call("x", "progress", r#"{"q": "a"}"#),
        Reply::text("Started."),
    ]);
    llm.otherwise(Reply::text("ok"));
    let session = Session::builder()
        .llm(llm.clone())
        .agent(
            Agent::builder("agent")
                .tool(progress(runs, open_gate()))
                .build()
                .unwrap(),
        )
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("start").await.unwrap();
    common::settled(&session).await;
    // The model now sends the ids the engine derived, and `x` again.
    llm.on_request(
        llm.request_count(),
        Reply::raw_tool_call("x/finished", "progress", r#"{"q": "b"}"#)
            .and_raw_tool_call("x", "progress", r#"{"q": "c"}"#)
            .and_raw_tool_call("x~2", "progress", r#"{"q": "d"}"#),
    );
    session.run("again").await.unwrap();
    common::settled(&session).await;
    let chat = session.chat_context().await.unwrap();
    assert_invariant(&chat);
    let ids = call_ids(&chat);
    let unique: HashSet<&String> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "{ids:?}");
    for id in ["x", "x/finished", "x_finished", "x~2", "x~2~2"] {
        assert!(ids.iter().any(|i| i == id), "{id} missing from {ids:?}");
    }
    session.close().await.unwrap();
}

#[actix::test]
async fn thousands_of_calls_in_one_step_run_at_most_the_limit_and_all_get_outputs() {
    let runs = Arc::new(AtomicUsize::new(0));
    let count = {
        let runs = runs.clone();
        Tool::new("count", "Counts", move |_ctx: RunContext, _: Query| {
            let runs = runs.clone();
            async move {
                runs.fetch_add(1, Ordering::Relaxed);
                Ok::<_, ToolFailure>("counted")
            }
        })
        .on_duplicate(DuplicatePolicy::Allow)
    };
    let mut flood = Reply::default();
    for _ in 0..4_000 {
        flood = flood.and_raw_tool_call("same", "count", r#"{"q": "x"}"#);
    }
    let llm = ScriptedLlm::new([flood, Reply::text("Done counting.")]);
    let session = Session::builder()
        .llm(llm)
        .agent(Agent::builder("agent").tool(count).build().unwrap())
        .max_calls_per_step(16)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let result = session.run("count a lot").await.unwrap();
    assert_eq!(runs.load(Ordering::Relaxed), 16);
    assert_eq!(result.function_calls().count(), 4_000);
    let chat = session.chat_context().await.unwrap();
    assert_invariant(&chat);
    let ids = call_ids(&chat);
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 4_000);
    assert_eq!(output(&chat, "same"), "counted");
    let refused = chat.output_of("same~17").unwrap();
    assert!(refused.is_error);
    assert!(refused
        .output
        .contains("too many tool calls in one step (at most 16)"));
    session.close().await.unwrap();
}

#[actix::test]
async fn huge_or_malformed_arguments_are_refused_without_quoting_them() {
    let runs = Arc::new(AtomicUsize::new(0));
    let huge = format!("{{\"q\": \"{}", "A".repeat(10 * 1024 * 1024));
    let malformed = format!("{{\"q\": 12, \"junk\": \"{}", "B".repeat(40 * 1024));
    let llm = ScriptedLlm::new([
        Reply::raw_tool_call("c1", "progress", huge).and_raw_tool_call("c2", "progress", malformed),
        Reply::text("Those arguments were bad."),
    ]);
    let session = Session::builder()
        .llm(llm.clone())
        .agent(
            Agent::builder("agent")
                .tool(progress(runs.clone(), open_gate()))
                .build()
                .unwrap(),
        )
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("go").await.unwrap();
    assert_eq!(runs.load(Ordering::Relaxed), 0);
    let chat = session.chat_context().await.unwrap();
    assert_invariant(&chat);
    let too_big = chat.output_of("c1").unwrap();
    assert!(too_big.is_error);
    assert!(
        too_big.output.contains("over the limit of 65536"),
        "{}",
        too_big.output
    );
    assert!(too_big.output.len() < 300, "{} bytes", too_big.output.len());
    let bad = chat.output_of("c2").unwrap();
    assert!(bad
        .output
        .starts_with("Error parsing arguments for progress:"));
    assert!(bad.output.len() < 300, "{} bytes", bad.output.len());
    // The next request carries each argument text once, in its call.
    let next = &llm.requests()[1];
    let carried: usize = next
        .chat
        .items()
        .iter()
        .map(|item| match item {
            ChatItem::FunctionCallOutput(o) => o.output.len(),
            _ => 0,
        })
        .sum();
    assert!(carried < 600, "outputs carry {carried} bytes");
    session.close().await.unwrap();
}
