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

/// C6: a user who can write the destination directory plants the temporary names of a file
/// someone else is about to upload as links to a victim's files: a symlink for the part
/// file, a symlink for the ledger's temporary file, and (for a resume) a hard link with a
/// ledger that vouches for it. The upload lands under its own name and the victims are
/// untouched.
#[test]
fn planted_links_under_temporary_names_are_not_followed() {
    use std::os::unix::fs::symlink;
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("a");
    let shared = root.join("shared");
    let bob = root.join("bob");
    std::fs::create_dir_all(&shared).unwrap();
    std::fs::create_dir_all(&bob).unwrap();
    let victim = write_file(&bob.join("important"), 1, 4096);
    let victim2 = write_file(&bob.join("ledger-victim"), 2, 100);
    symlink("../bob/important", shared.join(".report.haul-part")).unwrap();
    symlink(
        "../bob/ledger-victim",
        shared.join(".report.haul-ledger.tmp"),
    )
    .unwrap();
    let a = serve(&root, &["--insecure", "--checkpoint-interval", "10ms"], &[]);
    let src = t.path().join("report");
    write_file(&src, 3, 6 << 20);
    let url = a.url("shared/report");
    for resume in [false, true] {
        let mut args = vec!["--rate", "200M"];
        if resume {
            args.push("--resume");
        }
        args.extend([src.to_str().unwrap(), url.as_str()]);
        assert_ok(&cp(&args));
        assert_same_file(&src, &shared.join("report"));
        assert_eq!(std::fs::read(bob.join("important")).unwrap(), victim);
        assert_eq!(std::fs::read(bob.join("ledger-victim")).unwrap(), victim2);
        // Plant again for the resume round.
        std::fs::remove_file(shared.join("report")).unwrap();
        let _ = std::fs::remove_file(shared.join(".report.haul-part"));
        symlink("../bob/important", shared.join(".report.haul-part")).unwrap();
    }
    // A hard link to the victim with a ledger claiming all of it is there: a resume must
    // not take it as its partial file (it would be renamed into place, and the victim's
    // content published under the upload's name, or written into).
    let _ = std::fs::remove_file(shared.join(".report.haul-part"));
    std::fs::hard_link(bob.join("important"), shared.join(".report.haul-part")).unwrap();
    let m = std::fs::metadata(&src).unwrap();
    let mtime = m
        .modified()
        .unwrap()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    std::fs::write(
        shared.join(".report.haul-ledger"),
        format!(
            r#"{{"version":1,"size":{},"mtime_secs":{},"mtime_nanos":{},"ranges":[[0,4096]]}}"#,
            m.len(),
            mtime.as_secs(),
            mtime.subsec_nanos()
        ),
    )
    .unwrap();
    assert_ok(&cp(&[
        "--resume",
        src.to_str().unwrap(),
        &a.url("shared/report"),
    ]));
    assert_same_file(&src, &shared.join("report"));
    assert_eq!(std::fs::read(bob.join("important")).unwrap(), victim);
    assert!(partials(&root).is_empty(), "{:?}", partials(&root));
}

