//! Worker leases: one lease per worker process, not per session, in the owners bucket
//! beside the session records.
//!
//! * **The lease** is the key `lease.<worker>`: a record naming the worker's
//!   *incarnation* (a number drawn when the process took the lease) and whether it is
//!   live, written by compare-and-set with a per-message TTL of one lease. The worker
//!   rewrites it every third of the lease (and at once after a reconnection); a record not
//!   rewritten in time is removed by the server itself, leaving a marker.
//! * **A session's record** (`ownership.rs`) names its owner and the owner's incarnation,
//!   and changes only when the session is claimed, moved or ended. So an idle session costs
//!   the control plane nothing: 100 workers renewing their leases make 30 writes a second
//!   with the default 10 s lease, however many sessions they hold.
//! * **A dead lease** is one whose key holds no live record of that incarnation: it
//!   expired (a marker), was fenced (another worker wrote `Fenced` over it), ended (its
//!   worker drained), or the name was taken again by a newer incarnation. A dead lease
//!   never becomes live again (a renewal names the revision it last wrote, and any other
//!   write moved it), so a session whose record names a dead lease may be claimed.
//! * **Fencing.** The owner trusts its lease only until `sent + lease − lease/5`, on its
//!   own monotonic clock from when it *sent* the last renewal that succeeded, and only on
//!   a connection that has stayed up since then ([`LeaseClock`]). A renewal refused
//!   because the revision moved, or that finds the key expired, means the lease is lost:
//!   every session of the incarnation stops at once without writing anything more, and the
//!   worker takes a new incarnation for the sessions it claims next.
//! * **Which sessions a lease holds** is an index beside it: a key
//!   `hosts.<worker>.<session>` written before the session's record is claimed and removed
//!   after it ended or moved. Whoever finds a lease dead lists the worker's index and
//!   queues a resume job for each session whose record still names a dead lease
//!   (`worker/resume.rs`).
//!
//! Keys cannot collide: session ids and worker names are single subject tokens (no dots),
//! and these keys have two or three.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::kv::{self, Operation};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{self};
use bytes::Bytes;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};

use crate::conditional_write::{publish_if_last, WriteError};
use crate::namespace::SessionKey;

/// What a worker's lease key says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LeaseRecord {
    /// The worker's name.
    pub(crate) worker: String,
    /// Which process of that name holds (or held) it.
    pub(crate) incarnation: u64,
    /// Whether it is live.
    pub(crate) state: LeaseState,
}

/// Whether a lease is live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum LeaseState {
    /// Its worker renews it.
    Live,
    /// Another worker found it lapsed, expired or its worker gone, and wrote this over
    /// it: its sessions may be claimed.
    Fenced,
    /// Its worker drained and left.
    Ended,
}

/// What a lease key holds now.
#[derive(Debug)]
pub(crate) enum LeaseKey {
    /// Nothing was ever written (or its marker is gone too).
    Absent,
    /// The marker an expired lease left, with its revision.
    Marker(u64),
    /// A record, with its revision.
    Record(u64, LeaseRecord),
}

/// Whether the lease of one incarnation is live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Liveness {
    /// Live, at this revision.
    Live { revision: u64 },
    /// Dead for good: its sessions may be claimed.
    Dead,
}

impl LeaseKey {
    /// Whether `incarnation`'s lease is live, by what the key holds.
    pub(crate) fn liveness(&self, incarnation: u64) -> Liveness {
        match self {
            Self::Record(revision, record)
                if record.incarnation == incarnation && record.state == LeaseState::Live =>
            {
                Liveness::Live {
                    revision: *revision,
                }
            }
            _ => Liveness::Dead,
        }
    }
}

/// The lease keys and the hosting index of the owners bucket, as workers use them.
#[derive(Clone, Debug)]
pub(crate) struct Leases {
    js: jetstream::Context,
    store: kv::Store,
    lease: Duration,
    fenced_retention: Duration,
}

impl Leases {
    /// The lease keys of `store` (the owners bucket), for leases of `lease`.
    pub(crate) fn new(
        js: jetstream::Context,
        store: kv::Store,
        lease: Duration,
        fenced_retention: Duration,
    ) -> Self {
        Self {
            js,
            store,
            lease,
            fenced_retention,
        }
    }

    /// The lease's length (whole seconds).
    pub(crate) fn lease(&self) -> Duration {
        self.lease
    }

