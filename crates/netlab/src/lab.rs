//! The test harness: `Lab` builds the emulated hosts (namespaces with TUN interfaces and a
//! host profile), starts the emulator, hands out `Host`s to run commands in, and tears it all
//! down on drop.

use std::ffi::OsStr;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::emulator::{Control, Emulator, Spec};
use crate::globals::{self, GlobalSettings};
use crate::model::{LinkParams, Nanos};
use crate::netns;
use crate::stats::Stats;
use crate::sys::{self, IfCtl};

/// Name of the interface every host uses towards the emulator.
pub const HOST_IFACE: &str = "wan0";
/// Prefix length of host addresses: all of 198.18.0.0/15 goes through the emulator.
pub const PREFIX_LEN: u8 = 15;
/// Packets a host's `wan0` holds for the emulator to read. The TUN driver drops what does not
/// fit (counted as the host's tx drops, an artefact of the lab): with the default 1000, 16
/// streams at 200 ms and MTU 1500 overflowed it whenever the emulator thread was descheduled
/// for a few milliseconds on a busy 2-core machine (2,279 drops in a 30 s iperf3 run). A longer
/// ring turns those drops into a short wait, which the path check still sees as lateness; it
/// costs nothing while the emulator keeps up (the ring holds only pointers).
const HOST_TXQLEN: u32 = 10_000;
const MAX_SITES: usize = 2;
const MAX_HOSTS_PER_SITE: usize = 250;

/// Errors of building or running a lab.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// This machine or user cannot run a lab (not root, no TUN, no `ip`); tests should skip.
    #[error("netlab unavailable: {0}")]
    Unavailable(String),
    /// The configuration is invalid; the message says which value to change.
    #[error("invalid lab configuration: {0}")]
    Config(String),
    /// A system step failed while creating or removing the lab.
    #[error("netlab {what} failed: {source}")]
    Setup {
        /// The step that failed.
        what: String,
        /// What the system said.
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// Whether the error means "this machine cannot run labs" (skip) rather than a bug.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Error::Unavailable(_))
    }
}

fn setup(what: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
    let what = what.into();
    move |source| Error::Setup { what, source }
}

/// TCP settings applied inside every host namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Profile {
    /// Data-transfer-node settings: tcp_rmem "4096 131072 134217728", tcp_wmem
    /// "4096 16384 134217728", tcp_no_metrics_save=1, and global rmem_max/wmem_max raised to
    /// at least 256 MiB (restored when the last lab ends).
    Tuned,
    /// A fresh namespace's defaults, untouched.
    Stock,
}

impl std::str::FromStr for Profile {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "tuned" => Ok(Profile::Tuned),
            "stock" => Ok(Profile::Stock),
            _ => Err(format!("unknown host profile {s:?}: use tuned or stock")),
        }
    }
}

/// One site: a group of hosts on the same side of the bottleneck.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SiteSpec {
    /// Lower-case letters, 1 to 8 (host names are the site name plus an index: "a0").
    pub name: String,
    /// Number of hosts, 1 to 250.
    pub hosts: usize,
}

/// A link-down window relative to the lab's start.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Blackout {
    /// When the link goes down, after the lab started.
    pub start: Duration,
    /// How long it stays down.
    pub length: Duration,
}

/// Everything a lab is made of; `LabBuilder` fills it, and it can be edited before
/// `Lab::start` (for example to give the two directions different parameters).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LabConfig {
    /// One or two sites.
    pub sites: Vec<SiteSpec>,
    /// Per direction: `[0]` first site to second, `[1]` second to first.
    pub links: [LinkParams; 2],
    /// MTU of every host interface (68 to 65535; 1500 and 9000 are the usual ones).
    pub mtu: u32,
    /// Host TCP settings.
    pub profile: Profile,
    /// Congestion control of every host (must be in tcp_available_congestion_control).
    pub congestion: String,
    /// Seed of the loss and jitter draws.
    pub seed: u64,
    /// Scheduled link-down windows (both directions).
    pub blackouts: Vec<Blackout>,
    /// Where to write forwarded bytes per direction in 1 ms bins (CSV), if anywhere.
    pub record_csv: Option<PathBuf>,
    /// Hosts hand the emulator TCP super-packets (TSO) and receive joined ones (GRO), as
    /// with a real NIC; every packet is still queued, dropped and delayed alone on the
    /// bottleneck. Off: one system call per wire packet (several times the CPU at MTU 1500).
    pub offload: bool,
}

