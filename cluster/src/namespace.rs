//! `Namespace`: the names a cluster uses on NATS — subjects, the jobs stream and its
//! consumer, the owners bucket, the snapshots stream — all derived from one prefix, so two clusters (or two
//! tenants sharing an account) never touch each other's names, and the permissions a
//! gateway or a worker needs can be written as a few patterns (ARCHITECTURE.md, "The
//! cluster").
//!
//! With the default prefix `sb`:
//!
//! | name | what |
//! |---|---|
//! | `sb.jobs` | subject of the work-queue stream `sb_jobs`: one message per session to start |
//! | `sb_jobs` / `workers` | the stream and the durable pull consumer every worker shares |
//! | `sb_owners` | KV bucket: key = session id, value = its owner, epoch and state, with a TTL (the lease) |
//! | `sb.snapshots.<id>` → stream `sb_snapshots` | a session's last full snapshot and the deltas after it, each write a compare-and-set on the subject (fencing) |
//! | `sb.session.<id>.in` | requests to a session's owner: inputs (each with an id) and replays |
//! | `sb.session.<id>.events` | what a session says, in order, with sequence numbers and the epoch |
//! | `sb.worker.<name>.info` | a worker answers with its counts (capacity, live, started, …) |

use std::fmt;

/// Why a name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    /// A namespace prefix must be dot-separated tokens of `A-Z a-z 0-9 _ -`.
    #[error("namespace {prefix:?} is not dot-separated tokens of A-Z, a-z, 0-9, '_' and '-'")]
    Namespace {
        /// The prefix.
        prefix: String,
    },
    /// An inbox prefix must be dot-separated tokens of `A-Z a-z 0-9 _ -` (no wildcard).
    #[error("inbox prefix {prefix:?} is not dot-separated tokens of A-Z, a-z, 0-9, '_' and '-'")]
    InboxPrefix {
        /// The prefix.
        prefix: String,
    },
    /// A session id or worker name must be one subject token: 1–128 of `A-Z a-z 0-9 _ -`.
    #[error("{what} {name:?} must be 1-128 characters of A-Z, a-z, 0-9, '_' and '-'")]
    Token {
        /// What the name is for (`session id`, `worker name`).
        what: &'static str,
        /// The name.
        name: String,
    },
}

/// The prefix every name of one cluster derives from (default `sb`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Namespace {
    prefix: String,
}

impl Default for Namespace {
    fn default() -> Self {
        Self {
            prefix: "sb".to_owned(),
        }
    }
}

impl fmt::Display for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.prefix)
    }
}

impl Namespace {
    /// A namespace with this prefix (`sb`, `acme.voice`).
    pub fn new(prefix: impl Into<String>) -> Result<Self, NameError> {
        let prefix = prefix.into();
        if is_subject_prefix(&prefix) {
            Ok(Self { prefix })
        } else {
            Err(NameError::Namespace { prefix })
        }
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The prefix as one token (dots become `_`), for stream and bucket names.
    fn flat(&self) -> String {
        self.prefix.replace('.', "_")
    }

    /// The subject new sessions are published on (`sb.jobs`).
    pub fn jobs_subject(&self) -> String {
        format!("{}.jobs", self.prefix)
    }

    /// The work-queue stream holding sessions to start (`sb_jobs`).
    pub fn jobs_stream(&self) -> String {
        format!("{}_jobs", self.flat())
    }

    /// The durable pull consumer all workers share (`workers`).
    pub fn jobs_consumer(&self) -> &'static str {
        "workers"
    }

    /// The KV bucket of session owners (`sb_owners`).
    pub fn owners_bucket(&self) -> String {
        format!("{}_owners", self.flat())
    }

    /// The stream holding every session's snapshots (`sb_snapshots`).
    pub fn snapshots_stream(&self) -> String {
        format!("{}_snapshots", self.flat())
    }

    /// The subjects of the snapshots stream (`sb.snapshots.*`).
    pub fn snapshots_subjects(&self) -> String {
        format!("{}.snapshots.*", self.prefix)
    }

    /// The subject of one session's snapshots (`sb.snapshots.<id>`).
    pub fn snapshot_subject(&self, session: &SessionKey) -> String {
        format!("{}.snapshots.{}", self.prefix, session.0)
    }

