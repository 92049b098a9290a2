//! The spool: how a storage node names replicas (by their file id in the grid's catalog, not by
//! path, so renames in the namespace never touch nodes), how it checks the capability every
//! data operation carries, and how a sink session on the node names, guards and reports what it
//! receives (a received file is reported to the metadata server, which makes it visible,
//! before its sender is told it is done).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use transfer::service::{Settled, SinkNaming};
use transfer::store::Root;
use wire::checksum::Digest;
use wire::data::Timestamp;
use wire::error::{ErrorInfo, ErrorKind};
use wire::grant::{Grant, Operation, SignedGrant};

/// What the node's data service needs from the metadata server. [`crate::GridLink`] is the
/// real one; tests use their own.
pub trait MetaLink: Send + Sync + 'static {
    /// This node's name, as grants name it.
    fn node(&self) -> String;
    /// The key grants for this node are signed with (none before registration).
    fn key(&self) -> Option<Vec<u8>>;
    /// A received file was verified and committed locally: tell the metadata server. Blocking;
    /// an error fails the file (its local copy is removed).
    fn committed(
        &self,
        id: i64,
        size: u64,
        digests: &[Digest],
        mtime: Timestamp,
    ) -> Result<(), ErrorInfo>;
    /// [`MetaLink::committed`], settled by calling `done` (once, from any thread) when the
    /// metadata server has answered; by default at once.
    fn committed_then(
        &self,
        id: i64,
        size: u64,
        digests: &[Digest],
        mtime: Timestamp,
        done: Settled,
    ) {
        done(self.committed(id, size, digests, mtime))
    }
    /// Registers files a task of a run (`grant`) wrote, under grid directory `dir`: each gets a
    /// file id and a pending replica on this node, or the reason it was refused. Blocking.
    fn register_outputs(
        &self,
        grant: &SignedGrant,
        dir: &str,
        files: &[OutputFile],
    ) -> Result<Vec<Result<i64, ErrorInfo>>, ErrorInfo>;
}

/// A file a task left in its output directory, to register.
#[derive(Clone, Debug)]
pub struct OutputFile {
    /// Path relative to the output directory (`/`-separated).
    pub name: String,
    pub size: u64,
    pub digests: Vec<Digest>,
    pub mtime: Timestamp,
    pub mode: u32,
}

