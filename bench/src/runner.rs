//! Runs one case: builds the lab, starts the server(s) in their cgroup, runs the client(s)
//! under a time limit while sampling memory, reads CPU, retransmission and router counters,
//! checks the destination against the source, and returns one `Measurement`.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use serde::Serialize;

use crate::data::{self, Dataset};
use crate::plan::{Case, Scenario, Tool};
use crate::proc::{self, Cgroup, CpuTime, MemPeak};
use crate::tools::{self, Ctx, ServerSpot};

/// Everything measured in one run (one row of the tables).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Measurement {
    pub id: String,
    pub scenario: String,
    pub workload: String,
    pub tool: String,
    pub variant: String,
    /// Client command line of the (first) pair.
    pub command: String,
    /// "ok", "FAILED" or "not run".
    pub status: String,
    pub reason: String,
    /// What was copied: the dataset id (with its subset, if time-boxed).
    pub data: String,
    pub data_bytes: u64,
    pub data_files: usize,
    /// Bytes of the full workload (differs from data_bytes when time-boxed).
    pub full_bytes: u64,
    pub time_boxed: bool,
    pub pairs: usize,
    pub wall_s: f64,
    /// Payload bits per second of wall clock (iperf3: its receiver-side rate).
    pub goodput_mbps: f64,
    pub pct_link: Option<f64>,
    pub cpu_client: CpuTime,
    pub cpu_server: CpuTime,
    pub cpu_client_s_per_gib: Option<f64>,
    pub cpu_server_s_per_gib: Option<f64>,
    pub mem_client: MemPeak,
    pub mem_server: MemPeak,
    /// getrusage ru_maxrss of the client process tree (largest single process), bytes.
    pub client_ru_maxrss: u64,
    /// getrusage user+system CPU of the client process tree, seconds (cross-check of the
    /// cgroup figure; misses descendants that were not waited for).
    pub client_rusage_cpu_s: f64,
    /// Peak resident memory per side as reported: max(sampled sum over the side's
    /// processes, largest per-process VmHWM, client ru_maxrss), bytes.
    pub peak_rss_client: u64,
    pub peak_rss_server: u64,
    /// Delta of Tcp RetransSegs in the sender's (client's) namespace(s).
    pub retrans_segs: Option<u64>,
    /// What the tool itself reported as retransmissions (haul tcp_retransmits, iperf3
    /// sum_sent.retransmits).
    pub tool_retrans: Option<u64>,
    pub router: Option<RouterView>,
    /// Tool's own summary (haul --json without its file list, iperf3 -J end section).
    pub tool_report: serde_json::Value,
    pub exit_codes: Vec<i32>,
    pub pair_wall_s: Vec<f64>,
    /// Bytes leaving the bottleneck (client to server) per 16 ms from client start (longhaul
    /// runs only).
    pub bins_16ms: Vec<u64>,
    /// Same, per second (every run on an emulated link).
    pub bins_1s: Vec<u64>,
    /// Length of the window the bins cover, ms (the last bin of each series may be partial).
    pub window_ms: u64,
    pub stderr_tail: String,
    pub started_utc: String,
}

/// The emulator's counters for the direction client to server over the run, and what says the
/// emulator or the hosts' devices lost packets the path model did not drop.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RouterView {
    pub delivered_bytes: u64,
    pub delivered_packets: u64,
    /// What arrived at the bottleneck (before queue and loss drops): what the senders put on
    /// the wire, IP headers included.
    pub offered_bytes: u64,
    pub offered_packets: u64,
    pub drops_queue: u64,
    pub drops_loss: u64,
    pub max_queue_bytes: u64,
    pub late_over_1ms: u64,
    pub reverse_drops: u64,
    pub emulator_cpu_s: f64,
    /// Packets the emulator could not write to the receiving device (gone or full), both
    /// directions.
    pub drops_other: u64,
    /// Packets dropped because the emulator's buffer memory cap was reached.
    pub no_buffer: u64,
    /// Drops the hosts' kernels counted on their `wan0` TUN devices (`/proc/net/dev`), summed
    /// over the lab's hosts: tx = packets a host sent that the device could not queue for the
    /// emulator (it did not read fast enough), rx = packets the emulator wrote that the host
    /// dropped.
    pub host_dev_tx_drops: u64,
    pub host_dev_rx_drops: u64,
    /// Counters in netlab's `Stats` this bench does not know by name (added to netlab after
    /// it was written), as deltas over the run: "a->b.drops.name", "name", ...
    pub other_counters: BTreeMap<String, u64>,
}

