//! The LLM turn loop of an activity: one LLM step after another, tool calls dispatched to
//! their toolsets, each step committed to the chat context (by the ledger) once every call
//! has its immediate output.
//!
//! A turn is in one [`Phase`] at a time: generating (the model's stream is consumed here,
//! chunk by chunk, so an interruption knows exactly what was said), calling (the step's
//! calls wait for their outputs), or playing (the turn is over, its speeches still play).
//! Every way out — the model's answer, a tool's handoff, a failed or stalled stream, an
//! interruption, a close — goes through `finish_turn`, which answers the session once.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{companions, ActivityActor, Status, TurnKind, TurnOutcome};
use crate::agent::TurnDecision;
use crate::chat::{ChatContext, ChatItem, ChatMessage, ChatRole, FunctionCall};
use crate::error::{SessionError, TurnFailure};
use crate::events::{AgentState, DeferredReplyDecision, LlmMetrics, SessionEvent};
use crate::llm::{LlmChunk, LlmError, LlmRequest, LlmUsage, ToolCallChunk, ToolChoice};
use crate::llm_guard;
use crate::mailbox::Mailbox;
use crate::outcome::{excerpt, panic_message, CallOutput, Effect, QUOTE_LIMIT};
use crate::output::Playout;
use crate::prompts::ReplyPromptArgs;
use crate::session::PendingItem;
use crate::speech::{Interruptibility, SpeechHandle, SpeechOutcome};
use crate::toolset::{InterruptStep, RunTool, ToolsetActor};

use super::ledger::Committed;

/// How long an interrupted turn waits for its output to report what the user heard of
/// its cut speeches, before it ends without knowing.
const CUT_REPORT_TIMEOUT: Duration = Duration::from_secs(2);

/// A turn in flight.
pub(crate) struct Turn {
    /// What the turn added, for its `RunResult`.
    pub(super) events: Vec<ChatItem>,
    steps: u32,
    tool_choice: ToolChoice,
    extra_instructions: Option<String>,
    /// The later tool items a deferred reply answers (empty for other turns).
    deferred_call_ids: Vec<String>,
    pub(super) interrupted: bool,
    phase: Phase,
    /// Whether the turn may be interrupted now (shared with its speeches and calls).
    pub(super) interruptibility: Arc<Interruptibility>,
    /// The turn's speeches, oldest first (done or still playing).
    pub(super) speeches: Vec<SpeechHandle>,
    done: oneshot::Sender<TurnOutcome>,
    /// Interruptions waiting for the turn to end.
    ended: Vec<oneshot::Sender<()>>,
    /// `turn` span (session, agent, kind): the parent of its LLM requests' spans.
    span: tracing::Span,
}

impl Turn {
    /// The latest speech still playing, if any.
    pub(super) fn playing(&self) -> Option<&SpeechHandle> {
        self.speeches.iter().rev().find(|s| !s.is_done())
    }

    /// Whether the user may interrupt it now.
    pub(super) fn interruptible(&self) -> bool {
        !self.interrupted && self.interruptibility.allows()
    }
}

pub(super) enum Phase {
    /// Set up; no step started yet (or between two).
    Between,
    /// The model streams the answer of one step.
    Generating(Generation),
    /// The step's calls wait for their immediate outputs (the ledger holds them).
    Calling {
        step: u64,
        toolsets: Vec<Mailbox<ToolsetActor>>,
    },
    /// The turn is over; its speeches still play (interrupted: until the output reports
    /// what was heard, at most `CUT_REPORT_TIMEOUT`).
    Playing(TurnOutcome),
}

/// One LLM request being consumed.
pub(super) struct Generation {
    step: u64,
    /// The `llm_request` span (its `speech` field is set when the speech starts).
    span: tracing::Span,
    task: SpawnHandle,
    /// Chat length the request was made from.
    view: usize,
    started: Instant,
    first_chunk: Option<Duration>,
    text: String,
    text_chunks: u32,
    calls: Vec<ToolCallChunk>,
    pub(super) speech: Option<SpeechHandle>,
    usage: Option<LlmUsage>,
    /// The model a wrapper said serves the request (`LlmChunk::ServedBy`).
    llm: Option<String>,
    /// A playout report that came while the text still streamed: applied at the end.
    pub(super) early_report: Option<(bool, Option<String>)>,
}

