//! haul-jobbench: a transfer job across an emulated WAN link whose capacity changes while it
//! runs (issue 16's capacity-change figure). A netlab lab of two sites (one host each: the
//! metadata server and a storage node at a, a storage node at b), a data set uploaded to a's
//! node, then one job (`haul submit -r --site B`) copying it to b while the link goes
//! `--high` -> `--low` -> `--high` (the emulator's live `set`), `--phase` seconds each. The
//! goodput is the bytes the emulated link delivered a -> b, sampled every 250 ms; for each
//! change, the seconds until the goodput (mean over the last second) is back above 90% of the
//! new rate, and each phase's mean goodput as a share of its rate. Every figure is measured in
//! this run. Writes bench/results/<date>-jobs-wan.{md,json}. Run it through `bench/jobs`.

#[allow(dead_code)]
#[path = "../data.rs"]
mod data;
#[allow(dead_code)]
#[path = "../labgrid.rs"]
mod labgrid;

use anyhow::{Context, Result, bail};
use clap::Parser;
use data::MIB;
use labgrid::Grid;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
struct Args {
    /// The haul binary (a release build).
    #[arg(long)]
    haul: PathBuf,
    #[arg(long, default_value = "bench/results")]
    out: PathBuf,
    #[arg(long, default_value = "/var/tmp/haul-jobbench")]
    work: PathBuf,
    /// Round-trip time of the link, ms.
    #[arg(long, default_value_t = 40)]
    rtt_ms: u64,
    /// The link's rate before and after the dip, bits/s.
    #[arg(long, default_value_t = 1_000_000_000)]
    high: u64,
    /// The rate during the dip, bits/s.
    #[arg(long, default_value_t = 300_000_000)]
    low: u64,
    /// Seconds of each phase.
    #[arg(long, default_value_t = 20)]
    phase: u64,
    /// Shorter phases and data (a check that everything works, not a measurement).
    #[arg(long)]
    quick: bool,
    /// Instead: the job beside a competing iperf3 flow (one cubic stream, 15 s) on a link of
    /// `--low`, once per fairness cap `--job-link-streams K` listed here ("none": no cap),
    /// e.g. 1,4,none.
    #[arg(long, value_name = "K,...")]
    compete: Option<String>,
    /// Instead: a 10,000-file job of mixed sizes on a link of `--high` and `--rtt-ms`, beside
    /// `globus-url-copy -f LIST -cc N -pp` for each N listed here, e.g. 4,8,16.
    #[arg(long, value_name = "N,...")]
    versus: Option<String>,
    /// With --versus: extra flags of the metadata server, e.g. "--job-batch-files 500"
    /// [default: none].
    #[arg(long, value_name = "FLAGS", allow_hyphen_values = true)]
    meta_flags: Option<String>,
}

/// One sample of the link a -> b.
#[derive(Clone, Copy, Debug)]
struct Sample {
    t: f64,
    bytes: u64,
    rate_bps: u64,
}