    /// Until when a renewal sent at `sent` makes the lease trustworthy: a fifth of the
    /// lease before the server may expire it.
    pub(crate) fn valid_until(&self, sent: Instant) -> Instant {
        sent + self.lease - self.lease / 5
    }

    fn key(worker: &str) -> String {
        format!("lease.{worker}")
    }

    fn index_key(worker: &str, session: &SessionKey) -> String {
        format!("hosts.{worker}.{session}")
    }

    fn subject(&self, key: &str) -> String {
        format!(
            "{}{key}",
            self.store.put_prefix.as_ref().unwrap_or(&self.store.prefix)
        )
    }

    /// A watch of every lease key, from each one's latest (so leases that died while no
    /// worker watched are seen too).
    pub(crate) async fn watch(&self) -> Result<kv::Watch, String> {
        self.store
            .watch_with_history("lease.*")
            .await
            .map_err(|err| format!("cannot watch the worker leases: {err}"))
    }

    /// What `worker`'s lease key holds now.
    pub(crate) async fn read(&self, worker: &str) -> Result<LeaseKey, String> {
        match self.store.entry(Self::key(worker)).await {
            Ok(None) => Ok(LeaseKey::Absent),
            Ok(Some(entry)) => match entry.operation {
                Operation::Delete | Operation::Purge => Ok(LeaseKey::Marker(entry.revision)),
                Operation::Put => serde_json::from_slice(&entry.value)
                    .map(|record| LeaseKey::Record(entry.revision, record))
                    .map_err(|err| format!("unreadable lease of {worker}: {err}")),
            },
            Err(err) => Err(format!("cannot read the lease of {worker}: {err}")),
        }
    }

    /// Whether `worker`'s lease of `incarnation` is live now.
    pub(crate) async fn liveness(
        &self,
        worker: &str,
        incarnation: u64,
    ) -> Result<Liveness, String> {
        Ok(self.read(worker).await?.liveness(incarnation))
    }

    /// Writes `record` as `worker`'s lease if the key's revision is `expected` (0: no key).
    async fn write(
        &self,
        record: &LeaseRecord,
        expected: u64,
        ttl: Duration,
    ) -> Result<u64, WriteError> {
        let payload =
            serde_json::to_vec(record).map_err(|err| WriteError::Other(err.to_string()))?;
        let message = PublishMessage::build()
            .payload(Bytes::from(payload))
            .ttl(ttl);
        publish_if_last(
            &self.js,
            self.subject(&Self::key(&record.worker)),
            message,
            expected,
        )
        .await
    }

    /// Declares `worker`'s lease dead by writing `Fenced` over the revision found lapsed
    /// or expired. `Ok(true)`: this call fenced it (it sweeps the worker's sessions);
    /// `Ok(false)`: the key moved since (the owner renewed, or another worker fenced first).
    pub(crate) async fn fence(
        &self,
        worker: &str,
        incarnation: u64,
        over: u64,
    ) -> Result<bool, String> {
        let record = LeaseRecord {
            worker: worker.to_owned(),
            incarnation,
            state: LeaseState::Fenced,
        };
        match self.write(&record, over, self.fenced_retention).await {
            Ok(_) => Ok(true),
            Err(WriteError::Moved) => Ok(false),
            Err(WriteError::Other(reason)) => Err(format!("cannot fence {worker}: {reason}")),
        }
    }

    /// Records that `worker` hosts `session` (before its record is claimed): the index a
    /// sweep of a dead lease reads. Returns the entry's revision.
    pub(crate) async fn host(&self, worker: &str, session: &SessionKey) -> Result<u64, String> {
        self.store
            .put(Self::index_key(worker, session), Bytes::new())
            .await
            .map_err(|err| format!("cannot index {session} on {worker}: {err}"))
    }

    /// Removes `session` from `worker`'s index, if the entry is still at `revision` (none:
    /// whatever it holds).
    pub(crate) async fn unhost(
        &self,
        worker: &str,
        session: &SessionKey,
        revision: Option<u64>,
    ) -> Result<(), String> {
        self.store
            .delete_expect_revision(Self::index_key(worker, session), revision)
            .await
            .map_err(|err| format!("cannot unindex {session} on {worker}: {err}"))
    }

