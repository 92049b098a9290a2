//! The Gfarm driver of the replication benchmark (`haul-replbench`): a private-mode Gfarm file
//! system set up over a netlab lab (gfmd and its PostgreSQL in a0, a gfsd in every host, a
//! dedicated OS user), the shim its libraries need inside lab hosts, and one measured `gfprep`
//! replication run with its checks. Kept apart from the benchmark so that the comparison's
//! reference set-up can be read (and changed) on its own; see `shared/reference/` for the
//! set-up it follows.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};

use crate::chmod;
use crate::labgrid::{Outcome, run_bounded};

/// The dedicated OS user that owns gfmd, PostgreSQL and the gfsds (private mode; initdb refuses
/// root). Created for the run and removed after it.
const GF_USER: &str = "haulgf";
const GF_MD_PORT: u16 = 10601;
/// PostgreSQL's port: its unix socket lands in the shared /tmp, so not the reference set-up's
/// 10602.
const GF_PG_PORT: u16 = 10612;
const GF_SD_PORT: u16 = 10600;
/// gfprep's parallel copies: each copy is one gfsd-to-gfsd TCP stream pulled by a site B gfsd,
/// and each file costs several 100 ms round trips to gfmd in a0 before and after its data, so
/// 8 (two per destination gfsd, two per source gfsd) keeps the link busy through those waits
/// without piling more processes (gfprep child + a gfsd child on each side per copy) onto the
/// 2 cores. (`--gfprep-j` changes it.)
pub const GFPREP_J: u64 = 8;

/// LD_PRELOAD shim: netlab's TUN interfaces have no link-layer address, so getifaddrs() gives
/// them an entry with ifa_addr NULL, which libgfarm's gfarm_get_ip_addresses() dereferences
/// unchecked: every gf* command and daemon dies with SIGSEGV inside a lab host. The shim gives
/// those entries a dummy AF_UNSPEC address.
const GF_IFADDRS_SHIM: &str = r#"#define _GNU_SOURCE
#include <dlfcn.h>
#include <ifaddrs.h>
#include <stddef.h>
#include <sys/socket.h>
static struct sockaddr unspec = { .sa_family = AF_UNSPEC };
int getifaddrs(struct ifaddrs **ifap) {
    int (*real)(struct ifaddrs **) = (int (*)(struct ifaddrs **))dlsym(RTLD_NEXT, "getifaddrs");
    int r = real(ifap);
    if (r == 0)
        for (struct ifaddrs *p = *ifap; p != NULL; p = p->ifa_next)
            if (p->ifa_addr == NULL) p->ifa_addr = &unspec;
    return r;
}
"#;

/// Gfarm's name of a lab host: a0.sitea ... b3.siteb (`-D siteb` selects site B).
pub fn gf_name(h: &netlab::Host) -> String {
    format!("{}.site{}", h.name(), h.site())
}

/// Pids of the processes whose parent is `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let stat = fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        // pid (comm) state ppid ...: comm may hold spaces, so split after the last ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|x| x.parse::<u32>().ok());
        if ppid == Some(pid) {
            out.push(p);
        }
    }
    out
}

/// Pids of the processes running as `uid`.
fn procs_of_uid(uid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let status = fs::read_to_string(e.path().join("status")).unwrap_or_default();
        let real = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|x| x.parse::<u32>().ok());
        if real == Some(uid) && netlab::running(p) {
            out.push(p);
        }
    }
    out
}

fn pid_file(p: &Path) -> Option<u32> {
    fs::read_to_string(p)
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .filter(|p| *p > 1)
}

/// A private-mode Gfarm file system over the lab: gfmd and PostgreSQL in a0, a gfsd in every
/// host. Everything it started is stopped on drop (gfsd children too) and its user removed.
pub struct Gfarm<'a> {
    pub dir: PathBuf,
    pub run: PathBuf,
    pub lab: &'a netlab::Lab,
    pub hosts: PathBuf,
    pub shim: PathBuf,
    pub uid: Option<u32>,
    pub user_created: bool,
}

