//! The behaviour every catalog backend must have. The tests run it against SQLite (in memory
//! and on disk) and PostgreSQL; a backend passes when `run` returns.

use crate::{
    Catalog, CatalogError, Checked, CreateItem, CreateKind, Inode, Kind, NewEntry, ReplicaState,
    TransferFile, TransferFilter, TransferRecord, WrittenReplica,
};

fn entry(owner: &str) -> NewEntry {
    NewEntry {
        owner: owner.into(),
        group: "grp".into(),
        mode: 0o755,
        mtime_ns: 1_700_000_000_000_000_000,
    }
}

/// Runs every check against an empty catalog. Panics with the failing check.
pub async fn run(c: &Catalog) {
    directories(c).await;
    checked_mkdir_decides_on_what_its_transaction_sees(c).await;
    checked_remove_and_rename_decide_on_what_their_transaction_sees(c).await;
    files_appear_only_when_committed(c).await;
    replacing_and_removing_bury_replicas(c).await;
    rename_rules(c).await;
    attributes_and_xattrs(c).await;
    nodes_and_replicas(c).await;
    listing_pages(c).await;
    batch_creates(c).await;
    trees_and_reconciliation(c).await;
    renames_are_seen_at_once(c).await;
    replicas_complete_only_where_being_written(c).await;
    replicas_complete_in_groups(c).await;
    writing_replicas_expire_with_their_lease(c).await;
    files_remember_they_arrived_privately(c).await;
    draining_and_removing_nodes(c).await;
    transfer_history(c).await;
    jobs(c).await;
}

async fn batch_creates(c: &Catalog) {
    let e = entry("erin");
    c.mkdir("/batch", &e, false).await.unwrap();
    let item = |p: &str, kind| CreateItem {
        path: p.into(),
        entry: e.clone(),
        kind,
        private: false,
    };
    let r = c
        .create_files(
            &[
                item("/batch/empty", CreateKind::Empty),
                item("/batch/data", CreateKind::Pending),
                item("/batch/data", CreateKind::Pending),
                item("/nowhere/x", CreateKind::Empty),
                item("/batch", CreateKind::Pending),
            ],
            false,
        )
        .await
        .unwrap();
    let empty = r[0].as_ref().unwrap();
    assert!(!empty.pending);
    assert_eq!(empty.checksum, crate::EMPTY_CHECKSUM);
    assert!(r[1].as_ref().unwrap().pending);
    assert!(matches!(r[2], Err(CatalogError::Invalid(_))), "{:?}", r[2]);
    assert_eq!(r[3], Err(CatalogError::NotFound("/nowhere".into())));
    assert_eq!(r[4], Err(CatalogError::IsADirectory("/batch".into())));
    assert_eq!(c.stat("/batch/empty").await.unwrap().id, empty.id);
    assert!(c.lookup("/batch/data").await.unwrap().is_none());
    // Existing files: an error without overwrite; replaced with it.
    let again = c
        .create_files(&[item("/batch/empty", CreateKind::Empty)], false)
        .await
        .unwrap();
    assert_eq!(again[0], Err(CatalogError::Exists("/batch/empty".into())));
    let again = c
        .create_files(&[item("/batch/empty", CreateKind::Pending)], false)
        .await
        .unwrap();
    assert_eq!(again[0], Err(CatalogError::Exists("/batch/empty".into())));
    let replaced = c
        .create_files(&[item("/batch/empty", CreateKind::Empty)], true)
        .await
        .unwrap();
    let replaced = replaced[0].as_ref().unwrap();
    assert_ne!(replaced.id, empty.id);
    assert_eq!(c.stat("/batch/empty").await.unwrap().id, replaced.id);
    // A second writer of a pending path is busy.
    let busy = c
        .create_files(&[item("/batch/data", CreateKind::Pending)], true)
        .await
        .unwrap();
    assert_eq!(busy[0], Err(CatalogError::Busy("/batch/data".into())));
    // Many at once.
    let many: Vec<CreateItem> = (0..300)
        .map(|i| item(&format!("/batch/m{i:04}"), CreateKind::Empty))
        .collect();
    let r = c.create_files(&many, false).await.unwrap();
    assert!(r.iter().all(|r| r.is_ok()));
    assert_eq!(c.list("/batch", None, 1000).await.unwrap().len(), 301);
    // Stale pending files are found by age.
    assert!(c.stale_pending(0, 10).await.unwrap().is_empty());
    let stale = c.stale_pending(crate::now_ms() + 1, 10).await.unwrap();
    assert_eq!(stale, vec![r_id(c, "/batch/data").await]);
}

async fn r_id(c: &Catalog, path: &str) -> i64 {
    // The pending file's id, found through its would-be parent.
    let dir = c
        .stat(&crate::parent_and_name(path).unwrap().0)
        .await
        .unwrap();
    let ids = c.stale_pending(crate::now_ms() + 1, 100).await.unwrap();
    for id in ids {
        let i = c.inode(id).await.unwrap();
        if i.parent == dir.id && c.path_of(id).await.unwrap() == path {
            return id;
        }
    }
    panic!("no pending {path}");
}

async fn trees_and_reconciliation(c: &Catalog) {
    let e = entry("frank");
    c.mkdir("/t/a/b", &e, true).await.unwrap();
    let mut ids = Vec::new();
    for p in ["/t/top", "/t/a/one", "/t/a/b/two"] {
        let f = c.create_pending(p, &e).await.unwrap();
        ids.push(
            c.commit_file(f.id, 5, "crc32c:00000001", 0)
                .await
                .unwrap()
                .id,
        );
    }
    let files: Vec<String> = c
        .files_below("/t")
        .await
        .unwrap()
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    assert_eq!(files, vec!["/t/a/b/two", "/t/a/one", "/t/top"]);
    assert_eq!(c.files_below("/t/top").await.unwrap().len(), 1);
    let dirs: Vec<String> = c
        .dirs_below("/t")
        .await
        .unwrap()
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    assert_eq!(dirs, vec!["/t", "/t/a", "/t/a/b"]);
    // Node keys: given at first registration, kept afterwards.
    let reg = |addr: &'static str, key: &'static [u8], cert: &'static str, may_rotate| {
        crate::NodeRegistration {
            name: "n3",
            site: "siteC",
            address: addr,
            capacity: 10,
            free: 10,
            new_key: key,
            cert,
            may_rotate,
        }
    };
    let (_, k1) = c
        .register_node_with_key(&reg("h:1", &[7; 32], "sha256:aa", false))
        .await
        .unwrap();
    let (_, k2) = c
        .register_node_with_key(&reg("h:2", &[8; 32], "sha256:aa", false))
        .await
        .unwrap();
    assert_eq!((k1.clone(), k2), (vec![7; 32], vec![7; 32]));
    assert_eq!(c.node_keys().await.unwrap()["n3"], k1);
    node_keys_follow_certificates(c).await;
    for id in &ids {
        c.set_replica(*id, "n3", ReplicaState::Complete, "crc32c:00000001")
            .await
            .unwrap();
    }
    // The node holds: the first file, the second with a wrong size, and an unknown file.
    let held: std::collections::HashMap<i64, u64> = [(ids[0], 5), (ids[1], 4), (999_999, 1)]
        .into_iter()
        .collect();
    let r = c.reconcile("n3", &held, 60_000).await.unwrap();
    assert_eq!(r.known, 1);
    assert_eq!(r.damaged, vec![ids[1]]);
    assert_eq!(r.missing, vec![ids[2]]);
    assert_eq!(r.orphans, vec![999_999]);
    let states: Vec<ReplicaState> = c
        .replicas(ids[2])
        .await
        .unwrap()
        .iter()
        .map(|r| r.state)
        .collect();
    assert_eq!(states, vec![ReplicaState::Missing]);
    // Orphans wait for the grace period before they are to be deleted.
    assert!(!c.dead_replicas("n3").await.unwrap().contains(&999_999));
    // The missing file comes back: complete again.
    let held: std::collections::HashMap<i64, u64> =
        [(ids[0], 5), (ids[2], 5)].into_iter().collect();
    let r = c.reconcile("n3", &held, 0).await.unwrap();
    assert_eq!(r.known, 2);
    assert_eq!(
        c.replicas(ids[2]).await.unwrap()[0].state,
        ReplicaState::Complete
    );
    let counts = c.replica_counts().await.unwrap();
    assert!(
        counts
            .iter()
            .any(|(n, s, k)| n == "n3" && *s == ReplicaState::Complete && *k == 2)
    );
    assert!(
        c.remove_node("n3").await.is_err(),
        "a node with replicas stays"
    );
}

