//! The results: a JSON file with every raw measurement and a Markdown report (header with
//! versions and the exact command, the summary against targets, the full table, what did not
//! run and why, the plots). Both are rewritten after every run, so an interrupted run still
//! leaves its data.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::SystemTime;

use anyhow::Result;
use serde::Serialize;

use crate::data::{GIB, MIB};
use crate::runner::Measurement;

/// The results header.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Header {
    pub title: String,
    pub date: String,
    pub started_utc: String,
    pub finished_utc: String,
    pub command: String,
    pub quick: bool,
    pub only: String,
    pub haul_version: String,
    pub git_describe: String,
    pub tools: Vec<(String, String)>,
    pub kernel: String,
    pub cpu: String,
    pub cores: usize,
    pub memory: String,
    pub install: String,
    pub scenarios: Vec<crate::plan::Scenario>,
    pub workloads: Vec<(String, String)>,
    pub notes: Vec<String>,
}

#[derive(Serialize)]
struct JsonOut<'a> {
    header: &'a Header,
    targets: Vec<Target>,
    runs: &'a [Measurement],
}

pub fn write_json(path: &Path, h: &Header, runs: &[Measurement]) -> Result<()> {
    let out = JsonOut {
        header: h,
        targets: targets(runs, h.quick),
        runs,
    };
    let tmp = path.with_extension("json.tmp");
    fs::write(&tmp, serde_json::to_string_pretty(&out)?)?;
    fs::rename(tmp, path)?;
    Ok(())
}

/// The machine a run measured on, for results headers.
pub struct Machine {
    pub cpu: String,
    pub cores: usize,
    /// "N GiB total; M GiB available at start".
    pub memory: String,
    pub kernel: String,
}

impl Machine {
    pub fn now() -> Machine {
        let cpu = fs::read_to_string("/proc/cpuinfo")
            .unwrap_or_default()
            .lines()
            .find_map(|l| {
                l.strip_prefix("model name")
                    .map(|r| r.trim_start_matches([' ', '\t', ':']).to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        let mem = fs::read_to_string("/proc/meminfo")
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:").map(|r| r.trim().to_string()))
            .unwrap_or_default();
        Machine {
            cpu,
            cores: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(0),
            memory: format!(
                "{:.1} GiB total; {:.1} GiB available at start",
                mem.trim_end_matches(" kB")
                    .trim()
                    .parse::<f64>()
                    .unwrap_or(0.0)
                    / 1048576.0,
                crate::proc::mem_available() as f64 / GIB as f64
            ),
            kernel: fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_string(),
        }
    }
}

/// `git describe --always --dirty --tags` of the tree at `repo`, or "unknown".
pub fn git_describe(repo: &Path) -> String {
    Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(["describe", "--always", "--dirty", "--tags"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// "<version>, binary <path> (file dated <date> UTC)".
pub fn binary_version(bin: &Path, version: &str) -> String {
    format!(
        "{version}, binary {} (file dated {} UTC)",
        bin.display(),
        fs::metadata(bin)
            .and_then(|m| m.modified())
            .map(|t| utc(t).1)
            .unwrap_or_else(|_| "?".into())
    )
}

/// One target from the data-plane issue and whether this run met it.
#[derive(Clone, Debug, Serialize)]
pub struct Target {
    pub what: String,
    pub target: String,
    pub measured: String,
    /// None: not measured in this run.
    pub met: Option<bool>,
}

fn find<'a>(runs: &'a [Measurement], s: &str, w: &str, tool: &str) -> Vec<&'a Measurement> {
    runs.iter()
        .filter(|m| m.scenario == s && m.workload == w && m.tool == tool && m.status == "ok")
        .collect()
}

/// longhaul's runs with no flags: the targets are about the defaults.
fn haul_defaults<'a>(runs: &'a [Measurement], s: &str, w: &str) -> Vec<&'a Measurement> {
    find(runs, s, w, "haul")
        .into_iter()
        .filter(|m| m.variant.starts_with("defaults"))
        .collect()
}

fn best<'a>(v: &[&'a Measurement]) -> Option<&'a Measurement> {
    v.iter()
        .copied()
        .max_by(|a, b| a.goodput_mbps.total_cmp(&b.goodput_mbps))
}

