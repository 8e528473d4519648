//! A host input and its id go into the session in one call (`Session::apply`), and into
//! snapshots together: a snapshot's `last_input` is the last input whose effect it holds.
//! A `run` queued behind a running turn is not in a snapshot, so its id counts only once
//! its turn starts (and no later id counts before it); a turn saved after it settled is
//! saved with its id, however fast it ran.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use switchboard::prelude::*;
use switchboard::snapshot::{MemoryStore, SessionSnapshot, SnapshotStore};
use switchboard::testing::{Reply, ScriptedLlm};
use switchboard::{HostInput, InputAnswer, InputId, RecordedAnswer};

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

fn run(text: &str) -> HostInput {
    HostInput::Run { text: text.into() }
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
    let first = sent({
        let s = session.clone();
        async move { s.apply(InputId::new(1), run("first words")).await }
    });
    let first = actix::spawn(first);
    held.requested(Duration::from_secs(5)).await.unwrap();
    let snapshot = session.snapshot().await.unwrap();
    assert_eq!(snapshot.last_input(), Some(1));
    assert!(user_texts(&snapshot).contains("first words"));

    // Input 2 queues behind it; input 3 has no job. Neither counts yet: the snapshot does
    // not hold the queued turn, and 3 does not count before 2.
    let second = sent({
        let s = session.clone();
        async move { s.apply(InputId::new(2), run("second words")).await }
    });
    let third = session
        .apply(InputId::new(3), HostInput::UserStoppedSpeaking)
        .await
        .unwrap();
    assert!(matches!(third, InputAnswer::Done));
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
async fn a_queued_run_dropped_before_it_starts_lets_the_ids_after_it_count() {
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
    let second = sent({
        let s = session.clone();
        async move { s.apply(InputId::new(1), run("second words")).await }
    });
    // Input 2 has no job; applied after 1, it waits for 1's turn to count.
    session
        .apply(InputId::new(2), HostInput::UserStoppedSpeaking)
        .await
        .unwrap();
    assert_eq!(session.last_input(), None);
    // The host drops 1: it leaves the queue, having had no effect, and both count.
    drop(second);
    let snapshot = session.snapshot().await.unwrap();
    assert_eq!(snapshot.last_input(), Some(2));
    // Applied once: sent again, it is answered from the ledger, and nothing runs.
    assert!(session.applied(InputId::new(1)).is_some());
    let again = session
        .apply(InputId::new(1), run("second words"))
        .await
        .unwrap();
    assert!(matches!(again, InputAnswer::AppliedEarlier(_)), "{again:?}");
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
async fn a_turn_saved_after_it_settled_is_saved_with_its_id() {
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

    // The turn runs and settles at once: its save holds it, and its id.
    let answer = session.apply(InputId::new(1), run("hello")).await.unwrap();
    assert!(matches!(answer, InputAnswer::Turn(_)));
    let saved = saved_at(&store, &id, 1).await;
    assert!(user_texts(&saved).contains("hello"));
    assert_eq!(saved.last_input(), Some(1));
    assert_eq!(session.applied(InputId::new(1)), Some(RecordedAnswer::Turn));
    session.close().await.unwrap();
}
