//! The grid as real processes on loopback, for the integration tests of the grid
//! (`tests/grid.rs`) and of attacks on it (`tests/adversary_grid.rs`): a metadata server and
//! four storage nodes at two sites, with a PKI made by `haul ca init` and `haul cert issue`,
//! the nodes enrolled by their certificates' fingerprints.
//!
//! Every process is killed when the grid is dropped (also when a test panics), every client
//! command and every wait is bounded.

use super::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Longest a single client command may take.
pub const CMD_TIMEOUT: Duration = Duration::from_secs(90);
/// Longest a server may take to print its address.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest to wait for the grid to notice something (nodes up or down, replicas made).
pub const SETTLE: Duration = Duration::from_secs(30);
/// The storage nodes: name (also the CN of its host certificate) and site.
pub const NODES: [(&str, &str); 4] = [("a1", "A"), ("a2", "A"), ("b1", "B"), ("b2", "B")];

// ---------------------------------------------------------------------------------------------
// Processes

/// A `haul` command with no credentials, grid or configuration from the environment.
pub fn haul_clean() -> Command {
    let mut c = haul();
    for v in [
        "HAUL_META",
        "HAUL_SITE",
        "HAUL_CONFIG",
        "HAUL_META_DB",
        "HAUL_MAPFILE",
    ] {
        c.env_remove(v);
    }
    c
}

/// Runs `cmd` to completion and returns its output; kills it and fails after `timeout`.
pub fn run_bounded(cmd: Command, timeout: Duration) -> Output {
    let what = format!("{cmd:?}");
    let o = harness::process::run_bounded(cmd, timeout).expect("spawn haul");
    if o.timed_out() {
        panic!(
            "{what} did not finish within {timeout:?}; stderr: {}",
            o.stderr_text()
        );
    }
    o.into_output()
}

/// A server process (metadata server or storage node); killed when dropped.
pub use harness::process::Proc;

/// Starts a server `cmd` that prints its address first (`--print-addr`), logging to `log`;
/// returns it and what it printed. Fails the test when it does not start.
pub fn start_server(mut cmd: Command, log: &Path) -> (Proc, String) {
    cmd.env("HAUL_LOG", "info");
    harness::process::Proc::start(cmd, log, START_TIMEOUT).unwrap_or_else(|e| panic!("{e}"))
}

// ---------------------------------------------------------------------------------------------
// The grid

pub struct Node {
    pub name: String,
    pub site: String,
    pub root: PathBuf,
    pub addr: String,
    /// `host:port` of its `/metrics`, when started with `--metrics`.
    pub metrics: Option<String>,
    pub proc: Option<Proc>,
}

/// A metadata server and four storage nodes (a1, a2 at site A; b1, b2 at site B) on loopback,
/// with TLS and a PKI of their own. The users are alice and bob (group atlas) and mallory (not
/// in the mapfile).
pub struct Grid {
    // Fields drop in order: the processes before the directory they work in.
    pub nodes: Vec<Node>,
    /// Extra arguments of every `haul meta serve` of this grid.
    pub meta_args: Vec<String>,
    pub meta: Option<Proc>,
    /// The API address (`127.0.0.1:PORT`), kept across restarts.
    pub meta_addr: String,
    /// The dashboard's address (`127.0.0.1:PORT`) of the running metadata server.
    pub meta_http: String,
    /// The grid's PKI (in `DIR/pki`).
    pub pki: harness::pki::Pki,
    pub dir: tempfile::TempDir,
}

impl Grid {
    pub fn start() -> Grid {
        Self::start_with(&[])
    }

