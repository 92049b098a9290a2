//! Drives a [`wire::sink::Sink`] over data streams.
//!
//! Each stream has a reader task that reads frames straight into pooled buffers and checks
//! each block's CRC32C as it arrives, and a writer task for its answers (acks, resend requests,
//! verdicts). Verified blocks go to a pool of writer threads that write them at their offsets
//! (`pwrite`) and feed the whole-file digests; file operations (open the temporary file,
//! checkpoint the restart ledger, commit, discard) run on a separate pool so that no stream
//! waits for an fsync.

use crate::claims::{self, Claim};
use crate::conn::{self, Reader, Writer};
use crate::error::{TransferError, io_info};
use crate::faults;
use crate::pool::{BufPool, MemoryBudget, PooledBuf, SharedSlice};
use crate::progress::{Counters, Event, EventSender, file_done, file_failed};
use crate::service::{MemoryFile, SinkNaming};
use crate::store::{self, Opened, Root};
use crate::sys;
use crate::timer;
use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use wire::bottleneck::ReceiveEvidence;
use wire::checksum::{Algorithm, InOrderDigest, block_crc};
use wire::control::{SessionOptions, SessionSummary};
use wire::data::{self, BLOCK_HEADER_LEN, BlockHeader, DataFrame, FileBegin, FileId};
use wire::error::{ErrorInfo, ErrorKind};
use wire::ranges::RangeSet;
use wire::sink::{BlockVerdict, Sink, SinkAction, SinkConfig, SinkEvent, SinkStats};

/// Where to receive.
pub struct SinkSpec {
    pub root: Arc<Root>,
    pub naming: Arc<dyn SinkNaming>,
    pub options: SessionOptions,
    /// How often unfinished files are synced and their restart ledgers written.
    pub checkpoint_interval: Duration,
    /// Bytes the session may hold in block buffers (see [`MemoryBudget`]).
    pub budget: MemoryBudget,
    /// Who the session writes for (the mapped account or certificate subject): only another
    /// session of the same owner may take one of its files over (see [`crate::claims`]).
    pub owner: String,
}

/// Memory a receiving session may hold in block buffers unless told otherwise: enough for
/// the writer queues, the stash and a block per stream with 4 MiB blocks.
pub const DEFAULT_SESSION_BUFFER: u64 = 256 << 20;

/// What a finished sink session did.
#[derive(Clone, Debug, Default)]
pub struct SinkOutcome {
    pub stats: SinkStats,
    pub streams: u32,
    /// What the bottleneck report needs from the receiving side.
    pub evidence: ReceiveEvidence,
}

impl SinkOutcome {
    /// What the session reports to its peer and to the copy's report.
    pub fn summary(&self) -> SessionSummary {
        SessionSummary {
            bytes_moved: self.stats.bytes_written,
            bytes_skipped: self.stats.bytes_resumed,
            files_done: self.stats.files_done,
            files_failed: self.stats.files_failed,
            streams: self.streams,
            blocks_resent: self.stats.crc_failures,
            receive: Some(self.evidence.clone()),
            ..Default::default()
        }
    }
}

/// Where an open file's bytes go: a temporary file under the root, or a memory target (see
/// [`crate::service::MemoryTarget`]).
enum Target {
    Disk(std::fs::File),
    Memory(Arc<dyn MemoryFile>),
}

impl Target {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        match self {
            Target::Disk(f) => f.write_all_at(buf, offset),
            Target::Memory(m) => m.write_at(offset, buf),
        }
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        match self {
            Target::Disk(f) => f.read_exact_at(buf, offset),
            Target::Memory(m) => m.read_at(offset, buf),
        }
    }
}

struct OpenFile {
    file: Target,
    final_path: PathBuf,
    begin: FileBegin,
    digest: Mutex<Option<InOrderDigest<SharedSlice>>>,
    /// Held by every checkpoint and by the commit or discard that closes the file: no ledger
    /// is written once the file is committed or given up (a checkpoint racing a commit used to
    /// leave a ledger beside the finished file), and the claim on the destination is released
    /// only when the file is closed.
    life: Mutex<Life>,
}

struct Life {
    closed: bool,
    /// This session's right to write the destination (see [`crate::claims`]).
    claim: Option<Claim>,
}

impl OpenFile {
    /// Closes the file for good: later checkpoints do nothing. Returns the claim, to be
    /// dropped once the file's fate on disk is settled.
    fn close(life: &mut Life) -> Option<Claim> {
        life.closed = true;
        life.claim.take()
    }
}

/// How long a session waits for an earlier session writing the same destination to give it
/// up (that one writes the file's ledger and closes it).
const TAKEOVER_WAIT: Duration = Duration::from_secs(30);

enum Op {
    Action(SinkAction),
}

struct WriteJob {
    file: FileId,
    attempt: u32,
    offset: u64,
    crc: u32,
    payload: PooledBuf,
    new_ranges: RangeSet,
}

impl WriteJob {
    /// The write a block's verdict asks for, if any.
    fn of(verdict: BlockVerdict<(PooledBuf, u32)>) -> Option<Self> {
        match verdict {
            BlockVerdict::Write {
                file,
                attempt,
                offset,
                payload: (payload, crc),
                new_ranges,
            } => Some(Self {
                file,
                attempt,
                offset,
                crc,
                payload,
                new_ranges,
            }),
            _ => None,
        }
    }

    /// Writes are spread over the writer threads by file, so one file's blocks stay in order.
    fn queue<'a, Q>(&self, queues: &'a [Q]) -> &'a Q {
        &queues[self.file as usize % queues.len()]
    }
}

struct Shared {
    /// The session's span (`sink`): each file's log lines are in a `file` span below it,
    /// whichever thread writes them.
    span: tracing::Span,
    state: Mutex<Sink<(PooledBuf, u32)>>,
    files: Mutex<HashMap<(FileId, u32), Arc<OpenFile>>>,
    outboxes: Mutex<HashMap<u32, mpsc::UnboundedSender<DataFrame>>>,
    ops: flume::Sender<Option<Op>>,
    /// One queue per writer thread; a file's blocks always go to the same writer, so writes to
    /// one file never contend for its inode lock and land roughly in order.
    writes: Vec<flume::Sender<Option<WriteJob>>>,
    root: Arc<Root>,
    naming: Arc<dyn SinkNaming>,
    owner: String,
    algos: Vec<Algorithm>,
    fsync: bool,
    /// Block buffers of all streams. It keeps as many idle buffers as the writer queues can
    /// hold, so a steady stream of blocks reuses them instead of mapping, faulting in and
    /// zeroing fresh ones (1 MiB allocations go to `mmap`): 22,000 page faults per 4 GiB with
    /// a small pool. A session-wide pool never keeps more idle than were in flight at once.
    blocks: BufPool,
    /// What the block buffers may hold in all.
    budget: MemoryBudget,
    /// Largest block the session accepts: its block size.
    max_block: usize,
    /// A frame whose bytes stop arriving for this long closes its stream (a peer that stops
    /// short of a block's end gives its buffer back).
    frame_idle: Duration,
    digest_budget: u64,
    counters: Arc<Counters>,
    events: EventSender,
    cancel: CancellationToken,
    failure: Mutex<Option<TransferError>>,
    pending_ops: AtomicU64,
    ended: AtomicBool,
    live_streams: AtomicU64,
    changed: Notify,
    /// Time the writer and file-operation threads spent writing and committing (syncing)
    /// files: the destination storage's share of the session (bottleneck evidence).
    store_ns: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Sink<(PooledBuf, u32)>> {
        self.state.lock().expect("sink state lock")
    }

