//! Admission of incoming connections, shared by every listener (`haul serve`, a storage node's
//! data port, the metadata server): how many connections at once in all, how many from one
//! source (an IPv4 address, or an IPv6 /64), and how long a connection may take to prove who
//! it is. A connection over a limit is refused as it is accepted, before anything is allocated
//! for it; one that has not authenticated within the handshake timeout is closed.
//!
//! The per-source limit keeps one host (or one attacker) from taking every slot; the handshake
//! timeout keeps connections that never finish authenticating (slowloris) from holding a slot
//! for long; the idle timeout closes authenticated connections that stopped talking. The
//! stream and buffer limits bound what one authenticated session can make an endpoint hold
//! (see `pool::MemoryBudget`).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Limits of one listener.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections at once, authenticated or not.
    pub max_connections: usize,
    /// Connections at once from one source address (IPv6: one /64).
    pub max_per_host: usize,
    /// From accepting a connection to its first authenticated request (TLS handshake,
    /// session proof of a data connection, first control frame).
    pub handshake_timeout: Duration,
    /// An authenticated control connection with no request for this long is closed.
    pub idle_timeout: Duration,
    /// Data streams one session may open (binds of higher stream numbers are refused).
    pub max_streams: u32,
    /// Bytes one receiving session may hold in block buffers.
    pub session_buffer: u64,
    /// Bytes all receiving sessions together may hold in block buffers.
    pub total_buffer: u64,
    /// Longest path test (`haul perf`) run for a client; zero runs none.
    pub perf_max: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 512,
            max_per_host: 128,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(600),
            max_streams: 64,
            session_buffer: 256 << 20,
            total_buffer: 1 << 30,
            perf_max: Duration::from_secs(60),
        }
    }
}

/// Why a connection was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// `max_connections` reached.
    Full,
    /// `max_per_host` reached for this source.
    HostFull,
}

/// Counts connections against a listener's [`Limits`].
#[derive(Clone)]
pub struct ConnLimiter {
    inner: Arc<Inner>,
}

struct Inner {
    limits: Limits,
    state: Mutex<State>,
    refused: AtomicU64,
}

#[derive(Default)]
struct State {
    total: usize,
    per_host: HashMap<IpAddr, usize>,
    /// When a refusal was last logged (refusals are counted, and logged at most every 10 s).
    last_log: Option<Instant>,
}

/// A connection's slot; released when dropped.
pub struct Admission {
    inner: Arc<Inner>,
    source: IpAddr,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Admission({})", self.source)
    }
}

/// The key a source is counted under: the address, or for IPv6 its /64 (one host usually has
/// a whole /64 to pick addresses from).
fn source_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

impl ConnLimiter {
    pub fn new(limits: Limits) -> Self {
        Self {
            inner: Arc::new(Inner {
                limits,
                state: Mutex::new(State::default()),
                refused: AtomicU64::new(0),
            }),
        }
    }

    pub fn limits(&self) -> &Limits {
        &self.inner.limits
    }

    /// Takes a slot for a connection from `peer`, or says why not.
    pub fn admit(&self, peer: IpAddr) -> Result<Admission, Refused> {
        let source = source_key(peer);
        let l = &self.inner.limits;
        let mut st = self.inner.state.lock().expect("limiter lock");
        let refused = if st.total >= l.max_connections.max(1) {
            Some(Refused::Full)
        } else if st.per_host.get(&source).copied().unwrap_or(0) >= l.max_per_host.max(1) {
            Some(Refused::HostFull)
        } else {
            None
        };
        if let Some(why) = refused {
            let n = self.inner.refused.fetch_add(1, Ordering::Relaxed) + 1;
            let now = Instant::now();
            if st
                .last_log
                .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(10))
            {
                st.last_log = Some(now);
                match why {
                    Refused::Full => tracing::warn!(
                        %peer, limit = l.max_connections, refused_so_far = n,
                        "connection limit reached; refusing (--max-connections)"
                    ),
                    Refused::HostFull => tracing::warn!(
                        %peer, limit = l.max_per_host, refused_so_far = n,
                        "per-host connection limit reached; refusing (--max-per-host)"
                    ),
                }
            }
            return Err(why);
        }
        st.total += 1;
        *st.per_host.entry(source).or_insert(0) += 1;
        Ok(Admission {
            inner: self.inner.clone(),
            source,
        })
    }

    /// Connections holding a slot now.
    pub fn active(&self) -> usize {
        self.inner.state.lock().expect("limiter lock").total
    }

    /// Connections refused since the start.
    pub fn refused(&self) -> u64 {
        self.inner.refused.load(Ordering::Relaxed)
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        let mut st = self.inner.state.lock().expect("limiter lock");
        st.total = st.total.saturating_sub(1);
        if let Some(n) = st.per_host.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                st.per_host.remove(&self.source);
            }
        }
    }
}

/// Drops a refused TCP connection with a reset rather than a graceful close, so that refusing
/// costs no TIME_WAIT state and nothing is read from it.
pub fn reset(tcp: tokio::net::TcpStream) {
    // A zero linger time does not block on close: the kernel sends a reset at once.
    let _ = socket2::SockRef::from(&tcp).set_linger(Some(Duration::ZERO));
    drop(tcp);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(total: usize, per_host: usize) -> ConnLimiter {
        ConnLimiter::new(Limits {
            max_connections: total,
            max_per_host: per_host,
            ..Limits::default()
        })
    }

    #[test]
    fn one_source_cannot_take_every_slot() {
        let l = limiter(4, 2);
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let a1 = l.admit(a).unwrap();
        let _a2 = l.admit(a).unwrap();
        assert_eq!(l.admit(a).unwrap_err(), Refused::HostFull);
        let _b1 = l.admit(b).unwrap();
        drop(a1);
        let _a3 = l.admit(a).unwrap();
        let _b2 = l.admit(b).unwrap();
        assert_eq!(
            l.admit("192.0.2.3".parse().unwrap()).unwrap_err(),
            Refused::Full
        );
        assert_eq!(l.active(), 4);
        assert_eq!(l.refused(), 2);
    }

    #[test]
    fn slots_come_back_when_connections_end() {
        let l = limiter(2, 2);
        let ip: IpAddr = "198.18.0.1".parse().unwrap();
        for _ in 0..100 {
            let _x = l.admit(ip).unwrap();
            let _y = l.admit(ip).unwrap();
        }
        assert_eq!(l.active(), 0);
        assert!(l.inner.state.lock().unwrap().per_host.is_empty());
    }

    #[test]
    fn an_ipv6_64_counts_as_one_source_and_mapped_v4_as_v4() {
        let l = limiter(10, 1);
        let _a = l.admit("2001:db8:1:2::1".parse().unwrap()).unwrap();
        assert_eq!(
            l.admit("2001:db8:1:2:ffff::9".parse().unwrap())
                .unwrap_err(),
            Refused::HostFull
        );
        let _b = l.admit("2001:db8:1:3::1".parse().unwrap()).unwrap();
        let _c = l.admit("192.0.2.7".parse().unwrap()).unwrap();
        assert_eq!(
            l.admit("::ffff:192.0.2.7".parse().unwrap()).unwrap_err(),
            Refused::HostFull
        );
    }
}
