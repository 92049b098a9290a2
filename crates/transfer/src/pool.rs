//! Memory discipline of the data path: a pool of block buffers (so 1 MiB blocks are not
//! mapped and unmapped by the allocator for every block) and a byte budget that bounds how much
//! data is read ahead of the network, so a side's memory stays flat whatever the dataset size.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// A pool of reusable byte buffers.
#[derive(Clone)]
pub struct BufPool {
    inner: Arc<Mutex<Vec<Vec<u8>>>>,
    keep: usize,
}

impl BufPool {
    /// A pool that keeps at most `keep` idle buffers.
    pub fn new(keep: usize) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Vec::new())),
            keep,
        }
    }

    /// A buffer of exactly `len` bytes; its contents are stale bytes or zeros.
    pub fn get(&self, len: usize) -> PooledBuf {
        let mut buf = self
            .inner
            .lock()
            .expect("pool lock")
            .pop()
            .unwrap_or_default();
        // Buffers keep their initialised length in the pool: reusing one of the same size costs
        // no zeroing (callers overwrite the contents entirely).
        if buf.len() < len {
            buf.resize(len, 0);
        }
        buf.truncate(len);
        PooledBuf {
            buf,
            pool: Some(self.clone()),
        }
    }

    fn put(&self, buf: Vec<u8>) {
        let mut idle = self.inner.lock().expect("pool lock");
        if idle.len() < self.keep {
            idle.push(buf);
        }
    }
}

/// A buffer that goes back to its pool when dropped.
pub struct PooledBuf {
    buf: Vec<u8>,
    pool: Option<BufPool>,
}

impl PooledBuf {
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.buf
    }

    pub fn truncate(&mut self, len: usize) {
        self.buf.truncate(len);
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

impl AsRef<[u8]> for PooledBuf {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for PooledBuf {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.put(std::mem::take(&mut self.buf));
        }
    }
}

/// A window into a shared buffer, so part of a block can be kept (for an in-order digest)
/// without copying.
#[derive(Clone)]
pub struct SharedSlice {
    pub buf: Arc<PooledBuf>,
    pub start: usize,
    pub end: usize,
}

impl AsRef<[u8]> for SharedSlice {
    fn as_ref(&self) -> &[u8] {
        &AsRef::<[u8]>::as_ref(&*self.buf)[self.start..self.end]
    }
}

/// Bytes in flight between readers and the network, bounded.
pub struct ByteBudget {
    used: Mutex<u64>,
    cv: Condvar,
    limit: u64,
}

impl ByteBudget {
    pub fn new(limit: u64) -> Self {
        Self {
            used: Mutex::new(0),
            cv: Condvar::new(),
            limit,
        }
    }

    /// Blocks until `n` bytes fit (a single request larger than the limit passes alone), or
    /// `cancelled()` turns true. Returns false when cancelled.
    pub fn acquire(&self, n: u64, cancelled: &dyn Fn() -> bool) -> bool {
        let mut used = self.used.lock().expect("budget lock");
        while *used > 0 && *used + n > self.limit {
            if cancelled() {
                return false;
            }
            used = self
                .cv
                .wait_timeout(used, Duration::from_millis(100))
                .expect("budget lock")
                .0;
        }
        *used += n;
        true
    }

    pub fn release(&self, n: u64) {
        let mut used = self.used.lock().expect("budget lock");
        *used = used.saturating_sub(n);
        self.cv.notify_all();
    }

    pub fn used(&self) -> u64 {
        *self.used.lock().expect("budget lock")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back() {
        let pool = BufPool::new(2);
        let a = pool.get(1000);
        let ptr = a.as_ref().as_ptr();
        drop(a);
        let b = pool.get(500);
        assert_eq!(b.as_ref().as_ptr(), ptr);
        assert_eq!(b.len(), 500);
    }

    #[test]
    fn budget_blocks_until_released() {
        let budget = Arc::new(ByteBudget::new(100));
        assert!(budget.acquire(80, &|| false));
        let b2 = budget.clone();
        let t = std::thread::spawn(move || b2.acquire(50, &|| false));
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(budget.used(), 80);
        budget.release(80);
        assert!(t.join().unwrap());
        assert_eq!(budget.used(), 50);
        // Oversized requests pass alone; cancellation unblocks.
        assert!(!budget.acquire(1000, &|| true));
        budget.release(50);
        assert!(budget.acquire(1000, &|| false));
    }
}