/// How a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ending {
    /// The stream ended on its own.
    Complete,
    /// The stream failed or timed out: what was said plays out.
    Failed,
    /// The turn was interrupted: the output is told to stop.
    Cut,
}

impl ActivityActor {
    pub(super) fn begin_turn(
        &mut self,
        kind: TurnKind,
        done: oneshot::Sender<TurnOutcome>,
        ctx: &mut Context<Self>,
    ) {
        let kind_name = match &kind {
            TurnKind::User(_) => "user",
            TurnKind::Reply(_) => "reply",
            TurnKind::Deferred(_) => "deferred",
            TurnKind::Say { .. } => "say",
        };
        let span = tracing::info_span!(
            parent: &self.shared.span,
            "turn",
            session = %self.shared.id,
            agent = %self.agent.name(),
            kind = kind_name,
        );
        let interruptibility = match &kind {
            TurnKind::Say { speech, .. } => speech.interruptibility().clone(),
            _ => Interruptibility::new(self.allow_interruptions),
        };
        self.turn = Some(Turn {
            events: Vec::new(),
            steps: 0,
            tool_choice: ToolChoice::Auto,
            extra_instructions: None,
            deferred_call_ids: Vec::new(),
            interrupted: false,
            phase: Phase::Between,
            interruptibility,
            speeches: Vec::new(),
            done,
            ended: Vec::new(),
            span,
        });
        self.set_state(AgentState::Thinking);
        match kind {
            TurnKind::User(text) => {
                self.shared.emit(SessionEvent::UserInputTranscribed {
                    text: text.clone(),
                    is_final: true,
                });
                let mut message = ChatMessage {
                    role: ChatRole::User,
                    content: text,
                    interrupted: false,
                    speech: None,
                };
                let decision = self.user_turn_hook(&mut message);
                self.record(ChatItem::Message(message));
                if decision == TurnDecision::StopResponse {
                    self.finish_turn(TurnOutcome::default(), ctx);
                    return;
                }
            }
            TurnKind::Reply(instructions) => {
                if let Some(turn) = self.turn.as_mut() {
                    turn.extra_instructions = instructions;
                }
            }
            TurnKind::Deferred(pending) => {
                if !self.prepare_deferred(pending) {
                    self.finish_turn(TurnOutcome::default(), ctx);
                    return;
                }
            }
            TurnKind::Say {
                text,
                speech,
                add_to_chat,
            } => {
                self.say(text, speech, add_to_chat);
                self.finish_turn(TurnOutcome::default(), ctx);
                return;
            }
        }
        self.start_llm_step(ctx);
    }

    /// Runs `on_user_turn_completed`, catching its panics (the reply goes ahead).
    fn user_turn_hook(&mut self, message: &mut ChatMessage) -> TurnDecision {
        let Some(hook) = self.agent.def.on_user_turn_completed.clone() else {
            return TurnDecision::Reply;
        };
        let before = self.ledger.chat().clone();
        let chat = self.ledger.chat_mut();
        let decision = std::panic::catch_unwind(AssertUnwindSafe(|| hook(chat, message)));
        self.announce_hook_edits(&before);
        match decision {
            Ok(decision) => decision,
            Err(panic) => {
                let message = format!(
                    "on_user_turn_completed hook of {} panicked: {}",
                    self.agent.name(),
                    panic_message(&*panic)
                );
                tracing::error!(session = %self.shared.id, "{message}");
                self.shared.emit(SessionEvent::Error { message });
                TurnDecision::Reply
            }
        }
    }

    /// Tells subscribers what a hook did to the chat context: the items it appended, or
    /// the whole context when it rewrote anything.
    fn announce_hook_edits(&self, before: &ChatContext) {
        let after = self.ledger.chat();
        if after.extends(before) {
            for item in &after.items()[before.len()..] {
                self.shared
                    .emit_with(|| SessionEvent::ConversationItemAdded {
                        agent: self.agent_name(),
                        item: item.clone(),
                    });
            }
        } else {
            self.shared.emit_with(|| SessionEvent::ChatContextSet {
                agent: self.agent_name(),
                chat: after.clone(),
            });
        }
    }

