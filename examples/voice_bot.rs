//! A voice bot host: a simulated voice pipeline around a session, in a `#[tokio::main]`
//! program — what a real host does with its VAD, STT and TTS, with scripted user audio
//! instead of a microphone and a fake TTS that "plays" text at speaking speed.
//!
//! ```text
//! cargo run --example voice_bot
//! ```
//!
//! Runs on the bundled scripted model (no key, no network); with `OPENAI_API_KEY` (or
//! `OPENAI_BASE_URL`, `OPENAI_MODEL`) set, on that model instead (its words, and so the
//! timings, will differ). It shows:
//! - user input going in as the host's VAD and STT would send it: started / stopped
//!   speaking, interim then final transcripts;
//! - an async tool (`book_table`) that answers at once with an update and keeps working
//!   while the user talks; its result comes with a deferred reply once the user is quiet;
//! - a cough during the agent's speech: the TTS pauses at once, and resumes when no words
//!   follow (a false interruption);
//! - a real barge-in mid-sentence: the TTS stops, and the chat keeps only the words the
//!   user heard;
//! - a supervisor taking over with an interrupting handoff;
//! - what the call used and how fast each agent answered (`usage()`, `latency()`: from the
//!   end of the user's speech to the first text out, across the handoff);
//! - the transcript of the call, per agent, from `close()`.
//!
//! On the scripted model it checks each of these at the end and fails (a non-zero exit)
//! when one did not happen; CI runs it so (`.ci/examples`). The fake TTS keeps speaking
//! speed on a busy machine too: a tick it could not serve in time is played late, not
//! skipped (`MissedTickBehavior::Delay`), so no speech "plays" in an instant and escapes
//! the barge-in.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use switchboard::prelude::*;
use switchboard::providers::openai::OpenAiLlm;
use switchboard::testing::{Reply, ScriptedLlm};
use switchboard::{Playout, PlayoutReporter, SpeechId, ToolChoice, UserState};
use tokio::sync::mpsc;
use tokio::time::{sleep, Instant, MissedTickBehavior};

/// How fast the fake TTS speaks (a fast talker, so the demo takes a few seconds).
const CHARS_PER_SECOND: u64 = 40;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Booking {
    /// How many guests.
    party: u32,
    /// When, e.g. "8pm".
    time: String,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let started = Instant::now();
    let book_table = Tool::new(
        "book_table",
        "Books a table",
        |ctx: RunContext, booking: Booking| async move {
            ctx.update(format!(
                "Checking tables for {} at {}.",
                booking.party, booking.time
            ))
            .await?;
            // The restaurant takes a while to answer; the conversation goes on.
            sleep(Duration::from_millis(2_500)).await;
            Ok::<_, ToolFailure>(format!("Booked: a table for {} at 9pm.", booking.party))
        },
    );
    let supervisor = Agent::builder("supervisor")
        .instructions("You are the shift supervisor.")
        .on_enter(|ctx| async move {
            let _ = ctx.generate_reply("Introduce yourself.").await;
        })
        .build()?;
    let concierge = Agent::builder("concierge")
        .instructions("You book tables. Keep answers short.")
        .tool(book_table)
        .build()?;

    let (llm, scripted) = model()?;
    let session = Session::builder()
        .llm(llm)
        .agent(concierge)
        .output(FakeTts::start(CHARS_PER_SECOND, started))
        .false_interruption_timeout(Some(Duration::from_millis(800)))
        .start(&Engine::start()?)
        .await?;
    spawn_event_printer(&session, started);
    // What happened, for the checks at the end.
    let mut seen = session.subscribe();

    // The user's side of the call, as the host's VAD and STT report it.
    let user = User {
        session: session.clone(),
        started,
    };
    user.says("Can you book a table for two at eight?", 1_200)
        .await;
    // The agent answers and starts the booking; while it speaks, the user coughs.
    sleep(Duration::from_millis(900)).await;
    user.coughs().await;
    sleep(Duration::from_millis(1_600)).await;
    // Mid-sentence, the user barges in for real; the booking's result comes meanwhile.
    user.says("Actually, make it nine.", 1_300).await;
    session.wait_for_inactive().await;
    sleep(Duration::from_millis(300)).await;

    // A supervisor takes over while the agent still talks: the handoff interrupts it.
    let long = session
        .say("While we wait, let me tell you about tonight's specials, starting with the soup.")
        .await?;
    sleep(Duration::from_millis(700)).await;
    log(started, "host", "supervisor takes over");
    session
        .address()
        .send(Handoff::to(supervisor).interrupting())
        .await?;
    let specials = long.wait_for_playout().await;
    println!("    (the specials: {specials:?})");
    session.wait_for_inactive().await;
    sleep(Duration::from_millis(300)).await;

    let usage = session.usage();
    println!("\nwhat the call used (tokens the model reported; the scripted one reports none):");
    for line in usage.lines() {
        let u = &line.usage;
        println!(
            "  {} on {}: {} requests, {} prompt ({} cached), {} completion",
            line.agent,
            line.model,
            u.requests,
            u.prompt_tokens,
            u.cached_prompt_tokens,
            u.completion_tokens
        );
    }
    println!("how fast each agent answered (end of the user's speech to the first text out):");
    let latency = session.latency();
    for (agent, latency) in &latency {
        if let Some(mean) = latency.end_to_first_audio.mean() {
            println!(
                "  {agent}: {} turns, mean {mean:?}, longest {:?}",
                latency.turns, latency.end_to_first_audio.max
            );
        }
    }

    let history = session.close().await?;
    let mut events = Vec::new();
    while let Ok(event) = seen.try_recv() {
        events.push(event);
    }
    println!("\ntranscript (what each agent's chat context kept):");
    for agent in &history.agents {
        println!("  [{}]", agent.activity);
        for item in agent.chat.items() {
            match item {
                ChatItem::Message(m) => {
                    let cut = if m.interrupted { "  (cut)" } else { "" };
                    println!("    {:?}: {}{cut}", m.role, m.content);
                }
                ChatItem::FunctionCall(c) => println!("    call {} {}", c.call_id, c.arguments),
                ChatItem::FunctionCallOutput(o) => println!("    out  {} {}", o.call_id, o.output),
                ChatItem::AgentHandoff { from, to } => {
                    println!("    handoff {} -> {to}", from.as_deref().unwrap_or("-"))
                }
                other => println!("    {other:?}"),
            }
        }
    }
    if scripted {
        check(&history, &events, &specials)?;
        check_usage(&usage, &latency)?;
        println!("\nchecked: a false interruption resumed, the barge-in cut the speech to what was heard, the booking's result arrived, the supervisor's handoff cut the specials, each agent's requests and latency were counted");
    } else {
        println!(
            "\n(a real model's words and timings differ: the scripted run's checks are skipped)"
        );
    }
    Ok(())
}

