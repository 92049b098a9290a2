//! With random loss p at 20 ms RTT, one Reno stream's throughput is within a factor of 2 of
//! the Mathis formula MSS/RTT * 1.22/sqrt(p): the emulator's loss behaves like a real path's
//! (where the emulator kept time: inconclusive otherwise, see `netlab::probe::timing_held`).

mod common;

use std::time::Duration;

use netlab::Lab;

fn reno_vs_mathis(loss: f64) -> (f64, netlab::Stats) {
    let rtt = Duration::from_millis(20);
    let lab = Lab::builder()
        .site("a", 1)
        .site("b", 1)
        .rate_bps(1_000_000_000)
        .rtt(rtt)
        .loss(loss)
        .mtu(1500)
        .congestion("reno")
        .seed(7)
        .build()
        .expect("build lab");
    let r = common::iperf3(
        lab.host("a", 0),
        lab.host("b", 0),
        10,
        &["-O", "1", "-C", "reno"],
    );
    // MSS with TCP timestamps on a 1500-byte MTU.
    let mss = 1448.0 * 8.0;
    let mathis = mss / rtt.as_secs_f64() * 1.22 / loss.sqrt();
    let ratio = r.received_bps / mathis;
    let st = lab.stats();
    let d = st.direction("a").expect("a->b");
    println!(
        "netlab mathis: loss {:.1}%: reno {:.2} Mbit/s, Mathis {:.2} Mbit/s, ratio {ratio:.2} ({} retransmits; emulator dropped {} of {} data packets = {:.3}%)",
        loss * 100.0,
        r.received_bps / 1e6,
        mathis / 1e6,
        r.retransmits,
        d.drops.loss,
        d.offered_packets,
        100.0 * d.drops.loss as f64 / d.offered_packets.max(1) as f64
    );
    (ratio, st)
}

#[test]
fn reno_throughput_follows_mathis_at_1_percent_and_0_1_percent_loss() {
    netlab::require!();
    if !common::ensure_tool("iperf3", "iperf3") {
        return;
    }
    let _g = common::serial();
    for loss in [0.01, 0.001] {
        let (ratio, stats) = reno_vs_mathis(loss);
        if !netlab::probe::timing_held(&stats) {
            return;
        }
        assert!(
            (0.5..=2.0).contains(&ratio),
            "loss {loss}: throughput / Mathis = {ratio:.2}, want 0.5 to 2"
        );
    }
}
