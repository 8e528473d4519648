//! SPEC §16 "Names": the host may give a session its own id (the call's id). An id names
//! one live session of an engine: a duplicate is refused before anything of it starts,
//! the id is free again once its session is gone, ids the engine cannot carry are refused,
//! and the engine's own `s1, s2, …` never take an id a host's live session holds.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use switchboard::prelude::*;
use switchboard::testing::{Reply, ScriptedLlm};
use switchboard::SessionId;

const BOUND: Duration = Duration::from_secs(60);

fn session() -> SessionBuilder {
    let llm = ScriptedLlm::new([]);
    llm.otherwise(Reply::text("hello"));
    Session::builder()
        .llm(llm)
        .agent(Agent::builder("agent").build().unwrap())
        .inspect(true)
}

#[switchboard::test]
async fn a_duplicate_of_a_live_session_is_refused_and_the_id_is_free_once_it_is_gone() {
    tokio::time::pause();
    let engine = Engine::current().unwrap();
    let first = session().id("call-42").start(&engine).await.unwrap();
    assert_eq!(first.id().as_str(), "call-42");
    assert!(first.inspector().unwrap().is_alive("session/call-42"));
    let before = engine.stats();

    let err = session().id("call-42").start(&engine).await.unwrap_err();
    assert!(
        matches!(&err, SessionError::DuplicateSession { id } if id.as_str() == "call-42"),
        "{err}"
    );
    assert!(err.to_string().contains("call-42"), "{err}");
    // Refused before anything started: no session, no actor more than before.
    let after = engine.stats();
    assert_eq!(
        (after.sessions, after.actors),
        (before.sessions, before.actors)
    );
    // The live session is untouched.
    first.run("hi").await.unwrap();

    // Closed — even while the host still holds its handle — the id is free again.
    first.close().await.unwrap();
    let second = session().id("call-42").start(&engine).await.unwrap();
    second.run("hi again").await.unwrap();
    assert!(matches!(
        first.run("hello?").await,
        Err(SessionError::Closed)
    ));

    // Dropped without close(): free again once the session closed itself.
    let inspector = second.inspector().unwrap();
    drop(second);
    inspector.wait_until_all_stopped(BOUND).await.unwrap();
    let third = session().id("call-42").start(&engine).await.unwrap();
    assert_eq!(third.id().as_str(), "call-42");
    third.close().await.unwrap();
    assert_eq!(engine.stats().sessions, 0);
}

#[switchboard::test]
async fn ids_the_engine_cannot_carry_are_refused_with_the_reason() {
    let engine = Engine::current().unwrap();
    let long = "x".repeat(SessionId::MAX_LEN + 1);
    for (id, why) in [
        ("", "empty"),
        ("tenant/call-1", "'/'"),
        ("call 1", "whitespace"),
        ("call\t1", "whitespace"),
        ("call\u{7}1", "control"),
        (long.as_str(), "longer than 128 bytes"),
    ] {
        let err = session().id(id).start(&engine).await.unwrap_err();
        match &err {
            SessionError::Build(BuildError::InvalidSessionId { reason, .. }) => {
                assert!(reason.contains(why), "{id:?}: {reason}");
            }
            other => panic!("{id:?} was not refused as invalid: {other:?}"),
        }
    }
    // The error quotes a short prefix of a long id, not all of it.
    let err = session()
        .id("y".repeat(10_000))
        .start(&engine)
        .await
        .unwrap_err();
    assert!(err.to_string().len() < 400, "{err}");
    assert_eq!(engine.stats().sessions, 0);

    // At the limit, and with what a call id holds (Unicode, '@', ':', '.'), it starts.
    for id in [
        "x".repeat(SessionId::MAX_LEN),
        "a84b4c76e66710@pc33.atlanta.com".to_owned(),
        "CA1234:ré".to_owned(),
    ] {
        let session = session().id(id.clone()).start(&engine).await.unwrap();
        assert_eq!(session.id().as_str(), id);
        session.close().await.unwrap();
    }
}

#[switchboard::test]
async fn the_engine_numbering_skips_an_id_a_host_session_holds() {
    let engine = Engine::current().unwrap();
    let chosen = session().id("s2").start(&engine).await.unwrap();
    let first = session().start(&engine).await.unwrap();
    let second = session().start(&engine).await.unwrap();
    assert_eq!(
        [chosen.id(), first.id(), second.id()].map(|id| id.as_str()),
        ["s2", "s1", "s3"]
    );
    // And a host asking for an id the engine gave is refused like any duplicate.
    let err = session().id("s3").start(&engine).await.unwrap_err();
    assert!(
        matches!(err, SessionError::DuplicateSession { .. }),
        "{err}"
    );
    for session in [chosen, first, second] {
        session.close().await.unwrap();
    }
}
