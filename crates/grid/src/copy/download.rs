//! Download: grid files to local ones, or (`to_endpoint`) to a standalone endpoint, third
//! party: the nodes push the files straight to it. Each round sends every node the files it is
//! to read from it (the replica the metadata server chose first); a file whose node fails, or
//! whose replica turns out damaged, moves to its next replica and resumes there in the next
//! round.

use super::rounds::{Planned, Rounds, Runner, SessionResult, Tally, run_rounds};
use super::{Cap, GridOptions, ReadFile, SESSION_FILES, catalog_agrees, open_source, write_empty};
use crate::client::MetaClient;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, OnceLock};
use transfer::TransferError;
use transfer::client::{Attempt, AttemptContext, CopyReport, Peer, SinkRequest, SourceRequest};
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
    let (todo, empty) = sort_files(files, &mut tally, &ctx.counters);
    // No node holds an empty file.
    for f in empty {
        match write_empty(&dest.map(&f.rel), &f.source) {
            Ok(()) => tally.ok(&f.source.path, None, 0, &[], &ctx.events),
            Err(e) => tally.fail(&f.source.path, e),
        }
    }
    let to = local.display().to_string();
    Download::new(meta, opts, Sink::Local(Arc::new(dest)), grants, &ctx)
        .read(src, to, todo, tally, ctx)
        .await
}

/// Counts a grid source's `files` in `tally` and sorts them: those that cannot be read are
/// failed, the empty ones (which have no replica) come back apart from those to read.
fn sort_files(
    files: Vec<ReadFile>,
    tally: &mut Tally,
    counters: &Arc<transfer::progress::Counters>,
) -> (Vec<ReadFile>, Vec<ReadFile>) {
    tally.count(
        files.len() as u64,
        files.iter().map(|f| f.source.size).sum(),
        counters,
    );
    let (mut todo, mut empty) = (Vec::new(), Vec::new());
    for f in files {
        if let Some(e) = f.unreadable() {
            tally.fail(&f.source.path, e);
        } else if f.source.size == 0 {
            empty.push(f);
        } else {
            todo.push(f);
        }
    }
    (todo, empty)
}

/// Copies the grid path `src` to `dest` on the standalone endpoint `peer`, third party: each
/// node holding a replica pushes its files there. The endpoint must trust the grid's CA (the
/// client's certificate and the nodes' come from it) and map the user. Directories and empty
/// files, which no node holds, are sent from here first, in one session that also settles how
/// the endpoint names the copy (into an existing directory, or as a new name), so that the
/// nodes' sessions, in parallel, all name it the same way.
pub(super) async fn to_endpoint(
    meta: &MetaClient,
    src: &str,
    peer: &Peer,
    dest: &str,
    opts: &GridOptions,
    ctx: AttemptContext,
) -> Result<CopyReport, TransferError> {
    // The endpoint first: unreachable, refusing the user, or another grid's metadata server
    // is the copy's error, not its replicas' (which would otherwise be failed over in vain).
    transfer::client::probe(peer, opts.copy.tls.as_ref()).await?;
    let (files, dirs, grants, is_dir) = open_source(meta, src, opts, &[]).await?;
    let mut tally = Tally::new();
    let (todo, empty) = sort_files(files, &mut tally, &ctx.counters);
    let resolved = Arc::new(OnceLock::new());
    if is_dir || !empty.is_empty() {
        let outcomes = send_skeleton(
            src,
            is_dir,
            peer,
            dest,
            &dirs,
            &empty,
            &resolved,
            opts,
            &ctx.cancel,
        )
        .await?;
        for f in empty {
            match outcomes.get(&f.rel) {
                Some(Ok(())) => tally.ok(&f.source.path, None, 0, &[], &ctx.events),
                Some(Err(e)) => tally.fail(&f.source.path, e.clone()),
                None => tally.fail(
                    &f.source.path,
                    TransferError::connect(format!(
                        "{}: the endpoint did not confirm it",
                        f.source.path
                    )),
                ),
            }
        }
    }
    let to = format!("haul://{peer}/{}", dest.trim_start_matches('/'));
    let sink = Sink::Endpoint {
        peer: peer.clone(),
        dest: dest.to_string(),
        resolved,
    };
    Download::new(meta, opts, sink, grants, &ctx)
        .read(src, to, todo, tally, ctx)
        .await
}

