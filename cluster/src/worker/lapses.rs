//! `Lapses`: the owner records a worker has seen, and when each lapses if it is not
//! rewritten.
//!
//! The server expires a record whose TTL ran out only at its next expiry check, and it
//! runs those at most every 250 ms: a crash's failover would wait the lease plus up to a
//! quarter of a second more. So each worker times the live records (`Running`, `Moving`)
//! itself: one not rewritten within a lease of when this worker saw it has lapsed. The
//! owner sent that write before any worker saw it, and stops trusting it a fifth of a
//! lease before the lease runs out (`ownership.rs`), so no clocks are compared.
//!
//! A plain type, no I/O: the expiry watch (`resume.rs`) feeds it what the bucket says and
//! asks it which records lapsed.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::Duration;

use tokio::time::Instant;

use crate::namespace::SessionKey;

/// The live owner records seen, each with the revision seen last and its deadline.
#[derive(Debug)]
pub(crate) struct Lapses {
    lease: Duration,
    /// Each live record: the revision seen last, and when it lapses.
    latest: HashMap<SessionKey, (u64, Instant)>,
    /// One entry per live record, soonest first. A renewal does not move its entry: the
    /// entry, found early when it comes up, goes back in at the record's deadline. So the
    /// heap holds about one entry per session, however often leases are renewed.
    deadlines: BinaryHeap<Reverse<(Instant, SessionKey)>>,
}

impl Lapses {
    /// Nothing seen yet, for records whose lease is `lease`.
    pub(crate) fn new(lease: Duration) -> Self {
        Self {
            lease,
            latest: HashMap::new(),
            deadlines: BinaryHeap::new(),
        }
    }

    /// A live record of `session` at `revision`, seen `now`: it lapses a lease later
    /// unless rewritten.
    pub(crate) fn live(&mut self, session: SessionKey, revision: u64, now: Instant) {
        let deadline = now + self.lease;
        // Every renewal of every session in the cluster comes here: update in place.
        if let Some(latest) = self.latest.get_mut(&session) {
            *latest = (revision, deadline);
        } else {
            self.latest.insert(session.clone(), (revision, deadline));
            self.deadlines.push(Reverse((deadline, session)));
        }
    }

    /// `session`'s record ended, or its lease expired at the server: no deadline now.
    pub(crate) fn gone(&mut self, session: &SessionKey) {
        self.latest.remove(session);
    }

    /// When the soonest deadline falls, or earlier (an entry renewed since: asking again
    /// costs nothing).
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.peek().map(|Reverse((at, _))| *at)
    }

    /// The records that lapsed by `now`, each with the revision that was not rewritten;
    /// each is reported once.
    pub(crate) fn lapsed(&mut self, now: Instant) -> Vec<(SessionKey, u64)> {
        let mut lapsed = Vec::new();
        while self
            .deadlines
            .peek()
            .is_some_and(|Reverse((at, _))| *at <= now)
        {
            let Some(Reverse((_, session))) = self.deadlines.pop() else {
                break;
            };
            match self.latest.get(&session) {
                // Gone since: nothing to time.
                None => {}
                Some(&(revision, deadline)) if deadline <= now => {
                    self.latest.remove(&session);
                    lapsed.push((session, revision));
                }
                // Renewed since: back in at its deadline.
                Some(&(_, deadline)) => self.deadlines.push(Reverse((deadline, session))),
            }
        }
        lapsed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str) -> SessionKey {
        SessionKey::new(id).unwrap()
    }

    const LEASE: Duration = Duration::from_secs(1);

    #[test]
    fn a_record_not_rewritten_within_a_lease_lapses_once() {
        let t0 = Instant::now();
        let mut lapses = Lapses::new(LEASE);
        lapses.live(key("a"), 7, t0);
        assert_eq!(lapses.next_deadline(), Some(t0 + LEASE));
        assert!(lapses
            .lapsed(t0 + LEASE - Duration::from_millis(1))
            .is_empty());
        assert_eq!(lapses.lapsed(t0 + LEASE), [(key("a"), 7)]);
        assert!(lapses.lapsed(t0 + 5 * LEASE).is_empty(), "reported once");
    }

    #[test]
    fn a_renewal_moves_the_deadline_and_the_old_one_is_skipped() {
        let t0 = Instant::now();
        let mut lapses = Lapses::new(LEASE);
        lapses.live(key("a"), 7, t0);
        let renewed = t0 + LEASE / 3;
        lapses.live(key("a"), 9, renewed);
        assert!(lapses.lapsed(t0 + LEASE).is_empty(), "renewed in time");
        assert_eq!(lapses.next_deadline(), Some(renewed + LEASE));
        assert_eq!(lapses.deadlines.len(), 1, "one entry per record");
        assert_eq!(lapses.lapsed(renewed + LEASE), [(key("a"), 9)]);
    }

    #[test]
    fn an_ended_or_expired_record_never_lapses() {
        let t0 = Instant::now();
        let mut lapses = Lapses::new(LEASE);
        lapses.live(key("a"), 1, t0);
        lapses.live(key("b"), 2, t0);
        lapses.gone(&key("a"));
        assert_eq!(lapses.lapsed(t0 + 2 * LEASE), [(key("b"), 2)]);
        assert_eq!(lapses.next_deadline(), None);
    }
}
