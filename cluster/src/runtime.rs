#![doc = include_str!("../docs/deploying.md")]

mod config;
mod http;
mod status;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use switchboard::{Engine, EngineError};
use tokio::task::JoinHandle;

pub use config::{Command, ConfigError, Setting, WorkerConfig, SETTINGS};

use crate::connect::{ClusterClient, ConnectError};
use crate::protocol::WorkerInfo;
use crate::spec::SessionFactory;
use crate::worker::{DrainReport, Worker, WorkerError};
use http::StatusSource;
use status::Status;

/// Why a worker process could not start or finish its drain.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// Its settings are not usable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// It could not connect to NATS.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// Its engine could not start.
    #[error("cannot start the engine: {0}")]
    Engine(#[from] EngineError),
    /// The worker could not start (the cluster's streams or bucket missing or refused) or
    /// its drain ran past its deadline.
    #[error(transparent)]
    Worker(#[from] WorkerError),
    /// The health server could not listen where it was told.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The process's signals (SIGTERM, SIGINT) could not be watched, or its tokio runtime
    /// could not start.
    #[error("{what}: {source}")]
    Process {
        /// What failed.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
}

/// A worker process to start from its settings.
#[derive(Debug)]
pub struct WorkerRuntime {
    config: WorkerConfig,
}

impl WorkerRuntime {
    /// A worker with these settings.
    pub fn new(config: WorkerConfig) -> Self {
        Self { config }
    }

    /// Its settings.
    pub fn config(&self) -> &WorkerConfig {
        &self.config
    }

    /// Connects, starts the engine, the worker and the health server, and watches SIGTERM
    /// and SIGINT (from here on they drain it rather than kill it). The worker pulls
    /// sessions once this returns.
    pub async fn start(self, factory: impl SessionFactory) -> Result<RunningWorker, RuntimeError> {
        let config = self.config;
        // First, so that a signal from here on is the drain's, not the default's death.
        let signals = Signals::watch()?;
        let client = config.connect.clone().connect().await?;
        let engine = match config.arbiters {
            Some(arbiters) => Engine::with_arbiters(arbiters)?,
            None => Engine::start()?,
        };
        let worker = start_worker(&client, &engine, factory, &config).await?;
        let source = status_source(&worker, &client, &engine);
        let health = match config.listen {
            Some(addr) => {
                let listener = http::bind(addr)
                    .await
                    .map_err(|source| RuntimeError::Listen { addr, source })?;
                let local = listener
                    .local_addr()
                    .map_err(|source| RuntimeError::Listen { addr, source })?;
                Some((local, tokio::spawn(http::serve(listener, source))))
            }
            None => None,
        };
        tracing::info!(worker = %config.name, health = ?health.as_ref().map(|(a, _)| a), "worker ready");
        Ok(RunningWorker {
            worker,
            health,
            signals,
            drain_deadline: config.drain_deadline,
            _engine: engine,
        })
    }

    /// [`start`](Self::start), then runs until SIGTERM or SIGINT, then drains: what a
    /// deployed worker does for its whole life.
    pub async fn run(self, factory: impl SessionFactory) -> Result<DrainReport, RuntimeError> {
        let mut running = self.start(factory).await?;
        running.wait_for_signal().await;
        running.drain().await
    }
}

/// A started worker process: pulling sessions, answering health checks, watching its
/// signals.
pub struct RunningWorker {
    worker: Worker,
    health: Option<(SocketAddr, JoinHandle<()>)>,
    signals: Signals,
    drain_deadline: Duration,
    /// Held for the worker's life (the worker holds a clone too).
    _engine: Engine,
}

impl std::fmt::Debug for RunningWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningWorker")
            .field("worker", &self.worker)
            .field("health", &self.health_address())
            .finish()
    }
}

impl RunningWorker {
    /// The worker's name.
    pub fn name(&self) -> &str {
        self.worker.name()
    }

    /// Where the health server answers (the port chosen when `--listen` named port 0);
    /// `None` when it is off.
    pub fn health_address(&self) -> Option<SocketAddr> {
        self.health.as_ref().map(|(addr, _)| *addr)
    }

    /// Its counts now.
    pub fn info(&self) -> WorkerInfo {
        self.worker.info()
    }

    /// Returns at the first SIGTERM or SIGINT (on other systems than Unix, Ctrl-C).
    pub async fn wait_for_signal(&mut self) {
        self.signals.next().await;
    }

