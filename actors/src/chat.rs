//! The chat context: what an agent has said and heard, in provider order.
//!
//! Invariant: every [`FunctionCall`] item has exactly one
//! [`FunctionCallOutput`] with the same `call_id`, after it, whatever happens.
//! [`ChatContext::check_invariant`] states it as code so tests can assert it.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Who said a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChatRole {
    /// Instructions to the model.
    System,
    /// The person the agent talks to.
    User,
    /// The agent (the model's replies).
    Assistant,
}

/// A text message in the conversation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// Who said it.
    pub role: ChatRole,
    /// What was said (for the assistant: what the user heard).
    pub content: String,
    /// Whether the speech was cut short (by the user, `Session::interrupt`, a failed
    /// model stream): `content` is then only what was said before.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interrupted: bool,
    /// For an assistant message: the speech that said it (a playout report for that
    /// speech cuts this message to what was heard).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speech: Option<crate::output::SpeechId>,
}

/// A tool call the model made.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    /// The canonical call id: the provider's id, made unique in the session (`{id}~{n}`),
    /// or a derived id such as `{id}/update_1` and `{id}/finished`.
    pub call_id: String,
    /// The tool's name.
    pub name: String,
    /// The arguments as the model wrote them (JSON text).
    pub arguments: String,
}

/// The one output of a [`FunctionCall`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FunctionCallOutput {
    /// The id of the call this answers.
    pub call_id: String,
    /// The tool's name.
    pub name: String,
    /// What the model reads: text, or a JSON value written as text.
    pub output: String,
    /// Whether this output reports a failure; its text then starts with `Error`.
    pub is_error: bool,
}

/// One item of a chat context.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ChatItem {
    /// A message.
    Message(ChatMessage),
    /// A tool call.
    FunctionCall(FunctionCall),
    /// A tool call's output.
    FunctionCallOutput(FunctionCallOutput),
    /// The conversation moved from one agent to another here.
    AgentHandoff {
        /// The agent that handed off, if any (none for the first agent).
        from: Option<String>,
        /// The agent that took over.
        to: String,
    },
}

impl ChatItem {
    /// A message item.
    pub fn message(role: ChatRole, content: impl Into<String>) -> Self {
        Self::Message(ChatMessage {
            role,
            content: content.into(),
            interrupted: false,
            speech: None,
        })
    }

    /// The text of a message item (`None` for other items).
    pub fn text(&self) -> Option<&str> {
        match self {
            Self::Message(m) => Some(&m.content),
            _ => None,
        }
    }

    /// The call id of a function call or output item.
    pub fn call_id(&self) -> Option<&str> {
        match self {
            Self::FunctionCall(c) => Some(&c.call_id),
            Self::FunctionCallOutput(o) => Some(&o.call_id),
            _ => None,
        }
    }
}

/// An ordered list of chat items, cheap to snapshot and to append to.
///
/// A chat context is a length into a shared, append-only log: cloning one (a snapshot
/// for an LLM request, a copy for the host) is a reference count, and appending to the
/// newest one writes the next slot of the log in place — the snapshots, shorter, never see
/// it. Only growing the log past its capacity (amortized: it doubles) or editing items
/// (`edit`) copies. So a turn costs the same with ten items of history or ten thousand.
#[derive(Clone, Default)]
pub struct ChatContext {
    log: Option<Arc<log::Log>>,
    len: usize,
}

impl fmt::Debug for ChatContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.items()).finish()
    }
}

/// As the list of its items.
impl Serialize for ChatContext {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.items().serialize(serializer)
    }
}

/// From the list of its items (not checked against the one-output rule: a context read
/// back is the one written).
impl<'de> Deserialize<'de> for ChatContext {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let items = Vec::<ChatItem>::deserialize(deserializer)?;
        let mut chat = Self::new();
        chat.extend(items);
        Ok(chat)
    }
}

impl PartialEq for ChatContext {
    fn eq(&self, other: &Self) -> bool {
        self.items() == other.items()
    }
}

impl ChatContext {
    /// An empty chat context (it allocates nothing until the first item).
    pub fn new() -> Self {
        Self::default()
    }

