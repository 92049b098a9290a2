//! Replica policies and the reconciler that keeps them: a directory (or file) attribute
//! `haul.policy = "copies=N sites=A,B"` applies to every file below it (the deepest policy
//! wins). A background pass, every few seconds and whenever something changes (a policy is
//! set, a node goes down or comes back, files are written), plans what is missing — copies on
//! nodes that died or were wiped no longer count — makes those copies, and removes surplus ones.
//! Also the one-shot `replicate` request, which uses the same planner and executor.

use crate::auth::User;
use crate::error::Error;
use crate::grpc::ProgressSender;
use crate::perm::{self, Access};
use crate::replication::{self, ExecOptions, FileState, Progress, Want};
use crate::state::Meta;
use crate::state::NodeEntry;
use api::meta as pb;
use catalog::{CatalogError, Inode, ReplicaState};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Name of the policy attribute.
pub const POLICY_XATTR: &str = "haul.policy";

/// Every policy: (path, inode, want), shallowest first.
pub async fn policies(meta: &Meta) -> Result<Vec<(String, Inode, Want)>, CatalogError> {
    let mut out = Vec::new();
    for (id, value) in meta.catalog.with_xattr(POLICY_XATTR).await? {
        let Ok(inode) = meta.catalog.inode(id).await else {
            continue;
        };
        let Ok(path) = meta.catalog.path_of(id).await else {
            continue;
        };
        match Want::parse(&String::from_utf8_lossy(&value)) {
            Ok(w) => out.push((path, inode, w)),
            Err(e) => tracing::warn!(%path, error = %e, "ignoring a malformed replica policy"),
        }
    }
    out.sort_by_key(|(p, _, _)| p.matches('/').count());
    Ok(out)
}

/// The files below `paths` with their replicas.
async fn file_states(meta: &Meta, paths: &[String]) -> Result<Vec<FileState>, CatalogError> {
    let mut files: Vec<(String, Inode)> = Vec::new();
    for p in paths {
        files.extend(meta.catalog.files_below(p).await?);
    }
    let mut out = Vec::with_capacity(files.len());
    for chunk in files.chunks(5000) {
        let ids: Vec<i64> = chunk.iter().map(|(_, i)| i.id).collect();
        let mut reps = meta.catalog.replicas_of(&ids).await?;
        for (path, inode) in chunk {
            out.push(FileState {
                path: path.clone(),
                replicas: reps.remove(&inode.id).unwrap_or_default(),
                inode: inode.clone(),
            });
        }
    }
    Ok(out)
}

/// Checks that `want` can be met at all by the registry (known sites).
fn check_sites(meta: &Meta, want: &Want) -> Result<(), Error> {
    let nodes = meta.nodes();
    for s in &want.sites {
        if !nodes.iter().any(|n| n.node.site == *s) {
            let mut known: Vec<String> = nodes.iter().map(|n| n.node.site.clone()).collect();
            known.sort();
            known.dedup();
            return Err(Error::invalid(format!(
                "unknown site {s:?} (sites: {})",
                if known.is_empty() {
                    "none registered".into()
                } else {
                    known.join(", ")
                }
            )));
        }
    }
    Ok(())
}

impl Meta {
    /// Sets (or clears) the policy of `path`.
    pub async fn set_policy(
        &self,
        user: &User,
        req: &pb::PolicyRequest,
    ) -> Result<pb::PolicyReply, Error> {
        let (r, e) = self.existing(user, &req.path).await?;
        perm::require_owner(user, &e, &r.norm)?;
        if req.clear {
            let _ = self.catalog.xattr_remove(&r.norm, POLICY_XATTR).await;
        } else {
            let want = Want {
                copies: req.copies.max(1),
                sites: req.sites.clone(),
                private: req.private,
            };
            if want.copies > 64 {
                return Err(Error::invalid("at most 64 copies"));
            }
            check_sites(self, &want)?;
            self.catalog
                .xattr_set(&r.norm, POLICY_XATTR, want.format().as_bytes())
                .await?;
            self.event_about(
                format!("policy {} on {}", want.format(), r.norm),
                vec![r.norm.clone()],
            );
        }
        self.reconcile_now.notify_one();
        self.policies_reply(user, "/").await
    }

    /// The policies below `under` that `user` may see (whose paths they could find).
    pub async fn policies_reply(&self, user: &User, under: &str) -> Result<pb::PolicyReply, Error> {
        let under = catalog::normalize(under)?;
        let all = policies(self).await?;
        let mut out = Vec::new();
        for (path, _, w) in all {
            let below = under == "/" || path == under || path.starts_with(&format!("{under}/"));
            if below && self.may_see(user, &path).await {
                out.push(pb::Policy {
                    path,
                    copies: w.copies,
                    sites: w.sites,
                    private: w.private,
                });
            }
        }
        Ok(pb::PolicyReply { policies: out })
    }

