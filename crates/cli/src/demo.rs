//! `haul demo`: the main job on the embedded default, on one machine. It creates a CA and
//! certificates, starts a metadata server (SQLite in a temporary directory) and two sites of
//! two storage nodes each on loopback, generates a small climate-like dataset from a fixed
//! seed, copies it into the grid at site A, replicates it node to node to site B, has the nodes
//! verify every replica's checksum where it is, downloads the dataset back from site B and
//! compares it byte for byte, runs `md5sum` on every replica of `tas/monthly` where it is
//! (`haul run`, as the local account the demo's user maps to) and checks the sums, and prints
//! a report (throughput, replicas per site, time). With `--exit` it stops there; without, the
//! grid and its dashboard stay up until Ctrl-C.

use crate::args::DemoArgs;
use grid::types as pb;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use transfer::TransferError;
use transfer::client::{CopyOptions, CopyReport, Location, Peer};
use transfer::conn::ClientTls;
use transfer::endpoint::EndpointTls;
use transfer::pki::{self, Subject, Validity};
use transfer::progress::Counters;
use transfer::tls::{self, CredentialPaths, Credentials, Mapfile};
use wire::control::SessionOptions;

fn local(e: impl std::fmt::Display) -> TransferError {
    TransferError::local(e.to_string())
}

/// Deterministic sizes: log-normal with median `median`, clipped, like seed 002 Fig. 5 scaled
/// down (the demo keeps the shape, not the terabytes).
fn dataset_sizes(files: usize, median: f64, seed: u64) -> Vec<u64> {
    let mut x = seed | 1;
    let mut uniform = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 11) as f64 / (1u64 << 53) as f64
    };
    (0..files)
        .map(|_| {
            // Box-Muller normal, sigma 1.0.
            let (u1, u2) = (uniform().max(1e-12), uniform());
            let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
            (median * z.exp()).clamp(20e3, 40e6) as u64
        })
        .collect()
}

fn write_dataset(dir: &Path, sizes: &[u64]) -> std::io::Result<u64> {
    std::fs::create_dir_all(dir.join("tas/monthly"))?;
    let mut total = 0;
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    for (i, &size) in sizes.iter().enumerate() {
        let sub = if i % 3 == 0 { "tas/monthly" } else { "tas" };
        let mut data = Vec::with_capacity(size as usize);
        while (data.len() as u64) < size {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            data.extend_from_slice(&state.to_le_bytes());
        }
        data.truncate(size as usize);
        std::fs::write(dir.join(format!("{sub}/run{i:03}.nc")), &data)?;
        total += size;
    }
    Ok(total)
}

/// Every file below `a` has an identical twin below `b`.
fn verify_tree(a: &Path, b: &Path) -> Result<usize, String> {
    let mut n = 0;
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for e in std::fs::read_dir(a.join(&rel)).map_err(|e| e.to_string())? {
            let e = e.map_err(|e| e.to_string())?;
            let r = rel.join(e.file_name());
            if e.path().is_dir() {
                stack.push(r);
                continue;
            }
            let (x, y) = (std::fs::read(a.join(&r)), std::fs::read(b.join(&r)));
            match (x, y) {
                (Ok(x), Ok(y)) if x == y => n += 1,
                _ => return Err(format!("{} differs or is missing", r.display())),
            }
        }
    }
    Ok(n)
}

const NODES: [(&str, &str); 4] = [("a1", "A"), ("a2", "A"), ("b1", "B"), ("b2", "B")];

fn creds(base: &Path, name: &str) -> Result<Credentials, TransferError> {
    Credentials::load(&CredentialPaths {
        cert: base.join(format!("pki/{name}.pem")),
        key: base.join(format!("pki/{name}.key")),
        ca: base.join("pki/ca/ca.pem"),
    })
}

fn host_cert(base: &Path, name: &str) -> Result<pki::Issued, TransferError> {
    pki::issue(
        &base.join("pki/ca"),
        &base.join(format!("pki/{name}")),
        &Subject::Host {
            names: vec![name.into(), "localhost".into(), "127.0.0.1".into()],
        },
        "longhaul-demo",
        &Validity::days(30),
    )
}

