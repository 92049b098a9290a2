//! The receiving side of a session, as a state machine: which blocks to write, which to refuse
//! and have sent again, when a file is complete, verified and may be committed, and what to
//! answer the source.
//!
//! The driver reads frames from the streams, checks each block's CRC32C and reports the block
//! with [`Sink::on_block`]; when the verdict is [`BlockVerdict::Write`] the same thread writes it
//! at its offset and reports [`Sink::on_written`]. Everything else the driver must do (open a
//! temporary file, checkpoint, commit, send a frame on a stream) comes out of
//! [`Sink::poll_action`]. Blocks may arrive before their file's `FileBegin` (streams race): they
//! are kept in a bounded stash and replayed, or refused with a resend request when it is full.

use crate::checksum::{Digest, digests_match};
use crate::data::{
    BlockHeader, DataFrame, EntryKind, FileAbort, FileAck, FileBegin, FileEnd, FileId, Have, Nack,
};
use crate::error::{ErrorInfo, ErrorKind};
use crate::ranges::RangeSet;
use crate::source::ProtocolViolation;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// Tuning of the sink state machine.
#[derive(Clone, Debug)]
pub struct SinkConfig {
    /// Bytes of early blocks kept while their `FileBegin` is still on its way.
    pub stash_budget: u64,
    /// Checkpoint (sync + write the restart ledger) after this many new bytes...
    pub checkpoint_bytes: u64,
    /// ...or after this long, whichever comes first.
    pub checkpoint_interval: Duration,
}

impl Default for SinkConfig {
    fn default() -> Self {
        Self {
            stash_budget: 32 << 20,
            checkpoint_bytes: 256 << 20,
            checkpoint_interval: Duration::from_secs(5),
        }
    }
}

/// What to do with a block.
#[derive(Debug)]
pub enum BlockVerdict<P> {
    /// Write `payload` at `offset` of the file, then call [`Sink::on_written`]. `new_ranges`
    /// are the parts not written before (all of it, unless a resend overlaps).
    Write {
        file: FileId,
        attempt: u32,
        offset: u64,
        payload: P,
        new_ranges: RangeSet,
    },
    /// Nothing to do (duplicate, stale, stashed or refused; refusals queue a resend request).
    Drop,
}

/// Work for the driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SinkAction {
    /// Create (or, for `begin.resume`, reopen) the temporary file; answer with
    /// [`Sink::on_opened`], giving the ranges already present when resuming.
    Open {
        file: FileId,
        attempt: u32,
        begin: FileBegin,
    },
    /// Create the directory; answer with [`Sink::on_committed`].
    MakeDir {
        file: FileId,
        attempt: u32,
        begin: FileBegin,
    },
    /// Write this frame on this stream (the reverse direction of a data connection).
    Send { stream: u32, frame: DataFrame },
    /// Make `ranges` durable and record them in the restart ledger; answer with
    /// [`Sink::on_checkpointed`].
    Checkpoint {
        file: FileId,
        attempt: u32,
        ranges: RangeSet,
    },
    /// Every byte is written but the digest still needs bytes read back from disk.
    DigestCatchUp { file: FileId, attempt: u32 },
    /// Verified: sync, set mode and mtime, rename into place; answer with [`Sink::on_committed`].
    Commit {
        file: FileId,
        attempt: u32,
        begin: FileBegin,
        digests: Vec<Digest>,
    },
    /// Drop the temporary file (unless `keep_partial`, which keeps it and its ledger for a
    /// later resume) and forget the file's resources.
    Discard {
        file: FileId,
        attempt: u32,
        keep_partial: bool,
    },
    /// Report upward.
    Event(SinkEvent),
}

/// Results to report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SinkEvent {
    FileDone {
        file: FileId,
        path: String,
        size: u64,
        digests: Vec<Digest>,
        /// The destination already had it; nothing was received.
        skipped: bool,
    },
    FileFailed {
        file: FileId,
        path: String,
        error: ErrorInfo,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Opening,
    Receiving,
    Verifying,
    Committing,
    Done,
    Failed,
}

