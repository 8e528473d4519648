//! What the LiveKit bridge adds to a turn: a typed turn from its text in to the first
//! text of the agent's speech out, three ways, on one instant scripted answer:
//!
//! - `in process`: `Session::run` to the first chunk at the session's `SpeechOutput`;
//! - `bridged`: LiveKit's `session.run(user_input=...)` (text mode, no room) to the first
//!   text at LiveKit's transcription output, the turn running in switchboard behind a
//!   `LiveKitBridge` on loopback;
//! - `livekit pipeline`: the same in LiveKit alone, its LLM node on a fake model that
//!   answers the same text at once.
//!
//! ```text
//! cargo bench -p switchboard-livekit --bench bridge_latency   # BENCH_N=500 by default
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::sync::mpsc;
use std::time::{Duration, Instant};

use switchboard::prelude::*;
use switchboard::testing::{Reply, ScriptedLlm};
use switchboard::{SpeechId, SpeechOutput};
use switchboard_livekit::{
    worker_python, BridgeOptions, BridgeToken, CallInfo, LiveKitBridge, SpeechSink,
};

const ANSWER: &str = "We open at nine.";

/// Notes when each speech's first chunk arrives.
struct FirstChunk {
    first: mpsc::Sender<Instant>,
    waiting: bool,
}

impl SpeechOutput for FirstChunk {
    fn speech_started(&mut self, _: SpeechId, _: &str) {
        self.waiting = true;
    }
    fn speech_chunk(&mut self, _: SpeechId, _: &str) {
        if std::mem::take(&mut self.waiting) {
            let _ = self.first.send(Instant::now());
        }
    }
}

fn agent() -> Agent {
    Agent::builder("concierge")
        .instructions("You answer.")
        .build()
        .expect("agent")
}

fn model() -> std::sync::Arc<ScriptedLlm> {
    let llm = ScriptedLlm::new([]);
    llm.otherwise(Reply::text(ANSWER));
    llm
}

fn summary(mode: &str, mut ms: Vec<f64>) -> String {
    ms.sort_by(f64::total_cmp);
    let mean = ms.iter().sum::<f64>() / ms.len() as f64;
    let p50 = ms[ms.len() / 2];
    let p99 = ms[(ms.len() * 99 / 100).min(ms.len() - 1)];
    format!(
        r#"{{"mode":"{mode}","n":{},"mean_ms":{mean},"p50_ms":{p50},"p99_ms":{p99}}}"#,
        ms.len()
    )
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = std::env::var("BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500);
    let engine = Engine::start()?;

    // In process.
    let (tx, rx) = mpsc::channel();
    let session = Session::builder()
        .llm(model())
        .agent(agent())
        .output(FirstChunk {
            first: tx,
            waiting: false,
        })
        .start(&engine)
        .await?;
    let mut samples = Vec::with_capacity(n);
    for i in 0..n + 20 {
        while rx.try_recv().is_ok() {}
        let started = Instant::now();
        session.run(format!("What time do you open? ({i})")).await?;
        let first = rx.recv_timeout(Duration::from_secs(5))?;
        if i >= 20 {
            samples.push((first - started).as_secs_f64() * 1000.0);
        }
    }
    session.close().await?;
    println!("{}", summary("in process", samples));

    // Bridged, and LiveKit's own pipeline.
    let token = "bench-token";
    let bridge =
        LiveKitBridge::bind("127.0.0.1:0", BridgeOptions::new(BridgeToken::new(token)?)).await?;
    let url = format!("ws://{}", bridge.local_addr().ok_or("no address")?);
    tokio::spawn(bridge.serve(move |call: CallInfo, speech: SpeechSink| {
        let engine = engine.clone();
        async move {
            let session = Session::builder()
                .id(call.session)
                .llm(model())
                .agent(agent())
                .output(speech.output())
                .start(&engine)
                .await
                .map_err(|e| e.to_string())?;
            Ok(speech.local(session))
        }
    }));
    let python = tokio::task::spawn_blocking(worker_python).await??;
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/turn_latency.py");
    for mode in ["bridged", "livekit"] {
        let output = tokio::process::Command::from(python.command())
            .arg(&script)
            .args([mode, &n.to_string()])
            .env("SB_BRIDGE_URL", &url)
            .env("SB_BRIDGE_TOKEN", token)
            .output()
            .await?;
        if !output.status.success() {
            return Err(format!("{mode}: {}", String::from_utf8_lossy(&output.stderr)).into());
        }
        print!("{}", String::from_utf8_lossy(&output.stdout));
    }
    Ok(())
}
