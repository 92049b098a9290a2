//! Transfer jobs: work a user handed to the metadata server (source and destination pairs, a
//! priority, options), and each file's state as the server's scheduler works through it. Kept
//! here so that a job outlives the submitter's process and the server's restarts.

use crate::{Catalog, CatalogError, Result};
use serde::{Deserialize, Serialize};
use sqlx::Row;
use sqlx::any::AnyRow;

/// Rows per INSERT statement when adding a job's files (5 values each).
const FILES_PER_STATEMENT: usize = 300;

/// Where a job or one of its files stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Waiting for its turn (a file: also waiting out its back-off).
    Queued,
    /// Some of its files are being copied.
    Running,
    Done,
    Failed,
    Cancelled,
}

impl JobState {
    pub fn name(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Done => "done",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "queued" => JobState::Queued,
            "running" => JobState::Running,
            "done" => JobState::Done,
            "failed" => JobState::Failed,
            "cancelled" => JobState::Cancelled,
            _ => return None,
        })
    }

    /// Nothing more happens to it unless it is retried.
    pub fn ended(self) -> bool {
        matches!(
            self,
            JobState::Done | JobState::Failed | JobState::Cancelled
        )
    }
}

/// A job's record with its files counted by state.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    pub id: i64,
    pub user: String,
    pub priority: u32,
    /// As stored: a record whose state does not parse is reported, not trusted.
    pub state: String,
    /// The options as stored (JSON, the metadata server's to parse).
    pub options: String,
    pub created_ms: i64,
    pub updated_ms: i64,
    pub ended_ms: i64,
    pub error: String,
    pub files: u64,
    pub bytes: u64,
    pub files_done: u64,
    pub bytes_done: u64,
    pub files_failed: u64,
    pub files_running: u64,
    pub files_cancelled: u64,
}

impl JobRecord {
    pub fn files_queued(&self) -> u64 {
        self.files
            .saturating_sub(self.files_done + self.files_failed)
            .saturating_sub(self.files_running + self.files_cancelled)
    }
}

/// One file of a job.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobFile {
    pub job: i64,
    /// Its place in the job (0, 1, ...).
    pub seq: i64,
    pub source: String,
    pub destination: String,
    pub size: u64,
    pub state: String,
    /// Attempts so far.
    pub tries: u32,
    /// Not tried again before this time (ms since the epoch).
    pub next_ms: i64,
    /// The inode id of the copy being written, or written (0: none yet).
    pub target: i64,
    /// The storage node the copy went to.
    pub node: String,
    pub checksum: String,
    pub error_kind: String,
    pub error: String,
    pub updated_ms: i64,
    /// An endpoint source's mtime (ns) and mode as listed at submission (0: not listed).
    pub src_mtime_ns: i64,
    pub src_mode: u32,
}

/// A new job.
#[derive(Clone, Debug, Default)]
pub struct NewJob {
    pub user: String,
    pub priority: u32,
    pub options: String,
    /// (source, destination, size) of each file.
    pub files: Vec<(String, String, u64)>,
    /// Files refused at submission, stored failed in the same transaction: (index in
    /// `files`, error kind, error).
    pub refused: Vec<(usize, String, String)>,
    /// Endpoint sources as listed: (index in `files`, mtime in ns, mode).
    pub listed: Vec<(usize, i64, u32)>,
    /// The delegation the job acts with at endpoints (secret; empty when it needs none).
    pub credential: String,
}

/// Which jobs to list. Newest first.
#[derive(Clone, Debug, Default)]
pub struct JobFilter {
    pub user: Option<String>,
    /// Only queued and running jobs.
    pub active: bool,
    /// Only jobs older than this id (paging).
    pub before_id: Option<i64>,
    pub limit: u32,
}

fn int(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}

const JOB_COLS: &str =
    "id, user_name, priority, state, options, created_ms, updated_ms, ended_ms, error";
const FILE_COLS: &str = "job, seq, source, destination, size, state, tries, next_ms, target, \
     node, checksum, error_kind, error, updated_ms, src_mtime_ns, src_mode";

