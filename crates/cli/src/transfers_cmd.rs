//! `haul transfers`: the grid's transfer history (uploads, downloads, copies within the grid,
//! replication, repair, runs), newest first, one transfer with each file's outcome, or the
//! copies in progress (`--live`).

use crate::args::TransfersArgs;
use crate::grid_cmd::connect;
use grid::types as pb;
use serde_json::{Value, json};
use transfer::TransferError;

use crate::grid_cmd::rfc3339_ms;

/// `--since`: a duration back from now (`1h`, `7d`) or an RFC 3339 time.
fn since_ms(s: &str) -> Result<i64, TransferError> {
    crate::grid_cmd::time_arg(s, false, "--since", "30m, 1h, 7d")
}

fn seconds(t: &pb::Transfer) -> f64 {
    (t.ended_ms - t.started_ms).max(0) as f64 / 1000.0
}

fn rate_bps(t: &pb::Transfer) -> f64 {
    t.bytes as f64 * 8.0 / seconds(t).max(0.001)
}

fn transfer_json(t: &pb::Transfer) -> Value {
    json!({
        "id": t.id,
        "kind": t.kind,
        "user": t.user,
        "source": t.source,
        "destination": t.destination,
        "src_site": t.src_site,
        "dst_site": t.dst_site,
        "started": rfc3339_ms(t.started_ms),
        "ended": rfc3339_ms(t.ended_ms),
        "seconds": seconds(t),
        "files": t.files,
        "files_failed": t.files_failed,
        "bytes": t.bytes,
        "bytes_moved": t.bytes_moved,
        "bits_per_second": rate_bps(t),
        "streams": t.streams,
        "retransmits": t.retransmits,
        "attempts": t.attempts,
        "error": (!t.error_kind.is_empty()).then(|| json!({
            "kind": t.error_kind,
            "exit_code": t.exit_code,
            "message": t.error,
        })),
        "summary": t.summary,
    })
}

fn file_json(f: &pb::TransferFile) -> Value {
    json!({
        "path": f.path,
        "node": f.node,
        "bytes": f.bytes,
        "checksums": f.checksum.split_whitespace().filter_map(|p| p.split_once(':'))
            .map(|(a, h)| (a.to_string(), Value::String(h.to_string())))
            .collect::<serde_json::Map<_, _>>(),
        "error": (!f.error_kind.is_empty()).then(|| json!({
            "kind": f.error_kind,
            "exit_code": wire::error::ErrorKind::from_name(&f.error_kind)
                .map(transfer::error::exit_code_of),
            "message": f.error,
        })),
    })
}

fn outcome(t: &pb::Transfer) -> String {
    if t.error_kind.is_empty() && t.files_failed == 0 {
        "ok".into()
    } else if t.files_failed > 0 && t.files_failed < t.files {
        format!("PARTIAL {}", t.error_kind)
    } else {
        format!("FAILED {}", t.error_kind)
    }
}

fn or_dash(s: &str) -> &str {
    if s.is_empty() { "-" } else { s }
}

