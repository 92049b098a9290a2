//! The `Files` service: creating files (placing them on nodes and granting the writes),
//! opening them for reading (choosing replicas and granting the reads), where replicas are,
//! and the node registry as users see it (`nodes`, `df`).

use crate::auth::User;
use crate::error::Error;
use crate::grpc::{Op, ProgressStream, progress_stream};
use crate::perm::{self, Access};
use crate::placement::{self, NodeView, PlaceError};
use crate::state::{Meta, NodeEntry, entry, file_error, node_info};
use api::meta as pb;
use api::meta::files_server::Files;
use catalog::{CreateItem, CreateKind, Inode, Kind, NewEntry, ReplicaState, normalize};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use tonic::{Request, Response, Status};
use wire::error::ErrorKind;
use wire::grant::Operation;

/// The files service.
pub struct FilesService {
    pub meta: Arc<Meta>,
}

/// Files of one request at most (clients send larger sets in parts).
pub const MAX_BATCH: usize = 10_000;

fn state_name(s: ReplicaState) -> &'static str {
    match s {
        ReplicaState::Writing => "writing",
        ReplicaState::Complete => "complete",
        ReplicaState::Damaged => "damaged",
        ReplicaState::Missing => "missing",
    }
}

impl Meta {
    /// Creates files for `user`: empty ones at once, others pending and placed on nodes.
    pub async fn create_files(
        &self,
        user: &User,
        req: &pb::CreateFilesRequest,
    ) -> Result<pb::CreateFilesReply, Error> {
        self.create_files_on(user, req, None).await
    }

