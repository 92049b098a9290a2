//! `haul cp` with the grid on one or both sides. The metadata server decides where files go
//! and which replicas are read, and signs the capabilities; the data moves directly between
//! this host and storage nodes (upload, download), or between nodes (a copy within the grid),
//! with the data-plane engine, several nodes at once.
//!
//! Failures: a node that fails during a download is replaced by the next replica of each file
//! it had not finished, resuming partial files, with one log line; an upload to a node that
//! fails is placed again on another node. Nothing is visible in the namespace before a node
//! has verified it.

use crate::client::{MetaClient, from_file_error};
use api::meta as pb;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use transfer::TransferError;
use transfer::client::{
    Attempt, AttemptContext, CopyOptions, CopyReport, FileReport, Location, Peer, SinkRequest,
    SourceRequest,
};
use transfer::progress::{Counters, Event, EventSender};
use transfer::store::{Destination, Root, SourceEntry};
use wire::checksum::{Digest, parse_digests};
use wire::control::{ListedFile, Protect};
use wire::data::{EntryKind, Timestamp};
use wire::error::ErrorKind as K;
use wire::grant::SignedGrant;

/// Files per data session at most (one control message lists them all).
pub const SESSION_FILES: usize = 2000;

/// How to copy to, from or within a grid.
#[derive(Clone)]
pub struct GridOptions {
    pub copy: CopyOptions,
    /// This client's site: new files go to its nodes, reads prefer its replicas.
    pub site: Option<String>,
    /// Replace existing files (cp semantics).
    pub overwrite: bool,
    /// Data sessions at once (each with its own node).
    pub max_sessions: usize,
}

pub(crate) fn cap(c: &Option<pb::Capability>) -> Option<SignedGrant> {
    c.as_ref().map(|c| SignedGrant {
        token: c.token.clone(),
        mac: c.mac.clone(),
    })
}

/// A capability as received, and when to ask for a new one: capabilities are short-lived (5
/// minutes by default), and a copy can outlast one (sessions that start late, retries).
#[derive(Clone)]
pub(crate) struct Cap {
    grant: Option<SignedGrant>,
    /// On this host's clock: a minute before it ends (half its life for short ones).
    renew_at: Option<Instant>,
}

impl Cap {
    pub(crate) fn of(c: &Option<pb::Capability>) -> Self {
        Self::received(c, Instant::now())
    }

    fn received(c: &Option<pb::Capability>, at: Instant) -> Self {
        let renew_at = c.as_ref().filter(|c| c.ttl_ms > 0).map(|c| {
            let ttl = Duration::from_millis(c.ttl_ms);
            at + ttl - (ttl / 2).min(Duration::from_secs(60))
        });
        Self {
            grant: cap(c),
            renew_at,
        }
    }

    fn due(&self, now: Instant) -> bool {
        self.renew_at.is_some_and(|t| now >= t)
    }

    /// The grant to present for `ids` on `node`: this one, or a renewed one (`op` "read" or
    /// "write") when it is about to end. The metadata server checks permissions again.
    async fn fresh(
        &self,
        meta: &MetaClient,
        node: &str,
        op: &str,
        ids: Vec<i64>,
    ) -> Result<Option<SignedGrant>, TransferError> {
        if !self.due(Instant::now()) {
            return Ok(self.grant.clone());
        }
        tracing::debug!(%node, op, files = ids.len(), "renewing a capability");
        let c = meta.renew(node, op, ids).await?;
        Ok(cap(&Some(c)))
    }
}

fn ts(ns: i64) -> Timestamp {
    Timestamp {
        secs: ns.div_euclid(1_000_000_000),
        nanos: ns.rem_euclid(1_000_000_000) as u32,
    }
}

fn ns_of(t: Timestamp) -> i64 {
    t.secs * 1_000_000_000 + t.nanos as i64
}

/// One data session's worth of work and its outcome.
struct SessionResult {
    node: String,
    result: Result<Attempt, TransferError>,
    /// Names (as announced) the destination confirmed, with their digests.
    done: HashMap<String, (u64, Vec<Digest>)>,
    /// Names that failed, with why.
    failed: HashMap<String, TransferError>,
    /// Names that failed because the node's disk is full (the upload places them elsewhere).
    no_space: HashSet<String>,
}

/// Runs sessions side by side, each with its own counters (summed into `total` for progress)
/// and its own stall watch, and collects what each did.
struct Runner {
    total: Arc<Counters>,
    parts: Arc<Mutex<Vec<Arc<Counters>>>>,
    /// Bytes of sessions that have ended (their counters are dropped from `parts`).
    settled: Arc<Mutex<(u64, u64)>>,
    events: EventSender,
    cancel: CancellationToken,
    stall: Duration,
}

