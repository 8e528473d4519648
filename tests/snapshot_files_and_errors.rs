//! SPEC §14: what a snapshot is on the wire and on disk. A session saves itself after every
//! settled turn; deltas applied to a snapshot give the snapshot taken later; snapshot →
//! restore → snapshot is the identity; the file store keeps the user's conversation to its
//! owner, never follows a link, and a torn write leaves the previous state whole; a new
//! process reads a file back and goes on; every bad input is a typed error and starts
//! nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use common::{assert_invariant, Query};
use serde_json::{json, Value};
use switchboard::prelude::*;
use switchboard::snapshot::{
    AgentRegistry, ClaimRule, FileStore, MemoryStore, SessionSnapshot, SnapshotError,
    SnapshotStore, SnapshotUpdate, StoreError,
};
use switchboard::testing::{Reply, ScriptedLlm};

fn lookup() -> Tool {
    Tool::new(
        "lookup",
        "Looks up",
        |_ctx: RunContext, q: Query| async move { Ok::<_, ToolFailure>(format!("found {}", q.q)) },
    )
}

fn helper() -> Agent {
    Agent::builder("helper")
        .instructions("Help.")
        .tool(lookup())
        .build()
        .unwrap()
}

fn registry() -> AgentRegistry {
    AgentRegistry::new().agent("helper", |_| Ok::<_, BuildError>(helper()))
}

/// A model that looks up what the user says, then says it found it.
fn looking_llm() -> Arc<ScriptedLlm> {
    let llm = ScriptedLlm::new([]);
    llm.rule(|request| {
        let last = request.chat.items().last()?;
        Some(match last {
            ChatItem::Message(m) if m.role == ChatRole::User => {
                Reply::tool_call("lookup", json!({ "q": m.content }))
            }
            _ => Reply::text("Found it."),
        })
    });
    llm
}

/// A snapshot as JSON, without what legitimately changes between two takes of the same
/// state: the chain's `seq` and the epoch.
fn comparable(snapshot: &SessionSnapshot) -> Value {
    let mut value: Value = serde_json::from_slice(&snapshot.to_json()).unwrap();
    value.as_object_mut().unwrap().remove("seq");
    value["head"].as_object_mut().unwrap().remove("epoch");
    value
}

#[actix::test]
async fn deltas_applied_to_a_snapshot_give_the_snapshot_taken_later() {
    let session = Session::builder()
        .llm(looking_llm())
        .agent(helper())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("a").await.unwrap();
    let SnapshotUpdate::Full(mut built) = session.snapshot_update().await.unwrap() else {
        panic!("the first update of a chain is full");
    };
    for word in ["b", "c", "d"] {
        session.run(word).await.unwrap();
        match session.snapshot_update().await.unwrap() {
            SnapshotUpdate::Delta(delta) => {
                assert!(delta.items() <= 4, "a delta holds what changed: {delta:?}");
                let bytes = delta.to_bytes();
                let read = switchboard::snapshot::SnapshotDelta::from_bytes(&bytes).unwrap();
                built.apply(&read).unwrap();
            }
            SnapshotUpdate::Full(_) => panic!("a delta follows the chain"),
            other => panic!("unexpected update {other:?}"),
        }
    }
    let taken = session.snapshot().await.unwrap();
    assert_eq!(comparable(&built), comparable(&taken));
    // A delta that does not follow is refused, not applied.
    session.run("e").await.unwrap();
    let SnapshotUpdate::Delta(next) = session.snapshot_update().await.unwrap() else {
        panic!("a delta follows the full snapshot");
    };
    let mut stale = built.clone();
    stale.apply(&next).unwrap_err();
    session.close().await.unwrap();
}

#[actix::test]
async fn snapshot_then_restore_then_snapshot_is_the_identity() {
    let session = Session::builder()
        .llm(looking_llm())
        .agent(helper())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("a").await.unwrap();
    session.run("b").await.unwrap();
    let first = session.snapshot().await.unwrap();
    session.close().await.unwrap();
    let restored = Session::builder()
        .llm(looking_llm())
        .restore(first.clone(), registry())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let second = restored.snapshot().await.unwrap();
    assert_eq!(second.epoch(), first.epoch() + 1);
    assert_eq!(comparable(&first), comparable(&second));
    restored.close().await.unwrap();
}

#[actix::test]
async fn a_session_saves_itself_after_every_settled_turn() {
    let store = MemoryStore::new();
    let session = Session::builder()
        .llm(looking_llm())
        .agent(helper())
        .save_snapshots(Arc::new(store.clone()))
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    for word in ["a", "b", "c"] {
        session.run(word).await.unwrap();
        common::settled(&session).await;
    }
    let history = session.history().await;
    // The store has the last settled state: the session's work is done, so it matches
    // a snapshot taken now.
    let now = session.snapshot().await.unwrap();
    session.close().await.unwrap();
    let saved = store
        .load("s1")
        .await
        .unwrap()
        .expect("the store holds the session");
    assert_eq!(comparable(&saved), comparable(&now));

    let restored = Session::builder()
        .llm(looking_llm())
        .restore(saved, registry())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    assert_eq!(restored.history().await, history);
    restored.close().await.unwrap();
}