struct SinkFile {
    begin: FileBegin,
    state: State,
    expected: RangeSet,
    received: RangeSet,
    written: RangeSet,
    writes_in_flight: u32,
    source_digests: Option<Vec<Digest>>,
    computed: Option<Vec<Digest>>,
    reply_stream: u32,
    unsynced_bytes: u64,
    last_checkpoint: Instant,
    checkpoint_in_flight: bool,
}

struct Stashed<P> {
    stream: u32,
    header: BlockHeader,
    len: u32,
    crc_ok: bool,
    payload: P,
}

/// Counters of a sink session.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SinkStats {
    pub bytes_written: u64,
    pub bytes_resumed: u64,
    pub crc_failures: u64,
    pub duplicates: u64,
    pub stash_refusals: u64,
    pub files_done: u64,
    pub files_failed: u64,
}

/// The receiving side of one session.
pub struct Sink<P> {
    cfg: SinkConfig,
    files: HashMap<FileId, SinkFile>,
    stash: HashMap<FileId, Vec<Stashed<P>>>,
    stash_bytes: u64,
    /// `FileEnd`/`FileAbort` frames that overtook their file's `FileBegin` on another stream.
    early_frames: HashMap<FileId, Vec<(u32, DataFrame)>>,
    actions: std::collections::VecDeque<SinkAction>,
    live_streams: HashSet<u32>,
    stats: SinkStats,
}

impl<P> Sink<P> {
    pub fn new(cfg: SinkConfig) -> Self {
        Self {
            cfg,
            files: HashMap::new(),
            stash: HashMap::new(),
            stash_bytes: 0,
            early_frames: HashMap::new(),
            actions: Default::default(),
            live_streams: HashSet::new(),
            stats: SinkStats::default(),
        }
    }

    pub fn stats(&self) -> &SinkStats {
        &self.stats
    }

    /// Internal queue sizes for diagnostics.
    pub fn describe(&self) -> String {
        let states: Vec<String> = self
            .files
            .values()
            .filter(|f| !matches!(f.state, State::Done | State::Failed))
            .map(|f| {
                format!(
                    "{}:{:?} w{}/{} inflight {} end {} digest {}",
                    f.begin.file,
                    f.state,
                    f.written.len_bytes(),
                    f.expected.len_bytes(),
                    f.writes_in_flight,
                    f.source_digests.is_some(),
                    f.computed.is_some()
                )
            })
            .collect();
        format!(
            "stash {} KiB in {} files, early frames {}, open files: [{}]",
            self.stash_bytes >> 10,
            self.stash.len(),
            self.early_frames.len(),
            states.join(", ")
        )
    }

    pub fn poll_action(&mut self) -> Option<SinkAction> {
        self.actions.pop_front()
    }

    pub fn add_stream(&mut self, stream: u32) {
        self.live_streams.insert(stream);
    }

    /// A stream ended or broke; replies for its files go to another stream.
    pub fn on_stream_closed(&mut self, stream: u32) {
        self.live_streams.remove(&stream);
        if let Some(&other) = self.live_streams.iter().next() {
            for f in self.files.values_mut() {
                if f.reply_stream == stream {
                    f.reply_stream = other;
                }
            }
        }
    }

    /// Files not yet committed or failed.
    pub fn open_files(&self) -> usize {
        self.files
            .values()
            .filter(|f| !matches!(f.state, State::Done | State::Failed))
            .count()
    }

    /// The ranges written so far of a file (for reports and tests).
    /// Whether `file` (this attempt) still waits for its destination to open: a file given
    /// up or aborted meanwhile no longer does, and the driver closes what it opened.
    pub fn is_opening(&self, file: FileId, attempt: u32) -> bool {
        self.files
            .get(&file)
            .is_some_and(|f| f.begin.attempt == attempt && f.state == State::Opening)
    }

    pub fn written(&self, file: FileId) -> Option<&RangeSet> {
        self.files.get(&file).map(|f| &f.written)
    }

    fn reply(&mut self, stream: u32, frame: DataFrame) {
        let stream = if self.live_streams.contains(&stream) {
            stream
        } else {
            match self.live_streams.iter().next() {
                Some(&s) => s,
                None => stream,
            }
        };
        self.actions.push_back(SinkAction::Send { stream, frame });
    }