fn both<'a>(
    a: Option<&'a Measurement>,
    b: Option<&'a Measurement>,
) -> Option<(&'a Measurement, &'a Measurement)> {
    a.zip(b)
}

pub fn targets(runs: &[Measurement], quick: bool) -> Vec<Target> {
    let q = if quick { " (quick sizes)" } else { "" };
    let mut t = Vec::new();
    let mut pct = |s: &str, w: &str, goal: f64, what: &str| {
        let m = best(&haul_defaults(runs, s, w));
        t.push(Target {
            what: format!("{s} {w} longhaul: {what}{q}"),
            target: format!(">= {goal:.0}% of link"),
            measured: m.map_or("not measured".into(), |m| {
                format!(
                    "{:.1}% ({:.0} Mbit/s)",
                    m.pct_link.unwrap_or(0.0),
                    m.goodput_mbps
                )
            }),
            met: m.map(|m| m.pct_link.unwrap_or(0.0) >= goal),
        });
    };
    pct("S1", "W1", 95.0, "one file, 200 ms, tuned");
    pct("S1s", "W1", 90.0, "one file, 200 ms, stock hosts");
    pct("S2", "W1", 90.0, "one file, 100 ms, 0.1% loss");
    pct("S1", "W2", 93.0, "climate dataset, 200 ms");
    let m = best(&haul_defaults(runs, "S1", "W3"));
    t.push(Target {
        what: format!("S1 W3 longhaul: 2,000 small files, 200 ms{q}"),
        target: "under 3 s wall".into(),
        measured: m.map_or("not measured".into(), |m| format!("{:.2} s", m.wall_s)),
        met: m.map(|m| m.wall_s < 3.0),
    });
    let haul4 = best(&haul_defaults(runs, "S4", "W1"));
    let globus4 = best(&find(runs, "S4", "W1", "globus"));
    let iperf1: Vec<&Measurement> = find(runs, "S4", "W1", "iperf3")
        .into_iter()
        .filter(|m| m.variant.starts_with("-P 1"))
        .collect();
    let iperf4 = best(&iperf1);
    let xrd4 = best(&find(runs, "S4", "W1", "xrdcp"));
    // The kernel floor (haul-floor: sendfile, recv + pwrite, nothing else; and the same with
    // CRC32C at both ends) is no target; it is shown beside the S4 ratios: what the least work
    // reaches here, and the most any tool doing that work could reach with every core busy.
    let (floors_crc, floors_plain): (Vec<&Measurement>, Vec<&Measurement>) =
        find(runs, "S4", "W1", "floor")
            .into_iter()
            .partition(|m| m.variant.contains("CRC"));
    let (floor_plain, floor_crc) = (best(&floors_plain), best(&floors_crc));
    let floor_vs =
        |peer: Option<&Measurement>| -> String { floor_text(floor_plain, floor_crc, peer) };
    t.push(Target {
        what: format!("S4 W1 longhaul vs best globus-url-copy (loopback){q}"),
        target: ">= 1.5x".into(),
        measured: both(haul4, globus4).map_or("not measured".into(), |(h, g)| {
            format!(
                "{:.2}x ({:.0} vs {:.0} Mbit/s){}",
                h.goodput_mbps / g.goodput_mbps.max(1e-9),
                h.goodput_mbps,
                g.goodput_mbps,
                floor_vs(Some(g))
            )
        }),
        met: both(haul4, globus4).map(|(h, g)| h.goodput_mbps >= 1.5 * g.goodput_mbps),
    });
    t.push(Target {
        what: format!("S4 W1 longhaul vs iperf3 -P 1 (loopback){q}"),
        target: "within 25% (>= 0.75x)".into(),
        measured: both(haul4, iperf4).map_or("not measured".into(), |(h, i)| {
            format!(
                "{:.2}x ({:.0} vs {:.0} Mbit/s){}",
                h.goodput_mbps / i.goodput_mbps.max(1e-9),
                h.goodput_mbps,
                i.goodput_mbps,
                floor_vs(Some(i))
            )
        }),
        met: both(haul4, iperf4).map(|(h, i)| h.goodput_mbps >= 0.75 * i.goodput_mbps),
    });
    for side in ["client", "server"] {
        let per = |m: &Measurement| {
            if side == "client" {
                m.cpu_client_s_per_gib
            } else {
                m.cpu_server_s_per_gib
            }
        };
        let h = haul4.and_then(per);
        let peers: Vec<(&str, Option<f64>)> = vec![
            ("globus-url-copy", globus4.and_then(per)),
            ("iperf3 -P 1", iperf4.and_then(per)),
        ];
        let xr = xrd4.and_then(per);
        let measured = match h {
            None => "not measured".to_string(),
            Some(h) => {
                let mut s = format!("{h:.2}");
                for (n, p) in &peers {
                    if let Some(p) = p {
                        let _ = write!(s, "; {n} {p:.2}");
                    }
                }
                if let Some(x) = xr {
                    let _ = write!(s, "; (xrdcp {x:.2})");
                }
                if let Some(f) = floor_plain.and_then(per) {
                    let _ = write!(s, "; (kernel floor {f:.2}");
                    if let Some(fc) = floor_crc.and_then(per) {
                        let _ = write!(s, ", with CRC32C {fc:.2}");
                    }
                    s.push(')');
                }
                s
            }
        };
        let met = h.and_then(|h| {
            let ps: Vec<f64> = peers.iter().filter_map(|p| p.1).collect();
            (ps.len() == peers.len()).then(|| ps.iter().all(|p| h < *p))
        });
        t.push(Target {
            what: format!("S4 W1 longhaul CPU s/GiB, {side} side{q}"),
            target: "below globus-url-copy and iperf3 -P 1".into(),
            measured,
            met,
        });
    }
    let hauls: Vec<&Measurement> = runs
        .iter()
        .filter(|m| m.tool.starts_with("haul") && m.status == "ok")
        .collect();
    let worst_c = hauls.iter().max_by_key(|m| m.peak_rss_client);
    let worst_s = hauls.iter().max_by_key(|m| m.peak_rss_server);
    t.push(Target {
        what: "longhaul peak RSS per side, every run".into(),
        target: "< 256 MiB".into(),
        measured: match (worst_c, worst_s) {
            (Some(c), Some(s)) => format!(
                "client {:.0} MiB ({} {}), server {:.0} MiB ({} {})",
                c.peak_rss_client as f64 / MIB as f64,
                c.scenario,
                c.workload,
                s.peak_rss_server as f64 / MIB as f64,
                s.scenario,
                s.workload
            ),
            _ => "not measured".into(),
        },
        met: match (worst_c, worst_s) {
            (Some(c), Some(s)) => {
                Some(c.peak_rss_client < 256 * MIB && s.peak_rss_server < 256 * MIB)
            }
            _ => None,
        },
    });
    t
}

