//! Ownership: which worker runs a session, recorded in the owners KV bucket with an
//! epoch and the owner's lease (`lease.rs`: one lease per worker, not per session).
//!
//! Every write to a session's key is a compare-and-set (`Nats-Expected-Last-Subject-
//! Sequence`: the revision the writer last saw, 0 for "no key"), and a session's record
//! changes only when the session is claimed, moved or ended. So:
//!
//! * **Claim** creates the key, or writes over a record that no longer runs anywhere: a
//!   `Moving` record (handed back), or a `Running` one whose owner's lease is dead
//!   (expired, fenced, ended, or its name taken by a newer process). Two workers claiming
//!   one session cannot both succeed, and a session whose owner's lease is live cannot be
//!   claimed at all.
//! * **The owner acts only while its worker's lease is trusted** (`LeaseClock`), and stops
//!   every session at once when the lease is lost; a claim over a dead lease therefore
//!   never runs beside the old owner.
//! * **Release** writes an `Ended` record (same compare-and-set) that lives for the
//!   bucket's ended-retention, so a job redelivered late, or a host id used again, cannot
//!   start the same session a second time.
//! * **Hand-over** (a drain) writes a `Moving` record once the session's last snapshot is
//!   stored; the worker that resumes it claims over that record.
//! * **The index.** Before its claim, a worker records that it hosts the session
//!   (`hosts.<worker>.<session>`), and removes that after the end or the hand-over: the
//!   sessions of a dead lease are found there (`worker/resume.rs`).
//!
//! The epoch starts at 1; a claim over an earlier record takes its epoch plus one, and a
//! claim of a session that ran before ends up one above the last epoch in its snapshots
//! (`snapshots.rs`), so events and snapshot writes of a stale owner lose to the new one.

use std::time::Duration;

use async_nats::jetstream::kv::{self, Operation};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{self};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::conditional_write::{publish_if_last, WriteError};
use crate::lease::{Leases, Liveness};
use crate::namespace::{Namespace, SessionKey};
use crate::provisioning::Provisioning;

/// What the owners bucket says about one session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct OwnerRecord {
    /// The worker that owns (or owned) it.
    pub(crate) worker: String,
    /// The incarnation of that worker's lease it runs under.
    pub(crate) lease: u64,
    /// The owner's epoch.
    pub(crate) epoch: u64,
    /// Whether it runs.
    pub(crate) state: OwnerState,
}

/// Whether an owned session runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum OwnerState {
    /// It runs on `worker`, while that worker's lease lives.
    Running,
    /// It ended there; the record stays for the ended-retention so it is not started
    /// again.
    Ended,
    /// `worker` drained and handed it back: its last snapshot is stored and a resume job
    /// queued; the next worker to pull that job claims it over this record.
    Moving,
}

/// Why a session could not be claimed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClaimError {
    /// Another worker owns it, or it ran and ended.
    #[error("session {session} is already {state:?} on {worker} (epoch {epoch})")]
    Taken {
        session: SessionKey,
        worker: String,
        epoch: u64,
        state: OwnerState,
    },
    /// The bucket could not be written or read.
    #[error("cannot write the owner of {session}: {reason}")]
    Unreachable { session: SessionKey, reason: String },
}

/// Why a session's record could not be written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LeaseError {
    /// Another worker wrote the session's key: this one is fenced.
    #[error("lost ownership of {session}: {now}")]
    Lost { session: SessionKey, now: String },
    /// The bucket could not be reached.
    #[error("cannot write the owner of {session}: {reason}")]
    Unreachable { session: SessionKey, reason: String },
}

/// The owners bucket, as workers use it.
#[derive(Clone, Debug)]
pub(crate) struct Owners {
    js: jetstream::Context,
    store: kv::Store,
    leases: Leases,
    ended_retention: Duration,
}

