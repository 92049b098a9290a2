//! Which destination files a session of this process is writing, so that two sessions never
//! write one temporary file at once.
//!
//! It happens when a transfer is retried while its earlier attempt's session still runs: a
//! link outage trips the client's stall timer, the client resumes on a new connection, and the
//! endpoint has not yet noticed that the old connection is dead (TCP may take many minutes to
//! give up). The new session *takes the file over*: it asks the old one to let go (the old
//! session records the file's restart ledger and closes it, see `sink_session`), waits for
//! that, and then resumes from the ledger, so only what was not yet durable is sent again.
//!
//! A claim is keyed by the destination's directory (device and inode, so that two roots
//! exporting one tree agree) and its name.

use std::collections::HashMap;
use std::ffi::OsString;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, LazyLock, Mutex};
use std::time::{Duration, Instant};

/// A destination file: (device, inode) of its directory, and its name.
pub type Key = (u64, u64, OsString);

/// Asks the session holding a claim to let go of the file.
pub type Yield = Arc<dyn Fn() + Send + Sync>;

struct Holder {
    id: u64,
    yield_now: Yield,
    asked: bool,
}

#[derive(Default)]
struct Claims {
    held: Mutex<HashMap<Key, Holder>>,
    released: Condvar,
}

static CLAIMS: LazyLock<Claims> = LazyLock::new(Claims::default);
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The right to write one destination file; released when dropped.
pub struct Claim {
    key: Key,
    id: u64,
}

impl std::fmt::Debug for Claim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Claim({:?})", self.key)
    }
}

/// Claims `key`. When another session holds it, that session is asked to let go (`yield_now`
/// of its claim is called, once) and this waits up to `wait` for it; `None` if it did not.
/// `yield_now` is how this claim's own holder will be asked in turn. Blocking: call it from a
/// file-operation thread.
pub fn claim(key: Key, yield_now: Yield, wait: Duration) -> Option<Claim> {
    let c = &*CLAIMS;
    let deadline = Instant::now() + wait;
    let mut held = c.held.lock().expect("claims lock");
    loop {
        let ask = match held.get_mut(&key) {
            None => break,
            Some(h) if !h.asked => {
                h.asked = true;
                Some(h.yield_now.clone())
            }
            Some(_) => None,
        };
        if let Some(ask) = ask {
            // Outside the lock: the holder's answer may release other claims.
            drop(held);
            ask();
            held = c.held.lock().expect("claims lock");
            continue;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        held = c.released.wait_timeout(held, left).expect("claims lock").0;
    }
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    held.insert(
        key.clone(),
        Holder {
            id,
            yield_now,
            asked: false,
        },
    );
    Some(Claim { key, id })
}

impl Drop for Claim {
    fn drop(&mut self) {
        let c = &*CLAIMS;
        let mut held = c.held.lock().expect("claims lock");
        if held.get(&self.key).is_some_and(|h| h.id == self.id) {
            held.remove(&self.key);
        }
        drop(held);
        c.released.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    fn key(name: &str) -> Key {
        (u64::MAX, 7, OsString::from(name))
    }

    #[test]
    fn a_second_claim_asks_the_first_to_let_go_and_waits_for_it() {
        let first: Arc<Mutex<Option<Claim>>> = Arc::new(Mutex::new(None));
        let asked = Arc::new(AtomicBool::new(false));
        let (f, a) = (first.clone(), asked.clone());
        // The first holder lets go from another thread a little later, as a session does
        // after writing its ledger.
        let yield_first: Yield = Arc::new(move || {
            a.store(true, Ordering::SeqCst);
            let f = f.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                f.lock().unwrap().take();
            });
        });
        *first.lock().unwrap() = claim(key("a"), yield_first, Duration::ZERO);
        assert!(first.lock().unwrap().is_some());
        let second = claim(key("a"), Arc::new(|| {}), Duration::from_secs(5));
        assert!(asked.load(Ordering::SeqCst), "the holder was asked");
        assert!(second.is_some(), "the claim passed to the second session");
    }

    #[test]
    fn a_holder_that_does_not_let_go_keeps_the_file() {
        let _first = claim(key("b"), Arc::new(|| {}), Duration::ZERO).unwrap();
        assert!(claim(key("b"), Arc::new(|| {}), Duration::from_millis(50)).is_none());
        // Other files are independent.
        assert!(claim(key("c"), Arc::new(|| {}), Duration::ZERO).is_some());
    }

    #[test]
    fn dropping_a_claim_frees_the_file() {
        let c = claim(key("d"), Arc::new(|| {}), Duration::ZERO).unwrap();
        drop(c);
        assert!(claim(key("d"), Arc::new(|| {}), Duration::ZERO).is_some());
    }
}
