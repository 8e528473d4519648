//! SPEC §8 "Speaking from inside", §2a: a host part that must not keep a call alive holds
//! a `WeakSession`. It upgrades while the session lives; when the host's last strong
//! handle is dropped the session closes as it always does — every actor gone — whatever
//! weak handles remain, and they upgrade to `None` from then on.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::Query;
use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{Reply, ScriptedLlm};
use switchboard::{SessionState, WeakSession};

const BOUND: Duration = Duration::from_secs(60);

/// A weak handle crosses tasks and threads and is cloned freely.
#[test]
fn a_weak_handle_is_send_sync_and_clone() {
    fn check<T: Send + Sync + Clone + 'static>() {}
    check::<WeakSession>();
}

/// A tool that updates once and then runs until it is cancelled.
fn background_job() -> Tool {
    Tool::new(
        "job",
        "Runs in the background",
        |ctx: RunContext, _: Query| async move {
            ctx.update("started").await?;
            ctx.cancelled().await;
            Ok::<_, ToolFailure>("stopped")
        },
    )
}

async fn busy_session(engine: &Engine) -> Session {
    let session = Session::builder()
        .llm(ScriptedLlm::new([
            Reply::tool_call("job", json!({"q": "a"})),
            Reply::text("Started."),
        ]))
        .agent(
            Agent::builder("agent")
                .tool(background_job())
                .build()
                .unwrap(),
        )
        .inspect(true)
        .start(engine)
        .await
        .unwrap();
    session.run("start the job").await.unwrap();
    session
}

#[switchboard::test]
async fn dropping_the_last_strong_handle_closes_the_session_whatever_weak_handles_remain() {
    tokio::time::pause();
    let engine = Engine::current().unwrap();
    let session = busy_session(&engine).await;
    let inspector = session.inspector().unwrap();
    assert_eq!(
        inspector.live_actors().len(),
        4,
        "{:?}",
        inspector.live_actors()
    );

    let weak = session.downgrade();
    let other = weak.clone();
    // While the session lives, a weak handle upgrades to a working handle.
    let upgraded = weak.upgrade().unwrap();
    assert_eq!(upgraded.id(), session.id());
    assert_eq!(upgraded.summary().state, SessionState::Inactive);
    drop(upgraded);

    drop(session);
    inspector.wait_until_all_stopped(BOUND).await.unwrap();
    assert!(weak.upgrade().is_none());
    assert!(other.upgrade().is_none());
    assert_eq!(weak.id().as_str(), "s1", "the id stays readable for logs");
    let stats = engine.stats();
    assert_eq!((stats.sessions, stats.actors, stats.tool_runs), (0, 0, 0));
}

#[switchboard::test]
async fn a_host_task_holding_a_weak_handle_ends_with_the_call() {
    tokio::time::pause();
    let engine = Engine::current().unwrap();
    let session = busy_session(&engine).await;
    let inspector = session.inspector().unwrap();

    // A watchdog that checks on the caller every few seconds, for as long as the call
    // lasts: it must not be what keeps the call going.
    let weak = session.downgrade();
    let watchdog = actix::spawn(async move {
        let mut checks = 0u32;
        let mut every = tokio::time::interval(Duration::from_secs(5));
        loop {
            every.tick().await;
            let Some(session) = weak.upgrade() else {
                return checks;
            };
            checks += 1;
            if session.user_state() == UserState::Away {
                let _ = session.say("Are you still there?").await;
            }
        }
    });
    // The call goes on for a while (virtual time): the watchdog checks on it.
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert!(inspector.is_alive("session/s1"));

    // The caller hangs up: the host drops its handle.
    drop(session);
    inspector.wait_until_all_stopped(BOUND).await.unwrap();
    let checks = tokio::time::timeout(BOUND, watchdog)
        .await
        .expect("the watchdog did not end after the call ended")
        .unwrap();
    assert!(checks >= 3, "{checks} checks");
    assert_eq!(engine.stats().actors, 0);
}
