//! SPEC §2a, §12 "Bounded, never silently lossy": what a runaway model can do is bounded.
//! A model stream whose chunks are always ready yields to other work every few chunks, so
//! another session on the same arbiter keeps running and an interruption lands between
//! chunks; one step's text stops at `max_reply_bytes` and fails the turn with
//! `TurnFailure::ReplyTooLong`; a huge tool name, call id or arguments string leaves a
//! small stand-in in the chat, so every later request stays small.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{assert_invariant, spawn_turn, wait_event};
use futures_util::{stream, StreamExt};
use switchboard::prelude::*;
use switchboard::testing::{RecordingOutput, Reply, ScriptedLlm};
use switchboard::{LlmChunk, LlmRequest, LlmStream, TurnFailure};

const BOUND: Duration = Duration::from_secs(30);

/// An in-process model whose first answer is `chunks` pieces of `piece`, each ready at
/// once (`stream::iter`, the docs' own idiom); it counts the pieces read. Later answers
/// are one short sentence. Records the size of each request's chat context.
struct Flood {
    chunks: usize,
    piece: &'static str,
    read: Arc<AtomicUsize>,
    flooded: AtomicBool,
    request_bytes: std::sync::Mutex<Vec<usize>>,
}

impl Flood {
    fn new(chunks: usize, piece: &'static str) -> Arc<Self> {
        Arc::new(Self {
            chunks,
            piece,
            read: Arc::default(),
            flooded: AtomicBool::new(false),
            request_bytes: Default::default(),
        })
    }

    fn read(&self) -> usize {
        self.read.load(Ordering::Relaxed)
    }
}

impl Llm for Flood {
    fn chat(&self, request: LlmRequest) -> LlmStream {
        self.request_bytes
            .lock()
            .unwrap()
            .push(chat_bytes(&request.chat));
        if self.flooded.swap(true, Ordering::Relaxed) {
            return stream::iter([Ok(LlmChunk::Text("Short answer.".into()))]).boxed();
        }
        let (read, piece) = (self.read.clone(), self.piece);
        stream::iter(0..self.chunks)
            .map(move |i| {
                read.store(i + 1, Ordering::Relaxed);
                Ok(LlmChunk::Text(piece.into()))
            })
            .boxed()
    }
}

/// How many bytes a chat context takes as JSON: what a provider request carries of it.
fn chat_bytes(chat: &ChatContext) -> usize {
    chat.items()
        .iter()
        .map(|item| serde_json::to_string(item).unwrap().len())
        .sum()
}

async fn start(llm: Arc<dyn Llm>, builder: SessionBuilder) -> Session {
    builder
        .llm(llm)
        .agent(Agent::builder("agent").build().unwrap())
        .start(&Engine::current().unwrap())
        .await
        .unwrap()
}

async fn speech_started(events: &mut tokio::sync::broadcast::Receiver<SessionEvent>) {
    wait_event(events, |e| {
        matches!(e, SessionEvent::SpeechCreated { .. }).then_some(())
    })
    .await;
}

#[actix::test]
async fn an_always_ready_stream_does_not_hold_the_arbiter_from_another_sessions_turn() {
    const CHUNKS: usize = 5_000_000;
    let flood = Flood::new(CHUNKS, "x");
    // Both sessions run on the test's arbiter: one thread for the two of them.
    let busy = start(
        flood.clone(),
        // Room for the whole flood: only the yielding is under test here.
        Session::builder().max_reply_bytes(16 << 20),
    )
    .await;
    let other = start(
        ScriptedLlm::new([Reply::text("Hello from the other session.")]),
        Session::builder(),
    )
    .await;
    let mut events = busy.subscribe();
    let flooding = spawn_turn(&busy, "talk forever");
    speech_started(&mut events).await;
    let result = tokio::time::timeout(BOUND, other.run("hi"))
        .await
        .expect("the other session's turn ran")
        .unwrap();
    assert_eq!(
        result.assistant_messages().collect::<Vec<_>>(),
        ["Hello from the other session."]
    );
    let read = flood.read();
    assert!(
        read < CHUNKS,
        "the other turn ran while the stream was read ({read} of {CHUNKS} chunks)"
    );
    busy.close().await.unwrap();
    assert!(matches!(
        flooding.await.unwrap(),
        Err(SessionError::Closed) | Ok(_)
    ));
    other.close().await.unwrap();
}

#[actix::test]
async fn an_interrupt_lands_between_chunks_of_an_always_ready_stream() {
    const CHUNKS: usize = 5_000_000;
    let flood = Flood::new(CHUNKS, "x");
    let session = start(flood.clone(), Session::builder().max_reply_bytes(16 << 20)).await;
    let mut events = session.subscribe();
    let turn = spawn_turn(&session, "talk forever");
    speech_started(&mut events).await;
    tokio::time::timeout(BOUND, session.interrupt())
        .await
        .expect("the interrupt was answered")
        .unwrap();
    let result = turn.await.unwrap().unwrap();
    assert!(result.interrupted, "the turn is marked interrupted");
    let read = flood.read();
    assert!(read < CHUNKS, "the stream was dropped after {read} chunks");
    let said = result.assistant_messages().next().unwrap().to_owned();
    assert!(!said.is_empty() && said.len() <= read);
    // The session goes on.
    let next = session.run("and now?").await.unwrap();
    assert_eq!(
        next.assistant_messages().collect::<Vec<_>>(),
        ["Short answer."]
    );
    session.close().await.unwrap();
}

