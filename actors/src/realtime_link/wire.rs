//! The realtime protocol's rules as a plain type: what the engine may send when, and where
//! each server event goes. The link's task (`realtime_link.rs`) feeds it the activity's
//! requests and the server's events and carries out what it pushes; nothing here does I/O.
//!
//! A response is one step of the activity's turn: the step's text, audio and calls are the
//! response's events, in order, and its end is the response's end. A step either asks for a
//! response (`response.create`, tagged with the step) or — the first step of a user turn
//! the server detected — adopts the response the server started by itself.
//!
//! The rules, each a unit test below:
//! - One response at a time: a step's `response.create` waits while a response is active
//!   or asked for, while the user speaks, while the server is about to answer a turn it
//!   detected (from the moment it heard the user stop), and after a reconnection until
//!   the conversation is replayed. A refusal
//!   ("conversation already has an active response") puts the request back; it is sent
//!   again once the active response ended.
//! - Before a `response.create` goes, every call the model made that no chat item took is
//!   deleted (the mirror), so no response is asked with a call unanswered.
//! - A step cancelled while its response runs sends `response.cancel` — unless the server
//!   already cancelled it (it does when the user starts speaking and `interrupt_response`
//!   is on) or a cancel was sent: never a second one. A step cancelled before its response
//!   started cancels the response when it starts; one not yet sent is never sent.
//! - A truncation goes once per item, after its response ended, at the heard position
//!   clamped to the audio received for the item; nothing heard deletes the item instead.
//! - A response the server starts by itself goes to the step waiting to adopt one, or is
//!   held (its events kept in order) until the user turn's step adopts it.
//! - A dropped connection: the step whose response was cut ends if the model's calls
//!   came (they run; their outputs go to the new connection), else it is asked again on
//!   the new connection after the replay, with what the model had said so far.
//! - The session is set up on each connection before anything else; a new agent's
//!   instructions, tools and voice go as one update before anything of its chat, and the
//!   voice only while the model has not spoken on the connection (OpenAI refuses it after).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::mirror::Mirror;
use crate::chat::{ChatContext, ChatRole};
use crate::llm::{LlmError, LlmUsage, ToolCallChunk, ToolChoice, ToolSchema};
use crate::output::SpeechId;
use crate::realtime::{
    response_tag, ClientEvent, OutputKind, Place, RealtimeCapabilities, RealtimeSettings,
    RemoteItem, ResponseStatus, ServerEvent, SessionUpdate,
};

/// How long the engine waits for the response the server starts by itself after a turn
/// it detected, before it asks for one of its own.
const AUTO_RESPONSE_WAIT: Duration = Duration::from_secs(2);

/// How long the engine waits, after the server heard the user stop, for the server to
/// commit the turn (it does at once; a blip too short for a turn is never committed).
const COMMIT_WAIT: Duration = Duration::from_millis(500);

/// How long a `response.create` may go unanswered before it is given up.
const CREATE_WAIT: Duration = Duration::from_secs(10);

/// Responses the server started by itself that no step took yet (their turns never ran
/// are dropped beyond it).
const MAX_UNCLAIMED: usize = 2;

/// What the attached agent shows the model.
#[derive(Clone, Debug)]
pub(crate) struct AgentConfig {
    pub(crate) instructions: Arc<str>,
    pub(crate) tools: Arc<[ToolSchema]>,
    pub(crate) voice: Option<String>,
}

/// A step's request for a response.
#[derive(Clone, Debug, Default)]
pub(crate) struct Ask {
    pub(crate) step: u64,
    /// Instructions for this response only.
    pub(crate) instructions: Option<String>,
    pub(crate) tool_choice: ToolChoice,
    /// What the model said before the connection dropped (asked again after a replay).
    pub(crate) said: String,
    /// Asked again after a drop: its text goes on from what was said.
    continues: bool,
    /// Cancelled after it was sent: its response is cancelled when it starts.
    cancelled: bool,
}

