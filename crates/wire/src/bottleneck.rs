//! Where a transfer's time went and the one factor that limited it, with the advice that
//! removes it (`haul cp --explain`, `bottleneck` in `--json` and in the transfer log). Pure
//! rules over the evidence each side of a session collects and reports in its summary: the
//! sender's kernel chronographs (busy, receive-window-limited, send-buffer-limited time),
//! retransmits and RTT, the time its readers spent on the source storage and waiting for the
//! network, the receiver's time writing, and each side's CPU time.
//!
//! The order of the rules is the order in which a limit hides the others: a rate cap, then a
//! transfer too short to leave slow start, many small files, CPU, the storage on either side,
//! the receiver's window and the sender's buffer, loss, and finally the network itself.

use serde::{Deserialize, Serialize};

/// What the sending side of a session saw (sums over its data streams).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SendEvidence {
    pub streams: u32,
    /// Each stream's life from its first byte to its close, summed.
    pub life_us: u64,
    /// `tcpi_busy_time`, `tcpi_rwnd_limited`, `tcpi_sndbuf_limited`, summed.
    pub busy_us: u64,
    pub rwnd_limited_us: u64,
    pub sndbuf_limited_us: u64,
    pub segs_out: u64,
    pub retrans_segs: u64,
    /// The lowest RTT any stream saw, and the largest smoothed RTT at their ends.
    pub min_rtt_us: u32,
    pub srtt_us: u32,
    /// Reader threads: time reading and checksumming the source files, bytes read, time
    /// waiting for room in the read-ahead budget (the network was slower), and their number.
    pub read_us: u64,
    pub read_bytes: u64,
    pub budget_wait_us: u64,
    pub readers: u32,
    /// This side's process CPU time during the session, its wall time, and the CPU it may
    /// use (cores, or its cgroup's `cpu.max`, in thousandths of a core).
    pub cpu_us: u64,
    pub wall_us: u64,
    pub cpu_millicores: u32,
    /// `net.ipv4.tcp_wmem` maximum of the sending host.
    pub wmem_max: u64,
}

/// What the receiving side of a session saw.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReceiveEvidence {
    /// Writer threads: time in writes (and syncs), bytes written, their number.
    pub write_us: u64,
    pub write_bytes: u64,
    pub writers: u32,
    pub cpu_us: u64,
    pub wall_us: u64,
    pub cpu_millicores: u32,
    /// `net.ipv4.tcp_rmem` maximum of the receiving host.
    pub rmem_max: u64,
}

/// A transfer as a whole, for the diagnosis.
#[derive(Clone, Debug, Default)]
pub struct Transfer {
    /// Payload bytes that crossed the network, and the files.
    pub bytes: u64,
    pub files: u64,
    pub seconds: f64,
    /// `--rate`, bits per second.
    pub rate_cap_bps: Option<u64>,
    /// The link rate planned for (`--link-rate`), bits per second.
    pub link_bps: u64,
    pub send: Option<SendEvidence>,
    pub receive: Option<ReceiveEvidence>,
}

/// The one factor that limited a transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Factor {
    RateCap,
    SlowStart,
    PerFileLatency,
    Cpu,
    SourceRead,
    DestinationWrite,
    ReceiverWindow,
    SenderBuffer,
    Loss,
    Network,
    /// Not enough evidence (e.g. a third-party copy whose endpoints report none).
    Unknown,
}

/// Shares of the sending streams' time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TimeShares {
    /// Of the streams' lives: data in flight.
    pub busy: f64,
    /// Of the busy time: limited by the receiver's window, by our send buffer, by the
    /// network (congestion window).
    pub rwnd_limited: f64,
    pub sndbuf_limited: f64,
    pub network: f64,
    /// Of the readers' time: reading the source; of the wall time: writers writing.
    pub source_read: f64,
    pub destination_write: f64,
}

/// The diagnosis.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub factor: Factor,
    /// One sentence: what limited the transfer, with the figure that shows it.
    pub reason: String,
    /// What removes the limit: commands or flags, in order.
    pub advice: Vec<String>,
    pub shares: TimeShares,
    /// Goodput, bits per second.
    pub goodput_bps: f64,
    pub retransmitted: f64,
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

fn rate(bps: f64) -> String {
    crate::units::format_rate(bps)
}

/// The buffer one stream needs for `bps` at `rtt_us`: twice the product, a power of two,
/// at least 16 MiB.
fn buffer_for(bps: u64, rtt_us: u32) -> u64 {
    let bdp = (bps as f64 / 8.0 * rtt_us as f64 / 1e6) as u64;
    (2 * bdp).next_power_of_two().clamp(16 << 20, 1 << 30)
}

