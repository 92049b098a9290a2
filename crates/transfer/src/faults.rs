//! Fault injection for tests, from environment variables read once per process:
//!
//! - `HAUL_FAULT_CORRUPT_EVERY=N`: the sender flips a byte in every N-th block after computing
//!   its CRC (first transmissions only), as a faulty NIC or memory would.
//! - `HAUL_FAULT_STALL_AFTER=BYTES`: once this process has sent BYTES of payload, its senders
//!   stop sending (the connection stays open), as a hung server would; once per process.
//! - `HAUL_FAULT_EXIT_AFTER=BYTES`: once this process has sent or written BYTES of payload it
//!   exits at once with status 137, as if killed.
//! - `HAUL_FAULT_DROP_REUSED_CONTROL=N`: the endpoint closes, unanswered, the first N sessions
//!   asked on a control connection that already served one, as an idle close racing the
//!   client's reuse of the connection would.
//!
//! They exist so that the integration tests can exercise detection and recovery through the
//! real binaries, and only in builds with the `fault-injection` cargo feature (the test command
//! enables it; release builds do not, so an installed `haul` ignores these variables): without
//! it every function here is a constant `false` the compiler removes. With it they cost one
//! relaxed atomic operation per block when unset.

#[cfg(feature = "fault-injection")]
pub use injected::{corrupt_enabled, corrupt_this_block, drop_reused_control, moved};

#[cfg(feature = "fault-injection")]
mod injected {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    struct Faults {
        corrupt_every: Option<u64>,
        stall_after: Option<u64>,
        exit_after: Option<u64>,
        drop_reused_control: Option<u64>,
    }

    fn faults() -> &'static Faults {
        static F: OnceLock<Faults> = OnceLock::new();
        F.get_or_init(|| {
            let num = |k: &str| {
                std::env::var(k)
                    .ok()
                    .and_then(|v| wire::units::parse_size(&v).ok())
            };
            Faults {
                corrupt_every: num("HAUL_FAULT_CORRUPT_EVERY").filter(|n| *n > 0),
                stall_after: num("HAUL_FAULT_STALL_AFTER"),
                exit_after: num("HAUL_FAULT_EXIT_AFTER"),
                drop_reused_control: num("HAUL_FAULT_DROP_REUSED_CONTROL"),
            }
        })
    }

    static BLOCKS: AtomicU64 = AtomicU64::new(0);
    static BYTES: AtomicU64 = AtomicU64::new(0);
    static STALL_FIRED: AtomicBool = AtomicBool::new(false);
    static DROPPED: AtomicU64 = AtomicU64::new(0);

    /// Called when a session is asked on a control connection that already served one: true
    /// if the connection must be closed without an answer.
    pub fn drop_reused_control() -> bool {
        match faults().drop_reused_control {
            Some(n) => DROPPED.fetch_add(1, Ordering::Relaxed) < n,
            None => false,
        }
    }

    /// Whether block corruption is being injected (senders then keep blocks in memory).
    pub fn corrupt_enabled() -> bool {
        faults().corrupt_every.is_some()
    }

    /// Called for each block about to be sent for the first time: true if it must be corrupted.
    pub fn corrupt_this_block() -> bool {
        match faults().corrupt_every {
            Some(n) => BLOCKS.fetch_add(1, Ordering::Relaxed) % n == n - 1,
            None => false,
        }
    }

    /// Records `n` payload bytes moved by this process; exits if the exit fault is due. Returns
    /// true (once per process) when the calling session must stall from now on.
    pub fn moved(n: u64) -> bool {
        let f = faults();
        if f.stall_after.is_none() && f.exit_after.is_none() {
            return false;
        }
        let total = BYTES.fetch_add(n, Ordering::Relaxed) + n;
        if f.exit_after.is_some_and(|limit| total >= limit) {
            eprintln!("haul: fault injection: exiting after {total} bytes");
            std::process::exit(137);
        }
        if f.stall_after.is_some_and(|limit| total >= limit)
            && !STALL_FIRED.swap(true, Ordering::Relaxed)
        {
            eprintln!("haul: fault injection: stalling after {total} bytes");
            return true;
        }
        false
    }
}

/// Whether block corruption is being injected: never in this build.
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn corrupt_enabled() -> bool {
    false
}

/// Whether this block must be corrupted: never in this build.
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn corrupt_this_block() -> bool {
    false
}

/// Whether a reused control connection must be closed unanswered: never in this build.
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn drop_reused_control() -> bool {
    false
}

/// Records moved bytes for the exit and stall faults: nothing to do in this build.
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn moved(_n: u64) -> bool {
    false
}
