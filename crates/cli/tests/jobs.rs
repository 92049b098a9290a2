//! Transfer jobs as real processes on loopback (issue 16): `haul submit` hands copies to the
//! metadata server, which does them node to node whatever happens to the submitter, to
//! itself and to the nodes. Each test starts its own grid (two sites of two nodes); every
//! command and wait is bounded.

mod common;
use common::grid::*;
use common::*;
use serde_json::Value;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A tree of `n` files of `size` bytes under `dir/data`, uploaded by `user` into
/// `/USER/data` at site A.
fn upload_data(g: &Grid, user: &str, n: usize, size: usize) -> PathBuf {
    let src = g.path().join(format!("{user}-src")).join("data");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    for i in 0..n {
        let dir = if i % 3 == 0 {
            src.join("sub")
        } else {
            src.clone()
        };
        write_file(&dir.join(format!("f{i:03}.bin")), i as u64 + 7, size);
    }
    g.ok(user, &["mkdir", "-p", &format!("/{user}")]);
    let out = g.cp(
        user,
        &[
            "-r",
            src.to_str().unwrap(),
            &g.url(&format!("/{user}")),
            "--site",
            "A",
        ],
    );
    assert_ok(&out);
    assert_eq!(json(&out)["files_failed"], 0);
    src
}

fn job(g: &Grid, user: &str, id: &str) -> Value {
    g.json(user, &["job", "show", id, "--json"])["job"].clone()
}

fn count(j: &Value, key: &str) -> u64 {
    j[key].as_u64().unwrap_or_else(|| panic!("{key} in {j}"))
}

/// `haul submit --json` as `user`; the job's id.
fn submit(g: &Grid, user: &str, args: &[&str]) -> String {
    let mut a = vec!["submit", "--json"];
    a.extend_from_slice(args);
    let j = g.json(user, &a);
    assert_eq!(j["version"], 1, "{j}");
    j["job"]["id"].as_i64().expect("job id").to_string()
}

/// Waits (bounded) until `cond` holds for job `id`; panics with the job and logs if not.
fn wait_job(g: &Grid, user: &str, id: &str, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
    let mut last = Value::Null;
    let ok = wait_for(Duration::from_secs(120), || {
        last = job(g, user, id);
        cond(&last)
    });
    assert!(ok, "job {id}: {what}: {last}\n{}", g.logs());
    last
}

/// `haul job wait ID` as `user`: its exit code.
fn wait_code(g: &Grid, user: &str, id: &str) -> i32 {
    let out = run_bounded(
        g.cmd(user, &["job", "wait", id, "--timeout", "150s"]),
        Duration::from_secs(170),
    );
    out.status.code().unwrap_or(-1)
}

/// The inode id of each file below a grid directory.
fn ids_below(g: &Grid, user: &str, dir: &str) -> HashMap<String, u64> {
    let mut out = HashMap::new();
    for d in [dir.to_string(), format!("{dir}/sub")] {
        let listed = g.run(user, &["ls", "--json", &d]);
        if listed.status.code() == Some(3) {
            continue;
        }
        let j = json(&listed);
        for e in j["entries"].as_array().unwrap() {
            if e["type"] == "file" {
                out.insert(
                    e["path"].as_str().unwrap().to_string(),
                    e["id"].as_u64().unwrap(),
                );
            }
        }
    }
    out
}

