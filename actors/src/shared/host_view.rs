//! What the host reads of a session without sending it a message: whether it is inactive
//! or settled, whether a switch just ended, what the user and the agent are doing, and
//! what `Session::summary` reports (the current agent, the turns started, whether the
//! session is closing).
//!
//! The session actor writes all of it, with two exceptions, each for a reason: the agent
//! state is written by the current activity (it alone knows when it thinks or speaks,
//! and a message per change would cost the hot path), and the count of live tool runs by
//! each run as it starts and stops (a counter, so that the settle signal needs no message).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{watch, Notify};

use crate::agent::Agent;
use crate::events::{AgentState, SessionEvent, UserState};
use crate::input_ledger::InputLedger;
use crate::shared::Events;

pub(crate) struct HostView {
    /// Whether the session is inactive; written only through [`Self::publish_inactive`].
    pub(crate) inactive: watch::Sender<bool>,
    /// How many tool runs are alive in the session, call-long ones aside. (`u32`s: with the
    /// small state below they fill the space one `usize` and the state took, and an idle
    /// session pays for every byte here.)
    running_tools: AtomicU32,
    /// How many runs of call-long tools are alive: they do not hold settling.
    call_long_tools: AtomicU32,
    /// Notified each time the session becomes settled (inactive, no tool run alive), for
    /// `wait_for_settled`: one signal for the pair, so a waiting host is woken once per
    /// settle, not once per half of it.
    settled: Notify,
    /// Notified each time a switch (handoff, sub-task start or end) ends: reads that found
    /// no current agent ask again then.
    pub(crate) switched: Notify,
    // Plain atomics, not channels: nobody awaits them (events announce changes), and an
    // idle session should not pay for a channel each.
    agent_state: AtomicU8,
    user_state: AtomicU8,
    /// The host inputs applied with their ids and what they answered
    /// (`Session::apply`): written by the session actor as it applies them, read by the
    /// host (`Session::applied`, `Session::last_input`), carried in snapshots.
    inputs: Mutex<InputLedger>,
    /// Set once the session began to close.
    closing: AtomicBool,
    /// Turns the session started that ask the model (user turns, replies, deferred
    /// replies), for `Session::summary`.
    turns: AtomicU32,
    /// The current agent's name as the session last published it; `None` before the
    /// first one entered. Written only when it changes (a handoff, a sub-task), read by
    /// summaries. The name, not the `Agent`: the host's handle reaches this view, and an
    /// agent whose tools hold a `Session` would make a cycle that outlives the close.
    agent: Mutex<Option<Arc<str>>>,
}

fn agent_state_code(state: AgentState) -> u8 {
    match state {
        AgentState::Initializing => 0,
        AgentState::Listening => 1,
        AgentState::Thinking => 2,
        AgentState::Speaking => 3,
    }
}

fn user_state_code(state: UserState) -> u8 {
    match state {
        UserState::Speaking => 0,
        UserState::Listening => 1,
        UserState::Away => 2,
    }
}

impl HostView {
    pub(crate) fn new() -> Self {
        let (inactive, _) = watch::channel(false);
        Self {
            inactive,
            running_tools: AtomicU32::new(0),
            call_long_tools: AtomicU32::new(0),
            settled: Notify::new(),
            switched: Notify::new(),
            agent_state: AtomicU8::new(agent_state_code(AgentState::Initializing)),
            user_state: AtomicU8::new(user_state_code(UserState::Listening)),
            inputs: Mutex::new(InputLedger::default()),
            closing: AtomicBool::new(false),
            turns: AtomicU32::new(0),
            agent: Mutex::new(None),
        }
    }

    /// The ledger of the host inputs applied, for the session actor to change or read.
    pub(crate) fn inputs(&self) -> std::sync::MutexGuard<'_, InputLedger> {
        // A plain value changed whole under the lock: a panic elsewhere cannot leave it
        // half-written.
        self.inputs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The last id up to which every host input applied with an id is in the session.
    pub(crate) fn last_input(&self) -> Option<u64> {
        self.inputs().last_input()
    }

    /// How many tool runs are alive in the session now, call-long ones included.
    pub(crate) fn running_tools(&self) -> usize {
        let runs = self.running_tools.load(Ordering::Acquire) as usize;
        runs + self.call_long_tools.load(Ordering::Acquire) as usize
    }

