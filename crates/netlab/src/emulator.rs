//! The forwarding thread: reads IP packets from every host's TUN device, routes them by
//! destination address, passes packets between sites through one `Bottleneck` per direction,
//! holds them in a timer heap until their delivery time and writes them to the destination's
//! TUN device. Also keeps the counters and the optional 1 ms "router's view" CSV.
//!
//! One thread, epoll on the TUN fds plus an eventfd for control, `epoll_pwait2` with a
//! nanosecond timeout for the next delivery and 1 ns timer slack (after a sleep longer than
//! 2 ms it wakes 100 us early and polls until due, since an idle CPU wakes late); packet
//! buffers come from a pool, so the steady state allocates nothing per packet.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::gso::{Coalescer, Segments, VNET_HDR_LEN};
use crate::model::{Bottleneck, LinkParams, Nanos, Verdict};
use crate::stats::Counters;
use crate::sys::{self, Epoll, EventFd};

/// Packets due within this much of now are written in the same wake-up.
const EARLY_NS: Nanos = 20_000;
/// Once a packet is due, packets due within this share of the one-way delay go out with it
/// (joined per flow by GRO), bounded by `GRO_MIN_NS` and `GRO_MAX_NS`: timing stays within
/// 1% of the path's delay while one write carries many segments.
const GRO_SHARE: Nanos = 100;
const GRO_MIN_NS: Nanos = 20_000;
const GRO_MAX_NS: Nanos = 250_000;
/// At most this many packets are read from one device per wake-up (fairness between hosts).
const READ_BATCH: usize = 64;
/// Cap on memory held in packet buffers.
const MAX_BUFFER_BYTES: usize = 1 << 30;
const WAKE_TOKEN: u64 = u64::MAX;
/// Waits longer than this wake `SPIN_NS` early and poll (without sleeping) until due.
const LONG_SLEEP_NS: Nanos = 2_000_000;
const SPIN_NS: Nanos = 100_000;

/// What the emulator needs to run: devices, addressing, links.
pub(crate) struct Spec {
    /// One TUN fd per host, in host order, with the host's site index.
    pub tuns: Vec<(OwnedFd, usize)>,
    /// Number of hosts per site.
    pub site_hosts: Vec<usize>,
    /// Link parameters per direction: [0] site 0 -> 1, [1] site 1 -> 0 (empty with one site).
    pub links: Vec<LinkParams>,
    /// Blackouts `(start, end)` in ns since the epoch, applied to both directions.
    pub blackouts: Vec<(Nanos, Nanos)>,
    pub seed: u64,
    /// CLOCK_MONOTONIC ns of the lab's time zero.
    pub epoch: Nanos,
    pub mtu: u32,
    /// The devices were opened with virtio-net headers and TSO (see `gso`).
    pub offload: bool,
    /// CSV file for 1 ms bins of forwarded bytes, with the site names for its header.
    pub record: Option<(PathBuf, Vec<String>)>,
}

/// Requests from the lab to the running emulator.
#[derive(Debug)]
pub(crate) enum Control {
    Stop,
    Blackout { start: Nanos, end: Nanos },
    SetLink { dir: usize, params: LinkParams },
}

pub(crate) struct Shared {
    pub counters: Counters,
    queue: Mutex<Vec<Control>>,
    wake: EventFd,
    cpu_clock: Mutex<Option<libc::clockid_t>>,
    final_cpu_ns: AtomicU64,
    running: AtomicBool,
}

/// Handle on the emulator thread.
pub(crate) struct Emulator {
    pub shared: Arc<Shared>,
    thread: Option<JoinHandle<io::Result<()>>>,
}

