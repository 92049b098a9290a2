//! Attacks on the grid's control plane (issue 11, section C), each replayed against a real
//! metadata server and storage nodes on loopback, and what must happen instead: the attacker
//! gets nothing it may not have, with a message that tells an honest user what to do.
//!
//! The grid is the one of `tests/grid.rs` (`common::grid`): a metadata server and four nodes
//! enrolled by fingerprint, users alice and bob (group atlas) and mallory (not mapped).

mod common;
use api::meta as pb;
use common::grid::*;
use common::*;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use transfer::TransferError;
use transfer::client::{CopyOptions, Peer, SourceRequest};
use transfer::store::{Destination, Root};
use wire::control::ListedFile;
use wire::grant::SignedGrant;

/// A log without its colour escapes.
fn plain(log: &str) -> String {
    let mut out = String::with_capacity(log.len());
    let mut it = log.chars();
    while let Some(c) = it.next() {
        if c == '\u{1b}' {
            for d in it.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Waits (bounded) until `proc`'s log contains `needle`; returns the log (without colours).
#[track_caller]
fn wait_log(proc: &Proc, needle: &str) -> String {
    let mut text = String::new();
    let found = wait_for(SETTLE, || {
        text = plain(&proc.log_text());
        let r = text.contains(needle);
        if !r {
            std::thread::sleep(Duration::from_millis(100));
        }
        r
    });
    assert!(found, "log lacks {needle:?}:\n{text}");
    text
}

/// A certificate signed by the grid's CA with any subject and usage, as a careless or
/// compromised issuing tool could make it: writes `pki/OUT.pem` and `pki/OUT.key`.
fn forge_cert(g: &Grid, out: &str, ou: &str, cn: &str, server: bool) {
    use rcgen::{
        CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose as E, Issuer,
        KeyPair, KeyUsagePurpose,
    };
    let dir = g.path().join("pki");
    let ca_pem = std::fs::read_to_string(dir.join("ca/ca.pem")).unwrap();
    let ca_key =
        KeyPair::from_pem(&std::fs::read_to_string(dir.join("ca/ca.key")).unwrap()).unwrap();
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key).unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "longhaul");
    dn.push(DnType::OrganizationalUnitName, ou);
    dn.push(DnType::CommonName, cn);
    p.distinguished_name = dn;
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = if server {
        vec![E::ServerAuth, E::ClientAuth]
    } else {
        vec![E::ClientAuth]
    };
    p.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate().unwrap();
    let cert = p.signed_by(&key, &issuer).unwrap();
    std::fs::write(dir.join(format!("{out}.pem")), cert.pem()).unwrap();
    std::fs::write(dir.join(format!("{out}.key")), key.serialize_pem()).unwrap();
}

fn append(path: &Path, line: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    writeln!(f, "{line}").unwrap();
}

/// The address a node is registered with, as `haul nodes` shows it.
fn registered_address(g: &Grid, name: &str) -> Option<String> {
    g.nodes_json()
        .iter()
        .find(|n| n["name"] == name)
        .and_then(|n| n["address"].as_str().map(String::from))
}

// ---------------------------------------------------------------------------------------------
// C2: node identity comes from the parsed certificate

/// `haul cert issue --user 'eve/OU=hosts/CN=node3'` made a certificate that the metadata server
/// took for node3: such names are refused (exit 2) before anything is signed.
#[test]
fn cert_issue_refuses_names_that_would_forge_a_subject() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let mut c = haul_clean();
        c.args(args).current_dir(dir.path());
        run_bounded(c, CMD_TIMEOUT)
    };
    assert_ok(&run(&["ca", "init", "--dir", "ca"]));
    let out = run(&[
        "cert",
        "issue",
        "--ca",
        "ca",
        "--user",
        "eve/OU=hosts/CN=node3",
        "--out",
        "eve",
    ]);
    assert_exit(&out, 2, "contains '/'");
    for (flag, value) in [
        ("--user", "eve,OU=hosts"),
        ("--user", "a=b"),
        ("--user", "quote\"d"),
        ("--user", "back\\slash"),
        ("--user", "new\nline"),
        ("--user", ""),
        ("--host", "node3/OU=hosts"),
        ("--host", "node 3"),
    ] {
        let out = run(&["cert", "issue", "--ca", "ca", flag, value, "--out", "x"]);
        assert_exit(&out, 2, flag);
    }
    let out = run(&[
        "cert",
        "issue",
        "--ca",
        "ca",
        "--user",
        "eve",
        "--org",
        "x/OU=hosts",
        "--out",
        "x",
    ]);
    assert_exit(&out, 2, "--org");
    let out = run(&["ca", "init", "--dir", "ca2", "--org", "a,b"]);
    assert_exit(&out, 2, "--org");
    assert!(!dir.path().join("eve.pem").exists() && !dir.path().join("x.pem").exists());
}

/// The same attack with a certificate some CA did sign: a user certificate whose CN spells
/// `/OU=hosts/CN=a1` is no host certificate, so it cannot register as node a1 and never gets
/// a1's capability key; a1 keeps its registration.
#[test]
fn a_user_certificate_spelling_a_host_subject_cannot_register_as_that_node() {
    let g = Grid::start();
    let before = registered_address(&g, "a1").expect("a1 registered");
    forge_cert(&g, "eve", "users", "eve/OU=hosts/CN=a1", false);
    let mut eve = g.new_node("eve-as-a1", "A");
    g.start_node_with(&mut eve, "eve", &["--name", "a1"]);
    let log = wait_log(eve.proc.as_ref().unwrap(), "registration refused");
    assert!(
        log.contains("is a user") || log.contains("mapfile"),
        "{log}"
    );
    assert!(!log.contains(" registered node="), "{log}");
    // Even with OU=hosts and the server usage, a CN that is no host name names no node.
    forge_cert(&g, "eve2", "hosts", "eve/OU=hosts/CN=a1", true);
    let mut eve2 = g.new_node("eve2-as-a1", "A");
    g.start_node_with(&mut eve2, "eve2", &["--name", "a1"]);
    wait_log(eve2.proc.as_ref().unwrap(), "registration refused");
    assert!(!plain(&eve2.proc.as_ref().unwrap().log_text()).contains(" registered node="));
    assert_eq!(registered_address(&g, "a1"), Some(before));
}

