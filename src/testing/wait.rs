//! Waiting for session events in a test: bounded, and a failure says what the test waited
//! for and what it saw instead.

use std::fmt;
use std::time::Duration;

use switchboard_actors::{Session, SessionEvent};
use tokio::sync::broadcast::{self, error::RecvError};

use super::event;

/// How many of the events seen while waiting a [`WaitError`] keeps (the latest).
const SAW_LIMIT: usize = 20;

/// Why a wait in a test failed: what it waited for, and what it saw meanwhile.
///
/// `Display` (and `Debug`, so that `.unwrap()` reads well) prints, for example:
///
/// ```text
/// no event within 5s: waited for the output of call call_1/finished; saw 2 events:
///   AgentStateChanged agent-a: Thinking
///   SpeechCreated agent-a: speech_1
/// ```
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WaitError {
    /// Nothing matched within the timeout (under paused time: nothing could happen any
    /// more, so the clock jumped to the timeout at once).
    #[error(
        "no event within {timeout:?}: waited for {waited_for}; saw {}",
        Saw(saw)
    )]
    Timeout {
        /// What the test waited for.
        waited_for: String,
        /// How long it waited.
        timeout: Duration,
        /// What it saw meanwhile, oldest first (at most the last 20).
        saw: Vec<String>,
    },
    /// The session closed (its `Closed` event came, or its event channel ended) before a
    /// match: no event can follow.
    #[error(
        "the session's events ended (it closed): waited for {waited_for}; saw {}",
        Saw(saw)
    )]
    Closed {
        /// What the test waited for.
        waited_for: String,
        /// What it saw meanwhile, oldest first (at most the last 20).
        saw: Vec<String>,
    },
    /// The receiver fell behind and lost events, which may have held the awaited one.
    /// Subscribe later, or raise `SessionBuilder::event_capacity`.
    #[error(
        "the event receiver lagged and lost {missed} events: waited for {waited_for}; saw {}",
        Saw(saw)
    )]
    Lagged {
        /// What the test waited for.
        waited_for: String,
        /// How many events were lost.
        missed: u64,
        /// What it saw meanwhile, oldest first (at most the last 20).
        saw: Vec<String>,
    },
    /// The session refused the wait at once: [`settled`] awaited from a tool or hook of the
    /// same session would wait on its own turn.
    #[error("refused at once, waiting for {waited_for}: {reason}")]
    Refused {
        /// What the test waited for.
        waited_for: String,
        /// The session's reason.
        reason: String,
    },
}

impl fmt::Debug for WaitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// The "saw …" part of a [`WaitError`].
struct Saw<'a>(&'a [String]);

impl fmt::Display for Saw<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.len() {
            0 => write!(f, "nothing"),
            1 => write!(f, "1 event:\n  {}", self.0[0]),
            n => {
                write!(f, "{n} events:")?;
                for seen in self.0 {
                    write!(f, "\n  {seen}")?;
                }
                Ok(())
            }
        }
    }
}

/// What a test waits for among session events: picks a value out of the event it wants,
/// and says what that is for a failure message.
///
/// The functions of [`event`] are ready-made matchers for the usual events, and
/// [`event::matching`]`(what, |event| …)` turns a closure into one with a description.
/// A bare closure `FnMut(&SessionEvent) -> Option<T>` is a matcher too (described as "an
/// event the test's closure picks"), but needs its argument's type written out
/// (`|event: &SessionEvent| …`): Rust infers a closure's argument types only from a
/// closure bound, which `event::matching` has and a generic matcher does not.
pub trait EventMatcher {
    /// What a match gives back (an id, a handle, `()`).
    type Output;

    /// `Some` for the awaited event, `None` to keep waiting.
    fn pick(&mut self, event: &SessionEvent) -> Option<Self::Output>;

    /// What the matcher waits for, e.g. "the output of call call_1/finished".
    fn describe(&self) -> String;
}

impl<T, F> EventMatcher for F
where
    F: FnMut(&SessionEvent) -> Option<T>,
{
    type Output = T;

    fn pick(&mut self, event: &SessionEvent) -> Option<T> {
        self(event)
    }

    fn describe(&self) -> String {
        "an event the test's closure picks".to_owned()
    }
}

/// Waits for the first event `matcher` picks, for at most `timeout`; events before it are
/// consumed. Fails at once when the session closes first. Subscribe (`session.subscribe()`) **before** the action whose event you
/// await: a receiver sees only events sent after it was created.
///
/// Under paused time (`tokio::time::pause()`, with the session on the test's arbiter via
/// `Engine::current()`) the timeout is virtual: when nothing can happen any more, the
/// clock jumps and the wait fails at once instead of hanging.
pub async fn next_event<M: EventMatcher>(
    events: &mut broadcast::Receiver<SessionEvent>,
    mut matcher: M,
    timeout: Duration,
) -> Result<M::Output, WaitError> {
    let mut saw: Vec<String> = Vec::new();
    let wait = async {
        loop {
            match events.recv().await {
                Ok(event) => {
                    if let Some(found) = matcher.pick(&event) {
                        return Ok(found);
                    }
                    if saw.len() == SAW_LIMIT {
                        saw.remove(0);
                    }
                    saw.push(event::describe(&event));
                    if matches!(event, SessionEvent::Closed) {
                        // No event follows `Closed`: waiting longer cannot help.
                        return Err(None);
                    }
                }
                Err(RecvError::Lagged(missed)) => return Err(Some(missed)),
                Err(RecvError::Closed) => return Err(None),
            }
        }
    };
    let outcome = tokio::time::timeout(timeout, wait).await;
    let waited_for = matcher.describe();
    match outcome {
        Ok(Ok(found)) => Ok(found),
        Ok(Err(Some(missed))) => Err(WaitError::Lagged {
            waited_for,
            missed,
            saw,
        }),
        Ok(Err(None)) => Err(WaitError::Closed { waited_for, saw }),
        Err(_) => Err(WaitError::Timeout {
            waited_for,
            timeout,
            saw,
        }),
    }
}