impl Runner {
    fn new(
        total: Arc<Counters>,
        events: EventSender,
        cancel: CancellationToken,
        stall: Duration,
    ) -> Self {
        let r = Self {
            total,
            parts: Arc::default(),
            settled: Arc::default(),
            events,
            cancel,
            stall,
        };
        let (parts, settled, total, cancel) = (
            r.parts.clone(),
            r.settled.clone(),
            r.total.clone(),
            r.cancel.clone(),
        );
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = cancel.cancelled() => return,
                }
                sum_into(&parts, &settled, &total);
                if Arc::strong_count(&parts) == 1 {
                    return;
                }
            }
        });
        r
    }

    /// Runs one session: `run` gets fresh counters, an event channel and a cancel token.
    async fn session<F, Fut>(&self, node: String, names: Vec<String>, run: F) -> SessionResult
    where
        F: FnOnce(AttemptContext) -> Fut,
        Fut: std::future::Future<Output = Result<Attempt, TransferError>>,
    {
        let counters = Arc::new(Counters::default());
        self.parts.lock().expect("parts").push(counters.clone());
        let (tx, mut rx) = mpsc::unbounded_channel();
        let cancel = self.cancel.child_token();
        let fut = run(AttemptContext {
            counters: counters.clone(),
            events: tx,
            cancel: cancel.clone(),
        });
        tokio::pin!(fut);
        let mut done = HashMap::new();
        let mut failed = HashMap::new();
        let mut no_space = HashSet::new();
        let mut last = (0u64, Instant::now());
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        let result = loop {
            tokio::select! {
                r = &mut fut => break r,
                Some(ev) = rx.recv() => self.note(ev, &mut done, &mut failed, &mut no_space),
                _ = tick.tick() => {
                    let progress = Counters::get(&counters.bytes_done)
                        + Counters::get(&counters.bytes_sent)
                        + Counters::get(&counters.activity);
                    if progress != last.0 {
                        last = (progress, Instant::now());
                    } else if last.1.elapsed() > self.stall {
                        cancel.cancel();
                        let _ = (&mut fut).await;
                        break Err(TransferError::stalled(format!(
                            "node {node}: no data moved for {} s", self.stall.as_secs()
                        )));
                    }
                }
            }
        };
        while let Ok(ev) = rx.try_recv() {
            self.note(ev, &mut done, &mut failed, &mut no_space);
        }
        cancel.cancel();
        // This session's bytes stay in the total.
        {
            let mut parts = self.parts.lock().expect("parts");
            parts.retain(|c| !Arc::ptr_eq(c, &counters));
            let mut s = self.settled.lock().expect("settled");
            s.0 += Counters::get(&counters.bytes_done);
            s.1 += Counters::get(&counters.bytes_sent);
        }
        sum_into(&self.parts, &self.settled, &self.total);
        // Files the session did not report are failed with the session's error.
        if let Err(e) = &result {
            for n in names {
                if !done.contains_key(&n) && !failed.contains_key(&n) {
                    failed.insert(n, e.clone());
                }
            }
        }
        SessionResult {
            node,
            result,
            done,
            failed,
            no_space,
        }
    }

    fn note(
        &self,
        ev: Event,
        done: &mut HashMap<String, (u64, Vec<Digest>)>,
        failed: &mut HashMap<String, TransferError>,
        no_space: &mut HashSet<String>,
    ) {
        match ev {
            Event::FileDone {
                path,
                size,
                digests,
                ..
            } => {
                failed.remove(&path);
                done.insert(path, (size, digests));
            }
            Event::FileFailed { path, error } => {
                if !done.contains_key(&path) {
                    if error.kind == wire::error::ErrorKind::NoSpace {
                        no_space.insert(path.clone());
                    }
                    failed.insert(path, error.into());
                }
            }
            Event::Plan { .. } => {}
            other => {
                let _ = self.events.send(other);
            }
        }
    }
}

fn sum_into(parts: &Mutex<Vec<Arc<Counters>>>, settled: &Mutex<(u64, u64)>, total: &Counters) {
    let parts = parts.lock().expect("parts");
    let s = *settled.lock().expect("settled");
    let (mut done, mut sent, mut act) = (s.0, s.1, 0);
    for c in parts.iter() {
        done += Counters::get(&c.bytes_done);
        sent += Counters::get(&c.bytes_sent);
        act += Counters::get(&c.activity);
    }
    Counters::set(&total.bytes_done, done);
    Counters::set(&total.bytes_sent, sent);
    Counters::add(&total.activity, act.min(1));
}

/// Runs `jobs` with at most `limit` at once.
async fn run_bounded<T, Fut>(jobs: Vec<Fut>, limit: usize) -> Vec<T>
where
    Fut: std::future::Future<Output = T>,
{
    use std::pin::Pin;
    let mut pending: Vec<Pin<Box<Fut>>> = jobs.into_iter().map(Box::pin).collect();
    pending.reverse();
    let mut running = Vec::new();
    let mut out = Vec::new();
    loop {
        while running.len() < limit.max(1) {
            match pending.pop() {
                Some(j) => running.push(j),
                None => break,
            }
        }
        if running.is_empty() {
            return out;
        }
        let (r, _, rest) = futures_select_all(running).await;
        out.push(r);
        running = rest;
    }
}

/// `futures::future::select_all` without the dependency: polls every future, returns the
/// first that finishes and the others.
async fn futures_select_all<Fut: std::future::Future + ?Sized>(
    mut futs: Vec<std::pin::Pin<Box<Fut>>>,
) -> (Fut::Output, usize, Vec<std::pin::Pin<Box<Fut>>>) {
    std::future::poll_fn(move |cx| {
        for i in 0..futs.len() {
            if let std::task::Poll::Ready(v) = futs[i].as_mut().poll(cx) {
                let rest = std::mem::take(&mut futs)
                    .into_iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .map(|(_, f)| f)
                    .collect();
                return std::task::Poll::Ready((v, i, rest));
            }
        }
        std::task::Poll::Pending
    })
    .await
}

