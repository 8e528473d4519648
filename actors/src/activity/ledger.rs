//! The step ledger of an activity: its chat context, and the one LLM step whose calls wait
//! for their immediate outputs.
//!
//! Rules, each with a unit test below:
//! - A step goes into the chat context whole, once its last call has an output: every
//!   call of the step, then every output, in call order.
//! - Items for a call of the open step (an `/update_n`, a terminal `/finished`) are held
//!   until the step is in, then appended in arrival order: an `/update_1` before its
//!   call's output would make the provider reject the request.
//! - Aborting a step gives each call still without an output a terminal one first.
//!
//! So every function call in the chat context has exactly one output after it, whatever
//! order outputs, updates, aborts and terminal items arrive in. The actor only feeds it.

use super::heard;
use crate::chat::{ChatContext, ChatItem, FunctionCall, FunctionCallOutput};
use crate::delivery::DeliveryAnswer;
use crate::error::UpdateError;
use crate::outcome::{terminal_pair, CallOutput, Effect, StoppedCall};
use crate::output::SpeechId;

/// What cutting a message to what was heard did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Cut {
    /// No message of that speech.
    NotFound,
    /// The message at this index now says what was heard, marked interrupted.
    Shortened(usize),
    /// Nothing was heard: the message at this index was removed (an empty assistant
    /// message is never kept: providers reject them).
    Removed(usize),
}

/// Cuts the assistant message at `index` in `items` to what was heard of it, marking it
/// interrupted: `heard` only finds the cut in the message's own text (`heard.rs`), so
/// what stays is always a prefix of what the agent said — all of it when the cut is
/// unknown, none (the message goes) when nothing was heard.
pub(crate) fn cut_to_heard(items: &mut Vec<ChatItem>, index: usize, heard: Option<&str>) -> Cut {
    let Some(ChatItem::Message(message)) = items.get_mut(index) else {
        return Cut::NotFound;
    };
    match super::heard::cut(&message.content, heard) {
        heard::Cut::Nothing => {
            items.remove(index);
            Cut::Removed(index)
        }
        heard::Cut::Upto(end) => {
            message.content.truncate(end);
            message.interrupted = true;
            Cut::Shortened(index)
        }
        heard::Cut::Unknown => {
            message.interrupted = true;
            Cut::Shortened(index)
        }
    }
}

/// Told of every item appended to the chat context (events, the turn's record).
pub(crate) type Sink<'a> = &'a mut dyn FnMut(&ChatItem);

#[derive(Debug, Default)]
pub(crate) struct Ledger {
    chat: ChatContext,
    step: Option<Step>,
    held: Vec<Held>,
}

#[derive(Debug)]
struct Step {
    key: u64,
    slots: Vec<Slot>,
}

#[derive(Debug)]
struct Slot {
    call: FunctionCall,
    output: Option<CallOutput>,
}

#[derive(Debug)]
struct Held {
    base_call_id: String,
    items: Vec<ChatItem>,
    /// The tool's `ctx.update` waiting for the items; unheard for the engine's own
    /// terminal items.
    answer: DeliveryAnswer,
}

/// A step as it went into the chat context.
#[derive(Debug)]
pub(crate) struct Committed {
    pub(crate) calls: Vec<FunctionCall>,
    pub(crate) outputs: Vec<FunctionCallOutput>,
    /// Per call, in order: what its output makes happen.
    pub(crate) effects: Vec<Effect>,
}

/// Where inserted items went.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Inserted {
    /// In the chat context now.
    Appended,
    /// Waiting for their call's step to be committed.
    Held,
}

impl Ledger {
    pub(crate) fn new(chat: ChatContext) -> Self {
        Self {
            chat,
            ..Self::default()
        }
    }

    pub(crate) fn chat(&self) -> &ChatContext {
        &self.chat
    }

    /// The chat context for a hook that edits it (`on_user_turn_completed`, which runs
    /// before the turn's first step, when no step is open).
    pub(crate) fn chat_mut(&mut self) -> &mut ChatContext {
        &mut self.chat
    }

    /// Cuts the assistant message said by `speech` to what the user heard (see
    /// [`cut_to_heard`]).
    pub(crate) fn cut_speech(&mut self, speech: SpeechId, heard: Option<&str>) -> Cut {
        let Some(index) = self.chat.position_of_speech(speech) else {
            return Cut::NotFound;
        };
        self.chat.edit(|items| cut_to_heard(items, index, heard))
    }

