//! Every input the gateway accepted is applied exactly once — also when the gateway had to
//! send it again because its owner did not answer in time.
//!
//! The owner is a real worker process, frozen with SIGSTOP while inputs are in flight: the
//! gateway's attempts time out and it sends the same input id again and again; on SIGCONT
//! the worker reads the first copy (applies it) and then the copies (answers them again,
//! applies nothing). The session's own history is the count: each text the gateway sent
//! appears exactly once, in order.

use crate::common;

use std::time::Duration;

use common::{retried, within, WorkerProcess};
use switchboard_cluster::local::NatsServer;
use switchboard_cluster::{GatewayOptions, SessionSpec};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_accepted_input_is_applied_once_even_when_the_gateway_retries() {
    let _one_at_a_time = common::one_at_a_time().await;
    let server = NatsServer::start().unwrap();
    let worker = WorkerProcess::start(&server, "w1", 4, &[]);
    // Short attempts, so a frozen owner costs retries, not seconds.
    let gateway = common::gateway(
        &server,
        GatewayOptions::new().attempt_timeout(Duration::from_millis(50)),
    )
    .await;
    let mut stats = gateway.watch_stats();
    let session = gateway
        .start_session(SessionSpec::new("greeter"))
        .await
        .unwrap();

    let mut runs = Vec::new();
    let mut says = Vec::new();
    let mut inputs = 0u64;
    for round in 0..3 {
        // Some inputs while the owner answers at once.
        for i in 0..10 {
            let text = format!("round {round} say {i}");
            session.say(text.clone()).await.unwrap();
            says.push(text);
            inputs += 1;
        }
        let text = format!("round {round} run");
        session.run(text.clone()).await.unwrap();
        runs.push(text);
        inputs += 1;

        // The owner freezes with a turn and a say in flight: both are retried.
        worker.freeze();
        let before = stats.borrow().retries;
        let frozen_run = tokio::spawn({
            let session = session.clone();
            let text = format!("round {round} frozen run");
            runs.push(text.clone());
            async move { session.run(text).await }
        });
        retried(&mut stats, before + 3).await;
        worker.thaw();
        let turn = within("the frozen run", frozen_run).await.unwrap().unwrap();
        assert_eq!(
            turn.assistant_messages().collect::<Vec<_>>(),
            [format!("You said: round {round} frozen run")]
        );
        inputs += 1;

        worker.freeze();
        let before = stats.borrow().retries;
        let frozen_say = tokio::spawn({
            let session = session.clone();
            let text = format!("round {round} frozen say");
            says.push(text.clone());
            async move { session.say(text).await }
        });
        retried(&mut stats, before + 3).await;
        worker.thaw();
        within("the frozen say", frozen_say).await.unwrap().unwrap();
        inputs += 1;
    }

    let history = within("the close", session.close()).await.unwrap();
    inputs += 1;
    assert_eq!(
        history.user_messages(),
        runs,
        "each run applied once, in order"
    );
    let said = history.assistant_messages();
    for text in &says {
        let times = said.iter().filter(|s| *s == text).count();
        assert_eq!(times, 1, "{text:?} was said {times} times: {said:?}");
    }

    let info = gateway.worker_info("w1").await.unwrap();
    assert_eq!(
        info.inputs_applied, inputs,
        "the owner applied each input once: {info:?}"
    );
    assert!(
        info.inputs_repeated >= 6 * 2,
        "the owner recognised the retried copies: {info:?}"
    );
    let stats = gateway.stats();
    assert_eq!(stats.inputs_sent, inputs, "{stats:?}");
    println!("inputs: {inputs}; {stats:?}; {info:?}");
}

/// The same for every kind of input: each is sent while its owner is frozen, retried, and
/// applied once — transcripts (interim and final), the user speaking, a reply asked for,
/// an interruption, an agent update, a history read, a playout report. What each does
/// shows once: its event, its message, its handoff; the owner counts each input once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_input_is_applied_once_when_the_gateway_retries_it() {
    use switchboard::{SessionEvent, UserState};
    use switchboard_cluster::{AgentSpec, RemoteEventKind};

    let _one_at_a_time = common::one_at_a_time().await;
    let server = NatsServer::start().unwrap();
    let worker = WorkerProcess::start(&server, "w1", 4, &[]);
    let gateway = common::gateway(
        &server,
        GatewayOptions::new().attempt_timeout(Duration::from_millis(50)),
    )
    .await;
    let mut stats = gateway.watch_stats();
    let session = gateway
        .start_session(SessionSpec::new("greeter"))
        .await
        .unwrap();
    let mut events = session.subscribe_from(1);
    let said = session.say("Hello there.").await.unwrap();
    let mut inputs = 1u64;

    // Sends one input while the owner is frozen, so the gateway retries it; then lets the
    // owner go and waits for the input's answer.
    macro_rules! frozen {
        ($name:literal, |$s:ident| $call:expr) => {{
            worker.freeze();
            let before = stats.borrow().retries;
            let call = tokio::spawn({
                let $s = session.clone();
                async move { $call.await }
            });
            retried(&mut stats, before + 3).await;
            worker.thaw();
            inputs += 1;
            within($name, call).await.unwrap().unwrap()
        }};
    }
    frozen!("user started speaking", |s| s.user_started_speaking());
    frozen!("an interim transcript", |s| s.transcript("look", false));
    frozen!("user stopped speaking", |s| s.user_stopped_speaking());
    frozen!("a final transcript", |s| s.transcript("final words", true));
    frozen!("a playout report", |s| s.playout_finished(
        said.id(),
        false,
        None
    ));
    frozen!("a reply", |s| s.generate_reply(Some("Ask.".into())));
    frozen!("an interruption", |s| s.interrupt());
    frozen!("an agent update", |s| s
        .update_agent(AgentSpec::new("concierge")));
    let read = frozen!("a history read", |s| s.history());
    assert!(read.user_messages().contains(&"final words"));

    let history = within("the close", session.close()).await.unwrap();
    inputs += 1;
    assert_eq!(history.user_messages(), ["final words"], "{history:?}");
    // The say, the reply asked for, the answer to the final transcript: once each.
    assert_eq!(
        history.assistant_messages().len(),
        3,
        "one reply asked for, one given: {history:?}"
    );
    let handoffs = history
        .agents
        .iter()
        .filter(|entry| entry.agent == "concierge")
        .count();
    assert_eq!(handoffs, 1, "one agent update, one handoff: {history:?}");

    // Each input's own event, once.
    let mut interims = 0;
    let mut speaking = 0;
    let mut listening = 0;
    loop {
        let event = within("the session's events", events.recv()).await.unwrap();
        match event.kind {
            RemoteEventKind::Session { event } => match event {
                SessionEvent::UserInputTranscribed {
                    is_final: false, ..
                } => interims += 1,
                SessionEvent::UserStateChanged {
                    state: UserState::Speaking,
                } => speaking += 1,
                SessionEvent::UserStateChanged {
                    state: UserState::Listening,
                } => listening += 1,
                _ => {}
            },
            RemoteEventKind::SessionClosed { .. } => break,
            _ => {}
        }
    }
    assert_eq!((interims, speaking, listening), (1, 1, 1));

    let info = gateway.worker_info("w1").await.unwrap();
    assert_eq!(
        info.inputs_applied, inputs,
        "the owner applied each input once: {info:?}"
    );
    assert!(
        info.inputs_repeated >= 9,
        "the owner recognised the retried copies: {info:?}"
    );
}
