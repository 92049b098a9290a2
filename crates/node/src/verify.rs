//! Re-reading replicas where they are (`Verify`): the metadata server's verifier asks a node to
//! recompute the checksums of the replicas a `Verify` capability covers, without moving them.

use crate::spool::{self, MetaLink};
use std::sync::{Arc, Mutex};
use transfer::error::io_info;
use transfer::store::{self, Root};
use wire::checksum::Algorithm;
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
    let (size, digests) = crate::digest::digest_reader(&mut file, &algos);
    result.size = size;
    match digests {
        Ok(d) => result.digests = d,
        Err(e) => result.error = Some(io_info(&f.name, &e)),
    }
    result
}
