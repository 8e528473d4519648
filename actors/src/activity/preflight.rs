//! A preemptive request: the model asked with the user's words before their turn is
//! confirmed (the session asks while the endpointing delay waits for more words). What the
//! model sends is held here, none of it spoken, until the turn starts: a turn with the
//! same words and the chat just as the request saw it takes the request over (the model's
//! latency is saved); any other outcome drops it, and nothing of it reaches the chat. A
//! plain type the activation keeps while it listens.

use std::time::Duration;

use tokio::time::Instant;

use crate::chat::{ChatContext, ChatItem, ChatMessage};
use crate::error::TurnFailure;
use crate::llm::{LlmChunk, LlmUsage};

/// A preemptive request under way (see the module docs).
pub(crate) struct Preflight {
    /// The user's words it answers.
    pub(crate) text: String,
    pub(crate) step: u64,
    /// What the request was made from: the agent's chat then, plus the user's message.
    pub(crate) chat: ChatContext,
    pub(crate) span: tracing::Span,
    pub(crate) started: Instant,
    pub(crate) first_chunk: Option<Duration>,
    /// What the model sent so far, in order.
    pub(crate) chunks: Vec<LlmChunk>,
    /// The stream ended (`Some(failure)`: how), if it did.
    pub(crate) ended: Option<Option<TurnFailure>>,
}

impl Preflight {
    /// One chunk of its stream.
    pub(crate) fn chunk(&mut self, chunk: LlmChunk) {
        if !matches!(chunk, LlmChunk::Usage(_) | LlmChunk::ServedBy(_)) {
            self.first_chunk
                .get_or_insert_with(|| self.started.elapsed());
        }
        self.chunks.push(chunk);
    }

    /// Its stream ended.
    pub(crate) fn end(&mut self, failure: Option<TurnFailure>) {
        self.ended.get_or_insert(failure);
    }

    /// Whether a turn whose chat is `chat` before its user message, and whose message is
    /// `message`, can take it over: the same words, the chat unchanged since the request
    /// was made (nothing appended, no hook's edit), the request's last item that message.
    pub(crate) fn fits(&self, chat: &ChatContext, message: &ChatMessage) -> bool {
        self.chat.len() == chat.len() + 1
            && self.chat.extends(chat)
            && message.content == self.text
            && matches!(self.chat.items().last(), Some(ChatItem::Message(m)) if m == message)
    }

    /// The usage the model reported before the request was dropped, if any.
    pub(crate) fn usage(&self) -> Option<LlmUsage> {
        self.chunks.iter().rev().find_map(|c| match c {
            LlmChunk::Usage(usage) => Some(*usage),
            _ => None,
        })
    }

    /// The model a wrapper said serves it, if one did.
    pub(crate) fn served_by(&self) -> Option<&str> {
        self.chunks.iter().rev().find_map(|c| match c {
            LlmChunk::ServedBy(name) => Some(name.as_str()),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::ChatRole;

    fn user(text: &str) -> ChatMessage {
        ChatMessage {
            role: ChatRole::User,
            content: text.into(),
            interrupted: false,
            speech: None,
        }
    }

    fn preflight(base: &ChatContext, text: &str) -> Preflight {
        let mut chat = base.clone();
        chat.push(ChatItem::Message(user(text)));
        Preflight {
            text: text.into(),
            step: 1,
            chat,
            span: tracing::Span::none(),
            started: Instant::now(),
            first_chunk: None,
            chunks: Vec::new(),
            ended: None,
        }
    }

    #[test]
    fn the_same_words_on_the_same_chat_fit() {
        let mut base = ChatContext::new();
        base.push(ChatItem::message(ChatRole::Assistant, "Hello."));
        let p = preflight(&base, "a table for two");
        assert!(p.fits(&base, &user("a table for two")));
        assert!(
            !p.fits(&base, &user("a table for two at eight")),
            "the user went on"
        );
    }

    #[test]
    fn a_chat_that_changed_since_the_request_does_not_fit() {
        let mut base = ChatContext::new();
        base.push(ChatItem::message(ChatRole::Assistant, "Hello."));
        let p = preflight(&base, "hi");
        let mut grown = base.clone();
        grown.push(ChatItem::message(ChatRole::Assistant, "Anything else?"));
        assert!(!p.fits(&grown, &user("hi")), "an item landed meanwhile");
        let mut edited = base.clone();
        edited.edit(|items| items.clear());
        assert!(!p.fits(&edited, &user("hi")), "a hook rewrote the chat");
    }

    #[test]
    fn its_first_chunk_time_ignores_usage_and_its_usage_is_kept() {
        let base = ChatContext::new();
        let mut p = preflight(&base, "hi");
        let usage = LlmUsage {
            prompt_tokens: 10,
            ..LlmUsage::default()
        };
        p.chunk(LlmChunk::Usage(usage));
        assert_eq!(p.first_chunk, None);
        p.chunk(LlmChunk::Text("Hi!".into()));
        assert!(p.first_chunk.is_some());
        assert_eq!(p.usage(), Some(usage));
        p.end(None);
        p.end(Some(TurnFailure::ReplyTooLong { limit: 1 }));
        assert!(matches!(p.ended, Some(None)), "the first end counts");
    }
}
