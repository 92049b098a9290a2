//! The configuration file: one TOML file (`--config FILE`, else `$HAUL_CONFIG`, else
//! `~/.haul/config.toml`, else `/etc/haul/config.toml`) whose values become the defaults of the
//! command line. Flags and environment variables override it; missing values keep the built-in
//! defaults. Unknown keys are errors, so a typo does not silently do nothing.

use clap::Command;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Credentials used by every command that connects or serves.
#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Credentials {
    /// Certificate (PEM): a user certificate for clients, a host certificate for endpoints.
    pub cert: Option<PathBuf>,
    /// Its private key (PEM).
    pub key: Option<PathBuf>,
    /// CA certificate(s) to trust (PEM).
    pub ca: Option<PathBuf>,
}

/// `haul serve` settings.
#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Serve {
    /// Directory tree to export.
    pub root: Option<PathBuf>,
    /// Address to listen on, e.g. "0.0.0.0:5811".
    pub listen: Option<String>,
    /// Mapfile of certificate subjects allowed in, and the local identities they map to.
    pub mapfile: Option<PathBuf>,
    /// Refuse writes.
    pub read_only: Option<bool>,
    /// Most connections at once.
    pub max_connections: Option<usize>,
    /// Most connections at once from one address (IPv6: one /64).
    pub max_per_host: Option<usize>,
    /// A new connection must authenticate within this, e.g. "10s".
    pub handshake_timeout: Option<String>,
    /// An idle authenticated control connection is closed after this, e.g. "10m".
    pub idle_timeout: Option<String>,
    /// Data streams one session may open.
    pub max_streams: Option<u32>,
    /// Longest path test (`haul perf`) run for a client, in seconds; 0 refuses them.
    pub perf_max_seconds: Option<u64>,
    /// Memory one receiving session may hold in block buffers, e.g. "256MiB".
    pub session_buffer: Option<String>,
    /// Memory all receiving sessions together may hold in block buffers, e.g. "1GiB".
    pub max_buffer: Option<String>,
    /// Bandwidth to plan for when pushing to another endpoint, e.g. "10G".
    pub link_rate: Option<String>,
    /// How often received files are synced and their restart markers recorded, e.g. "5s".
    pub checkpoint_interval: Option<String>,
    /// Transfer log: every file and session moved, and every refused authentication.
    pub log_transfer: Option<PathBuf>,
    /// Its format: "netlogger", "json" or "gridftp".
    pub log_transfer_format: Option<String>,
}

/// `haul cp` defaults.
#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Cp {
    /// Extra checksums, e.g. "adler32,md5" (crc32c is always computed).
    pub checksum: Option<String>,
    /// Cancel and resume a transfer that moves no data for this long, e.g. "60s".
    pub stall_timeout: Option<String>,
    /// Attempts after the first, each resuming.
    pub retries: Option<u32>,
    /// Files in flight at once.
    pub concurrency: Option<u32>,
    /// Bandwidth to plan for when no rate is given, e.g. "10G" (a DTN on a 100G path: "100G").
    pub link_rate: Option<String>,
    /// Rate cap for every transfer, e.g. "800M" (bits per second).
    pub rate: Option<String>,
    /// Protection of data streams: "clear" or "private".
    pub protect: Option<String>,
    /// Transfer log of every copy: a record per file and per copy.
    pub log_transfer: Option<PathBuf>,
    /// Its format: "netlogger", "json" or "gridftp".
    pub log_transfer_format: Option<String>,
}

/// The whole file.
#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub credentials: Credentials,
    #[serde(default)]
    pub serve: Serve,
    #[serde(default)]
    pub cp: Cp,
}

impl Config {
    /// Parses `text`; an error names the file, line and column (`FILE:LINE:COL: what`, as
    /// compilers do, so that editors jump to it).
    pub fn parse(text: &str, origin: &Path) -> Result<Self, String> {
        toml::from_str(text).map_err(|e| {
            let at = e
                .span()
                .map(|s| line_column(text, s.start))
                .map(|(line, col)| format!(":{line}:{col}"))
                .unwrap_or_default();
            format!("{}{at}: {}", origin.display(), e.message())
        })
    }

    /// Finds and reads the configuration. `explicit` is `--config`; it must exist.
    pub fn load(explicit: Option<PathBuf>) -> Result<(Self, Option<PathBuf>), String> {
        let candidates: Vec<(PathBuf, bool)> =
            match explicit.or_else(|| std::env::var_os("HAUL_CONFIG").map(PathBuf::from)) {
                Some(p) => vec![(p, true)],
                None => {
                    let mut v = Vec::new();
                    if let Some(home) = std::env::var_os("HOME") {
                        v.push((PathBuf::from(home).join(".haul/config.toml"), false));
                    }
                    v.push((PathBuf::from("/etc/haul/config.toml"), false));
                    v
                }
            };
        for (path, required) in candidates {
            match std::fs::read_to_string(&path) {
                Ok(text) => return Self::parse(&text, &path).map(|c| (c, Some(path))),
                Err(e) if required => {
                    return Err(format!("cannot read configuration {}: {e}", path.display()));
                }
                Err(_) => {}
            }
        }
        Ok((Self::default(), None))
    }

