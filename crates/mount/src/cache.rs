//! The mount's block cache: extents of grid files, bounded in bytes, as files on local disk
//! under `DIR/files/KEY/START-END` (the extent's bytes) with `--cache DIR`, or else in memory
//! (`memstore`) under the same names. KEY names one version of a grid file (its id,
//! size, mtime and a hash of its catalog checksum), so a file changed in the grid never matches
//! what was cached of the old version. Eviction takes first the extents of files no longer
//! open ("cold": closed since, or found at start in a `--cache` directory kept from an earlier
//! mount), then those of open files read to their end, least recently used first, and the
//! read-ahead not read yet last. A fetch reserves its bytes before it
//! starts; with everything in use the bound is overshot rather than a read refused.

use crate::memstore::MemStore;
use crate::remote::{Checked, RemoteFile};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::SystemTime;

/// One version of a grid file, as a directory name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FileKey(String);

impl FileKey {
    pub fn new(id: i64, size: u64, mtime_ns: i64, checksum: &str) -> Self {
        let h = xxhash_rust::xxh3::xxh3_64(checksum.as_bytes());
        Self(format!("{id}-{size}-{mtime_ns}-{h:016x}"))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

struct Cold {
    path: PathBuf,
    len: u64,
    used: SystemTime,
    /// Its CRC32Cs, for the whole-file check of the next open (`None`: left by an earlier
    /// mount).
    crc: Option<crate::remote::Checked>,
}

struct State {
    /// Bytes of extents on disk and reserved by fetches running.
    used: u64,
    files: Vec<Weak<RemoteFile>>,
    cold: Vec<Cold>,
}

pub struct Cache {
    root: PathBuf,
    limit: u64,
    state: Mutex<State>,
    /// Extents held in memory rather than in files under `root`.
    mem: Option<Arc<MemStore>>,
}

impl Cache {
    /// A cache in `root` (created if missing, made private: mode 700) of at most `limit`
    /// bytes; extents already there are counted, as cold.
    pub fn open(root: &Path, limit: u64) -> std::io::Result<Self> {
        let files = root.join("files");
        std::fs::create_dir_all(&files)?;
        // Cached grid data and write spools are the user's alone: nobody else may read them
        // or plant links in them.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o700))?;
        let mut cold = Vec::new();
        let mut used = 0;
        for dir in std::fs::read_dir(&files)? {
            let dir = dir?;
            if !dir.file_type()?.is_dir() {
                continue;
            }
            for e in std::fs::read_dir(dir.path())? {
                let e = e?;
                let name = e.file_name().to_string_lossy().into_owned();
                let m = e.metadata()?;
                match parse_extent(&name) {
                    Some((s, end)) if m.is_file() && m.len() == end - s => {
                        used += m.len();
                        cold.push(Cold {
                            path: e.path(),
                            len: m.len(),
                            used: m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                            crc: None,
                        });
                    }
                    // A fetch cut short (its part file and ledger) or anything else.
                    _ => {
                        let _ = std::fs::remove_file(e.path());
                    }
                }
            }
        }
        let c = Self {
            root: root.to_path_buf(),
            limit,
            state: Mutex::new(State {
                used: 0,
                files: Vec::new(),
                cold,
            }),
            mem: None,
        };
        c.lock().used = used;
        Ok(c)
    }

    /// A cache of at most `limit` bytes whose extents are held in memory (named as if under
    /// `root`, where nothing is written).
    pub fn in_memory(root: &Path, limit: u64) -> Self {
        Self {
            root: root.to_path_buf(),
            limit,
            state: Mutex::new(State {
                used: 0,
                files: Vec::new(),
                cold: Vec::new(),
            }),
            mem: Some(Arc::new(MemStore::new(limit))),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("cache lock")
    }

    fn dir(&self, key: &FileKey) -> PathBuf {
        self.root.join("files").join(key.as_str())
    }

    pub fn extent_path(&self, key: &FileKey, start: u64, end: u64) -> PathBuf {
        self.dir(key).join(format!("{start}-{end}"))
    }

    /// Where extents are held, when in memory.
    pub fn memory(&self) -> Option<&Arc<MemStore>> {
        self.mem.as_ref()
    }

    /// Reads `buf.len()` bytes at `offset` of the extent stored under `path`.
    pub fn read_at(&self, path: &Path, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        match &self.mem {
            Some(m) => match m.get(path) {
                Some(x) => x.read_at(offset, buf),
                None => Err(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "extent not in memory",
                )),
            },
            None => std::fs::File::open(path)?.read_exact_at(buf, offset),
        }
    }

    /// Drops an extent's data without counting it (it was never counted, or is uncounted by
    /// the caller).
    pub fn delete(&self, path: &Path) {
        match &self.mem {
            Some(m) => m.remove(path),
            None => {
                let _ = std::fs::remove_file(path);
            }
        }
    }

    /// Bytes in the cache now (with fetches' reservations).
    pub fn used(&self) -> u64 {
        self.lock().used
    }

    /// The extents of `key` the cache holds, taken over from the cold ones by the file
    /// opening it.
    pub fn adopt(&self, key: &FileKey) -> Vec<(u64, u64, Option<Checked>)> {
        let dir = self.dir(key);
        let mut st = self.lock();
        let mut out = Vec::new();
        let mut keep = Vec::with_capacity(st.cold.len());
        for c in st.cold.drain(..) {
            if c.path.parent() != Some(dir.as_path()) {
                keep.push(c);
                continue;
            }
            let name = c.path.file_name().unwrap_or_default().to_string_lossy();
            if let Some((s, e)) = parse_extent(&name) {
                out.push((s, e, c.crc));
            }
        }
        st.cold = keep;
        out
    }

    /// The file open now for this version, if any: every open shares it (its extents and
    /// fetches).
    ///
    /// A file whose last reference is going (its drop has not yet handed its extents to the
    /// cold list) is waited for, up to 100 ms: an open of the same version meanwhile would
    /// fetch extents under the same names as the cold ones about to be listed, and a later
    /// eviction of those would delete the new file's data.
    pub fn find(&self, key: &FileKey) -> Option<Arc<RemoteFile>> {
        for _ in 0..100 {
            // Let go of the others only after the lock (a last reference's drop takes it).
            let (open, closing) = {
                let st = self.lock();
                let open: Vec<Arc<RemoteFile>> =
                    st.files.iter().filter_map(|w| w.upgrade()).collect();
                (open, st.files.iter().any(|w| w.strong_count() == 0))
            };
            if let Some(f) = open.into_iter().find(|f| f.key == *key) {
                return Some(f);
            }
            if !closing {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        None
    }

    /// A file opened for reading: its extents count among the warm ones. (A file leaves the
    /// list in its drop, by [`Self::closed`].)
    pub fn register(&self, f: &Arc<RemoteFile>) {
        if self.mem.is_none() {
            let _ = std::fs::create_dir_all(self.dir(&f.key));
        }
        let mut st = self.lock();
        st.files.push(Arc::downgrade(f));
    }

    /// A file closed by everyone (`me`, in its drop): its extents become cold (kept for the
    /// next open), and it leaves the list of open files.
    pub fn closed(
        &self,
        me: &Weak<RemoteFile>,
        key: &FileKey,
        extents: Vec<(u64, u64, Option<Checked>)>,
    ) {
        let now = SystemTime::now();
        let mut st = self.lock();
        st.files.retain(|w| !w.ptr_eq(me));
        for (s, e, crc) in extents {
            st.cold.push(Cold {
                path: self.extent_path(key, s, e),
                len: e - s,
                used: now,
                crc,
            });
        }
    }

    /// Its bound in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Reserves `bytes` for a fetch, evicting what it must to stay within the bound.
    pub fn admit(&self, bytes: u64) {
        // Files looked at while the lock is held are let go only after it: the last
        // reference to a file closing meanwhile runs its drop, which takes the lock.
        let mut seen = Vec::new();
        let mut st = self.lock();
        while st.used + bytes > self.limit {
            if !self.evict_one(&mut st, &mut seen) {
                tracing::debug!(
                    used = st.used,
                    limit = self.limit,
                    "cache over its bound: every extent is in use"
                );
                break;
            }
        }
        st.used += bytes;
        drop(st);
        drop(seen);
    }

    /// An extent found damaged: its data goes.
    pub fn discard(&self, key: &FileKey, start: u64, end: u64) {
        let path = self.extent_path(key, start, end);
        self.remove_extent(&mut self.lock(), &path, end - start);
    }

    /// Evicts these extents of `f` (a sequential reader has passed them: drop-behind), each
    /// if it is still there and not in use; in eviction's lock order (the cache's, then the
    /// file's), so a fetch of the same range planned again cannot lose its data to a late
    /// removal.
    pub fn evict_extents(&self, f: &RemoteFile, extents: &[(u64, u64)]) {
        let mut st = self.lock();
        for &(s, e) in extents {
            if f.evict(s, e) {
                self.remove_extent(&mut st, &self.extent_path(&f.key, s, e), e - s);
            }
        }
    }

    /// A fetch that reserved `bytes` failed: its data is not kept.
    pub fn release(&self, bytes: u64) {
        let mut st = self.lock();
        st.used = st.used.saturating_sub(bytes);
    }

    fn evict_one(&self, st: &mut State, seen: &mut Vec<Arc<RemoteFile>>) -> bool {
        if let Some(i) = st
            .cold
            .iter()
            .enumerate()
            .min_by_key(|(_, c)| c.used)
            .map(|(i, _)| i)
        {
            let c = st.cold.swap_remove(i);
            self.remove_extent(st, &c.path, c.len);
            return true;
        }
        seen.extend(st.files.iter().filter_map(|w| w.upgrade()));
        let coldest = seen
            .iter()
            .filter_map(|f| f.coldest().map(|c| (f, c)))
            .min_by_key(|(_, (_, _, used))| *used);
        if let Some((f, (s, e, _))) = coldest
            && f.evict(s, e)
        {
            self.remove_extent(st, &self.extent_path(&f.key, s, e), e - s);
            return true;
        }
        false
    }

    /// Deletes an extent's data and stops counting its `len` bytes.
    fn remove_extent(&self, st: &mut State, path: &Path, len: u64) {
        self.delete(path);
        st.used = st.used.saturating_sub(len);
    }
}

fn parse_extent(name: &str) -> Option<(u64, u64)> {
    let (s, e) = name.split_once('-')?;
    let (s, e) = (s.parse().ok()?, e.parse().ok()?);
    (e > s).then_some((s, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extents_left_by_an_earlier_mount_are_counted_cold_and_adopted_by_their_file() {
        let dir = tempfile::tempdir().unwrap();
        let key = FileKey::new(7, 100, 5, "md5:ab");
        let other = FileKey::new(7, 100, 6, "md5:ab");
        assert_ne!(key, other, "another mtime is another version");
        let kd = dir.path().join("files").join(key.as_str());
        std::fs::create_dir_all(&kd).unwrap();
        std::fs::write(kd.join("0-10"), [1u8; 10]).unwrap();
        std::fs::write(kd.join("10-30"), [2u8; 5]).unwrap(); // short: not an extent
        std::fs::write(kd.join(".0-10.haul-part"), b"x").unwrap();
        let c = Cache::open(dir.path(), 1000).unwrap();
        assert_eq!(c.used(), 10);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "the cache is private");
        assert!(!kd.join("10-30").exists() && !kd.join(".0-10.haul-part").exists());
        assert!(c.adopt(&other).is_empty());
        assert_eq!(c.adopt(&key), vec![(0, 10, None)]);
        assert!(c.adopt(&key).is_empty(), "adopted once");
    }

    #[test]
    fn reservations_evict_the_coldest_first_and_stay_within_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let c = Cache::open(dir.path(), 25).unwrap();
        let key = FileKey::new(1, 30, 0, "");
        std::fs::create_dir_all(c.dir(&key)).unwrap();
        for (s, e) in [(0u64, 10u64), (10, 20)] {
            c.admit(e - s);
            std::fs::write(c.extent_path(&key, s, e), vec![0u8; (e - s) as usize]).unwrap();
        }
        c.closed(&Weak::new(), &key, vec![(0, 10, None)]);
        std::thread::sleep(std::time::Duration::from_millis(5));
        c.closed(&Weak::new(), &key, vec![(10, 20, None)]);
        assert_eq!(c.used(), 20);
        c.admit(10);
        assert_eq!(c.used(), 20, "one extent made room");
        assert!(!c.extent_path(&key, 0, 10).exists(), "the older went");
        assert!(c.extent_path(&key, 10, 20).exists());
        c.release(10);
        assert_eq!(c.used(), 10);
    }
}
