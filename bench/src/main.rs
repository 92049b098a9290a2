//! haul-bench: runs longhaul and the reference tools (iperf3, globus-url-copy, xrdcp, scp,
//! rsync) over netlab's emulated WAN for every scenario x workload x tool, checks every copy
//! against its source, and writes `bench/results/<date>.md` + `.json` + PNG plots (and
//! `bench/RESULTS.md` after a full run). It owns the measurement method; it does not own the
//! emulator (netlab) or the tools. Run it through `bench/run`, which builds it and installs
//! the tools. See bench/README.md.

mod data;
mod plan;
mod plot;
mod proc;
mod report;
mod runner;
mod tools;

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use clap::Parser;

use data::{Dataset, GIB, MIB};
use plan::{Case, Only, Tool};
use report::{Header, utc};
use runner::{Measurement, RunSpec};

/// Benchmarks longhaul against iperf3, globus-url-copy, xrdcp, scp and rsync over netlab.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Smaller workloads and fewer combinations (finishes in under 10 minutes).
    #[arg(long)]
    quick: bool,
    /// Only these scenarios, workloads and tools, comma separated (e.g. S1,W1,haul,globus).
    /// Within each kind, none named means all.
    #[arg(long, value_name = "LIST")]
    only: Option<String>,
    /// The haul binary to measure (a release build).
    #[arg(long, default_value = "/work/target-bench/release/haul")]
    haul: PathBuf,
    /// Repository root (for `git describe` and the default output directory).
    #[arg(long, default_value = ".")]
    repo: PathBuf,
    /// Where results go [default: <repo>/bench/results].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Scratch directory on tmpfs for workloads, copies and logs (removed at the end).
    #[arg(long, default_value = "/dev/shm/haul-bench")]
    work: PathBuf,
    /// The command line to record in the results (bench/run passes its own).
    #[arg(long)]
    command_line: Option<String>,
    /// What installing the tools gave (bench/run passes it).
    #[arg(long, default_value = "not attempted by this program")]
    install_status: String,
    /// Keep the scratch directory (workloads and logs) at the end.
    #[arg(long)]
    keep_work: bool,
}

fn main() {
    let args = Args::parse();
    match run(args) {
        Ok(failed) => std::process::exit(if failed { 1 } else { 0 }),
        Err(e) => {
            eprintln!("haul-bench: {e:#}");
            std::process::exit(2);
        }
    }
}

