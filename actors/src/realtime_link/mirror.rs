//! The mirror of a realtime model's conversation: which remote item stands for each item
//! of the agent's chat context, and the events that make the remote conversation follow
//! the chat (create what it lacks, delete what the chat dropped).
//!
//! The chat context stays the engine's record; the remote conversation is kept in step
//! with it by diff, when the engine syncs (before it asks for a response, when the user
//! starts speaking, when an agent takes over the connection). Items the model made itself
//! — the user's audio, its own spoken answer, its calls — are matched to the chat items
//! the engine records for them, never created twice:
//!
//! - a user message binds to the oldest user audio item the server committed and no chat
//!   item holds yet (the engine records heard turns in the order the server commits them);
//! - an assistant message binds to the audio item of its speech (the activity says which
//!   item each speech played);
//! - a function call binds to the model's call with its id (the engine's canonical id is
//!   the model's, or the model's with `~n` when the model repeated an id).
//!
//! Every other item is created, with an id of the engine's, right after the remote item of
//! the chat item before it, so the remote order is the chat's. The rules, each a unit test
//! below:
//! - A bound item is never created; a content change of a bound item (a transcript filled
//!   in, an answer cut to what was heard) changes nothing remote: the truncation is sent
//!   on its own (`wire.rs`).
//! - An output is sent only for a call the remote conversation holds, with that call's
//!   wire id: never an output for an unknown call id.
//! - A call the model made that no chat item took (its response was cut) is deleted before
//!   the engine asks for a response, so no response is asked with a call unanswered.
//! - An item is deleted once, also when a truncation to nothing deleted it first.
//! - A handoff marker or an empty message is never sent.

use std::collections::{HashMap, HashSet, VecDeque};

use crate::chat::{ChatContext, ChatItem, ChatRole};
use crate::output::SpeechId;
use crate::realtime::{ClientEvent, Place, RemoteItem};

/// How far ahead the diff looks for an item that moved (a few removals or insertions at
/// once; anything wider is treated as a replacement, which is still correct).
const LOOKAHEAD: usize = 8;

/// User audio items waiting for their chat item; older ones than this are left as they
/// are (their turn never ran).
const MAX_HEARD: usize = 4;

/// The longest item or call id the OpenAI Realtime API takes.
const MAX_ID: usize = 32;

/// What a synced chat item is remotely.
#[derive(Clone, Debug, PartialEq)]
enum Key {
    /// A user message bound to a user audio item of the model.
    Heard,
    /// An assistant message bound to the model's audio item of this speech.
    Spoken(SpeechId),
    /// A message the engine created as text.
    Text {
        role: ChatRole,
        text: String,
        speech: Option<SpeechId>,
    },
    /// A call (canonical id); its wire id in the entry.
    Call(String),
    /// A call's output (canonical id).
    Output(String),
    /// A handoff marker: never sent.
    Marker,
    /// An empty message (its transcript never came): nothing to send.
    Empty(ChatRole),
    /// An output whose call is not in the remote conversation: never sent.
    Orphan(String),
}

impl Key {
    /// Whether `item` is still what this entry was synced from.
    fn matches(&self, item: &ChatItem) -> bool {
        match (self, item) {
            (Key::Heard, ChatItem::Message(m)) => m.role == ChatRole::User,
            (Key::Spoken(speech), ChatItem::Message(m)) => m.speech == Some(*speech),
            (Key::Text { role, text, speech }, ChatItem::Message(m)) => {
                m.role == *role && m.content == *text && m.speech == *speech
            }
            (Key::Call(id), ChatItem::FunctionCall(c)) => c.call_id == *id,
            (Key::Output(id), ChatItem::FunctionCallOutput(o)) => o.call_id == *id,
            (Key::Marker, ChatItem::AgentHandoff { .. }) => true,
            (Key::Empty(role), ChatItem::Message(m)) => m.role == *role && m.content.is_empty(),
            (Key::Orphan(id), ChatItem::FunctionCallOutput(o)) => o.call_id == *id,
            _ => false,
        }
    }
}

/// One synced chat item.
#[derive(Clone, Debug)]
struct Entry {
    key: Key,
    /// Its remote item's id, if it has one.
    remote: Option<String>,
    /// For a call: its id on the wire.
    wire_call: Option<String>,
}