    /// The items, oldest first.
    pub fn items(&self) -> &[ChatItem] {
        match &self.log {
            Some(log) => log.items(self.len),
            None => &[],
        }
    }

    /// How many items there are.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no items.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends one item.
    pub fn push(&mut self, item: ChatItem) {
        let item = match &self.log {
            Some(log) => match log.append(self.len, item) {
                Ok(()) => {
                    self.len += 1;
                    return;
                }
                Err(item) => item,
            },
            None => item,
        };
        // Full, or another context appended here first: continue in a log of our own.
        self.regrow(self.len + 1);
        if let Some(log) = &self.log {
            if log.append(self.len, item).is_ok() {
                self.len += 1;
            }
        }
    }

    /// Appends several items in order.
    pub fn extend(&mut self, items: impl IntoIterator<Item = ChatItem>) {
        for item in items {
            self.push(item);
        }
    }

    /// Whether this context is `earlier` with items appended (and nothing else changed):
    /// both read the same log, and this one is at least as long. Cheap; false also when
    /// an append had to move to a new log, so a caller that needs certainty treats false
    /// as "rewritten".
    pub(crate) fn extends(&self, earlier: &ChatContext) -> bool {
        match (&self.log, &earlier.log) {
            (_, None) => true,
            (Some(now), Some(then)) => Arc::ptr_eq(now, then) && self.len >= earlier.len,
            (None, Some(_)) => false,
        }
    }

    /// Edits the items (for hooks that rewrite the context): `f` gets them as a `Vec`.
    /// Costs a copy of the items when another context shares them.
    pub fn edit<R>(&mut self, f: impl FnOnce(&mut Vec<ChatItem>) -> R) -> R {
        let mut items = self.take_items();
        let out = f(&mut items);
        *self = Self::from(items);
        out
    }

    /// Moves this context's log to one with room for at least `needed` items.
    fn regrow(&mut self, needed: usize) {
        let items = self.take_items();
        let capacity = needed.next_power_of_two().max(log::MIN_CAPACITY);
        let fresh = log::Log::with_capacity(capacity);
        let len = items.len();
        for (at, item) in items.into_iter().enumerate() {
            // A fresh log with room: every slot claims.
            let _ = fresh.append(at, item);
        }
        self.log = Some(Arc::new(fresh));
        self.len = len;
    }

    /// The items as a `Vec`: moved out when this context holds the only reference to its
    /// log, cloned otherwise. Leaves the context empty.
    fn take_items(&mut self) -> Vec<ChatItem> {
        let len = std::mem::take(&mut self.len);
        match self.log.take() {
            None => Vec::new(),
            Some(log) => match Arc::try_unwrap(log) {
                Ok(log) => log.into_items(len),
                Err(shared) => shared.items(len).to_vec(),
            },
        }
    }

    /// Where the assistant message said by `speech` is, searching from the newest item.
    pub fn position_of_speech(&self, speech: crate::output::SpeechId) -> Option<usize> {
        self.items()
            .iter()
            .rposition(|item| matches!(item, ChatItem::Message(m) if m.speech == Some(speech)))
    }

    /// Whether any function call or output uses this call id.
    pub fn contains_call(&self, call_id: &str) -> bool {
        self.position_of_call(call_id).is_some()
    }

    /// Where the item with this call id is (searched from the newest: the ids asked for
    /// are usually recent).
    pub fn position_of_call(&self, call_id: &str) -> Option<usize> {
        self.items()
            .iter()
            .rposition(|item| item.call_id() == Some(call_id))
    }

    /// The function call outputs, in order.
    pub fn outputs(&self) -> impl Iterator<Item = &FunctionCallOutput> {
        self.items().iter().filter_map(|item| match item {
            ChatItem::FunctionCallOutput(o) => Some(o),
            _ => None,
        })
    }

    /// The output for one call id, if recorded.
    pub fn output_of(&self, call_id: &str) -> Option<&FunctionCallOutput> {
        self.outputs().find(|o| o.call_id == call_id)
    }

