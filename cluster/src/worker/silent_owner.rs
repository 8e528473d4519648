//! The check a worker makes before it claims a session whose owner a gateway found silent
//! (a resume job with `silent`: its request found nobody subscribed to the session's
//! inputs). A killed process's connection closes at once, so NATS answers "no responders"
//! within milliseconds; waiting for its lease would keep the caller in silence for the
//! whole lease.
//!
//! The worker reads the session's owner record and the owning worker's lease. A lease
//! already dead needs no more: the session is claimed as after any death. A live one is
//! probed: the worker asks the owning worker for its counts
//! (`<ns>.worker.<name>.info`), twice, 50 ms apart. Only if nobody answers either time,
//! and its own connection is settled (after a server restart every client is back by
//! then, subscriptions and all), does it fence that worker's lease — `Fenced` over the
//! revision it read, so an owner that renewed in between keeps its lease — and then claims
//! the session; the fence's sweep queues the dead worker's other sessions too. An owner
//! that answers, or whose request times out (frozen: its connection, and so its
//! subscriptions, still stand), is left to its lease, and so is a session whose record
//! does not run (it ended or moves: those have their own jobs). The probe names the
//! session: an owner that lives but does not host it (a write that would have ended or
//! moved it failed) hands it back when asked (`worker.rs`, `answer_info`), so a session
//! is never left to a live lease that nobody runs it under. An owner that lives but
//! whose connection closed (the server dropped it, a reset) cannot be told from a dead one
//! and is fenced too; it trusts its lease only on a connection that has been up since its
//! last renewal (`lease.rs`), so it acts on nothing until a renewal after it reconnects,
//! which finds the fence and stops every session it held.

use std::sync::Arc;
use std::time::Duration;

use async_nats::RequestErrorKind;

use super::Shared;
use crate::lease::Liveness;
use crate::namespace::SessionKey;

/// How long the owning worker has to answer.
const PROBE_TIMEOUT: Duration = Duration::from_millis(250);
/// Between the two probes: "no responders" once could be a subscription on its way.
const PROBE_GAP: Duration = Duration::from_millis(50);

/// What the owner record and lease of a session found silent say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Owner {
    /// No record runs: the session ended or moves (those have their own jobs).
    NotRunning,
    /// It runs under a lease that is dead already.
    DeadLease,
    /// It runs under a live lease, at this revision.
    LiveLease { revision: u64 },
}

/// What a worker does with a job whose owner a gateway found silent.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Claim it as any resume: its owner's lease is dead.
    Claim,
    /// Fence the owner's lease over this revision, then claim.
    Fence { over: u64 },
    /// The owner answers, nothing runs, or silence cannot be trusted here: nothing to do;
    /// a lease that runs out still moves the session.
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

/// The decision, from the owner, the two probes and whether this worker's connection is
/// settled.
pub(super) fn verdict(owner: Owner, probes: [Probe; 2], settled: bool) -> Verdict {
    match owner {
        Owner::NotRunning => Verdict::Leave,
        Owner::DeadLease => Verdict::Claim,
        Owner::LiveLease { revision } if settled && probes == [Probe::NoResponders; 2] => {
            Verdict::Fence { over: revision }
        }
        Owner::LiveLease { .. } => Verdict::Leave,
    }
}

