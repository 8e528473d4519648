//! SPEC §2, §5, §7: a call to an unknown tool, arguments that do not parse, a panic, an
//! unexpected error: each gives the model an error output it can read, the body of a
//! call with bad arguments never runs, and the session goes on.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::{assert_invariant, Query};
use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{Gate, Reply, ScriptedLlm};

async fn session_with(tool: Tool, llm: Arc<ScriptedLlm>) -> Session {
    Session::builder()
        .llm(llm)
        .agent(Agent::builder("agent-a").tool(tool).build().unwrap())
        .start(&Engine::current().unwrap())
        .await
        .unwrap()
}

fn counting_tool(runs: Arc<AtomicUsize>) -> Tool {
    Tool::new(
        "lookup",
        "Looks up",
        move |_ctx: RunContext, args: Query| {
            let runs = runs.clone();
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, ToolFailure>(format!("found {}", args.q))
            }
        },
    )
}

#[actix::test]
async fn an_unknown_tool_gets_an_error_output_naming_the_tools() {
    let runs = Arc::new(AtomicUsize::new(0));
    let llm = ScriptedLlm::new([
        Reply::tool_call("lookupp", json!({"q": "x"})),
        Reply::text("Let me try again."),
        Reply::text("Still here."),
    ]);
    let session = session_with(counting_tool(runs.clone()), llm).await;
    let result = session.run("look it up").await.unwrap();
    let out = result.function_outputs().next().unwrap();
    assert!(out.is_error);
    assert_eq!(
        out.output,
        "Error: unknown tool lookupp; available tools: lookup"
    );
    assert_eq!(
        result.assistant_messages().collect::<Vec<_>>(),
        ["Let me try again."]
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    // The session goes on.
    let next = session.run("hello").await.unwrap();
    assert_eq!(
        next.assistant_messages().collect::<Vec<_>>(),
        ["Still here."]
    );
    assert_invariant(&session.chat_context().await.unwrap());
    session.close().await.unwrap();
}

#[actix::test]
async fn arguments_that_do_not_parse_never_run_the_body() {
    let runs = Arc::new(AtomicUsize::new(0));
    let llm = ScriptedLlm::new([
        Reply::raw_tool_call("c1", "lookup", r#"{"query": "x"}"#).and_raw_tool_call(
            "c2",
            "lookup",
            "{not json",
        ),
        Reply::text("Sorry, retrying."),
    ]);
    let session = session_with(counting_tool(runs.clone()), llm).await;
    let result = session.run("look it up").await.unwrap();
    let outputs: Vec<_> = result.function_outputs().cloned().collect();
    assert_eq!(outputs.len(), 2);
    assert!(outputs.iter().all(|o| o.is_error));
    assert!(
        outputs[0]
            .output
            .starts_with("Error parsing arguments for lookup: missing field `q`"),
        "{}",
        outputs[0].output
    );
    assert!(outputs[1]
        .output
        .starts_with("Error parsing arguments for lookup: "));
    assert!(!outputs[1].output.contains("Error: Error"));
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the body must never run");
    assert_invariant(&session.chat_context().await.unwrap());
    session.close().await.unwrap();
}

#[actix::test]
async fn a_panicking_tool_gives_a_hidden_error_and_the_session_lives_on() {
    let boom = Tool::new(
        "boom",
        "Explodes",
        |_ctx: RunContext, _: Query| async move {
            if true {
                panic!("secret internal detail");
            }
            Ok::<_, ToolFailure>(())
        },
    );
    let llm = ScriptedLlm::new([
        Reply::tool_call("boom", json!({"q": "x"})),
        Reply::text("Something went wrong."),
        Reply::text("Yes, still here."),
    ]);
    let session = Session::builder()
        .llm(llm)
        .agent(Agent::builder("agent-a").tool(boom).build().unwrap())
        // Even a catch-all `show` never shows a panic.
        .error_policy(ErrorPolicy::new().route_all(ErrorRoute::Show))
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let result = session.run("go").await.unwrap();
    let out = result.function_outputs().next().unwrap();
    assert!(out.is_error);
    assert_eq!(out.output, "Error: internal error in boom");
    assert!(!out.output.contains("secret"));
    let next = session.run("still there?").await.unwrap();
    assert_eq!(
        next.assistant_messages().collect::<Vec<_>>(),
        ["Yes, still here."]
    );
    assert_invariant(&session.chat_context().await.unwrap());
    session.close().await.unwrap();
}

#[derive(Debug, thiserror::Error)]
#[error("database unavailable")]
struct DbDown;

#[derive(Debug, thiserror::Error)]
#[error("could not load the booking")]
struct LoadFailed(#[source] DbDown);

#[actix::test]
async fn unexpected_errors_follow_the_return_error_policy() {
    let load = || {
        Tool::new("load", "Loads", |_ctx: RunContext, _: Query| async move {
            Err::<(), _>(LoadFailed(DbDown).into())
        })
    };
    let llm = || {
        ScriptedLlm::new([
            Reply::tool_call("load", json!({"q": "x"})),
            Reply::text("It failed."),
        ])
    };
    let engine = Engine::current().unwrap();
    // Default: hidden.
    let session = session_with(load(), llm()).await;
    let out = session.run("load").await.unwrap();
    assert_eq!(
        out.function_outputs().next().unwrap().output,
        "Error: internal error in load"
    );
    session.close().await.unwrap();

    // `show` for the inner type matches it as the source of the outer error.
    let session = Session::builder()
        .llm(llm())
        .agent(Agent::builder("agent-a").tool(load()).build().unwrap())
        .error_policy(ErrorPolicy::new().route::<DbDown>(ErrorRoute::Show))
        .start(&engine)
        .await
        .unwrap();
    let out = session.run("load").await.unwrap();
    let output = out.function_outputs().next().unwrap();
    assert!(output.is_error);
    assert_eq!(output.output, "Error: could not load the booking");
    session.close().await.unwrap();

    // `propagate` on the agent: the turn fails, the call still has its output, the
    // session stays up. (The tool-level rule would win over the agent's.)
    let session = Session::builder()
        .llm(llm())
        .agent(
            Agent::builder("agent-a")
                .tool(load())
                .error_policy(ErrorPolicy::new().route::<LoadFailed>(ErrorRoute::Propagate))
                .build()
                .unwrap(),
        )
        .error_policy(ErrorPolicy::new().route_all(ErrorRoute::Show))
        .start(&engine)
        .await
        .unwrap();
    let mut events = session.subscribe();
    match session.run("load").await {
        Err(SessionError::TurnFailed {
            failure:
                TurnFailure::Tool {
                    tool,
                    call_id,
                    message,
                },
            result,
        }) => {
            // The failed turn's result has the call and its error output.
            assert_eq!(result.function_calls().count(), 1);
            assert_eq!(
                result.function_outputs().next().unwrap().output,
                "Error: internal error in load"
            );
            assert_eq!(tool, "load");
            assert_eq!(call_id, "call_1");
            assert_eq!(
                message,
                "could not load the booking: caused by: database unavailable"
            );
        }
        other => panic!("expected the turn to fail, got {other:?}"),
    }
    let chat = session.chat_context().await.unwrap();
    assert_eq!(
        chat.output_of("call_1").unwrap().output,
        "Error: internal error in load"
    );
    assert_invariant(&chat);
    let mut saw_error = false;
    while let Ok(event) = events.try_recv() {
        saw_error |= matches!(event, SessionEvent::Error { ref message } if message.contains("database unavailable"));
    }
    assert!(saw_error);
    session.close().await.unwrap();
}

/// The deprecated `StopResponse` still says what `ToolReturn::no_reply` says.
#[actix::test]
#[allow(deprecated)]
async fn stop_response_records_the_output_and_ends_the_turn() {
    let hangup = Tool::new(
        "hang_up",
        "Ends the call",
        |_ctx: RunContext, _: Query| async move {
            Err::<(), _>(switchboard::StopResponse::with_output("call ended").into())
        },
    );
    let llm = ScriptedLlm::new([Reply::tool_call("hang_up", json!({"q": "x"}))]);
    let session = session_with(hangup, llm.clone()).await;
    let result = session.run("bye").await.unwrap();
    let out = result.function_outputs().next().unwrap();
    assert_eq!(out.output, "call ended");
    assert!(!out.is_error);
    assert_eq!(llm.request_count(), 1, "no further LLM step");
    session.close().await.unwrap();
}

#[test]
fn tool_name_clashes_are_build_errors_naming_both_owners() {
    let a = counting_tool(Arc::new(AtomicUsize::new(0)));
    let b = counting_tool(Arc::new(AtomicUsize::new(0)));
    let err = Agent::builder("agent-a")
        .tool(a)
        .toolset(Toolset::new("extra").tool(b))
        .build()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"tool name "lookup" is used twice: by agent agent-a and by toolset extra of agent agent-a"#
    );
}

#[actix::test]
async fn a_clash_with_a_session_toolset_fails_when_the_activity_starts() {
    let llm = ScriptedLlm::new([]);
    let err = Session::builder()
        .llm(llm)
        .agent(
            Agent::builder("agent-a")
                .tool(counting_tool(Arc::new(AtomicUsize::new(0))))
                .build()
                .unwrap(),
        )
        .toolset(Toolset::new("shared").tool(counting_tool(Arc::new(AtomicUsize::new(0)))))
        .start(&Engine::current().unwrap())
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("lookup") && err.to_string().contains("session toolset shared"),
        "{err}"
    );
}

