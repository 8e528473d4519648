//! `Gateway`: the host's front door to the cluster. A WebSocket server, a telephony edge or
//! a chat backend holds one and starts sessions through it; each comes back as a
//! [`RemoteSession`] with the host API of a local session. The front never learns which
//! worker runs a session.
//!
//! Starting a session: the gateway subscribes to the session's event subject, publishes a
//! job on the jobs stream (retried until it is stored; the session id is the message id,
//! so a retry is not a second job), and waits for the first event, `SessionStarted` (or
//! `StartFailed`), from whichever worker claimed it.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use switchboard::SessionError;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::connect::ClusterClient;
use crate::dispatch::{self, Published};
use crate::namespace::{NameError, Namespace, SessionKey};
use crate::protocol::{SessionJob, WorkerInfo};
use crate::remote_event::CloseReason;
use crate::remote_session::{RemoteSession, StartState};
use crate::spec::{FactoryError, SessionSpec};

/// Errors of a gateway and its remote sessions.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum GatewayError {
    /// A name (a session id, the namespace) is not usable on NATS.
    #[error(transparent)]
    Name(#[from] NameError),
    /// No worker started the session in time: no worker runs, or all are full (the job
    /// stays queued and may still start; the worker's idle timeout closes it then).
    #[error("no worker started session {session} within {waited:?}: are workers running, with free slots?")]
    StartTimedOut {
        /// The session.
        session: SessionKey,
        /// How long the gateway waited.
        waited: Duration,
    },
    /// A worker took the session but could not start it (an agent its factory does not
    /// know, a factory error).
    #[error("session {session} did not start: {reason}")]
    StartFailed {
        /// The session.
        session: SessionKey,
        /// What the worker said.
        reason: String,
    },
    /// A session with this id was started already.
    #[error("a session with id {session} was started already")]
    Duplicate {
        /// The session.
        session: SessionKey,
    },
    /// The session is closed; start a new one.
    #[error("session {session} is closed: {reason:?}")]
    Closed {
        /// The session.
        session: SessionKey,
        /// Why it closed.
        reason: CloseReason,
    },
    /// Its owner did not answer within the input deadline, through every retry: the
    /// worker is gone or cut off. Whether the input was applied is unknown, so later
    /// inputs of this session fail the same way.
    #[error("the owner of session {session} did not answer {input} within {waited:?} (it may or may not have been applied)")]
    Unreachable {
        /// The session.
        session: SessionKey,
        /// The input.
        input: &'static str,
        /// How long the gateway tried.
        waited: Duration,
    },
    /// What the front sent is bigger than the NATS server takes in one message (its
    /// `max_payload`): an input (say or transcribe it in pieces) or a session's spec.
    /// Nothing was sent; the session goes on.
    #[error("{what} for session {session} takes {bytes} bytes, over the {max} the NATS server takes in one message")]
    TooLarge {
        /// The session.
        session: SessionKey,
        /// The input, or "the spec".
        what: &'static str,
        /// Its size.
        bytes: usize,
        /// The server's limit.
        max: usize,
    },
    /// The NATS server refused the operation: this client's permissions do not cover
    /// the subject (see [`Permissions`](crate::Permissions)).
    #[error("the NATS server refused: {server_said}")]
    Refused {
        /// The subject.
        subject: String,
        /// The server's words.
        server_said: String,
    },
    /// The session refused or failed the input, saying the engine's own error, as a
    /// local session's call would (a failed turn with what it did before, an
    /// uninterruptible speech, a full queue). Shared, so the error can be cloned.
    #[error("{input} on session {session}: {failure}")]
    Session {
        /// The session.
        session: SessionKey,
        /// The input.
        input: &'static str,
        /// What the session said.
        failure: Arc<SessionError>,
    },
    /// The worker's factory could not build the agent asked for (`update_agent` with an
    /// agent it does not know, or data that does not fit).
    #[error("{input} on session {session}: {error}")]
    Factory {
        /// The session.
        session: SessionKey,
        /// The input.
        input: &'static str,
        /// What the factory said.
        error: FactoryError,
    },
    /// The input was applied before by an owner whose answer did not reach the gateway,
    /// and it failed; the owner that has the session now kept only the error's message.
    #[error("{input} on session {session} failed earlier: {message}")]
    FailedEarlier {
        /// The session.
        session: SessionKey,
        /// The input.
        input: &'static str,
        /// The error's message.
        message: String,
    },
    /// The input was applied, but the worker that applied it stopped (it died, or lost
    /// its lease) before its answer reached the gateway, and the worker that took the
    /// session over does not have the answer. The conversation has it (`history`); the
    /// session goes on.
    #[error("{input} on session {session} was applied, but its answer was lost when the session moved to another worker")]
    AnswerLost {
        /// The session.
        session: SessionKey,
        /// The input.
        input: &'static str,
    },
    /// The owner needs inputs this gateway no longer has (they were in a snapshot that
    /// could not be read back).
    #[error("session {session} lost inputs: its owner expected input {expected}")]
    InputsLost {
        /// The session.
        session: SessionKey,
        /// The id it expected.
        expected: u64,
    },
    /// The owner answered something this gateway does not understand (mismatched
    /// versions).
    #[error("session {session}'s owner answered something unexpected: {detail}")]
    Protocol {
        /// The session.
        session: SessionKey,
        /// What.
        detail: String,
    },
    /// NATS itself failed (the connection is closed).
    #[error("NATS: {reason}")]
    Nats {
        /// What failed.
        reason: String,
    },
}