/// Bookkeeping of a grid copy and its report.
struct Tally {
    started: Instant,
    files: u64,
    bytes: u64,
    done: BTreeMap<String, FileReport>,
    failed: BTreeMap<String, TransferError>,
    attempts: u32,
    streams: u32,
    retransmits: u64,
    /// Congestion control switches of every session.
    cc_decisions: Vec<wire::losscause::Decision>,
    plan: String,
}

impl Tally {
    fn new() -> Self {
        Self {
            started: Instant::now(),
            files: 0,
            bytes: 0,
            done: BTreeMap::new(),
            failed: BTreeMap::new(),
            attempts: 1,
            streams: 0,
            retransmits: 0,
            cc_decisions: Vec::new(),
            plan: String::new(),
        }
    }

    fn ok(&mut self, path: &str, bytes: u64, digests: &[Digest], events: &EventSender) {
        self.failed.remove(path);
        self.done.insert(
            path.to_string(),
            FileReport {
                path: path.to_string(),
                bytes,
                checksums: digests
                    .iter()
                    .map(|d| (d.algorithm.to_string(), d.hex()))
                    .collect(),
                skipped: false,
            },
        );
        let _ = events.send(Event::FileDone {
            path: path.to_string(),
            size: bytes,
            digests: digests.to_vec(),
            skipped: false,
        });
    }

    fn fail(&mut self, path: &str, e: TransferError) {
        if !self.done.contains_key(path) {
            self.failed.insert(path.to_string(), e);
        }
    }

    fn session(&mut self, a: &Attempt) {
        self.streams = self.streams.max(a.source.streams.max(a.sink.streams));
        self.retransmits += a.source.tcp_retransmits;
        self.cc_decisions
            .extend(a.source.cc_decisions.iter().cloned());
        if self.plan.is_empty() {
            self.plan = a.plan.clone();
        }
    }

    /// Announces every failed file on `events` and builds the copy's report.
    fn report(
        self,
        src: String,
        dst: String,
        opts: &GridOptions,
        counters: &Counters,
        events: &EventSender,
    ) -> Result<CopyReport, TransferError> {
        for (p, e) in &self.failed {
            let _ = events.send(Event::FileFailed {
                path: p.clone(),
                error: e.to_info(),
            });
        }
        let seconds = self.started.elapsed().as_secs_f64();
        let failures = self
            .failed
            .iter()
            .map(|(p, e)| transfer::error::FileFailure {
                path: p.clone(),
                error: e.into(),
            })
            .collect();
        let first = self.failed.values().next().cloned();
        let moved = Counters::get(&counters.bytes_sent).max(Counters::get(&counters.bytes_done));
        let report = CopyReport {
            source: src,
            destination: dst,
            bytes_total: self.bytes,
            bytes_moved: moved,
            bytes_skipped: 0,
            // Every round's sessions add to the same counters.
            bytes_moved_total: moved,
            bytes_resent: moved.saturating_sub(self.bytes),
            attempt_list: Vec::new(),
            files: self.files,
            files_failed: self.failed.len() as u64,
            seconds,
            mbit_per_s: self.bytes as f64 * 8.0 / seconds.max(1e-9) / 1e6,
            streams: self.streams,
            attempts: self.attempts,
            retries: self.attempts - 1,
            blocks_resent: 0,
            streams_lost: 0,
            plan: self.plan,
            congestion: String::new(),
            cc_decisions: self.cc_decisions,
            protect: format!("{:?}", opts.copy.session.protect).to_lowercase(),
            tcp_retransmits: self.retransmits,
            zero_copy: None,
            checksums: opts
                .copy
                .session
                .checksums
                .iter()
                .map(|c| c.to_string())
                .collect(),
            file_list: self.done.into_values().collect(),
            failures,
            first_failure: first.as_ref().map(|e| e.to_info()),
        };
        // Nothing copied at all: the first reason is the command's error.
        if report.files_failed > 0 && report.files_failed == report.files {
            return Err(first.expect("a failure"));
        }
        Ok(report)
    }
}

/// Copies between local paths and a grid, or within one grid. `src` and `dst` are the
/// command's locations; remote ones name `meta`.
pub async fn copy(
    meta: &MetaClient,
    src: &Location,
    dst: &Location,
    opts: &GridOptions,
    ctx: AttemptContext,
) -> Result<CopyReport, TransferError> {
    match (src, dst) {
        (Location::Local(l), Location::Remote { path, .. }) => {
            upload(meta, l, path, opts, ctx).await
        }
        (Location::Remote { path, .. }, Location::Local(l)) => {
            download(meta, path, l, opts, ctx).await
        }
        (
            Location::Remote {
                host: h1,
                port: p1,
                path: a,
            },
            Location::Remote {
                host: h2,
                port: p2,
                path: b,
            },
        ) => {
            if (h1, p1) != (h2, p2) {
                return Err(TransferError::usage(
                    "copies between two different grids (or a grid and a standalone endpoint) go through a local directory",
                ));
            }
            within(meta, a, b, opts, ctx).await
        }
        _ => Err(TransferError::usage(
            "both sides are local; one of them must be haul://META/path",
        )),
    }
}

