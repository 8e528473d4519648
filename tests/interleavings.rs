//! The interleavings SPEC §2–§4 name, each forced with explicit synchronisation: a pause
//! while a deferred reply is pending, a stop while a tool's update is held, a barge of
//! host turns during a handoff.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{assert_invariant, call_ids, spawn_turn, wait_event, wait_started, Log, Query};
use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{Gate, RecordingOutput, Reply, ScriptedLlm};
use switchboard::{NoArgs, ToolChoice, UpdateError};

#[derive(Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
struct Email {
    email: String,
}

fn collector() -> Agent {
    let save = Tool::new(
        "save_email",
        "Saves it",
        |_ctx: RunContext, args: Email| async move { ToolReturn::complete_task(&args) },
    );
    Agent::builder("collector").tool(save).build().unwrap()
}

fn ask_email() -> Tool {
    Tool::new(
        "ask_email",
        "Collects an email",
        |ctx: RunContext, _: NoArgs| async move {
            let email: Email = ctx.run_task(collector()).await?;
            Ok::<_, ToolFailure>(format!("email is {}", email.email))
        },
    )
}

/// Sends its first update at once, then a second one when the gate opens, then waits.
fn two_updates(name: &'static str, gate: Gate) -> Tool {
    Tool::new(
        name,
        "Reports twice",
        move |ctx: RunContext, args: Query| {
            let gate = gate.clone();
            async move {
                ctx.update(format!("{} started", args.q)).await?;
                gate.wait().await;
                ctx.update(format!("{} changed", args.q)).await?;
                ctx.cancelled().await;
                Ok::<_, ToolFailure>(())
            }
        },
    )
}

#[actix::test]
async fn a_pause_takes_only_the_paused_agents_items_out_of_the_pending_reply() {
    let gate = Gate::new();
    let main = Agent::builder("main")
        .tool(two_updates("watch", gate.clone()))
        .tool(ask_email())
        .build()
        .unwrap();
    let llm = ScriptedLlm::new([]);
    llm.on_request(
        0,
        Reply::tool_call("watch", json!({"q": "door"})).and_tool_call("feed", json!({"q": "news"})),
    );
    llm.on_request(1, Reply::text("Watching."));
    llm.on_request(2, Reply::tool_call("ask_email", json!({})));
    llm.on_request(3, Reply::text("Some news came in."));
    llm.on_request(4, Reply::tool_call("save_email", json!({"email": "a@b.c"})));
    llm.otherwise(Reply::text("OK."));
    let io = RecordingOutput::manual_playout();
    let session = Session::builder()
        .llm(llm.clone())
        .agent(main)
        .toolset(Toolset::new("feeds").tool(two_updates("feed", gate.clone())))
        .output(io.clone())
        .grace_period(Duration::ZERO)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let mut events = session.subscribe();
    let first = spawn_turn(&session, "watch and feed");
    wait_event(&mut events, |e| {
        matches!(e, SessionEvent::SpeechCreated { .. }).then_some(())
    })
    .await;
    // While "Watching." plays, both tools report again: the reply is pending.
    gate.open();
    let mut seen = Vec::new();
    wait_event(&mut events, |e| {
        if let SessionEvent::ConversationItemAdded {
            item: ChatItem::FunctionCallOutput(o),
            ..
        } = e
        {
            seen.push(o.call_id.clone());
        }
        (seen.contains(&"call_1/update_1".to_owned())
            && seen.contains(&"call_2/update_1".to_owned()))
        .then_some(())
    })
    .await;
    // The user asks for something that pauses `main` before the pending reply runs.
    let second = spawn_turn(&session, "take my email");
    tokio::task::yield_now().await;
    io.played_out(io.last_speech().unwrap().id);
    first.await.unwrap().unwrap();
    // The collector answers the pending reply; the user hears it.
    let speech = wait_event(&mut events, |e| match e {
        SessionEvent::SpeechCreated { agent, speech } if agent == "collector" => Some(speech.id()),
        _ => None,
    })
    .await;
    io.played_out(speech);
    session.wait_for_inactive().await;

    let requests = llm.requests();
    assert_eq!(
        requests.len(),
        4,
        "{:#?}",
        requests.iter().map(|r| r.agent.clone()).collect::<Vec<_>>()
    );
    let reply = &requests[3];
    assert_eq!(&*reply.agent, "collector");
    assert_eq!(reply.tool_choice, ToolChoice::None);
    let instructions = reply.extra_instructions.as_deref().unwrap();
    assert!(instructions.contains("call_2/update_1"), "{instructions}");
    assert!(
        !instructions.contains("call_1/update_1"),
        "the paused agent's own item left the pending reply: {instructions}"
    );
    // The collector got the session item it lacked before being asked about it.
    assert!(reply.chat.contains_call("call_2/update_1"));
    assert!(!reply.chat.contains_call("call_1/update_1"));

    // Every later speech is played out at once from here on.
    let out = io.clone();
    let mut ev = session.subscribe();
    let player = actix::spawn(async move {
        while let Ok(event) = ev.recv().await {
            if let SessionEvent::SpeechCreated { speech, .. } = event {
                out.played_out(speech.id());
            }
        }
    });
    session.run("a@b.c").await.unwrap();
    let resumed = second.await.unwrap().unwrap();
    player.abort();
    assert!(resumed
        .function_outputs()
        .any(|o| o.output == "email is a@b.c"));
    let chat = session.chat_context().await.unwrap();
    assert_invariant(&chat);
    session.close().await.unwrap();
}

