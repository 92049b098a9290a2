//! The FUSE file system: each kernel request as calls to the metadata server (names,
//! attributes, xattrs, permissions: checked there for the mounting user's certificate, never
//! only by the kernel) and to the storage nodes (file data: `remote` for reads, the write
//! spool for writes). Requests run on several FUSE threads and block on the async runtime;
//! every call to the metadata server has a deadline, so an unreachable server is ETIMEDOUT or
//! ENOTCONN, never a hung program.
//!
//! Writes go to a local spool file (any offset: random writes, appends and rewrites all work)
//! and become a new grid file when the file is closed (`flush`, whose error `close` returns):
//! uploaded, verified by the node, and then visible, replacing an older version at once.
//! Until then only this mount sees the new file.
//!
//! Where the kernel allows it (FUSE passthrough: Linux 6.13, with its timestamps that change
//! on every write, and `CAP_SYS_ADMIN`), the kernel reads and writes a spool itself: the
//! program's writes go straight into the spool file and never through this process. Such a
//! spool's changes are noticed by its status (size, mtime, ctime) instead of by its writes.
//! The kernel refuses a passthrough open of a file open in another mode, so a spool of a
//! file open for reading from the grid meanwhile is written through this process.

use crate::errno;
use crate::ids::Ids;
use crate::inodes::{self, Inodes, ROOT};
use crate::remote::{Fetcher, RemoteFile};
use fuser::{
    AccessFlags, BackingId, Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use grid::types::Entry;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use transfer::TransferError;
use transfer::client::Location;
use wire::checksum::Algorithm;
use wire::error::ErrorKind as K;
use wire::known_crcs::{CrcRecorder, KnownCrcs};

/// Grid xattr names are the part after `user.`; this one is made up by the mount: the
/// replicas of a file, one `node site state` per line.
const WHERE_XATTR: &str = "user.haul.where";
/// Entries per page of a directory listing: a large directory is read page by page as the
/// program reads it.
const LIST_PAGE: u32 = 2000;
/// Block size reported by stat: programs size their buffers by it (`cat`, `cp`).
const BLKSIZE: u32 = 1 << 20;
/// Files from this size on are read with direct I/O (when the kernel allows mmap of such
/// files): each read is copied once, from the block cache into the program's buffer, and
/// not also into the kernel's page cache (a `cat` of a 2 GiB file on loopback, side by side:
/// 1.3 against 1.7 CPU s/GiB of the mount, and a quarter less time). Smaller files keep the
/// page cache, where programs that read them in small pieces are served without a request to
/// the mount each time (4 KiB reads of a cached file through direct I/O: 195 MB/s).
const DIRECT_READ_FROM: u64 = 8 << 20;

/// A file being written: its spool, where it goes, and whether it changed since the last
/// upload.
struct Spool {
    file: File,
    local: PathBuf,
    grid_path: String,
    mode: u32,
    dirty: bool,
    /// Removed while open: nothing is uploaded.
    unlinked: bool,
    /// Its name was taken over by a rename onto it (another file is there now).
    displaced: bool,
    /// Set by utimensat while open: the upload carries it.
    mtime: Option<SystemTime>,
    /// Write handles open on it. Changed only under this spool's lock: the release that
    /// takes it to zero retires the spool, and an open that finds it retired starts afresh.
    opens: u32,
    /// Closed by its last handle: out of `pending`, its local file gone.
    retired: bool,
    /// Counts changes (data, size, mode, time): an upload that ran while it moved leaves the
    /// spool dirty, for the next close.
    generation: u64,
    /// Held through an upload, so one spool's uploads do not overlap; the spool's own lock
    /// is not (a lookup, stat or write meanwhile does not wait for the upload).
    uploading: Arc<Mutex<()>>,
    /// The CRC of each block as it was written: the upload sends the blocks it covers with
    /// `sendfile` and never reads the spool to checksum them.
    crcs: CrcRecorder,
    /// The kernel reads and writes this spool itself (FUSE passthrough): every handle of it
    /// is opened with this backing file, and its writes never come to this process.
    backing: Option<Arc<BackingId>>,
    /// The spool file's status when last looked at (passthrough spools: a change of it is a
    /// write this process did not see).
    seen: Option<FileStamp>,
    /// The size and CRC32C of its bytes when it was last clean (fetched from the grid, or
    /// uploaded): a passthrough spool that looks unchanged at a close is compared with them.
    clean: Option<(u64, u32)>,
}

/// The size and CRC32C of `file`'s bytes (`None` if it cannot be read).
fn file_crc(file: &File) -> Option<(u64, u32)> {
    let len = file.metadata().ok()?.len();
    let mut buf = vec![0u8; 1 << 20];
    let (mut crc, mut off) = (0u32, 0u64);
    while off < len {
        match file.read_at(&mut buf, off) {
            Ok(0) | Err(_) => return None,
            Ok(n) => {
                crc = wire::checksum::crc32c_append(crc, &buf[..n]);
                off += n as u64;
            }
        }
    }
    Some((len, crc))
}

/// What tells that a file changed without seeing the change: its size, mtime and ctime in
/// nanoseconds. (On Linux 6.13 and later a write after a `stat` always moves ctime:
/// multigrain timestamps.)
type FileStamp = (u64, i64, i64);

fn stamp(f: &File) -> Option<FileStamp> {
    let m = f.metadata().ok()?;
    Some((
        m.len(),
        m.mtime() * 1_000_000_000 + m.mtime_nsec(),
        m.ctime() * 1_000_000_000 + m.ctime_nsec(),
    ))
}

impl Spool {
    /// Its data or size changed: the next close uploads it.
    fn changed(&mut self) {
        self.dirty = true;
        self.generation += 1;
    }

    /// Writes `data` at `offset` of the spool file.
    fn write_at(&mut self, data: &[u8], offset: u64) -> std::io::Result<()> {
        match self.file.write_all_at(data, offset) {
            Ok(()) => {
                self.crcs.write(offset, data);
                self.changed();
                Ok(())
            }
            Err(e) => {
                // Some of it may be written: what the file holds is not known any more.
                self.crcs.give_up();
                Err(e)
            }
        }
    }

    /// A passthrough spool the kernel wrote since it was last looked at has changed (any
    /// spool whose status cannot be read counts as changed).
    fn notice_kernel_writes(&mut self) {
        if self.backing.is_none() {
            return;
        }
        let now = stamp(&self.file);
        if now.is_none() || now != self.seen {
            self.seen = now;
            self.changed();
        }
    }

    /// Truncates (or extends) the spool file to `size`.
    fn set_len(&mut self, size: u64) -> std::io::Result<()> {
        let r = self.file.set_len(size);
        match &r {
            Ok(()) => {
                self.crcs.set_len(size);
                self.changed();
            }
            Err(_) => self.crcs.give_up(),
        }
        r
    }
}

/// A spool ready to be sent: its local file, grid path, the block CRCs recorded as it was
/// written, and whether the kernel wrote it (passthrough).
struct Outgoing {
    local: PathBuf,
    path: String,
    crcs: Option<Arc<KnownCrcs>>,
    passthrough: bool,
}

enum Handle {
    Read(Arc<RemoteFile>),
    /// An empty grid file (it has no replica).
    Empty,
    Write(Arc<Mutex<Spool>>),
    Dir(Arc<Mutex<DirList>>),
}

struct DirList {
    path: String,
    /// Entries read so far: name, kind, inode number to show.
    entries: Vec<(String, FileType, u64)>,
    after: String,
    more: bool,
}

pub struct Settings {
    pub root: String,
    pub attr_ttl: Duration,
    pub meta_timeout: Duration,
    pub spool_dir: PathBuf,
    /// Every file through the kernel's page cache (`--page-cache`): no direct I/O.
    pub page_cache: bool,
    /// Let the kernel write spools itself where it can (FUSE passthrough).
    pub passthrough: bool,
    pub grid: grid::copy::GridOptions,
}

pub struct MountFs {
    f: Arc<Fetcher>,
    s: Settings,
    ids: Ids,
    inodes: Mutex<Inodes>,
    attrs: Mutex<HashMap<String, (Entry, Instant)>>,
    /// Open handles, each with the inode it counts in `plain_opens` (if it does).
    handles: Mutex<HashMap<u64, (Handle, Option<u64>)>>,
    /// Files open without passthrough, by inode, from before their open is answered until
    /// their release: the kernel refuses (EIO) a passthrough open of an inode open in
    /// another mode, so a spool made for one of these is written through this process.
    /// Counted up only under the `pending` lock, under which spools are added there.
    plain_opens: Mutex<HashMap<u64, u32>>,
    /// Spools may be passed through (negotiated at init; off after the kernel refused one).
    passthrough: AtomicBool,
    next_fh: AtomicU64,
    /// Files written through this mount and not yet uploaded, by grid path.
    pending: Mutex<HashMap<String, Arc<Mutex<Spool>>>>,
    spools: AtomicU64,
    /// The file version each inode was last opened for reading at.
    versions: Mutex<HashMap<u64, crate::cache::FileKey>>,
    /// The kernel maps files opened with direct I/O (FUSE_DIRECT_IO_ALLOW_MMAP, Linux 6.6),
    /// so large reads and all writes use it.
    direct: bool,
}

type Res<T> = Result<T, Errno>;

impl MountFs {
    pub fn new(f: Arc<Fetcher>, s: Settings, me: String) -> Self {
        let root = s.root.clone();
        Self {
            f,
            s,
            ids: Ids::new(me),
            inodes: Mutex::new(Inodes::new(&root)),
            attrs: Mutex::new(HashMap::new()),
            handles: Mutex::new(HashMap::new()),
            plain_opens: Mutex::new(HashMap::new()),
            passthrough: AtomicBool::new(false),
            next_fh: AtomicU64::new(1),
            pending: Mutex::new(HashMap::new()),
            spools: AtomicU64::new(0),
            versions: Mutex::new(HashMap::new()),
            direct: false,
        }
    }

    /// Open flags of a write handle: direct I/O where the kernel allows it (each write is a
    /// request to the mount anyway, without writeback caching; this saves copying it into
    /// the page cache too).
    fn write_open_flags(&self) -> FopenFlags {
        if self.direct {
            FopenFlags::FOPEN_DIRECT_IO
        } else {
            FopenFlags::empty()
        }
    }

    /// Runs a call to the metadata server (or a node) with the deadline.
    fn call<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T, TransferError>>,
    ) -> Result<T, TransferError> {
        let t = self.s.meta_timeout;
        self.f
            .rt
            .block_on(async { tokio::time::timeout(t, fut).await })
            .unwrap_or_else(|_| {
                Err(TransferError::stalled(format!(
                    "the metadata server did not answer within {t:?}"
                )))
            })
    }

    /// The errno for `e`, logged once with the operation and path (a lookup of a name that
    /// is not there is no error).
    fn fail(&self, op: &str, path: &str, e: TransferError) -> Errno {
        let errno = errno::of_kind(e.kind());
        if !(e.kind() == K::NotFound && matches!(op, "lookup" | "getattr")) {
            tracing::warn!(op, path, errno = %errno_name(errno), "{}", e);
        }
        errno
    }

    fn path(&self, ino: INodeNo) -> Res<String> {
        self.inodes
            .lock()
            .expect("inodes lock")
            .path(ino.0)
            .ok_or(Errno::ESTALE)
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> Res<String> {
        let name = name.to_str().ok_or(Errno::EINVAL)?;
        if name.is_empty() || name == "." || name == ".." || name.contains('/') {
            return Err(Errno::EINVAL);
        }
        Ok(inodes::child(&self.path(parent)?, name))
    }

    fn remember(&self, e: &Entry, path: &str) {
        self.attrs
            .lock()
            .expect("attrs lock")
            .insert(path.to_string(), (e.clone(), Instant::now()));
    }

    fn forget_attr(&self, path: &str) {
        let mut a = self.attrs.lock().expect("attrs lock");
        a.remove(path);
        a.remove(&parent_of(path));
    }

    fn forget_tree(&self, path: &str) {
        let prefix = format!("{path}/");
        let mut a = self.attrs.lock().expect("attrs lock");
        a.retain(|p, _| p != path && !p.starts_with(&prefix));
        a.remove(&parent_of(path));
    }

    /// The entry at `path`: from the attribute cache while it is fresh, else asked.
    fn entry(&self, op: &str, path: &str) -> Res<Entry> {
        if let Some((e, at)) = self.attrs.lock().expect("attrs lock").get(path)
            && at.elapsed() < self.s.attr_ttl
        {
            return Ok(e.clone());
        }
        let e = self
            .call(self.f.meta.stat(path))
            .map_err(|e| self.fail(op, path, e))?;
        self.remember(&e, path);
        Ok(e)
    }

    /// The entry at `path`, which must be a directory (else ENOTDIR).
    fn directory(&self, op: &str, path: &str) -> Res<Entry> {
        match self.entry(op, path)? {
            e if e.is_dir => Ok(e),
            _ => Err(Errno::ENOTDIR),
        }
    }

    fn attr_of(&self, ino: u64, e: &Entry) -> FileAttr {
        let mtime = UNIX_EPOCH + Duration::from_nanos(e.mtime_ns.max(0) as u64);
        FileAttr {
            ino: INodeNo(ino),
            size: e.size,
            blocks: e.size.div_ceil(512),
            atime: mtime,
            mtime,
            ctime: mtime,
            crtime: mtime,
            kind: if e.is_dir {
                FileType::Directory
            } else {
                FileType::RegularFile
            },
            perm: (e.mode & 0o7777) as u16,
            nlink: if e.is_dir { 2 } else { 1 },
            uid: self.ids.uid_of(&e.owner),
            gid: self.ids.gid_of(&e.group, &e.owner),
            rdev: 0,
            blksize: BLKSIZE,
            flags: 0,
        }
    }

    fn spool_attr(&self, ino: u64, sp: &Spool) -> Res<FileAttr> {
        let m = sp.file.metadata().map_err(|e| errno::of_io(&e))?;
        let mtime = sp.mtime.or_else(|| m.modified().ok()).unwrap_or(UNIX_EPOCH);
        Ok(FileAttr {
            ino: INodeNo(ino),
            size: m.len(),
            blocks: m.len().div_ceil(512),
            atime: mtime,
            mtime,
            ctime: mtime,
            crtime: mtime,
            kind: FileType::RegularFile,
            perm: (sp.mode & 0o7777) as u16,
            nlink: 1,
            uid: self.ids.uid,
            gid: self.ids.gid,
            rdev: 0,
            blksize: BLKSIZE,
            flags: 0,
        })
    }

    fn pending(&self, path: &str) -> Option<Arc<Mutex<Spool>>> {
        self.pending
            .lock()
            .expect("pending lock")
            .get(path)
            .cloned()
    }

    /// The spool that stands for `path` now: the one of the write handle `fh`, or one with
    /// changes not uploaded yet. A spool already uploaded (closed, its release still on the
    /// way) no longer does: what the grid holds is the file, and changes go there.
    fn live_spool(&self, fh: Option<FileHandle>, path: &str) -> Option<Arc<Mutex<Spool>>> {
        if let Some(sp) = fh.and_then(|fh| self.write_handle(fh)) {
            return Some(sp);
        }
        self.pending(path).filter(|sp| {
            let mut g = sp.lock().expect("spool lock");
            g.notice_kernel_writes();
            g.dirty
        })
    }

    /// A new handle; `plain`: the inode it was counted open without passthrough under
    /// (`count_plain`), uncounted at its release.
    fn add_handle(&self, h: Handle, plain: Option<u64>) -> FileHandle {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles
            .lock()
            .expect("handles lock")
            .insert(fh, (h, plain));
        FileHandle(fh)
    }

    fn write_handle(&self, fh: FileHandle) -> Option<Arc<Mutex<Spool>>> {
        match self.handles.lock().expect("handles lock").get(&fh.0) {
            Some((Handle::Write(s), _)) => Some(s.clone()),
            _ => None,
        }
    }

    /// Answers an open of spool `sp` (inode `ino`): passed through with its backing file, or
    /// with a handle counted plain (the caller counted it).
    fn reply_write_open(
        &self,
        sp: Arc<Mutex<Spool>>,
        backing: Option<Arc<BackingId>>,
        ino: u64,
        reply: ReplyOpen,
    ) {
        match backing {
            // Every handle of a passthrough spool is passed through with its one backing file
            // (the kernel refuses any other open of the inode).
            Some(b) => {
                let fh = self.add_handle(Handle::Write(sp), None);
                reply.opened_passthrough(fh, FopenFlags::empty(), &b)
            }
            None => {
                let fh = self.add_handle(Handle::Write(sp), Some(ino));
                reply.opened(fh, self.write_open_flags())
            }
        }
    }

    /// `ino` is being opened without passthrough (call under the `pending` lock).
    fn count_plain(&self, ino: u64) {
        *self
            .plain_opens
            .lock()
            .expect("plain opens lock")
            .entry(ino)
            .or_default() += 1;
    }

    fn uncount_plain(&self, ino: u64) {
        let mut plain = self.plain_opens.lock().expect("plain opens lock");
        if let Some(n) = plain.get_mut(&ino) {
            *n -= 1;
            if *n == 0 {
                plain.remove(&ino);
            }
        }
    }

    /// Adds the new spool `sp` of inode `ino` to `pending` (its guard) under `path`, passed
    /// through if it may be (`pass_through`), else with its first handle counted plain.
    /// Returns it, and its backing file if passed through.
    fn add_pending(
        &self,
        pending: &mut HashMap<String, Arc<Mutex<Spool>>>,
        path: &str,
        mut sp: Spool,
        ino: u64,
        open_backing: impl FnOnce(&File) -> std::io::Result<BackingId>,
    ) -> (Arc<Mutex<Spool>>, Option<Arc<BackingId>>) {
        if !self.pass_through(&mut sp, ino, open_backing) {
            self.count_plain(ino);
        }
        let backing = sp.backing.clone();
        let sp = Arc::new(Mutex::new(sp));
        pending.insert(path.to_string(), sp.clone());
        (sp, backing)
    }

    /// Makes the new spool `sp` of inode `ino` a passthrough spool if the kernel may write it
    /// itself: passthrough is on and `ino` is not open in another mode. Call under the
    /// `pending` lock, before `sp` is added there; `open_backing` is the reply's. Returns
    /// whether it did; if not, the caller counts the handle as plain.
    fn pass_through(
        &self,
        sp: &mut Spool,
        ino: u64,
        open_backing: impl FnOnce(&File) -> std::io::Result<BackingId>,
    ) -> bool {
        if !self.passthrough.load(Ordering::Relaxed)
            || self
                .plain_opens
                .lock()
                .expect("plain opens lock")
                .contains_key(&ino)
        {
            return false;
        }
        match open_backing(&sp.file) {
            Ok(id) => {
                sp.backing = Some(Arc::new(id));
                // Its writes will not be seen: no record of them, and its changes noticed
                // by its status from now on.
                sp.crcs.give_up();
                sp.seen = stamp(&sp.file);
                true
            }
            // Not allowed (no CAP_SYS_ADMIN), or not for files there (a stacked file system too
            // deep): never will be.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EPERM | libc::EBUSY | libc::EINVAL | libc::EOPNOTSUPP)
                ) =>
            {
                if self.passthrough.swap(false, Ordering::Relaxed) {
                    tracing::info!(error = %e, "the kernel refused to pass a spool through (FUSE passthrough needs CAP_SYS_ADMIN and a spool directory on a file system it can stack on); files are written through this process");
                }
                false
            }
            Err(e) => {
                tracing::warn!(path = %sp.grid_path, error = %e, "cannot pass the spool through; written through this process");
                false
            }
        }
    }

    /// A new spool for `grid_path`; with `from`, holding that grid file's current data.
    fn new_spool(&self, grid_path: &str, mode: u32, from: Option<&Entry>) -> Res<Spool> {
        let n = self.spools.fetch_add(1, Ordering::Relaxed);
        let local = self.s.spool_dir.join(format!("spool-{n}"));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&local)
            .map_err(|e| {
                tracing::warn!(path = grid_path, error = %e, "cannot make a write spool");
                errno::of_io(&e)
            })?;
        let mut crcs = CrcRecorder::new(self.s.grid.copy.session.block_len());
        let mut copy = || -> Res<(u64, u32)> {
            let (mut off, mut crc) = (0, 0);
            if from.is_some_and(|e| e.size > 0) {
                let rf = self
                    .f
                    .rt
                    .block_on(RemoteFile::open(&self.f, grid_path))
                    .map_err(|err| self.fail("open", grid_path, err))?;
                // To the size of the version opened (the cached entry may be older).
                while off < rf.size {
                    let chunk = rf
                        .read(&self.f, off, 16 << 20)
                        .map_err(|err| self.fail("open", grid_path, err))?;
                    if chunk.is_empty() {
                        break;
                    }
                    file.write_all_at(&chunk, off)
                        .map_err(|err| errno::of_io(&err))?;
                    crcs.write(off, &chunk);
                    crc = wire::checksum::crc32c_append(crc, &chunk);
                    off += chunk.len() as u64;
                }
            }
            Ok((off, crc))
        };
        let clean = match copy() {
            Ok(c) => from.is_some().then_some(c),
            Err(e) => {
                let _ = std::fs::remove_file(&local);
                return Err(e);
            }
        };
        Ok(Spool {
            file,
            local,
            grid_path: grid_path.to_string(),
            mode,
            dirty: from.is_none(),
            unlinked: false,
            displaced: false,
            mtime: None,
            opens: 1,
            retired: false,
            generation: 0,
            uploading: Arc::new(Mutex::new(())),
            crcs,
            backing: None,
            seen: None,
            clean,
        })
    }

    /// Uploads a spool that changed (its lock held throughout): it becomes the grid file at
    /// its path (a new version, replacing the old at once), with its checksums recorded.
    fn upload(&self, sp: &mut Spool) -> Res<()> {
        sp.notice_kernel_writes();
        if !sp.dirty || sp.unlinked {
            return Ok(());
        }
        let out = Self::ready_to_upload(sp);
        let path = out.path.clone();
        sp.clean = self.send_spool(out)?;
        sp.dirty = false;
        self.forget_attr(&path);
        Ok(())
    }

    /// Uploads a spool that changed for a close or fsync, holding its lock only around the
    /// upload, not through it: a lookup or stat of the file meanwhile is answered from the
    /// spool. A change made while the upload ran (another process's chmod, a write through
    /// another handle, a rename) is uploaded again before the close returns (up to three
    /// times; then the close fails with EIO and the spool stays dirty). A concurrent upload of
    /// the same spool waits for this one.
    fn flush_spool(&self, sp: &Mutex<Spool>) -> Res<()> {
        let uploading = sp.lock().expect("spool lock").uploading.clone();
        let _one = uploading.lock().expect("upload lock");
        let mut last = String::new();
        for _ in 0..3 {
            let (out, generation) = {
                let mut g = sp.lock().expect("spool lock");
                g.notice_kernel_writes();
                if !g.dirty && !g.unlinked && g.backing.is_some() {
                    // Stores through a shared mapping of a passthrough spool move no
                    // timestamp: one that looks unchanged is compared with its bytes when it
                    // was last clean (size and CRC32C, read without the spool's lock held).
                    let clean = g.clean;
                    let file = g.file.try_clone().map_err(|e| errno::of_io(&e))?;
                    drop(g);
                    let same = clean.is_some() && file_crc(&file) == clean;
                    g = sp.lock().expect("spool lock");
                    g.notice_kernel_writes();
                    if !same {
                        g.changed();
                    }
                }
                if !g.dirty || g.unlinked {
                    return Ok(());
                }
                (Self::ready_to_upload(&mut g), g.generation)
            };
            let path = out.path.clone();
            let r = self.send_spool(out);
            self.forget_attr(&path);
            let mut g = sp.lock().expect("spool lock");
            // Written by the kernel while it was sent: its generation moves.
            g.notice_kernel_writes();
            let mut removed = false;
            if r.is_ok() && !g.displaced && (g.unlinked || g.grid_path != path) {
                // Unlinked or renamed away while its upload ran: the copy just made under the
                // old name must not stay there (a rename uploads again under the new name,
                // below). Removed without the spool's lock held. Not when another file was
                // renamed onto the name: that file is there now. (By path: a file another
                // client creates under the old name in this instant would go too.)
                drop(g);
                removed = true;
                if let Err(e) = self.call(self.f.meta.remove(&path, false))
                    && e.kind() != K::NotFound
                {
                    tracing::warn!(path = %path, error = %e, "could not remove the copy uploaded under a name unlinked or renamed meanwhile");
                }
                self.forget_attr(&path);
                g = sp.lock().expect("spool lock");
            }
            // A removal counts as a move: the name may have come back to this spool meanwhile
            // (renamed away and back), and then it must be uploaded again.
            let moved = removed || g.generation != generation || g.grid_path != path;
            match r {
                // Changed while it was sent (the node refuses a file that changed under
                // it): sent again.
                Err(_) if moved => {}
                Err(e) => return Err(e),
                Ok(_) if moved => {}
                Ok(uploaded) => {
                    g.dirty = false;
                    g.clean = uploaded;
                    return Ok(());
                }
            }
            last = path;
        }
        // Still changing after three uploads: the close says its data may not be in the grid.
        tracing::warn!(path = %last, "the file kept changing while it was uploaded; the close reports EIO (close it again once the writers are done)");
        Err(Errno::EIO)
    }

    /// The size and CRC32C the catalog has for the file at `path` (`None` if not known).
    fn grid_crc(&self, path: &str) -> Option<(u64, u32)> {
        let e = self.call(self.f.meta.stat(path)).ok()?;
        let crc = wire::checksum::parse_digests(&e.checksum)
            .ok()?
            .into_iter()
            .find(|d| d.algorithm == Algorithm::Crc32c)?;
        let crc = u32::from_be_bytes(crc.value.as_slice().try_into().ok()?);
        (!e.is_dir).then_some((e.size, crc))
    }

    /// Puts the spool's mode and time on its local file (the upload carries them): its local
    /// path, grid path, and the block CRCs recorded as it was written. (A write after this
    /// moves the spool's generation, and the upload is done again.)
    fn ready_to_upload(sp: &mut Spool) -> Outgoing {
        let _ = std::fs::set_permissions(&sp.local, std::fs::Permissions::from_mode(sp.mode));
        if let Some(t) = sp.mtime {
            let _ = sp.file.set_times(std::fs::FileTimes::new().set_modified(t));
        }
        if sp.backing.is_some() {
            // Not a write: what changes the status after this is.
            sp.seen = stamp(&sp.file);
        }
        Outgoing {
            local: sp.local.clone(),
            path: sp.grid_path.clone(),
            // A passthrough spool's record misses the kernel's writes (a truncation to 0
            // starts it again): none is sent.
            crcs: match sp.backing {
                Some(_) => None,
                None => sp.crcs.snapshot().map(Arc::new),
            },
            passthrough: sp.backing.is_some(),
        }
    }

    /// Uploads a spool's local file to its grid path (see [`Self::upload`]), with the block
    /// CRCs recorded as it was written. Returns, for a passthrough spool, the size and CRC32C
    /// the catalog then has for the file (the version just uploaded: asked at once), which a
    /// close that finds it unchanged compares it with.
    fn send_spool(&self, out: Outgoing) -> Res<Option<(u64, u32)>> {
        let Outgoing {
            local,
            path,
            crcs,
            passthrough,
        } = out;
        let meta = &self.f.meta;
        let src = Location::Local(local);
        let dst = Location::Remote {
            host: meta.addr.host.clone(),
            port: meta.addr.port,
            path: path.clone(),
        };
        let (etx, _erx) = tokio::sync::mpsc::unbounded_channel();
        let ctx = transfer::client::AttemptContext {
            counters: Arc::new(transfer::progress::Counters::default()),
            events: etx,
            cancel: tokio_util::sync::CancellationToken::new(),
        };
        let known = crcs.as_ref().map_or((0, 0), |k| k.known_chunks());
        let grid = grid::copy::GridOptions {
            source_crcs: crcs,
            ..self.s.grid.clone()
        };
        let r = self
            .f
            .rt
            .block_on(grid::copy::copy_unrecorded(meta, &src, &dst, &grid, ctx));
        let r = match r {
            Ok(rep) => match rep.first_failure {
                Some(e) => Err(TransferError::from(e)),
                None => {
                    tracing::debug!(
                        path = %path,
                        bytes = rep.bytes_total,
                        blocks_recorded = known.0,
                        blocks_unrecorded = known.1 - known.0,
                        blocks_unread = rep.blocks_unread,
                        written_by_kernel = passthrough,
                        "uploaded"
                    );
                    Ok(if passthrough {
                        self.grid_crc(&path)
                    } else {
                        None
                    })
                }
            },
            Err(e) => Err(e),
        };
        r.map_err(|e| self.fail("close", &path, e))
    }

    fn reply_entry(&self, path: &str, e: &Entry, reply: ReplyEntry) {
        let ino = self.inodes.lock().expect("inodes lock").learn(path);
        reply.entry(&self.s.attr_ttl, &self.attr_of(ino, e), Generation(0));
    }

    fn xattr_reply(value: &[u8], size: u32, reply: ReplyXattr) {
        if size == 0 {
            reply.size(value.len() as u32);
        } else if (size as usize) < value.len() {
            reply.error(Errno::ERANGE);
        } else {
            reply.data(value);
        }
    }

    fn open_dir_page(&self, d: &mut DirList) -> Res<()> {
        let (page, more) = self
            .call(self.f.meta.list_page(&d.path, &d.after, LIST_PAGE))
            .map_err(|e| self.fail("readdir", &d.path, e))?;
        let now = Instant::now();
        {
            let mut attrs = self.attrs.lock().expect("attrs lock");
            for e in &page {
                attrs.insert(e.path.clone(), (e.clone(), now));
            }
        }
        if let Some(last) = page.last() {
            d.after = base_name(&last.path).to_string();
        }
        let inodes = self.inodes.lock().expect("inodes lock");
        for e in page {
            let kind = if e.is_dir {
                FileType::Directory
            } else {
                FileType::RegularFile
            };
            let ino = inodes.ino(&e.path).unwrap_or(shown_ino(e.id));
            d.entries.push((base_name(&e.path).to_string(), kind, ino));
        }
        d.more = more;
        if !more {
            // Files this mount is writing and has not uploaded yet.
            let pending = self.pending.lock().expect("pending lock");
            for p in pending.keys() {
                if parent_of(p) == d.path {
                    let name = base_name(p).to_string();
                    if !d.entries.iter().any(|(n, _, _)| *n == name) {
                        let ino = inodes.ino(p).unwrap_or(u64::MAX >> 1);
                        d.entries.push((name, FileType::RegularFile, ino));
                    }
                }
            }
        }
        Ok(())
    }
}

