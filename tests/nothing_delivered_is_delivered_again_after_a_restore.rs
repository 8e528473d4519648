//! SPEC §14 "Exactly once, without exceptions": nothing delivered before a snapshot is
//! delivered again after it. A `Restart` tool's body starts over after a restore; its
//! updates that repeat, in order, what the call already said are not delivered again (the
//! caller heard them: no new `/update_n`, no model request, nothing spoken), and the first
//! one that says something new goes out numbered after the last delivered.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{assert_invariant, output, wait_on, Query};
use serde_json::json;
use switchboard::prelude::*;
use switchboard::snapshot::{AgentRegistry, SessionSnapshot};
use switchboard::testing::{event, Gate, HeldRequest, Reply, ScriptedLlm};
use switchboard::RestorePolicy;

/// A lookup that says it looks, waits for `found`, says it found it, then says `last`
/// (restarted: `restarted_last`), waits for `done` and returns.
#[derive(Clone)]
struct Lookup {
    found: Gate,
    done: Gate,
    runs: Arc<AtomicU32>,
    restarted_last: Option<&'static str>,
}

impl Lookup {
    fn tool(&self) -> Tool {
        let this = self.clone();
        Tool::new(
            "lookup",
            "Looks the order up",
            move |ctx: RunContext, args: Query| {
                let this = this.clone();
                async move {
                    this.runs.fetch_add(1, Ordering::SeqCst);
                    ctx.update(format!("looking up order {}", args.q)).await?;
                    this.found.wait().await;
                    ctx.update("found it, checking the stock").await?;
                    if let (true, Some(last)) = (ctx.is_restored(), this.restarted_last) {
                        ctx.update(last).await?;
                    }
                    this.done.wait().await;
                    Ok::<_, ToolFailure>("in stock")
                }
            },
        )
        .on_restore(RestorePolicy::Restart)
    }

    fn agent(&self) -> Agent {
        Agent::builder("clerk")
            .instructions("Help.")
            .tool(self.tool())
            .build()
            .unwrap()
    }
}

const BOUND: Duration = Duration::from_secs(5);

/// Lets the held request answer and waits until the session is idle again (a tool may
/// still run in the background).
async fn answered(session: &Session, reply: HeldRequest) {
    reply.requested(BOUND).await.unwrap();
    reply.release();
    let mut inactive = session.inactivity();
    tokio::time::timeout(BOUND, inactive.wait_for(|inactive| *inactive))
        .await
        .unwrap()
        .unwrap();
}

/// Runs the lookup until both its updates were delivered and answered, snapshots, closes.
async fn snapshot_after_two_updates(lookup: &Lookup) -> (SessionSnapshot, ChatContext) {
    let llm = ScriptedLlm::new([
        Reply::tool_call("lookup", json!({"q": "42"})),
        Reply::text("Looking it up."),
        Reply::text("Found it; checking the stock."),
    ]);
    let reply = llm.hold(2);
    let session = Session::builder()
        .llm(llm)
        .agent(lookup.agent())
        .grace_period(Duration::ZERO)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("where is my order").await.unwrap();
    lookup.found.open();
    // The deferred reply to `/update_1` is asked for and answered: the session is idle
    // again, the lookup waiting in the background.
    answered(&session, reply).await;
    let snapshot = session.snapshot().await.unwrap();
    let chat = session.chat_context().await.unwrap();
    session.close().await.unwrap();
    (snapshot, chat)
}

async fn restore(snapshot: SessionSnapshot, lookup: &Lookup, llm: Arc<ScriptedLlm>) -> Session {
    let agent = lookup.clone();
    let agents = AgentRegistry::new().agent("clerk", move |_| Ok::<_, BuildError>(agent.agent()));
    common::restored(snapshot, agents, llm).await
}

#[actix::test]
async fn a_restarted_body_that_repeats_what_it_said_is_not_heard_again() {
    let lookup = Lookup {
        found: Gate::new(),
        done: Gate::new(),
        runs: Arc::default(),
        restarted_last: None,
    };
    let (snapshot, before) = snapshot_after_two_updates(&lookup).await;
    assert_eq!(
        output(&before, "call_1"),
        "Update from lookup: looking up order 42"
    );

    let llm = ScriptedLlm::new([Reply::text("It is in stock.")]);
    let session = restore(snapshot, &lookup, llm.clone()).await;
    let mut events = session.subscribe();
    lookup.done.open();
    wait_on(&mut events, event::output_added("call_1/finished")).await;
    common::settled(&session).await;

    assert_eq!(lookup.runs.load(Ordering::SeqCst), 2, "restarted once");
    let chat = session.chat_context().await.unwrap();
    assert!(
        chat.output_of("call_1/update_2").is_none(),
        "its repeated updates were not delivered again"
    );
    assert_eq!(
        chat.items()[..before.len()],
        before.items()[..],
        "the conversation goes on from where it was"
    );
    assert_eq!(output(&chat, "call_1/finished"), "in stock");
    let deferred: Vec<_> = llm
        .requests()
        .iter()
        .map(|r| r.deferred_call_ids.clone())
        .collect();
    assert_eq!(
        deferred,
        [["call_1/finished"]],
        "one request, for what is new: none for what the caller heard"
    );
    assert_invariant(&chat);
    session.close().await.unwrap();
}

#[actix::test]
async fn what_a_restarted_body_says_new_is_numbered_after_what_was_delivered() {
    let lookup = Lookup {
        found: Gate::new(),
        done: Gate::new(),
        runs: Arc::default(),
        restarted_last: Some("it ships today"),
    };
    let (snapshot, _) = snapshot_after_two_updates(&lookup).await;

    let llm = ScriptedLlm::new([Reply::text("It ships today.")]);
    let reply = llm.hold(0);
    let session = restore(snapshot, &lookup, llm.clone()).await;
    // The deferred reply to what is new.
    answered(&session, reply).await;
    let chat = session.chat_context().await.unwrap();
    assert!(chat.output_of("call_1/update_1").is_some());
    assert!(chat.output_of("call_1/update_3").is_none());
    assert_eq!(
        output(&chat, "call_1/update_2"),
        "Update from lookup: it ships today"
    );
    let deferred: Vec<_> = llm
        .requests()
        .iter()
        .map(|r| r.deferred_call_ids.clone())
        .collect();
    assert_eq!(deferred, [["call_1/update_2"]]);
    lookup.done.open();
    session.close().await.unwrap();
}
