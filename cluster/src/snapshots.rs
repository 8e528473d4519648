//! Snapshots on JetStream: where a cluster's sessions are written down, so
//! a drained or crashed worker's sessions go on elsewhere.
//!
//! One stream, `sb_snapshots`, with one subject per session (`sb.snapshots.<id>`). A
//! session's subject holds, oldest first:
//!
//! * **claim** — written by each new owner before it reads or runs the session: its epoch,
//!   its name, and the session's spec (what the factory builds it from);
//! * **full** — a whole snapshot (with the spec), written by the session's saving
//!   (`SessionBuilder::save_claimed`) at its first save, after a failed write, once the
//!   deltas carry as many items as the last full one, and by a drain; the messages
//!   before it are purged;
//! * **delta** — what changed since the message before it, after every other settled turn;
//! * **ended** — the session ended: nothing to resume (a tombstone that expires after the
//!   worker's ended-retention).
//!
//! Every message carries its writer's epoch and name, and the sequence of the full snapshot
//! it follows, so a reader finds the chain from the last message alone; the chain is read
//! with the engine's one rule (`SnapshotChain`).
//!
//! **The engine's store contract.** A [`SnapshotWriter`] is a [`SnapshotStore`] for one
//! session, on the same contract as the engine's memory and file stores: its versions are
//! the subject's sequences, a claim is the claim message (its epoch one more than the last
//! message's, and at least the owner record's), and every write names the sequence its
//! writer last saw (`Nats-Expected-Last-Subject-Sequence`): only the writer that wrote the
//! last message can write the next. A new owner's claim is such a write, so the moment it
//! lands every older owner's next write is refused, whatever that owner believes about its
//! lease: its session's saving gets [`StoreError::Fenced`] (the session stops saving, with
//! a `Fenced` event), and its loop stops. The new owner reads the chain only after its
//! claim landed, so nothing can be added behind what it restores. A write whose answer was
//! lost and that did land is recognised (the last message is by the same epoch and
//! worker) and not taken for a fence. A writer in a worker also refuses to write while its
//! lease cannot be trusted (the owners bucket, `ownership.rs`), so a worker frozen past its
//! lease does not even try.
//!
//! Only the latest claimant writes, so the last message's epoch is the last claim's: a
//! claim's rule (`ClaimRule`) is checked against it before the claim is written over that
//! very message. A worker's claim is a takeover (it holds the session's owner record); a
//! restore's (an engine-side `restore_from` through a writer) is refused when a claim
//! after its snapshot's writer holds the session, naming that claim's writer.
//!
//! **No message over the server's `max_payload`.** A message larger than the server takes
//! (a long conversation's full snapshot) is written as parts followed by the message
//! itself, and read back joined (`snapshots/parts.rs`); whatever the conversation's
//! length, nothing is refused.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::message::{PublishMessage, StreamMessage};
use async_nats::jetstream::stream::{self, DirectGetErrorKind, StorageType};
use async_nats::jetstream::{self};
use async_nats::HeaderMap;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use switchboard::snapshot::{
    Claim, ClaimRule, SessionSnapshot, SnapshotChain, SnapshotDelta, SnapshotStore, StoreError,
    StoreVersion,
};
use tokio::sync::{watch, Mutex};

use crate::conditional_write::{publish_if_last, WriteError};
use crate::lease::LeaseClock;
use crate::namespace::{Namespace, SessionKey};
use crate::provisioning::Provisioning;
use crate::spec::SessionSpec;

mod parts;

const KIND: &str = "Sb-Kind";
const EPOCH: &str = "Sb-Epoch";
const WORKER: &str = "Sb-Worker";
const FULL: &str = "Sb-Full";

/// Every header a snapshot message may carry (the wire protocol's page lists them).
#[cfg(test)]
pub(crate) const HEADERS: [&str; 6] = [KIND, EPOCH, WORKER, FULL, parts::PARTS, parts::BEFORE];

/// Why the snapshots stream could not be opened or read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StreamError {
    /// Provisioning could not create the stream.
    #[error("cannot create the snapshots stream {stream}: {reason}")]
    Create { stream: String, reason: String },
    /// The stream is not there (or this client may not see it).
    #[error("no snapshots stream {stream}: {reason}")]
    Missing { stream: String, reason: String },
    /// A read of a session's subject failed.
    #[error("cannot read {subject}: {reason}")]
    Read { subject: String, reason: String },
    /// A message of a session's subject does not say what it is (not written by a worker).
    #[error("message {seq} has no {KIND} header")]
    Unmarked { seq: u64 },
}

/// What one message of a session's subject is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SnapshotKind {
    /// A new owner took the session (the fence).
    Claim,
    /// A whole snapshot.
    Full,
    /// What changed since the message before.
    Delta,
    /// The session ended.
    Ended,
    /// A piece of a message too big for one (see `snapshots/parts.rs`).
    Part,
}

impl SnapshotKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Claim => "claim",
            Self::Full => "full",
            Self::Delta => "delta",
            Self::Ended => "ended",
            Self::Part => "part",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "claim" => Self::Claim,
            "full" => Self::Full,
            "delta" => Self::Delta,
            "ended" => Self::Ended,
            "part" => Self::Part,
            _ => return None,
        })
    }
}

/// One message of a session's subject, as its headers describe it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SnapshotRecord {
    /// Its sequence in the stream.
    pub(crate) seq: u64,
    /// What it is.
    pub(crate) kind: SnapshotKind,
    /// Its writer's epoch.
    pub(crate) epoch: u64,
    /// Its writer.
    pub(crate) worker: String,
    /// The sequence of the full snapshot it follows (its own for a full one; 0: none).
    pub(crate) full: u64,
}

