//! Fluent assertions over the events of one turn ([`RunResult`]), for users' tests.
//!
//! ```
//! use serde_json::json;
//! use switchboard::testing::RunResultExt;
//! use switchboard::{ChatItem, ChatRole, FunctionCall, FunctionCallOutput, RunResult};
//!
//! // What `session.run("weather in Paris?")` returns: the user's message comes first.
//! let result = RunResult {
//!     events: vec![
//!         ChatItem::message(ChatRole::User, "weather in Paris?"),
//!         ChatItem::FunctionCall(FunctionCall {
//!             call_id: "call_1".into(),
//!             name: "get_weather".into(),
//!             arguments: r#"{"city": "Paris"}"#.into(),
//!         }),
//!         ChatItem::FunctionCallOutput(FunctionCallOutput {
//!             call_id: "call_1".into(),
//!             name: "get_weather".into(),
//!             output: "sunny".into(),
//!             is_error: false,
//!         }),
//!         ChatItem::message(ChatRole::Assistant, "It is sunny in Paris."),
//!     ],
//!     ..Default::default()
//! };
//! let mut expect = result.expect();
//! expect.next_event().is_message(ChatRole::User);
//! let call_id = expect
//!     .next_event()
//!     .is_function_call("get_weather")
//!     .with_args(json!({"city": "Paris"}))
//!     .call_id();
//! expect
//!     .next_event()
//!     .is_function_call_output()
//!     .for_call(call_id)
//!     .not_error()
//!     .with_output("sunny");
//! expect.next_event().is_message(ChatRole::Assistant).containing("sunny");
//! expect.no_more_events();
//! ```
//!
//! Every assertion comes twice: a panicking one with `#[track_caller]` (what a test
//! wants: the failure points at the test's line) and a `try_` one returning
//! [`ExpectError`]. A failure shows what was expected, what was found, and every event
//! of the turn, with `>` at the one being checked:
//!
//! ```text
//! expected a function call to `get_weather`, found message (assistant): "Hi"
//! events:
//!   0 function_call get_weather {"city":"Paris"} (call_1)
//! > 1 message assistant "Hi"
//! ```

use std::fmt;

use serde_json::Value;
use switchboard_actors::{
    ChatItem, ChatMessage, ChatRole, FunctionCall, FunctionCallOutput, RunResult,
};

/// How many characters of a text an event listing shows before cutting it.
const LISTING_TEXT_LIMIT: usize = 60;

/// Starts assertions over the events of `result`, with the cursor on its first event.
pub fn expect(result: &RunResult) -> RunExpect<'_> {
    RunExpect::from_items(&result.events)
}

/// `result.expect()`: [`expect`] as a method of [`RunResult`].
pub trait RunResultExt {
    /// Starts assertions over the turn's events, with the cursor on the first one.
    fn expect(&self) -> RunExpect<'_>;
}

impl RunResultExt for RunResult {
    fn expect(&self) -> RunExpect<'_> {
        expect(self)
    }
}

/// Why an assertion failed: what was expected, what was found, and the turn's events.
///
/// `Display` (and `Debug`, so that `try_…().unwrap()` reads well) prints:
///
/// ```text
/// expected <expected>, found <found>
/// events:
///   0 <event>
/// > 1 <the event being checked>
/// ```
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
pub struct ExpectError {
    expected: String,
    found: String,
    position: Option<usize>,
    events: Vec<String>,
}

impl ExpectError {
    fn new(
        expected: impl Into<String>,
        found: impl Into<String>,
        position: Option<usize>,
        events: &[ChatItem],
    ) -> Self {
        Self {
            expected: expected.into(),
            found: found.into(),
            position,
            events: events.iter().map(summary).collect(),
        }
    }

    /// What the assertion expected, e.g. "a function call to `get_weather`".
    pub fn expected(&self) -> &str {
        &self.expected
    }

