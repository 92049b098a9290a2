//! A storage node (`haul node serve`): stores replicas under its root, named by file id
//! (`data/xx/yy/<id>`), and serves them with the data-plane engine and the node's personality
//! ([`service::NodeService`]) — every session needs a capability the metadata server signed
//! for this node. Towards the metadata
//! server it registers (receiving the key capabilities are checked with), reports its inventory
//! at start, sends heartbeats with free space, load and delivery rate, reports every replica it
//! has verified (which is what makes a new file visible), and removes the files the catalog no
//! longer wants.

pub mod digest;
pub mod reports;
pub mod run;
pub mod service;
pub mod spool;
#[cfg(test)]
mod testing;
pub mod verify;

use api::meta as pb;
use grid::MetaClient;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use transfer::TransferError;
use transfer::client::Peer;
use transfer::endpoint::{EndpointConfig, EndpointStats, EndpointTls};
use wire::checksum::{Digest, format_digests};
use wire::data::Timestamp;
use wire::error::{ErrorInfo, ErrorKind};

use spool::{MetaLink, spool_id, spool_path};

/// How a node runs.
pub struct NodeConfig {
    pub name: String,
    pub site: String,
    pub root: PathBuf,
    pub meta: Peer,
    /// Address other hosts reach the data service at (`host:port`).
    pub advertise: String,
    pub tls: EndpointTls,
    /// Connections the data service admits, and its handshake and idle timeouts.
    pub limits: transfer::limits::Limits,
    pub link_bps: u64,
    /// Capacity to report instead of the file system's (for tests and shared disks).
    pub capacity: Option<u64>,
    /// The transfer log (`--log-transfer`): every file and session the node moves, and every
    /// refused authentication.
    pub log: Option<Arc<transfer::translog::TransferLog>>,
    /// Sessions the node sends in are traced into this directory (`--trace-dir`).
    pub trace_dir: Option<PathBuf>,
    /// Where Prometheus metrics are served (`--metrics`), labelled with the node and site.
    pub metrics: Option<TcpListener>,
}

/// The node's link to its metadata server, as its data service uses it.
pub struct GridLink {
    name: String,
    key: RwLock<Option<Vec<u8>>>,
    meta: Arc<RwLock<Option<MetaClient>>>,
    runtime: tokio::runtime::Handle,
    /// Replica reports, sent in groups.
    reports: Arc<reports::Reporter>,
}

impl GridLink {
    /// A link with no metadata server yet; its reports go (grouped) to the one it gets.
    /// Must be called on the node's runtime.
    fn new(name: &str) -> Self {
        let meta: Arc<RwLock<Option<MetaClient>>> = Arc::new(RwLock::new(None));
        let send = send_group(name.to_string(), meta.clone());
        Self {
            name: name.to_string(),
            key: RwLock::new(None),
            meta,
            runtime: tokio::runtime::Handle::current(),
            reports: reports::Reporter::start(send, reports::CALLS_IN_FLIGHT, reports::MAX_GROUP),
        }
    }
}

