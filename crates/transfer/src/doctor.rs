//! `haul doctor`: what this host's settings (and, with a peer, the path and the peer's limits)
//! allow a transfer to reach, and the exact commands that remove each limit. [`HostFacts`]
//! reads the host (sysctls, the route's interface, CPU governor, clock); [`findings`] judges
//! them against the path with no I/O, so every rule is unit-tested.
//!
//! The rules follow ESnet's fasterdata host tuning and what longhaul itself needs: a
//! window of the path's bandwidth-delay product for one stream (autotuning maxima), explicit
//! buffers allowed as large (core maxima), BBR available, fq for pacing, no slow start after
//! idle, MTU probing, a long transmit queue at 10 Gbit/s, a fixed CPU frequency and a
//! synchronized clock.

use serde::Serialize;
use std::path::Path;
use std::time::Duration;
use wire::control::HostLimits;

/// What was read from this host.
#[derive(Clone, Debug, Default, Serialize)]
pub struct HostFacts {
    /// `net.ipv4.tcp_rmem` and `tcp_wmem`: min, default, max.
    pub tcp_rmem: [u64; 3],
    pub tcp_wmem: [u64; 3],
    pub core_rmem_max: u64,
    pub core_wmem_max: u64,
    pub congestion_available: Vec<String>,
    pub congestion_default: String,
    pub slow_start_after_idle: Option<u64>,
    pub mtu_probing: Option<u64>,
    pub default_qdisc: Option<String>,
    /// The interface traffic to the peer (or the default route) leaves by.
    pub interface: Option<String>,
    /// Its root qdisc, as `tc` shows it.
    pub qdisc: Option<String>,
    pub mtu: Option<u64>,
    pub txqueuelen: Option<u64>,
    /// CPU frequency governors in use (`None`: not exposed, e.g. in a VM).
    pub governors: Option<Vec<String>>,
    /// Whether the kernel considers the clock synchronized (`None`: unknown).
    pub clock_synchronized: Option<bool>,
}

/// What is known of the path.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PathFacts {
    #[serde(rename = "rtt_ms", serialize_with = "as_ms")]
    pub rtt: Duration,
    /// Measured to a peer (`false`: the RTT is assumed).
    pub measured: bool,
    /// Link rate to plan for, bits per second.
    pub rate_bps: u64,
    /// The peer's limits (from its hello).
    pub peer: Option<HostLimits>,
    pub peer_name: Option<String>,
    /// Path MTU the connection to the peer uses.
    pub path_mtu: Option<u64>,
}

