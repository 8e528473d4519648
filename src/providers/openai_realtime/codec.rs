//! The OpenAI Realtime API's events (GA names), as JSON text: the engine's
//! [`ClientEvent`]s encoded, the server's events decoded into [`ServerEvent`]s.
//!
//! Decoding reads each event once, into a struct that borrows its strings from the text
//! (a piece of audio's base64 is not copied before it is decoded), and keeps only what the
//! engine acts on; an event it does not know is [`ServerEvent::Other`]. The input audio's
//! `input_audio_buffer.append` is written by hand into one buffer, base64 in place.

use std::borrow::Cow;
use std::fmt::Write as _;

use crate::realtime::{
    AudioFormat, ClientEvent, OutputKind, Place, RealtimeSettings, RemoteItem, ResponseStatus,
    ServerEvent, SessionUpdate, TurnDetection, VadKind,
};
use crate::{ChatRole, LlmUsage, ToolChoice};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Map, Value};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// The model's audio from its base64: most of the bytes a response carries, decoded with
/// the CPU's vector instructions (several times faster than the scalar decoder, and one
/// decode per ~20 ms piece of audio).
fn decode_audio(base64: &str) -> Result<Vec<u8>, String> {
    base64_simd::STANDARD
        .decode_to_vec(base64)
        .map_err(|err| format!("an audio delta is not base64: {err}"))
}

/// How much of an event a decoding error quotes.
const QUOTE: usize = 120;