/// The kernel floor beside a peer's rate: each floor row's rate as a multiple of the peer's,
/// and the CPU bound of the checksumming floor (cores / its CPU seconds per GiB, both sides).
fn floor_text(
    plain: Option<&Measurement>,
    crc: Option<&Measurement>,
    peer: Option<&Measurement>,
) -> String {
    let Some(p) = peer else { return String::new() };
    let x = |m: &Measurement| m.goodput_mbps / p.goodput_mbps.max(1e-9);
    let mut s = String::new();
    if let Some(f) = plain {
        let _ = write!(
            s,
            "; kernel floor {:.0} Mbit/s = {:.2}x",
            f.goodput_mbps,
            x(f)
        );
    }
    if let Some(f) = crc {
        let _ = write!(
            s,
            "; with CRC32C {:.0} Mbit/s = {:.2}x",
            f.goodput_mbps,
            x(f)
        );
        if let (Some(c), Some(sv)) = (f.cpu_client_s_per_gib, f.cpu_server_s_per_gib) {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
            let bound = cores / (c + sv).max(1e-9) * 8.0 * GIB as f64 / 1e6;
            let _ = write!(
                s,
                ", whose {:.2} CPU s/GiB allow at most {bound:.0} Mbit/s on {cores} cores = {:.2}x",
                c + sv,
                bound / p.goodput_mbps.max(1e-9)
            );
        }
    }
    s
}

fn f1(x: f64) -> String {
    format!("{x:.1}")
}

fn mib(b: u64) -> String {
    format!("{:.0}", b as f64 / MIB as f64)
}