impl SnapshotRecord {
    fn read(message: &StreamMessage) -> Result<Self, StreamError> {
        let header = |name: &str| message.headers.get(name).map(|v| v.as_str().to_owned());
        let kind =
            header(KIND)
                .and_then(|k| SnapshotKind::parse(&k))
                .ok_or(StreamError::Unmarked {
                    seq: message.sequence,
                })?;
        let number = |name: &str| {
            header(name)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        Ok(Self {
            seq: message.sequence,
            kind,
            epoch: number(EPOCH),
            worker: header(WORKER).unwrap_or_default(),
            full: if kind == SnapshotKind::Full {
                message.sequence
            } else {
                number(FULL)
            },
        })
    }
}

/// A session as the store holds it.
#[derive(Clone, Debug)]
pub(crate) struct StoredSession {
    /// Its last snapshot with every delta after it applied (`None`: it never saved one).
    pub(crate) snapshot: Option<SessionSnapshot>,
    /// The last writer's epoch.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) epoch: u64,
    /// The last writer.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) worker: String,
}

/// How many writes to the stream landed and how many did not, over every writer of one
/// worker's stream.
#[derive(Debug, Default)]
pub(crate) struct WriteCounts {
    pub(crate) written: AtomicU64,
    pub(crate) failed: AtomicU64,
}

/// What a claim of a session's snapshots found.
pub(crate) enum Claimed {
    /// A resume with nothing to resume: no message, or the session ended. Nothing written.
    Nothing,
    /// A new session: the claim is the subject's first message (or follows an ended one).
    Fresh(SnapshotWriter),
    /// A session that ran before: its spec and its last snapshot, read after the claim.
    Resumed {
        writer: SnapshotWriter,
        spec: SessionSpec,
        snapshot: Option<Box<SessionSnapshot>>,
    },
}

/// The snapshots stream of a cluster. Cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct SnapshotStream {
    js: jetstream::Context,
    counts: Arc<WriteCounts>,
    stream: stream::Stream,
    namespace: Namespace,
    /// How long an ended session's tombstone stays.
    ended_retention: Duration,
}

impl SnapshotStream {
    /// Opens the stream, creating it when `provisioning` says so and it does not exist.
    pub(crate) async fn open(
        js: jetstream::Context,
        namespace: &Namespace,
        ended_retention: Duration,
        provisioning: Provisioning,
    ) -> Result<Self, StreamError> {
        let name = namespace.snapshots_stream();
        let stream = if provisioning != Provisioning::Existing {
            js.get_or_create_stream(stream::Config {
                name: name.clone(),
                description: Some(
                    "switchboard: session snapshots (one subject per session; written only by its owner)"
                        .into(),
                ),
                subjects: vec![namespace.snapshots_subjects()],
                storage: StorageType::File,
                allow_direct: true,
                // The tombstone of an ended session expires.
                allow_message_ttl: true,
                num_replicas: provisioning.replicas(),
                ..Default::default()
            })
            .await
            .map_err(|err| StreamError::Create {
                stream: name.clone(),
                reason: err.to_string(),
            })?
        } else {
            js.get_stream(&name)
                .await
                .map_err(|err| StreamError::Missing {
                    stream: name.clone(),
                    reason: err.to_string(),
                })?
        };
        Ok(Self {
            js,
            counts: Arc::default(),
            stream,
            namespace: namespace.clone(),
            ended_retention: ended_retention.max(Duration::from_secs(1)),
        })
    }

    /// Its writes so far.
    pub(crate) fn counts(&self) -> &WriteCounts {
        &self.counts
    }

    fn subject(&self, session: &SessionKey) -> String {
        self.namespace.snapshot_subject(session)
    }

    /// The last message of `subject`, if any.
    async fn last(&self, subject: &str) -> Result<Option<StreamMessage>, StreamError> {
        match self.stream.direct_get_last_for_subject(subject).await {
            Ok(message) => Ok(Some(message)),
            Err(err) if err.kind() == DirectGetErrorKind::NotFound => Ok(None),
            Err(err) => Err(StreamError::Read {
                subject: subject.to_owned(),
                reason: err.to_string(),
            }),
        }
    }

    /// The messages of a session's subject, oldest first.
    #[cfg(test)]
    async fn records(&self, session: &SessionKey) -> Result<Vec<SnapshotRecord>, StreamError> {
        let subject = self.subject(session);
        let mut records = Vec::new();
        let mut at = 1;
        loop {
            match self
                .stream
                .direct_get_next_for_subject(subject.clone(), Some(at))
                .await
            {
                Ok(message) => {
                    at = message.sequence + 1;
                    records.push(SnapshotRecord::read(&message)?);
                }
                Err(err) if err.kind() == DirectGetErrorKind::NotFound => return Ok(records),
                Err(err) => {
                    return Err(StreamError::Read {
                        subject,
                        reason: err.to_string(),
                    })
                }
            }
        }
    }

    /// Whether the store holds a session to resume (something, and not its end).
    pub(crate) async fn resumable(&self, session: &SessionKey) -> Result<bool, StoreError> {
        let tail = self.tail(session).await?;
        Ok(tail.is_some_and(|tail| tail.record.kind != SnapshotKind::Ended))
    }

    /// The session as the store holds it (`None`: nothing, or it ended). Reads only; a
    /// worker resuming a session claims it instead, which fences the writer before.
    pub(crate) async fn load(
        &self,
        session: &SessionKey,
    ) -> Result<Option<StoredSession>, StoreError> {
        let Some(tail) = self.tail(session).await? else {
            return Ok(None);
        };
        let record = tail.record;
        if record.kind == SnapshotKind::Ended {
            return Ok(None);
        }
        let snapshot = self
            .read_chain(session, &tail.message, &record, tail.last_seq + 1)
            .await?;
        Ok(Some(StoredSession {
            snapshot,
            epoch: record.epoch,
            worker: record.worker,
        }))
    }

    /// Claims a session's snapshots for an owner at `epoch` (at least; more when the
    /// store has seen that epoch already) named `worker`: the fence. `start` is the spec
    /// of a new session (a start job); without it (a resume job) an empty or ended
    /// subject means there is nothing to resume and nothing is written.
    pub(crate) async fn claim(
        &self,
        session: &SessionKey,
        epoch: u64,
        worker: &str,
        start: Option<&SessionSpec>,
        lease: LeaseClock,
    ) -> Result<Claimed, StoreError> {
        let spec = match start {
            Some(spec) => {
                serde_json::to_vec(spec).map_err(|err| corrupt(session, err.to_string()))?
            }
            None => Vec::new(),
        };
        let writer = SnapshotWriter::new(
            self.clone(),
            session.clone(),
            worker,
            spec.into(),
            Some(lease),
        );
        // A takeover: the worker holds the session's owner record (its lease), so the
        // writer before it is gone or fenced by that record already.
        let rule = ClaimRule::Takeover { at_least: epoch };
        Ok(match writer.claim_over(rule, start.is_some()).await? {
            None => Claimed::Nothing,
            Some(Found::Fresh) => Claimed::Fresh(writer),
            Some(Found::Resumed { spec, snapshot }) => Claimed::Resumed {
                writer,
                spec,
                snapshot,
            },
        })
    }

