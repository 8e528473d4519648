//! Front code written once against the host API (`HostSession`) drives a local session:
//! a greeting, a typed turn, a spoken one (interim and final transcripts), a speech, a
//! barge-in, a switch to another agent, and the close. The cluster's tests run the same
//! call (`a_call`) over a remote session whose worker runs the same agents, and expect the same
//! record: a front does not depend on where the session runs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use switchboard::prelude::*;
use switchboard::testing::front::{a_call, run_front};
use switchboard::testing::{Reply, ScriptedLlm};
use switchboard::{HostSession, LlmRequest};

/// The agents of the cluster's test worker, answering from the request alone: `You said:
/// <text>` (`Concierge: <text>` for the concierge), and `Hello!` when asked to speak first.
fn scripted_model() -> Arc<ScriptedLlm> {
    let llm = ScriptedLlm::new([]);
    llm.rule(|request: &LlmRequest| {
        let items = request.chat.items();
        Some(Reply::text(match items.last() {
            Some(ChatItem::Message(m)) if m.role == ChatRole::User => {
                if request.agent.as_ref() == "concierge" {
                    format!("Concierge: {}", m.content)
                } else {
                    format!("You said: {}", m.content)
                }
            }
            _ => "Hello!".to_owned(),
        }))
    });
    llm
}

fn agent(name: &str) -> Agent {
    Agent::builder(name)
        .instructions("Help.")
        .build()
        .expect("a plain agent builds")
}

/// What the script must record, whatever runs the session.
const EXPECTED: [&str; 7] = [
    "reply: Hello!",
    "run I'd like a table: You said: I'd like a table",
    "speak a table for two: You said: a table for two",
    "say One moment, please.",
    "interrupt",
    "update_agent",
    "run hello again: Concierge: hello again",
];

/// The front code, generic over the session it drives.
async fn front<S: HostSession>(session: &S, next: S::Agent) -> Vec<String> {
    let record = run_front(session, a_call(next))
        .await
        .unwrap_or_else(|err| panic!("the front's script failed: {err}"));
    assert_eq!(
        record.user_messages(),
        ["I'd like a table", "a table for two", "hello again"],
        "each input once, in order"
    );
    record.lines
}

#[switchboard::test]
async fn a_front_written_against_the_host_api_drives_a_local_session() {
    tokio::time::pause();
    let engine = Engine::current().unwrap();
    let session = Session::builder()
        .llm(scripted_model())
        .agent(agent("greeter"))
        .start(&engine)
        .await
        .unwrap();
    let lines = front(&session, agent("concierge")).await;
    assert_eq!(lines, EXPECTED);
}
