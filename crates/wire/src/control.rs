//! The control channel between a client and an endpoint (TLS 1.3, mutually authenticated):
//! hello, opening a sink or a source session, progress events, and the data-connection bind
//! handshake that ties each data stream to an authenticated session.
//!
//! A session is created by the client, which picks a random session id and a random 32-byte
//! data key and sends both over the authenticated control channel. Every data connection then
//! opens with a `Bind` proving knowledge of the key (HMAC-SHA256 over the session and the
//! stream index), so no connection joins a session without the control channel's authority.
//! A private (TLS) data connection's proof also covers a TLS exporter value, binding it to that
//! very TLS session. A clear one's proof cannot be bound to anything the peer could not
//! record, so replays are stopped differently: each stream index binds once per session, and a
//! session exists only while its control connection lives. The opener sends data right after
//! its `Bind` and reads the `BindResult` as the first frame coming back, so joining a session
//! costs no round trip beyond TCP's own.

use crate::checksum::{Algorithm, Digest};
use crate::codec::{self, DecodeError, FrameHeader, MAX_MESSAGE_LEN};
use crate::error::ErrorInfo;
use crate::grant::SignedGrant;
use hmac::{KeyInit, Mac};
use serde::{Deserialize, Serialize};

/// Version of the control and data protocol; peers refuse other versions. 5: error kind
/// `SourceDamaged`. 6: storage-node requests travel as `Service` frames ([`crate::node`]).
/// 7: session summaries carry the bottleneck evidence of their side. 8: path tests
/// (`haul perf`, [`crate::perf`]).
pub const PROTOCOL_VERSION: u16 = 8;

/// First bytes of a clear-text data connection (control and private data connections start with
/// a TLS ClientHello instead).
pub const DATA_MAGIC: &[u8; 8] = b"HAULDAT1";

/// First bytes of a plain control connection (`--insecure` endpoints only).
pub const CONTROL_MAGIC: &[u8; 8] = b"HAULCTL1";

/// Bytes every legitimate opening of a connection sends at once: a magic, or the start of a
/// TLS ClientHello (which is longer). An endpoint waits for them before deciding anything.
pub const OPENING_LEN: usize = 8;

/// What a new connection is, from its first [`OPENING_LEN`] bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opening {
    /// `HAULDAT1`: a clear data stream; a bind frame follows.
    ClearData,
    /// `HAULCTL1`: a plain control connection (refused unless the endpoint is `--insecure`).
    PlainControl,
    /// A TLS handshake record: a control connection or a private data stream.
    Tls,
    /// Anything else, or fewer bytes than an opening (the peer closed early): refused at once.
    NotLonghaul,
}

/// Classifies a connection by its first bytes (see [`Opening`]).
pub fn classify_opening(first: &[u8]) -> Opening {
    match first.get(..OPENING_LEN) {
        None => Opening::NotLonghaul,
        Some(m) if m == DATA_MAGIC => Opening::ClearData,
        Some(m) if m == CONTROL_MAGIC => Opening::PlainControl,
        Some([0x16, ..]) => Opening::Tls,
        Some(_) => Opening::NotLonghaul,
    }
}

pub const KIND_REQUEST: u8 = 0x40;
pub const KIND_RESPONSE: u8 = 0x41;

pub const KIND_BIND: u8 = 0x02;
pub const KIND_BIND_RESULT: u8 = 0x03;

/// Length limits of control-channel and bind frames.
pub fn limits(kind: u8) -> Option<(u32, u32)> {
    match kind {
        KIND_REQUEST | KIND_RESPONSE => Some((1, MAX_MESSAGE_LEN)),
        KIND_BIND | KIND_BIND_RESULT => Some((1, 4096)),
        _ => None,
    }
}

pub type SessionId = [u8; 16];
pub type DataKey = [u8; 32];

/// TCP buffer limits and congestion control of a host, exchanged so that each side can plan
/// streams and buffers from both ends' limits.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostLimits {
    /// `net.ipv4.tcp_rmem` maximum: the receive autotuning ceiling.
    pub tcp_rmem_max: u64,
    /// `net.ipv4.tcp_wmem` maximum: the send autotuning ceiling.
    pub tcp_wmem_max: u64,
    /// `net.core.rmem_max`: ceiling of an explicit SO_RCVBUF.
    pub core_rmem_max: u64,
    /// `net.core.wmem_max`: ceiling of an explicit SO_SNDBUF.
    pub core_wmem_max: u64,
    /// Congestion control modules the host can use.
    pub congestion: Vec<String>,
}

