//! `haul perf`, the memory-to-memory path test: what a test asks an endpoint for, what each
//! side reports, the UDP probe datagram, and the receiver's bookkeeping of UDP loss, jitter,
//! reordering and duplicates. No I/O and no clock: times come in as arguments.
//!
//! A test runs on an authenticated control connection, like a transfer (no extra daemon, no
//! extra TCP port). TCP tests bind their data streams to the session exactly as a transfer's
//! do. A UDP test uses the endpoint's port number for UDP, opened only while that one test
//! runs; each datagram carries a token derived from the session's data key, so the endpoint
//! drops anything else before looking further, and it sends datagrams only to the address the
//! client proved it owns by sending from it (never to an address a request names).
//!
//! Jitter is RFC 3550's interarrival jitter (§6.4.1, `J += (|D| - J) / 16`) over the transit
//! times of consecutive arrivals, as iperf3 reports it; "out of order" counts datagrams that
//! arrive after one with a higher sequence number (iperf3's count); loss is what the sender
//! says it sent minus the distinct datagrams that arrived.

use hmac::{KeyInit, Mac};
use serde::{Deserialize, Serialize};

/// Which way the data of a test flows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Direction {
    /// From the client to the endpoint (the client sends).
    Send,
    /// From the endpoint to the client (the endpoint sends, like iperf3 `-R`).
    Receive,
}

impl Direction {
    pub fn name(self) -> &'static str {
        match self {
            Direction::Send => "send",
            Direction::Receive => "receive",
        }
    }
}

/// What a test measures.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PerfSpec {
    /// Bulk TCP on `streams` data streams bound to the session.
    Tcp {
        streams: u32,
        /// Explicit SO_SNDBUF/SO_RCVBUF; `None` leaves autotuning on.
        buffer: Option<u64>,
        /// Congestion control of the sender's sockets; `None` keeps the host's.
        congestion: Option<String>,
        /// Data streams are TLS connections (measures what `--protect private` costs).
        private: bool,
    },
    /// UDP datagrams of `length` bytes paced at `rate_bps`.
    Udp { rate_bps: u64, length: u32 },
}

/// A test, as the client asks for it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PerfRequest {
    pub spec: PerfSpec,
    pub direction: Direction,
    /// How long the sender sends.
    pub duration_ms: u64,
    /// Reporting interval of the sender's samples.
    pub interval_ms: u64,
}

/// What one TCP stream did in an interval, from its sender's `TCP_INFO`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamSample {
    pub stream: u32,
    /// Bytes acknowledged by the receiver in the interval.
    pub bytes: u64,
    /// Segments retransmitted in the interval.
    pub retransmits: u64,
    /// Smoothed round trip time at the end of the interval, microseconds.
    pub rtt_us: u32,
    /// Congestion window at the end of the interval, bytes.
    pub cwnd_bytes: u64,
}

/// One reporting interval, from the sending side (TCP) or the receiving side (UDP).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PerfInterval {
    /// Milliseconds since the sender started.
    pub start_ms: u64,
    pub end_ms: u64,
    pub streams: Vec<StreamSample>,
    pub udp: Option<UdpInterval>,
}

impl PerfInterval {
    pub fn bytes(&self) -> u64 {
        match &self.udp {
            Some(u) => u.bytes,
            None => self.streams.iter().map(|s| s.bytes).sum(),
        }
    }

    pub fn retransmits(&self) -> u64 {
        self.streams.iter().map(|s| s.retransmits).sum()
    }
}

/// What a UDP receiver saw in one interval.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UdpInterval {
    pub packets: u64,
    pub bytes: u64,
    /// Datagrams missing from the sequence numbers that arrived in the interval.
    pub lost: u64,
    /// RFC 3550 jitter at the end of the interval, nanoseconds.
    pub jitter_ns: u64,
    pub out_of_order: u64,
}

