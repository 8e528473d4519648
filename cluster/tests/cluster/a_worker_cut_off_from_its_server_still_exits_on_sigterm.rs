//! A worker told to stop (SIGTERM) after its NATS server went away drains and exits
//! within its drain's bound, however long the server stays away: its drain cannot store
//! or hand over anything, but it never waits on the server for ever (an orchestrator
//! would have to SIGKILL it, and the never-hangs promise is that it does not).

use crate::common;

use std::time::{Duration, Instant};

use common::{within, WorkerProcess, PATIENCE};
use switchboard_cluster::local::NatsServer;
use switchboard_cluster::{GatewayOptions, SessionSpec};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_cut_off_from_its_server_still_exits_on_sigterm() {
    let _one_at_a_time = common::one_at_a_time().await;
    let mut server = NatsServer::start().unwrap();
    let mut worker = WorkerProcess::start(&server, "w1", 2, &["--drain-secs", "1"]);
    let gateway = common::gateway(&server, GatewayOptions::new()).await;
    let session = gateway
        .start_session(SessionSpec::new("greeter"))
        .await
        .unwrap();
    within("a turn", session.run("hello")).await.unwrap();

    server.kill();
    let told = Instant::now();
    worker.terminate();
    // The drain's own bound: its deadline, the close grace (5 s) and the pull's wait
    // (1 s), then a bounded goodbye to the server; nothing waits for the server to return.
    if worker.wait_exit(PATIENCE).is_none() {
        panic!("the worker still runs {PATIENCE:?} after SIGTERM with its server gone");
    }
    let took = told.elapsed();
    assert!(
        took < Duration::from_secs(12),
        "the drain took {took:?}, past its bound"
    );
}
