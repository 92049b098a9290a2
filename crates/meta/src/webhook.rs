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

/// Sends `doc` to `url` in the background, retrying; the outcome is logged.
pub fn post(url: String, doc: serde_json::Value) {
    tokio::spawn(async move {
        let body = doc.to_string();
        let mut wait = FIRST_WAIT;
        for attempt in 1..=ATTEMPTS {
            match tokio::time::timeout(ATTEMPT_TIMEOUT, post_once(&url, &body)).await {
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
    });
}

/// One POST; the answer's status code.
async fn post_once(url: &str, body: &str) -> Result<u16, String> {
    let uri: hyper::Uri = url.parse().map_err(|e| format!("{e}"))?;
    let https = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => return Err("only http:// and https:// URLs".into()),
    };
    let host = uri.host().ok_or("the URL names no host")?.to_string();
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let tcp = tokio::net::TcpStream::connect((host.trim_matches(['[', ']']), port))
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