impl Owners {
    /// Opens the bucket, creating it when it does not exist yet. TTLs count in whole
    /// seconds, so `lease` is rounded up to one.
    pub(crate) async fn open(
        js: jetstream::Context,
        namespace: &Namespace,
        lease: Duration,
        ended_retention: Duration,
        provisioning: Provisioning,
    ) -> Result<Self, String> {
        let bucket = namespace.owners_bucket();
        let store = match js.get_key_value(&bucket).await {
            Ok(store) => store,
            Err(_) if provisioning != Provisioning::Existing => {
                let config = kv::Config {
                    bucket: bucket.clone(),
                    description:
                        "switchboard: session owners and worker leases (one record per session, one lease per worker)"
                            .into(),
                    history: 1,
                    // Per-message TTLs on; the marker an expired lease leaves stays a minute.
                    limit_markers: Some(Duration::from_secs(60)),
                    num_replicas: provisioning.replicas(),
                    ..Default::default()
                };
                match js.create_key_value(config).await {
                    Ok(store) => store,
                    // Another worker may have created it in between.
                    Err(create) => js.get_key_value(&bucket).await.map_err(|_| {
                        format!("cannot create the owners bucket {bucket}: {create}")
                    })?,
                }
            }
            Err(err) => return Err(format!("no owners bucket {bucket}: {err}")),
        };
        let ended_retention = round_up_to_second(ended_retention);
        Ok(Self {
            leases: Leases::new(
                js.clone(),
                store.clone(),
                round_up_to_second(lease),
                ended_retention,
            ),
            js,
            store,
            ended_retention,
        })
    }

    /// The worker leases kept in the same bucket.
    pub(crate) fn leases(&self) -> &Leases {
        &self.leases
    }

    /// Claims `session` for `worker` under its lease `incarnation`, at `epoch` or one above
    /// the record it writes over: succeeds only if no record runs — none, an expired
    /// record's marker, a session handed back, or a `Running` record whose owner's lease
    /// is dead. The session goes into the worker's index first.
    pub(crate) async fn claim(
        &self,
        session: &SessionKey,
        worker: &str,
        incarnation: u64,
        epoch: u64,
    ) -> Result<Ownership, ClaimError> {
        let unreachable = |reason: String| ClaimError::Unreachable {
            session: session.clone(),
            reason,
        };
        let indexed = self
            .leases
            .host(worker, session)
            .await
            .map_err(unreachable)?;
        let claimed = self.claim_record(session, worker, incarnation, epoch).await;
        if let Err(err) = &claimed {
            // Not ours after all, unless this very worker holds it already.
            let ours = matches!(err, ClaimError::Taken { worker: owner, state: OwnerState::Running, .. } if owner == worker);
            if !ours {
                if let Err(reason) = self.leases.unhost(worker, session, Some(indexed)).await {
                    tracing::debug!(%session, %reason, "a claim that failed left its index entry");
                }
            }
        }
        claimed
    }

    async fn claim_record(
        &self,
        session: &SessionKey,
        worker: &str,
        incarnation: u64,
        epoch: u64,
    ) -> Result<Ownership, ClaimError> {
        let mut record = OwnerRecord {
            worker: worker.to_owned(),
            lease: incarnation,
            epoch,
            state: OwnerState::Running,
        };
        let unreachable = |reason: String| ClaimError::Unreachable {
            session: session.clone(),
            reason,
        };
        let mut expected = 0;
        // More rounds after reading what stood in the way (a marker, a handed-back record,
        // or a record of a dead lease is overwritten by naming its revision).
        for _ in 0..3 {
            match self.write(session, &record, expected, None).await {
                Ok(revision) => {
                    return Ok(Ownership {
                        owners: self.clone(),
                        session: session.clone(),
                        record,
                        revision,
                    })
                }
                Err(WriteError::Moved) => match self.read(session).await.map_err(unreachable)? {
                    Current::Absent => expected = 0,
                    Current::Marker(revision) => expected = revision,
                    Current::Record(revision, current) => {
                        let free = match current.state {
                            OwnerState::Moving => true,
                            OwnerState::Ended => false,
                            OwnerState::Running => {
                                self.leases
                                    .liveness(&current.worker, current.lease)
                                    .await
                                    .map_err(unreachable)?
                                    == Liveness::Dead
                            }
                        };
                        if !free {
                            return Err(ClaimError::Taken {
                                session: session.clone(),
                                worker: current.worker,
                                epoch: current.epoch,
                                state: current.state,
                            });
                        }
                        expected = revision;
                        record.epoch = record.epoch.max(current.epoch + 1);
                    }
                },
                Err(WriteError::Other(reason)) => return Err(unreachable(reason)),
            }
        }
        Err(unreachable("the key kept changing under the claim".into()))
    }

