//! Runs of node-to-node copies (replication, repair, the reconciler): why each runs and for
//! whom (`Origin`), its live figures (`Progress`), and the list of runs in progress that the
//! dashboard shows (`LiveRuns`); and clients' copies in progress as their clients report them
//! (`LiveClients`), with the bounds that keep a client from filling the server's memory.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
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

/// A client's copy is dropped from the live list when its client has not reported for this
/// long (it reports every few seconds; a killed client stops).
pub const CLIENT_SILENCE: Duration = Duration::from_secs(30);
/// Live copies one user may have listed, and all users together.
pub const CLIENT_COPIES_PER_USER: usize = 64;
pub const CLIENT_COPIES: usize = 4_096;
/// Bytes kept of a live copy's source and destination.
const LIVE_NAME_BYTES: usize = 1024;

/// What a client last said of one of its copies.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientFigures {
    pub files_total: u64,
    pub files_done: u64,
    pub files_failed: u64,
    pub bytes_total: u64,
    pub bytes_done: u64,
    pub streams: u32,
}

/// A client's copy in progress.
#[derive(Clone, Debug)]
pub struct ClientCopy {
    pub user: String,
    /// upload, download, copy or run.
    pub kind: String,
    pub source: String,
    pub destination: String,
    pub started: Instant,
    pub started_ms: i64,
    pub figures: ClientFigures,
    /// When the client last reported, and earlier reports' `(when, bytes_done)` within
    /// `RATE_WINDOW` (for the current rate).
    pub last_report: Instant,
    pub previous: std::collections::VecDeque<(Instant, u64)>,
}

/// The current rate is measured over the reports of about this long (progress comes in
/// chunks: a copy's confirmed bytes may not move between two reports 3 s apart).
const RATE_WINDOW: Duration = Duration::from_secs(20);
/// Reports kept for the rate: at most one a second, and no more than this many.
const RATE_SAMPLES: usize = 32;

impl ClientCopy {
    /// Bytes per second: since the newest report at least `RATE_WINDOW` old (or the oldest);
    /// 0 until a second report gives an interval.
    pub fn rate(&self) -> f64 {
        let Some((t, b)) = self.previous.front().copied() else {
            return 0.0;
        };
        let dt = self.last_report.saturating_duration_since(t).as_secs_f64();
        if dt <= 0.0 {
            return 0.0;
        }
        self.figures.bytes_done.saturating_sub(b) as f64 / dt
    }
}

/// Why a client's report was not taken.
#[derive(Debug, PartialEq, Eq)]
pub enum LiveRefusal {
    /// The id is not one of the caller's live copies (never was, ended, or fell silent).
    Unknown,
    /// The caller, or the server, has as many live copies listed as it takes.
    Full,
}

/// Clients' copies in progress, by id.
#[derive(Default)]
pub struct LiveClients {
    copies: Mutex<HashMap<u64, ClientCopy>>,
    /// Copies recorded as abandoned: (live id, user, history record), the newest
    /// `ABANDONED_KEPT`, so that the client's own record, if it comes after all, replaces
    /// the server's.
    abandoned: Mutex<std::collections::VecDeque<(u64, String, i64)>>,
}

/// Abandoned copies remembered for their clients' late records.
const ABANDONED_KEPT: usize = 4_096;

