//! The check a worker makes before it claims a session whose owner a gateway found silent
//! (a resume job with `silent`: its request found nobody subscribed to the session's
//! inputs). A killed process's connection closes at once, so NATS answers "no responders"
//! within milliseconds; waiting for its lease would keep the caller in silence for the
//! whole lease.
//!
//! The worker reads the session's owner record, then asks the owning worker for its counts
//! (`<ns>.worker.<name>.info`), twice, 50 ms apart. Only if nobody answers either time,
//! and its own connection is settled (after a server restart every client is back by
//! then, subscriptions and all), does it claim: over the record it read, by its revision,
//! so an owner that renewed in between keeps the session. An owner that answers, or whose
//! request times out (frozen: its connection, and so its subscriptions, still stand), is
//! left to its lease, and so is a session whose record does not run (it ended, moves, or
//! expired: those have their own jobs). The claim is the usual one: one epoch higher, and the old owner, if
//! it ever comes back, is fenced by it. An owner that lives but whose connection closed
//! (the server dropped it, a reset) cannot be told from a dead one and is claimed too;
//! it trusts its lease only on a connection that has been up since its last renewal
//! (`hosted.rs`), so it acts on nothing until a renewal after it reconnects, which finds
//! this claim.

use std::time::Duration;

use async_nats::RequestErrorKind;

use super::Shared;
use crate::namespace::SessionKey;

/// How long the owning worker has to answer.
const PROBE_TIMEOUT: Duration = Duration::from_millis(250);
/// Between the two probes: "no responders" once could be a subscription on its way.
const PROBE_GAP: Duration = Duration::from_millis(50);

/// What a worker does with a job whose owner a gateway found silent.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Claim it as any resume, writing over the running record at this revision.
    Claim { over: u64 },
    /// No record runs (the session ended, moves, or its lease expired: those have their
    /// own jobs), the owner answers, or silence cannot be trusted here: nothing to do; a
    /// lease that runs out still moves the session.
    Leave,
}

/// What a probe of the owning worker found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Probe {
    /// Nobody subscribes to its info subject: its process is gone.
    NoResponders,
    /// It answered, or the request timed out or failed otherwise.
    Other,
}

/// The decision, from the running record's revision (if one runs), the two probes and
/// whether this worker's connection is settled.
pub(super) fn verdict(running: Option<u64>, probes: [Probe; 2], settled: bool) -> Verdict {
    match running {
        Some(revision) if settled && probes == [Probe::NoResponders; 2] => {
            Verdict::Claim { over: revision }
        }
        _ => Verdict::Leave,
    }
}

/// Reads the owner record of `session` and probes its owner; see the module docs.
pub(super) async fn check(shared: &Shared, session: &SessionKey) -> Result<Verdict, String> {
    let Some((revision, record)) = shared.owners.running(session).await? else {
        return Ok(verdict(None, [Probe::Other; 2], true));
    };
    if !shared.hosting.client.settled() {
        return Ok(verdict(Some(revision), [Probe::Other; 2], false));
    }
    let first = probe(shared, &record.worker).await;
    if first != Probe::NoResponders {
        return Ok(Verdict::Leave);
    }
    tokio::time::sleep(PROBE_GAP).await;
    let second = probe(shared, &record.worker).await;
    Ok(verdict(
        Some(revision),
        [first, second],
        shared.hosting.client.settled(),
    ))
}

async fn probe(shared: &Shared, worker: &str) -> Probe {
    let request = async_nats::Request::new()
        .payload(bytes::Bytes::new())
        .timeout(Some(PROBE_TIMEOUT));
    let subject = shared.hosting.namespace.worker_info(worker);
    match shared
        .hosting
        .client
        .nats()
        .send_request(subject, request)
        .await
    {
        Err(err) if err.kind() == RequestErrorKind::NoResponders => Probe::NoResponders,
        _ => Probe::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_with_no_running_record_is_left_to_its_own_jobs() {
        assert_eq!(
            verdict(None, [Probe::NoResponders; 2], true),
            Verdict::Leave
        );
    }

    #[test]
    fn an_owner_silent_twice_to_a_settled_worker_is_claimed_over_its_record() {
        assert_eq!(
            verdict(Some(7), [Probe::NoResponders; 2], true),
            Verdict::Claim { over: 7 }
        );
    }

    #[test]
    fn an_owner_that_answers_once_or_a_worker_not_settled_leaves_it_to_the_lease() {
        for probes in [
            [Probe::Other, Probe::NoResponders],
            [Probe::NoResponders, Probe::Other],
            [Probe::Other, Probe::Other],
        ] {
            assert_eq!(verdict(Some(7), probes, true), Verdict::Leave, "{probes:?}");
        }
        assert_eq!(
            verdict(Some(7), [Probe::NoResponders; 2], false),
            Verdict::Leave
        );
    }
}