impl<'a> Gfarm<'a> {
    /// Why Gfarm cannot run here, if it cannot.
    pub fn missing() -> Option<String> {
        let mut miss = Vec::new();
        for (cmd, pkg) in [
            ("/usr/sbin/gfmd", "gfmd"),
            ("/usr/bin/config-gfarm", "gfmd"),
            ("/usr/sbin/gfsd", "gfsd"),
            ("/usr/bin/config-gfsd", "gfsd"),
            ("/usr/bin/gfprep", "gfarm-client"),
            ("/usr/bin/gfpcopy", "gfarm-client"),
            ("/usr/bin/gfwhere", "gfarm-client"),
        ] {
            if !Path::new(cmd).exists() {
                miss.push(format!("{cmd} (package {pkg})"));
            }
        }
        if Self::postgres().is_none() {
            miss.push("PostgreSQL server (package postgresql)".into());
        }
        for tool in ["cc", "unshare", "runuser", "useradd", "userdel"] {
            let found = ["/usr/bin", "/usr/sbin", "/bin", "/sbin"]
                .iter()
                .any(|d| Path::new(d).join(tool).exists());
            if !found {
                miss.push(tool.to_string());
            }
        }
        if miss.is_empty() {
            None
        } else {
            Some(format!("not installed: {}", miss.join(", ")))
        }
    }

    /// PostgreSQL's directory and major version (/usr/lib/postgresql/<v>, the newest).
    pub fn postgres() -> Option<(PathBuf, String)> {
        let mut v: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .flatten()
            .filter_map(|e| {
                let n = e.file_name().to_str()?.parse::<u32>().ok()?;
                e.path()
                    .join("bin/postgres")
                    .exists()
                    .then(|| (n, e.path()))
            })
            .collect();
        v.sort();
        v.pop().map(|(n, p)| (p, n.to_string()))
    }

    /// A shell command run as the Gfarm user in `host`, in a private mount namespace where
    /// /etc/hosts names the lab hosts (a0.sitea ...), with the getifaddrs shim and `conf` as
    /// the client configuration. Daemons started by it keep that namespace.
    pub fn sh(&self, host: &netlab::Host, conf: &str, script: &str) -> Command {
        let mut c = host.command("unshare");
        c.args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(
                "mount --bind \"$1\" /etc/hosts && exec runuser -u \"$2\" -- env \
                 LD_PRELOAD=\"$3\" HOME=\"$4\" USER=\"$2\" LOGNAME=\"$2\" \
                 GFARM_CONFIG_FILE=\"$5\" PATH=/usr/sbin:/usr/bin:/sbin:/bin sh -c \"$6\"",
            )
            .arg("sh")
            .arg(&self.hosts)
            .arg(GF_USER)
            .arg(&self.shim)
            .arg(self.dir.join("home"))
            .arg(self.run.join("etc").join(conf))
            .arg(script)
            .current_dir(&self.dir);
        c
    }

    /// Runs `script` (bounded by `limit`) and fails with its output when it fails.
    pub fn must(
        &self,
        host: &netlab::Host,
        script: &str,
        limit: Duration,
        log: &str,
    ) -> Result<Outcome> {
        let o = run_bounded(
            self.sh(host, "gfarm2-bench.conf", script),
            limit,
            &self.dir.join(log),
        )?;
        if !o.ok() {
            bail!("{script} (in {}): {}", host.name(), o.why());
        }
        Ok(o)
    }

