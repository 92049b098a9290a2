//! The client side of `haul cp`: parses the two locations, runs the transfer as an upload, a
//! download, or a third-party copy between two endpoints (the data flows from one endpoint
//! straight to the other; the client only orchestrates), and retries: an attempt that fails
//! for a reason that can pass (lost connection, stall, failed verification) is resumed from
//! the destination's restart ledgers after a back-off, up to the retry limit.

pub use crate::attempt::AttemptContext;
use crate::attempt::{self, StallWatch};
use crate::conn::{self, ClientTls, Session, StreamTarget, open_streams};
use crate::error::TransferError;
use crate::pool::MemoryBudget;
use crate::progress::{Counters, Event, EventSender};
use crate::service::SinkNaming;
use crate::sink_session::{DEFAULT_SESSION_BUFFER, SinkSpec, run_sink};
use crate::source_session::{SourceSpec, run_source};
use crate::store::{self, Destination, Root, SourceEntry};
use crate::sys;
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use wire::checksum::Digest;
use wire::control::{
    HostLimits, ListedFile, PushTarget, Request, Response, SessionOptions, SessionSummary,
};
use wire::error::{ErrorInfo, ErrorKind};
use wire::grant::SignedGrant;
use wire::plan::{Choices, PathFacts, Plan, plan};
use wire::retry::RetryPolicy;

/// Default TCP port of a haul endpoint.
pub const DEFAULT_PORT: u16 = 5811;

/// One side of a copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    Local(PathBuf),
    Remote {
        host: String,
        port: u16,
        path: String,
    },
}

impl Location {
    /// Parses `haul://host[:port]/path` or a local path.
    pub fn parse(s: &str) -> Result<Self, TransferError> {
        let Some(rest) = s.strip_prefix("haul://") else {
            if s.contains("://") {
                return Err(TransferError::usage(format!(
                    "{s}: unsupported URL scheme; use a local path or haul://host[:port]/path"
                )));
            }
            if s.is_empty() {
                return Err(TransferError::usage("empty path"));
            }
            return Ok(Location::Local(PathBuf::from(s)));
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let bad = || TransferError::usage(format!("{s}: expected haul://host[:port]/path"));
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let end = v6.find(']').ok_or_else(bad)?;
            let host = &v6[..end];
            let port = match &v6[end + 1..] {
                "" => DEFAULT_PORT,
                p => p
                    .strip_prefix(':')
                    .and_then(|p| p.parse().ok())
                    .ok_or_else(bad)?,
            };
            (host.to_string(), port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), p.parse().map_err(|_| bad())?),
                None => (authority.to_string(), DEFAULT_PORT),
            }
        };
        if host.is_empty() {
            return Err(bad());
        }
        Ok(Location::Remote {
            host,
            port,
            path: path.to_string(),
        })
    }

    pub fn is_remote(&self) -> bool {
        matches!(self, Location::Remote { .. })
    }
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Local(p) => write!(f, "{}", p.display()),
            Location::Remote { host, port, path } => {
                write!(f, "haul://{}{path}", conn::format_addr(host, *port))
            }
        }
    }
}

/// How to copy.
#[derive(Clone)]
pub struct CopyOptions {
    pub recursive: bool,
    /// `(offset, length)` of a single source file.
    pub range: Option<(u64, u64)>,
    pub session: SessionOptions,
    pub retry: RetryPolicy,
    /// `None` for `--insecure` (plain control connections).
    pub tls: Option<ClientTls>,
    /// Bandwidth the plan should be able to reach (bits/s).
    pub link_bps: u64,
    /// How often a local destination syncs and records its restart ledgers.
    pub checkpoint_interval: Duration,
    /// Third-party sessions and downloads take their control connections from here and put
    /// them back when they end cleanly (the metadata server's, a mount's; `None` connects
    /// anew each time).
    pub control_pool: Option<Arc<crate::control_pool::ControlPool>>,
    /// Third-party sessions connect to these peers with their own TLS (a user's delegation
    /// the metadata server acts with at an endpoint), never through the pool.
    pub peer_tls: Vec<(Peer, ClientTls)>,
    /// Local files are sent on clear streams with `sendfile` from the page cache (`false`:
    /// written from a buffer, as on TLS streams; `--no-zero-copy`).
    pub zero_copy: bool,
    /// Sessions that send from this side (uploads) are traced here (`--trace`).
    pub trace: Option<Arc<crate::trace::TraceFile>>,
    /// An upload waits (a round trip or so) for the destination's summary, whose evidence
    /// the bottleneck report needs; without it the upload ends as soon as every file is
    /// acknowledged.
    pub receiver_evidence: bool,
}

/// One file in the report.
#[derive(Clone, Debug, Serialize)]
pub struct FileReport {
    pub path: String,
    pub bytes: u64,
    pub checksums: std::collections::BTreeMap<String, String>,
    pub skipped: bool,
    /// The grid storage node it was written to or read from (grid copies only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// What a copy did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CopyReport {
    pub source: String,
    pub destination: String,
    /// Bytes of the dataset (or range).
    pub bytes_total: u64,
    /// Bytes that crossed the network in the final attempt.
    pub bytes_moved: u64,
    /// Bytes the destination already had (resume) in the final attempt.
    pub bytes_skipped: u64,
    /// Bytes that crossed the network in all attempts together.
    pub bytes_moved_total: u64,
    /// Bytes that crossed the network more than once: everything moved minus what the
    /// destination lacked when the command started (the data of interrupted attempts that
    /// was not yet durable at the destination, and blocks sent again within an attempt).
    pub bytes_resent: u64,
    /// Every attempt, in order: what it moved, what it found already there, how it ended.
    pub attempt_list: Vec<AttemptRecord>,
    pub files: u64,
    pub files_failed: u64,
    pub seconds: f64,
    /// Dataset bytes per second of wall clock, in Mbit/s.
    pub mbit_per_s: f64,
    pub streams: u32,
    pub attempts: u32,
    pub retries: u32,
    pub blocks_resent: u64,
    pub streams_lost: u32,
    pub plan: String,
    /// Congestion control of the data streams; `cubic->bbr` (and `->cubic`) after switches.
    pub congestion: String,
    /// Each congestion control switch of the last attempt: when, to what, and the evidence
    /// (loss events with and without a queue, delivery rates, retransmitted share) with the
    /// reason in words.
    pub cc_decisions: Vec<wire::losscause::Decision>,
    pub protect: String,
    pub tcp_retransmits: u64,
    /// Local files were sent with `sendfile` (uploads; `null` when the source was remote).
    pub zero_copy: Option<bool>,
    pub checksums: Vec<String>,
    pub file_list: Vec<FileReport>,
    pub failures: Vec<crate::error::FileFailure>,
    /// Where the last attempt's time went and the one factor that limited it, with the
    /// advice that removes it (`--explain` prints it in words).
    pub bottleneck: Option<wire::bottleneck::Verdict>,
    #[serde(skip)]
    pub first_failure: Option<ErrorInfo>,
    /// Blocks sent with the CRCs their writer recorded, never read to checksum them
    /// (`haul mount`'s uploads of its spools).
    #[serde(skip)]
    pub blocks_unread: u64,
}

