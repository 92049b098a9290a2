//! haul-faultbench: the fault campaign of issue 11 (B). A dataset is copied across an emulated
//! WAN (netlab: 1 Gbit/s, 50 ms RTT, MTU 9000, tuned hosts, cubic) while something fails at a
//! random point of the transfer:
//!
//! - `receiver`: the receiving `haul serve` is killed (SIGKILL) during an upload and started
//!   again 2 s later at the same address; the command's own retries finish the copy;
//! - `sender`: the sending `haul serve` is killed during a download and started again;
//! - `client`: the `haul cp` doing an upload is killed; the user runs it again with `--resume`;
//! - `node`: the storage node serving a grid download is killed; the client fails over to
//!   another replica and resumes its partial files;
//! - `outage`: the link goes dark for 10-90 s during an upload (the stall timeout is 60 s:
//!   short outages are ridden out, long ones cancel the attempt and the retry resumes).
//!
//! After each trial: the command's exit code, every file compared byte for byte under its
//! requested name, no temporary file (`.haul-part`, `.haul-ledger`, `.tmp`) left, and the bytes
//! sent again: payload bytes that crossed the bottleneck in the data's direction (the emulator's
//! count, less 52 bytes of IP and TCP headers per packet) minus the dataset. The bound is one
//! checkpoint interval's worth of data at the transfer's rate per interruption, plus what the
//! path holds in flight (a bandwidth-delay product). Writes
//! bench/results/<date>-faults.{md,json}; run it through `bench/faults` (root).

#[allow(dead_code)]
#[path = "../data.rs"]
mod data;
#[allow(dead_code)]
#[path = "../labgrid.rs"]
mod labgrid;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use serde_json::{Value, json};

use data::{Dataset, MIB, Rng};
use labgrid::{Grid, Proc, last_json};

const PORT: u16 = 5811;
/// The link and the rate cap of the transfers (so that a trial lasts long enough to be cut).
const LINK_BPS: u64 = 1_000_000_000;
const RTT_MS: u64 = 50;
const RATE: &str = "400M";
const RATE_BPS: u64 = 400_000_000;
/// How often receivers make their data durable and record it (both `serve` and `cp`).
const CHECKPOINT_S: u64 = 1;
/// IPv4 + TCP with timestamps.
const HEADER_BYTES: u64 = 52;

#[derive(Parser, Debug)]
struct Args {
    /// The haul binary (a release build).
    #[arg(long)]
    haul: PathBuf,
    /// Where results go.
    #[arg(long, default_value = "bench/results")]
    out: PathBuf,
    /// Scratch directory on tmpfs (dataset, endpoints' trees, node stores).
    #[arg(long, default_value = "/dev/shm/haul-faultbench")]
    work: PathBuf,
    /// Trials of each kind of fault.
    #[arg(long, default_value_t = 10)]
    trials: usize,
    /// Two trials of each kind and a smaller dataset (a check that it all works).
    #[arg(long)]
    quick: bool,
    /// Only these kinds (receiver,sender,client,node,outage).
    #[arg(long)]
    only: Option<String>,
    /// Seed of the fault points and outage lengths.
    #[arg(long, default_value_t = 11)]
    seed: u64,
    /// The command line to record.
    #[arg(long, default_value = "bench/faults")]
    command_line: String,
}

/// One trial's outcome.
struct Trial {
    kind: &'static str,
    n: usize,
    /// Where in the transfer the fault came (seconds after the start) and, for outages, how long.
    at_s: f64,
    outage_s: Option<f64>,
    exit: Option<i32>,
    seconds: f64,
    correct: Result<(), String>,
    litter: Vec<String>,
    link_payload: u64,
    resent: u64,
    interruptions: u32,
    bound: u64,
    attempts: Option<u64>,
}

/// What a trial's copy did, before it is judged.
struct Run {
    kind: &'static str,
    n: usize,
    at_s: f64,
    outage_s: Option<f64>,
    exit: Option<i32>,
    seconds: f64,
    link_payload: u64,
    interruptions: u32,
    attempts: Option<u64>,
}

