//! `haul perf`, driven: both ends of a memory-to-memory path test ([`wire::perf`]) over an
//! endpoint's own port and authentication. The endpoint side ([`serve`]) runs inside a
//! control connection; the client side ([`run`]) opens one, asks for a test and reports it.
//!
//! TCP tests send zeros from memory on data streams bound to the session like a transfer's;
//! the sender samples each socket's `TCP_INFO` every interval (bytes acknowledged,
//! retransmits, RTT, cwnd), the receiver counts what arrives. UDP tests pace datagrams from a
//! thread and count them with [`wire::perf::UdpReceiver`] on another: one UDP test at a time
//! per endpoint, on a socket opened for that test only.

use crate::conn::{self, ClientTls, ControlReader, ControlWriter, DataConn, Io, StreamTarget};
use crate::error::TransferError;
use crate::sys;
use serde::Serialize;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use wire::control::{DataKey, HostLimits, Request, Response, SessionId};
use wire::error::{ErrorInfo, ErrorKind};
use wire::perf::{
    ANNOUNCE_SEQ, DATAGRAM_HEADER, Datagram, Direction, PerfInterval, PerfOutcome, PerfRequest,
    PerfSpec, StreamSample, UdpPacer, UdpReceiver, UdpTotals, udp_token,
};

/// Bytes handed to the kernel per write by a TCP sender (iperf3's default for TCP).
const WRITE_LEN: usize = 128 << 10;
/// Bytes a sender keeps queued in a socket beyond what is in flight (`TCP_NOTSENT_LOWAT`):
/// when a test's time is up, what remains to be delivered is what the path holds, not the
/// megabytes an explicit or autotuned send buffer could hold (which would drain for seconds
/// after the test, and count in no interval).
const NOTSENT_LOWAT: u32 = 256 << 10;
/// How long a sender waits, after its last write, for the receiver to acknowledge the rest.
const DRAIN: Duration = Duration::from_secs(3);
/// How long a UDP receiver keeps listening after the sender said it finished.
const UDP_LINGER: Duration = Duration::from_millis(500);
/// Receive buffer asked for on UDP sockets, so that bursts are not dropped at the receiver.
const UDP_RCVBUF: usize = 16 << 20;

/// Sockets sampled through `TCP_INFO` every interval, each by a duplicate of its descriptor
/// (the socket stays open for sampling while its task owns the stream).
#[derive(Default)]
struct Sampler {
    socks: Vec<(u32, OwnedFd, u64, u64)>,
}

impl Sampler {
    fn add(&mut self, stream: u32, io: &Io) {
        if let Ok(fd) = io.tcp().as_fd().try_clone_to_owned() {
            let info = sys::tcp_info(&fd).unwrap_or_default();
            self.socks
                .push((stream, fd, info.bytes_acked, info.total_retrans as u64));
        }
    }

    /// What each socket did since the previous sample.
    fn sample(&mut self) -> Vec<StreamSample> {
        let mut out = Vec::with_capacity(self.socks.len());
        for (stream, fd, acked, retrans) in &mut self.socks {
            let Ok(i) = sys::tcp_info(fd) else { continue };
            out.push(StreamSample {
                stream: *stream,
                bytes: i.bytes_acked.saturating_sub(*acked),
                retransmits: (i.total_retrans as u64).saturating_sub(*retrans),
                rtt_us: i.rtt,
                cwnd_bytes: i.snd_cwnd as u64 * i.snd_mss as u64,
            });
            *acked = i.bytes_acked.max(*acked);
            *retrans = (i.total_retrans as u64).max(*retrans);
        }
        out
    }

    /// Whether every socket has had all it was given acknowledged.
    fn drained(&self) -> bool {
        self.socks.iter().all(|(_, fd, ..)| {
            sys::tcp_info(fd).is_ok_and(|i| i.unacked == 0 && i.notsent_bytes == 0)
        })
    }

    fn congestion(&self) -> String {
        self.socks
            .first()
            .and_then(|(_, fd, ..)| sys::congestion(fd).ok())
            .unwrap_or_default()
    }
}

/// Sends zeros on `io` until `until`, then closes its sending side. Returns the bytes written.
async fn send_until(mut io: Io, until: tokio::time::Instant) -> u64 {
    let buf = vec![0u8; WRITE_LEN];
    let mut sent = 0u64;
    let stop = tokio::time::sleep_until(until);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            r = io.write(&buf) => match r {
                Ok(n) if n > 0 => sent += n as u64,
                _ => return sent,
            },
            _ = &mut stop => break,
        }
    }
    let _ = tokio::time::timeout(DRAIN, io.shutdown()).await;
    // Keep the connection until the peer closes (or the drain ends), so that the last bytes
    // are not lost to a reset.
    let mut byte = [0u8; 1];
    let _ = tokio::time::timeout(DRAIN, io.read(&mut byte)).await;
    sent
}

