//! Drives a [`wire::source::Source`] over data streams.
//!
//! Reader threads (`--concurrency` of them, one file each) read blocks in file order,
//! checksum them as they go (block CRC32C plus the whole-file algorithms; no second pass) and
//! queue them, bounded by a read-ahead byte budget. Each stream has a writer task that takes
//! the next frame whenever its socket can take more (so fast streams carry more and nobody
//! waits for anybody) and a reader task that feeds the sink's answers (acks, resend requests,
//! resume ranges, verdicts) back into the state machine. Disk reads, network sends and the
//! sink's disk writes therefore all overlap.

use crate::conn::{self, Io, Reader, Writer};
use crate::error::{TransferError, io_info};
use crate::faults;
use crate::pool::{BufPool, ByteBudget, PooledBuf};
use crate::progress::{Counters, Event, EventSender, file_done, file_failed};
use crate::store::{OpenMode, Root, SourceEntry};
use crate::sys;
use crate::timer::sleep_until;
use crate::trace::{self, Line, StreamSample, TraceFile};
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use wire::bottleneck::SendEvidence;
use wire::checksum::{Algorithm, Digest, MultiHasher, block_crc};
use wire::control::{SessionOptions, SessionSummary};
use wire::data::{self, DataFrame, EntryKind};
use wire::error::{ErrorInfo, ErrorKind};
use wire::known_crcs::KnownCrcs;
use wire::losscause::{Decision, Family, LossClassifier, StreamInfo};
use wire::pacing::TokenBucket;
use wire::source::{FileSpec, ReadJob, Source, SourceConfig, SourceEvent, SourceStats, Transmit};

/// What to send.
pub struct SourceSpec {
    pub root: Arc<Root>,
    pub entries: Vec<SourceEntry>,
    /// Only this `(offset, length)` of a single file.
    pub range: Option<(u64, u64)>,
    pub options: SessionOptions,
    /// Send clear streams with `sendfile` from the page cache (TLS streams never can).
    pub zero_copy: bool,
    /// Sample the data streams and the storage side into this trace every 10 ms.
    pub trace: Option<crate::trace::TraceTarget>,
}

/// What a finished source session did.
#[derive(Clone, Debug, Default)]
pub struct SourceOutcome {
    pub stats: SourceStats,
    pub streams: u32,
    pub congestion: String,
    /// Switches of congestion control during the session, with their evidence.
    pub cc_decisions: Vec<Decision>,
    pub tcp_retransmits: u64,
    /// Blocks went out with `sendfile` from the page cache.
    pub zero_copy: bool,
    /// Blocks sent (or, resuming, found already there) with the CRC their writer recorded,
    /// without being read (see
    /// [`SourceEntry::known_crcs`](crate::store::SourceEntry::known_crcs)).
    pub blocks_unread: u64,
    /// What the bottleneck report needs from the sending side.
    pub evidence: SendEvidence,
}

impl SourceOutcome {
    /// What the session reports to its peer and to the copy's report, with the plan that
    /// chose its streams.
    pub fn summary(&self, plan: String) -> SessionSummary {
        SessionSummary {
            bytes_moved: self.stats.bytes_sent,
            bytes_skipped: self.stats.bytes_skipped,
            files_done: self.stats.files_done,
            files_failed: self.stats.files_failed,
            streams: self.streams,
            blocks_resent: self.stats.blocks_resent,
            streams_lost: self.stats.streams_lost,
            plan,
            congestion: self.congestion.clone(),
            tcp_retransmits: self.tcp_retransmits,
            cc_decisions: self.cc_decisions.clone(),
            send: Some(self.evidence.clone()),
            receive: None,
        }
    }
}

/// A block read from disk, holding its share of the read-ahead budget until dropped.
pub struct Loaded {
    body: Body,
    budget: Arc<ByteBudget>,
    len: u64,
}

/// Where a block's bytes are: in memory, or still in the file (sent with `sendfile`, so they
/// never cross into user space; their CRC was computed through a small scratch buffer).
enum Body {
    Buf(PooledBuf),
    File {
        file: Arc<std::fs::File>,
        offset: u64,
    },
}

impl Drop for Loaded {
    fn drop(&mut self) {
        self.budget.release(self.len);
    }
}

struct Shared {
    /// The session's span (`source`): each file's log lines are in a `file` span below it.
    span: tracing::Span,
    state: Mutex<Source<Loaded>>,
    /// Reader threads wait here for files to read or blocks to read again.
    readers_cv: Condvar,
    /// Stream writers wait here for something to send.
    work: Notify,
    /// The session loop waits here (with its timer): finished, failed, a stream lost, or the
    /// state machine's timer moved earlier than the one armed.
    changed: Notify,
    /// The state machine's deadline the session loop sleeps until, and the earliest it
    /// re-arms to (see [`Armed`]).
    armed: Mutex<Armed>,
    locators: Vec<PathBuf>,
    /// Per file: checksums it must have (from a catalog), checked when it has been read.
    expects: Vec<Vec<Digest>>,
    /// Per file: block CRCs its writer recorded (whole-file sends only).
    known_crcs: Vec<Option<Arc<KnownCrcs>>>,
    root: Arc<Root>,
    /// Send blocks with `sendfile` (clear streams).
    zero_copy: bool,
    range_base: u64,
    /// Sending a byte range: the file's own length is not the announced size.
    is_range: bool,
    algos: Vec<Algorithm>,
    block_size: u64,
    budget: Arc<ByteBudget>,
    pool: BufPool,
    counters: Arc<Counters>,
    events: EventSender,
    cancel: CancellationToken,
    stalled: AtomicBool,
    failure: Mutex<Option<TransferError>>,
    bucket: Option<Mutex<TokenBucket>>,
    retransmits: AtomicU64,
    congestion: Mutex<String>,
    /// Congestion control switches, with what was observed.
    decisions: Mutex<Vec<Decision>>,
    /// Live data sockets (stream, descriptor), for TCP_INFO and congestion control changes.
    sockets: Mutex<Vec<(u32, RawFd)>>,
    /// Cancels one stream's tasks (used when the state machine declares it lost).
    stops: Mutex<std::collections::HashMap<u32, CancellationToken>>,
    /// The session's trace, if it is traced.
    trace: Option<Arc<TraceFile>>,
    /// What the streams' sockets said as they closed (bottleneck evidence).
    evidence: Mutex<SendEvidence>,
    /// Storage side, for the trace and the bottleneck report: bytes read (and checksummed),
    /// time spent on them, and time readers waited for room in the read-ahead budget.
    read_bytes: AtomicU64,
    read_ns: AtomicU64,
    budget_wait_ns: AtomicU64,
    /// Blocks sent with a recorded CRC, never read.
    known_blocks: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Source<Loaded>> {
        self.state.lock().expect("source state lock")
    }

