//! Reading a grid file through the mount: the planner (`readahead`) says which extents to
//! fetch; each extent is fetched by a data session from the replica the metadata server chose
//! first (site preference, health, load), into a file of the block cache (`cache`), and a read
//! waits for the extents it needs and reads them from there. A node that fails, refuses, or
//! sends a damaged replica is left for the next replica and the extent is fetched again there
//! (resuming what arrived): the program sees an error only when no replica is left. An extent
//! that is the whole file is read as a whole file, so the node checks it against the catalog's
//! checksum before it finishes sending. A file read in several extents is checked here: each
//! fetched extent's CRC32C is computed from the cache and combined, in file order, into the
//! CRC of the prefix read so far (evicted extents still count), which at the end of the file
//! must equal the catalog's; the extent that completes the file is given to readers only then,
//! so a reader that read the file through meets the damage as EIO (its data is dropped from
//! the cache and the nodes it came from are not read again). A reader that skips parts of a
//! file, or extents a kept `--cache` held from an earlier mount, are not checked this way
//! (extents of a file closed and opened again in this mount keep their CRCs in the cold list).

use crate::cache::{Cache, FileKey};
use crate::readahead::{Planner, Tuning};
use grid::MetaClient;
use grid::copy::Cap;
use grid::types::OpenReadRequest;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};
use transfer::TransferError;
use transfer::client::{AttemptContext, CopyOptions, Peer, SourceRequest};
use transfer::progress::Event;
use transfer::store::{Destination, Root};
use wire::checksum::{Digest, parse_digests};
use wire::control::{ListedFile, Protect};
use wire::data::Timestamp;
use wire::error::ErrorKind as K;
use wire::grant::SignedGrant;

/// What fetching needs, shared by every open file of the mount.
pub struct Fetcher {
    pub meta: MetaClient,
    pub rt: tokio::runtime::Handle,
    pub copy: CopyOptions,
    pub site: Option<String>,
    pub cache: Arc<Cache>,
    pub tuning: Tuning,
    /// Data sessions at once, all files together.
    pub slots: Arc<tokio::sync::Semaphore>,
    /// Held while an open looks for the file among those open and registers it, so two
    /// opens of one file share one.
    pub opening: tokio::sync::Mutex<()>,
}

enum ExtState {
    Fetching,
    Ready,
    Failed(TransferError),
}

struct Extent {
    end: u64,
    state: ExtState,
    /// CRC32C of its bytes in blocks, and the node they came from (fetched by this mount;
    /// kept in the cold list across closes; not for extents a kept `--cache` held from an
    /// earlier mount).
    crc: Option<Checked>,
    last_used: Instant,
    /// Read to its end (else read-ahead still to be read, or an extent a reader is in the
    /// middle of: evicted last).
    read: bool,
    /// Reads copying out of it right now: it is not evicted under them.
    pins: u32,
    /// Failed a whole-file check while being read: its data goes when the last read copying
    /// out of it is done.
    doomed: bool,
}

struct State {
    planner: Planner,
    extents: BTreeMap<u64, Extent>,
    /// Index into `replicas` of the replica in use.
    replica: usize,
    failed_nodes: HashSet<String>,
    /// Read capabilities, by node.
    grants: HashMap<String, Cap>,
    /// The file's bytes checked so far, from its start: where they end, their CRC32C, and
    /// the nodes they came from (extents are combined in as they arrive in order, so an
    /// evicted one still counts).
    prefix_end: u64,
    prefix_crc: u32,
    prefix_nodes: HashSet<String>,
    /// The whole file matched the catalog's CRC32C.
    verified: bool,
    /// The CRC32C of each [`CRC_BLOCK`] piece of the checked prefix, in order (empty for files
    /// of more than [`MAX_PIECES`] pieces): data fetched again after the prefix passed it
    /// (evicted and read anew, perhaps from another replica) must match them.
    piece_crcs: Vec<u32>,
    /// A mismatch was found and the metadata server not yet asked to verify the replicas
    /// (`Some(false)`), or it was asked (`Some(true)`): once per open file.
    damage_reported: Option<bool>,
}

impl State {
    /// Where an extent's pieces (`crcs`) first differ from those the checked prefix passed.
    fn differs_from_checked(&self, crcs: &BlockCrcs) -> Option<u64> {
        crcs.iter()
            .find(|(b, c)| {
                self.piece_crcs
                    .get((b / CRC_BLOCK) as usize)
                    .is_some_and(|want| want != c)
            })
            .map(|(b, _)| *b)
    }

    /// Starts the checked prefix over from the file's beginning.
    fn restart_prefix(&mut self) {
        (self.prefix_end, self.prefix_crc) = (0, 0);
        self.piece_crcs.clear();
        self.prefix_nodes.clear();
    }
}

