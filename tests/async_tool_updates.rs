//! SPEC §3: a tool's first `ctx.update` is its output for the step; later updates and its
//! final value arrive as `/update_n` and `/finished` pairs, answered by one coalesced
//! deferred reply.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{assert_invariant, call_ids, output, spawn_turn, wait_event, wait_on, Query};
use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{event, Gate, RecordingOutput, Reply, ScriptedLlm};
use switchboard::{ChatContext, ToolChoice};

async fn start(tool: Tool, llm: std::sync::Arc<ScriptedLlm>) -> Session {
    let agent = Agent::builder("agent-a")
        .instructions("Help.")
        .tool(tool)
        .build()
        .unwrap();
    Session::builder()
        .llm(llm)
        .agent(agent)
        .start(&Engine::current().unwrap())
        .await
        .unwrap()
}

fn texts(chat: &ChatContext, role: ChatRole) -> Vec<String> {
    chat.items()
        .iter()
        .filter_map(|i| match i {
            ChatItem::Message(m) if m.role == role => Some(m.content.clone()),
            _ => None,
        })
        .collect()
}

#[actix::test]
async fn first_update_is_the_output_and_later_ones_get_one_coalesced_reply() {
    let gate = Gate::new();
    let g = gate.clone();
    let tool = Tool::new("search", "Searches", move |ctx: RunContext, args: Query| {
        let g = g.clone();
        async move {
            ctx.update(format!("looking for {}", args.q)).await?;
            g.wait().await;
            ctx.update("found 3").await?;
            ctx.update("picked one").await?;
            Ok::<_, ToolFailure>("booked #42")
        }
    });
    let llm = ScriptedLlm::new([
        Reply::tool_call("search", json!({"q": "flights"})),
        Reply::text("Searching now."),
        Reply::text("Booked: #42."),
    ]);
    // Voice-like I/O: the agent speaks until the test reports the playout finished.
    let io = RecordingOutput::manual_playout();
    let agent = Agent::builder("agent-a").tool(tool).build().unwrap();
    let session = Session::builder()
        .llm(llm.clone())
        .agent(agent)
        .output(io.clone())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let mut events = session.subscribe();

    let turn = spawn_turn(&session, "find me a flight");
    wait_event(&mut events, |e| match e {
        SessionEvent::SpeechCreated { speech, .. } => Some(speech.id()),
        _ => None,
    })
    .await;
    // While "Searching now." plays, the tool sends two more updates and returns.
    gate.open();
    wait_on(&mut events, event::output_added("call_1/finished")).await;
    assert_eq!(llm.request_count(), 2, "no reply while the agent speaks");
    let speech = io.last_speech().unwrap();
    assert_eq!(speech.text, "Searching now.");
    io.played_out(speech.id);

    let result = turn.await.unwrap().unwrap();
    // The first update answered the step; the LLM ran again with it in view.
    let first = result.function_outputs().next().unwrap();
    assert_eq!(first.call_id, "call_1");
    assert_eq!(first.output, "Update from search: looking for flights");
    assert!(!first.is_error);

    let last = wait_event(&mut events, |e| match e {
        SessionEvent::SpeechCreated { speech, .. } => Some(speech.id()),
        _ => None,
    })
    .await;
    io.played_out(last);
    common::settled(&session).await;

    let chat = session.chat_context().await.unwrap();
    assert_eq!(
        call_ids(&chat),
        [
            "call call_1",
            "out call_1",
            "call call_1/update_1",
            "out call_1/update_1",
            "call call_1/update_2",
            "out call_1/update_2",
            "call call_1/finished",
            "out call_1/finished",
        ]
    );
    assert_eq!(
        output(&chat, "call_1/update_1"),
        "Update from search: found 3"
    );
    assert_eq!(output(&chat, "call_1/finished"), "booked #42");
    // Exactly one deferred reply for the three later items, with tools off and the ids
    // listed in order.
    assert_eq!(llm.request_count(), 3);
    let reply = &llm.requests()[2];
    assert_eq!(reply.tool_choice, ToolChoice::None);
    assert_eq!(
        reply.deferred_call_ids,
        ["call_1/update_1", "call_1/update_2", "call_1/finished"]
    );
    assert!(llm.requests()[..2]
        .iter()
        .all(|r| r.deferred_call_ids.is_empty()));
    let instructions = reply.extra_instructions.clone().unwrap();
    let ids: Vec<&str> = instructions
        .lines()
        .filter(|l| l.starts_with("call_1"))
        .collect();
    assert_eq!(
        ids,
        ["call_1/update_1", "call_1/update_2", "call_1/finished"]
    );
    assert_eq!(
        texts(&chat, ChatRole::Assistant),
        ["Searching now.", "Booked: #42."]
    );
    assert_invariant(&chat);
    session.close().await.unwrap();
}

