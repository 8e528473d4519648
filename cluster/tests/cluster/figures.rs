//! The cluster's figures for BENCHMARKS.md, measured in one run against the real server
//! and worker processes (ignored by default: it takes about a minute and measures time).
//!
//! ```text
//! cargo test --release -p switchboard-cluster-tests --test cluster -- --ignored --nocapture figures
//! ```
//!
//! It prints: the NATS request-reply floor (and a request-reply to a worker process); a
//! turn through the gateway against the same turn on an engine in this process, sampled
//! in turn with the floor; a new session to its first reply; the failover time
//! from SIGKILL of the owner to the next reply (default lease); the drain time of 200 sessions;
//! and the turns a second with 1, 2 and 3 worker processes.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{within, WorkerProcess, PATIENCE};
use futures_util::StreamExt;
use switchboard::prelude::*;
use switchboard::testing::{Reply, ScriptedLlm};
use switchboard_cluster::local::NatsServer;
use switchboard_cluster::{Gateway, GatewayOptions, SessionSpec};
use tokio::task::JoinSet;

/// p50 and p99 of `samples`, in milliseconds.
fn percentiles(samples: &mut [Duration]) -> (f64, f64) {
    samples.sort_unstable();
    let at = |q: f64| {
        let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
        samples[i].as_secs_f64() * 1e3
    };
    (at(0.5), at(0.99))
}

fn print_row(what: &str, samples: &mut [Duration]) -> (f64, f64) {
    let (p50, p99) = percentiles(samples);
    println!("| {what} | {p50:.3} ms | {p99:.3} ms | {} |", samples.len());
    (p50, p99)
}

/// A responder to `bench.echo` in this process: the floor's other end.
async fn echo_responder(server: &NatsServer) -> tokio::task::JoinHandle<()> {
    let responder = common::client(server, "echo").await;
    let mut requests = responder.nats().subscribe("bench.echo").await.unwrap();
    responder.nats().flush().await.unwrap();
    tokio::spawn(async move {
        while let Some(request) = requests.next().await {
            if let Some(reply) = request.reply {
                responder
                    .nats()
                    .publish(reply, request.payload)
                    .await
                    .unwrap();
            }
        }
    })
}

/// A session on an engine in this process whose turn is the test worker's
/// (`You said: <text>`).
async fn session_in_process(engine: &Engine) -> Session {
    let llm = ScriptedLlm::new([]);
    llm.rule(|request| {
        let text = request
            .chat
            .items()
            .iter()
            .rev()
            .find_map(|item| match item {
                ChatItem::Message(m) if m.role == ChatRole::User => Some(m.content.clone()),
                _ => None,
            });
        Some(Reply::text(format!(
            "You said: {}",
            text.unwrap_or_default()
        )))
    });
    let agent = Agent::builder("greeter")
        .instructions("Greet and help.")
        .build()
        .unwrap();
    Session::builder()
        .llm(llm)
        .agent(agent)
        .start(engine)
        .await
        .unwrap()
}

/// How long `work` took.
async fn timed<T>(work: impl std::future::Future<Output = T>) -> Duration {
    let began = Instant::now();
    work.await;
    began.elapsed()
}

/// The floor, the turn in process and the turn through the gateway, sampled in turn
/// (one of each, a thousand times), so that all of them see the same machine: on this
/// VM a wake of an idle core costs tens of microseconds, and how often the cores idle
/// drifts during a run.
async fn one_turn_three_ways(server: &NatsServer, gateway: &Gateway, worker: &str) {
    let echo = echo_responder(server).await;
    let asker = common::client(server, "asker").await;
    let payload = bytes::Bytes::from(vec![b'x'; 128]);
    let engine = Engine::with_arbiters(1).unwrap();
    let local = session_in_process(&engine).await;
    let remote = gateway
        .start_session(SessionSpec::new("greeter"))
        .await
        .unwrap();
    let (mut floor, mut to_worker, mut in_process, mut through_gateway) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..1100 {
        let samples = [
            timed(asker.nats().request("bench.echo", payload.clone())).await,
            timed(gateway.worker_info(worker)).await,
            timed(local.run(format!("turn {i}"))).await,
            timed(remote.run(format!("turn {i}"))).await,
        ];
        // The first hundred warm up.
        if i >= 100 {
            floor.push(samples[0]);
            to_worker.push(samples[1]);
            in_process.push(samples[2]);
            through_gateway.push(samples[3]);
        }
    }
    echo.abort();
    local.close().await.unwrap();
    remote.close().await.unwrap();
    let (floor, _) = print_row(
        "NATS request-reply, 128 B, to a responder in this process (the floor)",
        &mut floor,
    );
    let (to_worker, _) = print_row(
        "NATS request-reply to the worker process (its info subject)",
        &mut to_worker,
    );
    let (local, _) = print_row("a turn in process (scripted model)", &mut in_process);
    let (remote, _) = print_row("the same turn through the gateway", &mut through_gateway);
    println!(
        "overhead of the gateway at p50: {:.3} ms = {:.2}x the floor, {:.2}x a request-reply to the worker process",
        remote - local,
        (remote - local) / floor,
        (remote - local) / to_worker,
    );
}

