//! The companion of `docs/testing.md` ("Testing an agent"): the guide's examples, as
//! tests that compile and pass. Copy this file into your own crate's `tests/` as a
//! starting point: it needs `switchboard`, `tokio` (features `rt`, `time`, `test-util`),
//! `serde`, `serde_json` and `schemars` as dev-dependencies.
//!
//! No network, no key, no sleeps: the model is a [`ScriptedLlm`], and a test waits for
//! what it needs (a [`Gate`] it opens, an event, [`settled`]), never for a duration.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use switchboard::prelude::*;
use switchboard::testing::{
    event, settled, silence, tone, EventWaiter, Gate, RealtimeReply, RealtimeScript,
    RecordingOutput, Reply, RunExpect, RunResultExt, ScriptedLlm, ScriptedRealtime,
};
use switchboard::ToolChoice;

// ---- the tools of the examples -----------------------------------------------------

/// Arguments of `get_weather`.
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct WeatherArgs {
    /// The city.
    city: String,
}

fn get_weather() -> Tool {
    Tool::new(
        "get_weather",
        "The weather in a city",
        |_ctx: RunContext, args: WeatherArgs| async move {
            Ok::<_, ToolFailure>(format!("sunny in {}", args.city))
        },
    )
}

/// Arguments of `book_table`.
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct BookingArgs {
    /// How many people.
    guests: u32,
}

/// A tool whose real body must not run in a test: it counts its runs.
fn book_table(real_runs: Arc<AtomicUsize>) -> Tool {
    Tool::new(
        "book_table",
        "Books a table",
        move |_ctx: RunContext, args: BookingArgs| {
            let real_runs = real_runs.clone();
            async move {
                real_runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, ToolFailure>(format!("real booking for {}", args.guests))
            }
        },
    )
}

/// Arguments of `search_flights`.
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct SearchArgs {
    /// Where to.
    to: String,
}

/// An async tool: its first update answers the model at once, then it goes on in the
/// background until the test opens `gate`, and returns.
fn search_flights(gate: Gate) -> Tool {
    Tool::new(
        "search_flights",
        "Searches flights",
        move |ctx: RunContext, args: SearchArgs| {
            let gate = gate.clone();
            async move {
                ctx.update(format!("searching flights to {}", args.to))
                    .await?;
                gate.wait().await;
                Ok::<_, ToolFailure>("3 flights found")
            }
        },
    )
}

// ---- the tests ---------------------------------------------------------------------

#[switchboard::test]
async fn a_tool_turn_with_the_scripted_llm_and_fluent_assertions() {
    let llm = ScriptedLlm::new([
        Reply::tool_call("get_weather", json!({"city": "Paris"})),
        Reply::text("It is sunny in Paris."),
    ]);
    let agent = Agent::builder("agent-a")
        .instructions("You are a weather bot.")
        .tool(get_weather())
        .build()
        .unwrap();
    let session = Session::builder()
        .llm(llm.clone())
        .agent(agent)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();

    let result = session.run("What's the weather in Paris?").await.unwrap();

    let mut expect = result.expect();
    expect
        .next_event()
        .is_message(ChatRole::User)
        .with_content("What's the weather in Paris?");
    let call_id = expect
        .next_event()
        .is_function_call("get_weather")
        .with_args(json!({"city": "Paris"}))
        .call_id();
    expect
        .next_event()
        .is_function_call_output()
        .for_call(call_id)
        .not_error()
        .with_output("sunny in Paris");
    expect
        .next_event()
        .is_message(ChatRole::Assistant)
        .containing("sunny");
    expect.no_more_events();

    // What the model was shown.
    let requests = llm.requests();
    assert_eq!(requests.len(), 2);
    let first = &requests[0];
    assert_eq!(&*first.instructions, "You are a weather bot.");
    assert_eq!(first.tool_choice, ToolChoice::Auto);
    assert_eq!(first.tools.len(), 1);
    assert_eq!(first.tools[0].name, "get_weather");
    assert_eq!(first.tools[0].parameters["required"], json!(["city"]));
    assert_eq!(
        first.tools[0].parameters["properties"]["city"]["type"],
        "string"
    );
    // The second request has the tool's output in view.
    RunExpect::from_items(requests[1].chat.items())
        .contains_function_call_output_for("call_1")
        .with_output("sunny in Paris");
    assert_eq!(llm.remaining(), 0, "every scripted reply was used");
    session.close().await.unwrap();
}

