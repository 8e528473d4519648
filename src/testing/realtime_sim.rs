//! A simulated OpenAI Realtime server (GA protocol): it answers from a
//! [`RealtimeScript`] and checks its client the way the real service does, counting
//! what the client gets wrong. The in-memory [`ScriptedRealtime`](super::ScriptedRealtime)
//! and the loopback [`RealtimeServer`](super::RealtimeServer) both run it.
//!
//! What it refuses, each with an `error` event like the real service sends and counted as
//! a violation ([`SimReport::violations`]):
//! - `response.create` while a response is active (`conversation_already_has_active_response`);
//! - `response.create` while a call of an earlier response has no output (no error: the
//!   real service answers without it; counted);
//! - a truncate past the audio sent for the item, of an item that is not the model's
//!   audio, or of an unknown item; a delete of an unknown item;
//! - a `function_call_output` whose call id is in no `function_call` item;
//! - a duplicate or over-long item id, an unknown `previous_item_id`, a call id outside
//!   `^[a-zA-Z0-9_-]{1,32}$`, assistant audio created by the client;
//! - a `session.update` without `session.type`, two output modalities, an audio format
//!   other than PCM at 24 kHz, µ-law or A-law, a voice change after the model spoke;
//! - an append that is not base64 (or odd-length PCM16), a commit of under 100 ms, an
//!   unknown event type, unparseable JSON.
//!
//! A `response.cancel` with no active response is answered `response_cancel_not_active`
//! and counted as benign (the real API calls it harmless), as is a second output for one
//! call.
//!
//! Audio is PCM16 at 24 kHz or G.711 (8 bytes a millisecond) as the session says, both
//! ways: the milliseconds of a truncate count the output format's bytes. The server's
//! voice detector hears the client's audio by loudness: a loud append starts
//! the user's speech (and cancels the active response, unless `interrupt_response` is
//! off), the script's silence after it ends the turn: the audio is committed, transcribed
//! if transcription is on, and answered unless `create_response` is off. Replies stream
//! in bursts (or paced), and a client event that arrives between two chunks (a cancel)
//! is read before the next chunk.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use base64::Engine as _;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::g711;
use super::realtime_script::{tone_in, RealtimeReply, RealtimeScript};
use crate::realtime::AudioFormat;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;
const MAX_ID: usize = 32;

/// What a connection sends its client.
#[derive(Debug)]
pub(crate) enum Outgoing {
    Text(String),
    /// The server closes the connection.
    Close,
}

/// A test's control over the live connection.
#[derive(Debug)]
pub(crate) enum Control {
    /// The server's VAD hears the user start speaking.
    SpeechStarted,
    /// The user stops: the turn is committed, transcribed, answered.
    SpeechStopped,
}

/// One barge-in as the server saw it: what the client sent after the user started
/// speaking over the model, and whether the server accepted it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpeechStart {
    /// A response was active when the user started speaking.
    pub response_active: bool,
    /// The server cancelled it itself (`interrupt_response`).
    pub server_cancelled: bool,
    /// The audio sent for the model's last audio item when the user started, in ms.
    pub audio_sent_ms: Option<u32>,
    /// The client's event types after it, in order (appends left out), until the next
    /// response started.
    pub client_events: Vec<String>,
    /// The first truncate's `audio_end_ms`, the audio sent for its item then, and whether
    /// the server accepted it.
    pub truncate: Option<(u32, u32, bool)>,
    /// Whether the client deleted the item instead.
    pub deleted: bool,
    /// How many `response.cancel` the client sent.
    pub cancels: u32,
}

/// What the simulated server saw, over all its connections.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SimReport {
    /// Connections opened.
    pub connections: u32,
    /// What the real service would refuse, by kind.
    pub violations: BTreeMap<String, u32>,
    /// Harmless refusals (a cancel with nothing to cancel, a second output for a call).
    pub benign: BTreeMap<String, u32>,
    /// Client events by type.
    pub client_events: BTreeMap<String, u32>,
    /// Responses, by how they started (`created_vad`, `created_client`) and ended
    /// (`completed`, `cancelled_turn_detected`, `cancelled_client_cancelled`).
    pub responses: BTreeMap<String, u32>,
    /// Every client event but the audio appends, in order over all connections, as
    /// `(connection, event)`.
    pub trace: Vec<(u32, Value)>,
    /// Each time the user started speaking over the model, per connection in order.
    pub speech_starts: Vec<SpeechStart>,
    /// Audio the client appended, in ms.
    pub audio_in_ms: u64,
    /// Audio the server sent, in ms.
    pub audio_out_ms: u64,
}

impl SimReport {
    /// How many violations it counted in all.
    pub fn violations_total(&self) -> u32 {
        self.violations.values().sum()
    }

    /// The client's events of one type, in order.
    pub fn events_of(&self, kind: &str) -> Vec<&Value> {
        self.trace
            .iter()
            .filter(|(_, e)| e["type"] == kind)
            .map(|(_, e)| e)
            .collect()
    }
}

/// The script's place, shared by the server's connections (a reconnection goes on with
/// the next reply rather than from the start), and the report.
pub(crate) struct SimState {
    script: RealtimeScript,
    next: usize,
    report: SimReport,
}

/// A simulated server: one script, any number of connections.
#[derive(Clone)]
pub(crate) struct Simulator {
    state: Arc<Mutex<SimState>>,
}