#[actix::test]
async fn the_file_store_writes_owner_only_files_and_follows_no_link() {
    let dir = common::TempDir::new("snapshots");
    let folder = dir.path().join("snapshots");
    let store = FileStore::new(&folder).unwrap();
    assert_eq!(
        std::fs::metadata(&folder).unwrap().permissions().mode() & 0o777,
        0o700
    );
    let session = Session::builder()
        .llm(looking_llm())
        .agent(helper())
        .save_snapshots(Arc::new(store.clone()))
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("a").await.unwrap();
    common::settled(&session).await;
    session.run("b").await.unwrap();
    common::settled(&session).await;
    session.close().await.unwrap();
    let snap = folder.join("s1.snap");
    let log = folder.join("s1.log");
    for file in [&snap, &log] {
        let mode = std::fs::metadata(file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", file.display());
    }

    // A torn append (a crash mid-write) leaves the state before it whole.
    let whole = store.load("s1").await.unwrap().unwrap();
    let mut bytes = std::fs::read(&log).unwrap();
    bytes.extend_from_slice(&bytes.clone()[..10]);
    std::fs::write(&log, &bytes).unwrap();
    assert_eq!(store.load("s1").await.unwrap().unwrap(), whole);

    // A link planted where the snapshot goes is not followed: the save fails and the
    // file it points at is untouched.
    let outside = dir.path().join("outside");
    std::fs::write(&outside, b"not yours").unwrap();
    std::fs::remove_file(&snap).unwrap();
    std::os::unix::fs::symlink(&outside, folder.join("s1.snap.tmp")).unwrap();
    let claim = store
        .claim("s1", ClaimRule::Takeover { at_least: 0 })
        .await
        .unwrap()
        .claim;
    let err = store
        .save(whole.clone(), claim.version())
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Io { .. }), "{err}");
    assert_eq!(std::fs::read(&outside).unwrap(), b"not yours");
    std::fs::remove_file(folder.join("s1.snap.tmp")).unwrap();
    std::os::unix::fs::symlink(&outside, &snap).unwrap();
    let err = store.load("s1").await.unwrap_err();
    assert!(matches!(err, StoreError::Io { .. }), "{err}");

    // A session id cannot name a path outside the folder.
    store.remove("../outside").await.unwrap();
    assert!(outside.exists());
}

#[actix::test]
async fn bad_snapshots_are_typed_errors_and_start_nothing() {
    let session = Session::builder()
        .llm(looking_llm())
        .agent(helper())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("a").await.unwrap();
    let snapshot = session.snapshot().await.unwrap();
    session.close().await.unwrap();
    let bytes = snapshot.to_bytes();

    let truncated = SessionSnapshot::from_bytes(&bytes[..bytes.len() - 7]).unwrap_err();
    assert!(
        matches!(truncated, SnapshotError::Truncated { .. }),
        "{truncated}"
    );
    let mut flipped = bytes.clone();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0x40;
    let corrupt = SessionSnapshot::from_bytes(&flipped).unwrap_err();
    assert!(
        matches!(corrupt, SnapshotError::Corrupt { .. }),
        "{corrupt}"
    );
    let garbage = SessionSnapshot::from_bytes(b"hello").unwrap_err();
    assert!(
        matches!(
            garbage,
            SnapshotError::Corrupt { .. } | SnapshotError::Truncated { .. }
        ),
        "{garbage}"
    );
    let mut newer: Value = serde_json::from_slice(&snapshot.to_json()).unwrap();
    newer["version"] = json!(99);
    newer["head"]["something_new"] = json!({"a": 1});
    let newer = SessionSnapshot::from_json(&serde_json::to_vec(&newer).unwrap()).unwrap_err();
    assert!(
        matches!(newer, SnapshotError::NewerSchema { found: 99, .. }),
        "{newer}"
    );

    let engine = Engine::current().unwrap();
    let unknown = Session::builder()
        .llm(looking_llm())
        .restore(snapshot.clone(), AgentRegistry::new())
        .start(&engine)
        .await
        .unwrap_err();
    assert!(
        matches!(
            &unknown,
            SessionError::Snapshot(SnapshotError::UnknownAgent { name, .. }) if name == "helper"
        ),
        "{unknown}"
    );
    let renamed = Session::builder()
        .llm(looking_llm())
        .restore(
            snapshot.clone(),
            AgentRegistry::new().agent("helper", |_| Agent::builder("other").build()),
        )
        .start(&engine)
        .await
        .unwrap_err();
    assert!(
        matches!(
            &renamed,
            SessionError::Snapshot(SnapshotError::UnknownAgent { .. })
        ),
        "{renamed}"
    );
    let no_model = Session::builder()
        .restore(snapshot.clone(), registry())
        .start(&engine)
        .await
        .unwrap_err();
    assert!(
        matches!(&no_model, SessionError::Build(BuildError::NoLlm { .. })),
        "{no_model}"
    );
    let both = Session::builder()
        .llm(looking_llm())
        .agent(helper())
        .restore(snapshot.clone(), registry())
        .start(&engine)
        .await
        .unwrap_err();
    assert!(
        matches!(&both, SessionError::Build(BuildError::AgentWithRestore)),
        "{both}"
    );
    // None of those started anything: the snapshot restores as the session it names.
    let restored = Session::builder()
        .llm(looking_llm())
        .restore(snapshot, registry())
        .start(&engine)
        .await
        .unwrap();
    assert_eq!(restored.id().as_str(), "s1");
    restored.close().await.unwrap();
}

