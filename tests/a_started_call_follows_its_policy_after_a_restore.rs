//! SPEC §14 "Exactly once, without exceptions": a call is in the snapshot from the moment
//! its body may run, before any update. A step whose calls started is never asked again:
//! its calls follow their restore policies — an `Abandon` body (a card charged) never runs
//! twice — and their outputs go into the step, which then goes on as it would have. Only a
//! step whose model had not answered (no call of it started) is asked again. And a restore
//! that cannot honour a running call — its toolset not supplied — is refused with the call
//! and the toolset named, nothing started.
//!
//! Each test snapshots a session while a call's body runs and has sent nothing, closes the
//! session (as a process that died would lose it) and restores the snapshot.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{assert_invariant, output, spawn_turn, Query};
use serde_json::json;
use switchboard::prelude::*;
use switchboard::snapshot::{AgentRegistry, SessionSnapshot, SnapshotError};
use switchboard::testing::{Gate, Reply, ScriptedLlm};
use switchboard::RestorePolicy;

/// A card charge whose body counts its runs, opens `started`, waits for `done` and
/// returns: no update before its result.
#[derive(Clone)]
struct Charge {
    started: Gate,
    done: Gate,
    runs: Arc<AtomicU32>,
    policy: RestorePolicy,
}

impl Charge {
    fn new(policy: RestorePolicy) -> Self {
        Self {
            started: Gate::new(),
            done: Gate::new(),
            runs: Arc::default(),
            policy,
        }
    }

    fn tool(&self) -> Tool {
        let this = self.clone();
        Tool::new(
            "charge_card",
            "Charges the card",
            move |ctx: RunContext, args: Query| {
                let this = this.clone();
                async move {
                    this.runs.fetch_add(1, Ordering::SeqCst);
                    this.started.open();
                    this.done.wait().await;
                    let again = if ctx.is_restored() { " again" } else { "" };
                    Ok::<_, ToolFailure>(format!("charged {}{again}", args.q))
                }
            },
        )
        .on_restore(self.policy)
    }

    fn runs(&self) -> u32 {
        self.runs.load(Ordering::SeqCst)
    }
}

fn cashier(tool: Tool) -> Agent {
    Agent::builder("cashier")
        .instructions("Take the payment.")
        .tool(tool)
        .build()
        .unwrap()
}

/// Asks for a payment, waits until the charge's body has started, snapshots, closes.
async fn snapshot_while_charging(tool: Tool, started: &Gate) -> SessionSnapshot {
    let llm = ScriptedLlm::new([Reply::tool_call("charge_card", json!({"q": "40 EUR"}))]);
    let session = Session::builder()
        .llm(llm)
        .agent(cashier(tool))
        .grace_period(Duration::ZERO)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let _turn = spawn_turn(&session, "pay for the tickets");
    started.wait().await;
    let snapshot = session.snapshot().await.unwrap();
    session.close().await.unwrap();
    snapshot
}

async fn restore(snapshot: SessionSnapshot, tool: Tool, llm: Arc<ScriptedLlm>) -> Session {
    let agents = AgentRegistry::new().agent("cashier", move |_| {
        Ok::<_, BuildError>(cashier(tool.clone()))
    });
    common::restored(snapshot, agents, llm).await
}

#[actix::test]
async fn an_abandoned_call_whose_body_started_before_any_update_is_never_run_again() {
    let charge = Charge::new(RestorePolicy::Abandon);
    let snapshot = snapshot_while_charging(charge.tool(), &charge.started).await;
    let json: serde_json::Value = serde_json::from_slice(&snapshot.to_json()).unwrap();
    let current = &json["head"]["state"]["stack"][0]["activation"];
    assert!(current["redo"].is_null(), "the step is not asked again");
    assert_eq!(current["step"]["calls"][0]["call_id"], "call_1");
    assert_eq!(
        json["head"]["state"]["stack"][0]["toolsets"][0]["runs"][0]["call"]["call_id"], "call_1",
        "the call is held as running from the moment its body started"
    );

    let llm = ScriptedLlm::new([Reply::text("The payment was interrupted; shall I retry?")]);
    let session = restore(snapshot, charge.tool(), llm.clone()).await;
    common::settled(&session).await;
    assert_eq!(charge.runs(), 1, "the card is charged once");
    let chat = session.chat_context().await.unwrap();
    assert_eq!(output(&chat, "call_1"), "Interrupted before it finished.");
    let requests = llm.requests();
    assert_eq!(
        requests.len(),
        1,
        "the step goes on once; it is not asked again"
    );
    let asked: Vec<&str> = requests[0]
        .chat
        .items()
        .iter()
        .filter_map(ChatItem::call_id)
        .collect();
    assert_eq!(
        asked,
        ["call_1", "call_1"],
        "the next step sees the call and its terminal output"
    );
    assert_invariant(&chat);
    session.close().await.unwrap();
}

