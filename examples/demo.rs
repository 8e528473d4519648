//! The main demo: a restaurant voice bot on the bundled scripted LLM (no key, no network).
//!
//! ```text
//! cargo run --example demo
//! ```
//!
//! It shows, in one session:
//! - an async tool in a *session-scoped* toolset (`book_table`) that answers at once with
//!   its first `ctx.update`, then keeps working in the background;
//! - an *agent-scoped* tool (`watch_waitlist`) that runs in the background too;
//! - a handoff from `receptionist` to `concierge` by a tool returning the new agent: the
//!   receptionist's tool actor is stopped and awaited, the booking keeps running and
//!   finishes under the concierge, whose deferred reply tells the user;
//! - the mailbox trace: every message each actor handled, and which actors stopped.
//!
//! Each section of the output starts with one line of legend in parentheses saying how to
//! read it.

use std::sync::Arc;

use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{ConsoleOutput, Reply, ScriptedLlm};
use switchboard::{ChatItem, ToolChoice};
use tokio::sync::watch;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Booking {
    /// How many guests.
    party: u32,
    /// When, e.g. "8pm".
    time: String,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The booking waits for "the restaurant" to answer: the demo opens this gate after
    // the handoff, so the result arrives under the new agent.
    let (restaurant, answered) = watch::channel(false);

    let book_table = Tool::new(
        "book_table",
        "Books a table",
        move |ctx: RunContext, b: Booking| {
            let mut answered = answered.clone();
            async move {
                ctx.update(format!("checking tables for {} at {}", b.party, b.time))
                    .await?;
                let _ = answered.wait_for(|yes| *yes).await;
                ctx.update("the restaurant is holding a table").await?;
                Ok::<_, ToolFailure>(format!("confirmed: table for {} at {}", b.party, b.time))
            }
        },
    );
    let watch_waitlist = Tool::new(
        "watch_waitlist",
        "Watches the waitlist",
        |ctx: RunContext, _: NoArgs| async move {
            ctx.update("watching the waitlist").await?;
            ctx.cancelled().await; // runs until its agent's activity closes
            Ok::<_, ToolFailure>(())
        },
    );

    let concierge = Agent::builder("concierge")
        .instructions("You are the concierge.")
        .on_enter(|ctx| async move {
            // Queued: it runs once this handoff is complete.
            let _ = ctx.generate_reply("Greet the user.").await;
        })
        .build()?;
    let to_concierge = concierge.clone();
    let transfer = Tool::new(
        "transfer_to_concierge",
        "Hands the user to the concierge",
        move |_ctx: RunContext, _: NoArgs| {
            let concierge = to_concierge.clone();
            // The concierge starts with the receptionist's conversation, so it knows the
            // party and the time without asking again.
            async move { Ok::<_, ToolFailure>(Handoff::to(concierge).with_chat(StartingChat::All)) }
        },
    );
    let receptionist = Agent::builder("receptionist")
        .instructions("You take bookings.")
        .tool(watch_waitlist)
        .tool(transfer)
        .build()?;

    let llm = ScriptedLlm::new([
        Reply::tool_call("book_table", json!({"party": 2, "time": "8pm"}))
            .and_tool_call("watch_waitlist", json!({})),
        Reply::text("I'm checking tables for two at 8pm."),
        Reply::tool_call("transfer_to_concierge", json!({})),
        Reply::text("Concierge here. Parking is free after 7pm."),
    ]);
    // Deferred replies (tools off) repeat the newest tool result.
    llm.rule(|req| {
        (req.tool_choice == ToolChoice::None).then(|| {
            let newest = req.chat.outputs().last().map(|o| o.output.clone());
            Reply::text(format!("Booking news: {}.", newest.unwrap_or_default()))
        })
    });

    let engine = Engine::start()?;
    let session = Session::builder()
        .llm(llm.clone())
        .agent(receptionist)
        .toolset(Toolset::new("booking").tool(book_table))
        .output(ConsoleOutput)
        .inspect(true)
        .start(&engine)
        .await?;
    let mut events = session.subscribe();

    println!("conversation:");
    legend("`user>` is this program's input, `receptionist>` or `concierge>` what that agent said, indented lines the demo's notes");
    println!("user> Book a table for two at 8pm.");
    session.run("Book a table for two at 8pm.").await?;
    println!("user> Can I ask the concierge about parking?");
    let turn = session
        .run("Can I ask the concierge about parking?")
        .await?;
    println!(
        "   (handed off to {}, which starts with the receptionist's chat: StartingChat::All)",
        turn.handoff().unwrap_or("nobody")
    );

    println!("   (the restaurant answers the booking)");
    restaurant.send_replace(true);
    while let Ok(event) = events.recv().await {
        if let SessionEvent::ConversationItemAdded {
            item: ChatItem::FunctionCallOutput(out),
            ..
        } = &event
        {
            if out.call_id.ends_with("/finished") && out.name == "book_table" {
                break;
            }
        }
    }
    session.wait_for_settled().await?;

    let agent = session.current_agent().await?;
    let chat = session.chat_context().await?;
    println!("\nchat context of {agent}:");
    legend("what its model sees next; `call_1/update_1` and `call_1/finished` are the later results of the booking's call_1, each written as a call and its output under a derived id, because a provider accepts a tool output only right after its call");
    for item in chat.items() {
        println!("  {}", describe(item));
    }

    let inspector = session.inspector().ok_or("inspection is on")?;
    println!("\nmailbox trace (seq  from -> to: message):");
    legend("every message an actor handled, in order; `host` is this program; a tool run sending `ToolUpdate` to itself is its body's `ctx.update` arriving at its own actor, where the body runs");
    for r in inspector.traffic() {
        println!("  {:>3}  {} -> {}: {}", r.seq, r.from, r.to, r.kind);
    }
    println!("\nactors:");
    legend("`tool/s1/<n>:<call id>` is the session's n-th tool run; the receptionist's activity, toolset and waitlist run stopped at the handoff, the booking run when it returned, and the session's `booking` toolset lives until the close");
    for id in inspector.actors() {
        let actor = inspector.actor(id.as_str())?;
        let state = if actor.stopped_at.is_some() {
            "stopped"
        } else {
            "alive"
        };
        println!("  {state:<8} {id}");
    }
    session.close().await?;
    let live = inspector.live_actors();
    println!("\nafter close, live actors: {live:?}");
    let requests = llm.requests();
    let deferred = requests
        .iter()
        .filter(|r| r.tool_choice == ToolChoice::None)
        .count();
    println!("LLM requests: {}", requests.len());
    legend(&format!(
        "{} for the turns and their tool steps, the transfer and the concierge's greeting; {deferred} deferred replies, requests with tools off that tell the user a background result",
        requests.len() - deferred
    ));
    engine.shutdown();

    // What the demo shows, checked (CI runs it: `.ci/examples`).
    let claims = [
        (
            "the tool's handoff to the concierge",
            turn.handoff() == Some("concierge") && agent == "concierge",
        ),
        (
            "the booking finishing under the concierge, with its deferred reply",
            chat.outputs().any(|o| o.call_id == "call_1/finished")
                && chat.items().iter().any(|item| {
                    matches!(item, ChatItem::Message(m) if m.content.starts_with("Booking news: confirmed"))
                }),
        ),
        ("no actor alive after the close", live.is_empty()),
    ];
    for (claim, held) in claims {
        if !held {
            return Err(format!("the demo did not show {claim}").into());
        }
    }
    Ok(())
}

/// One line of legend under a section heading.
fn legend(text: &str) {
    println!("  ({text})");
}

fn describe(item: &ChatItem) -> String {
    match item {
        ChatItem::Message(m) => format!("{:?}: {}", m.role, m.content),
        ChatItem::FunctionCall(c) => format!("call {} {}({})", c.call_id, c.name, c.arguments),
        ChatItem::FunctionCallOutput(o) => format!("output {} = {}", o.call_id, o.output),
        ChatItem::AgentHandoff { from, to } => {
            format!("handoff {} -> {to}", from.as_deref().unwrap_or("-"))
        }
        other => format!("{other:?}"),
    }
}

// Keeps `Arc` in scope for readers who swap in a real provider (`Arc<dyn Llm>`).
#[allow(dead_code)]
fn provider(llm: Arc<ScriptedLlm>) -> Arc<dyn Llm> {
    llm
}
