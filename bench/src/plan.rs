//! What runs: scenarios (link conditions), workloads, tool variants, and the matrix of cases
//! for a full or `--quick` run, with the size each slow tool gets so that no run takes long.

use std::time::Duration;

use netlab::Profile;
use serde::Serialize;

use crate::data::{GIB, MIB};

/// Link conditions.
#[derive(Clone, Debug, Serialize)]
pub struct Scenario {
    pub id: &'static str,
    pub description: &'static str,
    /// None: loopback, no emulation (S4).
    pub rate_bps: Option<u64>,
    pub rtt_ms: u64,
    pub loss: f64,
    /// MTU of every host interface (9000 in haul-bench's scenarios).
    pub mtu: u32,
    #[serde(skip)]
    pub profile: Profile,
    pub profile_name: &'static str,
    /// Client/server pairs running at once through the one bottleneck.
    pub pairs: usize,
}

impl Scenario {
    pub fn rtt(&self) -> Duration {
        Duration::from_millis(self.rtt_ms)
    }
    /// Bandwidth-delay product in bytes (at least 4 MiB, for loopback).
    pub fn bdp(&self) -> u64 {
        match self.rate_bps {
            Some(r) => (r / 8 * self.rtt_ms / 1000).max(4 * MIB),
            None => 4 * MIB,
        }
    }
    pub fn link_mbps(&self) -> Option<f64> {
        self.rate_bps.map(|r| r as f64 / 1e6)
    }
}

pub fn scenarios() -> Vec<Scenario> {
    let s = |id, description, rate: Option<u64>, rtt_ms, loss, stock: bool, pairs| Scenario {
        id,
        description,
        rate_bps: rate,
        rtt_ms,
        loss,
        mtu: 9000,
        profile: if stock {
            Profile::Stock
        } else {
            Profile::Tuned
        },
        profile_name: if stock { "stock" } else { "tuned" },
        pairs,
    };
    let g = Some(1_000_000_000);
    vec![
        s(
            "S1",
            "1 Gbit/s, 200 ms RTT, no loss, tuned hosts",
            g,
            200,
            0.0,
            false,
            1,
        ),
        s(
            "S1s",
            "1 Gbit/s, 200 ms RTT, no loss, stock hosts",
            g,
            200,
            0.0,
            true,
            1,
        ),
        s(
            "S2",
            "1 Gbit/s, 100 ms RTT, 0.1% loss, tuned hosts",
            g,
            100,
            0.001,
            false,
            1,
        ),
        s(
            "S3",
            "1 Gbit/s, 2 ms RTT, no loss, tuned hosts",
            g,
            2,
            0.0,
            false,
            1,
        ),
        s(
            "S4",
            "loopback 127.0.0.1, no emulation, tmpfs to tmpfs (CPU-bound)",
            None,
            0,
            0.0,
            false,
            1,
        ),
        s(
            "S5",
            "4 host pairs sharing one 1 Gbit/s, 100 ms RTT link (aggregate)",
            g,
            100,
            0.0,
            false,
            4,
        ),
    ]
}

/// The reference tools and longhaul.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Tool {
    Haul,
    HaulTls,
    Iperf3,
    Globus,
    Xrdcp,
    Scp,
    Rsync,
    /// `haul-floor`: sendfile into a socket, recv + pwrite out of it, nothing else (S4 only).
    Floor,
}