/// A call the model made, by its wire id.
#[derive(Clone, Debug)]
struct ModelCall {
    item: String,
    wire: String,
    bound: bool,
}

/// The mirror (see the module docs).
#[derive(Default)]
pub(crate) struct Mirror {
    entries: Vec<Entry>,
    /// The chat context the entries were synced from.
    synced: ChatContext,
    /// User audio items the server committed that no chat item holds yet, oldest first.
    heard: VecDeque<String>,
    /// The model's audio item of each speech, as the activity reported it.
    spoken: HashMap<SpeechId, String>,
    /// The calls the model made on this connection.
    calls: Vec<ModelCall>,
    /// Wire call ids in use (the model's and the engine's).
    wire_calls: HashSet<String>,
    /// Remote items already deleted.
    deleted: HashSet<String>,
    /// The next id of an item the engine creates.
    next_item: u64,
}

impl Mirror {
    /// Forgets the remote conversation (a new connection holds nothing).
    pub(crate) fn reset(&mut self) {
        *self = Self {
            next_item: self.next_item,
            ..Self::default()
        };
    }

    /// The server committed the user's audio as item `item`.
    pub(crate) fn heard(&mut self, item: String) {
        self.heard.push_back(item);
        while self.heard.len() > MAX_HEARD {
            self.heard.pop_front();
        }
    }

    /// The activity played speech `speech` from the model's item `item`.
    pub(crate) fn spoke(&mut self, speech: SpeechId, item: String) {
        self.spoken.entry(speech).or_insert(item);
    }

    /// The model's item that speech `speech` played, if any.
    pub(crate) fn item_of(&self, speech: SpeechId) -> Option<&str> {
        self.spoken.get(&speech).map(String::as_str)
    }

    /// The model made a call (its arguments are complete).
    pub(crate) fn call_arrived(&mut self, item: String, wire: String) {
        self.wire_calls.insert(wire.clone());
        self.calls.push(ModelCall {
            item,
            wire,
            bound: false,
        });
    }

    /// The engine deleted `item` itself (a truncation to nothing).
    pub(crate) fn deleted(&mut self, item: &str) {
        self.deleted.insert(item.to_owned());
    }

    /// Whether `item` was deleted.
    pub(crate) fn is_deleted(&self, item: &str) -> bool {
        self.deleted.contains(item)
    }

    /// Deletes the model's calls no chat item took (their response was cut): no response
    /// may be asked while a call is unanswered.
    pub(crate) fn drop_unanswered(&mut self, out: &mut Vec<ClientEvent>) {
        let mut kept = Vec::with_capacity(self.calls.len());
        for call in std::mem::take(&mut self.calls) {
            if call.bound {
                kept.push(call);
            } else if self.deleted.insert(call.item.clone()) {
                out.push(ClientEvent::DeleteItem { id: call.item });
            }
        }
        self.calls = kept;
    }

    /// Makes the remote conversation follow `chat`: pushes the creates and deletes.
    pub(crate) fn sync(&mut self, chat: &ChatContext, out: &mut Vec<ClientEvent>) {
        let items = chat.items();
        if chat.extends(&self.synced) && self.entries.len() == self.synced.len() {
            for item in &items[self.entries.len()..] {
                let previous = self.last_remote(self.entries.len());
                let entry = self.enter(item, previous, out);
                self.entries.push(entry);
            }
        } else {
            self.realign(items, out);
        }
        self.synced = chat.clone();
    }