/// What the transfer log records of a whole copy (all its attempts).
impl From<&CopyReport> for crate::translog::SessionStats {
    fn from(r: &CopyReport) -> Self {
        Self {
            files: r.files,
            files_failed: r.files_failed,
            bytes_total: r.bytes_total,
            bytes_moved: r.bytes_moved_total,
            bytes_resumed: r.bytes_skipped,
            bytes_resent: r.bytes_resent,
            blocks_resent: r.blocks_resent,
            attempts: r.attempts,
            streams_lost: r.streams_lost,
            congestion: r.congestion.clone(),
            retransmits: r.tcp_retransmits,
            plan: r.plan.clone(),
            first_failure: r.first_failure.clone(),
            bottleneck: r.bottleneck.clone(),
        }
    }
}

/// One attempt of a copy, as the report shows it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct AttemptRecord {
    pub attempt: u32,
    pub seconds: f64,
    /// Payload bytes that crossed the network in this attempt.
    pub bytes_moved: u64,
    /// Bytes the destination already had when this attempt started (resumed or complete).
    pub bytes_resumed: u64,
    /// Why the attempt ended, if it failed.
    pub error: Option<String>,
}

/// What one session (one attempt of a copy) did.
#[derive(Clone, Debug, Default)]
pub struct Attempt {
    pub bytes_total: u64,
    pub files: u64,
    pub source: SessionSummary,
    pub sink: SessionSummary,
    pub plan: String,
    /// Whether this side, as the source, sent with `sendfile` (`None`: the source was remote).
    pub zero_copy: Option<bool>,
    /// Blocks this side sent with the CRC their writer recorded, without reading them.
    pub blocks_unread: u64,
    /// The round trip to the endpoint, measured on the control connection's handshake
    /// (`None` where this side did not connect: a third-party copy).
    pub rtt: Option<Duration>,
}

/// What `haul doctor` learns of an endpoint by saying hello: the round trip, the endpoint's
/// host limits, the path MTU, and its address.
pub struct Probe {
    pub rtt: Duration,
    pub limits: HostLimits,
    pub path_mtu: Option<u64>,
    pub ip: Option<std::net::IpAddr>,
}

/// Connects to `peer` (with TLS unless `tls` is `None`), exchanges hellos and a few
/// requests (the lowest round trip of them counts), and hangs up.
pub async fn probe(peer: &Peer, tls: Option<&ClientTls>) -> Result<Probe, TransferError> {
    let mut s = conn::connect_control(&peer.host, peer.port, tls, &sys::host_limits()).await?;
    for _ in 0..4 {
        s.send(&Request::Stat { path: "/".into() }).await?;
        let _ = s.reader.response().await?;
    }
    let (rtt, path_mtu, ip) = s.path();
    let probe = Probe {
        rtt: rtt.unwrap_or(s.rtt),
        limits: s.limits.clone(),
        path_mtu,
        ip,
    };
    s.writer.shutdown().await;
    Ok(probe)
}

/// What an endpoint would send of `path` (`Request::List`): its entries in enumeration order
/// (parents first) and what it cannot send, with why.
#[derive(Clone, Debug, Default)]
pub struct Listing {
    pub entries: Vec<wire::control::ListingEntry>,
    pub unsendable: Vec<(String, wire::error::ErrorInfo)>,
}

/// Asks `peer` what a source session of `path` would send, without sending it.
pub async fn list(
    peer: &Peer,
    path: &str,
    recursive: bool,
    tls: Option<&ClientTls>,
) -> Result<Listing, TransferError> {
    let mut s = conn::connect_control(&peer.host, peer.port, tls, &sys::host_limits()).await?;
    s.send(&Request::List {
        path: path.to_string(),
        recursive,
    })
    .await?;
    let mut out = Listing::default();
    // What a hostile endpoint may make this side hold: MAX_LISTING entries, LISTING_BYTES of
    // names and messages; each part within a minute.
    const LISTING_BYTES: usize = 256 << 20;
    const PART_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
    let mut bytes = 0usize;
    loop {
        let part = tokio::time::timeout(PART_TIMEOUT, s.reader.response())
            .await
            .map_err(|_| TransferError::stalled("the endpoint sent no listing for 60 s"))??;
        match part {
            Response::Listing {
                entries,
                unsendable,
                last,
            } => {
                if entries.is_empty() && unsendable.is_empty() && !last {
                    return Err(TransferError::protocol(
                        "the endpoint sent an empty listing part",
                    ));
                }
                for e in &entries {
                    wire::data::validate_relative_path(&e.rel).map_err(|why| {
                        TransferError::protocol(format!("the endpoint listed a bad name: {why}"))
                    })?;
                    bytes += e.rel.len();
                }
                for (rel, e) in &unsendable {
                    bytes += rel.len() + e.message.len();
                }
                out.entries.extend(entries);
                out.unsendable.extend(unsendable);
                if out.entries.len() + out.unsendable.len() > wire::control::MAX_LISTING
                    || bytes > LISTING_BYTES
                {
                    return Err(TransferError::protocol(
                        "the endpoint listed more than a listing may have (1,000,000 entries, 256 MiB of names)",
                    ));
                }
                if last {
                    break;
                }
            }
            Response::Error(e) => return Err(e.into()),
            other => {
                return Err(TransferError::protocol(format!(
                    "expected a listing, got {other:?}"
                )));
            }
        }
    }
    s.writer.shutdown().await;
    Ok(out)
}

/// An endpoint (or storage node) to talk to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    pub host: String,
    pub port: u16,
}

impl Peer {
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        Self {
            host: host.into(),
            port,
        }
    }

    /// Parses `host:port` (`[v6]:port`).
    pub fn parse(addr: &str) -> Result<Self, TransferError> {
        let bad = || TransferError::usage(format!("{addr}: expected host:port"));
        let (h, p) = addr.rsplit_once(':').ok_or_else(bad)?;
        let h = h.trim_start_matches('[').trim_end_matches(']');
        if h.is_empty() {
            return Err(bad());
        }
        Ok(Self::new(h, p.parse().map_err(|_| bad())?))
    }
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&conn::format_addr(&self.host, self.port))
    }
}