impl Ask {
    /// A request of step `step`.
    pub(crate) fn new(step: u64, instructions: Option<String>, tool_choice: ToolChoice) -> Self {
        Self {
            step,
            instructions,
            tool_choice,
            ..Self::default()
        }
    }
}

/// A piece of a step's answer.
#[derive(Debug)]
pub(crate) enum StepEvent {
    /// A message of the model starts (its audio and text follow).
    Message { item: String },
    /// Text of what the model says.
    Text(String),
    /// The model's audio.
    Audio(Vec<u8>),
    /// A complete call.
    Call(ToolCallChunk),
    /// The response ended (with the model's error if it failed).
    Done {
        usage: Option<LlmUsage>,
        failure: Option<LlmError>,
    },
}

/// What the user did, as the server heard it; the session hears it as it hears a host's
/// VAD and STT.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum UserSignal {
    Started,
    Stopped,
    /// The user's turn ended: their audio is item `item`.
    Heard {
        item: String,
    },
    /// The transcript of item `item`.
    Transcript {
        item: String,
        text: String,
    },
}

/// What the link's task does.
#[derive(Debug)]
pub(crate) enum Out {
    Send(ClientEvent),
    Step(u64, StepEvent),
    User(UserSignal),
    /// A server error the engine did not expect (logged, and an error event).
    Error(String),
}

/// Who a running response's events go to.
#[derive(Debug)]
enum Claim {
    Step(u64),
    /// Started by the server; held until a step adopts it.
    Unclaimed(Vec<StepEvent>),
    /// Its step is gone: its events are dropped.
    Dropped,
}

/// The response the server runs.
#[derive(Debug)]
struct Active {
    response: String,
    claim: Claim,
    /// The server cancels it (the user started speaking with `interrupt_response` on).
    server_cancelled: bool,
    cancel_sent: bool,
    /// Its message items with the audio received for each, in bytes.
    items: Vec<(String, usize)>,
    /// The request it answers, if the engine asked for it.
    ask: Option<Ask>,
    /// The model's calls came.
    calls: bool,
    /// What the model said so far.
    text: String,
}

/// The protocol state of one realtime connection (see the module docs).
pub(crate) struct Wire {
    settings: RealtimeSettings,
    caps: RealtimeCapabilities,
    mirror: Mirror,
    /// The agent configuration the session has now.
    sent: Option<AgentConfig>,
    /// The model spoke on this connection (its voice is fixed from then on).
    spoke: bool,
    user_speaking: bool,
    active: Option<Active>,
    in_flight: Option<(Ask, Instant)>,
    waiting: VecDeque<Ask>,
    adopting: VecDeque<u64>,
    /// The server is about to answer a turn it detected (until then).
    auto_expected: Option<Instant>,
    unclaimed: VecDeque<Vec<StepEvent>>,
    /// Audio received per message item of responses that ended, in bytes.
    audio: HashMap<String, usize>,
    /// Truncations waiting for their item's response to end.
    deferred: Vec<(String, u32)>,
    truncated: HashSet<String>,
    /// The conversation was replayed since the last (re)connection.
    replayed: bool,
}

impl Wire {
    pub(crate) fn new(settings: RealtimeSettings, caps: RealtimeCapabilities) -> Self {
        Self {
            settings,
            caps,
            mirror: Mirror::default(),
            sent: None,
            spoke: false,
            user_speaking: false,
            active: None,
            in_flight: None,
            waiting: VecDeque::new(),
            adopting: VecDeque::new(),
            auto_expected: None,
            unclaimed: VecDeque::new(),
            audio: HashMap::new(),
            deferred: Vec::new(),
            truncated: HashSet::new(),
            replayed: true,
        }
    }

