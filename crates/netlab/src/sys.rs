//! Thin wrappers over the Linux calls the lab needs: TUN devices, interface ioctls, network
//! namespace switching, sysctl files, epoll with nanosecond timeouts, eventfd, clocks.
//!
//! Everything `unsafe` in the crate lives here, each call checked and turned into `io::Error`.

use std::ffi::CString;
use std::fs;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// CLOCK_MONOTONIC in nanoseconds.
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The CPU-time clock of the calling thread, readable from other threads while it lives.
pub fn current_thread_cpu_clock() -> io::Result<libc::clockid_t> {
    let mut id: libc::clockid_t = 0;
    // SAFETY: pthread_self is always valid; id is a valid out pointer.
    let rc = unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut id) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(id)
}

/// Reads a CPU-time clock (see `current_thread_cpu_clock`).
pub fn cpu_clock_time(id: libc::clockid_t) -> io::Result<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer; an invalid clock id makes the call fail, which we report.
    cvt(unsafe { libc::clock_gettime(id, &mut ts) })?;
    Ok(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

/// Sets the calling thread's timer slack (how late the kernel may wake it) in nanoseconds.
pub fn set_timer_slack(ns: u64) -> io::Result<()> {
    // SAFETY: PR_SET_TIMERSLACK takes an unsigned long value and affects only this thread.
    cvt(unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, ns as libc::c_ulong, 0, 0, 0) })?;
    Ok(())
}

/// Opens a network namespace file (e.g. /run/netns/NAME) for `setns`.
pub fn open_netns(path: &str) -> io::Result<OwnedFd> {
    let file = fs::File::open(path)?;
    Ok(OwnedFd::from(file))
}

/// Moves the calling thread into the network namespace `ns`.
pub fn setns_net(ns: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: ns is an open namespace fd; setns only affects the calling thread for NEWNET.
    cvt(unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) })?;
    Ok(())
}

/// Runs `f` on a short-lived thread that has entered network namespace `ns`; sockets and
/// devices `f` creates belong to that namespace.
pub fn in_netns<T: Send>(ns: BorrowedFd<'_>, f: impl FnOnce() -> T + Send) -> io::Result<T> {
    std::thread::scope(|scope| {
        scope
            .spawn(move || -> io::Result<T> {
                setns_net(ns)?;
                Ok(f())
            })
            .join()
            .map_err(|_| io::Error::other("thread inside the namespace panicked"))?
    })
}

/// Reads a sysctl of the calling thread's network namespace, e.g. `net/ipv4/tcp_rmem`.
pub fn read_sysctl(key: &str) -> io::Result<String> {
    Ok(fs::read_to_string(format!("/proc/sys/{key}"))?
        .trim()
        .to_string())
}

/// Writes a sysctl of the calling thread's network namespace.
pub fn write_sysctl(key: &str, value: &str) -> io::Result<()> {
    fs::write(format!("/proc/sys/{key}"), value).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot set {} = {value:?}: {e}", key.replace('/', ".")),
        )
    })
}

#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    data: [u8; 24],
}

impl IfReq {
    fn new(name: &str) -> io::Result<Self> {
        let bytes = name.as_bytes();
        if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("interface name {name:?} must be 1 to 15 bytes"),
            ));
        }
        let mut r = IfReq {
            name: [0; libc::IFNAMSIZ],
            data: [0; 24],
        };
        r.name[..bytes.len()].copy_from_slice(bytes);
        Ok(r)
    }
    fn set_int(&mut self, v: i32) {
        self.data[..4].copy_from_slice(&v.to_ne_bytes());
    }
    fn set_short(&mut self, v: i16) {
        self.data[..2].copy_from_slice(&v.to_ne_bytes());
    }
    fn short(&self) -> i16 {
        i16::from_ne_bytes([self.data[0], self.data[1]])
    }
    fn set_sockaddr_in(&mut self, addr: Ipv4Addr) {
        // struct sockaddr_in: family (u16), port (u16), addr (4 bytes), zero padding.
        self.data = [0; 24];
        self.data[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        self.data[4..8].copy_from_slice(&addr.octets());
    }
}

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TUN: i16 = 0x0001;
const IFF_NO_PI: i16 = 0x1000;
const IFF_VNET_HDR: i16 = 0x4000;
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
const TUN_F_CSUM: libc::c_uint = 0x01;
const TUN_F_TSO4: libc::c_uint = 0x02;
const SIOCGIFFLAGS: libc::c_ulong = 0x8913;
const SIOCSIFFLAGS: libc::c_ulong = 0x8914;
const SIOCSIFADDR: libc::c_ulong = 0x8916;
const SIOCSIFNETMASK: libc::c_ulong = 0x891c;
const SIOCSIFMTU: libc::c_ulong = 0x8922;
const SIOCSIFTXQLEN: libc::c_ulong = 0x8943;