/// What a destination endpoint is asked to receive.
#[derive(Clone, Debug, Default)]
pub struct SinkRequest {
    /// Destination path (cp semantics); ignored by storage nodes, which name files by id.
    pub dest: String,
    /// How the destination takes `dest` (see `Request::OpenSink`); `None`: it decides.
    pub into_dir: Option<bool>,
    /// Where to record how the destination resolved `dest` (its `SinkReady`), so that the
    /// retries of a transfer keep the first attempt's naming.
    pub resolved: Option<Arc<std::sync::OnceLock<bool>>>,
    /// Capability for a storage node.
    pub grant: Option<SignedGrant>,
}

impl SinkRequest {
    fn note_resolved(&self, dest_is_dir: bool) {
        if let Some(r) = &self.resolved {
            let _ = r.set(dest_is_dir);
        }
    }
}

/// What a source endpoint is asked to send.
#[derive(Clone, Debug, Default)]
pub struct SourceRequest {
    pub path: String,
    pub recursive: bool,
    pub range: Option<(u64, u64)>,
    /// Exactly these files (storage nodes), instead of enumerating `path`.
    pub files: Vec<ListedFile>,
    pub grant: Option<SignedGrant>,
}

/// Copies `src` to `dst`. Events (per file, retries) go to `ctx.events`; live counters to
/// `ctx.counters`. Returns the report, also when some files failed (see `files_failed`).
pub async fn copy(
    src: &Location,
    dst: &Location,
    opts: &CopyOptions,
    ctx: AttemptContext,
) -> Result<CopyReport, TransferError> {
    if let (Location::Local(_), Location::Local(_)) = (src, dst) {
        return Err(TransferError::usage(
            "both sides are local; one of them must be an endpoint (haul://host/path)",
        ));
    }
    if opts.range.is_some() && opts.recursive {
        return Err(TransferError::usage(
            "--offset/--length apply to a single file, not with -r",
        ));
    }
    // How the destination names the copy is decided once, by the first attempt, and kept by
    // every retry: the directory the first attempt created must not make a retry copy *into*
    // it. A local destination is resolved here; an endpoint reports its decision.
    let local_dest = match dst {
        Location::Local(p) => {
            let wants_dir = p.to_string_lossy().ends_with('/');
            Some(Destination::resolve(&Root::Ambient, p, wants_dir).map_err(TransferError::from)?)
        }
        Location::Remote { .. } => None,
    };
    let naming = DestNaming {
        local: local_dest,
        remote: Arc::new(std::sync::OnceLock::new()),
    };
    with_retries(
        src.to_string(),
        dst.to_string(),
        opts,
        ctx,
        |resume, ctx| run_attempt(src, dst, &naming, opts, resume, ctx),
    )
    .await
}

/// The destination's naming, as decided by the first attempt of a copy.
struct DestNaming {
    /// A local destination, resolved before the first attempt.
    local: Option<Destination>,
    /// An endpoint's answer to the first attempt: whether it copies into `dest`.
    remote: Arc<std::sync::OnceLock<bool>>,
}

/// Runs attempts of a transfer until one succeeds, the error cannot pass, or the retry limit
/// is reached: each attempt after the first resumes (`resume` is true). An attempt that moves
/// no data for the stall timeout is cancelled and counts as failed. Files reported done in
/// any attempt stay done; the report lists them.
async fn with_retries<F, Fut>(
    source: String,
    destination: String,
    opts: &CopyOptions,
    ctx: AttemptContext,
    mut run_attempt: F,
) -> Result<CopyReport, TransferError>
where
    F: FnMut(bool, AttemptContext) -> Fut,
    Fut: std::future::Future<Output = Result<Attempt, TransferError>>,
{
    let AttemptContext {
        counters,
        events,
        cancel,
    } = ctx;
    let started = Instant::now();
    let mut history: Vec<String> = Vec::new();
    let mut attempt = 1u32;
    let watch = StallWatch {
        timeout: Duration::from_millis(opts.session.stall_timeout_ms.max(100)),
        progress: StallWatch::bytes,
        subject: String::new(),
    };
    let mut report = CopyReport {
        source,
        destination,
        ..Default::default()
    };
    let mut done_files: std::collections::BTreeMap<String, FileReport> = Default::default();
    let mut failed_files: std::collections::BTreeMap<String, ErrorInfo> = Default::default();
    loop {
        let resume = opts.session.resume || attempt > 1;
        let attempt_started = Instant::now();
        let moved_before =
            Counters::get(&counters.bytes_sent) + Counters::get(&counters.bytes_received);
        Counters::set(&counters.bytes_skipped, 0);
        let result = attempt::watched(
            counters.clone(),
            &cancel,
            &watch,
            |ctx| run_attempt(resume, ctx),
            |ev| {
                record(&ev, &mut done_files, &mut failed_files);
                let _ = events.send(ev);
            },
        )
        .await;
        if cancel.is_cancelled() {
            return Err(TransferError::interrupted());
        }
        let moved = Counters::get(&counters.bytes_sent) + Counters::get(&counters.bytes_received)
            - moved_before;
        let resumed = match &result {
            Ok(a) => a.source.bytes_skipped.max(a.sink.bytes_skipped),
            Err(_) => Counters::get(&counters.bytes_skipped),
        };
        report.attempt_list.push(AttemptRecord {
            attempt,
            seconds: attempt_started.elapsed().as_secs_f64(),
            bytes_moved: moved,
            bytes_resumed: resumed,
            error: result.as_ref().err().map(|e| e.to_string()),
        });
        // Files that failed in this attempt but are retryable get another chance.
        let retryable_files =
            !failed_files.is_empty() && failed_files.values().all(|e| e.retryable);
        let outcome = match result {
            Ok(a) if retryable_files && attempt < opts.retry.max_attempts => Err((
                TransferError::integrity(format!(
                    "{} files failed ({})",
                    failed_files.len(),
                    failed_files
                        .values()
                        .next()
                        .map(|e| e.message.clone())
                        .unwrap_or_default()
                )),
                Some(a),
            )),
            Ok(a) => Ok(a),
            Err(e) => Err((e, None)),
        };
        match outcome {
            Ok(a) => {
                fill_report(
                    &mut report,
                    &a,
                    opts,
                    attempt,
                    started,
                    done_files,
                    failed_files,
                );
                return Ok(report);
            }
            Err((e, _))
                if e.retryable() && attempt < opts.retry.max_attempts && !cancel.is_cancelled() =>
            {
                history.push(e.to_string());
                failed_files.clear();
                attempt::back_off(&opts.retry, attempt, e.to_string(), &events, &cancel).await?;
                attempt += 1;
            }
            Err((e, _)) => {
                if history.is_empty() {
                    return Err(e);
                }
                // A retried error keeps its kind; its message tells the attempts' story.
                if !e.retryable() {
                    return Err(e);
                }
                let msg = retry_summary(&e.to_string(), &history);
                return Err(e.with_message(msg));
            }
        }
    }
}

