//! The cluster's snapshot store keeps the engine's store contract ("Fenced everywhere"):
//! two engines restoring one stored state from the JetStream store cannot both save it.
//! A restore claims the session on the snapshot it restores (a claim message written over
//! the subject's last one, if no claim after that snapshot's writer is there); the first
//! lands, the second is refused (its `start` fails, naming the writer that holds the
//! session) — also when the first has saved since. The store holds the first restorer's
//! conversation; every message after its claim is its own. A claimant that died holds the
//! session until a takeover, which fences its late writes.

use std::sync::Arc;
use std::time::Duration;

use switchboard::prelude::*;
use switchboard::snapshot::{AgentRegistry, ClaimRule, SessionSnapshot, SnapshotStore, StoreError};
use switchboard::testing::{Reply, ScriptedLlm};

use super::SnapshotStream;
use crate::local::NatsServer;
use crate::{SessionKey, SessionSpec};

/// How long a wait on the server may take before the test fails saying what it waited for.
const PATIENCE: Duration = Duration::from_secs(30);

fn agent() -> Agent {
    Agent::builder("a").instructions("Note.").build().unwrap()
}

fn registry() -> AgentRegistry {
    AgentRegistry::new().agent("a", |_| Ok::<_, BuildError>(agent()))
}

fn llm() -> Arc<ScriptedLlm> {
    let llm = ScriptedLlm::new([]);
    llm.otherwise(Reply::text("Noted."));
    llm
}

fn user_words(snapshot: &SessionSnapshot) -> Vec<String> {
    let json: serde_json::Value = serde_json::from_slice(&snapshot.to_json()).unwrap();
    let mut words = Vec::new();
    for activation in json["activations"].as_array().unwrap() {
        for item in activation["items"].as_array().unwrap() {
            if item["role"] == "user" {
                words.push(item["content"].as_str().unwrap().to_owned());
            }
        }
    }
    words
}

