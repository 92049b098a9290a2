//! `haul mount` with real programs: a grid (metadata server and four nodes on loopback) is
//! mounted with FUSE as alice, and `cp`, `cat`, `md5sum -c`, `tar`, `rsync -a`, `find`,
//! `ls -lR`, Python (random writes, xattrs, netCDF4) work on it; errors reach programs as the
//! right errno; a node killed during a read is not seen by the reader; an unreachable metadata
//! server is an error, not a hang; `umount` ends the mount; `kill -9` of the mount loses only
//! the file not yet closed, and the next mount removes its spool.
//!
//! Needs root (mount(2) of /dev/fuse). Every mount is unmounted when its guard drops, also
//! when a test fails.

mod common;
use common::grid::*;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A running `haul mount`; unmounts (lazily, so a dead mount goes too) and stops on drop.
struct Mounted {
    proc: Option<harness::process::Proc>,
    at: PathBuf,
    log: PathBuf,
}

impl Mounted {
    fn start(g: &Grid, user: &str, dir: &str, extra: &[&str]) -> Mounted {
        Self::start_env(g, user, dir, extra, &[])
    }

    fn start_env(g: &Grid, user: &str, dir: &str, extra: &[&str], env: &[(&str, &str)]) -> Mounted {
        let at = tempfile::tempdir_in(g.path()).unwrap().keep();
        let mut args = vec!["mount", dir, at.to_str().unwrap()];
        args.extend_from_slice(extra);
        let mut cmd = g.cmd(user, &args);
        // Its private cache goes with the grid's directory, whatever happens to the mount.
        cmd.env(
            "HAUL_LOG",
            std::env::var("HAUL_MOUNT_TEST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .env("TMPDIR", g.path());
        // A test's own (a log level it reads) wins.
        cmd.envs(env.iter().copied());
        let n = std::fs::read_dir(g.path()).unwrap().count();
        let log = g.path().join(format!("mount{n}.log"));
        let (p, line) = harness::process::Proc::start(cmd, &log, START_TIMEOUT)
            .unwrap_or_else(|e| panic!("haul mount: {e}\n{}", g.logs()));
        assert!(line.starts_with("mounted "), "{line}");
        Mounted {
            proc: Some(p),
            at,
            log,
        }
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.at.join(rel)
    }

    /// Waits up to `limit` for the mount command to end; its status, or `None` if it runs on.
    fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let p = self.proc.as_mut()?;
        let t = Instant::now();
        loop {
            if let Ok(Some(s)) = p.child.try_wait() {
                return Some(s);
            }
            if t.elapsed() >= limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Mounted {
    /// Unmounts; the mount then ends by itself (removing its private cache), or is killed
    /// after 10 s.
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(&self.at)
            .stderr(std::process::Stdio::null())
            .status();
        self.wait_exit(Duration::from_secs(10));
        drop(self.proc.take());
    }
}

fn sh(script: &str) -> std::process::Output {
    let mut c = Command::new("bash");
    c.args(["-c", script]);
    run_bounded(c, CMD_TIMEOUT)
}

#[track_caller]
fn sh_ok(script: &str) -> String {
    let out = sh(script);
    assert!(
        out.status.success(),
        "{script}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        stderr(&out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn python(script: &str) -> std::process::Output {
    let mut c = Command::new("python3");
    c.args(["-c", script]);
    run_bounded(c, CMD_TIMEOUT)
}

/// `path` (in /alice, which must exist) written as alice with `len` bytes of seed `seed`,
/// with a replica at site A: its bytes.
fn at_site_a(g: &Grid, path: &str, seed: u64, len: usize) -> Vec<u8> {
    let local = g.path().join(Path::new(path).file_name().unwrap());
    let body = data(seed, len);
    std::fs::write(&local, &body).unwrap();
    assert_ok(&g.cp(
        "alice",
        &[local.to_str().unwrap(), &g.url(path), "--site", "A"],
    ));
    body
}

/// [`at_site_a`], and a second replica at site B: its bytes, and the nodes holding it at A
/// and at B.
fn at_both_sites(g: &Grid, path: &str, seed: u64, len: usize) -> (Vec<u8>, String, String) {
    let body = at_site_a(g, path, seed, len);
    g.ok(
        "alice",
        &[
            "replicate",
            "--copies",
            "2",
            "--site",
            "B",
            "--progress",
            "never",
            path,
        ],
    );
    let w = g.where_(&[path.to_string()]);
    let holders = live_complete(&w[0], &[]);
    assert_eq!(holders.len(), 2, "{w:?}");
    let at = |site: char| {
        holders
            .iter()
            .find(|(n, _)| n.starts_with(site))
            .map(|(n, _)| n.clone())
            .unwrap_or_else(|| panic!("no replica at site {site}: {w:?}"))
    };
    (body, at('a'), at('b'))
}

/// A Python program run with `script` and one argument, that speaks in lines: each line it
/// prints is one [`Prompted::line`]; where its script reads a line from stdin it waits for
/// [`Prompted::go`]. Killed when dropped.
struct Prompted {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Prompted {
    fn start(script: &str, arg: &Path) -> Prompted {
        let mut child = Command::new("python3")
            .args(["-c", script, arg.to_str().unwrap()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        Prompted { child, lines }
    }

    /// Its next line, or an error if none comes within `limit`.
    fn line(&self, limit: Duration) -> Result<String, std::sync::mpsc::RecvTimeoutError> {
        self.lines.recv_timeout(limit)
    }

    fn go(&mut self) {
        use std::io::Write;
        self.child
            .stdin
            .as_mut()
            .unwrap()
            .write_all(b"go\n")
            .unwrap();
    }
}

impl Drop for Prompted {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The bytes of the grid file `path` (alice's), downloaded with `haul cp`.
fn grid_bytes(g: &Grid, path: &str) -> Vec<u8> {
    let dir = tempfile::tempdir_in(g.path()).unwrap();
    let back = dir.path().join("back");
    assert_ok(&g.cp("alice", &[&g.url(path), back.to_str().unwrap()]));
    std::fs::read(&back).unwrap()
}

fn can_mount() -> bool {
    if !testkit::is_root() {
        testkit::skip("mounting with FUSE needs root");
        return false;
    }
    if !Path::new("/dev/fuse").exists() {
        testkit::skip("no /dev/fuse");
        return false;
    }
    true
}

#[test]
fn programs_read_and_write_the_grid_through_the_mount() {
    if !can_mount() {
        return;
    }
    let g = Grid::start();
    let (src, _files, _paths) = upload_sample(&g);
    let m = Mounted::start(&g, "alice", &g.url("/alice"), &["--site", "A"]);

    // Reads: the tree uploaded with haul cp, read with cat and md5sum -c.
    sh_ok(&format!(
        "cd {} && find . -type f -exec md5sum {{}} + > /tmp/mount-sums.$$ && cd {} && md5sum -c --quiet /tmp/mount-sums.$$; r=$?; rm -f /tmp/mount-sums.$$; exit $r",
        src.display(),
        m.p("tree").display()
    ));
    let big = std::fs::read(src.join("big.bin")).unwrap();
    assert_eq!(std::fs::read(m.p("tree/big.bin")).unwrap(), big);
    // Random reads: only the part asked for.
    let py = python(&format!(
        "f=open('{}','rb'); f.seek(2000001); import sys; sys.stdout.buffer.write(f.read(777))",
        m.p("tree/big.bin").display()
    ));
    assert!(py.status.success(), "{}", stderr(&py));
    assert_eq!(py.stdout, big[2_000_001..2_000_001 + 777]);

    // ls -lR and find see the tree, with alice as owner and the sizes of the files.
    let ls = sh_ok(&format!("ls -lR {}", m.p("tree").display()));
    assert!(ls.contains("big.bin") && ls.contains("sub:"), "{ls}");
    let big_line = ls.lines().find(|l| l.ends_with("big.bin")).unwrap();
    assert!(big_line.contains(&big.len().to_string()), "{big_line}");
    let found = sh_ok(&format!("cd {} && find . | sort", m.p("tree").display()));
    let local = sh_ok(&format!("cd {} && find . | sort", src.display()));
    assert_eq!(found, local);

    // Writes: cp -r a tree in; the grid has it, byte for byte, once each file is closed.
    let (tree2, _) = sample_tree(&g.path().join("second"));
    sh_ok(&format!(
        "cp -r {} {}",
        tree2.display(),
        m.p("copied").display()
    ));
    assert_download_same(&g, "alice", &g.url("/alice/copied"), &tree2, &[]);
    // The grid recorded checksums for what the mount wrote.
    let st = g.json("alice", &["stat", "--json", "/alice/copied/big.bin"]);
    assert!(
        st["entries"][0]["checksum"]
            .as_str()
            .is_some_and(|c| !c.is_empty()),
        "{st}"
    );

    // tar c of the mount, tar x into the mount.
    let untarred = g.path().join("untarred");
    std::fs::create_dir_all(&untarred).unwrap();
    sh_ok(&format!(
        "tar cf - -C {} tree | tar xf - -C {}",
        m.at.display(),
        untarred.display()
    ));
    assert_same_tree(&src, &untarred.join("tree"));
    sh_ok(&format!(
        "mkdir {0} && tar cf - -C {1} . | tar xf - -C {0}",
        m.p("fromtar").display(),
        src.display()
    ));
    assert_download_same(&g, "alice", &g.url("/alice/fromtar"), &src, &[]);

    // rsync -a in (temporary names, renames, times, modes) and out.
    sh_ok(&format!(
        "rsync -a {}/ {}/",
        src.display(),
        m.p("synced").display()
    ));
    assert_download_same(&g, "alice", &g.url("/alice/synced"), &src, &[]);
    let out = g.path().join("rsynced-out");
    let r = sh(&format!(
        "rsync -a {}/ {}/",
        m.p("synced").display(),
        out.display()
    ));
    assert!(
        r.status.success(),
        "rsync out: {}\n{}",
        stderr(&r),
        g.logs()
    );
    assert_same_tree(&src, &out);
    // rsync -a kept modification times: a second run has nothing to send.
    let again = sh_ok(&format!(
        "rsync -a --itemize-changes {}/ {}/",
        src.display(),
        m.p("synced").display()
    ));
    assert!(
        again.lines().all(|l| !l.starts_with(">f")),
        "rsync sent files again: {again}"
    );

    // Rewrites: a new version replaces the old one; random writes go through the spool.
    let f = m.p("copied/small.txt");
    std::fs::write(&f, b"version two\n").unwrap();
    assert_eq!(std::fs::read(&f).unwrap(), b"version two\n");
    let py = python(&format!(
        "f=open('{}','r+b'); f.seek(8); f.write(b'TWO'); f.close()",
        f.display()
    ));
    assert!(py.status.success(), "{}", stderr(&py));
    assert_eq!(grid_bytes(&g, "/alice/copied/small.txt"), b"version TWO\n");
    // Append and truncate.
    sh_ok(&format!("echo more >> {}", f.display()));
    assert_eq!(std::fs::read(&f).unwrap(), b"version TWO\nmore\n");
    sh_ok(&format!("truncate -s 7 {}", f.display()));
    assert_eq!(std::fs::read(&f).unwrap(), b"version");

    // Truncated right after the close that uploaded it: the grid has the truncation.
    sh_ok(&format!(
        "echo hi > {0} && truncate -s 0 {0}",
        m.p("t1").display()
    ));
    let st = g.json("alice", &["stat", "--json", "/alice/t1"]);
    assert_eq!(st["entries"][0]["size"], 0, "{st}");
    // A file open for writing moves with its directory; its close uploads it there.
    sh_ok(&format!(
        "mkdir {0}/od && exec 3>{0}/od/f && echo data >&3 && mv {0}/od {0}/nd && exec 3>&-",
        m.at.display()
    ));
    assert_eq!(grid_bytes(&g, "/alice/nd/f"), b"data\n");

    // Metadata: mkdir, rename, chmod, rmdir, unlink, xattrs.
    std::fs::create_dir(m.p("d1")).unwrap();
    std::fs::write(m.p("d1/x"), b"x").unwrap();
    std::fs::rename(m.p("d1"), m.p("d2")).unwrap();
    assert_eq!(std::fs::read(m.p("d2/x")).unwrap(), b"x");
    assert!(!m.p("d1").exists());
    sh_ok(&format!("chmod 640 {}", m.p("d2/x").display()));
    let st = g.json("alice", &["stat", "--json", "/alice/d2/x"]);
    assert_eq!(st["entries"][0]["mode"], "0640", "{st}");
    let e = std::fs::remove_dir(m.p("d2")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTEMPTY), "{e}");
    std::fs::remove_file(m.p("d2/x")).unwrap();
    std::fs::remove_dir(m.p("d2")).unwrap();
    assert!(
        g.json("alice", &["ls", "--json", "/alice"])["entries"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["path"] != "/alice/d2")
    );
    let py = python(&format!(
        "import os; p='{}'; os.setxattr(p, 'user.project', b'cmip6'); print(os.getxattr(p, 'user.project').decode()); print(os.getxattr(p, 'user.haul.where').decode()); print(sorted(os.listxattr(p)))",
        m.p("tree/big.bin").display()
    ));
    assert!(py.status.success(), "{}", stderr(&py));
    let text = String::from_utf8_lossy(&py.stdout);
    assert!(text.starts_with("cmip6\n"), "{text}");
    assert!(
        text.contains(" complete"),
        "where lists the replicas: {text}"
    );
    assert!(text.contains("'user.project'"), "{text}");
    let x = g.run("alice", &["xattr", "get", "/alice/tree/big.bin", "project"]);
    assert!(
        String::from_utf8_lossy(&x.stdout).contains("cmip6"),
        "{}",
        stderr(&x)
    );

    // statfs from the nodes' capacity (4 nodes of 10G).
    let df = sh_ok(&format!("stat -f -c '%b %S' {}", m.at.display()));
    let mut w = df.split_whitespace().map(|v| v.parse::<u64>().unwrap());
    let (blocks, bsize) = (w.next().unwrap(), w.next().unwrap());
    assert!(blocks * bsize >= 30_000_000_000, "{df}");

    // Errors as errno: missing, not permitted (bob's private directory), not empty.
    let e = std::fs::read(m.p("no-such-file")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
    g.ok("bob", &["mkdir", "/bob"]);
    g.ok("bob", &["chmod", "700", "/bob"]);
    let other = Mounted::start(&g, "alice", &g.url("/"), &[]);
    let e = std::fs::read_dir(other.p("bob")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EACCES), "{e}");
    let e = std::fs::write(other.p("bob/planted"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EACCES), "{e}");
    drop(other);

    // umount ends the mount and the command, with status 0.
    let at = m.at.clone();
    let mut m = m;
    sh_ok(&format!("umount {}", at.display()));
    let status = m
        .wait_exit(Duration::from_secs(20))
        .expect("haul mount did not end");
    assert!(status.success(), "{status:?}");
    assert!(!mount::is_mounted(&at));
}

#[test]
fn a_read_survives_a_node_killed_mid_file_and_a_dead_metadata_server_is_an_error() {
    if !can_mount() {
        return;
    }
    let mut g = Grid::start();
    g.ok("alice", &["mkdir", "/alice"]);
    let (body, first, _) = at_both_sites(&g, "/alice/run042.nc", 42, 24 << 20);

    // Small extents (a 4 MiB window: 1 MiB fetches) so that the read spans many fetches.
    let m = Mounted::start(
        &g,
        "alice",
        &g.url("/alice"),
        &[
            "--site",
            "A",
            "--read-ahead",
            "4M",
            "--meta-timeout",
            "3s",
            "--attr-ttl",
            "0s",
        ],
    );
    let path = m.p("run042.nc");
    let mut f = std::fs::File::open(&path).unwrap();
    let mut got = vec![0u8; body.len()];
    use std::io::Read;
    if let Err(e) = f.read_exact(&mut got[..3 << 20]) {
        panic!("first read: {e}\n{}", g.logs());
    }
    // The site A node the reader reads from dies.
    g.kill_node(&first);
    if let Err(e) = f.read_exact(&mut got[3 << 20..]) {
        panic!("read after {first} died: {e}\n{}", g.logs());
    }
    assert!(got == body, "the data read across the failover differs");
    let log = std::fs::read_to_string(&m.log).unwrap();
    assert!(
        log.contains("reading from another replica") && log.contains(&first),
        "the read did not fail over from {first}: {log}"
    );
    drop(f);

    // The metadata server goes: calls fail with ENOTCONN or ETIMEDOUT, within the deadline.
    g.kill_meta();
    let t = Instant::now();
    let e = std::fs::metadata(m.p("other-file")).unwrap_err();
    assert!(
        matches!(
            e.raw_os_error(),
            Some(libc::ENOTCONN) | Some(libc::ETIMEDOUT)
        ),
        "{e}"
    );
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());

    // SIGTERM (as Ctrl-C) unmounts and ends the command with status 0.
    let mut m = m;
    let pid = m.proc.as_ref().unwrap().child.id();
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let status = m
        .wait_exit(Duration::from_secs(20))
        .expect("haul mount did not end on SIGTERM");
    assert!(status.success(), "{status:?}");
    assert!(!mount::is_mounted(&m.at), "still mounted after SIGTERM");
}

/// The mount's fetches reuse control connections. One the node closes as it is reused (an
/// idle close racing the reuse; here the node's fault injection closes the first reused one
/// unanswered) costs the reader nothing: the fetch is made again on a new connection, and the
/// file's only replica is not given up.
#[test]
fn a_control_connection_closed_as_it_is_reused_is_replaced_not_counted_a_failure() {
    common::needs_fault_injection!();
    if !can_mount() {
        return;
    }
    let mut g = Grid::start();
    g.ok("alice", &["mkdir", "/alice"]);
    let body = at_site_a(&g, "/alice/one.nc", 43, 12 << 20);
    let w = g.where_(&["/alice/one.nc".to_string()]);
    let holders = live_complete(&w[0], &[]);
    assert_eq!(holders.len(), 1, "{w:?}");
    let holder = holders[0].0.clone();
    // The node holding the only replica, started again with the fault.
    let restarted = now_ms();
    g.restart_node_env(&holder, &[("HAUL_FAULT_DROP_REUSED_CONTROL", "1")]);
    g.wait_nodes_up(restarted);

    // 1 MiB fetches, one at a time: each after the first is asked on a reused connection.
    let m = Mounted::start(
        &g,
        "alice",
        &g.url("/alice"),
        &["--site", "A", "--read-ahead", "1M", "--fetch-sessions", "1"],
    );
    let got = std::fs::read(m.p("one.nc"));
    let log = std::fs::read_to_string(&m.log).unwrap_or_default();
    let node_log = std::fs::read_to_string(g.path().join(format!("{holder}.log"))).unwrap();
    assert!(
        node_log.contains("closing a reused control connection unanswered"),
        "the fault never fired: {node_log}"
    );
    let got = got.unwrap_or_else(|e| panic!("read: {e}\n{log}"));
    assert!(got == body, "the data read differs");
    assert!(log.contains("fetching again on a new connection"), "{log}");
    assert!(!log.contains("reading from another replica"), "{log}");
}

/// `kill -9` of the mount with a file open for writing and another being read: both programs
/// get an error, not a hang (the kernel aborts the dead FUSE connection); the file being
/// written never appears in the grid (only a close that uploaded and verified publishes it); a
/// file closed before the kill is whole in the grid; a new mount reads it.
#[test]
fn a_mount_killed_with_sigkill_loses_only_the_file_not_yet_closed() {
    if !can_mount() {
        return;
    }
    use std::io::Read;
    let g = Grid::start();
    g.ok("alice", &["mkdir", "/alice"]);
    let body = at_site_a(&g, "/alice/big.nc", 51, 24 << 20);
    let mut m = Mounted::start(
        &g,
        "alice",
        &g.url("/alice"),
        &["--site", "A", "--read-ahead", "4M"],
    );
    let closed = data(52, 3 << 20);
    std::fs::write(m.p("closed.bin"), &closed).unwrap();
    // The writer is a process of its own: a descriptor of this (multi-threaded) test process
    // would be copied into every child another test forks, and each of those closes is a FUSE
    // flush, which uploads what was written so far (close-to-open, as NFS).
    let mut writer = Prompted::start(
        "import os, sys\n\
         fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)\n\
         os.write(fd, b'x' * (2 << 20))\n\
         print('ready', flush=True)\n\
         sys.stdin.readline()\n\
         try:\n    os.write(fd, b'y' * 65536)\n    os.fsync(fd)\n    print('written', flush=True)\n\
         except OSError as e:\n    print('errno', e.errno, flush=True)\n",
        &m.p("open.bin"),
    );
    let ready = writer.line(Duration::from_secs(30)).unwrap();
    assert_eq!(ready, "ready");
    let mut reading = std::fs::File::open(m.p("big.nc")).unwrap();
    let mut head = vec![0u8; 1 << 20];
    reading.read_exact(&mut head).unwrap();
    assert!(head[..] == body[..1 << 20]);

    let privates = || -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(g.path())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("haul-mount-"))
            .map(|e| e.path())
            .collect();
        v.sort();
        v
    };
    let dead_dir = privates();
    assert_eq!(dead_dir.len(), 1, "{dead_dir:?}");
    let pid = m.proc.as_ref().unwrap().child.id();
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    m.wait_exit(Duration::from_secs(10))
        .expect("the killed mount did not end");

    // Both programs' next calls fail within the deadline instead of hanging.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut rest = vec![0u8; 8 << 20];
        let _ = tx.send(reading.read_exact(&mut rest));
    });
    let r = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("a read on the killed mount hung");
    let r = r.expect_err("a read through a killed mount succeeded");
    assert!(
        matches!(r.raw_os_error(), Some(libc::ENOTCONN) | Some(libc::EIO)),
        "{r}"
    );
    writer.go();
    let said = writer
        .line(Duration::from_secs(30))
        .expect("a write on the killed mount hung");
    assert!(
        said == format!("errno {}", libc::ENOTCONN) || said == format!("errno {}", libc::EIO),
        "the writer said: {said}"
    );
    drop(writer);
    let e = std::fs::metadata(m.p("closed.bin")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTCONN), "{e}");

    // The grid: the open file never appeared; the closed one is whole.
    let out = g.run("alice", &["stat", &g.url("/alice/open.bin")]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(grid_bytes(&g, "/alice/closed.bin") == closed);

    // The dead mount point is unmounted; a new mount reads both files, and removed the dead
    // mount's private directory (the spool of the file never closed).
    drop(m);
    assert!(dead_dir[0].join("spool").exists(), "{dead_dir:?}");
    let m2 = Mounted::start(&g, "alice", &g.url("/alice"), &["--site", "A"]);
    assert!(std::fs::read(m2.p("closed.bin")).unwrap() == closed);
    assert!(std::fs::read(m2.p("big.nc")).unwrap() == body);
    assert!(!m2.p("open.bin").exists());
    let now = privates();
    assert!(!now.contains(&dead_dir[0]), "{now:?}");
    assert_eq!(now.len(), 1, "{now:?}");
    drop(m2);

    // A cache directory in use by a running mount is refused to a second one (exit 6), which
    // would otherwise clear the first one's spools; free again once the first has gone.
    let cache = g.path().join("shared-cache");
    let cache_arg = ["--site", "A", "--cache", cache.to_str().unwrap()];
    let first = Mounted::start(&g, "alice", &g.url("/alice"), &cache_arg);
    let at = tempfile::tempdir_in(g.path()).unwrap();
    let url = g.url("/alice");
    let mut args = vec!["mount", url.as_str(), at.path().to_str().unwrap()];
    args.extend_from_slice(&cache_arg);
    let out = run_bounded(g.cmd("alice", &args), CMD_TIMEOUT);
    assert_eq!(out.status.code(), Some(6), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("another haul mount is using it"),
        "{}",
        stderr(&out)
    );
    drop(first);
    let again = Mounted::start(&g, "alice", &g.url("/alice"), &cache_arg);
    assert!(std::fs::read(again.p("closed.bin")).unwrap() == closed);
}

/// A file unlinked, or renamed, while its close uploads it: the copy the upload made under
/// the old name does not stay there (a rename ends with the file under the new name only).
/// Each mount's upload stalls once after 1 MiB (fault injection) until `--stall-timeout`
/// retries it, which holds the close open while the name changes.
#[test]
fn a_file_unlinked_or_renamed_while_its_close_uploads_is_not_left_at_the_old_name() {
    common::needs_fault_injection!();
    if !can_mount() {
        return;
    }
    let g = Grid::start();
    g.ok("alice", &["mkdir", "/alice"]);
    let local = g.path().join("out.nc");
    let body = data(61, 8 << 20);
    std::fs::write(&local, &body).unwrap();
    let stat_code = |p: &str| g.run("alice", &["stat", &g.url(p)]).status.code();
    for renamed in [false, true] {
        let m = Mounted::start_env(
            &g,
            "alice",
            &g.url("/alice"),
            &["--site", "A", "--stall-timeout", "3s", "--attr-ttl", "0s"],
            &[("HAUL_FAULT_STALL_AFTER", "1M")],
        );
        let name = if renamed { "b.nc" } else { "a.nc" };
        let mut cp = Command::new("cp")
            .arg(&local)
            .arg(m.p(name))
            .spawn()
            .unwrap();
        // The close is uploading (and stalled) by now.
        std::thread::sleep(Duration::from_millis(1000));
        assert!(
            cp.try_wait().unwrap().is_none(),
            "the close ended before the name changed: {}",
            std::fs::read_to_string(&m.log).unwrap_or_default()
        );
        if renamed {
            std::fs::rename(m.p(name), m.p("c.nc")).unwrap();
        } else {
            std::fs::remove_file(m.p(name)).unwrap();
        }
        let status = cp.wait().unwrap();
        assert!(status.success(), "cp: {status:?}");
        let log = std::fs::read_to_string(&m.log).unwrap_or_default();
        assert_eq!(stat_code(&format!("/alice/{name}")), Some(3), "{log}");
        assert!(!m.p(name).exists(), "{log}");
        if renamed {
            assert!(grid_bytes(&g, "/alice/c.nc") == body, "{log}");
        }
    }
}

/// The spool records each block's CRC as a program writes it, and the close's upload sends the
/// blocks so recorded without reading the spool again to checksum them; a block rewritten
/// below the end (a header, as netCDF writers do at close) is read and checksummed at the
/// upload instead. Either way the grid gets exactly the bytes written.
#[test]
fn a_file_written_in_order_is_sent_with_the_crcs_recorded_as_it_was_written() {
    if !can_mount() {
        return;
    }
    let g = Grid::start();
    g.ok("alice", &["mkdir", "/alice"]);
    // The record is of writes that come through the mount (passed through, the kernel
    // writes the spool itself).
    let m = Mounted::start_env(
        &g,
        "alice",
        &g.url("/alice"),
        &["--site", "A", "--no-passthrough"],
        &[("HAUL_LOG", "info,mount=debug")],
    );
    // Six blocks of the default 1 MiB, the last one short.
    let body = data(71, (5 << 20) + 1234);
    let local = g.path().join("ordered.local");
    std::fs::write(&local, &body).unwrap();
    sh_ok(&format!(
        "dd if={} of={} bs=256k status=none",
        local.display(),
        m.p("ordered.bin").display()
    ));
    let py = python(&format!(
        "f=open('{}','wb'); f.write(open('{}','rb').read()); f.flush(); f.seek(100); f.write(b'X'*50); f.close()",
        m.p("headed.bin").display(),
        local.display()
    ));
    assert!(py.status.success(), "{}", stderr(&py));
    let mut headed = body.clone();
    headed[100..150].fill(b'X');

    let log = std::fs::read_to_string(&m.log).unwrap_or_default();
    let uploaded = |name: &str| {
        // The last: the close's (a create may upload the empty file first).
        log.lines()
            .rfind(|l| l.contains("uploaded") && l.contains(&format!("/alice/{name} ")))
            .unwrap_or_else(|| panic!("no upload of {name} logged: {log}"))
            .to_string()
    };
    let line = uploaded("ordered.bin");
    assert!(
        line.contains("blocks_recorded=6 blocks_unrecorded=0 blocks_unread=6"),
        "{line}"
    );
    let line = uploaded("headed.bin");
    assert!(
        line.contains("blocks_recorded=5 blocks_unrecorded=1 blocks_unread=5"),
        "{line}"
    );
    for (name, want) in [("ordered.bin", &body), ("headed.bin", &headed)] {
        assert!(
            grid_bytes(&g, &format!("/alice/{name}")) == *want,
            "{name} differs"
        );
    }
}

/// A spool whose bytes change behind the mount's back (another process of the user, a
/// failing disk) no longer matches the CRCs recorded as the program wrote it: the close fails
/// with EIO and the grid does not take bytes the program never wrote.
#[test]
fn a_spool_changed_behind_the_mounts_back_is_not_uploaded() {
    if !can_mount() {
        return;
    }
    let g = Grid::start();
    g.ok("alice", &["mkdir", "/alice"]);
    // Only writes that come through the mount are recorded.
    let m = Mounted::start(
        &g,
        "alice",
        &g.url("/alice"),
        &["--site", "A", "--no-passthrough"],
    );
    // A byte changed in place (caught by the block's recorded CRC), and bytes appended (the
    // spool no longer has the size written).
    for (i, appended) in [false, true].into_iter().enumerate() {
        let name = format!("w{i}.bin");
        let mut writer = Prompted::start(
            "import sys, errno\n\
             f = open(sys.argv[1], 'wb'); f.write(b'\\x07' * (3 << 20)); f.flush()\n\
             print('ready', flush=True)\n\
             sys.stdin.readline()\n\
             try:\n    f.close(); print('closed', flush=True)\n\
             except OSError as e:\n    print(errno.errorcode.get(e.errno, str(e.errno)), flush=True)\n",
            &m.p(&name),
        );
        let ready = writer.line(Duration::from_secs(60)).unwrap();
        assert_eq!(ready, "ready");
        let spools: Vec<PathBuf> = walk(g.path())
            .into_iter()
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("spool-"))
            })
            .collect();
        assert_eq!(spools.len(), 1, "{spools:?}");
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&spools[0])
            .unwrap();
        let at = if appended { 3 << 20 } else { (1 << 20) + 5 };
        std::os::unix::fs::FileExt::write_all_at(&f, b"\x08", at).unwrap();
        drop(f);
        writer.go();
        let out = writer.line(Duration::from_secs(120));
        let log = std::fs::read_to_string(&m.log).unwrap_or_default();
        assert_eq!(out.as_deref(), Ok("EIO"), "{log}");
        assert!(
            log.lines()
                .any(|l| l.contains(&name) && l.contains("changed since it was written")),
            "the log does not say why: {log}"
        );
        // The grid has no version with the changed bytes (the empty file the create made at
        // most).
        let st = g.run(
            "alice",
            &["stat", "--json", &g.url(&format!("/alice/{name}"))],
        );
        if st.status.success() {
            let j: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
            assert_eq!(j["entries"][0]["size"], 0, "{j}");
        } else {
            assert_eq!(st.status.code(), Some(3), "{log}");
        }
    }
}

