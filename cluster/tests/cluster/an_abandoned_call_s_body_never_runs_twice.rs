//! A tool whose restore policy is `Abandon` (the default, and what side-effecting tools
//! keep: a card charge) must never run twice for one call, whatever happens to the worker
//! running it. Here the worker is killed (SIGKILL) while the body runs; the session goes
//! on elsewhere; the body must have started once in all.
//!
//! Why it holds: a session that saves to a store starts an `Abandon` body only once a
//! stored snapshot holds its call (the engine's `RecordCall`), so the next owner restores
//! the call as running and abandons it ("Interrupted before it finished.") instead of
//! asking the model again; the turn under way answers, or says its answer was lost.
//! Found by the fault campaign (`a_fault_campaign_loses_nothing.rs`), which counts such
//! runs.

use crate::common;

use common::{within, WorkerProcess, PATIENCE};
use serde_json::json;
use switchboard_cluster::local::NatsServer;
use switchboard_cluster::{GatewayError, GatewayOptions, SessionSpec};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_call_s_body_never_runs_twice_across_a_kill() {
    let _one_at_a_time = common::one_at_a_time().await;
    let server = NatsServer::start().unwrap();
    let mut doomed = WorkerProcess::start(&server, "w1", 1, &["--lease-secs", "1"]);
    let gateway = common::gateway(&server, GatewayOptions::new()).await;
    let spec = SessionSpec::new("greeter").data(json!({ "tool_ms": 60_000 }));
    let session = gateway.start_session(spec).await.unwrap();
    session.run("hello").await.unwrap();
    let mut survivor = WorkerProcess::start(
        &server,
        "w2",
        1,
        &["--lease-secs", "1", "--max-tool-ms", "100"],
    );

    // The charge starts on w1; w1 dies while it runs.
    let turn = tokio::spawn({
        let session = session.clone();
        async move { session.run("wait for card-1").await }
    });
    loop {
        match doomed.next_line(PATIENCE) {
            Some(line) if line == "effect wait card-1 start" => break,
            Some(_) => {}
            None => panic!("waiting for the charge to start on w1"),
        }
    }
    doomed.kill();

    // The session goes on on w2; the turn under way answers, or says its answer was lost.
    match within("the turn under way at the kill", turn)
        .await
        .unwrap()
    {
        Ok(_) | Err(GatewayError::AnswerLost { .. }) => {}
        Err(err) => panic!("the turn under way at the kill: {err}"),
    }
    within("a turn after the kill", session.run("after"))
        .await
        .unwrap();
    let mut lines = doomed.lines_so_far();
    lines.extend(survivor.lines_so_far());
    let charges = lines
        .iter()
        .filter(|line| *line == "effect wait card-1 start")
        .count()
        // The one read above, on w1.
        + 1;
    assert_eq!(
        charges, 1,
        "the Abandon body ran {charges} times: {lines:?}"
    );
}