fn run(args: Args) -> Result<bool> {
    let only = match &args.only {
        Some(l) => Only::parse(l).map_err(anyhow::Error::msg)?,
        None => Only::default(),
    };
    let quick = args.quick;
    let repo = fs::canonicalize(&args.repo).context("repository root")?;
    let out_dir = args
        .out
        .clone()
        .unwrap_or_else(|| repo.join("bench/results"));
    fs::create_dir_all(&out_dir)?;
    let started = SystemTime::now();
    let date = utc(started).0;
    let mut base = date.clone();
    if quick {
        base.push_str("-quick");
    }
    if !only.is_empty() {
        base.push_str("-partial");
    }
    let plot_dir = out_dir.join(&base);
    let _ = fs::remove_dir_all(&plot_dir);
    fs::create_dir_all(&plot_dir)?;
    let json_path = out_dir.join(format!("{base}.json"));
    let md_path = out_dir.join(format!("{base}.md"));
    let full_run = !quick && only.is_empty();

    let cases = plan::cases(quick, &only);
    if cases.is_empty() {
        bail!("--only selected no case");
    }
    let haul = fs::canonicalize(&args.haul).with_context(|| {
        format!(
            "haul binary {} (build it first: bench/run does)",
            args.haul.display()
        )
    })?;

    let mut header = header(&args, &repo, &haul, &date, quick);
    header.started_utc = utc(started).1;
    let work = args.work.clone();
    fs::create_dir_all(&work)?;
    let mut ctx = tools::Ctx::new(haul.clone(), work.join("state"))?;

    // Whole-run blockers: these mark every case "not run" with the reason.
    let mut global_block: Option<String> = None;
    if let Err(why) = netlab::Lab::available() {
        global_block = Some(format!("netlab unavailable: {why}"));
    }
    let cg_root = proc::cgroup2_root();
    if cg_root.is_none() && global_block.is_none() {
        global_block =
            Some("no cgroup v2 hierarchy mounted: CPU per side cannot be measured".into());
    }
    let _ = netlab::cleanup_leftovers();
    let mut tool_block: BTreeMap<&'static str, String> = BTreeMap::new();
    for t in [
        Tool::Iperf3,
        Tool::Globus,
        Tool::Xrdcp,
        Tool::Scp,
        Tool::Rsync,
    ] {
        if let Some(p) = tools::missing_program(t) {
            tool_block.insert(
                t.id(),
                format!("{p} is not installed (install: {})", args.install_status),
            );
        }
    }
    let wants = |t: Tool| cases.iter().any(|c| c.variant.tool == t);
    if (wants(Tool::Scp) || wants(Tool::Rsync))
        && !tool_block.contains_key("scp")
        && let Err(e) = ctx.setup_ssh()
    {
        let why = format!("ssh key setup failed: {e:#}");
        tool_block.insert("scp", why.clone());
        tool_block.insert("rsync", why);
    }
    if wants(Tool::HaulTls)
        && let Err(e) = ctx.setup_pki()
    {
        tool_block.insert("haul-tls", format!("certificate setup failed: {e:#}"));
    }
    if let Err(e) = plot::init_font() {
        header.notes.push(format!("no plots: {e}"));
    }

    let mut runs: Vec<Measurement> = Vec::new();
    let mut plots: Vec<(String, String)> = Vec::new();
    let save = |h: &Header, runs: &[Measurement], plots: &[(String, String)]| -> Result<()> {
        report::write_json(&json_path, h, runs)?;
        let md = report::markdown(h, runs, plots, &format!("{base}/"));
        fs::write(&md_path, md)?;
        Ok(())
    };
    println!(
        "haul-bench: {} cases ({}), results in {}",
        cases.len(),
        if quick { "quick" } else { "full" },
        md_path.display()
    );
    let t_start = Instant::now();
    let mut current: Option<(&str, Result<Dataset, String>)> = None;
    let n = cases.len();
    for (i, case) in cases.iter().enumerate() {
        let w = case.workload;
        // Load (generate) the workload when it changes; free the previous one.
        if current.as_ref().map(|c| c.0) != Some(w) {
            if let Some((old, _)) = current.take() {
                remove_workload(&work, old);
            }
            let needs_data = cases[i..]
                .iter()
                .take_while(|c| c.workload == w)
                .any(|c| c.variant.tool != Tool::Iperf3);
            let ds = if needs_data && global_block.is_none() {
                println!("  generating workload {w} ...");
                let t = Instant::now();
                let r = make_workload(&work, w, quick, case.scenario.pairs);
                if let Ok(ds) = &r {
                    println!(
                        "  {w}: {} files, {} in {:.1} s",
                        ds.file_count,
                        data::human(ds.bytes),
                        t.elapsed().as_secs_f64()
                    );
                }
                r
            } else {
                Err("no data needed".into())
            };
            current = Some((w, ds));
        }
        let label = format!(
            "[{:>2}/{n}] {} {} {} {}",
            i + 1,
            case.scenario.id,
            w,
            case.variant.tool.display(),
            case.variant.label
        );
        print!("{label} ... ");
        let _ = std::io::stdout().flush();
        let m = run_one(
            &ctx,
            case,
            current.as_ref().map(|c| &c.1),
            &global_block,
            &tool_block,
            &cg_root,
            &work,
            quick,
        );
        match m.status.as_str() {
            "ok" => println!(
                "{:.1} Mbit/s{} in {:.1} s{}, CPU {:.1}/{:.1} s, RSS {}/{} MiB",
                m.goodput_mbps,
                m.pct_link.map_or(String::new(), |p| format!(" ({p:.1}%)")),
                m.wall_s,
                if m.tool == "iperf3" {
                    ""
                } else {
                    ", identical"
                },
                m.cpu_client.total,
                m.cpu_server.total,
                m.peak_rss_client / MIB,
                m.peak_rss_server / MIB
            ),
            s => println!("{s}: {}", m.reason),
        }
        if m.status == "ok" && m.tool.starts_with("haul") && !m.bins_16ms.is_empty() {
            let file = format!("{}.png", m.id);
            let title = format!(
                "{} {} {} ({})",
                m.scenario,
                m.workload,
                plan_tool_name(&m.tool),
                m.variant
            );
            match plot::run_plot(
                &plot_dir.join(&file),
                &title,
                &m.bins_16ms,
                &m.bins_1s,
                m.window_ms,
                case.scenario.link_mbps().unwrap_or(1000.0),
            ) {
                Ok(()) => plots.push((title, file)),
                Err(e) => eprintln!("  plot {file}: {e:#}"),
            }
        }
        runs.push(m);
        save(&header, &runs, &plots)?;
    }
    if let Some((old, _)) = current.take() {
        remove_workload(&work, old);
    }
    // Per scenario and workload: all tools at 1 s.
    type Lines = Vec<(String, Vec<u64>, u64)>;
    let mut groups: BTreeMap<(String, String), Lines> = BTreeMap::new();
    for m in runs
        .iter()
        .filter(|m| m.status == "ok" && !m.bins_1s.is_empty())
    {
        groups
            .entry((m.scenario.clone(), m.workload.clone()))
            .or_default()
            .push((
                format!("{} {}", plan_tool_name(&m.tool), m.variant),
                m.bins_1s.clone(),
                m.window_ms,
            ));
    }
    for ((s, w), lines) in groups {
        if lines.len() < 2 {
            continue;
        }
        let file = format!("{s}-{w}-all-tools.png");
        let title = format!("{s} {w}: every tool, 1 s bins (router's view)");
        match plot::overlay_plot(&plot_dir.join(&file), &title, &lines, 1000.0) {
            Ok(()) => plots.push((title, file)),
            Err(e) => eprintln!("  plot {file}: {e:#}"),
        }
    }
    header.finished_utc = utc(SystemTime::now()).1;
    save(&header, &runs, &plots)?;
    if full_run {
        let md = report::markdown(&header, &runs, &plots, &format!("results/{base}/"));
        fs::write(repo.join("bench/RESULTS.md"), md)?;
    }
    if !args.keep_work {
        let _ = fs::remove_dir_all(&work);
    }
    let failed = runs.iter().filter(|m| m.status == "FAILED").count();
    let not_run = runs.iter().filter(|m| m.status == "not run").count();
    println!(
        "haul-bench: {} runs in {:.0} s: {} ok, {failed} FAILED, {not_run} not run; {}",
        runs.len(),
        t_start.elapsed().as_secs_f64(),
        runs.len() - failed - not_run,
        md_path.display()
    );
    Ok(failed > 0)
}