    /// A [`SnapshotStore`] for one session's snapshots, writing as `worker`, for a host
    /// that runs the session outside a worker (an operator's tool, a test): claim the
    /// session through it first (`SnapshotStore::claim`, or the session builder's
    /// `save_snapshots` / `restore_from`), as with any store. `spec` is what a new
    /// session's claim records (a resumed one keeps the spec it has). It checks no lease:
    /// its claim is its fence.
    /// A fresh server's snapshots stream (created), for the tests.
    #[cfg(test)]
    pub(crate) async fn for_tests(client: &crate::ClusterClient) -> Self {
        let js = jetstream::new(client.nats().clone());
        let created = Self::open(
            js,
            &Namespace::default(),
            Duration::from_secs(60),
            Provisioning::Create { replicas: 1 },
        )
        .await;
        #[allow(clippy::expect_used)]
        created.expect("a test server takes the snapshots stream")
    }

    #[cfg(test)]
    pub(crate) fn writer(
        &self,
        session: &SessionKey,
        worker: &str,
        spec: &SessionSpec,
    ) -> SnapshotWriter {
        let spec = serde_json::to_vec(spec).unwrap_or_default();
        SnapshotWriter::new(self.clone(), session.clone(), worker, spec.into(), None)
    }

    /// The spec and the full snapshot (not yet brought up to date) that `last` follows.
    async fn spec_and_full(
        &self,
        session: &SessionKey,
        last: &StreamMessage,
        record: &SnapshotRecord,
    ) -> Result<(SessionSpec, Option<SessionSnapshot>), StoreError> {
        if record.full == 0 {
            // No full snapshot yet: the last message is a claim, which has the spec.
            if record.kind != SnapshotKind::Claim {
                return Err(corrupt(
                    session,
                    format!("a {:?} without a full snapshot before it", record.kind),
                ));
            }
            let spec = serde_json::from_slice(&last.payload)
                .map_err(|err| corrupt(session, format!("its spec: {err}")))?;
            return Ok((spec, None));
        }
        let full = if record.kind == SnapshotKind::Full {
            last.clone()
        } else {
            self.stream
                .direct_get(record.full)
                .await
                .map_err(|err| StoreError::Unavailable {
                    session: session.to_string(),
                    reason: format!("cannot read its full snapshot {}: {err}", record.full),
                })?
        };
        let payload = self
            .payload(&full)
            .await
            .map_err(|reason| StoreError::Unavailable {
                session: session.to_string(),
                reason,
            })?;
        let (spec, snapshot) = decode_full(&payload).map_err(|reason| corrupt(session, reason))?;
        Ok((spec, Some(snapshot)))
    }

    /// Brings `snapshot` (the full one at `full_seq`) up to date with the deltas after it,
    /// before `until`, with the engine's one rule (`SnapshotChain`): a delta that does not
    /// follow ends the chain there (logged), and what follows it cannot apply either.
    async fn apply_deltas(
        &self,
        session: &SessionKey,
        snapshot: SessionSnapshot,
        full_seq: u64,
        until: u64,
    ) -> Result<SessionSnapshot, StoreError> {
        let subject = self.subject(session);
        let mut chain = SnapshotChain::new();
        chain.full(snapshot);
        let mut at = full_seq + 1;
        // No full snapshot lies between `full_seq` and `until`: once ended, the chain
        // stays so, and nothing more needs reading.
        while at < until && chain.end().is_none() {
            let message = match self
                .stream
                .direct_get_next_for_subject(subject.clone(), Some(at))
                .await
            {
                Ok(message) => message,
                Err(err) if err.kind() == DirectGetErrorKind::NotFound => break,
                Err(err) => {
                    return Err(StoreError::Unavailable {
                        session: session.to_string(),
                        reason: format!("cannot read {subject} from {at}: {err}"),
                    })
                }
            };
            if message.sequence >= until {
                break;
            }
            at = message.sequence + 1;
            let record = SnapshotRecord::read(&message).map_err(|err| unmarked(session, err))?;
            if record.kind != SnapshotKind::Delta {
                continue;
            }
            let payload =
                self.payload(&message)
                    .await
                    .map_err(|reason| StoreError::Unavailable {
                        session: session.to_string(),
                        reason,
                    })?;
            match SnapshotDelta::from_bytes(&payload) {
                Ok(delta) => {
                    chain.delta(&delta);
                }
                Err(err) => chain.unreadable(&err, false),
            }
        }
        if let Some(end) = chain.end() {
            tracing::warn!(%session, reason = %end.reason, "a delta does not follow: the chain ends before it");
        }
        // A full snapshot was fed first: there is one.
        chain
            .into_snapshot()
            .ok_or_else(|| corrupt(session, "no full snapshot".into()))
    }

    /// The snapshot `last` ends the chain of, read without claiming.
    async fn read_chain(
        &self,
        session: &SessionKey,
        last: &StreamMessage,
        record: &SnapshotRecord,
        until: u64,
    ) -> Result<Option<SessionSnapshot>, StoreError> {
        let (_spec, full) = self.spec_and_full(session, last, record).await?;
        Ok(match full {
            Some(full) => Some(self.apply_deltas(session, full, record.full, until).await?),
            None => None,
        })
    }

    fn message(
        &self,
        kind: SnapshotKind,
        epoch: u64,
        worker: &str,
        full: u64,
        payload: Bytes,
    ) -> PublishMessage {
        let mut headers = HeaderMap::new();
        headers.insert(KIND, kind.as_str());
        headers.insert(EPOCH, epoch.to_string().as_str());
        headers.insert(WORKER, worker);
        if full != 0 {
            headers.insert(FULL, full.to_string().as_str());
        }
        PublishMessage::build().payload(payload).headers(headers)
    }