impl RouterView {
    /// One "what n" per counter saying packets were lost outside the path model (emulator
    /// buffer cap, device writes, device overflow, and any counter netlab added later whose
    /// name says drop, overflow, full, lost, overrun or behind); empty when there were none.
    #[allow(dead_code)] // haul-matrixbench's path check; haul-bench shows the counters in its JSON
    pub fn emulator_trouble(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (what, n) in [
            ("emulator device-write drops", self.drops_other),
            ("emulator buffer-cap drops", self.no_buffer),
            ("host wan0 tx drops", self.host_dev_tx_drops),
            ("host wan0 rx drops", self.host_dev_rx_drops),
        ] {
            if n > 0 {
                out.push(format!("{what} {n}"));
            }
        }
        for (name, n) in &self.other_counters {
            let l = name.to_ascii_lowercase();
            let bad = ["drop", "overflow", "full", "lost", "overrun", "behind"]
                .iter()
                .any(|w| l.contains(w));
            if bad && *n > 0 {
                out.push(format!("netlab {name} {n}"));
            }
        }
        out
    }
}

/// netlab's `Stats` fields this bench reads by name; any other numeric field is reported in
/// `RouterView::other_counters`.
const KNOWN_TOP: [&str; 9] = [
    "elapsed_s",
    "directions",
    "local_packets",
    "local_bytes",
    "unroutable",
    "no_buffer",
    "host_tx_dropped",
    "host_rx_dropped",
    "emulator_cpu_s",
];
const KNOWN_DIR: [&str; 11] = [
    "from",
    "to",
    "offered_packets",
    "offered_bytes",
    "packets",
    "bytes",
    "drops",
    "max_queue_bytes",
    "late_mean_us",
    "late_max_us",
    "late_over_1ms",
];
const KNOWN_DROPS: [&str; 4] = ["queue", "loss", "blackout", "other"];

/// Deltas of the integer counters of `Stats` not named above, found through its JSON form (so
/// a counter netlab gains later shows up without a change here).
pub fn other_counters(s0: &netlab::Stats, s1: &netlab::Stats) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let (Ok(v0), Ok(v1)) = (serde_json::to_value(s0), serde_json::to_value(s1)) else {
        return out;
    };
    let mut add = |name: String, a: &serde_json::Value, b: &serde_json::Value| {
        if let Some(b) = b.as_u64() {
            out.insert(name, b.saturating_sub(a.as_u64().unwrap_or(0)));
        }
    };
    let null = serde_json::Value::Null;
    if let Some(o) = v1.as_object() {
        for (k, b) in o.iter().filter(|(k, _)| !KNOWN_TOP.contains(&k.as_str())) {
            add(k.clone(), v0.get(k).unwrap_or(&null), b);
        }
    }
    let dirs = |v: &serde_json::Value| v["directions"].as_array().cloned().unwrap_or_default();
    let d0 = dirs(&v0);
    for (i, d) in dirs(&v1).iter().enumerate() {
        let a = d0.get(i).unwrap_or(&null);
        let p = format!(
            "{}->{}",
            d["from"].as_str().unwrap_or("?"),
            d["to"].as_str().unwrap_or("?")
        );
        if let Some(o) = d.as_object() {
            for (k, b) in o.iter().filter(|(k, _)| !KNOWN_DIR.contains(&k.as_str())) {
                add(format!("{p}.{k}"), a.get(k).unwrap_or(&null), b);
            }
        }
        if let Some(o) = d["drops"].as_object() {
            for (k, b) in o.iter().filter(|(k, _)| !KNOWN_DROPS.contains(&k.as_str())) {
                add(format!("{p}.drops.{k}"), &a["drops"][k.as_str()], b);
            }
        }
    }
    out
}

