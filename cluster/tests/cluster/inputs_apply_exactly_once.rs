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
