//! `haul verify`: the nodes recompute the checksums of their replicas where the data is (all
//! nodes in parallel); replicas that differ from the catalog are marked damaged, missing ones
//! missing, and, with repair, replaced by copies of a good replica. Also the periodic scrub,
//! which does the same for the whole namespace.

use crate::auth::User;
use crate::error::Error;
use crate::perm::{self, Access};
use crate::replication::{self, ExecOptions, FileState, Progress, Want};
use crate::state::{Meta, NodeEntry};
use api::meta as pb;
use catalog::ReplicaState;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use transfer::TransferError;
use transfer::client::{Peer, ServiceChannel};
use transfer::conn::ClientTls;
use wire::control::ListedFile;
use wire::grant::{Operation, SignedGrant};
use wire::node::{NodeRequest, NodeResponse, VerifyResult};

/// Replicas per verification request to one node.
const BATCH: usize = 500;

/// What a verification found.
#[derive(Default)]
pub struct Findings {
    pub files: u64,
    pub replicas: u64,
    pub checked: AtomicU64,
    pub bytes: AtomicU64,
    pub damaged: std::sync::Mutex<Vec<pb::FileError>>,
    pub failures: std::sync::Mutex<Vec<pb::FileError>>,
    pub repaired: AtomicU64,
}

/// Verifies (and with `repair`, for whom, repairs) the replicas of `files`.
pub async fn verify_files(
    meta: Arc<Meta>,
    files: Vec<FileState>,
    repair: Option<replication::Origin>,
    findings: Arc<Findings>,
    cancel: CancellationToken,
) {
    let nodes: HashMap<String, NodeEntry> = meta
        .nodes()
        .into_iter()
        .map(|n| (n.node.name.clone(), n))
        .collect();
    let tls = meta.copy_options().and_then(|o| o.tls);
    // Per node: the replicas it should hold.
    let mut per_node: BTreeMap<String, Vec<(usize, ListedFile)>> = BTreeMap::new();
    for (i, f) in files.iter().enumerate() {
        if f.inode.size == 0 {
            continue;
        }
        for r in &f.replicas {
            if r.state == ReplicaState::Writing {
                continue;
            }
            let up = nodes.get(&r.node).is_some_and(|n| n.node.up);
            if !up {
                continue;
            }
            per_node.entry(r.node.clone()).or_default().push((
                i,
                ListedFile {
                    locator: f.inode.id.to_string(),
                    name: f.path.clone(),
                    size: f.inode.size,
                    mode: 0,
                    mtime: wire::data::Timestamp { secs: 0, nanos: 0 },
                    expect: wire::checksum::parse_digests(&f.inode.checksum).unwrap_or_default(),
                },
            ));
        }
    }
    let mut tasks = tokio::task::JoinSet::new();
    for (node, list) in per_node {
        let Some(entry) = nodes.get(&node).cloned() else {
            continue;
        };
        let (meta, findings, tls, cancel) =
            (meta.clone(), findings.clone(), tls.clone(), cancel.clone());
        let files: Vec<(i64, u64, String, String)> = list
            .iter()
            .map(|(i, _)| {
                let f = &files[*i];
                (
                    f.inode.id,
                    f.inode.size,
                    f.inode.checksum.clone(),
                    f.path.clone(),
                )
            })
            .collect();
        tasks.spawn(async move {
            let mut verdicts: Vec<(i64, ReplicaState)> = Vec::new();
            for (chunk, meta_chunk) in list.chunks(BATCH).zip(files.chunks(BATCH)) {
                if cancel.is_cancelled() {
                    break;
                }
                let ids: Vec<i64> = meta_chunk.iter().map(|f| f.0).collect();
                // The node could not be asked: its replicas stay as they are, reported once.
                let unavailable = |message: String| {
                    findings
                        .failures
                        .lock()
                        .expect("failures")
                        .push(Error::unavailable(message).for_file(&node));
                };
                let grant = match meta.own_grant(&entry, Operation::Verify, ids) {
                    Ok(g) => g,
                    Err(s) => {
                        unavailable(s.message().to_string());
                        break;
                    }
                };
                let peer = match Peer::parse(&entry.node.address) {
                    Ok(p) => p,
                    Err(_) => break,
                };
                let listed: Vec<ListedFile> = chunk.iter().map(|(_, l)| l.clone()).collect();
                let r = verify_on_node(
                    &peer,
                    listed,
                    Some(SignedGrant {
                        token: grant.token,
                        mac: grant.mac,
                    }),
                    tls.as_ref(),
                )
                .await;
                let results = match r {
                    Ok(r) => r,
                    Err(e) => {
                        unavailable(format!("node {node}: {e}"));
                        break;
                    }
                };
                for (res, (id, size, checksum, path)) in results.iter().zip(meta_chunk) {
                    findings.checked.fetch_add(1, Ordering::Relaxed);
                    findings.bytes.fetch_add(res.size, Ordering::Relaxed);
                    let expect = wire::checksum::parse_digests(checksum).unwrap_or_default();
                    let (state, why) = match &res.error {
                        Some(e) if e.kind == wire::error::ErrorKind::NotFound => {
                            (ReplicaState::Missing, "missing".to_string())
                        }
                        Some(e) => (ReplicaState::Damaged, e.message.clone()),
                        None if res.size != *size => (
                            ReplicaState::Damaged,
                            format!("size {} instead of {size}", res.size),
                        ),
                        None => match wire::checksum::digests_match(&res.digests, &expect) {
                            Ok(()) => (ReplicaState::Complete, String::new()),
                            Err(_) => (
                                ReplicaState::Damaged,
                                format!(
                                    "damaged: checksum {} on disk, {} in the catalog",
                                    wire::checksum::format_digests(&res.digests),
                                    checksum
                                ),
                            ),
                        },
                    };
                    if state != ReplicaState::Complete {
                        findings
                            .damaged
                            .lock()
                            .expect("damaged")
                            .push(pb::FileError {
                                path: path.clone(),
                                code: if state == ReplicaState::Missing {
                                    "missing"
                                } else {
                                    "damaged"
                                }
                                .into(),
                                message: format!("{path}: replica on {node}: {why}"),
                            });
                    }
                    verdicts.push((*id, state));
                }
            }
            (node, verdicts)
        });
    }
    let mut all: Vec<(String, i64, ReplicaState)> = Vec::new();
    while let Some(r) = tasks.join_next().await {
        if let Ok((node, verdicts)) = r {
            all.extend(verdicts.into_iter().map(|(i, s)| (node.clone(), i, s)));
        }
    }
    for state in [
        ReplicaState::Complete,
        ReplicaState::Damaged,
        ReplicaState::Missing,
    ] {
        let which: Vec<(i64, String)> = all
            .iter()
            .filter(|(_, _, s)| *s == state)
            .map(|(n, i, _)| (*i, n.clone()))
            .collect();
        if !which.is_empty() {
            let _ = meta.catalog.mark_replicas(&which, state).await;
        }
    }
    let bad: Vec<(i64, String)> = all
        .iter()
        .filter(|(_, _, s)| *s != ReplicaState::Complete)
        .map(|(n, i, _)| (*i, n.clone()))
        .collect();
    if !bad.is_empty() {
        meta.event(format!("verification: {} bad replicas found", bad.len()));
    }
    let Some(origin) = repair.filter(|_| !bad.is_empty()) else {
        return;
    };
    // Repair: as many good copies as the file had replicas, from a good one.
    let bad_files: std::collections::HashSet<i64> = bad.iter().map(|(i, _)| *i).collect();
    let mut groups: BTreeMap<u32, Vec<FileState>> = BTreeMap::new();
    let ids: Vec<i64> = bad_files.iter().copied().collect();
    let reps = meta.catalog.replicas_of(&ids).await.unwrap_or_default();
    let node_list = meta.nodes();
    let up: std::collections::HashSet<&str> = node_list
        .iter()
        .filter(|n| n.node.up)
        .map(|n| n.node.name.as_str())
        .collect();
    for f in files
        .into_iter()
        .filter(|f| bad_files.contains(&f.inode.id))
    {
        let replicas = reps.get(&f.inode.id).cloned().unwrap_or_default();
        // Replicas on down nodes are not repaired here (the policy reconciler counts them
        // out when their node is lost); the damaged ones on live nodes are replaced.
        let copies = replicas
            .iter()
            .filter(|r| up.contains(r.node.as_str()))
            .count()
            .max(1) as u32;
        groups
            .entry(copies)
            .or_default()
            .push(FileState { replicas, ..f });
    }
    let progress = Arc::new(Progress::default());
    for (copies, fs) in groups {
        let plan = replication::plan(
            &fs,
            &node_list,
            // Each copy as private as its file arrived.
            &Want {
                copies,
                sites: vec![],
                private: false,
            },
            false,
        );
        for r in &plan.refused {
            findings.failures.lock().expect("failures").push(
                Error::unavailable(format!("{}: cannot repair: {}", r.path, r.reason))
                    .for_file(&r.path),
            );
        }
        replication::execute(
            meta.clone(),
            plan.tasks,
            ExecOptions {
                origin: origin.clone(),
                ..Default::default()
            },
            progress.clone(),
            cancel.clone(),
        )
        .await;
    }
    findings.repaired.store(
        progress.copies_made.load(Ordering::Relaxed),
        Ordering::Relaxed,
    );
    // Bad replicas that were not overwritten by a good copy go (their nodes delete them).
    let after = meta.catalog.replicas_of(&ids).await.unwrap_or_default();
    for (id, node) in bad {
        let still_bad = after.get(&id).is_some_and(|v| {
            v.iter()
                .any(|r| r.node == node && r.state != ReplicaState::Complete)
        });
        let good = after
            .get(&id)
            .map(|v| {
                v.iter()
                    .filter(|r| r.state == ReplicaState::Complete)
                    .count()
            })
            .unwrap_or(0);
        if still_bad && good > 0 {
            let _ = meta.catalog.remove_replica(id, &node).await;
        }
    }
    meta.event(format!(
        "verification: {} replicas repaired",
        findings.repaired.load(Ordering::Relaxed)
    ));
}

