//! TCP segmentation and coalescing for TUN devices opened with virtio-net headers
//! (`IFF_VNET_HDR` plus `TUNSETOFFLOAD` TSO4): what lets the emulator carry MTU 1500 at
//! 1 Gbit/s and more on two cores.
//!
//! With offloads on, a host's TCP hands the device super-packets of up to 64 KiB, each read
//! as one `virtio_net_hdr` plus one IP packet, instead of ~43 reads of 1500 bytes. The
//! emulator cuts each into the packets a real wire would carry ([`Segments`]) so that the
//! bottleneck queues, drops and delays every one of them alone. On the way out it does what a
//! NIC's GRO does ([`Coalescer`]): consecutive segments of one flow that are due together are
//! joined again and written with one `write`, so the receiving host's TCP stack — whose work
//! is charged to the emulator's thread, since a TUN write delivers the packet in the writer's
//! context — handles one large packet instead of many.
//!
//! Written by hand because no crate does user-space TSO/GRO on raw IP packets (the
//! wireguard-go and tailscale TUN drivers do the same in Go). Pure functions on byte slices:
//! every input comes from a host of the lab, but is still treated as untrusted (bounds
//! checked, never panics; `fuzz/` exercises it).
//!
//! Checksums: every TCP segment is written with `VIRTIO_NET_HDR_F_NEEDS_CSUM`, which a Linux
//! receiver of a local packet takes as "checksum partial, not to be verified"; its TCP
//! checksum field holds the pseudo-header sum, as the kernel's own segments do. IPv4 header
//! checksums are recomputed for every packet whose header changes.

/// Size of `struct virtio_net_hdr` (the TUN default; no `num_buffers` field).
pub const VNET_HDR_LEN: usize = 10;
/// `VIRTIO_NET_HDR_F_NEEDS_CSUM`.
pub const F_NEEDS_CSUM: u8 = 1;
/// `VIRTIO_NET_HDR_GSO_NONE`.
pub const GSO_NONE: u8 = 0;
/// `VIRTIO_NET_HDR_GSO_TCPV4`.
pub const GSO_TCPV4: u8 = 1;
/// `VIRTIO_NET_HDR_GSO_ECN` (flag bit on `gso_type`).
pub const GSO_ECN: u8 = 0x80;
/// Largest IPv4 packet (its total length is 16 bits).
pub const MAX_IP_PACKET: usize = 65_535;

const TCP_FIN: u8 = 0x01;
const TCP_SYN: u8 = 0x02;
const TCP_RST: u8 = 0x04;
const TCP_PSH: u8 = 0x08;
const TCP_ACK: u8 = 0x10;
const TCP_URG: u8 = 0x20;
const TCP_CWR: u8 = 0x80;

/// The virtio-net header that precedes every packet on a TUN device with `IFF_VNET_HDR`
/// (native byte order, which is what the kernel uses unless told otherwise).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VnetHdr {
    pub flags: u8,
    pub gso_type: u8,
    pub hdr_len: u16,
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
}

impl VnetHdr {
    /// Reads the header at the start of `b`.
    pub fn parse(b: &[u8]) -> Option<VnetHdr> {
        let b: &[u8; VNET_HDR_LEN] = b.get(..VNET_HDR_LEN)?.try_into().ok()?;
        let u16_at = |i: usize| u16::from_ne_bytes([b[i], b[i + 1]]);
        Some(VnetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u16_at(2),
            gso_size: u16_at(4),
            csum_start: u16_at(6),
            csum_offset: u16_at(8),
        })
    }

    /// Writes the header into the first `VNET_HDR_LEN` bytes of `b`.
    pub fn write(&self, b: &mut [u8]) {
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_ne_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_ne_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_ne_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_ne_bytes());
    }

    /// The header of one TCP segment whose checksum the receiver need not verify.
    fn tcp_partial(ip_hl: usize) -> VnetHdr {
        VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: GSO_NONE,
            hdr_len: 0,
            gso_size: 0,
            csum_start: ip_hl as u16,
            csum_offset: 16,
        }
    }
}

