//! A conversation that outlives its process: saved to a store, restored by another.
//!
//! ```text
//! cargo run --example resume
//! ```
//!
//! Run without arguments, it runs itself twice, each time as a new process, and prints
//! both halves:
//!
//! 1. **The first process** starts a travel agent that saves itself to a `FileStore` after
//!    every settled turn, with a session toolset that records the call. The user asks for a
//!    flight; the agent starts the recording and hands off to a booking agent built with
//!    the call's data (the destination), which starts a search that runs in the background,
//!    saving a checkpoint per page it reads. Half-way through the search the process writes
//!    the session to the store once more (`Session::save`, as a host does on SIGTERM) and
//!    exits.
//! 2. **The second process** claims the session in the store and restores it from there
//!    (`SessionBuilder::restore_from`: a new epoch from the store, and any process still
//!    running the session would have its next save refused, while a third process
//!    restoring it too would be refused), with the same code — the model, and the session
//!    toolset given to the builder again (a snapshot with a running call of a toolset the
//!    builder lacks is refused, never silently ended) — and an `AgentRegistry` (the
//!    booking agent is built again from its data). The search and the recording resume
//!    from their checkpoints (`RestorePolicy::Resume`); the search's result reaches the
//!    user in a deferred reply, and the conversation goes on.
//!
//! The model is the bundled scripted one: no key, no network.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use switchboard::prelude::*;
use switchboard::snapshot::{AgentRegistry, FileStore, SnapshotStore};
use switchboard::testing::{Reply, ScriptedLlm};
use switchboard::RestorePolicy;
use tokio::sync::Notify;

/// How many segments the recording takes; the first process stops after about three.
const SEGMENTS: u32 = 6;

/// The session toolset both processes give their builder: a recording of the call that
/// runs in the background, saving a checkpoint per segment.
fn call_log() -> Toolset {
    let record = Tool::new(
        "record_call",
        "Records the call",
        |ctx: RunContext, _: NoArgs| async move {
            let first = match ctx.restored_checkpoint::<u32>() {
                Ok(Some(done)) => done + 1,
                _ => {
                    ctx.update("recording").await?;
                    1
                }
            };
            for segment in first..=SEGMENTS {
                tokio::time::sleep(Duration::from_millis(20)).await;
                println!("    [tool] record_call saves segment {segment} of {SEGMENTS}");
                ctx.checkpoint(&segment)?;
            }
            Ok::<_, ToolFailure>(ToolReturn::no_reply("the call is recorded"))
        },
    )
    .on_restore(RestorePolicy::Resume);
    Toolset::new("call_log").tool(record)
}

/// What the handoff carries: the booking agent is built from it, in both processes.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct Trip {
    destination: String,
}

#[derive(Deserialize, schemars::JsonSchema)]
struct Search {
    day: String,
}

/// The last page of the search; the first process stops after page 2 of it.
const PAGES: u32 = 4;

/// In this process: the last page the search read, the page after which it stops (the
/// first process goes down there; 0: never), and the first page it read (the second
/// process checks it resumed rather than started again).
static LAST_READ: AtomicU32 = AtomicU32::new(0);
static GOES_DOWN_AFTER: AtomicU32 = AtomicU32::new(0);
static FIRST_READ: AtomicU32 = AtomicU32::new(0);
/// Rung after each page.
static PAGE_READ: Notify = Notify::const_new();

fn greeter() -> Result<Agent, BuildError> {
    let start_booking = Tool::new(
        "start_booking",
        "Hands the trip over to the booking agent",
        |_ctx: RunContext, trip: Trip| async move {
            let booker = booker(&trip)?;
            Ok::<_, ToolFailure>(Handoff::to(booker))
        },
    );
    Agent::builder("greeter")
        .instructions("Greet the caller and find out where they fly.")
        .tool(start_booking)
        .build()
}

fn booker(trip: &Trip) -> Result<Agent, BuildError> {
    let destination = trip.destination.clone();
    let search = Tool::new(
        "search_flights",
        "Searches flights, page by page",
        move |ctx: RunContext, args: Search| {
            let destination = destination.clone();
            async move {
                // A resumed call goes on after the last page it saved.
                let first = match ctx.restored_checkpoint::<u32>() {
                    Ok(Some(done)) => done + 1,
                    _ => 1,
                };
                if first == 1 {
                    ctx.update(format!("searching {} flights to {destination}", args.day))
                        .await?;
                }
                for page in first..=PAGES {
                    println!("    [tool] search_flights reads page {page} of {PAGES}");
                    let _ = FIRST_READ.compare_exchange(0, page, SeqCst, SeqCst);
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    ctx.checkpoint(&page)?;
                    LAST_READ.store(page, SeqCst);
                    PAGE_READ.notify_waiters();
                    if page == GOES_DOWN_AFTER.load(SeqCst) {
                        // The process goes down here (see `first_half`).
                        std::future::pending::<()>().await;
                    }
                }
                Ok::<_, ToolFailure>(format!("the 9:40 to {destination}, 180 EUR"))
            }
        },
    )
    .on_restore(RestorePolicy::Resume);
    Agent::builder("booker")
        .instructions(format!("Book a flight to {}.", trip.destination))
        .restore_data(trip)
        .tool(search)
        // A restored booker does not enter again: this runs in the first process only.
        .on_enter(|ctx| async move {
            let _ = ctx.generate_reply("Start the search.").await;
        })
        .build()
}

