//! What transfer jobs are made of, shared by their submission (`jobs`), their scheduler
//! (`jobrun`) and the server's state: a job's stored options, the scheduler's settings and
//! in-memory runtime, the back-off and which failures another attempt can help. No I/O.

use catalog::JobState;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use wire::error::ErrorKind;

/// The most files one job may hold (a bigger data set goes in several jobs).
pub const MAX_JOB_FILES: usize = 200_000;
/// The most queued and running jobs one user may have.
pub const MAX_ACTIVE_JOBS: usize = 1_000;
/// Attempts per file unless the job says otherwise, and the most it may say.
pub const DEFAULT_TRIES: u32 = 10;
pub const MAX_TRIES: u32 = 100;
pub const MAX_WEBHOOK: usize = 2048;

/// A job's options as stored with it (JSON in `jobs.options`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobOptions {
    /// Put the copies at this site ("": wherever placement chooses).
    #[serde(default)]
    pub site: String,
    #[serde(default)]
    pub overwrite: bool,
    pub max_tries: u32,
    /// ms since the epoch; 0: none.
    #[serde(default)]
    pub deadline_ms: i64,
    /// bits/s per session; 0: none.
    #[serde(default)]
    pub rate_bps: u64,
    #[serde(default)]
    pub webhook: String,
    /// What the job's delegation grants at standalone endpoints (`read HOST PATH` lines; a
    /// retry's new delegation must cover them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endpoint_grants: Vec<String>,
}

impl JobOptions {
    /// Options of a stored job; a record that does not parse is corrupt.
    pub fn parse(stored: &str) -> std::result::Result<Self, String> {
        let o: Self = serde_json::from_str(stored).map_err(|e| e.to_string())?;
        if o.max_tries == 0 || o.max_tries > MAX_TRIES {
            return Err(format!("max_tries {} out of range", o.max_tries));
        }
        Ok(o)
    }
}

/// The exit code `haul job wait` gives a job that ended this way (0 while it runs).
pub fn exit_code(state: &str, first_error_kind: &str) -> i32 {
    match JobState::parse(state) {
        Some(JobState::Done) | Some(JobState::Queued) | Some(JobState::Running) => 0,
        Some(JobState::Cancelled) => transfer::error::exit_code_of(ErrorKind::Cancelled),
        Some(JobState::Failed) => ErrorKind::from_name(first_error_kind)
            .map(transfer::error::exit_code_of)
            .unwrap_or(1),
        None => 1,
    }
}

/// How the job scheduler runs (`haul meta serve --job-*`).
#[derive(Clone, Debug)]
pub struct JobSettings {
    /// Sessions of all jobs at once.
    pub sessions: u32,
    /// Sessions at once per link (source site, destination site).
    pub link_sessions: u32,
    /// The most sessions the optimizer gives a link (`link_sessions` is where a link it has
    /// learned nothing about starts; equal values keep every link fixed).
    pub max_link_sessions: u32,
    /// Files per batch (one session per node pair).
    pub batch_files: u32,
    /// Sessions at once with one standalone endpoint.
    pub endpoint_sessions: u32,
    /// Data streams per link (shared by its sessions); `None`: each session plans its own.
    pub link_streams: Option<u32>,
    /// The first back-off after a failed attempt (doubled each time, at most an hour).
    pub retry_delay: Duration,
    pub weights: crate::fairshare::Weights,
    /// Webhooks may reach loopback, private and link-local addresses.
    pub webhooks_to_private: bool,
}

impl Default for JobSettings {
    fn default() -> Self {
        Self {
            sessions: 32,
            link_sessions: 4,
            max_link_sessions: 16,
            batch_files: 250,
            endpoint_sessions: 4,
            link_streams: None,
            retry_delay: Duration::from_secs(30),
            weights: Default::default(),
            webhooks_to_private: false,
        }
    }
}

/// What the scheduler keeps in memory (lost on restart, which only costs a retry on a node
/// that failed).
#[derive(Default)]
pub struct JobRuntime {
    /// Wakes the scheduler (a job submitted, cancelled, retried).
    pub wake: tokio::sync::Notify,
    /// Cancels the sessions of a job.
    pub(crate) cancels: Mutex<HashMap<i64, CancellationToken>>,
    /// Nodes each file's next attempt avoids, by (job, seq).
    avoid: Mutex<HashMap<(i64, i64), HashSet<String>>>,
    /// Jobs whose webhook is being called now.
    pub(crate) notifying: std::sync::Arc<Mutex<HashSet<i64>>>,
}

impl JobRuntime {
    /// Stops the sessions of job `id`, and any started for it later (until it is retried).
    pub fn cancel(&self, id: i64) {
        self.cancels
            .lock()
            .expect("jobs lock")
            .entry(id)
            .or_default()
            .cancel();
    }

    /// Forgets what the runs of job `id` learned and that it was cancelled (a retry starts
    /// afresh).
    pub fn forget(&self, id: i64) {
        self.cancels.lock().expect("jobs lock").remove(&id);
        self.avoid
            .lock()
            .expect("jobs lock")
            .retain(|(j, _), _| *j != id);
    }

    pub(crate) fn token(&self, id: i64) -> CancellationToken {
        self.cancels
            .lock()
            .expect("jobs lock")
            .entry(id)
            .or_default()
            .clone()
    }

