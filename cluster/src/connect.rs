//! Connecting to NATS: [`NatsConnect`] takes NATS's own authentication (user and
//! password, token, nkey, credentials file) and TLS options; [`ClusterClient`] is the
//! connection a worker or a gateway runs on. Besides the `async_nats::Client`, it tells its
//! users when the connection came back after an outage (so a gateway can ask for the
//! events it missed) and what the server refused (so an operation the server's permissions
//! forbid fails saying so, instead of timing out).

use std::collections::VecDeque;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::{ConnectErrorKind, ConnectOptions, Event, ServerError};
use tokio::sync::watch;

/// How many refusals a client remembers (the newest).
const REFUSALS_KEPT: usize = 64;

/// How long a connection must have been up before a peer nobody answers for counts as
/// gone: twice the longest wait between reconnection attempts (1 s, below), so after a
/// server restart every client that reconnects at all is back by then.
pub(crate) const SETTLED: Duration = Duration::from_secs(2);

/// Why a connection could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The server refused the credentials (none, wrong ones, or a user not allowed in).
    #[error("the NATS server at {url} refused the connection: {reason}")]
    Refused {
        /// The server (credentials written into its URL hidden).
        url: String,
        /// What the client library said.
        reason: String,
    },
    /// TLS could not be set up (a missing certificate, a server without TLS).
    #[error("TLS to the NATS server at {url} failed: {reason}")]
    Tls {
        /// The server.
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// The server could not be reached (nothing listens, DNS, a timeout).
    #[error("cannot reach the NATS server at {url}: {reason}")]
    Unreachable {
        /// The server.
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// The credentials file could not be read.
    #[error("cannot read the NATS credentials file {path}: {reason}")]
    CredentialsFile {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
}

/// How a client proves who it is.
#[derive(Clone, Default)]
enum Auth {
    #[default]
    None,
    UserPassword(String, String),
    Token(String),
    NKey(String),
    CredentialsFile(PathBuf),
}

impl fmt::Debug for Auth {
    /// Names the method, never the secret.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::None => f.write_str("none"),
            Self::UserPassword(user, _) => write!(f, "user {user:?} with a password"),
            Self::Token(_) => f.write_str("a token"),
            Self::NKey(_) => f.write_str("an nkey"),
            Self::CredentialsFile(path) => write!(f, "credentials file {}", path.display()),
        }
    }
}