    /// Drains the worker (see the [module docs](self), "Drain"): readiness turns 503 at
    /// once, the health server answers until the drain is done.
    pub async fn drain(self) -> Result<DrainReport, RuntimeError> {
        let report = self.worker.drain(self.drain_deadline).await;
        if let Some((_, server)) = &self.health {
            server.abort();
        }
        Ok(report?)
    }
}

/// Starts the worker, trying again for up to [`SETUP_PATIENCE`] while the cluster cannot
/// give it its streams and bucket: a NATS cluster electing a stream's leader (a server
/// just lost, or all starting together) answers nothing for seconds, and a worker
/// started then would otherwise exit for a wait its orchestrator would have to retry.
async fn start_worker(
    client: &ClusterClient,
    engine: &Engine,
    factory: impl SessionFactory,
    config: &WorkerConfig,
) -> Result<Worker, RuntimeError> {
    let factory = Arc::new(factory);
    let began = tokio::time::Instant::now();
    let mut pause = Duration::from_millis(100);
    loop {
        let started = Worker::start(
            client.clone(),
            engine.clone(),
            factory.clone(),
            config.worker.clone(),
        )
        .await;
        match started {
            Err(err @ WorkerError::Setup { .. }) if began.elapsed() < SETUP_PATIENCE => {
                tracing::warn!(worker = %config.name, error = %err, "the cluster is not ready; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
            started => return Ok(started?),
        }
    }
}

/// How long a starting worker waits for the cluster's streams and bucket.
const SETUP_PATIENCE: Duration = Duration::from_secs(30);

/// The status the health server reads at each request. It holds a reader of the worker's
/// counts, not the worker, so it answers during the drain (which takes the worker).
fn status_source(worker: &Worker, client: &ClusterClient, engine: &Engine) -> StatusSource {
    let counts = worker.counts_reader();
    let client = client.clone();
    let engine = engine.clone();
    Arc::new(move || Status {
        info: counts.info(),
        connected: client.nats().connection_state() == async_nats::connection::State::Connected,
        connections: *client.connections().borrow(),
        engine: engine.stats(),
    })
}

/// SIGTERM and SIGINT, watched from the worker's start.
struct Signals {
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
}

impl Signals {
    fn watch() -> Result<Self, RuntimeError> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let watch = |kind| {
                signal(kind).map_err(|source| RuntimeError::Process {
                    what: "cannot watch the process's signals",
                    source,
                })
            };
            Ok(Self {
                terminate: watch(SignalKind::terminate())?,
                interrupt: watch(SignalKind::interrupt())?,
            })
        }
        #[cfg(not(unix))]
        {
            Ok(Self {})
        }
    }

    async fn next(&mut self) {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.terminate.recv() => tracing::info!("SIGTERM: draining"),
                _ = self.interrupt.recv() => tracing::info!("SIGINT: draining"),
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// The whole life of a deployed worker, for a program's `main`: reads the settings
/// ([`WorkerConfig::from_env`]; `--help` prints them), starts a tokio runtime, runs the
/// worker with `factory` until SIGTERM or SIGINT, drains it, and returns the exit code:
/// 0 after a drain, 1 when it could not start or the drain ran out of time, 2 for settings
/// that are not usable. It says what it does on standard error, one line each.
pub fn run(factory: impl SessionFactory) -> ExitCode {
    let program = std::env::args()
        .next()
        .and_then(|p| {
            std::path::Path::new(&p)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "worker".to_owned());
    let config = match WorkerConfig::from_env() {
        Ok(Command::Run(config)) => *config,
        Ok(Command::Help) => {
            print!("{}", WorkerConfig::usage(&program));
            return ExitCode::SUCCESS;
        }
        Err(err) => {
            eprintln!("{program}: {err}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("{program}: cannot start a tokio runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(async {
        let name = config.name.clone();
        let capacity = config.worker.capacity;
        let mut running = WorkerRuntime::new(config).start(factory).await?;
        let health = match running.health_address() {
            Some(addr) => format!("; health and metrics on http://{addr}"),
            None => String::new(),
        };
        eprintln!("{program}: worker {name} ready (capacity {capacity}){health}");
        running.wait_for_signal().await;
        eprintln!("{program}: draining");
        running.drain().await
    });
    match outcome {
        Ok(report) => {
            eprintln!(
                "{program}: drained {} sessions ({} handed over) in {:?}",
                report.sessions, report.moved, report.took
            );
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("{program}: {err}");
            ExitCode::FAILURE
        }
    }
}
