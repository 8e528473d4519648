//! The realtime scenarios, written once and run against two servers that speak the OpenAI
//! Realtime protocol and refuse what the service refuses: the scripted model in memory
//! (`realtime_conversations.rs`, paused time) and the real provider over a loopback
//! WebSocket (`realtime_over_a_websocket.rs`, real time). The caller speaks through the
//! session's audio input (a tone, then silence: the server's voice detector ends the
//! turn); the host's output plays the model's audio and reports what was heard.
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    unreachable_pub
)]

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use switchboard::prelude::*;
use switchboard::realtime::{AudioFormat, RealtimeModel, RealtimeSettings};
use switchboard::testing::{
    event, silence, silence_in, tone, tone_in, EventWaiter, Gate, RealtimeReply, RealtimeScript,
    RecordingOutput, SimReport,
};

/// Every scenario as a test against one backend; `pause_time` for a server that runs on
/// tokio's clock (the scripted model), not for one in a thread of its own.
macro_rules! every_scenario_against {
    ($backend:ty, pause_time: $pause:expr) => {
        every_scenario_against!(
            @each $backend, $pause,
            a_tool_call,
            an_unknown_tool_gets_one_output,
            two_parallel_calls_get_one_response,
            an_async_tool_with_updates_during_speech,
            barge_in_mid_audio_truncates_at_the_heard_position,
            barge_in_at_zero_ms_deletes_the_item,
            a_g711_call_cuts_at_the_heard_position,
            a_handoff_on_the_same_socket,
            a_sub_task,
            a_dropped_socket_mid_response_is_replayed,
            a_late_tool_result_is_always_heard,
            a_long_answer_in_one_burst_plays_in_full,
            a_snapshot_mid_call_is_restored_on_another_engine,
            a_step_in_flight_at_a_snapshot_speaks_again_under_its_speech,
        );
    };
    (@each $backend:ty, $pause:expr, $($name:ident),* $(,)?) => {$(
        #[switchboard::test]
        async fn $name() {
            if $pause {
                tokio::time::pause();
            }
            crate::realtime_scenarios::$name::<$backend>().await;
        }
    )*};
}

/// A server that speaks the protocol: a model to give the session, and what it saw.
pub trait Backend: Sized {
    fn start(script: RealtimeScript) -> Self {
        Self::start_with_settings(script, RealtimeSettings::new())
    }
    fn start_with_settings(script: RealtimeScript, settings: RealtimeSettings) -> Self;
    fn model(&self) -> Arc<dyn RealtimeModel>;
    fn report(&self) -> SimReport;
}

pub const WAIT: Duration = Duration::from_secs(30);

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct City {
    pub city: String,
}

/// Plays one user turn: 300 ms of speech, 300 ms of silence.
pub fn speak(session: &Session) {
    let mut mic = session.audio_input();
    for _ in 0..15 {
        mic.push(&tone(20));
    }
    for _ in 0..15 {
        mic.push(&silence(20));
    }
    mic.flush();
}

/// The user starts speaking (and goes on: no silence yet).
pub fn start_speaking(session: &Session) {
    let mut mic = session.audio_input();
    for _ in 0..5 {
        mic.push(&tone(20));
    }
    mic.flush();
}

/// The user stops: silence that ends the turn.
pub fn stop_speaking(session: &Session) {
    let mut mic = session.audio_input();
    for _ in 0..15 {
        mic.push(&silence(20));
    }
    mic.flush();
}

pub fn weather() -> Tool {
    Tool::new(
        "get_weather",
        "The weather in a city",
        |_ctx: RunContext, args: City| async move {
            Ok::<_, ToolFailure>(format!("sunny in {}", args.city))
        },
    )
}

pub async fn start(
    model: Arc<dyn RealtimeModel>,
    agent: Agent,
    output: RecordingOutput,
) -> Session {
    start_with(Session::builder(), model, agent, output).await
}

pub async fn start_with(
    builder: SessionBuilder,
    model: Arc<dyn RealtimeModel>,
    agent: Agent,
    output: RecordingOutput,
) -> Session {
    builder
        .realtime(model)
        .agent(agent)
        .output(output)
        .start(&Engine::current().unwrap())
        .await
        .unwrap()
}

/// The next assistant message added to a chat context.
pub async fn assistant_said(events: &mut EventWaiter) -> String {
    events
        .next(event::item_added(
            "an assistant message",
            |item| match item {
                ChatItem::Message(m) if m.role == ChatRole::Assistant => Some(m.content.clone()),
                _ => None,
            },
        ))
        .await
        .unwrap()
        .1
}