#[test]
fn python_reads_a_netcdf_file_through_the_mount() {
    if !can_mount() {
        return;
    }
    if !python("import netCDF4").status.success() {
        testkit::skip("Python's netCDF4 is not installed (scripts/test.sh installs it)");
        return;
    }
    let g = Grid::start();
    g.ok("alice", &["mkdir", "/alice"]);
    let m = Mounted::start(&g, "alice", &g.url("/alice"), &[]);
    // Written through the mount by netCDF4 itself (HDF5 writes at random offsets), then
    // read back by a fresh mount, as another job would.
    let nc = m.p("tas.nc");
    let py = python(&format!(
        "import netCDF4, numpy as np
d = netCDF4.Dataset('{}', 'w')
d.createDimension('time', 12); d.createDimension('lat', 90); d.createDimension('lon', 180)
v = d.createVariable('tas', 'f4', ('time', 'lat', 'lon'), chunksizes=(1, 90, 180))
v.units = 'K'
v[:] = np.arange(12*90*180, dtype='f4').reshape(12, 90, 180)
d.close()",
        nc.display()
    ));
    assert!(py.status.success(), "{}", stderr(&py));
    drop(m);
    let m = Mounted::start(&g, "alice", &g.url("/alice"), &[]);
    let py = python(&format!(
        "import netCDF4
d = netCDF4.Dataset('{}')
v = d.variables['tas']
print(v.units, v.shape, float(v[7, 45, 90]))",
        m.p("tas.nc").display()
    ));
    assert!(py.status.success(), "{}", stderr(&py));
    let want = (7 * 90 * 180 + 45 * 180 + 90) as f64;
    assert_eq!(
        String::from_utf8_lossy(&py.stdout).trim(),
        format!("K (12, 90, 180) {want:?}")
    );
}