fn job_of(r: &AnyRow) -> Result<JobRecord> {
    let n = |c: &str| -> Result<i64> { Ok(r.try_get::<i64, _>(c)?) };
    Ok(JobRecord {
        id: n("id")?,
        user: r.try_get("user_name")?,
        priority: n("priority")?.clamp(0, u32::MAX as i64) as u32,
        state: r.try_get("state")?,
        options: r.try_get("options")?,
        created_ms: n("created_ms")?,
        updated_ms: n("updated_ms")?,
        ended_ms: n("ended_ms")?,
        error: r.try_get("error")?,
        ..Default::default()
    })
}

fn file_of(r: &AnyRow) -> Result<JobFile> {
    let n = |c: &str| -> Result<i64> { Ok(r.try_get::<i64, _>(c)?) };
    Ok(JobFile {
        job: n("job")?,
        seq: n("seq")?,
        source: r.try_get("source")?,
        destination: r.try_get("destination")?,
        size: n("size")?.max(0) as u64,
        state: r.try_get("state")?,
        tries: n("tries")?.clamp(0, u32::MAX as i64) as u32,
        next_ms: n("next_ms")?,
        target: n("target")?,
        node: r.try_get("node")?,
        checksum: r.try_get("checksum")?,
        error_kind: r.try_get("error_kind")?,
        error: r.try_get("error")?,
        updated_ms: n("updated_ms")?,
        src_mtime_ns: n("src_mtime_ns")?,
        src_mode: n("src_mode")?.clamp(0, u32::MAX as i64) as u32,
    })
}

impl Catalog {
    /// Stores a job and its files (all queued) in one transaction; returns its id.
    pub async fn create_job(&self, job: &NewJob) -> Result<i64> {
        let now = crate::now_ms();
        self.write(async |w| {
            let row = sqlx::query(
                "INSERT INTO jobs (user_name, priority, state, options, created_ms, updated_ms, credential) \
                 VALUES ($1, $2, 'queued', $3, $4, $4, $5) RETURNING id",
            )
            .bind(&job.user)
            .bind(job.priority as i64)
            .bind(&job.options)
            .bind(now)
            .bind(&job.credential)
            .fetch_one(&mut *w.tx)
            .await?;
            let id: i64 = row.try_get(0)?;
            for (chunk_no, chunk) in job.files.chunks(FILES_PER_STATEMENT).enumerate() {
                let mut q = String::from(
                    "INSERT INTO job_files (job, seq, source, destination, size, state, updated_ms) VALUES ",
                );
                for i in 0..chunk.len() {
                    let b = i * 5;
                    if i > 0 {
                        q.push_str(", ");
                    }
                    q += &format!(
                        "(${}, ${}, ${}, ${}, ${}, 'queued', {now})",
                        b + 1,
                        b + 2,
                        b + 3,
                        b + 4,
                        b + 5
                    );
                }
                let mut query = sqlx::query(&q);
                for (i, (src, dst, size)) in chunk.iter().enumerate() {
                    query = query
                        .bind(id)
                        .bind((chunk_no * FILES_PER_STATEMENT + i) as i64)
                        .bind(src.as_str())
                        .bind(dst.as_str())
                        .bind(int(*size));
                }
                query.execute(&mut *w.tx).await?;
            }
            for (seq, mtime_ns, mode) in &job.listed {
                sqlx::query(
                    "UPDATE job_files SET src_mtime_ns = $3, src_mode = $4 WHERE job = $1 AND seq = $2",
                )
                .bind(id)
                .bind(*seq as i64)
                .bind(*mtime_ns)
                .bind(*mode as i64)
                .execute(&mut *w.tx)
                .await?;
            }
            for (seq, kind, error) in &job.refused {
                sqlx::query(
                    "UPDATE job_files SET state = 'failed', error_kind = $3, error = $4 \
                     WHERE job = $1 AND seq = $2",
                )
                .bind(id)
                .bind(*seq as i64)
                .bind(kind.as_str())
                .bind(error.as_str())
                .execute(&mut *w.tx)
                .await?;
            }
            Ok(id)
        })
        .await
    }

