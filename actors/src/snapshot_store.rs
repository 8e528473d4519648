//! Where snapshots go: the [`SnapshotStore`] contract, an in-memory store
//! ([`MemoryStore`]) and a file store for a single machine ([`FileStore`]). The cluster
//! crate (`switchboard-cluster`) brings its own, on NATS JetStream, on the same contract.
//!
//! A store keeps, per session, a **record**: the last full snapshot and the deltas taken
//! after it ([`SnapshotStore::load`] gives the snapshot with every delta applied, read with
//! the one rule of [`SnapshotChain`](crate::SnapshotChain)), the epoch of the last claim,
//! and a **version** that moves with every write.
//!
//! **Every write is conditional on what the writer last saw** (the model is an HTTP ETag,
//! or Orleans' grain state): a writer first **claims** the session
//! ([`SnapshotStore::claim`]), which moves the version and issues a new epoch; each save
//! or append names the version the writer last got back and is refused with
//! [`StoreError::Fenced`] when the record is not at it any more. So a claim fences every
//! writer before it: two processes that restore one session cannot both save it — the
//! later claim wins, and the earlier writer's next write is refused (its session stops
//! saving and says so: [`SessionEvent::Fenced`](crate::SessionEvent::Fenced)). A delta
//! that does not follow what the record holds is refused with [`StoreError::NoBase`].
//!
//! A session told to ([`SessionBuilder::save_snapshots`](crate::SessionBuilder::save_snapshots))
//! claims its record when it starts and saves after every settled turn: a delta, or a full
//! snapshot when the store may lack what a delta would follow or has collected enough
//! deltas.
//!
//! # A store of your own
//!
//! A database keeps one row per session with a version column, and every write is a
//! compare-and-set on it:
//!
//! * `claim`: in one transaction, read the row (insert it if missing), set
//!   `epoch = max(epoch + 1, at_least)` and `version = version + 1`, and return both with
//!   the snapshot the row holds, read after the update (with its deltas, through a
//!   [`SnapshotChain`](crate::SnapshotChain)).
//! * `save`: `UPDATE sessions SET snapshot = ?, deltas = '', chain = ?, version =
//!   version + 1 WHERE id = ? AND version = ?` — no row updated: [`StoreError::Fenced`].
//! * `append`: the same condition, and the delta's base must be the row's chain position
//!   (else [`StoreError::NoBase`], nothing written); append the delta and move both on.
//! * `remove`: delete the row (a writer's next write then finds no row: fenced).
//!
//! Versions must never repeat for a session, also after a `remove` (a stale writer must not
//! find its old version again): keep them increasing across the whole table, or start a new
//! row's version from a clock. A store whose write can land without its answer reaching
//! the writer (a network store) should, when a write finds the version moved, look at who
//! moved it: a record last written by a snapshot of the same epoch was moved by this
//! writer's own lost write, and the write may go on after it (the cluster's store does).

use futures_util::future::BoxFuture;

use crate::snapshot::{SessionSnapshot, SnapshotDelta, StoreError};

mod file;
mod memory;

pub use file::FileStore;
pub use memory::MemoryStore;

/// The version of a session's record in a store, as a writer last saw it: every write names
/// it, and the store refuses the write when the record moved since (the writer is stale).
/// What the number means is the store's (a counter, a stream sequence, a version column);
/// a store never issues one twice for a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StoreVersion(u64);

impl StoreVersion {
    /// The version numbered `n` in its store.
    pub const fn new(n: u64) -> Self {
        Self(n)
    }

    /// Its number.
    pub const fn get(self) -> u64 {
        self.0
    }
}

/// A writer's hold on a session in a store, from [`SnapshotStore::claim`]: the epoch the
/// store issued for it and the version its first write follows. Hand it to
/// [`SessionBuilder::save_claimed`](crate::SessionBuilder::save_claimed) for a session
/// to save under it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    session: String,
    epoch: u64,
    version: StoreVersion,
}

impl Claim {
    /// A claim of `session` at `epoch`, whose first write follows `version` (what a
    /// store's [`claim`](SnapshotStore::claim) returns).
    pub fn new(session: impl Into<String>, epoch: u64, version: StoreVersion) -> Self {
        Self {
            session: session.into(),
            epoch,
            version,
        }
    }

    /// The session claimed.
    pub fn session(&self) -> &str {
        &self.session
    }

    /// The epoch the store issued: one more than any claim of the session before it (and
    /// at least what the claimer asked for).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The version the writer's first write follows.
    pub fn version(&self) -> StoreVersion {
        self.version
    }
}

/// What [`SnapshotStore::claim`] gives: the claim, and the session's snapshot as the store
/// held it when the claim landed (nothing can be added behind it since).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Claimed {
    /// The writer's hold on the session.
    pub claim: Claim,
    /// The snapshot with every delta applied (`None`: the store holds none).
    pub snapshot: Option<SessionSnapshot>,
}

impl Claimed {
    /// What a store's claim returns.
    pub fn new(claim: Claim, snapshot: Option<SessionSnapshot>) -> Self {
        Self { claim, snapshot }
    }
}

/// Where a session's snapshots go: the contract of the module docs. Implement it to keep
/// them in a database or an object store (the module docs say how); [`MemoryStore`] and
/// [`FileStore`] ship with the engine.
pub trait SnapshotStore: Send + Sync + 'static {
    /// Claims `session` for a new writer: moves the record's version (so every writer
    /// before is refused from now on) and issues an epoch one more than the last claim's,
    /// and at least `at_least`. Returns the claim and the snapshot the record holds, read
    /// after the claim landed. Makes the record if there is none.
    fn claim(
        &self,
        session: &str,
        at_least: u64,
    ) -> BoxFuture<'static, Result<Claimed, StoreError>>;

    /// Saves a full snapshot, replacing whatever the record held, if the record is still
    /// at `after` (the version of the claim or of this writer's last write); the new
    /// version. [`StoreError::Fenced`] when it is not: nothing written. Takes the snapshot
    /// by value: a store keeps or encodes it where it likes (off the session's thread),
    /// without a copy.
    fn save(
        &self,
        snapshot: SessionSnapshot,
        after: StoreVersion,
    ) -> BoxFuture<'static, Result<StoreVersion, StoreError>>;

    /// Adds a delta to the record, if it is still at `after` and the delta follows the
    /// chain it holds; the new version. [`StoreError::Fenced`] when the record moved,
    /// [`StoreError::NoBase`] when the delta does not follow (nothing written either way;
    /// a session then saves in full).
    fn append(
        &self,
        delta: SnapshotDelta,
        after: StoreVersion,
    ) -> BoxFuture<'static, Result<StoreVersion, StoreError>>;

    /// The session's last snapshot with every delta after it applied, if there is one.
    /// Reads only: it claims nothing.
    fn load(
        &self,
        session: &str,
    ) -> BoxFuture<'static, Result<Option<SessionSnapshot>, StoreError>>;

    /// Forgets the session: its snapshots and its record (every writer's next write is
    /// refused).
    fn remove(&self, session: &str) -> BoxFuture<'static, Result<(), StoreError>>;
}

/// The refusal of a write whose writer is not the record's latest.
pub(crate) fn fenced(session: &str, reason: impl Into<String>) -> StoreError {
    StoreError::Fenced {
        session: session.to_owned(),
        reason: reason.into(),
    }
}