impl Tool {
    pub fn id(self) -> &'static str {
        match self {
            Tool::Haul => "haul",
            Tool::HaulTls => "haul-tls",
            Tool::Iperf3 => "iperf3",
            Tool::Globus => "globus",
            Tool::Xrdcp => "xrdcp",
            Tool::Scp => "scp",
            Tool::Rsync => "rsync",
            Tool::Floor => "floor",
        }
    }
    pub fn display(self) -> &'static str {
        match self {
            Tool::Haul => "longhaul",
            Tool::HaulTls => "longhaul (TLS)",
            Tool::Iperf3 => "iperf3 (memory)",
            Tool::Globus => "globus-url-copy",
            Tool::Xrdcp => "xrdcp",
            Tool::Scp => "scp",
            Tool::Rsync => "rsync",
            Tool::Floor => "kernel floor",
        }
    }
    /// The program whose presence decides whether the tool can run.
    pub fn programs(self) -> &'static [&'static str] {
        match self {
            Tool::Haul | Tool::HaulTls => &[],
            Tool::Iperf3 => &["iperf3"],
            Tool::Globus => &["globus-url-copy", "globus-gridftp-server"],
            Tool::Xrdcp => &["xrdcp", "xrootd"],
            Tool::Scp => &["scp", "ssh", "sshd", "ssh-keygen"],
            Tool::Rsync => &["rsync", "ssh", "sshd", "ssh-keygen"],
            Tool::Floor => &[],
        }
    }
}

/// One way of running a tool (a grid point, a flag set).
#[derive(Clone, Debug, Serialize)]
pub struct Variant {
    pub tool: Tool,
    /// Short label shown in tables, e.g. "-p 8 -tcp-bs 6M".
    pub label: String,
    /// Extra client flags.
    pub flags: Vec<String>,
}

fn v(tool: Tool, label: &str, flags: &[&str]) -> Variant {
    Variant {
        tool,
        label: label.to_string(),
        flags: flags.iter().map(|s| s.to_string()).collect(),
    }
}

/// Workload ids. `W1` also carries the memory-to-memory iperf3 rows.
pub const WORKLOADS: [&str; 3] = ["W1", "W2", "W3"];

pub fn workload_description(w: &str, quick: bool) -> String {
    match (w, quick) {
        ("W1", false) => "one 4 GiB file".into(),
        ("W1", true) => "one 1 GiB file (quick)".into(),
        ("W2", false) => "climate-like dataset, ~2 GiB, log-normal sizes (median 15 MB)".into(),
        ("W2", true) => "climate-like dataset, ~512 MiB, log-normal sizes (quick)".into(),
        ("W3", _) => "2,000 files of 4-64 kB (~68 MB)".into(),
        ("W1x4", false) => "S5 only: one 1 GiB file per pair, 4 pairs (4 GiB in all)".into(),
        ("W1x4", true) => "S5 only: one 256 MiB file per pair, 4 pairs (1 GiB in all)".into(),
        _ => w.into(),
    }
}

fn mib(b: u64) -> String {
    if b.is_multiple_of(MIB) {
        format!("{}M", b / MIB)
    } else {
        b.to_string()
    }
}

/// One case: a scenario, a workload and a tool variant.
#[derive(Clone, Debug)]
pub struct Case {
    pub scenario: Scenario,
    pub workload: &'static str,
    pub variant: Variant,
}