/// The final error of a transfer that was retried: the last attempt's error, how many
/// attempts there were, and the earlier attempts' errors (`history`, oldest first) — once, when
/// every attempt failed the same way.
fn retry_summary(last: &str, history: &[String]) -> String {
    let attempts = history.len() + 1;
    if history.iter().all(|h| h == last) {
        return format!(
            "{last}; tried {attempts} times, resuming each time; every attempt failed the same way"
        );
    }
    let earlier: Vec<String> = history
        .iter()
        .enumerate()
        .map(|(i, h)| format!("attempt {}: {h}", i + 1))
        .collect();
    format!(
        "{last}; tried {attempts} times, resuming each time (earlier: {})",
        earlier.join("; ")
    )
}

fn record(
    ev: &Event,
    done: &mut std::collections::BTreeMap<String, FileReport>,
    failed: &mut std::collections::BTreeMap<String, ErrorInfo>,
) {
    match ev {
        Event::FileDone {
            path,
            size,
            digests,
            skipped,
        } => {
            failed.remove(path);
            let checksums = digests
                .iter()
                .map(|d: &Digest| (d.algorithm.to_string(), d.hex()))
                .collect();
            done.insert(
                path.clone(),
                FileReport {
                    path: path.clone(),
                    bytes: *size,
                    checksums,
                    skipped: *skipped,
                    node: None,
                },
            );
        }
        Event::FileFailed { path, error } if !done.contains_key(path) => {
            failed.insert(path.clone(), error.clone());
        }
        _ => {}
    }
}

fn fill_report(
    report: &mut CopyReport,
    a: &Attempt,
    opts: &CopyOptions,
    attempt: u32,
    started: Instant,
    done: std::collections::BTreeMap<String, FileReport>,
    failed: std::collections::BTreeMap<String, ErrorInfo>,
) {
    report.bytes_total = a.bytes_total;
    report.bytes_moved = a.source.bytes_moved;
    report.bytes_skipped = a.source.bytes_skipped.max(a.sink.bytes_skipped);
    report.bytes_moved_total = report.attempt_list.iter().map(|r| r.bytes_moved).sum();
    // What the destination lacked at the start: all of it, less what the first attempt found
    // already there (a `--resume` of an earlier command).
    let had = report
        .attempt_list
        .first()
        .map(|r| r.bytes_resumed)
        .unwrap_or(0);
    report.bytes_resent = report
        .bytes_moved_total
        .saturating_sub(a.bytes_total.saturating_sub(had));
    report.files = a.files;
    report.files_failed = failed.len() as u64;
    report.seconds = started.elapsed().as_secs_f64();
    report.mbit_per_s = a.bytes_total as f64 * 8.0 / report.seconds.max(1e-9) / 1e6;
    report.streams = a.source.streams.max(a.sink.streams);
    report.attempts = attempt;
    report.retries = attempt - 1;
    report.blocks_resent = a.source.blocks_resent;
    report.streams_lost = a.source.streams_lost;
    report.plan = a.plan.clone();
    report.congestion = a.source.congestion.clone();
    report.protect = format!("{:?}", opts.session.protect).to_lowercase();
    report.tcp_retransmits = a.source.tcp_retransmits;
    report.cc_decisions = a.source.cc_decisions.clone();
    report.zero_copy = a.zero_copy;
    report.blocks_unread = a.blocks_unread;
    report.checksums = opts
        .session
        .checksums
        .iter()
        .map(|c| c.to_string())
        .collect();
    report.file_list = done.into_values().collect();
    report.first_failure = failed.values().next().cloned();
    report.failures = failed
        .into_iter()
        .map(|(path, e)| crate::error::FileFailure {
            error: (&e).into(),
            path,
        })
        .collect();
    let seconds = report.attempt_list.last().map_or(0.0, |r| r.seconds);
    report.bottleneck = Some(wire::bottleneck::diagnose(&wire::bottleneck::Transfer {
        bytes: a.source.bytes_moved.max(a.sink.bytes_moved),
        files: a.files,
        seconds,
        rate_cap_bps: opts.session.rate_bps,
        link_bps: opts.link_bps,
        send: a.source.send.clone(),
        receive: a.sink.receive.clone(),
    }));
}

fn random_ids() -> ([u8; 16], [u8; 32]) {
    (rand::random(), rand::random())
}

fn choices(opts: &CopyOptions) -> Choices {
    Choices {
        streams: opts.session.streams,
        tcp_buffer: opts.session.tcp_buffer,
        rate_bps: opts.session.rate_bps,
        link_bps: opts.link_bps,
        ..Default::default()
    }
}

async fn run_attempt(
    src: &Location,
    dst: &Location,
    naming: &DestNaming,
    opts: &CopyOptions,
    resume: bool,
    ctx: AttemptContext,
) -> Result<Attempt, TransferError> {
    let mut session = opts.session.clone();
    session.resume = resume;
    let source_request = |path: &str| SourceRequest {
        path: path.to_string(),
        recursive: opts.recursive,
        range: opts.range,
        ..Default::default()
    };
    let sink_request = |path: &str| SinkRequest {
        dest: path.to_string(),
        into_dir: naming.remote.get().copied(),
        resolved: Some(naming.remote.clone()),
        grant: None,
    };
    match (src, dst) {
        (Location::Local(p), Location::Remote { host, port, path }) => {
            let listing = enumerate_local(p, opts.recursive).await?;
            listing.report_unsendable(&ctx.events, |rel| rel.to_string());
            let peer = Peer::new(host.clone(), *port);
            upload(
                listing.entries,
                &peer,
                sink_request(path),
                opts,
                session,
                ctx,
            )
            .await
        }
        (Location::Remote { host, port, path }, Location::Local(_)) => {
            let dest = naming
                .local
                .clone()
                .expect("resolved before the first attempt");
            let peer = Peer::new(host.clone(), *port);
            download(
                &peer,
                source_request(path),
                Arc::new(Root::Ambient),
                Arc::new(dest),
                opts,
                session,
                ctx,
            )
            .await
        }
        (
            Location::Remote {
                host: ha,
                port: pa,
                path: a,
            },
            Location::Remote {
                host: hb,
                port: pb,
                path: b,
            },
        ) => {
            third_party(
                &Peer::new(ha.clone(), *pa),
                source_request(a),
                &Peer::new(hb.clone(), *pb),
                sink_request(b),
                opts,
                session,
                ctx,
            )
            .await
        }
        (Location::Local(_), Location::Local(_)) => unreachable!("refused in copy"),
    }
}

