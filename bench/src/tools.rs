//! How each tool's server is started inside the server host and how its client is invoked,
//! following shared/reference/peers.md; plus the one-time setup (ssh keys, a CA for the TLS
//! row, a hosts file for GridFTP) and tool versions for the results header.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};

use crate::data::Dataset;
use crate::plan::{Tool, Variant};
use crate::proc::{self, Cgroup};

pub const HAUL_PORT: u16 = 5811;
pub const IPERF_PORT: u16 = 5201;
pub const GRIDFTP_PORT: u16 = 2811;
pub const XROOTD_PORT: u16 = 1094;
pub const SSH_PORT: u16 = 22;
pub const FLOOR_PORT: u16 = 5812;

pub fn port(tool: Tool) -> u16 {
    match tool {
        Tool::Haul | Tool::HaulTls => HAUL_PORT,
        Tool::Iperf3 => IPERF_PORT,
        Tool::Globus => GRIDFTP_PORT,
        Tool::Xrdcp => XROOTD_PORT,
        Tool::Scp | Tool::Rsync => SSH_PORT,
        Tool::Floor => FLOOR_PORT,
    }
}

/// Things made once per benchmark run.
pub struct Ctx {
    pub haul: PathBuf,
    /// `haul-floor`, built beside `haul-bench`.
    pub floor: PathBuf,
    /// Keys, certificates, configs, hosts file (on tmpfs, removed at the end).
    pub state: PathBuf,
    pub ssh_key: Option<PathBuf>,
    pub pki: Option<PathBuf>,
    pub hosts_file: PathBuf,
}

impl Ctx {
    pub fn new(haul: PathBuf, state: PathBuf) -> Result<Ctx> {
        fs::create_dir_all(&state)?;
        set_mode(&state, 0o755)?;
        // GridFTP turns its own address into a name with getnameinfo(); with no reachable DNS
        // server that fails ("Temporary failure in name resolution") and the server refuses
        // to start. It runs with this hosts file bind-mounted over /etc/hosts in a private
        // mount namespace, so lookups of lab addresses succeed locally.
        let hosts_file = state.join("hosts");
        let mut hosts = String::from("127.0.0.1 localhost\n");
        if let Ok(h) = fs::read_to_string("/proc/sys/kernel/hostname") {
            hosts.push_str(&format!("127.0.1.1 {}\n", h.trim()));
        }
        for (site, name) in [(0, 'a'), (1, 'b')] {
            for i in 0..8 {
                hosts.push_str(&format!("198.18.{site}.{} {name}{i}\n", i + 1));
            }
        }
        fs::write(&hosts_file, hosts)?;
        let floor = std::env::current_exe()
            .context("where haul-bench runs from")?
            .with_file_name("haul-floor");
        Ok(Ctx {
            haul,
            floor,
            state,
            ssh_key: None,
            pki: None,
            hosts_file,
        })
    }

    /// A client key and a host key for the benchmark's own sshd.
    pub fn setup_ssh(&mut self) -> Result<()> {
        let dir = self.state.join("ssh");
        fs::create_dir_all(&dir)?;
        for k in ["id_ed25519", "host_ed25519"] {
            if !dir.join(k).exists() {
                proc::run_output(
                    Command::new("ssh-keygen")
                        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                        .arg(dir.join(k)),
                )?;
            }
        }
        fs::copy(dir.join("id_ed25519.pub"), dir.join("authorized_keys"))?;
        fs::create_dir_all("/run/sshd")?;
        self.ssh_key = Some(dir.join("id_ed25519"));
        Ok(())
    }

