//! Retries with bounded exponential back-off, and the stall detector of seed 002 §4.1: a
//! transfer that moves no data for the stall timeout is cancelled and restarted from its
//! restart markers.

use std::time::{Duration, Instant};

/// Bounded retries with exponential back-off.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in total, the first included.
    pub max_attempts: u32,
    pub initial_delay: Duration,
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 4,
            initial_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// Delay before attempt number `attempt` (1 = the first retry), or `None` when no attempts
    /// are left.
    pub fn delay_before(&self, attempt: u32) -> Option<Duration> {
        if attempt == 0 || attempt >= self.max_attempts {
            return None;
        }
        let factor = 1u32.checked_shl(attempt - 1).unwrap_or(u32::MAX);
        Some(
            self.initial_delay
                .saturating_mul(factor)
                .min(self.max_delay),
        )
    }
}

/// Watches a progress counter; reports a stall when it has not moved for `timeout`.
#[derive(Clone, Debug)]
pub struct StallDetector {
    timeout: Duration,
    last_value: u64,
    last_change: Instant,
    last_observed: Instant,
}

/// Shortest time between two looks at a stall detector's counter.
const STALL_LOOK_MIN: Duration = Duration::from_millis(100);

impl StallDetector {
    pub fn new(timeout: Duration, now: Instant) -> Self {
        Self {
            timeout,
            last_value: 0,
            last_change: now,
            last_observed: now,
        }
    }

    /// Records the counter's value at `now`; true when it has not changed for the timeout.
    pub fn observe(&mut self, now: Instant, value: u64) -> bool {
        self.last_observed = now;
        if value != self.last_value {
            self.last_value = value;
            self.last_change = now;
            return false;
        }
        now.saturating_duration_since(self.last_change) >= self.timeout
    }

    /// When the stall would be declared if nothing moves.
    pub fn deadline(&self) -> Instant {
        self.last_change + self.timeout
    }

    /// When to look at the counter next. A change is seen only when looked at, so the
    /// detector looks every eighth of the timeout (at least 100 ms apart): a stall is declared
    /// at most that late, with one timer instead of a fixed tick.
    pub fn poll_timeout(&self) -> Instant {
        let step = (self.timeout / 8).max(STALL_LOOK_MIN);
        (self.last_observed + step).min(self.deadline().max(self.last_observed))
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_bounded() {
        let p = RetryPolicy {
            max_attempts: 6,
            initial_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(5),
        };
        let d: Vec<_> = (1..7).map(|a| p.delay_before(a)).collect();
        assert_eq!(
            d,
            vec![
                Some(Duration::from_secs(1)),
                Some(Duration::from_secs(2)),
                Some(Duration::from_secs(4)),
                Some(Duration::from_secs(5)),
                Some(Duration::from_secs(5)),
                None
            ]
        );
        assert_eq!(p.delay_before(0), None);
    }

    #[test]
    fn stall_only_after_timeout_without_progress() {
        let t0 = Instant::now();
        let mut s = StallDetector::new(Duration::from_secs(10), t0);
        assert!(!s.observe(t0 + Duration::from_secs(5), 0));
        assert!(!s.observe(t0 + Duration::from_secs(9), 100));
        assert!(!s.observe(t0 + Duration::from_secs(18), 100));
        assert!(s.observe(t0 + Duration::from_secs(19), 100));
        assert_eq!(s.deadline(), t0 + Duration::from_secs(19));
    }

    /// One timer: the next look is an eighth of the timeout after the last (100 ms at least),
    /// and never after the deadline.
    #[test]
    fn stall_detector_looks_an_eighth_of_the_timeout_apart_and_at_the_deadline() {
        let t0 = Instant::now();
        let s8 = Duration::from_secs(8);
        let mut s = StallDetector::new(s8, t0);
        assert_eq!(s.poll_timeout(), t0 + Duration::from_secs(1));
        assert!(!s.observe(t0 + Duration::from_secs(1), 5));
        assert_eq!(s.poll_timeout(), t0 + Duration::from_secs(2));
        assert!(!s.observe(t0 + Duration::from_millis(8500), 5));
        assert_eq!(
            s.poll_timeout(),
            t0 + Duration::from_secs(9),
            "the deadline itself"
        );
        assert!(s.observe(s.poll_timeout(), 5));
        let short = StallDetector::new(Duration::from_millis(200), t0);
        assert_eq!(short.poll_timeout(), t0 + Duration::from_millis(100));
    }
}