    /// A connection opened: its session is set up first, with the attached agent's
    /// configuration if there is one.
    pub(crate) fn connected(&mut self, out: &mut Vec<Out>) {
        let (instructions, tools, voice) = match &self.sent {
            Some(c) => (
                Some(c.instructions.clone()),
                Some(c.tools.clone()),
                c.voice.clone().or_else(|| self.settings.voice.clone()),
            ),
            None => (None, None, self.settings.voice.clone()),
        };
        out.push(Out::Send(ClientEvent::UpdateSession(SessionUpdate {
            instructions,
            tools,
            voice,
            settings: Some(self.settings.clone()),
        })));
    }

    /// An agent takes the connection: its configuration, then its chat.
    pub(crate) fn attach(
        &mut self,
        config: AgentConfig,
        chat: &ChatContext,
        now: Instant,
        out: &mut Vec<Out>,
    ) {
        let mut update = SessionUpdate {
            instructions: None,
            tools: None,
            voice: None,
            settings: None,
        };
        let old = self.sent.as_ref();
        if old.is_none_or(|o| !same_text(&o.instructions, &config.instructions)) {
            update.instructions = Some(config.instructions.clone());
        }
        if old.is_none_or(|o| !Arc::ptr_eq(&o.tools, &config.tools) && o.tools != config.tools) {
            update.tools = Some(config.tools.clone());
        }
        let voice_now = old.and_then(|o| o.voice.clone());
        if config.voice.is_some() && config.voice != voice_now {
            if !self.spoke || self.caps.voice_change_after_audio {
                update.voice = config.voice.clone();
            } else {
                tracing::debug!(voice = ?config.voice, "the model has spoken on this connection: its voice stays");
            }
        }
        if update.instructions.is_some() || update.tools.is_some() || update.voice.is_some() {
            out.push(Out::Send(ClientEvent::UpdateSession(update)));
        }
        self.sent = Some(config);
        self.sync(chat, now, out);
    }

    /// Makes the remote conversation follow `chat` (after a reconnection, the replay:
    /// requests held back go after it).
    pub(crate) fn sync(&mut self, chat: &ChatContext, now: Instant, out: &mut Vec<Out>) {
        let mut events = Vec::new();
        self.mirror.sync(chat, &mut events);
        out.extend(events.into_iter().map(Out::Send));
        if !self.replayed {
            self.replayed = true;
            self.pump(now, out);
        }
    }

    /// A step opens: the conversation is synced, then the step adopts the response the
    /// server started for the user's turn (`adopt`), or asks for one.
    pub(crate) fn open(
        &mut self,
        ask: Ask,
        adopt: bool,
        chat: &ChatContext,
        now: Instant,
        out: &mut Vec<Out>,
    ) {
        self.sync(chat, now, out);
        let step = ask.step;
        if adopt {
            if let Some(active) = &mut self.active {
                if let Claim::Unclaimed(held) = &mut active.claim {
                    let held = std::mem::take(held);
                    active.claim = Claim::Step(step);
                    out.extend(held.into_iter().map(|e| Out::Step(step, e)));
                    return;
                }
            }
            if let Some(held) = self.unclaimed.pop_front() {
                out.extend(held.into_iter().map(|e| Out::Step(step, e)));
                return;
            }
            if self.auto_expected.is_some() {
                self.adopting.push_back(step);
                return;
            }
        }
        self.waiting.push_back(ask);
        self.pump(now, out);
    }

    /// A step ends before its response did (an interruption, a pause, a close).
    pub(crate) fn cancel(&mut self, step: u64, out: &mut Vec<Out>) {
        if let Some(at) = self.waiting.iter().position(|a| a.step == step) {
            self.waiting.remove(at);
            return;
        }
        if let Some(at) = self.adopting.iter().position(|s| *s == step) {
            self.adopting.remove(at);
            return;
        }
        if let Some((ask, _)) = &mut self.in_flight {
            if ask.step == step {
                ask.cancelled = true;
                return;
            }
        }
        if let Some(active) = &mut self.active {
            if matches!(active.claim, Claim::Step(s) if s == step) {
                active.claim = Claim::Dropped;
                if !active.server_cancelled && !active.cancel_sent {
                    active.cancel_sent = true;
                    out.push(Out::Send(ClientEvent::CancelResponse {
                        response_id: active.response.clone(),
                    }));
                }
            }
        }
    }

