//! The protocol's delivery rules, from a raw WebSocket client that plays a worker which
//! misbehaves as networks make it: it loses its connection, forgets to acknowledge, resends
//! what was applied, reconnects late or to a call that is gone.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{start_bridge, Harness, TOKEN};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use switchboard::{ChatItem, ChatRole};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Connects and says hello; returns the socket and the bridge's answer.
async fn hello(harness: &Harness, session: &str, last_output: u64) -> (Ws, Value) {
    let (mut ws, _) = tokio_tungstenite::connect_async(harness.url.as_str())
        .await
        .expect("connect");
    let hello = json!({"type": "hello", "protocol": 1, "token": TOKEN, "session": session,
                       "last_output": last_output});
    ws.send(Message::text(hello.to_string())).await.unwrap();
    let answer = next(&mut ws).await;
    (ws, answer)
}

async fn next(ws: &mut Ws) -> Value {
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("a frame within 10 s")
            .expect("the connection is open")
            .expect("a frame");
        if let Message::Text(text) = msg {
            return serde_json::from_str(&text).unwrap();
        }
    }
}

async fn input(ws: &mut Ws, id: u64, input: Value) {
    let frame = json!({"type": "input", "id": id, "input": input});
    ws.send(Message::text(frame.to_string())).await.unwrap();
}

/// Reads outputs until one of `kind`, answering each finished speech with a playout report
/// (numbered from `next_input`, which it advances). Returns every output frame read.
async fn outputs_until(ws: &mut Ws, kind: &str, next_input: &mut u64) -> Vec<Value> {
    let mut seen = Vec::new();
    loop {
        let frame = next(ws).await;
        if frame["type"] != "output" {
            continue;
        }
        seen.push(frame.clone());
        let output = &frame["output"];
        if output["kind"] == "speech_finished" {
            let report = json!({"kind": "playout_finished", "speech": output["speech"], "interrupted": false});
            input(ws, *next_input, report).await;
            *next_input += 1;
        }
        if output["kind"] == kind {
            return seen;
        }
    }
}

fn user_messages(history: &switchboard::SessionHistory) -> Vec<String> {
    history
        .chat_of("concierge")
        .unwrap()
        .items()
        .iter()
        .filter_map(|i| match i {
            ChatItem::Message(m) if m.role == ChatRole::User => Some(m.content.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_reconnect_outputs_come_again_and_inputs_apply_once() {
    let harness = start_bridge(|o| o).await;
    let (mut ws, welcome) = hello(&harness, "p-1", 0).await;
    assert_eq!(
        welcome,
        json!({"type": "welcome", "session": "p-1", "resumed": false, "last_input": 0})
    );
    let mut next_input = 1;
    let greeting = outputs_until(&mut ws, "speech_finished", &mut next_input).await;
    input(
        &mut ws,
        next_input,
        json!({"kind": "user_text", "text": "What time do you open?"}),
    )
    .await;
    let typed = next_input;
    next_input += 1;
    let turn = outputs_until(&mut ws, "turn_done", &mut next_input).await;
    assert_eq!(turn.last().unwrap()["output"]["input"], typed);
    // Nothing was acknowledged; the connection breaks.
    drop(ws);

    // The worker applied nothing (say): every output comes again, with the same numbers.
    let (mut ws, welcome) = hello(&harness, "p-1", 0).await;
    assert_eq!(welcome["resumed"], true);
    let applied = next_input - 1;
    assert_eq!(
        welcome["last_input"], applied,
        "every input sent was applied: {welcome}"
    );
    let mut again = Vec::new();
    for _ in 0..greeting.len() + turn.len() {
        again.push(next(&mut ws).await);
    }
    let before: Vec<Value> = greeting.into_iter().chain(turn).collect();
    assert_eq!(again, before);

    // The worker resends the typed turn (it never saw its acknowledgement): applied once.
    input(
        &mut ws,
        typed,
        json!({"kind": "user_text", "text": "What time do you open?"}),
    )
    .await;
    let ack = next(&mut ws).await;
    assert_eq!(ack, json!({"type": "ack", "upto": applied}));
    input(
        &mut ws,
        next_input,
        json!({"kind": "user_text", "text": "And on Sundays?"}),
    )
    .await;
    let sundays = next_input;
    next_input += 1;
    let turn = outputs_until(&mut ws, "turn_done", &mut next_input).await;
    assert_eq!(turn.last().unwrap()["output"]["input"], sundays);
    let history = harness.session("p-1").history().await;
    assert_eq!(
        user_messages(&history),
        ["What time do you open?", "And on Sundays?"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_input_past_the_next_drops_the_connection_and_is_not_applied() {
    let harness = start_bridge(|o| o).await;
    let (mut ws, _) = hello(&harness, "p-2", 0).await;
    input(
        &mut ws,
        2,
        json!({"kind": "user_text", "text": "What time do you open?"}),
    )
    .await;
    // The bridge drops the connection rather than apply input 2 without input 1.
    loop {
        match tokio::time::timeout(Duration::from_secs(10), ws.next()).await {
            Ok(Some(Ok(Message::Close(_)))) | Ok(None) | Ok(Some(Err(_))) => break,
            Ok(Some(Ok(_))) => continue,
            Err(_) => panic!("the connection stayed open"),
        }
    }
    let (_ws, welcome) = hello(&harness, "p-2", 0).await;
    assert_eq!(welcome["last_input"], 0, "{welcome}");
    let history = harness.session("p-2").history().await;
    assert!(user_messages(&history).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_left_alone_past_its_resume_window_closes() {
    let harness = start_bridge(|mut o| {
        o.resume_window = Duration::from_millis(300);
        o
    })
    .await;
    let (mut ws, _) = hello(&harness, "p-3", 0).await;
    let mut next_input = 1;
    outputs_until(&mut ws, "speech_finished", &mut next_input).await;
    drop(ws);
    let session = harness.session("p-3");
    tokio::time::timeout(Duration::from_secs(10), async {
        while session.run("anyone?").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the session closed after the resume window");
    let (_ws, answer) = hello(&harness, "p-3", 3).await;
    assert_eq!(answer["type"], "refused", "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hangup_closes_the_session_and_says_the_call_ended() {
    let harness = start_bridge(|o| o).await;
    let (mut ws, _) = hello(&harness, "p-4", 0).await;
    let mut next_input = 1;
    outputs_until(&mut ws, "speech_finished", &mut next_input).await;
    input(
        &mut ws,
        next_input,
        json!({"kind": "hangup", "reason": "caller left"}),
    )
    .await;
    next_input += 1;
    let end = outputs_until(&mut ws, "ended", &mut next_input).await;
    assert_eq!(end.last().unwrap()["output"]["reason"], "caller left");
    assert!(harness.session("p-4").run("hello?").await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_of_an_unknown_call_is_refused() {
    let harness = start_bridge(|o| o).await;
    let (_ws, answer) = hello(&harness, "never-started", 7).await;
    assert_eq!(answer["type"], "refused", "{answer}");
    assert!(harness.sessions.lock().unwrap().is_empty());
}