async fn renames_are_seen_at_once(c: &Catalog) {
    let e = entry("gina");
    c.mkdir("/cache/d", &e, true).await.unwrap();
    let f = c.create_pending("/cache/d/f", &e).await.unwrap();
    c.commit_file(f.id, 1, "crc32c:00000001", 0).await.unwrap();
    // Warm the cache, then change everything it holds.
    assert_eq!(c.stat("/cache/d/f").await.unwrap().id, f.id);
    c.rename("/cache/d", "/cache/e").await.unwrap();
    assert!(c.lookup("/cache/d/f").await.unwrap().is_none());
    assert_eq!(c.stat("/cache/e/f").await.unwrap().id, f.id);
    c.set_mode("/cache/e/f", 0o600).await.unwrap();
    assert_eq!(c.stat("/cache/e/f").await.unwrap().mode, 0o600);
    c.remove("/cache/e", true).await.unwrap();
    assert!(c.lookup("/cache/e/f").await.unwrap().is_none());
    assert!(c.lookup("/cache/e").await.unwrap().is_none());
    c.mkdir("/cache/e", &e, false).await.unwrap();
    assert!(c.lookup("/cache/e/f").await.unwrap().is_none());
}

async fn directories(c: &Catalog) {
    let e = entry("alice");
    let d = c.mkdir("/exp", &e, false).await.unwrap();
    assert_eq!(d.kind, Kind::Dir);
    assert_eq!(
        c.mkdir("/exp", &e, false).await.unwrap_err(),
        CatalogError::Exists("/exp".into())
    );
    assert_eq!(
        c.mkdir("/exp", &e, true).await.unwrap().id,
        d.id,
        "mkdir -p of an existing directory"
    );
    assert_eq!(
        c.mkdir("/a/b/c", &e, false).await.unwrap_err(),
        CatalogError::NotFound("/a".into())
    );
    let deep = c.mkdir("/a/b/c", &e, true).await.unwrap();
    assert_eq!(c.path_of(deep.id).await.unwrap(), "/a/b/c");
    assert_eq!(c.stat("/a/b").await.unwrap().owner, "alice");
    assert_eq!(
        c.stat("/nope").await.unwrap_err(),
        CatalogError::NotFound("/nope".into())
    );
    assert!(matches!(
        c.mkdir("/a/../x", &e, false).await,
        Err(CatalogError::Invalid(_))
    ));
    assert!(c.remove("/", true).await.is_err());
}

/// `mkdir_checked` shows `authorize` the entries along the path as they are in its own
/// transaction, creates nothing it refuses, and creates what it allows with the entry it gives.
async fn checked_mkdir_decides_on_what_its_transaction_sees(c: &Catalog) {
    let e = entry("alice");
    c.mkdir("/chk", &e, false).await.unwrap();
    let seen = std::sync::Mutex::new(Vec::new());
    let allow = |owner: &'static str| {
        let seen = &seen;
        move |chain: &[Inode], missing: usize| {
            let names: Vec<String> = chain.iter().map(|i| i.name.clone()).collect();
            seen.lock().unwrap().push((names, missing));
            Ok::<_, &str>(entry(owner))
        }
    };
    let d = c
        .mkdir_checked("/chk/a/b", true, allow("bob"))
        .await
        .unwrap();
    assert_eq!(c.path_of(d.id).await.unwrap(), "/chk/a/b");
    assert_eq!(c.stat("/chk/a").await.unwrap().owner, "bob");
    assert_eq!(c.stat("/chk/a/b").await.unwrap().owner, "bob");
    let (names, missing) = seen.lock().unwrap().pop().unwrap();
    assert_eq!(names.last().map(String::as_str), Some("chk"));
    assert_eq!(missing, 2);
    // An existing directory: all of it seen, nothing missing, nothing created.
    let again = c
        .mkdir_checked("/chk/a/b", true, allow("carol"))
        .await
        .unwrap();
    assert_eq!((again.id, again.owner.as_str()), (d.id, "bob"));
    assert_eq!(seen.lock().unwrap().pop().unwrap().1, 0);
    assert_eq!(
        c.mkdir_checked("/chk/a/b", false, allow("bob"))
            .await
            .unwrap_err(),
        Checked::Catalog(CatalogError::Exists("/chk/a/b".into()))
    );
    assert_eq!(
        c.mkdir_checked("/chk/x/y", false, allow("bob"))
            .await
            .unwrap_err(),
        Checked::Catalog(CatalogError::NotFound("/chk/x".into()))
    );
    // A refusal creates nothing and is returned as it is.
    let refuse = |_: &[Inode], _: usize| Err("no");
    assert_eq!(
        c.mkdir_checked("/chk/r/s", true, refuse).await.unwrap_err(),
        Checked::Refused("no")
    );
    assert!(c.lookup("/chk/r").await.unwrap().is_none());
}

