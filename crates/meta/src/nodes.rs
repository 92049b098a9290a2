//! The `NodeService`: storage nodes register (getting their capability key), report
//! heartbeats (and get back files to delete), upload their inventory for reconciliation, and
//! report each replica they have written and verified, which is what makes a new file visible.
//! Every call must come from the node it names (its host certificate's CN).

use crate::grpc::Op;
use crate::state::{Meta, code_of_status, status};
use api::meta as pb;
use api::meta::node_service_server::NodeService;
use catalog::CatalogError;
use catalog::normalize;
use std::collections::HashMap;
use std::sync::Arc;
use tonic::{Request, Response, Status};
use wire::grant::{Operation, SignedGrant};

/// The node service.
pub struct NodeServiceImpl {
    pub meta: Arc<Meta>,
}

/// Inventory entries a node may upload in one session (more is refused: 100 M files).
const MAX_INVENTORY: usize = 100_000_000;

#[tonic::async_trait]
impl NodeService for NodeServiceImpl {
    async fn register(
        &self,
        req: Request<pb::RegisterRequest>,
    ) -> Result<Response<pb::RegisterReply>, Status> {
        let m = &self.meta;
        m.enrolling_call(Op::one("register"), req, async |cert, q| {
        if q.site.is_empty() || q.address.is_empty() {
            return Err(Status::invalid_argument(
                "a node needs a site and an address",
            ));
        }
        let fp = cert.fingerprint;
        let refuse = |why: String| {
            m.event(format!("node {} refused: {why}", q.name));
            Status::permission_denied(why)
        };
        // The server's own certificate is a host certificate of the CA too, but never a node.
        if m.own_cert() == Some(fp) {
            return Err(refuse(format!(
                "{fp} is the metadata server's own certificate; a storage node needs a host certificate of its own (haul cert issue --host NAME)"
            )));
        }
        let enrolled = m.ids.nodes.check(&q.name, &fp).map_err(refuse)?;
        let fresh_key: [u8; 32] = rand::random();
        let fp_text = fp.to_string();
        let r = m
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
                let file = m
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
            Err(e) => return Err(status(e)),
        };
        m.refresh_nodes().await.map_err(status)?;
        // Its first session need not wait for the next round of the connection warmer.
        m.warm_node_connections();
        m.event(format!(
            "node {} registered (site {}, {}, {} GB free)",
            node.name,
            node.site,
            node.address,
            node.free / 1_000_000_000
        ));
        Ok(pb::RegisterReply {
            capability_key: key,
            heartbeat_ms: m.settings.heartbeat.as_millis() as u32,
            orphan_grace_ms: m.settings.orphan_grace.as_millis() as u32,
        })
        })
        .await
    }

    async fn heartbeat(
        &self,
        req: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatReply>, Status> {
        let m = &self.meta;
        m.node_call(Op::one("heartbeat"), req, async |q| {
            let was_up = m.node(&q.name).map(|n| n.node.up);
            // A load that is not a number (NaN, infinite, negative) counts as idle: it is only a
            // weight for placement, and must not reach the catalog or the sorts as a NaN.
            let load = if q.load.is_finite() {
                q.load.max(0.0)
            } else {
                0.0
            };
            let node = match m
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
                Err(e) => return Err(status(e)),
            };
            if was_up == Some(false) {
                m.event(format!("node {} is back", node.name));
            }
            let delete = m.catalog.dead_replicas(&q.name).await.map_err(status)?;
            Ok(pb::HeartbeatReply {
                delete,
                reregister: false,
            })
        })
        .await
    }

    async fn inventory(
        &self,
        req: Request<pb::InventoryRequest>,
    ) -> Result<Response<pb::InventoryReply>, Status> {
        let m = &self.meta;
        let items = req.get_ref().files.len() as u64;
        m.node_call(Op::many("inventory", items), req, async |q| {
        let held = {
            let mut inv = m.inventories.lock().expect("inventories lock");
            let part = inv.entry(q.name.clone()).or_default();
            if part.len() + q.files.len() > MAX_INVENTORY {
                inv.remove(&q.name);
                return Err(Status::resource_exhausted("inventory too large"));
            }
            part.extend(q.files.iter().map(|f| (f.id, f.size)));
            if !q.last {
                return Ok(pb::InventoryReply::default());
            }
            inv.remove(&q.name).unwrap_or_default()
        };
        let r = m
            .catalog
            .reconcile(&q.name, &held, m.settings.orphan_grace.as_millis() as i64)
            .await
            .map_err(status)?;
        m.event(format!(
            "node {} inventory: {} files, {} as expected, {} missing, {} damaged, {} unknown (removed after the grace period)",
            q.name,
            held.len(),
            r.known,
            r.missing.len(),
            r.damaged.len(),
            r.orphans.len()
        ));
        let delete = m.catalog.dead_replicas(&q.name).await.map_err(status)?;
        let held_ids: HashMap<i64, ()> = held.keys().map(|k| (*k, ())).collect();
        Ok(pb::InventoryReply {
            delete: delete
                .into_iter()
                .filter(|i| held_ids.contains_key(i))
                .collect(),
            missing: r.missing.len() as u64,
            known: r.known,
        })
        })
        .await
    }

    async fn replica_written(
        &self,
        req: Request<pb::ReplicaWrittenRequest>,
    ) -> Result<Response<pb::ReplicaWrittenReply>, Status> {
        let m = &self.meta;
        m.node_call(Op::one("replica_written"), req, async |q| {
            let i = m
                .catalog
                .complete_replica(q.id, &q.node, q.size, &q.checksum, q.mtime_ns)
                .await
                .map_err(status)?;
            // A new file may fall under a replica policy.
            m.reconcile_now.notify_one();
            let path = m.catalog.path_of(i.id).await.unwrap_or_default();
            Ok(pb::ReplicaWrittenReply {
                entry: Some(crate::state::entry(&path, &i)),
            })
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
            m.catalog
                .forget_dead(&q.node, &q.ids)
                .await
                .map_err(status)?;
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
    /// Registers the files a task of `haul run` wrote on a node: as the run's user (from the
    /// run's capability), under the run's output directory, each a pending replica on that
    /// node until the node reports it written.
    pub async fn register_outputs(
        &self,
        q: pb::RegisterOutputsRequest,
    ) -> Result<pb::RegisterOutputsReply, Status> {
        let node = self.node(&q.node).ok_or_else(|| {
            Status::failed_precondition(format!("node {} is not registered", q.node))
        })?;
        let cap = q.capability.ok_or_else(|| {
            Status::permission_denied("registering outputs needs the run's capability")
        })?;
        let signed = SignedGrant {
            token: cap.token,
            mac: cap.mac,
        };
        // A task may end after its capability's hour: its outputs are taken for a day more.
        let g = signed
            .verify_relayed(&node.key, &q.node, Operation::Run, 0)
            .map_err(|e| Status::permission_denied(e.to_string()))?;
        if catalog::now_ms() > g.expires_ms + 86_400_000 {
            return Err(Status::permission_denied(
                "the run's capability has expired",
            ));
        }
        let user = self.ids.user_named(&g.user);
        let dir = normalize(&q.dir).map_err(status)?;
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
        let mut made: HashMap<String, Result<(), Status>> = HashMap::new();
        for (i, f) in q.files.iter().enumerate() {
            let fail = |code: &str, message: String| pb::FileError {
                path: f.name.clone(),
                code: code.into(),
                message,
            };
            let full = match normalize(&format!("{dir}/{}", f.name)) {
                Ok(p) if p.starts_with(&format!("{}/", dir.trim_end_matches('/'))) => p,
                _ => {
                    results[i].error = Some(fail(
                        "invalid",
                        format!("{}: not a name inside {dir}", f.name),
                    ));
                    continue;
                }
            };
            let (parent, _) = catalog::parent_and_name(&full).map_err(status)?;
            if parent != dir {
                let r = match made.get(&parent) {
                    Some(r) => r.clone(),
                    None => {
                        let r = self.mkdir_as(&user, &parent, 0, true).await.map(|_| ());
                        made.insert(parent.clone(), r.clone());
                        r
                    }
                };
                if let Err(s) = r {
                    results[i].error = Some(fail(code_of_status(&s), s.message().to_string()));
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
