//! The metadata server's shared state: the catalog, identities, a snapshot of the node
//! registry with capability keys and measured rates, counters for monitoring, and the
//! conversions between catalog types and the gRPC API.

use crate::auth::{Identities, User};
use crate::error::Error;
use crate::placement::NodeView;
use api::meta as pb;
use catalog::{Catalog, CatalogError, Inode, Kind, Node};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use transfer::certid::Fingerprint;
use transfer::client::CopyOptions;
use wire::error::ErrorKind;
use wire::grant::{Grant, Operation};

/// Tunables of a metadata server.
#[derive(Clone, Debug)]
pub struct Settings {
    /// How often nodes report.
    pub heartbeat: Duration,
    /// A node silent for this long is down.
    pub node_timeout: Duration,
    /// Unknown files on a node are removed after this long.
    pub orphan_grace: Duration,
    /// Uploads that never finish are dropped after this long.
    pub pending_grace: Duration,
    /// How long capabilities are valid (clients renew them in longer transfers).
    pub grant_ttl: Duration,
    /// How long a replica being written by one of the server's copies is held without the
    /// copy renewing it (the copy renews it every third of this); after that it is dropped.
    pub writing_lease: Duration,
    /// How often the reconciler checks replica policies (it also runs on changes).
    pub reconcile_every: Duration,
    /// Verify and repair every replica this often (off by default).
    pub scrub_every: Option<Duration>,
    /// Connections the API admits (in all, per source), and the TLS handshake timeout.
    pub listen: transfer::limits::Limits,
    /// Where replication and repair copies, and refused authentications, are recorded
    /// (`--log-transfer`).
    pub transfer_log: Option<Arc<transfer::translog::TransferLog>>,
    /// How long the transfer history keeps records.
    pub history: Retention,
    /// How transfer jobs are scheduled.
    pub jobs: crate::jobspec::JobSettings,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            heartbeat: Duration::from_secs(2),
            node_timeout: Duration::from_secs(10),
            orphan_grace: Duration::from_secs(3600),
            pending_grace: Duration::from_secs(24 * 3600),
            grant_ttl: Duration::from_secs(300),
            writing_lease: Duration::from_secs(60),
            reconcile_every: Duration::from_secs(30),
            scrub_every: None,
            listen: transfer::limits::Limits::default(),
            transfer_log: None,
            history: Default::default(),
            jobs: Default::default(),
        }
    }
}

/// How long the transfer history keeps records.
#[derive(Clone, Copy, Debug)]
pub struct Retention {
    /// Records that ended longer ago than this go.
    pub max_age: Duration,
    /// Beyond this many records, the oldest go.
    pub max_records: u64,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            max_age: Duration::from_secs(90 * 24 * 3600),
            max_records: 1_000_000,
        }
    }
}