/// Checks a request's capability for `op`, presented on a connection whose client certificate
/// has the fingerprint `presenter` (capabilities serve only the holder they name).
pub fn check(
    link: &dyn MetaLink,
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
    let key = link.key().ok_or_else(|| {
        ErrorInfo::new(
            ErrorKind::Connect,
            "this node is not registered with a metadata server yet",
        )
    })?;
    grant
        .verify(
            &key,
            &link.node(),
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

/// Spool layout: `data/<2 hex>/<2 hex>/<16 hex>` by file id, so directories stay small.
pub fn spool_path(id: i64) -> PathBuf {
    let h = format!("{:016x}", id as u64);
    PathBuf::from("data")
        .join(&h[12..14])
        .join(&h[14..16])
        .join(h)
}

/// The file id of a spool path, if it is one.
pub fn spool_id(path: &Path) -> Option<i64> {
    let name = path.file_name()?.to_str()?;
    if name.len() != 16 {
        return None;
    }
    u64::from_str_radix(name, 16)
        .ok()
        .map(|v| v as i64)
        .filter(|id| *id > 0)
}

/// How a sink session on a storage node names what it receives: announced entries are file ids
/// a write capability allows.
pub struct SpoolNaming {
    pub allowed: HashSet<i64>,
    /// Ids whose (bad) replica the capability allows to replace.
    pub replace: HashSet<i64>,
    pub link: Arc<dyn MetaLink>,
}

impl SinkNaming for SpoolNaming {
    fn map(&self, announced: &str) -> Result<PathBuf, ErrorInfo> {
        let id = parse_id(announced)?;
        if !self.allowed.contains(&id) {
            return Err(ErrorInfo::new(
                ErrorKind::PermissionDenied,
                format!("file {id} is not covered by the capability"),
            ));
        }
        Ok(spool_path(id))
    }

    /// Entries go below the spool, each under its id.
    fn dest_is_dir(&self) -> bool {
        true
    }

    /// A node never writes over a replica it holds unless its capability names that replica as
    /// bad: a write capability replayed after the commit must not destroy the verified copy.
    fn may_replace(&self, announced: &str) -> bool {
        parse_id(announced).is_ok_and(|id| self.replace.contains(&id))
    }

    fn make_dir(&self, _root: &Root, _announced: &str, _mode: u32) -> Result<(), ErrorInfo> {
        Err(ErrorInfo::new(
            ErrorKind::Invalid,
            "storage nodes hold files, not directories",
        ))
    }

    /// The node's report waits on its metadata server: settled when it answers.
    fn committed_then(
        &self,
        announced: &str,
        size: u64,
        digests: &[Digest],
        mtime: Timestamp,
        done: Settled,
    ) {
        match parse_id(announced) {
            Ok(id) => self.link.committed_then(id, size, digests, mtime, done),
            Err(e) => done(Err(e)),
        }
    }

    /// A replica found complete by a resumed session is reported again, with its checksums
    /// read from the disk: a session that died between its commit and its report (a node
    /// killed, a report lost) left it pending in the catalog, and the sender would otherwise
    /// count as copied a file nobody can see. For a replica already complete in the catalog
    /// the report changes nothing; one the catalog refuses fails the file (and stays: it is
    /// not this session's to remove).
    fn found_complete_then(
        &self,
        root: &Root,
        final_path: &Path,
        begin: &wire::data::FileBegin,
        algos: &[wire::checksum::Algorithm],
        done: Settled,
    ) {
        let id = match parse_id(&begin.path) {
            Ok(id) => id,
            Err(e) => return done(Err(e)),
        };
        let file = match root.open(final_path, transfer::store::OpenMode::Read) {
            Ok(f) => f,
            Err(e) => {
                return done(Err(ErrorInfo::new(
                    ErrorKind::Io,
                    format!("file {id}: cannot read the replica to report it: {e}"),
                )));
            }
        };
        match crate::digest::digest_reader(file, algos) {
            (size, Ok(digests)) if size == begin.size => {
                self.link
                    .committed_then(id, size, &digests, begin.mtime, done)
            }
            (size, Ok(_)) => done(Err(ErrorInfo::new(
                ErrorKind::Integrity,
                format!(
                    "file {id}: the replica has {size} bytes, not {}",
                    begin.size
                ),
            ))),
            (_, Err(e)) => done(Err(ErrorInfo::new(
                ErrorKind::Io,
                format!("file {id}: cannot read the replica to report it: {e}"),
            ))),
        }
    }

    /// The file's id instead of the node's own path for it (`/data/12/34/…`).
    fn public_error(&self, announced: &str, shown: &str, mut e: ErrorInfo) -> ErrorInfo {
        if !shown.is_empty() {
            e.message = e.message.replace(shown, &format!("file {announced}"));
        }
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FakeLink;

    fn naming(allowed: &[i64], replace: &[i64]) -> SpoolNaming {
        SpoolNaming {
            allowed: allowed.iter().copied().collect(),
            replace: replace.iter().copied().collect(),
            link: Arc::new(FakeLink::new("n")),
        }
    }

    /// Issue 11 C15: a node's disk-full message named its internal path (`/data/xx/yy/<id>`).
    #[test]
    fn errors_name_the_file_not_the_nodes_path() {
        let spool = naming(&[12], &[]);
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
    fn only_covered_ids_are_received_and_only_bad_replicas_replaced() {
        let spool = naming(&[12, 13], &[13]);
        assert_eq!(spool.map("12").unwrap(), spool_path(12));
        assert_eq!(
            spool.map("14").unwrap_err().kind,
            ErrorKind::PermissionDenied
        );
        assert_eq!(spool.map("../x").unwrap_err().kind, ErrorKind::Invalid);
        assert!(!spool.may_replace("12"));
        assert!(spool.may_replace("13"));
        assert!(spool.dest_is_dir());
    }

    #[test]
    fn spool_paths_round_trip() {
        let p = spool_path(0x1234_5678);
        assert_eq!(p, PathBuf::from("data/56/78/0000000012345678"));
        assert_eq!(spool_id(&p), Some(0x1234_5678));
        assert_eq!(
            spool_id(Path::new("data/56/78/.0000000012345678.haul-part")),
            None
        );
        assert!(parse_id("12").is_ok());
        assert!(parse_id("-3").is_err());
        assert!(parse_id("../x").is_err());
    }

    #[test]
    fn capabilities_are_checked_for_node_operation_and_holder() {
        let link = FakeLink::new("n1");
        let e = check(&link, None, Operation::Read, None).unwrap_err();
        assert_eq!(e.kind, ErrorKind::PermissionDenied);
        let g = link.grant(Operation::Read, &[5], b"holder");
        let got = check(&link, Some(&g), Operation::Read, Some(b"holder")).unwrap();
        assert_eq!(got.ids, vec![5]);
        for (op, holder) in [
            (Operation::Write, &b"holder"[..]),
            (Operation::Read, &b"someone else"[..]),
        ] {
            let e = check(&link, Some(&g), op, Some(holder)).unwrap_err();
            assert_eq!(e.kind, ErrorKind::PermissionDenied, "{op:?}");
        }
        let other = FakeLink::new("n2");
        assert!(check(&other, Some(&g), Operation::Read, Some(b"holder")).is_err());
    }
}
