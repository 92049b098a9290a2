//! `haul cp` and `haul serve` as real processes on loopback: every transfer mode, trees,
//! integrity, restart after kills, stalls, and every kind of bad input.

mod common;
use common::*;
use std::path::Path;
use std::time::Duration;

#[test]
fn upload_download_and_third_party_are_byte_identical() {
    let t = tempfile::tempdir().unwrap();
    let a = serve_insecure(&t.path().join("a"));
    let b = serve_insecure(&t.path().join("b"));
    let src = t.path().join("big.dat");
    write_file(&src, 1, 9 * (1 << 20) + 12345);

    let out = cp(&[src.to_str().unwrap(), &a.url("/")]);
    assert_ok(&out);
    assert_same_file(&src, &a.root.join("big.dat"));
    let j = json(&out);
    assert_eq!(j["bytes_total"], 9 * (1 << 20) + 12345);
    assert_eq!(j["files"], 1);
    assert!(j["streams"].as_u64().unwrap() >= 1);
    assert!(j["mbit_per_s"].as_f64().unwrap() > 0.0);
    assert_eq!(j["checksums"][0], "crc32c");

    let down = t.path().join("down.dat");
    assert_ok(&cp(&[&a.url("big.dat"), down.to_str().unwrap()]));
    assert_same_file(&src, &down);

    assert_ok(&cp(&[&a.url("big.dat"), &b.url("copy.dat")]));
    assert_same_file(&src, &b.root.join("copy.dat"));
    for root in [&a.root, &b.root, t.path()] {
        assert!(partials(root).is_empty(), "leftovers: {:?}", partials(root));
    }
}

#[test]
fn trees_with_many_small_files_and_empty_directories() {
    let t = tempfile::tempdir().unwrap();
    let a = serve_insecure(&t.path().join("a"));
    let b = serve_insecure(&t.path().join("b"));
    let src = t.path().join("run42");
    for i in 0..300u64 {
        write_file(
            &src.join(format!("d{}/f{i:04}.nc", i % 7)),
            i,
            4096 + (i as usize * 211) % 60_000,
        );
    }
    write_file(&src.join("empty-file"), 99, 0);
    std::fs::create_dir_all(src.join("empty/dir")).unwrap();
    write_file(&src.join("large.nc"), 7, 3 << 20);

    let out = cp(&["-r", src.to_str().unwrap(), &a.url("/")]);
    assert_ok(&out);
    assert_same_tree(&src, &a.root.join("run42"));
    assert_eq!(json(&out)["files_failed"], 0);

    // Into a new name (cp semantics), endpoint to endpoint.
    assert_ok(&cp(&["-r", &a.url("run42"), &b.url("mirror")]));
    assert_same_tree(&src, &b.root.join("mirror"));

    // Download into an existing directory.
    let dl = t.path().join("dl");
    std::fs::create_dir(&dl).unwrap();
    assert_ok(&cp(&["-r", &b.url("mirror"), dl.to_str().unwrap()]));
    assert_same_tree(&src, &dl.join("mirror"));

    // A directory without -r is refused.
    assert_exit(&cp(&[src.to_str().unwrap(), &a.url("x")]), 2, "use -r");
}