    pub(crate) fn avoided(&self, job: i64, seq: i64) -> HashSet<String> {
        self.avoid
            .lock()
            .expect("jobs lock")
            .get(&(job, seq))
            .cloned()
            .unwrap_or_default()
    }

    pub(crate) fn avoid_nodes(&self, job: i64, seq: i64, nodes: &[&str]) {
        let mut a = self.avoid.lock().expect("jobs lock");
        let set = a.entry((job, seq)).or_default();
        set.extend(nodes.iter().map(|n| n.to_string()));
    }

    /// Forgets the nodes one file avoids (every one failed it: all may be tried again).
    pub(crate) fn forget_file(&self, job: i64, seq: i64) {
        self.avoid.lock().expect("jobs lock").remove(&(job, seq));
    }

    pub(crate) fn ended(&self, id: i64) {
        self.forget(id);
    }

    /// Stops every job's sessions (the server is stopping, or lost the right to run jobs):
    /// their files are queued again, not cancelled.
    pub(crate) fn stop_all(&self) {
        let mut c = self.cancels.lock().expect("jobs lock");
        for t in c.values() {
            t.cancel();
        }
        c.clear();
    }
}

/// The wait before attempt `tries + 1`: `base`, doubled per attempt, at most an hour.
pub fn back_off(base: Duration, tries: u32) -> Duration {
    let f = 1u64 << tries.saturating_sub(1).min(20);
    base.saturating_mul(f as u32).min(Duration::from_secs(3600))
}

/// Whether another attempt can help a file that failed this way.
pub fn retryable(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::Connect
            | ErrorKind::Unavailable
            | ErrorKind::Stalled
            | ErrorKind::Integrity
            | ErrorKind::SourceDamaged
            | ErrorKind::NoSpace
            | ErrorKind::Busy
            | ErrorKind::Io
    )
}

/// A standalone endpoint named by a job pair: `haul://host:port`, and the path there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointPath {
    pub host: String,
    pub port: u16,
    pub path: String,
}

impl EndpointPath {
    /// `haul://host:port/path` (a grid path is not one: `None`).
    pub fn parse(s: &str) -> Option<Result<Self, crate::error::Error>> {
        if !s.starts_with("haul://") {
            return None;
        }
        Some(match transfer::client::Location::parse(s) {
            Ok(transfer::client::Location::Remote { host, port, path }) => {
                match transfer::delegation::normalize(&path) {
                    Some(path) => Ok(Self { host, port, path }),
                    None => Err(crate::error::Error::invalid(format!(
                        "{s}: a path may not climb (..)"
                    ))),
                }
            }
            Ok(_) => Err(crate::error::Error::invalid(format!(
                "{s}: not an endpoint path"
            ))),
            Err(e) => Err(crate::error::Error::invalid(e.message().to_string())),
        })
    }

    /// `host:port`, how jobs name the endpoint (in links and session limits).
    pub fn peer(&self) -> String {
        transfer::conn::format_addr(&self.host, self.port)
    }

    pub fn url(&self, path: &str) -> String {
        format!("haul://{}{}", self.peer(), path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_round_trip_and_corrupt_ones_are_refused() {
        let o = JobOptions {
            site: "s1".into(),
            max_tries: 3,
            ..Default::default()
        };
        let s = serde_json::to_string(&o).unwrap();
        assert_eq!(JobOptions::parse(&s).unwrap(), o);
        for bad in [
            "",
            "{",
            "[]",
            "{\"max_tries\": 0}",
            "{\"max_tries\": 1000}",
            "{\"site\": 5, \"max_tries\": 2}",
        ] {
            assert!(JobOptions::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn exit_codes_follow_the_end() {
        assert_eq!(exit_code("done", ""), 0);
        assert_eq!(exit_code("running", ""), 0);
        assert_eq!(exit_code("cancelled", ""), 130);
        assert_eq!(exit_code("failed", "not_found"), 3);
        assert_eq!(exit_code("failed", "no_space"), 6);
        assert_eq!(exit_code("failed", "???"), 1);
        assert_eq!(exit_code("garbage", ""), 1);
    }

    #[test]
    fn back_off_doubles_up_to_an_hour() {
        let b = Duration::from_secs(30);
        assert_eq!(back_off(b, 1), Duration::from_secs(30));
        assert_eq!(back_off(b, 2), Duration::from_secs(60));
        assert_eq!(back_off(b, 4), Duration::from_secs(240));
        assert_eq!(back_off(b, 8), Duration::from_secs(3600));
        assert_eq!(back_off(b, 1000), Duration::from_secs(3600));
        // Ten tries span hours: 30 s + 1 + 2 + 4 + 8 + 16 min + 32 min + 3 x 1 h.
        let total: Duration = (1..10).map(|t| back_off(b, t)).sum();
        assert!(total > Duration::from_secs(3 * 3600), "{total:?}");
    }

    #[test]
    fn what_another_attempt_can_help() {
        assert!(retryable(ErrorKind::Connect));
        assert!(retryable(ErrorKind::NoSpace));
        assert!(!retryable(ErrorKind::NotFound));
        assert!(!retryable(ErrorKind::PermissionDenied));
        assert!(!retryable(ErrorKind::Exists));
    }
}