/// What the endpoint reports at the end of a test.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PerfOutcome {
    /// As the endpoint's receiver counted them (a test it received): payload bytes per stream,
    /// and the time from its first byte to its last.
    pub received: Vec<u64>,
    pub receive_ms: u64,
    /// As the endpoint's sender counted them (a test it sent): bytes acknowledged and
    /// segments retransmitted in all; for UDP, datagrams sent.
    pub sent_bytes: u64,
    pub retransmits: u64,
    pub send_ms: u64,
    pub udp_sent: u64,
    /// The endpoint's UDP receiver's totals (a UDP test it received).
    pub udp: Option<UdpTotals>,
    /// Congestion control the endpoint's sockets used.
    pub congestion: String,
}

/// A UDP receiver's totals.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UdpTotals {
    /// Distinct datagrams received.
    pub received: u64,
    pub bytes: u64,
    pub duplicates: u64,
    pub out_of_order: u64,
    /// RFC 3550 interarrival jitter, nanoseconds.
    pub jitter_ns: u64,
    /// Highest sequence number seen plus one (0: none).
    pub highest: u64,
    /// From the first datagram to the last, microseconds.
    pub span_us: u64,
}

impl UdpTotals {
    /// Datagrams lost of `sent`.
    pub fn lost(&self, sent: u64) -> u64 {
        sent.saturating_sub(self.received)
    }
}

/// Largest datagram a test may ask for (jumbo frames), and the smallest (the header).
pub const MAX_DATAGRAM: u32 = 9000;
pub const DATAGRAM_HEADER: usize = 4 + 16 + 8 + 8;
const DATAGRAM_MAGIC: &[u8; 4] = b"HAUP";

/// The token every datagram of a test carries, derived from the session's data key: only the
/// two ends of the authenticated control connection know it.
pub fn udp_token(key: &[u8; 32]) -> [u8; 16] {
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).expect("any key length");
    mac.update(b"longhaul perf udp v1");
    let out = mac.finalize().into_bytes();
    let mut t = [0u8; 16];
    t.copy_from_slice(&out[..16]);
    t
}

/// A UDP probe datagram's header: `HAUP | token(16) | seq u64 | send time ns u64`, then zeros
/// up to the test's length. Sequence number `u64::MAX` is the client's "this is my address"
/// announcement of a test the endpoint sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Datagram {
    pub token: [u8; 16],
    pub seq: u64,
    /// Sender's clock in nanoseconds since its start (only differences are used).
    pub sent_ns: u64,
}

/// Sequence number of an address announcement.
pub const ANNOUNCE_SEQ: u64 = u64::MAX;

impl Datagram {
    /// Writes the header into the start of `buf` (at least [`DATAGRAM_HEADER`] bytes).
    pub fn write(&self, buf: &mut [u8]) {
        buf[..4].copy_from_slice(DATAGRAM_MAGIC);
        buf[4..20].copy_from_slice(&self.token);
        buf[20..28].copy_from_slice(&self.seq.to_be_bytes());
        buf[28..36].copy_from_slice(&self.sent_ns.to_be_bytes());
    }

    /// Reads a datagram's header; `None` for anything that is not one.
    pub fn read(buf: &[u8]) -> Option<Datagram> {
        if buf.len() < DATAGRAM_HEADER || &buf[..4] != DATAGRAM_MAGIC {
            return None;
        }
        let u64_at = |i: usize| u64::from_be_bytes(buf[i..i + 8].try_into().expect("8 bytes"));
        let mut token = [0u8; 16];
        token.copy_from_slice(&buf[4..20]);
        Some(Datagram {
            token,
            seq: u64_at(20),
            sent_ns: u64_at(28),
        })
    }
}

/// Sequence numbers behind the highest one within which duplicates are recognised.
const DUP_WINDOW: u64 = 1 << 16;

/// The receiving side of a UDP test: counts datagrams, loss, jitter, reordering and
/// duplicates as they arrive.
#[derive(Clone, Debug)]
pub struct UdpReceiver {
    totals: UdpTotals,
    /// Bit `i` set: sequence number `highest - 1 - i` arrived (a window behind the highest).
    seen: Vec<u64>,
    first_us: Option<u64>,
    last_transit_ns: Option<i128>,
    jitter_ns: f64,
    /// Counters at the start of the current interval.
    mark: (u64, u64, u64, u64),
}

