//! Transfer history on the metadata server: records of clients' transfers (checked, stamped
//! with the caller's identity and the server's clock), records of the server's own copies
//! (replication, repair, drain), who may read which, and retention.
//!
//! A client's record states what the client saw (bytes, files, failures); the server trusts
//! it only for the caller's own history: the user is the certificate's, the times are the
//! server's, the sites are those of registered nodes, and the sizes of every field are bounded.

use crate::auth::User;
use crate::error::Error;
use crate::state::{Meta, Retention};
use api::meta as pb;
use catalog::{TransferFile, TransferFilter, TransferRecord};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

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

/// Kinds a client may record; the server's own are replicate, repair, reconcile and drain.
const CLIENT_KINDS: [&str; 4] = ["upload", "download", "copy", "run"];

/// `s` cut to at most `max` bytes, at a character boundary.
fn bounded(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

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
            if rec.user != user.name || !CLIENT_KINDS.contains(&rec.kind.as_str()) {
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
        };
        let id = self.catalog.record_transfer(&rec, &files).await?;
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
}