    fn fail(&self, e: TransferError) {
        let mut f = self.failure.lock().expect("failure lock");
        if f.is_none() {
            *f = Some(e);
        }
        self.cancel.cancel();
        self.changed.notify_waiters();
    }

    fn file(&self, file: FileId, attempt: u32) -> Option<Arc<OpenFile>> {
        self.files
            .lock()
            .expect("files lock")
            .get(&(file, attempt))
            .cloned()
    }

    /// Routes the state machine's pending actions (call with the state locked).
    fn dispatch(&self, st: &mut Sink<(PooledBuf, u32)>) {
        let stats = st.stats();
        Counters::set(
            &self.counters.bytes_done,
            stats.bytes_written + stats.bytes_resumed,
        );
        Counters::set(&self.counters.bytes_skipped, stats.bytes_resumed);
        Counters::set(&self.counters.files_done, stats.files_done);
        Counters::set(&self.counters.files_failed, stats.files_failed);
        while let Some(a) = st.poll_action() {
            match a {
                SinkAction::Send { stream, frame } => {
                    if let Some(tx) = self.outboxes.lock().expect("outbox lock").get(&stream) {
                        let _ = tx.send(frame);
                    }
                }
                SinkAction::Event(SinkEvent::FileDone {
                    path,
                    size,
                    digests,
                    skipped,
                    ..
                }) => {
                    let ev = file_done(&self.span, "file received", path, size, digests, skipped);
                    let _ = self.events.send(ev);
                }
                SinkAction::Event(SinkEvent::FileFailed { path, error, .. }) => {
                    let _ = self.events.send(file_failed(&self.span, path, error));
                }
                other => {
                    if let SinkAction::Open { begin, .. } | SinkAction::MakeDir { begin, .. } =
                        &other
                    {
                        let path = begin.path.clone();
                        let _ = self.events.send(Event::FileStarted { path });
                    }
                    self.pending_ops.fetch_add(1, Ordering::SeqCst);
                    let _ = self.ops.send(Some(Op::Action(other)));
                }
            }
        }
        self.changed.notify_waiters();
    }

    fn write_verdicts(&self, verdicts: Vec<BlockVerdict<(PooledBuf, u32)>>) {
        for job in verdicts.into_iter().filter_map(WriteJob::of) {
            let _ = job.queue(&self.writes).send(Some(job));
        }
    }

    /// Feeds on-disk ranges the digest needs and reports it when complete.
    fn catch_up(&self, of: &OpenFile, file: FileId, attempt: u32) {
        let digests = {
            let mut guard = of.digest.lock().expect("digest lock");
            let Some(d) = guard.as_mut() else { return };
            while let Some((o, l)) = d.poll_need(4 << 20) {
                let pool = BufPool::new(0);
                let mut buf = pool.get(l as usize);
                if let Err(e) = of.file.read_exact_at(buf.as_mut_slice(), o) {
                    drop(guard);
                    let info = io_info(&of.begin.path, &e);
                    let mut st = self.lock();
                    st.on_written(file, attempt, &RangeSet::new(), Err(info), Instant::now());
                    self.dispatch(&mut st);
                    return;
                }
                let len = buf.len();
                d.offer_read_back(
                    o,
                    SharedSlice {
                        buf: Arc::new(buf),
                        start: 0,
                        end: len,
                    },
                );
            }
            if !d.is_complete() {
                return;
            }
            guard.take().and_then(|d| d.finish())
        };
        if let Some(digests) = digests {
            let mut st = self.lock();
            st.on_digest_complete(file, attempt, digests);
            self.dispatch(&mut st);
        }
    }