/// C13: every file of a tree is copied or reported as failed: a name with a backslash is an
/// ordinary name and is copied; a name of 250 bytes (too long for `.NAME.haul-part`) is
/// received under a shorter temporary name; a FIFO is reported as failed (exit 1), not
/// skipped in silence.
#[test]
fn every_file_of_a_tree_is_copied_or_reported() {
    let t = tempfile::tempdir().unwrap();
    let a = serve_insecure(&t.path().join("a"));
    let src = t.path().join("tree");
    write_file(&src.join("back\\slash"), 1, 1000);
    let long = "L".repeat(250);
    write_file(&src.join(&long), 2, 300_000);
    write_file(&src.join("plain"), 3, 10);
    let out = cp(&["-r", src.to_str().unwrap(), &a.url("/")]);
    assert_ok(&out);
    assert_same_tree(&src, &a.root.join("tree"));
    let j = json(&out);
    assert_eq!(j["files_failed"], 0, "{j}");
    // Downloads of the same tree.
    let down = t.path().join("down");
    std::fs::create_dir_all(&down).unwrap();
    assert_ok(&cp(&["-r", &a.url("tree"), down.to_str().unwrap()]));
    assert_same_tree(&src, &down.join("tree"));
    // A special file is reported, with exit 1 and its name.
    let fifo = src.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let out = cp(&["-r", src.to_str().unwrap(), &a.url("/again")]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let j = json(&out);
    assert_eq!(j["files_failed"], 1, "{j}");
    assert!(
        j["failures"][0]["path"].as_str().unwrap().ends_with("fifo"),
        "{j}"
    );
    assert!(a.root.join("again/plain").exists());
}

/// Resident memory of a process, in bytes.
fn rss_of(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map(|kib| kib * 1024)
        .unwrap_or(0)
}

/// Opens a sink session on an `--insecure` endpoint as an attacker would (any client may
/// there; with TLS, any mapped user may) and returns its control connection, id and key.
fn open_attacker_session(
    addr: &str,
    options: wire::control::SessionOptions,
) -> (TcpStream, [u8; 16], [u8; 32]) {
    let mut c = attacker_connect(addr).unwrap();
    c.write_all(transfer::conn::CONTROL_MAGIC).unwrap();
    let (session, key) = ([7u8; 16], [9u8; 32]);
    for r in [
        wire::control::Request::Hello {
            version: wire::control::PROTOCOL_VERSION,
            agent: "adversary".into(),
            limits: Default::default(),
        },
        wire::control::Request::OpenSink {
            session,
            key,
            dest: "victim".into(),
            into_dir: None,
            options,
            grant: None,
        },
    ] {
        c.write_all(&r.encode()).unwrap();
    }
    (c, session, key)
}

/// A data stream of the attacker's session that announces a block of `len` bytes and sends
/// all but its last `missing` bytes, then waits.
fn stream_short_of_a_block(
    addr: &str,
    session: [u8; 16],
    key: [u8; 32],
    stream: u32,
    len: u32,
    missing: usize,
) -> Option<TcpStream> {
    use wire::control::{Bind, CLEAR_NONCE, DATA_MAGIC, bind_proof, encode_bind};
    let mut s = attacker_connect(addr).ok()?;
    s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    let bind = Bind {
        version: wire::control::PROTOCOL_VERSION,
        session,
        stream,
        proof: bind_proof(&key, &CLEAR_NONCE, &session, stream),
        limits: Default::default(),
        buffer: None,
    };
    let mut hello = DATA_MAGIC.to_vec();
    hello.extend(encode_bind(&bind));
    s.write_all(&hello).ok()?;
    let header = wire::data::BlockHeader {
        file: 1,
        offset: 0,
        crc: 0,
    };
    s.write_all(&header.frame_prefix(len)).ok()?;
    let chunk = vec![0x5au8; 1 << 20];
    let mut left = len as usize - missing;
    while left > 0 {
        let n = left.min(chunk.len());
        // A stream the endpoint does not read (no budget for it) blocks here: fine.
        if s.write_all(&chunk[..n]).is_err() {
            break;
        }
        left -= n;
    }
    Some(s)
}

/// C12: one session opens 30 streams, each stopping one byte short of a 16 MiB block. The
/// endpoint used to allocate a block buffer per stream (about 500 MB). Now it reads a block
/// only within the session's buffer budget (here 32 MiB) and the endpoint's (64 MiB), so its
/// memory grows by about the budget; a client of another session is served meanwhile; and
/// the stalled streams are closed after the frame idle time (5 s), giving the memory back.
#[test]
fn a_session_cannot_make_the_endpoint_hold_more_than_its_buffer_budget() {
    let t = tempfile::tempdir().unwrap();
    let a = serve(
        &t.path().join("a"),
        &[
            "--insecure",
            "--session-buffer",
            "32MiB",
            "--max-buffer",
            "64MiB",
            "--max-streams",
            "24",
        ],
        &[],
    );
    let pid = a.child.id();
    let before = rss_of(pid);
    let options = wire::control::SessionOptions {
        block_size: 16 << 20,
        stall_timeout_ms: 5_000,
        ..Default::default()
    };
    let (_control, session, key) = open_attacker_session(&a.addr, options);
    let addr = a.addr.clone();
    let attackers: Vec<_> = (0..30u32)
        .map(|i| {
            let addr = addr.clone();
            std::thread::spawn(move || stream_short_of_a_block(&addr, session, key, i, 16 << 20, 1))
        })
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    let during = rss_of(pid);
    let src = small_file(t.path());
    assert_ok(&cp(&[
        "--retries",
        "0",
        src.to_str().unwrap(),
        &a.url("f.dat"),
    ]));
    assert_same_file(&src, &a.root.join("f.dat"));
    let grown = during.saturating_sub(before);
    assert!(
        grown < 96 << 20,
        "the endpoint grew by {} MiB under the attack (budget 32 MiB per session)",
        grown >> 20
    );
    let held: Vec<_> = attackers
        .into_iter()
        .filter_map(|t| t.join().unwrap())
        .collect();
    assert!(!held.is_empty());
    // Streams beyond --max-streams were refused; the rest are closed after 5 s idle (in the
    // middle of a block, or waiting for buffer room).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    for mut s in held {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        assert!(
            closed_by_peer(&mut s, left.max(Duration::from_millis(10))),
            "a stream stopped short of a block was kept open"
        );
    }
}