/// The server URLs as logs and errors show them: a user, password or token written into a
/// URL (`nats://user:secret@host`) becomes `…@`.
fn shown_urls(urls: &str) -> String {
    urls.split(',')
        .map(|url| {
            let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
            let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
            let hidden = if host.len() < rest.len() { "…@" } else { "" };
            match scheme {
                "" => format!("{hidden}{host}"),
                scheme => format!("{scheme}://{hidden}{host}"),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Options for connecting a worker or a gateway to NATS. Its `Debug` names the
/// authentication method, never the secret, and hides credentials written into the URL.
///
/// ```no_run
/// use switchboard_cluster::NatsConnect;
/// # async fn demo() -> Result<(), switchboard_cluster::ConnectError> {
/// let client = NatsConnect::new("tls://nats.internal:4222")
///     .credentials_file("/etc/switchboard/worker.creds")
///     .root_certificates("/etc/switchboard/ca.pem")
///     .name("worker-7")
///     .connect()
///     .await?;
/// # drop(client);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct NatsConnect {
    url: String,
    auth: Auth,
    require_tls: bool,
    root_certificates: Vec<PathBuf>,
    client_certificate: Option<(PathBuf, PathBuf)>,
    name: Option<String>,
    inbox_prefix: Option<String>,
    connection_timeout: Duration,
}

impl fmt::Debug for NatsConnect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsConnect")
            .field("url", &shown_urls(&self.url))
            .field("auth", &self.auth)
            .field("require_tls", &self.require_tls)
            .field("root_certificates", &self.root_certificates)
            .field("client_certificate", &self.client_certificate)
            .field("name", &self.name)
            .field("inbox_prefix", &self.inbox_prefix)
            .field("connection_timeout", &self.connection_timeout)
            .finish()
    }
}

impl NatsConnect {
    /// Connects to `url` (`nats://host:port`, `tls://host:port`, or several separated by
    /// commas), without credentials until one of the methods below adds them.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            auth: Auth::None,
            require_tls: false,
            root_certificates: Vec::new(),
            client_certificate: None,
            name: None,
            inbox_prefix: None,
            connection_timeout: Duration::from_secs(5),
        }
    }

    /// Authenticates with a user and password.
    pub fn user_and_password(
        mut self,
        user: impl Into<String>,
        password: impl Into<String>,
    ) -> Self {
        self.auth = Auth::UserPassword(user.into(), password.into());
        self
    }

    /// Authenticates with a token.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.auth = Auth::Token(token.into());
        self
    }

    /// Authenticates with an nkey seed (`SU…`).
    pub fn nkey(mut self, seed: impl Into<String>) -> Self {
        self.auth = Auth::NKey(seed.into());
        self
    }

    /// Authenticates with a credentials file (a user JWT and its nkey seed, as `nsc`
    /// writes them for decentralised accounts).
    pub fn credentials_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.auth = Auth::CredentialsFile(path.into());
        self
    }

    /// Refuses to talk to a server without TLS.
    pub fn require_tls(mut self, required: bool) -> Self {
        self.require_tls = required;
        self
    }

    /// Trusts the certificate authorities in this PEM file (besides the system's).
    pub fn root_certificates(mut self, pem: impl Into<PathBuf>) -> Self {
        self.root_certificates.push(pem.into());
        self
    }

    /// Presents this client certificate and key (PEM) for mutual TLS.
    pub fn client_certificate(
        mut self,
        certificate: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
    ) -> Self {
        self.client_certificate = Some((certificate.into(), key.into()));
        self
    }

    /// The connection's name, shown by the server's monitoring (a worker's name is a good
    /// one).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The prefix of this client's reply subjects (default `_INBOX`). Tenants that share
    /// one NATS account get one each, so a permission on `_INBOX_<tenant>.>` keeps one
    /// tenant from reading another's replies; with one account per tenant the default is
    /// fine.
    pub fn inbox_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.inbox_prefix = Some(prefix.into());
        self
    }

    /// How long the first connection may take (default 5 s).
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }

    /// Connects. Fails at once when the server refuses the credentials; after the first
    /// connection, the client reconnects by itself for as long as it lives.
    pub async fn connect(self) -> Result<ClusterClient, ConnectError> {
        let (connections, reconnections) = watch::channel(0u64);
        let up_since = Arc::new(Mutex::new(None));
        let refusals = Arc::new(watch::channel(VecDeque::new()).0);
        let mut options = match self.auth.clone() {
            Auth::None => ConnectOptions::new(),
            Auth::UserPassword(user, password) => {
                ConnectOptions::with_user_and_password(user, password)
            }
            Auth::Token(token) => ConnectOptions::with_token(token),
            Auth::NKey(seed) => ConnectOptions::with_nkey(seed),
            Auth::CredentialsFile(path) => ConnectOptions::with_credentials_file(&path)
                .await
                .map_err(|err| ConnectError::CredentialsFile {
                    path: path.clone(),
                    reason: err.to_string(),
                })?,
        };
        if self.require_tls {
            options = options.require_tls(true);
        }
        for pem in &self.root_certificates {
            options = options.add_root_certificates(pem.clone());
        }
        if let Some((cert, key)) = &self.client_certificate {
            options = options.add_client_certificate(cert.clone(), key.clone());
        }
        if let Some(name) = &self.name {
            options = options.name(name);
        }
        if let Some(prefix) = &self.inbox_prefix {
            options = options.custom_inbox_prefix(prefix);
        }
        let seen = refusals.clone();
        let up = up_since.clone();
        options = options
            .connection_timeout(self.connection_timeout)
            // Reconnect at once, then after 10, 20, 40 … ms, at most 1 s apart: an outage
            // of a second costs about a second, not the default's growing 4 s steps.
            .reconnect_delay_callback(|attempts| {
                let exponent = u32::try_from(attempts.saturating_sub(1))
                    .unwrap_or(u32::MAX)
                    .min(7);
                if attempts <= 1 {
                    Duration::ZERO
                } else {
                    Duration::from_millis(10u64 << exponent).min(Duration::from_secs(1))
                }
            })
            .event_callback(move |event| {
                let connections = connections.clone();
                let seen = seen.clone();
                let up = up.clone();
                async move { on_event(event, &connections, &seen, &up) }
            });
        // Several servers (a cluster): the client tries them in turn, and learns the rest
        // of the cluster from the one it reaches.
        let urls: Vec<&str> = self
            .url
            .split(',')
            .map(str::trim)
            .filter(|url| !url.is_empty())
            .collect();
        let client = options.connect(urls.as_slice()).await.map_err(|err| {
            let reason = err.to_string();
            let url = shown_urls(&self.url);
            match err.kind() {
                ConnectErrorKind::Authentication | ConnectErrorKind::AuthorizationViolation => {
                    ConnectError::Refused { url, reason }
                }
                ConnectErrorKind::Tls => ConnectError::Tls { url, reason },
                _ => ConnectError::Unreachable { url, reason },
            }
        })?;
        // Connected now, whether or not the callback said so yet.
        up_since
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert_with(Instant::now);
        Ok(ClusterClient {
            inner: Arc::new(ClientInner {
                client,
                reconnections,
                refusals,
                up_since,
            }),
        })
    }
}