    /// Runs a one-shot replication for `user`, reporting progress on `tx`.
    pub async fn replicate(
        self: Arc<Self>,
        user: User,
        req: pb::ReplicateRequest,
        tx: ProgressSender<pb::ReplicateProgress>,
    ) {
        let started = Instant::now();
        let cancel = CancellationToken::new();
        let progress = Arc::new(Progress::default());
        let prepared = async {
            if req.paths.is_empty() {
                return Err(Error::invalid("name files or directories to replicate"));
            }
            let want = Want {
                copies: req.copies.max(1),
                sites: req.sites.clone(),
                private: req.private,
            };
            check_sites(&self, &want)?;
            let paths = self.named_paths(&user, &req.paths, req.recursive).await?;
            let mut refused = Vec::new();
            let mut files = file_states(&self, &paths).await?;
            files.retain(|f| {
                let ok = perm::allows(&user, &f.inode, Access::Read);
                if !ok {
                    refused.push(
                        Error::permission_denied(format!(
                            "{}: permission denied ({} may not read it)",
                            f.path, user.name
                        ))
                        .for_file(&f.path),
                    );
                }
                ok
            });
            Ok((want, files, refused))
        }
        .await;
        let (want, files, refused) = match prepared {
            Ok(x) => x,
            Err(e) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
        };
        let plan = replication::plan(&files, &self.nodes(), &want, false);
        {
            let mut f = progress.failures.lock().expect("failures");
            f.extend(plan.refused.iter().cloned());
        }
        let n_files = files.len() as u64;
        let already = plan.already;
        if !plan.tasks.is_empty() {
            self.event(format!(
                "{}: replicating {} copies of {} files ({})",
                user.name,
                plan.tasks.len(),
                n_files,
                want.format()
            ));
        }
        let run = tokio::spawn(replication::execute(
            self.clone(),
            plan.tasks,
            ExecOptions {
                origin: replication::Origin::new("replicate", &user.name),
                ..Default::default()
            },
            progress.clone(),
            cancel.clone(),
        ));
        tokio::pin!(run);
        let snapshot = |finished: bool| {
            let mut failures: Vec<pb::FileError> = refused.clone();
            failures.extend(progress.failures.lock().expect("failures").iter().map(|r| {
                Error::new(r.code, format!("{}: {}", r.path, r.reason)).for_file(&r.path)
            }));
            pb::ReplicateProgress {
                files: n_files,
                copies_needed: progress.copies_needed.load(Ordering::Relaxed),
                copies_made: progress.copies_made.load(Ordering::Relaxed),
                bytes_needed: progress.bytes_needed.load(Ordering::Relaxed),
                bytes_done: progress.bytes_done.load(Ordering::Relaxed),
                already,
                failures,
                finished,
                seconds: started.elapsed().as_secs_f64(),
                sessions: progress.sessions.load(Ordering::Relaxed) as u32,
                nodes: progress
                    .nodes
                    .lock()
                    .expect("nodes")
                    .iter()
                    .map(|(n, (s, r, k))| pb::NodeRate {
                        node: n.clone(),
                        bytes_sent: *s,
                        bytes_received: *r,
                        sessions: *k,
                    })
                    .collect(),
            }
        };
        if !crate::grpc::stream_progress(&mut run, &tx, &cancel, &snapshot).await {
            self.event(format!("{}: replication interrupted", user.name));
            return;
        }
        let last = snapshot(true);
        self.event(format!(
            "{}: replication done: {} copies made, {} failed, {:.1} s",
            user.name,
            last.copies_made,
            last.failures.len(),
            last.seconds
        ));
        let _ = tx.send(Ok(last)).await;
    }
}

/// The files below each policy, with the policy that applies (the deepest one).
async fn governed(meta: &Meta) -> Result<Vec<(Want, Vec<FileState>)>, CatalogError> {
    let pols = policies(meta).await?;
    if pols.is_empty() {
        return Ok(Vec::new());
    }
    // Each file under the deepest policy covering it: policies are shallowest first, so
    // later ones overwrite.
    let mut chosen: HashMap<i64, usize> = HashMap::new();
    let mut all: HashMap<i64, FileState> = HashMap::new();
    for (i, (path, _, _)) in pols.iter().enumerate() {
        for f in file_states(meta, std::slice::from_ref(path)).await? {
            chosen.insert(f.inode.id, i);
            all.insert(f.inode.id, f);
        }
    }
    let mut groups: Vec<(Want, Vec<FileState>)> = pols
        .iter()
        .map(|(_, _, w)| (w.clone(), Vec::new()))
        .collect();
    for (id, i) in chosen {
        if let Some(f) = all.remove(&id) {
            groups[i].1.push(f);
        }
    }
    Ok(groups)
}

