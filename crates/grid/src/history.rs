//! A client's part of the grid's transfer history: after each copy to, from or within the grid
//! and after each run, the client sends the metadata server what happened (summary and
//! per-file outcomes, in messages of at most 2,000 files). Recording is best effort: a copy's
//! outcome never depends on it, and a server that cannot take the record costs one log line.

use crate::client::MetaClient;
use api::meta as pb;
use std::time::{Duration, SystemTime};
use transfer::TransferError;
use transfer::client::CopyReport;

/// Files per message (the server takes up to 5,000; 2,000 keeps a message of long paths
/// under its 16 MiB request limit).
const FILES_PER_MESSAGE: usize = 2_000;
/// Points of a trace's throughput a record carries at most (the server keeps up to 600).
pub const TRACE_POINTS: usize = 600;
/// How long the client waits for the server to take a record.
const RECORD_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) fn ms(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn failure(path: &str, kind: &str, message: &str) -> pb::TransferFile {
    pb::TransferFile {
        path: path.to_string(),
        error_kind: kind.to_string(),
        error: message.to_string(),
        ..Default::default()
    }
}

/// The record of a copy (`kind` upload, download or copy) that started at `started`.
pub fn copy_record(
    kind: &str,
    source: &str,
    destination: &str,
    started: SystemTime,
    result: &Result<CopyReport, TransferError>,
) -> (pb::Transfer, Vec<pb::TransferFile>) {
    let mut t = pb::Transfer {
        kind: kind.to_string(),
        source: source.to_string(),
        destination: destination.to_string(),
        started_ms: ms(started),
        ended_ms: ms(SystemTime::now()),
        attempts: 1,
        ..Default::default()
    };
    let mut files = Vec::new();
    match result {
        Ok(r) => {
            t.files = r.files;
            t.files_failed = r.files_failed;
            t.bytes = r.file_list.iter().map(|f| f.bytes).sum();
            t.bytes_moved = r.bytes_moved_total;
            t.streams = r.streams;
            t.retransmits = r.tcp_retransmits;
            t.attempts = r.attempts;
            t.summary = format!(
                "{:.1} Mbit/s over {:.1} s; plan: {}{}",
                r.mbit_per_s,
                r.seconds,
                r.plan,
                r.bottleneck
                    .as_ref()
                    .map(|b| format!("; bottleneck: {}", b.reason))
                    .unwrap_or_default()
            );
            if let Some(e) = &r.first_failure {
                t.error_kind = e.kind.name().to_string();
                t.error = e.message.clone();
            }
            for f in &r.file_list {
                files.push(pb::TransferFile {
                    path: f.path.clone(),
                    node: f.node.clone().unwrap_or_default(),
                    bytes: f.bytes,
                    checksum: f
                        .checksums
                        .iter()
                        .map(|(a, h)| format!("{a}:{h}"))
                        .collect::<Vec<_>>()
                        .join(" "),
                    ..Default::default()
                });
            }
            for f in &r.failures {
                files.push(failure(&f.path, f.error.kind, &f.error.message));
            }
        }
        Err(e) => {
            let info = e.to_info();
            t.error_kind = info.kind.name().to_string();
            t.error = info.message.clone();
            t.files_failed = 1;
            t.files = 1;
            files.push(failure(source, info.kind.name(), &info.message));
        }
    }
    (t, files)
}

/// Sends a record (of a copy listed live under `live_ids`); returns its id, or `None`
/// (logged) when the server did not take it.
pub async fn send(
    meta: &MetaClient,
    t: pb::Transfer,
    files: Vec<pb::TransferFile>,
    live_ids: Vec<i64>,
) -> Option<i64> {
    let work = async {
        let mut chunks = files.chunks(FILES_PER_MESSAGE);
        let first = chunks.next().map(|c| c.to_vec()).unwrap_or_default();
        let id = meta
            .record_transfer(pb::RecordTransferRequest {
                transfer: Some(t),
                files: first,
                id: 0,
                live_ids,
            })
            .await?;
        for c in chunks {
            meta.record_transfer(pb::RecordTransferRequest {
                transfer: None,
                files: c.to_vec(),
                id,
                live_ids: vec![],
            })
            .await?;
        }
        Ok::<_, TransferError>(id)
    };
    match tokio::time::timeout(RECORD_TIMEOUT, work).await {
        Ok(Ok(id)) => Some(id),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "the metadata server did not record this transfer in its history");
            None
        }
        Err(_) => {
            tracing::warn!(
                "the metadata server did not record this transfer in its history within 10 s"
            );
            None
        }
    }
}
