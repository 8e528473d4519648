//! What a toolset does when the model calls a tool while an earlier call of it still runs:
//! a plain decision the toolset carries out.
//!
//! Rules, each with a unit test below:
//! - Only calls of the same tool, started in an earlier LLM step and not already stopping,
//!   are duplicates: calls of one step never are (`get_weather(Paris)` and
//!   `get_weather(London)` side by side both run).
//! - With no duplicate, the call runs, whatever the policy.
//! - `allow` runs it; `reject` answers the model, naming the running calls; `confirm`
//!   answers asking for confirmation unless the call carries `confirm_duplicate: true`,
//!   then runs it; `replace` stops the running calls (awaited), then runs it.

use crate::tool::DuplicatePolicy;

/// What to do with a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OnDuplicate {
    /// Run it.
    Run,
    /// Stop the running calls, then run it.
    Replace,
    /// Answer the model that the tool is already running (`duplicate_reject` text).
    Reject,
    /// Ask the model to confirm (`duplicate_confirm` text).
    AskToConfirm,
}

/// A running call as the duplicate check sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Running<'a> {
    pub(crate) tool: &'a str,
    pub(crate) step: u64,
    /// Already stopping (cancelled, replaced, its scope pausing).
    pub(crate) stopping: bool,
}

/// Whether `running` is a duplicate of a call of `tool` made in step `step`.
pub(crate) fn is_duplicate(running: Running<'_>, tool: &str, step: u64) -> bool {
    !running.stopping && running.tool == tool && running.step != step
}

/// What the call does, given whether duplicates run and whether it confirmed.
pub(crate) fn on_duplicate(
    policy: DuplicatePolicy,
    duplicates_run: bool,
    confirmed: bool,
) -> OnDuplicate {
    if !duplicates_run {
        return OnDuplicate::Run;
    }
    match policy {
        DuplicatePolicy::Allow => OnDuplicate::Run,
        DuplicatePolicy::Reject => OnDuplicate::Reject,
        DuplicatePolicy::Confirm if confirmed => OnDuplicate::Run,
        DuplicatePolicy::Confirm => OnDuplicate::AskToConfirm,
        DuplicatePolicy::Replace => OnDuplicate::Replace,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [DuplicatePolicy; 4] = [
        DuplicatePolicy::Allow,
        DuplicatePolicy::Reject,
        DuplicatePolicy::Confirm,
        DuplicatePolicy::Replace,
    ];

    #[test]
    fn only_an_earlier_steps_live_call_of_the_same_tool_is_a_duplicate() {
        let running = Running {
            tool: "weather",
            step: 1,
            stopping: false,
        };
        assert!(is_duplicate(running, "weather", 2));
        assert!(!is_duplicate(running, "weather", 1), "same step");
        assert!(!is_duplicate(running, "booking", 2), "another tool");
        let stopping = Running {
            stopping: true,
            ..running
        };
        assert!(!is_duplicate(stopping, "weather", 2), "already stopping");
    }

    #[test]
    fn without_a_duplicate_every_policy_runs_the_call() {
        for policy in ALL {
            assert_eq!(on_duplicate(policy, false, false), OnDuplicate::Run);
        }
    }

    #[test]
    fn each_policy_decides_a_duplicate() {
        assert_eq!(
            on_duplicate(DuplicatePolicy::Allow, true, false),
            OnDuplicate::Run
        );
        assert_eq!(
            on_duplicate(DuplicatePolicy::Reject, true, true),
            OnDuplicate::Reject,
            "confirming does not override reject"
        );
        assert_eq!(
            on_duplicate(DuplicatePolicy::Confirm, true, false),
            OnDuplicate::AskToConfirm
        );
        assert_eq!(
            on_duplicate(DuplicatePolicy::Confirm, true, true),
            OnDuplicate::Run
        );
        assert_eq!(
            on_duplicate(DuplicatePolicy::Replace, true, false),
            OnDuplicate::Replace
        );
    }
}
