//! What an endpoint (`haul serve`, a storage node) has moved, for Prometheus: the families of
//! the data plane, the live figures a storage node reports in its heartbeats, and how one
//! session's events are counted into them ([`SessionTally`]).
//!
//! Families (Prometheus text format, `HELP` and `TYPE` for each, label values escaped by
//! `prometheus-client`):
//!
//! | family | type | labels |
//! |---|---|---|
//! | `haul_transfer_bytes_total` | counter | `direction` (`send`, `receive`) |
//! | `haul_transfer_files_total` | counter | `direction`, `result` (`done`, `skipped`, `failed`) |
//! | `haul_transfer_file_size_bytes` | histogram | `direction` (files done) |
//! | `haul_transfer_file_duration_seconds` | histogram | `direction` (files done) |
//! | `haul_sessions_active` | gauge | `direction` |
//! | `haul_streams_active` | gauge | `direction` (data streams bound to transfer sessions in progress) |
//! | `haul_sessions_total` | counter | `direction`, `result` (`ok`, `failed`) |
//! | `haul_tcp_retransmits_total` | counter | `direction` |
//! | `haul_connections_open` | gauge | (control connections, and data connections until they join their session) |
//! | `haul_connections_refused_total` | counter | (over the connection limits) |
//! | `haul_build_info` | gauge | `version` |
//!
//! A daemon adds its own identity as constant labels (a storage node: `node`, `site`), so that
//! the sum over nodes by site pair is one PromQL expression.

use crate::progress::Event;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Instant;
use wire::control::SessionSummary;

/// Which way a session moved data, from this endpoint's side.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    Send,
    Receive,
}

