//! Issue 39, SPEC §19: the spans carry OpenTelemetry's GenAI semantic conventions
//! (`gen_ai.operation.name`, `gen_ai.request.model`, `gen_ai.usage.input_tokens`, …), the
//! messages' content only when the host opts in; the metrics count a voice turn's latency
//! from the end of the user's speech, for the agent that ran it after a handoff, and
//! count audio tokens and preemptive requests. Read through the SDK's in-memory exporters.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use switchboard::prelude::*;
use switchboard::telemetry::Telemetry;
use switchboard::{
    Endpointing, LlmChunk, LlmUsage, NoArgs, PreemptiveGeneration, ToolCallChunk, TurnHandling,
};
use switchboard_telemetry_tests::{PacedLlm, Pipeline, Span};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn text(t: &str) -> LlmChunk {
    LlmChunk::Text(t.into())
}

fn call(name: &str, id: &str) -> LlmChunk {
    LlmChunk::ToolCall(ToolCallChunk {
        call_id: id.into(),
        name: name.into(),
        arguments: "{}".into(),
    })
}

fn usage(prompt: u32, completion: u32, cached: Option<u32>) -> LlmChunk {
    LlmChunk::Usage(LlmUsage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        cached_prompt_tokens: cached,
        audio_prompt_tokens: Some(7),
        audio_completion_tokens: Some(3),
    })
}

fn named<'a>(spans: &'a [Span], name: &str) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.name == name).collect()
}

async fn tool_turn(trace_content: bool) -> Vec<Span> {
    let pipeline = Pipeline::install();
    let engine = Engine::current().unwrap();
    let lookup = Tool::new("lookup", "Looks up", |_ctx: RunContext, _: NoArgs| async {
        Ok::<_, ToolFailure>("42")
    });
    let llm = PacedLlm::new([
        (
            ms(10),
            vec![call("lookup", "call_1"), usage(120, 12, Some(64))],
        ),
        (
            ms(10),
            vec![text("Your balance is 42."), usage(150, 8, None)],
        ),
    ]);
    let session = Session::builder()
        .id("CA7")
        .llm(llm)
        .agent(
            Agent::builder("reception")
                .instructions("Be brief.")
                .tool(lookup)
                .build()
                .unwrap(),
        )
        .trace_content(trace_content)
        .start(&engine)
        .await
        .unwrap();
    session.run("what is my balance?").await.unwrap();
    session.close().await.unwrap();
    pipeline.spans()
}

#[switchboard::test]
async fn spans_carry_the_genai_attributes_and_no_content_unless_asked() {
    let spans = tool_turn(false).await;
    let turns = named(&spans, "turn");
    assert_eq!(turns.len(), 1);
    let turn = turns[0];
    assert_eq!(turn.attr("gen_ai.operation.name"), Some("invoke_agent"));
    assert_eq!(turn.attr("gen_ai.agent.name"), Some("reception"));
    assert_eq!(turn.attr("gen_ai.conversation.id"), Some("CA7"));

    let requests = named(&spans, "llm_request");
    assert_eq!(requests.len(), 2);
    for request in &requests {
        assert_eq!(request.attr("gen_ai.operation.name"), Some("chat"));
        assert_eq!(request.attr("gen_ai.request.model"), Some("paced"));
        assert_eq!(request.attr("gen_ai.agent.name"), Some("reception"));
        assert_eq!(request.parent, turn.id, "under its turn");
        for content in [
            "gen_ai.input.messages",
            "gen_ai.output.messages",
            "gen_ai.system_instructions",
        ] {
            assert_eq!(request.attr(content), None, "no {content} unless asked");
        }
    }
    let tokens: Vec<_> = requests
        .iter()
        .map(|r| {
            (
                r.attr("gen_ai.usage.input_tokens"),
                r.attr("gen_ai.usage.output_tokens"),
                r.attr("gen_ai.usage.cache_read.input_tokens"),
            )
        })
        .collect();
    assert_eq!(
        tokens,
        [
            (Some("120"), Some("12"), Some("64")),
            (Some("150"), Some("8"), None)
        ]
    );

    let tools = named(&spans, "tool_run");
    assert_eq!(tools.len(), 1);
    assert_eq!(tools[0].attr("gen_ai.operation.name"), Some("execute_tool"));
    assert_eq!(tools[0].attr("gen_ai.tool.name"), Some("lookup"));
    assert_eq!(tools[0].attr("gen_ai.tool.call.id"), Some("call_1"));
}

