//! A worker dies (SIGKILL) in the middle of its sessions' turns: their leases expire, the
//! other workers resume each session from its last snapshot, the gateway sends the new
//! owner the inputs that snapshot lacks, and the turn that was under way goes on there. Its
//! tool (`wait`) keeps the default restore policy, `Abandon`, so its body starts only once
//! the store holds the call: a turn whose call was stored is not run again (the call is
//! abandoned, its body never runs twice, and the gateway says the turn's answer was lost
//! with the worker); one whose call was not stored yet had not started its body, and runs
//! again and answers. Counted: every input the gateway accepted
//! is in the conversation exactly once, in order, and every model request the new owners
//! made keeps the one-output rule.

use crate::common;
use switchboard::SessionEvent;

use std::time::{Duration, Instant};

use common::{event_where, owner_of, within, OwnerState, WorkerProcess};
use serde_json::json;
use switchboard_cluster::local::NatsServer;
use switchboard_cluster::{GatewayOptions, RemoteEventKind, SessionSpec};
use tokio::task::JoinSet;

const SESSIONS: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_of_a_killed_worker_go_on_elsewhere_with_each_input_applied_once() {
    let _one_at_a_time = common::one_at_a_time().await;
    let server = NatsServer::start().unwrap();
    let lease = ["--lease-secs", "1"];
    // The sessions' tool waits a minute on w1 (it dies first), 100 ms on the others.
    let mut doomed = WorkerProcess::start(&server, "w1", SESSIONS, &lease);
    let gateway = common::gateway(&server, GatewayOptions::new()).await;
    let observer = common::client(&server, "observer").await;

    // Every session starts on w1 (the only worker yet) and has a conversation.
    let mut sessions = Vec::new();
    for _ in 0..SESSIONS {
        let spec = SessionSpec::new("greeter").data(json!({ "tool_ms": 60_000 }));
        let session = gateway.start_session(spec).await.unwrap();
        for i in 0..2 {
            session.say(format!("said {i}")).await.unwrap();
            session.run(format!("hello {i}")).await.unwrap();
        }
        sessions.push(session);
    }
    let short = ["--lease-secs", "1", "--max-tool-ms", "100"];
    let mut survivors = [
        WorkerProcess::start(&server, "w2", SESSIONS, &short),
        WorkerProcess::start(&server, "w3", SESSIONS, &short),
    ];

    // Each session starts a turn whose tool takes a while; once every tool runs, w1 dies.
    let mut events: Vec<_> = sessions.iter().map(|s| s.subscribe()).collect();
    let mut turns = JoinSet::new();
    for (i, session) in sessions.iter().enumerate() {
        let session = session.clone();
        turns.spawn(async move { (i, session.run(format!("wait for item {i}")).await) });
    }
    for events in &mut events {
        // The model's step that called the tool ended: the tool runs (for a minute).
        event_where(events, "the model step of the turn under way", |kind| {
            matches!(
                kind,
                RemoteEventKind::Session {
                    event: SessionEvent::LlmMetrics(_)
                }
            )
        })
        .await;
    }
    doomed.kill();
    let killed = Instant::now();

    // The turns under way answer their callers (run again on the new owners), or, when the
    // store held their call, say the answer was lost with w1 (the call abandoned).
    let mut failover = Duration::MAX;
    while let Some(done) = within("the turns under way at the kill", turns.join_next()).await {
        let (i, turn) = done.unwrap();
        match turn {
            Ok(turn) => assert_eq!(
                turn.assistant_messages().collect::<Vec<_>>(),
                [format!("Lookup says: waited for item {i}")]
            ),
            Err(switchboard_cluster::GatewayError::AnswerLost { .. }) => {}
            Err(err) => panic!("session {i}'s turn under way failed: {err}"),
        }
        failover = failover.min(killed.elapsed());
    }
    println!(
        "the first turn under way answered {failover:?} after the kill, every one {:?} after (lease 1 s, tool 100 ms)",
        killed.elapsed()
    );

    // The next input of each session is answered by its new owner.
    for (i, session) in sessions.iter().enumerate() {
        let turn = within("a turn after the kill", session.run(format!("after {i}")))
            .await
            .unwrap();
        assert_eq!(
            turn.assistant_messages().collect::<Vec<_>>(),
            [format!("You said: after {i}")]
        );
        let owner = owner_of(&observer, session.id()).await.unwrap();
        assert!(
            owner.worker != "w1" && owner.state == OwnerState::Running && owner.epoch >= 2,
            "{owner:?}"
        );
    }

    // Counted in the conversations themselves: each input once, in order.
    for (i, session) in sessions.iter().enumerate() {
        let history = within("the history", session.history()).await.unwrap();
        assert_eq!(
            history.user_messages(),
            [
                "hello 0".to_owned(),
                "hello 1".to_owned(),
                format!("wait for item {i}"),
                format!("after {i}")
            ],
            "session {i}"
        );
        let said = history.assistant_messages();
        for text in ["said 0", "said 1"] {
            let times = said.iter().filter(|s| **s == text).count();
            assert_eq!(
                times, 1,
                "session {i}: {text:?} said {times} times: {said:?}"
            );
        }
        let mut events = session.subscribe_from(1);
        let (resumed, _) = event_where(&mut events, "the resume", |kind| {
            matches!(kind, RemoteEventKind::SessionResumed { .. })
        })
        .await;
        assert!(resumed.epoch >= 2, "{resumed:?}");
    }
    let mut resumed = 0;
    for worker in &mut survivors {
        worker.assert_one_output_held();
        resumed += gateway.worker_info(&worker.name).await.unwrap().resumed;
    }
    assert_eq!(resumed, SESSIONS as u64, "each session resumed once");
    let stats = gateway.stats();
    assert_eq!(stats.resumes, SESSIONS as u64, "{stats:?}");
    println!("{stats:?}");
}
