//! Job notifications: when a job ends, the metadata server POSTs a JSON document about it to
//! the job's webhook (`haul submit --webhook URL`), retried with back-off until the receiver
//! answers 2xx or the attempts run out.
//!
//! Written on hyper's connection-level client (one request per connection, plain TCP or TLS
//! with the Mozilla roots of `webpki-roots`): a full HTTP client crate would add a second TLS
//! stack and a connection pool for one POST per job.

use catalog::JobRecord;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use std::sync::Arc;
use std::time::Duration;

/// Attempts per notification, and the first wait between them (doubled each time).
pub const ATTEMPTS: u32 = 6;
const FIRST_WAIT: Duration = Duration::from_secs(1);
/// One attempt: connect, TLS, send, answer.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

/// The document sent about an ended job.
pub fn document(j: &JobRecord, error: &str) -> serde_json::Value {
    serde_json::json!({
        "version": 1,
        "event": "job.ended",
        "job": {
            "id": j.id,
            "user": j.user,
            "state": j.state,
            "priority": j.priority,
            "files": j.files,
            "files_done": j.files_done,
            "files_failed": j.files_failed,
            "files_cancelled": j.files_cancelled,
            "bytes": j.bytes,
            "bytes_done": j.bytes_done,
            "created": crate::state::rfc3339(j.created_ms),
            "ended": crate::state::rfc3339(j.ended_ms),
            "error": error,
        }
    })
}

/// Whether an address is one a webhook may not reach unless the operator allows it: the
/// metadata server's own host, private networks, link-local (cloud metadata services).
pub fn is_private(ip: std::net::IpAddr) -> bool {
    match ip {
        std::net::IpAddr::V4(a) => {
            a.is_loopback()
                || a.is_private()
                || a.is_link_local()
                || a.is_unspecified()
                || a.is_broadcast()
                || a.octets()[0] == 100 && (a.octets()[1] & 0xc0) == 64
        }
        std::net::IpAddr::V6(a) => {
            a.is_loopback()
                || a.is_unspecified()
                || (a.segments()[0] & 0xfe00) == 0xfc00
                || (a.segments()[0] & 0xffc0) == 0xfe80
                || a.to_ipv4_mapped().is_some_and(|v4| is_private(v4.into()))
        }
    }
}

/// Whether `url` names such an address literally (or `localhost`); names are checked again
/// when resolved, at each attempt.
pub fn names_private_address(url: &str) -> bool {
    let Ok(uri) = url.parse::<hyper::Uri>() else {
        return false;
    };
    let Some(host) = uri.host() else { return false };
    let host = host.trim_matches(['[', ']']);
    host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(is_private)
}

/// Sends `doc` to `url` in the background, retrying; the outcome is logged. Unless
/// `allow_private`, an address [`is_private`] is refused. `done` runs at the end, delivered
/// or given up.
pub fn post(
    url: String,
    doc: serde_json::Value,
    allow_private: bool,
    done: impl std::future::Future<Output = ()> + Send + 'static,
) {
    tokio::spawn(async move {
        deliver(&url, &doc, allow_private).await;
        done.await;
    });
}

async fn deliver(url: &str, doc: &serde_json::Value, allow_private: bool) {
    let body = doc.to_string();
    let mut wait = FIRST_WAIT;
    for attempt in 1..=ATTEMPTS {
        match tokio::time::timeout(ATTEMPT_TIMEOUT, post_once(url, &body, allow_private)).await {
            Ok(Ok(status)) if (200..300).contains(&status) => {
                tracing::info!(url = %url, status, attempt, "job notification delivered");
                return;
            }
            Ok(Ok(status)) => {
                tracing::warn!(url = %url, status, attempt, "job notification refused")
            }
            Ok(Err(e)) => {
                tracing::warn!(url = %url, error = %e, attempt, "job notification failed")
            }
            Err(_) => tracing::warn!(url = %url, attempt, "job notification timed out"),
        }
        if attempt < ATTEMPTS {
            tokio::time::sleep(wait).await;
            wait *= 2;
        }
    }
    tracing::error!(url = %url, "job notification given up after {ATTEMPTS} attempts");
}

/// One POST; the answer's status code.
async fn post_once(url: &str, body: &str, allow_private: bool) -> Result<u16, String> {
    let uri: hyper::Uri = url.parse().map_err(|e| format!("{e}"))?;
    let https = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => return Err("only http:// and https:// URLs".into()),
    };
    let host = uri.host().ok_or("the URL names no host")?.to_string();
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let addrs: Vec<std::net::SocketAddr> =
        tokio::net::lookup_host((host.trim_matches(['[', ']']), port))
            .await
            .map_err(|e| format!("resolve {host}: {e}"))?
            .collect();
    if !allow_private && addrs.iter().any(|a| is_private(a.ip())) {
        return Err(format!(
            "{host} is a loopback, private or link-local address (allowed with --job-webhooks-to-private)"
        ));
    }
    let addr = *addrs.first().ok_or_else(|| format!("{host}: no address"))?;
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {host}:{port}: {e}"))?;
    let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let req = hyper::Request::post(path)
        .header(
            hyper::header::HOST,
            uri.authority().map(|a| a.as_str()).unwrap_or(&host),
        )
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .header(
            hyper::header::USER_AGENT,
            concat!("longhaul/", env!("CARGO_PKG_VERSION")),
        )
        .body(Full::new(Bytes::from(body.to_string())))
        .map_err(|e| e.to_string())?;
    if https {
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        let config = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name =
            rustls::pki_types::ServerName::try_from(host.trim_matches(['[', ']']).to_string())
                .map_err(|e| e.to_string())?;
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS: {e}"))?;
        send(hyper_util::rt::TokioIo::new(tls), req).await
    } else {
        send(hyper_util::rt::TokioIo::new(tcp), req).await
    }
}

async fn send<T>(io: T, req: hyper::Request<Full<Bytes>>) -> Result<u16, String>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| e.to_string())?;
    let driver = tokio::spawn(conn);
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    // Read (and drop) a bounded answer so the receiver sees the exchange complete.
    let _ = tokio::time::timeout(
        Duration::from_secs(2),
        http_body_util::Limited::new(resp.into_body(), 64 * 1024).collect(),
    )
    .await;
    driver.abort();
    Ok(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_addresses_are_named() {
        for u in [
            "http://127.0.0.1:9/x",
            "http://localhost/x",
            "https://10.1.2.3/",
            "http://169.254.169.254/latest/meta-data",
            "http://[::1]:80/",
            "http://[fe80::1]/",
            "http://192.168.0.1/",
            "http://100.64.0.1/",
            "http://[::ffff:10.0.0.1]/",
        ] {
            assert!(names_private_address(u), "{u}");
        }
        for u in [
            "https://ops.example.org/hook",
            "http://198.51.100.7/",
            "http://[2001:db8::1]/",
        ] {
            assert!(!names_private_address(u), "{u}");
        }
    }
}