/// What the client library reports about the connection: counted reconnections, and
/// refusals kept for the operations that caused them.
fn on_event(
    event: Event,
    connections: &watch::Sender<u64>,
    refusals: &watch::Sender<VecDeque<String>>,
    up_since: &Mutex<Option<Instant>>,
) {
    match event {
        Event::Connected => {
            connections.send_modify(|n| *n += 1);
            *up_since.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
            tracing::info!("nats: connected");
        }
        Event::Disconnected => {
            *up_since.lock().unwrap_or_else(|p| p.into_inner()) = None;
            tracing::warn!("nats: disconnected; reconnecting");
        }
        Event::ServerError(ServerError::Other(message))
            if message.contains("Permissions Violation") =>
        {
            tracing::warn!(%message, "nats: the server refused an operation");
            refusals.send_modify(|kept| {
                if kept.len() == REFUSALS_KEPT {
                    kept.pop_front();
                }
                kept.push_back(message);
            });
        }
        other => tracing::debug!(event = %other, "nats"),
    }
}

/// A connection to NATS for workers and gateways. Cheap to clone; all clones share one
/// connection.
#[derive(Clone)]
pub struct ClusterClient {
    inner: Arc<ClientInner>,
}

struct ClientInner {
    client: async_nats::Client,
    reconnections: watch::Receiver<u64>,
    refusals: Arc<watch::Sender<VecDeque<String>>>,
    /// Since when the connection is up (`None` while it is down). A plain value behind a
    /// lock: written at each (re)connection, read when a peer is silent.
    up_since: Arc<Mutex<Option<Instant>>>,
}

impl fmt::Debug for ClusterClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterClient")
            .field("state", &self.inner.client.connection_state())
            .finish()
    }
}

impl ClusterClient {
    /// The underlying `async_nats` client (for your own subjects on the same connection).
    pub fn nats(&self) -> &async_nats::Client {
        &self.inner.client
    }

    /// A watch of how many times the connection was made: 1 after the first connection,
    /// +1 after each reconnection. A gateway asks for missed events when it moves.
    pub fn connections(&self) -> watch::Receiver<u64> {
        self.inner.reconnections.clone()
    }

    /// The operations the server refused (permission violations), oldest first, as the
    /// server worded them: `Permissions Violation for Publish to "sb.jobs"`.
    pub fn refusals(&self) -> Vec<String> {
        self.inner.refusals.borrow().iter().cloned().collect()
    }

    /// Waits, at most `timeout`, for the server to refuse an operation on `subject`
    /// (the refusal comes a moment after the operation, from the server); returns its
    /// words, or `None` if it did not refuse one.
    pub async fn refused(&self, subject: &str, timeout: Duration) -> Option<String> {
        let mut refusals = self.inner.refusals.subscribe();
        let quoted = format!("\"{subject}\"");
        let found = tokio::time::timeout(
            timeout,
            refusals.wait_for(|kept| kept.iter().any(|m| m.contains(&quoted))),
        )
        .await;
        match found {
            Ok(Ok(_)) => self.refusal_of(subject),
            _ => None,
        }
    }

    /// Whether the connection has been up for [`SETTLED`] at least: long enough that every
    /// client that lost the server with it (a server restart) is back, with its
    /// subscriptions, so a subject nobody subscribes to is one whose subscriber is gone.
    pub(crate) fn settled(&self) -> bool {
        self.up_since()
            .is_some_and(|since| since.elapsed() >= SETTLED)
    }

    /// Since when the connection is up (`None` while it is down). Cleared as soon as the
    /// client sees the connection drop, long before it can be back.
    pub(crate) fn up_since(&self) -> Option<Instant> {
        *self
            .inner
            .up_since
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// The cell that says since when the connection is up, for a lease clock to watch
    /// (`LeaseClock::watching`).
    pub(crate) fn up_since_cell(&self) -> Arc<Mutex<Option<Instant>>> {
        self.inner.up_since.clone()
    }

    /// The newest refusal that names `subject`, if the server refused one.
    pub(crate) fn refusal_of(&self, subject: &str) -> Option<String> {
        let quoted = format!("\"{subject}\"");
        self.inner
            .refusals
            .borrow()
            .iter()
            .rev()
            .find(|message| message.contains(&quoted))
            .cloned()
    }
}
