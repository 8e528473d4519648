//! Realtime agents end to end against the scripted realtime model: the simulated OpenAI
//! Realtime server in memory, which refuses what the service refuses, under paused time.
//! The scenarios (`realtime_scenarios/`) also run over a loopback WebSocket with the real
//! provider (`realtime_over_a_websocket.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use switchboard::realtime::RealtimeModel;
use switchboard::testing::{RealtimeScript, ScriptedRealtime, SimReport};

mod common;
mod realtime_scenarios;
use realtime_scenarios as scenarios;

struct Scripted(ScriptedRealtime);

impl scenarios::Backend for Scripted {
    fn start(script: RealtimeScript) -> Self {
        Self(ScriptedRealtime::new(script))
    }

    fn model(&self) -> Arc<dyn RealtimeModel> {
        self.0.shared()
    }

    fn report(&self) -> SimReport {
        self.0.report()
    }
}

macro_rules! scenario {
    ($($name:ident),* $(,)?) => {$(
        #[switchboard::test]
        async fn $name() {
            tokio::time::pause();
            scenarios::$name::<Scripted>().await;
        }
    )*};
}

scenario!(
    a_tool_call,
    two_parallel_calls_get_one_response,
    an_async_tool_with_updates_during_speech,
    barge_in_mid_audio_truncates_at_the_heard_position,
    barge_in_at_zero_ms_deletes_the_item,
    a_handoff_on_the_same_socket,
    a_sub_task,
    a_dropped_socket_mid_response_is_replayed,
    a_late_tool_result_is_always_heard,
);
