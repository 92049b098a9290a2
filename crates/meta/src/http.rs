//! The monitoring side of the metadata server over plain HTTP (bind it to a trusted
//! interface): the dashboard (`crate::dashboard`: `/`, `/transfers`, `/transfers/ID`, sign-in
//! at `/login`), `/api/status` as JSON, and `/metrics` in the Prometheus text format (see
//! [`crate::exposition`]). Read-only; nothing here changes the grid. `/api/status`, `/metrics`
//! and the public part of `/` need no sign-in and show only paths that anybody could list.

use crate::state::Meta;
use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use serde::Serialize;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::net::TcpListener;

#[derive(Serialize)]
pub(crate) struct NodeStatus {
    pub(crate) name: String,
    pub(crate) site: String,
    pub(crate) address: String,
    pub(crate) up: bool,
    /// Being drained (or drained, not yet removed).
    pub(crate) draining: bool,
    pub(crate) capacity: u64,
    pub(crate) free: u64,
    pub(crate) load: f64,
    pub(crate) rate_bytes_per_s: u64,
    pub(crate) sessions: u32,
    pub(crate) replicas: u64,
    pub(crate) last_heartbeat_ms_ago: i64,
}

#[derive(Serialize)]
pub(crate) struct OpStatus {
    pub(crate) op: String,
    pub(crate) calls: u64,
    pub(crate) errors: u64,
    pub(crate) items: u64,
    pub(crate) mean_us: f64,
}

#[derive(Serialize)]
pub(crate) struct Status {
    pub(crate) uptime_s: u64,
    pub(crate) backend: String,
    pub(crate) entries: u64,
    pub(crate) cache_entries: usize,
    pub(crate) cache_hit_ratio: f64,
    pub(crate) nodes: Vec<NodeStatus>,
    pub(crate) ops: Vec<OpStatus>,
    pub(crate) events: Vec<String>,
}

pub(crate) async fn status(meta: &Meta) -> Status {
    let now = catalog::now_ms();
    let infos = meta.node_infos().await.unwrap_or_default();
    let nodes = meta
        .nodes()
        .into_iter()
        .map(|n| NodeStatus {
            replicas: infos
                .iter()
                .find(|i| i.name == n.node.name)
                .map(|i| i.replicas)
                .unwrap_or(0),
            name: n.node.name,
            site: n.node.site,
            address: n.node.address,
            up: n.node.up,
            draining: n.node.drain_ms != 0,
            capacity: n.node.capacity,
            free: n.node.free,
            load: n.node.load,
            rate_bytes_per_s: n.rate,
            sessions: n.sessions,
            last_heartbeat_ms_ago: now - n.node.heartbeat_ms,
        })
        .collect();
    let ops = meta
        .ops
        .lock()
        .expect("ops lock")
        .iter()
        .map(|(op, s)| {
            let calls = s.calls.load(Ordering::Relaxed);
            OpStatus {
                op: op.to_string(),
                calls,
                errors: s.errors.load(Ordering::Relaxed),
                items: s.items.load(Ordering::Relaxed),
                mean_us: s.micros.load(Ordering::Relaxed) as f64 / calls.max(1) as f64,
            }
        })
        .collect();
    let (hits, misses) = meta.catalog.cache().map(|c| c.stats()).unwrap_or((0, 0));
    Status {
        uptime_s: meta.started.elapsed().as_secs(),
        backend: format!("{:?}", meta.catalog.backend()).to_lowercase(),
        entries: meta.catalog.count_inodes().await.unwrap_or(0),
        cache_entries: meta.catalog.cache().map(|c| c.len()).unwrap_or(0),
        cache_hit_ratio: hits as f64 / (hits + misses).max(1) as f64,
        nodes,
        ops,
        // Unauthenticated: only what anybody may see (no path in a directory that is not
        // readable by all).
        events: meta.events_for(&crate::perm::anonymous(), 30).await,
    }
}

async fn api_status(State(meta): State<Arc<Meta>>) -> impl IntoResponse {
    axum::Json(status(&meta).await)
}

async fn metrics(State(meta): State<Arc<Meta>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, transfer::metrics::CONTENT_TYPE)],
        crate::exposition::exposition(&meta).await,
    )
}

/// Serves the dashboard until `stop`, on the hardened listener of `transfer::http`
/// (connection limits, header timeout, bounded connection lifetime).
pub async fn serve(
    meta: Arc<Meta>,
    listener: TcpListener,
    stop: tokio_util::sync::CancellationToken,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/", get(crate::dashboard::overview))
        .route("/transfers", get(crate::dashboard::transfers))
        .route("/transfers/{id}", get(crate::dashboard::transfer))
        .route("/login", get(crate::dashboard::login))
        .route("/logout", get(crate::dashboard::logout))
        .route(
            "/favicon.ico",
            get(|| async { axum::http::StatusCode::NO_CONTENT }),
        )
        .route("/api/status", get(api_status))
        .route("/metrics", get(metrics))
        .with_state(meta);
    transfer::http::serve(
        listener,
        hyper_util::service::TowerToHyperService::new(app),
        transfer::http::HttpLimits::default(),
        stop,
    )
    .await
}