    /// What it found instead, e.g. "message (assistant): \"Hi\"".
    pub fn found(&self) -> &str {
        &self.found
    }

    /// The index of the event the assertion looked at (the `>` line), if it looked at
    /// one; `Some(len)` means "past the last event".
    pub fn position(&self) -> Option<usize> {
        self.position
    }
}

impl fmt::Display for ExpectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "expected {}, found {}\nevents:",
            self.expected, self.found
        )?;
        if self.events.is_empty() && self.position.is_none() {
            write!(f, " (none)")?;
        }
        for (index, event) in self.events.iter().enumerate() {
            let marker = if self.position == Some(index) {
                '>'
            } else {
                ' '
            };
            write!(f, "\n{marker} {index} {event}")?;
        }
        if self.position == Some(self.events.len()) {
            write!(f, "\n> {} (end)", self.events.len())?;
        }
        Ok(())
    }
}

impl fmt::Debug for ExpectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Turns a failed assertion into a panic at the test's line.
// Panicking is the point of the non-`try_` assertions: test code wants a failure at its
// own line (`#[track_caller]`), with the readable message, not a `Result`.
#[allow(clippy::panic)]
#[track_caller]
fn check<T>(result: Result<T, ExpectError>) -> T {
    match result {
        Ok(value) => value,
        Err(error) => panic!("{error}"),
    }
}

/// Assertions over an ordered list of events, with a cursor (see the module docs).
#[derive(Clone, Debug)]
pub struct RunExpect<'a> {
    events: &'a [ChatItem],
    cursor: usize,
}

impl<'a> RunExpect<'a> {
    /// Assertions over any list of chat items (a turn's events, a chat context's items).
    pub fn from_items(events: &'a [ChatItem]) -> Self {
        Self { events, cursor: 0 }
    }

    /// The index of the event [`RunExpect::next_event`] would return.
    pub fn cursor(&self) -> usize {
        self.cursor
    }

    /// How many events are after the cursor.
    pub fn remaining(&self) -> usize {
        self.events.len().saturating_sub(self.cursor)
    }

