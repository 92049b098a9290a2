//! The `NodeService`: storage nodes register (getting their capability key), report
//! heartbeats (and get back files to delete), upload their inventory for reconciliation, and
//! report each replica they have written and verified, which is what makes a new file visible.
//! Every call must come from the node it names (its host certificate's CN).

use crate::error::Error;
use crate::grpc::Op;
use crate::state::Meta;
use api::meta as pb;
use api::meta::node_service_server::NodeService;
use catalog::CatalogError;
use catalog::normalize;
use std::collections::HashMap;
use std::sync::Arc;
use tonic::{Request, Response, Status};
use transfer::certid::CertIdentity;
use wire::error::ErrorKind;
use wire::grant::{Operation, SignedGrant};

/// The node service.
pub struct NodeServiceImpl {
    pub meta: Arc<Meta>,
}

/// Inventory entries a node may upload in one session (more is refused: 100 M files).
const MAX_INVENTORY: usize = 100_000_000;

/// Replicas one `ReplicasWritten` call may report (more is refused before the catalog is
/// touched). Each is a savepoint of one transaction, and PostgreSQL caches 64
/// subtransactions of a transaction; nodes send at most this many at a time.
pub const MAX_REPLICAS_WRITTEN: usize = 64;

#[tonic::async_trait]
impl NodeService for NodeServiceImpl {
    async fn register(
        &self,
        req: Request<pb::RegisterRequest>,
    ) -> Result<Response<pb::RegisterReply>, Status> {
        let m = &self.meta;
        m.enrolling_call(Op::one("register"), req, async |cert, q| {
            m.register_node(cert, q).await
        })
        .await
    }

    async fn heartbeat(
        &self,
        req: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatReply>, Status> {
        let m = &self.meta;
        m.node_call(Op::one("heartbeat"), req, async |q| m.heartbeat(q).await)
            .await
    }

    async fn inventory(
        &self,
        req: Request<pb::InventoryRequest>,
    ) -> Result<Response<pb::InventoryReply>, Status> {
        let m = &self.meta;
        let items = req.get_ref().files.len() as u64;
        m.node_call(Op::many("inventory", items), req, async |q| {
            m.inventory(q).await
        })
        .await
    }

    async fn replica_written(
        &self,
        req: Request<pb::ReplicaWrittenRequest>,
    ) -> Result<Response<pb::ReplicaWrittenReply>, Status> {
        let m = &self.meta;
        m.node_call(Op::one("replica_written"), req, async |q| {
            m.replica_written(q).await
        })
        .await
    }

    async fn replicas_written(
        &self,
        req: Request<pb::ReplicasWrittenRequest>,
    ) -> Result<Response<pb::ReplicasWrittenReply>, Status> {
        let m = &self.meta;
        let items = req.get_ref().replicas.len() as u64;
        m.node_call(Op::many("replicas_written", items), req, async |q| {
            m.replicas_written(q).await
        })
        .await
    }

    async fn removed(
        &self,
        req: Request<pb::RemovedRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        let m = &self.meta;
        let items = req.get_ref().ids.len() as u64;
        m.node_call(Op::many("removed", items), req, async |q| {
            m.catalog.forget_dead(&q.node, &q.ids).await?;
            Ok(pb::Empty {})
        })
        .await
    }

    async fn register_outputs(
        &self,
        req: Request<pb::RegisterOutputsRequest>,
    ) -> Result<Response<pb::RegisterOutputsReply>, Status> {
        let m = &self.meta;
        let items = req.get_ref().files.len() as u64;
        m.node_call(Op::many("register_outputs", items), req, async |q| {
            m.register_outputs(q).await
        })
        .await
    }
}

impl Meta {
    /// Registers a storage node: `cert` is the host certificate it called with, which must be
    /// enrolled for the node the request names; a fresh capability key goes back.
    pub async fn register_node(
        &self,
        cert: Arc<CertIdentity>,
        q: pb::RegisterRequest,
    ) -> Result<pb::RegisterReply, Error> {
        if q.site.is_empty() || q.address.is_empty() {
            return Err(Error::invalid("a node needs a site and an address"));
        }
        let fp = cert.fingerprint;
        let refuse = |why: String| {
            self.event(format!("node {} refused: {why}", q.name));
            Error::permission_denied(why)
        };
        // The server's own certificate is a host certificate of the CA too, but never a node.
        if self.own_cert() == Some(fp) {
            return Err(refuse(format!(
                "{fp} is the metadata server's own certificate; a storage node needs a host certificate of its own (haul cert issue --host NAME)"
            )));
        }
        let enrolled = self.ids.nodes.check(&q.name, &fp).map_err(refuse)?;
        let fresh_key: [u8; 32] = rand::random();
        let fp_text = fp.to_string();
        let r = self
            .catalog
            .register_node_with_key(&catalog::NodeRegistration {
                name: &q.name,
                site: &q.site,
                address: &q.address,
                capacity: q.capacity,
                free: q.free,
                new_key: &fresh_key,
                cert: &fp_text,
                may_rotate: enrolled == crate::enrol::Enrolled::Certificate,
            })
            .await;
        let (node, key) = match r {
            Ok(x) => x,
            Err(CatalogError::Denied(why)) => {
                let file = self
                    .ids
                    .nodes
                    .path()
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|| "the --nodes file".into());
                return Err(refuse(format!(
                    "{why}; if the node's certificate was replaced, add the line `{} {fp}` to {file} on the metadata server",
                    q.name
                )));
            }
            Err(e) => return Err(e.into()),
        };
        self.refresh_nodes().await?;
        // Its first session need not wait for the next round of the connection warmer.
        self.warm_node_connections();
        self.event(format!(
            "node {} registered (site {}, {}, {} GB free)",
            node.name,
            node.site,
            node.address,
            node.free / 1_000_000_000
        ));
        Ok(pb::RegisterReply {
            capability_key: key,
            heartbeat_ms: self.settings.heartbeat.as_millis() as u32,
            orphan_grace_ms: self.settings.orphan_grace.as_millis() as u32,
        })
    }