/// The variants of each tool for a scenario and workload, full or quick.
pub fn variants(s: &Scenario, w: &str, quick: bool) -> Vec<Variant> {
    let bdp2 = 2 * s.bdp();
    // Per-stream buffer for -tcp-bs: 2 x BDP shared by the streams, rounded up to MiB.
    let share = |n: u64| (bdp2 / n).div_ceil(MIB) * MIB;
    let iperf_t = if quick || s.id == "S4" { "10" } else { "20" };
    let mut out = Vec::new();
    if s.pairs > 1 {
        // S5: longhaul and globus-url-copy, one pair per host pair at once.
        out.push(v(Tool::Haul, "defaults, 4 pairs", &[]));
        let bs = share(4);
        out.push(Variant {
            tool: Tool::Globus,
            label: format!("-p 4 -tcp-bs {}, 4 pairs", mib(bs)),
            flags: vec!["-p".into(), "4".into(), "-tcp-bs".into(), bs.to_string()],
        });
        return out;
    }
    out.push(v(Tool::Haul, "defaults", &[]));
    // What sendfile saves: the same copy with the payload read into a buffer and written.
    if (s.id == "S4" || s.id == "S1") && w == "W1" {
        out.push(v(Tool::Haul, "--no-zero-copy", &["--no-zero-copy"]));
        // What tracing costs: the same copy sampling TCP_INFO every 10 ms (issue 14: under 2%
        // CPU, no goodput).
        out.push(v(
            Tool::Haul,
            "--trace",
            &["--trace", "/tmp/haul-bench-trace.jsonl"],
        ));
    }
    if s.id == "S4" && w == "W1" {
        out.push(v(
            Tool::HaulTls,
            "TLS, --protect private",
            &["--protect", "private"],
        ));
    }
    if s.id == "S4" && w == "W1" {
        // What any tool that stores the file must spend here: the bound the S4 ratios are
        // read against (see bench/README.md).
        out.push(v(
            Tool::Floor,
            "sendfile -> recv + pwrite, no checksum",
            &[],
        ));
        out.push(v(
            Tool::Floor,
            "the same with CRC32C at both ends",
            &["--crc"],
        ));
    }
    if w == "W1" {
        out.push(v(
            Tool::Iperf3,
            &format!("-P 1, {iperf_t} s"),
            &["-P", "1", "-t", iperf_t],
        ));
        out.push(v(
            Tool::Iperf3,
            &format!("-P 8, {iperf_t} s"),
            &["-P", "8", "-t", iperf_t],
        ));
    }
    let globus_file = |p: u64| {
        let bs = share(p);
        Variant {
            tool: Tool::Globus,
            label: format!("-p {p} -tcp-bs {}", mib(bs)),
            flags: vec!["-p".into(), p.to_string(), "-tcp-bs".into(), bs.to_string()],
        }
    };
    let globus_tree = |cc: u64, p: u64| {
        let bs = share(cc * p);
        Variant {
            tool: Tool::Globus,
            label: format!("-r -cd -fast -cc {cc} -pp -p {p} -tcp-bs {}", mib(bs)),
            flags: vec![
                "-cc".into(),
                cc.to_string(),
                "-pp".into(),
                "-p".into(),
                p.to_string(),
                "-tcp-bs".into(),
                bs.to_string(),
            ],
        }
    };
    if w == "W1" {
        out.push(globus_file(1));
        out.push(globus_file(8));
        out.push(v(Tool::Xrdcp, "defaults", &[]));
        out.push(v(Tool::Xrdcp, "--streams 8", &["--streams", "8"]));
    } else {
        out.push(globus_tree(8, 1));
        out.push(globus_tree(4, 2));
        out.push(v(Tool::Xrdcp, "-r", &[]));
        out.push(v(Tool::Xrdcp, "-r --parallel 8", &["--parallel", "8"]));
    }
    out.push(v(Tool::Scp, if w == "W1" { "defaults" } else { "-r" }, &[]));
    out.push(v(Tool::Rsync, "-a", &[]));
    if !quick {
        return match (s.id, w) {
            // Stock hosts: the single-file picture is what matters; no ssh tools (they are
            // limited by ssh's own window on any long path, see S1).
            ("S1s", "W1") => out
                .into_iter()
                .filter(|v| !matches!(v.tool, Tool::Scp | Tool::Rsync))
                .collect(),
            ("S1s", _) => Vec::new(),
            ("S2", "W2") => out
                .into_iter()
                .filter(|v| !matches!(v.tool, Tool::Scp | Tool::Rsync))
                .collect(),
            ("S2", "W3") => Vec::new(),
            _ => out,
        };
    }
    // --quick: a few combinations that show each tool once and each target once.
    let keep = |v: &Variant| -> bool {
        let l = v.label.as_str();
        match (s.id, w) {
            ("S1", "W1") => match v.tool {
                Tool::Globus => !l.starts_with("-p 8"),
                Tool::Xrdcp => !l.contains("streams"),
                _ => true,
            },
            ("S1", "W2") => {
                matches!(v.tool, Tool::Haul)
                    || (v.tool == Tool::Globus && l.contains("-cc 8"))
                    || (v.tool == Tool::Xrdcp && l.contains("parallel"))
            }
            ("S1", "W3") => {
                matches!(v.tool, Tool::Haul | Tool::Rsync)
                    || (v.tool == Tool::Globus && l.contains("-cc 8"))
            }
            ("S1s", "W1") => {
                matches!(v.tool, Tool::Haul) || (v.tool == Tool::Iperf3 && l.starts_with("-P 1"))
            }
            ("S2", "W1") => {
                matches!(v.tool, Tool::Haul)
                    || (v.tool == Tool::Iperf3 && l.starts_with("-P 8"))
                    || (v.tool == Tool::Globus && l.starts_with("-p 8"))
            }
            ("S3", "W1") => {
                matches!(v.tool, Tool::Haul) || (v.tool == Tool::Iperf3 && l.starts_with("-P 1"))
            }
            ("S4", "W1") => true,
            ("S4", "W3") => matches!(v.tool, Tool::Haul),
            _ => false,
        }
    };
    out.into_iter().filter(keep).collect()
}

