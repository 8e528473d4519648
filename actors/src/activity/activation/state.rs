//! An activation's own state in a session snapshot: what it writes
//! ([`Activation::part`]) and reads back ([`Activation::new`] with a [`Restored`]).
//!
//! It holds what the chat context does not: the items pending for a deferred reply, where
//! its latest reply was generated from, and the turn's step that was under way. A step
//! whose model had not answered — its stream in flight, no call of it started — is asked
//! again (`redo`). A step whose calls went to their toolsets stays open (`step`): its
//! calls' outputs so far, the items held for them, and the calls still without an output,
//! each of whose bodies may have started, so each follows its tool's restore policy and
//! its output goes into the step; the step is never asked again.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use super::{Activation, Command, Phase, State, Turn, TurnOutcome};
use crate::activity::barge_in::{BargeIn, BargeInState};
use crate::activity::latency::TurnTimer;
use crate::activity::ledger::output_call_id;
use crate::activity::turn::{Ask, EarlyReport, Redo, ToolsetKey};
use crate::agent::Agent;
use crate::chat::{ChatItem, FunctionCall};
use crate::delivery::DeliveryAnswer;
use crate::history::AgentChat;
use crate::outcome::{EffectState, OutputState};
use crate::speech::Interruptibility;
use crate::usage::Usage;

use super::PendingItem;

/// An activation's state, as a snapshot writes it (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct ActivationState {
    /// Chat length its latest assistant message was generated from.
    pub(crate) last_reply_view: usize,
    /// Tool items that landed here and ask for a deferred reply.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) pending: Vec<PendingItem>,
    /// A step whose model had not answered: asked again on restore, first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) redo: Option<Redo>,
    /// A step whose calls went to their toolsets: open again on restore.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) step: Option<OpenStep>,
    /// The user talking over the step under way (a barge-in): it goes on after the
    /// restore, its deadline as near as it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) barge_in: Option<BargeInState>,
}

/// A turn's step whose calls went to their toolsets, waiting for their outputs (or, in a
/// paused caller, for the caller to resume).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct OpenStep {
    /// Its id (its calls' runs carry it).
    pub(crate) step: u64,
    /// What the turn's requests ask for.
    pub(crate) ask: Ask,
    /// The steps the turn has taken, this one included.
    pub(crate) steps: u32,
    /// The turn was interrupted while the step's calls ran: no further step runs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) interrupted: bool,
    pub(crate) calls: Vec<FunctionCall>,
    /// Each call's immediate output, once in.
    pub(crate) outputs: Vec<Option<OutputState>>,
    /// Items held until the step is in the chat context, in order: calls' later items,
    /// and the `/finished` pairs a pause wrote for the step's calls in the background.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) held: Vec<HeldItems>,
}

impl OpenStep {
    /// Whether the item with this call id is held until the step is in.
    pub(crate) fn holds(&self, call_id: &str) -> bool {
        self.held
            .iter()
            .any(|held| output_call_id(&held.items).as_deref() == Some(call_id))
    }

    /// The calls still without an output: the ones whose restore policy decides.
    pub(crate) fn waiting(&self) -> impl Iterator<Item = (usize, &FunctionCall)> {
        self.calls
            .iter()
            .enumerate()
            .filter(|(index, _)| self.outputs.get(*index).is_none_or(Option::is_none))
    }
}

/// Items held for a call of an open step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct HeldItems {
    /// The call they are for.
    pub(crate) call_id: String,
    pub(crate) items: Vec<ChatItem>,
}

/// What an activation contributes to a session snapshot: its history entry (the chat
/// context as committed: an open step is not in it), the messages of speeches still
/// playing (a snapshot keeps them as a barge-in would: marked interrupted, heard
/// unknown), its state, and what its turn decided that the session has not run yet.
pub(crate) struct Part {
    /// Its history entry now (none before it started).
    pub(crate) entry: Option<(u32, AgentChat)>,
    pub(crate) playing: Vec<usize>,
    pub(crate) state: ActivationState,
    /// A handoff or task end its turn decided, waiting for its speech to play out.
    pub(crate) decided: Option<Decided>,
}

