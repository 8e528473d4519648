use super::*;
use crate::local::NatsServer;
use crate::namespace::Namespace;
use crate::ownership::Owners;
use crate::provisioning::Provisioning;

const LEASE: Duration = Duration::from_secs(1);

/// The leases of a new server's owners bucket (kept running by the returned handle).
async fn leases() -> (NatsServer, Leases) {
    let server = NatsServer::start().unwrap();
    let client = server.connect().connect().await.unwrap();
    let owners = Owners::open(
        jetstream::new(client.nats().clone()),
        &Namespace::default(),
        LEASE,
        Duration::from_secs(60),
        Provisioning::Create { replicas: 1 },
    )
    .await
    .unwrap();
    (server, owners.leases().clone())
}

fn up() -> Arc<Mutex<Option<Instant>>> {
    Arc::new(Mutex::new(Some(Instant::now())))
}

#[test]
fn a_dropped_connection_is_trusted_again_only_after_a_renewal_sent_since() {
    let t0 = Instant::now();
    let up_since = Arc::new(Mutex::new(Some(t0)));
    let clock = LeaseClock::sent_at(t0, t0 + LEASE).watching(up_since.clone());
    assert!(clock.is_trusted_at(t0));

    // The connection drops: not trusted, though its time runs.
    *up_since.lock().unwrap() = None;
    assert!(clock.is_valid_at(t0) && !clock.is_trusted_at(t0));
    assert!(clock.reconnected_since_sent());

    // Back, but the last renewal was sent before the drop: still not trusted.
    let back = t0 + Duration::from_millis(10);
    *up_since.lock().unwrap() = Some(back);
    assert!(!clock.is_trusted_at(back));

    // A renewal sent since the reconnection: trusted again.
    let sent = back + Duration::from_millis(1);
    clock.renewed(sent, sent + LEASE);
    assert!(clock.is_trusted_at(sent));

    // Revoked (lost or ended): never again.
    clock.revoke();
    assert!(!clock.is_valid_at(sent) && !clock.is_trusted_at(sent));
}

#[test]
fn a_lease_is_dead_unless_its_key_holds_a_live_record_of_that_incarnation() {
    let record = |incarnation, state| LeaseRecord {
        worker: "w1".into(),
        incarnation,
        state,
    };
    let live = LeaseKey::Record(7, record(3, LeaseState::Live));
    assert_eq!(live.liveness(3), Liveness::Live { revision: 7 });
    assert_eq!(
        live.liveness(4),
        Liveness::Dead,
        "a newer process of the name"
    );
    for dead in [
        LeaseKey::Absent,
        LeaseKey::Marker(8),
        LeaseKey::Record(9, record(3, LeaseState::Fenced)),
        LeaseKey::Record(9, record(3, LeaseState::Ended)),
    ] {
        assert_eq!(dead.liveness(3), Liveness::Dead, "{dead:?}");
    }
}

#[tokio::test]
async fn a_name_whose_lease_is_renewed_is_refused_and_a_gone_one_is_fenced_and_taken() {
    let (_server, leases) = leases().await;
    let (first, fenced) = WorkerLease::take(&leases, "w1", up(), async || false)
        .await
        .unwrap();
    assert_eq!(fenced, None);

    // A second process of the same name, while the first renews and answers.
    let renewing = {
        let (first, leases) = (first.clone(), leases.clone());
        tokio::spawn(async move {
            loop {
                let _ = first.renew(&leases, "w1").await;
                tokio::time::sleep(LEASE / 4).await;
            }
        })
    };
    let refused = WorkerLease::take(&leases, "w1", up(), async || false).await;
    assert!(
        matches!(&refused, Err(TakeError::NameTaken(name)) if name == "w1"),
        "{refused:?}"
    );
    renewing.abort();

    // The first is gone (nobody answers for it): fenced at once and taken over, and the
    // first finds its lease lost.
    let (second, fenced) = WorkerLease::take(&leases, "w1", up(), async || true)
        .await
        .unwrap();
    assert_eq!(fenced, Some(first.incarnation()));
    assert_ne!(second.incarnation(), first.incarnation());
    assert!(matches!(
        first.renew(&leases, "w1").await,
        Err(Renewal::Lost)
    ));
    assert!(!second.renew(&leases, "w1").await.unwrap());
}

#[tokio::test]
async fn a_lease_not_renewed_expires_at_the_server_and_its_renewal_is_lost() {
    let (_server, leases) = leases().await;
    let (lease, _) = WorkerLease::take(&leases, "w1", up(), async || false)
        .await
        .unwrap();
    let incarnation = lease.incarnation();
    let began = Instant::now();
    while leases.liveness("w1", incarnation).await.unwrap() != Liveness::Dead {
        assert!(
            began.elapsed() < 5 * LEASE,
            "the server did not expire a lease not renewed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(matches!(
        lease.renew(&leases, "w1").await,
        Err(Renewal::Lost)
    ));
    assert!(lease.tenancy().is_none());
}