#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Caller {
    name: String,
    vip: bool,
}

#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Other {
    count: u64,
}

#[actix::test]
async fn user_data_travels_through_serde_and_a_type_that_does_not_read_it_is_an_error() {
    let greet = Tool::new("greet", "Greets", |ctx: RunContext, _: Query| async move {
        let caller = ctx.userdata::<Caller>().expect("the caller is there");
        Ok::<_, ToolFailure>(format!("hello {}", caller.name))
    });
    let agent = move || {
        Agent::builder("greeter")
            .tool(greet.clone())
            .build()
            .unwrap()
    };
    let llm = ScriptedLlm::new([Reply::text("Hi.")]);
    let session = Session::builder()
        .llm(llm)
        .agent(agent())
        .userdata_serde(Caller {
            name: "Ada".into(),
            vip: true,
        })
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("hi").await.unwrap();
    let snapshot = session.snapshot().await.unwrap();
    session.close().await.unwrap();
    let a = agent.clone();
    let agents = AgentRegistry::new().agent("greeter", move |_| Ok::<_, BuildError>(a()));

    let wrong = Session::builder()
        .llm(ScriptedLlm::new([]))
        .restore(snapshot.clone(), agents.clone().userdata::<Other>())
        .start(&Engine::current().unwrap())
        .await
        .unwrap_err();
    assert!(
        matches!(
            &wrong,
            SessionError::Snapshot(SnapshotError::UserData { .. })
        ),
        "{wrong}"
    );
    let unnamed = Session::builder()
        .llm(ScriptedLlm::new([]))
        .restore(snapshot.clone(), agents.clone())
        .start(&Engine::current().unwrap())
        .await
        .unwrap_err();
    assert!(
        matches!(
            &unnamed,
            SessionError::Snapshot(SnapshotError::UserData { .. })
        ),
        "{unnamed}"
    );

    let llm = ScriptedLlm::new([
        Reply::tool_call("greet", json!({"q": "x"})),
        Reply::text("Done."),
    ]);
    let restored = Session::builder()
        .llm(llm)
        .restore(snapshot, agents.userdata::<Caller>())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    assert_eq!(
        *restored.userdata::<Caller>().unwrap(),
        Caller {
            name: "Ada".into(),
            vip: true
        }
    );
    restored.run("greet me").await.unwrap();
    let chat = restored.chat_context().await.unwrap();
    assert_eq!(common::output(&chat, "call_1"), "hello Ada");
    // And it is written down again by the next snapshot.
    let again = restored.snapshot().await.unwrap();
    assert_eq!(
        comparable(&again)["head"]["userdata"],
        json!({"name": "Ada", "vip": true})
    );
    assert_invariant(&chat);
    restored.close().await.unwrap();
}

/// The environment variable that tells this test binary it is the second process.
const SECOND_PROCESS: &str = "SWITCHBOARD_TEST_SNAPSHOT_DIR";

#[actix::test]
async fn a_snapshot_file_is_restored_by_a_new_process() {
    let dir = common::TempDir::new("snapshots");
    let store = FileStore::new(dir.path()).unwrap();
    let session = Session::builder()
        .llm(looking_llm())
        .agent(helper())
        .save_snapshots(Arc::new(store))
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("the first half").await.unwrap();
    common::settled(&session).await;
    session.close().await.unwrap();

    // This test binary again, running only the second half below.
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "second_process_restores_the_file",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(SECOND_PROCESS, dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&child.stdout);
    assert!(
        child.status.success(),
        "the second process failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&child.stderr)
    );
    assert!(
        stdout.contains("second half: the first half / the second half"),
        "{stdout}"
    );
}

/// The second half of `a_snapshot_file_is_restored_by_a_new_process`, run by it in a new
/// process.
#[actix::test]
#[ignore = "the second process of a_snapshot_file_is_restored_by_a_new_process, which runs it"]
async fn second_process_restores_the_file() {
    let dir = std::env::var(SECOND_PROCESS).expect("run by the first half");
    let store = FileStore::new(dir).unwrap();
    let snapshot = store.load("s1").await.unwrap().expect("the file is there");
    let session = Session::builder()
        .llm(looking_llm())
        .restore(snapshot, registry())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("the second half").await.unwrap();
    let chat = session.chat_context().await.unwrap();
    let said: Vec<&str> = chat
        .items()
        .iter()
        .filter_map(|item| match item {
            ChatItem::Message(m) if m.role == ChatRole::User => Some(m.content.as_str()),
            _ => None,
        })
        .collect();
    println!("second half: {}", said.join(" / "));
    assert_invariant(&chat);
    session.close().await.unwrap();
}