impl Emulator {
    /// Starts the thread.
    pub fn start(spec: Spec) -> io::Result<Emulator> {
        let shared = Arc::new(Shared {
            counters: Counters::default(),
            queue: Mutex::new(Vec::new()),
            wake: EventFd::new()?,
            cpu_clock: Mutex::new(None),
            final_cpu_ns: AtomicU64::new(0),
            running: AtomicBool::new(true),
        });
        let sh = shared.clone();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("netlab-emulator".into())
            .spawn(move || {
                if let Ok(id) = sys::current_thread_cpu_clock() {
                    *sh.cpu_clock.lock().unwrap_or_else(|p| p.into_inner()) = Some(id);
                }
                let _ = sys::set_timer_slack(1);
                let mut state = match State::new(spec, &sh) {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = ready_tx.send(Err(io::Error::new(e.kind(), e.to_string())));
                        sh.running.store(false, Relaxed);
                        return Err(e);
                    }
                };
                let _ = ready_tx.send(Ok(()));
                let result = state.run(&sh);
                state.finish();
                if let Ok(t) = Self::thread_cpu(&sh) {
                    sh.final_cpu_ns.store(t.as_nanos() as u64, Relaxed);
                }
                sh.running.store(false, Relaxed);
                result
            })?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Emulator {
                shared,
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => Err(io::Error::other("emulator thread died while starting")),
        }
    }

    fn thread_cpu(sh: &Shared) -> io::Result<Duration> {
        let id = *sh.cpu_clock.lock().unwrap_or_else(|p| p.into_inner());
        match id {
            Some(id) => sys::cpu_clock_time(id),
            None => Err(io::Error::other("no cpu clock")),
        }
    }

    /// CPU time the emulator thread has used (user + system).
    pub fn cpu_time(&self) -> Duration {
        if self.shared.running.load(Relaxed)
            && let Ok(t) = Self::thread_cpu(&self.shared)
        {
            return t;
        }
        Duration::from_nanos(self.shared.final_cpu_ns.load(Relaxed))
    }

    /// Sends a request; it takes effect within microseconds.
    pub fn send(&self, c: Control) {
        self.shared
            .queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(c);
        self.shared.wake.notify();
    }

    /// Stops the thread and waits for it; returns its error if it failed.
    pub fn stop(&mut self) -> io::Result<()> {
        let Some(t) = self.thread.take() else {
            return Ok(());
        };
        self.send(Control::Stop);
        match t.join() {
            Ok(r) => r,
            Err(_) => Err(io::Error::other("emulator thread panicked")),
        }
    }

    /// Whether the thread is still forwarding.
    pub fn is_running(&self) -> bool {
        self.shared.running.load(Relaxed)
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// A packet waiting in the delay line.
struct Pending {
    at: Nanos,
    seq: u64,
    dst: u32,
    /// Bytes of `buf` used, virtio-net header included.
    len: u32,
    dir: u8,
    buf: Box<[u8]>,
}

impl PartialEq for Pending {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Pending {
    /// Reversed, so that `BinaryHeap` pops the earliest (then first sent) packet.
    fn cmp(&self, o: &Self) -> Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

/// Reusable packet buffers.
struct Pool {
    free: Vec<Box<[u8]>>,
    size: usize,
    out: usize,
    max: usize,
}

impl Pool {
    fn get(&mut self) -> Option<Box<[u8]>> {
        if let Some(b) = self.free.pop() {
            self.out += 1;
            return Some(b);
        }
        if self.out < self.max {
            self.out += 1;
            return Some(vec![0u8; self.size].into_boxed_slice());
        }
        None
    }
    fn put(&mut self, b: Box<[u8]>) {
        self.out -= 1;
        self.free.push(b);
    }
}

/// Forwarded bytes per direction in 1 ms bins of departure time, written as CSV rows once a
/// bin can no longer change (departure times are never in the past).
struct Recorder {
    out: BufWriter<File>,
    first_ms: u64,
    bins: VecDeque<[u64; 2]>,
}

impl Recorder {
    fn new(path: &PathBuf, sites: &[String]) -> io::Result<Recorder> {
        let file = File::create(path).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot create recording {}: {e}", path.display()),
            )
        })?;
        let mut out = BufWriter::with_capacity(1 << 16, file);
        let (a, b) = match sites {
            [a, b, ..] => (a.as_str(), b.as_str()),
            [a] => (a.as_str(), a.as_str()),
            [] => ("a", "b"),
        };
        writeln!(out, "t_ms,{a}_to_{b}_bytes,{b}_to_{a}_bytes")?;
        Ok(Recorder {
            out,
            first_ms: 0,
            bins: VecDeque::new(),
        })
    }

    fn add(&mut self, t: Nanos, dir: usize, bytes: u64) {
        let ms = t / 1_000_000;
        let idx = ms.saturating_sub(self.first_ms) as usize;
        while self.bins.len() <= idx {
            self.bins.push_back([0, 0]);
        }
        self.bins[idx][dir & 1] += bytes;
    }

    fn flush_before(&mut self, now: Nanos) -> io::Result<()> {
        let now_ms = now / 1_000_000;
        while self.first_ms < now_ms {
            let b = self.bins.pop_front().unwrap_or([0, 0]);
            writeln!(self.out, "{},{},{}", self.first_ms, b[0], b[1])?;
            self.first_ms += 1;
        }
        Ok(())
    }

    fn finish(&mut self) -> io::Result<()> {
        while let Some(b) = self.bins.pop_front() {
            writeln!(self.out, "{},{},{}", self.first_ms, b[0], b[1])?;
            self.first_ms += 1;
        }
        self.out.flush()
    }
}

