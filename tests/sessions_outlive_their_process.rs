//! SPEC §14: a session written down with `snapshot()` and started again with
//! `SessionBuilder::restore` goes on as if nothing happened — its conversation, agents, ids
//! and queued work — and each tool call that was running follows its tool's
//! `RestorePolicy`, with exactly one terminal output across any number of restores.
//!
//! Each test runs the first half of a conversation, snapshots it, closes the session (as a
//! process that died would lose it: its tools are stopped), restores the snapshot and
//! checks the second half: what the model is asked, what the chat holds, which ids come
//! next.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{assert_invariant, call_ids, output, wait_on, Query};
use serde_json::json;
use switchboard::prelude::*;
use switchboard::snapshot::{AgentRegistry, SessionSnapshot};
use switchboard::testing::{event, Gate, HeldRequest, Reply, ScriptedLlm};
use switchboard::{LlmRequest, RestorePolicy};

/// A tool that answers the step with an update, saves a checkpoint, waits for `gate`
/// and returns. A restarted body says so in its update (opening `updated` once it went
/// out) and its result.
fn search(gate: Gate, runs: Arc<AtomicU32>, policy: RestorePolicy, updated: Gate) -> Tool {
    Tool::new("search", "Searches", move |ctx: RunContext, args: Query| {
        let (gate, runs, updated) = (gate.clone(), runs.clone(), updated.clone());
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            if ctx.is_restored() {
                // A restarted body starts over; it sees the checkpoint it saved too.
                let at: Option<u32> = ctx.restored_checkpoint().unwrap();
                ctx.update(format!("going on from page {at:?}")).await?;
                updated.open();
                gate.wait().await;
                return Ok::<_, ToolFailure>(format!("found {} (restored)", args.q));
            }
            ctx.update(format!("looking for {}", args.q)).await?;
            ctx.checkpoint(&3u32).unwrap();
            gate.wait().await;
            Ok(format!("found {}", args.q))
        }
    })
    .on_restore(policy)
}

fn agent_with(tool: Tool) -> Agent {
    Agent::builder("agent-a")
        .instructions("Help.")
        .tool(tool)
        .build()
        .unwrap()
}

/// Runs "find flights" until the search runs in the background, snapshots, closes.
async fn snapshot_with_search_running(
    tool: Tool,
) -> (SessionSnapshot, ChatContext, Arc<ScriptedLlm>) {
    let llm = ScriptedLlm::new([
        Reply::tool_call("search", json!({"q": "flights"})),
        Reply::text("Searching."),
    ]);
    let session = Session::builder()
        .llm(llm.clone())
        .agent(agent_with(tool))
        // Closing stands for the process dying: no grace for the tool to finish.
        .grace_period(Duration::ZERO)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let result = session.run("find flights").await.unwrap();
    assert_eq!(
        result.function_outputs().next().unwrap().output,
        "Update from search: looking for flights"
    );
    let snapshot = session.snapshot().await.unwrap();
    let chat = session.chat_context().await.unwrap();
    session.close().await.unwrap();
    (snapshot, chat, llm)
}

/// Waits for the held request, lets it answer, and waits for the session to be inactive
/// again (a tool may still run: the session is not settled).
async fn answered(session: &Session, held: HeldRequest) -> LlmRequest {
    let request = held.requested(BOUND).await.unwrap();
    held.release();
    let mut inactive = session.inactivity();
    tokio::time::timeout(BOUND, inactive.wait_for(|inactive| *inactive))
        .await
        .expect("the session is inactive again after the reply")
        .unwrap();
    request
}

const BOUND: Duration = Duration::from_secs(5);

async fn restore(snapshot: SessionSnapshot, tool: Tool, llm: Arc<ScriptedLlm>) -> Session {
    let agents = AgentRegistry::new().agent("agent-a", move |_| {
        Ok::<_, BuildError>(agent_with(tool.clone()))
    });
    common::restored(snapshot, agents, llm).await
}

#[actix::test]
async fn an_abandoned_call_gets_its_one_terminal_output_and_a_reply_tells_the_user() {
    let gate = Gate::new();
    let runs = Arc::new(AtomicU32::new(0));
    let tool = || {
        search(
            gate.clone(),
            runs.clone(),
            RestorePolicy::Abandon,
            Gate::new(),
        )
    };
    let (snapshot, before, _) = snapshot_with_search_running(tool()).await;
    assert!(before.output_of("call_1/finished").is_none());

    let llm = ScriptedLlm::new([Reply::text("Sorry, the search stopped; shall I retry?")]);
    let session = restore(snapshot, tool(), llm.clone()).await;
    common::settled(&session).await;

    let chat = session.chat_context().await.unwrap();
    assert_eq!(
        output(&chat, "call_1/finished"),
        "Interrupted before it finished."
    );
    // Like a cancelled call's: an ending, not a failure of the tool.
    assert!(!chat.output_of("call_1/finished").unwrap().is_error);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "an abandoned body never runs again"
    );
    let requests = llm.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].deferred_call_ids, ["call_1/finished"]);
    assert_eq!(
        requests[0].chat.items()[..before.len()],
        before.items()[..],
        "the reply sees the conversation as it was, then the terminal output"
    );
    assert_invariant(&chat);
    session.close().await.unwrap();
}

