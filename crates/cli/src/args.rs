//! The command line: every subcommand and flag with its help text, written next to it.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

const EXIT_CODES: &str = "\
Exit codes:
  0    success
  1    some files failed for no more specific reason (others were copied), or
       another local failure; when files fail, the code is that of the first
       failure's cause (e.g. 5 for a file that may not be read), and the JSON
       summary lists every failed file
  2    usage error (bad flag or argument)
  3    source not found
  4    host unreachable or connection lost (after all retries)
  5    authentication or authorization failed (certificate refused or expired,
       identity not in the endpoint's mapfile, permission denied)
  6    destination cannot take the data (not writable, disk full, path outside
       the exported root)
  7    data did not verify against the source checksum (after all retries)
  8    transfer stalled: no data moved for --stall-timeout (after all retries)
  9    protocol error (malformed data from the peer, version mismatch)
  130  interrupted
  141  standard output was closed before everything was printed (| head)

In the grid (haul://META/path): 3 no such file or directory; 4 metadata server,
storage node or catalog database unreachable, or no healthy replica; 5 permission
denied; 6 the path exists, is not a directory, is not empty, is being written, or no
storage node has room.";

/// longhaul: move and replicate large datasets across long fat networks.
#[derive(Parser, Debug)]
// max_term_width = 0: help fills a wide terminal (clap stops at 100 columns otherwise);
// examples are kept under 80 columns with `\` continuations, so that they paste as they are.
#[command(
    name = "haul",
    version,
    about,
    after_help = EXIT_CODES,
    propagate_version = true,
    max_term_width = 0
)]
pub struct Cli {
    /// More log output on stderr (-v info, -vv debug); HAUL_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,

    /// Configuration file (TOML) whose values become defaults [default: $HAUL_CONFIG,
    /// ~/.haul/config.toml, /etc/haul/config.toml]
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Format of the log on stderr: text (coloured only on a terminal) or json (one object
    /// per line, for log collectors).
    #[arg(long, global = true, value_enum, default_value = "text")]
    pub log_format: LogFormatArg,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormatArg {
    Text,
    Json,
}

/// The transfer log: a record of every file and session moved, and of every refused
/// authentication.
#[derive(Args, Debug, Clone)]
pub struct TransferLogArgs {
    /// Append a record of every file and session moved (and of every refused authentication)
    /// to FILE; it is opened before anything moves, and a full disk later only drops records.
    #[arg(long, value_name = "FILE")]
    pub log_transfer: Option<PathBuf>,
    /// Format of --log-transfer: netlogger (NetLogger best-practice key=value lines), json
    /// (the same keys, one object per line), gridftp (globus-gridftp-server -log-transfer
    /// lines; files only).
    #[arg(long, value_name = "FORMAT", default_value = "netlogger", value_parser = ["netlogger", "json", "gridftp"])]
    pub log_transfer_format: String,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  haul doctor                                   # this host, for a 10 Gbit/s, 100 ms path\n  haul doctor haul://dtn.example.org            # and the path to that endpoint, and its limits\n  haul doctor --link-rate 1G --rtt 250ms --json\n\nExit status: 0 when nothing fails (warnings may remain), 1 when a setting caps transfers on\nthis path; the usual codes when the endpoint cannot be reached (4) or refuses us (5)."
)]
pub struct DoctorArgs {
    /// An endpoint to check the path to: haul://host[:port] (a standalone endpoint or a
    /// storage node).
    pub endpoint: Option<String>,
    /// The link rate to plan for, in bits/s.
    #[arg(long, value_name = "RATE", default_value = "10G", value_parser = parse_rate)]
    pub link_rate: u64,
    /// The round trip to plan for when no endpoint is given (measured otherwise).
    #[arg(long, value_name = "DURATION", default_value = "100ms", value_parser = parse_duration)]
    pub rtt: std::time::Duration,
    /// Print the findings as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub creds: EndpointCredArgs,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  TCP both ways, 10 s each, with as many streams as a copy would plan:\n    haul perf haul://dtn.example.org\n  haul perf haul://dtn.example.org -P 8 -t 30s --direction send\n  UDP loss, jitter and reordering at 500 Mbit/s:\n    haul perf haul://dtn.example.org --udp --rate 500M\n  haul perf haul://dtn.example.org --json\n\nThe test runs over the endpoint's own port and authentication (a standalone endpoint or a\nstorage node; a UDP test uses the same port number for UDP while it runs). Endpoints run tests\nof up to --perf-max-seconds (default 60 s).\n\nExit status: 0 when the tests ran; 2 for bad arguments or a test the endpoint refuses; 4 when\nit cannot be reached; 5 when it refuses us."
)]
pub struct PerfArgs {
    /// The endpoint: haul://host[:port].
    pub endpoint: String,
    /// TCP streams [default: what a copy on this path would plan]
    #[arg(short = 'P', long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=256))]
    pub streams: Option<u32>,
    /// How long each direction sends.
    #[arg(short = 't', long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub time: std::time::Duration,
    /// Reporting interval.
    #[arg(short = 'i', long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    pub interval: std::time::Duration,
    /// Which way the data flows: to the endpoint, from it, or both one after the other.
    #[arg(long, value_enum, default_value = "both")]
    pub direction: PerfDirectionArg,
    /// Send UDP datagrams at --rate instead of TCP, and report loss, jitter and reordering.
    #[arg(short = 'u', long)]
    pub udp: bool,
    /// UDP: the rate to send at, in bits/s.
    #[arg(short = 'b', long, value_name = "RATE", default_value = "100M", value_parser = parse_rate)]
    pub rate: u64,
    /// UDP: bytes of payload per datagram (36 to 9000).
    #[arg(short = 'l', long, value_name = "BYTES", default_value_t = 1400)]
    pub length: u32,
    /// TCP: explicit socket buffer on both ends [default: as a copy plans it]
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub buffer: Option<u64>,
    /// TCP: congestion control of the sending sockets, e.g. bbr or cubic [default: the
    /// sending host's]
    #[arg(long, value_name = "NAME")]
    pub congestion: Option<String>,
    /// TCP: data streams over TLS, to measure what `--protect private` costs.
    #[arg(long)]
    pub private: bool,
    /// The link rate the default stream count plans for, in bits/s.
    #[arg(long, value_name = "RATE", default_value = "10G", value_parser = parse_rate)]
    pub link_rate: u64,
    /// Print the results as JSON (intervals included).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub creds: EndpointCredArgs,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum PerfDirectionArg {
    /// This host sends to the endpoint.
    Send,
    /// The endpoint sends to this host (iperf3 -R).
    Receive,
    /// Send, then receive.
    Both,
}

#[derive(Subcommand, Debug)]
pub enum TraceCommand {
    /// Percentiles of throughput (in total and per stream), cwnd and RTT, and where the time
    /// went (receiver window, send buffer, network; storage reads).
    Summary(TraceSummaryArgs),
    /// Draw throughput per stream and in total, cwnd, RTT and retransmits over time (SVG).
    Plot(TracePlotArgs),
}

#[derive(Args, Debug)]
pub struct TraceSummaryArgs {
    /// A trace file (JSON lines).
    pub file: PathBuf,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Example:\n  haul cp --trace run.trace big.nc haul://dtn.example.org/data/\n  haul trace plot run.trace -o run.svg"
)]
pub struct TracePlotArgs {
    /// A trace file (JSON lines).
    pub file: PathBuf,
    /// The picture to write (SVG).
    #[arg(short, long, value_name = "OUT.svg")]
    pub output: PathBuf,
}