impl Meta {
    /// `haul verify` for `user`, with progress on `tx`.
    pub async fn verify(
        self: Arc<Self>,
        user: User,
        req: pb::VerifyRequest,
        tx: crate::grpc::ProgressSender<pb::VerifyProgress>,
    ) {
        let started = Instant::now();
        let prepared: crate::error::Result<Vec<FileState>> = async {
            let paths = self.named_paths(&user, &req.paths, req.recursive).await?;
            let mut files = Vec::new();
            for p in &paths {
                files.extend(self.catalog.files_below(p).await?);
            }
            files.retain(|(_, i)| perm::allows(&user, i, Access::Read));
            let ids: Vec<i64> = files.iter().map(|(_, i)| i.id).collect();
            let mut reps = self.catalog.replicas_of(&ids).await?;
            Ok(files
                .into_iter()
                .map(|(path, inode)| FileState {
                    path,
                    replicas: reps.remove(&inode.id).unwrap_or_default(),
                    inode,
                })
                .collect::<Vec<_>>())
        }
        .await;
        let files = match prepared {
            Ok(f) => f,
            Err(e) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
        };
        let findings = Arc::new(Findings {
            files: files.len() as u64,
            replicas: files.iter().map(|f| f.replicas.len() as u64).sum(),
            ..Default::default()
        });
        let cancel = CancellationToken::new();
        let run = tokio::spawn(verify_files(
            self.clone(),
            files,
            req.repair
                .then(|| replication::Origin::new("repair", &user.name)),
            findings.clone(),
            cancel.clone(),
        ));
        tokio::pin!(run);
        let snapshot = |finished: bool| pb::VerifyProgress {
            files: findings.files,
            replicas: findings.replicas,
            checked: findings.checked.load(Ordering::Relaxed),
            bytes_checked: findings.bytes.load(Ordering::Relaxed),
            damaged: findings.damaged.lock().expect("damaged").clone(),
            repaired: findings.repaired.load(Ordering::Relaxed),
            finished,
            seconds: started.elapsed().as_secs_f64(),
            failures: findings.failures.lock().expect("failures").clone(),
        };
        if !crate::grpc::stream_progress(&mut run, &tx, &cancel, &snapshot).await {
            return;
        }
        let _ = tx.send(Ok(snapshot(true))).await;
    }
}

