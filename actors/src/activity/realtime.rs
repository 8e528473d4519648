//! An activity's side of a realtime model: its steps' requests go to the session's
//! connection (`RealtimeLink`), and the connection's events come back as the steps'
//! chunks. The activation machine does not know which kind of model it asks: a response is
//! one step, its transcript the step's text, its calls the step's calls. What is realtime
//! only is here:
//!
//! - the model's audio, which goes to the host's output as it comes (one call per chunk,
//!   no message), through the step's speech — started by the first audio if it comes
//!   before the text;
//! - which remote item each speech played (the mirror binds the agent's message to it),
//!   and a playout report's heard audio, which becomes a truncation of that item and, when
//!   the output did not say what text was heard, the heard share of the message's text;
//! - the chat synced to the remote conversation when the agent takes the connection, when
//!   the user starts speaking (the server may answer on its own when they stop), and
//!   replayed after a reconnection;
//! - the waits: a step whose first event does not come within the first-chunk timeout, or
//!   whose next one not within the between-chunks timeout, fails as an LLM step would.

use std::collections::VecDeque;
use std::time::Duration;

use actix::SpawnHandle;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::chat::{ChatContext, ChatItem};
use crate::llm::{LlmTimeouts, TimeoutStage};
use crate::output::SpeechId;
use crate::realtime::AudioFormat;
use crate::realtime_link::{AgentConfig, Ask, LinkEvent, LinkOp, RealtimeLink};

/// A speaking pace (about 150 words a minute), to place a cut in a text whose audio did
/// not all come.
const CHARS_PER_SECOND: u64 = 15;

/// Speeches whose audio is remembered for their playout reports (a report comes once the
/// speech has played; a few turns back is plenty).
const REMEMBERED: usize = 8;

/// The step streaming now.
struct Streaming {
    step: u64,
    speech: Option<SpeechId>,
    /// The model's message item the step plays.
    item: Option<String>,
    /// The speech was bound to the item at the link.
    bound: bool,
    /// When the last event came (none yet: the step's start).
    last: Instant,
    /// Whether any event came.
    started: bool,
}

/// The audio a speech received, for its playout report.
struct Heard {
    speech: SpeechId,
    bytes: usize,
}

/// An activity's realtime state (see the module docs).
pub(super) struct Realtime {
    link: RealtimeLink,
    format: AudioFormat,
    timeouts: LlmTimeouts,
    listener: Option<(mpsc::UnboundedSender<LinkEvent>, Option<SpawnHandle>)>,
    streaming: Option<Streaming>,
    heard: VecDeque<Heard>,
}

/// What the driver asks the actor to do after an event.
pub(super) enum Then {
    Nothing,
    /// Feed the machine a chunk of `step`.
    Chunk(u64, crate::llm::LlmChunk),
    /// The step's stream ended, with its usage and the model's error if it failed.
    Ended(
        u64,
        Option<crate::llm::LlmUsage>,
        Option<crate::llm::LlmError>,
    ),
    /// Start (or find) the speech of `step` for this audio, then play it.
    Audio(u64, Vec<u8>),
    /// Replay the chat on the new connection.
    Replay,
}

impl Realtime {
    pub(super) fn new(link: RealtimeLink, timeouts: LlmTimeouts) -> Self {
        let format = link.model().settings().output_format;
        Self {
            link,
            format,
            timeouts,
            listener: None,
            streaming: None,
            heard: VecDeque::new(),
        }
    }

