//! `haul demo`: the main job on the embedded default, on one machine. It creates a CA and
//! certificates, starts two TLS endpoints ("site A" and "site B") on loopback, generates a
//! small climate-like dataset from a fixed seed, uploads it to A, copies it from A to B as a
//! third-party transfer with encrypted streams, downloads it back from B, verifies every file
//! byte for byte and by checksum, and prints a report. With `--exit` it stops there; without,
//! the endpoints stay up for you to try `haul cp` against them until Ctrl-C.

use crate::args::DemoArgs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use transfer::TransferError;
use transfer::client::{self, CopyOptions, CopyReport, Location};
use transfer::conn::ClientTls;
use transfer::endpoint::{EndpointConfig, EndpointTls};
use transfer::pki::{self, Subject, Validity};
use transfer::progress::Counters;
use transfer::tls::{self, CredentialPaths, Credentials, Mapfile};
use wire::control::{Protect, SessionOptions};

fn local(e: impl std::fmt::Display) -> TransferError {
    TransferError::Local(e.to_string())
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

struct Site {
    url: String,
    root: PathBuf,
    stop: CancellationToken,
}

async fn start_site(
    name: &str,
    root: PathBuf,
    tls: EndpointTls,
    mapfile: Mapfile,
) -> Result<Site, TransferError> {
    std::fs::create_dir_all(&root).map_err(local)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(local)?;
    let addr = listener.local_addr().map_err(local)?;
    let stop = CancellationToken::new();
    let cfg = EndpointConfig {
        root: root.clone(),
        tls: Some(tls),
        mapfile,
        max_connections: 256,
        read_only: false,
        link_bps: 10_000_000_000,
        checkpoint_interval: std::time::Duration::from_secs(5),
        spool: None,
        stats: Default::default(),
    };
    let s = stop.clone();
    tokio::spawn(async move {
        if let Err(e) = transfer::endpoint::run(cfg, listener, s.cancelled_owned()).await {
            eprintln!("haul demo: endpoint failed: {e}");
        }
    });
    println!(
        "  site {name}: haul://localhost:{}/  (root {})",
        addr.port(),
        root.display()
    );
    Ok(Site {
        url: format!("haul://localhost:{}", addr.port()),
        root,
        stop,
    })
}

async fn step(
    label: &str,
    src: &str,
    dst: &str,
    opts: &CopyOptions,
) -> Result<CopyReport, TransferError> {
    let counters = Arc::new(Counters::default());
    let (tx, mut rx) = mpsc::unbounded_channel();
    tokio::spawn(async move { while rx.recv().await.is_some() {} });
    let r = client::copy(
        &Location::parse(src)?,
        &Location::parse(dst)?,
        opts,
        counters,
        tx,
        CancellationToken::new(),
    )
    .await?;
    if r.files_failed > 0 {
        return Err(TransferError::Integrity(format!(
            "{label}: {} files failed",
            r.files_failed
        )));
    }
    println!(
        "  {label:<34} {:>4} files {:>10} in {:>5.2} s  {:>14}  {} streams, {}",
        r.files,
        wire::units::format_bytes(r.bytes_total),
        r.seconds,
        wire::units::format_rate(r.mbit_per_s * 1e6),
        r.streams,
        r.protect
    );
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

    // A federation's CA, one host certificate for both sites, one user.
    let ca = base.join("pki/ca");
    pki::init_ca(&ca, "longhaul-demo", 30)?;
    pki::issue(
        &ca,
        &base.join("pki/host"),
        &Subject::Host {
            names: vec!["localhost".into(), "127.0.0.1".into()],
        },
        "longhaul-demo",
        &Validity::days(30),
    )?;
    let user = pki::issue(
        &ca,
        &base.join("pki/scientist"),
        &Subject::User {
            name: "scientist".into(),
        },
        "longhaul-demo",
        &Validity::days(30),
    )?;
    let mapfile =
        Mapfile::parse(&format!("\"{user}\" scientist\n")).map_err(TransferError::Usage)?;
    let host = Credentials::load(&CredentialPaths {
        cert: base.join("pki/host.pem"),
        key: base.join("pki/host.key"),
        ca: ca.join("ca.pem"),
    })?;
    let ep_tls = EndpointTls {
        server: tls::server_config(&host)?,
        client: tls::client_config(&host)?,
    };
    let me = Credentials::load(&CredentialPaths {
        cert: base.join("pki/scientist.pem"),
        key: base.join("pki/scientist.key"),
        ca: ca.join("ca.pem"),
    })?;
    println!("  CA and certificates: user {user} mapped to \"scientist\"");

    let site_a = start_site("A", base.join("site-a"), ep_tls.clone(), mapfile.clone()).await?;
    let site_b = start_site("B", base.join("site-b"), ep_tls, mapfile).await?;

    let sizes = dataset_sizes(a.files, a.median_mb * 1e6, 2009);
    let data = base.join("cmip-demo");
    let total = write_dataset(&data, &sizes).map_err(local)?;
    println!(
        "  dataset: {} files, {} (log-normal sizes, median {:.0} MB, fixed seed)\n",
        sizes.len(),
        wire::units::format_bytes(total),
        a.median_mb
    );

    let mut opts = CopyOptions {
        recursive: true,
        range: None,
        session: SessionOptions {
            checksums: wire::checksum::parse_algorithms("adler32,md5")
                .map_err(TransferError::Usage)?,
            ..Default::default()
        },
        retry: Default::default(),
        tls: Some(ClientTls {
            config: tls::client_config(&me)?,
        }),
        link_bps: 10_000_000_000,
        checkpoint_interval: std::time::Duration::from_secs(5),
    };
    let up = step(
        "upload to site A",
        &data.to_string_lossy(),
        &format!("{}/", site_a.url),
        &opts,
    )
    .await?;
    opts.session.protect = Protect::Private;
    step(
        "A -> B third-party, encrypted",
        &format!("{}/cmip-demo", site_a.url),
        &format!("{}/mirror", site_b.url),
        &opts,
    )
    .await?;
    opts.session.protect = Protect::Clear;
    let back = base.join("back");
    step(
        "download from site B",
        &format!("{}/mirror", site_b.url),
        &back.to_string_lossy(),
        &opts,
    )
    .await?;

    // Verify: every copy byte for byte against the original, and the checksums reported by
    // the endpoints against an independent computation.
    let n_a =
        verify_tree(&data, &site_a.root.join("cmip-demo")).map_err(TransferError::Integrity)?;
    let n_b = verify_tree(&data, &site_b.root.join("mirror")).map_err(TransferError::Integrity)?;
    let n_back = verify_tree(&data, &back).map_err(TransferError::Integrity)?;
    let mut checked = 0;
    for f in up.file_list.iter().filter(|f| !f.checksums.is_empty()) {
        let path = data.parent().unwrap_or(&data).join(&f.path);
        let bytes = std::fs::read(&path).map_err(local)?;
        for d in wire::checksum::digest_bytes(&opts.session.checksums, &bytes) {
            if f.checksums.get(d.algorithm.name()) != Some(&d.hex()) {
                return Err(TransferError::Integrity(format!(
                    "{}: {} differs",
                    f.path, d.algorithm
                )));
            }
            checked += 1;
        }
    }
    println!(
        "\n  verified: {n_a} files at A, {n_b} at B, {n_back} downloaded, all byte-identical; {checked} checksums (crc32c, adler32, md5) match"
    );
    println!("  total {:.1} s", started.elapsed().as_secs_f64());

    if a.exit {
        site_a.stop.cancel();
        site_b.stop.cancel();
        drop(tmp);
        return Ok(0);
    }
    println!("\nThe two sites stay up. Try, in another terminal:");
    println!(
        "  haul cp --cert {0}/pki/scientist.pem --key {0}/pki/scientist.key --ca {1} -r {2}/mirror ./mirror",
        base.display(),
        ca.join("ca.pem").display(),
        site_b.url
    );
    println!("Ctrl-C stops the demo.");
    let _ = tokio::signal::ctrl_c().await;
    site_a.stop.cancel();
    site_b.stop.cancel();
    Ok(0)
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
