//! With offloads (the default) hosts hand the emulator TCP super-packets and get joined ones
//! back, yet every byte arrives intact and in order through loss, retransmission and traffic
//! both ways; the bottleneck still sees wire-sized packets. Checksums of such packets are not
//! verified by the receiving kernel, so this test compares the content itself.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use netlab::Lab;

/// Deterministic bytes of stream `seed` (xorshift64*), `len` long, in 64 KiB chunks.
fn pattern(seed: u64, len: usize, mut each: impl FnMut(&[u8])) {
    let mut x = seed | 1;
    let mut chunk = vec![0u8; 64 * 1024];
    let mut left = len;
    while left > 0 {
        let n = left.min(chunk.len());
        for w in chunk[..n].chunks_mut(8) {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            let v = x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes();
            w.copy_from_slice(&v[..w.len()]);
        }
        each(&chunk[..n]);
        left -= n;
    }
}

/// Sends `len` pattern bytes of `seed` over `s` while reading the peer's `len` bytes of
/// `peer_seed`; returns whether what arrived is exactly the peer's pattern.
fn exchange(mut s: TcpStream, seed: u64, peer_seed: u64, len: usize) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut w = s.try_clone().expect("clone");
    let sender = std::thread::spawn(move || {
        pattern(seed, len, |c| w.write_all(c).expect("send"));
        w.flush().expect("flush");
    });
    let mut ok = true;
    let mut got = vec![0u8; 64 * 1024];
    pattern(peer_seed, len, |want| {
        if !ok {
            return;
        }
        let buf = &mut got[..want.len()];
        if s.read_exact(buf).is_err() || buf != want {
            ok = false;
        }
    });
    sender.join().expect("sender");
    ok
}

fn run(offload: bool, mtu: u32, loss: f64) -> netlab::Stats {
    let lab = Lab::builder()
        .site("a", 1)
        .site("b", 1)
        .rate_bps(1_000_000_000)
        .rtt(Duration::from_millis(10))
        .mtu(mtu)
        .loss(loss)
        .offload(offload)
        .build()
        .expect("build lab");
    let b = lab.host("b", 0);
    let addr = SocketAddr::new(b.addr().into(), 5999);
    let listener = b.enter(|| TcpListener::bind(addr)).unwrap().unwrap();
    let client = lab
        .host("a", 0)
        .enter(|| TcpStream::connect_timeout(&addr, Duration::from_secs(10)))
        .unwrap()
        .expect("connect");
    let (server, _) = listener.accept().expect("accept");
    let len = 24 << 20;
    let far = std::thread::spawn(move || exchange(server, 2, 1, len));
    let near = exchange(client, 1, 2, len);
    let far = far.join().expect("far side");
    let stats = lab.shutdown().expect("shutdown");
    println!("offload {offload}, mtu {mtu}, loss {loss}:\n{stats}");
    assert!(
        near && far,
        "bytes arrived changed (a got b's: {near}, b got a's: {far})"
    );
    stats
}

#[test]
fn super_packets_are_cut_and_joined_without_changing_a_byte() {
    netlab::require!();
    let _g = common::serial();
    let s = run(true, 1500, 0.002);
    let ab = s.direction("a").expect("a->b");
    let ba = s.direction("b").expect("b->a");
    assert!(
        ab.drops.loss > 0 && ba.drops.loss > 0,
        "loss was applied per wire packet"
    );
    // Every wire packet fits the MTU: bytes per packet never above 1500.
    assert!(ab.bytes <= ab.packets * 1500 && ba.bytes <= ba.packets * 1500);
    let packets = ab.packets + ba.packets;
    assert!(
        s.device_reads < packets && s.device_writes < packets,
        "offloads in use: {} reads and {} writes for {packets} wire packets",
        s.device_reads,
        s.device_writes
    );
    assert_eq!(s.artefact_drops(), 0, "the emulator dropped nothing itself");
}

#[test]
fn without_offloads_every_packet_is_one_system_call() {
    netlab::require!();
    let _g = common::serial();
    let s = run(false, 9000, 0.001);
    let packets: u64 = s.directions.iter().map(|d| d.offered_packets).sum();
    assert!(
        s.device_reads >= packets,
        "{} reads for {packets} packets",
        s.device_reads
    );
}