pub fn diagnose(t: &Transfer) -> Verdict {
    let goodput = if t.seconds > 0.0 {
        t.bytes as f64 * 8.0 / t.seconds
    } else {
        0.0
    };
    let mut shares = TimeShares::default();
    let send = t.send.clone().unwrap_or_default();
    let recv = t.receive.clone().unwrap_or_default();
    shares.busy = ratio(send.busy_us, send.life_us).min(1.0);
    shares.rwnd_limited = ratio(send.rwnd_limited_us, send.busy_us).min(1.0);
    shares.sndbuf_limited = ratio(send.sndbuf_limited_us, send.busy_us).min(1.0);
    shares.network = (1.0 - shares.rwnd_limited - shares.sndbuf_limited).max(0.0);
    shares.source_read = ratio(
        send.read_us,
        send.wall_us.saturating_mul(send.readers.max(1) as u64),
    )
    .min(1.0);
    shares.destination_write = ratio(recv.write_us, recv.wall_us).min(recv.writers.max(1) as f64);
    let retransmitted = ratio(send.retrans_segs, send.segs_out);
    let verdict = |factor, reason: String, advice: Vec<String>| Verdict {
        factor,
        reason,
        advice,
        shares,
        goodput_bps: goodput,
        retransmitted,
    };
    let rtt_us = send.srtt_us.max(send.min_rtt_us);
    let want = buffer_for(t.link_bps.max(goodput as u64), rtt_us);

    // A cap the link could carry, reached within what setting up and ending a copy costs.
    if let Some(cap) = t.rate_cap_bps
        && goodput >= 0.5 * cap as f64
        && (cap as f64) <= 0.8 * t.link_bps as f64
    {
        return verdict(
            Factor::RateCap,
            format!(
                "the --rate cap: {} of the {} allowed",
                rate(goodput),
                rate(cap as f64)
            ),
            vec!["raise --rate, or drop it to use what the path gives".into()],
        );
    }
    if t.send.is_none() && t.receive.is_none() {
        return verdict(
            Factor::Unknown,
            "no evidence from the sending or the receiving side".into(),
            vec![],
        );
    }
    // A transfer over in a few round trips never left slow start.
    if rtt_us > 0 && t.seconds * 1e6 < 20.0 * rtt_us as f64 && t.files < 100 {
        return verdict(
            Factor::SlowStart,
            format!(
                "slow start: the transfer took {:.2} s, {:.0} round trips of {:.1} ms, too few for TCP to open its window",
                t.seconds,
                t.seconds * 1e6 / rtt_us as f64,
                rtt_us as f64 / 1e3
            ),
            vec!["nothing to fix for one small transfer; batch small transfers into one copy (-r, or several sources) so the window opens once".into()],
        );
    }
    // Destination storage: writers busy while the receiver's window held the sender.
    if t.receive.is_some()
        && shares.destination_write >= 0.8
        && (shares.rwnd_limited >= 0.2 || shares.busy < 0.6)
    {
        return verdict(
            Factor::DestinationWrite,
            format!(
                "destination storage: the destination writes at about {} (its writers were busy {:.0}% of the time)",
                rate(recv.write_bytes as f64 * 8.0 / (recv.wall_us.max(1) as f64 / 1e6)),
                shares.destination_write.min(1.0) * 100.0
            ),
            vec![
                "faster storage (or more disks striped) at the destination; check it with fio or dd oflag=direct".into(),
                "--no-fsync when many small files each wait for their sync (less durable)".into(),
            ],
        );
    }
    // Many small files: streams idle between files.
    let mean = t.bytes.checked_div(t.files).unwrap_or(0);
    if t.files >= 100
        && mean < (4 << 20)
        && (shares.busy < 0.5 || goodput < 0.5 * t.link_bps as f64)
    {
        return verdict(
            Factor::PerFileLatency,
            format!(
                "per-file latency: {} files of {} on average; the streams had data in flight only {:.0}% of the time",
                t.files,
                crate::units::format_bytes(mean),
                shares.busy * 100.0
            ),
            vec![
                "more files in flight: --concurrency 32 (or 64)".into(),
                "or pack small files into archives before moving them".into(),
            ],
        );
    }
    // One side's CPU saturated: all it may use (its cores, or its cgroup's quota).
    for (side, cpu, wall, milli) in [
        ("sender", send.cpu_us, send.wall_us, send.cpu_millicores),
        ("receiver", recv.cpu_us, recv.wall_us, recv.cpu_millicores),
    ] {
        let used = ratio(cpu, wall);
        let may = milli as f64 / 1000.0;
        // 70%: the wall time also holds the copy's start and end, when even a starved sender
        // idles, and a CFS quota throttles in whole periods.
        if wall > 0 && milli > 0 && used >= 0.7 * may {
            return verdict(
                Factor::Cpu,
                format!(
                    "CPU on the {side}: {used:.2} cores busy of the {may:.2} it may use, for the whole transfer"
                ),
                vec![
                    format!("more CPU for the {side} (its cgroup's cpu.max, or a host with more or faster cores)"),
                    "fewer checksums (--checksum crc32c only), --protect clear where the network is trusted".into(),
                ],
            );
        }
    }
    // Source storage: streams idle, readers reading, and never waiting for the network.
    if t.send.is_some()
        && shares.busy < 0.6
        && shares.source_read >= 0.5
        && ratio(send.budget_wait_us, send.wall_us) < 0.1
    {
        return verdict(
            Factor::SourceRead,
            format!(
                "source storage: the source reads at about {} (its readers were busy {:.0}% of the time, the streams idle {:.0}%)",
                rate(send.read_bytes as f64 * 8.0 / (send.wall_us.max(1) as f64 / 1e6)),
                shares.source_read * 100.0,
                (1.0 - shares.busy) * 100.0
            ),
            vec!["faster storage at the source, or more files read at once (--concurrency)".into()],
        );
    }
    if t.send.is_some() && shares.rwnd_limited >= 0.3 {
        let bdp = (t.link_bps.max(goodput as u64) as f64 / 8.0 * rtt_us as f64 / 1e6) as u64;
        // A receiver whose buffers could hold the path's window but that advertised less
        // did not drain its socket: its application (CPU), not its settings.
        if t.receive
            .as_ref()
            .is_some_and(|r| r.rmem_max >= 2 * bdp.max(1))
        {
            return verdict(
                Factor::Cpu,
                format!(
                    "the receiver: it did not drain its sockets (held the streams {:.0}% of their busy time) although its buffers allow the path's window; its CPU, {:.2} cores busy",
                    shares.rwnd_limited * 100.0,
                    ratio(recv.cpu_us, recv.wall_us)
                ),
                vec!["more CPU on the receiver, fewer checksums (--checksum crc32c only), --protect clear where the network is trusted".into()],
            );
        }
        return verdict(
            Factor::ReceiverWindow,
            format!(
                "the receiver's window: the streams were held by it {:.0}% of their busy time{}",
                shares.rwnd_limited * 100.0,
                match t.receive.as_ref().map(|r| r.rmem_max).filter(|m| *m > 0) {
                    Some(m) => format!(
                        "; its tcp_rmem maximum, {}, is below twice the {} in flight of {} at {:.1} ms",
                        crate::units::format_bytes(m),
                        crate::units::format_bytes(bdp),
                        rate(t.link_bps as f64),
                        rtt_us as f64 / 1e3
                    ),
                    None => String::new(),
                }
            ),
            vec![
                format!("on the receiver: sysctl -w net.ipv4.tcp_rmem=\"4096 131072 {want}\""),
                "or more streams (-p) to add up smaller windows".into(),
            ],
        );
    }
    if t.send.is_some() && shares.sndbuf_limited >= 0.3 {
        return verdict(
            Factor::SenderBuffer,
            format!(
                "the sender's buffer: the streams were held by it {:.0}% of their busy time (its tcp_wmem maximum is too small for {} at {:.1} ms)",
                shares.sndbuf_limited * 100.0,
                rate(t.link_bps as f64),
                rtt_us as f64 / 1e3
            ),
            vec![
                format!("on the sender: sysctl -w net.ipv4.tcp_wmem=\"4096 16384 {want}\""),
                "or more streams (-p) to add up smaller buffers".into(),
            ],
        );
    }
    // The same limit when the kernel's send-buffer chronograph stays at zero (Linux 6.18
    // reports none for a sender held by a 1 MiB tcp_wmem): no loss, busy streams, a link
    // they used less than half of, each stream carrying in flight at least a quarter of its
    // tcp_wmem maximum (Linux keeps about half of a send buffer for payload), and buffers
    // that together hold less than twice the link's bandwidth-delay product.
    let streams = send.streams.max(1) as u64;
    let link_bdp = (t.link_bps as f64 / 8.0 * rtt_us as f64 / 1e6) as u64;
    let in_flight = (goodput / 8.0 * rtt_us as f64 / 1e6) as u64;
    if t.send.is_some()
        && send.wmem_max > 0
        && retransmitted < 0.001
        && shares.busy >= 0.6
        && t.link_bps > 0
        && goodput < 0.5 * t.link_bps as f64
        && streams.saturating_mul(send.wmem_max) < link_bdp.saturating_mul(2)
        // Not the receiver's buffer instead (when its kernel too reports no window-limited
        // time): its tcp_rmem maximum, when known, holds the path's window.
        && t.receive.as_ref().is_none_or(|r| {
            r.rmem_max == 0 || r.rmem_max.saturating_mul(streams) >= link_bdp.saturating_mul(2)
        })
        && in_flight.saturating_mul(4) >= streams.saturating_mul(send.wmem_max)
    {
        return verdict(
            Factor::SenderBuffer,
            format!(
                "the sender's buffer: {streams} stream{} of at most {} each (its tcp_wmem maximum) kept {} in flight, {} at {:.1} ms without loss; the {} link needs twice {}",
                if streams == 1 { "" } else { "s" },
                crate::units::format_bytes(send.wmem_max),
                crate::units::format_bytes(in_flight),
                rate(goodput),
                rtt_us as f64 / 1e3,
                rate(t.link_bps as f64),
                crate::units::format_bytes(link_bdp),
            ),
            vec![
                format!("on the sender: sysctl -w net.ipv4.tcp_wmem=\"4096 16384 {want}\""),
                "or more streams (-p) to add up smaller buffers".into(),
            ],
        );
    }
    // At the planned link rate (`--link-rate`): the network is the limit, whatever the
    // streams' idle time between files or at the ends.
    // 70%: goodput counts the copy's set-up and end, which weigh on a copy of a second or two
    // (a 24 MiB copy through a 200 Mbit/s link measured 77-90%).
    if t.link_bps > 0 && goodput >= 0.7 * t.link_bps as f64 && t.send.is_some() {
        return verdict(
            Factor::Network,
            format!(
                "the network path: {} of the {} link, {:.2}% of segments sent again: at capacity",
                rate(goodput),
                rate(t.link_bps as f64),
                retransmitted * 100.0
            ),
            vec!["nothing to fix on the hosts; a faster or less shared path".into()],
        );
    }
    // Heavy loss explains idle streams too: a stream whose retransmissions are lost waits out
    // retransmission timeouts with nothing new to send (1% random loss with cubic at 40 ms
    // was measured with its streams busy 54% of the time).
    if t.send.is_some()
        && retransmitted >= 0.005
        && t.link_bps > 0
        && goodput < 0.5 * t.link_bps as f64
    {
        return verdict(
            Factor::Loss,
            format!(
                "congestion or random loss: {:.2}% of segments were sent again, and the streams waited out retransmission timeouts (data in flight only {:.0}% of the time)",
                retransmitted * 100.0,
                shares.busy * 100.0
            ),
            vec![
                "--cc bbr keeps its rate through random loss (longhaul switches by itself when it sees it)".into(),
                "--rate just below the bottleneck avoids overflowing a shallow buffer".into(),
            ],
        );
    }
    // Streams idle for most of the time with no cause found: say so rather than blame the
    // network.
    if t.send.is_some() && shares.busy < 0.6 {
        return verdict(
            Factor::Unknown,
            format!(
                "the sending side: its streams had data in flight only {:.0}% of the time, and neither storage, CPU quota nor small files explain it (two processes sharing one host's cores?)",
                shares.busy * 100.0
            ),
            vec!["trace the copy (--trace) and look at where the streams wait".into()],
        );
    }
    if retransmitted >= 0.001 {
        return verdict(
            Factor::Loss,
            format!(
                "congestion or random loss: {:.2}% of segments were sent again while the streams were limited by their congestion windows",
                retransmitted * 100.0
            ),
            vec![
                "--cc bbr keeps its rate through random loss (longhaul switches by itself when it sees it)".into(),
                "--rate just below the bottleneck avoids overflowing a shallow buffer".into(),
            ],
        );
    }
    if t.send.is_none() {
        return verdict(
            Factor::Unknown,
            "no evidence from the sending side".into(),
            vec![],
        );
    }
    verdict(
        Factor::Network,
        format!(
            "the network path: {} with the streams limited by their congestion windows and {:.3}% of segments sent again: at the capacity the path gives",
            rate(goodput),
            retransmitted * 100.0
        ),
        vec!["nothing to fix on the hosts; a faster or less shared path".into()],
    )
}

#[cfg(test)]
mod tests;
