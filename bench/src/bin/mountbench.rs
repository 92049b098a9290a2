//! haul-mountbench: `haul mount` against `haul cp` and Gfarm's gfarm2fs over netlab (issue
//! 17). Per scenario, a lab of two hosts a0 and b0 joined by one emulated 1 Gbit/s link (MTU
//! 9000, tuned hosts, cubic) with the scenario's round trip: a metadata server and a storage
//! node in a0 (and a node in b0, which the client's reads and writes do not use: it mounts
//! with `--site A`), the client in b0. Measured in b0, each in the same run:
//!
//! - sequential read of one file (`cat FILE > /dev/null` on the mount; `haul cp` of the same
//!   file to tmpfs beside it), and the CPU seconds per GiB of the mount process and of `haul cp`;
//! - sequential write of one file (`cp` into the mount, the close included, which uploads;
//!   `haul cp` upload beside it), and CPU per GiB; the write again with `--no-passthrough`
//!   (every write through the mount process instead of the kernel writing the spool);
//! - on the first scenario only: `ls -lR` and `stat` of every entry of a tree of
//!   `--tree-files` files (entries per second, on a fresh mount: nothing cached), creating
//!   1,000 small files (files per second), `tar x` of `--tar-files` small files (seconds).
//!
//! Then, unless `--no-gfarm`, Gfarm in the same lab (gfmd and a gfsd in a0, a gfsd in b0, the
//! set-up of `bench/repl`) and gfarm2fs mounted in b0 do the same rows, the file read from
//! a0's gfsd and the writes going to a0's gfsd (`write_target_domain sitea`).
//!
//! Writes bench/results/<date>-mount.{md,json}. Run it through `bench/mount` (needs root).

#[allow(dead_code)]
#[path = "../data.rs"]
mod data;
#[allow(dead_code)]
#[path = "../gfarm.rs"]
mod gfarm;
#[allow(dead_code)]
#[path = "../labgrid.rs"]
mod labgrid;
#[allow(dead_code)]
#[path = "../plan.rs"]
mod plan;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use clap::Parser;
use serde_json::{Value, json};

use data::MIB;
use gfarm::{Gfarm, gf_name};
use labgrid::{Grid, Proc, run_bounded};

#[derive(Parser, Debug)]
struct Args {
    /// The haul binary (a release build).
    #[arg(long)]
    haul: PathBuf,
    /// Where results go.
    #[arg(long, default_value = "bench/results")]
    out: PathBuf,
    /// Scratch directory on tmpfs (file, node stores, spools, caches).
    #[arg(long, default_value = "/dev/shm/haul-mountbench")]
    work: PathBuf,
    /// Round trips of the scenarios, in ms (S3 is 2, S1 200; 100 is the issue's 80% check).
    #[arg(long, default_value = "2,100,200", value_delimiter = ',')]
    rtt_ms: Vec<u64>,
    /// Size of the file read and written.
    #[arg(long, default_value_t = 4096)]
    file_mib: u64,
    /// Files of the tree listed and stat'ed.
    #[arg(long, default_value_t = 100_000)]
    tree_files: u64,
    /// Small files of the tarball unpacked into the mount.
    #[arg(long, default_value_t = 10_000)]
    tar_files: u64,
    /// Leave out gfarm2fs.
    #[arg(long)]
    no_gfarm: bool,
    /// Leave out the metadata rows.
    #[arg(long)]
    no_meta: bool,
    /// Time limit of each measured command, seconds.
    #[arg(long, default_value_t = 900)]
    limit: u64,
}

/// One measured row.
struct Row {
    rtt_ms: u64,
    tool: &'static str,
    op: String,
    secs: f64,
    /// The figure: MB/s, entries/s, files/s, or seconds.
    value: f64,
    unit: &'static str,
    /// CPU seconds per GiB moved of the client: the mount process (data rows of mounts) or
    /// `haul cp`.
    cpu_per_gib: Option<f64>,
    /// CPU seconds per GiB of the program that read or wrote through a mount (`cat`, `cp`):
    /// the other side of each FUSE request, which also pays for the kernel's page cache where
    /// a file system uses it (gfarm2fs does; `haul mount` reads large files with direct I/O).
    program_cpu_per_gib: Option<f64>,
    ok: bool,
    note: String,
}

