//! Issue 39, SPEC §19 "turns can start early": with preemptive generation the model starts
//! at a final transcript, while the endpointing delay still waits for more words. A turn
//! confirmed with the same words takes the request over and saves the model's latency; a
//! user who goes on drops it, and nothing of it reaches the chat, the events' items or the
//! output — only the usage ledger counts it. At most three tries per user turn. Paused
//! time throughout; the model answers after a fixed pause.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use switchboard::futures::StreamExt as _;
use switchboard::prelude::*;
use switchboard::testing::{event, RecordingOutput};
use switchboard::{
    Endpointing, Llm, LlmChunk, LlmRequest, LlmStream, LlmUsage, PreemptiveGeneration,
    TurnHandling, TurnLatency, TurnMetrics,
};
use tokio::time::sleep;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A model that answers "You said: <the user's last words>" after a pause, with usage.
struct Paced {
    pause: Duration,
    requests: Mutex<Vec<LlmRequest>>,
}

impl Paced {
    fn new(pause: Duration) -> Arc<Self> {
        Arc::new(Self {
            pause,
            requests: Mutex::new(Vec::new()),
        })
    }

    fn requests(&self) -> Vec<LlmRequest> {
        self.requests.lock().unwrap().clone()
    }
}

fn last_user(request: &LlmRequest) -> String {
    request
        .chat
        .items()
        .iter()
        .rev()
        .find_map(|item| match item {
            ChatItem::Message(m) if m.role == ChatRole::User => Some(m.content.clone()),
            _ => None,
        })
        .unwrap_or_default()
}

impl Llm for Paced {
    fn chat(&self, request: LlmRequest) -> LlmStream {
        let answer = format!("You said: {}", last_user(&request));
        self.requests.lock().unwrap().push(request);
        let chunks = vec![
            Ok(LlmChunk::Text(answer)),
            Ok(LlmChunk::Usage(LlmUsage {
                prompt_tokens: 100,
                completion_tokens: 10,
                ..LlmUsage::default()
            })),
        ];
        switchboard::futures::stream::once(sleep(self.pause))
            .flat_map(move |()| switchboard::futures::stream::iter(chunks.clone()))
            .boxed()
    }

    fn name(&self) -> &str {
        "paced"
    }
}

async fn start(
    llm: Arc<Paced>,
    out: &RecordingOutput,
    preemptive: PreemptiveGeneration,
) -> Session {
    Session::builder()
        .llm(llm)
        .agent(Agent::builder("host").build().unwrap())
        .output(out.clone())
        .turn_handling(
            TurnHandling::new()
                .endpointing(Endpointing::fixed(ms(500)))
                .preemptive_generation(preemptive),
        )
        .start(&Engine::current().unwrap())
        .await
        .unwrap()
}

async fn turn_metrics(events: &mut tokio::sync::broadcast::Receiver<SessionEvent>) -> TurnMetrics {
    common::wait_event(events, |e| match e {
        SessionEvent::TurnMetrics(metrics) => Some(metrics.clone()),
        _ => None,
    })
    .await
}

/// Within a few milliseconds above (tokio's timer rounds each pause up to its next tick).
fn about(actual: Option<Duration>, expected: Duration) -> bool {
    actual.is_some_and(|a| a >= expected && a <= expected + ms(5))
}

async fn one_turn(preemptive: PreemptiveGeneration) -> (TurnLatency, usize) {
    let llm = Paced::new(ms(300));
    let out = RecordingOutput::new();
    let session = start(llm.clone(), &out, preemptive).await;
    let mut events = session.subscribe();
    session.transcript("a table for two", true);
    let metrics = turn_metrics(&mut events).await;
    assert_eq!(metrics.agent, "host");
    common::settled(&session).await;
    assert_eq!(out.last_speech().unwrap().text, "You said: a table for two");
    session.close().await.unwrap();
    (metrics.latency, llm.requests().len())
}

#[actix::test]
async fn preemptive_generation_saves_the_models_latency_on_a_confirmed_turn() {
    tokio::time::pause();
    // Without it: the 0.5 s endpointing delay, then the model's 0.3 s.
    let (latency, requests) = one_turn(PreemptiveGeneration::off()).await;
    assert!(about(latency.end_to_first_audio, ms(800)), "{latency:?}");
    assert!(!latency.preemptive);
    assert_eq!(requests, 1);
    // With it: the model ran during the delay; its answer goes out as the turn starts.
    let (latency, requests) = one_turn(PreemptiveGeneration::on()).await;
    assert!(about(latency.end_to_first_audio, ms(500)), "{latency:?}");
    assert!(latency.preemptive);
    assert!(about(latency.time_to_first_token, ms(300)), "{latency:?}");
    assert_eq!(requests, 1, "the preemptive request was the turn's request");
}

