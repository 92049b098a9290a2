//! `haul cp` with the grid on one or both sides. The metadata server decides where files go
//! and which replicas are read, and signs the capabilities; the data moves directly between
//! this host and storage nodes (upload, download), or between nodes (a copy within the grid),
//! with the data-plane engine, several nodes at once.
//!
//! Failures: a node that fails during a download is replaced by the next replica of each file
//! it had not finished, resuming partial files, with one log line; an upload to a node that
//! fails is placed again on another node. Nothing is visible in the namespace before a node
//! has verified it.
//!
//! The loop of rounds (plan sessions, run them side by side with a stall watch, settle what
//! each did, try the rest again elsewhere) is written once, in `rounds`; `upload`, `download`
//! and `within` say only how each kind of copy plans and settles a round.

mod download;
mod rounds;
mod upload;
mod within;

use crate::client::{MetaClient, from_file_error};
use api::meta as pb;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};
use transfer::TransferError;
use transfer::client::{AttemptContext, CopyOptions, CopyReport, Location, Peer};
use wire::checksum::{Digest, parse_digests};
use wire::control::ListedFile;
use wire::data::Timestamp;
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
    /// An upload's destination is the new file's name, in a directory that exists (the
    /// caller knows): it is not looked up first (`haul mount`'s close saves two round trips;
    /// the metadata server still refuses a name that is a directory or has no parent).
    pub dest_is_name: bool,
    /// An upload of one local file: the block CRCs its writer recorded as it wrote it
    /// (`haul mount`'s spools). Blocks they cover are sent without being read; the node
    /// checks them as it checks any block.
    pub source_crcs: Option<std::sync::Arc<wire::known_crcs::KnownCrcs>>,
}

pub(crate) fn cap(c: &Option<pb::Capability>) -> Option<SignedGrant> {
    c.as_ref().map(|c| SignedGrant {
        token: c.token.clone(),
        mac: c.mac.clone(),
    })
}

/// A capability as received, and when to ask for a new one: capabilities are short-lived (5
/// minutes by default), and a copy (or an open file of `haul mount`) can outlast one.
#[derive(Clone)]
pub struct Cap {
    grant: Option<SignedGrant>,
    /// On this host's clock: a minute before it ends (half its life for short ones).
    renew_at: Option<Instant>,
}

impl Cap {
    pub fn of(c: &Option<pb::Capability>) -> Self {
        Self::received(c, Instant::now())
    }

    fn received(c: &Option<pb::Capability>, at: Instant) -> Self {
        let renew_at = c.as_ref().filter(|c| c.ttl_ms > 0).map(|c| {
            // The server's figure: a day at most, so that no time overflows.
            let ttl = Duration::from_millis(c.ttl_ms).min(Duration::from_secs(86_400));
            at.checked_add(ttl - (ttl / 2).min(Duration::from_secs(60)))
                .unwrap_or(at)
        });
        Self {
            grant: cap(c),
            renew_at,
        }
    }

    fn due(&self, now: Instant) -> bool {
        self.renew_at.is_some_and(|t| now >= t)
    }

    /// The grant itself.
    pub fn grant(&self) -> Option<SignedGrant> {
        self.grant.clone()
    }

    /// This capability, or a renewed one (`op` "read" or "write" for `ids` on `node`) when it
    /// is about to end. The metadata server checks permissions again.
    pub async fn renewed(
        &self,
        meta: &MetaClient,
        node: &str,
        op: &str,
        ids: Vec<i64>,
    ) -> Result<Cap, TransferError> {
        if !self.due(Instant::now()) {
            return Ok(self.clone());
        }
        tracing::debug!(%node, op, files = ids.len(), "renewing a capability");
        let c = meta.renew(node, op, ids).await?;
        Ok(Cap::of(&Some(c)))
    }

    /// The grant to present for `ids` on `node`: this one, or a renewed one (see
    /// [`Cap::renewed`]).
    async fn fresh(
        &self,
        meta: &MetaClient,
        node: &str,
        op: &str,
        ids: Vec<i64>,
    ) -> Result<Option<SignedGrant>, TransferError> {
        Ok(self.renewed(meta, node, op, ids).await?.grant)
    }
}

