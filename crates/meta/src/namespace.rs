//! The `Namespace` service: stat, list, mkdir, remove, rename, chmod, chown and extended
//! attributes, each checked against the caller's permissions and done as one catalog
//! transaction.

use crate::auth::User;
use crate::error::{Error, Result};
use crate::grpc::Op;
use crate::perm::{self, Access};
use crate::state::{Meta, depth, entry};
use api::meta as pb;
use api::meta::namespace_server::Namespace;
use catalog::{Inode, Kind, NewEntry, normalize, parent_and_name};
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The namespace service.
pub struct NamespaceService {
    pub meta: Arc<Meta>,
}

/// The entries along a path: `chain` (root first) and whether the last one is the entry.
pub struct Resolved {
    pub norm: String,
    pub chain: Vec<Inode>,
}

impl Resolved {
    pub fn exists(&self) -> bool {
        self.chain.len() == depth(&self.norm) + 1
    }

    pub fn entry(&self) -> Option<&Inode> {
        self.exists().then(|| self.chain.last().expect("root"))
    }

    /// Checks `user`'s search permission on every directory before the entry (or, when the
    /// path does not exist, on every directory that does).
    pub fn check_traverse(&self, user: &User) -> Result<()> {
        let skip = if self.exists() { 1 } else { 0 };
        perm::require_traverse(user, &self.chain, skip)
    }

    /// The entry, or why there is none.
    pub fn existing(&self) -> Result<&Inode> {
        self.entry()
            .ok_or_else(|| Error::not_found(format!("{}: no such file or directory", self.norm)))
    }

    /// The entry as a directory `user` may create and remove entries in: existing, a
    /// directory, writable and searchable.
    pub fn writable_dir(&self, user: &User) -> Result<&Inode> {
        self.check_traverse(user)?;
        let dir = self.existing()?;
        if dir.kind != Kind::Dir {
            return Err(Error::not_a_directory(&self.norm));
        }
        perm::require(user, dir, Access::Write, &self.norm)?;
        perm::require(user, dir, Access::Search, &self.norm)?;
        Ok(dir)
    }

    /// The entry as one `user` may take out of its directory (to remove or move it; `what`,
    /// "remove" or "move", names the refusal of the root): reachable, existing, not the root,
    /// and unlinkable from its parent.
    pub fn unlinkable(&self, user: &User, what: &str) -> Result<&Inode> {
        self.check_traverse(user)?;
        let e = self.existing()?;
        let parent = self
            .parent()
            .ok_or_else(|| Error::invalid(format!("cannot {what} the root")))?;
        perm::require_unlink(user, parent, e, &self.norm)?;
        Ok(e)
    }

    /// The parent directory, when it exists.
    pub fn parent(&self) -> Option<&Inode> {
        let d = depth(&self.norm);
        if d == 0 {
            return None;
        }
        self.chain.get(d - 1)
    }
}

impl Meta {
    /// Resolves `path` and checks search permission on the directories leading to its last
    /// existing component.
    pub async fn resolve(&self, user: &User, path: &str) -> Result<Resolved> {
        let norm = normalize(path)?;
        let chain = self.catalog.lookup_chain(&norm).await?;
        let r = Resolved { norm, chain };
        r.check_traverse(user)?;
        Ok(r)
    }

    /// The existing entry at `path`.
    pub async fn existing(&self, user: &User, path: &str) -> Result<(Resolved, Inode)> {
        let r = self.resolve(user, path).await?;
        let e = r.existing()?.clone();
        Ok((r, e))
    }

    /// Creates directory `path` for `user` (with `parents`, missing parents too; an existing
    /// directory is then fine).
    pub async fn mkdir_as(
        &self,
        user: &User,
        path: &str,
        mode: u32,
        parents: bool,
    ) -> Result<pb::Entry> {
        let norm = normalize(path)?;
        // Checked and created in one catalog transaction, on what it finds along the path.
        let authorize = |chain: &[Inode], missing: usize| {
            // Search permission on every directory before the entry (or, when it does not
            // exist, on every directory that does).
            let skip = usize::from(missing == 0);
            perm::require_traverse(user, chain, skip)?;
            // The deepest existing directory is where something gets created.
            let base = chain.last().expect("root");
            if missing > 0 {
                let shown = {
                    let names: Vec<&str> = chain.iter().skip(1).map(|i| i.name.as_str()).collect();
                    format!("/{}", names.join("/"))
                };
                perm::require(user, base, Access::Write, &shown)?;
                perm::require(user, base, Access::Search, &shown)?;
            }
            Ok::<_, Error>(NewEntry {
                owner: user.name.clone(),
                group: self.new_group(user, base),
                mode: if mode == 0 { 0o755 } else { mode & 0o7777 },
                mtime_ns: now_ns(),
            })
        };
        let d = self
            .catalog
            .mkdir_checked(&norm, parents, authorize)
            .await?;
        Ok(entry(&norm, &d))
    }