/// Waits until an assistant message that says `text` is added (a cut answer's message
/// comes before it).
pub async fn assistant_says(events: &mut EventWaiter, text: &str) {
    let want = text.to_owned();
    events
        .next(event::item_added(
            format!("the assistant saying {text:?}"),
            move |item| match item {
                ChatItem::Message(m) if m.role == ChatRole::Assistant && m.content == want => {
                    Some(())
                }
                _ => None,
            },
        ))
        .await
        .unwrap();
}

fn no_violations(report: &SimReport) {
    assert_eq!(report.violations_total(), 0, "{:#?}", report.violations);
}

/// The client events' types in order, appends left out.
fn kinds(report: &SimReport) -> Vec<String> {
    report
        .trace
        .iter()
        .map(|(_, e)| e["type"].as_str().unwrap_or_default().to_owned())
        .collect()
}

fn created_items(report: &SimReport) -> Vec<&Value> {
    report
        .events_of("conversation.item.create")
        .into_iter()
        .map(|e| &e["item"])
        .collect()
}

// ---- scenarios -----------------------------------------------------------------------

/// A user turn with a tool call: the call's output, then one `response.create`.
pub async fn a_tool_call<B: Backend>() {
    let backend = B::start(RealtimeScript::new([
        RealtimeReply::call("get_weather", json!({"city": "Paris"})),
        RealtimeReply::speech("It is sunny in Paris."),
    ]));
    let agent = Agent::builder("assistant")
        .instructions("Answer about the weather.")
        .tool(weather())
        .build()
        .unwrap();
    let session = start(backend.model(), agent, RecordingOutput::new()).await;
    let mut events = EventWaiter::new(&session).with_timeout(WAIT);
    speak(&session);
    assert_eq!(assistant_said(&mut events).await, "It is sunny in Paris.");
    session.wait_for_settled().await.unwrap();
    let report = backend.report();
    no_violations(&report);
    let items = created_items(&report);
    assert_eq!(items.len(), 1, "{items:#?}");
    assert_eq!(items[0]["type"], "function_call_output");
    assert_eq!(items[0]["output"], "sunny in Paris");
    let kinds = kinds(&report);
    let output_at = kinds.iter().position(|k| k == "conversation.item.create");
    let create_at = kinds.iter().position(|k| k == "response.create");
    assert!(output_at < create_at, "{kinds:?}");
    assert_eq!(report.events_of("response.create").len(), 1);
    crate::common::assert_invariant(&session.chat_context().await.unwrap());
    session.close().await.unwrap();
}