/// Traces of an endpoint's sessions.
#[derive(Args, Debug, Clone)]
pub struct TraceDirArgs {
    /// Trace every session this endpoint sends in (downloads from it, pushes to other
    /// endpoints) into DIR/<session id>.trace.jsonl: each data stream's TCP_INFO and the
    /// storage side every 10 ms (`haul trace summary|plot` read them).
    #[arg(long, value_name = "DIR")]
    pub trace_dir: Option<PathBuf>,
}

impl TraceDirArgs {
    /// The trace directory, checked to be a directory.
    pub fn dir(&self) -> Result<Option<PathBuf>, transfer::TransferError> {
        let Some(d) = &self.trace_dir else {
            return Ok(None);
        };
        match std::fs::metadata(d) {
            Ok(m) if m.is_dir() => Ok(Some(d.clone())),
            Ok(_) => Err(transfer::TransferError::not_writable(format!(
                "--trace-dir {}: not a directory",
                d.display()
            ))),
            Err(e) => Err(transfer::TransferError::not_writable(format!(
                "--trace-dir {}: {e}",
                d.display()
            ))),
        }
    }
}

impl TransferLogArgs {
    /// Opens the transfer log, if one is asked for; `site` is this host's site.
    pub fn open(
        &self,
        site: Option<String>,
    ) -> Result<Option<std::sync::Arc<transfer::translog::TransferLog>>, transfer::TransferError>
    {
        let Some(path) = &self.log_transfer else {
            return Ok(None);
        };
        let format = self
            .log_transfer_format
            .parse()
            .map_err(transfer::TransferError::usage)?;
        let log = transfer::translog::TransferLog::open(path, format)?.with_site(site);
        Ok(Some(std::sync::Arc::new(log)))
    }
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Copy files or trees between local paths and endpoints, or between two endpoints.
    Cp(CpArgs),
    /// Read traces made with `haul cp --trace` or an endpoint's `--trace-dir`.
    #[command(subcommand)]
    Trace(TraceCommand),
    /// Check this host (and, with an endpoint, the path and the endpoint's limits) for what
    /// holds transfers back, and print the commands that fix it.
    Doctor(DoctorArgs),
    /// Measure the path to an endpoint memory to memory, over its own port and authentication:
    /// TCP throughput, retransmits and RTT per interval, or UDP loss, jitter and reordering.
    Perf(PerfArgs),
    /// Export a directory tree as a standalone endpoint.
    Serve(ServeArgs),
    /// Manage a certificate authority.
    #[command(subcommand)]
    Ca(CaCommand),
    /// Issue certificates.
    #[command(subcommand)]
    Cert(CertCommand),
    /// Run a whole grid on this machine: metadata server and two sites of two nodes on
    /// loopback; a climate-like dataset copied in, replicated to the other site, verified on the
    /// nodes, downloaded and compared.
    Demo(DemoArgs),
    /// The grid's metadata server.
    #[command(subcommand)]
    Meta(MetaCommand),
    /// A grid storage node.
    #[command(subcommand)]
    Node(NodeCommand),
    /// List a grid directory: haul ls [-l] haul://META/path
    Ls(LsArgs),
    /// Show grid entries.
    Stat(PathsArgs),
    /// Create grid directories.
    Mkdir(MkdirArgs),
    /// Remove grid files or directories (their replicas are deleted by the nodes).
    Rm(RmArgs),
    /// Rename or move a grid entry (the data does not move).
    Mv(MvArgs),
    /// Change permissions of grid entries: haul chmod 750 haul://META/path
    Chmod(ChmodArgs),
    /// Change owner and/or group of grid entries: haul chown alice:atlas haul://META/path
    Chown(ChownArgs),
    /// Extended attributes of grid entries.
    #[command(subcommand)]
    Xattr(XattrCommand),
    /// Every replica of grid files: node, site, state, checksum.
    Where(PathsArgs),
    /// Capacity and use per storage node and per site.
    Df(GridArgs),
    /// Mount a grid directory as a local file system (FUSE) for unmodified programs:
    /// haul mount haul://META/path MOUNTPOINT. Runs until unmounted (umount, fusermount3 -u)
    /// or interrupted (Ctrl-C, SIGTERM), then unmounts.
    Mount(MountArgs),
    /// The storage node registry with health.
    Nodes(GridArgs),
    /// Which identity the metadata server maps your certificate to.
    Whoami(GridArgs),
    /// A sign-in link for the metadata server's dashboard (live copies, throughput, failures,
    /// your transfers): open it in a browser within two minutes.
    Dashboard(GridArgs),
    /// Make replicas of grid files or trees, node to node, in parallel.
    Replicate(ReplicateArgs),
    /// Replica policies kept by the metadata server.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Recompute checksums of replicas on the nodes; mark and repair damaged ones.
    Verify(VerifyArgs),
    /// Replica policies, the reconciler's progress, nodes and recent events.
    Status(GridArgs),
    /// The grid's transfer history, newest first: haul transfers --failed --since 1d
    #[command(after_help = TRANSFERS_HELP)]
    Transfers(TransfersArgs),
    /// Hand copies to the metadata server as a job it keeps and does node to node, retrying
    /// for hours, whatever happens to this process: haul submit -r haul://META/a /b
    #[command(after_help = SUBMIT_HELP)]
    Submit(SubmitArgs),
    /// Your transfer jobs, newest first (`haul job show ID` for one).
    Jobs(JobsArgs),
    /// One transfer job: show, cancel, retry, wait.
    #[command(subcommand)]
    Job(JobCommand),
    /// Run a command once per grid file on a node holding it: haul run PATH... -- CMD {}
    #[command(after_help = RUN_HELP)]
    Run(RunArgs),
    /// Print a shell completion script: haul completions bash > /etc/bash_completion.d/haul
    Completions(CompletionsArgs),
    /// Write the manual pages (haul.1 and haul-SUBCOMMAND.1) into a directory, or haul.1 to
    /// stdout: haul man --dir /usr/local/share/man/man1
    Man(ManArgs),
    /// Emulated long fat networks for tests and benchmarks (`haul netlab --help`).
    #[command(disable_help_flag = true)]
    Netlab {
        /// Arguments of the netlab command line.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

const TRANSFERS_HELP: &str = "\
Every transfer that touched the grid is recorded by the metadata server: uploads, downloads
and copies within the grid (sent by the client at its end), replication, repairs and the
reconciler's copies (kind replicate, repair, reconcile) and runs. You see your own;
administrators see everybody's (--user narrows). Records are kept as `meta serve
--history-keep` and `--history-max` say (90 days, 1,000,000 records by default).

Examples:
  haul transfers                          # your last 50
  haul transfers --failed --since 1d      # what failed today, and why
  haul transfers --site KEK --kind replicate --json
  haul transfers --id 1234                # one transfer, each file's outcome
  haul transfers --live                   # copies in progress: progress, rate, ETA, streams

Copies in progress (--live) are those of clients that report them (every haul cp and haul
run to, from or within the grid does, every 3 s) and the server's own replication, repair
and reconciler runs. A client silent for 30 s is dropped from the list and its copy recorded
as abandoned (kind cancelled).";

/// `haul transfers`.
#[derive(Args, Debug)]
pub struct TransfersArgs {
    /// The metadata server: haul://host[:port] [default: $HAUL_META]
    #[arg(value_name = "META", env = "HAUL_META")]
    pub meta: Option<String>,
    /// One transfer in full, with each file's outcome.
    #[arg(long, value_name = "ID", conflicts_with = "live")]
    pub id: Option<i64>,
    /// The copies in progress instead of the history.
    #[arg(long, conflicts_with_all = ["user", "site", "kind", "since", "failed", "before"])]
    pub live: bool,
    /// Only this user's transfers (others' need administrator rights).
    #[arg(long, value_name = "USER")]
    pub user: Option<String>,
    /// Only transfers with either end at this site.
    #[arg(long, value_name = "SITE")]
    pub site: Option<String>,
    /// Only this kind.
    #[arg(long, value_parser = ["upload", "download", "copy", "run", "replicate", "repair", "reconcile", "drain", "job"])]
    pub kind: Option<String>,
    /// Only transfers that ended since then: a duration back from now (30m, 1h, 7d) or an
    /// RFC 3339 time.
    #[arg(long, value_name = "WHEN")]
    pub since: Option<String>,
    /// Only transfers in which something failed.
    #[arg(long)]
    pub failed: bool,
    /// Transfers to list at most (the newest).
    #[arg(long, value_name = "N", default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub limit: u32,
    /// Only transfers older than this id (the next page).
    #[arg(long, value_name = "ID")]
    pub before: Option<i64>,
    /// Print JSON on stdout (a document with "version": 1).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub creds: CredArgs,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  haul completions bash > /etc/bash_completion.d/haul\n  haul completions zsh > \"${fpath[1]}/_haul\"\n  haul completions fish > ~/.config/fish/completions/haul.fish"
)]
pub struct CompletionsArgs {
    /// The shell the script is for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(Args, Debug)]
pub struct ManArgs {
    /// Write haul.1 and a page per subcommand (haul-cp.1, haul-meta-serve.1, ...) into DIR
    /// (created if missing) instead of haul.1 to stdout.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// Where TLS credentials come from. The grid's commands and daemons always use them: only
/// the commands that may talk to a standalone endpoint add `--insecure` ([`EndpointCredArgs`]).
#[derive(Args, Debug, Clone)]
pub struct CredArgs {
    /// Certificate (PEM) [default: ~/.haul/cert.pem]
    #[arg(long, env = "HAUL_CERT", value_name = "FILE")]
    pub cert: Option<PathBuf>,
    /// Private key of the certificate (PEM) [default: ~/.haul/key.pem]
    #[arg(long, env = "HAUL_KEY", value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// CA certificate(s) to trust (PEM) [default: ~/.haul/ca.pem]
    #[arg(long, env = "HAUL_CA", value_name = "FILE")]
    pub ca: Option<PathBuf>,
}

/// Credentials of a command that may talk to a standalone endpoint (`cp`, `serve`, `perf`,
/// `doctor`): TLS, or `--insecure` for local tests.
#[derive(Args, Debug, Clone)]
pub struct EndpointCredArgs {
    #[command(flatten)]
    pub tls: CredArgs,
    /// No TLS and no certificates: for local tests with standalone endpoints only (the grid
    /// always needs certificates). Anyone who can reach the port can read and write. Both
    /// sides must use it.
    #[arg(long)]
    pub insecure: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum ProtectArg {
    /// Data streams in clear text; integrity still guaranteed by block CRCs and file checksums.
    Clear,
    /// Data streams encrypted with TLS 1.3; fails if that cannot be had.
    Private,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum ProgressArg {
    /// A progress bar when stderr is a terminal; otherwise nothing until the summary line.
    Auto,
    /// A progress bar on a terminal; otherwise a status line every --progress-interval (for
    /// logs).
    Always,
    /// No bar and no status lines; failures and the summary line are still printed.
    Never,
}

/// How progress is shown on stderr.
#[derive(Args, Debug, Clone)]
pub struct ProgressArgs {
    /// Progress on stderr.
    #[arg(long = "progress", value_enum, default_value = "auto")]
    pub mode: ProgressArg,
    /// With --progress always and stderr not a terminal: one status line this often (bytes,
    /// files, rate over the interval, ETA).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_progress_interval)]
    pub progress_interval: std::time::Duration,
}

fn parse_progress_interval(s: &str) -> Result<std::time::Duration, String> {
    let d = parse_duration(s)?;
    if d < std::time::Duration::from_millis(100) {
        return Err(format!("{s}: at least 100ms"));
    }
    Ok(d)
}

const CP_EXAMPLES: &str = "\
Examples:
  Upload a file to an endpoint:
    haul cp run42.nc haul://dtn1.example.org/data/
  Download a tree:
    haul cp -r haul://dtn1.example.org/cmip5/tas ./tas
  Third-party copy: the data flows from dtn1 straight to dtn2:
    haul cp -r haul://dtn1.example.org/cmip5 haul://dtn2.example.org/mirror/
  Resume an interrupted copy, sending only what is missing:
    haul cp --resume -r ./run42 haul://dtn2.example.org/runs/
  Cap the rate, encrypt, and record adler32 and md5 too:
    haul cp --rate 800M --protect private --checksum adler32,md5 big.h5 haul://dtn2:5811/in/
  A byte range of a file:
    haul cp --offset 1G --length 256M haul://dtn1/big.dat part.dat
  A file of the grid whose metadata server HAUL_META names (haul:///path: no host; a plain
  /path is a local path here):
    HAUL_META=haul://meta.example.org haul cp haul:///cmip/tas/tas_1.nc .

Without flags, haul picks streams from the path's round-trip time and both hosts' TCP
buffer limits, uses BBR when the host has it, checksums everything with CRC32C while it
streams, retries and resumes on failure, and stops a transfer that moves no data for 60 s.";

#[derive(Args, Debug)]
#[command(after_help = CP_EXAMPLES)]
pub struct CpArgs {
    /// Source: a local path, haul://host[:port]/path, or haul:///path on the grid HAUL_META
    /// names
    pub src: String,
    /// Destination: a local path, haul://host[:port]/path or haul:///path (an existing
    /// directory receives the source under its own name)
    pub dst: String,
    /// Copy directories recursively.
    #[arg(short, long)]
    pub recursive: bool,
    /// Parallel TCP streams [default: planned from RTT, buffer limits and data size]
    #[arg(short = 'p', long = "parallel", value_name = "N", value_parser = clap::value_parser!(u32).range(1..=256))]
    pub parallel: Option<u32>,
    /// Socket buffer per stream, e.g. 64M [default: kernel autotuning, or sized from RTT x rate]
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub tcp_buffer: Option<u64>,
    /// Congestion control for the data streams [default: the host's, switched to bbr on a
    /// stream whose losses are random rather than queue overflows]
    #[arg(long, value_name = "ALGO", value_parser = ["bbr", "cubic", "reno"])]
    pub cc: Option<String>,
    /// Rate cap for the whole transfer in bits/s, e.g. 800M, 2.5G; paced, not bursty.
    #[arg(long, value_name = "RATE", value_parser = parse_rate)]
    pub rate: Option<u64>,
    /// Files in flight at once.
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub concurrency: u32,
    /// Extra checksums, comma separated: adler32, md5, sha256, xxh3 (crc32c is always on).
    #[arg(long, value_name = "LIST", default_value = "crc32c")]
    pub checksum: String,
    /// Resume from restart markers left by an interrupted transfer; files already complete at
    /// the destination (same size and mtime) are skipped.
    #[arg(long)]
    pub resume: bool,
    /// Copy only from this byte offset of a single file (e.g. 1G).
    #[arg(long, value_name = "BYTES", value_parser = parse_size, requires = "length")]
    pub offset: Option<u64>,
    /// Copy only this many bytes of a single file.
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    pub length: Option<u64>,
    /// Cancel and resume a transfer that moves no data for this long (noticed within an eighth
    /// of it).
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub stall_timeout: std::time::Duration,
    /// Attempts after the first one, each resuming, with exponential back-off.
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub retries: u32,
    /// Protection of the data streams.
    #[arg(long, value_enum, default_value = "clear")]
    pub protect: ProtectArg,
    /// Block size.
    #[arg(long, value_name = "SIZE", default_value = "1M", value_parser = parse_size)]
    pub block_size: u64,
    /// Do not fsync files before renaming them into place (faster, less durable).
    #[arg(long)]
    pub no_fsync: bool,
    /// Send local files on clear streams from a buffer (read, then write) instead of with
    /// sendfile from the page cache: for measurements, or file systems whose sendfile misbehaves.
    #[arg(long)]
    pub no_zero_copy: bool,
    /// Bandwidth to plan for when no --rate is given, in bits/s.
    #[arg(long, value_name = "RATE", default_value = "10G", value_parser = parse_rate)]
    pub link_rate: u64,
    /// When receiving locally: how often restart markers are made durable.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    pub checkpoint_interval: std::time::Duration,
    /// Print a JSON summary on stdout.
    #[arg(long)]
    pub json: bool,
    /// Say at the end, in words, where the time went and the one factor that limited the
    /// copy, with the advice that removes it (also in --json as "bottleneck").
    #[arg(long)]
    pub explain: bool,
    /// This client's grid site: new files go to its storage nodes, reads prefer its replicas.
    #[arg(long, env = "HAUL_SITE", value_name = "NAME")]
    pub site: Option<String>,
    /// Grid copies: data sessions with storage nodes at once.
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub node_sessions: usize,
    #[command(flatten)]
    pub progress: ProgressArgs,
    #[command(flatten)]
    pub log: TransferLogArgs,
    /// Trace the copy into FILE: each data stream's TCP_INFO and the storage side every
    /// 10 ms, as JSON lines (`haul trace summary FILE`, `haul trace plot FILE -o out.svg`).
    /// This side must send (an upload); trace downloads on the endpoint (`--trace-dir`).
    /// An upload into the grid also sends its throughput over time to the transfer history
    /// (plotted on the dashboard's page of the transfer).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    #[command(flatten)]
    pub creds: EndpointCredArgs,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Example:\n  haul serve --root /data --listen 0.0.0.0:5811 \\\n      --cert host.pem --key host.key --ca ca.pem --mapfile mapfile"
)]
pub struct ServeArgs {
    /// Directory tree to export; no path may leave it.
    #[arg(long, value_name = "DIR")]
    pub root: PathBuf,
    /// Address to listen on.
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:5811")]
    pub listen: String,
    /// Mapfile: lines of "<certificate subject>" <local account>; unmapped subjects are
    /// refused. Started as root, each session reads and writes as its mapped account
    /// (which must exist on this host) [default: ~/.haul/mapfile]
    #[arg(long, env = "HAUL_MAPFILE", value_name = "FILE")]
    pub mapfile: Option<PathBuf>,
    /// Refuse writes.
    #[arg(long)]
    pub read_only: bool,
    #[command(flatten)]
    pub limits: ListenLimitArgs,
    /// Longest path test (`haul perf`) run for a client, in seconds; 0 refuses them.
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    pub perf_max_seconds: u64,
    /// Bandwidth to plan for when pushing to another endpoint, in bits/s.
    #[arg(long, value_name = "RATE", default_value = "10G", value_parser = parse_rate)]
    pub link_rate: u64,
    /// How often received files are synced and their restart markers recorded.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    pub checkpoint_interval: std::time::Duration,
    /// Print the bound address on stdout once listening (useful with port 0); with
    /// --metrics, followed by the metrics URL on the same line.
    #[arg(long)]
    pub print_addr: bool,
    #[command(flatten)]
    pub metrics: MetricsArgs,
    #[command(flatten)]
    pub log: TransferLogArgs,
    #[command(flatten)]
    pub trace: TraceDirArgs,
    #[command(flatten)]
    pub creds: EndpointCredArgs,
}

/// Prometheus metrics of a daemon.
#[derive(Args, Debug, Clone, Default)]
pub struct MetricsArgs {
    /// Serve Prometheus metrics at http://ADDR/metrics (plain HTTP, read-only: keep it on a
    /// trusted interface, e.g. 127.0.0.1:9812; port 0 for any) [default: none]
    #[arg(long = "metrics", value_name = "ADDR")]
    pub addr: Option<String>,
}

/// What a listener admits: connections in all and per source, and how long they may take.
#[derive(Args, Debug, Clone)]
pub struct ListenLimitArgs {
    /// Most connections at once (control and data), from all clients.
    #[arg(long, value_name = "N", default_value_t = 512)]
    pub max_connections: usize,
    /// Most connections at once from one address (IPv6: one /64), so that one host cannot take
    /// every slot; above the streams a client opens (16 per session).
    #[arg(long, value_name = "N", default_value_t = 128)]
    pub max_per_host: usize,
    /// A new connection must authenticate within this (TLS handshake, then the session proof
    /// of a data connection or the first request of a control connection), or it is closed.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub handshake_timeout: std::time::Duration,
    /// An authenticated control connection that sends no request for this long is closed.
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = parse_duration)]
    pub idle_timeout: std::time::Duration,
    /// Data streams one transfer session may open (binds beyond are refused).
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub max_streams: u32,
    /// Memory one receiving session may hold in block buffers (what a slow or hostile
    /// sender can make it keep).
    #[arg(long, value_name = "SIZE", default_value = "256MiB", value_parser = parse_size)]
    pub session_buffer: u64,
    /// Memory all receiving sessions together may hold in block buffers.
    #[arg(long, value_name = "SIZE", default_value = "1GiB", value_parser = parse_size)]
    pub max_buffer: u64,
}

impl ListenLimitArgs {
    /// The limits, or why they cannot work (a buffer budget smaller than the largest block
    /// would stall every transfer).
    pub fn limits(&self) -> Result<transfer::limits::Limits, String> {
        let block = wire::codec::MAX_BLOCK_LEN as u64;
        if self.session_buffer < block {
            return Err(format!(
                "--session-buffer must be at least {} (the largest block)",
                wire::units::format_bytes(block)
            ));
        }
        if self.max_buffer < self.session_buffer {
            return Err("--max-buffer must be at least --session-buffer".into());
        }
        Ok(transfer::limits::Limits {
            max_connections: self.max_connections,
            max_per_host: self.max_per_host,
            handshake_timeout: self.handshake_timeout,
            idle_timeout: self.idle_timeout,
            max_streams: self.max_streams,
            session_buffer: self.session_buffer,
            total_buffer: self.max_buffer,
            ..Default::default()
        })
    }
}

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Stop after the report instead of keeping the grid and its dashboard up until Ctrl-C.
    #[arg(long)]
    pub exit: bool,
    /// Files in the generated dataset.
    #[arg(long, default_value_t = 40)]
    pub files: usize,
    /// Median file size in MB (sizes are log-normal around it).
    #[arg(long, default_value_t = 2.0)]
    pub median_mb: f64,
    /// Put the demo's files under this directory and keep them (default: a temporary
    /// directory, removed at the end).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub enum CaCommand {
    /// Create a certificate authority (ca.pem, ca.key) in a directory.
    Init(CaInitArgs),
}

#[derive(Args, Debug)]
pub struct CaInitArgs {
    /// Directory for ca.pem and ca.key.
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
    /// Organization name in subjects.
    #[arg(long, default_value = "longhaul")]
    pub org: String,
    /// Validity in days.
    #[arg(long, default_value_t = 3650)]
    pub days: i64,
}

#[derive(Subcommand, Debug)]
pub enum CertCommand {
    /// Issue a host or user certificate signed by the CA.
    Issue(CertIssueArgs),
    /// Delegate your identity, for a while and on named endpoint paths only, to a credential
    /// another program may hold (`haul submit` makes one for the metadata server itself).
    Delegate(CertDelegateArgs),
}

#[derive(Args, Debug)]
#[command(
    after_help = "Example:\n  haul cert delegate --grant 'write haul://dtn.example.org/data/out' --hours 6 --out job\nWrites job.pem (the delegation, then your certificate) and job.key. An endpoint (haul serve)\nadmits its holder as you, for the grants only: reading below each read path, reading and\nwriting below each write path, at the endpoint the URL names. Nothing else (no grid access)."
)]
pub struct CertDelegateArgs {
    #[command(flatten)]
    pub creds: CredArgs,
    /// What the holder may do: "read haul://host[:port]/path" or "write haul://..." (repeat).
    #[arg(long = "grant", value_name = "SPEC", required = true)]
    pub grants: Vec<String>,
    /// Lifetime in hours (at most 720).
    #[arg(long, default_value_t = 12)]
    pub hours: u64,
    /// Output prefix: writes PREFIX.pem (chain) and PREFIX.key.
    #[arg(long, value_name = "PREFIX")]
    pub out: PathBuf,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  haul cert issue --ca ca/ --host dtn1.example.org --host 198.18.0.1 --out dtn1\n  haul cert issue --ca ca/ --user alice --out alice\nThe printed subject is what goes into endpoint mapfiles."
)]
pub struct CertIssueArgs {
    /// CA directory (from `haul ca init`).
    #[arg(long, value_name = "DIR")]
    pub ca: PathBuf,
    /// Output prefix: writes PREFIX.pem and PREFIX.key.
    #[arg(long, value_name = "PREFIX")]
    pub out: PathBuf,
    /// Host certificate for these DNS names or IP addresses (repeat for several; the first is
    /// the CN, a storage node's name). Prints the line that enrols it as a node.
    #[arg(
        long = "host",
        value_name = "NAME",
        conflicts_with = "user",
        required_unless_present = "user"
    )]
    pub hosts: Vec<String>,
    /// User certificate for this name (no / = , " \ or control characters). Prints the
    /// mapfile line.
    #[arg(long, value_name = "NAME")]
    pub user: Option<String>,
    /// Organization name in the subject (no / = , " \ or control characters).
    #[arg(long, default_value = "longhaul")]
    pub org: String,
    /// Validity in days from now.
    #[arg(long, default_value_t = 365)]
    pub days: i64,
    /// Explicit validity start (RFC 3339), e.g. for testing expiry.
    #[arg(long, value_name = "TIME", requires = "not_after")]
    pub not_before: Option<String>,
    /// Explicit validity end (RFC 3339).
    #[arg(long, value_name = "TIME", requires = "not_before")]
    pub not_after: Option<String>,
}

/// Options of every grid command.
#[derive(Args, Debug, Clone)]
pub struct GridArgs {
    /// The metadata server: haul://host[:port] (a grid path also names it) [default:
    /// $HAUL_META]
    #[arg(value_name = "META", env = "HAUL_META")]
    pub meta: Option<String>,
    /// Print JSON on stdout.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub creds: CredArgs,
}

/// `haul mount`.
#[derive(Args, Debug, Clone)]
pub struct MountArgs {
    /// The grid directory to mount: haul://META/path (or /path with HAUL_META set).
    #[arg(value_name = "GRID_DIR")]
    pub path: String,
    /// A local, empty directory to mount it on.
    #[arg(value_name = "MOUNTPOINT")]
    pub mountpoint: PathBuf,
    /// This client's grid site: reads prefer its replicas, new files go to its nodes.
    #[arg(long, env = "HAUL_SITE", value_name = "NAME")]
    pub site: Option<String>,
    /// Keep the block cache on disk in DIR, across mounts (checked against each file's size,
    /// mtime and checksum in the catalog; one running mount per DIR: a second is refused)
    /// [default: in memory, for this mount only].
    #[arg(long, value_name = "DIR")]
    pub cache: Option<PathBuf>,
    /// Bytes the block cache may hold (read-ahead included) [default: 4G on disk with
    /// --cache, 2G in memory].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub cache_size: Option<u64>,
    /// Read-ahead of a sequential reader at most: within it the window is sized from the
    /// round trip to the node (1 GiB per 100 ms, at least 64 MiB), fetched in four
    /// overlapping extents.
    #[arg(long, value_name = "SIZE", default_value = "1G", value_parser = parse_size)]
    pub read_ahead: u64,
    /// How long names and attributes are believed before the metadata server is asked again.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    pub attr_ttl: std::time::Duration,
    /// Deadline of each call to the metadata server (then ETIMEDOUT).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub meta_timeout: std::time::Duration,
    /// Data sessions with storage nodes at once, all open files together.
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub fetch_sessions: usize,
    /// Threads serving the kernel's requests.
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub threads: usize,
    /// Bandwidth to plan data sessions for, in bits/s.
    #[arg(long, value_name = "RATE", default_value = "10G", value_parser = parse_rate)]
    pub link_rate: u64,
    /// A data session with no progress for this long fails over to another replica.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub stall_timeout: std::time::Duration,
    /// Read every file through the kernel's page cache. By default files of 8 MiB and more
    /// are read, and all files written, with direct I/O (one copy less, a fraction of the
    /// CPU); the page cache serves programs that read a large file in small pieces faster.
    #[arg(long)]
    pub page_cache: bool,
    /// Send every write through this process. By default, where the kernel allows it (FUSE
    /// passthrough: CAP_SYS_ADMIN, and a spool directory whose timestamps move with every
    /// write, as Linux 6.13's on ext4, xfs, btrfs and tmpfs), it writes a file's spool itself
    /// and the mount only uploads it at close: about half the mount's CPU. Through the mount,
    /// the CRC of each block is recorded as it is written, so a spool changed behind the
    /// mount's back is refused at close, and the upload need not read the spool to checksum it.
    #[arg(long)]
    pub no_passthrough: bool,
    #[command(flatten)]
    pub creds: CredArgs,
}

/// Grid paths: haul://META/path, or /path with HAUL_META set.
#[derive(Args, Debug, Clone)]
pub struct PathsArgs {
    /// Grid paths: haul://META/path, or /path (and haul:///path) with HAUL_META set.
    #[arg(value_name = "PATH", required = true)]
    pub paths: Vec<String>,
    /// Print JSON on stdout.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub creds: CredArgs,
}

#[derive(Args, Debug, Clone)]
pub struct LsArgs {
    /// Long format: mode, owner, group, size, modification time, name.
    #[arg(short, long)]
    pub long: bool,
    /// Show sizes in binary units: KiB, MiB, GiB (as `ls -lh`).
    #[arg(short = 'H', long)]
    pub human: bool,
    #[command(flatten)]
    pub p: PathsArgs,
}

#[derive(Args, Debug, Clone)]
pub struct MkdirArgs {
    /// Create missing parents; an existing directory is not an error.
    #[arg(short, long)]
    pub parents: bool,
    /// Permission bits (octal).
    #[arg(short, long, value_name = "MODE", default_value = "755", value_parser = parse_mode)]
    pub mode: u32,
    #[command(flatten)]
    pub p: PathsArgs,
}

#[derive(Args, Debug, Clone)]
pub struct RmArgs {
    /// Remove directories and everything below them.
    #[arg(short, long)]
    pub recursive: bool,
    #[command(flatten)]
    pub p: PathsArgs,
}

#[derive(Args, Debug, Clone)]
pub struct MvArgs {
    /// Entry to move: haul://META/path
    pub from: String,
    /// New path (same metadata server); an existing file is replaced, an existing directory
    /// receives the entry under its name.
    pub to: String,
    #[command(flatten)]
    pub creds: CredArgs,
}

#[derive(Args, Debug, Clone)]
pub struct ChmodArgs {
    /// Permission bits (octal), e.g. 750 or 1777.
    #[arg(value_parser = parse_mode)]
    pub mode: u32,
    #[command(flatten)]
    pub p: PathsArgs,
}

#[derive(Args, Debug, Clone)]
pub struct ChownArgs {
    /// OWNER, OWNER:GROUP or :GROUP
    pub owner: String,
    #[command(flatten)]
    pub p: PathsArgs,
}

#[derive(Subcommand, Debug)]
pub enum XattrCommand {
    /// Print one attribute.
    Get(XattrNameArgs),
    /// Set an attribute.
    Set(XattrSetArgs),
    /// List attributes with their values.
    List(PathsArgs),
    /// Remove an attribute.
    Rm(XattrNameArgs),
}

#[derive(Args, Debug, Clone)]
pub struct XattrNameArgs {
    /// Grid path: haul://META/path, or /path with HAUL_META set.
    pub path: String,
    /// Attribute name, e.g. user.experiment (names under haul. are the grid's own).
    pub name: String,
    #[command(flatten)]
    pub creds: CredArgs,
}

#[derive(Args, Debug, Clone)]
pub struct XattrSetArgs {
    /// Grid path: haul://META/path, or /path with HAUL_META set.
    pub path: String,
    /// Attribute name, e.g. user.experiment.
    pub name: String,
    /// Attribute value (text).
    pub value: String,
    #[command(flatten)]
    pub creds: CredArgs,
}

#[derive(Subcommand, Debug)]
pub enum MetaCommand {
    /// Run the metadata server.
    Serve(MetaServeArgs),
}

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  haul meta serve --data /var/lib/haul-meta \\\n      --cert meta.pem --key meta.key --ca ca.pem --mapfile mapfile\n  haul meta serve --db postgres://haul@dbhost/haul ...   (several servers may share it)"
)]
pub struct MetaServeArgs {
    /// Catalog database: postgres://user@host/db [default: SQLite in --data]
    #[arg(long, env = "HAUL_META_DB", value_name = "URL")]
    pub db: Option<String>,
    /// Directory of the SQLite catalog (and its lock) [default: ~/.haul/meta]
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Address of the gRPC API.
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:5811")]
    pub listen: String,
    /// Address of the dashboard, JSON status and /metrics (plain HTTP; keep it on a trusted
    /// interface); "off" for none.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:5880")]
    pub http: String,
    /// Mapfile: "<certificate subject>" <user> lines [default: ~/.haul/mapfile]
    #[arg(long, env = "HAUL_MAPFILE", value_name = "FILE")]
    pub mapfile: Option<PathBuf>,
    /// Groups file: "group: user1 user2" lines (a user's first group is their primary one).
    #[arg(long, value_name = "FILE")]
    pub groups: Option<PathBuf>,
    /// Administrators (may do anything in the namespace); repeat for several.
    #[arg(long = "admin", value_name = "USER", default_value = "root")]
    pub admins: Vec<String>,
    /// Storage nodes allowed to join: "NAME [sha256:FINGERPRINT]" lines, as `haul cert issue
    /// --host` prints them (re-read when it changes). Without it no node may join.
    #[arg(long, value_name = "FILE")]
    pub nodes: Option<PathBuf>,
    /// How often storage nodes report.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_duration)]
    pub heartbeat: std::time::Duration,
    /// A node silent for this long is down and its replicas do not count.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub node_timeout: std::time::Duration,
    /// Files on a node that the catalog does not know are removed after this long.
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = parse_duration)]
    pub orphan_grace: std::time::Duration,
    /// Uploads that never finish are dropped after this long.
    #[arg(long, value_name = "DURATION", default_value = "24h", value_parser = parse_duration)]
    pub pending_grace: std::time::Duration,
    /// How often replica policies are checked (also after every change).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub reconcile_every: std::time::Duration,
    /// How long a capability (a node's permission for one transfer) is valid; clients renew
    /// them in longer transfers.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_duration)]
    pub grant_ttl: std::time::Duration,
    /// A replica being made by a copy of the server's (replication, repair) counts as being
    /// written this long after the copy last renewed it; then it is dropped (copies renew it
    /// every third of this while they run).
    #[arg(long, value_name = "DURATION", default_value = "1m", value_parser = parse_duration)]
    pub writing_lease: std::time::Duration,
    /// Verify (and repair) every replica this often, e.g. 7d [default: off]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub scrub_every: Option<std::time::Duration>,
    /// Transfer history: records that ended longer ago than this are dropped.
    #[arg(long, value_name = "DURATION", default_value = "90d", value_parser = parse_duration)]
    pub history_keep: std::time::Duration,
    /// Transfer history: beyond this many records, the oldest are dropped.
    #[arg(long, value_name = "N", default_value_t = 1_000_000)]
    pub history_max: u64,
    /// Transfer jobs: sessions of all jobs at once.
    #[arg(long, value_name = "N", default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub job_sessions: u32,
    /// Transfer jobs: sessions at once per link (source site to destination site) where the
    /// optimizer has learned nothing yet.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub job_link_sessions: u32,
    /// Transfer jobs: the most sessions the optimizer gives one link (it revises each link's
    /// number every few seconds from the goodput and loss it measures; equal to
    /// --job-link-sessions keeps it fixed).
    #[arg(long, value_name = "N", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub job_max_link_sessions: u32,
    /// Transfer jobs: data streams per link, shared by its sessions [default: each session
    /// plans its own]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub job_link_streams: Option<u32>,
    /// Transfer jobs: sessions at once with one standalone endpoint (all jobs and links
    /// together; a DTN's operators expect few).
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub job_endpoint_sessions: u32,
    /// Transfer jobs: files per session (the unit fair share hands out).
    #[arg(long, value_name = "N", default_value_t = 250, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub job_batch_files: u32,
    /// Transfer jobs: the wait after a file's first failed attempt, doubled after each
    /// further one (at most an hour).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub job_retry_delay: std::time::Duration,
    /// Transfer jobs: webhooks may reach loopback, private and link-local addresses (refused
    /// by default: a user could otherwise make the server call into its own networks).
    #[arg(long)]
    pub job_webhooks_to_private: bool,
    /// Transfer jobs: a fair-share weight, user:NAME=W or group:NAME=W (default 1; repeat).
    /// Groups share first, then the users within a group.
    #[arg(long = "share", value_name = "WHO=WEIGHT")]
    pub shares: Vec<String>,
    #[command(flatten)]
    pub limits: ListenLimitArgs,
    /// Print the bound API address on stdout once listening (useful with port 0).
    #[arg(long)]
    pub print_addr: bool,
    /// Replication and repair copies, and refused authentications, are recorded here.
    #[command(flatten)]
    pub log: TransferLogArgs,
    #[command(flatten)]
    pub creds: CredArgs,
}

