//! The transfer log (`--log-transfer FILE`): one record per file and one per session, written
//! by every side that moves data (the client, `haul serve`, storage nodes, the metadata server's
//! replication and repair), plus one record per refused authentication. Three formats, so that
//! the accounting parsers operators already run keep working:
//!
//! - `netlogger`: NetLogger "best practices" lines (`ts=... event=haul.file.end level=Info
//!   guid=... key=value ...`), read by `nl_parse` and anything that splits `key=value` pairs;
//! - `json`: the same records with the same keys, one JSON object per line;
//! - `gridftp`: the `globus-gridftp-server -log-transfer` line (`DATE=... HOST=... PROG=...
//!   NL.EVNT=FTP_INFO START=... USER=... FILE=... BUFFER=... BLOCK=... NBYTES=... VOLUME=...
//!   STREAMS=... STRIPES=... DEST=[ip] TYPE=... CODE=... TASKID=...`), for file records only
//!   (GridFTP has no session or refusal records; those stay in the daemon's log).
//!
//! What a record holds is decided here; when records are written (a file's end, a session's
//! end) is decided by whoever runs the session, through a [`Recorder`] fed with the session's
//! [`Event`]s. Writing never fails a transfer: a log that cannot be written (a full disk) is
//! warned about once per outage and its records are dropped. A log that cannot be opened is
//! refused before anything moves ([`TransferLog::open`]).
//!
//! The three writers are by hand: the line formats are fixed by the programs that read them,
//! and no maintained crate writes NetLogger or GridFTP records.

use crate::error::TransferError;
use crate::progress::Event;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;
use wire::checksum::Digest;
use wire::error::ErrorInfo;

/// How records are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// NetLogger best-practice `key=value` lines.
    #[default]
    NetLogger,
    /// One JSON object per line, with the NetLogger keys.
    Json,
    /// `globus-gridftp-server -log-transfer` lines (file records only).
    GridFtp,
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "netlogger" => Ok(Self::NetLogger),
            "json" => Ok(Self::Json),
            "gridftp" => Ok(Self::GridFtp),
            other => Err(format!(
                "unknown transfer log format {other:?}: use netlogger, json or gridftp"
            )),
        }
    }
}

/// An open transfer log.
pub struct TransferLog {
    path: PathBuf,
    format: LogFormat,
    /// This host's name (`HOST=`, `host=`).
    host: String,
    /// The site this host belongs to, when it has one (storage nodes).
    site: Option<String>,
    file: Mutex<Pending>,
    /// A write failed and was warned about; cleared by the next write that succeeds.
    failing: AtomicBool,
}

/// Records not yet written: file records wait (up to a second, or 64 KiB) for the next
/// session or refusal record, or the next one after that second, and go out in one append;
/// a record per write cost 12% of a copy of 2,000 small files over loopback.
struct Pending {
    file: std::fs::File,
    buf: Vec<u8>,
    since: std::time::Instant,
}

/// Buffered records are written at least this often.
const FLUSH_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

impl Drop for TransferLog {
    fn drop(&mut self) {
        self.flush();
    }
}

impl std::fmt::Debug for TransferLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransferLog")
            .field("path", &self.path)
            .field("format", &self.format)
            .finish()
    }
}

impl TransferLog {
    /// Opens `path` for appending (created mode 0640), refusing a symbolic link in its last
    /// component (a daemon writing as root must not be led elsewhere by a planted link) and
    /// anything that is not a regular file, a pipe or a character device. Errors name the
    /// file and exit 6, before any transfer starts.
    pub fn open(path: &Path, format: LogFormat) -> Result<Self, TransferError> {
        let file = open_append(path, "transfer log")?;
        Ok(Self {
            path: path.to_path_buf(),
            format,
            host: host_name(),
            site: None,
            file: Mutex::new(Pending {
                file,
                buf: Vec::with_capacity(64 << 10),
                since: std::time::Instant::now(),
            }),
            failing: AtomicBool::new(false),
        })
    }

    /// The same log, naming `site` as this host's site in every record.
    pub fn with_site(mut self, site: Option<String>) -> Self {
        self.site = site;
        self
    }

    /// Whether the last write failed (and was warned about).
    pub fn is_failing(&self) -> bool {
        self.failing.load(Ordering::Relaxed)
    }

    pub fn format(&self) -> LogFormat {
        self.format
    }