pub async fn transfers(a: TransfersArgs) -> Result<u8, TransferError> {
    let m = connect(&crate::grid_cmd::meta_named(a.meta.as_deref())?, &a.creds).await?;
    if let Some(id) = a.id {
        return show(&m, id, &a).await;
    }
    if a.live {
        return live(&m, a.json).await;
    }
    let since = a.since.as_deref().map(since_ms).transpose()?;
    let list = m
        .transfers(pb::TransfersRequest {
            user: a.user.clone().unwrap_or_default(),
            site: a.site.clone().unwrap_or_default(),
            kind: a.kind.clone().unwrap_or_default(),
            since_ms: since.unwrap_or(0),
            failed: a.failed,
            before_id: a.before.unwrap_or(0),
            limit: a.limit,
        })
        .await?;
    if a.json {
        crate::jsondoc::print(json!({
            "transfers": list.iter().map(transfer_json).collect::<Vec<_>>(),
        }));
        return Ok(0);
    }
    if list.is_empty() {
        eprintln!("no transfers recorded that match");
        return Ok(0);
    }
    out!(
        "{:>6}  {:<20}  {:<10} {:<9} {:>7} {:>10} {:>13}  {:<17} {:<18} what",
        "id",
        "ended",
        "user",
        "kind",
        "files",
        "size",
        "rate",
        "sites",
        "result"
    );
    for t in &list {
        let files = if t.files_failed > 0 {
            format!("{}/{}", t.files - t.files_failed.min(t.files), t.files)
        } else {
            t.files.to_string()
        };
        out!(
            "{:>6}  {:<20}  {:<10} {:<9} {:>7} {:>10} {:>13}  {:<17} {:<18} {} -> {}",
            t.id,
            rfc3339_ms(t.ended_ms),
            t.user,
            t.kind,
            files,
            wire::units::format_bytes(t.bytes),
            wire::units::format_rate(rate_bps(t)),
            format!("{} -> {}", or_dash(&t.src_site), or_dash(&t.dst_site)),
            outcome(t),
            crate::grid_cmd::shown(&t.source),
            crate::grid_cmd::shown(&t.destination)
        );
    }
    if list.len() as u32 == a.limit {
        let last = list.last().map(|t| t.id).unwrap_or(0);
        eprintln!("(the newest {}; older ones: --before {last})", a.limit);
    }
    Ok(0)
}

/// Seconds left at `rate` (bytes/s), if it can be told.
fn eta_s(c: &pb::LiveCopy) -> Option<f64> {
    (c.rate_bps > 0.0 && c.bytes_total > c.bytes_done)
        .then(|| (c.bytes_total - c.bytes_done) as f64 / c.rate_bps)
}

fn live_json(c: &pb::LiveCopy) -> Value {
    json!({
        "user": c.user,
        "kind": c.kind,
        "source": c.source,
        "destination": c.destination,
        "started": rfc3339_ms(c.started_ms),
        "updated": rfc3339_ms(c.updated_ms),
        "files": c.files_total,
        "files_done": c.files_done,
        "files_failed": c.files_failed,
        "bytes": c.bytes_total,
        "bytes_done": c.bytes_done,
        "bits_per_second": c.rate_bps * 8.0,
        "eta_seconds": eta_s(c),
        "streams": c.streams,
    })
}

/// `--live`: the copies in progress the caller may see.
async fn live(m: &grid::MetaClient, json_out: bool) -> Result<u8, TransferError> {
    let copies = m.live().await?;
    if json_out {
        crate::jsondoc::print(json!({
            "live": copies.iter().map(live_json).collect::<Vec<_>>(),
        }));
        return Ok(0);
    }
    if copies.is_empty() {
        eprintln!("no copies in progress");
        return Ok(0);
    }
    out!(
        "{:<20}  {:<10} {:<9} {:>11} {:>23} {:>13} {:>8} {:>7}  what",
        "started",
        "user",
        "kind",
        "files",
        "progress",
        "rate",
        "ETA",
        "streams"
    );
    for c in &copies {
        let pct = 100.0 * c.bytes_done as f64 / c.bytes_total.max(1) as f64;
        out!(
            "{:<20}  {:<10} {:<9} {:>11} {:>23} {:>13} {:>8} {:>7}  {}",
            rfc3339_ms(c.started_ms),
            c.user,
            c.kind,
            format!("{}/{}", c.files_done, c.files_total),
            format!("{} ({pct:.0}%)", wire::units::format_bytes(c.bytes_done)),
            wire::units::format_rate(c.rate_bps * 8.0),
            eta_s(c)
                .map(|s| format!("{s:.0} s"))
                .unwrap_or_else(|| "-".into()),
            c.streams,
            if c.source.is_empty() && c.destination.is_empty() {
                "node to node".to_string()
            } else {
                format!(
                    "{} -> {}",
                    crate::grid_cmd::shown(&c.source),
                    crate::grid_cmd::shown(&c.destination)
                )
            }
        );
    }
    Ok(0)
}

/// A record's trace as (seconds, bits per second) points (checked when it was stored).
fn trace_points(trace: &str) -> Vec<(f64, f64)> {
    transfer::trace::summary::parse_throughput_points(trace).unwrap_or_default()
}

