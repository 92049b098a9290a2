//! A copy within one grid: node to node, third-party (the data never passes through this
//! host). Each round places the files still to copy (avoiding destinations that failed) and
//! pairs each destination node with the nodes its files are read from; a failed pair is tried
//! again from another replica, or to another node.

use super::rounds::{Planned, Rounds, Runner, SessionResult, Tally, run_rounds};
use super::{Cap, GridOptions, ReadFile, grid_destination, map_grid, open_source, place, renamed};
use crate::client::MetaClient;
use api::meta as pb;
use std::collections::{BTreeMap, HashMap, HashSet};
use transfer::TransferError;
use transfer::client::{Attempt, AttemptContext, CopyReport, Peer, SinkRequest, SourceRequest};
use transfer::progress::EventSender;
use wire::control::{ListedFile, Protect};

/// Copies the grid path `src` to the grid path `dst`.
pub(super) async fn within(
    meta: &MetaClient,
    src: &str,
    dst: &str,
    opts: &GridOptions,
    ctx: AttemptContext,
) -> Result<CopyReport, TransferError> {
    let AttemptContext {
        counters,
        events,
        cancel,
    } = ctx;
    let (files, dirs, grants, is_dir) = open_source(meta, src, opts, &[]).await?;
    let (base, into_dir) = grid_destination(meta, dst, is_dir).await?;
    if is_dir && !into_dir {
        meta.mkdir(&base, 0o755, false).await?;
    }
    for d in &dirs {
        meta.mkdir(&map_grid(&base, into_dir, &d.path), d.mode & 0o7777, true)
            .await?;
    }
    let mut tally = Tally::new();
    tally.count(
        files.len() as u64,
        files.iter().map(|f| f.source.size).sum(),
        &counters,
    );
    let runner = Runner::new(counters.clone(), events.clone(), cancel, opts);
    let mut todo: Vec<(String, ReadFile)> = Vec::new();
    for f in files {
        let target = map_grid(&base, into_dir, &f.rel);
        if let Some(e) = f.unreadable() {
            tally.fail(&f.source.path, e);
        } else {
            todo.push((target, f));
        }
    }
    let mut plan = Within {
        meta,
        opts,
        events: events.clone(),
        grants,
        exclude: Vec::new(),
        failed_sources: HashSet::new(),
        abort: Vec::new(),
    };
    run_rounds(
        &mut plan,
        todo,
        &runner,
        tally,
        (
            format!("haul://{}{}", meta.addr, src),
            format!("haul://{}{}", meta.addr, dst),
        ),
    )
    .await
}

struct Within<'a> {
    meta: &'a MetaClient,
    opts: &'a GridOptions,
    events: EventSender,
    /// Read capabilities, by node.
    grants: HashMap<String, Cap>,
    /// Destinations that failed: no more files are placed there.
    exclude: Vec<String>,
    /// Sources that failed: files move to their next replica.
    failed_sources: HashSet<String>,
    /// Files created in the namespace this round whose data did not arrive.
    abort: Vec<i64>,
}

/// Files copied from one node to another in one session: (new id, grid path, source).
struct Job {
    src_node: String,
    from: Peer,
    dst_node: String,
    to: Peer,
    write: Cap,
    list: Vec<(i64, String, ReadFile)>,
}

