//! The online optimizer of a link's transfer jobs: how many sessions (files in flight) the
//! job scheduler keeps on one link (source site, destination site), revised every few seconds
//! from what the link delivers, not once a minute as FTS3's optimizer does. Pure: the
//! scheduler feeds it the bytes its sessions moved and the TCP retransmits they reported, and
//! asks it for the number of sessions.
//!
//! The objective is Falcon's (tuning.md): score = goodput / 1.02^n - 10 x goodput x loss, n
//! being the concurrency the search turns (here the link's sessions, as in Falcon its
//! concurrent transfers), so each extra session must add 2% and 1% loss costs 10%. (It once
//! counted sessions x data streams; each session plans its own streams, 8 or 16 by its files,
//! so a probe's score swung up to 2x with the setting unchanged, and the search thrashed.) The search is a hill climb on the
//! number of sessions: each probe holds a setting for `probe` (the first `settle` of it
//! discarded: new sessions are in slow start), compares its score with the last, goes on in
//! the same direction while the score grows and turns round when it falls. It never freezes:
//! a settled link is probed one step up or down every few probes, so a capacity that changes
//! (a link that frees up, another flow that arrives) is followed. The fairness cap (`--job-
//! link-streams`) bounds sessions x streams per session, so a job never takes more than that
//! many flows' share of a shared bottleneck.

use std::time::{Duration, Instant};

/// How a link's optimizer searches.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TunerSettings {
    /// Sessions it never goes below or above.
    pub min_sessions: u32,
    pub max_sessions: u32,
    /// How long each setting is measured, and how much of its start is not counted.
    pub probe: Duration,
    pub settle: Duration,
    /// After this many probes without a change, try one step (up when nothing is lost).
    pub explore_every: u32,
}

impl Default for TunerSettings {
    fn default() -> Self {
        Self {
            min_sessions: 1,
            max_sessions: 16,
            probe: Duration::from_secs(3),
            settle: Duration::from_secs(1),
            explore_every: 3,
        }
    }
}

/// Falcon's score of a setting: goodput (bits/s), penalised by 2% per unit of concurrency
/// (`n`: sessions) and by ten times the fraction of data sent again.
pub fn score(goodput_bps: f64, n: u32, loss: f64) -> f64 {
    goodput_bps / 1.02f64.powi(n.min(10_000) as i32) - 10.0 * goodput_bps * loss.clamp(0.0, 1.0)
}

/// What the search is doing.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    /// Moving in `dir` (+1 or -1) by `step` sessions while the score grows; after the first
    /// move that helped, two at a time (a link that frees up is filled in a few probes), one
    /// at a time (`fine`) once a move went too far.
    Climb { dir: i32, step: u32, fine: bool },
    /// At the best setting found, measuring; `held` probes so far, `reference` the score to
    /// compare with (a move away from it that did not help comes back here).
    Hold { held: u32, reference: f64 },
}

/// One link's optimizer.
#[derive(Clone, Debug)]
pub struct LinkTuner {
    s: TunerSettings,
    sessions: u32,
    mode: Mode,
    /// The score of the previous probe (`None`: none measured yet).
    last: Option<f64>,
    /// The direction the next exploration from a hold goes.
    explore_dir: i32,
    probe_started: Instant,
    /// Bytes moved in the current probe (after its settling time); bytes sent again and the
    /// bytes of the sessions that reported them (sessions report their TCP retransmits when
    /// they end: the loss is their ratio, not spread over the probe's bytes).
    bytes: u64,
    resent: u64,
    ended: u64,
    /// The last loss measured (a probe in which no session ended keeps it).
    loss: f64,
    counting_since: Option<Instant>,
    /// Probes completed (for reports and tests).
    pub probes: u64,
    /// The lowest round-trip time the link's sessions saw (its base, µs; 0: none yet), and
    /// the highest smoothed one reported during the current probe.
    rtt_base_us: u32,
    rtt_probe_us: u32,
    /// Whether the last probe with a round-trip report saw a queue (`None`: never told).
    queueing: Option<bool>,
}

/// What a probe ended with: for reports and the per-link memory.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProbeResult {
    pub sessions: u32,
    pub goodput_bps: f64,
    pub loss: f64,
    pub score: f64,
    /// The sessions' round trips grew over the link's base: a queue is building (`None`:
    /// no session reported a round trip yet).
    pub queueing: Option<bool>,
}

