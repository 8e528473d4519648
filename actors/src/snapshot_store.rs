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
//! [`StoreError::Fenced`] when the record is not at it any more. So a claim that lands
//! fences every writer before it (its session stops saving and says so:
//! [`SessionEvent::Fenced`](crate::SessionEvent::Fenced)). A delta that does not follow
//! what the record holds is refused with [`StoreError::NoBase`].
//!
//! **A claim is conditional too**, by its [`ClaimRule`]:
//!
//! * a **restore** ([`ClaimRule::Restore`]) names the epoch of the snapshot it restores
//!   ([`SessionSnapshot::epoch`]) and lands only if nobody claimed the session after that
//!   snapshot's own writer did: the record's last claim is at that epoch or before. So of
//!   two processes restoring one stored state, the first claim lands and the second is
//!   refused ([`StoreError::Fenced`], naming the epoch that holds the session; nothing
//!   written), also when the first has saved since (the second read an older state). A
//!   restore fences the session its snapshot was taken from, which is how a process goes
//!   on from one that crashed;
//! * a **takeover** ([`ClaimRule::Takeover`]) lands whatever the record holds: a new
//!   session's claim, and a takeover by a writer that knows the one before is gone (a
//!   cluster's new owner holds the session's owner record, whose lease the old owner
//!   lost).
//!
//! A restorer's claim that landed and whose process then died before it saved leaves the
//! record claimed at an epoch that no stored snapshot has: every later restore of what
//! the store holds is refused, because the store cannot tell a dead claimant from a live
//! one that has not saved yet. A host that knows that claimant is gone (its process
//! exited; an operator says so) takes the session over explicitly: a takeover claim, and
//! the snapshot it returns restored under it (the example on [`ClaimRule`]).
//!
//! A session told to ([`SessionBuilder::save_snapshots`](crate::SessionBuilder::save_snapshots))
//! claims its record when it starts — a new session by a takeover, a restored one
//! ([`SessionBuilder::restore`](crate::SessionBuilder::restore),
//! [`restore_from`](crate::SessionBuilder::restore_from)) by a restore of its snapshot —
//! and saves after every settled turn: a delta, or a full snapshot when the store may
//! lack what a delta would follow or has collected enough deltas.
//!
//! # A store of your own
//!
//! A database keeps one row per session with an epoch and a version column, and every
//! write is a compare-and-set on it:
//!
//! * `claim`: in one transaction, read the row, ask the rule for the epoch
//!   ([`ClaimRule::epoch_after`] with the row's epoch, 0 for no row: it refuses a restore
//!   that came too late), then insert the row or `UPDATE sessions SET epoch = ?, version =
//!   ? WHERE id = ? AND version = ?` with the version read (no row updated: another claim
//!   came between, read again), and return the epoch and the new version with the
//!   snapshot the row holds, read after the update (with its deltas, through a
//!   [`SnapshotChain`](crate::SnapshotChain)). A refused claim writes nothing.
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

/// What a claim may land on ([`SnapshotStore::claim`]): the store checks it in the same
/// step as it moves the record, and a refused claim writes nothing.
///
/// A session's own claims choose their rule:
/// [`SessionBuilder::save_snapshots`](crate::SessionBuilder::save_snapshots) takes a new
/// session's record over; a restore
/// ([`restore_from`](crate::SessionBuilder::restore_from), or
/// [`restore`](crate::SessionBuilder::restore) with `save_snapshots`) claims on the snapshot
/// it restores, and of two restorers of one stored state the second is refused. A
/// restorer whose claim landed and whose process died before it saved holds the session:
/// the store cannot tell it from one that has not saved yet, so every later restore is
/// refused. A host that knows that process is gone takes the session over:
///
/// ```
/// # use std::sync::Arc;
/// # use switchboard::prelude::*;
/// # use switchboard::snapshot::{AgentRegistry, ClaimRule, SnapshotStore, StoreError};
/// # async fn demo(
/// #     store: Arc<dyn SnapshotStore>,
/// #     agents: AgentRegistry,
/// #     llm: Arc<dyn Llm>,
/// #     engine: Engine,
/// # ) -> Result<Session, SessionError> {
/// // Fences every writer before, whatever the record holds.
/// let claimed = store.claim("call-42", ClaimRule::Takeover { at_least: 0 }).await?;
/// let snapshot = claimed.snapshot.ok_or(StoreError::NotFound {
///     session: "call-42".into(),
/// })?;
/// let session = Session::builder()
///     .llm(llm)
///     .restore(snapshot, agents)
///     .save_claimed(store, claimed.claim)
///     .start(&engine)
///     .await?;
/// # Ok(session)
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimRule {
    /// Lands whatever the record holds, fencing every writer before: the claim of a new
    /// session, and a takeover by a writer that knows the one before is gone (a process
    /// that crashed after it claimed; a cluster's new owner, which holds the session's
    /// owner record). Its epoch is one more than the record's last claim, and at least
    /// `at_least`.
    Takeover {
        /// The least epoch the claim gets (0: no bound).
        at_least: u64,
    },
    /// A restore of a snapshot taken at `epoch` ([`SessionSnapshot::epoch`]; make it with
    /// [`ClaimRule::restore`]): lands only if nobody claimed the session after that
    /// snapshot's writer did — the record's last claim is at `epoch` or before, or there
    /// is no record. Else [`StoreError::Fenced`] naming the epoch of the claim that holds
    /// the session: another restore of the same state came first, or the snapshot is older
    /// than what a later writer has. Its epoch is `epoch + 1`. It fences the snapshot's own
    /// writer, if that one still runs.
    Restore {
        /// The epoch of the snapshot restored.
        epoch: u64,
    },
}

