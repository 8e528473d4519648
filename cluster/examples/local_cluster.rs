//! A whole cluster on one machine, with its faults: a local `nats-server` (provisioned from
//! the project's own files), three worker processes (this program started again with
//! `worker <name>`), and a front that drives a conversation through a gateway without
//! knowing where it runs. Each reply names the worker that served the turn.
//!
//! 1. A conversation starts; its second turn calls an async tool (a lookup that answers at
//!    once with an update and delivers its result 3 s later). Mid-call, the worker holding
//!    the session is killed with SIGKILL. Its lease (2 s) runs out, another worker claims
//!    the session from the snapshot taken after that turn, runs the lookup again
//!    (`RestorePolicy::Restart`), and its result reaches the user from there; the next
//!    turns are served there too.
//! 2. Forty more sessions talk without a pause; the worker holding the conversation is
//!    told to stop (SIGTERM): it drains — settles, snapshots, hands every session over —
//!    and the last worker resumes them all. The conversation goes on there.
//!
//! ```text
//! cargo run -p switchboard-cluster --example local_cluster
//! ```

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use switchboard::prelude::*;
use switchboard::testing::{Reply, ScriptedLlm};
use switchboard::{LlmRequest, RestorePolicy, SessionBuilder, SessionEvent};
use switchboard_cluster::local::{NatsServer, ServerAuth};
use switchboard_cluster::{
    FactoryError, Gateway, GatewayOptions, NatsConnect, RemoteEventKind, RemoteSession,
    SessionFactory, SessionSpec, Worker, WorkerOptions,
};

type AnyError = Box<dyn std::error::Error + Send + Sync>;

const LEASE: Duration = Duration::from_secs(2);

fn main() -> Result<(), AnyError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    match args.as_slice() {
        [mode, name, url, user] if mode == "worker" => {
            runtime.block_on(worker(name.clone(), url.clone(), user.clone()))
        }
        [] => runtime.block_on(front()),
        _ => Err("usage: local_cluster [worker <name> <url> <user>]".into()),
    }
}

// ---- the worker side: what each worker process runs ----

/// The arguments of the `lookup` tool.
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Lookup {
    /// What to look up.
    what: String,
}

/// The code a worker runs: one agent with an async tool, on a scripted model that signs
/// each reply with the worker's name.
struct Barista {
    worker: String,
}

impl SessionFactory for Barista {
    fn builder(&self, _spec: &SessionSpec) -> Result<SessionBuilder, FactoryError> {
        let llm = ScriptedLlm::new([]);
        let worker = self.worker.clone();
        llm.rule(move |request| Some(answer(&worker, request)));
        Ok(Session::builder().llm(llm))
    }

    fn agent(&self, name: &str, data: &Value) -> Result<Agent, FactoryError> {
        if name != "barista" {
            return Err(FactoryError::UnknownAgent {
                name: name.to_owned(),
                known: vec!["barista".to_owned()],
            });
        }
        let lookup = Tool::new(
            "lookup",
            "Looks something up (takes a while)",
            |ctx: RunContext, args: Lookup| async move {
                ctx.update(format!("looking up {}", args.what)).await?;
                tokio::time::sleep(Duration::from_secs(3)).await;
                Ok::<_, ToolFailure>(format!("{}: 7 am to 7 pm", args.what))
            },
        )
        // A lookup can simply be done again by the worker that resumes the session.
        .on_restore(RestorePolicy::Restart);
        Ok(Agent::builder("barista")
            .instructions("Take orders; look things up when asked.")
            .tool(lookup)
            .restore_data(data)
            .build()?)
    }
}

fn answer(worker: &str, request: &LlmRequest) -> Reply {
    let text = match request.chat.items().last() {
        Some(ChatItem::FunctionCallOutput(output)) => output.output.clone(),
        Some(ChatItem::Message(m)) if m.role == ChatRole::User => {
            if let Some(what) = m.content.strip_prefix("look up ") {
                return Reply::tool_call("lookup", json!({ "what": what }));
            }
            format!("you said {:?}", m.content)
        }
        _ => "anything else?".to_owned(),
    };
    Reply::text(format!("[{worker}] {text}"))
}

async fn worker(name: String, url: String, user: String) -> Result<(), AnyError> {
    let password = std::env::var("SB_NATS_PASSWORD")?;
    let client = NatsConnect::new(url)
        .user_and_password(user, password)
        .name(name.clone())
        .connect()
        .await?;
    let options = WorkerOptions::new(name.clone()).capacity(50).lease(LEASE);
    let factory = Barista {
        worker: name.clone(),
    };
    let worker = Worker::start(client, Engine::start()?, factory, options).await?;
    println!("ready");
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    terminate.recv().await;
    let report = worker.drain(Duration::from_secs(2)).await?;
    println!(
        "drained: {} sessions handed over in {:?}",
        report.moved, report.took
    );
    Ok(())
}

// ---- the front: the server, the worker processes, a gateway ----

/// A worker process and the lines it prints.
struct WorkerProcess {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl WorkerProcess {
    fn start(server: &NatsServer, name: &str) -> Result<Self, AnyError> {
        let ServerAuth::UserPassword { user, password } = server.auth() else {
            return Err("the local server has a user and password".into());
        };
        let mut child = Command::new(std::env::current_exe()?)
            .args(["worker", name, &server.url(), user])
            .env("SB_NATS_PASSWORD", password)
            .stdout(Stdio::piped())
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let process = Self { child, lines };
        match process.line(Duration::from_secs(20)) {
            Some(line) if line == "ready" => Ok(process),
            other => Err(format!("worker {name} did not start: {other:?}").into()),
        }
    }