/// Waits for the endpoint's final `Done`, relaying its events.
async fn await_done(
    s: &mut Session,
    events: &EventSender,
    counters: Option<&Counters>,
) -> Result<SessionSummary, TransferError> {
    loop {
        match s.reader.response().await? {
            Response::Done(summary) => return Ok(summary),
            Response::Error(e) => return Err(e.into()),
            Response::Progress { bytes, files, .. } => {
                if let Some(c) = counters {
                    Counters::set(&c.bytes_done, bytes);
                    Counters::set(&c.files_done, files);
                }
            }
            Response::FileDone {
                path,
                bytes,
                digests,
            } => {
                if counters.is_some() {
                    let _ = events.send(Event::FileDone {
                        path,
                        size: bytes,
                        digests,
                        skipped: false,
                    });
                }
            }
            // Always relayed: a file the remote source failed before announcing it is known to
            // nobody else (reports merge failures by path).
            Response::FileFailed { path, error } => {
                let _ = events.send(Event::FileFailed { path, error });
            }
            other => tracing::debug!(?other, "unexpected message during a session"),
        }
    }
}

fn plan_for(
    rtt: Duration,
    sender: HostLimits,
    receiver: HostLimits,
    bytes: u64,
    files: u64,
    opts: &CopyOptions,
) -> Plan {
    plan(
        &PathFacts {
            rtt,
            sender,
            receiver,
            total_bytes: bytes,
            files,
        },
        &choices(opts),
    )
}

/// A local file or tree to send: the entries, and what cannot be sent (each to be reported
/// as a failed file).
#[derive(Debug, Default)]
pub struct LocalListing {
    pub entries: Vec<SourceEntry>,
    pub unsendable: Vec<(String, ErrorInfo)>,
}

impl LocalListing {
    /// Reports every unsendable entry as a failed file, named as `name` maps its `rel`.
    pub fn report_unsendable(&self, events: &EventSender, name: impl Fn(&str) -> String) {
        for (rel, error) in &self.unsendable {
            let _ = events.send(Event::FileFailed {
                path: name(rel),
                error: error.clone(),
            });
        }
    }
}

/// Enumerates a local file, or with `recursive` a tree (see [`store::enumerate`]).
pub async fn enumerate_local(
    path: &std::path::Path,
    recursive: bool,
) -> Result<LocalListing, TransferError> {
    let p = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let mut out = LocalListing::default();
        store::enumerate(&Root::Ambient, &p, recursive, &mut |f| {
            match f {
                store::Found::Entry(e) => out.entries.push(e),
                store::Found::Unsendable { rel, error } => out.unsendable.push((rel, error)),
            }
            true
        })
        .map(|()| out)
    })
    .await
    .map_err(|e| TransferError::local(e.to_string()))?
    .map_err(TransferError::from)
}

/// The socket buffer of data streams, set before connecting: the user's `--tcp-buffer`, or,
/// on hosts whose `net.core` limits reach autotuning's ceiling (tuned data transfer nodes),
/// that ceiling, so that windows are not held back in the first round trips; otherwise
/// kernel autotuning.
fn host_buffer(session: &SessionOptions, limits: &HostLimits) -> Option<u64> {
    session.tcp_buffer.or_else(|| {
        let cap = limits.tcp_rmem_max.min(limits.tcp_wmem_max);
        (limits.core_rmem_max.min(limits.core_wmem_max) >= cap && cap >= 16 << 20).then_some(cap)
    })
}

/// A control connection established within this is on a short path: streams are planned from
/// its round trip. Beyond it the path is long, and streams start without waiting for it.
const SHORT_PATH: Duration = Duration::from_millis(5);

/// Streams to connect before the round trip is known: `-p`, or as many as a long path wants
/// (16), fewer for small data.
fn initial_streams(opts: &CopyOptions, bytes: Option<u64>) -> u32 {
    opts.session.streams.unwrap_or_else(|| {
        let by_data = bytes.map(|b| (b >> 20).max(1)).unwrap_or(u64::MAX);
        by_data.min(16) as u32
    })
}

/// The first steps of a session with an endpoint, the same for an upload and a download.
struct Opening {
    /// The control connection (hello exchanged), and its round trip.
    control: Session,
    rtt: Duration,
    /// This host's limits (the endpoint's come with its hello).
    limits: HostLimits,
    /// Planned from the round trip with this host's limits as a guess of the endpoint's (the
    /// caller refines it from the endpoint's answer); at least the streams already opening.
    plan: Plan,
    id: wire::control::SessionId,
    key: wire::control::DataKey,
    /// Where more data streams connect to.
    target: StreamTarget,
    /// The openers under way: the first streams, connecting before the control connection
    /// is up (the session id and key are ours; the endpoint holds early binds until the
    /// session exists).
    openers: Vec<tokio::task::JoinHandle<Vec<TransferError>>>,
    tx: mpsc::Sender<conn::DataConn>,
    /// The data streams, as they connect.
    conns: mpsc::Receiver<conn::DataConn>,
}

/// Opens a session's connections to `peer`: on a short path the control connection's round
/// trip plans the streams before they open; on a long one (no answer within [`SHORT_PATH`])
/// streams start at once, as many as [`initial_streams`] says for `size` (files, bytes; when
/// known); meanwhile the control connection completes (TLS, hello). Sets the session's
/// streams and socket buffer in `session`. `hold_hello`: the streams will carry data from
/// here (see [`StreamTarget::hold_hello`]).
async fn open_session(
    peer: &Peer,
    opts: &CopyOptions,
    session: &mut SessionOptions,
    size: Option<(u64, u64)>,
    hold_hello: bool,
    cancel: &CancellationToken,
) -> Result<Opening, TransferError> {
    let (host, port) = (peer.host.as_str(), peer.port);
    let limits = sys::host_limits();
    session.tcp_buffer = host_buffer(session, &limits);
    // An idle control connection to this endpoint, from a session that ended cleanly, saves
    // the TCP and TLS handshakes and the hello (three round trips).
    let pooled = opts
        .control_pool
        .as_ref()
        .and_then(|pool| pool.take_idle(host, port))
        .map(|s| {
            let rtt = s.path().0.unwrap_or(s.rtt);
            (s, rtt)
        });
    let connect = connect_and_measure(host, port);
    tokio::pin!(connect);
    let quick = match &pooled {
        Some(_) => None,
        None => tokio::time::timeout(SHORT_PATH, &mut connect)
            .await
            .ok()
            .transpose()?,
    };
    let known_rtt = match (&pooled, &quick) {
        (Some((_, rtt)), _) | (None, Some((_, rtt))) => Some(*rtt),
        (None, None) => None,
    };
    let (files, bytes) = size.unwrap_or((1, u64::MAX / 2));
    let opened = match known_rtt {
        Some(rtt) => plan_for(rtt, limits.clone(), limits.clone(), bytes, files, opts).streams,
        None => initial_streams(opts, size.map(|(_, b)| b)),
    };
    session.streams = Some(opened);
    let (id, key) = random_ids();
    let (tx, conns) = mpsc::channel(64);
    let target = StreamTarget {
        addr: conn::format_addr(host, port),
        host: host.to_string(),
        tls: stream_tls(opts.tls.as_ref(), session)?,
        session: id,
        key,
        buffer: session.tcp_buffer,
        limits: limits.clone(),
        confirm_bind: false,
        hold_hello,
    };
    let openers = vec![tokio::spawn(open_streams(
        target.clone(),
        0,
        opened,
        tx.clone(),
        cancel.clone(),
    ))];
    let (control, rtt) = match pooled {
        Some(c) => c,
        None => {
            let (tcp, rtt) = match quick {
                Some(c) => c,
                None => connect.await?,
            };
            let control = conn::start_control(tcp, host, port, opts.tls.as_ref(), &limits).await?;
            (control, rtt)
        }
    };
    let mut plan = plan_for(rtt, limits.clone(), limits.clone(), bytes, files, opts);
    plan.streams = plan.streams.max(opened);
    Ok(Opening {
        control,
        rtt,
        limits,
        plan,
        id,
        key,
        target,
        openers,
        tx,
        conns,
    })
}