/// Creates TUN device `name` (IFF_TUN | IFF_NO_PI: raw IP packets, no header) in the calling
/// thread's network namespace; the returned non-blocking fd reads and writes its packets and
/// the device disappears when the fd is closed. With `offload`, every packet is preceded by a
/// `virtio_net_hdr` (IFF_VNET_HDR) and the device offers checksum and TCPv4 segmentation
/// offload (TUNSETOFFLOAD), so the host hands it TCP super-packets of up to 64 KiB (see
/// `gso`).
pub fn create_tun(name: &str, offload: bool) -> io::Result<OwnedFd> {
    let path = CString::new("/dev/net/tun").map_err(io::Error::other)?;
    // SAFETY: valid C string; flags are plain ints.
    let fd = cvt(unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: fd was just returned by open and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut req = IfReq::new(name)?;
    let vnet = if offload { IFF_VNET_HDR } else { 0 };
    req.set_short(IFF_TUN | IFF_NO_PI | vnet);
    // SAFETY: TUNSETIFF reads and writes a struct ifreq, which IfReq mirrors (40 bytes).
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETIFF as _, &mut req) })?;
    if offload {
        // SAFETY: TUNSETOFFLOAD takes the flags as an unsigned long argument by value.
        cvt(unsafe {
            libc::ioctl(
                fd.as_raw_fd(),
                TUNSETOFFLOAD as _,
                (TUN_F_CSUM | TUN_F_TSO4) as libc::c_ulong,
            )
        })
        .map_err(|e| io::Error::new(e.kind(), format!("cannot enable TSO on {name}: {e}")))?;
    }
    Ok(fd)
}

/// Interface configuration through ioctls on an AF_INET socket of the calling thread's
/// namespace.
pub struct IfCtl {
    sock: OwnedFd,
}