    fn do_write(&self, job: WriteJob) {
        let Some(of) = self.file(job.file, job.attempt) else {
            return;
        };
        let len = job.payload.len() as u64;
        let writing = Instant::now();
        let result = of.file.write_all_at(job.payload.as_ref(), job.offset);
        self.store_ns
            .fetch_add(writing.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let result = result.map_err(|e| {
            let shown = self.root.display(&of.final_path);
            self.naming
                .public_error(&of.begin.path, &shown, io_info(&shown, &e))
        });
        if result.is_ok() {
            Counters::add(&self.counters.bytes_received, len);
            faults::moved(len);
            let whole = job.new_ranges.pairs() == [(job.offset, job.offset + len)];
            let buf = Arc::new(job.payload);
            let mut guard = of.digest.lock().expect("digest lock");
            if let Some(d) = guard.as_mut() {
                for r in job.new_ranges.iter() {
                    let (s, e) = (
                        (r.start - job.offset) as usize,
                        (r.end - job.offset) as usize,
                    );
                    let crc = whole.then_some(job.crc);
                    d.offer(
                        r.start,
                        r.end - r.start,
                        crc,
                        Some(SharedSlice {
                            buf: buf.clone(),
                            start: s,
                            end: e,
                        }),
                    );
                }
            }
        }
        let mut st = self.lock();
        st.on_written(
            job.file,
            job.attempt,
            &job.new_ranges,
            result,
            Instant::now(),
        );
        self.dispatch(&mut st);
        drop(st);
        self.catch_up(&of, job.file, job.attempt);
    }

    /// Another session of the same owner wants to write a file this one has open: give it up
    /// now, on the asking thread (record its ledger, close it, release its claim), so that the
    /// answer never waits for this session's own file-operation threads; see
    /// [`crate::claims`].
    fn give_up(&self, file: FileId, attempt: u32) {
        let mut st = self.lock();
        st.give_up(
            file,
            attempt,
            // Not retryable: the newer transfer finishes the file; this one (a retry's
            // abandoned predecessor, usually) must not take it back.
            ErrorInfo::new(
                ErrorKind::Io,
                "taken over by a newer transfer of the same file (it resumes from what was received)",
            )
            .retryable(false),
        );
        self.dispatch(&mut st);
        drop(st);
        // The discard the state machine queued finds nothing left to do.
        let of = self
            .files
            .lock()
            .expect("files lock")
            .remove(&(file, attempt));
        if let Some(of) = of {
            self.save_partial(file, &of);
        }
    }

    /// Claims the destination of `file` for this session, asking an earlier session that has
    /// it open to give it up.
    fn claim(
        self: &Arc<Self>,
        file: FileId,
        attempt: u32,
        final_path: &std::path::Path,
    ) -> Result<Claim, ErrorInfo> {
        let key = store::destination_key(&self.root, final_path)?;
        let me = Arc::downgrade(self);
        let give_up: claims::Yield = Arc::new(move || {
            if let Some(sh) = me.upgrade() {
                sh.give_up(file, attempt);
            }
        });
        claims::claim(key, &self.owner, give_up, TAKEOVER_WAIT).map_err(|why| match why {
            claims::Refused::Busy => ErrorInfo::new(
                ErrorKind::NotWritable,
                format!(
                    "{}: another user's transfer is writing this file",
                    self.root.display(final_path)
                ),
            )
            .retryable(false),
            claims::Refused::NotReleased => ErrorInfo::new(
                ErrorKind::Io,
                format!(
                    "{}: an earlier transfer still writes this file and did not let go within {} s",
                    self.root.display(final_path),
                    TAKEOVER_WAIT.as_secs()
                ),
            ),
        })
    }

    fn do_op(self: &Arc<Self>, op: Op) {
        let Op::Action(action) = op;
        let now = Instant::now();
        match action {
            // A session that has ended opens nothing more (its files are being saved).
            SinkAction::Open { .. } if self.cancel.is_cancelled() => {}
            SinkAction::Open {
                file,
                attempt,
                begin,
            } if self.naming.memory().is_some() => self.open_in_memory(file, attempt, begin),
            SinkAction::Open {
                file,
                attempt,
                begin,
            } => {
                let claimed = self
                    .naming
                    .map(&begin.path)
                    .and_then(|p| self.claim(file, attempt, &p).map(|c| (p, c)));
                let (final_path, claim) = match claimed {
                    Ok(c) => c,
                    Err(e) => return self.open_failed(file, attempt, e, now),
                };
                // A storage node never writes over a replica it holds (unless its capability
                // says that replica is bad): a write capability replayed after the commit must
                // not destroy the verified copy.
                let replace = self.naming.may_replace(&begin.path);
                let opened = if replace {
                    Ok(())
                } else {
                    store::refuse_existing(&self.root, &final_path, &begin)
                }
                .and_then(|()| {
                    store::open_destination(
                        &self.root,
                        &final_path,
                        begin.size,
                        begin.mtime,
                        begin.resume,
                    )
                });
                let shown = self.root.display(&final_path);
                let opened = opened.map_err(|e| self.naming.public_error(&begin.path, &shown, e));
                match opened {
                    Ok(Opened::Partial { file: f, have }) => {
                        let of = self.open_file(Target::Disk(f), final_path, begin, Some(claim));
                        self.publish_opened(file, attempt, of, have, now);
                    }
                    Ok(Opened::Complete) => {
                        // A storage node reports such a file again before it is done: it may
                        // have been committed here by a session that died (or whose report
                        // was lost) before its report (which then still waits, pending, in
                        // the catalog). Settled as a commit's report is (see Commit).
                        self.pending_ops.fetch_add(1, Ordering::SeqCst);
                        let sh = self.clone();
                        let settled = Box::new(move |r: Result<(), ErrorInfo>| {
                            drop(claim);
                            let mut st = sh.lock();
                            match r {
                                Ok(()) => st.on_already_complete(file, attempt),
                                Err(e) => {
                                    st.on_opened(file, attempt, Err(e), Instant::now());
                                }
                            }
                            sh.dispatch(&mut st);
                            drop(st);
                            sh.pending_ops.fetch_sub(1, Ordering::SeqCst);
                            sh.changed.notify_waiters();
                        });
                        self.naming.found_complete_then(
                            &self.root,
                            &final_path,
                            &begin,
                            &self.algos,
                            settled,
                        );
                    }
                    Err(e) => self.open_failed(file, attempt, e, now),
                }
            }
            SinkAction::MakeDir {
                file,
                attempt,
                begin,
            } => {
                let r = self.naming.make_dir(&self.root, &begin.path, begin.mode);
                let mut st = self.lock();
                st.on_committed(file, attempt, r);
                self.dispatch(&mut st);
            }
            SinkAction::Checkpoint {
                file,
                attempt,
                ranges,
            } => {
                if let Some(of) = self.file(file, attempt)
                    && let Err(e) = self.checkpoint(&of, &ranges)
                {
                    tracing::warn!(path = %of.begin.path, error = %e, "checkpoint failed");
                }
                let mut st = self.lock();
                st.on_checkpointed(file, attempt);
                self.dispatch(&mut st);
            }
            SinkAction::DigestCatchUp { file, attempt } => {
                if let Some(of) = self.file(file, attempt) {
                    self.catch_up(&of, file, attempt);
                }
            }
            SinkAction::Commit {
                file,
                attempt,
                begin,
                digests,
            } => {
                let of = self
                    .files
                    .lock()
                    .expect("files lock")
                    .remove(&(file, attempt));
                let (r, claim) = match of {
                    Some(of) => {
                        let mut life = of.life.lock().expect("file life lock");
                        let claim = OpenFile::close(&mut life);
                        let committing = Instant::now();
                        let r = match &of.file {
                            Target::Disk(f) => store::commit(
                                &self.root,
                                &of.final_path,
                                f,
                                begin.mode,
                                begin.mtime,
                                self.fsync,
                                self.naming.may_replace(&begin.path),
                            ),
                            Target::Memory(m) => m.commit(),
                        };
                        self.store_ns
                            .fetch_add(committing.elapsed().as_nanos() as u64, Ordering::Relaxed);
                        (r, claim)
                    }
                    None => (
                        Err(ErrorInfo::new(
                            ErrorKind::Io,
                            format!("{}: file handle lost", begin.path),
                        )),
                        None,
                    ),
                };
                let r = r.map_err(|e| {
                    let shown = self.naming.map(&begin.path).map(|p| self.root.display(&p));
                    self.naming
                        .public_error(&begin.path, &shown.unwrap_or_default(), e)
                });
                if let Err(e) = r {
                    let mut st = self.lock();
                    st.on_committed(file, attempt, Err(e));
                    self.dispatch(&mut st);
                    return;
                }
                // A storage node reports the file before its sender hears it is done; if the
                // metadata server refuses it, the local copy goes (it is the one this commit
                // made: a node's commit never replaces an existing replica it may not). The
                // report may settle later, on another thread: it counts as a pending
                // operation until then, and the claim on the destination is held until the
                // file's fate is settled.
                self.pending_ops.fetch_add(1, Ordering::SeqCst);
                let sh = self.clone();
                let announced = begin.path.clone();
                let settled = Box::new(move |r: Result<(), ErrorInfo>| {
                    if r.is_err()
                        && sh.naming.memory().is_none()
                        && let Ok(p) = sh.naming.map(&announced)
                    {
                        let _ = sh.root.remove_file(&p);
                    }
                    drop(claim);
                    let mut st = sh.lock();
                    st.on_committed(file, attempt, r);
                    sh.dispatch(&mut st);
                    drop(st);
                    sh.pending_ops.fetch_sub(1, Ordering::SeqCst);
                    sh.changed.notify_waiters();
                });
                self.naming
                    .committed_then(&begin.path, begin.size, &digests, begin.mtime, settled);
            }
            SinkAction::Discard {
                file,
                attempt,
                keep_partial,
            } => {
                let of = self
                    .files
                    .lock()
                    .expect("files lock")
                    .remove(&(file, attempt));
                if let Some(of) = of {
                    if keep_partial {
                        self.save_partial(file, &of);
                    } else {
                        let mut life = of.life.lock().expect("file life lock");
                        let _claim = OpenFile::close(&mut life);
                        self.discard(&of, false);
                    }
                }
            }
            SinkAction::Send { .. } | SinkAction::Event(_) => unreachable!("handled in dispatch"),
        }
    }

    /// Syncs `ranges` of an open file and records them in its restart ledger, unless the file
    /// was closed meanwhile (committed or given up).
    fn checkpoint(&self, of: &OpenFile, ranges: &RangeSet) -> std::io::Result<()> {
        let life = of.life.lock().expect("file life lock");
        if life.closed {
            return Ok(());
        }
        self.write_ledger(of, ranges)
    }

    /// Records `ranges` in the file's restart ledger (a file in memory has none: it is not
    /// resumed).
    fn write_ledger(&self, of: &OpenFile, ranges: &RangeSet) -> std::io::Result<()> {
        let Target::Disk(f) = &of.file else {
            return Ok(());
        };
        store::checkpoint(
            &self.root,
            &of.final_path,
            f,
            of.begin.size,
            of.begin.mtime,
            ranges,
        )
    }

    /// Drops what was received of a file not finished (a temporary file on disk is kept
    /// when `keep_partial`, for a resume).
    fn discard(&self, of: &OpenFile, keep_partial: bool) {
        match &of.file {
            Target::Disk(_) => store::discard(&self.root, &of.final_path, keep_partial),
            Target::Memory(m) => m.discard(),
        }
    }

    /// Opens a file received into the naming's memory target: nothing on disk, so no claim,
    /// no ledger and nothing to resume.
    /// A file could not be opened: the state machine hears why.
    fn open_failed(&self, file: FileId, attempt: u32, e: ErrorInfo, now: Instant) {
        let mut st = self.lock();
        st.on_opened(file, attempt, Err(e), now);
        self.dispatch(&mut st);
    }

    fn open_in_memory(self: &Arc<Self>, file: FileId, attempt: u32, begin: FileBegin) {
        let now = Instant::now();
        let opened = match self.naming.memory() {
            Some(m) => m.open(&begin.path, begin.size),
            None => Err(ErrorInfo::new(ErrorKind::Io, "no memory target")),
        };
        let target = match opened {
            Ok(t) => t,
            Err(e) => return self.open_failed(file, attempt, e, now),
        };
        let path = PathBuf::from(&begin.path);
        let of = self.open_file(Target::Memory(target), path, begin, None);
        self.publish_opened(file, attempt, of, RangeSet::new(), now);
    }

    /// A file opened for receiving (on disk, with the destination claimed; or in memory).
    fn open_file(
        &self,
        file: Target,
        final_path: PathBuf,
        begin: FileBegin,
        claim: Option<Claim>,
    ) -> Arc<OpenFile> {
        let digest = InOrderDigest::new(&self.algos, begin.size, self.digest_budget);
        Arc::new(OpenFile {
            file,
            final_path,
            begin,
            digest: Mutex::new(Some(digest)),
            life: Mutex::new(Life {
                closed: false,
                claim,
            }),
        })
    }

    /// Makes a file just opened, holding `have` already (a resume), known to the session
    /// and lets its blocks be written; unless it was given up or aborted while it was being
    /// opened: then it is closed, and only what it held before is kept (for a resume).
    fn publish_opened(
        &self,
        file: FileId,
        attempt: u32,
        of: Arc<OpenFile>,
        have: RangeSet,
        now: Instant,
    ) {
        if let Some(d) = of.digest.lock().expect("digest lock").as_mut() {
            for r in have.iter() {
                d.offer(r.start, r.end - r.start, None, None);
            }
        }
        // Under the state lock: the file is still wanted and becomes known to the rest of
        // the session in one step, so nothing can miss it.
        let mut st = self.lock();
        if !st.is_opening(file, attempt) {
            drop(st);
            let mut life = of.life.lock().expect("file life lock");
            let _claim = OpenFile::close(&mut life);
            // What was there before stays for a resume; a new empty temporary file goes.
            self.discard(&of, !have.is_empty());
            return;
        }
        self.files
            .lock()
            .expect("files lock")
            .insert((file, attempt), of.clone());
        let verdicts = st.on_opened(file, attempt, Ok(have), now);
        self.dispatch(&mut st);
        drop(st);
        self.write_verdicts(verdicts);
        self.catch_up(&of, file, attempt);
    }

    /// Keeps an unfinished file's data for a resume by writing its restart ledger, and closes
    /// it (releasing its claim: a newer session taking the file over resumes from that
    /// ledger). Without a ledger (nothing written, or the ledger cannot be written, as on a
    /// full disk) the temporary file could never be resumed and would only hold space, so it
    /// is removed.
    fn save_partial(&self, file: FileId, of: &OpenFile) {
        let ranges = self.lock().written(file).cloned().unwrap_or_default();
        let mut life = of.life.lock().expect("file life lock");
        if life.closed {
            return;
        }
        let kept = !ranges.is_empty()
            && match self.write_ledger(of, &ranges) {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(path = %of.begin.path, error = %e, "could not save the restart ledger: partial data dropped");
                    false
                }
            };
        if !kept || matches!(of.file, Target::Memory(_)) {
            self.discard(of, false);
        }
        let _claim = OpenFile::close(&mut life);
    }
}

