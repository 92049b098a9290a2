//! Which byte ranges of a grid file to fetch for a read: exactly what a random reader asks
//! (aligned, plus a small bounded read-ahead), and for a sequential reader a window that grows
//! with what it has read in a row (fourfold from 1 MiB for a reader from the start of the file,
//! twofold for a run that began mid-file) up to a bound, cut into extents so that several
//! fetches overlap (each is a data session whose start-up costs round trips: overlapping hides
//! them). Pure: the caller fetches, and says when an extent is gone (evicted, or its fetch
//! failed).

use std::collections::BTreeMap;
use std::time::Duration;

/// Read-ahead a path is given per second of its round trip: 1 GiB at 100 ms. Each extent is a
/// data session whose first megabytes cost about nine round trips (connections, hello, slow
/// start), so the window must hold what the reader takes in several of those starts: on a
/// 1 Gbit/s path about 80 round trips' worth (`bench/mount`, run 9: 512 MiB at 100 ms read 5%
/// slower than 1 GiB, and at 200 ms 1 GiB is still the most that pays).
const WINDOW_PER_RTT_SECOND: u64 = 10 << 30;

/// The least window of a path however short its round trip: on a LAN a larger window only
/// holds more memory, while smaller extents would each pay a session's start in CPU.
const MIN_PATH_WINDOW: u64 = 64 << 20;

/// How much to fetch.
#[derive(Clone, Copy, Debug)]
pub struct Tuning {
    /// Fetches start and end on multiples of this (except at the end of the file).
    pub align: u64,
    /// Read-ahead of a random read, beyond what it asked.
    pub random_ahead: u64,
    /// Read-ahead of a sequential reader at its start.
    pub first_window: u64,
    /// Read-ahead of a sequential reader at most.
    pub max_window: u64,
    /// Bytes of one fetch at most.
    pub max_extent: u64,
    /// The bound the window was given (`--read-ahead`), whatever the path.
    pub limit: u64,
}

impl Tuning {
    /// A window from 1 MiB up to `max_window` bytes, fetched in extents of a quarter of it (so
    /// up to four fetches overlap), with 256 KiB alignment.
    ///
    /// Each fetch is a data session, which on a long path costs about nine round trips for its
    /// first megabytes (connections, hello, slow start: 0.94 s for 3 MiB at 100 ms, measured
    /// in `bench/mount`), so the window must reach several times the bandwidth-delay product
    /// in few steps: it grows fourfold per step (1 GiB after five). It starts at 1 MiB, so a
    /// program that reads only a file's header (`file`, `ncdump -h`) fetches little.
    pub fn with_window(max_window: u64) -> Self {
        let max_window = max_window.max(1 << 20);
        Self {
            align: 256 << 10,
            random_ahead: 256 << 10,
            first_window: (1 << 20).min(max_window),
            max_window,
            // A multiple of the alignment, so every extent's bounds are (but the file's end).
            max_extent: (max_window / 4).max(1 << 20) / (256 << 10) * (256 << 10),
            limit: max_window,
        }
    }

    /// This tuning for a path whose round trip is `rtt`: the window scaled to the round trip
    /// ([`WINDOW_PER_RTT_SECOND`], at least [`MIN_PATH_WINDOW`]) within the bound it was given.
    pub fn for_path(&self, rtt: Duration) -> Self {
        let need = (rtt.as_secs_f64() * WINDOW_PER_RTT_SECOND as f64) as u64;
        let mut t = Self::with_window(need.max(MIN_PATH_WINDOW).min(self.limit));
        t.limit = self.limit;
        t
    }
}

/// The fetch plan of one file.
pub struct Planner {
    size: u64,
    tuning: Tuning,
    /// Extents fetched or being fetched: start -> end. They never overlap.
    covered: BTreeMap<u64, u64>,
    /// Where a sequential reader reads next, how much it has read in a row, and where that
    /// run began.
    next: u64,
    run: u64,
    run_from: u64,
    /// Where the last read began.
    last_off: u64,
}

impl Planner {
    pub fn new(size: u64, tuning: Tuning) -> Self {
        Self {
            size,
            tuning,
            covered: BTreeMap::new(),
            next: 0,
            run: 0,
            run_from: 0,
            last_off: 0,
        }
    }

    /// Fits the window to a path whose round trip is `rtt` (see [`Tuning::for_path`]); the
    /// extents already planned stay as they are.
    pub fn fit_path(&mut self, rtt: Duration) {
        self.tuning = self.tuning.for_path(rtt);
    }

    /// The data a sequential reader has left behind: from where its run began to where its
    /// last read began, once it has read more than one extent (a quarter of the window's
    /// bound) in a row. A program that steps back into its last read (a partial record)
    /// finds it still there; one that steps back further has it fetched again. `None` for a
    /// random reader.
    pub fn passed(&self) -> Option<std::ops::Range<u64>> {
        (self.run > self.tuning.max_extent).then_some(self.run_from..self.last_off)
    }