/// How the node's grouped replica reports reach the metadata server: one `ReplicasWritten`
/// call per group (or, from a metadata server without it, one `ReplicaWritten` per report).
fn send_group(node: String, meta: Arc<RwLock<Option<MetaClient>>>) -> reports::SendGroup {
    // Whether the metadata server answered that it has no `ReplicasWritten`.
    let singles = Arc::new(std::sync::atomic::AtomicBool::new(false));
    Arc::new(move |replicas: Vec<pb::WrittenReplica>| {
        let node = node.clone();
        let meta = meta.read().expect("meta lock").clone();
        let singles = singles.clone();
        Box::pin(async move {
            let Some(meta) = meta else {
                return Err(ErrorInfo::new(
                    ErrorKind::Connect,
                    "this node has no connection to its metadata server",
                )
                .retryable(true));
            };
            if singles.load(std::sync::atomic::Ordering::Relaxed) {
                return report_each(&meta, &node, replicas).await;
            }
            let req = pb::ReplicasWrittenRequest {
                node: node.clone(),
                replicas: replicas.clone(),
            };
            let mut client = meta.nodes.clone();
            match tokio::time::timeout(REPORT_TIMEOUT, client.replicas_written(req)).await {
                Ok(Ok(reply)) => Ok(reply
                    .into_inner()
                    .results
                    .iter()
                    .map(|r| {
                        r.error
                            .as_ref()
                            .map_or(Ok(()), |e| Err(reports::refused(e)))
                    })
                    .collect()),
                Ok(Err(s)) if s.code() == tonic::Code::Unimplemented => {
                    singles.store(true, std::sync::atomic::Ordering::Relaxed);
                    report_each(&meta, &node, replicas).await
                }
                Ok(Err(s)) => Err(call_refused(s)),
                Err(_) => Err(not_confirmed()),
            }
        })
    })
}

/// How long the metadata server has to confirm a call of replica reports.
const REPORT_TIMEOUT: Duration = Duration::from_secs(30);

/// A group's reports one call each, all at once (to a metadata server older than group
/// reports): the group takes one call's time, as before groups.
async fn report_each(
    meta: &MetaClient,
    node: &str,
    replicas: Vec<pb::WrittenReplica>,
) -> reports::GroupResult {
    let mut calls = tokio::task::JoinSet::new();
    for (i, r) in replicas.into_iter().enumerate() {
        let (meta, node) = (meta.clone(), node.to_string());
        calls.spawn(async move { (i, report_one(&meta, &node, r).await) });
    }
    let mut out = vec![Err(not_confirmed()); calls.len()];
    while let Some(done) = calls.join_next().await {
        if let Ok((i, r)) = done {
            out[i] = r;
        }
    }
    Ok(out)
}

/// One replica's report by itself.
async fn report_one(meta: &MetaClient, node: &str, r: pb::WrittenReplica) -> Result<(), ErrorInfo> {
    let req = pb::ReplicaWrittenRequest {
        node: node.to_string(),
        id: r.id,
        size: r.size,
        checksum: r.checksum,
        mtime_ns: r.mtime_ns,
    };
    match tokio::time::timeout(REPORT_TIMEOUT, meta.nodes.clone().replica_written(req)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(s)) => Err(call_refused(s)),
        Err(_) => Err(not_confirmed()),
    }
}

/// A report call the metadata server refused as a whole.
fn call_refused(s: tonic::Status) -> ErrorInfo {
    let e = grid::client::from_status(s);
    reports::refused(&pb::FileError {
        path: String::new(),
        code: e.kind().name().to_string(),
        message: e.to_string(),
    })
}

fn not_confirmed() -> ErrorInfo {
    ErrorInfo::new(
        ErrorKind::Connect,
        format!(
            "metadata server did not confirm the replica within {} s",
            REPORT_TIMEOUT.as_secs()
        ),
    )
    .retryable(true)
}

impl MetaLink for GridLink {
    fn node(&self) -> String {
        self.name.clone()
    }

    fn key(&self) -> Option<Vec<u8>> {
        self.key.read().expect("key lock").clone()
    }