async fn stream_reader(
    sh: Arc<Shared>,
    idx: u32,
    r: Reader,
    outbox: mpsc::UnboundedSender<DataFrame>,
    stop: CancellationToken,
    await_bind: bool,
    lowat: Option<std::os::fd::RawFd>,
) {
    let peer = format!("data stream {idx}");
    let mut r = BufReader::with_capacity(256 << 10, r);
    let mut processed = 0u64;
    let mut acked = 0u64;
    let result: Result<bool, TransferError> = async {
        if await_bind {
            conn::read_bind_result(&mut r, &peer).await?;
        }
        loop {
            let header = tokio::select! {
                h = conn::read_header(&mut r, data::limits, &peer) => h?,
                _ = stop.cancelled() => return Ok(false),
            };
            let Some(h) = header else { return Ok(false) };
            Counters::add(&sh.counters.activity, 1);
            if h.kind == data::KIND_BLOCK {
                let mut bh = [0u8; BLOCK_HEADER_LEN];
                r.read_exact(&mut bh)
                    .await
                    .map_err(|e| TransferError::connect(format!("{peer}: {e}")))?;
                let bh = BlockHeader::decode(&bh);
                let len = h.len as usize - BLOCK_HEADER_LEN;
                if len > sh.max_block {
                    return Err(TransferError::protocol(format!(
                        "{peer}: a block of {len} bytes in a session of {}-byte blocks",
                        sh.max_block
                    )));
                }
                // The buffer is allocated only once its bytes fit the session's budget. A block
                // that finds no room within the frame idle time counts as a stalled stream,
                // like one whose bytes stop arriving (its blocks go to the other streams).
                let held = tokio::select! {
                    h = tokio::time::timeout(sh.frame_idle, sh.budget.acquire(len as u64)) => h
                        .map_err(|_| TransferError::connect(format!(
                            "{peer}: no buffer free for a block within {} s", sh.frame_idle.as_secs()
                        )))?,
                    _ = stop.cancelled() => return Ok(false),
                };
                let Some(held) = held else {
                    return Err(TransferError::protocol(format!(
                        "{peer}: a block of {len} bytes exceeds the session's buffer budget"
                    )));
                };
                let mut buf = sh.blocks.get(len);
                buf.hold(held);
                // A whole block within four idle times: a peer trickling a byte now and then
                // cannot hold its buffer for long.
                tokio::time::timeout(
                    sh.frame_idle * 4,
                    read_payload(&mut r, buf.as_mut_slice(), lowat, sh.frame_idle),
                )
                .await
                .map_err(|_| {
                    TransferError::connect(format!("{peer}: a block took over {} s", sh.frame_idle.as_secs() * 4))
                })?
                .map_err(|e| TransferError::connect(format!("{peer}: {e}")))?;
                let crc_ok = block_crc(buf.as_ref()) == bh.crc;
                let verdict = {
                    let mut st = sh.lock();
                    let v = st.on_block(idx, bh, len as u32, crc_ok, (buf, bh.crc), Instant::now());
                    sh.dispatch(&mut st);
                    v
                };
                if let Some(job) = WriteJob::of(verdict) {
                    let queue = job.queue(&sh.writes);
                    let t = Instant::now();
                    if queue.send_async(Some(job)).await.is_err() {
                        return Ok(false);
                    }
                    if t.elapsed() > Duration::from_millis(500) {
                        tracing::debug!(
                            stream = idx,
                            waited_ms = t.elapsed().as_millis() as u64,
                            "writer queue full"
                        );
                    }
                }
            } else {
                let body = tokio::time::timeout(sh.frame_idle, conn::read_body(&mut r, h.len, &peer))
                    .await
                    .map_err(|_| TransferError::connect(format!("{peer}: a frame stopped short")))??;
                let frame = DataFrame::decode(h, &body)
                    .map_err(|e| TransferError::protocol(format!("{peer}: {e}")))?;
                let end = frame == DataFrame::StreamEnd;
                let mut st = sh.lock();
                st.on_frame(idx, frame, Instant::now())
                    .map_err(|v| TransferError::protocol(v.to_string()))?;
                sh.dispatch(&mut st);
                if end {
                    return Ok(true);
                }
            }
            processed += 1;
            if ack_due(
                h.kind == data::KIND_BLOCK,
                processed - acked,
                r.buffer().is_empty(),
            ) {
                let _ = outbox.send(DataFrame::Ack(processed));
                acked = processed;
            }
        }
    }
    .await;
    match result {
        Ok(true) => {
            tracing::debug!("data stream ended: the sender sent its end of session");
            sh.ended.store(true, Ordering::SeqCst);
        }
        Ok(false) => tracing::debug!("data stream ended"),
        Err(e) if e.kind() == ErrorKind::Protocol || e.is_refusal() => sh.fail(e),
        Err(e) => tracing::debug!(stream = idx, error = %e, "data stream closed"),
    }
    {
        let mut st = sh.lock();
        st.on_stream_closed(idx);
        sh.dispatch(&mut st);
    }
    sh.live_streams.fetch_sub(1, Ordering::SeqCst);
    sh.changed.notify_waiters();
}

