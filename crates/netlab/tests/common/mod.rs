//! Helpers shared by the netlab validation tests: tool checks, bounded command runs, iperf3
//! and ping result parsing, machine CPU accounting.
#![allow(dead_code)]

use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

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
    testkit::skip(format!(
        "{bin} is not installed and could not be installed (apt-get install {package})"
    ));
    false
}

#[allow(unused_imports)]
pub use netlab::probe::{Iperf, machine_cpu, run_bounded};

/// [`netlab::probe::iperf3`], failing the test when iperf3 fails.
pub fn iperf3(client: &Host, server: &Host, secs: u32, extra: &[&str]) -> Iperf {
    netlab::probe::iperf3(client, server, secs, extra).unwrap_or_else(|e| panic!("{e}"))
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

/// Lab or skip: builds the lab, or prints why it cannot and returns None.
pub fn lab_or_skip(b: netlab::LabBuilder) -> Option<Lab> {
    if let Err(why) = Lab::available() {
        testkit::skip(format!("netlab cannot run here: {why}"));
        return None;
    }
    Some(b.build().expect("build lab"))
}
