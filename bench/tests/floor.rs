//! `haul-floor` over loopback: the file arrives whole under its name, and a sender whose
//! receiver is gone fails with exit 1 and one line.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const FLOOR: &str = env!("CARGO_BIN_EXE_haul-floor");

struct Receiver(Child);

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn start_receiver(dir: &Path) -> (Receiver, String) {
    let addr = format!("127.0.0.1:{}", free_port());
    let child = Command::new(FLOOR)
        .arg("recv")
        .arg(&addr)
        .arg(dir)
        .spawn()
        .expect("start haul-floor recv");
    let r = Receiver(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(&addr).is_err() {
        assert!(Instant::now() < deadline, "haul-floor recv did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    (r, addr)
}

#[test]
fn a_file_arrives_whole_under_its_name() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(&dst).unwrap();
    // 3 MiB + 1 byte: more than one receive buffer, and not a multiple of it.
    let data: Vec<u8> = (0..(3usize << 20) + 1)
        .map(|i| (i * 31 % 251) as u8)
        .collect();
    std::fs::write(src.join("f.bin"), &data).unwrap();
    let (_r, addr) = start_receiver(&dst);
    for with_crc in [false, true] {
        // The receiver serves one connection after another.
        let _ = std::fs::remove_file(dst.join("f.bin"));
        let st = Command::new(FLOOR)
            .arg("send")
            .args(with_crc.then_some("--crc"))
            .arg(&addr)
            .arg(src.join("f.bin"))
            .status()
            .unwrap();
        assert!(st.success());
        assert_eq!(std::fs::read(dst.join("f.bin")).unwrap(), data);
        assert!(!dst.join("f.bin.floor-part").exists());
    }
}

#[test]
fn a_wrong_crc_is_refused_and_the_file_removed() {
    use std::io::{Read, Write};
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path();
    let (_r, addr) = start_receiver(dst);
    let mut c = std::net::TcpStream::connect(&addr).unwrap();
    let mut msg = Vec::new();
    msg.extend_from_slice(&1u16.to_be_bytes());
    msg.push(b'g');
    msg.extend_from_slice(&3u64.to_be_bytes());
    msg.push(1);
    msg.extend_from_slice(b"abc");
    msg.extend_from_slice(&0xdead_beefu32.to_be_bytes());
    c.write_all(&msg).unwrap();
    let mut answer = [9u8; 1];
    c.read_exact(&mut answer).unwrap();
    assert_eq!(answer, [0]);
    assert!(!dst.join("g").exists() && !dst.join("g.floor-part").exists());
}

#[test]
fn sending_to_nobody_fails_with_one_line() {
    let addr = format!("127.0.0.1:{}", free_port());
    let out = Command::new(FLOOR)
        .arg("send")
        .arg(&addr)
        .arg(FLOOR)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("haul-floor: "), "{err}");
}
