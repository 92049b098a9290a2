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
//! exporting one tree agree) and its name, and belongs to an *owner* (the identity the session
//! acts for): only a session of the same owner can take a file over. Another user's session
//! is refused at once, so that nobody can abort someone else's upload by starting one to the
//! same name.

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
    owner: String,
    yield_now: Yield,
    asked: bool,
}

/// Why a claim was not granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// A session of another owner writes the file.
    Busy,
    /// A session of the same owner writes it and did not let go in time.
    NotReleased,
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

/// Claims `key` for `owner`. When another session of the same owner holds it, that session is
/// asked to let go (`yield_now` of its claim is called, once) and this waits up to `wait` for
/// it; a session of another owner keeps the file ([`Refused::Busy`]). `yield_now` is how this
/// claim's own holder will be asked in turn. Blocking: call it from a file-operation thread.
pub fn claim(key: Key, owner: &str, yield_now: Yield, wait: Duration) -> Result<Claim, Refused> {
    let c = &*CLAIMS;
    let deadline = Instant::now() + wait;
    let mut held = c.held.lock().expect("claims lock");
    loop {
        let ask = match held.get_mut(&key) {
            None => break,
            Some(h) if h.owner != owner => return Err(Refused::Busy),
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
            return Err(Refused::NotReleased);
        }
        held = c.released.wait_timeout(held, left).expect("claims lock").0;
    }
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    held.insert(
        key.clone(),
        Holder {
            id,
            owner: owner.to_string(),
            yield_now,
            asked: false,
        },
    );
    Ok(Claim { key, id })
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
        *first.lock().unwrap() = claim(key("a"), "bob", yield_first, Duration::ZERO).ok();
        assert!(first.lock().unwrap().is_some());
        let second = claim(key("a"), "bob", Arc::new(|| {}), Duration::from_secs(5));
        assert!(asked.load(Ordering::SeqCst), "the holder was asked");
        assert!(second.is_ok(), "the claim passed to the second session");
    }

    #[test]
    fn a_holder_that_does_not_let_go_keeps_the_file() {
        let _first = claim(key("b"), "bob", Arc::new(|| {}), Duration::ZERO).unwrap();
        assert_eq!(
            claim(key("b"), "bob", Arc::new(|| {}), Duration::from_millis(50)).unwrap_err(),
            Refused::NotReleased
        );
        // Other files are independent.
        assert!(claim(key("c"), "bob", Arc::new(|| {}), Duration::ZERO).is_ok());
    }

    #[test]
    fn dropping_a_claim_frees_the_file() {
        let c = claim(key("d"), "bob", Arc::new(|| {}), Duration::ZERO).unwrap();
        drop(c);
        assert!(claim(key("d"), "bob", Arc::new(|| {}), Duration::ZERO).is_ok());
    }

    #[test]
    fn another_owner_cannot_take_a_file_over() {
        let asked = Arc::new(AtomicBool::new(false));
        let a = asked.clone();
        let _bob = claim(
            key("e"),
            "bob",
            Arc::new(move || a.store(true, Ordering::SeqCst)),
            Duration::ZERO,
        )
        .unwrap();
        assert_eq!(
            claim(key("e"), "mallory", Arc::new(|| {}), Duration::from_secs(5)).unwrap_err(),
            Refused::Busy
        );
        assert!(
            !asked.load(Ordering::SeqCst),
            "bob's session was never asked to let go"
        );
    }
}