    /// Removes `path` for `user` (a directory with `recursive`, everything below it): the
    /// number of entries removed.
    pub async fn remove_as(&self, user: &User, path: &str, recursive: bool) -> Result<u64> {
        let norm = normalize(path)?;
        // Checked and removed in one catalog transaction, on what it finds.
        let authorize = |chain: &[Inode], below: &[(String, Inode)]| {
            let r = Resolved {
                norm: norm.clone(),
                chain: chain.to_vec(),
            };
            let e = r.unlinkable(user, "remove")?;
            if e.kind == Kind::Dir && recursive && !user.admin {
                // Emptying a directory needs write and search permission on it and on every
                // directory below it.
                perm::require(user, e, Access::Write, &r.norm)?;
                perm::require(user, e, Access::Search, &r.norm)?;
                for (p, d) in below {
                    perm::require(user, d, Access::Write, p)?;
                    perm::require(user, d, Access::Search, p)?;
                }
            }
            Ok::<_, Error>(())
        };
        Ok(self
            .catalog
            .remove_checked(&norm, recursive, authorize)
            .await?)
    }

    /// Renames `from` to `to` for `user` (an entry at `to` is replaced, as rename(2) does).
    pub async fn rename_as(&self, user: &User, from: &str, to: &str) -> Result<pb::Entry> {
        let from = normalize(from)?;
        let to = normalize(to)?;
        let (to_parent, _) = parent_and_name(&to)?;
        // Checked and moved in one catalog transaction, on what it finds.
        let authorize = |from_chain: &[Inode], to_chain: &[Inode], target: Option<&Inode>| {
            let source = Resolved {
                norm: from.clone(),
                chain: from_chain.to_vec(),
            };
            source.unlinkable(user, "move")?;
            let parent = Resolved {
                norm: to_parent.clone(),
                chain: to_chain.to_vec(),
            };
            let dir = parent.writable_dir(user)?;
            if let Some(target) = target {
                perm::require_unlink(user, dir, target, &to)?;
            }
            Ok::<_, Error>(())
        };
        let moved = self.catalog.rename_checked(&from, &to, authorize).await?;
        Ok(entry(&to, &moved))
    }

    /// Changes the permission bits of `path` (its owner or an administrator only).
    pub async fn chmod_as(&self, user: &User, path: &str, mode: u32) -> Result<pb::Entry> {
        let (r, e) = self.existing(user, path).await?;
        perm::require_owner(user, &e, &r.norm)?;
        if mode > 0o7777 {
            return Err(Error::invalid(format!(
                "mode {mode:o} is not a permission mode (at most 7777)"
            )));
        }
        let i = self.catalog.set_mode(&r.norm, mode).await?;
        Ok(entry(&r.norm, &i))
    }

    /// Sets the modification time of `path`: an explicit time (`Some`) only its owner may set,
    /// the current time (`None`, as `touch`) anyone who may write it (POSIX `utimensat`).
    pub async fn set_mtime_as(
        &self,
        user: &User,
        path: &str,
        mtime_ns: Option<i64>,
    ) -> Result<pb::Entry> {
        let (r, e) = self.existing(user, path).await?;
        let when = match mtime_ns {
            Some(t) => {
                perm::require_owner(user, &e, &r.norm)?;
                t
            }
            None => {
                perm::require(user, &e, Access::Write, &r.norm)?;
                now_ns()
            }
        };
        let i = self.catalog.set_mtime(&r.norm, when).await?;
        Ok(entry(&r.norm, &i))
    }

