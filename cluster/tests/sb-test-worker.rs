//! `sb-test-worker`: a cluster worker process with scripted agents, for the cluster's tests
//! (which run workers as real processes, to kill, freeze and drain them) and for trying the
//! cluster by hand. No model key, no network beyond NATS.
//!
//! ```text
//! sb-test-worker --url nats://127.0.0.1:4222 --user switchboard --password secret \
//!     --name worker-1 --capacity 10 [--namespace sb] [--inbox-prefix _INBOX] \
//!     [--lease-secs 10] [--drain-secs 5] \
//!     [--idle-secs 600] [--no-provision] [--max-tool-ms N]
//! ```
//!
//! (`--token T`, `--nkey SEED` or `--creds FILE` instead of a user; `SB_NATS_PASSWORD`
//! instead of `--password`.) It prints `ready <name>` once it pulls sessions. On SIGTERM
//! (or SIGINT) it drains — sessions settle, at the deadline are interrupted, their last
//! snapshots are stored and other workers resume them — prints `drained <n>` and exits 0.
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
use switchboard_cluster::{
    ClusterClient, FactoryError, Namespace, NatsConnect, SessionFactory, SessionSpec, Worker,
    WorkerOptions,
};

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

/// The command line.
struct Args {
    connect: NatsConnect,
    name: String,
    capacity: usize,
    namespace: Namespace,
    lease: Duration,
    drain: Duration,
    idle: Duration,
    provision: bool,
    max_tool_ms: u64,
}

fn parse_args() -> Result<Args, String> {
    let mut url = None;
    let mut user = None;
    let mut password = std::env::var("SB_NATS_PASSWORD").ok();
    let mut token = None;
    let mut nkey = None;
    let mut creds = None;
    let mut name = None;
    let mut capacity = 10;
    let mut namespace = Namespace::default();
    let mut inbox_prefix = None;
    let mut lease = Duration::from_secs(10);
    let mut drain = Duration::from_secs(5);
    let mut idle = Duration::from_secs(600);
    let mut provision = true;
    let mut max_tool_ms = u64::MAX;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--url" => url = Some(value()?),
            "--user" => user = Some(value()?),
            "--password" => password = Some(value()?),
            "--token" => token = Some(value()?),
            "--nkey" => nkey = Some(value()?),
            "--creds" => creds = Some(value()?),
            "--name" => name = Some(value()?),
            "--capacity" => capacity = value()?.parse().map_err(|e| format!("--capacity: {e}"))?,
            "--namespace" => namespace = Namespace::new(value()?).map_err(|e| e.to_string())?,
            "--inbox-prefix" => inbox_prefix = Some(value()?),
            "--lease-secs" => {
                lease =
                    Duration::from_secs(value()?.parse().map_err(|e| format!("--lease-secs: {e}"))?)
            }
            "--drain-secs" => {
                drain = Duration::from_secs_f64(
                    value()?.parse().map_err(|e| format!("--drain-secs: {e}"))?,
                )
            }
            "--idle-secs" => {
                idle = Duration::from_secs_f64(
                    value()?.parse().map_err(|e| format!("--idle-secs: {e}"))?,
                )
            }
            "--no-provision" => provision = false,
            "--max-tool-ms" => {
                max_tool_ms = value()?
                    .parse()
                    .map_err(|e| format!("--max-tool-ms: {e}"))?
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    let url = url.ok_or("--url is required")?;
    let name = name.ok_or("--name is required")?;
    let mut connect = NatsConnect::new(url).name(name.clone());
    if let Some(prefix) = inbox_prefix {
        connect = connect.inbox_prefix(prefix);
    }
    connect = match (user, password, token, nkey, creds) {
        (Some(user), Some(password), ..) => connect.user_and_password(user, password),
        (_, _, Some(token), ..) => connect.token(token),
        (_, _, _, Some(seed), _) => connect.nkey(seed),
        (_, _, _, _, Some(file)) => connect.credentials_file(file),
        _ => connect,
    };
    Ok(Args {
        connect,
        name,
        capacity,
        namespace,
        lease,
        drain,
        idle,
        provision,
        max_tool_ms,
    })
}

async fn run(args: Args) -> Result<(), String> {
    let client: ClusterClient = args.connect.connect().await.map_err(|e| e.to_string())?;
    let engine = Engine::with_arbiters(1).map_err(|e| e.to_string())?;
    let options = WorkerOptions::new(args.name.clone())
        .capacity(args.capacity)
        .namespace(args.namespace)
        .lease(args.lease)
        .idle_timeout(Some(args.idle))
        .provision(args.provision);
    let agents = TestAgents {
        max_tool_ms: args.max_tool_ms,
    };
    let worker = Worker::start(client, engine, agents, options)
        .await
        .map_err(|e| e.to_string())?;
    println!("ready {}", args.name);
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| e.to_string())?;
    tokio::select! {
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    let report = worker.drain(args.drain).await.map_err(|e| e.to_string())?;
    println!("drained {}", report.sessions);
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
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
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("sb-test-worker: {err}");
            ExitCode::FAILURE
        }
    }
}