    /// [`Self::create_files`], with every replica on node `pin` when given (outputs of a run,
    /// registered on the node that wrote them).
    pub async fn create_files_on(
        &self,
        user: &User,
        req: &pb::CreateFilesRequest,
        pin: Option<&str>,
    ) -> Result<pb::CreateFilesReply, Error> {
        if req.files.len() > MAX_BATCH {
            return Err(Error::invalid(format!(
                "at most {MAX_BATCH} files per request"
            )));
        }
        let mut reply = pb::CreateFilesReply::default();
        // Permission on each parent directory (and on files being replaced), once per parent.
        let mut parents: HashMap<String, Result<Inode, Error>> = HashMap::new();
        let mut items = Vec::with_capacity(req.files.len());
        let mut sizes = Vec::with_capacity(req.files.len());
        for f in &req.files {
            let norm = match normalize(&f.path) {
                Ok(n) => n,
                Err(e) => {
                    reply.errors.push(file_error(&f.path, &e));
                    continue;
                }
            };
            let (parent, _) = match catalog::parent_and_name(&norm) {
                Ok(p) => p,
                Err(e) => {
                    reply.errors.push(file_error(&f.path, &e));
                    continue;
                }
            };
            if !parents.contains_key(&parent) {
                let r = self.writable_parent(user, &norm).await;
                parents.insert(parent.clone(), r);
            }
            let dir = match &parents[&parent] {
                Ok(d) => d.clone(),
                Err(e) => {
                    reply.errors.push(e.for_file(&norm));
                    continue;
                }
            };
            if req.overwrite
                && let Ok(Some(old)) = self.catalog.lookup(&norm).await
                && old.kind == Kind::File
                && !perm::allows(user, &old, Access::Write)
            {
                reply.errors.push(
                    Error::permission_denied(format!(
                        "{norm}: permission denied ({} may not write this file)",
                        user.name
                    ))
                    .for_file(&norm),
                );
                continue;
            }
            items.push(CreateItem {
                path: norm,
                entry: NewEntry {
                    owner: user.name.clone(),
                    group: self.new_group(user, &dir),
                    mode: if f.mode == 0 { 0o644 } else { f.mode & 0o7777 },
                    mtime_ns: f.mtime_ns,
                },
                kind: if f.size == 0 {
                    CreateKind::Empty
                } else {
                    CreateKind::Pending
                },
                private: f.private,
            });
            sizes.push(f.size);
        }
        let results = self.catalog.create_files(&items, req.overwrite).await?;
        let mut pending: Vec<(String, Inode, u64)> = Vec::new();
        for ((it, r), size) in items.iter().zip(results).zip(sizes) {
            match r {
                Ok(i) if it.kind == CreateKind::Empty => reply.created.push(entry(&it.path, &i)),
                Ok(i) => pending.push((it.path.clone(), i, size)),
                Err(e) => reply.errors.push(file_error(&it.path, &e)),
            }
        }
        if pending.is_empty() {
            return Ok(reply);
        }
        let nodes: Vec<NodeEntry> = self
            .nodes()
            .into_iter()
            .filter(|n| !n.key.is_empty() && !req.exclude_nodes.contains(&n.node.name))
            .filter(|n| pin.is_none_or(|p| p == n.node.name))
            .collect();
        let views: Vec<NodeView> = nodes.iter().map(|n| n.view()).collect();
        let site = (!req.client_site.is_empty()).then_some(req.client_site.as_str());
        let sizes: Vec<u64> = pending.iter().map(|p| p.2).collect();
        let chosen = match placement::place(&sizes, &views, site) {
            Ok(c) => c,
            Err(e) => {
                // Nothing half-registered stays behind.
                for (path, i, _) in &pending {
                    let _ = self.catalog.abort_pending(i.id).await;
                    let kind = match e {
                        PlaceError::NoNodes => ErrorKind::Unavailable,
                        PlaceError::NoSpace { .. } => ErrorKind::NoSpace,
                    };
                    reply
                        .errors
                        .push(Error::new(kind, format!("{path}: {e}")).for_file(path));
                }
                return Ok(reply);
            }
        };
        let mut by_node: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (f, n) in chosen.iter().enumerate() {
            by_node.entry(*n).or_default().push(f);
        }
        let starts: Vec<(i64, String)> = chosen
            .iter()
            .enumerate()
            .map(|(f, n)| (pending[f].1.id, nodes[*n].node.name.clone()))
            .collect();
        // New files: none has a complete replica anywhere.
        if let Err(e) = self.catalog.start_replicas(&starts, 0).await {
            for (_, i, _) in &pending {
                let _ = self.catalog.abort_pending(i.id).await;
            }
            return Err(e.into());
        }
        for (n, files) in by_node {
            let node = &nodes[n];
            let ids: Vec<i64> = files.iter().map(|f| pending[*f].1.id).collect();
            let cap = self.user_grant(node, Operation::Write, ids.clone(), user)?;
            reply.placements.push(pb::Placement {
                node: node.node.name.clone(),
                address: node.node.address.clone(),
                ids,
                paths: files.iter().map(|f| pending[*f].0.clone()).collect(),
                capability: Some(cap),
            });
        }
        Ok(reply)
    }