    /// A CA, a host certificate for 127.0.0.1 / 198.18.1.1 and a user certificate mapped to
    /// "bench", made with haul itself.
    pub fn setup_pki(&mut self) -> Result<()> {
        let dir = self.state.join("pki");
        let _ = fs::remove_dir_all(&dir);
        let haul = |args: &[&str]| proc::run_output(Command::new(&self.haul).args(args));
        let d = dir.to_string_lossy().into_owned();
        haul(&["ca", "init", "--dir", &d])?;
        haul(&[
            "cert",
            "issue",
            "--ca",
            &d,
            "--host",
            "198.18.1.1",
            "--host",
            "localhost",
            "--host",
            "127.0.0.1",
            "--out",
            &format!("{d}/host"),
        ])?;
        let out = haul(&[
            "cert",
            "issue",
            "--ca",
            &d,
            "--user",
            "bench",
            "--out",
            &format!("{d}/user"),
        ])?;
        let subject = out
            .lines()
            .find_map(|l| l.strip_prefix("issued "))
            .ok_or_else(|| anyhow!("haul cert issue printed no subject: {out}"))?
            .trim()
            .to_string();
        // The endpoint runs as root: the session acts as the account mapped (root here).
        fs::write(dir.join("mapfile"), format!("\"{subject}\" root\n"))?;
        self.pki = Some(dir);
        Ok(())
    }
}

fn set_mode(p: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(p, fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {}", p.display()))
}

/// Where one server runs: its host, the address it binds, the directory it writes to, a
/// scratch directory for its configs and logs.
pub struct ServerSpot<'a> {
    pub host: &'a netlab::Host,
    pub addr: String,
    pub dst: PathBuf,
    pub scratch: PathBuf,
}

/// Makes a destination directory anyone may write (GridFTP writes as `nobody`, XRootD runs as
/// `nobody`).
pub fn make_dst(dst: &Path) -> Result<()> {
    let _ = fs::remove_dir_all(dst);
    fs::create_dir_all(dst)?;
    set_mode(dst, 0o777)
}

