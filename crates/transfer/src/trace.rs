//! Traces (`haul cp --trace FILE`; `--trace-dir DIR` on endpoints and storage nodes): every
//! 10 ms, for each data stream of a sending session, the kernel's `TCP_INFO` (bytes sent,
//! acknowledged and retransmitted, cwnd, send window, RTT and its variation, lost and
//! retransmitted segments, delivery and pacing rates, and the sender chronographs: busy,
//! receive-window-limited and send-buffer-limited time), and the session's storage side
//! (bytes read, time spent reading and checksumming, time readers waited for the read-ahead
//! budget, bytes queued). Written as JSON lines with the units in the key names, one object
//! per stream per tick: the seed's 16 ms per-stream plots, and what `haul trace summary` and
//! `haul trace plot` read.
//!
//! Counters are the kernel's cumulative values, as read: rates and shares are differences
//! between samples, computed by the reader. Each sample carries its real time (`t_us`, since
//! the trace began) because ticks drift under load.

use crate::error::TransferError;
use crate::sys::TcpInfo;
use serde::{Deserialize, Serialize};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

/// Time between samples.
pub const INTERVAL: Duration = Duration::from_millis(10);

/// One line of a trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Line {
    /// First line: what is traced.
    Header(Header),
    /// A session (one attempt of a copy) began sending.
    Session(SessionBegin),
    /// One data stream at one instant.
    Stream(StreamSample),
    /// The session's storage side at one instant.
    Storage(StorageSample),
    /// A session's sampling ended: what the tracer itself cost.
    End(EndSample),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Header {
    /// `haul-trace`.
    pub format: String,
    pub version: u32,
    pub interval_us: u64,
    /// When the trace began (UTC), the origin of every `t_us`.
    pub start: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionBegin {
    pub t_us: u64,
    /// The session's id (UUID form, as in the transfer log).
    pub guid: String,
    /// Where the data goes.
    pub peer: String,
    pub streams: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamSample {
    pub t_us: u64,
    pub stream: u32,
    pub bytes_sent: u64,
    pub bytes_acked: u64,
    pub bytes_retrans: u64,
    pub cwnd_bytes: u64,
    pub snd_wnd_bytes: u64,
    pub rtt_us: u32,
    pub rttvar_us: u32,
    pub min_rtt_us: u32,
    /// Segments retransmitted so far.
    pub retrans_segs: u32,
    /// Segments currently considered lost.
    pub lost_segs: u32,
    pub delivery_rate_bytes_per_s: u64,
    /// The delivery-rate sample was limited by the application, not the network.
    pub app_limited: bool,
    pub pacing_rate_bytes_per_s: u64,
    pub busy_us: u64,
    pub rwnd_limited_us: u64,
    pub sndbuf_limited_us: u64,
    pub notsent_bytes: u32,
    pub pmtu: u32,
}

impl StreamSample {
    pub fn of(t_us: u64, stream: u32, i: &TcpInfo) -> Self {
        Self {
            t_us,
            stream,
            bytes_sent: i.bytes_sent,
            bytes_acked: i.bytes_acked,
            bytes_retrans: i.bytes_retrans,
            cwnd_bytes: i.snd_cwnd as u64 * i.snd_mss as u64,
            snd_wnd_bytes: i.snd_wnd as u64,
            rtt_us: i.rtt,
            rttvar_us: i.rttvar,
            min_rtt_us: i.min_rtt,
            retrans_segs: i.total_retrans,
            lost_segs: i.lost,
            delivery_rate_bytes_per_s: i.delivery_rate,
            // tcpi_delivery_rate_app_limited is the lowest bit of the byte after wscale.
            app_limited: i.flags & 1 == 1,
            pacing_rate_bytes_per_s: i.pacing_rate,
            busy_us: i.busy_time,
            rwnd_limited_us: i.rwnd_limited,
            sndbuf_limited_us: i.sndbuf_limited,
            notsent_bytes: i.notsent_bytes,
            pmtu: i.pmtu,
        }
    }
}

/// The storage side of a sending session, cumulative.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StorageSample {
    pub t_us: u64,
    /// Bytes read from the source files (also those only checksummed).
    pub read_bytes: u64,
    /// Time reader threads spent reading and checksumming.
    pub read_us: u64,
    /// Time reader threads waited for room in the read-ahead budget (the network is slower
    /// than the storage).
    pub budget_wait_us: u64,
    /// Bytes read ahead and not yet acknowledged.
    pub queued_bytes: u64,
}

/// What a sending session is told to trace into: the file, and what names the session in it.
#[derive(Clone)]
pub struct TraceTarget {
    pub file: std::sync::Arc<TraceFile>,
    pub guid: String,
    pub peer: String,
}

/// The end of a session's sampling.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EndSample {
    pub t_us: u64,
    pub ticks: u64,
    /// CPU time the tracer spent sampling and writing.
    pub sampling_cpu_us: u64,
}