/// How the second process builds the agents the snapshot names.
fn registry() -> AgentRegistry {
    AgentRegistry::new()
        .agent("greeter", |_| greeter())
        .agent_with_data("booker", |trip: Trip| booker(&trip))
}

fn print_chat(chat: &ChatContext) {
    for item in chat.items() {
        match item {
            ChatItem::Message(m) => println!("    {:?}: {}", m.role, m.content),
            ChatItem::FunctionCall(c) => {
                println!("    call {} {}{}", c.call_id, c.name, c.arguments)
            }
            ChatItem::FunctionCallOutput(o) => println!("    output {}: {}", o.call_id, o.output),
            ChatItem::AgentHandoff { from, to } => {
                println!("    handoff {} -> {to}", from.as_deref().unwrap_or("-"))
            }
            _ => {}
        }
    }
}

async fn first_half(dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    println!("== first process (pid {})", std::process::id());
    let store = FileStore::new(dir)?;
    let llm = ScriptedLlm::new([
        // the greeter starts the recording and hands off; the booker, entering, starts
        // the search
        Reply::tool_call("record_call", serde_json::json!({})).and_tool_call(
            "start_booking",
            serde_json::json!({"destination": "Lisbon"}),
        ),
        Reply::tool_call("search_flights", serde_json::json!({"day": "Friday"})),
        Reply::text("Searching Friday's flights to Lisbon."),
    ]);
    let engine = Engine::start()?;
    let session = Session::builder()
        .llm(llm)
        .toolset(call_log())
        .agent(greeter()?)
        .inherit_chat_context(true)
        .save_snapshots(Arc::new(store.clone()))
        .start(&engine)
        .await?;
    GOES_DOWN_AFTER.store(2, SeqCst);
    session.run("I need a flight to Lisbon on Friday").await?;
    // The search runs in the background; half-way through it, the process goes down.
    loop {
        let read = PAGE_READ.notified();
        if LAST_READ.load(SeqCst) >= 2 {
            break;
        }
        read.await;
    }
    // As a host does on SIGTERM: the session writes itself to its store once more (it
    // saved when its turn settled; this adds the search's checkpoints since), under its
    // claim on the session.
    let snapshot = session.save().await?;
    let (id, bytes) = (snapshot.session_id().to_owned(), snapshot.to_bytes().len());
    println!(
        "  saved session {id} ({bytes} bytes) with agent {}, the search and the recording running",
        session.current_agent().await?
    );
    print_chat(&session.chat_context().await?);
    println!("  exiting");
    Ok(())
}

async fn second_half(dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    println!("== second process (pid {})", std::process::id());
    let store = Arc::new(FileStore::new(dir)?);
    let llm = ScriptedLlm::new([
        Reply::text("Found one: the 9:40 to Lisbon for 180 EUR. Shall I book it?"),
        Reply::text("Booked. Have a good trip!"),
    ]);
    let engine = Engine::start()?;
    // Reads the session, claims it on what it read (a process still running it would be
    // fenced: its next save refused; another restorer of the same state, refused), reads
    // it as the claim left it, and goes on saving there — with the same code as the first
    // process: its model and its session toolset (the recording is running in it); the
    // agents come from the registry.
    let session = Session::builder()
        .llm(llm)
        .toolset(call_log())
        .inherit_chat_context(true)
        .restore_from(store.clone(), "s1", registry())
        .start(&engine)
        .await?;
    println!(
        "  restored session {} (epoch {}, from the store's claim) with agent {}",
        session.id(),
        session.epoch(),
        session.current_agent().await?
    );
    session.wait_for_settled().await?;
    session.run("Yes, book it").await?;
    let chat = session.chat_context().await?;
    print_chat(&chat);
    session.close().await?;
    store.remove("s1").await?;
    // What this example shows, checked (CI runs it: `.ci/examples`).
    if FIRST_READ.load(SeqCst) != 3 {
        return Err("the search did not resume after the page the first process saved".into());
    }
    let found = chat.items().iter().any(|item| {
        matches!(item, ChatItem::FunctionCall(call)
            if call.name == "search_flights" && call.call_id.ends_with("/finished"))
    });
    let replied = chat
        .items()
        .iter()
        .any(|item| matches!(item, ChatItem::Message(m) if m.content.starts_with("Found one")));
    if !(found && replied) {
        return Err("the resumed search's result did not reach the user".into());
    }
    println!("  checked: the search resumed at page 3 and its result reached the user");
    Ok(())
}

/// Runs this example again as a new process with `args`; its output goes to ours.
fn run_process(args: &[&str]) -> Result<(), Box<dyn std::error::Error>> {
    let status = std::process::Command::new(std::env::current_exe()?)
        .args(args)
        .status()?;
    if !status.success() {
        return Err(format!("the process {args:?} failed: {status}").into());
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [half, dir] if half == "first" => first_half(Path::new(dir)).await,
        [half, dir] if half == "second" => second_half(Path::new(dir)).await,
        _ => {
            let dir: PathBuf =
                std::env::temp_dir().join(format!("switchboard-resume-{}", std::process::id()));
            let path = dir.to_string_lossy().into_owned();
            run_process(&["first", &path])?;
            run_process(&["second", &path])?;
            let _ = std::fs::remove_dir_all(&dir);
            Ok(())
        }
    }
}