struct State {
    epoll: Epoll,
    tuns: Vec<(OwnedFd, usize)>,
    site_hosts: Vec<usize>,
    site_base: Vec<usize>,
    links: Vec<Bottleneck>,
    max_backlog: [u64; 2],
    max_late: [u64; 2],
    heap: BinaryHeap<Pending>,
    seq: u64,
    pool: Pool,
    /// One read from a device (a super-packet of up to 64 KiB with offloads).
    scratch: Box<[u8]>,
    epoch: Nanos,
    recorder: Option<Recorder>,
    /// Bytes of virtio-net header before each packet (0 without offloads).
    hdr: usize,
    /// Per destination host: segments due in this wake-up, joined for one write.
    out: Vec<Outgoing>,
}

/// Flows joined at once per destination host (Linux's GRO keeps 8 per NAPI context).
const GRO_FLOWS: usize = 8;

/// What is being joined for one destination host: one coalescer per flow.
struct Outgoing {
    flows: Vec<(Coalescer, u64)>,
    dir: u8,
}

impl State {
    fn new(spec: Spec, sh: &Shared) -> io::Result<State> {
        let epoll = Epoll::new()?;
        for (i, (fd, _)) in spec.tuns.iter().enumerate() {
            epoll.add(fd.as_raw_fd(), i as u64)?;
        }
        epoll.add(sh.wake.raw(), WAKE_TOKEN)?;
        let mut site_base = Vec::new();
        let mut base = 0;
        for &n in &spec.site_hosts {
            site_base.push(base);
            base += n;
        }
        let mut links: Vec<Bottleneck> = spec
            .links
            .iter()
            .enumerate()
            .map(|(i, p)| {
                Bottleneck::new(
                    p.clone(),
                    spec.seed ^ (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
                )
            })
            .collect();
        for &(s, e) in &spec.blackouts {
            for l in &mut links {
                l.add_blackout(s, e);
            }
        }
        let hdr = if spec.offload { VNET_HDR_LEN } else { 0 };
        let size = (spec.mtu as usize).max(1500) + 64 + hdr;
        let scratch_len = if spec.offload {
            hdr + crate::gso::MAX_IP_PACKET + 64
        } else {
            size
        };
        let hosts = spec.tuns.len();
        let recorder = match &spec.record {
            Some((path, sites)) => Some(Recorder::new(path, sites)?),
            None => None,
        };
        Ok(State {
            epoll,
            tuns: spec.tuns,
            site_hosts: spec.site_hosts,
            site_base,
            links,
            max_backlog: [0; 2],
            max_late: [0; 2],
            heap: BinaryHeap::with_capacity(4096),
            seq: 0,
            pool: Pool {
                free: Vec::new(),
                size,
                out: 0,
                max: MAX_BUFFER_BYTES / size,
            },
            scratch: vec![0u8; scratch_len].into_boxed_slice(),
            epoch: spec.epoch,
            recorder,
            hdr,
            out: (0..hosts)
                .map(|_| Outgoing {
                    flows: (0..GRO_FLOWS).map(|_| (Coalescer::new(), 0)).collect(),
                    dir: 0,
                })
                .collect(),
        })
    }

    fn now(&self) -> Nanos {
        sys::mono_ns().saturating_sub(self.epoch)
    }

    /// Host index of an IPv4 destination 198.18.<site>.<host + 1>.
    fn route(&self, pkt: &[u8]) -> Option<usize> {
        if pkt.len() < 20 || pkt[0] >> 4 != 4 || pkt[16] != 198 || pkt[17] != 18 {
            return None;
        }
        let site = pkt[18] as usize;
        let host = (pkt[19] as usize).checked_sub(1)?;
        if site < self.site_hosts.len() && host < self.site_hosts[site] {
            Some(self.site_base[site] + host)
        } else {
            None
        }
    }

    fn run(&mut self, sh: &Shared) -> io::Result<()> {
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 64];
        let mut spinning = false;
        // Without offloads nothing is joined: deliver what is due within EARLY_NS.
        let batch = if self.hdr == 0 {
            EARLY_NS
        } else {
            let delay = self
                .links
                .iter()
                .map(|l| l.params().delay.as_nanos() as Nanos)
                .min();
            delay.map_or(GRO_MIN_NS, |d| {
                (d / GRO_SHARE).clamp(GRO_MIN_NS, GRO_MAX_NS)
            })
        };
        loop {
            let now = self.now();
            // A delivery starts when the first packet is due (exactly, while spinning; within
            // EARLY_NS otherwise) and takes everything due within `batch` of now. Waking for a
            // read does not start one, so reads do not cut batches short.
            let trigger = if spinning { 0 } else { EARLY_NS };
            if self.heap.peek().is_some_and(|p| p.at <= now + trigger)
                && self.deliver_due(now, batch.max(trigger), sh) > 0
            {
                spinning = false;
            }
            // A long sleep lets the CPU go idle and wakes up to ~100 us late: wake SPIN_NS
            // early and poll for the rest. Short waits (steady traffic) never spin.
            let mut timeout = match self.heap.peek().map(|p| p.at.saturating_sub(now)) {
                None => None,
                Some(t) if t > LONG_SLEEP_NS => {
                    spinning = true;
                    Some(t - SPIN_NS)
                }
                Some(_) if spinning => Some(0),
                Some(t) => Some(t.saturating_sub(EARLY_NS / 2)),
            };
            if let Some(r) = &mut self.recorder {
                r.flush_before(now)?;
                timeout = Some(timeout.map_or(100_000_000, |t| t.min(100_000_000)));
            }
            let n = self.epoll.wait(&mut events, timeout)?;
            for ev in &events[..n] {
                let token = ev.u64;
                if token == WAKE_TOKEN {
                    sh.wake.drain();
                    let cmds =
                        std::mem::take(&mut *sh.queue.lock().unwrap_or_else(|p| p.into_inner()));
                    for c in cmds {
                        match c {
                            Control::Stop => return Ok(()),
                            Control::Blackout { start, end } => {
                                for l in &mut self.links {
                                    l.add_blackout(start, end);
                                }
                            }
                            Control::SetLink { dir, params } => {
                                if let Some(l) = self.links.get_mut(dir) {
                                    l.set_params(params);
                                }
                            }
                        }
                    }
                } else {
                    self.read_from(token as usize, sh);
                }
            }
        }
    }