    /// Writes the record of one file.
    pub fn file(&self, f: &FileRecord<'_>) {
        let line = match self.format {
            LogFormat::NetLogger => netlogger(&self.file_fields(f)),
            LogFormat::Json => json(&self.file_fields(f)),
            LogFormat::GridFtp => self.gridftp(f),
        };
        self.write(line, false);
    }

    /// Writes the record of one session.
    pub fn session(&self, s: &SessionRecord<'_>) {
        let line = match self.format {
            LogFormat::NetLogger => netlogger(&self.session_fields(s)),
            LogFormat::Json => json(&self.session_fields(s)),
            LogFormat::GridFtp => {
                // No session records in this format; the session's files go out now.
                self.flush();
                return;
            }
        };
        self.write(line, true);
    }

    /// Writes the record of a refused authentication: who connected from where (`subject`
    /// when a certificate was presented and could be parsed) and why it was refused.
    pub fn refused(&self, peer: &str, subject: Option<&str>, reason: &str) {
        let mut r = Fields::new("haul.auth.refused", Level::Warn, SystemTime::now());
        self.common(&mut r);
        r.str("peer", peer);
        if let Some(s) = subject {
            r.str("dn", s);
        }
        r.int("status", -1);
        r.str("msg", reason);
        let line = match self.format {
            LogFormat::NetLogger => netlogger(&r),
            LogFormat::Json => json(&r),
            LogFormat::GridFtp => return,
        };
        self.write(line, true);
    }

    /// Adds a record; writes what is pending when `now` (session and refusal records), when
    /// 64 KiB are pending, or when the oldest pending record is a second old.
    fn write(&self, line: String, now: bool) {
        let mut p = self.file.lock().expect("transfer log lock");
        if p.buf.is_empty() {
            p.since = std::time::Instant::now();
        }
        p.buf.extend_from_slice(line.as_bytes());
        if now || p.buf.len() >= 64 << 10 || p.since.elapsed() >= FLUSH_EVERY {
            self.flush_locked(&mut p);
        }
    }

    /// Writes what is pending now.
    pub fn flush(&self) {
        let mut p = self.file.lock().expect("transfer log lock");
        self.flush_locked(&mut p);
    }