/// A session receiving nothing for this long logs what it waits for (at debug level).
const SINK_IDLE_REPORT: Duration = Duration::from_secs(2);

/// Most bytes a block read waits for before waking (SO_RCVLOWAT).
const LOWAT_CHUNK: usize = 256 << 10;

/// The low-water mark a payload read may set on socket `fd`: [`LOWAT_CHUNK`], or an eighth of
/// the socket's receive buffer if that is less. The kernel grows the buffer to twice a mark it
/// cannot hold, and may clamp the window with it; a young connection on a long path, whose
/// buffer autotuning has not yet grown, would then lose window it needs. At an eighth the mark
/// leaves the buffer and window alone (with its defaults the kernel counts about half of a
/// buffer's bytes as payload; an eighth leaves room for drivers that waste more) (kept as the test
/// `a_payload_low_water_mark_leaves_the_receive_buffer_alone`).
fn lowat_cap(fd: std::os::fd::RawFd) -> usize {
    crate::sys::recv_buffer(fd)
        .map(|b| (b / 8).min(LOWAT_CHUNK))
        .unwrap_or(0)
}

/// Reads a block's payload; no byte arriving for `idle` is an error (the stream closes and
/// the buffer is given back). With `lowat` (a plain socket), the socket is told how much of
/// the payload is still to come, up to [`lowat_cap`], so the reader wakes once per chunk rather
/// than for every few segments; it never waits for more than the block still needs, and is set
/// back to 1 for the small frames that follow.
async fn read_payload(
    r: &mut BufReader<Reader>,
    buf: &mut [u8],
    lowat: Option<std::os::fd::RawFd>,
    idle: Duration,
) -> std::io::Result<()> {
    let mut pos = 0;
    let cap = lowat.map(lowat_cap).unwrap_or(0);
    while pos < buf.len() {
        if let Some(fd) = lowat {
            let from_socket = (buf.len() - pos).saturating_sub(r.buffer().len());
            if from_socket > 0 && cap > 1 {
                let _ = crate::sys::set_rcvlowat(fd, from_socket.min(cap));
            }
        }
        let n = tokio::time::timeout(idle, r.read(&mut buf[pos..]))
            .await
            .map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no data for {} s in the middle of a block", idle.as_secs()),
                )
            })??;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        pos += n;
    }
    if let Some(fd) = lowat {
        let _ = crate::sys::set_rcvlowat(fd, 1);
    }
    Ok(())
}