fn main() -> Result<()> {
    let args = Args::parse();
    if let Err(why) = netlab::Lab::available() {
        bail!("netlab cannot run here: {why}");
    }
    let haul = std::fs::canonicalize(&args.haul).context("--haul")?;
    if let Some(caps) = &args.compete {
        return compete(&args, &haul, caps);
    }
    if let Some(ccs) = &args.versus {
        return versus(&args, &haul, ccs);
    }
    let phase = if args.quick { 6 } else { args.phase };
    std::fs::create_dir_all(&args.work)?;
    // Enough data that the job outlasts the three phases by a third.
    let need = (args.high as f64 * 2.0 + args.low as f64) / 8.0 * phase as f64 * 1.35;
    let file = 64 * MIB;
    let count = ((need / file as f64).ceil() as usize).max(4);
    let sizes = vec![file; count];
    let _ = std::fs::remove_dir_all(args.work.join("wan"));
    let _ = std::fs::remove_file(args.work.join(".wan.complete"));
    let ds = data::tree(&args.work, "jobs", "wan", &sizes, 1616)?;
    eprintln!(
        "jobbench: {} files, {}, link {} -> {} -> {} bit/s, {} ms, {phase} s phases",
        ds.file_count,
        data::human(ds.bytes),
        args.high,
        args.low,
        args.high,
        args.rtt_ms
    );
    let lab = two_sites(args.high, args.rtt_ms)?;
    let dir = args.work.join("grid");
    let _ = std::fs::remove_dir_all(&dir);
    let g = Grid::start(&dir, &haul, &lab)?;
    upload(&g, &ds)?;
    let id = submit_to_b(&g, "/ds/wan")?;
    let started = Instant::now();
    let base = lab.elapsed().as_secs_f64();
    let mut samples: Vec<Sample> = Vec::new();
    let mut changes: Vec<(f64, u64)> = vec![(0.0, args.high)];
    let plan = [
        (Duration::from_secs(phase), args.low),
        (Duration::from_secs(2 * phase), args.high),
    ];
    let mut next = 0;
    let mut rate = args.high;
    let mut done = false;
    let mut sessions: Vec<(f64, u64)> = Vec::new();
    let mut last_poll = Instant::now();
    // Sample until the three phases are over (and the job still runs), bounded.
    while started.elapsed() < Duration::from_secs(3 * phase + 2) {
        if next < plan.len() && started.elapsed() >= plan[next].0 {
            rate = plan[next].1;
            let mut p = lab.link("a").context("link a")?;
            p.rate_bps = Some(rate);
            lab.set_link("a", p)?;
            changes.push((started.elapsed().as_secs_f64(), rate));
            next += 1;
        }
        let s = lab.stats();
        samples.push(Sample {
            t: s.elapsed_s - base,
            bytes: delivered_a_to_b(&s),
            rate_bps: rate,
        });
        if last_poll.elapsed() >= Duration::from_secs(2) {
            last_poll = Instant::now();
            if let Ok(v) = g.json(&["jobs", "--json"], Duration::from_secs(10)) {
                if let Some(l) = v["links"].as_array().and_then(|a| {
                    a.iter()
                        .find(|l| l["src_site"] == "A" && l["dst_site"] == "B")
                        .cloned()
                }) {
                    sessions.push((
                        started.elapsed().as_secs_f64(),
                        l["sessions"].as_u64().unwrap_or(0),
                    ));
                }
                done = v["jobs"]
                    .as_array()
                    .and_then(|a| a.first())
                    .is_some_and(|j| j["state"] != "running" && j["state"] != "queued");
            }
        }
        if done {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let stats = lab.stats();
    let _ = g.run(&["job", "cancel", &id], Duration::from_secs(30), "cancel");
    // Goodput over the last second at each sample.
    let mut series: Vec<(f64, f64, u64)> = Vec::new();
    for (i, s) in samples.iter().enumerate() {
        let Some(j) = samples[..i].iter().rposition(|p| s.t - p.t >= 1.0) else {
            continue;
        };
        let p = samples[j];
        let bps = (s.bytes - p.bytes) as f64 * 8.0 / (s.t - p.t);
        series.push((s.t, bps, s.rate_bps));
    }
    let mut rows = Vec::new();
    for (k, (at, r)) in changes.iter().enumerate() {
        let end = changes
            .get(k + 1)
            .map(|c| c.0)
            .unwrap_or(3.0 * phase as f64);
        let recovered = series
            .iter()
            .find(|(t, bps, _)| *t > *at + 1.0 && *t < end && *bps >= 0.9 * *r as f64)
            .map(|(t, _, _)| t - at);
        let in_phase: Vec<f64> = series
            .iter()
            .filter(|(t, _, _)| *t > *at + 1.0 && *t <= end)
            .map(|(_, b, _)| *b)
            .collect();
        let mean = in_phase.iter().sum::<f64>() / in_phase.len().max(1) as f64;
        rows.push(json!({
            "at_s": at,
            "rate_bps": r,
            "seconds_to_90_percent": recovered,
            "mean_goodput_bps": mean,
            "mean_share": mean / *r as f64,
        }));
    }
    let late = stats
        .directions
        .iter()
        .map(|d| d.late_mean_us)
        .fold(0.0, f64::max);
    let doc = json!({
        "started": now_rfc3339(),
        "quick": args.quick,
        "rtt_ms": args.rtt_ms,
        "high_bps": args.high,
        "low_bps": args.low,
        "phase_s": phase,
        "files": ds.file_count,
        "bytes": ds.bytes,
        "changes": rows,
        "optimizer_sessions": sessions,
        "series": series.iter().map(|(t, b, r)| json!([t, b, r])).collect::<Vec<_>>(),
        "emulator_late_mean_us": late,
        "emulator_cpu_s": stats.emulator_cpu_s,
        "host_drops": stats.host_tx_dropped + stats.host_rx_dropped,
    });
    write_results(&args, "jobs-wan", &doc, &markdown(&doc))?;
    Ok(())
}

/// Writes `doc` and its report `md` to bench/results/<date>-<what>[-quick].{json,md}, and
/// prints the report.
fn write_results(args: &Args, what: &str, doc: &Value, md: &str) -> Result<()> {
    std::fs::create_dir_all(&args.out)?;
    let stem = format!(
        "{}-{what}{}",
        &now_rfc3339()[..10],
        if args.quick { "-quick" } else { "" }
    );
    std::fs::write(
        args.out.join(format!("{stem}.json")),
        serde_json::to_string_pretty(doc)?,
    )?;
    std::fs::write(args.out.join(format!("{stem}.md")), md)?;
    print!("{md}");
    Ok(())
}

/// Two sites of one host each, joined by a link of `rate_bps` and `rtt_ms`, MTU 9000.
fn two_sites(rate_bps: u64, rtt_ms: u64) -> Result<netlab::Lab> {
    netlab::Lab::builder()
        .site("a", 1)
        .site("b", 1)
        .rate_bps(rate_bps)
        .rtt(Duration::from_millis(rtt_ms))
        .mtu(9000)
        .profile(netlab::Profile::Tuned)
        .build()
        .context("building the lab")
}

/// Submits one job copying grid tree `src` to `/copy` at site B; its id.
fn submit_to_b(g: &Grid, src: &str) -> Result<String> {
    let job = g.json(
        &["submit", "--json", "-r", "--site", "B", src, "/copy"],
        Duration::from_secs(120),
    )?;
    Ok(job["job"]["id"].as_i64().context("job id")?.to_string())
}

/// Puts the data set into the grid at site A, under `/ds`.
fn upload(g: &Grid, ds: &data::Dataset) -> Result<()> {
    let mk = g.run(&["mkdir", "-p", "/ds"], Duration::from_secs(30), "mkdir")?;
    if !mk.ok() {
        bail!("mkdir /ds: {}", mk.why());
    }
    let up = g.run(
        &[
            "cp",
            "-r",
            "--site",
            "A",
            "--progress",
            "never",
            &ds.root.to_string_lossy(),
            &format!("{}/ds/", g.meta_url),
        ],
        Duration::from_secs(1800),
        "upload",
    )?;
    if !up.ok() {
        bail!("upload: {}", up.why());
    }
    Ok(())
}

/// Bytes the link delivered from site a to site b so far.
fn delivered_a_to_b(s: &netlab::Stats) -> u64 {
    s.directions
        .iter()
        .find(|d| d.from == "a")
        .map(|d| d.bytes)
        .unwrap_or(0)
}

fn now_rfc3339() -> String {
    let out = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output();
    out.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn mbit(v: &Value) -> String {
    v.as_f64()
        .map(|b| format!("{:.0}", b / 1e6))
        .unwrap_or_else(|| "-".into())
}

fn markdown(doc: &Value) -> String {
    let mut s = format!(
        "# A transfer job across a link whose capacity changes, {}\n\nGenerated by `bench/jobs{}`: netlab, two sites (metadata server and a node at a, a node at b), {} ms RTT, MTU 9000; {} files ({} bytes) copied a -> b by one job (`haul submit -r --site B`) while the emulator's rate goes {} -> {} -> {} Mbit/s, {} s each. Goodput: bytes the emulated link delivered a -> b, over the last second, sampled every 250 ms. Numbers as measured; 2 cores shared by the emulator, both nodes, the metadata server and the client.\n\n| change at (s) | new rate (Mbit/s) | seconds until goodput ≥ 90% of it | mean goodput in the phase (Mbit/s) | share of the rate |\n|---|---|---|---|---|\n",
        doc["started"].as_str().unwrap_or(""),
        if doc["quick"] == true { " --quick" } else { "" },
        doc["rtt_ms"],
        doc["files"],
        doc["bytes"],
        mbit(&doc["high_bps"]),
        mbit(&doc["low_bps"]),
        mbit(&doc["high_bps"]),
        doc["phase_s"],
    );
    for r in doc["changes"].as_array().into_iter().flatten() {
        s += &format!(
            "| {:.1} | {} | {} | {} | {:.0}% |\n",
            r["at_s"].as_f64().unwrap_or(0.0),
            mbit(&r["rate_bps"]),
            r["seconds_to_90_percent"]
                .as_f64()
                .map(|x| format!("{x:.1}"))
                .unwrap_or_else(|| "not within the phase".into()),
            mbit(&r["mean_goodput_bps"]),
            r["mean_share"].as_f64().unwrap_or(0.0) * 100.0
        );
    }
    s += &format!(
        "\nThe optimizer's sessions on the link A -> B over time (s, sessions): {}\n\nEmulator: mean lateness {:.0} µs, CPU {:.1} s, host drops {} (a measurement with host drops is suspect).\n",
        doc["optimizer_sessions"],
        doc["emulator_late_mean_us"].as_f64().unwrap_or(0.0),
        doc["emulator_cpu_s"].as_f64().unwrap_or(0.0),
        doc["host_drops"],
    );
    s
}

/// The job beside a competing iperf3 flow on a link of `--low` bits/s, once per fairness cap.
fn compete(args: &Args, haul: &std::path::Path, caps: &str) -> Result<()> {
    let window = if args.quick { 8 } else { 15 };
    let rate = args.low;
    // The job runs 5 s alone, then `window` s beside iperf3, and must outlast it.
    let need = rate as f64 / 8.0 * (window as f64 + 10.0) * 1.3;
    let file = 32 * MIB;
    let count = ((need / file as f64).ceil() as usize).max(4);
    let _ = std::fs::remove_dir_all(args.work.join("compete"));
    let _ = std::fs::remove_file(args.work.join(".compete.complete"));
    let ds = data::tree(&args.work, "jobs", "compete", &vec![file; count], 2727)?;
    let mut rows = Vec::new();
    for cap in caps.split(',').map(str::trim).filter(|c| !c.is_empty()) {
        let lab = two_sites(rate, args.rtt_ms)?;
        let dir = args.work.join(format!("compete-{cap}"));
        let _ = std::fs::remove_dir_all(&dir);
        let meta_args: Vec<&str> = if cap == "none" {
            vec![]
        } else {
            vec!["--job-link-streams", cap]
        };
        let g = Grid::start_with(&dir, haul, &lab, &meta_args)?;
        upload(&g, &ds)?;
        let b0 = lab.host("b", 0);
        let mut server = b0
            .command("iperf3")
            .args(["-s", "-1", "-B", &b0.addr().to_string(), "-p", "5299"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .context("iperf3 -s")?;
        let id = submit_to_b(&g, "/ds/compete")?;
        std::thread::sleep(Duration::from_secs(5));
        let before = lab.stats();
        let client = lab
            .host("a", 0)
            .command("iperf3")
            .args([
                "-c",
                &b0.addr().to_string(),
                "-p",
                "5299",
                "-t",
                &window.to_string(),
                "-C",
                "cubic",
                "-J",
            ])
            .output()
            .context("iperf3 -c")?;
        let after = lab.stats();
        let _ = server.kill();
        let _ = server.wait();
        let _ = g.run(&["job", "cancel", &id], Duration::from_secs(30), "cancel");
        // The streams the job's sessions had (from the transfer history).
        let streams: Vec<u64> = g
            .json(
                &["transfers", "--kind", "job", "--json", "--limit", "200"],
                Duration::from_secs(30),
            )
            .ok()
            .and_then(|h| {
                h["transfers"]
                    .as_array()
                    .map(|a| a.iter().filter_map(|t| t["streams"].as_u64()).collect())
            })
            .unwrap_or_default();
        let v: Value = serde_json::from_slice(&client.stdout).unwrap_or(Value::Null);
        let iperf_bps = v["end"]["sum_received"]["bits_per_second"]
            .as_f64()
            .unwrap_or(0.0);
        let secs = (after.elapsed_s - before.elapsed_s).max(1e-9);
        let link_bps = (delivered_a_to_b(&after) - delivered_a_to_b(&before)) as f64 * 8.0 / secs;
        let job_bps = (link_bps - iperf_bps).max(0.0);
        eprintln!(
            "jobbench: cap {cap}: link {:.0} Mbit/s, iperf3 {:.0}, job {:.0}",
            link_bps / 1e6,
            iperf_bps / 1e6,
            job_bps / 1e6
        );
        rows.push(json!({
            "cap": cap,
            "link_bps": link_bps,
            "iperf3_bps": iperf_bps,
            "job_bps": job_bps,
            "job_share": job_bps / link_bps.max(1.0),
            "session_streams_max": streams.iter().max(),
        }));
    }
    let doc = json!({
        "started": now_rfc3339(),
        "quick": args.quick,
        "rtt_ms": args.rtt_ms,
        "rate_bps": rate,
        "window_s": window,
        "rows": rows,
    });
    let mut md = format!(
        "# A transfer job beside a competing flow, {}\n\nGenerated by `bench/jobs --compete ...{}`: netlab, two sites, {} Mbit/s, {} ms RTT, MTU 9000. A job of 32 MiB files a -> b runs 5 s alone, then one iperf3 stream (cubic) a -> b joins for {} s; the job's rate is what the link delivered a -> b in that window minus what iperf3 received. The fairness cap is `haul meta serve --job-link-streams K` (the job's streams on the link; `none`: the planner's choice). Numbers as measured.\n\n| cap K | link (Mbit/s) | iperf3 (Mbit/s) | job (Mbit/s) | job's share | a fair share of K+1 flows would give the job | most streams of a job session |\n|---|---|---|---|---|---|---|\n",
        doc["started"].as_str().unwrap_or(""),
        if args.quick { " --quick" } else { "" },
        rate / 1_000_000,
        args.rtt_ms,
        window
    );
    for r in doc["rows"].as_array().into_iter().flatten() {
        let fair = r["cap"]
            .as_str()
            .and_then(|c| c.parse::<f64>().ok())
            .map(|k| format!("{:.0}%", 100.0 * k / (k + 1.0)))
            .unwrap_or_else(|| "-".into());
        md += &format!(
            "| {} | {} | {} | {} | {:.0}% | {fair} | {} |\n",
            r["cap"].as_str().unwrap_or(""),
            mbit(&r["link_bps"]),
            mbit(&r["iperf3_bps"]),
            mbit(&r["job_bps"]),
            r["job_share"].as_f64().unwrap_or(0.0) * 100.0,
            r["session_streams_max"]
        );
    }
    write_results(args, "jobs-compete", &doc, &md)?;
    Ok(())
}

/// Sizes of the mixed 10,000-file data set: 9,000 small files (4-64 kB), 900 of 1 MiB, 100
/// of 8 MiB, shuffled (about 2 GB).
fn mixed_sizes(quick: bool) -> Vec<u64> {
    let scale = if quick { 10 } else { 1 };
    let mut sizes = data::small_sizes(9000 / scale, 3131);
    sizes.extend(std::iter::repeat_n(MIB, 900 / scale));
    sizes.extend(std::iter::repeat_n(8 * MIB, 100 / scale));
    let mut rng = data::Rng::new(3132);
    for i in (1..sizes.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        sizes.swap(i, j);
    }
    sizes
}

/// The 10,000-file job against `globus-url-copy -f LIST -cc N -pp` for each N of `ccs`, on
/// one link (`--high`, `--rtt-ms`): wall time, files and the link's use, side by side.
fn versus(args: &Args, haul: &std::path::Path, ccs: &str) -> Result<()> {
    let sizes = mixed_sizes(args.quick);
    // (Named by its size: a --quick run's smaller set is another data set.)
    let name = format!("mixed{}", sizes.len());
    let ds = data::tree(&args.work, "jobs", &name, &sizes, 4242)?;
    eprintln!(
        "jobbench: {} files, {}, link {} bit/s, {} ms",
        ds.file_count,
        data::human(ds.bytes),
        args.high,
        args.rtt_ms
    );
    let limit = Duration::from_secs(if args.quick { 300 } else { 1800 });
    let mut rows = Vec::new();
    // 1. longhaul: the data set at site A, one job to site B.
    {
        let lab = two_sites(args.high, args.rtt_ms)?;
        let dir = args.work.join("versus-grid");
        let _ = std::fs::remove_dir_all(&dir);
        let meta_args: Vec<&str> = args
            .meta_flags
            .as_deref()
            .map(|f| f.split_whitespace().collect())
            .unwrap_or_default();
        let g = Grid::start_with(&dir, haul, &lab, &meta_args)?;
        upload(&g, &ds)?;
        let before = lab.stats();
        let t0 = Instant::now();
        let t0_ms = epoch_ms();
        let id = submit_to_b(&g, &format!("/ds/{name}"))?;
        let wait = g.run(
            &[
                "job",
                "wait",
                &id,
                "--timeout",
                &format!("{}s", limit.as_secs()),
            ],
            limit + Duration::from_secs(30),
            "wait",
        )?;
        let waited = t0.elapsed().as_secs_f64();
        let after = lab.stats();
        let j = g.json(&["job", "show", &id, "--json"], Duration::from_secs(60))?;
        // `haul job wait` looks every 2 s at most: the job's own end (the server's clock is
        // this machine's) times it to the millisecond, from before its submission.
        let secs = match j["job"]["ended_ms"].as_i64() {
            Some(end) if end > t0_ms => (end - t0_ms) as f64 / 1000.0,
            _ => waited,
        };
        let done = j["job"]["files_done"].as_u64().unwrap_or(0);
        let ok = wait.ok() && done == ds.file_count as u64;
        let moved = delivered_a_to_b(&after) - delivered_a_to_b(&before);
        eprintln!("jobbench: haul job: {secs:.1} s, {done} files, ok {ok}");
        // The job's sessions, for what bounds it (their times, files and streams).
        if let Ok(h) = g.json(
            &["transfers", "--kind", "job", "--json", "--limit", "1000"],
            Duration::from_secs(60),
        ) {
            std::fs::create_dir_all(&args.out)?;
            std::fs::write(
                args.out.join("jobs-versus-sessions.json"),
                serde_json::to_string_pretty(&h)?,
            )?;
        }
        rows.push(json!({
            "tool": "haul submit (job, site A -> B)",
            "flags": match &args.meta_flags {
                Some(f) => format!("haul meta serve {f}"),
                None => "defaults".to_string(),
            },
            "seconds": secs,
            "files": done,
            "ok": ok,
            "goodput_bps": ds.bytes as f64 * 8.0 / secs,
            "link_bytes": moved,
        }));
    }
    // 2. globus-url-copy from host a's files to a GridFTP server on host b.
    let lab = two_sites(args.high, args.rtt_ms)?;
    let state = args.work.join("versus-gridftp");
    let _ = std::fs::remove_dir_all(&state);
    std::fs::create_dir_all(&state)?;
    let hosts = state.join("hosts");
    let (a0, b0) = (lab.host("a", 0), lab.host("b", 0));
    // GridFTP resolves its own host name and address (see bench/src/tools.rs): a hosts file
    // with them, bind-mounted over /etc/hosts in the server's mount namespace.
    let mut names = String::from("127.0.0.1 localhost\n");
    if let Ok(h) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        names.push_str(&format!("127.0.1.1 {}\n", h.trim()));
    }
    names.push_str(&format!("{} a0\n{} b0\n", a0.addr(), b0.addr()));
    std::fs::write(&hosts, names)?;
    const PORT: u16 = 2811;
    let server = format!(
        "mount --bind {hosts} /etc/hosts && exec env GLOBUS_USAGE_OPTOUT=1 globus-gridftp-server -S \
         -p {PORT} -control-interface {b} -data-interface {b} -aa -anonymous-user nobody \
         -home-dir / -disable-usage-stats -log-level error,warn -l {log} -pidfile {pid}",
        hosts = hosts.display(),
        b = b0.addr(),
        log = state.join("gridftp.log").display(),
        pid = state.join("gridftp.pid").display(),
    );
    let st = b0
        .command("unshare")
        .args(["--mount", "sh", "-c", &server])
        .status()
        .context("globus-gridftp-server (apt-get install globus-gridftp-server-progs)")?;
    if !st.success() {
        bail!("globus-gridftp-server did not start: {st}");
    }
    std::thread::sleep(Duration::from_secs(1));
    // The socket buffers a stream needs for the link (its bandwidth-delay product, x1.5).
    let bdp = (args.high as f64 / 8.0 * args.rtt_ms as f64 / 1000.0 * 1.5) as u64;
    for n in ccs.split(',').map(str::trim).filter(|c| !c.is_empty()) {
        let top = state.join(format!("dst-{n}"));
        let dst = top.join(&name);
        std::fs::create_dir_all(&dst)?;
        for d in [&top, &dst] {
            std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o777))?;
        }
        let list = state.join(format!("list-{n}"));
        let mut text = String::new();
        for (rel, _) in &ds.files {
            text.push_str(&format!(
                "file://{}/{} ftp://{}:{PORT}{}/{}\n",
                ds.root.display(),
                rel.display(),
                b0.addr(),
                dst.display(),
                rel.display()
            ));
        }
        std::fs::write(&list, text)?;
        let flags = format!("-cd -fast -cc {n} -pp -p 1 -tcp-bs {bdp}");
        let mut c = a0.command("globus-url-copy");
        c.args(flags.split(' ')).arg("-f").arg(&list);
        let before = lab.stats();
        let t0 = Instant::now();
        let out = labgrid::run_bounded(c, limit, &state.join(format!("guc-{n}.log")))?;
        let secs = t0.elapsed().as_secs_f64();
        let after = lab.stats();
        let verified = data::verify(&ds, &top);
        let ok = out.ok() && verified.is_ok();
        eprintln!(
            "jobbench: globus-url-copy -cc {n}: {secs:.1} s, ok {ok} {:?}",
            verified.err()
        );
        rows.push(json!({
            "tool": "globus-url-copy -f LIST",
            "flags": flags,
            "seconds": secs,
            "files": if ok { ds.file_count } else { 0 },
            "ok": ok,
            "goodput_bps": ds.bytes as f64 * 8.0 / secs,
            "link_bytes": delivered_a_to_b(&after) - delivered_a_to_b(&before),
        }));
        let _ = std::fs::remove_dir_all(&top);
    }
    if let Ok(pid) = std::fs::read_to_string(state.join("gridftp.pid")) {
        let _ = std::process::Command::new("kill").arg(pid.trim()).status();
    }
    let doc = json!({
        "started": now_rfc3339(),
        "quick": args.quick,
        "rtt_ms": args.rtt_ms,
        "rate_bps": args.high,
        "files": ds.file_count,
        "bytes": ds.bytes,
        "rows": rows,
    });
    let mut md = format!(
        "# A job of many files beside globus-url-copy, {}\n\nGenerated by `bench/jobs --versus {ccs}{}{}`: netlab, two sites, {} Mbit/s, {} ms RTT, MTU 9000. {} files ({}): {}. longhaul: the data set uploaded to site A's node, then one job (`haul submit -r --site B`), timed from just before its submission to the end the server records for it (`haul job show`: `haul job wait` looks every 2 s at most). GridFTP: `globus-url-copy -f LIST` from host a's files to `globus-gridftp-server` on host b (anonymous, as in reference/peers.md), each N of `-cc N -pp`; verified byte for byte. Numbers as measured.\n\n| tool | flags | seconds | files | goodput (Mbit/s) | share of the link | verified |\n|---|---|---|---|---|---|---|\n",
        now_rfc3339(),
        if args.quick { " --quick" } else { "" },
        if args.rtt_ms != 40 {
            format!(" --rtt-ms {}", args.rtt_ms)
        } else {
            String::new()
        },
        args.high / 1_000_000,
        args.rtt_ms,
        ds.file_count,
        data::human(ds.bytes),
        if args.quick {
            "900 of 4-64 kB, 90 of 1 MiB, 10 of 8 MiB, shuffled (--quick: a tenth)"
        } else {
            "9,000 of 4-64 kB, 900 of 1 MiB, 100 of 8 MiB, shuffled"
        },
    );
    for r in &rows {
        let g = r["goodput_bps"].as_f64().unwrap_or(0.0);
        md.push_str(&format!(
            "| {} | {} | {:.1} | {} | {:.0} | {:.0}% | {} |\n",
            r["tool"].as_str().unwrap_or(""),
            r["flags"].as_str().unwrap_or(""),
            r["seconds"].as_f64().unwrap_or(0.0),
            r["files"],
            g / 1e6,
            100.0 * g / args.high as f64,
            if r["ok"] == true { "yes" } else { "NO" },
        ));
    }
    write_results(args, "jobs-versus", &doc, &md)?;
    Ok(())
}

/// Milliseconds since the epoch, as the catalog records times.
fn epoch_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