impl LabConfig {
    /// Checks every value; the error is one line naming the value and what to use instead.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |m: String| Err(Error::Config(m));
        if self.sites.is_empty() || self.sites.len() > MAX_SITES {
            return bad(format!("a lab has 1 or 2 sites, not {}", self.sites.len()));
        }
        for (i, s) in self.sites.iter().enumerate() {
            if s.name.is_empty()
                || s.name.len() > 8
                || !s.name.bytes().all(|b| b.is_ascii_lowercase())
            {
                return bad(format!(
                    "site name {:?} must be 1 to 8 lower-case letters",
                    s.name
                ));
            }
            if self.sites[..i].iter().any(|o| o.name == s.name) {
                return bad(format!("site name {:?} is used twice", s.name));
            }
            if s.hosts == 0 || s.hosts > MAX_HOSTS_PER_SITE {
                return bad(format!(
                    "site {:?} needs 1 to {MAX_HOSTS_PER_SITE} hosts, not {}",
                    s.name, s.hosts
                ));
            }
        }
        for l in &self.links {
            l.validate().map_err(Error::Config)?;
            if l.queue_bytes < self.mtu as u64 {
                return bad(format!(
                    "queue limit {} B is smaller than one packet (mtu {}): raise it",
                    l.queue_bytes, self.mtu
                ));
            }
        }
        if !(68..=65535).contains(&self.mtu) {
            return bad(format!(
                "mtu {} out of range: use 68 to 65535 (1500 or 9000 usually)",
                self.mtu
            ));
        }
        if self.congestion.is_empty()
            || !self
                .congestion
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            return bad(format!(
                "congestion control {:?} is not a valid name (e.g. cubic, reno, bbr)",
                self.congestion
            ));
        }
        for b in &self.blackouts {
            if b.length.is_zero() {
                return bad("blackout length must be positive".into());
            }
        }
        Ok(())
    }

    /// The address of host `index` of site number `site`: `198.18.<site>.<index + 1>`.
    pub fn address(site: usize, index: usize) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, site as u8, (index + 1) as u8)
    }
}

/// Builds a `LabConfig` with readable setters; `build` starts the lab.
///
/// Defaults: sites "a" and "b" with one host each (when no site is given), 1 Gbit/s, RTT 0,
/// no loss, no jitter, queue of one bandwidth-delay product (at least 64 KiB), MTU 1500,
/// profile tuned, congestion control cubic, seed 1.
#[derive(Clone, Debug)]
pub struct LabBuilder {
    sites: Vec<SiteSpec>,
    rate_bps: Option<u64>,
    delay: Duration,
    loss: f64,
    jitter: Duration,
    reorder: bool,
    queue_bytes: Option<u64>,
    mtu: u32,
    profile: Profile,
    congestion: String,
    seed: u64,
    blackouts: Vec<Blackout>,
    record_csv: Option<PathBuf>,
    offload: bool,
}

impl Default for LabBuilder {
    fn default() -> Self {
        LabBuilder {
            sites: Vec::new(),
            rate_bps: Some(1_000_000_000),
            delay: Duration::ZERO,
            loss: 0.0,
            jitter: Duration::ZERO,
            reorder: false,
            queue_bytes: None,
            mtu: 1500,
            profile: Profile::Tuned,
            congestion: "cubic".into(),
            seed: 1,
            blackouts: Vec::new(),
            record_csv: None,
            offload: true,
        }
    }
}

