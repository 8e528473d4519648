//! SPEC §14 "When": a snapshot may be taken at any moment and holds the last consistent
//! point — inside a sub-task (the result still reaches the paused caller), with a
//! deferred reply pending, during a barge-in (the speech is cut as a barge-in would cut
//! it), during a handoff (it waits for the switch to end). Each test restores what it
//! took and checks the conversation goes on from there.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{assert_invariant, output, spawn_turn, wait_on, Query};
use serde_json::json;
use switchboard::prelude::*;
use switchboard::snapshot::{AgentRegistry, SessionSnapshot};
use switchboard::testing::{event, Gate, RecordingOutput, Reply, ScriptedLlm};
use switchboard::NoArgs;

#[derive(Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
struct Contact {
    email: String,
}

fn collector() -> Agent {
    let save = Tool::new(
        "save_email",
        "Saves the email",
        |_ctx: RunContext, args: Contact| async move { ToolReturn::complete_task(&args) },
    );
    Agent::builder("collector")
        .instructions("Ask for the email.")
        .tool(save)
        .build()
        .unwrap()
}

fn caller() -> Agent {
    let ask_email = Tool::new(
        "ask_email",
        "Collects an email",
        |ctx: RunContext, _: NoArgs| async move {
            let contact: Contact = ctx.run_task(collector()).await?;
            Ok::<_, ToolFailure>(format!("email is {}", contact.email))
        },
    );
    Agent::builder("main")
        .instructions("Help.")
        .tool(ask_email)
        .build()
        .unwrap()
}

