//! The bottleneck link model: one direction of the emulated WAN as a pure state machine.
//!
//! No I/O and no clock: every call takes `now` in nanoseconds since the lab started, so the
//! whole behaviour (serialization at the configured rate, one-way delay, Bernoulli loss,
//! jitter, drop-tail queue, blackout windows) is unit-tested without devices. The emulator
//! thread feeds it the packets it reads and holds each forwarded packet until `deliver_at`.

use std::time::Duration;

use serde::Serialize;

use crate::rng::Rng;

/// Nanoseconds since the lab's epoch (CLOCK_MONOTONIC at start).
pub type Nanos = u64;

/// Parameters of one direction of the bottleneck.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LinkParams {
    /// Link rate in bits per second; `None` means no serialization limit.
    pub rate_bps: Option<u64>,
    /// One-way propagation delay.
    #[serde(serialize_with = "ser_duration_ms")]
    pub delay: Duration,
    /// Probability that a packet is lost at random, independently (Bernoulli), in [0, 1].
    pub loss: f64,
    /// Each packet's delay varies uniformly in `[delay - jitter, delay + jitter]`.
    #[serde(serialize_with = "ser_duration_ms")]
    pub jitter: Duration,
    /// Whether jitter may reorder packets; when false a packet is never delivered before the
    /// one sent ahead of it (its delay is raised instead).
    pub reorder: bool,
    /// Drop-tail limit of the queue in front of the link, in bytes of IP packets.
    pub queue_bytes: u64,
}

fn ser_duration_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1e3)
}

impl LinkParams {
    /// Checks the parameters; the error is one line saying what to change.
    pub fn validate(&self) -> Result<(), String> {
        if self.rate_bps == Some(0) {
            return Err("rate must be positive (leave it unset for an unlimited link)".into());
        }
        if !(0.0..=1.0).contains(&self.loss) || self.loss.is_nan() {
            return Err(format!(
                "loss {} is not a probability: use a value in [0, 1]",
                self.loss
            ));
        }
        if self.queue_bytes == 0 {
            return Err("queue limit must be at least one packet (e.g. 64KiB)".into());
        }
        if self.delay > Duration::from_secs(60) || self.jitter > Duration::from_secs(60) {
            return Err("one-way delay and jitter must be under 60 s".into());
        }
        Ok(())
    }

    /// Serialization time of `len` bytes at this rate, in nanoseconds (rounded up).
    pub fn serialization_ns(&self, len: usize) -> Nanos {
        match self.rate_bps {
            None => 0,
            Some(rate) => ((len as u128 * 8 * 1_000_000_000).div_ceil(rate as u128)) as Nanos,
        }
    }
}

/// Why a packet was not forwarded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DropCause {
    /// The drop-tail queue had no room.
    Queue,
    /// Random (Bernoulli) loss.
    Loss,
    /// The link was down (scheduled blackout).
    Blackout,
}

/// What happens to one offered packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The packet leaves the router at `departure` (end of serialization) and reaches the other
    /// side at `deliver_at`.
    Forward { departure: Nanos, deliver_at: Nanos },
    /// The packet is dropped.
    Drop(DropCause),
}

/// One direction of the bottleneck: a drop-tail queue in front of a serializing link with a
/// delay line behind it.
#[derive(Clone, Debug)]
pub struct Bottleneck {
    params: LinkParams,
    delay_ns: Nanos,
    jitter_ns: Nanos,
    rng: Rng,
    /// When the link finishes sending what is already queued.
    last_departure: Nanos,
    /// Latest delivery time handed out (keeps order when `reorder` is off).
    last_delivery: Nanos,
    /// Windows `[start, end)` during which the link is down, sorted by start.
    blackouts: Vec<(Nanos, Nanos)>,
}

impl Bottleneck {
    /// A link with `params` whose random draws come from `seed`.
    pub fn new(params: LinkParams, seed: u64) -> Self {
        let mut b = Bottleneck {
            delay_ns: 0,
            jitter_ns: 0,
            params: params.clone(),
            rng: Rng::new(seed),
            last_departure: 0,
            last_delivery: 0,
            blackouts: Vec::new(),
        };
        b.set_params(params);
        b
    }

    /// Current parameters.
    pub fn params(&self) -> &LinkParams {
        &self.params
    }

    /// Changes the parameters from now on; packets already accepted keep their times.
    pub fn set_params(&mut self, params: LinkParams) {
        self.delay_ns = params.delay.as_nanos() as Nanos;
        self.jitter_ns = params.jitter.as_nanos() as Nanos;
        self.params = params;
    }