    /// Writes `record` if the key's last revision is `expected` (0: no key), with `ttl`
    /// (none: it stays until written over).
    async fn write(
        &self,
        session: &SessionKey,
        record: &OwnerRecord,
        expected: u64,
        ttl: Option<Duration>,
    ) -> Result<u64, WriteError> {
        let payload =
            serde_json::to_vec(record).map_err(|err| WriteError::Other(err.to_string()))?;
        let subject = format!(
            "{}{}",
            self.store.put_prefix.as_ref().unwrap_or(&self.store.prefix),
            session
        );
        let mut message = PublishMessage::build().payload(Bytes::from(payload));
        if let Some(ttl) = ttl {
            message = message.ttl(ttl);
        }
        publish_if_last(&self.js, subject, message, expected).await
    }

    /// The record of `session` with its revision, if one is running.
    pub(crate) async fn running(
        &self,
        session: &SessionKey,
    ) -> Result<Option<(u64, OwnerRecord)>, String> {
        Ok(match self.read(session).await? {
            Current::Record(revision, record) if record.state == OwnerState::Running => {
                Some((revision, record))
            }
            _ => None,
        })
    }

    /// Hands back a session whose record names this worker but that it does not host (an
    /// orphan: a write that would have ended or moved it failed): `moving` over the
    /// record at `revision`, by compare-and-set. Returns the new revision.
    pub(crate) async fn hand_back_orphan(
        &self,
        session: &SessionKey,
        revision: u64,
        mut record: OwnerRecord,
    ) -> Result<u64, String> {
        record.state = OwnerState::Moving;
        match self.write(session, &record, revision, None).await {
            Ok(revision) => Ok(revision),
            Err(WriteError::Moved) => Err("its record moved".into()),
            Err(WriteError::Other(reason)) => Err(reason),
        }
    }

    /// The record of `session`, if it has one.
    pub(crate) async fn record(&self, session: &SessionKey) -> Result<Option<OwnerRecord>, String> {
        Ok(match self.read(session).await? {
            Current::Record(_, record) => Some(record),
            _ => None,
        })
    }

    /// What the key holds now.
    async fn read(&self, session: &SessionKey) -> Result<Current, String> {
        match self.store.entry(session.as_str()).await {
            Ok(None) => Ok(Current::Absent),
            Ok(Some(entry)) => match entry.operation {
                Operation::Delete | Operation::Purge => Ok(Current::Marker(entry.revision)),
                Operation::Put => serde_json::from_slice(&entry.value)
                    .map(|record| Current::Record(entry.revision, record))
                    .map_err(|err| format!("unreadable owner record of {session}: {err}")),
            },
            Err(err) => Err(err.to_string()),
        }
    }
}

enum Current {
    Absent,
    /// The marker an expired record left, with its revision.
    Marker(u64),
    Record(u64, OwnerRecord),
}

/// One worker's ownership of one session: its record and the revision it wrote last.
/// Whether the owner may act is its worker's lease's to say (`lease.rs`).
#[derive(Debug)]
pub(crate) struct Ownership {
    owners: Owners,
    session: SessionKey,
    record: OwnerRecord,
    revision: u64,
}

impl Ownership {
    /// The owner's epoch.
    pub(crate) fn epoch(&self) -> u64 {
        self.record.epoch
    }

    /// Writes the `Ended` record (compare-and-set), kept for the ended-retention, then
    /// takes the session out of the worker's index.
    pub(crate) async fn release(&mut self) -> Result<(), LeaseError> {
        let mut record = self.record.clone();
        record.state = OwnerState::Ended;
        self.write_over(&record, Some(self.owners.ended_retention))
            .await?;
        self.unindex().await;
        Ok(())
    }

