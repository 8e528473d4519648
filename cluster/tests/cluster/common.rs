//! Helpers shared by the cluster's tests: one test at a time, worker processes (the
//! crate's `sb-test-worker` binary) to start, freeze, thaw, drain and kill, and bounded
//! waits that fail saying what they waited for.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use switchboard_cluster::local::{NatsServer, ServerAuth};
use switchboard_cluster::{
    ClusterClient, Gateway, GatewayOptions, GatewayStats, RemoteEvent, RemoteEventKind,
    RemoteEvents,
};
use tokio::sync::watch;

/// How long any single wait of a test may take before it fails.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// Held for the whole of a test, so the tests of this binary run one at a time: each
/// starts its own server and worker processes, and some measure time (a 1 s lease, a
/// 0.3 s idle timeout) that a thousand sessions of another test on the same two cores
/// would stretch.
/// (tokio's lock: it is held across awaits, and each test has its own runtime; it does not
/// poison, so a failed test does not fail the next ones.)
pub async fn one_at_a_time() -> tokio::sync::MutexGuard<'static, ()> {
    static ONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    ONE.lock().await
}

/// A worker process.
pub struct WorkerProcess {
    pub name: String,
    /// Where its health server answers (`http://127.0.0.1:<port>`), once it said so.
    pub health: Option<String>,
    child: Child,
    lines: mpsc::Receiver<String>,
}

/// The credentials flags for a server's default auth.
pub fn credentials(server: &NatsServer) -> Vec<String> {
    credentials_for(server.auth())
}

/// The credentials flags for `auth`.
pub fn credentials_for(auth: &ServerAuth) -> Vec<String> {
    match auth {
        ServerAuth::UserPassword { user, password } => vec![
            "--nats-user".into(),
            user.clone(),
            "--nats-password".into(),
            password.clone(),
        ],
        ServerAuth::Token(token) => vec!["--nats-token".into(), token.clone()],
        _ => Vec::new(),
    }
}

impl WorkerProcess {
    /// Starts `sb-test-worker` against `server` with its credentials; waits for `ready`.
    pub fn start(server: &NatsServer, name: &str, capacity: usize, extra: &[&str]) -> Self {
        let mut args = credentials(server);
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        Self::start_with(&server.url(), name, capacity, &args)
    }

    /// Starts `sb-test-worker` with these connection arguments; waits for `ready`.
    pub fn start_with(url: &str, name: &str, capacity: usize, args: &[String]) -> Self {
        let mut process = Self::spawn(url, name, capacity, args);
        loop {
            match process.next_line(PATIENCE) {
                Some(line) if line == format!("ready {name}") => return process,
                Some(line) if line.starts_with("health ") => {
                    process.health = Some(line["health ".len()..].to_owned());
                }
                other => {
                    let status = process.wait_exit(Duration::from_secs(5));
                    panic!("worker {name} did not get ready: said {other:?}, exit {status:?}")
                }
            }
        }
    }

