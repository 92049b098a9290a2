//! Errors as they cross the wire: a kind the peer can act on, a message for the user, and
//! whether trying again can help.

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
    /// recorded for it. Another replica, not another attempt at this one, can help. (Last, so
    /// that the encoding of the kinds before it is unchanged.)
    SourceDamaged,
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