#[derive(Subcommand, Debug)]
pub enum NodeCommand {
    /// Run a storage node.
    Serve(Box<NodeServeArgs>),
    /// Drain a node (administrators): it takes no new files, and its replicas are copied to
    /// other nodes (its own site first) while every policy holds, then removed from it.
    #[command(after_help = NODE_DRAIN_HELP)]
    Drain(NodeDrainArgs),
    /// Remove a stopped node from the registry (administrators): once drained, or with
    /// --force when its disk is lost.
    #[command(after_help = NODE_REMOVE_HELP)]
    Remove(NodeRemoveArgs),
}

const NODE_DRAIN_HELP: &str = "Progress shows in `haul status`, `haul nodes` (state \"draining\", then \"drained\"), the dashboard and /metrics (haul_node_draining, haul_reconcile_moving_files).\n\
Files under a policy keep it throughout; other files keep as many copies as they had when the drain began. A drain stalls (`haul status` counts the files short of their policy) while a policy cannot be kept without the node, e.g. when it is the last node of a site the policy names.\n\n\
Example:\n  haul node drain a1 haul://meta.example.org --wait\n  (stop the node)\n  haul node remove a1 haul://meta.example.org\n\n\
Exit status: 0 done (with --wait: drained), 1 with --wait: --timeout passed first, 2 bad arguments, 3 unknown node, 4 metadata server unreachable, 5 not an administrator.";