    /// The activity played speech `speech` from the model's item `item`.
    pub(crate) fn spoke(&mut self, speech: SpeechId, item: String) {
        self.mirror.spoke(speech, item);
    }

    /// The user heard `heard_ms` of speech `speech` before it was cut.
    pub(crate) fn truncate(&mut self, speech: SpeechId, heard_ms: u32, out: &mut Vec<Out>) {
        let Some(item) = self.mirror.item_of(speech).map(str::to_owned) else {
            return;
        };
        if self.truncated.contains(&item) || self.mirror.is_deleted(&item) {
            return;
        }
        let running = self.active.as_ref().and_then(|a| {
            a.items
                .iter()
                .find(|(id, _)| *id == item)
                .map(|(_, bytes)| (*bytes, a.server_cancelled || a.cancel_sent))
        });
        match running {
            // Cancelled (by the server at the user's speech, or by our cancel, which the
            // socket carries first): the server has stopped its audio by the time it
            // reads the cut, so it goes now, before the audio that follows it — the
            // user's next words must not be answered before the model knows what was
            // heard. Clamped to what came so far, which is all the user could hear.
            Some((bytes, true)) => self.cut_at(item, heard_ms, bytes, out),
            Some((_, false)) => {
                if !self.deferred.iter().any(|(id, _)| *id == item) {
                    self.deferred.push((item, heard_ms));
                }
            }
            None => self.cut(item, heard_ms, out),
        }
    }

    /// Cuts `item` at `heard_ms`, clamped to the audio received; deletes it if nothing of
    /// it was heard.
    fn cut(&mut self, item: String, heard_ms: u32, out: &mut Vec<Out>) {
        let Some(&bytes) = self.audio.get(&item) else {
            // Not an item of this connection (a replay made it text).
            return;
        };
        self.cut_at(item, heard_ms, bytes, out);
    }

    /// Cuts `item`, of which `bytes` of audio came, at `heard_ms`.
    fn cut_at(&mut self, item: String, heard_ms: u32, bytes: usize, out: &mut Vec<Out>) {
        let received_ms =
            u32::try_from(bytes / self.settings.output_format.bytes_per_ms() as usize)
                .unwrap_or(u32::MAX);
        let at = heard_ms.min(received_ms);
        self.truncated.insert(item.clone());
        if at == 0 {
            self.mirror.deleted(&item);
            out.push(Out::Send(ClientEvent::DeleteItem { id: item }));
        } else if self.caps.truncation {
            out.push(Out::Send(ClientEvent::TruncateItem {
                id: item,
                audio_end_ms: at,
            }));
        }
    }