    /// The sessions `worker`'s index names, each with its entry's revision.
    pub(crate) async fn hosted(&self, worker: &str) -> Result<Vec<(SessionKey, u64)>, String> {
        let prefix = self.subject(&format!("hosts.{worker}."));
        let mut subjects = self
            .store
            .stream
            .info_with_subjects(format!("{prefix}>"))
            .await
            .map_err(|err| format!("cannot list the sessions of {worker}: {err}"))?;
        let mut hosted = Vec::new();
        while let Some(subject) = subjects.next().await {
            let (subject, _) =
                subject.map_err(|err| format!("cannot list the sessions of {worker}: {err}"))?;
            let Some(Ok(session)) = subject.strip_prefix(&prefix).map(SessionKey::new) else {
                continue;
            };
            match self.store.entry(Self::index_key(worker, &session)).await {
                Ok(Some(entry)) if entry.operation == Operation::Put => {
                    hosted.push((session, entry.revision));
                }
                Ok(_) => {}
                Err(err) => return Err(format!("cannot read the index of {worker}: {err}")),
            }
        }
        Ok(hosted)
    }
}

/// A number for a new incarnation: drawn from the process's random hasher keys, the
/// process id and the time, so two processes of one name never share one.
fn draw_incarnation() -> u64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    hasher.write_u128(now.as_nanos());
    // 0 is what a fence of an unknown incarnation writes.
    hasher.finish().max(1)
}

/// Whether a worker's lease is held.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum LeaseStatus {
    /// Held; the count of renewals that succeeded (each may make it trusted again).
    Held { renewals: u64 },
    /// Lost for good: another worker owns its sessions now, or may at any moment.
    Lost(String),
}

/// What a session hosted under one incarnation of the worker's lease holds of it.
#[derive(Clone, Debug)]
pub(crate) struct Tenancy {
    /// The incarnation its owner record names.
    pub(crate) incarnation: u64,
    /// Until when the lease may be acted on (shared with the renewals and the snapshot
    /// writer).
    pub(crate) clock: LeaseClock,
    /// Renewals and the loss of the lease, as they happen.
    pub(crate) status: tokio::sync::watch::Receiver<LeaseStatus>,
}

/// The lease a worker holds now: its current incarnation, made again when one is lost.
#[derive(Clone, Debug)]
pub(crate) struct WorkerLease {
    current: Arc<Mutex<Held>>,
    /// Set once the worker ended its lease (it drained): nothing renews or takes it again.
    ended: Arc<std::sync::atomic::AtomicBool>,
}

#[derive(Debug)]
struct Held {
    incarnation: u64,
    revision: u64,
    clock: LeaseClock,
    status: tokio::sync::watch::Sender<LeaseStatus>,
}

/// Why a worker could not take its lease.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TakeError {
    /// Another live process renews a lease of this name.
    #[error("a worker named {0} is running: its lease is renewed")]
    NameTaken(String),
    /// The bucket could not be written or read.
    #[error("{0}")]
    Unreachable(String),
}

impl WorkerLease {
    /// Takes `worker`'s lease as a new incarnation: over nothing, a marker, a dead record,
    /// or a live one that `gone` confirms belongs to a process that is gone (then fenced
    /// first; the caller sweeps its sessions), or that is not renewed for a whole lease.
    /// Returns the lease and, when an older incarnation was fenced, that incarnation.
    pub(crate) async fn take(
        leases: &Leases,
        worker: &str,
        up_since: Arc<Mutex<Option<Instant>>>,
        gone: impl AsyncFn() -> bool,
    ) -> Result<(Self, Option<u64>), TakeError> {
        let (held, fenced) = Self::take_incarnation(leases, worker, up_since, gone).await?;
        Ok((
            Self {
                current: Arc::new(Mutex::new(held)),
                ended: Arc::default(),
            },
            fenced,
        ))
    }