impl IfCtl {
    /// A control socket in the calling thread's current network namespace.
    pub fn new() -> io::Result<Self> {
        // SAFETY: plain socket call.
        let fd =
            cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
        // SAFETY: fd just created and owned here.
        Ok(IfCtl {
            sock: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    fn ioctl(&self, req: libc::c_ulong, r: &mut IfReq, what: &str, name: &str) -> io::Result<()> {
        // SAFETY: all requests used here take a struct ifreq, mirrored by IfReq.
        cvt(unsafe { libc::ioctl(self.sock.as_raw_fd(), req as _, r as *mut IfReq) })
            .map_err(|e| io::Error::new(e.kind(), format!("cannot {what} on {name}: {e}")))?;
        Ok(())
    }

    /// Sets the MTU.
    pub fn set_mtu(&self, name: &str, mtu: u32) -> io::Result<()> {
        let mut r = IfReq::new(name)?;
        r.set_int(mtu as i32);
        self.ioctl(SIOCSIFMTU, &mut r, "set mtu", name)
    }

    /// Sets the transmit queue length (packets the host may queue for the emulator).
    pub fn set_txqlen(&self, name: &str, qlen: u32) -> io::Result<()> {
        let mut r = IfReq::new(name)?;
        r.set_int(qlen as i32);
        self.ioctl(SIOCSIFTXQLEN, &mut r, "set txqueuelen", name)
    }

    /// Assigns an IPv4 address and prefix length.
    pub fn set_addr(&self, name: &str, addr: Ipv4Addr, prefix: u8) -> io::Result<()> {
        let mut r = IfReq::new(name)?;
        r.set_sockaddr_in(addr);
        self.ioctl(SIOCSIFADDR, &mut r, "set address", name)?;
        let mask = if prefix == 0 {
            0
        } else {
            u32::MAX << (32 - prefix.min(32) as u32)
        };
        let mut r = IfReq::new(name)?;
        r.set_sockaddr_in(Ipv4Addr::from(mask));
        self.ioctl(SIOCSIFNETMASK, &mut r, "set netmask", name)
    }

    /// Brings the interface up.
    pub fn set_up(&self, name: &str) -> io::Result<()> {
        let mut r = IfReq::new(name)?;
        self.ioctl(SIOCGIFFLAGS, &mut r, "read flags", name)?;
        let flags = r.short() | libc::IFF_UP as i16;
        r.set_short(flags);
        self.ioctl(SIOCSIFFLAGS, &mut r, "bring up", name)
    }
}

/// An epoll instance waiting with nanosecond timeouts (epoll_pwait2, Linux 5.11+).
pub struct Epoll {
    fd: OwnedFd,
}

impl Epoll {
    /// Creates the instance.
    pub fn new() -> io::Result<Self> {
        // SAFETY: plain call.
        let fd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // SAFETY: fd just created.
        Ok(Epoll {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Watches `fd` for input, reporting `token`.
    pub fn add(&self, fd: RawFd, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: token,
        };
        // SAFETY: valid epoll fd and event pointer.
        cvt(unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) })?;
        Ok(())
    }

    /// Waits for events; `timeout_ns` None waits forever. Returns how many were filled in.
    pub fn wait(
        &self,
        events: &mut [libc::epoll_event],
        timeout_ns: Option<u64>,
    ) -> io::Result<usize> {
        let ts = timeout_ns.map(|ns| libc::timespec {
            tv_sec: (ns / 1_000_000_000) as libc::time_t,
            tv_nsec: (ns % 1_000_000_000) as libc::c_long,
        });
        let ts_ptr = ts
            .as_ref()
            .map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: events is a valid writable buffer of the given length; ts_ptr is null or
        // points to a timespec that outlives the call; no signal mask is passed.
        let n = unsafe {
            libc::syscall(
                libc::SYS_epoll_pwait2,
                self.fd.as_raw_fd(),
                events.as_mut_ptr(),
                events.len().min(i32::MAX as usize) as libc::c_int,
                ts_ptr,
                std::ptr::null::<libc::sigset_t>(),
                0usize,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(0);
            }
            return Err(e);
        }
        Ok(n as usize)
    }
}

/// An eventfd used to wake the emulator thread.
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    /// A non-blocking eventfd.
    pub fn new() -> io::Result<Self> {
        // SAFETY: plain call.
        let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?;
        // SAFETY: fd just created.
        Ok(EventFd {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }
    /// Raw fd for epoll.
    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
    /// Wakes the reader.
    pub fn notify(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64; failure (counter overflow) is harmless.
        unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }
    /// Clears pending wake-ups.
    pub fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a valid u64; EAGAIN when nothing pending is fine.
        unsafe { libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }
}

/// `read(2)` into `buf`; Ok(None) when the fd has nothing now (EAGAIN).
pub fn read_nb(fd: RawFd, buf: &mut [u8]) -> io::Result<Option<usize>> {
    loop {
        // SAFETY: buf is valid for writes of its length.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Ok(Some(n as usize));
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::WouldBlock => return Ok(None),
            io::ErrorKind::Interrupted => continue,
            _ => return Err(e),
        }
    }
}

/// `write(2)` of one whole packet.
pub fn write_packet(fd: RawFd, buf: &[u8]) -> io::Result<()> {
    loop {
        // SAFETY: buf is valid for reads of its length.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Whether process `pid` exists (signal 0 succeeds or is refused for permission).
pub fn pid_alive(pid: u32) -> bool {
    if pid == 0 || pid > i32::MAX as u32 {
        return false;
    }
    // SAFETY: signal 0 only checks existence.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Sends `sig` to `pid`, ignoring a process that already exited.
pub fn kill(pid: u32, sig: libc::c_int) {
    if pid == 0 || pid > i32::MAX as u32 {
        return;
    }
    // SAFETY: plain kill; ESRCH is expected for processes that are gone.
    unsafe { libc::kill(pid as libc::pid_t, sig) };
}

/// Whether the caller is root (effective uid 0).
pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Takes an exclusive advisory lock on an open file, blocking; released when the file closes.
pub fn flock_exclusive(file: &fs::File) -> io::Result<()> {
    loop {
        // SAFETY: valid fd.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}
