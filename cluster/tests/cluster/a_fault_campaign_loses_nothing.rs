//! Everything that can go wrong, at random, while 50 sessions talk: three worker processes
//! on a real `nats-server` are killed (SIGKILL), frozen past their lease (SIGSTOP, then
//! SIGCONT), drained (SIGTERM), cut off from the server while alive (a proxy that stops
//! forwarding), and the server itself restarts. The fronts record what they sent and got,
//! the tools what they did; the checker (`campaign.rs`) finds every input applied once, no
//! answered input lost, each conversation continuous, and every side effect within its
//! tool's restore policy.
//!
//! The short run below is part of `cargo test` (seeded; about half a minute). The long one
//! runs ten minutes in release, its figures in RELIABILITY.md:
//!
//! ```text
//! CAMPAIGN_SECS=600 CAMPAIGN_SEED=34 cargo test --release -p switchboard-cluster-tests \
//!     --test cluster a_long_fault_campaign -- --ignored --nocapture
//! ```

use crate::campaign::{self, Plan};
use crate::common;

use std::time::Duration;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn campaign(seed: u64, faults_for: Duration) {
    let _one_at_a_time = common::one_at_a_time().await;
    let report = campaign::run(Plan {
        seed,
        sessions: 50,
        workers: 3,
        faults_for,
        lease_secs: 2,
        tool_ms: 300,
    })
    .await;
    println!("{}", report.table());
    assert!(
        report.faults.values().sum::<u64>() > 0,
        "no fault was drawn"
    );
    assert!(
        report.violations.is_empty(),
        "{} violations (seed {seed}):\n{}",
        report.violations.len(),
        report.violations.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_fault_campaign_loses_nothing() {
    campaign(env_or("CAMPAIGN_SEED", 34), Duration::from_secs(15)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "ten minutes of faults: run it in release, see the module docs"]
async fn a_long_fault_campaign() {
    let seed = env_or("CAMPAIGN_SEED", 34);
    let secs = env_or("CAMPAIGN_SECS", 600);
    campaign(seed, Duration::from_secs(secs)).await;
}
