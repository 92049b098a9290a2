//! haul-replbench: grid replication across the emulated S5 link, side by side with
//! globus-url-copy (issue 5). Two sites of 4 hosts each share one emulated 1 Gbit/s, 100 ms RTT
//! link (netlab, settings of scenario S5: MTU 9000, tuned hosts, cubic). A metadata server runs
//! in host a0, a storage node in each host (site A: a0..a3, site B: b0..b3). The W2
//! climate-like dataset (the same files `haul-bench` generates) is uploaded into site A (not
//! measured), then `haul replicate -r --copies 2 --site B` is timed and every file is checked
//! to have a complete, checksum-verified replica at site B. In the same lab the same dataset
//! then goes from a0 to b0 with `globus-url-copy -r -cd -fast -cc 4 -pp -p 4 -tcp-bs ...` (the
//! server in b0 as `haul-bench` runs it) and is compared byte for byte. Writes
//! bench/results/<date>-repl.{md,json}. Run it through `bench/repl` (needs root).

#[allow(dead_code)]
#[path = "../data.rs"]
mod data;
#[allow(dead_code)]
#[path = "../plan.rs"]
mod plan;

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use clap::Parser;
use serde_json::{Value, json};

use data::{Dataset, MIB};

const META_PORT: u16 = 5811;
const NODE_PORT: u16 = 5812;
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

/// A child process killed on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// How a bounded command ended.
struct Outcome {
    code: Option<i32>,
    timed_out: bool,
    secs: f64,
    stdout: String,
    stderr: String,
}

impl Outcome {
    fn ok(&self) -> bool {
        !self.timed_out && self.code == Some(0)
    }
    fn why(&self) -> String {
        let tail: Vec<&str> = self.stderr.lines().rev().take(6).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        if self.timed_out {
            format!("killed at the time limit after {:.0} s", self.secs)
        } else {
            format!("exit {:?}: {}", self.code, tail.join(" | "))
        }
    }
}