    fn flush_locked(&self, p: &mut Pending) {
        if p.buf.is_empty() {
            return;
        }
        let Pending { file, buf, .. } = p;
        let result = file.write_all(buf);
        buf.clear();
        match result {
            Ok(()) => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::warn!(log = %self.path.display(), "the transfer log is written again");
                }
            }
            Err(e) => {
                if !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        log = %self.path.display(),
                        error = %e,
                        "cannot write the transfer log; its records are dropped until it can be written again (transfers go on)"
                    );
                }
            }
        }
    }

    fn common(&self, r: &mut Fields) {
        r.str("prog", concat!("haul-", env!("CARGO_PKG_VERSION")));
        r.str("host", &self.host);
        if let Some(s) = &self.site {
            r.str("site", s);
        }
    }

    fn how(&self, r: &mut Fields, s: &SessionFacts) {
        r.str("guid", &s.guid);
        self.common(r);
        r.str("role", s.role.name());
        r.str("user", &s.user);
        if let Some(dn) = &s.subject {
            r.str("dn", dn);
        }
        r.str("peer", &s.peer);
        if let Some(site) = &s.peer_site {
            r.str("peer.site", site);
        }
        r.uint("streams", s.streams as u64);
        r.str("cc", &s.congestion);
        r.uint("buffer", s.buffer);
        r.uint("block", s.block as u64);
        r.str("protect", &s.protect);
        if let Some(z) = s.zero_copy {
            r.bool("zero_copy", z);
        }
    }

    fn file_fields(&self, f: &FileRecord<'_>) -> Fields {
        let level = if f.result.is_ok() {
            Level::Info
        } else {
            Level::Error
        };
        let mut r = Fields::new("haul.file.end", level, f.end);
        self.how(&mut r, f.session);
        r.str("path", f.path);
        r.uint("size", f.size);
        r.uint("nbytes", f.nbytes);
        if let Some((off, len)) = f.session.range {
            r.uint("offset", off);
            r.uint("length", len);
        }
        if f.skipped {
            r.bool("skipped", true);
        }
        timing(&mut r, f.start, f.end, f.nbytes);
        match &f.result {
            Ok(digests) => {
                for d in *digests {
                    r.string(format!("checksum.{}", d.algorithm), d.hex());
                }
                r.int("status", 0);
            }
            Err(e) => failure(&mut r, e.kind, &e.message),
        }
        r
    }

    fn session_fields(&self, s: &SessionRecord<'_>) -> Fields {
        let level = match &s.result {
            Ok(st) if st.files_failed == 0 => Level::Info,
            _ => Level::Error,
        };
        let mut r = Fields::new("haul.session.end", level, s.end);
        self.how(&mut r, s.session);
        if let Some(src) = &s.session.source {
            r.str("src", src);
        }
        if let Some(dst) = &s.session.destination {
            r.str("dst", dst);
        }
        match &s.result {
            Ok(st) => {
                r.uint("files", st.files);
                r.uint("files.failed", st.files_failed);
                r.uint("bytes", st.bytes_total);
                r.uint("nbytes", st.bytes_moved);
                r.uint("resumed", st.bytes_resumed);
                r.uint("resent", st.bytes_resent);
                r.uint("blocks.resent", st.blocks_resent);
                r.uint("attempts", st.attempts as u64);
                r.uint("streams.lost", st.streams_lost as u64);
                if !st.congestion.is_empty() {
                    r.str("cc.used", &st.congestion);
                }
                r.uint("retrans", st.retransmits);
                timing(&mut r, s.session.start, s.end, st.bytes_moved);
                if !st.plan.is_empty() {
                    r.str("plan", &st.plan);
                }
                if let Some(v) = &st.bottleneck {
                    let factor = serde_json::to_value(v.factor).unwrap_or_default();
                    r.str("bottleneck", factor.as_str().unwrap_or("unknown"));
                    r.str("bottleneck.reason", &v.reason);
                }
                match &st.first_failure {
                    None => r.int("status", 0),
                    Some(e) => failure(&mut r, e.kind, &e.message),
                }
            }
            Err(e) => {
                timing(&mut r, s.session.start, s.end, 0);
                failure(&mut r, e.kind, &e.message);
            }
        }
        r
    }

    /// The `globus-gridftp-server -log-transfer` line of a file. `FILE` is written with
    /// spaces, `=`, `%` and control characters percent-encoded, so that the parsers that split
    /// records on whitespace (NetSage, Telegraf scripts) read every field right and no file
    /// name can forge a field or a record; every other byte is written as it is.
    fn gridftp(&self, f: &FileRecord<'_>) -> String {
        let s = f.session;
        let code = match &f.result {
            Ok(_) => 226,
            Err(e) => ftp_code(e.kind),
        };
        let dest = s
            .peer
            .parse::<std::net::SocketAddr>()
            .map(|a| a.ip().to_string())
            .unwrap_or_else(|_| "0.0.0.0".into());
        let kind = match s.role {
            Role::Send => "RETR",
            Role::Receive => "STOR",
            Role::ThirdParty => "TPC",
        };
        format!(
            "DATE={} HOST={} PROG=haul NL.EVNT=FTP_INFO START={} USER={} FILE={} BUFFER={} BLOCK={} NBYTES={} VOLUME=/ STREAMS={} STRIPES=1 DEST=[{dest}] TYPE={kind} CODE={code} TASKID={}\n",
            ulm_time(f.end),
            percent_encode(&self.host),
            ulm_time(f.start),
            percent_encode(&s.user),
            percent_encode(f.path),
            s.buffer,
            s.block,
            f.nbytes,
            s.streams,
            s.guid,
        )
    }
}

/// Opens `path` for appending (created mode 0640), refusing a symbolic link in its last
/// component and anything but a regular file, a pipe or a character device; errors name the
/// file as `what` and exit 6.
pub(crate) fn open_append(path: &Path, what: &str) -> Result<std::fs::File, TransferError> {
    let refuse = |why: String| {
        TransferError::not_writable(format!("cannot write the {what} {}: {why}", path.display()))
    };
    let file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o640)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => refuse("it is a symbolic link".into()),
            _ => refuse(e.to_string()),
        })?;
    let kind = file
        .metadata()
        .map_err(|e| refuse(e.to_string()))?
        .file_type();
    use std::os::unix::fs::FileTypeExt as _;
    if !(kind.is_file() || kind.is_fifo() || kind.is_char_device()) {
        return Err(refuse("not a regular file".into()));
    }
    Ok(file)
}