    /// Gives `path` another owner and/or group, as `perm::require_chown` allows.
    pub async fn chown_as(
        &self,
        user: &User,
        path: &str,
        owner: Option<&str>,
        group: Option<&str>,
    ) -> Result<pb::Entry> {
        let (r, mut e) = self.existing(user, path).await?;
        if owner.is_none() && group.is_none() {
            return Err(Error::invalid("give an owner, a group, or both"));
        }
        perm::require_chown(user, &e, owner, group, &r.norm)?;
        if let Some(o) = owner {
            e = self.catalog.set_owner(&r.norm, o).await?;
        }
        if let Some(g) = group {
            e = self.catalog.set_group(&r.norm, g).await?;
        }
        Ok(entry(&r.norm, &e))
    }

    /// The normalized paths a command names (`replicate`, `verify`): each must exist for
    /// `user`, and a directory only with `recursive`.
    pub async fn named_paths(
        &self,
        user: &User,
        paths: &[String],
        recursive: bool,
    ) -> Result<Vec<String>> {
        let mut named = Vec::with_capacity(paths.len());
        for p in paths {
            let (r, e) = self.existing(user, p).await?;
            if e.kind == Kind::Dir && !recursive {
                return Err(Error::invalid(format!(
                    "{}: is a directory (use -r)",
                    r.norm
                )));
            }
            named.push(r.norm);
        }
        Ok(named)
    }

    /// Stats each of `paths`; a path that fails has its error's message instead of an entry.
    pub async fn stat_many_as(&self, user: &User, paths: &[String]) -> pb::StatManyReply {
        let mut results = Vec::with_capacity(paths.len());
        for p in paths {
            results.push(match self.existing(user, p).await {
                Ok((r, e)) => pb::StatResult {
                    entry: Some(entry(&r.norm, &e)),
                    error: String::new(),
                },
                Err(e) => pb::StatResult {
                    entry: None,
                    error: e.message,
                },
            });
        }
        pb::StatManyReply { results }
    }

    /// Lists directory `path` for `user` (a file lists as itself): up to `limit` entries
    /// (1,000 when 0, at most 10,000) after the name `after`, and whether more follow.
    pub async fn list_as(
        &self,
        user: &User,
        path: &str,
        after: &str,
        limit: u32,
    ) -> Result<pb::ListReply> {
        let (r, dir) = self.existing(user, path).await?;
        if dir.kind == Kind::Dir {
            perm::require(user, &dir, Access::Read, &r.norm)?;
            perm::require(user, &dir, Access::Search, &r.norm)?;
        }
        let limit = match limit {
            0 => 1000,
            n => n.min(10_000),
        };
        let after = (!after.is_empty()).then_some(after);
        let items = self.catalog.list(&r.norm, after, limit).await?;
        let more = items.len() as u32 == limit && dir.kind == Kind::Dir;
        let entries = items
            .iter()
            .map(|i| {
                let p = if dir.kind == Kind::Dir {
                    catalog::join(&r.norm, &i.name)
                } else {
                    r.norm.clone()
                };
                entry(&p, i)
            })
            .collect();
        Ok(pb::ListReply { entries, more })
    }

    /// The value of extended attribute `name` of `path` (read permission on it).
    pub async fn xattr_get_as(
        &self,
        user: &User,
        path: &str,
        name: &str,
    ) -> Result<Option<Vec<u8>>> {
        let (r, e) = self.existing(user, path).await?;
        perm::require(user, &e, Access::Read, &r.norm)?;
        Ok(self.catalog.xattr_get(&r.norm, name).await?)
    }

    /// Every extended attribute of `path` (read permission on it).
    pub async fn xattr_list_as(&self, user: &User, path: &str) -> Result<Vec<(String, Vec<u8>)>> {
        let (r, e) = self.existing(user, path).await?;
        perm::require(user, &e, Access::Read, &r.norm)?;
        Ok(self.catalog.xattr_list(&r.norm).await?)
    }

    /// Sets extended attribute `name` of `path` (see `check_xattr_write`).
    pub async fn xattr_set_as(
        &self,
        user: &User,
        path: &str,
        name: &str,
        value: &[u8],
    ) -> Result<()> {
        let (r, e) = self.existing(user, path).await?;
        check_xattr_write(user, &e, name, &r.norm)?;
        Ok(self.catalog.xattr_set(&r.norm, name, value).await?)
    }