    /// A file announcement.
    pub fn on_begin(
        &mut self,
        stream: u32,
        begin: FileBegin,
        now: Instant,
    ) -> Result<(), ProtocolViolation> {
        if let Some(f) = self.files.get(&begin.file) {
            if begin.attempt < f.begin.attempt {
                return Ok(());
            }
            if begin.attempt == f.begin.attempt {
                if begin != f.begin {
                    return Err(ProtocolViolation(format!(
                        "file {} announced twice with different metadata",
                        begin.file
                    )));
                }
                return Ok(()); // Sent again after a lost stream.
            }
            // A new attempt replaces the old one, whose partial copy is suspect.
            let old = self.files.remove(&begin.file).expect("present");
            if !matches!(old.state, State::Done | State::Failed) {
                self.actions.push_back(SinkAction::Discard {
                    file: begin.file,
                    attempt: old.begin.attempt,
                    keep_partial: false,
                });
            }
        }
        let file = begin.file;
        let attempt = begin.attempt;
        let f = SinkFile {
            expected: RangeSet::from_range(0..begin.size),
            received: RangeSet::new(),
            written: RangeSet::new(),
            writes_in_flight: 0,
            source_digests: None,
            computed: None,
            reply_stream: stream,
            unsynced_bytes: 0,
            last_checkpoint: now,
            checkpoint_in_flight: false,
            state: State::Opening,
            begin: begin.clone(),
        };
        self.files.insert(file, f);
        match begin.kind {
            EntryKind::Dir => self.actions.push_back(SinkAction::MakeDir {
                file,
                attempt,
                begin,
            }),
            EntryKind::File => self.actions.push_back(SinkAction::Open {
                file,
                attempt,
                begin,
            }),
        }
        if let Some(early) = self.early_frames.remove(&file) {
            for (stream, frame) in early {
                self.on_frame(stream, frame, now)?;
            }
        }
        Ok(())
    }

    /// Keeps a small frame that arrived before its file's `FileBegin` (bounded per file).
    fn keep_early(
        &mut self,
        file: FileId,
        stream: u32,
        frame: DataFrame,
    ) -> Result<(), ProtocolViolation> {
        let files_with_early = self.early_frames.len();
        let early = self.early_frames.entry(file).or_default();
        if early.len() >= 4 || files_with_early > 100_000 {
            return Err(ProtocolViolation(format!(
                "too many frames for unannounced file {file}"
            )));
        }
        early.push((stream, frame));
        Ok(())
    }

    /// The temporary file is open. `have` are the ranges already present and trusted (from
    /// the restart ledger) when resuming. Returns the stashed blocks that can now be written.
    pub fn on_opened(
        &mut self,
        file: FileId,
        attempt: u32,
        result: Result<RangeSet, ErrorInfo>,
        now: Instant,
    ) -> Vec<BlockVerdict<P>> {
        let Some(f) = self.files.get_mut(&file) else {
            return Vec::new();
        };
        if f.begin.attempt != attempt || f.state != State::Opening {
            return Vec::new();
        }
        match result {
            Err(e) => {
                self.fail(file, e, false);
                return Vec::new();
            }
            Ok(have) => {
                let have = if f.begin.resume {
                    // Only ranges inside the file count.
                    let mut inside = have;
                    inside.remove(f.begin.size..u64::MAX);
                    inside
                } else {
                    RangeSet::new()
                };
                f.state = State::Receiving;
                f.received = have.clone();
                f.written = have.clone();
                self.stats.bytes_resumed += have.len_bytes();
                f.last_checkpoint = now;
                if f.begin.resume {
                    let stream = f.reply_stream;
                    let frame = DataFrame::Have(Have {
                        file,
                        attempt,
                        ranges: have.pairs().to_vec(),
                        complete: false,
                    });
                    self.reply(stream, frame);
                }
            }
        }
        let mut out = Vec::new();
        if let Some(stashed) = self.stash.remove(&file) {
            for s in stashed {
                self.stash_bytes -= s.len as u64;
                let v = self.on_block(s.stream, s.header, s.len, s.crc_ok, s.payload, now);
                if matches!(v, BlockVerdict::Write { .. }) {
                    out.push(v);
                }
            }
        }
        self.check_complete(file);
        out
    }