const NODE_REMOVE_HELP: &str = "A node is removed only when it is stopped (a running one would register again at its next heartbeat; to keep it out, also take its line out of the metadata server's --nodes file). Without --force it must hold no replica (drain it first).\n\
--force drops the records of the replicas it holds: files under a policy get their missing copies made again from the others; files whose only copy was there are lost (their count and first paths are printed, and they stay listed so that they can be uploaded again).\n\n\
Exit status: 0 removed, 2 bad arguments, 3 unknown node, 4 metadata server unreachable, 5 not an administrator, 6 the node is running or still holds replicas (drain it, or --force).";

#[derive(Args, Debug)]
pub struct NodeDrainArgs {
    /// The node's name, as `haul nodes` lists it.
    #[arg(value_name = "NODE")]
    pub node: String,
    /// End the drain: the node takes new files again (copies already moved stay where they are).
    #[arg(long)]
    pub cancel: bool,
    /// Wait until the node holds no replica, printing progress on stderr.
    #[arg(long, conflicts_with = "cancel")]
    pub wait: bool,
    /// With --wait: give up (exit 1; the drain goes on) after this long [default: no limit]
    #[arg(long, value_name = "DURATION", requires = "wait", value_parser = parse_duration)]
    pub timeout: Option<std::time::Duration>,
    #[command(flatten)]
    pub grid: GridArgs,
}