    fn committed(
        &self,
        id: i64,
        size: u64,
        digests: &[Digest],
        mtime: Timestamp,
    ) -> Result<(), ErrorInfo> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.committed_then(
            id,
            size,
            digests,
            mtime,
            Box::new(move |r| drop(tx.send(r))),
        );
        rx.recv().unwrap_or_else(|_| Err(not_confirmed()))
    }

    /// Queued for the next group report (see [`reports`]); `done` hears the metadata server's
    /// answer for this replica.
    fn committed_then(
        &self,
        id: i64,
        size: u64,
        digests: &[Digest],
        mtime: Timestamp,
        done: transfer::service::Settled,
    ) {
        self.reports.report(
            pb::WrittenReplica {
                id,
                size,
                checksum: format_digests(digests),
                mtime_ns: mtime.secs * 1_000_000_000 + mtime.nanos as i64,
            },
            done,
        );
    }

    fn register_outputs(
        &self,
        grant: &wire::grant::SignedGrant,
        dir: &str,
        files: &[spool::OutputFile],
    ) -> Result<Vec<Result<i64, ErrorInfo>>, ErrorInfo> {
        let Some(meta) = self.meta.read().expect("meta lock").clone() else {
            return Err(ErrorInfo::new(
                ErrorKind::Connect,
                "this node has no connection to its metadata server",
            ));
        };
        let req = pb::RegisterOutputsRequest {
            node: self.name.clone(),
            capability: Some(pb::Capability {
                token: grant.token.clone(),
                mac: grant.mac.clone(),
                ttl_ms: 0,
            }),
            dir: dir.to_string(),
            files: files
                .iter()
                .map(|f| pb::OutputFile {
                    name: f.name.clone(),
                    size: f.size,
                    mode: f.mode,
                    mtime_ns: f.mtime.secs * 1_000_000_000 + f.mtime.nanos as i64,
                })
                .collect(),
        };
        let r = self.runtime.block_on(async move {
            tokio::time::timeout(
                Duration::from_secs(60),
                meta.nodes.clone().register_outputs(req),
            )
            .await
        });
        let reply = match r {
            Ok(Ok(r)) => r.into_inner(),
            Ok(Err(s)) => {
                return Err(ErrorInfo::new(
                    ErrorKind::PermissionDenied,
                    format!(
                        "metadata server refused the outputs: {}",
                        grid::client::from_status(s)
                    ),
                ));
            }
            Err(_) => {
                return Err(ErrorInfo::new(
                    ErrorKind::Connect,
                    "metadata server did not answer within 60 s",
                ));
            }
        };
        Ok(reply
            .results
            .into_iter()
            .map(|r| match r.error {
                Some(e) => Err(ErrorInfo::new(ErrorKind::Invalid, e.message)),
                None => Ok(r.id),
            })
            .collect())
    }
}

/// Why a node stopped.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("{0}")]
    Config(String),
    #[error("{0}")]
    Serve(String),
}

/// Capacity and free bytes of the file system holding `root`.
pub fn disk_space(root: &Path) -> std::io::Result<(u64, u64)> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c = CString::new(root.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::other("path with NUL"))?;
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // statvfs: no crate needed for one call.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let frsize = s.f_frsize as u64;
    Ok((s.f_blocks as u64 * frsize, s.f_bavail as u64 * frsize))
}

fn load_per_core() -> f64 {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let one: f64 = text
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    one / cores as f64
}

/// Every replica file under `root/data` (id, size); temporary files older than `stale` are
/// removed on the way.
pub fn scan(root: &Path, stale: Duration) -> Vec<(i64, u64)> {
    let mut out = Vec::new();
    let mut stack = vec![root.join("data")];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(ft) = e.file_type() else { continue };
            let p = e.path();
            if ft.is_dir() {
                stack.push(p);
            } else if ft.is_file() {
                if let Some(id) = spool_id(&p) {
                    if let Ok(m) = e.metadata() {
                        out.push((id, m.len()));
                    }
                } else if e
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age > stale)
                {
                    // Leftovers of transfers that never finished.
                    let _ = std::fs::remove_file(&p);
                }
            }
        }
    }
    out.sort_unstable();
    out
}

/// Removes replica files; returns the ids actually gone.
fn remove(root: &Path, ids: &[i64]) -> Vec<i64> {
    ids.iter()
        .copied()
        .filter(|id| {
            let p = root.join(spool_path(*id));
            match std::fs::remove_file(&p) {
                Ok(()) => true,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
                Err(e) => {
                    tracing::warn!(path = %p.display(), error = %e, "cannot remove a dead replica");
                    false
                }
            }
        })
        .collect()
}