/// A one-shot HTTP receiver for webhooks: answers the first `fail_first` POSTs 500, the next
/// 200, and hands over the body of that one.
fn webhook_receiver(fail_first: usize) -> (String, std::sync::mpsc::Receiver<(usize, String)>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for (n, conn) in l.incoming().enumerate().take(fail_first + 1) {
            let Ok(mut c) = conn else { continue };
            c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            // Headers, then Content-Length bytes of body.
            let body = loop {
                let Ok(k) = c.read(&mut chunk) else {
                    break None;
                };
                if k == 0 {
                    break None;
                }
                buf.extend_from_slice(&chunk[..k]);
                let text = String::from_utf8_lossy(&buf).to_string();
                if let Some(end) = text.find("\r\n\r\n") {
                    let len: usize = text[..end]
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse().unwrap())
                        })
                        .unwrap_or(0);
                    if buf.len() >= end + 4 + len {
                        break Some(
                            String::from_utf8_lossy(&buf[end + 4..end + 4 + len]).to_string(),
                        );
                    }
                }
            };
            let status = if n < fail_first { "500 Oops" } else { "200 OK" };
            let _ = c.write_all(
                format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    .as_bytes(),
            );
            if n == fail_first {
                let _ = tx.send((n + 1, body.unwrap_or_default()));
            }
        }
    });
    (format!("http://{addr}/hooks/longhaul?x=1"), rx)
}

/// A job outlives the metadata server (killed with SIGKILL mid-job) and a storage node
/// (killed mid-job): it completes with every file byte-identical, the files committed before
/// the kill are not copied again, and the webhook is told (retried after a refusal).
#[test]
fn a_job_survives_restarts_of_the_metadata_server_and_nodes() {
    let mut g = Grid::start_with(&[
        "--job-batch-files",
        "3",
        // Two sessions: the link stays busy (more batches waiting than sessions) long enough
        // for the optimizer's 3 s probes, which the test checks it learned from.
        "--job-link-sessions",
        "2",
        "--job-retry-delay",
        "1s",
        // The test's webhook receiver is on loopback.
        "--job-webhooks-to-private",
    ]);
    let src = upload_data(&g, "alice", 30, 512 * 1024);
    let (hook, hooked) = webhook_receiver(1);
    // 4 Mbit/s a session, two sessions: ~3 s of copying at least.
    let id = submit(
        &g,
        "alice",
        &[
            "-r",
            "/alice/data",
            "/alice/copy",
            "--site",
            "B",
            "--rate",
            "4M",
            "--webhook",
            &hook,
        ],
    );
    let j = job(&g, "alice", &id);
    assert_eq!(
        (count(&j, "files"), j["user"].as_str()),
        (30, Some("alice")),
        "{j}"
    );
    let before = wait_job(&g, "alice", &id, "some files done", |j| {
        j["files_done"].as_u64() >= Some(6)
    });
    assert!(
        count(&before, "files_done") < 30,
        "the job ended before the kill: {before}"
    );
    // What was committed before the kill, by inode id.
    let show = g.json("alice", &["job", "show", &id, "--json", "--state", "done"]);
    let done_before: Vec<String> = show["job"]["files_list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["destination"].as_str().unwrap().to_string())
        .collect();
    let ids_before: HashMap<String, u64> = ids_below(&g, "alice", "/alice/copy")
        .into_iter()
        .filter(|(p, _)| done_before.contains(p))
        .collect();
    assert_eq!(
        ids_before.len(),
        done_before.len(),
        "{ids_before:?} {done_before:?}"
    );

    g.kill_meta();
    let restarted = now_ms();
    let addr = g.meta_addr.clone();
    g.start_meta(&addr);
    g.wait_nodes_up(restarted);
    assert_eq!(
        wait_code(&g, "alice", &id),
        0,
        "{}\n{}",
        job(&g, "alice", &id),
        g.logs()
    );
    let end = job(&g, "alice", &id);
    assert_eq!(
        (count(&end, "files_done"), end["state"].as_str()),
        (30, Some("done")),
        "{end}"
    );
    // Nothing committed before the kill was sent again: same inodes.
    let ids_after = ids_below(&g, "alice", "/alice/copy");
    for (p, i) in &ids_before {
        assert_eq!(ids_after.get(p), Some(i), "{p} was copied again");
    }
    // Every copy at site B, and byte-identical.
    let w = g.where_(&ids_after.keys().cloned().collect::<Vec<_>>());
    for f in &w {
        let reps = live_complete(f, &[]);
        assert!(!reps.is_empty() && reps.iter().all(|r| r.1 == "B"), "{f}");
    }
    assert_download_same(&g, "alice", &g.url("/alice/copy"), &src, &[]);
    // The optimizer measured the link (A to B) and remembers its setting.
    let links = g.json("alice", &["jobs", "--json"])["links"].clone();
    let ab = links
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["src_site"] == "A" && l["dst_site"] == "B")
        .unwrap_or_else(|| panic!("no link A -> B learned: {links}"));
    assert!(ab["sessions"].as_u64().unwrap() >= 1, "{ab}");
    assert!(ab["goodput_bps"].as_f64().unwrap() > 0.0, "{ab}");
    // The history has the job's sessions.
    let h = g.json("alice", &["transfers", "--kind", "job", "--json"]);
    assert!(!h["transfers"].as_array().unwrap().is_empty(), "{h}");
    // The webhook was told, on its second attempt (the first was refused).
    let (attempt, body) = hooked
        .recv_timeout(Duration::from_secs(30))
        .expect("the webhook was not called");
    assert_eq!(attempt, 2);
    let doc: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(doc["version"], 1, "{doc}");
    assert_eq!(doc["event"], "job.ended", "{doc}");
    assert_eq!(doc["job"]["id"].to_string(), id, "{doc}");
    assert_eq!(doc["job"]["state"], "done", "{doc}");
    assert_eq!(doc["job"]["files_done"], 30, "{doc}");

    // A destination node killed mid-job: its files go to the other node of site B.
    let id = submit(
        &g,
        "alice",
        &[
            "-r",
            "/alice/data",
            "/alice/copy2",
            "--site",
            "B",
            "--rate",
            "4M",
        ],
    );
    wait_job(&g, "alice", &id, "copying", |j| {
        j["files_done"].as_u64() >= Some(3)
    });
    g.kill_node("b1");
    assert_eq!(
        wait_code(&g, "alice", &id),
        0,
        "{}\n{}",
        job(&g, "alice", &id),
        g.logs()
    );
    // b1 back, so that what it holds can be read.
    let restarted = now_ms();
    g.restart_node_env("b1", &[]);
    g.wait_nodes_up(restarted);
    assert_download_same(&g, "alice", &g.url("/alice/copy2"), &src, &[]);
}