/// C9: a mapped user asks an endpoint to push a file to an address of their choice (a plain
/// TCP listener, not a longhaul endpoint). The endpoint used to connect and stream the file
/// there. Now it first checks, with a TLS handshake, that the target is an endpoint of its CA
/// named as asked, and refuses otherwise (exit 5 class, "push target ... refused"); the
/// listener never receives a data stream. A real third-party copy between two endpoints of
/// the CA still works.
#[test]
fn an_endpoint_pushes_only_to_endpoints_of_its_ca() {
    let t = tempfile::tempdir().unwrap();
    let pki = Pki::new(&t.path().join("pki"));
    let args: Vec<String> = pki.serve_args();
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let a = serve(&t.path().join("a"), &args, &[]);
    let b = serve(&t.path().join("b"), &args, &[]);
    let secret = write_file(&a.root.join("secret.dat"), 5, 200_000);
    // The legitimate third-party copy.
    assert_ok(&pki.cp("alice", &[&a.tls_url("secret.dat"), &b.tls_url("copy.dat")]));
    assert_eq!(std::fs::read(b.root.join("copy.dat")).unwrap(), secret);
    // The attack: a push to a listener that records what it receives.
    let trap = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let trap_addr = trap.local_addr().unwrap().to_string();
    let received = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
    let r2 = received.clone();
    std::thread::spawn(move || {
        for c in trap.incoming() {
            let Ok(mut c) = c else { return };
            let r = r2.clone();
            std::thread::spawn(move || {
                c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let mut buf = [0u8; 4096];
                while let Ok(n) = c.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    r.lock().unwrap().extend_from_slice(&buf[..n]);
                }
            });
        }
    });
    let rt = tokio::runtime::Runtime::new().unwrap();
    let reply = rt.block_on(async {
        let creds = transfer::tls::Credentials::load(&transfer::tls::CredentialPaths {
            cert: pki.dir.join("alice.pem"),
            key: pki.dir.join("alice.key"),
            ca: pki.dir.join("ca/ca.pem"),
        })
        .unwrap();
        let tls = transfer::conn::ClientTls {
            config: transfer::tls::client_config(&creds).unwrap(),
        };
        let port: u16 = a.addr.rsplit_once(':').unwrap().1.parse().unwrap();
        let mut s =
            transfer::conn::connect_control("localhost", port, Some(&tls), &Default::default())
                .await
                .unwrap();
        let push = wire::control::PushTarget {
            addr: trap_addr.clone(),
            server_name: "localhost".into(),
            session: [3; 16],
            key: [4; 32],
            peer_limits: Default::default(),
        };
        s.writer
            .send_request(&wire::control::Request::OpenSource {
                session: [5; 16],
                key: [6; 32],
                path: "secret.dat".into(),
                recursive: false,
                range: None,
                options: Default::default(),
                push: Some(Box::new(push)),
                files: Vec::new(),
                grant: None,
            })
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(20), s.reader.response())
            .await
            .expect("an answer")
            .unwrap()
    });
    match reply {
        wire::control::Response::Error(e) => {
            assert!(e.message.contains("push target"), "{}", e.message);
            assert_eq!(e.kind, wire::error::ErrorKind::PermissionDenied);
        }
        other => panic!("the push was not refused: {other:?}"),
    }
    std::thread::sleep(Duration::from_millis(300));
    let got = received.lock().unwrap().clone();
    assert!(
        !got.windows(8).any(|w| w == wire::control::DATA_MAGIC),
        "a data stream reached the trap"
    );
    assert!(
        !got.windows(16)
            .any(|w| secret.windows(16).next() == Some(w)),
        "file data reached the trap"
    );
}

