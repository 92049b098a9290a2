//! The grid as real processes on loopback: a metadata server and four storage nodes at two
//! sites, with a PKI made by `haul ca init` and `haul cert issue`. Uploads, listings, replica
//! placement, downloads, copies within the grid, permissions and bad inputs, replication and
//! policies healing the loss of a node, verification and repair of a damaged replica, a
//! metadata server restart, and reads failing over to another replica.
//!
//! Every test starts its own grid in a temporary directory; every process is killed when the
//! grid is dropped (also when a test panics), every client command and every wait is bounded.

mod common;
use common::grid::*;
use common::*;
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------------
// Tests

#[test]
fn upload_list_where_download_and_copy_to_another_site() {
    let g = Grid::start();
    let (src, files, paths) = upload_sample(&g);

    // ls -l: mode, owner, group, size, name.
    let out = g.ok("alice", &["ls", "-l", "/alice/tree"]);
    let text = String::from_utf8_lossy(&out.stdout);
    for name in ["big.bin", "small.txt", "empty", "sub"] {
        assert!(
            text.lines()
                .any(|l| l.ends_with(name) && l.contains("alice") && l.contains("atlas")),
            "ls -l lacks {name}: {text}"
        );
    }
    let big = text.lines().find(|l| l.ends_with("big.bin")).unwrap();
    assert!(big.starts_with("-rw"), "{big}");
    assert!(big.contains(&(3 * (1 << 20) + 17).to_string()), "{big}");
    assert!(
        text.lines()
            .find(|l| l.ends_with(" sub"))
            .unwrap()
            .starts_with('d'),
        "{text}"
    );
    // ls --json: sizes of what was uploaded.
    let list = g.json("alice", &["ls", "--json", "/alice/tree"]);
    assert_eq!(list["version"], 1);
    let list = list["entries"].as_array().unwrap();
    assert_eq!(list.len(), 4, "{list:?}");
    for (rel, len) in files.iter().filter(|(r, _)| !r.contains('/')) {
        let e = list
            .iter()
            .find(|e| e["path"] == format!("/alice/tree/{rel}"))
            .unwrap_or_else(|| panic!("{rel} not listed: {list:?}"));
        assert_eq!(e["size"], *len);
        assert_eq!(e["type"], "file");
        assert_eq!(e["owner"], "alice");
        assert!(e["mtime"].as_str().unwrap().ends_with('Z'), "{e}");
    }
    // Every --json output is one object with its schema's version (README "JSON output"),
    // failures too; status events are {time, message}.
    for args in [
        &["whoami", "--json"][..],
        &["nodes", "--json"],
        &["df", "--json"],
        &["status", "--json"],
        &["policy", "list", "--json"],
        &["transfers", "--json"],
        &["transfers", "--live", "--json"],
        &["stat", "--json", "/alice/tree"],
        &["where", "--json", "/alice/tree"],
    ] {
        let v = g.json("alice", args);
        assert_eq!(v["version"], 1, "{args:?}: {v}");
    }
    let failed = g.run("alice", &["stat", "--json", "/alice/nope"]);
    assert_exit(&failed, 3, "no such file");
    assert_eq!(json(&failed)["version"], 1);
    assert_eq!(json(&failed)["kind"], "not_found");
    let status = g.json("alice", &["status", "--json"]);
    let events = status["events"].as_array().unwrap();
    assert!(!events.is_empty(), "{status}");
    for e in events {
        assert!(e["time"].as_str().unwrap().ends_with('Z'), "{e}");
        assert!(!e["message"].as_str().unwrap().is_empty(), "{e}");
    }

    // where: every non-empty file has its replicas at site A, complete, matching the catalog.
    let site_a: Vec<&str> = g
        .nodes
        .iter()
        .filter(|n| n.site == "A")
        .map(|n| n.name.as_str())
        .collect();
    let w = g.where_(&paths);
    assert_eq!(w.len(), paths.len());
    for f in &w {
        let reps = f["replicas"].as_array().unwrap();
        assert!(!reps.is_empty(), "{f}");
        for r in reps {
            assert_eq!(r["site"], "A", "{f}");
            assert!(site_a.contains(&r["node"].as_str().unwrap()), "{f}");
            assert_eq!(r["state"], "complete", "{f}");
            assert_eq!(r["node_up"], true, "{f}");
            assert_eq!(r["checksum"], f["checksum"], "{f}");
        }
    }
    // The empty file exists but needs no replica.
    let e = g.where_(&["/alice/tree/empty".to_string()]);
    assert_eq!(e[0]["size"], 0);
    assert_eq!(e[0]["replicas"].as_array().unwrap().len(), 0);
    assert_eq!(e[0]["type"], "file");
    // A directory is said to be one: no empty checksum, no "no replicas".
    let d = g.where_(&["/alice/tree/sub".to_string()]);
    assert_eq!(d[0]["type"], "dir", "{d:?}");
    assert!(d[0]["checksum"].is_null(), "{d:?}");
    let out = g.ok("alice", &["where", "/alice/tree/sub"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text.trim(),
        "/alice/tree/sub (a directory: only files have replicas)"
    );

    // Download: byte-identical, the empty file and the nested directories included.
    assert_download_same(&g, "alice", &g.url("/alice/tree"), &src, &[]);

    // Copy within the grid to a new path, with the new replicas at site B.
    let out = g.cp(
        "alice",
        &[
            "-r",
            &g.url("/alice/tree"),
            &g.url("/alice/copyB"),
            "--site",
            "B",
        ],
    );
    assert_ok(&out);
    assert_eq!(json(&out)["files_failed"], 0);
    let copies = g.where_(&grid_files("/alice/copyB", &files));
    for (f, orig) in copies.iter().zip(&w) {
        assert_eq!(f["checksum"], orig["checksum"]);
        assert_eq!(f["size"], orig["size"]);
        let reps = f["replicas"].as_array().unwrap();
        assert!(!reps.is_empty(), "{f}");
        for r in reps {
            assert_eq!(r["site"], "B", "{f}");
            assert_eq!(r["state"], "complete", "{f}");
        }
    }
    // The original is untouched, the copy reads back identical (preferring site B).
    assert_eq!(g.where_(&paths), w);
    assert_download_same(&g, "alice", &g.url("/alice/copyB"), &src, &["--site", "B"]);
}

#[test]
fn permissions_and_bad_inputs() {
    let g = Grid::start();
    let small = g.path().join("small.txt");
    write_file(&small, 7, 5000);
    let small = small.to_str().unwrap();

    // An identity not in the mapfile is refused, with the subject to add.
    let out = g.run("mallory", &["ls", "/"]);
    assert_exit(&out, 5, "CN=mallory");
    assert!(stderr(&out).contains("mapfile"), "{}", stderr(&out));
    assert_exit(&g.run("mallory", &["whoami"]), 5, "mapfile");
    assert_exit(&g.cp("mallory", &[small, &g.url("/m.txt")]), 5, "mapfile");
    let who = g.json("bob", &["whoami", "--json"]);
    assert_eq!(who["user"], "bob");
    assert_eq!(who["groups"], serde_json::json!(["atlas"]));

    // alice's private (0700) and public (0755) directories.
    g.ok("alice", &["mkdir", "-m", "700", "/private"]);
    g.ok("alice", &["mkdir", "-m", "755", "/pub"]);
    assert_ok(&g.cp("alice", &[small, &g.url("/pub/a.txt"), "--site", "A"]));
    assert_ok(&g.cp("alice", &[small, &g.url("/private/a.txt"), "--site", "A"]));
    assert_exit(&g.run("bob", &["ls", "/private"]), 5, "permission denied");
    let down = g.path().join("bob-got.txt");
    let down = down.to_str().unwrap();
    assert_exit(
        &g.cp("bob", &[&g.url("/private/a.txt"), down]),
        5,
        "permission denied",
    );
    assert!(!Path::new(down).exists());
    assert_exit(
        &g.cp("bob", &[small, &g.url("/private/b.txt")]),
        5,
        "permission denied",
    );
    assert_exit(
        &g.cp("bob", &[small, &g.url("/pub/b.txt")]),
        5,
        "permission denied",
    );
    assert_exit(
        &g.run("bob", &["mkdir", "/pub/bdir"]),
        5,
        "permission denied",
    );
    assert_exit(&g.run("bob", &["rm", "/pub/a.txt"]), 5, "permission denied");
    assert_exit(
        &g.run("bob", &["chmod", "777", "/pub"]),
        5,
        "permission denied",
    );
    // What bob may do: list and read the public directory.
    let out = g.ok("bob", &["ls", "/pub"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("a.txt"));
    assert_ok(&g.cp("bob", &[&g.url("/pub/a.txt"), down]));
    assert_same_file(Path::new(small), Path::new(down));
    // Nothing of bob's attempts is left behind.
    let names: Vec<Value> = g.json("alice", &["ls", "--json", "/pub", "/private"])["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].clone())
        .collect();
    assert_eq!(
        names,
        vec![Value::from("/pub/a.txt"), Value::from("/private/a.txt")],
        "leftovers"
    );

    // Missing paths, existing paths, non-empty directories.
    assert_exit(
        &g.run("alice", &["ls", "/nope"]),
        3,
        "no such file or directory",
    );
    assert_exit(
        &g.run("alice", &["stat", "/pub/nope"]),
        3,
        "no such file or directory",
    );
    let nowhere = g.path().join("nowhere");
    assert_exit(
        &g.cp("alice", &[&g.url("/nope.dat"), nowhere.to_str().unwrap()]),
        3,
        "no such file",
    );
    let out = g.run("alice", &["mkdir", "--json", "/pub"]);
    assert_exit(&out, 6, "already exists");
    assert_kind(&out, "exists");
    // The kind travels beside the status ("not_empty"), so the hint does not hang on its text.
    let out = g.run("alice", &["rm", "--json", "/pub"]);
    assert_exit(
        &out,
        6,
        "not empty (use -r to remove it with everything below it)",
    );
    assert_kind(&out, "not_empty");
    g.ok("alice", &["ls", "/pub/a.txt"]);
    g.ok("alice", &["rm", "-r", "/pub"]);
    assert_exit(&g.run("alice", &["ls", "/pub"]), 3, "no such file");

    // Nobody listens at this address.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let dead = format!("haul://127.0.0.1:{port}/");
    assert_exit(&g.run("alice", &["ls", &dead]), 4, "unreachable");

    // More copies than there are nodes: refused, naming the file.
    let out = g.run(
        "alice",
        &[
            "replicate",
            "--copies",
            "9",
            "--progress",
            "never",
            "/private/a.txt",
        ],
    );
    // Exit 6: no node can take the copy (README's exit codes).
    assert_eq!(out.status.code(), Some(6), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("/private/a.txt") && err.contains("9 copies"),
        "{err}"
    );
    let out = g.run(
        "alice",
        &[
            "replicate",
            "--copies",
            "9",
            "--progress",
            "never",
            "--json",
            "/private/a.txt",
        ],
    );
    assert!(!out.status.success());
    let j = json(&out);
    assert_eq!(j["failures"][0]["path"], "/private/a.txt", "{j}");
    assert_eq!(j["copies_made"], 0, "{j}");
    // Nothing was made.
    let w = g.where_(&["/private/a.txt".to_string()]);
    assert_eq!(w[0]["replicas"].as_array().unwrap().len(), 1, "{w:?}");
}

#[test]
fn replicas_at_another_site_and_a_policy_heals_the_loss_of_a_node() {
    let mut g = Grid::start();
    let (src, _files, paths) = upload_sample(&g);

    // A file uploaded with three checksums (named haul:///path: the grid HAUL_META names)
    // keeps all three on its copies. A plain /path is local in `cp`: the error says how to
    // name the grid's.
    let three = g.path().join("three.dat");
    write_file(&three, 9, 100_000);
    let three = three.to_str().unwrap();
    assert_ok(&g.cp(
        "alice",
        &[
            "--checksum",
            "crc32c,adler32,md5",
            three,
            "haul:///alice/three.dat",
        ],
    ));
    assert_exit(
        &g.cp("alice", &["/alice/three.dat", "x"]),
        3,
        "haul:///alice/three.dat",
    );
    g.ok(
        "alice",
        &[
            "replicate",
            "--copies",
            "2",
            "--progress",
            "never",
            "haul:///alice/three.dat",
        ],
    );
    let w = g.where_(&["/alice/three.dat".to_string()]);
    let reps = w[0]["replicas"].as_array().unwrap();
    assert_eq!(reps.len(), 2, "{w:?}");
    for r in reps {
        let c = r["checksum"].as_str().unwrap();
        assert!(
            c.contains("crc32c:") && c.contains("adler32:") && c.contains("md5:"),
            "{w:?}"
        );
    }

    let j = g.json(
        "alice",
        &[
            "replicate",
            "-r",
            "/alice/tree",
            "--copies",
            "2",
            "--site",
            "B",
            "--progress",
            "never",
            "--json",
        ],
    );
    assert_eq!(j["failures"].as_array().unwrap().len(), 0, "{j}");
    assert_eq!(j["copies_made"], paths.len(), "{j}");
    let w = g.where_(&paths);
    for f in &w {
        let live = live_complete(f, &[]);
        assert_eq!(live.len(), 2, "{f}");
        assert_ne!(live[0].0, live[1].0, "{f}");
        let mut sites: Vec<&str> = live.iter().map(|r| r.1.as_str()).collect();
        sites.sort();
        assert_eq!(sites, ["A", "B"], "{f}");
    }
    // Asking again changes nothing.
    let j = g.json(
        "alice",
        &[
            "replicate",
            "-r",
            "/alice/tree",
            "--copies",
            "2",
            "--site",
            "B",
            "--progress",
            "never",
            "--json",
        ],
    );
    assert_eq!(j["copies_made"], 0, "{j}");
    assert_eq!(g.where_(&paths), w);

    g.ok("alice", &["policy", "set", "/alice/tree", "--copies", "2"]);
    let pol = g.json("alice", &["policy", "list", "--json"]);
    assert!(
        pol["policies"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["path"] == "/alice/tree" && p["copies"] == 2),
        "{pol}"
    );

    // Lose the node holding the most replicas.
    let mut count: Vec<(usize, String)> = g
        .nodes
        .iter()
        .map(|n| {
            let k = w
                .iter()
                .filter(|f| live_complete(f, &[]).iter().any(|r| r.0 == n.name))
                .count();
            (k, n.name.clone())
        })
        .collect();
    count.sort();
    let (held, victim) = count.pop().unwrap();
    assert!(held > 0);
    g.kill_node(&victim);
    let t = Instant::now();
    let mut last = Vec::new();
    let healed = wait_for(SETTLE, || {
        last = g.where_(&paths);
        let ok = all_have(&last, 2, &[&victim]);
        if !ok {
            std::thread::sleep(Duration::from_millis(250));
        }
        ok
    });
    assert!(
        healed,
        "not healed after {:?} without {victim}: {last:?}\n{}",
        t.elapsed(),
        g.logs()
    );
    g.wait_node_down(&victim);
    let st = g.json("alice", &["status", "--json"]);
    assert_eq!(st["nodes_down"], 1, "{st}");
    assert_eq!(st["nodes_up"], 3, "{st}");
    assert!(
        st["policies"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["path"] == "/alice/tree"),
        "{st}"
    );
    // The new copies are good.
    assert_download_same(&g, "bob", &g.url("/alice/tree"), &src, &[]);
    let v = g.json(
        "alice",
        &["verify", "-r", "--no-repair", "--json", "/alice/tree"],
    );
    assert_eq!(v["damaged"].as_array().unwrap().len(), 0, "{v}");
}

/// `haul mv` renames, and moves into an existing directory under the entry's own name.
#[test]
fn mv_renames_and_moves_into_a_directory() {
    let g = Grid::start();
    g.ok("alice", &["mkdir", "/alice"]);
    g.ok("alice", &["mkdir", "/alice/d1", "/alice/box"]);
    g.ok("alice", &["mv", "/alice/d1", "/alice/d2"]);
    g.ok("alice", &["stat", "/alice/d2"]);
    assert_exit(&g.run("alice", &["stat", "/alice/d1"]), 3, "no such file");
    g.ok("alice", &["mv", "/alice/d2", "/alice/box/"]);
    g.ok("alice", &["stat", "/alice/box/d2"]);
    assert_exit(&g.run("alice", &["stat", "/alice/d2"]), 3, "no such file");
    // Another user may not move alice's entries.
    assert_exit(
        &g.run("bob", &["mv", "/alice/box/d2", "/alice/d3"]),
        5,
        "permission denied",
    );
}

/// Replication from a replica whose data no longer matches its checksum: the source node
/// reports the kind "source damaged" (not a message to match), the planner marks that replica
/// damaged in the catalog, and no copy is made from it.
#[test]
fn replication_marks_a_damaged_source_replica() {
    let g = Grid::start();
    let (_src, _files, _paths) = upload_sample(&g);
    let target = "/alice/tree/big.bin";
    let w = g.where_(&[target.to_string()]);
    let live = live_complete(&w[0], &[]);
    assert_eq!(live.len(), 1, "{w:?}");
    let bad_node = live[0].0.clone();
    g.damage_replica(&bad_node, target);

    let out = g.run(
        "alice",
        &[
            "replicate",
            target,
            "--copies",
            "2",
            "--site",
            "B",
            "--progress",
            "never",
            "--json",
        ],
    );
    assert_ne!(out.status.code(), Some(0), "{}", stderr(&out));
    let states = g.replica_states(target);
    assert!(
        states.contains(&(bad_node.clone(), "damaged".to_string())),
        "{states:?}"
    );
    assert!(
        !states
            .iter()
            .any(|(n, st)| *n != bad_node && *st == "complete"),
        "a copy was made from the damaged replica: {states:?}"
    );
    let j = json(&out);
    assert!(!j["failures"].as_array().unwrap().is_empty(), "{j}");
}

#[test]
fn verify_finds_and_repairs_a_damaged_replica() {
    let g = Grid::start();
    let (src, _files, paths) = upload_sample(&g);
    let j = g.json(
        "alice",
        &[
            "replicate",
            "-r",
            "/alice/tree",
            "--copies",
            "2",
            "--site",
            "B",
            "--progress",
            "never",
            "--json",
        ],
    );
    assert_eq!(j["failures"].as_array().unwrap().len(), 0, "{j}");

    // All good to begin with.
    let v = g.json("alice", &["verify", "-r", "--json", "/alice/tree"]);
    assert_eq!(v["damaged"].as_array().unwrap().len(), 0, "{v}");
    assert_eq!(v["checked"], 2 * paths.len(), "{v}");

    // Damage the site-A replica of big.bin on disk, keeping its size.
    let target = "/alice/tree/big.bin";
    let w = g.where_(&[target.to_string()]);
    let bad_node = live_complete(&w[0], &[])
        .into_iter()
        .find(|r| r.1 == "A")
        .unwrap()
        .0;
    let file = g.replica_file(&bad_node, target);
    assert_eq!(
        std::fs::read(&file).unwrap(),
        data(100, 3 * (1 << 20) + 17),
        "replica is the data"
    );
    g.damage_replica(&bad_node, target);

    // Report only: the damaged replica is named and marked.
    let out = g.run(
        "alice",
        &["verify", "-r", "--no-repair", "--json", "/alice/tree"],
    );
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    let v = json(&out);
    let damaged = v["damaged"].as_array().unwrap();
    assert_eq!(damaged.len(), 1, "{v}");
    assert_eq!(damaged[0]["path"], target, "{v}");
    let reason = damaged[0]["reason"].as_str().unwrap();
    assert!(reason.contains(&bad_node), "{reason}");
    assert_eq!(v["repaired"], 0, "{v}");
    let states = g.replica_states(target);
    assert!(
        states.contains(&(bad_node.clone(), "damaged".to_string())),
        "{states:?}"
    );
    // Reads avoid the damaged replica, even preferring its site.
    assert_download_same(&g, "alice", &g.url("/alice/tree"), &src, &["--site", "A"]);

    // Repair: reported, then two good copies again.
    let out = g.run("alice", &["verify", "-r", "--json", "/alice/tree"]);
    let v = json(&out);
    assert_ok(&out);
    assert_eq!(v["damaged"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["damaged"][0]["path"], target, "{v}");
    assert_eq!(v["repaired"], 1, "{v}");
    assert_eq!(v["failures"].as_array().unwrap().len(), 0, "{v}");
    let mut last = Vec::new();
    let repaired = wait_for(SETTLE, || {
        last = g.where_(&paths);
        let ok = all_have(&last, 2, &[])
            && last
                .iter()
                .all(|f| f["replicas"].as_array().unwrap().len() == 2);
        if !ok {
            std::thread::sleep(Duration::from_millis(250));
        }
        ok
    });
    assert!(repaired, "not repaired: {last:?}");
    let v = g.json(
        "alice",
        &["verify", "-r", "--no-repair", "--json", "/alice/tree"],
    );
    assert_eq!(v["damaged"].as_array().unwrap().len(), 0, "{v}");
    assert_eq!(v["checked"], 2 * paths.len(), "{v}");
    // Every replica of big.bin on disk is the data.
    for (node, _) in live_complete(&g.where_(&[target.to_string()])[0], &[]) {
        assert_same_file(&g.replica_file(&node, target), &src.join("big.bin"));
    }
    assert_download_same(&g, "alice", &g.url("/alice/tree"), &src, &["--site", "A"]);
}

#[test]
fn metadata_server_restart_keeps_the_namespace_and_nodes_come_back() {
    let mut g = Grid::start();
    let (src, _files, paths) = upload_sample(&g);
    let before_ls = g.json("alice", &["ls", "--json", "/alice/tree", "/alice/tree/sub"]);
    let before_where = g.where_(&paths);

    g.kill_meta();
    assert_exit(&g.run("alice", &["ls", "/alice"]), 4, "unreachable");

    let restarted = now_ms();
    let addr = g.meta_addr.clone();
    g.start_meta(&addr);
    assert_eq!(g.meta_addr, addr);
    // Every node reports to the new server.
    g.wait_nodes_up(restarted);

    assert_eq!(
        g.json("alice", &["ls", "--json", "/alice/tree", "/alice/tree/sub"]),
        before_ls
    );
    assert_eq!(g.where_(&paths), before_where);
    assert_download_same(&g, "alice", &g.url("/alice/tree"), &src, &[]);

    // New writes work too, and go to the site asked for.
    let f = g.path().join("after.bin");
    write_file(&f, 55, 777_777);
    assert_ok(&g.cp(
        "alice",
        &[
            f.to_str().unwrap(),
            &g.url("/alice/after.bin"),
            "--site",
            "B",
        ],
    ));
    let w = g.where_(&["/alice/after.bin".to_string()]);
    let live = live_complete(&w[0], &[]);
    assert!(!live.is_empty() && live.iter().all(|r| r.1 == "B"), "{w:?}");
    let back = g.path().join("after.back");
    assert_ok(&g.cp(
        "alice",
        &[&g.url("/alice/after.bin"), back.to_str().unwrap()],
    ));
    assert_same_file(&f, &back);
}

#[test]
fn download_fails_over_to_another_replica() {
    let mut g = Grid::start();
    let (src, _files, paths) = upload_sample(&g);
    let j = g.json(
        "alice",
        &[
            "replicate",
            "-r",
            "/alice/tree",
            "--copies",
            "2",
            "--site",
            "B",
            "--progress",
            "never",
            "--json",
        ],
    );
    assert_eq!(j["failures"].as_array().unwrap().len(), 0, "{j}");
    let w = g.where_(&paths);
    assert!(all_have(&w, 2, &[]), "{w:?}");

    // Kill the site-A node holding big.bin, and read at once preferring site A: the
    // metadata server still thinks the node is up.
    let target = "/alice/tree/big.bin";
    let wt = g.where_(&[target.to_string()]);
    let reps = live_complete(&wt[0], &[]);
    let a = reps.iter().find(|r| r.1 == "A").unwrap().0.clone();
    let b = reps.iter().find(|r| r.1 == "B").unwrap().0.clone();
    g.kill_node(&a);
    assert_download_same(&g, "alice", &g.url("/alice/tree"), &src, &["--site", "A"]);
    let one = g.path().join("big.once");
    let out = g.cp(
        "alice",
        &[&g.url(target), one.to_str().unwrap(), "--site", "A"],
    );
    assert_ok(&out);
    assert_same_file(&src.join("big.bin"), &one);

    // Once the node is known to be down, reads go straight to the other replica.
    g.wait_node_down(&a);
    assert_download_same(&g, "bob", &g.url("/alice/tree"), &src, &["--site", "A"]);

    // With both replica holders gone, the read fails cleanly: no healthy replica.
    g.kill_node(&b);
    g.wait_node_down(&b);
    let lost = g.path().join("lost.bin");
    let out = g.cp("alice", &[&g.url(target), lost.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(stderr(&out).contains(target), "{}", stderr(&out));
    assert!(!lost.exists());
    assert!(partials(g.path()).is_empty(), "{:?}", partials(g.path()));
}

/// A clean upload or copy within the grid needs one round and no retries, and says so.
#[test]
fn clean_grid_copies_report_no_retries() {
    let g = Grid::start();
    let (_src, _files, _paths) = upload_sample(&g);
    let f = g.path().join("one.bin");
    write_file(&f, 9, 100_000);
    let up = g.cp(
        "alice",
        &[f.to_str().unwrap(), &g.url("/alice/one.bin"), "--site", "A"],
    );
    assert_ok(&up);
    let within = g.cp(
        "alice",
        &[
            &g.url("/alice/one.bin"),
            &g.url("/alice/two.bin"),
            "--site",
            "B",
        ],
    );
    assert_ok(&within);
    let back = g.path().join("one.back");
    let down = g.cp("alice", &[&g.url("/alice/one.bin"), back.to_str().unwrap()]);
    assert_ok(&down);
    for (what, out) in [("download", &down), ("upload", &up), ("within", &within)] {
        let j = json(out);
        assert_eq!(j["attempts"], 1, "{what}: {j}");
        assert_eq!(j["retries"], 0, "{what}: {j}");
    }
}

/// Repairing a damaged replica while a node holding another replica is down: the live good
/// replica is a source, the damaged replica's node a target, so two good live copies can be had
/// again.
#[test]
fn verify_repairs_while_another_replica_holder_is_down() {
    let mut g = Grid::start();
    let f = g.path().join("f.bin");
    write_file(&f, 21, 1 << 20);
    g.ok("alice", &["mkdir", "/alice"]);
    assert_ok(&g.cp(
        "alice",
        &[f.to_str().unwrap(), &g.url("/alice/f.bin"), "--site", "A"],
    ));
    // Three copies need three live nodes: on a loaded machine a late heartbeat (2 s timeout)
    // can briefly count one as down (seen once in CI).
    g.wait_nodes_up(0);
    let j = g.json(
        "alice",
        &[
            "replicate",
            "--copies",
            "3",
            "--progress",
            "never",
            "--json",
            "/alice/f.bin",
        ],
    );
    assert_eq!(j["failures"].as_array().unwrap().len(), 0, "{j}");
    let w = g.where_(&["/alice/f.bin".to_string()]);
    let holders: Vec<String> = live_complete(&w[0], &[]).into_iter().map(|r| r.0).collect();
    assert_eq!(holders.len(), 3, "{w:?}");
    let spare = g
        .nodes
        .iter()
        .find(|n| !holders.contains(&n.name))
        .unwrap()
        .name
        .clone();
    let (down, good, bad) = (&holders[0], &holders[1], &holders[2]);
    // Two nodes down: one holding a replica, the one holding none.
    g.kill_node(down);
    g.kill_node(&spare);
    g.wait_node_down(down);
    g.wait_node_down(&spare);
    // Damage the replica on a live node.
    let file = g.replica_file(bad, "/alice/f.bin");
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[4096] ^= 0xff;
    std::fs::write(&file, &bytes).unwrap();

    let out = g.run("alice", &["verify", "--json", "/alice/f.bin"]);
    let v = json(&out);
    assert_eq!(v["damaged"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["failures"].as_array().unwrap().len(), 0, "{v}");
    assert_eq!(v["repaired"], 1, "{v}");
    assert_ok(&out);
    let mut last = Vec::new();
    let ok = wait_for(SETTLE, || {
        last = g.where_(&["/alice/f.bin".to_string()]);
        let mut live: Vec<String> = live_complete(&last[0], &[])
            .into_iter()
            .map(|r| r.0)
            .collect();
        live.sort();
        let mut want = vec![good.clone(), bad.clone()];
        want.sort();
        let r = live == want;
        if !r {
            std::thread::sleep(Duration::from_millis(250));
        }
        r
    });
    assert!(ok, "two good live copies expected: {last:?}");
    let back = g.path().join("f.back");
    assert_ok(&g.cp("alice", &[&g.url("/alice/f.bin"), back.to_str().unwrap()]));
    assert_same_file(&f, &back);
}

/// `haul run` runs tasks as the local account the certificate maps to (here `haulrun`, so the
/// nodes must run as root), on nodes holding the files, registers their outputs, reports
/// failures by file, and moves the tasks of a node that dies to another holder.
#[test]
fn run_tasks_where_the_data_is() {
    if !testkit::is_root() {
        testkit::skip!("haul run needs the nodes to run as root to switch to another account");
    }
    let Some(task_uid) = ensure_task_account() else {
        testkit::skip!("the local account {TASK_ACCOUNT} does not exist and cannot be created");
    };
    let g = Grid::start();
    // Tasks run as haulrun: the node roots must be reachable by it.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(g.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (src, files) = sample_tree(g.path());
    runner_tree_at_both_sites(&g, &src);
    g.ok("runner", &["mkdir", "/r/out"]);

    // Every file once, as haulrun, with its outputs registered in the grid.
    let out = g.ok(
        "runner",
        &[
            "run",
            "--json",
            "-P",
            "2",
            "--output",
            "/r/out",
            "/r/tree",
            "--",
            "sh",
            "-c",
            "wc -c < {} > {out}/{name}.n; id -u",
        ],
    );
    let j = json(&out);
    assert_eq!(j["succeeded"], files.len() as u64, "{j}");
    let tasks = j["tasks"].as_array().unwrap();
    for t in tasks {
        assert_eq!(t["exit"], 0, "{t}");
        assert_eq!(
            t["stdout"].as_str().unwrap().trim(),
            task_uid.to_string(),
            "{t}"
        );
        assert_eq!(t["outputs"].as_array().unwrap().len(), 1, "{t}");
    }
    for (rel, len) in &files {
        let name = rel.rsplit('/').next().unwrap();
        let dl = g.path().join(format!("{name}.n"));
        assert_ok(&g.cp(
            "runner",
            &[&g.url(&format!("/r/out/{name}.n")), dl.to_str().unwrap()],
        ));
        assert_eq!(
            std::fs::read_to_string(&dl).unwrap().trim(),
            len.to_string()
        );
    }

    // A command the nodes do not have: each file named with the reason, exit 1.
    let out = g.run(
        "runner",
        &["run", "/r/tree/sub", "--", "no-such-command-xyz", "{}"],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    for f in ["/r/tree/sub/one.txt", "/r/tree/sub/deep/mid.bin"] {
        assert!(
            err.contains(&format!("{f} on ")) && err.contains("command not found on node"),
            "{err}"
        );
    }

    // Output directory that does not exist: refused before anything runs.
    let out = g.run(
        "runner",
        &["run", "--output", "/r/nope", "/r/tree", "--", "true"],
    );
    assert_exit(&out, 3, "/r/nope");

    // A node dies while its tasks run: they run again on the other holder.
    let mut cmd = g.cmd(
        "runner",
        &["run", "--json", "-P", "1", "/r/tree", "--", "sleep", "1"],
    );
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = cmd.spawn().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let mut g = g;
    g.kill_node("a1");
    let out = child.wait_with_output().unwrap();
    assert_ok(&out);
    let j = json(&out);
    assert_eq!(j["succeeded"], files.len() as u64, "{j}");
    let failed_node = j["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node"] == "a1")
        .cloned()
        .unwrap_or_default();
    if failed_node["tasks"].as_u64().unwrap_or(0) < files.len() as u64 {
        assert!(
            failed_node["error"].is_string() || failed_node.is_null(),
            "{j}"
        );
    }
}

/// `haul demo --exit` (the README's first command runs it): a whole grid on loopback, the
/// dataset copied in, replicated to the other site, verified and downloaded identical.
#[test]
fn demo_runs_the_whole_grid_and_exits() {
    // As root, haul run's tasks run as the account sudo came from (here the test account).
    let sudo = testkit::is_root() && ensure_task_account().is_some();
    let dir = tempfile::tempdir().unwrap();
    let mut c = haul_clean();
    if sudo {
        c.env("SUDO_USER", TASK_ACCOUNT);
    }
    c.args([
        "demo",
        "--exit",
        "--files",
        "8",
        "--median-mb",
        "0.3",
        "--dir",
    ])
    .arg(dir.path());
    let out = run_bounded(c, CMD_TIMEOUT);
    assert_ok(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("replicas per site: site A: 8, site B: 8"),
        "{text}"
    );
    assert!(text.contains("8 files downloaded byte-identical"), "{text}");
    assert!(text.contains("checksums recomputed, all match"), "{text}");
    assert!(
        text.contains("transfer history: 1 upload, ") && text.contains(", 1 download recorded"),
        "{text}"
    );
    // md5sum where each replica is, checked against the original (3 of the 8 files are in
    // tas/monthly); root without sudo's account skips it and says why.
    if sudo || !testkit::is_root() {
        assert!(
            text.contains("haul run: md5sum on 3 files of tas/monthly")
                && text.contains("every sum matches the original"),
            "{text}"
        );
    }
    if testkit::is_root() {
        let mut c = haul_clean();
        c.env_remove("SUDO_USER")
            .args([
                "demo",
                "--exit",
                "--files",
                "3",
                "--median-mb",
                "0.1",
                "--dir",
            ])
            .arg(dir.path());
        let out = run_bounded(c, CMD_TIMEOUT);
        assert_ok(&out);
        assert!(
            String::from_utf8_lossy(&out.stdout)
                .contains("haul run: skipped (the demo runs as root"),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}

/// The metadata server's transfer log records each replication session it directs (node to
/// node, with the destination's site) and each file by its grid path; refused certificates
/// are recorded too.
#[test]
fn replication_and_refusals_are_in_the_metadata_servers_transfer_log() {
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("meta-transfers.log");
    let log_arg = log.to_string_lossy().into_owned();
    let g = Grid::start_with(&["--log-transfer", &log_arg]);
    let src = g.path().join("r.bin");
    write_file(&src, 77, 2 << 20);
    assert_ok(&g.cp(
        "alice",
        &[src.to_str().unwrap(), &g.url("/r.bin"), "--site", "A"],
    ));
    g.ok(
        "alice",
        &[
            "replicate",
            "--copies",
            "2",
            "--site",
            "B",
            "--progress",
            "never",
            "/r.bin",
        ],
    );
    assert_exit(
        &g.cp("mallory", &[src.to_str().unwrap(), &g.url("/m.bin")]),
        5,
        "",
    );
    let mut text = String::new();
    assert!(
        wait_for(Duration::from_secs(10), || {
            text = std::fs::read_to_string(&log).unwrap_or_default();
            text.contains("event=haul.session.end") && text.contains("event=haul.auth.refused")
        }),
        "{text}"
    );
    let file = text
        .lines()
        .find(|l| l.contains("event=haul.file.end"))
        .unwrap_or_else(|| panic!("{text}"));
    for needle in [
        " path=/r.bin ",
        " role=third-party ",
        " size=2097152 ",
        " peer.site=B ",
        " status=0",
    ] {
        assert!(file.contains(needle), "{needle:?} not in {file}");
    }
    let session = text
        .lines()
        .find(|l| l.contains("event=haul.session.end"))
        .unwrap();
    assert!(
        session.contains(" status=0") && session.contains(" user=replication "),
        "{session}"
    );
    let refused = text
        .lines()
        .find(|l| l.contains("event=haul.auth.refused"))
        .unwrap();
    assert!(refused.contains("CN=mallory"), "{refused}");
}

/// Issue 15 item 4: an administrator drains a node (no new files land on it; its replicas,
/// governed by a policy or not, are copied off and then removed from it, and every policy
/// holds at every moment), then removes it once it is stopped; removal is refused while the
/// node runs or holds replicas, and to other users; `--force` on a dead node drops its replica
/// records, the policy makes the missing copies again, and files whose only copy was there are
/// reported lost.
#[test]
fn drain_then_remove_a_node_and_force_out_a_dead_one() {
    let mut g = Grid::start_with(&["--admin", "bob"]);
    let (src, _files, tree) = upload_sample(&g);
    let loose_src = g.path().join("loose.bin");
    write_file(&loose_src, 7, 300_000);
    let out = g.cp(
        "alice",
        &[
            loose_src.to_str().unwrap(),
            &g.url("/alice/loose"),
            "--site",
            "A",
        ],
    );
    assert_ok(&out);
    let loose = "/alice/loose".to_string();
    g.ok(
        "alice",
        &[
            "policy",
            "set",
            "/alice/tree",
            "--copies",
            "2",
            "--sites",
            "A,B",
        ],
    );
    let placed = wait_for(SETTLE, || {
        let ok = all_have(&g.where_(&tree), 2, &[]);
        if !ok {
            std::thread::sleep(Duration::from_millis(200));
        }
        ok
    });
    assert!(placed, "policy not met: {:?}", g.where_(&tree));
    // The victim: the node holding the file no policy governs.
    let holders = live_complete(&g.where_(std::slice::from_ref(&loose))[0], &[]);
    assert_eq!(holders.len(), 1, "{holders:?}");
    let victim = holders[0].0.clone();
    let other_a = if victim == "a1" { "a2" } else { "a1" };
    let on_victim = |w: &[Value]| {
        w.iter()
            .filter(|f| live_complete(f, &[]).iter().any(|r| r.0 == victim))
            .count()
    };
    let held = on_victim(&g.where_(&tree));
    assert!(held >= 1, "{victim} holds no file of the tree");

    // Only an administrator; only a registered node.
    let out = g.run("alice", &["node", "drain", &victim]);
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    assert!(stderr(&out).contains("administrator"), "{}", stderr(&out));
    let out = g.run("bob", &["node", "drain", "zz9"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("a1, a2, b1, b2"), "{}", stderr(&out));
    // Removal of a running node that holds replicas: refused.
    let out = g.run("bob", &["node", "remove", &victim]);
    assert_eq!(out.status.code(), Some(6), "{}", stderr(&out));
    assert!(stderr(&out).contains("running"), "{}", stderr(&out));

    let mut drain = g
        .cmd(
            "bob",
            &["node", "drain", &victim, "--wait", "--timeout", "60s"],
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A file written while the node drains goes elsewhere.
    let during_src = g.path().join("during.bin");
    write_file(&during_src, 8, 200_000);
    // Every policy holds at every look: each tree file has a complete copy at A and at B.
    let t = Instant::now();
    let mut looks = 0;
    let status = loop {
        if let Some(s) = drain.try_wait().unwrap() {
            break s;
        }
        assert!(t.elapsed() < Duration::from_secs(90), "drain --wait hung");
        let w = g.where_(&tree);
        for f in &w {
            let sites: Vec<String> = live_complete(f, &[]).into_iter().map(|r| r.1).collect();
            assert!(
                sites.contains(&"A".to_string()) && sites.contains(&"B".to_string()),
                "policy broken during the drain: {f}"
            );
        }
        let l = &g.where_(std::slice::from_ref(&loose))[0];
        assert!(
            !live_complete(l, &[]).is_empty(),
            "loose file unreadable: {l}"
        );
        if looks == 0 {
            let out = g.cp(
                "alice",
                &[
                    during_src.to_str().unwrap(),
                    &g.url("/alice/during"),
                    "--site",
                    "A",
                ],
            );
            assert_ok(&out);
            let d = live_complete(&g.where_(&["/alice/during".to_string()])[0], &[]);
            assert!(
                d.len() == 1 && d[0].0 != victim,
                "a new file placed on the draining {victim}: {d:?}"
            );
        }
        looks += 1;
    };
    let mut so = String::new();
    let mut se = String::new();
    use std::io::Read;
    drain
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut so)
        .unwrap();
    drain
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut se)
        .unwrap();
    assert!(
        status.success(),
        "drain --wait: {status}: {se}\n{}",
        g.logs()
    );
    assert!(so.contains(&format!("node {victim}: drained")), "{so}");

    // Nothing left on the victim; the tree keeps 2 copies at A and B (surplus removed), the
    // loose file its one copy, moved to the other node of the victim's site.
    let w = g.where_(&tree);
    assert_eq!(on_victim(&w), 0, "{w:?}");
    assert!(all_have(&w, 2, &[]), "{w:?}");
    let l = live_complete(&g.where_(std::slice::from_ref(&loose))[0], &[]);
    assert_eq!(l, vec![(other_a.to_string(), "A".to_string())]);
    let d = live_complete(&g.where_(&["/alice/during".to_string()])[0], &[]);
    assert_eq!(d, vec![(other_a.to_string(), "A".to_string())]);
    assert_download_same(&g, "alice", &g.url("/alice/tree"), &src, &[]);
    let n = g
        .nodes_json()
        .into_iter()
        .find(|n| n["name"] == victim.as_str())
        .unwrap();
    assert_eq!(n["state"], "drained", "{n}");
    assert_eq!(n["replicas"], 0, "{n}");
    assert_eq!(n["stored_bytes"], 0, "{n}");
    assert!(n["drain_replicas"].as_u64().unwrap() > held as u64, "{n}");
    let st = g.json("alice", &["status", "--json"]);
    assert!(
        st["draining"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["name"] == victim.as_str() && n["replicas"] == 0),
        "{st}"
    );
    let m = g.http_get("/metrics");
    assert!(
        m.contains(&format!(
            "haul_node_draining{{node=\"{victim}\",site=\"A\"}} 1"
        )),
        "{m}"
    );

    // Drained but running: still refused; stopped: removed.
    let out = g.run("bob", &["node", "remove", &victim]);
    assert_eq!(out.status.code(), Some(6), "{}", stderr(&out));
    assert!(stderr(&out).contains("stop it first"), "{}", stderr(&out));
    g.kill_node(&victim);
    g.wait_node_down(&victim);
    let out = g.run("alice", &["node", "remove", &victim]);
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    g.ok("bob", &["node", "remove", &victim]);
    assert!(
        !g.nodes_json().iter().any(|n| n["name"] == victim.as_str()),
        "{:?}",
        g.nodes_json()
    );

    // A dead node that still holds replicas: refused without --force; with it, its records
    // go and the policy makes the missing copies at B again (on b2).
    g.kill_node("b1");
    g.wait_node_down("b1");
    let out = g.run("bob", &["node", "remove", "b1"]);
    assert_eq!(out.status.code(), Some(6), "{}", stderr(&out));
    assert!(stderr(&out).contains("--force"), "{}", stderr(&out));
    let r = g.json("bob", &["node", "remove", "b1", "--force", "--json"]);
    assert_eq!(r["orphaned"], 0, "{r}");
    let dropped = r["replicas_dropped"].as_u64().unwrap();
    let healed = wait_for(SETTLE, || {
        let w = g.where_(&tree);
        let ok = all_have(&w, 2, &[])
            && w.iter()
                .all(|f| live_complete(f, &[]).iter().any(|r| r.0 == "b2"));
        if !ok {
            std::thread::sleep(Duration::from_millis(200));
        }
        ok
    });
    assert!(
        healed,
        "{dropped} dropped, not healed: {:?}",
        g.where_(&tree)
    );
    // The last node of site A dies: the files only it held are reported lost, and stay listed.
    g.kill_node(other_a);
    g.wait_node_down(other_a);
    let out = g.run("bob", &["node", "remove", other_a, "--force"]);
    assert_ok(&out);
    let e = stderr(&out);
    assert!(e.contains("2 files had no other copy"), "{e}");
    assert!(
        e.contains("/alice/loose") && e.contains("/alice/during"),
        "{e}"
    );
    g.ok("alice", &["stat", "/alice/loose"]);
}

/// Issue 15 item 2: every transfer that touches the grid is in the metadata server's history:
/// an upload and a download (recorded by the client, with each file's node and checksum), a
/// download that failed (with its error kind and exit code), the replication the user asked
/// for (recorded by the server, per node-to-node session, with its site pair). Users see their
/// own records and no one else's; an administrator sees everybody's; filters narrow them.
#[test]
fn transfer_history_records_every_kind_and_shows_each_user_their_own() {
    let g = Grid::start_with(&["--admin", "bob"]);
    let dir = g.path().join("hist");
    write_file(&dir.join("one.bin"), 1, 300_000);
    write_file(&dir.join("two.bin"), 2, 700_000);
    g.ok("alice", &["mkdir", "/alice"]);
    assert_ok(&g.cp(
        "alice",
        &[
            "-r",
            dir.to_str().unwrap(),
            &g.url("/alice/h"),
            "--site",
            "A",
        ],
    ));
    let back = g.path().join("back");
    assert_ok(&g.cp("alice", &["-r", &g.url("/alice/h"), back.to_str().unwrap()]));
    assert_exit(
        &g.cp("alice", &[&g.url("/alice/nope"), back.to_str().unwrap()]),
        3,
        "",
    );
    g.ok(
        "alice",
        &[
            "replicate",
            "-r",
            "--copies",
            "2",
            "--site",
            "B",
            "--progress",
            "never",
            "/alice/h",
        ],
    );
    // bob's own upload.
    g.ok("bob", &["mkdir", "/bob"]);
    assert_ok(&g.cp(
        "bob",
        &[
            dir.join("one.bin").to_str().unwrap(),
            &g.url("/bob/one.bin"),
        ],
    ));

    let list = |user: &str, extra: &[&str]| -> Vec<Value> {
        let mut a = vec!["transfers", "--json"];
        a.extend_from_slice(extra);
        let doc = g.json(user, &a);
        assert_eq!(doc["version"], 1, "{doc}");
        doc["transfers"].as_array().unwrap().clone()
    };
    let mine = list("alice", &[]);
    let kinds: Vec<&str> = mine.iter().map(|t| t["kind"].as_str().unwrap()).collect();
    // Newest first: the replication's sessions, the failed download, the download, the upload.
    assert_eq!(kinds.last(), Some(&"upload"), "{mine:?}");
    assert!(kinds.contains(&"replicate"), "{mine:?}");
    assert!(mine.iter().all(|t| t["user"] == "alice"), "{mine:?}");
    let ids: Vec<i64> = mine.iter().map(|t| t["id"].as_i64().unwrap()).collect();
    assert!(ids.windows(2).all(|w| w[0] > w[1]), "{ids:?}");

    let up = mine.last().unwrap();
    assert_eq!(up["src_site"], "client");
    assert_eq!(up["dst_site"], "A");
    assert_eq!(up["files"], 2);
    assert_eq!(up["files_failed"], 0);
    assert_eq!(up["bytes"], 1_000_000);
    assert!(up["error"].is_null(), "{up}");
    assert!(up["ended"].as_str().unwrap().ends_with('Z'), "{up}");
    let down = mine
        .iter()
        .find(|t| t["kind"] == "download" && t["error"].is_null())
        .unwrap();
    assert_eq!(
        (&down["src_site"], &down["dst_site"]),
        (&Value::from("A"), &Value::from("client"))
    );
    assert_eq!(down["bytes"], 1_000_000);
    let failed = list("alice", &["--failed"]);
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0]["kind"], "download");
    assert_eq!(failed[0]["error"]["kind"], "not_found");
    assert_eq!(failed[0]["error"]["exit_code"], 3);
    let repl = list("alice", &["--kind", "replicate", "--site", "B"]);
    assert!(!repl.is_empty());
    let files: u64 = repl.iter().map(|t| t["files"].as_u64().unwrap()).sum();
    assert_eq!(files, 2, "{repl:?}");
    for t in &repl {
        assert_eq!(
            (&t["src_site"], &t["dst_site"]),
            (&Value::from("A"), &Value::from("B")),
            "{t}"
        );
        assert_eq!(t["files_failed"], 0, "{t}");
    }

    // One transfer in full: each file with its node and checksum.
    let id = up["id"].as_i64().unwrap().to_string();
    let one = g.json("alice", &["transfers", "--json", "--id", &id]);
    let fl = one["transfer"]["files_list"].as_array().unwrap();
    assert_eq!(fl.len(), 2, "{one}");
    let site_a = ["a1", "a2"];
    for f in fl {
        assert!(site_a.contains(&f["node"].as_str().unwrap()), "{f}");
        assert!(f["checksums"]["crc32c"].is_string(), "{f}");
        assert!(f["error"].is_null(), "{f}");
    }
    let text =
        String::from_utf8_lossy(&g.ok("alice", &["transfers", "--id", &id]).stdout).into_owned();
    assert!(
        text.contains("by alice: ok") && text.contains("2 of 2 files"),
        "{text}"
    );
    let table = String::from_utf8_lossy(&g.ok("alice", &["transfers"]).stdout).into_owned();
    assert!(
        table.contains("client -> A") && table.contains("FAILED not_found"),
        "{table}"
    );

    // Others: bob (an administrator) sees everybody's, runner (not one) only their own, and
    // neither another's list nor another's record by id.
    let all = list("bob", &[]);
    assert!(all.iter().any(|t| t["user"] == "alice") && all.iter().any(|t| t["user"] == "bob"));
    assert!(
        list("bob", &["--user", "alice"])
            .iter()
            .all(|t| t["user"] == "alice")
    );
    assert!(list("runner", &[]).is_empty());
    assert_exit(
        &g.run("runner", &["transfers", "--user", "alice"]),
        5,
        "administrators",
    );
    assert_exit(
        &g.run("runner", &["transfers", "--id", &id]),
        3,
        "no such transfer",
    );
    assert_exit(
        &g.run("alice", &["transfers", "--since", "yesterday"]),
        2,
        "RFC 3339",
    );
    assert!(list("alice", &["--since", "1h"]).len() == mine.len());
    // `haul nodes --json` gives heartbeats as a time and an age too.
    let nodes = g.json("alice", &["nodes", "--json"]);
    for n in nodes["nodes"].as_array().unwrap() {
        assert!(n["heartbeat"].as_str().unwrap().ends_with('Z'), "{n}");
        assert!(n["heartbeat_age_s"].as_f64().unwrap() >= 0.0, "{n}");
    }
    if std::env::var_os("SHOW_HISTORY").is_some() {
        eprintln!("{table}\n{text}");
    }
}

/// Issue 15 item 5: the daemons tell systemd (`Type=notify`) when they listen: `READY=1` and a
/// status line on `$NOTIFY_SOCKET`, sent after the address is bound (a client connecting on
/// the notification is served).
#[test]
fn daemons_notify_systemd_when_ready() {
    use std::os::unix::net::UnixDatagram;
    let dir = tempfile::tempdir().unwrap();
    let pki = make_pki(&dir.path().join("pki"));
    let sock_path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let recv = |what: &str| -> String {
        let mut buf = [0u8; 4096];
        let n = sock
            .recv(&mut buf)
            .unwrap_or_else(|e| panic!("{what}: no readiness notification: {e}"));
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };

    let mut cmd = haul_clean();
    harness::daemons::meta_serve(&mut cmd, &pki, "127.0.0.1:0", &dir.path().join("meta"));
    cmd.args(["--http", "off"]).env("NOTIFY_SOCKET", &sock_path);
    let (_meta, line) = start_server(cmd, &dir.path().join("meta.log"));
    let meta_addr = line.split_whitespace().next().unwrap().to_string();
    let msg = recv("meta serve");
    assert!(msg.lines().any(|l| l == "READY=1"), "{msg:?}");
    assert!(
        msg.contains(&format!("STATUS=metadata server on {meta_addr}")),
        "{msg:?}"
    );
    // This server has no dashboard: `haul dashboard` says so (exit 4).
    let mut c = haul_clean();
    pki.as_user(&mut c, "alice");
    c.args(["dashboard", &format!("haul://{meta_addr}")]);
    assert_exit(&run_bounded(c, CMD_TIMEOUT), 4, "no dashboard");

    let mut cmd = haul_clean();
    harness::daemons::node_serve(
        &mut cmd,
        &pki,
        ("a1", "A"),
        &format!("haul://{meta_addr}"),
        &dir.path().join("a1"),
        "127.0.0.1:0",
    );
    cmd.env("NOTIFY_SOCKET", &sock_path);
    std::fs::create_dir_all(dir.path().join("a1")).unwrap();
    let (_node, line) = start_server(cmd, &dir.path().join("a1.log"));
    let msg = recv("node serve");
    assert!(msg.lines().any(|l| l == "READY=1"), "{msg:?}");
    assert!(
        msg.contains(&format!(
            "STATUS=storage node a1 of site A on {}",
            line.trim()
        )),
        "{msg:?}"
    );

    let root = dir.path().join("export");
    let _ep = serve(
        &root,
        &["--insecure"],
        &[("NOTIFY_SOCKET", sock_path.to_str().unwrap())],
    );
    let msg = recv("serve");
    assert!(
        msg.lines().any(|l| l == "READY=1") && msg.contains("STATUS=serving "),
        "{msg:?}"
    );
    // A daemon whose NOTIFY_SOCKET leads nowhere still runs (one warning).
    let _quiet = serve(
        &root,
        &["--insecure"],
        &[("NOTIFY_SOCKET", "/nonexistent/sock")],
    );
}

/// Issue 16 item 4 (grid to endpoint): `haul cp -r haul://META/dir haul://ENDPOINT/path`
/// copies third party: every node holding a replica pushes its files straight to a standalone
/// `haul serve` (certificate of the grid's CA, the user mapped to a local account); the
/// directories and the empty file, which no node holds, come from the client. The tree
/// arrives byte-identical (empty directory included), written as the mapped account, and the
/// copy is in the history.
#[test]
fn grid_files_go_to_a_standalone_endpoint_third_party() {
    if !testkit::is_root() {
        testkit::skip!("needs root (the endpoint writes as the mapped account)");
    }
    let Some(uid) = ensure_task_account() else {
        testkit::skip!("the local account {TASK_ACCOUNT} does not exist and cannot be created");
    };
    let g = Grid::start();
    let (src, _) = sample_tree(g.path());
    std::fs::create_dir_all(src.join("void")).unwrap();
    // Spread over both sites, so that nodes of both push.
    runner_tree_at_both_sites(&g, &src);
    let root = g.path().join("endpoint-root");
    std::fs::create_dir_all(&root).unwrap();
    std::os::unix::fs::chown(&root, Some(uid), None).unwrap();
    let ep = runner_endpoint(&g, &root, "127.0.0.1:0");
    let out = g.cp("runner", &["-r", &g.url("/r/tree"), &ep.tls_url("copy")]);
    assert_ok(&out);
    let report = json(&out);
    assert_eq!(report["files"], 5, "{report}");
    // Each file with data came from a node (third party); the empty one from the client.
    for f in report["file_list"].as_array().unwrap() {
        let from_node = f["node"].as_str().is_some_and(|n| !n.is_empty());
        assert_eq!(from_node, f["bytes"] != 0, "{f}");
    }
    assert_same_tree(&src, &root.join("copy"));
    assert!(root.join("copy/void").is_dir());
    use std::os::unix::fs::MetadataExt as _;
    assert_eq!(
        std::fs::metadata(root.join("copy/sub/deep/mid.bin"))
            .unwrap()
            .uid(),
        uid
    );
    // Into an existing directory the tree keeps its name.
    let out = g.cp("runner", &["-r", &g.url("/r/tree"), &ep.tls_url("copy")]);
    assert_ok(&out);
    assert_same_tree(&src, &root.join("copy/tree"));
    // In the history as a copy from the grid.
    let h = g.json("runner", &["transfers", "--json", "--kind", "copy"]);
    let t = &h["transfers"][0];
    assert!(t["destination"].as_str().unwrap().contains("/copy"), "{t}");
    assert_eq!(t["files"], 5, "{t}");
    // A user the endpoint does not map is refused by it (exit 5), an endpoint that is not
    // there is unreachable (exit 4); neither leaves anything behind.
    g.ok("alice", &["mkdir", "/alice"]);
    let one = g.path().join("one.bin");
    write_file(&one, 9, 100_000);
    assert_ok(&g.cp("alice", &[one.to_str().unwrap(), &g.url("/alice/one.bin")]));
    let out = g.cp(
        "alice",
        &[&g.url("/alice/one.bin"), &ep.tls_url("alice.bin")],
    );
    assert_exit(&out, 5, "");
    assert!(!root.join("alice.bin").exists());
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let out = g.cp(
        "runner",
        &[
            &g.url("/r/tree/small.txt"),
            &format!("haul://127.0.0.1:{dead}/x"),
        ],
    );
    assert_exit(&out, 4, "cannot connect");
    assert!(!stderr(&out).contains("replica"), "{}", stderr(&out));
    // The other way, endpoint to grid, third party too: the endpoint lists its tree, the
    // metadata server places the files, and the endpoint pushes each node its share.
    let out = g.cp(
        "runner",
        &[
            "-r",
            &ep.tls_url("copy/tree"),
            &g.url("/r/back"),
            "--site",
            "B",
        ],
    );
    assert_ok(&out);
    let report = json(&out);
    assert_eq!(report["files"], 5, "{report}");
    for f in report["file_list"].as_array().unwrap() {
        let to_node = f["node"].as_str().is_some_and(|n| !n.is_empty());
        assert_eq!(to_node, f["bytes"] != 0, "{f}");
    }
    let w = g.where_(&["/r/back/big.bin".to_string()]);
    let reps = live_complete(&w[0], &[]);
    assert!(!reps.is_empty() && reps.iter().all(|r| r.1 == "B"), "{w:?}");
    // The tree arrived whole (the empty directory too), and reads back the same.
    let dl = tempfile::tempdir_in(g.path()).unwrap();
    assert_ok(&g.cp(
        "runner",
        &["-r", &g.url("/r/back"), dl.path().to_str().unwrap()],
    ));
    assert_same_tree(&src, &dl.path().join("back"));
    let void = g.json("runner", &["stat", "--json", "/r/back/void"]);
    assert_eq!(void["entries"][0]["type"], "dir", "{void}");
    // One file into a grid directory; a path that is not on the endpoint fails (exit 3).
    assert_ok(&g.cp(
        "runner",
        &[&ep.tls_url("copy/small.txt"), &g.url("/r/back/")],
    ));
    assert_eq!(
        g.json("runner", &["stat", "--json", "/r/back/small.txt"])["entries"][0]["size"],
        std::fs::metadata(src.join("small.txt")).unwrap().len()
    );
    let out = g.cp(
        "runner",
        &[&ep.tls_url("copy/nothing"), &g.url("/r/nothing")],
    );
    assert_exit(&out, 3, "nothing");
    // A user the endpoint does not map is refused by it, and nothing appears in the grid.
    let out = g.cp(
        "alice",
        &[&ep.tls_url("copy/small.txt"), &g.url("/alice/x.txt")],
    );
    assert_exit(&out, 5, "");
    assert_exit(&g.run("alice", &["stat", "/alice/x.txt"]), 3, "");
}
