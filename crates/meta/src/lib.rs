//! The metadata server (`haul meta serve`): owns the grid's namespace, replica catalog and
//! node registry (in the `catalog` crate), and serves them over gRPC (the `api` crate) on
//! mutually authenticated TLS. Clients use the `Namespace` and `Files` services; storage nodes
//! the `NodeService`. Background tasks mark silent nodes down and drop abandoned uploads. An
//! HTTP listener serves a dashboard, a JSON status and Prometheus metrics.
//!
//! The server never moves file data: clients and nodes do, with capabilities it signs.

pub mod auth;
mod dashboard;
pub mod enrol;
pub mod error;
pub mod exposition;
pub mod fairshare;
mod files;
mod grpc;
pub mod history;
pub mod http;
pub mod jobrun;
pub mod jobs;
pub mod jobspec;
mod lifecycle;
pub mod metrics;
mod namespace;
mod nodes;
pub mod optimizer;
pub mod perm;
pub mod placement;
pub mod reconcile;
pub mod replication;
pub mod runs;
pub mod state;
pub mod verify;
pub mod webauth;
pub mod webhook;

pub use state::{Meta, Settings};

use api::meta::files_server::FilesServer;
use api::meta::namespace_server::NamespaceServer;
use api::meta::node_service_server::NodeServiceServer;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// Largest gRPC response (listings of thousands of files).
pub const MAX_MESSAGE: usize = 64 << 20;

/// Largest gRPC request (batches of 2,000 files, inventories in parts of 50,000 replicas).
pub const MAX_REQUEST: usize = 16 << 20;

/// Calls at once on one connection.
pub const MAX_STREAMS: u32 = 32;

/// Why the server could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    #[error("{0}")]
    Database(String),
    #[error("{0}")]
    Config(String),
    #[error("{0}")]
    Serve(String),
}

/// Opens (and migrates) the catalog at `url` (`sqlite:PATH` or `postgres://...`), for
/// [`Meta::new`]. The command line opens it through here, knowing nothing of SQL.
pub async fn open_catalog(url: &str) -> Result<catalog::Catalog, MetaError> {
    catalog::Catalog::open(url)
        .await
        .map_err(|e| MetaError::Database(e.to_string()))
}

/// `url` with any password replaced, for logs.
pub fn redact_db_url(url: &str) -> String {
    catalog::redact(url)
}

/// Takes the data directory's lock, so that two servers never use one SQLite catalog.
/// The lock is held as long as the returned file is open.
///
/// The catalog holds every node's capability key: the directory is made 0700 and the lock,
/// `catalog.db` and its `-wal` and `-shm` files 0600 (created so, and tightened when they
/// exist looser and belong to this user; a warning names those that belong to someone else).
pub fn lock_data_dir(dir: &Path) -> Result<std::fs::File, MetaError> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| {
            MetaError::Config(format!(
                "cannot create data directory {}: {e}",
                dir.display()
            ))
        })?;
    tighten(dir, 0o700);
    let path = dir.join("meta.lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| MetaError::Config(format!("cannot open {}: {e}", path.display())))?;
    tighten(&path, 0o600);
    // flock: released by the kernel when the process exits, however it exits.
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if r != 0 {
        return Err(MetaError::Config(format!(
            "{} is in use by another metadata server (for several servers, share a PostgreSQL database)",
            dir.display()
        )));
    }
    // SQLite gives its -wal and -shm files the database file's mode: create it private.
    let db = dir.join("catalog.db");
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&db)
        .map_err(|e| MetaError::Config(format!("cannot create {}: {e}", db.display())))?;
    for suffix in ["", "-wal", "-shm"] {
        tighten(&dir.join(format!("catalog.db{suffix}")), 0o600);
    }
    Ok(f)
}