    fn read_from(&mut self, src: usize, sh: &Shared) {
        let c = &sh.counters;
        let Some(&(ref fd, src_site)) = self.tuns.get(src) else {
            return;
        };
        let fd = fd.as_raw_fd();
        for _ in 0..READ_BATCH {
            let n = match sys::read_nb(fd, &mut self.scratch) {
                Ok(Some(n)) if n > self.hdr => {
                    c.device_reads.fetch_add(1, Relaxed);
                    n
                }
                Ok(Some(_)) => continue,
                _ => return,
            };
            let Some(dst) = self.route(&self.scratch[self.hdr..n]) else {
                c.unroutable.fetch_add(1, Relaxed);
                continue;
            };
            let dst_site = self.tuns[dst].1;
            if dst_site == src_site || self.links.is_empty() {
                // Within a site: straight through, super-packets whole.
                let _ = sys::write_packet(self.tuns[dst].0.as_raw_fd(), &self.scratch[..n]);
                c.device_writes.fetch_add(1, Relaxed);
                c.local_packets.fetch_add(1, Relaxed);
                c.local_bytes.fetch_add((n - self.hdr) as u64, Relaxed);
                continue;
            }
            let dir = src_site & 1;
            if self.hdr == 0 {
                self.offer(dst, dir, n, None, sh);
                continue;
            }
            // Cut super-packets into wire packets; each meets the bottleneck alone.
            let scratch = std::mem::take(&mut self.scratch);
            match Segments::new(&scratch[..n]) {
                Ok(segs) => {
                    for i in 0..segs.len() {
                        let len = VNET_HDR_LEN + segs.wire_len(i);
                        self.offer(dst, dir, len, Some((&segs, i)), sh);
                    }
                }
                Err(_) => {
                    c.unroutable.fetch_add(1, Relaxed);
                }
            }
            self.scratch = scratch;
        }
    }