#[test]
fn extra_checksums_match_independent_tools() {
    let t = tempfile::tempdir().unwrap();
    let a = serve_insecure(&t.path().join("a"));
    let src = t.path().join("f.dat");
    write_file(&src, 3, 5 * (1 << 20) + 7);
    let out = cp(&[
        "--checksum",
        "adler32,md5,sha256,xxh3",
        src.to_str().unwrap(),
        &a.url("f.dat"),
    ]);
    assert_ok(&out);
    let j = json(&out);
    let sums = &j["file_list"][0]["checksums"];
    let sha = std::process::Command::new("sha256sum")
        .arg(&src)
        .output()
        .unwrap();
    let sha = String::from_utf8_lossy(&sha.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    assert_eq!(sums["sha256"], sha);
    let md5 = std::process::Command::new("md5sum")
        .arg(&src)
        .output()
        .unwrap();
    let md5 = String::from_utf8_lossy(&md5.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    assert_eq!(sums["md5"], md5);
    assert_eq!(sums["adler32"].as_str().unwrap().len(), 8);
    assert_eq!(sums["crc32c"].as_str().unwrap().len(), 8);
    assert_same_file(&src, &a.root.join("f.dat"));
}

#[test]
fn partial_transfer_by_byte_range() {
    let t = tempfile::tempdir().unwrap();
    let a = serve_insecure(&t.path().join("a"));
    let d = write_file(&a.root.join("whole.dat"), 5, 3 << 20);
    let part = t.path().join("part.dat");
    let out = cp(&[
        "--offset",
        "1000000",
        "--length",
        "1500000",
        &a.url("whole.dat"),
        part.to_str().unwrap(),
    ]);
    assert_ok(&out);
    assert_eq!(std::fs::read(&part).unwrap(), d[1_000_000..2_500_000]);
    // Upload of a range too.
    let src = t.path().join("src.dat");
    let s = write_file(&src, 6, 2 << 20);
    assert_ok(&cp(&[
        "--length",
        "4096",
        src.to_str().unwrap(),
        &a.url("head.dat"),
    ]));
    assert_eq!(std::fs::read(a.root.join("head.dat")).unwrap(), s[..4096]);
    // A range beyond the end is refused.
    let out = cp(&[
        "--offset",
        "3M",
        "--length",
        "1",
        &a.url("whole.dat"),
        part.to_str().unwrap(),
    ]);
    assert_exit(&out, 2, "beyond the end");
}

#[test]
fn corrupted_blocks_are_detected_and_sent_again() {
    common::needs_fault_injection!();
    let t = tempfile::tempdir().unwrap();
    let a = serve_insecure(&t.path().join("a"));
    let src = t.path().join("f.dat");
    write_file(&src, 8, 12 << 20);
    let out = cp_env(
        &[
            "--block-size",
            "256K",
            src.to_str().unwrap(),
            &a.url("f.dat"),
        ],
        &[("HAUL_FAULT_CORRUPT_EVERY", "5")],
    );
    assert_ok(&out);
    assert_same_file(&src, &a.root.join("f.dat"));
    let j = json(&out);
    assert!(j["blocks_resent"].as_u64().unwrap() >= 5, "{j}");
    assert!(
        j["bytes_moved"].as_u64().unwrap() > 12 << 20,
        "resent blocks crossed the network again"
    );
}

#[test]
fn resume_after_the_client_dies_sends_only_what_is_missing() {
    common::needs_fault_injection!();
    let t = tempfile::tempdir().unwrap();
    let a = serve_insecure(&t.path().join("a"));
    let src = t.path().join("f.dat");
    let total = 40u64 << 20;
    write_file(&src, 9, total as usize);
    // The client (sender) dies abruptly after 15 MiB.
    let out = cp_env(
        &["-p", "2", src.to_str().unwrap(), &a.url("f.dat")],
        &[("HAUL_FAULT_EXIT_AFTER", "15M")],
    );
    assert_eq!(out.status.code(), Some(137), "{}", stderr(&out));
    assert!(
        !a.root.join("f.dat").exists(),
        "no file under the final name"
    );
    assert!(
        wait_for(Duration::from_secs(5), || a
            .root
            .join(".f.dat.haul-ledger")
            .exists()),
        "ledger saved"
    );
    let out = cp(&["--resume", src.to_str().unwrap(), &a.url("f.dat")]);
    assert_ok(&out);
    assert_same_file(&src, &a.root.join("f.dat"));
    let j = json(&out);
    let (moved, skipped) = (
        j["bytes_moved"].as_u64().unwrap(),
        j["bytes_skipped"].as_u64().unwrap(),
    );
    assert!(skipped > 0, "{j}");
    assert_eq!(moved + skipped, total, "only missing blocks sent: {j}");
    assert!(partials(&a.root).is_empty());
}

#[test]
fn resume_after_sigkill_of_the_receiving_endpoint() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("a");
    let src = t.path().join("f.dat");
    let total = 24u64 << 20;
    write_file(&src, 10, total as usize);
    let mut a = serve(
        &root,
        &["--insecure", "--checkpoint-interval", "100ms"],
        &[],
    );
    // Slow transfer so that the kill lands in the middle.
    let mut child = haul()
        .args([
            "cp",
            "--insecure",
            "--progress",
            "never",
            "--retries",
            "0",
            "--rate",
            "80M",
        ])
        .arg(&src)
        .arg(a.url("f.dat"))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let ledger = root.join(".f.dat.haul-ledger");
    assert!(
        wait_for(Duration::from_secs(10), || ledger.exists()),
        "a checkpoint was written"
    );
    std::thread::sleep(Duration::from_millis(300));
    a.kill(); // SIGKILL: no chance to save anything more
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(4), "connection lost");
    assert!(!root.join("f.dat").exists());
    let a2 = serve_insecure(&root);
    let out = cp(&["--resume", src.to_str().unwrap(), &a2.url("f.dat")]);
    assert_ok(&out);
    assert_same_file(&src, &root.join("f.dat"));
    let j = json(&out);
    assert!(j["bytes_skipped"].as_u64().unwrap() > 0, "{j}");
    assert_eq!(
        j["bytes_moved"].as_u64().unwrap() + j["bytes_skipped"].as_u64().unwrap(),
        total
    );
}

#[test]
fn resume_of_a_download_after_the_client_dies() {
    common::needs_fault_injection!();
    let t = tempfile::tempdir().unwrap();
    let a = serve_insecure(&t.path().join("a"));
    write_file(&a.root.join("f.dat"), 11, 30 << 20);
    let dst = t.path().join("f.dat");
    let out = cp_env(
        &[
            "--checkpoint-interval",
            "50ms",
            "--rate",
            "200M",
            &a.url("f.dat"),
            dst.to_str().unwrap(),
        ],
        &[("HAUL_FAULT_EXIT_AFTER", "12M")],
    );
    assert_eq!(out.status.code(), Some(137), "{}", stderr(&out));
    assert!(!dst.exists());
    let out = cp(&["--resume", &a.url("f.dat"), dst.to_str().unwrap()]);
    assert_ok(&out);
    assert_same_file(&a.root.join("f.dat"), &dst);
    assert!(json(&out)["bytes_skipped"].as_u64().unwrap() > 0);
    assert!(partials(t.path()).is_empty());
}