    /// The diff of a rewritten chat against the entries: kept, created, deleted.
    fn realign(&mut self, items: &[ChatItem], out: &mut Vec<ClientEvent>) {
        let old = std::mem::take(&mut self.entries);
        let (mut i, mut j) = (0, 0);
        while j < items.len() {
            if i < old.len() && old[i].key.matches(&items[j]) {
                self.entries.push(old[i].clone());
                i += 1;
                j += 1;
                continue;
            }
            let ahead = (j + 1..items.len().min(j + 1 + LOOKAHEAD))
                .any(|k| i < old.len() && old[i].key.matches(&items[k]));
            if ahead {
                // `items[j]` was inserted before an item that is still there.
                let previous = self.last_remote(self.entries.len());
                let entry = self.enter(&items[j], previous, out);
                self.entries.push(entry);
                j += 1;
                continue;
            }
            let gone_until =
                (i + 1..old.len().min(i + 1 + LOOKAHEAD)).find(|&k| old[k].key.matches(&items[j]));
            if let Some(k) = gone_until {
                // The entries before `k` left the chat.
                for entry in &old[i..k] {
                    self.remove(entry, out);
                }
                i = k;
                continue;
            }
            if i < old.len() {
                self.remove(&old[i], out);
                i += 1;
            }
            let previous = self.last_remote(self.entries.len());
            let entry = self.enter(&items[j], previous, out);
            self.entries.push(entry);
            j += 1;
        }
        for entry in &old[i..] {
            self.remove(entry, out);
        }
    }

    /// Where an item created after the first `before` entries goes: after the remote item
    /// of the last of them that has one still there, else first.
    fn last_remote(&self, before: usize) -> Place {
        self.entries[..before]
            .iter()
            .rev()
            .filter_map(|e| e.remote.as_ref())
            .find(|id| !self.deleted.contains(*id))
            .map_or(Place::Start, |id| Place::After(id.clone()))
    }

    /// Deletes an entry's remote item (once), and forgets its call.
    fn remove(&mut self, entry: &Entry, out: &mut Vec<ClientEvent>) {
        if let Some(remote) = &entry.remote {
            if self.deleted.insert(remote.clone()) {
                out.push(ClientEvent::DeleteItem { id: remote.clone() });
            }
            self.calls.retain(|c| &c.item != remote);
        }
        if let Some(wire) = &entry.wire_call {
            if matches!(entry.key, Key::Call(_)) {
                self.wire_calls.remove(wire);
            }
        }
    }

    /// The entry for a chat item new to the remote side: bound to the model's own item,
    /// created, or local only.
    fn enter(&mut self, item: &ChatItem, previous: Place, out: &mut Vec<ClientEvent>) -> Entry {
        let local = |key| Entry {
            key,
            remote: None,
            wire_call: None,
        };
        match item {
            ChatItem::Message(m) => {
                if m.role == ChatRole::User {
                    if let Some(remote) = self.heard.pop_front() {
                        return Entry {
                            key: Key::Heard,
                            remote: Some(remote),
                            wire_call: None,
                        };
                    }
                }
                if let Some(speech) = m.speech {
                    if let Some(remote) = self.spoken.get(&speech) {
                        if !self.deleted.contains(remote) {
                            return Entry {
                                key: Key::Spoken(speech),
                                remote: Some(remote.clone()),
                                wire_call: None,
                            };
                        }
                    }
                }
                if m.content.is_empty() {
                    return local(Key::Empty(m.role));
                }
                let id = self.create(
                    previous,
                    RemoteItem::Message {
                        role: m.role,
                        text: m.content.clone(),
                    },
                    out,
                );
                Entry {
                    key: Key::Text {
                        role: m.role,
                        text: m.content.clone(),
                        speech: m.speech,
                    },
                    remote: Some(id),
                    wire_call: None,
                }
            }
            ChatItem::FunctionCall(c) => {
                let model_call = self.calls.iter_mut().find(|mc| {
                    !mc.bound
                        && (c.call_id == mc.wire
                            || c.call_id
                                .strip_prefix(mc.wire.as_str())
                                .is_some_and(|rest| rest.starts_with('~')))
                });
                if let Some(mc) = model_call {
                    mc.bound = true;
                    return Entry {
                        key: Key::Call(c.call_id.clone()),
                        remote: Some(mc.item.clone()),
                        wire_call: Some(mc.wire.clone()),
                    };
                }
                let wire = self.wire_call_id(&c.call_id);
                let id = self.create(
                    previous,
                    RemoteItem::FunctionCall {
                        call_id: wire.clone(),
                        name: c.name.clone(),
                        arguments: c.arguments.clone(),
                    },
                    out,
                );
                Entry {
                    key: Key::Call(c.call_id.clone()),
                    remote: Some(id),
                    wire_call: Some(wire),
                }
            }
            ChatItem::FunctionCallOutput(o) => {
                let wire = self.entries.iter().rev().find_map(|e| match &e.key {
                    Key::Call(id) if *id == o.call_id => e.wire_call.clone(),
                    _ => None,
                });
                let Some(wire) = wire else {
                    // Its call is not in the remote conversation: an output for it would
                    // name an unknown call id.
                    return local(Key::Orphan(o.call_id.clone()));
                };
                let id = self.create(
                    previous,
                    RemoteItem::FunctionCallOutput {
                        call_id: wire.clone(),
                        output: o.output.clone(),
                    },
                    out,
                );
                Entry {
                    key: Key::Output(o.call_id.clone()),
                    remote: Some(id),
                    wire_call: Some(wire),
                }
            }
            _ => local(Key::Marker),
        }
    }

