//! haul-netlabbench: what the emulator itself costs and can do on this machine, the figures
//! netlab's tests print but do not assert (they depend on the CPU): the emulator thread's CPU
//! while iperf3 fills a 1 Gbit/s link with MTU 9000 and with MTU 1500 (one cubic stream at
//! 20 ms; 16 at 200 ms, the path where a fresh machine used to lose a third of the rate), its
//! ceiling (no rate limit) at both MTUs, each MTU 1500 case also with offloads off (one system
//! call per packet, as before TSO/GRO). Queue drops (the emulated bottleneck) and drops of the
//! lab itself (the emulator could not keep up) are counted apart. Each case runs `--runs`
//! times; the median is reported beside every run. Writes bench/results/<date>-netlab.{md,json}.
//! Run it through `bench/netlab` (root: namespaces and TUN).

use anyhow::{Context, Result, bail};
use clap::Parser;
use netlab::{Lab, Profile};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

#[derive(Parser)]
struct Args {
    /// Runs of each case (the median is reported).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Where results/<date>-netlab.{md,json} go.
    #[arg(long)]
    out: PathBuf,
    /// The command line to record in the results.
    #[arg(long, default_value = "bench/netlab")]
    command_line: String,
}

/// One emulated path and the iperf3 load put through it.
struct Case {
    name: &'static str,
    rate_bps: Option<u64>,
    rtt_ms: u64,
    mtu: u32,
    streams: u32,
    secs: u32,
    /// TSO/GRO between hosts and emulator (netlab's default) or one packet per system call.
    offload: bool,
}

const GBIT: Option<u64> = Some(1_000_000_000);

const CASES: [Case; 8] = [
    Case {
        name: "1 Gbit/s, 20 ms, MTU 9000, 1 cubic stream",
        rate_bps: GBIT,
        rtt_ms: 20,
        mtu: 9000,
        streams: 1,
        secs: 8,
        offload: true,
    },
    Case {
        name: "1 Gbit/s, 20 ms, MTU 1500, 1 cubic stream",
        rate_bps: GBIT,
        rtt_ms: 20,
        mtu: 1500,
        streams: 1,
        secs: 8,
        offload: true,
    },
    Case {
        name: "1 Gbit/s, 20 ms, MTU 1500, 1 cubic stream, offloads off",
        rate_bps: GBIT,
        rtt_ms: 20,
        mtu: 1500,
        streams: 1,
        secs: 8,
        offload: false,
    },
    Case {
        name: "1 Gbit/s, 200 ms, MTU 1500, 16 cubic streams, 30 s",
        rate_bps: GBIT,
        rtt_ms: 200,
        mtu: 1500,
        streams: 16,
        secs: 30,
        offload: true,
    },
    Case {
        name: "1 Gbit/s, 200 ms, MTU 1500, 16 cubic streams, 30 s, offloads off",
        rate_bps: GBIT,
        rtt_ms: 200,
        mtu: 1500,
        streams: 16,
        secs: 30,
        offload: false,
    },
    Case {
        name: "ceiling: no rate limit, 2 ms, MTU 9000, iperf3 -P 2",
        rate_bps: None,
        rtt_ms: 2,
        mtu: 9000,
        streams: 2,
        secs: 5,
        offload: true,
    },
    Case {
        name: "ceiling: no rate limit, 2 ms, MTU 1500, iperf3 -P 2",
        rate_bps: None,
        rtt_ms: 2,
        mtu: 1500,
        streams: 2,
        secs: 5,
        offload: true,
    },
    Case {
        name: "ceiling: no rate limit, 2 ms, MTU 1500, iperf3 -P 2, offloads off",
        rate_bps: None,
        rtt_ms: 2,
        mtu: 1500,
        streams: 2,
        secs: 5,
        offload: false,
    },
];