    /// Makes the configured values the defaults of the command line.
    pub fn apply(&self, cmd: Command) -> Command {
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.to_string_lossy().into_owned());
        let mut cmd = cmd;
        let creds = [
            ("cert", path(&self.credentials.cert)),
            ("key", path(&self.credentials.key)),
            ("ca", path(&self.credentials.ca)),
        ];
        for sub in ["cp", "serve"] {
            for (name, value) in &creds {
                cmd = set_default(cmd, sub, name, value.clone());
            }
        }
        let s = &self.serve;
        for (name, value) in [
            ("root", path(&s.root)),
            ("listen", s.listen.clone()),
            ("mapfile", path(&s.mapfile)),
            ("max_connections", s.max_connections.map(|v| v.to_string())),
            ("max_per_host", s.max_per_host.map(|v| v.to_string())),
            ("handshake_timeout", s.handshake_timeout.clone()),
            ("idle_timeout", s.idle_timeout.clone()),
            ("max_streams", s.max_streams.map(|v| v.to_string())),
            (
                "perf_max_seconds",
                s.perf_max_seconds.map(|v| v.to_string()),
            ),
            ("session_buffer", s.session_buffer.clone()),
            ("max_buffer", s.max_buffer.clone()),
            ("link_rate", s.link_rate.clone()),
            ("checkpoint_interval", s.checkpoint_interval.clone()),
            ("log_transfer", path(&s.log_transfer)),
            ("log_transfer_format", s.log_transfer_format.clone()),
        ] {
            cmd = set_default(cmd, "serve", name, value);
        }
        if s.read_only == Some(true) {
            cmd = set_default(cmd, "serve", "read_only", Some("true".into()));
        }
        let c = &self.cp;
        for (name, value) in [
            ("checksum", c.checksum.clone()),
            ("stall_timeout", c.stall_timeout.clone()),
            ("retries", c.retries.map(|v| v.to_string())),
            ("concurrency", c.concurrency.map(|v| v.to_string())),
            ("link_rate", c.link_rate.clone()),
            ("rate", c.rate.clone()),
            ("protect", c.protect.clone()),
            ("log_transfer", path(&c.log_transfer)),
            ("log_transfer_format", c.log_transfer_format.clone()),
        ] {
            cmd = set_default(cmd, "cp", name, value);
        }
        cmd
    }
}

/// Line and column (from 1; the column in characters) of byte `offset` of `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let mut at = offset.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    let before = &text[..at];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (
        before.matches('\n').count() + 1,
        before[line_start..].chars().count() + 1,
    )
}

fn set_default(cmd: Command, sub: &str, arg: &str, value: Option<String>) -> Command {
    let Some(value) = value else { return cmd };
    cmd.mut_subcommand(sub, |s| {
        s.mut_arg(arg, |a| a.default_value(value).required(false))
    })
}

/// `--config FILE` from the raw arguments (it must be known before parsing them).
pub fn explicit_path(args: &[std::ffi::OsString]) -> Option<PathBuf> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let s = a.to_string_lossy();
        if s == "--config" {
            return it.next().map(PathBuf::from);
        }
        if let Some(v) = s.strip_prefix("--config=") {
            return Some(PathBuf::from(v));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::Cli;
    use clap::{CommandFactory, FromArgMatches};

    #[test]
    fn the_example_configuration_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/haul.example.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        let c = Config::parse(&text, &path).unwrap();
        assert_eq!(c.serve.listen.as_deref(), Some("0.0.0.0:5811"));
        assert!(c.credentials.cert.is_some());
    }

    #[test]
    fn unknown_keys_are_errors() {
        let err = Config::parse("[serve]\nlisten_on = \"x\"\n", Path::new("c.toml")).unwrap_err();
        assert!(err.contains("listen_on"), "{err}");
        assert!(err.starts_with("c.toml:2:1: "), "{err}");
    }

    #[test]
    fn errors_name_the_line_and_column() {
        let err = Config::parse(
            "[cp]\nretries = 3\n# é\nrate = \"800M\"\nconcurrency = \"many\"\n",
            Path::new("/etc/haul/config.toml"),
        )
        .unwrap_err();
        assert!(
            err.starts_with("/etc/haul/config.toml:5:15: "),
            "the value of line 5: {err}"
        );
        let err = Config::parse("[cp]\nretries = \n", Path::new("c.toml")).unwrap_err();
        assert!(err.starts_with("c.toml:2:"), "{err}");
        assert_eq!(line_column("ab\ncé\nd", 6), (2, 3));
        assert_eq!(line_column("ab", 99), (1, 3));
    }

    #[test]
    fn configuration_gives_defaults_and_flags_override() {
        let c = Config::parse(
            "[serve]\nroot = \"/data\"\nlisten = \"127.0.0.1:7000\"\n[cp]\nretries = 9\nchecksum = \"md5\"\n",
            Path::new("c.toml"),
        )
        .unwrap();
        let cmd = c.apply(Cli::command());
        let m = cmd
            .clone()
            .try_get_matches_from(["haul", "serve", "--insecure"])
            .unwrap();
        let cli = Cli::from_arg_matches(&m).unwrap();
        let crate::args::Command::Serve(s) = cli.command else {
            panic!()
        };
        assert_eq!(s.root, PathBuf::from("/data"));
        assert_eq!(s.listen, "127.0.0.1:7000");
        let m = cmd
            .try_get_matches_from(["haul", "cp", "--retries", "1", "a", "b"])
            .unwrap();
        let cli = Cli::from_arg_matches(&m).unwrap();
        let crate::args::Command::Cp(cp) = cli.command else {
            panic!()
        };
        assert_eq!(cp.retries, 1, "flag wins");
        assert_eq!(cp.checksum, "md5", "config value");
    }
}