    /// The event at the cursor; moves the cursor past it. Panics if no event is left.
    #[track_caller]
    pub fn next_event(&mut self) -> EventAssert<'a> {
        check(self.try_next_event())
    }

    /// The event at the cursor; moves the cursor past it. Fails (cursor unchanged) if no
    /// event is left.
    pub fn try_next_event(&mut self) -> Result<EventAssert<'a>, ExpectError> {
        match self.events.get(self.cursor) {
            Some(item) => {
                let event = EventAssert {
                    at: At::new(self.events, self.cursor),
                    item,
                };
                self.cursor += 1;
                Ok(event)
            }
            None => Err(ExpectError::new(
                "another event",
                format!("the end of the events ({} in all)", self.events.len()),
                Some(self.cursor),
                self.events,
            )),
        }
    }

    /// Moves the cursor past `count` events. Panics if fewer are left.
    #[track_caller]
    pub fn skip_next(&mut self, count: usize) -> &mut Self {
        check(self.try_skip_next(count))
    }

    /// Moves the cursor past `count` events. Fails (cursor unchanged) if fewer are left.
    pub fn try_skip_next(&mut self, count: usize) -> Result<&mut Self, ExpectError> {
        if count > self.remaining() {
            return Err(ExpectError::new(
                format!("at least {count} more events to skip"),
                format!("{} more", self.remaining()),
                Some(self.cursor),
                self.events,
            ));
        }
        self.cursor += count;
        Ok(self)
    }

    /// Asserts that the cursor is past the last event. Panics otherwise.
    #[track_caller]
    pub fn no_more_events(&self) {
        check(self.try_no_more_events())
    }

    /// Asserts that the cursor is past the last event.
    pub fn try_no_more_events(&self) -> Result<(), ExpectError> {
        match self.events.get(self.cursor) {
            None => Ok(()),
            Some(item) => Err(ExpectError::new(
                "no more events",
                format!("{} more, the next: {}", self.remaining(), describe(item)),
                Some(self.cursor),
                self.events,
            )),
        }
    }

    /// The event at index `index` (from the first event, whatever the cursor); does not
    /// move the cursor. Panics if there is no such event.
    #[track_caller]
    pub fn nth(&self, index: usize) -> EventAssert<'a> {
        check(self.try_nth(index))
    }

    /// The event at index `index`; does not move the cursor.
    pub fn try_nth(&self, index: usize) -> Result<EventAssert<'a>, ExpectError> {
        match self.events.get(index) {
            Some(item) => Ok(EventAssert {
                at: At::new(self.events, index),
                item,
            }),
            None => Err(ExpectError::new(
                format!("an event at index {index}"),
                format!("{} events", self.events.len()),
                None,
                self.events,
            )),
        }
    }

    /// The first function call to `name` anywhere in the events; does not move the
    /// cursor. Panics if there is none.
    #[track_caller]
    pub fn contains_function_call(&self, name: &str) -> FunctionCallAssert<'a> {
        check(self.try_contains_function_call(name))
    }

    /// The first function call to `name` anywhere in the events; does not move the cursor.
    pub fn try_contains_function_call(
        &self,
        name: &str,
    ) -> Result<FunctionCallAssert<'a>, ExpectError> {
        self.find(|item| matches!(item, ChatItem::FunctionCall(c) if c.name == name))
            .and_then(|event| event.try_is_function_call(name).ok())
            .ok_or_else(|| self.not_found(format!("a function call to `{name}` among the events")))
    }

    /// The first function call to `name` with exactly these arguments (as
    /// [`FunctionCallAssert::with_args`] compares them) anywhere in the events; does not
    /// move the cursor. Panics if there is none.
    #[track_caller]
    pub fn contains_function_call_with_args(
        &self,
        name: &str,
        args: Value,
    ) -> FunctionCallAssert<'a> {
        check(self.try_contains_function_call_with_args(name, args))
    }

    /// The first function call to `name` with exactly these arguments anywhere in the
    /// events; does not move the cursor.
    pub fn try_contains_function_call_with_args(
        &self,
        name: &str,
        args: Value,
    ) -> Result<FunctionCallAssert<'a>, ExpectError> {
        self.events
            .iter()
            .enumerate()
            .filter_map(|(index, item)| {
                EventAssert {
                    at: At::new(self.events, index),
                    item,
                }
                .try_is_function_call(name)
                .ok()
            })
            .find_map(|call| call.try_with_args(args.clone()).ok())
            .ok_or_else(|| {
                self.not_found(format!(
                    "a function call to `{name}` with arguments {args} among the events"
                ))
            })
    }

    /// The first message from `role` anywhere in the events; does not move the cursor.
    /// Panics if there is none.
    #[track_caller]
    pub fn contains_message(&self, role: ChatRole) -> MessageAssert<'a> {
        check(self.try_contains_message(role))
    }

    /// The first message from `role` anywhere in the events; does not move the cursor.
    pub fn try_contains_message(&self, role: ChatRole) -> Result<MessageAssert<'a>, ExpectError> {
        self.find(|item| matches!(item, ChatItem::Message(m) if m.role == role))
            .and_then(|event| event.try_is_message(role).ok())
            .ok_or_else(|| {
                self.not_found(format!("a message ({}) among the events", role_name(role)))
            })
    }

    /// The first function call output anywhere in the events; does not move the cursor.
    /// Panics if there is none.
    #[track_caller]
    pub fn contains_function_call_output(&self) -> OutputAssert<'a> {
        check(self.try_contains_function_call_output())
    }

    /// The first function call output anywhere in the events; does not move the cursor.
    pub fn try_contains_function_call_output(&self) -> Result<OutputAssert<'a>, ExpectError> {
        self.find(|item| matches!(item, ChatItem::FunctionCallOutput(_)))
            .and_then(|event| event.try_is_function_call_output().ok())
            .ok_or_else(|| self.not_found("a function call output among the events"))
    }

    /// The output of the call with id `call_id` anywhere in the events (`"call_1"` for the
    /// immediate output, `"call_1/finished"` for an async tool's final one); does not move
    /// the cursor. Panics if there is none.
    #[track_caller]
    pub fn contains_function_call_output_for(&self, call_id: &str) -> OutputAssert<'a> {
        check(self.try_contains_function_call_output_for(call_id))
    }

    /// The output of the call with id `call_id` anywhere in the events; does not move the
    /// cursor.
    pub fn try_contains_function_call_output_for(
        &self,
        call_id: &str,
    ) -> Result<OutputAssert<'a>, ExpectError> {
        self.find(|item| matches!(item, ChatItem::FunctionCallOutput(o) if o.call_id == call_id))
            .and_then(|event| event.try_is_function_call_output().ok())
            .ok_or_else(|| {
                self.not_found(format!("the output of call `{call_id}` among the events"))
            })
    }

    /// The first handoff to `to` anywhere in the events; does not move the cursor. Panics
    /// if there is none.
    #[track_caller]
    pub fn contains_agent_handoff(&self, to: &str) -> HandoffAssert<'a> {
        check(self.try_contains_agent_handoff(to))
    }

    /// The first handoff to `to` anywhere in the events; does not move the cursor.
    pub fn try_contains_agent_handoff(&self, to: &str) -> Result<HandoffAssert<'a>, ExpectError> {
        self.find(|item| matches!(item, ChatItem::AgentHandoff { to: t, .. } if t == to))
            .and_then(|event| event.try_is_agent_handoff(to).ok())
            .ok_or_else(|| self.not_found(format!("an agent handoff to `{to}` among the events")))
    }

    fn find(&self, pred: impl Fn(&ChatItem) -> bool) -> Option<EventAssert<'a>> {
        let index = self.events.iter().position(pred)?;
        Some(EventAssert {
            at: At::new(self.events, index),
            item: &self.events[index],
        })
    }

    fn not_found(&self, expected: impl Into<String>) -> ExpectError {
        ExpectError::new(expected, "none", None, self.events)
    }
}

