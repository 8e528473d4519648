//! Speeches: every agent utterance — the text of one LLM step, a `say`, a deferred reply
//! — has an id and a [`SpeechHandle`]: whether it may be interrupted, how to interrupt
//! it, and how it ended (played, or cut short with what the user heard).
//!
//! Whether a speech may be interrupted is decided per turn: the `say` options, else the
//! agent's setting, else the session's (default: yes). A tool may hold interruptions off
//! while it runs (`RunContext::disallow_interruptions`): the speech of its turn is then
//! not interruptible, by the user or by `cancel_task`, until the tool ends.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use crate::error::SessionError;
use crate::lifecycle::{alive_pair, AliveToken, AliveWaiter};
use crate::output::SpeechId;

/// Where a speech goes in the queue: speeches play one at a time, by priority, then in
/// the order they were asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum SpeechPriority {
    /// After everything else queued.
    Low,
    /// Replies and `say` by default.
    #[default]
    Normal,
    /// Before everything else queued (not before the turn that runs now).
    High,
}

/// How `Session::say` speaks a text.
#[derive(Clone, Copy, Debug)]
pub struct SayOptions {
    pub(crate) allow_interruptions: Option<bool>,
    pub(crate) add_to_chat: bool,
    pub(crate) priority: SpeechPriority,
}

impl Default for SayOptions {
    fn default() -> Self {
        Self {
            allow_interruptions: None,
            add_to_chat: true,
            priority: SpeechPriority::Normal,
        }
    }
}

impl SayOptions {
    /// The defaults: interruptible as the agent and session say, recorded in the chat
    /// context, normal priority.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the user may interrupt it (default: the agent's, else the session's setting).
    pub fn allow_interruptions(mut self, allow: bool) -> Self {
        self.allow_interruptions = Some(allow);
        self
    }

    /// Whether the text goes into the agent's chat context as an assistant message
    /// (default true).
    pub fn add_to_chat(mut self, add: bool) -> Self {
        self.add_to_chat = add;
        self
    }

    /// Its place in the queue (default normal).
    pub fn priority(mut self, priority: SpeechPriority) -> Self {
        self.priority = priority;
        self
    }
}

/// How a speech ended.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SpeechOutcome {
    /// Played out in full (the event for it is
    /// [`SessionEvent::SpeechPlayedOut`](crate::SessionEvent::SpeechPlayedOut)).
    #[doc(alias = "PlayedOut")]
    Played,
    /// Cut short: by the user, an interruption, or the session closing. `heard` is what
    /// the user heard, when the output said (empty: nothing; `None`: unknown).
    Interrupted {
        /// What the user heard.
        heard: Option<String>,
    },
}

/// Whether a turn's speech may be interrupted now: its setting, and the tools holding
/// interruptions off while they run. Shared by the turn's speeches and calls.
#[derive(Debug)]
pub(crate) struct Interruptibility {
    allow: AtomicBool,
    holds: AtomicUsize,
}

impl Interruptibility {
    pub(crate) fn new(allow: bool) -> Arc<Self> {
        Arc::new(Self {
            allow: AtomicBool::new(allow),
            holds: AtomicUsize::new(0),
        })
    }

    /// Whether an interruption (not forced) is allowed now.
    pub(crate) fn allows(&self) -> bool {
        self.allow.load(Ordering::Relaxed) && self.holds.load(Ordering::Relaxed) == 0
    }

    pub(crate) fn set(&self, allow: bool) {
        self.allow.store(allow, Ordering::Relaxed);
    }

    /// A tool holds interruptions off until it calls `release`.
    pub(crate) fn hold(&self) {
        self.holds.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn release(&self) {
        // Never below zero, even if a release came without its hold.
        let _ = self
            .holds
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }
}

/// How a speech handle asks the engine to interrupt it (implemented by the session's
/// links).
pub(crate) trait SpeechPort: Send + Sync + 'static {
    fn interrupt(&self, speech: SpeechId, force: bool);
}

/// How a handle of a speech played elsewhere (by a session on another machine) asks for
/// its interruption: what the host's side of that session implements to make
/// [`SpeechHandle::remote`] handles.
pub trait SpeechControl: Send + Sync + 'static {
    /// Interrupt `speech` (`force`: even if it disallows interruptions). Called from
    /// [`SpeechHandle::interrupt`] and [`SpeechHandle::force_interrupt`], which do not
    /// wait: it must not block (send the request, and return).
    fn interrupt(&self, speech: SpeechId, force: bool);
}

