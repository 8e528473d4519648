//! The worker you deploy (`switchboard_cluster::runtime`), as a real process against a
//! real server: its health server says it is alive and ready with its free slots, its
//! metrics count what it did, and on SIGTERM it turns unready at once, drains its
//! sessions to another worker and exits 0.

use crate::common;

use std::time::Duration;

use common::{event_where, http_get, metric, within, WorkerProcess, PATIENCE};
use switchboard_cluster::local::NatsServer;
use switchboard_cluster::{GatewayOptions, RemoteEventKind, SessionSpec};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployed_worker_reports_its_health_and_drains_on_sigterm() {
    let _one_at_a_time = common::one_at_a_time().await;
    let server = NatsServer::start().unwrap();
    // A drain deadline long enough to look at the draining worker, short enough for a test.
    let mut worker = WorkerProcess::start(&server, "w1", 3, &["--drain-secs", "2"]);
    let health = worker
        .health
        .clone()
        .expect("the worker says where it listens");

    // Alive and ready, with all its slots free.
    let (code, body) = http_get(&health, "/healthz").await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = http_get(&health, "/readyz").await;
    assert_eq!(code, 200, "{body}");
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        status,
        serde_json::json!({
            "worker": "w1", "ready": true, "connected": true, "draining": false,
            "capacity": 3, "live": 0, "free_slots": 3
        })
    );

    // Two sessions, one turn each, and one turn that will not settle by itself.
    let gateway = common::gateway(&server, GatewayOptions::new()).await;
    let calm = gateway
        .start_session(SessionSpec::new("greeter"))
        .await
        .unwrap();
    calm.run("hello").await.unwrap();
    let stalled = gateway
        .start_session(SessionSpec::new("greeter"))
        .await
        .unwrap();
    let mut stalled_events = stalled.subscribe_from(1);
    let stalled_turn = tokio::spawn({
        let stalled = stalled.clone();
        async move { stalled.run("stall please").await }
    });
    // Its reply has begun: the worker applied the input.
    event_where(&mut stalled_events, "the stalled reply", |kind| {
        matches!(kind, RemoteEventKind::SpeechChunk { .. })
    })
    .await;

    let (code, metrics) = http_get(&health, "/metrics").await;
    assert_eq!(code, 200);
    assert_eq!(metric(&metrics, "switchboard_worker_capacity"), 3.0);
    assert_eq!(metric(&metrics, "switchboard_worker_sessions"), 2.0);
    assert_eq!(metric(&metrics, "switchboard_worker_free_slots"), 1.0);
    assert_eq!(
        metric(&metrics, "switchboard_worker_jobs_pulled_total"),
        2.0
    );
    assert_eq!(
        metric(&metrics, "switchboard_worker_sessions_started_total"),
        2.0
    );
    assert_eq!(
        metric(&metrics, "switchboard_worker_inputs_applied_total"),
        2.0
    );
    assert!(
        metric(&metrics, "switchboard_worker_snapshot_writes_total") >= 2.0,
        "{metrics}"
    );
    assert_eq!(
        metric(&metrics, "switchboard_worker_snapshot_write_failures_total"),
        0.0
    );
    assert_eq!(metric(&metrics, "switchboard_nats_connected"), 1.0);
    assert_eq!(metric(&metrics, "switchboard_worker_draining"), 0.0);
    assert!(
        metric(&metrics, "switchboard_engine_actors") >= 4.0,
        "{metrics}"
    );

    // SIGTERM: unready at once, while the stalled turn holds the drain to its deadline.
    let mut taker = WorkerProcess::start(&server, "w2", 3, &[]);
    worker.terminate();
    let began = std::time::Instant::now();
    let draining = within("the worker to say it drains", async {
        loop {
            let (code, body) = http_get(&health, "/readyz").await;
            if code == 503 {
                return body;
            }
            assert_eq!(code, 200, "{body}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let status: serde_json::Value = serde_json::from_str(&draining).unwrap();
    assert_eq!(status["draining"], true, "{draining}");
    assert_eq!(status["ready"], false, "{draining}");
    assert!(
        began.elapsed() < Duration::from_secs(2),
        "unready only after {:?}, not at once",
        began.elapsed()
    );
    let (_, metrics) = http_get(&health, "/metrics").await;
    assert_eq!(metric(&metrics, "switchboard_worker_draining"), 1.0);
    assert_eq!(metric(&metrics, "switchboard_worker_ready"), 0.0);

    // It drains both sessions to w2 and exits 0.
    assert_eq!(worker.next_line(PATIENCE).as_deref(), Some("drained 2"));
    let status = worker
        .wait_exit(PATIENCE)
        .expect("the drained worker exits");
    assert!(status.success(), "{status}");
    within("the stalled turn's answer", stalled_turn)
        .await
        .unwrap()
        .expect("the interrupted turn answers its caller");
    let after = within("a turn on the new owner", calm.run("still there?"))
        .await
        .unwrap();
    assert_eq!(
        after.assistant_messages().collect::<Vec<_>>(),
        ["You said: still there?"]
    );
    // The stalled session answered its caller on w1 (interrupted at the deadline) and
    // may still be on its way to w2: its resume is counted once it lands.
    within("both sessions resumed on w2", async {
        while gateway.worker_info("w2").await.unwrap().resumed < 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(gateway.worker_info("w2").await.unwrap().resumed, 2);
    taker.assert_one_output_held();
}
