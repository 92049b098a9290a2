//! Transfer history on the metadata server: records of clients' transfers (checked, stamped
//! with the caller's identity and the server's clock), records of the server's own copies
//! (replication, repair, drain), who may read which, and retention.
//!
//! A client's record states what the client saw (bytes, files, failures); the server trusts
//! it only for the caller's own history: the user is the certificate's, the times are the
//! server's, the sites are those of registered nodes, and the sizes of every field are bounded.

use crate::auth::User;
use crate::error::Error;
use crate::runs::{
    CLIENT_COPIES, CLIENT_COPIES_PER_USER, ClientCopy, ClientFigures, LiveRefusal, bounded,
};
use crate::state::{Meta, Retention};
use api::meta as pb;
use catalog::{TransferFile, TransferFilter, TransferRecord};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use wire::error::ErrorKind;

/// One of the server's own sessions (replication, a job's batch), as the history keeps it.
pub(crate) struct OwnSession {
    pub kind: String,
    pub user: String,
    /// How the two ends are shown, and their sites.
    pub source: String,
    pub destination: String,
    pub src_site: String,
    pub dst_site: String,
    pub started_ms: i64,
    pub bytes_moved: u64,
    pub streams: u32,
    pub retransmits: u64,
    pub summary: String,
}

impl OwnSession {
    /// The record of this session with per-file outcomes `files` (a file failed when its
    /// `error_kind` is set): totals, and the first failure as the session's error.
    pub(crate) fn record(self, files: &[TransferFile]) -> TransferRecord {
        let failed: Vec<&TransferFile> =
            files.iter().filter(|f| !f.error_kind.is_empty()).collect();
        let first = failed.first();
        let kind = first.and_then(|f| ErrorKind::from_name(&f.error_kind));
        TransferRecord {
            kind: self.kind,
            user: self.user,
            source: self.source,
            destination: self.destination,
            src_site: self.src_site,
            dst_site: self.dst_site,
            started_ms: self.started_ms,
            ended_ms: catalog::now_ms(),
            files: files.len() as u64,
            files_failed: failed.len() as u64,
            bytes: files.iter().map(|f| f.bytes).sum(),
            bytes_moved: self.bytes_moved,
            streams: self.streams,
            retransmits: self.retransmits,
            attempts: 1,
            error_kind: first.map(|f| f.error_kind.clone()).unwrap_or_default(),
            exit_code: kind.map(transfer::error::exit_code_of).unwrap_or(0),
            error: first
                .map(|f| format!("{}: {}", f.path, f.error))
                .unwrap_or_default(),
            summary: self.summary,
            ..Default::default()
        }
    }
}

/// Per-file outcomes in one message at most.
pub const MAX_FILES_PER_MESSAGE: usize = 5_000;
/// Files a record may say it has.
const MAX_FILES: u64 = 100_000_000;
/// Records in one listing at most, and by default.
const MAX_LIST: u32 = 10_000;
const DEFAULT_LIST: u32 = 100;
/// Per-file outcomes in one `GetTransfer` reply at most.
const MAX_FILES_REPLY: u32 = 10_000;
const DEFAULT_FILES_REPLY: u32 = 1_000;

/// The summary of a record the server made of a client's copy that fell silent.
const ABANDONED_SUMMARY: &str =
    "recorded by the metadata server from the client's last progress report";

/// Kinds a client may record; the server's own are replicate, repair, reconcile and drain.
const CLIENT_KINDS: [&str; 4] = ["upload", "download", "copy", "run"];

fn file_of(f: &pb::TransferFile) -> TransferFile {
    TransferFile {
        path: bounded(&f.path, 4096),
        node: bounded(&f.node, 256),
        bytes: f.bytes,
        checksum: bounded(&f.checksum, 1024),
        error_kind: bounded(&f.error_kind, 64),
        error: bounded(&f.error, 2048),
    }
}

