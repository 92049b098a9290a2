//! `haul netlab up` stops cleanly on SIGTERM: exit 0, its namespaces and state file removed and
//! the global sysctls it raised restored. (Run under the async runtime's threads, the signal
//! used to kill it outright, leaving the settings raised and a stale record behind.)

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn rmem_max() -> String {
    std::fs::read_to_string("/proc/sys/net/core/rmem_max")
        .unwrap_or_default()
        .trim()
        .to_string()
}

#[test]
fn netlab_up_stops_cleanly_on_sigterm() {
    if let Err(why) = netlab::Lab::available() {
        testkit::skip!("netlab cannot run here: {why}");
    }
    let before = rmem_max();
    let mut up = Command::new(env!("CARGO_BIN_EXE_haul"))
        .args([
            "netlab",
            "up",
            "--rtt",
            "10ms",
            "--profile",
            "tuned",
            "--duration",
            "60s",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start haul netlab up");
    let mut line = String::new();
    BufReader::new(up.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read hosts");
    let info: serde_json::Value = serde_json::from_str(&line).expect("hosts JSON");
    let pid = info["pid"].as_u64().expect("pid");
    let netns: Vec<String> = info["hosts"]
        .as_array()
        .expect("hosts")
        .iter()
        .map(|h| h["netns"].as_str().expect("netns").to_string())
        .collect();
    assert_eq!(rmem_max(), "268435456", "a tuned lab raises rmem_max");
    // SAFETY: plain kill of our own child.
    unsafe { libc::kill(up.id() as i32, libc::SIGTERM) };
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = up.try_wait().expect("wait") {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(0), "SIGTERM is a normal stop: {status}");
    for ns in &netns {
        assert!(
            !std::path::Path::new(&format!("/run/netns/{ns}")).exists(),
            "{ns} left"
        );
    }
    assert!(
        !std::path::Path::new(&format!("/run/netlab/up-{pid}.json")).exists(),
        "state file left"
    );
    assert_eq!(rmem_max(), before, "global settings restored");
}

/// `haul netlab cleanup` also forgets the state file of an `up` process that died without
/// removing it (kill -9), which `haul netlab down` would otherwise keep trying to stop.
#[test]
fn netlab_cleanup_removes_the_state_file_of_a_dead_lab() {
    if let Err(why) = netlab::Lab::available() {
        testkit::skip!("netlab cannot run here: {why}");
    }
    let mut gone = Command::new("true").spawn().expect("spawn true");
    let pid = gone.id();
    gone.wait().expect("wait");
    std::fs::create_dir_all("/run/netlab").expect("state dir");
    let stale = format!("/run/netlab/up-{pid}.json");
    std::fs::write(&stale, "{}").expect("plant a stale state file");
    let out = Command::new(env!("CARGO_BIN_EXE_haul"))
        .args(["netlab", "cleanup"])
        .output()
        .expect("run haul netlab cleanup");
    assert!(out.status.success(), "{out:?}");
    assert!(
        !std::path::Path::new(&stale).exists(),
        "stale state file of dead pid {pid} left"
    );
}