    /// A data stream's connection is gone: its frames go to the other streams, and the session
    /// loop looks whether any stream is left.
    fn stream_lost(&self, idx: u32) {
        let mut st = self.lock();
        if !st.is_finished() {
            st.on_stream_lost(idx);
        }
        self.after_change(&mut st);
        drop(st);
        self.changed.notify_waiters();
    }

    fn fail(&self, e: TransferError) {
        let mut f = self.failure.lock().expect("failure lock");
        if f.is_none() {
            *f = Some(e);
        }
        self.cancel.cancel();
        self.changed.notify_waiters();
    }

    /// After any change of the state machine: wake writers, and readers when there is work
    /// for them (waking all of them on every acknowledgement cost 30,000 futile context
    /// switches per 4 GiB on loopback), report events.
    fn after_change(&self, st: &mut Source<Loaded>) {
        self.work.notify_waiters();
        if st.has_reader_work() {
            self.readers_cv.notify_all();
        }
        // An acknowledgement can bring a stream's loss deadline forward (another stream
        // progressed): the session loop re-arms its timer.
        if let Some(t) = st.poll_timeout()
            && self.armed.lock().expect("armed lock").moved_earlier(t)
        {
            self.changed.notify_waiters();
        }
        let stats = st.stats();
        Counters::set(
            &self.counters.bytes_done,
            stats.bytes_acked + stats.bytes_skipped,
        );
        Counters::set(&self.counters.bytes_skipped, stats.bytes_skipped);
        Counters::set(&self.counters.files_done, stats.files_done);
        Counters::set(&self.counters.files_failed, stats.files_failed);
        while let Some(ev) = st.poll_event() {
            let out = match ev {
                SourceEvent::FileDone {
                    path,
                    size,
                    digests,
                    skipped,
                    ..
                } => file_done(&self.span, "file sent", path, size, digests, skipped),
                SourceEvent::FileFailed { path, error, .. } => file_failed(&self.span, path, error),
                SourceEvent::FileRestarted {
                    file,
                    attempt,
                    reason,
                } => Event::FileRetry {
                    path: st
                        .file_spec(file)
                        .map(|s| s.path.clone())
                        .unwrap_or_default(),
                    attempt,
                    reason,
                },
                SourceEvent::StreamLost { stream } => {
                    tracing::debug!(
                        stream,
                        state = %st.describe(),
                        streams = %st.describe_streams(Instant::now()),
                        "stream declared lost"
                    );
                    if let Some(stop) = self.stops.lock().expect("stops lock").remove(&stream) {
                        stop.cancel();
                    }
                    Event::StreamLost { stream }
                }
                SourceEvent::Aborted(e) => {
                    self.fail(e.into());
                    continue;
                }
            };
            let _ = self.events.send(out);
        }
        if st.is_finished() {
            self.changed.notify_waiters();
        }
    }

    fn read_block(
        &self,
        file: &std::fs::File,
        offset: u64,
        len: u64,
        path: &str,
    ) -> Result<PooledBuf, ErrorInfo> {
        let mut buf = self.pool.get(len as usize);
        file.read_exact_at(buf.as_mut_slice(), self.range_base + offset)
            .map_err(|e| short_read(path, &e))?;
        Ok(buf)
    }

    /// Counts a block read for the trace: `waited` is when its reader began waiting for
    /// budget, `reading` when it began reading.
    fn note_read(&self, waited: Instant, reading: Instant, len: u64) {
        let now = Instant::now();
        let ns = |d: Duration| d.as_nanos() as u64;
        self.budget_wait_ns
            .fetch_add(ns(reading - waited), Ordering::Relaxed);
        self.read_ns.fetch_add(ns(now - reading), Ordering::Relaxed);
        self.read_bytes.fetch_add(len, Ordering::Relaxed);
    }

