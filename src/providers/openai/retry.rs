//! When a failed request is tried again, and how long to wait before it.

use std::time::Duration;

/// Bounded retries of one LLM request, only while nothing of its answer was forwarded to
/// the engine (a retry after forwarded text would make the agent say it twice).
///
/// Retried: connection failures, the connect and first-chunk timeouts, HTTP 408, 409, 429
/// and 5xx, and a stream that broke off before its first chunk. Not retried: 400, 401,
/// 403, 404, a context that is too long, a malformed chunk. A `Retry-After` (or OpenAI's
/// `retry-after-ms`) answer is waited for instead of the backoff, unless it is longer than
/// [`RetryPolicy::max_retry_after`]: then the request fails at once with
/// [`LlmError::RateLimited`](crate::LlmError::RateLimited) and the provider's wait, so a
/// voice call never hangs on a provider that asked for minutes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt (default 2, as the official OpenAI clients).
    pub max_retries: u32,
    /// Wait before the first retry; doubled for each further one (default 500 ms).
    pub initial_backoff: Duration,
    /// The longest backoff (default 8 s).
    pub max_backoff: Duration,
    /// The longest `Retry-After` honoured (default 20 s).
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: 2,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(8),
            max_retry_after: Duration::from_secs(20),
        }
    }
}

impl RetryPolicy {
    /// No retries: every failure is returned at once.
    pub fn none() -> Self {
        Self {
            max_retries: 0,
            ..Self::default()
        }
    }

    /// How long to wait before retry number `retry` (1 for the first), given what the
    /// provider asked for; `None` when the request must not be retried.
    pub(super) fn delay(&self, retry: u32, retry_after: Option<Duration>) -> Option<Duration> {
        if retry > self.max_retries {
            return None;
        }
        match retry_after {
            Some(wait) if wait > self.max_retry_after => None,
            Some(wait) => Some(wait),
            None => {
                let doublings = retry.saturating_sub(1).min(16);
                Some(
                    self.initial_backoff
                        .saturating_mul(1 << doublings)
                        .min(self.max_backoff),
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap_and_stops_after_the_last_retry() {
        let policy = RetryPolicy {
            max_retries: 6,
            ..RetryPolicy::default()
        };
        let delays: Vec<_> = (1..=7).map(|n| policy.delay(n, None)).collect();
        let ms = |n| Some(Duration::from_millis(n));
        assert_eq!(
            delays,
            [
                ms(500),
                ms(1000),
                ms(2000),
                ms(4000),
                ms(8000),
                ms(8000),
                None
            ]
        );
    }

    #[test]
    fn retry_after_replaces_the_backoff_unless_it_is_too_long() {
        let policy = RetryPolicy::default();
        let wait = Duration::from_secs(3);
        assert_eq!(policy.delay(1, Some(wait)), Some(wait));
        assert_eq!(policy.delay(1, Some(Duration::from_secs(60))), None);
        assert_eq!(RetryPolicy::none().delay(1, None), None);
    }
}