/// Starts the server of `tool` in `spot.host`, inside `cg`, and waits until it listens.
pub fn start_server(ctx: &Ctx, tool: Tool, spot: &ServerSpot, cg: &Cgroup) -> Result<()> {
    let s = &spot.scratch;
    fs::create_dir_all(s)?;
    set_mode(s, 0o777)?;
    let a = spot.addr.as_str();
    let dst = spot.dst.to_string_lossy().into_owned();
    let cmd = match tool {
        Tool::Haul | Tool::HaulTls => {
            let mut c = spot.host.command(&ctx.haul);
            c.args([
                "serve",
                "--root",
                &dst,
                "--listen",
                &format!("{a}:{HAUL_PORT}"),
            ]);
            if tool == Tool::Haul {
                c.arg("--insecure");
            } else {
                let p = ctx
                    .pki
                    .as_ref()
                    .ok_or_else(|| anyhow!("no certificates were made"))?;
                c.arg("--cert").arg(p.join("host.pem"));
                c.arg("--key").arg(p.join("host.key"));
                c.arg("--ca").arg(p.join("ca.pem"));
                c.arg("--mapfile").arg(p.join("mapfile"));
            }
            c
        }
        Tool::Floor => {
            let mut c = spot.host.command(&ctx.floor);
            c.arg("recv")
                .arg(format!("{a}:{FLOOR_PORT}"))
                .arg(&spot.dst);
            c
        }
        Tool::Iperf3 => {
            let mut c = spot.host.command("iperf3");
            c.args(["-s", "-D", "-B", a, "-p", &IPERF_PORT.to_string()]);
            c.arg("--logfile").arg(s.join("iperf3.log"));
            c
        }
        Tool::Globus => {
            let server = format!(
                "exec env GLOBUS_USAGE_OPTOUT=1 globus-gridftp-server -S -p {GRIDFTP_PORT} \
                 -control-interface {a} -data-interface {a} -aa -anonymous-user nobody \
                 -home-dir / -disable-usage-stats -log-level error,warn -l {log} -pidfile {pid}",
                log = s.join("gridftp.log").display(),
                pid = s.join("gridftp.pid").display(),
            );
            let mut c = spot.host.command("unshare");
            c.args(["--mount", "sh", "-c"]).arg(format!(
                "mount --bind {} /etc/hosts && {server}",
                ctx.hosts_file.display()
            ));
            c
        }
        Tool::Xrdcp => {
            let admin = s.join("xrd");
            fs::create_dir_all(&admin)?;
            set_mode(&admin, 0o777)?;
            let cfg = s.join("xrootd.cfg");
            fs::write(
                &cfg,
                format!(
                    "xrd.port {XROOTD_PORT}\nall.export {dst}\nall.adminpath {ad}\nall.pidpath {ad}\nxrootd.trace off\n",
                    ad = admin.display()
                ),
            )?;
            let mut c = spot.host.command("xrootd");
            c.arg("-b")
                .arg("-c")
                .arg(&cfg)
                .arg("-l")
                .arg(s.join("xrootd.log"));
            c.args(["-n", "bench", "-R", "nobody"]);
            c
        }
        Tool::Scp | Tool::Rsync => {
            let k = ctx.state.join("ssh");
            let cfg = s.join("sshd_config");
            fs::write(
                &cfg,
                format!(
                    "Port {SSH_PORT}\nListenAddress {a}\nHostKey {hk}\nPubkeyAuthentication yes\n\
                     PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n\
                     StrictModes no\nPermitRootLogin prohibit-password\nAuthorizedKeysFile {ak}\n\
                     PidFile {pid}\nSubsystem sftp /usr/lib/openssh/sftp-server\n",
                    hk = k.join("host_ed25519").display(),
                    ak = k.join("authorized_keys").display(),
                    pid = s.join("sshd.pid").display(),
                ),
            )?;
            let mut c = spot.host.command(sshd_path());
            c.arg("-D").arg("-e").arg("-f").arg(&cfg);
            c
        }
    };
    let out = s.join("server.out");
    let err = s.join("server.err");
    let _running = proc::spawn(cmd, Some(cg), &out, &err)?;
    if !proc::wait_listening(spot.host, port(tool), Duration::from_secs(15)) {
        let tail = |p: &Path| {
            let t = fs::read_to_string(p).unwrap_or_default();
            t.lines().rev().take(4).collect::<Vec<_>>().join(" | ")
        };
        let mut why = tail(&err);
        for log in ["gridftp.log", "bench/xrootd.log", "iperf3.log"] {
            if s.join(log).exists() {
                why.push_str(&format!(" {log}: {}", tail(&s.join(log))));
            }
        }
        bail!(
            "{} server did not listen on port {} within 15 s: {why}",
            tool.display(),
            port(tool)
        );
    }
    Ok(())
}

pub fn sshd_path() -> &'static str {
    if Path::new("/usr/sbin/sshd").exists() {
        "/usr/sbin/sshd"
    } else {
        "sshd"
    }
}

fn ssh_opts(key: &Path) -> Vec<String> {
    let mut v = vec![
        "-i".to_string(),
        key.display().to_string(),
        "-F".into(),
        "/dev/null".into(),
    ];
    for o in [
        "StrictHostKeyChecking=no",
        "UserKnownHostsFile=/dev/null",
        "BatchMode=yes",
        "LogLevel=ERROR",
    ] {
        v.push("-o".into());
        v.push(o.into());
    }
    v
}

