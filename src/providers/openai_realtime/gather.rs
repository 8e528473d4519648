//! When the socket may let the server's events gather before it reads them.
//!
//! The service streams a response's audio faster than it plays, one WebSocket message per
//! ~20 ms piece, each arriving on its own: read as they come, every piece costs the
//! reading thread a wake-up (the kernel switching it in, a read), which is most of the
//! client's CPU per piece. While the audio already received is well ahead of what can
//! have been played, nothing is gained by reading the next piece at once: the socket asks
//! the kernel to wake it only once [`GATHER_BYTES`] have arrived, or at a deadline, so one
//! wake-up reads many pieces. The deadline keeps a margin of audio that has arrived and is
//! not yet played ([`MARGIN`]), and is never more than [`MAX_WAIT`] away, so what follows
//! the audio (the user's barge-in, a tool call, the response's end) comes at most that
//! much later. Outside a response's audio, events are read as they arrive.
//!
//! A pure decision over the response's audio and the clock; the socket carries it out.

use std::time::Duration;

use tokio::time::Instant;

use crate::realtime::ServerEvent;

/// How much the socket lets gather before the kernel wakes it: ~23 pieces of 20 ms PCM16
/// at 24 kHz in their JSON and base64. A quarter of the kernel's default receive buffer
/// (128 KiB): the kernel counts each small segment at about twice its payload, and a mark
/// the buffer cannot hold is never reached (the sender stalls on a closed window and every
/// gathering waits out its deadline).
pub(super) const GATHER_BYTES: usize = 32 * 1024;

/// The longest the socket lets events wait in the kernel.
pub(super) const MAX_WAIT: Duration = Duration::from_millis(5);

/// The audio that must stay received and unplayed when the gathered events are read.
pub(super) const MARGIN: Duration = Duration::from_millis(100);

/// The current response's audio as the socket has read it.
#[derive(Debug)]
pub(super) struct Gathering {
    /// The output format's bytes per millisecond.
    bytes_per_ms: u64,
    /// The current response's audio: when its first piece was read, and how many bytes
    /// have been; `None` outside a response's audio.
    audio: Option<(Instant, u64)>,
}

impl Gathering {
    /// For audio of `bytes_per_ms` (48 for PCM16 at 24 kHz).
    pub(super) fn new(bytes_per_ms: u32) -> Self {
        Self {
            bytes_per_ms: u64::from(bytes_per_ms.max(1)),
            audio: None,
        }
    }

    /// An event was read; `now` tells when (asked only of a response's first audio).
    pub(super) fn on_event(&mut self, event: &ServerEvent, now: impl FnOnce() -> Instant) {
        match event {
            ServerEvent::AudioDelta { audio, .. } => {
                let (_, bytes) = self.audio.get_or_insert_with(|| (now(), 0));
                *bytes += audio.len() as u64;
            }
            // A new response, or the end of this one, or the user speaking: what comes
            // next is read at once.
            ServerEvent::ResponseCreated { .. }
            | ServerEvent::ResponseDone { .. }
            | ServerEvent::SpeechStarted { .. } => self.audio = None,
            _ => {}
        }
    }

    /// Until when, at `now` with nothing left to read, the events may gather; `None`:
    /// read the next one as it comes. Playback is taken to have started with the first
    /// piece read, which is the earliest it can have.
    pub(super) fn until(&self, now: Instant) -> Option<Instant> {
        let (first, bytes) = self.audio?;
        let received = Duration::from_millis(bytes / self.bytes_per_ms);
        let played = now.saturating_duration_since(first);
        let slack = received.checked_sub(played)?.checked_sub(MARGIN)?;
        (slack >= Duration::from_millis(1)).then(|| now + slack.min(MAX_WAIT))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::realtime::ResponseStatus;

    fn audio(ms: usize) -> ServerEvent {
        ServerEvent::AudioDelta {
            item_id: "item".to_owned(),
            audio: vec![0; ms * 48],
        }
    }

    #[test]
    fn events_are_read_as_they_come_until_the_audio_is_ahead_by_the_margin() {
        let t0 = Instant::now();
        let mut gathering = Gathering::new(48);
        assert_eq!(gathering.until(t0), None, "no audio yet");
        for _ in 0..5 {
            gathering.on_event(&audio(20), || t0);
        }
        assert_eq!(
            gathering.until(t0),
            None,
            "100 ms received: no more than the margin"
        );
        gathering.on_event(&audio(20), || t0);
        assert_eq!(gathering.until(t0), Some(t0 + Duration::from_millis(5)));
    }

    #[test]
    fn the_wait_keeps_the_margin_of_audio_not_yet_played() {
        let t0 = Instant::now();
        let mut gathering = Gathering::new(48);
        for _ in 0..10 {
            gathering.on_event(&audio(20), || t0);
        }
        // 200 ms received; 97 ms can have played: 3 ms over the margin.
        let now = t0 + Duration::from_millis(97);
        assert_eq!(gathering.until(now), Some(now + Duration::from_millis(3)));
        let now = t0 + Duration::from_millis(100);
        assert_eq!(gathering.until(now), None, "only the margin is left");
        let now = t0 + Duration::from_secs(1);
        assert_eq!(gathering.until(now), None, "it could all have played");
    }

    #[test]
    fn a_new_response_its_end_or_the_user_speaking_is_read_at_once() {
        let t0 = Instant::now();
        let ends = [
            ServerEvent::ResponseCreated {
                response_id: "r2".to_owned(),
                tag: None,
            },
            ServerEvent::ResponseDone {
                response_id: "r1".to_owned(),
                status: ResponseStatus::Completed,
                usage: None,
            },
            ServerEvent::SpeechStarted {
                item_id: "u1".to_owned(),
            },
        ];
        for end in ends {
            let mut gathering = Gathering::new(48);
            for _ in 0..20 {
                gathering.on_event(&audio(20), || t0);
            }
            assert!(gathering.until(t0).is_some());
            gathering.on_event(&end, || t0);
            assert_eq!(gathering.until(t0), None, "after {end:?}");
        }
    }

    #[test]
    fn the_format_sets_how_much_audio_a_byte_is() {
        let t0 = Instant::now();
        let mut gathering = Gathering::new(8);
        gathering.on_event(
            &ServerEvent::AudioDelta {
                item_id: "item".to_owned(),
                audio: vec![0; 8 * 120],
            },
            || t0,
        );
        assert_eq!(gathering.until(t0), Some(t0 + Duration::from_millis(5)));
    }
}