/// Fair share: bob's 4 files, submitted after alice's 40 at the same priority, go out within
/// a bounded number of alice's batches: with one session at a time and 2 files a batch, at
/// most 1 batch in flight when bob submits plus 1 of alice's before each of bob's 2 batches,
/// so alice completes at most 6 files between bob's submission and the end of bob's job
/// (first come, first served would make bob wait for all of alice's).
#[test]
fn a_late_small_job_is_not_stuck_behind_a_big_one() {
    let g = Grid::start_with(&[
        "--job-sessions",
        "1",
        "--job-link-sessions",
        "1",
        "--job-max-link-sessions",
        "1",
        "--job-batch-files",
        "2",
    ]);
    upload_data(&g, "alice", 120, 16 * 1024);
    upload_data(&g, "bob", 4, 16 * 1024);
    let a = submit(&g, "alice", &["-r", "/alice/data", "/alice/copy"]);
    wait_job(&g, "alice", &a, "started", |j| {
        j["files_done"].as_u64() >= Some(2)
    });
    let b = submit(&g, "bob", &["-r", "/bob/data", "/bob/copy"]);
    // From when the job was stored (the answer comes after the commit): the scheduler may
    // have launched one more of alice's batches while it was being stored.
    let since = now_ms() as i64;
    assert_eq!(wait_code(&g, "bob", &b), 0, "{}", job(&g, "bob", &b));
    assert_eq!(wait_code(&g, "alice", &a), 0);
    // By the server's clock: alice's files done after bob submitted and before bob's last.
    let bob = g.json("bob", &["job", "show", &b, "--json"])["job"].clone();
    let alice = g.json("alice", &["job", "show", &a, "--json"])["job"].clone();
    let done_at = |j: &Value| -> Vec<i64> {
        j["files_list"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["updated_ms"].as_i64().unwrap())
            .collect()
    };
    let until = *done_at(&bob).iter().max().unwrap();
    let meanwhile = done_at(&alice)
        .iter()
        .filter(|t| (since..=until).contains(*t))
        .count();
    let later = done_at(&alice).iter().filter(|t| **t > until).count();
    assert!(
        meanwhile <= 6,
        "alice completed {meanwhile} files while bob's 4 waited (bound 6)\n{}",
        g.logs()
    );
    assert!(
        later > 0,
        "alice's job ended first: the test proves nothing"
    );
    // Users see their own jobs; bob cannot see or cancel alice's.
    let mine = g.json("bob", &["jobs", "--json"]);
    let ids: Vec<String> = mine["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].to_string())
        .collect();
    assert_eq!(ids, vec![b.clone()]);
    assert_exit(&g.run("bob", &["job", "cancel", &a]), 3, "no such job");
}

/// Cancel stops a job and leaves nothing half-copied under a final name; retry finishes it.
/// Bad input: missing and unreadable sources are accepted with a per-file error and the job's
/// exit code; a corrupt job record is reported and skipped without harm to the server.
#[test]
fn cancel_retry_and_bad_jobs() {
    let mut g = Grid::start_with(&["--job-batch-files", "2", "--job-retry-delay", "1s"]);
    let src = upload_data(&g, "alice", 12, 512 * 1024);
    let id = submit(
        &g,
        "alice",
        &["-r", "/alice/data", "/alice/copy", "--rate", "2M"],
    );
    wait_job(&g, "alice", &id, "copying", |j| {
        j["files_done"].as_u64() >= Some(1)
    });
    let out = g.ok("alice", &["job", "cancel", &id]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("cancelled"));
    assert_eq!(wait_code(&g, "alice", &id), 130);
    let end = wait_job(&g, "alice", &id, "settled", |j| j["files_running"] == 0);
    assert_eq!(end["state"], "cancelled", "{end}");
    assert!(count(&end, "files_done") < 12, "{end}");
    // Whatever is there arrived whole: each file equals its source.
    let there = ids_below(&g, "alice", "/alice/copy");
    assert_eq!(
        there.len() as u64,
        count(&end, "files_done"),
        "{there:?} {end}"
    );
    for p in there.keys() {
        let local = g.path().join("one.back");
        let _ = std::fs::remove_file(&local);
        assert_ok(&g.cp("alice", &[&g.url(p), local.to_str().unwrap()]));
        let rel = p.strip_prefix("/alice/copy/").unwrap();
        assert_same_file(&src.join(rel), &local);
    }
    assert_exit(&g.run("alice", &["job", "cancel", &id]), 2, "already ended");
    // Retry queues what did not arrive; the job completes.
    g.ok("alice", &["job", "retry", &id]);
    assert_eq!(wait_code(&g, "alice", &id), 0, "{}", job(&g, "alice", &id));
    assert_download_same(&g, "alice", &g.url("/alice/copy"), &src, &[]);
    assert_exit(
        &g.run("alice", &["job", "retry", &id]),
        2,
        "nothing to retry",
    );

    // A missing source: accepted, the file fails at once with the reason; exit 3.
    let id = submit(
        &g,
        "alice",
        &[
            "/alice/nowhere.bin",
            "/alice/x.bin",
            "/alice/data/f001.bin",
            "/alice/y.bin",
        ],
    );
    assert_eq!(wait_code(&g, "alice", &id), 3);
    let j = g.json("alice", &["job", "show", &id, "--json"]);
    let files = j["job"]["files_list"].as_array().unwrap();
    assert_eq!(files[0]["state"], "failed", "{j}");
    assert_eq!(files[0]["error"]["kind"], "not_found", "{j}");
    assert_eq!(files[1]["state"], "done", "{j}");
    // Another user's private file: permission denied, exit 5.
    g.ok("alice", &["chmod", "600", "/alice/data/f002.bin"]);
    g.ok("bob", &["mkdir", "-p", "/bob"]);
    let id = submit(&g, "bob", &["/alice/data/f002.bin", "/bob/f002.bin"]);
    assert_eq!(wait_code(&g, "bob", &id), 5);
    // Refused before anything is stored.
    assert_exit(
        &g.run("mallory", &["submit", "/alice/data/f001.bin", "/alice/z"]),
        5,
        "",
    );
    assert_exit(
        &g.run("alice", &["submit", "/alice/data/f001.bin"]),
        2,
        "pairs",
    );
    assert_exit(
        &g.run(
            "alice",
            &[
                "submit",
                "/alice/data/f001.bin",
                "haul://127.0.0.1:9/x",
                "haul://127.0.0.1:8/a",
                "haul://127.0.0.1:7/b",
            ],
        ),
        2,
        "same metadata server",
    );
    // An endpoint that is not there is the file's error, not the submission's (exit 4).
    let nowhere = submit(
        &g,
        "alice",
        &[
            "--tries",
            "1",
            "/alice/data/f001.bin",
            "haul://127.0.0.1:9/x",
        ],
    );
    assert_eq!(wait_code(&g, "alice", &nowhere), 4, "{}", g.logs());
    let out = g.run("alice", &["submit", "--priority", "9", "/a", "/b"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("1..=5"), "{}", stderr(&out));
    assert_exit(
        &g.run("alice", &["submit", "-r", "/alice/data", "/alice/data/in"]),
        2,
        "into itself",
    );
    assert_exit(
        &g.run(
            "alice",
            &["submit", "--site", "Z", "/alice/data/f001.bin", "/alice/q"],
        ),
        2,
        "site",
    );
    assert_exit(
        &g.run(
            "alice",
            &[
                "submit",
                "--webhook",
                "ftp://x",
                "/alice/data/f001.bin",
                "/alice/q",
            ],
        ),
        2,
        "webhook",
    );
    assert_exit(
        &g.run("alice", &["submit", "-f", "/nonexistent/list"]),
        3,
        "list",
    );
    // A webhook into the server's own networks, and priorities above 3, are refused.
    assert_exit(
        &g.run(
            "alice",
            &[
                "submit",
                "--webhook",
                "http://169.254.169.254/x",
                "/alice/data/f001.bin",
                "/alice/q",
            ],
        ),
        2,
        "private",
    );
    assert_exit(
        &g.run(
            "alice",
            &[
                "submit",
                "--priority",
                "5",
                "/alice/data/f001.bin",
                "/alice/q",
            ],
        ),
        5,
        "administrators",
    );
    // Two files to one destination: the second is refused, the first copied.
    let id = submit(
        &g,
        "alice",
        &[
            "/alice/data/f001.bin",
            "/alice/dup.bin",
            "/alice/data/f002.bin",
            "/alice/dup.bin",
        ],
    );
    assert_eq!(wait_code(&g, "alice", &id), 2);
    let j = g.json("alice", &["job", "show", &id, "--json"]);
    let files = j["job"]["files_list"].as_array().unwrap();
    assert_eq!(
        (files[0]["state"].as_str(), files[1]["state"].as_str()),
        (Some("done"), Some("failed")),
        "{j}"
    );
    assert!(
        files[1]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("same destination"),
        "{j}"
    );

    // A corrupt job record (options that do not parse), written while the server is down.
    let id = submit(
        &g,
        "alice",
        &["-r", "/alice/data", "/alice/copy3", "--rate", "1M"],
    );
    g.kill_meta();
    let db = g.path().join("meta-data").join("catalog.db");
    corrupt_job(&db, &id);
    let restarted = now_ms();
    let addr = g.meta_addr.clone();
    g.start_meta(&addr);
    g.wait_nodes_up(restarted);
    let j = wait_job(&g, "alice", &id, "reported corrupt", |j| {
        j["state"] == "failed"
    });
    assert!(
        j["error"].as_str().unwrap().contains("corrupt job record"),
        "{j}"
    );
    // The server goes on serving, and new jobs run.
    let id = submit(&g, "alice", &["/alice/data/f001.bin", "/alice/after.bin"]);
    assert_eq!(wait_code(&g, "alice", &id), 0);
}

fn corrupt_job(db: &Path, id: &str) {
    use sqlx::Connection;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut c = sqlx::SqliteConnection::connect(&format!("sqlite:{}", db.display()))
            .await
            .unwrap();
        let n = sqlx::query("UPDATE jobs SET options = '{\"max_tries\": \"garbage' WHERE id = ?")
            .bind(id.parse::<i64>().unwrap())
            .execute(&mut c)
            .await
            .unwrap()
            .rows_affected();
        assert_eq!(n, 1);
    });
}