/// Where an asserted item sits: the events and its index, for failure messages.
#[derive(Clone, Copy, Debug)]
struct At<'a> {
    events: &'a [ChatItem],
    index: usize,
}

impl<'a> At<'a> {
    fn new(events: &'a [ChatItem], index: usize) -> Self {
        Self { events, index }
    }

    fn fail(&self, expected: impl Into<String>, found: impl Into<String>) -> ExpectError {
        ExpectError::new(expected, found, Some(self.index), self.events)
    }
}

/// One event, before its kind is asserted.
#[derive(Clone, Copy, Debug)]
pub struct EventAssert<'a> {
    at: At<'a>,
    item: &'a ChatItem,
}

impl<'a> EventAssert<'a> {
    /// The event.
    pub fn item(&self) -> &'a ChatItem {
        self.item
    }

    /// Its index among the events.
    pub fn index(&self) -> usize {
        self.at.index
    }

    /// Asserts a function call to `name`. Panics otherwise.
    #[track_caller]
    pub fn is_function_call(self, name: &str) -> FunctionCallAssert<'a> {
        check(self.try_is_function_call(name))
    }

    /// Asserts a function call to `name`.
    pub fn try_is_function_call(self, name: &str) -> Result<FunctionCallAssert<'a>, ExpectError> {
        let expected = || format!("a function call to `{name}`");
        match self.item {
            ChatItem::FunctionCall(call) if call.name == name => {
                Ok(FunctionCallAssert { at: self.at, call })
            }
            ChatItem::FunctionCall(call) => Err(self
                .at
                .fail(expected(), format!("a function call to `{}`", call.name))),
            other => Err(self.at.fail(expected(), describe(other))),
        }
    }

    /// Asserts a function call output. Panics otherwise.
    #[track_caller]
    pub fn is_function_call_output(self) -> OutputAssert<'a> {
        check(self.try_is_function_call_output())
    }

    /// Asserts a function call output.
    pub fn try_is_function_call_output(self) -> Result<OutputAssert<'a>, ExpectError> {
        match self.item {
            ChatItem::FunctionCallOutput(output) => Ok(OutputAssert {
                at: self.at,
                output,
            }),
            other => Err(self.at.fail("a function call output", describe(other))),
        }
    }

    /// Asserts a message from `role`. Panics otherwise.
    #[track_caller]
    pub fn is_message(self, role: ChatRole) -> MessageAssert<'a> {
        check(self.try_is_message(role))
    }

    /// Asserts a message from `role`.
    pub fn try_is_message(self, role: ChatRole) -> Result<MessageAssert<'a>, ExpectError> {
        match self.item {
            ChatItem::Message(message) if message.role == role => Ok(MessageAssert {
                at: self.at,
                message,
            }),
            other => Err(self
                .at
                .fail(format!("a message ({})", role_name(role)), describe(other))),
        }
    }

    /// Asserts a handoff to the agent named `to`. Panics otherwise.
    #[track_caller]
    pub fn is_agent_handoff(self, to: &str) -> HandoffAssert<'a> {
        check(self.try_is_agent_handoff(to))
    }

    /// Asserts a handoff to the agent named `to`.
    pub fn try_is_agent_handoff(self, to: &str) -> Result<HandoffAssert<'a>, ExpectError> {
        match self.item {
            ChatItem::AgentHandoff { from, to: actual } if actual == to => Ok(HandoffAssert {
                at: self.at,
                from: from.as_deref(),
                to: actual,
            }),
            other => Err(self
                .at
                .fail(format!("an agent handoff to `{to}`"), describe(other))),
        }
    }
}

