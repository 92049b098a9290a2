//! Frames of a data stream: what a source sends (file begin, blocks, file end) and what a sink
//! answers on the same connection (acks, resend requests, resume ranges, file results).
//!
//! A block frame is `header | file u64 | offset u64 | crc32c u32 | payload`; its payload is read
//! by the driver straight into a buffer (or sent with `sendfile`), so the fixed part is decoded
//! separately from the serde-encoded frames.

use crate::checksum::Digest;
use crate::codec::{self, DecodeError, FrameHeader, HEADER_LEN, MAX_BLOCK_LEN, MAX_MESSAGE_LEN};
use crate::error::ErrorInfo;
use serde::{Deserialize, Serialize};

/// Identifies a file within one transfer session.
pub type FileId = u64;

pub const KIND_BEGIN: u8 = 0x10;
pub const KIND_BLOCK: u8 = 0x11;
pub const KIND_END: u8 = 0x12;
pub const KIND_STREAM_END: u8 = 0x13;
pub const KIND_FILE_ABORT: u8 = 0x14;
pub const KIND_ACK: u8 = 0x20;
pub const KIND_NACK: u8 = 0x21;
pub const KIND_HAVE: u8 = 0x22;
pub const KIND_FILE_ACK: u8 = 0x23;
pub const KIND_ABORT: u8 = 0x24;

/// Bytes of the fixed block header that follows the frame header.
pub const BLOCK_HEADER_LEN: usize = 20;

/// Length limits (min, max) of the body of every data-stream frame kind.
pub fn limits(kind: u8) -> Option<(u32, u32)> {
    match kind {
        KIND_BLOCK => Some((
            BLOCK_HEADER_LEN as u32 + 1,
            BLOCK_HEADER_LEN as u32 + MAX_BLOCK_LEN,
        )),
        KIND_BEGIN | KIND_END | KIND_STREAM_END | KIND_FILE_ABORT | KIND_ACK | KIND_NACK
        | KIND_HAVE | KIND_FILE_ACK | KIND_ABORT => Some((0, MAX_MESSAGE_LEN)),
        _ => None,
    }
}

/// Whether an entry is a regular file or a directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EntryKind {
    File,
    Dir,
}

/// Modification time as seconds and nanoseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timestamp {
    pub secs: i64,
    pub nanos: u32,
}

impl Timestamp {
    /// The time `ns` nanoseconds after the epoch (before it when negative).
    pub fn from_unix_ns(ns: i64) -> Self {
        Self {
            secs: ns.div_euclid(1_000_000_000),
            nanos: ns.rem_euclid(1_000_000_000) as u32,
        }
    }

    /// Nanoseconds since the epoch.
    pub fn unix_ns(self) -> i64 {
        self.secs * 1_000_000_000 + self.nanos as i64
    }
}

/// Announces a file (or directory) before any of its blocks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileBegin {
    pub file: FileId,
    /// Incremented when the source restarts a file after a failed verification.
    pub attempt: u32,
    pub kind: EntryKind,
    /// Relative path below the destination, `/`-separated, validated by [`validate_relative_path`].
    pub path: String,
    /// Bytes the destination file will have.
    pub size: u64,
    /// Permission bits to give the destination.
    pub mode: u32,
    pub mtime: Timestamp,
    /// The source asks which ranges the destination already holds before sending.
    pub resume: bool,
}

/// Fixed part of a block frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockHeader {
    pub file: FileId,
    pub offset: u64,
    pub crc: u32,
}

impl BlockHeader {
    pub fn encode(&self) -> [u8; BLOCK_HEADER_LEN] {
        let mut out = [0u8; BLOCK_HEADER_LEN];
        out[..8].copy_from_slice(&self.file.to_be_bytes());
        out[8..16].copy_from_slice(&self.offset.to_be_bytes());
        out[16..].copy_from_slice(&self.crc.to_be_bytes());
        out
    }

    pub fn decode(bytes: &[u8; BLOCK_HEADER_LEN]) -> Self {
        let u64_at = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[i..i + 8]);
            u64::from_be_bytes(b)
        };
        Self {
            file: u64_at(0),
            offset: u64_at(8),
            crc: u32::from_be_bytes([bytes[16], bytes[17], bytes[18], bytes[19]]),
        }
    }

    /// Frame header plus block header for a payload of `len` bytes.
    pub fn frame_prefix(&self, len: u32) -> [u8; HEADER_LEN + BLOCK_HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN + BLOCK_HEADER_LEN];
        out[..HEADER_LEN].copy_from_slice(
            &FrameHeader {
                kind: KIND_BLOCK,
                len: BLOCK_HEADER_LEN as u32 + len,
            }
            .encode(),
        );
        out[HEADER_LEN..].copy_from_slice(&self.encode());
        out
    }
}

/// End of a file's blocks, with the source's checksums of the whole file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEnd {
    pub file: FileId,
    pub attempt: u32,
    pub digests: Vec<Digest>,
}

/// The source gives up on a file (it could not be read); the sink drops its partial copy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileAbort {
    pub file: FileId,
    pub attempt: u32,
    pub error: ErrorInfo,
}

