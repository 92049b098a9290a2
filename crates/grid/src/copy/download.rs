//! Download: grid files to local ones. Each round sends every node the files it is to read
//! from it (the replica the metadata server chose first); a file whose node fails, or whose
//! replica turns out damaged, moves to its next replica and resumes there in the next round.

use super::rounds::{Planned, Rounds, Runner, SessionResult, Tally, run_rounds};
use super::{Cap, GridOptions, ReadFile, SESSION_FILES, catalog_agrees, open_source, write_empty};
use crate::client::MetaClient;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use transfer::TransferError;
use transfer::client::{Attempt, AttemptContext, CopyReport, Peer, SourceRequest};
use transfer::progress::EventSender;
use transfer::store::{Destination, Root};
use wire::control::{ListedFile, Protect};
use wire::error::ErrorKind as K;

/// Copies the grid path `src` to `local`.
pub(super) async fn download(
    meta: &MetaClient,
    src: &str,
    local: &Path,
    opts: &GridOptions,
    ctx: AttemptContext,
) -> Result<CopyReport, TransferError> {
    let AttemptContext {
        counters,
        events,
        cancel,
    } = ctx;
    let (files, dirs, grants, is_dir) = open_source(meta, src, opts, &[]).await?;
    let wants_dir = local.to_string_lossy().ends_with('/');
    let dest =
        Destination::resolve(&Root::Ambient, local, wants_dir).map_err(TransferError::from)?;
    if is_dir && !dest.into_dir {
        std::fs::create_dir_all(&dest.base).map_err(|e| {
            TransferError::not_writable(format!("cannot create {}: {e}", dest.base.display()))
        })?;
    }
    for d in &dirs {
        let p = dest.map(&d.path);
        std::fs::create_dir_all(&p).map_err(|e| {
            TransferError::not_writable(format!("cannot create {}: {e}", p.display()))
        })?;
    }
    let mut tally = Tally::new();
    tally.count(
        files.len() as u64,
        files.iter().map(|f| f.source.size).sum(),
        &counters,
    );
    let mut todo: Vec<ReadFile> = Vec::new();
    for f in files {
        if let Some(e) = f.unreadable() {
            tally.fail(&f.source.path, e);
        } else if f.source.size == 0 {
            match write_empty(&dest.map(&f.rel), &f.source) {
                Ok(()) => tally.ok(&f.source.path, None, 0, &[], &events),
                Err(e) => tally.fail(&f.source.path, e),
            }
        } else {
            todo.push(f);
        }
    }
    let runner = Runner::new(counters.clone(), events.clone(), cancel, opts);
    let mut plan = Download {
        meta,
        opts,
        events: events.clone(),
        dest: Arc::new(dest),
        grants,
        failed_nodes: HashSet::new(),
    };
    run_rounds(
        &mut plan,
        todo,
        &runner,
        tally,
        (
            format!("haul://{}{}", meta.addr, src),
            local.display().to_string(),
        ),
    )
    .await
}

struct Download<'a> {
    meta: &'a MetaClient,
    opts: &'a GridOptions,
    events: EventSender,
    dest: Arc<Destination>,
    /// Read capabilities, by node.
    grants: HashMap<String, Cap>,
    /// Nodes that failed or refused: no file is read from them again.
    failed_nodes: HashSet<String>,
}

/// Files read from one node in one session.
struct Job {
    peer: Peer,
    grant: Option<Cap>,
    chunk: Vec<ReadFile>,
    /// Partial files of an earlier round (or of an earlier command) are resumed.
    resume: bool,
}

