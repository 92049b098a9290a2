//! How a longhaul test that cannot run on this machine says so.
//!
//! Some tests need what a developer's machine may lack: root, a TUN device, PostgreSQL, the
//! account `nobody`, a tool from Debian. Such a test calls [`skip`] (or [`skip!`]) and returns.
//! libtest has no notion of a skipped test, so it would count the test as passed; `skip`
//! therefore leaves a record that `scripts/test.sh` turns into the summary's "skipped" list:
//!
//! - it prints `SKIPPED <test>: <reason>` on stderr (shown by `cargo test -- --nocapture`);
//! - when `HAUL_SKIP_LOG` names a file, it appends `<binary>\t<test>\t<reason>` to it (one
//!   `write` of one line, so parallel tests do not interleave);
//! - when `HAUL_REQUIRE_ALL=1` (CI, which runs as root with TUN and PostgreSQL), it panics
//!   instead: a test that cannot run where everything it needs was promised is a failure.
//!
//! A test whose premise did not hold on this run — a timing test on a machine that stalled
//! for hundreds of milliseconds, so that the emulated path was not the path asked for — calls
//! [`inconclusive`] instead: the same record with the reason prefixed `inconclusive:`, listed
//! as skipped, but never a failure, even with `HAUL_REQUIRE_ALL=1` (the machine had everything
//! the test needs; it could not keep time). Such a test first asserts everything that does not
//! depend on time, and says exactly what it measured that was out of bounds.
//!
//! This crate has no dependencies and does no I/O beyond that line.

use std::fmt::Display;
use std::io::Write;

/// Records that the calling test cannot run here, for `reason`, and returns (or panics when
/// `HAUL_REQUIRE_ALL=1`). The caller returns right after.
pub fn skip(reason: impl Display) {
    let log = std::env::var_os("HAUL_SKIP_LOG").map(std::path::PathBuf::from);
    record(
        &test_name(),
        &reason.to_string(),
        log.as_deref(),
        required(),
    );
}

/// Records that the calling test ran but could not conclude, for `reason` (measured on this
/// run), and returns; listed as skipped, never a failure. The caller returns right after,
/// before its assertions on time or rate.
pub fn inconclusive(reason: impl Display) {
    let log = std::env::var_os("HAUL_SKIP_LOG").map(std::path::PathBuf::from);
    record(
        &test_name(),
        &format!("inconclusive: {reason}"),
        log.as_deref(),
        false,
    );
}

fn record(test: &str, reason: &str, log: Option<&std::path::Path>, required: bool) {
    let reason = reason.replace(['\n', '\t'], " ");
    if required {
        panic!("{test} cannot run here and HAUL_REQUIRE_ALL=1 requires it: {reason}");
    }
    eprintln!("SKIPPED {test}: {reason}");
    if let Some(log) = log {
        let line = format!("{}\t{test}\t{reason}\n", binary_name());
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(log)
        {
            let _ = f.write_all(line.as_bytes());
        }
    }
}

/// `skip!("needs root")` or `skip!("no {tool}")`: [`skip`] with a formatted reason, then
/// `return` from the calling test (with `skip!(value; "reason")`, returns `value`).
#[macro_export]
macro_rules! skip {
    ($ret:expr; $($fmt:tt)+) => {{
        $crate::skip(format!($($fmt)+));
        return $ret;
    }};
    ($($fmt:tt)+) => {{
        $crate::skip(format!($($fmt)+));
        return;
    }};
}

/// Whether every test must run (`HAUL_REQUIRE_ALL=1`).
pub fn required() -> bool {
    std::env::var("HAUL_REQUIRE_ALL").is_ok_and(|v| v == "1")
}

/// Whether this process runs as root (tests that switch users, mount or build network
/// namespaces need it).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}

/// The running test, as libtest names it (it runs each test on a thread of that name).
fn test_name() -> String {
    std::thread::current()
        .name()
        .filter(|n| *n != "main")
        .unwrap_or("(unknown test)")
        .to_string()
}

/// The test binary's name without cargo's hash suffix (`cp-0a1b2c...` -> `cp`).
fn binary_name() -> String {
    let exe = std::env::current_exe().ok();
    let stem = exe
        .as_deref()
        .and_then(|p| p.file_stem())
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    match stem.rsplit_once('-') {
        Some((name, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
            name.to_string()
        }
        _ => stem,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_names_lose_the_hash() {
        assert_eq!(binary_name(), "testkit");
    }

    #[test]
    fn the_test_name_is_the_thread_name() {
        assert_eq!(test_name(), "tests::the_test_name_is_the_thread_name");
    }

    #[test]
    fn a_skip_is_one_line_in_the_log() {
        let log = std::env::temp_dir().join(format!("testkit-skip-{}", std::process::id()));
        record("t1", "no\tTUN\nhere", Some(&log), false);
        record("t2", "not root", Some(&log), false);
        let text = std::fs::read_to_string(&log).unwrap();
        let _ = std::fs::remove_file(&log);
        assert_eq!(text, "testkit\tt1\tno TUN here\ntestkit\tt2\tnot root\n");
    }

    #[test]
    #[should_panic(expected = "HAUL_REQUIRE_ALL=1 requires it: not root")]
    fn a_required_test_that_cannot_run_fails() {
        record("t", "not root", None, true);
    }
}
