//! SPEC §14 "The snapshot is the machines' own state": a session restored from a
//! snapshot writes that snapshot again, byte for byte, apart from the fields a restore
//! changes on purpose — the epoch (one more at each restore) and the chain's `seq` (the
//! restored session's chain goes on from the snapshot's). Inherited chats stay shared,
//! a running call keeps its counters and its checkpoint.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::Query;
use serde_json::{json, Value};
use switchboard::prelude::*;
use switchboard::snapshot::{AgentRegistry, SessionSnapshot};
use switchboard::testing::{Gate, Reply, ScriptedLlm};
use switchboard::RestorePolicy;

/// The snapshot's JSON without the two fields a restore changes on purpose.
fn without_epoch_and_seq(snapshot: &SessionSnapshot) -> Value {
    let mut json: Value = serde_json::from_slice(&snapshot.to_json()).unwrap();
    json.as_object_mut().unwrap().remove("seq");
    json["head"].as_object_mut().unwrap().remove("epoch");
    json
}

/// Restores `snapshot` with `agents` and takes a snapshot of the restored session at once.
async fn again(
    snapshot: &SessionSnapshot,
    agents: AgentRegistry,
    llm: Arc<ScriptedLlm>,
) -> SessionSnapshot {
    let session = Session::builder()
        .llm(llm)
        .inherit_chat_context(true)
        .grace_period(Duration::ZERO)
        .restore(snapshot.clone(), agents)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let taken = session.snapshot().await.unwrap();
    session.close().await.unwrap();
    taken
}

#[actix::test]
async fn after_handoffs_that_inherit_the_chat_the_restored_snapshot_is_the_same_bytes() {
    // a → b → c, each inheriting the whole chat of the one before.
    let names: Vec<String> = (0..4).map(|n| format!("agent-{n}")).collect();
    let chain = move |n: usize| -> Agent {
        fn build(names: Vec<String>, n: usize) -> Agent {
            let mut builder = Agent::builder(names[n].clone()).instructions("Help.");
            if n + 1 < names.len() {
                builder = builder.tool(Tool::new(
                    "transfer",
                    "Hands over",
                    move |_ctx: RunContext, _: Query| {
                        let names = names.clone();
                        async move { Ok::<_, ToolFailure>(Handoff::to(build(names, n + 1))) }
                    },
                ));
            }
            builder.build().unwrap()
        }
        build((0..4).map(|n| format!("agent-{n}")).collect(), n)
    };
    let mut replies = Vec::new();
    for _ in 0..3 {
        replies.push(Reply::text("Let me pass you on."));
        replies.push(Reply::tool_call("transfer", json!({"q": "next"})));
    }
    let llm = ScriptedLlm::new(replies);
    let session = Session::builder()
        .llm(llm.clone())
        .agent(chain(0))
        .inherit_chat_context(true)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    for n in 0..3 {
        session.run(format!("hello {n}")).await.unwrap();
        session.run(format!("pass me on {n}")).await.unwrap();
    }
    let first = session.snapshot().await.unwrap();
    session.close().await.unwrap();

    let mut agents = AgentRegistry::new();
    for (n, name) in names.iter().enumerate() {
        agents = agents.agent(name.clone(), move |_| Ok::<_, BuildError>(chain(n)));
    }
    let second = again(&first, agents, ScriptedLlm::new([])).await;
    assert_eq!(second.epoch(), first.epoch() + 1);
    assert_eq!(
        second.seq(),
        first.seq() + 1,
        "the restored session's chain goes on from the snapshot's"
    );
    assert_eq!(
        without_epoch_and_seq(&second),
        without_epoch_and_seq(&first),
        "snapshot → restore → snapshot is the identity"
    );
    assert_eq!(
        second.to_bytes().len(),
        first.to_bytes().len(),
        "the inherited chats are written once, as references, in both"
    );
}

#[actix::test]
async fn a_restarted_call_keeps_its_checkpoint_in_the_restored_snapshot() {
    let gate = Gate::new();
    let search = {
        let gate = gate.clone();
        move || {
            let gate = gate.clone();
            Tool::new("search", "Searches", move |ctx: RunContext, args: Query| {
                let gate = gate.clone();
                async move {
                    if !ctx.is_restored() {
                        ctx.update(format!("looking for {}", args.q)).await?;
                        ctx.checkpoint(&3u32).unwrap();
                    }
                    gate.wait().await;
                    Ok::<_, ToolFailure>("found")
                }
            })
            .on_restore(RestorePolicy::Restart)
        }
    };
    let searcher = {
        let search = search.clone();
        move || {
            Agent::builder("searcher")
                .instructions("Help.")
                .tool(search())
                .build()
                .unwrap()
        }
    };
    let llm = ScriptedLlm::new([
        Reply::tool_call("search", json!({"q": "flights"})),
        Reply::text("Searching."),
    ]);
    let session = Session::builder()
        .llm(llm)
        .agent(searcher())
        .grace_period(Duration::ZERO)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("find flights").await.unwrap();
    let first = session.snapshot().await.unwrap();
    session.close().await.unwrap();

    let agents = AgentRegistry::new().agent("searcher", move |_| Ok::<_, BuildError>(searcher()));
    let second = again(&first, agents, ScriptedLlm::new([])).await;
    assert_eq!(
        without_epoch_and_seq(&second),
        without_epoch_and_seq(&first),
        "the restarted call is held as it was: its counters and its checkpoint"
    );
}
