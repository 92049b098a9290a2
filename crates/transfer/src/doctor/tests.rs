use super::*;

/// A fresh Debian host's settings (tcp_rmem max 6 MiB, tcp_wmem max 4 MiB, core maxima
/// 208 KiB, no bbr, fq_codel, slow start after idle).
fn stock() -> HostFacts {
    HostFacts {
        tcp_rmem: [4096, 131072, 6291456],
        tcp_wmem: [4096, 16384, 4194304],
        core_rmem_max: 212992,
        core_wmem_max: 212992,
        congestion_available: vec!["reno".into(), "cubic".into()],
        congestion_default: "cubic".into(),
        slow_start_after_idle: Some(1),
        mtu_probing: Some(0),
        default_qdisc: Some("fq_codel".into()),
        interface: Some("eth0".into()),
        qdisc: Some("fq_codel".into()),
        mtu: Some(1500),
        txqueuelen: Some(1000),
        governors: Some(vec!["powersave".into()]),
        clock_synchronized: Some(false),
    }
}

/// The same host tuned as fasterdata advises.
fn tuned() -> HostFacts {
    HostFacts {
        tcp_rmem: [4096, 131072, 268435456],
        tcp_wmem: [4096, 16384, 268435456],
        core_rmem_max: 268435456,
        core_wmem_max: 268435456,
        congestion_available: vec!["reno".into(), "cubic".into(), "bbr".into()],
        slow_start_after_idle: Some(0),
        mtu_probing: Some(1),
        qdisc: Some("fq".into()),
        txqueuelen: Some(10000),
        governors: Some(vec!["performance".into()]),
        clock_synchronized: Some(true),
        ..stock()
    }
}

/// 1 Gbit/s at 100 ms: 12.5 MB in flight.
fn path() -> PathFacts {
    PathFacts {
        rtt: Duration::from_millis(100),
        measured: true,
        rate_bps: 1_000_000_000,
        ..Default::default()
    }
}

fn get<'a>(f: &'a [Finding], check: &str) -> &'a Finding {
    f.iter()
        .find(|x| x.check == check)
        .unwrap_or_else(|| panic!("no {check} finding in {f:?}"))
}

#[test]
fn a_stock_host_gets_the_lines_that_fix_it() {
    let f = findings(&stock(), &path());
    let r = get(&f, "tcp_rmem");
    assert_eq!(r.status, Status::Fail, "{r:?}");
    assert!(r.detail.contains("6.0 MiB"), "{r:?}");
    // Twice the 12.5 MB product, rounded up to a power of two.
    assert_eq!(
        r.fix,
        ["sysctl -w net.ipv4.tcp_rmem=\"4096 131072 33554432\""]
    );
    assert_eq!(get(&f, "tcp_wmem").status, Status::Fail);
    assert_eq!(
        get(&f, "rmem_max").fix,
        ["sysctl -w net.core.rmem_max=33554432"]
    );
    assert_eq!(get(&f, "congestion").status, Status::Warn);
    assert_eq!(get(&f, "qdisc").fix[0], "tc qdisc replace dev eth0 root fq");
    assert_eq!(
        get(&f, "slow_start_after_idle").fix,
        ["sysctl -w net.ipv4.tcp_slow_start_after_idle=0"]
    );
    assert_eq!(get(&f, "cpu governor").status, Status::Warn);
    assert_eq!(get(&f, "clock").status, Status::Warn);
}

#[test]
fn a_tuned_host_passes() {
    let f = findings(&tuned(), &path());
    assert!(f.iter().all(|x| x.status <= Status::Info), "{f:?}");
    assert!(f.iter().all(|x| x.fix.is_empty()), "{f:?}");
}