/// The lab of a scenario: sites a and b with `pairs` hosts each (S4: one host, no emulation),
/// the scenario's rate, RTT, random loss, MTU and host profile, netlab's default drop-tail
/// queue of one bandwidth-delay product, host congestion control cubic; bytes per 1 ms
/// recorded to `csv` if given.
pub fn build_lab(s: &Scenario, csv: Option<&Path>) -> Result<netlab::Lab> {
    let mut b = netlab::Lab::builder()
        .mtu(s.mtu)
        .profile(s.profile)
        .congestion("cubic");
    b = match s.rate_bps {
        Some(rate) => {
            b = b
                .site("a", s.pairs)
                .site("b", s.pairs)
                .rate_bps(rate)
                .rtt(s.rtt())
                .loss(s.loss);
            match csv {
                Some(p) => b.record_csv(p),
                None => b,
            }
        }
        None => b.site("a", 1),
    };
    b.build().map_err(|e| anyhow!("netlab: {e}"))
}

/// The emulator's counters client (site a) to server (site b) between two snapshots, with the
/// hosts' device drops netlab reads at the same moments.
pub fn router_view(stats0: &netlab::Stats, stats1: &netlab::Stats) -> Option<RouterView> {
    let (d0, d1) = (stats0.direction("a")?, stats1.direction("a")?);
    let rev = |st: &netlab::Stats| {
        st.direction("b")
            .map(|d| d.drops.queue + d.drops.loss)
            .unwrap_or(0)
    };
    let other = |st: &netlab::Stats| st.directions.iter().map(|d| d.drops.other).sum::<u64>();
    Some(RouterView {
        delivered_bytes: d1.bytes - d0.bytes,
        delivered_packets: d1.packets - d0.packets,
        offered_bytes: d1.offered_bytes - d0.offered_bytes,
        offered_packets: d1.offered_packets - d0.offered_packets,
        drops_queue: d1.drops.queue - d0.drops.queue,
        drops_loss: d1.drops.loss - d0.drops.loss,
        max_queue_bytes: d1.max_queue_bytes,
        late_over_1ms: d1.late_over_1ms - d0.late_over_1ms,
        reverse_drops: rev(stats1) - rev(stats0),
        emulator_cpu_s: stats1.emulator_cpu_s - stats0.emulator_cpu_s,
        drops_other: other(stats1) - other(stats0),
        no_buffer: stats1.no_buffer - stats0.no_buffer,
        host_dev_rx_drops: stats1
            .host_rx_dropped
            .saturating_sub(stats0.host_rx_dropped),
        host_dev_tx_drops: stats1
            .host_tx_dropped
            .saturating_sub(stats0.host_tx_dropped),
        other_counters: other_counters(stats0, stats1),
    })
}

impl Measurement {
    pub fn not_run(case: &Case, reason: &str) -> Measurement {
        Measurement {
            id: case_id(case),
            scenario: case.scenario.id.into(),
            workload: case.workload.into(),
            tool: case.variant.tool.id().into(),
            variant: case.variant.label.clone(),
            status: "not run".into(),
            reason: reason.into(),
            pairs: case.scenario.pairs,
            ..Default::default()
        }
    }
}

pub fn case_id(c: &Case) -> String {
    let label: String = c
        .variant
        .label
        .chars()
        .map(|ch| if ch.is_ascii_alphanumeric() { ch } else { '_' })
        .collect::<String>()
        .split('_')
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("_");
    format!(
        "{}-{}-{}-{}",
        c.scenario.id,
        c.workload,
        c.variant.tool.id(),
        label
    )
}

pub struct RunSpec<'a> {
    pub ctx: &'a Ctx,
    pub case: &'a Case,
    /// The dataset each pair copies (None for iperf3).
    pub ds: Option<&'a Dataset>,
    pub full_bytes: u64,
    pub limit: Duration,
    pub work: PathBuf,
    pub cg_root: Option<PathBuf>,
    pub started_utc: String,
}