    fn line(&self, timeout: Duration) -> Option<String> {
        self.lines.recv_timeout(timeout).ok()
    }

    fn signal(&self, signal: i32) -> Result<(), AnyError> {
        let pid = i32::try_from(self.child.id())?;
        // SAFETY: `kill` on a child this program spawned and has not reaped.
        if unsafe { libc::kill(pid, signal) } != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        Ok(())
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs a turn and prints its reply (which names the worker) and how long it took.
async fn turn(session: &RemoteSession, text: &str) -> Result<String, AnyError> {
    let began = Instant::now();
    let result = session.run(text).await?;
    let reply = result.assistant_messages().collect::<Vec<_>>().join(" ");
    println!("user> {text}\nagent> {reply}   ({:?})", began.elapsed());
    Ok(reply)
}

/// The worker a reply was signed by.
fn served_by(reply: &str) -> Option<String> {
    let name = reply.strip_prefix('[')?.split(']').next()?;
    Some(name.to_owned())
}

async fn front() -> Result<(), AnyError> {
    let server = NatsServer::start()?;
    println!("nats-server at {}", server.url());
    let mut workers = HashMap::new();
    for name in ["w1", "w2", "w3"] {
        workers.insert(name.to_owned(), WorkerProcess::start(&server, name)?);
    }
    println!("workers w1, w2, w3 ready (capacity 50 each, lease {LEASE:?})");
    let gateway = Gateway::new(
        server.connect().name("front").connect().await?,
        GatewayOptions::new(),
    );

    println!("\n-- a conversation; its worker dies mid-call --");
    let session = gateway.start_session(SessionSpec::new("barista")).await?;
    let first = turn(&session, "a tea please").await?;
    let holder = served_by(&first).ok_or("a reply names its worker")?;
    let mut events = session.subscribe();
    // The turn answers with the lookup's update; the lookup goes on (3 s), and its result
    // will come as a deferred reply.
    turn(&session, "look up the opening hours").await?;
    workers
        .get(&holder)
        .ok_or("the holder is one of ours")?
        .signal(libc::SIGKILL)?;
    let killed = Instant::now();
    println!("(SIGKILL {holder} while its lookup runs)");
    // Another worker resumes the session from the snapshot taken after that turn, with
    // the lookup running: it runs again there (`RestorePolicy::Restart`) and its result
    // reaches the user.
    let result = loop {
        let event = tokio::time::timeout(Duration::from_secs(30), events.recv()).await??;
        if let RemoteEventKind::SessionResumed { .. } = event.kind {
            println!("(resumed elsewhere {:?} after the kill)", killed.elapsed());
        }
        if let RemoteEventKind::Session {
            event:
                SessionEvent::ConversationItemAdded {
                    item: ChatItem::Message(message),
                    ..
                },
        } = event.kind
        {
            if message.role == ChatRole::Assistant && message.content.contains("7 am") {
                break message.content;
            }
        }
    };
    println!(
        "agent> {result}   (the lookup's result, {:?} after the kill)",
        killed.elapsed()
    );
    workers.remove(&holder);
    let reply = turn(&session, "and a scone").await?;
    let killed_one = holder;
    let holder = served_by(&reply).ok_or("a reply names its worker")?;
    if holder == killed_one {
        return Err(format!("{killed_one} was killed but still served the conversation").into());
    }

    println!("\n-- forty more sessions talk; {holder} drains under load --");
    let stop = Arc::new(AtomicBool::new(false));
    let turns = Arc::new(AtomicU64::new(0));
    let mut talking = tokio::task::JoinSet::new();
    for i in 0..40 {
        let (gateway, stop, turns) = (gateway.clone(), stop.clone(), turns.clone());
        talking.spawn(async move {
            let session = gateway.start_session(SessionSpec::new("barista")).await?;
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                session.run(format!("order {n} of session {i}")).await?;
                turns.fetch_add(1, Ordering::Relaxed);
                n += 1;
            }
            session.close().await?;
            Ok::<_, AnyError>(n)
        });
    }
    while turns.load(Ordering::Relaxed) < 200 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let draining = workers.remove(&holder).ok_or("the holder is one of ours")?;
    let began = Instant::now();
    draining.signal(libc::SIGTERM)?;
    println!("(SIGTERM {holder})");
    match draining.line(Duration::from_secs(30)) {
        Some(line) => println!("{holder}: {line}"),
        None => return Err(format!("{holder} did not drain").into()),
    }
    let reply = turn(&session, "the bill please").await?;
    let now = served_by(&reply).unwrap_or_default();
    println!("(served by {now} {:?} after the SIGTERM)", began.elapsed());
    if now == holder {
        return Err(format!("{holder} drained but still served the conversation").into());
    }
    stop.store(true, Ordering::SeqCst);
    let mut each = 0;
    while let Some(done) = talking.join_next().await {
        each += done??;
    }
    println!("the forty sessions made {each} turns, none failed");

    let history = session.close().await?;
    println!("\n-- the conversation, as the last worker had it --");
    println!("user said: {:#?}", history.user_messages());
    println!("agent said: {:#?}", history.assistant_messages());
    Ok(())
}