    /// One event from the server.
    pub(crate) fn on_event(&mut self, event: ServerEvent, now: Instant, out: &mut Vec<Out>) {
        match event {
            // The hot path first: a piece of the model's audio.
            ServerEvent::AudioDelta { item_id, audio, .. } => {
                self.spoke = true;
                if let Some(active) = &mut self.active {
                    match active.items.iter_mut().rev().find(|(id, _)| *id == item_id) {
                        Some((_, bytes)) => *bytes += audio.len(),
                        None => active.items.push((item_id, audio.len())),
                    }
                }
                self.route(StepEvent::Audio(audio), out);
            }
            ServerEvent::TextDelta { delta, .. } => {
                if let Some(active) = &mut self.active {
                    active.text.push_str(&delta);
                }
                self.route(StepEvent::Text(delta), out);
            }
            ServerEvent::OutputItemAdded { item_id, kind, .. } => {
                if kind == OutputKind::Message {
                    if let Some(active) = &mut self.active {
                        active.items.push((item_id.clone(), 0));
                    }
                    self.route(StepEvent::Message { item: item_id }, out);
                }
            }
            ServerEvent::FunctionCall {
                item_id,
                call_id,
                name,
                arguments,
                ..
            } => {
                self.mirror.call_arrived(item_id, call_id.clone());
                if let Some(active) = &mut self.active {
                    active.calls = true;
                }
                self.route(
                    StepEvent::Call(ToolCallChunk {
                        call_id,
                        name,
                        arguments,
                    }),
                    out,
                );
            }
            ServerEvent::ResponseCreated { response_id, tag } => {
                self.response_created(response_id, tag, out)
            }
            ServerEvent::ResponseDone {
                response_id,
                status,
                usage,
            } => self.response_done(response_id, status, usage, now, out),
            ServerEvent::SpeechStarted { .. } => {
                self.user_speaking = true;
                if self.settings.server_interrupts() {
                    if let Some(active) = &mut self.active {
                        active.server_cancelled = true;
                    }
                }
                out.push(Out::User(UserSignal::Started));
            }
            ServerEvent::SpeechStopped { .. } => {
                self.user_speaking = false;
                if self.settings.server_answers() && self.active.is_none() {
                    // The commit and the server's answer follow at once.
                    self.auto_expected = Some(now + COMMIT_WAIT);
                }
                out.push(Out::User(UserSignal::Stopped));
                self.pump(now, out);
            }
            ServerEvent::AudioCommitted { item_id } => {
                self.user_speaking = false;
                self.mirror.heard(item_id.clone());
                if self.settings.server_answers() && self.active.is_none() {
                    self.auto_expected = Some(now + AUTO_RESPONSE_WAIT);
                }
                out.push(Out::User(UserSignal::Heard { item: item_id }));
            }
            ServerEvent::InputTranscript {
                item_id,
                transcript,
            } => out.push(Out::User(UserSignal::Transcript {
                item: item_id,
                text: transcript,
            })),
            ServerEvent::Error {
                code,
                message,
                event_id,
            } => self.on_error(code, message, event_id, now, out),
            ServerEvent::SessionCreated
            | ServerEvent::SessionUpdated
            | ServerEvent::ItemAdded { .. }
            | ServerEvent::ItemDeleted { .. }
            | ServerEvent::ItemTruncated { .. }
            | ServerEvent::Other => {}
        }
    }

    fn response_created(&mut self, response: String, tag: Option<u64>, out: &mut Vec<Out>) {
        let mut active = Active {
            response,
            claim: Claim::Dropped,
            server_cancelled: false,
            cancel_sent: false,
            items: Vec::new(),
            ask: None,
            calls: false,
            text: String::new(),
        };
        match tag {
            Some(tag) if self.in_flight.as_ref().is_some_and(|(a, _)| a.step == tag) => {
                let Some((ask, _)) = self.in_flight.take() else {
                    return;
                };
                if ask.cancelled {
                    active.cancel_sent = true;
                    out.push(Out::Send(ClientEvent::CancelResponse {
                        response_id: active.response.clone(),
                    }));
                } else {
                    active.claim = Claim::Step(tag);
                    if ask.continues {
                        // The answer goes on after what was said before the drop.
                        out.push(Out::Step(tag, StepEvent::Text(" ".to_owned())));
                    }
                }
                active.ask = Some(ask);
            }
            // A request given up (or of an earlier connection): nobody takes it.
            Some(_) => {
                active.cancel_sent = true;
                out.push(Out::Send(ClientEvent::CancelResponse {
                    response_id: active.response.clone(),
                }));
            }
            None => {
                self.auto_expected = None;
                active.claim = match self.adopting.pop_front() {
                    Some(step) => Claim::Step(step),
                    None => Claim::Unclaimed(Vec::new()),
                };
            }
        }
        self.active = Some(active);
    }