/// Reads and discards `io` until its end (or `until`), counting into `count`; returns when
/// the first and last bytes arrived.
async fn receive_all(
    mut io: Io,
    count: Arc<AtomicU64>,
    until: tokio::time::Instant,
) -> (Option<Instant>, Option<Instant>) {
    let mut buf = vec![0u8; 256 << 10];
    let (mut first, mut last) = (None, None);
    loop {
        match tokio::time::timeout_at(until, io.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => {
                let now = Instant::now();
                first.get_or_insert(now);
                last = Some(now);
                count.fetch_add(n as u64, Ordering::Relaxed);
            }
            _ => break,
        }
    }
    (first, last)
}

fn span_ms(times: &[(Option<Instant>, Option<Instant>)]) -> u64 {
    let first = times.iter().filter_map(|t| t.0).min();
    let last = times.iter().filter_map(|t| t.1).max();
    match (first, last) {
        (Some(f), Some(l)) => l.duration_since(f).as_millis() as u64,
        _ => 0,
    }
}

/// A UDP socket for a test, with a receive buffer for bursts and a read timeout (so a
/// receiving thread notices when it should stop).
fn udp_socket(bind: SocketAddr) -> std::io::Result<UdpSocket> {
    let domain = socket2::Domain::for_address(bind);
    let s = socket2::Socket::new(domain, socket2::Type::DGRAM, Some(socket2::Protocol::UDP))?;
    let _ = s.set_recv_buffer_size(UDP_RCVBUF);
    let _ = s.set_send_buffer_size(4 << 20);
    s.bind(&bind.into())?;
    let s: UdpSocket = s.into();
    s.set_read_timeout(Some(Duration::from_millis(50)))?;
    Ok(s)
}

/// Sets a flag when dropped, on every way out of a scope: a UDP test's slot is given back,
/// its receiving thread told to stop.
struct SetOnDrop<'a>(&'a AtomicBool, bool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(self.1, Ordering::Release);
    }
}

fn same_host(a: IpAddr, b: IpAddr) -> bool {
    a.to_canonical() == b.to_canonical()
}

/// Sends paced datagrams on a connected socket for `duration`; returns how many left.
fn udp_send(
    sock: &UdpSocket,
    token: [u8; 16],
    pacer: UdpPacer,
    duration: Duration,
    stop: &AtomicBool,
) -> u64 {
    let mut buf = vec![0u8; pacer.length as usize];
    let start = Instant::now();
    let end_ns = duration.as_nanos() as u64;
    let mut sent = 0u64;
    loop {
        let now_ns = start.elapsed().as_nanos() as u64;
        if now_ns >= end_ns || stop.load(Ordering::Relaxed) {
            return sent;
        }
        // Never more than a few milliseconds' worth at once, should this thread fall behind.
        let due = pacer.due(now_ns).min(sent + 1024);
        while sent < due {
            Datagram {
                token,
                seq: sent,
                sent_ns: start.elapsed().as_nanos() as u64,
            }
            .write(&mut buf);
            // A full socket buffer (ENOBUFS) or an ICMP error from the peer: the datagram is
            // lost, as it would be on the path; the receiver counts it.
            let _ = sock.send(&buf);
            sent += 1;
        }
        let next = pacer.at(sent).min(end_ns);
        let now_ns = start.elapsed().as_nanos() as u64;
        if next > now_ns {
            std::thread::sleep(Duration::from_nanos(next - now_ns));
        }
    }
}

