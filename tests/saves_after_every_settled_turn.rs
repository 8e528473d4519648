//! A session told to save its snapshots (`SessionBuilder::save_snapshots`) saves after
//! every turn that settles, not only the first: the store's chain moves on by one link a
//! turn, and a session restored from the store after the last turn has every turn.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use switchboard::prelude::*;
use switchboard::snapshot::{AgentRegistry, MemoryStore, SessionSnapshot, SnapshotStore};
use switchboard::testing::{Reply, ScriptedLlm};

/// The store's snapshot of `session` once it is at `seq` or later (the save runs after the
/// turn settled, a few messages later).
async fn saved_at(store: &MemoryStore, session: &str, seq: u64) -> SessionSnapshot {
    tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            if let Some(saved) = store.load(session).await.unwrap() {
                if saved.seq() >= seq {
                    return saved;
                }
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the store never reached link {seq} of the chain"))
}

#[actix::test]
async fn every_settled_turn_is_saved_and_restores() {
    let engine = Engine::current().unwrap();
    let llm = ScriptedLlm::new([]);
    llm.otherwise(Reply::text("Noted."));
    let store = MemoryStore::new();
    let session = Session::builder()
        .llm(llm.clone())
        .agent(Agent::builder("a").build().unwrap())
        .save_snapshots(Arc::new(store.clone()))
        .start(&engine)
        .await
        .unwrap();
    let id = session.id().as_str().to_owned();
    // The session saved in full once it started: link 0.
    saved_at(&store, &id, 0).await;
    for turn in 1..=3u64 {
        session.run(format!("turn {turn}")).await.unwrap();
        session.wait_for_settled().await.unwrap();
        let saved = saved_at(&store, &id, turn).await;
        assert_eq!(saved.seq(), turn, "one link per settled turn");
        let json = String::from_utf8(saved.to_json()).unwrap();
        assert!(
            json.contains(&format!("turn {turn}")),
            "turn {turn} is saved"
        );
    }
    let chat = session.chat_context().await.unwrap();
    session.close().await.unwrap();

    let saved = store.load(&id).await.unwrap().unwrap();
    let restored = Session::builder()
        .llm(llm.clone())
        .restore(
            saved,
            AgentRegistry::new().agent("a", |_| Agent::builder("a").build()),
        )
        .start(&engine)
        .await
        .unwrap();
    assert_eq!(restored.chat_context().await.unwrap().items(), chat.items());
    restored.close().await.unwrap();
}

/// A close right after a turn: the turn settles, its snapshot is being collected when the
/// close comes, and the close waits for it. The store holds the turn, never a snapshot
/// taken half-way through the close (once, such a save wrote a session with no agents
/// over the conversation).
#[actix::test]
async fn a_close_right_after_a_turn_keeps_that_turn_in_the_store() {
    // Its own arbiter: the close and the collection race as they do for a host.
    let engine = Engine::with_arbiters(1).unwrap();
    let llm = ScriptedLlm::new([]);
    llm.otherwise(Reply::text("Noted."));
    let store = MemoryStore::new();
    for round in 0..40 {
        let id = format!("call-{round}");
        let session = Session::builder()
            .llm(llm.clone())
            .agent(Agent::builder("a").build().unwrap())
            .id(&id)
            .save_snapshots(Arc::new(store.clone()))
            .start(&engine)
            .await
            .unwrap();
        session.run(format!("turn of round {round}")).await.unwrap();
        session.close().await.unwrap();
        let saved = store.load(&id).await.unwrap().unwrap();
        assert_eq!(saved.activations(), 1, "round {round}: the agent is in it");
        let json = String::from_utf8(saved.to_json()).unwrap();
        assert!(
            json.contains(&format!("turn of round {round}")),
            "round {round}: the turn is in it: {json}"
        );
    }
}