#[switchboard::test]
async fn with_content_asked_for_the_requests_carry_their_messages() {
    let spans = tool_turn(true).await;
    let requests = named(&spans, "llm_request");
    let input = requests[0].attr("gen_ai.input.messages").unwrap();
    assert!(input.contains("what is my balance?"), "{input}");
    let system = requests[0].attr("gen_ai.system_instructions").unwrap();
    assert!(system.contains("Be brief."), "{system}");
    let first = requests[0].attr("gen_ai.output.messages").unwrap();
    assert!(
        first.contains("\"tool_call\"") && first.contains("lookup"),
        "{first}"
    );
    let second = requests[1].attr("gen_ai.output.messages").unwrap();
    assert!(second.contains("Your balance is 42."), "{second}");
}

#[switchboard::test]
async fn a_voice_turn_after_a_handoff_records_its_latency_for_the_new_agent() {
    tokio::time::pause();
    let pipeline = Pipeline::install();
    let engine = Engine::current().unwrap();
    engine.set_telemetry(Some(pipeline.telemetry()));
    let billing = Agent::builder("billing").build().unwrap();
    let transfer = Tool::new(
        "transfer",
        "To billing",
        move |_ctx: RunContext, _: NoArgs| {
            let billing = billing.clone();
            async move { Ok::<_, ToolFailure>(Handoff::to(billing)) }
        },
    );
    let llm = PacedLlm::new([
        (
            ms(100),
            vec![call("transfer", "call_1"), usage(10, 1, None)],
        ),
        (ms(300), vec![text("Billing here."), usage(20, 2, None)]),
    ]);
    let session = Session::builder()
        .llm(llm)
        .agent(Agent::builder("reception").tool(transfer).build().unwrap())
        .turn_handling(TurnHandling::new().endpointing(Endpointing::fixed(ms(500))))
        .start(&engine)
        .await
        .unwrap();
    session.transcript("billing please", true);
    session.wait_for_settled().await.unwrap();
    // The user stops speaking; the final comes 0.2 s later; 0.5 s of endpointing; the
    // new agent's model answers 0.3 s after its request.
    session.user_started_speaking();
    tokio::time::sleep(ms(500)).await;
    session.user_stopped_speaking();
    tokio::time::sleep(ms(200)).await;
    session.transcript("a refund", true);
    session.wait_for_settled().await.unwrap();
    let e2e = pipeline.metric(Telemetry::TURN_E2E_LATENCY);
    let billing: Vec<_> = e2e
        .iter()
        .filter(|p| p.attr("agent") == Some("billing"))
        .collect();
    assert_eq!(billing.len(), 1, "{e2e:?}");
    assert_eq!(billing[0].count, 1.0);
    assert!(
        (1.0..1.005).contains(&billing[0].sum),
        "from the end of the user's speech: {}",
        billing[0].sum
    );
    let ttft: Vec<_> = pipeline
        .metric(Telemetry::LLM_TTFT)
        .into_iter()
        .filter(|p| p.attr("agent") == Some("billing"))
        .collect();
    assert_eq!(ttft.len(), 1);
    assert!((0.3..0.305).contains(&ttft[0].sum));
    let audio: f64 = pipeline
        .metric(Telemetry::LLM_AUDIO_PROMPT_TOKENS)
        .iter()
        .map(|p| p.sum)
        .sum();
    assert_eq!(audio, 14.0, "7 audio prompt tokens in each of two requests");
    session.close().await.unwrap();
}

#[switchboard::test]
async fn preemptive_requests_are_counted_adopted_or_discarded() {
    tokio::time::pause();
    let pipeline = Pipeline::install();
    let engine = Engine::current().unwrap();
    engine.set_telemetry(Some(pipeline.telemetry()));
    let llm = PacedLlm::new([
        (ms(100), vec![text("A table.")]),
        (ms(100), vec![text("A table for two.")]),
    ]);
    let session = Session::builder()
        .llm(llm)
        .agent(Agent::builder("host").build().unwrap())
        .turn_handling(TurnHandling::new().preemptive_generation(PreemptiveGeneration::on()))
        .start(&engine)
        .await
        .unwrap();
    session.transcript("a table", true);
    tokio::time::sleep(ms(200)).await;
    session.transcript("for two", true);
    session.wait_for_settled().await.unwrap();
    let counted: Vec<(String, f64)> = pipeline
        .metric(Telemetry::LLM_PREEMPTIVE)
        .iter()
        .map(|p| (p.attr("outcome").unwrap().to_owned(), p.count))
        .collect();
    let mut counted = counted;
    counted.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        counted,
        [("adopted".to_owned(), 1.0), ("discarded".to_owned(), 1.0)]
    );
    session.close().await.unwrap();
}