    /// The session began to close (by `close()` or the drop of its last host handle).
    pub(crate) fn mark_closing(&self) {
        self.closing.store(true, Ordering::Release);
    }

    /// Whether the session began to close.
    pub(crate) fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// The session started a turn that asks the model.
    pub(crate) fn turn_started(&self) {
        self.turns.fetch_add(1, Ordering::Relaxed);
    }

    /// How many turns that ask the model the session started.
    pub(crate) fn turns(&self) -> u32 {
        self.turns.load(Ordering::Relaxed)
    }

    /// Publishes the current agent (the session calls it when the agent changed).
    pub(crate) fn publish_agent(&self, agent: &Agent) {
        *self.agent.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::from(agent.name()));
    }

    /// The name of the current agent as last published.
    pub(crate) fn agent_name(&self) -> Option<String> {
        self.agent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_deref()
            .map(str::to_owned)
    }

    /// A tool run of the session started (`call_long`: of a call-long tool, which does
    /// not hold settling).
    pub(crate) fn tool_run_started(&self, call_long: bool) {
        if call_long {
            self.call_long_tools.fetch_add(1, Ordering::AcqRel);
        } else {
            self.running_tools.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// A tool run of the session stopped; the last one that holds settling settles an
    /// inactive session.
    pub(crate) fn tool_run_ended(&self, call_long: bool) {
        if call_long {
            let _ = self
                .call_long_tools
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
            return;
        }
        let before = self
            .running_tools
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .unwrap_or(0);
        // Read after the count: whichever of this and `publish_inactive` comes second sees
        // both halves and notifies (the watch's lock orders the two).
        if before == 1 && *self.inactive.borrow() {
            self.settled.notify_waiters();
        }
    }

    /// Publishes whether the session is inactive (watchers hear of changes only), and
    /// settles it if it just became inactive with no tool run alive. The session publishes
    /// at every pump; an inactive session that stays so has already settled, or settles
    /// when its last run ends (`tool_run_ended`).
    pub(crate) fn publish_inactive(&self, inactive: bool) {
        let became_inactive = self.inactive.send_if_modified(|v| {
            let changed = *v != inactive;
            *v = inactive;
            changed
        }) && inactive;
        if became_inactive && self.running_tools.load(Ordering::Acquire) == 0 {
            self.settled.notify_waiters();
        }
    }

    /// Whether the session is settled: inactive, and no tool run alive but call-long ones.
    pub(crate) fn is_settled(&self) -> bool {
        self.running_tools.load(Ordering::Acquire) == 0 && *self.inactive.borrow()
    }

    /// Resolves at the next time the session settles; create it before checking
    /// [`Self::is_settled`], so that a settle in between is not missed.
    pub(crate) fn settled(&self) -> tokio::sync::futures::Notified<'_> {
        self.settled.notified()
    }

    /// Sets what the agent does; subscribers hear of a change.
    pub(crate) fn set_agent_state(&self, events: &Events, agent: &str, state: AgentState) {
        let code = agent_state_code(state);
        if self.agent_state.swap(code, Ordering::Relaxed) != code {
            events.emit_with(|| SessionEvent::AgentStateChanged {
                agent: agent.to_owned(),
                state,
            });
        }
    }

    /// What the agent does now.
    pub(crate) fn agent_state(&self) -> AgentState {
        match self.agent_state.load(Ordering::Relaxed) {
            0 => AgentState::Initializing,
            1 => AgentState::Listening,
            2 => AgentState::Thinking,
            _ => AgentState::Speaking,
        }
    }

    /// Publishes what the user does (the session's schedule owns it); subscribers hear of
    /// a change.
    pub(crate) fn publish_user_state(&self, events: &Events, state: UserState) {
        let code = user_state_code(state);
        if self.user_state.swap(code, Ordering::Relaxed) != code {
            events.emit(SessionEvent::UserStateChanged { state });
        }
    }

    /// What the user does now.
    pub(crate) fn user_state(&self) -> UserState {
        match self.user_state.load(Ordering::Relaxed) {
            0 => UserState::Speaking,
            1 => UserState::Listening,
            _ => UserState::Away,
        }
    }
}
