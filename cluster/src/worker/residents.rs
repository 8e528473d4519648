//! `Residents`: the sessions a worker hosts, by key.
//!
//! A worker can be handed a session it still hosts. Frozen or cut off past its lease, it
//! did not renew in time; its lease was fenced, a sweep queued the session's resume, and
//! this worker (under a new incarnation) pulled the job. The job's claim has fenced the old hosting by
//! then (the owner record and the snapshots moved on), but the old session still runs on
//! this engine under the same name, and the engine names live sessions by their keys. So a
//! new hosting of a key stops the old one first — fenced, it stops without a word — and
//! waits until it is gone (bounded).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;

use crate::namespace::SessionKey;
use crate::snapshots::SnapshotWriter;

/// The longest a new hosting waits for the old one of its key to be gone (its session's
/// close, tools' grace periods included).
const GONE_WAIT: Duration = Duration::from_secs(30);

/// The sessions a worker hosts; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct Residents {
    by_key: Mutex<HashMap<SessionKey, Resident>>,
    next_token: AtomicU64,
}

#[derive(Debug)]
struct Resident {
    token: u64,
    writer: SnapshotWriter,
    /// Closed when the hosting is over.
    gone: watch::Receiver<()>,
}

/// One hosting's place among the residents, held for as long as it hosts its session.
#[derive(Debug)]
pub(crate) struct Residence {
    residents: Arc<Residents>,
    key: SessionKey,
    token: u64,
    /// Dropped with the residence: whoever waits for it to be gone stops waiting.
    _present: watch::Sender<()>,
}

impl Residents {
    fn by_key(&self) -> MutexGuard<'_, HashMap<SessionKey, Resident>> {
        // A plain map: a panic elsewhere cannot leave it half-written.
        self.by_key.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes `key` in for a hosting that writes with `writer`, once the one hosting it
    /// before on this worker, if any, is gone: it is told it is fenced (a newer owner
    /// wrote the session) and stops without a word.
    pub(crate) async fn move_in(
        self: &Arc<Self>,
        key: &SessionKey,
        writer: &SnapshotWriter,
    ) -> Residence {
        let previous = self.by_key().remove(key);
        if let Some(mut previous) = previous {
            tracing::info!(session = %key, "claimed again while its old hosting runs here: stopping that first");
            previous.writer.fence();
            if tokio::time::timeout(GONE_WAIT, previous.gone.changed())
                .await
                .is_err()
            {
                tracing::warn!(session = %key, "the old hosting did not stop in {GONE_WAIT:?}");
            }
        }
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        let (present, gone) = watch::channel(());
        self.by_key().insert(
            key.clone(),
            Resident {
                token,
                writer: writer.clone(),
                gone,
            },
        );
        Residence {
            residents: self.clone(),
            key: key.clone(),
            token,
            _present: present,
        }
    }
}

impl Drop for Residence {
    fn drop(&mut self) {
        let mut by_key = self.residents.by_key();
        // Only its own entry: a newer hosting of the key may have taken its place.
        if by_key.get(&self.key).is_some_and(|r| r.token == self.token) {
            by_key.remove(&self.key);
        }
    }
}