#[test]
fn buffers_are_judged_against_the_path_and_the_peer_is_told_what_to_change() {
    // 6 MiB is enough for 1 Gbit/s at 20 ms (2.5 MB) but not twice 12.5 MB.
    let short = PathFacts {
        rtt: Duration::from_millis(20),
        ..path()
    };
    assert_eq!(
        get(&findings(&stock(), &short), "tcp_rmem").status,
        Status::Ok
    );
    let mut h = tuned();
    h.tcp_rmem[2] = 16 << 20;
    assert_eq!(get(&findings(&h, &path()), "tcp_rmem").status, Status::Warn);
    let p = PathFacts {
        peer: Some(HostLimits {
            tcp_rmem_max: 6 << 20,
            tcp_wmem_max: 256 << 20,
            core_rmem_max: 0,
            core_wmem_max: 0,
            congestion: vec![],
        }),
        peer_name: Some("dtn.example.org".into()),
        ..path()
    };
    let f = findings(&tuned(), &p);
    let pr = get(&f, "peer tcp_rmem");
    assert_eq!(pr.status, Status::Fail);
    assert!(
        pr.detail.contains("dtn.example.org") && pr.detail.contains("6.0 MiB"),
        "{pr:?}"
    );
    assert_eq!(get(&f, "peer tcp_wmem").status, Status::Ok);
    // The wanted size stays within what the kernel takes.
    let huge = PathFacts {
        rate_bps: 400_000_000_000,
        rtt: Duration::from_millis(300),
        ..path()
    };
    assert_eq!(wanted_buffer(&huge), 1 << 30);
}

#[test]
fn fast_paths_want_long_queues_and_jumbo_frames() {
    let fast = PathFacts {
        rate_bps: 10_000_000_000,
        ..path()
    };
    let f = findings(&stock(), &fast);
    assert_eq!(
        get(&f, "txqueuelen").fix,
        ["ip link set dev eth0 txqueuelen 10000"]
    );
    assert!(get(&f, "mtu").detail.contains("MTU 9000"));
    let mut jumbo = tuned();
    jumbo.mtu = Some(9000);
    jumbo.mtu_probing = Some(0);
    let p = PathFacts {
        path_mtu: Some(1500),
        ..fast
    };
    let f = findings(&jumbo, &p);
    assert_eq!(get(&f, "mtu_probing").status, Status::Warn);
    assert!(get(&f, "mtu").detail.contains("only 1500"));
}

#[test]
fn routes_and_qdiscs_are_read_from_the_kernels_text() {
    let table = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
        eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
        eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
        lab0\t000012C6\t00000000\t0001\t0\t0\t0\t0000FEFF\t0\t0\t0\n";
    assert_eq!(route_interface(table, None).as_deref(), Some("eth0"));
    let peer = "198.18.1.2".parse().ok();
    assert_eq!(route_interface(table, peer).as_deref(), Some("lab0"));
    let other = "192.0.2.9".parse().ok();
    assert_eq!(route_interface(table, other).as_deref(), Some("eth0"));
    assert_eq!(route_interface("", None), None);
    assert_eq!(
        parse_root_qdisc("qdisc fq 8001: root refcnt 2 limit 10000p flow_limit 100p\n").as_deref(),
        Some("fq")
    );
    assert_eq!(
        parse_root_qdisc("qdisc noqueue 0: root refcnt 2\n").as_deref(),
        Some("noqueue")
    );
    assert_eq!(parse_root_qdisc(""), None);
    let link = "5: wan0: <POINTOPOINT,UP> mtu 9000 qdisc fq state UNKNOWN mode DEFAULT group default qlen 500\\    link/none";
    assert_eq!(parse_ip_link(link, "mtu"), Some(9000));
    assert_eq!(parse_ip_link(link, "qlen"), Some(500));
    assert_eq!(parse_ip_link(link, "nothing"), None);
}

#[test]
fn this_host_can_be_read() {
    let h = HostFacts::read(None);
    assert!(h.tcp_rmem[2] > 0 && h.tcp_wmem[2] > 0, "{h:?}");
    assert!(!h.congestion_available.is_empty());
    assert!(!findings(&h, &path()).is_empty());
}