#[derive(Args, Debug)]
pub struct NodeRemoveArgs {
    /// The node's name, as `haul nodes` lists it.
    #[arg(value_name = "NODE")]
    pub node: String,
    /// Remove it although it holds replicas (its disk is lost): they are dropped from the catalog.
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub grid: GridArgs,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Example:\n  haul node serve --meta haul://meta.example.org --site KEK \\\n      --root /data/haul --listen 0.0.0.0:5812 \\\n      --cert node1.pem --key node1.key --ca ca.pem\nThe node's name is its host certificate's CN (--name must agree). The metadata server admits it only if its --nodes file lists it: add the line `haul cert issue --host` printed (a refused node logs the line and keeps trying)."
)]
pub struct NodeServeArgs {
    /// The metadata server: haul://host[:port]
    #[arg(long, env = "HAUL_META", value_name = "URL")]
    pub meta: String,
    /// The node's site (replicas are spread over sites; readers prefer their own).
    #[arg(long, value_name = "NAME")]
    pub site: String,
    /// Directory holding the node's replicas.
    #[arg(long, value_name = "DIR")]
    pub root: PathBuf,
    /// Node name [default: the CN of the host certificate]
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Address of the data service.
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:5812")]
    pub listen: String,
    /// Address others reach the data service at [default: --listen, with the certificate's
    /// name for an unspecified host]
    #[arg(long, value_name = "HOST:PORT")]
    pub advertise: Option<String>,
    /// Capacity to offer (e.g. 500G) [default: the file system's]
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub capacity: Option<u64>,
    /// Bandwidth to plan for when pushing to another node, in bits/s.
    #[arg(long, value_name = "RATE", default_value = "10G", value_parser = parse_rate)]
    pub link_rate: u64,
    #[command(flatten)]
    pub limits: ListenLimitArgs,
    /// Longest path test (`haul perf`) run for a client, in seconds; 0 refuses them.
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    pub perf_max_seconds: u64,
    /// Print the bound data address on stdout once listening; with --metrics, followed by the
    /// metrics URL on the same line.
    #[arg(long)]
    pub print_addr: bool,
    #[command(flatten)]
    pub metrics: MetricsArgs,
    #[command(flatten)]
    pub log: TransferLogArgs,
    #[command(flatten)]
    pub trace: TraceDirArgs,
    #[command(flatten)]
    pub creds: CredArgs,
}

