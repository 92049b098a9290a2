//! The metadata server's `/metrics` page (Prometheus text format, through
//! `prometheus-client`: `HELP` and `TYPE` for every family, label values escaped, so that a
//! site named `a"b` cannot break the page), built at each scrape: what accumulates
//! ([`crate::metrics::MetaMetrics`]), then operation counts, the catalog's size and cache,
//! every node's state, capacity, load and rate, the reconciler's backlog and progress, and the
//! build.

use crate::metrics::{NodeLabels, OpLabels};
use crate::state::Meta;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicU64, Ordering};

fn gauge(registry: &mut Registry, name: &str, help: &str, value: i64) {
    let g: Gauge = Gauge::default();
    g.set(value);
    registry.register(name, help, g);
}

fn gauge_f64(registry: &mut Registry, name: &str, help: &str, value: f64) {
    let g: Gauge<f64, AtomicU64> = Gauge::default();
    g.set(value);
    registry.register(name, help, g);
}

/// The whole `/metrics` page, as of now.
pub async fn exposition(meta: &Meta) -> String {
    let mut r = Registry::default();
    transfer::metrics::register_build_info(&mut r);
    gauge(
        &mut r,
        "haul_meta_uptime_seconds",
        "Seconds since this metadata server started",
        meta.started.elapsed().as_secs() as i64,
    );
    gauge(
        &mut r,
        "haul_meta_catalog_entries",
        "Files and directories in the catalog",
        meta.catalog.count_inodes().await.unwrap_or(0) as i64,
    );
    let (hits, misses) = meta.catalog.cache().map(|c| c.stats()).unwrap_or((0, 0));
    gauge(
        &mut r,
        "haul_meta_cache_entries",
        "Entries in the catalog's lookup cache",
        meta.catalog.cache().map(|c| c.len()).unwrap_or(0) as i64,
    );
    gauge_f64(
        &mut r,
        "haul_meta_cache_hit_ratio",
        "Share of catalog lookups answered from the cache since the start",
        hits as f64 / (hits + misses).max(1) as f64,
    );

    // Operations: counters read from the per-operation tallies, latency from the histograms.
    let calls: Family<OpLabels, Counter> = Family::default();
    let errors: Family<OpLabels, Counter> = Family::default();
    let items: Family<OpLabels, Counter> = Family::default();
    for (op, s) in meta.ops.lock().expect("ops lock").iter() {
        let l = OpLabels { op };
        calls
            .get_or_create(&l)
            .inc_by(s.calls.load(Ordering::Relaxed));
        errors
            .get_or_create(&l)
            .inc_by(s.errors.load(Ordering::Relaxed));
        items
            .get_or_create(&l)
            .inc_by(s.items.load(Ordering::Relaxed));
    }
    r.register(
        "haul_meta_rpc_calls",
        "Calls of each catalog operation",
        calls,
    );
    r.register(
        "haul_meta_rpc_errors",
        "Calls of each catalog operation that failed",
        errors,
    );
    r.register(
        "haul_meta_rpc_items",
        "Things handled by each catalog operation (entries listed, replicas reported)",
        items,
    );
    meta.metrics.register(&mut r);

    // Nodes, as the registry holds them now.
    let infos = meta.node_infos().await.unwrap_or_default();
    let now = catalog::now_ms();
    let up: Family<NodeLabels, Gauge> = Family::default();
    let capacity: Family<NodeLabels, Gauge> = Family::default();
    let free: Family<NodeLabels, Gauge> = Family::default();
    let load: Family<NodeLabels, Gauge<f64, AtomicU64>> = Family::default();
    let rate: Family<NodeLabels, Gauge> = Family::default();
    let sessions: Family<NodeLabels, Gauge> = Family::default();
    let replicas: Family<NodeLabels, Gauge> = Family::default();
    let heartbeat: Family<NodeLabels, Gauge<f64, AtomicU64>> = Family::default();
    let stored: Family<NodeLabels, Gauge> = Family::default();
    let draining: Family<NodeLabels, Gauge> = Family::default();
    for n in meta.nodes() {
        let l = NodeLabels {
            node: n.node.name.clone(),
            site: n.node.site.clone(),
        };
        up.get_or_create(&l).set(n.node.up as i64);
        capacity.get_or_create(&l).set(n.node.capacity as i64);
        free.get_or_create(&l).set(n.node.free as i64);
        load.get_or_create(&l).set(n.node.load);
        rate.get_or_create(&l).set(n.rate as i64);
        sessions.get_or_create(&l).set(n.sessions as i64);
        let info = infos.iter().find(|i| i.name == n.node.name);
        replicas
            .get_or_create(&l)
            .set(info.map_or(0, |i| i.replicas as i64));
        stored
            .get_or_create(&l)
            .set(info.map_or(0, |i| i.stored_bytes as i64));
        draining
            .get_or_create(&l)
            .set((n.node.drain_ms != 0) as i64);
        heartbeat
            .get_or_create(&l)
            .set((now - n.node.heartbeat_ms) as f64 / 1000.0);
    }
    r.register(
        "haul_node_up",
        "1 when the node's heartbeats arrive, else 0",
        up,
    );
    r.register(
        "haul_node_capacity_bytes",
        "Size of the node's file system (or its configured capacity)",
        capacity,
    );
    r.register("haul_node_free_bytes", "Free space the node reported", free);
    r.register("haul_node_load", "The node's load average per core", load);
    r.register(
        "haul_node_rate_bytes_per_second",
        "The node's delivery rate in its last heartbeat",
        rate,
    );
    r.register(
        "haul_node_sessions",
        "Transfer sessions running on the node",
        sessions,
    );
    r.register(
        "haul_node_replicas",
        "Replicas the catalog places on the node",
        replicas,
    );
    r.register(
        "haul_node_stored_bytes",
        "Bytes of the complete replicas the catalog places on the node",
        stored,
    );
    r.register(
        "haul_node_draining",
        "1 while the node is being drained (or drained and not yet removed), else 0",
        draining,
    );
    r.register(
        "haul_node_heartbeat_age_seconds",
        "Seconds since the node's last heartbeat",
        heartbeat,
    );

    // The reconciler: its backlog and what it has done.
    let st = meta.reconciler.lock().expect("reconciler").clone();
    gauge(
        &mut r,
        "haul_reconcile_under_replicated_files",
        "Files with fewer complete copies than their policy asks, at the last pass",
        st.under_replicated as i64,
    );
    gauge(
        &mut r,
        "haul_reconcile_moving_files",
        "Files being copied off draining nodes (their policies hold meanwhile), at the last pass",
        st.moving as i64,
    );
    gauge(
        &mut r,
        "haul_reconcile_over_replicated_files",
        "Files with more copies than their policy asks, at the last pass",
        st.over_replicated as i64,
    );
    gauge(
        &mut r,
        "haul_reconcile_copies_running",
        "Copies the reconciler is making now",
        st.running as i64,
    );
    let repairs: Counter = Counter::default();
    repairs.inc_by(st.repairs_done);
    r.register(
        "haul_reconcile_repairs",
        "Copies the reconciler has made since the start",
        repairs,
    );
    let removals: Counter = Counter::default();
    removals.inc_by(st.removals_done);
    r.register(
        "haul_reconcile_removals",
        "Surplus copies the reconciler has removed since the start",
        removals,
    );
    gauge_f64(
        &mut r,
        "haul_reconcile_last_pass_timestamp_seconds",
        "When the reconciler's last pass ended (Unix time; 0: none yet)",
        st.last_pass_ms as f64 / 1000.0,
    );
    gauge_f64(
        &mut r,
        "haul_reconcile_last_pass_duration_seconds",
        "How long the reconciler's last pass took",
        st.last_pass_seconds,
    );
    transfer::metrics::encode(&r)
}