    /// Inserts pending items this agent lacks; decides whether a reply is still due.
    fn prepare_deferred(&mut self, pending: Vec<PendingItem>) -> bool {
        let mut newest = None;
        let mut ids = Vec::new();
        for item in pending {
            // An agent that became current after the update lacks it: insert it first, so
            // the reply never names a call id the model cannot see.
            let position = match self.ledger.chat().position_of_call(&item.call_id) {
                Some(position) => position,
                None => {
                    let at = self.ledger.chat().len();
                    self.with_ledger(true, |ledger, sink| {
                        for entry in item.items.iter() {
                            ledger.append(entry.clone(), sink);
                        }
                    });
                    at
                }
            };
            newest = newest.max(Some(position));
            ids.push(item.call_id);
        }
        // Judged by chat position: an assistant message generated with the newest item in
        // view already answered it.
        let due = newest.is_some_and(|newest| self.last_reply_view <= newest);
        let decision = if due {
            DeferredReplyDecision::Requested
        } else {
            tracing::debug!(agent = %self.agent.name(), "deferred reply skipped: the agent already spoke with the updates in view");
            DeferredReplyDecision::AlreadyAnswered
        };
        self.shared.emit_with(|| SessionEvent::DeferredReply {
            agent: self.agent_name(),
            call_ids: ids.clone(),
            decision,
        });
        if !due {
            return false;
        }
        let prompts = self.agent.def.prompts.or(&self.shared.prompts);
        if let Some(turn) = self.turn.as_mut() {
            turn.tool_choice = ToolChoice::None;
            turn.extra_instructions = Some(prompts.render_reply(&ReplyPromptArgs {
                pending_call_ids: ids.clone(),
            }));
            turn.deferred_call_ids = ids;
        }
        true
    }

    fn start_llm_step(&mut self, ctx: &mut Context<Self>) {
        let Some(turn) = self.turn.as_mut() else {
            return;
        };
        turn.steps += 1;
        let request = LlmRequest {
            agent: self.agent.def.name.clone(),
            instructions: self.agent.def.instructions.clone(),
            extra_instructions: turn.extra_instructions.clone(),
            chat: self.ledger.chat().clone(),
            tools: self.schemas.clone(),
            tool_choice: turn.tool_choice,
            deferred_call_ids: turn.deferred_call_ids.clone(),
        };
        let step = self.shared.next_step();
        let view = self.ledger.chat().len();
        let span = tracing::info_span!(
            parent: &turn.span,
            "llm_request",
            session = %self.shared.id,
            agent = %self.agent.name(),
            llm = self.llm.name(),
            step,
            speech = tracing::field::Empty,
        );
        let stream = llm_guard::open(&*self.llm, request, self.timeouts, span.clone());
        let task = ctx.spawn(
            stream
                .into_actor(self)
                .map(move |chunk, act, ctx| act.on_chunk(step, chunk, ctx))
                .finish()
                .map(move |(), act, ctx| act.end_generation(step, Ok(()), ctx)),
        );
        if let Some(turn) = self.turn.as_mut() {
            turn.phase = Phase::Generating(Generation {
                step,
                span,
                task,
                view,
                started: Instant::now(),
                first_chunk: None,
                text: String::new(),
                text_chunks: 0,
                calls: Vec::new(),
                speech: None,
                usage: None,
                llm: None,
                early_report: None,
            });
        }
    }

    /// The generation of `step`, if it is the one running.
    pub(super) fn generation_mut(&mut self, step: Option<u64>) -> Option<&mut Generation> {
        match self.turn.as_mut().map(|t| &mut t.phase) {
            Some(Phase::Generating(g)) if step.is_none_or(|s| g.step == s) => Some(g),
            _ => None,
        }
    }

