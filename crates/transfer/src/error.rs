//! Errors of the transfer engine, each with the exit code `haul` documents for it and whether
//! trying again can help.

use thiserror::Error;
use wire::error::{ErrorInfo, ErrorKind};

/// Why an operation failed: a kind from the one vocabulary ([`ErrorKind`], kept unchanged from
/// where it arose, be it this process, a data endpoint or the metadata server) and a message
/// for the user (one line, lowercase, naming the path or peer). The exit code and whether
/// trying again can help follow from the kind alone.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("{message}")]
pub struct TransferError {
    kind: ErrorKind,
    message: String,
}

impl TransferError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// Bad arguments (exit 2).
    pub fn usage(m: impl Into<String>) -> Self {
        Self::new(ErrorKind::Invalid, m)
    }

    /// The source does not exist (exit 3).
    pub fn not_found(m: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, m)
    }

    /// A host could not be reached or the connection was lost (exit 4).
    pub fn connect(m: impl Into<String>) -> Self {
        Self::new(ErrorKind::Connect, m)
    }

    /// A certificate was refused (missing, expired, of another CA) (exit 5).
    pub fn unauthenticated(m: impl Into<String>) -> Self {
        Self::new(ErrorKind::Authentication, m)
    }

    /// The identity may not do this (exit 5).
    pub fn permission_denied(m: impl Into<String>) -> Self {
        Self::new(ErrorKind::PermissionDenied, m)
    }

    /// The destination cannot take the data (exit 6).
    pub fn not_writable(m: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotWritable, m)
    }

    /// A directory to remove is not empty (exit 6).
    pub fn not_empty(m: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotEmpty, m)
    }

    /// Data did not verify (exit 7).
    pub fn integrity(m: impl Into<String>) -> Self {
        Self::new(ErrorKind::Integrity, m)
    }

    /// The source's stored copy does not match its recorded checksum or size: another replica
    /// can help, this one cannot (exit 7).
    pub fn source_damaged(m: impl Into<String>) -> Self {
        Self::new(ErrorKind::SourceDamaged, m)
    }

    /// No data moved for the stall timeout, after every retry (exit 8).
    pub fn stalled(m: impl Into<String>) -> Self {
        Self::new(ErrorKind::Stalled, m)
    }

    /// The peer broke the protocol (exit 9).
    pub fn protocol(m: impl Into<String>) -> Self {
        Self::new(ErrorKind::Protocol, m)
    }

    /// Some files failed, others were copied (exit 1).
    pub fn partial(failed: u64, total: u64, first: &str) -> Self {
        Self::new(
            ErrorKind::Partial,
            format!("{failed} of {total} files failed; first: {first}"),
        )
    }

    /// Any other local failure (exit 1).
    pub fn local(m: impl Into<String>) -> Self {
        Self::new(ErrorKind::Io, m)
    }

    /// Interrupted by the user (exit 130).
    pub fn interrupted() -> Self {
        Self::new(ErrorKind::Cancelled, "interrupted")
    }

    /// The server is a metadata server, not a data endpoint: the caller should use the grid
    /// client instead (exit 2 if nothing does).
    pub fn is_metadata_server(m: impl Into<String>) -> Self {
        Self::new(ErrorKind::IsMetadataServer, m)
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    /// The same kind of error, told another way (a summary of several attempts).
    pub fn with_message(self, message: impl Into<String>) -> Self {
        Self::new(self.kind, message)
    }

    /// The exit code `haul` uses for this error (README, "Exit codes").
    pub fn exit_code(&self) -> i32 {
        exit_code_of(self.kind)
    }

    /// A certificate or an identity was refused, or it may not do this (exit 5).
    pub fn is_refusal(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::PermissionDenied | ErrorKind::Authentication | ErrorKind::Unmapped
        )
    }

    /// Whether a new attempt (resuming) can help.
    pub fn retryable(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::Connect
                | ErrorKind::Unavailable
                | ErrorKind::Stalled
                | ErrorKind::Integrity
                | ErrorKind::SourceDamaged
        )
    }

    /// The error as it travels to a peer.
    pub fn to_info(&self) -> ErrorInfo {
        ErrorInfo::new(self.kind, self.message.clone()).retryable(self.retryable())
    }
}

