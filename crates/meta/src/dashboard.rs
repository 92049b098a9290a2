//! The dashboard's pages, rendered on the server with maud (every value is escaped by the
//! template; nothing is assembled as HTML text by hand) and no JavaScript: the overview
//! refreshes itself every 5 seconds.
//!
//! Anyone who reaches the `--http` address sees the public part: storage nodes, operation
//! counters, and events that name only paths anybody may list. A user who signs in (a link
//! from `haul dashboard`, see `crate::webauth`) also sees live copies, throughput per site pair
//! over the last hour and day (from the transfer history), failures, the transfer history with
//! filters, and a page per transfer; as everywhere, their own, or everybody's for an
//! administrator.

use crate::auth::User;
use crate::state::Meta;
use crate::webauth::{Purpose, SESSION_TTL_MS};
use api::meta as pb;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{DOCTYPE, Markup, html};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

#[derive(Serialize)]
pub(crate) struct NodeStatus {
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
pub(crate) struct OpStatus {
    op: String,
    calls: u64,
    errors: u64,
    items: u64,
    mean_us: f64,
}

#[derive(Serialize)]
pub(crate) struct Status {
    uptime_s: u64,
    backend: String,
    entries: u64,
    cache_entries: usize,
    cache_hit_ratio: f64,
    nodes: Vec<NodeStatus>,
    ops: Vec<OpStatus>,
    events: Vec<String>,
}

/// The public figures of the overview and `/api/status`.
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

const COOKIE: &str = "haul_session";

const STYLE: &str = "body{font-family:sans-serif;margin:1.5em;color:#222}\
table{border-collapse:collapse;margin-bottom:1.5em}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}\
th{background:#eee}td.l,th.l{text-align:left}.down,.failed{color:#b00;font-weight:bold}.up,.ok{color:#070}\
nav a{margin-right:1em}form{margin-bottom:1em}svg{border:1px solid #ccc;background:#fcfcfc;margin-right:1em}\
.legend span{margin-right:1em}.note{color:#666}";

const COLOURS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf",
];

fn bytes(b: u64) -> String {
    wire::units::format_bytes(b)
}

fn rate(bps: f64) -> String {
    wire::units::format_rate(bps)
}

use crate::state::rfc3339;

/// The signed-in user of a request (its session cookie), if any.
fn session_user(meta: &Meta, headers: &HeaderMap) -> Option<User> {
    let cookies = headers.get(header::COOKIE)?.to_str().ok()?;
    let token = cookies
        .split(';')
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)?
        .1;
    let name = meta
        .web
        .verify(token, Purpose::Session, catalog::now_ms())
        .ok()?;
    Some(meta.ids.user_named(&name))
}

fn layout(title: &str, user: Option<&User>, refresh: bool, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                @if refresh { meta http-equiv="refresh" content="5"; }
                title { (title) " · longhaul" }
                style { (maud::PreEscaped(STYLE)) }
            }
            body {
                nav {
                    a href="/" { "Overview" }
                    a href="/transfers" { "Transfers" }
                    a href="/api/status" { "JSON" }
                    a href="/metrics" { "Metrics" }
                    @if let Some(u) = user {
                        span id="who" { "signed in as " b { (u.name) } @if u.admin { " (administrator)" } }
                        " " a href="/logout" { "sign out" }
                    } @else {
                        span id="who" class="note" { "not signed in: run " code { "haul dashboard" } " and open the link it prints" }
                    }
                }
                h1 { (title) }
                (body)
            }
        }
    }
}

/// A page as an HTTP response.
fn respond(status: StatusCode, page: Markup) -> Response {
    (status, axum::response::Html(page.into_string())).into_response()
}

fn sign_in_page(status: StatusCode, why: &str) -> Response {
    let page = layout(
        "Sign in",
        None,
        false,
        html! {
            p { (why) }
            p { "Run " code { "haul dashboard" } " (it proves who you are with your grid certificate) and open the link it prints within two minutes." }
        },
    );
    respond(status, page)
}