impl Default for UdpReceiver {
    fn default() -> Self {
        Self {
            totals: UdpTotals::default(),
            seen: vec![0; (DUP_WINDOW / 64) as usize],
            first_us: None,
            last_transit_ns: None,
            jitter_ns: 0.0,
            mark: (0, 0, 0, 0),
        }
    }
}

impl UdpReceiver {
    /// Where the mark of the sequence number `behind + 1` below the highest is kept.
    fn bit(behind: u64) -> Option<(usize, u64)> {
        (behind < DUP_WINDOW).then(|| ((behind / 64) as usize, 1u64 << (behind % 64)))
    }

    /// Shifts the window of seen sequence numbers by `by` (the highest moved up).
    fn shift(&mut self, by: u64) {
        if by >= DUP_WINDOW {
            self.seen.iter_mut().for_each(|w| *w = 0);
            return;
        }
        let (words, bits) = ((by / 64) as usize, (by % 64) as u32);
        let n = self.seen.len();
        for i in (0..n).rev() {
            let from = i.checked_sub(words);
            let hi = from.map(|f| self.seen[f]).unwrap_or(0);
            let lo = from
                .and_then(|f| f.checked_sub(1))
                .map(|f| self.seen[f])
                .unwrap_or(0);
            self.seen[i] = if bits == 0 {
                hi
            } else {
                (hi << bits) | (lo >> (64 - bits))
            };
        }
    }

    /// Records a datagram of `len` bytes with sequence number `seq`, sent at `sent_ns` on the
    /// sender's clock and received at `recv_ns` on ours.
    pub fn on_datagram(&mut self, seq: u64, sent_ns: u64, recv_ns: u64, len: usize) {
        let t = &mut self.totals;
        if seq >= t.highest {
            // New highest: everything between the old highest and this one is (so far)
            // missing; mark the old highest as seen in the shifted window.
            let by = seq + 1 - t.highest;
            let had_any = t.highest > 0 || t.received > 0;
            self.shift(by);
            if had_any && let Some((w, b)) = Self::bit(by - 1) {
                self.seen[w] |= b;
            }
            self.totals.highest = seq + 1;
        } else {
            let behind = self.totals.highest - 1 - seq;
            if behind == 0 {
                self.totals.duplicates += 1;
                return;
            }
            match Self::bit(behind - 1) {
                Some((w, b)) if self.seen[w] & b != 0 => {
                    self.totals.duplicates += 1;
                    return;
                }
                Some((w, b)) => self.seen[w] |= b,
                None => {}
            }
            self.totals.out_of_order += 1;
        }
        let t = &mut self.totals;
        t.received += 1;
        t.bytes += len as u64;
        let recv_us = recv_ns / 1000;
        let first = *self.first_us.get_or_insert(recv_us);
        t.span_us = recv_us.saturating_sub(first);
        let transit = recv_ns as i128 - sent_ns as i128;
        if let Some(prev) = self.last_transit_ns {
            let d = (transit - prev).unsigned_abs() as f64;
            self.jitter_ns += (d - self.jitter_ns) / 16.0;
        }
        self.last_transit_ns = Some(transit);
        t.jitter_ns = self.jitter_ns.round() as u64;
    }

    pub fn totals(&self) -> &UdpTotals {
        &self.totals
    }

    /// What arrived since the previous call (or the start).
    pub fn interval(&mut self) -> UdpInterval {
        let t = &self.totals;
        let (received, bytes, highest, ooo) = self.mark;
        self.mark = (t.received, t.bytes, t.highest, t.out_of_order);
        let packets = t.received - received;
        UdpInterval {
            packets,
            bytes: t.bytes - bytes,
            lost: (t.highest - highest).saturating_sub(packets),
            jitter_ns: t.jitter_ns,
            out_of_order: t.out_of_order - ooo,
        }
    }
}

/// When datagrams of a paced UDP sender are due: `rate_bps` over `length`-byte datagrams.
#[derive(Clone, Copy, Debug)]
pub struct UdpPacer {
    pub rate_bps: u64,
    pub length: u32,
}