/// Files with a replica on a draining node that no policy governs, grouped by what keeps them
/// as they were: as many copies as they had when the drain began (at least one). Their damaged and missing
/// replica records there go (they are not copies; the node removes what is left of them).
async fn drain_groups(
    meta: &Meta,
    nodes: &[NodeEntry],
    governed: &[(Want, Vec<FileState>)],
) -> Result<Vec<(Want, Vec<FileState>)>, CatalogError> {
    let taken: HashSet<i64> = governed
        .iter()
        .flat_map(|(_, fs)| fs.iter().map(|f| f.inode.id))
        .collect();
    let mut ids = BTreeSet::new();
    for n in nodes.iter().filter(|n| n.node.drain_ms != 0 && n.node.up) {
        for r in meta.catalog.node_replicas(&n.node.name).await? {
            match r.state {
                ReplicaState::Complete if !taken.contains(&r.inode) => {
                    ids.insert(r.inode);
                }
                ReplicaState::Damaged | ReplicaState::Missing => {
                    meta.catalog.remove_replica(r.inode, &r.node).await?;
                }
                _ => {}
            }
        }
    }
    let ids: Vec<i64> = ids.into_iter().collect();
    // For a live node: Some(when its drain began), or Some(None) when it is not draining.
    let drain_of = |node: &str| {
        nodes
            .iter()
            .find(|n| n.node.name == node && n.node.up)
            .map(|n| (n.node.drain_ms != 0).then_some(n.node.drain_ms))
    };
    let mut by_copies: BTreeMap<u32, Vec<FileState>> = BTreeMap::new();
    for chunk in ids.chunks(5000) {
        let mut reps = meta.catalog.replicas_of(chunk).await?;
        for id in chunk {
            // Removed meanwhile: nothing to keep.
            let (Ok(inode), Ok(path)) = (
                meta.catalog.inode(*id).await,
                meta.catalog.path_of(*id).await,
            ) else {
                continue;
            };
            let replicas = reps.remove(id).unwrap_or_default();
            // The copies it had when the drain began: those on draining nodes, and those
            // elsewhere made before (the others are this drain's replacements).
            let live: Vec<&catalog::Replica> = replicas
                .iter()
                .filter(|r| r.state == ReplicaState::Complete && drain_of(&r.node).is_some())
                .collect();
            let since = live
                .iter()
                .filter_map(|r| drain_of(&r.node).flatten())
                .min()
                .unwrap_or(i64::MAX);
            let copies = live
                .iter()
                .filter(|r| drain_of(&r.node).flatten().is_some() || r.created_ms < since)
                .count()
                .max(1) as u32;
            by_copies.entry(copies).or_default().push(FileState {
                path,
                inode,
                replicas,
            });
        }
    }
    Ok(by_copies
        .into_iter()
        .map(|(copies, files)| {
            (
                Want {
                    copies,
                    sites: Vec::new(),
                    private: false,
                },
                files,
            )
        })
        .collect())
}

