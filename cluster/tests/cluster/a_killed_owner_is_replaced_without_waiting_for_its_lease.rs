//! Crash failover by "no responders": a worker killed with SIGKILL closes its connection,
//! so the gateway's next request to it finds nobody subscribed; the gateway asks the pool
//! to claim the session at once, a worker that finds the owner silent too claims it one
//! epoch higher over the record it read, and the caller's next turn is answered well
//! within the default lease (10 s), which is not waited for. Measured: SIGKILL → the next
//! reply, over three kills.

use crate::common;

use std::time::{Duration, Instant};

use common::{owner_of, within, OwnerState, WorkerProcess};
use switchboard_cluster::local::NatsServer;
use switchboard_cluster::{GatewayOptions, SessionSpec};

/// The default lease: what a failover waited before.
const LEASE: Duration = Duration::from_secs(10);
/// How long a connection must have been up before silence counts as a death (the
/// cluster's own rule: after a server restart every client is back by then).
const SETTLED: Duration = Duration::from_secs(2);
const KILLS: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_owner_s_session_answers_its_next_turn_long_before_the_lease() {
    let _one_at_a_time = common::one_at_a_time().await;
    let server = NatsServer::start().unwrap();
    let connected = Instant::now();
    let mut workers: Vec<WorkerProcess> = (1..=KILLS + 1)
        .map(|i| WorkerProcess::start(&server, &format!("w{i}"), 4, &[]))
        .collect();
    let gateway = common::gateway(&server, GatewayOptions::new()).await;
    let observer = common::client(&server, "observer").await;
    let session = gateway
        .start_session(SessionSpec::new("greeter"))
        .await
        .unwrap();
    session.run("hello").await.unwrap();
    // The rule under test trusts silence only on connections up for `SETTLED`: wait for
    // every client of this test to be past that point.
    tokio::time::sleep_until((connected + SETTLED + Duration::from_millis(100)).into()).await;

    let mut waits = Vec::new();
    let mut epoch = 0;
    for kill in 0..KILLS {
        let owner = owner_of(&observer, session.id()).await.unwrap();
        assert!(owner.epoch > epoch, "a new owner each time: {owner:?}");
        epoch = owner.epoch;
        let at = workers
            .iter()
            .position(|w| w.name == owner.worker)
            .expect("the owner is one of the live workers");
        let mut doomed = workers.remove(at);
        doomed.kill();
        let killed = Instant::now();
        let turn = within(
            "the turn after the kill",
            session.run(format!("after {kill}")),
        )
        .await
        .unwrap();
        let waited = killed.elapsed();
        assert_eq!(
            turn.assistant_messages().collect::<Vec<_>>(),
            [format!("You said: after {kill}")]
        );
        assert!(
            waited < LEASE / 3,
            "kill {kill}: the next reply came {waited:?} after the SIGKILL: the lease was waited for"
        );
        waits.push(waited);
        let now = owner_of(&observer, session.id()).await.unwrap();
        assert!(
            now.worker != doomed.name && now.state == OwnerState::Running && now.epoch > epoch,
            "claimed one epoch higher by another worker: {now:?}"
        );
    }
    let stats = gateway.stats();
    assert_eq!(stats.resumes, KILLS as u64, "{stats:?}");
    assert!(stats.silent_owners >= KILLS as u64, "{stats:?}");
    // Each input once, in order, across the three moves.
    let history = within("the history", session.history()).await.unwrap();
    assert_eq!(
        history.user_messages(),
        ["hello", "after 0", "after 1", "after 2"]
    );
    waits.sort();
    println!(
        "SIGKILL -> next reply with the default {LEASE:?} lease: {waits:?} (p50 {:?})",
        waits[KILLS / 2]
    );
}