/// Waits at most `timeout` for the session to settle ([`Session::wait_for_settled`]: no
/// tool call runs anywhere in it and it is inactive, every deferred reply done). A failure
/// says which half was missing and what the session did meanwhile, instead of hanging.
///
/// Under paused time (`tokio::time::pause()`, with the session on the test's arbiter via
/// `Engine::current()`) the timeout is virtual, as for [`next_event`]: a session that can
/// no longer settle fails the wait at once.
///
/// ```
/// use std::time::Duration;
/// use switchboard::prelude::*;
/// use switchboard::testing::{settled, Reply, ScriptedLlm};
///
/// # #[actix::main]
/// # async fn main() {
/// let session = Session::builder()
///     .llm(ScriptedLlm::new([Reply::text("Hello!")]))
///     .agent(Agent::builder("agent-a").build().unwrap())
///     .start(&Engine::current().unwrap())
///     .await
///     .unwrap();
/// session.run("hi").await.unwrap();
/// settled(&session, Duration::from_secs(5)).await.unwrap();
/// session.close().await.unwrap();
/// # }
/// ```
pub async fn settled(session: &Session, timeout: Duration) -> Result<(), WaitError> {
    const WAITED_FOR: &str = "the session to settle";
    let mut events = session.subscribe();
    let mut saw: Vec<String> = Vec::new();
    // Records what the session does while the test waits; never ends by itself.
    let record = async {
        loop {
            match events.recv().await {
                Ok(event) => {
                    if saw.len() == SAW_LIMIT {
                        saw.remove(0);
                    }
                    saw.push(event::describe(&event));
                }
                // What it saw is only for a failure's message: a gap in it is fine.
                Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => std::future::pending::<()>().await,
            }
        }
    };
    let outcome = tokio::time::timeout(timeout, async {
        tokio::select! {
            settled = session.wait_for_settled() => settled,
            // `record` never ends; its output type is the other arm's.
            never = record => never,
        }
    })
    .await;
    match outcome {
        Ok(Ok(())) => Ok(()),
        Ok(Err(refused)) => Err(WaitError::Refused {
            waited_for: WAITED_FOR.to_owned(),
            reason: refused.to_string(),
        }),
        Err(_) => Err(WaitError::Timeout {
            waited_for: if session.is_inactive() {
                format!("{WAITED_FOR} (it is inactive, but a tool call still runs)")
            } else {
                format!("{WAITED_FOR} (it is still active: a turn, speech or deferred reply)")
            },
            timeout,
            saw,
        }),
    }
}

/// A session's events, for a test to wait on: [`next_event`] with the receiver and a
/// timeout kept (default [`EventWaiter::DEFAULT_TIMEOUT`]).
///
/// ```
/// use switchboard::prelude::*;
/// use switchboard::testing::{event, EventWaiter, Reply, ScriptedLlm};
///
/// # #[actix::main]
/// # async fn main() {
/// let session = Session::builder()
///     .llm(ScriptedLlm::new([Reply::text("Hello!")]))
///     .agent(Agent::builder("agent-a").build().unwrap())
///     .start(&Engine::current().unwrap())
///     .await
///     .unwrap();
/// let mut events = EventWaiter::new(&session); // subscribe before acting
/// session.run("hi").await.unwrap();
/// let speech = events.next(event::speech_created()).await.unwrap();
/// assert_eq!(speech.id().to_string(), "speech_1");
/// session.close().await.unwrap();
/// # }
/// ```
#[derive(Debug)]
pub struct EventWaiter {
    events: broadcast::Receiver<SessionEvent>,
    timeout: Duration,
}

impl EventWaiter {
    /// How long [`EventWaiter::next`] waits unless told otherwise.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

    /// Subscribes to the session's events now: the waiter sees every event sent from here.
    pub fn new(session: &Session) -> Self {
        Self::from_receiver(session.subscribe())
    }

    /// Waits on a receiver the test already holds.
    pub fn from_receiver(events: broadcast::Receiver<SessionEvent>) -> Self {
        Self {
            events,
            timeout: Self::DEFAULT_TIMEOUT,
        }
    }

    /// Waits at most `timeout` for each event from now on.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Waits for the next event `matcher` picks; the events before it are consumed.
    pub async fn next<M: EventMatcher>(&mut self, matcher: M) -> Result<M::Output, WaitError> {
        next_event(&mut self.events, matcher, self.timeout).await
    }

    /// The receiver, to read events directly.
    pub fn receiver(&mut self) -> &mut broadcast::Receiver<SessionEvent> {
        &mut self.events
    }
}
