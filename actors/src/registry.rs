//! The engine's registry of its live sessions: which ids are taken, and a weak reference
//! to each session for counts, summaries and drain.
//!
//! A session takes its place before anything of it starts: [`Registry::reserve`] checks
//! its id (the host's, or the next free `s<n>`) and records it in one step, so two
//! sessions never share an id and a refused one leaves nothing behind. The place is a
//! [`SessionLease`], which the session's actor holds and drops with itself; dropping it
//! frees the id (its count for idle release, `idle_release.rs`, goes with the session's
//! shared state, which the host's handles keep). So an id
//! is taken from the start of `SessionBuilder::start` until the session's last actor is
//! gone — also when the host keeps a closed `Session` — and free again after.
//!
//! Once the host's handle exists the builder fills the place in ([`Registry::fill`]):
//! a `Weak` of the session's shared state (for counts, summaries, and a drain's wait for
//! it to settle and be gone) and a `Weak` of the host's end, seen only through
//! [`DrainPort`] (what a drain asks of a session). Neither keeps the session alive: the
//! host's handles alone do. The registry is its own `Arc`, held by the engine and each
//! lease, so a live session never keeps the engine's threads alive.
//!
//! Cost: one map insert when a session starts, one update when its handle exists, one
//! remove when it goes, each under the lock of one of 16 shards (sessions starting and
//! ending on different threads rarely wait for one another); nothing per message and
//! nothing while a session idles. A shard shrinks once it is three quarters empty, so the
//! entries of a traffic peak do not hold their memory after it (a `HashMap` never shrinks
//! by itself: 100,000 entries would keep about 5 MB).

use std::collections::hash_map::{Entry, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use futures_util::future::BoxFuture;
use tokio::sync::Notify;

use crate::error::{EngineError, SessionError};
use crate::idle_release::{IdleHold, IdleMemory};
use crate::ids::SessionId;
use crate::shared::SessionShared;

/// What a drain asks of a session's host end: implemented by the host's handle, which
/// alone may interrupt and close a session. A port, like the ports of `RunContext` and
/// `SessionControl`, so that this plumbing never names the host side.
pub(crate) trait DrainPort: Send + Sync {
    /// Interrupts the current turn, even an uninterruptible one; resolves once it ended.
    fn force_interrupt(&self) -> BoxFuture<'static, ()>;

    /// Asks the session to close (as `Session::close` does); the session's `gone` says
    /// when it is.
    fn close(&self);
}

/// A registered session, as the engine reaches it: weak references only.
#[derive(Clone)]
pub(crate) struct LiveSession {
    pub(crate) shared: Weak<SessionShared>,
    pub(crate) host: Weak<dyn DrainPort>,
}

/// The sessions of one engine.
pub(crate) struct Registry {
    /// Each live session by id; `None` while its start has not made its handle yet.
    sessions: Shards,
    /// The engine's own numbering, `s1`, `s2`, …; never reused, and a number whose id a
    /// live session holds is skipped.
    next_default: AtomicU64,
    /// Set by a drain, for good: from then on no session starts.
    draining: AtomicBool,
    /// Notified when a place is filled in or freed while draining, for a drain waiting on
    /// a session that was still starting.
    changed: Notify,
    idle: Arc<IdleMemory>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("sessions", &self.sessions.len())
            .field("draining", &self.is_draining())
            .finish_non_exhaustive()
    }
}

impl Registry {
    pub(crate) fn new(idle: Arc<IdleMemory>) -> Arc<Self> {
        Arc::new(Self {
            sessions: Shards::new(),
            next_default: AtomicU64::new(0),
            draining: AtomicBool::new(false),
            changed: Notify::new(),
            idle,
        })
    }