    /// The current read-ahead window of a sequential reader: for one that started at the
    /// beginning of the file (a program reading it through) four times its run and at least
    /// the first window; for one that started elsewhere (chunks of a netCDF/HDF5 variable in
    /// a row) twice its run and at least the random read-ahead.
    pub fn window(&self) -> u64 {
        let (grow, least) = if self.run_from == 0 {
            (4, self.tuning.first_window)
        } else {
            (2, self.tuning.random_ahead)
        };
        (grow * self.run).clamp(least.min(self.tuning.max_window), self.tuning.max_window)
    }

    /// A read of `len` bytes at `off`: the extents to fetch now (start, end), already counted
    /// as covered.
    pub fn read(&mut self, off: u64, len: u64) -> Vec<(u64, u64)> {
        let end = off.saturating_add(len).min(self.size);
        if off >= end {
            return Vec::new();
        }
        // Sequential: this read starts where the last ended, or overlaps its end (as a
        // program re-reading a partial record does).
        let prev = self.next;
        let sequential = off == prev || (off < prev && end > prev);
        if sequential {
            self.run = (self.run + (end - off.max(prev))).min(self.size);
        } else {
            self.run = end - off;
            self.run_from = off;
        }
        self.next = end;
        self.last_off = off;
        let a = self.tuning.align;
        let start = off / a * a;
        let ahead = if sequential {
            self.window()
        } else {
            self.tuning.random_ahead
        };
        let want_end = end
            .saturating_add(ahead)
            .div_ceil(a)
            .saturating_mul(a)
            .min(self.size);
        let need_end = end.div_ceil(a).saturating_mul(a).min(self.size);
        let mut out = Vec::new();
        for (s, e) in self.gaps(start, want_end) {
            // A gap the read needs is fetched now; for a sequential reader one only ahead of
            // it waits until it is worth a session (a quarter of the window, or the rest of
            // the file).
            let needed = s < need_end;
            let worth = sequential && (e - s >= (ahead / 4).max(a) || e == self.size);
            if !(needed || worth) {
                continue;
            }
            let mut at = s;
            while at < e {
                let to = (at + self.tuning.max_extent).min(e);
                out.push((at, to));
                self.covered.insert(at, to);
                at = to;
            }
        }
        out
    }

    /// `[start, end)` is already there (the cache held it).
    pub fn cover(&mut self, start: u64, end: u64) {
        self.covered.insert(start, end);
    }

    /// The extent starting at `start` is gone (evicted, or its fetch failed): a later read
    /// fetches it again.
    pub fn uncover(&mut self, start: u64) {
        self.covered.remove(&start);
    }