/// A netCDF/HDF5 reader reads a header and a chunk: only those parts of the file cross the
/// network (with the bounded read-ahead), and a persistent cache holds them.
#[test]
fn a_random_read_fetches_only_its_part_of_the_file() {
    if !can_mount() {
        return;
    }
    let g = Grid::start();
    g.ok("alice", &["mkdir", "/alice"]);
    let local = g.path().join("f.bin");
    let body = data(7, 32 << 20);
    std::fs::write(&local, &body).unwrap();
    assert_ok(&g.cp("alice", &[local.to_str().unwrap(), &g.url("/alice/f.bin")]));
    let cache = g.path().join("cachedir");
    let m = Mounted::start(
        &g,
        "alice",
        &g.url("/alice"),
        &["--cache", cache.to_str().unwrap()],
    );
    let at = 20_000_000;
    let py = python(&format!(
        "f=open('{}','rb'); f.seek({at}); import sys; sys.stdout.buffer.write(f.read(10))",
        m.p("f.bin").display()
    ));
    assert!(py.status.success(), "{}", stderr(&py));
    assert_eq!(py.stdout, body[at..at + 10]);
    // Fetches still running (their part files) end first.
    let files = cache.join("files");
    let in_flight = || {
        std::fs::read_dir(&files).unwrap().any(|d| {
            std::fs::read_dir(d.unwrap().path())
                .unwrap()
                .any(|e| e.unwrap().file_name().to_string_lossy().starts_with('.'))
        })
    };
    assert!(
        wait_for(Duration::from_secs(20), || {
            let busy = in_flight();
            if busy {
                std::thread::sleep(Duration::from_millis(100));
            }
            !busy
        }),
        "fetches did not end"
    );
    let mut cached = 0;
    for (_, s, t) in cached_extents(&cache) {
        assert!(
            s <= at as u64 + (4 << 20) && t + (4 << 20) >= at as u64,
            "{s}-{t} is far from the read"
        );
        cached += t - s;
    }
    // The 10 bytes and the bounded read-ahead (where the kernel reads a large file through
    // its page cache, its own 1 MiB read-ahead on top, which looks sequential): a few MiB of
    // the 32.
    assert!(
        cached > 0 && cached <= 4 << 20,
        "{cached} bytes fetched for a 10-byte read"
    );
    // A large file (read with direct I/O) can still be mapped: mmap reads see its bytes.
    let py = python(&format!(
        "import mmap, sys; f=open('{}','rb'); m=mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
sys.stdout.buffer.write(m[{at}:{at}+10] + m[-10:])",
        m.p("f.bin").display()
    ));
    assert!(py.status.success(), "{}", stderr(&py));
    assert_eq!(
        py.stdout,
        [&body[at..at + 10], &body[body.len() - 10..]].concat()
    );
}

