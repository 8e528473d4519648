//! The engine's stall monitor: reports an arbiter that ran nothing else for longer than a
//! threshold — a tool body computing without awaiting, a blocking call in a hook — which
//! holds every session of that arbiter: their turns, timers and tools wait until it lets go.
//!
//! Off by default, since it is work a host did not ask for (a timer on every arbiter, a
//! thread of its own); [`Engine::monitor_stalls`](crate::Engine::monitor_stalls) turns it
//! on. Each arbiter then runs a beat task that writes the time into its
//! [`ArbiterBeat`](crate::heartbeat) every quarter threshold; a watchdog thread reads
//! the beats at the same pace and decides, with a [`StallWatch`] per arbiter, when one
//! stalled and when it ended. Nothing is counted per message or per turn: the hot path
//! pays nothing (measured in BENCHMARKS.md), bar two relaxed stores per poll of a tool
//! body while the monitor is on, which name the tool a stall happened in.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use actix::prelude::*;
use tokio::sync::broadcast;

use crate::error::EngineError;
use crate::heartbeat::{ArbiterBeat, StalledTool};

/// How many reports a slow reader of [`StallReports`] may fall behind before it misses
/// some (the counts in `EngineStats` miss none).
const REPORTS: usize = 64;

/// The shortest threshold the monitor takes: below it the beat (a timer every quarter
/// threshold on every arbiter) would cost more than the stalls it finds.
pub(crate) const MIN_THRESHOLD: Duration = Duration::from_millis(4);

/// An arbiter that ran nothing else for longer than the monitor's threshold, from
/// [`StallReports::next`].
///
/// Each stall is reported twice: once when the monitor sees it (`ended == false`,
/// `stalled_for` the time so far: at least the threshold), and once when the arbiter runs
/// again (`ended == true`, `stalled_for` the whole stall). Durations are measured from the
/// arbiter's last beat before the stall, so they may be up to a quarter threshold long.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ArbiterStall {
    /// The arbiter that stalled (0 to `Engine::arbiters() - 1`): every session placed on
    /// it waited.
    pub arbiter: usize,
    /// How long it has run nothing else.
    pub stalled_for: Duration,
    /// Whether the stall is over.
    pub ended: bool,
    /// The tool body the arbiter was polling when the stall was seen: the session and
    /// call that hold it. `None` when it was other code (a hook, a model adapter).
    pub tool: Option<StalledTool>,
}

/// The stall reports of an engine, from
/// [`Engine::monitor_stalls`](crate::Engine::monitor_stalls).
#[derive(Debug)]
pub struct StallReports {
    reports: broadcast::Receiver<ArbiterStall>,
}

impl StallReports {
    /// The next stall report; `None` once the engine is gone. A reader that fell more
    /// than 64 reports behind skips to the oldest one still kept (the counts in
    /// [`EngineStats`](crate::EngineStats) keep every stall).
    pub async fn next(&mut self) -> Option<ArbiterStall> {
        loop {
            match self.reports.recv().await {
                Ok(report) => return Some(report),
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::debug!(missed, "stall reports missed by a slow reader");
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }
}

/// What a [`StallWatch`] saw at a check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Seen {
    /// Nothing new: running, or still stalled.
    Nothing,
    /// The arbiter has not beaten for longer than the threshold: a stall began.
    Began { stalled_for: Duration },
    /// It beat again after a stall that lasted this long.
    Ended { stalled_for: Duration },
}

/// Whether one arbiter is stalled, from its beats: a plain type the watchdog carries out.
#[derive(Debug)]
pub(crate) struct StallWatch {
    threshold: Duration,
    /// The last beat before the stall under way, if one is.
    stalled_since: Option<Duration>,
}

impl StallWatch {
    pub(crate) fn new(threshold: Duration) -> Self {
        Self {
            threshold,
            stalled_since: None,
        }
    }