/// Copies between local paths and a grid, or within one grid. `src` and `dst` are the
/// command's locations; remote ones name `meta`. While it runs, it is listed among the copies
/// in progress (`crate::live`); when it ends (done, partly done or failed) it goes into the
/// grid's transfer history.
pub async fn copy(
    meta: &MetaClient,
    src: &Location,
    dst: &Location,
    opts: &GridOptions,
    ctx: AttemptContext,
) -> Result<CopyReport, TransferError> {
    let started = std::time::SystemTime::now();
    let kind = match (src, dst) {
        (Location::Local(_), _) => "upload",
        (_, Location::Local(_)) => "download",
        _ => "copy",
    };
    // This copy's part of the trace file (`--trace`; earlier copies may have appended to it).
    let trace_from = opts
        .copy
        .trace
        .as_ref()
        .map(|t| (t.clone(), t.end_offset()));
    let live = crate::live::start(
        meta,
        kind,
        &src.to_string(),
        &dst.to_string(),
        crate::live::from_counters(ctx.counters.clone()),
    );
    let result = copy_unrecorded(meta, src, dst, opts, ctx).await;
    let live_ids = live.finish().await;
    // A refused command line is no transfer.
    if !matches!(&result, Err(e) if e.kind() == wire::error::ErrorKind::Invalid) {
        let (mut t, files) =
            crate::history::copy_record(kind, &src.to_string(), &dst.to_string(), started, &result);
        if let Some((trace, offset)) = trace_from {
            trace.flush();
            // Reading and parsing a long trace is blocking work.
            let path = trace.path().to_path_buf();
            t.trace = tokio::task::spawn_blocking(move || {
                transfer::trace::summary::throughput_points(
                    &transfer::trace::read_since(&path, offset),
                    crate::history::TRACE_POINTS,
                )
            })
            .await
            .unwrap_or_default();
        }
        if let Some(site) = &opts.site {
            // The client's site: where a copy within the grid was asked to read or write.
            if kind == "copy" {
                t.dst_site = site.clone();
            }
        }
        crate::history::send(meta, t, files, live_ids).await;
    }
    result
}

/// [`copy`] without its entry in the transfer history and the list of copies in progress:
/// for callers that copy many single files as parts of one activity (`haul mount` uploads
/// each file written when it is closed).
pub async fn copy_unrecorded(
    meta: &MetaClient,
    src: &Location,
    dst: &Location,
    opts: &GridOptions,
    ctx: AttemptContext,
) -> Result<CopyReport, TransferError> {
    match (src, dst) {
        (Location::Local(l), Location::Remote { path, .. }) => {
            upload::upload(meta, l, path, opts, ctx).await
        }
        (Location::Remote { path, .. }, Location::Local(l)) => {
            download::download(meta, path, l, opts, ctx).await
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
            if (h1, p1) != (h2, p2) && meta.addr == Peer::new(h2.clone(), *p2) {
                // The source is a standalone endpoint: it pushes to the nodes.
                let peer = Peer::new(h1.clone(), *p1);
                return upload::upload_from(
                    meta,
                    upload::Origin::Endpoint {
                        peer: &peer,
                        path: a,
                    },
                    b,
                    opts,
                    ctx,
                )
                .await;
            }
            if (h1, p1) != (h2, p2) {
                // The other end is a standalone endpoint (another grid's metadata server
                // refuses the session: copies between grids go through a local directory).
                let peer = Peer::new(h2.clone(), *p2);
                return download::to_endpoint(meta, a, &peer, b, opts, ctx)
                    .await
                    .map_err(|e| match e.kind() {
                        wire::error::ErrorKind::IsMetadataServer => TransferError::usage(
                            "copies between two grids go through a local directory",
                        ),
                        _ => e,
                    });
            }
            within::within(meta, a, b, opts, ctx).await
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

/// Asks the metadata server to place `files` (new grid files) on nodes other than `exclude`,
/// SESSION_FILES at a time. Files it refuses fail in `tally`; empty files it created at once
/// are done; the placements of the others are returned (each with its node's capability).
async fn place(
    meta: &MetaClient,
    opts: &GridOptions,
    files: Vec<pb::NewFile>,
    exclude: &[String],
    tally: &mut rounds::Tally,
    events: &transfer::progress::EventSender,
) -> Result<Vec<pb::Placement>, TransferError> {
    let mut placements = Vec::new();
    for chunk in files.chunks(SESSION_FILES) {
        let reply = meta
            .create_files(pb::CreateFilesRequest {
                files: chunk.to_vec(),
                client_site: opts.site.clone().unwrap_or_default(),
                overwrite: opts.overwrite,
                exclude_nodes: exclude.to_vec(),
            })
            .await?;
        for e in &reply.errors {
            tally.fail(&e.path, from_file_error(e));
        }
        for c in &reply.created {
            tally.ok(&c.path, None, 0, &[], events);
        }
        placements.extend(reply.placements);
    }
    Ok(placements)
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
            mtime: Timestamp::from_unix_ns(self.source.mtime_ns),
            expect: self.expect.clone(),
        }
    }

    fn node(&self) -> Option<&pb::ReplicaInfo> {
        self.source.replicas.get(self.replica)
    }

    /// Why the file cannot be read from any replica, when the listing said so: the metadata
    /// server's reason (permission denied is exit 5), else no healthy replica.
    fn unreadable(&self) -> Option<TransferError> {
        (self.replica == usize::MAX).then(|| {
            self.refused.clone().unwrap_or_else(|| {
                TransferError::connect(format!("{}: no healthy replica", self.source.path))
            })
        })
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
    let t = Timestamp::from_unix_ns(s.mtime_ns);
    let when = std::time::UNIX_EPOCH + Duration::new(t.secs.max(0) as u64, t.nanos);
    let _ = f.set_times(std::fs::FileTimes::new().set_modified(when));
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(s.mode & 0o7777));
    Ok(())
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
