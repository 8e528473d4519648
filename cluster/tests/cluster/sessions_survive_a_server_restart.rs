//! The NATS server dies (SIGKILL) and comes back on the same port with the same store:
//! workers and the gateway reconnect by themselves, an input sent while it was down is
//! applied once it is back, the session goes on, its subscriber sees every event in order
//! without a hole, and new sessions start again.

use crate::common;

use common::{within, WorkerProcess};
use switchboard_cluster::local::NatsServer;
use switchboard_cluster::{GatewayOptions, RemoteEventKind, SessionSpec};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_and_gateway_reconnect_after_a_server_restart_and_sessions_go_on() {
    let _one_at_a_time = common::one_at_a_time().await;
    let mut server = NatsServer::start().unwrap();
    let _workers = [
        WorkerProcess::start(&server, "w1", 4, &[]),
        WorkerProcess::start(&server, "w2", 4, &[]),
    ];
    let gateway = common::gateway(&server, GatewayOptions::new()).await;
    let mut stats = gateway.watch_stats();
    let session = gateway
        .start_session(SessionSpec::new("greeter"))
        .await
        .unwrap();
    let mut events = session.subscribe_from(1);
    session.run("before").await.unwrap();

    server.kill();
    // An input while the server is down: the gateway keeps sending it.
    let sent = stats.borrow().inputs_sent;
    let during = tokio::spawn({
        let session = session.clone();
        async move { session.run("during").await }
    });
    within(
        "the input to be sent",
        stats.wait_for(|s| s.inputs_sent > sent),
    )
    .await
    .unwrap();
    server.start_again().unwrap();

    let turn = within("the turn sent during the outage", during)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        turn.assistant_messages().collect::<Vec<_>>(),
        ["You said: during"]
    );
    let turn = within("a turn after the restart", session.run("after"))
        .await
        .unwrap();
    assert_eq!(
        turn.assistant_messages().collect::<Vec<_>>(),
        ["You said: after"]
    );

    // Dispatch works again: a session started after the restart runs.
    let fresh = within(
        "a start after the restart",
        gateway.start_session(SessionSpec::new("greeter")),
    )
    .await
    .unwrap();
    fresh.run("hi").await.unwrap();
    fresh.close().await.unwrap();

    let history = session.close().await.unwrap();
    assert_eq!(history.user_messages(), ["before", "during", "after"]);

    // Every event of the session, in order, none lost: the gateway asked the owner for
    // what it missed while its connection was down.
    let mut seqs = Vec::new();
    loop {
        let event = common::next_event(&mut events, "the session's events").await;
        assert!(
            !matches!(event.kind, RemoteEventKind::EventsLost { .. }),
            "events were lost: {event:?}"
        );
        seqs.push(event.seq);
        if matches!(event.kind, RemoteEventKind::SessionClosed { .. }) {
            break;
        }
    }
    let expected: Vec<u64> = (1..=seqs.len() as u64).collect();
    assert_eq!(seqs, expected, "every event once, in order");
    let stats = gateway.stats();
    // Nobody answered while the owner reconnected, but the gateway's own connection was
    // new: that silence is a restart's, not a death's.
    assert_eq!(
        (stats.resumes, stats.silent_owners),
        (0, 0),
        "the restart moved no session: {stats:?}"
    );
    println!("restart: {stats:?}");
}