    /// The parts of `[from, to)` no extent covers.
    fn gaps(&self, from: u64, to: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut at = from;
        // The extent that starts before `from` may reach into it.
        if let Some((_, &e)) = self.covered.range(..=from).next_back() {
            at = at.max(e);
        }
        for (&s, &e) in self.covered.range(from..to) {
            if s > at {
                out.push((at, s));
            }
            at = at.max(e);
        }
        if at < to {
            out.push((at, to));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn tuning() -> Tuning {
        Tuning::with_window(64 * MIB)
    }

    #[test]
    fn a_random_read_fetches_what_it_asks_plus_a_bounded_read_ahead() {
        let mut p = Planner::new(1 << 30, tuning());
        // A netCDF chunk in the middle of a 1 GiB file.
        let got = p.read(500 * MIB + 100, 4096);
        assert_eq!(got, vec![(500 * MIB, 500 * MIB + 512 * 1024)]);
        // Another read inside it fetches nothing.
        assert!(p.read(500 * MIB + 300_000, 1000).is_empty());
        // A read far away fetches only its own part.
        let got = p.read(900 * MIB, 10);
        assert_eq!(got, vec![(900 * MIB, 900 * MIB + 512 * 1024)]);
        let total: u64 = p.covered.iter().map(|(s, e)| e - s).sum();
        assert_eq!(total, 1 << 20, "no more than asked plus read-ahead");
    }

    #[test]
    fn a_sequential_reader_gets_a_growing_window_in_overlapping_extents() {
        let mut p = Planner::new(1 << 30, tuning());
        let mut off = 0;
        let mut fetched: Vec<(u64, u64)> = Vec::new();
        while off < 256 * MIB {
            let got = p.read(off, 128 * 1024);
            // Everything the read needs is covered once it is planned.
            assert!(p.gaps(off, off + 128 * 1024).is_empty(), "{off}");
            fetched.extend(got);
            off += 128 * 1024;
        }
        // Extents are contiguous, never overlap, and none exceeds a quarter of the window.
        for w in fetched.windows(2) {
            assert_eq!(w[0].1, w[1].0);
        }
        assert!(fetched.iter().all(|(s, e)| e - s <= 16 * MIB));
        assert_eq!(p.window(), 64 * MIB);
        // Read-ahead is bounded: at most the window beyond the reader.
        let ahead = fetched.last().unwrap().1 - off;
        assert!(ahead <= 64 * MIB + 256 * 1024, "{ahead}");
        assert!(ahead >= 64 * MIB * 3 / 4 - 256 * 1024, "{ahead}");
        // The window started small: the first fetches were the first window (1 MiB), not the
        // whole window.
        let first: u64 = fetched
            .iter()
            .take_while(|(_, e)| *e <= 2 * MIB)
            .map(|(s, e)| e - s)
            .sum();
        assert!(first > 0 && fetched[0].1 <= 2 * MIB, "{:?}", &fetched[..2]);
    }

    #[test]
    fn a_chunk_read_in_pieces_mid_file_gets_a_small_window() {
        let mut p = Planner::new(1 << 30, tuning());
        // A 1 MiB chunk at 500 MiB that the kernel passes on in 128 KiB pieces.
        let mut fetched: Vec<(u64, u64)> = Vec::new();
        for i in 0..8 {
            fetched.extend(p.read(500 * MIB + i * 128 * 1024, 128 * 1024));
        }
        // Its first pieces fetch little (not the window of a reader from the start
        // of the file); in all, at most twice what it read beyond it.
        assert!(fetched[0].1 - fetched[0].0 <= 512 * 1024, "{fetched:?}");
        assert!(fetched[1].1 <= 500 * MIB + MIB, "{fetched:?}");
        let end = fetched.last().unwrap().1;
        assert!(end <= 501 * MIB + 2 * MIB + 256 * 1024, "{fetched:?}");
        // From the beginning of the file, the first window at once.
        let mut q = Planner::new(1 << 30, tuning());
        assert_eq!(q.read(0, 128 * 1024), vec![(0, MIB + 256 * 1024)]);
    }

    #[test]
    fn a_fetch_stops_at_the_end_of_the_file_and_a_lost_extent_is_fetched_again() {
        let mut p = Planner::new(9 * MIB + 5, tuning());
        // A sequential start: the first window, 1 MiB beyond the read, aligned.
        assert_eq!(p.read(0, 4096), vec![(0, MIB + 256 * 1024)]);
        // The tail: up to the end of the file, not past it.
        assert_eq!(p.read(9 * MIB, 100), vec![(9 * MIB, 9 * MIB + 5)]);
        assert!(p.read(9 * MIB, 100).is_empty());
        p.uncover(9 * MIB);
        assert_eq!(p.read(9 * MIB, 100), vec![(9 * MIB, 9 * MIB + 5)]);
        // Nothing past the end.
        assert!(p.read(9 * MIB + 5, 100).is_empty());
        assert!(p.read(20 * MIB, 100).is_empty());
    }

    #[test]
    fn the_window_is_sized_from_the_round_trip_within_its_bound() {
        let t = Tuning::with_window(1 << 30);
        let ms = Duration::from_millis;
        // A LAN gets the least window, a long path one in proportion, never past the bound.
        assert_eq!(t.for_path(ms(2)).max_window, MIN_PATH_WINDOW);
        assert_eq!(t.for_path(ms(50)).max_window, 512 * MIB);
        assert_eq!(t.for_path(ms(100)).max_window, 1 << 30);
        assert_eq!(t.for_path(ms(300)).max_window, 1 << 30);
        // Extents stay a quarter of the window, and the bound survives fitting.
        assert_eq!(t.for_path(ms(2)).max_extent, 16 * MIB);
        assert_eq!(t.for_path(ms(2)).for_path(ms(200)).max_window, 1 << 30);
        // A bound below the least window wins.
        assert_eq!(
            Tuning::with_window(4 * MIB).for_path(ms(2)).max_window,
            4 * MIB
        );
        // A sequential reader on a LAN path reads ahead no more than its window.
        let mut p = Planner::new(1 << 30, Tuning::with_window(1 << 30));
        p.fit_path(ms(1));
        let mut furthest = 0;
        let mut off = 0;
        while off < 512 * MIB {
            if let Some(&(_, e)) = p.read(off, MIB).last() {
                furthest = e;
            }
            off += MIB;
        }
        assert_eq!(p.tuning.max_window, MIN_PATH_WINDOW);
        assert!(furthest - off <= MIN_PATH_WINDOW, "{}", furthest - off);
    }

    #[test]
    fn a_sequential_reader_leaves_data_behind_and_a_random_one_does_not() {
        let mut p = Planner::new(1 << 30, tuning());
        // Random reads: nothing is behind.
        p.read(500 * MIB, 4096);
        p.read(100 * MIB, 4096);
        assert_eq!(p.passed(), None);
        // A sequential run, once longer than an extent (16 MiB here): what lies before its
        // last read.
        let mut off = 0;
        while off <= 16 * MIB {
            p.read(off, 128 * 1024);
            off += 128 * 1024;
        }
        assert_eq!(p.passed(), Some(0..off - 128 * 1024));
        // Stepping back over part of the last read keeps the run: still behind its start.
        p.read(off - 4096, 8192);
        assert_eq!(p.passed(), Some(0..off - 4096));
        // A jump elsewhere starts over; a run from mid-file leaves behind only its own part
        // (a header read before it stays).
        p.read(900 * MIB, 4096);
        assert_eq!(p.passed(), None);
        let mut off = 600 * MIB;
        while off <= 620 * MIB {
            p.read(off, 128 * 1024);
            off += 128 * 1024;
        }
        assert_eq!(p.passed(), Some(600 * MIB..off - 128 * 1024));
    }
}