/// What the example claims to show, on the scripted model: an error names what did not
/// happen.
fn check(
    history: &SessionHistory,
    events: &[SessionEvent],
    specials: &SpeechOutcome,
) -> Result<(), String> {
    let happened = |what: &str, found: bool| {
        if found {
            Ok(())
        } else {
            Err(format!("the example did not show {what}"))
        }
    };
    happened(
        "a false interruption that resumed the paused speech",
        events
            .iter()
            .any(|e| matches!(e, SessionEvent::AgentFalseInterruption { resumed: true })),
    )?;
    // The barge-in cut the reply that was playing to the words the user heard: a proper,
    // non-empty start of what the agent said, marked interrupted.
    let said = "I am checking with the restaurant now; it usually takes a moment, so bear with me.";
    let concierge = history
        .chat_of("concierge")
        .ok_or("the history has no concierge")?;
    let cut = concierge.items().iter().any(|item| {
        matches!(item, ChatItem::Message(m)
            if m.role == ChatRole::Assistant
                && m.interrupted
                && !m.content.is_empty()
                && m.content.len() < said.len()
                && said.starts_with(&m.content))
    });
    happened(
        "the barge-in cutting the agent's speech to what was heard",
        cut,
    )?;
    happened(
        "the booking's result arriving after the barge-in",
        concierge
            .outputs()
            .any(|out| out.call_id.ends_with("/finished") && out.output.starts_with("Booked")),
    )?;
    happened(
        "the supervisor's handoff",
        events
            .iter()
            .any(|e| matches!(e, SessionEvent::AgentHandoff { to, .. } if to == "supervisor")),
    )?;
    happened(
        "the handoff cutting the specials short",
        matches!(specials, SpeechOutcome::Interrupted { .. }),
    )
}

/// What the example claims of the call's usage and latency: each agent's requests
/// counted (summing to the call's), each agent's first text measured, the supervisor's
/// after the handoff too.
fn check_usage(
    usage: &switchboard::SessionUsage,
    latency: &switchboard::SessionLatency,
) -> Result<(), String> {
    let by_agent = usage.by_agent();
    let mut sum = switchboard::Usage::default();
    for agent in by_agent.values() {
        sum += agent;
    }
    if sum != usage.total() || !by_agent.values().all(|u| u.requests > 0) {
        return Err(format!("the usage by agent does not add up: {by_agent:?}"));
    }
    for agent in ["concierge", "supervisor"] {
        let measured = latency
            .get(agent)
            .is_some_and(|l| l.end_to_first_audio.count > 0);
        if !measured {
            return Err(format!("no latency was measured for {agent}: {latency:?}"));
        }
    }
    Ok(())
}