/// Whether data streams are encrypted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Protect {
    /// Authenticated at bind time, data in clear; integrity from block CRCs and file checksums.
    Clear,
    /// Every data stream is a TLS 1.3 connection.
    Private,
}

/// Per-session choices, set by the client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionOptions {
    pub checksums: Vec<Algorithm>,
    pub block_size: u32,
    pub protect: Protect,
    /// Congestion control for the data sockets; `None` keeps the automatic choice.
    pub congestion: Option<String>,
    /// Fail if `congestion` cannot be set (explicit user choice) rather than falling back.
    pub congestion_required: bool,
    /// Aggregate rate cap in bits per second.
    pub rate_bps: Option<u64>,
    /// Explicit SO_SNDBUF/SO_RCVBUF for data sockets.
    pub tcp_buffer: Option<u64>,
    /// Number of data streams; `None` lets the opener plan it.
    pub streams: Option<u32>,
    pub resume: bool,
    /// Files read ahead and in flight at once.
    pub concurrency: u32,
    /// fsync files before they are renamed into place.
    pub fsync: bool,
    pub stall_timeout_ms: u64,
    /// Largest number of attempts for one file after failed verification.
    pub file_attempts: u32,
    /// The session is one of several sharing the same path (node-to-node replication runs
    /// many at once): its end game sends copies only of a stuck stream's blocks, never of a
    /// merely slow one's, because duplicates would take the link from the other sessions.
    pub shared_path: bool,
}

impl SessionOptions {
    /// The block length a sender cuts files into: `block_size` within what a frame carries.
    /// (A writer recording block CRCs for the sender, as `haul mount`'s spools, uses it too,
    /// so that its chunks are the sender's blocks.)
    pub fn block_len(&self) -> u64 {
        u64::from(self.block_size).clamp(4096, crate::codec::MAX_BLOCK_LEN as u64)
    }
}

impl Default for SessionOptions {
    fn default() -> Self {
        Self {
            checksums: vec![Algorithm::Crc32c],
            block_size: 1 << 20,
            protect: Protect::Clear,
            congestion: None,
            congestion_required: false,
            rate_bps: None,
            tcp_buffer: None,
            streams: None,
            resume: false,
            concurrency: 8,
            fsync: true,
            stall_timeout_ms: 60_000,
            file_attempts: 3,
            shared_path: false,
        }
    }
}

/// Where a source endpoint pushes its data in a third-party transfer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PushTarget {
    /// `host:port` of the destination endpoint.
    pub addr: String,
    /// Name to verify the destination's certificate against.
    pub server_name: String,
    pub session: SessionId,
    pub key: DataKey,
    pub peer_limits: HostLimits,
}

/// Client to endpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    Hello {
        version: u16,
        agent: String,
        limits: HostLimits,
    },
    /// Receive files under `dest` (cp semantics: into `dest` if it is a directory). A storage
    /// node needs a `grant` for writing the files (named by their ids).
    OpenSink {
        session: SessionId,
        key: DataKey,
        dest: String,
        /// How `dest` is taken: `None` resolves it (an existing directory receives entries,
        /// anything else names the copy); `Some(true)` it must be a directory that receives
        /// entries; `Some(false)` it names the copy even if it is a directory now. A retried
        /// transfer pins what its first attempt decided (`SinkReady`), so the directory that
        /// attempt created does not make the retry copy into it.
        into_dir: Option<bool>,
        options: SessionOptions,
        grant: Option<SignedGrant>,
    },
    /// Send `path` (a file, or a tree with `recursive`), optionally only `range` (offset,
    /// length) of a file; push to `push` or wait for the client's data connections.
    OpenSource {
        session: SessionId,
        key: DataKey,
        path: String,
        recursive: bool,
        range: Option<(u64, u64)>,
        options: SessionOptions,
        push: Option<Box<PushTarget>>,
        /// Send exactly these files instead of enumerating `path` (storage nodes: locators are
        /// file ids, covered by `grant`).
        files: Vec<ListedFile>,
        grant: Option<SignedGrant>,
    },
    Stat {
        path: String,
    },
    Cancel,
    /// A request of the endpoint's own personality (a storage node's: [`crate::node`]),
    /// encoded by that personality; the engine passes it on unread.
    Service(Vec<u8>),
    /// Run a path test (`haul perf`); TCP data streams bind to `session` with `key`.
    Perf {
        session: SessionId,
        key: DataKey,
        test: crate::perf::PerfRequest,
    },
    /// The client finished sending a UDP test's datagrams: this many.
    PerfSent {
        datagrams: u64,
    },
    /// List what a source session of `path` would send (its files and directories, and what
    /// it cannot send), without sending it: answered with [`Response::Listing`] frames, the
    /// last one marked. A copy into the grid places the files from this list first.
    List {
        path: String,
        recursive: bool,
    },
}

