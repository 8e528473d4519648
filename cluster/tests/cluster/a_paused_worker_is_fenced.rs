//! A worker frozen (SIGSTOP) in the middle of a turn, past its lease, loses its session:
//! the server itself expires the owner record, another worker process sees the expiry,
//! claims the session one epoch higher and resumes it from its last snapshot; the gateway
//! sends it the input the snapshot lacks and the turn goes on there (run again, or — its
//! `Abandon` tool's call stored before its body started — the call abandoned and the
//! turn's answer lost with the frozen worker). The frozen worker,
//! thawed, finishes its own copy of that turn but can write nothing more — no event
//! anyone reads, no answer, no owner record, no snapshot — and stops the session.

use crate::common;
use switchboard::SessionEvent;

use std::time::Duration;

use common::{event_where, owner_of, snapshot_records, within, OwnerState, WorkerProcess};
use futures_util::{FutureExt, StreamExt};
use serde_json::json;
use switchboard_cluster::local::NatsServer;
use switchboard_cluster::{
    GatewayOptions, Namespace, RemoteEvent, RemoteEventKind, SessionSpec, WorkerInfo,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_paused_past_its_lease_is_fenced_and_its_session_goes_on_elsewhere() {
    let _one_at_a_time = common::one_at_a_time().await;
    let server = NatsServer::start().unwrap();
    let frozen = WorkerProcess::start(&server, "w1", 2, &["--lease-secs", "1"]);
    let gateway = common::gateway(
        &server,
        GatewayOptions::new().attempt_timeout(Duration::from_millis(100)),
    )
    .await;
    // The tool waits 1.5 s on w1, 100 ms on w2.
    let session = gateway
        .start_session(SessionSpec::new("greeter").data(json!({ "tool_ms": 1500 })))
        .await
        .unwrap();
    session.run("before the pause").await.unwrap();
    let mut taker = WorkerProcess::start(
        &server,
        "w2",
        2,
        &["--lease-secs", "1", "--max-tool-ms", "100"],
    );

    let ns = Namespace::default();
    let observer = common::client(&server, "observer").await;
    let mut overheard = observer
        .nats()
        .subscribe(ns.session_events(session.id()))
        .await
        .unwrap();
    observer.nats().flush().await.unwrap();

    // A turn whose tool runs on w1; w1 freezes while it runs.
    let mut events = session.subscribe();
    let turn = tokio::spawn({
        let session = session.clone();
        async move { session.run("wait for the thaw").await }
    });
    event_where(&mut events, "the tool to run on w1", |kind| {
        matches!(
            kind,
            RemoteEventKind::Session {
                event: SessionEvent::LlmMetrics(_)
            }
        )
    })
    .await;
    frozen.freeze();

    // w2 takes the session over: the turn runs again there, or, its call stored before the
    // body started, the call is abandoned and the turn's answer was lost with w1.
    match within("the turn to be answered by the new owner", turn)
        .await
        .unwrap()
    {
        Ok(turn) => assert_eq!(
            turn.assistant_messages().collect::<Vec<_>>(),
            ["Lookup says: waited for the thaw"]
        ),
        Err(switchboard_cluster::GatewayError::AnswerLost { .. }) => {}
        Err(err) => panic!("the turn under way at the freeze: {err}"),
    }
    let owner = owner_of(&observer, session.id()).await.unwrap();
    assert_eq!(
        (owner.worker.as_str(), owner.epoch, owner.state),
        ("w2", 2, OwnerState::Running)
    );

    // What was published before the freeze has long arrived: read it away.
    while let Some(Some(_)) = overheard.next().now_or_never() {}
    frozen.thaw();
    // At its next renewal w1 finds the new owner and stops the session.
    let subject = ns.worker_info("w1");
    let info: WorkerInfo = within("w1 to stop the fenced session", async {
        loop {
            let reply = observer
                .nats()
                .request(subject.clone(), "".into())
                .await
                .unwrap();
            let info: WorkerInfo = serde_json::from_slice(&reply.payload).unwrap();
            if info.fenced == 1 && info.live == 0 {
                break info;
            }
            // Another process's state: asked again shortly.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    println!("w1 after the thaw: {info:?}");

    // w1 wrote nothing after the thaw: every event on the session's subject since then is
    // w2's (epoch 2), the record is w2's, and every snapshot message from w2's claim on is
    // w2's. (A round trip first, so that anything w1 published is here.)
    observer.nats().flush().await.unwrap();
    let mut epochs = Vec::new();
    while let Some(Some(message)) = overheard.next().now_or_never() {
        let event: RemoteEvent = serde_json::from_slice(&message.payload).unwrap();
        epochs.push(event.epoch);
    }
    assert!(
        epochs.iter().all(|e| *e == 2),
        "events published after the thaw, by epoch: {epochs:?}"
    );
    let owner = owner_of(&observer, session.id()).await.unwrap();
    assert_eq!((owner.worker.as_str(), owner.epoch), ("w2", 2));
    let records = snapshot_records(&observer, &ns, session.id()).await;
    let claim = records
        .iter()
        .position(|r| r.worker == "w2")
        .unwrap_or_else(|| panic!("nothing by w2: {records:?}"));
    assert!(
        records[claim..]
            .iter()
            .all(|r| r.worker == "w2" && r.epoch == 2),
        "{records:?}"
    );

    // The session goes on with w2, each input once.
    let after = session.run("after the thaw").await.unwrap();
    assert_eq!(
        after.assistant_messages().collect::<Vec<_>>(),
        ["You said: after the thaw"]
    );
    let history = session.history().await.unwrap();
    assert_eq!(
        history.user_messages(),
        ["before the pause", "wait for the thaw", "after the thaw"]
    );
    taker.assert_one_output_held();
    assert_eq!(gateway.worker_info("w2").await.unwrap().resumed, 1);
}