#[switchboard::test]
async fn the_scripted_llm_answers_by_index_by_rule_or_otherwise() {
    let llm = ScriptedLlm::new([Reply::text("Welcome!")]);
    llm.when_user_says("opening hours", Reply::text("We open at 9."));
    llm.on_request(2, Reply::text("Closed on Sundays."));
    let session = Session::builder()
        .llm(llm.clone())
        .agent(Agent::builder("agent-a").build().unwrap())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();

    // Request 0: no index reply, no rule matches: the script.
    let hello = session.run("hello").await.unwrap();
    assert_eq!(hello.assistant_messages().collect::<Vec<_>>(), ["Welcome!"]);
    // Request 1: the rule.
    let hours = session.run("What are your opening hours?").await.unwrap();
    assert_eq!(
        hours.assistant_messages().collect::<Vec<_>>(),
        ["We open at 9."]
    );
    // Request 2: the reply set for its index comes first.
    let sunday = session.run("And on Sundays?").await.unwrap();
    assert_eq!(
        sunday.assistant_messages().collect::<Vec<_>>(),
        ["Closed on Sundays."]
    );

    // Nothing left: the turn fails with what the model was shown, the session stays up.
    let error = session.run("thanks").await.unwrap_err();
    match error.llm_error() {
        Some(llm_error) => {
            assert!(
                llm_error.to_string().contains("unexpected request"),
                "{llm_error}"
            );
            assert!(llm_error.to_string().contains("thanks"), "{llm_error}");
        }
        None => panic!("expected an LLM error, got {error}"),
    }

    // A fallback answers whatever nothing else does.
    llm.otherwise(Reply::text("Sorry, I did not get that."));
    let fallback = session.run("thanks").await.unwrap();
    fallback
        .expect()
        .contains_message(ChatRole::Assistant)
        .with_content("Sorry, I did not get that.");
    assert_eq!(llm.request_count(), 5);
    session.close().await.unwrap();
}

#[switchboard::test]
async fn a_mock_tool_replaces_the_body_in_one_session_only() {
    let real_runs = Arc::new(AtomicUsize::new(0));
    let engine = Engine::current().unwrap();
    let script = || {
        let llm = ScriptedLlm::new([Reply::tool_call("book_table", json!({"guests": 4}))]);
        llm.otherwise(Reply::text("Booked."));
        llm
    };
    let agent = Agent::builder("agent-a")
        .tool(book_table(real_runs.clone()))
        .build()
        .unwrap();

    // This session mocks the tool: same name, schema and policies; another body.
    let llm = script();
    let mocked = Session::builder()
        .llm(llm.clone())
        .agent(agent.clone())
        .mock_tool("book_table", |_ctx: RunContext, args: Value| async move {
            Ok::<_, ToolFailure>(format!("mock booking for {}", args["guests"]))
        })
        .start(&engine)
        .await
        .unwrap();
    let result = mocked.run("a table for four").await.unwrap();
    result
        .expect()
        .contains_function_call("book_table")
        .has_output()
        .with_output("mock booking for 4");
    // The model saw the real tool's schema.
    assert_eq!(
        llm.requests()[0].tools[0].parameters["required"],
        json!(["guests"])
    );
    mocked.close().await.unwrap();

    // Another session, without the mock, runs the real body.
    let real = Session::builder()
        .llm(script())
        .agent(agent)
        .start(&engine)
        .await
        .unwrap();
    let result = real.run("a table for four").await.unwrap();
    result
        .expect()
        .contains_function_call("book_table")
        .has_output()
        .with_output("real booking for 4");
    real.close().await.unwrap();
    assert_eq!(real_runs.load(Ordering::SeqCst), 1, "only the unmocked run");
}

