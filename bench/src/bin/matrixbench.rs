//! haul-matrixbench: the path matrix of issue 12. For every cell of RTT x MTU x host profile x
//! random loss on an emulated 1 Gbit/s link (netlab, drop-tail queue of one bandwidth-delay
//! product, client site a uploading to server site b), in this order:
//!
//! 1. the path is checked: a short iperf3 run that should fill the link (-P 16 bbr, 3 s of
//!    slow start omitted, 5 s measured) must reach 85% of it, and neither the emulator nor the
//!    hosts' devices may have dropped a packet the path model did not (emulator buffer cap,
//!    device writes, TUN overflow; and any drop counter netlab gains later). The same counters
//!    are checked over every later run of the cell;
//! 2. longhaul copies one file with no tuning flags (`haul cp --insecure --json`); the copy is
//!    compared byte for byte and deleted; retransmitted bytes are what the client put on the
//!    bottleneck beyond the file (emulator count less 52 bytes of headers per packet);
//! 3. iperf3 runs each variant (-P 1/8/16 x cubic/bbr; fewer in --quick) for longhaul's wall
//!    time rounded up, slow start included; the best receiver-side rate is the reference;
//! 4. globus-url-copy -p 16 -tcp-bs 2xBDP/16 copies the file (time-boxed to about longhaul's
//!    time when it would take much longer, as haul-bench does; the table says so).
//!
//! Plus the fairness cell: one iperf3 cubic flow alone, then longhaul started beside it, and
//! each one's rate over the time they shared the bottleneck. Writes
//! `bench/results/<date>-matrix[-quick][-partial].{json,md}` after every cell, a heat map PNG
//! (longhaul / best iperf3), and after a full run `bench/MATRIX-RESULTS.md`. Run it through
//! `bench/matrix` (root: namespaces, TUN, cgroups). See bench/README.md.

#[allow(dead_code)]
#[path = "../data.rs"]
mod data;
#[path = "../heatmap.rs"]
mod heatmap;
#[allow(dead_code)]
#[path = "../plan.rs"]
mod plan;
#[allow(dead_code)]
#[path = "../plot.rs"]
mod plot;
#[allow(dead_code)]
#[path = "../proc.rs"]
mod proc;
#[allow(dead_code)]
#[path = "../report.rs"]
mod report;
#[allow(dead_code)]
#[path = "../runner.rs"]
mod runner;
#[allow(dead_code)]
#[path = "../tools.rs"]
mod tools;

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, anyhow, bail};
use clap::Parser;
use serde::Serialize;
use serde_json::{Value, json};

use data::{Dataset, GIB, MIB};
use heatmap::HeatCell;
use plan::{Case, Scenario, Tool, Variant};
use proc::Cgroup;
use report::{Header, utc};
use runner::{Measurement, RunSpec};

const LINK_BPS: u64 = 1_000_000_000;
/// IPv4 + TCP with timestamps: what each packet carries besides payload.
const HEADER_BYTES: u64 = 52;
/// The path check: iperf3 flows that fill the link whatever the loss (BBR v1 ignores random
/// loss) and whatever the host profile (16 flows x stock buffers exceed the largest BDP).
const CHECK_FLAGS: [&str; 8] = ["-P", "16", "-C", "bbr", "-O", "3", "-t", "5"];
const CHECK_MIN_PCT: f64 = 85.0;
/// The goals of issue 12.
const GOAL_RATIO: f64 = 0.90;
const GOAL_RETRANS_PCT: f64 = 1.0;
/// Fairness: longhaul starts this long after the iperf3 flow.
const FAIR_DELAY_S: u64 = 5;

/// The path matrix: longhaul against iperf3 and globus-url-copy on every path.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// The reduced set (CI-sized, about 15 minutes): RTT 50 and 200 ms x MTU 1500 and 9000 x
    /// tuned x loss 0 and 0.1%, 1 GiB, iperf3 -P 16 cubic, -P 16 bbr and -P 1 bbr, no
    /// globus-url-copy, and the fairness cell.
    #[arg(long)]
    quick: bool,
    /// Only the fairness cell (100 ms, MTU 9000, tuned, no loss).
    #[arg(long)]
    fairness: bool,
    /// RTTs to run, ms, comma separated (replaces the set's; e.g. 200).
    #[arg(long, value_name = "LIST")]
    rtt: Option<String>,
    /// MTUs to run, comma separated (1500, 9000).
    #[arg(long, value_name = "LIST")]
    mtu: Option<String>,
    /// Host profiles to run, comma separated (stock, tuned).
    #[arg(long, value_name = "LIST")]
    profile: Option<String>,
    /// Random loss to run, percent, comma separated (0, 0.01, 0.1, 1).
    #[arg(long, value_name = "LIST")]
    loss: Option<String>,
    /// Size of the file copied in each cell (e.g. 256M, 1G) [default: 4G; 1G with --quick].
    #[arg(long, value_name = "SIZE")]
    file_size: Option<String>,
    /// Leave globus-url-copy out (it is never in --quick).
    #[arg(long)]
    no_globus: bool,
    /// The haul binary to measure (a release build).
    #[arg(long, default_value = "/work/target-bench/release/haul")]
    haul: PathBuf,
    /// Repository root (for `git describe` and the default output directory).
    #[arg(long, default_value = ".")]
    repo: PathBuf,
    /// Where results go [default: <repo>/bench/results].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Scratch directory on tmpfs (the file, copies, logs; removed at the end).
    #[arg(long, default_value = "/dev/shm/haul-matrixbench")]
    work: PathBuf,
    /// The command line to record in the results (bench/matrix passes its own).
    #[arg(long)]
    command_line: Option<String>,
    /// What installing the tools gave (bench/matrix passes it).
    #[arg(long, default_value = "not attempted by this program")]
    install_status: String,
    /// Keep the scratch directory (logs of every run) at the end.
    #[arg(long)]
    keep_work: bool,
}

/// One path of the matrix.
#[derive(Clone, Debug, PartialEq, Serialize)]
struct Cell {
    rtt_ms: u64,
    mtu: u32,
    profile: &'static str,
    /// Random loss, percent, each direction.
    loss_pct: f64,
}

impl Cell {
    fn id(&self) -> String {
        format!(
            "r{}-m{}-{}-l{}",
            self.rtt_ms, self.mtu, self.profile, self.loss_pct
        )
    }
    fn loss_label(&self) -> String {
        loss_label(self.loss_pct)
    }
    /// Bandwidth-delay product, bytes.
    fn bdp(&self) -> u64 {
        LINK_BPS / 8 * self.rtt_ms / 1000
    }
    /// The scenario haul-bench's runner builds its lab from.
    fn scenario(&self) -> Scenario {
        let id: &'static str = Box::leak(self.id().into_boxed_str());
        let description: &'static str = Box::leak(
            format!(
                "1 Gbit/s, {} ms RTT, MTU {}, {} hosts, random loss {}",
                self.rtt_ms,
                self.mtu,
                self.profile,
                self.loss_label()
            )
            .into_boxed_str(),
        );
        Scenario {
            id,
            description,
            rate_bps: Some(LINK_BPS),
            rtt_ms: self.rtt_ms,
            loss: self.loss_pct / 100.0,
            mtu: self.mtu,
            profile: if self.profile == "stock" {
                netlab::Profile::Stock
            } else {
                netlab::Profile::Tuned
            },
            profile_name: self.profile,
            pairs: 1,
        }
    }
}

fn loss_label(pct: f64) -> String {
    if pct == 0.0 {
        "0".into()
    } else {
        format!("{pct}%")
    }
}