    /// Loads block `off..off+len` (destination offsets): its CRC32C, the whole-file hashes
    /// when asked, and its bytes (or, with zero copy, a reference to them in the file).
    /// With zero copy and a CRC its writer recorded (`known`, no other hash asked), the file
    /// is not read at all: the receiver checks the bytes `sendfile` sends against that CRC.
    fn load_block(
        &self,
        file: &Arc<std::fs::File>,
        off: u64,
        len: u64,
        path: &str,
        hasher: Option<&mut MultiHasher>,
        known: Option<&KnownCrcs>,
    ) -> Result<(Body, u32), ErrorInfo> {
        if self.zero_copy
            && hasher.is_none()
            && let Some(crc) = known.and_then(|k| k.block_crc(off, len))
        {
            // Still there and of its size: a file cut short fails here as a read would.
            let have = file.metadata().map_err(|e| io_info(path, &e))?.len();
            if have < self.range_base + off + len {
                return Err(short_read(path, &std::io::ErrorKind::UnexpectedEof.into()));
            }
            self.known_blocks.fetch_add(1, Ordering::Relaxed);
            return Ok((
                Body::File {
                    file: file.clone(),
                    offset: self.range_base + off,
                },
                crc,
            ));
        }
        if !self.zero_copy {
            let buf = self.read_block(file, off, len, path)?;
            let crc = block_crc(buf.as_ref());
            if let Some(h) = hasher {
                h.update(buf.as_ref());
            }
            return Ok((Body::Buf(buf), crc));
        }
        thread_local! {
            static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        let mut hasher = hasher;
        let crc = SCRATCH.with(|s| -> Result<u32, ErrorInfo> {
            let mut scratch = s.borrow_mut();
            scratch.resize(SCRATCH_LEN, 0);
            let mut crc = 0u32;
            let mut done = 0u64;
            while done < len {
                let n = (len - done).min(SCRATCH_LEN as u64) as usize;
                let at = self.range_base + off + done;
                file.read_exact_at(&mut scratch[..n], at)
                    .map_err(|e| short_read(path, &e))?;
                crc = wire::checksum::crc32c_append(crc, &scratch[..n]);
                if let Some(h) = hasher.as_deref_mut() {
                    h.update(&scratch[..n]);
                }
                done += n as u64;
            }
            Ok(crc)
        })?;
        Ok((
            Body::File {
                file: file.clone(),
                offset: self.range_base + off,
            },
            crc,
        ))
    }

    /// Reads one file in order: blocks to send go to the queue, every byte into the digests.
    fn read_job(&self, job: ReadJob) {
        let path = job.spec.path.clone();
        let locator = &self.locators[job.file as usize];
        let result = (|| -> Result<Vec<Digest>, ErrorInfo> {
            let mut hasher = MultiHasher::new(&self.algos);
            let mut crc = 0u32;
            if job.spec.kind == EntryKind::Dir {
                return Ok(Vec::new());
            }
            let file = Arc::new(
                self.root
                    .open(locator, OpenMode::Read)
                    .map_err(|e| io_info(&path, &e))?,
            );
            let before = file.metadata().map_err(|e| io_info(&path, &e))?;
            let mut pos = 0u64;
            for seg in &job.segments {
                let end = seg.offset + seg.len;
                let mut off = seg.offset;
                while off < end {
                    if self.cancel.is_cancelled() {
                        return Err(ErrorInfo::new(ErrorKind::Cancelled, "cancelled"));
                    }
                    let len = self.block_size.min(end - off);
                    let waited = Instant::now();
                    if seg.send && !self.budget.acquire(len, &|| self.cancel.is_cancelled()) {
                        return Err(ErrorInfo::new(ErrorKind::Cancelled, "cancelled"));
                    }
                    let loaded_len = if seg.send { len } else { 0 };
                    let hash = hasher.needs_bytes().then_some(&mut hasher);
                    let reading = Instant::now();
                    let known = self.known_crcs[job.file as usize].as_deref();
                    let loaded = self.load_block(&file, off, len, &path, hash, known);
                    self.note_read(waited, reading, len);
                    let (body, c) = match loaded {
                        Ok(b) => b,
                        Err(e) => {
                            self.budget.release(loaded_len);
                            return Err(e);
                        }
                    };
                    crc = if pos == 0 {
                        c
                    } else {
                        wire::checksum::crc_combine(crc, c, len)
                    };
                    pos += len;
                    if seg.send {
                        let loaded = Loaded {
                            body,
                            budget: self.budget.clone(),
                            len,
                        };
                        let mut st = self.lock();
                        st.push_block(job.file, job.attempt, off, len as u32, c, loaded);
                        drop(st);
                        self.work.notify_waiters();
                    }
                    off += len;
                }
            }
            let after = file.metadata().map_err(|e| io_info(&path, &e))?;
            if before.modified().ok() != after.modified().ok()
                || (!self.is_range && after.len() != job.spec.size)
            {
                return Err(ErrorInfo::new(
                    ErrorKind::Io,
                    format!("{path}: file changed while being sent"),
                ));
            }
            let mut digests = vec![Digest {
                algorithm: Algorithm::Crc32c,
                value: crc.to_be_bytes().to_vec(),
            }];
            if job.spec.size == 0 {
                digests[0].value = 0u32.to_be_bytes().to_vec();
            }
            digests.extend(hasher.finish());
            digests.sort_by_key(|d| d.algorithm);
            // A replica that does not match its catalog checksum is damaged: the destination
            // must not commit it (the reader fails over to another replica).
            let expect = &self.expects[job.file as usize];
            if !expect.is_empty()
                && !self.is_range
                && let Err(why) = wire::checksum::digests_match(&digests, expect)
            {
                return Err(ErrorInfo::new(
                    ErrorKind::SourceDamaged,
                    format!("{path}: replica damaged ({why})"),
                ));
            }
            Ok(digests)
        })();
        let mut st = self.lock();
        match result {
            Ok(d) => st.read_done(job.file, job.attempt, d),
            Err(e) if e.kind == ErrorKind::Cancelled => {}
            Err(e) => st.read_failed(job.file, job.attempt, e),
        }
        self.after_change(&mut st);
    }

    fn reread(&self, d: wire::source::BlockDesc) {
        let path = self
            .lock()
            .file_spec(d.file)
            .map(|s| s.path.clone())
            .unwrap_or_default();
        let len = d.len as u64;
        if !self.budget.acquire(len, &|| self.cancel.is_cancelled()) {
            return;
        }
        let result = self
            .root
            .open(&self.locators[d.file as usize], OpenMode::Read)
            .map_err(|e| io_info(&path, &e))
            .and_then(|f| self.load_block(&Arc::new(f), d.offset, len, &path, None, None))
            .and_then(|(body, crc)| {
                // Refused under the CRC its writer recorded, and its bytes now give another:
                // the file changed after it was written. No resend or retry can deliver what
                // was written, so the file fails at once (its writer uploads again if it
                // made the change).
                let recorded = self.known_crcs[d.file as usize]
                    .as_deref()
                    .and_then(|k| k.block_crc(d.offset, len));
                match recorded {
                    Some(r) if r != crc => Err(ErrorInfo::new(
                        ErrorKind::Integrity,
                        format!(
                            "{path}: changed since it was written (the block at {} no longer has the CRC recorded as it was written)",
                            d.offset
                        ),
                    )
                    .retryable(false)),
                    _ => Ok((body, crc)),
                }
            });
        let mut st = self.lock();
        match result {
            Ok((body, crc)) => {
                st.push_resend(
                    d,
                    crc,
                    Loaded {
                        body,
                        budget: self.budget.clone(),
                        len,
                    },
                );
            }
            Err(e) => {
                self.budget.release(len);
                st.read_failed(d.file, d.attempt, e);
            }
        }
        self.after_change(&mut st);
    }
}

/// Least unsent bytes a data socket may hold (see [`sys::set_notsent_lowat`]); the mark is two
/// blocks: enough to keep the socket busy while the next block is fetched, little enough that
/// data is not committed to a stream long before it can leave.
const NOTSENT_LOWAT_MIN: u32 = 1 << 20;

/// Bytes read at a time to checksum a block that is then sent with `sendfile`.
const SCRATCH_LEN: usize = 256 << 10;

fn short_read(path: &str, e: &std::io::Error) -> ErrorInfo {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        ErrorInfo::new(
            ErrorKind::Io,
            format!("{path}: file became shorter while being sent"),
        )
    } else {
        io_info(path, e)
    }
}