    /// A grid whose metadata server gets `meta_args` too.
    pub fn start_with(meta_args: &[&str]) -> Grid {
        let dir = tempfile::tempdir().unwrap();
        let pki = dir.path().join("pki");
        let pki = make_pki(&pki);
        let mut g = Grid {
            pki,
            meta_args: meta_args.iter().map(|a| a.to_string()).collect(),
            nodes: Vec::new(),
            meta: None,
            meta_addr: String::new(),
            meta_http: String::new(),
            dir,
        };
        g.start_meta("127.0.0.1:0");
        for (name, site) in NODES {
            let root = g.path().join("nodes").join(name);
            let mut n = Node {
                name: name.into(),
                site: site.into(),
                root,
                addr: String::new(),
                metrics: None,
                proc: None,
            };
            g.start_node(&mut n);
            g.nodes.push(n);
        }
        g.wait_nodes_up(0);
        g
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn pki(&self, file: &str) -> PathBuf {
        self.path().join("pki").join(file)
    }

    pub fn start_meta(&mut self, listen: &str) {
        let mut cmd = haul_clean();
        harness::daemons::meta_serve(&mut cmd, &self.pki, listen, &self.path().join("meta-data"));
        cmd.args(["--http", "127.0.0.1:0"])
            .args(["--reconcile-every", "1s"])
            .args(&self.meta_args);
        if !self.meta_args.iter().any(|a| a == "--heartbeat") {
            cmd.args(["--heartbeat", "300ms", "--node-timeout", "2s"]);
        }
        let n = std::fs::read_dir(self.path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with("meta")
            })
            .count();
        let (p, line) = start_server(cmd, &self.path().join(format!("meta{n}.log")));
        // "ADDR http://HTTP/"
        let addr = line.split_whitespace().next().unwrap().to_string();
        assert!(addr.starts_with("127.0.0.1:"), "meta address: {line:?}");
        self.meta_addr = addr;
        self.meta_http = line
            .split_whitespace()
            .nth(1)
            .and_then(|u| u.strip_prefix("http://"))
            .map(|u| u.trim_end_matches('/').to_string())
            .unwrap_or_default();
        self.meta = Some(p);
    }

    pub fn start_node(&self, n: &mut Node) {
        let cert = n.name.clone();
        self.start_node_with(n, &cert, &[]);
    }

    /// Starts node `n` with the certificate `pki/CERT.pem` (and its key) and extra arguments.
    pub fn start_node_with(&self, n: &mut Node, cert: &str, extra: &[&str]) {
        self.start_node_env(n, cert, extra, &[]);
    }

    /// [`Self::start_node_with`], with environment variables (e.g. injected faults).
    pub fn start_node_env(&self, n: &mut Node, cert: &str, extra: &[&str], env: &[(&str, &str)]) {
        std::fs::create_dir_all(&n.root).unwrap();
        let mut cmd = haul_clean();
        harness::daemons::node_serve(
            &mut cmd,
            &self.pki,
            (cert, &n.site),
            &format!("haul://{}", self.meta_addr),
            &n.root,
            "127.0.0.1:0",
        );
        cmd.args(["--capacity", "10G"]).args(extra);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let (p, line) = start_server(cmd, &self.path().join(format!("{}.log", n.name)));
        // "ADDR" or, with --metrics, "ADDR http://METRICS/metrics"
        let mut words = line.split_whitespace();
        let addr = words.next().unwrap_or_default().to_string();
        assert!(addr.starts_with("127.0.0.1:"), "node address: {line:?}");
        n.addr = addr;
        n.metrics = words.next().map(url_host);
        n.proc = Some(p);
    }

    /// A node that is not part of the grid's four, not started yet.
    pub fn new_node(&self, name: &str, site: &str) -> Node {
        Node {
            name: name.into(),
            site: site.into(),
            root: self.path().join("nodes").join(name),
            addr: String::new(),
            metrics: None,
            proc: None,
        }
    }

    /// The body of `GET path` from the dashboard (plain HTTP/1.0, no authentication).
    pub fn http_get(&self, path: &str) -> String {
        super::http_get(&self.meta_http, path)
    }

