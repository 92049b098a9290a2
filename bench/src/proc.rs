//! Processes and what they cost: one cgroup v2 group per side (client, server) for CPU time,
//! a sampler of resident memory over the processes of each group, `wait4` for the client's
//! exit and rusage, hard time limits, and the TCP retransmission counter of a namespace.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};

/// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup` on pure v2 hosts,
/// `/sys/fs/cgroup/unified` on hybrid ones), if anywhere.
pub fn cgroup2_root() -> Option<PathBuf> {
    let mounts = fs::read_to_string("/proc/self/mounts").ok()?;
    mounts.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let (_dev, dir, fstype) = (f.next()?, f.next()?, f.next()?);
        (fstype == "cgroup2").then(|| PathBuf::from(dir))
    })
}

/// A cgroup v2 group holding every process of one side of a run. Its `cpu.stat` counts the CPU
/// time of all tasks that ever ran in it, including exited children and forked daemons.
pub struct Cgroup {
    path: PathBuf,
    procs: CString,
}

impl Cgroup {
    /// Creates `<root>/haul-bench-<pid>/<name>` (an existing one of that name is reused).
    pub fn create(root: &Path, name: &str) -> Result<Cgroup> {
        let path = root
            .join(format!("haul-bench-{}", std::process::id()))
            .join(name);
        fs::create_dir_all(&path).with_context(|| format!("creating cgroup {}", path.display()))?;
        let procs = CString::new(path.join("cgroup.procs").as_os_str().as_encoded_bytes())?;
        Ok(Cgroup { path, procs })
    }

    /// Makes `cmd`'s child join this group before exec (so children it forks are in it too).
    pub fn enter_on_spawn(&self, cmd: &mut Command) {
        let procs = self.procs.clone();
        // SAFETY: open/write/close are async-signal-safe; the path is a prepared CString.
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                let n = libc::write(fd, b"0".as_ptr().cast(), 1);
                let err = io::Error::last_os_error();
                libc::close(fd);
                if n != 1 {
                    return Err(err);
                }
                Ok(())
            });
        }
    }

    /// CPU time (user + system) of everything that ran in the group, seconds, and the split.
    pub fn cpu(&self) -> CpuTime {
        let stat = fs::read_to_string(self.path.join("cpu.stat")).unwrap_or_default();
        let get = |k: &str| {
            stat.lines()
                .find_map(|l| l.strip_prefix(k)?.trim().parse::<u64>().ok())
                .unwrap_or(0) as f64
                / 1e6
        };
        CpuTime {
            total: get("usage_usec "),
            user: get("user_usec "),
            system: get("system_usec "),
        }
    }

    /// PIDs currently in the group.
    pub fn pids(&self) -> Vec<i32> {
        read_pids(&self.path)
    }

    /// Ends every process in the group: SIGTERM, then SIGKILL after `grace`.
    pub fn kill_all(&self, grace: Duration) {
        for p in self.pids() {
            // SAFETY: plain kill(2) of a process we started.
            unsafe { libc::kill(p, libc::SIGTERM) };
        }
        let until = Instant::now() + grace;
        while !self.pids().is_empty() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        for _ in 0..100 {
            let pids = self.pids();
            if pids.is_empty() {
                break;
            }
            for p in pids {
                // SAFETY: as above.
                unsafe { libc::kill(p, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        self.kill_all(Duration::from_secs(1));
        let _ = fs::remove_dir(&self.path);
        if let Some(parent) = self.path.parent() {
            let _ = fs::remove_dir(parent); // fails while other groups remain: fine
        }
    }
}

fn read_pids(path: &Path) -> Vec<i32> {
    fs::read_to_string(path.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// CPU seconds.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct CpuTime {
    pub total: f64,
    pub user: f64,
    pub system: f64,
}

impl std::ops::Sub for CpuTime {
    type Output = CpuTime;
    fn sub(self, o: CpuTime) -> CpuTime {
        CpuTime {
            total: (self.total - o.total).max(0.0),
            user: (self.user - o.user).max(0.0),
            system: (self.system - o.system).max(0.0),
        }
    }
}

/// How a client process ended.
#[derive(Clone, Debug)]
pub struct Exit {
    /// Exit code, or 128 + signal number.
    pub code: i32,
    /// Whether we killed it at its time limit.
    pub timed_out: bool,
    pub wall: Duration,
    /// Largest resident set of the process or of any descendant it waited for, bytes
    /// (getrusage's ru_maxrss).
    pub maxrss_bytes: u64,
    /// user + system CPU of the process and its waited-for descendants, seconds.
    pub rusage_cpu_s: f64,
}

/// A started child whose exit is collected by a thread calling `wait4`.
pub struct Running {
    pub pid: i32,
    pub start: Instant,
    rx: mpsc::Receiver<(i32, libc::rusage, Instant)>,
}

/// Spawns `cmd` in its own process group (so a time limit can end the whole tree), in `cg` if
/// given, with stdout and stderr going to files.
pub fn spawn(mut cmd: Command, cg: Option<&Cgroup>, out: &Path, err: &Path) -> Result<Running> {
    cmd.stdin(Stdio::null())
        .stdout(fs::File::create(out)?)
        .stderr(fs::File::create(err)?)
        .process_group(0);
    if let Some(cg) = cg {
        cg.enter_on_spawn(&mut cmd);
    }
    let start = Instant::now();
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {:?}", cmd.get_program()))?;
    let pid = child.id() as i32;
    // The waiter reaps the child with wait4 to get its rusage; std's Child is not waited on.
    drop(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut status = 0;
        // SAFETY: zeroed rusage is a valid out-parameter.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        loop {
            // SAFETY: waiting for our own child.
            let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
            if r == pid || (r < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR))
            {
                break;
            }
        }
        let _ = tx.send((status, ru, Instant::now()));
    });
    Ok(Running { pid, start, rx })
}

impl Running {
    /// Waits up to `limit`; past it the process group gets SIGTERM, then SIGKILL.
    pub fn wait(self, limit: Duration) -> Exit {
        let mut timed_out = false;
        let got = match self.rx.recv_timeout(limit) {
            Ok(v) => Some(v),
            Err(_) => {
                timed_out = true;
                // SAFETY: signalling the process group we created.
                unsafe { libc::kill(-self.pid, libc::SIGTERM) };
                match self.rx.recv_timeout(Duration::from_secs(3)) {
                    Ok(v) => Some(v),
                    Err(_) => {
                        // SAFETY: as above.
                        unsafe { libc::kill(-self.pid, libc::SIGKILL) };
                        self.rx.recv_timeout(Duration::from_secs(10)).ok()
                    }
                }
            }
        };
        let Some((status, ru, end)) = got else {
            return Exit {
                code: -1,
                timed_out,
                wall: self.start.elapsed(),
                maxrss_bytes: 0,
                rusage_cpu_s: 0.0,
            };
        };
        let code = if libc::WIFEXITED(status) {
            libc::WEXITSTATUS(status)
        } else if libc::WIFSIGNALED(status) {
            128 + libc::WTERMSIG(status)
        } else {
            -1
        };
        let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        Exit {
            code,
            timed_out,
            wall: end.duration_since(self.start),
            maxrss_bytes: ru.ru_maxrss.max(0) as u64 * 1024,
            rusage_cpu_s: tv(ru.ru_utime) + tv(ru.ru_stime),
        }
    }
}

/// Runs a short helper command to completion and returns its stdout (error with stderr).
pub fn run_output(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {:?}", cmd.get_program()))?;
    if !out.status.success() {
        return Err(anyhow!(
            "{:?} failed ({}): {}",
            cmd.get_program(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Peak memory of one side, from samples of `/proc/PID/status` of the group's processes.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct MemPeak {
    /// Largest sum of VmRSS over the side's processes at one sample, bytes.
    pub sum_rss: u64,
    /// Largest VmHWM (the kernel's own peak) of any single process seen, bytes.
    pub max_hwm: u64,
    pub samples: u64,
}

/// Samples the processes of some cgroups every `period` until stopped.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Vec<MemPeak>>,
}

impl Sampler {
    pub fn start(groups: Vec<PathBuf>, period: Duration) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut peaks = vec![MemPeak::default(); groups.len()];
            loop {
                let last = s.load(Ordering::Relaxed);
                for (g, peak) in groups.iter().zip(peaks.iter_mut()) {
                    let mut sum = 0;
                    for pid in read_pids(g) {
                        let (rss, hwm) = proc_mem(pid);
                        sum += rss;
                        peak.max_hwm = peak.max_hwm.max(hwm);
                    }
                    peak.sum_rss = peak.sum_rss.max(sum);
                    peak.samples += 1;
                }
                if last {
                    break;
                }
                std::thread::sleep(period);
            }
            peaks
        });
        Sampler { stop, handle }
    }

    pub fn finish(self) -> Vec<MemPeak> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap_or_default()
    }
}

