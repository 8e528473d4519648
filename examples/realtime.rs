//! A call with a realtime speech-to-speech model: the model hears the caller's audio and
//! answers in audio, calls a tool, is barged in on mid-answer, and hands off to another
//! agent on the same connection.
//!
//! ```text
//! cargo run --example realtime
//! ```
//!
//! Without a key it runs against the bundled loopback server (`testing::RealtimeServer`),
//! which speaks the OpenAI Realtime protocol over a real WebSocket, answers from a script
//! and refuses what the service refuses; its report is printed at the end. With
//! `OPENAI_API_KEY` set (and optionally `OPENAI_BASE_URL`, `OPENAI_REALTIME_MODEL`) the
//! same program talks to OpenAI: its words differ, the flow is the same. It shows:
//! - typed user turns and the model's spoken answers (the transcript printed as it comes,
//!   the audio "played" by a fake speaker at real speed);
//! - a tool call (`get_weather`) whose output goes back with one `response.create`;
//! - a barge-in: the caller's voice (a tone, then silence) over the answer; the speaker
//!   stops, reports how much was heard, and the model's item is cut there;
//! - a handoff by a tool (`transfer_to_billing`) to an agent of the same model: one
//!   session update on the same socket, then billing greets the caller;
//! - the transcript of the call from `close()`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use switchboard::prelude::*;
use switchboard::providers::openai_realtime::OpenAiRealtime;
use switchboard::realtime::RealtimeModel;
use switchboard::testing::{
    silence, tone, RealtimeReply, RealtimeScript, RealtimeServer, SimReport,
};
use switchboard::{Playout, SpeechId};
use tokio::time::{sleep, Instant};

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct City {
    /// The city.
    city: String,
}

/// A speaker that "plays" the model's audio at real speed (PCM16, 24 kHz: 48 bytes a
/// millisecond), prints its transcript, and reports playout as a real output would.
#[derive(Clone, Default)]
struct Speaker(Arc<Mutex<Playing>>);

#[derive(Default)]
struct Playing {
    reporter: Option<PlayoutReporter>,
    /// The speech playing: when its first audio came, and how much audio came.
    current: Option<(SpeechId, Instant, Duration)>,
    /// The last speech cut short: its report is on its way.
    cut: Option<SpeechId>,
}

impl Speaker {
    fn lock(&self) -> std::sync::MutexGuard<'_, Playing> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a speech has played audio for `at_least`.
    fn playing_for(&self, at_least: Duration) -> bool {
        self.lock()
            .current
            .is_some_and(|(_, started, _)| started.elapsed() >= at_least)
    }
}

impl SpeechOutput for Speaker {
    fn attach(&mut self, reporter: PlayoutReporter) {
        self.lock().reporter = Some(reporter);
    }

    fn speech_started(&mut self, _speech: SpeechId, agent: &str) {
        print!("\n  {agent} says: ");
    }

    fn speech_chunk(&mut self, _speech: SpeechId, text: &str) {
        use std::io::Write;
        print!("{text}");
        let _ = std::io::stdout().flush();
    }

    fn speech_audio(&mut self, speech: SpeechId, audio: &[u8]) {
        let mut playing = self.lock();
        let length = Duration::from_micros(audio.len() as u64 * 1000 / 48);
        match &mut playing.current {
            Some((id, _, received)) if *id == speech => *received += length,
            _ => playing.current = Some((speech, Instant::now(), length)),
        }
    }

    fn speech_finished(&mut self, speech: SpeechId) -> Playout {
        let playing = self.lock();
        if playing.cut == Some(speech) {
            // Stopped already; its report says what was heard.
            return Playout::Pending;
        }
        let (Some(reporter), Some((id, started, received))) =
            (playing.reporter.clone(), playing.current)
        else {
            return Playout::Done;
        };
        if id != speech {
            return Playout::Done;
        }
        // The audio plays on after its last piece came; report when it ends.
        let left = received.saturating_sub(started.elapsed());
        let me = self.clone();
        tokio::spawn(async move {
            sleep(left).await;
            if me
                .lock()
                .current
                .is_some_and(|(playing, ..)| playing == speech)
            {
                me.lock().current = None;
                reporter.audio_finished(speech, false, received);
            }
        });
        Playout::Pending
    }