    async fn take_incarnation(
        leases: &Leases,
        worker: &str,
        up_since: Arc<Mutex<Option<Instant>>>,
        gone: impl AsyncFn() -> bool,
    ) -> Result<(Held, Option<u64>), TakeError> {
        let record = LeaseRecord {
            worker: worker.to_owned(),
            incarnation: draw_incarnation(),
            state: LeaseState::Live,
        };
        let mut fenced = None;
        let mut waited_for: Option<u64> = None;
        for _ in 0..4 {
            let expected = match leases.read(worker).await.map_err(TakeError::Unreachable)? {
                LeaseKey::Absent => 0,
                LeaseKey::Marker(revision) => revision,
                LeaseKey::Record(revision, current) if current.state != LeaseState::Live => {
                    revision
                }
                LeaseKey::Record(revision, current) => {
                    // Live: a process of this name that crashed (its lease still runs), or
                    // one that runs. Gone at once if nobody answers for it; else it must
                    // lapse: not renewed for a whole lease.
                    let lapsed = waited_for == Some(revision);
                    if !lapsed && !gone().await {
                        if waited_for.is_some() {
                            return Err(TakeError::NameTaken(worker.to_owned()));
                        }
                        waited_for = Some(revision);
                        tokio::time::sleep(leases.lease()).await;
                        continue;
                    }
                    match leases
                        .fence(worker, current.incarnation, revision)
                        .await
                        .map_err(TakeError::Unreachable)?
                    {
                        true => fenced = Some(current.incarnation),
                        false => continue,
                    }
                    match leases.read(worker).await.map_err(TakeError::Unreachable)? {
                        LeaseKey::Record(revision, _) | LeaseKey::Marker(revision) => revision,
                        LeaseKey::Absent => 0,
                    }
                }
            };
            let sent = Instant::now();
            match leases.write(&record, expected, leases.lease()).await {
                Ok(revision) => {
                    let clock = LeaseClock::sent_at(sent, leases.valid_until(sent))
                        .watching(up_since.clone());
                    let (status, _) =
                        tokio::sync::watch::channel(LeaseStatus::Held { renewals: 0 });
                    return Ok((
                        Held {
                            incarnation: record.incarnation,
                            revision,
                            clock,
                            status,
                        },
                        fenced,
                    ));
                }
                Err(WriteError::Moved) => continue,
                Err(WriteError::Other(reason)) => {
                    return Err(TakeError::Unreachable(format!(
                        "cannot write the lease of {worker}: {reason}"
                    )))
                }
            }
        }
        Err(TakeError::Unreachable(format!(
            "the lease of {worker} kept changing"
        )))
    }

    /// The incarnation sessions are claimed under now, with its clock and status; `None`
    /// while the lease cannot be trusted (lost and not taken again yet, or not renewed on
    /// this connection).
    pub(crate) fn tenancy(&self) -> Option<Tenancy> {
        let held = self.current.lock().unwrap_or_else(|p| p.into_inner());
        let trusted = matches!(*held.status.borrow(), LeaseStatus::Held { .. })
            && held.clock.is_trusted_at(Instant::now());
        trusted.then(|| Tenancy {
            incarnation: held.incarnation,
            clock: held.clock.clone(),
            status: held.status.subscribe(),
        })
    }

    /// The incarnation held now (trusted or not).
    pub(crate) fn incarnation(&self) -> u64 {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .incarnation
    }

    /// Renews the lease once: `Ok(true)` if it must be renewed again at once (the
    /// connection dropped since the renewal was sent), `Err` with why if it is lost (its
    /// sessions were told; the caller takes a new incarnation).
    pub(crate) async fn renew(&self, leases: &Leases, worker: &str) -> Result<bool, Renewal> {
        if self.is_ended() {
            return Err(Renewal::Ended);
        }
        let (record, expected, clock) = {
            let held = self.current.lock().unwrap_or_else(|p| p.into_inner());
            if matches!(*held.status.borrow(), LeaseStatus::Lost(_)) {
                return Err(Renewal::Lost);
            }
            (
                LeaseRecord {
                    worker: worker.to_owned(),
                    incarnation: held.incarnation,
                    state: LeaseState::Live,
                },
                held.revision,
                held.clock.clone(),
            )
        };
        let sent = Instant::now();
        let written = tokio::time::timeout(
            leases.lease() / 3,
            leases.write(&record, expected, leases.lease()),
        )
        .await
        .unwrap_or_else(|_| {
            Err(WriteError::Other(
                "no answer within a third of the lease".into(),
            ))
        });
        let lost = match written {
            Ok(revision) => {
                let mut held = self.current.lock().unwrap_or_else(|p| p.into_inner());
                if held.incarnation != record.incarnation {
                    return Err(Renewal::Lost);
                }
                held.revision = revision;
                clock.renewed(sent, leases.valid_until(sent));
                held.status.send_modify(|status| {
                    if let LeaseStatus::Held { renewals } = status {
                        *renewals += 1;
                    }
                });
                return Ok(clock.reconnected_since_sent());
            }
            Err(WriteError::Other(reason)) => return Err(Renewal::Unreachable(reason)),
            Err(WriteError::Moved) => match leases.read(worker).await {
                // Our own write whose answer was lost did land.
                Ok(LeaseKey::Record(revision, current)) if current == record => {
                    let mut held = self.current.lock().unwrap_or_else(|p| p.into_inner());
                    held.revision = revision;
                    return Ok(true);
                }
                Ok(LeaseKey::Record(_, current)) => {
                    format!("{:?} by incarnation {}", current.state, current.incarnation)
                }
                Ok(LeaseKey::Marker(_) | LeaseKey::Absent) => "it expired at the server".into(),
                Err(reason) => return Err(Renewal::Unreachable(reason)),
            },
        };
        self.lose(record.incarnation, &lost);
        Err(Renewal::Lost)
    }

