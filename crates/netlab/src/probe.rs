//! Measuring a lab: bounded runs of commands and iperf3 inside lab hosts, and the machine's CPU
//! counters. Shared by netlab's validation tests and the benchmarks in `bench/` (which report
//! what tests must not assert: throughput and CPU cost on this machine).

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::{Host, Stats};

/// For a test about time or rate, after it has asserted everything else: true when the
/// emulator kept time in `stats`' run ([`Stats::timekeeping`]); otherwise records the test as
/// inconclusive (listed as skipped, with what was measured) and returns false, and the caller
/// returns before its assertions on rate or delay.
pub fn timing_held(stats: &Stats) -> bool {
    match stats.timekeeping() {
        Ok(()) => true,
        Err(why) => {
            testkit::inconclusive(why);
            false
        }
    }
}

/// Runs a command to completion, killing it after `limit`. Its output is drained while it
/// runs (iperf3 -J with 16 streams writes more than a pipe holds, and would block for ever).
pub fn run_bounded(cmd: &mut Command, limit: Duration) -> std::io::Result<Output> {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let drain = |r: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out_t = drain(child.stdout.take().map(|r| Box::new(r) as _));
    let err_t = drain(child.stderr.take().map(|r| Box::new(r) as _));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break Some(st);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = out_t.join().unwrap_or_default();
    let stderr = err_t.join().unwrap_or_default();
    match status {
        Some(status) => Ok(Output {
            status,
            stdout,
            stderr,
        }),
        None => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "command timed out after {limit:?}: {}",
                String::from_utf8_lossy(&stderr)
            ),
        )),
    }
}

/// Result of one iperf3 client run.
#[derive(Debug, Clone)]
pub struct Iperf {
    pub received_bps: f64,
    pub retransmits: u64,
    pub seconds: f64,
}

/// Runs `iperf3 -s` on `server` (one test) and `iperf3 -c` on `client` with `extra` args;
/// returns the receiver-side throughput. Bounded by `secs` + 20 s.
pub fn iperf3(client: &Host, server: &Host, secs: u32, extra: &[&str]) -> Result<Iperf, String> {
    let addr = server.addr().to_string();
    let mut srv = server
        .command("iperf3")
        .args(["-s", "-1", "-B", &addr, "-p", "5201"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("start iperf3 server: {e}"))?;
    let mut last_err = String::new();
    let mut result = None;
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(200));
        let out = run_bounded(
            client
                .command("iperf3")
                .args(["-c", &addr, "-p", "5201", "-J", "-t", &secs.to_string()])
                .args(extra),
            Duration::from_secs(secs as u64 + 20),
        )
        .map_err(|e| format!("run iperf3 client: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        if out.status.success() {
            result = Some(text);
            break;
        }
        last_err = text;
        if !last_err.contains("connect") {
            break;
        }
    }
    let _ = srv.kill();
    let _ = srv.wait();
    let text = result.ok_or_else(|| format!("iperf3 failed: {last_err}"))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("iperf3 JSON: {e}"))?;
    let end = &v["end"];
    Ok(Iperf {
        received_bps: end["sum_received"]["bits_per_second"]
            .as_f64()
            .unwrap_or(0.0),
        retransmits: end["sum_sent"]["retransmits"].as_u64().unwrap_or(0),
        seconds: end["sum_received"]["seconds"].as_f64().unwrap_or(0.0),
    })
}

/// Machine-wide CPU time counters from /proc/stat: (busy, softirq+irq, total), in ticks.
pub fn machine_cpu() -> (u64, u64, u64) {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let line = text.lines().next().unwrap_or("");
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    if v.len() < 8 {
        return (0, 0, 1);
    }
    let total: u64 = v.iter().take(8).sum();
    let idle = v[3] + v[4];
    (total - idle, v[5] + v[6], total)
}