/// The real model when the environment names one, else the scripted one (and whether it
/// is the scripted one).
fn model() -> Result<(Arc<dyn Llm>, bool), Box<dyn std::error::Error>> {
    let configured = ["OPENAI_API_KEY", "OPENAI_BASE_URL"]
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|v| !v.is_empty()));
    if configured {
        let llm = OpenAiLlm::from_env()?;
        println!("(model {} at {})", llm.model(), llm.endpoint());
        return Ok((Arc::new(llm), false));
    }
    Ok((scripted(), true))
}

/// The scripted model: answers by what the conversation holds, like a real one would.
fn scripted() -> Arc<ScriptedLlm> {
    let llm = ScriptedLlm::new([]);
    llm.rule(|request| {
        let last = request.chat.items().last()?;
        let said = |text: &str| matches!(last, ChatItem::Message(m) if m.content.contains(text));
        if request.agent.as_ref() == "supervisor" {
            return Some(Reply::text("Hi, I am the supervisor. How can I help?"));
        }
        if request.tool_choice == ToolChoice::None {
            return Some(Reply::text("Good news: your table for two is booked at nine."));
        }
        if said("book a table") {
            return Some(
                Reply::text("Sure, let me check what is free tonight.")
                    .and_tool_call("book_table", json!({"party": 2, "time": "8pm"})),
            );
        }
        if matches!(last, ChatItem::FunctionCallOutput(_)) {
            return Some(Reply::text(
                "I am checking with the restaurant now; it usually takes a moment, so bear with me.",
            ));
        }
        if said("nine") {
            return Some(Reply::text("Nine it is, I will make sure of it."));
        }
        None
    });
    llm.otherwise(Reply::text("Okay."));
    llm
}

/// Scripted user audio, sent as a host's VAD and STT would.
struct User {
    session: Session,
    started: Instant,
}

impl User {
    /// Speaks `text` for `ms`: started speaking, interim transcripts, stopped, final.
    async fn says(&self, text: &str, ms: u64) {
        log(self.started, "user", &format!("starts saying {text:?}"));
        self.session.user_started_speaking();
        let words: Vec<&str> = text.split(' ').collect();
        let half = words.len() / 2;
        sleep(Duration::from_millis(ms / 2)).await;
        self.session.transcript(words[..half].join(" "), false);
        sleep(Duration::from_millis(ms / 2)).await;
        self.session.user_stopped_speaking();
        self.session.transcript(text, true);
    }

    /// A cough: a short sound, no words.
    async fn coughs(&self) {
        log(self.started, "user", "coughs");
        self.session.user_started_speaking();
        sleep(Duration::from_millis(200)).await;
        self.session.user_stopped_speaking();
    }
}

fn log(started: Instant, who: &str, what: &str) {
    println!("{:>6.2}s {who:>7}  {what}", started.elapsed().as_secs_f64());
}

/// Prints the session's events a voice host cares about.
fn spawn_event_printer(session: &Session, started: Instant) {
    let mut events = session.subscribe();
    tokio::spawn(async move {
        while let Ok(event) = events.recv().await {
            let line = match event {
                SessionEvent::UserInputTranscribed { text, is_final } => {
                    format!(
                        "heard user {}: {text:?}",
                        if is_final { "(final)" } else { "(interim)" }
                    )
                }
                SessionEvent::UserStateChanged {
                    state: UserState::Away,
                } => "user is away".into(),
                SessionEvent::AgentFalseInterruption { resumed } => {
                    format!("false interruption (resumed: {resumed})")
                }
                SessionEvent::TurnInterrupted { agent } => format!("{agent}'s turn interrupted"),
                SessionEvent::FunctionToolsExecuted { outputs, .. } => outputs
                    .iter()
                    .map(|o| format!("tool {} -> {:?}", o.call_id, o.output))
                    .collect::<Vec<_>>()
                    .join("; "),
                SessionEvent::ConversationItemAdded {
                    item: ChatItem::FunctionCallOutput(o),
                    ..
                } if o.call_id.contains('/') => format!("tool {} -> {:?}", o.call_id, o.output),
                SessionEvent::AgentHandoff { from, to } => {
                    format!("handoff {} -> {to}", from.as_deref().unwrap_or("-"))
                }
                _ => continue,
            };
            log(started, "session", &line);
        }
    });
}