/// How a gateway talks to the cluster.
#[derive(Clone, Debug)]
pub struct GatewayOptions {
    pub(crate) namespace: Namespace,
    pub(crate) attempt_timeout: Duration,
    pub(crate) input_deadline: Duration,
    pub(crate) start_timeout: Duration,
    pub(crate) kept_events: usize,
    pub(crate) event_capacity: usize,
    pub(crate) check_every: Duration,
}

impl Default for GatewayOptions {
    fn default() -> Self {
        Self {
            namespace: Namespace::default(),
            attempt_timeout: Duration::from_millis(500),
            input_deadline: Duration::from_secs(30),
            start_timeout: Duration::from_secs(30),
            kept_events: 4096,
            event_capacity: 1024,
            check_every: Duration::from_secs(2),
        }
    }
}

impl GatewayOptions {
    /// The defaults below.
    pub fn new() -> Self {
        Self::default()
    }

    /// The cluster's namespace (default `sb`).
    pub fn namespace(mut self, namespace: Namespace) -> Self {
        self.namespace = namespace;
        self
    }

    /// How long one attempt of an input waits for its owner's answer before it is sent
    /// again with the same id (default 500 ms). Core NATS delivers at most once: a request
    /// into a dying worker is simply lost, and only a retry finds out.
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = timeout;
        self
    }

    /// How long an input is retried, and how long a turn may go without any sign of its
    /// owner, before the gateway gives up with [`GatewayError::Unreachable`] (default
    /// 30 s). Keep it longer than the workers' lease plus a resume: when a worker dies,
    /// its sessions come back elsewhere one lease later (10 s by default).
    pub fn input_deadline(mut self, deadline: Duration) -> Self {
        self.input_deadline = deadline;
        self
    }

    /// How long `start_session` waits for a worker to start the session (default 30 s).
    pub fn start_timeout(mut self, timeout: Duration) -> Self {
        self.start_timeout = timeout;
        self
    }

    /// How many of a session's newest events the gateway keeps for
    /// `RemoteSession::subscribe_from` (default 4096).
    pub fn kept_events(mut self, events: usize) -> Self {
        self.kept_events = events.max(1);
        self
    }

    /// How many events a slow subscriber may fall behind before it is told it lagged
    /// (default 1024).
    pub fn event_capacity(mut self, events: usize) -> Self {
        self.event_capacity = events.max(1);
        self
    }

    /// While an answer is awaited, how often the gateway asks the owner for events it
    /// may have missed (which also shows the owner is alive; default 2 s).
    pub fn check_every(mut self, every: Duration) -> Self {
        self.check_every = every;
        self
    }
}

/// What a gateway did: counters, also as a watch (`Gateway::watch_stats`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct GatewayStats {
    /// Sessions started.
    pub sessions_started: u64,
    /// Inputs sent (first attempts).
    pub inputs_sent: u64,
    /// Attempts sent again with the same id after a timeout or no answer.
    pub retries: u64,
    /// Replays asked of owners (after a gap, a reconnection, or while waiting).
    pub replays: u64,
    /// Events that could not be had back (reported as `EventsLost`).
    pub events_lost: u64,
    /// Times a session of this gateway was resumed by a new owner (after a drain or a
    /// failure).
    pub resumes: u64,
    /// Inputs sent again to a new owner whose snapshot did not hold them.
    pub inputs_resent: u64,
    /// Of those, the ones whose answer the front already had: sent as answered (the new
    /// owner counts the id and applies nothing), never applied a second time.
    pub inputs_answered: u64,
    /// Replies from an owner older than the newest one seen (one that should have been
    /// fenced), ignored: the input is sent again to the newest.
    pub stale_replies: u64,
    /// Answers of inputs that take time (a turn, a read, a handoff) that no call waited
    /// for: the call gave up (it was dropped, or its owner was unreachable), or the input
    /// was applied a second time.
    pub answers_unclaimed: u64,
    /// Times a request to a session's owner found nobody subscribed while this gateway's
    /// connection was settled, and the gateway asked the pool to claim the session at
    /// once (at once for an owner, then again while it stays silent, 1, 2, 4 and every
    /// 8 s apart).
    pub silent_owners: u64,
}

/// What the gateway's sessions share.
pub(crate) struct GatewayInner {
    pub(crate) client: ClusterClient,
    pub(crate) js: jetstream::Context,
    pub(crate) options: GatewayOptions,
    pub(crate) stats: watch::Sender<GatewayStats>,
}

