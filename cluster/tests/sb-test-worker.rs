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
//! `drained <n>` and exits 0.
//!
//! Its agents, `greeter` and `concierge`, run on a scripted model that answers
//! `look up X` by calling the async tool `lookup` (which sends an update, waits `tool_ms`
//! of the session data, default 20, at most `--max-tool-ms`, and finds X; restarted on a
//! restore), `wait for X` by
//! calling the tool `wait` (which waits `tool_ms` before it returns, the turn waiting on
//! it), `stall` with a reply that never ends (until interrupted), and anything else with
//! `You said: <text>` (`Concierge: <text>` for the concierge). Every request the model
//! gets is checked against the one-output rule (every tool call has exactly one output,
//! after it); a request that breaks it prints `one-output broken: <why>` on stdout.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use switchboard::prelude::*;
use switchboard::testing::{Reply, ScriptedLlm};
use switchboard::{LlmRequest, RestorePolicy, SessionBuilder};
use switchboard_cluster::runtime::{Command, RuntimeError, WorkerConfig, WorkerRuntime};
use switchboard_cluster::{FactoryError, SessionFactory, SessionSpec};

/// The arguments of the `lookup` tool.
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Lookup {
    /// What to look up.
    what: String,
}

/// Builds the scripted agents; see the module docs.
struct TestAgents {
    /// The longest its tools wait, whatever a session's data says (`--max-tool-ms`): a
    /// test gives a doomed worker long tools and the ones that take over short ones.
    max_tool_ms: u64,
}

impl TestAgents {
    const KNOWN: [&'static str; 2] = ["greeter", "concierge"];
}

impl SessionFactory for TestAgents {
    fn builder(&self, _spec: &SessionSpec) -> Result<SessionBuilder, FactoryError> {
        Ok(Session::builder()
            .llm(scripted_model())
            // A test's barge-in is real at once; a false one resumes quickly.
            .min_interruption_duration(Duration::ZERO)
            .grace_period(Duration::from_millis(200)))
    }

    fn agent(&self, name: &str, data: &Value) -> Result<Agent, FactoryError> {
        let tool_ms = data
            .get("tool_ms")
            .and_then(Value::as_u64)
            .unwrap_or(20)
            .min(self.max_tool_ms);
        let lookup = Tool::new(
            "lookup",
            "Looks something up",
            move |ctx: RunContext, args: Lookup| async move {
                ctx.update(format!("looking up {}", args.what)).await?;
                // The lookup's own work, simulated.
                tokio::time::sleep(Duration::from_millis(tool_ms)).await;
                Ok::<_, ToolFailure>(format!("found {}", args.what))
            },
        )
        // Its work is a lookup: done again on the worker that resumes the session.
        .on_restore(RestorePolicy::Restart);
        let wait = Tool::new(
            "wait",
            "Waits for something",
            move |_ctx: RunContext, args: Lookup| async move {
                tokio::time::sleep(Duration::from_millis(tool_ms)).await;
                Ok::<_, ToolFailure>(format!("waited for {}", args.what))
            },
        );
        let instructions = match name {
            "greeter" => "Greet and help.",
            "concierge" => "You are the concierge.",
            _ => {
                return Err(FactoryError::UnknownAgent {
                    name: name.to_owned(),
                    known: Self::KNOWN.iter().map(|s| (*s).to_owned()).collect(),
                })
            }
        };
        Ok(Agent::builder(name)
            .instructions(instructions)
            .tool(lookup)
            .tool(wait)
            // Built again from the same data when a session is restored elsewhere.
            .restore_data(data)
            .build()?)
    }
}

/// One model per session: answers from the request alone, so any number of turns work.
fn scripted_model() -> Arc<ScriptedLlm> {
    let llm = ScriptedLlm::new([]);
    llm.rule(answer);
    llm
}

fn answer(request: &LlmRequest) -> Option<Reply> {
    if let Err(why) = request.chat.check_invariant() {
        println!("one-output broken: {why}");
        return Some(Reply::text(format!("one-output broken: {why}")));
    }
    let items = request.chat.items();
    let last_user = items.iter().rev().find_map(|item| match item {
        ChatItem::Message(m) if m.role == ChatRole::User => Some(m.content.clone()),
        _ => None,
    });
    match items.last() {
        // After the tool: its output (an update, then the deferred `/finished`).
        Some(ChatItem::FunctionCallOutput(output)) => {
            Some(Reply::text(format!("Lookup says: {}", output.output)))
        }
        Some(ChatItem::Message(m)) if m.role == ChatRole::User => {
            let text = m.content.as_str();
            if let Some(what) = text.strip_prefix("look up ") {
                Some(Reply::tool_call("lookup", json!({ "what": what })))
            } else if let Some(what) = text.strip_prefix("wait for ") {
                Some(Reply::tool_call("wait", json!({ "what": what })))
            } else if text.starts_with("stall") {
                Some(Reply::text("Let me think").and_stall())
            } else if request.agent.as_ref() == "concierge" {
                Some(Reply::text(format!("Concierge: {text}")))
            } else {
                Some(Reply::text(format!("You said: {text}")))
            }
        }
        _ => Some(Reply::text(match last_user {
            Some(text) => format!("About {text}: anything else?"),
            None => "Hello!".to_owned(),
        })),
    }
}

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