fn plan_tool_name(id: &str) -> &str {
    match id {
        "haul" => "longhaul",
        "haul-tls" => "longhaul TLS",
        "globus" => "globus-url-copy",
        o => o,
    }
}

#[allow(clippy::too_many_arguments)]
fn run_one(
    ctx: &tools::Ctx,
    case: &Case,
    ds: Option<&Result<Dataset, String>>,
    global_block: &Option<String>,
    tool_block: &BTreeMap<&'static str, String>,
    cg_root: &Option<PathBuf>,
    work: &Path,
    quick: bool,
) -> Measurement {
    if let Some(why) = global_block {
        return Measurement::not_run(case, why);
    }
    if let Some(why) = tool_block.get(case.variant.tool.id()) {
        return Measurement::not_run(case, why);
    }
    let s = &case.scenario;
    let v = &case.variant;
    let started_utc = utc(SystemTime::now()).1;
    let spec = |ds, full_bytes, limit| RunSpec {
        ctx,
        case,
        ds,
        full_bytes,
        limit,
        work: work.to_path_buf(),
        cg_root: cg_root.clone(),
        started_utc: started_utc.clone(),
    };
    if v.tool == Tool::Iperf3 {
        let secs: u64 = v
            .flags
            .windows(2)
            .find(|w| w[0] == "-t")
            .and_then(|w| w[1].parse().ok())
            .unwrap_or(20);
        let none: Option<&Dataset> = None;
        return runner::run(&spec(none, 0, Duration::from_secs(secs + 30)));
    }
    let ds = match ds {
        Some(Ok(ds)) => ds,
        Some(Err(why)) => return Measurement::not_run(case, why),
        None => return Measurement::not_run(case, "workload missing"),
    };
    let target_s = if quick { 12.0 } else { 40.0 };
    let (sub, expect_s) = match s.rate_bps {
        None => (Ok(ds.clone()), 60.0),
        Some(rate) => {
            let bps = rate as f64 * plan::expected_fraction(s, case.workload, v) / 8.0;
            let fps = if case.workload == "W3" {
                plan::expected_files_per_s(s, v)
            } else {
                f64::INFINITY
            };
            let per_pair =
                |d: &Dataset| d.bytes as f64 * s.pairs as f64 / bps + d.file_count as f64 / fps;
            let mut max_bytes = u64::MAX;
            let mut max_files = usize::MAX;
            if per_pair(ds) > 1.5 * target_s {
                if ds.bytes as f64 / bps > target_s {
                    let b = (bps * target_s) as u64;
                    // Round down to a power of two MiB, at least 64 MiB.
                    let mut p = 64 * MIB;
                    while p * 2 <= b {
                        p *= 2;
                    }
                    max_bytes = p;
                }
                if ds.file_count as f64 / fps > target_s {
                    max_files = ((fps * target_s) as usize).max(10);
                }
            }
            let sub = data::subset(ds, max_bytes, max_files, 11);
            let e = sub.as_ref().map(per_pair).unwrap_or(60.0);
            (sub, e)
        }
    };
    let sub = match sub {
        Ok(d) => d,
        Err(e) => {
            return Measurement::not_run(
                case,
                &format!("could not make the time-boxed subset: {e:#}"),
            );
        }
    };
    let limit = Duration::from_secs_f64((5.0 * expect_s + 60.0).clamp(90.0, 900.0));
    runner::run(&spec(Some(&sub), ds.bytes, limit))
}