    /// `haul cert issue ARGS` in the grid's PKI directory; returns its stdout.
    pub fn issue(&self, args: &[&str]) -> String {
        let mut c = haul_clean();
        c.args(["cert", "issue", "--ca", "ca"])
            .args(args)
            .current_dir(self.path().join("pki"));
        let out = run_bounded(c, CMD_TIMEOUT);
        assert_ok(&out);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn node(&self, name: &str) -> &Node {
        self.nodes.iter().find(|n| n.name == name).unwrap()
    }

    pub fn kill_node(&mut self, name: &str) {
        let n = self.nodes.iter_mut().find(|n| n.name == name).unwrap();
        n.proc.take().expect("node running").kill();
    }

    /// Node `name` (killed first if it runs) started again on its store, with `env` (e.g.
    /// injected faults), at a new address; it keeps its place in [`Self::nodes`].
    pub fn restart_node_env(&mut self, name: &str, env: &[(&str, &str)]) {
        let at = self.nodes.iter().position(|n| n.name == name).unwrap();
        let mut n = self.nodes.remove(at);
        if let Some(mut p) = n.proc.take() {
            p.kill();
        }
        let cert = n.name.clone();
        self.start_node_env(&mut n, &cert, &[], env);
        self.nodes.insert(at, n);
    }

    pub fn kill_meta(&mut self) {
        self.meta.take().expect("meta running").kill();
    }

    /// All server logs, for failure messages.
    pub fn logs(&self) -> String {
        let mut s = String::new();
        for e in std::fs::read_dir(self.path()).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "log") {
                s += &format!(
                    "==== {}\n{}",
                    p.display(),
                    std::fs::read_to_string(&p).unwrap_or_default()
                );
            }
        }
        s
    }

    /// `haul://127.0.0.1:PORT/path`
    pub fn url(&self, path: &str) -> String {
        format!("haul://{}/{}", self.meta_addr, path.trim_start_matches('/'))
    }

    /// A client command as `user`, with `HAUL_META` set so grid paths can be written `/path`.
    pub fn cmd(&self, user: &str, args: &[&str]) -> Command {
        let mut c = haul_clean();
        self.pki.as_user(&mut c, user);
        c.env("HAUL_META", format!("haul://{}", self.meta_addr))
            .current_dir(self.path())
            .args(args);
        c
    }

    pub fn run(&self, user: &str, args: &[&str]) -> Output {
        run_bounded(self.cmd(user, args), CMD_TIMEOUT)
    }

    /// Runs as `user`, asserts success, returns the output.
    #[track_caller]
    pub fn ok(&self, user: &str, args: &[&str]) -> Output {
        let out = self.run(user, args);
        assert_ok(&out);
        out
    }

    /// `haul cp --json --progress never ARGS` as `user`.
    pub fn cp(&self, user: &str, args: &[&str]) -> Output {
        let mut a = vec!["cp", "--json", "--progress", "never"];
        a.extend_from_slice(args);
        self.run(user, &a)
    }

    /// Whole JSON document on stdout of a successful command.
    #[track_caller]
    pub fn json(&self, user: &str, args: &[&str]) -> Value {
        let out = self.ok(user, args);
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "no JSON from {args:?} ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }

    pub fn nodes_json(&self) -> Vec<Value> {
        self.try_nodes_json().unwrap_or_default()
    }

    /// `haul nodes --json`, or why it failed.
    pub fn try_nodes_json(&self) -> Result<Vec<Value>, String> {
        let out = self.run("alice", &["nodes", "--json"]);
        if !out.status.success() {
            return Err(format!(
                "haul nodes: exit {:?}: {}",
                out.status.code(),
                stderr(&out)
            ));
        }
        serde_json::from_slice::<Value>(&out.stdout)
            .ok()
            .and_then(|v| v["nodes"].as_array().cloned())
            .ok_or_else(|| {
                format!(
                    "haul nodes: not a JSON list: {}",
                    String::from_utf8_lossy(&out.stdout)
                )
            })
    }

    /// Waits until every running node is registered and up, with a heartbeat at or after
    /// `since_ms` (milliseconds since the epoch; 0 for any).
    pub fn wait_nodes_up(&self, since_ms: u64) {
        let running: Vec<&str> = self
            .nodes
            .iter()
            .filter(|n| n.proc.is_some())
            .map(|n| n.name.as_str())
            .collect();
        let mut last_error = String::new();
        let ok = wait_for(SETTLE, || {
            let list = match self.try_nodes_json() {
                Ok(l) => l,
                Err(e) => {
                    last_error = e;
                    Vec::new()
                }
            };
            let r = running.iter().all(|name| {
                list.iter().any(|n| {
                    n["name"] == *name
                        && n["up"] == true
                        && n["heartbeat_ms"].as_u64().unwrap_or(0) >= since_ms
                })
            });
            if !r {
                std::thread::sleep(Duration::from_millis(200));
            }
            r
        });
        assert!(
            ok,
            "nodes {running:?} not all up: {:?} (last error: {last_error})\n{}",
            self.nodes_json(),
            self.logs()
        );
    }

    /// Waits until the metadata server considers `name` down.
    pub fn wait_node_down(&self, name: &str) {
        let ok = wait_for(SETTLE, || {
            let r = self
                .nodes_json()
                .iter()
                .any(|n| n["name"] == name && n["up"] == false);
            if !r {
                std::thread::sleep(Duration::from_millis(200));
            }
            r
        });
        assert!(ok, "node {name} never marked down: {:?}", self.nodes_json());
    }

    /// `haul where --json PATHS`: one object per file.
    pub fn where_(&self, paths: &[String]) -> Vec<Value> {
        let mut args = vec!["where", "--json"];
        args.extend(paths.iter().map(String::as_str));
        let v = self.json("alice", &args);
        v["files"]
            .as_array()
            .cloned()
            .expect("where --json gives its files")
    }

    /// The catalog id of a grid file.
    pub fn file_id(&self, path: &str) -> u64 {
        let v = self.json("alice", &["stat", "--json", path]);
        v["entries"][0]["id"].as_u64().expect("id")
    }

    /// Each replica of `path` as (node, state), from `haul where --json`.
    pub fn replica_states(&self, path: &str) -> Vec<(String, String)> {
        let w = self.where_(&[path.to_string()]);
        w[0]["replicas"]
            .as_array()
            .expect("replicas")
            .iter()
            .map(|r| {
                (
                    r["node"].as_str().unwrap().to_string(),
                    r["state"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }

    /// Damages `path`'s replica on `node` on disk, keeping its size (16 bytes flipped at 1 MB).
    pub fn damage_replica(&self, node: &str, path: &str) {
        let file = self.replica_file(node, path);
        let mut bytes = std::fs::read(&file).unwrap();
        for b in &mut bytes[1_000_000..1_000_016] {
            *b = !*b;
        }
        std::fs::write(&file, &bytes).unwrap();
    }

    /// The file holding `path`'s replica on node `node` (named by its id in hex).
    pub fn replica_file(&self, node: &str, path: &str) -> PathBuf {
        let name = format!("{:016x}", self.file_id(path));
        let root = &self.node(node).root;
        let found: Vec<PathBuf> = walk(root)
            .into_iter()
            .filter(|p| p.is_file() && p.file_name().unwrap().to_string_lossy() == name)
            .collect();
        assert_eq!(
            found.len(),
            1,
            "replica {name} of {path} on {node}: {found:?} in {:?}",
            walk(root)
        );
        found.into_iter().next().unwrap()
    }
}

impl Drop for Grid {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            if let Some(mut p) = n.proc.take() {
                p.kill();
            }
        }
        if let Some(mut p) = self.meta.take() {
            p.kill();
        }
    }
}

/// The local account `haul run` tests run tasks as (the grid user `runner` maps to it): an
/// ordinary account, as tasks never run as system accounts such as `nobody`.
pub const TASK_ACCOUNT: &str = "haulrun";

/// Makes sure [`TASK_ACCOUNT`] exists on this machine (creating it needs root) and returns
/// its uid, or `None` when it cannot be had.
pub fn ensure_task_account() -> Option<u32> {
    harness::pki::ensure_account(TASK_ACCOUNT)
}

/// CA, host certificates for the metadata server and each node (name and 127.0.0.1), users
/// alice, bob, mallory, runner (mapped to the local account [`TASK_ACCOUNT`]) and sysacct
/// (mapped to the system account `daemon`), the group atlas, and the enrolment file
/// `enrolled-nodes` listing each node with its certificate's fingerprint.
pub fn make_pki(dir: &Path) -> harness::pki::Pki {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let spec = harness::pki::PkiSpec {
        meta_hosts: s(&["127.0.0.1", "localhost"]),
        nodes: NODES
            .iter()
            .map(|(name, _)| (name.to_string(), s(&["127.0.0.1"])))
            .collect(),
        users: s(&["alice", "bob", "mallory", "runner", "sysacct"]),
        mapfile: [
            ("alice", "alice"),
            ("bob", "bob"),
            ("runner", TASK_ACCOUNT),
            ("sysacct", "daemon"),
        ]
        .iter()
        .map(|(u, a)| (u.to_string(), a.to_string()))
        .collect(),
        groups: vec![("atlas".into(), s(&["alice", "bob"]))],
    };
    harness::pki::Pki::create(dir, &spec, &haul_clean).unwrap_or_else(|e| panic!("{e}"))
}

/// `host:port` of a URL `http://host:port/...`.
pub fn url_host(url: &str) -> String {
    let rest = url.strip_prefix("http://").unwrap_or(url);
    rest.split('/').next().unwrap_or_default().to_string()
}

/// The enrolment line (`NAME sha256:...`) that `haul cert issue --host` printed.
pub fn enrolment_line(issue_output: &str) -> String {
    harness::pki::enrolment_line(issue_output)
        .unwrap_or_else(|| panic!("no enrolment line in {issue_output:?}"))
}

// ---------------------------------------------------------------------------------------------
// Data and checks

/// A small tree `DIR/tree`: files of different sizes, an empty file, nested directories.
/// Returns its path and the relative paths of its files with their sizes.
pub fn sample_tree(dir: &Path) -> (PathBuf, Vec<(&'static str, usize)>) {
    let root = dir.join("src").join("tree");
    let files = vec![
        ("big.bin", 3 * (1 << 20) + 17),
        ("small.txt", 1000),
        ("empty", 0),
        ("sub/one.txt", 1),
        ("sub/deep/mid.bin", 200_000),
    ];
    for (i, (rel, len)) in files.iter().enumerate() {
        write_file(&root.join(rel), 100 + i as u64, *len);
    }
    (root, files)
}

/// Puts the local tree `src` into the grid as `runner`, below `/r`, at site A, and
/// replicates it to site B (2 copies): every file with data on nodes of both sites.
pub fn runner_tree_at_both_sites(g: &Grid, src: &Path) {
    g.ok("runner", &["mkdir", "/r"]);
    assert_ok(&g.cp(
        "runner",
        &["-r", src.to_str().unwrap(), &g.url("/r"), "--site", "A"],
    ));
    g.ok(
        "runner",
        &[
            "replicate",
            "-r",
            "--copies",
            "2",
            "--site",
            "B",
            "--progress",
            "never",
            "/r",
        ],
    );
}

/// Grid paths of the non-empty files (those that have replicas) below grid dir `base`.
pub fn grid_files(base: &str, files: &[(&str, usize)]) -> Vec<String> {
    files
        .iter()
        .filter(|(_, len)| *len > 0)
        .map(|(rel, _)| format!("{base}/{rel}"))
        .collect()
}

/// Complete replicas on live nodes, leaving out the nodes in `dead`: (node, site).
pub fn live_complete(file: &Value, dead: &[&str]) -> Vec<(String, String)> {
    file["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| {
            r["state"] == "complete"
                && r["node_up"] == true
                && !dead.contains(&r["node"].as_str().unwrap())
        })
        .map(|r| {
            (
                r["node"].as_str().unwrap().to_string(),
                r["site"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Every file has exactly `n` complete replicas on distinct live nodes (not in `dead`).
pub fn all_have(files: &[Value], n: usize, dead: &[&str]) -> bool {
    files.iter().all(|f| {
        let mut nodes: Vec<String> = live_complete(f, dead).into_iter().map(|r| r.0).collect();
        nodes.sort();
        nodes.dedup();
        nodes.len() == n && live_complete(f, dead).len() == n
    })
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Uploads the sample tree as alice into `/alice/tree` at site A; returns the local tree, its
/// files, and the grid paths of its non-empty files.
pub fn upload_sample(g: &Grid) -> (PathBuf, Vec<(&'static str, usize)>, Vec<String>) {
    let (src, files) = sample_tree(g.path());
    g.ok("alice", &["mkdir", "/alice"]);
    let out = g.cp(
        "alice",
        &["-r", src.to_str().unwrap(), &g.url("/alice"), "--site", "A"],
    );
    assert_ok(&out);
    let j = json(&out);
    assert_eq!(j["files"], files.len(), "{j}");
    assert_eq!(j["files_failed"], 0, "{j}");
    let paths = grid_files("/alice/tree", &files);
    (src, files, paths)
}

/// Downloads grid dir `path` into a new local dir and checks it equals `src`.
#[track_caller]
pub fn assert_download_same(g: &Grid, user: &str, path: &str, src: &Path, extra: &[&str]) {
    let dl = tempfile::tempdir_in(g.path()).unwrap();
    let mut args = vec!["-r", path, dl.path().to_str().unwrap()];
    args.extend_from_slice(extra);
    let out = g.cp(user, &args);
    assert_ok(&out);
    assert_eq!(json(&out)["files_failed"], 0);
    let name = path.rsplit('/').next().unwrap();
    assert_same_tree(src, &dl.path().join(name));
    assert!(partials(dl.path()).is_empty(), "{:?}", partials(dl.path()));
}

/// A standalone endpoint for `runner` (mapped to the local account [`TASK_ACCOUNT`]) on
/// `listen`, serving `root` with the grid's CA.
pub fn runner_endpoint(g: &Grid, root: &Path, listen: &str) -> Endpoint {
    let mapfile = g.path().join("endpoint-mapfile");
    std::fs::write(
        &mapfile,
        format!(
            "\"{}\" {TASK_ACCOUNT}\n",
            harness::pki::user_subject("runner")
        ),
    )
    .unwrap();
    let (cert, key, ca) = (g.pki("meta.pem"), g.pki("meta.key"), g.pki("ca/ca.pem"));
    super::serve_on(
        listen,
        root,
        &[
            "--cert",
            cert.to_str().unwrap(),
            "--key",
            key.to_str().unwrap(),
            "--ca",
            ca.to_str().unwrap(),
            "--mapfile",
            mapfile.to_str().unwrap(),
        ],
        &[],
    )
}
