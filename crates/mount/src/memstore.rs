//! The block cache's extents in memory (the default without `--cache DIR`): a fetch's data
//! session hands its verified blocks straight to an extent here (the engine's
//! [`MemoryTarget`]), instead of writing a cache file that is then read back for its CRCs and
//! again for every read. Extents are held in 2 MiB chunks taken from a pool that keeps freed
//! chunks for the next extents: memory once touched is reused, not given back to the kernel
//! and faulted in again. (Chunks advised as transparent huge pages were tried and
//! dropped: two loopback reads of 2 GiB took 5-6 CPU s with them, 2.4-2.7 before.) A read of up to 1 MiB at a 1 MiB boundary of an extent lies in one
//! chunk and is replied from it as it lies. An extent's last, partial chunk is allocated to
//! its size (a 256 KiB header read does not hold 2 MiB) and not pooled. Extents are named by
//! the same paths as on disk (nothing is created there), so the cache's bookkeeping does not
//! care where they live.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use transfer::service::{MemoryFile, MemoryTarget, SinkNaming};
use transfer::store::{Destination, Root};
use wire::error::{ErrorInfo, ErrorKind};
use wire::ranges::RangeSet;

/// Bytes per chunk: a transparent huge page.
pub const CHUNK: usize = 2 << 20;

/// `len` bytes at `offset` of an extent, chunk by chunk: (chunk index, offset in the chunk,
/// offset in the bytes, length) of each piece.
fn spans(offset: u64, len: usize) -> impl Iterator<Item = (usize, usize, usize, usize)> {
    let mut done = 0;
    std::iter::from_fn(move || {
        (done < len).then(|| {
            let at = offset as usize + done;
            let (i, o) = (at / CHUNK, at % CHUNK);
            let n = (CHUNK - o).min(len - done);
            let span = (i, o, done, n);
            done += n;
            span
        })
    })
}

/// A chunk of an extent's bytes: [`CHUNK`] of them, or for an extent's last piece exactly
/// its size.
type Chunk = Box<[u8]>;

/// Freed whole chunks kept for reuse, up to a bound.
struct ChunkPool {
    free: Mutex<Vec<Chunk>>,
    keep: usize,
}

impl ChunkPool {
    /// A chunk for `len` bytes of an extent (at most [`CHUNK`]).
    fn get(&self, len: usize) -> Chunk {
        if len == CHUNK
            && let Some(c) = self.free.lock().expect("chunk pool").pop()
        {
            return c;
        }
        // Fresh zeroed memory: the kernel's pages, zeroed as they are first touched.
        vec![0u8; len].into_boxed_slice()
    }

    fn put(&self, chunks: impl IntoIterator<Item = Chunk>) {
        let mut free = self.free.lock().expect("chunk pool");
        for c in chunks {
            if c.len() == CHUNK && free.len() < self.keep {
                free.push(c);
            }
        }
    }
}

/// A fetched extent: its bytes in chunks, immutable once stored.
pub struct MemExtent {
    len: u64,
    chunks: Vec<Chunk>,
    pool: Arc<ChunkPool>,
}

impl MemExtent {
    /// Its bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `len` bytes at `offset` (from the extent's start) where they lie, when they lie in
    /// one chunk.
    pub fn slice(&self, offset: u64, len: u64) -> Option<&[u8]> {
        let (i, o) = (
            (offset / CHUNK as u64) as usize,
            (offset % CHUNK as u64) as usize,
        );
        let len = usize::try_from(len).ok()?;
        (offset.checked_add(len as u64)? <= self.len && o + len <= CHUNK)
            .then(|| &self.chunks[i][o..o + len])
    }