/// The fairness cap (`--job-link-streams K`): a link's job sessions together never have more
/// than K data streams, and run cubic (a flow's share is a flow's share only between TCP-fair
/// flows). Checked on the history's records of the job's sessions; their shares beside a
/// competing flow are measured by `bench/jobs --compete`.
#[test]
fn a_capped_link_gets_at_most_k_streams_of_cubic() {
    let g = Grid::start_with(&["--job-link-streams", "2", "--job-batch-files", "4"]);
    upload_data(&g, "alice", 12, 256 * 1024);
    let id = submit(
        &g,
        "alice",
        &["-r", "--site", "B", "/alice/data", "/alice/capped"],
    );
    assert_eq!(wait_code(&g, "alice", &id), 0, "{}", job(&g, "alice", &id));
    let h = g.json("alice", &["transfers", "--kind", "job", "--json"]);
    let records = h["transfers"].as_array().unwrap();
    assert!(!records.is_empty(), "{h}");
    for t in records {
        let streams = t["streams"].as_u64().unwrap();
        assert!((1..=2).contains(&streams), "{t}");
        assert!(t["summary"].as_str().unwrap().contains("cubic"), "{t}");
    }
    // The optimizer never gave the link more sessions than the cap has streams.
    let links = g.json("alice", &["jobs", "--json"])["links"].clone();
    for l in links.as_array().unwrap() {
        assert!(l["sessions"].as_u64().unwrap() <= 2, "{l}");
    }
}

