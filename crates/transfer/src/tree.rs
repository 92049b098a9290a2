//! The exported tree (`haul serve`), the endpoint's default personality: clients are admitted
//! by the grid-mapfile, read and write paths below the root with `cp` semantics, and, when the
//! endpoint runs as root, act as the local account their certificate is mapped to (as a root
//! GridFTP server does).

use crate::identity::FsIdentity;
use crate::service::{Admitted, Caller, Service, SinkNaming, SourceList, SourceSelection};
use crate::store::{self, Destination, Root};
use crate::tls::Mapfile;
use std::sync::Arc;
use wire::control::EntryInfo;
use wire::error::{ErrorInfo, ErrorKind};
use wire::grant::SignedGrant;

/// `haul serve`'s personality.
pub struct TreeService {
    mapfile: Mapfile,
    read_only: bool,
    switch_users: bool,
}

impl TreeService {
    /// A tree served to the subjects `mapfile` names. With `switch_users` (an endpoint with
    /// TLS, started as root) every session's file operations run as the mapped account.
    pub fn new(mapfile: Mapfile, read_only: bool, switch_users: bool) -> Self {
        Self {
            mapfile,
            read_only,
            switch_users,
        }
    }

    /// The tree as account `identity` sees it: the process's own view unless sessions switch
    /// users, and a refusal for an account this host does not have.
    fn root_for(
        &self,
        base: &Arc<Root>,
        identity: &str,
        subject: &str,
    ) -> Result<Arc<Root>, ErrorInfo> {
        if !self.switch_users {
            return Ok(base.clone());
        }
        match FsIdentity::lookup(identity) {
            Ok(Some(id)) => Ok(Arc::new(base.as_identity(Arc::new(id)))),
            Ok(None) => Err(ErrorInfo::new(
                ErrorKind::Unmapped,
                format!(
                    "certificate subject {subject:?} is mapped to local account {identity:?}, which does not exist on this endpoint's host; ask its operator to fix the mapfile"
                ),
            )),
            Err(e) => Err(ErrorInfo::new(
                ErrorKind::Io,
                format!("cannot look up local account {identity:?}: {e}"),
            )),
        }
    }
}

impl Service for TreeService {
    fn admit(&self, subject: Option<&str>, base: &Arc<Root>) -> Result<Admitted, ErrorInfo> {
        let Some(subject) = subject else {
            // Only an `--insecure` endpoint has clients without certificates.
            return Ok(Admitted {
                identity: "anonymous".into(),
                root: base.clone(),
            });
        };
        let Some(identity) = self.mapfile.lookup(subject) else {
            return Err(ErrorInfo::new(
                ErrorKind::Unmapped,
                format!(
                    "certificate subject {subject:?} is not in this endpoint's mapfile; ask its operator to add: \"{subject}\" <local-user>"
                ),
            ));
        };
        Ok(Admitted {
            identity: identity.to_string(),
            root: self.root_for(base, identity, subject)?,
        })
    }

    fn stat(&self, caller: &Caller, path: &str) -> Result<Option<EntryInfo>, ErrorInfo> {
        let rel = store::remote_rel_path(path)?;
        Ok(caller.root.metadata(&rel).ok().map(|m| m.info()))
    }

    fn sink_naming(
        &self,
        caller: &Caller,
        dest: &str,
        into_dir: Option<bool>,
        _grant: Option<&SignedGrant>,
    ) -> Result<Arc<dyn SinkNaming>, ErrorInfo> {
        if self.read_only {
            return Err(ErrorInfo::new(
                ErrorKind::PermissionDenied,
                "this endpoint is read-only",
            ));
        }
        let rel = store::remote_rel_path(dest)?;
        let d = Destination::pinned(&caller.root, &rel, dest.ends_with('/'), into_dir)?;
        Ok(Arc::new(d))
    }

    fn source_list(
        &self,
        caller: &Caller,
        request: SourceSelection,
    ) -> Result<SourceList, ErrorInfo> {
        if !request.files.is_empty() {
            return Err(ErrorInfo::new(
                ErrorKind::Unsupported,
                "file lists are only served by storage nodes",
            ));
        }
        let rel = store::remote_rel_path(&request.path)?;
        let mut list = SourceList::default();
        store::enumerate(&caller.root, &rel, request.recursive, &mut |f| {
            match f {
                store::Found::Entry(e) => list.entries.push(e),
                store::Found::Unsendable { rel, error } => list.unsendable.push((rel, error)),
            }
            true
        })?;
        Ok(list)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(root: &Arc<Root>) -> Caller {
        Caller {
            subject: None,
            presenter: None,
            identity: "anonymous".into(),
            root: root.clone(),
        }
    }

    #[test]
    fn subjects_are_admitted_by_the_mapfile_only() {
        let dir = tempfile::tempdir().unwrap();
        let base = Arc::new(Root::confined(dir.path()).unwrap());
        let map = Mapfile::parse("\"CN=alice,O=Grid\" alice\n").unwrap();
        let svc = TreeService::new(map, false, false);
        let a = svc.admit(Some("CN=alice,O=Grid"), &base).unwrap();
        assert_eq!(a.identity, "alice");
        let e = svc.admit(Some("CN=mallory,O=Grid"), &base).err().unwrap();
        assert_eq!(e.kind, ErrorKind::Unmapped);
        assert!(e.message.contains("\"CN=mallory,O=Grid\" <local-user>"));
        assert_eq!(svc.admit(None, &base).unwrap().identity, "anonymous");
    }

    #[test]
    fn a_read_only_tree_refuses_sinks_and_paths_stay_below_the_root() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), b"abc").unwrap();
        let base = Arc::new(Root::confined(dir.path()).unwrap());
        let ro = TreeService::new(Mapfile::default(), true, false);
        let e = ro
            .sink_naming(&caller(&base), "b", None, None)
            .err()
            .unwrap();
        assert_eq!(e.kind, ErrorKind::PermissionDenied);
        let rw = TreeService::new(Mapfile::default(), false, false);
        let naming = rw.sink_naming(&caller(&base), "b", None, None).unwrap();
        assert!(!naming.dest_is_dir());
        assert!(rw.sink_naming(&caller(&base), "../b", None, None).is_err());
        assert!(rw.stat(&caller(&base), "../a").is_err());
        assert_eq!(rw.stat(&caller(&base), "a").unwrap().unwrap().size, 3);
        let req = |files| SourceSelection {
            path: "a".into(),
            recursive: false,
            files,
            grant: None,
        };
        let list = rw.source_list(&caller(&base), req(vec![])).unwrap();
        assert_eq!(list.entries.len(), 1);
        let listed = wire::control::ListedFile {
            locator: "1".into(),
            name: "a".into(),
            size: 3,
            mode: 0o644,
            mtime: Default::default(),
            expect: vec![],
        };
        let e = rw
            .source_list(&caller(&base), req(vec![listed]))
            .err()
            .unwrap();
        assert_eq!(e.kind, ErrorKind::Unsupported);
    }
}