#[actix::test]
async fn updates_to_an_idle_session_are_answered_at_once() {
    // Nothing is speaking, so each later update is answered as it comes; one that
    // arrives while that reply runs joins the next reply.
    let tool = Tool::new("count", "Counts", |ctx: RunContext, _: Query| async move {
        ctx.update("1").await?;
        ctx.update("2").await?;
        Ok::<_, ToolFailure>(())
    });
    let llm = ScriptedLlm::new([Reply::tool_call("count", json!({"q": "x"}))]);
    llm.otherwise(Reply::text("ok"));
    let session = start(tool, llm.clone()).await;
    session.run("count").await.unwrap();
    common::settled(&session).await;
    let chat = session.chat_context().await.unwrap();
    assert_invariant(&chat);
    let deferred: Vec<_> = llm
        .requests()
        .into_iter()
        .filter(|r| r.tool_choice == ToolChoice::None)
        .collect();
    // `/update_1` came after the step's second request was made, so one reply is due,
    // and it lists `call_1/update_1`.
    assert_eq!(deferred.len(), 1, "{:#?}", llm.requests());
    assert!(deferred[0]
        .deferred_call_ids
        .contains(&"call_1/update_1".to_owned()));
    assert!(deferred[0]
        .extra_instructions
        .as_deref()
        .unwrap()
        .contains("call_1/update_1"));
    session.close().await.unwrap();
}

