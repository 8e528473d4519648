//! What every actor of one session shares: settings, the event channel, counters.
//!
//! All of a session's actors live on one arbiter thread, so the locks here are never
//! contended; they exist because handles (`Session`, `RunContext`) are `Send`.

use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use tokio::sync::{broadcast, watch};

use crate::error_policy::ErrorPolicy;
use crate::events::SessionEvent;
use crate::ids::SessionId;
use crate::io::Io;
use crate::lifecycle::AliveWaiter;
use crate::llm::Llm;
use crate::mailbox::Journal;
use crate::prompts::Prompts;
use crate::tool::MockBody;

/// Settings of a session, fixed when it starts.
#[derive(Clone, Debug)]
pub(crate) struct SessionConfig {
    pub(crate) max_tool_steps: u32,
    pub(crate) grace_period: Duration,
    pub(crate) inherit_chat_context: bool,
}

pub(crate) struct SessionShared {
    pub(crate) id: SessionId,
    pub(crate) config: SessionConfig,
    pub(crate) llm: Option<Arc<dyn Llm>>,
    pub(crate) error_policy: ErrorPolicy,
    pub(crate) prompts: Prompts,
    pub(crate) mocks: HashMap<String, MockBody>,
    pub(crate) userdata: Option<Arc<dyn Any + Send + Sync>>,
    pub(crate) journal: Option<Arc<Journal>>,
    /// Created by the first subscriber: a broadcast channel allocates all its slots up
    /// front, which an idle session without listeners should not pay for.
    events: OnceLock<broadcast::Sender<SessionEvent>>,
    event_capacity: usize,
    pub(crate) inactive: watch::Sender<bool>,
    /// How many tool runs are alive in the session.
    pub(crate) running_tools: watch::Sender<usize>,
    io: Mutex<Box<dyn Io>>,
    run_seq: AtomicU64,
    speech_seq: AtomicU64,
    call_ids: Mutex<HashSet<String>>,
    pub(crate) session_gone: Mutex<Option<AliveWaiter>>,
}

impl SessionShared {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        id: SessionId,
        config: SessionConfig,
        llm: Option<Arc<dyn Llm>>,
        error_policy: ErrorPolicy,
        prompts: Prompts,
        mocks: HashMap<String, MockBody>,
        userdata: Option<Arc<dyn Any + Send + Sync>>,
        journal: Option<Arc<Journal>>,
        io: Box<dyn Io>,
        event_capacity: usize,
    ) -> Self {
        let (inactive, _) = watch::channel(false);
        let (running_tools, _) = watch::channel(0);
        Self {
            id,
            config,
            llm,
            error_policy,
            prompts,
            mocks,
            userdata,
            journal,
            events: OnceLock::new(),
            event_capacity: event_capacity.max(1),
            inactive,
            running_tools,
            io: Mutex::new(io),
            run_seq: AtomicU64::new(0),
            speech_seq: AtomicU64::new(0),
            call_ids: Mutex::new(HashSet::new()),
            session_gone: Mutex::new(None),
        }
    }

    /// Sends an event to subscribers (none listening is fine).
    pub(crate) fn emit(&self, event: SessionEvent) {
        self.emit_with(|| event);
    }

    /// Builds and sends an event only when someone listens: chat items are cloned for
    /// events, and a session without subscribers should not pay for that per item.
    pub(crate) fn emit_with(&self, event: impl FnOnce() -> SessionEvent) {
        if let Some(events) = self.events.get() {
            if events.receiver_count() > 0 {
                let _ = events.send(event());
            }
        }
    }

    /// A new subscriber to the session's events.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<SessionEvent> {
        self.events
            .get_or_init(|| broadcast::channel(self.event_capacity).0)
            .subscribe()
    }

    pub(crate) fn next_run(&self) -> u64 {
        self.run_seq.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub(crate) fn next_speech(&self) -> u64 {
        self.speech_seq.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub(crate) fn io(&self) -> MutexGuard<'_, Box<dyn Io>> {
        // A panic inside the host's Io leaves it as it was; keep using it.
        self.io.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes a provider's call id unique in the session: `{id}~{n}` when `id` was seen.
    pub(crate) fn unique_call_id(&self, id: &str) -> String {
        let mut seen = self.call_ids.lock().unwrap_or_else(|p| p.into_inner());
        if seen.insert(id.to_owned()) {
            return id.to_owned();
        }
        let unique = (2..)
            .map(|n| format!("{id}~{n}"))
            .find(|candidate| !seen.contains(candidate))
            .unwrap_or_else(|| format!("{id}~"));
        seen.insert(unique.clone());
        unique
    }
}
