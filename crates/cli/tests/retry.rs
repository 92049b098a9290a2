//! Retries that resume: a transfer cut off (a stalled sender, a receiving endpoint killed and
//! restarted) is retried by the same command, which keeps the destination's naming of its
//! first attempt, sends only what the destination had not durably received, leaves no
//! temporary file behind, and reports every attempt.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The stall timeout of the retried copies. The injected stall lasts forever, so this only
/// decides how long the first attempt waits; 1 s was too short for a loaded CI machine, whose
/// second (resuming) third-party attempt once spent over a second setting up before it
/// reported any byte, was cancelled as stalled, and made a third attempt.
const STALL: &str = "3s";

/// A tree `ds` of six 3 MiB files.
fn dataset(dir: &Path) -> PathBuf {
    let ds = dir.join("ds");
    for i in 0..6u64 {
        write_file(&ds.join(format!("f{i}.dat")), 100 + i, 3 << 20);
    }
    write_file(&ds.join("sub/g.dat"), 99, 1 << 20);
    ds
}

/// The JSON report of a retried command describes both attempts, the first one's error
/// included, and the totals add up.
#[track_caller]
fn assert_two_attempts(j: &serde_json::Value) {
    assert_eq!(j["retries"], 1, "{j}");
    let list = j["attempt_list"].as_array().expect("attempt_list");
    assert_eq!(list.len(), 2, "{j}");
    assert!(list[0]["error"].is_string(), "{j}");
    assert!(list[1]["error"].is_null(), "{j}");
    let sum: u64 = list
        .iter()
        .map(|a| a["bytes_moved"].as_u64().unwrap())
        .sum();
    assert_eq!(j["bytes_moved_total"].as_u64().unwrap(), sum, "{j}");
    assert!(
        list[1]["bytes_resumed"].as_u64().unwrap() > 0,
        "the retry resumed nothing: {j}"
    );
}

/// B: `cp -r ./ds haul://host/ds` where `ds` does not exist yet. The first attempt creates
/// `ds` and stalls; the retry used to find `ds` and copy *into* it (`ds/ds/...`, every byte
/// again, the first attempt's temporary files left behind, exit 0).
#[test]
fn a_retried_upload_into_a_new_directory_keeps_its_name() {
    common::needs_fault_injection!();
    let t = tempfile::tempdir().unwrap();
    let ds = dataset(t.path());
    let a = serve(
        &t.path().join("a"),
        &["--insecure", "--checkpoint-interval", "50ms"],
        &[],
    );
    let out = cp_env(
        &[
            "-r",
            "--stall-timeout",
            STALL,
            "--retries",
            "2",
            ds.to_str().unwrap(),
            &a.url("ds"),
        ],
        &[("HAUL_FAULT_STALL_AFTER", "8M")],
    );
    assert_ok(&out);
    assert_same_tree(&ds, &a.root.join("ds"));
    assert!(partials(&a.root).is_empty(), "{:?}", partials(&a.root));
    let j = json(&out);
    assert_two_attempts(&j);
    assert_eq!(j["files_failed"], 0);
}

/// The same for a download into a new local directory (the source endpoint stalls once).
#[test]
fn a_retried_download_into_a_new_directory_keeps_its_name() {
    common::needs_fault_injection!();
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("a");
    let ds = dataset(&root);
    let a = serve(&root, &["--insecure"], &[("HAUL_FAULT_STALL_AFTER", "8M")]);
    let dst = t.path().join("down/ds");
    std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
    let out = cp(&[
        "-r",
        "--stall-timeout",
        STALL,
        "--retries",
        "2",
        "--checkpoint-interval",
        "50ms",
        &a.url("ds"),
        dst.to_str().unwrap(),
    ]);
    assert_ok(&out);
    assert_same_tree(&ds, &dst);
    assert!(partials(t.path()).is_empty(), "{:?}", partials(t.path()));
    assert_two_attempts(&json(&out));
}

/// And for a third-party copy into a new directory of the destination endpoint.
#[test]
fn a_retried_third_party_copy_into_a_new_directory_keeps_its_name() {
    common::needs_fault_injection!();
    let t = tempfile::tempdir().unwrap();
    let ds = dataset(&t.path().join("a"));
    let a = serve(
        &t.path().join("a"),
        &["--insecure"],
        &[("HAUL_FAULT_STALL_AFTER", "8M")],
    );
    let b = serve(
        &t.path().join("b"),
        &["--insecure", "--checkpoint-interval", "50ms"],
        &[],
    );
    let out = cp(&[
        "-r",
        "--stall-timeout",
        STALL,
        "--retries",
        "2",
        &a.url("ds"),
        &b.url("ds"),
    ]);
    assert_ok(&out);
    assert_same_tree(&ds, &b.root.join("ds"));
    assert!(partials(&b.root).is_empty(), "{:?}", partials(&b.root));
    assert_two_attempts(&json(&out));
}

