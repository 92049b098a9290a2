//! What a grid error is to a program: each error kind of the one vocabulary
//! (`wire::error::ErrorKind`) as the errno a POSIX call returns.

use fuser::Errno;
use wire::error::ErrorKind as K;

/// The errno for an error of `kind`.
pub fn of_kind(kind: K) -> Errno {
    match kind {
        K::NotFound => Errno::ENOENT,
        K::PermissionDenied | K::Authentication | K::Unmapped | K::NotWritable => Errno::EACCES,
        K::PathEscapesRoot => Errno::EACCES,
        K::NoSpace => Errno::ENOSPC,
        // A damaged replica once failover is exhausted; data that did not verify.
        K::Integrity | K::SourceDamaged | K::Partial | K::Io => Errno::EIO,
        K::Protocol => Errno::EPROTO,
        K::Stalled => Errno::ETIMEDOUT,
        K::Cancelled => Errno::EINTR,
        K::Invalid | K::IsMetadataServer => Errno::EINVAL,
        K::Unsupported => Errno::EOPNOTSUPP,
        // The metadata server or every node holding the data is unreachable.
        K::Connect | K::Unavailable => Errno::ENOTCONN,
        K::NotEmpty => Errno::ENOTEMPTY,
        K::Exists => Errno::EEXIST,
        K::NotADirectory => Errno::ENOTDIR,
        K::IsADirectory => Errno::EISDIR,
        K::Busy => Errno::EBUSY,
    }
}

/// The errno for a local I/O error (the cache or the write spool).
pub fn of_io(e: &std::io::Error) -> Errno {
    match e.raw_os_error() {
        Some(n) => Errno::from_i32(n),
        None => Errno::EIO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_errno() {
        let want = [
            (K::NotFound, Errno::ENOENT),
            (K::PermissionDenied, Errno::EACCES),
            (K::NoSpace, Errno::ENOSPC),
            (K::SourceDamaged, Errno::EIO),
            (K::Integrity, Errno::EIO),
            (K::Connect, Errno::ENOTCONN),
            (K::Unavailable, Errno::ENOTCONN),
            (K::Stalled, Errno::ETIMEDOUT),
            (K::NotEmpty, Errno::ENOTEMPTY),
            (K::Exists, Errno::EEXIST),
            (K::NotADirectory, Errno::ENOTDIR),
            (K::IsADirectory, Errno::EISDIR),
            (K::Unsupported, Errno::EOPNOTSUPP),
        ];
        for (k, e) in want {
            assert_eq!(of_kind(k), e, "{k:?}");
        }
        // No kind falls through to a success or to ENOSYS.
        for k in K::ALL {
            assert_ne!(of_kind(k), Errno::ENOSYS, "{k:?}");
        }
    }
}