/// Routes a remote handle's interruptions to its [`SpeechControl`].
struct ControlPort(Arc<dyn SpeechControl>);

impl SpeechPort for ControlPort {
    fn interrupt(&self, speech: SpeechId, force: bool) {
        self.0.interrupt(speech, force);
    }
}

/// A speech's end as its session reports it, for a handle made off the engine
/// ([`SpeechHandle::remote`]). Its handle counts the speech as interrupted (heard
/// unknown) once the report is dropped before it said how the speech ended: the session
/// is gone.
#[derive(Debug)]
pub struct SpeechReport {
    handle: SpeechHandle,
    /// Holds the handle's session alive; dropped, `wait_for_playout` stops waiting.
    _session: AliveToken,
}

impl SpeechReport {
    /// The speech ended (as the session's `SpeechPlayedOut` event said): its handle's
    /// `outcome` and `wait_for_playout` answer with `outcome` from now on. Later reports
    /// change nothing: a speech that ended stays ended.
    pub fn ended(&self, outcome: SpeechOutcome) {
        self.handle.set_status(SpeechStatus::Done(outcome));
    }
}

/// Where a speech is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SpeechStatus {
    /// Waiting in the queue (a `say` not started yet).
    Queued,
    /// Its text streams or plays.
    Speaking,
    /// Over.
    Done(SpeechOutcome),
}

/// One speech of the agent. Cheap to clone; `Send + Sync`. It does not keep the session
/// alive: once the session is gone, a speech that had not ended counts as interrupted.
#[derive(Clone)]
pub struct SpeechHandle {
    inner: Arc<SpeechInner>,
}

struct SpeechInner {
    id: SpeechId,
    interruptibility: Arc<Interruptibility>,
    // A lock and a notify, not a channel: every utterance has a handle, most are never
    // awaited, and a channel would cost an allocation each.
    status: Mutex<SpeechStatus>,
    ended: Notify,
    port: Arc<dyn SpeechPort>,
    /// The session's end: a speech still going then counts as interrupted.
    session_gone: AliveWaiter,
}

impl SpeechInner {
    fn status(&self) -> MutexGuard<'_, SpeechStatus> {
        // The status is a plain value; a panic elsewhere cannot leave it half-written.
        self.status.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl fmt::Debug for SpeechHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpeechHandle")
            .field("id", &self.inner.id)
            .field("status", &*self.inner.status())
            .finish()
    }
}

/// As what names the speech off this engine: `{"id": 3, "allow_interruptions": true}`.
impl serde::Serialize for SpeechHandle {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut speech = serializer.serialize_struct("Speech", 2)?;
        speech.serialize_field("id", &self.id())?;
        speech.serialize_field("allow_interruptions", &self.allow_interruptions())?;
        speech.end()
    }
}

/// What names a speech off its engine, as a handle serializes.
#[derive(serde::Deserialize)]
struct NamedSpeech {
    id: SpeechId,
    allow_interruptions: bool,
}

/// Read back from `{"id": 3, "allow_interruptions": true}`: a handle that names the
/// speech and is linked to nothing, since the session that plays it is elsewhere.
/// `interrupt` asks nothing of anyone, and `wait_for_playout` answers at once that it was
/// interrupted, heard unknown. The host's side of a session on another machine (the
/// cluster's remote session) gives its events handles linked to that session instead
/// ([`SpeechHandle::remote`]).
impl<'de> serde::Deserialize<'de> for SpeechHandle {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let named = NamedSpeech::deserialize(deserializer)?;
        // The report is dropped at once: nobody will say how the speech ended here.
        let (handle, _report) =
            SpeechHandle::remote(named.id, named.allow_interruptions, Arc::new(Unlinked));
        Ok(handle)
    }
}

/// The control of a handle read back from JSON alone: there is no session to ask.
struct Unlinked;

impl SpeechControl for Unlinked {
    fn interrupt(&self, _speech: SpeechId, _force: bool) {}
}

impl PartialEq for SpeechHandle {
    fn eq(&self, other: &Self) -> bool {
        self.inner.id == other.inner.id
    }
}

