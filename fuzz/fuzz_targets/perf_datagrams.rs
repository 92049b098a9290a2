//! UDP datagrams of `haul perf` as an endpoint receives them from anyone: the header decoder
//! never panics, and any sequence of datagrams (sequence numbers, send times, arrival times
//! chosen by the input) keeps the receiver's counts consistent: distinct datagrams never
//! exceed the highest sequence number seen, and loss against what was sent never wraps.
#![no_main]
use libfuzzer_sys::fuzz_target;
use wire::perf::{DATAGRAM_HEADER, Datagram, UdpReceiver};

fuzz_target!(|bytes: &[u8]| {
    let _ = Datagram::read(bytes);
    let mut rx = UdpReceiver::default();
    let mut now = 0u64;
    for chunk in bytes.chunks(DATAGRAM_HEADER) {
        let mut buf = [0u8; DATAGRAM_HEADER];
        buf[..4].copy_from_slice(b"HAUP");
        let n = chunk.len().min(DATAGRAM_HEADER - 4);
        buf[4..4 + n].copy_from_slice(&chunk[..n]);
        let Some(d) = Datagram::read(&buf) else { continue };
        // Keep sequence numbers in a range where gaps, reordering and duplicates all occur.
        let seq = d.seq % 200_000;
        now = now.wrapping_add(d.token[0] as u64 * 1000);
        rx.on_datagram(seq, d.sent_ns, now, chunk.len());
        let _ = rx.interval();
        let t = rx.totals();
        assert!(t.received <= t.highest, "{t:?}");
        assert!(t.lost(t.highest) <= t.highest);
    }
});