/// Removes the replicas the catalog no longer wants and tells the metadata server which went
/// (it forgets them then; the others are asked for again).
async fn remove_dead(cfg: &NodeConfig, meta: &MetaClient, ids: &[i64]) {
    let gone = remove(&cfg.root, ids);
    if gone.is_empty() {
        return;
    }
    tracing::info!(files = gone.len(), "removed dead replicas");
    let _ = meta
        .nodes
        .clone()
        .removed(pb::RemovedRequest {
            node: cfg.name.clone(),
            ids: gone,
        })
        .await;
}

/// Runs the node until `shutdown` completes.
pub async fn run(
    mut cfg: NodeConfig,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), NodeError> {
    // Replicas are the node's alone: no local user (nor a task of `haul run`, which gets a
    // link to its own input) may enter the spool and read files by guessing their ids.
    let data = cfg.root.join("data");
    std::fs::create_dir_all(&data)
        .and_then(|()| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o700))
        })
        .map_err(|e| {
            NodeError::Config(format!("cannot create the spool {}: {e}", data.display()))
        })?;
    let link = Arc::new(GridLink::new(&cfg.name));
    let stats = Arc::new(EndpointStats::default());
    let ep = EndpointConfig {
        root: cfg.root.clone(),
        tls: Some(cfg.tls.clone()),
        service: Arc::new(service::NodeService::new(link.clone(), cfg.root.clone())),
        limits: cfg.limits.clone(),
        link_bps: cfg.link_bps,
        checkpoint_interval: Duration::from_secs(5),
        stats: stats.clone(),
        log: cfg.log.clone(),
        trace_dir: cfg.trace_dir.clone(),
    };
    let stop = CancellationToken::new();
    if let Some(listener) = cfg.metrics.take() {
        let mut registry = prometheus_client::registry::Registry::with_labels(
            [
                ("node".into(), cfg.name.clone().into()),
                ("site".into(), cfg.site.clone().into()),
            ]
            .into_iter(),
        );
        stats.metrics.register(&mut registry);
        transfer::metrics::register_build_info(&mut registry);
        tokio::spawn(transfer::metrics::serve(
            listener,
            Arc::new(registry),
            stop.clone(),
        ));
    }
    let data = {
        let stop = stop.clone();
        tokio::spawn(async move {
            transfer::endpoint::run(ep, listener, async move { stop.cancelled().await }).await
        })
    };
    let control = {
        let stop = stop.clone();
        let link = link.clone();
        tokio::spawn(async move { control_loop(cfg, link, stats, stop).await })
    };
    shutdown.await;
    stop.cancel();
    let _ = control.await;
    match data.await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(NodeError::Serve(e.to_string())),
        Err(e) => Err(NodeError::Serve(e.to_string())),
    }
}

