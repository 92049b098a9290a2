//! A metadata server as the node's data service sees it ([`MetaLink`]), for the node's unit and
//! in-process tests: it signs capabilities with a fixed key and records what it is told.

use crate::spool::{MetaLink, OutputFile, now_ms};
use std::sync::Mutex;
use wire::checksum::Digest;
use wire::data::Timestamp;
use wire::error::{ErrorInfo, ErrorKind};
use wire::grant::{Grant, Operation, SignedGrant};

pub struct FakeLink {
    name: String,
    key: Vec<u8>,
    /// Replicas reported written: (id, size).
    pub committed: Mutex<Vec<(i64, u64)>>,
    /// Refuse every report (as a metadata server that lost the file would).
    pub refuse: std::sync::atomic::AtomicBool,
}

impl FakeLink {
    pub fn new(name: &str) -> Self {
        Self {
            name: name.into(),
            key: b"a capability key of this test".to_vec(),
            committed: Mutex::new(Vec::new()),
            refuse: Default::default(),
        }
    }

    /// A capability for `op` on `ids` of this node, for the certificate `holder`.
    pub fn grant(&self, op: Operation, ids: &[i64], holder: &[u8]) -> SignedGrant {
        Grant {
            node: self.name.clone(),
            op,
            ids: ids.to_vec(),
            replace: Vec::new(),
            user: "alice".into(),
            holder: holder.to_vec(),
            expires_ms: now_ms() + 60_000,
        }
        .sign(&self.key)
    }
}

impl MetaLink for FakeLink {
    fn node(&self) -> String {
        self.name.clone()
    }

    fn key(&self) -> Option<Vec<u8>> {
        Some(self.key.clone())
    }

    fn committed(
        &self,
        id: i64,
        size: u64,
        _digests: &[Digest],
        _mtime: Timestamp,
    ) -> Result<(), ErrorInfo> {
        if self.refuse.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(ErrorInfo::new(ErrorKind::NotFound, "no such file"));
        }
        self.committed.lock().unwrap().push((id, size));
        Ok(())
    }

    /// Settled a moment later from a thread of its own, as a metadata server across a link
    /// answers: the sink session must not need the answer on its own thread.
    fn committed_then(
        &self,
        id: i64,
        size: u64,
        digests: &[Digest],
        mtime: Timestamp,
        done: transfer::service::Settled,
    ) {
        let r = self.committed(id, size, digests, mtime);
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            done(r)
        });
    }

    fn register_outputs(
        &self,
        _grant: &SignedGrant,
        _dir: &str,
        files: &[OutputFile],
    ) -> Result<Vec<Result<i64, ErrorInfo>>, ErrorInfo> {
        Ok((0..files.len()).map(|i| Ok(1000 + i as i64)).collect())
    }
}
