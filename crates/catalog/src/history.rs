//! Transfer history: one record per transfer that touched the grid (a client's upload,
//! download or copy within the grid, a replication session, a repair, a run), its summary and
//! its per-file outcomes, kept until retention prunes it.

use crate::{Catalog, CatalogError, Result};
use serde::{Deserialize, Serialize};
use sqlx::Row;
use sqlx::any::AnyRow;

/// Rows per INSERT statement when adding per-file outcomes (8 values each: well under every
/// backend's limit on bound parameters).
const FILES_PER_STATEMENT: usize = 200;

/// One transfer's summary.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TransferRecord {
    /// Assigned by the catalog (0 in a new record).
    pub id: i64,
    /// upload, download, copy, replicate, repair, reconcile, drain or run.
    pub kind: String,
    /// Who asked: the caller's account, or "system" for the metadata server's own work.
    pub user: String,
    pub source: String,
    pub destination: String,
    /// Site the data left from ("client" for a client's own disk).
    pub src_site: String,
    /// Site the data went to ("client" for a download).
    pub dst_site: String,
    pub started_ms: i64,
    pub ended_ms: i64,
    pub files: u64,
    pub files_failed: u64,
    /// Bytes of the files delivered.
    pub bytes: u64,
    /// Bytes that crossed the network (all attempts).
    pub bytes_moved: u64,
    pub streams: u32,
    pub retransmits: u64,
    pub attempts: u32,
    /// The error kind of the transfer's first failure (empty when every file arrived).
    pub error_kind: String,
    /// The exit code `haul` gives that kind (0 when nothing failed).
    pub exit_code: i32,
    pub error: String,
    /// The transfer log's summary: plan, congestion control, bottleneck.
    pub summary: String,
    /// Throughput over time from the client's trace, when one was recorded:
    /// `seconds:bits_per_second` pairs separated by spaces. Read only by `transfer` (one
    /// record), not by listings.
    pub trace: String,
}

impl TransferRecord {
    pub fn failed(&self) -> bool {
        self.files_failed > 0 || !self.error_kind.is_empty()
    }
}

/// One file's outcome within a transfer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferFile {
    pub path: String,
    /// The storage node it was read from or written to (empty when unknown).
    pub node: String,
    pub bytes: u64,
    /// `algorithm:hex` pairs separated by spaces (empty for a failed file).
    pub checksum: String,
    pub error_kind: String,
    pub error: String,
}

/// Which records to list. Newest first.
#[derive(Clone, Debug, Default)]
pub struct TransferFilter {
    pub user: Option<String>,
    /// Either end at this site.
    pub site: Option<String>,
    pub kind: Option<String>,
    /// Ended at or after this time.
    pub since_ms: Option<i64>,
    pub failed_only: bool,
    /// Only records older than this id (paging: the last id of the previous page).
    pub before_id: Option<i64>,
    pub limit: u32,
}

const COLS: &str = "id, kind, user_name, source, destination, src_site, dst_site, started_ms, \
     ended_ms, files, files_failed, bytes, bytes_moved, streams, retransmits, attempts, \
     error_kind, exit_code, error, summary";

fn record_of(r: &AnyRow) -> Result<TransferRecord> {
    let n = |c: &str| -> Result<i64> { Ok(r.try_get::<i64, _>(c)?) };
    Ok(TransferRecord {
        id: n("id")?,
        kind: r.try_get("kind")?,
        user: r.try_get("user_name")?,
        source: r.try_get("source")?,
        destination: r.try_get("destination")?,
        src_site: r.try_get("src_site")?,
        dst_site: r.try_get("dst_site")?,
        started_ms: n("started_ms")?,
        ended_ms: n("ended_ms")?,
        files: n("files")? as u64,
        files_failed: n("files_failed")? as u64,
        bytes: n("bytes")? as u64,
        bytes_moved: n("bytes_moved")? as u64,
        streams: n("streams")? as u32,
        retransmits: n("retransmits")? as u64,
        attempts: n("attempts")? as u32,
        error_kind: r.try_get("error_kind")?,
        exit_code: n("exit_code")? as i32,
        error: r.try_get("error")?,
        summary: r.try_get("summary")?,
        // Listings do not select it.
        trace: r.try_get("trace").unwrap_or_default(),
    })
}

/// Numbers are stored as signed 64-bit integers; larger counts are clamped, never wrapped.
fn int(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}

