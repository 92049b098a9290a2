//! Machine-wide settings a lab may need changed, and putting them back afterwards:
//! `net.core.rmem_max` and `net.core.wmem_max` (the "tuned" profile needs 256 MiB), and
//! `net.ipv4.tcp_allowed_congestion_control` (a namespace may only pick a congestion control
//! from that list).
//!
//! These are global (a namespace can only read them). The first lab of a process records the
//! previous values in `/run/netlab/sysctl-<pid>`; the last one to finish restores them unless
//! another live process still holds a record. A record left by a crashed process is used to
//! restore the values on the next start.

use std::fs;
use std::io;
use std::sync::Mutex;

use crate::sys;

/// Directory of the lab's state files.
pub const STATE_DIR: &str = "/run/netlab";
const KEYS: [&str; 3] = [
    "net/core/rmem_max",
    "net/core/wmem_max",
    "net/ipv4/tcp_allowed_congestion_control",
];
/// Value the tuned profile needs (256 MiB).
pub const TUNED_MAX: u64 = 268_435_456;

static USERS: Mutex<usize> = Mutex::new(0);

/// Keeps the changed settings in force; restores them on drop when it is the last holder.
#[derive(Debug)]
pub struct GlobalSettings(());

type Values = Vec<String>;

fn record_path(pid: u32) -> String {
    format!("{STATE_DIR}/sysctl-{pid}")
}

fn lock() -> io::Result<fs::File> {
    fs::create_dir_all(STATE_DIR)?;
    let f = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(format!("{STATE_DIR}/lock"))?;
    sys::flock_exclusive(&f)?;
    Ok(f)
}

/// Records found in the state directory: (pid, saved values, one per line in KEYS order).
fn records() -> Vec<(u32, Values)> {
    let Ok(dir) = fs::read_dir(STATE_DIR) else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let pid: u32 = name.strip_prefix("sysctl-")?.parse().ok()?;
            let text = fs::read_to_string(e.path()).ok()?;
            let vals: Values = text.lines().map(|l| l.to_string()).collect();
            (vals.len() == KEYS.len()).then_some((pid, vals))
        })
        .collect()
}

fn current() -> io::Result<Values> {
    KEYS.iter().map(|k| sys::read_sysctl(k)).collect()
}

fn restore(values: &Values) -> io::Result<()> {
    for (k, v) in KEYS.iter().zip(values) {
        sys::write_sysctl(k, v)?;
    }
    Ok(())
}

fn raise_buffers() -> io::Result<()> {
    for k in &KEYS[..2] {
        let now: u64 = sys::read_sysctl(k)?.parse().unwrap_or(0);
        if now < TUNED_MAX {
            sys::write_sysctl(k, &TUNED_MAX.to_string())?;
        }
    }
    Ok(())
}

fn allow_congestion(cc: &str) -> io::Result<()> {
    let key = KEYS[2];
    let now = sys::read_sysctl(key)?;
    if now.split_whitespace().any(|c| c == cc) {
        return Ok(());
    }
    sys::write_sysctl(key, &format!("{now} {cc}"))
}

/// Makes the global settings fit a lab (buffers raised if `tuned`, `cc` allowed in
/// namespaces) for as long as the returned guard lives.
pub fn acquire(tuned: bool, cc: &str) -> io::Result<GlobalSettings> {
    let mut users = USERS.lock().unwrap_or_else(|p| p.into_inner());
    let _l = lock()?;
    if *users == 0 {
        let me = std::process::id();
        let recs = records();
        let live = recs.iter().find(|(p, _)| *p != me && sys::pid_alive(*p));
        let dead = recs.iter().find(|(p, _)| *p != me && !sys::pid_alive(*p));
        let original = match (live, dead) {
            (Some((_, v)), _) | (None, Some((_, v))) => v.clone(),
            (None, None) => current()?,
        };
        for (p, _) in recs.iter().filter(|(p, _)| !sys::pid_alive(*p)) {
            let _ = fs::remove_file(record_path(*p));
        }
        let mut text = original.join("\n");
        text.push('\n');
        fs::write(record_path(me), text)?;
    }
    // Count the user before changing anything, so the guard restores even a partial change.
    *users += 1;
    let guard = GlobalSettings(());
    if tuned {
        raise_buffers()?;
    }
    allow_congestion(cc)?;
    Ok(guard)
}

/// Restores settings recorded by dead processes when no live process holds a record.
pub fn restore_leftovers() -> io::Result<()> {
    let _l = lock()?;
    let recs = records();
    let me = std::process::id();
    let dead: Vec<&(u32, Values)> = recs
        .iter()
        .filter(|(p, _)| *p != me && !sys::pid_alive(*p))
        .collect();
    if dead.is_empty() {
        return Ok(());
    }
    let any_live = recs.iter().any(|(p, _)| *p == me || sys::pid_alive(*p));
    if !any_live {
        restore(&dead[0].1)?;
    }
    for (p, _) in dead {
        let _ = fs::remove_file(record_path(*p));
    }
    Ok(())
}

impl Drop for GlobalSettings {
    fn drop(&mut self) {
        let mut users = USERS.lock().unwrap_or_else(|p| p.into_inner());
        *users = users.saturating_sub(1);
        if *users > 0 {
            return;
        }
        let Ok(_l) = lock() else { return };
        let me = std::process::id();
        let recs = records();
        let mine = recs.iter().find(|(p, _)| *p == me).map(|r| r.1.clone());
        let _ = fs::remove_file(record_path(me));
        let others_live = recs.iter().any(|(p, _)| *p != me && sys::pid_alive(*p));
        if let (Some(v), false) = (mine, others_live) {
            let _ = restore(&v);
        }
    }
}