    /// A block whose CRC the driver checked (`crc_ok`). `len` is the payload length.
    pub fn on_block(
        &mut self,
        stream: u32,
        header: BlockHeader,
        len: u32,
        crc_ok: bool,
        payload: P,
        _now: Instant,
    ) -> BlockVerdict<P> {
        let file = header.file;
        let Some(f) = self.files.get_mut(&file) else {
            return self.stash_or_refuse(stream, header, len, crc_ok, payload, 0);
        };
        let attempt = f.begin.attempt;
        match f.state {
            State::Opening => {
                return self.stash_or_refuse(stream, header, len, crc_ok, payload, attempt);
            }
            State::Receiving => {}
            _ => {
                self.stats.duplicates += 1;
                return BlockVerdict::Drop;
            }
        }
        let end = header.offset.checked_add(len as u64);
        if end.is_none_or(|e| e > f.begin.size) {
            let error = ErrorInfo::new(
                ErrorKind::Protocol,
                format!(
                    "block at {}+{} beyond the end of {}",
                    header.offset, len, f.begin.path
                ),
            );
            self.fail(file, error, false);
            return BlockVerdict::Drop;
        }
        let range = header.offset..header.offset + len as u64;
        if !crc_ok {
            self.stats.crc_failures += 1;
            let frame = DataFrame::Nack(Nack {
                file,
                attempt,
                offset: header.offset,
                len: len as u64,
            });
            self.reply(stream, frame);
            return BlockVerdict::Drop;
        }
        let new_ranges = f.received.gaps_in(range.clone());
        if new_ranges.is_empty() {
            self.stats.duplicates += 1;
            return BlockVerdict::Drop;
        }
        f.received.insert(range);
        f.writes_in_flight += 1;
        f.reply_stream = stream;
        BlockVerdict::Write {
            file,
            attempt,
            offset: header.offset,
            payload,
            new_ranges,
        }
    }

    fn stash_or_refuse(
        &mut self,
        stream: u32,
        header: BlockHeader,
        len: u32,
        crc_ok: bool,
        payload: P,
        attempt: u32,
    ) -> BlockVerdict<P> {
        if self.stash_bytes + len as u64 <= self.cfg.stash_budget {
            self.stash_bytes += len as u64;
            self.stash.entry(header.file).or_default().push(Stashed {
                stream,
                header,
                len,
                crc_ok,
                payload,
            });
        } else {
            self.stats.stash_refusals += 1;
            let frame = DataFrame::Nack(Nack {
                file: header.file,
                attempt,
                offset: header.offset,
                len: len as u64,
            });
            self.reply(stream, frame);
        }
        BlockVerdict::Drop
    }

    /// A write finished.
    pub fn on_written(
        &mut self,
        file: FileId,
        attempt: u32,
        new_ranges: &RangeSet,
        result: Result<(), ErrorInfo>,
        now: Instant,
    ) {
        let Some(f) = self.files.get_mut(&file) else {
            return;
        };
        if f.begin.attempt != attempt {
            return;
        }
        f.writes_in_flight = f.writes_in_flight.saturating_sub(1);
        if f.state != State::Receiving {
            return;
        }
        if let Err(e) = result {
            // Keep what is on disk: a resume after freeing space continues from the ledger.
            self.fail(file, e, true);
            return;
        }
        for r in new_ranges.iter() {
            f.written.insert(r.clone());
            f.unsynced_bytes += r.end - r.start;
            self.stats.bytes_written += r.end - r.start;
        }
        if !f.checkpoint_in_flight
            && f.unsynced_bytes > 0
            && (f.unsynced_bytes >= self.cfg.checkpoint_bytes
                || now.saturating_duration_since(f.last_checkpoint) >= self.cfg.checkpoint_interval)
        {
            f.checkpoint_in_flight = true;
            f.unsynced_bytes = 0;
            f.last_checkpoint = now;
            let ranges = f.written.clone();
            self.actions.push_back(SinkAction::Checkpoint {
                file,
                attempt,
                ranges,
            });
        }
        self.check_complete(file);
    }

