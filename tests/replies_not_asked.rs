//! Output the model should read without answering it: `ctx.update_no_reply(..)` (an update
//! that asks for no reply) and `ToolReturn::NoReply` (a result kept in the chat with no
//! step on its account), as LiveKit's `ctx.update(msg, silent=True)` and
//! `ToolResult(output, reply_required=False)`. Each lands in the chat context; the model
//! reads it with the next request that is made for another reason.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{assert_invariant, wait_on, Query};
use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{event, Gate, Reply, ScriptedLlm};
use switchboard::ToolChoice;

const BOUND: std::time::Duration = std::time::Duration::from_secs(10);

async fn start(tools: Vec<Tool>, llm: std::sync::Arc<ScriptedLlm>) -> Session {
    let mut agent = Agent::builder("notes");
    for tool in tools {
        agent = agent.tool(tool);
    }
    Session::builder()
        .llm(llm)
        .agent(agent.build().unwrap())
        .start(&Engine::current().unwrap())
        .await
        .unwrap()
}

/// Whether the `n`-th request (from 0) carried an output for `call_id` containing `text`.
fn request_has_output(llm: &ScriptedLlm, n: usize, call_id: &str, text: &str) -> bool {
    llm.requests()[n]
        .chat
        .output_of(call_id)
        .is_some_and(|out| out.output.contains(text))
}

#[actix::test]
async fn a_silent_later_update_lands_without_a_reply_and_the_next_reply_reads_it() {
    let (first, second) = (Gate::new(), Gate::new());
    let (landed_tx, mut landed) = tokio::sync::mpsc::unbounded_channel();
    let tool = {
        let (first, second) = (first.clone(), second.clone());
        Tool::new("check", "Checks", move |ctx: RunContext, _: Query| {
            let (first, second, landed) = (first.clone(), second.clone(), landed_tx.clone());
            async move {
                ctx.update("checking").await?;
                first.wait().await;
                ctx.update_no_reply("half way").await?;
                let _ = landed.send(());
                second.wait().await;
                Ok::<_, ToolFailure>("all good")
            }
        })
    };
    let llm = ScriptedLlm::new([
        Reply::tool_call("check", json!({"q": "x"})),
        Reply::text("Checking."),
        Reply::text("All good."),
    ]);
    let session = start(vec![tool], llm.clone()).await;
    let mut events = session.subscribe();
    session.run("check it").await.unwrap();
    assert_eq!(llm.request_count(), 2);

    first.open();
    // The update resolves once it is in the chat; a reply it asked for would be pending by
    // then (the session schedules it before it answers the update).
    tokio::time::timeout(BOUND, landed.recv())
        .await
        .expect("the silent update did not resolve");
    assert!(session.is_inactive(), "a reply was scheduled for it");
    let chat = session.chat_context().await.unwrap();
    assert!(chat
        .output_of("call_1/update_1")
        .is_some_and(|out| out.output.contains("half way")));
    assert_eq!(llm.request_count(), 2, "no reply asked for a silent update");

    second.open();
    wait_on(&mut events, event::output_added("call_1/finished")).await;
    common::settled(&session).await;
    assert_eq!(llm.request_count(), 3, "one deferred reply, for the result");
    let reply = &llm.requests()[2];
    assert_eq!(reply.tool_choice, ToolChoice::None);
    assert!(request_has_output(&llm, 2, "call_1/update_1", "half way"));
    assert!(request_has_output(&llm, 2, "call_1/finished", "all good"));
    assert_invariant(&session.chat_context().await.unwrap());
    session.close().await.unwrap();
}

