//! Tool policies, on the scripted LLM: duplicate calls, cancellation by the model,
//! prompt templates and which errors the model sees.
//!
//! ```text
//! cargo run --example tool_policies
//! ```

use std::time::Duration;

use serde_json::json;
use switchboard::prelude::*;
use switchboard::prompts::{Prompts, Template, UpdatePromptArgs};
use switchboard::testing::{Reply, ScriptedLlm};

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Export {
    /// What to export.
    table: String,
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Charge {
    /// Amount in cents.
    cents: u64,
}

/// An error of the host's own: by default the model would see only "internal error".
#[derive(Debug, thiserror::Error)]
#[error("card declined by the bank")]
struct Declined;

#[actix::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A long export the model may cancel; a second call while it runs must be confirmed.
    let export = Tool::new(
        "export",
        "Exports a table",
        |ctx: RunContext, e: Export| async move {
            ctx.update(format!("exporting {}", e.table)).await?;
            if ctx
                .wait_if_not_cancelled(std::future::pending::<()>())
                .await
                .is_none()
            {
                println!("   (export of {} cancelled: rolling back)", e.table);
            }
            Ok::<_, ToolFailure>(())
        },
    )
    .allow_cancellation(true)
    .on_duplicate(DuplicatePolicy::Confirm);

    // A payment whose `Declined` errors the model may read (`show`); others stay hidden.
    let charge = Tool::new(
        "charge",
        "Charges the card",
        |_ctx: RunContext, c: Charge| async move {
            if c.cents > 10_000 {
                return Err(Declined.into());
            }
            Ok::<_, ToolFailure>(format!("charged {} cents", c.cents))
        },
    )
    .error_policy(ErrorPolicy::new().route::<Declined>(ErrorRoute::Show));

    let agent = Agent::builder("clerk")
        .instructions("You run exports and take payments.")
        .tool(charge)
        .build()?;
    let llm = ScriptedLlm::new([
        Reply::tool_call("export", json!({"table": "orders"})),
        Reply::text("Exporting orders."),
        Reply::tool_call("export", json!({"table": "orders"})),
        Reply::text("An export is already running. Start another?"),
        Reply::tool_call("get_running_tasks", json!({})),
        Reply::text("One export is running."),
        Reply::tool_call("cancel_task", json!({"call_id": "call_1"})),
        Reply::text("Cancelled."),
        Reply::tool_call("charge", json!({"cents": 50_000})),
        Reply::text("The bank declined the card."),
        Reply::tool_call("charge", json!({"amount": 5})),
        Reply::text("Let me fix that."),
    ]);
    let session = Session::builder()
        .llm(llm.clone())
        .agent(agent)
        .toolset(
            Toolset::new("exports")
                .tool(export)
                .prompts(
                    Prompts::new().update(Template::closure(|a: &UpdatePromptArgs| {
                        format!("[{}] {}", a.function_name, a.message)
                    })),
                ),
        )
        .grace_period(Duration::from_millis(200))
        .start(&Engine::current()?)
        .await?;

    let mut outputs = Vec::new();
    for input in [
        "Export the orders.",
        "Export the orders again.",
        "What is running?",
        "Cancel the export.",
        "Charge 500 dollars.",
        "Charge 5 cents.",
    ] {
        println!("user> {input}");
        let result = session.run(input).await?;
        outputs.extend(result.function_outputs().map(|out| out.output.clone()));
        for out in result.function_outputs() {
            let kind = if out.is_error {
                "error output"
            } else {
                "output"
            };
            println!("   {} {kind}: {}", out.name, out.output);
        }
        for text in result.assistant_messages() {
            println!("agent> {text}");
        }
    }
    let tools: Vec<String> = llm.requests()[0]
        .tools
        .iter()
        .map(|t| t.name.clone())
        .collect();
    println!(
        "\ntools the model sees (stable every turn): {}",
        tools.join(", ")
    );
    session.close().await?;

    // What the example shows, checked, each an output in turn (CI runs it:
    // `.ci/examples`).
    let claims = [
        ("the `update` template", "[export] exporting orders"),
        (
            "the duplicate asking for confirmation",
            "export is already running",
        ),
        (
            "get_running_tasks listing the export",
            "\"call_id\":\"call_1\"",
        ),
        ("cancel_task cancelling it", "Cancelled call_1."),
        (
            "the error routed `show`",
            "Error: card declined by the bank",
        ),
        ("the argument error", "Error parsing arguments for charge"),
    ];
    for ((claim, expected), output) in claims.iter().zip(&outputs) {
        if !output.contains(expected) {
            return Err(format!("the example did not show {claim}: {output:?}").into());
        }
    }
    Ok(())
}