impl Catalog {
    /// Stores a transfer and its first per-file outcomes; returns its id.
    pub async fn record_transfer(&self, t: &TransferRecord, files: &[TransferFile]) -> Result<i64> {
        self.write(async |w| {
            let row = sqlx::query(
                "INSERT INTO transfers (kind, user_name, source, destination, src_site, dst_site, \
                 started_ms, ended_ms, files, files_failed, bytes, bytes_moved, streams, \
                 retransmits, attempts, error_kind, exit_code, error, summary, trace) VALUES \
                 ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20) \
                 RETURNING id",
            )
            .bind(&t.kind)
            .bind(&t.user)
            .bind(&t.source)
            .bind(&t.destination)
            .bind(&t.src_site)
            .bind(&t.dst_site)
            .bind(t.started_ms)
            .bind(t.ended_ms)
            .bind(int(t.files))
            .bind(int(t.files_failed))
            .bind(int(t.bytes))
            .bind(int(t.bytes_moved))
            .bind(t.streams as i64)
            .bind(int(t.retransmits))
            .bind(t.attempts as i64)
            .bind(&t.error_kind)
            .bind(t.exit_code as i64)
            .bind(&t.error)
            .bind(&t.summary)
            .bind(&t.trace)
            .fetch_one(&mut *w.tx)
            .await?;
            let id: i64 = row.try_get(0)?;
            insert_files(&mut w.tx, id, 0, files).await?;
            Ok(id)
        })
        .await
    }

    /// Adds per-file outcomes to transfer `id` after those it has (a transfer of many files
    /// arrives in several messages), refused if the record would then have more than
    /// `max_total`. Returns how many files the record now has.
    pub async fn add_transfer_files(
        &self,
        id: i64,
        files: &[TransferFile],
        max_total: u64,
    ) -> Result<u64> {
        self.write(async |w| {
            let known = sqlx::query("SELECT 1 FROM transfers WHERE id = $1")
                .bind(id)
                .fetch_optional(&mut *w.tx)
                .await?;
            if known.is_none() {
                return Err(CatalogError::NotFound(format!("transfer {id}")));
            }
            let have: i64 = sqlx::query("SELECT COUNT(*) FROM transfer_files WHERE transfer = $1")
                .bind(id)
                .fetch_one(&mut *w.tx)
                .await?
                .try_get(0)?;
            let total = have as u64 + files.len() as u64;
            if total > max_total {
                return Err(CatalogError::Invalid(format!(
                    "transfer {id}: {total} files would be more than the {max_total} it has"
                )));
            }
            insert_files(&mut w.tx, id, have, files).await?;
            Ok(total)
        })
        .await
    }

    /// Transfer records matching `f`, newest first.
    pub async fn transfers(&self, f: &TransferFilter) -> Result<Vec<TransferRecord>> {
        let mut q = format!("SELECT {COLS} FROM transfers WHERE 1 = 1");
        let mut n = 0;
        let mut next = || {
            n += 1;
            format!("${n}")
        };
        if f.user.is_some() {
            q += &format!(" AND user_name = {}", next());
        }
        if f.site.is_some() {
            let p = next();
            q += &format!(" AND (src_site = {p} OR dst_site = {p})");
        }
        if f.kind.is_some() {
            q += &format!(" AND kind = {}", next());
        }
        if f.since_ms.is_some() {
            q += &format!(" AND ended_ms >= {}", next());
        }
        if f.before_id.is_some() {
            q += &format!(" AND id < {}", next());
        }
        if f.failed_only {
            q += " AND (files_failed > 0 OR error_kind <> '')";
        }
        q += &format!(" ORDER BY id DESC LIMIT {}", next());
        let mut query = sqlx::query(&q);
        for s in [&f.user, &f.site, &f.kind].into_iter().flatten() {
            query = query.bind(s.as_str());
        }
        for v in [f.since_ms, f.before_id].into_iter().flatten() {
            query = query.bind(v);
        }
        let rows = query
            .bind(f.limit.max(1) as i64)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(record_of).collect()
    }