/// Generates workload `w` under `work/src` (after checking there is memory for it and a copy).
fn make_workload(work: &Path, w: &str, quick: bool, pairs: usize) -> Result<Dataset, String> {
    let dir = work.join("src");
    let bytes = match w {
        "W1" => plan::w1_bytes(quick),
        "W2" => plan::w2_bytes(quick),
        "W3" => 72 * 1_000_000,
        _ => plan::s5_bytes(quick),
    };
    let copies = if w == "W1x4" { 4 } else { pairs as u64 };
    let need = bytes + copies * bytes + GIB + GIB / 2;
    let avail = proc::mem_available().min(proc::fs_available(Path::new("/dev/shm")).max(1));
    let avail = if fs::metadata(&dir).is_ok() {
        avail
    } else {
        avail.min(proc::fs_available(work))
    };
    if need > avail {
        return Err(format!(
            "not enough memory for tmpfs: source + copies + 1.5 GiB margin need {}, {} available (MemAvailable / free /dev/shm); free memory and run again",
            data::human(need),
            data::human(avail)
        ));
    }
    let r = match w {
        "W1" => data::single(&dir, "W1", "w1.bin", bytes, 1),
        "W2" => data::tree(&dir, "W2", "w2", &data::climate_sizes(bytes, 5), 200),
        "W3" => data::tree(&dir, "W3", "w3", &data::small_sizes(2000, 3), 300),
        _ => data::single(&dir, "W1x4", "w1x4.bin", bytes, 5),
    };
    r.map_err(|e| format!("generating {w}: {e:#}"))
}

