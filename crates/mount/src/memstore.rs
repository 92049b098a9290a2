//! The block cache's extents in memory (the default without `--cache DIR`): a fetch's data
//! session hands its verified blocks straight to an extent here (the engine's
//! [`MemoryTarget`]), instead of writing a cache file that is then read back for its CRCs and
//! again for every read. Extents are held in 256 KiB chunks taken from a pool that keeps
//! freed chunks for the next extents: memory once touched is reused, not given back to the
//! kernel and faulted in again. Extents are named by the same paths as on disk (nothing is
//! created there), so the cache's bookkeeping does not care where they live.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use transfer::service::{MemoryFile, MemoryTarget, SinkNaming};
use transfer::store::Destination;
use wire::error::{ErrorInfo, ErrorKind};

/// Bytes per chunk: the CRC pieces' size, so a chunk of an aligned extent is one piece.
pub const CHUNK: usize = 256 << 10;

type Chunk = Box<[u8]>;

/// Freed chunks kept for reuse, up to a bound.
struct ChunkPool {
    free: Mutex<Vec<Chunk>>,
    keep: usize,
}

impl ChunkPool {
    fn get(&self) -> Chunk {
        if let Some(c) = self.free.lock().expect("chunk pool").pop() {
            return c;
        }
        vec![0u8; CHUNK].into_boxed_slice()
    }

    fn put(&self, chunks: impl IntoIterator<Item = Chunk>) {
        let mut free = self.free.lock().expect("chunk pool");
        for c in chunks {
            if free.len() >= self.keep {
                break;
            }
            free.push(c);
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
        let mut done = 0;
        while done < buf.len() {
            let at = offset as usize + done;
            let (i, o) = (at / CHUNK, at % CHUNK);
            let n = (CHUNK - o).min(buf.len() - done);
            buf[done..done + n].copy_from_slice(&self.chunks[i][o..o + n]);
            done += n;
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
            let mut o = at - start;
            while o < to - start {
                let (i, k) = ((o as usize) / CHUNK, (o as usize) % CHUNK);
                let n = (CHUNK - k).min((to - start - o) as usize);
                crc = wire::checksum::crc32c_append(crc, &self.chunks[i][k..k + n]);
                o += n as u64;
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
    /// A store whose pool keeps up to `limit` bytes of free chunks.
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
    pub fn naming(self: &Arc<Self>, path: &Path) -> Arc<dyn SinkNaming> {
        Arc::new(MemNaming {
            dest: Destination {
                base: path.to_path_buf(),
                into_dir: false,
            },
            target: MemTarget {
                store: self.clone(),
                path: path.to_path_buf(),
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
}

struct MemTarget {
    store: Arc<MemStore>,
    path: PathBuf,
}

impl MemoryTarget for MemTarget {
    fn open(&self, _announced: &str, size: u64) -> Result<Arc<dyn MemoryFile>, ErrorInfo> {
        let n = (size as usize).div_ceil(CHUNK);
        Ok(Arc::new(Receiving {
            store: self.store.clone(),
            path: self.path.clone(),
            len: size,
            chunks: Mutex::new((0..n).map(|_| None).collect()),
        }))
    }
}

/// An extent being received: chunks are taken from the pool as the first byte of each
/// arrives.
struct Receiving {
    store: Arc<MemStore>,
    path: PathBuf,
    len: u64,
    chunks: Mutex<Vec<Option<Chunk>>>,
}

impl MemoryFile for Receiving {
    fn write_at(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        if offset + data.len() as u64 > self.len {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "a block beyond the end of the extent",
            ));
        }
        let mut chunks = self.chunks.lock().expect("extent chunks");
        let mut done = 0;
        while done < data.len() {
            let at = offset as usize + done;
            let (i, o) = (at / CHUNK, at % CHUNK);
            let n = (CHUNK - o).min(data.len() - done);
            let c = chunks[i].get_or_insert_with(|| self.store.pool.get());
            c[o..o + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
        Ok(())
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let chunks = self.chunks.lock().expect("extent chunks");
        let mut done = 0;
        while done < buf.len() {
            let at = offset as usize + done;
            let (i, o) = (at / CHUNK, at % CHUNK);
            let n = (CHUNK - o).min(buf.len() - done);
            let Some(Some(c)) = chunks.get(i) else {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "read of bytes not received",
                ));
            };
            buf[done..done + n].copy_from_slice(&c[o..o + n]);
            done += n;
        }
        Ok(())
    }

    fn commit(&self) -> Result<(), ErrorInfo> {
        let taken = std::mem::take(&mut *self.chunks.lock().expect("extent chunks"));
        // The sink commits only a file whose every byte was written and verified: a chunk
        // missing here is a bug, refused rather than served as zeros.
        if taken.iter().any(Option::is_none) {
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
        let taken = std::mem::take(&mut *self.chunks.lock().expect("extent chunks"));
        self.store.pool.put(taken.into_iter().flatten());
    }
}

impl Drop for Receiving {
    fn drop(&mut self) {
        let taken = std::mem::take(self.chunks.get_mut().expect("extent chunks"));
        self.store.pool.put(taken.into_iter().flatten());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receive(store: &Arc<MemStore>, path: &Path, data: &[u8], block: usize) {
        let naming = store.naming(path);
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
        let store = Arc::new(MemStore::new(8 << 20));
        let data: Vec<u8> = (0..(CHUNK * 3 + 1000))
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        let path = Path::new("/mem/files/k/524288-1311720");
        receive(&store, path, &data, 100_000);
        let x = store.get(path).unwrap();
        let mut buf = vec![0u8; 300_000];
        x.read_at(200_000, &mut buf).unwrap();
        assert_eq!(buf, &data[200_000..500_000], "a read across chunks");
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
        let crcs = x.block_crcs(start, CHUNK as u64);
        assert_eq!(crcs.len(), 4);
        for (k, &(at, crc)) in crcs.iter().enumerate() {
            let o = (at - start) as usize;
            let e = crcs
                .get(k + 1)
                .map_or(data.len(), |n| (n.0 - start) as usize);
            assert_eq!(crc, wire::checksum::block_crc(&data[o..e]));
        }
        // Unaligned: pieces end at multiples of the piece size in the file.
        let crcs = x.block_crcs(1000, CHUNK as u64);
        assert_eq!(
            crcs[0],
            (1000, wire::checksum::block_crc(&data[..CHUNK - 1000]))
        );
        store.remove(path);
        assert!(store.get(path).is_none());
        drop(x);
        assert_eq!(
            store.pool.free.lock().unwrap().len(),
            4,
            "chunks are reused"
        );
    }

    #[test]
    fn an_extent_not_received_whole_is_never_stored() {
        let store = Arc::new(MemStore::new(8 << 20));
        let path = Path::new("/mem/files/k/0-600000");
        let naming = store.naming(path);
        let f = naming.memory().unwrap().open("x", 600_000).unwrap();
        f.write_at(0, &[1u8; 1000]).unwrap();
        assert!(f.write_at(599_999, &[1u8; 2]).is_err(), "beyond its end");
        assert!(f.read_at(CHUNK as u64, &mut [0u8; 10]).is_err());
        assert!(f.commit().is_err());
        assert!(store.get(path).is_none());
        let g = naming.memory().unwrap().open("x", 600_000).unwrap();
        g.write_at(0, &[1u8; 1000]).unwrap();
        g.discard();
        drop((f, g));
        assert_eq!(
            store.pool.free.lock().unwrap().len(),
            1,
            "the one chunk taken came back"
        );
    }
}