/// Connects the control connection's TCP part and measures the round trip: enough to plan
/// and start opening data streams while TLS and the hello proceed.
async fn connect_and_measure(
    host: &str,
    port: u16,
) -> Result<(tokio::net::TcpStream, Duration), TransferError> {
    let tcp = conn::connect_tcp(&conn::format_addr(host, port), None).await?;
    let rtt = conn::rtt(&tcp).unwrap_or(Duration::from_millis(1));
    Ok((tcp, rtt))
}

/// How a local session ended, once its stream openers are done: its outcome, or the error
/// that names the real cause of its failure — the endpoint's, when it reported one on the
/// control connection (the session was refused), else the first stream opener's when the
/// session failed because its streams were lost (`streams_lost` says which errors mean that),
/// else the session's own.
async fn session_outcome<T>(
    s: &mut Session,
    outcome: Result<T, TransferError>,
    openers: Vec<tokio::task::JoinHandle<Vec<TransferError>>>,
    streams_lost: impl Fn(&TransferError) -> bool,
) -> Result<T, TransferError> {
    let mut open_errors = Vec::new();
    for o in openers {
        open_errors.extend(o.await.unwrap_or_default());
    }
    let e = match outcome {
        Ok(o) => return Ok(o),
        Err(e) => e,
    };
    if let Some(real) = control_error(s).await {
        return Err(real);
    }
    match open_errors.into_iter().next() {
        Some(first) if streams_lost(&e) => Err(first),
        _ => Err(e),
    }
}

/// The error the endpoint reported on the control connection, if one arrives soon: it names
/// the real cause when data streams fail because the session was refused.
async fn control_error(s: &mut Session) -> Option<TransferError> {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
    loop {
        match tokio::time::timeout_at(deadline, s.reader.response()).await {
            Ok(Ok(Response::Error(e))) => return Some(e.into()),
            Ok(Ok(_)) => continue,
            // A refused certificate: the TLS alert says why the streams failed.
            Ok(Err(e)) if e.is_refusal() => return Some(e),
            _ => return None,
        }
    }
}

/// Sends local `entries` (named by their `rel`) to `peer` in one session.
pub async fn upload(
    entries: Vec<SourceEntry>,
    peer: &Peer,
    request: SinkRequest,
    opts: &CopyOptions,
    mut session: SessionOptions,
    ctx: AttemptContext,
) -> Result<Attempt, TransferError> {
    let AttemptContext {
        counters,
        events,
        cancel,
    } = ctx;
    if opts.range.is_some()
        && (entries.len() != 1 || entries[0].kind != wire::data::EntryKind::File)
    {
        return Err(TransferError::usage(
            "--offset/--length apply to a single file",
        ));
    }
    let files = entries.len() as u64;
    let bytes: u64 = match opts.range {
        Some((_, l)) => l,
        None => entries.iter().map(|e| e.size).sum(),
    };
    let Opening {
        control: mut s,
        rtt,
        limits,
        plan: mut p,
        id,
        key,
        target,
        mut openers,
        tx,
        conns: rx,
    } = open_session(
        peer,
        opts,
        &mut session,
        Some((files, bytes)),
        true,
        &cancel,
    )
    .await?;
    let mut in_use = crate::progress::StreamsInUse::new(&counters, p.streams);
    // Kept only until the endpoint's hello tells whether more streams are needed: once every
    // sender is gone, the session knows no stream will come any more.
    let mut tx = Some(tx);
    s.send(&Request::OpenSink {
        session: id,
        key,
        dest: request.dest.clone(),
        into_dir: request.into_dir,
        options: session.clone(),
        grant: request.grant.clone(),
    })
    .await?;
    let spec = SourceSpec {
        root: Arc::new(Root::Ambient),
        entries,
        range: opts.range,
        options: session.clone(),
        zero_copy: opts.zero_copy,
        trace: opts.trace.clone().map(|file| crate::trace::TraceTarget {
            file,
            guid: crate::translog::guid(&id),
            peer: peer.to_string(),
        }),
    };
    let source = run_source(spec, rx, counters.clone(), events.clone(), cancel.clone());
    tokio::pin!(source);
    let mut sink_summary = None;
    let mut control_open = true;
    let outcome = loop {
        tokio::select! {
            r = &mut source => break r,
            resp = s.reader.response(), if control_open => match resp {
                Ok(r @ Response::Welcome { .. }) => {
                    if let Err(e) = s.on_welcome(r) { cancel.cancel(); let _ = (&mut source).await; return Err(e); }
                                        let refined = plan_for(rtt, limits.clone(), s.limits.clone(), bytes, files, opts);
                    if let (true, Some(tx)) = (refined.streams > p.streams, tx.take()) {
                        openers.push(tokio::spawn(open_streams(target.clone(), p.streams, refined.streams, tx, cancel.clone())));
                    }
                    tx = None;
                    p = Plan { streams: refined.streams.max(p.streams), ..refined };
                    in_use.set(p.streams);
                    let _ = events.send(Event::Plan { streams: p.streams, explanation: p.explanation.clone() });
                }
                Ok(Response::SinkReady { dest_is_dir }) => request.note_resolved(dest_is_dir),
                Ok(Response::Error(e)) => { cancel.cancel(); let _ = (&mut source).await; return Err(e.into()); }
                Ok(Response::Done(summary)) => { sink_summary = Some(summary); control_open = false; tx = None; }
                                Ok(_) => {}
                // Without its control connection the endpoint drops the session.
                Err(e) => { cancel.cancel(); let _ = (&mut source).await; return Err(e); }
            },
        }
    };
    drop(tx);
    let outcome = session_outcome(&mut s, outcome, openers, |e| {
        matches!(e.kind(), ErrorKind::Connect | ErrorKind::Cancelled) && !cancel.is_cancelled()
    })
    .await?;
    if opts.receiver_evidence && sink_summary.is_none() {
        // The destination's summary follows its last acknowledgement within about a round
        // trip; its evidence is worth that wait only when the report is wanted.
        let deadline = tokio::time::Instant::now() + rtt * 2 + Duration::from_millis(500);
        while let Ok(Ok(r)) = tokio::time::timeout_at(deadline, s.reader.response()).await {
            if let Response::Done(summary) = r {
                sink_summary = Some(summary);
                break;
            }
        }
    }
    // Every file is acknowledged by the destination: no need to wait for its summary.
    s.writer.shutdown().await;
    Ok(Attempt {
        bytes_total: bytes,
        files,
        source: outcome.summary(p.explanation.clone()),
        sink: sink_summary.unwrap_or_default(),
        plan: p.explanation,
        zero_copy: Some(outcome.zero_copy),
        blocks_unread: outcome.blocks_unread,
        rtt: Some(rtt),
    })
}

