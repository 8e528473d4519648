//! `SessionHistory`: what was said in a session, agent by agent.

use crate::chat::{ChatContext, ChatItem, ChatRole};
use crate::ids::ActorId;

/// The chat context one activation of an agent ended with (or has now).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct AgentChat {
    /// The agent's name.
    pub agent: String,
    /// The activity (one activation of the agent): `activity/s1/booker#2`.
    pub activity: ActorId,
    /// Its chat context.
    pub chat: ChatContext,
    /// How many of its first items it was given when it started (the chat context it
    /// inherited); the items after them are its own. A hook that edits the inherited
    /// items does not move this mark.
    pub inherited: usize,
    /// Whether the activation is still running: its chat context may still grow.
    pub live: bool,
    /// Set when the activation ran inside a sub-task: whose, and where in the caller's
    /// conversation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub_task_of: Option<SubTaskOf>,
}

/// Where a sub-task's activation sits in its caller's conversation: the caller paused
/// with `after` items in its chat context, so in the call's transcript the sub-task's
/// items come after the caller's first `after` items and before the rest.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct SubTaskOf {
    /// The caller's activity.
    pub caller: ActorId,
    /// How many items the caller's chat context had when it paused.
    pub after: usize,
}

impl AgentChat {
    /// The items this activation added (what it inherited left out).
    pub fn own_items(&self) -> &[ChatItem] {
        let items = self.chat.items();
        &items[self.inherited.min(items.len())..]
    }
}

/// The transcript of a session: the chat context of every activation of every agent, in
/// the order they started. `Session::close` returns it once every agent has closed (a
/// host stores what was said on a call); `Session::history` returns it while the session
/// runs, with the running activations' contexts as they are now.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SessionHistory {
    /// One entry per activation, oldest first.
    pub agents: Vec<AgentChat>,
}

impl SessionHistory {
    /// The chat context of the latest activation of `agent`, if it ran.
    pub fn chat_of(&self, agent: &str) -> Option<&ChatContext> {
        self.agents
            .iter()
            .rev()
            .find(|entry| entry.agent == agent)
            .map(|entry| &entry.chat)
    }

    /// Every activation of `agent`, oldest first.
    pub fn activations_of<'a>(&'a self, agent: &'a str) -> impl Iterator<Item = &'a AgentChat> {
        self.agents.iter().filter(move |entry| entry.agent == agent)
    }

    /// The whole conversation of the call across agents, in the order it happened, each
    /// item once, with the name of the agent whose context it went to: every activation's
    /// own items (what the next agent inherited is not repeated), a sub-task's spliced into
    /// its caller's where the caller paused.
    pub fn transcript(&self) -> Vec<(&str, &ChatItem)> {
        let mut out = Vec::new();
        for (index, entry) in self.agents.iter().enumerate() {
            if entry.sub_task_of.is_none() {
                self.splice(index, &mut out);
            }
        }
        out
    }

    /// The texts of the user's messages, in the order of the [`transcript`](Self::transcript).
    pub fn user_messages(&self) -> Vec<&str> {
        self.messages(ChatRole::User)
    }

    /// The texts of the agents' messages, in the order of the
    /// [`transcript`](Self::transcript).
    pub fn assistant_messages(&self) -> Vec<&str> {
        self.messages(ChatRole::Assistant)
    }

    fn messages(&self, role: ChatRole) -> Vec<&str> {
        self.transcript()
            .into_iter()
            .filter_map(|(_, item)| match item {
                ChatItem::Message(m) if m.role == role => Some(m.content.as_str()),
                _ => None,
            })
            .collect()
    }

    /// Adds activation `index`'s own items, with its sub-tasks' where they ran.
    fn splice<'a>(&'a self, index: usize, out: &mut Vec<(&'a str, &'a ChatItem)>) {
        let entry = &self.agents[index];
        let tasks: Vec<(usize, usize)> = self
            .agents
            .iter()
            .enumerate()
            .filter_map(|(i, e)| match &e.sub_task_of {
                Some(of) if of.caller == entry.activity => Some((i, of.after)),
                _ => None,
            })
            .collect();
        let mut tasks = tasks.into_iter().peekable();
        for (at, item) in entry.chat.items().iter().enumerate() {
            while let Some((task, _)) = tasks.next_if(|(_, after)| *after <= at) {
                self.splice(task, out);
            }
            if at >= entry.inherited {
                out.push((entry.agent.as_str(), item));
            }
        }
        for (task, _) in tasks {
            self.splice(task, out);
        }
    }
}

