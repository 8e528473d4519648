//! Realtime agents end to end against the scripted realtime model: the simulated OpenAI
//! Realtime server in memory, which refuses what the service refuses, under paused time.
//! The scenarios (`realtime_scenarios/`) also run over a loopback WebSocket with the real
//! provider (`realtime_over_a_websocket.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use switchboard::realtime::{RealtimeModel, RealtimeSettings};
use switchboard::testing::{RealtimeScript, ScriptedRealtime, SimReport};

mod common;
#[macro_use]
mod realtime_scenarios;
use realtime_scenarios as scenarios;

struct Scripted(ScriptedRealtime);

impl scenarios::Backend for Scripted {
    fn start_with_settings(script: RealtimeScript, settings: RealtimeSettings) -> Self {
        Self(ScriptedRealtime::new(script).with_settings(settings))
    }

    fn model(&self) -> Arc<dyn RealtimeModel> {
        self.0.shared()
    }

    fn report(&self) -> SimReport {
        self.0.report()
    }
}

every_scenario_against!(Scripted, pause_time: true);

/// A connection that hands over a whole response at once, as a socket whose buffer holds
/// many events does: readable once, then every event without a new wake.
mod burst {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Poll, Waker};

    use switchboard::futures::future::{BoxFuture, FutureExt};
    use switchboard::realtime::{
        ClientEvent, OutputKind, RealtimeCapabilities, RealtimeConnection, RealtimeError,
        RealtimeModel, RealtimeSettings, ResponseStatus, ServerEvent,
    };

    pub(crate) struct Burst {
        settings: RealtimeSettings,
        chunks: usize,
    }

    impl Burst {
        pub(crate) fn new(chunks: usize) -> Self {
            Self {
                settings: RealtimeSettings::new(),
                chunks,
            }
        }
    }

    impl RealtimeModel for Burst {
        fn name(&self) -> &str {
            "burst"
        }
        fn capabilities(&self) -> RealtimeCapabilities {
            RealtimeCapabilities::OPENAI
        }
        fn settings(&self) -> &RealtimeSettings {
            &self.settings
        }
        fn connect(
            &self,
        ) -> BoxFuture<'static, Result<Box<dyn RealtimeConnection>, RealtimeError>> {
            let chunks = self.chunks;
            async move {
                Ok(Box::new(Conn {
                    chunks,
                    ready: Arc::new(Mutex::new((VecDeque::new(), None))),
                }) as Box<dyn RealtimeConnection>)
            }
            .boxed()
        }
    }

    type Ready = Arc<Mutex<(VecDeque<ServerEvent>, Option<Waker>)>>;

    struct Conn {
        chunks: usize,
        ready: Ready,
    }

    impl RealtimeConnection for Conn {
        fn send(&mut self, event: ClientEvent) {
            let ClientEvent::CreateResponse { tag, .. } = event else {
                return;
            };
            let mut ready = self.ready.lock().unwrap();
            let response = format!("resp_{tag}");
            ready.0.push_back(ServerEvent::ResponseCreated {
                response_id: response.clone(),
                tag: Some(tag),
            });
            ready.0.push_back(ServerEvent::OutputItemAdded {
                response_id: response.clone(),
                item_id: format!("item_{tag}"),
                kind: OutputKind::Message,
            });
            ready.0.push_back(ServerEvent::TextDelta {
                item_id: format!("item_{tag}"),
                delta: "A long answer.".to_owned(),
            });
            for _ in 0..self.chunks {
                ready.0.push_back(ServerEvent::AudioDelta {
                    item_id: format!("item_{tag}"),
                    audio: vec![0; 960],
                });
            }
            ready.0.push_back(ServerEvent::ResponseDone {
                response_id: response,
                status: ResponseStatus::Completed,
                usage: None,
            });
            // One readiness edge for the whole burst.
            if let Some(waker) = ready.1.take() {
                waker.wake();
            }
        }

        fn poll_flush(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), RealtimeError>> {
            Poll::Ready(Ok(()))
        }

        fn poll_next(
            &mut self,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<ServerEvent, RealtimeError>>> {
            let mut ready = self.ready.lock().unwrap();
            match ready.0.pop_front() {
                Some(event) => Poll::Ready(Some(Ok(event))),
                None => {
                    ready.1 = Some(cx.waker().clone());
                    Poll::Pending
                }
            }
        }
    }
}

#[switchboard::test]
async fn a_burst_the_connection_holds_at_once_is_read_to_its_end() {
    use switchboard::prelude::*;
    use switchboard::testing::RecordingOutput;
    tokio::time::pause();
    let output = RecordingOutput::new();
    let session = scenarios::start(
        Arc::new(burst::Burst::new(300)),
        Agent::builder("assistant").build().unwrap(),
        output.clone(),
    )
    .await;
    let result = session
        .run("hi")
        .await
        .expect("the answer, read to its end");
    assert!(!result.interrupted);
    assert_eq!(output.last_speech().unwrap().audio_bytes, 300 * 960);
    session.close().await.unwrap();
}

