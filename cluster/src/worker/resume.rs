//! The lease watch: every worker watches the worker leases (`lease.rs`, one per worker,
//! not per session) and, when one dies, queues a resume job for each session it held.
//!
//! A lease dies in one of four ways, whichever comes first:
//!
//! * **Lapsed**: a live lease not rewritten within a lease of when this worker saw it
//!   (`lapses.rs`);
//! * **Expired**: the server removed it and left a marker (it checks at most every 250 ms,
//!   so this often comes later; it also covers a lease no worker watched when it died);
//! * **Fenced** by a worker that found its owner silent (`silent_owner.rs`), or by a new
//!   process of the same name that found the old one gone;
//! * **Ended** by its worker at the end of a drain.
//!
//! A lapse or an expiry is fenced first: `Fenced` is written over the revision that lapsed
//! (or the marker), by compare-and-set, so an owner that renewed after all keeps its lease,
//! and exactly one worker wins. The winner sweeps the dead worker's sessions at once.
//! Every worker that sees a lease turn `Fenced` or `Ended`, or taken by a new incarnation,
//! sweeps it once more a lease later: a winner that died in the middle of its sweep, a
//! drained worker's hand-over whose resume job was lost, and an incarnation whose marker
//! lost the race to its successor's lease (a server outage longer than the lease: every
//! worker takes its lease again over its own marker) are caught there. A worker also
//! sweeps its own name when it takes its lease, at start and after losing it.
//!
//! A sweep reads the dead worker's index (`hosts.<worker>.<session>`). Each session whose
//! record still names that worker under a dead lease (running, or handed back) gets a
//! resume job — its id made of the record's lease and epoch, so every sweep of one death
//! queues the same job, once — when the snapshots stream has something of it to resume;
//! then its index entry goes. An entry whose session ended or belongs to another worker
//! goes too; one whose session a newer process of the same name claimed stays. A job then
//! goes to whichever worker has a free slot, like a new session: capacity holds for
//! resumes too.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv::{self, Operation};
use futures_util::StreamExt;
use tokio::time::Instant;

use super::hosted::sleep_until;
use super::lapses::Lapses;
use super::Shared;
use crate::dispatch;
use crate::lease::{LeaseRecord, LeaseState, Liveness};
use crate::ownership::OwnerState;

/// Watches the worker leases until the worker is dropped; the watch is made again when it
/// ends or fails (a server restart, a lost connection).
pub(super) async fn watch_leases(shared: Arc<Shared>, mut watch: kv::Watch) {
    let mut lapses = Lapses::new(shared.owners.leases().lease());
    // The last record seen of each worker's lease.
    let mut seen: HashMap<String, LeaseRecord> = HashMap::new();
    loop {
        loop {
            let next = lapses.next_deadline();
            let entry = tokio::select! {
                // What the bucket says first: a renewal that already came must not be
                // taken for a lapse.
                biased;
                entry = watch.next() => entry,
                () = sleep_until(next) => {
                    for (worker, revision) in lapses.lapsed(Instant::now()) {
                        let incarnation = seen.get(&worker).map_or(0, |record| record.incarnation);
                        tokio::spawn(fence_and_sweep(shared.clone(), worker, incarnation, revision));
                    }
                    continue;
                }
            };
            let Some(entry) = entry else { break };
            let entry = match entry {
                Ok(entry) => entry,
                Err(err) => {
                    // Made again rather than polled again: async-nats 0.51's ordered
                    // consumer polls a finished future when asked after some of its errors
                    // (its connection's state watch gone) and panics. The new watch starts
                    // from each key's last record, so nothing is missed.
                    tracing::info!(worker = %shared.name, error = %err, "the lease watch failed");
                    break;
                }
            };
            let Some(worker) = entry.key.strip_prefix("lease.").map(str::to_owned) else {
                continue;
            };
            if entry.operation == Operation::Put {
                let Ok(record) = serde_json::from_slice::<LeaseRecord>(&entry.value) else {
                    continue;
                };
                if record.state == LeaseState::Live {
                    lapses.live(worker.clone(), entry.revision, Instant::now());
                    // A new process of the name took the lease over an incarnation that
                    // was never seen to die (its marker raced the new lease): swept too.
                    let replaced = seen
                        .get(&worker)
                        .is_some_and(|last| last.incarnation != record.incarnation);
                    if replaced {
                        tokio::spawn(sweep_later(shared.clone(), worker.clone()));
                    }
                } else {
                    lapses.gone(&worker);
                    tokio::spawn(sweep_later(shared.clone(), worker.clone()));
                }
                seen.insert(worker, record);
                continue;
            }
            // A marker: the lease expired at the server. One already declared dead was
            // swept; any other is fenced over the marker, and its fencer sweeps it.
            lapses.gone(&worker);
            let dead_already = seen
                .get(&worker)
                .is_some_and(|record| record.state != LeaseState::Live);
            if !dead_already {
                let incarnation = seen.get(&worker).map_or(0, |record| record.incarnation);
                tokio::spawn(fence_and_sweep(
                    shared.clone(),
                    worker,
                    incarnation,
                    entry.revision,
                ));
            }
        }
        tracing::info!(worker = %shared.name, "the lease watch ended or failed; watching again");
        watch = loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            match shared.owners.leases().watch().await {
                Ok(watch) => break watch,
                Err(err) => {
                    tracing::warn!(worker = %shared.name, %err, "cannot watch the worker leases")
                }
            }
        };
    }
}