/// `remove_checked` and `rename_checked` show `authorize` the entries as their own
/// transaction sees them (for a recursive removal every directory below, with its path),
/// change nothing they refuse, and change what they allow.
async fn checked_remove_and_rename_decide_on_what_their_transaction_sees(c: &Catalog) {
    let e = entry("alice");
    c.mkdir("/rm/t/u/v", &e, true).await.unwrap();
    c.mkdir("/rm/t/w", &e, true).await.unwrap();
    let f = c.create_pending("/rm/t/u/file", &e).await.unwrap();
    c.commit_file(f.id, 0, "crc32c:00000000", 0).await.unwrap();
    // A refusal removes nothing and comes back as it is.
    let seen = std::sync::Mutex::new(None);
    let r = c
        .remove_checked(
            "/rm/t",
            true,
            |chain: &[Inode], below: &[(String, Inode)]| {
                let names: Vec<String> = chain.iter().map(|i| i.name.clone()).collect();
                let paths: Vec<String> = below.iter().map(|(p, _)| p.clone()).collect();
                *seen.lock().unwrap() = Some((names, paths));
                Err("not yours")
            },
        )
        .await;
    assert!(matches!(r, Err(Checked::Refused("not yours"))));
    let (names, paths) = seen.lock().unwrap().take().unwrap();
    assert_eq!(names.last().map(String::as_str), Some("t"));
    assert_eq!(paths, ["/rm/t/u", "/rm/t/u/v", "/rm/t/w"]);
    assert!(c.lookup("/rm/t/u/file").await.unwrap().is_some());
    // Allowed: the tree goes (t, u, v, w and the file).
    let n = c
        .remove_checked("/rm/t", true, |_: &[Inode], _: &[(String, Inode)]| {
            Ok::<(), ()>(())
        })
        .await
        .unwrap();
    assert_eq!(n, 5);
    assert!(c.lookup("/rm/t").await.unwrap().is_none());
    // A missing path is shown as far as it exists; the catalog's own error follows.
    let r = c
        .remove_checked(
            "/rm/gone",
            false,
            |chain: &[Inode], below: &[(String, Inode)]| {
                assert_eq!(chain.last().map(|i| i.name.as_str()), Some("rm"));
                assert!(below.is_empty());
                Ok::<(), ()>(())
            },
        )
        .await;
    assert!(matches!(
        r,
        Err(Checked::Catalog(CatalogError::NotFound(_)))
    ));
    // Rename: the source's chain, the destination's parent chain and what it replaces.
    c.mkdir("/rm/dst", &e, false).await.unwrap();
    for p in ["/rm/a", "/rm/dst/b"] {
        let f = c.create_pending(p, &e).await.unwrap();
        c.commit_file(f.id, 0, "crc32c:00000000", 0).await.unwrap();
    }
    let r = c
        .rename_checked(
            "/rm/a",
            "/rm/dst/b",
            |from: &[Inode], to: &[Inode], target: Option<&Inode>| {
                assert_eq!(from.last().map(|i| i.name.as_str()), Some("a"));
                assert_eq!(to.last().map(|i| i.name.as_str()), Some("dst"));
                assert_eq!(target.map(|i| i.name.as_str()), Some("b"));
                Err("no")
            },
        )
        .await;
    assert!(matches!(r, Err(Checked::Refused("no"))));
    assert!(c.lookup("/rm/a").await.unwrap().is_some());
    let moved = c
        .rename_checked(
            "/rm/a",
            "/rm/dst/b",
            |_: &[Inode], _: &[Inode], _: Option<&Inode>| Ok::<(), ()>(()),
        )
        .await
        .unwrap();
    assert_eq!(c.path_of(moved.id).await.unwrap(), "/rm/dst/b");
    assert!(c.lookup("/rm/a").await.unwrap().is_none());
    // A destination below a file: its parent chain ends at the file, with no target.
    let r = c
        .rename_checked(
            "/rm/dst/b",
            "/rm/dst/b/c",
            |_: &[Inode], to: &[Inode], target: Option<&Inode>| {
                assert_eq!(
                    to.last().map(|i| (i.name.as_str(), i.kind)),
                    Some(("b", Kind::File))
                );
                assert!(target.is_none());
                Err("not a directory")
            },
        )
        .await;
    assert!(matches!(r, Err(Checked::Refused("not a directory"))));
}

async fn files_appear_only_when_committed(c: &Catalog) {
    let e = entry("alice");
    let p = c.create_pending("/exp/run1.nc", &e).await.unwrap();
    assert!(p.pending);
    assert!(
        c.lookup("/exp/run1.nc").await.unwrap().is_none(),
        "pending files are invisible"
    );
    assert!(c.list("/exp", None, 100).await.unwrap().is_empty());
    assert_eq!(c.path_of(p.id).await.unwrap(), "/exp/run1.nc");
    // A second writer of the same path conflicts while the first is pending.
    assert_eq!(
        c.create_pending("/exp/run1.nc", &e).await.unwrap_err(),
        CatalogError::Busy("/exp/run1.nc".into())
    );
    assert_eq!(
        c.create_pending("/exp", &e).await.unwrap_err(),
        CatalogError::IsADirectory("/exp".into())
    );
    assert_eq!(
        c.create_pending("/missing/f", &e).await.unwrap_err(),
        CatalogError::NotFound("/missing".into())
    );
    let f = c
        .commit_file(p.id, 4096, "crc32c:0a0b0c0d", 5)
        .await
        .unwrap();
    assert!(!f.pending);
    assert_eq!(
        (f.size, f.checksum.as_str(), f.mtime_ns),
        (4096, "crc32c:0a0b0c0d", 5)
    );
    assert_eq!(c.stat("/exp/run1.nc").await.unwrap().id, p.id);
    assert!(
        c.commit_file(p.id, 1, "x", 1).await.is_err(),
        "commit twice"
    );
    // Aborting a pending file leaves nothing behind.
    let q = c.create_pending("/exp/tmp.nc", &e).await.unwrap();
    c.abort_pending(q.id).await.unwrap();
    assert!(c.inode(q.id).await.is_err());
    assert_eq!(
        c.create_pending("/exp/run1.nc/x", &e).await.unwrap_err(),
        CatalogError::NotADirectory("/exp/run1.nc".into())
    );
}

async fn replacing_and_removing_bury_replicas(c: &Catalog) {
    let e = entry("alice");
    c.register_node("n1", "siteA", "10.0.0.1:5811", 1000, 500)
        .await
        .unwrap();
    let old = c.stat("/exp/run1.nc").await.unwrap();
    c.set_replica(old.id, "n1", ReplicaState::Complete, "crc32c:0a0b0c0d")
        .await
        .unwrap();
    // Overwriting: the new version becomes visible at commit, the old one's replica is dead.
    let new = c.create_pending("/exp/run1.nc", &e).await.unwrap();
    assert_eq!(
        c.stat("/exp/run1.nc").await.unwrap().id,
        old.id,
        "old version visible while the new is written"
    );
    c.set_replica(new.id, "n1", ReplicaState::Writing, "")
        .await
        .unwrap();
    let done = c
        .complete_replica(new.id, "n1", 10, "crc32c:11111111", 7)
        .await
        .unwrap();
    assert_eq!(done.id, new.id);
    assert_eq!(c.stat("/exp/run1.nc").await.unwrap().id, new.id);
    assert!(c.inode(old.id).await.is_err());
    assert_eq!(c.dead_replicas("n1").await.unwrap(), vec![old.id]);
    c.forget_dead("n1", &[old.id]).await.unwrap();
    assert!(c.dead_replicas("n1").await.unwrap().is_empty());
    // A second complete replica must match the committed file.
    assert!(
        c.complete_replica(new.id, "n1", 11, "crc32c:11111111", 7)
            .await
            .is_err()
    );
    // Removing: not empty without recursion; recursive removal buries every replica.
    assert_eq!(
        c.remove("/exp", false).await.unwrap_err(),
        CatalogError::NotEmpty("/exp".into())
    );
    c.mkdir("/exp/sub", &e, false).await.unwrap();
    let p2 = c.create_pending("/exp/sub/f", &e).await.unwrap();
    c.set_replica(p2.id, "n1", ReplicaState::Writing, "")
        .await
        .unwrap();
    let removed = c.remove("/exp", true).await.unwrap();
    assert_eq!(removed, 4, "exp, run1.nc, sub, the pending f");
    let mut dead = c.dead_replicas("n1").await.unwrap();
    dead.sort();
    assert_eq!(dead, vec![new.id, p2.id]);
    assert!(c.lookup("/exp").await.unwrap().is_none());
}

async fn rename_rules(c: &Catalog) {
    let e = entry("bob");
    c.mkdir("/r/x", &e, true).await.unwrap();
    for name in ["f1", "f2"] {
        let p = c.create_pending(&format!("/r/{name}"), &e).await.unwrap();
        c.commit_file(p.id, 1, "c", 1).await.unwrap();
    }
    let f1 = c.stat("/r/f1").await.unwrap();
    c.rename("/r/f1", "/r/x/g").await.unwrap();
    assert_eq!(c.stat("/r/x/g").await.unwrap().id, f1.id);
    assert!(c.lookup("/r/f1").await.unwrap().is_none());
    // A file replaces a file; a directory is never replaced; nothing moves into itself.
    c.rename("/r/x/g", "/r/f2").await.unwrap();
    assert_eq!(c.stat("/r/f2").await.unwrap().id, f1.id);
    assert_eq!(
        c.rename("/r/f2", "/r/x").await.unwrap_err(),
        CatalogError::Exists("/r/x".into())
    );
    assert!(matches!(
        c.rename("/r", "/r/x/inside").await,
        Err(CatalogError::Invalid(_))
    ));
    assert_eq!(
        c.rename("/nothing", "/r/y").await.unwrap_err(),
        CatalogError::NotFound("/nothing".into())
    );
    c.rename("/r/x", "/r/y").await.unwrap();
    assert_eq!(c.stat("/r/y").await.unwrap().kind, Kind::Dir);
}