/// `/login?token=...&next=/path`: a sign-in link's token for a session cookie.
pub async fn login(
    State(meta): State<Arc<Meta>>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Response {
    let now = catalog::now_ms();
    let token = q.get("token").map(String::as_str).unwrap_or_default();
    match meta.web.verify(token, Purpose::Login, now) {
        Ok(user) => {
            let session = meta.web.issue(&user, Purpose::Session, now);
            // Only a path of this site: never an address elsewhere (`//host`, `/\host`).
            let next = q
                .get("next")
                .filter(|n| {
                    n.starts_with('/')
                        && !n.starts_with("//")
                        && !n.contains('\\')
                        && n.len() < 256
                        && n.chars().all(|c| c.is_ascii_graphic())
                })
                .cloned()
                .unwrap_or_else(|| "/".into());
            let cookie = format!(
                "{COOKIE}={session}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}",
                SESSION_TTL_MS / 1000
            );
            ([(header::SET_COOKIE, cookie)], Redirect::to(&next)).into_response()
        }
        Err(e) => sign_in_page(StatusCode::UNAUTHORIZED, &e.to_string()),
    }
}

pub async fn logout() -> Response {
    let cookie = format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0");
    ([(header::SET_COOKIE, cookie)], Redirect::to("/")).into_response()
}

fn outcome(t: &pb::Transfer) -> Markup {
    if t.error_kind.is_empty() && t.files_failed == 0 {
        html! { span class="ok" { "ok" } }
    } else if t.files_failed > 0 && t.files_failed < t.files {
        html! { span class="failed" { "partial: " (t.error_kind) } }
    } else {
        html! { span class="failed" { "failed: " (t.error_kind) } }
    }
}

fn transfer_rate(t: &pb::Transfer) -> f64 {
    t.bytes as f64 * 8.0 / ((t.ended_ms - t.started_ms).max(1) as f64 / 1000.0)
}

fn transfer_rows(list: &[pb::Transfer]) -> Markup {
    html! {
        table class="transfers" {
            tr { th { "id" } th class="l" { "ended" } th class="l" { "user" } th class="l" { "kind" } th { "files" } th { "size" } th { "rate" } th class="l" { "sites" } th class="l" { "result" } th class="l" { "what" } }
            @for t in list {
                tr class="transfer" data-id=(t.id) {
                    td { a href={ "/transfers/" (t.id) } { (t.id) } }
                    td class="l" { (rfc3339(t.ended_ms)) }
                    td class="l" { (t.user) }
                    td class="l" { (t.kind) }
                    td { @if t.files_failed > 0 { (t.files - t.files_failed.min(t.files)) "/" } (t.files) }
                    td { (bytes(t.bytes)) }
                    td { (rate(transfer_rate(t))) }
                    td class="l" { (or_dash(&t.src_site)) " → " (or_dash(&t.dst_site)) }
                    td class="l" { (outcome(t)) @if !t.error.is_empty() { br; span class="note" { (t.error) } } }
                    td class="l" { (t.source) " → " (t.destination) }
                }
            }
        }
    }
}

/// Throughput per site pair over `span_ms` in buckets of `bucket_ms`, as an SVG line chart
/// with a marked point per non-empty bucket.
async fn chart(meta: &Meta, id: &str, title: &str, span_ms: i64, bucket_ms: i64) -> Markup {
    let now = catalog::now_ms();
    let since = (now - span_ms).div_euclid(bucket_ms) * bucket_ms;
    let rows = meta
        .catalog
        .transfer_volume(since, bucket_ms)
        .await
        .unwrap_or_default();
    let buckets = ((now - since) / bucket_ms + 1).max(1) as usize;
    let mut pairs: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (src, dst, b, n) in rows {
        let i = ((b - since) / bucket_ms).clamp(0, buckets as i64 - 1) as usize;
        pairs
            .entry(format!("{} → {}", or_dash(&src), or_dash(&dst)))
            .or_insert_with(|| vec![0; buckets])[i] += n;
    }
    let secs = bucket_ms as f64 / 1000.0;
    let peak = pairs
        .values()
        .flat_map(|v| v.iter())
        .map(|b| *b as f64 * 8.0 / secs)
        .fold(0.0, f64::max)
        .max(1.0);
    let (w, h) = (720.0, 180.0);
    let x = |i: usize| 40.0 + (w - 50.0) * i as f64 / (buckets.max(2) - 1) as f64;
    let y = |bits: f64| h - 20.0 - (h - 40.0) * bits / peak;
    html! {
        div class="chart" id=(id) {
            h3 { (title) }
            svg width=(w) height=(h) viewBox={ "0 0 " (w) " " (h) } role="img" aria-label=(title) {
                text x="4" y="14" font-size="11" { "peak " (rate(peak)) }
                text x="4" y=(h - 4.0) font-size="11" { (rfc3339(since)) }
                text x=(w - 150.0) y=(h - 4.0) font-size="11" { (rfc3339(now)) }
                @for (k, (pair, v)) in pairs.iter().enumerate() {
                    @let colour = COLOURS[k % COLOURS.len()];
                    @let points = v.iter().enumerate().map(|(i, b)| format!("{:.1},{:.1}", x(i), y(*b as f64 * 8.0 / secs))).collect::<Vec<_>>().join(" ");
                    polyline fill="none" stroke=(colour) stroke-width="1.5" points=(points) {}
                    @for (i, b) in v.iter().enumerate() {
                        @if *b > 0 {
                            circle class="pt" r="3" fill=(colour) cx=(format!("{:.1}", x(i))) cy=(format!("{:.1}", y(*b as f64 * 8.0 / secs))) data-pair=(pair) data-bytes=(b) data-start=(rfc3339(since + i as i64 * bucket_ms)) {
                                title { (pair) ": " (bytes(*b)) " in " (rfc3339(since + i as i64 * bucket_ms)) }
                            }
                        }
                    }
                }
            }
            div class="legend" {
                @for (k, pair) in pairs.keys().enumerate() {
                    span style={ "color:" (COLOURS[k % COLOURS.len()]) } { "■ " (pair) }
                }
                @if pairs.is_empty() { span class="note" { "no transfers ended in this time" } }
            }
        }
    }
}

fn or_dash(s: &str) -> &str {
    if s.is_empty() { "-" } else { s }
}

/// A transfer's throughput over time from its client's trace (`seconds:bits_per_second`
/// pairs, checked when stored), drawn as one line.
fn trace_chart(trace: &str) -> Markup {
    let points = transfer::trace::summary::parse_throughput_points(trace).unwrap_or_default();
    let end = points.last().map(|p| p.0).unwrap_or(0.0).max(0.001);
    let peak = points.iter().map(|p| p.1).fold(1.0, f64::max);
    let (w, h) = (720.0, 180.0);
    let x = |t: f64| 40.0 + (w - 50.0) * t / end;
    let y = |bits: f64| h - 20.0 - (h - 40.0) * bits / peak;
    let line = points
        .iter()
        .map(|(t, v)| format!("{:.1},{:.1}", x(*t), y(*v)))
        .collect::<Vec<_>>()
        .join(" ");
    let title = "Throughput over time, from the client's trace";
    html! {
        h2 { "Trace" }
        div class="chart" id="trace" {
            svg width=(w) height=(h) viewBox={ "0 0 " (w) " " (h) } role="img" aria-label=(title) {
                text x="4" y="14" font-size="11" { "peak " (rate(peak)) }
                text x="4" y=(h - 4.0) font-size="11" { "0 s" }
                text x=(w - 60.0) y=(h - 4.0) font-size="11" { (if end < 10.0 { format!("{end:.2} s") } else { format!("{end:.0} s") }) }
                polyline class="trace" fill="none" stroke=(COLOURS[0]) stroke-width="1.5" points=(line) data-points=(points.len()) {}
            }
            p class="note" { (title) ": " (points.len()) " points (means over equal spans of time)." }
        }
    }
}

/// Copies in progress `user` may see: clients' copies and runs as their clients report them,
/// and the server's replication, repair and reconciler runs.
fn live_rows(meta: &Meta, user: &User) -> Markup {
    let copies = meta.live_copies(user).copies;
    html! {
        h2 { "Live copies" }
        @if copies.is_empty() {
            p class="note" id="live-none" { "No copies in progress." }
        } @else {
            table id="live" {
                tr { th class="l" { "who" } th class="l" { "what" } th class="l" { "from → to" } th class="l" { "started" } th { "files" } th { "progress" } th { "rate" } th { "ETA" } th { "streams" } }
                @for c in &copies {
                    @let node_run = c.source.is_empty() && c.destination.is_empty();
                    @let eta = (c.rate_bps > 0.0 && c.bytes_total > c.bytes_done)
                        .then(|| (c.bytes_total - c.bytes_done) as f64 / c.rate_bps);
                    tr class="live" data-kind=(c.kind) {
                        td class="l" { (c.user) }
                        td class="l" { (c.kind) }
                        td class="l" {
                            @if node_run { "node to node" } @else { (c.source) " → " (c.destination) }
                        }
                        td class="l" { (rfc3339(c.started_ms)) }
                        td {
                            (c.files_done) " of " (c.files_total)
                            @if node_run { " copies" }
                            @if c.files_failed > 0 { ", " (c.files_failed) " failed" }
                        }
                        td class="progress" { (bytes(c.bytes_done)) " of " (bytes(c.bytes_total)) " (" (format!("{:.0}", 100.0 * c.bytes_done as f64 / c.bytes_total.max(1) as f64)) "%)" }
                        td { (rate(c.rate_bps * 8.0)) }
                        td { @if let Some(s) = eta { (format!("{s:.0} s")) } @else { "—" } }
                        td { (c.streams) @if node_run { @if c.streams == 1 { " session" } @else { " sessions" } } }
                    }
                }
            }
        }
    }
}

/// Transfer jobs: the user's (an administrator's: everybody's), active ones and the newest.
async fn job_rows(meta: &Meta, user: &User) -> Markup {
    let jobs = meta
        .list_jobs(
            user,
            &pb::JobsRequest {
                limit: 20,
                all_users: user.admin,
                ..Default::default()
            },
        )
        .await
        .map(|r| r.jobs)
        .unwrap_or_default();
    html! {
        h2 { "Transfer jobs" }
        @if jobs.is_empty() {
            p class="note" id="jobs-none" { "No jobs (haul submit hands copies to the grid)." }
        } @else {
            table id="jobs" {
                tr { th { "job" } th class="l" { "who" } th { "priority" } th class="l" { "state" } th { "files" } th { "progress" } th { "failed" } th class="l" { "submitted" } th class="l" { "ended" } }
                @for j in &jobs {
                    tr class="job" data-state=(j.state) {
                        td { (j.id) }
                        td class="l" { (j.user) }
                        td { (j.priority) }
                        td class="l" {
                            @if j.state == "failed" || j.state == "cancelled" {
                                span class="failed" { (j.state) }
                            } @else {
                                (j.state)
                            }
                        }
                        td { (j.files_done) " of " (j.files) }
                        td class="progress" { (bytes(j.bytes_done)) " of " (bytes(j.bytes)) " (" (format!("{:.0}", 100.0 * j.bytes_done as f64 / j.bytes.max(1) as f64)) "%)" }
                        td { (j.files_failed) }
                        td class="l" { (rfc3339(j.created_ms)) }
                        td class="l" { @if j.ended_ms > 0 { (rfc3339(j.ended_ms)) } @else { "—" } }
                    }
                }
            }
        }
    }
}

/// `/`: the public view, and with a session the user's.
pub async fn overview(State(meta): State<Arc<Meta>>, headers: HeaderMap) -> Response {
    let user = session_user(&meta, &headers);
    let s = status(&meta).await;
    let viewer = user.clone().unwrap_or_else(crate::perm::anonymous);
    let rec = crate::reconcile::status_reply(&meta, &viewer).await.ok();
    let events = meta.events_for(&viewer, 30).await;
    let mut signed_in = html! {};
    if let Some(u) = &user {
        let recent = meta
            .list_transfers(
                u,
                &pb::TransfersRequest {
                    limit: 15,
                    ..Default::default()
                },
            )
            .await
            .map(|r| r.transfers)
            .unwrap_or_default();
        let failed = meta
            .list_transfers(
                u,
                &pb::TransfersRequest {
                    limit: 10,
                    failed: true,
                    since_ms: catalog::now_ms() - 86_400_000,
                    ..Default::default()
                },
            )
            .await
            .map(|r| r.transfers)
            .unwrap_or_default();
        let hour = chart(
            &meta,
            "chart-hour",
            "Throughput per site pair, last hour (1-minute buckets)",
            3_600_000,
            60_000,
        )
        .await;
        let day = chart(
            &meta,
            "chart-day",
            "Throughput per site pair, last day (30-minute buckets)",
            86_400_000,
            1_800_000,
        )
        .await;
        let jobs = job_rows(&meta, u).await;
        signed_in = html! {
            (live_rows(&meta, u))
            (jobs)
            h2 { "Throughput" }
            (hour)
            (day)
            h2 { "Failures in the last day" }
            @if failed.is_empty() { p class="note" id="failures-none" { "None." } } @else { div id="failures" { (transfer_rows(&failed)) } }
            h2 { "Recent transfers" }
            div id="recent" { (transfer_rows(&recent)) }
            p { a href="/transfers" { "All transfers, with filters" } }
        };
    }
    let page = layout(
        "longhaul grid",
        user.as_ref(),
        true,
        html! {
            p class="note" {
                "catalog: " (s.backend) " (" (s.entries) " entries, cache " (s.cache_entries) " entries, "
                (format!("{:.0}", s.cache_hit_ratio * 100.0)) "% hits) · up " (s.uptime_s) " s"
            }
            (signed_in)
            h2 { "Storage nodes" }
            table id="nodes" {
                tr { th class="l" { "node" } th class="l" { "site" } th class="l" { "address" } th class="l" { "state" } th { "free" } th { "capacity" } th { "load" } th { "rate" } th { "sessions" } th { "replicas" } th { "heartbeat" } }
                @for n in &s.nodes {
                    tr {
                        td class="l" { (n.name) }
                        td class="l" { (n.site) }
                        td class="l" { (n.address) }
                        td class={ "l " (if n.up { "up" } else { "down" }) } {
                            (match (n.up, n.draining) { (true, false) => "up", (true, true) => "up, draining", (false, false) => "DOWN", (false, true) => "DOWN, draining" })
                        }
                        td { (bytes(n.free)) }
                        td { (bytes(n.capacity)) }
                        td { (format!("{:.2}", n.load)) }
                        td { (rate(n.rate_bytes_per_s as f64 * 8.0)) }
                        td { (n.sessions) }
                        td { (n.replicas) }
                        td { (format!("{:.1} s ago", n.last_heartbeat_ms_ago as f64 / 1000.0)) }
                    }
                }
            }
            @if let Some(r) = &rec {
                h2 { "Policies and the reconciler" }
                p {
                    (r.under_replicated) " files short of their policy, " (r.over_replicated) " surplus copies, "
                    (r.repairs_running) " copies being made, " (r.repairs_done) " made and " (r.removals_done) " removed so far"
                    @if r.last_pass_ms > 0 { "; last pass " (rfc3339(r.last_pass_ms)) (format!(" ({:.1} s)", r.last_pass_seconds)) }
                    @if r.moving > 0 { "; " (r.moving) " files moving off draining nodes" }
                }
                @if !r.policies.is_empty() {
                    table id="policies" {
                        tr { th class="l" { "path" } th { "copies" } th class="l" { "sites" } th class="l" { "streams" } }
                        @for p in &r.policies {
                            tr { td class="l" { (p.path) } td { (p.copies) } td class="l" { (p.sites.join(", ")) } td class="l" { (if p.private { "private" } else { "clear" }) } }
                        }
                    }
                }
            }
            h2 { "Operations" }
            table id="ops" {
                tr { th class="l" { "operation" } th { "calls" } th { "errors" } th { "items" } th { "mean µs" } }
                @for o in &s.ops {
                    tr { td class="l" { (o.op) } td { (o.calls) } td { (o.errors) } td { (o.items) } td { (format!("{:.0}", o.mean_us)) } }
                }
            }
            h2 { "Events" }
            pre id="events" { @for e in &events { (e) "\n" } }
        },
    );
    respond(StatusCode::OK, page)
}

/// `/transfers?user=&site=&kind=&failed=on&since=HOURS`: the history with filters.
pub async fn transfers(
    State(meta): State<Arc<Meta>>,
    headers: HeaderMap,
    Query(q): Query<BTreeMap<String, String>>,
) -> Response {
    let Some(user) = session_user(&meta, &headers) else {
        return sign_in_page(
            StatusCode::UNAUTHORIZED,
            "The transfer history needs you signed in.",
        );
    };
    let get = |k: &str| q.get(k).map(|v| v.trim().to_string()).unwrap_or_default();
    let hours: f64 = get("since").parse().unwrap_or(0.0);
    let req = pb::TransfersRequest {
        user: get("user"),
        site: get("site"),
        kind: get("kind"),
        failed: !get("failed").is_empty(),
        since_ms: if hours > 0.0 {
            catalog::now_ms() - (hours.min(1e6) * 3_600_000.0) as i64
        } else {
            0
        },
        limit: 200,
        ..Default::default()
    };
    let list = meta.list_transfers(&user, &req).await;
    let page = layout(
        "Transfers",
        Some(&user),
        false,
        html! {
            form method="get" action="/transfers" {
                label { "user " input name="user" value=(req.user) size="10"; } " "
                label { "site " input name="site" value=(req.site) size="8"; } " "
                label { "kind "
                    select name="kind" {
                        option value="" { "any" }
                        @for k in ["upload", "download", "copy", "run", "replicate", "repair", "reconcile"] {
                            option value=(k) selected[req.kind == k] { (k) }
                        }
                    }
                } " "
                label { "ended in the last " input name="since" value=(get("since")) size="4"; " hours" } " "
                label { input type="checkbox" name="failed" checked[req.failed]; " failed only" } " "
                button type="submit" { "Show" }
            }
            @match &list {
                Ok(r) => {
                    @if r.transfers.is_empty() { p class="note" { "No transfers match." } }
                    @else { (transfer_rows(&r.transfers)) }
                }
                Err(e) => { p class="failed" { (e.message()) } }
            }
        },
    );
    respond(StatusCode::OK, page)
}

/// `/transfers/ID`: one transfer and each file's outcome.
pub async fn transfer(
    State(meta): State<Arc<Meta>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let Some(user) = session_user(&meta, &headers) else {
        return sign_in_page(
            StatusCode::UNAUTHORIZED,
            "Transfers are shown to those signed in.",
        );
    };
    let Ok(id) = id.parse::<i64>() else {
        return respond(
            StatusCode::NOT_FOUND,
            layout(
                "No such transfer",
                Some(&user),
                false,
                html! { p { "Transfer ids are numbers." } },
            ),
        );
    };
    let got = meta
        .get_transfer(
            &user,
            &pb::TransferRequest {
                id,
                offset: 0,
                limit: 1000,
            },
        )
        .await;
    let (t, files) = match got {
        Ok(pb::TransferReply {
            transfer: Some(t),
            files,
        }) => (t, files),
        Ok(_) | Err(_) => {
            let msg = format!("transfer {id}: no such transfer among yours");
            return respond(
                StatusCode::NOT_FOUND,
                layout(
                    "No such transfer",
                    Some(&user),
                    false,
                    html! { p { (msg) } },
                ),
            );
        }
    };
    let page = layout(
        &format!("Transfer {}", t.id),
        Some(&user),
        false,
        html! {
            table id="transfer" {
                tr { th class="l" { "kind" } td class="l" { (t.kind) } }
                tr { th class="l" { "user" } td class="l" { (t.user) } }
                tr { th class="l" { "result" } td class="l" { (outcome(&t)) } }
                @if !t.error.is_empty() { tr { th class="l" { "error" } td class="l" { (t.error) " (exit " (t.exit_code) ")" } } }
                tr { th class="l" { "from" } td class="l" { (t.source) " (site " (or_dash(&t.src_site)) ")" } }
                tr { th class="l" { "to" } td class="l" { (t.destination) " (site " (or_dash(&t.dst_site)) ")" } }
                tr { th class="l" { "started" } td class="l" { (rfc3339(t.started_ms)) } }
                tr { th class="l" { "ended" } td class="l" { (rfc3339(t.ended_ms)) " (" (format!("{:.1}", (t.ended_ms - t.started_ms) as f64 / 1000.0)) " s)" } }
                tr { th class="l" { "files" } td class="l" { (t.files - t.files_failed.min(t.files)) " of " (t.files) } }
                tr { th class="l" { "bytes" } td class="l" { (bytes(t.bytes)) " delivered, " (bytes(t.bytes_moved)) " over the network, " (rate(transfer_rate(&t))) } }
                tr { th class="l" { "streams, attempts, retransmits" } td class="l" { (t.streams) ", " (t.attempts) ", " (t.retransmits) } }
                @if !t.summary.is_empty() { tr { th class="l" { "summary" } td class="l" { (t.summary) } } }
            }
            @if !t.trace.is_empty() { (trace_chart(&t.trace)) }
            h2 { "Files" }
            table id="files" {
                tr { th class="l" { "path" } th class="l" { "node" } th { "size" } th class="l" { "checksums or error" } }
                @for f in &files {
                    tr class={ "file " (if f.error_kind.is_empty() { "ok" } else { "failed" }) } {
                        td class="l" { (f.path) }
                        td class="l" { (f.node) }
                        td { (bytes(f.bytes)) }
                        td class="l" { @if f.error_kind.is_empty() { (f.checksum) } @else { (f.error_kind) ": " (f.error) } }
                    }
                }
            }
            @if files.len() as u64 == 1000 { p class="note" { "The first 1,000 files; " code { "haul transfers --id " (t.id) } " lists all." } }
        },
    );
    respond(StatusCode::OK, page)
}