    fn response_done(
        &mut self,
        response: String,
        status: ResponseStatus,
        usage: Option<LlmUsage>,
        now: Instant,
        out: &mut Vec<Out>,
    ) {
        if self.active.as_ref().is_none_or(|a| a.response != response) {
            return;
        }
        let Some(active) = self.active.take() else {
            return;
        };
        let failure = match status {
            ResponseStatus::Failed { message } => Some(LlmError::Other {
                message: format!("the realtime response failed: {message}"),
            }),
            _ => None,
        };
        match active.claim {
            Claim::Step(step) => out.push(Out::Step(step, StepEvent::Done { usage, failure })),
            Claim::Unclaimed(mut held) => {
                held.push(StepEvent::Done { usage, failure });
                self.unclaimed.push_back(held);
                while self.unclaimed.len() > MAX_UNCLAIMED {
                    self.unclaimed.pop_front();
                }
            }
            Claim::Dropped => {}
        }
        for (item, bytes) in active.items {
            self.audio.insert(item, bytes);
        }
        for (item, heard) in std::mem::take(&mut self.deferred) {
            self.cut(item, heard, out);
        }
        self.pump(now, out);
    }

    fn on_error(
        &mut self,
        code: Option<String>,
        message: String,
        event_id: Option<String>,
        now: Instant,
        out: &mut Vec<Out>,
    ) {
        let tag = event_id.as_deref().and_then(response_tag);
        if let (Some(tag), Some((ask, _))) = (tag, &self.in_flight) {
            if ask.step == tag {
                let Some((ask, _)) = self.in_flight.take() else {
                    return;
                };
                if code.as_deref() == Some("conversation_already_has_active_response") {
                    // Expected when the server answered a turn first: asked again later.
                    tracing::debug!(step = tag, "a response was active: the request waits");
                    if !ask.cancelled {
                        self.waiting.push_front(ask);
                    }
                } else if !ask.cancelled {
                    out.push(Out::Step(
                        tag,
                        StepEvent::Done {
                            usage: None,
                            failure: Some(LlmError::BadRequest {
                                status: 400,
                                message: message.clone(),
                            }),
                        },
                    ));
                }
                self.pump(now, out);
                return;
            }
        }
        match code.as_deref() {
            // Documented as harmless: a cancel that came after the response ended.
            Some("response_cancel_not_active") => {
                tracing::debug!(%message, "realtime: nothing to cancel")
            }
            _ => {
                tracing::warn!(code = ?code, %message, "the realtime model refused an event");
                out.push(Out::Error(message));
            }
        }
    }

    /// Sends the next waiting request if nothing holds it back.
    fn pump(&mut self, now: Instant, out: &mut Vec<Out>) {
        if self.active.is_some() || self.in_flight.is_some() || self.user_speaking || !self.replayed
        {
            return;
        }
        if self.auto_expected.is_some_and(|until| now < until) {
            return;
        }
        self.auto_expected = None;
        let Some(mut ask) = self.waiting.pop_front() else {
            return;
        };
        let mut events = Vec::new();
        self.mirror.drop_unanswered(&mut events);
        out.extend(events.into_iter().map(Out::Send));
        let said = std::mem::take(&mut ask.said);
        if !said.is_empty() {
            // The model's words before the connection dropped: it goes on from them.
            out.push(Out::Send(ClientEvent::CreateItem {
                id: format!("sb_said_{}", ask.step),
                previous: Place::End,
                item: RemoteItem::Message {
                    role: ChatRole::Assistant,
                    text: said,
                },
            }));
        }
        let instructions = match (&ask.instructions, &self.sent) {
            // A response's instructions replace the session's: keep the agent's.
            (Some(extra), Some(config)) if self.caps.response_instructions => {
                Some(format!("{}\n\n{extra}", config.instructions))
            }
            _ => None,
        };
        out.push(Out::Send(ClientEvent::CreateResponse {
            tag: ask.step,
            instructions,
            tool_choice: ask.tool_choice,
        }));
        self.in_flight = Some((ask, now));
    }

    /// Routes a response's event to its step, holds it, or drops it.
    fn route(&mut self, event: StepEvent, out: &mut Vec<Out>) {
        let Some(active) = &mut self.active else {
            return;
        };
        match &mut active.claim {
            Claim::Step(step) => out.push(Out::Step(*step, event)),
            Claim::Unclaimed(held) => held.push(event),
            Claim::Dropped => {}
        }
    }

