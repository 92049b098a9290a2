//! Blackouts drop traffic for exactly their window (scheduled at build time and at run time),
//! the 1 ms "router's view" CSV shows the gap, and sockets created in a host with
//! `Host::enter` carry data at the configured rate.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use netlab::Lab;

#[test]
fn blackouts_drop_traffic_and_recording_shows_the_gap() {
    netlab::require!();
    if !common::ensure_tool("ping", "iputils-ping") {
        return;
    }
    let _g = common::serial();
    let csv = std::env::temp_dir().join(format!("netlab-test-{}.csv", std::process::id()));
    let lab = Lab::builder()
        .site("a", 1)
        .site("b", 1)
        .rate_bps(100_000_000)
        .rtt(Duration::from_millis(10))
        .blackout(Duration::from_millis(1000), Duration::from_millis(1000))
        .record_csv(&csv)
        .build()
        .expect("build lab");
    // A second blackout scheduled while running, 3.5 s to 4 s after start.
    lab.schedule_blackout(
        Duration::from_millis(3500).saturating_sub(lab.elapsed()),
        Duration::from_millis(500),
    )
    .expect("schedule blackout");
    // 450 pings every 10 ms: about 4.5 s.
    let out = common::run_bounded(
        lab.host("a", 0)
            .command("ping")
            .args(["-n", "-q", "-c", "450", "-i", "0.01", "-W", "1"])
            .arg(lab.host("b", 0).addr().to_string()),
        Duration::from_secs(30),
    )
    .expect("ping");
    let text = String::from_utf8_lossy(&out.stdout);
    let stats = lab.shutdown().expect("shutdown");
    let ab = stats.direction("a").expect("a->b");
    let ba = stats.direction("b").expect("b->a");
    println!(
        "netlab blackout: {}",
        text.lines().find(|l| l.contains("received")).unwrap_or("?")
    );
    println!("{stats}");
    let rows = std::fs::read_to_string(&csv).expect("recording written");
    let _ = std::fs::remove_file(&csv);
    let mut lines = rows.lines();
    assert_eq!(lines.next(), Some("t_ms,a_to_b_bytes,b_to_a_bytes"));
    let bins: Vec<(u64, u64, u64)> = lines
        .map(|l| {
            let v: Vec<u64> = l.split(',').map(|x| x.parse().expect("number")).collect();
            (v[0], v[1], v[2])
        })
        .collect();
    assert!(
        bins.len() >= 4400,
        "{} bins of 1 ms for a 4.5 s run",
        bins.len()
    );
    assert!(
        bins.iter().enumerate().all(|(i, b)| b.0 == i as u64),
        "bins are consecutive ms"
    );
    let sum = |r: std::ops::Range<usize>| bins[r].iter().map(|b| b.1).sum::<u64>();
    let busy: Vec<usize> = (0..bins.len() / 100)
        .filter(|i| sum(i * 100..(i + 1) * 100) > 0)
        .collect();
    println!("netlab blackout: 100 ms slots with a->b traffic: {busy:?}");
    // Every lost ping was lost to a blackout (ping slows down while replies are missing, so
    // the count is checked against ping's own numbers, not the window length).
    let summary = text
        .lines()
        .find(|l| l.contains("received"))
        .expect("ping summary");
    let nums: Vec<u64> = summary
        .split(',')
        .filter_map(|f| f.split_whitespace().next()?.parse().ok())
        .collect();
    let (sent, received) = (nums[0], nums[1]);
    assert_eq!(
        ab.drops.blackout + ba.drops.blackout,
        sent - received,
        "all ping losses are blackout drops"
    );
    assert_eq!(
        ab.drops.loss + ab.drops.queue + ba.drops.loss + ba.drops.queue,
        0
    );

    assert_eq!(
        sum(1000..2000),
        0,
        "bytes forwarded during the first blackout"
    );
    assert_eq!(
        sum(3500..4000),
        0,
        "bytes forwarded during the run-time blackout"
    );
    assert!(
        sum(2100..3400) > 0 && sum(100..900) > 0,
        "traffic outside blackouts recorded"
    );
    assert_eq!(
        bins.iter().map(|b| b.1).sum::<u64>(),
        ab.bytes,
        "recording matches counters"
    );
    // Pings every 10 ms meet the 1.5 s of blackouts about 150 times, if ping and the
    // emulator ran on time (a stalled machine sends fewer).
    if !netlab::probe::timing_held(&stats) {
        return;
    }
    assert!(
        ab.drops.blackout >= 50,
        "a->b blackout drops {}",
        ab.drops.blackout
    );
}

#[test]
fn sockets_made_inside_hosts_carry_data_at_the_configured_rate() {
    netlab::require!();
    let _g = common::serial();
    let rate = 50_000_000u64;
    let lab = Lab::builder()
        .site("a", 1)
        .site("b", 1)
        .rate_bps(rate)
        .rtt(Duration::from_millis(10))
        .build()
        .expect("build lab");
    let server_addr = SocketAddr::new(lab.host("b", 0).addr().into(), 7000);
    let listener = lab
        .host("b", 0)
        .enter(|| TcpListener::bind(server_addr))
        .expect("enter b0")
        .expect("bind");
    let total = 5_000_000usize;
    let reader = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        let mut buf = vec![0u8; 1 << 16];
        let mut got = 0;
        while got < total {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n,
            }
        }
        got
    });
    let mut conn = lab
        .host("a", 0)
        .enter(|| TcpStream::connect_timeout(&server_addr, Duration::from_secs(5)))
        .expect("enter a0")
        .expect("connect");
    let t0 = Instant::now();
    let chunk = vec![7u8; 1 << 16];
    let mut sent = 0;
    while sent < total {
        let n = (total - sent).min(chunk.len());
        conn.write_all(&chunk[..n]).expect("write");
        sent += n;
    }
    drop(conn);
    let got = reader.join().expect("reader");
    let secs = t0.elapsed().as_secs_f64();
    let mbps = got as f64 * 8.0 / secs / 1e6;
    println!(
        "netlab in-process TCP: {got} bytes in {secs:.2} s = {mbps:.1} Mbit/s over a 50 Mbit/s link"
    );
    assert_eq!(got, total);
    // Cannot beat the link (5 MB at 50 Mbit/s is 0.8 s of payload alone).
    assert!(
        secs >= total as f64 * 8.0 / rate as f64,
        "faster than the link: {secs} s"
    );
    let st = lab.stats();
    assert!(st.direction("a").expect("a->b").bytes >= total as u64);
}
