//! The processes of a benchmark in a netlab lab: bounded commands with their logs, and a grid
//! (a metadata server in host a0, a storage node in every host, a CA and certificates, the
//! nodes enrolled). Shared by `haul-replbench` and `haul-faultbench` (included with `#[path]`,
//! as the bench's binaries share `data.rs`).

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::Value;

pub const META_PORT: u16 = 5811;
pub const NODE_PORT: u16 = 5812;

/// A child process killed on drop.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// How a bounded command ended.
pub struct Outcome {
    pub code: Option<i32>,
    pub timed_out: bool,
    pub secs: f64,
    pub stdout: String,
    pub stderr: String,
}

impl Outcome {
    pub fn ok(&self) -> bool {
        !self.timed_out && self.code == Some(0)
    }
    pub fn why(&self) -> String {
        let tail: Vec<&str> = self.stderr.lines().rev().take(6).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        if self.timed_out {
            format!("killed at the time limit after {:.0} s", self.secs)
        } else {
            format!("exit {:?}: {}", self.code, tail.join(" | "))
        }
    }
}

/// Runs `cmd` to its end or `limit`, whichever comes first (then kills it); stdout and stderr
/// go to `<log>.out` / `<log>.err` and are returned.
pub fn run_bounded(mut cmd: Command, limit: Duration, log: &Path) -> Result<Outcome> {
    let out_p = log.with_extension("out");
    let err_p = log.with_extension("err");
    cmd.stdin(Stdio::null())
        .stdout(fs::File::create(&out_p)?)
        .stderr(fs::File::create(&err_p)?);
    let t = Instant::now();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {:?}", cmd.get_program()))?;
    let (code, timed_out) = loop {
        if let Some(st) = child.try_wait()? {
            break (st.code(), false);
        }
        if t.elapsed() >= limit {
            let _ = child.kill();
            let _ = child.wait();
            break (None, true);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let secs = t.elapsed().as_secs_f64();
    Ok(Outcome {
        code,
        timed_out,
        secs,
        stdout: fs::read_to_string(&out_p).unwrap_or_default(),
        stderr: fs::read_to_string(&err_p).unwrap_or_default(),
    })
}

/// The grid: a metadata server in a0 and one storage node per host.
pub struct Grid<'a> {
    pub dir: PathBuf,
    pub haul: PathBuf,
    pub lab: &'a netlab::Lab,
    pub meta_url: String,
    pub procs: Vec<Proc>,
}

pub fn pki(dir: &Path, haul: &Path, lab: &netlab::Lab) -> Result<()> {
    let run = |args: &[String]| -> Result<()> {
        let out = Command::new(haul).args(args).current_dir(dir).output()?;
        if !out.status.success() {
            bail!(
                "haul {args:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    };
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    run(&s(&["ca", "init", "--dir", "ca"]))?;
    let meta_ip = lab.host("a", 0).addr().to_string();
    run(&s(&[
        "cert", "issue", "--ca", "ca", "--out", "meta", "--host", "meta", "--host", &meta_ip,
    ]))?;
    for h in lab.hosts() {
        let ip = h.addr().to_string();
        run(&s(&[
            "cert",
            "issue",
            "--ca",
            "ca",
            "--out",
            h.name(),
            "--host",
            h.name(),
            "--host",
            &ip,
        ]))?;
    }
    run(&s(&[
        "cert", "issue", "--ca", "ca", "--out", "user", "--user", "bench",
    ]))?;
    fs::write(
        dir.join("mapfile"),
        "\"/O=longhaul/OU=users/CN=bench\" bench\n",
    )?;
    // Enrolment: every host may join as a node (by name).
    let names: Vec<String> = lab.hosts().iter().map(|h| h.name().to_string()).collect();
    fs::write(dir.join("enrolled-nodes"), names.join("\n") + "\n")?;
    Ok(())
}

impl<'a> Grid<'a> {
    pub fn start(dir: &Path, haul: &Path, lab: &'a netlab::Lab) -> Result<Grid<'a>> {
        fs::create_dir_all(dir)?;
        pki(dir, haul, lab)?;
        let a0 = lab.host("a", 0);
        let mut cmd = a0.command(haul);
        cmd.args(["meta", "serve", "--listen"])
            .arg(format!("{}:{META_PORT}", a0.addr()))
            .args([
                "--http",
                "off",
                "--data",
                "meta-data",
                "--cert",
                "meta.pem",
                "--key",
                "meta.key",
                "--ca",
                "ca/ca.pem",
                "--mapfile",
                "mapfile",
                "--nodes",
                "enrolled-nodes",
                "--print-addr",
            ])
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(fs::File::create(dir.join("meta.log"))?);
        let mut child = cmd.spawn().context("starting haul meta serve")?;
        let stdout = child.stdout.take().expect("piped");
        let mut g = Grid {
            dir: dir.to_path_buf(),
            haul: haul.to_path_buf(),
            lab,
            meta_url: String::new(),
            procs: vec![Proc(child)],
        };
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let addr = line
            .split_whitespace()
            .next()
            .ok_or_else(|| anyhow!("meta printed no address (see {}/meta.log)", dir.display()))?;
        g.meta_url = format!("haul://{addr}");
        // Keep reading what else meta prints, so that it never writes into a closed pipe.
        let mut rest = fs::File::create(dir.join("meta.out"))?;
        std::thread::spawn(move || std::io::copy(&mut reader, &mut rest));
        for h in lab.hosts() {
            let site = h.site().to_uppercase();
            let root = dir.join("nodes").join(h.name());
            fs::create_dir_all(&root)?;
            let child = h
                .command(haul)
                .args(["node", "serve", "--meta", &g.meta_url, "--site", &site])
                .arg("--root")
                .arg(&root)
                .arg("--listen")
                .arg(format!("{}:{NODE_PORT}", h.addr()))
                .args(["--capacity", "50G", "--cert"])
                .arg(format!("{}.pem", h.name()))
                .arg("--key")
                .arg(format!("{}.key", h.name()))
                .args(["--ca", "ca/ca.pem"])
                .current_dir(dir)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(fs::File::create(dir.join(format!("{}.log", h.name())))?)
                .spawn()
                .with_context(|| format!("starting node {}", h.name()))?;
            g.procs.push(Proc(child));
        }
        g.wait_nodes(lab.hosts().len())?;
        Ok(g)
    }

    pub fn wait_nodes(&self, want: usize) -> Result<()> {
        let t = Instant::now();
        let mut last = String::new();
        while t.elapsed() < Duration::from_secs(60) {
            match self.json(&["nodes", "--json"], Duration::from_secs(20)) {
                Ok(v) => {
                    let up = v
                        .as_array()
                        .map(|a| a.iter().filter(|n| n["up"] == true).count())
                        .unwrap_or(0);
                    if up >= want {
                        return Ok(());
                    }
                    last = format!("{up} of {want} up");
                }
                Err(e) => last = format!("{e:#}"),
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        bail!(
            "nodes did not come up within 60 s ({last}; see {}/*.log)",
            self.dir.display()
        )
    }

    /// A haul CLI command run in host a0 with the user's credentials.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = self.lab.host("a", 0).command(&self.haul);
        c.args(args)
            .current_dir(&self.dir)
            .env("HAUL_CERT", self.dir.join("user.pem"))
            .env("HAUL_KEY", self.dir.join("user.key"))
            .env("HAUL_CA", self.dir.join("ca/ca.pem"))
            .env("HAUL_META", &self.meta_url);
        c
    }

    pub fn run(&self, args: &[&str], limit: Duration, log: &str) -> Result<Outcome> {
        run_bounded(self.cmd(args), limit, &self.dir.join(log))
    }

    pub fn json(&self, args: &[&str], limit: Duration) -> Result<Value> {
        let o = self.run(args, limit, "cli")?;
        if !o.ok() {
            bail!("haul {args:?}: {}", o.why());
        }
        serde_json::from_str(&o.stdout).with_context(|| format!("haul {args:?}: not JSON"))
    }
}

/// The last JSON object a command printed on stdout.
pub fn last_json(s: &str) -> Value {
    s.lines()
        .rev()
        .find_map(|l| serde_json::from_str::<Value>(l).ok())
        .unwrap_or(Value::Null)
}