async fn attributes_and_xattrs(c: &Catalog) {
    let i = c.set_mode("/r/f2", 0o640).await.unwrap();
    assert_eq!(i.mode, 0o640);
    assert_eq!(c.set_owner("/r/f2", "carol").await.unwrap().owner, "carol");
    assert_eq!(c.set_group("/r/f2", "atlas").await.unwrap().group, "atlas");
    assert_eq!(c.set_mtime("/r/f2", 42).await.unwrap().mtime_ns, 42);
    c.xattr_set("/r/f2", "user.experiment", b"CMIP5")
        .await
        .unwrap();
    c.xattr_set("/r/f2", "user.experiment", b"CMIP6")
        .await
        .unwrap();
    c.xattr_set("/r/f2", "user.a", &[0, 255]).await.unwrap();
    assert_eq!(
        c.xattr_get("/r/f2", "user.experiment")
            .await
            .unwrap()
            .unwrap(),
        b"CMIP6"
    );
    assert_eq!(c.xattr_list("/r/f2").await.unwrap().len(), 2);
    assert!(c.xattr_remove("/r/f2", "user.a").await.unwrap());
    assert!(!c.xattr_remove("/r/f2", "user.a").await.unwrap());
    assert_eq!(c.xattr_get("/r/f2", "user.none").await.unwrap(), None);
    assert!(c.xattr_set("/r/f2", "", b"x").await.is_err());
    assert!(c.xattr_get("/none", "a").await.is_err());
}

async fn nodes_and_replicas(c: &Catalog) {
    let n = c
        .register_node("n2", "siteB", "10.0.1.1:5811", 2000, 1500)
        .await
        .unwrap();
    assert!(n.up);
    let n = c.heartbeat("n2", 2000, 1200, 0.5).await.unwrap();
    assert_eq!((n.free, n.load), (1200, 0.5));
    assert!(c.heartbeat("ghost", 1, 1, 0.0).await.is_err());
    let nodes = c.nodes().await.unwrap();
    assert_eq!(
        nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(),
        vec!["n1", "n2"]
    );
    let f = c.stat("/r/f2").await.unwrap();
    c.set_replica(f.id, "n2", ReplicaState::Complete, &f.checksum)
        .await
        .unwrap();
    c.set_replica(f.id, "n1", ReplicaState::Damaged, "bad")
        .await
        .unwrap();
    let reps = c.replicas(f.id).await.unwrap();
    assert_eq!(reps.len(), 2);
    assert_eq!(reps[0].state, ReplicaState::Damaged);
    assert_eq!(c.node_replicas("n2").await.unwrap().len(), 1);
    assert!(
        c.set_replica(f.id, "ghost", ReplicaState::Complete, "")
            .await
            .is_err(),
        "unknown node"
    );
    c.remove_replica(f.id, "n1").await.unwrap();
    assert_eq!(c.replicas(f.id).await.unwrap().len(), 1);
    assert!(c.dead_replicas("n1").await.unwrap().contains(&f.id));
    // Nodes silent for longer than the limit go down.
    assert!(c.expire_nodes(3_600_000).await.unwrap().is_empty());
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let down = c.expire_nodes(5).await.unwrap();
    assert_eq!(down.len(), 2);
    assert!(!c.node("n1").await.unwrap().up);
    assert!(
        c.heartbeat("n1", 1000, 500, 0.1).await.unwrap().up,
        "a heartbeat brings it back"
    );
}

async fn listing_pages(c: &Catalog) {
    let e = entry("dave");
    c.mkdir("/big", &e, false).await.unwrap();
    for i in 0..25 {
        let p = c
            .create_pending(&format!("/big/f{i:03}"), &e)
            .await
            .unwrap();
        c.commit_file(p.id, i, "c", 0).await.unwrap();
    }
    let first = c.list("/big", None, 10).await.unwrap();
    assert_eq!(first.len(), 10);
    assert_eq!(first[0].name, "f000");
    let next = c.list("/big", Some(&first[9].name), 100).await.unwrap();
    assert_eq!(next.len(), 15);
    assert_eq!(next[0].name, "f010");
    // Listing a file lists the file; the root lists its children, not itself.
    assert_eq!(c.list("/big/f001", None, 10).await.unwrap()[0].name, "f001");
    assert!(
        c.list("/", None, 100)
            .await
            .unwrap()
            .iter()
            .all(|i| !i.name.is_empty())
    );
}

/// Issue 11 C2: an existing key is never handed to a registration with another certificate.
async fn node_keys_follow_certificates(c: &Catalog) {
    let reg = |key: &'static [u8], cert: &'static str, may_rotate| crate::NodeRegistration {
        name: "k1",
        site: "siteK",
        address: "k:1",
        capacity: 10,
        free: 10,
        new_key: key,
        cert,
        may_rotate,
    };
    let (_, first) = c
        .register_node_with_key(&reg(&[1; 32], "sha256:01", false))
        .await
        .unwrap();
    assert_eq!(first, vec![1; 32]);
    // Restarts with the same certificate keep the key.
    let (_, again) = c
        .register_node_with_key(&reg(&[2; 32], "sha256:01", false))
        .await
        .unwrap();
    assert_eq!(again, first);
    // Another certificate of the same name: refused, and the key is not in the answer.
    let e = c
        .register_node_with_key(&reg(&[3; 32], "sha256:02", false))
        .await
        .unwrap_err();
    assert!(matches!(e, CatalogError::Denied(_)), "{e:?}");
    assert!(e.to_string().contains("sha256:01"), "{e}");
    assert_eq!(c.node_keys().await.unwrap()["k1"], first);
    // Enrolled by its fingerprint: the new certificate gets a new key, the old one is void.
    let (_, rotated) = c
        .register_node_with_key(&reg(&[4; 32], "sha256:02", true))
        .await
        .unwrap();
    assert_eq!(rotated, vec![4; 32]);
    let e = c
        .register_node_with_key(&reg(&[5; 32], "sha256:01", false))
        .await
        .unwrap_err();
    assert!(matches!(e, CatalogError::Denied(_)), "{e:?}");
    // A registration without key business (tools) changes no key.
    c.register_node("k1", "siteK", "k:2", 10, 10).await.unwrap();
    assert_eq!(c.node_keys().await.unwrap()["k1"], vec![4; 32]);
    // A node registered before certificates were recorded (a key, no certificate) gets a
    // new key whatever certificate it comes with.
    let legacy = |key: &'static [u8], cert: &'static str| crate::NodeRegistration {
        name: "k2",
        site: "siteK",
        address: "k:3",
        capacity: 10,
        free: 10,
        new_key: key,
        cert,
        may_rotate: false,
    };
    let (_, k) = c
        .register_node_with_key(&legacy(&[9; 32], ""))
        .await
        .unwrap();
    assert_eq!(k, vec![9; 32]);
    let (_, k) = c
        .register_node_with_key(&legacy(&[6; 32], "sha256:06"))
        .await
        .unwrap();
    assert_eq!(k, vec![6; 32]);
    let (_, k) = c
        .register_node_with_key(&legacy(&[7; 32], "sha256:06"))
        .await
        .unwrap();
    assert_eq!(k, vec![6; 32]);
    for n in ["k1", "k2"] {
        c.remove_node(n).await.unwrap();
    }
}

