//! Ownership: which worker runs a session, recorded in the owners KV bucket, with a lease
//! and an epoch.
//!
//! Every write to a session's key is a compare-and-set (`Nats-Expected-Last-Subject-
//! Sequence`: the revision the writer last saw, 0 for "no key") carrying a per-message
//! TTL (`Nats-TTL`). So:
//!
//! * **Claim** creates the key: two workers claiming one session cannot both succeed.
//! * **The lease is the TTL.** The owner rewrites its record every third of the lease;
//!   a record not rewritten in time is removed by the server itself (it leaves a delete
//!   marker), with no clock of any worker involved.
//! * **Fencing.** The owner trusts its lease only until `sent + lease − lease/5`, measured
//!   on its own monotonic clock from when it *sent* the last renewal that succeeded, so
//!   it stops acting before the server can have expired the record. A renewal refused
//!   because the revision moved means another worker wrote the key: the owner is fenced
//!   and stops without writing anything more. So does a renewal that finds the key
//!   expired (a marker): the bucket keeps no history, so the marker cannot say whether
//!   another worker claimed the session in between and lost its own lease in turn, and
//!   an owner that wrote its record again would run beside that one. The expiry queues
//!   the session's resume, from its last snapshot, as after a crash.
//! * **Release** writes an `Ended` record (same compare-and-set) that lives for the
//!   bucket's ended-retention, so a job redelivered late, or a host id used again, cannot
//!   start the same session a second time.
//!
//! * **A lapsed lease.** The server removes an expired record only at its next expiry
//!   check, which runs at most every 250 ms, so every worker also times the records it
//!   sees: one not rewritten within a lease of when the worker saw it has lapsed, and a
//!   claim may write over it by naming its revision (compare-and-set: if the owner did
//!   renew, the revision moved and the claim fails). This is safe without comparing
//!   clocks: the owner sent its last write before any worker saw it, and stops trusting
//!   it a fifth of a lease before the lease runs out on its own clock.
//! * **Hand-over** (a drain) writes a `Moving` record (same compare-and-set, a TTL of one
//!   lease) once the session's last snapshot is stored; the worker that resumes it claims
//!   over that record. Should the resume job be lost, the record expires like a lease and
//!   the expiry is noticed like a crash's (`worker/resume.rs`).
//!
//! The epoch starts at 1; a claim over a `Moving` record takes its epoch plus one, and a
//! claim of a session that ran before ends up one above the last epoch in its snapshots
//! (`snapshots.rs`), so events and snapshot writes of a stale owner lose to the new one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::kv::{self, Operation};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{self};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::conditional_write::{publish_if_last, WriteError};
use crate::namespace::{Namespace, SessionKey};
use crate::provisioning::Provisioning;

/// What the owners bucket says about one session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct OwnerRecord {
    /// The worker that owns (or owned) it.
    pub(crate) worker: String,
    /// The owner's epoch.
    pub(crate) epoch: u64,
    /// Whether it runs.
    pub(crate) state: OwnerState,
}

/// Whether an owned session runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum OwnerState {
    /// It runs on `worker`.
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

/// Why a lease could not be renewed or released.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LeaseError {
    /// Another worker wrote the session's key: this one is fenced.
    #[error("lost ownership of {session}: {now}")]
    Lost { session: SessionKey, now: String },
    /// The bucket could not be reached; the lease holds until it runs out.
    #[error("cannot renew the lease of {session}: {reason}")]
    Unreachable { session: SessionKey, reason: String },
}