    /// Appends an item that belongs to no step (a message, a handoff marker).
    pub(crate) fn append(&mut self, item: ChatItem, sink: Sink<'_>) {
        sink(&item);
        self.chat.push(item);
    }

    /// Takes `chat` as the chat context: it is this one with items appended (a
    /// preemptive request's, whose last item is the user's message), so the items are not
    /// copied; each appended item goes to the sink. No step may be open (a turn's start).
    /// A `chat` that is not this one grown (never, as the caller checks) is appended to
    /// item by item instead.
    pub(crate) fn adopt(&mut self, chat: ChatContext, sink: Sink<'_>) {
        let from = self.chat.len();
        if chat.extends(&self.chat) && self.step.is_none() {
            for item in &chat.items()[from..] {
                sink(item);
            }
            self.chat = chat;
        } else {
            for item in chat.items().iter().skip(from) {
                sink(item);
                self.chat.push(item.clone());
            }
        }
    }

    /// Opens a step with these calls. A step still open is aborted first ("superseded"),
    /// so the invariant holds even if a caller got the order wrong.
    pub(crate) fn open_step(&mut self, key: u64, calls: Vec<FunctionCall>, sink: Sink<'_>) {
        if self.step.is_some() {
            self.abort("superseded by a newer step", sink);
        }
        self.step = Some(Step {
            key,
            slots: calls
                .into_iter()
                .map(|call| Slot { call, output: None })
                .collect(),
        });
    }

    /// The open step's calls, each with its output if it has one, for a snapshot.
    pub(crate) fn open_slots(&self) -> impl Iterator<Item = (&FunctionCall, Option<&CallOutput>)> {
        self.step.iter().flat_map(|s| {
            s.slots
                .iter()
                .map(|slot| (&slot.call, slot.output.as_ref()))
        })
    }

    /// The items held for calls of the open step, in order, for a snapshot.
    pub(crate) fn held(&self) -> impl Iterator<Item = (&str, &[ChatItem])> {
        self.held
            .iter()
            .map(|h| (h.base_call_id.as_str(), h.items.as_slice()))
    }

    /// The calls of the open step, in order.
    pub(crate) fn open_calls(&self) -> impl Iterator<Item = &FunctionCall> {
        self.step
            .iter()
            .flat_map(|s| s.slots.iter().map(|slot| &slot.call))
    }

    /// Records the immediate output of call `index` of step `key`; a late answer for a
    /// step no longer open, or a second answer, is ignored. Returns whether every call of
    /// the open step now has its output.
    pub(crate) fn answer(&mut self, key: u64, index: usize, out: CallOutput) -> bool {
        let Some(step) = self.step.as_mut().filter(|s| s.key == key) else {
            return false;
        };
        if let Some(slot) = step.slots.get_mut(index) {
            slot.output.get_or_insert(out);
        }
        self.is_complete()
    }

    /// Whether a step is open and every call of it has an output.
    pub(crate) fn is_complete(&self) -> bool {
        self.step
            .as_ref()
            .is_some_and(|s| s.slots.iter().all(|slot| slot.output.is_some()))
    }

    /// Appends the open step if it is complete: its calls, their outputs, then the items
    /// held for them.
    pub(crate) fn commit(&mut self, sink: Sink<'_>) -> Option<Committed> {
        if !self.is_complete() {
            return None;
        }
        let mut step = self.step.take()?;
        crate::outcome::keep_first_ending(step.slots.iter_mut().filter_map(|s| s.output.as_mut()));
        let mut calls = Vec::with_capacity(step.slots.len());
        let mut outputs = Vec::with_capacity(step.slots.len());
        let mut effects = Vec::with_capacity(step.slots.len());
        for slot in step.slots {
            // `is_complete` checked every slot has one.
            let out = slot
                .output
                .unwrap_or_else(|| CallOutput::ended("no output"));
            outputs.push(FunctionCallOutput {
                call_id: slot.call.call_id.clone(),
                name: slot.call.name.clone(),
                output: out.output,
                is_error: out.is_error,
            });
            effects.push(out.effect);
            calls.push(slot.call);
        }
        for call in &calls {
            self.append(ChatItem::FunctionCall(call.clone()), sink);
        }
        for output in &outputs {
            self.append(ChatItem::FunctionCallOutput(output.clone()), sink);
        }
        self.release_held(sink);
        Some(Committed {
            calls,
            outputs,
            effects,
        })
    }