#[actix::test]
async fn a_restarted_call_runs_again_with_its_id_and_arguments_and_its_updates_go_on() {
    let gate = Gate::new();
    let runs = Arc::new(AtomicU32::new(0));
    let updated = Gate::new();
    let tool = || {
        search(
            gate.clone(),
            runs.clone(),
            RestorePolicy::Restart,
            updated.clone(),
        )
    };
    let (snapshot, _, _) = snapshot_with_search_running(tool()).await;

    let llm = ScriptedLlm::new([
        Reply::text("Still searching."),
        Reply::text("Here is what I found."),
    ]);
    let held = llm.hold(0);
    let session = restore(snapshot, tool(), llm.clone()).await;
    updated.wait().await;
    let first = answered(&session, held).await;
    assert_eq!(first.deferred_call_ids, ["call_1/update_1"]);
    let chat = session.chat_context().await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    // Its first update after the restart is `update_1`: the step's output was delivered.
    assert_eq!(
        output(&chat, "call_1/update_1"),
        "Update from search: going on from page Some(3)"
    );
    gate.open();
    let mut events = session.subscribe();
    wait_on(&mut events, event::output_added("call_1/finished")).await;
    common::settled(&session).await;

    let chat = session.chat_context().await.unwrap();
    assert_eq!(output(&chat, "call_1/finished"), "found flights (restored)");
    let deferred: Vec<_> = llm
        .requests()
        .iter()
        .map(|r| r.deferred_call_ids.clone())
        .collect();
    assert_eq!(deferred, [["call_1/update_1"], ["call_1/finished"]]);
    assert_invariant(&chat);
    session.close().await.unwrap();
}

#[actix::test]
async fn a_resumed_call_reads_the_checkpoint_it_saved() {
    let gate = Gate::new();
    gate.open();
    let runs = Arc::new(AtomicU32::new(0));
    let checkpointed = Gate::new();
    let (c, r) = (checkpointed.clone(), runs.clone());
    // The first body saves page 7 and waits forever; the resumed one returns at once.
    let tool = move || {
        let (c, r) = (c.clone(), r.clone());
        Tool::new("search", "Searches", move |ctx: RunContext, _: Query| {
            let (c, r) = (c.clone(), r.clone());
            async move {
                r.fetch_add(1, Ordering::SeqCst);
                if let Some(page) = ctx.restored_checkpoint::<u32>().unwrap() {
                    return Ok::<_, ToolFailure>(format!("resumed at page {page}"));
                }
                ctx.update("searching").await?;
                ctx.checkpoint(&7u32).unwrap();
                c.open();
                std::future::pending::<()>().await;
                Ok(String::new())
            }
        })
        .on_restore(RestorePolicy::Resume)
    };
    let llm = ScriptedLlm::new([
        Reply::tool_call("search", json!({"q": "flights"})),
        Reply::text("Searching."),
    ]);
    let session = Session::builder()
        .llm(llm)
        .agent(agent_with(tool()))
        .grace_period(Duration::ZERO)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("find flights").await.unwrap();
    checkpointed.wait().await;
    let snapshot = session.snapshot().await.unwrap();
    session.close().await.unwrap();

    let llm = ScriptedLlm::new([Reply::text("Found it.")]);
    let session = restore(snapshot, tool(), llm.clone()).await;
    // The resumed body returns at once: its output and the reply to it settle.
    common::settled(&session).await;
    let chat = session.chat_context().await.unwrap();
    assert_eq!(output(&chat, "call_1/finished"), "resumed at page 7");
    assert_eq!(llm.requests()[0].deferred_call_ids, ["call_1/finished"]);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    session.close().await.unwrap();
}

