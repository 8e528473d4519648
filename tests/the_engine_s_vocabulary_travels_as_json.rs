//! The engine's results, histories, states, events and errors are serde: what a session on
//! another machine sends reads back as the same value (the cluster sends them instead of
//! copies of its own). Each is taken from a real session where one can make it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use std::sync::{Arc, Mutex};
use switchboard::prelude::*;
use switchboard::snapshot::SnapshotError;
use switchboard::testing::{Reply, ScriptedLlm};

use switchboard::{
    AgentState, AgentWork, EngineError, LlmError, LlmMetrics, SpeechControl, SpeechId,
    TimeoutStage, UserState,
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
        // Every event reads back as what it was.
        let back: SessionEvent = round_trip(&event);
        assert_eq!(serde_json::to_value(&back).unwrap(), json);
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

/// A speech's handle read back alone names the speech and is linked to nothing: nothing
/// will say how it ends, so waiting for its playout answers at once.
#[tokio::test]
async fn a_speech_read_back_alone_is_linked_to_nothing() {
    let handle: SpeechHandle =
        serde_json::from_value(serde_json::json!({"id": 3, "allow_interruptions": false})).unwrap();
    assert_eq!(serde_json::to_value(handle.id()).unwrap(), 3);
    assert!(!handle.allow_interruptions());
    assert!(matches!(
        handle.interrupt(),
        Err(SessionError::Uninterruptible)
    ));
    let outcome = tokio::time::timeout(Duration::from_secs(5), handle.wait_for_playout())
        .await
        .expect("nothing to wait for");
    assert_eq!(outcome, SpeechOutcome::Interrupted { heard: None });
}

/// What a remote speech's control was asked.
#[derive(Default)]
struct Asked(Mutex<Vec<(SpeechId, bool)>>);

impl SpeechControl for Asked {
    fn interrupt(&self, speech: SpeechId, force: bool) {
        self.0.lock().unwrap().push((speech, force));
    }
}

/// A handle linked to a session elsewhere sends its interruptions to its control and
/// learns the speech's end from its report; a dropped report ends it as interrupted.
#[tokio::test]
async fn a_remote_speech_s_handle_is_linked_through_its_control_and_report() {
    let speech: SpeechId = serde_json::from_value(serde_json::json!(7)).unwrap();
    let asked = Arc::new(Asked::default());
    let (handle, report) = SpeechHandle::remote(speech, true, asked.clone());
    handle.interrupt().unwrap();
    handle.force_interrupt();
    assert_eq!(*asked.0.lock().unwrap(), [(speech, false), (speech, true)]);
    assert_eq!(handle.outcome(), None, "not ended until the report says");
    let waiting = tokio::spawn({
        let handle = handle.clone();
        async move { handle.wait_for_playout().await }
    });
    report.ended(SpeechOutcome::Played);
    let outcome = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the report ends the wait")
        .unwrap();
    assert_eq!(outcome, SpeechOutcome::Played);
    handle.interrupt().unwrap();
    assert_eq!(
        asked.0.lock().unwrap().len(),
        2,
        "an ended speech asks nothing more"
    );

    let (other, report) = SpeechHandle::remote(speech, true, asked);
    drop(report);
    assert_eq!(
        other.wait_for_playout().await,
        SpeechOutcome::Interrupted { heard: None },
        "its session is gone"
    );
}