    /// A registered node's heartbeat: its figures are recorded, and it learns which replicas
    /// to delete (or that it must register again).
    pub async fn heartbeat(&self, q: pb::HeartbeatRequest) -> Result<pb::HeartbeatReply, Error> {
        let was_up = self.node(&q.name).map(|n| n.node.up);
        // A load that is not a number (NaN, infinite, negative) counts as idle: it is only a
        // weight for placement, and must not reach the catalog or the sorts as a NaN.
        let load = if q.load.is_finite() {
            q.load.max(0.0)
        } else {
            0.0
        };
        let node = match self
            .record_heartbeat(
                &q.name,
                (q.capacity, q.free, load),
                (q.bytes_per_s, q.sessions),
            )
            .await
        {
            Ok(n) => n,
            Err(CatalogError::NotFound(_)) => {
                return Ok(pb::HeartbeatReply {
                    delete: vec![],
                    reregister: true,
                });
            }
            Err(e) => return Err(e.into()),
        };
        if was_up == Some(false) {
            self.event(format!("node {} is back", node.name));
        }
        let delete = self.catalog.dead_replicas(&q.name).await?;
        Ok(pb::HeartbeatReply {
            delete,
            reregister: false,
        })
    }

    /// One part of a node's inventory; with the last part the catalog is reconciled with what
    /// the node holds.
    pub async fn inventory(&self, q: pb::InventoryRequest) -> Result<pb::InventoryReply, Error> {
        let held = {
            let mut inv = self.inventories.lock().expect("inventories lock");
            let part = inv.entry(q.name.clone()).or_default();
            if part.len() + q.files.len() > MAX_INVENTORY {
                inv.remove(&q.name);
                return Err(Error::new(ErrorKind::NoSpace, "inventory too large"));
            }
            part.extend(q.files.iter().map(|f| (f.id, f.size)));
            if !q.last {
                return Ok(pb::InventoryReply::default());
            }
            inv.remove(&q.name).unwrap_or_default()
        };
        let r = self
            .catalog
            .reconcile(
                &q.name,
                &held,
                self.settings.orphan_grace.as_millis() as i64,
            )
            .await?;
        self.event(format!(
            "node {} inventory: {} files, {} as expected, {} missing, {} damaged, {} unknown (removed after the grace period)",
            q.name,
            held.len(),
            r.known,
            r.missing.len(),
            r.damaged.len(),
            r.orphans.len()
        ));
        let delete = self.catalog.dead_replicas(&q.name).await?;
        let held_ids: HashMap<i64, ()> = held.keys().map(|k| (*k, ())).collect();
        Ok(pb::InventoryReply {
            delete: delete
                .into_iter()
                .filter(|i| held_ids.contains_key(i))
                .collect(),
            missing: r.missing.len() as u64,
            known: r.known,
        })
    }