    /// One chunk of the model's answer: text goes to the output at once.
    fn on_chunk(&mut self, step: u64, chunk: Result<LlmChunk, LlmError>, ctx: &mut Context<Self>) {
        let Some(generation) = self.generation_mut(Some(step)) else {
            return;
        };
        let chunk = match chunk {
            Ok(chunk) => chunk,
            Err(err) => return self.end_generation(step, Err(err), ctx),
        };
        if !matches!(chunk, LlmChunk::Usage(_) | LlmChunk::ServedBy(_)) {
            generation
                .first_chunk
                .get_or_insert_with(|| generation.started.elapsed());
        }
        match chunk {
            LlmChunk::Text(text) => {
                generation.text_chunks += 1;
                generation.text.push_str(&text);
                let speech = match generation.speech.clone() {
                    Some(speech) => speech,
                    None => self.open_generated_speech(),
                };
                self.shared
                    .with_output(|output| output.speech_chunk(speech.id(), &text));
            }
            LlmChunk::ToolCall(call) => generation.calls.push(call),
            LlmChunk::Usage(usage) => generation.usage = Some(usage),
            LlmChunk::ServedBy(llm) => generation.llm = Some(llm),
        }
    }

    /// The speech of the running generation, started at its first text.
    fn open_generated_speech(&mut self) -> SpeechHandle {
        let interruptibility = self
            .turn
            .as_ref()
            .map(|t| t.interruptibility.clone())
            .unwrap_or_else(|| Interruptibility::new(self.allow_interruptions));
        let speech = self.start_speech(interruptibility);
        if let Some(generation) = self.generation_mut(None) {
            generation
                .span
                .record("speech", tracing::field::display(speech.id()));
            generation.speech = Some(speech.clone());
        }
        speech
    }

    /// Takes the running generation (of `step`, if given) out of the turn.
    fn take_generation(&mut self, step: Option<u64>) -> Option<Generation> {
        self.generation_mut(step)?;
        let turn = self.turn.as_mut()?;
        match std::mem::replace(&mut turn.phase, Phase::Between) {
            Phase::Generating(generation) => Some(generation),
            other => {
                turn.phase = other;
                None
            }
        }
    }

    /// Ends a generation: its stream is dropped, its speech finished on the output (and
    /// cut, on an interruption), what was said recorded (marked interrupted when the
    /// stream did not end on its own), its metrics emitted.
    fn close_generation(
        &mut self,
        generation: Generation,
        ending: Ending,
        ctx: &mut Context<Self>,
    ) {
        ctx.cancel_future(generation.task);
        let complete = ending == Ending::Complete;
        tracing::debug!(
            parent: &generation.span,
            text_chunks = generation.text_chunks,
            tool_calls = generation.calls.len(),
            complete,
            "LLM request ended"
        );
        self.shared.emit_with(|| {
            SessionEvent::LlmMetrics(LlmMetrics {
                agent: self.agent_name(),
                llm: generation
                    .llm
                    .clone()
                    .unwrap_or_else(|| self.llm.name().to_owned()),
                time_to_first_chunk: generation.first_chunk,
                duration: generation.started.elapsed(),
                text_chunks: generation.text_chunks,
                tool_calls: u32::try_from(generation.calls.len()).unwrap_or(u32::MAX),
                usage: generation.usage,
                cancelled: !complete,
            })
        });
        let Some(speech) = generation.speech else {
            return;
        };
        if !generation.text.is_empty() {
            self.last_reply_view = generation.view;
            self.record(ChatItem::Message(ChatMessage {
                role: ChatRole::Assistant,
                content: generation.text.clone(),
                interrupted: !complete,
                speech: Some(speech.id()),
            }));
        }
        let playout = self
            .shared
            .with_output(|output| output.speech_finished(speech.id()));
        if let Some((interrupted, heard)) = generation.early_report {
            self.playout_finished(speech.id(), interrupted, heard, ctx);
            return;
        }
        match (ending, playout) {
            (Ending::Cut, Playout::Pending) => {
                self.shared
                    .with_output(|output| output.interrupt(speech.id()));
            }
            // Shown in full as far as it was generated.
            (Ending::Cut, Playout::Done) => self.speech_ended(
                &speech,
                SpeechOutcome::Interrupted {
                    heard: Some(generation.text),
                },
            ),
            (_, Playout::Done) => self.speech_ended(&speech, SpeechOutcome::Played),
            (_, Playout::Pending) => {}
        }
    }