    /// A check at `now`, the arbiter's last beat at `last` (both on the monitor's clock).
    pub(crate) fn check(&mut self, last: Duration, now: Duration) -> Seen {
        match self.stalled_since {
            None => {
                let quiet = now.saturating_sub(last);
                if quiet > self.threshold {
                    self.stalled_since = Some(last);
                    Seen::Began { stalled_for: quiet }
                } else {
                    Seen::Nothing
                }
            }
            // The first beat after the stall runs as soon as the arbiter is free: its
            // time is the stall's end.
            Some(since) if last > since => {
                self.stalled_since = None;
                Seen::Ended {
                    stalled_for: last - since,
                }
            }
            Some(_) => Seen::Nothing,
        }
    }
}

/// The counts the monitor keeps for `EngineStats`.
#[derive(Debug, Default)]
struct Counts {
    stalls: AtomicU64,
    /// In microseconds.
    longest: AtomicU64,
    stalled_now: AtomicU64,
}

/// An engine's running stall monitor: stops its beat tasks and its watchdog thread when
/// dropped (with the engine).
#[derive(Debug)]
pub(crate) struct StallMonitor {
    threshold: Duration,
    reports: broadcast::Sender<ArbiterStall>,
    counts: Arc<Counts>,
    /// Read by each beat task before it beats again: set, it ends.
    stopped: Arc<AtomicBool>,
    /// Dropped to stop the watchdog thread at once (it waits on this channel between
    /// checks).
    _stop_watchdog: mpsc::Sender<()>,
}

impl StallMonitor {
    /// Starts a beat task on each of `arbiters` and the watchdog thread.
    pub(crate) fn start(
        arbiters: &[ArbiterHandle],
        threshold: Duration,
    ) -> Result<Self, EngineError> {
        let threshold = threshold.max(MIN_THRESHOLD);
        let every = threshold / 4;
        let epoch = Instant::now();
        let stopped = Arc::new(AtomicBool::new(false));
        let beats: Vec<Arc<ArbiterBeat>> =
            arbiters.iter().map(|_| ArbiterBeat::new(epoch)).collect();
        for (arbiter, beat) in arbiters.iter().zip(&beats) {
            let (beat, stopped) = (beat.clone(), stopped.clone());
            // A stopped arbiter takes no task; it has no sessions to stall either.
            let _ = arbiter.spawn(async move {
                beat.install();
                while !stopped.load(Ordering::Relaxed) {
                    beat.beat();
                    tokio::time::sleep(every).await;
                }
                beat.uninstall();
            });
        }
        let (reports, _) = broadcast::channel(REPORTS);
        let counts = Arc::new(Counts::default());
        let (stop_watchdog, stop) = mpsc::channel();
        let watchdog = Watchdog {
            epoch,
            every,
            beats,
            watches: arbiters
                .iter()
                .map(|_| StallWatch::new(threshold))
                .collect(),
            culprits: vec![None; arbiters.len()],
            reports: reports.clone(),
            counts: counts.clone(),
        };
        std::thread::Builder::new()
            .name("switchboard-stalls".into())
            .spawn(move || watchdog.run(&stop))
            .map_err(EngineError::Spawn)?;
        Ok(Self {
            threshold,
            reports,
            counts,
            stopped,
            _stop_watchdog: stop_watchdog,
        })
    }

    /// The threshold the monitor runs with.
    pub(crate) fn threshold(&self) -> Duration {
        self.threshold
    }

    /// A new reader of the reports from now on.
    pub(crate) fn subscribe(&self) -> StallReports {
        StallReports {
            reports: self.reports.subscribe(),
        }
    }

    /// Stalls seen so far, the longest that ended, and how many arbiters are stalled now.
    pub(crate) fn counts(&self) -> (u64, Duration, usize) {
        (
            self.counts.stalls.load(Ordering::Relaxed),
            Duration::from_micros(self.counts.longest.load(Ordering::Relaxed)),
            usize::try_from(self.counts.stalled_now.load(Ordering::Relaxed)).unwrap_or(0),
        )
    }
}

impl Drop for StallMonitor {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::Relaxed);
    }
}