async fn stream_writer(
    mut w: Writer,
    mut outbox: mpsc::UnboundedReceiver<DataFrame>,
    stop: CancellationToken,
) {
    let peer = "data stream (reverse)";
    loop {
        let frame = tokio::select! {
            f = outbox.recv() => f,
            _ = stop.cancelled() => None,
        };
        let Some(frame) = frame else { break };
        let mut bytes = frame.encode();
        // Coalesce what is already queued into one write.
        while let Ok(f) = outbox.try_recv() {
            bytes.extend_from_slice(&f.encode());
        }
        if conn::write_all(&mut w, &bytes, peer).await.is_err() || w.flush().await.is_err() {
            break;
        }
    }
    let _ = w.shutdown().await;
}

/// Whether to acknowledge now: after every block (the sender measures stream liveness and
/// rates from these), and otherwise every 16 frames or when no more input is buffered. (A
/// busy stream's read buffer is almost never empty: reading a block's tail refills it with
/// the next frame's head, so "when empty" alone meant no acknowledgements at all.)
fn ack_due(block: bool, unacked_frames: u64, input_drained: bool) -> bool {
    block || unacked_frames >= 16 || input_drained
}

/// The descriptor of a data connection whose payload reads batch wake-ups with SO_RCVLOWAT:
/// plain TCP (TLS buffers records the socket no longer counts), on any path. On a long path
/// the data trickles in a few segments at a time, and without a low-water mark every few
/// segments wake a reader; [`read_payload`] keeps the mark under an eighth of the socket's
/// current receive buffer, so that setting it never grows the buffer or moves the window clamp
/// (the kernel does both for a mark above what the buffer holds).
fn plain_stream(io: &conn::Io) -> Option<std::os::fd::RawFd> {
    use std::os::fd::AsRawFd;
    (!io.is_tls()).then(|| io.tcp().as_raw_fd())
}

/// Writer threads of a sink session.
const WRITERS: usize = 4;

/// Threads that open, commit and discard files.
const FILE_OPS: usize = 8;
/// Blocks queued per writer thread before the stream readers wait.
const WRITE_QUEUE: usize = 8;

/// A worker thread's loop: does the jobs of its queue as they come, sleeping in between (no
/// timer wakes it), until the end mark (`None`) that [`end_workers`] queues behind every job
/// queued before it, or until the queue is closed.
fn work<T>(rx: &flume::Receiver<Option<T>>, mut job: impl FnMut(T)) {
    while let Ok(Some(j)) = rx.recv() {
        job(j);
    }
}

/// Ends `workers` threads taking jobs from `queue`: one end mark each, behind what is queued.
async fn end_workers<T>(queue: &flume::Sender<Option<T>>, workers: usize) {
    for _ in 0..workers {
        let _ = queue.send_async(None).await;
    }
}

async fn join_all(threads: Vec<std::thread::JoinHandle<()>>) {
    for t in threads {
        let _ = tokio::task::spawn_blocking(move || t.join()).await;
    }
}

/// Waits until no file operation is pending (each one that ends wakes `changed`), or no
/// file-op thread is left to run one.
async fn file_ops_settled(sh: &Shared, workers: &[std::thread::JoinHandle<()>]) {
    loop {
        let changed = sh.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if sh.pending_ops.load(Ordering::SeqCst) == 0 || workers.iter().all(|t| t.is_finished()) {
            return;
        }
        // A thread that died (a bug) wakes nobody: look again after a while.
        let _ = tokio::time::timeout(Duration::from_secs(1), changed).await;
    }
}

/// Ends a sink session's workers if its future is dropped before they were ended (the worker
/// threads hold the session, which holds their queues: nothing else would stop them).
struct EndWorkersOnDrop(Option<Arc<Shared>>);

