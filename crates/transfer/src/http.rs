//! The plain-HTTP listener of every daemon's monitoring side (`/metrics`; the metadata
//! server's dashboard), hardened like the data listeners: connections over the limits (in all,
//! and per source address) are closed as they are accepted; a client must send its request
//! head within [`HttpLimits::header_timeout`]; a connection is closed after
//! [`HttpLimits::lifetime`] whatever it does; request heads are bounded in size by hyper
//! (`max_buf_size`), and no handler here reads a request body.
//!
//! Written on hyper directly rather than `axum::serve`, which has no header timeout and no
//! connection limit; any `tower` service (an axum `Router`) or a plain function runs on it.

use crate::limits::{ConnLimiter, Limits};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Limits of a monitoring listener.
#[derive(Clone, Debug)]
pub struct HttpLimits {
    pub max_connections: usize,
    pub max_per_host: usize,
    /// From accepting a connection (or the end of its previous response) to a complete
    /// request head.
    pub header_timeout: Duration,
    /// The longest a connection is kept, keep-alive included.
    pub lifetime: Duration,
    /// The largest request head read.
    pub max_head: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self {
            max_connections: 64,
            max_per_host: 16,
            header_timeout: Duration::from_secs(10),
            lifetime: Duration::from_secs(120),
            max_head: 16 << 10,
        }
    }
}

/// Serves `service` on `listener` until `stop`; connections still open then are given a
/// second to finish their response.
pub async fn serve<S, B>(
    listener: TcpListener,
    service: S,
    limits: HttpLimits,
    stop: CancellationToken,
) -> std::io::Result<()>
where
    S: hyper::service::Service<
            hyper::Request<Incoming>,
            Response = hyper::Response<B>,
            Error = Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let limiter = ConnLimiter::new(Limits {
        max_connections: limits.max_connections,
        max_per_host: limits.max_per_host,
        ..Limits::default()
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(limits.max_head.max(8192))
        .keep_alive(true);
    loop {
        let (tcp, addr) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "monitoring listener: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.cancelled() => return Ok(()),
        };
        let Ok(admission) = limiter.admit(addr.ip()) else {
            crate::limits::reset(tcp);
            continue;
        };
        let conn = builder.serve_connection(TokioIo::new(tcp), service.clone());
        let stop = stop.clone();
        let lifetime = limits.lifetime;
        tokio::spawn(async move {
            tokio::pin!(conn);
            let ended = tokio::select! {
                r = conn.as_mut() => Some(r),
                _ = tokio::time::sleep(lifetime) => None,
                _ = stop.cancelled() => None,
            };
            if ended.is_none() {
                // Finish the response under way, then close.
                conn.as_mut().graceful_shutdown();
                let _ = tokio::time::timeout(Duration::from_secs(1), conn).await;
            }
            drop(admission);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::Full;
    use hyper::body::Bytes;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn hello(
        _req: hyper::Request<Incoming>,
    ) -> Result<hyper::Response<Full<Bytes>>, Infallible> {
        Ok(hyper::Response::new(Full::new(Bytes::from_static(b"hi"))))
    }

    async fn start(limits: HttpLimits) -> (std::net::SocketAddr, CancellationToken) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let s = stop.clone();
        tokio::spawn(serve(
            listener,
            hyper::service::service_fn(hello),
            limits,
            s,
        ));
        (addr, stop)
    }

    /// Reads until the peer closes (or 10 s pass): what it sent.
    async fn read_to_close(c: &mut tokio::net::TcpStream) -> Vec<u8> {
        let mut got = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut got)).await;
        got
    }

    #[tokio::test]
    async fn a_client_that_never_finishes_its_request_is_closed() {
        let (addr, stop) = start(HttpLimits {
            header_timeout: Duration::from_millis(200),
            ..Default::default()
        })
        .await;
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        // No end of head: closed (with a 408) after the header timeout, not kept open.
        let got = read_to_close(&mut c).await;
        let text = String::from_utf8_lossy(&got);
        assert!(
            text.is_empty() || text.starts_with("HTTP/1.1 408"),
            "{text}"
        );
        assert_eq!(c.read(&mut [0u8; 1]).await.unwrap_or(0), 0, "closed");
        stop.cancel();
    }

    #[tokio::test]
    async fn connections_over_the_per_host_limit_are_closed_at_once() {
        let (addr, stop) = start(HttpLimits {
            max_per_host: 2,
            ..Default::default()
        })
        .await;
        // Two idle connections take the slots of this host.
        let _a = tokio::net::TcpStream::connect(addr).await.unwrap();
        let _b = tokio::net::TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        let _ = c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
        let got = read_to_close(&mut c).await;
        assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
        drop((_a, _b));
        // Once they are gone, a request is served.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut d = tokio::net::TcpStream::connect(addr).await.unwrap();
        d.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let got = read_to_close(&mut d).await;
        let text = String::from_utf8_lossy(&got);
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        assert!(text.ends_with("hi"), "{text}");
        stop.cancel();
    }

    #[tokio::test]
    async fn an_oversized_request_head_is_refused() {
        let (addr, stop) = start(HttpLimits::default()).await;
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut req = b"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: ".to_vec();
        req.extend(std::iter::repeat_n(b'a', 64 << 10));
        let _ = c.write_all(&req).await;
        let got = read_to_close(&mut c).await;
        let text = String::from_utf8_lossy(&got);
        assert!(
            text.is_empty() || text.starts_with("HTTP/1.1 431"),
            "{text}"
        );
        stop.cancel();
    }
}
