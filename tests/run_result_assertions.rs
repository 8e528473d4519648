//! SPEC §10: fluent assertions over a turn's `RunResult`. Each assertion passes on a
//! matching event and fails, through its `try_` variant, with a message naming what was
//! expected, what was found, and every event with `>` at the one checked.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{expect, ExpectError, Reply, RunResultExt, ScriptedLlm};
use switchboard::{FunctionCall, FunctionCallOutput, NoArgs};

fn call(call_id: &str, name: &str, arguments: &str) -> ChatItem {
    ChatItem::FunctionCall(FunctionCall {
        call_id: call_id.into(),
        name: name.into(),
        arguments: arguments.into(),
    })
}

fn output(call_id: &str, name: &str, text: &str, is_error: bool) -> ChatItem {
    ChatItem::FunctionCallOutput(FunctionCallOutput {
        call_id: call_id.into(),
        name: name.into(),
        output: text.into(),
        is_error,
    })
}

fn handoff(from: Option<&str>, to: &str) -> ChatItem {
    ChatItem::AgentHandoff {
        from: from.map(Into::into),
        to: to.into(),
    }
}

/// A weather turn: a call, its output, the answer.
fn weather_turn() -> RunResult {
    RunResult {
        events: vec![
            call("call_1", "get_weather", r#"{"city": "Paris", "unit": "c"}"#),
            output("call_1", "get_weather", "sunny, 24 degrees", false),
            ChatItem::message(ChatRole::Assistant, "It is sunny in Paris."),
        ],
        ..Default::default()
    }
}

/// Asserts that an assertion failed and that its message contains every part.
fn assert_fails<T: std::fmt::Debug>(result: Result<T, ExpectError>, parts: &[&str]) -> String {
    let error = result.expect_err("the assertion should have failed");
    let text = error.to_string();
    for part in parts {
        assert!(text.contains(part), "missing {part:?} in:\n{text}");
    }
    text
}

#[test]
fn a_matching_turn_passes_every_assertion() {
    let result = weather_turn();
    let mut expect = result.expect();
    let call = expect
        .next_event()
        .is_function_call("get_weather")
        .with_args(json!({"unit": "c", "city": "Paris"}));
    assert_eq!(call.call_id(), "call_1");
    assert_eq!(call.index(), 0);
    expect
        .next_event()
        .is_function_call_output()
        .for_call(call.call_id())
        .for_tool("get_weather")
        .not_error()
        .containing("sunny")
        .with_output("sunny, 24 degrees");
    let message = expect
        .next_event()
        .is_message(ChatRole::Assistant)
        .containing("Paris")
        .with_content("It is sunny in Paris.");
    assert_eq!(message.content(), "It is sunny in Paris.");
    expect.no_more_events();
    assert_eq!(expect.remaining(), 0);
}

#[test]
fn the_free_function_and_the_try_variants_chain_with_question_marks() -> Result<(), ExpectError> {
    let result = weather_turn();
    let mut expect = expect(&result);
    let id = expect
        .try_next_event()?
        .try_is_function_call("get_weather")?
        .try_with_args(json!({"city": "Paris", "unit": "c"}))?
        .call_id();
    expect
        .try_next_event()?
        .try_is_function_call_output()?
        .try_for_call(id)?
        .try_not_error()?;
    expect
        .try_next_event()?
        .try_is_message(ChatRole::Assistant)?
        .try_with_content("It is sunny in Paris.")?;
    expect.try_no_more_events()
}

#[test]
fn a_wrong_kind_shows_expected_found_and_every_event_with_the_cursor() {
    let result = RunResult {
        events: vec![
            call("call_1", "get_weather", r#"{"city":"Paris"}"#),
            ChatItem::message(ChatRole::Assistant, "Hi"),
        ],
        ..Default::default()
    };
    let mut expect = result.expect();
    expect.next_event().is_function_call("get_weather");
    let error = expect
        .next_event()
        .try_is_function_call("get_weather")
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "expected a function call to `get_weather`, found message (assistant): \"Hi\"\n\
         events:\n  \
         0 function_call get_weather {\"city\":\"Paris\"} (call_1)\n\
         > 1 message assistant \"Hi\""
    );
    assert_eq!(error.expected(), "a function call to `get_weather`");
    assert_eq!(error.found(), "message (assistant): \"Hi\"");
    assert_eq!(error.position(), Some(1));
    // Debug reads the same, so `try_…().unwrap()` fails readably too.
    assert_eq!(format!("{error:?}"), error.to_string());
}

#[test]
fn is_function_call_fails_on_another_name_or_kind() {
    let result = weather_turn();
    assert_fails(
        result
            .expect()
            .next_event()
            .try_is_function_call("get_time"),
        &[
            "expected a function call to `get_time`, found a function call to `get_weather`",
            "> 0 function_call get_weather",
        ],
    );
    assert_fails(
        result.expect().nth(2).try_is_function_call("get_weather"),
        &[
            "found message (assistant): \"It is sunny in Paris.\"",
            "  0 function_call",
            "  1 function_call_output get_weather (call_1) \"sunny, 24 degrees\"",
            "> 2 message assistant",
        ],
    );
}

#[test]
fn with_args_compares_parsed_json() {
    let result = RunResult {
        events: vec![
            call(
                "c1",
                "book",
                r#"{"b": {"y": 2, "x": 1.0}, "a": [1, "two"]}"#,
            ),
            call("c2", "book", "{not json"),
        ],
        ..Default::default()
    };
    let expect = result.expect();
    // Key order does not matter, nor does 1 vs 1.0.
    expect
        .nth(0)
        .is_function_call("book")
        .with_args(json!({"a": [1, "two"], "b": {"x": 1, "y": 2}}));
    assert_fails(
        expect
            .nth(0)
            .is_function_call("book")
            .try_with_args(json!({"a": [1, "two"], "b": {"x": 1, "y": 3}})),
        &[
            r#"expected function call `book` with arguments {"a":[1,"two"],"b":{"x":1,"y":3}}"#,
            r#"found arguments {"a":[1,"two"],"b":{"x":1.0,"y":2}}"#,
            "> 0 function_call book",
        ],
    );
    // An extra key is a mismatch for `with_args`, not for `with_args_including`.
    assert_fails(
        expect
            .nth(0)
            .is_function_call("book")
            .try_with_args(json!({"a": [1, "two"]})),
        &["with arguments {\"a\":[1,\"two\"]}"],
    );
    expect
        .nth(0)
        .is_function_call("book")
        .with_args_including(json!({"b": {"y": 2}}));
    assert_fails(
        expect
            .nth(0)
            .is_function_call("book")
            .try_with_args_including(json!({"c": true})),
        &["with arguments including {\"c\":true}", "found arguments"],
    );
    assert_fails(
        expect
            .nth(1)
            .is_function_call("book")
            .try_with_args(json!({})),
        &[
            "found arguments that are not valid JSON",
            "\"{not json\"",
            "> 1 function_call book \"{not json\" (c2)",
        ],
    );
}

#[test]
fn output_assertions_pass_and_fail_on_each_property() {
    let result = RunResult {
        events: vec![
            call("c1", "load", "{}"),
            output("c1", "load", "Error: database unavailable", true),
        ],
        ..Default::default()
    };
    let out = result.expect().nth(1).is_function_call_output();
    out.is_error()
        .for_call("c1")
        .for_tool("load")
        .containing("database")
        .with_output("Error: database unavailable");
    assert!(out.output().is_error);
    let found = "found error output of `load` (c1): \"Error: database unavailable\"";
    assert_fails(
        out.try_not_error(),
        &["expected an output that is not an error", found],
    );
    assert_fails(
        out.try_with_output("ok"),
        &["expected output \"ok\"", found],
    );
    assert_fails(
        out.try_containing("timeout"),
        &["expected an output containing \"timeout\"", found],
    );
    assert_fails(
        out.try_for_call("c2"),
        &["expected the output of call `c2`", found],
    );
    assert_fails(
        out.try_for_tool("save"),
        &["expected an output of `save`", found],
    );
    assert_fails(
        result.expect().nth(0).try_is_function_call_output(),
        &[
            "expected a function call output, found a function call to `load` with {} (c1)",
            "> 0 function_call load {} (c1)",
            "  1 function_call_output load (c1) error \"Error: database unavailable\"",
        ],
    );
    let ok = RunResult {
        events: vec![output("c1", "load", "done", false)],
        ..Default::default()
    };
    assert_fails(
        ok.expect().nth(0).is_function_call_output().try_is_error(),
        &["expected an error output, found output of `load` (c1): \"done\""],
    );
}

#[test]
fn message_assertions_check_role_and_text() {
    let result = RunResult {
        events: vec![
            ChatItem::message(ChatRole::User, "what's the weather?"),
            ChatItem::message(ChatRole::Assistant, "Sunny."),
        ],
        ..Default::default()
    };
    let mut expect = result.expect();
    expect
        .next_event()
        .is_message(ChatRole::User)
        .with_content("what's the weather?");
    assert_fails(
        expect.nth(0).try_is_message(ChatRole::Assistant),
        &["expected a message (assistant), found message (user): \"what's the weather?\""],
    );
    let reply = expect.next_event().is_message(ChatRole::Assistant);
    assert_fails(
        reply.try_containing("rain"),
        &[
            "expected a message containing \"rain\", found message (assistant): \"Sunny.\"",
            "  0 message user \"what's the weather?\"",
            "> 1 message assistant \"Sunny.\"",
        ],
    );
    assert_fails(
        reply.try_with_content("Sunny"),
        &["expected the message \"Sunny\", found message (assistant): \"Sunny.\""],
    );
}

#[test]
fn handoff_assertions_check_both_agents() {
    let result = RunResult {
        events: vec![
            call("c1", "transfer", "{}"),
            output("c1", "transfer", "Transferring you.", false),
            handoff(Some("agent-a"), "agent-b"),
        ],
        ..Default::default()
    };
    let mut expect = result.expect();
    expect.skip_next(2);
    let handoff = expect
        .next_event()
        .is_agent_handoff("agent-b")
        .with_from("agent-a");
    assert_eq!((handoff.from(), handoff.to()), (Some("agent-a"), "agent-b"));
    expect.no_more_events();
    assert_fails(
        result.expect().nth(2).try_is_agent_handoff("agent-c"),
        &[
            "expected an agent handoff to `agent-c`, found agent handoff from `agent-a` to `agent-b`",
            "> 2 agent_handoff agent-a -> agent-b",
        ],
    );
    assert_fails(
        result
            .expect()
            .nth(2)
            .is_agent_handoff("agent-b")
            .try_with_from("agent-x"),
        &["expected an agent handoff from `agent-x` to `agent-b`"],
    );
    assert_fails(
        result.expect().nth(1).try_is_agent_handoff("agent-b"),
        &["found output of `transfer` (c1): \"Transferring you.\""],
    );
}

#[test]
fn the_cursor_skips_and_ends() {
    let result = weather_turn();
    let mut expect = result.expect();
    assert_fails(
        expect.try_no_more_events(),
        &[
            "expected no more events, found 3 more, the next: a function call to `get_weather`",
            "> 0 function_call get_weather",
        ],
    );
    assert_fails(
        expect.try_skip_next(4),
        &["expected at least 4 more events to skip, found 3 more"],
    );
    assert_eq!(expect.cursor(), 0, "a failed skip does not move the cursor");
    expect.skip_next(2);
    assert_eq!(expect.cursor(), 2);
    assert_fails(
        expect.try_no_more_events(),
        &[
            "found 1 more, the next: message (assistant): \"It is sunny in Paris.\"",
            "  1 function_call_output",
            "> 2 message assistant",
        ],
    );
    expect.next_event().is_message(ChatRole::Assistant);
    expect.no_more_events();
    let text = assert_fails(
        expect.try_next_event(),
        &[
            "expected another event, found the end of the events (3 in all)",
            "> 3 (end)",
        ],
    );
    assert!(!text.contains("> 0") && !text.contains("> 2"), "{text}");
    assert_eq!(expect.cursor(), 3);

    let empty = RunResult::default();
    empty.expect().no_more_events();
    assert_fails(
        empty.expect().try_next_event(),
        &["found the end of the events (0 in all)\nevents:\n> 0 (end)"],
    );
}

#[test]
fn contains_and_nth_look_anywhere_without_moving_the_cursor() {
    let result = RunResult {
        events: vec![
            call("c1", "search", r#"{"q": "flights"}"#),
            call("c2", "search", r#"{"q": "hotels"}"#),
            output("c1", "search", "3 flights", false),
            output("c2", "search", "2 hotels", false),
            ChatItem::message(ChatRole::Assistant, "Found some."),
        ],
        ..Default::default()
    };
    let mut expect = result.expect();
    assert_eq!(expect.contains_function_call("search").call_id(), "c1");
    let hotels = expect.contains_function_call_with_args("search", json!({"q": "hotels"}));
    assert_eq!((hotels.call_id(), hotels.index()), ("c2", 1));
    expect
        .contains_function_call_output()
        .for_call("c1")
        .with_output("3 flights");
    expect
        .contains_message(ChatRole::Assistant)
        .with_content("Found some.");
    expect
        .nth(3)
        .is_function_call_output()
        .for_call(hotels.call_id())
        .with_output("2 hotels");
    assert_eq!(expect.cursor(), 0, "contains_* and nth leave the cursor");
    expect.next_event().is_function_call("search");

    let text = assert_fails(
        expect.try_contains_function_call("book"),
        &[
            "expected a function call to `book` among the events, found none",
            "  0 function_call search {\"q\":\"flights\"} (c1)",
            "  4 message assistant \"Found some.\"",
        ],
    );
    assert!(
        !text.contains("\n>"),
        "no cursor marker for a search:\n{text}"
    );
    assert_fails(
        expect.try_contains_function_call_with_args("search", json!({"q": "cars"})),
        &[r#"expected a function call to `search` with arguments {"q":"cars"} among the events"#],
    );
    assert_fails(
        expect.try_contains_message(ChatRole::User),
        &["expected a message (user) among the events, found none"],
    );
    assert_fails(
        expect.try_contains_agent_handoff("agent-b"),
        &["expected an agent handoff to `agent-b` among the events, found none"],
    );
    assert_fails(
        expect.try_nth(5),
        &["expected an event at index 5, found 5 events"],
    );
    assert_fails(
        RunResult::default()
            .expect()
            .try_contains_function_call_output(),
        &["found none\nevents: (none)"],
    );
}

#[test]
fn long_texts_are_cut_in_the_listing_but_not_in_found() {
    let long = "a".repeat(100);
    let result = RunResult {
        events: vec![ChatItem::message(ChatRole::Assistant, long.clone())],
        ..Default::default()
    };
    let text = assert_fails(
        result.expect().nth(0).try_is_message(ChatRole::User),
        &[&format!("found message (assistant): \"{long}\"")],
    );
    assert!(
        text.contains(&format!("> 0 message assistant \"{}\"…", "a".repeat(60))),
        "{text}"
    );
}

#[test]
#[should_panic(
    expected = "expected a function call to `get_time`, found a function call to `get_weather`"
)]
fn the_panicking_variant_panics_with_the_same_message() {
    weather_turn()
        .expect()
        .next_event()
        .is_function_call("get_time");
}

#[test]
#[should_panic(expected = "expected no more events, found 1 more")]
fn no_more_events_panics_when_events_are_left() {
    let result = weather_turn();
    let mut expect = result.expect();
    expect.skip_next(2).no_more_events();
}

#[actix::test]
async fn a_real_session_turn_reads_as_call_output_message() {
    let weather = Tool::new(
        "get_weather",
        "Gives the weather",
        |_ctx: RunContext, args: serde_json::Value| async move {
            Ok::<_, ToolFailure>(format!("sunny in {}", args["city"].as_str().unwrap_or("?")))
        },
    );
    let llm = ScriptedLlm::new([
        Reply::tool_call("get_weather", json!({"city": "Paris"})),
        Reply::text("It is sunny in Paris."),
    ]);
    let agent = Agent::builder("agent-a")
        .instructions("Answer about the weather.")
        .tool(weather)
        .build()
        .unwrap();
    let session = Session::builder()
        .llm(llm)
        .agent(agent)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let result = session.run("weather in Paris?").await.unwrap();

    let mut expect = result.expect();
    expect
        .next_event()
        .is_message(ChatRole::User)
        .with_content("weather in Paris?");
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
        .with_content("It is sunny in Paris.");
    expect.no_more_events();

    let mut again = result.expect();
    again.skip_next(2);
    let found = "found output of `get_weather` (call_1): \"sunny in Paris\"";
    assert_fails(
        again.next_event().try_is_message(ChatRole::Assistant),
        &[
            &format!("expected a message (assistant), {found}"),
            "  0 message user \"weather in Paris?\"",
            "  1 function_call get_weather {\"city\":\"Paris\"} (call_1)",
            "> 2 function_call_output get_weather (call_1) \"sunny in Paris\"",
            "  3 message assistant \"It is sunny in Paris.\"",
        ],
    );
    session.close().await.unwrap();
}

#[actix::test]
async fn a_real_session_handoff_ends_the_turn_events() {
    let agent_b = Agent::builder("agent-b")
        .instructions("Concierge.")
        .build()
        .unwrap();
    let transfer = Tool::new(
        "transfer",
        "Transfers to B",
        move |_ctx: RunContext, _: NoArgs| {
            let b = agent_b.clone();
            async move { Ok::<_, ToolFailure>(Handoff::to(b).with_message("Transferring you.")) }
        },
    );
    let agent_a = Agent::builder("agent-a").tool(transfer).build().unwrap();
    let llm = ScriptedLlm::new([Reply::tool_call("transfer", json!({}))]);
    llm.otherwise(Reply::text("Hello from B."));
    let session = Session::builder()
        .llm(llm)
        .agent(agent_a)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let result = session.run("put me through").await.unwrap();

    let mut expect = result.expect();
    expect.next_event().is_message(ChatRole::User);
    let call_id = expect
        .next_event()
        .is_function_call("transfer")
        .with_args(json!({}))
        .call_id();
    expect
        .next_event()
        .is_function_call_output()
        .for_call(call_id)
        .not_error();
    expect
        .contains_agent_handoff("agent-b")
        .with_from("agent-a");
    assert_fails(
        expect.try_contains_agent_handoff("agent-c"),
        &["expected an agent handoff to `agent-c` among the events, found none"],
    );
    session.close().await.unwrap();
}