#[switchboard::test]
async fn an_async_tool_finishes_in_the_background() {
    let gate = Gate::new();
    let llm = ScriptedLlm::new([
        Reply::tool_call("search_flights", json!({"to": "Oslo"})),
        Reply::text("Searching now."),
    ]);
    // The deferred reply to the tool's result is the request with tools off.
    llm.rule(|request| {
        (request.tool_choice == ToolChoice::None).then(|| Reply::text("I found 3 flights."))
    });
    let agent = Agent::builder("agent-a")
        .tool(search_flights(gate.clone()))
        .build()
        .unwrap();
    let session = Session::builder()
        .llm(llm.clone())
        .agent(agent)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();

    let result = session.run("flights to Oslo?").await.unwrap();
    // The first update was the call's output; the tool still runs.
    result
        .expect()
        .contains_function_call_output_for("call_1")
        .with_output("Update from search_flights: searching flights to Oslo");
    assert_eq!(llm.request_count(), 2);

    gate.open();
    settled(&session, Duration::from_secs(5)).await.unwrap();

    let chat = session.chat_context().await.unwrap();
    assert_eq!(
        chat.output_of("call_1/finished").unwrap().output,
        "3 flights found"
    );
    let requests = llm.requests();
    assert_eq!(requests.len(), 3, "exactly one deferred reply");
    let deferred = &requests[2];
    assert_eq!(deferred.tool_choice, ToolChoice::None);
    assert_eq!(deferred.deferred_call_ids, ["call_1/finished"]);
    RunExpect::from_items(chat.items())
        .contains_message(ChatRole::Assistant)
        .with_content("Searching now.");
    assert_eq!(
        chat.items().last().and_then(ChatItem::text),
        Some("I found 3 flights.")
    );
    chat.check_invariant().unwrap();
    session.close().await.unwrap();
}

#[switchboard::test]
async fn a_held_request_lets_the_test_act_while_the_model_thinks() {
    let llm = ScriptedLlm::new([Reply::text("Your balance is 12 euros.")]);
    let held = llm.hold(0); // the first request streams only once released
    let session = Session::builder()
        .llm(llm.clone())
        .agent(Agent::builder("agent-a").build().unwrap())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let s = session.clone();
    let turn = tokio::spawn(async move { s.run("what is my balance?").await });

    let request = held.requested(Duration::from_secs(5)).await.unwrap();
    assert_eq!(
        request.chat.items().last().and_then(ChatItem::text),
        Some("what is my balance?")
    );
    assert_eq!(session.agent_state(), AgentState::Thinking);
    // The user gives up while the model thinks: the request is dropped, nothing was said.
    session.interrupt().await.unwrap();
    let result = turn.await.unwrap().unwrap();
    assert!(result.interrupted);
    assert_eq!(result.assistant_messages().count(), 0);
    session.close().await.unwrap();
}

