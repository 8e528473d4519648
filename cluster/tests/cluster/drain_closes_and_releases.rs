//! A worker told to stop (SIGTERM) drains: it takes no new session, lets its sessions
//! settle until the deadline, interrupts the one that has not, closes both, writes their
//! owner records as ended, tells their fronts, and exits; new sessions go to the other
//! worker. (Phase 1: the sessions end. With snapshots they will be resumed elsewhere.)

use crate::common;

use async_nats::jetstream;
use common::{event_where, within, WorkerProcess, PATIENCE};
use switchboard_cluster::local::NatsServer;
use switchboard_cluster::{
    EndReason, GatewayError, GatewayOptions, Namespace, OwnerRecord, OwnerState, RemoteEventKind,
    SessionSpec,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_worker_settles_interrupts_closes_and_releases_its_sessions() {
    let _one_at_a_time = common::one_at_a_time().await;
    let server = NatsServer::start().unwrap();
    let mut draining = WorkerProcess::start(&server, "w1", 4, &["--drain-secs", "0.5"]);
    let gateway = common::gateway(&server, GatewayOptions::new()).await;

    // Two sessions on w1: one quiet, one whose reply stalls (it cannot settle).
    let quiet = gateway
        .start_session(SessionSpec::new("greeter"))
        .await
        .unwrap();
    quiet.run("hello").await.unwrap();
    let busy = gateway
        .start_session(SessionSpec::new("greeter"))
        .await
        .unwrap();
    let mut busy_events = busy.subscribe_from(1);
    let stalled = tokio::spawn({
        let busy = busy.clone();
        async move { busy.run("stall until the drain").await }
    });
    event_where(&mut busy_events, "the stalled reply", |kind| {
        matches!(kind, RemoteEventKind::SpeechChunk { .. })
    })
    .await;
    let _other = WorkerProcess::start(&server, "w2", 4, &[]);

    draining.terminate();
    assert_eq!(
        draining.next_line(PATIENCE).as_deref(),
        Some("drained 2"),
        "the worker reports both sessions drained"
    );
    let status = draining
        .wait_exit(PATIENCE)
        .expect("the drained worker exits");
    assert!(status.success(), "{status}");

    // The stalled turn was interrupted at the deadline; both fronts were told.
    let turn = within("the stalled turn", stalled).await.unwrap().unwrap();
    assert!(turn.interrupted, "{turn:?}");
    for (name, session) in [("quiet", &quiet), ("busy", &busy)] {
        let mut events = session.subscribe_from(1);
        event_where(&mut events, &format!("the {name} session's end"), |kind| {
            matches!(
                kind,
                RemoteEventKind::SessionEnded {
                    reason: EndReason::Drained
                }
            )
        })
        .await;
        assert!(matches!(
            session.run("still there?").await,
            Err(GatewayError::Ended {
                reason: EndReason::Drained,
                ..
            })
        ));
    }

    // Their owner records say ended, by w1.
    let client = common::client(&server, "inspector").await;
    let owners = jetstream::new(client.nats().clone())
        .get_key_value(Namespace::default().owners_bucket())
        .await
        .unwrap();
    for session in [&quiet, &busy] {
        let value = owners.get(session.id().as_str()).await.unwrap().unwrap();
        let record: OwnerRecord = serde_json::from_slice(&value).unwrap();
        assert_eq!(
            (record.worker.as_str(), record.state),
            ("w1", OwnerState::Ended)
        );
    }

    // New sessions go to the worker still running.
    let next = within(
        "a start after the drain",
        gateway.start_session(SessionSpec::new("greeter")),
    )
    .await
    .unwrap();
    next.run("hi").await.unwrap();
    next.close().await.unwrap();
    assert_eq!(gateway.worker_info("w2").await.unwrap().started, 1);
}