/// Entries one answer to [`Request::List`] may have (a bigger tree is copied in parts).
pub const MAX_LISTING: usize = 1_000_000;

/// An entry of a [`Response::Listing`]: named as a source session would announce it (the
/// source's base name, then the path below it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListingEntry {
    pub rel: String,
    pub is_dir: bool,
    pub size: u64,
    pub mode: u32,
    pub mtime: crate::data::Timestamp,
}

/// A file named explicitly in a source request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListedFile {
    /// Where the file is at the endpoint (a storage node: the file id).
    pub locator: String,
    /// The name to announce to the destination.
    pub name: String,
    pub size: u64,
    pub mode: u32,
    pub mtime: crate::data::Timestamp,
    /// Checksums the file must have (from the catalog): a storage node refuses to finish
    /// sending a replica that does not match them.
    pub expect: Vec<Digest>,
}

/// Entry information returned by `Stat`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryInfo {
    pub is_dir: bool,
    pub size: u64,
    pub mode: u32,
    pub mtime: crate::data::Timestamp,
}

/// What a session did, reported by an endpoint at its end.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionSummary {
    /// Payload bytes sent or received over the network.
    pub bytes_moved: u64,
    /// Bytes not sent because the destination already had them (resume).
    pub bytes_skipped: u64,
    pub files_done: u64,
    pub files_failed: u64,
    pub streams: u32,
    /// Blocks sent again after a CRC failure or a lost stream.
    pub blocks_resent: u64,
    pub streams_lost: u32,
    /// How streams and buffers were chosen.
    pub plan: String,
    /// Congestion control actually in use on the data sockets (`cubic->bbr` after a switch).
    pub congestion: String,
    pub tcp_retransmits: u64,
    /// Switches of congestion control, each with what was observed (`losscause`).
    pub cc_decisions: Vec<crate::losscause::Decision>,
    /// What the sending side saw (a source session's), for the bottleneck report.
    pub send: Option<crate::bottleneck::SendEvidence>,
    /// What the receiving side saw (a sink session's).
    pub receive: Option<crate::bottleneck::ReceiveEvidence>,
}

/// Endpoint to client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    Welcome {
        version: u16,
        agent: String,
        /// Local identity the certificate subject is mapped to.
        identity: String,
        subject: String,
        limits: HostLimits,
    },
    SinkReady {
        /// The destination as resolved: a directory receiving entries, or a target name.
        dest_is_dir: bool,
    },
    SourceReady {
        files: u64,
        bytes: u64,
    },
    Progress {
        /// Bytes done (written, or acknowledged by the destination, plus resumed).
        bytes: u64,
        files: u64,
        /// Of `bytes`, what the destination already had (resumed, not sent again).
        skipped: u64,
    },
    FileDone {
        path: String,
        bytes: u64,
        digests: Vec<Digest>,
    },
    FileFailed {
        path: String,
        error: ErrorInfo,
    },
    Done(SessionSummary),
    Stat(Option<EntryInfo>),
    Error(ErrorInfo),
    /// An answer of the endpoint's personality to a [`Request::Service`].
    Service(Vec<u8>),
    /// The endpoint accepted a path test; a UDP test's datagrams go to `udp_port`.
    PerfReady {
        udp_port: Option<u16>,
    },
    /// A reporting interval of a test the endpoint sends (TCP) or receives (UDP).
    PerfInterval(crate::perf::PerfInterval),
    /// The endpoint's side of a finished test.
    PerfDone(crate::perf::PerfOutcome),
    /// Part of the answer to [`Request::List`]: entries in enumeration order (parents before
    /// children), the entries that cannot be sent with why, and whether this is the last part.
    Listing {
        entries: Vec<ListingEntry>,
        unsendable: Vec<(String, ErrorInfo)>,
        last: bool,
    },
}

