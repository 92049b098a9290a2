//! The directory-entry cache: `(parent id, name)` -> committed inode, kept in memory when one
//! metadata server owns its catalog (SQLite), so that resolving paths and stat'ing files do not
//! touch the database. With a shared database (PostgreSQL, several servers) it is off: another
//! server's change could not invalidate it.
//!
//! Consistency: writers invalidate the keys they changed after their commit and before they
//! release the write lock. A reader may insert what it read only if no invalidation happened
//! since it started reading (a generation number, captured before its first query): otherwise
//! it could insert a value older than the invalidation.

use crate::Inode;
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Cached entries before the cache starts over (about 150 bytes each).
const DEFAULT_CAPACITY: usize = 2_000_000;

pub struct DentryCache {
    map: Mutex<HashMap<(i64, String), Inode>>,
    generation: AtomicU64,
    capacity: usize,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl Default for DentryCache {
    fn default() -> Self {
        Self::with_capacity(DEFAULT_CAPACITY)
    }
}

impl DentryCache {
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            map: Mutex::new(HashMap::new()),
            generation: AtomicU64::new(0),
            capacity: capacity.max(1),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// The generation to pass to [`DentryCache::insert`] for what is read from now on.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub fn get(&self, parent: i64, name: &str) -> Option<Inode> {
        // A borrowed key would need a custom Borrow impl; the clone of a short name is cheaper
        // than the query it saves.
        let hit = self
            .map
            .lock()
            .expect("cache lock")
            .get(&(parent, name.to_string()))
            .cloned();
        match &hit {
            Some(_) => self.hits.fetch_add(1, Ordering::Relaxed),
            None => self.misses.fetch_add(1, Ordering::Relaxed),
        };
        hit
    }

    /// Caches a committed entry read at generation `read_at`, unless something was
    /// invalidated since.
    pub fn insert(&self, read_at: u64, inode: &Inode) {
        if inode.pending {
            return;
        }
        let mut map = self.map.lock().expect("cache lock");
        if self.generation.load(Ordering::Acquire) != read_at {
            return;
        }
        if map.len() >= self.capacity {
            // Unreachable entries (below removed directories) accumulate; starting over is
            // simpler than tracking them and costs one query per entry to refill.
            map.clear();
        }
        map.insert((inode.parent, inode.name.clone()), inode.clone());
    }

    /// Forgets these keys (after the commit that changed them).
    pub fn invalidate<'a>(&self, keys: impl IntoIterator<Item = &'a (i64, String)>) {
        let mut map = self.map.lock().expect("cache lock");
        self.generation.fetch_add(1, Ordering::AcqRel);
        for k in keys {
            map.remove(k);
        }
    }

    pub fn len(&self) -> usize {
        self.map.lock().expect("cache lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// (hits, misses) so far.
    pub fn stats(&self) -> (u64, u64) {
        (
            self.hits.load(Ordering::Relaxed),
            self.misses.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Kind;

    fn inode(parent: i64, name: &str, mode: u32) -> Inode {
        Inode {
            id: 9,
            parent,
            name: name.into(),
            kind: Kind::File,
            owner: "a".into(),
            group: "g".into(),
            mode,
            size: 0,
            mtime_ns: 0,
            checksum: String::new(),
            pending: false,
            private: false,
        }
    }

    #[test]
    fn a_read_older_than_an_invalidation_is_not_cached() {
        let c = DentryCache::default();
        let g = c.generation();
        c.invalidate(&[(1, "x".to_string())]);
        c.insert(g, &inode(1, "x", 0o600));
        assert!(c.get(1, "x").is_none());
        let g = c.generation();
        c.insert(g, &inode(1, "x", 0o644));
        assert_eq!(c.get(1, "x").unwrap().mode, 0o644);
        c.invalidate(&[(1, "x".to_string())]);
        assert!(c.get(1, "x").is_none());
    }

    #[test]
    fn capacity_bounds_memory() {
        let c = DentryCache::with_capacity(2);
        for i in 0..5 {
            let g = c.generation();
            c.insert(g, &inode(1, &format!("f{i}"), 0));
        }
        assert!(c.len() <= 2);
    }
}