impl Direction {
    fn label(self) -> &'static str {
        match self {
            Direction::Send => "send",
            Direction::Receive => "receive",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabels {
    direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    direction: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabels {
    version: &'static str,
}

type HistogramFamily = Family<DirectionLabels, Histogram, fn() -> Histogram>;

fn size_histogram() -> Histogram {
    // 4 KiB to 256 GiB, ×4 per bucket.
    Histogram::new(exponential_buckets(4096.0, 4.0, 14))
}

fn duration_histogram() -> Histogram {
    // 10 ms to about 45 hours, ×4 per bucket.
    Histogram::new(exponential_buckets(0.01, 4.0, 12))
}

/// The data plane's families, shared by every session of one endpoint.
#[derive(Clone, Debug)]
pub struct EndpointMetrics {
    bytes: Family<DirectionLabels, Counter>,
    files: Family<ResultLabels, Counter>,
    file_size: HistogramFamily,
    file_duration: HistogramFamily,
    sessions_active: Family<DirectionLabels, Gauge>,
    streams_active: Family<DirectionLabels, Gauge>,
    sessions: Family<ResultLabels, Counter>,
    retransmits: Family<DirectionLabels, Counter>,
    connections_open: Gauge,
    connections_refused: Counter,
}

impl Default for EndpointMetrics {
    /// Every series exists from the start, at zero (Prometheus's advice: a series that
    /// appears only with its first event breaks `rate()` and alerts on absence).
    fn default() -> Self {
        let m = Self {
            bytes: Family::default(),
            files: Family::default(),
            file_size: Family::new_with_constructor(size_histogram),
            file_duration: Family::new_with_constructor(duration_histogram),
            sessions_active: Family::default(),
            streams_active: Family::default(),
            sessions: Family::default(),
            retransmits: Family::default(),
            connections_open: Gauge::default(),
            connections_refused: Counter::default(),
        };
        for direction in [Direction::Send, Direction::Receive].map(Direction::label) {
            let d = DirectionLabels { direction };
            let _ = m.bytes.get_or_create(&d);
            let _ = m.file_size.get_or_create(&d);
            let _ = m.file_duration.get_or_create(&d);
            let _ = m.sessions_active.get_or_create(&d);
            let _ = m.streams_active.get_or_create(&d);
            let _ = m.retransmits.get_or_create(&d);
            for result in ["done", "skipped", "failed"] {
                let _ = m.files.get_or_create(&ResultLabels { direction, result });
            }
            for result in ["ok", "failed"] {
                let _ = m
                    .sessions
                    .get_or_create(&ResultLabels { direction, result });
            }
        }
        m
    }
}

impl EndpointMetrics {
    /// Adds these families to `registry` (which may carry the daemon's constant labels).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "haul_transfer_bytes",
            "Payload bytes sent or received by sessions of this endpoint",
            self.bytes.clone(),
        );
        registry.register(
            "haul_transfer_files",
            "Files of sessions of this endpoint by outcome (skipped: the destination had them)",
            self.files.clone(),
        );
        registry.register(
            "haul_transfer_file_size_bytes",
            "Size of each file sent or received",
            self.file_size.clone(),
        );
        registry.register(
            "haul_transfer_file_duration_seconds",
            "Time from a file's first byte to its verification",
            self.file_duration.clone(),
        );
        registry.register(
            "haul_sessions_active",
            "Transfer sessions running",
            self.sessions_active.clone(),
        );
        registry.register(
            "haul_streams_active",
            "Data streams bound to transfer sessions in progress",
            self.streams_active.clone(),
        );
        registry.register(
            "haul_sessions",
            "Transfer sessions ended, by outcome",
            self.sessions.clone(),
        );
        registry.register(
            "haul_tcp_retransmits",
            "TCP segments retransmitted on data streams, as the kernel counted them",
            self.retransmits.clone(),
        );
        registry.register(
            "haul_connections_open",
            "Connections admitted and not yet closed: control connections, and data connections until they join their session",
            self.connections_open.clone(),
        );
        registry.register(
            "haul_connections_refused",
            "Connections refused as they were accepted, over the connection limits",
            self.connections_refused.clone(),
        );
    }

    /// A connection was admitted; it counts as open until the returned guard is dropped.
    pub fn connection_opened(&self) -> ConnectionOpen {
        self.connections_open.inc();
        ConnectionOpen(self.connections_open.clone())
    }

    /// A data stream joined a transfer session of `direction`; it counts as active until the
    /// returned guard is dropped (when the stream's reader ends).
    pub fn stream_opened(&self, direction: Direction) -> ConnectionOpen {
        let g = self
            .streams_active
            .get_or_create(&DirectionLabels {
                direction: direction.label(),
            })
            .clone();
        g.inc();
        ConnectionOpen(g)
    }

    pub fn connection_refused(&self) {
        self.connections_refused.inc();
    }
}

/// Counts one connection (or data stream) as open while alive.
pub struct ConnectionOpen(Gauge);

impl Drop for ConnectionOpen {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// `haul_build_info{version="..."} 1`, for every daemon.
pub fn register_build_info(registry: &mut Registry) {
    registry.register(
        "haul_build",
        "The longhaul version this daemon runs",
        Info::new(VersionLabels {
            version: env!("CARGO_PKG_VERSION"),
        }),
    );
}

/// Encodes `registry` in the Prometheus text format (version 0.0.4).
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, registry);
    out
}

/// The `Content-Type` of [`encode`]'s output.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Serves `registry` at `GET /metrics` on `listener` until `stop` (the hardened listener of
/// [`crate::http`]): 404 for any other path, 405 for any other method.
pub async fn serve(
    listener: tokio::net::TcpListener,
    registry: Arc<Registry>,
    stop: tokio_util::sync::CancellationToken,
) -> std::io::Result<()> {
    let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let registry = registry.clone();
        async move { Ok::<_, std::convert::Infallible>(respond(&req, &registry)) }
    });
    crate::http::serve(listener, service, crate::http::HttpLimits::default(), stop).await
}

fn respond<B>(
    req: &hyper::Request<B>,
    registry: &Registry,
) -> hyper::Response<http_body_util::Full<hyper::body::Bytes>> {
    use hyper::{Method, StatusCode, header};
    let reply = |status: StatusCode, kind: &'static str, body: String| {
        let mut r = hyper::Response::new(http_body_util::Full::new(body.into()));
        *r.status_mut() = status;
        r.headers_mut()
            .insert(header::CONTENT_TYPE, header::HeaderValue::from_static(kind));
        r
    };
    if req.uri().path() != "/metrics" {
        return reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found: metrics are at /metrics\n".into(),
        );
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "only GET\n".into(),
        );
        r.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    reply(StatusCode::OK, CONTENT_TYPE, encode(registry))
}

