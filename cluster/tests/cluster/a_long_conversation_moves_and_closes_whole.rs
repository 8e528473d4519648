//! A conversation of 5 MiB — five times what the server takes in one message — runs on a
//! worker, moves to another when its worker drains, and closes there: its turns' events,
//! its snapshots (deltas, the drain's full one) and the close's answer (the whole
//! history) each go over NATS in parts under the server's `max_payload`, and come back
//! whole. Nothing is refused, nothing is lost, and nobody raised the server's limit.

use crate::common;

use common::{event_where, within, WorkerProcess, PATIENCE};
use switchboard::SessionEvent;
use switchboard_cluster::local::NatsServer;
use switchboard_cluster::{GatewayOptions, Namespace, RemoteEventKind, SessionSpec};

/// Ten notes of 512 KiB each.
const NOTES: usize = 10;
const NOTE_BYTES: usize = 512 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_five_mebibyte_conversation_survives_a_move_and_a_close() {
    let _one_at_a_time = common::one_at_a_time().await;
    let server = NatsServer::start().unwrap();
    let mut first = WorkerProcess::start(&server, "w1", 2, &["--drain-secs", "2"]);
    let gateway = common::gateway(&server, GatewayOptions::new()).await;
    let observer = common::client(&server, "observer").await;
    let max_payload = observer.nats().max_payload();
    assert_eq!(max_payload, 1024 * 1024, "the server's own default");

    let session = gateway
        .start_session(SessionSpec::new("greeter"))
        .await
        .unwrap();
    let mut events = session.subscribe_from(1);
    let mut said = Vec::new();
    for i in 0..NOTES {
        // Each note distinct, and full of what JSON escapes.
        let text = format!("note {i} \"{}\"", "é\\x".repeat(NOTE_BYTES / 4));
        let turn = within("a long note", session.run(text.clone()))
            .await
            .unwrap_or_else(|err| panic!("note {i}: {err}"));
        assert_eq!(
            turn.assistant_messages().collect::<Vec<_>>(),
            [format!("Noted {} bytes.", text.len() - "note ".len())]
        );
        said.push(text);
    }
    let total: usize = said.iter().map(String::len).sum();
    assert!(total > 5 * max_payload, "{total} bytes");

    // Each note came back as an event, joined from its parts.
    for (i, text) in said.iter().enumerate() {
        event_where(&mut events, &format!("note {i} as an event"), |kind| {
            matches!(kind, RemoteEventKind::Session {
                event: SessionEvent::ConversationItemAdded { item, .. },
            } if item.text().is_some_and(|t| t == text))
        })
        .await;
    }

    // The worker drains: its last snapshot, 5 MiB, is stored in parts; w2 resumes it.
    let _second = WorkerProcess::start(&server, "w2", 2, &[]);
    first.terminate();
    assert_eq!(
        first.next_line(PATIENCE).as_deref(),
        Some("drained 1"),
        "the worker reports the session drained"
    );
    first.wait_exit(PATIENCE).expect("the drained worker exits");
    let records = common::snapshot_records(&observer, &Namespace::default(), session.id()).await;
    assert!(
        records.iter().any(|r| r.kind == "part"),
        "the snapshots went in parts: {records:?}"
    );

    // It goes on there, with the whole conversation.
    let turn = within("a turn after the move", session.run("after the move"))
        .await
        .unwrap();
    assert_eq!(
        turn.assistant_messages().collect::<Vec<_>>(),
        ["You said: after the move"]
    );
    said.push("after the move".to_owned());
    let history = within("the history", session.history()).await.unwrap();
    assert_eq!(history.user_messages(), said, "the history, read whole");

    // The close answers with the whole history too.
    let closed = match within("the close", session.close()).await {
        Ok(closed) => closed,
        // What the gateway saw, to tell a lost answer from one refused or never sent.
        Err(err) => panic!(
            "the close answered {err}; gateway {:?}; the last events:\n{}",
            gateway.stats(),
            last_events(&mut events)
        ),
    };
    assert_eq!(closed.user_messages(), said, "the close's answer, whole");
    let stats = gateway.stats();
    assert_eq!(stats.events_lost, 0, "{stats:?}");
    assert_eq!(
        gateway.worker_info("w2").await.unwrap().resumed,
        1,
        "resumed once"
    );
}

/// The last 40 events `events` holds (the move's, the last turn's and the close's), each
/// cut to 200 characters (a note is 512 KiB).
fn last_events(events: &mut switchboard_cluster::RemoteEvents) -> String {
    let mut seen = Vec::new();
    while let Some(event) = events.try_recv() {
        let text = format!("{:?}", event.map(|e| (e.seq, e.epoch, e.kind)));
        seen.push(text.chars().take(200).collect::<String>());
    }
    let keep = seen.len().saturating_sub(40);
    seen.split_off(keep).join("\n")
}
