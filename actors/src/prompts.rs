//! The texts the engine writes into the conversation (SPEC §6). Kept short on purpose:
//! a long explanation of the protocol makes models re-call tools with invented results.

use crate::chat::FunctionCall;

/// Wraps an update message (`{function_name}`, `{call_id}`, `{message}`).
pub(crate) fn update(function_name: &str, call_id: &str, message: &str) -> String {
    let _ = call_id;
    format!("Update from {function_name}: {message}")
}

/// Instructions for the deferred reply (`{pending_call_ids}`, one id a line).
pub(crate) fn reply(pending_call_ids: &[String]) -> String {
    format!(
        "New results from running tools arrived:\n{}\nTell the user what changed, briefly.",
        pending_call_ids.join("\n")
    )
}

/// Answer to a duplicate call under `reject`.
pub(crate) fn duplicate_reject(function_name: &str, running: &[FunctionCall]) -> String {
    format!(
        "{function_name} is already running; not started again. Running calls:\n{}",
        running_calls(running)
    )
}

/// Answer to a duplicate call under `confirm`.
pub(crate) fn duplicate_confirm(function_name: &str, running: &[FunctionCall]) -> String {
    format!(
        "{function_name} is already running. Ask the user whether to run it again; if they confirm, call it with confirm_duplicate=true. Running calls:\n{}",
        running_calls(running)
    )
}

fn running_calls(running: &[FunctionCall]) -> String {
    running
        .iter()
        .map(|c| serde_json::to_string(c).unwrap_or_else(|_| c.call_id.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}
