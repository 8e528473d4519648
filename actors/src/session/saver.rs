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
//!
//! The queue is bounded: a store that falls [`MAX_QUEUED`] updates behind (slow, or not
//! answering) gets the next save in full, and a full snapshot replaces every update queued
//! before it that the writer has not started (whoever waited for one of those waits for
//! the full one). The close waits for the writer for the grace period only (the bound is
//! the close's, at its call site); a writer still stuck in the store then is dropped with
//! the session.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{oneshot, watch, Notify};

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

/// The most updates waiting for a store that is behind: the next save is full, and
/// replaces them. So a store that stops answering holds at most this many deltas and one
/// full snapshot of a session, however long the call goes on.
const MAX_QUEUED: usize = 16;

/// Who waits to hear how a write went (`Session::save`, a call waiting to be recorded).
pub(crate) type Waiter = oneshot::Sender<Result<(), StoreError>>;

/// One update for the writer, and who waits for it to be written.
struct Queued {
    update: SnapshotUpdate,
    waiters: Vec<Waiter>,
}

/// The session's end of its saving.
pub(crate) struct Saver {
    writer: Arc<WriterState>,
    /// The writer's task, aborted when the session is dropped: a write stuck in the store
    /// past the close's grace must not outlive the session.
    task: tokio::task::JoinHandle<()>,
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
    /// Updates queued and not yet written, plus the one being written.
    pending: watch::Sender<usize>,
    /// The updates the writer has not started, oldest first.
    queue: Mutex<VecDeque<Queued>>,
    /// Rung when an update is queued.
    queued: Notify,
}

impl WriterState {
    fn queue(&self) -> MutexGuard<'_, VecDeque<Queued>> {
        // Pushed and popped whole: a panic elsewhere cannot leave it half-written.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Saver {
    fn drop(&mut self) {
        self.task.abort();
    }
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
        let writer = Arc::new(WriterState {
            failed: AtomicBool::new(false),
            fenced: AtomicBool::new(false),
            pending: watch::channel(0).0,
            queue: Mutex::new(VecDeque::new()),
            queued: Notify::new(),
        });
        let task = actix::spawn(write_in_order(store, claim, writer.clone(), session));
        Self {
            writer,
            task,
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
        let grown = self.grown();
        SaveNow::Take {
            full: !started || failed || self.queued != Some(seq) || grown,
        }
    }

    /// Queues what was taken for the writer; returns whether a turn settled meanwhile
    /// (save again).
    pub(crate) fn taken(&mut self, update: Option<SnapshotUpdate>) -> bool {
        self.taking = false;
        if let Some(update) = update {
            self.queue(update, Vec::new());
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
        self.queue(update, vec![written]);
        heard
    }

    /// Whether a snapshot for calls waiting to be recorded, taken now with the chain at
    /// `seq`, is written in full (as [`settled`](Self::settled) decides, without waiting
    /// for a save being collected: the calls' bodies wait on this one).
    pub(crate) fn record_full(&mut self, seq: u64, started: bool) -> bool {
        let failed = self.writer.failed.swap(false, Ordering::AcqRel);
        !started || failed || self.queued != Some(seq) || self.grown()
    }

    /// Queues a snapshot holding calls waiting to be recorded, after what is queued;
    /// `waiters` hear how its write went.
    pub(crate) fn record(&mut self, update: SnapshotUpdate, waiters: Vec<Waiter>) {
        self.queue(update, waiters);
    }

    /// Whether the store fenced this session's saving: nothing more is written.
    pub(crate) fn fenced(&self) -> bool {
        self.writer.fenced.load(Ordering::Acquire)
    }

    /// Whether the deltas since the last full snapshot carry enough that the next save is
    /// full (or the store is too far behind).
    fn grown(&self) -> bool {
        self.delta_items >= self.full_items.max(MIN_ITEMS_BEFORE_FULL)
            || self.deltas >= MAX_DELTAS
            || self.writer.queue().len() >= MAX_QUEUED
    }

    fn queue(&mut self, update: SnapshotUpdate, mut waiters: Vec<Waiter>) {
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
        let mut queue = self.writer.queue();
        // A full snapshot holds everything the updates before it would have written: it
        // replaces them, and whoever waited for one of them waits for it.
        let replaced = match update {
            SnapshotUpdate::Full(_) => {
                let before = std::mem::take(&mut *queue);
                let count = before.len();
                waiters.extend(before.into_iter().flat_map(|queued| queued.waiters));
                count
            }
            SnapshotUpdate::Delta(_) => 0,
        };
        queue.push_back(Queued { update, waiters });
        drop(queue);
        self.writer
            .pending
            .send_modify(|n| *n = (*n + 1).saturating_sub(replaced));
        self.writer.queued.notify_one();
    }

    /// Updates queued and not yet written (the one being written included).
    pub(crate) fn unwritten(&self) -> usize {
        *self.writer.pending.borrow()
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
    state: Arc<WriterState>,
    session: Arc<SessionShared>,
) {
    let mut after = claim.version();
    let mut broken = false;
    let mut fence = None;
    loop {
        let next = state.queue().pop_front();
        let Some(Queued { update, waiters }) = next else {
            // Ends when the session drops its `Saver`, which aborts this task.
            state.queued.notified().await;
            continue;
        };
        let written = match update {
            _ if state.fenced.load(Ordering::Acquire) => None,
            SnapshotUpdate::Full(snapshot) => Some(store.save(snapshot, after).await),
            SnapshotUpdate::Delta(_) if broken => None,
            SnapshotUpdate::Delta(delta) => Some(store.append(delta, after).await),
        };
        for waiter in waiters {
            let result = match &written {
                Some(Ok(_)) => Ok(()),
                Some(Err(err)) => Err(err.clone()),
                None => Err(fence.clone().unwrap_or_else(|| StoreError::Unavailable {
                    session: session.id().to_string(),
                    reason: "not written".to_owned(),
                })),
            };
            let _ = waiter.send(result);
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
