//! `haul netlab ...`: create a lab from flags and keep it running (`up`), run a command in one
//! of its hosts (`exec`), list labs, stop them (`down`) and remove leftovers (`cleanup`).
//!
//! Exposed as a library function so the `haul` binary mounts it; exit codes: 0 success,
//! 1 failure, 2 usage error, 3 netlab unavailable here (not root, no TUN).

use std::ffi::OsString;
use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use clap::{Args as ClapArgs, Parser, Subcommand};
use serde::Serialize;

use crate::globals::STATE_DIR;
use crate::lab::{Lab, LabConfig, Profile};
use crate::{netns, sys, units};

/// Exit code: failure.
pub const EXIT_FAILURE: i32 = 1;
/// Exit code: bad arguments.
pub const EXIT_USAGE: i32 = 2;
/// Exit code: labs cannot run on this machine (not root, no TUN, no `ip`).
pub const EXIT_UNAVAILABLE: i32 = 3;

/// User-space WAN emulator: hosts in network namespaces joined by an emulated bottleneck.
#[derive(Debug, Parser)]
#[command(name = "netlab", about, disable_help_subcommand = true)]
pub struct Args {
    #[command(subcommand)]
    pub command: Cmd,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Create a lab, print its hosts as JSON, forward until Ctrl-C/SIGTERM or --duration,
    /// print the counters at exit (SIGUSR1 prints them at any time).
    Up(Box<UpArgs>),
    /// Run a command inside a host's namespace: HOST is a namespace name (`nl<pid>-<n>-a0`) or a
    /// host name (a0) when only one running lab has it.
    Exec {
        /// Host name or namespace name.
        host: String,
        /// Command and arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        command: Vec<OsString>,
    },
    /// List lab namespaces and whether their owner still runs.
    List,
    /// Stop labs started with `up` (SIGTERM, wait up to 5 s), then remove leftovers.
    Down,
    /// Remove namespaces and settings left by labs whose process is gone.
    Cleanup,
    /// Say whether labs can run here (exit 0) or why not (exit 3).
    Check,
}

/// Flags of `up`.
#[derive(Debug, ClapArgs)]
pub struct UpArgs {
    /// A site and its number of hosts, NAME=N (repeat; default a=1 and b=1).
    #[arg(long = "site", value_name = "NAME=N")]
    pub sites: Vec<String>,
    /// Bottleneck rate each way: 1G, 1Gbit, 800M, 100kbit/s, or "unlimited".
    #[arg(long, default_value = "1G", allow_hyphen_values = true)]
    pub rate: String,
    /// Round-trip time added by the path (half each way): 100ms, 2s, 0.
    #[arg(long, default_value = "0", allow_hyphen_values = true)]
    pub rtt: String,
    /// Random loss probability each way: 0.001 or 0.1%.
    #[arg(long, default_value = "0", allow_hyphen_values = true)]
    pub loss: String,
    /// Jitter of the one-way delay (uniform, +-): 1ms.
    #[arg(long, default_value = "0", allow_hyphen_values = true)]
    pub jitter: String,
    /// Let jitter reorder packets.
    #[arg(long)]
    pub reorder: bool,
    /// Drop-tail queue limit each way (default one bandwidth-delay product, at least 64KiB).
    #[arg(long, allow_hyphen_values = true)]
    pub queue: Option<String>,
    /// MTU of the hosts' interfaces.
    #[arg(long, default_value_t = 1500)]
    pub mtu: u32,
    /// Host TCP profile: tuned or stock.
    #[arg(long, default_value = "tuned")]
    pub profile: String,
    /// Congestion control of the hosts (cubic, reno, bbr).
    #[arg(long = "cc", default_value = "cubic")]
    pub congestion: String,
    /// Seed of loss and jitter draws.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Link down for a while: START+LENGTH after start, e.g. 10s+2s (repeat).
    #[arg(long = "blackout", value_name = "START+LENGTH")]
    pub blackouts: Vec<String>,
    /// Write forwarded bytes per direction in 1 ms bins to this CSV file.
    #[arg(long)]
    pub record: Option<PathBuf>,
    /// One system call per wire packet instead of TSO/GRO super-packets between the hosts
    /// and the emulator (for comparisons; several times the CPU at MTU 1500).
    #[arg(long)]
    pub no_offload: bool,
    /// Stop after this long (default: until Ctrl-C or SIGTERM).
    #[arg(long, allow_hyphen_values = true)]
    pub duration: Option<String>,
}