    /// Chooses replicas and grants reads for `user`.
    pub async fn open_read(
        &self,
        user: &User,
        req: &pb::OpenReadRequest,
    ) -> Result<pb::OpenReadReply, Error> {
        let mut reply = pb::OpenReadReply::default();
        let op = if req.run {
            if !req.output.is_empty() {
                // Outputs will be created there: fail before anything runs.
                let (r, dir) = self.existing(user, &req.output).await?;
                if dir.kind != Kind::Dir {
                    return Err(Error::not_a_directory(&r.norm));
                }
                perm::require(user, &dir, Access::Write, &r.norm)?;
                perm::require(user, &dir, Access::Search, &r.norm)?;
            }
            Operation::Run
        } else {
            Operation::Read
        };
        let mut files: Vec<(String, Inode)> = Vec::new();
        for p in &req.paths {
            let (r, e) = match self.existing(user, p).await {
                Ok(x) => x,
                Err(e) => {
                    reply.errors.push(e.for_file(p));
                    continue;
                }
            };
            if e.kind == Kind::File {
                files.push((r.norm, e));
                continue;
            }
            if !req.recursive {
                reply.errors.push(
                    Error::new(
                        ErrorKind::IsADirectory,
                        format!("{}: is a directory (use -r)", r.norm),
                    )
                    .for_file(&r.norm),
                );
                continue;
            }
            // Reading a tree: list and search permission on every directory in it.
            let dirs = self.catalog.dirs_below(&r.norm).await?;
            let mut readable: HashSet<i64> = HashSet::new();
            for (dp, d) in &dirs {
                if perm::allows(user, d, Access::Read) && perm::allows(user, d, Access::Search) {
                    readable.insert(d.id);
                    reply.dirs.push(entry(dp, d));
                } else {
                    reply.errors.push(
                        Error::permission_denied(format!(
                            "{dp}: permission denied ({} may not list this directory)",
                            user.name
                        ))
                        .for_file(dp),
                    );
                }
            }
            for (fp, f) in self.catalog.files_below(&r.norm).await? {
                if readable.contains(&f.parent) {
                    files.push((fp, f));
                }
            }
        }
        if files.len() > MAX_BATCH * 10 {
            return Err(Error::invalid(format!(
                "{} files in one request; open at most {} at a time",
                files.len(),
                MAX_BATCH * 10
            )));
        }
        let exclude: HashSet<&str> = req.exclude_nodes.iter().map(|s| s.as_str()).collect();
        let ids: Vec<i64> = files.iter().map(|(_, f)| f.id).collect();
        let replicas = self.catalog.replicas_of(&ids).await?;
        let nodes: HashMap<String, NodeEntry> = self
            .nodes()
            .into_iter()
            .map(|n| (n.node.name.clone(), n))
            .collect();
        let site = (!req.client_site.is_empty()).then_some(req.client_site.as_str());
        let mut grants: BTreeMap<String, Vec<i64>> = BTreeMap::new();
        for (path, f) in files {
            if !perm::allows(user, &f, Access::Read) {
                reply.errors.push(
                    Error::permission_denied(format!(
                        "{path}: permission denied ({} may not read this file)",
                        user.name
                    ))
                    .for_file(&path),
                );
                continue;
            }
            let holders: Vec<(NodeView, &catalog::Replica)> = replicas
                .get(&f.id)
                .map(|v| v.as_slice())
                .unwrap_or_default()
                .iter()
                .filter(|r| r.state == ReplicaState::Complete && !exclude.contains(r.node.as_str()))
                .filter_map(|r| nodes.get(&r.node).map(|n| (n.view(), r)))
                .collect();
            let views: Vec<&NodeView> = holders.iter().map(|(v, _)| v).collect();
            let ordered = placement::order_replicas(&views, site);
            let all = replicas
                .get(&f.id)
                .map(|v| v.as_slice())
                .unwrap_or_default();
            let damaged_only = !all.is_empty()
                && all.iter().all(|r| r.state != ReplicaState::Complete)
                && all.iter().any(|r| r.state == ReplicaState::Damaged);
            if ordered.is_empty() && f.size > 0 && damaged_only {
                // No good copy anywhere, not merely none reachable: the data is damaged (EIO
                // through a mount), not unavailable.
                reply.errors.push(
                    Error::new(
                        ErrorKind::SourceDamaged,
                        format!(
                            "{path}: every replica is damaged or missing (found by haul verify); restore the file from another copy"
                        ),
                    )
                    .for_file(&path),
                );
                continue;
            }
            if ordered.is_empty() && f.size > 0 {
                reply.errors.push(
                    Error::unavailable(format!(
                        "{path}: no healthy replica (none complete on a live node{})",
                        if exclude.is_empty() {
                            ""
                        } else {
                            " that has not failed"
                        }
                    ))
                    .for_file(&path),
                );
                continue;
            }
            let mut infos = Vec::with_capacity(ordered.len());
            for v in ordered {
                let n = &nodes[&v.name];
                grants.entry(v.name.clone()).or_default().push(f.id);
                let checksum = holders
                    .iter()
                    .find(|(h, _)| h.name == v.name)
                    .map(|(_, r)| r.checksum.clone())
                    .unwrap_or_default();
                infos.push(pb::ReplicaInfo {
                    node: v.name.clone(),
                    site: v.site.clone(),
                    address: n.node.address.clone(),
                    state: "complete".into(),
                    checksum,
                    node_up: v.up,
                });
            }
            reply.files.push(pb::ReadSource {
                path,
                id: f.id,
                size: f.size,
                mtime_ns: f.mtime_ns,
                mode: f.mode,
                checksum: f.checksum.clone(),
                replicas: infos,
                private: f.private,
            });
        }
        for (node, ids) in grants {
            let n = &nodes[&node];
            reply.nodes.push(pb::NodeAccess {
                node: node.clone(),
                site: n.node.site.clone(),
                address: n.node.address.clone(),
                capability: Some(self.user_grant(n, op, ids, user)?),
            });
        }
        Ok(reply)
    }