/// Issue 11 C7: a replica becomes complete only where one is being written, and a complete
/// replica is never turned back into one being written (no write may be granted over it).
async fn replicas_complete_only_where_being_written(c: &Catalog) {
    let e = entry("wendy");
    c.mkdir("/wr", &e, false).await.unwrap();
    for n in ["w1", "w2"] {
        c.register_node(n, "siteW", "w:1", 100, 100).await.unwrap();
    }
    let f = c.create_pending("/wr/f", &e).await.unwrap();
    let done = |node: &'static str, sum: &'static str| c.complete_replica(f.id, node, 3, sum, 1);
    // Nobody asked w1 to write it: refused, the file stays pending.
    assert!(matches!(
        done("w1", "crc32c:00000003").await,
        Err(CatalogError::Denied(_))
    ));
    assert!(c.inode(f.id).await.unwrap().pending);
    assert!(
        c.start_replicas(&[(f.id, "w1".into())], 0)
            .await
            .unwrap()
            .is_empty()
    );
    done("w1", "crc32c:00000003").await.unwrap();
    assert!(!c.inode(f.id).await.unwrap().pending);
    // Reported again (a retry): nothing changes.
    done("w1", "crc32c:00000003").await.unwrap();
    // A second copy: w1's complete replica is not restarted, w2's is.
    let skipped = c
        .start_replicas(&[(f.id, "w1".into()), (f.id, "w2".into())], 0)
        .await
        .unwrap();
    assert_eq!(skipped, vec![(f.id, "w1".to_string())]);
    let state = |node: &'static str| async move {
        c.replicas(f.id)
            .await
            .unwrap()
            .into_iter()
            .find(|r| r.node == node)
            .map(|r| r.state)
    };
    assert_eq!(state("w1").await, Some(ReplicaState::Complete));
    assert_eq!(state("w2").await, Some(ReplicaState::Writing));
    assert!(matches!(
        done("w2", "crc32c:0000000f").await,
        Err(CatalogError::Invalid(_))
    ));
    done("w2", "crc32c:00000003").await.unwrap();
    // A damaged replica is not completed by a report, only by a write that was started.
    c.mark_replicas(&[(f.id, "w2".into())], ReplicaState::Damaged)
        .await
        .unwrap();
    assert!(matches!(
        done("w2", "crc32c:00000003").await,
        Err(CatalogError::Denied(_))
    ));
    assert!(
        c.start_replicas(&[(f.id, "w2".into())], 0)
            .await
            .unwrap()
            .is_empty()
    );
    done("w2", "crc32c:00000003").await.unwrap();
    assert_eq!(state("w2").await, Some(ReplicaState::Complete));
    c.remove("/wr", true).await.unwrap();
    for n in ["w1", "w2"] {
        c.forget_dead(n, &[f.id]).await.unwrap();
        c.remove_node(n).await.unwrap();
    }
}

/// Group commit: a node's reports of many replicas go in one transaction, each with its own
/// result; one that fails (even after it changed rows) changes nothing, the others commit.
async fn replicas_complete_in_groups(c: &Catalog) {
    let e = entry("gina");
    c.mkdir("/gc", &e, false).await.unwrap();
    c.register_node("g1", "siteG", "g:1", 100, 100)
        .await
        .unwrap();
    let mut ids = Vec::new();
    for name in ["a", "d", "b"] {
        let f = c.create_pending(&format!("/gc/{name}"), &e).await.unwrap();
        assert!(
            c.start_replicas(&[(f.id, "g1".into())], 0)
                .await
                .unwrap()
                .is_empty()
        );
        ids.push(f.id);
    }
    // "d" becomes a directory while its file is written: its commit fails after its replica
    // row was already marked complete, which the savepoint must undo.
    c.mkdir("/gc/d", &e, false).await.unwrap();
    let written = |inode: i64, size: u64| WrittenReplica {
        inode,
        size,
        checksum: format!("crc32c:{size:08x}"),
        mtime_ns: 5,
    };
    let results = c
        .complete_replicas(
            "g1",
            &[
                written(ids[0], 1),
                written(i64::MAX - 7, 2),
                written(ids[1], 3),
                written(ids[2], 4),
            ],
        )
        .await
        .unwrap();
    assert_eq!(results.len(), 4);
    assert_eq!(results[0].as_ref().unwrap().id, ids[0]);
    assert!(matches!(results[1], Err(CatalogError::NotFound(_))));
    assert!(matches!(results[2], Err(CatalogError::IsADirectory(_))));
    assert_eq!(results[3].as_ref().unwrap().id, ids[2]);
    assert_eq!(c.stat("/gc/a").await.unwrap().size, 1);
    assert_eq!(c.stat("/gc/b").await.unwrap().size, 4);
    assert_eq!(c.stat("/gc/d").await.unwrap().kind, Kind::Dir);
    assert!(c.inode(ids[1]).await.unwrap().pending);
    let d_state = c.replicas(ids[1]).await.unwrap();
    assert_eq!(d_state.len(), 1);
    assert_eq!(d_state[0].state, ReplicaState::Writing);
    // Reported again (a retry of the whole group): the committed ones change nothing.
    let again = c
        .complete_replicas("g1", &[written(ids[0], 1), written(ids[2], 4)])
        .await
        .unwrap();
    assert!(again.iter().all(|r| r.is_ok()));
    assert!(c.complete_replicas("g1", &[]).await.unwrap().is_empty());
    c.abort_pending(ids[1]).await.unwrap();
    c.remove("/gc", true).await.unwrap();
    c.forget_dead("g1", &ids).await.unwrap();
    c.remove_node("g1").await.unwrap();
}

/// Issue 11 C8: replicas left "writing" by a session that died (with its metadata server)
/// blocked their node forever. They expire with their lease, which the running session renews
/// (so other metadata servers sharing the database leave its rows alone); uploads' rows go
/// with their pending file instead.
async fn writing_replicas_expire_with_their_lease(c: &Catalog) {
    let e = entry("lee");
    c.mkdir("/lease", &e, false).await.unwrap();
    for n in ["l1", "l2"] {
        c.register_node(n, "siteL", "l:1", 100, 100).await.unwrap();
    }
    let e = &e;
    let committed = |name: &'static str| async move {
        let f = c
            .create_pending(&format!("/lease/{name}"), e)
            .await
            .unwrap();
        c.commit_file(f.id, 3, "crc32c:00000003", 1).await.unwrap()
    };
    let (a, b) = (committed("a").await, committed("b").await);
    let upload = c.create_pending("/lease/up", e).await.unwrap();
    let t = crate::now_ms();
    // a copy to l1 held until t+1000, b copy to l1 until t+5000, an upload to l2 (no lease).
    c.start_replicas(&[(a.id, "l1".into())], t + 1000)
        .await
        .unwrap();
    c.start_replicas(&[(b.id, "l1".into())], t + 5000)
        .await
        .unwrap();
    c.start_replicas(&[(upload.id, "l2".into())], 0)
        .await
        .unwrap();
    assert!(c.expire_writing(t, None).await.unwrap().is_empty());
    // The session of a renews its lease: still held at t+2000.
    c.renew_writing(&[(a.id, "l1".into())], t + 3000)
        .await
        .unwrap();
    assert!(c.expire_writing(t + 2000, None).await.unwrap().is_empty());
    // Past its lease: a goes; b, and the upload of a pending file, stay.
    assert_eq!(
        c.expire_writing(t + 4000, None).await.unwrap(),
        vec![(a.id, "l1".to_string())]
    );
    assert!(c.replicas(a.id).await.unwrap().is_empty());
    assert_eq!(c.replicas(b.id).await.unwrap().len(), 1);
    assert_eq!(c.replicas(upload.id).await.unwrap().len(), 1);
    // Only one node's: the node's inventory expires its own (and l2 has none expired).
    assert!(
        c.expire_writing(i64::MAX, Some("l2"))
            .await
            .unwrap()
            .is_empty()
    );
    // A renewal never revives a replica that is no longer being written.
    c.renew_writing(&[(a.id, "l1".into())], i64::MAX)
        .await
        .unwrap();
    assert!(c.replicas(a.id).await.unwrap().is_empty());
    // The node's inventory: an expired copy is forgotten, and the file it holds for it is
    // then unknown to the catalog (removed after the grace period).
    c.start_replicas(&[(a.id, "l1".into())], t - 1)
        .await
        .unwrap();
    let held: std::collections::HashMap<i64, u64> = [(a.id, 3)].into_iter().collect();
    let r = c.reconcile("l1", &held, 60_000).await.unwrap();
    assert_eq!(r.orphans, vec![a.id]);
    assert!(c.replicas(a.id).await.unwrap().is_empty());
    // Whatever the time now, everything on l1 goes when asked to (a server owning the catalog
    // at start).
    c.expire_writing(i64::MAX, Some("l1")).await.unwrap();
    assert!(c.replicas(b.id).await.unwrap().is_empty());
    c.remove("/lease", true).await.unwrap();
    for n in ["l1", "l2"] {
        let dead = c.dead_replicas(n).await.unwrap();
        c.forget_dead(n, &dead).await.unwrap();
        c.remove_node(n).await.unwrap();
    }
}

