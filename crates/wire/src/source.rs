//! The sending side of a session, as a state machine: which frame each stream sends next, what
//! each stream has outstanding, what must be read and sent again, and when files are finished.
//!
//! The driver owns the files and the sockets. It *claims* files to read ([`Source::claim`]),
//! pushes the blocks it read ([`Source::push_block`]) and the whole-file checksums when a file
//! is read ([`Source::read_done`]). Whenever a stream can take more bytes it asks
//! [`Source::poll_transmit`], so a fast stream simply takes more blocks than a slow one and no
//! stream ever waits for another. The sink's answers on each stream go to [`Source::on_frame`].
//!
//! Blocks are not kept after they are sent: a block lost with a stream or refused by the sink is
//! named by [`Source::poll_reread`], read again by the driver and queued in front
//! ([`Source::push_resend`]). Frames are queued in one FIFO; a file's `FileBegin` enters it before
//! any of its blocks, so a sink that waits for a `FileBegin` always waits for a frame that was
//! sent earlier, which keeps the streams free of circular waits.

use crate::checksum::Digest;
use crate::data::{
    BlockHeader, DataFrame, EntryKind, FileAbort, FileBegin, FileEnd, FileId, Nack, Timestamp,
};
use crate::error::{ErrorInfo, ErrorKind};
use crate::ranges::RangeSet;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// What the source is told about a file to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileSpec {
    pub kind: EntryKind,
    /// Relative destination path.
    pub path: String,
    /// Bytes to send (the length of the range for partial transfers).
    pub size: u64,
    pub mode: u32,
    pub mtime: Timestamp,
}

/// Tuning of the source state machine.
#[derive(Clone, Debug)]
pub struct SourceConfig {
    /// Ask the sink what it already has before sending each file.
    pub resume: bool,
    /// Attempts per file (a failed verification restarts the file from scratch).
    pub file_attempts: u32,
    /// A stream with frames outstanding and no acknowledgement for this long, while another
    /// stream makes progress, is declared lost and its frames go to the other streams.
    pub stream_timeout: Duration,
    /// Files whose `FileBegin` may wait for the sink's `Have` at once (resume only).
    pub resume_lookahead: usize,
    /// Block size in bytes.
    pub block_size: u32,
    /// End game: once nothing is left to send, an idle stream sends again blocks that another
    /// stream has held unacknowledged for this long (or 4x the usual ack latency, if longer),
    /// so one slow or stuck stream does not hold back the end of a transfer.
    pub hedge_after: Duration,
    /// The path is shared with other sessions of the same job: hedge only stuck streams
    /// (see `SessionOptions::shared_path`).
    pub shared_path: bool,
}

impl Default for SourceConfig {
    fn default() -> Self {
        Self {
            resume: false,
            file_attempts: 3,
            stream_timeout: Duration::from_secs(20),
            resume_lookahead: 64,
            block_size: 1 << 20,
            hedge_after: Duration::from_secs(1),
            shared_path: false,
        }
    }
}

/// A piece of a file to read: `send` is false for ranges the sink already has, which are read
/// only to compute the whole-file checksum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub offset: u64,
    pub len: u64,
    pub send: bool,
}

/// A file handed to a reader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadJob {
    pub file: FileId,
    pub attempt: u32,
    pub spec: FileSpec,
    /// Covers `0..size` in order.
    pub segments: Vec<Segment>,
}

/// A block to read again and resend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockDesc {
    pub file: FileId,
    pub attempt: u32,
    pub offset: u64,
    pub len: u32,
}

/// The next thing a stream should write.
#[derive(Debug)]
pub enum Transmit<P> {
    Frame(DataFrame),
    Block {
        header: BlockHeader,
        len: u32,
        payload: P,
    },
}

/// Things the driver reports upward.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceEvent {
    FileDone {
        file: FileId,
        path: String,
        size: u64,
        digests: Vec<Digest>,
        /// The destination already had it; nothing was sent.
        skipped: bool,
    },
    FileFailed {
        file: FileId,
        path: String,
        error: ErrorInfo,
    },
    /// Verification failed and the file is being sent again from scratch.
    FileRestarted {
        file: FileId,
        attempt: u32,
        reason: String,
    },
    /// Close this stream: it was declared lost.
    StreamLost { stream: u32 },
    /// The sink aborted the session.
    Aborted(ErrorInfo),
}

