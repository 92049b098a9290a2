//! Upload: local files, or a standalone endpoint's, into the grid. Each round asks the
//! metadata server to place the files still to send (avoiding nodes that failed or filled up),
//! sends each node its files with a write capability, and aborts what did not arrive: nothing
//! is visible in the namespace before a node has verified it. From an endpoint the copy is
//! third party: the endpoint lists its tree first (`Request::List`), then pushes each node its
//! files (a file list naming each by its path there and its new id), and the data never passes
//! through the client.

use super::rounds::{Planned, Rounds, Runner, SessionResult, Tally, run_rounds};
use super::{Cap, GridOptions, grid_destination, map_grid, place, renamed};
use crate::client::MetaClient;
use api::meta as pb;
use std::collections::HashMap;
use std::path::Path;
use transfer::TransferError;
use transfer::client::{Attempt, AttemptContext, CopyReport, Peer, SinkRequest, SourceRequest};
use transfer::progress::EventSender;
use transfer::store::SourceEntry;
use wire::control::ListedFile;
use wire::control::Protect;
use wire::data::EntryKind;

/// Where an upload's files come from.
pub(super) enum Origin<'a> {
    Local(&'a Path),
    /// A standalone endpoint and the path there.
    Endpoint {
        peer: &'a Peer,
        path: &'a str,
    },
}

impl Origin<'_> {
    fn shown(&self) -> String {
        match self {
            Origin::Local(p) => p.display().to_string(),
            Origin::Endpoint { peer, path } => format!(
                "haul://{}/{}",
                transfer::conn::format_addr(&peer.host, peer.port),
                path.trim_start_matches('/')
            ),
        }
    }

    /// Entries to send (locators where the origin reads them) and those it cannot send.
    async fn list(
        &self,
        opts: &GridOptions,
    ) -> Result<(Vec<SourceEntry>, Vec<(String, wire::error::ErrorInfo)>), TransferError> {
        match self {
            Origin::Local(l) => {
                let mut listing = transfer::client::enumerate_local(l, opts.copy.recursive).await?;
                if let (Some(k), [e]) = (&opts.source_crcs, listing.entries.as_mut_slice())
                    && e.kind == EntryKind::File
                {
                    // Grown or cut since its writer's record: bytes it never wrote are there.
                    if e.size != k.len() {
                        return Err(TransferError::integrity(format!(
                            "{}: changed since it was written ({} bytes written, {} there now)",
                            l.display(),
                            k.len(),
                            e.size
                        )));
                    }
                    e.known_crcs = Some(k.clone());
                }
                Ok((listing.entries, listing.unsendable))
            }
            Origin::Endpoint { peer, path } => {
                let l =
                    transfer::client::list(peer, path, opts.copy.recursive, opts.copy.tls.as_ref())
                        .await?;
                // Entries are named from the source's base name down; the endpoint reads them
                // from the source's parent.
                let trimmed = path.trim_matches('/');
                let parent = trimmed.rsplit_once('/').map(|(p, _)| p).unwrap_or("");
                let entries = l
                    .entries
                    .into_iter()
                    .map(|e| SourceEntry {
                        locator: if parent.is_empty() {
                            e.rel.clone().into()
                        } else {
                            format!("{parent}/{}", e.rel).into()
                        },
                        kind: if e.is_dir {
                            EntryKind::Dir
                        } else {
                            EntryKind::File
                        },
                        rel: e.rel,
                        size: e.size,
                        mode: e.mode,
                        mtime: e.mtime,
                        expect: Vec::new(),
                        known_crcs: None,
                    })
                    .collect();
                Ok((entries, l.unsendable))
            }
        }
    }
}

/// Copies `local` to the grid path `dest`.
pub(super) async fn upload(
    meta: &MetaClient,
    local: &Path,
    dest: &str,
    opts: &GridOptions,
    ctx: AttemptContext,
) -> Result<CopyReport, TransferError> {
    upload_from(meta, Origin::Local(local), dest, opts, ctx).await
}

/// Copies what `origin` holds to the grid path `dest`.
pub(super) async fn upload_from(
    meta: &MetaClient,
    origin: Origin<'_>,
    dest: &str,
    opts: &GridOptions,
    ctx: AttemptContext,
) -> Result<CopyReport, TransferError> {
    let AttemptContext {
        counters,
        events,
        cancel,
    } = ctx;
    let (entries, unsendable_list) = origin.list(opts).await?;
    let source_is_dir = entries.first().is_some_and(|e| e.kind == EntryKind::Dir);
    let (base, into_dir) = if opts.dest_is_name && !source_is_dir {
        (super::normalize(dest), false)
    } else {
        grid_destination(meta, dest, source_is_dir).await?
    };
    let mut tally = Tally::new();
    let unsendable = unsendable_list.len() as u64;
    for (rel, error) in unsendable_list {
        tally.fail(&map_grid(&base, into_dir, &rel), error.into());
    }
    // Directories first, parents before children (enumeration order).
    for e in entries.iter().filter(|e| e.kind == EntryKind::Dir) {
        let p = map_grid(&base, into_dir, &e.rel);
        meta.mkdir(&p, e.mode & 0o7777, true).await?;
    }
    let files: Vec<(String, SourceEntry)> = entries
        .into_iter()
        .filter(|e| e.kind == EntryKind::File)
        .map(|e| (map_grid(&base, into_dir, &e.rel), e))
        .collect();
    tally.count(
        files.len() as u64 + unsendable,
        files.iter().map(|(_, e)| e.size).sum(),
        &counters,
    );
    let runner = Runner::new(counters.clone(), events.clone(), cancel, opts);
    let todo: Vec<String> = files.iter().map(|(p, _)| p.clone()).collect();
    let shown = origin.shown();
    let mut plan = Upload {
        meta,
        opts,
        origin: &origin,
        events: events.clone(),
        by_path: files.into_iter().collect(),
        exclude: Vec::new(),
        abort: Vec::new(),
    };
    run_rounds(
        &mut plan,
        todo,
        &runner,
        tally,
        (shown, format!("haul://{}{}", meta.addr, dest)),
    )
    .await
}