    /// Moves the ownership to `epoch` (what the session's snapshots say it must be at
    /// least), rewriting the record when it changes; when it does not, checks the record
    /// is still this one. Made after the snapshots' claim: a worker whose record was
    /// claimed over in between (its lease lost meanwhile) must not host the session, and
    /// finds out here.
    pub(crate) async fn raise_epoch(&mut self, epoch: u64) -> Result<(), LeaseError> {
        if epoch <= self.record.epoch {
            return match self.owners.read(&self.session).await {
                Ok(Current::Record(revision, _)) if revision == self.revision => Ok(()),
                Ok(Current::Record(_, current)) => Err(LeaseError::Lost {
                    session: self.session.clone(),
                    now: format!(
                        "{:?} on {} at epoch {}",
                        current.state, current.worker, current.epoch
                    ),
                }),
                Ok(Current::Absent | Current::Marker(_)) => Err(LeaseError::Lost {
                    session: self.session.clone(),
                    now: "its record is gone".into(),
                }),
                Err(reason) => Err(LeaseError::Unreachable {
                    session: self.session.clone(),
                    reason,
                }),
            };
        }
        let mut record = self.record.clone();
        record.epoch = epoch;
        self.write_over(&record, None).await?;
        self.record = record;
        Ok(())
    }

    /// Writes the `Moving` record (compare-and-set): the session is handed back for
    /// another worker to resume. Returns the record's revision (the resume job's id is
    /// made of it). The index keeps the session until its resume job is queued
    /// ([`Ownership::unindex`]): should that fail, the sweep of this worker's lease, once it
    /// is dead, queues it.
    pub(crate) async fn hand_over(&mut self) -> Result<u64, LeaseError> {
        let mut record = self.record.clone();
        record.state = OwnerState::Moving;
        self.write_over(&record, None).await?;
        Ok(self.revision)
    }

    /// Takes the session out of its worker's index (best effort: a stale entry is skipped
    /// by the sweep that reads it).
    pub(crate) async fn unindex(&self) {
        if let Err(reason) = self
            .owners
            .leases
            .unhost(&self.record.worker, &self.session, None)
            .await
        {
            tracing::debug!(session = %self.session, %reason, "index entry left");
        }
    }

    /// Writes `record` over the revision this owner wrote last. When that revision moved,
    /// reads why: our own earlier write whose answer was lost is written over; another
    /// worker's record means this one is fenced.
    async fn write_over(
        &mut self,
        record: &OwnerRecord,
        ttl: Option<Duration>,
    ) -> Result<(), LeaseError> {
        let mut expected = self.revision;
        for _ in 0..3 {
            match self
                .owners
                .write(&self.session, record, expected, ttl)
                .await
            {
                Ok(revision) => {
                    self.revision = revision;
                    return Ok(());
                }
                Err(WriteError::Moved) => {
                    expected = match self.owners.read(&self.session).await.map_err(|reason| {
                        LeaseError::Unreachable {
                            session: self.session.clone(),
                            reason,
                        }
                    })? {
                        // Our own record: an earlier write whose answer was lost did land.
                        Current::Record(revision, current)
                            if current.worker == self.record.worker
                                && current.lease == self.record.lease
                                && (current.epoch == self.record.epoch
                                    || current.epoch == record.epoch) =>
                        {
                            revision
                        }
                        Current::Record(_, current) => {
                            return Err(LeaseError::Lost {
                                session: self.session.clone(),
                                now: format!(
                                    "{:?} on {} at epoch {}",
                                    current.state, current.worker, current.epoch
                                ),
                            })
                        }
                        // Records of running sessions do not expire: a marker is an ended
                        // session's, and another worker's.
                        Current::Absent | Current::Marker(_) => {
                            return Err(LeaseError::Lost {
                                session: self.session.clone(),
                                now: "its record is gone".into(),
                            })
                        }
                    };
                }
                Err(WriteError::Other(reason)) => {
                    return Err(LeaseError::Unreachable {
                        session: self.session.clone(),
                        reason,
                    })
                }
            }
        }
        Err(LeaseError::Unreachable {
            session: self.session.clone(),
            reason: "the key kept changing under the write".into(),
        })
    }
}

