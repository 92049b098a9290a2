//! `RangeSet`: a set of disjoint, sorted, half-open byte ranges.
//!
//! It is the restart ledger of a partially received file ("bytes 0..4 MiB and 8..12 MiB are on
//! disk"), the set of ranges a source still has to send, and the arithmetic between them.

use serde::{Deserialize, Serialize};
use std::ops::Range;

/// Disjoint, non-adjacent, sorted half-open ranges `[start, end)`.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeSet {
    ranges: Vec<(u64, u64)>,
}

impl std::fmt::Debug for RangeSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.ranges.iter().map(|(s, e)| s..e))
            .finish()
    }
}

impl RangeSet {
    pub fn new() -> Self {
        Self { ranges: Vec::new() }
    }

    /// The set holding exactly `range` (empty if the range is empty).
    pub fn from_range(range: Range<u64>) -> Self {
        let mut set = Self::new();
        set.insert(range);
        set
    }

    /// Builds a set from untrusted pairs (for example from the network or a ledger file):
    /// empty or inverted pairs are rejected.
    pub fn from_pairs(pairs: &[(u64, u64)]) -> Option<Self> {
        let mut set = Self::new();
        for &(s, e) in pairs {
            if s >= e {
                return None;
            }
            set.insert(s..e);
        }
        Some(set)
    }

    pub fn pairs(&self) -> &[(u64, u64)] {
        &self.ranges
    }

    pub fn iter(&self) -> impl Iterator<Item = Range<u64>> + '_ {
        self.ranges.iter().map(|&(s, e)| s..e)
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Total number of bytes covered.
    pub fn len_bytes(&self) -> u64 {
        self.ranges.iter().map(|(s, e)| e - s).sum()
    }

    /// Adds `range`, merging with overlapping or adjacent ranges.
    pub fn insert(&mut self, range: Range<u64>) {
        if range.start >= range.end {
            return;
        }
        let (mut start, mut end) = (range.start, range.end);
        // First range whose end is >= start (could touch or overlap).
        let first = self.ranges.partition_point(|&(_, e)| e < start);
        let mut last = first;
        while last < self.ranges.len() && self.ranges[last].0 <= end {
            start = start.min(self.ranges[last].0);
            end = end.max(self.ranges[last].1);
            last += 1;
        }
        self.ranges.splice(first..last, [(start, end)]);
    }

    /// Removes `range` from the set.
    pub fn remove(&mut self, range: Range<u64>) {
        if range.start >= range.end {
            return;
        }
        let mut out = Vec::with_capacity(self.ranges.len() + 1);
        for &(s, e) in &self.ranges {
            if e <= range.start || s >= range.end {
                out.push((s, e));
                continue;
            }
            if s < range.start {
                out.push((s, range.start));
            }
            if e > range.end {
                out.push((range.end, e));
            }
        }
        self.ranges = out;
    }

    /// True when every byte of `range` is in the set.
    pub fn contains_range(&self, range: Range<u64>) -> bool {
        if range.start >= range.end {
            return true;
        }
        let i = self.ranges.partition_point(|&(_, e)| e <= range.start);
        self.ranges
            .get(i)
            .is_some_and(|&(s, e)| s <= range.start && e >= range.end)
    }

    /// True when every byte of `other` is in `self`.
    pub fn contains_set(&self, other: &RangeSet) -> bool {
        other.iter().all(|r| self.contains_range(r))
    }

    /// The parts of `range` not in the set, in order.
    pub fn gaps_in(&self, range: Range<u64>) -> RangeSet {
        let mut out = RangeSet::from_range(range.clone());
        for r in self.iter() {
            if r.end <= range.start {
                continue;
            }
            if r.start >= range.end {
                break;
            }
            out.remove(r);
        }
        out
    }

    /// `self` minus `other`.
    pub fn difference(&self, other: &RangeSet) -> RangeSet {
        let mut out = self.clone();
        for r in other.iter() {
            out.remove(r);
        }
        out
    }

    /// The range starting exactly at `offset`, if one does.
    pub fn range_starting_at(&self, offset: u64) -> Option<Range<u64>> {
        let i = self.ranges.partition_point(|&(s, _)| s < offset);
        self.ranges
            .get(i)
            .filter(|&&(s, _)| s == offset)
            .map(|&(s, e)| s..e)
    }

    /// The first byte not covered by a range that starts at 0 (the contiguous prefix length).
    pub fn contiguous_prefix(&self) -> u64 {
        match self.ranges.first() {
            Some(&(0, e)) => e,
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn insert_merges_overlapping_and_adjacent() {
        let mut s = RangeSet::new();
        s.insert(10..20);
        s.insert(30..40);
        s.insert(20..30);
        assert_eq!(s.pairs(), &[(10, 40)]);
        s.insert(0..5);
        s.insert(45..50);
        s.insert(4..46);
        assert_eq!(s.pairs(), &[(0, 50)]);
        assert_eq!(s.len_bytes(), 50);
    }

    #[test]
    fn remove_splits() {
        let mut s = RangeSet::from_range(0..100);
        s.remove(10..20);
        s.remove(90..200);
        assert_eq!(s.pairs(), &[(0, 10), (20, 90)]);
        assert!(s.contains_range(20..90));
        assert!(!s.contains_range(5..15));
        assert_eq!(s.gaps_in(0..100).pairs(), &[(10, 20), (90, 100)]);
    }

    #[test]
    fn from_pairs_rejects_empty_and_inverted() {
        assert!(RangeSet::from_pairs(&[(5, 5)]).is_none());
        assert!(RangeSet::from_pairs(&[(6, 5)]).is_none());
        assert_eq!(
            RangeSet::from_pairs(&[(5, 9), (0, 5)]).unwrap().pairs(),
            &[(0, 9)]
        );
    }

    proptest! {
        /// The set agrees with a bitmap model under any sequence of inserts and removes.
        #[test]
        fn matches_bitmap_model(ops in proptest::collection::vec((any::<bool>(), 0u64..200, 0u64..60), 0..60)) {
            let mut set = RangeSet::new();
            let mut model = [false; 260];
            for (ins, start, len) in ops {
                let r = start..start + len;
                if ins { set.insert(r.clone()); } else { set.remove(r.clone()); }
                for b in r { model[b as usize] = ins; }
            }
            for b in 0..260u64 {
                prop_assert_eq!(set.contains_range(b..b + 1), model[b as usize]);
            }
            // Invariant: sorted, disjoint, non-adjacent, non-empty.
            for w in set.pairs().windows(2) {
                prop_assert!(w[0].1 < w[1].0);
            }
            for &(s, e) in set.pairs() { prop_assert!(s < e); }
            prop_assert_eq!(set.len_bytes(), model.iter().filter(|b| **b).count() as u64);
        }
    }
}
