//! SPEC §14, "Fenced everywhere": every store write is conditional on what the writer last
//! saw, and so is a restore's claim. Two sessions (two engines, or two processes) restoring
//! one stored state cannot both save it: a restore claims the session on the snapshot it
//! restores (`ClaimRule::Restore`), the first claim lands, and the second is refused
//! (`StoreError::Fenced`: `start` fails and nothing starts) — also when the first has saved
//! since, because the second read an older state. The store holds the first restorer's
//! conversation, never a mix. A restore that reads what the first saved goes on from that
//! state and fences the first, as it would a crashed process. A restorer that died after
//! its claim and before its first save holds the session until a host takes it over
//! explicitly (`ClaimRule::Takeover`), which fences that old writer's late writes. Checked on the memory store, the file store, and the file store shared by
//! two processes (one of them crashing); a delta that does not follow what the store holds
//! is refused.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use switchboard::prelude::*;
use switchboard::snapshot::{
    AgentRegistry, ClaimRule, Claimed, FileStore, MemoryStore, SessionSnapshot, SnapshotDelta,
    SnapshotStore, SnapshotUpdate, StoreError, StoreVersion,
};
use switchboard::testing::{Gate, Reply, ScriptedLlm};

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

/// One session's way to a shared store, with the gates a story holds it at: its writes
/// wait at `writes` (a session slow to save, or frozen), its claims at `claims` (a
/// restorer between its read and its claim); `read` opens once it has loaded, `asked`
/// once a write was asked for. Counts the writes asked for.
struct Held {
    inner: Arc<dyn SnapshotStore>,
    writes: Gate,
    claims: Gate,
    read: Gate,
    asked: Gate,
    writes_asked: AtomicUsize,
}

impl Held {
    /// `inner` behind gates that start closed where `hold_writes` / `hold_claims` say.
    fn new(inner: &Arc<dyn SnapshotStore>, hold_writes: bool, hold_claims: bool) -> Arc<Self> {
        let gate = |held: bool| {
            let gate = Gate::new();
            if !held {
                gate.open();
            }
            gate
        };
        Arc::new(Self {
            inner: inner.clone(),
            writes: gate(hold_writes),
            claims: gate(hold_claims),
            read: Gate::new(),
            asked: Gate::new(),
            writes_asked: AtomicUsize::new(0),
        })
    }

    /// The writes asked for so far.
    fn asked(&self) -> usize {
        self.writes_asked.load(Ordering::SeqCst)
    }

    /// Counts a write asked for.
    fn ask(&self) {
        self.writes_asked.fetch_add(1, Ordering::SeqCst);
        self.asked.open();
    }
}

impl SnapshotStore for Held {
    fn claim(
        &self,
        session: &str,
        rule: ClaimRule,
    ) -> BoxFuture<'static, Result<Claimed, StoreError>> {
        let (gate, inner, session) = (self.claims.clone(), self.inner.clone(), session.to_owned());
        async move {
            gate.wait().await;
            inner.claim(&session, rule).await
        }
        .boxed()
    }

    fn save(
        &self,
        snapshot: SessionSnapshot,
        after: StoreVersion,
    ) -> BoxFuture<'static, Result<StoreVersion, StoreError>> {
        self.ask();
        let (gate, inner) = (self.writes.clone(), self.inner.clone());
        async move {
            gate.wait().await;
            inner.save(snapshot, after).await
        }
        .boxed()
    }

    fn append(
        &self,
        delta: SnapshotDelta,
        after: StoreVersion,
    ) -> BoxFuture<'static, Result<StoreVersion, StoreError>> {
        self.ask();
        let (gate, inner) = (self.writes.clone(), self.inner.clone());
        async move {
            gate.wait().await;
            inner.append(delta, after).await
        }
        .boxed()
    }

    fn load(
        &self,
        session: &str,
    ) -> BoxFuture<'static, Result<Option<SessionSnapshot>, StoreError>> {
        let (read, loading) = (self.read.clone(), self.inner.load(session));
        async move {
            let loaded = loading.await;
            read.open();
            loaded
        }
        .boxed()
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

