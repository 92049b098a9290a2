//! Idle control connections kept for the next session to the same endpoint.
//!
//! The metadata server drives one node-to-node session after another, and a mount fetches one
//! extent after another from a node; a new control connection costs a TCP handshake, a TLS
//! handshake and a hello exchange — three round trips across the WAN, which at the end of a
//! replication run (small sessions), or for each extent of a read, is a good part of each
//! session's time. A connection whose session ended cleanly is put back here and taken by the next
//! session to that endpoint, if it is still open (no FIN, reset or keepalive failure seen by
//! `poll`) and has not been idle too long.

use crate::TransferError;
use crate::conn::{self, ClientTls, Session};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use wire::control::HostLimits;

/// Longest time a connection waits idle for reuse (control connections have TCP keepalive,
/// see `sys::set_keepalive`, so a dead peer shows as closed well before).
const MAX_IDLE: Duration = Duration::from_secs(300);
/// Idle connections kept per endpoint at most.
const MAX_PER_PEER: usize = 8;

/// Idle control connections by endpoint address.
#[derive(Default)]
pub struct ControlPool {
    idle: Mutex<HashMap<String, Vec<(Instant, Session)>>>,
    /// Endpoints `keep_warm` is connecting to right now (one attempt at a time each).
    warming: Mutex<std::collections::HashSet<String>>,
}

impl ControlPool {
    pub fn new() -> Self {
        Self::default()
    }

    /// An idle connection to `host:port` if one is still good, else a new one.
    pub async fn connect(
        &self,
        host: &str,
        port: u16,
        tls: Option<&ClientTls>,
        limits: &HostLimits,
    ) -> Result<Session, TransferError> {
        if let Some(s) = self.take(&conn::format_addr(host, port), Instant::now()) {
            return Ok(s);
        }
        conn::connect_control(host, port, tls, limits).await
    }

    /// An idle connection to `host:port` if one is still good (no new one is made).
    pub fn take_idle(&self, host: &str, port: u16) -> Option<Session> {
        self.take(&conn::format_addr(host, port), Instant::now())
    }

    /// Whether an idle connection to `host:port` waits that is still open as far as this
    /// side can see (its peer's close may still be on its way). A connection already seen
    /// closed does not count: the next session connects anew, so its failure is the node's.
    pub fn has_idle(&self, host: &str, port: u16) -> bool {
        let idle = self.idle.lock().expect("control pool lock");
        idle.get(&conn::format_addr(host, port))
            .is_some_and(|l| l.iter().any(|(_, s)| s.is_open()))
    }

    /// Closes the idle connections to `host:port`: one of them failed, the others may have
    /// died the same way unseen.
    pub fn forget(&self, host: &str, port: u16) {
        let gone = self
            .idle
            .lock()
            .expect("control pool lock")
            .remove(&conn::format_addr(host, port));
        drop(gone);
    }

    /// Keeps `s` (whose session has ended, every response read) for the next session.
    pub fn put(&self, s: Session) {
        let key = conn::format_addr(&s.host, s.port);
        let mut idle = self.idle.lock().expect("control pool lock");
        let list = idle.entry(key).or_default();
        list.push((Instant::now(), s));
        if list.len() > MAX_PER_PEER {
            list.remove(0);
        }
    }

    /// How often [`keep_warm`](Self::keep_warm) should be called for each endpoint (it does
    /// nothing while a recent connection waits).
    pub const WARM_EVERY: Duration = Duration::from_secs(2);

    /// Makes sure a recent idle connection to `host:port` is waiting, so that even the first
    /// session of a run starts without the handshakes; stale ones are dropped.
    pub async fn keep_warm(
        &self,
        host: &str,
        port: u16,
        tls: Option<&ClientTls>,
        limits: &HostLimits,
    ) -> Result<(), TransferError> {
        let key = conn::format_addr(host, port);
        {
            let mut idle = self.idle.lock().expect("control pool lock");
            let list = idle.entry(key.clone()).or_default();
            let now = Instant::now();
            list.retain(|(since, s)| usable(*since, s, now));
            if list
                .iter()
                .any(|(since, _)| now.duration_since(*since) < MAX_IDLE / 2)
            {
                return Ok(());
            }
        }
        if !self
            .warming
            .lock()
            .expect("control pool lock")
            .insert(key.clone())
        {
            return Ok(());
        }
        let r = conn::connect_control(host, port, tls, limits).await;
        self.warming.lock().expect("control pool lock").remove(&key);
        self.put(r?);
        Ok(())
    }

    /// Connections idle for reuse (for tests and status).
    pub fn idle_count(&self) -> usize {
        let idle = self.idle.lock().expect("control pool lock");
        idle.values().map(Vec::len).sum()
    }

    fn take(&self, key: &str, now: Instant) -> Option<Session> {
        let mut idle = self.idle.lock().expect("control pool lock");
        let list = idle.get_mut(key)?;
        // Newest first; older ones are dropped (closed) as they are found stale.
        while let Some((since, s)) = list.pop() {
            if usable(since, &s, now) {
                return Some(s);
            }
        }
        None
    }
}

/// An idle connection may serve another session: not idle too long, and still open.
fn usable(since: Instant, s: &Session, now: Instant) -> bool {
    now.duration_since(since) < MAX_IDLE && s.is_open()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    fn far_deadline() -> tokio::time::Instant {
        tokio::time::Instant::now() + std::time::Duration::from_secs(60)
    }

    /// A plain endpoint stand-in that answers every hello with a welcome.
    async fn welcoming_server(listener: TcpListener, close_after_hello: bool) {
        use wire::control::{PROTOCOL_VERSION, Response};
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let Ok(conn::Accepted::Control { io, first, .. }) =
                    conn::accept(tcp, None, "test client", far_deadline(), &mut None).await
                else {
                    return;
                };
                let (mut r, mut w) = conn::ControlConn::new(io, first, "test".into()).split();
                while let Ok(Some(_)) = r.request().await {
                    let welcome = Response::Welcome {
                        version: PROTOCOL_VERSION,
                        agent: "test".into(),
                        identity: "anonymous".into(),
                        subject: String::new(),
                        limits: HostLimits::default(),
                    };
                    if w.send_response(&welcome).await.is_err() || close_after_hello {
                        return;
                    }
                }
            });
        }
    }

    #[tokio::test]
    async fn reuses_open_connections_and_drops_closed_ones() {
        for close in [false, true] {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = listener.local_addr().unwrap().port();
            tokio::spawn(welcoming_server(listener, close));
            let pool = ControlPool::new();
            let limits = HostLimits::default();
            let s = pool
                .connect("127.0.0.1", port, None, &limits)
                .await
                .unwrap();
            let first = s.local_port();
            pool.put(s);
            assert_eq!(pool.idle_count(), 1);
            // Let the server's close (if any) arrive.
            tokio::time::sleep(Duration::from_millis(100)).await;
            // A connection seen closed is not one a failure could be blamed on.
            assert_eq!(pool.has_idle("127.0.0.1", port), !close);
            let s = pool
                .connect("127.0.0.1", port, None, &limits)
                .await
                .unwrap();
            assert_eq!(pool.idle_count(), 0);
            if close {
                assert_ne!(
                    s.local_port(),
                    first,
                    "a closed connection must not be reused"
                );
            } else {
                assert_eq!(s.local_port(), first, "an open connection is reused");
            }
        }
    }
}
