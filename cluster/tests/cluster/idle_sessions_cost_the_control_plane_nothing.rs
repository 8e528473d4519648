//! Idle sessions cost the control plane nothing: a session's owner record is written when
//! the session is claimed, moved or ended, never while it runs; only each worker's one
//! lease is renewed (every third of the lease). A witness reads every write to the owners
//! bucket while the sessions sit idle and sorts them by key.
//!
//! The default size (200 sessions, a 1 s lease, 5 s) runs in the suite; the figure in
//! BENCHMARKS.md ("The cluster") is 1,000 sessions with the default 10 s lease:
//! `IDLE_SESSIONS=1000 IDLE_LEASE_SECS=10 IDLE_WINDOW_SECS=30 cargo test --release -p
//! switchboard-cluster-tests --test cluster idle_sessions -- --nocapture`.

use crate::common;

use std::time::{Duration, Instant};

use common::{within, WorkerProcess};
use futures_util::StreamExt;
use switchboard_cluster::local::NatsServer;
use switchboard_cluster::{GatewayOptions, Namespace, SessionSpec};
use tokio::task::JoinSet;

const WORKERS: usize = 2;

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sessions_write_nothing_to_the_owners_bucket_only_worker_leases_are_renewed() {
    let _one_at_a_time = common::one_at_a_time().await;
    let sessions = setting("IDLE_SESSIONS", 200) as usize;
    let lease = setting("IDLE_LEASE_SECS", 1);
    let window = Duration::from_secs(setting("IDLE_WINDOW_SECS", 5));
    let server = NatsServer::start().unwrap();
    let capacity = sessions.div_ceil(WORKERS) + 1;
    let lease_flag = lease.to_string();
    let _workers: Vec<WorkerProcess> = (0..WORKERS)
        .map(|i| {
            WorkerProcess::start(
                &server,
                &format!("w{i}"),
                capacity,
                &["--lease-secs", &lease_flag],
            )
        })
        .collect();
    let gateway = common::gateway(&server, GatewayOptions::new()).await;

    // Every session takes one turn, then sits idle.
    let mut started = JoinSet::new();
    for i in 0..sessions {
        let gateway = gateway.clone();
        started.spawn(async move {
            let session = gateway
                .start_session(SessionSpec::new("greeter"))
                .await
                .unwrap_or_else(|err| panic!("session {i} did not start: {err}"));
            session.run("hello").await.unwrap();
            session
        });
    }
    let mut live = Vec::new();
    while let Some(session) = within("every session's first turn", started.join_next()).await {
        live.push(session.unwrap());
    }

    // The witness: every write to the owners bucket from now on.
    let client = common::client(&server, "witness").await;
    let owners = async_nats::jetstream::new(client.nats().clone())
        .get_key_value(Namespace::default().owners_bucket())
        .await
        .unwrap();
    let mut writes = owners.watch_all().await.unwrap();
    let began = Instant::now();
    let (mut session_writes, mut lease_writes, mut other_writes) = (0u64, 0u64, 0u64);
    while let Ok(Some(entry)) =
        tokio::time::timeout_at((began + window).into(), writes.next()).await
    {
        let key = entry.unwrap().key;
        if key.starts_with("lease.") {
            lease_writes += 1;
        } else if key.contains('.') {
            other_writes += 1;
        } else {
            session_writes += 1;
        }
    }
    let seconds = began.elapsed().as_secs_f64();
    // Every worker watches the leases (and only them): each lease write reaches each.
    println!(
        "{sessions} idle sessions on {WORKERS} workers, lease {lease} s, {seconds:.1} s: \
         {:.2} writes/s to session records, {:.2} lease writes/s, {:.2} other writes/s; \
         watch deliveries {:.2}/s",
        session_writes as f64 / seconds,
        lease_writes as f64 / seconds,
        other_writes as f64 / seconds,
        (lease_writes * WORKERS as u64) as f64 / seconds,
    );
    assert_eq!(session_writes, 0, "an idle session's record was written");
    assert_eq!(
        other_writes, 0,
        "the hosting index changed while nothing did"
    );
    // Each worker renews every third of the lease: about 3 a lease, a few more at most.
    let renewals = window.as_secs_f64() / (lease as f64 / 3.0);
    assert!(
        lease_writes as f64 >= WORKERS as f64 * (renewals - 2.0)
            && lease_writes as f64 <= WORKERS as f64 * (renewals + 2.0),
        "{lease_writes} lease writes in {seconds:.1} s for {WORKERS} workers"
    );

    // And they are live: each answers.
    for session in &live[..live.len().min(10)] {
        within("a turn after the idle time", session.run("still there?"))
            .await
            .unwrap();
    }
}
