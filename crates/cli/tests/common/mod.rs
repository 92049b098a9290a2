//! Helpers for tests that run the real `haul` binary: endpoints on loopback (port 0), a small
//! PKI, deterministic test data, and assertions on outputs.
#![allow(dead_code)]

pub mod grid;

/// First line of a test that injects faults through `HAUL_FAULT_*`: those hooks exist only in a
/// `haul` built with the `fault-injection` feature (scripts/test.sh builds the tests with it);
/// without it the test is reported as skipped, never run against hooks that are not there.
#[allow(unused_macros)]
macro_rules! needs_fault_injection {
    () => {
        if !cfg!(feature = "fault-injection") {
            testkit::skip!(
                "haul was built without the fault-injection feature (run the tests with \
                 `cargo test --features haul/fault-injection`, as scripts/test.sh does)"
            );
        }
    };
}
#[allow(unused_imports)]
pub(crate) use needs_fault_injection;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub fn haul() -> Command {
    haul_env(Command::new(env!("CARGO_BIN_EXE_haul")))
}

/// `c` (the `haul` binary, e.g. as a netlab host's command) with the tests' environment: no
/// credentials or map file inherited from the caller, warnings only.
pub fn haul_env(mut c: Command) -> Command {
    c.env_remove("HAUL_CERT")
        .env_remove("HAUL_KEY")
        .env_remove("HAUL_CA")
        .env_remove("HAUL_MAPFILE");
    c.env("HAUL_LOG", "warn");
    c
}

/// A running endpoint; killed when dropped.
pub struct Endpoint {
    pub child: Child,
    pub addr: String,
    /// `host:port` of its `/metrics`, when started with `--metrics`.
    pub metrics: Option<String>,
    pub root: PathBuf,
}

impl Endpoint {
    /// `haul://127.0.0.1:PORT/path`
    pub fn url(&self, path: &str) -> String {
        format!("haul://{}/{}", self.addr, path.trim_start_matches('/'))
    }

