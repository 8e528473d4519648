//! Issue 39, SPEC §19 "Cost" and "Latency across handoffs": the usage ledger counts every
//! request by agent and model (cached and audio tokens apart) across a handoff and a
//! sub-task, its sums by agent and by model equal the session's total and the turns'
//! results; a price table prices it; the ledger and the agents' latency survive a snapshot
//! (full and delta, through bytes) and a restore, and go on counting; after a handoff the
//! next turn's end-to-end latency (from the end of the user's speech) and time to first
//! token are the new agent's.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{spawn_turn, wait_event, wait_started};
use serde_json::json;
use switchboard::futures::StreamExt as _;
use switchboard::prelude::*;
use switchboard::snapshot::{AgentRegistry, SessionSnapshot, SnapshotUpdate};
use switchboard::testing::{Reply, ScriptedLlm};
use switchboard::{
    Endpointing, Llm, LlmChunk, LlmRequest, LlmStream, LlmUsage, ModelPrice, NoArgs, PriceTable,
    ToolCallChunk, TurnHandling, TurnMetrics, Usage,
};
use tokio::time::sleep;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn usage(prompt: u32, completion: u32) -> LlmUsage {
    LlmUsage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        ..LlmUsage::default()
    }
}

#[derive(Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
struct Id {
    id: String,
}

/// Reception hands off to billing; billing checks the caller's id in a sub-task.
fn agents(fast: Arc<ScriptedLlm>, smart: Arc<ScriptedLlm>) -> Agent {
    let save = Tool::new(
        "save_id",
        "Saves the id",
        |_ctx: RunContext, id: Id| async move { ToolReturn::complete_task(&id) },
    );
    let verify = Agent::builder("verify")
        .llm(fast.clone())
        .tool(save)
        .build()
        .unwrap();
    let ask_id = Tool::new(
        "ask_id",
        "Checks the caller",
        move |ctx: RunContext, _: NoArgs| {
            let verify = verify.clone();
            async move {
                let id: Id = ctx.run_task(verify).await?;
                Ok::<_, ToolFailure>(format!("verified {}", id.id))
            }
        },
    );
    let billing = Agent::builder("billing")
        .llm(smart)
        .tool(ask_id)
        .build()
        .unwrap();
    Agent::builder("reception")
        .llm(fast)
        .tool(common::transfer_to(billing))
        .build()
        .unwrap()
}