#[actix::test]
async fn a_step_whose_text_goes_over_the_limit_keeps_what_fits_and_fails_the_turn() {
    // 100,000 five-byte pieces: 500 KB, over the default limit of 64 KiB.
    let flood = Flood::new(100_000, "word ");
    let out = RecordingOutput::new();
    let session = start(flood.clone(), Session::builder().output(out.clone())).await;
    let mut events = session.subscribe();
    let err = session.run("write a lot").await.unwrap_err();
    let SessionError::TurnFailed {
        failure: TurnFailure::ReplyTooLong { limit },
        result,
    } = &err
    else {
        panic!("expected ReplyTooLong, got {err:?}");
    };
    assert_eq!(*limit, 64 * 1024);
    assert!(err.to_string().contains("over the limit of 65536 bytes"));
    let kept = result.assistant_messages().next().unwrap();
    assert_eq!(kept.len(), 64 * 1024);
    assert!(
        flood.read() < 20_000,
        "the stream was dropped at the limit ({} pieces read)",
        flood.read()
    );
    // The output got exactly what the chat keeps, and the speech was finished.
    let speech = out.last_speech().unwrap();
    assert_eq!(speech.text, kept);
    assert!(speech.finished);
    let message = wait_event(&mut events, |e| match e {
        SessionEvent::Error { message } => Some(message.clone()),
        _ => None,
    })
    .await;
    assert!(message.contains("over the limit"), "{message}");
    let chat = session.chat_context().await.unwrap();
    let ChatItem::Message(said) = &chat.items()[1] else {
        panic!("{:?}", chat.items());
    };
    assert!(said.interrupted, "kept, marked cut short");
    // The session goes on, and the next request carries the kept text once.
    session.run("shorter, please").await.unwrap();
    let sizes = flood.request_bytes.lock().unwrap().clone();
    assert!(sizes[1] < 64 * 1024 + 1_000, "{sizes:?}");
    session.close().await.unwrap();
}

#[actix::test]
async fn a_huge_tool_name_and_huge_arguments_leave_small_stand_ins_and_later_requests_stay_small() {
    let runs = Arc::new(AtomicUsize::new(0));
    let search = {
        let runs = runs.clone();
        Tool::new(
            "search",
            "Searches",
            move |_ctx: RunContext, _: common::Query| {
                let runs = runs.clone();
                async move {
                    runs.fetch_add(1, Ordering::Relaxed);
                    Ok::<_, ToolFailure>("found")
                }
            },
        )
    };
    let huge_name = "n".repeat(1 << 20);
    let huge_id = "i".repeat(1 << 20);
    let huge_arguments = format!("{{\"q\": \"{}\"}}", "A".repeat(10_000_000));
    let sent = huge_arguments.len();
    let llm = ScriptedLlm::new([
        Reply::raw_tool_call("c1", huge_name, "{}").and_raw_tool_call(
            huge_id,
            "search",
            huge_arguments,
        ),
        Reply::text("Sorry, let me try again."),
        Reply::text("Anything else?"),
    ]);
    let session = Session::builder()
        .llm(llm.clone())
        .agent(Agent::builder("agent").tool(search).build().unwrap())
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("search").await.unwrap();
    session.run("thanks").await.unwrap();
    assert_eq!(runs.load(Ordering::Relaxed), 0, "neither call ran");
    let requests = llm.requests();
    assert_eq!(requests.len(), 3);
    for request in &requests[1..] {
        let bytes = chat_bytes(&request.chat);
        assert!(bytes < 4_000, "a later request carries {bytes} bytes");
    }
    let chat = session.chat_context().await.unwrap();
    assert_invariant(&chat);
    // What the model can read: the name cut, the size, that it did not run.
    let calls: Vec<&switchboard::FunctionCall> = chat
        .items()
        .iter()
        .filter_map(|item| match item {
            ChatItem::FunctionCall(c) => Some(c),
            _ => None,
        })
        .collect();
    // Cut, marked, and in the characters a provider accepts in a later request.
    assert_eq!(calls[0].name, format!("{}_cut", "n".repeat(60)));
    let refused_name = &chat.output_of("c1").unwrap().output;
    assert!(
        refused_name.contains("was 1048576 bytes, over the limit of 64 (shown cut, as nnnn"),
        "{refused_name}"
    );
    assert_eq!(calls[1].call_id, "i".repeat(64), "the id is cut");
    let stand_in: serde_json::Value = serde_json::from_str(&calls[1].arguments).unwrap();
    assert_eq!(
        stand_in["omitted"],
        format!("{sent} bytes of arguments, over the limit of 65536; the call did not run")
    );
    let refused_arguments = &chat.output_of(&calls[1].call_id).unwrap().output;
    assert!(
        refused_arguments.contains(&format!(
            "search are {sent} bytes, over the limit of 65536; it did not run"
        )),
        "{refused_arguments}"
    );
    session.close().await.unwrap();
}