/// (VmRSS, VmHWM) of a process in bytes; zeros when it is gone.
fn proc_mem(pid: i32) -> (u64, u64) {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb = |k: &str| {
        s.lines()
            .find_map(|l| {
                l.strip_prefix(k)?
                    .split_whitespace()
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .unwrap_or(0)
            * 1024
    };
    (kb("VmRSS:"), kb("VmHWM:"))
}

/// `Tcp: RetransSegs` of the network namespace `host` lives in (the sender's view of
/// retransmitted segments, for every TCP connection in that namespace).
pub fn retrans_segs(host: &netlab::Host) -> Option<u64> {
    let text = host
        .enter(|| fs::read_to_string("/proc/thread-self/net/snmp"))
        .ok()?
        .ok()?;
    let mut tcp = text.lines().filter(|l| l.starts_with("Tcp:"));
    let names: Vec<&str> = tcp.next()?.split_whitespace().collect();
    let values: Vec<&str> = tcp.next()?.split_whitespace().collect();
    let i = names.iter().position(|n| *n == "RetransSegs")?;
    values.get(i)?.parse().ok()
}

/// Whether something in `host`'s namespace listens on TCP `port` (from /proc/net/tcp and
/// tcp6: XRootD listens on an IPv6 socket that also takes IPv4).
pub fn listening(host: &netlab::Host, port: u16) -> bool {
    let Ok(text) = host.enter(|| {
        let mut t = fs::read_to_string("/proc/thread-self/net/tcp").unwrap_or_default();
        t.push_str(&fs::read_to_string("/proc/thread-self/net/tcp6").unwrap_or_default());
        t
    }) else {
        return false;
    };
    let want = format!(":{port:04X}");
    text.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 3 && f[1].ends_with(&want) && f[3] == "0A"
    })
}

/// Waits until `port` listens in `host`, up to `limit`.
pub fn wait_listening(host: &netlab::Host, port: u16, limit: Duration) -> bool {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if listening(host, port) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    false
}

/// MemAvailable from /proc/meminfo, bytes.
pub fn mem_available() -> u64 {
    fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("MemAvailable:")?
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        })
        .unwrap_or(0)
        * 1024
}

/// Free bytes for an unprivileged writer on the file system holding `path`.
pub fn fs_available(path: &Path) -> u64 {
    let Ok(c) = CString::new(path.as_os_str().as_encoded_bytes()) else {
        return 0;
    };
    // SAFETY: statvfs writes into the zeroed struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return 0;
    }
    st.f_bavail as u64 * st.f_frsize as u64
}