/// (inode, mtime) of each file below `dir`, by path relative to it.
fn files_at(dir: &Path) -> HashMap<String, (u64, i64)> {
    use std::os::unix::fs::MetadataExt as _;
    let mut out = HashMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let m = e.metadata().unwrap();
            if m.is_dir() {
                todo.push(e.path());
            } else if m.is_file() {
                let rel = e.path().strip_prefix(dir).unwrap().display().to_string();
                out.insert(rel, (m.ino(), m.mtime()));
            }
        }
    }
    out
}

fn ms_of(v: &Value) -> i64 {
    let t = time::OffsetDateTime::parse(
        v.as_str().expect("a time"),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    (t.unix_timestamp_nanos() / 1_000_000) as i64
}

#[test]
fn jobs_copy_between_the_grid_and_a_standalone_endpoint_on_the_users_delegation() {
    if !testkit::is_root() {
        testkit::skip!("needs root (the endpoint writes as the mapped account)");
    }
    let Some(uid) = ensure_task_account() else {
        testkit::skip!("the local account {TASK_ACCOUNT} does not exist and cannot be created");
    };
    let g = Grid::start_with(&[
        "--job-batch-files",
        "3",
        "--job-retry-delay",
        "1s",
        // One session at a time with the endpoint, whatever the link's optimizer allows.
        "--job-endpoint-sessions",
        "1",
        "--job-link-sessions",
        "4",
    ]);
    let src = upload_data(&g, "runner", 24, 512 * 1024);
    let root = g.path().join("endpoint-root");
    std::fs::create_dir_all(root.join("out")).unwrap();
    std::os::unix::fs::chown(&root, Some(uid), None).unwrap();
    std::os::unix::fs::chown(root.join("out"), Some(uid), None).unwrap();
    let mut ep = runner_endpoint(&g, &root, "127.0.0.1:0");
    let addr = ep.addr.clone();

    // 1. Grid -> endpoint, the endpoint SIGKILLed mid-job and restarted.
    let id = submit(
        &g,
        "runner",
        &["-r", "/runner/data", &ep.tls_url("out/"), "--rate", "8M"],
    );
    let copied = root.join("out/data");
    let before = {
        let mut seen = HashMap::new();
        let ok = wait_for(Duration::from_secs(120), || {
            let j = job(&g, "runner", &id);
            seen = files_at(&copied);
            count(&j, "files_done") >= 6 && seen.len() >= 6
        });
        assert!(ok, "6 files done: {}\n{}", job(&g, "runner", &id), g.logs());
        // Only what the job counts done (a file may be arriving as we look).
        let done: Vec<String> = g
            .json("runner", &["job", "show", &id, "--state", "done", "--json"])["job"]["files_list"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["destination"].as_str().unwrap().to_string())
            .collect();
        seen.retain(|rel, _| {
            done.iter()
                .any(|d| d.ends_with(&format!("/out/data/{rel}")))
        });
        seen
    };
    assert!(before.len() >= 6, "{before:?}");
    ep.kill();
    std::thread::sleep(Duration::from_secs(2));
    ep = runner_endpoint(&g, &root, &addr);
    assert_eq!(wait_code(&g, "runner", &id), 0, "{}", g.logs());
    assert_same_tree(&src, &copied);
    use std::os::unix::fs::MetadataExt as _;
    assert_eq!(
        std::fs::metadata(copied.join("sub/f000.bin"))
            .unwrap()
            .uid(),
        uid,
        "written as the user's account"
    );
    // Nothing committed before the kill was written again.
    let after = files_at(&copied);
    for (rel, was) in &before {
        assert_eq!(after.get(rel), Some(was), "{rel} was written again");
    }
    // At most one session with the endpoint at a time, by the history of the job's sessions.
    let h = g.json("runner", &["transfers", "--json", "--kind", "job"]);
    let mut spans: Vec<(i64, i64)> = h["transfers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| {
            t["source"]
                .as_str()
                .unwrap()
                .starts_with(&format!("job {id}:"))
        })
        .map(|t| (ms_of(&t["started"]), ms_of(&t["ended"])))
        .collect();
    spans.sort();
    assert!(spans.len() >= 3, "{h}");
    for w in spans.windows(2) {
        assert!(
            w[1].0 >= w[0].1,
            "two sessions with the endpoint at once: {spans:?}"
        );
    }

    // 2. Endpoint -> grid: the tree comes back byte-identical.
    let back = submit(
        &g,
        "runner",
        &["-r", &ep.tls_url("out/data"), &g.url("/runner/back")],
    );
    assert_eq!(wait_code(&g, "runner", &back), 0, "{}", g.logs());
    assert_download_same(&g, "runner", &g.url("/runner/back"), &src, &[]);
    let j = job(&g, "runner", &back);
    assert_eq!(count(&j, "files_done"), 24, "{j}");

    // 3. An endpoint that is not there: accepted, each pair failed with why (exit 4).
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let gone = submit(
        &g,
        "runner",
        &[
            "-r",
            &format!("haul://localhost:{dead}/x"),
            &g.url("/runner/never"),
        ],
    );
    assert_eq!(wait_code(&g, "runner", &gone), 4);
    let f = &g.json("runner", &["job", "show", &gone, "--json"])["job"]["files_list"][0];
    assert!(
        f["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&dead.to_string()),
        "{f}"
    );

    // A job that failed while the endpoint was down is retried once it is back: the retry
    // brings a new delegation (the first one ended with the job).
    ep.kill();
    let later = submit(
        &g,
        "runner",
        &[
            "--tries",
            "1",
            &g.url("/runner/data/f001.bin"),
            &ep.tls_url("out/later.bin"),
        ],
    );
    assert_eq!(wait_code(&g, "runner", &later), 4, "{}", g.logs());
    ep = runner_endpoint(&g, &root, &addr);
    g.ok("runner", &["job", "retry", &later]);
    assert_eq!(wait_code(&g, "runner", &later), 0, "{}", g.logs());
    assert_eq!(
        std::fs::read(root.join("out/later.bin")).unwrap(),
        std::fs::read(src.join("f001.bin")).unwrap()
    );

    // 4. What a delegation allows at the endpoint: its paths, and nothing at the grid.
    let d = g.path().join("deleg");
    g.ok(
        "runner",
        &[
            "cert",
            "delegate",
            "--grant",
            &format!("write {}", ep.tls_url("out/only")),
            "--hours",
            "1",
            "--out",
            d.to_str().unwrap(),
        ],
    );
    let one = g.path().join("one.bin");
    write_file(&one, 3, 10_000);
    let as_delegate = |args: &[&str]| {
        let mut c = haul_clean();
        c.args(["cp", "--progress", "never"])
            .args(["--cert", d.with_extension("pem").to_str().unwrap()])
            .args(["--key", d.with_extension("key").to_str().unwrap()])
            .args(["--ca", g.pki("ca/ca.pem").to_str().unwrap()])
            .args(args);
        run_bounded(c, Duration::from_secs(60))
    };
    assert_ok(&as_delegate(&[
        one.to_str().unwrap(),
        &ep.tls_url("out/only/x.bin"),
    ]));
    assert_eq!(
        std::fs::read(root.join("out/only/x.bin")).unwrap(),
        std::fs::read(&one).unwrap()
    );
    let out = as_delegate(&[one.to_str().unwrap(), &ep.tls_url("out/other.bin")]);
    assert_exit(&out, 5, "outside the delegation");
    assert!(!root.join("out/other.bin").exists());
    let out = as_delegate(&[
        &ep.tls_url("out/data/f001.bin"),
        g.path().join("f").to_str().unwrap(),
    ]);
    assert_exit(&out, 5, "outside the delegation");
    // Neither the metadata server nor a storage node takes a delegation: the TLS handshake
    // refuses a chain the CA did not issue (exit 5).
    let out = as_delegate(&[one.to_str().unwrap(), &g.url("/runner/d.bin")]);
    assert_exit(&out, 5, "");
    let node = format!("haul://{}/x.bin", g.node("b1").addr);
    assert_exit(&as_delegate(&[one.to_str().unwrap(), &node]), 5, "");
    // A user the endpoint does not map: the job is accepted, and its file fails with why
    // (exit 5); nothing is written there.
    g.ok("alice", &["mkdir", "-p", "/alice"]);
    assert_ok(&g.cp("alice", &[one.to_str().unwrap(), &g.url("/alice/x.bin")]));
    let a = submit(
        &g,
        "alice",
        &[
            &g.url("/alice/x.bin"),
            &ep.tls_url("out/x.bin"),
            "--tries",
            "2",
        ],
    );
    assert_eq!(wait_code(&g, "alice", &a), 5, "{}", g.logs());
    let f = &g.json("alice", &["job", "show", &a, "--json"])["job"]["files_list"][0];
    assert!(
        f["error"]["message"].as_str().unwrap().contains("mapfile"),
        "{f}"
    );
    assert!(!root.join("out/x.bin").exists());
}