/// What a run measures: the cells, the file, the iperf3 variants, whether globus-url-copy
/// and the fairness cell run.
#[derive(Clone, Debug, Serialize)]
struct Set {
    name: &'static str,
    rtts: Vec<u64>,
    mtus: Vec<u32>,
    profiles: Vec<&'static str>,
    losses_pct: Vec<f64>,
    file_bytes: u64,
    /// (streams, congestion control).
    iperf3: Vec<(u32, &'static str)>,
    globus: bool,
    fairness: bool,
    /// Whether filters, --file-size, --no-globus or --fairness changed the set.
    filtered: bool,
    /// Whether this is the whole default set (then MATRIX-RESULTS.md is rewritten).
    complete: bool,
}

impl Set {
    fn full() -> Set {
        Set {
            name: "full",
            rtts: vec![10, 50, 100, 200, 300],
            mtus: vec![1500, 9000],
            profiles: vec!["stock", "tuned"],
            losses_pct: vec![0.0, 0.01, 0.1, 1.0],
            file_bytes: 4 * GIB,
            iperf3: vec![
                (1, "cubic"),
                (8, "cubic"),
                (16, "cubic"),
                (1, "bbr"),
                (8, "bbr"),
                (16, "bbr"),
            ],
            globus: true,
            fairness: true,
            filtered: false,
            complete: true,
        }
    }
    fn quick() -> Set {
        Set {
            name: "quick",
            rtts: vec![50, 200],
            mtus: vec![1500, 9000],
            profiles: vec!["tuned"],
            losses_pct: vec![0.0, 0.1],
            file_bytes: GIB,
            iperf3: vec![(16, "cubic"), (16, "bbr"), (1, "bbr")],
            globus: false,
            fairness: true,
            filtered: false,
            complete: false,
        }
    }
    fn from_args(a: &Args) -> Result<Set> {
        let mut s = if a.quick { Set::quick() } else { Set::full() };
        let list = |v: &str| -> Vec<String> {
            v.split(',')
                .map(|x| x.trim().trim_end_matches('%').to_string())
                .filter(|x| !x.is_empty())
                .collect()
        };
        let mut filtered = false;
        if let Some(v) = &a.rtt {
            s.rtts = list(v)
                .iter()
                .map(|x| {
                    x.parse()
                        .map_err(|_| anyhow!("--rtt: {x:?} is not whole ms"))
                })
                .collect::<Result<_>>()?;
            filtered = true;
        }
        if let Some(v) = &a.mtu {
            s.mtus = list(v)
                .iter()
                .map(|x| match x.parse::<u32>() {
                    Ok(m) if (576..=65535).contains(&m) => Ok(m),
                    _ => Err(anyhow!("--mtu: {x:?} is not an MTU (1500, 9000)")),
                })
                .collect::<Result<_>>()?;
            filtered = true;
        }
        if let Some(v) = &a.profile {
            s.profiles = list(v)
                .iter()
                .map(|x| match x.as_str() {
                    "stock" => Ok("stock"),
                    "tuned" => Ok("tuned"),
                    _ => Err(anyhow!("--profile: {x:?}: use stock or tuned")),
                })
                .collect::<Result<_>>()?;
            filtered = true;
        }
        if let Some(v) = &a.loss {
            s.losses_pct = list(v)
                .iter()
                .map(|x| match x.parse::<f64>() {
                    Ok(p) if (0.0..100.0).contains(&p) => Ok(p),
                    _ => Err(anyhow!(
                        "--loss: {x:?} is not a percentage (0, 0.01, 0.1, 1)"
                    )),
                })
                .collect::<Result<_>>()?;
            filtered = true;
        }
        if let Some(v) = &a.file_size {
            s.file_bytes = parse_size(v)?;
            filtered = true;
        }
        if a.no_globus {
            s.globus = false;
            filtered = true;
        }
        if filtered {
            // Rerunning some cells: the fairness cell only when asked for.
            s.fairness = false;
        }
        if a.fairness {
            s.rtts.clear();
            s.fairness = true;
            filtered = true;
        }
        s.filtered = filtered;
        s.complete &= !filtered;
        if s.cells().is_empty() && !s.fairness {
            bail!("the filters selected no cell");
        }
        Ok(s)
    }
    fn cells(&self) -> Vec<Cell> {
        let mut out = Vec::new();
        for &rtt_ms in &self.rtts {
            for &mtu in &self.mtus {
                for &profile in &self.profiles {
                    for &loss_pct in &self.losses_pct {
                        out.push(Cell {
                            rtt_ms,
                            mtu,
                            profile,
                            loss_pct,
                        });
                    }
                }
            }
        }
        out
    }
}

/// "256M", "1G", "4GiB", "1048576" -> bytes (binary units).
fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim().to_ascii_uppercase();
    let t = t.trim_end_matches("IB").trim_end_matches('B');
    let (num, unit) = match t.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => (&t[..i], &t[i..]),
        None => (t, ""),
    };
    let mult = match unit {
        "" => 1,
        "K" => 1024,
        "M" => MIB,
        "G" => GIB,
        _ => bail!("--file-size {s:?}: use a number with K, M or G"),
    };
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| anyhow!("--file-size {s:?}: not a number"))?;
    let b = (n * mult as f64) as u64;
    if b < MIB {
        bail!("--file-size {s:?}: at least 1M");
    }
    Ok(b)
}

/// What one cell measured, and what follows from it.
#[derive(Clone, Debug, Serialize)]
struct CellResult {
    cell: Cell,
    started_utc: String,
    seconds: f64,
    check: Measurement,
    path_ok: bool,
    /// Why the path is (not) trusted: the check's rate and every nonzero drop counter of the
    /// emulator and the hosts' devices over the cell's runs.
    path_evidence: String,
    haul: Measurement,
    /// -t of the iperf3 runs, s, and whether it was capped below longhaul's wall time.
    iperf3_t_s: u64,
    iperf3_t_capped: bool,
    iperf3: Vec<Measurement>,
    globus: Option<Measurement>,
    derived: Derived,
}

/// The table's figures of one cell.
#[derive(Clone, Debug, Default, Serialize)]
struct Derived {
    best_iperf3_variant: Option<String>,
    best_iperf3_mbps: Option<f64>,
    haul_mbps: Option<f64>,
    /// longhaul goodput / best iperf3 goodput.
    ratio: Option<f64>,
    globus_mbps: Option<f64>,
    /// Payload the client put on the bottleneck (emulator's offered bytes less 52 bytes of
    /// headers per packet) minus the file: bytes sent more than once, plus longhaul's own
    /// framing and control messages.
    retransmitted_bytes: Option<i64>,
    retransmitted_pct: Option<f64>,
    /// Payload delivered across the bottleneck minus the file (what the receiver got twice,
    /// plus framing).
    delivered_extra_bytes: Option<i64>,
    haul_tcp_retransmits: Option<u64>,
    retrans_segs: Option<u64>,
    streams: Option<u64>,
    congestion: String,
    plan: String,
    drops_queue: Option<u64>,
    drops_loss: Option<u64>,
    goal_met: Option<bool>,
    /// "yes", "no: ...", "not judged: ..." and notes.
    goal: String,
}

/// The fairness cell's figures.
#[derive(Clone, Debug, Default, Serialize)]
struct Fairness {
    cell: Option<Cell>,
    status: String,
    reason: String,
    iperf3_command: String,
    haul_command: String,
    iperf3_t_s: u64,
    /// When longhaul started and ended, s from the iperf3 flow's first data (emulator's view).
    overlap_start_s: f64,
    overlap_end_s: f64,
    iperf3_alone_mbps: Option<f64>,
    iperf3_mbps: Option<f64>,
    haul_mbps: Option<f64>,
    iperf3_share: Option<f64>,
    haul_share: Option<f64>,
    /// What the bottleneck delivered client to server over the overlap (both flows, headers
    /// included), Mbit/s.
    link_mbps: Option<f64>,
    haul_wall_s: f64,
    haul_report: Value,
    iperf3_retransmits: Option<u64>,
    emulator_trouble: Vec<String>,
    copy_ok: bool,
}

fn main() {
    let args = Args::parse();
    match run(args) {
        Ok(failed) => std::process::exit(if failed { 1 } else { 0 }),
        Err(e) => {
            eprintln!("haul-matrixbench: {e:#}");
            std::process::exit(2);
        }
    }
}

/// Everything a run writes, kept together so it can be rewritten after every cell.
struct Output {
    header: Header,
    set: Set,
    cells: Vec<CellResult>,
    fairness: Option<Fairness>,
    json: PathBuf,
    md: PathBuf,
    png: PathBuf,
    png_name: String,
}

impl Output {
    fn save(&self) -> Result<()> {
        let doc = json!({
            "header": self.header,
            "set": self.set,
            "cells": self.cells,
            "fairness": self.fairness,
        });
        let tmp = self.json.with_extension("json.tmp");
        fs::write(&tmp, serde_json::to_string_pretty(&doc)?)?;
        fs::rename(tmp, &self.json)?;
        let have_map = !self.cells.is_empty() && self.heat_map().is_ok();
        fs::write(
            &self.md,
            markdown(self, have_map.then_some(self.png_name.as_str()), "../"),
        )?;
        Ok(())
    }

    fn heat_map(&self) -> Result<()> {
        let set = &self.set;
        let mut rows = Vec::new();
        let mut cells = Vec::new();
        for &rtt in &set.rtts {
            for &mtu in &set.mtus {
                for &profile in &set.profiles {
                    rows.push(format!("RTT {rtt} ms, MTU {mtu}, {profile}"));
                    let mut row = Vec::new();
                    for &loss in &set.losses_pct {
                        let want = Cell {
                            rtt_ms: rtt,
                            mtu,
                            profile,
                            loss_pct: loss,
                        };
                        row.push(match self.cells.iter().find(|c| c.cell == want) {
                            None => HeatCell {
                                value: None,
                                text: "–".into(),
                                greyed: false,
                            },
                            Some(c) => heat_cell(c),
                        });
                    }
                    cells.push(row);
                }
            }
        }
        let cols: Vec<String> = set
            .losses_pct
            .iter()
            .map(|l| format!("loss {}", loss_label(*l)))
            .collect();
        heatmap::heat_map(
            &self.png,
            &format!(
                "longhaul / best iperf3, 1 Gbit/s, one {} file ({})",
                data::human(set.file_bytes),
                self.header.date
            ),
            &rows,
            &cols,
            &cells,
            GOAL_RATIO,
            "goal 0.90; grey: path check failed",
        )
    }
}

fn heat_cell(c: &CellResult) -> HeatCell {
    let d = &c.derived;
    let pct = |x: Option<f64>| x.map_or("–".to_string(), |v| format!("{:.0}%", v / 10.0));
    let second = if c.haul.status != "ok" {
        format!("longhaul {}", c.haul.status)
    } else if !c.path_ok {
        "path check failed".into()
    } else {
        format!("lh {} / ip {}", pct(d.haul_mbps), pct(d.best_iperf3_mbps))
    };
    HeatCell {
        // A failed copy is a miss: the darkest red.
        value: if c.haul.status == "ok" {
            d.ratio
        } else {
            Some(0.0)
        },
        text: format!(
            "{}\n{second}",
            d.ratio.map_or("–".to_string(), |r| format!("{r:.2}"))
        ),
        greyed: !c.path_ok,
    }
}

