//! The realtime path's CPU, per audio chunk and per tool turn, against a server that
//! speaks the OpenAI Realtime protocol: LiveKit's validating mock
//! (`shared/bench/realtime/mock_realtime_server.py`, the server the peer's figures come
//! from, so both sides are measured against the very same process in one sitting), or,
//! without one, this crate's loopback server in a child process.
//!
//! ```text
//! # the peer's mock, started once and shared with the peer's bench:
//! python mock_realtime_server.py          # prints BASE_URL http://127.0.0.1:PORT/v1
//! REALTIME_BENCH_URL=http://127.0.0.1:PORT/v1 cargo bench --bench realtime
//! # or on its own (the bundled loopback server in a child process):
//! cargo bench --bench realtime
//! ```
//!
//! What it drives is what the peer's bench drives: a `Session` with one agent on
//! `OpenAiRealtime` (the real provider: WebSocket, JSON, base64), the caller's audio through
//! `Session::audio_input` as 20 ms PCM16 frames (a turn: 300 ms of tone, 200 ms of silence;
//! sent as five 100 ms appends, as LiveKit sends them), the model's audio into an output
//! that counts it and reports it played at once (the peer's "fast" sink). Each turn is
//! timed from the first frame handed to the engine until the answer's last chunk has
//! reached the output and the turn is finished; CPU is this process's
//! (`CLOCK_PROCESS_CPUTIME_ID`, every thread, as Python's `process_time`). Everything runs
//! on one thread (an actix system on the main thread, the engine's sessions on it), as
//! the peer runs in one event loop. Ten turns per session (one WebSocket), a warm-up
//! session first.
//!
//! Scenarios (the mock's `scenarios.json`): `R1` a spoken answer of 50 × 20 ms chunks;
//! `R1_long` 250 chunks (`R1_long − R1` over 200 is the marginal CPU per chunk); `R2` a tool
//! turn (the call, the tool, the output, one `response.create`, a 50-chunk answer);
//! `R2_preamble` a 25-chunk preamble with the call in one response, then 50 chunks. One
//! JSON line each (median, p90), then the mock's verdict for this run's connections
//! (violations) when the server is the mock.
//!
//! Knobs: `BENCH_N` (timed turns per scenario, default 200), `BENCH_TURNS_PER_CALL` (10),
//! `BENCH_SCENARIOS` (`R1,R1_long,R2,R2_preamble`), `BENCH_FLOOR` (set: also each scenario
//! over a bare connection of the provider, no engine: the transport's own cost; `only`:
//! the floor alone).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use switchboard::prelude::*;
use switchboard::providers::openai_realtime::OpenAiRealtime;
use switchboard::testing::{silence, tone, RealtimeReply, RealtimeScript, RealtimeServer};
use switchboard::{Playout, SpeechId};
use tokio::sync::Notify;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// This process's CPU time, every thread.
fn cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The scenarios, as this crate's loopback server plays them (the same shapes as the
/// mock's `scenarios.json`).
fn script(scenario: &str) -> RealtimeScript {
    let answer = |chunks| {
        RealtimeReply::speech(
            "Here is something nice: the sun is out and the coffee is still warm today.",
        )
        .chunks(chunks)
    };
    let weather = || {
        RealtimeReply::speech(
            "It is sunny and twenty one degrees in Paris right now, a lovely day.",
        )
        .chunks(50)
    };
    let call = || RealtimeReply::call("get_weather", json!({"city": "Paris"}));
    let replies = match scenario {
        "R1" => vec![answer(50)],
        "R1_long" => vec![answer(250)],
        "R2" => vec![call(), weather()],
        "R2_preamble" => vec![
            RealtimeReply::speech("Let me check that for you.")
                .chunks(25)
                .and_call("get_weather", json!({"city": "Paris"})),
            weather(),
        ],
        other => panic!("unknown scenario {other}"),
    };
    RealtimeScript::new(replies).repeat()
}

