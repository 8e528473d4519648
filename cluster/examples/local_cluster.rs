//! A whole cluster on one machine: a local `nats-server` (provisioned from the project's
//! own files), one worker in this process, a gateway, and a session the gateway drives
//! without knowing where it runs.
//!
//! ```text
//! cargo run -p switchboard-cluster --example local_cluster
//! ```

use serde_json::Value;
use switchboard::prelude::*;
use switchboard::testing::{Reply, ScriptedLlm};
use switchboard::SessionBuilder;
use switchboard_cluster::local::NatsServer;
use switchboard_cluster::{
    FactoryError, Gateway, GatewayOptions, RemoteEventKind, SessionFactory, SessionSpec, Worker,
    WorkerOptions,
};

/// The code the worker runs: one agent, on a scripted model.
struct Barista;

impl SessionFactory for Barista {
    fn builder(&self, _spec: &SessionSpec) -> Result<SessionBuilder, FactoryError> {
        let llm = ScriptedLlm::new([]);
        llm.otherwise(Reply::text("One tea, coming up."));
        Ok(Session::builder().llm(llm))
    }

    fn agent(&self, name: &str, _data: &Value) -> Result<Agent, FactoryError> {
        match name {
            "barista" => Ok(Agent::builder("barista")
                .instructions("Take orders.")
                .build()?),
            _ => Err(FactoryError::UnknownAgent {
                name: name.to_owned(),
                known: vec!["barista".to_owned()],
            }),
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = NatsServer::start()?; // loopback, JetStream, a user with a random password
    println!("nats-server at {}", server.url());

    let worker = Worker::start(
        server.connect().name("worker-1").connect().await?,
        Engine::start()?,
        Barista,
        WorkerOptions::new("worker-1").capacity(10),
    )
    .await?;

    let gateway = Gateway::new(
        server.connect().name("front").connect().await?,
        GatewayOptions::new(),
    );
    let session = gateway.start_session(SessionSpec::new("barista")).await?;
    let mut events = session.subscribe_from(1);
    let turn = session.run("a tea please").await?;
    println!(
        "agent> {}",
        turn.assistant_messages().collect::<Vec<_>>().join(" ")
    );
    let history = session.close().await?;
    println!(
        "transcript: user {:?}, agent {:?}",
        history.user_messages(),
        history.assistant_messages()
    );
    while let Ok(event) = events.recv().await {
        let last = matches!(event.kind, RemoteEventKind::SessionEnded { .. });
        println!(
            "event {:>2} (epoch {}): {:?}",
            event.seq, event.epoch, event.kind
        );
        if last {
            break;
        }
    }
    let report = worker.drain(std::time::Duration::from_secs(1)).await?;
    println!(
        "worker drained ({} sessions live at the drain)",
        report.sessions
    );
    Ok(())
}