/// Issue 11 C10: whether a file arrived over private streams is kept with it, so its copies
/// travel privately too.
async fn files_remember_they_arrived_privately(c: &Catalog) {
    let e = entry("pia");
    c.mkdir("/priv", &e, false).await.unwrap();
    let item = |p: &str, private| CreateItem {
        path: p.into(),
        entry: e.clone(),
        kind: CreateKind::Pending,
        private,
    };
    let r = c
        .create_files(
            &[item("/priv/secret", true), item("/priv/open", false)],
            false,
        )
        .await
        .unwrap();
    let (s, o) = (r[0].clone().unwrap(), r[1].clone().unwrap());
    assert!(s.private && !o.private);
    c.commit_file(s.id, 1, "crc32c:00000001", 0).await.unwrap();
    c.commit_file(o.id, 1, "crc32c:00000001", 0).await.unwrap();
    assert!(c.stat("/priv/secret").await.unwrap().private);
    assert!(!c.stat("/priv/open").await.unwrap().private);
    let below = c.files_below("/priv").await.unwrap();
    assert_eq!(
        below.iter().map(|(_, i)| i.private).collect::<Vec<_>>(),
        vec![false, true]
    );
    // A new version uploaded in clear replaces the flag with its own.
    let again = c
        .create_files(&[item("/priv/secret", false)], true)
        .await
        .unwrap()
        .remove(0)
        .unwrap();
    c.commit_file(again.id, 1, "crc32c:00000001", 0)
        .await
        .unwrap();
    assert!(!c.stat("/priv/secret").await.unwrap().private);
    c.remove("/priv", true).await.unwrap();
}

async fn draining_and_removing_nodes(c: &Catalog) {
    let e = entry("dora");
    c.mkdir("/drain", &e, false).await.unwrap();
    for n in ["d1", "d2"] {
        c.register_node(n, "S", "127.0.0.1:1", 1000, 900)
            .await
            .unwrap();
    }
    let mut ids = Vec::new();
    for (name, size) in [("both", 10u64), ("only", 20), ("empty", 0)] {
        let p = c
            .create_pending(&format!("/drain/{name}"), &e)
            .await
            .unwrap();
        c.commit_file(p.id, size, "crc32c:00000001", 0)
            .await
            .unwrap();
        ids.push(p.id);
    }
    let (both, only, empty) = (ids[0], ids[1], ids[2]);
    for (id, node) in [(both, "d1"), (both, "d2"), (only, "d1"), (empty, "d1")] {
        c.set_replica(id, node, ReplicaState::Complete, "crc32c:00000001")
            .await
            .unwrap();
    }
    // A record keeps the time it was made through later changes.
    let made = c.replicas(both).await.unwrap()[0].created_ms;
    assert!(made > 0);
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    c.set_replica(both, "d1", ReplicaState::Complete, "crc32c:00000001")
        .await
        .unwrap();
    let again = &c.replicas(both).await.unwrap()[0];
    assert_eq!(again.created_ms, made);
    assert!(again.updated_ms > made);
    let usage = c.node_usage().await.unwrap();
    assert_eq!(usage.get("d1"), Some(&(3, 30)), "{usage:?}");
    assert_eq!(usage.get("d2"), Some(&(1, 10)), "{usage:?}");

    assert_eq!(c.node("d1").await.unwrap().drain_ms, 0);
    let d = c.set_drain("d1", true).await.unwrap();
    assert!(d.drain_ms > 0);
    assert_eq!(d.drain_replicas, 3);
    // Draining again keeps the start; heartbeats and re-registration keep the drain.
    c.remove_replica(only, "d1").await.unwrap();
    let again = c.set_drain("d1", true).await.unwrap();
    assert_eq!((again.drain_ms, again.drain_replicas), (d.drain_ms, 3));
    c.heartbeat("d1", 1000, 800, 0.5).await.unwrap();
    c.register_node("d1", "S", "127.0.0.1:2", 1000, 800)
        .await
        .unwrap();
    assert_eq!(c.node("d1").await.unwrap().drain_ms, d.drain_ms);
    assert!(matches!(
        c.set_drain("ghost", true).await,
        Err(CatalogError::NotFound(_))
    ));
    let off = c.set_drain("d1", false).await.unwrap();
    assert_eq!((off.drain_ms, off.drain_replicas), (0, 0));
    c.set_replica(only, "d1", ReplicaState::Complete, "crc32c:00000001")
        .await
        .unwrap();

    // A plain removal is refused while replicas remain; a forced one says what is lost: the
    // file whose one copy was there (not the empty file, not the one with a copy on d2).
    assert!(matches!(
        c.remove_node("d1").await,
        Err(CatalogError::NotEmpty(_))
    ));
    let lost = c.remove_node_forced("d1").await.unwrap();
    assert_eq!(lost.replicas, 3);
    assert_eq!(lost.orphaned, vec![only]);
    assert!(matches!(c.node("d1").await, Err(CatalogError::NotFound(_))));
    assert!(c.replicas(only).await.unwrap().is_empty());
    assert_eq!(c.replicas(both).await.unwrap().len(), 1);
    assert!(c.stat("/drain/only").await.is_ok(), "the file stays listed");
    assert!(matches!(
        c.remove_node_forced("d1").await,
        Err(CatalogError::NotFound(_))
    ));
    c.remove("/drain", true).await.unwrap();
    c.remove_replica(both, "d2").await.unwrap();
    c.forget_dead("d2", &[both]).await.unwrap();
    c.remove_node("d2").await.unwrap();
}