fn remove_workload(work: &Path, _w: &str) {
    let _ = fs::remove_dir_all(work.join("src"));
}

fn header(args: &Args, repo: &Path, haul: &Path, date: &str, quick: bool) -> Header {
    let git = report::git_describe(repo);
    let haul_version = tools::version(&haul.to_string_lossy(), &["--version"]);
    let machine = report::Machine::now();
    let tools_v = vec![
        (
            "iperf3".to_string(),
            tools::version("iperf3", &["--version"]),
        ),
        (
            "globus-url-copy".to_string(),
            tools::version("globus-url-copy", &["-version"]),
        ),
        (
            "globus-gridftp-server".to_string(),
            tools::version("globus-gridftp-server", &["-version"]),
        ),
        ("xrdcp".to_string(), tools::version("xrdcp", &["--version"])),
        ("xrootd".to_string(), tools::version("xrootd", &["-v"])),
        ("ssh".to_string(), tools::version("ssh", &["-V"])),
        ("rsync".to_string(), tools::version("rsync", &["--version"])),
    ];
    let command = args
        .command_line
        .clone()
        .unwrap_or_else(|| std::env::args().collect::<Vec<_>>().join(" "));
    Header {
        title: format!(
            "longhaul benchmark, {date}{}",
            if quick { " (--quick)" } else { "" }
        ),
        date: date.into(),
        command,
        quick,
        only: args.only.clone().unwrap_or_default(),
        haul_version: report::binary_version(haul, &haul_version),
        git_describe: git,
        tools: tools_v,
        kernel: machine.kernel,
        cpu: machine.cpu,
        cores: machine.cores,
        memory: machine.memory,
        install: args.install_status.clone(),
        scenarios: plan::scenarios(),
        workloads: ["W1", "W2", "W3", "W1x4"]
            .iter()
            .map(|w| (w.to_string(), plan::workload_description(w, quick)))
            .collect(),
        notes: vec![
            "longhaul runs with no tuning flags (`haul cp --insecure --json`), except the TLS row (`--protect private` with certificates).".into(),
            "globus-gridftp-server runs as in peers.md, inside a private mount namespace whose /etc/hosts names the lab addresses: without it the server fails at start (\"Temporary failure in name resolution\": this sandbox has no reachable DNS).".into(),
            "Every transfer is an upload from site a (client) to site b (server); XRootD's --streams therefore uses the main stream (peers.md).".into(),
            "The machine has 2 cores shared with other work; CPU-bound figures (S4) vary with that load.".into(),
        ],
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_plan_is_small_and_full_plan_covers_every_scenario() {
        let q = plan::cases(true, &Only::default());
        assert!(q.len() < 40, "{}", q.len());
        let f = plan::cases(false, &Only::default());
        for s in ["S1", "S1s", "S2", "S3", "S4", "S5"] {
            assert!(f.iter().any(|c| c.scenario.id == s), "{s}");
        }
        assert!(f.iter().any(|c| c.variant.tool == Tool::HaulTls));
        // S4 W1's compared tools run in three interleaved rounds, the others once.
        let s4 = |tool: Tool| {
            f.iter()
                .filter(|c| c.scenario.id == "S4" && c.workload == "W1" && c.variant.tool == tool)
                .count()
        };
        // defaults, --no-zero-copy, --trace
        assert_eq!(s4(Tool::Haul), 3 * 3);
        assert_eq!(s4(Tool::Floor), 3 * 2);
        assert_eq!(s4(Tool::Scp), 1);
        let ids: std::collections::HashSet<String> = f.iter().map(runner::case_id).collect();
        assert_eq!(ids.len(), f.len(), "case ids are unique");
    }

    #[test]
    fn only_filters() {
        let o = Only::parse("S1,W1,haul").unwrap();
        let c = plan::cases(false, &o);
        assert!(
            c.iter()
                .all(|c| c.scenario.id == "S1" && c.workload == "W1")
        );
        assert!(c.iter().all(|c| c.variant.tool == Tool::Haul));
        assert!(Only::parse("S9").is_err());
    }
}