#[actix::test]
async fn a_held_update_of_a_run_stopped_mid_step_is_refused_and_recorded_nowhere() {
    // `job` updates twice at once: the second update is held because its step waits for
    // `ask_email`, whose sub-task pauses the agent and stops `job` meanwhile.
    let log = Log::default();
    let l = log.clone();
    let job = Tool::new("job", "Works", move |ctx: RunContext, _: Query| {
        let l = l.clone();
        async move {
            ctx.update("1").await?;
            let second = ctx.update("2").await;
            l.push(format!("{second:?}"));
            Ok::<_, ToolFailure>(())
        }
    });
    let llm = ScriptedLlm::new([
        Reply::tool_call("job", json!({"q": "x"})).and_tool_call("ask_email", json!({})),
        Reply::tool_call("save_email", json!({"email": "a@b.c"})),
        Reply::text("Got it."),
    ]);
    llm.otherwise(Reply::text("OK."));
    let session = Session::builder()
        .llm(llm.clone())
        .agent(
            Agent::builder("main")
                .tool(job)
                .tool(ask_email())
                .build()
                .unwrap(),
        )
        .inspect(true)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let turn = spawn_turn(&session, "work and ask");
    let inspector = session.inspector().unwrap();
    wait_started(&inspector, "activity/s1/collector#1").await;
    session.run("a@b.c").await.unwrap();
    let result = turn.await.unwrap().unwrap();
    assert_eq!(
        log.entries(),
        [format!(
            "{:?}",
            Err::<(), _>(UpdateError::ScopeClosed {
                call_id: "call_1".into()
            })
        )]
    );
    let chat = session.chat_context().await.unwrap();
    // The step's pairs first; the stopped run's terminal output after them; no update_1.
    assert_eq!(
        call_ids(&chat)[..4],
        ["call call_1", "call call_2", "out call_1", "out call_2"]
    );
    assert!(!chat.contains_call("call_1/update_1"));
    assert!(chat
        .output_of("call_1/finished")
        .unwrap()
        .output
        .contains("paused"));
    assert_eq!(result.assistant_messages().collect::<Vec<_>>(), ["Got it."]);
    assert_invariant(&chat);
    session.close().await.unwrap();
}