async fn transfer_history(c: &Catalog) {
    let rec =
        |kind: &str, user: &str, src: &str, dst: &str, ended: i64, failed: u64| TransferRecord {
            kind: kind.into(),
            user: user.into(),
            source: "/a".into(),
            destination: "/b".into(),
            src_site: src.into(),
            dst_site: dst.into(),
            started_ms: ended - 10,
            ended_ms: ended,
            files: 3,
            files_failed: failed,
            bytes: 1 << 40,
            bytes_moved: u64::MAX,
            streams: 8,
            retransmits: 5,
            attempts: 2,
            error_kind: if failed > 0 {
                "integrity".into()
            } else {
                String::new()
            },
            exit_code: if failed > 0 { 7 } else { 0 },
            error: if failed > 0 {
                "checksum mismatch".into()
            } else {
                String::new()
            },
            summary: "plan: 8 streams; cubic".into(),
            ..Default::default()
        };
    let file = |i: usize| TransferFile {
        path: format!("/b/f{i}"),
        node: "n1".into(),
        bytes: i as u64,
        checksum: "crc32c:00000001".into(),
        ..Default::default()
    };
    let many: Vec<TransferFile> = (0..450).map(file).collect();
    let a = c
        .record_transfer(
            &rec("upload", "ann", "client", "S1", 1_000, 0),
            &many[..250],
        )
        .await
        .unwrap();
    assert!(matches!(
        c.add_transfer_files(a, &many[250..], 449).await,
        Err(CatalogError::Invalid(_))
    ));
    assert_eq!(
        c.add_transfer_files(a, &many[250..], 450).await.unwrap(),
        450
    );
    let b = c
        .record_transfer(&rec("download", "bob", "S2", "client", 2_000, 1), &[])
        .await
        .unwrap();
    let r = c
        .record_transfer(
            &rec("replicate", "system", "S1", "S2", 3_000, 0),
            &[file(7)],
        )
        .await
        .unwrap();
    assert!(a < b && b < r);
    assert!(matches!(
        c.add_transfer_files(r + 100, &[file(1)], 10).await,
        Err(CatalogError::NotFound(_))
    ));

    let ids = |v: Vec<TransferRecord>| v.iter().map(|t| t.id).collect::<Vec<_>>();
    let all = TransferFilter {
        limit: 100,
        ..Default::default()
    };
    let listed = c.transfers(&all).await.unwrap();
    assert_eq!(ids(listed.clone()), vec![r, b, a], "newest first");
    // Numbers beyond i64 are clamped, everything else comes back as stored.
    let mut want = rec("download", "bob", "S2", "client", 2_000, 1);
    want.id = b;
    want.bytes_moved = i64::MAX as u64;
    assert_eq!(listed[1], want);
    let with = |f: TransferFilter| async move { ids(c.transfers(&f).await.unwrap()) };
    assert_eq!(
        with(TransferFilter {
            user: Some("ann".into()),
            ..all.clone()
        })
        .await,
        vec![a]
    );
    assert_eq!(
        with(TransferFilter {
            site: Some("S2".into()),
            ..all.clone()
        })
        .await,
        vec![r, b]
    );
    assert_eq!(
        with(TransferFilter {
            kind: Some("replicate".into()),
            ..all.clone()
        })
        .await,
        vec![r]
    );
    assert_eq!(
        with(TransferFilter {
            since_ms: Some(2_000),
            ..all.clone()
        })
        .await,
        vec![r, b]
    );
    assert_eq!(
        with(TransferFilter {
            failed_only: true,
            ..all.clone()
        })
        .await,
        vec![b]
    );
    assert_eq!(
        with(TransferFilter {
            before_id: Some(r),
            limit: 1,
            ..all.clone()
        })
        .await,
        vec![b]
    );
    // A SQL-looking value is a value.
    assert!(
        with(TransferFilter {
            user: Some("x' OR '1'='1".into()),
            ..all.clone()
        })
        .await
        .is_empty()
    );

    let (t, files) = c.transfer(a, 0, 1000).await.unwrap();
    assert_eq!(t.user, "ann");
    assert_eq!(files.len(), 450);
    assert_eq!(
        files[300],
        file(300),
        "files keep their order across messages"
    );
    let (_, page) = c.transfer(a, 440, 5).await.unwrap();
    assert_eq!(
        page.iter().map(|f| f.bytes).collect::<Vec<_>>(),
        vec![440, 441, 442, 443, 444]
    );
    assert!(matches!(
        c.transfer(r + 100, 0, 1).await,
        Err(CatalogError::NotFound(_))
    ));

    let vol = c.transfer_volume(0, 1_000).await.unwrap();
    assert_eq!(
        vol,
        vec![
            ("client".to_string(), "S1".to_string(), 1_000, 1 << 40),
            ("S2".to_string(), "client".to_string(), 2_000, 1 << 40),
            ("S1".to_string(), "S2".to_string(), 3_000, 1 << 40),
        ]
    );

    // Retention: by age, then by count (the newest stay).
    assert_eq!(c.count_transfers().await.unwrap(), 3);
    assert_eq!(c.prune_transfers(1_500, 100).await.unwrap(), 1);
    assert!(matches!(
        c.transfer(a, 0, 1).await,
        Err(CatalogError::NotFound(_))
    ));
    assert_eq!(c.prune_transfers(0, 1).await.unwrap(), 1);
    assert_eq!(ids(c.transfers(&all).await.unwrap()), vec![r]);
    assert_eq!(c.prune_transfers(0, 1).await.unwrap(), 0);
    assert_eq!(c.prune_transfers(i64::MAX, 100).await.unwrap(), 1);
    assert_eq!(c.count_transfers().await.unwrap(), 0);
    // A record is dropped with its files, once.
    let d = c
        .record_transfer(&rec("upload", "ann", "client", "S1", 1_400, 0), &[file(1)])
        .await
        .unwrap();
    assert!(c.delete_transfer(d).await.unwrap());
    assert!(!c.delete_transfer(d).await.unwrap());
    assert!(matches!(
        c.transfer(d, 0, 10).await,
        Err(CatalogError::NotFound(_))
    ));
    // A trace is stored and read back with its record, and listings leave it out.
    let traced = TransferRecord {
        trace: "0.5:1000000 1:2000000".into(),
        ..rec("upload", "ann", "client", "S1", 1_500, 0)
    };
    let t = c.record_transfer(&traced, &[]).await.unwrap();
    assert_eq!(c.transfer(t, 0, 0).await.unwrap().0.trace, traced.trace);
    assert!(
        c.transfers(&TransferFilter {
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap()
        .iter()
        .all(|r| r.trace.is_empty())
    );
}

async fn jobs(c: &Catalog) {
    use crate::{JobFilter, JobState, NewJob};
    let files: Vec<(String, String, u64)> = (0..700)
        .map(|i| (format!("/src/f{i}"), format!("/dst/f{i}"), 1000 + i as u64))
        .collect();
    let a = c
        .create_job(&NewJob {
            user: "ann".into(),
            priority: 2,
            options: "{\"site\":\"s1\"}".into(),
            files: files.clone(),
            refused: vec![],
            credential: "{\"chain\":\"x\"}".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    // The delegation is kept apart from the record, and forgotten on demand.
    assert_eq!(c.job_credential(a).await.unwrap(), "{\"chain\":\"x\"}");
    c.set_job_credential(a, "").await.unwrap();
    assert_eq!(c.job_credential(a).await.unwrap(), "");
    assert_eq!(c.job_credential(a + 1000).await.unwrap(), "");
    let b = c
        .create_job(&NewJob {
            user: "bob".into(),
            priority: 5,
            options: "{}".into(),
            files: files[..3].to_vec(),
            refused: vec![(1, "not_found".into(), "/src/f1: gone".into())],
            listed: vec![(2, 1_700_000_000_000_000_007, 0o100640)],
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(b > a);
    let refused = c.job_files(b, Some(JobState::Failed), 0, 10).await.unwrap();
    assert_eq!(refused.len(), 1);
    assert_eq!(
        (refused[0].seq, refused[0].error_kind.as_str()),
        (1, "not_found")
    );
    // Claiming: only queued files, once; the job becomes running.
    let listed = c.job_files(b, Some(JobState::Queued), 0, 10).await.unwrap();
    assert_eq!(
        (listed[1].seq, listed[1].src_mtime_ns, listed[1].src_mode),
        (2, 1_700_000_000_000_000_007, 0o100640)
    );
    assert_eq!((listed[0].src_mtime_ns, listed[0].src_mode), (0, 0));
    assert_eq!(c.claim_job_files(b, &[0, 1, 2]).await.unwrap(), vec![0, 2]);
    assert_eq!(
        c.claim_job_files(b, &[0, 2]).await.unwrap(),
        Vec::<i64>::new()
    );
    let jb = c.job(b).await.unwrap();
    assert_eq!((jb.state.as_str(), jb.files_running), ("running", 2));
    let claimed = c
        .job_files(b, Some(JobState::Running), 0, 10)
        .await
        .unwrap();
    assert!(claimed.iter().all(|f| f.tries == 1));
    // The lease: one holder at a time, taken over when it ran out.
    let now = crate::now_ms();
    assert!(c.take_job_lease("s1", now, 30_000).await.unwrap());
    assert!(!c.take_job_lease("s2", now + 1, 30_000).await.unwrap());
    assert!(c.take_job_lease("s1", now + 2, 30_000).await.unwrap());
    assert!(c.take_job_lease("s2", now + 40_000, 30_000).await.unwrap());
    assert!(!c.take_job_lease("s1", now + 40_001, 30_000).await.unwrap());
    let j = c.job(a).await.unwrap();
    assert_eq!(
        (j.user.as_str(), j.priority, j.state.as_str()),
        ("ann", 2, "queued")
    );
    assert_eq!(j.options, "{\"site\":\"s1\"}");
    assert_eq!((j.files, j.files_queued()), (700, 700));
    assert_eq!(j.bytes, (0..700u64).map(|i| 1000 + i).sum::<u64>());
    // Listings: newest first, by user, active only, paged.
    let all = c
        .jobs(&JobFilter {
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(all.iter().map(|j| j.id).collect::<Vec<_>>(), vec![b, a]);
    let anns = c
        .jobs(&JobFilter {
            user: Some("ann".into()),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(anns.len(), 1);
    let older = c
        .jobs(&JobFilter {
            before_id: Some(b),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(older.iter().map(|j| j.id).collect::<Vec<_>>(), vec![a]);
    // Runnable files in order; a back-off hides a file until it passes.
    let mut first = c.runnable_job_files(a, crate::now_ms(), 2).await.unwrap();
    assert_eq!(first.iter().map(|f| f.seq).collect::<Vec<_>>(), vec![0, 1]);
    assert_eq!(first[1].source, "/src/f1");
    first[0].state = "running".into();
    first[0].target = 77;
    first[0].tries = 1;
    first[1].next_ms = crate::now_ms() + 60_000;
    first[1].tries = 1;
    first[1].error_kind = "connect".into();
    c.update_job_files(&first).await.unwrap();
    let next = c.runnable_job_files(a, crate::now_ms(), 2).await.unwrap();
    assert_eq!(next.iter().map(|f| f.seq).collect::<Vec<_>>(), vec![2, 3]);
    assert!(c.next_job_try(a).await.unwrap().unwrap() <= crate::now_ms());
    let running = c.running_job_files().await.unwrap();
    // Job a's one, and job b's two claimed above.
    assert_eq!(
        (running.len(), running[0].target, running[0].tries),
        (3, 77, 1)
    );
    assert_eq!(running[0].job, a);
    // Done with a checksum, counted.
    let mut f0 = running[0].clone();
    f0.state = "done".into();
    f0.checksum = "crc32c:01020304".into();
    f0.node = "n1".into();
    c.update_job_files(&[f0]).await.unwrap();
    let j = c.job(a).await.unwrap();
    assert_eq!((j.files_done, j.bytes_done, j.files_running), (1, 1000, 0));
    let listed = c.job_files(a, Some(JobState::Done), 0, 10).await.unwrap();
    assert_eq!(
        (listed.len(), listed[0].checksum.as_str()),
        (1, "crc32c:01020304")
    );
    assert_eq!(c.job_files(a, None, 698, 10).await.unwrap().len(), 2);
    // Retry is refused while active; cancel ends the queued files and keeps what is done.
    assert!(matches!(c.retry_job(a).await, Err(CatalogError::Busy(_))));
    let mut f2 = next[0].clone();
    f2.state = "running".into();
    c.update_job_files(&[f2.clone()]).await.unwrap();
    let was_running = c.cancel_job(a).await.unwrap();
    assert_eq!(
        was_running.iter().map(|f| f.seq).collect::<Vec<_>>(),
        vec![2]
    );
    let j = c.job(a).await.unwrap();
    assert_eq!(j.state, "cancelled");
    assert!(j.ended_ms > 0);
    assert_eq!(
        (j.files_done, j.files_cancelled, j.files_running),
        (1, 698, 1)
    );
    // A late "failed" from the copy that was running does not undo a cancel of a queued
    // file; the running one's end is written.
    let mut late = c.job_files(a, None, 5, 1).await.unwrap().remove(0);
    late.state = "failed".into();
    c.update_job_files(&[late]).await.unwrap();
    f2.state = "cancelled".into();
    c.update_job_files(&[f2]).await.unwrap();
    let j = c.job(a).await.unwrap();
    assert_eq!(
        (j.files_cancelled, j.files_failed, j.files_running),
        (699, 0, 0)
    );
    assert!(matches!(
        c.cancel_job(a).await,
        Err(CatalogError::Invalid(_))
    ));
    // Retry queues what did not arrive, from zero tries.
    assert_eq!(c.retry_job(a).await.unwrap(), 699);
    let j = c.job(a).await.unwrap();
    assert_eq!(
        (j.state.as_str(), j.files_queued(), j.ended_ms),
        ("queued", 699, 0)
    );
    assert!(
        c.runnable_job_files(a, crate::now_ms(), 800)
            .await
            .unwrap()
            .iter()
            .all(|f| f.tries == 0)
    );
    assert_eq!(
        c.active_jobs()
            .await
            .unwrap()
            .iter()
            .map(|j| j.id)
            .collect::<Vec<_>>(),
        vec![a, b]
    );
    assert!(c.set_job_state(b, JobState::Done, "").await.unwrap());
    // Ended jobs owe their webhook a notification until it is marked sent.
    assert_eq!(
        c.unnotified_jobs(10)
            .await
            .unwrap()
            .iter()
            .map(|j| j.id)
            .collect::<Vec<_>>(),
        vec![b]
    );
    c.set_job_notified(b).await.unwrap();
    assert!(c.unnotified_jobs(10).await.unwrap().is_empty());
    assert!(!c.set_job_state(b + 1000, JobState::Done, "").await.unwrap());
    assert_eq!(c.active_jobs().await.unwrap().len(), 1);
    assert!(matches!(
        c.job(b + 1000).await,
        Err(CatalogError::NotFound(_))
    ));
    // What the optimizer learned per link, kept and replaced.
    assert_eq!(c.link_tuning("A", "B").await.unwrap(), None);
    c.set_link_tuning("A", "B", 6, 9.4e8).await.unwrap();
    c.set_link_tuning("A", "*", 2, f64::NAN).await.unwrap();
    assert_eq!(c.link_tuning("A", "B").await.unwrap(), Some((6, 9.4e8)));
    c.set_link_tuning("A", "B", 3, 3e8).await.unwrap();
    assert_eq!(c.link_tuning("A", "B").await.unwrap(), Some((3, 3e8)));
    assert_eq!(c.link_tuning("A", "*").await.unwrap(), Some((2, 0.0)));
    let all = c.link_tunings().await.unwrap();
    assert_eq!(
        all.iter()
            .map(|l| (l.0.as_str(), l.1.as_str(), l.2))
            .collect::<Vec<_>>(),
        vec![("A", "*", 2), ("A", "B", 3)]
    );
    assert!(c.delete_job(b).await.unwrap());
    assert!(c.job_files(b, None, 0, 10).await.unwrap().is_empty());
}