/// What a turn decided that has not run yet.
pub(crate) enum Decided {
    Handoff(crate::handoff::Handoff),
    EndTask(serde_json::Value),
}

/// An activation brought back from a snapshot.
pub(crate) struct Restored {
    pub(crate) state: ActivationState,
    /// Paused under a sub-task (a caller), rather than current.
    pub(crate) paused: bool,
    /// Where the turn of an open step answers once it ends.
    pub(crate) turn_done: Option<oneshot::Sender<TurnOutcome>>,
    /// The agents that outputs of the open step hand off to, in call order (built again
    /// by the agent registry).
    pub(crate) handoffs: VecDeque<Agent>,
    /// Whether the turn of the open step may be interrupted: shared with the runs of its
    /// calls, which the session restores too.
    pub(crate) interruptibility: Arc<Interruptibility>,
    /// For a held update whose answer had not reached its body at the snapshot (by its
    /// call id, `{id}/update_n`): where the answer goes once it lands — the body run again
    /// that says it again waits for it, as the first one did.
    pub(crate) held_answers: HashMap<String, DeliveryAnswer>,
}

/// A call of a restored open step still without an output: its tool's restore policy
/// decides, and its output goes into the step.
pub(crate) struct WaitingCall {
    pub(crate) step: u64,
    pub(crate) index: usize,
    pub(crate) call: FunctionCall,
    /// The toolset that runs its tool (none: the restored agent does not have it).
    pub(crate) toolset: Option<ToolsetKey>,
    pub(crate) interruptibility: Arc<Interruptibility>,
}

impl Activation {
    /// Its part of a session snapshot (see [`Part`]).
    pub(crate) fn part(&self) -> Part {
        let turn = match &self.state {
            State::Running(turn) | State::Paused(Some(turn)) => Some(turn),
            State::Closing { turn, .. } => turn.as_ref(),
            _ => None,
        };
        let chat = self.ledger.chat();
        let mut playing = Vec::new();
        let mut redo = None;
        let mut step = None;
        let mut decided = None;
        if let Some(turn) = turn {
            for speech in turn.speeches.iter().filter(|s| !s.is_done()) {
                playing.extend(chat.position_of_speech(speech.id()));
            }
            match &turn.phase {
                Phase::Calling { step: id, .. } => {
                    // Also a paused step whose calls all have their outputs (a sub-task the
                    // host started paused it): it is committed on resume.
                    let slots: Vec<_> = self.ledger.open_slots().collect();
                    step = Some(OpenStep {
                        step: *id,
                        ask: turn.ask.clone(),
                        steps: turn.steps,
                        interrupted: turn.interrupted,
                        calls: slots.iter().map(|(call, _)| (*call).clone()).collect(),
                        outputs: slots
                            .iter()
                            .map(|(_, out)| out.map(|out| out.state()))
                            .collect(),
                        held: self
                            .ledger
                            .held()
                            .map(|(call_id, items)| HeldItems {
                                call_id: call_id.to_owned(),
                                items: items.to_vec(),
                            })
                            .collect(),
                    });
                }
                // The model has not answered: none of the step's calls started.
                Phase::Generating(generation) if matches!(self.state, State::Running(_)) => {
                    redo = Some(Redo {
                        step: generation.step,
                        speech: generation
                            .speech
                            .as_ref()
                            .map(|s| s.id().0)
                            .or(generation.redone_speech),
                        heard: generation
                            .early_report
                            .as_ref()
                            .map(|(interrupted, heard)| EarlyReport {
                                interrupted: *interrupted,
                                heard: heard.clone(),
                            }),
                        view: generation.view,
                        ask: turn.ask.clone(),
                    });
                }
                Phase::Playing { outcome, .. } => {
                    decided = match (&outcome.handoff, &outcome.task_result) {
                        (Some(handoff), _) => Some(Decided::Handoff(handoff.clone())),
                        (None, Some(value)) => Some(Decided::EndTask(value.clone())),
                        (None, None) => None,
                    };
                }
                Phase::Generating(_) => {}
            }
        }
        // A barge-in belongs to the turn: kept only with a step a restore goes on with.
        let barge_in = (redo.is_some()
            || step.is_some() && matches!(self.state, State::Running(_)))
        .then(|| self.barge_in.state(tokio::time::Instant::now()))
        .flatten();
        Part {
            entry: self.history_entry(true),
            playing,
            state: ActivationState {
                last_reply_view: self.last_reply_view,
                pending: self.pending.clone(),
                redo,
                step,
                barge_in,
            },
            decided,
        }
    }