/// The owners bucket, as workers use it.
#[derive(Clone, Debug)]
pub(crate) struct Owners {
    js: jetstream::Context,
    store: kv::Store,
    lease: Duration,
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
                        "switchboard: session owners (one record per session; its TTL is the lease)"
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
        Ok(Self {
            js,
            store,
            lease: round_up_to_second(lease),
            ended_retention: round_up_to_second(ended_retention),
        })
    }

    /// The lease (whole seconds).
    pub(crate) fn lease(&self) -> Duration {
        self.lease
    }

    /// A watch of every write to the bucket, from each key's latest (so the expiries
    /// that happened while no worker watched are seen too).
    pub(crate) async fn watch_expiries(&self) -> Result<kv::Watch, String> {
        self.store
            .watch_with_history(">")
            .await
            .map_err(|err| format!("cannot watch the owners bucket: {err}"))
    }

    /// Claims `session` for `worker` at `epoch` (one above the record it writes over):
    /// succeeds only if no live record exists — none, an expired lease's marker, a
    /// session handed back, or the lapsed record at revision `lapsed` when that is still
    /// the latest (see `worker/resume.rs`).
    pub(crate) async fn claim(
        &self,
        session: &SessionKey,
        worker: &str,
        epoch: u64,
        lapsed: Option<u64>,
    ) -> Result<Ownership, ClaimError> {
        let mut record = OwnerRecord {
            worker: worker.to_owned(),
            epoch,
            state: OwnerState::Running,
        };
        let unreachable = |reason: String| ClaimError::Unreachable {
            session: session.clone(),
            reason,
        };
        let mut expected = 0;
        // More rounds after reading what stood in the way (an expired lease's marker or a
        // handed-back record is overwritten by naming its revision).
        for _ in 0..3 {
            let sent = Instant::now();
            match self.write(session, &record, expected, self.lease).await {
                Ok(revision) => {
                    return Ok(Ownership {
                        owners: self.clone(),
                        session: session.clone(),
                        record,
                        revision,
                        clock: LeaseClock::sent_at(sent, self.valid_until(sent)),
                    })
                }
                Err(WriteError::Moved) => match self.read(session).await.map_err(unreachable)? {
                    Current::Absent => expected = 0,
                    Current::Marker(revision) => expected = revision,
                    Current::Record(revision, current)
                        if current.state == OwnerState::Moving
                            || (current.state == OwnerState::Running
                                && lapsed == Some(revision)) =>
                    {
                        expected = revision;
                        record.epoch = record.epoch.max(current.epoch + 1);
                    }
                    Current::Record(_, current) => {
                        return Err(ClaimError::Taken {
                            session: session.clone(),
                            worker: current.worker,
                            epoch: current.epoch,
                            state: current.state,
                        })
                    }
                },
                Err(WriteError::Other(reason)) => return Err(unreachable(reason)),
            }
        }
        Err(unreachable("the key kept changing under the claim".into()))
    }

    /// Until when a write sent at `sent` makes the lease trustworthy: a fifth of the lease
    /// before the server may expire it.
    fn valid_until(&self, sent: Instant) -> Instant {
        sent + self.lease - self.lease / 5
    }

    /// Writes `record` if the key's last revision is `expected` (0: no key), with `ttl`.
    async fn write(
        &self,
        session: &SessionKey,
        record: &OwnerRecord,
        expected: u64,
        ttl: Duration,
    ) -> Result<u64, WriteError> {
        let payload =
            serde_json::to_vec(record).map_err(|err| WriteError::Other(err.to_string()))?;
        let subject = format!(
            "{}{}",
            self.store.put_prefix.as_ref().unwrap_or(&self.store.prefix),
            session
        );
        let message = PublishMessage::build()
            .payload(Bytes::from(payload))
            .ttl(ttl);
        publish_if_last(&self.js, subject, message, expected).await
    }

    /// The live record of `session` with its revision, if one is running.
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

/// What a write over this owner's record does when the record expired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expired {
    /// The ownership is lost: a renewal, which would go on acting on it.
    Lost,
    /// It writes over the marker: an end, a hand-over or an epoch raised, each after a
    /// write the snapshots took (their compare-and-set shows nobody claimed the session).
    WriteOver,
}

enum Current {
    Absent,
    /// The marker an expired lease left, with its revision.
    Marker(u64),
    Record(u64, OwnerRecord),
}

/// Until when an owner may act on its lease, readable while a renewal is under way.
/// Cheap to clone; the clones share one deadline.
///
/// A lease counts from when the write it rests on was *sent*; it is *trusted* only while
/// the worker's connection has stayed up since then (when the clock watches the
/// connection, [`LeaseClock::watching`]). A connection that closed took the session's
/// subscriptions with it: a gateway then finds the owner silent and another worker may
/// claim the session at once (`worker/silent_owner.rs`), whatever the clock says, and the
/// client subscribes again by itself when it reconnects. So from the drop until a renewal
/// sent after the reconnection succeeds (it fails if another worker claimed), the owner
/// answers nothing and publishes nothing: two owners never both apply an input.
#[derive(Clone, Debug)]
pub(crate) struct LeaseClock {
    base: Instant,
    /// Nanoseconds after `base`.
    valid_until: Arc<AtomicU64>,
    /// When the write the lease counts from was sent, in nanoseconds after `base`.
    sent: Arc<AtomicU64>,
    /// Since when the worker's connection is up (`None` while it is down), when watched.
    connection: Option<Arc<Mutex<Option<Instant>>>>,
}

