//! `haul replicate`, `haul policy`, `haul verify` and `haul status`: replica management,
//! done by the metadata server and the nodes; this side shows progress and the outcome.

use crate::args::{GridArgs, PolicyCommand, ProtectArg, ReplicateArgs, VerifyArgs};
use crate::grid_cmd::{connect, meta_of, one_line, paths_on_one_meta, shown, target};
use crate::progress::{self, Progress};
use grid::types as pb;
use serde_json::json;
use std::sync::Arc;
use transfer::TransferError;
use transfer::progress::Counters;
use wire::units::count;

/// The exit code for per-file failures: the first one's kind's (4 when a file has no healthy
/// replica or its copies failed, 5 for permissions, 6 when no eligible node or site can take a
/// copy, ...).
fn failure_code(f: &[pb::FileError]) -> u8 {
    match f.first() {
        None => 0,
        Some(e) => grid::client::from_file_error(e).exit_code().clamp(1, 255) as u8,
    }
}

/// A per-file error as `--json` lists it: what failed (`key`), its kind, exit code and reason.
fn failure_json(key: &str, f: &pb::FileError) -> serde_json::Value {
    let e = grid::client::from_file_error(f);
    json!({key: f.path, "kind": e.kind().name(), "exit_code": e.exit_code(), "reason": f.message})
}

pub async fn replicate(a: ReplicateArgs) -> Result<u8, TransferError> {
    let (peer, paths) = paths_on_one_meta(&a.p.paths)?;
    let m = connect(&peer, &a.p.creds).await?;
    let counters = Arc::new(Counters::default());
    let (_etx, erx) = tokio::sync::mpsc::unbounded_channel();
    let bar = Progress::start(progress::display(&a.progress), counters.clone(), erx, None);
    let mut stream = m
        .replicate(pb::ReplicateRequest {
            paths,
            copies: a.copies,
            sites: a.sites.clone(),
            recursive: a.recursive,
            private: a.protect == ProtectArg::Private,
        })
        .await?;
    let mut last = None;
    let interrupted = loop {
        tokio::select! {
            msg = stream.next() => match msg? {
                Some(p) => {
                    Counters::set(&counters.total_bytes, p.bytes_needed);
                    Counters::set(&counters.bytes_done, p.bytes_done);
                    Counters::set(&counters.total_files, p.copies_needed);
                    Counters::set(&counters.files_done, p.copies_made);
                    let finished = p.finished;
                    last = Some(p);
                    if finished {
                        break false;
                    }
                }
                None => break false,
            },
            _ = tokio::signal::ctrl_c() => break true,
        }
    };
    bar.finish().await;
    if interrupted {
        return Err(TransferError::interrupted());
    }
    // A stream that ends before its last message (the server stopped) is no success.
    let p = last.filter(|p| p.finished).ok_or_else(|| {
        TransferError::connect(
            "the metadata server stopped before the replication finished; run it again when the server is back (it finishes what is missing)",
        )
    })?;
    for f in &p.failures {
        eprintln!("haul: {}", one_line(&f.message));
    }
    if a.p.json {
        crate::jsondoc::print(json!({
            "files": p.files, "copies_needed": p.copies_needed, "copies_made": p.copies_made,
            "already": p.already, "bytes": p.bytes_done, "seconds": p.seconds,
            "mbit_per_s": p.bytes_done as f64 * 8.0 / p.seconds.max(1e-9) / 1e6,
            "failures": p.failures.iter().map(|f| failure_json("path", f)).collect::<Vec<_>>(),
            "nodes": p.nodes.iter().map(|n| json!({"node": n.node, "bytes_sent": n.bytes_sent, "bytes_received": n.bytes_received})).collect::<Vec<_>>(),
        }));
    } else {
        eprintln!(
            "{}: {} made ({}), {} already as asked, {} failed, {:.1} s, {}",
            count(p.files, "file", "files"),
            count(p.copies_made, "copy", "copies"),
            wire::units::format_bytes(p.bytes_done),
            p.already,
            p.failures.len(),
            p.seconds,
            wire::units::format_rate(p.bytes_done as f64 * 8.0 / p.seconds.max(1e-9))
        );
    }
    Ok(failure_code(&p.failures))
}

fn policy_json(p: &pb::Policy) -> serde_json::Value {
    json!({
        "path": p.path, "copies": p.copies, "sites": p.sites,
        "protect": if p.private { "private" } else { "clear" },
    })
}

/// `copies=2 sites=A,B protect=private`
fn policy_text(p: &pb::Policy) -> String {
    let mut s = format!("copies={}", p.copies);
    if !p.sites.is_empty() {
        s += &format!(" sites={}", p.sites.join(","));
    }
    if p.private {
        s += " protect=private";
    }
    s
}