pub fn run(spec: &RunSpec) -> Measurement {
    let case = spec.case;
    let mut m = Measurement::not_run(case, "");
    m.started_utc = spec.started_utc.clone();
    m.full_bytes = spec.full_bytes;
    if let Some(ds) = spec.ds {
        m.data = ds.id.clone();
        m.data_bytes = ds.bytes;
        m.data_files = ds.file_count;
        m.time_boxed = ds.bytes < spec.full_bytes;
    }
    match run_inner(spec, &mut m) {
        Ok(()) => {}
        Err(e) => {
            m.status = "FAILED".into();
            if m.reason.is_empty() {
                m.reason = format!("{e:#}");
            }
        }
    }
    m
}

fn run_inner(spec: &RunSpec, m: &mut Measurement) -> Result<()> {
    let case = spec.case;
    let s = &case.scenario;
    let tool = case.variant.tool;
    let id = &m.id;
    let logs = spec.work.join("logs").join(id);
    let _ = fs::remove_dir_all(&logs);
    fs::create_dir_all(&logs)?;
    let csv = spec.work.join("csv").join(format!("{id}.csv"));
    fs::create_dir_all(csv.parent().unwrap_or(Path::new("/")))?;
    let _ = fs::remove_file(&csv);

    let lab = build_lab(s, Some(&csv))?;
    let loopback = s.rate_bps.is_none();
    let pairs: Vec<(&netlab::Host, &netlab::Host)> = (0..s.pairs)
        .map(|i| {
            if loopback {
                (lab.host("a", 0), lab.host("a", 0))
            } else {
                (lab.host("a", i), lab.host("b", i))
            }
        })
        .collect();
    let addr = |h: &netlab::Host| {
        if loopback {
            "127.0.0.1".to_string()
        } else {
            h.addr().to_string()
        }
    };

    let cg_root = spec
        .cg_root
        .as_ref()
        .ok_or_else(|| anyhow!("no cgroup v2 hierarchy: cannot measure CPU per side"))?;
    let cg_server = Cgroup::create(cg_root, &format!("{id}-server"))?;
    let cg_client = Cgroup::create(cg_root, &format!("{id}-client"))?;

    let dsts: Vec<PathBuf> = (0..s.pairs)
        .map(|i| spec.work.join("dst").join(format!("{id}-{i}")))
        .collect();
    for (i, (_, server)) in pairs.iter().enumerate() {
        tools::make_dst(&dsts[i])?;
        let spot = ServerSpot {
            host: server,
            addr: addr(server),
            dst: dsts[i].clone(),
            scratch: logs.join(format!("server{i}")),
        };
        tools::start_server(spec.ctx, tool, &spot, &cg_server)?;
    }

    let senders: Vec<&netlab::Host> = pairs.iter().map(|p| p.0).collect();
    let retrans0: Option<u64> = senders.iter().map(|h| proc::retrans_segs(h)).sum();
    let stats0 = lab.stats();
    let cpu_s0 = cg_server.cpu();
    let cpu_c0 = cg_client.cpu();
    let sampler = proc::Sampler::start(
        vec![
            cg_client.path().to_path_buf(),
            cg_server.path().to_path_buf(),
        ],
        Duration::from_millis(50),
    );
    let t0 = lab.elapsed();
    let first = Instant::now();
    let mut running = Vec::new();
    for (i, (client, server)) in pairs.iter().enumerate() {
        let cmd = tools::client_command(
            spec.ctx,
            &case.variant,
            client,
            &addr(server),
            spec.ds,
            &dsts[i],
        )?;
        if i == 0 {
            m.command = render_command(&cmd);
        }
        let r = proc::spawn(
            cmd,
            Some(&cg_client),
            &logs.join(format!("client{i}.out")),
            &logs.join(format!("client{i}.err")),
        )?;
        running.push(r);
    }
    let mut exits = Vec::new();
    let deadline = first + spec.limit;
    for r in running {
        let offset = r.start.duration_since(first);
        let left = deadline.saturating_duration_since(Instant::now());
        let e = r.wait(left.max(Duration::from_millis(1)));
        exits.push((offset + e.wall, e));
    }
    let t1 = lab.elapsed();
    let peaks = sampler.finish();
    let cpu_c = cg_client.cpu() - cpu_c0;
    let cpu_s = cg_server.cpu() - cpu_s0;
    let retrans1: Option<u64> = senders.iter().map(|h| proc::retrans_segs(h)).sum();
    let stats1 = lab.stats();
    cg_server.kill_all(Duration::from_secs(2));
    cg_client.kill_all(Duration::from_secs(1));
    drop(lab); // flushes the router CSV

    m.pairs = s.pairs;
    m.wall_s = exits
        .iter()
        .map(|(end, _)| end.as_secs_f64())
        .fold(0.0, f64::max);
    m.pair_wall_s = exits.iter().map(|(end, _)| end.as_secs_f64()).collect();
    m.exit_codes = exits.iter().map(|(_, e)| e.code).collect();
    m.cpu_client = cpu_c;
    m.cpu_server = cpu_s;
    m.mem_client = peaks.first().copied().unwrap_or_default();
    m.mem_server = peaks.get(1).copied().unwrap_or_default();
    m.client_ru_maxrss = exits.iter().map(|(_, e)| e.maxrss_bytes).max().unwrap_or(0);
    m.client_rusage_cpu_s = exits.iter().map(|(_, e)| e.rusage_cpu_s).sum();
    m.peak_rss_client = m
        .mem_client
        .sum_rss
        .max(m.mem_client.max_hwm)
        .max(m.client_ru_maxrss);
    m.peak_rss_server = m.mem_server.sum_rss.max(m.mem_server.max_hwm);
    m.retrans_segs = match (retrans0, retrans1) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a)),
        _ => None,
    };
    m.router = router_view(&stats0, &stats1);
    let err0 = fs::read_to_string(logs.join("client0.err")).unwrap_or_default();
    let lines: Vec<&str> = err0
        .lines()
        .filter(|l| !l.contains("--insecure: no TLS"))
        .collect();
    m.stderr_tail = lines[lines.len().saturating_sub(6)..].join("\n");

    // What the tool said about itself.
    let stdout0 = fs::read_to_string(logs.join("client0.out")).unwrap_or_default();
    let mut tool_bytes = None;
    match tool {
        Tool::Haul | Tool::HaulTls => {
            let mut retrans = 0;
            let mut reports = Vec::new();
            for i in 0..s.pairs {
                let out =
                    fs::read_to_string(logs.join(format!("client{i}.out"))).unwrap_or_default();
                if let Some(mut v) = out
                    .lines()
                    .rev()
                    .find_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                {
                    retrans += v["tcp_retransmits"].as_u64().unwrap_or(0);
                    if let Some(o) = v.as_object_mut() {
                        o.remove("file_list");
                    }
                    reports.push(v);
                }
            }
            m.tool_retrans = Some(retrans);
            m.tool_report = if reports.len() == 1 {
                reports.remove(0)
            } else {
                serde_json::Value::Array(reports)
            };
        }
        Tool::Iperf3 => {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&stdout0) {
                let end = &v["end"];
                m.tool_retrans = end["sum_sent"]["retransmits"].as_u64();
                let rx = &end["sum_received"];
                if let (Some(bytes), Some(secs)) = (rx["bytes"].as_u64(), rx["seconds"].as_f64()) {
                    tool_bytes = Some((bytes, secs));
                }
                m.tool_report = serde_json::json!({
                    "sum_sent": end["sum_sent"],
                    "sum_received": end["sum_received"],
                    "cpu_utilization_percent": end["cpu_utilization_percent"],
                    "sender_tcp_congestion": end["sender_tcp_congestion"],
                    "error": v["error"],
                });
            }
        }
        _ => {}
    }

    // Did it work, and is the copy right?
    let timed_out: Vec<usize> = exits
        .iter()
        .enumerate()
        .filter(|(_, (_, e))| e.timed_out)
        .map(|(i, _)| i)
        .collect();
    let bad_exit: Vec<String> = exits
        .iter()
        .enumerate()
        .filter(|(_, (_, e))| e.code != 0)
        .map(|(i, (_, e))| format!("pair {i} exit {}", e.code))
        .collect();
    let mut problems = Vec::new();
    if !timed_out.is_empty() {
        problems.push(format!(
            "killed at the {:.0} s time limit (pairs {timed_out:?})",
            spec.limit.as_secs_f64()
        ));
    } else if !bad_exit.is_empty() {
        problems.push(format!(
            "{}: {}",
            bad_exit.join(", "),
            m.stderr_tail.replace('\n', " | ")
        ));
    }
    if let Some(ds) = spec.ds {
        for (i, d) in dsts.iter().enumerate() {
            if let Err(e) = data::verify(ds, d) {
                problems.push(format!("pair {i}: copy differs from source: {e}"));
            }
        }
    } else if tool_bytes.is_none() && problems.is_empty() {
        problems.push("iperf3 printed no result".into());
    }
    for d in &dsts {
        let _ = fs::remove_dir_all(d);
    }

    // Rates.
    let link = s.link_mbps();
    let (bytes, secs) = match (tool_bytes, spec.ds) {
        (Some((b, secs)), _) => (b, secs),
        (None, Some(ds)) => (ds.bytes * s.pairs as u64, m.wall_s),
        (None, None) => (0, m.wall_s),
    };
    if tool == Tool::Iperf3 {
        m.data = format!(
            "memory, {}",
            case.variant.label.split(", ").last().unwrap_or("")
        );
        m.data_bytes = bytes;
    }
    m.goodput_mbps = if secs > 0.0 {
        bytes as f64 * 8.0 / secs / 1e6
    } else {
        0.0
    };
    m.pct_link = link.map(|l| 100.0 * m.goodput_mbps / l);
    let gib = bytes as f64 / data::GIB as f64;
    if gib > 0.0 {
        m.cpu_client_s_per_gib = Some(m.cpu_client.total / gib);
        m.cpu_server_s_per_gib = Some(m.cpu_server.total / gib);
    }

    // Router's view over the client's lifetime.
    if !loopback {
        if let Ok(text) = fs::read_to_string(&csv) {
            let (t0, t1) = (t0.as_millis() as u64, t1.as_millis() as u64);
            let mut ms = Vec::with_capacity((t1 - t0) as usize + 1);
            for l in text.lines().skip(1) {
                let mut f = l.split(',');
                let (Some(t), Some(a)) = (f.next(), f.next()) else {
                    continue;
                };
                let (Ok(t), Ok(a)) = (t.parse::<u64>(), a.parse::<u64>()) else {
                    continue;
                };
                if t >= t0 && t <= t1 {
                    ms.push(a);
                }
            }
            m.window_ms = ms.len() as u64;
            m.bins_1s = rebin(&ms, 1000);
            if matches!(tool, Tool::Haul | Tool::HaulTls) {
                m.bins_16ms = rebin(&ms, 16);
            }
        }
        let _ = fs::remove_file(&csv);
    }

    if problems.is_empty() {
        m.status = "ok".into();
        m.reason.clear();
        Ok(())
    } else {
        m.reason = problems.join("; ");
        Err(anyhow!("{}", m.reason))
    }
}

fn rebin(ms: &[u64], width: usize) -> Vec<u64> {
    ms.chunks(width).map(|c| c.iter().sum()).collect()
}

pub fn render_command(cmd: &std::process::Command) -> String {
    let mut parts = vec![cmd.get_program().to_string_lossy().into_owned()];
    for a in cmd.get_args() {
        let a = a.to_string_lossy();
        if a.is_empty() || a.contains([' ', '"', '\'']) {
            parts.push(format!("'{}'", a.replace('\'', "'\\''")));
        } else {
            parts.push(a.into_owned());
        }
    }
    parts.join(" ")
}