/// An error as `--json` shows it: `{"kind": "no_space", "exit_code": 6, "message": "..."}`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ErrorReport {
    /// [`ErrorKind::name`].
    pub kind: &'static str,
    pub exit_code: i32,
    pub message: String,
}

impl From<&TransferError> for ErrorReport {
    fn from(e: &TransferError) -> Self {
        Self {
            kind: e.kind.name(),
            exit_code: e.exit_code(),
            message: e.message.clone(),
        }
    }
}

impl From<&ErrorInfo> for ErrorReport {
    fn from(e: &ErrorInfo) -> Self {
        Self {
            kind: e.kind.name(),
            exit_code: exit_code_of(e.kind),
            message: e.message.clone(),
        }
    }
}

/// A file that could not be copied, as `--json` lists it: its path beside an [`ErrorReport`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct FileFailure {
    pub path: String,
    #[serde(flatten)]
    pub error: ErrorReport,
}

/// The exit code of each kind: the one table behind every exit of `haul`.
pub fn exit_code_of(kind: ErrorKind) -> i32 {
    use ErrorKind as K;
    match kind {
        K::Invalid | K::Unsupported | K::IsMetadataServer => 2,
        K::NotFound => 3,
        K::Connect | K::Unavailable => 4,
        K::PermissionDenied | K::Authentication | K::Unmapped => 5,
        K::PathEscapesRoot
        | K::NoSpace
        | K::NotWritable
        | K::NotEmpty
        | K::Exists
        | K::NotADirectory
        | K::IsADirectory
        | K::Busy => 6,
        K::Integrity | K::SourceDamaged => 7,
        K::Stalled => 8,
        K::Protocol => 9,
        K::Io | K::Partial => 1,
        K::Cancelled => 130,
    }
}

impl From<ErrorInfo> for TransferError {
    fn from(e: ErrorInfo) -> Self {
        Self::new(e.kind, e.message)
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
            TransferError::usage(String::new()),
            TransferError::not_found(String::new()),
            TransferError::connect(String::new()),
            TransferError::unauthenticated(String::new()),
            TransferError::not_writable(String::new()),
            TransferError::integrity(String::new()),
            TransferError::stalled(String::new()),
            TransferError::protocol(String::new()),
        ];
        let codes: std::collections::HashSet<_> = all.iter().map(|e| e.exit_code()).collect();
        assert_eq!(codes.len(), all.len());
    }

    /// The exit codes the README documents, kind by kind: a kind that reaches the client
    /// unchanged exits as its class says.
    #[test]
    fn every_kind_has_its_documented_exit_code() {
        use ErrorKind as K;
        let documented = [
            (2, &[K::Invalid, K::Unsupported, K::IsMetadataServer][..]),
            (3, &[K::NotFound]),
            (4, &[K::Connect, K::Unavailable]),
            (5, &[K::PermissionDenied, K::Authentication, K::Unmapped]),
            (
                6,
                &[
                    K::PathEscapesRoot,
                    K::NoSpace,
                    K::NotWritable,
                    K::NotEmpty,
                    K::Exists,
                    K::NotADirectory,
                    K::IsADirectory,
                    K::Busy,
                ],
            ),
            (7, &[K::Integrity, K::SourceDamaged]),
            (8, &[K::Stalled]),
            (9, &[K::Protocol]),
            (1, &[K::Io, K::Partial]),
            (130, &[K::Cancelled]),
        ];
        let mut seen = 0;
        for (code, kinds) in documented {
            for k in kinds {
                let e = TransferError::from(ErrorInfo::new(*k, "x"));
                assert_eq!(e.kind(), *k);
                assert_eq!(e.exit_code(), code, "{k:?}");
                seen += 1;
            }
        }
        assert_eq!(seen, ErrorKind::ALL.len());
    }

    #[test]
    fn a_damaged_source_keeps_its_kind_across_the_wire() {
        let e = TransferError::source_damaged("f: replica damaged");
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