impl ProbeResult {
    /// Nothing lost and no queue: the link has room the sessions do not use (each is held
    /// by its own window, not by the link), so more sessions add their share in full.
    fn headroom(&self) -> bool {
        self.loss <= FULL_LOSS / 10.0 && self.queueing == Some(false)
    }
}

/// Loss above which a link is taken to be full: fewer sessions, at once.
const FULL_LOSS: f64 = 0.001;

/// A smoothed round trip this much above the link's base means a queue.
const QUEUE_RTT_RATIO: f64 = 1.25;

impl LinkTuner {
    /// A tuner starting at `sessions` (what this link learned before, or the default).
    pub fn new(s: TunerSettings, sessions: u32, now: Instant) -> Self {
        Self {
            s,
            sessions: sessions.clamp(s.min_sessions.max(1), s.max_sessions.max(1)),
            mode: Mode::Climb {
                dir: 1,
                step: 1,
                fine: false,
            },
            last: None,
            explore_dir: 1,
            probe_started: now,
            bytes: 0,
            resent: 0,
            ended: 0,
            loss: 0.0,
            counting_since: None,
            probes: 0,
            rtt_base_us: 0,
            rtt_probe_us: 0,
            queueing: None,
        }
    }

    /// A session of the link ended having seen round trips of at least `min_rtt_us` and up
    /// to `srtt_us` (smoothed, TCP_INFO), both in µs; zeros are ignored.
    pub fn record_rtt(&mut self, min_rtt_us: u32, srtt_us: u32) {
        if min_rtt_us > 0 && (self.rtt_base_us == 0 || min_rtt_us < self.rtt_base_us) {
            self.rtt_base_us = min_rtt_us;
        }
        self.rtt_probe_us = self.rtt_probe_us.max(srtt_us);
    }

    /// Sessions the link should have now.
    pub fn sessions(&self) -> u32 {
        self.sessions
    }

    /// The link's sessions moved `bytes` (payload acknowledged) since the last call; sessions
    /// that ended since moved `ended` bytes in all and sent `resent` of them again (TCP
    /// retransmits).
    pub fn record(&mut self, now: Instant, bytes: u64, resent: u64, ended: u64) {
        if now.duration_since(self.probe_started) < self.s.settle {
            return;
        }
        if self.counting_since.is_none() {
            // What this call reports was moved before now, partly while settling.
            self.counting_since = Some(now);
            return;
        }
        self.bytes += bytes;
        self.resent += resent;
        self.ended += ended;
    }

    /// Ends the probe if its time is up, and moves to the next setting. `busy` says whether
    /// the link had work for every session it was allowed (a probe of an idle link measures
    /// the work, not the link: it is thrown away).
    pub fn tick(&mut self, now: Instant, busy: bool) -> Option<ProbeResult> {
        if now.duration_since(self.probe_started) < self.s.probe {
            return None;
        }
        let measured = self
            .counting_since
            .map(|t| now.duration_since(t).as_secs_f64())
            .unwrap_or(0.0);
        let result = (busy && measured > 0.0).then(|| {
            let goodput = self.bytes as f64 * 8.0 / measured;
            if self.ended > 0 {
                self.loss = (self.resent as f64 / self.ended as f64).min(1.0);
            }
            let loss = self.loss;
            if self.rtt_probe_us > 0 && self.rtt_base_us > 0 {
                self.queueing =
                    Some(self.rtt_probe_us as f64 > self.rtt_base_us as f64 * QUEUE_RTT_RATIO);
            }
            ProbeResult {
                sessions: self.sessions,
                goodput_bps: goodput,
                loss,
                score: score(goodput, self.sessions, loss),
                queueing: self.queueing,
            }
        });
        self.rtt_probe_us = 0;
        if let Some(r) = result {
            self.probes += 1;
            self.decide(r);
        }
        self.probe_started = now;
        self.counting_since = None;
        self.bytes = 0;
        self.resent = 0;
        self.ended = 0;
        result
    }

