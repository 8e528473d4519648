//! `Permissions`: the subjects a worker and a gateway need, as NATS per-user permissions,
//! so a deployment gives each role no more (the type's docs say how tenants are kept apart).

use crate::namespace::{check_inbox_prefix, NameError, Namespace};

/// The prefix of a NATS client's reply subjects unless it is given another.
pub const DEFAULT_INBOX_PREFIX: &str = "_INBOX";

/// One role's subjects: what it may publish and subscribe to.
///
/// Tenants are kept apart in one of two ways:
///
/// * **An account per tenant** (the stronger): each tenant's workers and gateways are
///   users of the tenant's account, with JetStream enabled there, and an account's
///   subjects, streams and buckets do not exist for any other account. Every tenant may
///   use the default namespace `sb` and the default reply subjects `_INBOX`:
///   [`Permissions::gateway`] and [`Permissions::worker`].
/// * **Tenants sharing one account**: each tenant gets a namespace of its own (`acme.sb`:
///   its subjects, streams and bucket) and an inbox prefix of its own (`_INBOX_acme`: the
///   subjects its clients get their replies on), and its users get
///   [`Permissions::gateway_with_inbox`] and [`Permissions::worker_with_inbox`] for both.
///   One tenant's users then may neither publish nor subscribe to a subject of another's:
///   not its sessions' inputs or events, not its jobs, owner records or snapshots, not the
///   replies its clients wait for. Its clients connect with the same prefix
///   ([`NatsConnect::inbox_prefix`](crate::NatsConnect::inbox_prefix)), and its workers
///   and gateways are given the namespace.
///
/// Inside a tenant the permissions keep each role to its part: a gateway cannot write
/// owner records or snapshots, read a session's inputs or pull jobs. (A worker may queue
/// jobs: it queues the resume of the sessions it hands over or sees expire.)
///
/// ```
/// use switchboard_cluster::{Namespace, Permissions};
/// let ns = Namespace::default();
/// let gateway = Permissions::gateway(&ns);
/// assert!(gateway.publish.contains(&"sb.jobs".to_owned()));
/// println!("{}", gateway.to_config()); // `permissions: { … }` for a user in a server config
///
/// // Two tenants in one account: a namespace and an inbox prefix each.
/// let acme = Namespace::new("acme.sb")?;
/// let worker = Permissions::worker_with_inbox(&acme, "_INBOX_acme")?;
/// assert!(worker.subscribe.contains(&"_INBOX_acme.>".to_owned()));
/// assert!(worker.publish.iter().all(|s| !s.starts_with("sb.")));
/// # Ok::<(), switchboard_cluster::NameError>(())
/// ```
///
/// A worker started with `provision(false)` needs only the worker's permissions; creating
/// the jobs stream, its consumer, the owners bucket and the snapshots stream takes an
/// admin user of the account (`$JS.API.>`), once ([`provision`](crate::provision)).
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
    /// A gateway's, whose client gets its replies on the default `_INBOX` (a tenant with
    /// an account of its own): publish jobs, send inputs and ask workers' counts; read
    /// sessions' events and its own replies.
    pub fn gateway(namespace: &Namespace) -> Self {
        Self::gateway_for(namespace, DEFAULT_INBOX_PREFIX)
    }

    /// A gateway's, whose client gets its replies under `inbox_prefix` (tenants sharing
    /// an account: see [`Permissions`]). Fails on a prefix that is not
    /// dot-separated tokens.
    pub fn gateway_with_inbox(
        namespace: &Namespace,
        inbox_prefix: &str,
    ) -> Result<Self, NameError> {
        check_inbox_prefix(inbox_prefix)?;
        Ok(Self::gateway_for(namespace, inbox_prefix))
    }

    fn gateway_for(namespace: &Namespace, inbox_prefix: &str) -> Self {
        let p = namespace.prefix();
        Self {
            publish: vec![
                namespace.jobs_subject(),
                format!("{p}.session.*.in"),
                format!("{p}.worker.*.info"),
            ],
            subscribe: vec![format!("{p}.session.*.events"), format!("{inbox_prefix}.>")],
            allow_responses: false,
        }
    }

    /// A worker's (one that does not provision), whose client gets its replies on the
    /// default `_INBOX`: pull and acknowledge jobs and queue resume jobs, read, write and
    /// watch owner records, read and write snapshots, publish sessions' events, ask
    /// another worker for its counts (is a silent owner gone?); read sessions' inputs and
    /// its info requests, and answer them.
    pub fn worker(namespace: &Namespace) -> Self {
        Self::worker_for(namespace, DEFAULT_INBOX_PREFIX)
    }

    /// A worker's, whose client gets its replies under `inbox_prefix` (tenants sharing an
    /// account: see [`Permissions`]). Fails on a prefix that is not dot-separated
    /// tokens.
    pub fn worker_with_inbox(namespace: &Namespace, inbox_prefix: &str) -> Result<Self, NameError> {
        check_inbox_prefix(inbox_prefix)?;
        Ok(Self::worker_for(namespace, inbox_prefix))
    }

    fn worker_for(namespace: &Namespace, inbox_prefix: &str) -> Self {
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
                // The lease watch: an ordered consumer of the bucket, with flow control.
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
                // Whether the owner a gateway found silent is gone (`worker/silent_owner.rs`).
                format!("{p}.worker.*.info"),
            ],
            subscribe: vec![
                format!("{p}.session.*.in"),
                format!("{p}.worker.*.info"),
                format!("{inbox_prefix}.>"),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every subject of one tenant's roles, publish and subscribe.
    fn subjects(ns: &Namespace, inbox: &str) -> Vec<String> {
        let gateway = Permissions::gateway_with_inbox(ns, inbox).unwrap();
        let worker = Permissions::worker_with_inbox(ns, inbox).unwrap();
        [
            gateway.publish,
            gateway.subscribe,
            worker.publish,
            worker.subscribe,
        ]
        .concat()
    }

    /// Whether the NATS subject pattern `pattern` matches some subject `other` matches.
    fn overlap(pattern: &str, other: &str) -> bool {
        let (mut a, mut b) = (pattern.split('.'), other.split('.'));
        loop {
            match (a.next(), b.next()) {
                (Some(">"), Some(_)) | (Some(_), Some(">")) => return true,
                (Some(x), Some(y)) if x == y || x == "*" || y == "*" => {}
                (None, None) => return true,
                _ => return false,
            }
        }
    }

    #[test]
    fn replies_come_under_the_inbox_prefix_given() -> Result<(), NameError> {
        let ns = Namespace::default();
        assert!(Permissions::gateway(&ns)
            .subscribe
            .contains(&"_INBOX.>".to_owned()));
        let acme = Namespace::new("acme.sb")?;
        for role in [
            Permissions::gateway_with_inbox(&acme, "_INBOX_acme")?,
            Permissions::worker_with_inbox(&acme, "_INBOX_acme")?,
        ] {
            assert!(
                role.subscribe.contains(&"_INBOX_acme.>".to_owned()),
                "{role:?}"
            );
            assert!(
                !role.subscribe.iter().any(|s| s.starts_with("_INBOX.")),
                "{role:?}"
            );
        }
        assert!(Permissions::gateway_with_inbox(&acme, "_INBOX.>").is_err());
        assert!(Permissions::worker_with_inbox(&acme, "").is_err());
        Ok(())
    }

    /// Two tenants of one account, each with its namespace and inbox prefix: no subject
    /// one tenant's roles may use is one the other's may use (the server test is
    /// `tenants_sharing_an_account_cannot_reach_each_other`).
    #[test]
    fn two_tenants_with_their_own_names_share_no_subject() -> Result<(), NameError> {
        let acme = subjects(&Namespace::new("acme.sb")?, "_INBOX_acme");
        let globex = subjects(&Namespace::new("globex.sb")?, "_INBOX_globex");
        for a in &acme {
            for g in &globex {
                assert!(!overlap(a, g), "{a} (acme) and {g} (globex) overlap");
            }
        }
        Ok(())
    }
}