#[actix::test]
async fn a_preemptive_request_the_user_went_past_leaves_nothing_behind_but_its_cost() {
    tokio::time::pause();
    let llm = Paced::new(ms(100));
    let out = RecordingOutput::new();
    let session = start(llm.clone(), &out, PreemptiveGeneration::on()).await;
    let mut events = session.subscribe();
    session.transcript("a table", true);
    // The first request has answered ("You said: a table"), held, unsaid.
    sleep(ms(300)).await;
    assert!(out.speeches().is_empty(), "nothing is said before the turn");
    session.transcript("for two", true);
    let metrics = turn_metrics(&mut events).await;
    assert!(
        metrics.latency.preemptive,
        "the second request was taken over"
    );
    common::settled(&session).await;

    let asked: Vec<String> = llm.requests().iter().map(last_user).collect();
    assert_eq!(asked, ["a table", "a table for two"]);
    let chat = session.chat_context().await.unwrap();
    assert_eq!(
        common::said(&chat),
        [
            (ChatRole::User, "a table for two".to_owned()),
            (ChatRole::Assistant, "You said: a table for two".to_owned()),
        ]
    );
    let spoken: Vec<String> = out.speeches().into_iter().map(|s| s.text).collect();
    assert_eq!(spoken, ["You said: a table for two"]);
    // No event carried the dropped answer as an item of the chat.
    while let Ok(event) = events.try_recv() {
        if let SessionEvent::ConversationItemAdded { item, .. } = &event {
            assert_ne!(item.text(), Some("You said: a table"), "{event:?}");
        }
    }
    let usage = session.usage().total();
    assert_eq!(usage.requests, 2);
    assert_eq!(usage.discarded_preemptive, 1);
    assert_eq!(
        usage.prompt_tokens, 200,
        "the dropped request's tokens count too"
    );
    session.close().await.unwrap();
}

#[actix::test]
async fn a_hook_that_changes_the_chat_makes_the_turn_ask_again() {
    tokio::time::pause();
    let llm = Paced::new(ms(100));
    let out = RecordingOutput::new();
    let agent = Agent::builder("host")
        .on_user_turn_completed(|chat, _message| {
            chat.push(ChatItem::message(
                ChatRole::System,
                "The caller is a member.",
            ));
            TurnDecision::Reply
        })
        .build()
        .unwrap();
    let session = Session::builder()
        .llm(llm.clone())
        .agent(agent)
        .output(out.clone())
        .turn_handling(TurnHandling::new().preemptive_generation(PreemptiveGeneration::on()))
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.transcript("a table", true);
    common::settled(&session).await;
    let requests = llm.requests();
    assert_eq!(
        requests.len(),
        2,
        "the preemptive request did not see the hook's item"
    );
    assert!(requests[1]
        .chat
        .items()
        .iter()
        .any(|i| i.text() == Some("The caller is a member.")));
    assert_eq!(session.usage().total().discarded_preemptive, 1);
    session.close().await.unwrap();
}

#[actix::test]
async fn at_most_three_preemptive_requests_per_user_turn() {
    tokio::time::pause();
    let llm = Paced::new(ms(2000));
    let out = RecordingOutput::new();
    let session = start(llm.clone(), &out, PreemptiveGeneration::on()).await;
    let mut events = session.subscribe();
    for word in ["one", "two", "three", "four", "five"] {
        session.transcript(word, true);
        sleep(ms(100)).await;
    }
    common::wait_on(&mut events, event::speech_created()).await;
    common::settled(&session).await;
    let asked: Vec<String> = llm.requests().iter().map(last_user).collect();
    assert_eq!(
        asked,
        ["one", "one two", "one two three", "one two three four five"],
        "three tries; the fourth and fifth finals only dropped the stale one"
    );
    let usage = session.usage().total();
    assert_eq!(usage.requests, 4);
    assert_eq!(usage.discarded_preemptive, 3);
    session.close().await.unwrap();
}