fn round_up_to_second(d: Duration) -> Duration {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    Duration::from_secs(secs.max(1))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    use super::*;
    use crate::lease::{LeaseStatus, Renewal, WorkerLease};
    use crate::local::NatsServer;

    /// The owners bucket of a new server (kept running by the returned handle).
    async fn owners() -> (NatsServer, Owners) {
        let server = NatsServer::start().unwrap();
        let client = server.connect().connect().await.unwrap();
        let js = jetstream::new(client.nats().clone());
        let owners = Owners::open(
            js,
            &Namespace::default(),
            Duration::from_secs(60),
            Duration::from_secs(60),
            Provisioning::Create { replicas: 1 },
        )
        .await
        .unwrap();
        (server, owners)
    }

    /// The revision of `key`'s record now.
    async fn revision_of(owners: &Owners, key: &SessionKey) -> u64 {
        owners
            .store
            .entry(key.as_str())
            .await
            .unwrap()
            .unwrap()
            .revision
    }

    async fn take(owners: &Owners, worker: &str) -> WorkerLease {
        let up = Arc::new(Mutex::new(Some(Instant::now())));
        let (lease, fenced) = WorkerLease::take(owners.leases(), worker, up, async || false)
            .await
            .unwrap();
        assert_eq!(fenced, None);
        lease
    }

    #[tokio::test]
    async fn a_running_session_is_claimed_only_once_its_owner_s_lease_is_dead() {
        let (_server, owners) = owners().await;
        let key = SessionKey::new("call-1").unwrap();
        let w1 = take(&owners, "w1").await;
        let w2 = take(&owners, "w2").await;
        let first = owners.claim(&key, "w1", w1.incarnation(), 1).await.unwrap();

        // w1's lease lives: the session is not w2's to take.
        let err = owners
            .claim(&key, "w2", w2.incarnation(), 1)
            .await
            .unwrap_err();
        assert!(
            matches!(&err, ClaimError::Taken { worker, .. } if worker == "w1"),
            "{err}"
        );

        // w1's renewals do not touch the session's record: idle sessions cost nothing.
        let before = revision_of(&owners, &key).await;
        for _ in 0..3 {
            assert!(!w1.renew(owners.leases(), "w1").await.unwrap());
        }
        assert_eq!(
            revision_of(&owners, &key).await,
            before,
            "a renewal wrote the session's record"
        );

        // Fenced: the claim takes it one epoch higher, and w1 learns it at its next
        // renewal, which stops its clock and tells its sessions.
        let tenancy = w1.tenancy().unwrap();
        let Ok(crate::lease::Liveness::Live { revision }) =
            owners.leases().liveness("w1", w1.incarnation()).await
        else {
            panic!("w1's lease is live")
        };
        assert!(owners
            .leases()
            .fence("w1", w1.incarnation(), revision)
            .await
            .unwrap());
        let taken = owners.claim(&key, "w2", w2.incarnation(), 1).await.unwrap();
        assert_eq!(taken.epoch(), first.epoch() + 1);
        assert!(matches!(
            w1.renew(owners.leases(), "w1").await,
            Err(Renewal::Lost)
        ));
        assert!(!tenancy.clock.is_valid());
        assert!(matches!(*tenancy.status.borrow(), LeaseStatus::Lost(_)));
        assert!(
            w1.tenancy().is_none(),
            "no session is claimed under a lost lease"
        );
    }

    #[tokio::test]
    async fn the_index_names_the_sessions_a_worker_hosts_until_they_end() {
        let (_server, owners) = owners().await;
        let w1 = take(&owners, "w1").await;
        let a = SessionKey::new("a").unwrap();
        let b = SessionKey::new("b").unwrap();
        let mut first = owners.claim(&a, "w1", w1.incarnation(), 1).await.unwrap();
        let mut second = owners.claim(&b, "w1", w1.incarnation(), 1).await.unwrap();
        let mut hosted: Vec<_> = owners
            .leases()
            .hosted("w1")
            .await
            .unwrap()
            .into_iter()
            .map(|(key, _)| key)
            .collect();
        hosted.sort_by(|x, y| x.as_str().cmp(y.as_str()));
        assert_eq!(hosted, [a.clone(), b.clone()]);

        // An end leaves the index at once; a hand-over once its job is queued.
        first.release().await.unwrap();
        second.hand_over().await.unwrap();
        let hosted = owners.leases().hosted("w1").await.unwrap();
        assert_eq!(hosted.len(), 1);
        assert_eq!(hosted[0].0, b);
        second.unindex().await;
        assert!(owners.leases().hosted("w1").await.unwrap().is_empty());

        // A claim refused by a live owner leaves no entry of the refused worker.
        let w2 = take(&owners, "w2").await;
        let c = SessionKey::new("c").unwrap();
        let _third = owners.claim(&c, "w1", w1.incarnation(), 1).await.unwrap();
        assert!(owners.claim(&c, "w2", w2.incarnation(), 1).await.is_err());
        assert!(owners.leases().hosted("w2").await.unwrap().is_empty());
    }
}
