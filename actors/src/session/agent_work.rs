//! How much work the agents may start on their own between two user inputs: a model or
//! hook that keeps handing off or replying without a user must not run for ever.
//!
//! A reply a hook or tool queues (`SessionControl::generate_reply`) and a handoff a tool,
//! hook or turn asks for are work no user asked for. Each is bounded on its own (one turn,
//! `max_tool_steps`), but a chain of them is not: two agents whose `on_enter` asks for a
//! reply, and a model that always transfers, hand the call back and forth for ever —
//! 110,000 LLM requests in 2 s after one user message. So the session counts the work
//! agents start since the last user input and refuses it past a limit
//! (`SessionBuilder::max_agent_work`); the next user input lets them go on.
//!
//! What counts as user input (resets the count), decided here once for every caller: the
//! host asking for work — `run`, `generate_reply`, `update_agent` (and
//! `SessionAddress::send` of a `Handoff`), `run_task` — and a final transcript once it
//! makes a user turn. Not user input: `say` (a text the host has said as it is, which
//! starts no model request), the user starting or stopping to speak and interim
//! transcripts (noise would keep a runaway chain going), interrupts and playout reports.
//!
//! A plain type: the session asks it before it queues agent-started work and carries out
//! the answer (queue it, or refuse it with [`SessionError::AgentWorkLimit`] and, once per
//! user input, a [`SessionEvent::AgentWorkRefused`]).
//!
//! [`SessionError::AgentWorkLimit`]: crate::SessionError::AgentWorkLimit
//! [`SessionEvent::AgentWorkRefused`]: crate::SessionEvent::AgentWorkRefused

/// The count of agent-started work since the last user input, against its limit.
#[derive(Debug)]
pub(crate) struct AgentWorkBound {
    limit: u32,
    started: u32,
    /// A refusal was reported since the last user input: later ones are errors to their
    /// callers only, so a tool looping on a refused request cannot flood the host's events.
    reported: bool,
}

/// Whether a piece of agent-started work may go ahead.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Yes; it is counted.
    Go,
    /// No: the limit is reached. `report`: the first refusal since the last user input,
    /// to tell the host with an event.
    Refused { limit: u32, report: bool },
}

impl AgentWorkBound {
    /// A bound of `limit` pieces of work per user input.
    pub(crate) fn new(limit: u32) -> Self {
        Self {
            limit,
            started: 0,
            reported: false,
        }
    }

    /// The user (or the host for them) asked for work: the agents may start `limit` more.
    pub(crate) fn user_input(&mut self) {
        self.started = 0;
        self.reported = false;
    }

    /// May an agent start one more piece of work now? Counted when it may.
    pub(crate) fn admit(&mut self) -> Admission {
        if self.started < self.limit {
            self.started += 1;
            return Admission::Go;
        }
        let report = !std::mem::replace(&mut self.reported, true);
        Admission::Refused {
            limit: self.limit,
            report,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_goes_ahead_up_to_the_limit_then_is_refused() {
        let mut bound = AgentWorkBound::new(3);
        for _ in 0..3 {
            assert_eq!(bound.admit(), Admission::Go);
        }
        assert_eq!(
            bound.admit(),
            Admission::Refused {
                limit: 3,
                report: true
            }
        );
    }

    #[test]
    fn only_the_first_refusal_since_the_last_input_is_reported() {
        let mut bound = AgentWorkBound::new(1);
        assert_eq!(bound.admit(), Admission::Go);
        assert!(matches!(
            bound.admit(),
            Admission::Refused { report: true, .. }
        ));
        for _ in 0..10 {
            assert!(matches!(
                bound.admit(),
                Admission::Refused { report: false, .. }
            ));
        }
    }

    #[test]
    fn user_input_gives_the_agents_the_whole_limit_again_and_reports_again() {
        let mut bound = AgentWorkBound::new(2);
        assert_eq!(bound.admit(), Admission::Go);
        assert_eq!(bound.admit(), Admission::Go);
        assert!(matches!(bound.admit(), Admission::Refused { .. }));
        bound.user_input();
        assert_eq!(bound.admit(), Admission::Go);
        assert_eq!(bound.admit(), Admission::Go);
        assert_eq!(
            bound.admit(),
            Admission::Refused {
                limit: 2,
                report: true
            }
        );
    }

    #[test]
    fn input_before_the_limit_resets_the_count() {
        let mut bound = AgentWorkBound::new(2);
        assert_eq!(bound.admit(), Admission::Go);
        bound.user_input();
        assert_eq!(bound.admit(), Admission::Go);
        assert_eq!(bound.admit(), Admission::Go);
        assert!(matches!(bound.admit(), Admission::Refused { .. }));
    }

    #[test]
    fn a_limit_of_zero_refuses_all_agent_started_work() {
        let mut bound = AgentWorkBound::new(0);
        assert!(matches!(
            bound.admit(),
            Admission::Refused {
                limit: 0,
                report: true
            }
        ));
    }
}
