//! The configuration file: one TOML file (`--config FILE`, else `$HAUL_CONFIG`, else
//! `~/.haul/config.toml`, else `/etc/haul/config.toml`) whose values become the defaults of the
//! command line. Flags and environment variables override it; missing values keep the built-in
//! defaults. Unknown keys are errors, so a typo does not silently do nothing.

use clap::Command;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Credentials used by every command that connects or serves (each command with `--cert`).
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

/// `haul meta serve` settings.
#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MetaServe {
    /// Catalog database URL ("sqlite:///var/lib/haul-meta/catalog.db", "postgres://...").
    pub db: Option<String>,
    /// Directory of the server's state (its SQLite catalog unless `db` is set).
    pub data: Option<PathBuf>,
    /// Address of the gRPC listener, e.g. "0.0.0.0:5811".
    pub listen: Option<String>,
    /// Address of the dashboard and /metrics, e.g. "127.0.0.1:5880".
    pub http: Option<String>,
    /// Mapfile of user certificate subjects and their grid identities.
    pub mapfile: Option<PathBuf>,
    /// Groups file ("group: user user ...").
    pub groups: Option<PathBuf>,
    /// Grid identities with administrator rights, e.g. ["root", "gridadmin"].
    pub admins: Option<Vec<String>>,
    /// Enrolled storage nodes (the lines `haul cert issue --host` prints).
    pub nodes: Option<PathBuf>,
    /// Node heartbeat interval, e.g. "2s".
    pub heartbeat: Option<String>,
    /// A node silent for this long is down, e.g. "10s".
    pub node_timeout: Option<String>,
    /// How often the reconciler checks every policy, e.g. "30s".
    pub reconcile_every: Option<String>,
    /// How long a transfer grant is valid, e.g. "5m".
    pub grant_ttl: Option<String>,
    /// Verify every replica's checksum on its node this often, e.g. "7d" (none by default).
    pub scrub_every: Option<String>,
    /// Transfer history: drop records that ended longer ago than this, e.g. "90d".
    pub history_keep: Option<String>,
    /// Transfer history: keep at most this many records (the newest).
    pub history_max: Option<u64>,
    /// Transfer log of the replication sessions the server directs.
    pub log_transfer: Option<PathBuf>,
    /// Its format: "netlogger", "json" or "gridftp".
    pub log_transfer_format: Option<String>,
}

