//! Errors of the transfer engine, each with the exit code `haul` documents for it and whether
//! trying again can help.

use thiserror::Error;
use wire::error::{ErrorInfo, ErrorKind};

/// Why an operation failed. Messages are one line, lowercase, and name the path or peer.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum TransferError {
    /// Bad arguments (exit 2).
    #[error("{0}")]
    Usage(String),
    /// The source does not exist (exit 3).
    #[error("{0}")]
    NotFound(String),
    /// A host could not be reached or the connection was lost (exit 4).
    #[error("{0}")]
    Connect(String),
    /// Certificate refused, expired, unmapped identity, or permission denied (exit 5).
    #[error("{0}")]
    Auth(String),
    /// The destination cannot take the data: not writable, full, or outside the root (exit 6).
    #[error("{0}")]
    Destination(String),
    /// A directory to remove is not empty (exit 6, as any destination that cannot be changed
    /// so).
    #[error("{0}")]
    NotEmpty(String),
    /// Data did not verify (exit 7).
    #[error("{0}")]
    Integrity(String),
    /// The source's stored copy does not match its recorded checksum or size: another replica
    /// can help, this one cannot (exit 7, as any data that does not verify).
    #[error("{0}")]
    SourceDamaged(String),
    /// No data moved for the stall timeout, after every retry (exit 8).
    #[error("{0}")]
    Stalled(String),
    /// The peer broke the protocol (exit 9).
    #[error("{0}")]
    Protocol(String),
    /// Some files failed, others were copied (exit 1).
    #[error("{failed} of {total} files failed; first: {first}")]
    Partial {
        failed: u64,
        total: u64,
        first: String,
    },
    /// Any other local failure (exit 1).
    #[error("{0}")]
    Local(String),
    /// Interrupted by the user (exit 130).
    #[error("interrupted")]
    Interrupted,
    /// The server is a metadata server, not a data endpoint: the caller should use the grid
    /// client instead (exit 2 if nothing does).
    #[error("{0}")]
    IsMetadataServer(String),
}

impl TransferError {
    /// The exit code `haul` uses for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            TransferError::Usage(_) | TransferError::IsMetadataServer(_) => 2,
            TransferError::NotFound(_) => 3,
            TransferError::Connect(_) => 4,
            TransferError::Auth(_) => 5,
            TransferError::Destination(_) | TransferError::NotEmpty(_) => 6,
            TransferError::Integrity(_) | TransferError::SourceDamaged(_) => 7,
            TransferError::Stalled(_) => 8,
            TransferError::Protocol(_) => 9,
            TransferError::Partial { .. } | TransferError::Local(_) => 1,
            TransferError::Interrupted => 130,
        }
    }

    /// Whether a new attempt (resuming) can help.
    pub fn retryable(&self) -> bool {
        matches!(
            self,
            TransferError::Connect(_)
                | TransferError::Stalled(_)
                | TransferError::Integrity(_)
                | TransferError::SourceDamaged(_)
        )
    }

    /// The error as it travels to a peer.
    pub fn to_info(&self) -> ErrorInfo {
        let kind = match self {
            TransferError::Usage(_) | TransferError::IsMetadataServer(_) => ErrorKind::Invalid,
            TransferError::NotFound(_) => ErrorKind::NotFound,
            TransferError::Connect(_) => ErrorKind::Connect,
            TransferError::Auth(_) => ErrorKind::PermissionDenied,
            TransferError::Destination(_) | TransferError::NotEmpty(_) => ErrorKind::NotWritable,
            TransferError::Integrity(_) => ErrorKind::Integrity,
            TransferError::SourceDamaged(_) => ErrorKind::SourceDamaged,
            TransferError::Stalled(_) => ErrorKind::Stalled,
            TransferError::Protocol(_) => ErrorKind::Protocol,
            TransferError::Partial { .. } | TransferError::Local(_) => ErrorKind::Io,
            TransferError::Interrupted => ErrorKind::Cancelled,
        };
        ErrorInfo::new(kind, self.to_string()).retryable(self.retryable())
    }
}

impl From<ErrorInfo> for TransferError {
    fn from(e: ErrorInfo) -> Self {
        let m = e.message;
        match e.kind {
            ErrorKind::NotFound => TransferError::NotFound(m),
            ErrorKind::PermissionDenied | ErrorKind::Authentication | ErrorKind::Unmapped => {
                TransferError::Auth(m)
            }
            ErrorKind::PathEscapesRoot | ErrorKind::NoSpace | ErrorKind::NotWritable => {
                TransferError::Destination(m)
            }
            ErrorKind::Integrity => TransferError::Integrity(m),
            ErrorKind::SourceDamaged => TransferError::SourceDamaged(m),
            ErrorKind::Protocol => TransferError::Protocol(m),
            ErrorKind::Stalled => TransferError::Stalled(m),
            ErrorKind::Connect => TransferError::Connect(m),
            ErrorKind::Invalid | ErrorKind::Unsupported => TransferError::Usage(m),
            ErrorKind::Cancelled => TransferError::Interrupted,
            ErrorKind::Io => TransferError::Local(m),
        }
    }
}

