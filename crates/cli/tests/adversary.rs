//! The standing adversarial suite for `haul serve` (and so for every storage node's data port,
//! which is the same listener): each attack found against longhaul is replayed here over
//! loopback against the real binary, and each test asserts that the legitimate client is
//! still served while the attack runs, that the attacker gains nothing it may not have, and
//! that the endpoint gives back what the attack held (connections, memory, files).
//!
//! Attackers connect from 127.0.0.2 and legitimate clients from 127.0.0.1 (the whole of
//! 127/8 is loopback), so per-source limits can be seen at work.

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// A TCP connection to `addr` from 127.0.0.2.
fn attacker_connect(addr: &str) -> std::io::Result<TcpStream> {
    let target: SocketAddr = addr.parse().expect("address");
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    s.bind(&"127.0.0.2:0".parse::<SocketAddr>().unwrap().into())?;
    s.connect_timeout(&target.into(), Duration::from_secs(5))?;
    Ok(s.into())
}

/// Sockets the process `pid` holds open.
fn sockets_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter(|l| l.to_string_lossy().starts_with("socket:"))
                .count()
        })
        .unwrap_or(0)
}

/// Whether the peer closed (or reset) `s` within `within`; false if it is still open.
fn closed_by_peer(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 4096];
    let end = Instant::now() + within;
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return false,
            Err(_) => return true,
        }
        if Instant::now() > end {
            return false;
        }
    }
}

fn small_file(dir: &std::path::Path) -> std::path::PathBuf {
    let src = dir.join("f.dat");
    write_file(&src, 7, 300_000);
    src
}

/// C1: one byte that is not a handshake, then close, repeated far beyond the connection
/// limit. The endpoint used to peek forever at the buffered byte (a slot and 20% of a core
/// per attacker, never released). Now each is refused at once: the endpoint holds no socket
/// for them afterwards and a client is served normally.
#[test]
fn one_byte_and_close_holds_no_slot() {
    let t = tempfile::tempdir().unwrap();
    let a = serve(
        &t.path().join("a"),
        &["--insecure", "--max-connections", "8"],
        &[],
    );
    let pid = a.child.id();
    let baseline = sockets_of(pid);
    for i in 0..64 {
        let mut s = attacker_connect(&a.addr).unwrap();
        let _ = s.write_all(if i % 2 == 0 { b"H" } else { b"HAULDA" });
        let _ = s.shutdown(std::net::Shutdown::Write);
        assert!(
            closed_by_peer(&mut s, Duration::from_secs(5)),
            "attempt {i}: the endpoint kept a one-byte connection open"
        );
    }
    assert!(
        wait_for(Duration::from_secs(5), || sockets_of(pid) <= baseline),
        "the endpoint holds {} sockets, {baseline} before the attack",
        sockets_of(pid)
    );
    let src = small_file(t.path());
    assert_ok(&cp(&[
        "--retries",
        "0",
        src.to_str().unwrap(),
        &a.url("f.dat"),
    ]));
    assert_same_file(&src, &a.root.join("f.dat"));
}

/// C1: connections that send nothing (or a partial magic, or a partial bind frame) and stay
/// open. From one source they cannot take more than `--max-per-host` slots, so a client at
/// another address is served while they are held; each is closed by the endpoint at the
/// handshake timeout.
#[test]
fn slowloris_from_one_host_locks_nobody_else_out_and_is_cut_at_the_handshake_timeout() {
    let t = tempfile::tempdir().unwrap();
    let a = serve(
        &t.path().join("a"),
        &[
            "--insecure",
            "--max-connections",
            "40",
            "--max-per-host",
            "16",
            "--handshake-timeout",
            "2s",
        ],
        &[],
    );
    let openings: [&[u8]; 4] = [b"", b"HAUL", b"HAULDAT1", b"HAULDAT1\x01\x00"];
    let mut held = Vec::new();
    for i in 0..40 {
        match attacker_connect(&a.addr) {
            Ok(mut s) => {
                let _ = s.write_all(openings[i % openings.len()]);
                held.push(s);
            }
            Err(_) => break,
        }
    }
    // Give the endpoint time to have refused what is over the per-host limit.
    std::thread::sleep(Duration::from_millis(300));
    let src = small_file(t.path());
    let started = Instant::now();
    let out = cp(&["--retries", "0", src.to_str().unwrap(), &a.url("f.dat")]);
    assert_ok(&out);
    assert_same_file(&src, &a.root.join("f.dat"));
    // At most 16 of the 40 got a slot; the rest were refused (reset) at once.
    let open_now = held
        .iter_mut()
        .map(|s| !closed_by_peer(s, Duration::from_millis(1)))
        .filter(|open| *open)
        .count();
    assert!(
        open_now <= 16,
        "{open_now} attacking connections held from one host, limit 16"
    );
    // Those that got in are closed once the handshake timeout has passed.
    let remaining = Duration::from_secs(6).saturating_sub(started.elapsed());
    for (i, s) in held.iter_mut().enumerate() {
        assert!(
            closed_by_peer(s, remaining.max(Duration::from_secs(2))),
            "attacking connection {i} still open after the 2 s handshake timeout"
        );
    }
}

/// C1: an authenticated (here: --insecure) control connection that says hello and then
/// nothing is closed at the idle timeout instead of holding its slot for ever.
#[test]
fn idle_control_connections_are_closed() {
    let t = tempfile::tempdir().unwrap();
    let a = serve(
        &t.path().join("a"),
        &["--insecure", "--idle-timeout", "1s"],
        &[],
    );
    let mut s = TcpStream::connect(&a.addr).unwrap();
    s.write_all(transfer::conn::CONTROL_MAGIC).unwrap();
    let hello = wire::control::Request::Hello {
        version: wire::control::PROTOCOL_VERSION,
        agent: "adversary".into(),
        limits: Default::default(),
    };
    s.write_all(&hello.encode()).unwrap();
    // The welcome comes back, then nothing; the endpoint closes after the idle timeout.
    assert!(
        closed_by_peer(&mut s, Duration::from_secs(10)),
        "an idle control connection was kept open"
    );
}

/// C1 over TLS: a connection that starts a TLS record and stops is closed at the handshake
/// timeout; a client with a certificate is served meanwhile.
#[test]
fn a_stalled_tls_handshake_is_cut_at_the_handshake_timeout() {
    let t = tempfile::tempdir().unwrap();
    let pki = Pki::new(&t.path().join("pki"));
    let mut args: Vec<String> = pki.serve_args();
    args.extend(["--handshake-timeout".into(), "2s".into()]);
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let a = serve(&t.path().join("a"), &args, &[]);
    let mut stalled = attacker_connect(&a.addr).unwrap();
    stalled
        .write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc])
        .unwrap();
    let src = small_file(t.path());
    assert_ok(&pki.cp(
        "alice",
        &["--retries", "0", src.to_str().unwrap(), &a.tls_url("f.dat")],
    ));
    assert!(
        closed_by_peer(&mut stalled, Duration::from_secs(8)),
        "a stalled TLS handshake was kept open"
    );
}