#[actix::test]
async fn a_restarted_call_of_an_open_step_runs_again_and_its_result_is_the_step_s_output() {
    let charge = Charge::new(RestorePolicy::Restart);
    let snapshot = snapshot_while_charging(charge.tool(), &charge.started).await;
    charge.done.open();
    let llm = ScriptedLlm::new([Reply::text("Paid.")]);
    let session = restore(snapshot, charge.tool(), llm.clone()).await;
    common::settled(&session).await;
    assert_eq!(charge.runs(), 2, "its policy runs it again, once");
    let chat = session.chat_context().await.unwrap();
    assert_eq!(output(&chat, "call_1"), "charged 40 EUR again");
    assert_eq!(llm.requests().len(), 1);
    assert_invariant(&chat);
    session.close().await.unwrap();
}

#[actix::test]
async fn a_step_whose_model_had_not_answered_is_asked_again() {
    let llm = ScriptedLlm::new([Reply::text("Hello.")]);
    let held = llm.hold(0);
    let session = Session::builder()
        .llm(llm)
        .agent(cashier(Charge::new(RestorePolicy::Abandon).tool()))
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let _turn = spawn_turn(&session, "hi");
    held.requested(Duration::from_secs(5)).await.unwrap();
    let snapshot = session.snapshot().await.unwrap();
    session.close().await.unwrap();
    let json: serde_json::Value = serde_json::from_slice(&snapshot.to_json()).unwrap();
    assert!(!json["head"]["state"]["stack"][0]["activation"]["redo"].is_null());

    let llm = ScriptedLlm::new([Reply::text("Hello.")]);
    let tool = Charge::new(RestorePolicy::Abandon).tool();
    let session = restore(snapshot, tool, llm.clone()).await;
    common::settled(&session).await;
    let requests = llm.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].chat.items().last().unwrap().text(), Some("hi"));
    session.close().await.unwrap();
}

/// A session toolset that records every call and waits for `done`.
fn recorder(started: Gate, done: Gate) -> Toolset {
    Toolset::new("recorder").tool(
        Tool::new(
            "record",
            "Records the call",
            move |_ctx: RunContext, _: Query| {
                let (started, done) = (started.clone(), done.clone());
                async move {
                    started.open();
                    done.wait().await;
                    Ok::<_, ToolFailure>("recorded")
                }
            },
        )
        .on_restore(RestorePolicy::Restart),
    )
}

#[actix::test]
async fn a_restore_without_the_toolset_of_a_running_call_is_refused_naming_both() {
    let (started, done) = (Gate::new(), Gate::new());
    let llm = ScriptedLlm::new([
        Reply::tool_call("record", json!({"q": "the call"})),
        Reply::text("Recording."),
    ]);
    let agent = || {
        Agent::builder("agent-a")
            .instructions("Help.")
            .build()
            .unwrap()
    };
    let session = Session::builder()
        .llm(llm)
        .agent(agent())
        .toolset(recorder(started.clone(), done.clone()))
        .grace_period(Duration::ZERO)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let _turn = spawn_turn(&session, "record this call");
    started.wait().await;
    let snapshot = session.snapshot().await.unwrap();
    session.close().await.unwrap();

    let engine = Engine::current().unwrap();
    let agents = || AgentRegistry::new().agent("agent-a", move |_| Ok::<_, BuildError>(agent()));
    let refused = Session::builder()
        .llm(ScriptedLlm::new([]))
        .restore(snapshot.clone(), agents())
        .start(&engine)
        .await;
    match refused {
        Err(SessionError::Snapshot(SnapshotError::UnknownToolset {
            call_id,
            tool,
            toolset,
        })) => {
            assert_eq!(call_id, "call_1");
            assert_eq!(tool, "record");
            assert_eq!(toolset, "recorder");
        }
        other => panic!("expected UnknownToolset, got {:?}", other.map(|_| ())),
    }
    assert_eq!(engine.stats().sessions, 0, "nothing started");

    // Given the toolset again, the call runs on.
    done.open();
    let llm = ScriptedLlm::new([Reply::text("Recorded.")]);
    let session = Session::builder()
        .llm(llm)
        .toolset(recorder(Gate::new(), done.clone()))
        .restore(snapshot, agents())
        .start(&engine)
        .await
        .unwrap();
    common::settled(&session).await;
    let chat = session.chat_context().await.unwrap();
    assert_eq!(output(&chat, "call_1"), "recorded");
    session.close().await.unwrap();
}
