//! The memory of closed sessions goes back to the system: by the engine itself once its
//! last session is gone (`IdleRelease`), or when the host asks (`release_memory`).
//! Driven from a tokio host, as a server would; the release runs on a real thread, so
//! waits are bounded in real time and fail saying what they waited for.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::num::NonZeroU64;
use std::time::Duration;

use switchboard::memory::{IdleRelease, IdleReleased, IdleReleases, MemoryRelease};
use switchboard::prelude::*;
use switchboard::testing::{Reply, ScriptedLlm};
use switchboard::SessionBuilder;

/// Far above a release's few milliseconds; only reached if the release never comes.
const BOUND: Duration = Duration::from_secs(20);

fn after(n: u64) -> IdleRelease {
    IdleRelease::AfterPeak(NonZeroU64::new(n).unwrap())
}

fn engine_and_sessions() -> (Engine, impl Fn() -> SessionBuilder) {
    let engine = Engine::with_arbiters(2).unwrap();
    let llm = ScriptedLlm::new([]);
    llm.otherwise(Reply::text("hello"));
    let agent = Agent::builder("agent-a").build().unwrap();
    let start = move || Session::builder().llm(llm.clone()).agent(agent.clone());
    (engine, start)
}

async fn start_n(engine: &Engine, start: &impl Fn() -> SessionBuilder, n: usize) -> Vec<Session> {
    let mut sessions = Vec::new();
    for _ in 0..n {
        sessions.push(start().start(engine).await.unwrap());
    }
    sessions
}

async fn close_all(sessions: Vec<Session>) {
    for session in sessions {
        session.close().await.unwrap();
    }
}

async fn next_release(releases: &mut IdleReleases, waiting_for: &str) -> IdleReleased {
    match tokio::time::timeout(BOUND, releases.next()).await {
        Ok(Some(released)) => released,
        Ok(None) => panic!("the engine was dropped while waiting for {waiting_for}"),
        Err(_) => panic!("no idle release within {BOUND:?}: waited for {waiting_for}"),
    }
}

fn assert_allocator_answered(release: MemoryRelease) {
    if cfg!(all(target_os = "linux", target_env = "gnu")) {
        assert_ne!(release, MemoryRelease::Unsupported);
    } else {
        assert_eq!(release, MemoryRelease::Unsupported);
    }
}

#[test]
fn the_engine_releases_nothing_by_default_and_a_burst_setting_turns_it_on() {
    let engine = Engine::with_arbiters(1).unwrap();
    assert_eq!(engine.idle_release(), IdleRelease::Never);
    assert_eq!(IdleRelease::default(), IdleRelease::DEFAULT);
    engine.set_idle_release(IdleRelease::AFTER_BURST);
    assert_eq!(engine.idle_release(), after(1000));
    engine.set_idle_release(IdleRelease::Never);
    assert_eq!(engine.idle_release(), IdleRelease::Never);
    engine.shutdown();
}

/// The release waits for both conditions: no live session, after a peak of enough live at
/// once. The report says which release it is and the peak it followed: a release at a
/// wrong moment would have come first, with a lower peak.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_releases_once_its_last_session_is_gone_after_a_high_enough_peak() {
    let (engine, start) = engine_and_sessions();
    engine.set_idle_release(after(3));
    let mut releases = engine.idle_releases();

    // A peak of two, then none live: too low for a release.
    close_all(start_n(&engine, &start, 2).await).await;
    // Sessions one after another never raise the peak, however many go.
    for _ in 0..5 {
        close_all(start_n(&engine, &start, 1).await).await;
    }
    // A peak of three; two go, but one is still live.
    let mut three = start_n(&engine, &start, 3).await;
    let last = three.pop().unwrap();
    close_all(three).await;
    let result = last.run("hi").await.unwrap();
    assert_eq!(result.assistant_messages().collect::<Vec<_>>(), ["hello"]);
    // The last one goes: none live after a peak of three.
    close_all(vec![last]).await;

    let released = next_release(&mut releases, "the release after the peak of three").await;
    assert_eq!((released.nth, released.peak_live), (1, 3), "{released:?}");
    assert_allocator_answered(released.release);

    // The peak starts again after a release, and the engine goes on.
    close_all(start_n(&engine, &start, 4).await).await;
    let released = next_release(&mut releases, "the release after a peak of four").await;
    assert_eq!((released.nth, released.peak_live), (2, 4), "{released:?}");
    engine.shutdown();
}