/// The periodic scrub: verify and repair everything, every `every`.
pub async fn scrub(meta: Arc<Meta>, every: Duration, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.cancelled() => return,
        }
        let Ok(files) = meta.catalog.files_below("/").await else {
            continue;
        };
        let ids: Vec<i64> = files.iter().map(|(_, i)| i.id).collect();
        let Ok(mut reps) = meta.catalog.replicas_of(&ids).await else {
            continue;
        };
        let states: Vec<FileState> = files
            .into_iter()
            .map(|(path, inode)| FileState {
                path,
                replicas: reps.remove(&inode.id).unwrap_or_default(),
                inode,
            })
            .collect();
        meta.event(format!("scrub: verifying {} files", states.len()));
        let findings = Arc::new(Findings::default());
        verify_files(
            meta.clone(),
            states,
            Some(replication::Origin::new("repair", "system")),
            findings.clone(),
            stop.clone(),
        )
        .await;
        meta.event(format!(
            "scrub: {} replicas checked, {} bad, {} repaired",
            findings.checked.load(Ordering::Relaxed),
            findings.damaged.lock().expect("damaged").len(),
            findings.repaired.load(Ordering::Relaxed)
        ));
    }
}
/// Has a storage node recompute the checksums of `files` where they are (`Verify`,
/// [`wire::node`]).
async fn verify_on_node(
    peer: &Peer,
    files: Vec<ListedFile>,
    grant: Option<SignedGrant>,
    tls: Option<&ClientTls>,
) -> Result<Vec<VerifyResult>, TransferError> {
    let mut ch = ServiceChannel::open(peer, tls).await?;
    ch.send(NodeRequest::Verify { files, grant }.encode())
        .await?;
    let answer = ch.recv_as(NodeResponse::decode).await?;
    ch.close().await;
    match answer {
        NodeResponse::Verified(r) => Ok(r),
        other => Err(TransferError::protocol(format!(
            "unexpected answer to a verification: {other:?}"
        ))),
    }
}