struct Upload<'a> {
    meta: &'a MetaClient,
    opts: &'a GridOptions,
    origin: &'a Origin<'a>,
    events: EventSender,
    /// Every file to send, by its grid path.
    by_path: HashMap<String, SourceEntry>,
    /// Nodes that failed or filled up: no more files go there.
    exclude: Vec<String>,
    /// Files created in the namespace this round whose data did not arrive.
    abort: Vec<i64>,
}

/// One node's share of a round: its files, named by their new ids.
struct Job {
    peer: Peer,
    grant: Cap,
    ids: Vec<i64>,
    list: Vec<SourceEntry>,
    /// A file's id (as the session names it) → its grid path and id.
    names: HashMap<String, (String, i64)>,
}

impl Rounds for Upload<'_> {
    type File = String;
    type Job = Job;

    fn opts(&self) -> &GridOptions {
        self.opts
    }

    async fn plan(
        &mut self,
        _round: u32,
        todo: Vec<String>,
        tally: &mut Tally,
    ) -> Result<Vec<Planned<Job>>, TransferError> {
        let files = todo
            .iter()
            .map(|p| {
                let e = &self.by_path[p];
                pb::NewFile {
                    path: p.clone(),
                    size: e.size,
                    mode: e.mode & 0o7777,
                    mtime_ns: e.mtime.unix_ns(),
                    // Sent privately: its copies will travel privately too.
                    private: self.opts.copy.session.protect == Protect::Private,
                }
            })
            .collect();
        let placements = place(
            self.meta,
            self.opts,
            files,
            &self.exclude,
            tally,
            &self.events,
        )
        .await?;
        let mut jobs = Vec::new();
        for pl in placements {
            let peer = Peer::parse(&pl.address)?;
            let mut names = HashMap::new();
            let mut list = Vec::new();
            for (id, path) in pl.ids.iter().zip(&pl.paths) {
                let mut e = self.by_path[path].clone();
                e.rel = id.to_string();
                names.insert(id.to_string(), (path.clone(), *id));
                list.push(e);
            }
            jobs.push(Planned {
                node: pl.node,
                names: names.keys().cloned().collect(),
                job: Job {
                    peer,
                    grant: Cap::of(&pl.capability),
                    ids: pl.ids,
                    list,
                    names,
                },
            });
        }
        Ok(jobs)
    }

    async fn run(
        &self,
        node: &str,
        job: &Job,
        ctx: AttemptContext,
    ) -> Result<Attempt, TransferError> {
        let grant = job
            .grant
            .fresh(self.meta, node, "write", job.ids.clone())
            .await?;
        let copy = &self.opts.copy;
        let sink = SinkRequest {
            grant,
            ..Default::default()
        };
        match self.origin {
            Origin::Local(_) => {
                transfer::client::upload(
                    job.list.clone(),
                    &job.peer,
                    sink,
                    copy,
                    copy.session.clone(),
                    ctx,
                )
                .await
            }
            Origin::Endpoint { peer, .. } => {
                let files = job
                    .list
                    .iter()
                    .map(|e| ListedFile {
                        locator: e.locator.to_string_lossy().into_owned(),
                        name: e.rel.clone(),
                        size: e.size,
                        mode: e.mode,
                        mtime: e.mtime,
                        expect: Vec::new(),
                    })
                    .collect();
                transfer::client::third_party(
                    peer,
                    SourceRequest {
                        files,
                        ..Default::default()
                    },
                    &job.peer,
                    sink,
                    copy,
                    copy.session.clone(),
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
        todo: &mut Vec<String>,
    ) {
        for (name, (size, digests)) in &r.done {
            if let Some((path, _)) = job.names.get(name) {
                tally.ok(path, Some(&r.node), *size, digests, &self.events);
            }
        }
        let node_failed = r.node_unreachable();
        if node_failed && !self.exclude.contains(&r.node) {
            let why = r.error().map(|e| e.to_string()).unwrap_or_default();
            tracing::warn!(node = %r.node, "storage node failed during upload ({why}); placing its files elsewhere");
            tally.fail_over(
                &self.events,
                round,
                format!(
                    "node {} failed ({why}); its files go to another node",
                    r.node
                ),
            );
            self.exclude.push(r.node.clone());
        }
        // A node whose disk filled (the metadata server learns of it only with the next
        // heartbeat) gets no more of this upload: its files go to nodes with room.
        let full = !r.no_space.is_empty();
        if full && !node_failed && !self.exclude.contains(&r.node) {
            tracing::warn!(node = %r.node, "storage node has no space left; placing its files elsewhere");
            tally.fail_over(
                &self.events,
                round,
                format!(
                    "node {} has no space left; its files go to another node",
                    r.node
                ),
            );
            self.exclude.push(r.node.clone());
        }
        for (name, e) in r.failed {
            let Some((path, id)) = job.names.get(&name) else {
                continue;
            };
            // The node names the file by its id: name it by its grid path.
            let e = renamed(e, &format!("file {id}"), path);
            self.abort.push(*id);
            if e.retryable() || node_failed || r.no_space.contains(&name) {
                todo.push(path.clone());
            }
            tally.fail(path, e);
        }
    }

    async fn end_round(&mut self) {
        // Unfinished uploads leave nothing in the namespace.
        let _ = self.meta.abort_files(std::mem::take(&mut self.abort)).await;
    }
}