    /// The stream of `step` ended (or failed): record what was said, then run the calls
    /// or end the turn.
    fn end_generation(&mut self, step: u64, result: Result<(), LlmError>, ctx: &mut Context<Self>) {
        let Some(mut generation) = self.take_generation(Some(step)) else {
            return;
        };
        let calls = std::mem::take(&mut generation.calls);
        let ending = if result.is_ok() {
            Ending::Complete
        } else {
            Ending::Failed
        };
        self.close_generation(generation, ending, ctx);
        match result {
            Err(err) => {
                tracing::warn!(session = %self.shared.id, agent = %self.agent.name(), error = %err, "LLM request failed");
                self.shared.emit(SessionEvent::Error {
                    message: err.to_string(),
                });
                self.finish_turn(
                    TurnOutcome::failed(SessionError::turn_failed(TurnFailure::Llm(err))),
                    ctx,
                );
            }
            Ok(()) if calls.is_empty() => self.finish_turn(TurnOutcome::default(), ctx),
            Ok(()) => self.dispatch_calls(step, calls, ctx),
        }
    }

    /// Opens the step in the ledger and sends each call to its toolset, or answers it at
    /// once when it may not run.
    fn dispatch_calls(&mut self, step: u64, chunks: Vec<ToolCallChunk>, ctx: &mut Context<Self>) {
        self.set_state(AgentState::Thinking);
        let calls: Vec<FunctionCall> = chunks
            .into_iter()
            .map(|chunk| FunctionCall {
                call_id: self.shared.canonical_call_id(&chunk.call_id),
                name: chunk.name,
                arguments: chunk.arguments,
            })
            .collect();
        let (tool_choice, interruptibility, speech) = match self.turn.as_ref() {
            Some(turn) => (
                turn.tool_choice,
                turn.interruptibility.clone(),
                turn.speeches.last().cloned(),
            ),
            None => return,
        };
        let limit = self.shared.config.max_calls_per_step;
        let max_bytes = self.shared.config.max_argument_bytes;
        self.with_ledger(true, |ledger, sink| {
            ledger.open_step(step, calls.clone(), sink)
        });
        let mut toolsets: Vec<Mailbox<ToolsetActor>> = Vec::new();
        for (index, call) in calls.into_iter().enumerate() {
            let name = excerpt(&call.name, QUOTE_LIMIT);
            let refused = if tool_choice == ToolChoice::None {
                Some(CallOutput::refused(format!(
                    "Error: no tool may be called in this reply; {name} did not run."
                )))
            } else if index >= limit {
                Some(CallOutput::refused(format!(
                    "Error: too many tool calls in one step (at most {limit}); {name} did not run."
                )))
            } else if call.arguments.len() > max_bytes {
                Some(CallOutput::error(format!(
                    "Error: the arguments for {name} are {} bytes, over the limit of {max_bytes}; it did not run.",
                    call.arguments.len()
                )))
            } else {
                None
            };
            if let Some(out) = refused {
                self.ledger.answer(step, index, out);
                continue;
            }
            if self.companions && companions::is_companion(&call.name) {
                let answer = companions::answer(
                    call.name,
                    call.arguments,
                    self.visible_toolsets(),
                    self.id().clone(),
                );
                ctx.spawn(answer.into_actor(self).map(move |out, act, ctx| {
                    act.on_call_output(step, index, out, ctx);
                }));
                continue;
            }
            let Some(toolset) = self.routes.get(&call.name).cloned() else {
                let available: Vec<&str> = self.schemas.iter().map(|s| s.name.as_str()).collect();
                let out = CallOutput::error(format!(
                    "Error: unknown tool {name}; available tools: {}",
                    available.join(", ")
                ));
                self.ledger.answer(step, index, out);
                continue;
            };
            if !toolsets.iter().any(|t| t.id() == toolset.id()) {
                toolsets.push(toolset.clone());
            }
            let ask = toolset.ask(
                self.probe.id(),
                RunTool {
                    call,
                    step,
                    agent: self.agent.clone(),
                    is_task: self.is_task,
                    interruptibility: interruptibility.clone(),
                    speech: speech.clone(),
                },
            );
            ctx.spawn(ask.into_actor(self).map(move |res, act, ctx| {
                let out = res.unwrap_or_else(|_| CallOutput::ended("the toolset stopped"));
                act.on_call_output(step, index, out, ctx);
            }));
        }
        if let Some(turn) = self.turn.as_mut() {
            turn.phase = Phase::Calling { step, toolsets };
        }
        self.maybe_commit(ctx);
    }

