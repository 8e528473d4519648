//! `Status`: what a worker process says about itself — its health, its readiness and its
//! metrics — as a plain value and the texts its endpoints answer with, so each rule is a
//! unit test.

use std::fmt::Write as _;

use switchboard::EngineStats;

use crate::protocol::WorkerInfo;

/// A worker process at one moment: its counts, its connection to NATS, its engine.
#[derive(Clone, Debug)]
pub(crate) struct Status {
    pub(crate) info: WorkerInfo,
    /// Whether the connection to NATS is up now.
    pub(crate) connected: bool,
    /// How many times the connection was made (1 after the first).
    pub(crate) connections: u64,
    pub(crate) engine: EngineStats,
}

impl Status {
    /// Free slots: sessions it may still take.
    pub(crate) fn free_slots(&self) -> usize {
        self.info.capacity.saturating_sub(self.info.live)
    }

    /// Ready to take sessions: connected and not draining. (A full worker is ready: it
    /// takes the next session when one ends, and a probe that took it out would change
    /// nothing, as nothing is routed to it over HTTP.)
    pub(crate) fn ready(&self) -> bool {
        self.connected && !self.info.draining
    }

    /// The body of `/healthz` and `/readyz`: the facts a probe or a person checks.
    pub(crate) fn json(&self) -> String {
        serde_json::json!({
            "worker": self.info.name,
            "ready": self.ready(),
            "connected": self.connected,
            "draining": self.info.draining,
            "capacity": self.info.capacity,
            "live": self.info.live,
            "free_slots": self.free_slots(),
        })
        .to_string()
    }

    /// `/metrics`: Prometheus's text format (version 0.0.4), every series labelled with
    /// the worker's name.
    pub(crate) fn metrics(&self) -> String {
        let info = &self.info;
        let engine = &self.engine;
        let label = format!("worker=\"{}\"", escape(&info.name));
        let mut out = String::with_capacity(4096);
        let mut put = |name: &str, kind: &str, help: &str, value: f64| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            let _ = writeln!(out, "{name}{{{label}}} {value}");
        };
        let flag = |b: bool| if b { 1.0 } else { 0.0 };
        // Counts fit an f64 exactly up to 2^53.
        #[allow(clippy::cast_precision_loss)]
        let n = |v: u64| v as f64;
        #[allow(clippy::cast_precision_loss)]
        let z = |v: usize| v as f64;
        put(
            "switchboard_worker_capacity",
            "gauge",
            "Sessions the worker may hold at once.",
            z(info.capacity),
        );
        put(
            "switchboard_worker_sessions",
            "gauge",
            "Sessions the worker holds now.",
            z(info.live),
        );
        put(
            "switchboard_worker_free_slots",
            "gauge",
            "Sessions the worker may still take.",
            z(self.free_slots()),
        );
        put(
            "switchboard_worker_sessions_max",
            "gauge",
            "The most sessions the worker held at once.",
            z(info.max_live),
        );
        put(
            "switchboard_worker_draining",
            "gauge",
            "1 while the worker drains (takes no new session).",
            flag(info.draining),
        );
        put(
            "switchboard_worker_ready",
            "gauge",
            "1 while the worker is connected and not draining.",
            flag(self.ready()),
        );
        put(
            "switchboard_worker_jobs_pulled_total",
            "counter",
            "Jobs pulled from the jobs stream (starts and resumes).",
            n(info.jobs_pulled),
        );
        put("switchboard_worker_jobs_refused_total", "counter", "Jobs pulled that did not become a session (claimed elsewhere, nothing to resume, unreadable).", n(info.refused));
        put(
            "switchboard_worker_sessions_started_total",
            "counter",
            "Sessions started (new or resumed).",
            n(info.started),
        );
        put(
            "switchboard_worker_sessions_resumed_total",
            "counter",
            "Sessions resumed from their snapshots.",
            n(info.resumed),
        );
        put(
            "switchboard_worker_sessions_ended_total",
            "counter",
            "Sessions that ended on the worker.",
            n(info.ended),
        );
        put(
            "switchboard_worker_sessions_moved_total",
            "counter",
            "Sessions handed over to other workers by a drain.",
            n(info.moved),
        );
        put(
            "switchboard_worker_sessions_fenced_total",
            "counter",
            "Sessions stopped because another worker took them over.",
            n(info.fenced),
        );
        put(
            "switchboard_worker_inputs_applied_total",
            "counter",
            "Host inputs applied.",
            n(info.inputs_applied),
        );
        put(
            "switchboard_worker_inputs_repeated_total",
            "counter",
            "Retried inputs recognised and not applied again.",
            n(info.inputs_repeated),
        );
        put(
            "switchboard_worker_snapshot_writes_total",
            "counter",
            "Snapshot messages written to the store.",
            n(info.snapshot_writes),
        );
        put(
            "switchboard_worker_snapshot_write_failures_total",
            "counter",
            "Snapshot writes that did not land (refused, or the store unreachable).",
            n(info.snapshot_write_failures),
        );
        put(
            "switchboard_nats_connected",
            "gauge",
            "1 while the connection to NATS is up.",
            flag(self.connected),
        );
        put(
            "switchboard_nats_connections_total",
            "counter",
            "Times the connection to NATS was made (the first and each reconnection).",
            n(self.connections),
        );
        put(
            "switchboard_engine_sessions",
            "gauge",
            "Sessions live on the engine (a closing one counts).",
            z(engine.sessions),
        );
        put(
            "switchboard_engine_actors",
            "gauge",
            "Actors of those sessions.",
            z(engine.actors),
        );
        put(
            "switchboard_engine_backlog",
            "gauge",
            "Messages sent to those actors and not yet handled.",
            z(engine.backlog),
        );
        put(
            "switchboard_engine_tool_runs",
            "gauge",
            "Tool calls running.",
            z(engine.tool_runs),
        );
        put(
            "switchboard_engine_arbiter_stalls_total",
            "counter",
            "Stalls of the engine's threads seen by the stall monitor.",
            n(engine.arbiter_stalls),
        );
        if let Some(rss) = engine.rss_bytes {
            put(
                "process_resident_memory_bytes",
                "gauge",
                "Resident memory of the process.",
                n(rss),
            );
        }
        out
    }
}