impl UpArgs {
    /// The lab configuration these flags describe, or a one-line reason they are wrong.
    pub fn to_config(&self) -> Result<LabConfig, String> {
        let mut b = Lab::builder();
        for s in &self.sites {
            let (name, n) = s
                .split_once('=')
                .ok_or_else(|| format!("invalid --site {s:?}: use NAME=N, e.g. a=2"))?;
            let n: usize = n.parse().map_err(|_| {
                format!("invalid --site {s:?}: the host count must be a whole number")
            })?;
            b = b.site(name, n);
        }
        b = match self.rate.as_str() {
            "unlimited" | "inf" | "none" => b.unlimited_rate(),
            r => b.rate_bps(units::parse_rate(r).map_err(|e| e.to_string())?),
        };
        b = b
            .rtt(units::parse_duration(&self.rtt).map_err(|e| e.to_string())?)
            .loss(units::parse_probability(&self.loss).map_err(|e| e.to_string())?)
            .jitter(units::parse_duration(&self.jitter).map_err(|e| e.to_string())?)
            .reorder(self.reorder)
            .mtu(self.mtu)
            .profile(self.profile.parse::<Profile>()?)
            .congestion(&self.congestion)
            .seed(self.seed)
            .offload(!self.no_offload);
        if let Some(q) = &self.queue {
            b = b.queue_bytes(units::parse_size(q).map_err(|e| e.to_string())?);
        }
        for bo in &self.blackouts {
            let (s, l) = bo.split_once('+').ok_or_else(|| {
                format!("invalid --blackout {bo:?}: use START+LENGTH, e.g. 10s+2s")
            })?;
            b = b.blackout(
                units::parse_duration(s).map_err(|e| e.to_string())?,
                units::parse_duration(l).map_err(|e| e.to_string())?,
            );
        }
        if let Some(p) = &self.record {
            b = b.record_csv(p);
        }
        b.config().map_err(|e| e.to_string())
    }
}

#[derive(Serialize)]
struct HostInfo<'a> {
    name: &'a str,
    site: &'a str,
    addr: String,
    netns: &'a str,
}

#[derive(Serialize)]
struct UpInfo<'a> {
    pid: u32,
    hosts: Vec<HostInfo<'a>>,
    config: &'a LabConfig,
}

/// Runs the CLI with `args` (`args[0]` is the program name, as in `std::env::args`); returns the
/// exit code.
pub fn main(args: Vec<String>) -> i32 {
    let parsed = match Args::try_parse_from(args) {
        Ok(a) => a,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_USAGE } else { 0 };
            let _ = e.print();
            return code;
        }
    };
    run(parsed)
}

/// Runs parsed arguments; returns the exit code.
pub fn run(args: Args) -> i32 {
    match args.command {
        Cmd::Up(up) => cmd_up(&up),
        Cmd::Exec { host, command } => cmd_exec(&host, &command),
        Cmd::List => cmd_list(),
        Cmd::Down => cmd_down(),
        Cmd::Cleanup => cmd_cleanup(),
        Cmd::Check => match Lab::available() {
            Ok(()) => {
                println!("netlab: available");
                0
            }
            Err(why) => {
                eprintln!("netlab: unavailable: {why}");
                EXIT_UNAVAILABLE
            }
        },
    }
}

fn up_file(pid: u32) -> String {
    format!("{STATE_DIR}/up-{pid}.json")
}

