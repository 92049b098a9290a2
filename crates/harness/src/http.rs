//! One plain HTTP/1.1 GET, as a browser sends it to the metadata server's dashboard: enough to
//! check status codes, cookies and pages without an HTTP client library.

use std::io::{Read, Write};
use std::time::Duration;

/// What came back.
pub struct Reply {
    pub status: u16,
    /// Status line and headers.
    pub head: String,
    pub body: String,
}

impl Reply {
    /// The value of the `Set-Cookie` header (whole, attributes included), if any.
    pub fn set_cookie(&self) -> Option<&str> {
        self.head.lines().find_map(|l| {
            l.strip_prefix("set-cookie: ")
                .or_else(|| l.strip_prefix("Set-Cookie: "))
        })
    }
}

/// GETs `path` from `addr` (`host:port`) with an optional `Cookie` header, waiting at most
/// `timeout` for each read; the connection is closed after the reply.
pub fn get(
    addr: &str,
    path: &str,
    cookie: Option<&str>,
    timeout: Duration,
) -> std::io::Result<Reply> {
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(timeout))?;
    let cookie = cookie
        .map(|c| format!("Cookie: {c}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{cookie}Connection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok(Reply {
        status,
        head: head.to_string(),
        body: body.to_string(),
    })
}