/// A newer transfer takes a file over from an older one still writing it only when both act
/// for the same user: mallory, mapped to another account, starting an upload to the name
/// alice is uploading to, does not abort alice's upload (it is refused instead).
#[test]
fn another_user_cannot_take_over_a_file_being_written() {
    let t = tempfile::tempdir().unwrap();
    let pki = Pki::new(&t.path().join("pki"));
    let mut mapfile = std::fs::read_to_string(pki.dir.join("mapfile")).unwrap();
    mapfile += "\"/O=longhaul/OU=users/CN=mallory\" nobody\n";
    std::fs::write(pki.dir.join("mapfile"), mapfile).unwrap();
    let mut args: Vec<String> = pki.serve_args();
    args.extend(["--checkpoint-interval".into(), "50ms".into()]);
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let a = serve(&t.path().join("a"), &args, &[]);
    std::fs::create_dir_all(a.root.join("shared")).unwrap();
    let src = t.path().join("report");
    write_file(&src, 8, 24 << 20);
    let url = a.tls_url("shared/report");
    let alice = haul()
        .args([
            "cp",
            "--json",
            "--progress",
            "never",
            "--retries",
            "0",
            "--rate",
            "40M",
        ])
        .args([
            "--cert",
            &pki.p("alice.pem"),
            "--key",
            &pki.p("alice.key"),
            "--ca",
            &pki.p("ca/ca.pem"),
        ])
        .arg(&src)
        .arg(&url)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        wait_for(Duration::from_secs(10), || a
            .root
            .join("shared/.report.haul-ledger")
            .exists()),
        "alice's upload checkpointed"
    );
    let other = t.path().join("other");
    write_file(&other, 9, 1 << 20);
    let out = pki.cp(
        "mallory",
        &["--retries", "0", other.to_str().unwrap(), &url],
    );
    assert_ne!(
        out.status.code(),
        Some(0),
        "mallory's upload over alice's went through"
    );
    let alice = alice.wait_with_output().unwrap();
    assert_ok(&alice);
    assert_same_file(&src, &a.root.join("shared/report"));
}

/// C12: a stream that trickles a block's bytes, a little every few seconds (never idle long
/// enough for the frame idle time), still gives its buffer back: a whole block must arrive
/// within four idle times (here 4 x 5 s).
#[test]
fn a_trickled_block_is_cut_after_four_idle_times() {
    let t = tempfile::tempdir().unwrap();
    let a = serve(&t.path().join("a"), &["--insecure"], &[]);
    let options = wire::control::SessionOptions {
        block_size: 16 << 20,
        stall_timeout_ms: 5_000,
        ..Default::default()
    };
    let (_control, session, key) = open_attacker_session(&a.addr, options);
    // Half a 16 MiB block at once, then 256 KiB every 3 s: the rest would take 96 s.
    let mut s = stream_short_of_a_block(&a.addr, session, key, 0, 16 << 20, 8 << 20).unwrap();
    let started = Instant::now();
    let chunk = vec![0x5au8; 256 << 10];
    let mut closed = false;
    while started.elapsed() < Duration::from_secs(60) {
        if s.write_all(&chunk).is_err() || closed_by_peer(&mut s, Duration::from_secs(3)) {
            closed = true;
            break;
        }
    }
    assert!(closed, "a trickling stream kept its block buffer for 60 s");
    assert!(
        started.elapsed() >= Duration::from_secs(15),
        "closed after {:?}, before the block deadline",
        started.elapsed()
    );
}

/// Buffer budgets smaller than the largest block would stall every transfer: refused (exit 2).
#[test]
fn buffer_budgets_smaller_than_a_block_are_refused() {
    let t = tempfile::tempdir().unwrap();
    for args in [
        vec!["--session-buffer", "1MiB"],
        vec!["--session-buffer", "64MiB", "--max-buffer", "32MiB"],
    ] {
        let out = haul()
            .args(["serve", "--insecure", "--listen", "127.0.0.1:0", "--root"])
            .arg(t.path())
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("-buffer"), "{}", stderr(&out));
    }
}
