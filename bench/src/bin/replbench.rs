//! haul-replbench: grid replication across the emulated S5 link, side by side with
//! globus-url-copy (issue 5). Two sites of 4 hosts each share one emulated 1 Gbit/s, 100 ms RTT
//! link (netlab, settings of scenario S5: MTU 9000, tuned hosts, cubic). A metadata server runs
//! in host a0, a storage node in each host (site A: a0..a3, site B: b0..b3). The W2
//! climate-like dataset (the same files `haul-bench` generates) is uploaded into site A (not
//! measured), then `haul replicate -r --copies 2 --site B` is timed and every file is checked
//! to have a complete, checksum-verified replica at site B. In the same lab the same dataset
//! then goes from a0 to b0 with `globus-url-copy -r -cd -fast -cc 4 -pp -p 4 -tcp-bs ...` (the
//! server in b0 as `haul-bench` runs it) and is compared byte for byte. Unless `--no-gfarm`,
//! Gfarm does the replication too (after the grid is stopped, before globus-url-copy): gfmd and
//! its PostgreSQL in a0, a gfsd in every host (a0.sitea ... b3.siteb, names given by a private
//! /etc/hosts in each Gfarm process's mount namespace), the dataset registered with one copy
//! per file spread over the site A gfsds, then `gfprep -N 1 -D siteb -j 8` timed and every file
//! checked to have a replica at B whose md5 the B gfsd recomputes; when Gfarm is not installed
//! or cannot be set up, its row says "not run" and why. Writes
//! bench/results/<date>-repl.{md,json}. Run it through `bench/repl` (needs root).

#[allow(dead_code)]
#[path = "../data.rs"]
mod data;
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
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use clap::Parser;
use serde_json::{Value, json};

use data::{Dataset, MIB};
use gfarm::{GFPREP_J, Gfarm, parse_gfwhere};
use labgrid::{Grid, Outcome, Proc, last_json, run_bounded};

const GRIDFTP_PORT: u16 = 2811;
const HOSTS_PER_SITE: usize = 4;
/// globus-url-copy: files in flight and streams per file (16 streams, as the 4 pairs x -p 4 of
/// haul-bench's S5 row).
const GLOBUS_CC: u64 = 4;
const GLOBUS_P: u64 = 4;

#[derive(Parser, Debug)]
struct Args {
    /// The haul binary (a release build).
    #[arg(long)]
    haul: PathBuf,
    /// Where results go.
    #[arg(long, default_value = "bench/results")]
    out: PathBuf,
    /// Scratch directory on tmpfs: dataset, node stores, GridFTP destination (removed after).
    #[arg(long, default_value = "/dev/shm/haul-replbench")]
    work: PathBuf,
    /// W2 at 512 MiB instead of 2 GiB (a check that everything works, not a measurement).
    #[arg(long)]
    quick: bool,
    /// Leave out the globus-url-copy row.
    #[arg(long)]
    no_globus: bool,
    /// Leave out the Gfarm gfprep row (reported as not run).
    #[arg(long)]
    no_gfarm: bool,
    /// Parallel copies of gfprep (-j).
    #[arg(long, default_value_t = GFPREP_J, value_parser = clap::value_parser!(u64).range(1..=64))]
    gfprep_j: u64,
    /// Where the logs of meta, nodes, GridFTP and each command are kept after the run.
    #[arg(long, default_value = "/tmp/haul-replbench-logs")]
    logs: PathBuf,
    /// Measured runs of each tool (the result is the median run).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=9))]
    runs: u64,
    /// Time limit of each measured transfer, seconds.
    #[arg(long, default_value_t = 600)]
    limit: u64,
}

/// Bytes the emulator delivered from site a to site b, and drops, so far.
fn link_a_to_b(lab: &netlab::Lab) -> (u64, u64) {
    lab.stats()
        .direction("a")
        .map(|d| (d.bytes, d.drops.queue + d.drops.loss))
        .unwrap_or((0, 0))
}

/// A measured phase: wall time, the link's view over it, and its window in lab time (ms).
#[derive(Default)]
struct Phase {
    secs: f64,
    link_bytes: u64,
    link_drops: u64,
    window_ms: (u64, u64),
}

fn measured(lab: &netlab::Lab, f: impl FnOnce() -> Result<Outcome>) -> Result<(Outcome, Phase)> {
    let (b0, d0) = link_a_to_b(lab);
    let t0 = lab.elapsed().as_millis() as u64;
    let o = f()?;
    let t1 = lab.elapsed().as_millis() as u64;
    let (b1, d1) = link_a_to_b(lab);
    let p = Phase {
        secs: o.secs,
        link_bytes: b1 - b0,
        link_drops: d1 - d0,
        window_ms: (t0, t1),
    };
    Ok((o, p))
}

/// Bytes delivered a to b per second over `window` (lab ms), from the router CSV.
fn per_second(csv: &Path, window: (u64, u64)) -> Vec<u64> {
    let Ok(text) = fs::read_to_string(csv) else {
        return Vec::new();
    };
    let mut bins = vec![0u64; ((window.1 - window.0) / 1000 + 1) as usize];
    for l in text.lines().skip(1) {
        let mut f = l.split(',');
        let (Some(Ok(t)), Some(Ok(a))) = (
            f.next().map(str::parse::<u64>),
            f.next().map(str::parse::<u64>),
        ) else {
            continue;
        };
        if t >= window.0 && t <= window.1 {
            bins[((t - window.0) / 1000) as usize] += a;
        }
    }
    bins
}

