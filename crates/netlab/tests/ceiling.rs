//! The emulator's own ceiling with MTU 9000 and no rate limit: packets/s and Gbit/s it
//! forwards while two TCP streams push as hard as they can, and the CPU it uses doing so.
//! The figure is for this machine (2 cores shared by iperf3 and the emulator).

mod common;

use std::time::{Duration, Instant};

use netlab::Lab;

#[test]
fn emulator_ceiling_mtu_9000() {
    netlab::require!();
    if !common::ensure_tool("iperf3", "iperf3") {
        return;
    }
    let _g = common::serial();
    let lab = Lab::builder()
        .site("a", 1)
        .site("b", 1)
        .unlimited_rate()
        .rtt(Duration::from_millis(2))
        .mtu(9000)
        .build()
        .expect("build lab");
    let s0 = lab.stats();
    let cpu0 = lab.emulator_cpu();
    let m0 = common::machine_cpu();
    let t0 = Instant::now();
    let r = common::iperf3(lab.host("a", 0), lab.host("b", 0), 5, &["-P", "2"]);
    let wall = t0.elapsed().as_secs_f64();
    let cpu = (lab.emulator_cpu() - cpu0).as_secs_f64();
    let m1 = common::machine_cpu();
    let s1 = lab.stats();
    let (a0, a1) = (
        s0.direction("a").expect("a->b"),
        s1.direction("a").expect("a->b"),
    );
    let (b0, b1) = (
        s0.direction("b").expect("b->a"),
        s1.direction("b").expect("b->a"),
    );
    let pkts = (a1.packets - a0.packets + b1.packets - b0.packets) as f64;
    let gbit = (a1.bytes - a0.bytes) as f64 * 8.0 / 1e9;
    let ticks = (m1.2 - m0.2).max(1) as f64;
    println!(
        "netlab ceiling (MTU 9000, unlimited rate, iperf3 -P 2, 5 s): iperf3 {:.2} Gbit/s; emulator forwarded {:.2} Gbit/s data and {:.0} packets/s (both directions) using {:.2} core ({:.3} core per Gbit/s); machine busy {:.0}% of 2 cores, irq+softirq {:.0}%",
        r.received_bps / 1e9,
        gbit / wall,
        pkts / wall,
        cpu / wall,
        (cpu / wall) / (gbit / wall),
        100.0 * (m1.0 - m0.0) as f64 / ticks,
        100.0 * (m1.1 - m0.1) as f64 / ticks
    );
    assert!(
        r.received_bps > 1e9,
        "the emulator must forward more than 1 Gbit/s with MTU 9000"
    );
}