    /// Removes extended attribute `name` of `path`; not found when it has none of that name.
    pub async fn xattr_remove_as(&self, user: &User, path: &str, name: &str) -> Result<()> {
        let (r, e) = self.existing(user, path).await?;
        check_xattr_write(user, &e, name, &r.norm)?;
        if !self.catalog.xattr_remove(&r.norm, name).await? {
            return Err(Error::not_found(format!(
                "{}: no attribute {name:?}",
                r.norm
            )));
        }
        Ok(())
    }

    /// The directory `path` must be in: existing, a directory, writable and searchable.
    pub async fn writable_parent(&self, user: &User, path: &str) -> Result<Inode> {
        let (parent, _) = parent_and_name(path)?;
        let r = self.resolve(user, &parent).await?;
        r.writable_dir(user).cloned()
    }
}

#[tonic::async_trait]
impl Namespace for NamespaceService {
    async fn stat(&self, req: Request<pb::PathRequest>) -> Result<Response<pb::Entry>, Status> {
        let m = &self.meta;
        m.user_call(Op::one("stat"), &req, async |user, q| {
            let (r, e) = m.existing(&user, &q.path).await?;
            Ok(entry(&r.norm, &e))
        })
        .await
    }

    async fn stat_many(
        &self,
        req: Request<pb::StatManyRequest>,
    ) -> Result<Response<pb::StatManyReply>, Status> {
        let m = &self.meta;
        let items = req.get_ref().paths.len() as u64;
        m.user_call(Op::many("stat_many", items), &req, async |user, q| {
            Ok(m.stat_many_as(&user, &q.paths).await)
        })
        .await
    }

    async fn list(&self, req: Request<pb::ListRequest>) -> Result<Response<pb::ListReply>, Status> {
        let m = &self.meta;
        m.user_call(Op::one("list"), &req, async |user, q| {
            m.list_as(&user, &q.path, &q.after, q.limit).await
        })
        .await
    }

    async fn mkdir(&self, req: Request<pb::MkdirRequest>) -> Result<Response<pb::Entry>, Status> {
        let m = &self.meta;
        m.user_call(Op::one("mkdir"), &req, async |user, q| {
            m.mkdir_as(&user, &q.path, q.mode, q.parents).await
        })
        .await
    }

    async fn remove(
        &self,
        req: Request<pb::RemoveRequest>,
    ) -> Result<Response<pb::RemoveReply>, Status> {
        let m = &self.meta;
        m.user_call(Op::one("remove"), &req, async |user, q| {
            let removed = m.remove_as(&user, &q.path, q.recursive).await?;
            Ok(pb::RemoveReply { removed })
        })
        .await
    }

    async fn rename(&self, req: Request<pb::RenameRequest>) -> Result<Response<pb::Entry>, Status> {
        let m = &self.meta;
        m.user_call(Op::one("rename"), &req, async |user, q| {
            m.rename_as(&user, &q.from, &q.to).await
        })
        .await
    }

    async fn chmod(&self, req: Request<pb::ChmodRequest>) -> Result<Response<pb::Entry>, Status> {
        let m = &self.meta;
        m.user_call(Op::one("chmod"), &req, async |user, q| {
            m.chmod_as(&user, &q.path, q.mode).await
        })
        .await
    }

    async fn set_mtime(
        &self,
        req: Request<pb::SetMtimeRequest>,
    ) -> Result<Response<pb::Entry>, Status> {
        let m = &self.meta;
        m.user_call(Op::one("set_mtime"), &req, async |user, q| {
            m.set_mtime_as(&user, &q.path, (!q.now).then_some(q.mtime_ns))
                .await
        })
        .await
    }

    async fn chown(&self, req: Request<pb::ChownRequest>) -> Result<Response<pb::Entry>, Status> {
        let m = &self.meta;
        m.user_call(Op::one("chown"), &req, async |user, q| {
            let owner = (!q.owner.is_empty()).then_some(q.owner.as_str());
            let group = (!q.group.is_empty()).then_some(q.group.as_str());
            m.chown_as(&user, &q.path, owner, group).await
        })
        .await
    }