/// A function call, asserted by name.
#[derive(Clone, Copy, Debug)]
pub struct FunctionCallAssert<'a> {
    at: At<'a>,
    call: &'a FunctionCall,
}

impl<'a> FunctionCallAssert<'a> {
    /// The call.
    pub fn call(&self) -> &'a FunctionCall {
        self.call
    }

    /// Its call id, to match the output with [`OutputAssert::for_call`].
    pub fn call_id(&self) -> &'a str {
        &self.call.call_id
    }

    /// Its index among the events.
    pub fn index(&self) -> usize {
        self.at.index
    }

    /// Asserts the arguments equal `expected` as JSON: object keys in any order, numbers
    /// by value (`1` equals `1.0`). Panics otherwise.
    #[track_caller]
    pub fn with_args(self, expected: Value) -> Self {
        check(self.try_with_args(expected))
    }

    /// Asserts the arguments equal `expected` as JSON.
    pub fn try_with_args(self, expected: Value) -> Result<Self, ExpectError> {
        let actual = self.parsed_args(&expected, "")?;
        if json_eq(&actual, &expected, false) {
            Ok(self)
        } else {
            Err(self.at.fail(
                format!(
                    "function call `{}` with arguments {expected}",
                    self.call.name
                ),
                format!("arguments {actual}"),
            ))
        }
    }

    /// Asserts the arguments include `expected`: every key of an expected object is
    /// present with a matching value (recursively); other values must be equal. Panics
    /// otherwise.
    #[track_caller]
    pub fn with_args_including(self, expected: Value) -> Self {
        check(self.try_with_args_including(expected))
    }

    /// Asserts the arguments include `expected` (see [`Self::with_args_including`]).
    pub fn try_with_args_including(self, expected: Value) -> Result<Self, ExpectError> {
        let actual = self.parsed_args(&expected, "including ")?;
        if json_eq(&actual, &expected, true) {
            Ok(self)
        } else {
            Err(self.at.fail(
                format!(
                    "function call `{}` with arguments including {expected}",
                    self.call.name
                ),
                format!("arguments {actual}"),
            ))
        }
    }

    /// The output of this call: the first output with its call id after it among the
    /// events. Panics if there is none.
    ///
    /// ```
    /// # use switchboard::testing::RunResultExt;
    /// # fn check(result: &switchboard::RunResult) {
    /// result
    ///     .expect()
    ///     .contains_function_call("book_table")
    ///     .has_output()
    ///     .with_output("booked");
    /// # }
    /// ```
    #[track_caller]
    pub fn has_output(self) -> OutputAssert<'a> {
        check(self.try_has_output())
    }

    /// The output of this call: the first output with its call id after it among the
    /// events.
    pub fn try_has_output(self) -> Result<OutputAssert<'a>, ExpectError> {
        let events = self.at.events;
        let call_id = self.call.call_id.as_str();
        events
            .iter()
            .enumerate()
            .skip(self.at.index + 1)
            .find_map(|(index, item)| match item {
                ChatItem::FunctionCallOutput(output) if output.call_id == call_id => {
                    Some(OutputAssert {
                        at: At::new(events, index),
                        output,
                    })
                }
                _ => None,
            })
            .ok_or_else(|| {
                self.at
                    .fail(format!("an output of call `{call_id}` after it"), "none")
            })
    }

    fn parsed_args(&self, expected: &Value, how: &str) -> Result<Value, ExpectError> {
        serde_json::from_str(&self.call.arguments).map_err(|error| {
            self.at.fail(
                format!(
                    "function call `{}` with arguments {how}{expected}",
                    self.call.name
                ),
                format!(
                    "arguments that are not valid JSON ({error}): {:?}",
                    self.call.arguments
                ),
            )
        })
    }
}