#[derive(Args, Debug, Clone)]
#[command(
    after_help = "Examples:\n  haul replicate -r haul://meta/cmip5 --copies 2 --site RIKEN --site BNL\n  haul replicate haul://meta/run1.nc --copies 3\nInterrupt it at any time; running it again finishes what is missing."
)]
pub struct ReplicateArgs {
    /// Complete copies each file must have in total.
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub copies: u32,
    /// A site that must hold a copy (repeat for several).
    #[arg(long = "site", value_name = "NAME")]
    pub sites: Vec<String>,
    /// Replicate directories recursively.
    #[arg(short, long)]
    pub recursive: bool,
    /// Protection of the node-to-node data streams; files uploaded with --protect private are
    /// always copied privately.
    #[arg(long, value_enum, default_value = "clear")]
    pub protect: ProtectArg,
    #[command(flatten)]
    pub progress: ProgressArgs,
    #[command(flatten)]
    pub p: PathsArgs,
}

const RUN_HELP: &str = "\
Placeholders in CMD:
  {}       the replica's path on the node
  {name}   the grid file's name        {path}  its grid path
  {out}    the task's output (and working) directory; with --output, every file left
           there is registered under that grid directory, on the node that wrote it
Tasks run as the local account of the same name as your grid identity (never as root), with
HAUL_INPUT, HAUL_OUTPUT, HAUL_GRID_PATH, HAUL_NODE and HAUL_TASK set. Each task's stdout is
printed when it ends (stderr too); the first 64 KiB of each are kept. A task whose node fails
runs again on another node holding the file.

