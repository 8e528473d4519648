//! The LLM turn loop of an activity: one LLM step after another, tool calls dispatched to
//! their toolsets, each step committed to the chat context once every call has its
//! immediate output, later items held until their own step is in.

use actix::prelude::*;
use futures_util::StreamExt;
use tokio::sync::oneshot;

use super::{companions, ActivityActor, Held, LlmReply, Slot, Status, Turn, TurnKind, TurnOutcome};
use crate::agent::TurnDecision;
use crate::chat::{ChatItem, ChatMessage, ChatRole, FunctionCall, FunctionCallOutput};
use crate::error::{SessionError, UpdateError};
use crate::events::{AgentState, SessionEvent};
use crate::io::{Playout, SpeechId};
use crate::llm::{LlmError, LlmRequest, ToolChoice};
use crate::outcome::{terminal_pair, CallOutput, Effect};
use crate::prompts::ReplyPromptArgs;
use crate::session::PendingItem;
use crate::toolset::RunTool;

pub(super) enum StepNext {
    LlmStep,
    Finish(TurnOutcome),
}

impl ActivityActor {
    pub(super) fn begin_turn(
        &mut self,
        kind: TurnKind,
        done: oneshot::Sender<TurnOutcome>,
        ctx: &mut Context<Self>,
    ) {
        self.turn = Some(Turn {
            events: Vec::new(),
            steps: 0,
            step_key: 0,
            slots: Vec::new(),
            tool_choice: ToolChoice::Auto,
            extra_instructions: None,
            awaiting_playout: None,
            finished: None,
            done: Some(done),
        });
        self.set_state(AgentState::Thinking);
        match kind {
            TurnKind::User(text) => {
                self.session
                    .shared
                    .emit(SessionEvent::UserInputTranscribed { text: text.clone() });
                let mut message = ChatMessage {
                    role: ChatRole::User,
                    content: text,
                };
                let decision = match &self.agent.def.on_user_turn_completed {
                    Some(hook) => hook(&mut self.chat, &mut message),
                    None => TurnDecision::Reply,
                };
                self.record(ChatItem::Message(message));
                if decision == TurnDecision::StopResponse {
                    self.finish_turn(TurnOutcome::default());
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
                    tracing::debug!(agent = %self.agent.name(), "deferred reply skipped: the agent already spoke with the updates in view");
                    self.finish_turn(TurnOutcome::default());
                    return;
                }
            }
        }
        self.start_llm_step(ctx);
    }

    /// Inserts pending items this agent lacks; decides whether a reply is still due.
    pub(super) fn prepare_deferred(&mut self, pending: Vec<PendingItem>) -> bool {
        let mut newest = None;
        let mut ids = Vec::new();
        for item in pending {
            // An agent that became current after the update lacks it: insert it first, so
            // the reply never names a call id the model cannot see.
            let position = self
                .chat
                .position_of_call(&item.call_id)
                .unwrap_or_else(|| {
                    self.chat.extend(item.items.iter().cloned());
                    self.chat.len() - item.items.len()
                });
            newest = newest.max(Some(position));
            ids.push(item.call_id);
        }
        let Some(newest) = newest else {
            return false;
        };
        // Judged by chat position: an assistant message generated with the newest item in
        // view already answered it.
        if self.last_reply_view > newest {
            return false;
        }
        if let Some(turn) = self.turn.as_mut() {
            turn.tool_choice = ToolChoice::None;
            let prompts = self.agent.def.prompts.or(&self.session.shared.prompts);
            turn.extra_instructions = Some(prompts.render_reply(&ReplyPromptArgs {
                pending_call_ids: ids,
            }));
        }
        true
    }