    /// The connection dropped: what was in flight is settled (see the module docs) and the
    /// remote conversation forgotten; the next connection starts from a replay.
    pub(crate) fn dropped(&mut self, out: &mut Vec<Out>) {
        let mut again = Vec::new();
        if let Some(active) = self.active.take() {
            if let Claim::Step(step) = active.claim {
                if active.calls {
                    out.push(Out::Step(
                        step,
                        StepEvent::Done {
                            usage: None,
                            failure: None,
                        },
                    ));
                } else {
                    let mut ask = active.ask.unwrap_or_default();
                    ask.step = step;
                    ask.continues = !active.text.is_empty();
                    ask.said = active.text;
                    again.push(ask);
                }
            }
        }
        if let Some((ask, _)) = self.in_flight.take() {
            if !ask.cancelled {
                again.push(ask);
            }
        }
        // Nobody will answer those turns by itself on the new connection.
        again.extend(self.adopting.drain(..).map(|step| Ask {
            step,
            ..Ask::default()
        }));
        for ask in again.into_iter().rev() {
            self.waiting.push_front(ask);
        }
        self.mirror.reset();
        self.unclaimed.clear();
        self.audio.clear();
        self.deferred.clear();
        self.truncated.clear();
        self.user_speaking = false;
        self.auto_expected = None;
        self.spoke = false;
        self.replayed = false;
    }

    /// Every step with a request or a response under way, which the link can no longer
    /// serve (the model is gone); they are forgotten.
    pub(crate) fn settle_all(&mut self) -> Vec<u64> {
        let mut steps: Vec<u64> = self.waiting.drain(..).map(|a| a.step).collect();
        steps.extend(self.adopting.drain(..));
        if let Some((ask, _)) = self.in_flight.take() {
            steps.push(ask.step);
        }
        if let Some(Active {
            claim: Claim::Step(step),
            ..
        }) = self.active.take()
        {
            steps.push(step);
        }
        steps
    }

    /// Whether nothing is under way (a quiet moment to replace the connection).
    pub(crate) fn quiet(&self) -> bool {
        self.active.is_none()
            && self.in_flight.is_none()
            && self.waiting.is_empty()
            && self.adopting.is_empty()
            && !self.user_speaking
            && self.auto_expected.is_none()
    }

    /// When the wire next decides something by itself.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        let created = self.in_flight.as_ref().map(|(_, at)| *at + CREATE_WAIT);
        match (self.auto_expected, created) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Time passed: a server answer that did not come is given up (its adopters ask for
    /// their own), and so is a request never answered.
    pub(crate) fn tick(&mut self, now: Instant, out: &mut Vec<Out>) {
        if self.auto_expected.is_some_and(|until| now >= until) {
            self.auto_expected = None;
            let adopters: Vec<_> = self.adopting.drain(..).collect();
            for step in adopters {
                self.waiting.push_back(Ask {
                    step,
                    ..Ask::default()
                });
            }
        }
        if self
            .in_flight
            .as_ref()
            .is_some_and(|(_, at)| now >= *at + CREATE_WAIT)
        {
            if let Some((ask, _)) = self.in_flight.take() {
                tracing::warn!(step = ask.step, "a response request went unanswered");
                if !ask.cancelled {
                    out.push(Out::Step(
                        ask.step,
                        StepEvent::Done {
                            usage: None,
                            failure: Some(LlmError::Timeout {
                                stage: crate::llm::TimeoutStage::FirstChunk,
                                after: CREATE_WAIT,
                            }),
                        },
                    ));
                }
            }
        }
        self.pump(now, out);
    }
}

/// Whether two instruction texts are the same (cheap when they are one `Arc`).
fn same_text(a: &Arc<str>, b: &Arc<str>) -> bool {
    Arc::ptr_eq(a, b) || a == b
}

#[cfg(test)]
mod tests;