/// Why a packet read from a device cannot be cut into segments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmentError {
    /// Shorter than its headers say, or a header field out of range.
    Malformed,
    /// A GSO type other than TCP over IPv4 (the device never offers the others).
    Unsupported,
}

/// The wire packets of one packet read from a TUN device: a GSO super-packet is cut into
/// `gso_size` payloads, anything else is one packet as it came.
#[derive(Clone, Debug)]
pub struct Segments<'a> {
    hdr: VnetHdr,
    /// The IP packet (after the virtio-net header).
    ip: &'a [u8],
    /// IPv4 header length and IP + TCP header length (0 when not split).
    ip_hl: usize,
    hdrs: usize,
    mss: usize,
    count: usize,
}

impl<'a> Segments<'a> {
    /// Parses `read` (virtio-net header + IP packet) and plans its segments.
    pub fn new(read: &'a [u8]) -> Result<Segments<'a>, SegmentError> {
        let hdr = VnetHdr::parse(read).ok_or(SegmentError::Malformed)?;
        let ip = &read[VNET_HDR_LEN..];
        if hdr.gso_type == GSO_NONE {
            return Ok(Segments {
                hdr,
                ip,
                ip_hl: 0,
                hdrs: 0,
                mss: 0,
                count: 1,
            });
        }
        if hdr.gso_type & !GSO_ECN != GSO_TCPV4 {
            return Err(SegmentError::Unsupported);
        }
        let (ip_hl, tcp_hl) = tcp4_header_lengths(ip).ok_or(SegmentError::Malformed)?;
        let hdrs = ip_hl + tcp_hl;
        let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
        // The kernel may leave total length 0 on super-packets; trust the read length then.
        if total != 0 && total != ip.len() {
            return Err(SegmentError::Malformed);
        }
        let mss = usize::from(hdr.gso_size);
        if mss == 0 || ip.len() <= hdrs {
            return Err(SegmentError::Malformed);
        }
        let count = (ip.len() - hdrs).div_ceil(mss);
        Ok(Segments {
            hdr,
            ip,
            ip_hl,
            hdrs,
            mss,
            count,
        })
    }

    /// Number of wire packets.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Never true: every packet has at least one segment.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Length of segment `i` on the wire (IP packet, without the virtio-net header).
    pub fn wire_len(&self, i: usize) -> usize {
        if self.hdrs == 0 {
            return self.ip.len();
        }
        let payload = self.ip.len() - self.hdrs;
        let start = i * self.mss;
        self.hdrs + self.mss.min(payload.saturating_sub(start))
    }

    /// Writes segment `i` (virtio-net header + IP packet) into `out`, which must hold
    /// `VNET_HDR_LEN + wire_len(i)` bytes; returns the bytes written.
    pub fn write(&self, i: usize, out: &mut [u8]) -> usize {
        let wire = self.wire_len(i);
        let n = VNET_HDR_LEN + wire;
        if self.hdrs == 0 {
            self.hdr.write(out);
            out[VNET_HDR_LEN..n].copy_from_slice(self.ip);
            return n;
        }
        VnetHdr::tcp_partial(self.ip_hl).write(out);
        let pkt = &mut out[VNET_HDR_LEN..n];
        let start = self.hdrs + i * self.mss;
        pkt[..self.hdrs].copy_from_slice(&self.ip[..self.hdrs]);
        pkt[self.hdrs..].copy_from_slice(&self.ip[start..start + (wire - self.hdrs)]);
        // IPv4: length, identification (+i, as the kernel's segmentation does), checksum.
        pkt[2..4].copy_from_slice(&(wire as u16).to_be_bytes());
        let id = u16::from_be_bytes([pkt[4], pkt[5]]).wrapping_add(i as u16);
        pkt[4..6].copy_from_slice(&id.to_be_bytes());
        set_ipv4_checksum(&mut pkt[..self.ip_hl]);
        // TCP: sequence number; CWR only on the first segment, FIN and PSH only on the last.
        let tcp = &mut pkt[self.ip_hl..];
        let seq = u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]])
            .wrapping_add((i * self.mss) as u32);
        tcp[4..8].copy_from_slice(&seq.to_be_bytes());
        if i > 0 {
            tcp[13] &= !TCP_CWR;
        }
        if i + 1 < self.count {
            tcp[13] &= !(TCP_FIN | TCP_PSH);
        }
        let pseudo = tcp4_pseudo_sum(&pkt[..self.ip_hl], wire - self.ip_hl);
        let tcp = &mut pkt[self.ip_hl..];
        tcp[16..18].copy_from_slice(&pseudo.to_be_bytes());
        n
    }
}