/// A label value as Prometheus's text format writes it.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An idle engine's counts (the type has no constructor outside the engine).
    fn engine_stats() -> EngineStats {
        static STATS: std::sync::OnceLock<EngineStats> = std::sync::OnceLock::new();
        STATS
            .get_or_init(|| switchboard::Engine::with_arbiters(1).unwrap().stats())
            .clone()
    }

    fn status(live: usize, draining: bool, connected: bool) -> Status {
        Status {
            info: WorkerInfo {
                name: "w1".into(),
                capacity: 10,
                live,
                jobs_pulled: 5,
                inputs_applied: 12,
                snapshot_writes: 9,
                draining,
                ..WorkerInfo::default()
            },
            connected,
            connections: 1,
            engine: engine_stats(),
        }
    }

    #[test]
    fn ready_while_connected_and_not_draining() {
        assert!(status(3, false, true).ready());
        assert!(status(10, false, true).ready(), "a full worker is ready");
        assert!(!status(3, true, true).ready(), "a draining one is not");
        assert!(
            !status(3, false, false).ready(),
            "nor one cut off from NATS"
        );
    }

    #[test]
    fn the_status_says_what_a_probe_checks() {
        let json: serde_json::Value = serde_json::from_str(&status(3, true, true).json()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "worker": "w1", "ready": false, "connected": true, "draining": true,
                "capacity": 10, "live": 3, "free_slots": 7
            })
        );
    }

    /// Each series has its HELP and TYPE, counters end in `_total`, and every value
    /// parses.
    #[test]
    fn metrics_are_prometheus_text() {
        let text = status(3, false, true).metrics();
        let mut series = 0;
        let mut kind = "";
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, k) = rest.split_once(' ').unwrap();
                kind = if k == "counter" { "counter" } else { "gauge" };
                assert!(
                    (kind == "counter") == name.ends_with("_total"),
                    "{name} is a {k}"
                );
            } else if !line.starts_with("# HELP ") {
                let (name, value) = line.rsplit_once(' ').unwrap();
                assert!(name.ends_with("{worker=\"w1\"}"), "{line}");
                assert!(value.parse::<f64>().is_ok(), "{line}");
                assert!(!kind.is_empty());
                series += 1;
            }
        }
        assert!(series >= 20, "{text}");
        for expected in [
            "switchboard_worker_sessions{worker=\"w1\"} 3",
            "switchboard_worker_free_slots{worker=\"w1\"} 7",
            "switchboard_worker_jobs_pulled_total{worker=\"w1\"} 5",
            "switchboard_worker_inputs_applied_total{worker=\"w1\"} 12",
            "switchboard_worker_snapshot_writes_total{worker=\"w1\"} 9",
            "switchboard_nats_connected{worker=\"w1\"} 1",
        ] {
            assert!(
                text.lines().any(|l| l == expected),
                "no {expected:?} in\n{text}"
            );
        }
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