/// Encodes one client event as the JSON text of a WebSocket message.
pub fn encode(event: &ClientEvent) -> String {
    match event {
        ClientEvent::AppendAudio(audio) => {
            let mut text = String::with_capacity(50 + audio.len() * 4 / 3 + 4);
            text.push_str(r#"{"type":"input_audio_buffer.append","audio":""#);
            B64.encode_string(audio, &mut text);
            text.push_str(r#""}"#);
            text
        }
        ClientEvent::CommitAudio => r#"{"type":"input_audio_buffer.commit"}"#.to_owned(),
        ClientEvent::UpdateSession(update) => session_update(update).to_string(),
        ClientEvent::CreateItem { id, previous, item } => {
            let mut event = json!({
                "type": "conversation.item.create",
                "event_id": format!("sb_create_{id}"),
                "item": item_json(id, item),
            });
            match previous {
                Place::Start => event["previous_item_id"] = json!("root"),
                Place::After(previous) => event["previous_item_id"] = json!(previous),
                Place::End => {}
            }
            event.to_string()
        }
        ClientEvent::DeleteItem { id } => json!({
            "type": "conversation.item.delete",
            "event_id": format!("sb_delete_{id}"),
            "item_id": id,
        })
        .to_string(),
        ClientEvent::TruncateItem { id, audio_end_ms } => json!({
            "type": "conversation.item.truncate",
            "event_id": format!("sb_truncate_{id}"),
            "item_id": id,
            "content_index": 0,
            "audio_end_ms": audio_end_ms,
        })
        .to_string(),
        ClientEvent::CreateResponse {
            tag,
            instructions,
            tool_choice,
        } => {
            let mut response = Map::new();
            response.insert("metadata".into(), json!({ "sb_tag": tag.to_string() }));
            if let Some(instructions) = instructions {
                response.insert("instructions".into(), json!(instructions));
            }
            if *tool_choice == ToolChoice::None {
                response.insert("tool_choice".into(), json!("none"));
            }
            json!({
                "type": "response.create",
                "event_id": crate::realtime::response_event_id(*tag),
                "response": response,
            })
            .to_string()
        }
        ClientEvent::CancelResponse { response_id } => json!({
            "type": "response.cancel",
            "response_id": response_id,
        })
        .to_string(),
        // A later event of the engine's vocabulary this provider does not speak.
        _ => r#"{"type":"session.update","session":{"type":"realtime"}}"#.to_owned(),
    }
}

fn session_update(update: &SessionUpdate) -> Value {
    let mut session = Map::new();
    session.insert("type".into(), json!("realtime"));
    if let Some(instructions) = &update.instructions {
        session.insert("instructions".into(), json!(instructions.as_ref()));
    }
    if let Some(tools) = &update.tools {
        let tools: Vec<Value> = tools
            .iter()
            .map(|t| {
                json!({
                    "type": "function",
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters,
                })
            })
            .collect();
        session.insert("tools".into(), Value::Array(tools));
        session.insert("tool_choice".into(), json!("auto"));
    }
    let mut output = Map::new();
    if let Some(voice) = &update.voice {
        output.insert("voice".into(), json!(voice));
    }
    let mut input = Map::new();
    if let Some(settings) = &update.settings {
        session.insert("output_modalities".into(), json!(["audio"]));
        input.insert("format".into(), format_json(settings.input_format));
        input.insert(
            "transcription".into(),
            match &settings.transcription {
                Some(model) => json!({ "model": model }),
                None => Value::Null,
            },
        );
        input.insert(
            "turn_detection".into(),
            settings
                .turn_detection
                .as_ref()
                .map_or(Value::Null, turn_detection_json),
        );
        output.insert("format".into(), format_json(settings.output_format));
    }
    if !input.is_empty() || !output.is_empty() {
        let mut audio = Map::new();
        if !input.is_empty() {
            audio.insert("input".into(), Value::Object(input));
        }
        if !output.is_empty() {
            audio.insert("output".into(), Value::Object(output));
        }
        session.insert("audio".into(), Value::Object(audio));
    }
    json!({ "type": "session.update", "session": session })
}

fn format_json(format: AudioFormat) -> Value {
    match format {
        AudioFormat::Pcm16 { rate } => json!({ "type": "audio/pcm", "rate": rate }),
        AudioFormat::G711Ulaw => json!({ "type": "audio/pcmu" }),
        AudioFormat::G711Alaw => json!({ "type": "audio/pcma" }),
        _ => json!({ "type": "audio/pcm", "rate": 24_000 }),
    }
}

fn turn_detection_json(turn: &TurnDetection) -> Value {
    let mut value = json!({
        "type": match turn.kind {
            VadKind::Semantic => "semantic_vad",
            _ => "server_vad",
        },
        "create_response": turn.create_response,
        "interrupt_response": turn.interrupt_response,
    });
    if let Some(silence) = turn.silence {
        value["silence_duration_ms"] = json!(silence.as_millis() as u64);
    }
    if let Some(threshold) = turn.threshold {
        value["threshold"] = json!(threshold);
    }
    value
}

fn item_json(id: &str, item: &RemoteItem) -> Value {
    match item {
        RemoteItem::Message { role, text } => {
            let (role, kind) = match role {
                ChatRole::User => ("user", "input_text"),
                ChatRole::System => ("system", "input_text"),
                ChatRole::Assistant => ("assistant", "output_text"),
            };
            json!({
                "id": id,
                "type": "message",
                "role": role,
                "content": [{ "type": kind, "text": text }],
            })
        }
        RemoteItem::FunctionCall {
            call_id,
            name,
            arguments,
        } => json!({
            "id": id,
            "type": "function_call",
            "call_id": call_id,
            "name": name,
            "arguments": arguments,
        }),
        RemoteItem::FunctionCallOutput { call_id, output } => json!({
            "id": id,
            "type": "function_call_output",
            "call_id": call_id,
            "output": output,
        }),
        _ => json!({ "id": id, "type": "message", "role": "system", "content": [] }),
    }
}

/// One server event, every field the engine reads (the others are skipped unread).
#[derive(Deserialize)]
struct Event<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow, default)]
    delta: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    item_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    response_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    call_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    arguments: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    transcript: Option<Cow<'a, str>>,
    #[serde(default)]
    audio_end_ms: Option<u32>,
    #[serde(borrow, default)]
    item: Option<ItemRef<'a>>,
    #[serde(borrow, default)]
    response: Option<ResponseRef<'a>>,
    #[serde(borrow, default)]
    error: Option<ErrorRef<'a>>,
}

#[derive(Deserialize)]
struct ItemRef<'a> {
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(rename = "type", borrow, default)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    call_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct ResponseRef<'a> {
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    status: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    status_details: Option<StatusDetails<'a>>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(borrow, default)]
    metadata: Option<Metadata<'a>>,
}

#[derive(Deserialize)]
struct StatusDetails<'a> {
    #[serde(borrow, default)]
    reason: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    error: Option<ErrorRef<'a>>,
}

