use super::*;

/// 4 GiB in 40 s over 4 streams at 100 ms: a healthy, network-bound copy.
fn healthy() -> Transfer {
    Transfer {
        bytes: 4 << 30,
        files: 1,
        seconds: 40.0,
        rate_cap_bps: None,
        link_bps: 1_000_000_000,
        send: Some(SendEvidence {
            streams: 4,
            life_us: 160_000_000,
            busy_us: 158_000_000,
            rwnd_limited_us: 1_000_000,
            sndbuf_limited_us: 1_000_000,
            segs_out: 3_000_000,
            retrans_segs: 30,
            min_rtt_us: 100_000,
            srtt_us: 104_000,
            read_us: 4_000_000,
            read_bytes: 4 << 30,
            budget_wait_us: 35_000_000,
            readers: 8,
            cpu_us: 8_000_000,
            wall_us: 40_000_000,
            cpu_millicores: 2000,
            wmem_max: 4 << 20,
        }),
        receive: Some(ReceiveEvidence {
            write_us: 6_000_000,
            write_bytes: 4 << 30,
            writers: 4,
            cpu_us: 9_000_000,
            wall_us: 40_000_000,
            cpu_millicores: 2000,
            rmem_max: 6 << 20,
        }),
    }
}

fn with_send(f: impl FnOnce(&mut SendEvidence)) -> Transfer {
    let mut t = healthy();
    f(t.send.as_mut().unwrap());
    t
}

#[test]
fn a_healthy_copy_is_at_the_networks_capacity() {
    let v = diagnose(&healthy());
    assert_eq!(v.factor, Factor::Network, "{v:?}");
    assert!(v.reason.contains("network path"), "{}", v.reason);
    assert!((v.goodput_bps - 858_993_459.2).abs() < 1.0);
    assert!(v.shares.busy > 0.98 && v.shares.network > 0.98);
}

#[test]
fn each_limit_is_named_with_its_advice() {
    let rwnd = diagnose(&with_send(|s| s.rwnd_limited_us = 100_000_000));
    assert_eq!(rwnd.factor, Factor::ReceiverWindow);
    // 1 Gbit/s at 104 ms: 13 MB in flight, twice that rounded up: 32 MiB.
    assert_eq!(
        rwnd.advice[0],
        "on the receiver: sysctl -w net.ipv4.tcp_rmem=\"4096 131072 33554432\""
    );
    let sndbuf = diagnose(&with_send(|s| s.sndbuf_limited_us = 60_000_000));
    assert_eq!(sndbuf.factor, Factor::SenderBuffer);
    assert!(sndbuf.advice[0].contains("net.ipv4.tcp_wmem"));
    // Loss below the link's capacity (at capacity, the losses of a full bottleneck queue
    // are the network's).
    let mut lossy = with_send(|s| s.retrans_segs = 30_000);
    lossy.link_bps = 10_000_000_000;
    let lossy = diagnose(&lossy);
    assert_eq!(lossy.factor, Factor::Loss);
    assert!(lossy.reason.contains("1.00%"), "{}", lossy.reason);
    let source = diagnose(&with_send(|s| {
        s.busy_us = 60_000_000;
        s.read_us = 200_000_000;
        s.budget_wait_us = 0;
    }));
    assert_eq!(source.factor, Factor::SourceRead, "{source:?}");
    let mut slow_disk = with_send(|s| s.rwnd_limited_us = 120_000_000);
    slow_disk.receive.as_mut().unwrap().write_us = 150_000_000;
    let d = diagnose(&slow_disk);
    assert_eq!(d.factor, Factor::DestinationWrite, "{d:?}");
    assert!(d.reason.contains("writes at about"), "{}", d.reason);
    let mut cpu = healthy();
    cpu.receive.as_mut().unwrap().cpu_us = 78_000_000;
    let c = diagnose(&cpu);
    assert_eq!(c.factor, Factor::Cpu);
    assert!(c.reason.contains("receiver"), "{}", c.reason);
    // A cgroup quota of a fifth of a core, used up by the sender.
    let quota = with_send(|s| {
        s.cpu_millicores = 200;
        s.cpu_us = 7_800_000;
    });
    let q = diagnose(&quota);
    assert_eq!(q.factor, Factor::Cpu);
    assert!(
        q.reason.contains("sender") && q.reason.contains("0.20"),
        "{}",
        q.reason
    );
    // Held by a receiver whose buffers are large enough: it did not drain them.
    let mut slow_reader = with_send(|s| s.rwnd_limited_us = 100_000_000);
    slow_reader.receive.as_mut().unwrap().rmem_max = 256 << 20;
    assert_eq!(diagnose(&slow_reader).factor, Factor::Cpu);
}