/// B: the receiving endpoint is killed (as by SIGKILL) in the middle of a file and restarted
/// at the same address; the command's automatic retry resumes from the ledger the endpoint
/// checkpointed, instead of sending the whole file again, and no ledger is left beside the
/// finished file. Run on the test directory's file system and, where it is one, on tmpfs
/// (where partial files used to be too short to be resumed).
#[test]
fn an_automatic_retry_resumes_after_the_receiving_endpoint_restarts() {
    common::needs_fault_injection!();
    let t = tempfile::tempdir().unwrap();
    resume_after_restart(t.path());
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        let t = tempfile::tempdir_in(shm).unwrap();
        resume_after_restart(t.path());
    }
}

fn resume_after_restart(dir: &Path) {
    let root = dir.join("a");
    let src = dir.join("big.dat");
    let total = 40u64 << 20;
    write_file(&src, 21, total as usize);
    let mut a = serve(
        &root,
        &["--insecure", "--checkpoint-interval", "50ms"],
        &[("HAUL_FAULT_EXIT_AFTER", "12M")],
    );
    let addr = a.addr.clone();
    let client = haul()
        .args([
            "cp",
            "--insecure",
            "--json",
            "--progress",
            "never",
            "--retries",
            "4",
            "-p",
            "2",
            "--rate",
            "400M",
        ])
        .arg(&src)
        .arg(a.url("big.dat"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let died = wait_for(Duration::from_secs(30), || {
        matches!(a.child.try_wait(), Ok(Some(_)))
    });
    assert!(died, "the endpoint did not reach its exit fault");
    a.kill();
    let a2 = serve_on(&addr, &root, &["--insecure"], &[]);
    let out = client.wait_with_output().unwrap();
    assert_ok(&out);
    assert_same_file(&src, &root.join("big.dat"));
    assert!(partials(&root).is_empty(), "{:?}", partials(&root));
    let j = json(&out);
    assert!(j["retries"].as_u64().unwrap() >= 1, "{j}");
    let list = j["attempt_list"].as_array().unwrap();
    let last = list.last().unwrap();
    assert!(
        last["bytes_resumed"].as_u64().unwrap() > 0,
        "the retry sent the whole file again: {j}"
    );
    assert_eq!(
        last["bytes_moved"].as_u64().unwrap() + last["bytes_resumed"].as_u64().unwrap(),
        total,
        "the last attempt sent exactly what was missing: {j}"
    );
    drop(a2);
}

/// B: a retry whose earlier attempt's session still runs on the endpoint (the endpoint has not
/// noticed that the old connection is dead, as after a link outage) takes the file over: the
/// old session records its ledger and lets go, and the new one resumes from it instead of
/// starting again or writing the same temporary file at the same time. Here the "old" session
/// is a slow client still sending.
#[test]
fn a_newer_transfer_takes_over_a_file_an_older_one_still_writes() {
    let t = tempfile::tempdir().unwrap();
    let a = serve(
        &t.path().join("a"),
        &["--insecure", "--checkpoint-interval", "50ms"],
        &[],
    );
    let src = t.path().join("big.dat");
    let total = 32u64 << 20;
    write_file(&src, 31, total as usize);
    let slow = haul()
        .args([
            "cp",
            "--insecure",
            "--json",
            "--progress",
            "never",
            "--retries",
            "0",
            "--rate",
            "40M",
        ])
        .arg(&src)
        .arg(a.url("big.dat"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let ledger = a.root.join(".big.dat.haul-ledger");
    assert!(
        wait_for(Duration::from_secs(10), || ledger.exists()),
        "the slow transfer checkpointed"
    );
    let out = cp(&["--resume", src.to_str().unwrap(), &a.url("big.dat")]);
    assert_ok(&out);
    assert_same_file(&src, &a.root.join("big.dat"));
    let j = json(&out);
    assert!(
        j["bytes_skipped"].as_u64().unwrap() > 0,
        "the newer transfer did not resume what the older one had written: {j}"
    );
    let old = slow.wait_with_output().unwrap();
    assert_ne!(
        old.status.code(),
        Some(0),
        "the older transfer lost its file"
    );
    assert!(stderr(&old).contains("taken over"), "{}", stderr(&old));
    assert_same_file(&src, &a.root.join("big.dat"));
    assert!(partials(&a.root).is_empty(), "{:?}", partials(&a.root));
}