    /// Schedules the link down during `[start, end)`.
    pub fn add_blackout(&mut self, start: Nanos, end: Nanos) {
        if end > start {
            self.blackouts.push((start, end));
            self.blackouts.sort_unstable();
        }
    }

    /// Whether the link is down at `t`.
    pub fn is_down(&self, t: Nanos) -> bool {
        self.blackouts.iter().any(|&(s, e)| s <= t && t < e)
    }

    /// Bytes waiting in the queue (including the rest of the packet being sent) at `now`.
    pub fn backlog_bytes(&self, now: Nanos) -> u64 {
        match self.params.rate_bps {
            None => 0,
            Some(rate) => {
                let wait = self.last_departure.saturating_sub(now) as u128;
                (wait * rate as u128 / 8_000_000_000) as u64
            }
        }
    }

    /// Offers a packet of `len` bytes arriving at `now`.
    ///
    /// Order of checks: link down at arrival, random loss, queue room, link down when the
    /// packet would leave. A dropped packet uses no link time.
    pub fn offer(&mut self, now: Nanos, len: usize) -> Verdict {
        self.blackouts.retain(|&(_, end)| end > now);
        if self.is_down(now) {
            return Verdict::Drop(DropCause::Blackout);
        }
        if self.rng.chance(self.params.loss) {
            return Verdict::Drop(DropCause::Loss);
        }
        let start = self.last_departure.max(now);
        if self.params.rate_bps.is_some()
            && self.backlog_bytes(now) + len as u64 > self.params.queue_bytes
        {
            return Verdict::Drop(DropCause::Queue);
        }
        let departure = start + self.params.serialization_ns(len);
        if self.is_down(departure) {
            return Verdict::Drop(DropCause::Blackout);
        }
        self.last_departure = departure;
        let mut deliver_at = departure + self.delay_ns;
        if self.jitter_ns > 0 {
            let span = 2 * self.jitter_ns + 1;
            let draw = self.rng.next_u64() % span;
            deliver_at = (deliver_at + draw)
                .saturating_sub(self.jitter_ns)
                .max(departure);
        }
        if !self.params.reorder {
            deliver_at = deliver_at.max(self.last_delivery);
        }
        self.last_delivery = self.last_delivery.max(deliver_at);
        Verdict::Forward {
            departure,
            deliver_at,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;

    fn params(rate: Option<u64>, delay_ms: u64) -> LinkParams {
        LinkParams {
            rate_bps: rate,
            delay: Duration::from_millis(delay_ms),
            loss: 0.0,
            jitter: Duration::ZERO,
            reorder: false,
            queue_bytes: 1_000_000,
        }
    }

    fn forward(v: Verdict) -> (Nanos, Nanos) {
        match v {
            Verdict::Forward {
                departure,
                deliver_at,
            } => (departure, deliver_at),
            Verdict::Drop(c) => panic!("unexpected drop: {c:?}"),
        }
    }

    #[test]
    fn serialization_at_rate_and_delay() {
        // 1 Gbit/s: 9000 bytes take 72 us.
        let mut b = Bottleneck::new(params(Some(1_000_000_000), 10), 1);
        let (d1, a1) = forward(b.offer(0, 9000));
        assert_eq!(d1, 72_000);
        assert_eq!(a1, 72_000 + 10 * MS);
        // A second packet at the same instant waits for the first.
        let (d2, a2) = forward(b.offer(0, 9000));
        assert_eq!(d2, 144_000);
        assert_eq!(a2, 144_000 + 10 * MS);
        // After the link went idle, departure counts from arrival again.
        let (d3, _) = forward(b.offer(5 * MS, 1500));
        assert_eq!(d3, 5 * MS + 12_000);
    }

    #[test]
    fn sustained_rate_matches_configuration() {
        let rate = 100_000_000;
        let mut b = Bottleneck::new(params(Some(rate), 0), 1);
        b.params.queue_bytes = u64::MAX;
        let mut last = 0;
        for _ in 0..1000 {
            last = forward(b.offer(0, 1250)).0;
        }
        // 1000 x 1250 bytes = 10 Mbit at 100 Mbit/s = 100 ms.
        assert_eq!(last, 100 * MS);
    }

    #[test]
    fn unlimited_rate_only_delays() {
        let mut b = Bottleneck::new(params(None, 25), 1);
        for i in 0..100 {
            let (d, a) = forward(b.offer(i, 9000));
            assert_eq!(d, i);
            assert_eq!(a, i + 25 * MS);
        }
        assert_eq!(b.backlog_bytes(0), 0);
    }

    #[test]
    fn drop_tail_queue_limit() {
        let mut p = params(Some(8_000_000), 0); // 1 byte per microsecond
        p.queue_bytes = 10_000;
        let mut b = Bottleneck::new(p, 1);
        let mut accepted = 0;
        let mut dropped = 0;
        for _ in 0..20 {
            match b.offer(0, 1000) {
                Verdict::Forward { .. } => accepted += 1,
                Verdict::Drop(DropCause::Queue) => dropped += 1,
                Verdict::Drop(c) => panic!("{c:?}"),
            }
        }
        assert_eq!(accepted, 10);
        assert_eq!(dropped, 10);
        assert_eq!(b.backlog_bytes(0), 10_000);
        // Half drained after 5 ms: room for 5 more packets, not 6.
        assert_eq!(b.backlog_bytes(5_000_000), 5_000);
        for _ in 0..5 {
            forward(b.offer(5_000_000, 1000));
        }
        assert_eq!(b.offer(5_000_000, 1000), Verdict::Drop(DropCause::Queue));
    }

    #[test]
    fn blackout_window_drops_on_arrival_and_departure() {
        let mut b = Bottleneck::new(params(Some(8_000_000), 5), 1);
        b.add_blackout(10 * MS, 20 * MS);
        forward(b.offer(MS, 1000));
        assert_eq!(b.offer(10 * MS, 1000), Verdict::Drop(DropCause::Blackout));
        assert_eq!(b.offer(19 * MS, 1000), Verdict::Drop(DropCause::Blackout));
        // Arrives before the window but would leave inside it.
        assert_eq!(
            b.offer(10 * MS - 500_000, 1000),
            Verdict::Drop(DropCause::Blackout)
        );
        let (d, a) = forward(b.offer(20 * MS, 1000));
        assert_eq!(d, 21 * MS);
        assert_eq!(a, 26 * MS);
        assert!(!b.is_down(25 * MS));
    }

    #[test]
    fn seeded_loss_rate() {
        let mut p = params(None, 0);
        p.loss = 0.01;
        let run = |seed| {
            let mut b = Bottleneck::new(p.clone(), seed);
            (0..200_000)
                .filter(|&i| b.offer(i, 100) == Verdict::Drop(DropCause::Loss))
                .count()
        };
        let lost = run(42);
        assert_eq!(lost, run(42), "same seed, same losses");
        // Binomial(200000, 0.01): mean 2000, sd 44.5; allow 5 sd.
        assert!((1777..=2223).contains(&lost), "lost {lost}");
    }

    #[test]
    fn jitter_never_reorders_unless_asked() {
        let mut p = params(Some(1_000_000_000), 10);
        p.jitter = Duration::from_millis(2);
        p.queue_bytes = u64::MAX;
        let mut b = Bottleneck::new(p.clone(), 3);
        let mut prev = 0;
        let mut spread = (u64::MAX, 0);
        for i in 0..10_000u64 {
            // Alternate bursts (where the order constraint binds) and gaps of 5 ms.
            let now = (i / 10) * 5 * MS + (i % 10) * 10_000;
            let (d, a) = forward(b.offer(now, 1500));
            assert!(a >= prev, "reordered at packet {i}");
            assert!(a >= d);
            prev = a;
            let extra = a - d;
            spread = (spread.0.min(extra), spread.1.max(extra));
        }
        assert!(
            spread.0 < 9 * MS && spread.1 > 11 * MS,
            "jitter had effect: {spread:?}"
        );

        p.reorder = true;
        let mut b = Bottleneck::new(p, 3);
        let mut prev = 0;
        let mut reordered = 0;
        for i in 0..10_000u64 {
            let (d, a) = forward(b.offer(i * 100_000, 1500));
            assert!(a + 1 >= d + 8 * MS && a <= d + 12 * MS);
            if a < prev {
                reordered += 1;
            }
            prev = a;
        }
        assert!(
            reordered > 100,
            "reorder asked but only {reordered} reordered"
        );
    }

    #[test]
    fn validation() {
        assert!(params(Some(1), 1).validate().is_ok());
        assert!(params(Some(0), 1).validate().is_err());
        let mut p = params(None, 1);
        p.loss = 1.5;
        assert!(p.validate().unwrap_err().contains("probability"));
        p.loss = -0.1;
        assert!(p.validate().is_err());
        p.loss = f64::NAN;
        assert!(p.validate().is_err());
    }
}