    /// Checks the chat-context invariant: every function call has exactly one output with
    /// its call id, after it, and no output lacks its call (providers reject a context
    /// that breaks it). Returns a description of the first breach.
    pub fn check_invariant(&self) -> Result<(), String> {
        let mut open: HashMap<&str, usize> = HashMap::new();
        let mut answered: HashMap<&str, usize> = HashMap::new();
        for (index, item) in self.items().iter().enumerate() {
            match item {
                ChatItem::FunctionCall(call) => {
                    if open.contains_key(call.call_id.as_str())
                        || answered.contains_key(call.call_id.as_str())
                    {
                        return Err(format!(
                            "call id {} appears twice (item {index})",
                            call.call_id
                        ));
                    }
                    open.insert(&call.call_id, index);
                }
                ChatItem::FunctionCallOutput(out) => {
                    if open.remove(out.call_id.as_str()).is_none() {
                        return Err(format!(
                            "output for {} at item {index} has no call before it, or is a second output",
                            out.call_id
                        ));
                    }
                    answered.insert(&out.call_id, index);
                }
                _ => {}
            }
        }
        match open.into_iter().min_by_key(|(_, index)| *index) {
            Some((call_id, index)) => Err(format!("call {call_id} (item {index}) has no output")),
            None => Ok(()),
        }
    }
}

impl From<Vec<ChatItem>> for ChatContext {
    fn from(items: Vec<ChatItem>) -> Self {
        let mut chat = Self::new();
        if !items.is_empty() {
            chat.regrow(items.len());
            chat.extend(items);
        }
        chat
    }
}

/// The storage behind [`ChatContext`]: a fixed-capacity, append-only array of slots.
mod log {
    use std::cell::UnsafeCell;
    use std::mem::MaybeUninit;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::ChatItem;

    /// The smallest log a context grows into.
    pub(super) const MIN_CAPACITY: usize = 8;

    /// Slots `..filled` hold items; each slot is written once — by the context that
    /// claimed it by moving `filled` past it — and never changed until the log drops.
    pub(super) struct Log {
        slots: Box<[UnsafeCell<MaybeUninit<ChatItem>>]>,
        filled: AtomicUsize,
    }

    // SAFETY: a slot is written once, by the one context that won its claim (`append`), and
    // is read only through contexts whose length covers it. Such a context is made from the
    // writer after the write (`clone` needs the writer borrowed; another thread gets it
    // through whatever synchronizes the hand-over), so no read overlaps the write; slots
    // below a length are never written again. `ChatItem` is `Send + Sync`.
    unsafe impl Send for Log {}
    unsafe impl Sync for Log {}

    impl Log {
        pub(super) fn with_capacity(capacity: usize) -> Self {
            Self {
                slots: (0..capacity)
                    .map(|_| UnsafeCell::new(MaybeUninit::uninit()))
                    .collect(),
                filled: AtomicUsize::new(0),
            }
        }

        /// Writes `item` at `at` if `at` is the next free slot (the caller's context ends
        /// there, and nobody appended after it); gives it back otherwise.
        pub(super) fn append(&self, at: usize, item: ChatItem) -> Result<(), ChatItem> {
            if at >= self.slots.len()
                || self
                    .filled
                    .compare_exchange(at, at + 1, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
            {
                return Err(item);
            }
            // SAFETY: the claim above made this caller the only writer of slot `at`, and
            // no context covers it yet (see the `Sync` impl).
            unsafe { (*self.slots[at].get()).write(item) };
            Ok(())
        }

        /// The first `len` items (`len` is a context's length: every slot below it holds
        /// an item and is no longer written).
        pub(super) fn items(&self, len: usize) -> &[ChatItem] {
            let len = len.min(self.slots.len());
            // SAFETY: `UnsafeCell<MaybeUninit<T>>` has the layout of `T`; slots below a
            // context's length are written and immutable (see the `Sync` impl).
            unsafe { std::slice::from_raw_parts(self.slots.as_ptr().cast::<ChatItem>(), len) }
        }

        /// The first `len` items, moved out; the rest are dropped.
        pub(super) fn into_items(mut self, len: usize) -> Vec<ChatItem> {
            let filled = std::mem::take(self.filled.get_mut());
            let mut items = Vec::with_capacity(len);
            for (at, slot) in self.slots.iter_mut().take(filled).enumerate() {
                // SAFETY: slots below `filled` are written; `filled` is now zero, so the
                // log's drop will not touch them again.
                let item = unsafe { slot.get_mut().assume_init_read() };
                if at < len {
                    items.push(item);
                }
            }
            items
        }
    }