impl SpeechHandle {
    pub(crate) fn new(
        id: SpeechId,
        interruptibility: Arc<Interruptibility>,
        status: SpeechStatus,
        port: Arc<dyn SpeechPort>,
        session_gone: AliveWaiter,
    ) -> Self {
        Self {
            inner: Arc::new(SpeechInner {
                id,
                interruptibility,
                status: Mutex::new(status),
                ended: Notify::new(),
                port,
                session_gone,
            }),
        }
    }

    /// A handle for a speech that a session on another machine plays: the host's side of
    /// that session makes one per speech its events name. `interrupt` and
    /// `force_interrupt` go to `control` (a speech that disallows interruptions is refused
    /// here first, as `allow_interruptions` said when the speech was created); how the
    /// speech ends comes from the returned [`SpeechReport`], and once that is dropped
    /// without a word, the speech counts as interrupted, heard unknown.
    pub fn remote(
        id: SpeechId,
        allow_interruptions: bool,
        control: Arc<dyn SpeechControl>,
    ) -> (Self, SpeechReport) {
        let (session, gone) = alive_pair();
        let handle = Self::new(
            id,
            Interruptibility::new(allow_interruptions),
            SpeechStatus::Speaking,
            Arc::new(ControlPort(control)),
            gone,
        );
        let report = SpeechReport {
            handle: handle.clone(),
            _session: session,
        };
        (handle, report)
    }

    /// The speech's id.
    pub fn id(&self) -> SpeechId {
        self.inner.id
    }

    /// Whether the user (or a non-forced `interrupt`) may interrupt it now.
    pub fn allow_interruptions(&self) -> bool {
        self.inner.interruptibility.allows()
    }

    /// Allows or disallows interruptions of this speech's turn from now on (a tool that
    /// holds them off still does until it ends).
    pub fn set_allow_interruptions(&self, allow: bool) {
        self.inner.interruptibility.set(allow);
    }

    /// Interrupts the speech: a queued one never plays; a playing one stops, and its turn
    /// with it. `Err` when it does not allow interruptions (see
    /// [`SpeechHandle::force_interrupt`]); `Ok` when it has already ended.
    pub fn interrupt(&self) -> Result<(), SessionError> {
        if self.is_done() {
            return Ok(());
        }
        if !self.allow_interruptions() {
            return Err(SessionError::Uninterruptible);
        }
        self.inner.port.interrupt(self.inner.id, false);
        Ok(())
    }

    /// Interrupts the speech even if it disallows interruptions.
    pub fn force_interrupt(&self) {
        if !self.is_done() {
            self.inner.port.interrupt(self.inner.id, true);
        }
    }

    /// Whether the speech has ended.
    pub fn is_done(&self) -> bool {
        matches!(*self.inner.status(), SpeechStatus::Done(_))
    }

    /// How it ended, once it has.
    pub fn outcome(&self) -> Option<SpeechOutcome> {
        match &*self.inner.status() {
            SpeechStatus::Done(outcome) => Some(outcome.clone()),
            _ => None,
        }
    }

    /// Waits until the speech has played out or was cut short. Waiting on the speech of
    /// one's own step from inside a tool is fine: a step's text is complete before its
    /// tools run, so its playout does not wait for them.
    ///
    /// Never waits past the session: once the session is gone, a speech that had not
    /// ended counts as interrupted (heard unknown).
    pub async fn wait_for_playout(&self) -> SpeechOutcome {
        let gone = self.inner.session_gone.clone().wait();
        tokio::pin!(gone);
        loop {
            // Registered before the check, so an end in between is not missed.
            let ended = self.inner.ended.notified();
            if let Some(outcome) = self.outcome() {
                return outcome;
            }
            tokio::select! {
                () = ended => {}
                () = &mut gone => {
                    return self
                        .outcome()
                        .unwrap_or(SpeechOutcome::Interrupted { heard: None });
                }
            }
        }
    }

    pub(crate) fn set_status(&self, status: SpeechStatus) {
        let ends = matches!(status, SpeechStatus::Done(_));
        {
            let mut current = self.inner.status();
            // A speech that has ended stays ended.
            if matches!(*current, SpeechStatus::Done(_)) {
                return;
            }
            *current = status;
        }
        if ends {
            self.inner.ended.notify_waiters();
        }
    }

    pub(crate) fn interruptibility(&self) -> &Arc<Interruptibility> {
        &self.inner.interruptibility
    }
}