#[actix::test]
async fn inside_a_sub_task_the_result_still_reaches_the_paused_caller() {
    let llm = ScriptedLlm::new([Reply::tool_call("ask_email", json!({}))]);
    let session = Session::builder()
        .llm(llm.clone())
        .agent(caller())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let mut events = session.subscribe();
    let _turn = spawn_turn(&session, "I want the newsletter");
    wait_on(
        &mut events,
        event::item_added("the collector's start", |item| {
            matches!(item, ChatItem::AgentHandoff { to, .. } if to == "collector").then_some(())
        }),
    )
    .await;
    let snapshot = session.snapshot().await.unwrap();
    session.close().await.unwrap();

    let llm = ScriptedLlm::new([
        // collector: saves the email, which ends the task
        Reply::tool_call("save_email", json!({"email": "a@b.c"})),
        // main, resumed: answers with the result
        Reply::text("Thanks, you are subscribed."),
    ]);
    let agents = AgentRegistry::new()
        .agent("main", |_| Ok::<_, BuildError>(caller()))
        .agent("collector", |_| Ok::<_, BuildError>(collector()));
    let session = Session::builder()
        .llm(llm.clone())
        .restore(snapshot, agents)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    assert_eq!(session.current_agent().await.unwrap(), "collector");
    session.run("a@b.c").await.unwrap();
    common::settled(&session).await;
    assert_eq!(session.current_agent().await.unwrap(), "main");
    let history = session.history().await;
    let main = history.agents.iter().find(|a| a.agent == "main").unwrap();
    // The tool that awaited the task was in the old process: the task's result, as
    // JSON, is its call's output.
    assert_eq!(output(&main.chat, "call_1"), r#"{"email":"a@b.c"}"#);
    let last = llm.requests().last().unwrap().clone();
    assert_eq!(&*last.agent, "main");
    assert!(last.chat.output_of("call_1").is_some());
    assert_eq!(
        main.chat.items().last().unwrap().text(),
        Some("Thanks, you are subscribed.")
    );
    assert_invariant(&main.chat);
    session.close().await.unwrap();
}

fn searching_agent(gate: Gate) -> Agent {
    let search = Tool::new("search", "Searches", move |ctx: RunContext, args: Query| {
        let gate = gate.clone();
        async move {
            ctx.update(format!("looking for {}", args.q)).await?;
            gate.wait().await;
            Ok::<_, ToolFailure>(format!("found {}", args.q))
        }
    });
    Agent::builder("agent-a")
        .instructions("Help.")
        .tool(search)
        .build()
        .unwrap()
}

#[actix::test]
async fn a_deferred_reply_pending_behind_speech_runs_after_the_restore() {
    let gate = Gate::new();
    let llm = ScriptedLlm::new([
        Reply::tool_call("search", json!({"q": "flights"})),
        Reply::text("Searching now."),
    ]);
    let out = RecordingOutput::manual_playout();
    let session = Session::builder()
        .llm(llm)
        .agent(searching_agent(gate.clone()))
        .output(out.clone())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let mut events = session.subscribe();
    let _turn = spawn_turn(&session, "find flights");
    wait_on(&mut events, event::speech_created()).await;
    // The search ends while "Searching now." plays: its reply waits for the playout.
    gate.open();
    wait_on(&mut events, event::output_added("call_1/finished")).await;
    let snapshot = session.snapshot().await.unwrap();
    session.close().await.unwrap();

    let llm = ScriptedLlm::new([Reply::text("I found flights.")]);
    let agents = AgentRegistry::new().agent("agent-a", move |_| {
        Ok::<_, BuildError>(searching_agent(Gate::new()))
    });
    let session = Session::builder()
        .llm(llm.clone())
        .restore(snapshot, agents)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    common::settled(&session).await;
    let requests = llm.requests();
    assert_eq!(requests.len(), 1, "one reply, for the pending items");
    assert_eq!(requests[0].deferred_call_ids, ["call_1/finished"]);
    let chat = session.chat_context().await.unwrap();
    // The speech that was playing is cut as a barge-in would cut it: what was heard is
    // unknown, so it is marked interrupted.
    let said: Vec<_> = chat
        .items()
        .iter()
        .filter_map(|item| match item {
            ChatItem::Message(m) if m.role == ChatRole::Assistant => {
                Some((m.content.as_str(), m.interrupted))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        said,
        [("Searching now.", true), ("I found flights.", false)]
    );
    assert_invariant(&chat);
    session.close().await.unwrap();
}

fn waiter() -> Agent {
    Agent::builder("waiter").build().unwrap()
}

/// A session restored from `snapshot` on this engine, its waiter built again.
async fn restored_waiter(snapshot: SessionSnapshot, llm: &std::sync::Arc<ScriptedLlm>) -> Session {
    Session::builder()
        .llm(llm.clone())
        .restore(
            snapshot,
            AgentRegistry::new().agent("waiter", |_| Ok::<_, BuildError>(waiter())),
        )
        .start(&Engine::current().unwrap())
        .await
        .unwrap()
}

#[actix::test]
async fn during_a_barge_in_the_speech_is_cut_and_the_users_words_start_the_next_turn() {
    tokio::time::pause();
    let llm = ScriptedLlm::new([Reply::text("Today we have soup, fish and chips.")]);
    let out = RecordingOutput::manual_playout().pausable();
    let session = Session::builder()
        .llm(llm)
        .agent(waiter())
        .output(out.clone())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let mut events = session.subscribe();
    let _turn = spawn_turn(&session, "what is on the menu?");
    // The reply is generated and plays; the user starts talking over it.
    wait_on(
        &mut events,
        event::item_added("the reply", |item| {
            matches!(item, ChatItem::Message(m) if m.role == ChatRole::Assistant).then_some(())
        }),
    )
    .await;
    session.user_started_speaking();
    wait_on(&mut events, event::agent_state(AgentState::Listening)).await;
    let snapshot = session.snapshot().await.unwrap();
    session.close().await.unwrap();

    let llm = ScriptedLlm::new([Reply::text("The fish, then.")]);
    let session = restored_waiter(snapshot, &llm).await;
    session.run("the fish please").await.unwrap();
    let requests = llm.requests();
    assert_eq!(
        requests.len(),
        1,
        "the step had ended: nothing is asked again"
    );
    let items: Vec<_> = requests[0]
        .chat
        .items()
        .iter()
        .filter_map(|item| match item {
            ChatItem::Message(m) => Some((m.role, m.content.as_str(), m.interrupted)),
            _ => None,
        })
        .collect();
    // What the user heard of the paused speech is unknown: it is cut as a barge-in would
    // cut it, marked interrupted.
    assert_eq!(
        items,
        [
            (ChatRole::User, "what is on the menu?", false),
            (
                ChatRole::Assistant,
                "Today we have soup, fish and chips.",
                true
            ),
            (ChatRole::User, "the fish please", false),
        ]
    );
    assert_invariant(&requests[0].chat);
    session.close().await.unwrap();
}

#[actix::test]
async fn a_step_in_flight_is_not_taken_and_is_asked_again_after_the_restore() {
    tokio::time::pause();
    let llm = ScriptedLlm::new([Reply::text("Let me think").and_stall()]);
    let thinker = || {
        Agent::builder("thinker")
            .instructions("Think.")
            .build()
            .unwrap()
    };
    let session = Session::builder()
        .llm(llm.clone())
        .agent(thinker())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let mut events = session.subscribe();
    let _turn = spawn_turn(&session, "what is 6 times 7?");
    wait_on(&mut events, event::speech_created()).await;
    let snapshot = session.snapshot().await.unwrap();
    let asked = llm.requests()[0].clone();
    session.close().await.unwrap();

    let llm = ScriptedLlm::new([Reply::text("42.")]);
    let session = Session::builder()
        .llm(llm.clone())
        .restore(
            snapshot,
            AgentRegistry::new().agent("thinker", move |_| Ok::<_, BuildError>(thinker())),
        )
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    common::settled(&session).await;
    let again = &llm.requests()[0];
    assert_eq!(
        again.chat.items(),
        asked.chat.items(),
        "the same step, asked again"
    );
    assert_eq!(again.instructions, asked.instructions);
    let chat = session.chat_context().await.unwrap();
    assert_eq!(chat.items().last().unwrap().text(), Some("42."));
    assert!(
        !chat
            .items()
            .iter()
            .any(|i| i.text() == Some("Let me think")),
        "nothing of the stream in flight was kept"
    );
    session.close().await.unwrap();
}

#[actix::test]
async fn a_snapshot_asked_during_a_handoff_waits_for_the_switch_to_end() {
    let entering = Gate::new();
    let e = entering.clone();
    let second = move || {
        let e = e.clone();
        Agent::builder("second")
            .on_enter(move |_ctx| {
                let e = e.clone();
                async move { e.wait().await }
            })
            .build()
            .unwrap()
    };
    let llm = ScriptedLlm::new([]);
    llm.otherwise(Reply::text("Hi."));
    let session = Session::builder()
        .llm(llm)
        .agent(Agent::builder("first").build().unwrap())
        .inspect(true)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let handoff = {
        let (session, agent) = (session.clone(), second());
        actix::spawn(async move { session.update_agent(agent).await })
    };
    let snapshot = {
        let session = session.clone();
        actix::spawn(async move { session.snapshot().await })
    };
    // The new agent's `on_enter` holds the switch: the session has the request, and
    // answers it only once the switch has ended.
    let inspector = session.inspector().unwrap();
    inspector
        .wait_for("session/s1", "TakeSnapshot", Duration::from_secs(5))
        .await
        .unwrap();
    tokio::task::yield_now().await;
    assert!(
        !snapshot.is_finished(),
        "a snapshot was taken in the middle of a switch"
    );
    entering.open();
    handoff.await.unwrap().unwrap();
    let snapshot: SessionSnapshot = snapshot.await.unwrap().unwrap();
    session.close().await.unwrap();
    let session = Session::builder()
        .llm(ScriptedLlm::new([Reply::text("Hello from second.")]))
        .restore(
            snapshot,
            AgentRegistry::new()
                .agent("first", |_| Agent::builder("first").build())
                .agent("second", move |_| Ok::<_, BuildError>(second())),
        )
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    assert_eq!(session.current_agent().await.unwrap(), "second");
    session.close().await.unwrap();
}

/// Words the user said are held for the end of their turn (endpointing) when the
/// snapshot is taken: the host will not send them again, so the snapshot keeps them, and
/// the restored session makes them a turn together with the words that follow.
#[actix::test]
async fn the_users_words_waiting_for_the_end_of_their_turn_are_kept() {
    tokio::time::pause();
    let session = Session::builder()
        .llm(ScriptedLlm::new([]))
        .agent(waiter())
        .endpointing_delay(Duration::from_millis(500))
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.transcript("a table for", true);
    // The final is held: no turn yet, so the snapshot is taken with the words pending.
    let snapshot = session.snapshot().await.unwrap();
    let json: serde_json::Value = serde_json::from_slice(&snapshot.to_json()).unwrap();
    assert_eq!(json["head"]["state"]["user_words"], json!("a table for"));
    session.close().await.unwrap();

    let llm = ScriptedLlm::new([Reply::text("Four, noted.")]);
    let session = restored_waiter(snapshot, &llm).await;
    session.transcript("four", true);
    tokio::time::timeout(Duration::from_secs(60), session.wait_for_settled())
        .await
        .expect("the restored session makes the held words a turn within the delay")
        .unwrap();
    let requests = llm.requests();
    assert_eq!(requests.len(), 1, "one turn for both finals");
    let users: Vec<_> = requests[0]
        .chat
        .items()
        .iter()
        .filter_map(|item| match item {
            ChatItem::Message(m) if m.role == ChatRole::User => Some(m.content.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(users, ["a table for four"]);
    session.close().await.unwrap();
}