    fn interrupt(&mut self, speech: SpeechId) {
        let mut playing = self.lock();
        if let (Some(reporter), Some((id, started, received))) =
            (playing.reporter.clone(), playing.current)
        {
            if id == speech {
                playing.current = None;
                playing.cut = Some(speech);
                let heard = started.elapsed().min(received);
                println!(
                    "\n  [the speaker stops after {} ms of the answer]",
                    heard.as_millis()
                );
                reporter.audio_finished(speech, true, heard);
            }
        }
    }
}

/// The script the loopback server answers with, in order.
fn script() -> RealtimeScript {
    RealtimeScript::new([
        RealtimeReply::call("get_weather", json!({"city": "Paris"})),
        RealtimeReply::speech(
            "It is sunny and twenty one degrees in Paris today, with a light breeze from \
             the west, a few clouds in the afternoon and no rain expected until the evening.",
        )
        .chunks(150)
        .paced(Duration::from_millis(20)),
        RealtimeReply::speech("Sorry, go ahead."),
        RealtimeReply::call("transfer_to_billing", json!({})),
        RealtimeReply::speech("Hi, this is billing. How can I help with your bill?"),
    ])
    .user_transcript("Actually, I have a question about my bill.")
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (model, server): (Arc<dyn RealtimeModel>, Option<RealtimeServer>) =
        if std::env::var("OPENAI_API_KEY").is_ok() {
            println!("Talking to OpenAI (OPENAI_API_KEY is set).");
            (Arc::new(OpenAiRealtime::from_env()?), None)
        } else {
            let server = RealtimeServer::start(script())?;
            println!(
                "Talking to the bundled loopback server at {} (no OPENAI_API_KEY).",
                server.base_url()
            );
            let model = OpenAiRealtime::builder()
                .base_url(server.base_url())
                .api_key("no-key-needed")
                .build()?;
            (Arc::new(model), Some(server))
        };

    let weather = Tool::new(
        "get_weather",
        "The weather in a city",
        |_ctx: RunContext, args: City| async move {
            Ok::<_, ToolFailure>(format!("sunny, 21 degrees in {}", args.city))
        },
    );
    let billing = Agent::builder("billing")
        .instructions("You handle billing questions. Be brief.")
        .on_enter(|ctx| async move {
            let _ = ctx.generate_reply("Greet the caller as billing.").await;
        })
        .build()?;
    let transfer = Tool::new(
        "transfer_to_billing",
        "Transfers the caller to billing",
        move |_ctx: RunContext, _: NoArgs| {
            let billing = billing.clone();
            async move { Ok::<_, ToolFailure>(billing) }
        },
    );
    let front = Agent::builder("front_desk")
        .instructions(
            "You answer weather questions with get_weather and transfer billing questions \
             with transfer_to_billing. Be brief.",
        )
        .tool(weather)
        .tool(transfer)
        .build()?;

    let speaker = Speaker::default();
    let engine = Engine::start()?;
    let session = Session::builder()
        .realtime(model)
        .agent(front)
        .output(speaker.clone())
        .inherit_chat_context(true)
        .start(&engine)
        .await?;
    let mut events = session.subscribe();

    // 1. A typed question: the model calls the tool, then answers in audio.
    println!("caller (typed): What's the weather in Paris?");
    let asking = {
        let session = session.clone();
        tokio::spawn(async move { session.run("What's the weather in Paris?").await })
    };
    // 2. The caller speaks over the answer, 800 ms into it.
    while !speaker.playing_for(Duration::from_millis(800)) {
        sleep(Duration::from_millis(10)).await;
    }
    println!("\ncaller (voice): (talks over the answer)");
    let mut mic = session.audio_input();
    for _ in 0..20 {
        mic.push(&tone(20));
        sleep(Duration::from_millis(20)).await;
    }
    for _ in 0..30 {
        mic.push(&silence(20));
        sleep(Duration::from_millis(20)).await;
    }
    mic.flush();
    let first = asking.await??;
    println!(
        "\n  [the first turn ended; interrupted: {}]",
        first.interrupted
    );
    session.wait_for_settled().await?;

    // 3. A billing question: the front desk transfers the call on the same socket.
    println!("\ncaller (typed): Please transfer me to billing.");
    session.run("Please transfer me to billing.").await?;
    session.wait_for_settled().await?;
    let mut seen = Vec::new();
    while let Ok(event) = events.try_recv() {
        seen.push(event.clone());
        match event {
            SessionEvent::AgentHandoff { from, to } => {
                println!("\n  [handoff: {} -> {to}]", from.unwrap_or_default())
            }
            SessionEvent::RealtimeReconnecting { reason, .. } => {
                println!("\n  [reconnecting: {reason}]")
            }
            SessionEvent::Error { message } => println!("\n  [error: {message}]"),
            _ => {}
        }
    }

    let history = session.close().await?;
    println!("\n\nThe call, as the engine kept it:");
    for (agent, item) in history.transcript() {
        match item {
            ChatItem::Message(m) => println!(
                "  {agent} {:?}: {}{}",
                m.role,
                m.content,
                if m.interrupted { " [cut]" } else { "" }
            ),
            ChatItem::FunctionCall(c) => println!("  call {}({})", c.name, c.arguments),
            ChatItem::FunctionCallOutput(o) => println!("  output: {}", o.output),
            ChatItem::AgentHandoff { to, .. } => println!("  -- now {to} --"),
            _ => {}
        }
    }
    if let Some(server) = server {
        let report = server.report();
        println!(
            "\nThe loopback server saw {} connection(s), {} responses, {} protocol violation(s), barge-ins: {:?}",
            report.connections,
            report.responses.values().sum::<u32>() / 2,
            report.violations_total(),
            report
                .speech_starts
                .iter()
                .map(|s| (s.server_cancelled, s.truncate, s.cancels))
                .collect::<Vec<_>>()
        );
        check(&history, &seen, &report, first.interrupted)?;
        println!("\n(checked: the tool call, the barge-in's cut, the handoff on one socket, no violation)");
    } else {
        println!(
            "\n(a real model's words and timings differ: the loopback run's checks are skipped)"
        );
    }
    Ok(())
}