pub fn to_pb(t: &TransferRecord) -> pb::Transfer {
    pb::Transfer {
        id: t.id,
        kind: t.kind.clone(),
        user: t.user.clone(),
        source: t.source.clone(),
        destination: t.destination.clone(),
        src_site: t.src_site.clone(),
        dst_site: t.dst_site.clone(),
        started_ms: t.started_ms,
        ended_ms: t.ended_ms,
        files: t.files,
        files_failed: t.files_failed,
        bytes: t.bytes,
        bytes_moved: t.bytes_moved,
        streams: t.streams,
        retransmits: t.retransmits,
        attempts: t.attempts,
        error_kind: t.error_kind.clone(),
        exit_code: t.exit_code,
        error: t.error.clone(),
        summary: t.summary.clone(),
        trace: t.trace.clone(),
    }
}

/// Points of a trace a record keeps at most, and its text's length.
pub const MAX_TRACE_POINTS: usize = 600;
const MAX_TRACE_BYTES: usize = 32 << 10;

/// A client's trace as stored: `seconds:bits_per_second` pairs with finite, non-negative
/// numbers and increasing times, at most `MAX_TRACE_POINTS`; anything else is dropped (the
/// record is kept without it).
fn checked_trace(s: &str) -> String {
    if s.len() > MAX_TRACE_BYTES {
        return String::new();
    }
    match transfer::trace::summary::parse_throughput_points(s) {
        Some(points) if points.len() <= MAX_TRACE_POINTS => {
            s.split_whitespace().collect::<Vec<_>>().join(" ")
        }
        _ => String::new(),
    }
}

fn file_to_pb(f: &TransferFile) -> pb::TransferFile {
    pb::TransferFile {
        path: f.path.clone(),
        node: f.node.clone(),
        bytes: f.bytes,
        checksum: f.checksum.clone(),
        error_kind: f.error_kind.clone(),
        error: f.error.clone(),
    }
}

impl Meta {
    /// The site of each registered node.
    fn node_sites(&self) -> HashMap<String, String> {
        self.nodes()
            .into_iter()
            .map(|n| (n.node.name, n.node.site))
            .collect()
    }

    /// Stores a record the server made (its own copies). Failures to store are logged: the
    /// copy itself has happened either way.
    pub async fn record_transfer(&self, t: TransferRecord, files: &[TransferFile]) {
        if let Err(e) = self.catalog.record_transfer(&t, files).await {
            tracing::warn!(error = %e, kind = %t.kind, "cannot record a transfer in the history");
        }
    }