#[derive(Deserialize)]
struct Metadata<'a> {
    #[serde(borrow, default)]
    sb_tag: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    input_tokens: u32,
    #[serde(default)]
    output_tokens: u32,
    #[serde(default)]
    input_token_details: Option<TokenDetails>,
    #[serde(default)]
    output_token_details: Option<TokenDetails>,
}

#[derive(Deserialize)]
struct TokenDetails {
    #[serde(default)]
    cached_tokens: Option<u32>,
    #[serde(default)]
    audio_tokens: Option<u32>,
}

#[derive(Deserialize)]
struct ErrorRef<'a> {
    #[serde(borrow, default)]
    code: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    message: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    event_id: Option<Cow<'a, str>>,
}

fn owned(text: Option<Cow<'_, str>>) -> String {
    text.map(Cow::into_owned).unwrap_or_default()
}

/// The value of the string field `name` in a flat event, when it holds no escape (`None`:
/// absent, escaped, or not a string; the full parser then reads the event).
fn plain_field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    let key = text.find(name)?;
    let rest = text[key + name.len()..].trim_start();
    let rest = rest.strip_prefix(':')?.trim_start().strip_prefix('"')?;
    let end = rest.find('"')?;
    let value = &rest[..end];
    (!value.contains('\\')).then_some(value)
}