/// Clears the permission bits of `path` beyond `allowed` if it is ours; warns if it is not.
fn tighten(path: &Path, allowed: u32) {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let Ok(m) = std::fs::symlink_metadata(path) else {
        return;
    };
    let mode = m.mode() & 0o7777;
    if mode & !allowed == 0 {
        return;
    }
    let ours = m.uid() == unsafe { libc::geteuid() };
    if ours && !m.file_type().is_symlink() {
        match std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & allowed)) {
            Ok(()) => {
                tracing::info!(path = %path.display(), from = format!("{mode:o}"), to = format!("{:o}", mode & allowed), "permissions tightened (the catalog holds node keys)");
                return;
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot tighten permissions")
            }
        }
    }
    tracing::warn!(
        path = %path.display(),
        mode = format!("{mode:o}"),
        "other local users may read the catalog's node keys: make it {:o} (chmod) and owned by the metadata server's account",
        allowed
    );
}

/// Serves the gRPC API on `listener` (and, given one, the dashboard on `http`) until
/// `shutdown` completes.
pub async fn run(
    meta: Arc<Meta>,
    tls: Arc<rustls::ServerConfig>,
    listener: TcpListener,
    http: Option<TcpListener>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), MetaError> {
    meta.refresh_nodes()
        .await
        .map_err(|e| MetaError::Database(e.to_string()))?;
    let mut tls = (*tls).clone();
    tls.alpn_protocols = vec![transfer::tls::ALPN_GRPC.to_vec()];
    let m = meta.clone();
    let incoming = auth::incoming(
        listener,
        Arc::new(tls),
        meta.settings.listen.clone(),
        meta.settings.transfer_log.clone(),
        move |cert| m.ids.caller(cert).is_ok(),
    );
    let stop = tokio_util::sync::CancellationToken::new();
    let tasks = spawn_background(meta.clone(), stop.clone());
    if let Some(h) = http {
        if let Ok(a) = h.local_addr() {
            let _ = meta.http_addr.set(a);
        }
        let m = meta.clone();
        let s = stop.clone();
        tokio::spawn(async move {
            if let Err(e) = http::serve(m, h, s).await {
                tracing::error!(error = %e, "dashboard stopped");
            }
        });
    }
    let ns = NamespaceServer::new(namespace::NamespaceService { meta: meta.clone() })
        .max_decoding_message_size(MAX_REQUEST)
        .max_encoding_message_size(MAX_MESSAGE);
    let files = FilesServer::new(files::FilesService { meta: meta.clone() })
        .max_decoding_message_size(MAX_REQUEST)
        .max_encoding_message_size(MAX_MESSAGE);
    let nodes = NodeServiceServer::new(nodes::NodeServiceImpl { meta: meta.clone() })
        .max_decoding_message_size(MAX_REQUEST)
        .max_encoding_message_size(MAX_MESSAGE);
    // A peer that stops answering HTTP/2 pings is dropped; one connection carries at most
    // MAX_STREAMS calls at once (a client uses a handful; each may buffer a request of up to
    // MAX_REQUEST bytes while it is decoded).
    let r = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .max_concurrent_streams(Some(MAX_STREAMS))
        .tcp_nodelay(true)
        .add_service(ns)
        .add_service(files)
        .add_service(nodes)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await;
    stop.cancel();
    for t in tasks {
        let _ = t.await;
    }
    meta.catalog.close().await;
    r.map_err(|e| MetaError::Serve(e.to_string()))
}