    /// A client's record of its own transfer (`q.id == 0`), or more per-file outcomes of one.
    pub async fn record_client_transfer(
        &self,
        user: &User,
        q: &pb::RecordTransferRequest,
    ) -> Result<pb::RecordTransferReply, Error> {
        if q.files.len() > MAX_FILES_PER_MESSAGE {
            return Err(Error::invalid(format!(
                "a transfer record message carries at most {MAX_FILES_PER_MESSAGE} files ({} sent)",
                q.files.len()
            )));
        }
        let files: Vec<TransferFile> = q.files.iter().map(file_of).collect();
        if q.id != 0 {
            // More files of a record of the caller's, up to as many as it said it has.
            let (rec, _) = self
                .catalog
                .transfer(q.id, 0, 0)
                .await
                .map_err(|_| not_yours(q.id))?;
            // The server's own records, abandoned copies included, take no files from clients.
            if rec.user != user.name
                || !CLIENT_KINDS.contains(&rec.kind.as_str())
                || rec.summary == ABANDONED_SUMMARY
            {
                return Err(not_yours(q.id));
            }
            self.catalog
                .add_transfer_files(q.id, &files, rec.files)
                .await?;
            return Ok(pb::RecordTransferReply { id: q.id });
        }
        let t = q
            .transfer
            .as_ref()
            .ok_or_else(|| Error::invalid("a new transfer record needs its summary"))?;
        if !CLIENT_KINDS.contains(&t.kind.as_str()) {
            return Err(Error::invalid(format!(
                "a client records transfers of kind {}, not {:?}",
                CLIENT_KINDS.join(", "),
                t.kind
            )));
        }
        if t.files > MAX_FILES || (files.len() as u64) > t.files {
            return Err(Error::invalid(format!(
                "transfer record: {} files stated, {} sent",
                t.files,
                files.len()
            )));
        }
        // The server's clock: a client's may be off, and the history is one time line.
        let now = catalog::now_ms();
        let took = t
            .ended_ms
            .saturating_sub(t.started_ms)
            .clamp(0, 366 * 86_400_000);
        let sites = self.node_sites();
        let site = |s: &str| {
            if sites.values().any(|v| v == s) {
                s.to_string()
            } else {
                String::new()
            }
        };
        // The grid end's site: the one the client named if it is a site, else that of the
        // node most files went through.
        let busiest = {
            let mut n: HashMap<&str, u64> = HashMap::new();
            for f in &files {
                if let Some(s) = sites.get(&f.node) {
                    *n.entry(s.as_str()).or_default() += 1;
                }
            }
            n.into_iter()
                .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(a.0)))
                .map(|(s, _)| s.to_string())
                .unwrap_or_default()
        };
        let or_busiest = |s: String| if s.is_empty() { busiest.clone() } else { s };
        let (src_site, dst_site) = match t.kind.as_str() {
            "upload" => ("client".to_string(), or_busiest(site(&t.dst_site))),
            "download" => (or_busiest(site(&t.src_site)), "client".to_string()),
            _ => (site(&t.src_site), or_busiest(site(&t.dst_site))),
        };
        let error_kind = if t.error_kind.is_empty() {
            String::new()
        } else {
            wire::error::ErrorKind::from_name(&t.error_kind)
                .map(|k| k.name().to_string())
                .unwrap_or_else(|| "io".into())
        };
        let exit_code = wire::error::ErrorKind::from_name(&error_kind)
            .map(transfer::error::exit_code_of)
            .unwrap_or(0);
        let rec = TransferRecord {
            id: 0,
            kind: t.kind.clone(),
            user: user.name.clone(),
            source: bounded(&t.source, 4096),
            destination: bounded(&t.destination, 4096),
            src_site,
            dst_site,
            started_ms: now - took,
            ended_ms: now,
            files: t.files,
            files_failed: t.files_failed.min(t.files),
            bytes: t.bytes,
            bytes_moved: t.bytes_moved,
            streams: t.streams.min(10_000),
            retransmits: t.retransmits,
            attempts: t.attempts.min(10_000),
            error_kind,
            exit_code,
            error: bounded(&t.error, 2048),
            summary: bounded(&t.summary, 8192),
            trace: checked_trace(&t.trace),
        };
        let id = self.catalog.record_transfer(&rec, &files).await?;
        // The client was cut off for a while but its copy went on: its own record replaces
        // the one the server made when it fell silent.
        for stale in self
            .live_clients
            .take_abandoned(&user.name, &q.live_ids[..q.live_ids.len().min(64)])
        {
            if let Err(e) = self.catalog.delete_transfer(stale).await {
                tracing::warn!(error = %e, record = stale, "cannot drop an abandoned copy's record");
            }
        }
        Ok(pb::RecordTransferReply { id })
    }

    /// Records the caller may see: their own, or (administrators) anybody's.
    pub async fn list_transfers(
        &self,
        user: &User,
        q: &pb::TransfersRequest,
    ) -> Result<pb::TransfersReply, Error> {
        let who = if user.admin {
            (!q.user.is_empty()).then(|| q.user.clone())
        } else if q.user.is_empty() || q.user == user.name {
            Some(user.name.clone())
        } else {
            return Err(Error::permission_denied(format!(
                "only administrators see the transfers of other users ({} asked for {})",
                user.name, q.user
            )));
        };
        let nonempty = |s: &str| (!s.is_empty()).then(|| s.to_string());
        let f = TransferFilter {
            user: who,
            site: nonempty(&q.site),
            kind: nonempty(&q.kind),
            since_ms: (q.since_ms > 0).then_some(q.since_ms),
            failed_only: q.failed,
            before_id: (q.before_id > 0).then_some(q.before_id),
            limit: match q.limit {
                0 => DEFAULT_LIST,
                n => n.min(MAX_LIST),
            },
        };
        let list = self.catalog.transfers(&f).await?;
        Ok(pb::TransfersReply {
            transfers: list.iter().map(to_pb).collect(),
        })
    }

    /// One record with a page of its per-file outcomes, for its user or an administrator.
    pub async fn get_transfer(
        &self,
        user: &User,
        q: &pb::TransferRequest,
    ) -> Result<pb::TransferReply, Error> {
        let limit = match q.limit {
            0 => DEFAULT_FILES_REPLY,
            n => n.min(MAX_FILES_REPLY),
        };
        let (rec, files) = self
            .catalog
            .transfer(q.id, q.offset, limit)
            .await
            .map_err(|_| not_yours(q.id))?;
        if rec.user != user.name && !user.admin {
            return Err(not_yours(q.id));
        }
        Ok(pb::TransferReply {
            transfer: Some(to_pb(&rec)),
            files: files.iter().map(file_to_pb).collect(),
        })
    }
}

