//! netlab: a user-space WAN emulator over TUN devices and network namespaces, and the harness
//! that integration tests and benchmarks use to run real programs across an emulated
//! long-distance path.
//!
//! Each emulated host is a network namespace whose only interface, `wan0`, is a TUN device
//! held by the emulator thread of this process. The emulator routes packets by destination
//! address; packets between the two sites go through one bottleneck per direction (rate,
//! one-way delay, random loss, jitter, drop-tail queue, blackouts), packets within a site go
//! straight through. It owns: namespaces, devices, host TCP profiles, the emulator, counters
//! and clean-up. It does not own: what runs in the hosts (tests and `bench/` decide that).
//!
//! ```no_run
//! use std::time::Duration;
//! let lab = netlab::Lab::builder()
//!     .site("a", 1).site("b", 1)
//!     .rate_bps(1_000_000_000).rtt(Duration::from_millis(100)).loss(0.001)
//!     .mtu(9000).profile(netlab::Profile::Tuned).congestion("cubic")
//!     .build()?;
//! let server = lab.host("b", 0);
//! let status = lab.host("a", 0).command("ping").args(["-c1", &server.addr().to_string()]).status()?;
//! println!("{status}\n{}", lab.stats());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod cli;
mod emulator;
mod globals;
pub mod gso;
mod lab;
pub mod model;
mod netns;
pub mod probe;
mod rng;
mod stats;
mod sys;
pub mod units;

pub use lab::{
    Blackout, Error, HOST_IFACE, Host, Lab, LabBuilder, LabConfig, PREFIX_LEN, Profile, SiteSpec,
    available, cleanup_leftovers,
};
pub use model::{DropCause, LinkParams};
pub use netns::{running, terminate};
pub use stats::{
    DirectionStats, Drops, LATE_MAX_LIMIT_US, LATE_MEAN_LIMIT_US, LATE_SHARE_LIMIT, Stats,
};
#[doc(hidden)]
pub use testkit as __testkit;

/// CPU time of a thread or process in seconds, read from `/proc` (utime + stime, clock-tick
/// resolution): `cpu_seconds_of("/proc/PID")` or `cpu_seconds_of("/proc/self/task/TID")`.
pub fn cpu_seconds_of(proc_dir: &str) -> std::io::Result<f64> {
    let stat = std::fs::read_to_string(format!("{proc_dir}/stat"))?;
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| std::io::Error::other("unexpected /proc stat format"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After ")": state is field 3, utime field 14, stime field 15 (1-based in proc(5)).
    let get = |i: usize| {
        fields
            .get(i - 3)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok((get(14) + get(15)) as f64 / hz)
}