fn cmd_up(up: &UpArgs) -> i32 {
    let config = match up.to_config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("netlab: {e}");
            return EXIT_USAGE;
        }
    };
    let duration = match up
        .duration
        .as_deref()
        .map(units::parse_duration)
        .transpose()
    {
        Ok(d) => d,
        Err(e) => {
            eprintln!("netlab: {e}");
            return EXIT_USAGE;
        }
    };
    // Block the stop signals before any thread starts, so only sigtimedwait below sees them.
    // SAFETY: plain signal-set manipulation on a local set.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGUSR1] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
    let lab = match Lab::start(config) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("netlab: {e}");
            return if e.is_unavailable() {
                EXIT_UNAVAILABLE
            } else {
                EXIT_FAILURE
            };
        }
    };
    let pid = std::process::id();
    let info = UpInfo {
        pid,
        hosts: lab
            .hosts()
            .iter()
            .map(|h| HostInfo {
                name: h.name(),
                site: h.site(),
                addr: h.addr().to_string(),
                netns: h.netns(),
            })
            .collect(),
        config: lab.config(),
    };
    let json = serde_json::to_string(&info).unwrap_or_default();
    let _ = fs::create_dir_all(STATE_DIR);
    let _ = fs::write(up_file(pid), &json);
    println!("{json}");
    let deadline = duration.map(|d| Instant::now() + d);
    loop {
        let wait = match deadline {
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                left.min(Duration::from_secs(1))
            }
            None => Duration::from_secs(1),
        };
        let ts = libc::timespec {
            tv_sec: wait.as_secs() as libc::time_t,
            tv_nsec: wait.subsec_nanos() as libc::c_long,
        };
        // SAFETY: set is a valid signal set; no siginfo wanted.
        let sig = unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &ts) };
        if sig == libc::SIGUSR1 {
            use std::io::Write;
            let _ = writeln!(std::io::stdout(), "{}", lab.stats().to_json());
        } else if sig > 0 {
            break;
        }
        if !lab.is_running() {
            eprintln!("netlab: the emulator stopped unexpectedly");
            break;
        }
    }
    let _ = fs::remove_file(up_file(pid));
    match lab.shutdown() {
        Ok(stats) => {
            // Whoever started us may have stopped reading: a closed pipe is no failure.
            use std::io::Write;
            let _ = writeln!(std::io::stdout(), "{}", stats.to_json());
            let _ = writeln!(std::io::stderr(), "{stats}");
            0
        }
        Err(e) => {
            eprintln!("netlab: {e}");
            EXIT_FAILURE
        }
    }
}

fn resolve_host(host: &str) -> Result<String, String> {
    if netns::owner_pid(host).is_some() && fs::metadata(netns::ns_path(host)).is_ok() {
        return Ok(host.to_string());
    }
    let suffix = format!("-{host}");
    let matches: Vec<String> = netns::list()
        .into_iter()
        .filter(|n| n.ends_with(&suffix) && netns::owner_pid(n).is_some_and(sys::pid_alive))
        .collect();
    match matches.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(format!(
            "no running lab has host {host:?}: start one with `haul netlab up`"
        )),
        many => Err(format!(
            "several labs have host {host:?} ({}): give the namespace name",
            many.join(", ")
        )),
    }
}

fn cmd_exec(host: &str, command: &[OsString]) -> i32 {
    let ns = match resolve_host(host) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("netlab: {e}");
            return EXIT_FAILURE;
        }
    };
    let fd = match sys::open_netns(&netns::ns_path(&ns)) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("netlab: cannot open namespace {ns}: {e}");
            return EXIT_FAILURE;
        }
    };
    let Some((prog, rest)) = command.split_first() else {
        eprintln!("netlab: exec needs a command after the host");
        return EXIT_USAGE;
    };
    let raw = fd.as_raw_fd();
    let mut cmd = Command::new(prog);
    cmd.args(rest);
    // SAFETY: only setns(2), async-signal-safe, on an fd that stays open until exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(raw, libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let err = cmd.exec();
    eprintln!("netlab: cannot run {:?} in {ns}: {err}", prog);
    127
}

fn cmd_list() -> i32 {
    #[derive(Serialize)]
    struct Entry {
        netns: String,
        owner_pid: u32,
        owner_alive: bool,
    }
    let entries: Vec<Entry> = netns::list()
        .into_iter()
        .filter_map(|n| {
            let pid = netns::owner_pid(&n)?;
            Some(Entry {
                netns: n,
                owner_pid: pid,
                owner_alive: sys::pid_alive(pid),
            })
        })
        .collect();
    println!("{}", serde_json::to_string(&entries).unwrap_or_default());
    0
}

fn up_pids() -> Vec<u32> {
    let Ok(dir) = fs::read_dir(STATE_DIR) else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            name.strip_prefix("up-")?
                .strip_suffix(".json")?
                .parse()
                .ok()
        })
        .collect()
}