/// Resend request for a block that failed its CRC or could not be placed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Nack {
    pub file: FileId,
    pub attempt: u32,
    pub offset: u64,
    pub len: u64,
}

/// The ranges the destination already holds, answering a `FileBegin` with `resume`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Have {
    pub file: FileId,
    pub attempt: u32,
    pub ranges: Vec<(u64, u64)>,
    /// The destination already holds the complete file (same size and mtime): nothing to send.
    pub complete: bool,
}

/// The destination's verdict on a file: committed with these checksums, or failed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileAck {
    pub file: FileId,
    pub attempt: u32,
    pub result: Result<Vec<Digest>, ErrorInfo>,
}

/// A data-stream frame other than a block (blocks are decoded by [`BlockHeader`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DataFrame {
    Begin(FileBegin),
    End(FileEnd),
    FileAbort(FileAbort),
    StreamEnd,
    /// Frames the sink has processed on this stream so far (cumulative).
    Ack(u64),
    Nack(Nack),
    Have(Have),
    FileAck(FileAck),
    /// The sink gives up on the whole session.
    Abort(ErrorInfo),
}

impl DataFrame {
    pub fn encode(&self) -> Vec<u8> {
        match self {
            DataFrame::Begin(b) => codec::encode_message(KIND_BEGIN, b),
            DataFrame::End(e) => codec::encode_message(KIND_END, e),
            DataFrame::FileAbort(a) => codec::encode_message(KIND_FILE_ABORT, a),
            DataFrame::StreamEnd => codec::encode_message(KIND_STREAM_END, &()),
            DataFrame::Ack(n) => codec::encode_message(KIND_ACK, n),
            DataFrame::Nack(n) => codec::encode_message(KIND_NACK, n),
            DataFrame::Have(h) => codec::encode_message(KIND_HAVE, h),
            DataFrame::FileAck(a) => codec::encode_message(KIND_FILE_ACK, a),
            DataFrame::Abort(e) => codec::encode_message(KIND_ABORT, e),
        }
    }

    /// Decodes the body of a non-block frame.
    pub fn decode(header: FrameHeader, body: &[u8]) -> Result<Self, DecodeError> {
        Ok(match header.kind {
            KIND_BEGIN => {
                let b: FileBegin = codec::decode_body(body)?;
                validate_relative_path(&b.path).map_err(DecodeError::Malformed)?;
                DataFrame::Begin(b)
            }
            KIND_END => DataFrame::End(codec::decode_body(body)?),
            KIND_FILE_ABORT => DataFrame::FileAbort(codec::decode_body(body)?),
            KIND_STREAM_END => {
                codec::decode_body::<()>(body)?;
                DataFrame::StreamEnd
            }
            KIND_ACK => DataFrame::Ack(codec::decode_body(body)?),
            KIND_NACK => DataFrame::Nack(codec::decode_body(body)?),
            KIND_HAVE => {
                let h: Have = codec::decode_body(body)?;
                if crate::ranges::RangeSet::from_pairs(&h.ranges).is_none() {
                    return Err(DecodeError::Malformed(
                        "empty or inverted range in Have".into(),
                    ));
                }
                DataFrame::Have(h)
            }
            KIND_FILE_ACK => DataFrame::FileAck(codec::decode_body(body)?),
            KIND_ABORT => DataFrame::Abort(codec::decode_body(body)?),
            KIND_BLOCK => {
                return Err(DecodeError::Malformed(
                    "block frames are decoded with BlockHeader".into(),
                ));
            }
            other => return Err(DecodeError::UnknownKind(other)),
        })
    }
}

/// A data-stream item as decoded from a byte buffer: a block with its payload, or a frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decoded {
    Block(BlockHeader, Vec<u8>),
    Frame(DataFrame),
}

/// Decodes one complete frame body (used by buffered readers and the fuzzer).
pub fn decode_any(header: FrameHeader, body: &[u8]) -> Result<Decoded, DecodeError> {
    if header.kind == KIND_BLOCK {
        if body.len() <= BLOCK_HEADER_LEN {
            return Err(DecodeError::Truncated);
        }
        let mut h = [0u8; BLOCK_HEADER_LEN];
        h.copy_from_slice(&body[..BLOCK_HEADER_LEN]);
        return Ok(Decoded::Block(
            BlockHeader::decode(&h),
            body[BLOCK_HEADER_LEN..].to_vec(),
        ));
    }
    DataFrame::decode(header, body).map(Decoded::Frame)
}