fn gbps(bytes: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        bytes as f64 * 8.0 / secs / 1e9
    } else {
        0.0
    }
}

/// Says how run `n` of `tool` went and adds what every transfer's row has to `row`: time,
/// rate, share of the link, the emulator's link bytes and drops over the command, and its
/// window in the router CSV.
fn with_measurement(mut row: Value, n: u64, tool: &str, bytes: u64, p: &Phase, rate: u64) -> Value {
    let gb = gbps(bytes, p.secs);
    eprintln!(
        "haul-replbench: run {n}: {tool} {:.1} s ({gb:.3} Gbit/s, {} drops at the bottleneck)",
        p.secs, p.link_drops
    );
    let fields = json!({
        "seconds": p.secs,
        "gbit_per_s": gb,
        "pct_link": 100.0 * gb * 1e9 / rate as f64,
        "link_bytes_a_to_b": p.link_bytes,
        "link_drops": p.link_drops,
        "window_ms": [p.window_ms.0, p.window_ms.1],
    });
    if let (Some(r), Value::Object(f)) = (row.as_object_mut(), fields) {
        r.extend(f);
    }
    row
}

/// Where the dataset's replicas are: files with a complete replica at site B whose checksum is
/// the catalog's, replicas per node, and every file lacking one at site B or site A.
fn check_placement(g: &Grid, ds: &Dataset, grid_dir: &str) -> Result<Value> {
    let paths: Vec<String> = ds
        .files
        .iter()
        .map(|(rel, _)| format!("{grid_dir}/{}", rel.display()))
        .collect();
    let mut args = vec!["where", "--json"];
    args.extend(paths.iter().map(String::as_str));
    let v = g.json(&args, Duration::from_secs(60))?;
    let entries = v["files"].as_array().cloned().unwrap_or_default();
    let mut problems = Vec::new();
    let mut ok_b = 0;
    let mut per_node = serde_json::Map::new();
    for (i, e) in entries.iter().enumerate() {
        let size = e["size"].as_u64().unwrap_or(0);
        if size != ds.files.get(i).map(|f| f.1).unwrap_or(u64::MAX) {
            problems.push(format!("{}: size {size} in the catalog", e["path"]));
        }
        let sum = e["checksum"].as_str().unwrap_or("");
        let reps = e["replicas"].as_array().cloned().unwrap_or_default();
        let good = |site: &str| {
            reps.iter().any(|r| {
                r["site"] == site
                    && r["state"] == "complete"
                    && r["node_up"] == true
                    && !sum.is_empty()
                    && r["checksum"].as_str() == Some(sum)
            })
        };
        if good("B") {
            ok_b += 1;
        } else {
            problems.push(format!("{}: no complete replica at site B", e["path"]));
        }
        if !good("A") {
            problems.push(format!("{}: no complete replica at site A", e["path"]));
        }
        for r in &reps {
            let n = r["node"].as_str().unwrap_or("?").to_string();
            let c = per_node.entry(n).or_insert(json!(0));
            *c = json!(c.as_u64().unwrap_or(0) + 1);
        }
    }
    if entries.len() != ds.file_count {
        problems.push(format!(
            "haul where listed {} files, the dataset has {}",
            entries.len(),
            ds.file_count
        ));
    }
    Ok(json!({
        "files_with_complete_b_replica": ok_b,
        "replicas_per_node": per_node,
        "problems": problems,
    }))
}

/// A hosts file naming the lab addresses, for GridFTP's getnameinfo() (as haul-bench does).
fn hosts_file(dir: &Path, lab: &netlab::Lab) -> Result<PathBuf> {
    let p = dir.join("hosts");
    let mut s = String::from("127.0.0.1 localhost\n");
    if let Ok(h) = fs::read_to_string("/proc/sys/kernel/hostname") {
        s.push_str(&format!("127.0.1.1 {}\n", h.trim()));
    }
    for h in lab.hosts() {
        s.push_str(&format!("{} {}\n", h.addr(), h.name()));
    }
    fs::write(&p, s)?;
    Ok(p)
}

fn chmod(p: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(p, fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {}", p.display()))
}

/// Whether something listens on `port` in `host` (from /proc/net/tcp inside it).
fn listening(host: &netlab::Host, port: u16) -> bool {
    let hex = format!(":{port:04X}");
    host.command("cat")
        .arg("/proc/net/tcp")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout).lines().any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() > 3 && f[1].ends_with(&hex) && f[3] == "0A"
            })
        })
        .unwrap_or(false)
}

