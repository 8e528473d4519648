//! Issue 12, soak: N sessions × M turns per round, with async tools, a handoff every few
//! turns, barge-ins, and a share of sessions abandoned without `close()`; several rounds.
//! After every round no actor of any session is alive and the process's RSS stays within
//! 10% of what it was after the first round.
//!
//! CI runs a small size. The full size (figures in `RELIABILITY.md`):
//!
//! ```sh
//! SOAK_SESSIONS=10000 SOAK_TURNS=20 cargo test --release --test soak -- --nocapture
//! ```
//!
//! `SOAK_ROUNDS` (default 3) and `SOAK_BATCH` (sessions running at once, default 100) set
//! the rest. Sessions run on the test's arbiter under paused time: a tool's background
//! work waits on a gate the driver opens, the model's stall on a barge-in, nothing on a
//! clock.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{stream, StreamExt};
use serde_json::json;
use switchboard::prelude::*;
use switchboard::{LlmChunk, LlmError, LlmRequest, LlmStream, NoArgs, ToolCallChunk, ToolChoice};
use tokio::sync::Notify;

const BOUND: Duration = Duration::from_secs(60);

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What the model does on turn `k` of a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Text,
    /// Calls the async tool: it updates at once and finishes when the driver opens its
    /// gate; the result gets a deferred reply.
    AsyncTool,
    /// Calls `transfer`: a handoff to the other agent.
    Handoff,
    /// Starts to speak, then stalls: the user barges in with a final transcript.
    BargeIn,
}

fn kind(turn: usize) -> Kind {
    match turn {
        t if t % 5 == 4 => Kind::Handoff,
        t if t % 7 == 3 => Kind::BargeIn,
        t if t % 3 == 1 => Kind::AsyncTool,
        _ => Kind::Text,
    }
}

/// One model for every session: answers by the newest user message (`t{k}`).
#[derive(Default)]
struct SoakLlm {
    requests: AtomicU64,
    ids: AtomicU64,
}

impl SoakLlm {
    fn call(&self, name: &str) -> Result<LlmChunk, LlmError> {
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        Ok(LlmChunk::ToolCall(ToolCallChunk {
            call_id: format!("call_{id}"),
            name: name.to_owned(),
            arguments: json!({}).to_string(),
        }))
    }
}

impl Llm for SoakLlm {
    fn chat(&self, request: LlmRequest) -> LlmStream {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let text = |t: &str| stream::iter([Ok(LlmChunk::Text(t.to_owned()))]).boxed();
        let items = request.chat.items();
        let last_is_user =
            matches!(items.last(), Some(ChatItem::Message(m)) if m.role == ChatRole::User);
        if request.tool_choice == ToolChoice::None || !last_is_user {
            return text("Here is what I found.");
        }
        let Some(turn) = items
            .last()
            .and_then(ChatItem::text)
            .and_then(|t| t.strip_prefix('t'))
            .and_then(|k| k.parse::<usize>().ok())
        else {
            return text("Sure.");
        };
        match kind(turn) {
            Kind::Text => text("Noted."),
            Kind::AsyncTool => stream::iter([self.call("lookup")]).boxed(),
            Kind::Handoff => stream::iter([self.call("transfer")]).boxed(),
            Kind::BargeIn => stream::iter([Ok(LlmChunk::Text("Let me think about".into()))])
                .chain(stream::pending())
                .boxed(),
        }
    }
}

fn agent(name: &str, other: &'static str, gate: Arc<Notify>) -> Agent {
    let lookup = Tool::new(
        "lookup",
        "Looks something up",
        move |ctx: RunContext, _: NoArgs| {
            let gate = gate.clone();
            async move {
                ctx.update("looking").await?;
                gate.notified().await;
                Ok::<_, ToolFailure>("found it")
            }
        },
    )
    .on_duplicate(DuplicatePolicy::Allow);
    let transfer = Tool::new(
        "transfer",
        "Transfers",
        move |_ctx: RunContext, _: NoArgs| async move {
            // The other agent, without tools: the next handoff comes back through the host.
            Ok::<_, ToolFailure>(Handoff::to(Agent::builder(other).build().unwrap()))
        },
    );
    Agent::builder(name)
        .tool(lookup)
        .tool(transfer)
        .build()
        .unwrap()
}

struct Outcome {
    inspector: Inspector,
}

