//! Storage-node mode of an endpoint: files are named by their ids in the grid's catalog (not by
//! path, so renames in the namespace never touch nodes), every data operation must carry a
//! capability signed by the metadata server for this node, and a received file is reported to
//! the metadata server (which makes it visible) before its sender is told it is done.

use crate::store::Destination;
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use wire::checksum::Digest;
use wire::data::Timestamp;
use wire::error::{ErrorInfo, ErrorKind};
use wire::grant::{Grant, Operation, SignedGrant};

/// What a storage node provides to its data service.
pub trait Spool: Send + Sync {
    /// This node's name, as grants name it.
    fn node(&self) -> String;
    /// The key grants for this node are signed with (none before registration).
    fn key(&self) -> Option<Vec<u8>>;
    /// Where file `id` lives, relative to the node's root.
    fn path_of(&self, id: i64) -> PathBuf;
    /// A received file was verified and committed locally: tell the metadata server. Blocking;
    /// an error fails the file (its local copy is removed).
    fn committed(
        &self,
        id: i64,
        size: u64,
        digests: &[Digest],
        mtime: Timestamp,
    ) -> Result<(), ErrorInfo>;
    /// Registers files a task of a run (`grant`) wrote, under grid directory `dir`: each gets a
    /// file id and a pending replica on this node, or the reason it was refused. Blocking.
    fn register_outputs(
        &self,
        grant: &SignedGrant,
        dir: &str,
        files: &[crate::run::OutputFile],
    ) -> Result<Vec<Result<i64, ErrorInfo>>, ErrorInfo> {
        let _ = (grant, dir, files);
        Err(ErrorInfo::new(
            ErrorKind::Unsupported,
            "this node cannot register outputs",
        ))
    }
}

