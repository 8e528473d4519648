//! The session's own saving (`SessionBuilder::save_snapshots`): after every settled turn
//! the session takes a delta — or a full snapshot when the store may lack what a delta
//! would follow — and hands it to its writer.
//!
//! Taking is the session's (it is a few messages to its activities, and fixes the link of
//! the chain); writing is the writer's: one task per session that writes the updates to
//! the store one at a time, in the order they were taken, so a delta is never written
//! before the link it follows and a slow disk never holds the session's mailbox. Each
//! write names the store version the writer last got back (from the session's claim, then
//! from each write): a write the store refuses as fenced (another writer claimed the
//! session since) stops the saving for good, with a `Fenced` event, and nothing more is
//! taken or written. A write that fails otherwise makes the writer skip the deltas queued
//! behind it (they would not follow what the store has) and the next save full. Closing
//! waits for the writer to finish what was queued: a session that closed has its last
//! settled state in the store.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, watch};

use super::SnapshotUpdate;
use crate::events::SessionEvent;
use crate::shared::SessionShared;
use crate::snapshot::StoreError;
use crate::snapshot_store::{Claim, SnapshotStore};

/// The session saves in full once the deltas since the last full snapshot carry as many
/// items as it held (at least this many): loading then reads at most about twice the
/// conversation, and a full save's cost, which follows the conversation's length, is
/// spread over as many items appended — the cost per turn stays flat however long the call.
const MIN_ITEMS_BEFORE_FULL: usize = 64;

/// Or once this many deltas were saved since: each carries a head.
const MAX_DELTAS: u32 = 1024;

/// One update for the writer, and who waits for it to be written (`Session::save`).
struct Queued {
    update: SnapshotUpdate,
    written: Option<oneshot::Sender<Result<(), StoreError>>>,
}

/// The session's end of its saving.
pub(crate) struct Saver {
    queue: mpsc::UnboundedSender<Queued>,
    writer: Arc<WriterState>,
    /// The chain's `seq` of the last update queued; when the chain moved past it (a host
    /// took a snapshot update in between), the next save is full.
    queued: Option<u64>,
    /// Deltas queued since the last full snapshot.
    deltas: u32,
    /// Chat items the last full snapshot held, and the deltas since carry.
    full_items: usize,
    delta_items: usize,
    /// A snapshot for the store is being collected.
    taking: bool,
    /// A turn settled while one was being collected: save again after it.
    again: bool,
}

/// What the session and its writer share.
struct WriterState {
    /// A write failed: the next save must be full.
    failed: AtomicBool,
    /// The store refused a write as fenced: nothing more is saved.
    fenced: AtomicBool,
    /// Updates queued and not yet written.
    pending: watch::Sender<usize>,
}

/// What the session does at a settled turn.
pub(crate) enum SaveNow {
    /// Take a snapshot for the store, in full or not.
    Take { full: bool },
    /// One is being collected; another follows it.
    Later,
    /// Nothing: the store fenced this session's saving.
    Stopped,
}

impl Saver {
    /// Starts the writer of `session`'s updates to `store`, under `claim` (on the current
    /// arbiter).
    pub(crate) fn start(
        store: Arc<dyn SnapshotStore>,
        claim: Claim,
        session: Arc<SessionShared>,
    ) -> Self {
        let (queue, updates) = mpsc::unbounded_channel::<Queued>();
        let writer = Arc::new(WriterState {
            failed: AtomicBool::new(false),
            fenced: AtomicBool::new(false),
            pending: watch::channel(0).0,
        });
        actix::spawn(write_in_order(
            store,
            claim,
            updates,
            writer.clone(),
            session,
        ));
        Self {
            queue,
            writer,
            queued: None,
            deltas: 0,
            full_items: 0,
            delta_items: 0,
            taking: false,
            again: false,
        }
    }

    /// Decides what a settled turn saves, with the chain at `seq` (`started`: whether any
    /// link was taken).
    pub(crate) fn settled(&mut self, seq: u64, started: bool) -> SaveNow {
        if self.writer.fenced.load(Ordering::Acquire) {
            return SaveNow::Stopped;
        }
        if self.taking {
            self.again = true;
            return SaveNow::Later;
        }
        self.taking = true;
        let failed = self.writer.failed.swap(false, Ordering::AcqRel);
        let grown = self.delta_items >= self.full_items.max(MIN_ITEMS_BEFORE_FULL)
            || self.deltas >= MAX_DELTAS;
        SaveNow::Take {
            full: !started || failed || self.queued != Some(seq) || grown,
        }
    }