impl LabBuilder {
    /// Adds a site named `name` (lower-case letters) with `hosts` hosts.
    pub fn site(mut self, name: &str, hosts: usize) -> Self {
        self.sites.push(SiteSpec {
            name: name.into(),
            hosts,
        });
        self
    }
    /// Bottleneck rate in bits per second, each direction.
    pub fn rate_bps(mut self, bps: u64) -> Self {
        self.rate_bps = Some(bps);
        self
    }
    /// No rate limit (only delay, loss, jitter and blackouts apply).
    pub fn unlimited_rate(mut self) -> Self {
        self.rate_bps = None;
        self
    }
    /// Round-trip time added by the path: half of it one way, half the other.
    pub fn rtt(mut self, rtt: Duration) -> Self {
        self.delay = rtt / 2;
        self
    }
    /// One-way delay, each direction.
    pub fn one_way_delay(mut self, d: Duration) -> Self {
        self.delay = d;
        self
    }
    /// Random loss probability, each direction.
    pub fn loss(mut self, p: f64) -> Self {
        self.loss = p;
        self
    }
    /// Delay variation: each packet's one-way delay is uniform in delay ± jitter.
    pub fn jitter(mut self, j: Duration) -> Self {
        self.jitter = j;
        self
    }
    /// Let jitter reorder packets (off by default).
    pub fn reorder(mut self, yes: bool) -> Self {
        self.reorder = yes;
        self
    }
    /// Drop-tail queue limit in bytes, each direction.
    pub fn queue_bytes(mut self, b: u64) -> Self {
        self.queue_bytes = Some(b);
        self
    }
    /// MTU of the host interfaces.
    pub fn mtu(mut self, mtu: u32) -> Self {
        self.mtu = mtu;
        self
    }
    /// Host TCP settings.
    pub fn profile(mut self, p: Profile) -> Self {
        self.profile = p;
        self
    }
    /// Default congestion control of the hosts ("cubic", "reno", "bbr").
    pub fn congestion(mut self, cc: &str) -> Self {
        self.congestion = cc.into();
        self
    }
    /// Seed of loss and jitter draws.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
    /// Link down (both directions) from `start` after the lab starts, for `length`.
    pub fn blackout(mut self, start: Duration, length: Duration) -> Self {
        self.blackouts.push(Blackout { start, length });
        self
    }
    /// Segmentation and receive offloads between hosts and emulator (on by default); see
    /// `LabConfig::offload`.
    pub fn offload(mut self, on: bool) -> Self {
        self.offload = on;
        self
    }
    /// Record forwarded bytes per direction in 1 ms bins to this CSV file.
    pub fn record_csv(mut self, path: impl Into<PathBuf>) -> Self {
        self.record_csv = Some(path.into());
        self
    }