    impl Drop for Log {
        fn drop(&mut self) {
            let filled = *self.filled.get_mut();
            for slot in self.slots.iter_mut().take(filled) {
                // SAFETY: slots below `filled` are written and dropped only here.
                unsafe { slot.get_mut().assume_init_drop() };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn say(n: usize) -> ChatItem {
        ChatItem::message(ChatRole::User, format!("message {n}"))
    }

    fn texts(chat: &ChatContext) -> Vec<String> {
        chat.items()
            .iter()
            .map(|i| i.text().unwrap_or_default().to_owned())
            .collect()
    }

    #[test]
    fn a_snapshot_does_not_see_what_is_appended_after_it() {
        let mut live = ChatContext::new();
        live.push(say(0));
        let snapshot = live.clone();
        for n in 1..100 {
            live.push(say(n));
        }
        assert_eq!(texts(&snapshot), ["message 0"]);
        assert_eq!(live.len(), 100);
        assert_eq!(live.items()[99].text(), Some("message 99"));
    }

    #[test]
    fn appending_to_an_old_snapshot_copies_and_clobbers_nothing() {
        let mut live = ChatContext::from(vec![say(0), say(1)]);
        let mut old = live.clone();
        live.push(say(2));
        old.push(ChatItem::message(ChatRole::User, "a different 2"));
        assert_eq!(texts(&live), ["message 0", "message 1", "message 2"]);
        assert_eq!(texts(&old), ["message 0", "message 1", "a different 2"]);
        // Two snapshots of the same length: the first append wins the slot, the second
        // continues in a log of its own.
        let mut a = live.clone();
        let mut b = live.clone();
        a.push(say(3));
        b.push(ChatItem::message(ChatRole::User, "b's 3"));
        assert_eq!(a.items()[3].text(), Some("message 3"));
        assert_eq!(b.items()[3].text(), Some("b's 3"));
    }

    #[test]
    fn edits_apply_to_one_context_only() {
        let mut live = ChatContext::from(vec![say(0), say(1)]);
        let snapshot = live.clone();
        live.edit(|items| items.remove(0));
        assert_eq!(texts(&live), ["message 1"]);
        assert_eq!(texts(&snapshot), ["message 0", "message 1"]);
        live.push(say(2));
        assert_eq!(texts(&live), ["message 1", "message 2"]);
    }

    #[test]
    fn an_empty_context_allocates_nothing_and_equality_is_by_items() {
        let empty = ChatContext::new();
        assert!(empty.log.is_none());
        assert!(empty.items().is_empty());
        let mut a = ChatContext::new();
        a.push(say(0));
        let b = ChatContext::from(vec![say(0)]);
        assert_eq!(a, b);
        assert_ne!(a, empty);
    }

    #[test]
    fn snapshots_read_on_other_threads_while_the_context_grows() {
        // Miri checks the unsafe log for data races; it runs this at a tenth of the size.
        let (items, every, reads) = if cfg!(miri) {
            (200, 40, 3)
        } else {
            (2_000, 100, 50)
        };
        let mut live = ChatContext::new();
        let mut readers = Vec::new();
        for n in 0..items {
            live.push(say(n));
            if n % every == 0 {
                let snapshot = live.clone();
                readers.push(std::thread::spawn(move || {
                    for _ in 0..reads {
                        let seen = texts(&snapshot);
                        assert_eq!(seen.len(), n + 1);
                        assert_eq!(seen[n], format!("message {n}"));
                    }
                }));
            }
        }
        for reader in readers {
            reader.join().unwrap();
        }
        assert_eq!(live.len(), items);
    }
}