    /// Puts a restored activation where it was: listening, or paused, or — with an open
    /// step — running or paused with the step open in the ledger, its outputs so far in
    /// and its held items held again. An interrupted step's calls are interrupted again
    /// (`out`), once their runs are restored.
    pub(crate) fn restore(&mut self, restored: Restored, out: &mut Vec<Command>) {
        let Restored {
            state,
            paused,
            turn_done,
            mut handoffs,
            interruptibility,
            mut held_answers,
        } = restored;
        self.last_reply_view = state.last_reply_view;
        self.pending.extend(state.pending);
        if let Some(barge_in) = state.barge_in {
            self.barge_in = BargeIn::restored(barge_in, tokio::time::Instant::now());
        }
        let (Some(open), Some(done)) = (state.step, turn_done) else {
            self.state = if paused {
                State::Paused(None)
            } else {
                State::Listening
            };
            return;
        };
        let step = open.step;
        let toolsets: Vec<ToolsetKey> = open.waiting().fold(Vec::new(), |mut keys, (_, call)| {
            if let Some(key) = self.tools.routes.get(&call.name) {
                if !keys.contains(key) {
                    keys.push(*key);
                }
            }
            keys
        });
        self.ledger.open_step(step, open.calls, &mut |_| {});
        for (index, output) in open.outputs.into_iter().enumerate() {
            if let Some(output) = output {
                let agent = match output.effect {
                    EffectState::Handoff(_) => handoffs.pop_front(),
                    _ => None,
                };
                self.ledger.answer(step, index, output.restore(agent));
            }
        }
        // Held again until the step is in the chat context, as they were.
        for held in open.held {
            let answer = output_call_id(&held.items)
                .and_then(|id| held_answers.remove(&id))
                .unwrap_or_else(DeliveryAnswer::unheard);
            let _ = self
                .ledger
                .insert(&held.call_id, held.items, answer, &mut |_| {});
        }
        if open.interrupted && !toolsets.is_empty() {
            out.push(Command::InterruptStep {
                step,
                toolsets: toolsets.clone(),
            });
        }
        let span = tracing::info_span!(
            parent: &self.shared.span,
            "turn",
            session = %self.shared.id(),
            agent = %self.agent.name(),
            kind = "restored",
        );
        let turn = Box::new(Turn {
            events: Vec::new(),
            steps: open.steps,
            ask: open.ask,
            interrupted: open.interrupted,
            interruptibility,
            speeches: Vec::new(),
            done,
            waiters: Vec::new(),
            span,
            timer: TurnTimer::new(tokio::time::Instant::now(), "restored"),
            usage: Usage::default(),
            phase: Phase::Calling { step, toolsets },
        });
        self.state = if paused {
            State::Paused(Some(turn))
        } else {
            State::Running(turn)
        };
        // Its one timer: a barge-in's deadline.
        self.arm(out);
    }

    /// For a restored activation with an open step: its calls still without an output,
    /// each with the toolset that runs its tool.
    pub(crate) fn waiting_calls(&self) -> Vec<WaitingCall> {
        let turn = match &self.state {
            State::Running(turn) | State::Paused(Some(turn)) => turn,
            _ => return Vec::new(),
        };
        let Phase::Calling { step, .. } = turn.phase else {
            return Vec::new();
        };
        self.ledger
            .open_slots()
            .enumerate()
            .filter(|(_, (_, out))| out.is_none())
            .map(|(index, (call, _))| WaitingCall {
                step,
                index,
                toolset: self.tools.routes.get(&call.name).copied(),
                call: call.clone(),
                interruptibility: turn.interruptibility.clone(),
            })
            .collect()
    }
}
