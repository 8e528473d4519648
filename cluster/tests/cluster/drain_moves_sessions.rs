//! A worker told to stop (SIGTERM) while 200 sessions talk on it drains: it takes no new
//! session, lets its sessions settle until the deadline, interrupts the one that has not,
//! stores each one's last snapshot, hands it over and exits; the other workers resume
//! every session from that snapshot, and the fronts go on talking without noticing beyond
//! the pause. Counted: every session is resumed exactly once, by one worker, and every
//! input its front sent is in its conversation exactly once, in order.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use common::{event_where, owner_of, within, OwnerState, WorkerProcess, PATIENCE};
use switchboard_cluster::local::NatsServer;
use switchboard_cluster::{GatewayOptions, RemoteEventKind, SessionSpec};
use tokio::task::JoinSet;

const SESSIONS: usize = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_worker_s_sessions_move_to_the_others_none_lost_none_doubled() {
    let _one_at_a_time = common::one_at_a_time().await;
    let server = NatsServer::start().unwrap();
    let mut draining = WorkerProcess::start(&server, "w1", SESSIONS + 1, &["--drain-secs", "1"]);
    let gateway = common::gateway(&server, GatewayOptions::new()).await;

    // 200 sessions on w1 (the only worker yet), each with a first turn.
    let mut starts = JoinSet::new();
    for i in 0..SESSIONS {
        let gateway = gateway.clone();
        starts.spawn(async move {
            let session = gateway
                .start_session(SessionSpec::new("greeter"))
                .await
                .unwrap();
            session.run(format!("s{i} turn 0")).await.unwrap();
            (i, session)
        });
    }
    let mut sessions = Vec::new();
    while let Some(started) = within("200 sessions to start", starts.join_next()).await {
        sessions.push(started.unwrap());
    }
    sessions.sort_by_key(|(i, _)| *i);
    // And one whose reply stalls: it cannot settle, and is interrupted at the deadline.
    let stalled = gateway
        .start_session(SessionSpec::new("greeter"))
        .await
        .unwrap();
    let mut stalled_events = stalled.subscribe_from(1);
    let stalled_turn = tokio::spawn({
        let stalled = stalled.clone();
        async move { stalled.run("stall until the drain").await }
    });
    event_where(&mut stalled_events, "the stalled reply", |kind| {
        matches!(kind, RemoteEventKind::SpeechChunk { .. })
    })
    .await;
    let mut others = [
        WorkerProcess::start(&server, "w2", SESSIONS, &[]),
        WorkerProcess::start(&server, "w3", SESSIONS, &[]),
    ];

    // Under load: every front talks, turn after turn, through the drain.
    let stop = Arc::new(AtomicBool::new(false));
    let mut talking = JoinSet::new();
    for (i, session) in &sessions {
        let (i, session, stop) = (*i, session.clone(), stop.clone());
        talking.spawn(async move {
            let mut sent = vec![format!("s{i} turn 0")];
            // At least three turns each, the last ones after the move.
            while sent.len() < 4 || !stop.load(Ordering::SeqCst) {
                let text = format!("s{i} turn {}", sent.len());
                let turn = session
                    .run(text.clone())
                    .await
                    .unwrap_or_else(|err| panic!("session {i}: {text:?} failed: {err}"));
                assert_eq!(
                    turn.assistant_messages().collect::<Vec<_>>(),
                    [format!("You said: {text}")]
                );
                sent.push(text);
            }
            (i, sent)
        });
    }
    let began = Instant::now();
    draining.terminate();
    assert_eq!(
        draining.next_line(PATIENCE).as_deref(),
        Some(format!("drained {}", SESSIONS + 1).as_str()),
        "the worker reports every session drained"
    );
    let drained = began.elapsed();
    let status = draining
        .wait_exit(PATIENCE)
        .expect("the drained worker exits");
    assert!(status.success(), "{status}");

    // The stalled turn was interrupted at the deadline; its session goes on elsewhere.
    let turn = within("the stalled turn", stalled_turn)
        .await
        .unwrap()
        .unwrap();
    assert!(turn.interrupted, "{turn:?}");
    let after = within("a turn of the stalled session", stalled.run("still there?"))
        .await
        .unwrap();
    assert_eq!(
        after.assistant_messages().collect::<Vec<_>>(),
        ["You said: still there?"]
    );

    // Every front's talk goes on: each ends its last turns on the new owners.
    stop.store(true, Ordering::SeqCst);
    let mut conversations = Vec::new();
    while let Some(done) = within("the fronts' turns", talking.join_next()).await {
        conversations.push(done.unwrap());
    }
    println!(
        "drain of {} sessions under load: drained in {drained:?}, every front's last turn {:?} after SIGTERM",
        SESSIONS + 1,
        began.elapsed()
    );

    // None lost, none doubled: each input once, in order; each session resumed once, by
    // w2 or w3, at epoch 2.
    let observer = common::client(&server, "observer").await;
    conversations.sort_by_key(|(i, _)| *i);
    for ((i, sent), (_, session)) in conversations.iter().zip(&sessions) {
        let history = within("a history", session.history()).await.unwrap();
        assert_eq!(&history.user_messages(), sent, "session {i}");
        let owner = owner_of(&observer, session.id()).await.unwrap();
        assert!(
            ["w2", "w3"].contains(&owner.worker.as_str())
                && owner.state == OwnerState::Running
                && owner.epoch == 2,
            "session {i}: {owner:?}"
        );
        let mut events = session.subscribe_from(1);
        let (moving, _) = event_where(&mut events, "the move", |kind| {
            matches!(kind, RemoteEventKind::SessionMoving)
        })
        .await;
        assert_eq!(moving.epoch, 1);
        let (resumed, later) = event_where(&mut events, "the resume", |kind| {
            matches!(kind, RemoteEventKind::SessionResumed { .. })
        })
        .await;
        assert!(later.is_empty(), "{later:?}");
        assert_eq!(resumed.epoch, 2);
    }
    let mut resumed = 0;
    for worker in &mut others {
        worker.assert_one_output_held();
        resumed += gateway.worker_info(&worker.name).await.unwrap().resumed;
    }
    assert_eq!(resumed, SESSIONS as u64 + 1, "each session resumed once");
    assert_eq!(gateway.stats().resumes, SESSIONS as u64 + 1);

    // New sessions go to the workers still running.
    let next = within(
        "a start after the drain",
        gateway.start_session(SessionSpec::new("greeter")),
    )
    .await
    .unwrap();
    next.run("hi").await.unwrap();
    next.close().await.unwrap();
}
