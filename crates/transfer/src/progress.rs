//! What a transfer reports while it runs: counters read by progress bars and stall detection,
//! and per-file events.

use std::sync::atomic::{AtomicU64, Ordering};
use wire::checksum::Digest;
use wire::error::ErrorInfo;

/// Live counters of a transfer (all sessions and attempts add to the same counters).
#[derive(Debug, Default)]
pub struct Counters {
    /// Payload bytes confirmed by the destination (or written, on the receiving side).
    pub bytes_done: AtomicU64,
    /// Payload bytes given to the network (including resends).
    pub bytes_sent: AtomicU64,
    pub files_done: AtomicU64,
    pub files_failed: AtomicU64,
    pub total_bytes: AtomicU64,
    pub total_files: AtomicU64,
    /// Bytes not sent because the destination already had them (set per attempt).
    pub bytes_skipped: AtomicU64,
    /// Payload bytes received and written by a local sink, or reported written by the
    /// destination of a third-party copy (cumulative over attempts, including rewrites).
    pub bytes_received: AtomicU64,
    /// Any sign of life from the data path (frames, acks), for stall detection.
    pub activity: AtomicU64,
    /// Data streams of the sessions in progress, as planned (see `StreamsInUse`).
    pub streams: AtomicU64,
}

/// A session's share of `Counters::streams`: what it plans now, taken back when it ends.
pub struct StreamsInUse {
    counters: std::sync::Arc<Counters>,
    streams: u64,
}

impl StreamsInUse {
    pub fn new(counters: &std::sync::Arc<Counters>, streams: u32) -> Self {
        counters
            .streams
            .fetch_add(streams as u64, Ordering::Relaxed);
        Self {
            counters: counters.clone(),
            streams: streams as u64,
        }
    }

    /// The session now plans `streams`.
    pub fn set(&mut self, streams: u32) {
        let new = streams as u64;
        if new >= self.streams {
            self.counters
                .streams
                .fetch_add(new - self.streams, Ordering::Relaxed);
        } else {
            self.counters
                .streams
                .fetch_sub(self.streams - new, Ordering::Relaxed);
        }
        self.streams = new;
    }
}

impl Drop for StreamsInUse {
    fn drop(&mut self) {
        self.counters
            .streams
            .fetch_sub(self.streams, Ordering::Relaxed);
    }
}

impl Counters {
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    pub fn set(c: &AtomicU64, n: u64) {
        c.store(n, Ordering::Relaxed);
    }
}

/// Something that happened to a file or a stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The session began on a file (the source claimed it to read, or the destination opened
    /// it to write): the start of its transfer log record.
    FileStarted {
        path: String,
    },
    FileDone {
        path: String,
        size: u64,
        digests: Vec<Digest>,
        skipped: bool,
    },
    FileFailed {
        path: String,
        error: ErrorInfo,
    },
    /// Verification failed; the file is sent again from scratch.
    FileRetry {
        path: String,
        attempt: u32,
        reason: String,
    },
    StreamLost {
        stream: u32,
    },
    /// A whole attempt failed and the transfer resumes after a pause.
    Retrying {
        attempt: u32,
        delay_ms: u64,
        reason: String,
    },
    /// How streams and buffers were chosen.
    Plan {
        streams: u32,
        explanation: String,
    },
}

pub type EventSender = tokio::sync::mpsc::UnboundedSender<Event>;

/// The span of one file of a session (`file{path=...}`), below the session's own.
pub fn file_span(session: &tracing::Span, path: &str) -> tracing::Span {
    tracing::debug_span!(parent: session, "file", path = %path)
}

/// A file a session finished (`what`: "file sent", "file received"), logged in its span below
/// `session`, as the event the copy hears.
pub fn file_done(
    session: &tracing::Span,
    what: &'static str,
    path: String,
    size: u64,
    digests: Vec<Digest>,
    skipped: bool,
) -> Event {
    file_span(session, &path).in_scope(|| tracing::debug!(size, skipped, "{what}"));
    Event::FileDone {
        path,
        size,
        digests,
        skipped,
    }
}

/// A file a session gave up, logged in its span below `session` with its error's kind, as
/// the event the copy hears.
pub fn file_failed(session: &tracing::Span, path: String, error: ErrorInfo) -> Event {
    file_span(session, &path).in_scope(|| {
        tracing::info!(kind = error.kind.name(), error = %error.message, "file failed");
    });
    Event::FileFailed { path, error }
}