/// Serve mode: this crate's loopback server for one scenario; prints its base URL and
/// serves until stdin closes.
fn serve(scenario: &str) {
    let server = RealtimeServer::start(script(scenario)).unwrap();
    println!("BASE_URL {}", server.base_url());
    std::io::stdout().flush().unwrap();
    let mut sink = String::new();
    let _ = std::io::stdin().read_to_string(&mut sink);
    drop(server);
}

/// The output: counts the model's audio, and wakes the bench when a speech's text is
/// complete (its audio came before it); playout is done at once.
#[derive(Clone, Default)]
struct Sink {
    state: Arc<Mutex<(usize, u32)>>,
    finished: Arc<Notify>,
}

impl SpeechOutput for Sink {
    fn speech_chunk(&mut self, _speech: SpeechId, _text: &str) {}

    fn speech_audio(&mut self, _speech: SpeechId, audio: &[u8]) {
        self.state.lock().unwrap().0 += audio.len();
    }

    fn speech_finished(&mut self, _speech: SpeechId) -> Playout {
        self.state.lock().unwrap().1 += 1;
        self.finished.notify_one();
        Playout::Done
    }
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct City {
    city: String,
}

struct Spec {
    chunks: usize,
    speeches: u32,
    tools: bool,
}

fn spec(scenario: &str) -> Spec {
    match scenario {
        "R1" => Spec {
            chunks: 50,
            speeches: 1,
            tools: false,
        },
        "R1_long" => Spec {
            chunks: 250,
            speeches: 1,
            tools: false,
        },
        "R2" => Spec {
            chunks: 50,
            speeches: 1,
            tools: true,
        },
        "R2_preamble" => Spec {
            chunks: 75,
            speeches: 2,
            tools: true,
        },
        other => panic!("unknown scenario {other}"),
    }
}

fn stats(mut values: Vec<f64>) -> Value {
    values.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let at = |p: f64| {
        let k = ((p / 100.0 * values.len() as f64).ceil() as usize).clamp(1, values.len()) - 1;
        values[k]
    };
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    json!({
        "median": (at(50.0) * 1000.0).round() / 1000.0,
        "p90": (at(90.0) * 1000.0).round() / 1000.0,
        "mean": (mean * 1000.0).round() / 1000.0,
        "min": (values[0] * 1000.0).round() / 1000.0,
        "max": (values[values.len() - 1] * 1000.0).round() / 1000.0,
    })
}

/// One turn of speech: 300 ms of tone, 200 ms of silence, as 20 ms frames.
fn utterance() -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    for _ in 0..15 {
        frames.push(tone(20));
    }
    for _ in 0..10 {
        frames.push(silence(20));
    }
    frames
}

/// The OpenAI Realtime provider pointed at the server under test.
fn provider(url: &str) -> OpenAiRealtime {
    OpenAiRealtime::builder()
        .base_url(url)
        .api_key("bench")
        .build()
        .unwrap()
}

