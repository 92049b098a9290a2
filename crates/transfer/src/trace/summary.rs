//! What a trace says: rates per stream and in total between samples, and their percentiles
//! (`haul trace summary`), and the series `haul trace plot` draws. Pure computation.

use super::{Line, StreamSample};
use serde::Serialize;
use std::collections::BTreeMap;

/// One stream's series, one point per sample after its first.
#[derive(Clone, Debug, Default, Serialize)]
pub struct StreamSeries {
    /// Seconds since the trace began.
    pub t_s: Vec<f64>,
    /// Acknowledged bits per second since the previous sample.
    pub rate_bps: Vec<f64>,
    pub cwnd_bytes: Vec<f64>,
    pub rtt_ms: Vec<f64>,
    /// Segments retransmitted since the previous sample.
    pub retrans: Vec<f64>,
}

/// Every stream's series and the total.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Series {
    /// Keyed by (session number, stream): a retry's streams are new sockets.
    pub streams: BTreeMap<(u32, u32), StreamSeries>,
    /// The sum over streams per tick: (seconds, bits per second).
    pub total_t_s: Vec<f64>,
    pub total_bps: Vec<f64>,
    /// Retransmitted segments per tick, all streams.
    pub total_retrans: Vec<f64>,
}

/// Derives the series from a trace's lines.
pub fn series(lines: &[Line]) -> Series {
    let mut out = Series::default();
    let mut session = 0u32;
    let mut last: BTreeMap<(u32, u32), StreamSample> = BTreeMap::new();
    // Per tick (t_us): acknowledged bytes and retransmits of all streams, and the interval.
    let mut ticks: BTreeMap<u64, (f64, f64, f64)> = BTreeMap::new();
    for line in lines {
        match line {
            Line::Session(_) => session += 1,
            Line::Stream(s) => {
                let key = (session, s.stream);
                if let Some(prev) = last.get(&key)
                    && s.t_us > prev.t_us
                    && s.bytes_acked >= prev.bytes_acked
                {
                    let dt = (s.t_us - prev.t_us) as f64 / 1e6;
                    let acked = (s.bytes_acked - prev.bytes_acked) as f64;
                    let retrans = s.retrans_segs.saturating_sub(prev.retrans_segs) as f64;
                    let e = out.streams.entry(key).or_default();
                    e.t_s.push(s.t_us as f64 / 1e6);
                    e.rate_bps.push(acked * 8.0 / dt);
                    e.cwnd_bytes.push(s.cwnd_bytes as f64);
                    e.rtt_ms.push(s.rtt_us as f64 / 1e3);
                    e.retrans.push(retrans);
                    let t = ticks.entry(s.t_us).or_default();
                    t.0 += acked;
                    t.1 += retrans;
                    t.2 = t.2.max(dt);
                }
                last.insert(key, s.clone());
            }
            Line::Header(_) | Line::Storage(_) | Line::End(_) => {}
        }
    }
    for (t_us, (acked, retrans, dt)) in ticks {
        out.total_t_s.push(t_us as f64 / 1e6);
        out.total_bps.push(acked * 8.0 / dt);
        out.total_retrans.push(retrans);
    }
    out
}

/// The total throughput as at most `max` points `seconds:bits_per_second` separated by spaces
/// (means over equal spans of the trace's time, times in whole milliseconds and increasing):
/// what the transfer history keeps of a trace for its plot. Empty without stream samples.
pub fn throughput_points(lines: &[Line], max: usize) -> String {
    let s = series(lines);
    let (Some(&t0), Some(&t1)) = (s.total_t_s.first(), s.total_t_s.last()) else {
        return String::new();
    };
    if max == 0 {
        return String::new();
    }
    let span = ((t1 - t0) / max as f64).max(1e-6);
    // (bucket, sum of times, sum of rates, samples)
    let mut buckets: Vec<(usize, f64, f64, f64)> = Vec::new();
    for (t, bps) in s.total_t_s.iter().zip(&s.total_bps) {
        let i = (((t - t0) / span) as usize).min(max - 1);
        match buckets.last_mut() {
            Some(b) if b.0 == i => {
                b.1 += t;
                b.2 += bps;
                b.3 += 1.0;
            }
            _ => buckets.push((i, *t, *bps, 1.0)),
        }
    }
    let mut out: Vec<String> = Vec::with_capacity(buckets.len());
    let mut last_ms = -1i64;
    for (_, ts, bs, n) in buckets {
        let ms = (ts / n * 1000.0).round() as i64;
        if ms <= last_ms || !bs.is_finite() {
            continue;
        }
        last_ms = ms;
        out.push(format!("{}:{:.0}", ms as f64 / 1000.0, (bs / n).max(0.0)));
    }
    out.join(" ")
}

