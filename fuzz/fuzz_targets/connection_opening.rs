//! The first bytes of a connection on an endpoint's port, as an unauthenticated peer sends
//! them: classified without panicking; for a clear data stream, the bind frame that follows
//! decodes without panicking, and its session proof verifies only if it was made with the
//! session's key.
#![no_main]
use libfuzzer_sys::fuzz_target;
use wire::codec::FrameBuffer;
use wire::control::{self, Bind, Opening};

const KEY: [u8; 32] = [7; 32];

fuzz_target!(|bytes: &[u8]| {
    let opening = control::classify_opening(bytes);
    let rest = bytes.get(control::OPENING_LEN..).unwrap_or_default();
    match opening {
        Opening::ClearData => {
            let mut fb = FrameBuffer::new();
            fb.extend(rest);
            if let Ok(Some((header, body))) = fb.next_frame(control::limits) {
                if let Ok(bind) = control::decode_bind_frame::<Bind>(control::KIND_BIND, header, &body) {
                    let genuine = control::bind_proof(&KEY, &control::CLEAR_NONCE, &bind.session, bind.stream);
                    assert_eq!(
                        control::verify_bind_proof(&KEY, &control::CLEAR_NONCE, &bind.session, bind.stream, &bind.proof),
                        bind.proof == genuine
                    );
                }
            }
        }
        Opening::PlainControl => {
            let mut fb = FrameBuffer::new();
            fb.extend(rest);
            while let Ok(Some((header, body))) = fb.next_frame(control::limits) {
                let _ = control::decode_request(header, &body);
            }
        }
        Opening::Tls | Opening::NotLonghaul => {}
    }
});