    /// Queues what was taken for the writer; returns whether a turn settled meanwhile
    /// (save again).
    pub(crate) fn taken(&mut self, update: Option<SnapshotUpdate>) -> bool {
        self.taking = false;
        if let Some(update) = update {
            self.queue(update, None);
        }
        std::mem::take(&mut self.again)
    }

    /// Queues a snapshot the host asked to save (`Session::save`), after what is queued;
    /// the receiver hears how its write went.
    pub(crate) fn save(
        &mut self,
        update: SnapshotUpdate,
    ) -> oneshot::Receiver<Result<(), StoreError>> {
        let (written, heard) = oneshot::channel();
        self.queue(update, Some(written));
        heard
    }

    fn queue(
        &mut self,
        update: SnapshotUpdate,
        written: Option<oneshot::Sender<Result<(), StoreError>>>,
    ) {
        {
            self.queued = Some(match &update {
                SnapshotUpdate::Full(snapshot) => {
                    self.full_items = snapshot.items();
                    self.delta_items = 0;
                    self.deltas = 0;
                    snapshot.seq()
                }
                SnapshotUpdate::Delta(delta) => {
                    self.delta_items += delta.items();
                    self.deltas += 1;
                    delta.base() + 1
                }
            });
            self.writer.pending.send_modify(|n| *n += 1);
            if self.queue.send(Queued { update, written }).is_err() {
                // The writer is gone (its arbiter stopped): nothing will write it.
                self.writer
                    .pending
                    .send_modify(|n| *n = n.saturating_sub(1));
            }
        }
    }

    /// Resolves once everything queued is written (or failed).
    pub(crate) fn flushed(&self) -> impl std::future::Future<Output = ()> + 'static {
        let mut pending = self.writer.pending.subscribe();
        async move {
            // The sender lives in the shared state, which this future keeps alive.
            let _ = pending.wait_for(|n| *n == 0).await;
        }
    }
}

/// The writer: each update in turn, each after the version the last write got back;
/// deltas after a failure skipped until a full one; nothing after a fence.
async fn write_in_order(
    store: Arc<dyn SnapshotStore>,
    claim: Claim,
    mut updates: mpsc::UnboundedReceiver<Queued>,
    state: Arc<WriterState>,
    session: Arc<SessionShared>,
) {
    let mut after = claim.version();
    let mut broken = false;
    let mut fence = None;
    while let Some(Queued {
        update,
        written: heard,
    }) = updates.recv().await
    {
        let written = match update {
            _ if state.fenced.load(Ordering::Acquire) => None,
            SnapshotUpdate::Full(snapshot) => Some(store.save(snapshot, after).await),
            SnapshotUpdate::Delta(_) if broken => None,
            SnapshotUpdate::Delta(delta) => Some(store.append(delta, after).await),
        };
        if let Some(heard) = heard {
            let result = match &written {
                Some(Ok(_)) => Ok(()),
                Some(Err(err)) => Err(err.clone()),
                None => Err(fence.clone().unwrap_or_else(|| StoreError::Unavailable {
                    session: session.id().to_string(),
                    reason: "not written".to_owned(),
                })),
            };
            let _ = heard.send(result);
        }
        match written {
            Some(Ok(version)) => {
                after = version;
                broken = false;
            }
            Some(Err(StoreError::Fenced {
                session: fenced,
                reason,
            })) => {
                fence = Some(StoreError::Fenced {
                    session: fenced,
                    reason: reason.clone(),
                });
                state.fenced.store(true, Ordering::Release);
                tracing::warn!(session = %session.id(), epoch = claim.epoch(), %reason, "the session's snapshots are written by a newer claim: saving stops");
                session.events.emit(SessionEvent::Fenced { reason });
            }
            Some(Err(err)) => {
                broken = true;
                state.failed.store(true, Ordering::Release);
                // A store without the base of a delta (emptied meanwhile) is not worth an
                // error: the next save is full.
                if !matches!(err, StoreError::NoBase { .. }) {
                    let message = format!("the session's snapshot was not saved: {err}");
                    tracing::warn!(session = %session.id(), "{message}");
                    session.events.emit(SessionEvent::Error { message });
                }
            }
            None => {}
        }
        state.pending.send_modify(|n| *n = n.saturating_sub(1));
    }
}