    /// Starts `sb-test-worker` without waiting for it.
    pub fn spawn(url: &str, name: &str, capacity: usize, args: &[String]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_sb-test-worker"))
            .args([
                "--nats-url",
                url,
                "--name",
                name,
                "--capacity",
                &capacity.to_string(),
                // One engine thread, a 5 s drain and a health server on a free port,
                // unless a test says otherwise (a later flag wins).
                "--arbiters",
                "1",
                "--drain-secs",
                "5",
                "--listen",
                "127.0.0.1:0",
            ])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the sb-test-worker binary runs");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            name: name.to_owned(),
            health: None,
            child,
            lines,
        }
    }

    /// The next line it printed, within `timeout`.
    pub fn next_line(&mut self, timeout: Duration) -> Option<String> {
        self.lines.recv_timeout(timeout).ok()
    }

    /// The lines it printed since the last read, without waiting.
    pub fn lines_so_far(&mut self) -> Vec<String> {
        self.lines.try_iter().collect()
    }

    /// Fails if it printed that a model request broke the one-output rule.
    pub fn assert_one_output_held(&mut self) {
        let broken: Vec<String> = self
            .lines_so_far()
            .into_iter()
            .filter(|line| line.starts_with("one-output broken"))
            .collect();
        assert!(
            broken.is_empty(),
            "worker {} saw requests that break the one-output rule: {broken:?}",
            self.name
        );
    }

    /// SIGKILL: the process dies at once, as a crashed machine would. Returns once it is
    /// dead.
    pub fn kill(&mut self) {
        self.signal(libc::SIGKILL);
        let _ = self.child.wait();
    }

    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).expect("a pid fits in i32")
    }

    fn signal(&self, signal: i32) {
        // SAFETY: `kill` with a pid this test spawned and still holds (not yet reaped).
        let rc = unsafe { libc::kill(self.pid(), signal) };
        assert_eq!(rc, 0, "kill({}, {signal}) failed", self.pid());
    }

    /// SIGSTOP: the process stops, as a paused VM or a long GC would. Returns once it has
    /// stopped (a signal is delivered asynchronously: without the wait, the worker could
    /// still answer what the test sends next).
    pub fn freeze(&self) {
        self.signal(libc::SIGSTOP);
        let mut status = 0;
        // SAFETY: waits on our own child; WUNTRACED reports the stop without reaping it.
        let waited = unsafe { libc::waitpid(self.pid(), &mut status, libc::WUNTRACED) };
        assert!(
            waited == self.pid() && libc::WIFSTOPPED(status),
            "worker {} did not stop (waitpid {waited}, status {status:#x})",
            self.name
        );
    }

    /// SIGCONT.
    pub fn thaw(&self) {
        self.signal(libc::SIGCONT);
    }

    /// SIGTERM: the worker drains and exits.
    pub fn terminate(&self) {
        self.signal(libc::SIGTERM);
    }

    /// Waits for the process to exit, at most `timeout` (polled: a child's exit has no
    /// awaitable signal in std); `None` if it did not.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let began = std::time::Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if began.elapsed() > timeout {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        // SIGKILL ends a frozen process too.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A client of `server` with its default credentials.
pub async fn client(server: &NatsServer, name: &str) -> ClusterClient {
    server
        .connect()
        .name(name)
        .connect()
        .await
        .expect("the test connects to its server")
}

/// A gateway on `server`.
pub async fn gateway(server: &NatsServer, options: GatewayOptions) -> Gateway {
    Gateway::new(client(server, "test-gateway").await, options)
}

/// The next event, within `PATIENCE`, failing with what was awaited.
pub async fn next_event(events: &mut RemoteEvents, waiting_for: &str) -> RemoteEvent {
    match tokio::time::timeout(PATIENCE, events.recv()).await {
        Ok(Ok(event)) => event,
        Ok(Err(err)) => panic!("waiting for {waiting_for}: {err}"),
        Err(_) => panic!("waiting for {waiting_for}: nothing within {PATIENCE:?}"),
    }
}

/// Reads events until one matches, within `PATIENCE`; returns it and those before it.
pub async fn event_where(
    events: &mut RemoteEvents,
    waiting_for: &str,
    mut matches: impl FnMut(&RemoteEventKind) -> bool,
) -> (RemoteEvent, Vec<RemoteEvent>) {
    let mut before = Vec::new();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let event = match tokio::time::timeout_at(deadline, events.recv()).await {
            Ok(Ok(event)) => event,
            Ok(Err(err)) => panic!("waiting for {waiting_for}: {err}; saw {before:#?}"),
            Err(_) => panic!("waiting for {waiting_for}: not within {PATIENCE:?}; saw {before:#?}"),
        };
        if matches(&event.kind) {
            return (event, before);
        }
        before.push(event);
    }
}

/// An owner record as the owners bucket stores it: JSON, one key per session (the
/// workers' own type is private; this is the stored form docs/wire-protocol.md gives).
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
pub struct OwnerRecord {
    pub worker: String,
    /// The incarnation of the worker's lease the session runs under.
    pub lease: u64,
    pub epoch: u64,
    pub state: OwnerState,
}

/// An owner record's `state`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OwnerState {
    Running,
    Ended,
    Moving,
}

/// The owner record of `session` now.
pub async fn owner_of(
    client: &ClusterClient,
    session: &switchboard_cluster::SessionKey,
) -> Option<OwnerRecord> {
    let owners = async_nats::jetstream::new(client.nats().clone())
        .get_key_value(switchboard_cluster::Namespace::default().owners_bucket())
        .await
        .expect("the owners bucket exists");
    let value = owners
        .get(session.as_str())
        .await
        .expect("the bucket answers")?;
    Some(serde_json::from_slice(&value).expect("an owner record"))
}