#[test]
fn a_resumed_tree_skips_files_already_complete() {
    let t = tempfile::tempdir().unwrap();
    let a = serve_insecure(&t.path().join("a"));
    let src = t.path().join("tree");
    for i in 0..20u64 {
        write_file(&src.join(format!("f{i}")), i, 100_000);
    }
    assert_ok(&cp(&["-r", src.to_str().unwrap(), &a.url("/")]));
    let out = cp(&["-r", "--resume", src.to_str().unwrap(), &a.url("/")]);
    assert_ok(&out);
    let j = json(&out);
    assert_eq!(j["bytes_moved"], 0, "{j}");
    assert_eq!(j["bytes_skipped"], 2_000_000);
}

#[test]
fn a_stalled_transfer_is_cancelled_and_resumed() {
    common::needs_fault_injection!();
    let t = tempfile::tempdir().unwrap();
    // The source endpoint hangs after 8 MiB, once.
    let a = serve_insecure_env(&t.path().join("a"), &[("HAUL_FAULT_STALL_AFTER", "8M")]);
    write_file(&a.root.join("f.dat"), 12, 20 << 20);
    let dst = t.path().join("f.dat");
    let out = cp(&[
        "--stall-timeout",
        "2s",
        "--checkpoint-interval",
        "100ms",
        &a.url("f.dat"),
        dst.to_str().unwrap(),
    ]);
    assert_ok(&out);
    assert_same_file(&a.root.join("f.dat"), &dst);
    let j = json(&out);
    assert_eq!(j["retries"], 1, "{j}");
    assert!(
        stderr(&out).contains("no data moved for 2 s"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_stall_that_never_ends_fails_with_the_history() {
    common::needs_fault_injection!();
    let t = tempfile::tempdir().unwrap();
    let a = serve_insecure_env(&t.path().join("a"), &[("HAUL_FAULT_STALL_AFTER", "1M")]);
    write_file(&a.root.join("f.dat"), 13, 4 << 20);
    // With no retries, the stall is final.
    let out = cp(&[
        "--retries",
        "0",
        "--stall-timeout",
        "1s",
        &a.url("f.dat"),
        t.path().join("x").to_str().unwrap(),
    ]);
    assert_exit(&out, 8, "no data moved for 1 s");
    assert!(!t.path().join("x").exists());
}

#[test]
fn bad_local_and_remote_paths() {
    let t = tempfile::tempdir().unwrap();
    let a = serve_insecure(&t.path().join("a"));
    let src = t.path().join("f.dat");
    write_file(&src, 1, 1000);
    // Missing sources. Every error also comes as `--json` with its kind.
    let out = cp(&[t.path().join("nope").to_str().unwrap(), &a.url("/")]);
    assert_exit(&out, 3, "no such file");
    assert_kind(&out, "not_found");
    assert_exit(
        &cp(&[
            "--retries",
            "0",
            &a.url("nope"),
            t.path().join("x").to_str().unwrap(),
        ]),
        3,
        "no such file",
    );
    // Escaping the exported root.
    assert_exit(
        &cp(&[src.to_str().unwrap(), &a.url("../outside")]),
        6,
        "'..' is not allowed",
    );
    std::os::unix::fs::symlink(&src, a.root.join("link-out")).unwrap();
    let out = cp(&[&a.url("link-out"), t.path().join("y").to_str().unwrap()]);
    assert_exit(&out, 6, "escapes the exported root");
    assert_kind(&out, "path_escapes_root");
    // Destination not writable: a file where a directory is needed.
    write_file(&a.root.join("plainfile"), 2, 10);
    assert_exit(
        &cp(&[src.to_str().unwrap(), &a.url("plainfile/sub/f")]),
        6,
        "",
    );
    assert_exit(
        &cp(&[src.to_str().unwrap(), &a.url("missing-dir/")]),
        6,
        "does not exist",
    );
    assert!(partials(&a.root).is_empty());
    // Both sides local, unknown scheme, bad flags.
    assert_exit(
        &cp(&[src.to_str().unwrap(), "/tmp/x"]),
        2,
        "one of them must be an endpoint",
    );
    let out = cp(&[src.to_str().unwrap(), "ftp://host/x"]);
    assert_exit(&out, 2, "unsupported URL scheme");
    assert_kind(&out, "invalid");
    let out = haul()
        .args(["cp", "--rate", "fast", "a", "b"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("invalid rate"));
}

#[test]
fn read_only_endpoint_refuses_writes() {
    let t = tempfile::tempdir().unwrap();
    let a = serve(&t.path().join("a"), &["--insecure", "--read-only"], &[]);
    let src = t.path().join("f.dat");
    write_file(&src, 1, 1000);
    let out = cp(&[src.to_str().unwrap(), &a.url("f.dat")]);
    assert_exit(&out, 5, "read-only");
    assert_kind(&out, "permission_denied");
}

#[test]
fn unreachable_host_fails_fast_with_exit_4() {
    let t = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let src = t.path().join("f.dat");
    write_file(&src, 1, 1000);
    let url = format!("haul://127.0.0.1:{port}/f");
    let out = cp(&["--retries", "0", src.to_str().unwrap(), &url]);
    assert_exit(&out, 4, "cannot connect");
    assert_kind(&out, "connect");
    // With retries the final message says what was tried.
    let out = cp(&["--retries", "1", src.to_str().unwrap(), &url]);
    assert_exit(&out, 4, "tried 2 times");
}

#[test]
fn disk_full_leaves_nothing_under_the_final_name() {
    let t = tempfile::tempdir().unwrap();
    let Some(fs) = SmallFs::mount(&t.path().join("small"), "2m") else {
        testkit::skip!("cannot mount a tmpfs (needs root)");
    };
    let a = serve_insecure(&fs.path);
    let src = t.path().join("f.dat");
    write_file(&src, 1, 5 << 20);
    let out = cp(&["--retries", "0", src.to_str().unwrap(), &a.url("f.dat")]);
    assert_exit(&out, 6, "no space left");
    assert_kind(&out, "no_space");
    assert!(!fs.path.join("f.dat").exists());
    assert!(partials(&fs.path).is_empty(), "{:?}", partials(&fs.path));
    // A file that fits still works on the same endpoint.
    let small = t.path().join("s.dat");
    write_file(&small, 2, 100_000);
    assert_ok(&cp(&[small.to_str().unwrap(), &a.url("s.dat")]));
    drop(a);
}

/// Files that each fit the free space but not together: the space check at open lets them
/// in (on tmpfs nothing is preallocated), the file system fills while data arrives, and the
/// failed write ends the copy with the same clean error, exit 6. Every file under its final
/// name is complete; every temporary file left has its restart ledger (none is orphaned), and
/// once space is freed a resume completes the tree.
#[test]
fn disk_filling_up_during_the_copy_fails_cleanly_and_resumes() {
    let t = tempfile::tempdir().unwrap();
    let Some(fs) = SmallFs::mount(&t.path().join("small"), "3m") else {
        testkit::skip!("cannot mount a tmpfs (needs root)");
    };
    let a = serve_insecure(&fs.path);
    let src = t.path().join("tree");
    let names = ["f0.dat", "f1.dat", "f2.dat", "f3.dat"];
    for (i, name) in names.iter().enumerate() {
        write_file(&src.join(name), 10 + i as u64, 700_000);
    }
    // 1.1 MiB stay free: each file fits, not all of them.
    let ballast = fs.path.join("ballast");
    write_file(&ballast, 9, 2_000_000);
    // Into the root, so that the resume lands where the first copy did.
    let url = a.url("/");
    let args = [
        "-r",
        "--retries",
        "0",
        "--concurrency",
        "4",
        src.to_str().unwrap(),
        &url,
    ];
    assert_exit(&cp(&args), 6, "no space left");
    let left = partials(&fs.path);
    // C16: a ledger that could not be written leaves no empty `.tmp` behind.
    assert!(
        !left.iter().any(|p| p.to_string_lossy().ends_with(".tmp")),
        "{left:?}"
    );
    for p in left
        .iter()
        .filter(|p| p.to_string_lossy().ends_with(".haul-part"))
    {
        let ledger = p.to_string_lossy().replace(".haul-part", ".haul-ledger");
        assert!(
            left.iter().any(|l| l.to_string_lossy() == ledger),
            "orphaned {p:?} in {left:?}"
        );
    }
    for name in names {
        let got = fs.path.join("tree").join(name);
        if got.exists() {
            assert_same_file(&src.join(name), &got);
        }
    }
    std::fs::remove_file(&ballast).unwrap();
    let resume = ["-r", "--resume", src.to_str().unwrap(), &url];
    assert_ok(&cp(&resume));
    for name in names {
        assert_same_file(&src.join(name), &fs.path.join("tree").join(name));
    }
    assert!(partials(&fs.path).is_empty(), "{:?}", partials(&fs.path));
    drop(a);
}

/// An endpoint started as root acts, for each session, as the local account the mapfile maps
/// the certificate to: files it creates belong to that account, and it can neither write nor
/// read where the account may not. A subject mapped to an account the host does not have is
/// refused.
#[test]
fn a_root_endpoint_acts_as_the_mapped_account() {
    if transfer::sys::effective_uid() != 0 {
        testkit::skip!("needs root");
    }
    let Some(nobody) = transfer::identity::FsIdentity::lookup("nobody").unwrap() else {
        testkit::skip!("no account nobody");
    };
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let t = tempfile::tempdir().unwrap();
    let mode = |p: &std::path::Path, m: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
    };
    mode(t.path(), 0o755);
    let pki = Pki::new(&t.path().join("pki"));
    let mapfile = t.path().join("mapfile");
    std::fs::write(
        &mapfile,
        "\"/O=longhaul/OU=users/CN=alice\" nobody\n\"/O=longhaul/OU=users/CN=mallory\" no-such-account-here\n",
    )
    .unwrap();
    let mut sargs = pki.serve_args();
    let at = sargs.iter().position(|a| a == "--mapfile").unwrap();
    sargs[at + 1] = mapfile.to_string_lossy().into_owned();
    let sargs: Vec<&str> = sargs.iter().map(String::as_str).collect();
    let root = t.path().join("root");
    let a = serve(&root, &sargs, &[]);
    mode(&root, 0o755);
    let public = root.join("pub");
    std::fs::create_dir(&public).unwrap();
    std::os::unix::fs::chown(&public, Some(nobody.uid), Some(nobody.gid)).unwrap();
    let secret = root.join("secret.dat");
    write_file(&secret, 3, 10_000);
    mode(&secret, 0o600);
    let src = t.path().join("f.dat");
    write_file(&src, 4, 3 << 20);

    // Written as nobody where nobody may write.
    assert_ok(&pki.cp("alice", &[src.to_str().unwrap(), &a.tls_url("pub/f.dat")]));
    let m = std::fs::metadata(public.join("f.dat")).unwrap();
    assert_eq!((m.uid(), m.gid()), (nobody.uid, nobody.gid));
    assert_same_file(&src, &public.join("f.dat"));
    // Not where only root may: nothing is left behind.
    let out = pki.cp("alice", &[src.to_str().unwrap(), &a.tls_url("f.dat")]);
    assert_exit(&out, 5, "ermission denied");
    assert!(!root.join("f.dat").exists());
    assert!(partials(&root).is_empty(), "{:?}", partials(&root));
    // Read back what nobody may read, not what it may not.
    let dl = t.path().join("dl.dat");
    assert_ok(&pki.cp("alice", &[&a.tls_url("pub/f.dat"), dl.to_str().unwrap()]));
    assert_same_file(&src, &dl);
    let denied = t.path().join("secret-copy.dat");
    let out = pki.cp(
        "alice",
        &[&a.tls_url("secret.dat"), denied.to_str().unwrap()],
    );
    assert_exit(&out, 5, "ermission denied");
    assert!(!denied.exists());
    // A tree with a file nobody may not read: that file fails (named in the report, exit code
    // of its cause), the rest arrives. (It was reported as copied before: silently missing.)
    let tree = public.join("tree");
    std::fs::create_dir(&tree).unwrap();
    mode(&tree, 0o755);
    write_file(&tree.join("readable.dat"), 5, 50_000);
    write_file(&tree.join("secret.dat"), 6, 50_000);
    mode(&tree.join("secret.dat"), 0o600);
    let dl_tree = t.path().join("dl-tree");
    let out = pki.cp(
        "alice",
        &["-r", &a.tls_url("pub/tree"), dl_tree.to_str().unwrap()],
    );
    assert_exit(&out, 5, "1 of 3 files failed");
    let report = json(&out);
    assert_eq!(report["files_failed"], 1, "{report}");
    assert!(
        report["failures"].to_string().contains("secret.dat"),
        "{report}"
    );
    assert_same_file(&tree.join("readable.dat"), &dl_tree.join("readable.dat"));
    assert!(!dl_tree.join("secret.dat").exists());
    // A subject mapped to an account this host does not have.
    let out = pki.cp("mallory", &[src.to_str().unwrap(), &a.tls_url("pub/m.dat")]);
    assert_exit(&out, 5, "does not exist");
    drop(a);
}

/// Uploads send clear streams with sendfile unless --no-zero-copy; both give the same file,
/// and the report says which one was used (null when the source was remote).
#[test]
fn zero_copy_can_be_turned_off() {
    let t = tempfile::tempdir().unwrap();
    let a = serve_insecure(&t.path().join("a"));
    let src = t.path().join("f.dat");
    write_file(&src, 21, (5 << 20) + 123);
    let out = cp(&[src.to_str().unwrap(), &a.url("zc.dat")]);
    assert_ok(&out);
    assert_eq!(json(&out)["zero_copy"], true);
    let out = cp(&["--no-zero-copy", src.to_str().unwrap(), &a.url("buf.dat")]);
    assert_ok(&out);
    assert_eq!(json(&out)["zero_copy"], false);
    assert_same_file(&src, &a.root.join("zc.dat"));
    assert_same_file(&src, &a.root.join("buf.dat"));
    let dl = t.path().join("dl.dat");
    let out = cp(&[&a.url("buf.dat"), dl.to_str().unwrap()]);
    assert_ok(&out);
    assert!(json(&out)["zero_copy"].is_null());
    assert_same_file(&src, &dl);
}

#[test]
fn tls_mutual_authentication_and_private_streams() {
    let t = tempfile::tempdir().unwrap();
    let pki = Pki::new(&t.path().join("pki"));
    let a = pki.serve(&t.path().join("a"));
    let b = pki.serve(&t.path().join("b"));
    let src = t.path().join("f.dat");
    write_file(&src, 4, 6 << 20);

    assert_ok(&pki.cp("alice", &[src.to_str().unwrap(), &a.tls_url("f.dat")]));
    assert_same_file(&src, &a.root.join("f.dat"));
    // Private (encrypted) streams, third party and download.
    let out = pki.cp(
        "alice",
        &[
            "--protect",
            "private",
            &a.tls_url("f.dat"),
            &b.tls_url("g.dat"),
        ],
    );
    assert_ok(&out);
    assert_eq!(json(&out)["protect"], "private");
    assert_same_file(&src, &b.root.join("g.dat"));
    let dl = t.path().join("dl.dat");
    assert_ok(&pki.cp(
        "alice",
        &[
            "--protect",
            "private",
            &b.tls_url("g.dat"),
            dl.to_str().unwrap(),
        ],
    ));
    assert_same_file(&src, &dl);

    // Unmapped identity, expired certificate, certificate from another CA.
    assert_exit(
        &pki.cp("mallory", &[src.to_str().unwrap(), &a.tls_url("m")]),
        5,
        "not in this endpoint's mapfile",
    );
    assert_exit(
        &pki.cp("old", &[src.to_str().unwrap(), &a.tls_url("o")]),
        5,
        "expired",
    );
    assert_exit(
        &pki.cp("forged", &[src.to_str().unwrap(), &a.tls_url("o")]),
        5,
        "refused our certificate",
    );
    assert_exit(
        &pki.cp_ca(
            "alice",
            "otherca/ca.pem",
            &[src.to_str().unwrap(), &a.tls_url("o")],
        ),
        5,
        "does not verify against our CA",
    );
    // A plain client against a TLS endpoint, and private without TLS.
    assert_exit(
        &cp(&[src.to_str().unwrap(), &a.url("p")]),
        5,
        "requires TLS",
    );
    assert_exit(
        &cp(&["--protect", "private", src.to_str().unwrap(), &a.url("p")]),
        2,
        "cannot be combined with --insecure",
    );
    for n in ["m", "o", "p"] {
        assert!(!a.root.join(n).exists());
    }
}

#[test]
fn private_is_refused_rather_than_downgraded() {
    // An insecure source endpoint cannot push private streams: the copy fails, nothing is sent in clear.
    let t = tempfile::tempdir().unwrap();
    let pki = Pki::new(&t.path().join("pki"));
    let b = pki.serve(&t.path().join("b"));
    let src = t.path().join("f.dat");
    write_file(&src, 4, 1 << 20);
    assert_ok(&pki.cp("alice", &[src.to_str().unwrap(), &b.tls_url("f.dat")]));
    // A clear data connection to a private session is refused by the endpoint itself.
    let out = pki.cp(
        "alice",
        &[
            "--protect",
            "private",
            &b.tls_url("f.dat"),
            t.path().join("x").to_str().unwrap(),
        ],
    );
    assert_ok(&out);
    assert_eq!(json(&out)["protect"], "private");
}

#[test]
fn garbage_on_the_port_does_not_hurt_the_endpoint() {
    use std::io::{Read, Write};
    let t = tempfile::tempdir().unwrap();
    let a = serve_insecure(&t.path().join("a"));
    let payloads: Vec<Vec<u8>> = vec![
        b"GET / HTTP/1.0\r\n\r\n".to_vec(),
        b"HAULDAT1\x02\xff\xff\xff\xffjunk".to_vec(),
        b"HAULCTL1\x40\x00\x10\x00\x00".to_vec(),
        b"HAULCTL1\x40\x00\x00\x00\x05\xff\xff\xff\xff\xff".to_vec(),
        [b"HAULDAT1".as_slice(), &[0u8; 64]].concat(),
        vec![0x16, 0x03, 0x01, 0xff, 0xff, 1, 2, 3],
        b"HAULCTL1".to_vec(),
    ];
    for p in payloads {
        let mut s = std::net::TcpStream::connect(&a.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = s.write_all(&p);
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
    }
    let src = t.path().join("f.dat");
    write_file(&src, 1, 100_000);
    assert_ok(&cp(&[src.to_str().unwrap(), &a.url("f.dat")]));
}

/// Off a terminal (stderr captured, as in a batch job's log): `--progress always` prints a
/// status line every `--progress-interval`; `auto` and `never` print none; every copy ends
/// with one summary line on stderr.
#[test]
fn off_a_terminal_status_lines_when_asked_and_always_a_summary() {
    let t = tempfile::tempdir().unwrap();
    let a = serve_insecure(&t.path().join("a"));
    let src = t.path().join("f.dat");
    write_file(&src, 3, 8 << 20);
    let copy = |mode: &str, rate: &str, to: &str| {
        haul()
            .args(["cp", "--insecure", "--progress", mode])
            .args(["--progress-interval", "200ms", "--rate", rate])
            .arg(&src)
            .arg(a.url(to))
            .output()
            .unwrap()
    };
    let is_status = |l: &&str| l.starts_with("haul: ") && l.contains(" of 1 file, ");
    let summary = |err: &str| {
        err.lines()
            .find(|l| l.starts_with("8.0 MiB in 1 file, "))
            .map(str::to_string)
            .unwrap_or_else(|| panic!("no summary line: {err}"))
    };

    // 8 MiB at 24 Mbit/s: about 2.8 s, many 200 ms intervals.
    let out = copy("always", "24M", "f.dat");
    assert_ok(&out);
    let err = stderr(&out);
    let status: Vec<&str> = err.lines().filter(is_status).collect();
    assert!(!status.is_empty(), "no status line: {err}");
    for l in &status {
        assert!(
            l.contains(" MiB of 8.0 MiB (") || l.contains(" B of 8.0 MiB ("),
            "{l}"
        );
        assert!(l.contains("bit/s, ETA "), "{l}");
    }
    let last = summary(&err);
    assert!(
        last.contains("(1 stream, ") || last.contains(" streams, "),
        "{last}"
    );
    assert_same_file(&src, &a.root.join("f.dat"));

    for mode in ["auto", "never"] {
        let out = copy(mode, "10G", &format!("{mode}.dat"));
        assert_ok(&out);
        let err = stderr(&out);
        assert_eq!(err.lines().filter(is_status).count(), 0, "{mode}: {err}");
        summary(&err);
    }

    let out = haul()
        .args(["cp", "--insecure", "--progress-interval", "10ms"])
        .arg(&src)
        .arg(a.url("h.dat"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("at least 100ms"), "{}", stderr(&out));
}

#[test]
fn json_error_and_help() {
    let out = haul().args(["help", "cp"]).output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("Examples:") && help.contains("haul cp -r"));
    let out = haul().arg("--help").output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("Exit codes:"));
    let t = tempfile::tempdir().unwrap();
    let out = cp(&[
        t.path().join("missing").to_str().unwrap(),
        "haul://127.0.0.1:1/x",
    ]);
    assert_eq!(json(&out)["exit_code"], 3);
}

/// Completions, manual pages, `--insecure` only where it means something, help that fills a
/// wide terminal with examples that paste as they are.
#[test]
fn completions_man_pages_and_help() {
    let out = haul().args(["completions", "bash"]).output().unwrap();
    assert_ok(&out);
    let bash = String::from_utf8_lossy(&out.stdout);
    assert!(
        bash.contains("_haul") && bash.contains("replicate"),
        "{bash}"
    );
    let out = haul().args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let out = haul().arg("man").output().unwrap();
    assert_ok(&out);
    assert!(String::from_utf8_lossy(&out.stdout).starts_with(".ie"));
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("man1");
    assert_ok(&haul().args(["man", "--dir"]).arg(&dir).output().unwrap());
    for page in [
        "haul.1",
        "haul-cp.1",
        "haul-meta-serve.1",
        "haul-node-drain.1",
    ] {
        let text =
            std::fs::read_to_string(dir.join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(text.contains(".TH"), "{page}: {text}");
    }
    let blocked = t.path().join("file");
    std::fs::write(&blocked, "").unwrap();
    let out = haul()
        .args(["man", "--dir"])
        .arg(blocked.join("x"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));

    // The grid refuses --insecure: its commands and daemons do not offer it.
    for cmd in [&["ls"][..], &["meta", "serve"], &["node", "serve"], &["df"]] {
        let out = haul().args(cmd).arg("--help").output().unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(!help.contains("--insecure"), "{cmd:?}: {help}");
        assert!(help.contains("--cert"), "{cmd:?}: {help}");
    }
    let out = haul().args(["ls", "--insecure", "/"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let help = haul().args(["cp", "--help"]).output().unwrap();
    assert!(String::from_utf8_lossy(&help.stdout).contains("--insecure"));

    // On a 200-column terminal nothing wraps at 100; the examples paste as shell lines.
    let out = haul()
        .args(["node", "serve", "--help"])
        .env("COLUMNS", "200")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.lines().any(|l| l.len() > 100), "{help}");
    assert!(
        help.contains("  haul node serve --meta haul://meta.example.org --site KEK \\\n"),
        "{help}"
    );
}

#[allow(dead_code)]
fn unused(_: &Path) {}

#[test]
fn rate_cap_and_congestion_control_are_applied() {
    let t = tempfile::tempdir().unwrap();
    let a = serve_insecure(&t.path().join("a"));
    let src = t.path().join("f.dat");
    write_file(&src, 21, 10 << 20);
    // 10 MiB at 40 Mbit/s cannot take less than about 2 s.
    let out = cp(&[
        "--rate",
        "40M",
        "--cc",
        "reno",
        src.to_str().unwrap(),
        &a.url("f.dat"),
    ]);
    assert_ok(&out);
    let j = json(&out);
    let secs = j["seconds"].as_f64().unwrap();
    let mbit = j["mbit_per_s"].as_f64().unwrap();
    assert!(secs >= 1.8, "rate cap not honoured: {secs} s");
    assert!(mbit <= 44.0, "{mbit} Mbit/s over a 40 Mbit/s cap");
    assert_eq!(j["congestion"], "reno");
    assert_same_file(&src, &a.root.join("f.dat"));
    // Unknown congestion control is a usage error.
    let out = haul()
        .args(["cp", "--cc", "vegas", "a", "b"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// C15: errors with the right exit code and words. A certificate not valid yet is not called
/// "expired" (the TLS alert has one name for both); a certificate from another CA fails at
/// once with exit 5, in every direction, never as a "broken pipe" retried with exit 4; a
/// destination where no file can be created (in /proc) is exit 6, not "source not found".
#[test]
fn certificate_and_destination_errors_have_their_own_exit_codes() {
    let t = tempfile::tempdir().unwrap();
    let pki = Pki::new(&t.path().join("pki"));
    let out = haul()
        .args([
            "cert",
            "issue",
            "--ca",
            "ca",
            "--user",
            "early",
            "--out",
            "early",
            "--not-before",
            "2090-01-01T00:00:00Z",
            "--not-after",
            "2091-01-01T00:00:00Z",
        ])
        .current_dir(&pki.dir)
        .output()
        .unwrap();
    assert_ok(&out);
    let a = pki.serve(&t.path().join("a"));
    let src = t.path().join("f.dat");
    write_file(&src, 4, 3 << 20);
    assert_ok(&pki.cp("alice", &[src.to_str().unwrap(), &a.tls_url("f.dat")]));
    let early = pki.cp("early", &[src.to_str().unwrap(), &a.tls_url("e")]);
    assert_exit(&early, 5, "not valid before");
    assert!(!stderr(&early).contains("expired"), "{}", stderr(&early));
    assert_exit(
        &pki.cp("old", &[src.to_str().unwrap(), &a.tls_url("o")]),
        5,
        "expired on",
    );
    for (what, args) in [
        (
            "upload",
            vec![src.to_str().unwrap().to_string(), a.tls_url("o")],
        ),
        (
            "download",
            vec![
                a.tls_url("f.dat"),
                t.path().join("d").to_string_lossy().into_owned(),
            ],
        ),
        (
            "tree upload",
            vec![
                "-r".into(),
                a.root.to_string_lossy().into_owned(),
                a.tls_url("t"),
            ],
        ),
    ] {
        let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        let out = pki.cp("forged", &args);
        assert_exit(&out, 5, "refused our certificate");
        assert!(
            !stderr(&out).contains("tried"),
            "{what}: retried: {}",
            stderr(&out)
        );
    }
    let out = pki.cp("alice", &[&a.tls_url("f.dat"), "/proc/"]);
    assert_exit(&out, 6, "/proc/f.dat");
}

/// Log lines of `haul serve` carry their context as spans: the connection (peer and mapped
/// user), the session (its id), the sink, and the data stream; written to a file, without
/// terminal colours.
#[test]
fn serve_logs_carry_connection_session_and_stream_spans() {
    let t = tempfile::tempdir().unwrap();
    let log = t.path().join("serve.log");
    let mut cmd = haul();
    cmd.env("HAUL_LOG", "debug");
    let a = serve_logging(
        cmd,
        "127.0.0.1:0",
        &t.path().join("a"),
        &["--insecure"],
        &[],
        std::fs::File::create(&log).unwrap(),
    );
    let src = t.path().join("f.dat");
    write_file(&src, 3, 3 << 20);
    let out = cp(&["-p", "2", src.to_str().unwrap(), &a.url("f.dat")]);
    assert_ok(&out);
    drop(a);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        !text.contains('\x1b'),
        "colour codes in a log file:\n{text}"
    );
    let line = text
        .lines()
        .find(|l| l.contains("data stream ended"))
        .unwrap_or_else(|| panic!("no stream end logged:\n{text}"));
    for part in [
        "command{name=serve}:connection{peer=127.0.0.1:",
        "user=anonymous}",
        ":session{id=",
        ":sink{owner=",
        ":stream{idx=",
    ] {
        assert!(line.contains(part), "{part:?} missing from {line:?}");
    }
    // Each file's lines are in its own span below the session, whichever thread logs them.
    let line = text
        .lines()
        .find(|l| l.contains("file received"))
        .unwrap_or_else(|| panic!("no received file logged:\n{text}"));
    for part in [":session{id=", ":sink{owner=", ":file{path=f.dat}"] {
        assert!(line.contains(part), "{part:?} missing from {line:?}");
    }
}

/// A grid command pointed at a data endpoint is told what it reached: the endpoint refuses the
/// metadata server's ALPN protocol, recognised by its TLS error type, not by message text.
#[test]
fn a_grid_command_at_a_data_endpoint_says_what_it_reached() {
    let t = tempfile::tempdir().unwrap();
    let pki = Pki::new(&t.path().join("pki"));
    let a = pki.serve(&t.path().join("a"));
    let out = haul()
        .args(["ls", &a.tls_url("/")])
        .env("HAUL_CERT", pki.p("alice.pem"))
        .env("HAUL_KEY", pki.p("alice.key"))
        .env("HAUL_CA", pki.p("ca/ca.pem"))
        .output()
        .unwrap();
    assert_exit(&out, 2, "is a data endpoint, not a metadata server");
}