/// A function call output.
#[derive(Clone, Copy, Debug)]
pub struct OutputAssert<'a> {
    at: At<'a>,
    output: &'a FunctionCallOutput,
}

impl<'a> OutputAssert<'a> {
    /// The output.
    pub fn output(&self) -> &'a FunctionCallOutput {
        self.output
    }

    /// Its index among the events.
    pub fn index(&self) -> usize {
        self.at.index
    }

    /// Asserts the output text is exactly `text`. Panics otherwise.
    #[track_caller]
    pub fn with_output(self, text: &str) -> Self {
        check(self.try_with_output(text))
    }

    /// Asserts the output text is exactly `text`.
    pub fn try_with_output(self, text: &str) -> Result<Self, ExpectError> {
        self.ensure(self.output.output == text, || format!("output {text:?}"))
    }

    /// Asserts the output text contains `text`. Panics otherwise.
    #[track_caller]
    pub fn containing(self, text: &str) -> Self {
        check(self.try_containing(text))
    }

    /// Asserts the output text contains `text`.
    pub fn try_containing(self, text: &str) -> Result<Self, ExpectError> {
        self.ensure(self.output.output.contains(text), || {
            format!("an output containing {text:?}")
        })
    }

    /// Asserts the output reports a failure. Panics otherwise.
    #[track_caller]
    pub fn is_error(self) -> Self {
        check(self.try_is_error())
    }

    /// Asserts the output reports a failure.
    pub fn try_is_error(self) -> Result<Self, ExpectError> {
        self.ensure(self.output.is_error, || "an error output".to_owned())
    }

    /// Asserts the output does not report a failure. Panics otherwise.
    #[track_caller]
    pub fn not_error(self) -> Self {
        check(self.try_not_error())
    }

    /// Asserts the output does not report a failure.
    pub fn try_not_error(self) -> Result<Self, ExpectError> {
        self.ensure(!self.output.is_error, || {
            "an output that is not an error".to_owned()
        })
    }

    /// Asserts the output answers the call with this id. Panics otherwise.
    #[track_caller]
    pub fn for_call(self, call_id: &str) -> Self {
        check(self.try_for_call(call_id))
    }

    /// Asserts the output answers the call with this id.
    pub fn try_for_call(self, call_id: &str) -> Result<Self, ExpectError> {
        self.ensure(self.output.call_id == call_id, || {
            format!("the output of call `{call_id}`")
        })
    }

    /// Asserts the output comes from the tool named `name`. Panics otherwise.
    #[track_caller]
    pub fn for_tool(self, name: &str) -> Self {
        check(self.try_for_tool(name))
    }

    /// Asserts the output comes from the tool named `name`.
    pub fn try_for_tool(self, name: &str) -> Result<Self, ExpectError> {
        self.ensure(self.output.name == name, || {
            format!("an output of `{name}`")
        })
    }

    fn ensure(self, ok: bool, expected: impl FnOnce() -> String) -> Result<Self, ExpectError> {
        if ok {
            Ok(self)
        } else {
            Err(self.at.fail(expected(), describe_output(self.output)))
        }
    }
}