/// Receives a test's datagrams from `from` (an address, or only a host while the port is not
/// known) until `stop`, handing an interval to `intervals` every `every`. Returns the totals.
fn udp_receive(
    sock: &UdpSocket,
    token: [u8; 16],
    from: IpAddr,
    every: Duration,
    stop: &AtomicBool,
    start: Instant,
    intervals: mpsc::UnboundedSender<PerfInterval>,
) -> UdpTotals {
    let mut rx = UdpReceiver::default();
    let mut buf = vec![0u8; wire::perf::MAX_DATAGRAM as usize + 1];
    let mut next = start + every;
    let mut mark = start;
    while !stop.load(Ordering::Relaxed) {
        if let Ok((n, src)) = sock.recv_from(&mut buf)
            && same_host(src.ip(), from)
            && let Some(d) = Datagram::read(&buf[..n])
            && d.token == token
            && d.seq != ANNOUNCE_SEQ
        {
            rx.on_datagram(d.seq, d.sent_ns, start.elapsed().as_nanos() as u64, n);
        }
        let now = Instant::now();
        if now >= next {
            let _ = intervals.send(PerfInterval {
                start_ms: mark.duration_since(start).as_millis() as u64,
                end_ms: now.duration_since(start).as_millis() as u64,
                streams: Vec::new(),
                udp: Some(rx.interval()),
            });
            mark = now;
            next = now + every;
        }
    }
    // What arrived since the last interval, so that the intervals add up to the totals.
    let last = rx.interval();
    if last.packets > 0 || last.lost > 0 {
        let _ = intervals.send(PerfInterval {
            start_ms: mark.duration_since(start).as_millis() as u64,
            end_ms: start.elapsed().as_millis() as u64,
            streams: Vec::new(),
            udp: Some(last),
        });
    }
    rx.totals().clone()
}

/// Runs an endpoint's side of a test on its control connection: `conns` brings the data
/// streams bound to the session (TCP), `local` is the address the client reached (a UDP
/// test's socket takes the same address and port), `udp_busy` admits one UDP test at a time.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn serve(
    reader: &mut ControlReader,
    writer: &mut ControlWriter,
    key: DataKey,
    test: PerfRequest,
    conns: Option<mpsc::Receiver<DataConn>>,
    local: SocketAddr,
    peer: SocketAddr,
    udp_busy: &AtomicBool,
    handshake: Duration,
) -> Result<(), TransferError> {
    let duration = Duration::from_millis(test.duration_ms);
    let every = Duration::from_millis(test.interval_ms);
    match (test.spec, conns) {
        (
            PerfSpec::Tcp {
                streams,
                congestion,
                ..
            },
            Some(mut conns),
        ) => {
            writer
                .send_response(&Response::PerfReady { udp_port: None })
                .await?;
            match test.direction {
                Direction::Send => {
                    serve_tcp_receive(reader, writer, &mut conns, streams, duration, handshake)
                        .await
                }
                Direction::Receive => {
                    let cc = congestion.as_deref();
                    let streams = collect_streams(&mut conns, streams, handshake).await?;
                    serve_tcp_send(writer, streams, cc, duration, every).await
                }
            }
        }
        (PerfSpec::Udp { rate_bps, length }, _) => {
            if udp_busy.swap(true, Ordering::AcqRel) {
                let e = ErrorInfo::new(
                    ErrorKind::Connect,
                    "another UDP test is running on this endpoint; try again when it ends",
                );
                writer.send_response(&Response::Error(e)).await?;
                return Ok(());
            }
            let _release = SetOnDrop(udp_busy, false);
            let sock = match udp_socket(local) {
                Ok(s) => Arc::new(s),
                Err(e) => {
                    let e = ErrorInfo::new(
                        ErrorKind::Io,
                        format!("cannot open UDP port {local} for the test: {e}"),
                    );
                    writer.send_response(&Response::Error(e)).await?;
                    return Ok(());
                }
            };
            writer
                .send_response(&Response::PerfReady {
                    udp_port: Some(local.port()),
                })
                .await?;
            let token = udp_token(&key);
            let pacer = UdpPacer { rate_bps, length };
            match test.direction {
                Direction::Send => {
                    serve_udp_receive(reader, writer, sock, token, peer.ip(), duration, every).await
                }
                Direction::Receive => {
                    serve_udp_send(
                        reader, writer, sock, token, peer, pacer, duration, handshake,
                    )
                    .await
                }
            }
        }
        (PerfSpec::Tcp { .. }, None) => Err(TransferError::local("TCP test without streams")),
    }
}

/// Waits for `n` streams of the session (within `handshake`); a test runs with those that
/// came, and fails when none did.
async fn collect_streams(
    conns: &mut mpsc::Receiver<DataConn>,
    n: u32,
    handshake: Duration,
) -> Result<Vec<DataConn>, TransferError> {
    let deadline = tokio::time::Instant::now() + handshake;
    let mut got = Vec::new();
    while got.len() < n as usize {
        match tokio::time::timeout_at(deadline, conns.recv()).await {
            Ok(Some(c)) => got.push(c),
            _ => break,
        }
    }
    if got.is_empty() {
        return Err(TransferError::connect(
            "no data stream of the test arrived in time",
        ));
    }
    Ok(got)
}