/// Keys of hedged control frames in `Source::hedged` (blocks use their offset).
const HEDGED_BEGIN: u64 = u64::MAX - 1;
const HEDGED_END: u64 = u64::MAX;

/// A peer broke the protocol; the session ends.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("protocol violation by the destination: {0}")]
pub struct ProtocolViolation(pub String);

impl FileState {
    /// Not all of the file's blocks have been queued yet.
    fn is_unread(self) -> bool {
        matches!(
            self,
            FileState::Queued | FileState::AwaitingHave | FileState::Claimable | FileState::Reading
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FileState {
    /// Not yet announced.
    Queued,
    /// `FileBegin` (resume) queued; waiting for `Have`.
    AwaitingHave,
    /// Ready for a reader.
    Claimable,
    /// A reader has it.
    Reading,
    /// Everything sent; waiting for the sink's verdict.
    AwaitingAck,
    Done,
    Failed,
}

struct SrcFile {
    spec: FileSpec,
    attempt: u32,
    /// The current attempt's `FileBegin` has been given to a stream.
    announced: bool,
    state: FileState,
    resume: bool,
    have: RangeSet,
}

enum Item<P> {
    Begin(FileId, u32),
    Block(BlockDesc, u32, P),
    End(FileId, u32, Vec<Digest>),
    Abort(FileId, u32, ErrorInfo),
}

#[derive(Clone, Debug)]
enum Sent {
    Begin(FileId, u32),
    Block(BlockDesc, Instant),
    End(FileId, u32, Vec<Digest>),
    Other,
}

struct StreamState {
    alive: bool,
    sent: VecDeque<Sent>,
    frames_sent: u64,
    frames_acked: u64,
    last_progress: Instant,
    /// Payload bytes sent on this stream and not yet acknowledged.
    outstanding: u64,
    /// Acknowledged payload bytes per second while the stream had data outstanding (EWMA).
    rate: f64,
    /// Start of the current rate sample: time and bytes acknowledged so far.
    rate_mark: (Instant, u64),
    acked_bytes: u64,
}

/// Counters of a source session.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SourceStats {
    pub bytes_sent: u64,
    pub bytes_acked: u64,
    pub bytes_skipped: u64,
    pub blocks_resent: u64,
    /// Blocks sent again by idle streams at the end of a transfer (see `hedge_after`).
    pub blocks_hedged: u64,
    pub streams_lost: u32,
    pub files_done: u64,
    pub files_failed: u64,
}

/// The sending side of one session.
pub struct Source<P> {
    cfg: SourceConfig,
    files: Vec<SrcFile>,
    /// Next file (index) not yet announced.
    next_new: usize,
    claimable: VecDeque<FileId>,
    awaiting_have: usize,
    adding_done: bool,
    queue: VecDeque<Item<P>>,
    rereads: VecDeque<BlockDesc>,
    streams: Vec<StreamState>,
    events: VecDeque<SourceEvent>,
    unfinished: usize,
    /// Files not yet read to the end (their blocks are not all queued yet).
    unread: usize,
    stats: SourceStats,
    /// Blocks sent twice by the end game, and whether one copy was acknowledged already.
    hedged: std::collections::HashMap<(FileId, u32, u64), bool>,
    /// Smoothed time from sending a block to its acknowledgement.
    ack_latency: Option<Duration>,
    /// Highest delivery rate of the whole session (bytes/s over 200 ms or more).
    peak_rate: f64,
    /// Start of the current session-wide rate sample: time and bytes acknowledged.
    session_mark: (Option<Instant>, u64),
}

impl<P> Source<P> {
    pub fn new(cfg: SourceConfig) -> Self {
        Self {
            cfg,
            files: Vec::new(),
            next_new: 0,
            claimable: VecDeque::new(),
            awaiting_have: 0,
            adding_done: false,
            queue: VecDeque::new(),
            rereads: VecDeque::new(),
            streams: Vec::new(),
            events: VecDeque::new(),
            unfinished: 0,
            unread: 0,
            stats: SourceStats::default(),
            hedged: std::collections::HashMap::new(),
            ack_latency: None,
            peak_rate: 0.0,
            session_mark: (None, 0),
        }
    }

    pub fn config(&self) -> &SourceConfig {
        &self.cfg
    }

    pub fn stats(&self) -> &SourceStats {
        &self.stats
    }

    /// Adds a file to send. Files may be added while others are in flight.
    pub fn add_file(&mut self, spec: FileSpec) -> FileId {
        let id = self.files.len() as FileId;
        self.files.push(SrcFile {
            spec,
            attempt: 0,
            announced: false,
            state: FileState::Queued,
            resume: self.cfg.resume,
            have: RangeSet::new(),
        });
        self.unfinished += 1;
        self.unread += 1;
        self.announce();
        id
    }

    /// No more files will be added.
    pub fn finish_adding(&mut self) {
        self.adding_done = true;
    }

    pub fn file_count(&self) -> usize {
        self.files.len()
    }

    pub fn file_spec(&self, file: FileId) -> Option<&FileSpec> {
        self.files.get(file as usize).map(|f| &f.spec)
    }

    /// Registers data stream `stream` (streams may join at any time).
    pub fn add_stream(&mut self, stream: u32, now: Instant) {
        let idx = stream as usize;
        while self.streams.len() <= idx {
            self.streams.push(StreamState {
                alive: false,
                sent: VecDeque::new(),
                frames_sent: 0,
                frames_acked: 0,
                last_progress: now,
                outstanding: 0,
                rate: 0.0,
                rate_mark: (now, 0),
                acked_bytes: 0,
            });
        }
        let s = &mut self.streams[idx];
        s.alive = true;
        s.last_progress = now;
    }

    pub fn live_streams(&self) -> usize {
        self.streams.iter().filter(|s| s.alive).count()
    }

    /// One line per stream for diagnostics: frames sent/acked, outstanding bytes, rate.
    pub fn describe_streams(&self, now: Instant) -> String {
        self.streams
            .iter()
            .enumerate()
            .map(|(i, s)| {
                format!(
                    "#{i}{} sent {} acked {} out {} KiB rate {:.1} MB/s quiet {} ms",
                    if s.alive { "" } else { " (lost)" },
                    s.frames_sent,
                    s.frames_acked,
                    s.outstanding >> 10,
                    s.rate / 1e6,
                    now.saturating_duration_since(s.last_progress).as_millis()
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// Queue lengths and counters for diagnostics.
    pub fn describe(&self) -> String {
        format!(
            "queue {} rereads {} unread {} unfinished {} claimable {} awaiting_have {}",
            self.queue.len(),
            self.rereads.len(),
            self.unread,
            self.unfinished,
            self.claimable.len(),
            self.awaiting_have
        )
    }

    /// Announces resume files up to the look-ahead (non-resume files are announced when
    /// claimed, so their `FileBegin` directly precedes their blocks).
    fn announce(&mut self) {
        while self.next_new < self.files.len() {
            let id = self.next_new as FileId;
            let f = &mut self.files[self.next_new];
            if f.resume && f.spec.kind == EntryKind::File {
                if self.awaiting_have >= self.cfg.resume_lookahead {
                    return;
                }
                f.state = FileState::AwaitingHave;
                self.awaiting_have += 1;
                self.queue.push_back(Item::Begin(id, f.attempt));
            } else {
                f.state = FileState::Claimable;
                self.claimable.push_back(id);
            }
            self.next_new += 1;
        }
    }

    /// Hands the next file to a reader, queueing its `FileBegin` unless already sent.
    pub fn claim(&mut self) -> Option<ReadJob> {
        while let Some(id) = self.claimable.pop_front() {
            let f = &mut self.files[id as usize];
            if f.state != FileState::Claimable {
                continue;
            }
            f.state = FileState::Reading;
            if !f.resume || f.spec.kind == EntryKind::Dir {
                self.queue.push_back(Item::Begin(id, f.attempt));
            }
            let mut segments = Vec::new();
            let mut pos = 0;
            for r in f
                .have
                .iter()
                .chain(std::iter::once(f.spec.size..f.spec.size))
            {
                if r.start > pos {
                    segments.push(Segment {
                        offset: pos,
                        len: r.start - pos,
                        send: true,
                    });
                }
                if r.end > r.start {
                    segments.push(Segment {
                        offset: r.start,
                        len: r.end - r.start,
                        send: false,
                    });
                }
                pos = pos.max(r.end);
            }
            self.stats.bytes_skipped += f.have.len_bytes();
            return Some(ReadJob {
                file: id,
                attempt: f.attempt,
                spec: f.spec.clone(),
                segments,
            });
        }
        None
    }

    fn is_current(&self, file: FileId, attempt: u32) -> bool {
        self.files.get(file as usize).is_some_and(|f| {
            f.attempt == attempt && !matches!(f.state, FileState::Done | FileState::Failed)
        })
    }

    /// Queues a block the reader produced (`offset` is within the destination file).
    pub fn push_block(
        &mut self,
        file: FileId,
        attempt: u32,
        offset: u64,
        len: u32,
        crc: u32,
        payload: P,
    ) {
        if self.is_current(file, attempt) {
            self.queue.push_back(Item::Block(
                BlockDesc {
                    file,
                    attempt,
                    offset,
                    len,
                },
                crc,
                payload,
            ));
        }
    }

    /// Queues a block read again for a resend, ahead of everything else.
    pub fn push_resend(&mut self, desc: BlockDesc, crc: u32, payload: P) {
        if self.is_current(desc.file, desc.attempt) {
            self.stats.blocks_resent += 1;
            self.queue.push_front(Item::Block(desc, crc, payload));
        }
    }

    /// The reader finished a file; `digests` are of the whole destination content.
    pub fn read_done(&mut self, file: FileId, attempt: u32, digests: Vec<Digest>) {
        if self.is_current(file, attempt) {
            self.files[file as usize].state = FileState::AwaitingAck;
            self.unread -= 1;
            self.queue.push_back(Item::End(file, attempt, digests));
        }
    }

    /// The reader could not read a file: the file fails and the sink drops its copy.
    pub fn read_failed(&mut self, file: FileId, attempt: u32, error: ErrorInfo) {
        if !self.is_current(file, attempt) {
            return;
        }
        if self.files[file as usize].announced {
            self.queue
                .push_back(Item::Abort(file, attempt, error.clone()));
        }
        self.fail_file(file, error);
    }

    /// A block that must be read again (lost with a stream or refused by the sink).
    pub fn poll_reread(&mut self) -> Option<BlockDesc> {
        while let Some(d) = self.rereads.pop_front() {
            if self.is_current(d.file, d.attempt) {
                return Some(d);
            }
        }
        None
    }

    /// Whether rereads are waiting (the driver may want to wake a reader).
    pub fn has_rereads(&self) -> bool {
        !self.rereads.is_empty()
    }

    /// Whether an idle reader has anything to do: a file to claim, a block to read again, or
    /// the session is over (readers exit). The driver wakes its readers only then.
    pub fn has_reader_work(&self) -> bool {
        !self.rereads.is_empty() || !self.claimable.is_empty() || self.is_finished()
    }

    /// Frames queued and not yet given to a stream.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// The next frame for `stream` to write, if any.
    pub fn poll_transmit(&mut self, stream: u32, now: Instant) -> Option<Transmit<P>> {
        let idx = stream as usize;
        if !self.streams.get(idx).is_some_and(|s| s.alive) {
            return None;
        }
        loop {
            let Some(item) = self.queue.pop_front() else {
                if !self.end_game(stream, now) {
                    return None;
                }
                continue;
            };
            let (sent, tx) = match item {
                Item::Begin(id, attempt) => {
                    if !self.is_current(id, attempt) {
                        continue;
                    }
                    let f = &mut self.files[id as usize];
                    f.announced = true;
                    let begin = FileBegin {
                        file: id,
                        attempt,
                        kind: f.spec.kind,
                        path: f.spec.path.clone(),
                        size: f.spec.size,
                        mode: f.spec.mode,
                        mtime: f.spec.mtime,
                        resume: f.resume && f.spec.kind == EntryKind::File,
                    };
                    (
                        Sent::Begin(id, attempt),
                        Transmit::Frame(DataFrame::Begin(begin)),
                    )
                }
                Item::Block(desc, crc, payload) => {
                    if !self.is_current(desc.file, desc.attempt) {
                        continue;
                    }
                    self.stats.bytes_sent += desc.len as u64;
                    self.streams[idx].outstanding += desc.len as u64;
                    let header = BlockHeader {
                        file: desc.file,
                        offset: desc.offset,
                        crc,
                    };
                    (
                        Sent::Block(desc, now),
                        Transmit::Block {
                            header,
                            len: desc.len,
                            payload,
                        },
                    )
                }
                Item::End(id, attempt, digests) => {
                    if !self.is_current(id, attempt) {
                        continue;
                    }
                    let end = FileEnd {
                        file: id,
                        attempt,
                        digests: digests.clone(),
                    };
                    (
                        Sent::End(id, attempt, digests),
                        Transmit::Frame(DataFrame::End(end)),
                    )
                }
                Item::Abort(file, attempt, error) => (
                    Sent::Other,
                    Transmit::Frame(DataFrame::FileAbort(FileAbort {
                        file,
                        attempt,
                        error,
                    })),
                ),
            };
            let s = &mut self.streams[idx];
            if s.sent.is_empty() {
                // An idle stream's silence is not a stall: its clock starts with this frame.
                s.last_progress = now;
            }
            s.sent.push_back(sent);
            s.frames_sent += 1;
            return Some(tx);
        }
    }

    /// Handles a frame the sink sent on `stream`.
    pub fn on_frame(
        &mut self,
        stream: u32,
        frame: DataFrame,
        now: Instant,
    ) -> Result<(), ProtocolViolation> {
        match frame {
            DataFrame::Ack(n) => self.on_ack(stream, n, now),
            DataFrame::Nack(Nack {
                file,
                attempt,
                offset,
                len,
            }) => {
                let Ok(len32) = u32::try_from(len) else {
                    return Err(ProtocolViolation(format!("resend request of {len} bytes")));
                };
                if self.is_current(file, attempt) {
                    self.rereads.push_back(BlockDesc {
                        file,
                        attempt,
                        offset,
                        len: len32,
                    });
                }
                Ok(())
            }
            DataFrame::Have(h) => {
                let Some(f) = self.files.get_mut(h.file as usize) else {
                    return Err(ProtocolViolation(format!(
                        "resume ranges for unknown file {}",
                        h.file
                    )));
                };
                if f.attempt != h.attempt || f.state != FileState::AwaitingHave {
                    return Ok(());
                }
                if h.complete {
                    f.state = FileState::Done;
                    self.awaiting_have -= 1;
                    self.unfinished -= 1;
                    self.unread -= 1;
                    self.stats.files_done += 1;
                    self.stats.bytes_skipped += f.spec.size;
                    self.events.push_back(SourceEvent::FileDone {
                        file: h.file,
                        path: f.spec.path.clone(),
                        size: f.spec.size,
                        digests: Vec::new(),
                        skipped: true,
                    });
                    self.announce();
                    return Ok(());
                }
                let have = RangeSet::from_pairs(&h.ranges)
                    .ok_or_else(|| ProtocolViolation("invalid resume ranges".into()))?;
                if have.pairs().last().is_some_and(|&(_, e)| e > f.spec.size) {
                    return Err(ProtocolViolation(format!(
                        "resume ranges beyond the end of {}",
                        f.spec.path
                    )));
                }
                f.have = have;
                f.state = FileState::Claimable;
                self.awaiting_have -= 1;
                self.claimable.push_back(h.file);
                self.announce();
                Ok(())
            }
            DataFrame::FileAck(ack) => {
                if !self.is_current(ack.file, ack.attempt) {
                    return Ok(());
                }
                match ack.result {
                    Ok(digests) => {
                        let f = &mut self.files[ack.file as usize];
                        f.state = FileState::Done;
                        self.unfinished -= 1;
                        self.stats.files_done += 1;
                        self.events.push_back(SourceEvent::FileDone {
                            file: ack.file,
                            path: f.spec.path.clone(),
                            size: f.spec.size,
                            digests,
                            skipped: false,
                        });
                    }
                    Err(e) => {
                        let f = &mut self.files[ack.file as usize];
                        if e.retryable && f.attempt + 1 < self.cfg.file_attempts {
                            self.restart_file(ack.file, e.message);
                        } else {
                            self.fail_file(ack.file, e);
                        }
                    }
                }
                Ok(())
            }
            DataFrame::Abort(e) => {
                self.events.push_back(SourceEvent::Aborted(e));
                Ok(())
            }
            other => Err(ProtocolViolation(format!(
                "the destination sent a source-only frame {other:?}"
            ))),
        }
    }

    fn on_ack(&mut self, stream: u32, n: u64, now: Instant) -> Result<(), ProtocolViolation> {
        let Some(s) = self.streams.get_mut(stream as usize) else {
            return Err(ProtocolViolation(format!("ack on unknown stream {stream}")));
        };
        if n > s.frames_sent || n < s.frames_acked {
            return Err(ProtocolViolation(format!(
                "stream {stream} acknowledged {n} frames, {} sent and {} acknowledged before",
                s.frames_sent, s.frames_acked
            )));
        }
        let newly = n - s.frames_acked;
        if newly > 0 {
            s.last_progress = now;
        }
        let mut latencies = Vec::new();
        let had_outstanding = s.outstanding > 0;
        for _ in 0..newly {
            if let Some(Sent::Block(d, sent_at)) = s.sent.pop_front() {
                latencies.push(now.saturating_duration_since(sent_at));
                s.outstanding = s.outstanding.saturating_sub(d.len as u64);
                s.acked_bytes += d.len as u64;
                match self.hedged.get_mut(&(d.file, d.attempt, d.offset)) {
                    Some(true) => continue, // the other copy was counted
                    Some(acked) => *acked = true,
                    None => {}
                }
                self.stats.bytes_acked += d.len as u64;
            }
        }
        // Rate samples only cover time when the stream had something to deliver.
        let dt = now.saturating_duration_since(s.rate_mark.0).as_secs_f64();
        if !had_outstanding {
            s.rate_mark = (now, s.acked_bytes);
        } else if dt >= 0.1 {
            let sample = (s.acked_bytes - s.rate_mark.1) as f64 / dt;
            s.rate = if s.rate == 0.0 {
                sample
            } else {
                0.5 * s.rate + 0.5 * sample
            };
            s.rate_mark = (now, s.acked_bytes);
        }
        s.frames_acked = n;
        match self.session_mark {
            (None, _) => self.session_mark = (Some(now), self.stats.bytes_acked),
            (Some(t), b) => {
                let dt = now.saturating_duration_since(t).as_secs_f64();
                if dt >= 0.2 {
                    let rate = (self.stats.bytes_acked - b) as f64 / dt;
                    self.peak_rate = self.peak_rate.max(rate);
                    self.session_mark = (Some(now), self.stats.bytes_acked);
                }
            }
        }
        for l in latencies {
            self.ack_latency = Some(match self.ack_latency {
                None => l,
                Some(avg) => (avg * 7 + l) / 8,
            });
        }
        Ok(())
    }

    /// With nothing left to send, `stream` is idle: it takes over the oldest frame another
    /// stream has held unacknowledged for too long. Blocks are read again (through
    /// [`poll_reread`](Self::poll_reread)); control frames are queued again directly. The sink
    /// drops whichever copy arrives second.
    /// Returns true when a frame was queued for immediate sending.
    fn end_game(&mut self, stream: u32, now: Instant) -> bool {
        if !self.in_end_game() {
            return false;
        }
        // Hedge from a stream that is stuck (no acknowledgement for a while), or, when the
        // session's delivery has fallen below half of its peak (the path has room again), from
        // the stream that will take longest to drain. Streams merely sharing a busy path are
        // left alone: duplicates would only take capacity from them.
        let stall = self.hedge_stall();
        let active_rate: f64 = self
            .streams
            .iter()
            .filter(|s| s.alive && s.outstanding > 0)
            .map(|s| s.rate)
            .sum();
        let room =
            !self.cfg.shared_path && self.peak_rate > 0.0 && active_rate < 0.5 * self.peak_rate;
        // A stream is slow only against its fair share of the session's peak: when the path is
        // shared with other sessions (replication runs many at once), every stream of this
        // session slows down together, and copies of their blocks would only take capacity
        // from the others on the same link.
        let alive = self.streams.iter().filter(|s| s.alive).count().max(1) as f64;
        let fair = self.peak_rate / alive;
        let mut victim: Option<(f64, usize)> = None;
        for (i, s) in self.streams.iter().enumerate() {
            if i as u32 == stream || !s.alive || s.sent.is_empty() {
                continue;
            }
            let stuck = now.saturating_duration_since(s.last_progress) >= stall;
            let drain = if s.rate > 0.0 {
                s.outstanding as f64 / s.rate
            } else {
                f64::INFINITY
            };
            let slow = room && drain > self.cfg.hedge_after.as_secs_f64() && s.rate < 0.25 * fair;
            if !(stuck || slow) {
                continue;
            }
            let score = if stuck { f64::INFINITY } else { drain };
            if victim.is_none_or(|(v, _)| score > v) {
                victim = Some((score, i));
            }
        }
        let best = victim.and_then(|(_, i)| self.first_unhedged(&self.streams[i]).cloned());
        match best {
            Some(Sent::Block(d, _)) => {
                self.hedged.insert((d.file, d.attempt, d.offset), false);
                self.stats.blocks_hedged += 1;
                self.rereads.push_back(d);
                false
            }
            Some(Sent::Begin(f, a)) => {
                self.hedged.insert((f, a, HEDGED_BEGIN), false);
                self.queue.push_back(Item::Begin(f, a));
                true
            }
            Some(Sent::End(f, a, digests)) => {
                self.hedged.insert((f, a, HEDGED_END), false);
                self.queue.push_back(Item::End(f, a, digests));
                true
            }
            _ => false,
        }
    }

    /// The end game: every file read, nothing queued. (Mid-transfer the queue is often empty
    /// for a moment; hedging then would only send duplicates.)
    fn in_end_game(&self) -> bool {
        self.adding_done && self.unread == 0 && self.rereads.is_empty() && self.queue.is_empty()
    }

    /// How long a stream may hold frames unacknowledged before it counts as stuck.
    fn hedge_stall(&self) -> Duration {
        self.cfg
            .hedge_after
            .max(self.ack_latency.map(|l| l * 4).unwrap_or_default())
    }

    /// The oldest frame of `s` that has not been sent again yet and still matters.
    fn first_unhedged<'a>(&self, s: &'a StreamState) -> Option<&'a Sent> {
        s.sent.iter().find(|sent| {
            let key = match sent {
                Sent::Block(d, _) => (d.file, d.attempt, d.offset),
                Sent::Begin(f, a) => (*f, *a, HEDGED_BEGIN),
                Sent::End(f, a, _) => (*f, *a, HEDGED_END),
                Sent::Other => return false,
            };
            !self.hedged.contains_key(&key) && self.is_current(key.0, key.1)
        })
    }

    fn restart_file(&mut self, file: FileId, reason: String) {
        let f = &mut self.files[file as usize];
        if !f.state.is_unread() {
            self.unread += 1;
        }
        f.attempt += 1;
        f.announced = false;
        f.resume = false;
        f.have = RangeSet::new();
        f.state = FileState::Claimable;
        let attempt = f.attempt;
        self.claimable.push_front(file);
        self.events.push_back(SourceEvent::FileRestarted {
            file,
            attempt,
            reason,
        });
    }

    fn fail_file(&mut self, file: FileId, error: ErrorInfo) {
        let f = &mut self.files[file as usize];
        if f.state == FileState::AwaitingHave {
            self.awaiting_have -= 1;
        }
        if f.state.is_unread() {
            self.unread -= 1;
        }
        f.state = FileState::Failed;
        self.unfinished -= 1;
        self.stats.files_failed += 1;
        self.events.push_back(SourceEvent::FileFailed {
            file,
            path: f.spec.path.clone(),
            error,
        });
        self.announce();
    }

    /// The connection of `stream` is gone: everything it had outstanding is sent again on the
    /// other streams.
    pub fn on_stream_lost(&mut self, stream: u32) {
        let Some(s) = self.streams.get_mut(stream as usize) else {
            return;
        };
        if !s.alive {
            return;
        }
        s.alive = false;
        s.outstanding = 0;
        self.stats.streams_lost += 1;
        let lost: Vec<Sent> = s.sent.drain(..).collect();
        // Control frames go back to the front in their original order; blocks are reread.
        for item in lost.into_iter().rev() {
            match item {
                Sent::Begin(id, attempt) => self.queue.push_front(Item::Begin(id, attempt)),
                Sent::End(id, attempt, digests) => {
                    self.queue.push_front(Item::End(id, attempt, digests))
                }
                Sent::Block(d, _) => {
                    self.stats.bytes_sent -= d.len as u64;
                    self.rereads.push_front(d)
                }
                Sent::Other => {}
            }
        }
    }

    /// When the driver should next call [`handle_timeout`](Self::handle_timeout) and let its
    /// idle streams poll again: the first moment at which time alone changes a decision. That
    /// is a silent stream becoming lost while another progresses, or, in the end game, a stuck
    /// stream's frames becoming due to be sent again by an idle one. `None` when only an event
    /// (an acknowledgement, a block read, a stream added or lost) can change anything.
    ///
    /// After `handle_timeout(now)` the loss deadlines all lie after `now`. A hedge deadline
    /// stays in the past until the idle streams have taken the stuck frames over, one per
    /// [`poll_transmit`](Self::poll_transmit): a driver coalesces timers, it does not spin.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let timeout = self.cfg.stream_timeout;
        let alive = || self.streams.iter().filter(|s| s.alive);
        let freshest = alive().map(|s| s.last_progress).max()?;
        // A silent stream is lost only while another progressed more recently (see
        // handle_timeout): without such progress, time alone declares nothing.
        let lost = alive()
            .filter(|s| !s.sent.is_empty() && freshest > s.last_progress + timeout / 2)
            .map(|s| s.last_progress + timeout)
            .min();
        // Only another stream can take a stuck stream's frames over.
        let hedge = if self.in_end_game() && alive().count() > 1 {
            let stall = self.hedge_stall();
            alive()
                .filter(|s| self.first_unhedged(s).is_some())
                .map(|s| s.last_progress + stall)
                .min()
        } else {
            None
        };
        lost.into_iter().chain(hedge).min()
    }

    /// Declares lost the streams that have had frames outstanding without acknowledgement for
    /// the stream timeout while another stream progressed more recently. If no stream
    /// progresses, none is declared lost: that is a stall of the whole session, for the caller.
    pub fn handle_timeout(&mut self, now: Instant) {
        let timeout = self.cfg.stream_timeout;
        let freshest = self
            .streams
            .iter()
            .filter(|s| s.alive)
            .map(|s| s.last_progress)
            .max();
        let Some(freshest) = freshest else { return };
        let stale: Vec<u32> = self
            .streams
            .iter()
            .enumerate()
            .filter(|(_, s)| {
                s.alive
                    && !s.sent.is_empty()
                    && now.saturating_duration_since(s.last_progress) >= timeout
                    && freshest > s.last_progress + timeout / 2
            })
            .map(|(i, _)| i as u32)
            .collect();
        for stream in stale {
            self.on_stream_lost(stream);
            self.events.push_back(SourceEvent::StreamLost { stream });
        }
    }

    pub fn poll_event(&mut self) -> Option<SourceEvent> {
        self.events.pop_front()
    }

    /// Every file added is done or failed and no more will be added.
    pub fn is_finished(&self) -> bool {
        self.adding_done && self.unfinished == 0
    }

    /// Files neither done nor failed.
    pub fn unfinished(&self) -> usize {
        self.unfinished
    }

    /// An error to report when the source gives up with files unfinished.
    pub fn unfinished_error(&self) -> ErrorInfo {
        ErrorInfo::new(
            ErrorKind::Connect,
            format!(
                "{} files were not finished when the session ended",
                self.unfinished
            ),
        )
    }
}

#[cfg(test)]
mod tests;
