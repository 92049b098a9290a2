//! Everything a lab creates is gone after it drops (namespaces, devices, processes left in
//! the hosts, global sysctls), and what a killed process left behind is removed by the next
//! start or `cleanup_leftovers`.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use netlab::{Lab, Profile};

const CHILD_ENV: &str = "NETLAB_TEST_CRASH_CHILD";

fn sysctl(key: &str) -> String {
    std::fs::read_to_string(format!("/proc/sys/{key}"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

fn globals() -> (String, String, String) {
    (
        sysctl("net/core/rmem_max"),
        sysctl("net/core/wmem_max"),
        sysctl("net/ipv4/tcp_allowed_congestion_control"),
    )
}

fn root_links() -> String {
    let out = Command::new("ip")
        .args(["-o", "link"])
        .output()
        .expect("ip link");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

fn exists(ns: &str) -> bool {
    std::path::Path::new(&format!("/run/netns/{ns}")).exists()
}

#[test]
fn drop_removes_everything_and_restores_globals() {
    netlab::require!();
    let _g = common::serial();
    let before = globals();
    let links_before = root_links();
    let lab = Lab::builder()
        .site("a", 2)
        .site("b", 2)
        .profile(Profile::Tuned)
        .congestion("reno")
        .build()
        .expect("build lab");
    let names: Vec<String> = lab.hosts().iter().map(|h| h.netns().to_string()).collect();
    assert!(names.iter().all(|n| exists(n)));
    assert_eq!(globals().0, "268435456");
    let mut sleeper = lab
        .host("b", 1)
        .command("sleep")
        .arg("60")
        .spawn()
        .expect("spawn sleep");
    drop(lab);
    let t0 = Instant::now();
    let gone = loop {
        if let Some(s) = sleeper.try_wait().expect("wait sleep") {
            break Some(s);
        }
        if t0.elapsed() > Duration::from_secs(5) {
            let _ = sleeper.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(gone.is_some(), "process left in a host was not ended");
    for n in &names {
        assert!(!exists(n), "namespace {n} left behind");
    }
    assert_eq!(
        root_links(),
        links_before,
        "links left in the root namespace"
    );
    assert_eq!(globals(), before, "global sysctls not restored");
    println!(
        "netlab cleanup: {} namespaces removed, processes ended, globals restored",
        names.len()
    );
}

/// Helper run in a child process by the next test: builds a lab, prints its namespaces,
/// then waits to be killed.
#[test]
fn crash_child_helper() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let lab = Lab::builder()
        .site("a", 1)
        .site("b", 1)
        .build()
        .expect("build lab");
    for h in lab.hosts() {
        println!("NS {}", h.netns());
    }
    println!("READY");
    std::thread::sleep(Duration::from_secs(30));
}

#[test]
fn leftovers_of_a_killed_process_are_removed() {
    netlab::require!();
    let _g = common::serial();
    let before = globals();
    let exe = std::env::current_exe().expect("test binary path");
    let mut child = Command::new(exe)
        .args([
            "--exact",
            "crash_child_helper",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD_ENV, "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child");
    let mut names = Vec::new();
    let stdout = child.stdout.take().expect("child stdout");
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("child output");
        // libtest may print "test crash_child_helper ... " on the same line.
        if let Some(i) = line.find("NS nl") {
            names.push(line[i + 3..].trim().to_string());
        }
        if line.contains("READY") {
            break;
        }
    }
    assert_eq!(names.len(), 2, "child built its lab");
    assert_eq!(globals().0, "268435456");
    child.kill().expect("kill -9 child");
    let _ = child.wait();
    assert!(
        names.iter().all(|n| exists(n)),
        "a killed process leaves its namespaces"
    );
    let removed = netlab::cleanup_leftovers().expect("cleanup");
    for n in &names {
        assert!(removed.contains(n), "{n} not reported removed");
        assert!(!exists(n), "{n} still there");
    }
    assert_eq!(
        globals(),
        before,
        "globals changed by the killed process not restored"
    );
    println!("netlab crash cleanup: removed {removed:?}");
}