/// A second host certificate for an existing node's name (validly issued by the CA, another
/// key) does not get the node's capability key: refused with the line that would enrol it;
/// once that line is added it registers with a new key.
#[test]
fn another_certificate_for_a_registered_node_gets_no_key_until_enrolled() {
    let g = Grid::start();
    let before = registered_address(&g, "a1").expect("a1 registered");
    let issued = g.issue(&["--host", "a1", "--host", "127.0.0.1", "--out", "a1-again"]);
    let line = enrolment_line(&issued);
    let mut twin = g.new_node("a1-twin", "A");
    g.start_node_with(&mut twin, "a1-again", &[]);
    let log = wait_log(twin.proc.as_ref().unwrap(), "registration refused");
    assert!(log.contains("is not the one enrolled"), "{log}");
    assert!(
        log.contains(&line),
        "the refusal names the line to add ({line}): {log}"
    );
    assert_eq!(registered_address(&g, "a1"), Some(before.clone()));
    // The administrator enrols the new certificate: it registers, with a new key.
    append(&g.pki("enrolled-nodes"), &line);
    wait_log(twin.proc.as_ref().unwrap(), " registered node=");
    let ok = wait_for(SETTLE, || {
        std::thread::sleep(Duration::from_millis(100));
        registered_address(&g, "a1") == Some(twin.addr.clone())
    });
    assert!(
        ok,
        "a1 not re-registered by the enrolled certificate: {:?}",
        g.nodes_json()
    );
    let meta = plain(&g.meta.as_ref().unwrap().log_text());
    assert!(meta.contains("node a1 refused"), "{meta}");
}

// ---------------------------------------------------------------------------------------------
// C3: enrolment

/// A host certificate of the CA that no administrator listed cannot join; the refusal names
/// the exact line (with its fingerprint) to add, and the list is re-read when it changes.
#[test]
fn unlisted_nodes_are_refused_with_the_line_to_add_until_enrolled() {
    let g = Grid::start();
    let issued = g.issue(&["--host", "c1", "--host", "127.0.0.1", "--out", "c1"]);
    let line = enrolment_line(&issued);
    assert!(
        line.starts_with("c1 sha256:") && line.len() == "c1 sha256:".len() + 64,
        "{line}"
    );
    let mut c1 = g.new_node("c1", "C");
    g.start_node(&mut c1);
    let log = wait_log(c1.proc.as_ref().unwrap(), "registration refused");
    assert!(log.contains("not enrolled"), "{log}");
    assert!(log.contains(&format!("add the line `{line}`")), "{log}");
    assert_eq!(registered_address(&g, "c1"), None);
    append(&g.pki("enrolled-nodes"), &line);
    let ok = wait_for(SETTLE, || {
        std::thread::sleep(Duration::from_millis(100));
        g.nodes_json()
            .iter()
            .any(|n| n["name"] == "c1" && n["up"] == true)
    });
    assert!(ok, "c1 not admitted after enrolment: {:?}", g.nodes_json());
}

/// The metadata server's own certificate is a host certificate of the CA, but it may never
/// join as a node (it would receive users' files), even when its name is listed.
#[test]
fn the_metadata_servers_own_certificate_cannot_join_as_a_node() {
    let g = Grid::start();
    append(&g.pki("enrolled-nodes"), "127.0.0.1");
    let mut m = g.new_node("meta-as-node", "A");
    g.start_node_with(&mut m, "meta", &["--name", "127.0.0.1"]);
    let log = wait_log(m.proc.as_ref().unwrap(), "registration refused");
    assert!(log.contains("metadata server's own certificate"), "{log}");
    assert_eq!(registered_address(&g, "127.0.0.1"), None);
}

// ---------------------------------------------------------------------------------------------
// C4: the catalog holds every node's capability key