/// `Never` holds the engine back whatever the peak, and a release the host asks for
/// restarts the peak, so the engine does not trim again right after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_and_a_host_release_hold_the_engine_release_back() {
    let (engine, start) = engine_and_sessions();
    let mut releases = engine.idle_releases();

    engine.set_idle_release(IdleRelease::Never);
    close_all(start_n(&engine, &start, 3).await).await;
    engine.set_idle_release(after(3));
    // The peak of three under `Never` still counts: the next drain is the moment.
    close_all(start_n(&engine, &start, 1).await).await;
    let released = next_release(&mut releases, "the release after the peak under Never").await;
    assert_eq!((released.nth, released.peak_live), (1, 3), "{released:?}");

    engine.set_idle_release(IdleRelease::Never);
    close_all(start_n(&engine, &start, 3).await).await;
    assert_allocator_answered(engine.release_memory().await);
    engine.set_idle_release(after(3));
    // The peak of three before the host's release no longer counts.
    close_all(start_n(&engine, &start, 1).await).await;
    close_all(start_n(&engine, &start, 3).await).await;
    let released = next_release(&mut releases, "the release after a new peak of three").await;
    assert_eq!((released.nth, released.peak_live), (2, 3), "{released:?}");
    engine.shutdown();
}

/// The pages of a burst of closed sessions go back to the system when the host asks, and
/// the engine goes on starting sessions after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_memory_after_a_burst_of_sessions_and_the_engine_goes_on() {
    let (engine, start) = engine_and_sessions();
    // The host trims itself; the engine's own release would race it for the free pages.
    engine.set_idle_release(IdleRelease::Never);
    close_all(start_n(&engine, &start, 2_000).await).await;

    let released = engine.release_memory().await;
    if cfg!(all(target_os = "linux", target_env = "gnu")) {
        // Two thousand sessions' chunks were freed on the arbiters: glibc has pages to
        // return.
        assert_eq!(released, MemoryRelease::Released);
    } else {
        assert_eq!(released, MemoryRelease::Unsupported);
    }

    let session = start().start(&engine).await.unwrap();
    let result = session.run("hi").await.unwrap();
    assert_eq!(result.assistant_messages().collect::<Vec<_>>(), ["hello"]);
    session.close().await.unwrap();
    engine.shutdown();
}

/// A release needs the engine's own count, not the host's handles: dropping every handle
/// without `close()` counts the sessions as gone once their actors are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_sessions_count_as_gone_once_their_actors_are() {
    let (engine, start) = engine_and_sessions();
    engine.set_idle_release(after(3));
    let mut releases = engine.idle_releases();
    drop(start_n(&engine, &start, 3).await);
    let released = next_release(&mut releases, "the release after three dropped sessions").await;
    assert_eq!((released.nth, released.peak_live), (1, 3), "{released:?}");
    engine.shutdown();
}

/// A closed session whose handle the host still holds keeps its memory (its history):
/// the release waits until the host drops it, rather than trimming while nothing of the
/// session can be given back and never again after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_waits_for_the_hosts_handles_of_closed_sessions() {
    let (engine, start) = engine_and_sessions();
    engine.set_idle_release(after(3));
    let mut releases = engine.idle_releases();
    // Three sessions close; the host keeps their handles (to read their histories later).
    let kept = start_n(&engine, &start, 3).await;
    for session in &kept {
        session.close().await.unwrap();
    }
    assert_eq!(engine.stats().actors, 0);
    // A fourth call comes and goes while the three are held: four at once.
    close_all(start_n(&engine, &start, 1).await).await;
    // The host lets the three go: now nothing of any session is left.
    drop(kept);
    let released = next_release(&mut releases, "the release once the handles went").await;
    // A release as the three closed would have been the first, after a peak of three,
    // and the fourth's end (a peak of one) none.
    assert_eq!((released.nth, released.peak_live), (1, 4), "{released:?}");
    assert_allocator_answered(released.release);
    engine.shutdown();
}