/// Where entries named `top/rest` (relative to a source's parent) go in the grid below
/// `dest`, with cp semantics: into `dest` if it is a directory, else `dest` is the new name.
async fn grid_destination(
    meta: &MetaClient,
    dest: &str,
    source_is_dir: bool,
) -> Result<(String, bool), TransferError> {
    let norm = normalize(dest);
    match meta.lookup(&norm).await? {
        Some(e) if e.is_dir => Ok((norm, true)),
        Some(_) if source_is_dir => Err(TransferError::not_writable(format!(
            "{norm}: not a directory (cannot copy a directory onto a file)"
        ))),
        Some(_) if dest.ends_with('/') => Err(TransferError::not_writable(format!(
            "{norm}: not a directory"
        ))),
        Some(_) => Ok((norm, false)),
        None if dest.ends_with('/') => Err(TransferError::not_found(format!(
            "destination directory {norm} does not exist"
        ))),
        None => {
            let parent = parent_of(&norm);
            match meta.lookup(&parent).await? {
                Some(p) if p.is_dir => Ok((norm, false)),
                Some(_) => Err(TransferError::not_writable(format!(
                    "{parent}: not a directory"
                ))),
                None => Err(TransferError::not_found(format!(
                    "destination directory {parent} does not exist"
                ))),
            }
        }
    }
}

fn normalize(p: &str) -> String {
    let parts: Vec<&str> = p
        .split('/')
        .filter(|s| !s.is_empty() && *s != ".")
        .collect();
    format!("/{}", parts.join("/"))
}

fn parent_of(norm: &str) -> String {
    match norm.rfind('/') {
        Some(0) | None => "/".into(),
        Some(i) => norm[..i].to_string(),
    }
}

fn grid_join(base: &str, rel: &str) -> String {
    if rel.is_empty() {
        base.to_string()
    } else if base == "/" {
        format!("/{rel}")
    } else {
        format!("{base}/{rel}")
    }
}

/// The grid path of an entry named `rel` (`top/rest`).
fn map_grid(base: &str, into_dir: bool, rel: &str) -> String {
    if into_dir {
        return grid_join(base, rel);
    }
    match rel.split_once('/') {
        Some((_, rest)) => grid_join(base, rest),
        None => base.to_string(),
    }
}

