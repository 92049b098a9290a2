//! Memory discipline of the data path: a pool of block buffers (so 1 MiB blocks are not
//! mapped and unmapped by the allocator for every block) and a byte budget that bounds how much
//! data is read ahead of the network, so a side's memory stays flat whatever the dataset size.

use std::sync::{Arc, Condvar, Mutex};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

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
            _held: Vec::new(),
        }
    }

    fn put(&self, buf: Vec<u8>) {
        // Only ordinary blocks are kept: a peer sending 16 MiB blocks must not leave the pool
        // holding dozens of them once its session is idle.
        if buf.capacity() > MAX_KEPT_BUFFER {
            return;
        }
        let mut idle = self.inner.lock().expect("pool lock");
        if idle.len() < self.keep {
            idle.push(buf);
        }
    }
}

/// Largest idle buffer a pool keeps (the default block is 1 MiB).
const MAX_KEPT_BUFFER: usize = 4 << 20;

/// A buffer that goes back to its pool when dropped.
pub struct PooledBuf {
    buf: Vec<u8>,
    pool: Option<BufPool>,
    /// Budget permits the buffer's bytes hold until it is dropped (see [`MemoryBudget`]).
    _held: Vec<OwnedSemaphorePermit>,
}

impl PooledBuf {
    /// Makes the buffer hold `permits` until it is dropped.
    pub fn hold(&mut self, permits: Vec<OwnedSemaphorePermit>) {
        self._held = permits;
    }

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

/// Bytes a receiving session may hold in block buffers, in that session and, shared by all the
/// sessions of an endpoint, in all: a block is read only once its bytes fit both budgets, so
/// a peer that opens many streams and stops each one short of the end of a large block holds
/// at most the budget, never a buffer per stream (blocks queued for writing and blocks kept
/// for a file not yet announced count too, until they are written or dropped).
#[derive(Clone)]
pub struct MemoryBudget {
    session: Arc<Semaphore>,
    total: Option<Arc<Semaphore>>,
    session_bytes: u64,
}

/// Budgets count in pages, so that a semaphore's 32-bit permits cover large budgets.
const PAGE: u64 = 4096;

fn pages(bytes: u64) -> u32 {
    bytes.div_ceil(PAGE).min(u32::MAX as u64 >> 1) as u32
}

impl MemoryBudget {
    /// `session_bytes` for this session, within `total` (shared with other sessions), if any.
    pub fn new(session_bytes: u64, total: Option<Arc<Semaphore>>) -> Self {
        Self {
            session: Arc::new(Semaphore::new(pages(session_bytes) as usize)),
            total,
            session_bytes,
        }
    }

    /// A budget shared by sessions: `bytes` in all.
    pub fn shared(bytes: u64) -> Arc<Semaphore> {
        Arc::new(Semaphore::new(pages(bytes) as usize))
    }

    /// Waits until `len` bytes fit; `None` if they never can (larger than the session's
    /// budget, which the caller treats as a protocol error).
    pub async fn acquire(&self, len: u64) -> Option<Vec<OwnedSemaphorePermit>> {
        if len > self.session_bytes {
            return None;
        }
        let n = pages(len);
        let mut held = vec![self.session.clone().acquire_many_owned(n).await.ok()?];
        if let Some(t) = &self.total {
            held.push(t.clone().acquire_many_owned(n).await.ok()?);
        }
        Some(held)
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
            // Woken by `release`, or by `wake_all` after a cancellation: no timer.
            used = self.cv.wait(used).expect("budget lock");
        }
        *used += n;
        true
    }

    pub fn release(&self, n: u64) {
        let mut used = self.used.lock().expect("budget lock");
        *used = used.saturating_sub(n);
        self.cv.notify_all();
    }

    /// Wakes every waiter to look at its cancellation again. Taken under the lock, so a waiter
    /// that has just found itself not cancelled is already waiting when this wakes it.
    pub fn wake_all(&self) {
        let _used = self.used.lock().expect("budget lock");
        self.cv.notify_all();
    }

    pub fn used(&self) -> u64 {
        *self.used.lock().expect("budget lock")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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

    #[tokio::test]
    async fn memory_budget_bounds_what_buffers_hold() {
        let total = MemoryBudget::shared(8 << 20);
        let a = MemoryBudget::new(6 << 20, Some(total.clone()));
        let b = MemoryBudget::new(6 << 20, Some(total.clone()));
        let pool = BufPool::new(4);
        assert!(
            a.acquire(7 << 20).await.is_none(),
            "larger than the session"
        );
        let mut x = pool.get(4 << 20);
        x.hold(a.acquire(4 << 20).await.unwrap());
        let mut y = pool.get(2 << 20);
        y.hold(a.acquire(2 << 20).await.unwrap());
        // Session a is full; b still has room, but only 2 MiB remain in all.
        let wait = tokio::time::timeout(Duration::from_millis(50), a.acquire(1 << 20)).await;
        assert!(wait.is_err(), "session a is at its budget");
        let wait = tokio::time::timeout(Duration::from_millis(50), b.acquire(3 << 20)).await;
        assert!(wait.is_err(), "the shared budget is nearly spent");
        let z = b.acquire(2 << 20).await.unwrap();
        drop(x);
        drop(z);
        let _w = tokio::time::timeout(Duration::from_secs(1), b.acquire(3 << 20))
            .await
            .expect("released bytes are available again")
            .unwrap();
    }

    #[test]
    fn big_buffers_are_not_kept_idle() {
        let pool = BufPool::new(4);
        drop(pool.get(16 << 20));
        assert!(pool.inner.lock().unwrap().is_empty());
        drop(pool.get(1 << 20));
        assert_eq!(pool.inner.lock().unwrap().len(), 1);
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
        // A waiter sees its cancellation when woken.
        let cancelled = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (b3, c3) = (budget.clone(), cancelled.clone());
        let t = std::thread::spawn(move || {
            b3.acquire(80, &|| c3.load(std::sync::atomic::Ordering::SeqCst))
        });
        std::thread::sleep(Duration::from_millis(50));
        cancelled.store(true, std::sync::atomic::Ordering::SeqCst);
        budget.wake_all();
        assert!(!t.join().unwrap(), "woken and cancelled");
        assert_eq!(budget.used(), 50);
        // Oversized requests pass alone; cancellation unblocks.
        assert!(!budget.acquire(1000, &|| true));
        budget.release(50);
        assert!(budget.acquire(1000, &|| false));
    }
}