    /// A new capability for files the caller's capability covered: `read` (each a file the
    /// caller may read, complete on the node) or `write` (each a pending file the caller
    /// created, being written on the node). Permissions are checked again, so a renewal after a
    /// chmod is refused.
    pub async fn renew(
        &self,
        user: &User,
        req: &pb::RenewRequest,
    ) -> Result<pb::Capability, Error> {
        if req.ids.len() > MAX_BATCH {
            return Err(Error::invalid(format!(
                "at most {MAX_BATCH} files per request"
            )));
        }
        let node = self
            .node(&req.node)
            .ok_or_else(|| Error::not_found(format!("node {}: not registered", req.node)))?;
        let (op, want) = match req.op.as_str() {
            "read" => (Operation::Read, ReplicaState::Complete),
            "write" => (Operation::Write, ReplicaState::Writing),
            other => {
                return Err(Error::invalid(format!(
                    "cannot renew a {other:?} capability (read or write)"
                )));
            }
        };
        let replicas = self.catalog.replicas_of(&req.ids).await?;
        for id in &req.ids {
            let i = self.catalog.inode(*id).await?;
            let path = self.catalog.path_of(*id).await?;
            let denied = || {
                Error::permission_denied(format!(
                    "{path}: permission denied ({} may no longer {} it)",
                    user.name, req.op
                ))
            };
            if op == Operation::Read {
                if i.pending || i.kind != Kind::File {
                    return Err(Error::not_found(format!("{path}: no such file")));
                }
                // Search permission on the way, read permission on the file.
                let (_, e) = self.existing(user, &path).await?;
                if e.id != i.id || !perm::allows(user, &e, Access::Read) {
                    return Err(denied());
                }
            } else if !i.pending || (i.owner != user.name && !user.admin) {
                return Err(denied());
            }
            let held = replicas
                .get(id)
                .is_some_and(|v| v.iter().any(|r| r.node == req.node && r.state == want));
            if !held {
                return Err(Error::new(
                    ErrorKind::NotWritable,
                    format!(
                        "{path}: node {} holds no {} replica of it",
                        req.node,
                        if op == Operation::Read {
                            "complete"
                        } else {
                            "pending"
                        }
                    ),
                ));
            }
        }
        self.user_grant(&node, op, req.ids.clone(), user)
    }

    /// Every replica of a file, with its node.
    pub async fn where_is(&self, user: &User, path: &str) -> Result<pb::WhereReply, Error> {
        let (r, e) = self.existing(user, path).await?;
        let nodes: HashMap<String, NodeEntry> = self
            .nodes()
            .into_iter()
            .map(|n| (n.node.name.clone(), n))
            .collect();
        let replicas = if e.kind == Kind::File {
            self.catalog.replicas(e.id).await?
        } else {
            Vec::new()
        };
        Ok(pb::WhereReply {
            entry: Some(entry(&r.norm, &e)),
            replicas: replicas
                .iter()
                .map(|rep| {
                    let n = nodes.get(&rep.node);
                    pb::ReplicaInfo {
                        node: rep.node.clone(),
                        site: n.map(|n| n.node.site.clone()).unwrap_or_default(),
                        address: n.map(|n| n.node.address.clone()).unwrap_or_default(),
                        state: state_name(rep.state).into(),
                        checksum: rep.checksum.clone(),
                        node_up: n.is_some_and(|n| n.node.up),
                    }
                })
                .collect(),
        })
    }

