//! A file's checksums, read from it: what a node reports of a replica it finds (a resumed
//! session's, a task's output) and what `Verify` recomputes. A leaf: it uses nothing of the
//! node.

use wire::checksum::{Algorithm, Digest, MultiHasher, crc32c_append};

/// Reads `r` to its end: the bytes read, and their CRC32C plus `algos` (sorted), or the read
/// error that stopped it.
pub fn digest_reader(
    mut r: impl std::io::Read,
    algos: &[Algorithm],
) -> (u64, std::io::Result<Vec<Digest>>) {
    let mut algos = algos.to_vec();
    algos.retain(|a| *a != Algorithm::Crc32c);
    let mut hasher = MultiHasher::new(&algos);
    let mut crc = 0u32;
    let mut size = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                crc = crc32c_append(crc, &buf[..n]);
                if hasher.needs_bytes() {
                    hasher.update(&buf[..n]);
                }
                size += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return (size, Err(e)),
        }
    }
    let mut digests = vec![Digest {
        algorithm: Algorithm::Crc32c,
        value: crc.to_be_bytes().to_vec(),
    }];
    digests.extend(hasher.finish());
    digests.sort_by_key(|d| d.algorithm);
    (size, Ok(digests))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_crc32c_first_and_sorted_and_read_errors_are_kept() {
        let (size, d) = digest_reader(&b"hello"[..], &[Algorithm::Sha256, Algorithm::Crc32c]);
        let d = d.unwrap();
        assert_eq!(size, 5);
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].algorithm, Algorithm::Crc32c);
        assert_eq!(d[0].value, crc32c_append(0, b"hello").to_be_bytes());
        assert_eq!(d[1].algorithm, Algorithm::Sha256);
        struct Broken;
        impl std::io::Read for Broken {
            fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
                Err(std::io::Error::other("bad sector"))
            }
        }
        assert!(digest_reader(Broken, &[]).1.is_err());
    }
}
