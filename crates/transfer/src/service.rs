//! An endpoint's personality: what the data-plane engine (`endpoint`) asks of whoever
//! runs it. The engine owns connections, limits, sessions, data streams and the sink and
//! source machines; a [`Service`] decides who a client is, where what a client sends goes,
//! what it may read, and answers the requests the engine does not know itself
//! ([`Request::Service`](wire::control::Request::Service)).
//!
//! `haul serve`'s exported tree (`tree::TreeService`) is one personality; a storage
//! node (crate `node`: files named by catalog id, capabilities from the metadata server) is
//! another. A new personality (an HTTP door's, a tape front end's) implements this trait and
//! hands it to `endpoint::run` in its `EndpointConfig`. This module depends on neither: the
//! engine depends on it.

use crate::conn::{ControlReader, ControlWriter};
use crate::error::TransferError;
use crate::store::{self, Destination, Root, SourceEntry};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use wire::checksum::Digest;
use wire::control::{EntryInfo, ListedFile, Response};
use wire::data::Timestamp;
use wire::error::{ErrorInfo, ErrorKind};
use wire::grant::SignedGrant;

/// Who is on a control connection, as the service admitted it.
#[derive(Clone)]
pub struct Caller {
    /// The subject of the client's certificate (`None` on an `--insecure` endpoint).
    pub subject: Option<String>,
    /// SHA-256 fingerprint of the client's certificate: capabilities serve only the holder
    /// they name.
    pub presenter: Option<Vec<u8>>,
    /// The identity the service admitted the client as (a local account, a subject).
    pub identity: String,
    /// The tree as this client's sessions see it.
    pub root: Arc<Root>,
}

/// What [`Service::admit`] decided.
pub struct Admitted {
    pub identity: String,
    pub root: Arc<Root>,
}

/// What a source session is asked to send (the fields of an `OpenSource` request the service
/// interprets).
pub struct SourceSelection {
    pub path: String,
    pub recursive: bool,
    /// Files named explicitly instead of `path` (storage nodes).
    pub files: Vec<ListedFile>,
    pub grant: Option<SignedGrant>,
    /// Entries to list at most (a `List` request); more is refused before they are all held.
    /// `None`: no bound (a source session).
    pub limit: Option<usize>,
}

/// What a source session sends, and what it cannot (reported to the client as failed files).
#[derive(Default)]
pub struct SourceList {
    pub entries: Vec<SourceEntry>,
    pub unsendable: Vec<(String, ErrorInfo)>,
}

/// The future of a request a service serves itself.
pub type Served<'a> = Pin<Box<dyn Future<Output = Result<(), TransferError>> + Send + 'a>>;

/// What an endpoint serves (see the module documentation).
pub trait Service: Send + Sync + 'static {
    /// Admits a client with certificate subject `subject` (`None` without TLS) to the
    /// exported `base`, or refuses it with the error the client is sent.
    fn admit(&self, subject: Option<&str>, base: &Arc<Root>) -> Result<Admitted, ErrorInfo>;

    /// Answers `Stat`.
    fn stat(&self, caller: &Caller, path: &str) -> Result<Option<EntryInfo>, ErrorInfo>;

    /// How a sink session opened by `OpenSink` names what it receives.
    fn sink_naming(
        &self,
        caller: &Caller,
        dest: &str,
        into_dir: Option<bool>,
        grant: Option<&SignedGrant>,
    ) -> Result<Arc<dyn SinkNaming>, ErrorInfo>;

    /// What a source session opened by `OpenSource` sends. Blocking (the engine calls it on a
    /// blocking thread): it may walk a tree or stat many files.
    fn source_list(
        &self,
        caller: &Caller,
        request: SourceSelection,
    ) -> Result<SourceList, ErrorInfo>;

    /// Serves a [`Request::Service`](wire::control::Request::Service) with body `body`. It may
    /// go on reading requests on `reader` (a conversation of several frames) and must leave
    /// the connection at a request boundary. By default such requests are refused.
    fn serve<'a>(
        &'a self,
        caller: &'a Caller,
        body: Vec<u8>,
        reader: &'a mut ControlReader,
        writer: &'a mut ControlWriter,
    ) -> Served<'a> {
        let _ = (caller, body, reader);
        Box::pin(async move {
            let e = ErrorInfo::new(
                ErrorKind::Unsupported,
                "this endpoint serves no such request (is it a storage node?)",
            );
            writer.send_response(&Response::Error(e)).await
        })
    }
}

