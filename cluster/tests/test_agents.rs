//! The scripted agents of the cluster's tests, built by one [`SessionFactory`]: the test
//! worker (`sb-test-worker`) runs them, and a test builds a local session from the same
//! factory to compare a front's record over a local and a remote session.
//!
//! Agents: `greeter` and `concierge`, on a scripted model that answers `look up X` by
//! calling the async tool `lookup` (which sends an update, waits `tool_ms` of the session
//! data, default 20, at most `max_tool_ms`, and finds X; restarted on a restore), `wait for
//! X` by calling the tool `wait` (which waits `tool_ms` before it returns, the turn waiting
//! on it), `stall` with a reply that never ends (until interrupted), `note <text>` with
//! `Noted <n> bytes.` (a user can say a lot; a reply is bounded), and anything else with
//! `You said: <text>` (`Concierge: <text>` for the concierge); and `receptionist`, the same,
//! which answers `transfer me` with `Transferring you to the booker.` and a call of the tool
//! `transfer`, a handoff to `booker`, who greets on entering (a reply queued by its
//! `on_enter`: `Booker here.`) and answers `Booker: <text>`. Every request the
//! model gets is checked against the one-output rule (every tool call has exactly one
//! output, after it); a request that breaks it prints `one-output broken: <why>` on stdout.
//! Each tool's body prints `effect <tool> <what> start` when it begins and `… done` when
//! its work is done: what a test counts side effects by (`wait` keeps the default restore
//! policy, `Abandon`: its body must never run twice for one call).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use switchboard::prelude::*;
use switchboard::testing::{Reply, ScriptedLlm};
use switchboard::{LlmRequest, NoArgs, RestorePolicy, SessionBuilder};
use switchboard_cluster::{FactoryError, SessionFactory, SessionSpec};

/// The arguments of the `lookup` tool.
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Lookup {
    /// What to look up.
    what: String,
}

/// Builds the scripted agents; see the module docs.
pub(crate) struct TestAgents {
    /// The longest its tools wait, whatever a session's data says (`--max-tool-ms`): a
    /// test gives a doomed worker long tools and the ones that take over short ones.
    pub(crate) max_tool_ms: u64,
}

impl TestAgents {
    const KNOWN: [&'static str; 4] = ["greeter", "concierge", "receptionist", "booker"];
}

impl SessionFactory for TestAgents {
    fn builder(&self, _spec: &SessionSpec) -> Result<SessionBuilder, FactoryError> {
        Ok(Session::builder()
            .llm(scripted_model())
            // A test's barge-in is real at once; a false one resumes quickly.
            .min_interruption_duration(Duration::ZERO)
            .grace_period(Duration::from_millis(200)))
    }

    fn agent(&self, name: &str, data: &Value) -> Result<Agent, FactoryError> {
        let tool_ms = data
            .get("tool_ms")
            .and_then(Value::as_u64)
            .unwrap_or(20)
            .min(self.max_tool_ms);
        let lookup = Tool::new(
            "lookup",
            "Looks something up",
            move |ctx: RunContext, args: Lookup| async move {
                println!("effect lookup {} start", args.what);
                ctx.update(format!("looking up {}", args.what)).await?;
                // The lookup's own work, simulated.
                tokio::time::sleep(Duration::from_millis(tool_ms)).await;
                println!("effect lookup {} done", args.what);
                Ok::<_, ToolFailure>(format!("found {}", args.what))
            },
        )
        // Its work is a lookup: done again on the worker that resumes the session.
        .on_restore(RestorePolicy::Restart);
        let wait = Tool::new(
            "wait",
            "Waits for something",
            move |_ctx: RunContext, args: Lookup| async move {
                println!("effect wait {} start", args.what);
                tokio::time::sleep(Duration::from_millis(tool_ms)).await;
                println!("effect wait {} done", args.what);
                Ok::<_, ToolFailure>(format!("waited for {}", args.what))
            },
        );
        let instructions = match name {
            "greeter" => "Greet and help.",
            "concierge" => "You are the concierge.",
            "receptionist" => "Receive and transfer.",
            "booker" => "You book tables.",
            _ => {
                return Err(FactoryError::UnknownAgent {
                    name: name.to_owned(),
                    known: Self::KNOWN.iter().map(|s| (*s).to_owned()).collect(),
                })
            }
        };
        let mut agent = Agent::builder(name)
            .instructions(instructions)
            .tool(lookup)
            .tool(wait)
            // Built again from the same data when a session is restored elsewhere.
            .restore_data(data);
        if name == "receptionist" {
            let booker = self.agent("booker", data)?;
            agent = agent.tool(Tool::new(
                "transfer",
                "Transfers the caller to the booker",
                move |_ctx: RunContext, _: NoArgs| {
                    let booker = booker.clone();
                    async move { Ok::<_, ToolFailure>(Handoff::to(booker)) }
                },
            ));
        }
        if name == "booker" {
            agent = agent.on_enter(|ctx| async move {
                // Queued: it runs once the handoff is complete, after the transfer turn.
                let _ = ctx.generate_reply("Greet the caller.").await;
            });
        }
        Ok(agent.build()?)
    }
}

/// One model per session: answers from the request alone, so any number of turns work.
fn scripted_model() -> Arc<ScriptedLlm> {
    let llm = ScriptedLlm::new([]);
    llm.rule(answer);
    llm
}

fn answer(request: &LlmRequest) -> Option<Reply> {
    if let Err(why) = request.chat.check_invariant() {
        println!("one-output broken: {why}");
        return Some(Reply::text(format!("one-output broken: {why}")));
    }
    let items = request.chat.items();
    let last_user = items.iter().rev().find_map(|item| match item {
        ChatItem::Message(m) if m.role == ChatRole::User => Some(m.content.clone()),
        _ => None,
    });
    match items.last() {
        // After the tool: its output (an update, then the deferred `/finished`).
        Some(ChatItem::FunctionCallOutput(output)) => {
            Some(Reply::text(format!("Lookup says: {}", output.output)))
        }
        Some(ChatItem::Message(m)) if m.role == ChatRole::User => {
            let text = m.content.as_str();
            if let Some(what) = text.strip_prefix("look up ") {
                Some(Reply::tool_call("lookup", json!({ "what": what })))
            } else if let Some(what) = text.strip_prefix("wait for ") {
                Some(Reply::tool_call("wait", json!({ "what": what })))
            } else if let Some(note) = text.strip_prefix("note ") {
                Some(Reply::text(format!("Noted {} bytes.", note.len())))
            } else if text.starts_with("stall") {
                Some(Reply::text("Let me think").and_stall())
            } else if text == "transfer me" && request.agent.as_ref() == "receptionist" {
                Some(
                    Reply::text("Transferring you to the booker.")
                        .and_tool_call("transfer", json!({})),
                )
            } else if request.agent.as_ref() == "concierge" {
                Some(Reply::text(format!("Concierge: {text}")))
            } else if request.agent.as_ref() == "booker" {
                Some(Reply::text(format!("Booker: {text}")))
            } else {
                Some(Reply::text(format!("You said: {text}")))
            }
        }
        _ if request.agent.as_ref() == "booker" => Some(Reply::text("Booker here.")),
        _ => Some(Reply::text(match last_user {
            Some(text) => format!("About {text}: anything else?"),
            None => "Hello!".to_owned(),
        })),
    }
}