/// Writes a block's payload: from memory, or with `sendfile` straight from the page cache
/// when the stream is a plain socket.
async fn write_body(
    w: &mut Writer,
    body: &Body,
    len: u32,
    peer: &str,
) -> Result<(), TransferError> {
    let (file, offset) = match body {
        Body::Buf(buf) => return conn::write_all(w, buf.as_ref(), peer).await,
        Body::File { file, offset } => (file, *offset),
    };
    let Writer::Plain(half) = w else {
        // TLS streams encrypt in user space: read the bytes and write them.
        let mut buf = vec![0u8; len as usize];
        file.read_exact_at(&mut buf, offset)
            .map_err(|e| TransferError::local(short_read(peer, &e).message))?;
        return conn::write_all(w, &buf, peer).await;
    };
    let tcp: &tokio::net::TcpStream = half.as_ref();
    let fd = tcp.as_raw_fd();
    let mut sent = 0u64;
    while sent < len as u64 {
        tcp.writable()
            .await
            .map_err(|e| TransferError::connect(format!("{peer}: {e}")))?;
        let r = tcp.try_io(tokio::io::Interest::WRITABLE, || {
            sys::sendfile_once(fd, file, offset + sent, (len as u64 - sent) as usize)
        });
        match r {
            Ok(0) => {
                return Err(TransferError::local(format!(
                    "{peer}: source file became shorter while being sent"
                )));
            }
            Ok(n) => sent += n as u64,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(TransferError::connect(format!("{peer}: {e}"))),
        }
    }
    Ok(())
}

fn reader_thread(sh: Arc<Shared>) {
    let mut st = sh.lock();
    loop {
        if sh.cancel.is_cancelled() || st.is_finished() {
            return;
        }
        if let Some(d) = st.poll_reread() {
            drop(st);
            sh.reread(d);
            st = sh.lock();
            continue;
        }
        if let Some(job) = st.claim() {
            drop(st);
            let path = job.spec.path.clone();
            let _ = sh.events.send(Event::FileStarted { path });
            sh.read_job(job);
            st = sh.lock();
            continue;
        }
        // Woken by `after_change` when there is reader work, and at the end: no timer.
        st = sh.readers_cv.wait(st).expect("source state lock");
    }
}

/// Applies the session's congestion control and pacing to a data socket.
pub fn tune_sender(io: &Io, opts: &SessionOptions, streams: u32) -> Result<String, TransferError> {
    let tcp = io.tcp();
    // Without --cc the host's default stays until the loss detector finds random loss.
    if let Some(cc) = &opts.congestion
        && let Err(e) = sys::set_congestion(tcp, cc)
    {
        if opts.congestion_required {
            return Err(TransferError::usage(format!(
                "congestion control {cc:?} is not available on this host ({e}); available: {}",
                sys::available_congestion().join(", ")
            )));
        }
        tracing::debug!(cc, error = %e, "keeping the default congestion control");
    }
    if let Some(rate) = opts.rate_bps {
        let per_stream = (rate / 8 / streams.max(1) as u64).max(1);
        let _ = sys::set_max_pacing_rate(tcp, per_stream);
    }
    if let Some(b) = opts.tcp_buffer {
        let _ = sys::set_send_buffer(tcp, b);
    }
    let _ = sys::set_notsent_lowat(tcp, (2 * opts.block_size).max(NOTSENT_LOWAT_MIN));
    Ok(sys::congestion(tcp).unwrap_or_else(|_| sys::default_congestion()))
}

