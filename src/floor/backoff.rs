//! Retry pacing: jittered exponential backoff, and a sleep that a cancellation cuts short.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// Jittered exponential backoff: each delay is drawn from the upper half of `base·2ⁿ`, capped.
#[derive(Clone, Debug)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    attempt: u32,
}

impl Backoff {
    pub fn new(base: Duration, cap: Duration) -> Self {
        Backoff {
            base,
            cap,
            attempt: 0,
        }
    }

    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    pub fn next_delay(&mut self) -> Duration {
        let exp = self
            .base
            .saturating_mul(1u32.checked_shl(self.attempt.min(20)).unwrap_or(u32::MAX))
            .min(self.cap);
        self.attempt = self.attempt.saturating_add(1);
        let ms = exp.as_millis().max(1) as u64;
        Duration::from_millis(rand::random_range(ms / 2..=ms))
    }
}

/// Sleeps `d` unless `cancel` fires first; false when cancelled.
pub async fn sleep_or_cancel(d: Duration, cancel: &CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => true,
        _ = cancel.cancelled() => false,
    }
}
