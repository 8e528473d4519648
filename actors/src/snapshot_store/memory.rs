//! [`MemoryStore`]: the snapshot store in memory, on the [`SnapshotStore`] contract.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;
use futures_util::FutureExt;

use super::{fenced, Claim, ClaimRule, Claimed, SnapshotStore, StoreVersion};
use crate::snapshot::{SessionSnapshot, SnapshotDelta, StoreError};

/// Snapshots in memory: for tests, and for moving a session between engines of one
/// process. Cheap to clone; clones share the store. Versions count up across the whole
/// store, so a session removed and claimed again never meets a version a writer of the
/// old one holds.
#[derive(Clone, Debug, Default)]
pub struct MemoryStore {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug, Default)]
struct Inner {
    records: HashMap<String, Record>,
    /// The last version issued.
    versions: u64,
}

#[derive(Debug)]
struct Record {
    epoch: u64,
    version: StoreVersion,
    snapshot: Option<SessionSnapshot>,
}

impl Inner {
    fn next_version(&mut self) -> StoreVersion {
        self.versions += 1;
        StoreVersion::new(self.versions)
    }

    /// The record of `session` if `after` is its version.
    fn writable(&mut self, session: &str, after: StoreVersion) -> Result<&mut Record, StoreError> {
        match self.records.get_mut(session) {
            Some(record) if record.version == after => Ok(record),
            Some(record) => Err(fenced(
                session,
                format!(
                    "the record is at version {}, this writer last saw {} (claimed since, at epoch {})",
                    record.version.get(),
                    after.get(),
                    record.epoch
                ),
            )),
            None => Err(fenced(session, "the session has no record (never claimed, or removed)")),
        }
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Plain values, each write made whole under the lock: a panic elsewhere cannot
        // leave it half-written.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl SnapshotStore for MemoryStore {
    fn claim(
        &self,
        session: &str,
        rule: ClaimRule,
    ) -> BoxFuture<'static, Result<Claimed, StoreError>> {
        let mut inner = self.lock();
        let last = inner.records.get(session).map_or(0, |record| record.epoch);
        // Decided before anything changes: a refused claim writes nothing.
        let claimed = rule.epoch_after(session, last).map(|epoch| {
            let version = inner.next_version();
            let record = inner.records.entry(session.to_owned()).or_insert(Record {
                epoch,
                version,
                snapshot: None,
            });
            record.epoch = epoch;
            record.version = version;
            Claimed::new(Claim::new(session, epoch, version), record.snapshot.clone())
        });
        async move { claimed }.boxed()
    }

    fn save(
        &self,
        snapshot: SessionSnapshot,
        after: StoreVersion,
    ) -> BoxFuture<'static, Result<StoreVersion, StoreError>> {
        let mut inner = self.lock();
        let version = inner.next_version();
        let saved = inner.writable(snapshot.session_id(), after).map(|record| {
            record.snapshot = Some(snapshot);
            record.version = version;
            version
        });
        async move { saved }.boxed()
    }

    fn append(
        &self,
        delta: SnapshotDelta,
        after: StoreVersion,
    ) -> BoxFuture<'static, Result<StoreVersion, StoreError>> {
        let mut inner = self.lock();
        let version = inner.next_version();
        let session = delta.session_id();
        let appended = inner.writable(session, after).and_then(|record| {
            match record.snapshot.as_mut() {
                // A delta applies only to the snapshot at its base, checked in full
                // before anything changes.
                Some(snapshot) if snapshot.seq() == delta.base() => {
                    snapshot.apply(&delta)?;
                    record.version = version;
                    Ok(version)
                }
                _ => Err(StoreError::NoBase {
                    session: session.to_owned(),
                }),
            }
        });
        async move { appended }.boxed()
    }

    fn load(
        &self,
        session: &str,
    ) -> BoxFuture<'static, Result<Option<SessionSnapshot>, StoreError>> {
        let found = self
            .lock()
            .records
            .get(session)
            .and_then(|record| record.snapshot.clone());
        async move { Ok(found) }.boxed()
    }

    fn remove(&self, session: &str) -> BoxFuture<'static, Result<(), StoreError>> {
        self.lock().records.remove(session);
        async { Ok(()) }.boxed()
    }
}
