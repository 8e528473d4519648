//! The chat context: what an agent has said and heard, in provider order.
//!
//! Invariant: every [`FunctionCall`] item has exactly one
//! [`FunctionCallOutput`] with the same `call_id`, after it, whatever happens.
//! [`ChatContext::check_invariant`] states it as code so tests can assert it.

use std::collections::HashMap;
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

/// An ordered list of chat items, cheap to snapshot.
///
/// The items sit behind an `Arc`: a snapshot for an LLM request is a reference count,
/// and appending copies the list only while such a snapshot is still held (once per LLM
/// step at most, never per update).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChatContext {
    items: Arc<Vec<ChatItem>>,
}

impl ChatContext {
    /// An empty chat context.
    pub fn new() -> Self {
        Self::default()
    }

    /// The items, oldest first.
    pub fn items(&self) -> &[ChatItem] {
        &self.items
    }

    /// How many items there are.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether there are no items.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Appends one item.
    pub fn push(&mut self, item: ChatItem) {
        Arc::make_mut(&mut self.items).push(item);
    }

    /// Appends several items in order.
    pub fn extend(&mut self, items: impl IntoIterator<Item = ChatItem>) {
        Arc::make_mut(&mut self.items).extend(items);
    }

    /// Gives mutable access to the items, for hooks that edit the context.
    pub fn items_mut(&mut self) -> &mut Vec<ChatItem> {
        Arc::make_mut(&mut self.items)
    }

    /// Where the assistant message said by `speech` is, searching from the newest item.
    pub fn position_of_speech(&self, speech: crate::output::SpeechId) -> Option<usize> {
        self.items
            .iter()
            .rposition(|item| matches!(item, ChatItem::Message(m) if m.speech == Some(speech)))
    }

    /// Whether any function call or output uses this call id.
    pub fn contains_call(&self, call_id: &str) -> bool {
        self.position_of_call(call_id).is_some()
    }

    /// Where the first item with this call id is.
    pub fn position_of_call(&self, call_id: &str) -> Option<usize> {
        self.items
            .iter()
            .position(|item| item.call_id() == Some(call_id))
    }

    /// The function call outputs, in order.
    pub fn outputs(&self) -> impl Iterator<Item = &FunctionCallOutput> {
        self.items.iter().filter_map(|item| match item {
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
        for (index, item) in self.items.iter().enumerate() {
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
        Self {
            items: Arc::new(items),
        }
    }
}