async fn run_scenario(scenario: &str, url: &str, n: usize, per_call: usize) {
    let spec = spec(scenario);
    let utterance = utterance();
    let engine = Engine::current().unwrap();
    let mut cpu_turns = Vec::new();
    let mut wall_turns = Vec::new();
    let calls = 1 + n.div_ceil(per_call);
    for call in 0..calls {
        let model = provider(url);
        let mut agent =
            Agent::builder("assistant").instructions("You are a helpful voice assistant.");
        if spec.tools {
            agent = agent.tool(Tool::new(
                "get_weather",
                "Get the weather for a city",
                |_ctx: RunContext, args: City| async move {
                    Ok::<_, ToolFailure>(format!("sunny, 21 degrees in {}", args.city))
                },
            ));
        }
        let sink = Sink::default();
        let session = Session::builder()
            .realtime(Arc::new(model))
            .agent(agent.build().unwrap())
            .output(sink.clone())
            .start(&engine)
            .await
            .unwrap();
        // The connection opens and the session is set up before the first turn.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut mic = session.audio_input();
        for turn in 0..per_call {
            let (bytes0, speeches0) = *sink.state.lock().unwrap();
            let c0 = cpu();
            let w0 = Instant::now();
            for frame in &utterance {
                mic.push(frame);
            }
            loop {
                let done = sink.state.lock().unwrap().1 >= speeches0 + spec.speeches;
                if done {
                    break;
                }
                tokio::time::timeout(Duration::from_secs(15), sink.finished.notified())
                    .await
                    .unwrap_or_else(|_| panic!("{scenario}: turn {turn} did not finish"));
            }
            session.wait_for_settled().await.unwrap();
            let c1 = cpu();
            let w1 = Instant::now();
            let bytes = sink.state.lock().unwrap().0 - bytes0;
            assert_eq!(bytes, spec.chunks * 960, "{scenario}: the sink's audio");
            if call > 0 && cpu_turns.len() < n {
                cpu_turns.push((c1 - c0).as_secs_f64() * 1000.0);
                wall_turns.push((w1 - w0).as_secs_f64() * 1000.0);
            }
        }
        session.close().await.unwrap();
    }
    let per_chunk: Vec<f64> = cpu_turns
        .iter()
        .map(|ms| ms * 1000.0 / spec.chunks as f64)
        .collect();
    println!(
        "{}",
        json!({
            "scenario": scenario,
            "impl": "switchboard",
            "turns": cpu_turns.len(),
            "chunks_per_turn": spec.chunks,
            "cpu_ms_per_turn": stats(cpu_turns),
            "cpu_us_per_chunk": stats(per_chunk),
            "wall_ms_per_turn": stats(wall_turns),
        })
    );
}