fn chmod(p: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(p, fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {:o} {}", mode, p.display()))
}

/// User + system CPU seconds of process `pid` (and its waited-for children).
fn cpu_secs(pid: u32) -> f64 {
    let Ok(s) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = s.rsplit(')').next().unwrap_or_default();
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime, stime are fields 14 and 15 of the whole line: 12 and 13 after the name.
    let ticks: f64 = [11usize, 12]
        .iter()
        .filter_map(|i| f.get(*i).and_then(|v| v.parse::<f64>().ok()))
        .sum();
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks / hz.max(1.0)
}

/// User + system CPU seconds of this process's children that were waited for. `haul cp` runs
/// as a direct child (`ip netns exec` execs it), so the difference around one run is its CPU:
/// no other child of the bench ends meanwhile.
fn children_cpu_secs() -> f64 {
    // SAFETY: getrusage writes one rusage into the zeroed value passed.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) } != 0 {
        return 0.0;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(u.ru_utime) + secs(u.ru_stime)
}

fn per_gib(cpu: f64, bytes: u64) -> f64 {
    cpu / (bytes as f64 / (1u64 << 30) as f64)
}

/// Runs a shell script in `host`, timed; fails with its output when it fails.
fn sh_timed(host: &netlab::Host, script: &str, limit: Duration, log: &Path) -> Result<f64> {
    let mut c = host.command("bash");
    c.args(["-c", script]);
    let o = run_bounded(c, limit, log)?;
    if !o.ok() {
        bail!("{script}: {}", o.why());
    }
    Ok(o.secs)
}

fn mb_per_s(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / secs.max(1e-9) / 1e6
}

struct HaulMount {
    proc: Option<Proc>,
    at: PathBuf,
    pid: u32,
}

impl HaulMount {
    fn start(g: &Grid, host: &netlab::Host, dir: &Path, name: &str) -> Result<HaulMount> {
        Self::start_with(g, host, dir, name, &[])
    }

    fn start_with(
        g: &Grid,
        host: &netlab::Host,
        dir: &Path,
        name: &str,
        extra: &[&str],
    ) -> Result<HaulMount> {
        let at = dir.join(name);
        fs::create_dir_all(&at)?;
        let mut c = host.command(&g.haul);
        c.args(["mount", &format!("{}/bench", g.meta_url)])
            .arg(&at)
            .args(["--site", "A"])
            .args(extra)
            // Write spools in the scratch directory (tmpfs), as the other tools' files.
            .env("TMPDIR", dir)
            .env(
                "HAUL_LOG",
                std::env::var("HAUL_MOUNTBENCH_LOG").unwrap_or_else(|_| "info".into()),
            )
            .current_dir(&g.dir);
        g.pki.as_user(&mut c, "bench");
        let (p, line) = Proc::start(c, &dir.join(format!("{name}.log")), Duration::from_secs(60))
            .map_err(|e| anyhow!("haul mount: {e}"))?;
        if !line.starts_with("mounted") {
            bail!("haul mount: {line}");
        }
        let pid = p.child.id();
        Ok(HaulMount {
            proc: Some(p),
            at,
            pid,
        })
    }
}

impl Drop for HaulMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.at).status();
        if let Some(mut p) = self.proc.take() {
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(20) {
                if let Ok(Some(_)) = p.child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// The data rows of longhaul in one scenario: `haul cp` and `haul mount`, read and write.
fn haul_data_rows(
    g: &Grid,
    lab: &netlab::Lab,
    args: &Args,
    dir: &Path,
    file: &Path,
    rtt: u64,
) -> Result<Vec<Row>> {
    let (a0, b0) = (lab.host("a", 0), lab.host("b", 0));
    let limit = Duration::from_secs(args.limit);
    let bytes = args.file_mib * MIB;
    let mut rows = Vec::new();
    // Into the grid from a0 (not measured).
    let o = g.run(
        &[
            "cp",
            "--progress",
            "never",
            "--site",
            "A",
            file.to_str().unwrap_or_default(),
            &format!("{}/bench/big", g.meta_url),
        ],
        limit,
        "upload-a0",
    )?;
    if !o.ok() {
        bail!("upload in a0: {}", o.why());
    }
    let _ = a0;
    // haul cp, b0 <- a0.
    let dl = dir.join("dl-big");
    let mut c = b0.command(&g.haul);
    c.args(["cp", "--progress", "never", "--site", "B"])
        .arg(format!("{}/bench/big", g.meta_url))
        .arg(&dl)
        .current_dir(&g.dir);
    g.pki.as_user(&mut c, "bench");
    let cpu0 = children_cpu_secs();
    let o = run_bounded(c, limit, &dir.join("cp-download"))?;
    let cpu = children_cpu_secs() - cpu0;
    rows.push(Row {
        rtt_ms: rtt,
        tool: "haul cp",
        op: "sequential read".into(),
        secs: o.secs,
        value: mb_per_s(bytes, o.secs),
        unit: "MB/s",
        cpu_per_gib: Some(per_gib(cpu, bytes)),
        program_cpu_per_gib: None,
        ok: o.ok() && fs::metadata(&dl).map(|m| m.len() == bytes).unwrap_or(false),
        note: if o.ok() { String::new() } else { o.why() },
    });
    let _ = fs::remove_file(&dl);
    // haul mount: cat.
    let m = HaulMount::start(g, b0, dir, "mnt-read")?;
    let rm = |p: &str| {
        let _ = g.run(&["rm", &format!("{}/bench/{p}", g.meta_url)], limit, "rm");
    };
    rows.push(mount_data_row(
        b0,
        &m,
        &format!("cat {}/big > /dev/null", m.at.display()),
        &dir.join("mount-cat"),
        limit,
        bytes,
        (rtt, "haul mount", "sequential read", ""),
    ));
    // The same read through the kernel's page cache (no direct I/O), and through a block
    // cache on disk (tmpfs here) instead of memory, side by side.
    let disk_cache = dir.join("mnt-disk-cache");
    let variants: [(&'static str, &str, Vec<&str>); 2] = [
        ("haul mount --page-cache", "mnt-pc", vec!["--page-cache"]),
        (
            "haul mount --cache DIR",
            "mnt-disk",
            vec![
                "--cache",
                disk_cache.to_str().unwrap_or_default(),
                "--cache-size",
                "2G",
            ],
        ),
    ];
    for (tool, name, extra) in variants {
        let v = HaulMount::start_with(g, b0, dir, name, &extra)?;
        rows.push(mount_data_row(
            b0,
            &v,
            &format!("cat {}/big > /dev/null", v.at.display()),
            &dir.join(format!("mount-cat-{name}")),
            limit,
            bytes,
            (rtt, tool, "sequential read", ""),
        ));
    }
    let _ = fs::remove_dir_all(&disk_cache);
    rm("big");
    // haul mount: cp in (the close uploads).
    rows.push(mount_data_row(
        b0,
        &m,
        &format!("cp {} {}/written", file.display(), m.at.display()),
        &dir.join("mount-write"),
        limit,
        bytes,
        (rtt, "haul mount", "sequential write", "the close uploads"),
    ));
    drop(m);
    rm("written");
    // The same with every write through the mount (no FUSE passthrough), side by side.
    let v = HaulMount::start_with(g, b0, dir, "mnt-nopt", &["--no-passthrough"])?;
    rows.push(mount_data_row(
        b0,
        &v,
        &format!("cp {} {}/written", file.display(), v.at.display()),
        &dir.join("mount-write-nopt"),
        limit,
        bytes,
        (
            rtt,
            "haul mount --no-passthrough",
            "sequential write",
            "the close uploads",
        ),
    ));
    drop(v);
    rm("written");
    // haul cp upload, b0 -> a0.
    let mut c = b0.command(&g.haul);
    c.args(["cp", "--progress", "never", "--site", "A"])
        .arg(file)
        .arg(format!("{}/bench/uploaded", g.meta_url))
        .current_dir(&g.dir);
    g.pki.as_user(&mut c, "bench");
    let cpu0 = children_cpu_secs();
    let o = run_bounded(c, limit, &dir.join("cp-upload"))?;
    let cpu = children_cpu_secs() - cpu0;
    rows.push(Row {
        rtt_ms: rtt,
        tool: "haul cp",
        op: "sequential write".into(),
        secs: o.secs,
        value: mb_per_s(bytes, o.secs),
        unit: "MB/s",
        cpu_per_gib: Some(per_gib(cpu, bytes)),
        program_cpu_per_gib: None,
        ok: o.ok(),
        note: if o.ok() { String::new() } else { o.why() },
    });
    rm("uploaded");
    Ok(rows)
}

fn failed(rtt: u64, tool: &'static str, op: &str, e: anyhow::Error) -> Row {
    Row {
        rtt_ms: rtt,
        tool,
        op: op.into(),
        secs: 0.0,
        value: 0.0,
        unit: "",
        cpu_per_gib: None,
        program_cpu_per_gib: None,
        ok: false,
        note: format!("{e:#}"),
    }
}

/// What moving `bytes` through a mount in `host` gives: `script` timed (with `log`), the rate
/// and the CPU seconds per GiB of the mount's process.
#[allow(clippy::too_many_arguments)]
fn mount_data_row(
    host: &netlab::Host,
    m: &HaulMount,
    script: &str,
    log: &Path,
    limit: Duration,
    bytes: u64,
    (rtt, tool, op, note): (u64, &'static str, &str, &str),
) -> Row {
    let cpu0 = cpu_secs(m.pid);
    // The shell and its program are waited-for children of the bench; the mount is not yet.
    let prog0 = children_cpu_secs();
    let r = sh_timed(host, script, limit, log);
    let cpu = cpu_secs(m.pid) - cpu0;
    let prog = children_cpu_secs() - prog0;
    match r {
        Ok(secs) => Row {
            rtt_ms: rtt,
            tool,
            op: op.into(),
            secs,
            value: mb_per_s(bytes, secs),
            unit: "MB/s",
            cpu_per_gib: Some(per_gib(cpu, bytes)),
            program_cpu_per_gib: Some(per_gib(prog, bytes)),
            ok: true,
            note: note.into(),
        },
        Err(e) => failed(rtt, tool, op, e),
    }
}

/// The metadata rows on a mount at `at` in `host`: ls -lR and stat of the tree `tree` (a
/// fresh mount), creates, tar x.
fn meta_rows(
    tool: &'static str,
    host: &netlab::Host,
    at: &Path,
    args: &Args,
    dir: &Path,
    tarball: &Path,
    rtt: u64,
) -> Vec<Row> {
    let limit = Duration::from_secs(args.limit);
    let entries = args.tree_files;
    let mut rows = Vec::new();
    let r = sh_timed(
        host,
        &format!("ls -lR {}/tree > /dev/null", at.display()),
        limit,
        &dir.join(format!("{tool}-ls")),
    );
    rows.push(match r {
        Ok(secs) => Row {
            rtt_ms: rtt,
            tool,
            op: format!("ls -lR, {entries} files"),
            secs,
            value: entries as f64 / secs,
            unit: "entries/s",
            cpu_per_gib: None,
            program_cpu_per_gib: None,
            ok: true,
            note: String::new(),
        },
        Err(e) => failed(rtt, tool, "ls -lR", e),
    });
    // stat of every file by name, after the attribute cache has expired.
    std::thread::sleep(Duration::from_secs(2));
    let r = sh_timed(
        host,
        &format!(
            "python3 -c \"import os,sys; d=sys.argv[1]; [os.stat(os.path.join(d, n)) for n in sorted(os.listdir(d))]\" {}/tree/d0",
            at.display()
        ),
        limit,
        &dir.join(format!("{tool}-stat")),
    );
    let per_dir = entries.min(1000);
    rows.push(match r {
        Ok(secs) => Row {
            rtt_ms: rtt,
            tool,
            op: format!("stat, {per_dir} files of one directory"),
            secs,
            value: per_dir as f64 / secs,
            unit: "stats/s",
            cpu_per_gib: None,
            program_cpu_per_gib: None,
            ok: true,
            note: "listing included".into(),
        },
        Err(e) => failed(rtt, tool, "stat", e),
    });
    let r = sh_timed(
        host,
        &format!(
            "mkdir -p {0}/created && python3 -c \"import sys\nfor i in range(1000):\n  open(sys.argv[1]+'/f%04d' % i, 'wb').write(b'x' * 1024)\" {0}/created",
            at.display()
        ),
        limit,
        &dir.join(format!("{tool}-create")),
    );
    rows.push(match r {
        Ok(secs) => Row {
            rtt_ms: rtt,
            tool,
            op: "create 1,000 files of 1 KiB".into(),
            secs,
            value: 1000.0 / secs,
            unit: "files/s",
            cpu_per_gib: None,
            program_cpu_per_gib: None,
            ok: true,
            note: String::new(),
        },
        Err(e) => failed(rtt, tool, "create", e),
    });
    let r = sh_timed(
        host,
        &format!(
            "mkdir -p {0}/untar && tar xf {1} --no-same-owner -C {0}/untar",
            at.display(),
            tarball.display()
        ),
        limit,
        &dir.join(format!("{tool}-tar")),
    );
    rows.push(match r {
        Ok(secs) => Row {
            rtt_ms: rtt,
            tool,
            op: format!("tar x, {} files of 1-8 KiB", args.tar_files),
            secs,
            value: secs,
            unit: "s",
            cpu_per_gib: None,
            program_cpu_per_gib: None,
            ok: true,
            note: String::new(),
        },
        Err(e) => failed(rtt, tool, "tar x", e),
    });
    rows
}

/// A local tree of `n` empty files in directories of 1,000 (d0, d1, ...).
fn make_tree(root: &Path, n: u64) -> Result<()> {
    let _ = fs::remove_dir_all(root);
    for i in 0..n {
        let d = root.join(format!("d{}", i / 1000));
        if i % 1000 == 0 {
            fs::create_dir_all(&d)?;
        }
        fs::write(d.join(format!("f{i}")), b"")?;
    }
    Ok(())
}

/// A tarball of `n` files of 1-8 KiB.
fn make_tarball(dir: &Path, n: u64) -> Result<PathBuf> {
    let src = dir.join("tarsrc");
    let _ = fs::remove_dir_all(&src);
    let mut rng = data::Rng::new(17);
    for i in 0..n {
        let d = src.join(format!("s{}", i / 500));
        if i % 500 == 0 {
            fs::create_dir_all(&d)?;
        }
        let len = 1024 + (rng.next_u64() % 7168) as usize;
        let mut b = vec![0u8; len];
        rng.fill(&mut b);
        fs::write(d.join(format!("r{i}.dat")), b)?;
    }
    let tar = dir.join("small.tar");
    let st = Command::new("tar")
        .arg("cf")
        .arg(&tar)
        .arg("-C")
        .arg(&src)
        .arg(".")
        .status()?;
    if !st.success() {
        bail!("tar cf {}", tar.display());
    }
    let _ = fs::remove_dir_all(&src);
    Ok(tar)
}

/// Gfarm's rows in the lab: the file registered on a0's gfsd, gfarm2fs mounted in b0, the
/// same reads, writes and metadata operations as the mount's.
fn gfarm_rows(
    lab: &netlab::Lab,
    args: &Args,
    dir: &Path,
    file: &Path,
    tree: Option<&Path>,
    tarball: &Path,
    rtt: u64,
) -> Result<Vec<Row>> {
    // gfarm2fs mounts as the Gfarm user through libfuse2, which opens /dev/fuse itself:
    // distributions make it 0666, this VM 0600. Opened up for the run, put back after.
    let fuse_mode = fs::metadata("/dev/fuse").map(|m| {
        use std::os::unix::fs::PermissionsExt;
        m.permissions().mode() & 0o7777
    })?;
    chmod(Path::new("/dev/fuse"), 0o666)?;
    struct PutBack(u32);
    impl Drop for PutBack {
        fn drop(&mut self) {
            let _ = chmod(Path::new("/dev/fuse"), self.0);
        }
    }
    let _put_back = PutBack(fuse_mode);
    let gf = Gfarm::start(&dir.join("gfarm"), lab)?;
    let (a0, b0) = (lab.host("a", 0), lab.host("b", 0));
    let limit = Duration::from_secs(args.limit);
    let bytes = args.file_mib * MIB;
    let etc = gf.run.join("etc");
    // Writes go to site A's gfsd (a0), as the mount's go to site A's node.
    fs::write(
        etc.join("gfarm2-mount.conf"),
        format!(
            "include {}\nwrite_target_domain sitea\n",
            etc.join("gfarm2-bench.conf").display()
        ),
    )?;
    gf.must(
        a0,
        &format!(
            "gfreg -h {} {} /big && gfmkdir -p /w",
            gf_name(a0),
            file.display()
        ),
        limit,
        "gfreg",
    )?;
    if let Some(t) = tree {
        gf.must(
            a0,
            &format!("gfpcopy -q {} gfarm:///", t.display()),
            limit,
            "gfpcopy-tree",
        )?;
    }
    let mnt = dir.join("gfmnt");
    fs::create_dir_all(&mnt)?;
    let st = Command::new("chown").arg("haulgf:").arg(&mnt).status()?;
    if !st.success() {
        bail!("chown {}", mnt.display());
    }
    let mut rows = Vec::new();
    // Everything in one shell: the mount lives in that shell's private mount namespace.
    let t = |what: &str, cmd: &str| {
        format!(
            "s=$(date +%s.%N); {cmd} || exit 1; e=$(date +%s.%N); echo \"{what} $(awk \"BEGIN{{print $e - $s}}\")\""
        )
    };
    let mut script = format!(
        "gfarm2fs -o big_writes {0} || exit 1; trap 'fusermount -u {0}' EXIT; sleep 1; pid=$(pgrep -n -u haulgf gfarm2fs); cpu() {{ awk '{{print $14+$15}}' /proc/$pid/stat; }}; tf=$(mktemp); pc() {{ times > $tf; pt=$(awk 'NR==2{{split($1,a,\"m\"); split($2,b,\"m\"); print a[1]*60+a[2]+b[1]*60+b[2]}}' $tf); }}; c0=$(cpu); pc; p0=$pt; ",
        mnt.display()
    );
    script += &t("read", &format!("cat {}/big > /dev/null", mnt.display()));
    script += "; c1=$(cpu); pc; p1=$pt; echo \"cpuread $((c1 - c0))\"; echo \"progread $(awk \"BEGIN{print $p1 - $p0}\")\"; ";
    script += &t(
        "write",
        &format!("cp {} {}/w/written", file.display(), mnt.display()),
    );
    script += "; c2=$(cpu); pc; p2=$pt; echo \"cpuwrite $((c2 - c1))\"; echo \"progwrite $(awk \"BEGIN{print $p2 - $p1}\")\"; ";
    if tree.is_some() {
        script += &t("ls", &format!("ls -lR {}/tree > /dev/null", mnt.display()));
        script += "; sleep 2; ";
        script += &t(
            "stat",
            &format!(
                "python3 -c \"import os,sys; d=sys.argv[1]; [os.stat(os.path.join(d, n)) for n in sorted(os.listdir(d))]\" {}/tree/d0",
                mnt.display()
            ),
        );
        script += "; ";
        script += &t(
            "create",
            &format!(
                "mkdir -p {0}/created && python3 -c \"import sys\nfor i in range(1000):\n  open(sys.argv[1]+'/f%04d' % i, 'wb').write(b'x' * 1024)\" {0}/created",
                mnt.display()
            ),
        );
        script += "; ";
        script += &t(
            "tar",
            &format!(
                "mkdir -p {0}/untar && tar xf {1} --no-same-owner -C {0}/untar",
                mnt.display(),
                tarball.display()
            ),
        );
        script += ";";
    }
    let o = run_bounded(
        gf.sh(b0, "gfarm2-mount.conf", &script),
        limit * 6,
        &dir.join("gfarm2fs"),
    )?;
    let out = o.stdout_text();
    let val = |k: &str| -> Option<f64> {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("{k} ")))
            .and_then(|v| v.trim().parse().ok())
    };
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let gib = bytes as f64 / (1u64 << 30) as f64;
    let why = if o.ok() { String::new() } else { o.why() };
    // (CPU of gfarm2fs, of the program) per GiB.
    let mut push = |op: String,
                    v: Option<f64>,
                    f: &dyn Fn(f64) -> (f64, &'static str),
                    (cpu, prog): (Option<f64>, Option<f64>)| {
        rows.push(match v {
            Some(secs) => {
                let (value, unit) = f(secs);
                Row {
                    rtt_ms: rtt,
                    tool: "gfarm2fs",
                    op,
                    secs,
                    value,
                    unit,
                    cpu_per_gib: cpu,
                    program_cpu_per_gib: prog,
                    ok: true,
                    note: String::new(),
                }
            }
            None => failed(rtt, "gfarm2fs", &op, anyhow!(why.clone())),
        })
    };
    push(
        "sequential read".into(),
        val("read"),
        &|s| (mb_per_s(bytes, s), "MB/s"),
        (
            val("cpuread").map(|t| t / hz / gib),
            val("progread").map(|t| t / gib),
        ),
    );
    push(
        "sequential write".into(),
        val("write"),
        &|s| (mb_per_s(bytes, s), "MB/s"),
        (
            val("cpuwrite").map(|t| t / hz / gib),
            val("progwrite").map(|t| t / gib),
        ),
    );
    if tree.is_some() {
        let entries = args.tree_files;
        push(
            format!("ls -lR, {entries} files"),
            val("ls"),
            &|s| (entries as f64 / s, "entries/s"),
            (None, None),
        );
        let per_dir = entries.min(1000);
        push(
            format!("stat, {per_dir} files of one directory"),
            val("stat"),
            &|s| (per_dir as f64 / s, "stats/s"),
            (None, None),
        );
        push(
            "create 1,000 files of 1 KiB".into(),
            val("create"),
            &|s| (1000.0 / s, "files/s"),
            (None, None),
        );
        push(
            format!("tar x, {} files of 1-8 KiB", args.tar_files),
            val("tar"),
            &|s| (s, "s"),
            (None, None),
        );
    }
    drop(gf);
    Ok(rows)
}

fn main() -> Result<()> {
    let args = Args::parse();
    if let Err(why) = netlab::Lab::available() {
        bail!("netlab: {why}");
    }
    let started = Instant::now();
    let _ = fs::remove_dir_all(&args.work);
    fs::create_dir_all(&args.work)?;
    chmod(&args.work, 0o755)?;
    let bytes = args.file_mib * MIB;
    let file = args.work.join("file.bin");
    data::write_file(&file, bytes, 42)?;
    chmod(&file, 0o644)?;
    let tarball = make_tarball(&args.work, args.tar_files)?;
    chmod(&tarball, 0o644)?;
    let tree = args.work.join("tree");
    if !args.no_meta {
        make_tree(&tree, args.tree_files)?;
    }
    let mut rows: Vec<Row> = Vec::new();
    for (i, &rtt) in args.rtt_ms.iter().enumerate() {
        let with_meta = i == 0 && !args.no_meta;
        let dir = args.work.join(format!("rtt{rtt}"));
        fs::create_dir_all(&dir)?;
        chmod(&dir, 0o755)?;
        eprintln!("haul-mountbench: {rtt} ms");
        let lab = netlab::Lab::builder()
            .site("a", 1)
            .site("b", 1)
            .rate_bps(1_000_000_000)
            .rtt(Duration::from_millis(rtt))
            .mtu(9000)
            .profile(netlab::Profile::Tuned)
            .congestion("cubic")
            .build()
            .map_err(|e| anyhow!("netlab: {e}"))?;
        {
            let g = Grid::start(&dir.join("grid"), &args.haul, &lab)?;
            let o = g.run(
                &["mkdir", &format!("{}/bench", g.meta_url)],
                Duration::from_secs(60),
                "mkdir",
            )?;
            if !o.ok() {
                bail!("mkdir: {}", o.why());
            }
            rows.extend(haul_data_rows(&g, &lab, &args, &dir, &file, rtt)?);
            if with_meta {
                let o = g.run(
                    &[
                        "cp",
                        "-r",
                        "--progress",
                        "never",
                        "--site",
                        "A",
                        tree.to_str().unwrap_or_default(),
                        &format!("{}/bench/", g.meta_url),
                    ],
                    Duration::from_secs(args.limit),
                    "upload-tree",
                )?;
                if !o.ok() {
                    bail!("tree into the grid: {}", o.why());
                }
                let m = HaulMount::start(&g, lab.host("b", 0), &dir, "mnt-meta")?;
                rows.extend(meta_rows(
                    "haul mount",
                    lab.host("b", 0),
                    &m.at,
                    &args,
                    &dir,
                    &tarball,
                    rtt,
                ));
            }
        }
        let _ = fs::remove_dir_all(dir.join("grid").join("nodes"));
        if !args.no_gfarm {
            match gfarm_rows(
                &lab,
                &args,
                &dir,
                &file,
                with_meta.then_some(tree.as_path()),
                &tarball,
                rtt,
            ) {
                Ok(r) => rows.extend(r),
                Err(e) => rows.push(failed(rtt, "gfarm2fs", "set-up", e)),
            }
        }
        let _ = fs::remove_dir_all(dir.join("gfarm"));
    }
    report(&args, &rows, started.elapsed())
}

fn report(args: &Args, rows: &[Row], took: Duration) -> Result<()> {
    let date = Command::new("date")
        .arg("+%Y-%m-%d-%H%M")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|_| "now".into());
    fs::create_dir_all(&args.out)?;
    let mut md = format!(
        "# haul mount against haul cp and gfarm2fs (bench/mount)\n\nnetlab, two hosts (a0: metadata server and node / gfmd and gfsd; b0: the client), one 1 Gbit/s link, MTU 9000, tuned, cubic; a file of {} MiB; this 2-core VM; {:.0} s in all. Mounts read with `--site A`; one run of each row, side by side.\n\n| RTT | operation | tool | seconds | figure | CPU s/GiB of the client (mount or haul cp) | CPU s/GiB of the program (cat or cp) | note |\n|---|---|---|---|---|---|---|---|\n",
        args.file_mib,
        took.as_secs_f64()
    );
    let mut js = Vec::new();
    for r in rows {
        md += &format!(
            "| {} ms | {} | {} | {} | {} | {} | {} | {} |\n",
            r.rtt_ms,
            r.op,
            r.tool,
            if r.ok {
                format!("{:.2}", r.secs)
            } else {
                "failed".into()
            },
            if r.ok {
                format!("{:.1} {}", r.value, r.unit)
            } else {
                "-".into()
            },
            r.cpu_per_gib.map(|c| format!("{c:.2}")).unwrap_or_default(),
            r.program_cpu_per_gib
                .map(|c| format!("{c:.2}"))
                .unwrap_or_default(),
            r.note.replace('|', "/").replace('\n', " ")
        );
        js.push(json!({
            "rtt_ms": r.rtt_ms, "tool": r.tool, "op": r.op, "seconds": r.secs, "value": r.value,
            "unit": r.unit, "cpu_s_per_gib": r.cpu_per_gib,
            "program_cpu_s_per_gib": r.program_cpu_per_gib, "ok": r.ok, "note": r.note,
        }));
    }
    // The issue's check: mount read against haul cp read, per scenario.
    md += "\n| RTT | mount read / haul cp read |\n|---|---|\n";
    for rtt in &args.rtt_ms {
        let f = |tool: &str| {
            rows.iter()
                .find(|r| r.rtt_ms == *rtt && r.tool == tool && r.op == "sequential read" && r.ok)
                .map(|r| r.value)
        };
        if let (Some(m), Some(c)) = (f("haul mount"), f("haul cp")) {
            md += &format!("| {rtt} ms | {:.0}% |\n", 100.0 * m / c);
        }
    }
    let base = args.out.join(format!("{date}-mount"));
    fs::write(base.with_extension("md"), &md)?;
    fs::write(
        base.with_extension("json"),
        serde_json::to_string_pretty(&Value::Array(js))?,
    )?;
    print!("{md}");
    eprintln!("haul-mountbench: {}", base.with_extension("md").display());
    if rows.iter().any(|r| !r.ok) {
        bail!("a row failed (see the results)");
    }
    Ok(())
}
