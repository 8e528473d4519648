//! What chat context an agent starts with: none, all, the last N items (never an output
//! without its call) or one given, said by the handoff, else by the agent, else by the
//! session's `inherit_chat_context`; for the first agent and for sub-tasks too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{assert_invariant, Query};
use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{Reply, ScriptedLlm};
use switchboard::{AgentBuilder, FunctionCall, FunctionCallOutput};

/// The items of the first request `agent` made, one label each.
fn first_request_of(llm: &ScriptedLlm, agent: &str) -> Vec<String> {
    let request = llm
        .requests()
        .into_iter()
        .find(|r| &*r.agent == agent)
        .unwrap_or_else(|| panic!("{agent} made no request"));
    request
        .chat
        .items()
        .iter()
        .map(|item| match item {
            ChatItem::Message(m) => format!("{:?} {}", m.role, m.content),
            ChatItem::FunctionCall(c) => format!("call {}", c.call_id),
            ChatItem::FunctionCallOutput(o) => format!("out {}", o.call_id),
            ChatItem::AgentHandoff { .. } => "handoff".to_owned(),
            _ => "other".to_owned(),
        })
        .collect()
}

/// A "transfer" tool handing off to `to` with `start` (none: the handoff says nothing).
fn transfer(to: Agent, start: Option<StartingChat>) -> Tool {
    Tool::new(
        "transfer",
        "Transfers",
        move |_ctx: RunContext, _: Query| {
            let mut handoff = Handoff::to(to.clone());
            if let Some(start) = start.clone() {
                handoff = handoff.with_chat(start);
            }
            async move { Ok::<_, ToolFailure>(handoff) }
        },
    )
}

/// Runs "hello" (answered "Hi."), then "transfer me" (a transfer call), then "and now?"
/// (answered by the new agent); returns what the new agent saw first.
async fn handoff_sees(
    front: AgentBuilder,
    to: Agent,
    start: Option<StartingChat>,
    inherit: bool,
) -> Vec<String> {
    let name = to.name().to_owned();
    let llm = ScriptedLlm::new([
        Reply::text("Hi."),
        Reply::tool_call("transfer", json!({"q": "x"})),
        Reply::text("Billing here."),
    ]);
    let session = Session::builder()
        .llm(llm.clone())
        .agent(front.tool(transfer(to, start)).build().unwrap())
        .inherit_chat_context(inherit)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("hello").await.unwrap();
    session.run("transfer me").await.unwrap();
    session.run("and now?").await.unwrap();
    assert_eq!(session.current_agent().await.unwrap(), name);
    assert_invariant(&session.chat_context().await.unwrap());
    session.close().await.unwrap();
    first_request_of(&llm, &name)
}

fn billing() -> Agent {
    Agent::builder("billing").build().unwrap()
}

#[actix::test]
async fn the_session_setting_decides_when_nothing_else_does() {
    let all = handoff_sees(Agent::builder("front"), billing(), None, true).await;
    assert_eq!(
        all,
        [
            "User hello",
            "Assistant Hi.",
            "User transfer me",
            "call call_1",
            "out call_1",
            "handoff",
            "User and now?"
        ]
    );
    let none = handoff_sees(Agent::builder("front"), billing(), None, false).await;
    assert_eq!(none, ["handoff", "User and now?"]);
}

#[actix::test]
async fn the_last_items_keep_no_output_without_its_call() {
    // The last 3 of the front's chat are: transfer me, call, output.
    let three = handoff_sees(
        Agent::builder("front"),
        billing(),
        Some(StartingChat::LastItems(3)),
        false,
    )
    .await;
    assert_eq!(
        three,
        [
            "User transfer me",
            "call call_1",
            "out call_1",
            "handoff",
            "User and now?"
        ]
    );
    // The last 1 is the output alone: it goes, its call is not kept.
    let one = handoff_sees(
        Agent::builder("front"),
        billing(),
        Some(StartingChat::LastItems(1)),
        true,
    )
    .await;
    assert_eq!(one, ["handoff", "User and now?"]);
}

#[actix::test]
async fn the_handoff_beats_the_agent_which_beats_the_session() {
    let fresh_billing = || {
        Agent::builder("billing")
            .starting_chat(StartingChat::Empty)
            .build()
            .unwrap()
    };
    // The agent asks for nothing, over the session's "inherit".
    let agent_says = handoff_sees(Agent::builder("front"), fresh_billing(), None, true).await;
    assert_eq!(agent_says, ["handoff", "User and now?"]);
    // The handoff asks for everything, over the agent.
    let handoff_says = handoff_sees(
        Agent::builder("front"),
        fresh_billing(),
        Some(StartingChat::All),
        false,
    )
    .await;
    assert_eq!(handoff_says.len(), 7, "{handoff_says:?}");
    assert_eq!(handoff_says[0], "User hello");
}