    /// Writes `message` if the subject's last sequence is `expected` (0: no message).
    async fn write(
        &self,
        subject: &str,
        message: PublishMessage,
        expected: u64,
    ) -> Result<u64, WriteError> {
        let written = publish_if_last(&self.js, subject.to_owned(), message, expected).await;
        let counter = match written {
            Ok(_) => &self.counts.written,
            Err(_) => &self.counts.failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        written
    }

    /// Removes the messages of `subject` before `seq`.
    async fn purge_before(&self, subject: &str, seq: u64) {
        // Every removal of a session's messages, for a fault campaign's log to account for.
        tracing::debug!(subject, before = seq, "purging old snapshots");
        if let Err(err) = self.stream.purge().filter(subject).sequence(seq).await {
            tracing::debug!(subject, error = %err, "old snapshots not purged (the next full one will)");
        }
    }
}

fn unavailable(session: &SessionKey, err: StreamError) -> StoreError {
    StoreError::Unavailable {
        session: session.to_string(),
        reason: err.to_string(),
    }
}

/// A refused claim's error, saying who holds the session: the writer of the subject's last
/// message.
fn held_by(err: StoreError, last: Option<&SnapshotRecord>) -> StoreError {
    match (err, last) {
        (StoreError::Fenced { session, reason }, Some(record)) => StoreError::Fenced {
            session,
            reason: format!(
                "{reason} (its last message, {:?} at seq {}, is by {} at epoch {})",
                record.kind, record.seq, record.worker, record.epoch
            ),
        },
        (err, _) => err,
    }
}

fn unmarked(session: &SessionKey, err: StreamError) -> StoreError {
    corrupt(session, err.to_string())
}

fn corrupt(session: &SessionKey, reason: String) -> StoreError {
    StoreError::Snapshot(switchboard::snapshot::SnapshotError::Corrupt {
        reason: format!("session {session}'s snapshots: {reason}"),
    })
}

/// A full message: the spec's length (4 bytes, little-endian), the spec (JSON), the
/// snapshot (its checked binary frame).
fn encode_full(spec: &[u8], snapshot: &SessionSnapshot) -> Bytes {
    let bytes = snapshot.to_bytes();
    let mut out = Vec::with_capacity(4 + spec.len() + bytes.len());
    out.extend_from_slice(&u32::try_from(spec.len()).unwrap_or(u32::MAX).to_le_bytes());
    out.extend_from_slice(spec);
    out.extend_from_slice(&bytes);
    out.into()
}

fn decode_full(payload: &[u8]) -> Result<(SessionSpec, SessionSnapshot), String> {
    let len = payload
        .get(..4)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map(u32::from_le_bytes)
        .ok_or("a full snapshot shorter than its header")?;
    let len = usize::try_from(len).map_err(|err| err.to_string())?;
    let spec = payload
        .get(4..4 + len)
        .ok_or("a full snapshot shorter than its spec")?;
    let spec = serde_json::from_slice(spec).map_err(|err| format!("its spec: {err}"))?;
    let snapshot =
        SessionSnapshot::from_bytes(&payload[4 + len..]).map_err(|err| err.to_string())?;
    Ok((spec, snapshot))
}

/// What a claim found on a session's subject.
enum Found {
    /// Nothing to resume: the claim is the subject's first message, or follows its end.
    Fresh,
    /// A session that ran before: its spec and its snapshot, read after the claim.
    Resumed {
        spec: SessionSpec,
        snapshot: Option<Box<SessionSnapshot>>,
    },
}

/// One owner's writer of one session's snapshots: the [`SnapshotStore`] its session saves
/// to (see the module docs). A refused write fences the writer until it claims again.
/// Cheap to clone.
#[derive(Clone)]
pub(crate) struct SnapshotWriter {
    inner: Arc<WriterInner>,
}

impl std::fmt::Debug for SnapshotWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotWriter")
            .field("session", &self.inner.session)
            .field("claim", &self.held())
            .finish()
    }
}

struct WriterInner {
    stream: SnapshotStream,
    session: SessionKey,
    subject: String,
    worker: String,
    /// Held across each write: the session's saving writes one at a time, and a drain's
    /// last snapshot waits for a write under way.
    state: Mutex<WriterState>,
    /// The claim this writer holds (read without waiting for a write).
    claim: std::sync::Mutex<Claim>,
    /// A worker's lease on the session (none: a writer outside a worker).
    lease: Option<LeaseClock>,
    /// The last host input id of the newest snapshot written, as a watch: a worker's loop
    /// answers an input once a stored snapshot holds it.
    saved_input: watch::Sender<u64>,
    /// Writes refused: by the store (fenced) or because the lease could not be trusted.
    refused: AtomicU64,
    fenced: watch::Sender<bool>,
}

struct WriterState {
    /// The epoch of this writer's claim.
    epoch: u64,
    /// The subject's last sequence, as this writer wrote it.
    last: u64,
    /// The sequence of the last full snapshot.
    full: u64,
    /// The chain's `seq` as written: what the next delta's base must be (`None`: not
    /// known, and a delta is refused until a full snapshot).
    chain: Option<u64>,
    /// The session's spec, as JSON: what a full snapshot carries.
    spec: Bytes,
    /// Closed: writes are dropped (the session moved or ended; what it does while it
    /// closes is not the conversation).
    sealed: bool,
}

impl SnapshotWriter {
    fn new(
        stream: SnapshotStream,
        session: SessionKey,
        worker: &str,
        spec: Bytes,
        lease: Option<LeaseClock>,
    ) -> Self {
        Self {
            inner: Arc::new(WriterInner {
                subject: stream.subject(&session),
                claim: std::sync::Mutex::new(Claim::new(session.as_str(), 0, StoreVersion::new(0))),
                stream,
                session,
                worker: worker.to_owned(),
                state: Mutex::new(WriterState {
                    epoch: 0,
                    last: 0,
                    full: 0,
                    chain: None,
                    spec,
                    sealed: false,
                }),
                lease,
                saved_input: watch::channel(0).0,
                refused: AtomicU64::new(0),
                fenced: watch::channel(false).0,
            }),
        }
    }