    /// A node wrote (and checked) a replica: it becomes complete, and policies may act on it.
    pub async fn replica_written(
        &self,
        q: pb::ReplicaWrittenRequest,
    ) -> Result<pb::ReplicaWrittenReply, Error> {
        let i = self
            .catalog
            .complete_replica(q.id, &q.node, q.size, &q.checksum, q.mtime_ns)
            .await?;
        // A new file may fall under a replica policy.
        self.reconcile_now.notify_one();
        let path = self.catalog.path_of(i.id).await.unwrap_or_default();
        Ok(pb::ReplicaWrittenReply {
            entry: Some(crate::state::entry(&path, &i)),
        })
    }

    /// Many replicas a node wrote (and checked), completed in one catalog transaction; each
    /// gets its own result.
    pub async fn replicas_written(
        &self,
        q: pb::ReplicasWrittenRequest,
    ) -> Result<pb::ReplicasWrittenReply, Error> {
        if q.replicas.len() > MAX_REPLICAS_WRITTEN {
            return Err(Error::invalid(format!(
                "{} replicas in one report; at most {MAX_REPLICAS_WRITTEN}",
                q.replicas.len()
            )));
        }
        let written: Vec<catalog::WrittenReplica> = q
            .replicas
            .iter()
            .map(|r| catalog::WrittenReplica {
                inode: r.id,
                size: r.size,
                checksum: r.checksum.clone(),
                mtime_ns: r.mtime_ns,
            })
            .collect();
        let results = self.catalog.complete_replicas(&q.node, &written).await?;
        if results.iter().any(|r| r.is_ok()) {
            // New files may fall under a replica policy.
            self.reconcile_now.notify_one();
        }
        Ok(pb::ReplicasWrittenReply {
            results: written
                .iter()
                .zip(results)
                .map(|(w, r)| pb::ReplicaResult {
                    id: w.inode,
                    // (Through `Error`: a database's own words go to the log, not the node.)
                    error: r
                        .err()
                        .map(|e| Error::from(e).for_file(&format!("inode {}", w.inode))),
                })
                .collect(),
        })
    }

    /// Registers the files a task of `haul run` wrote on a node: as the run's user (from the
    /// run's capability), under the run's output directory, each a pending replica on that
    /// node until the node reports it written.
    pub async fn register_outputs(
        &self,
        q: pb::RegisterOutputsRequest,
    ) -> Result<pb::RegisterOutputsReply, Error> {
        let node = self.node(&q.node).ok_or_else(|| {
            Error::new(
                ErrorKind::NotWritable,
                format!("node {} is not registered", q.node),
            )
        })?;
        let cap = q.capability.ok_or_else(|| {
            Error::permission_denied("registering outputs needs the run's capability")
        })?;
        let signed = SignedGrant {
            token: cap.token,
            mac: cap.mac,
        };
        // A task may end after its capability's hour: its outputs are taken for a day more.
        let g = signed
            .verify_relayed(&node.key, &q.node, Operation::Run, 0)
            .map_err(|e| Error::permission_denied(e.to_string()))?;
        if catalog::now_ms() > g.expires_ms + 86_400_000 {
            return Err(Error::permission_denied("the run's capability has expired"));
        }
        let user = self.ids.user_named(&g.user);
        let dir = normalize(&q.dir)?;
        let mut results: Vec<pb::OutputResult> = q
            .files
            .iter()
            .map(|f| pb::OutputResult {
                name: f.name.clone(),
                ..Default::default()
            })
            .collect();
        let mut want = Vec::new();
        let mut index = HashMap::new();
        let mut made: HashMap<String, Result<(), Error>> = HashMap::new();
        for (i, f) in q.files.iter().enumerate() {
            let full = match normalize(&format!("{dir}/{}", f.name)) {
                Ok(p) if p.starts_with(&format!("{}/", dir.trim_end_matches('/'))) => p,
                _ => {
                    results[i].error = Some(
                        Error::invalid(format!("{}: not a name inside {dir}", f.name))
                            .for_file(&f.name),
                    );
                    continue;
                }
            };
            let (parent, _) = catalog::parent_and_name(&full)?;
            if parent != dir {
                let r = match made.get(&parent) {
                    Some(r) => r.clone(),
                    None => {
                        let r = self.mkdir_as(&user, &parent, 0, true).await.map(|_| ());
                        made.insert(parent.clone(), r.clone());
                        r
                    }
                };
                if let Err(e) = r {
                    results[i].error = Some(e.for_file(&f.name));
                    continue;
                }
            }
            index.insert(full.clone(), i);
            want.push(pb::NewFile {
                path: full,
                size: f.size,
                mode: f.mode,
                mtime_ns: f.mtime_ns,
                // Written on the node itself: it never crossed a network.
                private: false,
            });
        }
        if !want.is_empty() {
            let req = pb::CreateFilesRequest {
                files: want,
                ..Default::default()
            };
            let reply = self.create_files_on(&user, &req, Some(&q.node)).await?;
            for p in reply.placements {
                for (path, id) in p.paths.iter().zip(p.ids) {
                    if let Some(&i) = index.get(path) {
                        results[i].id = id;
                    }
                }
            }
            // Empty files are complete at once and need no replica.
            for e in reply.created {
                if let Some(&i) = index.get(&e.path) {
                    results[i].id = -1;
                }
            }
            for e in reply.errors {
                if let Some(&i) = index.get(&e.path) {
                    results[i].error = Some(e);
                }
            }
        }
        Ok(pb::RegisterOutputsReply { results })
    }
}