async fn stream_writer(
    sh: Arc<Shared>,
    idx: u32,
    mut w: Writer,
    fd: RawFd,
    stop: CancellationToken,
) {
    let peer = format!("data stream {idx}");
    let born = Instant::now();
    // SAFETY: the descriptor belongs to this stream's socket, which `w` keeps open for as long
    // as `sock` is used (both live until the end of this function).
    let sock = unsafe { BorrowedFd::borrow_raw(fd) };
    let result: Result<(), TransferError> = async {
        loop {
            let notified = sh.work.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if sh.stalled.load(Ordering::Relaxed) {
                stop.cancelled().await;
                return Ok(());
            }
            let (tx, finished) = {
                let mut st = sh.lock();
                let tx = st.poll_transmit(idx, Instant::now());
                (tx, st.is_finished())
            };
            match tx {
                Some(Transmit::Frame(f)) => {
                    conn::write_all(&mut w, &f.encode(), &peer).await?;
                }
                Some(Transmit::Block {
                    header,
                    len,
                    mut payload,
                }) => {
                    if let Some(bucket) = &sh.bucket {
                        let wait = bucket
                            .lock()
                            .expect("bucket lock")
                            .take(Instant::now(), len as u64);
                        if !wait.is_zero() {
                            tokio::time::sleep(wait).await;
                        }
                    }
                    if let (true, Body::Buf(buf)) =
                        (faults::corrupt_this_block(), &mut payload.body)
                    {
                        buf.as_mut_slice()[0] ^= 0x5a;
                    }
                    // The header leaves with the block's first bytes, not in a packet of
                    // its own (sys::set_cork says why that matters on long paths).
                    let _ = sys::set_cork(&sock, true);
                    let prefix = header.frame_prefix(len);
                    conn::write_all(&mut w, &prefix, &peer).await?;
                    write_body(&mut w, &payload.body, len, &peer).await?;
                    w.flush().await.map_err(|e| conn::io_err(&peer, e))?;
                    let _ = sys::set_cork(&sock, false);
                    drop(payload);
                    Counters::add(&sh.counters.bytes_sent, len as u64);
                    if faults::moved(len as u64) {
                        sh.stalled.store(true, Ordering::Relaxed);
                    }
                }
                None if finished => {
                    conn::write_all(&mut w, &DataFrame::StreamEnd.encode(), &peer).await?;
                    let _ = w.flush().await;
                    let _ = sys::set_cork(&sock, false);
                    return Ok(());
                }
                None => {
                    let _ = w.flush().await;
                    // Nothing to send for now: what is queued (a corked hello, a frame) goes.
                    let _ = sys::set_cork(&sock, false);
                    // Woken by `after_change` (a block read, an acknowledgement, the end-game
                    // timer): no timer of its own.
                    tokio::select! {
                        _ = &mut notified => {}
                        _ = stop.cancelled() => return Ok(()),
                    }
                }
            }
            if stop.is_cancelled() {
                return Ok(());
            }
        }
    }
    .await;
    // Forget the descriptor before the socket can close (the number could be reused).
    sh.sockets
        .lock()
        .expect("sockets lock")
        .retain(|(s, _)| *s != idx);
    if let Ok(info) = sys::tcp_info(&sock) {
        sh.retransmits
            .fetch_add(info.total_retrans as u64, Ordering::Relaxed);
        // The stream's last sample, as it closes.
        if let Some(t) = &sh.trace {
            t.write(&Line::Stream(StreamSample::of(t.now_us(), idx, &info)));
        }
        let mut e = sh.evidence.lock().expect("evidence lock");
        e.streams += 1;
        e.life_us += born.elapsed().as_micros() as u64;
        e.busy_us += info.busy_time;
        e.rwnd_limited_us += info.rwnd_limited;
        e.sndbuf_limited_us += info.sndbuf_limited;
        e.segs_out += info.data_segs_out as u64;
        e.retrans_segs += info.total_retrans as u64;
        if info.min_rtt > 0 && (e.min_rtt_us == 0 || info.min_rtt < e.min_rtt_us) {
            e.min_rtt_us = info.min_rtt;
        }
        e.srtt_us = e.srtt_us.max(info.rtt);
    }
    if let Err(e) = result {
        tracing::debug!(stream = idx, error = %e, "data stream write failed");
        sh.stream_lost(idx);
    }
    let _ = w.shutdown().await;
}

async fn stream_reader(
    sh: Arc<Shared>,
    idx: u32,
    r: Reader,
    stop: CancellationToken,
    await_bind: bool,
) {
    let peer = format!("data stream {idx}");
    let mut r = BufReader::with_capacity(64 << 10, r);
    if await_bind && let Err(e) = conn::read_bind_result(&mut r, &peer).await {
        bind_failed(&sh, idx, e, &stop);
        return;
    }
    loop {
        let frame = tokio::select! {
            f = conn::read_frame(&mut r, data::limits, &peer) => f,
            _ = stop.cancelled() => return,
        };
        match frame {
            Ok(Some((h, body))) => {
                Counters::add(&sh.counters.activity, 1);
                let frame = match DataFrame::decode(h, &body) {
                    Ok(f) => f,
                    Err(e) => {
                        sh.fail(TransferError::protocol(format!("{peer}: {e}")));
                        return;
                    }
                };
                let mut st = sh.lock();
                if let Err(v) = st.on_frame(idx, frame, Instant::now()) {
                    drop(st);
                    sh.fail(TransferError::protocol(v.to_string()));
                    return;
                }
                sh.after_change(&mut st);
            }
            Ok(None) | Err(_) => {
                sh.stream_lost(idx);
                stop.cancel();
                return;
            }
        }
    }
}

/// A refused bind ends the session (wrong key, unknown session); a lost connection only loses
/// the stream.
fn bind_failed(sh: &Shared, idx: u32, e: TransferError, stop: &CancellationToken) {
    if e.kind() == ErrorKind::Connect {
        sh.stream_lost(idx);
        stop.cancel();
    } else {
        sh.fail(e);
    }
}