    pub(super) fn start_llm_step(&mut self, ctx: &mut Context<Self>) {
        let Some(turn) = self.turn.as_mut() else {
            return;
        };
        turn.steps += 1;
        self.step_seq += 1;
        turn.step_key = self.step_seq;
        let step_key = self.step_seq;
        let request = LlmRequest {
            agent: self.agent.def.name.clone(),
            instructions: self.agent.def.instructions.clone(),
            extra_instructions: turn.extra_instructions.clone(),
            chat: self.chat.clone(),
            tools: self.schemas.clone(),
            tool_choice: turn.tool_choice,
        };
        let view = self.chat.len();
        let stream = self.llm.chat(request);
        let shared = self.session.shared.clone();
        let agent = self.agent_name();
        let fut = async move {
            let mut stream = stream;
            let mut reply = LlmReply {
                text: String::new(),
                calls: Vec::new(),
                speech: None,
                playout: Playout::Done,
                usage: None,
            };
            while let Some(chunk) = stream.next().await {
                match chunk? {
                    crate::llm::LlmChunk::Text(text) => {
                        let speech = match reply.speech {
                            Some(speech) => speech,
                            None => {
                                let speech = SpeechId(shared.next_speech());
                                shared.io().speech_started(speech, &agent);
                                shared.emit(SessionEvent::SpeechCreated {
                                    agent: agent.clone(),
                                    speech,
                                });
                                shared.emit(SessionEvent::AgentStateChanged {
                                    agent: agent.clone(),
                                    state: AgentState::Speaking,
                                });
                                reply.speech = Some(speech);
                                speech
                            }
                        };
                        shared.io().speech_chunk(speech, &text);
                        reply.text.push_str(&text);
                    }
                    crate::llm::LlmChunk::ToolCall(call) => reply.calls.push(call),
                    crate::llm::LlmChunk::Usage(usage) => reply.usage = Some(usage),
                }
            }
            if let Some(speech) = reply.speech {
                reply.playout = shared.io().speech_finished(speech);
            }
            Ok::<_, LlmError>(reply)
        };
        self.llm_task = Some(
            ctx.spawn(
                fut.into_actor(self)
                    .map(move |res, act, ctx| act.on_llm_reply(step_key, view, res, ctx)),
            ),
        );
    }

    pub(super) fn on_llm_reply(
        &mut self,
        step_key: u64,
        view: usize,
        res: Result<LlmReply, LlmError>,
        ctx: &mut Context<Self>,
    ) {
        self.llm_task = None;
        if self.turn.as_ref().map(|t| t.step_key) != Some(step_key) || self.status == Status::Closed
        {
            return;
        }
        let reply = match res {
            Ok(reply) => reply,
            Err(err) => {
                self.session.shared.emit(SessionEvent::Error {
                    message: err.to_string(),
                });
                self.finish_turn(TurnOutcome {
                    failure: Some(SessionError::Llm(err)),
                    ..Default::default()
                });
                return;
            }
        };
        if !reply.text.is_empty() {
            self.last_reply_view = view;
            self.record(ChatItem::message(ChatRole::Assistant, reply.text));
        }
        if let (Some(speech), Playout::Pending) = (reply.speech, reply.playout) {
            if let Some(turn) = self.turn.as_mut() {
                turn.awaiting_playout = Some(speech);
            }
        }
        if reply.calls.is_empty() {
            self.finish_turn(TurnOutcome::default());
            return;
        }
        self.dispatch_calls(reply.calls, ctx);
    }