    /// The configuration these settings describe, validated.
    pub fn config(self) -> Result<LabConfig, Error> {
        let sites = if self.sites.is_empty() {
            vec![
                SiteSpec {
                    name: "a".into(),
                    hosts: 1,
                },
                SiteSpec {
                    name: "b".into(),
                    hosts: 1,
                },
            ]
        } else {
            self.sites
        };
        let bdp = self.rate_bps.map_or(0, |r| {
            (r as u128 * (2 * self.delay.as_nanos()) / 8_000_000_000) as u64
        });
        let link = LinkParams {
            rate_bps: self.rate_bps,
            delay: self.delay,
            loss: self.loss,
            jitter: self.jitter,
            reorder: self.reorder,
            queue_bytes: self
                .queue_bytes
                .unwrap_or(bdp.max(65536).max(2 * self.mtu as u64)),
        };
        let cfg = LabConfig {
            sites,
            links: [link.clone(), link],
            mtu: self.mtu,
            profile: self.profile,
            congestion: self.congestion,
            seed: self.seed,
            blackouts: self.blackouts,
            record_csv: self.record_csv,
            offload: self.offload,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Validates and starts the lab.
    pub fn build(self) -> Result<Lab, Error> {
        Lab::start(self.config()?)
    }
}

/// One emulated host: a network namespace whose interface `wan0` leads to the emulator.
#[derive(Debug, Clone)]
pub struct Host {
    name: String,
    site: String,
    index: usize,
    addr: Ipv4Addr,
    netns: String,
    ns_fd: Arc<OwnedFd>,
}

impl Host {
    /// Short name: site name plus index, e.g. "a0".
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Site name.
    pub fn site(&self) -> &str {
        &self.site
    }
    /// Index within the site.
    pub fn index(&self) -> usize {
        self.index
    }
    /// IPv4 address of the host's interface.
    pub fn addr(&self) -> Ipv4Addr {
        self.addr
    }
    /// Name of the network namespace (usable with `ip netns exec`).
    pub fn netns(&self) -> &str {
        &self.netns
    }

    /// A command that runs inside this host's namespace (the child enters it before exec).
    /// The namespace is only kept alive by the lab: spawn while the `Lab` exists. Processes
    /// still running in the namespace when the lab drops are terminated.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new(program);
        let fd = self.ns_fd.clone();
        // SAFETY: the closure only calls setns(2), which is async-signal-safe, on an fd kept
        // open by the Arc it owns.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd
    }

    /// Runs `f` on a thread inside this host's namespace and returns its result; sockets it
    /// creates (listeners, connections) belong to the host and stay usable from any thread.
    pub fn enter<T: Send>(&self, f: impl FnOnce() -> T + Send) -> io::Result<T> {
        sys::in_netns(self.ns_fd.as_fd(), f)
    }

    /// Spawns a thread that lives inside this host's namespace (threads it spawns, e.g. a
    /// tokio runtime's workers, are inside too).
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> io::Result<std::thread::JoinHandle<io::Result<T>>> {
        let fd = self.ns_fd.clone();
        std::thread::Builder::new()
            .name(format!("netlab-{}", self.name))
            .spawn(move || {
                sys::setns_net(fd.as_fd())?;
                Ok(f())
            })
    }
}

/// A running lab; dropping it stops the emulator, ends processes left in its namespaces,
/// removes the namespaces and restores global settings.
pub struct Lab {
    id: u32,
    config: LabConfig,
    hosts: Vec<Host>,
    ns_names: Vec<String>,
    emulator: Option<Emulator>,
    links: Mutex<[LinkParams; 2]>,
    epoch: Nanos,
    started: Instant,
    globals: Option<GlobalSettings>,
}

static NEXT_LAB: AtomicU32 = AtomicU32::new(0);

/// Whether this process can run labs: Ok, or the reason it cannot (cached).
pub fn available() -> Result<(), String> {
    static CHECK: OnceLock<Result<(), String>> = OnceLock::new();
    CHECK.get_or_init(check_available).clone()
}

fn check_available() -> Result<(), String> {
    if !sys::is_root() {
        return Err("needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN): run the tests as root".into());
    }
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
    {
        return Err(format!(
            "cannot open /dev/net/tun ({e}): load the tun module or allow the device"
        ));
    }
    match Command::new("ip").arg("-V").output() {
        Ok(o) if o.status.success() => {}
        _ => return Err("the `ip` command (iproute2) is missing: apt-get install iproute2".into()),
    }
    if let Err(e) = std::fs::create_dir_all(netns::NETNS_DIR) {
        return Err(format!("cannot create {} ({e})", netns::NETNS_DIR));
    }
    match sys::Epoll::new()
        .and_then(|ep| ep.wait(&mut [libc::epoll_event { events: 0, u64: 0 }], Some(0)))
    {
        Ok(_) => Ok(()),
        Err(e) => Err(format!(
            "epoll_pwait2 is missing ({e}): needs Linux 5.11 or newer"
        )),
    }
}

/// Removes what crashed labs left behind: namespaces (and processes in them) whose owner
/// process is gone, and global limits they had raised. Returns the namespaces removed.
pub fn cleanup_leftovers() -> Result<Vec<String>, Error> {
    let removed = netns::remove_leftovers().map_err(setup("removal of leftover namespaces"))?;
    globals::restore_leftovers().map_err(setup("restoring global sysctls left changed"))?;
    Ok(removed)
}

fn setup_host(config: &LabConfig, addr: Ipv4Addr) -> io::Result<OwnedFd> {
    // IPv6 off on the new interface so hosts send no router solicitations through the lab.
    let _ = sys::write_sysctl("net/ipv6/conf/default/disable_ipv6", "1");
    let tun = sys::create_tun(HOST_IFACE, config.offload)?;
    let ctl = IfCtl::new()?;
    ctl.set_mtu(HOST_IFACE, config.mtu)?;
    ctl.set_txqlen(HOST_IFACE, HOST_TXQLEN)?;
    ctl.set_addr(HOST_IFACE, addr, PREFIX_LEN)?;
    ctl.set_up(HOST_IFACE)?;
    ctl.set_up("lo")?;
    sys::write_sysctl("net/ipv4/tcp_congestion_control", &config.congestion)?;
    if config.profile == Profile::Tuned {
        sys::write_sysctl("net/ipv4/tcp_rmem", "4096 131072 134217728")?;
        sys::write_sysctl("net/ipv4/tcp_wmem", "4096 16384 134217728")?;
        sys::write_sysctl("net/ipv4/tcp_no_metrics_save", "1")?;
    }
    Ok(tun)
}

impl Lab {
    /// Starts describing a lab.
    pub fn builder() -> LabBuilder {
        LabBuilder::default()
    }

    /// Ok when this machine can run labs, otherwise the reason (for skipping tests).
    pub fn available() -> Result<(), String> {
        available()
    }

