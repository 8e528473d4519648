//! A front that vanishes without closing its session does not hold a worker's slot
//! forever: after the worker's idle timeout with no input, the session closes, its owner
//! record says ended, and the slot is free (the next session starts on it, never two
//! live at once).

use crate::common;

use common::{event_where, WorkerProcess};
use switchboard_cluster::local::NatsServer;
use switchboard_cluster::{CloseReason, GatewayOptions, RemoteEventKind, SessionSpec};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_without_input_for_the_idle_timeout_closes_and_frees_its_slot() {
    let _one_at_a_time = common::one_at_a_time().await;
    let server = NatsServer::start().unwrap();
    let _worker = WorkerProcess::start(&server, "w1", 1, &["--idle-secs", "0.3"]);
    let gateway = common::gateway(&server, GatewayOptions::new()).await;

    let abandoned = gateway
        .start_session(SessionSpec::new("greeter"))
        .await
        .unwrap();
    abandoned.run("hello?").await.unwrap();
    let mut events = abandoned.subscribe_from(1);
    event_where(&mut events, "the idle session's end", |kind| {
        matches!(
            kind,
            RemoteEventKind::SessionClosed {
                reason: CloseReason::Idle
            }
        )
    })
    .await;

    // The only slot is free again: the next session starts (its job waits in the queue
    // until a slot is free). Nothing is sent to it: with an idle timeout of 0.3 s, an
    // input sent after the start races that very timeout, and a loaded machine loses the
    // race (the session closed `Idle` before its first input came, a flaky failure).
    let _next = gateway
        .start_session(SessionSpec::new("greeter"))
        .await
        .unwrap();
    let info = gateway.worker_info("w1").await.unwrap();
    assert_eq!((info.started, info.max_live), (2, 1), "{info:?}");
}