/// A fake TTS: plays each speech's text at `chars_per_second`, one speech at a time, and
/// pauses, resumes and stops on request. It reports playout — with the words heard when
/// cut — through the reporter the session attached. The `SpeechOutput` calls come on the
/// engine's thread; they only queue a command for the player task.
struct FakeTts {
    commands: mpsc::UnboundedSender<Command>,
}

enum Command {
    Attach(PlayoutReporter),
    Start(SpeechId, String),
    Text(SpeechId, String),
    Finished(SpeechId),
    Interrupt(SpeechId),
    Pause,
    Resume,
}

impl FakeTts {
    fn start(chars_per_second: u64, started: Instant) -> Self {
        let (commands, rx) = mpsc::unbounded_channel();
        tokio::spawn(play(rx, chars_per_second, started));
        Self { commands }
    }

    fn send(&self, command: Command) {
        let _ = self.commands.send(command);
    }
}

impl SpeechOutput for FakeTts {
    fn attach(&mut self, reporter: PlayoutReporter) {
        self.send(Command::Attach(reporter));
    }
    fn speech_started(&mut self, speech: SpeechId, agent: &str) {
        self.send(Command::Start(speech, agent.to_owned()));
    }
    fn speech_chunk(&mut self, speech: SpeechId, text: &str) {
        self.send(Command::Text(speech, text.to_owned()));
    }
    fn speech_finished(&mut self, speech: SpeechId) -> Playout {
        self.send(Command::Finished(speech));
        Playout::Pending
    }
    fn interrupt(&mut self, speech: SpeechId) {
        self.send(Command::Interrupt(speech));
    }
    fn can_pause(&self) -> bool {
        true
    }
    fn pause(&mut self, _speech: SpeechId) {
        self.send(Command::Pause);
    }
    fn resume(&mut self, _speech: SpeechId) {
        self.send(Command::Resume);
    }
}

/// One speech in the player's queue.
struct Playing {
    id: SpeechId,
    agent: String,
    text: String,
    played: usize,
    finished: bool,
}

async fn play(mut commands: mpsc::UnboundedReceiver<Command>, cps: u64, started: Instant) {
    let mut reporter: Option<PlayoutReporter> = None;
    let mut queue: VecDeque<Playing> = VecDeque::new();
    let mut paused = false;
    let mut tick = tokio::time::interval(Duration::from_millis(1_000 / cps));
    // A late tick plays one character late; the default (`Burst`) would play every
    // missed one at once, and on a busy machine a whole speech in an instant.
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            command = commands.recv() => {
                let Some(command) = command else { return };
                match command {
                    Command::Attach(r) => reporter = Some(r),
                    Command::Start(id, agent) => queue.push_back(Playing {
                        id, agent, text: String::new(), played: 0, finished: false,
                    }),
                    Command::Text(id, text) => {
                        if let Some(p) = queue.iter_mut().find(|p| p.id == id) {
                            p.text.push_str(&text);
                        }
                    }
                    Command::Finished(id) => {
                        if let Some(p) = queue.iter_mut().find(|p| p.id == id) {
                            p.finished = true;
                        }
                    }
                    Command::Pause => {
                        paused = true;
                        log(started, "tts", "paused");
                    }
                    Command::Resume => {
                        paused = false;
                        log(started, "tts", "resumed");
                    }
                    Command::Interrupt(id) => {
                        paused = false;
                        let at = queue.iter().position(|p| p.id == id);
                        if let Some(cut) = at.and_then(|at| queue.remove(at)) {
                            // What was heard: the words played so far, whole words only.
                            let heard = cut.text[..cut.played]
                                .rsplit_once(' ')
                                .map(|(words, _)| words.to_owned())
                                .unwrap_or_default();
                            log(started, &cut.agent, &format!("(cut) {heard:?}"));
                            if let Some(r) = &reporter {
                                r.playout_finished(id, true, Some(heard));
                            }
                        }
                    }
                }
            }
            _ = tick.tick(), if !paused && !queue.is_empty() => {
                let Some(front) = queue.front_mut() else { continue };
                if let Some(next) = front.text[front.played..].chars().next() {
                    front.played += next.len_utf8();
                } else if front.finished {
                    if let Some(done) = queue.pop_front() {
                        log(started, &done.agent, &format!("{:?}", done.text));
                        if let Some(r) = &reporter {
                            r.playout_finished(done.id, false, None);
                        }
                    }
                }
            }
        }
    }
}
