//! A grid's PKI, made with haul's own commands as an operator would make it: `haul ca init`,
//! `haul cert issue` for the metadata server, each storage node and each user; the mapfile,
//! the groups file and the enrolment file that lists every node with its certificate's
//! fingerprint.

use crate::process::run_bounded;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Longest one `haul ca`/`haul cert` command may take.
const LIMIT: Duration = Duration::from_secs(90);

/// What to issue.
#[derive(Clone, Debug, Default)]
pub struct PkiSpec {
    /// Host names and addresses of the metadata server's certificate.
    pub meta_hosts: Vec<String>,
    /// Storage nodes: name (the certificate's CN) and further host names or addresses.
    pub nodes: Vec<(String, Vec<String>)>,
    /// User certificates (`/O=longhaul/OU=users/CN=NAME`).
    pub users: Vec<String>,
    /// The mapfile: user (CN) and the local account it maps to.
    pub mapfile: Vec<(String, String)>,
    /// Groups and their members (no groups file when empty).
    pub groups: Vec<(String, Vec<String>)>,
}

/// A PKI in a directory: `ca/ca.pem`, `NAME.pem`/`NAME.key` per certificate, `mapfile`,
/// `groups` and `enrolled-nodes`.
#[derive(Clone, Debug)]
pub struct Pki {
    pub dir: PathBuf,
}

/// The subject of a user certificate `haul cert issue --user NAME` issues.
pub fn user_subject(name: &str) -> String {
    format!("/O=longhaul/OU=users/CN={name}")
}

impl Pki {
    /// Makes the PKI of `spec` in `dir` (created if missing); `haul` gives the command that
    /// runs `haul` (in a network namespace, with a clean environment, ...).
    pub fn create(dir: &Path, spec: &PkiSpec, haul: &dyn Fn() -> Command) -> Result<Pki, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let pki = Pki {
            dir: dir.to_path_buf(),
        };
        pki.haul(haul, &["ca", "init", "--dir", "ca"])?;
        pki.issue(haul, "meta", &spec.meta_hosts)?;
        let mut enrolment = String::from("# storage nodes allowed to join\n");
        for (name, hosts) in &spec.nodes {
            let mut names = vec![name.clone()];
            names.extend(hosts.iter().cloned());
            let line = pki.issue(haul, name, &names)?;
            enrolment += &format!("{line}\n");
        }
        pki.write("enrolled-nodes", &enrolment)?;
        for user in &spec.users {
            pki.haul(
                haul,
                &["cert", "issue", "--ca", "ca", "--user", user, "--out", user],
            )?;
        }
        let mapfile: String = spec
            .mapfile
            .iter()
            .map(|(user, account)| format!("\"{}\" {account}\n", user_subject(user)))
            .collect();
        pki.write("mapfile", &mapfile)?;
        if !spec.groups.is_empty() {
            let groups: String = spec
                .groups
                .iter()
                .map(|(g, members)| format!("{g}: {}\n", members.join(" ")))
                .collect();
            pki.write("groups", &groups)?;
        }
        Ok(pki)
    }

    /// Issues a host certificate `NAME.pem` for `hosts` (the first is its CN); returns its
    /// enrolment line (`CN sha256:...`).
    pub fn issue(
        &self,
        haul: &dyn Fn() -> Command,
        name: &str,
        hosts: &[String],
    ) -> Result<String, String> {
        let mut args = vec!["cert", "issue", "--ca", "ca", "--out", name];
        for h in hosts {
            args.extend(["--host", h.as_str()]);
        }
        let out = self.haul(haul, &args)?;
        enrolment_line(&out).ok_or_else(|| format!("no enrolment line in {out:?}"))
    }

    fn haul(&self, haul: &dyn Fn() -> Command, args: &[&str]) -> Result<String, String> {
        let mut c = haul();
        c.args(args).current_dir(&self.dir);
        let o = run_bounded(c, LIMIT).map_err(|e| format!("haul {args:?}: {e}"))?;
        if !o.ok() {
            return Err(format!("haul {args:?}: {}", o.why()));
        }
        Ok(o.stdout_text())
    }

    fn write(&self, file: &str, text: &str) -> Result<(), String> {
        std::fs::write(self.path(file), text).map_err(|e| format!("{file}: {e}"))
    }

    /// A file of the PKI.
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    pub fn ca(&self) -> PathBuf {
        self.path("ca/ca.pem")
    }

    pub fn cert(&self, name: &str) -> PathBuf {
        self.path(&format!("{name}.pem"))
    }

    pub fn key(&self, name: &str) -> PathBuf {
        self.path(&format!("{name}.key"))
    }

    pub fn mapfile(&self) -> PathBuf {
        self.path("mapfile")
    }

    /// The groups file (present only when the spec had groups).
    pub fn groups(&self) -> PathBuf {
        self.path("groups")
    }

    /// The enrolment file of `haul meta serve --nodes`.
    pub fn enrolment(&self) -> PathBuf {
        self.path("enrolled-nodes")
    }

    /// The environment of a `haul` client acting as `user`.
    pub fn as_user(&self, cmd: &mut Command, user: &str) {
        cmd.env("HAUL_CERT", self.cert(user))
            .env("HAUL_KEY", self.key(user))
            .env("HAUL_CA", self.ca());
    }
}

/// The enrolment line (`NAME sha256:...`) that `haul cert issue --host` printed.
pub fn enrolment_line(issue_output: &str) -> Option<String> {
    issue_output
        .lines()
        .find_map(|l| l.strip_prefix("enrolment line (haul meta serve --nodes FILE): "))
        .map(|l| l.trim().to_string())
}

/// Makes sure the local account `name` exists (an ordinary account with no home and no login
/// shell, created with `useradd` when missing: `haul run` tasks never run as system accounts).
/// Its uid, or `None` when it does not exist and cannot be created (not root).
pub fn ensure_account(name: &str) -> Option<u32> {
    let uid = || {
        Command::new("id")
            .args(["-u", name])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
    };
    if let Some(u) = uid() {
        return Some(u);
    }
    let _ = Command::new("useradd")
        .args(["-M", "-N", "-s", "/usr/sbin/nologin", name])
        .status();
    uid()
}