/// Starts the metadata server; returns its API and dashboard addresses.
async fn start_meta(
    base: &Path,
    mapfile: Mapfile,
    stop: &CancellationToken,
) -> Result<(std::net::SocketAddr, std::net::SocketAddr), TransferError> {
    let dir = base.join("meta");
    let lock = meta::lock_data_dir(&dir).map_err(|e| TransferError::local(e.to_string()))?;
    let catalog = meta::open_catalog(&format!("sqlite:{}", dir.join("catalog.db").display()))
        .await
        .map_err(|e| TransferError::local(format!("catalog: {e}")))?;
    let settings = meta::Settings {
        heartbeat: Duration::from_millis(500),
        node_timeout: Duration::from_secs(3),
        reconcile_every: Duration::from_secs(5),
        ..Default::default()
    };
    let m = Arc::new(meta::Meta::new(
        catalog,
        meta::auth::Identities {
            mapfile,
            groups: Default::default(),
            admins: vec![],
            nodes: meta::enrol::Enrolment::load(&base.join("pki/nodes"))
                .map_err(TransferError::local)?,
        },
        settings,
    ));
    let c = creds(base, "meta")?;
    m.set_credentials(&c)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(local)?;
    let http = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(local)?;
    let (addr, http_addr) = (
        listener.local_addr().map_err(local)?,
        http.local_addr().map_err(local)?,
    );
    let server = tls::server_config(&c)?;
    let s = stop.clone();
    tokio::spawn(async move {
        if let Err(e) = meta::run(m, server, listener, Some(http), s.cancelled_owned()).await {
            eprintln!("haul demo: metadata server failed: {e}");
        }
        drop(lock);
    });
    Ok((addr, http_addr))
}

async fn start_node(
    base: &Path,
    name: &str,
    site: &str,
    meta: &Peer,
    stop: &CancellationToken,
) -> Result<(), TransferError> {
    let c = creds(base, name)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(local)?;
    let addr = listener.local_addr().map_err(local)?;
    let cfg = node::NodeConfig {
        name: name.into(),
        site: site.into(),
        root: base.join("nodes").join(name),
        meta: meta.clone(),
        advertise: addr.to_string(),
        tls: EndpointTls {
            server: tls::server_config(&c)?,
            client: tls::client_config(&c)?,
            delegation_hosts: Vec::new(),
        },
        limits: transfer::limits::Limits::default(),
        link_bps: 10_000_000_000,
        capacity: Some(20_000_000_000),
        log: None,
        trace_dir: None,
        metrics: None,
    };
    let s = stop.clone();
    let name = name.to_string();
    tokio::spawn(async move {
        if let Err(e) = node::run(cfg, listener, s.cancelled_owned()).await {
            eprintln!("haul demo: node {name} failed: {e}");
        }
    });
    Ok(())
}

fn show(label: &str, files: u64, bytes: u64, seconds: f64, how: &str) {
    let rate = if seconds > 0.0 {
        bytes as f64 * 8.0 / seconds
    } else {
        0.0
    };
    println!(
        "  {label:<36} {files:>4} files {:>10} in {seconds:>5.2} s  {:>14}  {how}",
        wire::units::format_bytes(bytes),
        wire::units::format_rate(rate),
    );
}

async fn grid_copy(
    m: &grid::MetaClient,
    src: &str,
    dst: &str,
    opts: &grid::copy::GridOptions,
) -> Result<CopyReport, TransferError> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    tokio::spawn(async move { while rx.recv().await.is_some() {} });
    let ctx = transfer::client::AttemptContext {
        counters: Arc::new(Counters::default()),
        events: tx,
        cancel: CancellationToken::new(),
    };
    let r = grid::copy::copy(m, &Location::parse(src)?, &Location::parse(dst)?, opts, ctx).await?;
    if r.files_failed > 0 {
        return Err(TransferError::integrity(format!(
            "{src} -> {dst}: {} files failed ({})",
            r.files_failed,
            r.first_failure
                .as_ref()
                .map(|e| e.message.clone())
                .unwrap_or_default()
        )));
    }
    Ok(r)
}