    /// Passes one wire packet of `len` bytes (header included) to the bottleneck of `dir`:
    /// segment `i` of `seg`, or (without offloads) the packet in `scratch`.
    fn offer(
        &mut self,
        dst: usize,
        dir: usize,
        len: usize,
        seg: Option<(&Segments<'_>, usize)>,
        sh: &Shared,
    ) {
        let d = &sh.counters.dirs[dir];
        let wire = (len - self.hdr) as u64;
        d.offered_packets.fetch_add(1, Relaxed);
        d.offered_bytes.fetch_add(wire, Relaxed);
        let now = self.now();
        match self.links[dir].offer(now, len - self.hdr) {
            Verdict::Drop(cause) => d.drop(cause),
            Verdict::Forward {
                departure,
                deliver_at,
            } => {
                let Some(mut buf) = self.pool.get() else {
                    sh.counters.no_buffer.fetch_add(1, Relaxed);
                    return;
                };
                match seg {
                    Some((segs, i)) => {
                        segs.write(i, &mut buf);
                    }
                    None => buf[..len].copy_from_slice(&self.scratch[..len]),
                }
                let backlog = self.links[dir].backlog_bytes(now);
                if backlog > self.max_backlog[dir] {
                    self.max_backlog[dir] = backlog;
                    d.max_backlog.store(backlog, Relaxed);
                }
                if let Some(r) = &mut self.recorder {
                    r.add(departure, dir, wire);
                }
                self.seq += 1;
                self.heap.push(Pending {
                    at: deliver_at,
                    seq: self.seq,
                    dst: dst as u32,
                    len: len as u32,
                    dir: dir as u8,
                    buf,
                });
            }
        }
    }

    /// Writes every packet due by `now + early`; returns how many. With offloads, the due
    /// segments of one flow to one host are joined into one write, as a NIC's GRO would.
    fn deliver_due(&mut self, now: Nanos, early: Nanos, sh: &Shared) -> usize {
        let until = now + early;
        let mut n = 0;
        while self.heap.peek().is_some_and(|p| p.at <= until) {
            let Some(p) = self.heap.pop() else { break };
            let d = &sh.counters.dirs[p.dir as usize];
            let late = now.saturating_sub(p.at);
            if late > 0 {
                d.late_sum_ns.fetch_add(late, Relaxed);
                if late > 1_000_000 {
                    d.late_over_1ms.fetch_add(1, Relaxed);
                }
                if late > self.max_late[p.dir as usize] {
                    self.max_late[p.dir as usize] = late;
                    d.late_max_ns.store(late, Relaxed);
                }
            }
            n += 1;
            let pkt = &p.buf[..p.len as usize];
            let wire = (p.len as usize - self.hdr) as u64;
            if self.hdr == 0 {
                let fd = self.tuns[p.dst as usize].0.as_raw_fd();
                sh.counters.device_writes.fetch_add(1, Relaxed);
                match sys::write_packet(fd, pkt) {
                    Ok(()) => {
                        d.packets.fetch_add(1, Relaxed);
                        d.bytes.fetch_add(wire, Relaxed);
                    }
                    Err(_) => {
                        d.drop_other.fetch_add(1, Relaxed);
                    }
                }
                self.pool.put(p.buf);
                continue;
            }
            let dst = p.dst as usize;
            self.out[dst].dir = p.dir;
            // The slot of this packet's flow, else an empty one, else the first is written
            // out to make room; packets of one flow keep their order.
            let key = crate::gso::flow_key(pkt);
            let flows = &self.out[dst].flows;
            let slot = flows
                .iter()
                .position(|(c, _)| key.is_some() && c.key() == key)
                .or_else(|| flows.iter().position(|(c, _)| c.is_empty()))
                .unwrap_or(0);
            if !self.out[dst].flows[slot].0.push(pkt) {
                self.flush_flow(dst, slot, sh);
                self.out[dst].flows[slot].0.push(pkt);
            }
            self.out[dst].flows[slot].1 += wire;
            self.pool.put(p.buf);
        }
        for dst in 0..self.out.len() {
            for slot in 0..GRO_FLOWS {
                self.flush_flow(dst, slot, sh);
            }
        }
        n
    }

    /// Writes what is joined in one flow slot of host `dst`, if anything.
    fn flush_flow(&mut self, dst: usize, slot: usize, sh: &Shared) {
        let o = &mut self.out[dst];
        let (co, bytes) = &mut o.flows[slot];
        if co.is_empty() {
            return;
        }
        let segs = co.segments() as u64;
        let bytes = std::mem::take(bytes);
        let d = &sh.counters.dirs[o.dir as usize];
        let fd = self.tuns[dst].0.as_raw_fd();
        sh.counters.device_writes.fetch_add(1, Relaxed);
        match sys::write_packet(fd, co.finish()) {
            Ok(()) => {
                d.packets.fetch_add(segs, Relaxed);
                d.bytes.fetch_add(bytes, Relaxed);
            }
            Err(_) => {
                d.drop_other.fetch_add(segs, Relaxed);
            }
        }
    }

    fn finish(&mut self) {
        let now = self.now();
        if let Some(r) = &mut self.recorder {
            let _ = r.flush_before(now);
            let _ = r.finish();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heap_pops_earliest_then_first_sent() {
        let mut h = BinaryHeap::new();
        for (at, seq) in [(5, 1), (3, 2), (5, 0), (9, 3)] {
            h.push(Pending {
                at,
                seq,
                dst: 0,
                len: 0,
                dir: 0,
                buf: Box::new([]),
            });
        }
        let order: Vec<(u64, u64)> =
            std::iter::from_fn(|| h.pop().map(|p| (p.at, p.seq))).collect();
        assert_eq!(order, vec![(3, 2), (5, 0), (5, 1), (9, 3)]);
    }

    #[test]
    fn pool_reuses_and_caps() {
        let mut p = Pool {
            free: Vec::new(),
            size: 16,
            out: 0,
            max: 2,
        };
        let a = p.get().unwrap();
        let b = p.get().unwrap();
        assert!(p.get().is_none());
        p.put(a);
        let c = p.get().unwrap();
        assert_eq!(c.len(), 16);
        p.put(b);
        p.put(c);
        assert_eq!(p.free.len(), 2);
    }
}