#[actix::test]
async fn usage_per_agent_across_a_handoff_and_a_sub_task_sums_to_the_sessions() {
    tokio::time::pause();
    let fast = ScriptedLlm::named(
        "fast",
        [
            // reception
            Reply::tool_call("transfer", json!({})).and_usage(LlmUsage {
                cached_prompt_tokens: Some(40),
                ..usage(100, 10)
            }),
            // verify
            Reply::tool_call("save_id", json!({"id": "42"})).and_usage(LlmUsage {
                audio_prompt_tokens: Some(20),
                ..usage(50, 5)
            }),
        ],
    );
    let smart = ScriptedLlm::named(
        "smart",
        [
            Reply::tool_call("ask_id", json!({})).and_usage(usage(200, 20)),
            Reply::text("Your refund is on its way.").and_usage(usage(220, 30)),
        ],
    );
    let session = Session::builder()
        .agent(agents(fast, smart))
        .inspect(true)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let handed = session.run("a refund, please").await.unwrap();
    assert_eq!(handed.handoff(), Some("billing"));
    let billing_turn = spawn_turn(&session, "order 7");
    wait_started(&session.inspector().unwrap(), "activity/s1/verify#1").await;
    let verify_turn = session.run("my id is 42").await.unwrap();
    let billing_turn = billing_turn.await.unwrap().unwrap();

    let ledger = session.usage();
    let by_agent = ledger.by_agent();
    assert_eq!(by_agent.len(), 3);
    assert_eq!(
        by_agent["reception"],
        Usage {
            requests: 1,
            prompt_tokens: 100,
            cached_prompt_tokens: 40,
            completion_tokens: 10,
            ..Usage::default()
        }
    );
    assert_eq!(
        by_agent["verify"],
        Usage {
            requests: 1,
            prompt_tokens: 50,
            audio_prompt_tokens: 20,
            completion_tokens: 5,
            ..Usage::default()
        }
    );
    assert_eq!(by_agent["billing"].requests, 2);
    assert_eq!(by_agent["billing"].prompt_tokens, 420);
    let mut sum = Usage::default();
    for usage in by_agent.values() {
        sum += usage;
    }
    let total = ledger.total();
    assert_eq!(sum, total, "the agents' usage sums to the session's");
    assert_eq!(total.requests, 4);
    let by_model = ledger.by_model();
    assert_eq!(by_model["fast"].requests, 2);
    assert_eq!(by_model["smart"].requests, 2);
    // Each turn's result carries its own share.
    let mut turns = handed.usage;
    turns += &billing_turn.usage;
    turns += &verify_turn.usage;
    assert_eq!(turns, total);
    assert_eq!(billing_turn.usage.requests, 2);
    // Priced by the host's table.
    let prices = PriceTable::new()
        .model("fast", ModelPrice::text(1.0, 2.0).cached(0.25))
        .model("smart", ModelPrice::text(10.0, 20.0));
    let cost = ledger.cost(&prices);
    let expected_fast = (60.0 + 40.0 * 0.25 + 10.0 * 2.0) + (50.0 + 5.0 * 2.0);
    let expected_smart = 420.0 * 10.0 + 50.0 * 20.0;
    assert!((cost.total - (expected_fast + expected_smart) / 1e6).abs() < 1e-12);
    assert!((cost.by_model["smart"] - expected_smart / 1e6).abs() < 1e-12);
    assert!(cost.unpriced.is_empty());
    session.close().await.unwrap();
}

/// A model that answers each request from a script, after a pause.
struct Paced {
    name: &'static str,
    script: Mutex<VecDeque<(Duration, Vec<LlmChunk>)>>,
}

impl Paced {
    fn new(name: &'static str, script: Vec<(Duration, Vec<LlmChunk>)>) -> Arc<Self> {
        Arc::new(Self {
            name,
            script: Mutex::new(script.into()),
        })
    }
}

impl Llm for Paced {
    fn chat(&self, _request: LlmRequest) -> LlmStream {
        let (pause, chunks) = self
            .script
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or((Duration::from_secs(3600), Vec::new()));
        switchboard::futures::stream::once(sleep(pause))
            .flat_map(move |()| {
                switchboard::futures::stream::iter(chunks.clone().into_iter().map(Ok))
            })
            .boxed()
    }

    fn name(&self) -> &str {
        self.name
    }
}

async fn turn_metrics(events: &mut tokio::sync::broadcast::Receiver<SessionEvent>) -> TurnMetrics {
    wait_event(events, |e| match e {
        SessionEvent::TurnMetrics(metrics) => Some(metrics.clone()),
        _ => None,
    })
    .await
}

fn about(actual: Option<Duration>, expected: Duration) -> bool {
    actual.is_some_and(|a| a >= expected && a <= expected + ms(5))
}

