//! Block CRCs a writer computed while it wrote a file, so that the file's sender need not read
//! it again to checksum it (`haul mount` records them as a program writes into a spool; the
//! upload then sends the spool with `sendfile` and never reads it in user space).
//!
//! [`CrcRecorder`] follows the writes: bytes written at the end of what it has seen extend the
//! CRC of the chunk in progress; a write below that end makes the chunks it touches unknown
//! (their bytes changed, so they are read and checksummed at send time); a write beyond the
//! end (a hole) or a size grown by truncation stops the record, since those bytes were never
//! seen. [`KnownCrcs`] is one moment's record, and answers the CRC of any chunk-aligned block
//! whose chunks are all known.
//!
//! A recorded CRC is a claim about the file, not a check of it: the receiver verifies every
//! block against its CRC and the whole file against its digest, so a record that no longer
//! matches the file (it changed after the snapshot) fails the block or the file, never
//! passes wrong data.

use crate::checksum::{crc_combine, crc32c_append};

/// CRCs of a file's first `len` bytes, chunk by chunk (`None`: that chunk is not known).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KnownCrcs {
    chunk: u64,
    len: u64,
    /// One per chunk of `0..len`; the last covers `len % chunk` bytes when that is not zero.
    crcs: Vec<Option<u32>>,
}

impl KnownCrcs {
    /// Bytes from the file's start the record covers (known or not).
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Chunks whose CRC is known, and all chunks.
    pub fn known_chunks(&self) -> (usize, usize) {
        (self.crcs.iter().flatten().count(), self.crcs.len())
    }

    /// The CRC32C of bytes `offset..offset+len`, when the block starts on a chunk, ends on one
    /// (or at the record's end), lies within the record and every chunk of it is known.
    pub fn block_crc(&self, offset: u64, len: u64) -> Option<u32> {
        let end = offset.checked_add(len)?;
        if len == 0 || !offset.is_multiple_of(self.chunk) || end > self.len {
            return None;
        }
        if !end.is_multiple_of(self.chunk) && end != self.len {
            return None;
        }
        let first = (offset / self.chunk) as usize;
        let last = end.div_ceil(self.chunk) as usize;
        let mut crc = 0u32;
        for (i, c) in self.crcs[first..last].iter().enumerate() {
            let c = (*c)?;
            let start = (first + i) as u64 * self.chunk;
            let piece = self.chunk.min(self.len - start);
            crc = if i == 0 {
                c
            } else {
                crc_combine(crc, c, piece)
            };
        }
        Some(crc)
    }
}

/// Follows the writes into one file from its creation (or from empty) and keeps the CRC of
/// each chunk written in order.
#[derive(Clone, Debug)]
pub struct CrcRecorder {
    chunk: u64,
    /// Complete chunks of `0..end`.
    done: Vec<Option<u32>>,
    /// The chunk in progress (`end % chunk` bytes of it): its CRC so far, `None` if a write
    /// below the end changed it.
    tail: Option<u32>,
    /// The file's size as the writes made it.
    end: u64,
    /// Bytes were written beyond the end, or the size grown: nothing is known any more.
    stopped: bool,
}

impl CrcRecorder {
    /// A recorder for an empty file, in chunks of `chunk` bytes (at least 1).
    pub fn new(chunk: u64) -> Self {
        CrcRecorder {
            chunk: chunk.max(1),
            done: Vec::new(),
            tail: Some(0),
            end: 0,
            stopped: false,
        }
    }

