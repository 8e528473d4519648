//! Provisioning: creating what a cluster needs on NATS — the jobs stream and its consumer,
//! the owners bucket, the snapshots stream — once, with as many replicas as the NATS
//! cluster has servers to spare.
//!
//! A worker with [`WorkerOptions::provision`](crate::WorkerOptions::provision) on (the
//! default) creates what is missing when it starts; an operator whose workers may not
//! create streams runs [`provision`] once with an admin user. On a three-server NATS
//! cluster, three replicas (R3) keep every job, owner record and snapshot through the
//! loss of one server.

use std::time::Duration;

use async_nats::jetstream;

use crate::connect::ClusterClient;
use crate::dispatch;
use crate::namespace::Namespace;
use crate::ownership::Owners;
use crate::snapshots::SnapshotStream;
use crate::worker::{WorkerError, WorkerOptions};

/// Whether opening a piece of the cluster on NATS creates it when it is missing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Provisioning {
    /// Open what exists; a missing piece is an error.
    Existing,
    /// Create what is missing, each stream (and the bucket) with this many replicas.
    Create {
        /// 1 on a single server; 3 on a three-server cluster.
        replicas: usize,
    },
}

impl Provisioning {
    /// The replicas of what is created (1 when nothing is).
    pub(crate) fn replicas(self) -> usize {
        match self {
            Self::Existing => 1,
            Self::Create { replicas } => replicas,
        }
    }
}

/// Creates what a cluster needs on NATS — the jobs stream, its consumer, the owners
/// bucket and the snapshots stream — if they do not exist yet, with one replica each:
/// what an operator runs once with an admin user when workers may not create them
/// (`WorkerOptions::provision(false)`; the subjects each role needs:
/// [`Permissions`](crate::Permissions)). A worker with `provision(true)` does the same at
/// its start. On a NATS cluster, use [`provision_with_replicas`].
pub async fn provision(client: &ClusterClient, namespace: &Namespace) -> Result<(), WorkerError> {
    provision_with_replicas(client, namespace, 1).await
}

/// [`provision`] with `replicas` copies of each stream and of the bucket (3 on a
/// three-server cluster: losing one server then loses nothing). What exists already is
/// left as it is.
pub async fn provision_with_replicas(
    client: &ClusterClient,
    namespace: &Namespace,
    replicas: usize,
) -> Result<(), WorkerError> {
    let setup = |what: &'static str| {
        move |reason: String| WorkerError::Setup {
            worker: "(provisioning)".to_owned(),
            what,
            reason,
        }
    };
    let create = Provisioning::Create {
        replicas: replicas.max(1),
    };
    let js = jetstream::ContextBuilder::new()
        .timeout(Duration::from_secs(5))
        .build(client.nats().clone());
    dispatch::jobs_consumer(&js, namespace, create)
        .await
        .map_err(setup("jobs stream"))?;
    let defaults = WorkerOptions::new("provisioning");
    Owners::open(
        js.clone(),
        namespace,
        defaults.lease,
        defaults.ended_retention,
        create,
    )
    .await
    .map_err(setup("owners bucket"))?;
    SnapshotStream::open(js, namespace, defaults.ended_retention, create)
        .await
        .map_err(|err| setup("snapshots stream")(err.to_string()))?;
    Ok(())
}
