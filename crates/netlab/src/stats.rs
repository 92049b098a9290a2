//! Counters of what the emulator did, per direction of the bottleneck and for traffic that
//! stays inside a site, and their printable snapshot.
//!
//! The emulator thread bumps relaxed atomics; `Lab::stats` reads a consistent-enough snapshot
//! at any time without stopping traffic.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::Serialize;

use crate::model::DropCause;

#[derive(Default, Debug)]
pub(crate) struct DirCounters {
    pub offered_packets: AtomicU64,
    pub offered_bytes: AtomicU64,
    pub packets: AtomicU64,
    pub bytes: AtomicU64,
    pub drop_queue: AtomicU64,
    pub drop_loss: AtomicU64,
    pub drop_blackout: AtomicU64,
    pub drop_other: AtomicU64,
    pub max_backlog: AtomicU64,
    /// Sum and maximum of how late packets were written compared with their due time, ns.
    pub late_sum_ns: AtomicU64,
    pub late_max_ns: AtomicU64,
    pub late_over_1ms: AtomicU64,
}

impl DirCounters {
    pub fn drop(&self, cause: DropCause) {
        match cause {
            DropCause::Queue => &self.drop_queue,
            DropCause::Loss => &self.drop_loss,
            DropCause::Blackout => &self.drop_blackout,
        }
        .fetch_add(1, Relaxed);
    }
}

#[derive(Default, Debug)]
pub(crate) struct Counters {
    pub dirs: [DirCounters; 2],
    pub local_packets: AtomicU64,
    pub local_bytes: AtomicU64,
    /// Not IPv4, or to an address that is no host of the lab.
    pub unroutable: AtomicU64,
    /// Packets dropped because the emulator's buffer memory cap was reached.
    pub no_buffer: AtomicU64,
    /// System calls on the devices: reads (one packet or super-packet each) and writes.
    pub device_reads: AtomicU64,
    pub device_writes: AtomicU64,
}

/// Packets dropped in one direction, by cause.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Drops {
    /// Drop-tail queue full.
    pub queue: u64,
    /// Random loss.
    pub loss: u64,
    /// Link down (blackout).
    pub blackout: u64,
    /// Could not be written to the destination device (it was gone or full).
    pub other: u64,
}

/// What one direction of the bottleneck carried.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DirectionStats {
    /// Sending site.
    pub from: String,
    /// Receiving site.
    pub to: String,
    /// Packets that arrived at the bottleneck.
    pub offered_packets: u64,
    /// Bytes (IP packets) that arrived at the bottleneck.
    pub offered_bytes: u64,
    /// Packets delivered to the receiving side.
    pub packets: u64,
    /// Bytes delivered to the receiving side.
    pub bytes: u64,
    /// Drops by cause.
    pub drops: Drops,
    /// Largest queue backlog seen, bytes.
    pub max_queue_bytes: u64,
    /// Mean time by which the emulator wrote packets after their due time, microseconds
    /// (timer precision; packets may also go out up to 20 us early, counted as 0).
    pub late_mean_us: f64,
    /// Largest such lateness, microseconds.
    pub late_max_us: f64,
    /// Packets written more than 1 ms after their due time.
    pub late_over_1ms: u64,
}

/// Mean lateness above which [`Stats::timekeeping`] says the emulator did not keep time, us.
pub const LATE_MEAN_LIMIT_US: f64 = 1_000.0;
/// Largest lateness of one packet above which it says so, us.
pub const LATE_MAX_LIMIT_US: f64 = 100_000.0;
/// Share of packets more than 1 ms late above which it says so.
pub const LATE_SHARE_LIMIT: f64 = 0.10;