pub async fn run(a: DemoArgs) -> Result<u8, TransferError> {
    let started = Instant::now();
    let tmp = tempdir(a.dir.as_deref())?;
    let base = tmp.path().to_path_buf();
    let tmp = if a.dir.is_some() {
        let _ = tmp.keep();
        None
    } else {
        Some(tmp)
    };
    println!("longhaul demo in {}", base.display());

    // The federation's CA, host certificates for meta and the nodes, one user.
    let ca = base.join("pki/ca");
    pki::init_ca(&ca, "longhaul-demo", 30)?;
    host_cert(&base, "meta")?;
    // The storage nodes are enrolled by their certificates' fingerprints.
    let mut enrolment = String::new();
    for (n, _) in NODES {
        let issued = host_cert(&base, n)?;
        enrolment.push_str(&format!("{n} {}\n", issued.fingerprint));
    }
    std::fs::write(base.join("pki/nodes"), enrolment).map_err(local)?;
    let user = pki::issue(
        &ca,
        &base.join("pki/scientist"),
        &Subject::User {
            name: "scientist".into(),
        },
        "longhaul-demo",
        &Validity::days(30),
    )?
    .subject;
    // Tasks of `haul run` run as the local account the user maps to: the demo's own (or, as
    // root, the account sudo came from), never root.
    let account = run_account();
    let mapped = account.clone().unwrap_or_else(|| "scientist".into());
    let line = format!("\"{user}\" {mapped}\n");
    let mapfile = Mapfile::parse(&line).map_err(TransferError::usage)?;
    std::fs::write(base.join("pki/mapfile"), &line).map_err(local)?;
    println!(
        "  CA and certificates: user {user} mapped to \"{mapped}\", 4 nodes enrolled by fingerprint"
    );

    let stop = CancellationToken::new();
    let (meta_addr, http_addr) = start_meta(&base, mapfile, &stop).await?;
    let meta_peer = Peer::new("127.0.0.1", meta_addr.port());
    for (n, site) in NODES {
        start_node(&base, n, site, &meta_peer, &stop).await?;
    }
    println!(
        "  metadata server haul://127.0.0.1:{} (SQLite), dashboard http://{http_addr}/",
        meta_addr.port()
    );
    let me = creds(&base, "scientist")?;
    let m = grid::MetaClient::connect(&meta_peer, tls::client_config(&me)?).await?;
    let t = Instant::now();
    loop {
        let up = m.nodes().await?.iter().filter(|n| n.up).count();
        if up == NODES.len() {
            break;
        }
        if t.elapsed() > Duration::from_secs(20) {
            return Err(TransferError::connect(format!(
                "only {up} of {} storage nodes registered within 20 s",
                NODES.len()
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("  storage nodes: a1, a2 at site A; b1, b2 at site B (all up)");

    let sizes = dataset_sizes(a.files, a.median_mb * 1e6, 2009);
    let data = base.join("cmip-demo");
    let total = write_dataset(&data, &sizes).map_err(local)?;
    println!(
        "  dataset: {} files, {} (log-normal sizes, median {} MB, fixed seed)\n",
        sizes.len(),
        wire::units::format_bytes(total),
        a.median_mb
    );

    let url = |p: &str| format!("haul://127.0.0.1:{}{p}", meta_addr.port());
    let copy = CopyOptions {
        recursive: true,
        range: None,
        session: SessionOptions {
            checksums: wire::checksum::parse_algorithms("adler32,md5")
                .map_err(TransferError::usage)?,
            ..Default::default()
        },
        retry: Default::default(),
        tls: Some(ClientTls {
            config: tls::client_config(&me)?,
        }),
        link_bps: 10_000_000_000,
        checkpoint_interval: Duration::from_secs(5),
        control_pool: None,
        peer_tls: Vec::new(),
        zero_copy: true,
        trace: None,
        receiver_evidence: false,
    };
    let mut gopts = grid::copy::GridOptions {
        copy,
        site: Some("A".into()),
        overwrite: true,
        max_sessions: 4,
        dest_is_name: false,
        source_crcs: None,
    };
    m.mkdir("/cmip", 0o755, false).await?;
    let up = grid_copy(&m, &data.to_string_lossy(), &url("/cmip"), &gopts).await?;
    show(
        "copy into the grid at site A",
        up.files,
        up.bytes_total,
        up.seconds,
        &format!(
            "{}, client -> nodes",
            wire::units::count(up.streams as u64, "stream", "streams")
        ),
    );

    // Replication: node to node, in parallel, bounded per node.
    let stream = m
        .replicate(pb::ReplicateRequest {
            paths: vec!["/cmip".into()],
            copies: 2,
            sites: vec!["B".into()],
            recursive: true,
            private: false,
        })
        .await?;
    let rep = stream
        .until_finished(|p| p.finished)
        .await?
        .ok_or_else(|| TransferError::local("replication did not finish"))?;
    if !rep.failures.is_empty() {
        return Err(TransferError::integrity(format!(
            "replication: {}",
            rep.failures[0].message
        )));
    }
    show(
        "replicate A -> B, node to node",
        rep.copies_made,
        rep.bytes_done,
        rep.seconds,
        "copies=2 sites=B, third party",
    );

    // Verification where the data is: every replica's checksum recomputed by its node.
    let stream = m
        .verify(pb::VerifyRequest {
            paths: vec!["/cmip".into()],
            recursive: true,
            repair: true,
        })
        .await?;
    let ver = stream
        .until_finished(|p| p.finished)
        .await?
        .ok_or_else(|| TransferError::local("verification did not finish"))?;
    if !ver.damaged.is_empty() || !ver.failures.is_empty() {
        return Err(TransferError::integrity(format!(
            "verification found {} damaged replicas, {} failures",
            ver.damaged.len(),
            ver.failures.len()
        )));
    }
    show(
        "verify every replica on its node",
        ver.checked,
        ver.bytes_checked,
        ver.seconds,
        "checksums recomputed, all match",
    );

    gopts.site = Some("B".into());
    let back = base.join("back");
    let down = grid_copy(&m, &url("/cmip/cmip-demo"), &back.to_string_lossy(), &gopts).await?;
    show(
        "download from site B",
        down.files,
        down.bytes_total,
        down.seconds,
        &format!(
            "{}, nodes -> client",
            wire::units::count(down.streams as u64, "stream", "streams")
        ),
    );

    // Byte for byte against the original, and the catalog's checksums against an
    // independent computation.
    let n_back = verify_tree(
        &data,
        &back
            .join("cmip-demo")
            .canonicalize()
            .unwrap_or(back.clone()),
    )
    .or_else(|_| verify_tree(&data, &back))
    .map_err(TransferError::integrity)?;
    let reply = m
        .open_read(pb::OpenReadRequest {
            paths: vec!["/cmip".into()],
            recursive: true,
            ..Default::default()
        })
        .await?;
    let mut per_site: BTreeMap<String, u64> = BTreeMap::new();
    let mut checked = 0;
    for f in &reply.files {
        for r in &f.replicas {
            *per_site.entry(r.site.clone()).or_default() += 1;
        }
        let rel = f.path.trim_start_matches("/cmip/cmip-demo/");
        let bytes = std::fs::read(data.join(rel)).map_err(local)?;
        let want = wire::checksum::parse_digests(&f.checksum).map_err(TransferError::integrity)?;
        let algos: Vec<_> = want.iter().map(|d| d.algorithm).collect();
        let ours = wire::checksum::digest_bytes(&algos, &bytes);
        wire::checksum::digests_match(&ours, &want).map_err(|e| {
            TransferError::integrity(format!("{}: catalog checksum differs: {e}", f.path))
        })?;
        checked += want.len();
    }
    let sites: Vec<String> = per_site
        .iter()
        .map(|(s, n)| format!("site {s}: {n}"))
        .collect();
    println!(
        "\n  replicas per site: {}; every file at both sites",
        sites.join(", ")
    );
    println!(
        "  verified: {n_back} files downloaded byte-identical; {checked} catalog checksums (crc32c, adler32, md5) match an independent computation"
    );
    // Computing where the data is: md5sum on the node holding each replica, as `account`.
    let run_line = match &account {
        Some(acct) => {
            let ran = run_md5(&m, &me, &data, "/cmip/cmip-demo/tas/monthly").await?;
            format!(
                "  haul run: md5sum on {ran} files of tas/monthly on the nodes holding them, as {acct}: every sum matches the original"
            )
        }
        None => "  haul run: skipped (the demo runs as root and sudo named no other account: tasks never run as root)".into(),
    };
    println!("{run_line}");
    let history = m
        .transfers(grid::types::TransfersRequest {
            limit: 1000,
            ..Default::default()
        })
        .await?;
    let count = |kind: &str, one: &str, many: &str| {
        let n = history.iter().filter(|t| t.kind == kind).count() as u64;
        wire::units::count(n, one, many)
    };
    println!(
        "  transfer history: {}, {}, {} recorded (haul transfers)",
        count("upload", "upload", "uploads"),
        count("replicate", "replication session", "replication sessions"),
        count("download", "download", "downloads")
    );
    println!("  total {:.1} s", started.elapsed().as_secs_f64());

    if a.exit {
        stop.cancel();
        tokio::time::sleep(Duration::from_millis(200)).await;
        drop(tmp);
        return Ok(0);
    }
    println!("\nThe grid stays up. Dashboard: http://{http_addr}/   In another terminal:");
    println!(
        "  export HAUL_CERT={0}/pki/scientist.pem HAUL_KEY={0}/pki/scientist.key HAUL_CA={1} HAUL_META=haul://127.0.0.1:{2}",
        base.display(),
        ca.join("ca.pem").display(),
        meta_addr.port()
    );
    println!(
        "  haul ls -l /cmip/cmip-demo; haul where /cmip/cmip-demo/tas/run001.nc; haul df; haul status; haul transfers"
    );
    if account.is_some() {
        println!("  haul run /cmip/cmip-demo/tas -- md5sum {{}}");
    }
    println!("Ctrl-C stops the demo.");
    let _ = tokio::signal::ctrl_c().await;
    stop.cancel();
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(0)
}

/// The local account `haul run` tasks of the demo run as: this process's, or as root the
/// ordinary account sudo was called from (`SUDO_USER`); `None` when there is none (root).
fn run_account() -> Option<String> {
    let uid = transfer::sys::effective_uid();
    if uid != 0 {
        let name = transfer::sys::user_name(uid);
        return transfer::sys::lookup_user(&name).map(|_| name);
    }
    let sudo = std::env::var("SUDO_USER").ok()?;
    transfer::sys::lookup_user(&sudo)
        .filter(|a| a.uid != 0)
        .map(|_| sudo)
}

/// Runs `md5sum` on every file below grid directory `dir` where its replica is, and checks
/// each sum against the original below `data`; returns the number of files.
async fn run_md5(
    m: &grid::MetaClient,
    me: &Credentials,
    data: &Path,
    dir: &str,
) -> Result<usize, TransferError> {
    let opts = grid::run::RunOptions {
        argv: vec!["md5sum".into(), "{}".into()],
        output: None,
        parallel: 2,
        timeout_s: 60,
        site: None,
        tls: Some(ClientTls {
            config: tls::client_config(me)?,
        }),
    };
    let summary = grid::run::run(m, &[dir.to_string()], &opts, &|_| {}).await?;
    for t in &summary.tasks {
        if !t.succeeded() {
            return Err(TransferError::local(format!(
                "haul run md5sum on {} ({}): {}",
                t.path,
                t.node,
                t.error.clone().unwrap_or_else(|| t.stderr.clone())
            )));
        }
        let rel = t.path.trim_start_matches("/cmip/cmip-demo/");
        let bytes = std::fs::read(data.join(rel)).map_err(local)?;
        let want = wire::checksum::digest_bytes(&[wire::checksum::Algorithm::Md5], &bytes)
            .into_iter()
            .find(|d| d.algorithm == wire::checksum::Algorithm::Md5)
            .map(|d| d.hex())
            .unwrap_or_default();
        let got = t.stdout.split_whitespace().next().unwrap_or("");
        if got != want {
            return Err(TransferError::integrity(format!(
                "haul run md5sum on {}: {got}, the original's is {want}",
                t.path
            )));
        }
    }
    Ok(summary.tasks.len())
}

/// A temporary directory, or the given one (kept).
fn tempdir(dir: Option<&Path>) -> Result<tempfile::TempDir, TransferError> {
    match dir {
        Some(d) => {
            std::fs::create_dir_all(d).map_err(local)?;
            tempfile::Builder::new()
                .prefix("haul-demo-")
                .tempdir_in(d)
                .map_err(local)
        }
        None => tempfile::Builder::new()
            .prefix("haul-demo-")
            .tempdir()
            .map_err(local),
    }
}
