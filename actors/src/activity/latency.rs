//! A turn's clock: from when it was asked for (the end of the user's speech, or the host's
//! call) to its first text out, its first request's time to first token, and the time it
//! waited for its tools. A plain type the turn carries; the activation feeds it the
//! moments as they happen and reads [`TurnTimer::latency`] when the turn ends.

use std::time::Duration;

use tokio::time::Instant;

use crate::latency::TurnLatency;

/// The moments of one turn (see the module docs).
#[derive(Debug)]
pub(crate) struct TurnTimer {
    asked: Instant,
    /// The turn's kind, for the telemetry's attribute.
    pub(crate) kind: &'static str,
    first_audio: Option<Duration>,
    ttft: Option<Duration>,
    requests: u32,
    tools: Duration,
    calling_since: Option<Instant>,
    preemptive: bool,
}

impl TurnTimer {
    /// A turn asked for at `asked`.
    pub(crate) fn new(asked: Instant, kind: &'static str) -> Self {
        Self {
            asked,
            kind,
            first_audio: None,
            ttft: None,
            requests: 0,
            tools: Duration::ZERO,
            calling_since: None,
            preemptive: false,
        }
    }

    /// The turn handed text to the output at `now`: its end-to-end latency, the first time.
    pub(crate) fn text_out(&mut self, now: Instant) -> Option<Duration> {
        if self.first_audio.is_some() {
            return None;
        }
        let latency = now.saturating_duration_since(self.asked);
        self.first_audio = Some(latency);
        Some(latency)
    }

    /// One of its LLM requests ended, its first chunk `ttft` after it began (none: no
    /// chunk came); the first request's is the turn's.
    pub(crate) fn request_ended(&mut self, ttft: Option<Duration>) {
        if self.requests == 0 {
            self.ttft = ttft;
        }
        self.requests = self.requests.saturating_add(1);
    }

    /// Its first request was a preemptive one.
    pub(crate) fn adopted_preemptive(&mut self) {
        self.preemptive = true;
    }

    /// It began waiting for its tools' outputs.
    pub(crate) fn calling(&mut self, now: Instant) {
        self.calling_since.get_or_insert(now);
    }

    /// Its tools' outputs are in.
    pub(crate) fn called(&mut self, now: Instant) {
        if let Some(since) = self.calling_since.take() {
            self.tools += now.saturating_duration_since(since);
        }
    }

    /// Whether it asked the model (a `say` does not).
    pub(crate) fn asked_the_model(&self) -> bool {
        self.requests > 0
    }

    /// The turn's latency, as it ends (a wait for tools still open ends now: the clock
    /// is read only then).
    pub(crate) fn latency(&mut self, now: impl FnOnce() -> Instant) -> TurnLatency {
        if self.calling_since.is_some() {
            self.called(now());
        }
        TurnLatency {
            end_to_first_audio: self.first_audio,
            time_to_first_token: self.ttft,
            tools: self.tools,
            preemptive: self.preemptive,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_tool_turn_counts_from_the_ask_to_the_first_text_and_sums_its_tool_waits() {
        let t0 = Instant::now();
        let mut t = TurnTimer::new(t0, "user");
        t.request_ended(Some(ms(200)));
        t.calling(t0 + ms(200));
        t.called(t0 + ms(1700));
        t.request_ended(Some(ms(300)));
        assert_eq!(t.text_out(t0 + ms(2000)), Some(ms(2000)));
        assert_eq!(
            t.text_out(t0 + ms(2500)),
            None,
            "only the first text counts"
        );
        let latency = t.latency(|| t0 + ms(3000));
        assert_eq!(latency.end_to_first_audio, Some(ms(2000)));
        assert_eq!(
            latency.time_to_first_token,
            Some(ms(200)),
            "the first request's"
        );
        assert_eq!(latency.tools, ms(1500));
        assert!(!latency.preemptive);
        assert!(t.asked_the_model());
    }

    #[test]
    fn a_wait_for_tools_still_open_at_the_end_counts_to_the_end() {
        let t0 = Instant::now();
        let mut t = TurnTimer::new(t0, "user");
        t.calling(t0);
        assert_eq!(t.latency(|| t0 + ms(400)).tools, ms(400));
        assert!(!t.asked_the_model());
    }
}
