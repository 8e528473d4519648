//! The expiry watch: every worker watches the owners bucket and queues a resume job for
//! each session whose lease ran out (its owner died, froze or was cut off, or a
//! hand-over's job was lost) when the snapshots stream has something of it to resume.
//!
//! Two signs of a lease run out, whichever comes first:
//!
//! * **Lapsed**: a live record not rewritten within a lease of when this worker saw it
//!   (`lapses.rs`). The job names the record's revision, and its claim writes over that
//!   record only while it is still the latest. All workers time the same write, so they
//!   queue the same job id (`<session>.lapsed.<revision>`): one job between them.
//! * **Expired**: the server removed the record and left a marker (it checks at most
//!   every 250 ms, so this often comes later; it also covers a record no worker was
//!   watching when it was written). The job id is made of the marker's revision.
//!
//! Should both come, the second job finds the session claimed and is dropped. A job then
//! goes to whichever worker has a free slot, like a new session: capacity holds for
//! resumes too. A session whose record expired after it ended has only its tombstone (or
//! nothing) in the snapshots stream: no job.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv::{self, Operation};
use futures_util::StreamExt;
use tokio::time::Instant;

use super::hosted::sleep_until;
use super::lapses::Lapses;
use super::Shared;
use crate::dispatch;
use crate::namespace::SessionKey;
use crate::ownership::{OwnerRecord, OwnerState};

/// Queues a resume job for each lease it sees run out, until the worker is dropped; the
/// watch is made again when it ends or fails (a server restart, a lost connection).
pub(super) async fn queue_expired(shared: Arc<Shared>, mut watch: kv::Watch) {
    let mut lapses = Lapses::new(shared.owners.lease());
    loop {
        loop {
            let next = lapses.next_deadline();
            let entry = tokio::select! {
                // What the bucket says first: a renewal that already came must not be
                // taken for a lapse.
                biased;
                entry = watch.next() => entry,
                () = sleep_until(next) => {
                    for (session, revision) in lapses.lapsed(Instant::now()) {
                        let id = format!("{session}.lapsed.{revision}");
                        tokio::spawn(queue_one(shared.clone(), session, id, Some(revision)));
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
                    tracing::info!(worker = %shared.name, error = %err, "the owners watch failed");
                    break;
                }
            };
            let Ok(session) = SessionKey::new(entry.key.clone()) else {
                continue;
            };
            if entry.operation == Operation::Put {
                let live = serde_json::from_slice::<OwnerRecord>(&entry.value)
                    .is_ok_and(|record| record.state != OwnerState::Ended);
                if live {
                    lapses.live(session, entry.revision, Instant::now());
                } else {
                    lapses.gone(&session);
                }
                continue;
            }
            lapses.gone(&session);
            // Beside the watch: a slow store must not hold the next expiries back.
            let id = format!("{session}.expired.{}", entry.revision);
            tokio::spawn(queue_one(shared.clone(), session, id, None));
        }
        tracing::info!(worker = %shared.name, "the owners watch ended or failed; watching again");
        watch = loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            match shared.owners.watch_expiries().await {
                Ok(watch) => break watch,
                Err(err) => {
                    tracing::warn!(worker = %shared.name, %err, "cannot watch the owners bucket")
                }
            }
        };
    }
}

async fn queue_one(shared: Arc<Shared>, session: SessionKey, id: String, lapsed: Option<u64>) {
    match shared.snapshots.resumable(&session).await {
        Ok(true) => {}
        Ok(false) => return,
        Err(err) => {
            tracing::warn!(worker = %shared.name, %session, %err, "cannot tell whether an expired session can resume");
            return;
        }
    }
    match dispatch::publish_resume(
        &shared.hosting.js,
        &shared.options.namespace,
        &session,
        &id,
        lapsed,
    )
    .await
    {
        Ok(()) => {
            tracing::info!(worker = %shared.name, %session, %id, "lease ran out: resume queued")
        }
        Err(err) => {
            tracing::warn!(worker = %shared.name, %session, %err, "lease ran out: cannot queue the resume")
        }
    }
}