    /// Creates an item with an id of the engine's after `previous`.
    fn create(&mut self, previous: Place, item: RemoteItem, out: &mut Vec<ClientEvent>) -> String {
        self.next_item += 1;
        let id = format!("sb_item_{}", self.next_item);
        out.push(ClientEvent::CreateItem {
            id: id.clone(),
            previous,
            item,
        });
        id
    }

    /// A wire id for a call the engine creates: the canonical id when the protocol takes
    /// it (`^[a-zA-Z0-9_-]{1,32}$`, unused), else one of the engine's.
    fn wire_call_id(&mut self, canonical: &str) -> String {
        let plain = !canonical.is_empty()
            && canonical.len() <= MAX_ID
            && canonical
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        let wire = if plain && !self.wire_calls.contains(canonical) {
            canonical.to_owned()
        } else {
            self.next_item += 1;
            format!("sb_call_{}", self.next_item)
        };
        self.wire_calls.insert(wire.clone());
        wire
    }

    /// How many chat items are synced (for tests and logs).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::{ChatMessage, FunctionCall, FunctionCallOutput};

    fn user(text: &str) -> ChatItem {
        ChatItem::message(ChatRole::User, text)
    }

    fn said(text: &str, speech: u64) -> ChatItem {
        ChatItem::Message(ChatMessage {
            role: ChatRole::Assistant,
            content: text.to_owned(),
            interrupted: false,
            speech: Some(SpeechId(speech)),
        })
    }

    fn call(id: &str) -> ChatItem {
        ChatItem::FunctionCall(FunctionCall {
            call_id: id.to_owned(),
            name: "get_weather".to_owned(),
            arguments: "{}".to_owned(),
        })
    }

    fn output(id: &str) -> ChatItem {
        ChatItem::FunctionCallOutput(FunctionCallOutput {
            call_id: id.to_owned(),
            name: "get_weather".to_owned(),
            output: "sunny".to_owned(),
            is_error: false,
        })
    }

    fn sync(mirror: &mut Mirror, chat: &ChatContext) -> Vec<ClientEvent> {
        let mut out = Vec::new();
        mirror.sync(chat, &mut out);
        out
    }

    fn created(out: &[ClientEvent]) -> Vec<(String, Option<String>, RemoteItem)> {
        let after = |place: &Place| match place {
            Place::After(id) => Some(id.clone()),
            Place::Start | Place::End => None,
        };
        out.iter()
            .filter_map(|e| match e {
                ClientEvent::CreateItem { id, previous, item } => {
                    Some((id.clone(), after(previous), item.clone()))
                }
                _ => None,
            })
            .collect()
    }

    fn deleted(out: &[ClientEvent]) -> Vec<String> {
        out.iter()
            .filter_map(|e| match e {
                ClientEvent::DeleteItem { id } => Some(id.clone()),
                _ => None,
            })
            .collect()
    }

    /// A turn the server made: the user's audio (`heard`), the model's answer (`spoke`)
    /// and its call, with the call's output added on the engine's side.
    fn a_turn_with_a_call(heard: &str, spoke: &str) -> (Mirror, ChatContext) {
        let mut mirror = Mirror::default();
        mirror.heard("item_user".to_owned());
        mirror.spoke(SpeechId(1), "item_answer".to_owned());
        mirror.call_arrived("item_call".to_owned(), "call_a".to_owned());
        let mut chat = ChatContext::new();
        chat.push(user(heard));
        chat.push(said(spoke, 1));
        chat.push(call("call_a"));
        chat.push(output("call_a"));
        (mirror, chat)
    }