fn stream_tls(
    tls: Option<&ClientTls>,
    session: &SessionOptions,
) -> Result<Option<ClientTls>, TransferError> {
    match (session.protect, tls) {
        (wire::control::Protect::Clear, _) => Ok(None),
        (wire::control::Protect::Private, Some(t)) => Ok(Some(t.clone())),
        (wire::control::Protect::Private, None) => Err(TransferError::usage(
            "--protect private needs TLS; it cannot be combined with --insecure",
        )),
    }
}

/// Receives what `request` names from `peer` into `root`, named as `naming` says, in one
/// session.
pub async fn download(
    peer: &Peer,
    request: SourceRequest,
    root: Arc<Root>,
    naming: Arc<dyn SinkNaming>,
    opts: &CopyOptions,
    mut session: SessionOptions,
    ctx: AttemptContext,
) -> Result<Attempt, TransferError> {
    let AttemptContext {
        counters,
        events,
        cancel,
    } = ctx;
    // With a file list the size is known up front; without, streams start as for a large
    // transfer, and more follow if the endpoint's answer calls for them.
    let listed_bytes: u64 = request.files.iter().map(|f| f.size).sum();
    let known = (!request.files.is_empty()).then_some((request.files.len() as u64, listed_bytes));
    let Opening {
        control: mut s,
        rtt,
        limits,
        plan: mut p,
        id,
        key,
        target,
        mut openers,
        tx,
        conns: rx,
    } = open_session(peer, opts, &mut session, known, false, &cancel).await?;
    let mut in_use = crate::progress::StreamsInUse::new(&counters, p.streams);
    s.send(&Request::OpenSource {
        session: id,
        key,
        path: request.path,
        recursive: request.recursive,
        range: request.range,
        options: session.clone(),
        push: None,
        files: request.files,
        grant: request.grant,
    })
    .await?;
    let mut tx = Some(tx);
    let spec = SinkSpec {
        root,
        naming,
        options: session,
        checkpoint_interval: opts.checkpoint_interval,
        budget: MemoryBudget::new(DEFAULT_SESSION_BUFFER, None),
        // This process's own files: its sessions may take each other's files over.
        owner: "local".into(),
    };
    let sink = run_sink(spec, rx, counters.clone(), events.clone(), cancel.clone());
    tokio::pin!(sink);
    let mut source_summary = None;
    let mut totals = (0u64, 0u64);
    let outcome = loop {
        tokio::select! {
            r = &mut sink => break r,
            resp = s.reader.response(), if source_summary.is_none() => match resp {
                Ok(r @ Response::Welcome { .. }) => {
                    if let Err(e) = s.on_welcome(r) { cancel.cancel(); let _ = (&mut sink).await; return Err(e); }
                }
                Ok(Response::SourceReady { files, bytes }) => {
                    totals = (files, bytes);
                    Counters::set(&counters.total_bytes, bytes);
                    Counters::set(&counters.total_files, files);
                                        let refined = plan_for(rtt, s.limits.clone(), limits.clone(), bytes, files, opts);
                    if let (true, Some(tx)) = (refined.streams > p.streams, tx.take()) {
                        openers.push(tokio::spawn(open_streams(target.clone(), p.streams, refined.streams, tx, cancel.clone())));
                        p = refined;
                    }
                    tx = None;
                    in_use.set(p.streams);
                    let _ = events.send(Event::Plan { streams: p.streams, explanation: p.explanation.clone() });
                }
                Ok(Response::Error(e)) => { cancel.cancel(); let _ = (&mut sink).await; return Err(e.into()); }
                Ok(Response::Done(summary)) => source_summary = Some(summary),
                // A file the source could not read, possibly before announcing it: the sink
                // never hears of it, so this is the only report of its failure.
                Ok(Response::FileFailed { path, error }) => { let _ = events.send(Event::FileFailed { path, error }); }
                                Err(e) => { cancel.cancel(); let _ = (&mut sink).await; return Err(e); }
                Ok(_) => {}
            },
        }
    };
    drop(tx);
    let outcome =
        session_outcome(&mut s, outcome, openers, |e| e.kind() == ErrorKind::Connect).await?;
    let (source, clean) = match source_summary {
        Some(s) => (s, true),
        None => {
            match tokio::time::timeout(Duration::from_secs(5), await_done(&mut s, &events, None))
                .await
            {
                Ok(Ok(summary)) => (summary, true),
                // No final report from the source: the session's outcome stands without it.
                _ => (SessionSummary::default(), false),
            }
        }
    };
    // Every response of the session read: the connection may serve the next one.
    match &opts.control_pool {
        Some(pool) if clean => pool.put(s),
        _ => s.writer.shutdown().await,
    }
    Ok(Attempt {
        bytes_total: totals.1,
        files: totals.0,
        source,
        sink: outcome.summary(),
        plan: p.explanation,
        zero_copy: None,
        blocks_unread: 0,
        rtt: Some(rtt),
    })
}

