//! `Permissions`: the subjects a worker and a gateway need, as NATS per-user permissions,
//! so a deployment gives each role no more.
//!
//! Tenants are separated by NATS **accounts**: each tenant's workers and gateways are
//! users of the tenant's account, with JetStream enabled there, and an account's subjects,
//! streams and buckets do not exist for any other account. One tenant's gateway then has
//! no subject on which it could read or write another tenant's sessions. Inside an
//! account, these permissions keep each role to its part: a gateway cannot write owner
//! records or snapshots, read a session's inputs or pull jobs. (A worker may queue jobs:
//! it queues the resume of the sessions it hands over or sees expire.)
//!
//! ```
//! use switchboard_cluster::{Namespace, Permissions};
//! let ns = Namespace::default();
//! let gateway = Permissions::gateway(&ns);
//! assert!(gateway.publish.contains(&"sb.jobs".to_owned()));
//! println!("{}", gateway.to_config()); // `permissions: { … }` for a user in a server config
//! ```
//!
//! A worker started with `provision(false)` needs only [`Permissions::worker`]; creating
//! the jobs stream, its consumer, the owners bucket and the snapshots stream takes an
//! admin user of the account
//! (`$JS.API.>`), once ([`provision`](crate::provision)).

use crate::namespace::Namespace;

/// One role's subjects: what it may publish and subscribe to.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Permissions {
    /// Subjects it may publish to.
    pub publish: Vec<String>,
    /// Subjects it may subscribe to.
    pub subscribe: Vec<String>,
    /// Whether it may answer the requests it receives (their reply subjects).
    pub allow_responses: bool,
}

impl Permissions {
    /// A gateway's: publish jobs, send inputs and ask workers' counts; read sessions'
    /// events and its own replies (`_INBOX.>`; with one account per tenant, the inbox is
    /// private to the tenant).
    pub fn gateway(namespace: &Namespace) -> Self {
        let p = namespace.prefix();
        Self {
            publish: vec![
                namespace.jobs_subject(),
                format!("{p}.session.*.in"),
                format!("{p}.worker.*.info"),
            ],
            subscribe: vec![format!("{p}.session.*.events"), "_INBOX.>".to_owned()],
            allow_responses: false,
        }
    }

    /// A worker's (one that does not provision): pull and acknowledge jobs and queue
    /// resume jobs, read, write and watch owner records, read and write snapshots,
    /// publish sessions' events; read sessions' inputs and its info requests, and answer
    /// them.
    pub fn worker(namespace: &Namespace) -> Self {
        let p = namespace.prefix();
        let jobs = namespace.jobs_stream();
        let consumer = namespace.jobs_consumer();
        let owners = namespace.owners_bucket();
        let snapshots = namespace.snapshots_stream();
        Self {
            publish: vec![
                format!("$JS.API.STREAM.INFO.{jobs}"),
                format!("$JS.API.CONSUMER.INFO.{jobs}.{consumer}"),
                format!("$JS.API.CONSUMER.MSG.NEXT.{jobs}.{consumer}"),
                format!("$JS.ACK.{jobs}.{consumer}.>"),
                namespace.jobs_subject(),
                format!("$JS.API.STREAM.INFO.KV_{owners}"),
                format!("$JS.API.DIRECT.GET.KV_{owners}.>"),
                format!("$JS.API.STREAM.MSG.GET.KV_{owners}"),
                format!("$KV.{owners}.>"),
                // The expiry watch: an ordered consumer of the bucket, with flow control.
                format!("$JS.API.CONSUMER.CREATE.KV_{owners}"),
                format!("$JS.API.CONSUMER.CREATE.KV_{owners}.>"),
                format!("$JS.API.CONSUMER.DELETE.KV_{owners}.>"),
                format!("$JS.FC.KV_{owners}.>"),
                format!("$JS.API.STREAM.INFO.{snapshots}"),
                format!("$JS.API.DIRECT.GET.{snapshots}"),
                format!("$JS.API.DIRECT.GET.{snapshots}.>"),
                format!("$JS.API.STREAM.PURGE.{snapshots}"),
                format!("{p}.snapshots.*"),
                format!("{p}.session.*.events"),
            ],
            subscribe: vec![
                format!("{p}.session.*.in"),
                format!("{p}.worker.*.info"),
                "_INBOX.>".to_owned(),
            ],
            allow_responses: true,
        }
    }

    /// The `permissions: { … }` block of a user in a NATS server configuration file.
    pub fn to_config(&self) -> String {
        let list = |subjects: &[String]| {
            subjects
                .iter()
                .map(|s| format!("\"{s}\""))
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!(
            "permissions: {{ publish: {{ allow: [{}] }}, subscribe: {{ allow: [{}] }}, allow_responses: {} }}",
            list(&self.publish),
            list(&self.subscribe),
            self.allow_responses
        )
    }
}
