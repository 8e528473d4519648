//! SPEC §6: the `update`, duplicate and `reply` texts, as format strings or closures, set
//! on the session, an agent or a toolset; the most specific one wins.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::Query;
use serde_json::json;
use switchboard::prelude::*;
use switchboard::prompts::{
    DuplicatePromptArgs, Prompts, ReplyPromptArgs, Template, UpdatePromptArgs,
};
use switchboard::testing::{Reply, ScriptedLlm};
use switchboard::{BuildError, ToolChoice};

fn updater(name: &'static str) -> Tool {
    Tool::new(name, "Updates", |ctx: RunContext, args: Query| async move {
        ctx.update(args.q).await?;
        std::future::pending::<()>().await;
        Ok::<_, ToolFailure>(())
    })
}

fn update(t: &str) -> Prompts {
    Prompts::new().update(Template::format(t).unwrap())
}

#[actix::test]
async fn the_most_specific_update_template_wins() {
    tokio::time::pause();
    let llm = ScriptedLlm::new([Reply::tool_call("in_toolset", json!({"q": "1"}))
        .and_tool_call("in_agent_toolset", json!({"q": "2"}))
        .and_tool_call("bare", json!({"q": "3"}))
        .and_tool_call("session_default", json!({"q": "4"}))]);
    llm.otherwise(Reply::text("OK."));
    let agent = Agent::builder("agent-a")
        .tool(updater("bare"))
        .toolset(Toolset::new("agent_jobs").tool(updater("in_agent_toolset")))
        .prompts(update("agent says {message}"))
        .build()
        .unwrap();
    let session =
        Session::builder()
            .llm(llm)
            .agent(agent)
            .toolset(Toolset::new("jobs").tool(updater("in_toolset")).prompts(
                Prompts::new().update(Template::closure(|a: &UpdatePromptArgs| {
                    format!("[{}:{}] {}", a.function_name, a.call_id, a.message)
                })),
            ))
            .toolset(Toolset::new("plain").tool(updater("session_default")))
            .prompts(update("session says {message}"))
            .start(&Engine::current().unwrap())
            .await
            .unwrap();
    let result = session.run("go").await.unwrap();
    let outs: Vec<String> = result
        .function_outputs()
        .map(|o| o.output.clone())
        .collect();
    assert_eq!(
        outs,
        [
            "[in_toolset:call_1] 1", // toolset closure
            "agent says 2",          // owning agent (agent-scoped toolset)
            "agent says 3",          // owning agent (bare tools)
            "session says 4",        // session-scoped toolset without its own: session
        ]
    );
    session.close().await.unwrap();
}

#[actix::test]
async fn duplicate_and_reply_templates_apply() {
    tokio::time::pause(); // the watch body ignores cancellation: its grace period passes at once
    let llm = ScriptedLlm::new([
        Reply::tool_call("watch", json!({"q": "a"})),
        Reply::text("Watching."),
        Reply::tool_call("watch", json!({"q": "b"})),
        Reply::text("Already."),
    ]);
    // Deferred replies (tools off) do not consume the script.
    llm.rule(|r| (r.tool_choice == ToolChoice::None).then(|| Reply::text("Noted.")));
    let watch = Tool::new("watch", "Watches", |ctx: RunContext, _: Query| async move {
        ctx.update("on").await?;
        ctx.update("still on").await?;
        std::future::pending::<()>().await;
        Ok::<_, ToolFailure>(())
    });
    let agent = Agent::builder("agent-a")
        .tool(watch)
        .prompts(
            Prompts::new()
                .duplicate_reject(
                    Template::format("busy: {function_name}\n{running_calls}").unwrap(),
                )
                .reply(Template::closure(|a: &ReplyPromptArgs| {
                    format!("agent reply for {}", a.pending_call_ids.join(","))
                })),
        )
        .build()
        .unwrap();
    let session = Session::builder()
        .llm(llm.clone())
        .agent(agent)
        .prompts(
            Prompts::new().reply(Template::format("session reply {pending_call_ids}").unwrap()),
        )
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("watch").await.unwrap();
    session.wait_for_inactive().await;
    let rejected = session.run("watch again").await.unwrap();
    let text = rejected.function_outputs().next().unwrap().output.clone();
    assert!(text.starts_with("busy: watch\n{"), "{text}");
    let deferred: Vec<_> = llm
        .requests()
        .into_iter()
        .filter(|r| r.tool_choice == ToolChoice::None)
        .collect();
    assert!(!deferred.is_empty());
    assert_eq!(
        deferred[0].extra_instructions.as_deref(),
        Some("agent reply for call_1/update_1"),
        "the current agent's reply template wins over the session's"
    );
    session.close().await.unwrap();
}

#[test]
fn an_unknown_field_is_an_error_when_the_template_is_built() {
    let err = Template::<DuplicatePromptArgs>::format("{function_name} {message}").unwrap_err();
    assert_eq!(
        err,
        BuildError::UnknownTemplateField {
            template: "duplicate".into(),
            field: "message".into(),
            known: "function_name, running_calls".into(),
        }
    );
    assert!(Template::<UpdatePromptArgs>::format("{message").is_err());
}