impl LeaseClock {
    /// A lease valid until `at`, counted from a write sent now.
    #[cfg(test)]
    pub(crate) fn until(at: Instant) -> Self {
        Self::sent_at(Instant::now(), at)
    }

    /// A lease valid until `at`, counted from a write sent at `sent`.
    pub(crate) fn sent_at(sent: Instant, at: Instant) -> Self {
        let clock = Self {
            base: sent,
            valid_until: Arc::new(AtomicU64::new(0)),
            sent: Arc::new(AtomicU64::new(0)),
            connection: None,
        };
        clock.renewed(sent, at);
        clock
    }

    /// The same clock, trusted only while the connection whose `up_since` this is has
    /// stayed up since the lease's write was sent.
    pub(crate) fn watching(mut self, up_since: Arc<Mutex<Option<Instant>>>) -> Self {
        self.connection = Some(up_since);
        self
    }

    /// Moves the end of the lease to `at`, after a renewal sent at `sent` succeeded.
    pub(crate) fn renewed(&self, sent: Instant, at: Instant) {
        let nanos = |t: Instant| {
            u64::try_from(t.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
        };
        self.sent.store(nanos(sent), Ordering::SeqCst);
        self.valid_until.store(nanos(at), Ordering::SeqCst);
    }

    /// Whether the lease's time has not run out (the snapshot writer's rule: a newer
    /// owner's claim fences it in the store before).
    pub(crate) fn is_valid(&self) -> bool {
        self.is_valid_at(Instant::now())
    }

    /// Whether the lease's time has not run out at `now`.
    pub(crate) fn is_valid_at(&self, now: Instant) -> bool {
        let now = now.saturating_duration_since(self.base).as_nanos();
        u128::from(self.valid_until.load(Ordering::SeqCst)) > now
    }

    /// Whether the owner may act at `now`: the lease's time has not run out, and the
    /// connection (when watched) has stayed up since the lease's write was sent.
    pub(crate) fn is_trusted_at(&self, now: Instant) -> bool {
        self.is_valid_at(now) && !self.reconnected_since_sent()
    }

    /// Whether the watched connection dropped since the lease's write was sent (it is down,
    /// or came back after): only a renewal sent now can make the lease trusted again.
    pub(crate) fn reconnected_since_sent(&self) -> bool {
        let Some(connection) = &self.connection else {
            return false;
        };
        let sent = self.base + Duration::from_nanos(self.sent.load(Ordering::SeqCst));
        let up_since = *connection.lock().unwrap_or_else(|p| p.into_inner());
        up_since.is_none_or(|up| up > sent)
    }
}

/// One worker's ownership of one session: its record, the revision it last wrote, and
/// until when it may act on it.
#[derive(Debug)]
pub(crate) struct Ownership {
    owners: Owners,
    session: SessionKey,
    record: OwnerRecord,
    revision: u64,
    clock: LeaseClock,
}

impl Ownership {
    /// The owner's epoch.
    pub(crate) fn epoch(&self) -> u64 {
        self.record.epoch
    }

    /// The lease's clock, to read while the ownership is away being renewed.
    pub(crate) fn clock(&self) -> LeaseClock {
        self.clock.clone()
    }

    /// How often to renew: a third of the lease.
    pub(crate) fn renew_every(&self) -> Duration {
        self.owners.lease / 3
    }

    /// Rewrites the record (compare-and-set on the last revision) to extend the lease.
    /// A record that expired is lost (see the module docs).
    pub(crate) async fn renew(&mut self) -> Result<(), LeaseError> {
        let record = self.record.clone();
        self.write_over(&record, self.owners.lease, Expired::Lost)
            .await
    }

    /// Writes the `Ended` record (compare-and-set), kept for the ended-retention.
    pub(crate) async fn release(&mut self) -> Result<(), LeaseError> {
        let mut record = self.record.clone();
        record.state = OwnerState::Ended;
        self.write_over(&record, self.owners.ended_retention, Expired::WriteOver)
            .await
    }

    /// Moves the ownership to `epoch` (what the session's snapshots say it must be at
    /// least), rewriting the record when it changes.
    pub(crate) async fn raise_epoch(&mut self, epoch: u64) -> Result<(), LeaseError> {
        if epoch <= self.record.epoch {
            return Ok(());
        }
        let mut record = self.record.clone();
        record.epoch = epoch;
        self.write_over(&record, self.owners.lease, Expired::WriteOver)
            .await?;
        self.record = record;
        Ok(())
    }