impl PathFacts {
    /// Bytes in flight needed to fill the path.
    pub fn bdp(&self) -> u64 {
        (self.rate_bps as f64 / 8.0 * self.rtt.as_secs_f64()) as u64
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Info,
    Warn,
    /// Caps what a transfer on this path can reach.
    Fail,
}

/// One check's verdict.
#[derive(Clone, Debug, Serialize)]
pub struct Finding {
    /// What was checked, e.g. `tcp_rmem`.
    pub check: String,
    pub status: Status,
    /// What was found and why it matters, in words.
    pub detail: String,
    /// The commands that fix it, exactly (empty when nothing is to be done here).
    pub fix: Vec<String>,
}

fn finding(check: &str, status: Status, detail: String, fix: Vec<String>) -> Finding {
    Finding {
        check: check.into(),
        status,
        detail,
        fix,
    }
}

const MIB: u64 = 1 << 20;

/// The buffer maximum a path needs: twice its bandwidth-delay product (the kernel keeps part
/// of a buffer for overhead), as a power of two, at least 16 MiB and at most 1 GiB.
pub fn wanted_buffer(path: &PathFacts) -> u64 {
    (2 * path.bdp())
        .next_power_of_two()
        .clamp(16 * MIB, 1 << 30)
}

fn mib(b: u64) -> String {
    wire::units::format_bytes(b)
}

/// Judges the host (and the peer's limits) against the path.
pub fn findings(host: &HostFacts, path: &PathFacts) -> Vec<Finding> {
    let mut out = Vec::new();
    let bdp = path.bdp();
    let want = wanted_buffer(path);
    let path_words = format!(
        "{} at {} {} RTT: {} in flight",
        wire::units::format_rate(path.rate_bps as f64),
        if path.measured {
            "a measured"
        } else {
            "an assumed"
        },
        format_ms(path.rtt),
        mib(bdp.max(1))
    );
    // Autotuning maxima: one stream's window cannot pass them.
    for (check, triple, what, side) in [
        (
            "tcp_rmem",
            host.tcp_rmem,
            "net.ipv4.tcp_rmem",
            "receive window (downloads to this host)",
        ),
        (
            "tcp_wmem",
            host.tcp_wmem,
            "net.ipv4.tcp_wmem",
            "send buffer (uploads from this host)",
        ),
    ] {
        let max = triple[2];
        let fix = vec![format!(
            "sysctl -w {what}=\"{} {} {want}\"",
            triple[0].max(4096),
            triple[1].max(if check == "tcp_rmem" { 131072 } else { 16384 })
        )];
        let status = if max < bdp {
            Status::Fail
        } else if max < 2 * bdp {
            Status::Warn
        } else {
            Status::Ok
        };
        let detail = match status {
            Status::Ok => format!("{check} max {} is enough for {path_words}", mib(max)),
            _ => format!(
                "{check} max {} caps one stream's {side} at about {}; the path needs {path_words}",
                mib(max),
                mib(max / 2)
            ),
        };
        out.push(finding(
            check,
            status,
            detail,
            if status == Status::Ok { vec![] } else { fix },
        ));
    }
    // Explicit buffers (longhaul sets them when it plans the window) are capped by the core
    // maxima, not by tcp_rmem/tcp_wmem.
    for (check, max, what) in [
        ("rmem_max", host.core_rmem_max, "net.core.rmem_max"),
        ("wmem_max", host.core_wmem_max, "net.core.wmem_max"),
    ] {
        if max < want {
            out.push(finding(
                check,
                Status::Warn,
                format!(
                    "{what} {} caps explicit socket buffers below the {} this path wants",
                    mib(max),
                    mib(want)
                ),
                vec![format!("sysctl -w {what}={want}")],
            ));
        } else {
            out.push(finding(
                check,
                Status::Ok,
                format!("{what} {}", mib(max)),
                vec![],
            ));
        }
    }
    // The peer's limits, from its hello: what its operator must change.
    if let Some(p) = &path.peer {
        let name = path.peer_name.as_deref().unwrap_or("the peer");
        for (check, max, what, role) in [
            (
                "peer tcp_rmem",
                p.tcp_rmem_max,
                "net.ipv4.tcp_rmem",
                "receive window (uploads to it)",
            ),
            (
                "peer tcp_wmem",
                p.tcp_wmem_max,
                "net.ipv4.tcp_wmem",
                "send buffer (downloads from it)",
            ),
        ] {
            let status = if max < bdp {
                Status::Fail
            } else if max < 2 * bdp {
                Status::Warn
            } else {
                Status::Ok
            };
            let detail = if status == Status::Ok {
                format!("{name}: {what} max {}", mib(max))
            } else {
                format!(
                    "{name}: its {what} max {} caps one stream's {role} at about {}; on {name}, run the line below (or use more streams, -p)",
                    mib(max),
                    mib(max / 2)
                )
            };
            let fix = if status == Status::Ok {
                vec![]
            } else {
                vec![format!("sysctl -w {what}=\"4096 131072 {want}\"")]
            };
            out.push(finding(check, status, detail, fix));
        }
    }
    // Congestion control.
    let has_bbr = host.congestion_available.iter().any(|c| c == "bbr");
    out.push(if has_bbr {
        finding(
            "congestion",
            Status::Ok,
            format!(
                "available: {} (default {}); longhaul switches to bbr on random loss",
                host.congestion_available.join(" "),
                host.congestion_default
            ),
            vec![],
        )
    } else {
        finding(
            "congestion",
            Status::Warn,
            format!(
                "bbr is not available (only {}): on lossy long paths loss-based streams stay far below the link",
                host.congestion_available.join(" ")
            ),
            vec![
                "modprobe tcp_bbr".into(),
                "echo tcp_bbr > /etc/modules-load.d/haul.conf".into(),
            ],
        )
    });
    // Pacing needs fq.
    let iface = host.interface.as_deref().unwrap_or("IFACE");
    match &host.qdisc {
        Some(q) if q == "fq" => out.push(finding(
            "qdisc",
            Status::Ok,
            format!("{iface}: fq (pacing)"),
            vec![],
        )),
        Some(q) => out.push(finding(
            "qdisc",
            Status::Warn,
            format!(
                "{iface}: {q}; fq paces each stream at its rate (fewer bursts and losses on long paths, and --rate without drops)"
            ),
            vec![
                format!("tc qdisc replace dev {iface} root fq"),
                "sysctl -w net.core.default_qdisc=fq".into(),
            ],
        )),
        None => out.push(finding(
            "qdisc",
            Status::Info,
            format!(
                "qdisc of {iface} unknown (no `tc`); default_qdisc is {}",
                host.default_qdisc.as_deref().unwrap_or("unknown")
            ),
            vec![],
        )),
    }
    if host.slow_start_after_idle == Some(1) {
        out.push(finding(
            "slow_start_after_idle",
            Status::Warn,
            "tcp_slow_start_after_idle is 1: a stream idle for one RTO (between files, waiting for the disk) starts again from a small window".into(),
            vec!["sysctl -w net.ipv4.tcp_slow_start_after_idle=0".into()],
        ));
    } else if host.slow_start_after_idle.is_some() {
        out.push(finding(
            "slow_start_after_idle",
            Status::Ok,
            "tcp_slow_start_after_idle is 0".into(),
            vec![],
        ));
    }
    let jumbo = host.mtu.is_some_and(|m| m > 1500);
    match host.mtu_probing {
        Some(0) => out.push(finding(
            "mtu_probing",
            if jumbo { Status::Warn } else { Status::Info },
            "tcp_mtu_probing is 0: a path whose MTU is smaller than the interface's, behind a filter that drops ICMP, hangs connections (black hole)".into(),
            vec!["sysctl -w net.ipv4.tcp_mtu_probing=1".into()],
        )),
        Some(_) => out.push(finding(
            "mtu_probing",
            Status::Ok,
            "tcp_mtu_probing is on".into(),
            vec![],
        )),
        None => {}
    }
    if let Some(mtu) = host.mtu {
        let mut detail = format!("{iface}: MTU {mtu}");
        let mut status = Status::Ok;
        if let Some(p) = path.path_mtu
            && p < mtu
        {
            detail +=
                &format!("; the path to the peer carries only {p} (a hop with a smaller MTU)");
            status = Status::Info;
        }
        if mtu <= 1500 && path.rate_bps >= 10_000_000_000 {
            detail += "; at 10 Gbit/s and more, MTU 9000 end to end (where the path allows) divides the per-packet cost by six";
            status = Status::Info;
        }
        out.push(finding("mtu", status, detail, vec![]));
    }
    if let Some(q) = host.txqueuelen
        && path.rate_bps >= 10_000_000_000
        && q < 10_000
    {
        out.push(finding(
            "txqueuelen",
            Status::Warn,
            format!("{iface}: txqueuelen {q}; at 10 Gbit/s and more, bursts overflow a short transmit queue"),
            vec![format!("ip link set dev {iface} txqueuelen 10000")],
        ));
    }
    match &host.governors {
        None => out.push(finding(
            "cpu governor",
            Status::Info,
            "CPU frequency scaling is not exposed here (a VM?)".into(),
            vec![],
        )),
        Some(g) if g.iter().all(|g| g == "performance") => out.push(finding(
            "cpu governor",
            Status::Ok,
            "performance".into(),
            vec![],
        )),
        Some(g) => out.push(finding(
            "cpu governor",
            Status::Warn,
            format!(
                "governor {}: cores clocked down between bursts add latency to every acknowledgement",
                g.join(",")
            ),
            vec!["cpupower frequency-set -g performance".into()],
        )),
    }
    match host.clock_synchronized {
        Some(true) => out.push(finding(
            "clock",
            Status::Ok,
            "synchronized".into(),
            vec![],
        )),
        Some(false) => out.push(finding(
            "clock",
            Status::Warn,
            "not synchronized: certificates look expired or not yet valid, and logs of two hosts do not line up".into(),
            vec!["apt-get install chrony   # or: timedatectl set-ntp true".into()],
        )),
        None => {}
    }
    out
}

fn as_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1e3)
}

