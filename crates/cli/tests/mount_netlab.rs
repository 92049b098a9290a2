//! `haul mount` over an emulated long path: a grid in a netlab lab (metadata server and a node
//! in host a0, a node in b0; 60 ms round trip, 400 Mbit/s), mounted in b0 and used by real
//! programs there: `md5sum` of a file larger than the first read-ahead windows, `cp` in
//! (checked by a download), `tar x` of small files, `rsync -a` of a tree in and out, `find`
//! and `ls -lR`. The loopback tests (`mount.rs`) cover the semantics; this one covers the
//! read-ahead, the extent sessions and the uploads where every round trip costs 60 ms.
//!
//! Needs root (network namespaces, FUSE) and a TUN device.

mod common;
#[path = "../../../bench/src/labgrid.rs"]
#[allow(dead_code)]
mod labgrid;

use common::*;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);

/// Runs `script` with bash in `host`, bounded; its stdout, or a panic with what it said.
#[track_caller]
fn sh_in(host: &netlab::Host, script: &str) -> String {
    let mut c = host.command("bash");
    c.args(["-c", script]);
    let out = harness::process::run_bounded(c, LIMIT).expect("bash runs");
    assert!(
        out.ok(),
        "{script}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn md5(path: &Path) -> String {
    let out = Command::new("md5sum").arg(path).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// Unmounts (lazily) when dropped, also when the test fails.
struct Unmount {
    at: std::path::PathBuf,
    proc: harness::process::Proc,
}

impl Unmount {
    fn unmount(&self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(&self.at)
            .stderr(std::process::Stdio::null())
            .status();
    }
}

impl Drop for Unmount {
    fn drop(&mut self) {
        self.unmount();
    }
}

#[test]
fn programs_work_on_a_mount_over_a_long_path() {
    if !testkit::is_root() {
        testkit::skip!("mounting with FUSE needs root");
    }
    if !Path::new("/dev/fuse").exists() {
        testkit::skip!("no /dev/fuse");
    }
    if let Err(why) = netlab::Lab::available() {
        testkit::skip!("netlab cannot run here: {why}");
    }
    let dir = tempfile::tempdir().unwrap();
    let lab = netlab::Lab::builder()
        .site("a", 1)
        .site("b", 1)
        .rate_bps(400_000_000)
        .rtt(Duration::from_millis(60))
        .profile(netlab::Profile::Tuned)
        .seed(17)
        .build()
        .expect("build lab");
    let haul = Path::new(env!("CARGO_BIN_EXE_haul"));
    let g = labgrid::Grid::start(&dir.path().join("grid"), haul, &lab).expect("grid in the lab");
    let (a0, b0) = (lab.host("a", 0), lab.host("b", 0));
    let meta = g.meta_url.clone();
    assert!(g.run(&["mkdir", "/bench"], LIMIT, "mkdir").unwrap().ok());
    // A 40 MiB file at site A (a0's node), read from b0 across the path.
    let big = dir.path().join("big.bin");
    std::fs::write(&big, data(5, 40 << 20)).unwrap();
    let o = g
        .run(
            &["cp", "--progress", "never", "--site", "A"]
                .into_iter()
                .chain([big.to_str().unwrap(), &format!("{meta}/bench/big.bin")])
                .collect::<Vec<_>>(),
            LIMIT,
            "upload",
        )
        .unwrap();
    assert!(o.ok(), "upload: {}", o.why());
    // The mount, in b0, as the user.
    let at = dir.path().join("mnt");
    std::fs::create_dir_all(&at).unwrap();
    let mut c = b0.command(haul);
    c.args(["mount", &format!("{meta}/bench")])
        .arg(&at)
        .args(["--site", "B"])
        .env("HAUL_LOG", "info")
        .current_dir(&g.dir);
    g.pki.as_user(&mut c, "bench");
    let log = dir.path().join("mount.log");
    let (proc, line) = harness::process::Proc::start(c, &log, Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("haul mount: {e}"));
    assert!(line.starts_with("mounted "), "{line}");
    let mut mounted = Unmount {
        at: at.clone(),
        proc,
    };
    let m = at.display().to_string();

    // Read: the bytes, whole, through the read-ahead's extent sessions.
    let sum = sh_in(b0, &format!("md5sum < {m}/big.bin"));
    assert_eq!(sum.split_whitespace().next().unwrap(), md5(&big));
    // Write: cp in; the close uploads to b0's node (site B); a download from a0 matches.
    let out = dir.path().join("out.bin");
    std::fs::write(&out, data(6, 12 << 20)).unwrap();
    sh_in(b0, &format!("cp {} {m}/out.bin", out.display()));
    let back = dir.path().join("back.bin");
    let o = g
        .run(
            &[
                "cp",
                "--progress",
                "never",
                &format!("{meta}/bench/out.bin"),
                back.to_str().unwrap(),
            ],
            LIMIT,
            "download",
        )
        .unwrap();
    assert!(o.ok(), "download: {}", o.why());
    assert_eq!(md5(&back), md5(&out));
    // Small files (each close is an upload of several round trips): a tree of 18 files in
    // three directories, by tar and by rsync.
    let tree = dir.path().join("tree");
    for d in 0..3 {
        std::fs::create_dir_all(tree.join(format!("d{d}"))).unwrap();
        for f in 0..6 {
            std::fs::write(
                tree.join(format!("d{d}/f{f}.txt")),
                data(100 + d * 6 + f, 1000 + (f as usize) * 97),
            )
            .unwrap();
        }
    }
    sh_in(
        b0,
        &format!(
            "tar -C {} -cf {}/tree.tar . && mkdir {m}/untar && tar -C {m}/untar -xf {}/tree.tar",
            tree.display(),
            dir.path().display(),
            dir.path().display()
        ),
    );
    sh_in(b0, &format!("diff -r {} {m}/untar", tree.display()));
    sh_in(b0, &format!("rsync -a {}/ {m}/synced/", tree.display()));
    let again = sh_in(
        b0,
        &format!("rsync -a --itemize-changes {}/ {m}/synced/", tree.display()),
    );
    assert!(
        again.trim().is_empty(),
        "a second rsync sent files again: {again}"
    );
    let copy = dir.path().join("copy");
    sh_in(b0, &format!("rsync -a {m}/synced/ {}/", copy.display()));
    sh_in(
        b0,
        &format!("diff -r {} {}", tree.display(), copy.display()),
    );
    let found = sh_in(b0, &format!("find {m}/synced -type f | wc -l"));
    assert_eq!(found.trim(), "18");
    let listed = sh_in(b0, &format!("ls -lR {m} | grep -c '^-'"));
    assert_eq!(listed.trim(), "38", "18 + 18 files, big.bin and out.bin");
    let _ = a0;

    // umount ends the mount with status 0.
    mounted.unmount();
    let t = std::time::Instant::now();
    let status = loop {
        if let Ok(Some(s)) = mounted.proc.child.try_wait() {
            break Some(s);
        }
        if t.elapsed() > Duration::from_secs(20) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}