/// Runs `cmd` to its end or `limit`, whichever comes first (then kills it); stdout and stderr
/// go to `<log>.out` / `<log>.err` and are returned.
fn run_bounded(mut cmd: Command, limit: Duration, log: &Path) -> Result<Outcome> {
    let out_p = log.with_extension("out");
    let err_p = log.with_extension("err");
    cmd.stdin(Stdio::null())
        .stdout(fs::File::create(&out_p)?)
        .stderr(fs::File::create(&err_p)?);
    let t = Instant::now();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {:?}", cmd.get_program()))?;
    let (code, timed_out) = loop {
        if let Some(st) = child.try_wait()? {
            break (st.code(), false);
        }
        if t.elapsed() >= limit {
            let _ = child.kill();
            let _ = child.wait();
            break (None, true);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let secs = t.elapsed().as_secs_f64();
    Ok(Outcome {
        code,
        timed_out,
        secs,
        stdout: fs::read_to_string(&out_p).unwrap_or_default(),
        stderr: fs::read_to_string(&err_p).unwrap_or_default(),
    })
}

/// The grid: a metadata server in a0 and one storage node per host.
struct Grid<'a> {
    dir: PathBuf,
    haul: PathBuf,
    lab: &'a netlab::Lab,
    meta_url: String,
    procs: Vec<Proc>,
}

fn pki(dir: &Path, haul: &Path, lab: &netlab::Lab) -> Result<()> {
    let run = |args: &[String]| -> Result<()> {
        let out = Command::new(haul).args(args).current_dir(dir).output()?;
        if !out.status.success() {
            bail!(
                "haul {args:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    };
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    run(&s(&["ca", "init", "--dir", "ca"]))?;
    let meta_ip = lab.host("a", 0).addr().to_string();
    run(&s(&[
        "cert", "issue", "--ca", "ca", "--out", "meta", "--host", "meta", "--host", &meta_ip,
    ]))?;
    for h in lab.hosts() {
        let ip = h.addr().to_string();
        run(&s(&[
            "cert",
            "issue",
            "--ca",
            "ca",
            "--out",
            h.name(),
            "--host",
            h.name(),
            "--host",
            &ip,
        ]))?;
    }
    run(&s(&[
        "cert", "issue", "--ca", "ca", "--out", "user", "--user", "bench",
    ]))?;
    fs::write(
        dir.join("mapfile"),
        "\"/O=longhaul/OU=users/CN=bench\" nobody\n",
    )?;
    Ok(())
}

impl<'a> Grid<'a> {
    fn start(dir: &Path, haul: &Path, lab: &'a netlab::Lab) -> Result<Grid<'a>> {
        fs::create_dir_all(dir)?;
        pki(dir, haul, lab)?;
        let a0 = lab.host("a", 0);
        let mut cmd = a0.command(haul);
        cmd.args(["meta", "serve", "--listen"])
            .arg(format!("{}:{META_PORT}", a0.addr()))
            .args([
                "--http",
                "off",
                "--data",
                "meta-data",
                "--cert",
                "meta.pem",
                "--key",
                "meta.key",
                "--ca",
                "ca/ca.pem",
                "--mapfile",
                "mapfile",
                "--print-addr",
            ])
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(fs::File::create(dir.join("meta.log"))?);
        let mut child = cmd.spawn().context("starting haul meta serve")?;
        let stdout = child.stdout.take().expect("piped");
        let mut g = Grid {
            dir: dir.to_path_buf(),
            haul: haul.to_path_buf(),
            lab,
            meta_url: String::new(),
            procs: vec![Proc(child)],
        };
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let addr = line
            .split_whitespace()
            .next()
            .ok_or_else(|| anyhow!("meta printed no address (see {}/meta.log)", dir.display()))?;
        g.meta_url = format!("haul://{addr}");
        // Keep reading what else meta prints, so that it never writes into a closed pipe.
        let mut rest = fs::File::create(dir.join("meta.out"))?;
        std::thread::spawn(move || std::io::copy(&mut reader, &mut rest));
        for h in lab.hosts() {
            let site = h.site().to_uppercase();
            let root = dir.join("nodes").join(h.name());
            fs::create_dir_all(&root)?;
            let child = h
                .command(haul)
                .args(["node", "serve", "--meta", &g.meta_url, "--site", &site])
                .arg("--root")
                .arg(&root)
                .arg("--listen")
                .arg(format!("{}:{NODE_PORT}", h.addr()))
                .args(["--capacity", "50G", "--cert"])
                .arg(format!("{}.pem", h.name()))
                .arg("--key")
                .arg(format!("{}.key", h.name()))
                .args(["--ca", "ca/ca.pem"])
                .current_dir(dir)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(fs::File::create(dir.join(format!("{}.log", h.name())))?)
                .spawn()
                .with_context(|| format!("starting node {}", h.name()))?;
            g.procs.push(Proc(child));
        }
        g.wait_nodes(lab.hosts().len())?;
        Ok(g)
    }

    fn wait_nodes(&self, want: usize) -> Result<()> {
        let t = Instant::now();
        let mut last = String::new();
        while t.elapsed() < Duration::from_secs(60) {
            match self.json(&["nodes", "--json"], Duration::from_secs(20)) {
                Ok(v) => {
                    let up = v
                        .as_array()
                        .map(|a| a.iter().filter(|n| n["up"] == true).count())
                        .unwrap_or(0);
                    if up >= want {
                        return Ok(());
                    }
                    last = format!("{up} of {want} up");
                }
                Err(e) => last = format!("{e:#}"),
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        bail!(
            "nodes did not come up within 60 s ({last}; see {}/*.log)",
            self.dir.display()
        )
    }

    /// A haul CLI command run in host a0 with the user's credentials.
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = self.lab.host("a", 0).command(&self.haul);
        c.args(args)
            .current_dir(&self.dir)
            .env("HAUL_CERT", self.dir.join("user.pem"))
            .env("HAUL_KEY", self.dir.join("user.key"))
            .env("HAUL_CA", self.dir.join("ca/ca.pem"))
            .env("HAUL_META", &self.meta_url);
        c
    }

    fn run(&self, args: &[&str], limit: Duration, log: &str) -> Result<Outcome> {
        run_bounded(self.cmd(args), limit, &self.dir.join(log))
    }

    fn json(&self, args: &[&str], limit: Duration) -> Result<Value> {
        let o = self.run(args, limit, "cli")?;
        if !o.ok() {
            bail!("haul {args:?}: {}", o.why());
        }
        serde_json::from_str(&o.stdout).with_context(|| format!("haul {args:?}: not JSON"))
    }
}

/// The last JSON object a command printed on stdout.
fn last_json(s: &str) -> Value {
    s.lines()
        .rev()
        .find_map(|l| serde_json::from_str::<Value>(l).ok())
        .unwrap_or(Value::Null)
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
    let entries = v.as_array().cloned().unwrap_or_default();
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
    let _server = Proc(c.spawn().context("starting globus-gridftp-server")?);
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

/// Copies the logs and command outputs (not the data) out of the scratch directory.
fn keep_logs(work: &Path, logs: &Path) {
    let _ = fs::remove_dir_all(logs);
    for sub in ["grid", "gridftp"] {
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
    let report = last_json(&ro.stdout);
    if !ro.ok() {
        problems.push(format!("haul replicate: {}", ro.why()));
    }
    let gb = gbps(ds.bytes, rp.secs);
    eprintln!(
        "haul-replbench: run {n}: haul replicate {:.1} s ({gb:.3} Gbit/s, {} drops at the bottleneck)",
        rp.secs, rp.link_drops
    );
    let placement = check_placement(g, ds, &grid_dir)?;
    for p in placement["problems"].as_array().into_iter().flatten() {
        problems.push(format!("placement: {}", p.as_str().unwrap_or("")));
    }
    let v = g.run(
        &["verify", "-r", "--no-repair", "--json", &grid_dir],
        limit,
        "verify",
    )?;
    let verify = last_json(&v.stdout);
    if !v.ok() {
        problems.push(format!("haul verify -r --no-repair: {}", v.why()));
    }
    let ok = problems.is_empty()
        && placement["files_with_complete_b_replica"].as_u64() == Some(ds.file_count as u64);
    let rm = g.run(&["rm", "-r", &dir], Duration::from_secs(120), "rm")?;
    if !rm.ok() {
        problems.push(format!("haul rm -r {dir}: {}", rm.why()));
    }
    Ok(json!({
        "run": n,
        "command": format!("haul {}", repl_args.join(" ")),
        "ok": ok,
        "problems": problems,
        "upload_seconds": up.secs,
        "upload_report_bytes_moved": last_json(&up.stdout)["bytes_moved"],
        "seconds": rp.secs,
        "gbit_per_s": gb,
        "pct_link": 100.0 * gb * 1e9 / rate as f64,
        "link_bytes_a_to_b": rp.link_bytes,
        "link_drops": rp.link_drops,
        "window_ms": [rp.window_ms.0, rp.window_ms.1],
        "cc_switches": switches,
        "report": report,
        "placement": placement,
        "verify": verify,
    }))
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
            let gb = gbps(ds.bytes, p.secs);
            eprintln!(
                "haul-replbench: run {n}: globus-url-copy {:.1} s ({gb:.3} Gbit/s, {} drops at the bottleneck)",
                p.secs, p.link_drops
            );
            json!({
                "run": n,
                "command": shown,
                "ok": problems.is_empty(),
                "problems": problems,
                "seconds": p.secs,
                "gbit_per_s": gb,
                "pct_link": 100.0 * gb * 1e9 / rate as f64,
                "link_bytes_a_to_b": p.link_bytes,
                "link_drops": p.link_drops,
                "window_ms": [p.window_ms.0, p.window_ms.1],
                "copy_identical": copy.is_ok(),
                "stderr_tail": o.stderr.lines().rev().take(6).collect::<Vec<_>>(),
            })
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
    for r in haul_rows.iter_mut().chain(globus_rows.iter_mut()) {
        let w = &r["window_ms"];
        if let (Some(a), Some(b)) = (w[0].as_u64(), w[1].as_u64()) {
            r["link_bytes_per_s"] = json!(per_second(&csv, (a, b)));
        }
    }

    let problems: Vec<Value> = haul_rows
        .iter()
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
        "haul_replicate_runs": haul_rows,
        "globus_url_copy_runs": globus_rows,
        "versions": {
            "haul": version(&haul.to_string_lossy(), &["--version"]),
            "globus-url-copy": version("globus-url-copy", &["-version"]),
            "globus-gridftp-server": version("globus-gridftp-server", &["-version"]),
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
    s += &format!(
        "## Result{}\n\n| transfer | seconds | Gbit/s (payload) | % of the link |\n|---|---|---|---|\n\
         | `haul replicate -r --copies 2 --site B` (4 nodes at A to 4 at B) | {} | {} | {} |\n\
         | `globus-url-copy -r -cd -fast -cc {GLOBUS_CC} -pp -p {GLOBUS_P} -tcp-bs …` (a0 to b0) | {} | {} | {} |\n\n\
         haul replicate / globus-url-copy throughput: {}\n\n",
        if runs > 1 {
            format!(" (median of {runs} runs each)")
        } else {
            String::new()
        },
        f1(&h["seconds"]),
        f2(&h["gbit_per_s"]),
        f1(&h["pct_link"]),
        f1(&g["seconds"]),
        f2(&g["gbit_per_s"]),
        f1(&g["pct_link"]),
        doc["ratio_haul_to_globus"]
            .as_f64()
            .map(|x| format!("{x:.2}x"))
            .unwrap_or_else(|| "-".into())
    );
    s += "Seconds are wall time of the whole command (connection, planning, transfer, end); \
          Gbit/s = dataset bytes x 8 / seconds. Uploads into site A (from a0, not over the WAN) \
          are not counted. Link bytes and drops are the emulator's counters for direction a→b \
          over the command (payload, headers and retransmissions; drops are all queue overflow, \
          the link has no random loss).\n\n## Every run\n\n\
          | run | transfer | seconds | Gbit/s | % of link | link bytes a→b | drops | checked | congestion-control switches |\n\
          |---|---|---|---|---|---|---|---|---|\n";
    for r in doc["haul_replicate_runs"].as_array().into_iter().flatten() {
        let pl = &r["placement"];
        s += &format!(
            "| {} | haul replicate{} | {} | {} | {} | {} | {} | {} of {} files with a complete, checksum-matching replica at B; verify: {} replicas, {} damaged | {} |\n",
            r["run"],
            if r["ok"] == true { "" } else { " FAILED" },
            f1(&r["seconds"]),
            f2(&r["gbit_per_s"]),
            f1(&r["pct_link"]),
            r["link_bytes_a_to_b"],
            r["link_drops"],
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
    for r in doc["globus_url_copy_runs"].as_array().into_iter().flatten() {
        s += &format!(
            "| {} | globus-url-copy{} | {} | {} | {} | {} | {} | copy {} | |\n",
            r["run"],
            if r["ok"] == true { "" } else { " FAILED" },
            f1(&r["seconds"]),
            f2(&r["gbit_per_s"]),
            f1(&r["pct_link"]),
            r["link_bytes_a_to_b"],
            r["link_drops"],
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
        "\nVersions: {}; {}; {}.\n",
        doc["versions"]["haul"].as_str().unwrap_or(""),
        doc["versions"]["globus-url-copy"].as_str().unwrap_or(""),
        doc["versions"]["globus-gridftp-server"]
            .as_str()
            .unwrap_or(""),
    );
    s
}