    /// The claim this writer holds: its epoch, and the sequence of its claim message (what
    /// its session's first write follows). Give it to `SessionBuilder::save_claimed`.
    pub(crate) fn held(&self) -> Claim {
        self.inner
            .claim
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The owner's epoch.
    pub(crate) fn epoch(&self) -> u64 {
        self.held().epoch()
    }

    /// The last host input id of the newest snapshot written (0: none).
    pub(crate) fn saved_input(&self) -> u64 {
        *self.inner.saved_input.borrow()
    }

    /// A watch of [`saved_input`](Self::saved_input).
    pub(crate) fn saved(&self) -> watch::Receiver<u64> {
        self.inner.saved_input.subscribe()
    }

    /// Writes refused so far (fenced, or the lease not trusted).
    pub(crate) fn refused(&self) -> u64 {
        self.inner.refused.load(Ordering::Relaxed)
    }

    /// Changes to true once a write was refused because a newer owner wrote the subject.
    pub(crate) fn fenced(&self) -> watch::Receiver<bool> {
        self.inner.fenced.subscribe()
    }

    /// Marks the writer fenced, as a refused write would: a newer owner of the session
    /// (this same worker, claiming it again) wrote its snapshots.
    pub(crate) fn fence(&self) {
        self.inner.fenced.send_replace(true);
    }

    /// From now on writes are dropped (the session moved or ends).
    pub(crate) async fn seal(&self) {
        self.inner.state.lock().await.sealed = true;
    }

    /// Claims the session for this writer, if `rule` allows it over the subject's last
    /// message (whose epoch is the last claim's: only the latest claimant writes), at the
    /// epoch the rule gives: a write over that message, then a read of the chain it
    /// closes. `create`: an empty or ended subject gets a fresh claim with this writer's
    /// spec; without it, nothing is written there (`None`). A refused claim is
    /// [`StoreError::Fenced`] naming who holds the session, and writes nothing.
    async fn claim_over(&self, rule: ClaimRule, create: bool) -> Result<Option<Found>, StoreError> {
        let inner = &self.inner;
        let stream = &inner.stream;
        let session = &inner.session;
        let unavailable = |reason| StoreError::Unavailable {
            session: session.to_string(),
            reason,
        };
        let mut state = inner.state.lock().await;
        // A worker whose lease was lost (or whose connection dropped since its renewal)
        // may have had the session claimed under it: its claim would fence the newer
        // owner's snapshots.
        let untrusted = || {
            inner
                .lease
                .as_ref()
                .is_some_and(|lease| !lease.is_trusted_at(std::time::Instant::now()))
        };
        if untrusted() {
            return Err(unavailable(
                "this worker's lease cannot be trusted now".into(),
            ));
        }
        // A new session: its claim is the subject's first message, one round trip.
        if create {
            let epoch = rule.epoch_after(session.as_str(), 0)?;
            let claim = stream.message(
                SnapshotKind::Claim,
                epoch,
                &inner.worker,
                0,
                state.spec.clone(),
            );
            match stream.write(&inner.subject, claim, 0).await {
                Ok(seq) => {
                    self.adopt(&mut state, epoch, seq, 0, None);
                    return Ok(Some(Found::Fresh));
                }
                Err(WriteError::Moved) => {}
                Err(WriteError::Other(reason)) => return Err(unavailable(reason)),
            }
        }
        // Something is there: claim over the last message, then read what it follows.
        for _ in 0..5 {
            // The claim goes over the subject's last message (whose epoch is the last
            // claim's, parts included); what it resumes is the chain's, which ends before
            // any parts a writer left unfinished.
            let tail = stream.tail(session).await?;
            let (expected, last_epoch) =
                tail.as_ref().map_or((0, 0), |t| (t.last_seq, t.last_epoch));
            let epoch = rule
                .epoch_after(session.as_str(), last_epoch)
                .map_err(|err| held_by(err, tail.as_ref().map(|t| &t.record)))?;
            match tail.map(|t| (t.message, t.record)) {
                Some((message, record)) if record.kind != SnapshotKind::Ended => {
                    let (spec, full) = stream.spec_and_full(session, &message, &record).await?;
                    let spec_json = serde_json::to_vec(&spec)
                        .map_err(|err| corrupt(session, err.to_string()))?;
                    let claim = stream.message(
                        SnapshotKind::Claim,
                        epoch,
                        &inner.worker,
                        record.full,
                        spec_json.clone().into(),
                    );
                    let fence = match stream.write(&inner.subject, claim, expected).await {
                        Ok(seq) => seq,
                        Err(WriteError::Moved) => continue,
                        Err(WriteError::Other(reason)) => return Err(unavailable(reason)),
                    };
                    // Nobody can write behind the claim now: what follows the full
                    // snapshot up to it is final.
                    let snapshot = match full {
                        Some(full) => Some(Box::new(
                            stream
                                .apply_deltas(session, full, record.full, fence)
                                .await?,
                        )),
                        None => None,
                    };
                    state.spec = spec_json.into();
                    let chain = snapshot.as_ref().map(|s| s.seq());
                    self.adopt(&mut state, epoch, fence, record.full, chain);
                    return Ok(Some(Found::Resumed { spec, snapshot }));
                }
                _ => {
                    if !create {
                        return Ok(None);
                    }
                    let claim = stream.message(
                        SnapshotKind::Claim,
                        epoch,
                        &inner.worker,
                        0,
                        state.spec.clone(),
                    );
                    match stream.write(&inner.subject, claim, expected).await {
                        Ok(seq) => {
                            self.adopt(&mut state, epoch, seq, 0, None);
                            return Ok(Some(Found::Fresh));
                        }
                        Err(WriteError::Moved) => continue,
                        Err(WriteError::Other(reason)) => return Err(unavailable(reason)),
                    }
                }
            }
        }
        Err(unavailable(
            "the subject kept changing under the claim".into(),
        ))
    }

    /// The writer holds a new claim: its epoch, its claim message's sequence, the full
    /// snapshot and chain position it follows.
    fn adopt(&self, state: &mut WriterState, epoch: u64, seq: u64, full: u64, chain: Option<u64>) {
        *state = WriterState {
            epoch,
            last: seq,
            full,
            chain,
            spec: std::mem::take(&mut state.spec),
            sealed: false,
        };
        *self.inner.claim.lock().unwrap_or_else(|p| p.into_inner()) =
            Claim::new(self.inner.session.as_str(), epoch, StoreVersion::new(seq));
        self.inner.fenced.send_replace(false);
    }

    /// Writes a full snapshot now (a drain's last one), even after sealing, after the last
    /// message this writer wrote.
    pub(crate) async fn save_last(&self, snapshot: &SessionSnapshot) -> Result<(), StoreError> {
        let mut state = self.inner.state.lock().await;
        let after = state.last;
        self.write_full(&mut state, snapshot, after)
            .await
            .map(|_| ())
    }

    /// The session ended: writes its tombstone (compare-and-set, so a stale owner cannot
    /// end a session a newer one runs) and purges what came before it.
    pub(crate) async fn end(&self) -> Result<(), StoreError> {
        let inner = &self.inner;
        let mut state = inner.state.lock().await;
        state.sealed = true;
        let after = state.last;
        let ttl = Some(inner.stream.ended_retention);
        let (_, seq) = self
            .write_message(&mut state, SnapshotKind::Ended, 0, Bytes::new(), ttl, after)
            .await?;
        inner.stream.purge_before(&inner.subject, seq).await;
        Ok(())
    }

    async fn write_full(
        &self,
        state: &mut WriterState,
        snapshot: &SessionSnapshot,
        after: u64,
    ) -> Result<u64, StoreError> {
        let inner = &self.inner;
        let payload = encode_full(&state.spec, snapshot);
        let before = state.full;
        let (first, seq) = self
            .write_message(state, SnapshotKind::Full, 0, payload, None, after)
            .await?;
        state.full = seq;
        state.chain = Some(snapshot.seq());
        if let Some(input) = snapshot.last_input() {
            inner.saved_input.send_if_modified(|saved| {
                let moved = input > *saved;
                *saved = (*saved).max(input);
                moved
            });
        }
        // The chain before it (before its first part) is garbage now. (Before the first
        // full one there is only this owner's claim: not worth a round trip.)
        if before != 0 {
            inner.stream.purge_before(&inner.subject, first).await;
        }
        Ok(seq)
    }

    async fn write_delta(
        &self,
        state: &mut WriterState,
        delta: &SnapshotDelta,
        after: u64,
    ) -> Result<u64, StoreError> {
        let inner = &self.inner;
        // Only after a full snapshot, and only the link that follows the chain as this
        // writer wrote it.
        if state.full == 0 || (after == state.last && state.chain != Some(delta.base())) {
            return Err(StoreError::NoBase {
                session: inner.session.to_string(),
            });
        }
        let full = state.full;
        let payload = delta.to_bytes().into();
        let (_, seq) = self
            .write_message(state, SnapshotKind::Delta, full, payload, None, after)
            .await?;
        state.chain = Some(delta.base() + 1);
        if let Some(input) = delta.last_input() {
            inner.saved_input.send_if_modified(|saved| {
                let moved = input > *saved;
                *saved = (*saved).max(input);
                moved
            });
        }
        Ok(seq)
    }

    /// Writes `message` (whose payload is `payload`) if the subject's last sequence is
    /// `after`; see the module docs.
    async fn write_locked(
        &self,
        state: &mut WriterState,
        message: PublishMessage,
        payload: &Bytes,
        after: u64,
    ) -> Result<u64, StoreError> {
        let inner = &self.inner;
        let session = inner.session.to_string();
        if *inner.fenced.borrow() {
            inner.refused.fetch_add(1, Ordering::Relaxed);
            inner.stream.counts.failed.fetch_add(1, Ordering::Relaxed);
            return Err(StoreError::Fenced {
                session,
                reason: "a newer owner wrote the session".into(),
            });
        }
        if inner.lease.as_ref().is_some_and(|lease| !lease.is_valid()) {
            inner.refused.fetch_add(1, Ordering::Relaxed);
            inner.stream.counts.failed.fetch_add(1, Ordering::Relaxed);
            return Err(StoreError::Unavailable {
                session,
                reason: "this worker's lease on the session cannot be trusted now".into(),
            });
        }
        let mut expected = after;
        // Twice at most: the second after finding that an earlier write of ours whose
        // answer was lost did land.
        for _ in 0..2 {
            match inner
                .stream
                .write(&inner.subject, message.clone(), expected)
                .await
            {
                Ok(seq) => {
                    state.last = seq;
                    return Ok(seq);
                }
                Err(WriteError::Moved) => {
                    let last = inner.stream.last(&inner.subject).await.map_err(|err| {
                        StoreError::Unavailable {
                            session: session.clone(),
                            reason: err.to_string(),
                        }
                    })?;
                    let record = last.as_ref().and_then(|m| SnapshotRecord::read(m).ok());
                    match record {
                        Some(record)
                            if record.epoch == state.epoch
                                && record.worker == inner.worker
                                && record.seq > expected =>
                        {
                            expected = record.seq;
                            state.last = record.seq;
                            // This very write landed: written once is enough (a part
                            // written twice would break its message).
                            if last.is_some_and(|m| m.payload == *payload) {
                                return Ok(record.seq);
                            }
                            if record.kind == SnapshotKind::Full {
                                state.full = record.seq;
                            }
                            // What the lost write did to the chain is not known here.
                            state.chain = None;
                        }
                        other => {
                            inner.fenced.send_replace(true);
                            inner.refused.fetch_add(1, Ordering::Relaxed);
                            let now = match other {
                                Some(r) => format!(
                                    "its last message ({:?}, seq {}) is by {} at epoch {}",
                                    r.kind, r.seq, r.worker, r.epoch
                                ),
                                None => "its messages are gone".to_owned(),
                            };
                            tracing::warn!(session = %inner.session, epoch = state.epoch, %now, "snapshot write refused: fenced");
                            return Err(StoreError::Fenced {
                                session,
                                reason: now,
                            });
                        }
                    }
                }
                Err(WriteError::Other(reason)) => {
                    return Err(StoreError::Unavailable { session, reason })
                }
            }
        }
        Err(StoreError::Unavailable {
            session,
            reason: "the subject kept changing under the write".into(),
        })
    }

    /// What a write after the seal gets. Refused, not dropped as if written: a call
    /// waiting to be recorded must not take a write nobody stores for its record (after a
    /// drain's last snapshot a queued turn may still call an `Abandon` tool; its body would
    /// run here, and again on the next owner, which resumes without it).
    fn sealed(&self) -> StoreError {
        StoreError::Unavailable {
            session: self.inner.session.to_string(),
            reason: "the session moved or ended here: this owner writes nothing more".into(),
        }
    }

    fn own(&self, session: &str) -> Result<(), StoreError> {
        if session == self.inner.session.as_str() {
            Ok(())
        } else {
            Err(StoreError::BadId {
                id: format!("{session} (this writer writes {})", self.inner.session),
            })
        }
    }
}

impl SnapshotStore for SnapshotWriter {
    fn claim(
        &self,
        session: &str,
        rule: ClaimRule,
    ) -> BoxFuture<'static, Result<switchboard::snapshot::Claimed, StoreError>> {
        let this = self.clone();
        let own = self.own(session);
        async move {
            own?;
            let snapshot = match this.claim_over(rule, true).await? {
                Some(Found::Resumed { snapshot, .. }) => snapshot.map(|s| *s),
                Some(Found::Fresh) | None => None,
            };
            Ok(switchboard::snapshot::Claimed::new(this.held(), snapshot))
        }
        .boxed()
    }