/// Checks a relative path from a peer: non-empty `/`-separated components, none of them `.`,
/// `..` or containing NUL, not absolute, at most 4096 bytes. Any other byte is allowed in a
/// name, as POSIX allows it (a `\` is an ordinary character in a Unix file name).
pub fn validate_relative_path(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("empty path".into());
    }
    if path.len() > 4096 {
        return Err("path longer than 4096 bytes".into());
    }
    if path.starts_with('/') {
        return Err(format!(
            "absolute path {path:?} where a relative one is required"
        ));
    }
    for part in path.split('/') {
        if part.is_empty() || part == "." || part == ".." {
            return Err(format!("path {path:?} has an empty, '.' or '..' component"));
        }
        if part.contains('\0') {
            return Err(format!("path {path:?} contains NUL"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checksum::{Algorithm, digest_bytes};
    use crate::codec::FrameBuffer;
    use crate::error::ErrorKind;
    use proptest::prelude::*;

    #[test]
    fn timestamps_from_and_to_nanoseconds() {
        assert_eq!(
            Timestamp::from_unix_ns(1_500_000_000_123).unix_ns(),
            1_500_000_000_123
        );
        assert_eq!(Timestamp::from_unix_ns(-1).secs, -1);
        assert_eq!(Timestamp::from_unix_ns(-1).nanos, 999_999_999);
    }

    fn sample_frames() -> Vec<DataFrame> {
        vec![
            DataFrame::Begin(FileBegin {
                file: 3,
                attempt: 1,
                kind: EntryKind::File,
                path: "a/b.nc".into(),
                size: 1 << 40,
                mode: 0o644,
                mtime: Timestamp {
                    secs: 1_700_000_000,
                    nanos: 5,
                },
                resume: true,
            }),
            DataFrame::End(FileEnd {
                file: 3,
                attempt: 0,
                digests: digest_bytes(&[Algorithm::Md5], b"x"),
            }),
            DataFrame::StreamEnd,
            DataFrame::FileAbort(FileAbort {
                file: 4,
                attempt: 0,
                error: ErrorInfo::new(ErrorKind::Io, "read error"),
            }),
            DataFrame::Ack(u64::MAX),
            DataFrame::Nack(Nack {
                file: 1,
                attempt: 0,
                offset: 4096,
                len: 1 << 20,
            }),
            DataFrame::Have(Have {
                file: 1,
                attempt: 0,
                ranges: vec![(0, 10), (20, 30)],
                complete: false,
            }),
            DataFrame::FileAck(FileAck {
                file: 9,
                attempt: 2,
                result: Err(ErrorInfo::new(ErrorKind::NoSpace, "disk full")),
            }),
            DataFrame::Abort(ErrorInfo::new(ErrorKind::Protocol, "bye")),
        ]
    }

    #[test]
    fn frames_round_trip_through_a_buffer() {
        let mut fb = FrameBuffer::new();
        for f in sample_frames() {
            fb.extend(&f.encode());
        }
        let block = BlockHeader {
            file: 7,
            offset: 1 << 33,
            crc: 0xdead_beef,
        };
        fb.extend(&block.frame_prefix(3));
        fb.extend(b"abc");
        for f in sample_frames() {
            let (h, body) = fb.next_frame(limits).unwrap().unwrap();
            assert_eq!(decode_any(h, &body).unwrap(), Decoded::Frame(f));
        }
        let (h, body) = fb.next_frame(limits).unwrap().unwrap();
        assert_eq!(
            decode_any(h, &body).unwrap(),
            Decoded::Block(block, b"abc".to_vec())
        );
    }

    #[test]
    fn begin_with_escaping_path_is_refused() {
        for bad in [
            "../etc/passwd",
            "/etc/passwd",
            "a//b",
            "a/./b",
            "",
            "a/b\0c",
            "a/../../b",
        ] {
            let f = DataFrame::Begin(FileBegin {
                file: 1,
                attempt: 0,
                kind: EntryKind::File,
                path: bad.into(),
                size: 1,
                mode: 0o600,
                mtime: Timestamp::default(),
                resume: false,
            });
            let bytes = f.encode();
            let mut fb = FrameBuffer::new();
            fb.extend(&bytes);
            let (h, body) = fb.next_frame(limits).unwrap().unwrap();
            assert!(decode_any(h, &body).is_err(), "{bad:?} accepted");
        }
        // A backslash is an ordinary character of a Unix name, not a separator.
        assert_eq!(validate_relative_path("a\\..\\b"), Ok(()));
        assert_eq!(validate_relative_path("dir/x\\y"), Ok(()));
    }

    #[test]
    fn oversized_block_is_refused_before_allocation() {
        let mut fb = FrameBuffer::new();
        fb.extend(
            &FrameHeader {
                kind: KIND_BLOCK,
                len: u32::MAX,
            }
            .encode(),
        );
        assert!(matches!(
            fb.next_frame(limits),
            Err(DecodeError::TooLong { .. })
        ));
    }

    proptest! {
        /// Arbitrary bytes never panic the decoder.
        #[test]
        fn arbitrary_bytes_do_not_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut fb = FrameBuffer::new();
            fb.extend(&bytes);
            while let Ok(Some((h, body))) = fb.next_frame(limits) {
                let _ = decode_any(h, &body);
            }
        }

        #[test]
        fn block_header_round_trip(file in any::<u64>(), offset in any::<u64>(), crc in any::<u32>()) {
            let h = BlockHeader { file, offset, crc };
            prop_assert_eq!(BlockHeader::decode(&h.encode()), h);
        }
    }
}