impl Request {
    pub fn encode(&self) -> Vec<u8> {
        codec::encode_message(KIND_REQUEST, self)
    }
}

impl Response {
    pub fn encode(&self) -> Vec<u8> {
        codec::encode_message(KIND_RESPONSE, self)
    }
}

/// Decodes a request body (frame kind must be [`KIND_REQUEST`]).
pub fn decode_request(header: FrameHeader, body: &[u8]) -> Result<Request, DecodeError> {
    if header.kind != KIND_REQUEST {
        return Err(DecodeError::UnknownKind(header.kind));
    }
    codec::decode_body(body)
}

/// Decodes a response body (frame kind must be [`KIND_RESPONSE`]).
pub fn decode_response(header: FrameHeader, body: &[u8]) -> Result<Response, DecodeError> {
    if header.kind != KIND_RESPONSE {
        return Err(DecodeError::UnknownKind(header.kind));
    }
    codec::decode_body(body)
}

/// A data connection's request to join a session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bind {
    pub version: u16,
    pub session: SessionId,
    pub stream: u32,
    pub proof: [u8; 32],
    /// Limits of the connecting host, for the session's planning.
    pub limits: HostLimits,
    /// Socket buffer the opener chose for this stream; the endpoint applies it on its side
    /// too (the receiver's buffer bounds the window).
    pub buffer: Option<u64>,
}

/// The endpoint's answer to a bind.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BindResult {
    Accepted,
    Refused(ErrorInfo),
}

pub fn encode_bind(b: &Bind) -> Vec<u8> {
    codec::encode_message(KIND_BIND, b)
}
pub fn encode_bind_result(r: &BindResult) -> Vec<u8> {
    codec::encode_message(KIND_BIND_RESULT, r)
}

/// Decodes a bind-handshake frame body of the expected kind.
pub fn decode_bind_frame<T: for<'a> Deserialize<'a>>(
    expected_kind: u8,
    header: FrameHeader,
    body: &[u8],
) -> Result<T, DecodeError> {
    if header.kind != expected_kind {
        return Err(DecodeError::UnknownKind(header.kind));
    }
    codec::decode_body(body)
}

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

fn proof_mac(key: &DataKey, nonce: &[u8; 32], session: &SessionId, stream: u32) -> HmacSha256 {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC accepts any key length");
    mac.update(b"longhaul data bind v1");
    mac.update(nonce);
    mac.update(session);
    mac.update(&stream.to_be_bytes());
    mac
}

/// The nonce of a clear data connection's proof (private ones use a TLS exporter value).
pub const CLEAR_NONCE: [u8; 32] = [0; 32];

/// The proof a data connection sends: HMAC-SHA256(key, label | nonce | session | stream).
pub fn bind_proof(key: &DataKey, nonce: &[u8; 32], session: &SessionId, stream: u32) -> [u8; 32] {
    let out = proof_mac(key, nonce, session, stream)
        .finalize()
        .into_bytes();
    let mut proof = [0u8; 32];
    proof.copy_from_slice(&out);
    proof
}

