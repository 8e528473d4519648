//! SPEC §16, telemetry: the engine's spans for session, turn, LLM request, tool call and
//! handoff are children of the host's span current at the call that caused them, as an
//! OpenTelemetry pipeline (through `tracing-opentelemetry`) receives them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{Reply, ScriptedLlm};
use switchboard::NoArgs;
use switchboard_telemetry_tests::Pipeline;
use tracing::Instrument as _;

/// The attributes the trees below show.
const SHOWN: &[&str] = &["sid", "session", "agent", "kind", "tool", "from", "to"];

fn receptionist() -> (Agent, std::sync::Arc<ScriptedLlm>) {
    let billing = Agent::builder("billing").build().unwrap();
    let transfer = Tool::new(
        "transfer",
        "Transfers to billing",
        move |_ctx: RunContext, _: NoArgs| {
            let billing = billing.clone();
            async move { Ok::<_, ToolFailure>(Handoff::to(billing)) }
        },
    );
    let lookup = Tool::new("lookup", "Looks up", |_ctx: RunContext, _: NoArgs| async {
        Ok::<_, ToolFailure>("42")
    });
    let llm = ScriptedLlm::new([
        Reply::tool_call("lookup", json!({})),
        Reply::text("Let me transfer you.").and_tool_call("transfer", json!({})),
    ]);
    let agent = Agent::builder("reception")
        .tool(lookup)
        .tool(transfer)
        .build()
        .unwrap();
    (agent, llm)
}

#[switchboard::test]
async fn a_tool_turn_with_a_handoff_is_one_tree_under_the_host_span() {
    let pipeline = Pipeline::install();
    let engine = Engine::current().unwrap();
    let (agent, llm) = receptionist();
    let call = tracing::info_span!("call", sid = "CA1");
    async {
        let session = Session::builder()
            .id("CA1")
            .llm(llm)
            .agent(agent)
            .start(&engine)
            .await
            .unwrap();
        let result = session.run("a billing question").await.unwrap();
        assert_eq!(result.handoff(), Some("billing"));
        session.close().await.unwrap();
    }
    .instrument(call)
    .await;

    // The host's span, the session under it, and each turn's work under the turn: its
    // LLM requests, its tool calls, and the handoff its tool asked for.
    assert_eq!(
        pipeline.tree(SHOWN),
        "\
call {sid=CA1}
  session {session=CA1}
    turn {session=CA1 agent=reception kind=user}
      llm_request {session=CA1 agent=reception}
      tool_run {session=CA1 agent=reception tool=lookup}
      llm_request {session=CA1 agent=reception}
      tool_run {session=CA1 agent=reception tool=transfer}
      handoff {session=CA1 from=reception to=billing}
"
    );
}

#[switchboard::test]
async fn a_call_under_another_host_span_puts_its_work_there_and_links_the_session() {
    let pipeline = Pipeline::install();
    let engine = Engine::current().unwrap();
    let billing = Agent::builder("billing").build().unwrap();
    let llm = ScriptedLlm::new([Reply::text("Hello."), Reply::text("Hi again.")]);
    let session = Session::builder()
        .id("CA2")
        .llm(llm)
        .agent(Agent::builder("reception").build().unwrap())
        .start(&engine)
        .instrument(tracing::info_span!("call", sid = "CA2"))
        .await
        .unwrap();
    // A WebSocket message handled under its own span: the turn it asks for, and a handoff
    // the host asks for, go under that span.
    session
        .run("hello")
        .instrument(tracing::info_span!("ws_message", sid = "CA2"))
        .await
        .unwrap();
    session
        .update_agent(billing)
        .instrument(tracing::info_span!("supervisor", sid = "CA2"))
        .await
        .unwrap();
    // No span current: the session's own.
    session.run("hello again").await.unwrap();
    session.close().await.unwrap();
    // The handle holds the session's span (a span ends when its last holder lets go).
    drop(session);

    assert_eq!(
        pipeline.tree(SHOWN),
        "\
call {sid=CA2}
  session {session=CA2}
    turn {session=CA2 agent=billing kind=user}
      llm_request {session=CA2 agent=billing}
ws_message {sid=CA2}
  turn {session=CA2 agent=reception kind=user}
    llm_request {session=CA2 agent=reception}
supervisor {sid=CA2}
  handoff {session=CA2 from=reception to=billing}
"
    );
    // Work put under another span links back to its session.
    let spans = pipeline.spans();
    let session_span = spans.iter().find(|s| s.name == "session").unwrap();
    for name in ["turn", "handoff"] {
        let linked = spans
            .iter()
            .filter(|s| s.name == name && s.parent != session_span.id)
            .collect::<Vec<_>>();
        assert!(!linked.is_empty(), "a {name} under a host span");
        for span in linked {
            assert_eq!(span.links, [session_span.id], "{name} links its session");
        }
    }
}

#[switchboard::test]
async fn a_final_transcript_parents_the_user_turn_it_makes() {
    let pipeline = Pipeline::install();
    let engine = Engine::current().unwrap();
    let llm = ScriptedLlm::new([Reply::text("Sure.")]);
    let session = Session::builder()
        .id("CA3")
        .llm(llm)
        .agent(Agent::builder("reception").build().unwrap())
        .start(&engine)
        .await
        .unwrap();
    tracing::info_span!("stt", sid = "CA3").in_scope(|| {
        session.transcript("book a ta", false);
        session.transcript("book a table", true);
    });
    session.wait_for_settled().await.unwrap();
    session.close().await.unwrap();
    drop(session);

    assert_eq!(
        pipeline.tree(SHOWN),
        "\
session {session=CA3}
stt {sid=CA3}
  turn {session=CA3 agent=reception kind=user}
    llm_request {session=CA3 agent=reception}
"
    );
}

#[switchboard::test]
async fn a_reply_a_tool_asks_for_goes_under_the_tool_call() {
    let pipeline = Pipeline::install();
    let engine = Engine::current().unwrap();
    let remind = Tool::new(
        "remind",
        "Sets a reminder",
        |ctx: RunContext, _: NoArgs| async move {
            ctx.session()
                .generate_reply("Confirm the reminder.")
                .await?;
            Ok::<_, ToolFailure>("set")
        },
    );
    let llm = ScriptedLlm::new([
        Reply::tool_call("remind", json!({})),
        Reply::text("Done."),
        Reply::text("Your reminder is set."),
    ]);
    let session = Session::builder()
        .id("CA4")
        .llm(llm)
        .agent(Agent::builder("reception").tool(remind).build().unwrap())
        .start(&engine)
        .await
        .unwrap();
    session.run("remind me").await.unwrap();
    session.wait_for_settled().await.unwrap();
    session.close().await.unwrap();
    drop(session);

    // The queued reply is the tool call's doing: its turn sits under the call's span.
    assert_eq!(
        pipeline.tree(SHOWN),
        "\
session {session=CA4}
  turn {session=CA4 agent=reception kind=user}
    llm_request {session=CA4 agent=reception}
    tool_run {session=CA4 agent=reception tool=remind}
      turn {session=CA4 agent=reception kind=reply}
        llm_request {session=CA4 agent=reception}
    llm_request {session=CA4 agent=reception}
"
    );
}