async fn serve_tcp_receive(
    reader: &mut ControlReader,
    writer: &mut ControlWriter,
    conns: &mut mpsc::Receiver<DataConn>,
    n: u32,
    duration: Duration,
    handshake: Duration,
) -> Result<(), TransferError> {
    // A sender that does not stop is cut off: the test ends at the latest a drain after its
    // duration (plus the time its streams may take to arrive).
    let until = tokio::time::Instant::now() + handshake + duration + DRAIN;
    let counts: Vec<Arc<AtomicU64>> = (0..n).map(|_| Arc::default()).collect();
    let mut tasks = tokio::task::JoinSet::new();
    let mut arrived = 0u32;
    while arrived < n {
        tokio::select! {
            c = tokio::time::timeout_at(until.min(tokio::time::Instant::now() + handshake), conns.recv()) => match c {
                Ok(Some(c)) => {
                    let count = counts[c.stream.min(n - 1) as usize].clone();
                    tasks.spawn(receive_all(c.io, count, until));
                    arrived += 1;
                }
                _ => break,
            },
            r = reader.request() => match r {
                Ok(Some(Request::Cancel)) | Ok(None) | Err(_) => return Ok(()),
                Ok(Some(_)) => {}
            },
        }
    }
    let mut times = Vec::new();
    loop {
        tokio::select! {
            t = tasks.join_next() => match t {
                Some(Ok(t)) => times.push(t),
                Some(Err(_)) => {}
                None => break,
            },
            r = reader.request() => match r {
                Ok(Some(Request::Cancel)) | Ok(None) | Err(_) => return Ok(()),
                Ok(Some(_)) => {}
            },
        }
    }
    let outcome = PerfOutcome {
        received: counts.iter().map(|c| c.load(Ordering::Relaxed)).collect(),
        receive_ms: span_ms(&times),
        ..Default::default()
    };
    writer.send_response(&Response::PerfDone(outcome)).await
}

/// The senders of a TCP test and the sampling of their sockets: [`Self::next`] yields an
/// interval every `every` while they send; [`Self::finish`] then waits (up to a drain) for
/// the last bytes to be acknowledged.
struct Senders {
    sampler: Sampler,
    tasks: tokio::task::JoinSet<u64>,
    start: Instant,
    mark: Instant,
    tick: tokio::time::Interval,
}

impl Senders {
    /// Starts sending zeros on `streams` for `duration`.
    fn start(
        streams: Vec<DataConn>,
        cc: Option<&str>,
        duration: Duration,
        every: Duration,
    ) -> Self {
        let mut sampler = Sampler::default();
        let mut tasks = tokio::task::JoinSet::new();
        let until = tokio::time::Instant::now() + duration;
        for c in streams {
            if let Some(cc) = cc {
                let _ = sys::set_congestion(c.io.tcp(), cc);
            }
            let _ = sys::set_notsent_lowat(c.io.tcp(), NOTSENT_LOWAT);
            sampler.add(c.stream, &c.io);
            tasks.spawn(send_until(c.io, until));
        }
        let start = Instant::now();
        Senders {
            sampler,
            tasks,
            start,
            mark: start,
            tick: tokio::time::interval_at(tokio::time::Instant::now() + every, every),
        }
    }

    fn interval(&mut self) -> PerfInterval {
        let now = Instant::now();
        let iv = PerfInterval {
            start_ms: self.mark.duration_since(self.start).as_millis() as u64,
            end_ms: now.duration_since(self.start).as_millis() as u64,
            streams: self.sampler.sample(),
            udp: None,
        };
        self.mark = now;
        iv
    }

    /// The next interval, or `None` once every sender finished.
    async fn next(&mut self) -> Option<PerfInterval> {
        loop {
            tokio::select! {
                t = self.tasks.join_next() => {
                    // Every sender finished.
                    t.as_ref()?;
                }
                _ = self.tick.tick() => return Some(self.interval()),
            }
        }
    }

