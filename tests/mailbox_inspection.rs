//! SPEC §9: a test sees each actor's traffic: received messages, queue length, lifecycle,
//! and a Mermaid export of the session stable enough for a golden file.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::Query;
use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{Gate, Reply, ScriptedLlm};
use switchboard::{ActorId, InspectError, NoArgs};

fn handoff_agents() -> (Agent, Agent) {
    let b = Agent::builder("agent-b").build().unwrap();
    let to_b = b.clone();
    let transfer = Tool::new(
        "transfer",
        "Transfers",
        move |_ctx: RunContext, _: NoArgs| {
            let b = to_b.clone();
            async move { Ok::<_, ToolFailure>(Handoff::to(b)) }
        },
    );
    let watch = Tool::new("watch", "Watches", |ctx: RunContext, _: Query| async move {
        ctx.update("watching").await?;
        ctx.cancelled().await;
        Ok::<_, ToolFailure>(())
    });
    let a = Agent::builder("agent-a")
        .tool(transfer)
        .tool(watch)
        .build()
        .unwrap();
    (a, b)
}

#[actix::test]
async fn the_mermaid_export_of_a_handoff_matches_the_golden_file() {
    let (a, _) = handoff_agents();
    let llm = ScriptedLlm::new([
        Reply::tool_call("watch", json!({"q": "door"})),
        Reply::text("Watching."),
        Reply::tool_call("transfer", json!({})),
    ]);
    let session = Session::builder()
        .llm(llm)
        .agent(a)
        .inspect(true)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("watch the door").await.unwrap();
    session.run("transfer me").await.unwrap();
    let inspector = session.inspector().unwrap();
    session.close().await.unwrap();
    let diagram = inspector.mermaid();
    // Read at run time (cargo sets it for tests): a binary built in another checkout of the
    // same target directory must still find this checkout's golden file.
    let golden_path = std::path::PathBuf::from(
        std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into()),
    )
    .join("tests/golden/handoff.mmd");
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&golden_path, &diagram).unwrap();
    }
    let golden = std::fs::read_to_string(&golden_path).unwrap();
    let saved = std::env::temp_dir().join(format!("switchboard-{}.mmd", std::process::id()));
    inspector.save_mermaid(&saved).unwrap();
    assert_eq!(std::fs::read_to_string(&saved).unwrap(), diagram);
    std::fs::remove_file(saved).unwrap();
    assert_eq!(
        diagram, golden,
        "run with UPDATE_GOLDEN=1 to accept a new diagram"
    );
    // Participants are aliased: ids with ':' and '#' never appear as Mermaid names.
    for line in diagram.lines().filter(|l| l.contains("->>")) {
        let names = line.trim().split(':').next().unwrap();
        assert!(!names.contains('#'), "{line}");
    }
}

#[actix::test]
async fn assert_stopped_holds_for_the_agent_tool_and_not_the_session_tool() {
    let (a, _) = handoff_agents();
    let job = Tool::new(
        "job",
        "Background job",
        |ctx: RunContext, _: Query| async move {
            ctx.update("running").await?;
            ctx.cancelled().await;
            Ok::<_, ToolFailure>(())
        },
    );
    let llm = ScriptedLlm::new([
        Reply::tool_call("watch", json!({"q": "door"})).and_tool_call("job", json!({"q": "x"})),
        Reply::text("Both running."),
        Reply::tool_call("transfer", json!({})),
    ]);
    let session = Session::builder()
        .llm(llm)
        .agent(a)
        .toolset(Toolset::new("jobs").tool(job))
        .inspect(true)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("start").await.unwrap();
    session.run("transfer me").await.unwrap();
    let inspector = session.inspector().unwrap();
    inspector.assert_stopped("tool/s1/1:call_1").unwrap();
    assert_eq!(
        inspector.assert_stopped("tool/s1/2:call_2"),
        Err(InspectError::StillAlive {
            id: "tool/s1/2:call_2".into()
        })
    );
    let watch = inspector.actor("tool/s1/1:call_1").unwrap();
    assert!(watch.stopped_at.unwrap() >= watch.started_at);
    assert_eq!(
        inspector.stopped_at("tool/s1/1:call_1").unwrap(),
        watch.stopped_at
    );
    assert_eq!(
        inspector.started_at("tool/s1/1:call_1").unwrap(),
        watch.started_at
    );
    assert_eq!(inspector.stopped_at("tool/s1/2:call_2").unwrap(), None);
    let kinds: Vec<&str> = watch.received.iter().map(|r| r.kind).collect();
    assert_eq!(kinds, ["ToolUpdate", "StopRun"]);
    assert_eq!(
        watch.received[1].from.as_str(),
        "toolset/s1/agent-a#1/tools"
    );
    // Sequence numbers order the session's traffic.
    let seqs: Vec<u64> = inspector.traffic().iter().map(|r| r.seq).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]));
    let unknown = inspector.received("tool/s1/9:nope").unwrap_err();
    assert!(
        unknown.to_string().contains("tool/s1/1:call_1"),
        "lists known ids: {unknown}"
    );
    session.close().await.unwrap();
}

