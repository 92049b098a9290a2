//! Bytes on a control connection or a bind handshake: requests, responses and bind frames
//! decode without panicking, and so do the storage-node messages nested in `Service` frames.
#![no_main]
use libfuzzer_sys::fuzz_target;
use wire::codec::FrameBuffer;
use wire::control::{self, Bind, BindResult, Request, Response};
use wire::node::{NodeRequest, NodeResponse};

fuzz_target!(|bytes: &[u8]| {
    let mut fb = FrameBuffer::new();
    fb.extend(bytes);
    while let Ok(Some((header, body))) = fb.next_frame(control::limits) {
        if let Ok(req) = control::decode_request(header, &body) {
            let again = req.encode();
            let mut fb2 = FrameBuffer::new();
            fb2.extend(&again);
            let (h2, b2) = fb2.next_frame(control::limits).expect("decodes").expect("complete");
            assert_eq!(control::decode_request(h2, &b2).expect("decodes"), req);
            if let Request::Service(inner) = &req
                && let Ok(node) = NodeRequest::decode(inner)
            {
                assert_eq!(NodeRequest::decode(&node.encode()).expect("decodes"), node);
            }
        }
        if let Ok(Response::Service(inner)) = control::decode_response(header, &body) {
            let _ = NodeResponse::decode(&inner);
        }
        let _ = control::decode_bind_frame::<Bind>(control::KIND_BIND, header, &body);
        let _ = control::decode_bind_frame::<BindResult>(control::KIND_BIND_RESULT, header, &body);
    }
});