impl Trial {
    /// Judges a finished copy: the tree under `landed` against the dataset, the litter left
    /// there, and the bytes the link carried beyond the dataset and `overhead` (what an
    /// undisturbed copy of the same kind puts there).
    fn judge(r: Run, ds: &Dataset, landed: &Path, overhead: u64) -> Trial {
        Trial {
            kind: r.kind,
            n: r.n,
            // A fault point after the end (an undisturbed copy) is the end.
            at_s: r.at_s.min(r.seconds),
            outage_s: r.outage_s,
            exit: r.exit,
            seconds: r.seconds,
            correct: data::verify(ds, landed),
            litter: litter(landed),
            link_payload: r.link_payload,
            resent: r.link_payload.saturating_sub(ds.bytes + overhead),
            interruptions: r.interruptions,
            bound: per_interruption_bound() * r.interruptions.max(1) as u64,
            attempts: r.attempts,
        }
    }

    fn json(&self) -> Value {
        json!({
            "kind": self.kind,
            "trial": self.n,
            "fault_at_s": self.at_s,
            "outage_s": self.outage_s,
            "exit": self.exit,
            "seconds": self.seconds,
            "correct": self.correct.is_ok(),
            "error": self.correct.as_ref().err(),
            "litter": self.litter,
            "link_payload_bytes": self.link_payload,
            "resent_bytes": self.resent,
            "interruptions": self.interruptions,
            "resent_bound_bytes": self.bound,
            "within_bound": self.resent <= self.bound,
            "attempts": self.attempts,
        })
    }

    fn ok(&self) -> bool {
        self.exit == Some(0) && self.correct.is_ok() && self.litter.is_empty()
    }
}

/// Payload bytes the bottleneck delivered from `site` so far: the emulator's byte count less
/// the IP and TCP headers of its packets.
fn payload_from(lab: &netlab::Lab, site: &str) -> u64 {
    lab.stats()
        .direction(site)
        .map(|d| d.bytes.saturating_sub(d.packets * HEADER_BYTES))
        .unwrap_or(0)
}

/// Temporary files of a transfer left under `dir`.
fn litter(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            let n = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                stack.push(p);
            } else if n.ends_with(".haul-part")
                || n.ends_with(".haul-ledger")
                || n.ends_with(".tmp")
            {
                out.push(p.display().to_string());
            }
        }
    }
    out
}