impl GatewayInner {
    pub(crate) fn count(&self, f: impl FnOnce(&mut GatewayStats)) {
        self.stats.send_modify(f);
    }
}

/// Starts sessions on the cluster. Cheap to clone.
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<GatewayInner>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("namespace", &self.inner.options.namespace)
            .finish()
    }
}

impl Gateway {
    /// A gateway on `client`.
    pub fn new(client: ClusterClient, options: GatewayOptions) -> Self {
        let js = jetstream::ContextBuilder::new()
            .timeout(options.attempt_timeout)
            .build(client.nats().clone());
        Self {
            inner: Arc::new(GatewayInner {
                client,
                js,
                options,
                stats: watch::channel(GatewayStats::default()).0,
            }),
        }
    }

    /// Starts a session with a fresh id on whichever worker has room.
    pub async fn start_session(&self, spec: SessionSpec) -> Result<RemoteSession, GatewayError> {
        let inbox = self.inner.client.nats().new_inbox();
        let id = inbox.rsplit('.').next().unwrap_or(&inbox).to_owned();
        self.start_session_with_id(id, spec).await
    }

    /// Starts a session with the host's own id (a call's id): one subject token of
    /// `A-Z a-z 0-9 _ -`. An id already used is refused ([`GatewayError::Duplicate`], or
    /// `StartFailed` once the stream's duplicate window has passed but the owner record
    /// is still kept).
    pub async fn start_session_with_id(
        &self,
        id: impl Into<String>,
        spec: SessionSpec,
    ) -> Result<RemoteSession, GatewayError> {
        let key = SessionKey::new(id)?;
        let inner = &self.inner;
        let options = &inner.options;
        let began = Instant::now();
        let deadline = began + options.start_timeout;
        // Subscribed before the job exists, so the first event cannot be missed.
        let remote = RemoteSession::open(inner.clone(), key.clone()).await?;
        let job = SessionJob {
            session: key.clone(),
            spec: Some(spec),
            silent: None,
        };
        // The job, and the claim that stores its spec beside the session's snapshots.
        let bytes = serde_json::to_vec(&job).map_or(0, |json| json.len());
        let max = inner.client.nats().max_payload();
        if bytes > max.saturating_sub(1024) {
            return Err(GatewayError::TooLarge {
                session: key,
                what: "the spec",
                bytes,
                max,
            });
        }
        let subject = options.namespace.jobs_subject();
        let mut attempted = false;
        loop {
            let published = dispatch::publish_job(&inner.js, &options.namespace, &job).await;
            match published {
                Ok(Published::Queued) => break,
                // An earlier attempt of ours, whose ack was lost, did land.
                Ok(Published::Duplicate) if attempted => break,
                Ok(Published::Duplicate) => return Err(GatewayError::Duplicate { session: key }),
                Err(reason) => {
                    attempted = true;
                    if let Some(server_said) = inner.client.refusal_of(&subject) {
                        return Err(GatewayError::Refused {
                            subject,
                            server_said,
                        });
                    }
                    if Instant::now() >= deadline {
                        tracing::warn!(session = %key, %reason, "the job could not be published");
                        return Err(GatewayError::StartTimedOut {
                            session: key,
                            waited: began.elapsed(),
                        });
                    }
                    // The stream is not there yet, or the server is away: try again soon.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        match remote.wait_started(deadline).await {
            StartState::Started => {
                inner.count(|s| s.sessions_started += 1);
                Ok(remote)
            }
            StartState::Failed(reason) => Err(GatewayError::StartFailed {
                session: key,
                reason,
            }),
            StartState::Waiting => Err(GatewayError::StartTimedOut {
                session: key,
                waited: began.elapsed(),
            }),
        }
    }

    /// What the gateway did so far.
    pub fn stats(&self) -> GatewayStats {
        self.inner.stats.borrow().clone()
    }

    /// A watch of [`Gateway::stats`], changed at every count (a test waits on it instead
    /// of polling).
    pub fn watch_stats(&self) -> watch::Receiver<GatewayStats> {
        self.inner.stats.subscribe()
    }

    /// Asks the worker named `worker` for its counts.
    pub async fn worker_info(&self, worker: &str) -> Result<WorkerInfo, GatewayError> {
        let subject = self.inner.options.namespace.worker_info(worker);
        let reply = tokio::time::timeout(
            self.inner.options.input_deadline,
            self.inner.client.nats().request(subject, Vec::new().into()),
        )
        .await
        .map_err(|_| GatewayError::Nats {
            reason: format!("worker {worker} did not answer"),
        })?
        .map_err(|err| GatewayError::Nats {
            reason: format!("worker {worker}: {err}"),
        })?;
        serde_json::from_slice(&reply.payload).map_err(|err| GatewayError::Nats {
            reason: format!("worker {worker} answered something unreadable: {err}"),
        })
    }
}