    #[test]
    fn what_the_model_made_is_bound_and_never_created() {
        let (mut mirror, chat) = a_turn_with_a_call("", "Let me check.");
        let out = sync(&mut mirror, &chat);
        let made = created(&out);
        assert_eq!(made.len(), 1, "only the output is new: {out:?}");
        assert_eq!(made[0].1.as_deref(), Some("item_call"));
        assert_eq!(
            made[0].2,
            RemoteItem::FunctionCallOutput {
                call_id: "call_a".to_owned(),
                output: "sunny".to_owned()
            }
        );
        assert_eq!(mirror.len(), 4);
    }

    #[test]
    fn a_repeated_model_id_binds_its_canonical_form() {
        let mut mirror = Mirror::default();
        mirror.call_arrived("item_call".to_owned(), "call_a".to_owned());
        let mut chat = ChatContext::new();
        chat.push(call("call_a~1"));
        chat.push(output("call_a~1"));
        let out = sync(&mut mirror, &chat);
        let made = created(&out);
        assert_eq!(made.len(), 1);
        assert!(
            matches!(&made[0].2, RemoteItem::FunctionCallOutput { call_id, .. } if call_id == "call_a")
        );
    }

    #[test]
    fn items_of_the_engine_are_created_in_chat_order() {
        let mut mirror = Mirror::default();
        let mut chat = ChatContext::new();
        chat.push(user("hello"));
        chat.push(said("Hi!", 1));
        chat.push(ChatItem::AgentHandoff {
            from: Some("a".to_owned()),
            to: "b".to_owned(),
        });
        chat.push(call("call_1/update_1"));
        chat.push(output("call_1/update_1"));
        let out = sync(&mut mirror, &chat);
        let made = created(&out);
        assert_eq!(made.len(), 4, "the handoff marker stays local: {out:?}");
        assert_eq!(made[0].1, None);
        assert_eq!(made[1].1.as_deref(), Some(made[0].0.as_str()));
        assert_eq!(made[2].1.as_deref(), Some(made[1].0.as_str()));
        // `/` is not a wire character: the engine names the call.
        let RemoteItem::FunctionCall { call_id, .. } = &made[2].2 else {
            panic!("a call: {:?}", made[2]);
        };
        assert!(call_id.starts_with("sb_call_"));
        assert!(
            matches!(&made[3].2, RemoteItem::FunctionCallOutput { call_id: out_id, .. } if out_id == call_id)
        );
    }

    #[test]
    fn an_output_whose_call_is_not_remote_is_never_sent() {
        let mut mirror = Mirror::default();
        let mut chat = ChatContext::new();
        chat.push(output("call_x"));
        let out = sync(&mut mirror, &chat);
        assert!(out.is_empty(), "{out:?}");
    }

    #[test]
    fn appends_send_only_what_is_new() {
        let mut mirror = Mirror::default();
        let mut chat = ChatContext::new();
        chat.push(user("one"));
        assert_eq!(created(&sync(&mut mirror, &chat)).len(), 1);
        assert!(sync(&mut mirror, &chat).is_empty());
        chat.push(user("two"));
        let made = created(&sync(&mut mirror, &chat));
        assert_eq!(made.len(), 1);
        assert_eq!(made[0].1.as_deref(), Some("sb_item_1"));
    }

    #[test]
    fn a_cut_or_filled_in_bound_message_changes_nothing_remote() {
        let mut mirror = Mirror::default();
        mirror.heard("item_user".to_owned());
        mirror.spoke(SpeechId(1), "item_answer".to_owned());
        let mut chat = ChatContext::new();
        chat.push(user(""));
        chat.push(said("A long answer about the weather.", 1));
        sync(&mut mirror, &chat);
        chat.edit(|items| {
            items[0] = user("what's the weather");
            items[1] = said("A long", 1);
        });
        assert!(sync(&mut mirror, &chat).is_empty());
    }