/// Whether a write to a file in `dir` always moves its status (size, mtime, ctime) as `fstat`
/// sees it, even a write of the same bytes' length right after a look: Linux 6.13's
/// multigrain timestamps on ext4, xfs, btrfs and tmpfs. A passthrough spool's writes are
/// noticed that way only, so without it spools are not passed through.
fn stamps_move_on_every_write(dir: &Path) -> std::io::Result<bool> {
    let f = tempfile::tempfile_in(dir)?;
    f.write_all_at(&[0; 64], 0)?;
    let mut last = stamp(&f);
    for i in 0..200u64 {
        f.write_all_at(&[1], i % 64)?;
        let now = stamp(&f);
        if now.is_none() || now == last {
            return Ok(false);
        }
        last = now;
    }
    Ok(true)
}

fn parent_of(path: &str) -> String {
    match path.rsplit_once('/') {
        Some(("", _)) | None => "/".into(),
        Some((p, _)) => p.into(),
    }
}

fn base_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The inode number `readdir` shows for an entry the kernel has not looked up: its catalog
/// id, above the numbers the mount hands out.
fn shown_ino(id: i64) -> u64 {
    (1u64 << 40) + id.max(0) as u64
}

fn errno_name(e: Errno) -> String {
    std::io::Error::from_raw_os_error(i32::from(e)).to_string()
}