    /// Takes an id for a session about to start: `chosen` (already checked for its form)
    /// unless a live session has it, else the engine's next free `s<n>`. Refused while
    /// draining. The lease holds the id until it is dropped.
    pub(crate) fn reserve(
        self: &Arc<Self>,
        chosen: Option<String>,
    ) -> Result<SessionLease, SessionError> {
        if self.is_draining() {
            return Err(EngineError::Draining.into());
        }
        let id = match chosen {
            Some(text) => {
                let id = SessionId::new(text);
                if !self.sessions.insert_new(&id) {
                    return Err(SessionError::DuplicateSession { id });
                }
                id
            }
            None => loop {
                let n = self.next_default.fetch_add(1, Ordering::Relaxed) + 1;
                let id = SessionId::new(format!("s{n}"));
                // A host may have chosen `s<n>` itself: that number is skipped.
                if self.sessions.insert_new(&id) {
                    break id;
                }
            },
        };
        let lease = SessionLease {
            registry: self.clone(),
            id,
            memory: Some(self.idle.hold()),
        };
        // A drain that began between the first check and the insert may have listed the
        // sessions without this one: refuse it (the lease's drop frees the id). Both
        // sides are SeqCst: either the drain's list holds this session or this sees it.
        if self.is_draining() {
            return Err(EngineError::Draining.into());
        }
        Ok(lease)
    }

    /// Fills in the place of the session `id` once its host handle exists. Only the
    /// session whose lease has this very id value: a place freed meanwhile (the session
    /// failed at once) is not made again, nor another session's of the same id taken.
    pub(crate) fn fill(&self, id: &SessionId, live: LiveSession) {
        self.sessions.fill(id, live);
        self.changed_while_draining();
    }

    fn free(&self, id: &SessionId) {
        self.sessions.remove(id);
        self.changed_while_draining();
    }

    fn changed_while_draining(&self) {
        if self.is_draining() {
            self.changed.notify_waiters();
        }
    }

    /// From now on no session starts.
    pub(crate) fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub(crate) fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Every session now, each with its place (`None`: still starting).
    pub(crate) fn list(&self) -> Vec<(SessionId, Option<LiveSession>)> {
        let mut all = Vec::new();
        self.sessions
            .each(|id, place| all.push((id.clone(), place.clone())));
        all
    }

    /// The shared state of every session whose start made its handle, for counts: a
    /// session whose actors are all gone has left the map, so each one upgrades (but
    /// for one whose last actor is being dropped right now).
    pub(crate) fn shared_states(&self) -> Vec<Arc<SessionShared>> {
        let mut all = Vec::new();
        self.sessions.each(|_, place| {
            if let Some(shared) = place.as_ref().and_then(|live| live.shared.upgrade()) {
                all.push(shared);
            }
        });
        // Dropped outside the shards' locks: the last reference to a session's state
        // may be one of these, and dropping it runs the host's output's drop.
        all
    }

    /// Resolves at the next fill or free while draining; create it before looking at the
    /// list, so a change in between is not missed.
    pub(crate) fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.changed.notified()
    }
}

/// How many shards the map of live sessions has: enough that the threads of a host and
/// of the arbiters seldom want the same one.
const SHARDS: usize = 16;

/// A shard shrinks once its capacity is this many times its entries, to twice its
/// entries: each shrink rehashes a quarter of what the shard held, so it costs a constant
/// per removal on average.
const SHRINK_AT: usize = 4;

/// One shard: live sessions by id, each `None` while still starting.
type Shard = HashMap<SessionId, Option<LiveSession>>;

/// The map of live sessions, in shards each behind its own lock.
struct Shards {
    shards: Box<[Mutex<Shard>]>,
}