    #[test]
    fn a_message_removed_from_the_chat_is_deleted_once() {
        let mut mirror = Mirror::default();
        mirror.spoke(SpeechId(1), "item_answer".to_owned());
        let mut chat = ChatContext::new();
        chat.push(user("hi"));
        chat.push(said("Hello there", 1));
        chat.push(user("again"));
        sync(&mut mirror, &chat);
        // A truncation to nothing deleted it already.
        mirror.deleted("item_answer");
        chat.edit(|items| {
            items.remove(1);
        });
        let out = sync(&mut mirror, &chat);
        assert!(out.is_empty(), "{out:?}");
        // Without that, the diff deletes it.
        let mut mirror = Mirror::default();
        mirror.spoke(SpeechId(1), "item_answer".to_owned());
        let mut chat = ChatContext::new();
        chat.push(user("hi"));
        chat.push(said("Hello there", 1));
        chat.push(user("again"));
        sync(&mut mirror, &chat);
        chat.edit(|items| {
            items.remove(1);
        });
        let out = sync(&mut mirror, &chat);
        assert_eq!(deleted(&out), vec!["item_answer".to_owned()]);
        assert!(created(&out).is_empty());
    }

    #[test]
    fn a_new_agents_chat_replaces_the_old_one() {
        let mut mirror = Mirror::default();
        mirror.heard("item_user".to_owned());
        let mut chat = ChatContext::new();
        chat.push(user("book a table"));
        chat.push(ChatItem::message(ChatRole::Assistant, "Sure."));
        sync(&mut mirror, &chat);
        let mut task = ChatContext::new();
        task.push(ChatItem::message(
            ChatRole::System,
            "Collect the party size.",
        ));
        let out = sync(&mut mirror, &task);
        assert_eq!(
            deleted(&out),
            vec!["item_user".to_owned(), "sb_item_1".to_owned()]
        );
        assert_eq!(created(&out).len(), 1);
        // Back to the first chat: what was deleted is created again, as text.
        let out = sync(&mut mirror, &chat);
        assert_eq!(deleted(&out), vec!["sb_item_2".to_owned()]);
        let made = created(&out);
        assert_eq!(made.len(), 2);
        assert_eq!(
            made[0].2,
            RemoteItem::Message {
                role: ChatRole::User,
                text: "book a table".to_owned()
            }
        );
    }

    #[test]
    fn an_item_inserted_before_others_goes_after_its_chat_predecessor() {
        let mut mirror = Mirror::default();
        let mut chat = ChatContext::new();
        chat.push(user("one"));
        chat.push(user("three"));
        sync(&mut mirror, &chat);
        chat.edit(|items| items.insert(1, user("two")));
        let out = sync(&mut mirror, &chat);
        let made = created(&out);
        assert!(deleted(&out).is_empty(), "{out:?}");
        assert_eq!(made.len(), 1);
        assert_eq!(made[0].1.as_deref(), Some("sb_item_1"));
    }

    #[test]
    fn calls_no_chat_item_took_are_deleted_before_a_response() {
        let mut mirror = Mirror::default();
        mirror.call_arrived("item_cut".to_owned(), "call_cut".to_owned());
        mirror.call_arrived("item_kept".to_owned(), "call_kept".to_owned());
        let mut chat = ChatContext::new();
        chat.push(call("call_kept"));
        chat.push(output("call_kept"));
        sync(&mut mirror, &chat);
        let mut out = Vec::new();
        mirror.drop_unanswered(&mut out);
        assert_eq!(deleted(&out), vec!["item_cut".to_owned()]);
        let mut again = Vec::new();
        mirror.drop_unanswered(&mut again);
        assert!(again.is_empty());
    }

    #[test]
    fn after_a_reset_everything_is_created_as_text() {
        let (mut mirror, chat) = a_turn_with_a_call("weather?", "Checking.");
        sync(&mut mirror, &chat);
        mirror.reset();
        let out = sync(&mut mirror, &chat);
        let made = created(&out);
        assert_eq!(made.len(), 4);
        assert!(
            matches!(&made[1].2, RemoteItem::Message { role: ChatRole::Assistant, text } if text == "Checking.")
        );
        assert!(
            matches!(&made[2].2, RemoteItem::FunctionCall { call_id, .. } if call_id == "call_a")
        );
        // Ids stay unique across connections.
        assert!(made.iter().all(|(id, _, _)| id != "sb_item_1"));
    }
}