    /// Gives every call of the open step still without an output a terminal one, then
    /// commits it.
    pub(crate) fn abort(&mut self, reason: &str, sink: Sink<'_>) -> Option<Committed> {
        let step = self.step.as_mut()?;
        for slot in &mut step.slots {
            slot.output.get_or_insert_with(|| CallOutput::ended(reason));
        }
        self.commit(sink)
    }

    /// Adds a call's later items: held while the call's step is open, appended otherwise.
    /// `answer` learns when they land (or that they never will).
    pub(crate) fn insert(
        &mut self,
        base_call_id: &str,
        items: Vec<ChatItem>,
        answer: DeliveryAnswer,
        sink: Sink<'_>,
    ) -> Inserted {
        if self.open_calls().any(|c| c.call_id == base_call_id) {
            self.held.push(Held {
                base_call_id: base_call_id.to_owned(),
                items,
                answer,
            });
            return Inserted::Held;
        }
        for item in items {
            self.append(item, sink);
        }
        answer.send(Ok(()));
        Inserted::Appended
    }

    /// Writes the `/finished` pair of background calls that were stopped, saying why;
    /// held like any later item while the call's own step is open.
    pub(crate) fn write_terminal(&mut self, calls: Vec<StoppedCall>, reason: &str, sink: Sink<'_>) {
        for call in calls {
            let base = call.call.call_id.clone();
            let items = terminal_pair(call, reason).to_vec();
            self.insert(&base, items, DeliveryAnswer::unheard(), sink);
        }
    }

    /// Refuses the tools' held updates (their scope is pausing or closing: they will
    /// never land); the engine's own terminal items stay held until their step commits.
    /// Returns the output call ids of the refused items.
    pub(crate) fn refuse_held(&mut self) -> Vec<String> {
        let mut kept = Vec::new();
        let mut refused = Vec::new();
        for held in std::mem::take(&mut self.held) {
            if held.answer.is_heard() {
                refused.extend(output_call_id(&held.items));
                held.answer.send(Err(UpdateError::ScopeClosed {
                    call_id: held.base_call_id,
                }));
            } else {
                kept.push(held);
            }
        }
        self.held = kept;
        refused
    }

    fn release_held(&mut self, sink: Sink<'_>) {
        let (ready, still): (Vec<Held>, Vec<Held>) =
            std::mem::take(&mut self.held).into_iter().partition(|h| {
                !self
                    .step
                    .iter()
                    .flat_map(|s| s.slots.iter())
                    .any(|slot| slot.call.call_id == h.base_call_id)
            });
        self.held = still;
        for held in ready {
            for item in held.items {
                self.append(item, sink);
            }
            held.answer.send(Ok(()));
        }
    }
}

