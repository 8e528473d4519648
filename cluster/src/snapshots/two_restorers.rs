//! The cluster's snapshot store keeps the engine's store contract ("Fenced everywhere"):
//! two engines restoring one session from the JetStream store cannot both save it. Each
//! restore claims the session (a claim message, a new epoch); the later claim fences the
//! earlier writer, whose next save is refused: its session says so
//! (`SessionEvent::Fenced`) and writes nothing more. The store holds the later claimant's
//! conversation, never a mix; every message after its claim is its own.

use std::sync::Arc;
use std::time::Duration;

use switchboard::prelude::*;
use switchboard::snapshot::{AgentRegistry, SessionSnapshot};
use switchboard::testing::{Reply, ScriptedLlm};

use super::SnapshotStream;
use crate::local::NatsServer;
use crate::provisioning::Provisioning;
use crate::{Namespace, SessionKey, SessionSpec};

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
    let waited = tokio::time::timeout(PATIENCE, async {
        loop {
            if let Some(stored) = stream.load(key).await.unwrap() {
                if stored.snapshot.as_ref().map(user_words).unwrap_or_default() == words {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "the store never held {words:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_jetstream_store_the_later_restore_fences_the_earlier() {
    let server = NatsServer::start().unwrap();
    let client = server.connect().connect().await.unwrap();
    let ns = Namespace::default();
    let js = async_nats::jetstream::new(client.nats().clone());
    let stream = SnapshotStream::open(
        js,
        &ns,
        Duration::from_secs(60),
        Provisioning::Create { replicas: 1 },
    )
    .await
    .unwrap();
    let key = SessionKey::new("call-1").unwrap();
    let spec = SessionSpec::new("a");
    // Two engines, as two processes would have.
    let (engine_a, engine_b) = (
        Engine::with_arbiters(1).unwrap(),
        Engine::with_arbiters(1).unwrap(),
    );

    // The session ran before, and saved two turns.
    let before = Session::builder()
        .llm(llm())
        .agent(agent())
        .id("call-1")
        .save_snapshots(Arc::new(stream.writer(&key, "w0", &spec)))
        .start(&engine_a)
        .await
        .unwrap();
    before.run("first").await.unwrap();
    before.run("second").await.unwrap();
    before.close().await.unwrap();
    stored(&stream, &key, &["first", "second"]).await;

    let a = Session::builder()
        .llm(llm())
        .restore_from(
            Arc::new(stream.writer(&key, "a", &spec)),
            "call-1",
            registry(),
        )
        .start(&engine_a)
        .await
        .unwrap();
    a.run("from a, kept").await.unwrap();
    stored(&stream, &key, &["first", "second", "from a, kept"]).await;
    let b = Session::builder()
        .llm(llm())
        .restore_from(
            Arc::new(stream.writer(&key, "b", &spec)),
            "call-1",
            registry(),
        )
        .start(&engine_b)
        .await
        .unwrap();
    assert!(
        b.epoch() > a.epoch(),
        "each claim gets a new epoch from the store"
    );
    assert_eq!(
        user_words(&b.snapshot().await.unwrap()),
        ["first", "second", "from a, kept"],
        "b restored what the store held when its claim landed"
    );

    // A goes on: its save is refused, it says so, and it writes nothing more.
    let mut events = a.subscribe();
    a.run("from a, fenced").await.unwrap();
    let reason = switchboard::testing::next_event(
        &mut events,
        switchboard::testing::event::matching("Fenced", |event| match event {
            SessionEvent::Fenced { reason } => Some(reason.clone()),
            _ => None,
        }),
        PATIENCE,
    )
    .await
    .unwrap();
    assert!(reason.contains("by b"), "{reason}");
    a.run("from a, not even tried").await.unwrap();
    a.close().await.unwrap();

    b.run("from b").await.unwrap();
    b.close().await.unwrap();
    let stored = stream.load(&key).await.unwrap().unwrap();
    assert_eq!(
        user_words(stored.snapshot.as_ref().unwrap()),
        ["first", "second", "from a, kept", "from b"]
    );
    assert_eq!((stored.epoch, stored.worker.as_str()), (b.epoch(), "b"));
    // From b's claim on, every message is b's: a wrote nothing after it.
    let records = stream.records(&key).await.unwrap();
    let claim = records
        .iter()
        .position(|r| r.worker == "b")
        .unwrap_or_else(|| panic!("no claim by b: {records:?}"));
    assert!(
        records[claim..].iter().all(|r| r.worker == "b"),
        "{records:?}"
    );
}