/// The payload of the error a path gets when it would lead outside the exported root (`..`, an
/// absolute path, a symlink pointing out): recognised by type, see [`escapes_root`].
#[derive(Debug)]
pub struct EscapesRoot;

impl std::fmt::Display for EscapesRoot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a path led outside of the exported root")
    }
}

impl std::error::Error for EscapesRoot {}

/// What cap-std says when a path escapes its directory (cap-primitives' `escape_attempt`). It
/// has no error type of its own, so [`escapes_root`] is the one place that compares this text.
const CAP_STD_ESCAPE: &str = "a path led outside of the filesystem";

/// Whether `e` reports a path that would lead outside the exported root: this module's own
/// check, or cap-std's when it resolved a `..` or a symlink pointing out.
pub fn escapes_root(e: &std::io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<EscapesRoot>())
        || (e.kind() == std::io::ErrorKind::PermissionDenied
            && e.get_ref()
                .is_some_and(|inner| inner.to_string() == CAP_STD_ESCAPE))
}

/// Classifies an I/O error on a path of the data being moved.
pub fn io_info(what: &str, e: &std::io::Error) -> ErrorInfo {
    use std::io::ErrorKind as K;
    let msg = format!("{what}: {e}");
    if crate::sys::is_no_space(e) {
        return ErrorInfo::new(
            ErrorKind::NoSpace,
            format!("{what}: no space left on the destination"),
        )
        .retryable(false);
    }
    if escapes_root(e) {
        return ErrorInfo::new(
            ErrorKind::PathEscapesRoot,
            format!("{what}: path escapes the exported root"),
        );
    }
    let kind = match e.kind() {
        K::NotFound => ErrorKind::NotFound,
        K::PermissionDenied => ErrorKind::PermissionDenied,
        K::ReadOnlyFilesystem | K::NotADirectory | K::IsADirectory | K::AlreadyExists => {
            ErrorKind::NotWritable
        }
        _ => ErrorKind::Io,
    };
    ErrorInfo::new(kind, msg)
}

/// Classifies an I/O error on the destination side: a missing directory or an over-long name
/// there means the destination cannot take the file (exit 6), not that a source is missing,
/// and retrying cannot help.
pub fn dest_io_info(what: &str, e: &std::io::Error) -> ErrorInfo {
    match e.raw_os_error() {
        Some(libc::ENOENT) => ErrorInfo::new(
            ErrorKind::NotWritable,
            format!("{what}: cannot create it here ({e})"),
        ),
        Some(libc::ENAMETOOLONG) => ErrorInfo::new(
            ErrorKind::NotWritable,
            format!("{what}: name too long for the destination file system"),
        ),
        Some(libc::ELOOP) => ErrorInfo::new(
            ErrorKind::NotWritable,
            format!("{what}: a symbolic link is in the way of a temporary file; not followed"),
        ),
        Some(libc::EEXIST) => ErrorInfo::new(
            ErrorKind::NotWritable,
            format!("{what}: a temporary file of this name appeared while it was being created"),
        ),
        _ => io_info(what, e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_are_distinct_per_class() {
        let all = [
            TransferError::Usage(String::new()),
            TransferError::NotFound(String::new()),
            TransferError::Connect(String::new()),
            TransferError::Auth(String::new()),
            TransferError::Destination(String::new()),
            TransferError::Integrity(String::new()),
            TransferError::Stalled(String::new()),
            TransferError::Protocol(String::new()),
        ];
        let codes: std::collections::HashSet<_> = all.iter().map(|e| e.exit_code()).collect();
        assert_eq!(codes.len(), all.len());
    }

    #[test]
    fn a_damaged_source_keeps_its_kind_across_the_wire() {
        let e = TransferError::SourceDamaged("f: replica damaged".into());
        let info = e.to_info();
        assert_eq!(info.kind, ErrorKind::SourceDamaged);
        assert!(info.retryable);
        assert_eq!(TransferError::from(info), e);
        assert_eq!(e.exit_code(), 7);
    }

    #[test]
    fn io_errors_are_classified() {
        let e = std::io::Error::from_raw_os_error(libc::ENOSPC);
        assert_eq!(io_info("x", &e).kind, ErrorKind::NoSpace);
        let e = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        assert_eq!(io_info("x", &e).kind, ErrorKind::PermissionDenied);
        let t: TransferError =
            io_info("x", &std::io::Error::from_raw_os_error(libc::ENOSPC)).into();
        assert_eq!(t.exit_code(), 6);
        for errno in [libc::ENOENT, libc::ENAMETOOLONG, libc::ELOOP, libc::EEXIST] {
            let info = dest_io_info("x", &std::io::Error::from_raw_os_error(errno));
            assert_eq!(info.kind, ErrorKind::NotWritable, "errno {errno}");
            assert!(!info.retryable);
            assert_eq!(TransferError::from(info).exit_code(), 6);
        }
    }
}
