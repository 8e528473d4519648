//! A worker frozen (SIGSTOP) past its lease loses its session: the server itself expires
//! the owner record, a new owner takes the session with a higher epoch (here the test
//! writes that claim, as a phase-2 worker resuming from a snapshot will), and the worker,
//! thawed, stops the session without writing anything more — no event, no answer, no
//! owner record.

use crate::common;

use std::time::Duration;

use async_nats::jetstream::{self, kv::Operation, message::PublishMessage};
use common::{within, WorkerProcess};
use futures_util::{FutureExt, StreamExt};
use switchboard_cluster::local::NatsServer;
use switchboard_cluster::{
    GatewayError, GatewayOptions, Namespace, OwnerRecord, OwnerState, SessionSpec, WorkerInfo,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_paused_past_its_lease_stops_without_writing() {
    let _one_at_a_time = common::one_at_a_time().await;
    let server = NatsServer::start().unwrap();
    let worker = WorkerProcess::start(&server, "w1", 2, &["--lease-secs", "1"]);
    let gateway = common::gateway(
        &server,
        GatewayOptions::new()
            .attempt_timeout(Duration::from_millis(100))
            .input_deadline(Duration::from_millis(500)),
    )
    .await;
    let session = gateway
        .start_session(SessionSpec::new("greeter"))
        .await
        .unwrap();
    session.run("before the pause").await.unwrap();

    let ns = Namespace::default();
    let observer = common::client(&server, "observer").await;
    let js = jetstream::new(observer.nats().clone());
    let owners = js.get_key_value(ns.owners_bucket()).await.unwrap();
    let mut record_changes = owners.watch(session.id().as_str()).await.unwrap();
    let mut overheard = observer
        .nats()
        .subscribe(ns.session_events(session.id()))
        .await
        .unwrap();

    worker.freeze();
    // Nobody renews: the server removes the record when its TTL runs out.
    let expired = within("the lease to expire", async {
        loop {
            let entry = record_changes.next().await.unwrap().unwrap();
            if entry.operation != Operation::Put {
                break entry;
            }
        }
    })
    .await;
    // A new owner claims it over the marker, at a higher epoch.
    let claim = OwnerRecord {
        worker: "w2".into(),
        epoch: 2,
        state: OwnerState::Running,
    };
    let key = format!("$KV.{}.{}", ns.owners_bucket(), session.id());
    let message = PublishMessage::build()
        .payload(serde_json::to_vec(&claim).unwrap().into())
        .expected_last_subject_sequence(expired.revision)
        .ttl(Duration::from_secs(60));
    js.send_publish(key, message).await.unwrap().await.unwrap();

    worker.thaw();
    // At its next renewal the worker finds the new owner and stops the session.
    let subject = ns.worker_info("w1");
    let info: WorkerInfo = within("the worker to stop the fenced session", async {
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
    assert_eq!(info.ended, 1, "{info:?}");

    // It wrote nothing: no event reached this connection before the worker's last answer
    // did, and the record is the new owner's.
    assert!(
        overheard.next().now_or_never().is_none(),
        "the fenced worker published after losing its lease"
    );
    let record: OwnerRecord =
        serde_json::from_slice(&owners.get(session.id().as_str()).await.unwrap().unwrap()).unwrap();
    assert_eq!(record, claim);
    // Nobody answers for the session now (phase 1 has no resume yet).
    assert!(matches!(
        session.run("after the pause").await,
        Err(GatewayError::Unreachable { .. })
    ));
}
