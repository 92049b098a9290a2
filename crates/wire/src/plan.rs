//! Choosing the number of streams and the socket buffers of a transfer from the path's round
//! trip time, both hosts' TCP buffer limits and the data to move.
//!
//! The rule (BRIEF lesson 1, `reference/tuning.md`): one stream carries at most
//! `window / RTT`, where the window is capped by the receiver's buffer limit and the sender's;
//! so `streams = ceil(target_rate x RTT / per-stream window)`. When autotuning's ceiling is
//! lower than an explicit buffer could be (`net.core.*mem_max` above `tcp_*mem`), an explicit
//! buffer is asked for instead. Short transfers on long paths spend most of their time in slow
//! start, where each stream's window starts small, so they get a few streams regardless.

use crate::control::HostLimits;
use std::time::Duration;

/// Fraction of the receive buffer the kernel offers as window (skb overhead; Linux computes
/// `scaling_ratio` per socket, typically 0.5–0.7 with MTU 9000).
const RCV_WINDOW_RATIO: f64 = 0.5;
/// Fraction of the send buffer usable for data in flight.
const SND_WINDOW_RATIO: f64 = 0.75;

/// What is known about the path and the data.
#[derive(Clone, Debug)]
pub struct PathFacts {
    pub rtt: Duration,
    pub sender: HostLimits,
    pub receiver: HostLimits,
    pub total_bytes: u64,
    pub files: u64,
}

/// What the user asked for (or configured).
#[derive(Clone, Debug)]
pub struct Choices {
    pub streams: Option<u32>,
    pub tcp_buffer: Option<u64>,
    pub rate_bps: Option<u64>,
    /// Bandwidth the plan should be able to reach when no rate is given (bits/s).
    pub link_bps: u64,
    pub max_streams: u32,
}

impl Default for Choices {
    fn default() -> Self {
        Self {
            streams: None,
            tcp_buffer: None,
            rate_bps: None,
            link_bps: 10_000_000_000,
            max_streams: 16,
        }
    }
}

/// The decision, with the reasoning in words for logs and `--json`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub streams: u32,
    /// Explicit SO_SNDBUF/SO_RCVBUF, or `None` to leave kernel autotuning on.
    pub socket_buffer: Option<u64>,
    pub explanation: String,
}

fn mib(b: f64) -> String {
    format!("{:.1} MiB", b / (1 << 20) as f64)
}