/// The header as a two-column Markdown table (date, command, versions, machine), then a blank
/// line.
pub fn header_table(o: &mut String, h: &Header) {
    let _ = writeln!(o, "| | |\n|---|---|");
    let _ = writeln!(
        o,
        "| date | {} (started {} UTC, finished {}) |",
        h.date,
        h.started_utc,
        if h.finished_utc.is_empty() {
            "— (partial: still running or interrupted)".to_string()
        } else {
            format!("{} UTC", h.finished_utc)
        }
    );
    let _ = writeln!(o, "| command | `{}` |", h.command);
    let _ = writeln!(o, "| haul | {} |", h.haul_version);
    let _ = writeln!(
        o,
        "| git describe (tree at run time) | {} |",
        h.git_describe
    );
    for (k, v) in &h.tools {
        let _ = writeln!(o, "| {k} | {v} |");
    }
    let _ = writeln!(o, "| kernel | {} |", h.kernel);
    let _ = writeln!(o, "| CPU | {} ({} cores) |", h.cpu, h.cores);
    let _ = writeln!(o, "| memory | {} |", h.memory);
    let _ = writeln!(o, "| tool install | {} |", h.install);
    o.push('\n');
}

/// The Markdown report; `plots` is the path prefix under which the PNGs are linked.
pub fn markdown(
    h: &Header,
    runs: &[Measurement],
    plots: &[(String, String)],
    plot_prefix: &str,
) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "# {}\n", h.title);
    let _ = writeln!(
        o,
        "Generated by `bench/run`; numbers are as measured, never edited by hand. Method: [bench/README.md]({}README.md).\n",
        if plot_prefix.starts_with("results/") {
            ""
        } else {
            "../"
        }
    );
    header_table(&mut o, h);
    let _ = writeln!(
        o,
        "Scenarios (MTU 9000, drop-tail queue of one BDP, host congestion control cubic; data on /dev/shm):\n"
    );
    for s in &h.scenarios {
        let _ = writeln!(o, "- **{}**: {}", s.id, s.description);
    }
    let _ = writeln!(o, "\nWorkloads (fixed seeds):\n");
    for (w, d) in &h.workloads {
        let _ = writeln!(o, "- **{w}**: {d}");
    }
    for n in &h.notes {
        let _ = writeln!(o, "\nNote: {n}");
    }

    let _ = writeln!(o, "\n## Summary against the data-plane targets\n");
    let _ = writeln!(o, "| target | goal | measured | met? |\n|---|---|---|---|");
    for t in targets(runs, h.quick) {
        let met = match t.met {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "not measured",
        };
        let _ = writeln!(o, "| {} | {} | {} | {met} |", t.what, t.target, t.measured);
    }

    let _ = writeln!(o, "\n## All runs\n");
    let _ = writeln!(
        o,
        "Goodput = payload bits / wall time of the client command (iperf3: its receiver-side rate). \
         % link against 1 Gbit/s. CPU = user+system seconds of all processes of that side (cgroup v2 `cpu.stat`). \
         RSS = peak resident memory of that side. Retrans = TCP RetransSegs in the sender's namespace; \
         drops = the emulator's queue/random-loss drops, client to server. \"time-boxed\" = the tool got a smaller \
         part of the workload so the run stays short; its rate is what it reached on that part.\n"
    );
    let _ = writeln!(
        o,
        "| scenario | workload | tool | variant | data | wall s | goodput Mbit/s | % link | CPU s client / server | CPU s/GiB client / server | peak RSS MiB client / server | retrans | drops queue / loss | result |"
    );
    let _ = writeln!(
        o,
        "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    );
    for m in runs {
        if m.status == "not run" {
            continue;
        }
        let data = if m.tool == "iperf3" {
            m.data.clone()
        } else {
            let mut d = if m.pairs > 1 {
                format!(
                    "{} ({} x {})",
                    m.data,
                    m.pairs,
                    crate::data::human(m.data_bytes)
                )
            } else {
                format!("{} ({})", m.data, crate::data::human(m.data_bytes))
            };
            if m.time_boxed {
                d.push_str(&format!(
                    ", time-boxed, of {}",
                    crate::data::human(m.full_bytes)
                ));
            }
            d
        };
        let result = if m.status == "ok" {
            if m.tool == "iperf3" {
                "ok (memory)".to_string()
            } else {
                "ok, identical".to_string()
            }
        } else {
            format!("**{}**: {}", m.status, short(&m.reason, 160))
        };
        let per = |x: Option<f64>| x.map_or("–".into(), |v| format!("{v:.2}"));
        let retr = match (m.retrans_segs, m.tool_retrans) {
            (Some(a), Some(b)) if m.tool.starts_with("haul") => format!("{a} (haul: {b})"),
            (Some(a), _) => a.to_string(),
            _ => "–".into(),
        };
        let drops = m.router.as_ref().map_or("–".into(), |r| {
            format!("{} / {}", r.drops_queue, r.drops_loss)
        });
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.2} / {:.2} | {} / {} | {} / {} | {} | {} | {} |",
            m.scenario,
            m.workload,
            tool_name(&m.tool),
            m.variant,
            data,
            f1(m.wall_s),
            f1(m.goodput_mbps),
            m.pct_link.map_or("–".into(), |p| format!("{p:.1}%")),
            m.cpu_client.total,
            m.cpu_server.total,
            per(m.cpu_client_s_per_gib),
            per(m.cpu_server_s_per_gib),
            mib(m.peak_rss_client),
            mib(m.peak_rss_server),
            retr,
            drops,
            result
        );
    }
    let not_run: Vec<&Measurement> = runs.iter().filter(|m| m.status == "not run").collect();
    if !not_run.is_empty() {
        let _ = writeln!(o, "\n## Not run\n");
        let _ = writeln!(
            o,
            "| scenario | workload | tool | variant | reason |\n|---|---|---|---|---|"
        );
        for m in not_run {
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} |",
                m.scenario,
                m.workload,
                tool_name(&m.tool),
                m.variant,
                m.reason
            );
        }
    }
    let haul: Vec<&Measurement> = runs
        .iter()
        .filter(|m| m.tool.starts_with("haul") && m.status == "ok")
        .collect();
    if !haul.is_empty() {
        let _ = writeln!(o, "\n## longhaul's own report\n");
        let _ = writeln!(
            o,
            "| scenario | workload | variant | streams | congestion | haul's rate Mbit/s | blocks resent | plan |\n|---|---|---|---:|---|---:|---:|---|"
        );
        for m in haul {
            let reps: Vec<&serde_json::Value> = match &m.tool_report {
                serde_json::Value::Array(a) => a.iter().collect(),
                v => vec![v],
            };
            for r in reps {
                let _ = writeln!(
                    o,
                    "| {} | {} | {} | {} | {} | {:.1} | {} | {} |",
                    m.scenario,
                    m.workload,
                    m.variant,
                    r["streams"],
                    r["congestion"].as_str().unwrap_or(""),
                    r["mbit_per_s"].as_f64().unwrap_or(0.0),
                    r["blocks_resent"],
                    short(r["plan"].as_str().unwrap_or(""), 200)
                );
            }
        }
    }
    if !plots.is_empty() {
        let _ = writeln!(o, "\n## Plots\n");
        let _ = writeln!(
            o,
            "Bytes leaving the emulated bottleneck towards the server (the router's view), from the client's start: 16 ms bins (top) and 1 s bins (bottom), as in seed 000 Figures 2-4; and, per scenario and workload, every tool at 1 s.\n"
        );
        for (caption, file) in plots {
            let _ = writeln!(o, "### {caption}\n\n![{caption}]({plot_prefix}{file})\n");
        }
    }
    o
}

fn tool_name(id: &str) -> &str {
    match id {
        "haul" => "longhaul",
        "haul-tls" => "longhaul (TLS)",
        "globus" => "globus-url-copy",
        other => other,
    }
}

fn short(s: &str, n: usize) -> String {
    let s = s.replace('|', "/").replace('\n', " ");
    if s.chars().count() <= n {
        s
    } else {
        format!("{}…", s.chars().take(n).collect::<String>())
    }
}

/// ("YYYY-MM-DD", "YYYY-MM-DD HH:MM:SS") in UTC.
pub fn utc(t: SystemTime) -> (String, String) {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    let date = format!("{y:04}-{m:02}-{d:02}");
    let full = format!(
        "{date} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    );
    (date, full)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn utc_dates() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_763_812_800); // 2025-11-22 12:00
        assert_eq!(utc(t).1, "2025-11-22 12:00:00");
    }
}