impl Shards {
    fn new() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }

    fn shard(&self, id: &SessionId) -> MutexGuard<'_, Shard> {
        // FNV-1a picks the shard: cheap for short ids, and a host that puts every id in
        // one shard only makes that shard's map (SipHash, seeded) bigger.
        let hash = id
            .as_str()
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
                (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
            });
        // The remainder is below `SHARDS`, so the cast keeps it whole.
        let index = (hash % SHARDS as u64) as usize;
        // A panic elsewhere while a shard was locked leaves a plain map: keep using it.
        self.shards[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Inserts `id`, still starting, unless it is taken; whether it was inserted.
    fn insert_new(&self, id: &SessionId) -> bool {
        match self.shard(id).entry(id.clone()) {
            Entry::Occupied(_) => false,
            Entry::Vacant(place) => {
                place.insert(None);
                true
            }
        }
    }

    /// Fills in the place `id` (this very value) inserted, if it is still there.
    fn fill(&self, id: &SessionId, live: LiveSession) {
        if let Entry::Occupied(mut place) = self.shard(id).entry(id.clone()) {
            if place.key().same(id) {
                place.insert(Some(live));
            }
        }
    }

    /// Removes the place `id` (this very value) inserted, and shrinks the shard once it
    /// is mostly empty.
    fn remove(&self, id: &SessionId) {
        let mut shard = self.shard(id);
        if let Entry::Occupied(place) = shard.entry(id.clone()) {
            if !place.key().same(id) {
                return;
            }
            place.remove();
            if shard.capacity() > SHRINK_AT * shard.len().max(8) {
                let keep = 2 * shard.len();
                shard.shrink_to(keep);
            }
        }
    }

    /// Calls `visit` with each entry, one shard locked at a time.
    fn each(&self, mut visit: impl FnMut(&SessionId, &Option<LiveSession>)) {
        for shard in self.shards.iter() {
            let shard = shard
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            for (id, place) in shard.iter() {
                visit(id, place);
            }
        }
    }

    fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| shard.lock().map_or(0, |shard| shard.len()))
            .sum()
    }
}

/// A session's place on its engine: its id in the registry and its count as live for
/// idle release. Taken by [`Registry::reserve`] before anything of the session starts;
/// held by the session's actor and dropped with it, before the actor's `AliveToken`, so
/// that once `close()` returns the id is free and the session counted gone. Dropped
/// earlier when the start fails.
#[derive(Debug)]
pub(crate) struct SessionLease {
    registry: Arc<Registry>,
    id: SessionId,
    /// The session's count for idle release, until the session's shared state takes it
    /// (a start that fails before drops it here).
    memory: Option<IdleHold>,
}

impl SessionLease {
    /// The session's id (the very value its place in the registry is keyed by).
    pub(crate) fn id(&self) -> &SessionId {
        &self.id
    }

    /// The session's count for idle release, for its shared state to keep: the session's
    /// memory lives as long as that state, which the host's handles keep after the close.
    pub(crate) fn take_memory(&mut self) -> Option<IdleHold> {
        self.memory.take()
    }
}

impl Drop for SessionLease {
    fn drop(&mut self) {
        self.registry.free(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capacity(shards: &Shards) -> usize {
        shards
            .shards
            .iter()
            .map(|shard| shard.lock().unwrap().capacity())
            .sum()
    }

    #[test]
    fn a_place_is_removed_only_by_the_id_value_that_made_it() {
        let shards = Shards::new();
        let first = SessionId::new("call-1");
        assert!(shards.insert_new(&first));
        let same_text = SessionId::new("call-1");
        assert!(!shards.insert_new(&same_text), "taken");
        shards.remove(&same_text);
        assert_eq!(
            shards.len(),
            1,
            "another value of the same text removes nothing"
        );
        shards.remove(&first);
        assert_eq!(shards.len(), 0);
        assert!(shards.insert_new(&same_text), "free again");
    }

    #[test]
    fn the_shards_give_their_memory_back_as_a_peak_drains() {
        let shards = Shards::new();
        let ids: Vec<SessionId> = (0..20_000)
            .map(|n| SessionId::new(format!("s{n}")))
            .collect();
        for id in &ids {
            assert!(shards.insert_new(id));
        }
        let peak = capacity(&shards);
        assert!(peak >= 20_000, "{peak}");
        for id in &ids {
            shards.remove(id);
        }
        assert_eq!(shards.len(), 0);
        let after = capacity(&shards);
        assert!(after <= SHARDS * 64, "{after} of {peak} kept");
    }
}