#[actix::test]
async fn a_given_chat_starts_the_first_agent_and_its_call_ids_stay_unique() {
    let earlier = ChatContext::from(vec![
        ChatItem::message(ChatRole::User, "I was charged twice"),
        ChatItem::FunctionCall(FunctionCall {
            call_id: "call_1".into(),
            name: "lookup".into(),
            arguments: "{}".into(),
        }),
        ChatItem::FunctionCallOutput(FunctionCallOutput {
            call_id: "call_1".into(),
            name: "lookup".into(),
            output: "two charges of $12".into(),
            is_error: false,
        }),
    ]);
    let lookup = Tool::new("lookup", "Looks up", |_ctx: RunContext, _: Query| async {
        Ok::<_, ToolFailure>("refund issued")
    });
    let agent = Agent::builder("support")
        .tool(lookup)
        .starting_chat(StartingChat::given(earlier).unwrap())
        .build()
        .unwrap();
    // The model reuses the given context's id: the engine gives the new call a fresh one.
    let llm = ScriptedLlm::new([
        Reply::tool_call("lookup", json!({"q": "refund"})),
        Reply::text("Refunded."),
    ]);
    let session = Session::builder()
        .llm(llm.clone())
        .agent(agent)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("please refund one").await.unwrap();
    assert_eq!(
        first_request_of(&llm, "support"),
        [
            "User I was charged twice",
            "call call_1",
            "out call_1",
            "User please refund one"
        ]
    );
    let chat = session.chat_context().await.unwrap();
    assert!(chat.contains_call("call_1~2"), "{:?}", chat.items());
    assert_invariant(&chat);
    session.close().await.unwrap();
}

#[actix::test]
async fn a_given_chat_that_breaks_the_call_rule_is_refused() {
    let dangling = ChatContext::from(vec![ChatItem::FunctionCall(FunctionCall {
        call_id: "call_9".into(),
        name: "lookup".into(),
        arguments: "{}".into(),
    })]);
    let err = StartingChat::given(dangling).unwrap_err();
    assert!(matches!(err, BuildError::InvalidChat { .. }), "{err:?}");
    assert!(err.to_string().contains("call_9"), "{err}");
}

#[derive(serde::Deserialize, Debug, PartialEq)]
struct Verdict {
    ok: bool,
}

#[actix::test]
async fn a_sub_task_starts_empty_unless_its_agent_asks_for_the_callers_chat() {
    for (start, expected) in [
        (None, vec!["User check"]),
        (
            Some(StartingChat::All),
            // The caller's call waiting for the task has no output yet: it is not passed on.
            vec!["User please verify", "User check"],
        ),
    ] {
        let mut checker = Agent::builder("checker").tool(Tool::new(
            "done",
            "Ends the check",
            |_ctx: RunContext, _: Query| async { ToolReturn::complete_task(&json!({"ok": true})) },
        ));
        if let Some(start) = start {
            checker = checker.starting_chat(start);
        }
        let checker = checker.build().unwrap();
        let verify = Tool::new("verify", "Verifies", move |ctx: RunContext, _: Query| {
            let checker = checker.clone();
            async move {
                let verdict: Verdict = ctx.run_task(checker).await?;
                Ok::<_, ToolFailure>(format!("ok: {}", verdict.ok))
            }
        });
        let llm = ScriptedLlm::new([
            Reply::tool_call("verify", json!({"q": "x"})),
            Reply::tool_call("done", json!({"q": "x"})),
            Reply::text("Verified."),
        ]);
        let checker_llm = llm.clone();
        let session = Session::builder()
            .llm(llm)
            .agent(Agent::builder("front").tool(verify).build().unwrap())
            .inspect(true)
            .start(&Engine::current().unwrap())
            .await
            .unwrap();
        let run = common::spawn_turn(&session, "please verify");
        let inspector = session.inspector().unwrap();
        common::wait_started(&inspector, "activity/s1/checker#1").await;
        session.wait_for_inactive().await;
        session.run("check").await.unwrap();
        run.await.unwrap().unwrap();
        let seen: Vec<String> = first_request_of(&checker_llm, "checker")
            .into_iter()
            .filter(|label| label != "handoff")
            .collect();
        assert_eq!(seen, expected);
        session.close().await.unwrap();
    }
}
