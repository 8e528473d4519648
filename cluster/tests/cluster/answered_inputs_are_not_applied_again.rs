//! An input whose answer the front already has is never applied again by the next owner,
//! even when no snapshot was stored after it (SPEC §15, "Every input exactly once,
//! whatever its kind"). An interim transcript and a history read change nothing a session
//! saves, so no snapshot follows them; their owner dies (SIGKILL). The new owner's snapshot
//! does not hold them, and the gateway, which has both answers, sends each in its place as
//! answered: the new owner counts them and applies nothing — no second transcript event,
//! no second history outcome — and the next input goes on from there.

use crate::common;

use common::{within, WorkerProcess};
use switchboard::SessionEvent;
use switchboard_cluster::local::NatsServer;
use switchboard_cluster::{GatewayOptions, RemoteEventKind, SessionSpec};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inputs_answered_before_a_crash_are_not_applied_by_the_next_owner() {
    let _one_at_a_time = common::one_at_a_time().await;
    let server = NatsServer::start().unwrap();
    let mut doomed = WorkerProcess::start(&server, "w1", 4, &["--lease-secs", "1"]);
    let gateway = common::gateway(&server, GatewayOptions::new()).await;
    let session = gateway
        .start_session(SessionSpec::new("greeter"))
        .await
        .unwrap();
    let mut events = session.subscribe_from(1);
    session.run("hello").await.unwrap();
    // Saved once the turn settled; what follows saves nothing.
    session.transcript("interim words", false).await.unwrap();
    let read = session.history().await.unwrap();
    assert_eq!(read.user_messages(), ["hello"]);

    doomed.kill();
    let _survivor = WorkerProcess::start(&server, "w2", 4, &["--lease-secs", "1"]);
    let after = within("the run after the crash", session.run("after")).await;
    assert_eq!(
        after.unwrap().assistant_messages().collect::<Vec<_>>(),
        ["You said: after"]
    );
    let history = within("the close", session.close()).await.unwrap();
    assert_eq!(history.user_messages(), ["hello", "after"]);

    let mut interims = 0;
    loop {
        let event = within("the session's events", events.recv()).await.unwrap();
        match event.kind {
            RemoteEventKind::Session {
                event:
                    SessionEvent::UserInputTranscribed {
                        is_final: false, ..
                    },
            } => interims += 1,
            RemoteEventKind::SessionClosed { .. } => break,
            _ => {}
        }
    }
    assert_eq!(interims, 1, "the transcript was applied once");
    let stats = gateway.stats();
    // A read applied again on the new owner would answer a call nobody makes.
    assert_eq!(
        stats.answers_unclaimed, 0,
        "the read was applied once: {stats:?}"
    );
    assert!(stats.inputs_answered >= 2, "{stats:?}");
    assert!(stats.resumes >= 1, "{stats:?}");
}