/// Runs a source session: sends `spec` over the data streams that arrive on `conns` (stream
/// index and connection). Returns when every file is done or failed, or on a session failure.
#[tracing::instrument(name = "source", skip_all, fields(files = spec.entries.len()))]
pub async fn run_source(
    spec: SourceSpec,
    mut conns: mpsc::Receiver<conn::DataConn>,
    counters: Arc<Counters>,
    events: EventSender,
    cancel: CancellationToken,
) -> Result<SourceOutcome, TransferError> {
    let (began, cpu_before) = (Instant::now(), sys::cpu_seconds());
    let opts = spec.options.clone();
    let cfg = SourceConfig {
        resume: opts.resume,
        file_attempts: opts.file_attempts.max(1),
        block_size: opts.block_size,
        stream_timeout: Duration::from_millis(opts.stall_timeout_ms.clamp(2_000, 30_000) / 2),
        shared_path: opts.shared_path,
        ..Default::default()
    };
    let mut source = Source::new(cfg);
    let mut locators = Vec::with_capacity(spec.entries.len());
    let mut expects = Vec::with_capacity(spec.entries.len());
    let mut known_crcs = Vec::with_capacity(spec.entries.len());
    let (range_base, range_len) = match spec.range {
        Some((o, l)) => (o, Some(l)),
        None => (0, None),
    };
    let mut total = 0u64;
    for e in &spec.entries {
        let size = match (e.kind, range_len) {
            (EntryKind::File, Some(l)) => {
                if range_base.saturating_add(l) > e.size {
                    return Err(TransferError::usage(format!(
                        "{}: range {}+{} goes beyond the end of the file ({} bytes)",
                        e.rel, range_base, l, e.size
                    )));
                }
                l
            }
            _ => e.size,
        };
        total += size;
        source.add_file(FileSpec {
            kind: e.kind,
            path: e.rel.clone(),
            size,
            mode: e.mode,
            mtime: e.mtime,
        });
        locators.push(e.locator.clone());
        expects.push(e.expect.clone());
        // Recorded from the file's start: a range is sent from its own offset.
        known_crcs.push(e.known_crcs.clone().filter(|_| spec.range.is_none()));
    }
    source.finish_adding();
    Counters::set(&counters.total_bytes, total);
    Counters::set(&counters.total_files, spec.entries.len() as u64);
    let block = opts.block_len();
    let concurrency = opts.concurrency.clamp(1, 64) as usize;
    let readahead = (64u64 << 20).max(block * concurrency as u64 * 2);
    let sh = Arc::new(Shared {
        span: tracing::Span::current(),
        state: Mutex::new(source),
        readers_cv: Condvar::new(),
        work: Notify::new(),
        changed: Notify::new(),
        armed: Mutex::new(Armed::default()),
        locators,
        expects,
        known_crcs,
        root: spec.root.clone(),
        zero_copy: spec.zero_copy
            && opts.protect == wire::control::Protect::Clear
            && !faults::corrupt_enabled(),
        range_base,
        is_range: spec.range.is_some(),
        algos: opts.checksums.clone(),
        block_size: block,
        budget: Arc::new(ByteBudget::new(readahead)),
        pool: BufPool::new((readahead / block) as usize + 8),
        counters,
        events,
        cancel: cancel.child_token(),
        stalled: AtomicBool::new(false),
        failure: Mutex::new(None),
        bucket: opts
            .rate_bps
            .map(|r| Mutex::new(TokenBucket::new(r, block.max(256 << 10)))),
        retransmits: AtomicU64::new(0),
        congestion: Mutex::new(String::new()),
        decisions: Mutex::new(Vec::new()),
        sockets: Mutex::new(Vec::new()),
        stops: Mutex::new(std::collections::HashMap::new()),
        trace: spec.trace.as_ref().map(|t| t.file.clone()),
        evidence: Mutex::new(SendEvidence {
            readers: concurrency as u32,
            ..Default::default()
        }),
        read_bytes: AtomicU64::new(0),
        known_blocks: AtomicU64::new(0),
        read_ns: AtomicU64::new(0),
        budget_wait_ns: AtomicU64::new(0),
    });
    let tracer = spec.trace.as_ref().map(|t| {
        t.file.write(&Line::Session(trace::SessionBegin {
            t_us: t.file.now_us(),
            guid: t.guid.clone(),
            peer: t.peer.clone(),
            streams: opts.streams.unwrap_or(0),
        }));
        let stop = CancellationToken::new();
        (
            tokio::spawn(sample_trace(sh.clone(), t.file.clone(), stop.clone())),
            stop,
        )
    });
    let readers: Vec<_> = (0..concurrency)
        .map(|i| {
            let sh = sh.clone();
            std::thread::Builder::new()
                .name(format!("haul-read-{i}"))
                .spawn(move || reader_thread(sh))
                .expect("spawn reader thread")
        })
        .collect();

    let mut writers = Vec::new();
    let mut stream_stops: Vec<CancellationToken> = Vec::new();
    let mut conns_open = true;
    let mut streams = 0u32;
    let mut detector = LossDetector::new(opts.congestion.is_none());
    // When the state machine's timeout was last handled (timers closer than TIMER_SLACK are
    // coalesced).
    let mut handled_at: Option<Instant> = None;
    let outcome = loop {
        // Registered before the checks: a change between them and the wait is not lost.
        let changed = sh.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if let Some(e) = sh.failure.lock().expect("failure lock").take() {
            break Err(e);
        }
        let machine_timer = {
            let mut st = sh.lock();
            if st.is_finished() {
                break Ok(());
            }
            let now = Instant::now();
            if st.poll_timeout().is_some_and(|t| t <= now) {
                st.handle_timeout(now);
                handled_at = Some(now);
                sh.armed.lock().expect("armed lock").floor = Some(now + TIMER_SLACK);
                // Streams the state machine declared lost are stopped here; idle writers
                // poll again (the end game may have frames for them).
                sh.after_change(&mut st);
            }
            if streams > 0 && st.live_streams() == 0 && !conns_open {
                let unfinished = st.unfinished();
                break Err(TransferError::connect(format!(
                    "all {streams} data streams were lost with {unfinished} files unfinished"
                )));
            }
            let timer = st
                .poll_timeout()
                .map(|t| handled_at.map_or(t, |h| t.max(h + TIMER_SLACK)));
            sh.armed.lock().expect("armed lock").at = timer;
            timer
        };
        if detector.poll_timeout().is_some_and(|t| t <= Instant::now())
            && let Some(note) = detector.sample(&sh)
        {
            tracing::info!("{note}");
            let _ = sh.events.send(Event::Plan {
                streams,
                explanation: note,
            });
        }
        let timer = machine_timer
            .into_iter()
            .chain(detector.poll_timeout())
            .min();
        tokio::select! {
            c = conns.recv(), if conns_open => match c {
                Some(conn::DataConn { stream: idx, io, await_bind, open }) => {
                    let cc = match tune_sender(&io, &opts, opts.streams.unwrap_or(1)) {
                        Ok(cc) => cc,
                        Err(e) => break Err(e),
                    };
                    {
                        // The first stream names the algorithm; switches append to it.
                        let mut c = sh.congestion.lock().expect("cc lock");
                        if c.is_empty() {
                            *c = cc;
                        }
                    }
                    streams += 1;
                    let fd = io.tcp().as_raw_fd();
                    let (r, w) = io.split();
                                        let stop = sh.cancel.child_token();
                    sh.sockets.lock().expect("sockets lock").push((idx, fd));
                    sh.stops.lock().expect("stops lock").insert(idx, stop.clone());
                    if let Some(cc) = detector.current() {
                        // SAFETY: fd belongs to `io`, alive here.
                        let _ = sys::set_congestion(&unsafe { BorrowedFd::borrow_raw(fd) }, cc);
                    }
                    {
                        let mut st = sh.lock();
                        st.add_stream(idx, Instant::now());
                    }
                    sh.work.notify_waiters();
                    let span = tracing::info_span!("stream", idx);
                    writers.push(tokio::spawn(stream_writer(sh.clone(), idx, w, fd, stop.clone()).instrument(span.clone())));
                    let reader = stream_reader(sh.clone(), idx, r, stop.clone(), await_bind);
                    // The stream counts as active (on an endpoint) while its reader runs.
                    tokio::spawn(async move { let _open = open; reader.await }.instrument(span));
                    stream_stops.push(stop);
                }
                None => conns_open = false,
            },
            _ = &mut changed => {}
            _ = sh.cancel.cancelled() => {
                if let Some(e) = sh.failure.lock().expect("failure lock").take() {
                    break Err(e);
                }
                break Err(TransferError::interrupted());
            }
            _ = sleep_until(timer) => {}
        }
    };
    // On success the writers send StreamEnd and finish by themselves.
    if outcome.is_ok() {
        let all = futures_join(writers);
        if tokio::time::timeout(Duration::from_secs(10), all)
            .await
            .is_err()
        {
            tracing::debug!("data streams did not close in time");
        }
    }
    if let Some((task, stop)) = tracer {
        stop.cancel();
        let _ = task.await;
    }
    sh.cancel.cancel();
    // Readers wait with no timer: they are woken to see the cancellation, under their locks so
    // that none is between its check and its wait.
    {
        let _st = sh.lock();
        sh.readers_cv.notify_all();
    }
    sh.budget.wake_all();
    for t in readers {
        let _ = tokio::task::spawn_blocking(move || t.join()).await;
    }
    outcome?;
    let stats = sh.lock().stats().clone();
    let congestion = sh.congestion.lock().expect("cc lock").clone();
    let cc_decisions = sh.decisions.lock().expect("decisions lock").clone();
    let mut evidence = sh.evidence.lock().expect("evidence lock").clone();
    evidence.read_us = sh.read_ns.load(Ordering::Relaxed) / 1000;
    evidence.read_bytes = sh.read_bytes.load(Ordering::Relaxed);
    evidence.budget_wait_us = sh.budget_wait_ns.load(Ordering::Relaxed) / 1000;
    evidence.wall_us = began.elapsed().as_micros() as u64;
    evidence.cpu_us = ((sys::cpu_seconds() - cpu_before).max(0.0) * 1e6) as u64;
    evidence.cpu_millicores = sys::cpu_millicores();
    evidence.wmem_max = sys::host_limits().tcp_wmem_max;
    Ok(SourceOutcome {
        stats,
        streams,
        congestion,
        cc_decisions,
        tcp_retransmits: sh.retransmits.load(Ordering::Relaxed),
        zero_copy: sh.zero_copy,
        blocks_unread: sh.known_blocks.load(Ordering::Relaxed),
        evidence,
    })
}