/// Waits until the store holds `words` for the session.
async fn stored(stream: &SnapshotStream, key: &SessionKey, words: &[&str]) {
    let mut last = String::from("nothing loaded yet");
    let waited = tokio::time::timeout(PATIENCE, async {
        loop {
            // A load can fail for a while on a loaded machine (a request to the server
            // timed out): asked again until the patience runs out, and said if it does.
            match stream.load(key).await {
                Ok(Some(stored))
                    if stored.snapshot.as_ref().map(user_words).unwrap_or_default() == words =>
                {
                    return;
                }
                Ok(stored) => {
                    last = format!(
                        "held {:?}",
                        stored.and_then(|s| s.snapshot).map(|s| user_words(&s))
                    )
                }
                Err(err) => last = format!("load failed: {err}"),
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(
        waited.is_ok(),
        "the store never held {words:?} (last: {last})"
    );
}

/// A stream on a fresh server, with session `call-1` saved by `w0` (two turns); what the
/// store holds of it.
async fn a_stored_session(
    engine: &Engine,
) -> (
    NatsServer,
    SnapshotStream,
    SessionKey,
    SessionSpec,
    SessionSnapshot,
) {
    let server = NatsServer::start().unwrap();
    let client = server.connect().connect().await.unwrap();
    let stream = SnapshotStream::for_tests(&client).await;
    let key = SessionKey::new("call-1").unwrap();
    let spec = SessionSpec::new("a");
    let before = Session::builder()
        .llm(llm())
        .agent(agent())
        .id("call-1")
        .save_snapshots(Arc::new(stream.writer(&key, "w0", &spec)))
        .start(engine)
        .await
        .unwrap();
    before.run("first").await.unwrap();
    before.run("second").await.unwrap();
    before.close().await.unwrap();
    stored(&stream, &key, &["first", "second"]).await;
    let read = stream.load(&key).await.unwrap().unwrap().snapshot.unwrap();
    (server, stream, key, spec, read)
}

/// A start refused because a later claim holds the session: the store's reason, once
/// checked that `engine` runs nothing.
fn refused(started: Result<Session, SessionError>, engine: &Engine) -> String {
    let reason = match started {
        Err(SessionError::Store(StoreError::Fenced { reason, .. })) => reason,
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(session) => panic!("a second restorer started, at epoch {}", session.epoch()),
    };
    let stats = engine.stats();
    assert_eq!(
        (stats.sessions, stats.actors),
        (0, 0),
        "a refused restore starts nothing"
    );
    reason
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_jetstream_store_the_second_restore_is_refused() {
    // Two engines, as two processes would have.
    let (engine_a, engine_b) = (
        Engine::with_arbiters(1).unwrap(),
        Engine::with_arbiters(1).unwrap(),
    );
    let (_server, stream, key, spec, read) = a_stored_session(&engine_a).await;

    // A restores (what `restore_from` does, a step at a time): reads, claims on what it
    // read, and has not started its session yet.
    let a_writer = Arc::new(stream.writer(&key, "a", &spec));
    let claimed = a_writer
        .claim("call-1", ClaimRule::restore(&read))
        .await
        .unwrap();
    assert_eq!(claimed.snapshot.as_ref(), Some(&read));
    // B restores the same state: refused, naming A.
    let b = Session::builder()
        .llm(llm())
        .restore_from(
            Arc::new(stream.writer(&key, "b", &spec)),
            "call-1",
            registry(),
        )
        .start(&engine_b)
        .await;
    let reason = refused(b, &engine_b);
    assert!(reason.contains("by a"), "{reason}");

    let a = Session::builder()
        .llm(llm())
        .restore(claimed.snapshot.unwrap(), registry())
        .save_claimed(a_writer.clone(), claimed.claim)
        .start(&engine_a)
        .await
        .unwrap();
    assert_eq!(a.epoch(), read.epoch() + 1);
    a.run("from a").await.unwrap();
    stored(&stream, &key, &["first", "second", "from a"]).await;
    // The state read before A's claim, restored after A saved: older than what A wrote.
    let late = Session::builder()
        .llm(llm())
        .restore(read, registry())
        .save_snapshots(Arc::new(stream.writer(&key, "late", &spec)))
        .start(&engine_b)
        .await;
    let reason = refused(late, &engine_b);
    assert!(reason.contains("by a"), "{reason}");

    // Nothing fenced A: it writes on.
    a.run("again from a").await.unwrap();
    a.save().await.unwrap();
    a.close().await.unwrap();
    let stored = stream.load(&key).await.unwrap().unwrap();
    assert_eq!(
        user_words(stored.snapshot.as_ref().unwrap()),
        ["first", "second", "from a", "again from a"]
    );
    assert_eq!((stored.epoch, stored.worker.as_str()), (a.epoch(), "a"));
    // From A's claim on, every message is A's: the refused ones wrote nothing.
    let records = stream.records(&key).await.unwrap();
    let claim = records
        .iter()
        .position(|r| r.worker == "a")
        .unwrap_or_else(|| panic!("no claim by a: {records:?}"));
    assert!(
        records[claim..].iter().all(|r| r.worker == "a"),
        "{records:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_jetstream_store_a_dead_claimant_is_taken_over() {
    let engine = Engine::with_arbiters(1).unwrap();
    let (_server, stream, key, spec, read) = a_stored_session(&engine).await;

    // A claims and dies before its session saved anything.
    let a_writer = stream.writer(&key, "a", &spec);
    let a_claim = a_writer
        .claim("call-1", ClaimRule::restore(&read))
        .await
        .unwrap()
        .claim;
    // Every restore is refused: the store cannot tell A is gone.
    let b_writer = Arc::new(stream.writer(&key, "b", &spec));
    let b = Session::builder()
        .llm(llm())
        .restore_from(b_writer.clone(), "call-1", registry())
        .start(&engine)
        .await;
    let reason = refused(b, &engine);
    assert!(reason.contains("by a"), "{reason}");

    // The host knows A is gone: it takes the session over.
    let claimed = b_writer
        .claim("call-1", ClaimRule::Takeover { at_least: 0 })
        .await
        .unwrap();
    assert_eq!(claimed.snapshot.as_ref(), Some(&read));
    let b = Session::builder()
        .llm(llm())
        .restore(claimed.snapshot.unwrap(), registry())
        .save_claimed(b_writer, claimed.claim)
        .start(&engine)
        .await
        .unwrap();
    assert!(b.epoch() > a_claim.epoch());
    b.run("from b").await.unwrap();
    stored(&stream, &key, &["first", "second", "from b"]).await;

    // A's late write is refused.
    match a_writer.save(read.clone(), a_claim.version()).await {
        Err(StoreError::Fenced { reason, .. }) => assert!(reason.contains("by b"), "{reason}"),
        other => panic!("a dead claimant's late write went through: {other:?}"),
    }
    b.close().await.unwrap();
    let stored = stream.load(&key).await.unwrap().unwrap();
    assert_eq!(
        user_words(stored.snapshot.as_ref().unwrap()),
        ["first", "second", "from b"]
    );
    assert_eq!((stored.epoch, stored.worker.as_str()), (b.epoch(), "b"));
}