fn run(args: Args) -> Result<bool> {
    let set = Set::from_args(&args)?;
    let repo = fs::canonicalize(&args.repo).context("repository root")?;
    let out_dir = args
        .out
        .clone()
        .unwrap_or_else(|| repo.join("bench/results"));
    fs::create_dir_all(&out_dir)?;
    let started = SystemTime::now();
    let (date, started_full) = utc(started);
    let mut base = format!("{date}-matrix");
    if args.quick {
        base.push_str("-quick");
    }
    if args.fairness {
        base.push_str("-fairness");
    } else if set.filtered {
        base.push_str("-partial");
    }
    if let Err(why) = netlab::Lab::available() {
        bail!("netlab cannot run here: {why}");
    }
    let cg_root = proc::cgroup2_root()
        .ok_or_else(|| anyhow!("no cgroup v2 hierarchy mounted (needed for CPU per side)"))?;
    let _ = netlab::cleanup_leftovers();
    if let Some(p) = tools::missing_program(Tool::Iperf3) {
        bail!("{p} is not installed (install: {})", args.install_status);
    }
    let haul = fs::canonicalize(&args.haul).with_context(|| {
        format!(
            "haul binary {} (build it first: bench/matrix does)",
            args.haul.display()
        )
    })?;
    let work = args.work.clone();
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work)?;
    let ctx = tools::Ctx::new(haul.clone(), work.join("state"))?;
    let globus_block = if set.globus {
        tools::missing_program(Tool::Globus)
            .map(|p| format!("{p} is not installed (install: {})", args.install_status))
    } else {
        None
    };

    let mut header = header(&args, &repo, &haul, &date, &set);
    header.started_utc = started_full;
    if let Err(e) = plot::init_font() {
        header.notes.push(format!("no heat map: {e}"));
    }
    let mut out = Output {
        header,
        set: set.clone(),
        cells: Vec::new(),
        fairness: None,
        json: out_dir.join(format!("{base}.json")),
        md: out_dir.join(format!("{base}.md")),
        png: out_dir.join(format!("{base}-heatmap.png")),
        png_name: format!("{base}-heatmap.png"),
    };

    // The file: on tmpfs, with room for one copy and a margin.
    let need = 2 * set.file_bytes + GIB + GIB / 2;
    let avail = proc::mem_available().min(proc::fs_available(Path::new("/dev/shm")));
    if need > avail {
        bail!(
            "not enough memory for tmpfs: the file, its copy and a 1.5 GiB margin need {}, {} available",
            data::human(need),
            data::human(avail)
        );
    }
    let t = Instant::now();
    let ds = data::single(&work.join("src"), "file", "matrix.bin", set.file_bytes, 1)?;
    println!(
        "haul-matrixbench: {} file made in {:.1} s; {} cells{}; results in {}",
        data::human(ds.bytes),
        t.elapsed().as_secs_f64(),
        set.cells().len(),
        if set.fairness { " + fairness" } else { "" },
        out.md.display()
    );
    let t_start = Instant::now();
    let cells = set.cells();
    let env = Env {
        ctx: &ctx,
        cg_root: &cg_root,
        work: &work,
        ds: &ds,
        set: &set,
        globus_block: &globus_block,
    };
    for (i, cell) in cells.iter().enumerate() {
        println!(
            "[{:>2}/{}] RTT {} ms, MTU {}, {}, loss {}",
            i + 1,
            cells.len(),
            cell.rtt_ms,
            cell.mtu,
            cell.profile,
            cell.loss_label()
        );
        let r = run_cell(&env, cell);
        println!(
            "        -> longhaul / best iperf3 {}; goal: {}",
            r.derived
                .ratio
                .map_or("–".to_string(), |x| format!("{x:.2}")),
            r.derived.goal
        );
        out.cells.push(r);
        out.save()?;
    }
    if set.fairness {
        println!("[fairness] 100 ms, MTU 9000, tuned, no loss: iperf3 -P 1 cubic, then longhaul");
        let f = fairness(&env);
        match f.status.as_str() {
            "ok" => println!(
                "        -> iperf3 {:.0} Mbit/s ({:.0}%), longhaul {:.0} Mbit/s ({:.0}%)",
                f.iperf3_mbps.unwrap_or(0.0),
                100.0 * f.iperf3_share.unwrap_or(0.0),
                f.haul_mbps.unwrap_or(0.0),
                100.0 * f.haul_share.unwrap_or(0.0)
            ),
            s => println!("        -> {s}: {}", f.reason),
        }
        out.fairness = Some(f);
        out.save()?;
    }
    out.header.finished_utc = utc(SystemTime::now()).1;
    out.save()?;
    if set.complete {
        // bench/results/ is not in git: the heat map goes beside MATRIX-RESULTS.md.
        let have_map =
            out.png.exists() && fs::copy(&out.png, repo.join("bench/MATRIX-RESULTS.png")).is_ok();
        let md = markdown(&out, have_map.then_some("MATRIX-RESULTS.png"), "");
        fs::write(repo.join("bench/MATRIX-RESULTS.md"), md)?;
        println!("haul-matrixbench: wrote bench/MATRIX-RESULTS.md and MATRIX-RESULTS.png");
    }
    if !args.keep_work {
        let _ = fs::remove_dir_all(&work);
    }
    let failed = out
        .cells
        .iter()
        .filter(|c| c.haul.status == "FAILED")
        .count()
        + out.fairness.as_ref().is_some_and(|f| f.status == "FAILED") as usize;
    println!(
        "haul-matrixbench: {} cells in {:.0} s, {} goals met, {failed} longhaul failures; {}",
        out.cells.len(),
        t_start.elapsed().as_secs_f64(),
        out.cells
            .iter()
            .filter(|c| c.derived.goal_met == Some(true))
            .count(),
        out.md.display()
    );
    Ok(failed > 0)
}

/// What every cell's runs share.
struct Env<'a> {
    ctx: &'a tools::Ctx,
    cg_root: &'a Path,
    work: &'a Path,
    ds: &'a Dataset,
    set: &'a Set,
    globus_block: &'a Option<String>,
}

impl Env<'_> {
    /// One run through haul-bench's runner: a fresh lab of the cell's path, the tool's server
    /// and client in their cgroups, counters, the copy checked byte for byte and deleted.
    fn run(
        &self,
        cell: &Cell,
        variant: Variant,
        ds: Option<&Dataset>,
        limit: Duration,
    ) -> Measurement {
        let case = Case {
            scenario: cell.scenario(),
            workload: "file",
            variant,
        };
        runner::run(&RunSpec {
            ctx: self.ctx,
            case: &case,
            ds,
            full_bytes: self.ds.bytes,
            limit,
            work: self.work.to_path_buf(),
            cg_root: Some(self.cg_root.to_path_buf()),
            started_utc: utc(SystemTime::now()).1,
        })
    }
}

fn variant(tool: Tool, label: String, flags: &[&str]) -> Variant {
    Variant {
        tool,
        label,
        flags: flags.iter().map(|s| s.to_string()).collect(),
    }
}

/// Seconds the file takes at the link rate.
fn link_seconds(bytes: u64) -> f64 {
    bytes as f64 * 8.0 / LINK_BPS as f64
}

/// longhaul's hard limit: the file at 10% of the link plus a minute, at least 90 s, at most
/// 15 minutes.
fn haul_limit(bytes: u64) -> Duration {
    Duration::from_secs_f64((60.0 + 10.0 * link_seconds(bytes)).clamp(90.0, 900.0))
}

/// iperf3's -t: longhaul's wall time rounded up (at least 1 s), but at most three times the
/// file's time at the link rate plus 10 s: a longhaul run slower than a third of the link
/// misses the goal whatever iperf3 does, and the cap keeps such a cell bounded.
fn iperf3_seconds(haul_wall_s: f64, bytes: u64) -> (u64, bool) {
    let want = (haul_wall_s.ceil() as u64).max(1);
    let cap = (3.0 * link_seconds(bytes)).ceil() as u64 + 10;
    (want.min(cap), want > cap)
}

fn pct(m: &Measurement) -> String {
    m.pct_link.map_or("–".into(), |p| format!("{p:.1}%"))
}