    /// Marks the listed files of job `id` running (one more try each, no copy yet) if they
    /// are still queued, and the job running if it was queued; returns the files claimed (a
    /// file cancelled or taken meanwhile is not). One transaction.
    pub async fn claim_job_files(&self, id: i64, seqs: &[i64]) -> Result<Vec<i64>> {
        let now = crate::now_ms();
        self.write(async |w| {
            let mut claimed = Vec::new();
            for seq in seqs {
                let n = sqlx::query(
                    "UPDATE job_files SET state = 'running', tries = tries + 1, target = 0, \
                     updated_ms = $3 WHERE job = $1 AND seq = $2 AND state = 'queued'",
                )
                .bind(id)
                .bind(*seq)
                .bind(now)
                .execute(&mut *w.tx)
                .await?
                .rows_affected();
                if n > 0 {
                    claimed.push(*seq);
                }
            }
            if !claimed.is_empty() {
                sqlx::query(
                    "UPDATE jobs SET state = 'running', updated_ms = $2 WHERE id = $1 AND state = 'queued'",
                )
                .bind(id)
                .bind(now)
                .execute(&mut *w.tx)
                .await?;
            }
            Ok(claimed)
        })
        .await
    }

    /// Takes (or keeps) the right to run jobs for `holder` until `now_ms + ttl_ms`: granted
    /// when nobody holds it, the holder is `holder`, or the last holder's time ran out.
    /// Several metadata servers on one database run jobs one at a time.
    pub async fn take_job_lease(&self, holder: &str, now_ms: i64, ttl_ms: i64) -> Result<bool> {
        self.write(async |w| {
            let row = sqlx::query("SELECT holder, until_ms FROM job_lease WHERE id = 1")
                .fetch_optional(&mut *w.tx)
                .await?;
            let mine = match row {
                None => {
                    sqlx::query("INSERT INTO job_lease (id, holder, until_ms) VALUES (1, $1, $2)")
                        .bind(holder)
                        .bind(now_ms + ttl_ms)
                        .execute(&mut *w.tx)
                        .await?;
                    true
                }
                Some(r) => {
                    let h: String = r.try_get(0)?;
                    let until: i64 = r.try_get(1)?;
                    if h == holder || until < now_ms {
                        sqlx::query("UPDATE job_lease SET holder = $1, until_ms = $2 WHERE id = 1")
                            .bind(holder)
                            .bind(now_ms + ttl_ms)
                            .execute(&mut *w.tx)
                            .await?;
                        true
                    } else {
                        false
                    }
                }
            };
            Ok(mine)
        })
        .await
    }

    /// Jobs matching `f`, newest first, with their files counted.
    pub async fn jobs(&self, f: &JobFilter) -> Result<Vec<JobRecord>> {
        let mut q = format!("SELECT {JOB_COLS} FROM jobs WHERE 1 = 1");
        let mut n = 0;
        let mut next = || {
            n += 1;
            format!("${n}")
        };
        if f.user.is_some() {
            q += &format!(" AND user_name = {}", next());
        }
        if f.active {
            q += " AND state IN ('queued', 'running')";
        }
        if f.before_id.is_some() {
            q += &format!(" AND id < {}", next());
        }
        q += &format!(" ORDER BY id DESC LIMIT {}", next());
        let mut query = sqlx::query(&q);
        if let Some(u) = &f.user {
            query = query.bind(u.as_str());
        }
        if let Some(b) = f.before_id {
            query = query.bind(b);
        }
        let rows = query
            .bind(f.limit.max(1) as i64)
            .fetch_all(&self.pool)
            .await?;
        self.counted(&rows).await
    }

    /// Every queued or running job, oldest first, with its files counted (the scheduler's
    /// view after a start).
    pub async fn active_jobs(&self) -> Result<Vec<JobRecord>> {
        let rows = sqlx::query(&format!(
            "SELECT {JOB_COLS} FROM jobs WHERE state IN ('queued', 'running') ORDER BY id"
        ))
        .fetch_all(&self.pool)
        .await?;
        self.counted(&rows).await
    }

    /// The jobs of `rows`, each with its files counted.
    async fn counted(&self, rows: &[AnyRow]) -> Result<Vec<JobRecord>> {
        let mut jobs = rows.iter().map(job_of).collect::<Result<Vec<_>>>()?;
        for j in &mut jobs {
            self.count_job_files(j).await?;
        }
        Ok(jobs)
    }