    /// Writes the `Moving` record (compare-and-set) with a TTL of one lease: the session
    /// is handed back for another worker to resume. Returns the record's revision (the
    /// resume job's id is made of it).
    pub(crate) async fn hand_over(&mut self) -> Result<u64, LeaseError> {
        let mut record = self.record.clone();
        record.state = OwnerState::Moving;
        self.write_over(&record, self.owners.lease, Expired::WriteOver)
            .await?;
        Ok(self.revision)
    }

    /// Writes `record` over the revision this owner wrote last. When that revision moved,
    /// reads why: another worker's record means this one is fenced; an expired lease (a
    /// marker, or no key) is lost or written over, as `expired` says.
    async fn write_over(
        &mut self,
        record: &OwnerRecord,
        ttl: Duration,
        expired: Expired,
    ) -> Result<(), LeaseError> {
        let mut expected = self.revision;
        for _ in 0..3 {
            let sent = Instant::now();
            match self
                .owners
                .write(&self.session, record, expected, ttl)
                .await
            {
                Ok(revision) => {
                    if expected != self.revision {
                        tracing::warn!(session = %self.session, "the lease had expired; took it back");
                    }
                    self.revision = revision;
                    self.clock.renewed(sent, self.owners.valid_until(sent));
                    return Ok(());
                }
                Err(WriteError::Moved) => {
                    expected = match self.owners.read(&self.session).await.map_err(|reason| {
                        LeaseError::Unreachable {
                            session: self.session.clone(),
                            reason,
                        }
                    })? {
                        Current::Absent | Current::Marker(_) if expired == Expired::Lost => {
                            return Err(LeaseError::Lost {
                                session: self.session.clone(),
                                now: "its lease expired at the server".into(),
                            })
                        }
                        Current::Absent => 0,
                        Current::Marker(revision) => revision,
                        // Our own record: an earlier write whose answer was lost did land.
                        Current::Record(revision, current)
                            if current.worker == self.record.worker
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
    use super::*;
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

    #[tokio::test]
    async fn a_claim_writes_over_a_live_record_only_at_the_revision_that_lapsed() {
        let (_server, owners) = owners().await;
        let key = SessionKey::new("call-1").unwrap();
        let mut first = owners.claim(&key, "w1", 1, None).await.unwrap();
        let seen = first.revision;

        // A live record stands in the way of a claim that names no lapse, or another one.
        for lapsed in [None, Some(seen + 100)] {
            let err = owners.claim(&key, "w2", 1, lapsed).await.unwrap_err();
            assert!(
                matches!(&err, ClaimError::Taken { worker, .. } if worker == "w1"),
                "{err}"
            );
        }

        // The owner renewed after all: the revision that lapsed is not the latest now.
        first.renew().await.unwrap();
        let err = owners.claim(&key, "w2", 1, Some(seen)).await.unwrap_err();
        assert!(matches!(err, ClaimError::Taken { .. }), "{err}");

        // Not renewed since: the claim takes it one epoch higher, and the old owner is
        // fenced at its next renewal.
        let taken = owners
            .claim(&key, "w2", 1, Some(first.revision))
            .await
            .unwrap();
        assert_eq!(taken.epoch(), first.epoch() + 1);
        let err = first.renew().await.unwrap_err();
        assert!(
            matches!(&err, LeaseError::Lost { now, .. } if now.contains("w2")),
            "{err}"
        );
    }

    /// A record gone from the bucket (its lease expired at the server, leaving a marker)
    /// may have been claimed by another worker in between, and lost again: the owner that
    /// finds it so is lost too, and does not write it back.
    #[tokio::test]
    async fn a_renewal_that_finds_its_record_expired_is_lost() {
        let (_server, owners) = owners().await;
        let key = SessionKey::new("call-2").unwrap();
        let mut owner = owners.claim(&key, "w1", 1, None).await.unwrap();
        // What an expiry leaves: a marker, and no record.
        owners.store.delete(key.as_str()).await.unwrap();
        let err = owner.renew().await.unwrap_err();
        assert!(
            matches!(&err, LeaseError::Lost { now, .. } if now.contains("expired")),
            "{err}"
        );
        assert!(
            matches!(owners.read(&key).await.unwrap(), Current::Marker(_)),
            "nothing written back"
        );
        // A claim (the expiry's resume) takes it over.
        let taken = owners.claim(&key, "w2", 2, None).await.unwrap();
        assert_eq!(taken.epoch(), 2);
    }
}