/// What the example claims to show, against the loopback server: an error names what did
/// not happen.
fn check(
    history: &SessionHistory,
    events: &[SessionEvent],
    report: &SimReport,
    interrupted: bool,
) -> Result<(), String> {
    let happened = |what: &str, found: bool| {
        if found {
            Ok(())
        } else {
            Err(format!("the example did not show {what}"))
        }
    };
    let front = history
        .chat_of("front_desk")
        .ok_or("the history has no front desk")?;
    happened(
        "the weather tool's output going back",
        front
            .outputs()
            .any(|out| out.name == "get_weather" && out.output.starts_with("sunny")),
    )?;
    let kinds: Vec<&str> = report
        .trace
        .iter()
        .map(|(_, e)| {
            if e["item"]["type"] == "function_call_output" {
                "function_call_output"
            } else {
                e["type"].as_str().unwrap_or_default()
            }
        })
        .collect();
    happened(
        "one `response.create` right after the tool's output",
        kinds.windows(3).any(|w| {
            w[..2] == ["function_call_output", "response.create"] && w[2] != "response.create"
        }),
    )?;
    happened("the barge-in interrupting the first turn", interrupted)?;
    happened(
        "the model's answer cut where the caller stopped hearing it",
        report.speech_starts.iter().any(|s| {
            s.server_cancelled && (s.deleted || s.truncate.is_some_and(|(_, _, accepted)| accepted))
        }),
    )?;
    happened(
        "the cut answer in the chat, marked interrupted",
        front.items().iter().any(|item| {
            matches!(item, ChatItem::Message(m) if m.role == ChatRole::Assistant && m.interrupted)
        }),
    )?;
    happened(
        "the handoff to billing",
        events
            .iter()
            .any(|e| matches!(e, SessionEvent::AgentHandoff { to, .. } if to == "billing")),
    )?;
    happened(
        "billing speaking after the handoff",
        history.chat_of("billing").is_some_and(|chat| {
            chat.items().iter().any(|item| {
                matches!(item, ChatItem::Message(m) if m.role == ChatRole::Assistant && !m.content.is_empty())
            })
        }),
    )?;
    happened(
        "the session updated for billing before the handoff's output",
        kinds
            .windows(2)
            .any(|w| w == ["session.update", "function_call_output"]),
    )?;
    happened("one connection for the whole call", report.connections == 1)?;
    happened("no protocol violation", report.violations_total() == 0)
}