/// Registration, inventory and heartbeats, reconnecting whenever the metadata server is
/// away.
async fn control_loop(
    cfg: NodeConfig,
    link: Arc<GridLink>,
    stats: Arc<EndpointStats>,
    stop: CancellationToken,
) {
    let mut backoff = Duration::from_millis(200);
    'connect: loop {
        if stop.is_cancelled() {
            return;
        }
        let meta = match MetaClient::connect(&cfg.meta, cfg.tls.client.clone()).await {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(meta = %cfg.meta, error = %e, "metadata server unreachable; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop.cancelled() => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        let (capacity, free) = space(&cfg);
        let reg = meta
            .nodes
            .clone()
            .register(pb::RegisterRequest {
                name: cfg.name.clone(),
                site: cfg.site.clone(),
                address: cfg.advertise.clone(),
                capacity,
                free,
            })
            .await;
        let reg = match reg {
            Ok(r) => r.into_inner(),
            Err(s) => {
                tracing::error!(meta = %cfg.meta, error = %s.message(), "registration refused");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                    _ = stop.cancelled() => return,
                }
                continue;
            }
        };
        *link.key.write().expect("key lock") = Some(reg.capability_key);
        *link.meta.write().expect("meta lock") = Some(meta.clone());
        backoff = Duration::from_millis(200);
        let grace = Duration::from_millis(reg.orphan_grace_ms as u64);
        tracing::info!(node = %cfg.name, site = %cfg.site, meta = %cfg.meta, "registered");
        if let Err(e) = inventory(&cfg, &meta, grace).await {
            tracing::warn!(error = %e, "inventory failed; retrying");
            continue;
        }
        let period = Duration::from_millis(reg.heartbeat_ms.max(100) as u64);
        let mut tick = tokio::time::interval(period);
        let mut last = (stats.bytes.load(Ordering::Relaxed), Instant::now());
        let mut failures = 0;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.cancelled() => return,
            }
            let bytes = stats.bytes.load(Ordering::Relaxed);
            let rate = ((bytes - last.0) as f64 / last.1.elapsed().as_secs_f64().max(1e-3)) as u64;
            last = (bytes, Instant::now());
            let (capacity, free) = space(&cfg);
            let hb = meta
                .nodes
                .clone()
                .heartbeat(pb::HeartbeatRequest {
                    name: cfg.name.clone(),
                    capacity,
                    free,
                    load: load_per_core(),
                    sessions: stats.sessions.load(Ordering::Relaxed),
                    bytes_per_s: rate,
                })
                .await;
            match hb {
                Ok(r) => {
                    failures = 0;
                    let r = r.into_inner();
                    if r.reregister {
                        continue 'connect;
                    }
                    if !r.delete.is_empty() {
                        remove_dead(&cfg, &meta, &r.delete).await;
                    }
                }
                Err(s) => {
                    failures += 1;
                    tracing::warn!(error = %s.message(), "heartbeat failed");
                    if failures >= 3 {
                        // Reconnect; the inventory is reported again.
                        continue 'connect;
                    }
                }
            }
        }
    }
}

fn space(cfg: &NodeConfig) -> (u64, u64) {
    let (cap, free) = disk_space(&cfg.root).unwrap_or((0, 0));
    match cfg.capacity {
        Some(c) => {
            // A capacity smaller than the disk: what is used counts against it.
            let used = scan_size(&cfg.root);
            (c, c.saturating_sub(used).min(free))
        }
        None => (cap, free),
    }
}

fn scan_size(root: &Path) -> u64 {
    scan(root, Duration::MAX).iter().map(|(_, s)| s).sum()
}

/// Reports every replica held, in parts, and removes what the catalog says is dead.
async fn inventory(
    cfg: &NodeConfig,
    meta: &MetaClient,
    grace: Duration,
) -> Result<(), TransferError> {
    let root = cfg.root.clone();
    let held = tokio::task::spawn_blocking(move || scan(&root, grace))
        .await
        .map_err(|e| TransferError::local(e.to_string()))?;
    let n = held.len();
    let mut reply = pb::InventoryReply::default();
    let chunks: Vec<&[(i64, u64)]> = if held.is_empty() {
        vec![&[]]
    } else {
        held.chunks(50_000).collect()
    };
    let last = chunks.len() - 1;
    for (i, c) in chunks.into_iter().enumerate() {
        reply = meta
            .nodes
            .clone()
            .inventory(pb::InventoryRequest {
                name: cfg.name.clone(),
                files: c
                    .iter()
                    .map(|(id, size)| pb::HeldFile {
                        id: *id,
                        size: *size,
                    })
                    .collect(),
                last: i == last,
            })
            .await
            .map_err(grid::client::from_status)?
            .into_inner();
    }
    let delete: HashSet<i64> = reply.delete.iter().copied().collect();
    remove_dead(cfg, meta, &delete.into_iter().collect::<Vec<_>>()).await;
    tracing::info!(
        files = n,
        known = reply.known,
        missing = reply.missing,
        "inventory reported"
    );
    Ok(())
}
