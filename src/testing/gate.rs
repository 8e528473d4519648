//! `Gate`: holds a tool body (or a scripted reply) until the test opens it.

use std::fmt;
use std::sync::Arc;

use tokio::sync::watch;

/// A gate a test opens to let a tool body go on: explicit synchronisation instead of a
/// sleep. Cheap to clone; every clone is the same gate. Once open it stays open, and
/// [`Gate::wait`] returns at once.
///
/// ```
/// use switchboard::prelude::*;
/// use switchboard::testing::Gate;
///
/// /// Sends its first update, then finishes only once the test opens `gate`.
/// fn search(gate: Gate) -> Tool {
///     Tool::new("search", "Searches", move |ctx: RunContext, _: NoArgs| {
///         let gate = gate.clone();
///         async move {
///             ctx.update("searching").await?;
///             gate.wait().await;
///             Ok::<_, ToolFailure>("3 results")
///         }
///     })
/// }
/// let gate = Gate::new();
/// let tool = search(gate.clone());
/// // … start a session with `tool`, run a turn, assert on the update …
/// gate.open(); // now the tool returns
/// # let _ = tool;
/// ```
#[derive(Clone)]
pub struct Gate(Arc<watch::Sender<bool>>);

impl Gate {
    /// A closed gate.
    pub fn new() -> Self {
        Self(Arc::new(watch::channel(false).0))
    }

    /// Opens the gate: every waiter goes on, and later waits return at once.
    pub fn open(&self) {
        self.0.send_replace(true);
    }

    /// Whether the gate is open.
    pub fn is_open(&self) -> bool {
        *self.0.borrow()
    }

    /// Waits until the gate is open (at once if it is).
    pub async fn wait(&self) {
        let mut open = self.0.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = open.wait_for(|open| *open).await;
    }
}

impl Default for Gate {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Gate")
            .field(&if self.is_open() { "open" } else { "closed" })
            .finish()
    }
}

/// Two gates are equal when they are clones of one gate.
impl PartialEq for Gate {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}