fn run_cell(env: &Env, cell: &Cell) -> CellResult {
    let t0 = Instant::now();
    let started_utc = utc(SystemTime::now()).1;
    let ds = env.ds;

    // 1. The path: its capacity, so without the cell's random loss (which only lightens the
    // emulator's load, and makes 16 BBR flows at 200 ms vary by ten points in 5 s).
    let lossless = Cell {
        loss_pct: 0.0,
        ..cell.clone()
    };
    let check = env.run(
        &lossless,
        variant(
            Tool::Iperf3,
            "check: -P 16 bbr, -O 3 -t 5, no random loss".into(),
            &CHECK_FLAGS,
        ),
        None,
        Duration::from_secs(8 + 40),
    );
    println!(
        "        path check (iperf3 -P 16 bbr, 5 s after 3 s, no random loss): {} {}",
        check.status,
        if check.status == "ok" {
            pct(&check)
        } else {
            check.reason.clone()
        }
    );

    // 2. longhaul, no tuning flags.
    let haul = env.run(
        cell,
        variant(Tool::Haul, "defaults".into(), &[]),
        Some(ds),
        haul_limit(ds.bytes),
    );
    match haul.status.as_str() {
        "ok" => println!(
            "        longhaul: {:.1} Mbit/s ({}) in {:.1} s, identical; {} streams, {}",
            haul.goodput_mbps,
            pct(&haul),
            haul.wall_s,
            haul.tool_report["streams"],
            haul.tool_report["congestion"].as_str().unwrap_or("?")
        ),
        s => println!("        longhaul: {s}: {}", haul.reason),
    }

    // 3. iperf3 for as long as longhaul took, slow start included.
    let (t, capped) = iperf3_seconds(haul.wall_s, ds.bytes);
    let ts = t.to_string();
    let mut iperf3 = Vec::new();
    for &(p, cc) in &env.set.iperf3 {
        let ps = p.to_string();
        let m = env.run(
            cell,
            variant(
                Tool::Iperf3,
                format!("-P {p} {cc}, {t} s"),
                &["-P", &ps, "-C", cc, "-t", &ts],
            ),
            None,
            Duration::from_secs(t + 40),
        );
        println!(
            "        iperf3 -P {p} {cc} -t {t}: {}",
            if m.status == "ok" {
                format!("{:.1} Mbit/s ({})", m.goodput_mbps, pct(&m))
            } else {
                format!("{}: {}", m.status, m.reason)
            }
        );
        iperf3.push(m);
    }

    // 4. globus-url-copy -p 16.
    let globus = env.set.globus.then(|| {
        let m = run_globus(env, cell, &haul, &iperf3);
        println!(
            "        globus-url-copy -p 16: {}",
            if m.status == "ok" {
                format!(
                    "{:.1} Mbit/s ({}) on {}{}",
                    m.goodput_mbps,
                    pct(&m),
                    data::human(m.data_bytes),
                    if m.time_boxed { ", time-boxed" } else { "" }
                )
            } else {
                format!("{}: {}", m.status, m.reason)
            }
        );
        m
    });

    let (path_ok, path_evidence) = judge_path(&check, &haul, &iperf3, globus.as_ref());
    let mut r = CellResult {
        cell: cell.clone(),
        started_utc,
        seconds: 0.0,
        check,
        path_ok,
        path_evidence,
        haul,
        iperf3_t_s: t,
        iperf3_t_capped: capped,
        iperf3,
        globus,
        derived: Derived::default(),
    };
    r.derived = derive(&r, ds.bytes);
    r.seconds = t0.elapsed().as_secs_f64();
    r
}

fn run_globus(env: &Env, cell: &Cell, haul: &Measurement, iperf3: &[Measurement]) -> Measurement {
    let bs = (2 * cell.bdp() / 16).div_ceil(1024) * 1024;
    let v = variant(
        Tool::Globus,
        format!("-p 16 -tcp-bs {bs}"),
        &["-p", "16", "-tcp-bs", &bs.to_string()],
    );
    if let Some(why) = env.globus_block {
        return Measurement::not_run(
            &Case {
                scenario: cell.scenario(),
                workload: "file",
                variant: v,
            },
            why,
        );
    }
    // Time-boxing as haul-bench does: the expected rate is that of the 16 cubic iperf3 flows
    // in this cell (globus-url-copy -p 16 is 16 cubic streams), else half the best iperf3.
    let ok = |m: &&Measurement| m.status == "ok" && m.goodput_mbps > 0.0;
    let p16_cubic = iperf3
        .iter()
        .filter(ok)
        .find(|m| m.variant.starts_with("-P 16 cubic"))
        .map(|m| m.goodput_mbps);
    let best = iperf3
        .iter()
        .filter(ok)
        .map(|m| m.goodput_mbps)
        .fold(0.0, f64::max);
    let mbps = p16_cubic.unwrap_or(best / 2.0).max(10.0);
    let bps = mbps * 1e6 / 8.0;
    let target_s = haul.wall_s.max(20.0);
    let full = env.ds;
    let mut ds = full.clone();
    if full.bytes as f64 / bps > 1.5 * target_s {
        let b = (bps * target_s) as u64;
        let mut p = 64 * MIB;
        while p * 2 <= b {
            p *= 2;
        }
        match data::subset(full, p, usize::MAX, 11) {
            Ok(d) => ds = d,
            Err(e) => {
                let mut m = Measurement::not_run(
                    &Case {
                        scenario: cell.scenario(),
                        workload: "file",
                        variant: v,
                    },
                    &format!("could not make the time-boxed file: {e:#}"),
                );
                m.status = "FAILED".into();
                return m;
            }
        }
    }
    let expect_s = ds.bytes as f64 / bps;
    let limit = Duration::from_secs_f64((5.0 * expect_s + 60.0).clamp(90.0, 900.0));
    let m = env.run(cell, v, Some(&ds), limit);
    if ds.root != full.root {
        let _ = fs::remove_file(&ds.root);
    }
    m
}

/// Whether the cell's path can be trusted: some run of the cell carried CHECK_MIN_PCT of the
/// link (the check, on the path without random loss, should; a run of the cell that did proves
/// the same, since the check's 5 s of 16 BBR flows vary by several points at 200 ms) and no run
/// of the cell saw a drop outside the path model.
fn judge_path(
    check: &Measurement,
    haul: &Measurement,
    iperf3: &[Measurement],
    globus: Option<&Measurement>,
) -> (bool, String) {
    let mut bad = Vec::new();
    let mut good = Vec::new();
    let label = |name: &str, m: &Measurement| {
        if name == "iperf3" {
            format!("iperf3 {}", m.variant)
        } else {
            name.to_string()
        }
    };
    let others = std::iter::once(("longhaul", haul))
        .chain(iperf3.iter().map(|m| ("iperf3", m)))
        .chain(globus.map(|m| ("globus", m)));
    let best_other = others
        .filter(|(_, m)| m.status == "ok")
        .filter_map(|(n, m)| m.pct_link.map(|p| (p, label(n, m))))
        .max_by(|a, b| a.0.total_cmp(&b.0));
    match (check.status.as_str(), check.pct_link, best_other) {
        ("ok", Some(p), _) if p >= CHECK_MIN_PCT => good.push(format!("check {p:.1}% of link")),
        (_, _, Some((p, who))) if p >= CHECK_MIN_PCT => {
            let check = match (check.status.as_str(), check.pct_link) {
                ("ok", Some(c)) => format!("{c:.1}%"),
                (s, _) => format!("{s}: {}", check.reason),
            };
            good.push(format!("{who} carried {p:.1}% of link (check {check})"))
        }
        (s, c, best) => {
            let check = match (s, c) {
                ("ok", Some(c)) => format!("check reached {c:.1}% of link"),
                _ => format!("check {s}: {}", check.reason),
            };
            let best = best.map_or(String::new(), |(p, who)| {
                format!(", best run {who} {p:.1}%")
            });
            bad.push(format!(
                "no run carried {CHECK_MIN_PCT:.0}% of link ({check}{best})"
            ))
        }
    }
    let runs = std::iter::once(("check", check))
        .chain(std::iter::once(("longhaul", haul)))
        .chain(iperf3.iter().map(|m| ("iperf3", m)))
        .chain(globus.map(|m| ("globus", m)));
    for (name, m) in runs {
        if let Some(r) = &m.router {
            let t = r.emulator_trouble();
            if !t.is_empty() {
                bad.push(format!("{}: {}", label(name, m), t.join(", ")));
            }
        }
    }
    if bad.is_empty() {
        good.push("no drop outside the path model".into());
    }
    // Timing, shown but not judged: packets the emulator wrote more than 1 ms after their due
    // time (it adds delay, not loss).
    for (name, m) in [("check", check), ("longhaul", haul)] {
        if let Some(r) = &m.router
            && r.delivered_packets > 0
            && r.late_over_1ms > 0
        {
            good.push(format!(
                "{name}: {:.1}% of packets > 1 ms late",
                100.0 * r.late_over_1ms as f64 / r.delivered_packets as f64
            ));
        }
    }
    if bad.is_empty() {
        (true, good.join("; "))
    } else {
        bad.extend(good.into_iter().filter(|g| g.contains("late")));
        (false, bad.join("; "))
    }
}