Examples:
  haul run /cmip/tas -- md5sum {}
  haul run --output /cmip/means --parallel 4 /cmip/tas -- sh -c 'cdo timmean {} {out}/{name}'

Exit codes: 0 every task exited 0; 1 some task failed (summary on stderr); 3, 4, 5 as for
other grid commands when nothing could run.";

const SUBMIT_HELP: &str = "\
Sources and destinations are grid paths of one metadata server (haul://META/path, or /path
with HAUL_META set). A destination ending in / or naming a directory receives the source
under its own name; with -r a directory source is copied as a tree. A list file (-f) has one
\"SOURCE DESTINATION\" pair per line; blank lines and lines starting with # are skipped.

One side of a pair may be a standalone endpoint (haul serve): haul://dtn.example.org/path.
The server then acts there as you, with a delegation this command signs for exactly those
paths (read for sources, write for destinations), living until --deadline or
--delegate-hours; the endpoint must trust the grid's CA and map you. The data goes between
the nodes and the endpoint directly.

The job is kept in the catalog: it survives restarts of the metadata server and of the nodes,
and this command may end (or the laptop sleep) at once. Files already at the destination with
the source's checksum are not copied again; one that differs is refused unless --overwrite.
Failed attempts are retried after a back-off that doubles (30 s, 1 min, ... at most 1 h) up to
--tries; jobs of higher --priority go first, and users share what is left fairly.

