//! Permission checks of the namespace, POSIX style: owner, group and other bits of `mode`;
//! search (x) on every directory along a path; write and search on a directory to add,
//! remove or rename its entries, and, in a directory with the sticky bit, removing or renaming
//! an entry only by its owner or the directory's owner. Administrators may do anything.
//! Pure functions, so every rule is unit-tested.

use crate::auth::User;
use crate::error::Error;
use catalog::{Inode, Kind};

/// What is wanted of an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
    Search,
}

const STICKY: u32 = 0o1000;

/// Whether `user` has `access` to `inode`.
pub fn allows(user: &User, inode: &Inode, access: Access) -> bool {
    if user.admin {
        return true;
    }
    let bit = match access {
        Access::Read => 4,
        Access::Write => 2,
        Access::Search => 1,
    };
    let shift = if inode.owner == user.name {
        6
    } else if user.in_group(&inode.group) {
        3
    } else {
        0
    };
    (inode.mode >> shift) & bit != 0
}

fn denied(user: &User, what: &str, path: &str) -> Error {
    Error::permission_denied(format!(
        "{path}: permission denied ({} may not {what})",
        user.name
    ))
}

/// Checks `access` to `inode` at `path`.
/// Whether `user` could find the entry at the end of `chain` (the entries from the root to
/// it) by listing directories: read and search permission on every directory above it.
/// Paths the user could not find are not shown to them (in status, policy lists, events).
pub fn may_see(user: &User, chain: &[Inode]) -> bool {
    user.admin
        || chain.split_last().is_some_and(|(_, dirs)| {
            dirs.iter()
                .all(|d| allows(user, d, Access::Read) && allows(user, d, Access::Search))
        })
}

/// Whoever reads the unauthenticated dashboard: no name, no group, only "other" permissions.
pub fn anonymous() -> User {
    User {
        name: String::new(),
        groups: Vec::new(),
        admin: false,
        cert: None,
    }
}

pub fn require(user: &User, inode: &Inode, access: Access, path: &str) -> Result<(), Error> {
    if allows(user, inode, access) {
        return Ok(());
    }
    let what = match (access, inode.kind) {
        (Access::Read, Kind::Dir) => "list this directory",
        (Access::Read, Kind::File) => "read this file",
        (Access::Write, Kind::Dir) => "change entries of this directory",
        (Access::Write, Kind::File) => "write this file",
        (Access::Search, _) => "search this directory",
    };
    Err(denied(user, what, path))
}

/// Search permission on every directory of `chain` (root first) except the last `skip_last`
/// entries, each named by its path.
pub fn require_traverse(user: &User, chain: &[Inode], skip_last: usize) -> Result<(), Error> {
    let mut path = String::new();
    for (i, dir) in chain.iter().enumerate() {
        if i > 0 {
            path.push('/');
            path.push_str(&dir.name);
        }
        if i + skip_last >= chain.len() {
            break;
        }
        if dir.kind == Kind::Dir && !allows(user, dir, Access::Search) {
            let shown = if path.is_empty() { "/" } else { path.as_str() };
            return Err(denied(user, "search this directory", shown));
        }
    }
    Ok(())
}

/// May `user` remove or rename `entry`, which is in directory `dir`?
pub fn require_unlink(user: &User, dir: &Inode, entry: &Inode, path: &str) -> Result<(), Error> {
    if user.admin {
        return Ok(());
    }
    if !allows(user, dir, Access::Write) || !allows(user, dir, Access::Search) {
        return Err(denied(user, "change entries of its directory", path));
    }
    if dir.mode & STICKY != 0 && entry.owner != user.name && dir.owner != user.name {
        return Err(denied(
            user,
            "remove or rename another user's entry in a sticky directory",
            path,
        ));
    }
    Ok(())
}

/// May `user` change the mode of `inode`?
pub fn require_owner(user: &User, inode: &Inode, path: &str) -> Result<(), Error> {
    if user.admin || inode.owner == user.name {
        Ok(())
    } else {
        Err(denied(user, "change this entry (only its owner may)", path))
    }
}

/// Is `user` an administrator (who alone may `what`, e.g. "drain a node")?
pub fn require_admin(user: &User, what: &str) -> Result<(), Error> {
    if user.admin {
        Ok(())
    } else {
        Err(Error::permission_denied(format!(
            "only an administrator may {what} ({} is not one: see meta serve --admin)",
            user.name
        )))
    }
}