async fn show(m: &grid::MetaClient, id: i64, a: &TransfersArgs) -> Result<u8, TransferError> {
    // Every file, in pages.
    let mut files: Vec<pb::TransferFile> = Vec::new();
    let first = m.get_transfer(id, 0, 10_000).await?;
    let t = first
        .transfer
        .ok_or_else(|| TransferError::protocol("the metadata server sent no transfer"))?;
    let mut page = first.files;
    while !page.is_empty() {
        let got = page.len();
        files.append(&mut page);
        if got < 10_000 {
            break;
        }
        page = m.get_transfer(id, files.len() as u64, 10_000).await?.files;
    }
    if a.json {
        let mut doc = transfer_json(&t);
        doc["files_list"] = Value::Array(files.iter().map(file_json).collect());
        // The throughput over time, when the client traced the copy: [[seconds, bits/s]].
        doc["trace"] = Value::Array(
            trace_points(&t.trace)
                .into_iter()
                .map(|(s, b)| json!([s, b]))
                .collect(),
        );
        crate::jsondoc::print(json!({ "transfer": doc }));
        return Ok(0);
    }
    out!(
        "transfer {} ({}) by {}: {}",
        t.id,
        t.kind,
        t.user,
        outcome(&t)
    );
    out!(
        "  from     {} (site {})",
        crate::grid_cmd::shown(&t.source),
        or_dash(&t.src_site)
    );
    out!(
        "  to       {} (site {})",
        crate::grid_cmd::shown(&t.destination),
        or_dash(&t.dst_site)
    );
    out!(
        "  when     {} to {} ({:.1} s)",
        rfc3339_ms(t.started_ms),
        rfc3339_ms(t.ended_ms),
        seconds(&t)
    );
    out!(
        "  moved    {} of {}, {}; {} over the network; {}, {}, {}",
        t.files - t.files_failed.min(t.files),
        wire::units::count(t.files, "file", "files"),
        wire::units::format_bytes(t.bytes),
        wire::units::format_bytes(t.bytes_moved),
        wire::units::count(t.streams as u64, "stream", "streams"),
        wire::units::count(t.attempts as u64, "attempt", "attempts"),
        wire::units::count(t.retransmits, "TCP retransmit", "TCP retransmits")
    );
    if !t.summary.is_empty() {
        out!("  summary  {}", crate::grid_cmd::shown(&t.summary));
    }
    let trace = trace_points(&t.trace);
    if !trace.is_empty() {
        out!(
            "  trace    {} points over {:.1} s, peak {} (plotted on the dashboard's page of this transfer)",
            trace.len(),
            trace.last().map(|p| p.0).unwrap_or(0.0),
            wire::units::format_rate(trace.iter().map(|p| p.1).fold(0.0, f64::max))
        );
    }
    if !t.error_kind.is_empty() {
        out!(
            "  error    {} (exit {}): {}",
            t.error_kind,
            t.exit_code,
            crate::grid_cmd::shown(&t.error)
        );
    }
    for f in &files {
        if f.error_kind.is_empty() {
            out!(
                "  ok      {} {} {} {}",
                crate::grid_cmd::shown(&f.path),
                wire::units::format_bytes(f.bytes),
                f.node,
                f.checksum
            );
        } else {
            out!(
                "  FAILED  {} {}: {}",
                crate::grid_cmd::shown(&f.path),
                f.error_kind,
                crate::grid_cmd::shown(&f.error)
            );
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grid_cmd::now_ms;

    #[test]
    fn times_and_since() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_ms(1_764_271_802_345), "2025-11-27T19:30:02Z");
        assert_eq!(since_ms("2025-11-27T19:30:02Z").unwrap(), 1_764_271_802_000);
        let hour_ago = since_ms("1h").unwrap();
        let now = now_ms();
        assert!((now - 3_600_000 - hour_ago).abs() < 60_000);
        let e = since_ms("yesterday").unwrap_err();
        assert_eq!(e.kind(), wire::error::ErrorKind::Invalid);
        assert!(e.to_string().contains("RFC 3339"), "{e}");
    }
}