/// What the lease key of `session`'s owner holds now (its JSON, or what stands there),
/// and whether it is the incarnation the session's record names.
pub async fn lease_of_owner(
    client: &ClusterClient,
    session: &switchboard_cluster::SessionKey,
) -> String {
    let Some(owner) = owner_of(client, session).await else {
        return "no owner record".into();
    };
    let owners = async_nats::jetstream::new(client.nats().clone())
        .get_key_value(switchboard_cluster::Namespace::default().owners_bucket())
        .await
        .expect("the owners bucket exists");
    match owners.entry(format!("lease.{}", owner.worker)).await {
        Ok(Some(entry)) => format!(
            "{:?} rev {} {} (the record names incarnation {})",
            entry.operation,
            entry.revision,
            String::from_utf8_lossy(&entry.value),
            owner.lease
        ),
        Ok(None) => "no lease key".into(),
        Err(err) => format!("unreadable: {err}"),
    }
}

/// One message of a session's subject in the snapshots stream, as its headers
/// (`Sb-Kind`, `Sb-Epoch`, `Sb-Worker`) describe it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotRecord {
    pub kind: String,
    pub epoch: u64,
    pub worker: String,
}

/// The messages of `session`'s subject in the snapshots stream of `namespace`, oldest
/// first.
pub async fn snapshot_records(
    client: &ClusterClient,
    namespace: &switchboard_cluster::Namespace,
    session: &switchboard_cluster::SessionKey,
) -> Vec<SnapshotRecord> {
    let stream = async_nats::jetstream::new(client.nats().clone())
        .get_stream(namespace.snapshots_stream())
        .await
        .expect("the snapshots stream exists");
    let subject = namespace.snapshot_subject(session);
    let mut records = Vec::new();
    let mut at = 1;
    loop {
        match stream
            .direct_get_next_for_subject(subject.clone(), Some(at))
            .await
        {
            Ok(message) => {
                at = message.sequence + 1;
                let header = |name: &str| {
                    message
                        .headers
                        .get(name)
                        .map(|v| v.as_str().to_owned())
                        .unwrap_or_else(|| panic!("message {} has no {name}", message.sequence))
                };
                records.push(SnapshotRecord {
                    kind: header("Sb-Kind"),
                    epoch: header("Sb-Epoch").parse().expect("an epoch"),
                    worker: header("Sb-Worker"),
                });
            }
            Err(err)
                if err.kind() == async_nats::jetstream::stream::DirectGetErrorKind::NotFound =>
            {
                return records
            }
            Err(err) => panic!("cannot read {subject}: {err}"),
        }
    }
}

/// Awaits `future` within `PATIENCE`, failing with what was awaited.
pub async fn within<T>(waiting_for: &str, future: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(PATIENCE, future).await {
        Ok(value) => value,
        Err(_) => panic!("waiting for {waiting_for}: not within {PATIENCE:?}"),
    }
}

/// Waits until the gateway has sent some attempt again at least `retries` times in all.
pub async fn retried(stats: &mut watch::Receiver<GatewayStats>, retries: u64) {
    within(
        &format!("the gateway to retry {retries} times"),
        stats.wait_for(|s| s.retries >= retries),
    )
    .await
    .unwrap();
}

/// `GET path` from a worker's health server (`http://host:port`): the status code and the
/// body. A plain HTTP/1.1 request on a fresh connection, as a probe or a scraper sends it.
pub async fn http_get(base: &str, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = base.strip_prefix("http://").expect("an http:// address");
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream
            .write_all(
                format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            )
            .await?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await?;
        Ok::<_, std::io::Error>(response)
    };
    let response = within(&format!("GET {path}"), exchange)
        .await
        .unwrap_or_else(|err| panic!("GET {base}{path}: {err}"));
    let (head, body) = response
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"));
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status code in {head:?}"));
    (code, body.to_owned())
}

/// The value of the series `name` (labelled with the worker) in a Prometheus text body.
pub fn metric(body: &str, name: &str) -> f64 {
    body.lines()
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            (series.split('{').next() == Some(name)).then(|| value.parse().ok())?
        })
        .unwrap_or_else(|| panic!("no {name} in\n{body}"))
}