    /// The agent takes the connection: its configuration and chat go to the model; the
    /// connection's events come through the stream returned (the actor reads it, and
    /// hands back its task with [`listening`](Self::listening)).
    pub(super) fn attach(
        &mut self,
        config: AgentConfig,
        chat: ChatContext,
    ) -> impl futures_util::Stream<Item = LinkEvent> + 'static {
        let (tx, mut rx) = mpsc::unbounded_channel();
        self.link.send(LinkOp::Attach {
            listener: tx.clone(),
            config,
            chat,
        });
        self.listener = Some((tx, None));
        futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }

    /// The task that reads the attached stream.
    pub(super) fn listening(&mut self, task: SpawnHandle) {
        if let Some((_, slot)) = &mut self.listener {
            *slot = Some(task);
        }
    }

    /// Whether the agent holds the connection.
    pub(super) fn attached(&self) -> bool {
        self.listener.is_some()
    }

    /// The agent leaves the connection (pause, close): the task reading its events, for
    /// the actor to cancel.
    pub(super) fn detach(&mut self) -> Option<SpawnHandle> {
        self.streaming = None;
        let (listener, task) = self.listener.take()?;
        self.link.send(LinkOp::Detach { listener });
        task
    }

    /// A step opens: its request goes to the link, and its first event is awaited.
    pub(super) fn open(&mut self, step: u64, request: crate::llm::LlmRequest, adopt: bool) {
        let ask = Ask::new(step, request.extra_instructions, request.tool_choice);
        self.link.send(LinkOp::Open {
            ask,
            adopt,
            chat: request.chat,
        });
        self.streaming = Some(Streaming {
            step,
            speech: None,
            item: None,
            bound: false,
            last: Instant::now(),
            started: false,
        });
    }

    /// The step ended early: its response is cancelled (or never asked).
    pub(super) fn cancel(&mut self, step: u64) {
        self.link.send(LinkOp::Cancel { step });
        if self.streaming.as_ref().is_some_and(|s| s.step == step) {
            self.streaming = None;
        }
    }

    /// The remote conversation follows the chat (the user started speaking: the server
    /// may answer by itself when they stop).
    pub(super) fn sync(&self, chat: ChatContext) {
        self.link.send(LinkOp::Sync { chat });
    }

    /// When the open step's wait ends (its first event, or its next one), if a step is
    /// open.
    pub(super) fn deadline(&self) -> Option<(u64, Instant)> {
        self.streaming.as_ref().map(|s| {
            let wait = if s.started {
                self.timeouts.between_chunks
            } else {
                self.timeouts.first_chunk
            };
            (s.step, s.last + wait)
        })
    }

    /// The open step's wait ran out: it is cancelled; the failure to feed.
    pub(super) fn timed_out(&mut self, step: u64) -> Option<crate::llm::LlmError> {
        let streaming = self.streaming.as_ref().filter(|s| s.step == step)?;
        let (stage, after) = if streaming.started {
            (TimeoutStage::BetweenChunks, self.timeouts.between_chunks)
        } else {
            (TimeoutStage::FirstChunk, self.timeouts.first_chunk)
        };
        if streaming.last + after > Instant::now() {
            return None;
        }
        self.cancel(step);
        Some(crate::llm::LlmError::Timeout { stage, after })
    }

    /// One event of the link: what the actor does with it.
    pub(super) fn on_event(&mut self, event: LinkEvent) -> Then {
        let (step, event) = match event {
            LinkEvent::Step(step, event) => (step, event),
            LinkEvent::Reconnected => return Then::Replay,
        };
        let Some(streaming) = self.streaming.as_mut().filter(|s| s.step == step) else {
            // A step that ended already (cut, timed out): its late events change nothing.
            return Then::Nothing;
        };
        streaming.started = true;
        streaming.last = Instant::now();
        use crate::realtime_link::StepEvent;
        match event {
            StepEvent::Audio(audio) => Then::Audio(step, audio),
            StepEvent::Text(text) => Then::Chunk(step, crate::llm::LlmChunk::Text(text)),
            StepEvent::Call(call) => Then::Chunk(step, crate::llm::LlmChunk::ToolCall(call)),
            StepEvent::Message { item } => {
                if streaming.item.is_none() {
                    streaming.item = Some(item);
                    self.bind();
                }
                Then::Nothing
            }
            StepEvent::Done { usage, failure } => {
                self.streaming = None;
                Then::Ended(step, usage, failure)
            }
        }
    }

    /// The step's speech is `speech` (started by its first audio or text).
    pub(super) fn speaking(&mut self, step: u64, speech: SpeechId) {
        if let Some(streaming) = self.streaming.as_mut().filter(|s| s.step == step) {
            if streaming.speech.is_none() {
                streaming.speech = Some(speech);
                self.bind();
            }
        }
    }

    /// The speech of the open step, if it started.
    pub(super) fn speech_of(&self, step: u64) -> Option<SpeechId> {
        self.streaming
            .as_ref()
            .filter(|s| s.step == step)
            .and_then(|s| s.speech)
    }

    /// Counts audio a speech played (for its playout report).
    pub(super) fn played(&mut self, speech: SpeechId, bytes: usize) {
        match self.heard.iter_mut().rev().find(|h| h.speech == speech) {
            Some(heard) => heard.bytes += bytes,
            None => {
                self.heard.push_back(Heard { speech, bytes });
                while self.heard.len() > REMEMBERED {
                    self.heard.pop_front();
                }
            }
        }
    }

    /// A speech's playout was cut after `heard` of its audio: the model's item is cut
    /// there (or deleted when nothing was heard), and the text heard is estimated from the
    /// share of the audio heard when the output did not say it.
    pub(super) fn cut(
        &mut self,
        speech: SpeechId,
        heard: Duration,
        chat: &ChatContext,
    ) -> Option<String> {
        let heard_ms = u32::try_from(heard.as_millis()).unwrap_or(u32::MAX);
        self.link.send(LinkOp::Truncate { speech, heard_ms });
        let bytes = self.heard.iter().find(|h| h.speech == speech)?.bytes;
        let text = chat
            .position_of_speech(speech)
            .and_then(|at| chat.items().get(at))
            .and_then(ChatItem::text)?;
        // The text usually runs ahead of the audio, and a cut answer's full length is
        // unknown: the longer of the audio received and the text at a speaking pace.
        let spoken = Duration::from_millis(text.chars().count() as u64 * 1000 / CHARS_PER_SECOND);
        let total = self.format.duration_of(bytes).max(spoken);
        Some(heard_text(text, heard, total).to_owned())
    }

    /// Tells the link which item the open step's speech plays, once both are known.
    fn bind(&mut self) {
        let Some(streaming) = self.streaming.as_mut() else {
            return;
        };
        if streaming.bound {
            return;
        }
        if let (Some(speech), Some(item)) = (streaming.speech, &streaming.item) {
            streaming.bound = true;
            self.link.send(LinkOp::Spoke {
                speech,
                item: item.clone(),
            });
        }
    }
}

