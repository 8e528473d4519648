//! Fuzzes what a model sends through the public `Llm` trait: the input bytes are split
//! into tool calls (name, arguments, call id) and text chunks. Whatever they are, every
//! call gets exactly one output, a call that cannot run gets an error output, nothing
//! panics, and the session closes with no actor left. The proptest twin in the normal
//! suite is `tests/fuzzed_model_input_never_breaks_the_session.rs`.
//!
//! ```sh
//! cd fuzz && cargo +nightly fuzz run model_input -- -max_total_time=300
//! ```
#![no_main]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{stream, StreamExt};
use libfuzzer_sys::fuzz_target;
use switchboard::prelude::*;
use switchboard::{LlmChunk, LlmError, LlmRequest, LlmStream, ToolCallChunk};

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Query {
    #[allow(dead_code)]
    q: String,
}

/// Answers the turn's first request with the fuzzed chunks, everything else with text.
struct Replay(Mutex<Option<Vec<LlmChunk>>>);

impl Llm for Replay {
    fn chat(&self, _request: LlmRequest) -> LlmStream {
        let chunks = self
            .0
            .lock()
            .map(|mut first| first.take())
            .ok()
            .flatten()
            .unwrap_or_else(|| vec![LlmChunk::Text("Done.".into())]);
        stream::iter(chunks.into_iter().map(Ok::<_, LlmError>)).boxed()
    }
}

/// Bytes → chunks: records separated by 0xFF; a record starting with `T` is text, any
/// other is a call whose fields (name, arguments, id) are separated by 0xFE.
fn chunks(data: &[u8]) -> Vec<LlmChunk> {
    data.split(|b| *b == 0xFF)
        .take(16)
        .map(|record| {
            let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
            match record.split_first() {
                Some((b'T', rest)) => LlmChunk::Text(text(rest)),
                _ => {
                    let mut fields = record.split(|b| *b == 0xFE);
                    let name = text(fields.next().unwrap_or_default());
                    let arguments = text(fields.next().unwrap_or_default());
                    let call_id = text(fields.next().unwrap_or_default());
                    LlmChunk::ToolCall(ToolCallChunk {
                        call_id,
                        name,
                        arguments,
                    })
                }
            }
        })
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let chunks = chunks(data);
    actix::System::new().block_on(async move {
        tokio::time::pause();
        let echo = Tool::new("echo", "Echoes", |_ctx: RunContext, _args: Query| async move {
            Ok::<_, ToolFailure>("echoed")
        })
        .on_duplicate(DuplicatePolicy::Allow);
        let session = Session::builder()
            .llm(Arc::new(Replay(Mutex::new(Some(chunks)))))
            .agent(Agent::builder("agent").tool(echo).build().expect("agent"))
            .max_argument_bytes(4096)
            .inspect(true)
            .start(&Engine::current().expect("engine"))
            .await
            .expect("session");
        let inspector = session.inspector().expect("inspector");
        let bound = Duration::from_secs(60);
        let turn = tokio::time::timeout(bound, session.run("go"))
            .await
            .expect("run() answers");
        if let Ok(turn) = turn {
            let chat = session.chat_context().await.expect("chat");
            chat.check_invariant().expect("one output per call");
            for call in turn.function_calls() {
                let out = chat.output_of(&call.call_id).expect("an output");
                if call.name != "echo" {
                    assert!(out.is_error && out.output.starts_with("Error"), "{out:?}");
                }
                assert!(out.output.len() < 2_000, "an error quotes too much");
            }
        }
        let history = tokio::time::timeout(bound, session.close())
            .await
            .expect("close() answers")
            .expect("close");
        for agent in &history.agents {
            agent.chat.check_invariant().expect("one output per call");
        }
        assert!(inspector.live_actors().is_empty());
    });
});
