//! `Lapses`: the live worker leases a worker has seen, and when each lapses if it is not
//! rewritten.
//!
//! The server expires a lease whose TTL ran out only at its next expiry check, and it
//! runs those at most every 250 ms: a frozen worker's sessions would wait the lease plus
//! up to a quarter of a second more. So each worker times the live leases itself: one not
//! rewritten within a lease of when this worker saw it has lapsed. The owner sent that
//! write before any worker saw it, and stops trusting it a fifth of a lease before the
//! lease runs out (`lease.rs`), so no clocks are compared.
//!
//! A plain type, no I/O: the lease watch (`resume.rs`) feeds it what the bucket says and
//! asks it which leases lapsed.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::Duration;

use tokio::time::Instant;

/// The live leases seen (by worker name), each with the revision seen last and its
/// deadline.
#[derive(Debug)]
pub(crate) struct Lapses {
    lease: Duration,
    /// Each live lease: the revision seen last, and when it lapses.
    latest: HashMap<String, (u64, Instant)>,
    /// One entry per live record, soonest first. A renewal does not move its entry: the
    /// entry, found early when it comes up, goes back in at the record's deadline. So the
    /// heap holds about one entry per worker, however often leases are renewed.
    deadlines: BinaryHeap<Reverse<(Instant, String)>>,
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

    /// A live lease of `worker` at `revision`, seen `now`: it lapses a lease later unless
    /// rewritten.
    pub(crate) fn live(&mut self, worker: String, revision: u64, now: Instant) {
        let deadline = now + self.lease;
        // Every renewal of every worker in the cluster comes here: update in place.
        if let Some(latest) = self.latest.get_mut(&worker) {
            *latest = (revision, deadline);
        } else {
            self.latest.insert(worker.clone(), (revision, deadline));
            self.deadlines.push(Reverse((deadline, worker)));
        }
    }

    /// `worker`'s lease ended, was fenced or expired at the server: no deadline now.
    pub(crate) fn gone(&mut self, worker: &str) {
        self.latest.remove(worker);
    }

    /// When the soonest deadline falls, or earlier (an entry renewed since: asking again
    /// costs nothing).
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.peek().map(|Reverse((at, _))| *at)
    }

    /// The leases that lapsed by `now`, each with the revision that was not rewritten;
    /// each is reported once.
    pub(crate) fn lapsed(&mut self, now: Instant) -> Vec<(String, u64)> {
        let mut lapsed = Vec::new();
        while self
            .deadlines
            .peek()
            .is_some_and(|Reverse((at, _))| *at <= now)
        {
            let Some(Reverse((_, worker))) = self.deadlines.pop() else {
                break;
            };
            match self.latest.get(&worker) {
                // Gone since: nothing to time.
                None => {}
                Some(&(revision, deadline)) if deadline <= now => {
                    self.latest.remove(&worker);
                    lapsed.push((worker, revision));
                }
                // Renewed since: back in at its deadline.
                Some(&(_, deadline)) => self.deadlines.push(Reverse((deadline, worker))),
            }
        }
        lapsed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str) -> String {
        id.to_owned()
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
