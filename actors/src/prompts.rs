//! The four texts the engine writes into the conversation: `update`,
//! `duplicate_reject`, `duplicate_confirm` and `reply`.
//!
//! Each is a [`Template`]: a format string with named fields (checked when built: an
//! unknown field is an error then, not at the first tool call) or a closure over a typed
//! args struct. [`Prompts`] holds the ones set on a session, an agent or a toolset; the
//! most specific one set wins (`update` and the duplicate texts: toolset > owning agent >
//! session > default; `reply`: current agent > session > default).
//!
//! The defaults are short on purpose: a long explanation of the protocol makes models
//! re-call tools with invented results.

use std::borrow::Cow;
use std::fmt;
use std::sync::{Arc, LazyLock};

use crate::chat::FunctionCall;
use crate::error::BuildError;

/// Fields of the `update` template: `{function_name}`, `{call_id}`, `{message}`.
#[derive(Clone, Debug)]
pub struct UpdatePromptArgs {
    /// The tool's name.
    pub function_name: String,
    /// The call's id.
    pub call_id: String,
    /// The text the tool passed to `ctx.update`.
    pub message: String,
}

/// Fields of the duplicate templates: `{function_name}`, `{running_calls}` (one call's
/// JSON a line).
#[derive(Clone, Debug)]
pub struct DuplicatePromptArgs {
    /// The tool's name.
    pub function_name: String,
    /// The calls of it still running.
    pub running_calls: Vec<FunctionCall>,
}

/// Fields of the `reply` template: `{pending_call_ids}` (one id a line).
#[derive(Clone, Debug)]
pub struct ReplyPromptArgs {
    /// The call ids of the outputs the reply is about, oldest first.
    pub pending_call_ids: Vec<String>,
}

/// The typed arguments of one kind of template.
pub trait PromptArgs: Send + Sync + 'static {
    /// The template's name, for errors.
    const TEMPLATE: &'static str;
    /// The fields a format string may name.
    const FIELDS: &'static [&'static str];
    /// One field's text (borrowed where the arguments hold it as it is: a template is
    /// rendered for every update of every tool).
    fn field(&self, name: &str) -> Cow<'_, str>;
}

impl PromptArgs for UpdatePromptArgs {
    const TEMPLATE: &'static str = "update";
    const FIELDS: &'static [&'static str] = &["function_name", "call_id", "message"];
    fn field(&self, name: &str) -> Cow<'_, str> {
        Cow::Borrowed(match name {
            "function_name" => &self.function_name,
            "call_id" => &self.call_id,
            _ => &self.message,
        })
    }
}

impl PromptArgs for DuplicatePromptArgs {
    const TEMPLATE: &'static str = "duplicate";
    const FIELDS: &'static [&'static str] = &["function_name", "running_calls"];
    fn field(&self, name: &str) -> Cow<'_, str> {
        match name {
            "function_name" => Cow::Borrowed(&self.function_name),
            _ => Cow::Owned(
                self.running_calls
                    .iter()
                    .map(|c| serde_json::to_string(c).unwrap_or_else(|_| c.call_id.clone()))
                    .collect::<Vec<_>>()
                    .join("\n"),
            ),
        }
    }
}

impl PromptArgs for ReplyPromptArgs {
    const TEMPLATE: &'static str = "reply";
    const FIELDS: &'static [&'static str] = &["pending_call_ids"];
    fn field(&self, _name: &str) -> Cow<'_, str> {
        Cow::Owned(self.pending_call_ids.join("\n"))
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Piece {
    Text(String),
    Field(&'static str),
}

/// A prompt template: a checked format string or a closure.
pub struct Template<A: PromptArgs> {
    kind: Kind<A>,
}

enum Kind<A> {
    Format(Arc<[Piece]>),
    Closure(Arc<dyn Fn(&A) -> String + Send + Sync>),
}

impl<A: PromptArgs> Clone for Template<A> {
    fn clone(&self) -> Self {
        Self {
            kind: match &self.kind {
                Kind::Format(p) => Kind::Format(p.clone()),
                Kind::Closure(f) => Kind::Closure(f.clone()),
            },
        }
    }
}

impl<A: PromptArgs> fmt::Debug for Template<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Format(pieces) => write!(f, "Template::format({pieces:?})"),
            Kind::Closure(_) => write!(f, "Template::closure(..)"),
        }
    }
}

