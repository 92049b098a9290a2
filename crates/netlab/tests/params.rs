//! Bad parameters are refused with a clear one-line message, by the builder and the CLI, and
//! nothing is created for them.

use std::time::Duration;

use netlab::{Error, Lab};

fn config_err(b: netlab::LabBuilder) -> String {
    match b.config() {
        Ok(c) => panic!("accepted bad config {c:?}"),
        Err(Error::Config(m)) => {
            assert!(!m.contains('\n'), "one line: {m}");
            m
        }
        Err(e) => panic!("unexpected error kind: {e}"),
    }
}

#[test]
fn builder_refuses_bad_values() {
    let b = Lab::builder;
    assert!(config_err(b().rate_bps(0)).contains("rate must be positive"));
    assert!(config_err(b().loss(1.5)).contains("probability"));
    assert!(config_err(b().loss(-0.01)).contains("probability"));
    assert!(config_err(b().loss(f64::NAN)).contains("probability"));
    assert!(config_err(b().mtu(20)).contains("mtu"));
    assert!(config_err(b().site("a", 1).site("b", 1).site("c", 1)).contains("1 or 2 sites"));
    assert!(config_err(b().site("a", 0)).contains("hosts"));
    assert!(config_err(b().site("a", 1).site("a", 1)).contains("twice"));
    assert!(config_err(b().site("Site1", 1)).contains("lower-case"));
    assert!(config_err(b().queue_bytes(100)).contains("smaller than one packet"));
    assert!(config_err(b().blackout(Duration::from_secs(1), Duration::ZERO)).contains("positive"));
    assert!(config_err(b().congestion("cubic; rm")).contains("congestion"));
    assert!(config_err(b().rtt(Duration::from_secs(200))).contains("60 s"));
    // Good values pass, and the default queue is one bandwidth-delay product.
    let c = b()
        .rate_bps(1_000_000_000)
        .rtt(Duration::from_millis(100))
        .mtu(9000)
        .config()
        .expect("valid");
    assert_eq!(c.links[0].queue_bytes, 12_500_000);
    assert_eq!(c.links[1].delay, Duration::from_millis(50));
}

#[test]
fn unknown_congestion_control_is_refused_before_anything_is_created() {
    netlab::require!();
    let before = std::fs::read_dir("/run/netns")
        .map(|d| d.count())
        .unwrap_or(0);
    match Lab::builder().congestion("nosuchcc").build() {
        Err(Error::Config(m)) => assert!(m.contains("not available"), "{m}"),
        Err(e) => panic!("unexpected error: {e}"),
        Ok(_) => panic!("accepted unknown congestion control"),
    }
    let after = std::fs::read_dir("/run/netns")
        .map(|d| d.count())
        .unwrap_or(0);
    assert!(after <= before, "namespaces created for a refused lab");
}

#[test]
fn cli_refuses_bad_flags_with_exit_code_2() {
    for args in [
        &["up", "--rate", "-1G"][..],
        &["up", "--rate", "1Gfoo"][..],
        &["up", "--loss", "1.5"][..],
        &["up", "--loss", "-1"][..],
        &["up", "--rtt", "100"][..],
        &["up", "--rtt", "fast"][..],
        &["up", "--duration", "-2s"][..],
        &["up", "--mtu", "70000"][..],
        &["up", "--site", "a=x"][..],
        &["nosuchcommand"][..],
    ] {
        let mut v = vec!["netlab".to_string()];
        v.extend(args.iter().map(|s| s.to_string()));
        assert_eq!(netlab::cli::main(v), 2, "{args:?} must be a usage error");
    }
}