fn figures_of(q: &pb::LiveReport) -> ClientFigures {
    ClientFigures {
        files_total: q.files_total,
        files_done: q.files_done,
        files_failed: q.files_failed,
        bytes_total: q.bytes_total,
        bytes_done: q.bytes_done,
        streams: q.streams.min(10_000),
    }
}

/// `instant` on the server's clock, in milliseconds since the epoch.
fn ms_of(instant: Instant, now: Instant, now_ms: i64) -> i64 {
    now_ms - now.saturating_duration_since(instant).as_millis() as i64
}

impl Meta {
    /// A client's report on one of its copies in progress (id 0 lists a new one).
    pub fn report_live(&self, user: &User, q: &pb::LiveReport) -> Result<pb::LiveReply, Error> {
        let now = Instant::now();
        if q.id == 0 {
            if q.ended {
                return Ok(pb::LiveReply { id: 0 });
            }
            if !CLIENT_KINDS.contains(&q.kind.as_str()) {
                return Err(Error::invalid(format!(
                    "a client reports copies of kind {}, not {:?}",
                    CLIENT_KINDS.join(", "),
                    q.kind
                )));
            }
            let id = self
                .live_clients
                .start(
                    &user.name,
                    &q.kind,
                    &q.source,
                    &q.destination,
                    figures_of(q),
                    now,
                    catalog::now_ms(),
                )
                .map_err(live_refusal)?;
            return Ok(pb::LiveReply { id: id as i64 });
        }
        self.live_clients
            .report(&user.name, q.id as u64, figures_of(q), q.ended, now)
            .map_err(live_refusal)?;
        Ok(pb::LiveReply { id: q.id })
    }

    /// The copies in progress `user` may see (their own; administrators all): clients'
    /// copies and the server's own runs.
    pub fn live_copies(&self, user: &User) -> pb::LiveList {
        let (now, now_ms) = (Instant::now(), catalog::now_ms());
        let mine = |who: &str| user.admin || who == user.name;
        let mut copies: Vec<pb::LiveCopy> = self
            .live_clients
            .list()
            .into_iter()
            .filter(|c| mine(&c.user))
            .map(|c| pb::LiveCopy {
                rate_bps: c.rate(),
                updated_ms: ms_of(c.last_report, now, now_ms),
                user: c.user,
                kind: c.kind,
                source: c.source,
                destination: c.destination,
                started_ms: c.started_ms,
                files_total: c.figures.files_total,
                files_done: c.figures.files_done,
                files_failed: c.figures.files_failed,
                bytes_total: c.figures.bytes_total,
                bytes_done: c.figures.bytes_done,
                streams: c.figures.streams,
            })
            .collect();
        for r in self.live.list() {
            if !mine(&r.origin.user) {
                continue;
            }
            let p = &r.progress;
            let done = p.bytes_done.load(Ordering::Relaxed);
            copies.push(pb::LiveCopy {
                user: r.origin.user.clone(),
                kind: r.origin.kind.to_string(),
                source: String::new(),
                destination: String::new(),
                started_ms: r.started_ms,
                files_total: p.copies_needed.load(Ordering::Relaxed),
                files_done: p.copies_made.load(Ordering::Relaxed),
                files_failed: p.failures.lock().map(|f| f.len() as u64).unwrap_or(0),
                bytes_total: p.bytes_needed.load(Ordering::Relaxed),
                bytes_done: done,
                streams: p.sessions.load(Ordering::Relaxed).min(u32::MAX as u64) as u32,
                rate_bps: done as f64 / r.started.elapsed().as_secs_f64().max(0.001),
                updated_ms: now_ms,
            });
        }
        copies.sort_by_key(|c| c.started_ms);
        pb::LiveList { copies }
    }