    fn decide(&mut self, r: ProbeResult) {
        let last = self.last.replace(r.score);
        match self.mode {
            Mode::Climb { dir, step, fine } => {
                let better = last.is_none_or(|l| r.score > l * 1.01);
                let worse = last.is_some_and(|l| r.score < l * 0.99);
                if better && self.can_move(dir) {
                    // Up into room the link has: double (the sessions' slow start);
                    // otherwise two at a time, or one once a move went too far.
                    let step = if fine {
                        1
                    } else if dir > 0 && r.headroom() {
                        step.saturating_mul(2).clamp(2, self.sessions.max(2))
                    } else {
                        2
                    };
                    self.move_by(dir, step);
                    self.mode = Mode::Climb { dir, step, fine };
                } else if worse && step > 1 {
                    // Probably one too far: one back, and on that way while it helps.
                    self.move_by(-dir, 1);
                    self.mode = Mode::Climb {
                        dir: -dir,
                        step: 1,
                        fine: true,
                    };
                } else if worse {
                    // The last move hurt: back to where it came from, and hold there.
                    self.move_by(-dir, 1);
                    self.explore_dir = -dir;
                    self.mode = Mode::Hold {
                        held: 0,
                        reference: last.unwrap_or(r.score),
                    };
                } else {
                    self.explore_dir = -dir;
                    self.mode = Mode::Hold {
                        held: 0,
                        reference: r.score,
                    };
                }
            }
            Mode::Hold { held, reference } => {
                if r.loss > FULL_LOSS && r.score < reference * 0.97 {
                    // The link filled up (capacity fell, or other traffic came): half as
                    // many at once, then search down from there.
                    let down = (self.sessions / 2).max(1);
                    self.move_by(-1, down);
                    self.mode = Mode::Climb {
                        dir: -1,
                        step: 1,
                        fine: true,
                    };
                } else if r.score < reference * 0.97 || r.score > reference * 1.03 {
                    // The path changed: search again, from here.
                    let dir = if r.loss > FULL_LOSS { -1 } else { 1 };
                    self.move_by(dir, 1);
                    self.mode = Mode::Climb {
                        dir,
                        step: 2,
                        fine: false,
                    };
                } else if r.headroom() && self.can_move(1) {
                    // Room on the link (capacity grew, other traffic left): as many sessions
                    // again at once, and on up while it pays.
                    let step = self.sessions.max(1);
                    self.move_by(1, step);
                    self.mode = Mode::Climb {
                        dir: 1,
                        step,
                        fine: false,
                    };
                } else if held + 1 >= self.s.explore_every {
                    // Look around: up when nothing is lost (the link may have room now),
                    // else alternately down and up.
                    let wanted = if r.loss <= FULL_LOSS / 10.0 {
                        1
                    } else {
                        self.explore_dir
                    };
                    let dir = if self.can_move(wanted) {
                        wanted
                    } else {
                        -wanted
                    };
                    self.explore_dir = -dir;
                    self.move_by(dir, 1);
                    self.mode = Mode::Climb {
                        dir,
                        step: 1,
                        fine: false,
                    };
                } else {
                    self.mode = Mode::Hold {
                        held: held + 1,
                        reference: 0.7 * reference + 0.3 * r.score,
                    };
                }
            }
        }
    }

    fn can_move(&self, dir: i32) -> bool {
        if dir > 0 {
            self.sessions < self.s.max_sessions.max(1)
        } else {
            self.sessions > self.s.min_sessions.max(1)
        }
    }