/// Reads back what [`throughput_points`] writes: the (seconds, bits per second) pairs, or
/// `None` unless every pair has finite numbers, a rate that is not negative and a time later
/// than the one before (the first after -1).
pub fn parse_throughput_points(s: &str) -> Option<Vec<(f64, f64)>> {
    let mut last = -1.0f64;
    let mut points = Vec::new();
    for pair in s.split_whitespace() {
        let (t, v) = pair.split_once(':')?;
        let (t, v) = (t.parse::<f64>().ok()?, v.parse::<f64>().ok()?);
        if !(t.is_finite() && v.is_finite() && t > last && v >= 0.0) {
            return None;
        }
        last = t;
        points.push((t, v));
    }
    Some(points)
}

/// Percentiles of one quantity.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Percentiles {
    pub p5: f64,
    pub p50: f64,
    pub p95: f64,
    pub max: f64,
}

impl Percentiles {
    /// Nearest-rank percentiles (`None` for no values).
    pub fn of(values: &[f64]) -> Option<Self> {
        if values.is_empty() {
            return None;
        }
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let at = |p: f64| v[((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        Some(Self {
            p5: at(0.05),
            p50: at(0.50),
            p95: at(0.95),
            max: v[v.len() - 1],
        })
    }
}

/// `haul trace summary`: the whole trace in a few numbers.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    pub sessions: u32,
    pub streams: u32,
    pub seconds: f64,
    pub samples: u64,
    /// Bytes acknowledged, all streams.
    pub bytes_acked: u64,
    pub retrans_segs: u64,
    /// Total throughput per tick, Mbit/s.
    pub total_mbps: Option<Percentiles>,
    /// Throughput of each stream per tick, Mbit/s.
    pub stream_mbps: Option<Percentiles>,
    pub cwnd_mb: Option<Percentiles>,
    pub rtt_ms: Option<Percentiles>,
    /// Of the time the streams had data in flight: shares limited by the receiver's window
    /// and by our send buffer (the rest was limited by the network: cwnd).
    pub busy_share: f64,
    pub rwnd_limited_share: f64,
    pub sndbuf_limited_share: f64,
    /// Storage read rate while reading, bytes per second (`None`: no storage samples).
    pub read_bytes_per_s: Option<f64>,
    /// Share of the traced time readers waited for the read-ahead budget.
    pub budget_wait_share: Option<f64>,
    /// CPU time the tracer itself spent, and that as a share of one core over the traced
    /// time (`None` for traces without end lines).
    pub sampling_cpu_ms: Option<f64>,
    pub sampling_share: Option<f64>,
}

pub fn summarize(lines: &[Line]) -> Summary {
    let s = series(lines);
    let mut sum = Summary::default();
    let mut first: BTreeMap<(u32, u32), &StreamSample> = BTreeMap::new();
    let mut last: BTreeMap<(u32, u32), &StreamSample> = BTreeMap::new();
    let mut session = 0u32;
    let (mut t_min, mut t_max) = (u64::MAX, 0u64);
    let mut storage = (None::<&super::StorageSample>, None::<&super::StorageSample>);
    for line in lines {
        match line {
            Line::Session(_) => session += 1,
            Line::Stream(st) => {
                sum.samples += 1;
                first.entry((session, st.stream)).or_insert(st);
                last.insert((session, st.stream), st);
                t_min = t_min.min(st.t_us);
                t_max = t_max.max(st.t_us);
            }
            Line::Storage(st) => {
                storage.0.get_or_insert(st);
                storage.1 = Some(st);
            }
            Line::End(e) => {
                *sum.sampling_cpu_ms.get_or_insert(0.0) += e.sampling_cpu_us as f64 / 1e3;
            }
            Line::Header(_) => {}
        }
    }
    sum.sessions = session;
    sum.streams = last.len() as u32;
    sum.seconds = t_max.saturating_sub(t_min.min(t_max)) as f64 / 1e6;
    if let Some(ms) = sum.sampling_cpu_ms
        && sum.seconds > 0.0
    {
        sum.sampling_share = Some(ms / 1e3 / sum.seconds);
    }
    let (mut span, mut busy, mut rwnd, mut sndbuf) = (0u64, 0u64, 0u64, 0u64);
    for (k, l) in &last {
        let f = first[k];
        sum.bytes_acked += l.bytes_acked;
        sum.retrans_segs += l.retrans_segs as u64;
        span += l.t_us.saturating_sub(f.t_us);
        busy += l.busy_us.saturating_sub(f.busy_us);
        rwnd += l.rwnd_limited_us.saturating_sub(f.rwnd_limited_us);
        sndbuf += l.sndbuf_limited_us.saturating_sub(f.sndbuf_limited_us);
    }
    let share = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    sum.busy_share = share(busy, span).min(1.0);
    sum.rwnd_limited_share = share(rwnd, busy).min(1.0);
    sum.sndbuf_limited_share = share(sndbuf, busy).min(1.0);
    let mbps = |v: &[f64]| v.iter().map(|x| x / 1e6).collect::<Vec<_>>();
    sum.total_mbps = Percentiles::of(&mbps(&s.total_bps));
    let all = |f: fn(&StreamSeries) -> &Vec<f64>| -> Vec<f64> {
        s.streams
            .values()
            .flat_map(|x| f(x).iter().copied())
            .collect()
    };
    sum.stream_mbps = Percentiles::of(&mbps(&all(|x| &x.rate_bps)));
    sum.cwnd_mb = Percentiles::of(
        &all(|x| &x.cwnd_bytes)
            .iter()
            .map(|b| b / 1e6)
            .collect::<Vec<_>>(),
    );
    sum.rtt_ms = Percentiles::of(&all(|x| &x.rtt_ms));
    if let (Some(a), Some(b)) = storage
        && b.t_us > a.t_us
    {
        let read_us = b.read_us.saturating_sub(a.read_us);
        if read_us > 0 {
            sum.read_bytes_per_s =
                Some(b.read_bytes.saturating_sub(a.read_bytes) as f64 / (read_us as f64 / 1e6));
        }
        sum.budget_wait_share = Some(
            (b.budget_wait_us.saturating_sub(a.budget_wait_us) as f64 / (b.t_us - a.t_us) as f64)
                .min(1.0),
        );
    }
    sum
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{:.2} s, {} session(s), {} stream(s), {} samples; {} acknowledged, {} segments retransmitted",
            self.seconds,
            self.sessions,
            self.streams,
            self.samples,
            wire::units::format_bytes(self.bytes_acked),
            self.retrans_segs
        )?;
        writeln!(
            f,
            "{:<24}{:>10}{:>10}{:>10}{:>10}",
            "", "p5", "p50", "p95", "max"
        )?;
        for (name, p) in [
            ("total Mbit/s", self.total_mbps),
            ("per stream Mbit/s", self.stream_mbps),
            ("cwnd MB", self.cwnd_mb),
            ("RTT ms", self.rtt_ms),
        ] {
            if let Some(p) = p {
                writeln!(
                    f,
                    "{name:<24}{:>10.2}{:>10.2}{:>10.2}{:>10.2}",
                    p.p5, p.p50, p.p95, p.max
                )?;
            }
        }
        writeln!(
            f,
            "data in flight {:.0}% of the time; of that, limited by the receiver's window {:.0}%, by the send buffer {:.0}%, by the network (cwnd) {:.0}%",
            self.busy_share * 100.0,
            self.rwnd_limited_share * 100.0,
            self.sndbuf_limited_share * 100.0,
            (1.0 - self.rwnd_limited_share - self.sndbuf_limited_share).max(0.0) * 100.0
        )?;
        if let (Some(ms), Some(share)) = (self.sampling_cpu_ms, self.sampling_share) {
            writeln!(
                f,
                "tracing itself: {ms:.1} ms of CPU, {:.2}% of one core over the traced time",
                share * 100.0
            )?;
        }
        if let Some(r) = self.read_bytes_per_s {
            writeln!(
                f,
                "storage read {} while reading; readers waited for the network {:.0}% of the time",
                wire::units::format_rate(r * 8.0),
                self.budget_wait_share.unwrap_or(0.0) * 100.0
            )?;
        }
        Ok(())
    }
}