    pub fn start(dir: &Path, lab: &'a netlab::Lab) -> Result<Gfarm<'a>> {
        if let Some(why) = Self::missing() {
            bail!("{why}");
        }
        let (pg_dir, pg_ver) = Self::postgres().ok_or_else(|| anyhow!("no PostgreSQL"))?;
        let _ = fs::remove_dir_all(dir);
        fs::create_dir_all(dir.join("home"))?;
        let run = dir.join("run");
        fs::create_dir_all(&run)?;
        chmod(dir, 0o755)?;
        let mut g = Gfarm {
            dir: dir.to_path_buf(),
            run: run.clone(),
            lab,
            hosts: dir.join("hosts"),
            shim: dir.join("ifaddrs-shim.so"),
            uid: None,
            user_created: false,
        };
        // The user (left over by an interrupted run: reused, and removed at the end; but left
        // alone, with whatever it runs, when it has processes).
        let uid_of = || -> Option<u32> {
            let o = Command::new("id").args(["-u", GF_USER]).output().ok()?;
            if !o.status.success() {
                return None;
            }
            String::from_utf8_lossy(&o.stdout).trim().parse().ok()
        };
        if let Some(uid) = uid_of() {
            if let Some(p) = procs_of_uid(uid).first() {
                bail!("user {GF_USER} already runs processes (pid {p}): another run in progress?");
            }
            // gfmd and gfsd read the shared key from the home in the password database.
            let st = Command::new("usermod")
                .arg("-d")
                .arg(dir.join("home"))
                .arg(GF_USER)
                .status()?;
            if !st.success() {
                bail!("usermod -d ... {GF_USER} failed");
            }
        } else {
            let st = Command::new("useradd")
                .args(["-M", "-s", "/bin/sh", "-d"])
                .arg(dir.join("home"))
                .arg(GF_USER)
                .status()?;
            if !st.success() {
                bail!("useradd {GF_USER} failed");
            }
        }
        g.user_created = true;
        g.uid = uid_of();
        if g.uid.is_none() {
            bail!("no uid for {GF_USER}");
        }
        for d in [dir.join("home"), run.clone()] {
            let st = Command::new("chown")
                .arg(format!("{GF_USER}:"))
                .arg(&d)
                .status()?;
            if !st.success() {
                bail!("chown {}", d.display());
            }
        }
        // Names every host resolves (in the daemons' and commands' private mount namespaces).
        let mut hosts = String::from("127.0.0.1 localhost\n");
        if let Ok(h) = fs::read_to_string("/proc/sys/kernel/hostname") {
            hosts.push_str(&format!("127.0.1.1 {}\n", h.trim()));
        }
        for h in lab.hosts() {
            hosts.push_str(&format!("{} {} {}\n", h.addr(), gf_name(h), h.name()));
        }
        fs::write(&g.hosts, hosts)?;
        fs::write(dir.join("ifaddrs-shim.c"), GF_IFADDRS_SHIM)?;
        let cc = Command::new("cc")
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&g.shim)
            .arg(dir.join("ifaddrs-shim.c"))
            .arg("-ldl")
            .output()?;
        if !cc.status.success() {
            bail!(
                "cc (getifaddrs shim): {}",
                String::from_utf8_lossy(&cc.stderr).trim()
            );
        }
        chmod(&g.shim, 0o755)?;
        // config-gfarm with PostgreSQL >= 14 writes `password_encryption = true`, which the
        // postmaster refuses; its config_dir is hard-coded, so run a patched copy (NOTES 5.1).
        // Also keep PostgreSQL on loopback instead of '*'.
        let patched = dir.join("patched");
        copy_dir(
            Path::new("/usr/share/gfarm/config"),
            &patched.join("config"),
        )?;
        let pgc = patched.join("config/config-gfarm.postgresql");
        let text = fs::read_to_string(&pgc)?
            .replace("password_encryption = true", "password_encryption = md5")
            .replace("\"'*'\"", "\"'127.0.0.1'\"");
        fs::write(&pgc, text)?;
        let cg = fs::read_to_string("/usr/bin/config-gfarm")?;
        let cg: String = cg
            .lines()
            .map(|l| {
                if l.starts_with("config_dir=") {
                    format!("config_dir=\"{}\"", patched.join("config").display())
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
            + "\n";
        fs::write(patched.join("config-gfarm"), cg)?;
        chmod(&patched.join("config-gfarm"), 0o755)?;
        let st = Command::new("chmod")
            .args(["-R", "a+rX"])
            .arg(&patched)
            .status()?;
        if !st.success() {
            bail!("chmod -R a+rX {}", patched.display());
        }

        let a0 = lab.host("a", 0);
        let etc = run.join("etc");
        let log = run.join("var/log");
        // Metadata server: creates the PostgreSQL cluster, the configs and init scripts, starts
        // PostgreSQL. Its gfmd start fails here: gfmd reaches PostgreSQL at the metadata
        // server's name (a0.sitea), where it does not listen; pointed at 127.0.0.1 below.
        let o = run_bounded(
            g.sh(a0, "gfarm2.conf", &format!(
                "{} --prefix {} -S -h {} -m {GF_MD_PORT} -p {GF_PG_PORT} -A {GF_USER} -P {} -V {pg_ver} -d md5",
                patched.join("config-gfarm").display(),
                run.display(),
                gf_name(a0),
                pg_dir.display(),
            )),
            Duration::from_secs(120),
            &dir.join("config-gfarm"),
        )?;
        if !etc.join("gfmd.conf").exists() || !etc.join("init.d/gfmd").exists() {
            bail!("config-gfarm: {}", o.why());
        }
        let conf = fs::read_to_string(etc.join("gfmd.conf"))?;
        let conf: String = conf
            .lines()
            .map(|l| {
                if l.starts_with("postgresql_server_host ") {
                    "postgresql_server_host 127.0.0.1".to_string()
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
            + "\n";
        fs::write(etc.join("gfmd.conf"), conf)?;
        fs::create_dir_all(&log)?;
        let st = Command::new("chown")
            .arg(format!("{GF_USER}:"))
            .arg(&log)
            .status()?;
        if !st.success() {
            bail!("chown {}", log.display());
        }
        // No syslog in here: gfmd and gfsd log only with -F (NOTES 5.4).
        add_option(
            &etc.join("init.d/gfmd"),
            &format!("-F {}", log.join("gfmd.log").display()),
        )?;
        // Client configuration: the busy threshold raised, since on a shared 2-core box every
        // node looks busy (loadavg/ncpu > 0.5) and gfprep then finds no destination (NOTES 5.8).
        fs::write(
            etc.join("gfarm2-bench.conf"),
            format!(
                "include {}\nschedule_busy_load_thresh 16\n",
                etc.join("gfarm2.conf").display()
            ),
        )?;
        g.must(
            a0,
            &format!("{}/init.d/gfmd start", etc.display()),
            Duration::from_secs(30),
            "gfmd-start",
        )?;
        g.must(a0, "gfkey -f -p 31536000", Duration::from_secs(30), "gfkey")?;
        g.wait(a0, "gfwhoami", 0, Duration::from_secs(30))
            .context("gfmd did not answer")?;
        // One gfsd per host, registered (gfhost -c) by config-gfsd -N, started in its host.
        for h in lab.hosts() {
            let ip = h.addr().to_string();
            g.must(
                h,
                &format!(
                    "config-gfsd --prefix {} -S -N -h {} -l {ip} -p {GF_SD_PORT}",
                    run.display(),
                    gf_name(h)
                ),
                Duration::from_secs(60),
                &format!("config-gfsd-{}", h.name()),
            )?;
            let init = etc.join(format!("init.d/gfsd-{ip}"));
            add_option(
                &init,
                &format!(
                    "-F {}",
                    log.join(format!("gfsd-{}.log", h.name())).display()
                ),
            )?;
            g.must(
                h,
                &format!("{} start", init.display()),
                Duration::from_secs(30),
                &format!("gfsd-start-{}", h.name()),
            )?;
        }
        // gfdf lists the nodes gfmd sees up.
        g.wait(a0, "gfdf", lab.hosts().len(), Duration::from_secs(60))
            .context("gfsd nodes did not come up")?;
        Ok(g)
    }

    /// Polls `script` until its output names `want` of the lab hosts (bounded by `limit`).
    pub fn wait(
        &self,
        host: &netlab::Host,
        script: &str,
        want: usize,
        limit: Duration,
    ) -> Result<()> {
        let t = Instant::now();
        let mut last = String::new();
        while t.elapsed() < limit {
            let o = run_bounded(
                self.sh(host, "gfarm2-bench.conf", script),
                Duration::from_secs(20),
                &self.dir.join("wait"),
            )?;
            let up = self
                .lab
                .hosts()
                .iter()
                .filter(|h| o.stdout_text().contains(&gf_name(h)))
                .count();
            if o.ok() && up >= want {
                return Ok(());
            }
            last = format!("{up} of {want} hosts; {}", o.why());
            std::thread::sleep(Duration::from_millis(500));
        }
        bail!("{script}: {last}")
    }

    /// Stops gfsds (and the children that outlive them, NOTES 5.11), gfmd and PostgreSQL, then
    /// anything else still running as the Gfarm user; removes the user and /tmp leftovers.
    pub fn stop(&mut self) {
        let piddir = self.run.join("var/run");
        for h in self.lab.hosts() {
            let pf = piddir.join(format!("gfsd-{}.pid", h.addr()));
            if let Some(p) = pid_file(&pf) {
                let mut all = vec![p];
                all.extend(children_of(p));
                netlab::terminate(&all, Duration::from_secs(5));
                let _ = fs::remove_file(&pf);
            }
        }
        if let Some(p) = pid_file(&piddir.join("gfmd.pid")) {
            netlab::terminate(&[p], Duration::from_secs(10));
        }
        // The postmaster ends its backends itself on SIGTERM (smart) / SIGINT (fast).
        let pg = self.run.join("var/gfarm-pgsql/postmaster.pid");
        if let Some(p) = fs::read_to_string(&pg)
            .ok()
            .and_then(|s| s.lines().next().and_then(|l| l.trim().parse::<u32>().ok()))
            .filter(|p| *p > 1)
        {
            // SAFETY: kill(2) has no memory-safety preconditions.
            unsafe { libc::kill(p as libc::pid_t, libc::SIGINT) };
            let t = Instant::now();
            while netlab::running(p) && t.elapsed() < Duration::from_secs(15) {
                std::thread::sleep(Duration::from_millis(100));
            }
            netlab::terminate(&[p], Duration::from_secs(1));
        }
        if let Some(uid) = self.uid {
            let left = procs_of_uid(uid);
            if !left.is_empty() {
                let what: Vec<String> = left
                    .iter()
                    .map(|p| {
                        let c = fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
                        let c = String::from_utf8_lossy(&c).replace('\0', " ");
                        format!("{p} {}", c.trim())
                    })
                    .collect();
                eprintln!(
                    "haul-replbench: gfarm: stopping leftover processes of {GF_USER}: {}",
                    what.join("; ")
                );
                netlab::terminate(&left, Duration::from_secs(5));
            }
        }
        if self.user_created {
            let _ = Command::new("userdel").arg(GF_USER).status();
            self.user_created = false;
        }
        for h in self.lab.hosts() {
            let _ = fs::remove_dir_all(format!("/tmp/.gfarm-gfsd{}-{GF_SD_PORT}", h.addr()));
            let _ = fs::remove_file(format!("/tmp/gfsd-readonly-{}_{GF_SD_PORT}", h.addr()));
        }
        let _ = fs::remove_file(format!("/tmp/.s.PGSQL.{GF_PG_PORT}"));
        let _ = fs::remove_file(format!("/tmp/.s.PGSQL.{GF_PG_PORT}.lock"));
        self.uid = None;
    }
}

impl Drop for Gfarm<'_> {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Appends `opt` to the OPTIONS="..." line of a generated init script.
fn add_option(init: &Path, opt: &str) -> Result<()> {
    let text = fs::read_to_string(init).with_context(|| format!("reading {}", init.display()))?;
    let mut done = false;
    let text: String = text
        .lines()
        .map(|l| {
            match l
                .strip_prefix("OPTIONS=\"")
                .and_then(|r| r.strip_suffix('"'))
            {
                Some(o) if !done => {
                    done = true;
                    format!("OPTIONS=\"{o} {opt}\"")
                }
                _ => l.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n";
    if !done {
        bail!("no OPTIONS line in {}", init.display());
    }
    fs::write(init, text)?;
    Ok(())
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    fs::create_dir_all(to)?;
    for e in fs::read_dir(from)?.flatten() {
        let p = e.path();
        if p.is_dir() {
            copy_dir(&p, &to.join(e.file_name()))?;
        } else {
            fs::copy(&p, to.join(e.file_name()))
                .with_context(|| format!("copying {}", p.display()))?;
        }
    }
    Ok(())
}

/// gfwhere -r output: file path to the hosts holding a replica.
pub fn parse_gfwhere(out: &str) -> Vec<(String, Vec<String>)> {
    let mut v: Vec<(String, Vec<String>)> = Vec::new();
    let mut cur: Option<String> = None;
    for l in out.lines().map(str::trim) {
        if l.is_empty() {
            continue;
        }
        if let Some(p) = l.strip_suffix(':') {
            cur = Some(p.to_string());
        } else if let Some(p) = cur.take() {
            v.push((p, l.split_whitespace().map(String::from).collect()));
        }
    }
    v
}
