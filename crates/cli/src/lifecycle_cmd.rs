//! `haul node drain` and `haul node remove`: an administrator takes a storage node out of the
//! grid. The metadata server does the work (its reconciler moves the replicas); these commands
//! ask for it, and `drain --wait` follows the node's replica count until it reaches zero.

use crate::args::{NodeDrainArgs, NodeRemoveArgs};
use crate::grid_cmd::{connect, meta_of, node_json};
use grid::types as pb;
use serde_json::json;
use std::io::IsTerminal;
use std::time::{Duration, Instant};
use transfer::TransferError;
use wire::error::ErrorKind;
use wire::units::count;

/// How often `drain --wait` asks for the node's figures.
const POLL: Duration = Duration::from_secs(1);

/// "120 of 500 replicas left (76% moved)"
fn progress(n: &pb::NodeInfo) -> String {
    let moved = n.drain_replicas.saturating_sub(n.replicas);
    let pct = if n.drain_replicas == 0 {
        100.0
    } else {
        moved as f64 * 100.0 / n.drain_replicas as f64
    };
    format!(
        "{} of {} left ({pct:.0}% moved)",
        n.replicas,
        count(n.drain_replicas, "replica", "replicas")
    )
}

pub async fn drain(a: NodeDrainArgs) -> Result<u8, TransferError> {
    let m = connect(&meta_of(&a.grid)?, &a.grid.creds).await?;
    let started = Instant::now();
    let mut n = m.drain_node(&a.node, a.cancel).await?;
    if a.cancel {
        if a.grid.json {
            crate::jsondoc::print(node_json(&n));
        } else {
            out!("node {}: not draining; it takes new files again", n.name);
        }
        return Ok(0);
    }
    if !a.wait {
        if a.grid.json {
            crate::jsondoc::print(node_json(&n));
        } else {
            out!(
                "node {}: draining, {}; `haul status` shows the progress",
                n.name,
                progress(&n)
            );
        }
        return Ok(0);
    }
    // Off a terminal (a log), a line every 10 s; on one, every second.
    let every = if std::io::stderr().is_terminal() {
        POLL
    } else {
        Duration::from_secs(10)
    };
    let mut last_line = Instant::now();
    eprintln!("node {}: draining, {}", n.name, progress(&n));
    loop {
        if n.replicas == 0 {
            break;
        }
        if a.timeout.is_some_and(|t| started.elapsed() >= t) {
            eprintln!(
                "node {}: not drained after {:.0} s ({}); the drain goes on",
                n.name,
                started.elapsed().as_secs_f64(),
                progress(&n)
            );
            if a.grid.json {
                crate::jsondoc::print(node_json(&n));
            }
            return Ok(1);
        }
        tokio::time::sleep(POLL).await;
        n = m
            .nodes()
            .await?
            .into_iter()
            .find(|x| x.name == a.node)
            .ok_or_else(|| {
                TransferError::new(
                    ErrorKind::NotFound,
                    format!("node {} was removed while draining", a.node),
                )
            })?;
        if n.drain_ms == 0 {
            return Err(TransferError::new(
                ErrorKind::Cancelled,
                format!("the drain of node {} was cancelled", a.node),
            ));
        }
        if last_line.elapsed() >= every {
            eprintln!("node {}: {}", n.name, progress(&n));
            last_line = Instant::now();
        }
    }
    if a.grid.json {
        crate::jsondoc::print(node_json(&n));
    } else {
        out!(
            "node {}: drained ({} moved in {:.1} s); stop it, then `haul node remove {}`",
            n.name,
            count(n.drain_replicas, "replica", "replicas"),
            started.elapsed().as_secs_f64(),
            n.name
        );
    }
    Ok(0)
}

pub async fn remove(a: NodeRemoveArgs) -> Result<u8, TransferError> {
    let m = connect(&meta_of(&a.grid)?, &a.grid.creds).await?;
    let r = m.remove_node(&a.node, a.force).await?;
    if a.grid.json {
        crate::jsondoc::print(json!({
            "node": a.node, "removed": true, "replicas_dropped": r.replicas,
            "orphaned": r.orphaned, "orphaned_paths": r.orphaned_paths,
        }));
        return Ok(0);
    }
    if !a.force {
        out!("node {} removed", a.node);
        return Ok(0);
    }
    out!(
        "node {} removed: {} dropped; the reconciler makes the copies policies miss",
        a.node,
        count(r.replicas, "replica record", "replica records")
    );
    if r.orphaned > 0 {
        eprintln!(
            "warning: {} had no other copy and {} lost (still listed, to be uploaded again):",
            count(r.orphaned, "file", "files"),
            if r.orphaned == 1 { "is" } else { "are" }
        );
        for p in &r.orphaned_paths {
            eprintln!("  {p}");
        }
        let named = r.orphaned_paths.len() as u64;
        if r.orphaned > named {
            eprintln!("  ... and {} more", r.orphaned - named);
        }
    }
    Ok(0)
}