/// The model calls a tool the agent does not have: the call still gets exactly one
/// output (the error, naming the tools there are), then one `response.create`, and the
/// model answers.
pub async fn an_unknown_tool_gets_one_output<B: Backend>() {
    let backend = B::start(RealtimeScript::new([
        RealtimeReply::call("book_flight", json!({"city": "Paris"})),
        RealtimeReply::speech("I cannot book flights, but I know the weather."),
    ]));
    let agent = Agent::builder("assistant").tool(weather()).build().unwrap();
    let session = start(backend.model(), agent, RecordingOutput::new()).await;
    let mut events = EventWaiter::new(&session).with_timeout(WAIT);
    speak(&session);
    assert_eq!(
        assistant_said(&mut events).await,
        "I cannot book flights, but I know the weather."
    );
    session.wait_for_settled().await.unwrap();
    let report = backend.report();
    no_violations(&report);
    assert!(
        report.benign.is_empty(),
        "no second output: {:?}",
        report.benign
    );
    let outputs: Vec<_> = created_items(&report)
        .into_iter()
        .filter(|i| i["type"] == "function_call_output")
        .map(|i| i["output"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(outputs.len(), 1, "{outputs:?}");
    assert!(
        outputs[0].contains("unknown tool book_flight") && outputs[0].contains("get_weather"),
        "{outputs:?}"
    );
    assert_eq!(report.events_of("response.create").len(), 1);
    crate::common::assert_invariant(&session.chat_context().await.unwrap());
    session.close().await.unwrap();
}

/// Two calls in one response: both outputs, then one `response.create`.
pub async fn two_parallel_calls_get_one_response<B: Backend>() {
    let backend = B::start(RealtimeScript::new([
        RealtimeReply::call("get_weather", json!({"city": "Paris"}))
            .and_call("get_weather", json!({"city": "Rome"})),
        RealtimeReply::speech("Sunny in both."),
    ]));
    let agent = Agent::builder("assistant").tool(weather()).build().unwrap();
    let session = start(backend.model(), agent, RecordingOutput::new()).await;
    let mut events = EventWaiter::new(&session).with_timeout(WAIT);
    speak(&session);
    assert_eq!(assistant_said(&mut events).await, "Sunny in both.");
    session.wait_for_settled().await.unwrap();
    let report = backend.report();
    no_violations(&report);
    let outputs: Vec<_> = created_items(&report)
        .into_iter()
        .filter(|i| i["type"] == "function_call_output")
        .map(|i| i["output"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(outputs, ["sunny in Paris", "sunny in Rome"]);
    let kinds = kinds(&report);
    let last_output = kinds.iter().rposition(|k| k == "conversation.item.create");
    let create = kinds.iter().position(|k| k == "response.create");
    assert!(last_output < create, "{kinds:?}");
    assert_eq!(report.events_of("response.create").len(), 1);
    session.close().await.unwrap();
}

/// An async tool answers at once with its first update, sends another while the model
/// speaks, and finishes: its later items go in as conversation items, and one deferred
/// reply (no tools) tells the user.
pub async fn an_async_tool_with_updates_during_speech<B: Backend>() {
    let backend = B::start(RealtimeScript::new([
        RealtimeReply::call("search_flights", json!({"city": "Lisbon"})),
        RealtimeReply::speech("I am searching for flights to Lisbon for you right now.")
            .paced(Duration::from_millis(20)),
        RealtimeReply::speech("I found three flights to Lisbon."),
    ]));
    let go_on = Gate::new();
    let gate = go_on.clone();
    let search = Tool::new(
        "search_flights",
        "Searches flights",
        move |ctx: RunContext, args: City| {
            let gate = gate.clone();
            async move {
                ctx.update(format!("searching flights to {}", args.city))
                    .await?;
                gate.wait().await;
                ctx.update("halfway through the airlines").await?;
                Ok::<_, ToolFailure>("3 flights found")
            }
        },
    );
    let agent = Agent::builder("assistant").tool(search).build().unwrap();
    let session = start(backend.model(), agent, RecordingOutput::new()).await;
    let mut events = EventWaiter::new(&session).with_timeout(WAIT);
    speak(&session);
    // The model speaks about the search; the tool reports while it does.
    events.next(event::speech_created()).await.unwrap();
    go_on.open();
    assert_eq!(
        assistant_said(&mut events).await,
        "I am searching for flights to Lisbon for you right now."
    );
    assert_eq!(
        assistant_said(&mut events).await,
        "I found three flights to Lisbon."
    );
    session.wait_for_settled().await.unwrap();
    let report = backend.report();
    no_violations(&report);
    let items = created_items(&report);
    let outputs: Vec<_> = items
        .iter()
        .filter(|i| i["type"] == "function_call_output")
        .map(|i| i["output"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(outputs.len(), 3, "{items:#?}");
    assert!(
        outputs[0].contains("searching flights to Lisbon"),
        "{outputs:?}"
    );
    assert!(outputs[1].contains("halfway"), "{outputs:?}");
    assert!(outputs[2].contains("3 flights found"), "{outputs:?}");
    // Each later item is a call of its own with its output right after it.
    let calls: Vec<_> = items
        .iter()
        .filter(|i| i["type"] == "function_call")
        .collect();
    assert_eq!(calls.len(), 2);
    let creates = report.events_of("response.create");
    assert_eq!(
        creates.len(),
        2,
        "the step after the call, then the deferred reply"
    );
    assert_eq!(creates[1]["response"]["tool_choice"], "none");
    crate::common::assert_invariant(&session.chat_context().await.unwrap());
    session.close().await.unwrap();
}

/// The user talks over the answer while it still streams: the server cancels it (no
/// cancel of the engine's), the output stops and reports what was heard, and the item is
/// cut there, clamped to the audio received; the user's turn is answered.
pub async fn barge_in_mid_audio_truncates_at_the_heard_position<B: Backend>() {
    let backend = B::start(RealtimeScript::new([
        RealtimeReply::speech(
            "Once upon a time there was a very long story that nobody wanted to hear in full.",
        )
        .chunks(50)
        .paced(Duration::from_millis(20)),
        RealtimeReply::speech("Sure, go ahead."),
    ]));
    let output = RecordingOutput::manual_playout();
    let agent = Agent::builder("storyteller").build().unwrap();
    let session = start(backend.model(), agent, output.clone()).await;
    let mut events = EventWaiter::new(&session).with_timeout(WAIT);
    speak(&session);
    let story = events.next(event::speech_created()).await.unwrap();
    // The user speaks 200 ms into the story (the scenario's timing, like the peer
    // bench's barge-in delay: virtual time for the scripted model).
    tokio::time::sleep(Duration::from_millis(200)).await;
    start_speaking(&session);
    events.next(event::turn_interrupted()).await.unwrap();
    // The host's output stopped after playing 120 ms of it.
    output.audio_heard(story.id(), Duration::from_millis(120));
    events
        .next(event::matching(
            "the story cut to what was heard",
            |e| match e {
                SessionEvent::ConversationItemChanged { .. } => Some(()),
                _ => None,
            },
        ))
        .await
        .unwrap();
    stop_speaking(&session);
    assistant_says(&mut events, "Sure, go ahead.").await;
    output.played_out(output.last_speech().unwrap().id);
    session.wait_for_settled().await.unwrap();
    let report = backend.report();
    no_violations(&report);
    // The second time the user spoke: over the answer.
    let start = &report.speech_starts[1];
    assert!(start.response_active, "{start:?}");
    assert!(start.server_cancelled);
    assert_eq!(
        start.cancels, 0,
        "the server cancelled it: no second cancel"
    );
    let (end, sent, accepted) = start.truncate.expect("a truncate");
    assert!(accepted);
    assert_eq!(
        end,
        120.min(sent),
        "cut where the user stopped hearing, within what was sent"
    );
    // The chat keeps the share of the story that was heard, marked interrupted.
    let chat = session.chat_context().await.unwrap();
    let cut = chat
        .items()
        .iter()
        .find_map(|i| match i {
            ChatItem::Message(m) if m.interrupted => Some(m.content.clone()),
            _ => None,
        })
        .expect("the story, cut");
    assert!(cut.starts_with("Once"), "{cut:?}");
    assert!(cut.len() < 80, "{cut:?}");
    session.close().await.unwrap();
}

/// A telephony call in G.711 µ-law both ways: the server hears the caller's µ-law, the
/// host's output gets µ-law, and a barge-in cuts the answer at the heard position in
/// milliseconds of µ-law (8 bytes a millisecond, not PCM's 48), which the server accepts.
pub async fn a_g711_call_cuts_at_the_heard_position<B: Backend>() {
    let mut settings = RealtimeSettings::new();
    settings.input_format = AudioFormat::G711Ulaw;
    settings.output_format = AudioFormat::G711Ulaw;
    let backend = B::start_with_settings(
        RealtimeScript::new([
            RealtimeReply::speech("Your parcel left the depot this morning and arrives today.")
                .chunks(40)
                .paced(Duration::from_millis(20)),
            RealtimeReply::speech("Of course."),
        ]),
        settings,
    );
    let output = RecordingOutput::manual_playout();
    let agent = Agent::builder("courier").build().unwrap();
    let session = start(backend.model(), agent, output.clone()).await;
    let mut events = EventWaiter::new(&session).with_timeout(WAIT);
    let caller = |session: &Session, tone_ms: u32, silence_ms: u32| {
        let mut mic = session.audio_input();
        for _ in 0..tone_ms / 20 {
            mic.push(&tone_in(AudioFormat::G711Ulaw, 20));
        }
        for _ in 0..silence_ms / 20 {
            mic.push(&silence_in(AudioFormat::G711Ulaw, 20));
        }
        mic.flush();
    };
    caller(&session, 300, 300);
    let answer = events.next(event::speech_created()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    caller(&session, 100, 0);
    events.next(event::turn_interrupted()).await.unwrap();
    output.audio_heard(answer.id(), Duration::from_millis(100));
    events
        .next(event::matching(
            "the answer cut to what was heard",
            |e| match e {
                SessionEvent::ConversationItemChanged { .. } => Some(()),
                _ => None,
            },
        ))
        .await
        .unwrap();
    caller(&session, 0, 300);
    assistant_says(&mut events, "Of course.").await;
    output.played_out(output.last_speech().unwrap().id);
    session.wait_for_settled().await.unwrap();
    let report = backend.report();
    no_violations(&report);
    assert!(
        report.audio_in_ms >= 700,
        "the caller's µ-law was heard as audio: {report:?}"
    );
    // What reached the host's output is µ-law: its length in ms is its bytes over 8.
    let received = output
        .speeches()
        .into_iter()
        .find(|speech| speech.id == answer.id())
        .unwrap()
        .audio_bytes;
    let start = &report.speech_starts[1];
    let sent = start
        .audio_sent_ms
        .expect("audio was sent before the barge-in");
    assert!(sent > 100, "the barge-in came mid-answer: {start:?}");
    assert_eq!(
        received / 8,
        sent as usize,
        "the output got µ-law: 8 bytes a millisecond of what the server sent"
    );
    let (end, _, accepted) = start.truncate.expect("a truncate");
    assert!(accepted, "{start:?}");
    assert_eq!(
        end,
        100.min(sent),
        "cut at the heard position, in ms of µ-law"
    );
    session.close().await.unwrap();
}

/// The user speaks before any of the answer was heard: the item is deleted (a truncate to
/// 0 is refused), and the chat keeps no message of it.
pub async fn barge_in_at_zero_ms_deletes_the_item<B: Backend>() {
    let backend = B::start(RealtimeScript::new([
        RealtimeReply::speech("A long answer that nobody will hear at all today.")
            .chunks(40)
            .paced(Duration::from_millis(20)),
        RealtimeReply::speech("Yes?"),
    ]));
    let output = RecordingOutput::manual_playout();
    let agent = Agent::builder("assistant").build().unwrap();
    let session = start(backend.model(), agent, output.clone()).await;
    let mut events = EventWaiter::new(&session).with_timeout(WAIT);
    speak(&session);
    let answer = events.next(event::speech_created()).await.unwrap();
    start_speaking(&session);
    events.next(event::turn_interrupted()).await.unwrap();
    output.audio_heard(answer.id(), Duration::ZERO);
    events
        .next(event::matching("the answer removed", |e| match e {
            SessionEvent::ConversationItemRemoved { .. } => Some(()),
            _ => None,
        }))
        .await
        .unwrap();
    stop_speaking(&session);
    assistant_says(&mut events, "Yes?").await;
    output.played_out(output.last_speech().unwrap().id);
    session.wait_for_settled().await.unwrap();
    let report = backend.report();
    no_violations(&report);
    // The second time the user spoke: over the answer.
    let start = &report.speech_starts[1];
    assert!(start.deleted, "{start:?}");
    assert!(start.truncate.is_none(), "{start:?}");
    let chat = session.chat_context().await.unwrap();
    let said: Vec<_> = chat
        .items()
        .iter()
        .filter_map(|i| match i {
            ChatItem::Message(m) if m.role == ChatRole::Assistant => Some(m.content.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(said, ["Yes?"], "nothing heard: no message of it");
    session.close().await.unwrap();
}

/// A tool hands off to an agent of the same model: one connection; the new agent's
/// instructions and tools go as a session update before the call's output and the next
/// response.
pub async fn a_handoff_on_the_same_socket<B: Backend>() {
    let backend = B::start(RealtimeScript::new([
        RealtimeReply::call("transfer_to_billing", json!({})),
        RealtimeReply::speech("Billing here, how can I help?"),
    ]));
    let billing = Agent::builder("billing")
        .instructions("You handle billing.")
        .tool(weather())
        .on_enter(|ctx| async move {
            let _ = ctx.generate_reply("Greet the caller.").await;
        })
        .build()
        .unwrap();
    let transfer = Tool::new(
        "transfer_to_billing",
        "Transfers to billing",
        move |_ctx: RunContext, _: NoArgs| {
            let billing = billing.clone();
            async move { Ok::<_, ToolFailure>(billing) }
        },
    );
    let front = Agent::builder("front")
        .instructions("You route calls.")
        .tool(transfer)
        .build()
        .unwrap();
    let session = start_with(
        Session::builder().inherit_chat_context(true),
        backend.model(),
        front,
        RecordingOutput::new(),
    )
    .await;
    let mut events = EventWaiter::new(&session).with_timeout(WAIT);
    speak(&session);
    events.next(event::handoff_to("billing")).await.unwrap();
    assert_eq!(
        assistant_said(&mut events).await,
        "Billing here, how can I help?"
    );
    session.wait_for_settled().await.unwrap();
    let report = backend.report();
    no_violations(&report);
    assert_eq!(report.connections, 1, "a handoff keeps the socket");
    let trace: Vec<&Value> = report.trace.iter().map(|(_, e)| e).collect();
    let update = trace
        .iter()
        .position(|e| {
            e["type"] == "session.update" && e["session"]["instructions"] == "You handle billing."
        })
        .expect("billing's session update");
    let output = trace
        .iter()
        .position(|e| {
            e["type"] == "conversation.item.create" && e["item"]["type"] == "function_call_output"
        })
        .expect("the transfer's output");
    let create = trace
        .iter()
        .position(|e| e["type"] == "response.create")
        .expect("billing's response");
    assert!(update < output && output < create, "{trace:#?}");
    // The update names billing's tools, and no voice (none was asked).
    let tools = &trace[update]["session"]["tools"];
    assert_eq!(tools[0]["name"], "get_weather");
    session.close().await.unwrap();
}

#[derive(Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct Contact {
    pub email: String,
}

/// A tool runs a sub-task agent of the same model: the task takes the connection (its
/// own instructions and chat), completes, and the caller takes it back with the result
/// as its call's output; one connection throughout.
pub async fn a_sub_task<B: Backend>() {
    let backend = B::start(RealtimeScript::new([
        RealtimeReply::call("collect_email", json!({})),
        RealtimeReply::call("save_email", json!({"email": "ada@example.com"})),
        RealtimeReply::speech("Thanks, I have your email."),
    ]));
    let save = Tool::new(
        "save_email",
        "Saves the email",
        |_ctx: RunContext, args: Contact| async move { ToolReturn::complete_task(&args) },
    );
    let collector = Agent::builder("collector")
        .instructions("Ask for the email.")
        .tool(save)
        .on_enter(|ctx| async move {
            let _ = ctx.generate_reply("Ask for the email.").await;
        })
        .build()
        .unwrap();
    let collect = Tool::new(
        "collect_email",
        "Collects an email",
        move |ctx: RunContext, _: NoArgs| {
            let collector = collector.clone();
            async move {
                let contact: Contact = ctx.run_task(collector).await?;
                Ok::<_, ToolFailure>(format!("email is {}", contact.email))
            }
        },
    );
    let main = Agent::builder("main")
        .instructions("Help the caller.")
        .tool(collect)
        .build()
        .unwrap();
    let session = start(backend.model(), main, RecordingOutput::new()).await;
    let mut events = EventWaiter::new(&session).with_timeout(WAIT);
    speak(&session);
    assert_eq!(
        assistant_said(&mut events).await,
        "Thanks, I have your email."
    );
    session.wait_for_settled().await.unwrap();
    let report = backend.report();
    no_violations(&report);
    assert_eq!(report.connections, 1);
    let instructions: Vec<_> = report
        .events_of("session.update")
        .iter()
        .filter_map(|e| e["session"]["instructions"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(
        instructions,
        ["Help the caller.", "Ask for the email.", "Help the caller."]
    );
    let outputs: Vec<_> = created_items(&report)
        .into_iter()
        .filter(|i| i["type"] == "function_call_output")
        .map(|i| i["output"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        outputs.iter().any(|o| o == "email is ada@example.com"),
        "{outputs:?}"
    );
    crate::common::assert_invariant(&session.chat_context().await.unwrap());
    session.close().await.unwrap();
}

/// The server drops the connection in the middle of an answer: the engine reconnects,
/// replays the conversation as text (with what the model had said), asks the answer
/// again; no audio chunk is played twice and nothing is refused.
pub async fn a_dropped_socket_mid_response_is_replayed<B: Backend>() {
    let backend = B::start(
        RealtimeScript::new([
            RealtimeReply::speech("Here is something nice about the weather today.")
                .chunks(20)
                .drop_after(5),
            RealtimeReply::speech("the weather: the sun is out.").chunks(8),
        ])
        .user_transcript("tell me something nice"),
    );
    let output = RecordingOutput::new();
    let agent = Agent::builder("assistant").build().unwrap();
    let session = start(backend.model(), agent, output.clone()).await;
    let mut events = EventWaiter::new(&session).with_timeout(WAIT);
    speak(&session);
    events
        .next(event::matching("the reconnection", |e| match e {
            SessionEvent::RealtimeReconnecting { .. } => Some(()),
            _ => None,
        }))
        .await
        .unwrap();
    let said = assistant_said(&mut events).await;
    session.wait_for_settled().await.unwrap();
    let report = backend.report();
    no_violations(&report);
    assert_eq!(report.connections, 2);
    // The answer: what was said before the drop, then the rest; one message, one speech.
    assert_eq!(
        said,
        "Here is something nice about the weather: the sun is out."
    );
    let speeches = output.speeches();
    assert_eq!(speeches.len(), 1, "{speeches:#?}");
    assert_eq!(
        speeches[0].audio_bytes,
        (5 + 8) * 960,
        "no chunk twice, none lost"
    );
    // The second connection: set up, the conversation replayed, then the answer asked.
    let second: Vec<&Value> = report
        .trace
        .iter()
        .filter(|(conn, _)| *conn == 2)
        .map(|(_, e)| e)
        .collect();
    assert_eq!(second[0]["type"], "session.update");
    let replayed: Vec<_> = second
        .iter()
        .filter(|e| e["type"] == "conversation.item.create")
        .map(|e| {
            e["item"]["content"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    assert!(
        replayed.contains(&"tell me something nice".to_owned()),
        "{replayed:?}"
    );
    assert!(
        replayed.contains(&"Here is something nice about".to_owned()),
        "{replayed:?}"
    );
    assert_eq!(second.last().unwrap()["type"], "response.create");
    session.close().await.unwrap();
}

/// The user speaks while a slow tool runs (LiveKit's R4): the tool goes on in the
/// background, the user's turn is answered, and when the result comes it is told in a
/// deferred reply, which the engine asks for — the late result is always heard.
pub async fn a_late_tool_result_is_always_heard<B: Backend>() {
    let backend = B::start(RealtimeScript::new([
        RealtimeReply::call("get_weather", json!({"city": "Paris"})),
        RealtimeReply::speech("Sorry, go on."),
        RealtimeReply::speech("It is sunny and twenty one degrees in Paris."),
    ]));
    let done = Gate::new();
    let running = Gate::new();
    let (gate, started) = (done.clone(), running.clone());
    let slow = Tool::new(
        "get_weather",
        "The weather in a city",
        move |_ctx: RunContext, args: City| {
            let (gate, started) = (gate.clone(), started.clone());
            async move {
                started.open();
                gate.wait().await;
                Ok::<_, ToolFailure>(format!("sunny in {}", args.city))
            }
        },
    );
    let agent = Agent::builder("assistant").tool(slow).build().unwrap();
    let session = start(backend.model(), agent, RecordingOutput::new()).await;
    let mut events = EventWaiter::new(&session).with_timeout(WAIT);
    speak(&session);
    tokio::time::timeout(WAIT, running.wait())
        .await
        .expect("the tool to start");
    // The user speaks while the tool runs.
    speak(&session);
    assert_eq!(assistant_said(&mut events).await, "Sorry, go on.");
    done.open();
    assert_eq!(
        assistant_said(&mut events).await,
        "It is sunny and twenty one degrees in Paris."
    );
    session.wait_for_settled().await.unwrap();
    let report = backend.report();
    no_violations(&report);
    let creates = report.events_of("response.create");
    assert_eq!(creates.len(), 1, "the deferred reply: {creates:#?}");
    assert_eq!(creates[0]["response"]["tool_choice"], "none");
    let chat = session.chat_context().await.unwrap();
    crate::common::assert_invariant(&chat);
    assert!(
        chat.outputs().any(|o| o.call_id.ends_with("/finished")),
        "{chat:#?}"
    );
    session.close().await.unwrap();
}

/// A long answer sent in one burst (250 chunks, more than the link reads in one go) is
/// played in full: the link yields between batches and comes back for the rest.
pub async fn a_long_answer_in_one_burst_plays_in_full<B: Backend>() {
    let backend = B::start(RealtimeScript::new([RealtimeReply::speech(
        "Here is something nice: the sun is out and the coffee is still warm today.",
    )
    .chunks(250)]));
    let output = RecordingOutput::new();
    let agent = Agent::builder("assistant").build().unwrap();
    let session = start(backend.model(), agent, output.clone()).await;
    let mut events = EventWaiter::new(&session).with_timeout(WAIT);
    speak(&session);
    assistant_said(&mut events).await;
    session.wait_for_settled().await.unwrap();
    assert_eq!(output.last_speech().unwrap().audio_bytes, 250 * 960);
    no_violations(&backend.report());
    session.close().await.unwrap();
}

/// A call is snapshotted while an async tool runs in the background, and restored on
/// another engine talking to another server: the new connection is set up and the
/// conversation replayed as text (the user's words, the call with its output, what the
/// agent said), the running call follows its restore policy (abandoned: its terminal
/// output, and a deferred reply tells the user), and nothing is refused.
pub async fn a_snapshot_mid_call_is_restored_on_another_engine<B: Backend>() {
    use switchboard::snapshot::AgentRegistry;
    let first = B::start(
        RealtimeScript::new([
            RealtimeReply::call("search_flights", json!({"city": "Lisbon"})),
            RealtimeReply::speech("I am searching for flights to Lisbon."),
        ])
        .user_transcript("find me a flight to Lisbon"),
    );
    let never = Gate::new();
    let search = move || {
        let never = never.clone();
        Tool::new(
            "search_flights",
            "Searches flights",
            move |ctx: RunContext, args: City| {
                let never = never.clone();
                async move {
                    ctx.update(format!("searching flights to {}", args.city))
                        .await?;
                    never.wait().await;
                    Ok::<_, ToolFailure>("3 flights found")
                }
            },
        )
    };
    let agent = |tool: Tool| {
        Agent::builder("travel")
            .instructions("You book travel.")
            .tool(tool)
            .build()
            .unwrap()
    };
    let session = start_with(
        Session::builder().grace_period(Duration::ZERO),
        first.model(),
        agent(search()),
        RecordingOutput::new(),
    )
    .await;
    let mut events = EventWaiter::new(&session).with_timeout(WAIT);
    speak(&session);
    assert_eq!(
        assistant_said(&mut events).await,
        "I am searching for flights to Lisbon."
    );
    session.wait_for_inactive().await;
    let snapshot = session.snapshot().await.unwrap();
    session.close().await.unwrap();
    no_violations(&first.report());

    // Another engine, another server: nothing of the first connection survives.
    let second = B::start(RealtimeScript::new([RealtimeReply::speech(
        "Sorry, the search stopped. Shall I try again?",
    )]));
    let search_again = search();
    let agents = AgentRegistry::new().agent("travel", move |_| {
        Ok::<_, BuildError>(agent(search_again.clone()))
    });
    let output = RecordingOutput::new();
    let restored = Session::builder()
        .realtime(second.model())
        .output(output.clone())
        .grace_period(Duration::ZERO)
        .restore(snapshot, agents)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let mut events = EventWaiter::new(&restored).with_timeout(WAIT);
    assistant_says(&mut events, "Sorry, the search stopped. Shall I try again?").await;
    restored.wait_for_settled().await.unwrap();
    let report = second.report();
    no_violations(&report);
    assert_eq!(report.connections, 1);
    let trace: Vec<&Value> = report.trace.iter().map(|(_, e)| e).collect();
    assert_eq!(trace[0]["type"], "session.update");
    let replayed: Vec<String> = created_items(&report)
        .iter()
        .map(|i| match i["type"].as_str().unwrap() {
            "message" => format!(
                "{}: {}",
                i["role"].as_str().unwrap(),
                i["content"][0]["text"].as_str().unwrap()
            ),
            "function_call" => format!("call {}", i["name"].as_str().unwrap()),
            other => format!("{other}: {}", i["output"].as_str().unwrap_or_default()),
        })
        .collect();
    assert_eq!(replayed[0], "user: find me a flight to Lisbon");
    assert_eq!(replayed[1], "call search_flights");
    assert!(
        replayed[2].starts_with("function_call_output: ")
            && replayed[2].contains("searching flights to Lisbon"),
        "{replayed:?}"
    );
    assert_eq!(
        replayed[3],
        "assistant: I am searching for flights to Lisbon."
    );
    // The abandoned call's terminal output goes in as a call of its own with its output,
    // then the deferred reply is asked, without tools.
    assert!(
        replayed[4..].iter().any(|r| r.contains("nterrupted")),
        "{replayed:?}"
    );
    let creates = report.events_of("response.create");
    assert_eq!(creates.len(), 1);
    assert_eq!(creates[0]["response"]["tool_choice"], "none");
    crate::common::assert_invariant(&restored.chat_context().await.unwrap());
    restored.close().await.unwrap();
}

/// A snapshot while the model's answer still streams: the step had not finished, so the
/// restored session asks it again of a new connection (a response of its own: the new
/// server started none to adopt), and the model's audio plays through the speech the step
/// had — the host sees the same speech go on, not a second one.
pub async fn a_step_in_flight_at_a_snapshot_speaks_again_under_its_speech<B: Backend>() {
    use switchboard::snapshot::AgentRegistry;
    let first = B::start(
        RealtimeScript::new([RealtimeReply::speech(
            "Once upon a time there was a story that took its time to tell.",
        )
        .chunks(100)
        .paced(Duration::from_millis(20))])
        .user_transcript("tell me a story"),
    );
    let agent = || Agent::builder("storyteller").build().unwrap();
    let session = start_with(
        Session::builder().grace_period(Duration::ZERO),
        first.model(),
        agent(),
        RecordingOutput::manual_playout(),
    )
    .await;
    let mut events = EventWaiter::new(&session).with_timeout(WAIT);
    speak(&session);
    let story = events.next(event::speech_created()).await.unwrap();
    let snapshot = session.snapshot().await.unwrap();
    session.close().await.unwrap();

    let second = B::start(RealtimeScript::new([RealtimeReply::speech(
        "Once upon a time there was a story.",
    )]));
    let agents = AgentRegistry::new().agent("storyteller", move |_| Ok::<_, BuildError>(agent()));
    let output = RecordingOutput::new();
    let restored = Session::builder()
        .realtime(second.model())
        .output(output.clone())
        .grace_period(Duration::ZERO)
        .restore(snapshot, agents)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let mut events = EventWaiter::new(&restored).with_timeout(WAIT);
    assistant_says(&mut events, "Once upon a time there was a story.").await;
    restored.wait_for_settled().await.unwrap();
    let speeches = output.speeches();
    assert!(!speeches.is_empty(), "the step asked again spoke nothing");
    assert!(
        speeches.iter().all(|speech| speech.id == story.id()),
        "the step asked again speaks under its speech {:?}: {:?}",
        story.id(),
        speeches.iter().map(|s| s.id).collect::<Vec<_>>()
    );
    assert!(speeches[0].audio_bytes > 0, "the model's audio played");
    let report = second.report();
    no_violations(&report);
    assert_eq!(report.connections, 1);
    assert_eq!(report.events_of("response.create").len(), 1);
    crate::common::assert_invariant(&restored.chat_context().await.unwrap());
    restored.close().await.unwrap();
}
