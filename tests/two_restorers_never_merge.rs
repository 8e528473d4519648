//! SPEC §14, "Fenced everywhere": every store write is conditional on what the writer last
//! saw. Two sessions (two engines, or two processes) restoring one session from one store
//! cannot both save it: each restore claims the session and gets a new epoch from the
//! store, the later claim fences the earlier writer, whose next save is refused; that
//! session says so (`SessionEvent::Fenced`) and saves nothing more. What the store holds
//! is the fencing claimant's conversation, never a mix of the two. Checked on the memory
//! store, the file store, and the file store shared by two processes; a delta that does
//! not follow what the store holds is refused.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use futures_util::future::BoxFuture;
use switchboard::prelude::*;
use switchboard::snapshot::{
    AgentRegistry, Claimed, FileStore, MemoryStore, SessionSnapshot, SnapshotDelta, SnapshotStore,
    SnapshotUpdate, StoreError, StoreVersion,
};
use switchboard::testing::{Reply, ScriptedLlm};

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

/// A store that counts the writes it is asked for, around a shared one: what one session
/// sends to the store.
struct Counting {
    inner: Arc<dyn SnapshotStore>,
    writes: Arc<AtomicUsize>,
}

impl Counting {
    fn around(inner: Arc<dyn SnapshotStore>) -> (Arc<dyn SnapshotStore>, Arc<AtomicUsize>) {
        let writes = Arc::new(AtomicUsize::new(0));
        let store = Arc::new(Self {
            inner,
            writes: writes.clone(),
        });
        (store, writes)
    }
}

impl SnapshotStore for Counting {
    fn claim(
        &self,
        session: &str,
        at_least: u64,
    ) -> BoxFuture<'static, Result<Claimed, StoreError>> {
        self.inner.claim(session, at_least)
    }

    fn save(
        &self,
        snapshot: SessionSnapshot,
        after: StoreVersion,
    ) -> BoxFuture<'static, Result<StoreVersion, StoreError>> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        self.inner.save(snapshot, after)
    }

    fn append(
        &self,
        delta: SnapshotDelta,
        after: StoreVersion,
    ) -> BoxFuture<'static, Result<StoreVersion, StoreError>> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        self.inner.append(delta, after)
    }

    fn load(
        &self,
        session: &str,
    ) -> BoxFuture<'static, Result<Option<SessionSnapshot>, StoreError>> {
        self.inner.load(session)
    }

    fn remove(&self, session: &str) -> BoxFuture<'static, Result<(), StoreError>> {
        self.inner.remove(session)
    }
}

/// What the user said in a snapshot, in order.
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