/// Reads the owner record and lease of `session` and probes its owner; fences a gone
/// owner's lease. `Ok(true)`: the session may be claimed now. See the module docs.
pub(super) async fn check(shared: &Arc<Shared>, session: &SessionKey) -> Result<bool, String> {
    let running = shared.owners.running(session).await?;
    let owner = match &running {
        None => Owner::NotRunning,
        Some((_, record)) => match shared
            .owners
            .leases()
            .liveness(&record.worker, record.lease)
            .await?
        {
            Liveness::Dead => Owner::DeadLease,
            Liveness::Live { revision } => Owner::LiveLease { revision },
        },
    };
    let Some((_, record)) = running else {
        return Ok(verdict(owner, [Probe::Other; 2], true) == Verdict::Claim);
    };
    let probes = match owner {
        Owner::LiveLease { .. } if shared.hosting.client.settled() => {
            let first = probe(shared, &record.worker, session).await;
            if first == Probe::NoResponders {
                tokio::time::sleep(PROBE_GAP).await;
                [first, probe(shared, &record.worker, session).await]
            } else {
                [first, Probe::Other]
            }
        }
        _ => [Probe::Other; 2],
    };
    match verdict(owner, probes, shared.hosting.client.settled()) {
        Verdict::Claim => Ok(true),
        Verdict::Leave => Ok(false),
        Verdict::Fence { over } => {
            let fenced = shared
                .owners
                .leases()
                .fence(&record.worker, record.lease, over)
                .await?;
            if fenced {
                tracing::info!(worker = %shared.name, dead = %record.worker, "a gone worker's lease: fenced; its sessions resume elsewhere");
                let (shared, dead) = (shared.clone(), record.worker.clone());
                tokio::spawn(async move { super::resume::sweep(&shared, &dead).await });
            }
            // Lost the race: someone else fenced it (then it is dead), or it renewed.
            Ok(fenced
                || shared
                    .owners
                    .leases()
                    .liveness(&record.worker, record.lease)
                    .await?
                    == Liveness::Dead)
        }
    }
}

/// Whether nobody answers for `worker`: two probes, 50 ms apart, both "no responders".
pub(super) async fn gone(shared_client: &crate::connect::ClusterClient, subject: String) -> bool {
    probe_subject(shared_client, subject.clone()).await == Probe::NoResponders && {
        tokio::time::sleep(PROBE_GAP).await;
        probe_subject(shared_client, subject).await == Probe::NoResponders
    }
}

/// Probes `worker` about `session`: a live worker that does not host it hands it back
/// (`worker.rs`, `answer_info`).
async fn probe(shared: &Shared, worker: &str, session: &SessionKey) -> Probe {
    probe_with(
        &shared.hosting.client,
        shared.hosting.namespace.worker_info(worker),
        bytes::Bytes::copy_from_slice(session.as_str().as_bytes()),
    )
    .await
}

async fn probe_subject(client: &crate::connect::ClusterClient, subject: String) -> Probe {
    probe_with(client, subject, bytes::Bytes::new()).await
}

async fn probe_with(
    client: &crate::connect::ClusterClient,
    subject: String,
    payload: bytes::Bytes,
) -> Probe {
    let request = async_nats::Request::new()
        .payload(payload)
        .timeout(Some(PROBE_TIMEOUT));
    match client.nats().send_request(subject, request).await {
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
            verdict(Owner::NotRunning, [Probe::NoResponders; 2], true),
            Verdict::Leave
        );
    }

    #[test]
    fn a_session_whose_owner_s_lease_is_dead_is_claimed_without_a_probe() {
        assert_eq!(
            verdict(Owner::DeadLease, [Probe::Other; 2], false),
            Verdict::Claim
        );
    }

    #[test]
    fn an_owner_silent_twice_to_a_settled_worker_has_its_lease_fenced_over_what_was_read() {
        assert_eq!(
            verdict(
                Owner::LiveLease { revision: 7 },
                [Probe::NoResponders; 2],
                true
            ),
            Verdict::Fence { over: 7 }
        );
    }

    #[test]
    fn an_owner_that_answers_once_or_a_worker_not_settled_leaves_it_to_the_lease() {
        let live = Owner::LiveLease { revision: 7 };
        for probes in [
            [Probe::Other, Probe::NoResponders],
            [Probe::NoResponders, Probe::Other],
            [Probe::Other, Probe::Other],
        ] {
            assert_eq!(verdict(live, probes, true), Verdict::Leave, "{probes:?}");
        }
        assert_eq!(
            verdict(live, [Probe::NoResponders; 2], false),
            Verdict::Leave
        );
    }
}