    fn move_by(&mut self, dir: i32, step: u32) {
        let next = self.sessions as i64 + dir as i64 * step as i64;
        self.sessions = next.clamp(
            self.s.min_sessions.max(1) as i64,
            self.s.max_sessions.max(1) as i64,
        ) as u32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A link of `capacity` bits/s shared by n sessions, each of which alone reaches at most
    /// `per_session` (its window over the RTT); loss grows once the sessions together offer
    /// more than the link carries.
    fn link(capacity: f64, per_session: f64, n: u32) -> (f64, f64) {
        let offered = per_session * n as f64;
        let goodput = offered.min(capacity);
        let loss = if offered > capacity {
            0.002 * (offered / capacity - 1.0)
        } else {
            0.0
        };
        (goodput, loss)
    }

    /// Runs `probes` probes against a link whose capacity `cap(probe)` gives; returns the
    /// goodput of each probe.
    fn run(
        now: &mut Instant,
        t: &mut LinkTuner,
        probes: usize,
        cap: impl Fn(usize) -> f64,
        per_session: f64,
    ) -> Vec<f64> {
        let mut out = Vec::new();
        for p in 0..probes {
            let (g, loss) = link(cap(p), per_session, t.sessions());
            // Half-second samples over the probe; a session ends in each, reporting the
            // round trip: 40 ms, and half as much again once the sessions fill the queue.
            let full = per_session * t.sessions() as f64 >= cap(p);
            for _ in 0..6 {
                *now += Duration::from_millis(500);
                let bytes = (g / 8.0 * 0.5) as u64;
                t.record(*now, bytes, (bytes as f64 * loss) as u64, bytes);
                t.record_rtt(40_000, if full { 60_000 } else { 40_400 });
            }
            if let Some(r) = t.tick(*now, true) {
                out.push(r.goodput_bps);
            }
        }
        out
    }

    #[test]
    fn it_climbs_to_the_link_and_follows_its_capacity_down_and_up() {
        let mut clock = Instant::now();
        let mut t = LinkTuner::new(TunerSettings::default(), 1, clock);
        // 1 Gbit/s, 100 Mbit/s per session: ten sessions fill it.
        let g = run(&mut clock, &mut t, 20, |_| 1e9, 1e8);
        // Doubling while nothing is lost and no queue builds: 1, 2, 4 (or so), then full.
        assert!(g[..4].iter().any(|g| *g > 0.9e9), "{g:?}");
        assert!((9..=12).contains(&t.sessions()), "{}", t.sessions());
        assert!(g[15..].iter().all(|g| *g > 0.85e9), "{g:?}");
        // Down to 300 Mbit/s: fewer sessions carry it (the extra ones only cost), with the
        // link kept full but for the probes that look below.
        let g = run(&mut clock, &mut t, 16, |_| 3e8, 1e8);
        assert!(g.iter().filter(|g| **g < 2.9e8).count() <= 4, "{g:?}");
        assert!(t.sessions() <= 6, "{}", t.sessions());
        let g = run(&mut clock, &mut t, 16, |_| 1e9, 1e8);
        // Back to 1 Gbit/s: the sessions' round trips show the queue gone and nothing is
        // lost, so the next probe doubles the sessions; above 90% again in the probe that
        // ends 9 s after the change (index 2; 3 s probes).
        let first = g.iter().position(|g| *g > 0.9e9).expect("recovered");
        assert!(first <= 2, "{first}: {g:?}");
    }

    #[test]
    fn it_stays_within_its_bounds_and_ignores_idle_probes() {
        let s = TunerSettings {
            max_sessions: 4,
            ..Default::default()
        };
        let mut clock = Instant::now();
        let mut t = LinkTuner::new(s, 99, clock);
        assert_eq!(t.sessions(), 4);
        run(&mut clock, &mut t, 10, |_| 1e10, 1e8);
        assert!(t.sessions() <= 4);
        // A probe while the link had no work for every session is thrown away.
        let mut t = LinkTuner::new(TunerSettings::default(), 3, Instant::now());
        let now = Instant::now() + Duration::from_secs(5);
        t.record(now, 1 << 20, 0, 1 << 20);
        assert_eq!(t.tick(now + Duration::from_secs(1), false), None);
        assert_eq!((t.sessions(), t.probes), (3, 0));
    }

    #[test]
    fn without_round_trips_it_looks_up_only_now_and_then() {
        // The same capacity increase with no session reporting a round trip: headroom is
        // not known, so the hold explores one session every third probe (slower, never a
        // jump into a link that may be full).
        let mut clock = Instant::now();
        let mut t = LinkTuner::new(TunerSettings::default(), 3, clock);
        let mut sessions = Vec::new();
        for _ in 0..12 {
            for _ in 0..6 {
                clock += Duration::from_millis(500);
                let g = 1e8 * t.sessions() as f64;
                let bytes = (g.min(1e9) / 8.0 * 0.5) as u64;
                t.record(clock, bytes, 0, bytes);
            }
            t.tick(clock, true);
            sessions.push(t.sessions());
        }
        for w in sessions.windows(2) {
            assert!(w[1] <= w[0] + 2, "jumped: {sessions:?}");
        }
        assert!(sessions.last().unwrap() > &3, "{sessions:?}");
    }

    #[test]
    fn loss_and_streams_cost_score() {
        assert!(score(1e9, 1, 0.0) > score(1e9, 8, 0.0));
        assert!(score(1e9, 1, 0.0) > score(1e9, 1, 0.01));
        assert!((score(1e9, 0, 0.01) - 0.9e9).abs() < 1.0);
    }
}
