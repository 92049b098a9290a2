//! What the metadata server counts as it runs, for its `/metrics` page
//! ([`crate::exposition`]): catalog operation latency by operation
//! (`haul_meta_rpc_duration_seconds`), and node-to-node replication by site pair and result
//! (`haul_replication_bytes_total`, `haul_replication_files_total`,
//! `haul_replication_sessions_total`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct OpLabels {
    pub op: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PairLabels {
    from_site: String,
    to_site: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PairResultLabels {
    from_site: String,
    to_site: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct NodeLabels {
    pub node: String,
    pub site: String,
}

fn latency_histogram() -> Histogram {
    // 50 µs to about 13 s, ×4 per bucket.
    Histogram::new(exponential_buckets(0.00005, 4.0, 10))
}

/// What the server counts as it runs.
#[derive(Debug)]
pub struct MetaMetrics {
    rpc_duration: Family<OpLabels, Histogram, fn() -> Histogram>,
    replication_bytes: Family<PairLabels, Counter>,
    replication_files: Family<PairResultLabels, Counter>,
    replication_sessions: Family<PairResultLabels, Counter>,
}

impl Default for MetaMetrics {
    fn default() -> Self {
        Self {
            rpc_duration: Family::new_with_constructor(latency_histogram),
            replication_bytes: Family::default(),
            replication_files: Family::default(),
            replication_sessions: Family::default(),
        }
    }
}

impl MetaMetrics {
    /// Adds these families to `r`.
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "haul_meta_rpc_duration_seconds",
            "Time each catalog operation took",
            self.rpc_duration.clone(),
        );
        r.register(
            "haul_replication_bytes",
            "Bytes copied between storage nodes by replication and repair, by site pair",
            self.replication_bytes.clone(),
        );
        r.register(
            "haul_replication_files",
            "Replicas made (done) or not (failed) by replication and repair, by site pair",
            self.replication_files.clone(),
        );
        r.register(
            "haul_replication_sessions",
            "Node-to-node replication sessions, by site pair and outcome",
            self.replication_sessions.clone(),
        );
    }

    /// One call of `op` took `seconds`.
    pub fn rpc(&self, op: &'static str, seconds: f64) {
        self.rpc_duration
            .get_or_create(&OpLabels { op })
            .observe(seconds);
    }

    /// One replication session from a node of `from` to one of `to` ended: `bytes` moved,
    /// `done` and `failed` files, and whether the session itself failed.
    pub fn replication(
        &self,
        from: &str,
        to: &str,
        bytes: u64,
        done: u64,
        failed: u64,
        session_ok: bool,
    ) {
        let pair = PairLabels {
            from_site: from.to_string(),
            to_site: to.to_string(),
        };
        let with = |result| PairResultLabels {
            from_site: from.to_string(),
            to_site: to.to_string(),
            result,
        };
        self.replication_bytes.get_or_create(&pair).inc_by(bytes);
        self.replication_files
            .get_or_create(&with("done"))
            .inc_by(done);
        if failed > 0 {
            self.replication_files
                .get_or_create(&with("failed"))
                .inc_by(failed);
        }
        self.replication_sessions
            .get_or_create(&with(if session_ok { "ok" } else { "failed" }))
            .inc();
    }
}