/// Checks a proof in constant time.
pub fn verify_bind_proof(
    key: &DataKey,
    nonce: &[u8; 32],
    session: &SessionId,
    stream: u32,
    proof: &[u8; 32],
) -> bool {
    proof_mac(key, nonce, session, stream)
        .verify_slice(proof)
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openings_are_told_apart_by_their_first_bytes() {
        assert_eq!(classify_opening(b"HAULDAT1\x02"), Opening::ClearData);
        assert_eq!(classify_opening(b"HAULCTL1"), Opening::PlainControl);
        assert_eq!(
            classify_opening(&[0x16, 3, 1, 0, 200, 1, 0, 0]),
            Opening::Tls
        );
        // Too few bytes (the peer closed early), garbage, or an HTTP request: refused.
        for bad in [
            &b"H"[..],
            b"HAULDAT",
            &[0x16],
            b"GET / HTTP/1.0",
            b"haulctl1",
        ] {
            assert_eq!(classify_opening(bad), Opening::NotLonghaul, "{bad:?}");
        }
    }
    use crate::codec::FrameBuffer;
    use crate::error::ErrorKind;

    #[test]
    fn requests_and_responses_round_trip() {
        let reqs = vec![
            Request::Hello {
                version: 1,
                agent: "haul/0.1".into(),
                limits: HostLimits::default(),
            },
            Request::OpenSink {
                session: [1; 16],
                key: [2; 32],
                dest: "data/run1".into(),
                into_dir: Some(false),
                options: SessionOptions::default(),
                grant: Some(SignedGrant {
                    token: vec![1, 2],
                    mac: vec![3],
                }),
            },
            Request::OpenSource {
                session: [1; 16],
                key: [2; 32],
                path: "x".into(),
                recursive: true,
                range: Some((5, 10)),
                options: SessionOptions {
                    protect: Protect::Private,
                    ..Default::default()
                },
                push: Some(Box::new(PushTarget {
                    addr: "198.18.0.2:2811".into(),
                    server_name: "b".into(),
                    session: [3; 16],
                    key: [4; 32],
                    peer_limits: HostLimits {
                        tcp_rmem_max: 6 << 20,
                        ..Default::default()
                    },
                })),
                files: vec![ListedFile {
                    locator: "42".into(),
                    name: "run1.nc".into(),
                    size: 9,
                    mode: 0o644,
                    mtime: crate::data::Timestamp { secs: 1, nanos: 2 },
                    expect: vec![],
                }],
                grant: None,
            },
            Request::Stat { path: "x".into() },
            Request::Cancel,
            Request::Service(vec![1, 2, 3]),
            Request::Perf {
                session: [5; 16],
                key: [6; 32],
                test: crate::perf::PerfRequest {
                    spec: crate::perf::PerfSpec::Udp {
                        rate_bps: 1_000_000,
                        length: 1400,
                    },
                    direction: crate::perf::Direction::Receive,
                    duration_ms: 2000,
                    interval_ms: 500,
                },
            },
            Request::PerfSent { datagrams: 9 },
            Request::List {
                path: "data/tree".into(),
                recursive: true,
            },
        ];
        let mut fb = FrameBuffer::new();
        for r in &reqs {
            fb.extend(&r.encode());
        }
        for r in &reqs {
            let (h, body) = fb.next_frame(limits).unwrap().unwrap();
            assert_eq!(&decode_request(h, &body).unwrap(), r);
        }
        let resps = [
            Response::Service(vec![4]),
            Response::PerfReady {
                udp_port: Some(5811),
            },
            Response::PerfInterval(crate::perf::PerfInterval {
                start_ms: 0,
                end_ms: 1000,
                streams: vec![crate::perf::StreamSample {
                    stream: 1,
                    bytes: 5,
                    ..Default::default()
                }],
                udp: None,
            }),
            Response::PerfDone(crate::perf::PerfOutcome {
                received: vec![1, 2],
                ..Default::default()
            }),
            Response::Error(ErrorInfo::new(ErrorKind::Unmapped, "who are you")),
            Response::Listing {
                entries: vec![ListingEntry {
                    rel: "tree/a.nc".into(),
                    is_dir: false,
                    size: 7,
                    mode: 0o640,
                    mtime: crate::data::Timestamp { secs: 3, nanos: 4 },
                }],
                unsendable: vec![(
                    "tree/fifo".into(),
                    ErrorInfo::new(ErrorKind::Unsupported, "not a regular file"),
                )],
                last: true,
            },
        ];
        for resp in resps {
            fb.extend(&resp.encode());
            let (h, body) = fb.next_frame(limits).unwrap().unwrap();
            assert_eq!(decode_response(h, &body).unwrap(), resp);
            assert!(decode_request(h, &body).is_err());
        }
    }

    #[test]
    fn bind_proof_binds_every_field() {
        let key = [7u8; 32];
        let nonce = [9u8; 32];
        let p = bind_proof(&key, &nonce, &[1; 16], 3);
        assert!(verify_bind_proof(&key, &nonce, &[1; 16], 3, &p));
        assert!(!verify_bind_proof(&key, &[8; 32], &[1; 16], 3, &p));
        assert!(!verify_bind_proof(&key, &nonce, &[2; 16], 3, &p));
        assert!(!verify_bind_proof(&key, &nonce, &[1; 16], 4, &p));
        assert!(!verify_bind_proof(&[6; 32], &nonce, &[1; 16], 3, &p));
    }
}