/// One session's life: `turns` turns, then `close()` or (abandoned) a drop.
async fn one_session(
    engine: &Engine,
    llm: Arc<SoakLlm>,
    turns: usize,
    abandon: bool,
) -> Result<Outcome, String> {
    let gate = Arc::new(Notify::new());
    let session = Session::builder()
        .llm(llm)
        .agent(agent("front", "back", gate.clone()))
        .inspect(true)
        .journal_capacity(4)
        .event_capacity(64)
        .grace_period(Duration::from_millis(100))
        .start(engine)
        .await
        .map_err(|e| e.to_string())?;
    let inspector = session.inspector().ok_or("no inspector")?;
    for turn in 0..turns {
        let text = format!("t{turn}");
        match kind(turn) {
            Kind::BargeIn => {
                // Background results have been answered first, so the next speech is
                // this turn's.
                tokio::time::timeout(BOUND, session.wait_for_settled())
                    .await
                    .map_err(|_| format!("turn {turn}: the session did not settle"))?
                    .map_err(|e| format!("turn {turn}: wait_for_settled: {e}"))?;
                let mut events = session.subscribe();
                let s = session.clone();
                let running = actix::spawn(async move { s.run(text).await });
                let speech = tokio::time::timeout(BOUND, async {
                    loop {
                        match events.recv().await {
                            Ok(SessionEvent::SpeechCreated { .. }) => return Ok(()),
                            Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                            Err(e) => return Err(e.to_string()),
                        }
                    }
                })
                .await;
                if !matches!(speech, Ok(Ok(()))) {
                    return Err(format!("turn {turn}: no speech started"));
                }
                session.user_started_speaking();
                session.transcript("actually, no", true);
                session.user_stopped_speaking();
                let interrupted = tokio::time::timeout(BOUND, running)
                    .await
                    .map_err(|_| format!("turn {turn}: the barged-in turn did not end"))?
                    .map_err(|e| e.to_string())?
                    .map_err(|e| format!("turn {turn}: {e}"))?;
                if !interrupted.interrupted {
                    return Err(format!("turn {turn}: the barge-in did not interrupt"));
                }
            }
            kind => {
                tokio::time::timeout(BOUND, session.run(text))
                    .await
                    .map_err(|_| format!("turn {turn} did not answer"))?
                    .map_err(|e| format!("turn {turn}: {e}"))?;
                if kind == Kind::AsyncTool {
                    gate.notify_one();
                }
                if kind == Kind::Handoff && turn % 2 == 0 {
                    // Every other handoff goes back through the host.
                    tokio::time::timeout(
                        BOUND,
                        session.update_agent(agent("front", "back", gate.clone())),
                    )
                    .await
                    .map_err(|_| format!("turn {turn}: update_agent did not answer"))?
                    .map_err(|e| format!("turn {turn}: {e}"))?;
                }
            }
        }
    }
    if abandon {
        // A tool still runs: the host walks away without close().
        drop(session);
    } else {
        tokio::time::timeout(BOUND, session.wait_for_inactive())
            .await
            .map_err(|_| "the session did not become inactive".to_owned())?;
        let history = tokio::time::timeout(BOUND, session.close())
            .await
            .map_err(|_| "close() did not answer".to_owned())?
            .map_err(|e| e.to_string())?;
        for agent in &history.agents {
            agent
                .chat
                .check_invariant()
                .map_err(|breach| format!("{}: {breach}", agent.activity))?;
        }
    }
    Ok(Outcome { inspector })
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kib| kib.parse().ok())
        })
        .unwrap_or(0)
}

#[test]
fn sessions_by_the_thousand_leave_no_actor_and_no_memory_behind() {
    let sessions = env("SOAK_SESSIONS", 300);
    let turns = env("SOAK_TURNS", 8);
    let rounds = env("SOAK_ROUNDS", 3);
    let batch = env("SOAK_BATCH", 100).max(1);
    let mut first_rss = None;
    actix::System::new().block_on(async {
        tokio::time::pause();
        let engine = Engine::current().unwrap();
        let llm = Arc::new(SoakLlm::default());
        for round in 1..=rounds {
            let started = Instant::now();
            let requests_before = llm.requests.load(Ordering::Relaxed);
            let mut done = 0;
            let mut abandoned = 0;
            while done < sessions {
                let size = batch.min(sessions - done);
                let runs = (done..done + size).map(|index| {
                    let abandon = index % 5 == 0;
                    one_session(&engine, llm.clone(), turns, abandon)
                });
                let outcomes = futures_util::future::join_all(runs).await;
                let mut inspectors = Vec::with_capacity(size);
                for (offset, outcome) in outcomes.into_iter().enumerate() {
                    match outcome {
                        Ok(outcome) => inspectors.push(outcome.inspector),
                        Err(e) => panic!("round {round}, session {}: {e}", done + offset),
                    }
                }
                for inspector in &inspectors {
                    if let Err(e) = inspector.wait_until_all_stopped(BOUND).await {
                        panic!("round {round}: an actor outlived its session: {e}");
                    }
                }
                abandoned += (done..done + size).filter(|i| i % 5 == 0).count();
                done += size;
            }
            let rss = rss_kib();
            let requests = llm.requests.load(Ordering::Relaxed) - requests_before;
            println!(
                "round {round}: {sessions} sessions ({abandoned} abandoned) x {turns} turns, \
                 {requests} LLM requests, {:.2} s wall, live actors 0, RSS {:.1} MiB",
                started.elapsed().as_secs_f64(),
                rss as f64 / 1024.0
            );
            match first_rss {
                None => first_rss = Some(rss),
                Some(first) => assert!(
                    rss as f64 <= first as f64 * 1.10,
                    "round {round}: RSS {rss} KiB grew more than 10% over round 1's {first} KiB"
                ),
            }
        }
    });
}