/// Checks a request's capability for `op`, presented on a connection whose client certificate
/// has the fingerprint `presenter` (capabilities serve only the holder they name).
pub fn check(
    spool: &dyn Spool,
    grant: Option<&SignedGrant>,
    op: Operation,
    presenter: Option<&[u8]>,
) -> Result<Grant, ErrorInfo> {
    let Some(grant) = grant else {
        return Err(ErrorInfo::new(
            ErrorKind::PermissionDenied,
            "storage nodes serve only requests with a capability from the metadata server (use haul://META/path)",
        ));
    };
    let key = spool.key().ok_or_else(|| {
        ErrorInfo::new(
            ErrorKind::Connect,
            "this node is not registered with a metadata server yet",
        )
    })?;
    grant
        .verify(
            &key,
            &spool.node(),
            op,
            now_ms(),
            presenter.unwrap_or_default(),
        )
        .map_err(|e| ErrorInfo::new(ErrorKind::PermissionDenied, e.to_string()))
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Parses a file id as sent in a request or a `FileBegin`.
pub fn parse_id(s: &str) -> Result<i64, ErrorInfo> {
    s.parse::<i64>()
        .ok()
        .filter(|id| *id > 0)
        .ok_or_else(|| ErrorInfo::new(ErrorKind::Invalid, format!("{s:?} is not a file id")))
}

/// How a sink names what it receives.
#[derive(Clone)]
pub enum Naming {
    /// `cp` semantics below a destination.
    Tree(Destination),
    /// A storage node's spool: entries are file ids allowed by a grant.
    Spool {
        allowed: Arc<HashSet<i64>>,
        /// Ids whose (bad) replica the grant allows to replace.
        replace: Arc<HashSet<i64>>,
        spool: Arc<dyn Spool>,
    },
}

impl Naming {
    /// The path in the root where an announced entry goes.
    pub fn map(&self, announced: &str) -> Result<PathBuf, ErrorInfo> {
        match self {
            Naming::Tree(d) => Ok(d.map(announced)),
            Naming::Spool { allowed, spool, .. } => {
                let id = parse_id(announced)?;
                if !allowed.contains(&id) {
                    return Err(ErrorInfo::new(
                        ErrorKind::PermissionDenied,
                        format!("file {id} is not covered by the capability"),
                    ));
                }
                Ok(spool.path_of(id))
            }
        }
    }

    /// After a local commit (spool only: tell the metadata server).
    pub fn committed(
        &self,
        announced: &str,
        size: u64,
        digests: &[Digest],
        mtime: Timestamp,
    ) -> Result<(), ErrorInfo> {
        match self {
            Naming::Tree(_) => Ok(()),
            Naming::Spool { spool, .. } => {
                spool.committed(parse_id(announced)?, size, digests, mtime)
            }
        }
    }

    /// An error about received file `announced` as its sender sees it: on a storage node the
    /// file's id instead of the node's own path for it (`shown`, e.g. `/data/12/34/…`).
    pub fn public_error(&self, announced: &str, shown: &str, mut e: ErrorInfo) -> ErrorInfo {
        if self.is_spool() && !shown.is_empty() {
            e.message = e.message.replace(shown, &format!("file {announced}"));
        }
        e
    }

    pub fn is_spool(&self) -> bool {
        matches!(self, Naming::Spool { .. })
    }

    /// Whether a received file may replace an existing one under its final name: always with
    /// `cp` semantics; on a storage node only a replica its capability names as bad.
    pub fn may_replace(&self, announced: &str) -> bool {
        match self {
            Naming::Tree(_) => true,
            Naming::Spool { replace, .. } => {
                parse_id(announced).is_ok_and(|id| replace.contains(&id))
            }
        }
    }
}

/// Spool layout: `data/<2 hex>/<2 hex>/<16 hex>` by file id, so directories stay small.
pub fn spool_path(id: i64) -> PathBuf {
    let h = format!("{:016x}", id as u64);
    PathBuf::from("data")
        .join(&h[12..14])
        .join(&h[14..16])
        .join(h)
}

/// The file id of a spool path, if it is one.
pub fn spool_id(path: &std::path::Path) -> Option<i64> {
    let name = path.file_name()?.to_str()?;
    if name.len() != 16 {
        return None;
    }
    u64::from_str_radix(name, 16)
        .ok()
        .map(|v| v as i64)
        .filter(|id| *id > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 11 C15: a node's disk-full message named its internal path (`/data/xx/yy/<id>`).
    #[test]
    fn errors_name_the_file_not_the_nodes_path() {
        struct S;
        impl Spool for S {
            fn node(&self) -> String {
                "n".into()
            }
            fn key(&self) -> Option<Vec<u8>> {
                None
            }
            fn path_of(&self, id: i64) -> PathBuf {
                spool_path(id)
            }
            fn committed(
                &self,
                _: i64,
                _: u64,
                _: &[Digest],
                _: Timestamp,
            ) -> Result<(), ErrorInfo> {
                Ok(())
            }
        }
        let spool = Naming::Spool {
            allowed: Arc::new([12].into_iter().collect()),
            replace: Arc::new(HashSet::new()),
            spool: Arc::new(S),
        };
        let shown = format!("/{}", spool_path(12).display());
        let e = ErrorInfo::new(
            ErrorKind::NoSpace,
            format!("{shown}: no space left on the destination"),
        );
        let p = spool.public_error("12", &shown, e.clone());
        assert_eq!(p.message, "file 12: no space left on the destination");
        assert_eq!(p.kind, ErrorKind::NoSpace);
    }

    #[test]
    fn spool_paths_round_trip() {
        let p = spool_path(0x1234_5678);
        assert_eq!(p, PathBuf::from("data/56/78/0000000012345678"));
        assert_eq!(spool_id(&p), Some(0x1234_5678));
        assert_eq!(
            spool_id(std::path::Path::new(
                "data/56/78/.0000000012345678.haul-part"
            )),
            None
        );
        assert!(parse_id("12").is_ok());
        assert!(parse_id("-3").is_err());
        assert!(parse_id("../x").is_err());
    }
}