#[actix::test]
async fn turns_sent_during_a_handoff_run_in_order_on_the_new_agent() {
    let gate = Gate::new();
    let g = gate.clone();
    let b = Agent::builder("agent-b")
        .on_enter(move |_ctx| {
            let g = g.clone();
            async move { g.wait().await }
        })
        .build()
        .unwrap();
    let llm = ScriptedLlm::new([]);
    llm.rule(|req| {
        let last = req.chat.items().iter().rev().find_map(|i| match i {
            ChatItem::Message(m) if m.role == ChatRole::User => Some(m.content.clone()),
            _ => None,
        })?;
        Some(Reply::text(format!("{} heard {last}", req.agent)))
    });
    let session = Session::builder()
        .llm(llm.clone())
        .agent(Agent::builder("agent-a").build().unwrap())
        .inspect(true)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let s = session.clone();
    let handoff = actix::spawn(async move { s.update_agent(b).await });
    session
        .inspector()
        .unwrap()
        .wait_for(
            "activity/s1/agent-b#1",
            "StartActivity",
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    let mut turns = Vec::new();
    for text in ["one", "two", "three"] {
        let s = session.clone();
        turns.push(actix::spawn(async move { s.run(text).await }));
        tokio::task::yield_now().await;
    }
    gate.open();
    handoff.await.unwrap().unwrap();
    let mut answers = Vec::new();
    for turn in turns {
        let result = turn.await.unwrap().unwrap();
        answers.extend(result.assistant_messages().map(str::to_owned));
    }
    assert_eq!(
        answers,
        [
            "agent-b heard one",
            "agent-b heard two",
            "agent-b heard three"
        ]
    );
    session.close().await.unwrap();
}

#[actix::test]
async fn a_closed_activity_drops_its_pending_reply() {
    let gate = Gate::new();
    let llm = ScriptedLlm::new([
        Reply::tool_call("watch", json!({"q": "door"})),
        Reply::text("Watching."),
    ]);
    llm.otherwise(Reply::text("OK."));
    let io = RecordingOutput::manual_playout();
    let session = Session::builder()
        .llm(llm.clone())
        .agent(
            Agent::builder("agent-a")
                .tool(two_updates("watch", gate.clone()))
                .build()
                .unwrap(),
        )
        .output(io.clone())
        .grace_period(Duration::ZERO)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let mut events = session.subscribe();
    let turn = spawn_turn(&session, "watch");
    wait_event(&mut events, |e| {
        matches!(e, SessionEvent::SpeechCreated { .. }).then_some(())
    })
    .await;
    gate.open();
    wait_event(&mut events, |e| match e {
        SessionEvent::ConversationItemAdded {
            item: ChatItem::FunctionCallOutput(o),
            ..
        } if o.call_id == "call_1/update_1" => Some(()),
        _ => None,
    })
    .await;
    // The reply for `/update_1` is pending; a handoff is queued before it can run.
    let s = session.clone();
    let handoff = actix::spawn(async move {
        s.update_agent(Agent::builder("agent-b").build().unwrap())
            .await
    });
    tokio::task::yield_now().await;
    io.played_out(io.last_speech().unwrap().id);
    turn.await.unwrap().unwrap();
    handoff.await.unwrap().unwrap();
    common::settled(&session).await;
    assert!(
        llm.requests()
            .iter()
            .all(|r| r.tool_choice != ToolChoice::None),
        "the closed agent's pending reply must not run"
    );
    assert_eq!(llm.request_count(), 2);
    assert!(!session
        .chat_context()
        .await
        .unwrap()
        .contains_call("call_1/update_1"));
    session.close().await.unwrap();
}

#[actix::test]
async fn the_running_call_registry_grows_and_shrinks() {
    let gates = [Gate::new(), Gate::new()];
    let (g0, g1) = (gates[0].clone(), gates[1].clone());
    let job = Tool::new("job", "Works", move |ctx: RunContext, args: Query| {
        let gate = if args.q == "a" {
            g0.clone()
        } else {
            g1.clone()
        };
        async move {
            ctx.update(format!("{} started", args.q)).await?;
            gate.wait().await;
            Ok::<_, ToolFailure>(())
        }
    })
    .allow_cancellation(true);
    let llm = ScriptedLlm::new([
        Reply::tool_call("job", json!({"q": "a"})).and_tool_call("job", json!({"q": "b"}))
    ]);
    llm.rule(|r| (r.tool_choice == ToolChoice::None).then(|| Reply::text("Noted.")));
    llm.otherwise(Reply::tool_call("get_running_tasks", json!({})));
    let session = Session::builder()
        .llm(llm.clone())
        .agent(Agent::builder("agent-a").build().unwrap())
        .toolset(Toolset::new("jobs").tool(job))
        .max_tool_steps(1)
        .inspect(true)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let inspector = session.inspector().unwrap();
    let list = || async {
        let result = session.run("what is running?").await.unwrap();
        let out = result.function_outputs().last().unwrap().output.clone();
        let calls: serde_json::Value = serde_json::from_str(&out).unwrap();
        calls
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["call_id"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    session.run("start two").await.unwrap();
    assert_eq!(list().await, ["call_1", "call_2"]);
    gates[0].open();
    inspector
        .wait_until_stopped("tool/s1/1:call_1", Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(list().await, ["call_2"]);
    gates[1].open();
    inspector
        .wait_until_stopped("tool/s1/2:call_2", Duration::from_secs(5))
        .await
        .unwrap();
    assert!(list().await.is_empty());
    session.close().await.unwrap();
}
