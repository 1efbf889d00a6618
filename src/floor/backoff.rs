//! Retry pacing: jittered exponential backoff, a sleep that a cancellation cuts short, and the
//! one reading of a server's `Retry-After`.
//!
//! The one backoff of podhost: the pod's reconnects and join retries, the model client's retries
//! and the Model Gate's re-sends all pace themselves with [`Backoff`], so that many clients
//! failing together spread their next attempts instead of arriving in step.

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
        Duration::from_millis(ms / 2 + jitter() % (ms - ms / 2 + 1))
    }
}

/// A fresh random number, for jitter only: `RandomState` is seeded from the system's random
/// source and varied per instance (the standard library's hash-flooding defence).
fn jitter() -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(0u8)
}

/// Sleeps `d` unless `cancel` fires first; false when cancelled.
pub async fn sleep_or_cancel(d: Duration, cancel: &CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => true,
        _ = cancel.cancelled() => false,
    }
}

/// A `Retry-After` value in seconds (at most a day); `None` for anything else — the HTTP-date
/// form is rare from the servers podhost calls, and ignored.
pub fn retry_after(value: &str) -> Option<Duration> {
    let secs: f64 = value.trim().parse().ok()?;
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(86_400.0)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn retry_after_reads_seconds_only() {
        let read: Vec<Option<Duration>> = [
            "3",
            " 1.5 ",
            "0",
            "999999",
            "-1",
            "NaN",
            "inf",
            "Wed, 21 Oct 2015 07:28:00 GMT",
            "",
        ]
        .into_iter()
        .map(retry_after)
        .collect();
        assert_eq!(
            read,
            [
                Some(Duration::from_secs(3)),
                Some(Duration::from_millis(1500)),
                Some(Duration::ZERO),
                Some(Duration::from_secs(86_400)),
                None,
                None,
                None,
                None,
                None,
            ]
        );
    }

    /// The jitter spreads: 200 first delays of 1 s fall on both sides of 750 ms and take many
    /// values (all the same with a constant jitter; a chance of 2^-199 otherwise).
    #[test]
    fn the_jitter_spreads_over_the_upper_half() {
        let delays: std::collections::BTreeSet<u128> = (0..200)
            .map(|_| {
                let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(1));
                b.next_delay().as_millis()
            })
            .collect();
        let (low, high) = (delays.first().unwrap(), delays.last().unwrap());
        assert!(*low >= 500 && *high <= 1000, "{low}..{high}");
        assert!(*low < 750 && *high > 750, "{delays:?}");
        assert!(delays.len() > 50, "{delays:?}");
    }

    #[test]
    fn delays_double_within_the_upper_half_up_to_the_cap_and_reset() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(700));
        for step in [100u64, 200, 400, 700, 700] {
            let d = b.next_delay();
            let range = Duration::from_millis(step / 2)..=Duration::from_millis(step);
            assert!(range.contains(&d), "{d:?} not in {range:?}");
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }
}