/// Plans streams and buffers.
pub fn plan(facts: &PathFacts, choices: &Choices) -> Plan {
    let max_streams = choices.max_streams.max(1) as u64;
    let target_bps = choices
        .rate_bps
        .unwrap_or(choices.link_bps)
        .min(choices.link_bps.max(1)) as f64;
    let rtt = facts.rtt.as_secs_f64().max(1e-4);
    let bdp = target_bps / 8.0 * rtt;
    let streams_for = |window: f64| (bdp / window.max(64.0 * 1024.0)).ceil().max(1.0) as u64;

    let autotune_window = (facts.receiver.tcp_rmem_max as f64 * RCV_WINDOW_RATIO)
        .min(facts.sender.tcp_wmem_max as f64 * SND_WINDOW_RATIO);
    let core_cap = facts.receiver.core_rmem_max.min(facts.sender.core_wmem_max) as f64;

    let (mut streams, socket_buffer, how) = match choices.tcp_buffer {
        Some(buf) => {
            let effective = (buf as f64).min(core_cap.max(1.0));
            let note = if (buf as f64) > core_cap {
                format!(
                    "--tcp-buffer {} capped to {} by net.core.*mem_max",
                    mib(buf as f64),
                    mib(core_cap)
                )
            } else {
                format!("--tcp-buffer {}", mib(buf as f64))
            };
            (streams_for(effective), Some(buf), note)
        }
        None => {
            let auto = streams_for(autotune_window);
            // Autotuning is best (buffers grow only as needed) unless reaching the target
            // would take more streams than allowed and an explicit buffer can be larger.
            if auto > max_streams && core_cap * 0.5 > autotune_window {
                let buf = (2.0 * bdp / max_streams as f64).min(core_cap);
                (
                    streams_for(buf * 0.5),
                    Some(buf as u64),
                    format!(
                        "explicit buffer {} per stream (net.core max above autotune max)",
                        mib(buf)
                    ),
                )
            } else {
                (
                    auto,
                    None,
                    format!(
                        "kernel autotuning, window/stream ~{} (receiver tcp_rmem max {}, sender tcp_wmem max {})",
                        mib(autotune_window),
                        mib(facts.receiver.tcp_rmem_max as f64),
                        mib(facts.sender.tcp_wmem_max as f64)
                    ),
                )
            }
        }
    };
    let mut why = format!(
        "target {:.1} Gbit/s x rtt {:.1} ms = {} in flight; {} -> {}",
        target_bps / 1e9,
        rtt * 1e3,
        mib(bdp),
        how,
        crate::units::count(streams, "stream", "streams")
    );
    // Slow start: every stream starts from a small window, so on long paths more streams
    // reach full rate sooner (16 streams gain 4 round trips over one).
    let floor = if facts.rtt >= Duration::from_millis(50) {
        16
    } else if facts.rtt >= Duration::from_millis(10) {
        8
    } else {
        1
    };
    if streams < floor {
        streams = floor;
        why.push_str(&format!(
            "; raised to {floor} to shorten slow start on a long path"
        ));
    }
    let data_cap = (facts.total_bytes / (1 << 20)).max(1);
    if streams > data_cap {
        streams = data_cap;
        why.push_str(&format!("; {data_cap} by data size"));
    }
    if streams > max_streams {
        streams = max_streams;
        why.push_str(&format!("; capped at {max_streams}"));
    }
    let streams = match choices.streams {
        Some(n) => {
            why = format!("-p {n} given; {how}");
            n.clamp(1, 256) as u64
        }
        None => streams,
    };
    // Explicit buffers when the host allows each stream its share of the target window:
    // they open the receive window at once, where autotuning starts it at tcp_rmem's default
    // and holds back the first round trips of slow start.
    let mut socket_buffer = socket_buffer;
    if socket_buffer.is_none() {
        let share = (2.0 * bdp / streams as f64).max(4.0 * 1024.0 * 1024.0);
        let autotune_max = facts.receiver.tcp_rmem_max.min(facts.sender.tcp_wmem_max) as f64;
        if core_cap >= share && core_cap >= autotune_max {
            socket_buffer = Some(share.min(core_cap) as u64);
            why.push_str(&format!(
                "; explicit buffers of {} per stream (net.core max allows)",
                mib(share)
            ));
        }
    }
    Plan {
        streams: streams as u32,
        socket_buffer,
        explanation: why,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(tcp: u64, core: u64) -> HostLimits {
        HostLimits {
            tcp_rmem_max: tcp,
            tcp_wmem_max: tcp,
            core_rmem_max: core,
            core_wmem_max: core,
            congestion: vec![],
        }
    }

    fn facts(rtt_ms: u64, l: HostLimits, bytes: u64, files: u64) -> PathFacts {
        PathFacts {
            rtt: Duration::from_millis(rtt_ms),
            sender: l.clone(),
            receiver: l,
            total_bytes: bytes,
            files,
        }
    }

    #[test]
    fn stock_hosts_on_a_long_path_get_many_streams() {
        // Stock namespace: tcp_rmem max 6 MiB, tcp_wmem max 4 MiB, core 208 KiB.
        let mut l = limits(6 << 20, 212_992);
        l.tcp_wmem_max = 4 << 20;
        let p = plan(&facts(200, l, 4 << 30, 1), &Choices::default());
        assert_eq!(p.streams, 16, "{}", p.explanation);
        assert_eq!(p.socket_buffer, None);
        // Even for a 1 Gbit/s target, one stream (~3 MiB window) is far from enough.
        let c = Choices {
            link_bps: 1_000_000_000,
            ..Default::default()
        };
        let mut l = limits(6 << 20, 212_992);
        l.tcp_wmem_max = 4 << 20;
        let p = plan(&facts(200, l, 4 << 30, 1), &c);
        assert!(p.streams >= 8, "{}", p.explanation);
    }

    #[test]
    fn tuned_hosts_use_autotuning_and_many_streams_only_for_slow_start() {
        // The window allows 4 streams' worth; slow start on a long path asks for 16.
        let p = plan(
            &facts(200, limits(128 << 20, 256 << 20), 4 << 30, 1),
            &Choices::default(),
        );
        assert_eq!(p.streams, 16, "{}", p.explanation);
        // 2 x 238 MiB / 16 streams, allowed by net.core max: opens windows at once.
        assert_eq!(p.socket_buffer, Some(31_250_000), "{}", p.explanation);
        let p = plan(
            &facts(1, limits(128 << 20, 256 << 20), 4 << 30, 1),
            &Choices::default(),
        );
        assert_eq!(p.streams, 1, "{}", p.explanation);
    }

    #[test]
    fn explicit_buffer_when_autotuning_would_need_too_many_streams() {
        let l = limits(4 << 20, 512 << 20);
        let p = plan(&facts(100, l, 4 << 30, 1), &Choices::default());
        assert!(p.socket_buffer.is_some(), "{}", p.explanation);
        assert!(p.streams <= 16);
    }

    #[test]
    fn user_choices_win_and_small_data_caps_streams() {
        let c = Choices {
            streams: Some(3),
            ..Default::default()
        };
        assert_eq!(
            plan(&facts(200, limits(6 << 20, 1 << 20), 1 << 30, 1), &c).streams,
            3
        );
        let p = plan(
            &facts(200, limits(6 << 20, 1 << 20), 100_000, 1),
            &Choices::default(),
        );
        assert_eq!(p.streams, 1, "{}", p.explanation);
        // Many small files on a long path: slow start dominates.
        let p = plan(
            &facts(200, limits(128 << 20, 256 << 20), 68 << 20, 2000),
            &Choices::default(),
        );
        assert!(p.streams >= 8, "{}", p.explanation);
    }

    #[test]
    fn rate_cap_lowers_the_target() {
        let l = limits(6 << 20, 212_992);
        let c = Choices {
            rate_bps: Some(100_000_000),
            ..Default::default()
        };
        let p = plan(&facts(5, l, 4 << 30, 1), &c);
        assert_eq!(p.streams, 1, "{}", p.explanation);
    }
}