/// Which way data went from the logging side's point of view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// This side read the files and sent them (GridFTP `RETR`).
    Send,
    /// This side received and wrote them (`STOR`).
    Receive,
    /// This side only directed a copy between two endpoints (`TPC`).
    ThirdParty,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Send => "send",
            Role::Receive => "receive",
            Role::ThirdParty => "third-party",
        }
    }
}

/// What every record of one session repeats: who, where and how.
#[derive(Clone, Debug)]
pub struct SessionFacts {
    /// The session's (or, on the client, the copy's) id as a UUID.
    pub guid: String,
    pub role: Role,
    /// The local account the data was read or written as (the mapped user on an endpoint).
    pub user: String,
    /// The certificate subject of the user.
    pub subject: Option<String>,
    /// The other side: `ip:port` (or `host:port`).
    pub peer: String,
    pub peer_site: Option<String>,
    /// What a client copied (`src`, `dst` of the session record).
    pub source: Option<String>,
    pub destination: Option<String>,
    /// `(offset, length)` of a single-file range.
    pub range: Option<(u64, u64)>,
    pub streams: u32,
    /// Congestion control asked for, or the host's default.
    pub congestion: String,
    /// Explicit socket buffer (0: the kernel's autotuning).
    pub buffer: u64,
    pub block: u32,
    /// `clear` or `private`.
    pub protect: String,
    /// Whether this side sent with `sendfile` (`None`: it did not send).
    pub zero_copy: Option<bool>,
    pub start: SystemTime,
}

impl SessionFacts {
    /// Facts with what `options` say; the caller fills in who and where.
    pub fn new(guid: String, role: Role, options: &wire::control::SessionOptions) -> Self {
        Self {
            guid,
            role,
            user: String::new(),
            subject: None,
            peer: String::new(),
            peer_site: None,
            source: None,
            destination: None,
            range: None,
            streams: options.streams.unwrap_or(0),
            congestion: options
                .congestion
                .clone()
                .unwrap_or_else(crate::sys::default_congestion),
            buffer: options.tcp_buffer.unwrap_or(0),
            block: options.block_size,
            protect: format!("{:?}", options.protect).to_lowercase(),
            zero_copy: None,
            start: SystemTime::now(),
        }
    }
}

/// A session id (16 bytes) written as a UUID.
pub fn guid(id: &[u8; 16]) -> String {
    let h = hex::encode(id);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// A new random id for a transfer that is not one session (a client's copy).
pub fn new_guid() -> String {
    guid(&rand::random())
}

/// One file's record.
pub struct FileRecord<'a> {
    pub session: &'a SessionFacts,
    pub path: &'a str,
    pub size: u64,
    /// Bytes of the file this session delivered (0 when the destination already had it).
    pub nbytes: u64,
    pub skipped: bool,
    pub start: SystemTime,
    pub end: SystemTime,
    /// The file's checksums, or why it failed.
    pub result: Result<&'a [Digest], &'a ErrorInfo>,
}

/// What a session did, at its end.
#[derive(Clone, Debug, Default)]
pub struct SessionStats {
    pub files: u64,
    pub files_failed: u64,
    /// Bytes of the dataset.
    pub bytes_total: u64,
    /// Bytes that crossed the network (all attempts).
    pub bytes_moved: u64,
    /// Bytes the destination already had (resume).
    pub bytes_resumed: u64,
    /// Bytes that crossed the network more than once.
    pub bytes_resent: u64,
    pub blocks_resent: u64,
    pub attempts: u32,
    pub streams_lost: u32,
    /// Congestion control in use at the end (`cubic->bbr` after a switch).
    pub congestion: String,
    pub retransmits: u64,
    pub plan: String,
    /// The first file that failed, when some did.
    pub first_failure: Option<ErrorInfo>,
    /// The limiting factor and the sentence that says so (a client's copies).
    pub bottleneck: Option<wire::bottleneck::Verdict>,
}