/// One version of a grid file (its id, size, mtime and checksum), open for reading.
pub struct RemoteFile {
    pub path: String,
    pub key: FileKey,
    pub size: u64,
    id: i64,
    mode: u32,
    mtime_ns: i64,
    private: bool,
    expect: Vec<Digest>,
    /// The catalog's CRC32C of the file, when it has one.
    expect_crc: Option<u32>,
    replicas: Vec<grid::types::ReplicaInfo>,
    state: Mutex<State>,
    changed: Condvar,
    me: Weak<RemoteFile>,
    cache: Arc<Cache>,
}

/// Bytes per CRC of an extent's [`BlockCrcs`]: the planner's alignment, so that the checked
/// prefix of a file can continue in an extent fetched with other bounds after an eviction.
const CRC_BLOCK: u64 = 256 << 10;

/// Pieces of a file whose CRCs are kept to check data fetched again (4 bytes each: 64 MiB
/// for a file of 4 TiB); beyond it, such data is checked by its blocks' CRCs only.
const MAX_PIECES: u64 = 16 << 20;

/// An extent's CRC32Cs: (start, CRC) of each piece between multiples of [`CRC_BLOCK`] (and the
/// extent's own bounds), in order; a piece ends where the next starts, the last at the extent's
/// end.
pub type BlockCrcs = Vec<(u64, u32)>;

/// An extent's CRC32Cs and the node its data came from.
pub type Checked = (BlockCrcs, String);

/// Sets an extent's state when its fetch task ends, also by a panic or cancellation.
struct Settle {
    file: Arc<RemoteFile>,
    fetcher: Arc<Fetcher>,
    start: u64,
    /// The extent's CRC32Cs and the node it came from, or why it failed.
    result: Option<Result<Checked, TransferError>>,
}

impl Drop for Settle {
    fn drop(&mut self) {
        let r = self
            .result
            .take()
            .unwrap_or_else(|| Err(TransferError::interrupted()));
        let f = &self.file;
        let mut st = f.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut damaged = Vec::new();
        if let Some(x) = st.extents.get_mut(&self.start) {
            match r {
                Ok(crc) => {
                    x.crc = Some(crc);
                    x.state = ExtState::Ready;
                    damaged = f.check_whole(&mut st, self.start);
                }
                Err(err) => x.state = ExtState::Failed(err),
            }
        }
        let report = st.damage_reported == Some(false);
        if report {
            st.damage_reported = Some(true);
        }
        drop(st);
        // The cache's lock is taken only without the file's (eviction takes them the other
        // way round).
        for (s, e) in damaged {
            f.cache.discard(&f.key, s, e);
        }
        f.changed.notify_all();
        if report {
            let (meta, path) = (self.fetcher.meta.clone(), f.path.clone());
            self.fetcher.rt.spawn(report_damage(meta, path));
        }
    }
}

/// Drop-behind of a file larger than the cache read sequentially: the extents its reader has
/// passed, for the cache to evict at once ([`Cache::evict_extents`]), so their memory serves
/// the read-ahead again instead of fresh memory being touched until the cache is full.
/// Keeping them would gain nothing: read through once more, such a file misses the cache from
/// its start anyway (it cannot hold it whole), and what they would evict is other files' data.
/// Only extents the whole-file check has taken in go (`checked_to`: the checked prefix's end,
/// or everything once the file passed or when the catalog has no CRC): one it still needs
/// stays until the extents before it arrive. (Their CRCs stay in the checked prefix and its
/// pieces.)
fn behind(st: &State, checked_to: u64) -> Vec<(u64, u64)> {
    let Some(passed) = st.planner.passed() else {
        return Vec::new();
    };
    st.extents
        .range(passed.clone())
        .filter(|(_, x)| {
            x.end <= passed.end.min(checked_to)
                && matches!(x.state, ExtState::Ready)
                && x.pins == 0
                && !x.doomed
        })
        .map(|(s, x)| (*s, x.end))
        .collect()
}

/// Asks the metadata server to verify the replicas of `path` where they lie and to repair
/// the damaged ones from a good copy (`haul verify PATH`, as the mounting user, who may read
/// the file). The grid learns of the damage from its own nodes' checksums, never from this
/// client's word; the outcome is logged.
async fn report_damage(meta: MetaClient, path: String) {
    let req = grid::types::VerifyRequest {
        paths: vec![path.clone()],
        recursive: false,
        repair: true,
    };
    let outcome = match meta.verify(req).await {
        Ok(reports) => reports.until_finished(|p| p.finished).await,
        Err(e) => Err(e),
    };
    match outcome {
        Ok(Some(p)) => tracing::warn!(
            path = %path,
            damaged = p.damaged.len(),
            repaired = p.repaired,
            "the metadata server verified the file's replicas after the mismatch"
        ),
        Ok(None) => {
            tracing::warn!(path = %path, "the metadata server stopped before it verified the file's replicas")
        }
        Err(e) => {
            tracing::warn!(path = %path, error = %e, "could not ask the metadata server to verify the file's replicas; run haul verify on it")
        }
    }
}