    /// A checkpoint finished (its ranges are durable and in the ledger).
    pub fn on_checkpointed(&mut self, file: FileId, attempt: u32) {
        if let Some(f) = self.files.get_mut(&file)
            && f.begin.attempt == attempt
        {
            f.checkpoint_in_flight = false;
        }
    }

    /// The source's end of file with its checksums.
    pub fn on_end(&mut self, stream: u32, end: FileEnd) -> Result<(), ProtocolViolation> {
        if self
            .files
            .get(&end.file)
            .is_some_and(|f| end.attempt > f.begin.attempt)
        {
            return self.keep_early(end.file, stream, DataFrame::End(end));
        }
        let Some(f) = self.files.get_mut(&end.file) else {
            return self.keep_early(end.file, stream, DataFrame::End(end));
        };
        if f.begin.attempt != end.attempt {
            return Ok(());
        }
        f.reply_stream = stream;
        if f.source_digests.is_none() {
            f.source_digests = Some(end.digests);
        }
        self.check_complete(end.file);
        Ok(())
    }

    /// The source could not read the file.
    pub fn on_file_abort(
        &mut self,
        stream: u32,
        abort: FileAbort,
    ) -> Result<(), ProtocolViolation> {
        let Some(f) = self.files.get(&abort.file) else {
            return self.keep_early(abort.file, stream, DataFrame::FileAbort(abort));
        };
        if abort.attempt > f.begin.attempt {
            return self.keep_early(abort.file, stream, DataFrame::FileAbort(abort));
        }
        self.abort_file(abort);
        Ok(())
    }

    fn abort_file(&mut self, abort: FileAbort) {
        let Some(f) = self.files.get(&abort.file) else {
            return;
        };
        if f.begin.attempt != abort.attempt || matches!(f.state, State::Done | State::Failed) {
            return;
        }
        let path = f.begin.path.clone();
        let f = self.files.get_mut(&abort.file).expect("present");
        f.state = State::Failed;
        self.stats.files_failed += 1;
        self.actions.push_back(SinkAction::Discard {
            file: abort.file,
            attempt: abort.attempt,
            keep_partial: true,
        });
        self.actions
            .push_back(SinkAction::Event(SinkEvent::FileFailed {
                file: abort.file,
                path,
                error: abort.error,
            }));
    }

    /// The whole-file digest computed here is complete.
    pub fn on_digest_complete(&mut self, file: FileId, attempt: u32, digests: Vec<Digest>) {
        let Some(f) = self.files.get_mut(&file) else {
            return;
        };
        if f.begin.attempt != attempt {
            return;
        }
        f.computed = Some(digests);
        self.check_complete(file);
    }

    fn check_complete(&mut self, file: FileId) {
        let Some(f) = self.files.get_mut(&file) else {
            return;
        };
        if f.state == State::Receiving
            && f.source_digests.is_some()
            && f.writes_in_flight == 0
            && f.written.contains_set(&f.expected)
        {
            f.state = State::Verifying;
            if f.computed.is_none() {
                let attempt = f.begin.attempt;
                self.actions
                    .push_back(SinkAction::DigestCatchUp { file, attempt });
            }
        }
        let Some(f) = self.files.get_mut(&file) else {
            return;
        };
        if f.state != State::Verifying {
            return;
        }
        let (Some(ours), Some(theirs)) = (&f.computed, &f.source_digests) else {
            return;
        };
        match digests_match(ours, theirs) {
            Ok(()) => {
                f.state = State::Committing;
                let (attempt, begin, digests) = (f.begin.attempt, f.begin.clone(), ours.clone());
                self.actions.push_back(SinkAction::Commit {
                    file,
                    attempt,
                    begin,
                    digests,
                });
            }
            Err(msg) => {
                let error = ErrorInfo::new(
                    ErrorKind::Integrity,
                    format!("{}: checksum verification failed ({msg})", f.begin.path),
                );
                self.fail(file, error, false);
            }
        }
    }

