//! Many calls in one process, and leaving cleanly: sessions named by the host's call ids,
//! a metrics loop that reads the engine's counts, a watchdog that holds only a weak handle
//! (so it never keeps a call alive), and a drain on SIGTERM or Ctrl-C that lets calls
//! settle, interrupts what is left at the deadline, and keeps every transcript.
//! `docs/production.md` walks through it.
//!
//! ```text
//! cargo run --example graceful_shutdown   # drains after 2 s by itself, or at SIGTERM / Ctrl-C
//! ```

use std::time::Duration;

use switchboard::prelude::*;
use switchboard::testing::{Reply, ScriptedLlm};
use switchboard::{DrainEnd, Engine, SessionState, WeakSession};

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Order {
    item: String,
}

/// A tool that takes its time: the call it runs in is still busy when the drain comes.
fn order() -> Tool {
    Tool::new(
        "order",
        "Orders an item",
        |ctx: RunContext, args: Order| async move {
            ctx.update(format!("ordering {}", args.item)).await?;
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(30)) => {}
                () = ctx.cancelled() => return Ok::<_, ToolFailure>("cancelled".to_owned()),
            }
            Ok(format!("{} ordered", args.item))
        },
    )
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let engine = Engine::start()?;

    // Calls arrive; each session is named by the call's id.
    let mut calls = Vec::new();
    for (call_id, says) in [("CA-1001", "hello"), ("CA-1002", "a tea please")] {
        let llm = ScriptedLlm::new([]);
        llm.when_user_says(
            "a tea please",
            Reply::tool_call("order", serde_json::json!({"item": "tea"})),
        );
        llm.otherwise(Reply::text("Sure."));
        let agent = Agent::builder("barista").tool(order()).build()?;
        let session = Session::builder()
            .id(call_id)
            .llm(llm)
            .agent(agent)
            .start(&engine)
            .await?;
        session.run(says).await?;
        tokio::spawn(watchdog(session.downgrade()));
        calls.push(session);
    }

    // What an operator watches.
    let metrics = tokio::spawn(report_every(engine.clone(), Duration::from_millis(500)));

    // A deploy: stop taking calls, let those under way settle, keep every transcript.
    shutdown_signal(Duration::from_secs(2)).await;
    let report = engine.drain(Duration::from_secs(1)).await;
    for drained in &report.sessions {
        let items: usize = drained
            .history
            .agents
            .iter()
            .map(|a| a.chat.items().len())
            .sum();
        println!(
            "{}: {:?}, {items} items in its transcript",
            drained.id, drained.ended
        );
    }
    println!(
        "drained {} calls in {:?}",
        report.sessions.len(),
        report.took
    );
    // What the example shows, checked (CI runs it: `.ci/examples`): the busy call was
    // interrupted at the deadline, the idle one settled, and nothing is left.
    let ended: Vec<DrainEnd> = report.sessions.iter().map(|d| d.ended).collect();
    if !(ended.contains(&DrainEnd::Interrupted) && ended.contains(&DrainEnd::Settled)) {
        return Err(format!("the drain ended its calls as {ended:?}").into());
    }
    if engine.stats().actors != 0 {
        return Err("actors were left after the drain".into());
    }
    metrics.abort();
    drop(calls);
    engine.shutdown();
    Ok(())
}

/// Resolves at SIGTERM (what a deploy sends), at Ctrl-C, or after `demo` so that the
/// example ends by itself.
async fn shutdown_signal(demo: Duration) {
    #[cfg(unix)]
    let terminate = async {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut sigterm) => {
                sigterm.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => println!("Ctrl-C: draining"),
        () = terminate => println!("SIGTERM: draining"),
        () = tokio::time::sleep(demo) => println!("(demo) draining"),
    }
}

/// The engine's counts, printed as a metrics exporter would publish them.
async fn report_every(engine: Engine, every: Duration) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        let stats = engine.stats();
        println!(
            "sessions {} actors {} backlog {} tools {} rss {} KiB draining {}",
            stats.sessions,
            stats.actors,
            stats.backlog,
            stats.tool_runs,
            stats.rss_bytes.unwrap_or(0) / 1024,
            stats.draining,
        );
        for call in engine.sessions() {
            println!(
                "  {} {:?} agent {:?} turns {} age {:?}",
                call.id, call.state, call.agent, call.turns, call.age
            );
        }
    }
}

/// A host task that must not keep its call alive: it holds a weak handle and ends when
/// the call does.
async fn watchdog(call: WeakSession) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let session = match call.upgrade() {
            Some(session) if session.summary().state != SessionState::Closed => session,
            _ => {
                println!("{}: call over, watchdog ends", call.id());
                return;
            }
        };
        if session.user_state() == UserState::Away {
            let _ = session.say("Are you still there?").await;
        }
    }
}