impl Drop for RemoteFile {
    /// Closed by everyone: what it fetched stays in the cache, cold.
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        let ready = st
            .extents
            .iter_mut()
            .filter(|(_, x)| matches!(x.state, ExtState::Ready))
            .map(|(s, x)| (*s, x.end, x.crc.take()))
            .collect();
        let doomed: Vec<(u64, u64)> = st
            .extents
            .iter()
            .filter(|(_, x)| x.doomed)
            .map(|(s, x)| (*s, x.end))
            .collect();
        for (s, e) in doomed {
            self.cache.discard(&self.key, s, e);
        }
        self.cache.closed(&self.me, &self.key, ready);
    }
}

impl RemoteFile {
    /// Opens `path` for reading: asks the metadata server for its replicas (best first for
    /// `site`) and read capabilities, and adopts what the cache already holds of this version.
    pub async fn open(f: &Fetcher, path: &str) -> Result<Arc<RemoteFile>, TransferError> {
        let reply = f
            .meta
            .open_read(OpenReadRequest {
                paths: vec![path.to_string()],
                client_site: f.site.clone().unwrap_or_default(),
                ..Default::default()
            })
            .await?;
        if let Some(e) = reply.errors.first() {
            return Err(grid::client::from_file_error(e));
        }
        let Some(src) = reply.files.into_iter().next() else {
            return Err(TransferError::not_found(format!("{path}: not a file")));
        };
        let expect = parse_digests(&src.checksum).map_err(|e| {
            TransferError::protocol(format!("{path}: bad checksum in the catalog: {e}"))
        })?;
        let grants = reply
            .nodes
            .iter()
            .map(|n| (n.node.clone(), Cap::of(&n.capability)))
            .collect();
        let expect_crc = expect
            .iter()
            .find(|d| d.algorithm == wire::checksum::Algorithm::Crc32c)
            .and_then(|d| <[u8; 4]>::try_from(d.value.as_slice()).ok())
            .map(u32::from_be_bytes);
        let key = FileKey::new(src.id, src.size, src.mtime_ns, &src.checksum);
        let _opening = f.opening.lock().await;
        if let Some(open) = f.cache.find(&key) {
            return Ok(open);
        }
        let mut planner = Planner::new(src.size, f.tuning);
        let mut extents = BTreeMap::new();
        let now = Instant::now();
        for (s, e, crc) in f.cache.adopt(&key) {
            planner.cover(s, e);
            extents.insert(
                s,
                Extent {
                    end: e,
                    state: ExtState::Ready,
                    crc,
                    last_used: now,
                    read: false,
                    pins: 0,
                    doomed: false,
                },
            );
        }
        let file = Arc::new_cyclic(|me| RemoteFile {
            path: path.to_string(),
            key,
            size: src.size,
            id: src.id,
            mode: src.mode,
            mtime_ns: src.mtime_ns,
            private: src.private,
            expect,
            expect_crc,
            replicas: src.replicas.clone(),
            state: Mutex::new(State {
                planner,
                extents,
                replica: 0,
                failed_nodes: HashSet::new(),
                grants,
                prefix_end: 0,
                prefix_crc: 0,
                prefix_nodes: HashSet::new(),
                verified: false,
                damage_reported: None,
                piece_crcs: Vec::new(),
            }),
            changed: Condvar::new(),
            me: me.clone(),
            cache: f.cache.clone(),
        });
        f.cache.register(&file);
        Ok(file)
    }

    /// Reads up to `len` bytes at `off` (fewer only at the end of the file), fetching what the
    /// cache lacks; blocks the calling (FUSE) thread until the data is there.
    pub fn read(&self, f: &Arc<Fetcher>, off: u64, len: u32) -> Result<Vec<u8>, TransferError> {
        self.read_with(f, off, len, |b| b.to_vec())
    }

