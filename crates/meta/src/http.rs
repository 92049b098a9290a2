//! The monitoring side of the metadata server over plain HTTP (bind it to a trusted
//! interface): `/` a dashboard that refreshes itself, `/api/status` the same as JSON, and
//! `/metrics` in the Prometheus text format (see [`crate::exposition`]). Read-only; nothing here changes the grid. No one
//! is authenticated here: events show only paths that anybody could list.

use crate::state::Meta;
use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::{Html, IntoResponse};
use axum::routing::get;
use serde::Serialize;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::net::TcpListener;

#[derive(Serialize)]
struct NodeStatus {
    name: String,
    site: String,
    address: String,
    up: bool,
    /// Being drained (or drained, not yet removed).
    draining: bool,
    capacity: u64,
    free: u64,
    load: f64,
    rate_bytes_per_s: u64,
    sessions: u32,
    replicas: u64,
    last_heartbeat_ms_ago: i64,
}

#[derive(Serialize)]
struct OpStatus {
    op: String,
    calls: u64,
    errors: u64,
    items: u64,
    mean_us: f64,
}

#[derive(Serialize)]
struct Status {
    uptime_s: u64,
    backend: String,
    entries: u64,
    cache_entries: usize,
    cache_hit_ratio: f64,
    nodes: Vec<NodeStatus>,
    ops: Vec<OpStatus>,
    events: Vec<String>,
}

async fn status(meta: &Meta) -> Status {
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

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn gb(b: u64) -> String {
    format!("{:.1}", b as f64 / 1e9)
}

async fn dashboard(State(meta): State<Arc<Meta>>) -> impl IntoResponse {
    let s = status(&meta).await;
    let mut h = String::from(
        "<!doctype html><html><head><meta charset=utf-8><meta http-equiv=refresh content=2>\
         <title>longhaul grid</title><style>body{font-family:sans-serif;margin:1.5em}\
         table{border-collapse:collapse;margin-bottom:1.5em}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}\
         th{background:#eee}td.l{text-align:left}.down{color:#b00;font-weight:bold}.up{color:#070}</style></head><body>",
    );
    h.push_str(&format!(
        "<h1>longhaul grid</h1><p>catalog: {} ({} entries, cache {} entries, {:.0}% hits) &middot; up {} s &middot; \
         <a href=/api/status>JSON</a> &middot; <a href=/metrics>metrics</a></p>",
        s.backend,
        s.entries,
        s.cache_entries,
        s.cache_hit_ratio * 100.0,
        s.uptime_s
    ));
    h.push_str("<h2>Storage nodes</h2><table><tr><th>node<th>site<th>address<th>state<th>free GB<th>capacity GB<th>load<th>rate MB/s<th>sessions<th>replicas<th>heartbeat</tr>");
    for n in &s.nodes {
        h.push_str(&format!(
            "<tr><td class=l>{}<td class=l>{}<td class=l>{}<td class={}>{}<td>{}<td>{}<td>{:.2}<td>{:.1}<td>{}<td>{}<td>{:.1} s ago</tr>",
            esc(&n.name),
            esc(&n.site),
            esc(&n.address),
            if n.up { "up" } else { "down" },
            match (n.up, n.draining) {
                (true, false) => "up",
                (true, true) => "up, draining",
                (false, false) => "DOWN",
                (false, true) => "DOWN, draining",
            },
            gb(n.free),
            gb(n.capacity),
            n.load,
            n.rate_bytes_per_s as f64 / 1e6,
            n.sessions,
            n.replicas,
            n.last_heartbeat_ms_ago as f64 / 1000.0
        ));
    }
    h.push_str("</table><h2>Operations</h2><table><tr><th>operation<th>calls<th>errors<th>items<th>mean µs</tr>");
    for o in &s.ops {
        h.push_str(&format!(
            "<tr><td class=l>{}<td>{}<td>{}<td>{}<td>{:.0}</tr>",
            esc(&o.op),
            o.calls,
            o.errors,
            o.items,
            o.mean_us
        ));
    }
    h.push_str("</table><h2>Events</h2><pre>");
    for e in &s.events {
        h.push_str(&esc(e));
        h.push('\n');
    }
    h.push_str("</pre></body></html>");
    Html(h)
}

/// Serves the dashboard until `stop`, on the hardened listener of `transfer::http`
/// (connection limits, header timeout, bounded connection lifetime).
pub async fn serve(
    meta: Arc<Meta>,
    listener: TcpListener,
    stop: tokio_util::sync::CancellationToken,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/", get(dashboard))
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