    /// Creates the namespaces, interfaces and settings, and starts the emulator.
    pub fn start(config: LabConfig) -> Result<Lab, Error> {
        config.validate()?;
        available().map_err(Error::Unavailable)?;
        let have =
            sys::read_sysctl("net/ipv4/tcp_available_congestion_control").unwrap_or_default();
        if !have.split_whitespace().any(|c| c == config.congestion) {
            return Err(Error::Config(format!(
                "congestion control {:?} is not available here (available: {have}): load its module or pick another",
                config.congestion
            )));
        }
        let _ = cleanup_leftovers();
        let pid = std::process::id();
        let id = NEXT_LAB.fetch_add(1, Ordering::Relaxed);
        let mut plan = Vec::new();
        for (si, s) in config.sites.iter().enumerate() {
            for h in 0..s.hosts {
                let name = format!("{}{h}", s.name);
                plan.push((si, h, netns::ns_name(pid, id, &name), name));
            }
        }
        let ns_names: Vec<String> = plan.iter().map(|p| p.2.clone()).collect();
        netns::create(&ns_names).map_err(setup("creating network namespaces"))?;
        // From here on, a failure must remove what was created: build a Lab early.
        let mut lab = Lab {
            id,
            links: Mutex::new(config.links.clone()),
            config,
            hosts: Vec::new(),
            ns_names,
            emulator: None,
            epoch: 0,
            started: Instant::now(),
            globals: None,
        };
        lab.globals = Some(
            globals::acquire(lab.config.profile == Profile::Tuned, &lab.config.congestion)
                .map_err(setup(
                    "changing global sysctls (rmem_max, wmem_max, allowed congestion control)",
                ))?,
        );
        let mut tuns = Vec::new();
        for (si, h, ns, name) in plan {
            let ns_fd = sys::open_netns(&netns::ns_path(&ns))
                .map_err(setup(format!("opening namespace {ns}")))?;
            let addr = LabConfig::address(si, h);
            let cfg = &lab.config;
            let tun = sys::in_netns(ns_fd.as_fd(), || setup_host(cfg, addr))
                .and_then(|r| r)
                .map_err(setup(format!("setting up host {name} in {ns}")))?;
            tuns.push((tun, si));
            lab.hosts.push(Host {
                name,
                site: lab.config.sites[si].name.clone(),
                index: h,
                addr,
                netns: ns,
                ns_fd: Arc::new(ns_fd),
            });
        }
        lab.epoch = sys::mono_ns();
        lab.started = Instant::now();
        let spec = Spec {
            tuns,
            site_hosts: lab.config.sites.iter().map(|s| s.hosts).collect(),
            links: if lab.config.sites.len() == 2 {
                lab.config.links.to_vec()
            } else {
                Vec::new()
            },
            blackouts: lab
                .config
                .blackouts
                .iter()
                .map(|b| {
                    let s = b.start.as_nanos() as Nanos;
                    (s, s + b.length.as_nanos() as Nanos)
                })
                .collect(),
            seed: lab.config.seed,
            epoch: lab.epoch,
            mtu: lab.config.mtu,
            offload: lab.config.offload,
            record: lab
                .config
                .record_csv
                .clone()
                .map(|p| (p, lab.config.sites.iter().map(|s| s.name.clone()).collect())),
        };
        lab.emulator = Some(Emulator::start(spec).map_err(setup("starting the emulator"))?);
        Ok(lab)
    }

    /// The configuration the lab runs with (link parameters as at start).
    pub fn config(&self) -> &LabConfig {
        &self.config
    }

    /// Number of this lab within the process (part of its namespace names).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// All hosts, site by site.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// Host `index` of site `site`, if it exists.
    pub fn try_host(&self, site: &str, index: usize) -> Option<&Host> {
        self.hosts
            .iter()
            .find(|h| h.site == site && h.index == index)
    }

    /// Host `index` of site `site`. Panics if there is no such host (a test bug).
    pub fn host(&self, site: &str, index: usize) -> &Host {
        match self.try_host(site, index) {
            Some(h) => h,
            None => panic!(
                "netlab: no host {index} in site {site:?} (sites: {:?})",
                self.config.sites
            ),
        }
    }

    /// Time since the emulator started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// CPU time used by the emulator thread so far.
    pub fn emulator_cpu(&self) -> Duration {
        self.emulator
            .as_ref()
            .map_or(Duration::ZERO, |e| e.cpu_time())
    }