#[switchboard::test]
async fn with_voice_io_the_deferred_reply_waits_for_the_playout() {
    let gate = Gate::new();
    let llm = ScriptedLlm::new([
        Reply::tool_call("search_flights", json!({"to": "Oslo"})),
        Reply::text("Searching now."),
        Reply::text("I found 3 flights."),
    ]);
    let out = RecordingOutput::manual_playout();
    let agent = Agent::builder("agent-a")
        .tool(search_flights(gate.clone()))
        .build()
        .unwrap();
    let session = Session::builder()
        .llm(llm.clone())
        .agent(agent)
        .output(out.clone())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let mut events = EventWaiter::new(&session); // subscribe before acting

    // The turn ends when its last speech has played out, so it runs in a task.
    let s = session.clone();
    let turn = tokio::spawn(async move { s.run("flights to Oslo?").await });
    let speech = events.next(event::speech_created()).await.unwrap().id();

    // While "Searching now." plays, the tool returns: its result waits for the playout.
    gate.open();
    events
        .next(event::output_added("call_1/finished"))
        .await
        .unwrap();
    assert_eq!(llm.request_count(), 2, "no reply while the agent speaks");
    let spoken = out.last_speech().unwrap();
    assert_eq!(
        (spoken.id, spoken.text.as_str()),
        (speech, "Searching now.")
    );

    out.played_out(speech);
    turn.await.unwrap().unwrap();
    // Right after the playout, the deferred reply: a second speech.
    let reply = events.next(event::speech_created()).await.unwrap().id();
    assert_eq!(out.last_speech().unwrap().text, "I found 3 flights.");
    out.played_out(reply);
    settled(&session, Duration::from_secs(5)).await.unwrap();

    assert_eq!(llm.request_count(), 3);
    assert_eq!(llm.requests()[2].tool_choice, ToolChoice::None);
    session
        .chat_context()
        .await
        .unwrap()
        .check_invariant()
        .unwrap();
    session.close().await.unwrap();
}

#[switchboard::test]
async fn a_handoff_stops_the_old_agents_tool_runs() {
    // Paused time reaches the session's actors (they run on this test's arbiter): the
    // 2 s grace period below passes at once, and `elapsed()` measures it.
    tokio::time::pause();
    let agent_b = Agent::builder("agent-b").build().unwrap();
    let to_b = agent_b.clone();
    let transfer = Tool::new(
        "transfer",
        "Transfers to agent B",
        move |_ctx: RunContext, _: NoArgs| {
            let to_b = to_b.clone();
            async move { Ok::<_, ToolFailure>(Handoff::to(to_b)) }
        },
    );
    // A background tool that ignores cancellation: dropped at the grace period.
    let watch = Tool::new(
        "watch_door",
        "Watches the door",
        |ctx: RunContext, _: NoArgs| async move {
            ctx.update("watching").await?;
            std::future::pending::<()>().await;
            Ok::<_, ToolFailure>(())
        },
    );
    let agent_a = Agent::builder("agent-a")
        .tool(transfer)
        .tool(watch)
        .build()
        .unwrap();
    let llm = ScriptedLlm::new([
        Reply::tool_call("watch_door", json!({})),
        Reply::text("Watching the door."),
        Reply::tool_call("transfer", json!({})),
    ]);
    let session = Session::builder()
        .llm(llm)
        .agent(agent_a)
        .toolset(Toolset::new("booking").tool(book_table(Arc::default())))
        .grace_period(Duration::from_secs(2))
        .inspect(true)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let inspector = session.inspector().unwrap();

    session.run("watch the door").await.unwrap();
    // A run's id holds the model's call id; find it by its tool instead of guessing.
    assert_eq!(inspector.runs_of_tool("watch_door"), ["tool/s1/1:call_1"]);
    assert_eq!(
        inspector.live_actors(),
        [
            "activity/s1/agent-a#1",
            "session/s1",
            "tool/s1/1:call_1",
            "toolset/s1/agent-a#1/tools",
            "toolset/s1/booking",
        ]
    );

    let started = tokio::time::Instant::now();
    let s = session.clone();
    let turn = tokio::spawn(async move { s.run("transfer me").await });
    // The run is told to stop, but ignores it: alive until the grace period ends.
    inspector
        .wait_for("tool/s1/1:call_1", "StopRun", Duration::from_secs(5))
        .await
        .unwrap();
    assert!(inspector.is_alive("tool/s1/1:call_1"));

    let result = turn.await.unwrap().unwrap();
    result
        .expect()
        .contains_agent_handoff("agent-b")
        .with_from("agent-a");
    assert!(started.elapsed() >= Duration::from_secs(2));
    inspector.assert_stopped("tool/s1/1:call_1").unwrap();
    inspector
        .assert_stopped("toolset/s1/agent-a#1/tools")
        .unwrap();
    inspector.assert_stopped("activity/s1/agent-a#1").unwrap();
    assert!(inspector
        .actors_of_agent("agent-a")
        .iter()
        .all(|id| !inspector.is_alive(id.as_str())));
    // The session-scoped toolset survives the handoff.
    assert_eq!(
        inspector.live_actors(),
        ["activity/s1/agent-b#1", "session/s1", "toolset/s1/booking"]
    );
    let kinds: Vec<&str> = inspector
        .received("tool/s1/1:call_1")
        .unwrap()
        .iter()
        .map(|received| received.kind)
        .collect();
    assert_eq!(kinds, ["ToolUpdate", "StopRun"]);
    assert_eq!(inspector.pending("session/s1").unwrap(), 0);

    session.close().await.unwrap();
    inspector.assert_stopped("session/s1").unwrap();
    // The traffic as a Mermaid sequence diagram: no timestamps, stable across runs, so
    // it can be compared with a golden file (see `tests/mailbox_inspection.rs`).
    let diagram = inspector.mermaid();
    assert!(diagram.starts_with("sequenceDiagram\n"));
    assert!(diagram.contains("    participant A4 as tool/s1/1:call_1\n"));
    assert!(diagram.contains("    A3->>A4: StopRun\n    A4->>A3: RunEnded\n"));
}