    /// Records a client's copy that fell silent as abandoned, with what it had reported.
    async fn record_abandoned(&self, live_id: u64, c: ClientCopy, now: Instant, now_ms: i64) {
        let f = &c.figures;
        let files = f.files_total.max(f.files_done).min(MAX_FILES);
        let rec = TransferRecord {
            id: 0,
            kind: c.kind.clone(),
            user: c.user.clone(),
            source: c.source.clone(),
            destination: c.destination.clone(),
            src_site: if c.kind == "upload" {
                "client".into()
            } else {
                String::new()
            },
            dst_site: if c.kind == "download" {
                "client".into()
            } else {
                String::new()
            },
            started_ms: c.started_ms,
            ended_ms: ms_of(c.last_report, now, now_ms),
            files,
            files_failed: files - f.files_done.min(files),
            bytes: f.bytes_done,
            bytes_moved: f.bytes_done,
            streams: f.streams,
            retransmits: 0,
            attempts: 1,
            error_kind: ErrorKind::Cancelled.name().to_string(),
            exit_code: transfer::error::exit_code_of(ErrorKind::Cancelled),
            error: format!(
                "abandoned: the client stopped reporting (killed, or cut off from the metadata server) with {} of {} files and {} of {} bytes done",
                f.files_done, f.files_total, f.bytes_done, f.bytes_total
            ),
            summary: ABANDONED_SUMMARY.into(),
            trace: String::new(),
        };
        match self.catalog.record_transfer(&rec, &[]).await {
            Ok(record) => self.live_clients.note_abandoned(live_id, &c.user, record),
            Err(e) => {
                tracing::warn!(error = %e, user = %c.user, "cannot record an abandoned copy in the history")
            }
        }
    }
}

fn live_refusal(r: LiveRefusal) -> Error {
    match r {
        LiveRefusal::Unknown => Error::not_found(
            "no such copy in progress among yours (it ended, or was silent for 30 s)",
        ),
        LiveRefusal::Full => Error::new(
            ErrorKind::Busy,
            format!(
                "too many copies in progress are listed ({CLIENT_COPIES_PER_USER} per user, {CLIENT_COPIES} in all)"
            ),
        ),
    }
}

/// Drops clients' copies that fell silent (recording them as abandoned) every few seconds
/// until `stop`.
pub async fn watch_live(meta: Arc<Meta>, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
            _ = stop.cancelled() => return,
        }
        let (now, now_ms) = (Instant::now(), catalog::now_ms());
        for (id, c) in meta.live_clients.expire(now) {
            tracing::info!(user = %c.user, kind = %c.kind, source = %c.source, "a client's copy fell silent: recorded as abandoned");
            meta.record_abandoned(id, c, now, now_ms).await;
        }
    }
}

/// The same answer whether the record does not exist or is somebody else's.
fn not_yours(id: i64) -> Error {
    Error::not_found(format!(
        "transfer {id}: no such transfer among yours (see haul transfers)"
    ))
}