    /// The registry with each node's number of complete replicas.
    /// Drops files `user` started and has not committed (an administrator's too): the ones
    /// committed meanwhile or already gone are left alone; another user's is refused.
    pub async fn abort_files_as(&self, user: &User, ids: &[i64]) -> Result<(), Error> {
        for id in ids {
            match self.catalog.inode(*id).await {
                Ok(i) if i.pending && (i.owner == user.name || user.admin) => {
                    self.catalog.abort_pending(*id).await?;
                }
                Ok(i) if i.pending => {
                    return Err(Error::permission_denied(format!(
                        "file {id} is being written by {}",
                        i.owner
                    )));
                }
                // Committed meanwhile, or already gone: nothing to abort.
                _ => {}
            }
        }
        Ok(())
    }

    /// Capacity and free space per node and per site.
    pub async fn df(&self) -> Result<pb::DfReply, Error> {
        let nodes = self.node_infos().await?;
        let mut sites: BTreeMap<String, pb::SiteUsage> = BTreeMap::new();
        for n in &nodes {
            let s = sites
                .entry(n.site.clone())
                .or_insert_with(|| pb::SiteUsage {
                    site: n.site.clone(),
                    ..Default::default()
                });
            s.capacity += n.capacity;
            s.free += n.free;
            s.nodes += 1;
            s.up += n.up as u32;
        }
        Ok(pb::DfReply {
            nodes,
            sites: sites.into_values().collect(),
        })
    }

    pub async fn node_infos(&self) -> Result<Vec<pb::NodeInfo>, Error> {
        let usage = self.catalog.node_usage().await?;
        Ok(self
            .nodes()
            .iter()
            .map(|n| node_info(n, *usage.get(&n.node.name).unwrap_or(&(0, 0))))
            .collect())
    }
}

#[tonic::async_trait]
impl Files for FilesService {
    async fn create_files(
        &self,
        req: Request<pb::CreateFilesRequest>,
    ) -> Result<Response<pb::CreateFilesReply>, Status> {
        let m = &self.meta;
        let items = req.get_ref().files.len() as u64;
        m.user_call(Op::many("create_files", items), &req, async |user, q| {
            m.create_files(&user, q).await
        })
        .await
    }

    async fn abort_files(
        &self,
        req: Request<pb::AbortFilesRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        let m = &self.meta;
        let items = req.get_ref().ids.len() as u64;
        m.user_call(Op::many("abort_files", items), &req, async |user, q| {
            m.abort_files_as(&user, &q.ids).await?;
            Ok(pb::Empty {})
        })
        .await
    }

    async fn open_read(
        &self,
        req: Request<pb::OpenReadRequest>,
    ) -> Result<Response<pb::OpenReadReply>, Status> {
        let m = &self.meta;
        m.user_call_counting("open_read", &req, async |user, q| {
            let reply = m.open_read(&user, q).await?;
            let files = reply.files.len() as u64;
            Ok((reply, files))
        })
        .await
    }

