//! The exported tree (`haul serve`), the endpoint's default personality: clients are admitted
//! by the grid-mapfile, read and write paths below the root with `cp` semantics, and, when the
//! endpoint runs as root, act as the local account their certificate is mapped to (as a root
//! GridFTP server does).

use crate::identity::FsIdentity;
use crate::service::{Admitted, Caller, Service, SinkNaming, SourceList, SourceSelection};
use crate::store::{self, Destination, Root};
use crate::tls::Mapfile;
use std::sync::Arc;
use wire::control::{EntryInfo, ListedFile};
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
            return listed_files(caller, request.files);
        }
        let rel = store::remote_rel_path(&request.path)?;
        let mut list = SourceList::default();
        let limit = request.limit.unwrap_or(usize::MAX);
        let mut over = false;
        store::enumerate(&caller.root, &rel, request.recursive, &mut |f| {
            match f {
                store::Found::Entry(e) => list.entries.push(e),
                store::Found::Unsendable { rel, error } => list.unsendable.push((rel, error)),
            }
            // A listing stops at its bound instead of holding the whole tree first.
            over = list.entries.len() + list.unsendable.len() > limit;
            !over
        })?;
        if over {
            return Err(ErrorInfo::new(
                ErrorKind::Invalid,
                format!("more than {limit} entries: copy the tree in parts"),
            ));
        }
        Ok(list)
    }
}

/// The files of a file list, each found as a source session of its path would find it (below
/// the root, links followed only where they stay below it, regular files only), announced
/// under its listed name. A file whose size changed since it was listed is refused: the list
/// placed it by that size.
fn listed_files(caller: &Caller, files: Vec<ListedFile>) -> Result<SourceList, ErrorInfo> {
    let mut list = SourceList::default();
    for f in files {
        let rel = store::remote_rel_path(&f.locator)?;
        let mut found = None;
        if let Err(e) = store::enumerate(&caller.root, &rel, false, &mut |e| {
            found = Some(e);
            false
        }) {
            list.unsendable.push((f.name, e));
            continue;
        }
        match found {
            Some(store::Found::Entry(mut e)) if e.kind == wire::data::EntryKind::File => {
                if e.size != f.size {
                    list.unsendable.push((
                        f.name,
                        ErrorInfo::new(
                            ErrorKind::Invalid,
                            format!(
                                "{}: its size changed since it was listed ({} bytes, then {})",
                                f.locator, f.size, e.size
                            ),
                        ),
                    ));
                    continue;
                }
                e.rel = f.name;
                e.expect = f.expect;
                list.entries.push(e);
            }
            Some(store::Found::Unsendable { error, .. }) => list.unsendable.push((f.name, error)),
            _ => list.unsendable.push((
                f.name,
                ErrorInfo::new(
                    ErrorKind::NotFound,
                    format!("{}: not a regular file", f.locator),
                ),
            )),
        }
    }
    Ok(list)
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
            limit: None,
        };
        let list = rw.source_list(&caller(&base), req(vec![])).unwrap();
        assert_eq!(list.entries.len(), 1);
        // File lists (a copy into the grid names each file by its path and its new id):
        // found below the root as a path request finds them, through no link leaving it.
        std::os::unix::fs::symlink("/etc/hostname", dir.path().join("l")).unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        let listed = |locator: &str, name: &str, size| wire::control::ListedFile {
            locator: locator.into(),
            name: name.into(),
            size,
            mode: 0o644,
            mtime: Default::default(),
            expect: vec![],
        };
        let list = rw
            .source_list(
                &caller(&base),
                req(vec![
                    listed("a", "42", 3),
                    listed("missing", "43", 3),
                    listed("a", "44", 4),
                    listed("l", "45", 3),
                    listed("d", "46", 0),
                ]),
            )
            .unwrap();
        assert_eq!(list.entries.len(), 1);
        assert_eq!(list.entries[0].rel, "42");
        assert_eq!(list.entries[0].locator, std::path::PathBuf::from("a"));
        let refused: Vec<(&str, ErrorKind)> = list
            .unsendable
            .iter()
            .map(|(n, e)| (n.as_str(), e.kind))
            .collect();
        assert_eq!(refused.len(), 4, "{refused:?}");
        assert_eq!(refused[0], ("43", ErrorKind::NotFound));
        assert_eq!(refused[1], ("44", ErrorKind::Invalid));
        assert_eq!(refused[2].0, "45");
        assert_eq!(refused[3].0, "46");
        // A listing stops at its bound (the `List` request's), before holding the whole tree.
        for i in 0..5 {
            std::fs::write(dir.path().join("d").join(format!("f{i}")), b"x").unwrap();
        }
        let listing = |limit| SourceSelection {
            path: "d".into(),
            recursive: true,
            files: vec![],
            grant: None,
            limit: Some(limit),
        };
        let e = rw.source_list(&caller(&base), listing(3)).err().unwrap();
        assert_eq!(e.kind, ErrorKind::Invalid);
        assert!(e.message.contains("more than 3 entries"), "{e:?}");
        assert_eq!(
            rw.source_list(&caller(&base), listing(6))
                .unwrap()
                .entries
                .len(),
            6
        );
        // A path leaving the root refuses the whole list.
        assert!(
            rw.source_list(&caller(&base), req(vec![listed("../a", "47", 3)]))
                .is_err()
        );
    }
}