/// The activations that have closed, as they recorded themselves (an activity records its
/// final chat context when it stops, whoever stopped it), with their place in start order.
#[derive(Debug, Default)]
pub(crate) struct HistoryBook {
    closed: Vec<(u32, AgentChat)>,
}

impl HistoryBook {
    /// Records the final context of the activation started `order`-th.
    pub(crate) fn record(&mut self, order: u32, entry: AgentChat) {
        self.closed.push((order, entry));
    }

    /// The closed activations, with their place in start order.
    pub(crate) fn closed(&self) -> &[(u32, AgentChat)] {
        &self.closed
    }

    /// The history: the closed activations and `live` ones (read from running activities;
    /// one that closed meanwhile is taken from the book), in start order.
    pub(crate) fn history(&self, live: Vec<(u32, AgentChat)>) -> SessionHistory {
        let mut all: Vec<(u32, AgentChat)> = self.closed.clone();
        for (order, entry) in live {
            if !all.iter().any(|(_, e)| e.activity == entry.activity) {
                all.push((order, entry));
            }
        }
        all.sort_by_key(|(order, _)| *order);
        SessionHistory {
            agents: all.into_iter().map(|(_, entry)| entry).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::ChatRole;

    fn said(texts: &[&str]) -> ChatContext {
        ChatContext::from(
            texts
                .iter()
                .map(|t| ChatItem::message(ChatRole::User, *t))
                .collect::<Vec<_>>(),
        )
    }

    fn activation(agent: &str, chat: ChatContext, inherited: usize) -> AgentChat {
        AgentChat {
            agent: agent.into(),
            activity: ActorId::new(format!("activity/s1/{agent}#1")),
            chat,
            inherited,
            live: false,
            sub_task_of: None,
        }
    }

    fn within(mut entry: AgentChat, caller: &str, after: usize) -> AgentChat {
        entry.sub_task_of = Some(SubTaskOf {
            caller: ActorId::new(format!("activity/s1/{caller}#1")),
            after,
        });
        entry
    }

    fn lines(history: &SessionHistory) -> Vec<String> {
        history
            .transcript()
            .into_iter()
            .map(|(agent, item)| format!("{agent}: {}", item.text().unwrap_or_default()))
            .collect()
    }

    #[test]
    fn sub_tasks_are_spliced_where_their_caller_paused_and_inherited_items_appear_once() {
        let history = SessionHistory {
            agents: vec![
                activation("front", said(&["hi", "email please", "thanks"]), 0),
                // A sub-task of front after its first two items, which hands off inside
                // the task to `checker` (inheriting one item), which runs a nested task.
                within(activation("collector", said(&["a@b.c"]), 0), "front", 2),
                within(
                    activation("checker", said(&["a@b.c", "sure?"]), 1),
                    "front",
                    2,
                ),
                within(activation("confirm", said(&["yes"]), 0), "checker", 1),
                // Then front hands off, inheriting everything.
                activation(
                    "billing",
                    said(&["hi", "email please", "thanks", "bill"]),
                    3,
                ),
            ],
        };
        assert_eq!(
            lines(&history),
            [
                "front: hi",
                "front: email please",
                "collector: a@b.c",
                "confirm: yes",
                "checker: sure?",
                "front: thanks",
                "billing: bill",
            ]
        );
    }

    #[test]
    fn a_mark_past_the_end_of_an_edited_caller_puts_the_sub_task_last() {
        let history = SessionHistory {
            agents: vec![
                activation("front", said(&["hi"]), 0),
                within(activation("task", said(&["done"]), 0), "front", 5),
            ],
        };
        assert_eq!(lines(&history), ["front: hi", "task: done"]);
        assert_eq!(history.activations_of("task").count(), 1);
        assert_eq!(history.chat_of("front").map(ChatContext::len), Some(1));
    }

    #[test]
    fn the_book_prefers_a_recorded_final_context_over_a_live_read() {
        let mut book = HistoryBook::default();
        book.record(2, activation("b", said(&["final"]), 0));
        let mut live_b = activation("b", said(&[]), 0);
        live_b.live = true;
        let mut live_a = activation("a", said(&["now"]), 0);
        live_a.live = true;
        let history = book.history(vec![(1, live_a), (2, live_b)]);
        assert_eq!(lines(&history), ["a: now", "b: final"]);
        assert!(history.agents[0].live);
        assert!(!history.agents[1].live);
    }
}
