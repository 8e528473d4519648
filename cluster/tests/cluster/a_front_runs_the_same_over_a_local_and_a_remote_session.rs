//! One host API: the same front code (`run_front`, generic over `HostSession`) drives a
//! local session and a remote one on a worker process, both built by the same factory,
//! and records the same thing — greeting, typed and spoken turns, a speech, a barge-in, a
//! transfer (its turn returns the transferring agent's words; the new agent's greeting
//! follows as a reply of its own), another agent, and the close.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;
use crate::test_agents::TestAgents;

use common::{within, WorkerProcess};
use serde_json::Value;
use switchboard::testing::front::{a_call, run_front, FrontRecord, FrontStep};
use switchboard::{Agent, Engine, HostSession};
use switchboard_cluster::local::NatsServer;
use switchboard_cluster::{AgentSpec, GatewayOptions, SessionFactory, SessionSpec};

/// The front's script: a call (`a_call`) with a transfer before the other agent;
/// `concierge` is how the session at hand is given that agent.
fn script<A>(concierge: A) -> Vec<FrontStep<A>> {
    let mut steps = a_call(concierge);
    // Before the `update_agent`: the transfer, then a turn with the booker.
    let at = steps.len() - 2;
    steps.splice(
        at..at,
        [
            FrontStep::Run("transfer me".into()),
            FrontStep::Run("at eight".into()),
        ],
    );
    steps
}

/// The front code, written once.
async fn front<S: HostSession>(session: &S, concierge: S::Agent) -> FrontRecord {
    match within("the front's script", run_front(session, script(concierge))).await {
        Ok(record) => record,
        Err(err) => panic!("the front's script failed: {err}"),
    }
}

fn agents() -> TestAgents {
    TestAgents {
        max_tool_ms: u64::MAX,
    }
}

/// A session of this process, as the worker's factory builds it.
async fn local_record(engine: &Engine) -> FrontRecord {
    let factory = agents();
    let spec = SessionSpec::new("receptionist");
    let agent = |name: &str| -> Agent { factory.agent(name, &Value::Null).unwrap() };
    let session = factory
        .builder(&spec)
        .unwrap()
        .agent(agent("receptionist"))
        .start(engine)
        .await
        .unwrap();
    front(&session, agent("concierge")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_front_code_gets_the_same_record_from_a_local_and_a_remote_session() {
    let _one_at_a_time = common::one_at_a_time().await;
    let engine = Engine::start().unwrap();
    let local = local_record(&engine).await;
    engine.shutdown();

    let server = NatsServer::start().unwrap();
    let _worker = WorkerProcess::start(&server, "w1", 2, &[]);
    let gateway = common::gateway(&server, GatewayOptions::new()).await;
    let session = gateway
        .start_session(SessionSpec::new("receptionist"))
        .await
        .unwrap();
    let remote = front(&session, AgentSpec::new("concierge")).await;

    assert_eq!(
        local.lines,
        [
            "reply: Hello!",
            "run I'd like a table: You said: I'd like a table",
            "speak a table for two: You said: a table for two",
            "say One moment, please.",
            "interrupt",
            "run transfer me: Transferring you to the booker.",
            "run at eight: Booker: at eight",
            "update_agent",
            "run hello again: Concierge: hello again",
        ],
        "the local record"
    );
    assert_eq!(
        remote.lines, local.lines,
        "the remote record is the local one"
    );
    assert_eq!(remote.user_messages(), local.user_messages());
    assert_eq!(remote.assistant_messages(), local.assistant_messages());
    assert!(
        local
            .assistant_messages()
            .contains(&"Booker here.".to_owned()),
        "the booker greeted: {:?}",
        local.assistant_messages()
    );
    assert_eq!(
        remote
            .history
            .agents
            .iter()
            .map(|a| a.agent.as_str())
            .collect::<Vec<_>>(),
        ["receptionist", "booker", "concierge"],
        "the same activations"
    );
}