/// The floor: the same turns over a bare connection of the same provider (WebSocket,
/// JSON, base64 decoded), read in a loop that only counts, answers a call with its output
/// and asks the next response: what the transport costs before any engine work.
async fn run_floor(scenario: &str, url: &str, n: usize, per_call: usize) {
    use std::future::poll_fn;
    use switchboard::realtime::{ClientEvent, Place, RealtimeModel, RemoteItem, ServerEvent};
    let spec = spec(scenario);
    let utterance: Vec<u8> = utterance().concat();
    let mut cpu_turns = Vec::new();
    let calls = 1 + n.div_ceil(per_call);
    for call in 0..calls {
        let model = provider(url);
        let mut conn = model.connect().await.unwrap();
        conn.send(ClientEvent::UpdateSession(
            switchboard::realtime::SessionUpdate {
                instructions: Some("You are a helpful voice assistant.".into()),
                tools: None,
                voice: None,
                settings: Some(model.settings().clone()),
            },
        ));
        poll_fn(|cx| conn.poll_flush(cx)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        for turn in 0..per_call {
            let c0 = cpu();
            for piece in utterance.chunks(4800) {
                conn.send(ClientEvent::AppendAudio(piece.to_vec()));
            }
            poll_fn(|cx| conn.poll_flush(cx)).await.unwrap();
            let (mut bytes, mut responses, mut answered) = (0, 0, Vec::new());
            let want = if spec.tools { 2 } else { 1 };
            while responses < want {
                let event = poll_fn(|cx| conn.poll_next(cx)).await.unwrap().unwrap();
                match event {
                    ServerEvent::AudioDelta { audio, .. } => bytes += audio.len(),
                    ServerEvent::FunctionCall { call_id, .. } => answered.push(call_id),
                    ServerEvent::ResponseDone { .. } => {
                        responses += 1;
                        for (i, call_id) in answered.drain(..).enumerate() {
                            conn.send(ClientEvent::CreateItem {
                                id: format!("out_{call}_{turn}_{responses}_{i}"),
                                previous: Place::End,
                                item: RemoteItem::FunctionCallOutput {
                                    call_id,
                                    output: "sunny, 21 degrees in Paris".to_owned(),
                                },
                            });
                            conn.send(ClientEvent::CreateResponse {
                                tag: responses as u64,
                                instructions: None,
                                tool_choice: switchboard::ToolChoice::Auto,
                            });
                        }
                        poll_fn(|cx| conn.poll_flush(cx)).await.unwrap();
                    }
                    _ => {}
                }
            }
            assert_eq!(bytes, spec.chunks * 960, "{scenario} floor: the audio");
            if call > 0 && cpu_turns.len() < n {
                cpu_turns.push((cpu() - c0).as_secs_f64() * 1000.0);
            }
        }
        poll_fn(|cx| conn.poll_close(cx)).await;
    }
    let per_chunk: Vec<f64> = cpu_turns
        .iter()
        .map(|ms| ms * 1000.0 / spec.chunks as f64)
        .collect();
    println!(
        "{}",
        json!({
            "scenario": scenario,
            "impl": "transport floor (bare connection, no engine)",
            "turns": cpu_turns.len(),
            "cpu_ms_per_turn": stats(cpu_turns),
            "cpu_us_per_chunk": stats(per_chunk),
        })
    );
}

/// `GET /mock/summary?tag=…` of the peer's mock.
fn mock_summary(base_url: &str, tag: &str) -> Option<Value> {
    let address = base_url
        .strip_prefix("http://")?
        .split('/')
        .next()?
        .to_owned();
    let mut stream = std::net::TcpStream::connect(&address).ok()?;
    write!(
        stream,
        "GET /mock/summary?tag={tag}&conns=0 HTTP/1.0\r\nHost: {address}\r\n\r\n"
    )
    .ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let body = answer.split("\r\n\r\n").nth(1)?;
    serde_json::from_str(body).ok()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--serve") {
        return serve(&args[at + 1]);
    }
    let n = env("BENCH_N", 200);
    let per_call = env("BENCH_TURNS_PER_CALL", 10).max(1);
    let scenarios =
        std::env::var("BENCH_SCENARIOS").unwrap_or_else(|_| "R1,R1_long,R2,R2_preamble".to_owned());
    let mock = std::env::var("REALTIME_BENCH_URL").ok();
    let run = format!("rust{}", std::process::id());
    for scenario in scenarios
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        // Without the peer's mock: this crate's server for the scenario, in a child process.
        let (base_url, child) = match &mock {
            Some(url) => (url.clone(), None),
            None => {
                let mut child = Command::new(&args[0])
                    .args(["--serve", scenario])
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .spawn()
                    .unwrap();
                let mut line = String::new();
                BufReader::new(child.stdout.take().unwrap())
                    .read_line(&mut line)
                    .unwrap();
                let url = line.trim().strip_prefix("BASE_URL ").unwrap().to_owned();
                (url, Some(child))
            }
        };
        let tag = format!("{run}-{scenario}");
        // The mock picks its scenario and labels the connections by the URL's query.
        let url = match &mock {
            Some(_) => format!("{base_url}?scenario={scenario}&tag={tag}"),
            None => base_url.clone(),
        };
        let floor = std::env::var("BENCH_FLOOR").ok();
        if floor.as_deref() != Some("only") {
            actix_rt::System::new().block_on(run_scenario(scenario, &url, n, per_call));
        }
        if floor.is_some() {
            let url = match &mock {
                Some(_) => format!("{base_url}?scenario={scenario}&tag={tag}-floor"),
                None => base_url.clone(),
            };
            actix_rt::System::new().block_on(run_floor(scenario, &url, n, per_call));
        }
        if let Some(mut child) = child {
            drop(child.stdin.take());
            let _ = child.wait();
        }
        if mock.is_some() {
            let tags = [
                (floor.as_deref() != Some("only")).then(|| tag.clone()),
                floor.is_some().then(|| format!("{tag}-floor")),
            ];
            for (tag, summary) in tags
                .into_iter()
                .flatten()
                .filter_map(|tag| mock_summary(&base_url, &tag).map(|s| (tag, s)))
            {
                let of = if tag.ends_with("-floor") {
                    "transport floor"
                } else {
                    "switchboard"
                };
                println!(
                    "{}",
                    json!({
                        "scenario": scenario,
                        "of": of,
                        "mock": {
                            "connections": summary["connections"],
                            "violations_total": summary["violations_total"],
                            "violations": summary["violations"],
                            "benign": summary["benign"],
                            "responses": summary["responses"],
                        }
                    })
                );
            }
        }
    }
}