/// Node liveness and the removal of abandoned uploads.
fn spawn_background(
    meta: Arc<Meta>,
    stop: tokio_util::sync::CancellationToken,
) -> Vec<tokio::task::JoinHandle<()>> {
    let m = meta.clone();
    let s = stop.clone();
    let liveness = tokio::spawn(async move {
        let mut tick = tokio::time::interval(m.settings.heartbeat);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = s.cancelled() => return,
            }
            match m
                .catalog
                .expire_nodes(m.settings.node_timeout.as_millis() as i64)
                .await
            {
                Ok(down) => {
                    for n in &down {
                        m.event(format!(
                            "node {n} is down (no heartbeat for {} s); its replicas do not count",
                            m.settings.node_timeout.as_secs()
                        ));
                    }
                    if !down.is_empty() {
                        m.reconcile_now.notify_one();
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot check node liveness"),
            }
            if let Err(e) = m.refresh_nodes().await {
                tracing::warn!(error = %e, "cannot read the node registry");
            }
        }
    });
    let m = meta.clone();
    let s = stop.clone();
    let pending = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(60));
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = s.cancelled() => return,
            }
            let cutoff = catalog::now_ms() - m.settings.pending_grace.as_millis() as i64;
            match m.catalog.stale_pending(cutoff, 1000).await {
                Ok(ids) => {
                    for id in &ids {
                        let _ = m.catalog.abort_pending(*id).await;
                    }
                    if !ids.is_empty() {
                        m.event(format!("dropped {} abandoned uploads", ids.len()));
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot look for abandoned uploads"),
            }
        }
    });
    // Replicas left "writing" by copies that died with a metadata server block their nodes
    // as destinations: drop them when their lease ends. At start, a SQLite catalog (owned by
    // this server alone) has no running copies: all of them go at once.
    let m = meta.clone();
    let s = stop.clone();
    let leases = tokio::spawn(async move {
        let owned = m.catalog.backend() == catalog::Backend::Sqlite;
        let mut first = true;
        loop {
            let before = if first && owned {
                i64::MAX
            } else {
                catalog::now_ms()
            };
            first = false;
            match m.catalog.expire_writing(before, None).await {
                Ok(gone) if !gone.is_empty() => {
                    m.event(format!(
                        "dropped {} replicas left being written by copies that ended without finishing",
                        gone.len()
                    ));
                    m.reconcile_now.notify_one();
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "cannot expire replicas being written"),
            }
            tokio::select! {
                _ = tokio::time::sleep((m.settings.writing_lease / 3).max(Duration::from_millis(100))) => {}
                _ = s.cancelled() => return,
            }
        }
    });
    let m = meta.clone();
    let s = stop.clone();
    let every = m.settings.reconcile_every;
    let reconciler = tokio::spawn(reconcile::run(m, every, s));
    let m = meta.clone();
    let s = stop.clone();
    let warmer = tokio::spawn(async move {
        let mut tick = tokio::time::interval(transfer::control_pool::ControlPool::WARM_EVERY);
        loop {
            tokio::select! {
                _ = tick.tick() => m.warm_node_connections(),
                _ = s.cancelled() => return,
            }
        }
    });
    let history = tokio::spawn(history::retain(
        meta.clone(),
        meta.settings.history,
        stop.clone(),
    ));
    let silent = tokio::spawn(history::watch_live(meta.clone(), stop.clone()));
    let jobs = tokio::spawn(jobrun::run(meta.clone(), stop.clone()));
    let mut tasks = vec![
        liveness, pending, leases, reconciler, warmer, history, silent, jobs,
    ];
    if let Some(every) = meta.settings.scrub_every {
        tasks.push(tokio::spawn(verify::scrub(
            meta.clone(),
            every,
            stop.clone(),
        )));
    }
    tasks
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    /// Issue 11 C4: catalog.db was 0644 in a 0755 directory, so every local user could read
    /// every node's capability key.
    #[test]
    fn the_data_directory_and_catalog_are_private() {
        let t = tempfile::tempdir().unwrap();
        let fresh = t.path().join("fresh/meta");
        let lock = lock_data_dir(&fresh).unwrap();
        assert_eq!(mode(&fresh), 0o700);
        assert_eq!(mode(&fresh.join("meta.lock")), 0o600);
        assert_eq!(mode(&fresh.join("catalog.db")), 0o600);
        drop(lock);
        // An existing data directory of an older version is tightened.
        let old = t.path().join("old");
        std::fs::create_dir(&old).unwrap();
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o755)).unwrap();
        for f in [
            "catalog.db",
            "catalog.db-wal",
            "catalog.db-shm",
            "meta.lock",
        ] {
            std::fs::write(old.join(f), b"").unwrap();
            std::fs::set_permissions(old.join(f), std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        let _lock = lock_data_dir(&old).unwrap();
        assert_eq!(mode(&old), 0o700);
        for f in [
            "catalog.db",
            "catalog.db-wal",
            "catalog.db-shm",
            "meta.lock",
        ] {
            assert_eq!(mode(&old.join(f)), 0o600, "{f}");
        }
    }
}
