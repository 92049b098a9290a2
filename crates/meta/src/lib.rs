//! The metadata server (`haul meta serve`): owns the grid's namespace, replica catalog and
//! node registry (in the `catalog` crate), and serves them over gRPC (the `api` crate) on
//! mutually authenticated TLS. Clients use the `Namespace` and `Files` services; storage nodes
//! the `NodeService`. Background tasks mark silent nodes down and drop abandoned uploads. An
//! HTTP listener serves a dashboard, a JSON status and Prometheus metrics.
//!
//! The server never moves file data: clients and nodes do, with capabilities it signs.

pub mod auth;
pub mod enrol;
mod files;
pub mod http;
mod namespace;
mod nodes;
pub mod perm;
pub mod placement;
pub mod reconcile;
pub mod replication;
pub mod state;
pub mod verify;

pub use state::{Meta, Settings};

use api::meta::files_server::FilesServer;
use api::meta::namespace_server::NamespaceServer;
use api::meta::node_service_server::NodeServiceServer;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// Largest gRPC message either way (batches of thousands of files).
pub const MAX_MESSAGE: usize = 64 << 20;

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

/// Takes the data directory's lock, so that two servers never use one SQLite catalog.
/// The lock is held as long as the returned file is open.
pub fn lock_data_dir(dir: &Path) -> Result<std::fs::File, MetaError> {
    use std::os::fd::AsRawFd;
    std::fs::create_dir_all(dir).map_err(|e| {
        MetaError::Config(format!(
            "cannot create data directory {}: {e}",
            dir.display()
        ))
    })?;
    let path = dir.join("meta.lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| MetaError::Config(format!("cannot open {}: {e}", path.display())))?;
    // flock: released by the kernel when the process exits, however it exits.
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if r != 0 {
        return Err(MetaError::Config(format!(
            "{} is in use by another metadata server (for several servers, share a PostgreSQL database)",
            dir.display()
        )));
    }
    Ok(f)
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
    let incoming = auth::incoming(listener, Arc::new(tls));
    let stop = tokio_util::sync::CancellationToken::new();
    let tasks = spawn_background(meta.clone(), stop.clone());
    if let Some(h) = http {
        let m = meta.clone();
        let s = stop.clone();
        tokio::spawn(async move {
            if let Err(e) = http::serve(m, h, s).await {
                tracing::error!(error = %e, "dashboard stopped");
            }
        });
    }
    let ns = NamespaceServer::new(namespace::NamespaceService { meta: meta.clone() })
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE);
    let files = FilesServer::new(files::FilesService { meta: meta.clone() })
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE);
    let nodes = NodeServiceServer::new(nodes::NodeServiceImpl { meta: meta.clone() })
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE);
    let r = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
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
    let mut tasks = vec![liveness, pending, reconciler, warmer];
    if let Some(every) = meta.settings.scrub_every {
        tasks.push(tokio::spawn(verify::scrub(
            meta.clone(),
            every,
            stop.clone(),
        )));
    }
    tasks
}