/// The client command of `variant` copying `ds` to `dst` on the server at `addr` (an upload,
/// client site to server site), run in `host`.
pub fn client_command(
    ctx: &Ctx,
    variant: &Variant,
    host: &netlab::Host,
    addr: &str,
    ds: Option<&Dataset>,
    dst: &Path,
) -> Result<Command> {
    let tool = variant.tool;
    if tool == Tool::Iperf3 {
        let mut c = host.command("iperf3");
        c.args(["-c", addr, "-p", &IPERF_PORT.to_string(), "-J"]);
        c.args(&variant.flags);
        return Ok(c);
    }
    let ds = ds.ok_or_else(|| anyhow!("no dataset for {}", tool.display()))?;
    let src = ds.root.display().to_string();
    let name = ds.name();
    let dst_s = dst.display().to_string();
    Ok(match tool {
        Tool::Haul | Tool::HaulTls => {
            let mut c = host.command(&ctx.haul);
            c.args(["cp", "--json", "--progress", "never"]);
            if tool == Tool::Haul {
                c.arg("--insecure");
            } else {
                let p = ctx
                    .pki
                    .as_ref()
                    .ok_or_else(|| anyhow!("no certificates were made"))?;
                c.arg("--cert").arg(p.join("user.pem"));
                c.arg("--key").arg(p.join("user.key"));
                c.arg("--ca").arg(p.join("ca.pem"));
            }
            c.args(&variant.flags);
            if ds.tree {
                c.arg("-r");
            }
            c.arg(&src).arg(format!("haul://{addr}:{HAUL_PORT}/"));
            c
        }
        Tool::Globus => {
            let mut c = host.command("globus-url-copy");
            if ds.tree {
                c.args(["-r", "-cd", "-fast"]);
                c.args(&variant.flags);
                c.arg(format!("file://{src}/"));
                c.arg(format!("ftp://{addr}:{GRIDFTP_PORT}{dst_s}/{name}/"));
            } else {
                c.args(&variant.flags);
                c.arg(format!("file://{src}"));
                c.arg(format!("ftp://{addr}:{GRIDFTP_PORT}{dst_s}/{name}"));
            }
            c
        }
        Tool::Xrdcp => {
            let mut c = host.command("xrdcp");
            if ds.tree {
                c.arg("-r");
            }
            c.args(["-f", "--nopbar"]);
            c.args(&variant.flags);
            c.arg(&src);
            if ds.tree {
                c.arg(format!("root://{addr}:{XROOTD_PORT}/{dst_s}/"));
            } else {
                c.arg(format!("root://{addr}:{XROOTD_PORT}/{dst_s}/{name}"));
            }
            c
        }
        Tool::Scp => {
            let key = ctx.ssh_key.as_ref().ok_or_else(|| anyhow!("no ssh key"))?;
            let mut c = host.command("scp");
            c.arg("-q");
            if ds.tree {
                c.arg("-r");
            }
            c.args(ssh_opts(key));
            c.arg(&src).arg(format!("root@{addr}:{dst_s}/"));
            c
        }
        Tool::Rsync => {
            let key = ctx.ssh_key.as_ref().ok_or_else(|| anyhow!("no ssh key"))?;
            let mut c = host.command("rsync");
            c.arg("-a");
            c.arg("-e").arg(format!("ssh {}", ssh_opts(key).join(" ")));
            c.arg(&src).arg(format!("root@{addr}:{dst_s}/"));
            c
        }
        Tool::Floor => {
            if ds.tree {
                bail!("haul-floor sends one file, not a tree");
            }
            let mut c = host.command(&ctx.floor);
            c.arg("send")
                .args(&variant.flags)
                .arg(format!("{addr}:{FLOOR_PORT}"))
                .arg(&src);
            c
        }
        Tool::Iperf3 => unreachable!("handled above"),
    })
}

/// Whether every program `tool` needs is on PATH (or where Debian puts it).
pub fn missing_program(tool: Tool) -> Option<String> {
    tool.programs()
        .iter()
        .find(|p| {
            let p = if **p == "sshd" { sshd_path() } else { p };
            !Path::new(p).is_absolute() && which(p).is_none()
                || Path::new(p).is_absolute() && !Path::new(p).exists()
        })
        .map(|p| p.to_string())
}

pub fn which(p: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join(p))
            .find(|f| f.is_file())
    })
}

/// First line of a version command's output, or why there is none.
pub fn version(cmd: &str, args: &[&str]) -> String {
    match Command::new(cmd).args(args).output() {
        Ok(o) => {
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            text.lines()
                .map(str::trim)
                .find(|l| !l.is_empty())
                .unwrap_or("(no output)")
                .to_string()
        }
        Err(e) => format!("not available ({e})"),
    }
}
