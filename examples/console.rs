//! Chat with an agent in the terminal: lines you type go in, the agent's answer streams out
//! as it arrives. Two tools: `get_weather` (answers at once) and `order_coffee` (answers with
//! an update, keeps brewing, and the agent tells you when it is ready).
//!
//! ```text
//! cargo run --example console                       # the scripted model: no key, no network
//! OPENAI_API_KEY=sk-... cargo run --example console # OpenAI (OPENAI_MODEL, default gpt-4.1-mini)
//! OPENAI_BASE_URL=http://localhost:11434/v1 OPENAI_MODEL=llama3.2 cargo run --example console
//! ```
//!
//! With `OPENAI_API_KEY` or `OPENAI_BASE_URL` set it talks to a real model through
//! `OpenAiLlm::from_env()`; otherwise to a small scripted model (try "weather in Paris",
//! "a coffee please"). End with Ctrl-D: it waits for tools still running (and the
//! agent's word on them), then exits; with stdin not a terminal a failed turn fails it.

use std::io::{BufRead, IsTerminal, Write};
use std::sync::Arc;
use std::time::Duration;

use switchboard::prelude::*;
use switchboard::providers::openai::OpenAiLlm;
use switchboard::testing::{ConsoleOutput, Reply, ScriptedLlm};
use switchboard::{ChatItem, ChatRole, Llm, ToolChoice};

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct City {
    /// The city, e.g. "Paris".
    city: String,
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Coffee {
    /// The drink, e.g. "flat white".
    drink: String,
}

fn tools() -> Vec<Tool> {
    let weather = Tool::new(
        "get_weather",
        "The current weather in a city",
        |_ctx: RunContext, args: City| async move {
            Ok::<_, ToolFailure>(format!("{}: sunny, 22 °C", args.city))
        },
    );
    let coffee = Tool::new(
        "order_coffee",
        "Orders a coffee; it takes a few seconds to brew",
        |ctx: RunContext, args: Coffee| async move {
            ctx.update(format!("brewing a {}", args.drink)).await?; // answers the model now
            tokio::time::sleep(Duration::from_secs(3)).await;
            Ok::<_, ToolFailure>(format!("the {} is ready at the counter", args.drink))
        },
    );
    vec![weather, coffee]
}

/// The real model when the environment names one, else the scripted one.
fn model() -> Result<Arc<dyn Llm>, Box<dyn std::error::Error>> {
    let configured = ["OPENAI_API_KEY", "OPENAI_BASE_URL"]
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|v| !v.is_empty()));
    if configured {
        let llm = OpenAiLlm::from_env()?;
        eprintln!("(model {} at {})", llm.model(), llm.endpoint());
        return Ok(Arc::new(llm));
    }
    eprintln!("(scripted model: set OPENAI_API_KEY or OPENAI_BASE_URL for a real one)");
    let llm = ScriptedLlm::new([]);
    llm.rule(|req| {
        let last = req.chat.items().last()?;
        let reply = match last {
            ChatItem::Message(m) if m.role == ChatRole::User => {
                let text = m.content.to_lowercase();
                if text.contains("weather") {
                    let city = m.content.split_whitespace().last().unwrap_or("Paris");
                    Reply::tool_call("get_weather", serde_json::json!({ "city": city }))
                } else if text.contains("coffee") {
                    Reply::tool_call("order_coffee", serde_json::json!({"drink": "flat white"}))
                } else {
                    Reply::text(format!("You said: {}", m.content))
                }
            }
            ChatItem::FunctionCallOutput(o) if req.tool_choice == ToolChoice::None => {
                Reply::text(format!("Good news: {}.", o.output))
            }
            ChatItem::FunctionCallOutput(o) => Reply::text(format!("Here you go: {}.", o.output)),
            _ => return None,
        };
        Some(reply)
    });
    Ok(llm)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let llm = match model() {
        Ok(llm) => llm,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    let agent = tools()
        .into_iter()
        .fold(Agent::builder("assistant"), |a, t| a.tool(t))
        .instructions("You are a friendly assistant in a cafe. Answer in one or two sentences.")
        .build()?;
    let engine = Engine::start()?;
    let session = Session::builder()
        .llm(llm)
        .agent(agent)
        .output(ConsoleOutput)
        .start(&engine)
        .await?;

    // Stdin is read on its own thread; the lines come in through a channel.
    let (lines_tx, mut lines) = tokio::sync::mpsc::channel::<String>(8);
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if lines_tx.blocking_send(line).is_err() {
                break;
            }
        }
    });
    let interactive = std::io::stdin().is_terminal();
    loop {
        if interactive {
            print!("you> ");
            std::io::stdout().flush()?;
        }
        let Some(line) = lines.recv().await else {
            break; // stdin closed
        };
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        match session.run(line).await {
            Ok(_) => {}
            Err(e) if interactive => eprintln!("error: {e}"),
            // Piped input (a script, CI's `.ci/examples`): a failed turn fails the run.
            Err(e) => return Err(e.into()),
        }
    }
    // Tools still running (a coffee brewing) finish, and the agent says so, before the
    // session closes.
    session.wait_for_settled().await?;
    session.close().await?;
    Ok(())
}
