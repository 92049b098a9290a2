//! One iperf3 stream with an ample window gets through a 1 Gbit/s bottleneck (at least half
//! the rate: a sanity floor, not a performance figure), and hosts of one site share a single
//! bottleneck. The emulator's CPU cost and ceiling are printed here for information and
//! measured for the record by `bench/netlab` (NETLAB-RESULTS.md): how much CPU a rate costs
//! depends on the machine, so no test holds it to a bound. The floors hold only where the
//! emulator kept time: on a machine that stalls, the tests say they were inconclusive
//! (`netlab::probe::timing_held`) after checking the ceilings.

mod common;

use std::time::{Duration, Instant};

use netlab::{Lab, Profile};

#[test]
fn one_stream_gets_through_a_1gbit_bottleneck() {
    netlab::require!();
    if !common::ensure_tool("iperf3", "iperf3") {
        return;
    }
    let _g = common::serial();
    let rate = 1_000_000_000u64;
    let lab = Lab::builder()
        .site("a", 1)
        .site("b", 1)
        .rate_bps(rate)
        .rtt(Duration::from_millis(20))
        .mtu(9000)
        .profile(Profile::Tuned)
        .congestion("cubic")
        .build()
        .expect("build lab");
    let cpu0 = lab.emulator_cpu();
    let bytes0 = lab.stats().direction("a").expect("a->b").bytes;
    let m0 = common::machine_cpu();
    let t0 = Instant::now();
    // 2 s of slow start omitted, then 8 s measured.
    let r = common::iperf3(lab.host("a", 0), lab.host("b", 0), 8, &["-O", "2"]);
    let wall = t0.elapsed().as_secs_f64();
    let cpu = (lab.emulator_cpu() - cpu0).as_secs_f64();
    let m1 = common::machine_cpu();
    let st = lab.stats();
    let dir = st.direction("a").expect("a->b");
    let gbit = (dir.bytes - bytes0) as f64 * 8.0 / 1e9;
    let share = r.received_bps / rate as f64;
    let ticks = (m1.2 - m0.2).max(1) as f64;
    println!(
        "netlab iperf3: 1 stream, 1 Gbit/s, 20 ms, MTU 9000: {:.1} Mbit/s = {:.1}% of the link, {} retransmits",
        r.received_bps / 1e6,
        share * 100.0,
        r.retransmits
    );
    println!(
        "netlab cpu: emulator thread {cpu:.2} s over {wall:.1} s = {:.2} core while forwarding {gbit:.2} Gbit ({:.0} Mbit/s avg); {:.3} core-seconds per Gbit; per Gbit/s sustained {:.2} core",
        cpu / wall,
        gbit / wall * 1e3,
        cpu / gbit,
        cpu / wall / (gbit / wall)
    );
    println!(
        "netlab cpu: whole machine (2 cores) busy {:.0}%, of which irq+softirq {:.0}% (not charged to any thread)",
        100.0 * (m1.0 - m0.0) as f64 / ticks,
        100.0 * (m1.1 - m0.1) as f64 / ticks
    );
    println!("{st}");
    assert!(
        share <= 1.02,
        "one stream reached {:.1}% of the link: the emulator lets more through than its rate",
        share * 100.0
    );
    if !netlab::probe::timing_held(&st) {
        return;
    }
    assert!(
        share >= 0.5,
        "one stream reached {:.1}% of the link: the emulator forwards less than half its rate",
        share * 100.0
    );
}

#[test]
fn hosts_of_a_site_share_one_bottleneck() {
    netlab::require!();
    if !common::ensure_tool("iperf3", "iperf3") {
        return;
    }
    let _g = common::serial();
    let rate = 200_000_000u64;
    let lab = Lab::builder()
        .site("a", 2)
        .site("b", 2)
        .rate_bps(rate)
        .rtt(Duration::from_millis(10))
        .mtu(1500)
        .build()
        .expect("build lab");
    let flows: Vec<_> = (0..2)
        .map(|i| {
            let (c, s) = (lab.host("a", i).clone(), lab.host("b", i).clone());
            std::thread::spawn(move || common::iperf3(&c, &s, 5, &["-O", "1"]))
        })
        .collect();
    let results: Vec<_> = flows
        .into_iter()
        .map(|t| t.join().expect("iperf3 thread"))
        .collect();
    let total: f64 = results.iter().map(|r| r.received_bps).sum();
    println!(
        "netlab shared bottleneck: 2 flows at 200 Mbit/s: {:.1} + {:.1} = {:.1} Mbit/s ({:.1}% of the link)",
        results[0].received_bps / 1e6,
        results[1].received_bps / 1e6,
        total / 1e6,
        100.0 * total / rate as f64
    );
    assert!(
        total <= rate as f64 * 1.02,
        "two flows together exceeded the bottleneck: {total}"
    );
    if !netlab::probe::timing_held(&lab.stats()) {
        return;
    }
    assert!(
        total >= rate as f64 * 0.80,
        "two flows together used only {total} bit/s of {rate}"
    );
    assert!(
        results.iter().all(|r| r.received_bps > rate as f64 * 0.1),
        "one flow starved: {results:?}"
    );
}
