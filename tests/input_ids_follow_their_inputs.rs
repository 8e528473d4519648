//! A host input's id (`Session::set_last_input`) and the input's effect go into snapshots
//! together: a snapshot's `last_input` is the last input whose effect it holds. A `run`
//! queued behind a running turn is not in a snapshot, so its id counts only once its turn
//! starts (and no later id counts before it); a turn that runs and settles before its id
//! comes is not saved without it (`Session::begin_input` holds the saves until the id).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use switchboard::prelude::*;
use switchboard::snapshot::{MemoryStore, SessionSnapshot, SnapshotStore};
use switchboard::testing::{Reply, ScriptedLlm};

type Pending<T> = Pin<Box<dyn Future<Output = T> + 'static>>;

/// Polls `call` once, as a host does (the engine message is sent then), and gives it back
/// to await later.
fn sent<T: 'static>(call: impl Future<Output = T> + 'static) -> Pending<T> {
    let mut call: Pending<T> = Box::pin(call);
    let poll = call.as_mut().poll(&mut Context::from_waker(
        futures_util::task::noop_waker_ref(),
    ));
    assert!(matches!(poll, Poll::Pending), "the call waits for its turn");
    call
}

fn agent() -> Agent {
    Agent::builder("a").build().unwrap()
}

fn user_texts(snapshot: &SessionSnapshot) -> String {
    String::from_utf8(snapshot.to_json()).unwrap()
}

#[actix::test]
async fn a_queued_run_s_id_counts_once_its_turn_starts() {
    let llm = ScriptedLlm::new([]);
    llm.otherwise(Reply::text("Noted."));
    let held = llm.hold(0);
    let session = Session::builder()
        .llm(llm.clone())
        .agent(agent())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();

    // Input 1 runs (its model request is held).
    session.begin_input();
    let first = sent({
        let s = session.clone();
        async move { s.run("first words").await }
    });
    session.set_last_input(1);
    let first = actix::spawn(first);
    held.requested(Duration::from_secs(5)).await.unwrap();
    let snapshot = session.snapshot().await.unwrap();
    assert_eq!(snapshot.last_input(), Some(1));
    assert!(user_texts(&snapshot).contains("first words"));

    // Input 2 queues behind it; input 3 has no job. Neither counts yet: the snapshot does
    // not hold the queued turn, and 3 does not count before 2.
    session.begin_input();
    let second = sent({
        let s = session.clone();
        async move { s.run("second words").await }
    });
    session.set_last_input(2);
    session.begin_input();
    session.set_last_input(3);
    let snapshot = session.snapshot().await.unwrap();
    assert!(!user_texts(&snapshot).contains("second words"));
    assert_eq!(snapshot.last_input(), Some(1), "input 2 is not in it");
    assert_eq!(session.last_input(), Some(1));

    // Once the queued turn starts, its user message is in, and so are 2 and 3.
    held.release();
    first.await.unwrap().unwrap();
    second.await.unwrap();
    session.wait_for_settled().await.unwrap();
    let snapshot = session.snapshot().await.unwrap();
    assert!(user_texts(&snapshot).contains("second words"));
    assert_eq!(snapshot.last_input(), Some(3));
    session.close().await.unwrap();
}

#[actix::test]
async fn a_queued_run_dropped_before_it_starts_lets_its_id_count() {
    let llm = ScriptedLlm::new([]);
    llm.otherwise(Reply::text("Noted."));
    let held = llm.hold(0);
    let session = Session::builder()
        .llm(llm.clone())
        .agent(agent())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let first = actix::spawn({
        let s = session.clone();
        async move { s.run("first words").await }
    });
    held.requested(Duration::from_secs(5)).await.unwrap();
    session.begin_input();
    let second = sent({
        let s = session.clone();
        async move { s.run("second words").await }
    });
    session.set_last_input(1);
    // The host drops it: it leaves the queue, having had no effect.
    drop(second);
    let snapshot = session.snapshot().await.unwrap();
    assert_eq!(snapshot.last_input(), Some(1));
    assert!(!user_texts(&snapshot).contains("second words"));
    held.release();
    first.await.unwrap().unwrap();
    session.close().await.unwrap();
}

/// The store's snapshot of `session` once it is at `seq` or later.
async fn saved_at(store: &MemoryStore, session: &str, seq: u64) -> SessionSnapshot {
    tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            if let Some(saved) = store.load(session).await.unwrap() {
                if saved.seq() >= seq {
                    return saved;
                }
            }
            // A sleep, not a yield: under paused time the clock then moves, so the
            // timeout can fire instead of the loop spinning for ever.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the store never reached link {seq} of the chain"))
}

#[actix::test]
async fn a_turn_that_settles_before_its_id_comes_is_saved_with_it() {
    // Paused: a sleep below moves the clock only once every task is idle, so "nothing
    // was saved" is read after the saver had every chance to write.
    tokio::time::pause();
    let llm = ScriptedLlm::new([]);
    llm.otherwise(Reply::text("Noted."));
    let store = MemoryStore::new();
    let session = Session::builder()
        .llm(llm)
        .agent(agent())
        .save_snapshots(Arc::new(store.clone()))
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let id = session.id().as_str().to_owned();
    saved_at(&store, &id, 0).await;

    // The host is slow to record the id: the turn runs and settles first.
    session.begin_input();
    session.run("hello").await.unwrap();
    session.wait_for_settled().await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let saved = store.load(&id).await.unwrap().unwrap();
    assert!(
        !user_texts(&saved).contains("hello") || saved.last_input() == Some(1),
        "a snapshot holding input 1 without its id was saved: {:?}",
        saved.last_input()
    );
    assert_eq!(saved.seq(), 0, "the save waits for the id");

    session.set_last_input(1);
    let saved = saved_at(&store, &id, 1).await;
    assert!(user_texts(&saved).contains("hello"));
    assert_eq!(saved.last_input(), Some(1));
    session.close().await.unwrap();
}