    /// URL with `localhost` (for TLS name checks).
    pub fn tls_url(&self, path: &str) -> String {
        format!(
            "haul://{}/{}",
            self.addr.replace("127.0.0.1", "localhost"),
            path.trim_start_matches('/')
        )
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The response to `request` (HTTP/1.0: the server closes after it) from the plain-HTTP
/// server at `addr`: its status code and body; status 0 and the error when it cannot connect.
pub fn http_request(addr: &str, request: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut c = match std::net::TcpStream::connect(addr) {
        Ok(c) => c,
        Err(e) => return (0, format!("cannot connect to {addr}: {e}")),
    };
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    c.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = c.read_to_string(&mut out);
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// The body of `GET path` from the plain-HTTP server at `addr`.
pub fn http_get(addr: &str, path: &str) -> String {
    let (status, body) = http_request(
        addr,
        &format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n"),
    );
    assert_eq!(status, 200, "GET http://{addr}{path}: {body}");
    body
}

/// Checks an exposition with `promtool check metrics` (Debian's `prometheus`), the parser
/// and linter Prometheus itself uses: Ok(false) when promtool is not installed.
pub fn promtool_check(text: &str) -> Result<bool, String> {
    use std::io::Write;
    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(format!("promtool: {e}")),
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // promtool exits 0 with lint findings printed, 1 with lint findings, 3 on a parse error.
    if out.status.success() && said.trim().is_empty() {
        Ok(true)
    } else {
        Err(format!(
            "promtool check metrics: {:?}: {said}\n{text}",
            out.status.code()
        ))
    }
}

/// The value of the series `series` (`name{labels}` exactly as written) in an exposition.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// Starts `haul serve` on an ephemeral loopback port.
pub fn serve(root: &Path, args: &[&str], env: &[(&str, &str)]) -> Endpoint {
    serve_on("127.0.0.1:0", root, args, env)
}

/// Starts `haul serve` listening on `listen` (e.g. the address of an endpoint that was
/// killed, to restart it where its clients look for it).
pub fn serve_on(listen: &str, root: &Path, args: &[&str], env: &[(&str, &str)]) -> Endpoint {
    serve_with(haul(), listen, root, args, env)
}

/// Starts `haul serve` from `cmd` (see [`haul_env`]; e.g. inside a netlab host).
pub fn serve_with(
    cmd: Command,
    listen: &str,
    root: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> Endpoint {
    serve_logging(cmd, listen, root, args, env, Stdio::inherit())
}

/// [`serve_with`], the endpoint's log (stderr) going to `log`.
pub fn serve_logging(
    mut cmd: Command,
    listen: &str,
    root: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    log: impl Into<Stdio>,
) -> Endpoint {
    std::fs::create_dir_all(root).unwrap();
    cmd.args(["serve", "--listen", listen, "--print-addr", "--root"])
        .arg(root)
        .args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("spawn haul serve");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .expect("read address");
    // "ADDR" or, with --metrics, "ADDR http://METRICS/metrics"
    let mut words = line.split_whitespace();
    let addr = words.next().unwrap_or_default().to_string();
    assert!(addr.contains(':'), "endpoint did not start: {line:?}");
    Endpoint {
        child,
        addr,
        metrics: words.next().map(grid::url_host),
        root: root.to_path_buf(),
    }
}

/// An insecure endpoint (no TLS), for tests not about security.
pub fn serve_insecure(root: &Path) -> Endpoint {
    serve(root, &["--insecure"], &[])
}

pub fn serve_insecure_env(root: &Path, env: &[(&str, &str)]) -> Endpoint {
    serve(root, &["--insecure"], env)
}

/// `haul cp --insecure --json ... SRC DST`, returns the output.
pub fn cp(args: &[&str]) -> Output {
    cp_env(args, &[])
}

pub fn cp_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    cp_with(haul(), args, env)
}

/// `haul cp --insecure --json ...` from `cmd` (see [`haul_env`]; e.g. inside a netlab host).
pub fn cp_with(mut cmd: Command, args: &[&str], env: &[(&str, &str)]) -> Output {
    cmd.args(["cp", "--insecure", "--json", "--progress", "never"])
        .args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run haul cp")
}

pub fn json(out: &Output) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or("");
    serde_json::from_str(line).unwrap_or_else(|e| {
        panic!(
            "no JSON on stdout ({e}): stdout={stdout:?} stderr={}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[track_caller]
pub fn assert_ok(out: &Output) {
    assert!(
        out.status.success(),
        "haul failed ({:?}): stdout={} stderr={}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        stderr(out)
    );
}

/// What a failed `--json` command says failed, with the kind asked and the process's own exit
/// code: its last stdout line, `{"kind", "exit_code", "message"}`, or, for a copy that ended
/// with failed files, the first of its `failures` (`{"path", "kind", "exit_code", "message"}`).
#[track_caller]
pub fn assert_kind(out: &Output, kind: &str) {
    let j = json(out);
    let failed = match j["failures"].as_array().and_then(|f| f.first()) {
        Some(first) => first.clone(),
        None => j.clone(),
    };
    assert_eq!(failed["kind"], kind, "{j}");
    let code = out.status.code().map(i64::from);
    assert_eq!(failed["exit_code"].as_i64(), code, "{j}");
    assert!(!failed["message"].as_str().unwrap_or("").is_empty(), "{j}");
}

#[track_caller]
pub fn assert_exit(out: &Output, code: i32, needle: &str) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout={} stderr={}",
        String::from_utf8_lossy(&out.stdout),
        stderr(out)
    );
    let err = stderr(out);
    assert!(err.contains(needle), "stderr lacks {needle:?}: {err}");
    let error_lines: Vec<_> = err
        .lines()
        .filter(|l| l.starts_with("haul: error:"))
        .collect();
    assert_eq!(
        error_lines.len(),
        1,
        "exactly one error line expected: {err}"
    );
}

/// Deterministic pseudo-random bytes.
pub fn data(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

pub fn write_file(path: &Path, seed: u64, len: usize) -> Vec<u8> {
    if let Some(p) = path.parent() {
        std::fs::create_dir_all(p).unwrap();
    }
    let d = data(seed, len);
    std::fs::write(path, &d).unwrap();
    d
}

#[track_caller]
pub fn assert_same_file(a: &Path, b: &Path) {
    let (x, y) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
    assert_eq!(x.len(), y.len(), "{} vs {}", a.display(), b.display());
    assert!(x == y, "{} and {} differ", a.display(), b.display());
}

/// Every file below `a` exists below `b` with the same content, and vice versa; no partial
/// files are left in `b`.
#[track_caller]
pub fn assert_same_tree(a: &Path, b: &Path) {
    let list = |root: &Path| {
        let mut v: Vec<PathBuf> = walk(root)
            .into_iter()
            .map(|p| p.strip_prefix(root).unwrap().to_path_buf())
            .collect();
        v.sort();
        v
    };
    let (la, lb) = (list(a), list(b));
    assert_eq!(la, lb, "trees differ");
    for rel in la {
        let (pa, pb) = (a.join(&rel), b.join(&rel));
        if pa.is_file() {
            assert_same_file(&pa, &pb);
        } else {
            assert!(pb.is_dir());
        }
    }
}

pub fn walk(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            out.push(p.clone());
            if p.is_dir() {
                stack.push(p);
            }
        }
    }
    out
}

/// Names of leftover temporary files (`.*.haul-part`, `.*.haul-ledger` and the ledger's
/// `.haul-ledger.tmp`) below `root`.
pub fn partials(root: &Path) -> Vec<PathBuf> {
    walk(root)
        .into_iter()
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.ends_with(".haul-part")
                || n.ends_with(".haul-ledger")
                || n.ends_with(".haul-ledger.tmp")
        })
        .collect()
}

/// A CA, a host certificate for localhost/127.0.0.1, user certificates and a mapfile.
pub struct Pki {
    pub dir: PathBuf,
}

impl Pki {
    pub fn new(dir: &Path) -> Self {
        let run = |args: &[&str]| {
            let out = haul().args(args).current_dir(dir).output().unwrap();
            assert_ok(&out);
        };
        std::fs::create_dir_all(dir).unwrap();
        run(&["ca", "init", "--dir", "ca"]);
        run(&[
            "cert",
            "issue",
            "--ca",
            "ca",
            "--host",
            "localhost",
            "--host",
            "127.0.0.1",
            "--out",
            "host",
        ]);
        run(&[
            "cert", "issue", "--ca", "ca", "--user", "alice", "--out", "alice",
        ]);
        run(&[
            "cert", "issue", "--ca", "ca", "--user", "mallory", "--out", "mallory",
        ]);
        run(&[
            "cert",
            "issue",
            "--ca",
            "ca",
            "--user",
            "old",
            "--out",
            "old",
            "--not-before",
            "2020-01-01T00:00:00Z",
            "--not-after",
            "2021-01-01T00:00:00Z",
        ]);
        run(&["ca", "init", "--dir", "otherca"]);
        run(&[
            "cert", "issue", "--ca", "otherca", "--user", "alice", "--out", "forged",
        ]);
        std::fs::write(
            dir.join("mapfile"),
            "\"/O=longhaul/OU=users/CN=alice\" root\n\"/O=longhaul/OU=users/CN=old\" root\n",
        )
        .unwrap();
        Self {
            dir: dir.to_path_buf(),
        }
    }