/// One reconciler pass: make missing copies, move copies off draining nodes, remove surplus
/// ones (a draining node's first, once their replacements are complete).
pub async fn pass(meta: &Arc<Meta>, cancel: &CancellationToken) -> Result<(), CatalogError> {
    let started = Instant::now();
    let nodes = meta.nodes();
    let mut groups = governed(meta).await?;
    let drains = drain_groups(meta, &nodes, &groups).await?;
    groups.extend(drains);
    let mut tasks = Vec::new();
    let mut surplus = Vec::new();
    let mut under = 0u64;
    let mut moving = 0u64;
    for (want, files) in &groups {
        let p = replication::plan(files, &nodes, want, true);
        let mut ids: Vec<i64> = p.tasks.iter().map(|t| t.inode.id).collect();
        ids.dedup();
        under += (ids.len() as u64 - p.moving) + p.refused.len() as u64;
        moving += p.moving;
        tasks.extend(p.tasks);
        surplus.extend(p.surplus);
    }
    {
        let mut st = meta.reconciler.lock().expect("reconciler");
        st.under_replicated = under;
        st.moving = moving;
        st.over_replicated = surplus.len() as u64;
        st.running = tasks.len() as u64;
    }
    if !tasks.is_empty() {
        meta.event(format!("reconciler: making {} missing copies", tasks.len()));
        let progress = Arc::new(Progress::default());
        replication::execute(
            meta.clone(),
            tasks,
            ExecOptions {
                origin: replication::Origin::new("reconcile", "system"),
                ..Default::default()
            },
            progress.clone(),
            cancel.clone(),
        )
        .await;
        let made = progress.copies_made.load(Ordering::Relaxed);
        let failed = progress.failures.lock().expect("failures").len();
        meta.event(format!(
            "reconciler: {made} copies made, {failed} failed, {:.1} s",
            started.elapsed().as_secs_f64()
        ));
        meta.reconciler.lock().expect("reconciler").repairs_done += made;
    }
    // In transactions of 500: one per replica took minutes for a drained node's 10,000.
    let mut removed = 0;
    for chunk in surplus.chunks(500) {
        let which: Vec<(i64, String)> = chunk.iter().map(|(id, n, _)| (*id, n.clone())).collect();
        match meta.catalog.remove_replicas(&which).await {
            Ok(()) => {
                removed += chunk.len() as u64;
                for (_, node, path) in chunk {
                    tracing::debug!(%path, %node, "surplus replica removed");
                }
            }
            Err(e) => tracing::warn!(error = %e, "surplus replicas not removed"),
        }
    }
    if removed > 0 {
        meta.event(format!("reconciler: removed {removed} surplus copies"));
    }
    announce_drained(meta, &nodes).await?;
    let mut st = meta.reconciler.lock().expect("reconciler");
    st.removals_done += removed;
    st.running = 0;
    st.last_pass_ms = catalog::now_ms();
    st.last_pass_seconds = started.elapsed().as_secs_f64();
    Ok(())
}

/// An event when a draining node holds no replica any more (once per drain).
async fn announce_drained(meta: &Meta, nodes: &[NodeEntry]) -> Result<(), CatalogError> {
    let draining: Vec<&NodeEntry> = nodes.iter().filter(|n| n.node.drain_ms != 0).collect();
    let mut done = Vec::new();
    for n in &draining {
        if meta.catalog.node_replicas(&n.node.name).await?.is_empty() {
            done.push(*n);
        }
    }
    let mut st = meta.reconciler.lock().expect("reconciler");
    st.drained
        .retain(|name| draining.iter().any(|n| n.node.name == *name));
    for n in done {
        if st.drained.insert(n.node.name.clone()) {
            let secs = (catalog::now_ms() - n.node.drain_ms).max(0) as f64 / 1000.0;
            meta.event(format!(
                "node {} drained: {} replicas moved off in {secs:.1} s; it may be stopped and removed",
                n.node.name, n.node.drain_replicas
            ));
        }
    }
    Ok(())
}

/// The reconciler: a pass every `every`, or sooner when woken.
pub async fn run(meta: Arc<Meta>, every: Duration, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
                        _ = meta.reconcile_now.notified() => {
                // Let a burst of changes (an upload of many files) settle.
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            _ = stop.cancelled() => return,
        }
        if meta.copy_options().is_none() {
            continue;
        }
        if let Err(e) = pass(&meta, &stop).await {
            tracing::warn!(error = %e, "reconciler pass failed");
        }
    }
}

/// `haul status` for `user`: policies and events only about paths the user may see.
pub async fn status_reply(meta: &Meta, user: &User) -> Result<pb::StatusReply, Error> {
    let pols = meta.policies_reply(user, "/").await?.policies;
    let st = meta.reconciler.lock().expect("reconciler").clone();
    let nodes = meta.nodes();
    Ok(pb::StatusReply {
        policies: pols,
        under_replicated: st.under_replicated,
        over_replicated: st.over_replicated,
        repairs_running: st.running,
        repairs_done: st.repairs_done,
        removals_done: st.removals_done,
        events: meta.events_for(user, 20).await,
        nodes_up: nodes.iter().filter(|n| n.node.up).count() as u64,
        // The per-node figures total every replica: only asked for when a node drains.
        draining: if nodes.iter().any(|n| n.node.drain_ms != 0) {
            meta.node_infos()
                .await?
                .into_iter()
                .filter(|n| n.drain_ms != 0)
                .collect()
        } else {
            Vec::new()
        },
        moving: st.moving,
        nodes_down: nodes.iter().filter(|n| !n.node.up).count() as u64,
        last_pass_ms: st.last_pass_ms,
        last_pass_seconds: st.last_pass_seconds,
    })
}