/// Sends the source's directories and empty files (as a local tree of the same shape) to
/// `dest` on `peer` in one session; records how the endpoint resolved `dest` in `resolved`.
/// Returns each empty file's outcome by its name.
#[allow(clippy::too_many_arguments)]
async fn send_skeleton(
    src: &str,
    is_dir: bool,
    peer: &Peer,
    dest: &str,
    dirs: &[api::meta::Entry],
    empty: &[ReadFile],
    resolved: &Arc<OnceLock<bool>>,
    opts: &GridOptions,
    cancel: &tokio_util::sync::CancellationToken,
) -> Result<HashMap<String, Result<(), TransferError>>, TransferError> {
    let tmp = tempfile::tempdir()
        .map_err(|e| TransferError::local(format!("cannot make a temporary directory: {e}")))?;
    // Every name starts with the copy's top entry: the source's own name.
    let norm = super::normalize(src);
    let top = norm.rsplit('/').next().unwrap_or_default().to_string();
    if top.is_empty() {
        return Err(TransferError::usage(
            "copying the whole grid (/) to an endpoint: name a directory below it",
        ));
    }
    if is_dir {
        std::fs::create_dir_all(tmp.path().join(&top))
            .map_err(|e| TransferError::local(format!("cannot make a temporary directory: {e}")))?;
    }
    for d in dirs {
        std::fs::create_dir_all(tmp.path().join(&d.path))
            .map_err(|e| TransferError::local(format!("cannot make a temporary directory: {e}")))?;
    }
    for f in empty {
        write_empty(&tmp.path().join(&f.rel), &f.source)?;
    }
    let listing = transfer::client::enumerate_local(&tmp.path().join(&top), true).await?;
    let (etx, mut erx) = tokio::sync::mpsc::unbounded_channel();
    let ctx = AttemptContext {
        counters: Arc::new(transfer::progress::Counters::default()),
        events: etx,
        cancel: cancel.child_token(),
    };
    transfer::client::upload(
        listing.entries,
        peer,
        SinkRequest {
            dest: dest.to_string(),
            into_dir: None,
            resolved: Some(resolved.clone()),
            grant: None,
        },
        &opts.copy,
        opts.copy.session.clone(),
        ctx,
    )
    .await?;
    let mut out = HashMap::new();
    while let Ok(ev) = erx.try_recv() {
        match ev {
            transfer::progress::Event::FileDone { path, .. } => {
                out.insert(path, Ok(()));
            }
            transfer::progress::Event::FileFailed { path, error } => {
                out.insert(path, Err(error.into()));
            }
            _ => {}
        }
    }
    Ok(out)
}

/// Where the files go: this host's file system, or a standalone endpoint the nodes push them
/// to (with how it resolved the destination, fixed before the nodes' sessions start).
enum Sink {
    Local(Arc<Destination>),
    Endpoint {
        peer: Peer,
        dest: String,
        resolved: Arc<OnceLock<bool>>,
    },
}

struct Download<'a> {
    meta: &'a MetaClient,
    opts: &'a GridOptions,
    events: EventSender,
    sink: Sink,
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

impl<'a> Download<'a> {
    fn new(
        meta: &'a MetaClient,
        opts: &'a GridOptions,
        sink: Sink,
        grants: HashMap<String, Cap>,
        ctx: &AttemptContext,
    ) -> Self {
        Self {
            meta,
            opts,
            events: ctx.events.clone(),
            sink,
            grants,
            failed_nodes: HashSet::new(),
        }
    }

    /// Reads `todo` from the nodes holding their replicas into the sink, in rounds; `to` names
    /// the destination in the report.
    async fn read(
        mut self,
        src: &str,
        to: String,
        todo: Vec<ReadFile>,
        tally: Tally,
        ctx: AttemptContext,
    ) -> Result<CopyReport, TransferError> {
        let runner = Runner::new(ctx.counters, ctx.events, ctx.cancel, self.opts);
        let from = format!("haul://{}{}", self.meta.addr, src);
        run_rounds(&mut self, todo, &runner, tally, (from, to)).await
    }
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
        let source = SourceRequest {
            files: listed,
            grant,
            ..Default::default()
        };
        match &self.sink {
            Sink::Local(dest) => {
                transfer::client::download(
                    &job.peer,
                    source,
                    Arc::new(Root::Ambient),
                    dest.clone(),
                    copy,
                    session,
                    ctx,
                )
                .await
            }
            Sink::Endpoint {
                peer,
                dest,
                resolved,
            } => {
                transfer::client::third_party(
                    &job.peer,
                    source,
                    peer,
                    SinkRequest {
                        dest: dest.clone(),
                        into_dir: resolved.get().copied(),
                        resolved: Some(resolved.clone()),
                        grant: None,
                    },
                    copy,
                    session,
                    ctx,
                )
                .await
            }
        }
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
                    // (At an endpoint the copy stays: its next attempt overwrites it.)
                    if let Sink::Local(dest) = &self.sink {
                        let _ = std::fs::remove_file(dest.map(&f.rel));
                    }
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
