//! The cluster's tests, against a real `nats-server` (authentication on, a free loopback
//! port, one per test) with workers as real processes of the crate's `sb-test-worker`
//! binary, which they kill, freeze and drain. One file per story; one test binary, so the
//! workspace links it once. The tests run one at a time (`common::one_at_a_time`).
// A test binary: its helpers (the harnesses, the proxy, the workers) panic on what they
// cannot do, as its tests do, and each story uses some of them.
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    unreachable_pub
)]

mod campaign;
mod common;
mod proxy;
#[path = "../test_agents.rs"]
mod test_agents;

mod a_front_runs_the_same_over_a_local_and_a_remote_session;
mod a_front_that_missed_the_close_s_answer_asks_again;

mod a_crashed_worker_s_sessions_go_on_elsewhere;
mod a_cut_off_owner_is_not_doubled;
mod a_deployed_worker_reports_its_health_and_drains_on_sigterm;
mod a_fault_campaign_loses_nothing;
mod a_five_second_outage_moves_no_session;
mod a_killed_owner_is_replaced_without_waiting_for_its_lease;
mod a_long_conversation_moves_and_closes_whole;
mod a_paused_worker_is_fenced;
mod a_remote_session_is_a_session;
mod a_speech_handle_interrupts_its_own_speech;
mod a_worker_cut_off_from_its_server_still_exits_on_sigterm;
mod an_abandoned_call_s_body_never_runs_twice;
mod an_abandoned_session_is_closed;
mod answered_inputs_are_not_applied_again;
mod dispatch_never_over_admits;
mod drain_moves_sessions;
mod every_input_kind_applies_once_across_kills;
mod figures;
mod idle_sessions_cost_the_control_plane_nothing;
mod inputs_apply_exactly_once;
mod losing_one_of_three_servers_loses_nothing;
mod secrets_stay_out_of_debug;
mod sessions_survive_a_server_restart;
mod who_may_connect;