/// The hot path: a piece of the model's audio (most events of a response) read without the
/// general parser: its item id and its base64, found by their keys. Anything unusual (an
/// escape, a missing field) goes to the general parser.
fn audio_delta(text: &str) -> Option<Result<ServerEvent, String>> {
    if !text.contains(r#""response.output_audio.delta""#) {
        return None;
    }
    let delta = plain_field(text, r#""delta""#)?;
    let item = plain_field(text, r#""item_id""#)?;
    Some(decode_audio(delta).map(|audio| ServerEvent::AudioDelta {
        item_id: item.to_owned(),
        audio,
    }))
}

/// Decodes one server event. Text that is not an event the engine can read is reported
/// as an error (the connection goes on; the caller logs it).
pub fn decode(text: &str) -> Result<ServerEvent, String> {
    if let Some(audio) = audio_delta(text) {
        return audio;
    }
    let event: Event<'_> = serde_json::from_str(text).map_err(|err| {
        let mut quoted = String::new();
        let end = (0..=QUOTE.min(text.len()))
            .rev()
            .find(|at| text.is_char_boundary(*at))
            .unwrap_or(0);
        let _ = write!(quoted, "{err}: {}", &text[..end]);
        quoted
    })?;
    Ok(match event.kind.as_ref() {
        "response.output_audio.delta" => {
            let delta = event.delta.as_deref().unwrap_or_default();
            let audio = decode_audio(delta)?;
            ServerEvent::AudioDelta {
                item_id: owned(event.item_id),
                audio,
            }
        }
        "response.output_audio_transcript.delta" | "response.output_text.delta" => {
            ServerEvent::TextDelta {
                item_id: owned(event.item_id),
                delta: owned(event.delta),
            }
        }
        "response.output_item.added" => {
            let item = event.item;
            let kind = match item.as_ref().and_then(|i| i.kind.as_deref()) {
                Some("message") => OutputKind::Message,
                Some("function_call") => OutputKind::FunctionCall {
                    call_id: item
                        .as_ref()
                        .and_then(|i| i.call_id.as_deref())
                        .unwrap_or_default()
                        .to_owned(),
                    name: item
                        .as_ref()
                        .and_then(|i| i.name.as_deref())
                        .unwrap_or_default()
                        .to_owned(),
                },
                _ => OutputKind::Other,
            };
            ServerEvent::OutputItemAdded {
                response_id: owned(event.response_id),
                item_id: owned(item.and_then(|i| i.id)),
                kind,
            }
        }
        "response.function_call_arguments.done" => ServerEvent::FunctionCall {
            response_id: owned(event.response_id),
            item_id: owned(event.item_id),
            call_id: owned(event.call_id),
            name: owned(event.name),
            arguments: owned(event.arguments),
        },
        "response.created" => {
            let response = event.response;
            let tag = response
                .as_ref()
                .and_then(|r| r.metadata.as_ref())
                .and_then(|m| m.sb_tag.as_deref())
                .and_then(|t| t.parse().ok());
            ServerEvent::ResponseCreated {
                response_id: owned(response.and_then(|r| r.id)),
                tag,
            }
        }
        "response.done" => {
            let Some(response) = event.response else {
                return Err("response.done without its response".to_owned());
            };
            let reason = || {
                response
                    .status_details
                    .as_ref()
                    .and_then(|d| d.reason.as_deref())
                    .unwrap_or_default()
                    .to_owned()
            };
            let status = match response.status.as_deref() {
                Some("cancelled") => ResponseStatus::Cancelled { reason: reason() },
                Some("incomplete") => ResponseStatus::Incomplete { reason: reason() },
                Some("failed") => ResponseStatus::Failed {
                    message: response
                        .status_details
                        .as_ref()
                        .and_then(|d| d.error.as_ref())
                        .and_then(|e| e.message.as_deref())
                        .unwrap_or("no message")
                        .to_owned(),
                },
                _ => ResponseStatus::Completed,
            };
            let usage = response.usage.as_ref().map(|u| {
                let mut usage = LlmUsage {
                    prompt_tokens: u.input_tokens,
                    completion_tokens: u.output_tokens,
                    ..LlmUsage::default()
                };
                usage.cached_prompt_tokens =
                    u.input_token_details.as_ref().and_then(|d| d.cached_tokens);
                usage.audio_prompt_tokens =
                    u.input_token_details.as_ref().and_then(|d| d.audio_tokens);
                usage.audio_completion_tokens =
                    u.output_token_details.as_ref().and_then(|d| d.audio_tokens);
                usage
            });
            ServerEvent::ResponseDone {
                response_id: owned(response.id),
                status,
                usage,
            }
        }
        "input_audio_buffer.speech_started" => ServerEvent::SpeechStarted {
            item_id: owned(event.item_id),
        },
        "input_audio_buffer.speech_stopped" => ServerEvent::SpeechStopped {
            item_id: owned(event.item_id),
        },
        "input_audio_buffer.committed" => ServerEvent::AudioCommitted {
            item_id: owned(event.item_id),
        },
        "conversation.item.input_audio_transcription.completed" => ServerEvent::InputTranscript {
            item_id: owned(event.item_id),
            transcript: owned(event.transcript),
        },
        "conversation.item.added" => ServerEvent::ItemAdded {
            item_id: owned(event.item.and_then(|i| i.id)),
        },
        "conversation.item.deleted" => ServerEvent::ItemDeleted {
            item_id: owned(event.item_id),
        },
        "conversation.item.truncated" => ServerEvent::ItemTruncated {
            item_id: owned(event.item_id),
            audio_end_ms: event.audio_end_ms.unwrap_or_default(),
        },
        "session.created" => ServerEvent::SessionCreated,
        "session.updated" => ServerEvent::SessionUpdated,
        "error" => {
            let error = event.error;
            ServerEvent::Error {
                code: error
                    .as_ref()
                    .and_then(|e| e.code.as_deref())
                    .map(str::to_owned),
                message: error
                    .as_ref()
                    .and_then(|e| e.message.as_deref())
                    .unwrap_or("no message")
                    .to_owned(),
                event_id: error.and_then(|e| e.event_id).map(Cow::into_owned),
            }
        }
        _ => ServerEvent::Other,
    })
}