/// How many times each variant runs: S4 W1 is CPU-bound and a single run on this shared
/// machine can be off by a quarter (and the first run after the data set is made is slower), so
/// the tools its targets compare run in interleaved rounds and the summary takes each one's best
/// (full runs only: `--quick` is a smoke run).
fn rounds(s: &Scenario, w: &str, quick: bool) -> u32 {
    if s.id == "S4" && w == "W1" && !quick {
        3
    } else {
        1
    }
}

/// Whether a tool's variants run in every round (the ones the S4 targets compare).
fn repeated(t: Tool) -> bool {
    matches!(
        t,
        Tool::Haul | Tool::HaulTls | Tool::Floor | Tool::Globus | Tool::Iperf3
    )
}

/// The cases of a run, in the order they run: workload by workload (so only one workload's
/// data sits in memory at a time), scenario by scenario within it, S5 last.
pub fn cases(quick: bool, only: &Only) -> Vec<Case> {
    let all = scenarios();
    let mut out = Vec::new();
    for w in WORKLOADS {
        if !only.workload(w) {
            continue;
        }
        for s in all.iter().filter(|s| s.pairs == 1) {
            if !only.scenario(s.id) {
                continue;
            }
            let vs: Vec<Variant> = variants(s, w, quick)
                .into_iter()
                .filter(|v| only.tool(v.tool))
                .collect();
            for round in 1..=rounds(s, w, quick) {
                for variant in vs.iter().filter(|v| round == 1 || repeated(v.tool)) {
                    let mut variant = variant.clone();
                    if round > 1 {
                        variant.label = format!("{} (round {round})", variant.label);
                    }
                    out.push(Case {
                        scenario: s.clone(),
                        workload: w,
                        variant,
                    });
                }
            }
        }
    }
    for s in all.iter().filter(|s| s.pairs > 1) {
        if only.scenario(s.id) && only.workload("W1x4") {
            for variant in variants(s, "W1x4", quick) {
                if only.tool(variant.tool) {
                    out.push(Case {
                        scenario: s.clone(),
                        workload: "W1x4",
                        variant,
                    });
                }
            }
        }
    }
    out
}

/// `--only` filter: scenario ids, workload ids and tool ids; an empty category means all.
#[derive(Clone, Debug, Default)]
pub struct Only {
    pub scenarios: Vec<String>,
    pub workloads: Vec<String>,
    pub tools: Vec<String>,
}

