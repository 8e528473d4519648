//! A front drives a session on a worker process through a gateway, with the host API of a
//! local session, as a voice front would: it plays the speech it is sent and reports each
//! playout back.

use crate::common;

use std::time::Duration;

use common::{event_where, within, WorkerProcess};
use switchboard::{SessionEvent, SpeechOutcome};
use switchboard_cluster::local::NatsServer;
use switchboard_cluster::{
    AgentSpec, CloseReason, FactoryError, GatewayError, GatewayOptions, OutputMode,
    RemoteEventKind, RemoteSession, SessionSpec,
};

/// The voice front: plays each speech as it streams and reports it played out when its
/// text is complete, or cut short with the first word when told to stop.
fn voice_front(session: &RemoteSession) -> tokio::task::JoinHandle<()> {
    let session = session.clone();
    let mut events = session.subscribe_from(1);
    tokio::spawn(async move {
        let mut texts = std::collections::HashMap::new();
        while let Ok(event) = events.recv().await {
            match event.kind {
                RemoteEventKind::SpeechChunk { speech, text } => {
                    texts
                        .entry(speech)
                        .or_insert_with(String::new)
                        .push_str(&text);
                }
                RemoteEventKind::SpeechFinished { speech } => {
                    let _ = session.playout_finished(speech, false, None).await;
                }
                RemoteEventKind::SpeechInterrupted { speech } => {
                    let text = texts.get(&speech).cloned().unwrap_or_default();
                    let heard = text
                        .split_whitespace()
                        .next()
                        .unwrap_or_default()
                        .to_owned();
                    let _ = session.playout_finished(speech, true, Some(heard)).await;
                }
                _ => {}
            }
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voice_front_drives_a_remote_session_through_the_host_api() {
    let _one_at_a_time = common::one_at_a_time().await;
    let server = NatsServer::start().unwrap();
    let _worker = WorkerProcess::start(&server, "w1", 4, &[]);
    let gateway = common::gateway(&server, GatewayOptions::new()).await;

    let spec = SessionSpec::new("greeter").output(OutputMode::Voice { pausable: false });
    let session = gateway.start_session(spec).await.unwrap();
    let front = voice_front(&session);
    let mut events = session.subscribe_from(1);
    let (first, _) = event_where(&mut events, "the start", |_| true).await;
    assert!(
        matches!(
            (first.seq, &first.kind),
            (1, RemoteEventKind::SessionStarted)
        ),
        "{first:?}"
    );

    // A turn with an async tool: it answers with its update, then a deferred reply.
    let turn = within("the lookup turn", session.run("look up trains"))
        .await
        .unwrap();
    assert_eq!(
        turn.function_calls()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>(),
        ["lookup"]
    );
    let (_, _) = event_where(&mut events, "the deferred reply with the tool's result", |kind| {
        matches!(kind, RemoteEventKind::SpeechChunk { text, .. } if text.contains("found trains"))
    })
    .await;

    // say: queued as a speech, played by the front. Its handle, the one the engine's
    // event carries too, is linked to the remote session: it learns the speech's end.
    let said = session.say("One moment.").await.unwrap();
    let speech = said.id();
    let (created, _) = event_where(&mut events, "the say's speech", |kind| {
        matches!(kind, RemoteEventKind::Session { event: SessionEvent::SpeechCreated { speech: s, .. } } if s.id() == speech)
    })
    .await;
    let RemoteEventKind::Session {
        event: SessionEvent::SpeechCreated { speech: handle, .. },
    } = created.kind
    else {
        unreachable!("matched above")
    };
    assert_eq!(
        within("the say's playout", said.wait_for_playout()).await,
        SpeechOutcome::Played
    );
    assert_eq!(handle.outcome(), Some(SpeechOutcome::Played), "one handle");
    event_where(&mut events, "the say played out", |kind| {
        matches!(kind, RemoteEventKind::Session { event: SessionEvent::SpeechPlayedOut { speech: s, interrupted: false, .. } } if *s == speech)
    })
    .await;

    // The user speaks: state events, then a final transcript is a user turn.
    session.user_started_speaking().await.unwrap();
    session.transcript("hello there", true).await.unwrap();
    session.user_stopped_speaking().await.unwrap();
    event_where(&mut events, "the answer to the transcript", |kind| {
        matches!(kind, RemoteEventKind::SpeechChunk { text, .. } if text == "You said: hello there")
    })
    .await;

    // A handoff to an agent the worker's factory builds; an unknown one is refused.
    session
        .update_agent(AgentSpec::new("concierge"))
        .await
        .unwrap();
    let turn = within("the concierge's turn", session.run("hi"))
        .await
        .unwrap();
    assert_eq!(
        turn.assistant_messages().collect::<Vec<_>>(),
        ["Concierge: hi"]
    );
    match session.update_agent(AgentSpec::new("nobody")).await {
        Err(GatewayError::Factory {
            error: FactoryError::UnknownAgent { name, .. },
            ..
        }) => assert_eq!(name, "nobody"),
        other => panic!("an unknown agent must be refused, got {other:?}"),
    }

    // Interrupting a turn whose reply stalls: the front is told to stop and reports the
    // first word heard; the turn ends interrupted.
    let stalled = tokio::spawn({
        let session = session.clone();
        async move { session.run("stall please").await }
    });
    event_where(
        &mut events,
        "the stalled reply's first words",
        |kind| matches!(kind, RemoteEventKind::SpeechChunk { text, .. } if text == "Let me think"),
    )
    .await;
    within("the interrupt", session.interrupt()).await.unwrap();
    let turn = within("the interrupted turn", stalled)
        .await
        .unwrap()
        .unwrap();
    assert!(turn.interrupted);

    let history = within("the close", session.close()).await.unwrap();
    assert_eq!(
        history.user_messages(),
        ["look up trains", "hello there", "hi", "stall please"]
    );
    let said = history.assistant_messages();
    assert!(said.contains(&"One moment."), "{said:?}");
    assert!(said.contains(&"Concierge: hi"), "{said:?}");
    assert!(
        said.contains(&"Let"),
        "the interrupted reply is cut to what was heard: {said:?}"
    );
    event_where(&mut events, "the end", |kind| {
        matches!(
            kind,
            RemoteEventKind::SessionClosed {
                reason: CloseReason::Host
            }
        )
    })
    .await;
    assert!(matches!(
        session.run("anyone?").await,
        Err(GatewayError::Closed {
            reason: CloseReason::Host,
            ..
        })
    ));
    within("the front's end", front).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_that_cannot_work_fail_saying_why() {
    let _one_at_a_time = common::one_at_a_time().await;
    let server = NatsServer::start().unwrap();
    let _worker = WorkerProcess::start(&server, "w1", 2, &[]);
    let gateway = common::gateway(&server, GatewayOptions::new()).await;

    match gateway.start_session(SessionSpec::new("nobody")).await {
        Err(GatewayError::StartFailed { reason, .. }) => {
            assert!(reason.contains("nobody"), "{reason}")
        }
        other => panic!("an unknown agent cannot start: {other:?}"),
    }
    let first = gateway
        .start_session_with_id("call-42", SessionSpec::new("greeter"))
        .await
        .unwrap();
    match gateway
        .start_session_with_id("call-42", SessionSpec::new("greeter"))
        .await
    {
        Err(GatewayError::Duplicate { session }) => assert_eq!(session.as_str(), "call-42"),
        other => panic!("an id in use is refused: {other:?}"),
    }
    assert!(matches!(
        gateway
            .start_session_with_id("call.42", SessionSpec::new("greeter"))
            .await,
        Err(GatewayError::Name(_))
    ));
    first.close().await.unwrap();

    // No worker in this namespace: the start times out, saying so.
    let lonely = common::gateway(
        &server,
        GatewayOptions::new()
            .namespace(switchboard_cluster::Namespace::new("empty").unwrap())
            .start_timeout(Duration::from_millis(300)),
    )
    .await;
    assert!(matches!(
        lonely.start_session(SessionSpec::new("greeter")).await,
        Err(GatewayError::StartTimedOut { .. })
    ));
}