impl ClaimRule {
    /// The rule for restoring `snapshot`, read from a store (its
    /// [`load`](SnapshotStore::load)) or held by the host.
    pub fn restore(snapshot: &SessionSnapshot) -> Self {
        Self::Restore {
            epoch: snapshot.epoch(),
        }
    }

    /// Whether a claim of `session` by this rule lands on a record whose last claim was at
    /// epoch `last` (0: never claimed, or no record): the epoch it gets, or
    /// [`StoreError::Fenced`] saying which claim holds the session. Every store decides
    /// with it.
    pub fn epoch_after(self, session: &str, last: u64) -> Result<u64, StoreError> {
        match self {
            Self::Takeover { at_least } => Ok(last.saturating_add(1).max(at_least)),
            Self::Restore { epoch } if last <= epoch => Ok(epoch.saturating_add(1)),
            Self::Restore { epoch } => Err(fenced(
                session,
                format!(
                    "the session was claimed at epoch {last}, after the snapshot restored (epoch {epoch}) was written: another writer restored it first or went on from it; take it over (ClaimRule::Takeover) only if that writer is gone"
                ),
            )),
        }
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
    /// what its [`ClaimRule`] asked for).
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
    /// Claims `session` for a new writer if `rule` allows it on the record as it is
    /// ([`ClaimRule::epoch_after`] with the epoch of the record's last claim): moves the
    /// record's version (so every writer before is refused from now on) and issues the
    /// epoch the rule gives. Returns the claim and the snapshot the record holds, read after
    /// the claim landed. Makes the record if there is none. A refused claim is
    /// [`StoreError::Fenced`], and writes nothing.
    fn claim(
        &self,
        session: &str,
        rule: ClaimRule,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_takeover_lands_on_any_record_one_epoch_above_it() {
        let rule = ClaimRule::Takeover { at_least: 0 };
        assert_eq!(rule.epoch_after("s", 0).unwrap(), 1);
        assert_eq!(rule.epoch_after("s", 7).unwrap(), 8);
        let rule = ClaimRule::Takeover { at_least: 5 };
        assert_eq!(
            rule.epoch_after("s", 2).unwrap(),
            5,
            "at least what it asks"
        );
        assert_eq!(rule.epoch_after("s", 9).unwrap(), 10);
    }

    #[test]
    fn a_restore_lands_only_when_nobody_claimed_after_its_snapshot() {
        let rule = ClaimRule::Restore { epoch: 3 };
        // Never claimed (a snapshot from elsewhere), claimed before it, or by its writer.
        for last in [0, 2, 3] {
            assert_eq!(rule.epoch_after("s", last).unwrap(), 4, "last claim {last}");
        }
        // A later claim holds the session: a restore that came first, or a writer that
        // went on from it.
        match rule.epoch_after("s", 4) {
            Err(StoreError::Fenced { session, reason }) => {
                assert_eq!(session, "s");
                assert!(reason.contains("epoch 4"), "{reason}");
                assert!(reason.contains("(epoch 3)"), "{reason}");
            }
            other => panic!("a restore after a later claim landed: {other:?}"),
        }
    }
}
