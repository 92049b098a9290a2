//! The metadata server's gRPC API (`proto/haul/meta/v1/meta.proto`) and its generated code,
//! nothing else: clients, storage nodes and the metadata server all build on these types.

/// The gRPC metadata key (trailer) in which the metadata server names an error's kind
/// ("not_empty", "busy", "not_found", ...: [`wire::error::ErrorKind::name`]) beside its status
/// code, so that clients decide on the kind, never on the message.
pub const ERROR_KIND_KEY: &str = "haul-kind";

/// How longhaul's error kinds travel over gRPC: as the status code closest to the kind, and the
/// kind itself by name in [`ERROR_KIND_KEY`].
#[cfg(feature = "service")]
pub mod errors {
    use super::ERROR_KIND_KEY;
    use tonic::{Code, Status};
    use wire::error::ErrorKind;

    /// A status of `kind`, named beside its code.
    pub fn status(kind: ErrorKind, message: impl Into<String>) -> Status {
        let mut s = Status::new(code_of(kind), message);
        s.metadata_mut().insert(
            ERROR_KIND_KEY,
            tonic::metadata::MetadataValue::from_static(kind.name()),
        );
        s
    }

    /// The kind of a status: the one named beside it, or else the one its code stands for.
    pub fn kind_of(s: &Status) -> ErrorKind {
        s.metadata()
            .get(ERROR_KIND_KEY)
            .and_then(|v| v.to_str().ok())
            .and_then(ErrorKind::from_name)
            .unwrap_or_else(|| kind_of_code(s.code()))
    }

    /// The kind a bare status code stands for (a status from tonic itself, or from a server
    /// that names no kind).
    pub fn kind_of_code(c: Code) -> ErrorKind {
        match c {
            Code::NotFound => ErrorKind::NotFound,
            Code::PermissionDenied => ErrorKind::PermissionDenied,
            Code::Unauthenticated => ErrorKind::Authentication,
            Code::AlreadyExists => ErrorKind::Exists,
            Code::FailedPrecondition => ErrorKind::NotWritable,
            Code::ResourceExhausted => ErrorKind::NoSpace,
            Code::Unavailable => ErrorKind::Unavailable,
            Code::DeadlineExceeded | Code::Cancelled => ErrorKind::Connect,
            Code::InvalidArgument | Code::OutOfRange => ErrorKind::Invalid,
            Code::DataLoss => ErrorKind::Integrity,
            Code::Unimplemented => ErrorKind::Unsupported,
            _ => ErrorKind::Protocol,
        }
    }

    /// The status code that carries `kind`.
    pub fn code_of(kind: ErrorKind) -> Code {
        use ErrorKind as K;
        match kind {
            K::NotFound => Code::NotFound,
            K::PermissionDenied | K::Unmapped => Code::PermissionDenied,
            K::Authentication => Code::Unauthenticated,
            K::Exists => Code::AlreadyExists,
            K::NoSpace => Code::ResourceExhausted,
            K::NotWritable
            | K::PathEscapesRoot
            | K::NotEmpty
            | K::NotADirectory
            | K::IsADirectory
            | K::Busy => Code::FailedPrecondition,
            K::Invalid | K::IsMetadataServer => Code::InvalidArgument,
            K::Unsupported => Code::Unimplemented,
            K::Connect | K::Unavailable => Code::Unavailable,
            K::Cancelled => Code::Cancelled,
            K::Stalled => Code::DeadlineExceeded,
            K::Integrity | K::SourceDamaged => Code::DataLoss,
            K::Protocol | K::Io | K::Partial => Code::Internal,
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn every_kind_crosses_grpc_unchanged() {
            for k in ErrorKind::ALL {
                let s = status(k, "m");
                assert_eq!(kind_of(&s), k);
                assert_eq!(s.message(), "m");
            }
            // A status that names no kind stands for its code's.
            assert_eq!(kind_of(&Status::not_found("x")), ErrorKind::NotFound);
        }
    }
}

/// `haul.meta.v1`.
pub mod meta {
    include!(concat!(env!("OUT_DIR"), "/haul.meta.v1.rs"));
}