impl Rounds for Within<'_> {
    /// A grid path to create and the file it copies.
    type File = (String, ReadFile);
    type Job = Job;

    fn opts(&self) -> &GridOptions {
        self.opts
    }

    async fn plan(
        &mut self,
        _round: u32,
        todo: Vec<(String, ReadFile)>,
        tally: &mut Tally,
    ) -> Result<Vec<Planned<Job>>, TransferError> {
        let by_target: HashMap<String, ReadFile> = todo.iter().cloned().collect();
        let files = todo
            .iter()
            .map(|(t, f)| pb::NewFile {
                path: t.clone(),
                size: f.source.size,
                mode: f.source.mode,
                mtime_ns: f.source.mtime_ns,
                private: f.source.private || self.opts.copy.session.protect == Protect::Private,
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
            let to = Peer::parse(&pl.address)?;
            let write = Cap::of(&pl.capability);
            // Group this node's files by the node each is read from.
            let mut by_source: BTreeMap<String, Vec<(i64, String, ReadFile)>> = BTreeMap::new();
            for (id, path) in pl.ids.iter().zip(&pl.paths) {
                let f = by_target[path].clone();
                let node = f.node().expect("replica").node.clone();
                by_source
                    .entry(node)
                    .or_default()
                    .push((*id, path.clone(), f));
            }
            for (src_node, list) in by_source {
                let from = Peer::parse(&list[0].2.node().expect("replica").address)?;
                jobs.push(Planned {
                    node: format!("{src_node}->{}", pl.node),
                    names: list.iter().map(|(id, _, _)| id.to_string()).collect(),
                    job: Job {
                        src_node,
                        from,
                        dst_node: pl.node.clone(),
                        to: to.clone(),
                        write: write.clone(),
                        list,
                    },
                });
            }
        }
        Ok(jobs)
    }

    /// `_node` is the pair `from->to`; the job names both ends.
    async fn run(
        &self,
        _node: &str,
        job: &Job,
        ctx: AttemptContext,
    ) -> Result<Attempt, TransferError> {
        let old_ids: Vec<i64> = job.list.iter().map(|(_, _, f)| f.source.id).collect();
        let new_ids: Vec<i64> = job.list.iter().map(|(id, _, _)| *id).collect();
        let read = match self.grants.get(&job.src_node) {
            Some(g) => g.fresh(self.meta, &job.src_node, "read", old_ids).await?,
            None => None,
        };
        let write = job
            .write
            .fresh(self.meta, &job.dst_node, "write", new_ids)
            .await?;
        let copy = &self.opts.copy;
        let mut session = copy.session.clone();
        // Files that arrived privately leave privately.
        if job.list.iter().any(|(_, _, f)| f.source.private) {
            session.protect = Protect::Private;
        }
        let listed: Vec<ListedFile> = job
            .list
            .iter()
            .map(|(id, _, f)| f.listed(id.to_string()))
            .collect();
        transfer::client::third_party(
            &job.from,
            SourceRequest {
                files: listed,
                grant: read,
                ..Default::default()
            },
            &job.to,
            SinkRequest {
                grant: write,
                ..Default::default()
            },
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
        todo: &mut Vec<(String, ReadFile)>,
    ) {
        let Job {
            src_node,
            dst_node,
            list,
            ..
        } = job;
        let failed = r.error().is_some();
        if let Some(e) = r.error() {
            let why = format!("copy {src_node} -> {dst_node} failed ({e})");
            if r.node_unreachable() {
                tally.fail_over(&self.events, round, why);
            } else {
                tally.retry_because(why);
            }
            if r.node_unreachable() {
                // Which end failed is not known: avoid both next time.
                self.failed_sources.insert(src_node.clone());
                if !self.exclude.contains(&dst_node) {
                    self.exclude.push(dst_node.clone());
                }
            }
        }
        for (id, path, mut f) in list {
            if let Some((size, digests)) = r.done.get(&id.to_string()) {
                tally.ok(&path, Some(&dst_node), *size, digests, &self.events);
                continue;
            }
            self.abort.push(id);
            let err = r
                .failed
                .get(&id.to_string())
                .cloned()
                .map(|e| renamed(e, &format!("file {id}"), &path))
                .unwrap_or_else(|| TransferError::connect(format!("{path}: not copied")));
            if failed
                && self.failed_sources.contains(&src_node)
                && !f.fail_over(&self.failed_sources)
            {
                // No other source; try the same again (the destination may have been
                // the one that failed).
                f.replica = 0;
            }
            if err.retryable() || failed {
                todo.push((path.clone(), f));
            }
            tally.fail(&path, err);
        }
    }

    async fn end_round(&mut self) {
        // Unfinished copies leave nothing in the namespace.
        let _ = self.meta.abort_files(std::mem::take(&mut self.abort)).await;
    }
}