/// Waits (up to 5 s) until the store holds `words` for `call-1`: a session writes after
/// its turn settled, on its own writer.
async fn stored(store: &Arc<dyn SnapshotStore>, words: &[&str]) {
    let waited = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        loop {
            if let Some(snapshot) = store.load("call-1").await.unwrap() {
                if user_words(&snapshot) == words {
                    return;
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    })
    .await;
    let now = store.load("call-1").await.unwrap().map(|s| user_words(&s));
    assert!(
        waited.is_ok(),
        "the store never held {words:?}; it holds {now:?}"
    );
}

/// A session `call-1` that saved two turns to `store`, closed.
async fn a_stored_session(store: &Arc<dyn SnapshotStore>) {
    let session = Session::builder()
        .llm(llm())
        .agent(agent())
        .id("call-1")
        .save_snapshots(store.clone())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("first").await.unwrap();
    session.run("second").await.unwrap();
    session.close().await.unwrap();
}

/// Waits for the `Fenced` event, with what the store said.
async fn fenced(events: &mut tokio::sync::broadcast::Receiver<SessionEvent>) -> String {
    common::wait_event(events, |event| match event {
        SessionEvent::Fenced { reason } => Some(reason.clone()),
        _ => None,
    })
    .await
}

/// The story on one store: two restores from it, the earlier fenced by the later.
async fn two_restores_from(store: Arc<dyn SnapshotStore>) {
    a_stored_session(&store).await;
    // Two engines: as two processes would, each runs its own session `call-1`.
    let (engine_a, engine_b) = (
        Engine::current().unwrap(),
        Engine::with_arbiters(1).unwrap(),
    );
    let (store_a, writes_a) = Counting::around(store.clone());
    let a = Session::builder()
        .llm(llm())
        .restore_from(store_a, "call-1", registry())
        .start(&engine_a)
        .await
        .unwrap();
    // A saves a turn while it is the latest claim: the store has it.
    a.run("from a, kept").await.unwrap();
    stored(&store, &["first", "second", "from a, kept"]).await;
    let b = Session::builder()
        .llm(llm())
        .restore_from(store.clone(), "call-1", registry())
        .start(&engine_b)
        .await
        .unwrap();
    assert!(
        b.epoch() > a.epoch(),
        "each claim gets a new epoch from the store"
    );
    // B restored what the store held when its claim landed: A's turn is in it.
    assert_eq!(
        user_words(&b.snapshot().await.unwrap()),
        ["first", "second", "from a, kept"]
    );

    // A goes on: its save is refused, it says so, and saves nothing more.
    let mut events = a.subscribe();
    a.run("from a, fenced").await.unwrap();
    let reason = fenced(&mut events).await;
    assert!(reason.contains("version"), "{reason}");
    let refused_at = writes_a.load(Ordering::SeqCst);
    a.run("from a, not even tried").await.unwrap();
    common::settled(&a).await;
    // Asked to save (as on SIGTERM), it says why it cannot.
    let err = a.save().await.unwrap_err();
    assert!(
        matches!(err, SessionError::Store(StoreError::Fenced { .. })),
        "{err}"
    );
    a.close().await.unwrap();
    assert_eq!(
        writes_a.load(Ordering::SeqCst),
        refused_at,
        "a fenced session writes nothing more"
    );

    // B saves on; the store holds B's conversation, none of A's later turns.
    b.run("from b").await.unwrap();
    // Written now, whole, under b's claim.
    let written = b.save().await.unwrap();
    assert_eq!(
        user_words(&written),
        ["first", "second", "from a, kept", "from b"]
    );
    b.close().await.unwrap();
    let saved = store.load("call-1").await.unwrap().unwrap();
    assert_eq!(
        user_words(&saved),
        ["first", "second", "from a, kept", "from b"]
    );
    assert_eq!(saved.epoch(), b.epoch());
}

#[actix::test]
async fn on_the_memory_store_the_later_restore_fences_the_earlier() {
    two_restores_from(Arc::new(MemoryStore::new())).await;
}

#[actix::test]
async fn on_the_file_store_the_later_restore_fences_the_earlier() {
    let dir = common::TempDir::new("two-restorers");
    two_restores_from(Arc::new(FileStore::new(dir.path()).unwrap())).await;
    // The claim record is the user's too.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir.path().join("call-1.claim"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}

/// The story: two engines restore one snapshot the host holds, each saving to the
/// same store. Both start (each claims, the second fencing the first); the first's saves are
/// refused; the store never holds the first's turn on the second's snapshot.
#[actix::test]
async fn one_snapshot_restored_twice_is_saved_by_one_only() {
    let dir = common::TempDir::new("one-snapshot");
    for store in [
        Arc::new(MemoryStore::new()) as Arc<dyn SnapshotStore>,
        Arc::new(FileStore::new(dir.path()).unwrap()),
    ] {
        a_stored_session(&store).await;
        let snapshot = store.load("call-1").await.unwrap().unwrap();
        let restore = |engine: Engine| {
            let builder = Session::builder()
                .llm(llm())
                .restore(snapshot.clone(), registry())
                .save_snapshots(store.clone());
            async move { builder.start(&engine).await.unwrap() }
        };
        let first = restore(Engine::current().unwrap()).await;
        let second = restore(Engine::with_arbiters(1).unwrap()).await;
        assert!(second.epoch() > first.epoch());
        assert!(first.epoch() > snapshot.epoch());
        let mut events = first.subscribe();
        second.run("from the second").await.unwrap();
        common::settled(&second).await;
        first.run("from the first").await.unwrap();
        fenced(&mut events).await;
        second.run("again from the second").await.unwrap();
        for session in [&first, &second] {
            common::settled(session).await;
            session.close().await.unwrap();
        }
        let stored = store.load("call-1").await.unwrap().unwrap();
        assert_eq!(
            user_words(&stored),
            [
                "first",
                "second",
                "from the second",
                "again from the second"
            ]
        );
    }
}

/// A writer's claim, then writes that follow each other; a stale version and a delta
/// that does not follow are refused, and leave the record as it was.
#[actix::test]
async fn writes_that_do_not_follow_are_refused_and_change_nothing() {
    let dir = common::TempDir::new("conditional");
    for store in [
        Arc::new(MemoryStore::new()) as Arc<dyn SnapshotStore>,
        Arc::new(FileStore::new(dir.path()).unwrap()),
    ] {
        let session = Session::builder()
            .llm(llm())
            .agent(agent())
            .id("call-2")
            .start(&Engine::current().unwrap())
            .await
            .unwrap();
        session.run("one").await.unwrap();
        let SnapshotUpdate::Full(full) = session.snapshot_update().await.unwrap() else {
            panic!("the first update is full");
        };
        session.run("two").await.unwrap();
        let SnapshotUpdate::Delta(delta) = session.snapshot_update().await.unwrap() else {
            panic!("then a delta");
        };
        session.close().await.unwrap();

        // Nothing is written without a claim.
        let err = store
            .save(full.clone(), StoreVersion::new(1))
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Fenced { .. }), "{err}");

        let claim = store.claim("call-2", 0).await.unwrap();
        assert_eq!(claim.snapshot, None);
        let claim = claim.claim;
        assert_eq!(claim.epoch(), 1);
        // A delta with no full snapshot before it does not follow.
        let err = store
            .append(delta.clone(), claim.version())
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::NoBase { .. }), "{err}");
        let saved = store.save(full.clone(), claim.version()).await.unwrap();
        // A stale version: refused, whatever it carries.
        let err = store
            .append(delta.clone(), claim.version())
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Fenced { .. }), "{err}");
        assert_eq!(store.load("call-2").await.unwrap().unwrap(), full);
        let appended = store.append(delta.clone(), saved).await.unwrap();
        // The same delta again does not follow what the store holds now.
        let err = store.append(delta.clone(), appended).await.unwrap_err();
        assert!(matches!(err, StoreError::NoBase { .. }), "{err}");
        let mut expected = full.clone();
        expected.apply(&delta).unwrap();
        assert_eq!(store.load("call-2").await.unwrap().unwrap(), expected);

        // A second claim fences the first, and reads what the first wrote.
        let again = store.claim("call-2", 0).await.unwrap();
        assert_eq!(again.snapshot.as_ref(), Some(&expected));
        assert_eq!(again.claim.epoch(), 2);
        let err = store.save(full.clone(), appended).await.unwrap_err();
        assert!(matches!(err, StoreError::Fenced { .. }), "{err}");
        // Removed: every writer is fenced, and a new claim starts afresh.
        store.remove("call-2").await.unwrap();
        let err = store
            .save(full.clone(), again.claim.version())
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Fenced { .. }), "{err}");
        assert!(store.load("call-2").await.unwrap().is_none());
        let fresh = store.claim("call-2", 7).await.unwrap().claim;
        assert_eq!(fresh.epoch(), 7, "at least what the claimer asks for");
        assert_ne!(fresh.version(), again.claim.version());
    }
}