Follow it with: haul jobs, haul job show ID, haul job wait ID (exits with the job's code).";

/// `haul submit`.
#[derive(Args, Debug)]
pub struct SubmitArgs {
    /// SOURCE DESTINATION pairs: grid paths (haul://META/path), and on one side of a pair
    /// a standalone endpoint's path (haul://dtn.example.org/path) if you like.
    #[arg(value_name = "SRC DST")]
    pub pairs: Vec<String>,
    /// Read SOURCE DESTINATION pairs from this file, one per line (- for stdin).
    #[arg(short = 'f', long = "file", value_name = "LIST")]
    pub list: Option<PathBuf>,
    /// Copy directories as trees.
    #[arg(short, long)]
    pub recursive: bool,
    /// 1 (lowest) to 5 (highest).
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=5))]
    pub priority: u32,
    /// Put the copies at this site [default: wherever the grid places them].
    #[arg(long, value_name = "NAME")]
    pub site: Option<String>,
    /// Replace destination files that differ from their source.
    #[arg(long)]
    pub overwrite: bool,
    /// Attempts per file [default: 10].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100))]
    pub tries: Option<u32>,
    /// Files not done by then fail: a duration from now (12h, 3d) or an RFC 3339 time.
    #[arg(long, value_name = "WHEN")]
    pub deadline: Option<String>,
    /// Cap each of the job's sessions at this rate (bits/s), e.g. 500M.
    #[arg(long, value_name = "RATE", value_parser = parse_rate)]
    pub rate: Option<u64>,
    /// POST a JSON document to this http:// or https:// URL when the job ends.
    #[arg(long, value_name = "URL")]
    pub webhook: Option<String>,
    /// Pairs with standalone endpoints: the server acts there as you with a delegation of
    /// exactly their paths, living this many hours (or until --deadline if sooner; max 720).
    #[arg(long, value_name = "HOURS", default_value_t = 168)]
    pub delegate_hours: u64,
    /// Wait for the job to end and exit with its code.
    #[arg(long)]
    pub wait: bool,
    /// Print JSON on stdout (a document with "version": 1).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub creds: CredArgs,
}

/// `haul jobs`.
#[derive(Args, Debug)]
pub struct JobsArgs {
    /// The metadata server: haul://host[:port] [default: $HAUL_META]
    #[arg(value_name = "META", env = "HAUL_META")]
    pub meta: Option<String>,
    /// Only queued and running jobs.
    #[arg(long)]
    pub active: bool,
    /// Everybody's jobs (administrators).
    #[arg(long)]
    pub all: bool,
    /// Jobs to list at most (the newest).
    #[arg(long, value_name = "N", default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub limit: u32,
    /// Only jobs older than this id (the next page).
    #[arg(long, value_name = "ID")]
    pub before: Option<i64>,
    /// Print JSON on stdout (a document with "version": 1).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub creds: CredArgs,
}

/// One job by id, on a metadata server.
#[derive(Args, Debug)]
pub struct JobIdArgs {
    /// The job's number (as `haul submit` printed it).
    #[arg(value_name = "ID")]
    pub id: i64,
    /// The metadata server: haul://host[:port] [default: $HAUL_META]
    #[arg(value_name = "META", env = "HAUL_META")]
    pub meta: Option<String>,
    /// Print JSON on stdout (a document with "version": 1).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub creds: CredArgs,
}

#[derive(Subcommand, Debug)]
pub enum JobCommand {
    /// A job's state and each of its files (source, destination, state, tries, node, error).
    Show {
        #[command(flatten)]
        job: JobIdArgs,
        /// Only files in this state.
        #[arg(long, value_parser = ["queued", "running", "done", "failed", "cancelled"])]
        state: Option<String>,
    },
    /// Cancel a job: queued files are dropped, copies in progress stopped (nothing is left
    /// under a destination's name that did not arrive whole).
    Cancel(JobIdArgs),
    /// Queue an ended job's failed and cancelled files again.
    Retry(JobIdArgs),
    /// Wait for a job to end; exit with its code (0 done, 130 cancelled, else the first
    /// failure's).
    Wait {
        #[command(flatten)]
        job: JobIdArgs,
        /// Give up waiting after this long (exit 8; the job goes on).
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        timeout: Option<std::time::Duration>,
    },
}

/// `haul run`.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Tasks at once on each node.
    #[arg(short = 'P', long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub parallel: u32,
    /// Grid directory (existing, writable) where the files tasks write to {out} are registered.
    #[arg(short, long, value_name = "DIR")]
    pub output: Option<String>,
    /// Kill a task after this long (e.g. 30s, 10m).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub timeout: Option<std::time::Duration>,
    /// Prefer nodes of this site when a file has replicas at several [default: $HAUL_SITE].
    #[arg(long, env = "HAUL_SITE", value_name = "NAME")]
    pub site: Option<String>,
    /// Do not print the tasks' output as they end (the summary still is).
    #[arg(short, long)]
    pub quiet: bool,
    /// Print a JSON report of every task on stdout instead of their output.
    #[arg(long)]
    pub json: bool,
    /// Grid files or directories (every file below), then -- and the command.
    #[arg(value_name = "PATH", required = true)]
    pub paths: Vec<String>,
    /// The command and its arguments (after --).
    #[arg(last = true, value_name = "CMD", required = true)]
    pub command: Vec<String>,
    #[command(flatten)]
    pub creds: CredArgs,
}

#[derive(Subcommand, Debug)]
pub enum PolicyCommand {
    /// Keep N copies (at these sites) of every file below PATH, now and later.
    Set(PolicySetArgs),
    /// Remove the policy of PATH.
    Clear(PathsArgs),
    /// List policies.
    List(GridArgs),
}

#[derive(Args, Debug, Clone)]
pub struct PolicySetArgs {
    /// Grid path (a directory applies to everything below it).
    pub path: String,
    /// Complete copies each file below the path must have in total (1 to 64).
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub copies: u32,
    /// Sites that must each hold a copy, comma separated.
    #[arg(long, value_name = "A,B", value_delimiter = ',')]
    pub sites: Vec<String>,
    /// Protection of the copies' data streams; files uploaded with --protect private are
    /// always copied privately.
    #[arg(long, value_enum, default_value = "clear")]
    pub protect: ProtectArg,
    #[command(flatten)]
    pub creds: CredArgs,
}

#[derive(Args, Debug, Clone)]
pub struct VerifyArgs {
    /// Verify directories recursively.
    #[arg(short, long)]
    pub recursive: bool,
    /// Only report; do not repair damaged replicas.
    #[arg(long)]
    pub no_repair: bool,
    #[command(flatten)]
    pub p: PathsArgs,
}

fn parse_mode(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s, 8)
        .ok()
        .filter(|m| *m <= 0o7777)
        .ok_or_else(|| format!("{s:?} is not an octal mode (0-7777)"))
}

fn parse_size(s: &str) -> Result<u64, String> {
    wire::units::parse_size(s)
}

fn parse_rate(s: &str) -> Result<u64, String> {
    wire::units::parse_rate(s)
}

fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    wire::units::parse_duration(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn help_of_cp_has_examples_and_exit_codes_are_documented() {
        let mut cmd = Cli::command();
        let help = cmd
            .find_subcommand_mut("cp")
            .unwrap()
            .render_long_help()
            .to_string();
        assert!(help.contains("Third-party copy"));
        assert!(help.contains("--stall-timeout"));
        let top = Cli::command().render_long_help().to_string();
        assert!(top.contains("Exit codes"));
    }

    #[test]
    fn bad_sizes_are_refused_with_the_rule() {
        let err = Cli::try_parse_from(["haul", "cp", "--tcp-buffer", "lots", "a", "b"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("invalid size"), "{err}");
        let err = Cli::try_parse_from(["haul", "cp", "-p", "0", "a", "b"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("0"), "{err}");
    }
}
