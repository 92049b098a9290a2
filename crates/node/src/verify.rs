//! Re-reading replicas where they are (`Verify`): the metadata server's verifier asks a node to
//! recompute the checksums of the replicas a `Verify` capability covers, without moving them.

use crate::spool::{self, MetaLink};
use std::sync::{Arc, Mutex};
use transfer::error::io_info;
use transfer::store::{self, Root};
use wire::checksum::{Algorithm, Digest, MultiHasher, crc32c_append};
use wire::control::ListedFile;
use wire::error::{ErrorInfo, ErrorKind};
use wire::grant::{Operation, SignedGrant};
use wire::node::VerifyResult;

/// Files read at once: verification competes with transfers for the disks.
const WORKERS: usize = 2;

/// Recomputes the checksums of `files`, [`WORKERS`] at a time; results in the order asked.
pub async fn verify_files(
    link: &dyn MetaLink,
    root: &Arc<Root>,
    files: Vec<ListedFile>,
    grant: Option<&SignedGrant>,
    presenter: Option<&[u8]>,
) -> Result<Vec<VerifyResult>, ErrorInfo> {
    let g = spool::check(link, grant, Operation::Verify, presenter)?;
    let mut jobs = Vec::with_capacity(files.len());
    for f in files {
        let id = spool::parse_id(&f.locator)?;
        g.covers([id])
            .map_err(|e| ErrorInfo::new(ErrorKind::PermissionDenied, e.to_string()))?;
        jobs.push((f, spool::spool_path(id)));
    }
    let workers = WORKERS.min(jobs.len().max(1));
    let jobs = Arc::new(Mutex::new(jobs.into_iter().enumerate().collect::<Vec<_>>()));
    let mut handles = Vec::new();
    for _ in 0..workers {
        let (jobs, root) = (jobs.clone(), root.clone());
        handles.push(tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            loop {
                let next = jobs.lock().expect("jobs lock").pop();
                let Some((i, (f, path))) = next else {
                    return out;
                };
                out.push((i, checksum_file(&root, &f, &path)));
            }
        }));
    }
    let mut results = Vec::new();
    for h in handles {
        results.extend(
            h.await
                .map_err(|e| ErrorInfo::new(ErrorKind::Io, format!("verification failed: {e}")))?,
        );
    }
    results.sort_by_key(|(i, _)| *i);
    Ok(results.into_iter().map(|(_, r)| r).collect())
}

fn checksum_file(root: &Root, f: &ListedFile, path: &std::path::Path) -> VerifyResult {
    let mut result = VerifyResult {
        locator: f.locator.clone(),
        size: 0,
        digests: Vec::new(),
        error: None,
    };
    let mut file = match root.open(path, store::OpenMode::Read) {
        Ok(file) => file,
        Err(e) => {
            result.error = Some(io_info(&f.name, &e));
            return result;
        }
    };
    let algos: Vec<Algorithm> = f.expect.iter().map(|d| d.algorithm).collect();
    let (size, digests) = digest_reader(&mut file, &algos);
    result.size = size;
    match digests {
        Ok(d) => result.digests = d,
        Err(e) => result.error = Some(io_info(&f.name, &e)),
    }
    result
}

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