    pub(super) fn dispatch_calls(
        &mut self,
        calls: Vec<crate::llm::ToolCallChunk>,
        ctx: &mut Context<Self>,
    ) {
        let shared = self.session.shared.clone();
        let step_key = self.step_seq;
        let mut slots = Vec::with_capacity(calls.len());
        for chunk in calls {
            let call = FunctionCall {
                call_id: shared.unique_call_id(&chunk.call_id),
                name: chunk.name,
                arguments: chunk.arguments,
            };
            self.uncommitted.insert(call.call_id.clone());
            slots.push(Slot { call, output: None });
        }
        for (index, slot) in slots.iter_mut().enumerate() {
            if self.companions && companions::is_companion(&slot.call.name) {
                let answer = companions::answer(
                    slot.call.name.clone(),
                    slot.call.arguments.clone(),
                    self.visible_toolsets(),
                    self.id().clone(),
                );
                ctx.spawn(answer.into_actor(self).map(move |out, act, ctx| {
                    act.on_call_output(step_key, index, out, ctx);
                }));
                continue;
            }
            let Some(toolset) = self.routes.get(&slot.call.name) else {
                let available: Vec<&str> = self.schemas.iter().map(|s| s.name.as_str()).collect();
                slot.output = Some(CallOutput::error(format!(
                    "Error: unknown tool {}; available tools: {}",
                    slot.call.name,
                    available.join(", ")
                )));
                continue;
            };
            let ask = toolset.ask(
                self.probe.id(),
                RunTool {
                    call: slot.call.clone(),
                    step: step_key,
                    agent: self.agent.clone(),
                },
            );
            ctx.spawn(ask.into_actor(self).map(move |res, act, ctx| {
                let out = res.unwrap_or_else(|_| CallOutput::ended("the toolset stopped"));
                act.on_call_output(step_key, index, out, ctx);
            }));
        }
        if let Some(turn) = self.turn.as_mut() {
            turn.slots = slots;
        }
        self.maybe_commit(ctx);
    }

    pub(super) fn on_call_output(
        &mut self,
        step_key: u64,
        index: usize,
        out: CallOutput,
        ctx: &mut Context<Self>,
    ) {
        let Some(turn) = self.turn.as_mut() else {
            return;
        };
        if turn.step_key != step_key || turn.finished.is_some() {
            return;
        }
        if let Some(slot) = turn.slots.get_mut(index) {
            if slot.output.is_none() {
                slot.output = Some(out);
            }
        }
        self.maybe_commit(ctx);
    }

    pub(super) fn maybe_commit(&mut self, ctx: &mut Context<Self>) {
        let ready = self.turn.as_ref().is_some_and(|t| {
            t.finished.is_none()
                && !t.slots.is_empty()
                && t.slots.iter().all(|s| s.output.is_some())
        });
        if !ready || self.status == Status::Paused {
            // A paused activity commits on resume, so its items land after the sub-task.
            return;
        }
        let next = self.commit_step();
        match next {
            StepNext::LlmStep => self.start_llm_step(ctx),
            StepNext::Finish(mut outcome) => {
                if self.status == Status::Closed {
                    outcome.failure.get_or_insert(SessionError::Closed);
                }
                self.finish_turn(outcome)
            }
        }
    }

    /// Appends the step's calls and outputs (and any items held for them); decides what
    /// follows.
    pub(super) fn commit_step(&mut self) -> StepNext {
        let Some(turn) = self.turn.as_mut() else {
            return StepNext::Finish(TurnOutcome::default());
        };
        let slots = std::mem::take(&mut turn.slots);
        let mut calls = Vec::with_capacity(slots.len());
        let mut outputs = Vec::with_capacity(slots.len());
        let mut effects = Vec::with_capacity(slots.len());
        for slot in slots {
            let out = slot
                .output
                .unwrap_or_else(|| CallOutput::ended("no output"));
            outputs.push(FunctionCallOutput {
                call_id: slot.call.call_id.clone(),
                name: slot.call.name.clone(),
                output: out.output,
                is_error: out.is_error,
            });
            effects.push((
                slot.call.name.clone(),
                slot.call.call_id.clone(),
                out.effect,
            ));
            calls.push(slot.call);
        }
        for call in &calls {
            self.record(ChatItem::FunctionCall(call.clone()));
        }
        for output in &outputs {
            self.record(ChatItem::FunctionCallOutput(output.clone()));
        }
        for call in &calls {
            self.uncommitted.remove(&call.call_id);
        }
        self.release_held();
        self.session
            .shared
            .emit_with(|| SessionEvent::FunctionToolsExecuted {
                agent: self.agent_name(),
                calls,
                outputs,
            });
        let mut outcome = TurnOutcome::default();
        let mut reply = false;
        for (name, call_id, effect) in effects {
            match effect {
                Effect::Reply => reply = true,
                Effect::Quiet => {}
                Effect::Handoff(handoff) => {
                    // One handoff per step: the first one wins, the others are logged.
                    if outcome.handoff.is_none() {
                        outcome.handoff = Some(handoff);
                    } else {
                        tracing::warn!(tool = %name, "a second handoff in one step was ignored");
                    }
                }
                Effect::CompleteTask(value) => outcome.task_result = Some(value),
                Effect::Propagate(message) => {
                    self.session.shared.emit(SessionEvent::Error {
                        message: format!("tool {name} failed: {message}"),
                    });
                    outcome.failure.get_or_insert(SessionError::ToolFailed {
                        tool: name,
                        call_id,
                        message,
                    });
                }
            }
        }
        let steps = self.turn.as_ref().map_or(0, |t| t.steps);
        let may_continue = outcome.handoff.is_none()
            && outcome.task_result.is_none()
            && outcome.failure.is_none()
            && self.status == Status::Active;
        if reply && may_continue && steps < self.session.shared.config.max_tool_steps {
            StepNext::LlmStep
        } else {
            StepNext::Finish(outcome)
        }
    }