fn format_ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn read_trim(p: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

fn read_u64(p: impl AsRef<Path>) -> Option<u64> {
    read_trim(p)?.parse().ok()
}

fn triple(p: &str) -> [u64; 3] {
    let v: Vec<u64> = read_trim(p)
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    [
        v.first().copied().unwrap_or(0),
        v.get(1).copied().unwrap_or(0),
        v.get(2).copied().unwrap_or(0),
    ]
}

impl HostFacts {
    /// Reads this host (its network namespace). `toward`: the peer's address, to find the
    /// interface traffic leaves by (else the default route's).
    pub fn read(toward: Option<std::net::IpAddr>) -> Self {
        let interface = route_interface(
            &std::fs::read_to_string("/proc/net/route").unwrap_or_default(),
            toward,
        );
        let net = |name: &str, file: &str| read_u64(format!("/sys/class/net/{name}/{file}"));
        Self {
            tcp_rmem: triple("/proc/sys/net/ipv4/tcp_rmem"),
            tcp_wmem: triple("/proc/sys/net/ipv4/tcp_wmem"),
            core_rmem_max: read_u64("/proc/sys/net/core/rmem_max").unwrap_or(0),
            core_wmem_max: read_u64("/proc/sys/net/core/wmem_max").unwrap_or(0),
            congestion_available: crate::sys::available_congestion(),
            congestion_default: crate::sys::default_congestion(),
            slow_start_after_idle: read_u64("/proc/sys/net/ipv4/tcp_slow_start_after_idle"),
            mtu_probing: read_u64("/proc/sys/net/ipv4/tcp_mtu_probing"),
            default_qdisc: read_trim("/proc/sys/net/core/default_qdisc"),
            qdisc: interface.as_deref().and_then(root_qdisc),
            // sysfs shows the namespace it was mounted in; `ip` asks the kernel.
            mtu: interface
                .as_deref()
                .and_then(|i| net(i, "mtu").or_else(|| ip_link(i, "mtu"))),
            txqueuelen: interface
                .as_deref()
                .and_then(|i| net(i, "tx_queue_len").or_else(|| ip_link(i, "qlen"))),
            interface,
            governors: governors(),
            clock_synchronized: clock_synchronized(),
        }
    }
}

/// The interface of the most specific IPv4 route to `toward` in `/proc/net/route` (the
/// default route's without a peer, or for IPv6 peers).
pub fn route_interface(table: &str, toward: Option<std::net::IpAddr>) -> Option<String> {
    let dest = match toward {
        Some(std::net::IpAddr::V4(a)) => u32::from(a),
        _ => 0,
    };
    let mut best: Option<(u32, String)> = None;
    for line in table.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 8 {
            continue;
        }
        // The kernel prints each address's bytes (network order) as a native integer.
        let parse = |s: &str| {
            u32::from_str_radix(s, 16)
                .ok()
                .map(|v| u32::from_be_bytes(v.to_ne_bytes()))
        };
        let (Some(net), Some(mask)) = (parse(f[1]), parse(f[7])) else {
            continue;
        };
        let matches = if toward.is_some() {
            dest & mask == net & mask
        } else {
            mask == 0
        };
        if matches
            && best
                .as_ref()
                .is_none_or(|(m, _)| mask.count_ones() > m.count_ones())
        {
            best = Some((mask, f[0].to_string()));
        }
    }
    best.map(|(_, i)| i)
}