impl EndWorkersOnDrop {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for EndWorkersOnDrop {
    fn drop(&mut self) {
        if let Some(sh) = self.0.take() {
            sh.cancel.cancel();
            // A writer's queue may be full: the marks are queued from a thread of their own.
            let _ = std::thread::Builder::new()
                .name("haul-sink-end".into())
                .spawn(move || {
                    for q in &sh.writes {
                        let _ = q.send(None);
                    }
                    for _ in 0..FILE_OPS {
                        let _ = sh.ops.send(None);
                    }
                });
        }
    }
}

/// Runs a sink session: receives as `spec.naming` says from the data streams that arrive on
/// `conns`. Returns when the source has finished (or on failure, after saving restart
/// ledgers of unfinished files).
#[tracing::instrument(name = "sink", skip_all, fields(owner = %spec.owner))]
pub async fn run_sink(
    spec: SinkSpec,
    mut conns: mpsc::Receiver<conn::DataConn>,
    counters: Arc<Counters>,
    events: EventSender,
    cancel: CancellationToken,
) -> Result<SinkOutcome, TransferError> {
    let (began, cpu_before) = (Instant::now(), sys::cpu_seconds());
    let opts = spec.options.clone();
    let (ops_tx, ops_rx) = flume::unbounded::<Option<Op>>();
    let (w_tx, w_rx): (Vec<_>, Vec<_>) = (0..WRITERS)
        .map(|_| flume::bounded::<Option<WriteJob>>(WRITE_QUEUE))
        .unzip();
    let needs_bytes = opts.checksums.iter().any(|a| *a != Algorithm::Crc32c);
    let sh = Arc::new(Shared {
        span: tracing::Span::current(),
        state: Mutex::new(Sink::new(SinkConfig {
            checkpoint_interval: spec.checkpoint_interval,
            ..SinkConfig::default()
        })),
        files: Mutex::new(HashMap::new()),
        outboxes: Mutex::new(HashMap::new()),
        ops: ops_tx,
        writes: w_tx,
        root: spec.root.clone(),
        naming: spec.naming.clone(),
        owner: spec.owner.clone(),
        algos: opts.checksums.clone(),
        fsync: opts.fsync,
        blocks: BufPool::new(WRITERS * WRITE_QUEUE + 8),
        budget: spec.budget.clone(),
        max_block: opts.block_size.max(4096) as usize,
        frame_idle: Duration::from_millis(opts.stall_timeout_ms.clamp(5_000, 120_000)),
        digest_budget: if needs_bytes {
            (128u64 << 20) / opts.concurrency.clamp(1, 64) as u64
        } else {
            0
        },
        counters,
        events,
        cancel: cancel.child_token(),
        failure: Mutex::new(None),
        pending_ops: AtomicU64::new(0),
        store_ns: AtomicU64::new(0),
        ended: AtomicBool::new(false),
        live_streams: AtomicU64::new(0),
        changed: Notify::new(),
    });
    // The worker threads sleep on their queues until a job comes; the session's end queues
    // an end mark for each (below).
    let mut threads = Vec::new();
    for (i, rx) in w_rx.into_iter().enumerate() {
        let sh = sh.clone();
        threads.push(
            std::thread::Builder::new()
                .name(format!("haul-write-{i}"))
                .spawn(move || work(&rx, |job| sh.do_write(job)))
                .expect("spawn writer thread"),
        );
    }
    for i in 0..FILE_OPS {
        let (sh, rx) = (sh.clone(), ops_rx.clone());
        threads.push(
            std::thread::Builder::new()
                .name(format!("haul-fileop-{i}"))
                .spawn(move || {
                    work(&rx, |op| {
                        sh.do_op(op);
                        sh.pending_ops.fetch_sub(1, Ordering::SeqCst);
                        sh.changed.notify_waiters();
                    })
                })
                .expect("spawn file-op thread"),
        );
    }
    drop(ops_rx);
    // Should this future be dropped before its end, the workers are told to stop all the same.
    let ended = EndWorkersOnDrop(Some(sh.clone()));

    let mut streams = 0u32;
    let mut conns_open = true;
    let mut stops = Vec::new();
    let mut last_activity = (Counters::get(&sh.counters.activity), Instant::now());
    let outcome: Result<(), TransferError> = loop {
        // Registered before the checks: a change between them and the wait is not lost.
        let changed = sh.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        // Diagnostics: a session receiving nothing for a while says what it waits for.
        let activity = Counters::get(&sh.counters.activity);
        if activity != last_activity.0 {
            last_activity = (activity, Instant::now());
        } else if last_activity.1.elapsed() >= SINK_IDLE_REPORT && streams > 0 {
            tracing::debug!(
                pending_ops = sh.pending_ops.load(Ordering::SeqCst),
                writes_queued = sh.writes.iter().map(|w| w.len()).sum::<usize>(),
                state = %sh.lock().describe(),
                "sink idle for 2 s"
            );
            last_activity.1 = Instant::now();
        }
        if let Some(e) = sh.failure.lock().expect("failure lock").take() {
            break Err(e);
        }
        if sh.ended.load(Ordering::SeqCst) && sh.pending_ops.load(Ordering::SeqCst) == 0 {
            break Ok(());
        }
        if streams > 0
            && sh.live_streams.load(Ordering::SeqCst) == 0
            && !sh.ended.load(Ordering::SeqCst)
        {
            break Err(TransferError::connect(
                "the sender closed every data stream before the transfer finished",
            ));
        }
        // The only timer: the next look for the idle diagnostic. Everything else wakes the loop
        // through `changed`.
        let idle_look = (streams > 0).then(|| last_activity.1 + SINK_IDLE_REPORT);
        tokio::select! {
            c = conns.recv(), if conns_open => match c {
                Some(conn::DataConn { stream: idx, io, await_bind, open }) => {
                    streams += 1;
                    let lowat = plain_stream(&io);
                    let (r, w) = io.split();
                    let (tx, rx) = mpsc::unbounded_channel();
                    sh.outboxes.lock().expect("outbox lock").insert(idx, tx.clone());
                    sh.lock().add_stream(idx);
                    sh.live_streams.fetch_add(1, Ordering::SeqCst);
                    let stop = sh.cancel.child_token();
                    let span = tracing::info_span!("stream", idx);
                    let reader = stream_reader(sh.clone(), idx, r, tx, stop.clone(), await_bind, lowat);
                    // The stream counts as active (on an endpoint) while its reader runs.
                    tokio::spawn(async move { let _open = open; reader.await }.instrument(span.clone()));
                    tokio::spawn(stream_writer(w, rx, stop.clone()).instrument(span));
                    stops.push(stop);
                }
                None => conns_open = false,
            },
            _ = &mut changed => {}
            _ = sh.cancel.cancelled() => {
                break Err(sh.failure.lock().expect("failure lock").take().unwrap_or(TransferError::interrupted()));
            }
            _ = timer::sleep_until(idle_look) => {}
        }
    };
    // Give the final acknowledgements a moment to leave, then close everything.
    if outcome.is_ok() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for s in &stops {
        s.cancel();
    }
    sh.cancel.cancel();
    // The workers stop in stages, so that what is queued still runs and what it queues in
    // turn too: first the writers (a file's last write queues its commit), then, once no file
    // operation is pending, the file operations (a digest catch-up queues its commit; queued
    // opens are skipped, the session being cancelled). Only then is every open file known.
    let file_ops = threads.split_off(WRITERS);
    for q in &sh.writes {
        end_workers(q, 1).await;
    }
    join_all(threads).await;
    file_ops_settled(&sh, &file_ops).await;
    end_workers(&sh.ops, FILE_OPS).await;
    join_all(file_ops).await;
    ended.disarm();
    // Unfinished files keep their data and ledger for a resume.
    let open: Vec<(FileId, Arc<OpenFile>)> = sh
        .files
        .lock()
        .expect("files lock")
        .drain()
        .map(|((f, _), of)| (f, of))
        .collect();
    let sh2 = sh.clone();
    let _ = tokio::task::spawn_blocking(move || {
        for (file, of) in open {
            sh2.save_partial(file, &of);
        }
    })
    .await;
    let stats = sh.lock().stats().clone();
    let evidence = ReceiveEvidence {
        write_us: sh.store_ns.load(Ordering::Relaxed) / 1000,
        write_bytes: Counters::get(&sh.counters.bytes_received),
        writers: WRITERS as u32,
        cpu_us: ((sys::cpu_seconds() - cpu_before).max(0.0) * 1e6) as u64,
        wall_us: began.elapsed().as_micros() as u64,
        cpu_millicores: sys::cpu_millicores(),
        rmem_max: sys::host_limits().tcp_rmem_max,
    };
    outcome.map(|()| SinkOutcome {
        stats,
        streams,
        evidence,
    })
}

#[cfg(test)]
mod tests {
    use super::{
        BufReader, LOWAT_CHUNK, ack_due, conn, end_workers, lowat_cap, read_payload, work,
    };
    use super::{DEFAULT_SESSION_BUFFER, MemoryBudget, SinkSpec, run_sink};
    use crate::progress::Counters;
    use crate::service::SinkNaming;
    use crate::store::{Destination, Root};
    use std::os::fd::AsRawFd;
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_util::sync::CancellationToken;