/// An open trace file.
pub struct TraceFile {
    path: PathBuf,
    started: Instant,
    out: Mutex<std::io::BufWriter<std::fs::File>>,
    /// A write failed (warned once): the trace stops growing, the transfer goes on.
    failed: AtomicBool,
}

impl TraceFile {
    /// Opens (appending, never through a symbolic link: see `translog`) and writes the header.
    pub fn open(path: &Path) -> Result<Self, TransferError> {
        let file = crate::translog::open_append(path, "trace")?;
        let t = Self {
            path: path.to_path_buf(),
            started: Instant::now(),
            out: Mutex::new(std::io::BufWriter::with_capacity(256 << 10, file)),
            failed: AtomicBool::new(false),
        };
        t.write(&Line::Header(Header {
            format: "haul-trace".into(),
            version: 1,
            interval_us: INTERVAL.as_micros() as u64,
            start: crate::translog::iso_time(SystemTime::now()),
        }));
        Ok(t)
    }

    /// The trace's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where the trace's next line will start in its file (what is buffered written out
    /// first): a copy notes it to read back its own lines of a file earlier copies appended
    /// to (`read_since`).
    pub fn end_offset(&self) -> u64 {
        self.flush();
        std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0)
    }

    /// Microseconds since the trace began.
    pub fn now_us(&self) -> u64 {
        self.started.elapsed().as_micros() as u64
    }

    pub fn write(&self, line: &Line) {
        if self.failed.load(Ordering::Relaxed) {
            return;
        }
        let mut out = self.out.lock().expect("trace lock");
        let r = serde_json::to_writer(&mut *out, line)
            .map_err(std::io::Error::other)
            .and_then(|()| out.write_all(b"\n"));
        if let Err(e) = r {
            self.fail(&e);
        }
    }

    /// Writes what is buffered (every second or so while sampling, and at a session's end).
    pub fn flush(&self) {
        if self.failed.load(Ordering::Relaxed) {
            return;
        }
        let r = self.out.lock().expect("trace lock").flush();
        if let Err(e) = r {
            self.fail(&e);
        }
    }

    fn fail(&self, e: &std::io::Error) {
        if !self.failed.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                trace = %self.path.display(),
                error = %e,
                "cannot write the trace; it stops here (the transfer goes on)"
            );
        }
    }
}

impl Drop for TraceFile {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Bytes of a trace `read_since` reads at most (a long copy's trace grows by about 40 KB a
/// second per stream).
const READ_SINCE_MAX: u64 = 256 << 20;

/// The lines appended to the trace at `path` from byte `offset` on (one copy's part of a
/// file that other copies appended to as well), up to `READ_SINCE_MAX` bytes; lines that do
/// not parse are skipped. Empty when the file cannot be read.
pub fn read_since(path: &Path, offset: u64) -> Vec<Line> {
    use std::io::{BufRead, Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return Vec::new();
    };
    if f.seek(SeekFrom::Start(offset)).is_err() {
        return Vec::new();
    }
    std::io::BufReader::new(f.take(READ_SINCE_MAX))
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| serde_json::from_str(&l).ok())
        .collect()
}

/// Reads a trace back: its lines in order (a line that does not parse is an error naming its
/// number; a last line cut short by a crash is dropped).
pub fn read(path: &Path) -> Result<Vec<Line>, TransferError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        let msg = format!("cannot read the trace {}: {e}", path.display());
        match e.kind() {
            std::io::ErrorKind::InvalidData => {
                TransferError::usage(format!("{}: not a haul trace (not text)", path.display()))
            }
            std::io::ErrorKind::NotFound => TransferError::not_found(msg),
            _ => TransferError::local(msg),
        }
    })?;
    let mut lines = Vec::new();
    let count = text.lines().count();
    for (n, l) in text.lines().enumerate() {
        match serde_json::from_str::<Line>(l) {
            Ok(line) => lines.push(line),
            Err(_) if n + 1 == count && !text.ends_with('\n') => break,
            Err(e) => {
                return Err(TransferError::usage(format!(
                    "{}:{}: not a haul trace line: {e}",
                    path.display(),
                    n + 1
                )));
            }
        }
    }
    if !matches!(lines.first(), Some(Line::Header(h)) if h.format == "haul-trace") {
        return Err(TransferError::usage(format!(
            "{}: not a haul trace (no header line)",
            path.display()
        )));
    }
    Ok(lines)
}

pub mod summary;

#[cfg(test)]
mod tests;