    /// Copies `buf.len()` bytes at `offset` (from the extent's start) into `buf`.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        if offset + buf.len() as u64 > self.len {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "read beyond the end of the extent",
            ));
        }
        for (i, o, d, n) in spans(offset, buf.len()) {
            buf[d..d + n].copy_from_slice(&self.chunks[i][o..o + n]);
        }
        Ok(())
    }

    /// The CRC32C of the extent's pieces between multiples of `piece` in the file (the extent
    /// starts at `start` in it): (file offset, CRC) of each, in order.
    pub fn block_crcs(&self, start: u64, piece: u64) -> Vec<(u64, u32)> {
        let mut out = Vec::new();
        let end = start + self.len;
        let mut at = start;
        while at < end {
            let to = ((at / piece + 1) * piece).min(end);
            let mut crc = 0;
            for (i, o, _, n) in spans(at - start, (to - at) as usize) {
                crc = wire::checksum::crc32c_append(crc, &self.chunks[i][o..o + n]);
            }
            out.push((at, crc));
            at = to;
        }
        out
    }
}

impl Drop for MemExtent {
    fn drop(&mut self) {
        self.pool.put(self.chunks.drain(..));
    }
}

/// Every extent held in memory, by its cache path.
pub struct MemStore {
    extents: Mutex<HashMap<PathBuf, Arc<MemExtent>>>,
    pool: Arc<ChunkPool>,
}

impl MemStore {
    /// A store whose pool keeps about `limit` bytes of free chunks at most.
    pub fn new(limit: u64) -> Self {
        Self {
            extents: Mutex::new(HashMap::new()),
            pool: Arc::new(ChunkPool {
                free: Mutex::new(Vec::new()),
                keep: (limit / CHUNK as u64) as usize + 1,
            }),
        }
    }

    /// The extent stored under `path`.
    pub fn get(&self, path: &Path) -> Option<Arc<MemExtent>> {
        self.extents
            .lock()
            .expect("memory store")
            .get(path)
            .cloned()
    }

    /// Drops the extent under `path` (its chunks go back to the pool once no read holds it).
    pub fn remove(&self, path: &Path) {
        let gone = self.extents.lock().expect("memory store").remove(path);
        drop(gone);
    }

    /// The naming of a data session fetching the extent to be stored under `path`: it
    /// receives into memory, and the extent is stored when the session commits it.
    /// `len` is the extent's size: a node announcing another is refused before anything is
    /// allocated.
    pub fn naming(self: &Arc<Self>, path: &Path, len: u64) -> Arc<dyn SinkNaming> {
        Arc::new(MemNaming {
            dest: Destination {
                base: path.to_path_buf(),
                into_dir: false,
            },
            target: MemTarget {
                store: self.clone(),
                path: path.to_path_buf(),
                len,
            },
        })
    }
}

struct MemNaming {
    dest: Destination,
    target: MemTarget,
}

impl SinkNaming for MemNaming {
    fn map(&self, announced: &str) -> Result<PathBuf, ErrorInfo> {
        Ok(self.dest.map(announced))
    }

    fn dest_is_dir(&self) -> bool {
        false
    }

    fn memory(&self) -> Option<&dyn MemoryTarget> {
        Some(&self.target)
    }

    /// An extent is a file: a node announcing a directory is refused (nothing is created).
    fn make_dir(&self, _root: &Root, announced: &str, _mode: u32) -> Result<(), ErrorInfo> {
        Err(ErrorInfo::new(
            ErrorKind::Integrity,
            format!("{announced}: a directory where a file's bytes were asked for"),
        )
        .retryable(false))
    }
}

struct MemTarget {
    store: Arc<MemStore>,
    path: PathBuf,
    /// The extent's size, as asked of the node.
    len: u64,
}

impl MemoryTarget for MemTarget {
    fn open(&self, announced: &str, size: u64) -> Result<Arc<dyn MemoryFile>, ErrorInfo> {
        if size != self.len {
            return Err(ErrorInfo::new(
                ErrorKind::Integrity,
                format!(
                    "{announced}: the node announced {size} bytes for an extent of {}",
                    self.len
                ),
            )
            .retryable(false));
        }
        let n = (size as usize).div_ceil(CHUNK);
        Ok(Arc::new(Receiving {
            store: self.store.clone(),
            path: self.path.clone(),
            len: size,
            chunks: Mutex::new(Chunks {
                chunks: (0..n).map(|_| None).collect(),
                written: RangeSet::new(),
            }),
        }))
    }
}

