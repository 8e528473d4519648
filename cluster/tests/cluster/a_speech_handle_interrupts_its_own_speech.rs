//! A speech's handle interrupts that speech and no other, on a local session and on a
//! remote one alike (one test body, generic over `HostSession`, run over both, built by
//! the same factory): a `say` queued behind a reply that plays, interrupted by its handle,
//! never plays and the reply goes on; the handle of a speech that finished interrupts
//! nothing, not even the speech playing then; the handle of the speech playing stops it,
//! and its turn ends interrupted.

use crate::common;
use crate::test_agents::TestAgents;

use common::{within, WorkerProcess};
use serde_json::Value;
use switchboard::{Engine, HostSession, SessionEvent, SessionEvents, SpeechHandle, SpeechOutcome};
use switchboard_cluster::local::NatsServer;
use switchboard_cluster::{GatewayOptions, SessionFactory, SessionSpec};

/// The next speech the session starts but those `known`, within the patience.
async fn next_speech<E: SessionEvents>(
    events: &mut E,
    known: &[&SpeechHandle],
    waiting_for: &str,
) -> SpeechHandle {
    within(waiting_for, async {
        loop {
            match events.next().await {
                Some(Ok(SessionEvent::SpeechCreated { speech, .. }))
                    if !known.contains(&&speech) =>
                {
                    return speech
                }
                Some(_) => {}
                None => panic!("waiting for {waiting_for}: the events ended"),
            }
        }
    })
    .await
}

/// The test body, written once: returns how each speech ended and the conversation.
async fn speeches_interrupted_by_their_handles<S>(session: &S) -> Vec<String>
where
    S: HostSession + Clone + 'static,
    S::Error: std::fmt::Debug,
{
    let mut events = session.events();
    let mut record = Vec::new();

    // A reply that plays until it is interrupted, and a say queued behind it.
    let stalled = tokio::spawn({
        let session = session.clone();
        async move { session.run("stall please").await }
    });
    let reply = next_speech(&mut events, &[], "the stalled reply").await;
    let queued = within("the say", session.say("One moment.")).await.unwrap();
    assert!(!queued.is_done(), "queued behind the reply");

    // The queued say's handle: it never plays; the reply goes on.
    queued.interrupt().unwrap();
    let outcome = within("the queued say's end", queued.wait_for_playout()).await;
    record.push(format!("queued say: {outcome:?}"));
    // A read after it: the interruption was applied before it.
    within("a read", session.history()).await.unwrap();
    assert!(!reply.is_done(), "the reply plays on");
    assert!(!stalled.is_finished(), "its turn goes on");

    // The reply's handle: it stops, and its turn ends interrupted.
    reply.interrupt().unwrap();
    let turn = within("the interrupted turn", stalled)
        .await
        .unwrap()
        .unwrap();
    assert!(turn.interrupted, "{turn:?}");
    let outcome = within("the reply's end", reply.wait_for_playout()).await;
    assert!(
        matches!(outcome, SpeechOutcome::Interrupted { .. }),
        "{outcome:?}"
    );
    record.push("reply: interrupted".into());

    // A say that played out: its handle interrupts nothing, not the reply playing now.
    let finished = within("a say", session.say("Thank you.")).await.unwrap();
    let outcome = within("the say's playout", finished.wait_for_playout()).await;
    record.push(format!("finished say: {outcome:?}"));
    let stalled = tokio::spawn({
        let session = session.clone();
        async move { session.run("stall again").await }
    });
    let playing = next_speech(&mut events, &[&finished], "the second stalled reply").await;
    finished.interrupt().unwrap();
    finished.force_interrupt();
    within("a read", session.history()).await.unwrap();
    assert!(!playing.is_done(), "the reply playing now plays on");
    assert!(!stalled.is_finished(), "its turn goes on");
    playing.force_interrupt();
    let turn = within("the second interrupted turn", stalled)
        .await
        .unwrap()
        .unwrap();
    assert!(turn.interrupted, "{turn:?}");
    record.push("second reply: interrupted".into());

    let history = within("the close", session.close()).await.unwrap();
    record.push(format!("user: {:?}", history.user_messages()));
    record.push(format!("agent: {:?}", history.assistant_messages()));
    record
}

fn agents() -> TestAgents {
    TestAgents {
        max_tool_ms: u64::MAX,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_speech_handle_interrupts_its_own_speech_on_a_local_and_a_remote_session() {
    let _one_at_a_time = common::one_at_a_time().await;
    let engine = Engine::start().unwrap();
    let factory = agents();
    let spec = SessionSpec::new("greeter");
    let local = factory
        .builder(&spec)
        .unwrap()
        .agent(factory.agent("greeter", &Value::Null).unwrap())
        .start(&engine)
        .await
        .unwrap();
    let local = speeches_interrupted_by_their_handles(&local).await;
    engine.shutdown();

    let server = NatsServer::start().unwrap();
    let _worker = WorkerProcess::start(&server, "w1", 2, &[]);
    let gateway = common::gateway(&server, GatewayOptions::new()).await;
    let remote = gateway.start_session(spec).await.unwrap();
    let remote = speeches_interrupted_by_their_handles(&remote).await;

    assert_eq!(
        local,
        [
            "queued say: Interrupted { heard: Some(\"\") }",
            "reply: interrupted",
            "finished say: Played",
            "second reply: interrupted",
            "user: [\"stall please\", \"stall again\"]",
            "agent: [\"Let me think\", \"Thank you.\", \"Let me think\"]",
        ],
        "the local record"
    );
    assert_eq!(remote, local, "the remote record is the local one");
}
