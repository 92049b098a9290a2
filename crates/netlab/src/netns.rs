//! Network namespaces owned by labs: naming, creation and removal (through `ip netns`),
//! the processes living in them, and removal of leftovers from crashed owners.
//!
//! Every name is `nl<owner pid>-<lab number>-<host>` so that a later run can tell which
//! namespaces belong to a process that no longer exists and delete them.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::sys;

/// Where `ip netns` keeps its namespace files.
pub const NETNS_DIR: &str = "/run/netns";
/// Prefix of every namespace a lab creates.
pub const PREFIX: &str = "nl";

/// Serializes `ip netns add/del` inside this process (first use mounts /run/netns).
static IP_LOCK: Mutex<()> = Mutex::new(());

/// Name of a host namespace.
pub fn ns_name(pid: u32, lab: u32, host: &str) -> String {
    format!("{PREFIX}{pid}-{lab}-{host}")
}

/// Path of a namespace file.
pub fn ns_path(name: &str) -> String {
    format!("{NETNS_DIR}/{name}")
}

/// The owner PID encoded in a lab namespace name, if `name` is one.
pub fn owner_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(PREFIX)?;
    let (pid, tail) = rest.split_once('-')?;
    if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) || !tail.contains('-') {
        return None;
    }
    pid.parse().ok()
}

/// All lab namespaces present now (any owner).
pub fn list() -> Vec<String> {
    let Ok(dir) = fs::read_dir(NETNS_DIR) else {
        return Vec::new();
    };
    let mut names: Vec<String> = dir
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| owner_pid(n).is_some())
        .collect();
    names.sort();
    names
}

fn run_ip_batch(args: &[&str], lines: &[String]) -> io::Result<std::process::Output> {
    let mut child = Command::new("ip")
        .args(args)
        .arg("-batch")
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            io::Error::new(e.kind(), format!("cannot run `ip` (install iproute2): {e}"))
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        let mut text = lines.join("\n");
        text.push('\n');
        stdin.write_all(text.as_bytes())?;
    }
    child.wait_with_output()
}

/// Creates the named namespaces.
pub fn create(names: &[String]) -> io::Result<()> {
    if names.is_empty() {
        return Ok(());
    }
    let _g = IP_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let lines: Vec<String> = names.iter().map(|n| format!("netns add {n}")).collect();
    let out = run_ip_batch(&[], &lines)?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "`ip netns add` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Deletes the named namespaces, first killing every process still inside them.
/// Returns the first error but always tries all of them.
pub fn delete(names: &[String]) -> io::Result<()> {
    if names.is_empty() {
        return Ok(());
    }
    kill_processes_in(names);
    let _g = IP_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let lines: Vec<String> = names.iter().map(|n| format!("netns del {n}")).collect();
    let out = run_ip_batch(&["-force"], &lines)?;
    let left: Vec<&String> = names
        .iter()
        .filter(|n| fs::metadata(ns_path(n)).is_ok())
        .collect();
    if !left.is_empty() {
        return Err(io::Error::other(format!(
            "could not delete namespaces {left:?}: {}; remove them with `ip netns del NAME`",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// PIDs of processes (other than this one) whose network namespace is one of `names`.
pub fn pids_in(names: &[String]) -> Vec<u32> {
    let ids: Vec<(u64, u64)> = names
        .iter()
        .filter_map(|n| fs::metadata(ns_path(n)).ok())
        .map(|m| (m.dev(), m.ino()))
        .collect();
    if ids.is_empty() {
        return Vec::new();
    }
    let me = std::process::id();
    let Ok(proc_dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    proc_dir
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()))
        .filter(|&pid| pid != me)
        .filter(|pid| {
            fs::metadata(format!("/proc/{pid}/ns/net"))
                .map(|m| ids.contains(&(m.dev(), m.ino())))
                .unwrap_or(false)
        })
        .collect()
}

/// Ends the processes left in the namespaces: SIGTERM, then SIGKILL after up to 1 s.
pub fn kill_processes_in(names: &[String]) {
    terminate(&pids_in(names), Duration::from_secs(1));
}

/// Whether `pid` is a running process (zombies count as gone).
pub fn running(pid: u32) -> bool {
    sys::pid_alive(pid) && !is_zombie(pid)
}

/// SIGTERM to each process, up to `wait` for them to end, then SIGKILL to those still running.
/// Pids 0 and 1 are never signalled.
pub fn terminate(pids: &[u32], wait: Duration) {
    let pids: Vec<u32> = pids.iter().copied().filter(|&p| p > 1).collect();
    if pids.is_empty() {
        return;
    }
    for &p in &pids {
        sys::kill(p, libc::SIGTERM);
    }
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        if !pids.iter().any(|&p| running(p)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    for &p in pids.iter().filter(|&&p| running(p)) {
        sys::kill(p, libc::SIGKILL);
    }
}

fn is_zombie(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// Deletes namespaces whose owner process is gone. Returns the names removed.
pub fn remove_leftovers() -> io::Result<Vec<String>> {
    let dead: Vec<String> = list()
        .into_iter()
        .filter(|n| owner_pid(n).is_some_and(|p| !sys::pid_alive(p)))
        .collect();
    delete(&dead)?;
    Ok(dead)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_owner() {
        let n = ns_name(4242, 3, "a0");
        assert_eq!(n, "nl4242-3-a0");
        assert_eq!(owner_pid(&n), Some(4242));
        assert_eq!(owner_pid("nlx-1-a0"), None);
        assert_eq!(owner_pid("nl12"), None);
        assert_eq!(owner_pid("nl12-a0"), None);
        assert_eq!(owner_pid("other"), None);
    }
}