/// Told how the report of a committed file ended (see [`SinkNaming::committed_then`]).
pub type Settled = Box<dyn FnOnce(Result<(), ErrorInfo>) + Send>;

/// How a sink session names, creates and reports what it receives.
pub trait SinkNaming: Send + Sync {
    /// The path in the root where announced entry `announced` goes.
    fn map(&self, announced: &str) -> Result<PathBuf, ErrorInfo>;

    /// The destination as resolved: a directory receiving entries (told to the client in
    /// `SinkReady`, which pins it for retries).
    fn dest_is_dir(&self) -> bool;

    /// Whether a received file may replace an existing one under its final name.
    fn may_replace(&self, announced: &str) -> bool {
        let _ = announced;
        true
    }

    /// Creates an announced directory.
    fn make_dir(&self, root: &Root, announced: &str, mode: u32) -> Result<(), ErrorInfo> {
        self.map(announced)
            .and_then(|p| store::make_dir(root, &p, mode))
    }

    /// A received file was verified and committed under its final name: `done` is called
    /// once, from any thread, when its report is settled; an error fails the file, and the
    /// sink removes what it committed. A naming whose report waits on the network (a storage
    /// node's, on its metadata server) answers later, so the session's file-op thread goes on
    /// to other files meanwhile; by default there is nothing to report.
    fn committed_then(
        &self,
        announced: &str,
        size: u64,
        digests: &[Digest],
        mtime: Timestamp,
        done: Settled,
    ) {
        let _ = (announced, size, digests, mtime);
        done(Ok(()))
    }

    /// A resumed file was found complete under its final name (`final_path` in `root`), so
    /// nothing of it is received; `done` (called once, from any thread) settles whether it
    /// counts as done. A naming whose commits are reported (a storage node's) reports it
    /// again, for it may have been committed by a session that died before its report; by
    /// default it is done at once. `algos` are the session's checksums.
    fn found_complete_then(
        &self,
        root: &Root,
        final_path: &std::path::Path,
        begin: &wire::data::FileBegin,
        algos: &[wire::checksum::Algorithm],
        done: Settled,
    ) {
        let _ = (root, final_path, begin, algos);
        done(Ok(()))
    }

    /// An error about received file `announced` as its sender is told it; `shown` is how the
    /// endpoint's own messages name the file's path.
    fn public_error(&self, announced: &str, shown: &str, e: ErrorInfo) -> ErrorInfo {
        let _ = (announced, shown);
        e
    }

    /// Where received files go when not to files under the root: a memory target takes
    /// their verified blocks instead (no temporary file, ledger, claim or rename; a file
    /// given up is not resumed). Its `committed_then` must settle `Ok`: the sink does not
    /// undo a commit to memory. By default files are written to the root.
    fn memory(&self) -> Option<&dyn MemoryTarget> {
        None
    }
}

/// Received files kept in memory rather than written to disk (see [`SinkNaming::memory`]): a
/// client that consumes what it receives at once (a mount's block cache) spares the copy into
/// the page cache and the reading back.
pub trait MemoryTarget: Send + Sync {
    /// File `announced` of `size` bytes starts arriving.
    fn open(&self, announced: &str, size: u64) -> Result<Arc<dyn MemoryFile>, ErrorInfo>;
}

/// One file being received into memory. Blocks arrive verified (their CRC32C checked), in
/// any order, perhaps more than once (a resend after a lost acknowledgement); the blocks of
/// one file are written by one thread at a time.
pub trait MemoryFile: Send + Sync {
    /// Stores `data` at `offset` (offsets count from the start of what is sent).
    fn write_at(&self, offset: u64, data: &[u8]) -> std::io::Result<()>;
    /// Reads back `buf.len()` bytes at `offset` (for checksums computed in file order).
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()>;
    /// Every byte arrived and was verified.
    fn commit(&self) -> Result<(), ErrorInfo>;
    /// Given up: its data goes.
    fn discard(&self);
}

/// `cp` semantics below a destination path.
impl SinkNaming for Destination {
    fn map(&self, announced: &str) -> Result<PathBuf, ErrorInfo> {
        Ok(Destination::map(self, announced))
    }

    fn dest_is_dir(&self) -> bool {
        self.into_dir
    }
}