mod more {
    //! Scripted-only stories: a connection replaced at its age limit, a handoff to an agent
    //! of another model, a model that cannot be reached.
    use std::time::Duration;

    use serde_json::json;
    use switchboard::prelude::*;
    use switchboard::realtime::RealtimeSettings;
    use switchboard::testing::{
        event, EventWaiter, RealtimeReply, RealtimeScript, RecordingOutput, ScriptedRealtime,
    };

    use crate::realtime_scenarios::{assistant_said, speak, start, WAIT};

    #[switchboard::test]
    async fn a_connection_is_replaced_before_its_age_limit_and_the_call_goes_on() {
        tokio::time::pause();
        let mut settings = RealtimeSettings::new();
        settings.max_connection_age = Duration::from_secs(60);
        let model = ScriptedRealtime::new(
            RealtimeScript::new([
                RealtimeReply::speech("First answer."),
                RealtimeReply::speech("Second answer."),
            ])
            .user_transcript("hello"),
        )
        .with_settings(settings);
        let session = start(
            model.shared(),
            Agent::builder("assistant").build().unwrap(),
            RecordingOutput::new(),
        )
        .await;
        let mut events = EventWaiter::new(&session).with_timeout(WAIT);
        speak(&session);
        assert_eq!(assistant_said(&mut events).await, "First answer.");
        session.wait_for_settled().await.unwrap();
        // Past the age limit, at a quiet moment: a new connection, the call replayed.
        tokio::time::sleep(Duration::from_secs(61)).await;
        events
            .next(event::matching("the recycling", |e| match e {
                SessionEvent::RealtimeReconnecting { reason, .. } => Some(reason.clone()),
                _ => None,
            }))
            .await
            .unwrap();
        speak(&session);
        assert_eq!(assistant_said(&mut events).await, "Second answer.");
        session.wait_for_settled().await.unwrap();
        let report = model.report();
        assert_eq!(report.violations_total(), 0, "{:#?}", report.violations);
        assert_eq!(report.connections, 2);
        let second: Vec<_> = report.trace.iter().filter(|(c, _)| *c == 2).collect();
        let replayed: Vec<_> = second
            .iter()
            .filter(|(_, e)| e["type"] == "conversation.item.create")
            .map(|(_, e)| e["item"]["content"][0]["text"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(replayed, ["hello", "First answer."]);
        session.close().await.unwrap();
    }

    #[switchboard::test]
    async fn a_handoff_to_another_model_opens_its_own_connection() {
        tokio::time::pause();
        let front_model = ScriptedRealtime::new(RealtimeScript::new([RealtimeReply::call(
            "transfer",
            json!({}),
        )]));
        let expert_model =
            ScriptedRealtime::new(RealtimeScript::new([RealtimeReply::speech("Expert here.")]))
                .named("expert-model");
        let expert = Agent::builder("expert")
            .realtime(expert_model.shared())
            .on_enter(|ctx| async move {
                let _ = ctx.generate_reply("Introduce yourself.").await;
            })
            .build()
            .unwrap();
        let transfer = Tool::new(
            "transfer",
            "Transfers",
            move |_ctx: RunContext, _: NoArgs| {
                let expert = expert.clone();
                async move { Ok::<_, ToolFailure>(expert) }
            },
        );
        let session = start(
            front_model.shared(),
            Agent::builder("front").tool(transfer).build().unwrap(),
            RecordingOutput::new(),
        )
        .await;
        let mut events = EventWaiter::new(&session).with_timeout(WAIT);
        speak(&session);
        assert_eq!(assistant_said(&mut events).await, "Expert here.");
        session.wait_for_settled().await.unwrap();
        assert_eq!(front_model.report().connections, 1);
        assert_eq!(expert_model.report().connections, 1);
        assert_eq!(front_model.report().violations_total(), 0);
        assert_eq!(expert_model.report().violations_total(), 0);
        // The host's audio follows the current agent: the expert's model hears it now.
        speak(&session);
        events
            .next(event::user_state(UserState::Speaking))
            .await
            .unwrap();
        assert!(expert_model.report().audio_in_ms > 0);
        session.close().await.unwrap();
    }

    #[switchboard::test]
    async fn a_model_that_cannot_be_reached_fails_the_turn_not_the_session() {
        tokio::time::pause();
        let model = ScriptedRealtime::new(RealtimeScript::new([]));
        model.refuse_connections(10);
        let session = Session::builder()
            .realtime(model.shared())
            .agent(Agent::builder("assistant").build().unwrap())
            .start(&Engine::current().unwrap())
            .await
            .unwrap();
        let mut events = EventWaiter::new(&session).with_timeout(WAIT);
        let turn = session.run("hello").await;
        assert!(
            matches!(turn, Err(SessionError::TurnFailed { .. })),
            "{turn:?}"
        );
        let error = events.next(event::error()).await.unwrap();
        assert!(error.contains("is gone"), "{error}");
        // The session still answers.
        assert_eq!(session.current_agent().await.unwrap(), "assistant");
        session.close().await.unwrap();
    }
}