    /// One transfer and up to `limit` of its per-file outcomes from the `offset`th on.
    pub async fn transfer(
        &self,
        id: i64,
        offset: u64,
        limit: u32,
    ) -> Result<(TransferRecord, Vec<TransferFile>)> {
        let row = sqlx::query(&format!(
            "SELECT {COLS}, trace FROM transfers WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?
        .ok_or_else(|| CatalogError::NotFound(format!("transfer {id}")))?;
        let rec = record_of(&row)?;
        let rows = sqlx::query(
            "SELECT path, node, bytes, checksum, error_kind, error FROM transfer_files \
             WHERE transfer = $1 AND seq >= $2 ORDER BY seq LIMIT $3",
        )
        .bind(id)
        .bind(int(offset))
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await?;
        let files = rows
            .iter()
            .map(|r| {
                Ok(TransferFile {
                    path: r.try_get("path")?,
                    node: r.try_get("node")?,
                    bytes: r.try_get::<i64, _>("bytes")? as u64,
                    checksum: r.try_get("checksum")?,
                    error_kind: r.try_get("error_kind")?,
                    error: r.try_get("error")?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((rec, files))
    }

    /// Retention: drops records that ended before `before_ms`, and the oldest beyond the newest
    /// `keep` records. Returns how many went.
    pub async fn prune_transfers(&self, before_ms: i64, keep: u64) -> Result<u64> {
        self.write(async |w| {
            let cutoff: Option<i64> = sqlx::query("SELECT id FROM transfers ORDER BY id DESC LIMIT 1 OFFSET $1")
                .bind(int(keep))
                .fetch_optional(&mut *w.tx)
                .await?
                .map(|r| r.try_get(0))
                .transpose()?;
            let mut gone = 0;
            // Files first: SQLite enforces the cascade only with foreign keys on.
            for (cond, v) in [
                ("ended_ms < $1", Some(before_ms)),
                ("id <= $1", cutoff),
            ] {
                let Some(v) = v else { continue };
                sqlx::query(&format!(
                    "DELETE FROM transfer_files WHERE transfer IN (SELECT id FROM transfers WHERE {cond})"
                ))
                .bind(v)
                .execute(&mut *w.tx)
                .await?;
                gone += sqlx::query(&format!("DELETE FROM transfers WHERE {cond}"))
                    .bind(v)
                    .execute(&mut *w.tx)
                    .await?
                    .rows_affected();
            }
            Ok(gone)
        })
        .await
    }

    /// Bytes delivered per (source site, destination site) and time bucket of `bucket_ms`,
    /// for transfers that ended at or after `since_ms` (a transfer's bytes count in the bucket
    /// it ended in). Oldest bucket first.
    pub async fn transfer_volume(
        &self,
        since_ms: i64,
        bucket_ms: i64,
    ) -> Result<Vec<(String, String, i64, u64)>> {
        let bucket_ms = bucket_ms.max(1);
        let rows = sqlx::query(
            "SELECT src_site, dst_site, (ended_ms / $2) * $2 AS b, CAST(SUM(bytes) AS BIGINT) \
             FROM transfers WHERE ended_ms >= $1 GROUP BY src_site, dst_site, b ORDER BY b, src_site, dst_site",
        )
        .bind(since_ms)
        .bind(bucket_ms)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok((
                    r.try_get(0)?,
                    r.try_get(1)?,
                    r.try_get::<i64, _>(2)?,
                    r.try_get::<i64, _>(3)? as u64,
                ))
            })
            .collect()
    }

    /// Drops record `id` and its per-file outcomes; whether it existed.
    pub async fn delete_transfer(&self, id: i64) -> Result<bool> {
        self.write(async |w| {
            sqlx::query("DELETE FROM transfer_files WHERE transfer = $1")
                .bind(id)
                .execute(&mut *w.tx)
                .await?;
            let gone = sqlx::query("DELETE FROM transfers WHERE id = $1")
                .bind(id)
                .execute(&mut *w.tx)
                .await?
                .rows_affected();
            Ok(gone > 0)
        })
        .await
    }

    /// Number of transfer records (for reports and benchmarks).
    pub async fn count_transfers(&self) -> Result<u64> {
        let row = sqlx::query("SELECT COUNT(*) FROM transfers")
            .fetch_one(&self.pool)
            .await?;
        Ok(row.try_get::<i64, _>(0)? as u64)
    }
}

async fn insert_files(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    id: i64,
    first_seq: i64,
    files: &[TransferFile],
) -> Result<()> {
    for (chunk_no, chunk) in files.chunks(FILES_PER_STATEMENT).enumerate() {
        let mut q = String::from(
            "INSERT INTO transfer_files (transfer, seq, path, node, bytes, checksum, error_kind, error) VALUES ",
        );
        for i in 0..chunk.len() {
            let b = i * 8;
            if i > 0 {
                q.push_str(", ");
            }
            q += &format!(
                "(${}, ${}, ${}, ${}, ${}, ${}, ${}, ${})",
                b + 1,
                b + 2,
                b + 3,
                b + 4,
                b + 5,
                b + 6,
                b + 7,
                b + 8
            );
        }
        let mut query = sqlx::query(&q);
        for (i, f) in chunk.iter().enumerate() {
            let seq = first_seq + (chunk_no * FILES_PER_STATEMENT + i) as i64;
            query = query
                .bind(id)
                .bind(seq)
                .bind(f.path.as_str())
                .bind(f.node.as_str())
                .bind(int(f.bytes))
                .bind(f.checksum.as_str())
                .bind(f.error_kind.as_str())
                .bind(f.error.as_str());
        }
        query.execute(&mut **tx).await?;
    }
    Ok(())
}
