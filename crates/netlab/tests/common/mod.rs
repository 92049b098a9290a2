//! Helpers shared by the netlab validation tests: tool checks, bounded command runs, iperf3
//! and ping result parsing, machine CPU accounting.
#![allow(dead_code)]

use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use netlab::{Host, Lab};

/// Load tests in one test binary run one at a time (the machine has 2 cores).
pub static SERIAL: Mutex<()> = Mutex::new(());

pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Makes sure `bin` exists, installing Debian package `package` once if it does not.
/// Returns false (after printing why) when it cannot be had.
pub fn ensure_tool(bin: &str, package: &str) -> bool {
    let have = || {
        Command::new("sh")
            .args(["-c", &format!("command -v {bin}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if have() {
        return true;
    }
    eprintln!("{bin} missing: trying apt-get install -y {package}");
    let install = || {
        run_bounded(
            Command::new("apt-get")
                .args(["install", "-y", "-q", package])
                .env("DEBIAN_FRONTEND", "noninteractive"),
            Duration::from_secs(300),
        )
    };
    let _ = install();
    if !have() {
        // A fresh machine may have no package lists yet.
        let _ = run_bounded(
            Command::new("apt-get").args(["update", "-q"]),
            Duration::from_secs(300),
        );
        let _ = install();
    }
    if have() {
        return true;
    }
    eprintln!(
        "skipping: {bin} is not installed and could not be installed (apt-get install {package})"
    );
    false
}

/// Runs a command to completion, killing it after `limit`.
pub fn run_bounded(cmd: &mut Command, limit: Duration) -> std::io::Result<Output> {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait()?.is_some() {
            return child.wait_with_output();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output()?;
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "command timed out after {limit:?}: {}",
                    String::from_utf8_lossy(&out.stderr)
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
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
pub fn iperf3(client: &Host, server: &Host, secs: u32, extra: &[&str]) -> Iperf {
    let addr = server.addr().to_string();
    let mut srv = server
        .command("iperf3")
        .args(["-s", "-1", "-B", &addr, "-p", "5201"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start iperf3 server");
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
        .expect("run iperf3 client");
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
    let text = result.unwrap_or_else(|| panic!("iperf3 failed: {last_err}"));
    let v: serde_json::Value = serde_json::from_str(&text).expect("iperf3 JSON");
    let end = &v["end"];
    Iperf {
        received_bps: end["sum_received"]["bits_per_second"]
            .as_f64()
            .unwrap_or(0.0),
        retransmits: end["sum_sent"]["retransmits"].as_u64().unwrap_or(0),
        seconds: end["sum_received"]["seconds"].as_f64().unwrap_or(0.0),
    }
}

/// Pings `to` from `from` `count` times every `interval_s`; returns (min, avg, max) in ms.
pub fn ping(from: &Host, to: &Host, count: u32, interval_s: f64) -> (f64, f64, f64) {
    let out = run_bounded(
        from.command("ping")
            .args([
                "-n",
                "-q",
                "-c",
                &count.to_string(),
                "-i",
                &interval_s.to_string(),
                "-W",
                "5",
            ])
            .arg(to.addr().to_string()),
        Duration::from_secs_f64(count as f64 * interval_s + 15.0),
    )
    .expect("run ping");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "ping failed: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // rtt min/avg/max/mdev = 20.084/20.114/20.167/0.033 ms[, pipe 2]
    let line = text
        .lines()
        .find(|l| l.contains("min/avg/max"))
        .expect("ping summary line");
    let nums: Vec<f64> = line
        .split('=')
        .nth(1)
        .expect("values")
        .split_whitespace()
        .next()
        .expect("values")
        .split('/')
        .map(|v| v.parse().expect("number"))
        .collect();
    (nums[0], nums[1], nums[2])
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

/// Lab or skip: builds the lab, or prints why it cannot and returns None.
pub fn lab_or_skip(b: netlab::LabBuilder) -> Option<Lab> {
    if let Err(why) = Lab::available() {
        eprintln!("skipping (netlab unavailable): {why}");
        return None;
    }
    Some(b.build().expect("build lab"))
}