/// A message, asserted by role.
#[derive(Clone, Copy, Debug)]
pub struct MessageAssert<'a> {
    at: At<'a>,
    message: &'a ChatMessage,
}

impl<'a> MessageAssert<'a> {
    /// The message.
    pub fn message(&self) -> &'a ChatMessage {
        self.message
    }

    /// Its text.
    pub fn content(&self) -> &'a str {
        &self.message.content
    }

    /// Its index among the events.
    pub fn index(&self) -> usize {
        self.at.index
    }

    /// Asserts the text contains `text`. Panics otherwise.
    #[track_caller]
    pub fn containing(self, text: &str) -> Self {
        check(self.try_containing(text))
    }

    /// Asserts the text contains `text`.
    pub fn try_containing(self, text: &str) -> Result<Self, ExpectError> {
        self.ensure(self.message.content.contains(text), || {
            format!("a message containing {text:?}")
        })
    }

    /// Asserts the text is exactly `text`. Panics otherwise.
    #[track_caller]
    pub fn with_content(self, text: &str) -> Self {
        check(self.try_with_content(text))
    }

    /// Asserts the text is exactly `text`.
    pub fn try_with_content(self, text: &str) -> Result<Self, ExpectError> {
        self.ensure(self.message.content == text, || {
            format!("the message {text:?}")
        })
    }

    fn ensure(self, ok: bool, expected: impl FnOnce() -> String) -> Result<Self, ExpectError> {
        if ok {
            Ok(self)
        } else {
            Err(self.at.fail(expected(), describe_message(self.message)))
        }
    }
}

/// An agent handoff, asserted by the agent it went to.
#[derive(Clone, Copy, Debug)]
pub struct HandoffAssert<'a> {
    at: At<'a>,
    from: Option<&'a str>,
    to: &'a str,
}

impl<'a> HandoffAssert<'a> {
    /// The agent that handed off, if any.
    pub fn from(&self) -> Option<&'a str> {
        self.from
    }

    /// The agent that took over.
    pub fn to(&self) -> &'a str {
        self.to
    }

    /// Its index among the events.
    pub fn index(&self) -> usize {
        self.at.index
    }

    /// Asserts the handoff came from the agent named `name`. Panics otherwise.
    #[track_caller]
    pub fn with_from(self, name: &str) -> Self {
        check(self.try_with_from(name))
    }

    /// Asserts the handoff came from the agent named `name`.
    pub fn try_with_from(self, name: &str) -> Result<Self, ExpectError> {
        if self.from == Some(name) {
            Ok(self)
        } else {
            Err(self.at.fail(
                format!("an agent handoff from `{name}` to `{}`", self.to),
                describe_handoff(self.from, self.to),
            ))
        }
    }
}