impl From<&wire::control::SessionSummary> for SessionStats {
    fn from(s: &wire::control::SessionSummary) -> Self {
        Self {
            files: s.files_done + s.files_failed,
            files_failed: s.files_failed,
            bytes_total: s.bytes_moved + s.bytes_skipped,
            bytes_moved: s.bytes_moved,
            bytes_resumed: s.bytes_skipped,
            bytes_resent: 0,
            blocks_resent: s.blocks_resent,
            attempts: 1,
            streams_lost: s.streams_lost,
            congestion: s.congestion.clone(),
            retransmits: s.tcp_retransmits,
            plan: s.plan.clone(),
            first_failure: None,
            bottleneck: None,
        }
    }
}

/// A session's record.
pub struct SessionRecord<'a> {
    pub session: &'a SessionFacts,
    pub end: SystemTime,
    pub result: Result<SessionStats, ErrorInfo>,
}

/// Writes a session's file records as its events arrive: it notes when each file started
/// (`Event::FileStarted`; a file never started, such as one the destination already had,
/// starts when it ends) and writes the record when the file is done or failed.
pub struct Recorder {
    log: Arc<TransferLog>,
    pub facts: SessionFacts,
    started: HashMap<String, SystemTime>,
}

impl Recorder {
    pub fn new(log: Arc<TransferLog>, facts: SessionFacts) -> Self {
        Self {
            log,
            facts,
            started: HashMap::new(),
        }
    }

    pub fn on_event(&mut self, ev: &Event) {
        match ev {
            Event::FileStarted { path } => {
                self.started
                    .entry(path.clone())
                    .or_insert_with(SystemTime::now);
            }
            Event::Plan { streams, .. } => self.facts.streams = *streams,
            Event::FileDone {
                path,
                size,
                digests,
                skipped,
            } => {
                let end = SystemTime::now();
                let start = self.started.remove(path).unwrap_or(end);
                self.log.file(&FileRecord {
                    session: &self.facts,
                    path,
                    size: *size,
                    nbytes: if *skipped { 0 } else { *size },
                    skipped: *skipped,
                    start,
                    end,
                    result: Ok(digests),
                });
            }
            Event::FileFailed { path, error } => {
                let end = SystemTime::now();
                let start = self.started.remove(path).unwrap_or(end);
                self.log.file(&FileRecord {
                    session: &self.facts,
                    path,
                    size: 0,
                    nbytes: 0,
                    skipped: false,
                    start,
                    end,
                    result: Err(error),
                });
            }
            _ => {}
        }
    }

    /// Writes the session's own record.
    pub fn finish(&self, result: Result<SessionStats, ErrorInfo>) {
        self.log.session(&SessionRecord {
            session: &self.facts,
            end: SystemTime::now(),
            result,
        });
    }
}

/// NetLogger levels, spelled as NetLogger's own API writes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Level {
    Info,
    Warn,
    Error,
}

enum Value {
    Str(String),
    Uint(u64),
    Int(i64),
    Float(f64),
    Bool(bool),
}

/// One record: its event, level and time, then its fields in order.
struct Fields {
    event: &'static str,
    level: Level,
    ts: SystemTime,
    fields: Vec<(String, Value)>,
}

impl Fields {
    fn new(event: &'static str, level: Level, ts: SystemTime) -> Self {
        Self {
            event,
            level,
            ts,
            fields: Vec::with_capacity(32),
        }
    }

    fn str(&mut self, k: &str, v: &str) {
        self.fields.push((k.into(), Value::Str(v.into())));
    }

    fn string(&mut self, k: String, v: String) {
        self.fields.push((k, Value::Str(v)));
    }

    fn uint(&mut self, k: &str, v: u64) {
        self.fields.push((k.into(), Value::Uint(v)));
    }

    fn int(&mut self, k: &str, v: i64) {
        self.fields.push((k.into(), Value::Int(v)));
    }

    fn float(&mut self, k: &str, v: f64) {
        self.fields.push((k.into(), Value::Float(v)));
    }

    fn bool(&mut self, k: &str, v: bool) {
        self.fields.push((k.into(), Value::Bool(v)));
    }
}

/// `start`, `dur` (seconds) and `rate` (bytes per second) of a record.
fn timing(r: &mut Fields, start: SystemTime, end: SystemTime, bytes: u64) {
    let dur = end.duration_since(start).unwrap_or_default().as_secs_f64();
    r.string("start".into(), iso_time(start));
    r.float("dur", dur);
    if dur > 0.0 {
        r.float("rate", bytes as f64 / dur);
    }
}

