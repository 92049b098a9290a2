//! Runs of node-to-node copies (replication, repair, the reconciler): why each runs and for
//! whom (`Origin`), its live figures (`Progress`), and the list of runs in progress that the
//! dashboard shows (`LiveRuns`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use wire::error::ErrorKind;

/// Why a run copies, for the transfer history.
#[derive(Clone, Debug)]
pub struct Origin {
    /// replicate (a user asked), repair, reconcile (policies, drains).
    pub kind: &'static str,
    /// Who asked ("system" for the server's own work).
    pub user: String,
}

impl Origin {
    pub fn new(kind: &'static str, user: &str) -> Self {
        Self {
            kind,
            user: user.to_string(),
        }
    }
}

/// Live figures of a replication run.
#[derive(Default)]
pub struct Progress {
    pub copies_needed: AtomicU64,
    pub copies_made: AtomicU64,
    pub bytes_needed: AtomicU64,
    pub bytes_done: AtomicU64,
    pub sessions: AtomicU64,
    pub failures: Mutex<Vec<Refusal>>,
    /// Per node: bytes sent, bytes received, sessions.
    pub nodes: Mutex<BTreeMap<String, (u64, u64, u32)>>,
}

/// A file that cannot get what was asked, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub path: String,
    pub reason: String,
    /// The `FileError` kind: `Unavailable` (no healthy source, or the copies failed) or
    /// `NoSpace` (no eligible node or site can take the copy).
    pub code: ErrorKind,
}

/// A run of node-to-node copies in progress.
#[derive(Clone)]
pub struct LiveRun {
    pub origin: Origin,
    pub started: Instant,
    pub started_ms: i64,
    pub progress: Arc<Progress>,
}

/// The runs in progress.
#[derive(Default)]
pub struct LiveRuns {
    runs: Mutex<BTreeMap<u64, LiveRun>>,
    next: AtomicU64,
}

impl LiveRuns {
    /// Lists `run` until the guard is dropped (when the run ends, or its task is cancelled).
    pub fn register(&self, run: LiveRun) -> LiveGuard<'_> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.runs.lock().expect("live runs").insert(id, run);
        LiveGuard { runs: self, id }
    }

    /// The runs in progress, oldest first.
    pub fn list(&self) -> Vec<LiveRun> {
        self.runs
            .lock()
            .expect("live runs")
            .values()
            .cloned()
            .collect()
    }
}

/// Takes a run off the list when dropped.
pub struct LiveGuard<'a> {
    runs: &'a LiveRuns,
    id: u64,
}

impl Drop for LiveGuard<'_> {
    fn drop(&mut self) {
        self.runs.runs.lock().expect("live runs").remove(&self.id);
    }
}