#[actix::test]
async fn a_call_restored_twice_still_gets_exactly_one_terminal_output() {
    let gate = Gate::new();
    let runs = Arc::new(AtomicU32::new(0));
    let updated = Gate::new();
    let tool = || {
        search(
            gate.clone(),
            runs.clone(),
            RestorePolicy::Restart,
            updated.clone(),
        )
    };
    let (snapshot, _, _) = snapshot_with_search_running(tool()).await;

    // First restore: the body runs again and updates; snapshot again before it ends.
    let llm = ScriptedLlm::new([Reply::text("Still on it.")]);
    let held = llm.hold(0);
    let first = restore(snapshot, tool(), llm.clone()).await;
    updated.wait().await;
    answered(&first, held).await;
    assert!(first
        .chat_context()
        .await
        .unwrap()
        .output_of("call_1/update_1")
        .is_some());
    let again = first.snapshot().await.unwrap();
    assert_eq!(again.epoch(), 1);
    first.close().await.unwrap();

    let llm = ScriptedLlm::new([Reply::text("Found it.")]);
    let second = restore(again, tool(), llm.clone()).await;
    assert_eq!(second.epoch(), 2);
    let mut events = second.subscribe();
    gate.open();
    wait_on(&mut events, event::output_added("call_1/finished")).await;
    common::settled(&second).await;
    let chat = second.chat_context().await.unwrap();
    let finished: Vec<_> = call_ids(&chat)
        .into_iter()
        .filter(|id| id.starts_with("out call_1/finished"))
        .collect();
    assert_eq!(finished.len(), 1, "{:#?}", chat.items());
    // Each run's updates go on from the last delivered one.
    assert!(
        chat.output_of("call_1/update_2").is_some(),
        "{:#?}",
        chat.items()
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    assert_invariant(&chat);
    second.close().await.unwrap();
}

#[actix::test]
async fn ids_go_on_after_a_restore_and_no_call_id_is_issued_twice() {
    let lookup = || {
        Tool::new(
            "lookup",
            "Looks up",
            |_ctx: RunContext, q: Query| async move { Ok::<_, ToolFailure>(format!("found {}", q.q)) },
        )
    };
    let llm = ScriptedLlm::new([
        Reply::tool_call("lookup", json!({"q": "a"})),
        Reply::text("Found a."),
    ]);
    let session = Session::builder()
        .llm(llm)
        .agent(agent_with(lookup()))
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session
        .apply(
            switchboard::InputId::new(41),
            switchboard::HostInput::Run {
                text: "find a".into(),
            },
        )
        .await
        .unwrap();
    let snapshot = session.snapshot().await.unwrap();
    assert_eq!(snapshot.last_input(), Some(41));
    session.close().await.unwrap();

    // The model reuses the provider id `call_1`: the session makes it unique again.
    let llm = ScriptedLlm::new([
        Reply::tool_call("lookup", json!({"q": "b"})),
        Reply::text("Found b."),
    ]);
    let session = restore(snapshot, lookup(), llm).await;
    assert_eq!(session.last_input(), Some(41));
    assert_eq!(session.id().as_str(), "s1");
    session.run("find b").await.unwrap();
    let chat = session.chat_context().await.unwrap();
    assert_eq!(
        call_ids(&chat),
        ["call call_1", "out call_1", "call call_1~2", "out call_1~2"]
    );
    session.close().await.unwrap();
}

/// The booking agent, built with the party size the handoff carried.
#[derive(Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema, PartialEq)]
struct Booking {
    party: u32,
}

fn booker(booking: &Booking) -> Agent {
    Agent::builder("booker")
        .instructions(format!("Book a table for {}.", booking.party))
        .restore_data(booking)
        .build()
        .unwrap()
}

fn greeter() -> Agent {
    let start_booking = Tool::new(
        "start_booking",
        "Hands the booking over",
        |_ctx: RunContext, args: Booking| async move {
            Ok::<_, ToolFailure>(Handoff::to(booker(&args)))
        },
    );
    Agent::builder("greeter")
        .instructions("Greet.")
        .tool(start_booking)
        .build()
        .unwrap()
}

fn booking_registry() -> AgentRegistry {
    AgentRegistry::new()
        .agent("greeter", |_| Ok::<_, BuildError>(greeter()))
        .agent_with_data("booker", |booking: Booking| {
            Ok::<_, BuildError>(booker(&booking))
        })
}

#[actix::test]
async fn an_agent_built_with_call_data_at_a_handoff_comes_back_the_same_on_another_engine() {
    let llm = ScriptedLlm::new([
        Reply::tool_call("start_booking", json!({"party": 2})),
        Reply::text("A table for two, when?"),
    ]);
    let session = Session::builder()
        .llm(llm.clone())
        .agent(greeter())
        .inherit_chat_context(true)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("a table for two please").await.unwrap();
    common::settled(&session).await;
    assert_eq!(session.current_agent().await.unwrap(), "booker");
    let bytes = session.snapshot().await.unwrap().to_bytes();
    let history = session.history().await;
    session.close().await.unwrap();

    // Another engine: its own arbiters, nothing shared with the first but the bytes.
    let engine = Engine::start().unwrap();
    let llm2 = ScriptedLlm::new([Reply::text("Seven it is.")]);
    let session = Session::builder()
        .llm(llm2.clone())
        .inherit_chat_context(true)
        .restore(
            SessionSnapshot::from_bytes(&bytes).unwrap(),
            booking_registry(),
        )
        .start(&engine)
        .await
        .unwrap();
    assert_eq!(session.current_agent().await.unwrap(), "booker");
    let restored_history = session.history().await;
    assert_eq!(
        restored_history, history,
        "the same activations, chats and ids"
    );
    session.run("at seven").await.unwrap();
    let request = &llm2.requests()[0];
    assert_eq!(&*request.agent, "booker");
    assert_eq!(&*request.instructions, "Book a table for 2.");
    let chat = session.chat_context().await.unwrap();
    assert_eq!(chat.items().last().unwrap().text(), Some("Seven it is."));
    assert_invariant(&chat);
    session.close().await.unwrap();
    engine.shutdown();
}
