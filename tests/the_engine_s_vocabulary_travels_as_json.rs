//! The engine's results, histories, states, events and errors are serde: what a session on
//! another machine sends reads back as the same value (the cluster sends them instead of
//! copies of its own). Each is taken from a real session where one can make it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use switchboard::prelude::*;
use switchboard::snapshot::SnapshotError;
use switchboard::testing::{Reply, ScriptedLlm};
use switchboard::{
    AgentState, AgentWork, EngineError, LlmError, LlmMetrics, TimeoutStage, UserState,
};

/// Serializes to JSON and back.
fn round_trip<T: Serialize + DeserializeOwned>(value: &T) -> T {
    let json = serde_json::to_string(value).unwrap();
    serde_json::from_str(&json).unwrap_or_else(|err| panic!("{json} does not read back: {err}"))
}

#[switchboard::test]
async fn results_histories_and_events_of_a_real_session_read_back_the_same() {
    tokio::time::pause();
    let llm = ScriptedLlm::new([
        Reply::tool_call("lookup", serde_json::json!({})),
        Reply::text("Found it."),
    ]);
    let lookup = Tool::new("lookup", "Looks up", |_ctx: RunContext, _: NoArgs| async {
        Ok::<_, ToolFailure>("a result")
    });
    let agent = Agent::builder("finder")
        .instructions("Find.")
        .tool(lookup)
        .build()
        .unwrap();
    let mut builder = Session::builder().llm(llm).agent(agent);
    let mut events = builder.subscribe();
    let session = builder.start(&Engine::current().unwrap()).await.unwrap();
    let turn = session.run("find it").await.unwrap();
    assert_eq!(turn.function_calls().count(), 1);
    assert_eq!(round_trip(&turn), turn);
    let history = session.close().await.unwrap();
    assert_eq!(round_trip(&history), history);

    let mut metrics = None;
    let mut kinds = Vec::new();
    while let Ok(event) = events.try_recv() {
        let json = serde_json::to_value(&event).unwrap();
        kinds.push(json["type"].as_str().unwrap().to_owned());
        if let SessionEvent::SpeechCreated { speech, .. } = &event {
            // A handle is a link into its engine: it travels as what names the speech.
            assert_eq!(
                json["speech"],
                serde_json::json!({"id": speech.id(), "allow_interruptions": speech.allow_interruptions()})
            );
        }
        if let SessionEvent::LlmMetrics(m) = event {
            metrics = Some(m);
        }
    }
    for kind in [
        "user_input_transcribed",
        "conversation_item_added",
        "function_tools_executed",
        "agent_state_changed",
        "speech_created",
        "llm_metrics",
        "closed",
    ] {
        assert!(kinds.iter().any(|k| k == kind), "no {kind} in {kinds:?}");
    }
    let metrics: LlmMetrics = metrics.expect("the turn's model requests were measured");
    assert_eq!(round_trip(&metrics), metrics);
}

#[test]
fn states_and_every_kind_of_error_read_back_the_same() {
    for state in [
        AgentState::Initializing,
        AgentState::Listening,
        AgentState::Thinking,
        AgentState::Speaking,
    ] {
        assert_eq!(round_trip(&state), state);
    }
    for state in [UserState::Speaking, UserState::Listening, UserState::Away] {
        assert_eq!(round_trip(&state), state);
    }
    assert_eq!(
        serde_json::to_string(&AgentState::Thinking).unwrap(),
        "\"thinking\""
    );

    let timeout = LlmError::Timeout {
        stage: TimeoutStage::FirstChunk,
        after: Duration::from_secs(10),
    };
    assert_eq!(round_trip(&timeout), timeout);
    let refused = SnapshotError::NewerSchema {
        found: 9,
        supported: 1,
    };
    assert_eq!(round_trip(&refused), refused);

    // Every error keeps its kind, its fields and its message.
    let errors = [
        SessionError::Closed,
        SessionError::WouldDeadlock {
            operation: "run".into(),
        },
        SessionError::Uninterruptible,
        SessionError::QueueFull { limit: 32 },
        SessionError::AgentWorkLimit {
            work: AgentWork::Handoff {
                to: "booker".into(),
            },
            limit: 8,
        },
        SessionError::Build(BuildError::NoLlm {
            agent: "booker".into(),
        }),
        SessionError::TurnFailed {
            failure: TurnFailure::Llm(timeout.clone()),
            result: Box::new(RunResult {
                events: vec![ChatItem::message(ChatRole::User, "hi")],
                interrupted: true,
                ..RunResult::default()
            }),
        },
        SessionError::Engine(EngineError::Spawn(std::io::Error::other("no threads left"))),
        SessionError::Snapshot(refused),
        SessionError::TaskResult(serde_json::from_str::<u32>("\"x\"").unwrap_err()),
        SessionError::TaskNotStarted,
    ];
    for err in errors {
        let back = round_trip(&err);
        assert_eq!(back.to_string(), err.to_string());
        assert_eq!(
            serde_json::to_value(&back).unwrap(),
            serde_json::to_value(&err).unwrap()
        );
    }
    let closed = serde_json::to_string(&SessionError::Closed).unwrap();
    assert_eq!(closed, "\"closed\"");
}
