//! Production runs three NATS servers with every stream and the owners bucket replicated
//! on all three (R3). Here three servers on loopback ports: one of them is killed — the one
//! that leads the snapshots stream, so JetStream must elect another — while a worker and a
//! gateway hold sessions. No session, snapshot or input is lost: every session
//! answers its next turn, a worker killed afterwards has its sessions resumed elsewhere from
//! the snapshots written through the loss, and every input the gateway accepted is in each
//! conversation exactly once, in order.

use crate::common;

use std::time::Instant;

use common::{credentials_for, within, WorkerProcess};
use switchboard_cluster::local::NatsCluster;
use switchboard_cluster::{Gateway, GatewayOptions, Namespace, SessionSpec};
use tokio::task::JoinSet;

const SESSIONS: usize = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_one_of_three_servers_loses_no_session_snapshot_or_input() {
    let _one_at_a_time = common::one_at_a_time().await;
    let mut nats = NatsCluster::start().unwrap();
    let (url, mut args) = (nats.url(), credentials_for(nats.auth()));
    // A short lease, so that w1's death below costs seconds: while the server is lost,
    // w1 is the only worker, so nobody claims its sessions whatever the election takes.
    args.extend(["--replicas", "3", "--lease-secs", "2"].map(String::from));
    let worker = |name: &str| WorkerProcess::start_with(&url, name, SESSIONS, &args);
    let mut w1 = worker("w1");
    let client = nats.connect().name("test-gateway").connect().await.unwrap();
    let gateway = Gateway::new(client.clone(), GatewayOptions::new());

    // What the worker provisioned is replicated on all three servers.
    let js = async_nats::jetstream::new(client.nats().clone());
    let ns = Namespace::default();
    let owners_stream = format!("KV_{}", ns.owners_bucket());
    for stream in [
        ns.jobs_stream(),
        owners_stream.clone(),
        ns.snapshots_stream(),
    ] {
        let mut stream = js.get_stream(&stream).await.unwrap();
        let info = stream.info().await.unwrap();
        assert_eq!(info.config.num_replicas, 3, "{}", info.config.name);
    }

    // Every session starts on w1 and has a first turn.
    let mut sessions = Vec::new();
    for i in 0..SESSIONS {
        let session = gateway
            .start_session(SessionSpec::new("greeter"))
            .await
            .unwrap();
        session.run(format!("s{i} before")).await.unwrap();
        sessions.push(session);
    }

    // The server that leads the snapshots stream dies: the next snapshots are written
    // once the other two elected a new leader.
    let mut snapshots = js.get_stream(ns.snapshots_stream()).await.unwrap();
    let leader = snapshots
        .info()
        .await
        .unwrap()
        .cluster
        .clone()
        .and_then(|c| c.leader)
        .expect("the snapshots stream has a leader");
    let dead = nats.index_of(&leader).expect("a server of the cluster");
    nats.kill(dead);
    let killed = Instant::now();

    // Every session answers its next turn, through the election.
    let mut turns = JoinSet::new();
    for (i, session) in sessions.iter().enumerate() {
        let session = session.clone();
        turns.spawn(async move { (i, session.run(format!("s{i} during")).await) });
    }
    while let Some(done) = within("the turns after the server's loss", turns.join_next()).await {
        let (i, result) = done.unwrap();
        let turn = result.unwrap_or_else(|err| panic!("session {i} after the loss: {err}"));
        assert_eq!(
            turn.assistant_messages().collect::<Vec<_>>(),
            [format!("You said: s{i} during")]
        );
    }
    println!(
        "every session answered {:?} after {leader} died",
        killed.elapsed()
    );

    // w1 dies too: w2 resumes every session from the snapshots written through the loss.
    let mut w2 = worker("w2");
    w1.kill();
    for (i, session) in sessions.iter().enumerate() {
        let turn = within(
            "a turn on the new owner",
            session.run(format!("s{i} after")),
        )
        .await
        .unwrap_or_else(|err| panic!("session {i} on w2: {err}"));
        assert_eq!(
            turn.assistant_messages().collect::<Vec<_>>(),
            [format!("You said: s{i} after")]
        );
    }
    let info = within("w2's counts", gateway.worker_info("w2"))
        .await
        .unwrap();
    assert_eq!(info.resumed, SESSIONS as u64, "{info:?}");

    // Each conversation holds every input once, in order.
    for (i, session) in sessions.iter().enumerate() {
        let history = within("a history", session.history()).await.unwrap();
        assert_eq!(
            history.user_messages(),
            [
                format!("s{i} before"),
                format!("s{i} during"),
                format!("s{i} after")
            ]
        );
    }
    w2.assert_one_output_held();

    // The dead server comes back and rejoins.
    nats.start_again(dead).unwrap();
}