    /// After [`Self::next`] said the senders finished: the time from the start until the
    /// receiver acknowledged the last byte (or a drain passed), and the last interval.
    async fn finish(&mut self) -> (Duration, PerfInterval) {
        let drain_until = Instant::now() + DRAIN;
        while !self.sampler.drained() && Instant::now() < drain_until {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let delivered_in = self.start.elapsed();
        (delivered_in, self.interval())
    }
}

async fn serve_tcp_send(
    writer: &mut ControlWriter,
    streams: Vec<DataConn>,
    cc: Option<&str>,
    duration: Duration,
    every: Duration,
) -> Result<(), TransferError> {
    let mut senders = Senders::start(streams, cc, duration, every);
    let (mut bytes, mut retrans) = (0u64, 0u64);
    // A client that went away fails the interval's write (and its streams the senders'): the
    // test stops there.
    while let Some(iv) = senders.next().await {
        bytes += iv.bytes();
        retrans += iv.retransmits();
        if let Err(e) = writer.send_response(&Response::PerfInterval(iv)).await {
            senders.tasks.abort_all();
            return Err(e);
        }
    }
    let (sent_for, last) = senders.finish().await;
    bytes += last.bytes();
    retrans += last.retransmits();
    if !last
        .streams
        .iter()
        .all(|s| s.bytes == 0 && s.retransmits == 0)
    {
        writer.send_response(&Response::PerfInterval(last)).await?;
    }
    let outcome = PerfOutcome {
        sent_bytes: bytes,
        retransmits: retrans,
        send_ms: sent_for.as_millis() as u64,
        congestion: senders.sampler.congestion(),
        ..Default::default()
    };
    writer.send_response(&Response::PerfDone(outcome)).await
}

async fn serve_udp_receive(
    reader: &mut ControlReader,
    writer: &mut ControlWriter,
    sock: Arc<UdpSocket>,
    token: [u8; 16],
    from: IpAddr,
    duration: Duration,
    every: Duration,
) -> Result<(), TransferError> {
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, mut intervals) = mpsc::unbounded_channel();
    let thread = {
        let (sock, stop) = (sock.clone(), stop.clone());
        tokio::task::spawn_blocking(move || {
            udp_receive(&sock, token, from, every, &stop, Instant::now(), tx)
        })
    };
    let _stop = SetOnDrop(&stop, true);
    // The client says how many it sent; a client that never does is cut off after the
    // test's duration and a drain.
    let cutoff = tokio::time::sleep(duration + DRAIN);
    tokio::pin!(cutoff);
    let mut sent = 0u64;
    loop {
        tokio::select! {
            Some(iv) = intervals.recv() => {
                writer.send_response(&Response::PerfInterval(iv)).await?;
            }
            r = reader.request() => match r {
                Ok(Some(Request::PerfSent { datagrams })) => { sent = datagrams; break }
                Ok(Some(Request::Cancel)) | Ok(None) | Err(_) => return Ok(()),
                Ok(Some(_)) => {}
            },
            _ = &mut cutoff => break,
        }
    }
    tokio::time::sleep(UDP_LINGER).await;
    stop.store(true, Ordering::Relaxed);
    let totals = thread
        .await
        .map_err(|e| TransferError::local(format!("UDP receiver failed: {e}")))?;
    while let Ok(iv) = intervals.try_recv() {
        writer.send_response(&Response::PerfInterval(iv)).await?;
    }
    let outcome = PerfOutcome {
        udp_sent: sent,
        udp: Some(totals),
        ..Default::default()
    };
    writer.send_response(&Response::PerfDone(outcome)).await
}

#[allow(clippy::too_many_arguments)]
async fn serve_udp_send(
    reader: &mut ControlReader,
    writer: &mut ControlWriter,
    sock: Arc<UdpSocket>,
    token: [u8; 16],
    peer: SocketAddr,
    pacer: UdpPacer,
    duration: Duration,
    handshake: Duration,
) -> Result<(), TransferError> {
    // The client announces the address it receives on by sending from it: datagrams go only
    // there, and only if it is the control connection's host.
    let announced = {
        let sock = sock.clone();
        let deadline = Instant::now() + handshake;
        tokio::task::spawn_blocking(move || {
            let mut buf = [0u8; 256];
            while Instant::now() < deadline {
                if let Ok((n, src)) = sock.recv_from(&mut buf)
                    && same_host(src.ip(), peer.ip())
                    && Datagram::read(&buf[..n])
                        .is_some_and(|d| d.token == token && d.seq == ANNOUNCE_SEQ)
                {
                    return Some(src);
                }
            }
            None
        })
    };
    let Ok(Some(to)) = announced.await else {
        let e = ErrorInfo::new(
            ErrorKind::Connect,
            "no UDP datagram of the client arrived: is UDP to this port blocked?",
        );
        return writer.send_response(&Response::Error(e)).await;
    };
    sock.connect(to)
        .map_err(|e| TransferError::local(format!("UDP connect to {to}: {e}")))?;
    let stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let (sock, stop) = (sock.clone(), stop.clone());
        tokio::task::spawn_blocking(move || udp_send(&sock, token, pacer, duration, &stop))
    };
    tokio::pin!(thread);
    let start = Instant::now();
    let sent = loop {
        tokio::select! {
            r = &mut thread => break r.unwrap_or(0),
            r = reader.request() => match r {
                Ok(Some(Request::Cancel)) | Ok(None) | Err(_) => {
                    stop.store(true, Ordering::Relaxed);
                    let _ = thread.await;
                    return Ok(());
                }
                Ok(Some(_)) => {}
            },
        }
    };
    let outcome = PerfOutcome {
        udp_sent: sent,
        sent_bytes: sent * pacer.length as u64,
        send_ms: start.elapsed().as_millis() as u64,
        ..Default::default()
    };
    writer.send_response(&Response::PerfDone(outcome)).await
}