#[actix::test]
async fn a_propagated_error_after_an_update_emits_an_error_event_and_a_finished_output() {
    let gate = Gate::new();
    let g = gate.clone();
    let load = Tool::new("load", "Loads", move |ctx: RunContext, _: Query| {
        let g = g.clone();
        async move {
            ctx.update("loading").await?;
            g.wait().await;
            Err::<(), _>(LoadFailed(DbDown).into())
        }
    });
    let llm = ScriptedLlm::new([
        Reply::tool_call("load", json!({"q": "x"})),
        Reply::text("Loading."),
    ]);
    llm.otherwise(Reply::text("That failed."));
    let session = Session::builder()
        .llm(llm)
        .agent(Agent::builder("agent-a").tool(load).build().unwrap())
        .error_policy(ErrorPolicy::new().route::<DbDown>(ErrorRoute::Propagate))
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    // The turn itself succeeded: the first update answered it.
    session.run("load").await.unwrap();
    let mut events = session.subscribe();
    gate.open();
    let message = common::wait_event(&mut events, |e| match e {
        SessionEvent::Error { message } => Some(message.clone()),
        _ => None,
    })
    .await;
    assert!(message.contains("database unavailable"), "{message}");
    common::settled(&session).await;
    let chat = session.chat_context().await.unwrap();
    let finished = chat.output_of("call_1/finished").unwrap();
    assert!(finished.is_error);
    assert_eq!(finished.output, "Error: internal error in load");
    assert_invariant(&chat);
    session.close().await.unwrap();
}