#[test]
fn caps_short_transfers_and_small_files_come_first() {
    let mut capped = healthy();
    capped.link_bps = 10_000_000_000;
    capped.rate_cap_bps = Some(900_000_000);
    capped.send.as_mut().unwrap().retrans_segs = 30_000;
    assert_eq!(diagnose(&capped).factor, Factor::RateCap);
    // A cap above what the link carries is not the limit.
    capped.link_bps = 1_000_000_000;
    capped.rate_cap_bps = Some(1_500_000_000);
    assert_ne!(diagnose(&capped).factor, Factor::RateCap);
    // At the planned link rate, idle streams do not hide the network.
    let mut full = with_send(|s| s.busy_us = 40_000_000);
    full.link_bps = 900_000_000;
    assert_eq!(diagnose(&full).factor, Factor::Network);
    let mut short = healthy();
    short.seconds = 0.8;
    short.bytes = 10 << 20;
    assert_eq!(diagnose(&short).factor, Factor::SlowStart);
    let mut small = with_send(|s| s.busy_us = 30_000_000);
    small.files = 2000;
    small.bytes = 68 << 20;
    let v = diagnose(&small);
    assert_eq!(v.factor, Factor::PerFileLatency, "{v:?}");
    assert!(v.advice[0].contains("--concurrency"));
}

#[test]
fn without_evidence_nothing_is_claimed() {
    let t = Transfer {
        bytes: 1 << 30,
        files: 1,
        seconds: 10.0,
        link_bps: 1_000_000_000,
        ..Default::default()
    };
    assert_eq!(diagnose(&t).factor, Factor::Unknown);
    let only_receiver = Transfer {
        receive: healthy().receive,
        ..t
    };
    assert_eq!(diagnose(&only_receiver).factor, Factor::Unknown);
}

/// Linux 6.18 reports no send-buffer-limited time for a sender held by its tcp_wmem: the
/// buffer is recognised from what the streams kept in flight against the buffer's ceiling.
#[test]
fn a_send_buffer_too_small_is_named_without_the_kernels_chronograph() {
    // One stream, 1 MiB tcp_wmem, 40 ms, 123 Mbit/s on a 1 Gbit/s link, no loss, a receiver
    // with 128 MiB tcp_rmem (as measured in netlab).
    let mut t = Transfer {
        bytes: 24 << 20,
        files: 1,
        seconds: 24.0 * 8.0 * 1.048_576 / 123.0,
        link_bps: 1_000_000_000,
        ..with_send(|s| {
            s.streams = 1;
            s.life_us = 1_700_000;
            s.busy_us = 1_690_000;
            s.rwnd_limited_us = 0;
            s.sndbuf_limited_us = 0;
            s.segs_out = 20_000;
            s.retrans_segs = 0;
            s.min_rtt_us = 40_000;
            s.srtt_us = 40_300;
            s.wmem_max = 1 << 20;
        })
    };
    t.receive.as_mut().unwrap().rmem_max = 128 << 20;
    let v = diagnose(&t);
    assert_eq!(v.factor, Factor::SenderBuffer, "{v:?}");
    assert!(
        v.reason.contains("1 stream of at most 1.0 MiB"),
        "{}",
        v.reason
    );
    assert!(v.advice[0].contains("net.ipv4.tcp_wmem"));
    // The same copy with loss is loss; with buffers the path's window fits in, the network;
    // with a ceiling it stayed far below, not the buffer either.
    let lossy = Transfer {
        send: t.send.clone().map(|mut s| {
            s.retrans_segs = 200;
            s
        }),
        ..t.clone()
    };
    assert_eq!(diagnose(&lossy).factor, Factor::Loss);
    let big = Transfer {
        send: t.send.clone().map(|mut s| {
            s.wmem_max = 128 << 20;
            s
        }),
        ..t.clone()
    };
    assert_eq!(diagnose(&big).factor, Factor::Network);
    // A receiver whose tcp_rmem is as small is not blamed on the sender.
    let mut small_rmem = t.clone();
    small_rmem.receive.as_mut().unwrap().rmem_max = 1 << 20;
    assert_ne!(diagnose(&small_rmem).factor, Factor::SenderBuffer);
    let far_below = Transfer {
        seconds: t.seconds * 4.0,
        ..t.clone()
    };
    assert_ne!(diagnose(&far_below).factor, Factor::SenderBuffer);
}

#[test]
fn heavy_loss_is_named_even_when_the_streams_sat_idle() {
    // 1% random loss, cubic, 2 streams at 40 ms on a 1 Gbit/s link: 8.7 Mbit/s, 0.9% of
    // segments sent again, data in flight only 54% of the time (as measured in netlab: the
    // streams waited out retransmission timeouts).
    let t = Transfer {
        bytes: 6 << 20,
        files: 1,
        seconds: 6.0 * 8.0 * 1.048_576 / 8.7,
        link_bps: 1_000_000_000,
        ..with_send(|s| {
            s.streams = 2;
            s.life_us = 5_800_000;
            s.busy_us = 3_130_000;
            s.rwnd_limited_us = 0;
            s.sndbuf_limited_us = 0;
            s.segs_out = 4_600;
            s.retrans_segs = 42;
            s.min_rtt_us = 40_000;
            s.srtt_us = 41_000;
        })
    };
    let v = diagnose(&t);
    assert_eq!(v.factor, Factor::Loss, "{v:?}");
    assert!(v.reason.contains("retransmission timeouts"), "{}", v.reason);
    // Idle streams without loss stay unexplained.
    let quiet = Transfer {
        send: t.send.clone().map(|mut s| {
            s.retrans_segs = 0;
            s
        }),
        ..t.clone()
    };
    assert_eq!(diagnose(&quiet).factor, Factor::Unknown);
}