/// Snapshot of all counters.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Stats {
    /// Seconds since the lab started.
    pub elapsed_s: f64,
    /// The two directions of the bottleneck (one entry per direction; none for a one-site lab).
    pub directions: Vec<DirectionStats>,
    /// Packets between hosts of the same site (not through the bottleneck).
    pub local_packets: u64,
    /// Bytes between hosts of the same site.
    pub local_bytes: u64,
    /// Packets that were not IPv4 or had no lab host as destination.
    pub unroutable: u64,
    /// Packets dropped because the emulator's buffer memory was exhausted.
    pub no_buffer: u64,
    /// Packets the hosts' devices dropped because the emulator did not read them in time
    /// (each device holds 1000): the emulator could not keep up. Unlike `drops.queue` (the
    /// emulated bottleneck's queue), these are an artefact of the lab, and a measurement
    /// with any is suspect.
    pub host_tx_dropped: u64,
    /// Packets the hosts' stacks dropped on receipt (backlog full; also an artefact).
    pub host_rx_dropped: u64,
    /// Reads from and writes to the hosts' devices (with offloads, one read or write
    /// carries up to 64 KiB: compare with the packets forwarded).
    pub device_reads: u64,
    pub device_writes: u64,
    /// CPU time used by the emulator thread so far, seconds.
    pub emulator_cpu_s: f64,
}

impl Stats {
    pub(crate) fn snapshot(c: &Counters, sites: &[String], elapsed_s: f64, cpu_s: f64) -> Stats {
        let mut directions = Vec::new();
        if sites.len() == 2 {
            for (i, d) in c.dirs.iter().enumerate() {
                directions.push(DirectionStats {
                    from: sites[i].clone(),
                    to: sites[1 - i].clone(),
                    offered_packets: d.offered_packets.load(Relaxed),
                    offered_bytes: d.offered_bytes.load(Relaxed),
                    packets: d.packets.load(Relaxed),
                    bytes: d.bytes.load(Relaxed),
                    drops: Drops {
                        queue: d.drop_queue.load(Relaxed),
                        loss: d.drop_loss.load(Relaxed),
                        blackout: d.drop_blackout.load(Relaxed),
                        other: d.drop_other.load(Relaxed),
                    },
                    max_queue_bytes: d.max_backlog.load(Relaxed),
                    late_mean_us: d.late_sum_ns.load(Relaxed) as f64
                        / d.packets.load(Relaxed).max(1) as f64
                        / 1e3,
                    late_max_us: d.late_max_ns.load(Relaxed) as f64 / 1e3,
                    late_over_1ms: d.late_over_1ms.load(Relaxed),
                });
            }
        }
        Stats {
            elapsed_s,
            directions,
            local_packets: c.local_packets.load(Relaxed),
            local_bytes: c.local_bytes.load(Relaxed),
            unroutable: c.unroutable.load(Relaxed),
            no_buffer: c.no_buffer.load(Relaxed),
            host_tx_dropped: 0,
            host_rx_dropped: 0,
            device_reads: c.device_reads.load(Relaxed),
            device_writes: c.device_writes.load(Relaxed),
            emulator_cpu_s: cpu_s,
        }
    }

    /// The direction from site `from`, if there is one.
    pub fn direction(&self, from: &str) -> Option<&DirectionStats> {
        self.directions.iter().find(|d| d.from == from)
    }

    /// Packets lost to the lab itself rather than to the emulated path: buffer memory,
    /// device writes, hosts' device queues. Zero in a run whose figures can be trusted.
    pub fn artefact_drops(&self) -> u64 {
        self.no_buffer
            + self.host_tx_dropped
            + self.host_rx_dropped
            + self.directions.iter().map(|d| d.drops.other).sum::<u64>()
    }