    /// `data` was written at `offset`.
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        if self.stopped || data.is_empty() {
            return;
        }
        if offset > self.end {
            self.give_up();
            return;
        }
        let below = (self.end - offset).min(data.len() as u64) as usize;
        if below > 0 {
            self.forget(offset, offset + below as u64);
        }
        let mut rest = &data[below..];
        while !rest.is_empty() {
            let room = (self.chunk - self.end % self.chunk) as usize;
            let (now, later) = rest.split_at(room.min(rest.len()));
            self.tail = self.tail.map(|c| crc32c_append(c, now));
            self.end += now.len() as u64;
            if self.end.is_multiple_of(self.chunk) {
                self.done.push(self.tail);
                self.tail = Some(0);
            }
            rest = later;
        }
    }

    /// The file was truncated (or extended) to `size`. Emptied, it is known again from
    /// scratch (an `O_TRUNC` open of a file whose record had stopped).
    pub fn set_len(&mut self, size: u64) {
        if size == 0 {
            *self = CrcRecorder::new(self.chunk);
            return;
        }
        if self.stopped || size == self.end {
            return;
        }
        if size > self.end {
            self.give_up();
            return;
        }
        let whole = (size / self.chunk) as usize;
        let cut_inside = !size.is_multiple_of(self.chunk);
        self.done.truncate(whole);
        // The chunk the new end falls in lost bytes: its CRC so far is not known.
        self.tail = if cut_inside { None } else { Some(0) };
        self.end = size;
    }

    /// What is known now.
    pub fn snapshot(&self) -> Option<KnownCrcs> {
        if self.stopped {
            return None;
        }
        let mut crcs = self.done.clone();
        if !self.end.is_multiple_of(self.chunk) {
            crcs.push(self.tail);
        }
        Some(KnownCrcs {
            chunk: self.chunk,
            len: self.end,
            crcs,
        })
    }

    fn forget(&mut self, from: u64, to: u64) {
        let first = (from / self.chunk) as usize;
        let last = to.div_ceil(self.chunk) as usize;
        for i in first..last {
            if let Some(c) = self.done.get_mut(i) {
                *c = None;
            } else {
                self.tail = None;
            }
        }
    }

    /// What the file holds is not known any more (a write that failed part way): nothing is
    /// recorded from now on.
    pub fn give_up(&mut self) {
        self.stopped = true;
        self.done = Vec::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checksum::block_crc;

    fn data(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    /// Writes `file` through the recorder in pieces of `step` bytes, in order.
    fn recorded(file: &[u8], chunk: u64, step: usize) -> KnownCrcs {
        let mut r = CrcRecorder::new(chunk);
        for (i, piece) in file.chunks(step).enumerate() {
            r.write((i * step) as u64, piece);
        }
        r.snapshot().expect("recorded")
    }

    #[test]
    fn sequential_writes_give_every_aligned_block_its_crc() {
        let file = data(10_000, 1);
        // Writes of odd sizes across chunk boundaries.
        let k = recorded(&file, 1024, 333);
        assert_eq!(k.len(), 10_000);
        assert_eq!(k.known_chunks(), (10, 10));
        for (off, len) in [(0, 1024), (1024, 4096), (8192, 10_000 - 8192), (0, 10_000)] {
            let want = block_crc(&file[off..off + len]);
            assert_eq!(
                k.block_crc(off as u64, len as u64),
                Some(want),
                "{off}+{len}"
            );
        }
        // Not aligned, past the end, or empty: not answered.
        assert_eq!(k.block_crc(1, 1024), None);
        assert_eq!(k.block_crc(0, 1000), None);
        assert_eq!(k.block_crc(8192, 4096), None);
        assert_eq!(k.block_crc(0, 0), None);
        assert_eq!(k.block_crc(u64::MAX - 10, 20), None);
    }

    #[test]
    fn a_rewrite_below_the_end_forgets_only_the_chunks_it_touched() {
        let mut file = data(8192, 2);
        let mut r = CrcRecorder::new(1024);
        r.write(0, &file);
        // A header rewritten in place, as netCDF writers do at close.
        let header = data(100, 9);
        file[1000..1100].copy_from_slice(&header);
        r.write(1000, &header);
        let k = r.snapshot().expect("recorded");
        assert_eq!(k.known_chunks(), (6, 8));
        assert_eq!(k.block_crc(0, 1024), None);
        assert_eq!(k.block_crc(1024, 1024), None);
        assert_eq!(k.block_crc(2048, 6144), Some(block_crc(&file[2048..])));
    }

    #[test]
    fn a_write_that_overlaps_the_end_forgets_what_it_changed_and_records_what_it_added() {
        let mut file = data(3000, 3);
        let mut r = CrcRecorder::new(1024);
        r.write(0, &file[..2500]);
        let more = data(1500, 4);
        file.truncate(2400);
        file.extend_from_slice(&more);
        r.write(2400, &more);
        let k = r.snapshot().expect("recorded");
        assert_eq!(k.len(), 3900);
        // The chunk the overlap fell in is unknown, those before and after are known.
        assert_eq!(k.block_crc(0, 2048), Some(block_crc(&file[..2048])));
        assert_eq!(k.block_crc(2048, 1024), None);
        assert_eq!(
            k.block_crc(3072, 3900 - 3072),
            Some(block_crc(&file[3072..]))
        );
    }

    #[test]
    fn a_hole_or_a_grown_size_stops_the_record() {
        let mut r = CrcRecorder::new(1024);
        r.write(0, &data(100, 5));
        r.write(200, &data(100, 5));
        assert_eq!(r.snapshot(), None);
        r.write(300, &data(100, 5));
        assert_eq!(r.snapshot(), None);
        let mut r = CrcRecorder::new(1024);
        r.write(0, &data(100, 5));
        r.set_len(4096);
        assert_eq!(r.snapshot(), None);
    }

    #[test]
    fn truncation_keeps_the_whole_chunks_below_the_new_end() {
        let file = data(5000, 6);
        let mut r = CrcRecorder::new(1024);
        r.write(0, &file);
        r.set_len(2500);
        let k = r.snapshot().expect("recorded");
        assert_eq!(k.len(), 2500);
        assert_eq!(k.block_crc(0, 2048), Some(block_crc(&file[..2048])));
        assert_eq!(k.block_crc(2048, 452), None);
        // Writing on from the cut: the cut chunk stays unknown, the next ones are recorded.
        let mut now = file[..2500].to_vec();
        let more = data(2000, 7);
        r.write(2500, &more);
        now.extend_from_slice(&more);
        let k = r.snapshot().expect("recorded");
        assert_eq!(k.block_crc(2048, 1024), None);
        assert_eq!(
            k.block_crc(3072, 4500 - 3072),
            Some(block_crc(&now[3072..]))
        );
        // Truncated to empty and written again: all known.
        r.set_len(0);
        r.write(0, &more);
        let k = r.snapshot().expect("recorded");
        assert_eq!(k.block_crc(0, 2000), Some(block_crc(&more)));
    }

    /// Random writes (in place, across the end, beyond it) and truncations against a plain
    /// byte vector: every CRC the record gives is the true CRC of those bytes, and a file
    /// written in order from its start stays fully known.
    #[test]
    fn every_recorded_crc_is_the_true_one_whatever_the_writes() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n.max(1)
        };
        let chunk = 64u64;
        let mut checked = 0u64;
        for _ in 0..200 {
            let mut r = CrcRecorder::new(chunk);
            let mut model: Vec<u8> = Vec::new();
            for _ in 0..40 {
                let end = model.len() as u64;
                match next(10) {
                    0 => {
                        let size = next(end + 1);
                        r.set_len(size);
                        model.truncate(size as usize);
                    }
                    1 => {
                        // Beyond the end: a hole; the record stops.
                        let off = end + 1 + next(100);
                        let data = data(1 + next(200) as usize, next(256) as u8);
                        r.write(off, &data);
                        model.resize(off as usize, 0);
                        model.extend_from_slice(&data);
                    }
                    _ => {
                        let off = next(end + 1);
                        let data = data(1 + next(300) as usize, next(256) as u8);
                        r.write(off, &data);
                        let stop = off as usize + data.len();
                        if model.len() < stop {
                            model.resize(stop, 0);
                        }
                        model[off as usize..stop].copy_from_slice(&data);
                    }
                }
                let Some(k) = r.snapshot() else { break };
                assert_eq!(k.len(), model.len() as u64);
                let len = model.len() as u64;
                for first in 0..len.div_ceil(chunk) {
                    for n in 1..=3 {
                        let off = first * chunk;
                        let blen = (n * chunk).min(len - off);
                        if let Some(c) = k.block_crc(off, blen) {
                            let want = block_crc(&model[off as usize..(off + blen) as usize]);
                            assert_eq!(c, want, "block {off}+{blen} of {len}");
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert!(
            checked > 1000,
            "too few blocks were known to check: {checked}"
        );
        // In order from the start, in pieces of any size: everything is known.
        let file = data(1000, 9);
        let mut r = CrcRecorder::new(chunk);
        let mut off = 0;
        while off < file.len() {
            let n = (1 + next(150) as usize).min(file.len() - off);
            r.write(off as u64, &file[off..off + n]);
            off += n;
        }
        let k = r.snapshot().expect("recorded");
        assert_eq!(k.known_chunks(), (16, 16));
        assert_eq!(k.block_crc(0, 1000), Some(block_crc(&file)));
    }

    #[test]
    fn a_stopped_record_starts_again_when_the_file_is_emptied() {
        let mut r = CrcRecorder::new(1024);
        r.write(10, b"hole before");
        assert_eq!(r.snapshot(), None);
        r.set_len(0);
        let file = data(3000, 8);
        r.write(0, &file);
        let k = r.snapshot().expect("recorded");
        assert_eq!(k.block_crc(0, 3000), Some(block_crc(&file)));
    }

    #[test]
    fn an_empty_file_has_no_blocks() {
        let k = CrcRecorder::new(1024).snapshot().expect("recorded");
        assert!(k.is_empty());
        assert_eq!(k.known_chunks(), (0, 0));
        assert_eq!(k.block_crc(0, 1), None);
    }
}