    async fn xattr_get(
        &self,
        req: Request<pb::XattrRequest>,
    ) -> Result<Response<pb::XattrReply>, Status> {
        let m = &self.meta;
        m.user_call(Op::one("xattr_get"), &req, async |user, q| {
            let v = m.xattr_get_as(&user, &q.path, &q.name).await?;
            Ok(pb::XattrReply {
                found: v.is_some(),
                value: v.unwrap_or_default(),
            })
        })
        .await
    }

    async fn xattr_set(
        &self,
        req: Request<pb::XattrSetRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        let m = &self.meta;
        m.user_call(Op::one("xattr_set"), &req, async |user, q| {
            m.xattr_set_as(&user, &q.path, &q.name, &q.value).await?;
            Ok(pb::Empty {})
        })
        .await
    }

    async fn xattr_list(
        &self,
        req: Request<pb::PathRequest>,
    ) -> Result<Response<pb::XattrListReply>, Status> {
        let m = &self.meta;
        m.user_call(Op::one("xattr_list"), &req, async |user, q| {
            let attrs = m
                .xattr_list_as(&user, &q.path)
                .await?
                .into_iter()
                .map(|(name, value)| pb::Xattr { name, value })
                .collect();
            Ok(pb::XattrListReply { attrs })
        })
        .await
    }

    async fn xattr_remove(
        &self,
        req: Request<pb::XattrRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        let m = &self.meta;
        m.user_call(Op::one("xattr_remove"), &req, async |user, q| {
            m.xattr_remove_as(&user, &q.path, &q.name).await?;
            Ok(pb::Empty {})
        })
        .await
    }
}

/// Attributes under `haul.` steer the grid (replica policies): only the entry's owner sets
/// them. Other attributes need write permission.
fn check_xattr_write(user: &User, e: &Inode, name: &str, path: &str) -> Result<()> {
    if name.starts_with("haul.") {
        perm::require_owner(user, e, path)
    } else {
        perm::require(user, e, Access::Write, path)
    }
}

pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// The namespace's domain methods in process, over an in-memory catalog: no gRPC, no TLS.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Identities;
    use crate::state::Settings;
    use wire::error::ErrorKind;

    async fn meta() -> Meta {
        let catalog = catalog::Catalog::open("sqlite::memory:").await.unwrap();
        let ids = Identities {
            mapfile: Default::default(),
            groups: Default::default(),
            admins: vec![],
            nodes: Default::default(),
        };
        Meta::new(catalog, ids, Settings::default())
    }

    fn user(name: &str, groups: &[&str], admin: bool) -> User {
        User {
            name: name.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            admin,
            cert: None,
        }
    }

    fn kind(e: &Error) -> ErrorKind {
        e.kind
    }

    #[tokio::test]
    async fn mkdir_checks_and_creates_in_one_step_with_the_parents_group() {
        let m = meta().await;
        let root = user("root", &["atlas"], true);
        let alice = user("alice", &["physics", "atlas"], false);
        let bob = user("bob", &["bob"], false);
        // A shared directory of group atlas with the set-group-id bit.
        let shared = m.mkdir_as(&root, "/shared", 0o2775, false).await.unwrap();
        assert_eq!((shared.group.as_str(), shared.mode), ("atlas", 0o2775));

        // A member creates below it, parents too; the new directories take the group.
        let d = m
            .mkdir_as(&alice, "/shared/run1/out", 0, true)
            .await
            .unwrap();
        assert_eq!((d.owner.as_str(), d.group.as_str()), ("alice", "atlas"));
        assert_eq!(m.catalog.stat("/shared/run1").await.unwrap().group, "atlas");
        // mkdir -p of what exists returns it; plain mkdir says it exists.
        let again = m
            .mkdir_as(&alice, "/shared/run1/out", 0, true)
            .await
            .unwrap();
        assert_eq!(again.path, d.path);
        let e = m
            .mkdir_as(&alice, "/shared/run1", 0, false)
            .await
            .unwrap_err();
        assert_eq!(kind(&e), ErrorKind::Exists, "{e:?}");

        // Someone else may not write there: refused, and nothing was created.
        let e = m
            .mkdir_as(&bob, "/shared/bobs", 0, false)
            .await
            .unwrap_err();
        assert_eq!(kind(&e), ErrorKind::PermissionDenied, "{e:?}");
        assert!(m.catalog.lookup("/shared/bobs").await.unwrap().is_none());
        // Nor pass through a directory they cannot search.
        m.mkdir_as(&alice, "/private", 0o700, false).await.unwrap();
        let e = m.mkdir_as(&bob, "/private/x/y", 0, true).await.unwrap_err();
        assert_eq!(kind(&e), ErrorKind::PermissionDenied, "{e:?}");
        assert!(e.message().contains("search"), "{e:?}");
        assert!(m.catalog.lookup("/private/x").await.unwrap().is_none());
        // A path with `..` is refused before anything is looked up.
        let e = m
            .mkdir_as(&alice, "/shared/run1/out/../x", 0, false)
            .await
            .unwrap_err();
        assert_eq!(kind(&e), ErrorKind::Invalid, "{e:?}");
    }

    #[tokio::test]
    async fn only_owners_change_modes_and_only_administrators_give_entries_away() {
        let m = meta().await;
        let root = user("root", &["atlas"], true);
        let alice = user("alice", &["alice", "atlas"], false);
        let bob = user("bob", &["bob"], false);
        m.mkdir_as(&root, "/home", 0o755, false).await.unwrap();
        m.chown_as(&root, "/home", Some("alice"), None)
            .await
            .unwrap();
        let d = m.chmod_as(&alice, "/home", 0o750).await.unwrap();
        assert_eq!(d.mode, 0o750);
        let e = m.chmod_as(&bob, "/home", 0o777).await.unwrap_err();
        assert_eq!(kind(&e), ErrorKind::PermissionDenied, "{e:?}");
        let e = m.chmod_as(&alice, "/home", 0o17777).await.unwrap_err();
        assert_eq!(kind(&e), ErrorKind::Invalid, "{e:?}");
        // An owner may hand an entry to one of their own groups, not to another user.
        let d = m
            .chown_as(&alice, "/home", None, Some("atlas"))
            .await
            .unwrap();
        assert_eq!(d.group, "atlas");
        let e = m
            .chown_as(&alice, "/home", Some("bob"), None)
            .await
            .unwrap_err();
        assert_eq!(kind(&e), ErrorKind::PermissionDenied, "{e:?}");
        let e = m
            .chown_as(&alice, "/home", None, Some("bob"))
            .await
            .unwrap_err();
        assert_eq!(kind(&e), ErrorKind::PermissionDenied, "{e:?}");
        let e = m.chown_as(&alice, "/home", None, None).await.unwrap_err();
        assert_eq!(kind(&e), ErrorKind::Invalid, "{e:?}");
        assert_eq!(m.catalog.stat("/home").await.unwrap().owner, "alice");
    }

    #[tokio::test]
    async fn remove_and_rename_follow_the_directories_permissions() {
        let m = meta().await;
        let root = user("root", &["atlas"], true);
        let alice = user("alice", &["atlas"], false);
        let bob = user("bob", &["atlas"], false);
        m.mkdir_as(&root, "/shared", 0o1777, false).await.unwrap();
        m.mkdir_as(&alice, "/shared/a/b", 0o755, true)
            .await
            .unwrap();
        // Sticky directory: bob may not remove or move what alice owns there.
        let e = m.remove_as(&bob, "/shared/a", true).await.unwrap_err();
        assert_eq!(kind(&e), ErrorKind::PermissionDenied, "{e:?}");
        let e = m
            .rename_as(&bob, "/shared/a", "/shared/mine")
            .await
            .unwrap_err();
        assert_eq!(kind(&e), ErrorKind::PermissionDenied, "{e:?}");
        // Not empty without -r; the root never goes.
        let e = m.remove_as(&alice, "/shared/a", false).await.unwrap_err();
        assert_eq!(kind(&e), ErrorKind::NotEmpty, "{e:?}");
        let e = m.remove_as(&root, "/", true).await.unwrap_err();
        assert_eq!(kind(&e), ErrorKind::Invalid, "{e:?}");
        // The owner moves and removes; the entry is where the rename put it.
        let moved = m.rename_as(&alice, "/shared/a", "/shared/c").await.unwrap();
        assert_eq!(moved.path, "/shared/c");
        assert!(m.catalog.lookup("/shared/a").await.unwrap().is_none());
        assert_eq!(m.remove_as(&alice, "/shared/c", true).await.unwrap(), 2);
        assert!(m.catalog.lookup("/shared/c/b").await.unwrap().is_none());
    }
}