    fn on_call_output(
        &mut self,
        step: u64,
        index: usize,
        out: CallOutput,
        ctx: &mut Context<Self>,
    ) {
        if self.ledger.answer(step, index, out) {
            self.maybe_commit(ctx);
        }
    }

    /// Commits the open step once every call has its output (a paused activity commits
    /// on resume, so its items land after the sub-task), then decides what follows.
    pub(super) fn maybe_commit(&mut self, ctx: &mut Context<Self>) {
        let calling = matches!(
            self.turn.as_ref().map(|t| &t.phase),
            Some(Phase::Calling { .. })
        );
        if !calling || self.status == Status::Paused {
            return;
        }
        let Some(committed) = self.with_ledger(true, |ledger, sink| ledger.commit(sink)) else {
            return;
        };
        if let Some(turn) = self.turn.as_mut() {
            turn.phase = Phase::Between;
        }
        self.after_commit(committed, ctx);
    }

    fn after_commit(&mut self, committed: Committed, ctx: &mut Context<Self>) {
        let Committed {
            calls,
            outputs,
            effects,
        } = committed;
        let mut outcome = TurnOutcome::default();
        let mut reply = false;
        for (call, effect) in calls.iter().zip(effects) {
            match effect {
                Effect::Reply => reply = true,
                Effect::Quiet => {}
                // The ledger left at most one of these two per step (`keep_first_ending`).
                Effect::Handoff(handoff) => outcome.handoff = Some(handoff),
                Effect::CompleteTask(value) => outcome.task_result = Some(value),
                Effect::Propagate(message) => {
                    self.shared.emit(SessionEvent::Error {
                        message: format!("tool {} failed: {message}", call.name),
                    });
                    outcome
                        .failure
                        .get_or_insert(SessionError::turn_failed(TurnFailure::Tool {
                            tool: call.name.clone(),
                            call_id: call.call_id.clone(),
                            message,
                        }));
                }
            }
        }
        self.shared
            .emit_with(|| SessionEvent::FunctionToolsExecuted {
                agent: self.agent_name(),
                calls,
                outputs,
            });
        let (steps, interrupted) = self
            .turn
            .as_ref()
            .map_or((0, true), |t| (t.steps, t.interrupted));
        let may_continue = outcome.handoff.is_none()
            && outcome.task_result.is_none()
            && outcome.failure.is_none()
            && self.status == Status::Active
            && !interrupted;
        if reply && may_continue && steps < self.shared.config.max_tool_steps {
            self.start_llm_step(ctx);
        } else {
            self.finish_turn(outcome, ctx);
        }
    }

    /// Ends the turn once its speeches have played (an interrupted one: once the output
    /// reported what was heard, or the report timeout passed).
    pub(super) fn finish_turn(&mut self, outcome: TurnOutcome, ctx: &mut Context<Self>) {
        let Some(turn) = self.turn.as_mut() else {
            return;
        };
        if turn.playing().is_none() || self.status == Status::Closed {
            self.finish_turn_now(outcome);
            return;
        }
        let interrupted = turn.interrupted;
        turn.phase = Phase::Playing(outcome);
        if interrupted {
            ctx.run_later(CUT_REPORT_TIMEOUT, |act, _| act.give_up_on_reports());
        }
    }

    /// The output did not say in time what was heard of an interrupted turn's speeches:
    /// they end as interrupted, heard unknown, and the turn ends.
    fn give_up_on_reports(&mut self) {
        let Some(turn) = self.turn.as_ref() else {
            return;
        };
        if !matches!(turn.phase, Phase::Playing(_)) || !turn.interrupted {
            return;
        }
        let playing: Vec<SpeechHandle> = turn
            .speeches
            .iter()
            .filter(|s| !s.is_done())
            .cloned()
            .collect();
        for speech in playing {
            self.speech_ended(&speech, SpeechOutcome::Interrupted { heard: None });
        }
        self.finish_if_played();
    }

    /// Ends a turn waiting for its speeches once none plays any more.
    pub(super) fn finish_if_played(&mut self) {
        let Some(turn) = self.turn.as_mut() else {
            return;
        };
        if turn.playing().is_some() || !matches!(turn.phase, Phase::Playing(_)) {
            return;
        }
        if let Phase::Playing(outcome) = std::mem::replace(&mut turn.phase, Phase::Between) {
            self.finish_turn_now(outcome);
        }
    }