/// An extent being received: chunks are taken from the pool as the first byte of each
/// arrives.
struct Receiving {
    store: Arc<MemStore>,
    path: PathBuf,
    len: u64,
    chunks: Mutex<Chunks>,
}

struct Chunks {
    chunks: Vec<Option<Chunk>>,
    /// The bytes written so far.
    written: RangeSet,
}

impl Chunks {
    /// Takes every chunk out (for the pool, or for the stored extent); later writes and
    /// reads fail (a write still queued when the sink discards the file).
    fn take(&mut self) -> std::vec::IntoIter<Option<Chunk>> {
        self.written = RangeSet::new();
        std::mem::take(&mut self.chunks).into_iter()
    }
}

impl Receiving {
    /// Its chunks (a writer that panicked holding them left them as they were).
    fn chunks(&self) -> std::sync::MutexGuard<'_, Chunks> {
        self.chunks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl MemoryFile for Receiving {
    fn write_at(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        if offset + data.len() as u64 > self.len {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "a block beyond the end of the extent",
            ));
        }
        let mut chunks = self.chunks();
        for (i, o, d, n) in spans(offset, data.len()) {
            let size = CHUNK.min(self.len as usize - i * CHUNK);
            let Some(slot) = chunks.chunks.get_mut(i) else {
                return Err(std::io::Error::other(
                    "a block for an extent already committed or given up",
                ));
            };
            let c = slot.get_or_insert_with(|| self.store.pool.get(size));
            c[o..o + n].copy_from_slice(&data[d..d + n]);
        }
        chunks.written.insert(offset..offset + data.len() as u64);
        Ok(())
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let chunks = self.chunks();
        if !chunks
            .written
            .contains_range(offset..offset + buf.len() as u64)
        {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "read of bytes not received",
            ));
        }
        for (i, o, d, n) in spans(offset, buf.len()) {
            let Some(Some(c)) = chunks.chunks.get(i) else {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "read of bytes not received",
                ));
            };
            buf[d..d + n].copy_from_slice(&c[o..o + n]);
        }
        Ok(())
    }

    fn commit(&self) -> Result<(), ErrorInfo> {
        let mut chunks = self.chunks();
        let whole = chunks.written.contains_range(0..self.len);
        let taken: Vec<Option<Chunk>> = chunks.take().collect();
        drop(chunks);
        // The sink commits only a file whose every byte was written and verified: a byte
        // missing here is a bug, refused rather than served as zeros.
        if !whole || taken.iter().any(Option::is_none) {
            self.store.pool.put(taken.into_iter().flatten());
            return Err(ErrorInfo::new(
                ErrorKind::Io,
                format!("{}: committed with bytes missing", self.path.display()),
            ));
        }
        let extent = Arc::new(MemExtent {
            len: self.len,
            chunks: taken.into_iter().flatten().collect(),
            pool: self.store.pool.clone(),
        });
        let old = self
            .store
            .extents
            .lock()
            .expect("memory store")
            .insert(self.path.clone(), extent);
        drop(old);
        Ok(())
    }

    fn discard(&self) {
        let taken = self.chunks().take();
        self.store.pool.put(taken.flatten());
    }
}