/// The registry's and the files' domain methods in process, over an in-memory catalog: no
/// gRPC, no TLS, the certificate given as its parsed identity.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{Identities, User};
    use crate::state::Settings;
    use transfer::certid::Fingerprint;

    fn cert(fp: u8) -> Arc<CertIdentity> {
        Arc::new(CertIdentity {
            subject: "/O=test/CN=host n1".into(),
            host: Some("n1".into()),
            fingerprint: Fingerprint([fp; 32]),
        })
    }

    /// A server that enrols node n1 with the certificate of fingerprint 1.
    async fn meta(dir: &std::path::Path) -> Meta {
        let list = dir.join("enrolled-nodes");
        std::fs::write(&list, format!("n1 {}\n", Fingerprint([1; 32]))).unwrap();
        let ids = Identities {
            mapfile: Default::default(),
            groups: Default::default(),
            admins: vec![],
            nodes: crate::enrol::Enrolment::load(&list).unwrap(),
        };
        let catalog = catalog::Catalog::open("sqlite::memory:").await.unwrap();
        Meta::new(catalog, ids, Settings::default())
    }

    fn user(name: &str, admin: bool) -> User {
        User {
            name: name.into(),
            groups: vec![name.into()],
            admin,
            cert: None,
        }
    }

    fn registration(site: &str) -> pb::RegisterRequest {
        pb::RegisterRequest {
            name: "n1".into(),
            site: site.into(),
            address: "198.18.0.1:7000".into(),
            capacity: 10 << 30,
            free: 8 << 30,
        }
    }

    #[tokio::test]
    async fn only_an_enrolled_certificate_registers_and_a_beat_from_nowhere_asks_to_register() {
        let dir = tempfile::tempdir().unwrap();
        let m = meta(dir.path()).await;
        let e = m
            .register_node(cert(2), registration("A"))
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::PermissionDenied, "{e}");
        assert!(
            e.message().contains("n1 sha256:0202"),
            "says which line to add: {e}"
        );
        let e = m
            .register_node(cert(1), registration(""))
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Invalid, "{e}");
        assert!(m.node("n1").is_none(), "nothing registered by a refusal");

        // A heartbeat before registering: told to register, nothing recorded.
        let beat = |load: f64| pb::HeartbeatRequest {
            name: "n1".into(),
            capacity: 10 << 30,
            free: 7 << 30,
            load,
            ..Default::default()
        };
        assert!(m.heartbeat(beat(0.5)).await.unwrap().reregister);

        let reply = m.register_node(cert(1), registration("A")).await.unwrap();
        assert_eq!(reply.capability_key.len(), 32);
        assert_eq!(m.node("n1").unwrap().node.site, "A");
        // A load that is no number counts as idle.
        let r = m.heartbeat(beat(f64::NAN)).await.unwrap();
        assert!(!r.reregister && r.delete.is_empty());
        let n = m.node("n1").unwrap();
        assert_eq!((n.node.free, n.node.load), (7 << 30, 0.0));
        let df = m.df().await.unwrap();
        assert_eq!(df.sites.len(), 1);
        assert_eq!((df.sites[0].site.as_str(), df.sites[0].nodes), ("A", 1));
    }

    /// A group of replica reports: each gets its own result in order (the placed file becomes
    /// visible, an unknown id is refused by itself), and a group over the limit is refused
    /// whole before the catalog is touched.
    #[tokio::test]
    async fn replicas_written_in_a_group_get_their_own_results() {
        let dir = tempfile::tempdir().unwrap();
        let m = meta(dir.path()).await;
        m.register_node(cert(1), registration("A")).await.unwrap();
        let root = user("root", true);
        m.mkdir_as(&root, "/g", 0o777, false).await.unwrap();
        let req = pb::CreateFilesRequest {
            files: vec![pb::NewFile {
                path: "/g/f".into(),
                size: 3,
                mode: 0o644,
                ..Default::default()
            }],
            ..Default::default()
        };
        let id = m.create_files(&root, &req).await.unwrap().placements[0].ids[0];
        let written = |id: i64| pb::WrittenReplica {
            id,
            size: 3,
            checksum: "crc32c:00000003".into(),
            mtime_ns: 9,
        };
        let group = |replicas| pb::ReplicasWrittenRequest {
            node: "n1".into(),
            replicas,
        };
        let r = m
            .replicas_written(group(vec![written(id + 1000), written(id)]))
            .await
            .unwrap();
        assert_eq!(r.results.len(), 2);
        assert_eq!(r.results[0].id, id + 1000);
        let refused = r.results[0].error.as_ref().expect("unknown id refused");
        assert_eq!(refused.code, ErrorKind::NotFound.name(), "{refused:?}");
        assert_eq!(r.results[1].id, id);
        assert!(r.results[1].error.is_none(), "{:?}", r.results[1]);
        assert_eq!(m.catalog.stat("/g/f").await.unwrap().size, 3);
        let e = m
            .replicas_written(group(vec![written(id); MAX_REPLICAS_WRITTEN + 1]))
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Invalid, "{e}");
    }

    #[tokio::test]
    async fn a_pending_file_is_placed_and_only_its_writer_or_an_administrator_aborts_it() {
        let dir = tempfile::tempdir().unwrap();
        let m = meta(dir.path()).await;
        m.register_node(cert(1), registration("A")).await.unwrap();
        let (root, alice, bob) = (user("root", true), user("alice", false), user("bob", false));
        m.mkdir_as(&root, "/data", 0o777, false).await.unwrap();
        let req = pb::CreateFilesRequest {
            files: vec![pb::NewFile {
                path: "/data/f.dat".into(),
                size: 1 << 20,
                mode: 0o644,
                ..Default::default()
            }],
            ..Default::default()
        };
        let reply = m.create_files(&alice, &req).await.unwrap();
        assert!(reply.errors.is_empty(), "{:?}", reply.errors);
        assert_eq!(reply.placements.len(), 1);
        assert_eq!(reply.placements[0].node, "n1");
        let id = reply.placements[0].ids[0];
        // The same path again, while it is being written: a per-file error of kind busy.
        let again = m.create_files(&bob, &req).await.unwrap();
        assert_eq!(again.errors.len(), 1);
        assert_eq!(
            again.errors[0].code,
            ErrorKind::Busy.name(),
            "{:?}",
            again.errors
        );

        let e = m.abort_files_as(&bob, &[id]).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::PermissionDenied, "{e}");
        m.abort_files_as(&alice, &[id]).await.unwrap();
        // Gone: aborting again is nothing to do, and the path is free.
        m.abort_files_as(&alice, &[id]).await.unwrap();
        let again = m.create_files(&bob, &req).await.unwrap();
        assert!(again.errors.is_empty(), "{:?}", again.errors);
    }
}