/// IPv4 header length and TCP header length of a TCP/IPv4 packet, checked against its size.
fn tcp4_header_lengths(ip: &[u8]) -> Option<(usize, usize)> {
    if ip.len() < 20 || ip[0] >> 4 != 4 || ip[9] != 6 {
        return None;
    }
    let ip_hl = usize::from(ip[0] & 0x0f) * 4;
    if ip_hl < 20 || ip.len() < ip_hl + 20 {
        return None;
    }
    // Fragments are never segmented or joined.
    if u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff != 0 {
        return None;
    }
    let tcp_hl = usize::from(ip[ip_hl + 12] >> 4) * 4;
    if tcp_hl < 20 || ip.len() < ip_hl + tcp_hl {
        return None;
    }
    Some((ip_hl, tcp_hl))
}

/// Ones' complement sum of 16-bit big-endian words (an odd last byte is padded with zero).
fn sum16(b: &[u8], mut acc: u32) -> u32 {
    let mut chunks = b.chunks_exact(2);
    for c in &mut chunks {
        acc += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        acc += u32::from(*last) << 8;
    }
    acc
}

fn fold(mut acc: u32) -> u16 {
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// Recomputes the checksum of an IPv4 header in place.
pub fn set_ipv4_checksum(h: &mut [u8]) {
    h[10] = 0;
    h[11] = 0;
    let c = !fold(sum16(h, 0));
    h[10..12].copy_from_slice(&c.to_be_bytes());
}

/// The TCP pseudo-header sum (not complemented) the kernel leaves in a partially
/// checksummed segment of `tcp_len` bytes.
fn tcp4_pseudo_sum(ip_hdr: &[u8], tcp_len: usize) -> u16 {
    let acc = sum16(&ip_hdr[12..20], 6 + tcp_len as u32);
    fold(acc)
}

/// Joins consecutive TCP segments of one flow into one GSO packet for one `write`, by the
/// rules Linux's GRO uses: same addresses and ports, the next sequence number, the same
/// acknowledgment, window, options, TOS and TTL, only ACK (and PSH on the last) set, every
/// segment but the last of the first one's payload size, at most 64 KiB in all.
pub struct Coalescer {
    /// virtio-net header + IP packet being built.
    buf: Vec<u8>,
    /// Flow of what is held.
    key: Option<[u8; 12]>,
    /// Segments joined so far (0: empty).
    segs: usize,
    ip_hl: usize,
    hdrs: usize,
    mss: usize,
    next_seq: u32,
    /// Whether the last segment was shorter than `mss` or carried PSH (nothing may follow).
    closed: bool,
}

impl Default for Coalescer {
    fn default() -> Self {
        Self::new()
    }
}

impl Coalescer {
    pub fn new() -> Coalescer {
        Coalescer {
            buf: Vec::with_capacity(VNET_HDR_LEN + MAX_IP_PACKET),
            key: None,
            segs: 0,
            ip_hl: 0,
            hdrs: 0,
            mss: 0,
            next_seq: 0,
            closed: true,
        }
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.segs == 0
    }

    /// Number of wire packets held.
    pub fn segments(&self) -> usize {
        self.segs
    }

    /// The flow of what is held (None when empty or not TCP/IPv4).
    pub fn key(&self) -> Option<[u8; 12]> {
        if self.segs == 0 { None } else { self.key }
    }

    /// Adds one wire packet (virtio-net header + IP packet, as `Segments::write` makes them).
    /// Returns false, holding nothing new, when it cannot join what is held: the caller then
    /// writes out `finish()` and pushes the packet again. An empty coalescer takes anything.
    pub fn push(&mut self, pkt: &[u8]) -> bool {
        if self.segs == 0 {
            self.start(pkt);
            return true;
        }
        if self.closed || !self.joins(pkt) {
            return false;
        }
        let ip = &pkt[VNET_HDR_LEN..];
        let payload = &ip[self.hdrs..];
        self.buf.extend_from_slice(payload);
        self.segs += 1;
        self.next_seq = self.next_seq.wrapping_add(payload.len() as u32);
        let flags = ip[self.ip_hl + 13];
        if payload.len() < self.mss || flags & TCP_PSH != 0 {
            self.closed = true;
        }
        if flags & TCP_PSH != 0 {
            let at = VNET_HDR_LEN + self.ip_hl + 13;
            self.buf[at] |= TCP_PSH;
        }
        true
    }

    fn start(&mut self, pkt: &[u8]) {
        self.buf.clear();
        self.buf.extend_from_slice(pkt);
        self.segs = 1;
        self.closed = true;
        self.key = flow_key(pkt);
        let Some(hdr) = VnetHdr::parse(pkt) else {
            return;
        };
        let ip = &pkt[VNET_HDR_LEN..];
        if hdr.gso_type != GSO_NONE {
            return;
        }
        let Some((ip_hl, tcp_hl)) = tcp4_header_lengths(ip) else {
            return;
        };
        let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
        let flags = ip[ip_hl + 13];
        let payload = ip.len() - ip_hl - tcp_hl;
        // Only plain data segments start a chain (PSH allowed: it just ends the chain).
        if total != ip.len()
            || payload == 0
            || flags & !(TCP_PSH | TCP_CWR) != TCP_ACK
            || flags & TCP_PSH != 0
        {
            return;
        }
        self.ip_hl = ip_hl;
        self.hdrs = ip_hl + tcp_hl;
        self.mss = payload;
        let seq = u32::from_be_bytes([ip[ip_hl + 4], ip[ip_hl + 5], ip[ip_hl + 6], ip[ip_hl + 7]]);
        self.next_seq = seq.wrapping_add(payload as u32);
        self.closed = false;
    }

    fn joins(&self, pkt: &[u8]) -> bool {
        let Some(hdr) = VnetHdr::parse(pkt) else {
            return false;
        };
        let ip = &pkt[VNET_HDR_LEN..];
        if hdr.gso_type != GSO_NONE || ip.len() <= self.hdrs {
            return false;
        }
        let held = &self.buf[VNET_HDR_LEN..VNET_HDR_LEN + self.hdrs];
        let Some((ip_hl, tcp_hl)) = tcp4_header_lengths(ip) else {
            return false;
        };
        if ip_hl + tcp_hl != self.hdrs || ip_hl != self.ip_hl {
            return false;
        }
        let payload = ip.len() - self.hdrs;
        if usize::from(u16::from_be_bytes([ip[2], ip[3]])) != ip.len()
            || payload > self.mss
            || self.buf.len() + payload > VNET_HDR_LEN + MAX_IP_PACKET
        {
            return false;
        }
        let t = ip_hl;
        // IP: version/IHL, TOS, flags (DF), TTL, protocol, addresses.
        let same_ip = ip[0..2] == held[0..2]
            && ip[6] & 0xe0 == held[6] & 0xe0
            && ip[8..10] == held[8..10]
            && ip[12..20] == held[12..20];
        // TCP: ports, next sequence, acknowledgment, data offset, window, options.
        let seq = u32::from_be_bytes([ip[t + 4], ip[t + 5], ip[t + 6], ip[t + 7]]);
        let flags = ip[t + 13];
        same_ip
            && ip[t..t + 4] == held[t..t + 4]
            && seq == self.next_seq
            && ip[t + 8..t + 13] == held[t + 8..t + 13]
            && flags & !TCP_PSH == TCP_ACK
            && ip[t + 14..t + 16] == held[t + 14..t + 16]
            && ip[t + 18..self.hdrs] == held[t + 18..self.hdrs]
    }

    /// The packet to write for what is held (virtio-net header + IP packet), and empties the
    /// coalescer. One segment is returned as it came.
    pub fn finish(&mut self) -> &[u8] {
        let segs = std::mem::take(&mut self.segs);
        if segs > 1 {
            let ip_len = self.buf.len() - VNET_HDR_LEN;
            let ip = &mut self.buf[VNET_HDR_LEN..];
            ip[2..4].copy_from_slice(&(ip_len as u16).to_be_bytes());
            set_ipv4_checksum(&mut ip[..self.ip_hl]);
            let pseudo = tcp4_pseudo_sum(&ip[..self.ip_hl], ip_len - self.ip_hl);
            ip[self.ip_hl + 16..self.ip_hl + 18].copy_from_slice(&pseudo.to_be_bytes());
            VnetHdr {
                flags: F_NEEDS_CSUM,
                gso_type: GSO_TCPV4,
                hdr_len: self.hdrs as u16,
                gso_size: self.mss as u16,
                csum_start: self.ip_hl as u16,
                csum_offset: 16,
            }
            .write(&mut self.buf);
        }
        self.closed = true;
        &self.buf
    }
}

/// The TCP/IPv4 flow a wire packet (virtio-net header + IP packet) belongs to: addresses and
/// ports. None for anything else.
pub fn flow_key(pkt: &[u8]) -> Option<[u8; 12]> {
    let ip = pkt.get(VNET_HDR_LEN..)?;
    let (ip_hl, _) = tcp4_header_lengths(ip)?;
    let mut k = [0u8; 12];
    k[..8].copy_from_slice(&ip[12..20]);
    k[8..].copy_from_slice(&ip[ip_hl..ip_hl + 4]);
    Some(k)
}

/// Whether a wire packet is a TCP segment that carries a SYN, FIN, RST or URG (for tests and
/// diagnostics).
pub fn is_control_segment(ip: &[u8]) -> bool {
    tcp4_header_lengths(ip)
        .is_some_and(|(hl, _)| ip[hl + 13] & (TCP_SYN | TCP_FIN | TCP_RST | TCP_URG) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TCP/IPv4 packet with `payload` bytes (value = offset mod 251), 12 bytes of options.
    fn tcp_packet(seq: u32, payload: usize, flags: u8, id: u16) -> Vec<u8> {
        let (ip_hl, tcp_hl) = (20, 32);
        let mut p = vec![0u8; ip_hl + tcp_hl + payload];
        let len = p.len() as u16;
        p[0] = 0x45;
        p[2..4].copy_from_slice(&len.to_be_bytes());
        p[4..6].copy_from_slice(&id.to_be_bytes());
        p[6] = 0x40;
        p[8] = 64;
        p[9] = 6;
        p[12..16].copy_from_slice(&[198, 18, 0, 1]);
        p[16..20].copy_from_slice(&[198, 18, 1, 1]);
        set_ipv4_checksum(&mut p[..20]);
        let t = &mut p[ip_hl..];
        t[0..2].copy_from_slice(&40000u16.to_be_bytes());
        t[2..4].copy_from_slice(&5811u16.to_be_bytes());
        t[4..8].copy_from_slice(&seq.to_be_bytes());
        t[8..12].copy_from_slice(&777u32.to_be_bytes());
        t[12] = ((tcp_hl / 4) as u8) << 4;
        t[13] = flags;
        t[14..16].copy_from_slice(&512u16.to_be_bytes());
        t[20..32].copy_from_slice(&[1, 1, 8, 10, 0, 0, 0, 9, 0, 0, 0, 3]);
        for (i, b) in p[ip_hl + tcp_hl..].iter_mut().enumerate() {
            *b = ((seq as usize + i) % 251) as u8;
        }
        p
    }

    fn with_hdr(h: VnetHdr, ip: &[u8]) -> Vec<u8> {
        let mut v = vec![0u8; VNET_HDR_LEN];
        h.write(&mut v);
        v.extend_from_slice(ip);
        v
    }

    fn gso(seq: u32, payload: usize, mss: u16, flags: u8) -> Vec<u8> {
        let ip = tcp_packet(seq, payload, flags, 100);
        with_hdr(
            VnetHdr {
                flags: F_NEEDS_CSUM,
                gso_type: GSO_TCPV4,
                hdr_len: 52,
                gso_size: mss,
                csum_start: 20,
                csum_offset: 16,
            },
            &ip,
        )
    }

    fn all_segments(read: &[u8]) -> Vec<Vec<u8>> {
        let s = Segments::new(read).unwrap();
        (0..s.len())
            .map(|i| {
                let mut out = vec![0u8; VNET_HDR_LEN + s.wire_len(i)];
                let n = s.write(i, &mut out);
                assert_eq!(n, out.len());
                out
            })
            .collect()
    }

    fn ipv4_checksum_ok(h: &[u8]) -> bool {
        fold(sum16(h, 0)) == 0xffff
    }

    #[test]
    fn vnet_header_round_trips() {
        let h = VnetHdr {
            flags: 1,
            gso_type: GSO_TCPV4,
            hdr_len: 52,
            gso_size: 1448,
            csum_start: 20,
            csum_offset: 16,
        };
        let mut b = [0u8; VNET_HDR_LEN];
        h.write(&mut b);
        assert_eq!(VnetHdr::parse(&b), Some(h));
        assert_eq!(VnetHdr::parse(&b[..9]), None);
    }

    #[test]
    fn super_packet_is_cut_into_wire_packets() {
        let read = gso(1000, 1448 * 3 + 500, 1448, TCP_ACK | TCP_PSH | TCP_CWR);
        let segs = all_segments(&read);
        assert_eq!(segs.len(), 4);
        let mut seq = 1000u32;
        for (i, s) in segs.iter().enumerate() {
            let h = VnetHdr::parse(s).unwrap();
            assert_eq!(
                (h.gso_type, h.flags, h.csum_start, h.csum_offset),
                (0, 1, 20, 16)
            );
            let ip = &s[VNET_HDR_LEN..];
            let len = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
            assert_eq!(len, ip.len());
            assert_eq!(len, 52 + if i < 3 { 1448 } else { 500 });
            assert_eq!(u16::from_be_bytes([ip[4], ip[5]]), 100 + i as u16);
            assert!(ipv4_checksum_ok(&ip[..20]));
            assert_eq!(u32::from_be_bytes(ip[24..28].try_into().unwrap()), seq);
            let flags = ip[33];
            assert_eq!(flags & TCP_CWR != 0, i == 0, "CWR only on the first");
            assert_eq!(flags & TCP_PSH != 0, i == 3, "PSH only on the last");
            // Payload is the right slice of the stream.
            for (k, b) in ip[52..].iter().enumerate() {
                assert_eq!(*b, ((seq as usize + k) % 251) as u8);
            }
            seq += (len - 52) as u32;
        }
    }

    #[test]
    fn segments_coalesce_back_into_one_gso_packet() {
        let read = gso(5000, 1448 * 10 + 7, 1448, TCP_ACK | TCP_PSH);
        let segs = all_segments(&read);
        let mut c = Coalescer::new();
        for s in &segs {
            assert!(c.push(s));
        }
        assert_eq!(c.segments(), 11);
        let out = c.finish().to_vec();
        let h = VnetHdr::parse(&out).unwrap();
        assert_eq!((h.gso_type, h.gso_size, h.hdr_len), (GSO_TCPV4, 1448, 52));
        let ip = &out[VNET_HDR_LEN..];
        assert_eq!(ip.len(), 52 + 1448 * 10 + 7);
        assert_eq!(
            usize::from(u16::from_be_bytes([ip[2], ip[3]])),
            ip.len(),
            "total length covers the joined payload"
        );
        assert!(ipv4_checksum_ok(&ip[..20]));
        assert_ne!(ip[33] & TCP_PSH, 0, "PSH of the last segment kept");
        // And cutting it again gives the same wire packets (except the IP id, which GRO keeps
        // from the first).
        let again = all_segments(&out);
        assert_eq!(again.len(), segs.len());
        for (a, b) in again.iter().zip(&segs) {
            assert_eq!(a[VNET_HDR_LEN + 20..], b[VNET_HDR_LEN + 20..]);
        }
        assert!(c.is_empty());
    }

    #[test]
    fn coalescer_refuses_what_gro_would_not_join() {
        let base =
            |seq, len, flags| with_hdr(VnetHdr::tcp_partial(20), &tcp_packet(seq, len, flags, 1));
        let first = base(0, 1000, TCP_ACK);
        // Gap in sequence numbers.
        let mut c = Coalescer::new();
        assert!(c.push(&first));
        assert!(!c.push(&base(1001, 1000, TCP_ACK)));
        // FIN or SYN.
        assert!(!c.push(&base(1000, 1000, TCP_ACK | TCP_FIN)));
        // Larger than the first segment.
        assert!(!c.push(&base(1000, 1200, TCP_ACK)));
        // Different acknowledgment.
        let mut other_ack = base(1000, 1000, TCP_ACK);
        other_ack[VNET_HDR_LEN + 28..VNET_HDR_LEN + 32].copy_from_slice(&5u32.to_be_bytes());
        assert!(!c.push(&other_ack));
        // Different port.
        let mut other_port = base(1000, 1000, TCP_ACK);
        other_port[VNET_HDR_LEN + 21] ^= 1;
        assert!(!c.push(&other_port));
        assert_eq!(c.segments(), 1);
        // A short segment ends the chain.
        assert!(c.push(&base(1000, 400, TCP_ACK)));
        assert!(!c.push(&base(1400, 400, TCP_ACK)));
        assert_eq!(c.segments(), 2);
        // A pure ACK or non-TCP packet is held alone and comes back unchanged.
        let ack = base(0, 0, TCP_ACK);
        let mut c = Coalescer::new();
        assert!(c.push(&ack));
        assert!(!c.push(&first));
        assert_eq!(c.finish(), &ack[..]);
    }

    #[test]
    fn plain_packets_pass_unchanged() {
        let udp = {
            let mut p = tcp_packet(0, 100, TCP_ACK, 1);
            p[9] = 17;
            with_hdr(VnetHdr::default(), &p)
        };
        let segs = all_segments(&udp);
        assert_eq!(segs, vec![udp]);
    }

    #[test]
    fn malformed_super_packets_are_refused_not_panicking() {
        let good = gso(0, 5000, 1448, TCP_ACK);
        assert!(Segments::new(&good).is_ok());
        for cut in 0..good.len().min(80) {
            let _ = Segments::new(&good[..cut]);
        }
        let mut zero_mss = good.clone();
        zero_mss[4] = 0;
        zero_mss[5] = 0;
        assert_eq!(
            Segments::new(&zero_mss).unwrap_err(),
            SegmentError::Malformed
        );
        let mut udp_gso = good.clone();
        udp_gso[1] = 5;
        assert_eq!(
            Segments::new(&udp_gso).unwrap_err(),
            SegmentError::Unsupported
        );
        let mut short_total = good.clone();
        short_total[VNET_HDR_LEN + 2] = 0x01;
        assert_eq!(
            Segments::new(&short_total).unwrap_err(),
            SegmentError::Malformed
        );
    }
}