/// `haul serve --insecure` in `host`, exporting `root`; waits until it listens.
fn serve(haul: &Path, host: &netlab::Host, root: &Path, log: &Path) -> Result<Proc> {
    let child = host
        .command(haul)
        .args(["serve", "--insecure", "--root"])
        .arg(root)
        .arg("--listen")
        .arg(format!("{}:{PORT}", host.addr()))
        .args(["--checkpoint-interval", &format!("{CHECKPOINT_S}s")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::OpenOptions::new().create(true).append(true).open(log)?)
        .spawn()
        .context("starting haul serve")?;
    let addr = std::net::SocketAddr::from((host.addr(), PORT));
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(10) {
        let up = host
            .enter(|| {
                std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
            })
            .unwrap_or(false);
        if up {
            return Ok(Proc::adopt(child, log));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!(
        "haul serve did not listen within 10 s (see {})",
        log.display()
    )
}

/// `haul cp` in `host`, in the background, stdout to `out`.
fn spawn_cp(
    haul: &Path,
    host: &netlab::Host,
    args: &[String],
    out: &Path,
    err: &Path,
) -> Result<Child> {
    host.command(haul)
        .args([
            "cp",
            "--insecure",
            "--json",
            "--progress",
            "never",
            "--rate",
            RATE,
        ])
        .args(["--checkpoint-interval", &format!("{CHECKPOINT_S}s")])
        .args(args)
        .stdin(Stdio::null())
        .stdout(fs::File::create(out)?)
        .stderr(fs::File::create(err)?)
        .spawn()
        .context("starting haul cp")
}

fn wait_child(c: &mut Child, limit: Duration) -> Option<i32> {
    let t = Instant::now();
    loop {
        if let Ok(Some(st)) = c.try_wait() {
            return st.code();
        }
        if t.elapsed() > limit {
            let _ = c.kill();
            let _ = c.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How many bytes one interruption may cost: a checkpoint interval at the transfer's rate,
/// and what the path and the socket buffers hold in flight (taken as two bandwidth-delay
/// products of the bottleneck).
fn per_interruption_bound() -> u64 {
    RATE_BPS / 8 * CHECKPOINT_S + 2 * LINK_BPS / 8 * RTT_MS / 1000
}

struct Lab {
    lab: netlab::Lab,
    haul: PathBuf,
    work: PathBuf,
}

impl Lab {
    fn a0(&self) -> &netlab::Host {
        self.lab.host("a", 0)
    }
    fn b0(&self) -> &netlab::Host {
        self.lab.host("b", 0)
    }
    fn url(&self, path: &str) -> String {
        format!("haul://{}:{PORT}/{path}", self.b0().addr())
    }

    /// One endpoint trial: a transfer between a0 and the endpoint in b0, with `fault` applied
    /// `at` into it (`baseline-up`/`baseline-down`: none; `overhead` is what an undisturbed
    /// copy of the same direction puts on the link beyond the dataset, subtracted from what
    /// counts as sent again).
    #[allow(clippy::too_many_arguments)]
    fn endpoint_trial(
        &self,
        kind: &'static str,
        n: usize,
        ds: &Dataset,
        at: f64,
        outage: Option<f64>,
        overhead: u64,
    ) -> Result<Trial> {
        let dir = self.work.join(format!("{kind}-{n}"));
        let _ = fs::remove_dir_all(&dir);
        let (remote, local) = (dir.join("remote"), dir.join("local"));
        fs::create_dir_all(&remote)?;
        fs::create_dir_all(&local)?;
        let log = dir.join("serve.log");
        let download = kind == "sender" || kind == "baseline-down";
        if download {
            // The dataset is on the endpoint's side (hard links: no copying).
            copy_tree_links(&ds.root, &remote.join(ds.name()))?;
        }
        let mut ep = Some(serve(&self.haul, self.b0(), &remote, &log)?);
        let (src, dst, data_site, landed_dir) = if download {
            (
                self.url(&ds.name()),
                local.display().to_string(),
                "b",
                local.clone(),
            )
        } else {
            (
                ds.root.display().to_string(),
                self.url(""),
                "a",
                remote.clone(),
            )
        };
        let mut args = vec!["-r".to_string(), src.clone(), dst.clone()];
        let before = payload_from(&self.lab, data_site);
        let started = Instant::now();
        let (out, err) = (dir.join("cp.out"), dir.join("cp.err"));
        let mut cp = spawn_cp(&self.haul, self.a0(), &args, &out, &err)?;
        if let Some(len) = outage {
            self.lab
                .schedule_blackout(Duration::from_secs_f64(at), Duration::from_secs_f64(len))
                .context("scheduling the outage")?;
        }
        let limit = Duration::from_secs(600);
        let (exit, mut interruptions) = if outage.is_some() {
            (wait_child(&mut cp, limit), 1)
        } else {
            // Wait for the fault point (or the end, if the copy was faster).
            while started.elapsed().as_secs_f64() < at && cp.try_wait()?.is_none() {
                std::thread::sleep(Duration::from_millis(10));
            }
            if let Some(st) = cp.try_wait()? {
                (st.code(), 0)
            } else {
                match kind {
                    "receiver" | "sender" => {
                        drop(ep.take());
                        std::thread::sleep(Duration::from_secs(2));
                        ep = Some(serve(&self.haul, self.b0(), &remote, &log)?);
                    }
                    "client" => {
                        let _ = cp.kill();
                        let _ = cp.wait();
                        args.insert(0, "--resume".into());
                        cp = spawn_cp(&self.haul, self.a0(), &args, &out, &err)?;
                    }
                    _ => bail!("unknown fault {kind}"),
                }
                (wait_child(&mut cp, limit), 1)
            }
        };
        let seconds = started.elapsed().as_secs_f64();
        // A short outage may have ended without interrupting anything: count the attempts.
        let j = last_json(&fs::read_to_string(&out).unwrap_or_default());
        if outage.is_some() {
            interruptions = j["retries"].as_u64().unwrap_or(0) as u32;
        }
        drop(ep);
        let run = Run {
            kind,
            n,
            at_s: at,
            outage_s: outage,
            exit,
            seconds,
            link_payload: payload_from(&self.lab, data_site) - before,
            interruptions,
            attempts: j["attempts"].as_u64(),
        };
        let t = Trial::judge(run, ds, &landed_dir, overhead);
        if t.ok() {
            let _ = fs::remove_dir_all(&dir);
        }
        Ok(t)
    }
}

/// A copy of a tree made of hard links (the dataset lives on the same tmpfs).
fn copy_tree_links(from: &Path, to: &Path) -> Result<()> {
    fs::create_dir_all(to)?;
    for e in fs::read_dir(from)? {
        let e = e?;
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if e.file_type()?.is_dir() {
            copy_tree_links(&src, &dst)?;
        } else {
            fs::hard_link(&src, &dst)?;
        }
    }
    Ok(())
}

/// Node trials: a grid with the metadata server and a node in a0, nodes in b0 and b1; the
/// dataset uploaded with a replica on every node; each trial downloads it at a0 reading from
/// site B, and kills the B node that serves it.
fn node_trials(
    args: &Args,
    haul: &Path,
    ds: &Dataset,
    rng: &mut Rng,
    trials: usize,
    expected_s: f64,
) -> Result<(Trial, Vec<Trial>)> {
    let lab = netlab::Lab::builder()
        .site("a", 1)
        .site("b", 2)
        .rate_bps(LINK_BPS)
        .rtt(Duration::from_millis(RTT_MS))
        .mtu(9000)
        .profile(netlab::Profile::Tuned)
        .congestion("cubic")
        .build()
        .context("building the grid lab")?;
    let dir = args.work.join("grid");
    let _ = fs::remove_dir_all(&dir);
    let mut g = Grid::start(&dir, haul, &lab)?;
    let up = g.run(
        &[
            "cp",
            "-r",
            "--site",
            "B",
            &ds.root.display().to_string(),
            &format!("{}/", g.meta_url),
        ],
        Duration::from_secs(600),
        "upload",
    )?;
    if !up.ok() {
        bail!("grid upload: {}", up.why());
    }
    let name = ds.name();
    let rep = g.run(
        &[
            "replicate",
            "-r",
            "--copies",
            "3",
            "--progress",
            "never",
            &format!("/{name}"),
        ],
        Duration::from_secs(600),
        "replicate",
    )?;
    if !rep.ok() {
        bail!("replicate: {}", rep.why());
    }
    let mut out = Vec::new();
    let mut overhead = 0;
    let mut baseline = None;
    // Trial 0 is undisturbed: the link's overhead beyond the dataset for a grid download.
    for n in 0..=trials {
        let at = if n == 0 {
            f64::MAX
        } else {
            expected_s * (0.2 + 0.6 * rng.unit())
        };
        let local = args.work.join(format!("node-{n}"));
        let _ = fs::remove_dir_all(&local);
        fs::create_dir_all(&local)?;
        let before = payload_from(&lab, "b");
        let started = Instant::now();
        let mut cmd = g.cmd(&[
            "cp",
            "-r",
            "--json",
            "--progress",
            "never",
            "--site",
            "B",
            "--rate",
            RATE,
            "--checkpoint-interval",
            &format!("{CHECKPOINT_S}s"),
            &format!("{}/{name}", g.meta_url),
            &local.display().to_string(),
        ]);
        let (o, e) = (local.with_extension("out"), local.with_extension("err"));
        cmd.stdin(Stdio::null())
            .stdout(fs::File::create(&o)?)
            .stderr(fs::File::create(&e)?);
        let mut cp = cmd.spawn()?;
        while started.elapsed().as_secs_f64() < at && cp.try_wait()?.is_none() {
            std::thread::sleep(Duration::from_millis(10));
        }
        // The B node sending the most right now is the one serving the download.
        let mut killed = None;
        if cp.try_wait()?.is_none() {
            let victim = serving_node(&g, &lab);
            if let Some((name, idx)) = victim {
                let proc_idx = g.procs.len() - lab.hosts().len() + idx;
                g.procs[proc_idx].kill();
                killed = Some((name, idx, proc_idx));
            }
        }
        let exit = wait_child(&mut cp, Duration::from_secs(600));
        let seconds = started.elapsed().as_secs_f64();
        let j = last_json(&fs::read_to_string(&o).unwrap_or_default());
        let run = Run {
            kind: if n == 0 { "baseline-node" } else { "node" },
            n,
            at_s: at,
            outage_s: None,
            exit,
            seconds,
            link_payload: payload_from(&lab, "b") - before,
            interruptions: u32::from(killed.is_some()),
            attempts: j["attempts"].as_u64(),
        };
        let t = Trial::judge(run, ds, &local, overhead);
        eprintln!("faultbench: node {n}: {}", t.json());
        let ok = t.ok();
        if n == 0 {
            overhead = t.link_payload.saturating_sub(ds.bytes);
            baseline = Some(t);
        } else {
            out.push(t);
        }
        if ok {
            let _ = fs::remove_dir_all(&local);
        }
        // The node comes back (as a restarted node would) before the next trial.
        if let Some((_name, idx, proc_idx)) = killed {
            let h = &lab.hosts()[idx];
            g.procs[proc_idx] = g.start_node(h)?;
            g.wait_nodes(lab.hosts().len())?;
        }
    }
    Ok((baseline.expect("trial 0 ran"), out))
}

/// TCP segments sent so far by everything in `host`'s network namespace.
fn out_segs(host: &netlab::Host) -> u64 {
    let text = host
        .enter(|| fs::read_to_string("/proc/thread-self/net/snmp"))
        .ok()
        .and_then(|r| r.ok())
        .unwrap_or_default();
    let mut tcp = text.lines().filter(|l| l.starts_with("Tcp:"));
    let (Some(names), Some(values)) = (tcp.next(), tcp.next()) else {
        return 0;
    };
    let names: Vec<&str> = names.split_whitespace().collect();
    names
        .iter()
        .position(|n| *n == "OutSegs")
        .and_then(|i| values.split_whitespace().nth(i)?.parse().ok())
        .unwrap_or(0)
}

/// The node of site B sending the most now (the one serving the download): by the TCP
/// segments its namespace sends over half a second.
fn serving_node(_g: &Grid, lab: &netlab::Lab) -> Option<(String, usize)> {
    let b: Vec<(usize, &netlab::Host)> = lab
        .hosts()
        .iter()
        .enumerate()
        .filter(|(_, h)| h.site() == "b")
        .collect();
    let before: Vec<u64> = b.iter().map(|(_, h)| out_segs(h)).collect();
    std::thread::sleep(Duration::from_millis(500));
    let (idx, h, sent) = b
        .iter()
        .zip(before)
        .map(|((i, h), s0)| (*i, *h, out_segs(h) - s0))
        .max_by_key(|x| x.2)?;
    (sent > 100).then(|| (h.name().to_string(), idx))
}

fn markdown(doc: &Value) -> String {
    let mut s = format!(
        "# longhaul fault campaign, {}\n\nGenerated by `{}` on {}. netlab: {} Gbit/s, {} ms RTT, MTU 9000, tuned hosts, cubic; transfers capped at {RATE}bit/s, receivers checkpoint every {CHECKPOINT_S} s. Dataset: {} files, {}.\n\nResent bytes = payload that crossed the bottleneck in the data's direction (emulator count less {HEADER_BYTES} bytes of headers per packet) minus the dataset and minus what an undisturbed copy of the same kind puts there. Bound = per interruption one checkpoint interval at the transfer's rate plus two bandwidth-delay products ({} MB).\n\n",
        doc["date"].as_str().unwrap_or(""),
        doc["command"].as_str().unwrap_or(""),
        doc["machine"].as_str().unwrap_or(""),
        LINK_BPS / 1_000_000_000,
        RTT_MS,
        doc["dataset"]["files"],
        data::human(doc["dataset"]["bytes"].as_u64().unwrap_or(0)),
        per_interruption_bound() / 1_000_000,
    );
    let base: Vec<String> = doc["baselines"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|b| {
            format!(
                "{} {:.1} MB in {:.1} s",
                b["kind"]
                    .as_str()
                    .unwrap_or("")
                    .trim_start_matches("baseline-"),
                (b["link_payload_bytes"].as_f64().unwrap_or(0.0)
                    - doc["dataset"]["bytes"].as_f64().unwrap_or(0.0))
                    / 1e6,
                b["seconds"].as_f64().unwrap_or(0.0)
            )
        })
        .collect();
    s += &format!(
        "Undisturbed copies (one each way, and a grid download), beyond the dataset on the link: {}; subtracted from the trials' figures.\n\n",
        base.join(", ")
    );
    s += "| fault | trials | all correct | lost / misplaced / corrupt files | litter | exit 0 | resent per interruption (median / max) | within bound |\n|---|---|---|---|---|---|---|---|\n";
    let trials = doc["trials"].as_array().cloned().unwrap_or_default();
    for kind in ["receiver", "sender", "client", "node", "outage"] {
        let t: Vec<&Value> = trials.iter().filter(|t| t["kind"] == kind).collect();
        if t.is_empty() {
            continue;
        }
        let bad = t.iter().filter(|t| t["correct"] != true).count();
        let litter = t
            .iter()
            .filter(|t| t["litter"].as_array().is_some_and(|a| !a.is_empty()))
            .count();
        let ok_exit = t.iter().filter(|t| t["exit"] == 0).count();
        let mut per: Vec<f64> = t
            .iter()
            .filter(|t| t["interruptions"].as_u64().unwrap_or(0) > 0)
            .map(|t| {
                t["resent_bytes"].as_f64().unwrap_or(0.0)
                    / t["interruptions"].as_f64().unwrap_or(1.0)
            })
            .collect();
        per.sort_by(f64::total_cmp);
        let (med, max) = (
            per.get(per.len() / 2).copied().unwrap_or(0.0),
            per.last().copied().unwrap_or(0.0),
        );
        let within = t.iter().filter(|t| t["within_bound"] == true).count();
        s += &format!(
            "| {kind} | {} | {} | {bad} | {litter} | {ok_exit} | {:.1} / {:.1} MB | {within} of {} |\n",
            t.len(),
            if bad == 0 { "yes" } else { "NO" },
            med / 1e6,
            max / 1e6,
            t.len()
        );
    }
    s += "\n## Every trial\n\n| fault | # | at s | outage s | exit | seconds | correct | litter | attempts | resent MB | bound MB |\n|---|---|---|---|---|---|---|---|---|---|---|\n";
    for t in &trials {
        s += &format!(
            "| {} | {} | {:.1} | {} | {} | {:.1} | {} | {} | {} | {:.1} | {:.1} |\n",
            t["kind"].as_str().unwrap_or(""),
            t["trial"],
            t["fault_at_s"].as_f64().unwrap_or(0.0),
            t["outage_s"]
                .as_f64()
                .map(|o| format!("{o:.0}"))
                .unwrap_or_else(|| "-".into()),
            t["exit"],
            t["seconds"].as_f64().unwrap_or(0.0),
            if t["correct"] == true {
                "yes".to_string()
            } else {
                format!("NO: {}", t["error"].as_str().unwrap_or(""))
            },
            t["litter"].as_array().map(|a| a.len()).unwrap_or(0),
            t["attempts"],
            t["resent_bytes"].as_f64().unwrap_or(0.0) / 1e6,
            t["resent_bound_bytes"].as_f64().unwrap_or(0.0) / 1e6,
        );
    }
    s
}

fn sh(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn main() -> Result<()> {
    let args = Args::parse();
    if let Err(why) = netlab::Lab::available() {
        bail!("netlab cannot run here: {why}");
    }
    let haul = fs::canonicalize(&args.haul).context("--haul")?;
    let kinds: Vec<&str> = args
        .only
        .as_deref()
        .unwrap_or("receiver,sender,client,node,outage")
        .split(',')
        .collect();
    let trials = if args.quick { 2 } else { args.trials };
    fs::create_dir_all(&args.work)?;
    // Files of 8..48 MiB, some small ones: a climate-like mix.
    let mut sizes: Vec<u64> = (0..12).map(|i| (8 + (i * 37) % 41) * MIB).collect();
    sizes.extend([300_000, 64_000, 1_000_000, 5_000]);
    if args.quick {
        sizes.truncate(6);
    }
    // Made afresh each run (a quick run's smaller one may be there).
    let _ = fs::remove_dir_all(args.work.join("ds"));
    let _ = fs::remove_file(args.work.join(".ds.complete"));
    let ds = data::tree(&args.work, "faults", "ds", &sizes, 4242)?;
    let expected_s = ds.bytes as f64 * 8.0 / RATE_BPS as f64;
    eprintln!(
        "faultbench: {} files, {}, about {expected_s:.1} s per copy at {RATE}bit/s",
        ds.file_count,
        data::human(ds.bytes)
    );
    let mut rng = Rng::new(args.seed);
    let mut results: Vec<Trial> = Vec::new();
    let mut baselines: Vec<Trial> = Vec::new();
    let endpoint_kinds: Vec<&'static str> = ["receiver", "sender", "client", "outage"]
        .into_iter()
        .filter(|k| kinds.contains(k))
        .collect();
    if !endpoint_kinds.is_empty() {
        let lab = Lab {
            lab: netlab::Lab::builder()
                .site("a", 1)
                .site("b", 1)
                .rate_bps(LINK_BPS)
                .rtt(Duration::from_millis(RTT_MS))
                .mtu(9000)
                .profile(netlab::Profile::Tuned)
                .congestion("cubic")
                .build()
                .context("building the lab")?,
            haul: haul.clone(),
            work: args.work.clone(),
        };
        // Undisturbed copies, one each way: what the link carries beyond the dataset without
        // any fault (protocol frames, and the blocks the end game sends twice).
        let mut overheads = Vec::new();
        for kind in ["baseline-up", "baseline-down"] {
            let t = lab.endpoint_trial(kind, 1, &ds, f64::MAX, None, 0)?;
            eprintln!("faultbench: {kind}: {}", t.json());
            overheads.push(t.link_payload.saturating_sub(ds.bytes));
            baselines.push(t);
        }
        let (overhead_up, overhead_down) = (overheads[0], overheads[1]);
        for kind in endpoint_kinds {
            for n in 1..=trials {
                let (at, outage) = if kind == "outage" {
                    let len = if args.quick {
                        [15.0, 70.0][(n - 1) % 2]
                    } else {
                        10.0 + 80.0 * rng.unit()
                    };
                    (expected_s * (0.2 + 0.5 * rng.unit()), Some(len))
                } else {
                    (expected_s * (0.2 + 0.6 * rng.unit()), None)
                };
                let overhead = if kind == "sender" {
                    overhead_down
                } else {
                    overhead_up
                };
                let t = lab.endpoint_trial(kind, n, &ds, at, outage, overhead)?;
                eprintln!("faultbench: {kind} {n}: {}", t.json());
                results.push(t);
            }
        }
    }
    if kinds.contains(&"node") {
        let (base, t) = node_trials(&args, &haul, &ds, &mut rng, trials, expected_s)?;
        baselines.push(base);
        results.extend(t);
    }
    let date = sh("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]);
    let machine = format!(
        "{}, {} cores, kernel {}",
        fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(
                |s| s.lines().find(|l| l.starts_with("model name")).map(|l| l
                    .split(':')
                    .nth(1)
                    .unwrap_or("")
                    .trim()
                    .to_string())
            )
            .unwrap_or_default(),
        sh("nproc", &[]),
        sh("uname", &["-r"])
    );
    let doc = json!({
        "date": date,
        "command": args.command_line,
        "machine": machine,
        "haul": haul,
        "dataset": {"files": ds.file_count, "bytes": ds.bytes},
        "baselines": baselines.iter().map(Trial::json).collect::<Vec<_>>(),
        "trials": results.iter().map(Trial::json).collect::<Vec<_>>(),
    });
    fs::create_dir_all(&args.out)?;
    let base = args.out.join(format!(
        "{}-faults{}",
        &date[..10.min(date.len())],
        if args.quick { "-quick" } else { "" }
    ));
    fs::write(
        base.with_extension("json"),
        serde_json::to_string_pretty(&doc)?,
    )?;
    let md = markdown(&doc);
    fs::write(base.with_extension("md"), &md)?;
    print!("{md}");
    let _ = fs::remove_dir_all(args.work.join("ds"));
    let _ = fs::remove_file(args.work.join(".ds.complete"));
    if results.iter().chain(&baselines).any(|t| !t.ok()) {
        bail!("some trials lost, misplaced or corrupted files, left litter or failed (see above)");
    }
    Ok(())
}
