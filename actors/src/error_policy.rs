//! Which tool errors the model sees. A `ToolError` always reaches the model as an error
//! output; any other error (a user error type, a panic) is routed by an [`ErrorPolicy`]:
//! **show** (its text goes to the model), **hide** (the model sees
//! `Error: internal error in <tool>`, the details go to the log) or **propagate** (an error
//! event, and the turn fails with `TurnFailure::Tool`; the session stays up). The
//! *caller* of a tool (session, agent) decides how its errors are routed, and a tool may
//! narrow it: rules are consulted tool → agent → session, the first that matches decides,
//! and the default is hide. Panics are never shown.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;

/// Where an unexpected tool error goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorRoute {
    /// The error's text goes to the model as an error output.
    Show,
    /// The model sees `Error: internal error in <tool>`; the details go to the log.
    Hide,
    /// The session emits an error event and the turn's `RunResult` fails; the call still
    /// gets its `Error: internal error in <tool>` output and the session stays up.
    Propagate,
}

type Predicate = Arc<dyn Fn(&(dyn StdError + 'static)) -> bool + Send + Sync>;

#[derive(Clone)]
struct Rule {
    matches: Predicate,
    label: String,
    route: ErrorRoute,
}

/// Rules that route unexpected tool errors: by error type (found by downcast along the
/// `source()` chain, outermost first) or by a predicate. The first rule that matches
/// decides; a policy with no matching rule leaves the decision to the next level
/// (tool → agent → session → default [`ErrorRoute::Hide`]).
///
/// ```
/// use switchboard::{ErrorPolicy, ErrorRoute};
/// #[derive(Debug, thiserror::Error)]
/// #[error("card declined")]
/// struct Declined;
/// let policy = ErrorPolicy::new()
///     .route::<Declined>(ErrorRoute::Show)
///     .route_if(|e| e.to_string().contains("timeout"), ErrorRoute::Propagate);
/// assert_eq!(policy.decide(&Declined), Some(ErrorRoute::Show));
/// ```
#[derive(Clone, Default)]
pub struct ErrorPolicy {
    rules: Vec<Rule>,
}

impl fmt::Debug for ErrorPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.rules.iter().map(|r| (&r.label, r.route)))
            .finish()
    }
}

impl ErrorPolicy {
    /// A policy with no rules.
    pub fn new() -> Self {
        Self::default()
    }

    /// Routes errors of type `E`, wherever `E` stands in the cause chain.
    pub fn route<E: StdError + 'static>(mut self, route: ErrorRoute) -> Self {
        self.rules.push(Rule {
            matches: Arc::new(|err| chain(err).any(|e| e.is::<E>())),
            label: std::any::type_name::<E>().to_owned(),
            route,
        });
        self
    }

    /// Routes errors for which `predicate` holds (it sees the outermost error).
    pub fn route_if(
        mut self,
        predicate: impl Fn(&(dyn StdError + 'static)) -> bool + Send + Sync + 'static,
        route: ErrorRoute,
    ) -> Self {
        self.rules.push(Rule {
            matches: Arc::new(predicate),
            label: "predicate".to_owned(),
            route,
        });
        self
    }

    /// Routes every error this policy sees (a catch-all; panics are still never shown).
    pub fn route_all(self, route: ErrorRoute) -> Self {
        self.route_if(|_| true, route)
    }

    /// The route of the first matching rule, if any.
    pub fn decide(&self, err: &(dyn StdError + 'static)) -> Option<ErrorRoute> {
        self.rules
            .iter()
            .find(|rule| (rule.matches)(err))
            .map(|rule| rule.route)
    }
}

/// The error and its causes, outermost first.
pub(crate) fn chain<'a>(
    err: &'a (dyn StdError + 'static),
) -> impl Iterator<Item = &'a (dyn StdError + 'static)> {
    std::iter::successors(Some(err), |&e| e.source())
}

/// The error with its cause chain on one line, for the log.
pub(crate) fn describe_chain(err: &(dyn StdError + 'static)) -> String {
    chain(err)
        .map(|e| e.to_string())
        .collect::<Vec<_>>()
        .join(": caused by: ")
}