/// Has `a` send what `source` names straight to `b`, which receives it as `sink` says; this
/// process only holds the two control connections.
pub async fn third_party(
    a: &Peer,
    source: SourceRequest,
    b: &Peer,
    sink: SinkRequest,
    opts: &CopyOptions,
    session: SessionOptions,
    ctx: AttemptContext,
) -> Result<Attempt, TransferError> {
    let AttemptContext {
        counters,
        events,
        cancel,
    } = ctx;
    let limits = sys::host_limits();
    let own_tls = |p: &Peer| {
        opts.peer_tls
            .iter()
            .find(|(q, _)| q == p)
            .map(|(_, t)| t.clone())
    };
    let connect = |p: &Peer| {
        let (pool, tls, limits) = match own_tls(p) {
            Some(t) => (None, Some(t), limits.clone()),
            None => (opts.control_pool.clone(), opts.tls.clone(), limits.clone()),
        };
        let (host, port) = (p.host.clone(), p.port);
        async move {
            match pool {
                Some(pool) => pool.connect(&host, port, tls.as_ref(), &limits).await,
                None => conn::connect_control(&host, port, tls.as_ref(), &limits).await,
            }
        }
    };
    let (sa, sb) = tokio::join!(connect(a), connect(b));
    let (mut sa, mut sb) = (sa?, sb?);
    let (id_b, key_b) = random_ids();
    sb.send(&Request::OpenSink {
        session: id_b,
        key: key_b,
        dest: sink.dest.clone(),
        into_dir: sink.into_dir,
        options: session.clone(),
        grant: sink.grant.clone(),
    })
    .await?;
    // The source may start pushing before the destination confirms: its data connections wait
    // for the session, and a refusal comes back on the destination's control connection.
    let (id_a, key_a) = random_ids();
    let push = PushTarget {
        addr: conn::format_addr(&b.host, b.port),
        server_name: b.host.clone(),
        session: id_b,
        key: key_b,
        peer_limits: sb.limits.clone(),
    };
    sa.send(&Request::OpenSource {
        session: id_a,
        key: key_a,
        path: source.path,
        recursive: source.recursive,
        range: source.range,
        options: session.clone(),
        push: Some(Box::new(push)),
        files: source.files,
        grant: source.grant,
    })
    .await?;
    let (mut files, mut bytes) = (0u64, 0u64);
    let mut reported_written = 0u64;
    let mut done_a: Option<SessionSummary> = None;
    let mut done_b: Option<SessionSummary> = None;
    while done_a.is_none() || done_b.is_none() {
        tokio::select! {
            r = sa.reader.response(), if done_a.is_none() => match r? {
                Response::SourceReady { files: f, bytes: b } => {
                    (files, bytes) = (f, b);
                    Counters::set(&counters.total_bytes, b);
                    Counters::set(&counters.total_files, f);
                }
                Response::Done(s) => done_a = Some(s),
                Response::Error(e) => {
                    // The destination's own error, if it has one, is the real cause.
                    return Err(control_error(&mut sb).await.unwrap_or_else(|| e.into()));
                }
                Response::FileFailed { path, error } => { let _ = events.send(Event::FileFailed { path, error }); }
                _ => {}
            },
            r = sb.reader.response(), if done_b.is_none() => match r? {
                Response::SinkReady { dest_is_dir } => sink.note_resolved(dest_is_dir),
                Response::Done(s) => done_b = Some(s),
                Response::Error(e) => {
                    let _ = sa.writer.send_request(&Request::Cancel).await;
                    return Err(e.into());
                }
                Response::Progress { bytes, files, skipped } => {
                    Counters::set(&counters.bytes_done, bytes);
                    Counters::set(&counters.files_done, files);
                    Counters::set(&counters.bytes_skipped, skipped);
                    // What the destination wrote in this session, as it grows.
                    let written = bytes.saturating_sub(skipped);
                    Counters::add(&counters.bytes_received, written.saturating_sub(reported_written));
                    reported_written = reported_written.max(written);
                }
                Response::FileDone { path, bytes, digests } => {
                    let _ = events.send(Event::FileDone { path, size: bytes, digests, skipped: false });
                }
                Response::FileFailed { .. } => {}
                _ => {}
            },
            _ = cancel.cancelled() => {
                let _ = sa.writer.send_request(&Request::Cancel).await;
                let _ = sb.writer.send_request(&Request::Cancel).await;
                return Err(TransferError::interrupted());
            }
        }
    }
    let source = done_a.unwrap_or_default();
    let sink = done_b.unwrap_or_default();
    Counters::add(
        &counters.bytes_received,
        sink.bytes_moved.saturating_sub(reported_written),
    );
    Counters::set(
        &counters.bytes_done,
        source.bytes_moved + source.bytes_skipped,
    );
    for (mut s, p) in [(sa, a), (sb, b)] {
        match &opts.control_pool {
            Some(pool) if own_tls(p).is_none() => pool.put(s),
            _ => s.writer.shutdown().await,
        }
    }
    let plan = source.plan.clone();
    Ok(Attempt {
        bytes_total: bytes,
        files,
        source,
        sink,
        plan,
        zero_copy: None,
        blocks_unread: 0,
        rtt: None,
    })
}

/// A control connection for requests of an endpoint's personality
/// ([`Request::Service`]; a storage node's are in `wire::node`): the engine carries their
/// bodies, the caller encodes and decodes them.
pub struct ServiceChannel {
    pub reader: crate::conn::ControlReader,
    pub writer: crate::conn::ControlWriter,
}

impl ServiceChannel {
    /// Connects to `peer`'s control port.
    pub async fn open(peer: &Peer, tls: Option<&ClientTls>) -> Result<Self, TransferError> {
        let limits = sys::host_limits();
        let s = conn::connect_control(&peer.host, peer.port, tls, &limits).await?;
        Ok(Self {
            reader: s.reader,
            writer: s.writer,
        })
    }

    /// Sends a request body.
    pub async fn send(&mut self, body: Vec<u8>) -> Result<(), TransferError> {
        self.writer.send_request(&Request::Service(body)).await
    }

    /// The next answer's body; an error the endpoint sent instead is returned as the error,
    /// a closed connection as `Connect`.
    pub async fn recv(&mut self) -> Result<Vec<u8>, TransferError> {
        match self.reader.response().await? {
            Response::Service(body) => Ok(body),
            Response::Error(e) => Err(e.into()),
            other => Err(TransferError::protocol(format!(
                "unexpected answer to a service request: {other:?}"
            ))),
        }
    }

    /// The next answer, decoded by the personality's `decode` (e.g. `wire::node`'s); a body
    /// it cannot decode is a protocol error.
    pub async fn recv_as<T, E: std::fmt::Display>(
        &mut self,
        decode: impl FnOnce(&[u8]) -> Result<T, E>,
    ) -> Result<T, TransferError> {
        let body = self.recv().await?;
        decode(&body).map_err(|e| {
            TransferError::protocol(format!("malformed answer from {}: {e}", self.reader.peer))
        })
    }

    pub async fn close(mut self) {
        self.writer.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::retry_summary;

    #[test]
    fn retried_errors_are_summarised_once_when_they_repeat() {
        let same = vec!["refused".to_string(), "refused".to_string()];
        assert_eq!(
            retry_summary("refused", &same),
            "refused; tried 3 times, resuming each time; every attempt failed the same way"
        );
        let mixed = vec!["stalled".to_string(), "refused".to_string()];
        assert_eq!(
            retry_summary("refused", &mixed),
            "refused; tried 3 times, resuming each time (earlier: attempt 1: stalled; attempt 2: refused)"
        );
    }
}
