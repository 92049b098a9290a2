//! `haul-floor`: the least work any tool that stores a received file must do on this machine,
//! measured so the loopback (S4) figures can be read against it.
//!
//! The sender `sendfile`s the file into one TCP connection (no copy on its side); the receiver
//! reads the bytes into one reused 1 MiB buffer and `pwrite`s them into the destination file.
//! No framing beyond a name and a size, no acknowledgement per block, no threads: nothing a
//! real transfer tool could leave out, and nothing more. With `--crc` both ends also checksum
//! every byte with CRC32C (the cheapest checksum, as longhaul does by default): the sender
//! reads each 1 MiB piece through a 256 KiB buffer to checksum it before `sendfile`ing it, the
//! receiver checksums what it received before writing it, and the file's CRC is compared at
//! the end. What it costs per GiB on each side bounds what longhaul (or any peer that writes
//! the file, with or without checksums) can reach here: with `c` CPU seconds per GiB in all,
//! no tool doing the same work moves more than `cores / c` GiB/s. Written by hand because it
//! must be exactly this minimal loop; it is a measuring stick, not a transfer tool.
//!
//! ```text
//! haul-floor recv LISTEN_ADDR DIR      receive files into DIR, one connection at a time, forever
//! haul-floor send [--crc] ADDR FILE    send FILE to the receiver at ADDR
//! ```
//!
//! Wire: u16 name length, name (UTF-8, one path component), u64 size, u8 flags (1: a CRC32C of
//! the whole file follows the bytes, u32), then the bytes; the receiver answers one byte once
//! the file is written and renamed into place: 1, or 0 when it was not (the CRC differed, or
//! a read or write failed; nothing is left behind). Exit codes: 0 sent (or receiver stopped), 1 any error (one line on stderr).

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["recv", listen, dir] => recv(listen, Path::new(dir)),
        ["send", addr, file] => send(addr, Path::new(file), false),
        ["send", "--crc", addr, file] => send(addr, Path::new(file), true),
        _ => Err(io::Error::other(
            "usage: haul-floor recv LISTEN_ADDR DIR | haul-floor send [--crc] ADDR FILE",
        )),
    };
    if let Err(e) = result {
        eprintln!("haul-floor: {e}");
        std::process::exit(1);
    }
}

const BUF: usize = 1 << 20;

fn recv(listen: &str, dir: &Path) -> io::Result<()> {
    let listener = TcpListener::bind(listen)?;
    let mut buf = vec![0u8; BUF];
    for conn in listener.incoming() {
        // One bad connection does not stop the receiver.
        if let Err(e) = conn.and_then(|c| recv_one(c, dir, &mut buf)) {
            eprintln!("haul-floor: {e}");
        }
    }
    Ok(())
}

fn recv_one(mut c: TcpStream, dir: &Path, buf: &mut [u8]) -> io::Result<()> {
    let mut len = [0u8; 2];
    c.read_exact(&mut len)?;
    let mut name = vec![0u8; u16::from_be_bytes(len) as usize];
    c.read_exact(&mut name)?;
    let name = String::from_utf8(name).map_err(|_| io::Error::other("file name is not UTF-8"))?;
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(io::Error::other(format!("refused file name {name:?}")));
    }
    let mut size = [0u8; 8];
    c.read_exact(&mut size)?;
    let size = u64::from_be_bytes(size);
    let mut flags = [0u8; 1];
    c.read_exact(&mut flags)?;
    let with_crc = flags[0] & 1 != 0;
    let part = dir.join(format!("{name}.floor-part"));
    let result = receive_into(&mut c, &part, &name, size, with_crc, buf)
        .and_then(|()| fs::rename(&part, dir.join(&name)));
    if result.is_err() {
        // Nothing is left behind, whatever failed.
        let _ = fs::remove_file(&part);
    }
    // The sender learns either way; a failure's own cause is what the receiver reports.
    let answered = c.write_all(&[u8::from(result.is_ok())]);
    result.and(answered)
}

/// Receives `size` bytes (and with `with_crc` the file's CRC32C, checked) into `part`.
fn receive_into(
    c: &mut TcpStream,
    part: &Path,
    name: &str,
    size: u64,
    with_crc: bool,
    buf: &mut [u8],
) -> io::Result<()> {
    let file = File::create(part)?;
    let mut crc = 0u32;
    let mut at = 0u64;
    while at < size {
        let got = (size - at).min(buf.len() as u64) as usize;
        c.read_exact(&mut buf[..got])
            .map_err(|e| io::Error::other(format!("{name}: {e} after {at} of {size} bytes")))?;
        if with_crc {
            crc = wire::checksum::crc32c_append(crc, &buf[..got]);
        }
        file.write_all_at(&buf[..got], at)?;
        at += got as u64;
    }
    if with_crc {
        let mut sent = [0u8; 4];
        c.read_exact(&mut sent)?;
        if u32::from_be_bytes(sent) != crc {
            return Err(io::Error::other(format!("{name}: CRC32C differs")));
        }
    }
    Ok(())
}

fn send(addr: &str, path: &Path, with_crc: bool) -> io::Result<()> {
    let file = File::open(path)?;
    let size = file.metadata()?.len();
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| io::Error::other("source has no UTF-8 file name"))?;
    let mut c = TcpStream::connect(addr)?;
    let mut head = Vec::with_capacity(name.len() + 11);
    head.extend_from_slice(&(name.len() as u16).to_be_bytes());
    head.extend_from_slice(name.as_bytes());
    head.extend_from_slice(&size.to_be_bytes());
    head.push(u8::from(with_crc));
    c.write_all(&head)?;
    let mut crc = 0u32;
    let mut scratch = vec![0u8; 256 << 10];
    // Pieces of 1 MiB with checksums (each checksummed, then sent), else the whole file.
    let piece = if with_crc { BUF as u64 } else { size.max(1) };
    let mut at = 0u64;
    while at < size {
        let end = (at + piece).min(size);
        if with_crc {
            let mut pos = at;
            while pos < end {
                let n = ((end - pos) as usize).min(scratch.len());
                file.read_exact_at(&mut scratch[..n], pos)?;
                crc = wire::checksum::crc32c_append(crc, &scratch[..n]);
                pos += n as u64;
            }
        }
        send_range(&c, &file, at, end)?;
        at = end;
    }
    if with_crc {
        c.write_all(&crc.to_be_bytes())?;
    }
    c.shutdown(Shutdown::Write)?;
    let mut done = [0u8; 1];
    c.read_exact(&mut done)
        .map_err(|e| io::Error::other(format!("receiver did not confirm the file: {e}")))?;
    if done[0] != 1 {
        return Err(io::Error::other(
            "receiver did not store the file (a different CRC32C, or it failed: see its log)",
        ));
    }
    Ok(())
}

/// `sendfile`s bytes `from..to` of `file` into `c`.
fn send_range(c: &TcpStream, file: &File, from: u64, to: u64) -> io::Result<()> {
    let mut at = from;
    while at < to {
        let left = (to - at).min(1 << 30) as usize;
        match transfer::sys::sendfile_once(c.as_raw_fd(), file, at, left) {
            Ok(0) => return Err(io::Error::other("source file shrank while being sent")),
            Ok(n) => at += n as u64,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