impl Only {
    pub fn parse(list: &str) -> Result<Only, String> {
        let mut o = Only::default();
        let scen: Vec<&str> = scenarios().iter().map(|s| s.id).collect();
        let tools = [
            "haul", "haul-tls", "iperf3", "globus", "xrdcp", "scp", "rsync", "floor",
        ];
        for t in list.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            if let Some(s) = scen.iter().find(|s| s.eq_ignore_ascii_case(t)) {
                o.scenarios.push(s.to_string());
            } else if WORKLOADS.iter().any(|w| w.eq_ignore_ascii_case(t)) {
                o.workloads.push(t.to_uppercase());
            } else if let Some(x) = tools.iter().find(|x| x.eq_ignore_ascii_case(t)) {
                o.tools.push(x.to_string());
            } else {
                return Err(format!(
                    "--only: unknown {t:?}; use scenario ids ({}), workloads (W1, W2, W3) or tools ({})",
                    scen.join(", "),
                    tools.join(", ")
                ));
            }
        }
        Ok(o)
    }
    pub fn scenario(&self, id: &str) -> bool {
        self.scenarios.is_empty() || self.scenarios.iter().any(|s| s == id)
    }
    /// S5 has its own workload (W1x4); it runs unless workloads were named without S5 being
    /// named.
    pub fn workload(&self, w: &str) -> bool {
        if w == "W1x4" {
            return self.workloads.is_empty() || self.scenarios.iter().any(|s| s == "S5");
        }
        self.workloads.is_empty() || self.workloads.iter().any(|x| x == w)
    }
    pub fn tool(&self, t: Tool) -> bool {
        self.tools.is_empty()
            || self
                .tools
                .iter()
                .any(|x| x == t.id() || (x == "haul" && t == Tool::HaulTls))
    }
    pub fn is_empty(&self) -> bool {
        self.scenarios.is_empty() && self.workloads.is_empty() && self.tools.is_empty()
    }
}

/// Expected fraction of the link a variant reaches (from shared/reference/peers.md where it
/// was measured, otherwise a cautious guess), used only to size time-boxed runs.
pub fn expected_fraction(s: &Scenario, w: &str, v: &Variant) -> f64 {
    let l = v.label.as_str();
    let many = l.contains("-cc") || l.contains("parallel");
    match (s.id, v.tool) {
        (_, Tool::Haul | Tool::HaulTls | Tool::Iperf3 | Tool::Floor) => 0.9,
        ("S1", Tool::Globus) => match w {
            "W1" => 0.85,
            _ if l.contains("-cc 8") => 0.45,
            _ => 0.3,
        },
        ("S1", Tool::Xrdcp) => match w {
            "W1" => 0.75,
            _ if many => 0.7,
            _ => 0.25,
        },
        ("S1" | "S1s", Tool::Scp | Tool::Rsync) => 0.07,
        // Stock hosts: explicit -tcp-bs is capped by the stock net.core limits (~200 KiB).
        ("S1s", Tool::Globus) => {
            if l.starts_with("-p 8") {
                0.12
            } else {
                0.015
            }
        }
        ("S1s", Tool::Xrdcp) => 0.15,
        ("S2", Tool::Globus) => match w {
            "W1" if l.starts_with("-p 1") => 0.03,
            "W1" => 0.25,
            _ if l.contains("-cc 8") => 0.2,
            _ => 0.1,
        },
        ("S2", Tool::Xrdcp | Tool::Scp | Tool::Rsync) => 0.03,
        ("S5", Tool::Globus) => 0.5,
        _ => 0.8,
    }
}

/// Files per second expected for the small-file workload (peers.md, 200 ms).
pub fn expected_files_per_s(s: &Scenario, v: &Variant) -> f64 {
    let l = v.label.as_str();
    let scale = 200.0 / s.rtt_ms.max(1) as f64;
    let base = match v.tool {
        Tool::Haul | Tool::HaulTls | Tool::Iperf3 | Tool::Floor => return f64::INFINITY,
        Tool::Globus => 18.0,
        Tool::Xrdcp if l.contains("parallel") => 13.0,
        Tool::Xrdcp => 1.6,
        Tool::Scp => 1.2,
        Tool::Rsync => 170.0,
    };
    base * scale
}

/// Full-run W1 size and the quick one.
pub fn w1_bytes(quick: bool) -> u64 {
    if quick { GIB } else { 4 * GIB }
}
pub fn w2_bytes(quick: bool) -> u64 {
    if quick { 512 * MIB } else { 2 * GIB }
}
pub fn s5_bytes(quick: bool) -> u64 {
    if quick { 256 * MIB } else { GIB }
}