fn derive(r: &CellResult, file_bytes: u64) -> Derived {
    let mut d = Derived::default();
    let ok = |m: &&Measurement| m.status == "ok" && m.goodput_mbps > 0.0;
    if let Some(best) = r
        .iperf3
        .iter()
        .filter(ok)
        .max_by(|a, b| a.goodput_mbps.total_cmp(&b.goodput_mbps))
    {
        d.best_iperf3_variant = Some(best.variant.clone());
        d.best_iperf3_mbps = Some(best.goodput_mbps);
    }
    let h = &r.haul;
    let haul_ok = h.status == "ok";
    if haul_ok {
        d.haul_mbps = Some(h.goodput_mbps);
        d.ratio = d.best_iperf3_mbps.map(|b| h.goodput_mbps / b);
    }
    d.globus_mbps = r
        .globus
        .as_ref()
        .filter(|m| m.status == "ok")
        .map(|m| m.goodput_mbps);
    if let Some(rv) = &h.router {
        let offered_payload = rv
            .offered_bytes
            .saturating_sub(rv.offered_packets * HEADER_BYTES);
        let delivered_payload = rv
            .delivered_bytes
            .saturating_sub(rv.delivered_packets * HEADER_BYTES);
        let re = offered_payload as i64 - file_bytes as i64;
        d.retransmitted_bytes = Some(re);
        d.retransmitted_pct = Some(100.0 * re as f64 / file_bytes as f64);
        d.delivered_extra_bytes = Some(delivered_payload as i64 - file_bytes as i64);
        d.drops_queue = Some(rv.drops_queue);
        d.drops_loss = Some(rv.drops_loss);
    }
    d.haul_tcp_retransmits = h.tool_retrans;
    d.retrans_segs = h.retrans_segs;
    d.streams = h.tool_report["streams"].as_u64();
    d.congestion = h.tool_report["congestion"]
        .as_str()
        .unwrap_or("")
        .to_string();
    d.plan = h.tool_report["plan"].as_str().unwrap_or("").to_string();
    let (met, text) = goal(r, &d);
    d.goal_met = met;
    d.goal = text;
    d
}

/// The goal for one cell: longhaul at 90% or more of the best iperf3, retransmitted
/// bytes at most 1% of the payload where the path has no random loss, not slower than
/// globus-url-copy; judged only on a path that passed its check.
fn goal(r: &CellResult, d: &Derived) -> (Option<bool>, String) {
    if r.haul.status != "ok" {
        return (
            Some(false),
            format!(
                "no: longhaul {} ({})",
                r.haul.status,
                short(&r.haul.reason, 120)
            ),
        );
    }
    if !r.path_ok {
        return (None, "not judged: path check failed".into());
    }
    let Some(ratio) = d.ratio else {
        return (None, "not judged: no iperf3 figure".into());
    };
    let mut failed = Vec::new();
    let mut notes = Vec::new();
    if ratio < GOAL_RATIO {
        failed.push(format!("{ratio:.3} of best iperf3 (< {GOAL_RATIO:.2})"));
    }
    if r.cell.loss_pct == 0.0 {
        match d.retransmitted_pct {
            Some(p) if p > GOAL_RETRANS_PCT => {
                failed.push(format!("retransmitted {p:.2}% of payload (> 1%)"))
            }
            Some(_) => {}
            None => notes.push("retransmissions not measured".to_string()),
        }
    }
    match (&r.globus, d.globus_mbps, d.haul_mbps) {
        (None, _, _) => notes.push("globus-url-copy not in this set".into()),
        (Some(_), Some(g), Some(h)) if g > h => failed.push(format!(
            "slower than globus-url-copy ({h:.0} < {g:.0} Mbit/s)"
        )),
        (Some(g), None, _) => notes.push(format!("globus-url-copy {}", g.status)),
        _ => {}
    }
    let notes = if notes.is_empty() {
        String::new()
    } else {
        format!(" ({})", notes.join("; "))
    };
    if failed.is_empty() {
        (Some(true), format!("yes{notes}"))
    } else {
        (Some(false), format!("no: {}{notes}", failed.join("; ")))
    }
}

/// The fairness cell: one iperf3 cubic flow, longhaul started FAIR_DELAY_S later through the
/// same bottleneck; each one's rate over the time they overlapped.
fn fairness(env: &Env) -> Fairness {
    let mut f = Fairness::default();
    if let Err(e) = fairness_inner(env, &mut f) {
        f.status = "FAILED".into();
        if f.reason.is_empty() {
            f.reason = format!("{e:#}");
        }
    }
    f
}