#[actix::test]
async fn a_tool_that_returns_without_updating_is_a_plain_call() {
    let tool = Tool::new(
        "lookup",
        "Looks up",
        |_ctx: RunContext, args: Query| async move {
            Ok::<_, ToolFailure>(json!({"answer": args.q.len()}))
        },
    );
    let llm = ScriptedLlm::new([
        Reply::tool_call("lookup", json!({"q": "four"})),
        Reply::text("The answer is 4."),
    ]);
    let session = start(tool, llm.clone()).await;
    let result = session.run("how long is four?").await.unwrap();
    let out = result.function_outputs().next().unwrap();
    assert_eq!(out.output, r#"{"answer":4}"#);
    session.wait_for_inactive().await;
    let chat = session.chat_context().await.unwrap();
    assert_eq!(call_ids(&chat), ["call call_1", "out call_1"]);
    assert_eq!(llm.request_count(), 2, "no deferred reply for a plain call");
    assert_invariant(&chat);
    session.close().await.unwrap();
}

#[actix::test]
async fn an_error_after_an_update_is_a_finished_error_output_with_exactly_one_reply() {
    let gate = Gate::new();
    let g = gate.clone();
    let tool = Tool::new("charge", "Charges", move |ctx: RunContext, _: Query| {
        let g = g.clone();
        async move {
            ctx.update("charging").await?;
            g.wait().await;
            Err::<(), _>(ToolError::new("card declined").into())
        }
    });
    let llm = ScriptedLlm::new([
        Reply::tool_call("charge", json!({"q": "x"})),
        Reply::text("Charging."),
        Reply::text("Sorry, the card was declined."),
    ]);
    let session = start(tool, llm.clone()).await;
    session.run("pay").await.unwrap();
    gate.open();
    common::settled(&session).await;
    let chat = session.chat_context().await.unwrap();
    let finished = chat.output_of("call_1/finished").unwrap();
    assert!(finished.is_error);
    assert_eq!(finished.output, "Error: card declined");
    assert_eq!(llm.request_count(), 3, "exactly one deferred reply");
    assert_invariant(&chat);
    session.close().await.unwrap();
}

#[actix::test]
async fn a_unit_return_after_updates_adds_nothing_more() {
    let tool = Tool::new(
        "notify",
        "Notifies",
        |ctx: RunContext, _: Query| async move {
            ctx.update("sent").await?;
            Ok::<_, ToolFailure>(())
        },
    );
    let llm = ScriptedLlm::new([
        Reply::tool_call("notify", json!({"q": "x"})),
        Reply::text("Sent."),
    ]);
    let session = start(tool, llm.clone()).await;
    session.run("notify them").await.unwrap();
    session.wait_for_inactive().await;
    let chat = session.chat_context().await.unwrap();
    assert_eq!(call_ids(&chat), ["call call_1", "out call_1"]);
    assert_eq!(llm.request_count(), 2);
    session.close().await.unwrap();
}

#[actix::test]
async fn later_items_of_an_instant_tool_wait_for_their_own_step() {
    // The tool updates twice and returns before the step is committed: its later items
    // must come after the step's call and output, never between them.
    let tool = Tool::new("fast", "Fast", |ctx: RunContext, _: Query| async move {
        ctx.update("one").await?;
        ctx.update("two").await?;
        Ok::<_, ToolFailure>("done")
    });
    let slow = Tool::new("slow", "Slow", |_ctx: RunContext, _: Query| async move {
        tokio::task::yield_now().await;
        Ok::<_, ToolFailure>("slow done")
    });
    let llm = ScriptedLlm::new([
        Reply::tool_call("fast", json!({"q": "a"})).and_tool_call("slow", json!({"q": "b"})),
        Reply::text("Both answered."),
        Reply::text("Fast is done."),
    ]);
    let agent = Agent::builder("agent-a")
        .tool(tool)
        .tool(slow)
        .build()
        .unwrap();
    let session = Session::builder()
        .llm(llm.clone())
        .agent(agent)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("go").await.unwrap();
    common::settled(&session).await;
    let chat = session.chat_context().await.unwrap();
    let ids = call_ids(&chat);
    assert_eq!(
        &ids[..4],
        ["call call_1", "call call_2", "out call_1", "out call_2"],
        "the step's pairs come first: {ids:?}"
    );
    assert!(ids.contains(&"out call_1/update_1".to_owned()));
    assert!(ids.contains(&"out call_1/finished".to_owned()));
    assert_invariant(&chat);
    // `/update_1` was in view of the second request; `/finished` came after it, so one
    // deferred reply was due, and it named only what the agent had not seen.
    assert_eq!(llm.request_count(), 3);
    let second = &llm.requests()[1];
    assert!(second.chat.contains_call("call_1/update_1"));
    assert!(!second.chat.contains_call("call_1/finished"));
    session.close().await.unwrap();
}

#[actix::test]
async fn a_repeated_provider_call_id_is_made_unique() {
    let tool = Tool::new(
        "echo",
        "Echoes",
        |_ctx: RunContext, args: Query| async move { Ok::<_, ToolFailure>(args.q) },
    );
    let llm = ScriptedLlm::new([
        Reply::raw_tool_call("dup", "echo", r#"{"q":"1"}"#),
        Reply::text("one"),
        Reply::raw_tool_call("dup", "echo", r#"{"q":"2"}"#),
        Reply::text("two"),
    ]);
    let session = start(tool, llm.clone()).await;
    session.run("first").await.unwrap();
    session.run("second").await.unwrap();
    let chat = session.chat_context().await.unwrap();
    assert_eq!(output(&chat, "dup"), "1");
    assert_eq!(output(&chat, "dup~2"), "2");
    assert_invariant(&chat);
    session.close().await.unwrap();
}

#[actix::test]
async fn a_deferred_reply_says_what_it_covers_and_is_skipped_when_a_reply_already_saw_it() {
    let gate = Gate::new();
    let tool = {
        let gate = gate.clone();
        Tool::new("search", "Searches", move |ctx: RunContext, _: Query| {
            let gate = gate.clone();
            async move {
                ctx.update("searching").await?;
                gate.wait().await;
                Ok::<_, ToolFailure>("found it")
            }
        })
    };
    let llm = ScriptedLlm::new([
        Reply::tool_call("search", json!({"q": "keys"})),
        Reply::text("Searching."),
        Reply::text("Found them, on the shelf."),
    ]);
    let io = RecordingOutput::manual_playout();
    let session = Session::builder()
        .llm(llm.clone())
        .agent(Agent::builder("agent-a").tool(tool).build().unwrap())
        .output(io.clone())
        .inspect(true)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let inspector = session.inspector().unwrap();
    let mut events = session.subscribe();
    let first = spawn_turn(&session, "where are my keys?");
    let searching = wait_on(&mut events, event::speech_created()).await;
    // While "Searching." plays, the result lands and the user asks again: the user's turn
    // is queued first, so its reply sees the result, and the deferred reply is skipped.
    gate.open();
    wait_on(&mut events, event::output_added("call_1/finished")).await;
    let second = spawn_turn(&session, "did you find them?");
    inspector
        .wait_for_nth(
            "session/s1",
            "RunTurn",
            2,
            std::time::Duration::from_secs(5),
        )
        .await
        .unwrap();
    io.played_out(searching.id());
    first.await.unwrap().unwrap();
    let found = wait_on(&mut events, event::speech_created()).await;
    io.played_out(found.id());
    second.await.unwrap().unwrap();
    common::settled(&session).await;

    let decision = wait_event(&mut events, |e| match e {
        SessionEvent::DeferredReply {
            call_ids, decision, ..
        } => Some((call_ids.clone(), *decision)),
        _ => None,
    })
    .await;
    assert_eq!(
        decision,
        (
            vec!["call_1/finished".to_owned()],
            DeferredReplyDecision::AlreadyAnswered
        )
    );
    assert_eq!(llm.request_count(), 3, "no request for the skipped reply");
    assert!(llm.requests()[2].chat.contains_call("call_1/finished"));
    assert!(llm.requests()[2].deferred_call_ids.is_empty());
    session.close().await.unwrap();
}

/// Counts how often the future it wraps is polled: each poll after the first is a wake-up
/// of the task awaiting it.
struct Polls<F> {
    future: std::pin::Pin<Box<F>>,
    polls: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl<F: std::future::Future> std::future::Future for Polls<F> {
    type Output = F::Output;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        self.polls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.future.as_mut().poll(cx)
    }
}

#[actix::test]
async fn wait_for_settled_waits_for_the_last_tool_and_its_reply_and_wakes_once() {
    let gate = Gate::new();
    let g = gate.clone();
    let tool = Tool::new("search", "Searches", move |ctx: RunContext, _: Query| {
        let g = g.clone();
        async move {
            ctx.update("searching").await?;
            g.wait().await;
            Ok::<_, ToolFailure>("3 results")
        }
    });
    let llm = ScriptedLlm::new([
        Reply::tool_call("search", json!({"q": "flights"})),
        Reply::text("Searching now."),
        Reply::text("Found 3."),
    ]);
    let deferred = llm.hold(2);
    let agent = Agent::builder("agent-a").tool(tool).build().unwrap();
    let session = Session::builder()
        .llm(llm.clone())
        .agent(agent)
        .inspect(true)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let inspector = session.inspector().unwrap();
    session.run("find flights").await.unwrap();
    let run = inspector.runs_of_tool("search").pop().unwrap();

    let polls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let s = session.clone();
    let waiter = actix::spawn(Polls {
        future: Box::pin(async move { s.wait_for_settled().await.unwrap() }),
        polls: polls.clone(),
    });
    // The tool returns: its run ends while the deferred reply waits on the model, so the
    // session is active with no tool left, which is not settled.
    gate.open();
    deferred
        .requested(std::time::Duration::from_secs(5))
        .await
        .unwrap();
    inspector
        .wait_until_stopped(run.as_str(), std::time::Duration::from_secs(5))
        .await
        .unwrap();
    assert!(!session.is_inactive(), "the deferred reply is under way");
    assert!(
        !waiter.is_finished(),
        "settled before the deferred reply ran"
    );

    deferred.release();
    tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
        .await
        .expect("wait_for_settled did not resolve after the deferred reply")
        .unwrap();
    assert!(session.is_inactive());
    let texts = texts(&session.chat_context().await.unwrap(), ChatRole::Assistant);
    assert_eq!(texts, ["Searching now.", "Found 3."]);
    // Polled once, woken once by the session's answer that every input sent before was
    // handled, and once by the settle: the half-settles on the way (the session going
    // active for the deferred reply, the last tool run ending) do not wake the waiter.
    assert_eq!(
        polls.load(std::sync::atomic::Ordering::Relaxed),
        3,
        "wake-ups of the waiting task"
    );
    session.close().await.unwrap();
}