/// May `user` give `inode` to `owner` and/or `group`? Only administrators change owners; an
/// owner may change the group to one of their own groups.
pub fn require_chown(
    user: &User,
    inode: &Inode,
    owner: Option<&str>,
    group: Option<&str>,
    path: &str,
) -> Result<(), Error> {
    if user.admin {
        return Ok(());
    }
    if owner.is_some_and(|o| o != inode.owner) {
        return Err(denied(
            user,
            "change the owner (only administrators may)",
            path,
        ));
    }
    if let Some(g) = group {
        require_owner(user, inode, path)?;
        if !user.in_group(g) {
            return Err(denied(
                user,
                &format!("give it to group {g} (not a member)"),
                path,
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str, groups: &[&str]) -> User {
        User {
            name: name.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            admin: false,
            cert: None,
        }
    }

    fn inode(kind: Kind, owner: &str, group: &str, mode: u32) -> Inode {
        Inode {
            id: 2,
            parent: 1,
            name: "x".into(),
            kind,
            owner: owner.into(),
            group: group.into(),
            mode,
            size: 0,
            mtime_ns: 0,
            checksum: String::new(),
            pending: false,
            private: false,
        }
    }

    #[test]
    fn owner_group_other_bits() {
        let f = inode(Kind::File, "alice", "atlas", 0o640);
        let alice = user("alice", &["alice"]);
        let bob = user("bob", &["atlas"]);
        let eve = user("eve", &["eve"]);
        assert!(allows(&alice, &f, Access::Read) && allows(&alice, &f, Access::Write));
        assert!(allows(&bob, &f, Access::Read) && !allows(&bob, &f, Access::Write));
        assert!(!allows(&eve, &f, Access::Read));
        let e = require(&eve, &f, Access::Read, "/d/x").unwrap_err();
        assert_eq!(e.kind, wire::error::ErrorKind::PermissionDenied);
        assert!(
            e.message().contains("/d/x: permission denied"),
            "{}",
            e.message()
        );
        let mut root = user("root", &["root"]);
        root.admin = true;
        assert!(allows(&root, &f, Access::Write));
    }

    #[test]
    fn traversal_needs_search_on_every_directory() {
        let root = inode(Kind::Dir, "root", "root", 0o1777);
        let mut private = inode(Kind::Dir, "alice", "alice", 0o700);
        private.name = "private".into();
        let mut f = inode(Kind::File, "alice", "alice", 0o644);
        f.name = "f".into();
        let chain = vec![root, private, f];
        assert!(require_traverse(&user("alice", &[]), &chain, 1).is_ok());
        let e = require_traverse(&user("bob", &[]), &chain, 1).unwrap_err();
        assert!(e.message().contains("/private"), "{}", e.message());
    }

    #[test]
    fn sticky_directories_protect_other_users_entries() {
        let dir = inode(Kind::Dir, "root", "root", 0o1777);
        let mine = inode(Kind::Dir, "alice", "alice", 0o755);
        assert!(require_unlink(&user("alice", &[]), &dir, &mine, "/a").is_ok());
        assert!(require_unlink(&user("bob", &[]), &dir, &mine, "/a").is_err());
        let open = inode(Kind::Dir, "root", "root", 0o777);
        assert!(require_unlink(&user("bob", &[]), &open, &mine, "/a").is_ok());
        let closed = inode(Kind::Dir, "alice", "alice", 0o755);
        assert!(require_unlink(&user("bob", &[]), &closed, &mine, "/a").is_err());
    }

    #[test]
    fn ownership_changes() {
        let f = inode(Kind::File, "alice", "alice", 0o644);
        let alice = user("alice", &["alice", "atlas"]);
        assert!(require_chown(&alice, &f, None, Some("atlas"), "/f").is_ok());
        assert!(require_chown(&alice, &f, None, Some("cms"), "/f").is_err());
        assert!(require_chown(&alice, &f, Some("bob"), None, "/f").is_err());
        assert!(require_chown(&alice, &f, Some("alice"), None, "/f").is_ok());
        assert!(require_owner(&user("bob", &[]), &f, "/f").is_err());
    }
}