#[actix::test]
async fn pending_counts_queued_messages_until_they_are_handled_or_dropped() {
    // `on_exit` is held on a gate, so the session is mid-handoff; three host messages are
    // sent without letting the session's arbiter run yet.
    let gate = Gate::new();
    let g = gate.clone();
    let a = Agent::builder("agent-a")
        .on_exit(move |_ctx| {
            let g = g.clone();
            async move { g.wait().await }
        })
        .build()
        .unwrap();
    let llm = ScriptedLlm::new([]);
    llm.otherwise(Reply::text("Hi."));
    let session = Session::builder()
        .llm(llm)
        .agent(a)
        .inspect(true)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let inspector = session.inspector().unwrap();
    let s = session.clone();
    let handoff = actix::spawn(async move {
        s.update_agent(Agent::builder("agent-b").build().unwrap())
            .await
    });
    inspector
        .wait_for(
            "activity/s1/agent-a#1",
            "CloseActivity",
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    let received_before = inspector.received("session/s1").unwrap().len();
    for _ in 0..3 {
        session.transcript("uh", false);
    }
    assert_eq!(inspector.pending("session/s1").unwrap(), 3);
    assert_eq!(
        inspector.received("session/s1").unwrap().len(),
        received_before
    );

    // Handled once the session's thread gets to them, while on_exit still waits.
    inspector
        .wait_for("session/s1", "UserTranscript", Duration::from_secs(5))
        .await
        .unwrap();
    tokio::task::yield_now().await;
    assert_eq!(inspector.pending("session/s1").unwrap(), 0);
    assert!(!handoff.is_finished());
    gate.open();
    handoff.await.unwrap().unwrap();
    session.close().await.unwrap();
    for actor in inspector.actors() {
        assert_eq!(inspector.pending(actor.as_str()).unwrap(), 0, "{actor}");
    }
}

#[actix::test]
async fn wait_for_times_out_with_what_the_actor_did_receive() {
    tokio::time::pause();
    let session = Session::builder()
        .llm(ScriptedLlm::new([]))
        .agent(Agent::builder("agent-a").build().unwrap())
        .inspect(true)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let inspector = session.inspector().unwrap();
    let err = inspector
        .wait_for("session/s1", "Handoff", Duration::from_secs(1))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "actor session/s1 received no Handoff within 1s; it received: StartSession"
    );
    session.close().await.unwrap();
}

#[actix::test]
async fn without_inspection_there_is_no_journal() {
    let session = Session::builder()
        .llm(ScriptedLlm::new([]))
        .agent(Agent::builder("agent-a").build().unwrap())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    assert!(session.inspector().is_none());
    session.close().await.unwrap();
}

/// `booker` has a bare tool, an agent-scoped toolset and a handoff to `book` (a name that
/// is a prefix of its own); the session has a background toolset.
fn booking_agents() -> Agent {
    let book = Agent::builder("book").build().unwrap();
    let to_book = book.clone();
    let transfer = Tool::new(
        "transfer",
        "Transfers",
        move |_ctx: RunContext, _: NoArgs| {
            let book = to_book.clone();
            async move { Ok::<_, ToolFailure>(Handoff::to(book)) }
        },
    );
    let book_table = Tool::new(
        "book_table",
        "Books",
        |_ctx: RunContext, q: Query| async move { Ok::<_, ToolFailure>(format!("booked {}", q.q)) },
    );
    let note = Tool::new("note", "Notes", |_ctx: RunContext, _: Query| async move {
        Ok::<_, ToolFailure>("noted")
    });
    Agent::builder("booker")
        .tool(book_table)
        .tool(transfer)
        .toolset(Toolset::new("extras").tool(note))
        .build()
        .unwrap()
}

fn background_job() -> Tool {
    Tool::new(
        "job",
        "Background job",
        |ctx: RunContext, _: Query| async move {
            ctx.update("running").await?;
            ctx.cancelled().await;
            Ok::<_, ToolFailure>(())
        },
    )
}

