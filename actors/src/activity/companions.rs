//! The companion tools `get_running_tasks` and `cancel_task`, which let the model list the
//! running calls of cancellable tools and cancel one by id.
//!
//! An activity exposes both, always and byte-identical, as soon as any tool it can see
//! allows cancellation, so the request schema never changes from turn to turn and the
//! provider's prompt cache stays warm. They are answered by the activity itself, which
//! asks the toolsets it sees.

use serde::Deserialize;
use serde_json::json;

use crate::ids::ActorId;
use crate::llm::ToolSchema;
use crate::mailbox::Mailbox;
use crate::outcome::CallOutput;
use crate::toolset::{CancelAnswer, CancelRun, ListRuns, ToolsetActor};

use crate::tool::{CANCEL_TASK, GET_RUNNING_TASKS};

/// Whether `name` is a companion tool.
pub(crate) fn is_companion(name: &str) -> bool {
    name == GET_RUNNING_TASKS || name == CANCEL_TASK
}

/// The two schemas, always the same bytes.
pub(crate) fn schemas() -> [ToolSchema; 2] {
    [
        ToolSchema {
            name: GET_RUNNING_TASKS.to_owned(),
            description: "List the tool calls still running that can be cancelled.".to_owned(),
            parameters: json!({"type": "object", "properties": {}}),
        },
        ToolSchema {
            name: CANCEL_TASK.to_owned(),
            description: "Cancel a running tool call by its call_id.".to_owned(),
            parameters: json!({
                "type": "object",
                "properties": {"call_id": {"type": "string", "description": "The call_id to cancel."}},
                "required": ["call_id"]
            }),
        },
    ]
}

#[derive(Deserialize)]
struct CancelArgs {
    call_id: String,
}

/// Answers one companion call by asking every toolset the activity sees.
pub(crate) async fn answer(
    name: String,
    arguments: String,
    toolsets: Vec<Mailbox<ToolsetActor>>,
    from: ActorId,
) -> CallOutput {
    if name == GET_RUNNING_TASKS {
        let mut running = Vec::new();
        for toolset in &toolsets {
            running.extend(toolset.ask(&from, ListRuns).await.unwrap_or_default());
        }
        return CallOutput::reply(serde_json::to_string(&running).unwrap_or_else(|_| "[]".into()));
    }
    let args: CancelArgs = match serde_json::from_str(&arguments) {
        Ok(args) => args,
        Err(err) => {
            return CallOutput::error(format!("Error parsing arguments for {CANCEL_TASK}: {err}"))
        }
    };
    for toolset in &toolsets {
        match toolset
            .ask(
                &from,
                CancelRun {
                    call_id: args.call_id.clone(),
                },
            )
            .await
            .unwrap_or(CancelAnswer::Unknown)
        {
            CancelAnswer::Unknown => continue,
            CancelAnswer::Cancelled => {
                return CallOutput::reply(format!("Cancelled {}.", args.call_id))
            }
            CancelAnswer::NotCancellable { tool } => {
                return CallOutput::error(format!(
                    "Error: {} ({tool}) cannot be cancelled",
                    args.call_id
                ))
            }
            CancelAnswer::Uninterruptible => {
                return CallOutput::error(format!(
                    "Error: {} cannot be cancelled now: its speech does not allow interruptions",
                    args.call_id
                ))
            }
        }
    }
    CallOutput::error(format!(
        "Error: no running call {} (unknown or already finished)",
        args.call_id
    ))
}
