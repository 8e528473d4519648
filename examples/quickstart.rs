//! The README's 20-line session, kept compiling.
//!
//! ```text
//! cargo run --example quickstart
//! ```

use switchboard::prelude::*;
use switchboard::testing::{Reply, ScriptedLlm};

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Order {
    item: String,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let order = Tool::new(
        "order",
        "Orders an item",
        |ctx: RunContext, args: Order| async move {
            ctx.update(format!("ordering {}", args.item)).await?; // answers the model now
            tokio::time::sleep(std::time::Duration::from_millis(20)).await; // the kitchen
            Ok::<_, ToolFailure>(format!("{} ordered", args.item)) // arrives later as `/finished`
        },
    );
    let agent = Agent::builder("barista")
        .instructions("Take orders.")
        .tool(order)
        .build()?;
    let llm = ScriptedLlm::new([
        Reply::tool_call("order", serde_json::json!({"item": "tea"})),
        Reply::text("Ordering your tea."),
        Reply::text("Your tea is ordered."),
    ]);
    let engine = Engine::start()?; // the engine's own actix threads
    let session = Session::builder()
        .llm(llm)
        .agent(agent)
        .start(&engine)
        .await?;
    session.run("a tea please").await?;
    session.wait_for_settled().await?; // the tool finished and the agent told the user
    session.close().await?;
    Ok(())
}