/// `catalog.db` was created 0644 in a 0755 directory: any local user of the metadata host could
/// read the node keys and forge capabilities.
#[test]
fn the_metadata_servers_data_directory_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let g = Grid::start();
    let dir = g.path().join("meta-data");
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700);
    for f in [
        "catalog.db",
        "catalog.db-wal",
        "catalog.db-shm",
        "meta.lock",
    ] {
        let p = dir.join(f);
        if p.exists() {
            assert_eq!(mode(&p), 0o600, "{f}");
        } else {
            assert_ne!(f, "catalog.db", "no catalog in {}", dir.display());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// C11: capabilities are bound to their holder and short-lived

/// A user's own client of the grid (metadata server and nodes), as an attacker would write
/// one: capabilities in hand, talking to nodes directly.
struct Direct {
    rt: tokio::runtime::Runtime,
    tls: Arc<rustls::ClientConfig>,
    meta: ::grid::MetaClient,
}

impl Direct {
    fn new(g: &Grid, user: &str) -> Self {
        let creds = transfer::tls::Credentials::load(&transfer::tls::CredentialPaths {
            cert: g.pki(&format!("{user}.pem")),
            key: g.pki(&format!("{user}.key")),
            ca: g.pki("ca/ca.pem"),
        })
        .unwrap();
        let tls = transfer::tls::client_config(&creds).unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let meta = rt
            .block_on(::grid::MetaClient::connect(
                &Peer::parse(&g.meta_addr).unwrap(),
                tls.clone(),
            ))
            .unwrap();
        Self { rt, tls, meta }
    }

    /// `OpenRead` of one file: the file and its first node's address and capability.
    fn open_read(&self, path: &str) -> (pb::ReadSource, String, pb::Capability) {
        let r = self
            .rt
            .block_on(self.meta.open_read(pb::OpenReadRequest {
                paths: vec![path.into()],
                ..Default::default()
            }))
            .unwrap();
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        let n = r.nodes[0].clone();
        (r.files[0].clone(), n.address, n.capability.unwrap())
    }

    /// Downloads `file` from the node at `addr`, presenting `cap`, into `dest` (a directory).
    fn read(
        &self,
        addr: &str,
        cap: &pb::Capability,
        file: &pb::ReadSource,
        dest: &Path,
    ) -> Result<(), TransferError> {
        let listed = ListedFile {
            locator: file.id.to_string(),
            name: "got".into(),
            size: file.size,
            mode: 0o644,
            mtime: Default::default(),
            expect: vec![],
        };
        let opts = self.opts();
        let dest = Destination::resolve(&Root::Ambient, dest, true).map_err(TransferError::from)?;
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        self.rt
            .block_on(transfer::client::download(
                &Peer::parse(addr)?,
                SourceRequest {
                    files: vec![listed],
                    grant: Some(SignedGrant {
                        token: cap.token.clone(),
                        mac: cap.mac.clone(),
                    }),
                    ..Default::default()
                },
                Arc::new(Root::Ambient),
                Arc::new(dest),
                &opts,
                Default::default(),
                transfer::client::AttemptContext {
                    counters: Arc::new(Default::default()),
                    events: tx,
                    cancel: CancellationToken::new(),
                },
            ))
            .map(|_| ())
    }

    /// `CreateFiles` of one file: its node's address, its id and the write capability.
    fn create(&self, path: &str, size: u64) -> (String, i64, pb::Capability) {
        let r = self
            .rt
            .block_on(self.meta.create_files(pb::CreateFilesRequest {
                files: vec![pb::NewFile {
                    path: path.into(),
                    size,
                    mode: 0o644,
                    mtime_ns: 1_700_000_000_000_000_000,
                    private: false,
                }],
                overwrite: true,
                ..Default::default()
            }))
            .unwrap();
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        let p = r.placements[0].clone();
        (p.address, p.ids[0], p.capability.unwrap())
    }

    /// Uploads local file `src` as file `id` to the node at `addr`, presenting `cap`; the
    /// error of the session or of the file.
    fn write(&self, addr: &str, cap: &pb::Capability, id: i64, src: &Path) -> Result<(), String> {
        let size = std::fs::metadata(src).unwrap().len();
        let entry = transfer::store::SourceEntry {
            rel: id.to_string(),
            kind: wire::data::EntryKind::File,
            size,
            mode: 0o644,
            mtime: wire::data::Timestamp {
                secs: 1_700_000_000,
                nanos: 0,
            },
            locator: src.to_path_buf(),
            expect: vec![],
            known_crcs: None,
        };
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let r = self.rt.block_on(transfer::client::upload(
            vec![entry],
            &Peer::parse(addr).unwrap(),
            transfer::client::SinkRequest {
                grant: Some(SignedGrant {
                    token: cap.token.clone(),
                    mac: cap.mac.clone(),
                }),
                ..Default::default()
            },
            &self.opts(),
            Default::default(),
            transfer::client::AttemptContext {
                counters: Arc::new(Default::default()),
                events: tx,
                cancel: CancellationToken::new(),
            },
        ));
        r.map_err(|e| e.to_string())?;
        while let Ok(ev) = rx.try_recv() {
            if let transfer::progress::Event::FileFailed { error, .. } = ev {
                return Err(error.message);
            }
        }
        Ok(())
    }

    fn opts(&self) -> CopyOptions {
        CopyOptions {
            recursive: false,
            range: None,
            session: Default::default(),
            retry: wire::retry::RetryPolicy {
                max_attempts: 1,
                ..Default::default()
            },
            tls: Some(transfer::conn::ClientTls {
                config: self.tls.clone(),
            }),
            link_bps: 1_000_000_000,
            checkpoint_interval: Duration::from_secs(5),
            control_pool: None,
            peer_tls: Vec::new(),
            zero_copy: false,
            trace: None,
            receiver_evidence: false,
        }
    }

    fn renew(&self, node: &str, op: &str, ids: Vec<i64>) -> Result<pb::Capability, TransferError> {
        self.rt.block_on(self.meta.renew(node, op, ids))
    }
}

/// Capabilities were bearer tokens valid for an hour: a user not in the mapfile used another
/// user's. Now a capability serves only the certificate it was issued to, lasts `--grant-ttl`,
/// and a renewal checks permissions again (a chmod takes effect at the next renewal).
#[test]
fn a_capability_serves_only_its_holder_and_ends_with_its_ttl() {
    let g = Grid::start_with(&["--grant-ttl", "5s"]);
    g.ok("alice", &["mkdir", "/alice"]);
    let src = g.path().join("f.bin");
    let data = write_file(&src, 7, 100_000);
    assert_ok(&g.cp("alice", &[src.to_str().unwrap(), &g.url("/alice/f.bin")]));
    let alice = Direct::new(&g, "alice");
    let (file, addr, cap) = alice.open_read("/alice/f.bin");
    let issued = std::time::Instant::now();
    // mallory (not even mapped) and bob (a user of the grid) present alice's capability.
    for thief in ["mallory", "bob"] {
        let d = tempfile::tempdir_in(g.path()).unwrap();
        let err = Direct::new(&g, thief)
            .read(&addr, &cap, &file, d.path())
            .unwrap_err();
        assert!(err.is_refusal(), "{thief}: {err}");
        assert!(
            err.to_string().contains("another certificate"),
            "{thief}: {err}"
        );
        assert!(!d.path().join("got").exists());
    }
    // Its holder may use it.
    let d = tempfile::tempdir_in(g.path()).unwrap();
    alice.read(&addr, &cap, &file, d.path()).unwrap();
    assert_eq!(std::fs::read(d.path().join("got")).unwrap(), data);
    // After its time, not even the holder.
    std::thread::sleep(
        Duration::from_secs(5).saturating_sub(issued.elapsed()) + Duration::from_millis(500),
    );
    let d = tempfile::tempdir_in(g.path()).unwrap();
    let err = alice.read(&addr, &cap, &file, d.path()).unwrap_err();
    assert!(err.to_string().contains("expired"), "{err}");
    // A renewal checks permissions again: bob may read the file, until alice takes it away.
    let bob = Direct::new(&g, "bob");
    let (_, _, _) = bob.open_read("/alice/f.bin");
    let node = g.where_(&["/alice/f.bin".to_string()])[0]["replicas"][0]["node"]
        .as_str()
        .unwrap()
        .to_string();
    bob.renew(&node, "read", vec![file.id]).unwrap();
    g.ok("alice", &["chmod", "600", "/alice/f.bin"]);
    let err = bob.renew(&node, "read", vec![file.id]).unwrap_err();
    assert!(err.is_refusal(), "{err}");
    // Nor may anyone renew a capability to write a file that is already complete.
    let err = alice.renew(&node, "write", vec![file.id]).unwrap_err();
    assert!(err.is_refusal(), "{err}");
}

/// With capabilities valid for 2 s, a download whose second node session starts after that
/// still succeeds: the client renews the capability before it ends.
#[test]
fn a_download_that_outlasts_its_capabilities_renews_them() {
    let g = Grid::start_with(&["--grant-ttl", "2s"]);
    g.ok("alice", &["mkdir", "/alice"]);
    let src = g.path().join("src").join("ds");
    for i in 0..4 {
        write_file(&src.join(format!("f{i}")), i, 1 << 20);
    }
    assert_ok(&g.cp(
        "alice",
        &["-r", src.to_str().unwrap(), &g.url("/alice"), "--site", "A"],
    ));
    let holders: std::collections::BTreeSet<String> = g
        .where_(
            &(0..4)
                .map(|i| format!("/alice/ds/f{i}"))
                .collect::<Vec<_>>(),
        )
        .iter()
        .map(|f| f["replicas"][0]["node"].as_str().unwrap().to_string())
        .collect();
    assert!(holders.len() > 1, "files on one node only: {holders:?}");
    // One node session at a time, paced to ~1 MB/s: the second one starts after ~2 s.
    let dl = tempfile::tempdir_in(g.path()).unwrap();
    let url = g.url("/alice/ds");
    let mut cmd = g.cmd(
        "alice",
        &[
            "cp",
            "--json",
            "--progress",
            "never",
            "-r",
            &url,
            dl.path().to_str().unwrap(),
            "--node-sessions",
            "1",
            "--rate",
            "8M",
        ],
    );
    cmd.env("HAUL_LOG", "grid=debug");
    let out = run_bounded(cmd, CMD_TIMEOUT);
    assert_ok(&out);
    assert_same_tree(&src, &dl.path().join("ds"));
    assert!(
        stderr(&out).contains("renewing a capability"),
        "{}",
        stderr(&out)
    );
}

// ---------------------------------------------------------------------------------------------
// C7: a write capability replayed after the commit

/// Replaying the write capability of a committed file made the node rename the new data over
/// the verified replica, the metadata server refuse it, and the node delete it: the file was
/// lost while the catalog said complete. Now the node refuses to write over the replica and
/// the replica stays as it was.
#[test]
fn a_write_capability_replayed_after_the_commit_leaves_the_replica_alone() {
    let g = Grid::start();
    g.ok("alice", &["mkdir", "/alice"]);
    let good = g.path().join("good.bin");
    let good_data = write_file(&good, 1, 200_000);
    let alice = Direct::new(&g, "alice");
    let (addr, id, cap) = alice.create("/alice/r.bin", 200_000);
    alice.write(&addr, &cap, id, &good).unwrap();
    let w = g.where_(&["/alice/r.bin".to_string()]);
    let node = w[0]["replicas"][0]["node"].as_str().unwrap().to_string();
    assert_eq!(w[0]["replicas"][0]["state"], "complete", "{w:?}");
    // The replay, with other data of the same size and of another size.
    for (seed, len) in [(2, 200_000), (3, 1000)] {
        let evil = g.path().join(format!("evil{seed}.bin"));
        write_file(&evil, seed, len);
        let err = alice.write(&addr, &cap, id, &evil).unwrap_err();
        assert!(err.contains("already has a replica"), "{err}");
    }
    // Even the same data again changes nothing.
    let _ = alice.write(&addr, &cap, id, &good);
    assert_eq!(
        std::fs::read(g.replica_file(&node, "/alice/r.bin")).unwrap(),
        good_data
    );
    let w = g.where_(&["/alice/r.bin".to_string()]);
    assert_eq!(w[0]["replicas"].as_array().unwrap().len(), 1, "{w:?}");
    assert_eq!(w[0]["replicas"][0]["state"], "complete", "{w:?}");
    // Wait past a heartbeat: the node deleted nothing.
    std::thread::sleep(Duration::from_secs(1));
    let back = g.path().join("back.bin");
    assert_ok(&g.cp("alice", &[&g.url("/alice/r.bin"), back.to_str().unwrap()]));
    assert_same_file(&good, &back);
}

// ---------------------------------------------------------------------------------------------
// C8: replicas left "writing" when the metadata server is killed during `haul replicate`

/// Sends `sig` (`STOP`, `CONT`) to a running node.
fn signal(g: &Grid, node: &str, sig: &str) {
    let pid = g.node(node).proc.as_ref().expect("node running").child.id();
    let st = std::process::Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .status()
        .unwrap();
    assert!(st.success(), "kill -{sig} {pid}");
}

/// The metadata server killed during `haul replicate` left the replicas it was making in state
/// `writing` forever, and every later `replicate` of those files failed with exit 6 (their
/// nodes counted as busy). A restarted server drops them.
#[test]
fn replicas_left_writing_by_a_killed_metadata_server_do_not_block_their_nodes() {
    let mut g = Grid::start();
    g.ok("alice", &["mkdir", "/alice"]);
    let f = g.path().join("f.bin");
    write_file(&f, 9, 1 << 20);
    assert_ok(&g.cp(
        "alice",
        &[f.to_str().unwrap(), &g.url("/alice/f.bin"), "--site", "A"],
    ));
    let path = vec!["/alice/f.bin".to_string()];
    let holder = g.where_(&path)[0]["replicas"][0]["node"]
        .as_str()
        .unwrap()
        .to_string();
    let others: Vec<String> = NODES
        .iter()
        .map(|(n, _)| n.to_string())
        .filter(|n| *n != holder)
        .collect();
    // The destinations hang (stopped): the copies to them stay "writing".
    for n in &others {
        signal(&g, n, "STOP");
    }
    let replicate = [
        "replicate",
        "--copies",
        "4",
        "--progress",
        "never",
        "--json",
        "/alice/f.bin",
    ];
    let child = g
        .cmd("alice", &replicate)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let writing = |g: &Grid| {
        g.where_(&path)[0]["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["state"] == "writing")
            .count()
    };
    let ok = wait_for(SETTLE, || {
        std::thread::sleep(Duration::from_millis(50));
        writing(&g) >= 1
    });
    // (The holder sends two sessions at once: two of the three copies are under way.)
    if !ok {
        let w = g.where_(&path);
        g.kill_meta();
        let out = child.wait_with_output().unwrap();
        panic!(
            "copies never started: {w:?}\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    g.kill_meta();
    // Issue 11 C15: the server dying is "connection lost" (exit 4), not a protocol error (9),
    // and never a success.
    let out = child.wait_with_output().unwrap();
    assert_exit(&out, 4, "metadata server");
    for n in &others {
        signal(&g, n, "CONT");
    }
    let restarted = now_ms();
    let addr = g.meta_addr.clone();
    g.start_meta(&addr);
    g.wait_nodes_up(restarted);
    assert_eq!(writing(&g), 0, "{:?}", g.where_(&path));
    let j = g.json("alice", &replicate);
    assert_eq!(j["failures"].as_array().unwrap().len(), 0, "{j}");
    assert!(all_have(&g.where_(&path), 4, &[]), "{:?}", g.where_(&path));
}

// ---------------------------------------------------------------------------------------------
// C10: copies of private files travel privately

/// The protection of each replication session the metadata server ran so far, in order.
fn replication_sessions(g: &Grid) -> Vec<String> {
    plain(&g.meta.as_ref().unwrap().log_text())
        .lines()
        .filter(|l| l.contains("replication session src="))
        .map(|l| {
            l.split("protect=")
                .nth(1)
                .unwrap_or("?")
                .split_whitespace()
                .next()
                .unwrap_or("?")
                .to_string()
        })
        .collect()
}

/// Replication, policies and repairs sent every file in clear, also files uploaded with
/// `--protect private`. Such files now keep their privacy: every copy of them travels over
/// TLS; `replicate --protect private` and a policy's `--protect private` make any copy private.
#[test]
fn copies_of_files_that_arrived_privately_travel_privately() {
    let g = Grid::start();
    g.ok("alice", &["mkdir", "/alice"]);
    g.ok("alice", &["mkdir", "/alice/open"]);
    let secret = g.path().join("secret.bin");
    write_file(&secret, 11, 300_000);
    let open = g.path().join("open.bin");
    write_file(&open, 12, 300_000);
    let up = |src: &Path, dst: &str, protect: &str| {
        assert_ok(&g.cp(
            "alice",
            &[
                src.to_str().unwrap(),
                &g.url(dst),
                "--site",
                "A",
                "--protect",
                protect,
            ],
        ));
    };
    up(&secret, "/alice/secret.bin", "private");
    up(&open, "/alice/open/open.bin", "clear");
    let st = g.json(
        "alice",
        &[
            "stat",
            "--json",
            "/alice/secret.bin",
            "/alice/open/open.bin",
        ],
    );
    assert_eq!(st["entries"][0]["protect"], "private", "{st}");
    assert_eq!(st["entries"][1]["protect"], "clear", "{st}");
    let replicate = |path: &str, copies: &str, extra: &[&str]| {
        let mut a = vec![
            "replicate",
            "--copies",
            copies,
            "--site",
            "B",
            "--progress",
            "never",
        ];
        a.extend_from_slice(extra);
        a.push(path);
        g.ok("alice", &a);
    };
    // Replicated without asking for privacy: the private file's copy is private anyway.
    replicate("/alice/secret.bin", "2", &[]);
    assert_eq!(replication_sessions(&g), ["Private"]);
    replicate("/alice/open/open.bin", "2", &[]);
    assert_eq!(replication_sessions(&g), ["Private", "Clear"]);
    // Asked for: private.
    replicate("/alice/open/open.bin", "3", &["--protect", "private"]);
    assert_eq!(replication_sessions(&g), ["Private", "Clear", "Private"]);
    // A policy asking for privacy: the reconciler's copies are private.
    g.ok(
        "alice",
        &[
            "policy",
            "set",
            "/alice/open",
            "--copies",
            "4",
            "--protect",
            "private",
        ],
    );
    let listed = g.json("alice", &["policy", "list", "--json"]);
    assert_eq!(listed["policies"][0]["protect"], "private", "{listed}");
    let ok = wait_for(SETTLE, || {
        std::thread::sleep(Duration::from_millis(200));
        replication_sessions(&g).len() == 4
    });
    assert!(
        ok,
        "the reconciler made no copy: {:?}",
        replication_sessions(&g)
    );
    assert_eq!(replication_sessions(&g)[3], "Private");
    // Reads of the private file are private too, and give the data.
    let back = g.path().join("secret.back");
    assert_ok(&g.cp(
        "alice",
        &[&g.url("/alice/secret.bin"), back.to_str().unwrap()],
    ));
    assert_same_file(&secret, &back);
}

// ---------------------------------------------------------------------------------------------
// C14: names in directories one may not read

/// `haul status`, `haul policy list` and the dashboard's events showed paths inside
/// directories the caller could not read (and the dashboard needs no certificate at all).
/// `haul ls` printed control characters in names raw.
#[test]
fn private_names_do_not_leak_and_names_are_printed_escaped() {
    let g = Grid::start();
    g.ok("alice", &["mkdir", "-m", "700", "/alice"]);
    g.ok("alice", &["mkdir", "/alice/secret-project"]);
    g.ok("alice", &["mkdir", "-m", "755", "/shared"]);
    for dir in ["/alice/secret-project", "/shared"] {
        g.ok("alice", &["policy", "set", dir, "--copies", "2"]);
    }
    let text = |v: &serde_json::Value| v.to_string();
    // alice sees her own.
    let st = g.json("alice", &["status", "--json"]);
    assert!(text(&st["policies"]).contains("secret-project"), "{st}");
    assert!(text(&st["events"]).contains("secret-project"), "{st}");
    // bob (same group, but /alice is 0700) sees only what he could list.
    let st = g.json("bob", &["status", "--json"]);
    assert!(!st.to_string().contains("secret-project"), "{st}");
    assert!(text(&st["policies"]).contains("/shared"), "{st}");
    assert!(text(&st["events"]).contains("/shared"), "{st}");
    let pl = g.json("bob", &["policy", "list", "--json"]);
    assert!(!pl.to_string().contains("secret-project"), "{pl}");
    assert!(pl.to_string().contains("/shared"), "{pl}");
    // The dashboard and its JSON: no private path, public ones still shown.
    for page in ["/api/status", "/"] {
        let body = g.http_get(page);
        assert!(!body.contains("secret-project"), "{page}: {body}");
        assert!(body.contains("/shared"), "{page}: {body}");
    }
    // Control characters in names are printed escaped, never raw.
    g.ok("alice", &["mkdir", "/shared/evil\u{1b}[2J\nname"]);
    let out = g.ok("bob", &["ls", "/shared"]);
    let ls = String::from_utf8_lossy(&out.stdout);
    assert!(ls.contains("evil\\u{1b}[2J\\nname"), "{ls:?}");
    assert!(!ls.contains('\u{1b}') && ls.lines().count() == 1, "{ls:?}");
    let out = g.ok("bob", &["stat", "/shared/evil\u{1b}[2J\nname"]);
    let stat = String::from_utf8_lossy(&out.stdout);
    assert!(!stat.contains('\u{1b}'), "{stat:?}");
    let out = g.run("bob", &["ls", "/shared/evil\u{1b}[2J\nname/nothing"]);
    assert!(!stderr(&out).contains('\u{1b}'), "{:?}", stderr(&out));
}

// ---------------------------------------------------------------------------------------------
// C15: exit codes and messages of the grid

/// An expired certificate, or one from another CA, used against the metadata server ended in
/// "transport error" and exit 9: it is an authentication failure (exit 5) with the reason.
#[test]
fn refused_certificates_at_the_metadata_server_exit_5_with_the_reason() {
    let g = Grid::start();
    g.issue(&[
        "--user",
        "old",
        "--out",
        "old",
        "--not-before",
        "2020-01-01T00:00:00Z",
        "--not-after",
        "2021-01-01T00:00:00Z",
    ]);
    let mut c = haul_clean();
    c.args(["ca", "init", "--dir", "otherca"])
        .current_dir(g.path().join("pki"));
    assert_ok(&run_bounded(c, CMD_TIMEOUT));
    let mut c = haul_clean();
    c.args([
        "cert", "issue", "--ca", "otherca", "--user", "alice", "--out", "forged",
    ])
    .current_dir(g.path().join("pki"));
    assert_ok(&run_bounded(c, CMD_TIMEOUT));
    for (user, why) in [("old", "expired"), ("forged", "CA")] {
        for args in [&["ls", "/"][..], &["status"][..]] {
            let out = g.run(user, args);
            assert_exit(&out, 5, why);
            assert!(
                !stderr(&out).contains("transport error"),
                "{}",
                stderr(&out)
            );
        }
    }
}

/// Permission denied in a recursive read said "no healthy replica" (exit 4): it says
/// permission denied, exit 5.
#[test]
fn permission_denied_in_a_recursive_read_exits_5() {
    let g = Grid::start();
    g.ok("alice", &["mkdir", "-m", "755", "/alice"]);
    let (src, _) = sample_tree(g.path());
    assert_ok(&g.cp("alice", &["-r", src.to_str().unwrap(), &g.url("/alice")]));
    g.ok("alice", &["chmod", "600", "/alice/tree/small.txt"]);
    g.ok("alice", &["chmod", "700", "/alice/tree/sub"]);
    let dl = tempfile::tempdir_in(g.path()).unwrap();
    let out = g.cp(
        "bob",
        &["-r", &g.url("/alice/tree"), dl.path().to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    let j = json(&out);
    let failures = j["failures"].to_string();
    assert!(failures.contains("permission denied"), "{j}");
    assert!(!failures.contains("no healthy replica"), "{j}");
    // What bob may read arrived.
    assert_same_file(&src.join("big.bin"), &dl.path().join("tree/big.bin"));
}

/// C15, C16: a node whose disk fills named its own path (`/data/xx/yy/<id>`) in the message,
/// and failed the upload (exit 6) although other nodes had room. Now the upload places the
/// file on another node and says why, by the node's name. (A small tmpfs as the node's root:
/// needs root.)
#[test]
fn a_full_node_names_the_grid_path() {
    // The metadata server hears from nodes rarely here, so it does not know the disk filled.
    let g = Grid::start_with(&["--heartbeat", "30s", "--node-timeout", "120s"]);
    let Some(fs) = SmallFs::mount(&g.path().join("small"), "160M") else {
        testkit::skip!("mounting a tmpfs needs root");
    };
    let issued = g.issue(&["--host", "c1", "--host", "127.0.0.1", "--out", "c1"]);
    append(&g.pki("enrolled-nodes"), &enrolment_line(&issued));
    let mut c1 = g.new_node("c1", "C");
    c1.root = fs.path.join("root");
    g.start_node(&mut c1);
    let ok = wait_for(SETTLE, || {
        std::thread::sleep(Duration::from_millis(100));
        g.nodes_json()
            .iter()
            .any(|n| n["name"] == "c1" && n["up"] == true)
    });
    assert!(ok, "c1 not up: {:?}", g.nodes_json());
    // Fill the disk behind the metadata server's back: 5 MiB left.
    let free = {
        let out = std::process::Command::new("df")
            .args(["--output=avail", "-B1"])
            .arg(&fs.path)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .nth(1)
            .and_then(|l| l.trim().parse::<u64>().ok())
            .unwrap()
    };
    {
        use std::io::Write;
        let f = std::fs::File::create(fs.path.join("filler")).unwrap();
        let mut w = std::io::BufWriter::new(f);
        let chunk = vec![7u8; 1 << 20];
        for _ in 0..(free.saturating_sub(5 << 20) >> 20) {
            w.write_all(&chunk).unwrap();
        }
        w.flush().unwrap();
    }
    g.ok("alice", &["mkdir", "/alice"]);
    let src = g.path().join("big.bin");
    write_file(&src, 3, 20 << 20);
    let out = g.cp(
        "alice",
        &[
            src.to_str().unwrap(),
            &g.url("/alice/big.bin"),
            "--site",
            "C",
        ],
    );
    // C16: the upload does not fail because one node is full: the file goes to a node with
    // room, and the notice names the node, never its internal paths.
    assert_ok(&out);
    let err = stderr(&out);
    assert!(err.contains("no space left"), "{err}");
    assert!(!err.contains("/data/"), "{err}");
    let w = g.where_(&["/alice/big.bin".to_string()]);
    let holders = format!("{w:?}");
    assert!(
        !holders.contains("\"c1\""),
        "placed on the full node: {holders}"
    );
    let back = g.path().join("back.bin");
    assert_ok(&g.cp("alice", &[&g.url("/alice/big.bin"), back.to_str().unwrap()]));
    assert_same_file(&src, &back);
    // Nothing half-written stays on the full node.
    assert!(partials(&c1.root).is_empty(), "{:?}", partials(&c1.root));
    // The node goes before its file system is unmounted.
    drop(c1);
}

/// C5: `haul run` is not a way around the namespace's permissions. alice keeps a file private
/// (0600 in a 0700 directory); runner runs a task on a node that holds it, and the task tries
/// to read alice's replica by its path on the node (ids are guessable), to list the spool, and
/// to use a descriptor the node inherited. Nothing works: the spool is the node's alone, the
/// task's own input comes through a link of its own, and no descriptor above stderr reaches
/// it. And a certificate mapped to a system account (`daemon`) runs nothing.
#[test]
fn tasks_reach_only_their_own_input() {
    if !testkit::is_root() {
        testkit::skip!("haul run needs the nodes to run as root to switch to another account");
    }
    if ensure_task_account().is_none() {
        testkit::skip!("the local account {TASK_ACCOUNT} does not exist and cannot be created");
    }
    // A descriptor without close-on-exec, inherited by the nodes the grid starts (as a
    // service manager's or a parent's pipe would be).
    // SAFETY: dup of stderr; the result is a plain descriptor this test owns.
    let leaked = unsafe { libc::dup(2) };
    assert!(leaked > 2);
    let g = Grid::start();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(g.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    g.ok("alice", &["mkdir", "/alice"]);
    g.ok("alice", &["chmod", "700", "/alice"]);
    g.ok("runner", &["mkdir", "/r"]);
    let secret = g.path().join("secret.txt");
    std::fs::write(&secret, "alice's secret\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_ok(&g.cp(
        "alice",
        &[
            secret.to_str().unwrap(),
            &g.url("/alice/secret.txt"),
            "--site",
            "A",
        ],
    ));
    let mine = g.path().join("mine.txt");
    std::fs::write(&mine, "runner's input\n").unwrap();
    assert_ok(&g.cp(
        "runner",
        &[mine.to_str().unwrap(), &g.url("/r/mine.txt"), "--site", "A"],
    ));
    // Both files on every node, so wherever the task runs, alice's replica is there too.
    for (who, p) in [("alice", "/alice/secret.txt"), ("runner", "/r/mine.txt")] {
        g.ok(
            who,
            &["replicate", "--copies", "4", "--progress", "never", p],
        );
    }
    let theirs = g.replica_file("a1", "/alice/secret.txt");
    let spool = theirs
        .ancestors()
        .find(|a| a.ends_with("data"))
        .unwrap()
        .to_path_buf();
    // Even a replica readable by all (a task of alice's own once made the replicas it read
    // 0644, and an upload may carry such a mode) is out of reach: the spool is the node's.
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o644)).unwrap();
    let script = format!(
        "cat {{}}; cat {} && echo READ-THEIRS; ls {} && echo LISTED-SPOOL; echo FDS; ls /proc/$$/fd",
        theirs.display(),
        spool.display()
    );
    let out = g.run(
        "runner",
        &["run", "--json", "/r/mine.txt", "--", "sh", "-c", &script],
    );
    let j = json(&out);
    let task = &j["tasks"][0];
    let stdout = task["stdout"].as_str().unwrap();
    assert!(
        stdout.contains("runner's input"),
        "the task's own input: {task}"
    );
    assert!(
        !stdout.contains("alice's secret") && !stdout.contains("READ-THEIRS"),
        "{task}"
    );
    assert!(!stdout.contains("LISTED-SPOOL"), "{task}");
    // Listed by a plain child of the shell: in a pipeline (`ls | tr`) the shell itself held
    // the pipe's other end while `ls` looked, and the listing showed it as descriptor 3.
    let fds: Vec<&str> = stdout.lines().skip_while(|l| *l != "FDS").skip(1).collect();
    assert_eq!(fds, ["0", "1", "2"], "descriptors of the task: {task}");
    assert!(
        task["stderr"]
            .as_str()
            .unwrap()
            .contains("Permission denied"),
        "{task}"
    );
    // alice reads her file as before.
    let back = g.path().join("back.txt");
    assert_ok(&g.cp(
        "alice",
        &[&g.url("/alice/secret.txt"), back.to_str().unwrap()],
    ));
    assert_eq!(
        std::fs::read(&back).unwrap(),
        std::fs::read(&secret).unwrap()
    );
    // A certificate mapped to a system account runs nothing.
    let out = g.run("sysacct", &["run", "/r/mine.txt", "--", "id"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(stderr(&out).contains("system account"), "{}", stderr(&out));
    // SAFETY: closing the descriptor dup'ed above.
    unsafe { libc::close(leaked) };
}

/// C1 on the metadata server: a client with a certificate of the CA that nobody here knows
/// (not a node, not in the mapfile) connects and sends nothing. Its calls would be refused; its
/// connection is closed after the handshake timeout instead of holding a slot for ever. One
/// byte and a close, repeated, holds nothing either, and a mapped user is served meanwhile.
#[test]
fn unknown_and_silent_clients_do_not_keep_metadata_server_connections() {
    use std::io::{Read, Write};
    let g = Grid::start_with(&["--handshake-timeout", "2s"]);
    for _ in 0..50 {
        let mut s = std::net::TcpStream::connect(&g.meta_addr).unwrap();
        let _ = s.write_all(b"H");
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let closed = rt.block_on(async {
        let creds = transfer::tls::Credentials::load(&transfer::tls::CredentialPaths {
            cert: g.pki("mallory.pem"),
            key: g.pki("mallory.key"),
            ca: g.pki("ca/ca.pem"),
        })
        .unwrap();
        let tls = transfer::conn::ClientTls {
            config: transfer::tls::client_config(&creds).unwrap(),
        };
        let tcp = transfer::conn::connect_tcp(&g.meta_addr, None)
            .await
            .unwrap();
        let mut io = tls.handshake(tcp, "127.0.0.1", "meta").await.unwrap();
        let t = std::time::Instant::now();
        let mut buf = [0u8; 1024];
        use tokio::io::AsyncReadExt;
        loop {
            match tokio::time::timeout(Duration::from_secs(10), io.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return Some(t.elapsed()),
                Ok(Ok(_)) => continue,
                Err(_) => return None,
            }
        }
    });
    assert!(
        closed.is_some(),
        "an unknown certificate kept its connection to the metadata server"
    );
    g.ok("alice", &["ls", "/"]);
    let mut s = std::net::TcpStream::connect(&g.meta_addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
    let _ = s.write_all(b"H");
    // What comes back is at most an alert, then the end of the connection.
    let mut b = [0u8; 64];
    let t = std::time::Instant::now();
    loop {
        match s.read(&mut b) {
            Ok(0) | Err(_) => break,
            Ok(_) => assert!(
                t.elapsed() < Duration::from_secs(8),
                "a one-byte connection was kept open"
            ),
        }
    }
    assert!(
        t.elapsed() < Duration::from_secs(8),
        "a one-byte connection was kept open"
    );
}

/// C1 on a storage node's data port (the same listener as `haul serve`): one byte and a close,
/// far more times than the node's connection limit, holds no slot; the grid still uploads to
/// and downloads from the node.
#[test]
fn one_byte_connections_do_not_hold_a_nodes_data_port() {
    use std::io::Write;
    let g = Grid::start();
    let addr = g.node("a1").addr.clone();
    for _ in 0..600 {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        let _ = s.write_all(b"H");
    }
    g.ok("alice", &["mkdir", "/alice"]);
    let src = g.path().join("f.bin");
    write_file(&src, 5, 3 << 20);
    assert_ok(&g.cp(
        "alice",
        &[src.to_str().unwrap(), &g.url("/alice/f.bin"), "--site", "A"],
    ));
    let back = g.path().join("back.bin");
    assert_ok(&g.cp("alice", &[&g.url("/alice/f.bin"), back.to_str().unwrap()]));
    assert_same_file(&src, &back);
}

/// C2: a second host certificate for a registered node's name is refused at registration,
/// and also for every other node call: it cannot report an empty inventory (which would mark
/// the node's replicas missing), heartbeat for it, or report replicas written.
#[test]
fn another_certificate_for_a_node_cannot_report_for_it() {
    let g = Grid::start();
    let (src, files, paths) = upload_sample(&g);
    let _ = (src, files);
    let issued = g.issue(&["--host", "a1", "--host", "127.0.0.1", "--out", "a1-copy"]);
    let _ = issued;
    let twin = Direct::new(&g, "a1-copy");
    // The status of a refused call, as "Code: message".
    let refused = |r: Result<(), String>| {
        let s = r.expect_err("a call with another certificate for a1 was taken");
        assert!(s.starts_with("PermissionDenied:"), "{s}");
        assert!(
            s.contains("not the certificate node a1 registered with"),
            "{s}"
        );
    };
    let mut nodes = twin.meta.nodes.clone();
    refused(
        twin.rt
            .block_on(nodes.inventory(pb::InventoryRequest {
                name: "a1".into(),
                files: vec![],
                last: true,
            }))
            .map(|_| ())
            .map_err(|s| format!("{:?}: {}", s.code(), s.message())),
    );
    refused(
        twin.rt
            .block_on(nodes.heartbeat(pb::HeartbeatRequest {
                name: "a1".into(),
                capacity: 1,
                free: 0,
                ..Default::default()
            }))
            .map(|_| ())
            .map_err(|s| format!("{:?}: {}", s.code(), s.message())),
    );
    // Every file still has its complete replicas, a1's included.
    for w in g.where_(&paths) {
        assert!(
            w["replicas"]
                .as_array()
                .unwrap()
                .iter()
                .all(|r| r["state"] == "complete"),
            "{w}"
        );
    }
}