    /// The commit (or directory creation) finished.
    pub fn on_committed(&mut self, file: FileId, attempt: u32, result: Result<(), ErrorInfo>) {
        let Some(f) = self.files.get_mut(&file) else {
            return;
        };
        if f.begin.attempt != attempt || matches!(f.state, State::Done | State::Failed) {
            return;
        }
        if let Err(e) = result {
            self.fail(file, e, false);
            return;
        }
        f.state = State::Done;
        self.stats.files_done += 1;
        let digests = f.computed.clone().unwrap_or_default();
        let (path, size, stream) = (f.begin.path.clone(), f.begin.size, f.reply_stream);
        self.reply(
            stream,
            DataFrame::FileAck(FileAck {
                file,
                attempt,
                result: Ok(digests.clone()),
            }),
        );
        self.actions
            .push_back(SinkAction::Event(SinkEvent::FileDone {
                file,
                path,
                size,
                digests,
                skipped: false,
            }));
    }

    /// Opening a resumed file found the final file already complete: tell the source to skip it.
    pub fn on_already_complete(&mut self, file: FileId, attempt: u32) {
        let Some(f) = self.files.get_mut(&file) else {
            return;
        };
        if f.begin.attempt != attempt || f.state != State::Opening {
            return;
        }
        f.state = State::Done;
        self.stats.files_done += 1;
        self.stats.bytes_resumed += f.begin.size;
        let (path, size, stream) = (f.begin.path.clone(), f.begin.size, f.reply_stream);
        if let Some(stashed) = self.stash.remove(&file) {
            self.stash_bytes -= stashed.iter().map(|s| s.len as u64).sum::<u64>();
        }
        let have = Have {
            file,
            attempt,
            ranges: Vec::new(),
            complete: true,
        };
        self.reply(stream, DataFrame::Have(have));
        self.actions
            .push_back(SinkAction::Event(SinkEvent::FileDone {
                file,
                path,
                size,
                digests: Vec::new(),
                skipped: true,
            }));
    }

    /// Another transfer of the same destination wants the file (a retry of this one, while
    /// this session has not yet noticed that its client is gone): give it up, keeping what is
    /// on disk and its ledger for that transfer to resume from. A file already being committed
    /// or finished is not given up.
    pub fn give_up(&mut self, file: FileId, attempt: u32, error: ErrorInfo) {
        let Some(f) = self.files.get(&file) else {
            return;
        };
        if f.begin.attempt != attempt
            || matches!(f.state, State::Committing | State::Done | State::Failed)
        {
            return;
        }
        self.fail(file, error, true);
    }

    fn fail(&mut self, file: FileId, error: ErrorInfo, keep_partial: bool) {
        let Some(f) = self.files.get_mut(&file) else {
            return;
        };
        if matches!(f.state, State::Done | State::Failed) {
            return;
        }
        f.state = State::Failed;
        self.stats.files_failed += 1;
        let (attempt, path, stream) = (f.begin.attempt, f.begin.path.clone(), f.reply_stream);
        if let Some(stashed) = self.stash.remove(&file) {
            self.stash_bytes -= stashed.iter().map(|s| s.len as u64).sum::<u64>();
        }
        self.actions.push_back(SinkAction::Discard {
            file,
            attempt,
            keep_partial,
        });
        self.reply(
            stream,
            DataFrame::FileAck(FileAck {
                file,
                attempt,
                result: Err(error.clone()),
            }),
        );
        self.actions
            .push_back(SinkAction::Event(SinkEvent::FileFailed {
                file,
                path,
                error,
            }));
    }

    /// Handles any non-block frame from the source.
    pub fn on_frame(
        &mut self,
        stream: u32,
        frame: DataFrame,
        now: Instant,
    ) -> Result<(), ProtocolViolation> {
        match frame {
            DataFrame::Begin(b) => self.on_begin(stream, b, now),
            DataFrame::End(e) => self.on_end(stream, e),
            DataFrame::FileAbort(a) => self.on_file_abort(stream, a),
            DataFrame::StreamEnd => {
                self.on_stream_closed(stream);
                Ok(())
            }
            other => Err(ProtocolViolation(format!(
                "the source sent a sink-only frame {other:?}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests;