    /// Current counters.
    pub fn stats(&self) -> Stats {
        let sites: Vec<String> = self.config.sites.iter().map(|s| s.name.clone()).collect();
        let mut s = match &self.emulator {
            Some(e) => Stats::snapshot(
                &e.shared.counters,
                &sites,
                self.elapsed().as_secs_f64(),
                e.cpu_time().as_secs_f64(),
            ),
            None => Stats::snapshot(&Default::default(), &sites, 0.0, 0.0),
        };
        for h in &self.hosts {
            // /proc/thread-self/net is the namespace of the reading thread.
            let dev = sys::in_netns(h.ns_fd.as_fd(), || {
                std::fs::read_to_string("/proc/thread-self/net/dev")
            });
            if let Ok(Ok(dev)) = dev
                && let Some((rx, tx)) = crate::stats::device_drops(&dev, HOST_IFACE)
            {
                s.host_rx_dropped += rx;
                s.host_tx_dropped += tx;
            }
        }
        s
    }

    /// Whether the emulator thread is still forwarding (false after an I/O failure).
    pub fn is_running(&self) -> bool {
        self.emulator.as_ref().is_some_and(|e| e.is_running())
    }

    /// Takes the link down in both directions `after` from now, for `length`.
    pub fn schedule_blackout(&self, after: Duration, length: Duration) -> Result<(), Error> {
        if length.is_zero() {
            return Err(Error::Config("blackout length must be positive".into()));
        }
        let now = sys::mono_ns().saturating_sub(self.epoch);
        let start = now + after.as_nanos() as Nanos;
        if let Some(e) = &self.emulator {
            e.send(Control::Blackout {
                start,
                end: start + length.as_nanos() as Nanos,
            });
        }
        Ok(())
    }

    /// Current parameters of the direction that leaves site `from`.
    pub fn link(&self, from: &str) -> Option<LinkParams> {
        let dir = self.direction(from)?;
        Some(self.links.lock().unwrap_or_else(|p| p.into_inner())[dir].clone())
    }

    /// Changes the direction leaving site `from` from now on (path changes mid-test).
    pub fn set_link(&self, from: &str, params: LinkParams) -> Result<(), Error> {
        params.validate().map_err(Error::Config)?;
        let dir = self.direction(from).ok_or_else(|| {
            Error::Config(format!("no link leaves site {from:?} (two sites needed)"))
        })?;
        self.links.lock().unwrap_or_else(|p| p.into_inner())[dir] = params.clone();
        if let Some(e) = &self.emulator {
            e.send(Control::SetLink { dir, params });
        }
        Ok(())
    }

    fn direction(&self, from: &str) -> Option<usize> {
        if self.config.sites.len() != 2 {
            return None;
        }
        self.config.sites.iter().position(|s| s.name == from)
    }

    /// Stops everything now and returns the final counters; errors say what was left behind.
    pub fn shutdown(mut self) -> Result<Stats, Error> {
        let stats = self.stop_emulator();
        self.teardown()?;
        Ok(stats)
    }

    fn stop_emulator(&mut self) -> Stats {
        if let Some(e) = &mut self.emulator {
            let _ = e.stop();
        }
        let s = self.stats();
        self.emulator = None;
        s
    }

    fn teardown(&mut self) -> Result<(), Error> {
        self.emulator = None;
        self.hosts.clear();
        let names = std::mem::take(&mut self.ns_names);
        let r = netns::delete(&names).map_err(setup("removing namespaces"));
        self.globals = None;
        r
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = self.stop_emulator();
        if let Err(e) = self.teardown() {
            eprintln!("netlab: {e}");
        }
    }
}

/// Skips the current test (returns early) with a message on stderr when labs cannot run here.
/// `require!()` returns `()`, `require!(value)` returns `value` (e.g. `Ok(())`).
#[macro_export]
macro_rules! require {
    () => {
        $crate::require!(())
    };
    ($ret:expr) => {
        if let Err(why) = $crate::Lab::available() {
            $crate::__testkit::skip(format!("netlab cannot run here: {why}"));
            return $ret;
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lab_and_host_can_be_shared_between_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Lab>();
        assert_send_sync::<Host>();
    }

    #[test]
    fn addresses_and_defaults() {
        assert_eq!(LabConfig::address(1, 0), Ipv4Addr::new(198, 18, 1, 1));
        let c = Lab::builder().config().expect("defaults are valid");
        assert_eq!(c.sites.len(), 2);
        assert_eq!(c.links[0].rate_bps, Some(1_000_000_000));
        assert_eq!(c.links[0].queue_bytes, 65536, "RTT 0: the 64 KiB floor");
        assert_eq!(c.profile, Profile::Tuned);
        assert_eq!(c.congestion, "cubic");
    }
}