/// `start_session` and the first `run`, one after another.
async fn new_session_to_first_reply(gateway: &Gateway) {
    let mut started = Vec::new();
    let mut replied = Vec::new();
    for i in 0..200 {
        let began = Instant::now();
        let session = gateway
            .start_session(SessionSpec::new("greeter"))
            .await
            .unwrap();
        started.push(began.elapsed());
        session.run(format!("first {i}")).await.unwrap();
        replied.push(began.elapsed());
        session.close().await.unwrap();
    }
    print_row("new session: start_session answered", &mut started);
    print_row("new session: to its first reply", &mut replied);
}

/// SIGKILL of the owner, then the next input: how long until it is answered.
async fn failover(server: &NatsServer, gateway: &Gateway) {
    let mut samples = Vec::new();
    for round in 0..5 {
        // The session lands on the doomed worker (alone at its start); the standby joins,
        // then the doomed one dies.
        let mut doomed = WorkerProcess::start(server, &format!("doomed{round}"), 10, &[]);
        let session = gateway
            .start_session(SessionSpec::new("greeter"))
            .await
            .unwrap();
        session.run("before").await.unwrap();
        let _standby = WorkerProcess::start(server, "standby", 10, &[]);
        // The standby trusts a silent owner to be gone only once its own connection has
        // been up for 2 s (the cluster's rule, for server restarts).
        tokio::time::sleep(Duration::from_millis(2_100)).await;
        doomed.kill();
        let began = Instant::now();
        within("the next reply after the kill", session.run("after"))
            .await
            .unwrap();
        samples.push(began.elapsed());
        session.close().await.unwrap();
    }
    print_row(
        "failover: SIGKILL of the owner to the next reply (default 10 s lease)",
        &mut samples,
    );
}

/// 200 sessions (one turn each) on one worker; SIGTERM; until it says drained, and until
/// every session answered a turn on the other worker.
async fn drain_200(server: &NatsServer, gateway: &Gateway) {
    let mut draining = WorkerProcess::start(server, "draining", 200, &[]);
    let mut sessions = Vec::new();
    for i in 0..200 {
        let session = gateway
            .start_session(SessionSpec::new("greeter"))
            .await
            .unwrap();
        session.run(format!("hello {i}")).await.unwrap();
        sessions.push(session);
    }
    let _taker = WorkerProcess::start(server, "taker", 200, &[]);
    let began = Instant::now();
    draining.terminate();
    let line = draining.next_line(PATIENCE);
    let drained = began.elapsed();
    assert_eq!(line.as_deref(), Some("drained 200"));
    let mut turns = JoinSet::new();
    for session in sessions {
        turns.spawn(async move {
            session.run("after the drain").await?;
            session.close().await.map(|_| ())
        });
    }
    while let Some(done) = within("the turns after the drain", turns.join_next()).await {
        done.unwrap().unwrap();
    }
    println!(
        "| drain of 200 idle sessions: SIGTERM to `drained` | {:.0} ms | | 1 |",
        drained.as_secs_f64() * 1e3
    );
    println!(
        "| drain of 200 idle sessions: SIGTERM to every session answered elsewhere (and closed) | {:.0} ms | | 1 |",
        began.elapsed().as_secs_f64() * 1e3
    );
}

/// Turns a second with `workers` worker processes: 60 sessions, each running turns back
/// to back, for 3 s.
async fn throughput(server: &NatsServer, gateway: &Gateway, workers: usize) {
    let processes: Vec<_> = (0..workers)
        .map(|i| WorkerProcess::start(server, &format!("t{workers}-{i}"), 60, &[]))
        .collect();
    let mut sessions = Vec::new();
    for _ in 0..60 {
        let session = gateway
            .start_session(SessionSpec::new("greeter"))
            .await
            .unwrap();
        session.run("warm").await.unwrap();
        sessions.push(session);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let turns = Arc::new(AtomicU64::new(0));
    let mut tasks = JoinSet::new();
    for session in &sessions {
        let (session, stop, turns) = (session.clone(), stop.clone(), turns.clone());
        tasks.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                session.run("one more").await.unwrap();
                turns.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    // A moment to settle, then count for 3 s.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let from = turns.load(Ordering::Relaxed);
    let began = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let counted = turns.load(Ordering::Relaxed) - from;
    let rate = counted as f64 / began.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    while let Some(done) = within("the throughput tasks", tasks.join_next()).await {
        done.unwrap();
    }
    let mut spread = Vec::new();
    for process in &processes {
        spread.push(gateway.worker_info(&process.name).await.unwrap().live);
    }
    for session in sessions {
        session.close().await.unwrap();
    }
    println!(
        "| throughput, {workers} worker process(es), 60 sessions (live per worker {spread:?}) | {rate:.0} turns/s | | {counted} |"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measures time; run it alone, in release: see the module docs"]
async fn figures() {
    let _one_at_a_time = common::one_at_a_time().await;
    let server = NatsServer::start().unwrap();
    let gateway = common::gateway(&server, GatewayOptions::new()).await;
    println!("| what | p50 | p99 | samples |\n|---|---|---|---|");
    {
        let _worker = WorkerProcess::start(&server, "w1", 10, &[]);
        one_turn_three_ways(&server, &gateway, "w1").await;
        new_session_to_first_reply(&gateway).await;
    }
    failover(&server, &gateway).await;
    drain_200(&server, &gateway).await;
    for workers in 1..=3 {
        throughput(&server, &gateway, workers).await;
    }
}