#[actix::test]
async fn inspector_finds_actors_by_agent_and_runs_by_tool_without_guessing_call_ids() {
    // Eleven calls of book_table in one step (run numbers 1 to 11, so a text sort would put
    // 10 before 2), one with the model's own odd call id; then a note and a background job.
    let mut many = Reply::raw_tool_call("odd-id", "book_table", r#"{"q": "0"}"#);
    for i in 1..=10 {
        many = many.and_tool_call("book_table", json!({"q": i.to_string()}));
    }
    let llm = ScriptedLlm::new([
        many,
        Reply::tool_call("note", json!({"q": "n"})).and_tool_call("job", json!({"q": "j"})),
        Reply::text("Done."),
        Reply::tool_call("transfer", json!({})),
    ]);
    let session = Session::builder()
        .llm(llm)
        .agent(booking_agents())
        .toolset(Toolset::new("jobs").tool(background_job()))
        .inspect(true)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let inspector = session.inspector().unwrap();
    session.run("book it").await.unwrap();

    let runs = inspector.runs_of_tool("book_table");
    assert_eq!(runs.len(), 11);
    assert_eq!(runs[0], "tool/s1/1:odd-id");
    assert_eq!(runs[1], "tool/s1/2:call_1");
    assert_eq!(runs[10], "tool/s1/11:call_10");
    let note = inspector.runs_of_tool("note");
    assert_eq!(note, ["tool/s1/12:call_11"]);
    let job = &inspector.runs_of_tool("job")[0];
    let snapshot = inspector.actor(job.as_str()).unwrap();
    assert_eq!(snapshot.tool.as_deref(), Some("job"));
    assert_eq!(snapshot.agent.as_deref(), Some("booker"));
    assert!(inspector.runs_of_tool("nothing").is_empty());

    session.run("transfer me").await.unwrap();
    let booker = inspector.actors_of_agent("booker");
    for id in [
        "activity/s1/booker#1",
        "toolset/s1/booker#1/tools",
        "toolset/s1/booker#1/extras",
        "tool/s1/1:odd-id",
        "tool/s1/12:call_11",
        job.as_str(),
    ] {
        assert!(booker.iter().any(|b| b == id), "{id} in {booker:?}");
    }
    assert!(!booker.iter().any(|id| id.as_str().contains("/book#")));
    assert!(!booker.iter().any(|id| id == "toolset/s1/jobs"));
    // The session's background job outlives booker's activity; nothing else of it lives.
    let live: Vec<&ActorId> = booker
        .iter()
        .filter(|id| inspector.is_alive(id.as_str()))
        .collect();
    assert_eq!(live, [job]);
    assert_eq!(inspector.actors_of_agent("book"), ["activity/s1/book#1"]);
    session.close().await.unwrap();
}

#[actix::test]
async fn wait_for_start_waits_for_an_actor_and_says_which_ones_exist_when_none_comes() {
    tokio::time::pause();
    let gate = Gate::new();
    let g = gate.clone();
    let slow = Tool::new("slow", "Slow", move |_ctx: RunContext, _: Query| {
        let g = g.clone();
        async move {
            g.wait().await;
            Ok::<_, ToolFailure>("done")
        }
    });
    let llm = ScriptedLlm::new([
        Reply::tool_call("slow", json!({"q": "x"})),
        Reply::text("Done."),
    ]);
    let session = Session::builder()
        .llm(llm)
        .agent(Agent::builder("agent-a").tool(slow).build().unwrap())
        .inspect(true)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let inspector = session.inspector().unwrap();
    let s = session.clone();
    let turn = actix::spawn(async move { s.run("go").await });
    inspector
        .wait_for_start("tool/s1/1:call_1", Duration::from_secs(5))
        .await
        .unwrap();
    assert!(inspector.is_alive("tool/s1/1:call_1"));
    // Already started: at once, also once it has stopped.
    gate.open();
    turn.await.unwrap().unwrap();
    inspector
        .wait_for_start("tool/s1/1:call_1", Duration::from_secs(5))
        .await
        .unwrap();

    let err = inspector
        .wait_for_start("activity/s1/agent-b#1", Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, InspectError::NotStarted { id, .. } if id == "activity/s1/agent-b#1"),
        "{err}"
    );
    assert!(err.to_string().contains("did not start within 1s"), "{err}");
    assert!(err.to_string().contains("activity/s1/agent-a#1"), "{err}");
    session.close().await.unwrap();
}