/// A session `call-1` that saved two turns to `store`, closed; what the store holds of it.
async fn a_stored_session(store: &Arc<dyn SnapshotStore>) -> SessionSnapshot {
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
    let snapshot = store.load("call-1").await.unwrap().unwrap();
    assert_eq!(user_words(&snapshot), ["first", "second"]);
    snapshot
}

/// Checks that the store holds `words` for `call-1`, written by `writer` (its epoch).
async fn holds(store: &Arc<dyn SnapshotStore>, words: &[&str], writer: &Session) {
    let saved = store.load("call-1").await.unwrap().unwrap();
    assert_eq!(user_words(&saved), words);
    assert_eq!(saved.epoch(), writer.epoch(), "written by {}", writer.id());
}

/// Waits for the `Fenced` event, with what the store said.
async fn fenced(events: &mut tokio::sync::broadcast::Receiver<SessionEvent>) -> String {
    common::wait_event(events, |event| match event {
        SessionEvent::Fenced { reason } => Some(reason.clone()),
        _ => None,
    })
    .await
}

/// A start refused because a later claim holds the session: the store's reason, once
/// checked that `engine` runs nothing (no session, no actor).
fn refused(started: Result<Session, SessionError>, engine: &Engine) -> String {
    let reason = match started {
        Err(SessionError::Store(StoreError::Fenced { session, reason })) => {
            assert_eq!(session, "call-1");
            reason
        }
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

/// A restore of `call-1` from `store`.
fn restore_from(store: Arc<dyn SnapshotStore>) -> SessionBuilder {
    Session::builder()
        .llm(llm())
        .restore_from(store, "call-1", registry())
}

/// A memory store and a file store (in `dir`): each story runs on both.
fn both_stores(dir: &common::TempDir) -> [Arc<dyn SnapshotStore>; 2] {
    [
        Arc::new(MemoryStore::new()),
        Arc::new(FileStore::new(dir.path()).unwrap()),
    ]
}

/// Two engines, as two processes would have: each runs its own session `call-1`.
fn two_engines() -> (Engine, Engine) {
    (
        Engine::current().unwrap(),
        Engine::with_arbiters(1).unwrap(),
    )
}

/// What a host that knows the claimant of `call-1` is gone does: takes the session over
/// (a takeover claim, fencing every writer before) and restores what the claim read,
/// saving under it; with the snapshot it restored.
async fn take_over(store: &Arc<dyn SnapshotStore>, engine: &Engine) -> (Session, SessionSnapshot) {
    let claimed = store
        .claim("call-1", ClaimRule::Takeover { at_least: 0 })
        .await
        .unwrap();
    let snapshot = claimed.snapshot.unwrap();
    let session = Session::builder()
        .llm(llm())
        .restore(snapshot.clone(), registry())
        .save_claimed(store.clone(), claimed.claim)
        .start(engine)
        .await
        .unwrap();
    (session, snapshot)
}

/// The story on one store: two restores of one stored state, the second refused, also
/// once the first has saved.
async fn the_second_restore_is_refused(store: Arc<dyn SnapshotStore>) {
    let read = a_stored_session(&store).await;
    // Two engines: as two processes would, each runs its own session `call-1`.
    let (engine_a, engine_b) = two_engines();
    // A restores; its first save is still on its way, so the store holds what both read.
    let a_store = Held::new(&store, true, false);
    let a = restore_from(a_store.clone())
        .start(&engine_a)
        .await
        .unwrap();
    assert!(a.epoch() > read.epoch(), "a restore gets a new epoch");
    // A restored session saves as soon as it has started, before any turn.
    tokio::time::timeout(std::time::Duration::from_secs(5), a_store.asked.wait())
        .await
        .expect("the restored session never asked to save");
    let reason = refused(
        restore_from(store.clone()).start(&engine_b).await,
        &engine_b,
    );
    assert!(
        reason.contains(&format!("claimed at epoch {}", a.epoch())),
        "{reason}"
    );

    // A saves and goes on.
    a_store.writes.open();
    a.run("from a").await.unwrap();
    stored(&store, &["first", "second", "from a"]).await;
    // The state read before A's claim, restored after A saved: older than what A wrote.
    let late = Session::builder()
        .llm(llm())
        .restore(read, registry())
        .save_snapshots(store.clone())
        .start(&engine_b)
        .await;
    refused(late, &engine_b);

    // Nothing fenced A: it writes on, and the store holds its conversation.
    a.run("again from a").await.unwrap();
    let written = a.save().await.unwrap();
    assert_eq!(
        user_words(&written),
        ["first", "second", "from a", "again from a"]
    );
    a.close().await.unwrap();
    holds(&store, &["first", "second", "from a", "again from a"], &a).await;
}

#[actix::test]
async fn on_the_memory_store_the_second_restore_is_refused() {
    the_second_restore_is_refused(Arc::new(MemoryStore::new())).await;
}

#[actix::test]
async fn on_the_file_store_the_second_restore_is_refused() {
    let dir = common::TempDir::new("two-restorers");
    the_second_restore_is_refused(Arc::new(FileStore::new(dir.path()).unwrap())).await;
    // The claim record is the user's too.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir.path().join("call-1.claim"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}

/// A restore that reads what the first restorer saved (it saves as soon as it has
/// started) restores that state, not the one the first read: it goes on from it as from a
/// crashed process — the store cannot tell a live writer from a dead one — and fences the
/// first, whose next save is refused.
#[actix::test]
async fn a_restore_of_what_the_first_restorer_saved_goes_on_from_it() {
    let store: Arc<dyn SnapshotStore> = Arc::new(MemoryStore::new());
    a_stored_session(&store).await;
    let (engine_a, engine_b) = two_engines();
    let a = restore_from(store.clone()).start(&engine_a).await.unwrap();
    a.run("from a").await.unwrap();
    stored(&store, &["first", "second", "from a"]).await;
    let b = restore_from(store.clone()).start(&engine_b).await.unwrap();
    assert_eq!(b.epoch(), a.epoch() + 1);
    let mut events = a.subscribe();
    a.run("from a, fenced").await.unwrap();
    fenced(&mut events).await;
    b.run("from b").await.unwrap();
    let written = b.save().await.unwrap();
    assert_eq!(
        user_words(&written),
        ["first", "second", "from a", "from b"]
    );
    for session in [a, b] {
        session.close().await.unwrap();
    }
    assert_eq!(store.load("call-1").await.unwrap().unwrap(), written);
}

/// Two restorers race: B reads, A reads, claims, restores and saves a turn, then B's claim
/// comes — refused, because B read an older state than the one A wrote.
#[actix::test]
async fn racing_restorers_the_one_that_claims_second_is_refused() {
    let dir = common::TempDir::new("racing");
    for store in both_stores(&dir) {
        a_stored_session(&store).await;
        let (engine_a, engine_b) = two_engines();
        let b_store = Held::new(&store, false, true);
        let b = {
            let (builder, engine) = (restore_from(b_store.clone()), engine_b.clone());
            actix::spawn(async move { builder.start(&engine).await })
        };
        tokio::time::timeout(std::time::Duration::from_secs(5), b_store.read.wait())
            .await
            .expect("B never read the store");

        let a = restore_from(store.clone()).start(&engine_a).await.unwrap();
        a.run("from a").await.unwrap();
        stored(&store, &["first", "second", "from a"]).await;
        b_store.claims.open();
        let b = tokio::time::timeout(std::time::Duration::from_secs(5), b)
            .await
            .expect("B's start never ended")
            .unwrap();
        refused(b, &engine_b);

        a.save().await.unwrap();
        a.close().await.unwrap();
        holds(&store, &["first", "second", "from a"], &a).await;
        store.remove("call-1").await.unwrap();
    }
}

/// The story: two engines restore one snapshot the host holds, each saving to the
/// same store. The first starts; the second is refused; the store holds the first's
/// conversation. The same for a snapshot the store never held (taken from a session that
/// saved nowhere).
#[actix::test]
async fn one_snapshot_restored_twice_is_saved_by_one_only() {
    let dir = common::TempDir::new("one-snapshot");
    for store in both_stores(&dir) {
        let from_the_store = a_stored_session(&store).await;
        let held_by_the_host = {
            let session = Session::builder()
                .llm(llm())
                .agent(agent())
                .id("call-1")
                .start(&Engine::current().unwrap())
                .await
                .unwrap();
            session.run("first").await.unwrap();
            session.run("second").await.unwrap();
            let snapshot = session.snapshot().await.unwrap();
            session.close().await.unwrap();
            snapshot
        };
        for snapshot in [from_the_store, held_by_the_host] {
            let restore = |engine: Engine| {
                let builder = Session::builder()
                    .llm(llm())
                    .restore(snapshot.clone(), registry())
                    .save_snapshots(store.clone());
                async move { builder.start(&engine).await }
            };
            let first = restore(Engine::current().unwrap()).await.unwrap();
            assert_eq!(first.epoch(), snapshot.epoch() + 1);
            let engine = Engine::with_arbiters(1).unwrap();
            refused(restore(engine.clone()).await, &engine);
            first.run("from the first").await.unwrap();
            common::settled(&first).await;
            first.close().await.unwrap();
            holds(&store, &["first", "second", "from the first"], &first).await;
            store.remove("call-1").await.unwrap();
        }
    }
}

/// A restorer claims and then never saves (frozen, or dead): every restore is refused, so
/// a host that knows it is gone takes the session over. The takeover fences the old
/// restorer: when it wakes, its late writes are refused, it says so and writes nothing
/// more; the store holds the conversation the takeover went on with.
#[actix::test]
async fn a_restorer_that_never_saved_is_taken_over_explicitly() {
    let dir = common::TempDir::new("takeover");
    for store in both_stores(&dir) {
        a_stored_session(&store).await;
        let (engine_a, engine_b) = two_engines();
        // A claims, and freezes before its first save lands.
        let a_store = Held::new(&store, true, false);
        let a = restore_from(a_store.clone())
            .start(&engine_a)
            .await
            .unwrap();
        refused(
            restore_from(store.clone()).start(&engine_b).await,
            &engine_b,
        );

        // The host knows A is gone: it takes the session over.
        let (b, _) = take_over(&store, &engine_b).await;
        assert!(b.epoch() > a.epoch());
        b.run("from b").await.unwrap();
        stored(&store, &["first", "second", "from b"]).await;

        // A wakes: its first save goes out and is refused.
        let mut events = a.subscribe();
        a_store.writes.open();
        let reason = fenced(&mut events).await;
        assert!(reason.contains("version"), "{reason}");
        let refused_at = a_store.asked();
        a.run("from a, late").await.unwrap();
        common::settled(&a).await;
        let err = a.save().await.unwrap_err();
        assert!(
            matches!(err, SessionError::Store(StoreError::Fenced { .. })),
            "{err}"
        );
        a.close().await.unwrap();
        assert_eq!(
            a_store.asked(),
            refused_at,
            "a fenced session writes nothing more"
        );

        b.close().await.unwrap();
        holds(&store, &["first", "second", "from b"], &b).await;
        store.remove("call-1").await.unwrap();
    }
}

/// A writer's claim, then writes that follow each other; a stale version and a delta
/// that does not follow are refused, and leave the record as it was; a restore's claim
/// lands only if no claim came after its snapshot's writer, and a refused one moves
/// nothing.
#[actix::test]
async fn writes_that_do_not_follow_are_refused_and_change_nothing() {
    let dir = common::TempDir::new("conditional");
    for store in both_stores(&dir) {
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
        let takeover = ClaimRule::Takeover { at_least: 0 };

        // Nothing is written without a claim.
        let err = store
            .save(full.clone(), StoreVersion::new(1))
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Fenced { .. }), "{err}");

        let claim = store.claim("call-2", takeover).await.unwrap();
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

        // A restore of what the claim's writer wrote (its epoch) fences that writer, and
        // reads what it wrote.
        let again = store
            .claim(
                "call-2",
                ClaimRule::Restore {
                    epoch: claim.epoch(),
                },
            )
            .await
            .unwrap();
        assert_eq!(again.snapshot.as_ref(), Some(&expected));
        assert_eq!(again.claim.epoch(), 2);
        let err = store.save(full.clone(), appended).await.unwrap_err();
        assert!(matches!(err, StoreError::Fenced { .. }), "{err}");
        // A second restore of the same state, and one of an older snapshot (the session's
        // own, epoch 0): refused, and nothing moved — the first restorer writes on.
        for rule in [
            ClaimRule::Restore {
                epoch: claim.epoch(),
            },
            ClaimRule::restore(&expected),
        ] {
            let err = store.claim("call-2", rule).await.unwrap_err();
            assert!(matches!(err, StoreError::Fenced { .. }), "{rule:?}: {err}");
        }
        let resaved = store
            .save(expected.clone(), again.claim.version())
            .await
            .unwrap();
        assert_eq!(store.load("call-2").await.unwrap().unwrap(), expected);
        // A restore of what the restorer wrote lands.
        let claimed = store
            .claim("call-2", ClaimRule::Restore { epoch: 2 })
            .await
            .unwrap();
        assert_eq!(claimed.claim.epoch(), 3);
        let err = store.save(full.clone(), resaved).await.unwrap_err();
        assert!(matches!(err, StoreError::Fenced { .. }), "{err}");

        // Removed: every writer is fenced, and a new claim starts afresh.
        store.remove("call-2").await.unwrap();
        let err = store
            .save(full.clone(), claimed.claim.version())
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Fenced { .. }), "{err}");
        assert!(store.load("call-2").await.unwrap().is_none());
        let fresh = store
            .claim("call-2", ClaimRule::Takeover { at_least: 7 })
            .await
            .unwrap()
            .claim;
        assert_eq!(fresh.epoch(), 7, "at least what the claimer asks for");
        assert_ne!(fresh.version(), claimed.claim.version());
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

/// `restore_from` a store that holds nothing: a typed error, nothing started, nothing
/// claimed (a session of that id starting afresh gets the first epoch).
#[actix::test]
async fn restoring_from_a_store_without_the_session_is_an_error() {
    let store: Arc<dyn SnapshotStore> = Arc::new(MemoryStore::new());
    let err = Session::builder()
        .llm(llm())
        .restore_from(store.clone(), "nobody", registry())
        .start(&Engine::current().unwrap())
        .await
        .unwrap_err();
    assert!(
        matches!(err, SessionError::Store(StoreError::NotFound { ref session }) if session == "nobody"),
        "{err}"
    );
    let claim = store
        .claim("nobody", ClaimRule::Takeover { at_least: 0 })
        .await
        .unwrap()
        .claim;
    assert_eq!(claim.epoch(), 1);
}

/// The environment variable that tells this test binary it is the second process, and the
/// folder it works in.
const SECOND_PROCESS: &str = "SWITCHBOARD_TEST_FENCE_DIR";

/// This test binary again, in a new process, running only the `#[ignore]`d test `name`
/// on the folder `dir`.
fn second_process(name: &str, dir: &std::path::Path) -> std::process::Output {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            name,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(SECOND_PROCESS, dir)
        .output()
        .unwrap()
}

/// Two processes restore one session from one folder: the first's claim lands, the
/// second's is refused across the processes, and the first saves on.
#[actix::test]
async fn two_processes_restoring_from_one_folder_do_not_both_save() {
    let dir = common::TempDir::new("two-processes");
    let store: Arc<dyn SnapshotStore> = Arc::new(FileStore::new(dir.path()).unwrap());
    a_stored_session(&store).await;
    // Its first save held: the store holds what the second process reads.
    let first_store = Held::new(&store, true, false);
    let first = restore_from(first_store.clone())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();

    let child = second_process("second_process_restores_and_is_refused", dir.path());
    assert!(
        child.status.success(),
        "the second process failed:\n{}\n{}",
        String::from_utf8_lossy(&child.stdout),
        String::from_utf8_lossy(&child.stderr)
    );

    first_store.writes.open();
    first.run("from the first process").await.unwrap();
    first.save().await.unwrap();
    first.close().await.unwrap();
    holds(
        &store,
        &["first", "second", "from the first process"],
        &first,
    )
    .await;
}

/// The second half of `two_processes_restoring_from_one_folder_do_not_both_save`, run by
/// it in a new process.
#[actix::test]
#[ignore = "the second process of two_processes_restoring_from_one_folder_do_not_both_save, which runs it"]
async fn second_process_restores_and_is_refused() {
    let dir = std::env::var(SECOND_PROCESS).expect("run by the first half");
    let store: Arc<dyn SnapshotStore> = Arc::new(FileStore::new(dir).unwrap());
    let engine = Engine::current().unwrap();
    let reason = refused(restore_from(store).start(&engine).await, &engine);
    assert!(reason.contains("claimed at epoch"), "{reason}");
}

/// A process restores a session from a folder and crashes (SIGABRT) before its first save:
/// its claim holds the session, so a restore in this process is refused; this process
/// takes the session over and saves on.
#[actix::test]
async fn a_process_that_crashed_after_its_claim_is_taken_over() {
    let dir = common::TempDir::new("crashed-claimant");
    let store: Arc<dyn SnapshotStore> = Arc::new(FileStore::new(dir.path()).unwrap());
    let read = a_stored_session(&store).await;

    let child = second_process("second_process_claims_and_crashes", dir.path());
    let said = String::from_utf8_lossy(&child.stdout);
    assert!(
        !child.status.success() && said.contains("claimed at epoch"),
        "the second process did not claim and crash:\n{said}\n{}",
        String::from_utf8_lossy(&child.stderr)
    );

    let engine = Engine::current().unwrap();
    let reason = refused(restore_from(store.clone()).start(&engine).await, &engine);
    assert!(
        reason.contains(&format!("claimed at epoch {}", read.epoch() + 1)),
        "{reason}"
    );
    let (session, restored) = take_over(&store, &engine).await;
    assert_eq!(restored, read, "the dead process wrote nothing");
    assert_eq!(session.epoch(), read.epoch() + 2);
    session.run("after the takeover").await.unwrap();
    session.save().await.unwrap();
    session.close().await.unwrap();
    holds(&store, &["first", "second", "after the takeover"], &session).await;
}

/// The second half of `a_process_that_crashed_after_its_claim_is_taken_over`, run by it in
/// a new process: restores (its saves held, so none lands) and aborts.
#[actix::test]
#[ignore = "the second process of a_process_that_crashed_after_its_claim_is_taken_over, which runs it"]
async fn second_process_claims_and_crashes() {
    let dir = std::env::var(SECOND_PROCESS).expect("run by the first half");
    let store: Arc<dyn SnapshotStore> = Arc::new(FileStore::new(dir).unwrap());
    let session = restore_from(Held::new(&store, true, false))
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    println!("claimed at epoch {}", session.epoch());
    std::process::abort();
}
