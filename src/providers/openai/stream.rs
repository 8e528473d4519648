//! Reading the answer: each server-sent event's JSON as [`LlmChunk`]s.
//!
//! - Text deltas are returned as soon as their event is read: the engine streams them to
//!   the voice output while the model is still writing.
//! - Tool-call fragments are joined by their `index`; fragments of parallel calls may
//!   arrive interleaved. The calls are returned, in index order, when the choice's
//!   `finish_reason` comes (or at `[DONE]` if a server sends none). Not when a later index
//!   starts: the format does not promise that a call's fragments end when the next call's
//!   begin, and the engine runs a step's calls together once the answer is complete
//!   anyway, so returning them earlier would gain nothing and risk a half call.
//! - The usage object (sent after the last choice, because the request asks for it with
//!   `stream_options.include_usage`) is a [`LlmChunk::Usage`].
//! - `[DONE]` ends the answer. Ids the model writes are returned as it wrote them (the
//!   engine makes them unique); a call without an id gets `call_{index}`, and a call with
//!   empty arguments gets `{}` (some servers send nothing for a tool without parameters).

use std::collections::BTreeMap;

use serde::Deserialize;

use super::error::{from_stream_error, prefix, ErrorBody};
use crate::{LlmChunk, LlmError, LlmUsage, ToolCallChunk};

/// One `data:` payload of the stream.
#[derive(Deserialize)]
struct ChunkJson {
    #[serde(default)]
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<UsageJson>,
    #[serde(default)]
    error: Option<ErrorBody>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    index: u32,
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Default, Deserialize)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Deserialize)]
struct ToolCallDelta {
    #[serde(default)]
    index: Option<u32>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionDelta>,
}

#[derive(Deserialize)]
struct FunctionDelta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

#[derive(Deserialize)]
struct UsageJson {
    #[serde(default)]
    prompt_tokens: u32,
    #[serde(default)]
    completion_tokens: u32,
    #[serde(default)]
    prompt_tokens_details: Option<PromptTokensDetails>,
    #[serde(default)]
    completion_tokens_details: Option<CompletionTokensDetails>,
}

/// `usage.completion_tokens_details`: of the completion, the audio tokens (an audio
/// model's spoken answer).
#[derive(Deserialize)]
struct CompletionTokensDetails {
    #[serde(default)]
    audio_tokens: Option<u32>,
}

#[derive(Deserialize)]
struct PromptTokensDetails {
    #[serde(default)]
    cached_tokens: Option<u32>,
    #[serde(default)]
    audio_tokens: Option<u32>,
}

/// A tool call being assembled from its fragments.
#[derive(Default)]
struct PartialCall {
    id: Option<String>,
    name: Option<String>,
    arguments: String,
}

/// What one event meant.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Decoded {
    /// Chunks to forward now, in order.
    pub(super) chunks: Vec<LlmChunk>,
    /// The answer is complete (`[DONE]`).
    pub(super) done: bool,
}

/// How much of a malformed payload an error quotes.
const QUOTE: usize = 200;

/// The state of one answer's stream.
#[derive(Default)]
pub(super) struct StreamDecoder {
    calls: BTreeMap<u32, PartialCall>,
    last_index: Option<u32>,
    finished: bool,
}

impl StreamDecoder {
    /// Whether a `finish_reason` came: the answer is complete even if `[DONE]` does not.
    pub(super) fn finished(&self) -> bool {
        self.finished
    }