impl Drop for Receiving {
    fn drop(&mut self) {
        let taken = self
            .chunks
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        self.store.pool.put(taken.flatten());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receive(store: &Arc<MemStore>, path: &Path, data: &[u8], block: usize) {
        let naming = store.naming(path, data.len() as u64);
        assert!(
            naming.memory().unwrap().open("x", 1 << 40).is_err(),
            "a size other than the extent's is refused"
        );
        let f = naming
            .memory()
            .unwrap()
            .open("x", data.len() as u64)
            .unwrap();
        // Out of order, one block twice (a resend).
        let blocks: Vec<usize> = (0..data.len()).step_by(block).collect();
        for &b in blocks.iter().rev().chain(blocks.first()) {
            let e = (b + block).min(data.len());
            f.write_at(b as u64, &data[b..e]).unwrap();
        }
        let mut back = vec![0u8; data.len()];
        f.read_at(0, &mut back).unwrap();
        assert_eq!(back, data);
        f.commit().unwrap();
    }

    #[test]
    fn an_extent_received_in_blocks_reads_back_and_checks_piece_by_piece() {
        let store = Arc::new(MemStore::new(64 << 20));
        let data: Vec<u8> = (0..(CHUNK * 3 + 1000))
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        let path = Path::new("/mem/files/k/4194304-10486760");
        receive(&store, path, &data, 1_000_000);
        let x = store.get(path).unwrap();
        let mut buf = vec![0u8; 300_000];
        x.read_at(CHUNK as u64 - 100_000, &mut buf).unwrap();
        assert_eq!(
            buf,
            &data[CHUNK - 100_000..CHUNK + 200_000],
            "a read across chunks"
        );
        assert!(x.read_at(data.len() as u64 - 10, &mut buf).is_err());
        assert_eq!(
            x.slice(CHUNK as u64 + 5, 100).unwrap(),
            &data[CHUNK + 5..CHUNK + 105]
        );
        assert!(x.slice(CHUNK as u64 - 5, 100).is_none(), "across chunks");
        assert!(
            x.slice(data.len() as u64 - 10, 11).is_none(),
            "beyond the end"
        );
        let start = 2 * CHUNK as u64;
        let piece = 256 << 10;
        let crcs = x.block_crcs(start, piece);
        assert_eq!(crcs.len(), 3 * CHUNK / piece as usize + 1);
        for (k, &(at, crc)) in crcs.iter().enumerate() {
            let o = (at - start) as usize;
            let e = crcs
                .get(k + 1)
                .map_or(data.len(), |n| (n.0 - start) as usize);
            assert_eq!(crc, wire::checksum::block_crc(&data[o..e]));
        }
        // Unaligned: pieces end at multiples of the piece size in the file.
        let crcs = x.block_crcs(1000, piece);
        let first = piece as usize - 1000;
        assert_eq!(crcs[0], (1000, wire::checksum::block_crc(&data[..first])));
        store.remove(path);
        assert!(store.get(path).is_none());
        drop(x);
        assert_eq!(
            store.pool.free.lock().unwrap().len(),
            3,
            "whole chunks are reused (the tail is not)"
        );
    }

    #[test]
    fn an_extent_not_received_whole_is_never_stored() {
        let store = Arc::new(MemStore::new(64 << 20));
        let len = CHUNK as u64 + 600_000;
        let path = Path::new("/mem/files/k/0-2697152");
        let naming = store.naming(path, len);
        let f = naming.memory().unwrap().open("x", len).unwrap();
        f.write_at(0, &[1u8; 1000]).unwrap();
        f.write_at(CHUNK as u64, &[1u8; 600_000]).unwrap();
        assert!(f.write_at(len - 1, &[1u8; 2]).is_err(), "beyond its end");
        assert!(
            f.read_at(500, &mut [0u8; 1000]).is_err(),
            "not all received"
        );
        assert!(f.commit().is_err(), "every chunk there, not every byte");
        assert!(store.get(path).is_none());
        let g = naming.memory().unwrap().open("x", len).unwrap();
        g.write_at(0, &[1u8; 1000]).unwrap();
        g.discard();
        assert!(
            g.write_at(CHUNK as u64, &[1u8; 1000]).is_err(),
            "a write queued behind the discard fails, it does not panic"
        );
        assert!(g.read_at(0, &mut [0u8; 10]).is_err());
        drop((f, g));
        assert_eq!(
            store.pool.free.lock().unwrap().len(),
            1,
            "the one whole chunk taken came back"
        );
    }
}