impl Rounds for Download<'_> {
    type File = ReadFile;
    type Job = Job;

    fn opts(&self) -> &GridOptions {
        self.opts
    }

    /// Failing over between replicas takes rounds of its own.
    fn max_rounds(&self) -> u32 {
        self.opts.copy.retry.max_attempts.max(1) + 4
    }

    async fn plan(
        &mut self,
        round: u32,
        todo: Vec<ReadFile>,
        _tally: &mut Tally,
    ) -> Result<Vec<Planned<Job>>, TransferError> {
        let mut by_node: BTreeMap<String, Vec<ReadFile>> = BTreeMap::new();
        for f in todo {
            let node = f.node().expect("has a replica").node.clone();
            by_node.entry(node).or_default().push(f);
        }
        let mut jobs = Vec::new();
        for (node, list) in by_node {
            let address = list[0].node().expect("replica").address.clone();
            let peer = Peer::parse(&address)?;
            let grant = self.grants.get(&node).cloned();
            for chunk in list.chunks(SESSION_FILES) {
                jobs.push(Planned {
                    node: node.clone(),
                    names: chunk.iter().map(|f| f.rel.clone()).collect(),
                    job: Job {
                        peer: peer.clone(),
                        grant: grant.clone(),
                        chunk: chunk.to_vec(),
                        resume: round > 1 || self.opts.copy.session.resume,
                    },
                });
            }
        }
        Ok(jobs)
    }

    async fn run(
        &self,
        node: &str,
        job: &Job,
        ctx: AttemptContext,
    ) -> Result<Attempt, TransferError> {
        let ids: Vec<i64> = job.chunk.iter().map(|f| f.source.id).collect();
        let grant = match &job.grant {
            Some(g) => g.fresh(self.meta, node, "read", ids).await?,
            None => None,
        };
        let copy = &self.opts.copy;
        let mut session = copy.session.clone();
        session.resume = job.resume;
        // Files that arrived privately leave privately.
        if job.chunk.iter().any(|f| f.source.private) {
            session.protect = Protect::Private;
        }
        let listed: Vec<ListedFile> = job.chunk.iter().map(|f| f.listed(f.rel.clone())).collect();
        transfer::client::download(
            &job.peer,
            SourceRequest {
                files: listed,
                grant,
                ..Default::default()
            },
            Arc::new(Root::Ambient),
            self.dest.clone(),
            copy,
            session,
            ctx,
        )
        .await
    }

    fn settle(
        &mut self,
        round: u32,
        job: Job,
        r: SessionResult,
        tally: &mut Tally,
        todo: &mut Vec<ReadFile>,
    ) {
        // Unreachable, or refusing this client: read from the other replicas.
        let node_failed = r.node_unreachable()
            || r.error().is_some_and(|e| {
                matches!(
                    e.kind(),
                    K::NotFound | K::PermissionDenied | K::Authentication | K::Unmapped
                )
            });
        if node_failed && self.failed_nodes.insert(r.node.clone()) {
            let why = r.error().map(|e| e.to_string()).unwrap_or_default();
            tally.fail_over(
                &self.events,
                round,
                format!(
                    "node {} failed ({why}); continuing from other replicas",
                    r.node
                ),
            );
        }
        for mut f in job.chunk {
            if let Some((size, digests)) = r.done.get(&f.rel) {
                if catalog_agrees(&f.expect, digests) {
                    tally.ok(&f.source.path, Some(&r.node), *size, digests, &self.events);
                } else {
                    let _ = std::fs::remove_file(self.dest.map(&f.rel));
                    tally.fail(
                        &f.source.path,
                        TransferError::integrity(format!(
                            "{}: received data does not match the catalog checksum",
                            f.source.path
                        )),
                    );
                }
                continue;
            }
            let err = r.failed.get(&f.rel).cloned().unwrap_or_else(|| {
                TransferError::connect(format!("node {} did not send it", r.node))
            });
            // A damaged replica or a failed node: the next replica.
            let switch = node_failed
                || matches!(
                    err.kind(),
                    K::Integrity
                        | K::SourceDamaged
                        | K::NotFound
                        | K::Connect
                        | K::Unavailable
                        | K::Stalled
                );
            let mut avoid = self.failed_nodes.clone();
            avoid.insert(r.node.clone());
            if switch
                && f.fail_over(if node_failed {
                    &self.failed_nodes
                } else {
                    &avoid
                })
            {
                tracing::info!(path = %f.source.path, from = %r.node, to = %f.node().map(|n| n.node.as_str()).unwrap_or(""), "reading from another replica");
                todo.push(f);
            } else if !switch && err.retryable() {
                todo.push(f);
            } else {
                tally.fail(
                    &f.source.path,
                    match err.kind() {
                        // Refused (e.g. a renewal after a chmod): that is the reason.
                        K::PermissionDenied | K::Authentication | K::Unmapped if switch => {
                            let m = format!("{}: {err}", f.source.path);
                            err.with_message(m)
                        }
                        _ if switch => TransferError::connect(format!(
                            "{}: no healthy replica left ({err})",
                            f.source.path
                        )),
                        _ => err,
                    },
                );
            }
        }
    }

    fn give_up(&mut self, rounds: u32, left: Vec<ReadFile>, tally: &mut Tally) {
        for f in left {
            tally.fail(
                &f.source.path,
                TransferError::connect(format!("{}: gave up after {rounds} rounds", f.source.path)),
            );
        }
    }
}