    /// Whether the emulator held the path's timing in this run: `Err(what it measured)` when
    /// it wrote packets late by more than a timer's imprecision — over [`LATE_MEAN_LIMIT_US`]
    /// on average, any packet over [`LATE_MAX_LIMIT_US`] (the machine stalled: a virtual
    /// machine whose host took its CPUs away for that long), or more than
    /// [`LATE_SHARE_LIMIT`] of the packets over 1 ms. A rate or a delay measured in such a
    /// run describes the machine, not the emulated path.
    pub fn timekeeping(&self) -> Result<(), String> {
        let mut why = Vec::new();
        for d in &self.directions {
            let share = d.late_over_1ms as f64 / d.packets.max(1) as f64;
            if d.late_mean_us > LATE_MEAN_LIMIT_US
                || d.late_max_us > LATE_MAX_LIMIT_US
                || share > LATE_SHARE_LIMIT
            {
                why.push(format!(
                    "{}->{}: packets written {:.1} ms late on average, {:.0} ms at most, {:.1}% over 1 ms",
                    d.from,
                    d.to,
                    d.late_mean_us / 1e3,
                    d.late_max_us / 1e3,
                    share * 100.0
                ));
            }
        }
        if why.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "the emulator could not keep time on this machine ({}; limits: {:.0} ms mean, {:.0} ms max, {:.0}% over 1 ms)",
                why.join("; "),
                LATE_MEAN_LIMIT_US / 1e3,
                LATE_MAX_LIMIT_US / 1e3,
                LATE_SHARE_LIMIT * 100.0
            ))
        }
    }

    /// One JSON object on one line.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "netlab: {:.1} s, emulator cpu {:.2} s ({:.0}% of a core)",
            self.elapsed_s,
            self.emulator_cpu_s,
            if self.elapsed_s > 0.0 {
                100.0 * self.emulator_cpu_s / self.elapsed_s
            } else {
                0.0
            }
        )?;
        for d in &self.directions {
            let mbps = if self.elapsed_s > 0.0 {
                d.bytes as f64 * 8.0 / self.elapsed_s / 1e6
            } else {
                0.0
            };
            writeln!(
                f,
                "  {}->{}: {} pkts {} bytes ({mbps:.1} Mbit/s avg) of {} offered; drops queue {} loss {} blackout {} other {}; max queue {} B; late mean {:.1} us max {:.1} us, {} over 1 ms",
                d.from,
                d.to,
                d.packets,
                d.bytes,
                d.offered_packets,
                d.drops.queue,
                d.drops.loss,
                d.drops.blackout,
                d.drops.other,
                d.max_queue_bytes,
                d.late_mean_us,
                d.late_max_us,
                d.late_over_1ms
            )?;
        }
        write!(
            f,
            "  local: {} pkts {} bytes; unroutable {}; no buffer {}; emulator could not keep up: hosts' devices dropped {} sent, {} received; device reads {} writes {}",
            self.local_packets,
            self.local_bytes,
            self.unroutable,
            self.no_buffer,
            self.host_tx_dropped,
            self.host_rx_dropped,
            self.device_reads,
            self.device_writes
        )
    }
}

/// `(rx_dropped, tx_dropped)` of interface `iface` in a `/proc/net/dev` listing.
pub(crate) fn device_drops(proc_net_dev: &str, iface: &str) -> Option<(u64, u64)> {
    let line = proc_net_dev
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{iface}:")))?;
    let (_, rest) = line.split_once(':')?;
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    // Receive: bytes packets errs drop ...(8 fields); transmit: bytes packets errs drop ...
    Some((*f.get(3)?, *f.get(11)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_drops_are_read_from_proc_net_dev() {
        let dev = "Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0
  wan0: 123456     789    0    7    0     0          0         0   654321     987    0   42    0     0       0          0
";
        assert_eq!(device_drops(dev, "wan0"), Some((7, 42)));
        assert_eq!(device_drops(dev, "eth9"), None);
    }

    fn run_with(late_mean_us: f64, late_max_us: f64, late_over_1ms: u64) -> Stats {
        let c = Counters::default();
        c.dirs[0].packets.store(1000, Relaxed);
        c.dirs[0]
            .late_sum_ns
            .store((late_mean_us * 1e3 * 1000.0) as u64, Relaxed);
        c.dirs[0]
            .late_max_ns
            .store((late_max_us * 1e3) as u64, Relaxed);
        c.dirs[0].late_over_1ms.store(late_over_1ms, Relaxed);
        Stats::snapshot(&c, &["a".into(), "b".into()], 10.0, 1.0)
    }

    #[test]
    fn a_stalled_emulator_did_not_keep_time() {
        // A good run: tens of microseconds late on average, a few packets over 1 ms.
        assert_eq!(run_with(40.0, 3_000.0, 4).timekeeping(), Ok(()));
        // One stall of 250 ms (seen on a virtual machine), a late average, many late packets.
        for (mean, max, over) in [
            (40.0, 250_000.0, 4),
            (1_500.0, 9_000.0, 10),
            (90.0, 5_000.0, 150),
        ] {
            let why = run_with(mean, max, over).timekeeping().unwrap_err();
            assert!(why.starts_with("the emulator could not keep time"), "{why}");
            assert!(why.contains("a->b"), "{why}");
        }
    }
}