    /// Reads one event's `data`.
    pub(super) fn decode(&mut self, data: &str) -> Result<Decoded, LlmError> {
        let mut decoded = Decoded::default();
        if data.trim() == "[DONE]" {
            decoded.chunks = self.take_calls()?;
            decoded.done = true;
            return Ok(decoded);
        }
        let chunk: ChunkJson =
            serde_json::from_str(data).map_err(|e| LlmError::MalformedStream {
                message: format!("unreadable chunk ({e}): {}", prefix(data, QUOTE)),
            })?;
        if let Some(error) = chunk.error {
            return Err(from_stream_error(error));
        }
        // `n` is never set, so only the first choice is read.
        for choice in chunk.choices.into_iter().filter(|c| c.index == 0) {
            let delta = choice.delta.unwrap_or_default();
            if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
                decoded.chunks.push(LlmChunk::Text(text));
            }
            for fragment in delta.tool_calls.into_iter().flatten() {
                self.join(fragment);
            }
            if choice.finish_reason.is_some() && !self.finished {
                self.finished = true;
                decoded.chunks.extend(self.take_calls()?);
            }
        }
        if let Some(usage) = chunk.usage {
            let prompt = usage.prompt_tokens_details;
            decoded.chunks.push(LlmChunk::Usage(LlmUsage {
                prompt_tokens: usage.prompt_tokens,
                completion_tokens: usage.completion_tokens,
                cached_prompt_tokens: prompt.as_ref().and_then(|d| d.cached_tokens),
                audio_prompt_tokens: prompt.as_ref().and_then(|d| d.audio_tokens),
                audio_completion_tokens: usage
                    .completion_tokens_details
                    .and_then(|d| d.audio_tokens),
            }));
        }
        Ok(decoded)
    }

    /// The calls still held, once the stream ended cleanly after a `finish_reason`.
    pub(super) fn finish(&mut self) -> Result<Vec<LlmChunk>, LlmError> {
        self.take_calls()
    }

    fn join(&mut self, fragment: ToolCallDelta) {
        // Servers that omit `index` start a new call with an id and continue the last one
        // without.
        let index = match (fragment.index, &fragment.id, self.last_index) {
            (Some(index), _, _) => index,
            (None, None, Some(last)) => last,
            (None, _, last) => last.map_or(0, |l| l + 1),
        };
        self.last_index = Some(index);
        let call = self.calls.entry(index).or_default();
        if call.id.is_none() {
            call.id = fragment.id.filter(|id| !id.is_empty());
        }
        if let Some(function) = fragment.function {
            // OpenAI sends the whole name in the first fragment; servers that repeat it
            // in later fragments must not make it `bookbook`.
            if call.name.is_none() {
                call.name = function.name.filter(|n| !n.is_empty());
            }
            if let Some(arguments) = function.arguments {
                call.arguments.push_str(&arguments);
            }
        }
    }

    fn take_calls(&mut self) -> Result<Vec<LlmChunk>, LlmError> {
        std::mem::take(&mut self.calls)
            .into_iter()
            .map(|(index, call)| {
                let name = call.name.ok_or_else(|| LlmError::MalformedStream {
                    message: format!("tool call at index {index} has no function name"),
                })?;
                Ok(LlmChunk::ToolCall(ToolCallChunk {
                    call_id: call.id.unwrap_or_else(|| format!("call_{index}")),
                    name,
                    arguments: if call.arguments.trim().is_empty() {
                        "{}".to_owned()
                    } else {
                        call.arguments
                    },
                }))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> LlmChunk {
        LlmChunk::Text(s.into())
    }

    fn call(id: &str, name: &str, arguments: &str) -> LlmChunk {
        LlmChunk::ToolCall(ToolCallChunk {
            call_id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
        })
    }

    fn run(events: &[&str]) -> Vec<LlmChunk> {
        let mut decoder = StreamDecoder::default();
        let mut out = Vec::new();
        for data in events {
            let decoded = decoder.decode(data).unwrap();
            out.extend(decoded.chunks);
            if decoded.done {
                break;
            }
        }
        out
    }

    #[test]
    fn text_is_returned_event_by_event() {
        let mut decoder = StreamDecoder::default();
        let first = decoder
            .decode(r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#)
            .unwrap();
        assert!(first.chunks.is_empty(), "an empty role delta is nothing");
        let hello = decoder
            .decode(r#"{"choices":[{"index":0,"delta":{"content":"Hel"}}]}"#)
            .unwrap();
        assert_eq!(hello.chunks, [text("Hel")]);
    }

    #[test]
    fn interleaved_fragments_of_parallel_calls_are_joined_by_index() {
        let chunks = run(&[
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"weather","arguments":""}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":"weather","arguments":"{\"ci"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"ty\":\"Rome\"}"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":50,"completion_tokens":20,"prompt_tokens_details":{"cached_tokens":10,"audio_tokens":7},"completion_tokens_details":{"audio_tokens":3}}}"#,
            "[DONE]",
        ]);
        assert_eq!(
            chunks,
            [
                call("call_a", "weather", r#"{"city":"Paris"}"#),
                call("call_b", "weather", r#"{"city":"Rome"}"#),
                LlmChunk::Usage(LlmUsage {
                    prompt_tokens: 50,
                    completion_tokens: 20,
                    cached_prompt_tokens: Some(10),
                    audio_prompt_tokens: Some(7),
                    audio_completion_tokens: Some(3),
                }),
            ]
        );
    }

    #[test]
    fn servers_that_omit_index_id_or_arguments_still_give_whole_calls() {
        let chunks = run(&[
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"id":"x1","function":{"name":"a","arguments":"{\"k\":"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"function":{"name":"a","arguments":"1}"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"id":"x2","function":{"name":"b"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":5,"function":{"name":"c","arguments":""}}]}}]}"#,
            "[DONE]",
        ]);
        assert_eq!(
            chunks,
            [
                call("x1", "a", r#"{"k":1}"#),
                call("x2", "b", "{}"),
                call("call_5", "c", "{}"),
            ]
        );
    }

    #[test]
    fn a_call_without_a_name_or_an_unreadable_chunk_is_malformed() {
        let mut decoder = StreamDecoder::default();
        decoder
            .decode(r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}}]}"#)
            .unwrap();
        assert!(matches!(
            decoder.decode("[DONE]"),
            Err(LlmError::MalformedStream { .. })
        ));
        let err = StreamDecoder::default()
            .decode(r#"{"choices":[{"index":0,"delta":{"content":"#)
            .unwrap_err();
        assert!(
            matches!(err, LlmError::MalformedStream { message } if message.contains("unreadable chunk"))
        );
    }

    #[test]
    fn an_error_object_in_the_stream_is_the_providers_error() {
        let err = StreamDecoder::default()
            .decode(r#"{"error":{"message":"The server had an error","type":"server_error"}}"#)
            .unwrap_err();
        assert!(err.to_string().contains("The server had an error"), "{err}");
    }
}
