//! The loss classifier on an emulated path, end to end through `haul serve` and `haul cp` in
//! two netlab hosts: random loss switches the copy's streams to BBR, and `--json` says when
//! and on what evidence; a clean path whose bottleneck queue overflows (losses that come with
//! a full queue) keeps the host's loss-based algorithm. Behaviour only: no rate is asserted.

mod common;

use common::*;
use std::time::Duration;

/// Copies a 64 MiB file from a0 to b0 over 200 Mbit/s, 40 ms RTT and `loss`; returns the
/// client's JSON report after checking the copy byte for byte, or None (the test recorded as
/// inconclusive) when the emulator did not keep time: the classifier reads RTTs, and a
/// machine that stalls for hundreds of milliseconds shows it queues that the path never had.
fn copy_over(loss: f64, seed: u64) -> Option<serde_json::Value> {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("big.dat");
    write_file(&src, seed, 64 << 20);
    let dst = dir.path().join("dst");
    std::fs::create_dir_all(&dst).unwrap();
    let lab = netlab::Lab::builder()
        .site("a", 1)
        .site("b", 1)
        .rate_bps(200_000_000)
        .rtt(Duration::from_millis(40))
        .loss(loss)
        .mtu(1500)
        .congestion("cubic")
        .seed(seed)
        .build()
        .expect("build lab");
    let (a, b) = (lab.host("a", 0), lab.host("b", 0));
    let listen = format!("{}:5811", b.addr());
    let haul_in = |h: &netlab::Host| haul_env(h.command(env!("CARGO_BIN_EXE_haul")));
    // Declared after the lab, so dropped (killed) before it.
    let server = serve_with(haul_in(b), &listen, &dst, &["--insecure"], &[]);
    assert_eq!(server.addr, listen, "endpoint did not start where asked");
    let url = format!("haul://{listen}/");
    let out = cp_with(haul_in(a), &[src.to_str().unwrap(), &url], &[]);
    drop(server);
    assert_ok(&out);
    assert_same_file(&src, &dst.join("big.dat"));
    netlab::probe::timing_held(&lab.stats()).then(|| json(&out))
}

#[test]
fn random_loss_switches_to_bbr_and_a_full_queue_does_not() {
    if let Err(why) = netlab::Lab::available() {
        testkit::skip!("netlab cannot run here: {why}");
    }

    // 1% random loss: cubic's streams are held far below the link by losses that strike
    // with the queue empty.
    let Some(lossy) = copy_over(0.01, 5) else {
        return;
    };
    let congestion = lossy["congestion"].as_str().expect("congestion");
    assert!(congestion.starts_with("cubic->bbr"), "{lossy}");
    let decisions = lossy["cc_decisions"].as_array().expect("cc_decisions");
    let first = &decisions[0];
    assert_eq!(first["to"], "Bbr", "{first}");
    let events = first["events"].as_u64().unwrap();
    let unqueued = first["unqueued_events"].as_u64().unwrap();
    assert!(events >= 6, "switched on {events} loss events: {first}");
    assert!(
        unqueued * 10 >= events * 8,
        "switched though only {unqueued} of {events} losses struck without a queue: {first}"
    );
    let base = first["base_rtt_us"].as_u64().unwrap();
    assert!(
        (30_000..60_000).contains(&base),
        "base RTT {base} us on a 40 ms path: {first}"
    );
    assert!(
        first["why"].as_str().is_some_and(|w| !w.is_empty()),
        "{first}"
    );

    // No random loss: the losses are the queue overflowing, which BBR would not cure.
    let Some(clean) = copy_over(0.0, 6) else {
        return;
    };
    assert_eq!(clean["congestion"], "cubic", "{clean}");
    assert_eq!(clean["cc_decisions"], serde_json::json!([]), "{clean}");
}