    async fn r#where(
        &self,
        req: Request<pb::PathRequest>,
    ) -> Result<Response<pb::WhereReply>, Status> {
        let m = &self.meta;
        m.user_call(Op::one("where"), &req, async |user, q| {
            m.where_is(&user, &q.path).await
        })
        .await
    }

    async fn nodes(&self, req: Request<pb::Empty>) -> Result<Response<pb::NodesReply>, Status> {
        let m = &self.meta;
        m.caller_call(Op::one("nodes"), &req, async |_, _| {
            Ok(pb::NodesReply {
                nodes: m.node_infos().await?,
            })
        })
        .await
    }

    async fn df(&self, req: Request<pb::Empty>) -> Result<Response<pb::DfReply>, Status> {
        let m = &self.meta;
        m.caller_call(Op::one("df"), &req, async |_, _| m.df().await)
            .await
    }

    type ReplicateStream = ProgressStream<pb::ReplicateProgress>;

    async fn replicate(
        &self,
        req: Request<pb::ReplicateRequest>,
    ) -> Result<Response<Self::ReplicateStream>, Status> {
        let m = &self.meta;
        m.user_call(Op::one("replicate"), &req, async |user, q| {
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            tokio::spawn(m.clone().replicate(user, q.clone(), tx));
            Ok(progress_stream(rx))
        })
        .await
    }

    type VerifyStream = ProgressStream<pb::VerifyProgress>;

    async fn verify(
        &self,
        req: Request<pb::VerifyRequest>,
    ) -> Result<Response<Self::VerifyStream>, Status> {
        let m = &self.meta;
        m.user_call(Op::one("verify"), &req, async |user, q| {
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            tokio::spawn(m.clone().verify(user, q.clone(), tx));
            Ok(progress_stream(rx))
        })
        .await
    }

    async fn set_policy(
        &self,
        req: Request<pb::PolicyRequest>,
    ) -> Result<Response<pb::PolicyReply>, Status> {
        let m = &self.meta;
        m.user_call(Op::one("set_policy"), &req, async |user, q| {
            m.set_policy(&user, q).await
        })
        .await
    }

    async fn policies(
        &self,
        req: Request<pb::PathRequest>,
    ) -> Result<Response<pb::PolicyReply>, Status> {
        let m = &self.meta;
        m.user_call(Op::one("policies"), &req, async |user, q| {
            let path = if q.path.is_empty() { "/" } else { &q.path };
            m.policies_reply(&user, path).await
        })
        .await
    }

    async fn drain_node(
        &self,
        req: Request<pb::DrainRequest>,
    ) -> Result<Response<pb::NodeInfo>, Status> {
        let m = &self.meta;
        m.user_call(Op::one("drain_node"), &req, async |user, q| {
            m.drain_node(&user, q).await
        })
        .await
    }

    async fn remove_node(
        &self,
        req: Request<pb::RemoveNodeRequest>,
    ) -> Result<Response<pb::RemoveNodeReply>, Status> {
        let m = &self.meta;
        m.user_call(Op::one("remove_node"), &req, async |user, q| {
            m.remove_node(&user, q).await
        })
        .await
    }

    async fn record_transfer(
        &self,
        req: Request<pb::RecordTransferRequest>,
    ) -> Result<Response<pb::RecordTransferReply>, Status> {
        let m = &self.meta;
        let items = req.get_ref().files.len() as u64;
        m.user_call(Op::many("record_transfer", items), &req, async |user, q| {
            m.record_client_transfer(&user, q).await
        })
        .await
    }

    async fn transfers(
        &self,
        req: Request<pb::TransfersRequest>,
    ) -> Result<Response<pb::TransfersReply>, Status> {
        let m = &self.meta;
        m.user_call(Op::one("transfers"), &req, async |user, q| {
            m.list_transfers(&user, q).await
        })
        .await
    }

    async fn get_transfer(
        &self,
        req: Request<pb::TransferRequest>,
    ) -> Result<Response<pb::TransferReply>, Status> {
        let m = &self.meta;
        m.user_call(Op::one("get_transfer"), &req, async |user, q| {
            m.get_transfer(&user, q).await
        })
        .await
    }

    async fn dashboard_login(
        &self,
        req: Request<pb::Empty>,
    ) -> Result<Response<pb::DashboardLoginReply>, Status> {
        let m = &self.meta;
        m.user_call(Op::one("dashboard_login"), &req, async |user, _| {
            let Some(http) = m.http_addr.get() else {
                return Err(Error::unavailable(
                    "this metadata server has no dashboard (it runs with --http off)",
                ));
            };
            let now = catalog::now_ms();
            let token = m.web.issue(&user.name, crate::webauth::Purpose::Login, now);
            Ok(pb::DashboardLoginReply {
                path: format!("/login?token={token}"),
                http: http.to_string(),
                expires_ms: now + crate::webauth::LOGIN_TTL_MS,
            })
        })
        .await
    }

    async fn report_live(
        &self,
        req: Request<pb::LiveReport>,
    ) -> Result<Response<pb::LiveReply>, Status> {
        let m = &self.meta;
        m.user_call(Op::one("report_live"), &req, async |user, q| {
            m.report_live(&user, q)
        })
        .await
    }

    async fn submit_job(
        &self,
        req: Request<pb::SubmitJobRequest>,
    ) -> Result<Response<pb::JobInfo>, Status> {
        let m = &self.meta;
        let items = req.get_ref().pairs.len() as u64;
        m.user_call(Op::many("submit_job", items), &req, async |user, q| {
            m.submit_job(&user, q).await
        })
        .await
    }

    async fn jobs(&self, req: Request<pb::JobsRequest>) -> Result<Response<pb::JobsReply>, Status> {
        let m = &self.meta;
        m.user_call(Op::one("jobs"), &req, async |user, q| {
            m.list_jobs(&user, q).await
        })
        .await
    }

    async fn get_job(
        &self,
        req: Request<pb::GetJobRequest>,
    ) -> Result<Response<pb::JobDetail>, Status> {
        let m = &self.meta;
        m.user_call(Op::one("get_job"), &req, async |user, q| {
            m.get_job(&user, q).await
        })
        .await
    }

    async fn cancel_job(&self, req: Request<pb::JobId>) -> Result<Response<pb::JobInfo>, Status> {
        let m = &self.meta;
        m.user_call(Op::one("cancel_job"), &req, async |user, q| {
            m.cancel_job(&user, q.id).await
        })
        .await
    }

    async fn retry_job(
        &self,
        req: Request<pb::RetryJobRequest>,
    ) -> Result<Response<pb::JobInfo>, Status> {
        let m = &self.meta;
        m.user_call(Op::one("retry_job"), &req, async |user, q| {
            m.retry_job(&user, q).await
        })
        .await
    }

    async fn live(&self, req: Request<pb::Empty>) -> Result<Response<pb::LiveList>, Status> {
        let m = &self.meta;
        m.user_call(Op::one("live"), &req, async |user, _| {
            Ok(m.live_copies(&user))
        })
        .await
    }

    async fn status(&self, req: Request<pb::Empty>) -> Result<Response<pb::StatusReply>, Status> {
        let m = &self.meta;
        m.caller_call(Op::one("status"), &req, async |caller, _| {
            // A node sees what anybody may see.
            let user = match caller {
                crate::auth::Caller::User(u) => u,
                crate::auth::Caller::Node(_) => crate::perm::anonymous(),
            };
            crate::reconcile::status_reply(m, &user).await
        })
        .await
    }

    async fn renew(
        &self,
        req: Request<pb::RenewRequest>,
    ) -> Result<Response<pb::Capability>, Status> {
        let m = &self.meta;
        let items = req.get_ref().ids.len() as u64;
        m.user_call(Op::many("renew", items), &req, async |user, q| {
            m.renew(&user, q).await
        })
        .await
    }

    async fn who_am_i(&self, req: Request<pb::Empty>) -> Result<Response<pb::Identity>, Status> {
        let m = &self.meta;
        let subject = req
            .extensions()
            .get::<crate::auth::PeerInfo>()
            .and_then(|p| p.cert.as_ref().map(|c| c.subject.clone()))
            .unwrap_or_default();
        m.caller_call(Op::one("who_am_i"), &req, async |caller, _| {
            Ok(match caller {
                crate::auth::Caller::User(u) => pb::Identity {
                    user: u.name,
                    groups: u.groups,
                    subject,
                },
                crate::auth::Caller::Node(n) => pb::Identity {
                    user: format!("node:{n}"),
                    groups: vec![],
                    subject,
                },
            })
        })
        .await
    }
}
