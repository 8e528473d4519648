//! `sb-test-worker`: a cluster worker process with scripted agents, for the cluster's tests
//! (which run workers as real processes, to kill, freeze and drain them) and for trying the
//! cluster by hand. No model key, no network beyond NATS. It is the deployable worker of
//! `switchboard_cluster::runtime` with a scripted factory: the runtime's settings (flags
//! and `SB_*` variables, `--help`), health server and drain, plus one flag of its own.
//!
//! ```text
//! sb-test-worker --nats-url nats://127.0.0.1:4222 --nats-user switchboard --name worker-1 \
//!     --capacity 10 --listen 127.0.0.1:0 [--max-tool-ms N] [any runtime setting]
//! ```
//!
//! It prints `health http://<addr>` (when it listens) and `ready <name>` once it pulls
//! sessions. On SIGTERM (or SIGINT) it drains — sessions settle, at the deadline are
//! interrupted, their last snapshots are stored and other workers resume them — prints
//! `drained <n>` and exits 0. `SB_TEST_WORKER_LOG=info` (or `warn`, `debug`) logs what
//! the worker does on stderr, each line with its name and time.
//!
//! Its agents are the scripted ones of `test_agents.rs` (`greeter`, `concierge`,
//! `receptionist`, `booker`), whose tools wait at most `--max-tool-ms`.

#[path = "test_agents.rs"]
mod test_agents;

use std::process::ExitCode;

use switchboard_cluster::runtime::{Command, RuntimeError, WorkerConfig, WorkerRuntime};
use test_agents::TestAgents;

/// Takes this program's own flag (`--max-tool-ms N`) out of the arguments; the rest are
/// the worker runtime's.
fn own_flags(args: Vec<String>) -> Result<(u64, Vec<String>), String> {
    let mut max_tool_ms = u64::MAX;
    let mut rest = Vec::new();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        if arg == "--max-tool-ms" {
            let value = args.next().ok_or("--max-tool-ms needs a value")?;
            max_tool_ms = value.parse().map_err(|e| format!("--max-tool-ms: {e}"))?;
        } else {
            rest.push(arg);
        }
    }
    Ok((max_tool_ms, rest))
}

async fn run(config: WorkerConfig, agents: TestAgents) -> Result<(), RuntimeError> {
    let mut running = WorkerRuntime::new(config).start(agents).await?;
    if let Some(addr) = running.health_address() {
        println!("health http://{addr}");
    }
    println!("ready {}", running.name());
    running.wait_for_signal().await;
    let report = running.drain().await?;
    println!("drained {}", report.sessions);
    Ok(())
}

/// Logs the worker's events at `level` and above on stderr, one line each, with the
/// worker's name and the seconds since its start: what a test turns on to see why a
/// worker did what it did.
struct StderrLog {
    name: String,
    level: tracing::Level,
    began: std::time::Instant,
}

impl tracing::Subscriber for StderrLog {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        *metadata.level() <= self.level
    }

    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        use std::io::Write as _;
        let mut line = format!(
            "[{} {:.3}s {}] ",
            self.name,
            self.began.elapsed().as_secs_f64(),
            event.metadata().level()
        );
        event.record(&mut Fields(&mut line));
        line.push('\n');
        // One write per line: the lines of several workers on one stderr stay whole.
        let _ = std::io::stderr().write_all(line.as_bytes());
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}

/// An event's fields, written `name=value` (the message first, bare).
struct Fields<'a>(&'a mut String);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write as _;
        let _ = if field.name() == "message" {
            write!(self.0, "{value:?} ")
        } else {
            write!(self.0, "{}={value:?} ", field.name())
        };
    }
}

fn main() -> ExitCode {
    let parsed = own_flags(std::env::args().skip(1).collect()).and_then(|(max_tool_ms, rest)| {
        match WorkerConfig::parse(rest, |name| std::env::var(name).ok()) {
            Ok(Command::Run(config)) => Ok((max_tool_ms, *config)),
            Ok(Command::Help) => Err(WorkerConfig::usage("sb-test-worker")),
            Err(err) => Err(err.to_string()),
        }
    });
    let (max_tool_ms, config) = match parsed {
        Ok(parsed) => parsed,
        Err(err) => {
            eprintln!("sb-test-worker: {err}");
            return ExitCode::from(2);
        }
    };
    if let Some(level) = std::env::var("SB_TEST_WORKER_LOG")
        .ok()
        .and_then(|level| level.parse::<tracing::Level>().ok())
    {
        let _ = tracing::subscriber::set_global_default(StderrLog {
            name: config.name.clone(),
            level,
            began: std::time::Instant::now(),
        });
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("sb-test-worker: cannot start a runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(config, TestAgents { max_tool_ms })) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("sb-test-worker: {err}");
            ExitCode::FAILURE
        }
    }
}