    /// A worker takes jobs as they come and sleeps in between with no timer; at the end it
    /// still does what was queued before its end mark, then stops; an idle worker stops at its
    /// end mark at once.
    #[tokio::test]
    async fn workers_wait_for_jobs_and_do_what_was_queued_before_the_end() {
        let (jobs, rx) = flume::unbounded::<Option<u32>>();
        let worker = std::thread::spawn(move || {
            let mut done = Vec::new();
            work(&rx, |j| done.push(j));
            done
        });
        jobs.send(Some(1)).unwrap();
        std::thread::sleep(Duration::from_millis(30));
        jobs.send(Some(2)).unwrap();
        jobs.send(Some(3)).unwrap();
        end_workers(&jobs, 1).await;
        // Behind the end mark: never done. The worker may already have stopped and dropped
        // its end of the queue, so this send may fail.
        let _ = jobs.send(Some(4));
        assert_eq!(worker.join().unwrap(), [1, 2, 3]);
        // Several workers on one queue: one end mark each.
        let (jobs, rx) = flume::unbounded::<Option<u32>>();
        let idle: Vec<_> = (0..3)
            .map(|_| {
                let rx = rx.clone();
                std::thread::spawn(move || work(&rx, |_| {}))
            })
            .collect();
        end_workers(&jobs, 3).await;
        for w in idle {
            w.join().unwrap();
        }
    }

    /// A session whose future is dropped before its end (a control connection that goes
    /// away mid-session) still stops its 12 worker threads: they let go of the session, whose
    /// naming is then held by this test alone.
    #[tokio::test]
    async fn a_dropped_session_stops_its_worker_threads() {
        let dir = tempfile::tempdir().unwrap();
        let root = Arc::new(Root::confined(dir.path()).unwrap());
        let dest = Destination::resolve(&root, std::path::Path::new("."), true).unwrap();
        let naming: Arc<dyn SinkNaming> = Arc::new(dest);
        let spec = SinkSpec {
            root,
            naming: naming.clone(),
            options: Default::default(),
            checkpoint_interval: Duration::from_secs(1),
            budget: MemoryBudget::new(DEFAULT_SESSION_BUFFER, None),
            owner: "test".into(),
        };
        let (_conns_tx, conns) = tokio::sync::mpsc::channel(1);
        let (events, _events_rx) = tokio::sync::mpsc::unbounded_channel();
        let counters = Arc::new(Counters::default());
        let session = run_sink(spec, conns, counters, events, CancellationToken::new());
        let mut session = Box::pin(session);
        // The session waits for its data streams, with its workers started.
        assert!(
            tokio::time::timeout(Duration::from_millis(100), &mut session)
                .await
                .is_err()
        );
        assert!(Arc::strong_count(&naming) > 1);
        drop(session);
        for _ in 0..500 {
            if Arc::strong_count(&naming) == 1 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the workers of a dropped session still hold it");
    }

    /// With SO_RCVLOWAT batching, a block whose last bytes arrive in pieces, part of it already
    /// buffered, with nothing behind it on the stream, still completes (the low-water mark
    /// never asks for more than the block still needs), and a small frame after it is read at
    /// once (the mark is back at 1).
    #[tokio::test]
    async fn payload_reads_with_a_low_water_mark_never_wait_for_bytes_that_will_not_come() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut tx = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (rx, _) = listener.accept().await.unwrap();
        let fd = rx.as_raw_fd();
        let (r, _w) = conn::Io::Plain(rx).split();
        let mut r = BufReader::with_capacity(64 << 10, r);
        let payload: Vec<u8> = (0..(1usize << 20) + 333).map(|i| (i % 251) as u8).collect();
        let sent = payload.clone();
        let sender = tokio::spawn(async move {
            tx.write_all(b"header").await.unwrap();
            for piece in sent.chunks(300_000) {
                tx.write_all(piece).await.unwrap();
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
            tx.write_all(b"end").await.unwrap();
            tx
        });
        let mut head = [0u8; 6];
        r.read_exact(&mut head).await.unwrap();
        let mut buf = vec![0u8; payload.len()];
        tokio::time::timeout(
            Duration::from_secs(5),
            read_payload(&mut r, &mut buf, Some(fd), Duration::from_secs(5)),
        )
        .await
        .expect("the payload completes without more data behind it")
        .unwrap();
        assert!(buf == payload);
        let mut end = [0u8; 3];
        tokio::time::timeout(Duration::from_secs(5), r.read_exact(&mut end))
            .await
            .expect("a small frame after the block is read")
            .unwrap();
        assert_eq!(&end, b"end");
        drop(sender.await.unwrap());
    }

    /// The mark a payload read sets stays under what the socket's receive buffer holds, so the
    /// kernel neither grows the buffer nor clamps a young connection's window with it; the
    /// uncapped mark, set on a second fresh socket, does grow it (the hazard the cap avoids).
    #[tokio::test]
    async fn a_payload_low_water_mark_leaves_the_receive_buffer_alone() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let _a = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (capped, _) = listener.accept().await.unwrap();
        let _b = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (uncapped, _) = listener.accept().await.unwrap();
        let buffer = |fd| crate::sys::recv_buffer(fd).unwrap();
        let before = buffer(capped.as_raw_fd());
        assert!(before > 0);
        let cap = lowat_cap(capped.as_raw_fd());
        assert!(cap > 1 && cap <= LOWAT_CHUNK, "cap {cap}");
        crate::sys::set_rcvlowat(capped.as_raw_fd(), cap).unwrap();
        assert_eq!(
            buffer(capped.as_raw_fd()),
            before,
            "the capped mark moved the buffer"
        );
        let before = buffer(uncapped.as_raw_fd());
        crate::sys::set_rcvlowat(uncapped.as_raw_fd(), before).unwrap();
        assert!(
            buffer(uncapped.as_raw_fd()) > before,
            "a mark the buffer cannot hold grows it (so the cap is what keeps it)"
        );
    }

    #[test]
    fn busy_streams_are_acknowledged() {
        // Regression: with input always buffered, blocks must still be acknowledged.
        assert!(ack_due(true, 1, false));
        assert!(!ack_due(false, 3, false));
        assert!(ack_due(false, 16, false));
        assert!(ack_due(false, 1, true));
    }
}