/// Milliseconds since the epoch as RFC 3339 (UTC, whole seconds), for events and pages.
pub fn rfc3339(ms: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(ms.div_euclid(1000))
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

/// A node as last seen, with its capability key.
#[derive(Clone, Debug)]
pub struct NodeEntry {
    pub node: Node,
    pub key: Vec<u8>,
    /// The fingerprint of the certificate it registered with (`sha256:...`).
    pub cert: String,
    /// Delivery rate reported with its last heartbeat (bytes/s).
    pub rate: u64,
    pub sessions: u32,
}

impl NodeEntry {
    pub fn view(&self) -> NodeView {
        NodeView {
            name: self.node.name.clone(),
            site: self.node.site.clone(),
            free: self.node.free,
            capacity: self.node.capacity,
            load: self.node.load,
            up: self.node.up,
            draining: self.node.drain_ms != 0,
            rate: self.rate,
        }
    }
}

/// Something worth showing on the dashboard and in `haul status`, with the grid paths it
/// names: it is shown only to those who may see every one of them.
#[derive(Clone, Debug)]
pub struct Event {
    pub text: String,
    pub paths: Vec<String>,
}

/// Per-operation counters, for `/metrics` and the dashboard.
#[derive(Default)]
pub struct OpStats {
    pub calls: AtomicU64,
    pub errors: AtomicU64,
    pub micros: AtomicU64,
    pub items: AtomicU64,
}

/// The state every service shares.
pub struct Meta {
    pub catalog: Catalog,
    pub ids: Identities,
    pub settings: Settings,
    nodes: RwLock<HashMap<String, NodeEntry>>,
    /// Held through one refresh of `nodes`, from reading the catalog to replacing the snapshot,
    /// and through a heartbeat's write of both: two refreshes that overlapped (nodes
    /// registering at once) could otherwise let the one that read first write last and drop a
    /// node that had just registered, and a refresh could put back a node's older figures.
    nodes_refresh: tokio::sync::Mutex<()>,
    pub ops: Mutex<BTreeMap<&'static str, std::sync::Arc<OpStats>>>,
    /// Latency of each operation, and replication by site pair, for `/metrics`.
    pub metrics: crate::metrics::MetaMetrics,
    pub started: Instant,
    /// Inventories being uploaded in parts, by node.
    pub inventories: Mutex<HashMap<String, HashMap<i64, u64>>>,
    /// Recent events for the dashboard and `haul status` (newest last).
    pub events: Mutex<std::collections::VecDeque<Event>>,
    /// Client credentials for driving node-to-node copies (the server's host certificate).
    client_tls: RwLock<Option<std::sync::Arc<rustls::ClientConfig>>>,
    /// The CAs the server trusts: what endpoints acting on a user's delegation must chain to.
    roots: RwLock<Option<std::sync::Arc<rustls::RootCertStore>>>,
    /// The fingerprint of that certificate: capabilities for the server's own copies are
    /// bound to it, and it may never register as a node.
    own_cert: RwLock<Option<Fingerprint>>,
    /// Control connections to nodes kept between node-to-node sessions.
    control_pool: std::sync::Arc<transfer::control_pool::ControlPool>,
    /// Delivery rate measured per node in node-to-node copies (bytes/s, smoothed).
    rates: Mutex<HashMap<String, f64>>,
    /// The replica reconciler's state, for `haul status` and the dashboard.
    pub reconciler: Mutex<ReconcilerState>,
    /// Wakes the reconciler early (a policy was set, a node went down).
    pub reconcile_now: tokio::sync::Notify,
    /// Signs and checks the dashboard's sign-in and session tokens.
    pub web: crate::webauth::WebAuth,
    /// The dashboard's bound address (`--http`), once it listens.
    pub http_addr: std::sync::OnceLock<std::net::SocketAddr>,
    /// Replication, repair and reconciler runs in progress, for the dashboard.
    pub live: crate::runs::LiveRuns,
    /// Clients' copies in progress, as their clients report them.
    pub live_clients: crate::runs::LiveClients,
    /// Transfer jobs being run.
    pub jobs: crate::jobspec::JobRuntime,
}

/// What the reconciler did last.
#[derive(Clone, Debug, Default)]
pub struct ReconcilerState {
    pub under_replicated: u64,
    /// Files being copied off draining nodes (their policies hold meanwhile).
    pub moving: u64,
    /// Draining nodes whose end of drain was announced (an event once per drain).
    pub drained: std::collections::BTreeSet<String>,
    pub over_replicated: u64,
    pub running: u64,
    pub repairs_done: u64,
    pub removals_done: u64,
    pub last_pass_ms: i64,
    pub last_pass_seconds: f64,
}

/// Copy options of the metadata server when it drives node-to-node copies.
fn copy_options(
    tls: Arc<rustls::ClientConfig>,
    control_pool: Option<Arc<transfer::control_pool::ControlPool>>,
) -> CopyOptions {
    CopyOptions {
        recursive: false,
        range: None,
        session: wire::control::SessionOptions {
            stall_timeout_ms: 30_000,
            // Many sessions share the WAN: end-game copies would only take it from the others.
            shared_path: true,
            ..Default::default()
        },
        retry: wire::retry::RetryPolicy {
            max_attempts: 1,
            ..Default::default()
        },
        tls: Some(transfer::conn::ClientTls { config: tls }),
        link_bps: 10_000_000_000,
        checkpoint_interval: Duration::from_secs(5),
        control_pool,
        peer_tls: Vec::new(),
        zero_copy: true,
        trace: None,
        receiver_evidence: false,
    }
}

impl Meta {
    pub fn new(catalog: Catalog, ids: Identities, settings: Settings) -> Self {
        Self {
            catalog,
            ids,
            settings,
            nodes: RwLock::new(HashMap::new()),
            nodes_refresh: tokio::sync::Mutex::new(()),
            ops: Mutex::new(BTreeMap::new()),
            metrics: Default::default(),
            started: Instant::now(),
            inventories: Mutex::new(HashMap::new()),
            events: Mutex::new(Default::default()),
            web: Default::default(),
            http_addr: Default::default(),
            live: Default::default(),
            live_clients: Default::default(),
            jobs: Default::default(),
            client_tls: RwLock::new(None),
            roots: RwLock::new(None),
            own_cert: RwLock::new(None),
            control_pool: Default::default(),
            rates: Mutex::new(HashMap::new()),
            reconciler: Mutex::new(Default::default()),
            reconcile_now: tokio::sync::Notify::new(),
        }
    }

    /// Gives the server its own certificate: it drives node-to-node copies (replication,
    /// verification) with it.
    pub fn set_credentials(
        &self,
        creds: &transfer::tls::Credentials,
    ) -> Result<(), transfer::TransferError> {
        let tls = transfer::tls::client_config(creds)?;
        let fp = creds
            .chain
            .first()
            .map(|c| Fingerprint::of(c.as_ref()))
            .ok_or_else(|| transfer::TransferError::unauthenticated("no certificate"))?;
        *self.client_tls.write().expect("tls lock") = Some(tls);
        *self.roots.write().expect("tls lock") = Some(creds.roots.clone());
        *self.own_cert.write().expect("cert lock") = Some(fp);
        Ok(())
    }

    /// Client TLS acting with a user's delegation (PEM chain and key), trusting the server's
    /// CAs.
    pub fn delegated_tls(
        &self,
        chain_pem: &str,
        key_pem: &str,
    ) -> Result<transfer::conn::ClientTls, transfer::TransferError> {
        let roots = self
            .roots
            .read()
            .expect("tls lock")
            .clone()
            .ok_or_else(|| {
                transfer::TransferError::unauthenticated(
                    "the metadata server has no CA certificates",
                )
            })?;
        let creds = transfer::tls::Credentials::from_pem(chain_pem, key_pem, roots)?;
        Ok(transfer::conn::ClientTls {
            config: transfer::tls::client_config(&creds)?,
        })
    }

    /// The fingerprint of the server's own certificate, once set.
    pub fn own_cert(&self) -> Option<Fingerprint> {
        *self.own_cert.read().expect("cert lock")
    }

    /// Options for node-to-node copies, if the server has client credentials.
    pub fn copy_options(&self) -> Option<transfer::client::CopyOptions> {
        self.client_tls
            .read()
            .expect("tls lock")
            .clone()
            .map(|tls| copy_options(tls, Some(self.control_pool.clone())))
    }

    /// Keeps a fresh control connection to every live node waiting in the pool (see
    /// `transfer::control_pool`); failures are only logged (the node's heartbeat decides
    /// whether it is up).
    pub fn warm_node_connections(&self) {
        let Some(config) = self.client_tls.read().expect("tls lock").clone() else {
            return;
        };
        let tls = Some(transfer::conn::ClientTls { config });
        let limits = transfer::sys::host_limits();
        for n in self.nodes().into_iter().filter(|n| n.node.up) {
            let Ok(peer) = transfer::client::Peer::parse(&n.node.address) else {
                continue;
            };
            let (pool, tls, limits) = (self.control_pool.clone(), tls.clone(), limits.clone());
            tokio::spawn(async move {
                if let Err(e) = pool
                    .keep_warm(&peer.host, peer.port, tls.as_ref(), &limits)
                    .await
                {
                    tracing::debug!(node = %peer.host, error = %e, "cannot open a control connection");
                }
            });
        }
    }

    /// Records a delivery rate measured for `node` (bytes/s).
    pub fn note_rate(&self, node: &str, rate: f64) {
        let mut r = self.rates.lock().expect("rates lock");
        let e = r.entry(node.to_string()).or_insert(rate);
        *e = 0.7 * *e + 0.3 * rate;
    }

    /// What `node` delivers (bytes/s): measured in copies, else reported by the node, else 0.
    pub fn rate_of(&self, node: &str) -> f64 {
        if let Some(r) = self.rates.lock().expect("rates lock").get(node) {
            return *r;
        }
        self.node(node).map(|n| n.rate as f64).unwrap_or(0.0)
    }

    /// Notes something worth showing on the dashboard that names no grid path.
    pub fn event(&self, msg: String) {
        self.event_about(msg, Vec::new());
    }

    /// Notes something worth showing about grid `paths` (only to those who may see them).
    pub fn event_about(&self, msg: String, paths: Vec<String>) {
        tracing::info!("{msg}");
        let mut ev = self.events.lock().expect("events lock");
        if ev.len() >= 200 {
            ev.pop_front();
        }
        // `2026-11-27T20:31:02Z message`: the date too (a dashboard stays open for days).
        ev.push_back(Event {
            text: format!("{} {msg}", rfc3339(catalog::now_ms())),
            paths,
        });
    }

    /// Whether `user` could find `path` by listing directories from the root (see
    /// [`crate::perm::may_see`]); a path that no longer exists is seen by administrators only.
    pub async fn may_see(&self, user: &User, path: &str) -> bool {
        if user.admin {
            return true;
        }
        let Ok(norm) = catalog::normalize(path) else {
            return false;
        };
        match self.catalog.lookup_chain(&norm).await {
            Ok(chain) if chain.len() == depth(&norm) + 1 => crate::perm::may_see(user, &chain),
            _ => false,
        }
    }

    /// The `n` most recent events `user` may see, newest first.
    pub async fn events_for(&self, user: &User, n: usize) -> Vec<String> {
        let all: Vec<Event> = self
            .events
            .lock()
            .expect("events lock")
            .iter()
            .rev()
            .cloned()
            .collect();
        let mut seen: HashMap<String, bool> = HashMap::new();
        let mut out = Vec::new();
        for e in all {
            if out.len() >= n {
                break;
            }
            let mut ok = true;
            for p in &e.paths {
                let v = match seen.get(p) {
                    Some(v) => *v,
                    None => {
                        let v = self.may_see(user, p).await;
                        seen.insert(p.clone(), v);
                        v
                    }
                };
                ok &= v;
            }
            if ok {
                out.push(e.text);
            }
        }
        out
    }

    /// Counts one call of `op` that took `since` and handled `items` things.
    pub fn record(&self, op: &'static str, since: Instant, items: u64, ok: bool) {
        let s = {
            let mut ops = self.ops.lock().expect("ops lock");
            ops.entry(op).or_default().clone()
        };
        let took = since.elapsed();
        s.calls.fetch_add(1, Ordering::Relaxed);
        s.items.fetch_add(items, Ordering::Relaxed);
        s.micros
            .fetch_add(took.as_micros() as u64, Ordering::Relaxed);
        self.metrics.rpc(op, took.as_secs_f64());
        if !ok {
            s.errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Re-reads the node registry and the capability keys.
    pub async fn refresh_nodes(&self) -> Result<(), CatalogError> {
        let _one_at_a_time = self.nodes_refresh.lock().await;
        let nodes = self.catalog.nodes().await?;
        let keys = self.catalog.node_keys().await?;
        let certs = self.catalog.node_certs().await?;
        let mut map = self.nodes.write().expect("nodes lock");
        let mut fresh = HashMap::new();
        for n in nodes {
            let (rate, sessions) = map
                .get(&n.name)
                .map(|e| (e.rate, e.sessions))
                .unwrap_or((0, 0));
            let key = keys.get(&n.name).cloned().unwrap_or_default();
            let cert = certs.get(&n.name).cloned().unwrap_or_default();
            fresh.insert(
                n.name.clone(),
                NodeEntry {
                    node: n,
                    key,
                    cert,
                    rate,
                    sessions,
                },
            );
        }
        *map = fresh;
        Ok(())
    }

    /// Records node `name`'s heartbeat (capacity, free bytes, load; its delivery rate and
    /// sessions) in the catalog and in the snapshot, in turn with refreshes.
    pub async fn record_heartbeat(
        &self,
        name: &str,
        (capacity, free, load): (u64, u64, f64),
        rate: (u64, u32),
    ) -> Result<Node, CatalogError> {
        let _one_at_a_time = self.nodes_refresh.lock().await;
        let node = self.catalog.heartbeat(name, capacity, free, load).await?;
        // A node not in the snapshot yet is picked up, key included, at the next refresh.
        if let Some(e) = self.nodes.write().expect("nodes lock").get_mut(name) {
            e.node = node.clone();
            (e.rate, e.sessions) = rate;
        }
        Ok(node)
    }

    pub fn nodes(&self) -> Vec<NodeEntry> {
        let mut v: Vec<NodeEntry> = self
            .nodes
            .read()
            .expect("nodes lock")
            .values()
            .cloned()
            .collect();
        v.sort_by(|a, b| (&a.node.site, &a.node.name).cmp(&(&b.node.site, &b.node.name)));
        v
    }

    pub fn node(&self, name: &str) -> Option<NodeEntry> {
        self.nodes.read().expect("nodes lock").get(name).cloned()
    }

    /// A capability for `op` on `ids` at `node`, done for `user`, that only the certificate
    /// `holder` may present (`None`: nobody; such a grant is only ever relayed). A write may
    /// replace the node's replica of the ids in `replace` only (known damaged or missing).
    pub fn grant(
        &self,
        node: &NodeEntry,
        op: Operation,
        ids: Vec<i64>,
        replace: Vec<i64>,
        user: &str,
        holder: Option<Fingerprint>,
    ) -> Result<pb::Capability, Error> {
        if node.key.is_empty() {
            return Err(Error::unavailable(format!(
                "node {} has not registered a key yet",
                node.node.name
            )));
        }
        let ttl = self.settings.grant_ttl.as_millis() as i64;
        let g = Grant {
            node: node.node.name.clone(),
            op,
            ids,
            replace,
            user: user.to_string(),
            holder: holder.map(|h| h.as_bytes().to_vec()).unwrap_or_default(),
            expires_ms: catalog::now_ms() + ttl,
        };
        let s = g.sign(&node.key);
        Ok(pb::Capability {
            token: s.token,
            mac: s.mac,
            ttl_ms: ttl as u64,
        })
    }

    /// A capability for the calling user, bound to the certificate the user called with.
    pub fn user_grant(
        &self,
        node: &NodeEntry,
        op: Operation,
        ids: Vec<i64>,
        user: &User,
    ) -> Result<pb::Capability, Error> {
        self.grant(node, op, ids, vec![], &user.name, user.cert)
    }

    /// A capability for the server's own copies (replication, repair, verification), bound to
    /// its own certificate.
    pub fn own_grant(
        &self,
        node: &NodeEntry,
        op: Operation,
        ids: Vec<i64>,
    ) -> Result<pb::Capability, Error> {
        self.own_grant_replacing(node, op, ids, vec![])
    }

    /// [`Self::own_grant`] for a write that may replace the node's (bad) replicas of `replace`.
    pub fn own_grant_replacing(
        &self,
        node: &NodeEntry,
        op: Operation,
        ids: Vec<i64>,
        replace: Vec<i64>,
    ) -> Result<pb::Capability, Error> {
        let own = self.own_cert().ok_or_else(|| {
            Error::new(
                ErrorKind::NotWritable,
                "the metadata server has no certificate of its own",
            )
        })?;
        self.grant(node, op, ids, replace, "haul-meta", Some(own))
    }

    /// The group a new entry in `parent` gets: the parent's, if it has the set-group-id bit,
    /// else the creator's primary group.
    pub fn new_group(&self, user: &User, parent: &Inode) -> String {
        if parent.mode & 0o2000 != 0 {
            parent.group.clone()
        } else {
            user.primary_group().to_string()
        }
    }
}

/// The API form of an entry at `path`.
pub fn entry(path: &str, i: &Inode) -> pb::Entry {
    pb::Entry {
        path: path.to_string(),
        id: i.id,
        is_dir: i.kind == Kind::Dir,
        owner: i.owner.clone(),
        group: i.group.clone(),
        mode: i.mode,
        size: i.size,
        mtime_ns: i.mtime_ns,
        checksum: i.checksum.clone(),
        private: i.private,
    }
}

/// A node as the API shows it, with its complete replicas and the bytes they hold.
pub fn node_info(e: &NodeEntry, (replicas, stored_bytes): (u64, u64)) -> pb::NodeInfo {
    pb::NodeInfo {
        name: e.node.name.clone(),
        site: e.node.site.clone(),
        address: e.node.address.clone(),
        capacity: e.node.capacity,
        free: e.node.free,
        load: e.node.load,
        heartbeat_ms: e.node.heartbeat_ms,
        up: e.node.up,
        replicas,
        drain_ms: e.node.drain_ms,
        drain_replicas: e.node.drain_replicas,
        stored_bytes,
    }
}

pub fn file_error(path: &str, e: &CatalogError) -> pb::FileError {
    Error::new(crate::error::kind_of(e), e.to_string()).for_file(path)
}

/// Number of components of a normalized path.
pub fn depth(norm: &str) -> usize {
    norm.split('/').filter(|p| !p.is_empty()).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nodes that register at the same moment are all in the snapshot afterwards (a lost
    /// update here left a node unlisted until the next periodic refresh).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_registrations_all_reach_the_node_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("c.db").display());
        let catalog = Catalog::open(&url).await.unwrap();
        let ids = Identities {
            mapfile: Default::default(),
            groups: Default::default(),
            admins: vec![],
            nodes: Default::default(),
        };
        let m = Arc::new(Meta::new(catalog, ids, Settings::default()));
        for round in 0..10 {
            let names: Vec<String> = (0..12).map(|i| format!("n{round}-{i}")).collect();
            let tasks: Vec<_> = names
                .iter()
                .map(|name| {
                    let m = m.clone();
                    let name = name.clone();
                    tokio::spawn(async move {
                        m.catalog
                            .register_node_with_key(&catalog::NodeRegistration {
                                name: &name,
                                site: "A",
                                address: "198.18.0.1:1",
                                capacity: 1,
                                free: 1,
                                new_key: &[7u8; 32],
                                cert: "sha256:00",
                                may_rotate: false,
                            })
                            .await
                            .unwrap();
                        m.refresh_nodes().await.unwrap();
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
            let listed: Vec<String> = m.nodes().into_iter().map(|e| e.node.name).collect();
            for name in &names {
                assert!(listed.contains(name), "{name} missing from {listed:?}");
            }
            // Heartbeats beside refreshes: the snapshot ends with each node's latest figures.
            let tasks: Vec<_> = names
                .iter()
                .enumerate()
                .map(|(i, name)| {
                    let m = m.clone();
                    let name = name.clone();
                    tokio::spawn(async move {
                        let free = 1000 + i as u64;
                        m.record_heartbeat(&name, (5000, free, 0.5), (0, 0))
                            .await
                            .unwrap();
                        m.refresh_nodes().await.unwrap();
                        m.record_heartbeat(&name, (5000, free + 1, 0.5), (0, 0))
                            .await
                            .unwrap();
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
            for (i, name) in names.iter().enumerate() {
                let seen = m.node(name).expect("listed").node.free;
                assert_eq!(
                    seen,
                    1001 + i as u64,
                    "{name}: the snapshot kept older figures"
                );
            }
        }
    }
}