/// Samples the session's data streams and storage side into its trace every
/// [`trace::INTERVAL`] until `stop`, then once more. The socket list stays locked while it is
/// sampled, so that no descriptor closes (and is reused) in between.
async fn sample_trace(sh: Arc<Shared>, file: Arc<TraceFile>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(trace::INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut n = 0u64;
    // The tracer's own CPU time: what sampling and writing cost, measured on the thread that
    // does it (the wake-ups between ticks are not counted; they are a hundred a second).
    let mut cpu_ns = 0u64;
    loop {
        let last = tokio::select! {
            _ = tick.tick() => false,
            _ = stop.cancelled() => true,
        };
        let cpu_before = sys::thread_cpu_ns();
        let t_us = file.now_us();
        {
            let sockets = sh.sockets.lock().expect("sockets lock");
            for (idx, fd) in sockets.iter() {
                // SAFETY: descriptors leave the list (under this lock) before their sockets
                // close.
                if let Ok(info) = sys::tcp_info(&unsafe { BorrowedFd::borrow_raw(*fd) }) {
                    file.write(&Line::Stream(StreamSample::of(t_us, *idx, &info)));
                }
            }
        }
        file.write(&Line::Storage(trace::StorageSample {
            t_us,
            read_bytes: sh.read_bytes.load(Ordering::Relaxed),
            read_us: sh.read_ns.load(Ordering::Relaxed) / 1000,
            budget_wait_us: sh.budget_wait_ns.load(Ordering::Relaxed) / 1000,
            queued_bytes: sh.budget.used(),
        }));
        n += 1;
        if !last && n.is_multiple_of(100) {
            file.flush();
        }
        cpu_ns += sys::thread_cpu_ns().saturating_sub(cpu_before);
        if last {
            break;
        }
    }
    file.write(&Line::End(trace::EndSample {
        t_us: file.now_us(),
        ticks: n,
        sampling_cpu_us: cpu_ns / 1000,
    }));
    file.flush();
}

/// Timers of the session loop closer together than this are handled as one.
const TIMER_SLACK: Duration = Duration::from_millis(10);

/// The session loop's timer, as other tasks see it to decide whether to wake the loop.
#[derive(Clone, Copy, Debug, Default)]
struct Armed {
    /// The deadline the loop sleeps until (`None`: no timer).
    at: Option<Instant>,
    /// The earliest the loop re-arms to: [`TIMER_SLACK`] after it last handled the state
    /// machine's timeout.
    floor: Option<Instant>,
}

impl Armed {
    /// Whether the state machine's deadline `t` calls for waking the loop to re-arm earlier.
    /// The loop would re-arm to no earlier than the floor, so a deadline already past (a
    /// hedge waiting for idle streams to take a stuck stream's frames over) wakes it only
    /// once per slack: waking it at once, every time, made it spin at full CPU (seen on a
    /// storage node serving a mount whose streams had stalled).
    fn moved_earlier(&self, t: Instant) -> bool {
        let t = self.floor.map_or(t, |f| t.max(f));
        self.at.is_none_or(|a| t < a)
    }
}

async fn futures_join(handles: Vec<tokio::task::JoinHandle<()>>) {
    for h in handles {
        let _ = h.await;
    }
}

/// The lowest round-trip time (µs) any connection of this process has seen to a peer host.
/// A connection opened while a shared bottleneck's queue was already full (a node starting
/// its third replication session on a busy link) has an inflated `min_rtt` of its own: against
/// it, queue drops look like random loss.
fn path_base_rtt(fd: RawFd, own_min: u32) -> u32 {
    static BASE: std::sync::OnceLock<Mutex<std::collections::HashMap<std::net::IpAddr, u32>>> =
        std::sync::OnceLock::new();
    // SAFETY: the descriptor is open while it is in the session's socket list.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    let sock = socket2::SockRef::from(&borrowed);
    let Some(ip) = sock
        .peer_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .map(|a| a.ip())
    else {
        return own_min;
    };
    let mut map = BASE.get_or_init(Default::default).lock().expect("rtt lock");
    let e = map.entry(ip).or_insert(own_min);
    if own_min > 0 && (own_min < *e || *e == 0) {
        *e = own_min;
    }
    *e
}

/// Drives `wire::losscause::LossClassifier` with the data sockets' TCP_INFO and applies its
/// decisions: all streams (and streams opened later) switch between the host's loss-based
/// default and BBR. Only when the user did not choose congestion control.
struct LossDetector {
    classifier: LossClassifier,
    started: Instant,
    /// The loss-based algorithm the streams started with (the host's default).
    initial: Option<String>,
}

impl LossDetector {
    fn new(enabled: bool) -> Self {
        let enabled = enabled && sys::available_congestion().iter().any(|c| c == "bbr");
        Self {
            classifier: LossClassifier::new(enabled),
            started: Instant::now(),
            initial: None,
        }
    }

    /// When to sample next (`None`: the classifier wants no more samples).
    fn poll_timeout(&self) -> Option<Instant> {
        self.classifier.poll_timeout().map(|d| self.started + d)
    }

    /// The algorithm a stream should use now, when it differs from its default.
    fn current(&self) -> Option<&str> {
        match self.classifier.family() {
            Family::Bbr => Some("bbr"),
            Family::LossBased => None,
        }
    }

    /// Samples every data socket; returns the decision's sentence when the streams switched.
    fn sample(&mut self, sh: &Shared) -> Option<String> {
        let sockets = sh.sockets.lock().expect("sockets lock").clone();
        let mut infos = Vec::with_capacity(sockets.len());
        let mut path_base = 0u32;
        for (idx, fd) in &sockets {
            // SAFETY: descriptors leave the list before their sockets close.
            let Ok(info) = sys::tcp_info(&unsafe { BorrowedFd::borrow_raw(*fd) }) else {
                continue;
            };
            let base = path_base_rtt(*fd, info.min_rtt);
            if base > 0 && (path_base == 0 || base < path_base) {
                path_base = base;
            }
            infos.push(StreamInfo {
                stream: *idx,
                rtt_us: info.rtt,
                min_rtt_us: info.min_rtt,
                ssthresh: info.snd_ssthresh,
                ca_state: info.ca_state,
                total_retrans: info.total_retrans,
                segs_out: info.segs_out,
                bytes_acked: info.bytes_acked,
            });
        }
        if self.initial.is_none()
            && let Some((_, fd)) = sockets.first()
        {
            // SAFETY: as above.
            self.initial = sys::congestion(&unsafe { BorrowedFd::borrow_raw(*fd) }).ok();
        }
        let decision = self
            .classifier
            .sample(self.started.elapsed(), path_base, &infos)?;
        let initial = self.initial.clone().unwrap_or_else(sys::default_congestion);
        let to = match decision.to {
            Family::Bbr => "bbr".to_string(),
            Family::LossBased => initial,
        };
        for (_, fd) in &sockets {
            // SAFETY: as above.
            let _ = sys::set_congestion(&unsafe { BorrowedFd::borrow_raw(*fd) }, &to);
        }
        {
            let mut cc = sh.congestion.lock().expect("cc lock");
            *cc = format!("{cc}->{to}");
        }
        let note = format!(
            "congestion control at {:.1} s, {} streams: {}",
            decision.at_ms as f64 / 1e3,
            sockets.len(),
            decision.why
        );
        sh.decisions.lock().expect("decisions lock").push(decision);
        Some(note)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_already_past_wakes_the_session_loop_once_per_slack_not_at_once() {
        let now = Instant::now();
        let idle = Armed::default();
        assert!(
            idle.moved_earlier(now),
            "no timer armed: any deadline wakes it"
        );
        // The loop handled a timeout now and re-armed to the floor; the hedge deadline
        // stays in the past: no wake-up until the floor (the loop spun here before).
        let handled = Armed {
            at: Some(now + TIMER_SLACK),
            floor: Some(now + TIMER_SLACK),
        };
        assert!(!handled.moved_earlier(now - Duration::from_secs(1)));
        assert!(!handled.moved_earlier(now + TIMER_SLACK));
        // A loss deadline brought forward by an acknowledgement still re-arms the loop.
        let far = Armed {
            at: Some(now + Duration::from_secs(30)),
            floor: Some(now + TIMER_SLACK),
        };
        assert!(far.moved_earlier(now + Duration::from_secs(5)));
        assert!(
            far.moved_earlier(now - Duration::from_secs(1)),
            "to the floor"
        );
        assert!(!far.moved_earlier(now + Duration::from_secs(31)));
    }
}
