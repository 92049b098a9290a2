//! Errors as they cross the wire: a kind the peer can act on, a message for the user, and
//! whether trying again can help.
//!
//! [`ErrorKind`] is longhaul's one vocabulary of failures: the data plane sends it in frames,
//! the metadata server beside each gRPC status (its [`name`](ErrorKind::name)), the client
//! keeps it in its errors to decide what to do and which exit code to use, and `--json`
//! prints its name. No decision is taken on an error's message.

use serde::{Deserialize, Serialize};
use std::fmt;

/// What went wrong, in terms a peer and a user can act on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ErrorKind {
    /// The source path does not exist.
    NotFound,
    /// The identity may not do this, or the OS refused access.
    PermissionDenied,
    /// The path would leave the exported root (`..`, absolute, or a symlink pointing out).
    PathEscapesRoot,
    /// The destination file system is full.
    NoSpace,
    /// The destination cannot be written (read-only, not a directory, ...).
    NotWritable,
    /// The data did not verify against the source checksum.
    Integrity,
    /// The peer broke the protocol.
    Protocol,
    /// The peer's certificate was refused.
    Authentication,
    /// The certificate is valid but its subject is not mapped to an identity.
    Unmapped,
    /// Any other I/O failure.
    Io,
    /// No data moved for the stall timeout.
    Stalled,
    /// The operation was cancelled.
    Cancelled,
    /// The request itself is invalid (bad option, wrong kind of path, ...).
    Invalid,
    /// The peer does not support what was asked (e.g. a congestion control module).
    Unsupported,
    /// A network connection could not be made or was lost.
    Connect,
    /// The source's stored copy is damaged: its data does not match the checksum (or size)
    /// recorded for it. Another replica, not another attempt at this one, can help.
    SourceDamaged,
    // Kinds below were added with protocol version 6, after the ones above (whose encoding is
    // unchanged).
    /// A directory to remove is not empty.
    NotEmpty,
    /// The entry to create exists already.
    Exists,
    /// A path component or the target is not a directory.
    NotADirectory,
    /// A directory where a file was expected.
    IsADirectory,
    /// The entry is being written by another client.
    Busy,
    /// A service (the metadata database, a node) is unavailable for now.
    Unavailable,
    /// Some files of a transfer failed, others were done.
    Partial,
    /// The server asked is a metadata server, not a data endpoint (the grid client takes over).
    IsMetadataServer,
}

impl ErrorKind {
    /// Every kind, in encoding order.
    pub const ALL: [ErrorKind; 24] = [
        ErrorKind::NotFound,
        ErrorKind::PermissionDenied,
        ErrorKind::PathEscapesRoot,
        ErrorKind::NoSpace,
        ErrorKind::NotWritable,
        ErrorKind::Integrity,
        ErrorKind::Protocol,
        ErrorKind::Authentication,
        ErrorKind::Unmapped,
        ErrorKind::Io,
        ErrorKind::Stalled,
        ErrorKind::Cancelled,
        ErrorKind::Invalid,
        ErrorKind::Unsupported,
        ErrorKind::Connect,
        ErrorKind::SourceDamaged,
        ErrorKind::NotEmpty,
        ErrorKind::Exists,
        ErrorKind::NotADirectory,
        ErrorKind::IsADirectory,
        ErrorKind::Busy,
        ErrorKind::Unavailable,
        ErrorKind::Partial,
        ErrorKind::IsMetadataServer,
    ];

    /// The kind's stable name: in `--json` output, per-file error codes, and gRPC metadata.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "not_found",
            ErrorKind::PermissionDenied => "permission_denied",
            ErrorKind::PathEscapesRoot => "path_escapes_root",
            ErrorKind::NoSpace => "no_space",
            ErrorKind::NotWritable => "not_writable",
            ErrorKind::Integrity => "integrity",
            ErrorKind::Protocol => "protocol",
            ErrorKind::Authentication => "unauthenticated",
            ErrorKind::Unmapped => "unmapped",
            ErrorKind::Io => "io",
            ErrorKind::Stalled => "stalled",
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::Invalid => "invalid",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Connect => "connect",
            ErrorKind::SourceDamaged => "source_damaged",
            ErrorKind::NotEmpty => "not_empty",
            ErrorKind::Exists => "exists",
            ErrorKind::NotADirectory => "not_a_directory",
            ErrorKind::IsADirectory => "is_a_directory",
            ErrorKind::Busy => "busy",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Partial => "partial",
            ErrorKind::IsMetadataServer => "is_metadata_server",
        }
    }

    /// The kind a [`name`](Self::name) names.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// An error as sent between peers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorInfo {
    pub kind: ErrorKind,
    pub message: String,
    pub retryable: bool,
}

impl ErrorInfo {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        let retryable = matches!(
            kind,
            ErrorKind::Integrity
                | ErrorKind::SourceDamaged
                | ErrorKind::Io
                | ErrorKind::Stalled
                | ErrorKind::Connect
        );
        Self {
            kind,
            message: message.into(),
            retryable,
        }
    }

    pub fn retryable(mut self, retryable: bool) -> Self {
        self.retryable = retryable;
        self
    }
}

impl fmt::Display for ErrorInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ErrorInfo {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_have_distinct_names_that_read_back_and_keep_their_encoding() {
        let names: std::collections::HashSet<_> = ErrorKind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(names.len(), ErrorKind::ALL.len());
        for (i, k) in ErrorKind::ALL.into_iter().enumerate() {
            assert_eq!(ErrorKind::from_name(k.name()), Some(k));
            // postcard encodes a unit variant as its index: the order above is the wire's.
            assert_eq!(postcard::to_allocvec(&k).unwrap(), vec![i as u8]);
        }
        assert_eq!(ErrorKind::from_name("no such kind"), None);
    }
}