/// The call id of the last output among `items` (what a deferred reply names).
pub(crate) fn output_call_id(items: &[ChatItem]) -> Option<String> {
    items.iter().rev().find_map(|item| match item {
        ChatItem::FunctionCallOutput(o) => Some(o.call_id.clone()),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::ChatRole;

    fn call(id: &str) -> FunctionCall {
        FunctionCall {
            call_id: id.to_owned(),
            name: "t".to_owned(),
            arguments: "{}".to_owned(),
        }
    }

    fn pair(id: &str) -> Vec<ChatItem> {
        vec![
            ChatItem::FunctionCall(call(id)),
            ChatItem::FunctionCallOutput(FunctionCallOutput {
                call_id: id.to_owned(),
                name: "t".to_owned(),
                output: "later".to_owned(),
                is_error: false,
            }),
        ]
    }

    fn ids(ledger: &Ledger) -> Vec<String> {
        ledger
            .chat()
            .items()
            .iter()
            .map(|item| match item {
                ChatItem::FunctionCall(c) => format!("call {}", c.call_id),
                ChatItem::FunctionCallOutput(o) => format!("out {}", o.call_id),
                ChatItem::Message(m) => format!("msg {}", m.content),
                ChatItem::AgentHandoff { to, .. } => format!("handoff {to}"),
            })
            .collect()
    }

    fn no_sink() -> impl FnMut(&ChatItem) {
        |_| {}
    }

    #[test]
    fn a_step_lands_whole_once_its_last_output_is_in() {
        let mut ledger = Ledger::default();
        let mut sink = no_sink();
        ledger.open_step(1, vec![call("a"), call("b")], &mut sink);
        assert!(!ledger.answer(1, 1, CallOutput::reply("B".into())));
        assert!(ledger.commit(&mut sink).is_none(), "a is still running");
        assert!(ledger.chat().is_empty());
        assert!(ledger.answer(1, 0, CallOutput::reply("A".into())));
        let committed = ledger.commit(&mut sink).unwrap();
        assert_eq!(committed.outputs[0].output, "A");
        assert_eq!(ids(&ledger), ["call a", "call b", "out a", "out b"]);
        ledger.chat().check_invariant().unwrap();
    }

    #[test]
    fn updates_for_an_open_step_wait_for_it_and_their_waiter_learns_when_they_land() {
        let mut ledger = Ledger::default();
        let mut sink = no_sink();
        ledger.open_step(1, vec![call("a")], &mut sink);
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        let where_ = ledger.insert("a", pair("a/update_1"), DeliveryAnswer::to(tx), &mut sink);
        assert_eq!(where_, Inserted::Held);
        assert!(rx.try_recv().is_err(), "not in the chat yet");
        ledger.answer(1, 0, CallOutput::reply("first update".into()));
        ledger.commit(&mut sink).unwrap();
        assert_eq!(rx.try_recv().unwrap(), Ok(()));
        assert_eq!(
            ids(&ledger),
            ["call a", "out a", "call a/update_1", "out a/update_1"]
        );
        ledger.chat().check_invariant().unwrap();
    }

    #[test]
    fn items_of_a_committed_call_are_appended_at_once() {
        let mut ledger = Ledger::default();
        let mut sink = no_sink();
        ledger.open_step(1, vec![call("a")], &mut sink);
        ledger.answer(1, 0, CallOutput::reply("x".into()));
        ledger.commit(&mut sink);
        ledger.open_step(2, vec![call("b")], &mut sink);
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        assert_eq!(
            ledger.insert("a", pair("a/finished"), DeliveryAnswer::to(tx), &mut sink),
            Inserted::Appended
        );
        assert_eq!(rx.try_recv().unwrap(), Ok(()));
        assert_eq!(
            ids(&ledger),
            ["call a", "out a", "call a/finished", "out a/finished"]
        );
    }

    #[test]
    fn aborting_gives_every_unanswered_call_a_terminal_output() {
        let mut ledger = Ledger::default();
        let mut sink = no_sink();
        ledger.open_step(1, vec![call("a"), call("b")], &mut sink);
        ledger.answer(1, 0, CallOutput::reply("A".into()));
        let committed = ledger.abort("the session closed", &mut sink).unwrap();
        assert_eq!(
            committed.outputs[1].output,
            "Cancelled: the session closed."
        );
        assert!(matches!(committed.effects[1], Effect::Quiet));
        ledger.chat().check_invariant().unwrap();
        assert!(
            ledger.abort("again", &mut sink).is_none(),
            "nothing is open"
        );
    }

    #[test]
    fn late_and_second_answers_are_ignored() {
        let mut ledger = Ledger::default();
        let mut sink = no_sink();
        ledger.open_step(1, vec![call("a")], &mut sink);
        ledger.answer(1, 0, CallOutput::reply("first".into()));
        ledger.answer(1, 0, CallOutput::reply("second".into()));
        ledger.answer(7, 0, CallOutput::reply("other step".into()));
        let committed = ledger.commit(&mut sink).unwrap();
        assert_eq!(committed.outputs.len(), 1);
        assert_eq!(committed.outputs[0].output, "first");
        assert!(!ledger.answer(1, 0, CallOutput::reply("after commit".into())));
        ledger.chat().check_invariant().unwrap();
    }

    #[test]
    fn terminal_items_mid_step_wait_and_tool_updates_are_refused_on_pause() {
        let mut ledger = Ledger::default();
        let mut sink = no_sink();
        ledger.open_step(1, vec![call("a"), call("b")], &mut sink);
        // `a` answered (it went to the background), then was stopped by a pause.
        ledger.answer(1, 0, CallOutput::reply("started".into()));
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        ledger.insert("a", pair("a/update_1"), DeliveryAnswer::to(tx), &mut sink);
        ledger.write_terminal(
            vec![StoppedCall::stopped(call("a"))],
            "the agent was paused",
            &mut sink,
        );
        assert_eq!(ledger.refuse_held(), ["a/update_1"]);
        assert!(matches!(
            rx.try_recv().unwrap(),
            Err(UpdateError::ScopeClosed { .. })
        ));
        ledger.answer(1, 1, CallOutput::reply("B".into()));
        ledger.commit(&mut sink).unwrap();
        assert_eq!(
            ids(&ledger),
            [
                "call a",
                "call b",
                "out a",
                "out b",
                "call a/finished",
                "out a/finished"
            ]
        );
        ledger.chat().check_invariant().unwrap();
    }

    #[test]
    fn opening_a_step_over_an_open_one_keeps_the_invariant() {
        let mut ledger = Ledger::default();
        let mut sink = no_sink();
        ledger.open_step(1, vec![call("a")], &mut sink);
        ledger.open_step(2, vec![call("b")], &mut sink);
        ledger.answer(2, 0, CallOutput::reply("B".into()));
        ledger.commit(&mut sink);
        ledger.chat().check_invariant().unwrap();
        assert_eq!(ids(&ledger), ["call a", "out a", "call b", "out b"]);
    }

    fn said(speech: u64, text: &str) -> ChatItem {
        ChatItem::Message(crate::chat::ChatMessage {
            role: ChatRole::Assistant,
            content: text.to_owned(),
            interrupted: false,
            speech: Some(SpeechId(speech)),
        })
    }

    #[test]
    fn a_cut_applies_to_the_message_of_its_own_speech() {
        let mut ledger = Ledger::default();
        let mut sink = no_sink();
        ledger.append(said(1, "First sentence."), &mut sink);
        ledger.append(said(2, "Second sentence here."), &mut sink);
        assert_eq!(
            ledger.cut_speech(SpeechId(1), Some("First")),
            Cut::Shortened(0)
        );
        assert_eq!(ids(&ledger), ["msg First", "msg Second sentence here."]);
        assert_eq!(ledger.cut_speech(SpeechId(9), Some("x")), Cut::NotFound);
    }

    #[test]
    fn heard_text_only_finds_the_cut_and_never_becomes_the_message() {
        let mut ledger = Ledger::default();
        let mut sink = no_sink();
        ledger.append(said(1, "Please hold while I check."), &mut sink);
        ledger.append(said(2, "Your refund of $5 is approved."), &mut sink);
        assert_eq!(
            ledger.cut_speech(
                SpeechId(1),
                Some("Your refund of 5,000 dollars is approved.")
            ),
            Cut::Shortened(0)
        );
        assert_eq!(
            ledger.cut_speech(SpeechId(2), Some("your refund of five dollars")),
            Cut::Shortened(1)
        );
        assert_eq!(
            ids(&ledger),
            ["msg Please hold while I check.", "msg Your refund of $5"]
        );
        assert!(ledger
            .chat()
            .items()
            .iter()
            .all(|i| matches!(i, ChatItem::Message(m) if m.interrupted)));
    }

    #[test]
    fn a_speech_nobody_heard_leaves_no_message() {
        let mut ledger = Ledger::default();
        let mut sink = no_sink();
        ledger.append(ChatItem::message(ChatRole::User, "hi"), &mut sink);
        ledger.append(said(1, "Unheard."), &mut sink);
        assert_eq!(ledger.cut_speech(SpeechId(1), Some(" ")), Cut::Removed(1));
        assert_eq!(ids(&ledger), ["msg hi"]);
        // Unknown heard text: the text stays, marked interrupted.
        ledger.append(said(2, "Maybe heard."), &mut sink);
        assert_eq!(ledger.cut_speech(SpeechId(2), None), Cut::Shortened(1));
        assert!(matches!(&ledger.chat().items()[1], ChatItem::Message(m) if m.interrupted));
    }

    #[test]
    fn the_sink_sees_every_appended_item_in_order() {
        let mut ledger = Ledger::default();
        let mut seen = Vec::new();
        let mut sink = |item: &ChatItem| seen.push(item.clone());
        ledger.append(ChatItem::message(ChatRole::User, "hi"), &mut sink);
        ledger.open_step(1, vec![call("a")], &mut sink);
        ledger.answer(1, 0, CallOutput::reply("A".into()));
        ledger.commit(&mut sink);
        assert_eq!(seen.as_slice(), ledger.chat().items());
    }
}