    /// As [`Self::read`], handing the bytes to `give` (a FUSE reply) where they lie when they
    /// can: a read within one chunk of an extent in memory (`memstore`) is not copied here.
    pub fn read_with<R>(
        &self,
        f: &Arc<Fetcher>,
        off: u64,
        len: u32,
        give: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, TransferError> {
        let end = off.saturating_add(len as u64).min(self.size);
        if off >= end {
            return Ok(give(&[]));
        }
        let planned = self.plan(off, end - off);
        self.start(f, planned);
        loop {
            let mut st = self.lock();
            // The extents covering [off, end), in order, or what stands in the way.
            let mut pieces = Vec::new();
            let mut at = off;
            let mut missing = None;
            let mut waiting = false;
            while at < end {
                let hit = st
                    .extents
                    .range(..=at)
                    .next_back()
                    .filter(|(_, x)| x.end > at)
                    .map(|(s, x)| (*s, x.end));
                let Some((s, e)) = hit else {
                    missing = Some(at);
                    break;
                };
                match &st.extents[&s].state {
                    ExtState::Ready => pieces.push((s, e)),
                    ExtState::Fetching => waiting = true,
                    ExtState::Failed(err) => {
                        let err = err.clone();
                        let x = &st.extents[&s];
                        // A doomed extent still being read goes with its last read.
                        if x.doomed && x.pins > 0 {
                            return Err(err);
                        }
                        let doomed = x.doomed;
                        st.extents.remove(&s);
                        st.planner.uncover(s);
                        drop(st);
                        if doomed {
                            self.cache.discard(&self.key, s, e);
                        }
                        return Err(err);
                    }
                }
                at = e;
            }
            if let Some(at) = missing {
                // Evicted since it was planned: plan it again.
                drop(st);
                let planned = self.plan(at, end - at);
                self.start(f, planned);
                continue;
            }
            if waiting {
                let (st, _) = self
                    .changed
                    .wait_timeout(st, Duration::from_secs(1))
                    .expect("remote file lock");
                drop(st);
                continue;
            }
            let now = Instant::now();
            for (s, _) in &pieces {
                if let Some(x) = st.extents.get_mut(s) {
                    x.pins += 1;
                    x.last_used = now;
                    x.read |= end >= x.end;
                }
            }
            drop(st);
            let out = self.deliver(f, &pieces, off, end, give);
            let mut st = self.lock();
            let mut gone = Vec::new();
            for &(s, e) in &pieces {
                if let Some(x) = st.extents.get_mut(&s) {
                    x.pins -= 1;
                    if x.pins == 0 && x.doomed {
                        st.extents.remove(&s);
                        st.planner.uncover(s);
                        gone.push((s, e));
                    }
                }
            }
            let passed = if self.size > self.cache.limit() {
                let checked_to = if st.verified || self.expect_crc.is_none() {
                    u64::MAX
                } else {
                    st.prefix_end
                };
                behind(&st, checked_to)
            } else {
                Vec::new()
            };
            drop(st);
            for (s, e) in gone {
                self.cache.discard(&self.key, s, e);
            }
            if !passed.is_empty() {
                self.cache.evict_extents(self, &passed);
            }
            return out;
        }
    }

    /// Hands `[off, end)` of the (pinned) extents `pieces` to `give`: straight from memory
    /// when it lies in one chunk, else copied together.
    fn deliver<R>(
        &self,
        f: &Fetcher,
        pieces: &[(u64, u64)],
        off: u64,
        end: u64,
        give: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, TransferError> {
        if let ([(s, e)], Some(m)) = (pieces, f.cache.memory())
            && let Some(x) = m.get(&f.cache.extent_path(&self.key, *s, *e))
            && let Some(b) = x.slice(off - s, end - off)
        {
            return Ok(give(b));
        }
        self.copy_out(f, pieces, off, end).map(|b| give(&b))
    }

    fn copy_out(
        &self,
        f: &Fetcher,
        pieces: &[(u64, u64)],
        off: u64,
        end: u64,
    ) -> Result<Vec<u8>, TransferError> {
        let mut out = vec![0u8; (end - off) as usize];
        for &(s, e) in pieces {
            let from = off.max(s);
            let to = end.min(e);
            let path = f.cache.extent_path(&self.key, s, e);
            let buf = &mut out[(from - off) as usize..(to - off) as usize];
            f.cache
                .read_at(&path, from - s, buf)
                .map_err(|err| TransferError::local(format!("cache {}: {err}", path.display())))?;
        }
        Ok(out)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("remote file lock")
    }

    /// Plans a read and marks the extents it needs fetched as being fetched, in one step
    /// (no other reader sees them covered and not there).
    fn plan(&self, off: u64, len: u64) -> Vec<(u64, u64)> {
        let mut st = self.lock();
        let planned = st.planner.read(off, len);
        for &(s, e) in &planned {
            st.extents.insert(
                s,
                Extent {
                    end: e,
                    state: ExtState::Fetching,
                    crc: None,
                    last_used: Instant::now(),
                    read: false,
                    pins: 0,
                    doomed: false,
                },
            );
        }
        planned
    }

    /// Starts the fetches of `planned` extents (marked by [`Self::plan`]).
    fn start(&self, f: &Arc<Fetcher>, planned: Vec<(u64, u64)>) {
        if planned.is_empty() {
            return;
        }
        let Some(me) = self.me.upgrade() else { return };
        for (s, e) in planned {
            let (me, f2) = (me.clone(), f.clone());
            f.rt.spawn(async move {
                // Settles the extent however the task ends: a fetch that panicked or was
                // cancelled fails it, so no reader waits for it forever.
                let mut settle = Settle {
                    file: me.clone(),
                    fetcher: f2.clone(),
                    start: s,
                    result: None,
                };
                settle.result = Some(me.fetch(&f2, s, e).await);
            });
        }
    }

    /// Fetches `[s, e)` into the cache, failing over between replicas; its CRC32C (read back
    /// from the cache) and the node it came from.
    async fn fetch(&self, f: &Fetcher, s: u64, e: u64) -> Result<Checked, TransferError> {
        let _slot = f
            .slots
            .acquire()
            .await
            .map_err(|_| TransferError::interrupted())?;
        f.cache.admit(e - s);
        let t = Instant::now();
        let mut r = self.fetch_checked(f, s, e).await;
        // Data the checked prefix already passed must be what passed it: a replica that sends
        // other bytes is damaged (its blocks' CRCs only say they crossed the network intact).
        // It is not read again by this file, and the extent is fetched from the next one, until
        // none is left (then the fetch fails: no healthy replica).
        // (Bounded: each round fails one more node, and a failed node is never picked.)
        for _ in 0..=self.replicas.len() {
            let Ok((crcs, node)) = &r else { break };
            let at = {
                let mut st = self.lock();
                let Some(at) = st.differs_from_checked(crcs) else {
                    break;
                };
                if !st.verified {
                    // The prefix is not known good yet: which copy is damaged is not known
                    // either. The prefix starts over (with the extents at hand), and the
                    // whole-file check decides.
                    st.restart_prefix();
                    break;
                }
                st.failed_nodes.insert(node.clone());
                st.damage_reported.get_or_insert(false);
                at
            };
            tracing::error!(
                path = %self.path,
                node = %node,
                offset = at,
                "data fetched again differs from what passed the file's checksum: a damaged replica; that node is not read again"
            );
            f.cache.delete(&f.cache.extent_path(&self.key, s, e));
            r = self.fetch_checked(f, s, e).await;
        }
        if let Ok((crcs, node)) = &r {
            let st = self.lock();
            if st.verified
                && let Some(at) = st.differs_from_checked(crcs)
            {
                let msg = format!(
                    "{}: data at {at} fetched again from {node} differs from what passed the file's checksum",
                    self.path
                );
                drop(st);
                r = Err(TransferError::integrity(msg));
            }
        }
        tracing::debug!(path = %self.path, start = s, end = e, ms = t.elapsed().as_millis() as u64, ok = r.is_ok(), "extent fetched");
        if r.is_err() {
            // Not kept: what the fetch stored (its CRCs unreadable, or a node sent the wrong
            // length) goes, and its reservation is released.
            f.cache.delete(&f.cache.extent_path(&self.key, s, e));
            f.cache.release(e - s);
        }
        r
    }

    /// Fetches `[s, e)` (its cache room reserved) and reads its pieces' CRCs from the cache.
    async fn fetch_checked(&self, f: &Fetcher, s: u64, e: u64) -> Result<Checked, TransferError> {
        match self.fetch_reserved(f, s, e).await {
            Ok(node) => {
                let path = f.cache.extent_path(&self.key, s, e);
                let mem = f.cache.memory().cloned();
                let crcs = tokio::task::spawn_blocking(move || match mem {
                    Some(m) => match m.get(&path) {
                        Some(x) => Ok(x.block_crcs(s, CRC_BLOCK)),
                        None => Err(TransferError::local(format!(
                            "cache {}: not in memory",
                            path.display()
                        ))),
                    },
                    None => block_crcs(&path, s),
                });
                match crcs.await {
                    Ok(Ok(crc)) => Ok((crc, node)),
                    Ok(Err(err)) => Err(err),
                    Err(_) => Err(TransferError::interrupted()),
                }
            }
            Err(err) => Err(err),
        }
    }

    /// With the extent at `done` just fetched: extends the checked prefix of the file over
    /// the extents now in order after it, and when it reaches the end of the file its CRC32C
    /// must be the catalog's. On a mismatch every extent of the file is dropped (returned, for
    /// the caller to discard from the cache once the state's lock is let go), the one just
    /// fetched fails with an integrity error for its readers, and the nodes the data came from
    /// are not read again by this file. (A sequential reader cannot have read past the extent
    /// that completes the prefix, so it meets the error.)
    fn check_whole(&self, st: &mut State, done: u64) -> Vec<(u64, u64)> {
        let Some(want) = self.expect_crc else {
            return Vec::new();
        };
        if st.verified {
            return Vec::new();
        }
        // The extent holding the prefix's end, from the piece that starts there on.
        while let Some((_, x)) = st
            .extents
            .range(..=st.prefix_end)
            .next_back()
            .filter(|(_, x)| x.end > st.prefix_end)
        {
            let (ExtState::Ready, Some((blocks, node))) = (&x.state, &x.crc) else {
                break;
            };
            let Some(i) = blocks.iter().position(|(b, _)| *b == st.prefix_end) else {
                break;
            };
            let (mut crc, mut at) = (st.prefix_crc, st.prefix_end);
            let keep = self.size.div_ceil(CRC_BLOCK) <= MAX_PIECES;
            let mut pieces = Vec::new();
            for (k, &(b, c)) in blocks.iter().enumerate().skip(i) {
                let to = blocks.get(k + 1).map_or(x.end, |n| n.0);
                debug_assert_eq!(b, at);
                crc = wire::checksum::crc_combine(crc, c, to - b);
                at = to;
                if keep {
                    pieces.push(c);
                }
            }
            let node = node.clone();
            (st.prefix_crc, st.prefix_end) = (crc, at);
            st.prefix_nodes.insert(node);
            st.piece_crcs.extend(pieces);
        }
        if st.prefix_end != self.size {
            return Vec::new();
        }
        let got = st.prefix_crc;
        if got == want {
            st.verified = true;
            return Vec::new();
        }
        let mut from: Vec<String> = st.prefix_nodes.drain().collect();
        from.sort();
        st.restart_prefix();
        tracing::error!(
            path = %self.path,
            nodes = %from.join(","),
            crc32c = format!("{got:08x}"),
            catalog = format!("{want:08x}"),
            "the file read does not match the catalog's checksum: a damaged replica; its data is dropped and those nodes are not read again"
        );
        st.failed_nodes.extend(from);
        st.damage_reported.get_or_insert(false);
        let err = TransferError::integrity(format!(
            "{}: the data read does not match the catalog's CRC32C {want:08x} (got {got:08x}): a damaged replica",
            self.path
        ));
        let mut dropped = Vec::new();
        let starts: Vec<u64> = st.extents.keys().copied().collect();
        for s in starts {
            if s == done {
                if let Some(x) = st.extents.get_mut(&s) {
                    dropped.push((s, x.end));
                    x.state = ExtState::Failed(err.clone());
                    x.crc = None;
                }
                continue;
            }
            let Some(x) = st.extents.get_mut(&s) else {
                continue;
            };
            // Only data that arrived: a fetch still running is checked when the prefix comes
            // round to it again (it restarts from 0), a failed one was never counted.
            if !matches!(x.state, ExtState::Ready) {
                continue;
            }
            if x.pins > 0 {
                // Being read: it goes with its last read, and fails the next ones.
                x.doomed = true;
                x.crc = None;
                x.state = ExtState::Failed(err.clone());
            } else if let Some(x) = st.extents.remove(&s) {
                st.planner.uncover(s);
                dropped.push((s, x.end));
            }
        }
        dropped
    }

    /// Fetches `[s, e)` into the cache, failing over between replicas; the node it came from.
    async fn fetch_reserved(&self, f: &Fetcher, s: u64, e: u64) -> Result<String, TransferError> {
        let dest = f.cache.extent_path(&self.key, s, e);
        let mut tries_here = 0;
        let mut fresh_tried = false;
        let mut resume = false;
        loop {
            let (node, peer, grant) = self.pick(f).await?;
            let pool = f.copy.control_pool.as_ref();
            let pooled = pool.is_some_and(|p| p.has_idle(&peer.host, peer.port));
            let r = self.fetch_from(f, &peer, grant, s, e, &dest, resume).await;
            match r {
                Ok(rtt) => {
                    // The window follows the path the data now comes over (a failover to a
                    // replica farther away needs a larger one).
                    if let Some(rtt) = rtt {
                        self.lock().planner.fit_path(rtt);
                    }
                    return Ok(node);
                }
                Err(err) => {
                    resume = true;
                    // A control connection kept from an earlier session may have died unseen
                    // (the node's close still on its way): once, the node is given a fresh
                    // connection before it counts as failed.
                    if pooled && err.kind() == K::Connect && !fresh_tried {
                        fresh_tried = true;
                        if let Some(p) = pool {
                            p.forget(&peer.host, peer.port);
                        }
                        tracing::info!(path = %self.path, node = %node, error = %err, "fetching again on a new connection");
                        continue;
                    }
                    // Unreachable, refusing, or sending damaged data: the next replica.
                    let switch = matches!(
                        err.kind(),
                        K::Connect
                            | K::Unavailable
                            | K::NotFound
                            | K::PermissionDenied
                            | K::Authentication
                            | K::Unmapped
                            | K::Integrity
                            | K::SourceDamaged
                    );
                    if !switch && err.retryable() && tries_here < 2 {
                        tries_here += 1;
                        tracing::info!(path = %self.path, node = %node, error = %err, "fetching again");
                        continue;
                    }
                    tries_here = 0;
                    fresh_tried = false;
                    let mut st = self.lock();
                    st.failed_nodes.insert(node.clone());
                    drop(st);
                    tracing::warn!(path = %self.path, node = %node, error = %err, "reading from another replica");
                }
            }
        }
    }

    /// The replica to read from now (the first not on a failed node), its address and a
    /// fresh read capability.
    async fn pick(
        &self,
        f: &Fetcher,
    ) -> Result<(String, Peer, Option<SignedGrant>), TransferError> {
        let (node, address, g) = {
            let mut st = self.lock();
            loop {
                let Some(r) = self.replicas.get(st.replica) else {
                    return Err(TransferError::source_damaged(format!(
                        "{}: no healthy replica left to read",
                        self.path
                    )));
                };
                if st.failed_nodes.contains(&r.node) {
                    st.replica += 1;
                    continue;
                }
                break (
                    r.node.clone(),
                    r.address.clone(),
                    st.grants.get(&r.node).cloned(),
                );
            }
        };
        let peer = Peer::parse(&address)?;
        let grant = match g {
            Some(g) => {
                let g = g.renewed(&f.meta, &node, "read", vec![self.id]).await?;
                self.lock().grants.insert(node.clone(), g.clone());
                g.grant()
            }
            None => None,
        };
        Ok((node, peer, grant))
    }

    /// Fetches `[s, e)` from the node at `peer` into `dest`; the round trip to it, when
    /// measured.
    #[allow(clippy::too_many_arguments)]
    async fn fetch_from(
        &self,
        f: &Fetcher,
        peer: &Peer,
        grant: Option<SignedGrant>,
        s: u64,
        e: u64,
        dest: &PathBuf,
        resume: bool,
    ) -> Result<Option<Duration>, TransferError> {
        let whole = s == 0 && e == self.size;
        let mut copy = f.copy.clone();
        let range = (!whole).then_some((s, e - s));
        copy.range = range;
        let mut session = copy.session.clone();
        session.resume = resume;
        // A cache is not a durable copy: no syncs.
        session.fsync = false;
        if self.private {
            session.protect = Protect::Private;
        }
        let listed = ListedFile {
            locator: self.id.to_string(),
            name: dest
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            size: self.size,
            mode: self.mode,
            mtime: Timestamp::from_unix_ns(self.mtime_ns),
            expect: self.expect.clone(),
        };
        let naming: Arc<dyn transfer::service::SinkNaming> = match f.cache.memory() {
            Some(m) => m.naming(dest, e - s),
            None => Arc::new(Destination {
                base: dest.clone(),
                into_dir: false,
            }),
        };
        let (etx, mut erx) = tokio::sync::mpsc::unbounded_channel();
        let ctx = AttemptContext {
            counters: Arc::new(transfer::progress::Counters::default()),
            events: etx,
            cancel: tokio_util::sync::CancellationToken::new(),
        };
        let r = transfer::client::download(
            peer,
            SourceRequest {
                files: vec![listed],
                grant,
                range,
                ..Default::default()
            },
            Arc::new(Root::Ambient),
            naming,
            &copy,
            session,
            ctx,
        )
        .await;
        let mut failed = None;
        while let Ok(ev) = erx.try_recv() {
            if let Event::FileFailed { error, .. } = ev {
                failed = Some(TransferError::from(error));
            }
        }
        let rtt = r?.rtt;
        if let Some(err) = failed {
            return Err(err);
        }
        let held = match f.cache.memory() {
            Some(m) => m
                .get(dest)
                .map(|x| x.len())
                .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound)),
            None => std::fs::metadata(dest).map(|m| m.len()),
        };
        match held {
            Ok(n) if n == e - s => Ok(rtt),
            Ok(n) => Err(TransferError::integrity(format!(
                "{}: fetching {}-{} left {} bytes, expected {}",
                self.path,
                s,
                e,
                n,
                e - s
            ))),
            Err(err) => Err(TransferError::connect(format!(
                "{}: the node did not send {s}-{e} ({err})",
                self.path
            ))),
        }
    }