    async fn count_job_files(&self, j: &mut JobRecord) -> Result<()> {
        let rows = sqlx::query(
            "SELECT state, COUNT(*), CAST(COALESCE(SUM(size), 0) AS BIGINT) FROM job_files \
             WHERE job = $1 GROUP BY state",
        )
        .bind(j.id)
        .fetch_all(&self.pool)
        .await?;
        for r in rows {
            let state: String = r.try_get(0)?;
            let count = r.try_get::<i64, _>(1)?.max(0) as u64;
            let bytes = r.try_get::<i64, _>(2)?.max(0) as u64;
            j.files += count;
            j.bytes += bytes;
            match JobState::parse(&state) {
                Some(JobState::Done) => {
                    j.files_done += count;
                    j.bytes_done += bytes;
                }
                Some(JobState::Failed) => j.files_failed += count,
                Some(JobState::Running) => j.files_running += count,
                Some(JobState::Cancelled) => j.files_cancelled += count,
                _ => {}
            }
        }
        Ok(())
    }

    /// One job with its files counted.
    pub async fn job(&self, id: i64) -> Result<JobRecord> {
        let row = sqlx::query(&format!("SELECT {JOB_COLS} FROM jobs WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .ok_or_else(|| CatalogError::NotFound(format!("job {id}")))?;
        let mut j = job_of(&row)?;
        self.count_job_files(&mut j).await?;
        Ok(j)
    }

    /// Up to `limit` of job `id`'s files from the `offset`th on, in order; only those in
    /// `state` when given.
    pub async fn job_files(
        &self,
        id: i64,
        state: Option<JobState>,
        offset: u64,
        limit: u32,
    ) -> Result<Vec<JobFile>> {
        let filter = if state.is_some() {
            " AND state = $4"
        } else {
            ""
        };
        let sql = format!(
            "SELECT {FILE_COLS} FROM job_files WHERE job = $1 AND seq >= $2{filter} ORDER BY seq LIMIT $3"
        );
        let mut q = sqlx::query(&sql)
            .bind(id)
            .bind(int(offset))
            .bind(limit as i64);
        if let Some(s) = state {
            q = q.bind(s.name());
        }
        let rows = q.fetch_all(&self.pool).await?;
        rows.iter().map(file_of).collect()
    }

    /// Up to `limit` queued files of job `id` whose back-off has passed at `now_ms`, in order.
    pub async fn runnable_job_files(
        &self,
        id: i64,
        now_ms: i64,
        limit: u32,
    ) -> Result<Vec<JobFile>> {
        let rows = sqlx::query(&format!(
            "SELECT {FILE_COLS} FROM job_files WHERE job = $1 AND state = 'queued' AND next_ms <= $2 \
             ORDER BY seq LIMIT $3"
        ))
        .bind(id)
        .bind(now_ms)
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(file_of).collect()
    }

    /// The earliest time a queued file of job `id` may be tried (None: nothing queued).
    pub async fn next_job_try(&self, id: i64) -> Result<Option<i64>> {
        let row =
            sqlx::query("SELECT MIN(next_ms) FROM job_files WHERE job = $1 AND state = 'queued'")
                .bind(id)
                .fetch_one(&self.pool)
                .await?;
        Ok(row.try_get::<Option<i64>, _>(0)?)
    }

    /// Every file left `running` (by a server that stopped), oldest job first.
    pub async fn running_job_files(&self) -> Result<Vec<JobFile>> {
        let rows = sqlx::query(&format!(
            "SELECT {FILE_COLS} FROM job_files WHERE state = 'running' ORDER BY job, seq"
        ))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(file_of).collect()
    }

    /// Writes each file's state, tries, back-off, target, node, checksum and error (by job
    /// and seq) in one transaction. A file of a job that has ended meanwhile (cancelled) is
    /// left alone unless the update ends it too.
    pub async fn update_job_files(&self, files: &[JobFile]) -> Result<()> {
        let now = crate::now_ms();
        self.write(async |w| {
            for f in files {
                sqlx::query(
                    "UPDATE job_files SET state = $3, tries = $4, next_ms = $5, target = $6, \
                     node = $7, checksum = $8, error_kind = $9, error = $10, updated_ms = $11 \
                     WHERE job = $1 AND seq = $2 AND (state <> 'cancelled' OR $3 = 'cancelled')",
                )
                .bind(f.job)
                .bind(f.seq)
                .bind(f.state.as_str())
                .bind(f.tries as i64)
                .bind(f.next_ms)
                .bind(f.target)
                .bind(f.node.as_str())
                .bind(f.checksum.as_str())
                .bind(f.error_kind.as_str())
                .bind(f.error.as_str())
                .bind(now)
                .execute(&mut *w.tx)
                .await?;
            }
            Ok(())
        })
        .await
    }

    /// Sets job `id`'s state (and its error; the end time when it ended). Returns false if
    /// the job does not exist.
    pub async fn set_job_state(&self, id: i64, state: JobState, error: &str) -> Result<bool> {
        let now = crate::now_ms();
        let ended = if state.ended() { now } else { 0 };
        self.write(async |w| {
            let n = sqlx::query(
                "UPDATE jobs SET state = $2, error = $3, updated_ms = $4, ended_ms = $5 WHERE id = $1",
            )
            .bind(id)
            .bind(state.name())
            .bind(error)
            .bind(now)
            .bind(ended)
            .execute(&mut *w.tx)
            .await?
            .rows_affected();
            Ok(n > 0)
        })
        .await
    }

    /// Cancels job `id`: the job and its queued files become cancelled (files being copied are
    /// the scheduler's to stop). Returns the files it had running. An ended job is refused.
    pub async fn cancel_job(&self, id: i64) -> Result<Vec<JobFile>> {
        let now = crate::now_ms();
        self.write(async |w| {
            let row = sqlx::query("SELECT state FROM jobs WHERE id = $1")
                .bind(id)
                .fetch_optional(&mut *w.tx)
                .await?
                .ok_or_else(|| CatalogError::NotFound(format!("job {id}")))?;
            let state: String = row.try_get(0)?;
            if JobState::parse(&state).is_some_and(|s| s.ended()) {
                return Err(CatalogError::Invalid(format!(
                    "job {id} has already ended ({state})"
                )));
            }
            let running = sqlx::query(&format!(
                "SELECT {FILE_COLS} FROM job_files WHERE job = $1 AND state = 'running' ORDER BY seq"
            ))
            .bind(id)
            .fetch_all(&mut *w.tx)
            .await?
            .iter()
            .map(file_of)
            .collect::<Result<Vec<_>>>()?;
            sqlx::query(
                "UPDATE job_files SET state = 'cancelled', updated_ms = $2 WHERE job = $1 AND state = 'queued'",
            )
            .bind(id)
            .bind(now)
            .execute(&mut *w.tx)
            .await?;
            sqlx::query(
                "UPDATE jobs SET state = 'cancelled', updated_ms = $2, ended_ms = $2, \
                 error = 'cancelled' WHERE id = $1",
            )
            .bind(id)
            .bind(now)
            .execute(&mut *w.tx)
            .await?;
            Ok(running)
        })
        .await
    }

    /// Queues job `id`'s failed and cancelled files again (tries from zero) and the job with
    /// them. Returns how many files were queued again; a job still active is refused.
    pub async fn retry_job(&self, id: i64) -> Result<u64> {
        let now = crate::now_ms();
        self.write(async |w| {
            let row = sqlx::query("SELECT state FROM jobs WHERE id = $1")
                .bind(id)
                .fetch_optional(&mut *w.tx)
                .await?
                .ok_or_else(|| CatalogError::NotFound(format!("job {id}")))?;
            let state: String = row.try_get(0)?;
            if !JobState::parse(&state).is_some_and(|s| s.ended()) {
                return Err(CatalogError::Busy(format!(
                    "job {id} is still {state}: wait for it or cancel it first"
                )));
            }
            let n = sqlx::query(
                "UPDATE job_files SET state = 'queued', tries = 0, next_ms = 0, error_kind = '', \
                 error = '', updated_ms = $2 WHERE job = $1 AND state IN ('failed', 'cancelled')",
            )
            .bind(id)
            .bind(now)
            .execute(&mut *w.tx)
            .await?
            .rows_affected();
            if n > 0 {
                sqlx::query(
                    "UPDATE jobs SET state = 'queued', error = '', updated_ms = $2, ended_ms = 0, \
                     notified = 0 WHERE id = $1",
                )
                .bind(id)
                .bind(now)
                .execute(&mut *w.tx)
                .await?;
            }
            Ok(n)
        })
        .await
    }

    /// What the jobs' optimizer learned about the link `src` -> `dst`: sessions and goodput.
    pub async fn link_tuning(&self, src: &str, dst: &str) -> Result<Option<(u32, f64)>> {
        let row = sqlx::query(
            "SELECT sessions, goodput_bps FROM link_tuning WHERE src_site = $1 AND dst_site = $2",
        )
        .bind(src)
        .bind(dst)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| {
            Ok((
                r.try_get::<i64, _>(0)?.clamp(0, u32::MAX as i64) as u32,
                r.try_get::<f64, _>(1)?,
            ))
        })
        .transpose()
    }

    /// Every link the optimizer learned about: (source site, destination site, sessions,
    /// goodput, when), by site names.
    pub async fn link_tunings(&self) -> Result<Vec<(String, String, u32, f64, i64)>> {
        let rows = sqlx::query(
            "SELECT src_site, dst_site, sessions, goodput_bps, updated_ms FROM link_tuning \
             ORDER BY src_site, dst_site LIMIT 10000",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok((
                    r.try_get(0)?,
                    r.try_get(1)?,
                    r.try_get::<i64, _>(2)?.clamp(0, u32::MAX as i64) as u32,
                    r.try_get::<f64, _>(3)?,
                    r.try_get::<i64, _>(4)?,
                ))
            })
            .collect()
    }