/// A number `ip -o link show dev IFACE` prints after `key` (`mtu`, `qlen`).
fn ip_link(iface: &str, key: &str) -> Option<u64> {
    let out = std::process::Command::new("ip")
        .args(["-o", "link", "show", "dev", iface])
        .output()
        .ok()?;
    parse_ip_link(&String::from_utf8_lossy(&out.stdout), key)
}

/// The number after `key` in `ip -o link` output.
pub fn parse_ip_link(text: &str, key: &str) -> Option<u64> {
    let mut words = text.split_whitespace();
    while let Some(w) = words.next() {
        if w == key {
            // `-o` joins lines with a backslash: "qlen 1000\    link/ether ...".
            return words.next()?.trim_end_matches('\\').parse().ok();
        }
    }
    None
}

/// The root qdisc of `iface` (`tc qdisc show dev IFACE`; `None` without `tc`).
fn root_qdisc(iface: &str) -> Option<String> {
    let out = std::process::Command::new("tc")
        .args(["qdisc", "show", "dev", iface])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    parse_root_qdisc(&text)
}

/// `qdisc fq 8001: root refcnt 2 ...` -> `fq` (the root line; `noqueue` when none is set).
pub fn parse_root_qdisc(text: &str) -> Option<String> {
    text.lines()
        .find(|l| l.contains(" root"))
        .and_then(|l| l.split_whitespace().nth(1))
        .map(str::to_string)
}

fn governors() -> Option<Vec<String>> {
    let mut g: Vec<String> = std::fs::read_dir("/sys/devices/system/cpu")
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| read_trim(e.path().join("cpufreq/scaling_governor")))
        .collect();
    if g.is_empty() {
        return None;
    }
    g.sort();
    g.dedup();
    Some(g)
}

/// `adjtimex`: the kernel's view of whether NTP keeps the clock synchronized.
fn clock_synchronized() -> Option<bool> {
    // SAFETY: a zeroed timex with modes 0 only reads the kernel's state into it.
    let (rc, status) = unsafe {
        let mut t: libc::timex = std::mem::zeroed();
        let rc = libc::adjtimex(&mut t);
        (rc, t.status)
    };
    if rc < 0 {
        return None;
    }
    Some(rc != libc::TIME_ERROR && status & libc::STA_UNSYNC == 0)
}

#[cfg(test)]
mod tests;