    pub(super) fn release_held(&mut self) {
        let (ready, still): (Vec<Held>, Vec<Held>) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|h| !self.uncommitted.contains(&h.base_call_id));
        self.held = still;
        for held in ready {
            for item in held.items {
                self.record_outside_turn(item);
            }
            if let Some(reply) = held.reply {
                let _ = reply.send(Ok(()));
            }
        }
    }

    /// Appends an item that does not belong to the running turn's events.
    pub(super) fn record_outside_turn(&mut self, item: ChatItem) {
        self.session
            .shared
            .emit_with(|| SessionEvent::ConversationItemAdded {
                agent: self.agent_name(),
                item: item.clone(),
            });
        self.chat.push(item);
    }

    pub(super) fn finish_turn(&mut self, outcome: TurnOutcome) {
        let Some(turn) = self.turn.as_mut() else {
            return;
        };
        if turn.awaiting_playout.is_some() {
            turn.finished = Some(outcome);
            return;
        }
        let mut turn = match self.turn.take() {
            Some(turn) => turn,
            None => return,
        };
        let mut outcome = outcome;
        let mut events = std::mem::take(&mut turn.events);
        events.append(&mut outcome.events);
        outcome.events = events;
        if let Some(done) = turn.done.take() {
            let _ = done.send(outcome);
        }
        self.set_state(AgentState::Listening);
    }

    /// Gives every call of an unfinished step its terminal output and commits it.
    pub(super) fn abort_step(&mut self, reason: &str) {
        if let Some(turn) = self.turn.as_mut() {
            for slot in turn.slots.iter_mut() {
                if slot.output.is_none() {
                    slot.output = Some(CallOutput::ended(reason));
                }
            }
            if !turn.slots.is_empty() {
                let _ = self.commit_step();
            }
        }
    }

    /// Writes the `/finished` output of background calls that were stopped; held like any
    /// later item while the call's own step is uncommitted (a pause mid-step).
    pub(super) fn write_terminal(&mut self, calls: Vec<FunctionCall>, reason: &str) {
        for call in calls {
            let base_call_id = call.call_id.clone();
            let items = terminal_pair(call, reason).to_vec();
            if self.uncommitted.contains(&base_call_id) {
                self.held.push(Held {
                    base_call_id,
                    items,
                    reply: None,
                });
            } else {
                for item in items {
                    self.record_outside_turn(item);
                }
            }
        }
    }

    /// Refuses the tools' held updates (their scope is pausing or closing); the engine's
    /// own terminal items stay held until their step commits.
    pub(super) fn refuse_held(&mut self) {
        let (terminal, waiting): (Vec<Held>, Vec<Held>) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|h| h.reply.is_none());
        self.held = terminal;
        for held in waiting {
            let Some(reply) = held.reply else { continue };
            let _ = reply.send(Err(UpdateError::ScopeClosed {
                call_id: held.base_call_id,
            }));
        }
    }
}
