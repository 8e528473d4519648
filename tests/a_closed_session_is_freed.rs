//! A closed session is freed even when one of its agents' tools holds a `Session` of it:
//! the host's handle must not reach the agents once the session closed, or the session
//! (and its runtime's resources) would outlive every handle the host let go of.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex, Weak};

use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{Reply, ScriptedLlm};
use switchboard::NoArgs;

/// A tool that keeps a handle of the session it runs in, and a way to see it freed.
fn tool_holding_the_session() -> (Tool, Arc<Mutex<Option<Session>>>) {
    let host: Arc<Mutex<Option<Session>>> = Arc::new(Mutex::new(None));
    let held = host.clone();
    let tool = Tool::new(
        "whoami",
        "Says the session id",
        move |_: RunContext, _: NoArgs| {
            let held = held.clone();
            async move {
                let id = held.lock().unwrap().as_ref().map(|s| s.id().to_string());
                Ok::<_, ToolFailure>(id.unwrap_or_default())
            }
        },
    );
    (tool, host)
}

#[actix::test]
async fn a_tool_holding_its_session_does_not_keep_it_after_close() {
    tokio::time::pause();
    let (tool, host) = tool_holding_the_session();
    let llm = ScriptedLlm::new([
        Reply::tool_call("whoami", json!({})),
        Reply::text("You are in s1."),
    ]);
    let session = Session::builder()
        .llm(llm)
        .agent(Agent::builder("a").tool(tool).build().unwrap())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    *host.lock().unwrap() = Some(session.clone());
    let weak: Weak<Mutex<Option<Session>>> = Arc::downgrade(&host);
    drop(host);
    session.run("who am I?").await.unwrap();
    let chat = session.chat_context().await.unwrap();
    assert!(
        chat.items().iter().any(|item| matches!(
            item,
            ChatItem::FunctionCallOutput(o) if o.output == session.id().to_string()
        )),
        "the tool read the session through its handle"
    );
    session.close().await.unwrap();
    drop(session);
    assert!(
        weak.upgrade().is_none(),
        "the tool (and the session handle it holds) is still reachable after close"
    );
}