/// Applies `retention` now and then every hour until `stop`.
pub async fn retain(meta: Arc<Meta>, retention: Retention, stop: CancellationToken) {
    loop {
        let before = catalog::now_ms() - retention.max_age.as_millis().min(i64::MAX as u128) as i64;
        match meta
            .catalog
            .prune_transfers(before, retention.max_records)
            .await
        {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                records = n,
                "transfer history: dropped records past retention"
            ),
            Err(e) => tracing::warn!(error = %e, "cannot apply the transfer history's retention"),
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(3600)) => {}
            _ = stop.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    //! What a client may put into the history and who reads it back.
    use super::*;
    use crate::auth::Identities;
    use crate::state::Settings;
    use wire::error::ErrorKind;

    async fn meta() -> Meta {
        let catalog = catalog::Catalog::open("sqlite::memory:").await.unwrap();
        let ids = Identities {
            mapfile: Default::default(),
            groups: Default::default(),
            admins: vec![],
            nodes: Default::default(),
        };
        Meta::new(catalog, ids, Settings::default())
    }

    fn user(name: &str, admin: bool) -> User {
        User {
            name: name.into(),
            groups: vec![name.into()],
            admin,
            cert: None,
        }
    }

    fn upload(files: u64) -> pb::Transfer {
        pb::Transfer {
            kind: "upload".into(),
            user: "somebody-else".into(),
            source: "/local/x".into(),
            destination: "haul://m/x".into(),
            src_site: "forged".into(),
            started_ms: 1_000,
            ended_ms: 61_000,
            files,
            bytes: 42,
            error_kind: "no-such-kind".into(),
            ..Default::default()
        }
    }

    fn file(i: usize) -> pb::TransferFile {
        pb::TransferFile {
            path: format!("/x/{i}"),
            bytes: 1,
            ..Default::default()
        }
    }

    fn new_record(t: pb::Transfer, files: Vec<pb::TransferFile>) -> pb::RecordTransferRequest {
        pb::RecordTransferRequest {
            transfer: Some(t),
            files,
            id: 0,
            live_ids: vec![],
        }
    }

    #[tokio::test]
    async fn a_clients_record_is_stamped_by_the_server() {
        let m = meta().await;
        let ann = user("ann", false);
        let before = catalog::now_ms();
        let id = m
            .record_client_transfer(&ann, &new_record(upload(2), vec![file(0)]))
            .await
            .unwrap()
            .id;
        let got = m
            .get_transfer(
                &ann,
                &pb::TransferRequest {
                    id,
                    offset: 0,
                    limit: 0,
                },
            )
            .await
            .unwrap();
        let t = got.transfer.unwrap();
        // The certificate's user, the server's clock (keeping the duration), no forged site,
        // an unknown error kind read as io with its exit code.
        assert_eq!(t.user, "ann");
        assert!(t.ended_ms >= before, "{t:?}");
        assert_eq!(t.ended_ms - t.started_ms, 60_000);
        assert_eq!((t.src_site.as_str(), t.dst_site.as_str()), ("client", ""));
        assert_eq!(t.error_kind, "io");
        assert_eq!(t.exit_code, transfer::error::exit_code_of(ErrorKind::Io));
        assert_eq!(got.files.len(), 1);
        // More files up to the number stated, and no more.
        m.record_client_transfer(
            &ann,
            &pb::RecordTransferRequest {
                transfer: None,
                files: vec![file(1)],
                id,
                live_ids: vec![],
            },
        )
        .await
        .unwrap();
        let e = m
            .record_client_transfer(
                &ann,
                &pb::RecordTransferRequest {
                    transfer: None,
                    files: vec![file(2)],
                    id,
                    live_ids: vec![],
                },
            )
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Invalid, "{e}");
        // Nobody else adds to it, and an unknown id reads the same.
        let bob = user("bob", false);
        for target in [id, id + 99] {
            let e = m
                .record_client_transfer(
                    &bob,
                    &pb::RecordTransferRequest {
                        transfer: None,
                        files: vec![],
                        id: target,
                        live_ids: vec![],
                    },
                )
                .await
                .unwrap_err();
            assert_eq!(e.kind, ErrorKind::NotFound, "{e}");
        }
    }

    #[tokio::test]
    async fn clients_cannot_forge_server_kinds_or_flood_a_message() {
        let m = meta().await;
        let ann = user("ann", false);
        for kind in ["replicate", "repair", "reconcile", "", "UPLOAD"] {
            let mut t = upload(1);
            t.kind = kind.into();
            let e = m
                .record_client_transfer(&ann, &new_record(t, vec![]))
                .await
                .unwrap_err();
            assert_eq!(e.kind, ErrorKind::Invalid, "{kind}: {e}");
        }
        let many: Vec<_> = (0..MAX_FILES_PER_MESSAGE + 1).map(file).collect();
        let e = m
            .record_client_transfer(&ann, &new_record(upload(1 << 20), many))
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Invalid);
        // More files than the record says it has, or a record without a summary.
        let e = m
            .record_client_transfer(&ann, &new_record(upload(1), vec![file(0), file(1)]))
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Invalid);
        let e = m
            .record_client_transfer(
                &ann,
                &pb::RecordTransferRequest {
                    transfer: None,
                    files: vec![],
                    id: 0,
                    live_ids: vec![],
                },
            )
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Invalid);
        // Oversized fields are cut, not stored whole.
        let mut t = upload(1);
        t.error = "e".repeat(1 << 20);
        t.summary = "é".repeat(1 << 20);
        let id = m
            .record_client_transfer(&ann, &new_record(t, vec![]))
            .await
            .unwrap()
            .id;
        let (rec, _) = m.catalog.transfer(id, 0, 0).await.unwrap();
        assert_eq!(rec.error.len(), 2048);
        assert!(rec.summary.len() <= 8192 && rec.summary.len() >= 8190);
        assert_eq!(m.catalog.count_transfers().await.unwrap(), 1);
    }

    #[tokio::test]
    async fn users_see_their_own_and_administrators_everybodys() {
        let m = meta().await;
        let (ann, bob, root) = (user("ann", false), user("bob", false), user("root", true));
        let a = m
            .record_client_transfer(&ann, &new_record(upload(0), vec![]))
            .await
            .unwrap()
            .id;
        m.record_client_transfer(&bob, &new_record(upload(0), vec![]))
            .await
            .unwrap();
        let list = |u: &User, who: &str| {
            let q = pb::TransfersRequest {
                user: who.into(),
                ..Default::default()
            };
            let u = u.clone();
            let m = &m;
            async move {
                m.list_transfers(&u, &q).await.map(|r| {
                    r.transfers
                        .iter()
                        .map(|t| t.user.clone())
                        .collect::<Vec<_>>()
                })
            }
        };
        assert_eq!(list(&ann, "").await.unwrap(), vec!["ann"]);
        assert_eq!(list(&ann, "ann").await.unwrap(), vec!["ann"]);
        assert_eq!(
            list(&ann, "bob").await.unwrap_err().kind,
            ErrorKind::PermissionDenied
        );
        assert_eq!(list(&root, "").await.unwrap(), vec!["bob", "ann"]);
        assert_eq!(list(&root, "ann").await.unwrap(), vec!["ann"]);
        let get = |u: &User| {
            let u = u.clone();
            let m = &m;
            async move {
                m.get_transfer(
                    &u,
                    &pb::TransferRequest {
                        id: a,
                        offset: 0,
                        limit: 0,
                    },
                )
                .await
            }
        };
        assert!(get(&ann).await.is_ok());
        assert!(get(&root).await.is_ok());
        assert_eq!(get(&bob).await.unwrap_err().kind, ErrorKind::NotFound);
    }

    #[tokio::test]
    async fn live_reports_are_the_callers_own_and_bounded() {
        let m = meta().await;
        let (ann, bob, root) = (user("ann", false), user("bob", false), user("root", true));
        let report = |id: i64, kind: &str| pb::LiveReport {
            id,
            kind: kind.into(),
            source: "/local/x".into(),
            destination: "haul://m/x".into(),
            files_total: 1,
            bytes_total: 100,
            bytes_done: 10,
            streams: 4,
            ..Default::default()
        };
        // The server's own kinds are not a client's.
        let e = m.report_live(&ann, &report(0, "replicate")).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Invalid);
        let id = m.report_live(&ann, &report(0, "upload")).unwrap().id;
        assert!(id > 0);
        // Nobody else reports on it, and nobody else sees it but an administrator.
        let e = m.report_live(&bob, &report(id, "upload")).unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotFound);
        assert_eq!(m.live_copies(&ann).copies.len(), 1);
        assert_eq!(m.live_copies(&ann).copies[0].user, "ann");
        assert!(m.live_copies(&bob).copies.is_empty());
        assert_eq!(m.live_copies(&root).copies.len(), 1);
        // Ended: off the list.
        let mut end = report(id, "upload");
        end.ended = true;
        m.report_live(&ann, &end).unwrap();
        assert!(m.live_copies(&root).copies.is_empty());
        // One user's copies are bounded.
        for _ in 0..CLIENT_COPIES_PER_USER {
            m.report_live(&bob, &report(0, "download")).unwrap();
        }
        let e = m.report_live(&bob, &report(0, "download")).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Busy);
        // A copy that fell silent is recorded as abandoned, with what its client last said.
        let later = Instant::now() + crate::runs::CLIENT_SILENCE;
        let gone = m.live_clients.expire(later);
        assert_eq!(gone.len(), CLIENT_COPIES_PER_USER);
        let (live_id, silent) = gone[0].clone();
        m.record_abandoned(live_id, silent, later, catalog::now_ms())
            .await;
        let list = m
            .list_transfers(&bob, &pb::TransfersRequest::default())
            .await
            .unwrap()
            .transfers;
        assert_eq!(list.len(), 1);
        let t = &list[0];
        assert_eq!((t.kind.as_str(), t.user.as_str()), ("download", "bob"));
        assert_eq!(t.error_kind, "cancelled");
        assert!(
            t.error.contains("abandoned") && t.error.contains("10 of 100 bytes"),
            "{}",
            t.error
        );
        assert_eq!((t.files, t.files_failed, t.bytes), (1, 1, 10));
        // The client cannot add files to the server's record of it.
        let more = pb::RecordTransferRequest {
            transfer: None,
            files: vec![file(0)],
            id: t.id,
            live_ids: vec![],
        };
        let e = m.record_client_transfer(&bob, &more).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotFound);
        // Its client's own record, naming the live id, replaces the abandoned one (another
        // user's naming it does not).
        let mut own = new_record(upload(1), vec![file(0)]);
        own.live_ids = vec![live_id as i64];
        m.record_client_transfer(&ann, &own).await.unwrap();
        assert_eq!(m.catalog.count_transfers().await.unwrap(), 2);
        m.record_client_transfer(&bob, &own).await.unwrap();
        let list = m
            .list_transfers(&bob, &pb::TransfersRequest::default())
            .await
            .unwrap()
            .transfers;
        assert_eq!(list.len(), 1, "{list:?}");
        assert_eq!(list[0].kind, "upload", "{list:?}");
        assert_ne!(list[0].error_kind, "cancelled", "{list:?}");
        assert_eq!(m.catalog.count_transfers().await.unwrap(), 2);
    }

    #[test]
    fn a_trace_is_kept_only_when_it_is_a_bounded_series() {
        assert_eq!(checked_trace("0.01:1500 0.02:1600"), "0.01:1500 0.02:1600");
        assert_eq!(checked_trace(""), "");
        // Times going back, negative or non-finite rates, garbage, too many points or bytes.
        for bad in [
            "0.02:1 0.01:1".to_string(),
            "0.01:-5".into(),
            "0.01:NaN".into(),
            "0.01:inf".into(),
            "<script>".into(),
            (1..=MAX_TRACE_POINTS + 1)
                .map(|i| format!("{i}:1"))
                .collect::<Vec<_>>()
                .join(" "),
            format!("0.01:{}", "9".repeat(40 << 10)),
        ] {
            assert_eq!(checked_trace(&bad), "", "{}", &bad[..bad.len().min(40)]);
        }
    }
}
