//! Framing shared by every longhaul connection: `kind: u8 | len: u32 big-endian | body`.
//!
//! Decoding never trusts the peer: the length is checked against the per-kind limit before any
//! buffer is sized, truncated input asks for more bytes, and unknown kinds are errors.

use thiserror::Error;

/// Bytes of the frame header.
pub const HEADER_LEN: usize = 5;

/// Largest control or metadata frame body (requests, listings, manifests are batched below it).
pub const MAX_MESSAGE_LEN: u32 = 1 << 20;

/// Largest block payload a peer may send (blocks default to 1 MiB).
pub const MAX_BLOCK_LEN: u32 = 16 << 20;

/// Why bytes from a peer could not be decoded. Each closes the connection.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("unknown frame kind 0x{0:02x} (peer speaks another protocol or version)")]
    UnknownKind(u8),
    #[error("frame of kind 0x{kind:02x} is {len} bytes, over the limit of {max}")]
    TooLong { kind: u8, len: u32, max: u32 },
    #[error("frame of kind 0x{kind:02x} is {len} bytes, under the minimum of {min}")]
    TooShort { kind: u8, len: u32, min: u32 },
    #[error("malformed frame body: {0}")]
    Malformed(String),
    #[error("connection closed in the middle of a frame")]
    Truncated,
}

/// A decoded frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    pub kind: u8,
    pub len: u32,
}

impl FrameHeader {
    pub fn encode(self) -> [u8; HEADER_LEN] {
        let l = self.len.to_be_bytes();
        [self.kind, l[0], l[1], l[2], l[3]]
    }

    /// Decodes a header and checks its length against `limits`.
    pub fn decode(
        bytes: [u8; HEADER_LEN],
        limits: impl Fn(u8) -> Option<(u32, u32)>,
    ) -> Result<Self, DecodeError> {
        let kind = bytes[0];
        let len = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
        let (min, max) = limits(kind).ok_or(DecodeError::UnknownKind(kind))?;
        if len > max {
            return Err(DecodeError::TooLong { kind, len, max });
        }
        if len < min {
            return Err(DecodeError::TooShort { kind, len, min });
        }
        Ok(Self { kind, len })
    }
}

/// Encodes a serde body with postcard behind a header.
pub fn encode_message<T: serde::Serialize>(kind: u8, body: &T) -> Vec<u8> {
    let out = vec![0u8; HEADER_LEN];
    let out = postcard::to_extend(body, out).expect("serializing to a Vec cannot fail");
    let len = (out.len() - HEADER_LEN) as u32;
    let mut out = out;
    out[..HEADER_LEN].copy_from_slice(&FrameHeader { kind, len }.encode());
    out
}

/// Encodes a serde body without a header (a message nested in another frame's body).
pub fn encode_body<T: serde::Serialize>(body: &T) -> Vec<u8> {
    postcard::to_allocvec(body).expect("serializing to a Vec cannot fail")
}

/// Decodes a postcard body; trailing bytes are an error.
pub fn decode_body<'a, T: serde::Deserialize<'a>>(body: &'a [u8]) -> Result<T, DecodeError> {
    let (value, rest) =
        postcard::take_from_bytes(body).map_err(|e| DecodeError::Malformed(e.to_string()))?;
    if !rest.is_empty() {
        return Err(DecodeError::Malformed(format!(
            "{} trailing bytes",
            rest.len()
        )));
    }
    Ok(value)
}

/// Accumulates bytes from a stream and yields complete frames, for peers that read into a
/// buffer rather than frame by frame.
#[derive(Default)]
pub struct FrameBuffer {
    buf: Vec<u8>,
}

impl FrameBuffer {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn extend(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The next complete frame as (header, body), or `Ok(None)` when more bytes are needed.
    pub fn next_frame(
        &mut self,
        limits: impl Fn(u8) -> Option<(u32, u32)>,
    ) -> Result<Option<(FrameHeader, Vec<u8>)>, DecodeError> {
        if self.buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let mut h = [0u8; HEADER_LEN];
        h.copy_from_slice(&self.buf[..HEADER_LEN]);
        let header = FrameHeader::decode(h, limits)?;
        let total = HEADER_LEN + header.len as usize;
        if self.buf.len() < total {
            return Ok(None);
        }
        let body = self.buf[HEADER_LEN..total].to_vec();
        self.buf.drain(..total);
        Ok(Some((header, body)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(kind: u8) -> Option<(u32, u32)> {
        (kind == 7).then_some((1, 100))
    }

    #[test]
    fn header_round_trip_and_limits() {
        let h = FrameHeader { kind: 7, len: 42 };
        assert_eq!(FrameHeader::decode(h.encode(), limits), Ok(h));
        let big = FrameHeader { kind: 7, len: 101 }.encode();
        assert!(matches!(
            FrameHeader::decode(big, limits),
            Err(DecodeError::TooLong { .. })
        ));
        let small = FrameHeader { kind: 7, len: 0 }.encode();
        assert!(matches!(
            FrameHeader::decode(small, limits),
            Err(DecodeError::TooShort { .. })
        ));
        let unknown = FrameHeader { kind: 9, len: 1 }.encode();
        assert_eq!(
            FrameHeader::decode(unknown, limits),
            Err(DecodeError::UnknownKind(9))
        );
    }

    #[test]
    fn frame_buffer_waits_for_complete_frames() {
        let frame = encode_message(7, &("hello".to_string(), 5u32));
        let mut fb = FrameBuffer::new();
        fb.extend(&frame[..3]);
        assert_eq!(fb.next_frame(limits).unwrap(), None);
        fb.extend(&frame[3..]);
        fb.extend(&frame);
        let (h, body) = fb.next_frame(limits).unwrap().unwrap();
        assert_eq!(h.kind, 7);
        let v: (String, u32) = decode_body(&body).unwrap();
        assert_eq!(v, ("hello".to_string(), 5));
        assert!(fb.next_frame(limits).unwrap().is_some());
        assert_eq!(fb.buffered(), 0);
    }

    #[test]
    fn trailing_bytes_are_malformed() {
        let mut body = postcard::to_allocvec(&1u32).unwrap();
        body.push(0);
        assert!(matches!(
            decode_body::<u32>(&body),
            Err(DecodeError::Malformed(_))
        ));
    }
}