fn cmd_down() -> i32 {
    let pids: Vec<u32> = up_pids()
        .into_iter()
        .filter(|&p| sys::pid_alive(p))
        .collect();
    for &p in &pids {
        sys::kill(p, libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline && pids.iter().any(|&p| sys::pid_alive(p)) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let stuck: Vec<u32> = pids
        .iter()
        .copied()
        .filter(|&p| sys::pid_alive(p))
        .collect();
    let code = cmd_cleanup();
    if !stuck.is_empty() {
        eprintln!(
            "netlab: labs {stuck:?} did not stop within 5 s; kill them and run `haul netlab cleanup`"
        );
        return EXIT_FAILURE;
    }
    eprintln!("netlab: stopped {} lab(s)", pids.len());
    code
}

/// Removes what labs that died left behind: namespaces, raised global limits, and the state
/// files of `up` processes that are gone (which `down` would otherwise try to stop).
fn cmd_cleanup() -> i32 {
    for p in up_pids().into_iter().filter(|&p| !sys::pid_alive(p)) {
        let _ = fs::remove_file(up_file(p));
    }
    match crate::cleanup_leftovers() {
        Ok(removed) => {
            eprintln!("netlab: removed {} leftover namespace(s)", removed.len());
            0
        }
        Err(e) => {
            eprintln!("netlab: {e}");
            EXIT_FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up(args: &[&str]) -> Result<LabConfig, String> {
        let mut v = vec!["netlab", "up"];
        v.extend_from_slice(args);
        match Args::try_parse_from(v).map_err(|e| e.to_string())?.command {
            Cmd::Up(u) => u.to_config(),
            _ => Err("not up".into()),
        }
    }

    #[test]
    fn good_flags_make_a_config() {
        let c = up(&[
            "--site", "a=2", "--site", "b=3", "--rate", "800M", "--rtt", "100ms", "--loss", "0.1%",
            "--mtu", "9000",
        ])
        .unwrap();
        assert_eq!(c.sites.len(), 2);
        assert_eq!(c.sites[1].hosts, 3);
        assert_eq!(c.links[0].rate_bps, Some(800_000_000));
        assert_eq!(c.links[0].delay, Duration::from_millis(50));
        assert!((c.links[1].loss - 0.001).abs() < 1e-12);
        // Default queue: one BDP = 800 Mbit/s x 100 ms = 10 MB.
        assert_eq!(c.links[0].queue_bytes, 10_000_000);
        assert!(c.offload, "offloads are the default");
        let c = up(&[
            "--rate",
            "unlimited",
            "--blackout",
            "1s+500ms",
            "--no-offload",
        ])
        .unwrap();
        assert!(!c.offload);
        assert_eq!(c.links[0].rate_bps, None);
        assert_eq!(c.blackouts[0].length, Duration::from_millis(500));
    }

    #[test]
    fn bad_flags_are_refused_with_one_line() {
        for (args, needle) in [
            (&["--rate", "-1G"][..], "negative"),
            (&["--rate", "1Gfurlongs"][..], "unknown unit"),
            (&["--rate", "0"][..], "at least"),
            (&["--loss", "1.5"][..], "between 0 and 1"),
            (&["--loss", "-0.1"][..], "between 0 and 1"),
            (&["--rtt", "100"][..], "missing unit"),
            (&["--rtt", "-5ms"][..], "negative"),
            (&["--mtu", "20"][..], "mtu"),
            (&["--site", "a"][..], "NAME=N"),
            (&["--site", "a=0"][..], "hosts"),
            (&["--site", "A1=1"][..], "lower-case"),
            (
                &["--site", "a=1", "--site", "b=1", "--site", "c=1"][..],
                "1 or 2 sites",
            ),
            (&["--profile", "fast"][..], "tuned or stock"),
            (&["--blackout", "5s"][..], "START+LENGTH"),
            (&["--blackout", "5s+0"][..], "positive"),
            (&["--queue", "100"][..], "smaller than one packet"),
        ] {
            let err = up(args).unwrap_err();
            assert!(err.contains(needle), "{args:?}: {err}");
            assert!(!err.contains('\n'), "{args:?}: message is one line: {err}");
        }
    }
}