    /// Remembers what the optimizer learned about the link `src` -> `dst`.
    pub async fn set_link_tuning(
        &self,
        src: &str,
        dst: &str,
        sessions: u32,
        goodput_bps: f64,
    ) -> Result<()> {
        let now = crate::now_ms();
        let goodput = if goodput_bps.is_finite() {
            goodput_bps.max(0.0)
        } else {
            0.0
        };
        self.write(async |w| {
            sqlx::query(
                "INSERT INTO link_tuning (src_site, dst_site, sessions, goodput_bps, updated_ms) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (src_site, dst_site) DO UPDATE SET \
                 sessions = excluded.sessions, goodput_bps = excluded.goodput_bps, updated_ms = excluded.updated_ms",
            )
            .bind(src)
            .bind(dst)
            .bind(sessions as i64)
            .bind(goodput)
            .bind(now)
            .execute(&mut *w.tx)
            .await?;
            Ok(())
        })
        .await
    }

    /// Ended jobs whose end was not told to their webhook yet (at most `limit`, oldest first).
    pub async fn unnotified_jobs(&self, limit: u32) -> Result<Vec<JobRecord>> {
        let rows = sqlx::query(&format!(
            "SELECT {JOB_COLS} FROM jobs WHERE notified = 0 AND state IN ('done', 'failed', 'cancelled') \
             ORDER BY id LIMIT $1"
        ))
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await?;
        self.counted(&rows).await
    }

