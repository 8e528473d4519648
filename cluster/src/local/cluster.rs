//! `NatsCluster`: three `nats-server`s clustered on loopback ports (the type's docs).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use super::{random_secret, LocalServerError, NatsServer, ServerAuth};
use crate::connect::NatsConnect;

/// How long the servers may take to elect JetStream's leader and say they are ready.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How many times a start is tried again when a picked port was taken meanwhile.
const START_ATTEMPTS: usize = 3;

/// The cluster's name, in every server's `--cluster_name`.
const CLUSTER_NAME: &str = "switchboard-local";

/// One server's place in the cluster: its name, its cluster port, the others' ports.
#[derive(Clone, Debug)]
pub(crate) struct Member {
    name: String,
    port: u16,
    routes: Vec<u16>,
}

impl Member {
    /// The command-line flags that make a server this member (and give it a monitoring
    /// port, for its readiness).
    pub(crate) fn add_args(&self, command: &mut Command) {
        let routes: Vec<String> = self
            .routes
            .iter()
            .map(|port| format!("nats://127.0.0.1:{port}"))
            .collect();
        command
            .args(["--name", &self.name])
            .args(["--cluster", &format!("nats://127.0.0.1:{}", self.port)])
            .args(["--cluster_name", CLUSTER_NAME])
            .args(["--routes", &routes.join(",")])
            .args(["-m", "-1"]);
    }
}

/// Three `nats-server`s on loopback ports, routed to each other, with
/// JetStream clustered across them — what production runs, on one machine, for tests and
/// a laptop. Streams created with three replicas (R3) survive the loss of any one server.
///
/// Each server is a [`NatsServer`] (its own store, log and client port, the same user and
/// password on all) started with a server name (`sb-1`, `sb-2`, `sb-3`), a cluster port and
/// routes to the others' cluster ports. Those are picked before the first start (a free
/// port of the loopback, given back to the system just before the servers take them) and
/// kept across a restart, so a server started again rejoins the others.
/// [`NatsCluster::start`] returns once every server says JetStream is ready (its
/// monitoring port's `/healthz`), so streams can be created at once.
///
/// Each server is killed and its store removed when the cluster is dropped.
#[derive(Debug)]
pub struct NatsCluster {
    servers: Vec<NatsServer>,
}

impl NatsCluster {
    /// Starts three servers with JetStream clustered across them, a user and a random
    /// password on each, and waits until JetStream is ready on all of them.
    pub fn start() -> Result<Self, LocalServerError> {
        let mut last = None;
        for _ in 0..START_ATTEMPTS {
            match Self::start_once(3) {
                Ok(cluster) => return Ok(cluster),
                // A picked port taken by another process between the pick and the start.
                Err(err @ LocalServerError::Start { .. }) => last = Some(err),
                Err(err) => return Err(err),
            }
        }
        Err(last.unwrap_or(LocalServerError::NotFound { tried: Vec::new() }))
    }

    fn start_once(size: usize) -> Result<Self, LocalServerError> {
        let ports = free_ports(size)?;
        let password = random_secret();
        let mut servers = Vec::with_capacity(size);
        for (i, port) in ports.iter().enumerate() {
            let member = Member {
                name: format!("sb-{}", i + 1),
                port: *port,
                routes: ports.iter().copied().filter(|p| p != port).collect(),
            };
            servers.push(
                NatsServer::builder()
                    .user_password("switchboard", password.clone())
                    .member(member)
                    .start()?,
            );
        }
        let cluster = Self { servers };
        for server in &cluster.servers {
            wait_until_ready(server)?;
        }
        Ok(cluster)
    }

    /// Every server's client URL, comma-separated: what a client connects to, so it finds
    /// another server when one goes.
    pub fn url(&self) -> String {
        self.servers
            .iter()
            .map(NatsServer::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Who the servers let in (the same user and password on each).
    pub fn auth(&self) -> &ServerAuth {
        self.servers[0].auth()
    }

    /// Connection options for the whole cluster, with its credentials.
    pub fn connect(&self) -> NatsConnect {
        let options = NatsConnect::new(self.url());
        match self.auth() {
            ServerAuth::UserPassword { user, password } => {
                options.user_and_password(user.clone(), password.clone())
            }
            ServerAuth::Token(token) => options.token(token.clone()),
            ServerAuth::ConfigFile => options,
        }
    }

    /// The servers, `sb-1` first.
    pub fn servers(&self) -> &[NatsServer] {
        &self.servers
    }

    /// The server named `name` (`sb-2`), as JetStream names a stream's leader.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.servers
            .iter()
            .position(|s| s.member.as_ref().is_some_and(|m| m.name == name))
    }

    /// Kills server `index` with SIGKILL, as a crash would; its store stays.
    pub fn kill(&mut self, index: usize) {
        if let Some(server) = self.servers.get_mut(index) {
            server.kill();
        }
    }

    /// Starts server `index` again after [`kill`](Self::kill), on its ports with its
    /// store, and waits until it has rejoined (JetStream ready on it).
    pub fn start_again(&mut self, index: usize) -> Result<(), LocalServerError> {
        let Some(server) = self.servers.get_mut(index) else {
            return Ok(());
        };
        server.start_again()?;
        wait_until_ready(server)
    }
}

/// `count` distinct free ports of the loopback: bound all at once (so no two are the
/// same), then given back for the servers to take.
fn free_ports(count: usize) -> Result<Vec<u16>, LocalServerError> {
    let io = |source| LocalServerError::Io {
        what: "pick a free loopback port".to_owned(),
        source,
    };
    let listeners = (0..count)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(io)?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(io)
}

/// Waits until the server's `/healthz` says ok: it runs, and JetStream is current with the
/// cluster's leader. Polled: the server has no event to await from another process.
fn wait_until_ready(server: &NatsServer) -> Result<(), LocalServerError> {
    let began = Instant::now();
    let mut said = String::from("nothing");
    loop {
        if let Some(port) = server.monitoring_port() {
            match healthz(port) {
                Ok(body) if body.contains("\"ok\"") => return Ok(()),
                Ok(body) => said = body,
                Err(err) => said = err.to_string(),
            }
        }
        if began.elapsed() > READY_TIMEOUT {
            return Err(LocalServerError::Start {
                binary: server.binary.clone(),
                reason: format!(
                    "JetStream not ready after {READY_TIMEOUT:?}: /healthz said {said}"
                ),
                log: server.log(),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `GET /healthz` on the monitoring port: the body.
fn healthz(port: u16) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    Ok(response
        .split_once("\r\n\r\n")
        .map_or(response.clone(), |(_, body)| body.to_owned()))
}
