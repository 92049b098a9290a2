//! The processes of a benchmark in a netlab lab: bounded commands with their logs, and a grid
//! (a metadata server in host a0, a storage node in every host, a CA and certificates, the
//! nodes enrolled). Shared by `haul-replbench` and `haul-faultbench` (included with `#[path]`,
//! as the bench's binaries share `data.rs`).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use harness::pki::{Pki, PkiSpec};
use serde_json::Value;

pub const META_PORT: u16 = 5811;
pub const NODE_PORT: u16 = 5812;

pub use harness::process::{Outcome, Proc};

/// Runs `cmd` to its end or `limit`, whichever comes first (then kills it); what it printed
/// is returned and kept in `<log>.out` / `<log>.err`.
pub fn run_bounded(cmd: Command, limit: Duration, log: &Path) -> Result<Outcome> {
    let what = format!("{:?}", cmd.get_program());
    let o =
        harness::process::run_bounded(cmd, limit).with_context(|| format!("starting {what}"))?;
    fs::write(log.with_extension("out"), &o.stdout)?;
    fs::write(log.with_extension("err"), &o.stderr)?;
    Ok(o)
}

/// The grid: a metadata server in a0 and one storage node per host.
pub struct Grid<'a> {
    pub dir: PathBuf,
    pub haul: PathBuf,
    pub lab: &'a netlab::Lab,
    pub meta_url: String,
    pub procs: Vec<Proc>,
    pub pki: Pki,
}

/// The grid's PKI in `dir`: the metadata server's certificate for a0's address, one host
/// certificate per lab host (its name and address; every host is enrolled as a node), and
/// the user `bench` mapped to the local account `bench`.
pub fn pki(dir: &Path, haul: &Path, lab: &netlab::Lab) -> Result<Pki> {
    let spec = PkiSpec {
        meta_hosts: vec!["meta".into(), lab.host("a", 0).addr().to_string()],
        nodes: lab
            .hosts()
            .iter()
            .map(|h| (h.name().to_string(), vec![h.addr().to_string()]))
            .collect(),
        users: vec!["bench".into()],
        mapfile: vec![("bench".into(), "bench".into())],
        groups: vec![],
    };
    Pki::create(dir, &spec, &|| Command::new(haul)).map_err(|e| anyhow!(e))
}

impl<'a> Grid<'a> {
    pub fn start(dir: &Path, haul: &Path, lab: &'a netlab::Lab) -> Result<Grid<'a>> {
        Self::start_with(dir, haul, lab, &[])
    }

    /// [`Self::start`], with `meta_args` added to the metadata server's command line.
    pub fn start_with(
        dir: &Path,
        haul: &Path,
        lab: &'a netlab::Lab,
        meta_args: &[&str],
    ) -> Result<Grid<'a>> {
        fs::create_dir_all(dir)?;
        let pki = pki(dir, haul, lab)?;
        let a0 = lab.host("a", 0);
        let mut cmd = a0.command(haul);
        harness::daemons::meta_serve(
            &mut cmd,
            &pki,
            &format!("{}:{META_PORT}", a0.addr()),
            &dir.join("meta-data"),
        );
        cmd.args(["--http", "off"]).args(meta_args).current_dir(dir);
        let (meta, addr) = Proc::start(cmd, &dir.join("meta.log"), Duration::from_secs(60))
            .map_err(|e| anyhow!(e))?;
        let mut g = Grid {
            dir: dir.to_path_buf(),
            haul: haul.to_path_buf(),
            lab,
            meta_url: format!(
                "haul://{}",
                addr.split_whitespace().next().unwrap_or_default()
            ),
            procs: vec![meta],
            pki,
        };
        for h in lab.hosts() {
            let node = g.start_node(h)?;
            g.procs.push(node);
        }
        g.wait_nodes(lab.hosts().len())?;
        Ok(g)
    }

    /// Starts (or starts again) the storage node of host `h`: site the host's site, data in
    /// `DIR/nodes/NAME`, log appended to `DIR/NAME.log`.
    pub fn start_node(&self, h: &netlab::Host) -> Result<Proc> {
        let root = self.dir.join("nodes").join(h.name());
        fs::create_dir_all(&root)?;
        let mut cmd = h.command(&self.haul);
        harness::daemons::node_serve(
            &mut cmd,
            &self.pki,
            (h.name(), &h.site().to_uppercase()),
            &self.meta_url,
            &root,
            &format!("{}:{NODE_PORT}", h.addr()),
        );
        let log = self.dir.join(format!("{}.log", h.name()));
        let child = cmd
            .args(["--capacity", "50G"])
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&log)?,
            )
            .spawn()
            .with_context(|| format!("starting node {}", h.name()))?;
        Ok(Proc::adopt(child, &log))
    }

    pub fn wait_nodes(&self, want: usize) -> Result<()> {
        let t = Instant::now();
        let mut last = String::new();
        while t.elapsed() < Duration::from_secs(60) {
            match self.json(&["nodes", "--json"], Duration::from_secs(20)) {
                Ok(v) => {
                    let up = v["nodes"]
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
            .env("HAUL_META", &self.meta_url);
        self.pki.as_user(&mut c, "bench");
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
        serde_json::from_slice(&o.stdout).with_context(|| format!("haul {args:?}: not JSON"))
    }
}

/// The last JSON object a command printed on stdout.
pub fn last_json(s: &str) -> Value {
    s.lines()
        .rev()
        .find_map(|l| serde_json::from_str::<Value>(l).ok())
        .unwrap_or(Value::Null)
}