/// What the client asks for.
#[derive(Clone)]
pub struct PerfOptions {
    pub test: PerfRequest,
    /// Private data streams: TLS settings to open them with.
    pub stream_tls: Option<ClientTls>,
}

/// One side's totals in a report.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SideTotals {
    pub bytes: u64,
    pub seconds: f64,
    pub bits_per_second: f64,
    pub retransmits: u64,
}

impl SideTotals {
    fn new(bytes: u64, seconds: f64, retransmits: u64) -> Self {
        Self {
            bytes,
            seconds,
            bits_per_second: if seconds > 0.0 {
                bytes as f64 * 8.0 / seconds
            } else {
                0.0
            },
            retransmits,
        }
    }
}

/// A UDP test's result, as the receiver counted it against what the sender sent.
#[derive(Clone, Debug, Default, Serialize)]
pub struct UdpResult {
    pub sent: u64,
    pub received: u64,
    pub lost: u64,
    pub loss_percent: f64,
    pub jitter_ms: f64,
    pub out_of_order: u64,
    pub duplicates: u64,
}

impl UdpResult {
    fn new(sent: u64, t: &UdpTotals) -> Self {
        let lost = t.lost(sent);
        Self {
            sent,
            received: t.received,
            lost,
            loss_percent: if sent > 0 {
                lost as f64 * 100.0 / sent as f64
            } else {
                0.0
            },
            jitter_ms: t.jitter_ns as f64 / 1e6,
            out_of_order: t.out_of_order,
            duplicates: t.duplicates,
        }
    }
}

/// The result of one test.
#[derive(Clone, Debug, Serialize)]
pub struct PerfReport {
    pub protocol: &'static str,
    pub direction: &'static str,
    pub streams: u32,
    pub congestion: String,
    pub intervals: Vec<PerfInterval>,
    pub sender: SideTotals,
    pub receiver: SideTotals,
    pub udp: Option<UdpResult>,
}

/// Runs one test on `session` (a welcomed control connection), calling `on_interval` with each
/// interval as it is measured.
pub async fn run(
    session: &mut conn::Session,
    opts: &PerfOptions,
    mut on_interval: impl FnMut(&PerfInterval),
) -> Result<PerfReport, TransferError> {
    let (id, key): (SessionId, DataKey) = (rand::random(), rand::random());
    let test = opts.test.clone();
    session
        .send(&Request::Perf {
            session: id,
            key,
            test: test.clone(),
        })
        .await?;
    let udp_port = match tokio::time::timeout(conn::HANDSHAKE_TIMEOUT, session.reader.response())
        .await
        .map_err(|_| TransferError::connect("the endpoint did not answer the test request"))??
    {
        Response::PerfReady { udp_port } => udp_port,
        Response::Error(e) => return Err(e.into()),
        other => {
            return Err(TransferError::protocol(format!(
                "unexpected answer to a test request: {other:?}"
            )));
        }
    };
    let mut intervals = Vec::new();
    let mut on = |iv: PerfInterval| {
        on_interval(&iv);
        intervals.push(iv);
    };
    let duration = Duration::from_millis(test.duration_ms);
    let every = Duration::from_millis(test.interval_ms);
    let mut report = match test.spec {
        PerfSpec::Tcp {
            streams,
            buffer,
            ref congestion,
            ..
        } => {
            let target = StreamTarget {
                addr: conn::format_addr(&session.host, session.port),
                host: session.host.clone(),
                tls: opts.stream_tls.clone(),
                session: id,
                key,
                buffer,
                limits: HostLimits::default(),
                confirm_bind: true,
                hold_hello: false,
            };
            let conns = open_all(&target, streams).await?;
            match test.direction {
                Direction::Send => {
                    client_tcp_send(
                        session,
                        conns,
                        congestion.as_deref(),
                        duration,
                        every,
                        &mut on,
                    )
                    .await?
                }
                Direction::Receive => client_tcp_receive(session, conns, duration, &mut on).await?,
            }
        }
        PerfSpec::Udp { rate_bps, length } => {
            let port = udp_port.ok_or_else(|| {
                TransferError::protocol("the endpoint named no UDP port for the test")
            })?;
            let (_, _, ip) = session.path();
            let ip = ip.ok_or_else(|| TransferError::local("the endpoint's address is unknown"))?;
            let to = SocketAddr::new(ip, port);
            let pacer = UdpPacer { rate_bps, length };
            let token = udp_token(&key);
            match test.direction {
                Direction::Send => {
                    client_udp_send(session, to, token, pacer, duration, &mut on).await?
                }
                Direction::Receive => {
                    client_udp_receive(session, to, token, duration, every, &mut on).await?
                }
            }
        }
    };
    report.intervals = intervals;
    Ok(report)
}