/// `s` cut to at most `max` bytes, at a character boundary: what the server keeps of a string
/// a client sends (names of live copies here, the history's fields in `crate::history`).
pub(crate) fn bounded(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

impl LiveClients {
    /// Lists a new copy of `user`'s; returns its id.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        &self,
        user: &str,
        kind: &str,
        source: &str,
        destination: &str,
        figures: ClientFigures,
        now: Instant,
        now_ms: i64,
    ) -> Result<u64, LiveRefusal> {
        let mut copies = self.copies.lock().expect("live clients");
        if copies.len() >= CLIENT_COPIES
            || copies.values().filter(|c| c.user == user).count() >= CLIENT_COPIES_PER_USER
        {
            return Err(LiveRefusal::Full);
        }
        // Random, so that a client still holding an id from before a restart (or from another
        // metadata server sharing the catalog) cannot report on somebody's new copy; never 0
        // (which asks for a new one), and positive as an int64.
        let id = loop {
            let id = rand::random::<u64>() >> 1;
            if id != 0 && !copies.contains_key(&id) {
                break id;
            }
        };
        copies.insert(
            id,
            ClientCopy {
                user: user.to_string(),
                kind: kind.to_string(),
                source: bounded(source, LIVE_NAME_BYTES),
                destination: bounded(destination, LIVE_NAME_BYTES),
                started: now,
                started_ms: now_ms,
                figures,
                last_report: now,
                previous: Default::default(),
            },
        );
        Ok(id)
    }

    /// New figures for copy `id` of `user`'s, or (`ended`) its end.
    pub fn report(
        &self,
        user: &str,
        id: u64,
        figures: ClientFigures,
        ended: bool,
        now: Instant,
    ) -> Result<(), LiveRefusal> {
        let mut copies = self.copies.lock().expect("live clients");
        match copies.get_mut(&id) {
            Some(c) if c.user == user => {
                if ended {
                    copies.remove(&id);
                } else {
                    // One sample a second at most, RATE_SAMPLES at most: a client reporting
                    // in a loop grows nothing.
                    if c.previous.back().is_none_or(|(t, _)| {
                        c.last_report.saturating_duration_since(*t) >= Duration::from_secs(1)
                    }) {
                        c.previous.push_back((c.last_report, c.figures.bytes_done));
                    }
                    while c.previous.len() > RATE_SAMPLES {
                        c.previous.pop_front();
                    }
                    // Keeps one report at least as old as the window.
                    while c
                        .previous
                        .get(1)
                        .is_some_and(|(t, _)| now.saturating_duration_since(*t) >= RATE_WINDOW)
                    {
                        c.previous.pop_front();
                    }
                    c.figures = figures;
                    c.last_report = now;
                }
                Ok(())
            }
            _ => Err(LiveRefusal::Unknown),
        }
    }

    /// Takes off the list, and returns with their ids, the copies whose clients fell silent.
    pub fn expire(&self, now: Instant) -> Vec<(u64, ClientCopy)> {
        let mut copies = self.copies.lock().expect("live clients");
        let silent: Vec<u64> = copies
            .iter()
            .filter(|(_, c)| now.saturating_duration_since(c.last_report) >= CLIENT_SILENCE)
            .map(|(id, _)| *id)
            .collect();
        silent
            .into_iter()
            .filter_map(|id| copies.remove(&id).map(|c| (id, c)))
            .collect()
    }

    /// Remembers that live copy `id` of `user` was recorded as abandoned in `record`.
    pub fn note_abandoned(&self, id: u64, user: &str, record: i64) {
        let mut a = self.abandoned.lock().expect("abandoned");
        a.push_back((id, user.to_string(), record));
        while a.len() > ABANDONED_KEPT {
            a.pop_front();
        }
    }

    /// The abandoned records of `user`'s live copies `ids` (forgotten here once taken).
    pub fn take_abandoned(&self, user: &str, ids: &[i64]) -> Vec<i64> {
        let mut a = self.abandoned.lock().expect("abandoned");
        let mut records = Vec::new();
        a.retain(|(id, u, record)| {
            let mine = u == user && ids.contains(&(*id as i64));
            if mine {
                records.push(*record);
            }
            !mine
        });
        records
    }

    /// The copies in progress, oldest first.
    pub fn list(&self) -> Vec<ClientCopy> {
        let mut v: Vec<ClientCopy> = self
            .copies
            .lock()
            .expect("live clients")
            .values()
            .cloned()
            .collect();
        v.sort_by_key(|c| c.started);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(done: u64) -> ClientFigures {
        ClientFigures {
            files_total: 2,
            bytes_total: 1000,
            bytes_done: done,
            streams: 4,
            ..Default::default()
        }
    }

    #[test]
    fn a_clients_copy_is_listed_until_it_ends_or_falls_silent() {
        let live = LiveClients::default();
        let t0 = Instant::now();
        let a = live
            .start("ann", "upload", "/tmp/x", "/grid/x", figures(0), t0, 1)
            .unwrap();
        let b = live
            .start("bob", "download", "/grid/y", "/tmp/y", figures(0), t0, 1)
            .unwrap();
        assert_ne!(a, b);
        // No rate before a second report gives an interval.
        assert_eq!(live.list()[0].rate(), 0.0);
        // Only its own user reports on a copy.
        assert_eq!(
            live.report("bob", a, figures(10), false, t0),
            Err(LiveRefusal::Unknown)
        );
        live.report("ann", a, figures(100), false, t0 + Duration::from_secs(1))
            .unwrap();
        live.report("ann", a, figures(300), false, t0 + Duration::from_secs(3))
            .unwrap();
        let ann = live.list().into_iter().find(|c| c.user == "ann").unwrap();
        // The rate since the oldest report within the window (the start): 300 bytes in 3 s.
        assert_eq!(ann.rate(), 100.0);
        assert_eq!(ann.figures.bytes_done, 300);
        // Past the window, the older reports no longer count: 600 bytes since the one 30 s ago.
        live.report("ann", a, figures(900), false, t0 + Duration::from_secs(33))
            .unwrap();
        let ann = live.list().into_iter().find(|c| c.user == "ann").unwrap();
        assert_eq!(ann.rate(), 20.0);
        // bob falls silent; ann reported 3 s in.
        let gone = live.expire(t0 + CLIENT_SILENCE + Duration::from_secs(1));
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].1.user, "bob");
        assert_eq!(gone[0].0, b);
        assert_eq!(live.list().len(), 1);
        // An ended copy leaves at once, and its id is then unknown.
        live.report("ann", a, figures(1000), true, t0 + Duration::from_secs(4))
            .unwrap();
        assert!(live.list().is_empty());
        assert_eq!(
            live.report("ann", a, figures(1000), false, t0),
            Err(LiveRefusal::Unknown)
        );
    }

    #[test]
    fn a_user_cannot_fill_the_list() {
        let live = LiveClients::default();
        let t0 = Instant::now();
        let long = "x".repeat(100_000);
        for _ in 0..CLIENT_COPIES_PER_USER {
            live.start("ann", "upload", &long, &long, figures(0), t0, 1)
                .unwrap();
        }
        assert_eq!(
            live.start("ann", "upload", "a", "b", figures(0), t0, 1),
            Err(LiveRefusal::Full)
        );
        // Others still can; names are cut.
        live.start("bob", "upload", "a", "b", figures(0), t0, 1)
            .unwrap();
        assert!(
            live.list()
                .iter()
                .all(|c| c.source.len() <= LIVE_NAME_BYTES)
        );
    }
}