/// globus-gridftp-server in b0 (flags of haul-bench), globus-url-copy in a0 pushing the tree.
fn globus(
    lab: &netlab::Lab,
    dir: &Path,
    ds: &Dataset,
    limit: Duration,
) -> Result<(Outcome, Phase, String)> {
    let (client, server) = (lab.host("a", 0), lab.host("b", 0));
    let scratch = dir.join("gridftp");
    fs::create_dir_all(&scratch)?;
    chmod(&scratch, 0o777)?;
    let dst = dir.join("globus-dst");
    let _ = fs::remove_dir_all(&dst);
    fs::create_dir_all(&dst)?;
    chmod(&dst, 0o777)?;
    let hosts = hosts_file(dir, lab)?;
    let a = server.addr();
    let srv = format!(
        "exec env GLOBUS_USAGE_OPTOUT=1 globus-gridftp-server -S -p {GRIDFTP_PORT} \
         -control-interface {a} -data-interface {a} -aa -anonymous-user nobody \
         -home-dir / -disable-usage-stats -log-level error,warn -l {log} -pidfile {pid}",
        log = scratch.join("gridftp.log").display(),
        pid = scratch.join("gridftp.pid").display(),
    );
    let mut c = server.command("unshare");
    c.args(["--mount", "sh", "-c"])
        .arg(format!(
            "mount --bind {} /etc/hosts && {srv}",
            hosts.display()
        ))
        .stdin(Stdio::null())
        .stdout(fs::File::create(scratch.join("server.out"))?)
        .stderr(fs::File::create(scratch.join("server.err"))?);
    let _server = Proc::adopt(
        c.spawn().context("starting globus-gridftp-server")?,
        &scratch.join("server.err"),
    );
    let t = Instant::now();
    while !listening(server, GRIDFTP_PORT) {
        if t.elapsed() > Duration::from_secs(15) {
            bail!(
                "globus-gridftp-server did not listen within 15 s: {} {}",
                fs::read_to_string(scratch.join("server.err")).unwrap_or_default(),
                fs::read_to_string(scratch.join("gridftp.log")).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // Per-stream buffer as haul-bench sizes it: 2 x BDP shared by all streams, MiB rounded up.
    let s5 = plan::scenarios()
        .into_iter()
        .find(|s| s.id == "S5")
        .ok_or_else(|| anyhow!("no S5 scenario"))?;
    let bs = (2 * s5.bdp() / (GLOBUS_CC * GLOBUS_P)).div_ceil(MIB) * MIB;
    let mut cmd = client.command("globus-url-copy");
    cmd.args(["-r", "-cd", "-fast", "-cc", &GLOBUS_CC.to_string(), "-pp"])
        .args(["-p", &GLOBUS_P.to_string(), "-tcp-bs", &bs.to_string()])
        .arg(format!("file://{}/", ds.root.display()))
        .arg(format!(
            "ftp://{a}:{GRIDFTP_PORT}{}/{}/",
            dst.display(),
            ds.name()
        ));
    let shown = render(&cmd);
    let r = measured(lab, || run_bounded(cmd, limit, &scratch.join("client")));
    // -S detaches the server from the process started here: stop it by its pid file (the
    // lab's end would otherwise).
    if let Some(pid) = fs::read_to_string(scratch.join("gridftp.pid"))
        .ok()
        .and_then(|p| p.trim().parse::<i32>().ok())
        .filter(|p| *p > 1)
    {
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    let (o, p) = r?;
    Ok((o, p, shown))
}

// ---------------------------------------------------------------------------------------------
// Gfarm: gfmd (+ its private PostgreSQL) in a0, one gfsd per lab host, `gfprep` replicating the
// dataset from the site A gfsds to site B (see ../shared/reference/gfarm/NOTES.md for the
// single-host set-up this follows and its pitfalls).

/// One measured gfprep run: the dataset registered into /rN with its one copy spread over the
/// site A gfsds (gfpcopy -D sitea, not measured), `gfprep -N 1 -D siteb -j 8` timed, every file
/// checked to have a replica at site B (gfwhere) whose md5 the B gfsd recomputes to the one
/// recorded at registration (gfcksum -c -h), then the directory removed.
fn gfprep_run(
    g: &Gfarm,
    lab: &netlab::Lab,
    ds: &Dataset,
    (n, j): (u64, u64),
    limit: Duration,
    rate: u64,
) -> Result<Value> {
    let a0 = lab.host("a", 0);
    let dir = format!("/r{n}");
    let mut problems: Vec<String> = Vec::new();
    let up = g.must(
        a0,
        &format!(
            "gfpcopy -D sitea -j 4 -b 4194304 file://{} gfarm://{dir}",
            ds.root.display()
        ),
        limit,
        &format!("gfpcopy-r{n}"),
    )?;
    let w0 = g.must(
        a0,
        &format!("gfwhere -r {dir}"),
        Duration::from_secs(120),
        "gfwhere0",
    )?;
    let before = parse_gfwhere(&w0.stdout_text());
    let mut spread = serde_json::Map::new();
    for (p, hs) in &before {
        if hs.len() != 1 || !hs[0].ends_with(".sitea") {
            bail!("after gfpcopy -D sitea, {p} is on {hs:?}, not on one site A node");
        }
        let c = spread.entry(hs[0].clone()).or_insert(json!(0));
        *c = json!(c.as_u64().unwrap_or(0) + 1);
    }
    if before.len() != ds.file_count {
        bail!(
            "gfwhere listed {} files after gfpcopy, the dataset has {}",
            before.len(),
            ds.file_count
        );
    }
    let cmd_line = format!("gfprep -N 1 -D siteb -j {j} gfarm://{dir}");
    let (o, p) = measured(lab, || {
        run_bounded(
            g.sh(a0, "gfarm2-bench.conf", &cmd_line),
            limit,
            &g.dir.join(format!("gfprep-r{n}")),
        )
    })?;
    if !o.ok() {
        problems.push(format!("gfprep: {}", o.why()));
    }
    let w1 = g.must(
        a0,
        &format!("gfwhere -r {dir}"),
        Duration::from_secs(120),
        "gfwhere1",
    )?;
    let after = parse_gfwhere(&w1.stdout_text());
    let mut per_node = serde_json::Map::new();
    let mut on_b: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    let mut replicas_b_total = 0;
    for (path, hs) in &after {
        for h in hs {
            let c = per_node.entry(h.clone()).or_insert(json!(0));
            *c = json!(c.as_u64().unwrap_or(0) + 1);
        }
        let bs: Vec<&String> = hs.iter().filter(|h| h.ends_with(".siteb")).collect();
        replicas_b_total += bs.len();
        match bs.first() {
            Some(b) => on_b.entry((*b).clone()).or_default().push(path.clone()),
            None => problems.push(format!("{path}: no replica at site B (on {hs:?})")),
        }
    }
    if after.len() != ds.file_count {
        problems.push(format!(
            "gfwhere listed {} files, the dataset has {}",
            after.len(),
            ds.file_count
        ));
    }
    // The B replicas' content: each B gfsd recomputes the md5 of its replicas.
    let mut cksum_ok = 0;
    for (host, files) in &on_b {
        let o = run_bounded(
            g.sh(
                a0,
                "gfarm2-bench.conf",
                &format!("gfcksum -c -h {host} {}", files.join(" ")),
            ),
            limit,
            &g.dir.join(format!("gfcksum-r{n}-{host}")),
        )?;
        if o.ok() {
            cksum_ok += files.len();
        } else {
            problems.push(format!("gfcksum -c -h {host}: {}", o.why()));
        }
    }
    let files_b = on_b.values().map(Vec::len).sum::<usize>();
    let rm = run_bounded(
        g.sh(a0, "gfarm2-bench.conf", &format!("gfrm -r {dir}")),
        Duration::from_secs(120),
        &g.dir.join("gfrm"),
    )?;
    let ok = problems.is_empty() && files_b == ds.file_count && cksum_ok == ds.file_count;
    if !rm.ok() {
        problems.push(format!("gfrm -r {dir}: {}", rm.why()));
    }
    let row = json!({
        "run": n,
        "command": cmd_line,
        "ok": ok,
        "problems": problems,
        "upload_seconds": up.secs,
        "site_a_spread": spread,
        "files_with_b_replica": files_b,
        "replicas_at_b": replicas_b_total,
        "files_checksum_ok_at_b": cksum_ok,
        "replicas_per_node": per_node,
        "stderr_tail": o.stderr_text().lines().rev().take(6).collect::<Vec<_>>(),
    });
    Ok(with_measurement(row, n, "gfprep", ds.bytes, &p, rate))
}

/// Copies the logs and command outputs (not the data) out of the scratch directory.
fn keep_logs(work: &Path, logs: &Path) {
    let _ = fs::remove_dir_all(logs);
    for sub in ["grid", "gridftp", "gfarm", "gfarm/run/var/log"] {
        let Ok(dir) = fs::read_dir(work.join(sub)) else {
            continue;
        };
        for e in dir.flatten() {
            let p = e.path();
            let ext = p.extension().and_then(|x| x.to_str()).unwrap_or("");
            if p.is_file() && matches!(ext, "log" | "out" | "err") {
                let to = logs.join(sub);
                let _ = fs::create_dir_all(&to);
                let _ = fs::copy(&p, to.join(e.file_name()));
            }
        }
    }
}

fn render(cmd: &Command) -> String {
    let mut v = vec![cmd.get_program().to_string_lossy().into_owned()];
    v.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    v.join(" ")
}

fn now_utc() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

fn version(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .and_then(|o| {
            let t = format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            t.lines()
                .map(str::trim)
                .find(|l| !l.is_empty())
                .map(String::from)
        })
        .unwrap_or_else(|| "not available".into())
}

fn main() -> Result<()> {
    let args = Args::parse();
    let haul = fs::canonicalize(&args.haul).context("haul binary")?;
    let started = now_utc();
    if let Err(why) = netlab::Lab::available() {
        bail!("netlab cannot run here: {why}");
    }
    let _ = fs::remove_dir_all(&args.work);
    fs::create_dir_all(&args.work)?;
    chmod(&args.work, 0o755)?;
    let result = run(&args, &haul, &started);
    keep_logs(&args.work, &args.logs);
    let _ = fs::remove_dir_all(&args.work);
    let doc = result?;
    let failed = doc["ok"] != true;
    fs::create_dir_all(&args.out)?;
    let base = format!(
        "{}-repl{}",
        &started[..10.min(started.len())],
        if args.quick { "-quick" } else { "" }
    );
    fs::write(
        args.out.join(format!("{base}.json")),
        serde_json::to_string_pretty(&doc)? + "\n",
    )?;
    let md = markdown(&doc);
    fs::write(args.out.join(format!("{base}.md")), &md)?;
    print!("{md}");
    eprintln!(
        "haul-replbench: wrote {}/{base}.{{md,json}}",
        args.out.display()
    );
    if failed {
        bail!("a row failed (see the results)");
    }
    Ok(())
}

/// Lines of the storage nodes' logs saying their streams switched congestion control.
fn cc_switches(dir: &Path, lab: &netlab::Lab) -> Vec<String> {
    let mut out = Vec::new();
    for h in lab.hosts() {
        let text = fs::read_to_string(dir.join(format!("{}.log", h.name()))).unwrap_or_default();
        for l in text.lines().filter(|l| l.contains("switched from")) {
            // Without the colour codes of the log.
            let mut clean = String::new();
            let mut esc = false;
            for ch in l.chars() {
                match (esc, ch) {
                    (false, '\u{1b}') => esc = true,
                    (true, 'm') => esc = false,
                    (false, c) => clean.push(c),
                    _ => {}
                }
            }
            out.push(format!("{}: {}", h.name(), clean.trim()));
        }
    }
    out
}

/// One measured replication: upload into /repl/rN at site A (not measured), `haul replicate`
/// timed, placement and content checked, then the directory removed to free the memory.
fn haul_run(
    g: &Grid,
    lab: &netlab::Lab,
    ds: &Dataset,
    n: u64,
    limit: Duration,
    rate: u64,
) -> Result<Value> {
    let mut problems: Vec<String> = Vec::new();
    let dir = format!("/repl/r{n}");
    let o = g.run(&["mkdir", "-p", &dir], Duration::from_secs(30), "mkdir")?;
    if !o.ok() {
        bail!("haul mkdir -p {dir}: {}", o.why());
    }
    let src = ds.root.display().to_string();
    let dst = format!("{}{dir}/", g.meta_url);
    let up = g.run(
        &[
            "cp",
            "-r",
            "--site",
            "A",
            "--json",
            "--progress",
            "never",
            &src,
            &dst,
        ],
        limit,
        "upload",
    )?;
    if !up.ok() {
        bail!("upload into site A: {}", up.why());
    }
    let grid_dir = format!("{dir}/{}", ds.name());
    let switches0 = cc_switches(&g.dir, lab).len();
    let repl_args = [
        "replicate",
        "-r",
        "--copies",
        "2",
        "--site",
        "B",
        "--json",
        "--progress",
        "never",
        grid_dir.as_str(),
    ];
    let (ro, rp) = measured(lab, || g.run(&repl_args, limit, "replicate"))?;
    let switches: Vec<String> = cc_switches(&g.dir, lab).split_off(switches0);
    let report = last_json(&ro.stdout_text());
    if !ro.ok() {
        problems.push(format!("haul replicate: {}", ro.why()));
    }
    let placement = check_placement(g, ds, &grid_dir)?;
    for p in placement["problems"].as_array().into_iter().flatten() {
        problems.push(format!("placement: {}", p.as_str().unwrap_or("")));
    }
    let v = g.run(
        &["verify", "-r", "--no-repair", "--json", &grid_dir],
        limit,
        "verify",
    )?;
    let verify = last_json(&v.stdout_text());
    if !v.ok() {
        problems.push(format!("haul verify -r --no-repair: {}", v.why()));
    }
    let ok = problems.is_empty()
        && placement["files_with_complete_b_replica"].as_u64() == Some(ds.file_count as u64);
    let rm = g.run(&["rm", "-r", &dir], Duration::from_secs(120), "rm")?;
    if !rm.ok() {
        problems.push(format!("haul rm -r {dir}: {}", rm.why()));
    }
    let row = json!({
        "run": n,
        "command": format!("haul {}", repl_args.join(" ")),
        "ok": ok,
        "problems": problems,
        "upload_seconds": up.secs,
        "upload_report_bytes_moved": last_json(&up.stdout_text())["bytes_moved"],
        "cc_switches": switches,
        "report": report,
        "placement": placement,
        "verify": verify,
    });
    Ok(with_measurement(
        row,
        n,
        "haul replicate",
        ds.bytes,
        &rp,
        rate,
    ))
}

/// One measured globus-url-copy run, its copy compared byte for byte and then removed.
fn globus_run(
    lab: &netlab::Lab,
    work: &Path,
    ds: &Dataset,
    n: u64,
    limit: Duration,
    rate: u64,
) -> Value {
    match globus(lab, work, ds, limit) {
        Ok((o, p, shown)) => {
            let copy = if o.ok() {
                data::verify(ds, &work.join("globus-dst"))
            } else {
                Err("transfer failed".into())
            };
            let _ = fs::remove_dir_all(work.join("globus-dst"));
            let mut problems = Vec::new();
            if !o.ok() {
                problems.push(format!("globus-url-copy: {}", o.why()));
            }
            if let Err(e) = &copy {
                problems.push(format!("globus-url-copy copy differs: {e}"));
            }
            let row = json!({
                "run": n,
                "command": shown,
                "ok": problems.is_empty(),
                "problems": problems,
                "copy_identical": copy.is_ok(),
                "stderr_tail": o.stderr_text().lines().rev().take(6).collect::<Vec<_>>(),
            });
            with_measurement(row, n, "globus-url-copy", ds.bytes, &p, rate)
        }
        Err(e) => json!({"run": n, "ok": false, "problems": [format!("globus-url-copy: {e:#}")]}),
    }
}

/// The run with the median time (the lower middle one for an even count).
fn median(rows: &[Value]) -> Value {
    let mut ok: Vec<&Value> = rows.iter().filter(|r| r["ok"] == true).collect();
    ok.sort_by(|a, b| {
        let (x, y) = (
            a["seconds"].as_f64().unwrap_or(f64::MAX),
            b["seconds"].as_f64().unwrap_or(f64::MAX),
        );
        x.total_cmp(&y)
    });
    if ok.is_empty() {
        return Value::Null;
    }
    ok[(ok.len() - 1) / 2].clone()
}

fn run(args: &Args, haul: &Path, started: &str) -> Result<Value> {
    let s5 = plan::scenarios()
        .into_iter()
        .find(|s| s.id == "S5")
        .ok_or_else(|| anyhow!("no S5 scenario in plan.rs"))?;
    let rate = s5.rate_bps.ok_or_else(|| anyhow!("S5 has no link rate"))?;
    let limit = Duration::from_secs(args.limit);

    eprintln!("haul-replbench: generating W2");
    let w2_bytes = plan::w2_bytes(args.quick);
    let ds = data::tree(
        &args.work.join("data"),
        "W2",
        "w2",
        &data::climate_sizes(w2_bytes, 5),
        200,
    )?;
    eprintln!(
        "haul-replbench: W2 = {} files, {} bytes",
        ds.file_count, ds.bytes
    );

    let csv = args.work.join("link.csv");
    let lab = netlab::Lab::builder()
        .site("a", HOSTS_PER_SITE)
        .site("b", HOSTS_PER_SITE)
        .rate_bps(rate)
        .rtt(s5.rtt())
        .loss(s5.loss)
        .mtu(9000)
        .profile(s5.profile)
        .congestion("cubic")
        .record_csv(&csv)
        .build()
        .map_err(|e| anyhow!("netlab: {e}"))?;

    // The grid; each run uploads into site A (not measured) and replicates to site B.
    let g = Grid::start(&args.work.join("grid"), haul, &lab)?;
    eprintln!("haul-replbench: grid up (meta {}, 8 nodes)", g.meta_url);
    let mut haul_rows = Vec::new();
    for n in 0..args.runs {
        haul_rows.push(haul_run(&g, &lab, &ds, n, limit, rate)?);
    }
    drop(g);
    let _ = fs::remove_dir_all(args.work.join("grid").join("nodes"));

    // Gfarm's gfprep, site A gfsds to site B gfsds, in the same lab.
    let mut gfprep_rows = Vec::new();
    let mut gfprep_not_run: Option<String> = None;
    if args.no_gfarm {
        gfprep_not_run = Some("--no-gfarm".into());
    } else if let Some(why) = Gfarm::missing() {
        let install = std::env::var("HAUL_REPL_GFARM_INSTALL").unwrap_or_default();
        gfprep_not_run = Some(if install.is_empty() {
            why
        } else {
            format!("{why} ({install})")
        });
    } else {
        match Gfarm::start(&args.work.join("gfarm"), &lab) {
            Ok(mut gf) => {
                eprintln!("haul-replbench: gfarm up (gfmd in a0, 8 gfsd)");
                for n in 0..args.runs {
                    match gfprep_run(&gf, &lab, &ds, (n, args.gfprep_j), limit, rate) {
                        Ok(v) => gfprep_rows.push(v),
                        Err(e) => {
                            eprintln!("haul-replbench: run {n}: gfprep: {e:#}");
                            gfprep_rows.push(
                                json!({"run": n, "ok": false, "problems": [format!("gfprep: {e:#}")]}),
                            )
                        }
                    }
                }
                gf.stop();
            }
            Err(e) => {
                eprintln!("haul-replbench: gfarm set-up failed: {e:#}");
                gfprep_not_run = Some(format!("Gfarm set-up failed: {e:#}"));
            }
        }
        // The spools (about twice the dataset) and the database; the logs stay for keep_logs.
        let var = args.work.join("gfarm/run/var");
        for e in fs::read_dir(&var).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("gfarm-spool-") || name == "gfarm-pgsql" {
                let _ = fs::remove_dir_all(e.path());
            }
        }
    }

    // globus-url-copy, a0 to b0, in the same lab.
    let mut globus_rows = Vec::new();
    if !args.no_globus {
        for n in 0..args.runs {
            globus_rows.push(globus_run(&lab, &args.work, &ds, n, limit, rate));
        }
    }
    let lab_stats = lab.stats();
    let queue_bytes = lab.config().links[0].queue_bytes;
    drop(lab); // flushes the router CSV
    for r in haul_rows
        .iter_mut()
        .chain(gfprep_rows.iter_mut())
        .chain(globus_rows.iter_mut())
    {
        let w = &r["window_ms"];
        if let (Some(a), Some(b)) = (w[0].as_u64(), w[1].as_u64()) {
            r["link_bytes_per_s"] = json!(per_second(&csv, (a, b)));
        }
    }

    let problems: Vec<Value> = haul_rows
        .iter()
        .chain(gfprep_rows.iter())
        .chain(globus_rows.iter())
        .flat_map(|r| {
            r["problems"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(|p| json!(format!("run {}: {}", r["run"], p.as_str().unwrap_or(""))))
        })
        .collect();
    let hm = median(&haul_rows);
    let gm = median(&globus_rows);
    let ratio = match (hm["gbit_per_s"].as_f64(), gm["gbit_per_s"].as_f64()) {
        (Some(h), Some(g)) if g > 0.0 => Some(h / g),
        _ => None,
    };
    let fm = median(&gfprep_rows);
    let ratio_gfprep = match (hm["gbit_per_s"].as_f64(), fm["gbit_per_s"].as_f64()) {
        (Some(h), Some(g)) if g > 0.0 => Some(h / g),
        _ => None,
    };
    let gfprep = match &gfprep_not_run {
        Some(why) => json!({"not_run": why}),
        None => fm,
    };
    let mut sizes: Vec<u64> = ds.files.iter().map(|f| f.1).collect();
    sizes.sort();
    Ok(json!({
        "started": started,
        "quick": args.quick,
        "runs": args.runs,
        "ok": problems.is_empty() && !haul_rows.is_empty(),
        "problems": problems,
        "link": {
            "scenario": s5.id,
            "rate_bps": rate,
            "rtt_ms": s5.rtt_ms,
            "loss": s5.loss,
            "mtu": 9000,
            "profile": s5.profile_name,
            "congestion": "cubic",
            "hosts_per_site": HOSTS_PER_SITE,
            "queue_bytes": queue_bytes,
            "emulator_cpu_s": lab_stats.emulator_cpu_s,
        },
        "dataset": {
            "id": ds.id,
            "description": plan::workload_description("W2", args.quick),
            "files": ds.file_count,
            "bytes": ds.bytes,
            "median_file_bytes": sizes.get(sizes.len() / 2),
            "largest_file_bytes": sizes.last(),
        },
        "haul_replicate": hm,
        "globus_url_copy": gm,
        "ratio_haul_to_globus": ratio,
        "gfprep": gfprep,
        "gfprep_j": args.gfprep_j,
        "ratio_haul_to_gfprep": ratio_gfprep,
        "haul_replicate_runs": haul_rows,
        "gfprep_runs": gfprep_rows,
        "globus_url_copy_runs": globus_rows,
        "versions": {
            "haul": version(&haul.to_string_lossy(), &["--version"]),
            "globus-url-copy": version("globus-url-copy", &["-version"]),
            "globus-gridftp-server": version("globus-gridftp-server", &["-version"]),
            "gfarm": version(
                "dpkg-query",
                &["-W", "-f", "Gfarm ${Version} (gfmd, gfsd, gfarm-client)", "gfarm-client"],
            ),
        },
    }))
}

fn f2(v: &Value) -> String {
    v.as_f64()
        .map(|x| format!("{x:.2}"))
        .unwrap_or_else(|| "-".into())
}

fn f1(v: &Value) -> String {
    v.as_f64()
        .map(|x| format!("{x:.1}"))
        .unwrap_or_else(|| "-".into())
}

/// The columns every transfer's row starts with: run, transfer, seconds, Gbit/s, % of link,
/// link bytes, drops.
fn row_head(r: &Value, tool: &str) -> String {
    format!(
        "| {} | {tool}{} | {} | {} | {} | {} | {} |",
        r["run"],
        if r["ok"] == true { "" } else { " FAILED" },
        f1(&r["seconds"]),
        f2(&r["gbit_per_s"]),
        f1(&r["pct_link"]),
        r["link_bytes_a_to_b"],
        r["link_drops"],
    )
}

fn markdown(doc: &Value) -> String {
    let d = &doc["dataset"];
    let l = &doc["link"];
    let gib = d["bytes"].as_f64().unwrap_or(0.0) / (1u64 << 30) as f64;
    let runs = doc["runs"].as_u64().unwrap_or(1);
    let mut s = format!(
        "# Grid replication across a shared WAN link (issue 5), {}\n\n\
         Generated by `bench/repl{}`. netlab scenario {}: two sites of {} hosts sharing one \
         emulated {} Gbit/s, {} ms RTT link (loss {}, queue {} bytes, MTU {}, {} hosts, {}), \
         everything on one machine with 2 cores shared by the emulator, the grid and the tools. \
         Numbers as measured in this run.\n\n\
         Dataset: W2, {} ({} files, {} bytes = {:.2} GiB, median file {} bytes), on tmpfs.\n\n",
        doc["started"].as_str().unwrap_or(""),
        match (doc["quick"] == true, runs) {
            (true, 1) => " --quick".to_string(),
            (true, n) => format!(" --quick --runs {n}"),
            (false, 1) => String::new(),
            (false, n) => format!(" --runs {n}"),
        },
        l["scenario"].as_str().unwrap_or(""),
        l["hosts_per_site"],
        l["rate_bps"].as_f64().unwrap_or(0.0) / 1e9,
        l["rtt_ms"],
        l["loss"],
        l["queue_bytes"],
        l["mtu"],
        l["profile"].as_str().unwrap_or(""),
        l["congestion"].as_str().unwrap_or(""),
        d["description"].as_str().unwrap_or(""),
        d["files"],
        d["bytes"],
        gib,
        d["median_file_bytes"],
    );
    let (h, g) = (&doc["haul_replicate"], &doc["globus_url_copy"]);
    let fp = &doc["gfprep"];
    let ratio = |k: &str| {
        doc[k]
            .as_f64()
            .map(|x| format!("{x:.2}x"))
            .unwrap_or_else(|| "-".into())
    };
    let gfprep_row = match fp["not_run"].as_str() {
        Some(why) => format!(
            "not run: {} | - | -",
            why.replace('|', "/").replace('\n', " ")
        ),
        None => format!(
            "{} | {} | {}",
            f1(&fp["seconds"]),
            f2(&fp["gbit_per_s"]),
            f1(&fp["pct_link"])
        ),
    };
    s += &format!(
        "## Result{}\n\n| transfer | seconds | Gbit/s (payload) | % of the link |\n|---|---|---|---|\n\
         | `haul replicate -r --copies 2 --site B` (4 nodes at A to 4 at B) | {} | {} | {} |\n\
         | Gfarm `gfprep -N 1 -D siteb -j {}` (4 gfsd at A to 4 at B) | {gfprep_row} |\n\
         | `globus-url-copy -r -cd -fast -cc {GLOBUS_CC} -pp -p {GLOBUS_P} -tcp-bs …` (a0 to b0) | {} | {} | {} |\n\n\
         haul replicate / gfprep throughput: {}; haul replicate / globus-url-copy throughput: {}\n\n",
        if runs > 1 {
            format!(" (median of {runs} runs each)")
        } else {
            String::new()
        },
        f1(&h["seconds"]),
        f2(&h["gbit_per_s"]),
        f1(&h["pct_link"]),
        doc["gfprep_j"],
        f1(&g["seconds"]),
        f2(&g["gbit_per_s"]),
        f1(&g["pct_link"]),
        ratio("ratio_haul_to_gfprep"),
        ratio("ratio_haul_to_globus"),
    );
    s += "Seconds are wall time of the whole command (connection, planning, transfer, end); \
          Gbit/s = dataset bytes x 8 / seconds. Uploads into site A (from a0, not over the WAN) \
          are not counted. Link bytes and drops are the emulator's counters for direction a→b \
          over the command (payload, headers and retransmissions; drops are all queue overflow, \
          the link has no random loss).\n\n\
          Gfarm (private mode: gfmd and its PostgreSQL in a0, a gfsd in each of the 8 hosts, \
          named a0.sitea … b3.siteb): each run registers the dataset with `gfpcopy -D sitea` \
          (one copy per file, spread over the 4 site A gfsds; not counted), then times \
          `gfprep`, whose site B gfsds pull the files from the site A ones. gfprep's `-N` counts \
          replicas inside the `-D` domain, so `-N 1 -D siteb` is the counterpart of \
          `--copies 2 --site B` (`-N 2 -D siteb` makes two copies at B). `-j 8` (the default of `--gfprep-j`): each copy is one \
          gfsd-to-gfsd TCP stream and each file waits on several 100 ms round trips to gfmd in \
          a0, so two copies per destination gfsd keep the link busy without crowding the \
          2 cores. Checked: every file has a replica at B (`gfwhere`) whose md5 the B gfsd \
          recomputes to the one recorded at registration (`gfcksum -c -h`).\n\n## Every run\n\n\
          | run | transfer | seconds | Gbit/s | % of link | link bytes a→b | drops | checked | congestion-control switches |\n\
          |---|---|---|---|---|---|---|---|---|\n";
    for r in doc["haul_replicate_runs"].as_array().into_iter().flatten() {
        let pl = &r["placement"];
        s += &format!(
            "{} {} of {} files with a complete, checksum-matching replica at B; verify: {} replicas, {} damaged | {} |\n",
            row_head(r, "haul replicate"),
            pl["files_with_complete_b_replica"],
            d["files"],
            r["verify"]["checked"],
            r["verify"]["damaged"]
                .as_array()
                .map(|a| a.len().to_string())
                .unwrap_or_else(|| "-".into()),
            r["cc_switches"].as_array().map(|a| a.len()).unwrap_or(0),
        );
    }
    for r in doc["gfprep_runs"].as_array().into_iter().flatten() {
        s += &format!(
            "{} {} of {} files with a replica at B, {} with its md5 recomputed there; {} replicas at B | |\n",
            row_head(r, "gfprep"),
            r["files_with_b_replica"],
            d["files"],
            r["files_checksum_ok_at_b"],
            r["replicas_at_b"],
        );
    }
    if let Some(why) = fp["not_run"].as_str() {
        s += &format!(
            "| - | gfprep | not run: {} | | | | | | |\n",
            why.replace('|', "/").replace('\n', " ")
        );
    }
    for r in doc["globus_url_copy_runs"].as_array().into_iter().flatten() {
        s += &format!(
            "{} copy {} | |\n",
            row_head(r, "globus-url-copy"),
            if r["copy_identical"] == true {
                "identical byte for byte"
            } else {
                "NOT identical / not made"
            },
        );
    }
    let bins = |v: &Value| {
        v.as_array()
            .map(|a| {
                a.iter()
                    .map(|b| format!("{:.0}", b.as_f64().unwrap_or(0.0) * 8.0 / 1e6))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default()
    };
    s += "\nLink a→b per second (Mbit/s, emulator):\n\n";
    for (name, key) in [
        ("haul replicate", "haul_replicate_runs"),
        ("gfprep", "gfprep_runs"),
        ("globus-url-copy", "globus_url_copy_runs"),
    ] {
        for r in doc[key].as_array().into_iter().flatten() {
            s += &format!(
                "- {name}, run {}: {}\n",
                r["run"],
                bins(&r["link_bytes_per_s"])
            );
        }
    }
    let switches: Vec<String> = doc["haul_replicate_runs"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|r| {
            let n = r["run"].clone();
            r["cc_switches"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(move |x| format!("run {n}, {}", x.as_str().unwrap_or("")))
        })
        .collect();
    if !switches.is_empty() {
        s += "\nStorage nodes switching congestion control during `haul replicate`:\n\n";
        for x in switches {
            s += &format!("- {x}\n");
        }
    }
    if let Some(nodes) = h["report"]["nodes"].as_array() {
        s += &format!(
            "\nBytes per node in the median `haul replicate` run (its own report: {} bytes for {} bytes of files):\n\n| node | sent | received |\n|---|---|---|\n",
            h["report"]["bytes"], d["bytes"]
        );
        for n in nodes {
            s += &format!(
                "| {} | {} | {} |\n",
                n["node"].as_str().unwrap_or(""),
                n["bytes_sent"],
                n["bytes_received"]
            );
        }
    }
    if let Some(p) = doc["problems"].as_array().filter(|p| !p.is_empty()) {
        s += "\nProblems:\n\n";
        for x in p {
            s += &format!("- {}\n", x.as_str().unwrap_or(""));
        }
    }
    s += &format!(
        "\nVersions: {}; {}; {}; {}.\n",
        doc["versions"]["haul"].as_str().unwrap_or(""),
        doc["versions"]["gfarm"].as_str().unwrap_or(""),
        doc["versions"]["globus-url-copy"].as_str().unwrap_or(""),
        doc["versions"]["globus-gridftp-server"]
            .as_str()
            .unwrap_or(""),
    );
    s
}