/// What config an agent shows the model.
pub(super) fn config(
    agent: &crate::agent::Agent,
    tools: &std::sync::Arc<[crate::llm::ToolSchema]>,
) -> AgentConfig {
    AgentConfig {
        instructions: agent.def.instructions.clone(),
        tools: tools.clone(),
        voice: agent.def.voice.clone(),
    }
}

/// The share of `text` a listener heard after `heard` of its `total` audio: the same
/// share of its characters, to the end of the word the cut falls in (a word begun was
/// heard).
pub(super) fn heard_text(text: &str, heard: Duration, total: Duration) -> &str {
    if total.is_zero() || heard >= total {
        return text;
    }
    let share = heard.as_secs_f64() / total.as_secs_f64();
    let mut at = (text.len() as f64 * share) as usize;
    while at > 0 && !text.is_char_boundary(at) {
        at -= 1;
    }
    if at == 0 {
        return "";
    }
    // On to the end of the word the cut falls in.
    let end = text[at..]
        .find(char::is_whitespace)
        .map_or(text.len(), |space| at + space);
    text[..end].trim_end()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_heard_share_of_the_text_ends_with_the_word_it_falls_in() {
        let text = "It is sunny and warm in Paris today.";
        let total = Duration::from_millis(1000);
        assert_eq!(
            heard_text(text, Duration::from_millis(500), total),
            "It is sunny and warm"
        );
        assert_eq!(heard_text(text, Duration::ZERO, total), "");
        assert_eq!(heard_text(text, total, total), text);
        assert_eq!(heard_text(text, Duration::from_millis(10), total), "");
        assert_eq!(heard_text(text, Duration::from_millis(40), total), "It");
        assert_eq!(
            heard_text("héllo wörld", Duration::from_millis(400), total),
            "héllo"
        );
    }
}