/// The extents in a `--cache` directory with no fetch running: (size of the file it holds,
/// from the second field of its key; start; end) of each. Every entry must be an extent
/// file named START-END holding exactly its bytes.
fn cached_extents(cache: &Path) -> Vec<(u64, u64, u64)> {
    let mut out = Vec::new();
    for d in std::fs::read_dir(cache.join("files")).unwrap() {
        let d = d.unwrap();
        let key = d.file_name().to_string_lossy().into_owned();
        let size: u64 = key.split('-').nth(1).unwrap().parse().unwrap();
        for e in std::fs::read_dir(d.path()).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            let (s, t) = name.split_once('-').unwrap();
            let (s, t): (u64, u64) = (s.parse().unwrap(), t.parse().unwrap());
            assert_eq!(e.metadata().unwrap().len(), t - s, "{name}");
            out.push((size, s, t));
        }
    }
    out
}

/// A file larger than the cache, read through: the extents its reader has passed leave the
/// cache at once (drop-behind), so it holds little more than the read-ahead of it and what
/// another file had cached stays (without drop-behind, that file's cold extents are the first
/// evicted). Read through again, the file is fetched again, whole and right.
#[test]
fn a_file_larger_than_the_cache_read_through_leaves_the_cache_to_the_others() {
    if !can_mount() {
        return;
    }
    let g = Grid::start();
    g.ok("alice", &["mkdir", "/alice"]);
    let (small, big) = (data(3, 1 << 20), data(4, 48 << 20));
    for (name, body) in [("small.bin", &small), ("big.bin", &big)] {
        let local = g.path().join(name);
        std::fs::write(&local, body).unwrap();
        assert_ok(&g.cp(
            "alice",
            &[local.to_str().unwrap(), &g.url(&format!("/alice/{name}"))],
        ));
    }
    let cache = g.path().join("cachedir");
    let m = Mounted::start(
        &g,
        "alice",
        &g.url("/alice"),
        &[
            "--cache",
            cache.to_str().unwrap(),
            "--cache-size",
            "16M",
            "--read-ahead",
            "4M",
        ],
    );
    assert!(std::fs::read(m.p("small.bin")).unwrap() == small);
    let small_cached = || {
        cached_extents(&cache)
            .iter()
            .filter(|(size, _, _)| *size == small.len() as u64)
            .map(|(_, s, t)| t - s)
            .sum::<u64>()
    };
    assert_eq!(small_cached(), small.len() as u64);
    for round in 0..2 {
        // `cat`, as a program reading it through does (128 KiB reads).
        let out = sh(&format!(
            "cat {} | cmp - {}",
            m.p("big.bin").display(),
            g.path().join("big.bin").display()
        ));
        assert!(out.status.success(), "round {round}: {}", stderr(&out));
        assert_eq!(
            small_cached(),
            small.len() as u64,
            "round {round}: the small file was evicted"
        );
        // What stays of the big file: about its last read-ahead (4 MiB), not the cache's 16.
        let big_cached: u64 = cached_extents(&cache)
            .iter()
            .filter(|(size, _, _)| *size == big.len() as u64)
            .map(|(_, s, t)| t - s)
            .sum();
        assert!(
            big_cached <= 6 << 20,
            "round {round}: {big_cached} bytes of the big file stay cached"
        );
    }
}