fn fairness_inner(env: &Env, f: &mut Fairness) -> Result<()> {
    let cell = Cell {
        rtt_ms: 100,
        mtu: 9000,
        profile: "tuned",
        loss_pct: 0.0,
    };
    f.cell = Some(cell.clone());
    let s = cell.scenario();
    let ds = env.ds;
    // iperf3 runs until well after longhaul should have ended at a third of the link.
    let t = (FAIR_DELAY_S + (link_seconds(ds.bytes) / 0.35).ceil() as u64 + 10).max(60);
    f.iperf3_t_s = t;
    let logs = env.work.join("logs").join("fairness");
    let _ = fs::remove_dir_all(&logs);
    fs::create_dir_all(&logs)?;
    let csv = env.work.join("csv").join("fairness.csv");
    fs::create_dir_all(csv.parent().unwrap_or(Path::new("/")))?;
    let lab = runner::build_lab(&s, Some(&csv))?;
    let (a, b) = (lab.host("a", 0), lab.host("b", 0));
    let addr = b.addr().to_string();
    let cg_server = Cgroup::create(env.cg_root, "fairness-server")?;
    let cg_client = Cgroup::create(env.cg_root, "fairness-client")?;
    let dst = env.work.join("dst").join("fairness");
    tools::make_dst(&dst)?;
    let spot = tools::ServerSpot {
        host: b,
        addr: addr.clone(),
        dst: dst.clone(),
        scratch: logs.join("server-haul"),
    };
    tools::start_server(env.ctx, Tool::Haul, &spot, &cg_server)?;
    // iperf3's server in JSON mode (one test), so that the client's --get-server-output
    // brings back the receiver's own intervals as JSON.
    let mut srv = b.command("iperf3");
    srv.args(["-s", "-1", "-J", "-B", &addr, "-p"])
        .arg(tools::IPERF_PORT.to_string());
    let _srv = proc::spawn(
        srv,
        Some(&cg_server),
        &logs.join("iperf3-server.out"),
        &logs.join("iperf3-server.err"),
    )?;
    if !proc::wait_listening(b, tools::IPERF_PORT, Duration::from_secs(15)) {
        bail!("iperf3 server did not listen within 15 s");
    }
    let ts = t.to_string();
    let iv = variant(
        Tool::Iperf3,
        "fairness".into(),
        &["-P", "1", "-C", "cubic", "-t", &ts, "--get-server-output"],
    );
    let icmd = tools::client_command(env.ctx, &iv, a, &addr, None, &dst)?;
    f.iperf3_command = runner::render_command(&icmd);
    let stats0 = lab.stats();
    let t_i = lab.elapsed();
    let ip = proc::spawn(
        icmd,
        Some(&cg_client),
        &logs.join("iperf3.out"),
        &logs.join("iperf3.err"),
    )?;
    std::thread::sleep(Duration::from_secs(FAIR_DELAY_S));
    let hv = variant(Tool::Haul, "defaults".into(), &[]);
    let hcmd = tools::client_command(env.ctx, &hv, a, &addr, Some(ds), &dst)?;
    f.haul_command = runner::render_command(&hcmd);
    let t_h = lab.elapsed();
    let hp = proc::spawn(
        hcmd,
        Some(&cg_client),
        &logs.join("haul.out"),
        &logs.join("haul.err"),
    )?;
    let haul_limit = Duration::from_secs(t.saturating_sub(FAIR_DELAY_S + 2).max(30));
    let he = hp.wait(haul_limit);
    let t_e = lab.elapsed();
    let left = Duration::from_secs(t + 40).saturating_sub(ip.start.elapsed());
    let ie = ip.wait(left.max(Duration::from_secs(1)));
    let stats1 = lab.stats();
    cg_server.kill_all(Duration::from_secs(2));
    cg_client.kill_all(Duration::from_secs(1));
    drop(lab); // flushes the CSV
    f.haul_wall_s = he.wall.as_secs_f64();
    let hout = fs::read_to_string(logs.join("haul.out")).unwrap_or_default();
    f.haul_report = last_json(&hout);
    if let Some(o) = f.haul_report.as_object_mut() {
        o.remove("file_list");
    }
    let verified = data::verify(ds, &dst);
    let _ = fs::remove_dir_all(&dst);
    f.copy_ok = verified.is_ok();
    if let Some(r) = runner::router_view(&stats0, &stats1) {
        f.emulator_trouble = r.emulator_trouble();
    }

    let mut problems = Vec::new();
    if he.timed_out {
        problems.push(format!(
            "longhaul killed at its {} s limit",
            haul_limit.as_secs()
        ));
    } else if he.code != 0 {
        problems.push(format!("longhaul exit {}", he.code));
    }
    if let Err(e) = verified {
        problems.push(format!("copy differs from source: {e}"));
    }
    // Not fatal: the figures stand, with these said beside them.
    let mut notes = Vec::new();
    if ie.timed_out || ie.code != 0 {
        notes.push(format!(
            "iperf3 {}",
            if ie.timed_out {
                "killed at its time limit".to_string()
            } else {
                format!("exit {}", ie.code)
            }
        ));
    }

    // The emulator's 1 ms bins, client to server, from the iperf3 start.
    let text = fs::read_to_string(&csv).unwrap_or_default();
    let _ = fs::remove_file(&csv);
    let ms0 = t_i.as_millis() as u64;
    let bins: Vec<u64> = text
        .lines()
        .skip(1)
        .filter_map(|l| {
            let mut it = l.split(',');
            let t: u64 = it.next()?.parse().ok()?;
            let b: u64 = it.next()?.parse().ok()?;
            (t >= ms0).then_some(b)
        })
        .collect();
    // iperf3's clock starts with its first data: the first 1 ms bin above 20 kB (its
    // control messages are far smaller; its first window is 10 segments of 9 kB).
    let data_start_ms = bins.iter().position(|b| *b > 20_000).unwrap_or(0) as f64;
    let rel = |d: Duration| (d.as_millis() as f64 - ms0 as f64 - data_start_ms) / 1000.0;
    let (w0, w1) = (rel(t_h), rel(t_e).min(t as f64));
    f.overlap_start_s = w0;
    f.overlap_end_s = w1;
    if w1 > w0 {
        let lo = (data_start_ms + w0 * 1000.0) as usize;
        let hi = ((data_start_ms + w1 * 1000.0) as usize).min(bins.len());
        if hi > lo {
            let sum: u64 = bins[lo..hi].iter().sum();
            f.link_mbps = Some(sum as f64 * 8.0 / ((hi - lo) as f64 / 1000.0) / 1e6);
        }
    }
    let iout = fs::read_to_string(logs.join("iperf3.out")).unwrap_or_default();
    let iv: Value = serde_json::from_str(&iout).unwrap_or(Value::Null);
    f.iperf3_retransmits = iv["end"]["sum_sent"]["retransmits"].as_u64();
    // Receiver-side intervals (the server's own report), else the sender's.
    let intervals = |v: &Value| -> Vec<(f64, f64, f64)> {
        v["intervals"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|i| {
                        let s = &i["sum"];
                        Some((
                            s["start"].as_f64()?,
                            s["end"].as_f64()?,
                            s["bytes"].as_f64()?,
                        ))
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut iv_list = intervals(&iv["server_output_json"]);
    if iv_list.is_empty() {
        iv_list = intervals(&iv);
        if !iv_list.is_empty() {
            notes.push(
                "iperf3 gave no receiver-side intervals: its sender-side ones are used".into(),
            );
        }
    }
    if iv_list.is_empty() {
        problems.push("iperf3 printed no intervals".into());
    }
    f.iperf3_alone_mbps = rate_over(&iv_list, 0.0, w0);
    f.iperf3_mbps = rate_over(&iv_list, w0, w1);
    if f.copy_ok && !he.timed_out && f.haul_wall_s > 0.0 {
        f.haul_mbps = Some(ds.bytes as f64 * 8.0 / f.haul_wall_s / 1e6);
    }
    if let (Some(i), Some(h)) = (f.iperf3_mbps, f.haul_mbps)
        && i + h > 0.0
    {
        f.iperf3_share = Some(i / (i + h));
        f.haul_share = Some(h / (i + h));
    }
    if t_e.as_secs_f64() - t_i.as_secs_f64() > t as f64 + 1.0 {
        notes.push("longhaul outlasted the iperf3 flow: the overlap is cut at its end".into());
    }
    f.reason = problems
        .iter()
        .chain(notes.iter())
        .cloned()
        .collect::<Vec<_>>()
        .join("; ");
    if !problems.is_empty() {
        bail!("{}", f.reason)
    }
    f.status = "ok".into();
    Ok(())
}

/// Mean rate over [w0, w1] s of iperf3 intervals (start, end, bytes), Mbit/s; each interval
/// counted by the part of it inside the window.
fn rate_over(iv: &[(f64, f64, f64)], w0: f64, w1: f64) -> Option<f64> {
    if w1 <= w0 {
        return None;
    }
    let mut bytes = 0.0;
    let mut covered = 0.0;
    for &(s, e, b) in iv {
        let (lo, hi) = (s.max(w0), e.min(w1));
        if hi > lo && e > s {
            bytes += b * (hi - lo) / (e - s);
            covered += hi - lo;
        }
    }
    (covered > 0.0).then(|| bytes * 8.0 / covered / 1e6)
}

/// The last JSON object a command printed.
fn last_json(s: &str) -> Value {
    s.lines()
        .rev()
        .find_map(|l| serde_json::from_str::<Value>(l).ok())
        .unwrap_or(Value::Null)
}

fn short(s: &str, n: usize) -> String {
    let s = s.replace('|', "/").replace('\n', " ");
    if s.chars().count() <= n {
        s
    } else {
        format!("{}…", s.chars().take(n).collect::<String>())
    }
}

fn header(args: &Args, repo: &Path, haul: &Path, date: &str, set: &Set) -> Header {
    let m = report::Machine::now();
    let haul_version = tools::version(&haul.to_string_lossy(), &["--version"]);
    let mut tools_v = vec![(
        "iperf3".to_string(),
        tools::version("iperf3", &["--version"]),
    )];
    if set.globus {
        tools_v.push((
            "globus-url-copy".to_string(),
            tools::version("globus-url-copy", &["-version"]),
        ));
        tools_v.push((
            "globus-gridftp-server".to_string(),
            tools::version("globus-gridftp-server", &["-version"]),
        ));
    }
    let mut only = Vec::new();
    for (k, v) in [
        ("rtt", &args.rtt),
        ("mtu", &args.mtu),
        ("profile", &args.profile),
        ("loss", &args.loss),
        ("file-size", &args.file_size),
    ] {
        if let Some(v) = v {
            only.push(format!("--{k} {v}"));
        }
    }
    if args.no_globus {
        only.push("--no-globus".into());
    }
    if args.fairness {
        only.push("--fairness".into());
    }
    Header {
        title: format!(
            "longhaul path matrix, {date}{}",
            match (args.quick, args.fairness, only.is_empty()) {
                (_, true, _) => " (fairness cell only)",
                (true, _, true) => " (--quick)",
                (true, _, false) => " (--quick, filtered)",
                (false, _, false) => " (filtered)",
                _ => "",
            }
        ),
        date: date.into(),
        command: args
            .command_line
            .clone()
            .unwrap_or_else(|| std::env::args().collect::<Vec<_>>().join(" ")),
        quick: args.quick,
        only: only.join(" "),
        haul_version: report::binary_version(haul, &haul_version),
        git_describe: report::git_describe(repo),
        tools: tools_v,
        kernel: m.kernel,
        cpu: m.cpu,
        cores: m.cores,
        memory: m.memory,
        install: args.install_status.clone(),
        notes: vec![
            "The machine has 2 cores shared with other work; the emulator needs most of one at 1 Gbit/s with MTU 1500, so a cell's path is checked before its figures are trusted.".into(),
        ],
        ..Default::default()
    }
}

/// The Markdown report. `png`: the heat map's path relative to the report, if drawn;
/// `up`: the path from the report to bench/ ("../" for results/, "" for bench/).
fn markdown(out: &Output, png: Option<&str>, up: &str) -> String {
    let set = &out.set;
    let mut o = String::new();
    let _ = writeln!(o, "# {}\n", out.header.title);
    let _ = writeln!(
        o,
        "Generated by `bench/matrix` (haul-matrixbench); numbers are as measured, never edited by hand. Method: [bench/README.md]({up}README.md#path-matrix-benchmatrix).\n"
    );
    report::header_table(&mut o, &out.header);
    let iperf: Vec<String> = set
        .iperf3
        .iter()
        .map(|(p, cc)| format!("-P {p} {cc}"))
        .collect();
    let _ = writeln!(
        o,
        "Set **{}**{}: RTT {} ms x MTU {} x {} hosts x random loss {}; one {} file per cell (pseudo-random, /dev/shm); iperf3 {}; globus-url-copy -p 16: {}; fairness cell: {}.\n",
        set.name,
        if set.filtered {
            format!(
                ", filtered ({})",
                if out.header.only.is_empty() {
                    "--fairness / --no-globus"
                } else {
                    out.header.only.as_str()
                }
            )
        } else {
            String::new()
        },
        join(&set.rtts),
        join(&set.mtus),
        set.profiles.join(", "),
        set.losses_pct
            .iter()
            .map(|l| loss_label(*l))
            .collect::<Vec<_>>()
            .join(", "),
        data::human(set.file_bytes),
        iperf.join(", "),
        if set.globus { "yes" } else { "no" },
        if set.fairness { "yes" } else { "no" },
    );
    let _ = writeln!(
        o,
        "Link: 1 Gbit/s each way, drop-tail queue of one bandwidth-delay product (netlab's default), RTT split evenly, random loss each direction; site a uploads to site b. Every run gets a fresh lab. For the note on the machine see the end.\n"
    );
    for n in &out.header.notes {
        let _ = writeln!(o, "Note: {n}\n");
    }

    let _ = writeln!(o, "## The matrix\n");
    let _ = writeln!(
        o,
        "%link = goodput / 1 Gbit/s: longhaul and globus-url-copy: file bytes x 8 / wall time of the client command (copies compared byte for byte); iperf3: its receiver-side rate with -t = longhaul's wall time rounded up, slow start included. Retransmitted = payload the client put on the bottleneck (emulator's offered bytes less 52 bytes of headers per packet) minus the file, % of the file; TCP = longhaul's own `tcp_retransmits` (segments). Drops: the emulator's, client to server, during longhaul's run. Goal: longhaul/best iperf3 >= {GOAL_RATIO:.2}, retransmitted <= {GOAL_RETRANS_PCT}% without random loss, not slower than globus-url-copy; judged only where the path check passed.\n"
    );
    let _ = writeln!(
        o,
        "| RTT ms | MTU | hosts | loss | path check | best iperf3 (variant, %link) | globus -p16 %link | longhaul %link | longhaul / best iperf3 | longhaul streams / congestion | retransmitted % of payload / TCP retrans | emulator drops queue / loss | goal met |"
    );
    let _ = writeln!(
        o,
        "|---:|---:|---|---:|---|---|---:|---:|---:|---|---:|---:|---|"
    );
    let p = |x: Option<f64>| x.map_or("–".to_string(), |v| format!("{:.1}%", v / 10.0));
    for c in &out.cells {
        let d = &c.derived;
        let path = if c.path_ok {
            format!("ok: {}", short(&c.path_evidence, 140))
        } else {
            format!("**INVALID**: {}", short(&c.path_evidence, 200))
        };
        let best = match (&d.best_iperf3_variant, d.best_iperf3_mbps) {
            (Some(v), Some(m)) => format!(
                "{}, {:.1}%{}",
                v.split(',').next().unwrap_or(v),
                m / 10.0,
                if c.iperf3_t_capped {
                    " (-t capped)"
                } else {
                    ""
                }
            ),
            _ => "–".into(),
        };
        let globus = match &c.globus {
            None => "not in set".to_string(),
            Some(g) if g.status == "ok" => format!(
                "{:.1}%{}",
                g.goodput_mbps / 10.0,
                if g.time_boxed {
                    format!(" (time-boxed, {})", data::human(g.data_bytes))
                } else {
                    String::new()
                }
            ),
            Some(g) => format!("{}: {}", g.status, short(&g.reason, 60)),
        };
        let haul = if c.haul.status == "ok" {
            p(d.haul_mbps)
        } else {
            format!("**{}**", c.haul.status)
        };
        let streams = match d.streams {
            Some(s) => format!("{s} / {}", d.congestion),
            None => "–".into(),
        };
        let retr = format!(
            "{} / {}",
            d.retransmitted_pct
                .map_or("–".into(), |v| format!("{v:.2}%")),
            d.haul_tcp_retransmits.map_or("–".into(), |v| v.to_string())
        );
        let drops = match (d.drops_queue, d.drops_loss) {
            (Some(q), Some(l)) => format!("{q} / {l}"),
            _ => "–".into(),
        };
        let goal = match d.goal_met {
            Some(true) => d.goal.clone(),
            Some(false) => format!("**{}**", short(&d.goal, 200)),
            None => d.goal.clone(),
        };
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            c.cell.rtt_ms,
            c.cell.mtu,
            c.cell.profile,
            c.cell.loss_label(),
            path,
            best,
            globus,
            haul,
            d.ratio.map_or("–".into(), |r| format!("{r:.2}")),
            streams,
            retr,
            drops,
            goal
        );
    }
    let met = out
        .cells
        .iter()
        .filter(|c| c.derived.goal_met == Some(true))
        .count();
    let missed = out
        .cells
        .iter()
        .filter(|c| c.derived.goal_met == Some(false))
        .count();
    let _ = writeln!(
        o,
        "\nGoal met in {met} of {} cells, missed in {missed}, not judged in {}.\n",
        out.cells.len(),
        out.cells.len() - met - missed
    );
    if let Some(png) = png {
        let _ = writeln!(
            o,
            "![longhaul / best iperf3 per cell]({png})\n\nColour: longhaul / best iperf3 (reds below {GOAL_RATIO:.2}, greens from it); second line: longhaul and best iperf3 % of link. Grey: the path check failed.\n"
        );
    }

    if let Some(f) = &out.fairness {
        let _ = writeln!(o, "## Fairness: longhaul beside one iperf3 cubic flow\n");
        let _ = writeln!(
            o,
            "100 ms, MTU 9000, tuned hosts, no loss. `iperf3 -P 1 -C cubic -t {}` starts; {FAIR_DELAY_S} s later `haul cp` (no flags) copies the {} file through the same bottleneck. Rates over the time both ran (from longhaul's start to its end, on iperf3's clock, which starts with its first data as the emulator saw it): iperf3 from its receiver-side 1 s intervals (partial intervals pro rata), longhaul = file bytes / its wall time.\n",
            f.iperf3_t_s,
            data::human(set.file_bytes)
        );
        if f.status != "ok" || !f.reason.is_empty() {
            let _ = writeln!(o, "Status: **{}** {}\n", f.status, f.reason);
        }
        let m = |x: Option<f64>| x.map_or("–".to_string(), |v| format!("{v:.0}"));
        let s = |x: Option<f64>| x.map_or("–".to_string(), |v| format!("{:.0}%", 100.0 * v));
        let _ = writeln!(
            o,
            "| flow | Mbit/s over the overlap ({:.1}-{:.1} s) | share |\n|---|---:|---:|\n| iperf3 -P 1 cubic (alone before: {} Mbit/s; {} retransmits in all) | {} | {} |\n| longhaul ({} streams, {}) | {} | {} |\n| bottleneck, client to server, everything (emulator) | {} | |\n",
            f.overlap_start_s,
            f.overlap_end_s,
            m(f.iperf3_alone_mbps),
            f.iperf3_retransmits.map_or("–".into(), |v| v.to_string()),
            m(f.iperf3_mbps),
            s(f.iperf3_share),
            f.haul_report["streams"],
            f.haul_report["congestion"].as_str().unwrap_or("?"),
            m(f.haul_mbps),
            s(f.haul_share),
            m(f.link_mbps)
        );
        if !f.emulator_trouble.is_empty() {
            let _ = writeln!(
                o,
                "Drops outside the path model during this cell: {}.\n",
                f.emulator_trouble.join(", ")
            );
        }
    }

    if !out.cells.is_empty() {
        let _ = writeln!(o, "## Every run\n");
        let _ = writeln!(
            o,
            "| cell | run | result | wall s | Mbit/s | %link | data | retrans segs (tool's own) | drops queue / loss | offered / delivered MB | outside the path model |\n|---|---|---|---:|---:|---:|---|---:|---:|---:|---|"
        );
        for c in &out.cells {
            let id = format!(
                "{} ms, {}, {}, {}",
                c.cell.rtt_ms,
                c.cell.mtu,
                c.cell.profile,
                c.cell.loss_label()
            );
            let runs = std::iter::once(&c.check)
                .chain(std::iter::once(&c.haul))
                .chain(c.iperf3.iter())
                .chain(c.globus.iter());
            for m in runs {
                let tool = match m.tool.as_str() {
                    "haul" => "longhaul".to_string(),
                    "globus" => format!("globus-url-copy {}", m.variant),
                    _ => format!("iperf3 {}", m.variant),
                };
                let result = if m.status == "ok" {
                    "ok".to_string()
                } else {
                    format!("**{}**: {}", m.status, short(&m.reason, 120))
                };
                let data = if m.tool == "iperf3" {
                    "memory".to_string()
                } else if m.data_bytes > 0 {
                    format!(
                        "{}{}",
                        data::human(m.data_bytes),
                        if m.time_boxed { ", time-boxed" } else { "" }
                    )
                } else {
                    "–".into()
                };
                let retr = match (m.retrans_segs, m.tool_retrans) {
                    (Some(a), Some(b)) => format!("{a} ({b})"),
                    (Some(a), None) => a.to_string(),
                    _ => "–".into(),
                };
                let (drops, bytes, trouble) = match &m.router {
                    Some(r) => (
                        format!("{} / {}", r.drops_queue, r.drops_loss),
                        format!(
                            "{:.0} / {:.0}",
                            r.offered_bytes as f64 / 1e6,
                            r.delivered_bytes as f64 / 1e6
                        ),
                        {
                            let t = r.emulator_trouble();
                            if t.is_empty() {
                                "none".to_string()
                            } else {
                                t.join(", ")
                            }
                        },
                    ),
                    None => ("–".into(), "–".into(), "–".into()),
                };
                let _ = writeln!(
                    o,
                    "| {id} | {tool} | {result} | {:.1} | {:.1} | {} | {data} | {retr} | {drops} | {bytes} | {trouble} |",
                    m.wall_s,
                    m.goodput_mbps,
                    pct(m),
                );
            }
        }
        let _ = writeln!(o, "\n## longhaul's decisions\n");
        let _ = writeln!(
            o,
            "| cell | streams | congestion | blocks resent | bytes resent (haul) | payload delivered beyond the file, MB | plan |\n|---|---:|---|---:|---:|---:|---|"
        );
        for c in &out.cells {
            let r = &c.haul.tool_report;
            let _ = writeln!(
                o,
                "| {} ms, {}, {}, {} | {} | {} | {} | {} | {} | {} |",
                c.cell.rtt_ms,
                c.cell.mtu,
                c.cell.profile,
                c.cell.loss_label(),
                r["streams"],
                r["congestion"].as_str().unwrap_or(""),
                r["blocks_resent"],
                r["bytes_resent"],
                c.derived
                    .delivered_extra_bytes
                    .map_or("–".into(), |b| format!("{:.1}", b as f64 / 1e6)),
                short(r["plan"].as_str().unwrap_or(""), 300)
            );
        }
    }
    let _ = writeln!(
        o,
        "\n## Caveat\n\nOne 2-core machine, shared with other work, runs the emulator, both hosts' TCP stacks and the tools. The path check (iperf3 -P 16 bbr reaching {CHECK_MIN_PCT:.0}% of the link, and no packet dropped by the emulator's buffer cap, its device writes or the hosts' TUN devices) says whether a cell's path could carry the link; figures of a cell whose check failed are shown but not judged."
    );
    o
}

fn join<T: std::fmt::Display>(v: &[T]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> Args {
        let mut v = vec!["haul-matrixbench"];
        v.extend_from_slice(extra);
        Args::parse_from(v)
    }

    #[test]
    fn sets() {
        let full = Set::from_args(&args(&[])).unwrap();
        assert_eq!(full.cells().len(), 5 * 2 * 2 * 4);
        assert!(full.complete && full.fairness && full.globus);
        assert_eq!(full.iperf3.len(), 6);
        let ids: std::collections::HashSet<String> = full.cells().iter().map(Cell::id).collect();
        assert_eq!(ids.len(), full.cells().len());
        let q = Set::from_args(&args(&["--quick"])).unwrap();
        assert_eq!(q.cells().len(), 8);
        assert!(!q.globus && q.fairness && !q.complete);
        let one = Set::from_args(&args(&[
            "--rtt",
            "50",
            "--mtu",
            "9000",
            "--profile",
            "tuned",
            "--loss",
            "0",
            "--file-size",
            "256M",
        ]))
        .unwrap();
        assert_eq!(
            one.cells(),
            vec![Cell {
                rtt_ms: 50,
                mtu: 9000,
                profile: "tuned",
                loss_pct: 0.0
            }]
        );
        assert_eq!(one.file_bytes, 256 * MIB);
        assert!(!one.fairness && !one.complete);
        let f = Set::from_args(&args(&["--fairness"])).unwrap();
        assert!(f.cells().is_empty() && f.fairness);
        assert!(Set::from_args(&args(&["--profile", "fast"])).is_err());
        let l = Set::from_args(&args(&["--loss", "0.1%,1"])).unwrap();
        assert_eq!(l.losses_pct, vec![0.1, 1.0]);
    }

    #[test]
    fn sizes_and_limits() {
        assert_eq!(parse_size("256M").unwrap(), 256 * MIB);
        assert_eq!(parse_size("4GiB").unwrap(), 4 * GIB);
        assert_eq!(parse_size("1.5G").unwrap(), 3 * GIB / 2);
        assert!(parse_size("12").is_err());
        assert!(parse_size("3T").is_err());
        // 4 GiB: 34.4 s at the link; iperf3 as long as longhaul, capped at 3x that + 10 s.
        assert_eq!(iperf3_seconds(40.2, 4 * GIB), (41, false));
        assert_eq!(iperf3_seconds(300.0, 4 * GIB), (114, true));
        assert_eq!(iperf3_seconds(2.5, 256 * MIB), (3, false));
        assert_eq!(iperf3_seconds(0.0, 256 * MIB), (1, false));
        assert_eq!(haul_limit(4 * GIB).as_secs(), 403);
        assert_eq!(haul_limit(256 * MIB).as_secs(), 90);
    }

    #[test]
    fn rates_over_a_window() {
        let iv = vec![(0.0, 1.0, 125e6), (1.0, 2.0, 62.5e6), (2.0, 3.0, 62.5e6)];
        assert!((rate_over(&iv, 0.0, 1.0).unwrap() - 1000.0).abs() < 1e-6);
        assert!((rate_over(&iv, 0.5, 1.5).unwrap() - 750.0).abs() < 1e-6);
        assert!((rate_over(&iv, 1.0, 9.0).unwrap() - 500.0).abs() < 1e-6);
        assert_eq!(rate_over(&iv, 2.0, 1.0), None);
    }

    fn m(tool: &str, variant: &str, mbps: f64) -> Measurement {
        Measurement {
            tool: tool.into(),
            variant: variant.into(),
            status: "ok".into(),
            goodput_mbps: mbps,
            pct_link: Some(mbps / 10.0),
            ..Default::default()
        }
    }

    fn cell_result(loss_pct: f64, haul: f64, globus: Option<f64>) -> CellResult {
        let mut h = m("haul", "defaults", haul);
        h.router = Some(runner::RouterView {
            offered_bytes: 1_010_000_000 + 1_000_000 * HEADER_BYTES,
            offered_packets: 1_000_000,
            ..Default::default()
        });
        let mut r = CellResult {
            cell: Cell {
                rtt_ms: 100,
                mtu: 9000,
                profile: "tuned",
                loss_pct,
            },
            started_utc: String::new(),
            seconds: 0.0,
            check: m("iperf3", "check", 950.0),
            path_ok: true,
            path_evidence: String::new(),
            haul: h,
            iperf3_t_s: 10,
            iperf3_t_capped: false,
            iperf3: vec![
                m("iperf3", "-P 16 cubic, 10 s", 900.0),
                m("iperf3", "-P 1 bbr, 10 s", 950.0),
            ],
            globus: globus.map(|g| m("globus", "-p 16", g)),
            derived: Derived::default(),
        };
        r.derived = derive(&r, 1_000_000_000);
        r
    }

    #[test]
    fn goals() {
        // 10 MB beyond a 1 GB file: 1% retransmitted; 900 / 950.
        let r = cell_result(0.0, 900.0, Some(800.0));
        assert_eq!(
            r.derived.best_iperf3_variant.as_deref(),
            Some("-P 1 bbr, 10 s")
        );
        assert_eq!(r.derived.retransmitted_bytes, Some(10_000_000));
        assert!((r.derived.ratio.unwrap() - 900.0 / 950.0).abs() < 1e-9);
        assert_eq!(r.derived.goal_met, Some(true), "{}", r.derived.goal);
        let r = cell_result(0.0, 800.0, Some(850.0));
        assert_eq!(r.derived.goal_met, Some(false));
        assert!(r.derived.goal.contains("globus"), "{}", r.derived.goal);
        assert!(
            r.derived.goal.contains("of best iperf3"),
            "{}",
            r.derived.goal
        );
        let r = cell_result(0.1, 900.0, None);
        assert_eq!(r.derived.goal_met, Some(true));
        assert!(r.derived.goal.contains("not in this set"));
        let mut r = cell_result(0.0, 900.0, None);
        r.path_ok = false;
        assert_eq!(goal(&r, &r.derived.clone()).0, None);
    }

    /// Draws the full set's heat map with made-up figures (to look at:
    /// HEATMAP_SAMPLE=/tmp/x.png cargo test ... heat_map_of_the_full_set).
    #[test]
    fn heat_map_of_the_full_set() {
        if plot::init_font().is_err() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let png = std::env::var_os("HEATMAP_SAMPLE")
            .map(PathBuf::from)
            .unwrap_or_else(|| dir.path().join("h.png"));
        let set = Set::full();
        let mut cells = Vec::new();
        for (i, c) in set
            .cells()
            .into_iter()
            .enumerate()
            .filter(|(i, _)| i % 7 != 3)
        {
            let mut r = cell_result(c.loss_pct, 700.0 + 4.0 * (i % 70) as f64, Some(500.0));
            r.cell = c;
            r.path_ok = i % 11 != 5;
            if i % 13 == 4 {
                r.haul.status = "FAILED".into();
            }
            r.derived = derive(&r, 1_000_000_000);
            cells.push(r);
        }
        let out = Output {
            header: Header {
                date: "2026-01-01".into(),
                ..Default::default()
            },
            set,
            cells,
            fairness: None,
            json: dir.path().join("m.json"),
            md: dir.path().join("m.md"),
            png: png.clone(),
            png_name: "h.png".into(),
        };
        out.heat_map().unwrap();
        assert!(fs::metadata(&png).unwrap().len() > 1000);
        out.save().unwrap();
        let md = fs::read_to_string(dir.path().join("m.md")).unwrap();
        assert!(md.contains("| 300 | 9000 | tuned | 1% |"), "{md}");
    }

    #[test]
    fn path_judgement() {
        let ok = m("iperf3", "check", 950.0);
        let h = m("haul", "defaults", 900.0);
        assert!(judge_path(&ok, &h, &[], None).0);
        let slow = m("iperf3", "check", 600.0);
        let h_slow = m("haul", "defaults", 800.0);
        let (good, why) = judge_path(&slow, &h_slow, &[], None);
        assert!(!good && why.contains("60.0%"), "{why}");
        // longhaul itself carrying the link proves the path as well.
        let (good, why) = judge_path(&slow, &h, &[], None);
        assert!(good && why.contains("longhaul carried 90.0%"), "{why}");
        // A slow check is outweighed by a run of the cell that carried the link.
        let fast = m("iperf3", "-P 16 cubic", 930.0);
        let (good, why) = judge_path(&slow, &h, std::slice::from_ref(&fast), None);
        assert!(
            good && why.contains("iperf3 -P 16 cubic carried 93.0% of link (check 60.0%)"),
            "{why}"
        );
        let mut failed = fast.clone();
        failed.status = "failed".into();
        let (good, why) = judge_path(&slow, &h_slow, &[failed], None);
        assert!(
            !good && why.contains("no run carried 85% of link (check reached 60.0% of link, best run longhaul 80.0%)"),
            "{why}"
        );
        let mut h2 = h.clone();
        h2.router = Some(runner::RouterView {
            no_buffer: 3,
            ..Default::default()
        });
        let (good, why) = judge_path(&ok, &h2, &[], None);
        assert!(
            !good && why.contains("longhaul: emulator buffer-cap drops 3"),
            "{why}"
        );
    }
}