/// `haul node serve` settings.
#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NodeServe {
    /// The metadata server, e.g. "haul://meta.example.org".
    pub meta: Option<String>,
    /// The node's site.
    pub site: Option<String>,
    /// Directory holding the node's replicas.
    pub root: Option<PathBuf>,
    /// Address of the data listener, e.g. "0.0.0.0:5812".
    pub listen: Option<String>,
    /// Address clients and other nodes reach it at, when not the listener's.
    pub advertise: Option<String>,
    /// Most the node stores, e.g. "40TiB" (the file system's free space otherwise).
    pub capacity: Option<String>,
    /// Bandwidth to plan for when pushing to other nodes, e.g. "10G".
    pub link_rate: Option<String>,
    /// Longest path test (`haul perf`) run for a client, in seconds; 0 refuses them.
    pub perf_max_seconds: Option<u64>,
    /// Address of its Prometheus /metrics, e.g. "127.0.0.1:9812".
    pub metrics: Option<String>,
    /// Transfer log of every file and session the node moves.
    pub log_transfer: Option<PathBuf>,
    /// Its format: "netlogger", "json" or "gridftp".
    pub log_transfer_format: Option<String>,
    /// Directory of TCP_INFO traces of the sessions the node sends.
    pub trace_dir: Option<PathBuf>,
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
    #[serde(default)]
    pub meta: MetaServe,
    #[serde(default)]
    pub node: NodeServe,
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
        // Every command that has the flags: the grid's clients and daemons, cp, serve, perf.
        for (name, value) in &creds {
            if value.is_some() {
                cmd = set_everywhere(cmd, name, value.clone());
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
        let m = &self.meta;
        if let Some(admins) = &m.admins {
            cmd = cmd.mut_subcommand("meta", |c| {
                c.mut_subcommand("serve", |s| {
                    s.mut_arg("admins", |a| a.default_values(admins.clone()))
                })
            });
        }
        for (name, value) in [
            ("db", m.db.clone()),
            ("data", path(&m.data)),
            ("listen", m.listen.clone()),
            ("http", m.http.clone()),
            ("mapfile", path(&m.mapfile)),
            ("groups", path(&m.groups)),
            ("nodes", path(&m.nodes)),
            ("heartbeat", m.heartbeat.clone()),
            ("node_timeout", m.node_timeout.clone()),
            ("reconcile_every", m.reconcile_every.clone()),
            ("grant_ttl", m.grant_ttl.clone()),
            ("scrub_every", m.scrub_every.clone()),
            ("history_keep", m.history_keep.clone()),
            ("history_max", m.history_max.map(|v| v.to_string())),
            ("log_transfer", path(&m.log_transfer)),
            ("log_transfer_format", m.log_transfer_format.clone()),
        ] {
            cmd = set_default(cmd, "meta serve", name, value);
        }
        let n = &self.node;
        for (name, value) in [
            ("meta", n.meta.clone()),
            ("site", n.site.clone()),
            ("root", path(&n.root)),
            ("listen", n.listen.clone()),
            ("advertise", n.advertise.clone()),
            ("capacity", n.capacity.clone()),
            ("link_rate", n.link_rate.clone()),
            (
                "perf_max_seconds",
                n.perf_max_seconds.map(|v| v.to_string()),
            ),
            // MetricsArgs's field: `--metrics ADDR` has the id `addr`.
            ("addr", n.metrics.clone()),
            ("log_transfer", path(&n.log_transfer)),
            ("log_transfer_format", n.log_transfer_format.clone()),
            ("trace_dir", path(&n.trace_dir)),
        ] {
            cmd = set_default(cmd, "node serve", name, value);
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

/// Makes `value` the default of `arg` of the subcommand `path` ("cp", "meta serve").
fn set_default(cmd: Command, path: &str, arg: &str, value: Option<String>) -> Command {
    let Some(value) = value else { return cmd };
    fn at(cmd: Command, path: &[&str], arg: &str, value: String) -> Command {
        match path.split_first() {
            None => cmd.mut_arg(arg, |a| a.default_value(value).required(false)),
            Some((sub, rest)) => cmd.mut_subcommand(*sub, |s| at(s, rest, arg, value)),
        }
    }
    let path: Vec<&str> = path.split_whitespace().collect();
    at(cmd, &path, arg, value)
}

/// Makes `value` the default of `arg` in every subcommand that has it.
fn set_everywhere(mut cmd: Command, arg: &str, value: Option<String>) -> Command {
    let Some(value) = value else { return cmd };
    if cmd.get_arguments().any(|a| a.get_id() == arg) {
        cmd = cmd.mut_arg(arg, |a| a.default_value(value.clone()));
    }
    let subs: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect();
    for sub in subs {
        let v = value.clone();
        cmd = cmd.mut_subcommand(sub, |s| set_everywhere(s, arg, Some(v)));
    }
    cmd
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

    #[test]
    fn meta_and_node_sections_and_credentials_everywhere() {
        let c = Config::parse(
            "[credentials]\ncert = \"/etc/haul/me.pem\"\n\
             [meta]\nlisten = \"0.0.0.0:7811\"\nadmins = [\"root\", \"ops\"]\nnode_timeout = \"30s\"\n\
             [node]\nmeta = \"haul://m.example.org\"\nsite = \"KEK\"\nroot = \"/data\"\nmetrics = \"127.0.0.1:9812\"\ncapacity = \"2TiB\"\n",
            Path::new("c.toml"),
        )
        .unwrap();
        let cmd = c.apply(Cli::command());
        let parse = |argv: &[&str]| {
            Cli::from_arg_matches(&cmd.clone().try_get_matches_from(argv).unwrap()).unwrap()
        };
        let crate::args::Command::Meta(crate::args::MetaCommand::Serve(m)) =
            parse(&["haul", "meta", "serve"]).command
        else {
            panic!()
        };
        assert_eq!(m.listen, "0.0.0.0:7811");
        assert_eq!(m.admins, ["root", "ops"]);
        assert_eq!(m.node_timeout, std::time::Duration::from_secs(30));
        assert_eq!(m.creds.cert, Some(PathBuf::from("/etc/haul/me.pem")));
        let crate::args::Command::Node(crate::args::NodeCommand::Serve(n)) =
            parse(&["haul", "node", "serve", "--site", "RIKEN"]).command
        else {
            panic!()
        };
        assert_eq!(n.site, "RIKEN", "flag wins");
        assert_eq!(n.meta, "haul://m.example.org");
        assert_eq!(n.root, PathBuf::from("/data"));
        assert_eq!(n.metrics.addr.as_deref(), Some("127.0.0.1:9812"));
        assert_eq!(n.capacity, Some(2 << 40));
        // A grid client command takes the certificate too.
        let crate::args::Command::Df(d) = parse(&["haul", "df", "haul://m"]).command else {
            panic!()
        };
        assert_eq!(d.creds.cert, Some(PathBuf::from("/etc/haul/me.pem")));
    }
}