fn system_time_ns(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

impl fuser::Filesystem for MountFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_readahead(1 << 20);
        let _ = config.set_max_write(1 << 20);
        // O_TRUNC comes with the open: a rewrite starts from an empty spool, instead of a
        // copy of the old file that a separate truncation then empties (and uploads empty).
        if config
            .add_capabilities(fuser::InitFlags::FUSE_ATOMIC_O_TRUNC)
            .is_err()
        {
            tracing::info!(
                "this kernel sends no O_TRUNC with an open: a file rewritten is fetched first"
            );
        }
        if self.s.passthrough {
            let refused = match stamps_move_on_every_write(&self.s.spool_dir) {
                Ok(true) => None,
                Ok(false) => Some(format!(
                    "a write to a file in {} need not move its timestamps (Linux 6.13 on ext4, xfs, btrfs or tmpfs does)",
                    self.s.spool_dir.display()
                )),
                Err(e) => Some(format!(
                    "cannot try the spool directory {}: {e}",
                    self.s.spool_dir.display()
                )),
            };
            match refused {
                None if config
                    .add_capabilities(fuser::InitFlags::FUSE_PASSTHROUGH)
                    .is_ok() =>
                {
                    // Spools may be on a stacked file system themselves (a container's /tmp
                    // on overlayfs).
                    let _ = config.set_max_stack_depth(2);
                    self.passthrough.store(true, Ordering::Relaxed);
                }
                None => tracing::info!(
                    "this kernel cannot pass files through (FUSE passthrough, Linux 6.9): files are written through this process"
                ),
                Some(why) => tracing::info!("{why}: files are written through this process"),
            }
        }
        if self.s.page_cache {
            return Ok(());
        }
        self.direct = config
            .add_capabilities(fuser::InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP)
            .is_ok();
        if !self.direct {
            tracing::info!(
                "this kernel cannot map files opened with direct I/O (Linux 6.6 can): reads and writes go through its page cache"
            );
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let path = match self.child(parent, name) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        if let Some(sp) = self.live_spool(None, &path) {
            let ino = self.inodes.lock().expect("inodes lock").learn(&path);
            let sp = sp.lock().expect("spool lock");
            return match self.spool_attr(ino, &sp) {
                Ok(a) => reply.entry(&self.s.attr_ttl, &a, Generation(0)),
                Err(e) => reply.error(e),
            };
        }
        match self.entry("lookup", &path) {
            Ok(e) => self.reply_entry(&path, &e, reply),
            Err(e) => reply.error(e),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.inodes
            .lock()
            .expect("inodes lock")
            .forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let path = match self.path(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let spool = self.live_spool(fh, &path);
        if let Some(sp) = spool {
            let sp = sp.lock().expect("spool lock");
            return match self.spool_attr(ino.0, &sp) {
                Ok(a) => reply.attr(&self.s.attr_ttl, &a),
                Err(e) => reply.error(e),
            };
        }
        match self.entry("getattr", &path) {
            Ok(e) => reply.attr(&self.s.attr_ttl, &self.attr_of(ino.0, &e)),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let path = match self.path(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        // A file being written: its spool takes the change, its upload carries it. One
        // uploaded already takes only a new size (which its close uploads); the rest goes to
        // the grid.
        // (A truncation without a handle of a file still open for writing goes to its spool.)
        let spool = if size.is_some() {
            fh.and_then(|fh| self.write_handle(fh)).or_else(|| {
                self.pending(&path)
                    .filter(|sp| sp.lock().expect("spool lock").opens > 0)
            })
        } else {
            self.live_spool(fh, &path)
        };
        if let Some(sp) = spool {
            let mut sp = sp.lock().expect("spool lock");
            sp.notice_kernel_writes();
            if let Some(m) = mode {
                sp.mode = m & 0o7777;
                sp.generation += 1;
            }
            if let Some(n) = size {
                let was_uploaded = !sp.dirty;
                if let Err(e) = sp.set_len(n) {
                    return reply.error(errno::of_io(&e));
                }
                // Truncated without a handle after its close uploaded it (`truncate f` right
                // after writing f): the close that would upload it again may be past.
                if fh.is_none()
                    && was_uploaded
                    && let Err(e) = self.upload(&mut sp)
                {
                    return reply.error(e);
                }
            }
            if let Some(t) = mtime {
                sp.generation += 1;
                sp.mtime = Some(match t {
                    TimeOrNow::SpecificTime(t) => t,
                    TimeOrNow::Now => SystemTime::now(),
                });
            }
            return match self.spool_attr(ino.0, &sp) {
                Ok(a) => reply.attr(&self.s.attr_ttl, &a),
                Err(e) => reply.error(e),
            };
        }
        let mut last = None;
        if let Some(n) = size {
            // Truncating a closed file: rewritten as a new version.
            let e = match self.entry("truncate", &path) {
                Ok(e) => e,
                Err(e) => return reply.error(e),
            };
            if e.is_dir {
                return reply.error(Errno::EISDIR);
            }
            if n != e.size {
                let r = self
                    .new_spool(&path, e.mode & 0o7777, (n > 0).then_some(&e))
                    .and_then(|mut sp| {
                        sp.set_len(n).map_err(|e| errno::of_io(&e))?;
                        let r = self.upload(&mut sp);
                        let _ = std::fs::remove_file(&sp.local);
                        r
                    });
                if let Err(e) = r {
                    return reply.error(e);
                }
            }
        }
        if let Some(m) = mode {
            match self.call(self.f.meta.chmod(&path, m & 0o7777)) {
                Ok(e) => last = Some(e),
                Err(e) => return reply.error(self.fail("chmod", &path, e)),
            }
        }
        if uid.is_some() || gid.is_some() {
            // chown to the numbers the entry already shows (cp -p, tar, rsync -a) changes
            // nothing.
            let current = match self.entry("chown", &path) {
                Ok(e) => e,
                Err(e) => return reply.error(e),
            };
            let uid = uid.filter(|u| *u != self.ids.uid_of(&current.owner));
            let gid = gid.filter(|g| *g != self.ids.gid_of(&current.group, &current.owner));
            if uid.is_some() || gid.is_some() {
                let owner = match uid.map(|u| self.ids.user_name(u)) {
                    Some(None) => return reply.error(Errno::EINVAL),
                    Some(Some(n)) => n,
                    None => String::new(),
                };
                let group = match gid.map(|g| self.ids.group_name(g)) {
                    Some(None) => return reply.error(Errno::EINVAL),
                    Some(Some(n)) => n,
                    None => String::new(),
                };
                match self.call(self.f.meta.chown(&path, &owner, &group)) {
                    Ok(e) => last = Some(e),
                    Err(e) => return reply.error(self.fail("chown", &path, e)),
                }
            }
        }
        if let Some(t) = mtime {
            let ns = match t {
                TimeOrNow::SpecificTime(t) => Some(system_time_ns(t)),
                TimeOrNow::Now => None,
            };
            match self.call(self.f.meta.set_mtime(&path, ns)) {
                Ok(e) => last = Some(e),
                Err(e) => return reply.error(self.fail("utimens", &path, e)),
            }
        }
        self.forget_attr(&path);
        let e = match last {
            Some(e) => {
                self.remember(&e, &path);
                e
            }
            None => match self.entry("getattr", &path) {
                Ok(e) => e,
                Err(e) => return reply.error(e),
            },
        };
        reply.attr(&self.s.attr_ttl, &self.attr_of(ino.0, &e));
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let path = match self.child(parent, name) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        match self.call(self.f.meta.mkdir(&path, mode & !umask & 0o7777, false)) {
            Ok(e) => {
                self.forget_attr(&path);
                self.remember(&e, &path);
                self.reply_entry(&path, &e, reply)
            }
            Err(e) => reply.error(self.fail("mkdir", &path, e)),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let path = match self.child(parent, name) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let r = self.call(self.f.meta.remove(&path, false));
        let gone = r.is_ok() || matches!(&r, Err(e) if e.kind() == K::NotFound);
        // A spool stays pending (and its handles' closes upload it) unless the name went.
        let pending = if gone {
            self.pending.lock().expect("pending lock").remove(&path)
        } else {
            self.pending(&path)
        };
        self.forget_attr(&path);
        if gone {
            self.inodes.lock().expect("inodes lock").unlinked(&path);
        }
        match (pending, r) {
            (Some(sp), Err(e)) if e.kind() == K::NotFound => {
                // Written here and never uploaded: it goes with its spool.
                sp.lock().expect("spool lock").unlinked = true;
                reply.ok()
            }
            (Some(sp), Ok(_)) => {
                sp.lock().expect("spool lock").unlinked = true;
                reply.ok()
            }
            (_, Ok(_)) => reply.ok(),
            (_, Err(e)) => reply.error(self.fail("unlink", &path, e)),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let path = match self.child(parent, name) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        if let Err(e) = self.directory("rmdir", &path) {
            return reply.error(e);
        }
        let r = self.call(self.f.meta.remove(&path, false));
        self.forget_tree(&path);
        match r {
            Ok(_) => {
                self.inodes.lock().expect("inodes lock").unlinked(&path);
                reply.ok()
            }
            Err(e) => reply.error(self.fail("rmdir", &path, e)),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let (from, to) = match (self.child(parent, name), self.child(newparent, newname)) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => return reply.error(e),
        };
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            return reply.error(Errno::EINVAL);
        }
        if flags.contains(RenameFlags::RENAME_NOREPLACE) {
            match self.call(self.f.meta.lookup(&to)) {
                Ok(Some(_)) => return reply.error(Errno::EEXIST),
                Ok(None) => {}
                Err(e) => return reply.error(self.fail("rename", &to, e)),
            }
        }
        // Files this mount writes at `from` or below it move with it (their closes upload
        // under the new names); one pending at `to` is replaced and uploads nothing.
        let below = format!("{from}/");
        let has_pending = self
            .pending
            .lock()
            .expect("pending lock")
            .keys()
            .any(|k| *k == from || k.starts_with(&below));
        // The grid entry moves; a file never uploaded yet has none.
        match self.call(self.f.meta.rename(&from, &to)) {
            Ok(_) => {}
            Err(e) if e.kind() == K::NotFound && has_pending => {}
            Err(e) => return reply.error(self.fail("rename", &from, e)),
        }
        let (displaced, moved) = {
            let mut pending = self.pending.lock().expect("pending lock");
            let displaced = pending.remove(&to);
            let keys: Vec<String> = pending
                .keys()
                .filter(|k| **k == from || k.starts_with(&below))
                .cloned()
                .collect();
            let mut moved = Vec::new();
            for k in keys {
                if let Some(sp) = pending.remove(&k) {
                    let new = format!("{to}{}", &k[from.len()..]);
                    pending.insert(new.clone(), sp.clone());
                    moved.push((new, sp));
                }
            }
            (displaced, moved)
        };
        // Spool locks only after the map's (release takes them the other way round).
        if let Some(sp) = displaced {
            let mut g = sp.lock().expect("spool lock");
            g.unlinked = true;
            g.displaced = true;
        }
        for (new, sp) in moved {
            sp.lock().expect("spool lock").grid_path = new;
        }
        self.forget_tree(&from);
        self.forget_tree(&to);
        self.inodes.lock().expect("inodes lock").renamed(&from, &to);
        reply.ok()
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let path = match self.path(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        // Linux truncates a file opened read-only with O_TRUNC too.
        let trunc = flags.0 & libc::O_TRUNC != 0;
        let writing = trunc || !matches!(flags.acc_mode(), OpenAccMode::O_RDONLY);
        // A spool found retired (its last handle is closing) is taken out of `pending` and
        // looked for again; a writer whose spool another writer beat into `pending` joins
        // that one. A few rounds at most, unless something keeps racing.
        let mut made: Option<Spool> = None;
        for round in 0.. {
            if round == 64 {
                if let Some(m) = made.take() {
                    let _ = std::fs::remove_file(&m.local);
                }
                tracing::warn!(path = %path, "open kept racing with other opens and closes");
                return reply.error(Errno::EIO);
            }
            let found = {
                let mut pending = self.pending.lock().expect("pending lock");
                match pending.get(&path).cloned() {
                    Some(sp) => sp,
                    None => match made.take() {
                        // Passed through or not under the same lock as readers are counted
                        // and spools are found.
                        Some(sp) => {
                            let (sp, backing) =
                                self.add_pending(&mut pending, &path, sp, ino.0, |f| {
                                    reply.open_backing(f)
                                });
                            drop(pending);
                            return self.reply_write_open(sp, backing, ino.0, reply);
                        }
                        None if writing => {
                            drop(pending);
                            // A new spool, made without locks held (it may fetch the file).
                            let e = match self.entry("open", &path) {
                                Ok(e) => e,
                                Err(e) => return reply.error(e),
                            };
                            if e.is_dir {
                                return reply.error(Errno::EISDIR);
                            }
                            match self.new_spool(&path, e.mode & 0o7777, (!trunc).then_some(&e)) {
                                Ok(mut sp) => {
                                    sp.dirty = trunc;
                                    made = Some(sp);
                                }
                                Err(err) => return reply.error(err),
                            }
                            continue;
                        }
                        None => {
                            // A reader, counted plain before a spool can be made.
                            self.count_plain(ino.0);
                            break;
                        }
                    },
                }
            };
            // Written here and not closed by its writer (or not uploaded): share its spool.
            let mut g = found.lock().expect("spool lock");
            if g.retired {
                drop(g);
                let mut pending = self.pending.lock().expect("pending lock");
                if pending.get(&path).is_some_and(|p| Arc::ptr_eq(p, &found)) {
                    pending.remove(&path);
                }
                continue;
            }
            if let Some(m) = made.take() {
                let _ = std::fs::remove_file(&m.local);
            }
            if trunc && let Err(e) = g.set_len(0) {
                return reply.error(errno::of_io(&e));
            }
            g.opens += 1;
            let backing = g.backing.clone();
            drop(g);
            if backing.is_none() {
                self.count_plain(ino.0);
            }
            return self.reply_write_open(found, backing, ino.0, reply);
        }
        // A reader of the grid's file, counted plain until its release (or its failure here).
        let plain = Some(ino.0);
        let fail = |e: Errno, reply: ReplyOpen| {
            self.uncount_plain(ino.0);
            reply.error(e)
        };
        let e = match self.entry("open", &path) {
            Ok(e) => e,
            Err(e) => return fail(e, reply),
        };
        if e.is_dir {
            return fail(Errno::EISDIR, reply);
        }
        if e.size == 0 {
            return reply.opened(self.add_handle(Handle::Empty, plain), FopenFlags::empty());
        }
        match self.f.rt.block_on(RemoteFile::open(&self.f, &path)) {
            Ok(rf) => {
                // The kernel's page cache of this inode is kept only when the version opened
                // is the one opened last time (a rewrite of the same size must not read old
                // pages).
                let same = self
                    .versions
                    .lock()
                    .expect("versions lock")
                    .insert(ino.0, rf.key.clone())
                    .is_some_and(|k| k == rf.key);
                let keep = if self.direct && rf.size >= DIRECT_READ_FROM {
                    FopenFlags::FOPEN_DIRECT_IO
                } else if same {
                    FopenFlags::FOPEN_KEEP_CACHE
                } else {
                    FopenFlags::empty()
                };
                reply.opened(self.add_handle(Handle::Read(rf), plain), keep)
            }
            Err(err) => fail(self.fail("open", &path, err), reply),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let path = match self.child(parent, name) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        // The directory must exist and be one (the upload at close would make parents).
        if let Err(e) = self.directory("create", &parent_of(&path)) {
            return reply.error(e);
        }
        let sp = match self.new_spool(&path, mode & !umask & 0o7777, None) {
            Ok(s) => s,
            Err(e) => return reply.error(e),
        };
        let ino = self.inodes.lock().expect("inodes lock").learn(&path);
        let attr = match self.spool_attr(ino, &sp) {
            Ok(a) => a,
            Err(e) => return reply.error(e),
        };
        let (sp, backing) = {
            let mut pending = self.pending.lock().expect("pending lock");
            self.add_pending(&mut pending, &path, sp, ino, |f| reply.open_backing(f))
        };
        self.forget_attr(&path);
        let ttl = &self.s.attr_ttl;
        match backing {
            Some(b) => {
                let fh = self.add_handle(Handle::Write(sp), None);
                reply.created_passthrough(ttl, &attr, Generation(0), fh, FopenFlags::empty(), &b)
            }
            None => {
                let fh = self.add_handle(Handle::Write(sp), Some(ino));
                reply.created(ttl, &attr, Generation(0), fh, self.write_open_flags())
            }
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        enum H {
            R(Arc<RemoteFile>),
            W(Arc<Mutex<Spool>>),
            Empty,
        }
        let h = match self.handles.lock().expect("handles lock").get(&fh.0) {
            Some((Handle::Read(r), _)) => H::R(r.clone()),
            Some((Handle::Write(w), _)) => H::W(w.clone()),
            Some((Handle::Empty, _)) => H::Empty,
            _ => return reply.error(Errno::EBADF),
        };
        match h {
            H::Empty => reply.data(&[]),
            H::R(rf) => {
                let mut reply = Some(reply);
                let read = rf.read_with(&self.f, offset, size, |d| {
                    if let Some(r) = reply.take() {
                        r.data(d)
                    }
                });
                if let (Err(e), Some(r)) = (read, reply.take()) {
                    r.error(self.fail("read", &rf.path, e))
                }
            }
            H::W(sp) => {
                let sp = sp.lock().expect("spool lock");
                let mut buf = vec![0u8; size as usize];
                let mut n = 0;
                while n < buf.len() {
                    match sp.file.read_at(&mut buf[n..], offset + n as u64) {
                        Ok(0) => break,
                        Ok(k) => n += k,
                        Err(e) => return reply.error(errno::of_io(&e)),
                    }
                }
                reply.data(&buf[..n])
            }
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let Some(sp) = self.write_handle(fh) else {
            return reply.error(Errno::EBADF);
        };
        let mut sp = sp.lock().expect("spool lock");
        match sp.write_at(data, offset) {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => {
                tracing::warn!(path = %sp.grid_path, error = %e, "cannot write the spool");
                reply.error(errno::of_io(&e))
            }
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        match self.write_handle(fh) {
            Some(sp) => match self.flush_spool(&sp) {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            },
            None => reply.ok(),
        }
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.flush(_req, ino, fh, LockOwner(0), reply)
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let h = self.handles.lock().expect("handles lock").remove(&fh.0);
        if let Some((_, Some(ino))) = &h {
            self.uncount_plain(*ino);
        }
        if let Some((Handle::Write(sp), _)) = h {
            // The last handle of the spool: whatever flush could not upload is dropped (its
            // error went to close).
            let mut g = sp.lock().expect("spool lock");
            g.opens = g.opens.saturating_sub(1);
            if g.opens == 0 {
                g.notice_kernel_writes();
                g.retired = true;
                let mut pending = self.pending.lock().expect("pending lock");
                if pending
                    .get(&g.grid_path)
                    .is_some_and(|p| Arc::ptr_eq(p, &sp))
                {
                    pending.remove(&g.grid_path);
                }
                if g.dirty && !g.unlinked {
                    tracing::warn!(path = %g.grid_path, "closed without its data reaching the grid; dropped");
                }
                let _ = std::fs::remove_file(&g.local);
            }
        }
        reply.ok()
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let path = match self.path(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        if let Err(e) = self.directory("opendir", &path) {
            return reply.error(e);
        }
        let mut d = DirList {
            path,
            entries: Vec::new(),
            after: String::new(),
            more: true,
        };
        // The first page now: a directory the user may not list is refused at opendir, as
        // on a local file system.
        if let Err(e) = self.open_dir_page(&mut d) {
            return reply.error(e);
        }
        reply.opened(
            self.add_handle(Handle::Dir(Arc::new(Mutex::new(d))), None),
            FopenFlags::empty(),
        );
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let d = match self.handles.lock().expect("handles lock").get(&fh.0) {
            Some((Handle::Dir(d), _)) => d.clone(),
            _ => return reply.error(Errno::EBADF),
        };
        let mut d = d.lock().expect("dir lock");
        // Offsets: 1 and 2 are "." and "..", then entry i is 3 + i.
        let mut off = offset;
        if off < 1 {
            if reply.add(ino, 1, FileType::Directory, ".") {
                return reply.ok();
            }
            off = 1;
        }
        if off < 2 {
            if reply.add(INodeNo(ROOT), 2, FileType::Directory, "..") {
                return reply.ok();
            }
            off = 2;
        }
        let mut i = (off - 2) as usize;
        loop {
            while i >= d.entries.len() && d.more {
                if let Err(e) = self.open_dir_page(&mut d) {
                    return reply.error(e);
                }
            }
            let Some((name, kind, ino)) = d.entries.get(i) else {
                return reply.ok();
            };
            if reply.add(INodeNo(*ino), 3 + i as u64, *kind, name) {
                return reply.ok();
            }
            i += 1;
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.handles.lock().expect("handles lock").remove(&fh.0);
        reply.ok()
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.call(self.f.meta.df()) {
            Ok(df) => {
                let up = df.nodes.iter().filter(|n| n.up);
                let (cap, free) = up.fold((0u64, 0u64), |(c, f), n| (c + n.capacity, f + n.free));
                let b = BLKSIZE as u64;
                reply.statfs(cap / b, free / b, free / b, 0, 0, BLKSIZE, 255, BLKSIZE)
            }
            Err(e) => reply.error(self.fail("statfs", &self.s.root, e)),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let path = match self.path(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let name = name.to_string_lossy();
        if name == WHERE_XATTR {
            return reply.error(Errno::EACCES);
        }
        let Some(grid_name) = name.strip_prefix("user.") else {
            return reply.error(Errno::EOPNOTSUPP);
        };
        match self.call(self.f.meta.xattr_set(&path, grid_name, value)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.fail("setxattr", &path, e)),
        }
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let path = match self.path(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let name = name.to_string_lossy();
        if name == WHERE_XATTR {
            return match self.call(self.f.meta.where_is(&path)) {
                Ok(w) => {
                    let mut s = String::new();
                    for r in &w.replicas {
                        s += &format!("{} {} {}\n", r.node, r.site, r.state);
                    }
                    Self::xattr_reply(s.as_bytes(), size, reply)
                }
                Err(e) => reply.error(self.fail("getxattr", &path, e)),
            };
        }
        let Some(grid_name) = name.strip_prefix("user.") else {
            return reply.error(Errno::ENODATA);
        };
        match self.call(self.f.meta.xattr_get(&path, grid_name)) {
            Ok(Some(v)) => Self::xattr_reply(&v, size, reply),
            Ok(None) => reply.error(Errno::ENODATA),
            Err(e) => reply.error(self.fail("getxattr", &path, e)),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let path = match self.path(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        match self.call(self.f.meta.xattr_list(&path)) {
            Ok(list) => {
                let mut out = Vec::new();
                for x in list {
                    out.extend_from_slice(format!("user.{}", x.name).as_bytes());
                    out.push(0);
                }
                out.extend_from_slice(WHERE_XATTR.as_bytes());
                out.push(0);
                Self::xattr_reply(&out, size, reply)
            }
            Err(e) => reply.error(self.fail("listxattr", &path, e)),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let path = match self.path(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let name = name.to_string_lossy();
        let Some(grid_name) = name.strip_prefix("user.").filter(|_| name != WHERE_XATTR) else {
            return reply.error(Errno::EOPNOTSUPP);
        };
        match self.call(self.f.meta.xattr_get(&path, grid_name)) {
            Ok(None) => return reply.error(Errno::ENODATA),
            Ok(Some(_)) => {}
            Err(e) => return reply.error(self.fail("removexattr", &path, e)),
        }
        match self.call(self.f.meta.xattr_remove(&path, grid_name)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.fail("removexattr", &path, e)),
        }
    }

    /// No ioctls (programs probe some, e.g. for reflinks): ENOTTY, as a plain file system.
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY)
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        // A courtesy answer from the mode bits; the metadata server decides every operation.
        let path = match self.path(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        if self.pending(&path).is_some() || mask == AccessFlags::F_OK {
            return reply.ok();
        }
        let e = match self.entry("access", &path) {
            Ok(e) => e,
            Err(e) => return reply.error(e),
        };
        let bits = if e.owner == self.ids.me {
            (e.mode >> 6) & 7
        } else {
            ((e.mode >> 3) | e.mode) & 7
        };
        let want = (mask.bits() & 7) as u32;
        if want & !bits == 0 {
            reply.ok()
        } else {
            reply.error(Errno::EACCES)
        }
    }
}