/// Sessions running and bytes moved by an endpoint: the live figures a storage node reports
/// in its heartbeats, and the endpoint's Prometheus families.
#[derive(Default, Debug)]
pub struct EndpointStats {
    pub sessions: AtomicU32,
    /// Payload bytes sent or received, updated while sessions run.
    pub bytes: AtomicU64,
    pub metrics: EndpointMetrics,
}

/// One session's share of its endpoint's figures: counted running from [`SessionTally::new`]
/// until dropped; its files as their events arrive; its bytes as they are reported; its outcome
/// and retransmissions at [`SessionTally::finish`].
pub struct SessionTally {
    stats: Arc<EndpointStats>,
    direction: Direction,
    /// When each file in flight began (`Event::FileStarted`).
    started: HashMap<String, Instant>,
    /// Bytes already added to the endpoint's counters.
    reported: u64,
}

impl SessionTally {
    pub fn new(stats: Arc<EndpointStats>, direction: Direction) -> Self {
        stats.sessions.fetch_add(1, Ordering::Relaxed);
        stats
            .metrics
            .sessions_active
            .get_or_create(&DirectionLabels {
                direction: direction.label(),
            })
            .inc();
        Self {
            stats,
            direction,
            started: HashMap::new(),
            reported: 0,
        }
    }

    fn labels(&self) -> DirectionLabels {
        DirectionLabels {
            direction: self.direction.label(),
        }
    }

    fn file(&self, result: &'static str) {
        self.stats
            .metrics
            .files
            .get_or_create(&ResultLabels {
                direction: self.direction.label(),
                result,
            })
            .inc();
    }

    /// The session has moved `total` payload bytes so far (a running total that never goes
    /// back).
    pub fn bytes(&mut self, total: u64) {
        let new = total.saturating_sub(self.reported);
        if new == 0 {
            return;
        }
        self.reported = total;
        self.stats.bytes.fetch_add(new, Ordering::Relaxed);
        self.stats
            .metrics
            .bytes
            .get_or_create(&self.labels())
            .inc_by(new);
    }

    pub fn on_event(&mut self, ev: &Event) {
        match ev {
            Event::FileStarted { path } => {
                self.started
                    .entry(path.clone())
                    .or_insert_with(Instant::now);
            }
            Event::FileDone {
                path,
                skipped: true,
                ..
            } => {
                self.started.remove(path);
                self.file("skipped");
            }
            Event::FileDone { path, size, .. } => {
                let began = self.started.remove(path);
                self.file("done");
                let m = &self.stats.metrics;
                m.file_size
                    .get_or_create(&self.labels())
                    .observe(*size as f64);
                if let Some(began) = began {
                    m.file_duration
                        .get_or_create(&self.labels())
                        .observe(began.elapsed().as_secs_f64());
                }
            }
            Event::FileFailed { path, .. } => {
                self.started.remove(path);
                self.file("failed");
            }
            _ => {}
        }
    }

    /// The session ended with `result`.
    pub fn finish<E>(&mut self, result: &Result<SessionSummary, E>) {
        let outcome = match result {
            Ok(summary) => {
                self.stats
                    .metrics
                    .retransmits
                    .get_or_create(&self.labels())
                    .inc_by(summary.tcp_retransmits);
                "ok"
            }
            Err(_) => "failed",
        };
        self.stats
            .metrics
            .sessions
            .get_or_create(&ResultLabels {
                direction: self.direction.label(),
                result: outcome,
            })
            .inc();
    }
}