    /// The lease of `incarnation` is lost: its clock stops and its sessions hear it.
    fn lose(&self, incarnation: u64, why: &str) {
        let held = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if held.incarnation == incarnation {
            tracing::warn!(incarnation, reason = %why, "the worker's lease is lost: its sessions stop");
            held.clock.revoke();
            held.status.send_replace(LeaseStatus::Lost(format!(
                "the worker's lease was lost: {why}"
            )));
        }
    }

    /// Takes a new incarnation after the last was lost.
    pub(crate) async fn take_again(
        &self,
        leases: &Leases,
        worker: &str,
        up_since: Arc<Mutex<Option<Instant>>>,
    ) -> Result<(), TakeError> {
        // The lost incarnation is dead whatever stands in the key now: nobody renews a
        // record of this name but this process.
        let (held, _) = Self::take_incarnation(leases, worker, up_since, async || true).await?;
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = held;
        Ok(())
    }

    /// Whether the worker ended its lease.
    pub(crate) fn is_ended(&self) -> bool {
        self.ended.load(Ordering::SeqCst)
    }

    /// Ends the lease (a drained worker leaves): `Ended` over the last revision.
    pub(crate) async fn end(&self, leases: &Leases, worker: &str) -> Result<(), String> {
        self.ended.store(true, Ordering::SeqCst);
        let (record, expected) = {
            let held = self.current.lock().unwrap_or_else(|p| p.into_inner());
            held.clock.revoke();
            (
                LeaseRecord {
                    worker: worker.to_owned(),
                    incarnation: held.incarnation,
                    state: LeaseState::Ended,
                },
                held.revision,
            )
        };
        let mut expected = expected;
        for _ in 0..2 {
            match leases
                .write(&record, expected, leases.fenced_retention)
                .await
            {
                Ok(_) => return Ok(()),
                Err(WriteError::Moved) => match leases.read(worker).await? {
                    // A renewal under way landed first: over it.
                    LeaseKey::Record(revision, current)
                        if current.incarnation == record.incarnation
                            && current.state == LeaseState::Live =>
                    {
                        expected = revision;
                    }
                    // Fenced or expired already: dead either way.
                    _ => return Ok(()),
                },
                Err(WriteError::Other(reason)) => return Err(reason),
            }
        }
        Err("the lease kept changing".into())
    }
}

/// What a renewal that did not extend the lease found.
#[derive(Debug)]
pub(crate) enum Renewal {
    /// The lease is lost (the sessions were told).
    Lost,
    /// The bucket could not be reached: the lease holds until its clock runs out.
    Unreachable(String),
    /// The worker ended its lease: nothing more to renew.
    Ended,
}

/// Until when an owner may act on its lease, readable while a renewal is under way.
/// Cheap to clone; the clones share one deadline.
///
/// A lease counts from when the write it rests on was *sent*; it is *trusted* only while
/// the worker's connection has stayed up since then (when the clock watches the
/// connection, [`LeaseClock::watching`]). A connection that closed took the sessions'
/// subscriptions with it: a gateway then finds the owner silent and another worker may
/// fence the lease at once (`worker/silent_owner.rs`), whatever the clock says, and the
/// client subscribes again by itself when it reconnects. So from the drop until a renewal
/// sent after the reconnection succeeds (it fails if another worker fenced the lease
/// meanwhile), the owner answers nothing and publishes nothing: two owners never both
/// apply an input.
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

    /// The lease is over for good (lost, or ended): never valid again.
    pub(crate) fn revoke(&self) {
        self.valid_until.store(0, Ordering::SeqCst);
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;
