//! Bytes from a data stream: frame headers, block headers and every frame body decode without
//! panicking, never allocate beyond the frame limits, and re-encode to the same frame.
#![no_main]
use libfuzzer_sys::fuzz_target;
use wire::codec::FrameBuffer;
use wire::data::{self, Decoded};

fuzz_target!(|bytes: &[u8]| {
    let mut fb = FrameBuffer::new();
    fb.extend(bytes);
    while let Ok(Some((header, body))) = fb.next_frame(data::limits) {
        if let Ok(Decoded::Frame(frame)) = data::decode_any(header, &body) {
            let again = frame.encode();
            let mut fb2 = FrameBuffer::new();
            fb2.extend(&again);
            let (h2, b2) = fb2.next_frame(data::limits).expect("own encoding decodes").expect("complete");
            assert_eq!(data::decode_any(h2, &b2).expect("own encoding decodes"), Decoded::Frame(frame));
        }
    }
});