#[actix::test]
async fn after_a_handoff_the_next_turns_latency_and_ttft_are_the_new_agents() {
    tokio::time::pause();
    let transfer_call = LlmChunk::ToolCall(ToolCallChunk {
        call_id: "call_1".into(),
        name: "transfer".into(),
        arguments: "{}".into(),
    });
    let reception_llm = Paced::new("fast", vec![(ms(200), vec![transfer_call])]);
    let billing_llm = Paced::new(
        "smart",
        vec![(
            ms(300),
            vec![LlmChunk::Text("Let me look at that refund.".into())],
        )],
    );
    let billing = Agent::builder("billing").llm(billing_llm).build().unwrap();
    let reception = Agent::builder("reception")
        .llm(reception_llm)
        .tool(common::transfer_to(billing))
        .build()
        .unwrap();
    let session = Session::builder()
        .agent(reception)
        .turn_handling(TurnHandling::new().endpointing(Endpointing::fixed(ms(500))))
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let mut events = session.subscribe();
    session.user_started_speaking();
    session.transcript("billing, please", true);
    sleep(ms(200)).await;
    session.user_stopped_speaking();
    let first = turn_metrics(&mut events).await;
    assert_eq!(first.agent, "reception");
    assert!(about(first.latency.time_to_first_token, ms(200)));
    assert_eq!(first.latency.end_to_first_audio, None, "it only handed off");
    common::settled(&session).await;
    assert_eq!(session.current_agent().await.unwrap(), "billing");

    // The user's next words: they stop speaking, the final comes 0.2 s later, the
    // endpointing waits 0.5 s, the new agent's model answers 0.3 s after its request.
    session.user_started_speaking();
    sleep(ms(1000)).await;
    session.user_stopped_speaking();
    sleep(ms(200)).await;
    session.transcript("I want a refund", true);
    let next = turn_metrics(&mut events).await;
    assert_eq!(next.agent, "billing");
    assert!(
        about(next.latency.end_to_first_audio, ms(1000)),
        "from the end of the user's speech: {:?}",
        next.latency
    );
    assert!(about(next.latency.time_to_first_token, ms(300)));
    let latency = session.latency();
    assert_eq!(latency["billing"].end_to_first_audio.count, 1);
    assert_eq!(latency["billing"].time_to_first_token.count, 1);
    assert_eq!(latency["reception"].turns, 1);
    assert_eq!(latency["reception"].end_to_first_audio.count, 0);
    session.close().await.unwrap();
}

#[actix::test]
async fn the_ledger_and_the_latency_survive_a_snapshot_and_a_restore_and_go_on_counting() {
    tokio::time::pause();
    let agent = || Agent::builder("host").build().unwrap();
    let llm = ScriptedLlm::named(
        "fast",
        [
            Reply::text("Hello.").and_usage(usage(100, 10)),
            Reply::text("Noted.").and_usage(LlmUsage {
                cached_prompt_tokens: Some(80),
                ..usage(120, 12)
            }),
        ],
    );
    let session = Session::builder()
        .llm(llm)
        .agent(agent())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("hi").await.unwrap();
    let SnapshotUpdate::Full(full) = session.snapshot_update().await.unwrap() else {
        panic!("the chain starts in full");
    };
    session.run("a table for two").await.unwrap();
    let SnapshotUpdate::Delta(delta) = session.snapshot_update().await.unwrap() else {
        panic!("then a delta");
    };
    let (usage_then, latency_then) = (session.usage(), session.latency());
    assert_eq!(usage_then.total().requests, 2);
    session.close().await.unwrap();

    // Through bytes, as a store keeps them; the delta carries the ledger as it grew.
    let mut snapshot = SessionSnapshot::from_bytes(&full.to_bytes()).unwrap();
    assert_eq!(snapshot.usage().total().requests, 1);
    snapshot.apply(&delta).unwrap();
    assert_eq!(
        snapshot.usage(),
        &usage_then,
        "a stored call's cost reads without a restore"
    );
    assert_eq!(snapshot.latency(), &latency_then);

    let llm = ScriptedLlm::named("fast", [Reply::text("See you.").and_usage(usage(150, 5))]);
    let restored = Session::builder()
        .llm(llm)
        .restore(
            snapshot,
            AgentRegistry::new().agent("host", move |_| Ok::<_, BuildError>(agent())),
        )
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    assert_eq!(restored.usage(), usage_then);
    assert_eq!(restored.latency(), latency_then);
    restored.run("thanks").await.unwrap();
    let total = restored.usage().total();
    assert_eq!(total.requests, 3);
    assert_eq!(total.prompt_tokens, 370);
    assert_eq!(total.cached_prompt_tokens, 80);
    assert_eq!(restored.latency()["host"].turns, 3);
    restored.close().await.unwrap();
}
