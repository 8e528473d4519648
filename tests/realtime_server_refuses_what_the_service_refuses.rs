//! The simulated OpenAI Realtime server (behind `ScriptedRealtime` and `RealtimeServer`)
//! refuses what the real service refuses: a client that breaks the protocol's rules gets
//! the service's error, and the report counts each break. The realtime scenarios' "no
//! violation" means something only because of this.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::poll_fn;
use std::time::Duration;

use serde_json::json;
use switchboard::realtime::{
    ClientEvent, Place, RealtimeConnection, RealtimeSettings, RemoteItem, ServerEvent,
    SessionUpdate,
};
use switchboard::testing::{RealtimeReply, RealtimeScript, ScriptedRealtime};
use switchboard::ToolChoice;

/// A client that speaks the protocol by hand, one event at a time.
struct Client(Box<dyn RealtimeConnection>);

impl Client {
    async fn connect(model: &ScriptedRealtime) -> Self {
        let mut settings = RealtimeSettings::new();
        // No voice detector: the client alone decides when responses are asked.
        settings.turn_detection = None;
        let mut client = Self(model.shared().connect().await.unwrap());
        client.send(ClientEvent::UpdateSession(SessionUpdate {
            instructions: Some("Be brief.".into()),
            tools: None,
            voice: None,
            settings: Some(settings),
        }));
        client
            .until("session.updated", |e| {
                matches!(e, ServerEvent::SessionUpdated).then_some(())
            })
            .await;
        client
    }

    fn send(&mut self, event: ClientEvent) {
        self.0.send(event);
    }

    fn create_response(&mut self, tag: u64) {
        self.send(ClientEvent::CreateResponse {
            tag,
            instructions: None,
            tool_choice: ToolChoice::Auto,
        });
    }

    /// Sends what is queued and reads the server's events until `pick` takes one, within
    /// five seconds of virtual time.
    async fn until<T>(&mut self, what: &str, mut pick: impl FnMut(ServerEvent) -> Option<T>) -> T {
        let connection = &mut self.0;
        let read = async {
            poll_fn(|cx| connection.poll_flush(cx)).await.unwrap();
            loop {
                let event = poll_fn(|cx| connection.poll_next(cx))
                    .await
                    .unwrap_or_else(|| panic!("closed while waiting for {what}"))
                    .unwrap();
                if let Some(picked) = pick(event) {
                    return picked;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(5), read)
            .await
            .unwrap_or_else(|_| panic!("no {what} within 5 s"))
    }

    async fn error(&mut self, what: &str) -> String {
        self.until(what, |e| match e {
            ServerEvent::Error { code, .. } => Some(code.unwrap_or_default()),
            _ => None,
        })
        .await
    }

    async fn response_done(&mut self) {
        self.until("response.done", |e| {
            matches!(e, ServerEvent::ResponseDone { .. }).then_some(())
        })
        .await;
    }
}

#[switchboard::test]
async fn a_client_that_breaks_the_rules_gets_the_services_errors_and_each_is_counted() {
    tokio::time::pause();
    let model = ScriptedRealtime::new(RealtimeScript::new([
        RealtimeReply::speech("One two three four five six seven eight nine ten.")
            .chunks(10)
            .paced(Duration::from_millis(20)),
        RealtimeReply::call("get_weather", json!({"city": "Paris"})),
        RealtimeReply::speech("Sunny."),
    ]));
    let mut client = Client::connect(&model).await;

    // A second response while the first one streams.
    client.create_response(1);
    client.create_response(2);
    let mut answer = None;
    let mut received = 0;
    let code = client
        .until("an error", |e| match e {
            ServerEvent::AudioDelta { item_id, audio } => {
                answer = Some(item_id);
                received += audio.len();
                None
            }
            ServerEvent::Error { code, .. } => Some(code.unwrap_or_default()),
            _ => None,
        })
        .await;
    assert_eq!(code, "conversation_already_has_active_response");
    client
        .until("response.done", |e| match e {
            ServerEvent::AudioDelta { item_id, audio } => {
                answer = Some(item_id);
                received += audio.len();
                None
            }
            ServerEvent::ResponseDone { .. } => Some(()),
            _ => None,
        })
        .await;
    let answer = answer.expect("the answer's audio");
    let sent_ms = (received / 48) as u32;
    assert_eq!(sent_ms, 200, "ten chunks of 20 ms");

    // A truncate past the audio the server sent.
    client.send(ClientEvent::TruncateItem {
        id: answer.clone(),
        audio_end_ms: sent_ms + 85,
    });
    assert_eq!(client.error("the truncate refused").await, "invalid_value");

    // An output for a call that is in no conversation item.
    client.send(ClientEvent::CreateItem {
        id: "item_client_1".to_owned(),
        previous: Place::End,
        item: RemoteItem::FunctionCallOutput {
            call_id: "call_nobody_made".to_owned(),
            output: "sunny".to_owned(),
        },
    });
    assert_eq!(
        client.error("the output refused").await,
        "invalid_tool_call_id"
    );

    // A response asked before the previous response's call has its output: the service
    // answers anyway, without the result (the caller never hears it); counted.
    client.create_response(3);
    client.response_done().await;
    client.create_response(4);
    client.response_done().await;

    // A truncate within the audio sent is accepted: the checks refuse only what breaks.
    client.send(ClientEvent::TruncateItem {
        id: answer.clone(),
        audio_end_ms: sent_ms - 50,
    });
    let cut = client
        .until("conversation.item.truncated", |e| match e {
            ServerEvent::ItemTruncated { audio_end_ms, .. } => Some(audio_end_ms),
            ServerEvent::Error { message, .. } => panic!("refused: {message}"),
            _ => None,
        })
        .await;
    assert_eq!(cut, sent_ms - 50);

    let report = model.report();
    let counted: Vec<(&str, u32)> = report
        .violations
        .iter()
        .map(|(kind, n)| (kind.as_str(), *n))
        .collect();
    assert_eq!(
        counted,
        [
            ("function_call_output_unknown_call_id", 1),
            ("response_create_while_active", 1),
            ("response_create_with_pending_function_calls", 1),
            ("truncate_beyond_sent_audio", 1),
        ]
    );
}
