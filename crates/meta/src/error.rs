//! The one error of the metadata server's domain methods: a kind of the shared vocabulary
//! (`wire::error::ErrorKind`, the same kinds a transfer ends with and `haul` exits by) and a
//! sentence for people. Domain methods (namespace, files, nodes, policies, verification)
//! return it; only the gRPC layer turns it into a status, once, naming its kind beside the
//! code (`api::errors`), so that the client reads the kind back unchanged. No decision
//! anywhere is taken on its message.

use api::meta as pb;
use catalog::{CatalogError, Checked};
use tonic::Status;
use wire::error::{ErrorInfo, ErrorKind};

/// Why a metadata operation was refused or failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
}

/// What domain methods return.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }

    pub fn permission_denied(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::PermissionDenied, message)
    }

    /// A request that cannot be served as given (a bad argument).
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Invalid, message)
    }

    /// The server cannot serve it now (no node, no database); trying later may work.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unavailable, message)
    }

    /// The sentence for people.
    pub fn message(&self) -> &str {
        &self.message
    }

    pub fn not_a_directory(path: &str) -> Self {
        Self::new(ErrorKind::NotADirectory, format!("{path}: not a directory"))
    }

    /// This error as the per-file error of a batch reply: its kind's name is the code.
    pub fn for_file(&self, path: &str) -> pb::FileError {
        pb::FileError {
            path: path.to_string(),
            code: self.kind.name().to_string(),
            message: self.message.clone(),
        }
    }
}

/// The kind each catalog error stands for.
pub fn kind_of(e: &CatalogError) -> ErrorKind {
    match e {
        CatalogError::NotFound(_) => ErrorKind::NotFound,
        CatalogError::Exists(_) => ErrorKind::Exists,
        CatalogError::NotADirectory(_) => ErrorKind::NotADirectory,
        CatalogError::IsADirectory(_) => ErrorKind::IsADirectory,
        CatalogError::NotEmpty(_) => ErrorKind::NotEmpty,
        CatalogError::Busy(_) => ErrorKind::Busy,
        CatalogError::Invalid(_) => ErrorKind::Invalid,
        CatalogError::Denied(_) => ErrorKind::PermissionDenied,
        CatalogError::Database(_) => ErrorKind::Unavailable,
    }
}

impl From<CatalogError> for Error {
    fn from(e: CatalogError) -> Self {
        if let CatalogError::Database(_) = e {
            // The database's own words stay in the server's log; the client learns the kind.
            tracing::error!(error = %e, "catalog database error");
            return Error::unavailable(format!("metadata database: {e}"));
        }
        Error::new(kind_of(&e), e.to_string())
    }
}

/// A checked catalog change's error: the refusal as given, or the catalog's.
impl From<Checked<Error>> for Error {
    fn from(e: Checked<Error>) -> Self {
        match e {
            Checked::Refused(e) => e,
            Checked::Catalog(e) => e.into(),
        }
    }
}

/// The status a client receives: the kind's code, with the kind named beside it.
impl From<Error> for Status {
    fn from(e: Error) -> Self {
        api::errors::status(e.kind, e.message)
    }
}

/// What a status coming back from a call names (a node's answer, the server's own layer).
impl From<Status> for Error {
    fn from(s: Status) -> Self {
        Error::new(api::errors::kind_of(&s), s.message())
    }
}

impl From<Error> for ErrorInfo {
    fn from(e: Error) -> Self {
        ErrorInfo::new(e.kind, e.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A domain error crosses gRPC with its kind unchanged, whatever code carries it.
    #[test]
    fn every_kind_survives_the_status_and_back() {
        for kind in ErrorKind::ALL {
            let e = Error::new(kind, "why");
            let back = Error::from(Status::from(e.clone()));
            assert_eq!(back, e, "{kind:?}");
        }
        // A status from the server's own layers (tonic, the identity checks) names no kind:
        // it leaves with its code's, named.
        let refused = Error::from(Status::not_found("x"));
        assert_eq!(refused.kind, ErrorKind::NotFound);
        let out = Status::from(refused);
        assert_eq!(api::errors::kind_of(&out), ErrorKind::NotFound);
        assert!(out.metadata().contains_key(api::ERROR_KIND_KEY));
    }

    #[test]
    fn catalog_errors_keep_their_kind_and_database_words_stay_home() {
        let e = Error::from(CatalogError::NotEmpty("/a".into()));
        assert_eq!(e.kind, ErrorKind::NotEmpty);
        assert_eq!(e.message, "/a: directory not empty");
        let e = Error::from(CatalogError::Database("disk I/O error".into()));
        assert_eq!(e.kind, ErrorKind::Unavailable);
        let refused = Error::permission_denied("no");
        assert_eq!(Error::from(Checked::Refused(refused.clone())), refused);
    }
}
