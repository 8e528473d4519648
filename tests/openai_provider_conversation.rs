//! SPEC §13 end to end: a real `Session` on the OpenAI-compatible provider, against the
//! loopback server that checks every request as the real API does. A multi-turn
//! conversation with an async tool that sends two updates (the second one and its result
//! arrive later as `/update_1` and `/finished`), a handoff by a tool whose call id the model
//! repeats (`~2`), and a deferred reply under the new agent; then barge-ins that close the
//! HTTP request while the model still streams.
#![cfg(feature = "openai")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
#[path = "support/openai_server.rs"]
mod openai_server;

use std::sync::Arc;

use common::{assert_invariant, call_ids, output, wait_event, wait_on};
use openai_server::{reply, FakeOpenAi};
use serde_json::Value;
use switchboard::prelude::*;
use switchboard::providers::openai::OpenAiLlm;
use switchboard::testing::{event, Gate, RecordingOutput};
use switchboard::NoArgs;

/// A 35-character id, as some compatible servers write them: with `/update_1` it is too
/// long for OpenAI and goes out hashed.
const BOOK_ID: &str = "call_Rb7Tq2Lx9Vm4Np1Kc8Wz3Hs6Jd5Fg0Y";

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Booking {
    party: u32,
    time: String,
}

/// The model: answers by what the request ends with, like a real one would.
fn model(body: &Value) -> Option<openai_server::Answer> {
    let messages = body["messages"].as_array()?;
    let last = messages.last()?;
    let content = last["content"].as_str().unwrap_or_default();
    Some(
        match (last["role"].as_str()?, body["tool_choice"].as_str()) {
            ("user", _) if content.contains("Book") => {
                reply::tool_calls(&[(BOOK_ID, "book_table", r#"{"party":2,"time":"8pm"}"#)])
            }
            // The model repeats an id it used before; the engine makes it unique.
            ("user", _) if content.contains("concierge") => {
                reply::tool_calls(&[(BOOK_ID, "transfer", "{}")])
            }
            ("user", _) => reply::text(&["You're", " welcome", "."]),
            ("tool", Some("none")) => reply::text(&["Update", ": ", content]),
            ("tool", _) => reply::text(&["I'm checking", " availability."]),
            _ => return None,
        },
    )
}

#[actix::test]
async fn a_conversation_with_updates_and_a_handoff_runs_against_the_real_wire_format() {
    let server = FakeOpenAi::start().await;
    server.respond_with(model);
    let llm = OpenAiLlm::builder()
        .base_url(server.base_url())
        .api_key("sk-test")
        .model("gpt-4.1-mini")
        .build()
        .unwrap();

    let (found, confirmed) = (Gate::new(), Gate::new());
    let (f, c) = (found.clone(), confirmed.clone());
    let book_table = Tool::new(
        "book_table",
        "Books a table",
        move |ctx: RunContext, args: Booking| {
            let (f, c) = (f.clone(), c.clone());
            async move {
                ctx.update("checking availability").await?; // the immediate output
                f.wait().await;
                ctx.update(format!(
                    "a table for {} is free at {}",
                    args.party, args.time
                ))
                .await?; // `/update_1`
                c.wait().await;
                Ok::<_, ToolFailure>("booked: table 12") // `/finished`
            }
        },
    );
    let concierge = Agent::builder("concierge")
        .instructions("You are the concierge.")
        .build()
        .unwrap();
    let to_concierge = concierge.clone();
    let transfer = Tool::new(
        "transfer",
        "Transfers to the concierge",
        move |_ctx: RunContext, _: NoArgs| {
            let agent = to_concierge.clone();
            async move { Ok::<_, ToolFailure>(Handoff::to(agent)) }
        },
    );
    let receptionist = Agent::builder("receptionist")
        .instructions("You are the receptionist.")
        .tool(transfer)
        .build()
        .unwrap();
    let io = RecordingOutput::new();
    let session = Session::builder()
        .llm(Arc::new(llm))
        .agent(receptionist)
        .toolset(Toolset::new("booking").tool(book_table))
        .inherit_chat_context(true)
        .output(io.clone())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let mut events = session.subscribe();

    // Turn 1: the call, its immediate output, and the model's text about it.
    let result = session.run("Book a table for two at 8pm").await.unwrap();
    assert_eq!(
        result.assistant_messages().collect::<Vec<_>>(),
        ["I'm checking availability."]
    );
    assert_eq!(server.requests().len(), 2);

    // The second update arrives later: `/update_1` and a deferred reply without tools.
    found.open();
    let update_1 = Box::leak(format!("{BOOK_ID}/update_1").into_boxed_str());
    wait_on(&mut events, event::output_added(update_1)).await;
    server.wait_for_requests(3).await;
    session.wait_for_inactive().await;
    let deferred = &server.requests()[2].body;
    assert_eq!(deferred["tool_choice"], "none");

    // Turn 2: a handoff by a call whose id the model repeated.
    session
        .run("Please transfer me to the concierge")
        .await
        .unwrap();
    assert_eq!(session.current_agent().await.unwrap(), "concierge");

    // The booking, session-scoped, finishes under the concierge, who tells the user.
    confirmed.open();
    common::settled(&session).await;
    // Turn 3, to the concierge.
    let result = session.run("Thanks!").await.unwrap();
    assert_eq!(
        result.assistant_messages().collect::<Vec<_>>(),
        ["You're welcome."]
    );

    server.assert_none_refused();
    let requests = server.requests();
    assert_eq!(
        requests.len(),
        6,
        "2 + deferred + transfer + deferred + thanks"
    );
    let system = |i: usize| requests[i].body["messages"][0]["content"].clone();
    assert!(system(3)
        .as_str()
        .unwrap()
        .starts_with("You are the receptionist."));
    assert!(system(4)
        .as_str()
        .unwrap()
        .starts_with("You are the concierge."));
    assert_eq!(requests[4].body["tool_choice"], "none");

    // The chat keeps canonical ids; the wire carried mapped ones.
    let chat = session.chat_context().await.unwrap();
    assert_invariant(&chat);
    let ids = call_ids(&chat);
    for id in [
        format!("call {BOOK_ID}"),
        format!("call {BOOK_ID}/update_1"),
        format!("call {BOOK_ID}~2"),
        format!("call {BOOK_ID}/finished"),
    ] {
        assert!(ids.contains(&id), "{id} not in {ids:?}");
    }
    assert_eq!(
        output(&chat, &format!("{BOOK_ID}/finished")),
        "booked: table 12"
    );
    let last = &requests[5].body;
    let wire_ids: Vec<&str> = last["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["tool_call_id"].as_str())
        .collect();
    assert_eq!(wire_ids.len(), 4, "{wire_ids:?}");
    assert!(wire_ids.contains(&BOOK_ID));
    assert!(wire_ids.contains(&format!("{BOOK_ID}-t2").as_str()));
    assert!(wire_ids
        .iter()
        .all(|id| id.len() <= 40 && !id.contains('/')));

    // What the user heard was streamed to the I/O.
    let heard: Vec<String> = io.speeches().into_iter().map(|s| s.text).collect();
    assert!(
        heard.contains(&"I'm checking availability.".to_owned()),
        "{heard:?}"
    );
    assert!(heard.contains(&"You're welcome.".to_owned()), "{heard:?}");
    assert!(
        heard.contains(&"Update: booked: table 12".to_owned()),
        "the concierge told the result: {heard:?}"
    );
    assert!(
        heard
            .iter()
            .any(|t| t.contains("a table for 2 is free at 8pm")),
        "{heard:?}"
    );
    session.close().await.unwrap();
}

/// A barge-in while the model streams: the LLM stream is dropped, the server sees the
/// connection closed, and the next turn's request is accepted (no empty assistant message,
/// every call answered).
/// The user barges in while the model still streams: the HTTP request is closed at once,
/// the chat keeps what was heard (an assistant message cut short, or none when nothing was
/// heard), and the next requests — which carry it — are accepted by the server.
#[actix::test]
async fn a_barge_in_closes_the_request_and_the_next_requests_are_accepted() {
    // Real time: the server speaks real HTTP, and paused time would jump the engine's
    // timeouts while the runtime waits on sockets.
    let server = FakeOpenAi::start().await;
    let stalls_after = |pieces: &[&str], keep: usize| {
        // The role chunk, `keep` pieces, then nothing more: the model is still "talking".
        reply::text(pieces).insert(1 + keep, openai_server::Part::Stall)
    };
    server.push([
        stalls_after(&["Our specials", " today are", " soup and fish."], 2),
        stalls_after(&["Certainly", ", let me", " check."], 1),
        reply::text(&["Sure."]),
    ]);
    let llm = OpenAiLlm::builder()
        .base_url(server.base_url())
        .api_key("sk-test")
        .model("gpt-4.1-mini")
        .build()
        .unwrap();
    let out = RecordingOutput::manual_playout().pausable();
    let session = Session::builder()
        .llm(Arc::new(llm))
        .agent(Agent::builder("waiter").build().unwrap())
        .output(out.clone())
        .min_interruption_duration(std::time::Duration::ZERO)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let mut events = session.subscribe();
    let speech_created = |e: &SessionEvent| match e {
        SessionEvent::SpeechCreated { speech, .. } => Some(speech.id()),
        _ => None,
    };

    // Heard in part.
    let turn = common::spawn_turn(&session, "what are the specials?");
    let speech = wait_event(&mut events, speech_created).await;
    session.user_started_speaking();
    server.wait_for_aborted(1).await;
    out.heard(speech, "Our specials");
    let result = turn.await.unwrap().unwrap();
    assert!(result.interrupted);
    assert_eq!(
        result.assistant_messages().collect::<Vec<_>>(),
        ["Our specials"]
    );
    session.user_stopped_speaking();

    // Nothing heard: no assistant message is kept (an empty one would be refused).
    let turn = common::spawn_turn(&session, "and the wine?");
    let speech = wait_event(&mut events, speech_created).await;
    session.user_started_speaking();
    server.wait_for_aborted(2).await;
    out.heard(speech, "");
    assert!(turn.await.unwrap().unwrap().interrupted);
    session.user_stopped_speaking();

    let turn = common::spawn_turn(&session, "never mind");
    let speech = wait_event(&mut events, speech_created).await;
    out.played_out(speech);
    turn.await.unwrap().unwrap();
    server.assert_none_refused();
    let last = server.requests().pop().unwrap();
    let assistant: Vec<String> = last.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "assistant")
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(assistant, ["Our specials"]);
    let chat = session.chat_context().await.unwrap();
    assert_invariant(&chat);
    session.close().await.unwrap();
}