async fn upload(
    meta: &MetaClient,
    local: &Path,
    dest: &str,
    opts: &GridOptions,
    ctx: AttemptContext,
) -> Result<CopyReport, TransferError> {
    let AttemptContext {
        counters,
        events,
        cancel,
    } = ctx;
    let listing = transfer::client::enumerate_local(local, opts.copy.recursive).await?;
    let entries = listing.entries;
    let source_is_dir = entries.first().is_some_and(|e| e.kind == EntryKind::Dir);
    let (base, into_dir) = grid_destination(meta, dest, source_is_dir).await?;
    let mut tally = Tally::new();
    let unsendable = listing.unsendable.len() as u64;
    for (rel, error) in listing.unsendable {
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
    tally.files = files.len() as u64 + unsendable;
    tally.bytes = files.iter().map(|(_, e)| e.size).sum();
    Counters::set(&counters.total_bytes, tally.bytes);
    Counters::set(&counters.total_files, tally.files);
    let runner = Runner::new(
        counters.clone(),
        events.clone(),
        cancel.clone(),
        Duration::from_millis(opts.copy.session.stall_timeout_ms.max(1000)),
    );
    let by_path: HashMap<String, SourceEntry> = files.iter().cloned().collect();
    let mut todo: Vec<String> = files.iter().map(|(p, _)| p.clone()).collect();
    let mut exclude: Vec<String> = Vec::new();
    let max_rounds = opts.copy.retry.max_attempts.max(1);
    for round in 1..=max_rounds {
        if todo.is_empty() || cancel.is_cancelled() {
            break;
        }
        tally.attempts = round;
        let mut jobs = Vec::new();
        for chunk in todo.chunks(SESSION_FILES) {
            let req = pb::CreateFilesRequest {
                files: chunk
                    .iter()
                    .map(|p| {
                        let e = &by_path[p];
                        pb::NewFile {
                            path: p.clone(),
                            size: e.size,
                            mode: e.mode & 0o7777,
                            mtime_ns: ns_of(e.mtime),
                            // Sent privately: its copies will travel privately too.
                            private: opts.copy.session.protect == Protect::Private,
                        }
                    })
                    .collect(),
                client_site: opts.site.clone().unwrap_or_default(),
                overwrite: opts.overwrite,
                exclude_nodes: exclude.clone(),
            };
            let reply = meta.create_files(req).await?;
            for e in &reply.errors {
                tally.fail(&e.path, from_file_error(e));
            }
            for c in &reply.created {
                tally.ok(&c.path, 0, &[], &events);
            }
            for pl in reply.placements {
                let peer = Peer::parse(&pl.address)?;
                let mut names = HashMap::new();
                let mut list = Vec::new();
                for (id, path) in pl.ids.iter().zip(&pl.paths) {
                    let mut e = by_path[path].clone();
                    e.rel = id.to_string();
                    names.insert(id.to_string(), (path.clone(), *id));
                    list.push(e);
                }
                let grant = Cap::of(&pl.capability);
                jobs.push((pl.node, peer, grant, pl.ids, list, names));
            }
        }
        let results = run_bounded(
            jobs.into_iter()
                .map(|(node, peer, grant, ids, list, names)| {
                    let runner = &runner;
                    let copy = &opts.copy;
                    let announced: Vec<String> = names.keys().cloned().collect();
                    async move {
                        let n = node.clone();
                        let r = runner
                            .session(node.clone(), announced, |ctx| async move {
                                let grant = grant.fresh(meta, &n, "write", ids).await?;
                                transfer::client::upload(
                                    list,
                                    &peer,
                                    SinkRequest {
                                        grant,
                                        ..Default::default()
                                    },
                                    copy,
                                    copy.session.clone(),
                                    ctx,
                                )
                                .await
                            })
                            .await;
                        (r, names)
                    }
                })
                .collect(),
            opts.max_sessions,
        )
        .await;
        todo.clear();
        let mut abort = Vec::new();
        for (r, names) in results {
            if let Ok(a) = &r.result {
                tally.session(a);
            }
            for (name, (size, digests)) in &r.done {
                if let Some((path, _)) = names.get(name) {
                    tally.ok(path, *size, digests, &events);
                }
            }
            let node_failed = r
                .result
                .as_ref()
                .is_err_and(|e| matches!(e.kind(), K::Connect | K::Unavailable | K::Stalled));
            if node_failed && !exclude.contains(&r.node) {
                let why = r
                    .result
                    .as_ref()
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default();
                tracing::warn!(node = %r.node, "storage node failed during upload ({why}); placing its files elsewhere");
                let _ = events.send(Event::Retrying {
                    attempt: round + 1,
                    delay_ms: 0,
                    reason: format!(
                        "node {} failed ({why}); its files go to another node",
                        r.node
                    ),
                });
                exclude.push(r.node.clone());
            }
            // A node whose disk filled (the metadata server learns of it only with the next
            // heartbeat) gets no more of this upload: its files go to nodes with room.
            let full = !r.no_space.is_empty();
            if full && !node_failed && !exclude.contains(&r.node) {
                tracing::warn!(node = %r.node, "storage node has no space left; placing its files elsewhere");
                let _ = events.send(Event::Retrying {
                    attempt: round + 1,
                    delay_ms: 0,
                    reason: format!(
                        "node {} has no space left; its files go to another node",
                        r.node
                    ),
                });
                exclude.push(r.node.clone());
            }
            for (name, e) in r.failed {
                let Some((path, id)) = names.get(&name) else {
                    continue;
                };
                // The node names the file by its id: name it by its grid path.
                let e = renamed(e, &format!("file {id}"), path);
                abort.push(*id);
                if e.retryable() || node_failed || r.no_space.contains(&name) {
                    todo.push(path.clone());
                }
                tally.fail(path, e);
            }
        }
        // Unfinished uploads leave nothing in the namespace.
        let _ = meta.abort_files(abort).await;
        if cancel.is_cancelled() {
            return Err(TransferError::interrupted());
        }
    }
    tally.report(
        local.display().to_string(),
        format!("haul://{}{}", meta.addr, dest),
        opts,
        &counters,
        &events,
    )
}

/// A file to read: its name at the destination and the replicas it can come from.
#[derive(Clone)]
struct ReadFile {
    rel: String,
    source: pb::ReadSource,
    expect: Vec<Digest>,
    /// Index into `source.replicas` of the replica in use (`usize::MAX`: none).
    replica: usize,
    /// Why it cannot be read at all (the metadata server said so: e.g. permission denied).
    refused: Option<TransferError>,
}

impl ReadFile {
    fn listed(&self, name: String) -> ListedFile {
        ListedFile {
            locator: self.source.id.to_string(),
            name,
            size: self.source.size,
            mode: self.source.mode,
            mtime: ts(self.source.mtime_ns),
            expect: self.expect.clone(),
        }
    }

    fn node(&self) -> Option<&pb::ReplicaInfo> {
        self.source.replicas.get(self.replica)
    }

    /// Moves to the next replica not on a failed node; false when none is left.
    fn fail_over(&mut self, failed: &HashSet<String>) -> bool {
        loop {
            self.replica += 1;
            match self.node() {
                Some(r) if failed.contains(&r.node) => continue,
                Some(_) => return true,
                None => return false,
            }
        }
    }
}

/// Opens `src` for reading: the files (names relative to the source's parent), directories,
/// and read capabilities per node.
async fn open_source(
    meta: &MetaClient,
    src: &str,
    opts: &GridOptions,
    exclude: &[String],
) -> Result<(Vec<ReadFile>, Vec<pb::Entry>, HashMap<String, Cap>, bool), TransferError> {
    let norm = normalize(src);
    let top = meta.stat(&norm).await?;
    if top.is_dir && !opts.copy.recursive {
        return Err(TransferError::usage(format!(
            "{norm} is a directory; use -r to copy it"
        )));
    }
    let reply = meta
        .open_read(pb::OpenReadRequest {
            paths: vec![norm.clone()],
            client_site: opts.site.clone().unwrap_or_default(),
            recursive: opts.copy.recursive,
            exclude_nodes: exclude.to_vec(),
            ..Default::default()
        })
        .await?;
    if reply.files.is_empty() && top.size == 0 && !top.is_dir && reply.errors.is_empty() {
        // An empty file has no replica.
    }
    if let (false, Some(e)) = (top.is_dir, reply.errors.first()) {
        return Err(from_file_error(e));
    }
    let parent = parent_of(&norm);
    let rel_of = |p: &str| -> String {
        let stripped = if parent == "/" {
            p.trim_start_matches('/')
        } else {
            p.strip_prefix(&parent).unwrap_or(p).trim_start_matches('/')
        };
        stripped.to_string()
    };
    let mut files = Vec::new();
    for s in reply.files {
        let expect = parse_digests(&s.checksum).map_err(|e| {
            TransferError::protocol(format!("{}: bad checksum in the catalog: {e}", s.path))
        })?;
        files.push(ReadFile {
            rel: rel_of(&s.path),
            source: s,
            expect,
            replica: 0,
            refused: None,
        });
    }
    let mut dirs = reply.dirs;
    for d in &mut dirs {
        d.path = rel_of(&d.path);
    }
    for e in reply.errors {
        tracing::warn!(path = %e.path, "{}", e.message);
        files.push(ReadFile {
            rel: rel_of(&e.path),
            source: pb::ReadSource {
                path: e.path.clone(),
                ..Default::default()
            },
            expect: vec![],
            replica: usize::MAX,
            refused: Some(from_file_error(&e)),
        });
    }
    if !top.is_dir && files.is_empty() && top.size == 0 {
        files.push(ReadFile {
            rel: rel_of(&norm),
            source: pb::ReadSource {
                path: norm.clone(),
                id: top.id,
                size: 0,
                mtime_ns: top.mtime_ns,
                mode: top.mode,
                checksum: top.checksum.clone(),
                replicas: vec![],
                private: false,
            },
            expect: vec![],
            replica: 0,
            refused: None,
        });
    }
    let grants = reply
        .nodes
        .into_iter()
        .map(|n| (n.node, Cap::of(&n.capability)))
        .collect();
    Ok((files, dirs, grants, top.is_dir))
}

async fn download(
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
    tally.files = files.len() as u64;
    tally.bytes = files.iter().map(|f| f.source.size).sum();
    Counters::set(&counters.total_bytes, tally.bytes);
    Counters::set(&counters.total_files, tally.files);
    let mut todo: Vec<ReadFile> = Vec::new();
    for f in files {
        if f.replica == usize::MAX {
            // With the reason the metadata server gave (permission denied is exit 5).
            let e = f.refused.clone().unwrap_or_else(|| {
                TransferError::connect(format!("{}: no healthy replica", f.source.path))
            });
            tally.fail(&f.source.path, e);
        } else if f.source.size == 0 {
            match write_empty(&dest.map(&f.rel), &f.source) {
                Ok(()) => tally.ok(&f.source.path, 0, &[], &events),
                Err(e) => tally.fail(&f.source.path, e),
            }
        } else {
            todo.push(f);
        }
    }
    let runner = Runner::new(
        counters.clone(),
        events.clone(),
        cancel.clone(),
        Duration::from_millis(opts.copy.session.stall_timeout_ms.max(1000)),
    );
    let mut failed_nodes: HashSet<String> = HashSet::new();
    let mut round = 0u32;
    let max_rounds = opts.copy.retry.max_attempts.max(1) + 4;
    while !todo.is_empty() && !cancel.is_cancelled() {
        round += 1;
        tally.attempts = round;
        if round > max_rounds {
            for f in todo.drain(..) {
                tally.fail(
                    &f.source.path,
                    TransferError::connect(format!(
                        "{}: gave up after {max_rounds} rounds",
                        f.source.path
                    )),
                );
            }
            break;
        }
        let mut by_node: BTreeMap<String, Vec<ReadFile>> = BTreeMap::new();
        for f in todo.drain(..) {
            let node = f.node().expect("has a replica").node.clone();
            by_node.entry(node).or_default().push(f);
        }
        let mut jobs = Vec::new();
        for (node, list) in by_node {
            let address = list[0].node().expect("replica").address.clone();
            let peer = Peer::parse(&address)?;
            let grant = grants.get(&node).cloned();
            for chunk in list.chunks(SESSION_FILES) {
                jobs.push((node.clone(), peer.clone(), grant.clone(), chunk.to_vec()));
            }
        }
        let resume = round > 1 || opts.copy.session.resume;
        let results = run_bounded(
            jobs.into_iter()
                .map(|(node, peer, grant, chunk)| {
                    let (runner, copy, dest) = (&runner, &opts.copy, dest.clone());
                    let names: Vec<String> = chunk.iter().map(|f| f.rel.clone()).collect();
                    let listed: Vec<ListedFile> =
                        chunk.iter().map(|f| f.listed(f.rel.clone())).collect();
                    let ids: Vec<i64> = chunk.iter().map(|f| f.source.id).collect();
                    let private = chunk.iter().any(|f| f.source.private);
                    async move {
                        let n = node.clone();
                        let r = runner
                            .session(node.clone(), names, |ctx| async move {
                                let grant = match grant {
                                    Some(g) => g.fresh(meta, &n, "read", ids).await?,
                                    None => None,
                                };
                                let mut session = copy.session.clone();
                                session.resume = resume;
                                // Files that arrived privately leave privately.
                                if private {
                                    session.protect = Protect::Private;
                                }
                                transfer::client::download(
                                    &peer,
                                    SourceRequest {
                                        files: listed,
                                        grant,
                                        ..Default::default()
                                    },
                                    Arc::new(Root::Ambient),
                                    Arc::new(dest),
                                    copy,
                                    session,
                                    ctx,
                                )
                                .await
                            })
                            .await;
                        (r, chunk)
                    }
                })
                .collect(),
            opts.max_sessions,
        )
        .await;
        for (r, chunk) in results {
            if let Ok(a) = &r.result {
                tally.session(a);
            }
            let node_failed = r.result.as_ref().is_err_and(|e| {
                matches!(
                    e.kind(),
                    K::Connect
                        | K::Unavailable
                        | K::Stalled
                        | K::NotFound
                        | K::PermissionDenied
                        | K::Authentication
                        | K::Unmapped
                )
            });
            if node_failed && failed_nodes.insert(r.node.clone()) {
                let why = r
                    .result
                    .as_ref()
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default();
                let _ = events.send(Event::Retrying {
                    attempt: round + 1,
                    delay_ms: 0,
                    reason: format!(
                        "node {} failed ({why}); continuing from other replicas",
                        r.node
                    ),
                });
            }
            for mut f in chunk {
                if let Some((size, digests)) = r.done.get(&f.rel) {
                    if catalog_agrees(&f.expect, digests) {
                        tally.ok(&f.source.path, *size, digests, &events);
                    } else {
                        let _ = std::fs::remove_file(dest.map(&f.rel));
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
                let mut avoid = failed_nodes.clone();
                avoid.insert(r.node.clone());
                if switch && f.fail_over(if node_failed { &failed_nodes } else { &avoid }) {
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
        if cancel.is_cancelled() {
            return Err(TransferError::interrupted());
        }
    }
    tally.report(
        format!("haul://{}{}", meta.addr, src),
        local.display().to_string(),
        opts,
        &counters,
        &events,
    )
}

/// `e` with `from` replaced by `to` in its message, of the same kind.
fn renamed(e: TransferError, from: &str, to: &str) -> TransferError {
    let message = e.message().replace(from, to);
    e.with_message(message)
}

/// Whether received digests agree with the catalog's (on the algorithms both have).
fn catalog_agrees(expect: &[Digest], got: &[Digest]) -> bool {
    expect.is_empty() || wire::checksum::digests_match(got, expect).is_ok()
}

fn write_empty(path: &Path, s: &pb::ReadSource) -> Result<(), TransferError> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(p) = path.parent() {
        std::fs::create_dir_all(p).map_err(|e| {
            TransferError::not_writable(format!("cannot create {}: {e}", p.display()))
        })?;
    }
    let f = std::fs::File::create(path).map_err(|e| {
        TransferError::not_writable(format!("cannot create {}: {e}", path.display()))
    })?;
    let t = ts(s.mtime_ns);
    let when = std::time::UNIX_EPOCH + Duration::new(t.secs.max(0) as u64, t.nanos);
    let _ = f.set_times(std::fs::FileTimes::new().set_modified(when));
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(s.mode & 0o7777));
    Ok(())
}

async fn within(
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
    tally.files = files.len() as u64;
    tally.bytes = files.iter().map(|f| f.source.size).sum();
    Counters::set(&counters.total_bytes, tally.bytes);
    Counters::set(&counters.total_files, tally.files);
    let runner = Runner::new(
        counters.clone(),
        events.clone(),
        cancel.clone(),
        Duration::from_millis(opts.copy.session.stall_timeout_ms.max(1000)),
    );
    let mut todo: Vec<(String, ReadFile)> = Vec::new();
    for f in files {
        let target = map_grid(&base, into_dir, &f.rel);
        if f.replica == usize::MAX {
            // With the reason the metadata server gave (permission denied is exit 5).
            let e = f.refused.clone().unwrap_or_else(|| {
                TransferError::connect(format!("{}: no healthy replica", f.source.path))
            });
            tally.fail(&f.source.path, e);
        } else {
            todo.push((target, f));
        }
    }
    let mut exclude: Vec<String> = Vec::new();
    let mut failed_sources: HashSet<String> = HashSet::new();
    let max_rounds = opts.copy.retry.max_attempts.max(1);
    for round in 1..=max_rounds {
        if todo.is_empty() || cancel.is_cancelled() {
            break;
        }
        tally.attempts = round;
        let by_target: HashMap<String, ReadFile> = todo.iter().cloned().collect();
        let mut jobs = Vec::new();
        for chunk in todo.chunks(SESSION_FILES) {
            let reply = meta
                .create_files(pb::CreateFilesRequest {
                    files: chunk
                        .iter()
                        .map(|(t, f)| pb::NewFile {
                            path: t.clone(),
                            size: f.source.size,
                            mode: f.source.mode,
                            mtime_ns: f.source.mtime_ns,
                            private: f.source.private
                                || opts.copy.session.protect == Protect::Private,
                        })
                        .collect(),
                    client_site: opts.site.clone().unwrap_or_default(),
                    overwrite: opts.overwrite,
                    exclude_nodes: exclude.clone(),
                })
                .await?;
            for e in &reply.errors {
                tally.fail(&e.path, from_file_error(e));
            }
            for c in &reply.created {
                tally.ok(&c.path, 0, &[], &events);
            }
            for pl in reply.placements {
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
                    jobs.push((
                        src_node,
                        from,
                        pl.node.clone(),
                        to.clone(),
                        write.clone(),
                        list,
                    ));
                }
            }
        }
        let results = run_bounded(
            jobs.into_iter()
                .map(|(src_node, from, dst_node, to, write, list)| {
                    let read = grants.get(&src_node).cloned();
                    let (runner, copy) = (&runner, &opts.copy);
                    let names: Vec<String> = list.iter().map(|(id, _, _)| id.to_string()).collect();
                    let listed: Vec<ListedFile> = list
                        .iter()
                        .map(|(id, _, f)| f.listed(id.to_string()))
                        .collect();
                    let new_ids: Vec<i64> = list.iter().map(|(id, _, _)| *id).collect();
                    // Files that arrived privately leave privately.
                    let private = list.iter().any(|(_, _, f)| f.source.private);
                    let old_ids: Vec<i64> = list.iter().map(|(_, _, f)| f.source.id).collect();
                    let (s_node, d_node) = (src_node.clone(), dst_node.clone());
                    async move {
                        let r = runner
                            .session(format!("{src_node}->{dst_node}"), names, |ctx| async move {
                                let read = match read {
                                    Some(g) => g.fresh(meta, &s_node, "read", old_ids).await?,
                                    None => None,
                                };
                                let write = write.fresh(meta, &d_node, "write", new_ids).await?;
                                let mut session = copy.session.clone();
                                if private {
                                    session.protect = Protect::Private;
                                }
                                transfer::client::third_party(
                                    &from,
                                    SourceRequest {
                                        files: listed,
                                        grant: read,
                                        ..Default::default()
                                    },
                                    &to,
                                    SinkRequest {
                                        grant: write,
                                        ..Default::default()
                                    },
                                    copy,
                                    session,
                                    ctx,
                                )
                                .await
                            })
                            .await;
                        (r, src_node, dst_node, list)
                    }
                })
                .collect(),
            opts.max_sessions,
        )
        .await;
        todo.clear();
        let mut abort = Vec::new();
        for (r, src_node, dst_node, list) in results {
            if let Ok(a) = &r.result {
                tally.session(a);
            }
            let failed = r.result.is_err();
            if failed {
                let why = r
                    .result
                    .as_ref()
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default();
                let _ = events.send(Event::Retrying {
                    attempt: round + 1,
                    delay_ms: 0,
                    reason: format!("copy {src_node} -> {dst_node} failed ({why})"),
                });
                if r.result
                    .as_ref()
                    .is_err_and(|e| matches!(e.kind(), K::Connect | K::Unavailable | K::Stalled))
                {
                    // Which end failed is not known: avoid both next time.
                    failed_sources.insert(src_node.clone());
                    if !exclude.contains(&dst_node) {
                        exclude.push(dst_node.clone());
                    }
                }
            }
            for (id, path, mut f) in list {
                if let Some((size, digests)) = r.done.get(&id.to_string()) {
                    tally.ok(&path, *size, digests, &events);
                    continue;
                }
                abort.push(id);
                let err = r
                    .failed
                    .get(&id.to_string())
                    .cloned()
                    .map(|e| renamed(e, &format!("file {id}"), &path))
                    .unwrap_or_else(|| TransferError::connect(format!("{path}: not copied")));
                if failed && failed_sources.contains(&src_node) && !f.fail_over(&failed_sources) {
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
        let _ = meta.abort_files(abort).await;
        if cancel.is_cancelled() {
            return Err(TransferError::interrupted());
        }
    }
    tally.report(
        format!("haul://{}{}", meta.addr, src),
        format!("haul://{}{}", meta.addr, dst),
        opts,
        &counters,
        &events,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_paths_follow_cp_semantics() {
        assert_eq!(map_grid("/data", true, "run1/a.nc"), "/data/run1/a.nc");
        assert_eq!(
            map_grid("/data/copy", false, "run1/a.nc"),
            "/data/copy/a.nc"
        );
        assert_eq!(map_grid("/data/x.nc", false, "a.nc"), "/data/x.nc");
        assert_eq!(map_grid("/", true, "a.nc"), "/a.nc");
        assert_eq!(normalize("//a/./b/"), "/a/b");
        assert_eq!(parent_of("/a/b"), "/a");
        assert_eq!(parent_of("/a"), "/");
        assert_eq!(ns_of(ts(1_500_000_000_123)), 1_500_000_000_123);
        assert_eq!(ts(-1).secs, -1);
    }

    #[test]
    fn capabilities_are_renewed_before_they_end() {
        let t0 = Instant::now();
        let c = |ttl_ms| {
            Some(pb::Capability {
                token: vec![1],
                mac: vec![2],
                ttl_ms,
            })
        };
        // Five minutes: renewed in its last minute.
        let five = Cap::received(&c(300_000), t0);
        assert!(!five.due(t0 + Duration::from_secs(239)));
        assert!(five.due(t0 + Duration::from_secs(240)));
        // Short ones at half their life.
        let two = Cap::received(&c(2_000), t0);
        assert!(!two.due(t0 + Duration::from_millis(999)));
        assert!(two.due(t0 + Duration::from_millis(1000)));
        // From a server that does not say (ttl 0), or none at all: never.
        assert!(!Cap::received(&c(0), t0).due(t0 + Duration::from_secs(86_400)));
        assert!(!Cap::received(&None, t0).due(t0 + Duration::from_secs(86_400)));
    }

    #[test]
    fn fail_over_skips_failed_nodes() {
        let rep = |n: &str| pb::ReplicaInfo {
            node: n.into(),
            ..Default::default()
        };
        let mut f = ReadFile {
            rel: "a".into(),
            source: pb::ReadSource {
                replicas: vec![rep("n1"), rep("n2"), rep("n3")],
                ..Default::default()
            },
            expect: vec![],
            replica: 0,
            refused: None,
        };
        let failed: HashSet<String> = ["n1".to_string(), "n2".to_string()].into();
        assert!(f.fail_over(&failed));
        assert_eq!(f.node().unwrap().node, "n3");
        assert!(!f.fail_over(&failed));
    }
}
