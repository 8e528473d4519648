//! The expiry watch: every worker watches the owners bucket and queues a resume job for
//! each session whose lease expired (its owner died, froze or was cut off, or a hand-over's
//! job was lost) when the snapshots stream has something of it to resume.
//!
//! The server itself expires a record whose TTL ran out and leaves a marker in its place;
//! each worker sees the marker and queues a job whose message id is made of the marker's
//! revision, so the workers that saw it queue one job between them. The job then goes to
//! whichever worker has a free slot, like a new session: capacity holds for resumes too.
//! A session whose record expired after it ended has only its tombstone (or nothing) in
//! the snapshots stream: no job.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv::{self, Operation};
use futures_util::StreamExt;

use super::Shared;
use crate::dispatch;
use crate::namespace::SessionKey;

/// Queues a resume job for each expired lease it sees, until the worker is dropped; the
/// watch is made again when it ends (a server restart).
pub(super) async fn queue_expired(shared: Arc<Shared>, mut watch: kv::Watch) {
    loop {
        while let Some(entry) = watch.next().await {
            let entry = match entry {
                Ok(entry) => entry,
                Err(err) => {
                    tracing::debug!(worker = %shared.name, error = %err, "owners watch");
                    continue;
                }
            };
            if entry.operation == Operation::Put {
                continue;
            }
            let Ok(session) = SessionKey::new(entry.key.clone()) else {
                continue;
            };
            // Beside the watch: a slow store must not hold the next expiries back.
            tokio::spawn(queue_one(shared.clone(), session, entry.revision));
        }
        tracing::info!(worker = %shared.name, "the owners watch ended; watching again");
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

async fn queue_one(shared: Arc<Shared>, session: SessionKey, revision: u64) {
    match shared.snapshots.resumable(&session).await {
        Ok(true) => {}
        Ok(false) => return,
        Err(err) => {
            tracing::warn!(worker = %shared.name, %session, %err, "cannot tell whether an expired session can resume");
            return;
        }
    }
    let id = format!("{session}.expired.{revision}");
    match dispatch::publish_resume(&shared.hosting.js, &shared.options.namespace, &session, &id)
        .await
    {
        Ok(()) => tracing::info!(worker = %shared.name, %session, "lease expired: resume queued"),
        Err(err) => {
            tracing::warn!(worker = %shared.name, %session, %err, "lease expired: cannot queue the resume")
        }
    }
}