// ---- 9. Realtime models --------------------------------------------------------------

#[switchboard::test]
async fn a_realtime_agent_against_the_scripted_server() {
    tokio::time::pause();
    // The server's replies in order: a call, then the spoken answer with its transcript.
    let model = ScriptedRealtime::new(
        RealtimeScript::new([
            RealtimeReply::call("get_weather", json!({"city": "Paris"})),
            RealtimeReply::speech("It is sunny in Paris.").chunks(10),
        ])
        .user_transcript("What is the weather in Paris?"),
    );
    let output = RecordingOutput::new();
    let session = Session::builder()
        .realtime(model.shared())
        .agent(
            Agent::builder("assistant")
                .tool(get_weather())
                .build()
                .unwrap(),
        )
        .output(output.clone())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let mut events = EventWaiter::new(&session).with_timeout(Duration::from_secs(30));

    // The caller speaks: 300 ms of a tone, then silence, which ends the turn.
    let mut microphone = session.audio_input();
    for _ in 0..15 {
        microphone.push(&tone(20));
    }
    for _ in 0..15 {
        microphone.push(&silence(20));
    }
    microphone.flush();

    let said = events
        .next(event::item_added("the spoken answer", |item| match item {
            ChatItem::Message(m) if m.role == ChatRole::Assistant => Some(m.content.clone()),
            _ => None,
        }))
        .await
        .unwrap()
        .1;
    assert_eq!(said, "It is sunny in Paris.");
    session.wait_for_settled().await.unwrap();

    // The chat: the user's words (the server's transcript), the call, its output, the answer.
    let chat = session.chat_context().await.unwrap();
    chat.check_invariant().unwrap();
    let user = chat.items().iter().find_map(|item| match item {
        ChatItem::Message(m) if m.role == ChatRole::User => Some(m.content.clone()),
        _ => None,
    });
    assert_eq!(user.as_deref(), Some("What is the weather in Paris?"));
    assert!(output.last_speech().unwrap().audio_bytes > 0);

    // What the server saw: nothing the service would refuse, the output sent before the
    // one `response.create` that asked for the answer.
    let report = model.report();
    assert_eq!(report.violations_total(), 0, "{:?}", report.violations);
    assert_eq!(report.events_of("response.create").len(), 1);
    let output_item = report
        .events_of("conversation.item.create")
        .into_iter()
        .find(|e| e["item"]["type"] == "function_call_output")
        .cloned()
        .unwrap();
    assert_eq!(output_item["item"]["output"], "sunny in Paris");
    session.close().await.unwrap();
}