impl Simulator {
    pub(crate) fn new(script: RealtimeScript) -> Self {
        Self {
            state: Arc::new(Mutex::new(SimState {
                script,
                next: 0,
                report: SimReport::default(),
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, SimState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What it saw so far.
    pub(crate) fn report(&self) -> SimReport {
        self.lock().report.clone()
    }

    /// Serves one connection until the client leaves or the script drops it: reads the
    /// client's JSON events from `incoming`, writes the server's to `outgoing`.
    pub(crate) async fn serve(
        self,
        mut incoming: mpsc::UnboundedReceiver<String>,
        outgoing: mpsc::UnboundedSender<Outgoing>,
        mut control: mpsc::UnboundedReceiver<Control>,
    ) {
        let id = {
            let mut state = self.lock();
            state.report.connections += 1;
            state.report.connections
        };
        let mut conn = Connection::new(self.clone(), id, outgoing);
        conn.send(json!({"type": "session.created", "session": conn.session.clone()}));
        loop {
            let next = conn.streaming.as_ref().map(|s| s.at);
            tokio::select! {
                biased;
                event = incoming.recv() => match event {
                    Some(text) => conn.handle(&text),
                    None => break,
                },
                Some(control) = control.recv() => conn.control(control),
                () = sleep_until(next), if next.is_some() => conn.stream_next(),
            }
            if conn.closed {
                break;
            }
        }
        conn.finish();
    }
}

async fn sleep_until(at: Option<Instant>) {
    if let Some(at) = at {
        tokio::time::sleep_until(at).await;
    }
}

/// A client event the real service refuses.
struct Refusal {
    kind: &'static str,
    code: &'static str,
    message: String,
    benign: bool,
}

fn refuse(kind: &'static str, code: &'static str, message: impl Into<String>) -> Refusal {
    Refusal {
        kind,
        code,
        message: message.into(),
        benign: false,
    }
}

struct Item {
    data: Value,
    /// Assistant audio sent for it, in bytes.
    audio_ms: usize,
    audio: bool,
}

/// The response being streamed.
struct Streaming {
    id: String,
    reply: RealtimeReply,
    metadata: Value,
    /// What comes next: audio chunk `i`, then the calls, then the end.
    stage: Stage,
    message: Option<String>,
    output: Vec<String>,
    words: Vec<String>,
    said: String,
    cancelled: Option<&'static str>,
    at: Instant,
}

enum Stage {
    Start,
    Audio(u32),
    EndAudio,
    Call(usize),
    Done,
}

struct Connection {
    sim: Simulator,
    id: u32,
    out: mpsc::UnboundedSender<Outgoing>,
    session: Value,
    voice_locked: bool,
    items: HashMap<String, Item>,
    order: Vec<String>,
    buffered_ms: f64,
    speaking: bool,
    speech_item: Option<String>,
    silence_ms: f64,
    streaming: Option<Streaming>,
    pending_calls: HashSet<String>,
    call_items: HashMap<String, String>,
    outputs_for: HashMap<String, u32>,
    last_audio_item: Option<String>,
    open_start: Option<usize>,
    next_id: u64,
    closed: bool,
}

impl Connection {
    fn new(sim: Simulator, id: u32, out: mpsc::UnboundedSender<Outgoing>) -> Self {
        let fmt = json!({"type": "audio/pcm", "rate": 24000});
        let session = json!({
            "type": "realtime",
            "object": "realtime.session",
            "id": format!("sess_sim{id}"),
            "model": "gpt-realtime",
            "output_modalities": ["audio"],
            "instructions": "",
            "tools": [],
            "tool_choice": "auto",
            "audio": {
                "input": {
                    "format": fmt,
                    "transcription": null,
                    "turn_detection": {
                        "type": "server_vad",
                        "create_response": true,
                        "interrupt_response": true,
                    },
                },
                "output": {"format": fmt, "voice": "marin"},
            },
        });
        Self {
            sim,
            id,
            out,
            session,
            voice_locked: false,
            items: HashMap::new(),
            order: Vec::new(),
            buffered_ms: 0.0,
            speaking: false,
            speech_item: None,
            silence_ms: 0.0,
            streaming: None,
            pending_calls: HashSet::new(),
            call_items: HashMap::new(),
            outputs_for: HashMap::new(),
            last_audio_item: None,
            open_start: None,
            next_id: 0,
            closed: false,
        }
    }

    fn new_id(&mut self, prefix: &str) -> String {
        self.next_id += 1;
        format!("{prefix}_sim{}x{}", self.id, self.next_id)
    }

    fn send(&mut self, mut event: Value) {
        if event.get("event_id").is_none() {
            event["event_id"] = json!(self.new_id("event"));
        }
        if self.out.send(Outgoing::Text(event.to_string())).is_err() {
            self.closed = true;
        }
    }

    fn note(&mut self, kind: &str, benign: bool) {
        let mut state = self.sim.lock();
        let counts = if benign {
            &mut state.report.benign
        } else {
            &mut state.report.violations
        };
        *counts.entry(kind.to_owned()).or_default() += 1;
    }

    fn send_error(&mut self, refusal: Refusal, event: &Value) {
        self.note(refusal.kind, refusal.benign);
        let event_id = event.get("event_id").cloned().unwrap_or(Value::Null);
        self.send(json!({
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "code": refusal.code,
                "message": refusal.message,
                "param": null,
                "event_id": event_id,
            },
        }));
    }

    /// The session's audio format on one `side` ("input" or "output"); the checks of
    /// `session.update` let only these through.
    fn format(&self, side: &str) -> AudioFormat {
        match self.session["audio"][side]["format"]["type"].as_str() {
            Some("audio/pcmu") => AudioFormat::G711Ulaw,
            Some("audio/pcma") => AudioFormat::G711Alaw,
            _ => AudioFormat::PCM16_24K,
        }
    }

    fn turn_detection(&self) -> Option<&Value> {
        let td = &self.session["audio"]["input"]["turn_detection"];
        (!td.is_null()).then_some(td)
    }

    fn insert(&mut self, id: String, item: Item, previous: Option<&str>) -> Value {
        let prev = match previous {
            None => {
                let prev = self.order.last().cloned();
                self.order.push(id.clone());
                prev
            }
            Some("root") => {
                self.order.insert(0, id.clone());
                None
            }
            Some(previous) => {
                let at = self
                    .order
                    .iter()
                    .position(|i| i == previous)
                    .map_or(self.order.len(), |at| at + 1);
                self.order.insert(at, id.clone());
                Some(previous.to_owned())
            }
        };
        self.items.insert(id, item);
        prev.map_or(Value::Null, Value::String)
    }

    fn remove(&mut self, id: &str) {
        self.order.retain(|i| i != id);
        if let Some(item) = self.items.remove(id) {
            if item.data["type"] == "function_call" {
                if let Some(call) = item.data["call_id"].as_str() {
                    self.pending_calls.remove(call);
                    self.call_items.remove(call);
                }
            }
        }
    }

    fn next_reply(&mut self) -> RealtimeReply {
        let mut state = self.sim.lock();
        let SimState { script, next, .. } = &mut *state;
        if *next >= script.replies.len() {
            if script.repeat && !script.replies.is_empty() {
                *next = 0;
            } else {
                return RealtimeReply::speech("(the script is exhausted)");
            }
        }
        let reply = script.replies[*next].clone();
        *next += 1;
        reply
    }

    // ---- client events ---------------------------------------------------------------

    fn handle(&mut self, text: &str) {
        let event: Value = match serde_json::from_str(text) {
            Ok(event) => event,
            Err(_) => {
                self.count_client("<invalid json>");
                let refusal = refuse(
                    "invalid_client_event",
                    "invalid_json",
                    "The server could not parse the JSON event.",
                );
                self.send_error(refusal, &Value::Null);
                return;
            }
        };
        let kind = event["type"].as_str().unwrap_or("<no type>").to_owned();
        self.count_client(&kind);
        if kind != "input_audio_buffer.append" {
            let mut state = self.sim.lock();
            state.report.trace.push((self.id, event.clone()));
            if let Some(at) = self.open_start {
                if let Some(start) = state.report.speech_starts.get_mut(at) {
                    start.client_events.push(kind.clone());
                    if kind == "response.cancel" {
                        start.cancels += 1;
                    }
                    if kind == "conversation.item.delete" {
                        start.deleted = true;
                    }
                }
            }
        }
        let sent_ms = (kind == "conversation.item.truncate")
            .then(|| {
                event["item_id"]
                    .as_str()
                    .and_then(|id| self.items.get(id))
                    .map(|item| item.audio_ms as u32)
            })
            .flatten();
        let result = self.dispatch(&kind, &event);
        if kind == "conversation.item.truncate" {
            if let Some(at) = self.open_start {
                let mut state = self.sim.lock();
                if let Some(start) = state.report.speech_starts.get_mut(at) {
                    if start.truncate.is_none() {
                        start.truncate = Some((
                            event["audio_end_ms"].as_u64().unwrap_or(0) as u32,
                            sent_ms.unwrap_or(0),
                            result.is_ok(),
                        ));
                    }
                }
            }
        }
        if let Err(refusal) = result {
            self.send_error(refusal, &event);
        }
    }

    fn count_client(&self, kind: &str) {
        let mut state = self.sim.lock();
        *state
            .report
            .client_events
            .entry(kind.to_owned())
            .or_default() += 1;
    }

    fn dispatch(&mut self, kind: &str, event: &Value) -> Result<(), Refusal> {
        match kind {
            "session.update" => self.session_update(event),
            "input_audio_buffer.append" => self.append(event),
            "input_audio_buffer.commit" => {
                let item = self
                    .speech_item
                    .take()
                    .unwrap_or_else(|| self.new_id("item"));
                self.speaking = false;
                self.commit(item)
            }
            "input_audio_buffer.clear" => {
                self.buffered_ms = 0.0;
                self.speaking = false;
                self.speech_item = None;
                self.send(json!({"type": "input_audio_buffer.cleared"}));
                Ok(())
            }
            "conversation.item.create" => self.item_create(event),
            "conversation.item.delete" => {
                let id = event["item_id"].as_str().unwrap_or_default().to_owned();
                if !self.items.contains_key(&id) {
                    return Err(refuse(
                        "delete_unknown_item",
                        "item_delete_invalid_item_id",
                        format!("Error deleting item: the item with id '{id}' does not exist."),
                    ));
                }
                self.remove(&id);
                self.send(json!({"type": "conversation.item.deleted", "item_id": id}));
                Ok(())
            }
            "conversation.item.truncate" => self.truncate(event),
            "response.create" => self.response_create(event),
            "response.cancel" => {
                let Some(streaming) = &mut self.streaming else {
                    return Err(Refusal {
                        kind: "cancel_without_active_response",
                        code: "response_cancel_not_active",
                        message: "Cancellation failed: no active response found".to_owned(),
                        benign: true,
                    });
                };
                if let Some(id) = event["response_id"].as_str() {
                    if id != streaming.id {
                        return Err(refuse(
                            "cancel_unknown_response_id",
                            "invalid_value",
                            format!(
                                "Cancellation failed: response '{id}' is not the active response."
                            ),
                        ));
                    }
                }
                streaming.cancelled.get_or_insert("client_cancelled");
                streaming.at = Instant::now();
                Ok(())
            }
            "output_audio_buffer.clear" => Err(refuse(
                "webrtc_only_event_on_websocket",
                "invalid_value",
                "output_audio_buffer.clear is only supported for WebRTC and SIP connections.",
            )),
            other => Err(refuse(
                "invalid_client_event",
                "invalid_value",
                format!("Invalid value: '{other}'."),
            )),
        }
    }

    fn session_update(&mut self, event: &Value) -> Result<(), Refusal> {
        let session = &event["session"];
        if !session.is_object() {
            return Err(refuse(
                "invalid_session_update",
                "missing_required_parameter",
                "Missing required parameter: 'session'.",
            ));
        }
        if session["type"] != "realtime" {
            return Err(refuse(
                "invalid_session_update",
                "missing_required_parameter",
                "Missing required parameter: 'session.type'.",
            ));
        }
        let modalities = &session["output_modalities"];
        if !modalities.is_null()
            && *modalities != json!(["audio"])
            && *modalities != json!(["text"])
        {
            return Err(refuse(
                "invalid_session_update",
                "invalid_value",
                "Invalid modalities: only ['audio'] or ['text'] are supported.",
            ));
        }
        for side in ["input", "output"] {
            let format = &session["audio"][side]["format"];
            if format.is_null() {
                continue;
            }
            match format["type"].as_str() {
                Some("audio/pcm") if format["rate"].as_u64().unwrap_or(24000) == 24000 => {}
                Some("audio/pcmu" | "audio/pcma") => {}
                _ => {
                    return Err(refuse(
                        "invalid_session_update",
                        "invalid_value",
                        format!("Invalid audio format {format}."),
                    ))
                }
            }
        }
        let voice = &session["audio"]["output"]["voice"];
        if !voice.is_null()
            && self.voice_locked
            && *voice != self.session["audio"]["output"]["voice"]
        {
            return Err(refuse(
                "invalid_session_update",
                "cannot_update_voice",
                "Cannot update a conversation's voice if assistant audio is present.",
            ));
        }
        if let Some(tools) = session["tools"].as_array() {
            for tool in tools {
                if tool["type"] != "function" || tool["name"].as_str().is_none_or(str::is_empty) {
                    return Err(refuse(
                        "invalid_session_update",
                        "invalid_value",
                        format!("Invalid tool {tool}."),
                    ));
                }
            }
        }
        if let Some(fields) = session.as_object() {
            for (key, value) in fields {
                if key == "audio" {
                    for side in ["input", "output"] {
                        if let Some(side_fields) = value[side].as_object() {
                            for (k, v) in side_fields {
                                let mut v = v.clone();
                                if k == "turn_detection" && v.is_object() {
                                    if v.get("create_response").is_none() {
                                        v["create_response"] = json!(true);
                                    }
                                    if v.get("interrupt_response").is_none() {
                                        v["interrupt_response"] = json!(true);
                                    }
                                }
                                self.session["audio"][side][k] = v;
                            }
                        }
                    }
                } else if key != "type" {
                    self.session[key] = value.clone();
                }
            }
        }
        let session = self.session.clone();
        self.send(json!({"type": "session.updated", "session": session}));
        Ok(())
    }

    fn append(&mut self, event: &Value) -> Result<(), Refusal> {
        let Some(audio) = event["audio"].as_str() else {
            return Err(refuse(
                "invalid_audio_append",
                "missing_required_parameter",
                "Missing required parameter: 'audio'.",
            ));
        };
        let Ok(raw) = B64.decode(audio) else {
            return Err(refuse(
                "invalid_audio_append",
                "invalid_value",
                "Invalid 'audio'. Expected base64-encoded audio.",
            ));
        };
        let format = self.format("input");
        if matches!(format, AudioFormat::Pcm16 { .. }) && raw.len() % 2 == 1 {
            return Err(refuse(
                "invalid_audio_append",
                "invalid_value",
                "PCM16 audio must have an even number of bytes.",
            ));
        }
        let ms = raw.len() as f64 / f64::from(format.bytes_per_ms());
        self.buffered_ms += ms;
        self.sim.lock().report.audio_in_ms += ms as u64;
        if self.turn_detection().is_none() {
            return Ok(());
        }
        let (threshold, silence) = {
            let state = self.sim.lock();
            (state.script.vad_threshold, state.script.vad_silence)
        };
        let peak = g711::peak(format, &raw);
        let speech = peak >= threshold.unsigned_abs();
        if !self.speaking {
            if speech {
                self.speech_started();
            }
            return Ok(());
        }
        if speech {
            self.silence_ms = 0.0;
            return Ok(());
        }
        self.silence_ms += ms;
        if self.silence_ms >= silence.as_millis() as f64 {
            self.speech_stopped();
        }
        Ok(())
    }

    fn control(&mut self, control: Control) {
        match control {
            Control::SpeechStarted => {
                if !self.speaking {
                    self.speech_started();
                }
            }
            Control::SpeechStopped => {
                if self.speaking {
                    // Enough audio for a turn, as if the user had spoken it.
                    self.buffered_ms = self.buffered_ms.max(300.0);
                    self.speech_stopped();
                }
            }
        }
    }

    fn speech_started(&mut self) {
        self.speaking = true;
        self.silence_ms = 0.0;
        let item = self.new_id("item");
        self.speech_item = Some(item.clone());
        self.send(json!({"type": "input_audio_buffer.speech_started", "audio_start_ms": 0, "item_id": item}));
        let active = self.streaming.is_some();
        let interrupts = self
            .turn_detection()
            .is_some_and(|td| td["interrupt_response"] != false);
        let audio_sent_ms = self
            .last_audio_item
            .as_ref()
            .and_then(|id| self.items.get(id))
            .map(|item| item.audio_ms as u32);
        let start = SpeechStart {
            response_active: active,
            server_cancelled: active && interrupts,
            audio_sent_ms,
            ..SpeechStart::default()
        };
        {
            let mut state = self.sim.lock();
            state.report.speech_starts.push(start);
            self.open_start = Some(state.report.speech_starts.len() - 1);
        }
        if active && interrupts {
            if let Some(streaming) = &mut self.streaming {
                streaming.cancelled.get_or_insert("turn_detected");
            }
            // The server stops at once: the rest of the response is its end.
            while self.streaming.is_some() && !self.closed {
                self.stream_next();
            }
        }
    }

    fn speech_stopped(&mut self) {
        self.speaking = false;
        let item = self
            .speech_item
            .take()
            .unwrap_or_else(|| self.new_id("item"));
        self.send(json!({"type": "input_audio_buffer.speech_stopped", "audio_end_ms": 0, "item_id": item}));
        if self.buffered_ms < 100.0 {
            return;
        }
        if self.commit(item).is_err() {
            return;
        }
        let create = self
            .turn_detection()
            .is_some_and(|td| td["create_response"] != false);
        if create && self.streaming.is_none() {
            let reply = self.next_reply();
            self.start_response(reply, Value::Null, "vad");
        }
    }

    fn commit(&mut self, item_id: String) -> Result<(), Refusal> {
        let ms = self.buffered_ms as usize;
        if ms < 100 {
            return Err(refuse(
                "commit_empty_buffer",
                "input_audio_buffer_commit_empty",
                format!("Error committing input audio buffer: buffer too small. Expected at least 100ms of audio, but buffer only has {ms}ms of audio."),
            ));
        }
        self.buffered_ms = 0.0;
        let data = json!({
            "id": item_id, "object": "realtime.item", "type": "message", "status": "completed",
            "role": "user", "content": [{"type": "input_audio", "transcript": null}],
        });
        let prev = self.insert(
            item_id.clone(),
            Item {
                data: data.clone(),
                audio_ms: 0,
                audio: false,
            },
            None,
        );
        self.send(json!({"type": "input_audio_buffer.committed", "previous_item_id": prev, "item_id": item_id}));
        self.send(
            json!({"type": "conversation.item.added", "previous_item_id": prev, "item": data}),
        );
        self.send(
            json!({"type": "conversation.item.done", "previous_item_id": prev, "item": data}),
        );
        if !self.session["audio"]["input"]["transcription"].is_null() {
            let text = self.sim.lock().script.user_transcript.clone();
            self.send(json!({"type": "conversation.item.input_audio_transcription.delta", "item_id": item_id, "content_index": 0, "delta": text}));
            self.send(json!({
                "type": "conversation.item.input_audio_transcription.completed", "item_id": item_id,
                "content_index": 0, "transcript": text,
            }));
        }
        Ok(())
    }

    fn item_create(&mut self, event: &Value) -> Result<(), Refusal> {
        let item = &event["item"];
        if !item.is_object() {
            return Err(refuse(
                "invalid_conversation_item",
                "missing_required_parameter",
                "Missing required parameter: 'item'.",
            ));
        }
        let kind = item["type"].as_str().unwrap_or_default().to_owned();
        let id = match item["id"].as_str() {
            Some(id) => id.to_owned(),
            None => self.new_id("item"),
        };
        if id.len() > MAX_ID {
            return Err(refuse(
                "invalid_conversation_item",
                "string_above_max_length",
                format!(
                    "Invalid 'item.id': string too long ({} > {MAX_ID}).",
                    id.len()
                ),
            ));
        }
        if self.items.contains_key(&id) {
            return Err(refuse(
                "invalid_conversation_item",
                "item_create_duplicate_item_id",
                format!("Item with item_id '{id}' already exists."),
            ));
        }
        let previous = event["previous_item_id"].as_str().map(str::to_owned);
        if let Some(previous) = &previous {
            if previous != "root" && !self.items.contains_key(previous) {
                return Err(refuse(
                    "invalid_conversation_item",
                    "item_create_invalid_previous_item_id",
                    format!(
                        "Error adding item: the previous item with id '{previous}' does not exist."
                    ),
                ));
            }
        }
        let mut data =
            json!({"id": id, "object": "realtime.item", "type": kind, "status": "completed"});
        match kind.as_str() {
            "message" => {
                let role = item["role"].as_str().unwrap_or_default();
                let allowed: &[&str] = match role {
                    "user" => &["input_text", "input_audio", "input_image"],
                    "system" => &["input_text"],
                    "assistant" => &["output_text"],
                    _ => {
                        return Err(refuse(
                            "invalid_conversation_item",
                            "invalid_value",
                            format!("Invalid value: '{role}' for item.role."),
                        ))
                    }
                };
                let Some(content) = item["content"].as_array() else {
                    return Err(refuse(
                        "invalid_conversation_item",
                        "missing_required_parameter",
                        "Missing required parameter: 'item.content'.",
                    ));
                };
                for part in content {
                    let part_kind = part["type"].as_str().unwrap_or_default();
                    if !allowed.contains(&part_kind) {
                        return Err(refuse(
                            "invalid_conversation_item",
                            "invalid_value",
                            format!("Invalid content type '{part_kind}' for a {role} message."),
                        ));
                    }
                }
                data["role"] = json!(role);
                data["content"] = json!(content);
            }
            "function_call" => {
                let call = item["call_id"].as_str().unwrap_or_default().to_owned();
                check_call_id(&call)?;
                if item["name"].as_str().is_none_or(str::is_empty) {
                    return Err(refuse(
                        "invalid_conversation_item",
                        "missing_required_parameter",
                        "function_call items need a name and string arguments.",
                    ));
                }
                data["call_id"] = json!(call);
                data["name"] = item["name"].clone();
                data["arguments"] = item["arguments"].clone();
            }
            "function_call_output" => {
                let call = item["call_id"].as_str().unwrap_or_default().to_owned();
                check_call_id(&call)?;
                if !self.call_items.contains_key(&call) {
                    return Err(refuse(
                        "function_call_output_unknown_call_id",
                        "invalid_tool_call_id",
                        format!("Tool call ID '{call}' not found in conversation."),
                    ));
                }
                data["call_id"] = json!(call);
                data["output"] = item["output"].clone();
            }
            other => {
                return Err(refuse(
                    "invalid_conversation_item",
                    "invalid_value",
                    format!("Invalid value: '{other}' for item.type."),
                ))
            }
        }
        let prev = self.insert(
            id.clone(),
            Item {
                data: data.clone(),
                audio_ms: 0,
                audio: false,
            },
            previous.as_deref(),
        );
        match kind.as_str() {
            "function_call" => {
                let call = data["call_id"].as_str().unwrap_or_default().to_owned();
                self.call_items.insert(call.clone(), id);
                self.pending_calls.insert(call);
            }
            "function_call_output" => {
                let call = data["call_id"].as_str().unwrap_or_default().to_owned();
                let count = self.outputs_for.entry(call.clone()).or_default();
                *count += 1;
                if *count > 1 {
                    self.note("duplicate_function_call_output", true);
                }
                self.pending_calls.remove(&call);
            }
            _ => {}
        }
        self.send(
            json!({"type": "conversation.item.added", "previous_item_id": prev, "item": data}),
        );
        self.send(
            json!({"type": "conversation.item.done", "previous_item_id": prev, "item": data}),
        );
        Ok(())
    }

    fn truncate(&mut self, event: &Value) -> Result<(), Refusal> {
        let id = event["item_id"].as_str().unwrap_or_default().to_owned();
        let Some(end) = event["audio_end_ms"].as_u64() else {
            return Err(refuse(
                "truncate_invalid_target",
                "invalid_value",
                "audio_end_ms must be a non-negative integer.",
            ));
        };
        let Some(item) = self.items.get_mut(&id) else {
            return Err(refuse(
                "truncate_invalid_target",
                "item_truncate_invalid_item_id",
                format!("Error truncating item: the item with id '{id}' does not exist."),
            ));
        };
        if item.data["role"] != "assistant" || !item.audio {
            return Err(refuse(
                "truncate_invalid_target",
                "unsupported_content_type",
                "Only model output audio messages can be truncated",
            ));
        }
        if event["content_index"] != 0 {
            return Err(refuse(
                "truncate_invalid_target",
                "invalid_value",
                "Invalid content_index: the item has audio at content_index 0.",
            ));
        }
        let have = item.audio_ms as u64;
        if end > have {
            return Err(refuse(
                "truncate_beyond_sent_audio",
                "invalid_value",
                format!("Audio content of {have}ms is already shorter than {end}ms"),
            ));
        }
        item.audio_ms = end as usize;
        item.data["content"] = json!([{"type": "output_audio", "transcript": ""}]);
        self.send(json!({"type": "conversation.item.truncated", "item_id": id, "content_index": 0, "audio_end_ms": end}));
        Ok(())
    }

    fn response_create(&mut self, event: &Value) -> Result<(), Refusal> {
        let params = event.get("response").cloned().unwrap_or(json!({}));
        if let Some(streaming) = &self.streaming {
            return Err(refuse(
                "response_create_while_active",
                "conversation_already_has_active_response",
                format!("Conversation already has an active response in progress: {}. Wait until the response is finished before creating a new one.", streaming.id),
            ));
        }
        if !self.pending_calls.is_empty() {
            self.note("response_create_with_pending_function_calls", false);
        }
        let reply = self.next_reply();
        let metadata = params.get("metadata").cloned().unwrap_or(Value::Null);
        self.start_response(reply, metadata, "client");
        Ok(())
    }

    // ---- responses -------------------------------------------------------------------

    fn start_response(&mut self, reply: RealtimeReply, metadata: Value, origin: &str) {
        let id = self.new_id("resp");
        *self
            .sim
            .lock()
            .report
            .responses
            .entry(format!("created_{origin}"))
            .or_default() += 1;
        self.open_start = None;
        // As the service streams it: each word after the first with its space before it.
        let words = reply
            .transcript
            .split_whitespace()
            .enumerate()
            .map(|(i, w)| {
                if i == 0 {
                    w.to_owned()
                } else {
                    format!(" {w}")
                }
            })
            .collect();
        self.streaming = Some(Streaming {
            id,
            reply,
            metadata,
            stage: Stage::Start,
            message: None,
            output: Vec::new(),
            words,
            said: String::new(),
            cancelled: None,
            at: Instant::now(),
        });
    }

    /// Sends the next unit of the response being streamed.
    fn stream_next(&mut self) {
        let Some(mut streaming) = self.streaming.take() else {
            return;
        };
        let rid = streaming.id.clone();
        let pace = streaming.reply.pace;
        match streaming.stage {
            Stage::Start => {
                self.send(json!({"type": "response.created", "response": self.response_obj(&streaming, "in_progress", Value::Null, false)}));
                streaming.stage = if streaming.reply.chunks > 0 && streaming.cancelled.is_none() {
                    let item = self.new_id("item");
                    let data = json!({"id": item, "object": "realtime.item", "type": "message", "status": "in_progress", "role": "assistant", "content": []});
                    let prev = self.insert(
                        item.clone(),
                        Item {
                            data: data.clone(),
                            audio_ms: 0,
                            audio: true,
                        },
                        None,
                    );
                    self.last_audio_item = Some(item.clone());
                    self.voice_locked = true;
                    self.send(json!({"type": "response.output_item.added", "response_id": rid, "output_index": 0, "item": data}));
                    self.send(json!({"type": "conversation.item.added", "previous_item_id": prev, "item": data}));
                    self.send(json!({"type": "response.content_part.added", "response_id": rid, "item_id": item, "output_index": 0, "content_index": 0, "part": {"type": "audio", "transcript": ""}}));
                    streaming.output.push(item.clone());
                    streaming.message = Some(item);
                    Stage::Audio(0)
                } else {
                    Stage::Call(0)
                };
            }
            Stage::Audio(i) => {
                if streaming.cancelled.is_some() || i >= streaming.reply.chunks {
                    streaming.stage = Stage::EndAudio;
                } else if streaming.reply.drop_after == Some(i) {
                    // The network fault the script asks for: the server goes away.
                    self.streaming = None;
                    self.closed = true;
                    let _ = self.out.send(Outgoing::Close);
                    return;
                } else {
                    let item = streaming.message.clone().unwrap_or_default();
                    if let Some(word) = streaming.words.get(i as usize).cloned() {
                        streaming.said.push_str(&word);
                        self.send(json!({"type": "response.output_audio_transcript.delta", "response_id": rid, "item_id": item, "output_index": 0, "content_index": 0, "delta": word}));
                    }
                    let ms = streaming.reply.chunk.as_millis() as usize;
                    self.send(json!({"type": "response.output_audio.delta", "response_id": rid, "item_id": item, "output_index": 0, "content_index": 0, "delta": audio_chunk(ms, self.format("output"))}));
                    if let Some(item) = self.items.get_mut(&item) {
                        item.audio_ms += ms;
                    }
                    self.sim.lock().report.audio_out_ms += ms as u64;
                    streaming.stage = Stage::Audio(i + 1);
                    streaming.at = Instant::now() + pace;
                    self.streaming = Some(streaming);
                    return;
                }
            }
            Stage::EndAudio => {
                let item = streaming.message.clone().unwrap_or_default();
                if streaming.cancelled.is_none() {
                    let spoken = streaming.reply.chunks as usize;
                    for word in streaming
                        .words
                        .iter()
                        .skip(spoken)
                        .cloned()
                        .collect::<Vec<_>>()
                    {
                        streaming.said.push_str(&word);
                        self.send(json!({"type": "response.output_audio_transcript.delta", "response_id": rid, "item_id": item, "output_index": 0, "content_index": 0, "delta": word}));
                    }
                }
                let said = streaming.said.trim().to_owned();
                let status = if streaming.cancelled.is_none() {
                    "completed"
                } else {
                    "incomplete"
                };
                let data = json!({"id": item, "object": "realtime.item", "type": "message", "status": status, "role": "assistant", "content": [{"type": "output_audio", "transcript": said}]});
                if let Some(stored) = self.items.get_mut(&item) {
                    stored.data = data.clone();
                }
                self.send(json!({"type": "response.output_audio.done", "response_id": rid, "item_id": item, "output_index": 0, "content_index": 0}));
                self.send(json!({"type": "response.output_audio_transcript.done", "response_id": rid, "item_id": item, "output_index": 0, "content_index": 0, "transcript": said}));
                self.send(json!({"type": "response.content_part.done", "response_id": rid, "item_id": item, "output_index": 0, "content_index": 0, "part": {"type": "audio", "transcript": said}}));
                self.send(json!({"type": "response.output_item.done", "response_id": rid, "output_index": 0, "item": data}));
                if self.items.contains_key(&item) {
                    self.send(json!({"type": "conversation.item.done", "item": data}));
                }
                streaming.stage = Stage::Call(0);
            }
            Stage::Call(j) => {
                if streaming.cancelled.is_some() || j >= streaming.reply.calls.len() {
                    streaming.stage = Stage::Done;
                } else {
                    let (name, arguments) = streaming.reply.calls[j].clone();
                    let call = self.new_id("call");
                    let item = self.new_id("item");
                    let index = streaming.output.len();
                    let data = json!({"id": item, "object": "realtime.item", "type": "function_call", "status": "in_progress", "name": name, "call_id": call, "arguments": ""});
                    let prev = self.insert(
                        item.clone(),
                        Item {
                            data: data.clone(),
                            audio_ms: 0,
                            audio: false,
                        },
                        None,
                    );
                    self.send(json!({"type": "response.output_item.added", "response_id": rid, "output_index": index, "item": data}));
                    self.send(json!({"type": "conversation.item.added", "previous_item_id": prev, "item": data}));
                    let (a, b) = arguments.split_at(arguments.len() / 2);
                    for piece in [a, b] {
                        self.send(json!({"type": "response.function_call_arguments.delta", "response_id": rid, "item_id": item, "output_index": index, "call_id": call, "delta": piece}));
                    }
                    let mut done = data.clone();
                    done["arguments"] = json!(arguments);
                    done["status"] = json!("completed");
                    if let Some(stored) = self.items.get_mut(&item) {
                        stored.data = done.clone();
                    }
                    self.send(json!({"type": "response.function_call_arguments.done", "response_id": rid, "item_id": item, "output_index": index, "call_id": call, "name": name, "arguments": arguments}));
                    self.send(json!({"type": "response.output_item.done", "response_id": rid, "output_index": index, "item": done}));
                    self.send(json!({"type": "conversation.item.done", "item": done}));
                    self.call_items.insert(call.clone(), item.clone());
                    self.pending_calls.insert(call);
                    streaming.output.push(item);
                    streaming.stage = Stage::Call(j + 1);
                }
            }
            Stage::Done => {
                let (status, details) = match streaming.cancelled {
                    None => ("completed", Value::Null),
                    Some(reason) => ("cancelled", json!({"type": "cancelled", "reason": reason})),
                };
                let key = match streaming.cancelled {
                    None => "completed".to_owned(),
                    Some(reason) => format!("cancelled_{reason}"),
                };
                *self.sim.lock().report.responses.entry(key).or_default() += 1;
                let response = self.response_obj(&streaming, status, details, true);
                self.send(json!({"type": "response.done", "response": response}));
                return;
            }
        }
        streaming.at = Instant::now();
        self.streaming = Some(streaming);
    }

    fn response_obj(
        &self,
        streaming: &Streaming,
        status: &str,
        details: Value,
        output: bool,
    ) -> Value {
        let output: Vec<Value> = if output {
            streaming
                .output
                .iter()
                .filter_map(|id| self.items.get(id).map(|i| i.data.clone()))
                .collect()
        } else {
            Vec::new()
        };
        let out_tokens = streaming.reply.chunks / 5 + 5;
        json!({
            "object": "realtime.response",
            "id": streaming.id,
            "status": status,
            "status_details": details,
            "output": output,
            "output_modalities": ["audio"],
            "usage": if status == "in_progress" { Value::Null } else { json!({
                "total_tokens": 100 + out_tokens, "input_tokens": 100, "output_tokens": out_tokens,
                "input_token_details": {"text_tokens": 80, "audio_tokens": 20, "cached_tokens": 0},
                "output_token_details": {"text_tokens": 5, "audio_tokens": out_tokens - 5},
            })},
            "metadata": streaming.metadata,
        })
    }

    /// The client left: a response still streaming ends, unsent.
    fn finish(&mut self) {
        self.streaming = None;
        let _ = self.out.send(Outgoing::Close);
    }
}

fn check_call_id(call: &str) -> Result<(), Refusal> {
    let valid = !call.is_empty()
        && call.len() <= MAX_ID
        && call
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if valid {
        Ok(())
    } else {
        Err(refuse(
            "invalid_conversation_item",
            "invalid_value",
            format!("Invalid 'item.call_id': '{call}'. Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$' with maximum length {MAX_ID}."),
        ))
    }
}

/// Base64 of `ms` of a 440 Hz tone in `format`, made once per length and format.
fn audio_chunk(ms: usize, format: AudioFormat) -> String {
    static CACHE: Mutex<Option<(usize, AudioFormat, String)>> = Mutex::new(None);
    let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((cached, cached_format, text)) = &*cache {
        if *cached == ms && *cached_format == format {
            return text.clone();
        }
    }
    let text = B64.encode(tone_in(format, ms as u32));
    *cache = Some((ms, format, text.clone()));
    text
}