    /// The extent to evict first (ready, not being read): the least recently used of those
    /// read already, else of the read-ahead not read yet (a reader far behind its read-ahead
    /// must not lose it to the data it has read); with its eviction order.
    pub fn coldest(&self) -> Option<(u64, u64, (bool, Instant))> {
        let st = self.lock();
        st.extents
            .iter()
            .filter(|(_, x)| matches!(x.state, ExtState::Ready) && x.pins == 0)
            .map(|(s, x)| (*s, x.end, (!x.read, x.last_used)))
            .min_by_key(|(_, _, order)| *order)
    }

    /// Drops the extent `[start, end)` from this file (the cache removes its data); false when
    /// it is in use after all, or gone.
    pub fn evict(&self, start: u64, end: u64) -> bool {
        let mut st = self.lock();
        match st.extents.get(&start) {
            Some(x) if matches!(x.state, ExtState::Ready) && x.pins == 0 && x.end == end => {
                st.extents.remove(&start);
                st.planner.uncover(start);
                true
            }
            _ => false,
        }
    }

    /// Fetches of this file still running.
    pub fn busy(&self) -> bool {
        self.lock()
            .extents
            .values()
            .any(|x| matches!(x.state, ExtState::Fetching))
    }
}

/// The CRC32Cs of a cache file holding the extent that starts at `start`, piece by piece
/// between multiples of [`CRC_BLOCK`] (see [`BlockCrcs`]).
fn block_crcs(path: &std::path::Path, start: u64) -> Result<BlockCrcs, TransferError> {
    use std::io::Read;
    let fail =
        |err: std::io::Error| TransferError::local(format!("cache {}: {err}", path.display()));
    let mut file = std::fs::File::open(path).map_err(fail)?;
    let mut buf = vec![0u8; CRC_BLOCK as usize];
    let mut out = Vec::new();
    let mut at = start;
    loop {
        let want = ((at / CRC_BLOCK + 1) * CRC_BLOCK - at) as usize;
        let mut n = 0;
        while n < want {
            match file.read(&mut buf[n..want]).map_err(fail)? {
                0 => break,
                k => n += k,
            }
        }
        if n == 0 {
            return Ok(out);
        }
        out.push((at, wire::checksum::block_crc(&buf[..n])));
        at += n as u64;
        if n < want {
            return Ok(out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn extent(end: u64, state: ExtState, pins: u32) -> Extent {
        Extent {
            end,
            state,
            crc: None,
            last_used: Instant::now(),
            read: true,
            pins,
            doomed: false,
        }
    }

    #[test]
    fn drop_behind_takes_only_passed_extents_that_are_ready_idle_and_checked() {
        let mut planner = Planner::new(64 * MIB, Tuning::with_window(4 * MIB));
        // A reader that read the first 8 MiB in a row (extents of 1 MiB).
        let mut off = 0;
        while off < 8 * MIB {
            planner.read(off, 128 << 10);
            off += 128 << 10;
        }
        let mut extents = BTreeMap::new();
        extents.insert(0, extent(MIB, ExtState::Ready, 0));
        extents.insert(MIB, extent(2 * MIB, ExtState::Ready, 0));
        extents.insert(2 * MIB, extent(3 * MIB, ExtState::Fetching, 0));
        extents.insert(3 * MIB, extent(4 * MIB, ExtState::Ready, 0));
        extents.insert(4 * MIB, extent(5 * MIB, ExtState::Ready, 1));
        // The extent of the last read, and the read-ahead.
        extents.insert(7 * MIB, extent(8 * MIB, ExtState::Ready, 0));
        extents.insert(8 * MIB, extent(9 * MIB, ExtState::Ready, 0));
        let st = State {
            planner,
            extents,
            replica: 0,
            failed_nodes: HashSet::new(),
            grants: HashMap::new(),
            prefix_end: 2 * MIB,
            prefix_crc: 0,
            prefix_nodes: HashSet::new(),
            verified: false,
            piece_crcs: Vec::new(),
            damage_reported: None,
        };
        // The whole-file check has taken in 2 MiB: an extent past it waits for it (the one
        // being fetched before it).
        assert_eq!(behind(&st, st.prefix_end), vec![(0, MIB), (MIB, 2 * MIB)]);
        // Checked (or nothing to check): every passed extent that is there and not being
        // read; never the last read's nor the read-ahead.
        assert_eq!(
            behind(&st, u64::MAX),
            vec![(0, MIB), (MIB, 2 * MIB), (3 * MIB, 4 * MIB)]
        );
    }
}