    /// Ends the turn now: answers the session (once) and whoever waits on an interruption.
    pub(super) fn finish_turn_now(&mut self, mut outcome: TurnOutcome) {
        let Some(turn) = self.turn.take() else {
            return;
        };
        // A turn that ends with speeches still playing (a close) cuts them short.
        for speech in turn.speeches.iter().filter(|s| !s.is_done()) {
            self.speech_ended(speech, SpeechOutcome::Interrupted { heard: None });
        }
        self.end_barge_in();
        let mut events = turn.events;
        events.append(&mut outcome.events);
        outcome.events = events;
        outcome.interrupted |= turn.interrupted;
        let _ = turn.done.send(outcome);
        for ended in turn.ended {
            let _ = ended.send(());
        }
        if self.status != Status::Closed {
            self.set_state(AgentState::Listening);
        }
    }

    /// Stops the running turn now (see `InterruptTurn`): `Err` when it does not allow
    /// interruptions and `force` is not set. Returns what resolves once it has ended, or
    /// `None` when no turn runs.
    pub(super) fn interrupt(
        &mut self,
        force: bool,
        ctx: &mut Context<Self>,
    ) -> Result<Option<oneshot::Receiver<()>>, SessionError> {
        let agent = self.agent_name();
        let Some(turn) = self.turn.as_mut() else {
            return Ok(None);
        };
        if !force && !turn.interrupted && !turn.interruptibility.allows() {
            return Err(SessionError::Uninterruptible);
        }
        let (tx, rx) = oneshot::channel();
        turn.ended.push(tx);
        if turn.interrupted {
            return Ok(Some(rx));
        }
        turn.interrupted = true;
        self.shared.emit(SessionEvent::TurnInterrupted { agent });
        self.end_barge_in();
        // Speeches of earlier steps still playing stop too.
        let playing: Vec<_> = self
            .turn
            .as_ref()
            .map(|t| {
                t.speeches
                    .iter()
                    .filter(|s| !s.is_done())
                    .map(|s| s.id())
                    .collect()
            })
            .unwrap_or_default();
        self.shared.with_output(|output| {
            for speech in playing {
                output.interrupt(speech);
            }
        });
        let phase = match self.turn.as_mut() {
            Some(turn) => std::mem::replace(&mut turn.phase, Phase::Between),
            None => return Ok(Some(rx)),
        };
        match phase {
            Phase::Generating(generation) => {
                self.close_generation(generation, Ending::Cut, ctx);
                self.finish_turn(TurnOutcome::default(), ctx);
            }
            Phase::Calling { step, toolsets } => {
                for toolset in &toolsets {
                    // One per toolset per step: bounded.
                    toolset.tell(self.probe.id(), InterruptStep { step });
                }
                if let Some(turn) = self.turn.as_mut() {
                    turn.phase = Phase::Calling { step, toolsets };
                }
                // Calls answered by the activity itself may all be in already.
                self.maybe_commit(ctx);
            }
            Phase::Playing(outcome) => self.finish_turn(outcome, ctx),
            Phase::Between => self.finish_turn(TurnOutcome::default(), ctx),
        }
        Ok(Some(rx))
    }

    /// A pause (a sub-task starts) while the model still streams: the generation stops
    /// where it is and the turn ends interrupted. A turn waiting on its calls stays open
    /// (it commits on resume); if it was interrupted, whoever waits for the interruption
    /// (`Session::interrupt`) is answered now: the turn runs no further step, and its
    /// end waits for a sub-task that only the user and the model can finish.
    pub(super) fn stop_generation_for_pause(&mut self, ctx: &mut Context<Self>) {
        if self.generation_mut(None).is_some() {
            let _ = self.interrupt(true, ctx);
        }
        if let Some(turn) = self.turn.as_mut().filter(|t| t.interrupted) {
            for ended in turn.ended.drain(..) {
                let _ = ended.send(());
            }
        }
    }

    /// A close while the model still streams: what was said is kept, the stream dropped,
    /// the output told to stop.
    pub(super) fn stop_generation_for_close(&mut self, ctx: &mut Context<Self>) {
        if let Some(generation) = self.take_generation(None) {
            self.close_generation(generation, Ending::Cut, ctx);
        }
    }
}