#[actix::test]
async fn a_silent_first_update_is_the_output_and_asks_for_no_step() {
    let gate = Gate::new();
    let tool = {
        let gate = gate.clone();
        Tool::new("send", "Sends", move |ctx: RunContext, _: Query| {
            let gate = gate.clone();
            async move {
                ctx.update_no_reply("queued").await?;
                gate.wait().await;
                Ok::<_, ToolFailure>("delivered")
            }
        })
    };
    let llm = ScriptedLlm::new([
        Reply::tool_call("send", json!({"q": "x"})),
        Reply::text("It was delivered."),
    ]);
    let session = start(vec![tool], llm.clone()).await;
    let mut events = session.subscribe();
    let result = session.run("send it").await.unwrap();
    assert_eq!(llm.request_count(), 1, "the step asked for nothing more");
    assert!(result
        .function_outputs()
        .any(|out| out.call_id == "call_1" && out.output.contains("queued")));

    gate.open();
    wait_on(&mut events, event::output_added("call_1/finished")).await;
    common::settled(&session).await;
    assert_eq!(llm.request_count(), 2, "the result still gets its reply");
    assert!(request_has_output(&llm, 1, "call_1", "queued"));
    session.close().await.unwrap();
}

#[actix::test]
async fn a_no_reply_result_is_kept_and_asks_for_no_step_unless_another_call_does() {
    let save = Tool::new("save", "Saves a note", |_ctx: RunContext, _: Query| async {
        Ok::<_, ToolFailure>(ToolReturn::no_reply("saved to your notes"))
    });
    let lookup = Tool::new("lookup", "Looks up", |_ctx: RunContext, _: Query| async {
        Ok::<_, ToolFailure>("3 notes")
    });
    let llm = ScriptedLlm::new([
        Reply::tool_call("save", json!({"q": "milk"})),
        Reply::tool_call("save", json!({"q": "eggs"})).and_tool_call("lookup", json!({"q": "*"})),
        Reply::text("Saved; you have 3 notes."),
    ]);
    let session = start(vec![save, lookup], llm.clone()).await;

    let quiet = session.run("note milk").await.unwrap();
    assert_eq!(llm.request_count(), 1, "no step for a no-reply result");
    assert_eq!(quiet.assistant_messages().count(), 0);
    let chat = session.chat_context().await.unwrap();
    assert_eq!(
        chat.output_of("call_1").unwrap().output,
        "saved to your notes"
    );

    // With a call that wants a reply, the step runs; the model reads both outputs.
    session.run("note eggs, how many?").await.unwrap();
    assert_eq!(llm.request_count(), 3);
    assert!(request_has_output(&llm, 2, "call_2", "saved to your notes"));
    assert!(request_has_output(&llm, 2, "call_3", "3 notes"));
    assert!(request_has_output(&llm, 1, "call_1", "saved to your notes"));
    common::settled(&session).await;
    assert_eq!(llm.request_count(), 3, "and no deferred reply");
    assert_invariant(&session.chat_context().await.unwrap());
    session.close().await.unwrap();
}

#[actix::test]
async fn a_no_reply_result_after_an_update_schedules_no_deferred_reply() {
    let gate = Gate::new();
    let tool = {
        let gate = gate.clone();
        Tool::new("archive", "Archives", move |ctx: RunContext, _: Query| {
            let gate = gate.clone();
            async move {
                ctx.update("archiving").await?;
                gate.wait().await;
                Ok::<_, ToolFailure>(ToolReturn::no_reply("archived 12 files"))
            }
        })
    };
    let llm = ScriptedLlm::new([
        Reply::tool_call("archive", json!({"q": "x"})),
        Reply::text("Archiving now."),
    ]);
    let session = start(vec![tool], llm.clone()).await;
    let mut events = session.subscribe();
    session.run("archive it").await.unwrap();
    gate.open();
    wait_on(&mut events, event::output_added("call_1/finished")).await;
    common::settled(&session).await;
    assert_eq!(llm.request_count(), 2, "the result asked for no reply");
    let chat = session.chat_context().await.unwrap();
    assert_eq!(
        chat.output_of("call_1/finished").unwrap().output,
        "archived 12 files"
    );
    assert_invariant(&chat);
    session.close().await.unwrap();
}