/// The settings a provider that speaks this protocol starts from.
pub fn default_settings() -> RealtimeSettings {
    RealtimeSettings::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_audio_append_is_one_event_with_the_audio_in_base64() {
        let text = encode(&ClientEvent::AppendAudio(vec![0, 1, 2, 3]));
        let value: Value = serde_json::from_str(&text).unwrap_or_default();
        assert_eq!(value["type"], "input_audio_buffer.append");
        assert_eq!(value["audio"], B64.encode([0, 1, 2, 3]));
    }

    #[test]
    fn audio_deltas_decode_to_pcm() {
        let text = format!(
            r#"{{"type":"response.output_audio.delta","event_id":"e","response_id":"r","item_id":"i","output_index":0,"content_index":0,"delta":"{}"}}"#,
            B64.encode([9u8; 960])
        );
        assert_eq!(
            decode(&text),
            Ok(ServerEvent::AudioDelta {
                item_id: "i".to_owned(),
                audio: vec![9; 960]
            })
        );
    }

    #[test]
    fn audio_deltas_decode_in_any_field_order_and_with_escapes() {
        let b64 = B64.encode([7u8; 48]);
        let reordered = format!(
            r#"{{"delta" : "{b64}", "item_id":"i2", "type":"response.output_audio.delta"}}"#
        );
        let escaped = format!(
            r#"{{"type":"response.output_audio.delta","item_id":"i3","delta":"{}"}}"#,
            b64.replace('/', "\\/")
        );
        for (text, item) in [(reordered, "i2"), (escaped, "i3")] {
            assert_eq!(
                decode(&text),
                Ok(ServerEvent::AudioDelta {
                    item_id: item.to_owned(),
                    audio: vec![7; 48]
                }),
                "{text}"
            );
        }
    }

    #[test]
    fn a_response_carries_its_tag_and_usage_with_audio_tokens() {
        let created = r#"{"type":"response.created","response":{"id":"r1","status":"in_progress","metadata":{"sb_tag":"42"}}}"#;
        assert_eq!(
            decode(created),
            Ok(ServerEvent::ResponseCreated {
                response_id: "r1".to_owned(),
                tag: Some(42)
            })
        );
        let done = r#"{"type":"response.done","response":{"id":"r1","status":"cancelled","status_details":{"type":"cancelled","reason":"turn_detected"},"usage":{"input_tokens":100,"output_tokens":7,"input_token_details":{"cached_tokens":0,"audio_tokens":20},"output_token_details":{"audio_tokens":5}},"metadata":null}}"#;
        let Ok(ServerEvent::ResponseDone { status, usage, .. }) = decode(done) else {
            panic!("a response.done");
        };
        assert_eq!(
            status,
            ResponseStatus::Cancelled {
                reason: "turn_detected".to_owned()
            }
        );
        let usage = usage.unwrap_or_default();
        assert_eq!(usage.prompt_tokens, 100);
        assert_eq!(usage.audio_prompt_tokens, Some(20));
        assert_eq!(usage.audio_completion_tokens, Some(5));
    }

    #[test]
    fn a_response_request_names_its_tag_where_an_error_echoes_it() {
        let text = encode(&ClientEvent::CreateResponse {
            tag: 7,
            instructions: Some("Say it.".to_owned()),
            tool_choice: ToolChoice::None,
        });
        let value: Value = serde_json::from_str(&text).unwrap_or_default();
        assert_eq!(value["event_id"], "sb_response_7");
        assert_eq!(value["response"]["metadata"]["sb_tag"], "7");
        assert_eq!(value["response"]["tool_choice"], "none");
        let error = r#"{"type":"error","error":{"type":"invalid_request_error","code":"conversation_already_has_active_response","message":"busy","event_id":"sb_response_7"}}"#;
        assert_eq!(
            decode(error),
            Ok(ServerEvent::Error {
                code: Some("conversation_already_has_active_response".to_owned()),
                message: "busy".to_owned(),
                event_id: Some("sb_response_7".to_owned())
            })
        );
    }

    #[test]
    fn the_first_session_update_sets_formats_turns_and_transcription() {
        let text = encode(&ClientEvent::UpdateSession(SessionUpdate {
            instructions: Some("Be brief.".into()),
            tools: None,
            voice: Some("marin".to_owned()),
            settings: Some(RealtimeSettings::new()),
        }));
        let value: Value = serde_json::from_str(&text).unwrap_or_default();
        let session = &value["session"];
        assert_eq!(session["type"], "realtime");
        assert_eq!(session["output_modalities"], json!(["audio"]));
        assert_eq!(session["audio"]["input"]["format"]["rate"], 24_000);
        assert_eq!(
            session["audio"]["input"]["turn_detection"]["type"],
            "server_vad"
        );
        assert_eq!(session["audio"]["output"]["voice"], "marin");
    }

    #[test]
    fn unknown_events_are_other_and_garbage_is_an_error() {
        assert_eq!(
            decode(r#"{"type":"rate_limits.updated","rate_limits":[]}"#),
            Ok(ServerEvent::Other)
        );
        assert!(decode("not json").is_err());
    }
}
