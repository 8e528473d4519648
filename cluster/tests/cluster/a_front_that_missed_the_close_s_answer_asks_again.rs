//! Core NATS delivers at most once: a front can miss a message of a session's events (its
//! connection dropped, say), and asks the owner for them again (a replay). A close's answer
//! is the whole history, 300 KiB here, sent in parts; the owner's replay budget (64 KiB by
//! default) keeps far less, and an owner that left at its end could answer nothing. So an
//! ended session's owner keeps its last words whole and still answers replays for a while:
//! a front that missed any of them asks, on the wire as the protocol page says, and gets
//! the close's answer and `session_closed`.

use crate::common;

use std::time::Duration;

use common::{within, WorkerProcess};
use serde_json::{json, Value};
use switchboard_cluster::local::NatsServer;
use switchboard_cluster::{GatewayOptions, Namespace, SessionSpec};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_front_that_missed_the_close_s_answer_asks_again_and_gets_it_whole() {
    let _one_at_a_time = common::one_at_a_time().await;
    let server = NatsServer::start().unwrap();
    let _worker = WorkerProcess::start(&server, "w1", 2, &[]);
    let gateway = common::gateway(&server, GatewayOptions::new()).await;
    let front = common::client(&server, "front").await;

    let session = gateway
        .start_session(SessionSpec::new("greeter"))
        .await
        .unwrap();
    let note = format!("note \"{}\"", "é\\x".repeat(75 * 1024));
    within("a long note", session.run(note.clone()))
        .await
        .unwrap();
    let inputs = Namespace::default().session_inputs(session.id());

    // The front closes the session itself, on the wire, and hears none of its events: all
    // it gets is its input's reply. (The id it must use, the owner says.)
    let ask = |request: Value| {
        let front = front.nats().clone();
        let inputs = inputs.clone();
        async move {
            let reply = within(
                &format!("the owner's reply to {request}"),
                front.request(inputs, serde_json::to_vec(&request).unwrap().into()),
            )
            .await
            .unwrap_or_else(|err| panic!("{request}: {err}"));
            serde_json::from_slice::<Value>(&reply.payload).unwrap()
        }
    };
    let reply = ask(json!({"request": "input", "id": 1000, "input": {"input": "close"}})).await;
    assert_eq!(reply["reply"], "out_of_order", "{reply}");
    let close = reply["expected"].as_u64().unwrap();
    let reply = ask(json!({"request": "input", "id": close, "input": {"input": "close"}})).await;
    assert_eq!(
        (reply["reply"].as_str(), reply["answer"]["answer"].as_str()),
        (Some("applied"), Some("pending")),
        "{reply}"
    );

    // It asks for everything the owner still has, until the end is among it: the close's
    // answer comes whole, its parts joined, then `session_closed`.
    let heard = within("the close's answer and the end, replayed", async {
        loop {
            let events = replay_all(&ask).await;
            if events
                .iter()
                .any(|e| e["event"]["type"] == "session_closed")
            {
                return events;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let answer = heard
        .iter()
        .find(|e| e["input_done"]["input"].as_u64() == Some(close))
        .unwrap_or_else(|| panic!("no answer to the close among {} events", heard.len()));
    let said: Vec<&str> = answer["input_done"]["outcome"]["history"]["agents"][0]["chat"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|item| item["role"] == "user")
        .filter_map(|item| item["content"].as_str())
        .collect();
    assert_eq!(said, [note.as_str()], "the close's answer, whole");
    let at = |pred: &dyn Fn(&Value) -> bool| heard.iter().position(pred);
    assert!(
        at(&|e| e["input_done"]["input"].as_u64() == Some(close))
            < at(&|e| e["event"]["type"] == "session_closed"),
        "the answer, then the end"
    );
}

/// Every event the owner still has, from its first on, in as many replays as it takes;
/// the parts of a big event joined into it, and a run of parts whose first ones the budget
/// dropped left out.
async fn replay_all<F, Fut>(ask: &F) -> Vec<Value>
where
    F: Fn(Value) -> Fut,
    Fut: std::future::Future<Output = Value>,
{
    let mut events = Vec::new();
    let mut joined: Option<String> = None;
    // The owner's epoch is not known yet: asked in an older one, it sends from its first.
    let (mut from, mut epoch) = (1, 0);
    loop {
        let reply = ask(json!({"request": "replay", "from": from, "epoch": epoch})).await;
        assert_eq!(reply["reply"], "replay", "{reply}");
        let elements = reply["events"].as_array().unwrap();
        for element in elements {
            from = element["seq"].as_u64().unwrap() + 1;
            epoch = element["epoch"].as_u64().unwrap();
            let Some(part) = element.get("part") else {
                joined = None;
                events.push(element["kind"].clone());
                continue;
            };
            if part["index"] == 0 {
                joined = Some(String::new());
            }
            if let Some(text) = joined.as_mut() {
                text.push_str(part["text"].as_str().unwrap());
                if part["index"].as_u64().unwrap() + 1 == part["count"].as_u64().unwrap() {
                    let text = joined.take().unwrap_or_default();
                    events.push(serde_json::from_str(&text).unwrap());
                }
            }
        }
        if reply["complete"] == true || elements.is_empty() {
            return events;
        }
    }
}
