//! A burst of 1,000 session starts against four worker processes of capacity 10: no worker
//! ever holds more than 10 sessions, and every session runs exactly once.
//!
//! Two witnesses. The workers' own counts (`WorkerInfo`: started, the most ever live).
//! And one the workers cannot bend: every write to the owners bucket, read back in the
//! server's order through a KV watch; a claim (`Running` for a session not yet live)
//! adds the session to its worker's live set and an `Ended` record removes it. A worker
//! writes `Ended` before it frees the slot, so the live set of a worker at any point of
//! that order is a lower bound of what it held, never an over-count.

use crate::common;

use std::collections::{HashMap, HashSet};

use async_nats::jetstream::kv::Operation;
use common::{within, OwnerRecord, OwnerState, WorkerProcess};
use futures_util::StreamExt;
use switchboard_cluster::local::NatsServer;
use switchboard_cluster::{GatewayOptions, Namespace, SessionSpec};
use tokio::task::JoinSet;

const SESSIONS: usize = 1000;
const WORKERS: usize = 4;
const CAPACITY: usize = 10;

/// What the owners bucket showed.
#[derive(Debug, Default)]
struct Witness {
    claims: HashMap<String, u32>,
    live: HashMap<String, HashSet<String>>,
    most_live: HashMap<String, usize>,
    ended: usize,
    expired: usize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_a_thousand_starts_never_over_admits_and_runs_each_session_once() {
    let _one_at_a_time = common::one_at_a_time().await;
    let server = NatsServer::start().unwrap();
    let workers: Vec<WorkerProcess> = (0..WORKERS)
        .map(|i| WorkerProcess::start(&server, &format!("w{i}"), CAPACITY, &[]))
        .collect();
    let client = common::client(&server, "witness").await;

    // The witness reads every write to the owners bucket from before the first start.
    let js = async_nats::jetstream::new(client.nats().clone());
    let owners = js
        .get_key_value(Namespace::default().owners_bucket())
        .await
        .unwrap();
    let mut writes = owners.watch_all().await.unwrap();
    let witness = tokio::spawn(async move {
        let mut seen = Witness::default();
        while seen.ended < SESSIONS {
            let Some(entry) = writes.next().await else {
                break;
            };
            let entry = entry.unwrap();
            // Worker leases (`lease.<worker>`) and the hosting index (`hosts.…`) share
            // the bucket; session ids have no dots.
            if entry.key.contains('.') {
                continue;
            }
            if entry.operation != Operation::Put {
                seen.expired += 1;
                continue;
            }
            let record: OwnerRecord = serde_json::from_slice(&entry.value).unwrap();
            let live = seen.live.entry(record.worker.clone()).or_default();
            match record.state {
                OwnerState::Running => {
                    if live.insert(entry.key.clone()) {
                        *seen.claims.entry(entry.key.clone()).or_default() += 1;
                    }
                    let most = seen.most_live.entry(record.worker).or_default();
                    *most = (*most).max(live.len());
                }
                OwnerState::Ended => {
                    live.remove(&entry.key);
                    seen.ended += 1;
                }
                _ => {}
            }
        }
        seen
    });

    // The burst: every start at once; each session has a short conversation and closes.
    let gateway = common::gateway(&server, GatewayOptions::new()).await;
    let mut starts = JoinSet::new();
    for i in 0..SESSIONS {
        let gateway = gateway.clone();
        starts.spawn(async move {
            let session = gateway.start_session(SessionSpec::new("greeter")).await?;
            let turn = session.run(format!("hello {i}")).await?;
            assert_eq!(
                turn.assistant_messages().collect::<Vec<_>>(),
                [format!("You said: hello {i}")]
            );
            let history = session.close().await?;
            assert_eq!(history.user_messages(), [format!("hello {i}")]);
            Ok::<_, switchboard_cluster::GatewayError>(session.id().clone())
        });
    }
    let mut ids = HashSet::new();
    while let Some(done) = within("the burst's sessions", starts.join_next()).await {
        let id = done
            .unwrap()
            .unwrap_or_else(|err| panic!("a session of the burst failed: {err}"));
        assert!(ids.insert(id), "two starts got one session id");
    }
    assert_eq!(ids.len(), SESSIONS);

    let seen = within("the witness to see every session end", witness)
        .await
        .unwrap();
    assert_eq!(seen.ended, SESSIONS, "every session ended once: {seen:?}");
    assert_eq!(seen.claims.len(), SESSIONS, "every session was claimed");
    assert!(
        seen.claims.values().all(|&claims| claims == 1),
        "a session was claimed twice"
    );
    assert_eq!(seen.expired, 0, "no lease expired");
    for (worker, most) in &seen.most_live {
        assert!(
            *most <= CAPACITY,
            "{worker} held {most} sessions at once (capacity {CAPACITY})"
        );
    }
    assert!(
        seen.live.values().all(HashSet::is_empty),
        "every slot is free again"
    );

    let mut started = 0;
    for worker in &workers {
        let info = gateway.worker_info(&worker.name).await.unwrap();
        assert!(info.max_live <= CAPACITY, "{info:?}");
        assert_eq!((info.live, info.refused), (0, 0), "{info:?}");
        started += info.started;
    }
    assert_eq!(
        started, SESSIONS as u64,
        "the workers started each session once"
    );
    let stats = gateway.stats();
    assert_eq!(stats.sessions_started, SESSIONS as u64);
    println!(
        "burst: {stats:?}; most live per worker {:?}",
        seen.most_live
    );
}