/// Fences `worker`'s lease over `revision` (the one that lapsed, or the marker) and, if
/// this worker won, sweeps its sessions.
async fn fence_and_sweep(shared: Arc<Shared>, worker: String, incarnation: u64, revision: u64) {
    match shared
        .owners
        .leases()
        .fence(&worker, incarnation, revision)
        .await
    {
        Ok(true) => {
            tracing::info!(worker = %shared.name, dead = %worker, "a worker's lease ran out: fenced; its sessions resume elsewhere");
            sweep(&shared, &worker).await;
        }
        Ok(false) => {}
        Err(err) => {
            tracing::warn!(worker = %shared.name, %err, "cannot fence a lease that ran out")
        }
    }
}

/// Sweeps `worker`'s sessions a lease from now: what the first sweep missed.
async fn sweep_later(shared: Arc<Shared>, worker: String) {
    tokio::time::sleep(shared.owners.leases().lease()).await;
    sweep(&shared, &worker).await;
}

/// Queues a resume job for each session of `worker`'s index whose record names a dead
/// lease of that worker; see the module docs.
pub(super) async fn sweep(shared: &Shared, worker: &str) {
    let hosted = match shared.owners.leases().hosted(worker).await {
        Ok(hosted) => hosted,
        Err(err) => {
            tracing::warn!(worker = %shared.name, %err, "cannot sweep a dead lease");
            return;
        }
    };
    // One read of the lease per incarnation, not per session.
    let mut liveness: HashMap<u64, Liveness> = HashMap::new();
    for (session, indexed) in hosted {
        let record = match shared.owners.record(&session).await {
            Ok(record) => record,
            Err(err) => {
                tracing::warn!(worker = %shared.name, %session, %err, "cannot read a swept session's owner");
                continue;
            }
        };
        let lost = match &record {
            Some(record) if record.worker == worker && record.state != OwnerState::Ended => {
                let known = liveness.get(&record.lease).copied();
                let read = match known {
                    Some(known) => Ok(known),
                    None => shared.owners.leases().liveness(worker, record.lease).await,
                };
                if let Ok(read) = read {
                    liveness.insert(record.lease, read);
                }
                match read {
                    Ok(Liveness::Dead) => Some(record),
                    // A newer process of the name holds it: its entry stays.
                    Ok(Liveness::Live { .. }) => continue,
                    Err(err) => {
                        tracing::warn!(worker = %shared.name, %session, %err, "cannot read a swept session's lease");
                        continue;
                    }
                }
            }
            _ => None,
        };
        if let Some(record) = lost {
            let id = format!("{session}.lost.{}.{}", record.lease, record.epoch);
            match shared.snapshots.resumable(&session).await {
                Ok(true) => {
                    if let Err(err) = dispatch::publish_resume(
                        &shared.hosting.js,
                        &shared.options.namespace,
                        &session,
                        &id,
                    )
                    .await
                    {
                        // Its entry stays for the next sweep.
                        tracing::warn!(worker = %shared.name, %session, %err, "a dead lease's session: cannot queue its resume");
                        continue;
                    }
                    tracing::info!(worker = %shared.name, %session, %id, "a dead lease's session: resume queued");
                }
                Ok(false) => {}
                Err(err) => {
                    tracing::warn!(worker = %shared.name, %session, %err, "cannot tell whether a dead lease's session can resume");
                    continue;
                }
            }
        }
        if let Err(err) = shared
            .owners
            .leases()
            .unhost(worker, &session, Some(indexed))
            .await
        {
            tracing::debug!(worker = %shared.name, %session, %err, "swept index entry left");
        }
    }
}
