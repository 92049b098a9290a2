//! `client::list` against an endpoint that lies: it must stop at its bounds with a protocol
//! error (never hold more than a listing may have), refuse names that climb out, and refuse
//! empty parts that would keep it reading forever. The "endpoint" here is a plain TCP server
//! in the test speaking the control protocol's frames; every loop is bounded.

use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use transfer::client::{Peer, list};
use wire::control::{HostLimits, ListingEntry, PROTOCOL_VERSION, Response};
use wire::data::Timestamp;

/// A server that welcomes one client and then writes `parts` (each an encoded frame) until it
/// has written them all or the client goes away. Returns its port.
async fn liar(parts: impl Iterator<Item = Response> + Send + 'static) -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let (mut r, mut w) = s.split();
        // Whatever the client says is read and dropped.
        let drain = async {
            let mut buf = [0u8; 4096];
            while matches!(r.read(&mut buf).await, Ok(n) if n > 0) {}
        };
        let talk = async {
            let welcome = Response::Welcome {
                version: PROTOCOL_VERSION,
                agent: "liar".into(),
                identity: "anonymous".into(),
                subject: String::new(),
                limits: HostLimits::default(),
            };
            if w.write_all(&welcome.encode()).await.is_err() {
                return;
            }
            for p in parts {
                if w.write_all(&p.encode()).await.is_err() {
                    return;
                }
            }
            // Then silence, until the client gives up.
            tokio::time::sleep(Duration::from_secs(120)).await;
        };
        tokio::select! {
            _ = drain => {}
            _ = talk => {}
        }
    });
    port
}

fn entries(from: usize, n: usize, name: impl Fn(usize) -> String) -> Vec<ListingEntry> {
    (from..from + n)
        .map(|i| ListingEntry {
            rel: name(i),
            is_dir: false,
            size: 1,
            mode: 0o644,
            mtime: Timestamp { secs: 0, nanos: 0 },
        })
        .collect()
}

async fn listed(port: u16) -> Result<usize, String> {
    let r = tokio::time::timeout(
        Duration::from_secs(90),
        list(&Peer::new("127.0.0.1", port), "d", true, None),
    )
    .await
    .map_err(|_| "the client did not stop".to_string())?;
    r.map(|l| l.entries.len()).map_err(|e| e.to_string())
}

#[tokio::test]
async fn an_endless_listing_stops_at_the_bound() {
    // Parts of 5,000 entries, never marked last: 1,000,000 entries are the most one listing
    // may have; the client refuses once past them.
    const PART: usize = 5_000;
    let parts = (0..).map(|k| Response::Listing {
        entries: entries(k * PART, PART, |i| format!("d/f{i}")),
        unsendable: Vec::new(),
        last: false,
    });
    let port = liar(parts.take(wire::control::MAX_LISTING / PART + 10)).await;
    let e = listed(port).await.unwrap_err();
    assert!(e.contains("more than a listing may have"), "{e}");
}

#[tokio::test]
async fn names_that_climb_out_are_refused() {
    for bad in ["../etc/passwd", "/etc/passwd", "d/../../x", ""] {
        let parts = std::iter::once(Response::Listing {
            entries: entries(0, 1, |_| bad.to_string()),
            unsendable: Vec::new(),
            last: true,
        });
        let e = listed(liar(parts).await).await.unwrap_err();
        assert!(e.contains("bad name"), "{bad:?}: {e}");
    }
}

#[tokio::test]
async fn empty_parts_and_other_answers_are_refused() {
    let parts = std::iter::repeat_with(|| Response::Listing {
        entries: Vec::new(),
        unsendable: Vec::new(),
        last: false,
    })
    .take(3);
    let e = listed(liar(parts).await).await.unwrap_err();
    assert!(e.contains("empty listing part"), "{e}");
    let parts = std::iter::once(Response::SourceReady { files: 1, bytes: 1 });
    let e = listed(liar(parts).await).await.unwrap_err();
    assert!(e.contains("expected a listing"), "{e}");
    // An honest one, for contrast.
    let parts = [
        Response::Listing {
            entries: entries(0, 3, |i| format!("d/f{i}")),
            unsendable: Vec::new(),
            last: false,
        },
        Response::Listing {
            entries: entries(3, 2, |i| format!("d/f{i}")),
            unsendable: Vec::new(),
            last: true,
        },
    ];
    assert_eq!(listed(liar(parts.into_iter()).await).await, Ok(5));
}