/// Opens `n` data streams of the session at once.
async fn open_all(target: &StreamTarget, n: u32) -> Result<Vec<DataConn>, TransferError> {
    let mut opening = tokio::task::JoinSet::new();
    for i in 0..n {
        let t = target.clone();
        opening.spawn(async move { conn::open_data_stream(&t, i).await });
    }
    let mut conns = Vec::new();
    while let Some(r) = opening.join_next().await {
        conns.push(r.map_err(|e| TransferError::local(format!("opening a stream: {e}")))??);
    }
    conns.sort_by_key(|c| c.stream);
    Ok(conns)
}

/// Reads the endpoint's messages until its `PerfDone`, handing intervals to `on`.
async fn await_outcome(
    session: &mut conn::Session,
    limit: Duration,
    on: &mut impl FnMut(PerfInterval),
) -> Result<PerfOutcome, TransferError> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let r = tokio::time::timeout_at(deadline, session.reader.response())
            .await
            .map_err(|_| {
                TransferError::stalled("the endpoint did not finish the test in time")
            })??;
        match r {
            Response::PerfInterval(iv) => on(iv),
            Response::PerfDone(o) => return Ok(o),
            Response::Error(e) => return Err(e.into()),
            other => tracing::debug!(?other, "unexpected message during a test"),
        }
    }
}

async fn client_tcp_send(
    session: &mut conn::Session,
    conns: Vec<DataConn>,
    cc: Option<&str>,
    duration: Duration,
    every: Duration,
    on: &mut impl FnMut(PerfInterval),
) -> Result<PerfReport, TransferError> {
    let n = conns.len() as u32;
    let mut senders = Senders::start(conns, cc, duration, every);
    let (mut bytes, mut retrans) = (0u64, 0u64);
    while let Some(iv) = senders.next().await {
        bytes += iv.bytes();
        retrans += iv.retransmits();
        on(iv);
    }
    let (sent_for, last) = senders.finish().await;
    bytes += last.bytes();
    retrans += last.retransmits();
    if !last
        .streams
        .iter()
        .all(|s| s.bytes == 0 && s.retransmits == 0)
    {
        on(last);
    }
    let o = await_outcome(session, DRAIN * 4, &mut |_| {}).await?;
    Ok(PerfReport {
        protocol: "tcp",
        direction: Direction::Send.name(),
        streams: n,
        congestion: senders.sampler.congestion(),
        intervals: Vec::new(),
        sender: SideTotals::new(bytes, sent_for.as_secs_f64(), retrans),
        receiver: SideTotals::new(o.received.iter().sum(), o.receive_ms as f64 / 1e3, 0),
        udp: None,
    })
}

async fn client_tcp_receive(
    session: &mut conn::Session,
    conns: Vec<DataConn>,
    duration: Duration,
    on: &mut impl FnMut(PerfInterval),
) -> Result<PerfReport, TransferError> {
    let n = conns.len() as u32;
    let until = tokio::time::Instant::now() + duration + DRAIN * 4;
    let count = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for c in conns {
        tasks.spawn(receive_all(c.io, count.clone(), until));
    }
    let o = await_outcome(session, duration + DRAIN * 4, on).await?;
    let mut times = Vec::new();
    while let Ok(Some(Ok(t))) = tokio::time::timeout(DRAIN, tasks.join_next()).await {
        times.push(t);
    }
    tasks.abort_all();
    Ok(PerfReport {
        protocol: "tcp",
        direction: Direction::Receive.name(),
        streams: n,
        congestion: o.congestion.clone(),
        intervals: Vec::new(),
        sender: SideTotals::new(o.sent_bytes, o.send_ms as f64 / 1e3, o.retransmits),
        receiver: SideTotals::new(
            count.load(Ordering::Relaxed),
            span_ms(&times) as f64 / 1e3,
            0,
        ),
        udp: None,
    })
}

fn client_udp_socket(to: SocketAddr) -> Result<Arc<UdpSocket>, TransferError> {
    let any: SocketAddr = if to.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let sock = udp_socket(any)
        .and_then(|s| s.connect(to).map(|_| s))
        .map_err(|e| TransferError::local(format!("cannot open a UDP socket toward {to}: {e}")))?;
    Ok(Arc::new(sock))
}