fn measure(c: &Case) -> Result<Value> {
    let b = Lab::builder()
        .site("a", 1)
        .site("b", 1)
        .rtt(Duration::from_millis(c.rtt_ms))
        .mtu(c.mtu)
        .profile(Profile::Tuned)
        .offload(c.offload)
        .congestion("cubic");
    let b = match c.rate_bps {
        Some(r) => b.rate_bps(r),
        None => b.unlimited_rate(),
    };
    let lab = b.build().context("build lab")?;
    let (s0, cpu0, m0, t0) = (
        lab.stats(),
        lab.emulator_cpu(),
        netlab::probe::machine_cpu(),
        Instant::now(),
    );
    let streams = c.streams.to_string();
    let r = netlab::probe::iperf3(
        lab.host("a", 0),
        lab.host("b", 0),
        c.secs,
        &["-O", "1", "-P", &streams],
    )
    .map_err(anyhow::Error::msg)?;
    let wall = t0.elapsed().as_secs_f64();
    let cpu = (lab.emulator_cpu() - cpu0).as_secs_f64();
    let (s1, m1) = (lab.stats(), netlab::probe::machine_cpu());
    let fwd = |s: &netlab::Stats, d: &str| s.direction(d).map(|x| (x.bytes, x.packets));
    let (a0, a1) = (
        fwd(&s0, "a").context("a->b")?,
        fwd(&s1, "a").context("a->b")?,
    );
    let (b0, b1) = (
        fwd(&s0, "b").context("b->a")?,
        fwd(&s1, "b").context("b->a")?,
    );
    let gbit_per_s = (a1.0 - a0.0) as f64 * 8.0 / 1e9 / wall;
    let artefact = s1.artefact_drops() - s0.artefact_drops();
    let queue_drops = s1.direction("a").map_or(0, |d| d.drops.queue)
        - s0.direction("a").map_or(0, |d| d.drops.queue);
    let packets_per_s = ((a1.1 - a0.1) + (b1.1 - b0.1)) as f64 / wall;
    let ticks = (m1.2 - m0.2).max(1) as f64;
    Ok(json!({
        "iperf3_gbit_per_s": r.received_bps / 1e9,
        "iperf3_retransmits": r.retransmits,
        "queue_drops": queue_drops,
        "emulator_could_not_keep_up_drops": artefact,
        "forwarded_gbit_per_s": gbit_per_s,
        "packets_per_s": packets_per_s,
        "emulator_core": cpu / wall,
        "emulator_core_per_gbit_per_s": if gbit_per_s > 0.0 { cpu / wall / gbit_per_s } else { 0.0 },
        "machine_busy_share": (m1.0 - m0.0) as f64 / ticks,
        "irq_softirq_share": (m1.1 - m0.1) as f64 / ticks,
    }))
}

fn median(v: &[Value], key: &str) -> f64 {
    let mut x: Vec<f64> = v.iter().filter_map(|r| r[key].as_f64()).collect();
    x.sort_by(f64::total_cmp);
    x.get(x.len() / 2).copied().unwrap_or(f64::NAN)
}

fn sh(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    format!(
        "{cpu}, {} cores, kernel {}",
        sh("nproc", &[]),
        sh("uname", &["-r"])
    )
}

fn main() -> Result<()> {
    let args = Args::parse();
    if let Err(why) = Lab::available() {
        bail!("netlab cannot run here: {why}");
    }
    let date = sh("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]);
    let mut cases = Vec::new();
    for c in &CASES {
        let mut runs = Vec::new();
        for i in 0..args.runs.max(1) {
            let r = measure(c).with_context(|| c.name.to_string())?;
            eprintln!("netlabbench: {} run {}: {r}", c.name, i + 1);
            runs.push(r);
        }
        cases.push(json!({"case": c.name, "runs": runs}));
    }
    let doc = json!({
        "date": date,
        "command": args.command_line,
        "machine": machine(),
        "build": "release",
        "cases": cases,
    });
    let mut md = format!(
        "# netlab emulator cost, {date}\n\nGenerated by `{}` on {} (release build; the emulator thread's CPU clock, which includes the TUN reads and writes it does). Median of {} runs, each run listed.\n\n| case | iperf3 Gbit/s | forwarded Gbit/s | packets/s (both directions) | emulator core | core per Gbit/s | machine busy | queue drops | emulator could not keep up (drops) | runs (emulator core) |\n|---|---|---|---|---|---|---|---|---|---|\n",
        args.command_line,
        machine(),
        args.runs.max(1)
    );
    for c in &cases {
        let runs = c["runs"].as_array().cloned().unwrap_or_default();
        let each: Vec<String> = runs
            .iter()
            .map(|r| format!("{:.2}", r["emulator_core"].as_f64().unwrap_or(f64::NAN)))
            .collect();
        md += &format!(
            "| {} | {:.2} | {:.2} | {:.0} | {:.2} | {:.3} | {:.0}% | {:.0} | {:.0} | {} |\n",
            c["case"].as_str().unwrap_or("?"),
            median(&runs, "iperf3_gbit_per_s"),
            median(&runs, "forwarded_gbit_per_s"),
            median(&runs, "packets_per_s"),
            median(&runs, "emulator_core"),
            median(&runs, "emulator_core_per_gbit_per_s"),
            100.0 * median(&runs, "machine_busy_share"),
            median(&runs, "queue_drops"),
            median(&runs, "emulator_could_not_keep_up_drops"),
            each.join(", ")
        );
    }
    std::fs::create_dir_all(&args.out)?;
    let base = args
        .out
        .join(format!("{}-netlab", &date[..10.min(date.len())]));
    std::fs::write(
        base.with_extension("json"),
        serde_json::to_string_pretty(&doc)?,
    )?;
    std::fs::write(base.with_extension("md"), &md)?;
    print!("{md}");
    Ok(())
}