/// The watchdog thread's state.
struct Watchdog {
    epoch: Instant,
    every: Duration,
    beats: Vec<Arc<ArbiterBeat>>,
    watches: Vec<StallWatch>,
    /// The tool seen in each stall under way, reported again at its end.
    culprits: Vec<Option<StalledTool>>,
    reports: broadcast::Sender<ArbiterStall>,
    counts: Arc<Counts>,
}

impl Watchdog {
    fn run(mut self, stop: &mpsc::Receiver<()>) {
        // Nothing is ever sent: the channel closes when the monitor is dropped.
        while let Err(mpsc::RecvTimeoutError::Timeout) = stop.recv_timeout(self.every) {
            self.check();
        }
    }

    fn check(&mut self) {
        let now = self.epoch.elapsed();
        for arbiter in 0..self.beats.len() {
            let beat = &self.beats[arbiter];
            let report = match self.watches[arbiter].check(beat.last(), now) {
                Seen::Nothing => continue,
                Seen::Began { stalled_for } => {
                    let tool = beat.running_tool();
                    self.culprits[arbiter] = tool.clone();
                    self.counts.stalls.fetch_add(1, Ordering::Relaxed);
                    self.counts.stalled_now.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        arbiter,
                        ?stalled_for,
                        ?tool,
                        "an arbiter is stalled: its sessions wait"
                    );
                    ArbiterStall {
                        arbiter,
                        stalled_for,
                        ended: false,
                        tool,
                    }
                }
                Seen::Ended { stalled_for } => {
                    let tool = self.culprits[arbiter].take();
                    self.counts.stalled_now.fetch_sub(1, Ordering::Relaxed);
                    let micros = u64::try_from(stalled_for.as_micros()).unwrap_or(u64::MAX);
                    self.counts.longest.fetch_max(micros, Ordering::Relaxed);
                    tracing::warn!(arbiter, ?stalled_for, ?tool, "an arbiter's stall ended");
                    ArbiterStall {
                        arbiter,
                        stalled_for,
                        ended: true,
                        tool,
                    }
                }
            };
            // No reader is fine: the counts keep the stall.
            let _ = self.reports.send(report);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn an_arbiter_that_beats_in_time_is_not_stalled() {
        let mut watch = StallWatch::new(100 * MS);
        assert_eq!(watch.check(Duration::ZERO, 25 * MS), Seen::Nothing);
        assert_eq!(watch.check(25 * MS, 125 * MS), Seen::Nothing);
        assert_eq!(watch.check(100 * MS, 150 * MS), Seen::Nothing);
    }

    #[test]
    fn a_beat_older_than_the_threshold_begins_a_stall_once() {
        let mut watch = StallWatch::new(100 * MS);
        assert_eq!(
            watch.check(10 * MS, 111 * MS),
            Seen::Began {
                stalled_for: 101 * MS
            }
        );
        assert_eq!(watch.check(10 * MS, 500 * MS), Seen::Nothing);
        assert_eq!(watch.check(10 * MS, 900 * MS), Seen::Nothing);
    }

    #[test]
    fn the_next_beat_ends_the_stall_with_its_whole_length() {
        let mut watch = StallWatch::new(100 * MS);
        assert!(matches!(watch.check(10 * MS, 200 * MS), Seen::Began { .. }));
        assert_eq!(
            watch.check(2_010 * MS, 2_020 * MS),
            Seen::Ended {
                stalled_for: 2_000 * MS
            }
        );
        // Running again: a later stall is a new one.
        assert_eq!(watch.check(2_030 * MS, 2_040 * MS), Seen::Nothing);
        assert!(matches!(
            watch.check(2_030 * MS, 2_200 * MS),
            Seen::Began { .. }
        ));
    }

    #[test]
    fn a_beat_from_before_the_check_is_not_a_stall() {
        // The watchdog read the clock before the beat landed: `last` after `now`.
        let mut watch = StallWatch::new(100 * MS);
        assert_eq!(watch.check(50 * MS, 40 * MS), Seen::Nothing);
    }
}