impl Drop for SessionTally {
    fn drop(&mut self) {
        self.stats.sessions.fetch_sub(1, Ordering::Relaxed);
        self.stats
            .metrics
            .sessions_active
            .get_or_create(&self.labels())
            .dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exposition(stats: &EndpointStats) -> String {
        let mut registry = Registry::default();
        stats.metrics.register(&mut registry);
        register_build_info(&mut registry);
        encode(&registry)
    }

    /// The sample line of `name` with `labels` (`{...}` as written), or None.
    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn a_session_is_counted_running_then_by_its_files_bytes_and_outcome() {
        let stats = Arc::new(EndpointStats::default());
        let mut tally = SessionTally::new(stats.clone(), Direction::Receive);
        let t = exposition(&stats);
        assert_eq!(
            sample(&t, "haul_sessions_active{direction=\"receive\"}"),
            Some(1.0),
            "{t}"
        );
        assert_eq!(stats.sessions.load(Ordering::Relaxed), 1);
        tally.on_event(&Event::FileStarted { path: "a".into() });
        tally.bytes(600);
        tally.bytes(500); // a total that went back adds nothing
        tally.bytes(1000);
        tally.on_event(&Event::FileDone {
            path: "a".into(),
            size: 1000,
            digests: vec![],
            skipped: false,
        });
        tally.on_event(&Event::FileDone {
            path: "b".into(),
            size: 7,
            digests: vec![],
            skipped: true,
        });
        tally.on_event(&Event::FileFailed {
            path: "c".into(),
            error: wire::error::ErrorInfo::new(wire::error::ErrorKind::Io, "disk"),
        });
        let summary = SessionSummary {
            tcp_retransmits: 3,
            ..Default::default()
        };
        tally.finish::<()>(&Ok(summary));
        drop(tally);
        let t = exposition(&stats);
        for (series, value) in [
            ("haul_transfer_bytes_total{direction=\"receive\"}", 1000.0),
            (
                "haul_transfer_files_total{direction=\"receive\",result=\"done\"}",
                1.0,
            ),
            (
                "haul_transfer_files_total{direction=\"receive\",result=\"skipped\"}",
                1.0,
            ),
            (
                "haul_transfer_files_total{direction=\"receive\",result=\"failed\"}",
                1.0,
            ),
            (
                "haul_transfer_file_size_bytes_count{direction=\"receive\"}",
                1.0,
            ),
            (
                "haul_transfer_file_size_bytes_sum{direction=\"receive\"}",
                1000.0,
            ),
            (
                "haul_transfer_file_duration_seconds_count{direction=\"receive\"}",
                1.0,
            ),
            ("haul_sessions_active{direction=\"receive\"}", 0.0),
            (
                "haul_sessions_total{direction=\"receive\",result=\"ok\"}",
                1.0,
            ),
            ("haul_tcp_retransmits_total{direction=\"receive\"}", 3.0),
            ("haul_build_info{version=\"0.1.0\"}", 1.0),
        ] {
            assert_eq!(sample(&t, series), Some(value), "{series} in\n{t}");
        }
        assert_eq!(stats.bytes.load(Ordering::Relaxed), 1000);
        assert_eq!(stats.sessions.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn every_family_has_help_and_type_and_connections_are_counted() {
        let stats = EndpointStats::default();
        let open = stats.metrics.connection_opened();
        stats.metrics.connection_refused();
        let t = exposition(&stats);
        assert_eq!(sample(&t, "haul_connections_open"), Some(1.0), "{t}");
        assert_eq!(sample(&t, "haul_connections_refused_total"), Some(1.0));
        drop(open);
        assert_eq!(
            sample(&exposition(&stats), "haul_connections_open"),
            Some(0.0)
        );
        let types: Vec<&str> = t
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .collect();
        let helps = t.lines().filter(|l| l.starts_with("# HELP ")).count();
        assert_eq!(types.len(), 11, "{t}");
        assert_eq!(helps, types.len(), "{t}");
        for ty in types {
            let (name, kind) = ty.split_once(' ').unwrap();
            assert!(name.starts_with("haul_"), "{name}");
            if kind == "counter" {
                assert!(name.ends_with("_total"), "{name}");
            }
        }
    }
}