impl<A: PromptArgs> Template<A> {
    /// A format string naming fields as `{field}` (`{{` and `}}` for braces). An unknown
    /// field or an unclosed brace is an error here.
    pub fn format(text: &str) -> Result<Self, BuildError> {
        Ok(Self {
            kind: Kind::Format(parse::<A>(text)?.into()),
        })
    }

    /// A closure receiving the typed args.
    pub fn closure(render: impl Fn(&A) -> String + Send + Sync + 'static) -> Self {
        Self {
            kind: Kind::Closure(Arc::new(render)),
        }
    }

    /// Renders the template.
    pub fn render(&self, args: &A) -> String {
        match &self.kind {
            Kind::Closure(render) => render(args),
            Kind::Format(pieces) => {
                let mut out = String::with_capacity(64);
                for piece in pieces.iter() {
                    match piece {
                        Piece::Text(text) => out.push_str(text),
                        Piece::Field(name) => out.push_str(&args.field(name)),
                    }
                }
                out
            }
        }
    }

    fn builtin(text: &str) -> Self {
        // The built-in texts name only known fields; a failure would be a bug caught by
        // the unit test below, so fall back to the raw text rather than panic.
        Self::format(text).unwrap_or_else(|_| Self {
            kind: Kind::Format(vec![Piece::Text(text.to_owned())].into()),
        })
    }
}

fn parse<A: PromptArgs>(text: &str) -> Result<Vec<Piece>, BuildError> {
    let mut pieces = Vec::new();
    let mut literal = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                literal.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                literal.push('}');
            }
            '{' => {
                let mut name = String::new();
                loop {
                    match chars.next() {
                        Some('}') => break,
                        Some(c) => name.push(c),
                        None => return Err(unknown::<A>(format!("{{{name}"))),
                    }
                }
                let field = A::FIELDS
                    .iter()
                    .find(|f| **f == name)
                    .ok_or_else(|| unknown::<A>(name.clone()))?;
                if !literal.is_empty() {
                    pieces.push(Piece::Text(std::mem::take(&mut literal)));
                }
                pieces.push(Piece::Field(field));
            }
            '}' => return Err(unknown::<A>("}".to_owned())),
            c => literal.push(c),
        }
    }
    if !literal.is_empty() {
        pieces.push(Piece::Text(literal));
    }
    Ok(pieces)
}

fn unknown<A: PromptArgs>(field: String) -> BuildError {
    BuildError::UnknownTemplateField {
        template: A::TEMPLATE.into(),
        field,
        known: A::FIELDS.join(", "),
    }
}

/// Templates set at one level (session, agent or toolset). Unset ones fall through to the
/// next level, then to the defaults.
#[derive(Clone, Debug, Default)]
pub struct Prompts {
    update: Option<Template<UpdatePromptArgs>>,
    duplicate_reject: Option<Template<DuplicatePromptArgs>>,
    duplicate_confirm: Option<Template<DuplicatePromptArgs>>,
    reply: Option<Template<ReplyPromptArgs>>,
}

impl Prompts {
    /// No templates set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Wraps each update message.
    pub fn update(mut self, template: Template<UpdatePromptArgs>) -> Self {
        self.update = Some(template);
        self
    }

    /// Answers a duplicate call under `reject`.
    pub fn duplicate_reject(mut self, template: Template<DuplicatePromptArgs>) -> Self {
        self.duplicate_reject = Some(template);
        self
    }

    /// Answers a duplicate call under `confirm`.
    pub fn duplicate_confirm(mut self, template: Template<DuplicatePromptArgs>) -> Self {
        self.duplicate_confirm = Some(template);
        self
    }