impl UdpPacer {
    /// How many datagrams should have left `elapsed_ns` after the start.
    pub fn due(&self, elapsed_ns: u64) -> u64 {
        let bits_per_datagram = self.length.max(1) as u128 * 8;
        (elapsed_ns as u128 * self.rate_bps as u128 / 1_000_000_000 / bits_per_datagram) as u64
    }

    /// Nanoseconds after the start at which datagram `n` (0-based) is due.
    pub fn at(&self, n: u64) -> u64 {
        let bits = n as u128 * self.length.max(1) as u128 * 8;
        (bits * 1_000_000_000 / self.rate_bps.max(1) as u128).min(u64::MAX as u128) as u64
    }
}

/// Why a test request is refused, checked by the endpoint before it allocates anything.
pub fn check_request(req: &PerfRequest, max_ms: u64, max_streams: u32) -> Result<(), String> {
    if max_ms == 0 {
        return Err("this endpoint does not run path tests (its --perf-max-seconds is 0)".into());
    }
    if req.duration_ms == 0 || req.duration_ms > max_ms {
        return Err(format!(
            "a test of {} ms is refused: this endpoint runs tests of 1 ms to {} s (--perf-max-seconds)",
            req.duration_ms,
            max_ms / 1000
        ));
    }
    if req.interval_ms < 10 {
        return Err("the reporting interval must be at least 10 ms".into());
    }
    match &req.spec {
        PerfSpec::Tcp { streams, .. } if *streams == 0 || *streams > max_streams => Err(format!(
            "{streams} streams refused: this endpoint takes 1 to {max_streams} (--max-streams)"
        )),
        PerfSpec::Udp { length, .. }
            if (*length as usize) < DATAGRAM_HEADER || *length > MAX_DATAGRAM =>
        {
            Err(format!(
                "datagrams of {length} bytes refused: the length must be {DATAGRAM_HEADER} to {MAX_DATAGRAM}"
            ))
        }
        PerfSpec::Udp { rate_bps: 0, .. } => Err("a UDP test needs a rate above zero".into()),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datagrams_round_trip_and_garbage_is_not_one() {
        let d = Datagram {
            token: [7; 16],
            seq: 42,
            sent_ns: 1_000_000,
        };
        let mut buf = vec![0u8; 1400];
        d.write(&mut buf);
        assert_eq!(Datagram::read(&buf), Some(d));
        assert_eq!(Datagram::read(&buf[..DATAGRAM_HEADER]), Some(d));
        assert_eq!(Datagram::read(&buf[..DATAGRAM_HEADER - 1]), None);
        buf[0] = b'X';
        assert_eq!(Datagram::read(&buf), None);
        assert_eq!(Datagram::read(b""), None);
    }

    #[test]
    fn tokens_depend_on_the_key() {
        assert_eq!(udp_token(&[1; 32]), udp_token(&[1; 32]));
        assert_ne!(udp_token(&[1; 32]), udp_token(&[2; 32]));
    }

    fn receive(r: &mut UdpReceiver, seqs: &[u64]) {
        for (i, s) in seqs.iter().enumerate() {
            r.on_datagram(*s, *s * 1000, *s * 1000 + 50_000 + i as u64, 100);
        }
    }

    #[test]
    fn in_order_arrival_has_no_loss_reordering_or_jitter() {
        let mut r = UdpReceiver::default();
        for s in 0..1000 {
            r.on_datagram(s, s * 1000, s * 1000 + 5_000, 100);
        }
        let t = r.totals();
        assert_eq!(
            (t.received, t.highest, t.out_of_order, t.duplicates),
            (1000, 1000, 0, 0)
        );
        assert_eq!(t.lost(1000), 0);
        assert_eq!(t.lost(1010), 10, "the tail the sender sent counts as lost");
        assert_eq!(t.jitter_ns, 0);
        assert_eq!(t.bytes, 100_000);
    }

    #[test]
    fn gaps_late_arrivals_and_duplicates_are_told_apart() {
        let mut r = UdpReceiver::default();
        receive(&mut r, &[0, 1, 3, 4, 2, 4, 7, 9, 8, 0]);
        let t = r.totals().clone();
        // 2 and 8 came late; the second 4 and the second 0 are duplicates; 5 and 6 are lost.
        assert_eq!(t.out_of_order, 2);
        assert_eq!(t.duplicates, 2);
        assert_eq!(t.received, 8);
        assert_eq!(t.highest, 10);
        assert_eq!(t.lost(10), 2);
        let i = r.interval();
        assert_eq!((i.packets, i.lost, i.out_of_order), (8, 2, 2));
        receive(&mut r, &[10, 11]);
        let i = r.interval();
        assert_eq!((i.packets, i.lost, i.bytes), (2, 0, 200));
    }

    #[test]
    fn the_duplicate_window_survives_big_jumps() {
        let mut r = UdpReceiver::default();
        receive(&mut r, &[0, 100_000, 100_000 - 1, 100_000 - 1, 5]);
        let t = r.totals();
        assert_eq!(t.duplicates, 1);
        // 5 is beyond the window: counted as a late arrival, not a duplicate.
        assert_eq!(t.out_of_order, 2);
        assert_eq!(t.received, 4);
        // A shift by a non-multiple of 64 keeps earlier marks at the right distance.
        let mut r = UdpReceiver::default();
        receive(&mut r, &[0, 1, 70, 1, 0, 69]);
        assert_eq!(r.totals().duplicates, 2);
        assert_eq!(r.totals().out_of_order, 1);
    }

    #[test]
    fn jitter_follows_rfc3550() {
        let mut r = UdpReceiver::default();
        // Transit alternates 1 ms and 3 ms: |D| = 2 ms each time; J converges to 2 ms.
        for s in 0..400u64 {
            let transit = if s % 2 == 0 { 1_000_000 } else { 3_000_000 };
            r.on_datagram(s, s * 10_000_000, s * 10_000_000 + transit, 100);
        }
        let j = r.totals().jitter_ns;
        assert!(j.abs_diff(2_000_000) < 1000, "{j}");
        // After one step: J = |D| / 16.
        let mut r = UdpReceiver::default();
        r.on_datagram(0, 0, 1_000_000, 1);
        r.on_datagram(1, 0, 2_600_000, 1);
        assert_eq!(r.totals().jitter_ns, 100_000);
    }

    #[test]
    fn the_pacer_spreads_datagrams_at_the_rate() {
        let p = UdpPacer {
            rate_bps: 1_000_000_000,
            length: 1250,
        };
        // 1 Gbit/s of 10,000-bit datagrams: 100,000 per second, one every 10 µs.
        assert_eq!(p.due(1_000_000_000), 100_000);
        assert_eq!(p.due(9_999), 0);
        assert_eq!(p.due(10_000), 1);
        assert_eq!(p.at(1), 10_000);
        assert_eq!(p.at(100_000), 1_000_000_000);
    }

    #[test]
    fn requests_outside_the_endpoint_limits_are_refused() {
        let tcp = |streams, ms| PerfRequest {
            spec: PerfSpec::Tcp {
                streams,
                buffer: None,
                congestion: None,
                private: false,
            },
            direction: Direction::Send,
            duration_ms: ms,
            interval_ms: 1000,
        };
        assert!(check_request(&tcp(4, 10_000), 60_000, 16).is_ok());
        assert!(
            check_request(&tcp(4, 10_000), 0, 16)
                .unwrap_err()
                .contains("does not run")
        );
        assert!(check_request(&tcp(4, 61_000), 60_000, 16).is_err());
        assert!(check_request(&tcp(0, 1000), 60_000, 16).is_err());
        assert!(check_request(&tcp(17, 1000), 60_000, 16).is_err());
        let udp = |rate_bps, length| PerfRequest {
            spec: PerfSpec::Udp { rate_bps, length },
            ..tcp(1, 1000)
        };
        assert!(check_request(&udp(1_000_000, 1400), 60_000, 16).is_ok());
        assert!(check_request(&udp(0, 1400), 60_000, 16).is_err());
        assert!(check_request(&udp(1, 10), 60_000, 16).is_err());
        assert!(check_request(&udp(1, 65_000), 60_000, 16).is_err());
    }
}
