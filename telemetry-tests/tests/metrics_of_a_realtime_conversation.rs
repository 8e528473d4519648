//! Telemetry of a realtime agent: its responses are LLM requests with their time to first
//! audio, its turns have their end-to-end latency, and its usage counts audio tokens apart,
//! read through the OpenTelemetry SDK's in-memory exporter.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use switchboard::prelude::*;
use switchboard::telemetry::Telemetry;
use switchboard::testing::{RealtimeReply, RealtimeScript, ScriptedRealtime};
use switchboard_telemetry_tests::Pipeline;

#[switchboard::test]
async fn a_realtime_turn_records_ttft_latency_and_audio_tokens() {
    tokio::time::pause();
    let pipeline = Pipeline::install();
    let engine = Engine::current().unwrap();
    engine.set_telemetry(Some(pipeline.telemetry()));
    // The simulated server reports 100 prompt tokens, 20 of them audio, and for 30 chunks
    // of audio 11 completion tokens, 6 of them audio.
    let model = ScriptedRealtime::new(RealtimeScript::new([
        RealtimeReply::speech("Hello there.").chunks(30)
    ]));
    let session = Session::builder()
        .realtime(model.shared())
        .agent(Agent::builder("reception").build().unwrap())
        .start(&engine)
        .await
        .unwrap();
    session.run("hi").await.unwrap();

    let ttft = pipeline.metric(Telemetry::LLM_TTFT);
    assert_eq!(ttft.len(), 1, "{ttft:?}");
    assert_eq!(ttft[0].attr("llm"), Some("scripted-realtime"));
    assert_eq!(ttft[0].count, 1.0);
    let e2e = pipeline.metric(Telemetry::TURN_E2E_LATENCY);
    assert_eq!(e2e.len(), 1, "{e2e:?}");
    assert_eq!(e2e[0].attr("kind"), Some("user"));
    let count = |name| pipeline.metric(name).iter().map(|p| p.count).sum::<f64>();
    assert_eq!(count(Telemetry::LLM_PROMPT_TOKENS), 100.0);
    assert_eq!(count(Telemetry::LLM_AUDIO_PROMPT_TOKENS), 20.0);
    assert_eq!(count(Telemetry::LLM_COMPLETION_TOKENS), 11.0);
    assert_eq!(count(Telemetry::LLM_AUDIO_COMPLETION_TOKENS), 6.0);
    session.close().await.unwrap();
}