    /// The delegation job `id` acts with (empty: none, or the job ended).
    pub async fn job_credential(&self, id: i64) -> Result<String> {
        let row = sqlx::query("SELECT credential FROM jobs WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(match row {
            Some(r) => r.try_get(0)?,
            None => String::new(),
        })
    }

    /// Replaces job `id`'s delegation (`""` forgets it: a job that ended keeps none).
    pub async fn set_job_credential(&self, id: i64, credential: &str) -> Result<()> {
        self.write(async |w| {
            sqlx::query("UPDATE jobs SET credential = $2 WHERE id = $1")
                .bind(id)
                .bind(credential)
                .execute(&mut *w.tx)
                .await?;
            Ok(())
        })
        .await
    }

    /// Job `id`'s end was told (or cannot be: no webhook, or the attempts ran out).
    pub async fn set_job_notified(&self, id: i64) -> Result<()> {
        self.write(async |w| {
            sqlx::query("UPDATE jobs SET notified = 1 WHERE id = $1")
                .bind(id)
                .execute(&mut *w.tx)
                .await?;
            Ok(())
        })
        .await
    }

    /// Drops job `id` and its files; whether it existed.
    pub async fn delete_job(&self, id: i64) -> Result<bool> {
        self.write(async |w| {
            sqlx::query("DELETE FROM job_files WHERE job = $1")
                .bind(id)
                .execute(&mut *w.tx)
                .await?;
            let n = sqlx::query("DELETE FROM jobs WHERE id = $1")
                .bind(id)
                .execute(&mut *w.tx)
                .await?
                .rows_affected();
            Ok(n > 0)
        })
        .await
    }
}