/// A session that saves to no store cannot be asked to save.
#[actix::test]
async fn a_session_without_a_store_cannot_save() {
    let session = Session::builder()
        .llm(llm())
        .agent(agent())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let err = session.save().await.unwrap_err();
    assert!(
        matches!(err, SessionError::Store(StoreError::Unavailable { .. })),
        "{err}"
    );
    session.close().await.unwrap();
}

/// `restore_from` a store that holds nothing: a typed error, nothing started.
#[actix::test]
async fn restoring_from_a_store_without_the_session_is_an_error() {
    let store: Arc<dyn SnapshotStore> = Arc::new(MemoryStore::new());
    let err = Session::builder()
        .llm(llm())
        .restore_from(store, "nobody", registry())
        .start(&Engine::current().unwrap())
        .await
        .unwrap_err();
    assert!(
        matches!(err, SessionError::Store(StoreError::NotFound { ref session }) if session == "nobody"),
        "{err}"
    );
}

/// The environment variable that tells this test binary it is the second process.
const SECOND_PROCESS: &str = "SWITCHBOARD_TEST_FENCE_DIR";

/// Two processes restore one session from one folder: the second's claim fences the
/// first, whose next save is refused, across the processes.
#[actix::test]
async fn two_processes_restoring_from_one_folder_do_not_both_save() {
    let dir = common::TempDir::new("two-processes");
    let store: Arc<dyn SnapshotStore> = Arc::new(FileStore::new(dir.path()).unwrap());
    a_stored_session(&store).await;
    let first = Session::builder()
        .llm(llm())
        .restore_from(store.clone(), "call-1", registry())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    first.run("from the first process").await.unwrap();
    stored(&store, &["first", "second", "from the first process"]).await;

    // This test binary again, running only the second half below.
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "second_process_restores_and_saves",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(SECOND_PROCESS, dir.path())
        .output()
        .unwrap();
    assert!(
        child.status.success(),
        "the second process failed:\n{}\n{}",
        String::from_utf8_lossy(&child.stdout),
        String::from_utf8_lossy(&child.stderr)
    );

    let mut events = first.subscribe();
    first.run("from the first process, fenced").await.unwrap();
    fenced(&mut events).await;
    first.close().await.unwrap();
    let stored = store.load("call-1").await.unwrap().unwrap();
    assert_eq!(
        user_words(&stored),
        [
            "first",
            "second",
            "from the first process",
            "from the second process"
        ]
    );
}

/// The second half of `two_processes_restoring_from_one_folder_do_not_both_save`, run by
/// it in a new process.
#[actix::test]
#[ignore = "the second process of two_processes_restoring_from_one_folder_do_not_both_save, which runs it"]
async fn second_process_restores_and_saves() {
    let dir = std::env::var(SECOND_PROCESS).expect("run by the first half");
    let store: Arc<dyn SnapshotStore> = Arc::new(FileStore::new(dir).unwrap());
    let session = Session::builder()
        .llm(llm())
        .restore_from(store, "call-1", registry())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("from the second process").await.unwrap();
    common::settled(&session).await;
    session.close().await.unwrap();
}