    pub fn p(&self, name: &str) -> String {
        self.dir.join(name).to_string_lossy().into_owned()
    }

    /// Arguments for `haul serve` with TLS.
    pub fn serve_args(&self) -> Vec<String> {
        vec![
            "--cert".into(),
            self.p("host.pem"),
            "--key".into(),
            self.p("host.key"),
            "--ca".into(),
            self.p("ca/ca.pem"),
            "--mapfile".into(),
            self.p("mapfile"),
        ]
    }

    /// `haul serve` with TLS on loopback, exporting `root`.
    pub fn serve(&self, root: &Path) -> Endpoint {
        let args = self.serve_args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        serve(root, &args, &[])
    }

    /// `haul cp --json` with a user's certificate.
    pub fn cp(&self, user: &str, args: &[&str]) -> Output {
        self.cp_ca(user, "ca/ca.pem", args)
    }

    pub fn cp_ca(&self, user: &str, ca: &str, args: &[&str]) -> Output {
        haul()
            .args([
                "cp",
                "--json",
                "--progress",
                "never",
                "--cert",
                &self.p(&format!("{user}.pem")),
                "--key",
            ])
            .arg(self.p(&format!("{user}.key")))
            .args(["--ca", &self.p(ca)])
            .args(args)
            .output()
            .unwrap()
    }
}

/// Waits until `cond` holds or `timeout` passes.
pub fn wait_for(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    while t.elapsed() < timeout {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// A small tmpfs mounted for a test (needs root); unmounted when dropped.
pub struct SmallFs {
    pub path: PathBuf,
}

impl SmallFs {
    pub fn mount(path: &Path, size: &str) -> Option<Self> {
        std::fs::create_dir_all(path).ok()?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(path)
            .status()
            .ok()?
            .success();
        ok.then(|| Self {
            path: path.to_path_buf(),
        })
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.path).status();
    }
}
