//! Reconnect delays: capped exponential backoff with jitter.

use std::time::Duration;

use wuhu_core::SplitMix64;

/// Delay before the first reconnect attempt (before jitter).
pub const INITIAL_BACKOFF: Duration = Duration::from_millis(500);
/// Largest delay (before jitter).
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The delay before reconnect attempt `attempt` (0-based): the nominal delay
/// `min(MAX_BACKOFF, INITIAL_BACKOFF * 2^attempt)` scaled by a factor in `[0.5, 1]` chosen by
/// `unit` (a random number in `[0, 1)`; values outside are clamped). So the delay always lies in
/// `[nominal / 2, nominal]` and never exceeds [`MAX_BACKOFF`].
pub fn backoff_delay(attempt: u32, unit: f64) -> Duration {
    let nominal = INITIAL_BACKOFF
        .checked_mul(1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX))
        .unwrap_or(MAX_BACKOFF)
        .min(MAX_BACKOFF);
    let unit = if unit.is_finite() {
        unit.clamp(0.0, 1.0)
    } else {
        0.0
    };
    nominal.mul_f64(0.5 + 0.5 * unit)
}

/// Backoff state for one runner: counts failed attempts, draws jitter.
#[derive(Debug, Clone)]
pub struct Backoff {
    attempt: u32,
    rng: SplitMix64,
}

impl Backoff {
    /// A fresh schedule with jitter from `seed`.
    pub fn new(seed: u64) -> Backoff {
        Backoff {
            attempt: 0,
            rng: SplitMix64::new(seed),
        }
    }

    /// The next delay; each call moves one step further along the schedule.
    pub fn next_delay(&mut self) -> Duration {
        let unit = (self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let delay = backoff_delay(self.attempt, unit);
        self.attempt = self.attempt.saturating_add(1);
        delay
    }

    /// Back to the first step (after a connection that was accepted and lasted).
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_doubles_then_caps() {
        let nominal_ms: Vec<u128> = (0..10).map(|a| backoff_delay(a, 1.0).as_millis()).collect();
        assert_eq!(
            nominal_ms,
            [
                500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000, 30000
            ]
        );
        assert_eq!(backoff_delay(0, 0.0), Duration::from_millis(250));
        assert_eq!(backoff_delay(u32::MAX, 0.5), Duration::from_millis(22_500));
        assert_eq!(backoff_delay(3, f64::NAN), Duration::from_millis(2000));
        assert_eq!(backoff_delay(3, 7.0), Duration::from_millis(4000));
    }

    #[test]
    fn jitter_stays_within_bounds_and_varies() {
        let mut backoff = Backoff::new(42);
        let mut seen = std::collections::BTreeSet::new();
        for attempt in 0..40u32 {
            let delay = backoff.next_delay();
            let nominal = backoff_delay(attempt, 1.0);
            assert!(
                delay >= nominal / 2 && delay <= nominal,
                "{attempt}: {delay:?}"
            );
            assert!(delay <= MAX_BACKOFF);
            seen.insert(delay);
        }
        assert!(seen.len() > 30, "jitter should spread delays: {seen:?}");
        backoff.reset();
        assert!(backoff.next_delay() <= INITIAL_BACKOFF);
    }
}