/// `status=-1`, the error's kind and exit code, and its message.
fn failure(r: &mut Fields, kind: wire::error::ErrorKind, message: &str) {
    r.int("status", -1);
    r.str("error.kind", kind.name());
    r.int("exit", crate::error::exit_code_of(kind) as i64);
    r.str("msg", message);
}

/// The FTP reply code GridFTP would log for a failure of this kind.
fn ftp_code(kind: wire::error::ErrorKind) -> u16 {
    use wire::error::ErrorKind as K;
    match kind {
        K::NotFound | K::PermissionDenied | K::Authentication | K::Unmapped => 550,
        K::PathEscapesRoot | K::NotADirectory | K::IsADirectory | K::Exists | K::NotEmpty => 553,
        K::NoSpace | K::NotWritable => 452,
        K::Connect | K::Unavailable | K::Stalled | K::Cancelled => 426,
        _ => 451,
    }
}

fn netlogger(r: &Fields) -> String {
    let mut s = String::with_capacity(512);
    let _ = write!(
        s,
        "ts={} event={} level={}",
        iso_time(r.ts),
        r.event,
        level_name(r.level)
    );
    for (k, v) in &r.fields {
        let _ = match v {
            Value::Str(v) => write!(s, " {k}={}", nl_quote(v)),
            Value::Uint(v) => write!(s, " {k}={v}"),
            Value::Int(v) => write!(s, " {k}={v}"),
            Value::Float(v) => write!(s, " {k}={v:.6}"),
            Value::Bool(v) => write!(s, " {k}={v}"),
        };
    }
    s.push('\n');
    s
}

fn json(r: &Fields) -> String {
    let mut m = serde_json::Map::new();
    m.insert("ts".into(), iso_time(r.ts).into());
    m.insert("event".into(), r.event.into());
    m.insert("level".into(), level_name(r.level).into());
    for (k, v) in &r.fields {
        let v = match v {
            Value::Str(v) => serde_json::Value::from(v.as_str()),
            Value::Uint(v) => (*v).into(),
            Value::Int(v) => (*v).into(),
            Value::Float(v) => (*v).into(),
            Value::Bool(v) => (*v).into(),
        };
        m.insert(k.clone(), v);
    }
    let mut s = serde_json::Value::Object(m).to_string();
    s.push('\n');
    s
}

fn level_name(l: Level) -> &'static str {
    match l {
        Level::Info => "Info",
        Level::Warn => "Warn",
        Level::Error => "Error",
    }
}

/// A NetLogger value: quoted when empty or holding a space, tab, `"` or `=` (inner `"` as
/// `\"`, as NetLogger's parser expects); a backslash and control characters are written as
/// `\xNN`, so that no value can end a record or escape its quotes.
fn nl_quote(v: &str) -> String {
    let mut out = String::with_capacity(v.len() + 2);
    let needs_quotes = v.is_empty() || v.contains([' ', '\t', '"', '=']);
    if needs_quotes {
        out.push('"');
    }
    for c in v.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\x5c"),
            c if c.is_control() => {
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    let _ = write!(out, "\\x{b:02x}");
                }
            }
            c => out.push(c),
        }
    }
    if needs_quotes {
        out.push('"');
    }
    out
}

/// Percent-encodes space, `=`, `%` and control characters (GridFTP fields).
fn percent_encode(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        if c == ' ' || c == '=' || c == '%' || c.is_control() {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                let _ = write!(out, "%{b:02X}");
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn utc(t: SystemTime) -> time::OffsetDateTime {
    time::OffsetDateTime::from(t)
}

/// `2026-11-24T18:02:11.123456Z` (UTC, microseconds).
pub fn iso_time(t: SystemTime) -> String {
    let d = utc(t);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
        d.year(),
        d.month() as u8,
        d.day(),
        d.hour(),
        d.minute(),
        d.second(),
        d.microsecond()
    )
}

/// `20261124180211.123456` (UTC, microseconds padded, as GridFTP writes since 2009).
fn ulm_time(t: SystemTime) -> String {
    let d = utc(t);
    format!(
        "{:04}{:02}{:02}{:02}{:02}{:02}.{:06}",
        d.year(),
        d.month() as u8,
        d.day(),
        d.hour(),
        d.minute(),
        d.second(),
        d.microsecond()
    )
}

/// This host's name, as `gethostname` gives it.
fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at most that much.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

#[cfg(test)]
mod tests;