    /// The subject of a session's inputs and replays (`sb.session.<id>.in`).
    pub fn session_inputs(&self, session: &SessionKey) -> String {
        format!("{}.session.{}.in", self.prefix, session.0)
    }

    /// The subject of a session's events (`sb.session.<id>.events`).
    pub fn session_events(&self, session: &SessionKey) -> String {
        format!("{}.session.{}.events", self.prefix, session.0)
    }

    /// The subject a worker answers its counts on (`sb.worker.<name>.info`).
    pub fn worker_info(&self, worker: &str) -> String {
        format!("{}.worker.{worker}.info", self.prefix)
    }
}

/// A session's id in the cluster: one subject token, also its key in the owners bucket.
/// The gateway makes one per session, or the host gives its own (a call's id).
#[derive(
    Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(try_from = "String", into = "String")]
pub struct SessionKey(String);

impl SessionKey {
    /// Checks that `id` can name a session: 1–128 of `A-Z a-z 0-9 _ -`.
    pub fn new(id: impl Into<String>) -> Result<Self, NameError> {
        let id = id.into();
        if is_token(&id) && id.len() <= 128 {
            Ok(Self(id))
        } else {
            Err(NameError::Token {
                what: "session id",
                name: id,
            })
        }
    }

    /// The id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SessionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for SessionKey {
    type Error = NameError;
    fn try_from(id: String) -> Result<Self, NameError> {
        Self::new(id)
    }
}

impl From<SessionKey> for String {
    fn from(key: SessionKey) -> Self {
        key.0
    }
}

/// Checks a worker's name: one subject token.
pub(crate) fn check_worker_name(name: &str) -> Result<(), NameError> {
    if is_token(name) && name.len() <= 128 {
        Ok(())
    } else {
        Err(NameError::Token {
            what: "worker name",
            name: name.to_owned(),
        })
    }
}

/// Checks the prefix of a client's reply subjects (`_INBOX`, `_INBOX_acme`).
pub(crate) fn check_inbox_prefix(prefix: &str) -> Result<(), NameError> {
    if is_subject_prefix(prefix) {
        Ok(())
    } else {
        Err(NameError::InboxPrefix {
            prefix: prefix.to_owned(),
        })
    }
}

/// Dot-separated tokens: a subject with no wildcard, which names can be built under.
fn is_subject_prefix(s: &str) -> bool {
    s.split('.').all(is_token)
}

/// One subject token that is also a valid KV key and stream-name part.
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_derive_from_the_prefix() -> Result<(), NameError> {
        let ns = Namespace::new("acme.voice")?;
        let s = SessionKey::new("call-42")?;
        assert_eq!(ns.jobs_subject(), "acme.voice.jobs");
        assert_eq!(ns.jobs_stream(), "acme_voice_jobs");
        assert_eq!(ns.owners_bucket(), "acme_voice_owners");
        assert_eq!(ns.session_inputs(&s), "acme.voice.session.call-42.in");
        assert_eq!(ns.session_events(&s), "acme.voice.session.call-42.events");
        assert_eq!(ns.worker_info("w1"), "acme.voice.worker.w1.info");
        assert_eq!(ns.snapshots_stream(), "acme_voice_snapshots");
        assert_eq!(ns.snapshot_subject(&s), "acme.voice.snapshots.call-42");
        Ok(())
    }

    #[test]
    fn names_that_would_break_a_subject_are_refused() {
        for bad in ["", "a.b", "a*", "a>", "a b", &"x".repeat(129)] {
            assert!(SessionKey::new(bad).is_err(), "{bad:?} accepted");
        }
        for bad in ["", "a..b", ".a", "a.", "a.*", "a b"] {
            assert!(Namespace::new(bad).is_err(), "{bad:?} accepted");
        }
        for bad in ["", "_INBOX.>", "_INBOX.*", "_INBOX acme", "_INBOX."] {
            assert!(check_inbox_prefix(bad).is_err(), "{bad:?} accepted");
        }
        assert!(check_inbox_prefix("_INBOX_acme").is_ok());
        assert!(check_worker_name("worker-1").is_ok());
        assert!(check_worker_name("worker.1").is_err());
        assert!(serde_json::from_str::<SessionKey>("\"a.b\"").is_err());
    }
}