async fn client_udp_send(
    session: &mut conn::Session,
    to: SocketAddr,
    token: [u8; 16],
    pacer: UdpPacer,
    duration: Duration,
    on: &mut impl FnMut(PerfInterval),
) -> Result<PerfReport, TransferError> {
    let sock = client_udp_socket(to)?;
    let stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let (sock, stop) = (sock.clone(), stop.clone());
        tokio::task::spawn_blocking(move || {
            let start = Instant::now();
            let n = udp_send(&sock, token, pacer, duration, &stop);
            (n, start.elapsed())
        })
    };
    tokio::pin!(thread);
    // Intervals come from the endpoint's receiver while we send.
    let (sent, took) = loop {
        tokio::select! {
            r = &mut thread => break r.unwrap_or((0, duration)),
            r = session.reader.response() => match r? {
                Response::PerfInterval(iv) => on(iv),
                Response::Error(e) => { stop.store(true, Ordering::Relaxed); return Err(e.into()) }
                other => tracing::debug!(?other, "unexpected message during a test"),
            },
        }
    };
    session.send(&Request::PerfSent { datagrams: sent }).await?;
    let o = await_outcome(session, DRAIN * 4, on).await?;
    let totals = o.udp.unwrap_or_default();
    Ok(PerfReport {
        protocol: "udp",
        direction: Direction::Send.name(),
        streams: 1,
        congestion: String::new(),
        intervals: Vec::new(),
        sender: SideTotals::new(sent * pacer.length as u64, took.as_secs_f64(), 0),
        receiver: SideTotals::new(totals.bytes, totals.span_us as f64 / 1e6, 0),
        udp: Some(UdpResult::new(sent, &totals)),
    })
}

async fn client_udp_receive(
    session: &mut conn::Session,
    to: SocketAddr,
    token: [u8; 16],
    duration: Duration,
    every: Duration,
    on: &mut impl FnMut(PerfInterval),
) -> Result<PerfReport, TransferError> {
    let sock = client_udp_socket(to)?;
    let mut announce = vec![0u8; DATAGRAM_HEADER];
    Datagram {
        token,
        seq: ANNOUNCE_SEQ,
        sent_ns: 0,
    }
    .write(&mut announce);
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, mut intervals) = mpsc::unbounded_channel();
    let thread = {
        let (sock, stop) = (sock.clone(), stop.clone());
        let from = to.ip();
        tokio::task::spawn_blocking(move || {
            udp_receive(&sock, token, from, every, &stop, Instant::now(), tx)
        })
    };
    // Announce our address until the endpoint starts sending (a lost announcement is sent
    // again; the endpoint takes the first).
    let mut resend = tokio::time::interval(Duration::from_millis(100));
    let deadline = tokio::time::Instant::now() + duration + DRAIN * 4;
    let mut announcing = true;
    let outcome = loop {
        tokio::select! {
            _ = resend.tick(), if announcing => { let _ = sock.send(&announce); }
            Some(iv) = intervals.recv() => {
                if iv.udp.as_ref().is_some_and(|u| u.packets > 0) { announcing = false; }
                on(iv);
            }
            r = tokio::time::timeout_at(deadline, session.reader.response()) => match r {
                Err(_) => { stop.store(true, Ordering::Relaxed); return Err(TransferError::stalled("the endpoint did not finish the test in time")) }
                Ok(r) => match r {
                    Ok(Response::PerfDone(o)) => break o,
                    Ok(Response::Error(e)) => { stop.store(true, Ordering::Relaxed); return Err(e.into()) }
                    Ok(other) => tracing::debug!(?other, "unexpected message during a test"),
                    Err(e) => { stop.store(true, Ordering::Relaxed); return Err(e) }
                },
            },
        }
    };
    tokio::time::sleep(UDP_LINGER).await;
    stop.store(true, Ordering::Relaxed);
    let totals = thread
        .await
        .map_err(|e| TransferError::local(format!("UDP receiver failed: {e}")))?;
    while let Ok(iv) = intervals.try_recv() {
        on(iv);
    }
    Ok(PerfReport {
        protocol: "udp",
        direction: Direction::Receive.name(),
        streams: 1,
        congestion: String::new(),
        intervals: Vec::new(),
        sender: SideTotals::new(outcome.sent_bytes, outcome.send_ms as f64 / 1e3, 0),
        receiver: SideTotals::new(totals.bytes, totals.span_us as f64 / 1e6, 0),
        udp: Some(UdpResult::new(outcome.udp_sent, &totals)),
    })
}