/// Compares JSON values: objects by key (order-insensitive), numbers by value. With
/// `subset`, an expected object only needs its own keys to be present and to match.
fn json_eq(actual: &Value, expected: &Value, subset: bool) -> bool {
    match (actual, expected) {
        (Value::Object(a), Value::Object(e)) => {
            (subset || a.len() == e.len())
                && e.iter()
                    .all(|(k, ev)| a.get(k).is_some_and(|av| json_eq(av, ev, subset)))
        }
        (Value::Array(a), Value::Array(e)) => {
            a.len() == e.len() && a.iter().zip(e).all(|(av, ev)| json_eq(av, ev, subset))
        }
        (Value::Number(a), Value::Number(e)) => {
            a == e
                || match (a.as_i64(), e.as_i64(), a.as_u64(), e.as_u64()) {
                    (Some(x), Some(y), _, _) => x == y,
                    (_, _, Some(x), Some(y)) => x == y,
                    _ => a.as_f64().zip(e.as_f64()).is_some_and(|(x, y)| x == y),
                }
        }
        _ => actual == expected,
    }
}

fn role_name(role: ChatRole) -> &'static str {
    match role {
        ChatRole::System => "system",
        ChatRole::User => "user",
        ChatRole::Assistant => "assistant",
    }
}

/// The arguments as compact JSON, or the raw text if they do not parse.
fn args_text(arguments: &str) -> String {
    match serde_json::from_str::<Value>(arguments) {
        Ok(value) => value.to_string(),
        Err(_) => format!("{arguments:?}"),
    }
}

/// The full description of an event, for the "found" part of a failure.
fn describe(item: &ChatItem) -> String {
    match item {
        ChatItem::Message(message) => describe_message(message),
        ChatItem::FunctionCall(call) => format!(
            "a function call to `{}` with {} ({})",
            call.name,
            args_text(&call.arguments),
            call.call_id
        ),
        ChatItem::FunctionCallOutput(output) => describe_output(output),
        ChatItem::AgentHandoff { from, to } => describe_handoff(from.as_deref(), to),
        other => format!("{other:?}"),
    }
}

fn describe_message(message: &ChatMessage) -> String {
    format!(
        "message ({}): {:?}",
        role_name(message.role),
        message.content
    )
}

fn describe_output(output: &FunctionCallOutput) -> String {
    format!(
        "{}output of `{}` ({}): {:?}",
        if output.is_error { "error " } else { "" },
        output.name,
        output.call_id,
        output.output
    )
}

fn describe_handoff(from: Option<&str>, to: &str) -> String {
    match from {
        Some(from) => format!("agent handoff from `{from}` to `{to}`"),
        None => format!("agent handoff to `{to}`"),
    }
}

/// One line of the event listing: the kind, then the essentials, long texts cut.
pub(crate) fn summary(item: &ChatItem) -> String {
    match item {
        ChatItem::Message(message) => format!(
            "message {} {}",
            role_name(message.role),
            cut(&message.content)
        ),
        ChatItem::FunctionCall(call) => format!(
            "function_call {} {} ({})",
            call.name,
            cut_raw(&args_text(&call.arguments)),
            call.call_id
        ),
        ChatItem::FunctionCallOutput(output) => format!(
            "function_call_output {} ({}){} {}",
            output.name,
            output.call_id,
            if output.is_error { " error" } else { "" },
            cut(&output.output)
        ),
        ChatItem::AgentHandoff { from, to } => format!(
            "agent_handoff {} -> {to}",
            from.as_deref().unwrap_or("(none)")
        ),
        other => cut_raw(&format!("{other:?}")),
    }
}

/// `text` quoted, cut to [`LISTING_TEXT_LIMIT`] characters.
fn cut(text: &str) -> String {
    match text.char_indices().nth(LISTING_TEXT_LIMIT) {
        Some((end, _)) => format!("{:?}…", &text[..end]),
        None => format!("{text:?}"),
    }
}

/// `text` as is, cut to [`LISTING_TEXT_LIMIT`] characters.
fn cut_raw(text: &str) -> String {
    match text.char_indices().nth(LISTING_TEXT_LIMIT) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}