    /// Instructions for the deferred reply to tool updates.
    pub fn reply(mut self, template: Template<ReplyPromptArgs>) -> Self {
        self.reply = Some(template);
        self
    }

    /// These templates, with unset ones taken from `fallback`.
    pub(crate) fn or(&self, fallback: &Prompts) -> Prompts {
        Prompts {
            update: self.update.clone().or_else(|| fallback.update.clone()),
            duplicate_reject: self
                .duplicate_reject
                .clone()
                .or_else(|| fallback.duplicate_reject.clone()),
            duplicate_confirm: self
                .duplicate_confirm
                .clone()
                .or_else(|| fallback.duplicate_confirm.clone()),
            reply: self.reply.clone().or_else(|| fallback.reply.clone()),
        }
    }

    pub(crate) fn render_update(&self, args: &UpdatePromptArgs) -> String {
        match &self.update {
            Some(t) => t.render(args),
            None => BUILTIN_UPDATE.render(args),
        }
    }

    pub(crate) fn render_reject(&self, args: &DuplicatePromptArgs) -> String {
        match &self.duplicate_reject {
            Some(t) => t.render(args),
            None => BUILTIN_REJECT.render(args),
        }
    }

    pub(crate) fn render_confirm(&self, args: &DuplicatePromptArgs) -> String {
        match &self.duplicate_confirm {
            Some(t) => t.render(args),
            None => BUILTIN_CONFIRM.render(args),
        }
    }

    pub(crate) fn render_reply(&self, args: &ReplyPromptArgs) -> String {
        match &self.reply {
            Some(t) => t.render(args),
            None => BUILTIN_REPLY.render(args),
        }
    }
}

// The built-in templates, parsed once: every update of every tool renders one.
static BUILTIN_UPDATE: LazyLock<Template<UpdatePromptArgs>> =
    LazyLock::new(|| Template::builtin(DEFAULT_UPDATE));
static BUILTIN_REJECT: LazyLock<Template<DuplicatePromptArgs>> =
    LazyLock::new(|| Template::builtin(DEFAULT_REJECT));
static BUILTIN_CONFIRM: LazyLock<Template<DuplicatePromptArgs>> =
    LazyLock::new(|| Template::builtin(DEFAULT_CONFIRM));
static BUILTIN_REPLY: LazyLock<Template<ReplyPromptArgs>> =
    LazyLock::new(|| Template::builtin(DEFAULT_REPLY));

/// Default `update` text.
pub const DEFAULT_UPDATE: &str = "Update from {function_name}: {message}";
/// Default `duplicate_reject` text.
pub const DEFAULT_REJECT: &str =
    "{function_name} is already running; not started again. Running calls:\n{running_calls}";
/// Default `duplicate_confirm` text.
pub const DEFAULT_CONFIRM: &str = "{function_name} is already running. Ask the user whether to run it again; if they confirm, call it with confirm_duplicate=true. Running calls:\n{running_calls}";
/// Default `reply` text.
pub const DEFAULT_REPLY: &str =
    "New results from running tools arrived:\n{pending_call_ids}\nTell the user what changed, briefly.";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_templates_parse() {
        assert!(Template::<UpdatePromptArgs>::format(DEFAULT_UPDATE).is_ok());
        assert!(Template::<DuplicatePromptArgs>::format(DEFAULT_REJECT).is_ok());
        assert!(Template::<DuplicatePromptArgs>::format(DEFAULT_CONFIRM).is_ok());
        assert!(Template::<ReplyPromptArgs>::format(DEFAULT_REPLY).is_ok());
    }

    #[test]
    fn braces_escape_and_unknown_fields_fail() {
        let t = Template::<ReplyPromptArgs>::format("{{ids}}: {pending_call_ids}").unwrap();
        let args = ReplyPromptArgs {
            pending_call_ids: vec!["a".into(), "b".into()],
        };
        assert_eq!(t.render(&args), "{ids}: a\nb");
        assert!(Template::<ReplyPromptArgs>::format("{call_id}").is_err());
        assert!(Template::<ReplyPromptArgs>::format("{pending_call_ids").is_err());
    }
}