pub async fn policy(c: PolicyCommand) -> Result<u8, TransferError> {
    let (creds, peer, req, json_out) = match &c {
        PolicyCommand::Set(a) => {
            let (peer, path) = target(&a.path)?;
            (
                a.creds.clone(),
                peer,
                Some(pb::PolicyRequest {
                    path,
                    copies: a.copies,
                    sites: a.sites.clone(),
                    clear: false,
                    private: a.protect == ProtectArg::Private,
                }),
                false,
            )
        }
        PolicyCommand::Clear(a) => {
            let (peer, path) = target(
                a.paths
                    .first()
                    .ok_or_else(|| TransferError::usage("no path"))?,
            )?;
            (
                a.creds.clone(),
                peer,
                Some(pb::PolicyRequest {
                    path,
                    clear: true,
                    ..Default::default()
                }),
                a.json,
            )
        }
        PolicyCommand::List(a) => (a.creds.clone(), meta_of(a)?, None, a.json),
    };
    let m = connect(&peer, &creds).await?;
    let reply = match req {
        Some(r) => m.set_policy(r).await?,
        None => m.policies("/").await?,
    };
    if json_out {
        crate::jsondoc::print_list("policies", reply.policies.iter().map(policy_json).collect());
    } else if matches!(c, PolicyCommand::List(_)) {
        for p in &reply.policies {
            out!("{}  {}", shown(&p.path), policy_text(p));
        }
    }
    Ok(0)
}

pub async fn verify(a: VerifyArgs) -> Result<u8, TransferError> {
    let (peer, paths) = paths_on_one_meta(&a.p.paths)?;
    let m = connect(&peer, &a.p.creds).await?;
    let stream = m
        .verify(pb::VerifyRequest {
            paths,
            recursive: a.recursive,
            repair: !a.no_repair,
        })
        .await?;
    let p = stream.until_finished(|p| p.finished).await?.ok_or_else(|| {
        TransferError::connect(
            "the metadata server stopped before the verification finished; run it again when the server is back",
        )
    })?;
    if a.p.json {
        crate::jsondoc::print(json!({
            "files": p.files, "replicas": p.replicas, "checked": p.checked,
            "bytes_checked": p.bytes_checked, "repaired": p.repaired, "seconds": p.seconds,
            "damaged": p.damaged.iter().map(|d| json!({"path": d.path, "state": d.code, "reason": d.message})).collect::<Vec<_>>(),
            "failures": p.failures.iter().map(|f| failure_json("what", f)).collect::<Vec<_>>(),
        }));
    } else {
        for d in &p.damaged {
            eprintln!("haul: {}", one_line(&d.message));
        }
        for f in &p.failures {
            eprintln!("haul: {}", one_line(&f.message));
        }
        eprintln!(
            "{}, {} of {} checked ({}), {} bad, {} repaired, {:.1} s",
            count(p.files, "file", "files"),
            p.checked,
            count(p.replicas, "replica", "replicas"),
            wire::units::format_bytes(p.bytes_checked),
            p.damaged.len(),
            p.repaired,
            p.seconds
        );
    }
    // Damage found and not (all) repaired is worth a non-zero exit.
    if !p.failures.is_empty() {
        return Ok(4);
    }
    if !p.damaged.is_empty() && (a.no_repair || (p.repaired as usize) < p.damaged.len()) {
        return Ok(7);
    }
    Ok(0)
}

/// An event line of the metadata server (`TIME MESSAGE`, the time in RFC 3339) as
/// `{"time", "message"}`; a line without a time keeps it all as the message.
fn event_json(line: &str) -> serde_json::Value {
    match line.split_once(' ') {
        Some((t, m))
            if time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339)
                .is_ok() =>
        {
            json!({ "time": t, "message": m })
        }
        _ => json!({ "time": null, "message": line }),
    }
}

pub async fn status(a: GridArgs) -> Result<u8, TransferError> {
    let m = connect(&meta_of(&a)?, &a.creds).await?;
    let st = m.status().await?;
    if a.json {
        crate::jsondoc::print(json!({
            "policies": st.policies.iter().map(policy_json).collect::<Vec<_>>(),
            "under_replicated": st.under_replicated, "over_replicated": st.over_replicated,
            "repairs_running": st.repairs_running, "repairs_done": st.repairs_done,
            "removals_done": st.removals_done, "nodes_up": st.nodes_up, "nodes_down": st.nodes_down,
            "last_pass_ms": st.last_pass_ms, "last_pass_seconds": st.last_pass_seconds,
            "moving": st.moving,
            "draining": st.draining.iter().map(crate::grid_cmd::node_json).collect::<Vec<_>>(),
            "last_pass": (st.last_pass_ms > 0).then(|| crate::grid_cmd::rfc3339_ms(st.last_pass_ms)),
            "events": st.events.iter().map(|e| event_json(e)).collect::<Vec<_>>(),
        }));
        return Ok(0);
    }
    out!("nodes: {} up, {} down", st.nodes_up, st.nodes_down);
    out!("policies:");
    for p in &st.policies {
        out!("  {}  {}", shown(&p.path), policy_text(p));
    }
    out!(
        "reconciler: {} missing copies, {}, {} being made; {} made and {} removed so far; last pass {:.1} s",
        count(st.under_replicated, "file", "files"),
        count(st.over_replicated, "surplus copy", "surplus copies"),
        count(st.repairs_running, "copy", "copies"),
        st.repairs_done,
        st.removals_done,
        st.last_pass_seconds
    );
    for n in &st.draining {
        let moved = n.drain_replicas.saturating_sub(n.replicas);
        out!(
            "node {} ({}): {}; {} of {} moved off, {} left",
            n.name,
            n.site,
            crate::grid_cmd::node_state(n),
            moved,
            count(n.drain_replicas, "replica", "replicas"),
            n.replicas
        );
    }
    if st.moving > 0 {
        out!(
            "draining: {} being copied off (their policies hold)",
            count(st.moving, "file", "files")
        );
    }
    out!("recent events:");
    for e in &st.events {
        out!("  {}", one_line(e));
    }
    Ok(0)
}