    fn save(
        &self,
        snapshot: SessionSnapshot,
        after: StoreVersion,
    ) -> BoxFuture<'static, Result<StoreVersion, StoreError>> {
        // Taken by value: encoded in the future (on the session's writer task, off the
        // session's own thread).
        let this = self.clone();
        async move {
            let mut state = this.inner.state.lock().await;
            if state.sealed {
                return Err(this.sealed());
            }
            this.write_full(&mut state, &snapshot, after.get())
                .await
                .map(StoreVersion::new)
        }
        .boxed()
    }

    fn append(
        &self,
        delta: SnapshotDelta,
        after: StoreVersion,
    ) -> BoxFuture<'static, Result<StoreVersion, StoreError>> {
        let this = self.clone();
        async move {
            let mut state = this.inner.state.lock().await;
            if state.sealed {
                return Err(this.sealed());
            }
            this.write_delta(&mut state, &delta, after.get())
                .await
                .map(StoreVersion::new)
        }
        .boxed()
    }

    fn load(
        &self,
        session: &str,
    ) -> BoxFuture<'static, Result<Option<SessionSnapshot>, StoreError>> {
        let stream = self.inner.stream.clone();
        let key = SessionKey::new(session).map_err(|_| StoreError::BadId {
            id: session.to_owned(),
        });
        async move {
            let key = key?;
            Ok(stream.load(&key).await?.and_then(|stored| stored.snapshot))
        }
        .boxed()
    }

    fn remove(&self, session: &str) -> BoxFuture<'static, Result<(), StoreError>> {
        let this = self.clone();
        let own = self.own(session);
        async move {
            own?;
            this.end().await
        }
        .boxed()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod two_restorers;

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::local::NatsServer;
    use std::time::Instant;
    use switchboard::prelude::*;
    use switchboard::testing::{Reply, ScriptedLlm};

    /// A real snapshot of a session named `id` after one turn.
    async fn a_snapshot(engine: &Engine, id: &str) -> SessionSnapshot {
        a_snapshot_saying(engine, id, "hi").await
    }

    /// A real snapshot of a session named `id` after one turn in which the user said
    /// `text`.
    async fn a_snapshot_saying(engine: &Engine, id: &str, text: &str) -> SessionSnapshot {
        let llm = ScriptedLlm::new([]);
        llm.otherwise(Reply::text("Hello."));
        let agent = Agent::builder("greeter")
            .instructions("Greet.")
            .build()
            .unwrap();
        let session = Session::builder()
            .llm(llm)
            .agent(agent)
            .id(id)
            .start(engine)
            .await
            .unwrap();
        session
            .apply(
                switchboard::InputId::new(1),
                switchboard::HostInput::Run { text: text.into() },
            )
            .await
            .unwrap();
        let snapshot = session.snapshot().await.unwrap();
        session.close().await.unwrap();
        snapshot
    }

    /// A stale owner's write is refused once a newer owner claimed the session, whatever
    /// its lease says: the store compares what it last wrote with the subject's last
    /// message, and the claim moved it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_by_an_owner_a_newer_one_claimed_over_is_fenced() {
        let server = NatsServer::start().unwrap();
        let client = server.connect().connect().await.unwrap();
        let stream = SnapshotStream::for_tests(&client).await;
        let key = SessionKey::new("call-1").unwrap();
        let spec = SessionSpec::new("greeter");
        // Leases both trust: only the store decides.
        let lease = || LeaseClock::until(Instant::now() + Duration::from_secs(600));
        let engine = Engine::with_arbiters(1).unwrap();
        let snapshot = a_snapshot(&engine, key.as_str()).await;

        let Ok(Claimed::Fresh(first)) = stream.claim(&key, 1, "w1", Some(&spec), lease()).await
        else {
            panic!("a new session's claim is fresh");
        };
        let saved = first
            .save(snapshot.clone(), first.held().version())
            .await
            .unwrap();
        assert_eq!(first.saved_input(), 1);

        // w2 claims it (its lease expired, say): one epoch higher, from w1's snapshot.
        let Ok(Claimed::Resumed {
            writer: second,
            spec: read_spec,
            snapshot: Some(restored),
        }) = stream.claim(&key, 1, "w2", None, lease()).await
        else {
            panic!("the claim of a session with a snapshot resumes it");
        };
        assert_eq!(second.epoch(), 2);
        assert_eq!(read_spec, spec);
        assert_eq!(restored.to_bytes(), snapshot.to_bytes());

        // w1 wakes and writes: refused, for good.
        match first.save(snapshot.clone(), saved).await {
            Err(StoreError::Fenced { session, reason }) => {
                assert_eq!(session, "call-1");
                assert!(reason.contains("w2"), "{reason}");
            }
            other => panic!("a stale owner's write went through: {other:?}"),
        }
        assert!(*first.fenced().borrow());
        assert!(matches!(first.end().await, Err(StoreError::Fenced { .. })));
        assert_eq!(first.refused(), 2);

        // w2 writes on; what the store holds is w2's.
        second
            .save(snapshot.clone(), second.held().version())
            .await
            .unwrap();
        let stored = stream.load(&key).await.unwrap().unwrap();
        assert_eq!((stored.epoch, stored.worker.as_str()), (2, "w2"));
        let kinds: Vec<_> = stream
            .records(&key)
            .await
            .unwrap()
            .into_iter()
            .map(|r| (r.kind, r.epoch, r.worker))
            .collect();
        assert_eq!(
            kinds.last(),
            Some(&(SnapshotKind::Full, 2, "w2".to_owned()))
        );
        assert!(kinds
            .iter()
            .all(|(_, epoch, worker)| *epoch == 2 || worker == "w1"));
    }

    /// A session that ended cannot be resumed: a resume job finds nothing, writes
    /// nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_ended_session_is_not_resumed() {
        let server = NatsServer::start().unwrap();
        let client = server.connect().connect().await.unwrap();
        let stream = SnapshotStream::for_tests(&client).await;
        let key = SessionKey::new("call-2").unwrap();
        let lease = || LeaseClock::until(Instant::now() + Duration::from_secs(600));
        let Ok(Claimed::Fresh(writer)) = stream
            .claim(&key, 1, "w1", Some(&SessionSpec::new("greeter")), lease())
            .await
        else {
            panic!("a new session's claim is fresh");
        };
        assert!(stream.resumable(&key).await.unwrap());
        writer.end().await.unwrap();
        assert!(!stream.resumable(&key).await.unwrap());
        assert!(matches!(
            stream.claim(&key, 1, "w2", None, lease()).await,
            Ok(Claimed::Nothing)
        ));
        assert!(stream.load(&key).await.unwrap().is_none());
    }

    /// Once sealed (a drain took its last snapshot, the session ends or is fenced) the
    /// session's own writes are refused, not dropped as if stored: a call waiting for a
    /// stored snapshot to hold it is not made. The drain's last snapshot still goes, past
    /// the seal, and is what the next owner resumes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_sealed_writer_refuses_the_session_s_writes_but_takes_the_last_snapshot() {
        let server = NatsServer::start().unwrap();
        let client = server.connect().connect().await.unwrap();
        let stream = SnapshotStream::for_tests(&client).await;
        let key = SessionKey::new("call-sealed").unwrap();
        let lease = || LeaseClock::until(Instant::now() + Duration::from_secs(600));
        let engine = Engine::with_arbiters(1).unwrap();
        let last = a_snapshot_saying(&engine, key.as_str(), "the last").await;
        let later = a_snapshot_saying(&engine, key.as_str(), "after the seal").await;
        let Ok(Claimed::Fresh(writer)) = stream
            .claim(&key, 1, "w1", Some(&SessionSpec::new("greeter")), lease())
            .await
        else {
            panic!("a new session's claim is fresh");
        };
        let version = writer.held().version();
        writer.seal().await;
        writer.save_last(&last).await.unwrap();
        match writer.save(later, version).await {
            Err(StoreError::Unavailable { reason, .. }) => {
                assert!(reason.contains("writes nothing more"), "{reason}");
            }
            other => panic!("a write after the seal is refused, not {other:?}"),
        }
        let stored = stream.load(&key).await.unwrap().unwrap();
        assert_eq!(
            stored.snapshot.unwrap().to_bytes(),
            last.to_bytes(),
            "the next owner resumes the drain's last snapshot"
        );
    }

    /// A snapshot three times the size of the server's largest message is written in
    /// parts, and the next owner's claim reads it back whole; parts left by a writer that
    /// stopped between them are not the chain.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_snapshot_over_the_server_s_limit_is_written_in_parts_and_read_back_whole() {
        let server = NatsServer::start().unwrap();
        let client = server.connect().connect().await.unwrap();
        let max_payload = client.nats().max_payload();
        let stream = SnapshotStream::for_tests(&client).await;
        let key = SessionKey::new("call-3").unwrap();
        let spec = SessionSpec::new("greeter");
        let lease = || LeaseClock::until(Instant::now() + Duration::from_secs(600));
        let engine = Engine::with_arbiters(1).unwrap();
        let text = "a long story, ".repeat(3 * max_payload / 14);
        let big = a_snapshot_saying(&engine, key.as_str(), &text).await;
        assert!(big.to_bytes().len() > 3 * max_payload);

        let Ok(Claimed::Fresh(first)) = stream.claim(&key, 1, "w1", Some(&spec), lease()).await
        else {
            panic!("a new session's claim is fresh");
        };
        first
            .save(big.clone(), first.held().version())
            .await
            .unwrap();
        let kinds: Vec<_> = stream
            .records(&key)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.kind)
            .collect();
        assert_eq!(kinds.first(), Some(&SnapshotKind::Claim));
        assert_eq!(kinds.last(), Some(&SnapshotKind::Full));
        assert!(
            kinds.iter().filter(|k| **k == SnapshotKind::Part).count() >= 3,
            "{kinds:?}"
        );
        // The full message names each of its parts by sequence: a reader fetches them so,
        // whatever the server's index of the subject says.
        let parts: Vec<String> = stream
            .records(&key)
            .await
            .unwrap()
            .into_iter()
            .filter(|r| r.kind == SnapshotKind::Part)
            .map(|r| r.seq.to_string())
            .collect();
        let full = stream.last(&stream.subject(&key)).await.unwrap().unwrap();
        assert_eq!(
            full.headers
                .get(parts::PART_SEQS)
                .map(|v| v.as_str().to_owned()),
            Some(parts.join(","))
        );

        // A writer that stops between the parts of its next full snapshot: its parts
        // are at the subject's end, and no message closes them.
        {
            let mut state = first.inner.state.lock().await;
            let limit = stream.message_limit();
            let payload = encode_full(&state.spec, &big);
            let before = state.last;
            for piece in parts::pieces(&payload, limit).into_iter().take(2) {
                let message = stream
                    .message(
                        SnapshotKind::Part,
                        state.epoch,
                        "w1",
                        state.full,
                        piece.clone(),
                    )
                    .header(parts::BEFORE, before.to_string().as_str());
                let after = state.last;
                first
                    .write_locked(&mut state, message, &piece, after)
                    .await
                    .unwrap();
            }
        }
        assert_eq!(
            stream.records(&key).await.unwrap().last().map(|r| r.kind),
            Some(SnapshotKind::Part)
        );

        // The next owner reads the whole snapshot, and fences the first.
        let Ok(Claimed::Resumed {
            writer: second,
            snapshot: Some(restored),
            ..
        }) = stream.claim(&key, 1, "w2", None, lease()).await
        else {
            panic!("the claim of a session with a snapshot resumes it");
        };
        assert_eq!(restored.to_bytes(), big.to_bytes());
        let after = first.held().version();
        assert!(matches!(
            first.save(big.clone(), after).await,
            Err(StoreError::Fenced { .. })
        ));
        // Its own full snapshot in parts purges what came before them.
        second
            .save(big.clone(), second.held().version())
            .await
            .unwrap();
        let records = stream.records(&key).await.unwrap();
        assert!(
            records
                .iter()
                .all(|r| r.epoch == 2 && matches!(r.kind, SnapshotKind::Part | SnapshotKind::Full)),
            "{records:?}"
        );
        let stored = stream.load(&key).await.unwrap().unwrap();
        assert_eq!(stored.snapshot.unwrap().to_bytes(), big.to_bytes());
    }
}