/// A replica damaged on the node's disk (its size kept, so only a checksum can tell) and read
/// through the mount in several extents: the program reading it through gets EIO (here `cat`
/// fails), not a silent exit 0, and the damaged data does not stay in the cache; an intact file
/// read the same way passes the same check.
#[test]
fn a_damaged_replica_read_in_extents_ends_in_eio_not_in_silence() {
    if !can_mount() {
        return;
    }
    let g = Grid::start();
    g.ok("alice", &["mkdir", "/alice"]);
    let local = g.path().join("tas.nc");
    std::fs::write(&local, data(11, 24 << 20)).unwrap();
    for name in ["tas.nc", "intact.nc", "tas2.nc"] {
        assert_ok(&g.cp(
            "alice",
            &[
                local.to_str().unwrap(),
                &g.url(&format!("/alice/{name}")),
                "--site",
                "A",
            ],
        ));
    }
    let holders = g.replica_states("/alice/tas.nc");
    assert_eq!(holders.len(), 1, "{holders:?}");
    g.damage_replica(&holders[0].0, "/alice/tas.nc");
    let holders2 = g.replica_states("/alice/tas2.nc");
    g.damage_replica(&holders2[0].0, "/alice/tas2.nc");
    let cache = g.path().join("cachedir");
    let m = Mounted::start(
        &g,
        "alice",
        &g.url("/alice"),
        &["--cache", cache.to_str().unwrap()],
    );
    let ok = sh(&format!(
        "cmp {} {}",
        m.p("intact.nc").display(),
        local.display()
    ));
    assert!(ok.status.success(), "intact file: {}", stderr(&ok));
    // A header read first (`head`, as `ncdump -h` would): the file is closed with its first
    // extent cached, and the `cat` after it still checks the whole file.
    let head = sh(&format!(
        "head -c 1000 {} > /dev/null",
        m.p("tas.nc").display()
    ));
    assert!(head.status.success(), "{}", stderr(&head));
    let out = sh(&format!("cat {} > /dev/null", m.p("tas.nc").display()));
    assert!(
        !out.status.success(),
        "cat of a damaged replica exited 0\n{}",
        std::fs::read_to_string(&m.log).unwrap_or_default()
    );
    assert!(
        stderr(&out).contains("Input/output error"),
        "{}",
        stderr(&out)
    );
    let log = std::fs::read_to_string(&m.log).unwrap_or_default();
    assert!(
        log.contains("does not match the catalog's checksum") && log.contains("/alice/tas.nc"),
        "{log}"
    );
    // The mount asked the metadata server to verify the file where its replica lies: the
    // node found the damage and the catalog records it (one replica: nothing to repair from).
    let t = Instant::now();
    loop {
        let states = g.replica_states("/alice/tas.nc");
        if states.iter().any(|(_, s)| s == "damaged") {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the damaged replica was not reported: {states:?}\n{}",
            std::fs::read_to_string(&m.log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // With no good copy left, a download says the data is damaged (exit 7), not that the
    // grid is unreachable (4).
    let out = g.cp(
        "alice",
        &[
            &g.url("/alice/tas.nc"),
            g.path().join("tas.back").to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    assert!(!g.path().join("tas.back").exists());
    // Nothing of the damaged file stays cached: only the intact file's extents remain.
    let dirs: Vec<_> = std::fs::read_dir(cache.join("files"))
        .unwrap()
        .map(|d| d.unwrap().path())
        .filter(|d| std::fs::read_dir(d).unwrap().next().is_some())
        .collect();
    assert_eq!(
        dirs.len(),
        1,
        "cache holds more than the intact file: {dirs:?}"
    );
    drop(m);
    // The same through a cache a third of the file's size: the extents read first are gone
    // before the last arrives, and the check still holds.
    let m = Mounted::start(
        &g,
        "alice",
        &g.url("/alice"),
        &["--cache-size", "8M", "--read-ahead", "8M"],
    );
    let ok = sh(&format!(
        "cmp {} {}",
        m.p("intact.nc").display(),
        local.display()
    ));
    assert!(
        ok.status.success(),
        "intact file, small cache: {}",
        stderr(&ok)
    );
    // Known damaged now: the open itself fails with EIO.
    let out = sh(&format!("cat {} > /dev/null", m.p("tas.nc").display()));
    assert!(
        !out.status.success() && stderr(&out).contains("Input/output error"),
        "cat of a file known to be damaged: {}",
        stderr(&out)
    );
    // A second damaged file, not yet known: the check through the small cache finds it.
    let out = sh(&format!("cat {} > /dev/null", m.p("tas2.nc").display()));
    assert!(
        !out.status.success() && stderr(&out).contains("Input/output error"),
        "cat of a damaged replica through a small cache: {}\n{}",
        stderr(&out),
        std::fs::read_to_string(&m.log).unwrap_or_default()
    );
    let log = std::fs::read_to_string(&m.log).unwrap_or_default();
    assert!(
        log.contains("does not match the catalog's checksum") && log.contains("/alice/tas2.nc"),
        "{log}"
    );
}

/// Data read again after the whole file passed its checksum (evicted from a small cache, then
/// fetched anew from another replica) is checked against what passed: a damaged second replica
/// ends the re-read in EIO, never in other bytes.
#[test]
fn data_fetched_again_from_a_damaged_replica_is_not_given_to_the_reader() {
    if !can_mount() {
        return;
    }
    let mut g = Grid::start();
    g.ok("alice", &["mkdir", "/alice"]);
    let (body, a, b) = at_both_sites(&g, "/alice/pr.nc", 71, 24 << 20);
    g.damage_replica(&b, "/alice/pr.nc");
    let m = Mounted::start(
        &g,
        "alice",
        &g.url("/alice"),
        &["--site", "A", "--cache-size", "8M", "--read-ahead", "4M"],
    );
    // Reads the file through (from the good replica at site A: it passes the checksum), says
    // so, waits, then reads its first 2 MB again.
    let mut reader = Prompted::start(
        "import sys\n\
         f = open(sys.argv[1], 'rb', buffering=0)\n\
         whole = f.read()\n\
         print('read', len(whole), flush=True)\n\
         sys.stdin.readline()\n\
         f.seek(0)\n\
         try:\n    again = f.read(2000000)\n    print('same' if again == whole[:2000000] else 'DIFFERENT', flush=True)\n\
         except OSError as e:\n    print('errno', e.errno, flush=True)\n",
        &m.p("pr.nc"),
    );
    let first = reader.line(Duration::from_secs(60)).unwrap();
    assert_eq!(first, format!("read {}", body.len()));
    // The good replica's node dies: the re-read can only come from the damaged one.
    g.kill_node(&a);
    reader.go();
    let said = reader.line(Duration::from_secs(60)).unwrap();
    let log = std::fs::read_to_string(&m.log).unwrap_or_default();
    assert_eq!(said, format!("errno {}", libc::EIO), "{log}");
    assert!(
        log.contains("data fetched again differs") && log.contains(&b),
        "{log}"
    );
}

/// The other way round: the replica read first is the damaged one, and it goes before the file
/// was checked whole. Data fetched again from the good replica differs from what was read
/// first, but which copy is damaged is not known yet: the good replica is not failed, and the
/// program reads good bytes to the end.
#[test]
fn data_fetched_again_before_the_file_is_checked_does_not_fail_the_good_replica() {
    if !can_mount() {
        return;
    }
    let mut g = Grid::start();
    g.ok("alice", &["mkdir", "/alice"]);
    let (body, a, _) = at_both_sites(&g, "/alice/ua.nc", 72, 24 << 20);
    g.damage_replica(&a, "/alice/ua.nc");
    let m = Mounted::start(
        &g,
        "alice",
        &g.url("/alice"),
        &["--site", "A", "--cache-size", "8M", "--read-ahead", "4M"],
    );
    // Reads 12 MB (from the damaged replica at site A), says so, waits, then reads the file
    // from its start to its end.
    let mut reader = Command::new("python3")
        .args([
            "-c",
            "import sys\n\
             f = open(sys.argv[1], 'rb', buffering=0)\n\
             part = f.read(12 << 20)\n\
             print('read', len(part), flush=True)\n\
             sys.stdin.readline()\n\
             f.seek(0)\n\
             try:\n    whole = f.read()\n    print('whole', len(whole), flush=True)\n    sys.stdout.buffer.write(whole)\n    sys.stdout.flush()\n\
             except OSError as e:\n    print('errno', e.errno, flush=True)\n",
            m.p("ua.nc").to_str().unwrap(),
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(reader.stdout.take().unwrap());
    use std::io::{BufRead, Read, Write};
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), format!("read {}", 12 << 20));
    // The damaged replica's node dies before the file was read whole.
    g.kill_node(&a);
    reader.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    let log = std::fs::read_to_string(&m.log).unwrap_or_default();
    assert_eq!(line.trim(), format!("whole {}", body.len()), "{log}");
    let mut got = Vec::new();
    out.read_to_end(&mut got).unwrap();
    assert!(got == body, "the bytes read differ");
    let _ = reader.wait();
}

/// The File System eXerciser (`fsx`, from crates.io; scripts/test.sh installs it), or `None`.
fn fsx() -> Option<PathBuf> {
    let local = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/tools/bin/fsx");
    let found = std::env::var_os("HAUL_FSX")
        .map(PathBuf::from)
        .or_else(|| local.exists().then_some(local))
        .unwrap_or_else(|| PathBuf::from("fsx"));
    let ok = Command::new(&found)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    ok.then_some(found)
}

/// Runs fsx's seeded sequence of operations on `file`: reads and writes with pread/pwrite and
/// through mmap, truncates, fsyncs, and closes and reopens (each close uploads the file, each
/// reopen for writing reads it back from the grid); every read is checked against fsx's model.
fn run_fsx(fsx: &Path, config: &Path, file: &Path, ops: u32) -> std::process::Output {
    let art = file.with_extension("artifacts");
    std::fs::create_dir_all(&art).ok();
    let mut c = Command::new(fsx);
    c.arg("-f")
        .arg(config)
        .args(["-S", "1717", "-N", &ops.to_string(), "-q", "-P"])
        .arg(&art)
        .arg(file);
    run_bounded(c, Duration::from_secs(300))
}

/// fsx, the stress tool of the file systems' own test suites, finds the mount's file
/// semantics those of a local file: the same seeded run on the mount and on a local file ends
/// with the same bytes, read back through a fresh mount (the read path, not the spool).
#[test]
fn fsx_finds_the_mount_behaving_as_a_local_file() {
    if !can_mount() {
        return;
    }
    let Some(fsx) = fsx() else {
        testkit::skip("fsx is not installed (scripts/test.sh installs it with cargo install)");
        return;
    };
    let g = Grid::start();
    g.ok("alice", &["mkdir", "/alice"]);
    // Files up to 4 MiB (extents of several sizes), operations up to 256 KiB; every kind of
    // operation the mount claims: pread/pwrite, mmap reads and writes with msync, ftruncate,
    // fsync, fdatasync, close-and-reopen. (fallocate and hole punching are not claimed.)
    let config = g.path().join("fsx.toml");
    std::fs::write(
        &config,
        "flen = 4194304
[opsize]
max = 262144
[weights]
close_open = 2
read = 10
write = 10
mapread = 5
mapwrite = 5
invalidate = 1
truncate = 2
fsync = 1
fdatasync = 1
",
    )
    .unwrap();
    let ops = 1500;
    let local = g.path().join("fsx-local.bin");
    let out = run_fsx(&fsx, &config, &local, ops);
    assert!(
        out.status.success(),
        "fsx on a local file: {}",
        stderr(&out)
    );
    // Spools passed through the kernel (where it can) and written through the mount.
    for (name, args) in [
        ("fsx.bin", &[][..]),
        ("fsx-nopt.bin", &["--no-passthrough"][..]),
    ] {
        let m = Mounted::start(&g, "alice", &g.url("/alice"), args);
        let out = run_fsx(&fsx, &config, &m.p(name), ops);
        assert!(
            out.status.success(),
            "fsx on the mount {args:?}: {}{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            stderr(&out),
            std::fs::read_to_string(&m.log).unwrap_or_default()
        );
        drop(m);
        let m = Mounted::start(&g, "alice", &g.url("/alice"), &[]);
        let want = std::fs::read(&local).unwrap();
        let got = std::fs::read(m.p(name)).unwrap();
        assert_eq!(got.len(), want.len(), "the size after fsx {args:?}");
        assert!(
            got == want,
            "the bytes after fsx {args:?} differ from a local file's"
        );
    }
}

/// Passthrough (the kernel writes the spool itself; root on Linux 6.13): files written,
/// rewritten, synced and rewritten in place reach the grid whole; a file open for reading
/// meanwhile is written through the mount instead (the kernel would refuse passthrough);
/// a reader of a file being written reads what was written; a file opened for writing and not
/// written is not uploaded; a rewrite with O_TRUNC neither fetches the old file first nor
/// makes an empty version.
#[test]
fn writes_passed_through_the_kernel_reach_the_grid_whole() {
    if !can_mount() {
        return;
    }
    let g = Grid::start();
    g.ok("alice", &["mkdir", "/alice"]);
    let m = Mounted::start_env(
        &g,
        "alice",
        &g.url("/alice"),
        &["--site", "A"],
        &[("HAUL_LOG", "info,mount=debug")],
    );
    let log = || std::fs::read_to_string(&m.log).unwrap_or_default();
    let uploads = |name: &str| -> Vec<String> {
        log()
            .lines()
            .filter(|l| l.contains("uploaded") && l.contains(&format!("/alice/{name} ")))
            .map(str::to_string)
            .collect()
    };
    let in_grid = |name: &str| grid_bytes(&g, &format!("/alice/{name}"));

    // Written by dd: passed through.
    let body = data(81, (3 << 20) + 77);
    let local = g.path().join("a.local");
    std::fs::write(&local, &body).unwrap();
    sh_ok(&format!(
        "dd if={} of={} bs=256k status=none",
        local.display(),
        m.p("a.bin").display()
    ));
    let up = uploads("a.bin");
    if up.iter().all(|l| !l.contains("written_by_kernel=true")) {
        testkit::skip(format!(
            "this kernel did not pass the spool through (Linux 6.13 needed): {}",
            log()
        ));
        return;
    }
    assert!(in_grid("a.bin") == body, "a.bin differs");

    // Written, synced (uploaded), changed in place at the same size, closed: the close
    // uploads the change it never saw (the spool's ctime moved).
    let py = python(&format!(
        "import os\nf=open('{0}','wb'); f.write(b'A'*5000); f.flush(); os.fsync(f.fileno())\n\
         f.seek(10); f.write(b'B'*20); f.close()",
        m.p("synced.bin").display()
    ));
    assert!(py.status.success(), "{}", stderr(&py));
    let mut want = vec![b'A'; 5000];
    want[10..30].fill(b'B');
    assert!(in_grid("synced.bin") == want, "synced.bin: {}", log());

    // Written, synced (uploaded) and closed unchanged: one upload, not two (the close
    // compares the spool with what was uploaded).
    let py = python(&format!(
        "import os\nf=open('{0}','wb'); f.write(b'S'*7000); f.flush(); os.fsync(f.fileno()); f.close()",
        m.p("once.bin").display()
    ));
    assert!(py.status.success(), "{}", stderr(&py));
    assert_eq!(uploads("once.bin").len(), 1, "{}", log());
    assert_eq!(in_grid("once.bin"), vec![b'S'; 7000]);

    // Opened for writing and left unwritten while another client writes a new version: the
    // close does not put the old bytes back.
    let mut idle = Prompted::start(
        "import sys\nf = open(sys.argv[1], 'r+b'); f.read(3); print('ready', flush=True)\n\
         sys.stdin.readline()\nf.close(); print('closed', flush=True)\n",
        &m.p("once.bin"),
    );
    assert_eq!(idle.line(Duration::from_secs(60)).unwrap(), "ready");
    let newer = g.path().join("newer.local");
    std::fs::write(&newer, b"from another client\n").unwrap();
    assert_ok(&g.cp(
        "alice",
        &[newer.to_str().unwrap(), &g.url("/alice/once.bin")],
    ));
    idle.go();
    assert_eq!(idle.line(Duration::from_secs(60)).unwrap(), "closed");
    assert_eq!(uploads("once.bin").len(), 1, "{}", log());
    assert_eq!(in_grid("once.bin"), b"from another client\n");

    // Opened for writing and closed unwritten: no new version.
    let before = uploads("a.bin").len();
    let py = python(&format!(
        "f=open('{}','r+b'); f.read(10); f.close()",
        m.p("a.bin").display()
    ));
    assert!(py.status.success(), "{}", stderr(&py));
    assert_eq!(uploads("a.bin").len(), before, "{}", log());

    // Rewritten with O_TRUNC: one upload, of the new bytes; the old file is not fetched.
    let fetched = |log: &str| {
        log.lines()
            .filter(|l| l.contains("extent fetched") && l.contains("/alice/a.bin "))
            .count()
    };
    let fetches = fetched(&log());
    std::fs::write(m.p("a.bin"), b"rewritten\n").unwrap();
    let up = uploads("a.bin");
    assert_eq!(up.len(), before + 1, "{}", log());
    assert!(up[before].contains("bytes=10 "), "{}", up[before]);
    assert_eq!(
        fetched(&log()),
        fetches,
        "the old file was fetched: {}",
        log()
    );
    assert_eq!(in_grid("a.bin"), b"rewritten\n");

    // A reader of a file being written (passed through) reads what was written.
    let mut writer = Prompted::start(
        "import sys\nf = open(sys.argv[1], 'wb'); f.write(b'W' * 100000); f.flush()\n\
         print('ready', flush=True)\nsys.stdin.readline()\nf.close(); print('closed', flush=True)\n",
        &m.p("open.bin"),
    );
    assert_eq!(writer.line(Duration::from_secs(60)).unwrap(), "ready");
    assert_eq!(std::fs::read(m.p("open.bin")).unwrap(), vec![b'W'; 100000]);
    writer.go();
    assert_eq!(writer.line(Duration::from_secs(60)).unwrap(), "closed");
    assert_eq!(in_grid("open.bin"), vec![b'W'; 100000]);

    // A file open for reading (through the kernel's page cache) while it is rewritten: the
    // rewrite is written through the mount, and both programs work.
    let mut reader = Prompted::start(
        "import sys\nf = open(sys.argv[1], 'rb'); print(f.read(4).decode(), flush=True)\n\
         sys.stdin.readline()\nprint(len(f.read()), flush=True)\n",
        &m.p("a.bin"),
    );
    assert_eq!(reader.line(Duration::from_secs(60)).unwrap(), "rewr");
    let before = uploads("a.bin").len();
    std::fs::write(m.p("a.bin"), b"third version\n").unwrap();
    reader.go();
    assert!(reader.line(Duration::from_secs(60)).is_ok());
    let up = uploads("a.bin");
    assert_eq!(up.len(), before + 1, "{}", log());
    assert!(
        up[before].contains("written_by_kernel=false"),
        "{}",
        up[before]
    );
    assert_eq!(in_grid("a.bin"), b"third version\n");
    drop(reader);
    // And once the reader's file is released (the kernel tells the mount a moment after the
    // reader is gone), passed through again.
    let mut passed = false;
    for _ in 0..20 {
        std::fs::write(m.p("a.bin"), b"fourth\n").unwrap();
        let up = uploads("a.bin");
        if up[up.len() - 1].contains("written_by_kernel=true") {
            passed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(passed, "{}", log());
    assert_eq!(in_grid("a.bin"), b"fourth\n");

    // A store through a shared mapping to a page already written through it moves no
    // timestamp: one made after an fsync (which uploaded) still reaches the grid at close.
    let py = python(&format!(
        "import os, mmap\nf=open('{0}','w+b'); f.write(b'A'*8192); f.flush()\n\
         m=mmap.mmap(f.fileno(), 8192); m[0:1]=b'A'; os.fsync(f.fileno())\n\
         m[100:105]=b'HELLO'; m.flush(); m.close(); f.close()",
        m.p("mapped.bin").display()
    ));
    assert!(py.status.success(), "{}", stderr(&py));
    let mut want = vec![b'A'; 8192];
    want[100..105].copy_from_slice(b"HELLO");
    assert!(in_grid("mapped.bin") == want, "mapped.bin: {}", log());

    // O_RDONLY|O_TRUNC empties the file, as on a local file system.
    let py = python(&format!(
        "import os\nos.close(os.open('{}', os.O_RDONLY | os.O_TRUNC))",
        m.p("mapped.bin").display()
    ));
    assert!(py.status.success(), "{}", stderr(&py));
    assert_eq!(in_grid("mapped.bin"), b"");
}

/// Two programs opening one file for writing at the same moment (each open fetches the file
/// into a spool first): both share one spool, neither open fails, and both writes are in the
/// file at close. (Passed through, a second spool would make the kernel refuse the second
/// open, and every later one until the first closed.)
#[test]
fn writers_opening_one_file_at_once_share_its_spool() {
    use std::io::{BufRead, Write};
    if !can_mount() {
        return;
    }
    let g = Grid::start();
    g.ok("alice", &["mkdir", "/alice"]);
    let m = Mounted::start(&g, "alice", &g.url("/alice"), &["--site", "A"]);
    let body = data(91, 4 << 20);
    let f = m.p("shared.bin");
    std::fs::write(&f, &body).unwrap();
    let script = "import sys\nat = int(sys.argv[2])\nsys.stdin.readline()\n\
                  try:\n    f = open(sys.argv[1], 'r+b')\nexcept OSError as e:\n    print('open', e.errno, flush=True); sys.exit()\n\
                  print('opened', flush=True)\nsys.stdin.readline()\n\
                  f.seek(at); f.write(b'Z' * 10); f.close(); print('closed', flush=True)\n";
    let start = |at: u64| {
        let mut child = Command::new("python3")
            .args(["-c", script, f.to_str().unwrap(), &at.to_string()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let out = std::io::BufReader::new(child.stdout.take().unwrap());
        (child, out)
    };
    let mut want = body.clone();
    for round in 0..4u64 {
        let (a_at, b_at) = (round * 100, (2 << 20) + round * 100);
        let mut a = start(a_at);
        let mut b = start(b_at);
        // Both started; then both told to open at once.
        std::thread::sleep(Duration::from_millis(300));
        for c in [&mut a.0, &mut b.0] {
            c.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
        }
        for (c, out) in [&mut a, &mut b] {
            let mut line = String::new();
            out.read_line(&mut line).unwrap();
            assert_eq!(
                line.trim(),
                "opened",
                "round {round}: {}",
                std::fs::read_to_string(&m.log).unwrap_or_default()
            );
            c.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
        }
        for (c, out) in [&mut a, &mut b] {
            let mut line = String::new();
            out.read_line(&mut line).unwrap();
            assert_eq!(line.trim(), "closed", "round {round}");
            c.wait().unwrap();
        }
        want[a_at as usize..a_at as usize + 10].fill(b'Z');
        want[b_at as usize..b_at as usize + 10].fill(b'Z');
        assert!(
            grid_bytes(&g, "/alice/shared.bin") == want,
            "round {round}: a write is missing"
        );
    }
}
