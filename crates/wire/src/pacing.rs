//! An application-level token bucket that caps the aggregate rate of all streams of a session
//! (`--rate`). Seed 000 found that a paced flow is stable where a window-limited one bursts;
//! the kernel paces each socket (SO_MAX_PACING_RATE), this bucket makes the sum exact.

use std::time::{Duration, Instant};

/// Debt-based token bucket: taking more tokens than available is allowed and returns how long
/// the caller must wait before sending, so blocks larger than the burst still pass.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    bytes_per_sec: f64,
    burst: f64,
    tokens: f64,
    last: Option<Instant>,
}

impl TokenBucket {
    /// A bucket for `rate_bps` bits per second with `burst` bytes of burst.
    pub fn new(rate_bps: u64, burst: u64) -> Self {
        Self {
            bytes_per_sec: (rate_bps as f64 / 8.0).max(1.0),
            burst: burst as f64,
            tokens: burst as f64,
            last: None,
        }
    }

    pub fn rate_bps(&self) -> u64 {
        (self.bytes_per_sec * 8.0) as u64
    }

    /// Takes `bytes` at `now`; returns how long to wait before sending them.
    pub fn take(&mut self, now: Instant, bytes: u64) -> Duration {
        if let Some(last) = self.last {
            let elapsed = now.saturating_duration_since(last).as_secs_f64();
            self.tokens = (self.tokens + elapsed * self.bytes_per_sec).min(self.burst);
        }
        self.last = Some(now);
        self.tokens -= bytes as f64;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.bytes_per_sec)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_run_rate_matches_the_cap() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(800_000_000, 1 << 20);
        let mut now = t0;
        let mut sent = 0u64;
        for _ in 0..1000 {
            let wait = b.take(now, 1 << 20);
            now += wait;
            sent += 1 << 20;
        }
        let secs = now.duration_since(t0).as_secs_f64();
        let rate = sent as f64 * 8.0 / secs;
        assert!((rate / 800e6 - 1.0).abs() < 0.01, "rate {rate}");
    }

    #[test]
    fn burst_passes_without_waiting() {
        let now = Instant::now();
        let mut b = TokenBucket::new(8_000, 1000);
        assert_eq!(b.take(now, 1000), Duration::ZERO);
        assert_eq!(b.take(now, 1000), Duration::from_secs(1));
    }
}
