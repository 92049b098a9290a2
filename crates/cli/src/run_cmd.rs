//! `haul run`: file-affinity computing. The grid client schedules the tasks (`grid::run`);
//! this side prints each task's output as it ends and the summary.

use crate::args::RunArgs;
use crate::grid_cmd::{connect, target};
use std::io::Write;
use transfer::TransferError;
use transfer::conn::ClientTls;

pub async fn run(a: RunArgs) -> Result<u8, TransferError> {
    let (peer, paths) = crate::grid_cmd::paths_on_one_meta(&a.paths)?;
    let output = match &a.output {
        Some(o) => Some(target(o)?.1),
        None => None,
    };
    let meta = connect(&peer, &a.creds).await?;
    let creds = crate::creds::load_tls(&a.creds)?;
    let opts = grid::run::RunOptions {
        argv: a.command.clone(),
        output,
        parallel: a.parallel,
        timeout_s: a.timeout.map(|d| d.as_secs().max(1) as u32).unwrap_or(0),
        site: a.site.clone(),
        tls: Some(ClientTls {
            config: transfer::tls::client_config(&creds)?,
        }),
    };
    let (json, quiet) = (a.json, a.quiet);
    let show = move |t: &grid::run::TaskReport| {
        if json {
            return;
        }
        if !quiet {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(t.stdout.as_bytes());
            let _ = out.flush();
            let mut err = std::io::stderr().lock();
            let _ = err.write_all(t.stderr.as_bytes());
        }
        if !t.succeeded() {
            let how = match (&t.error, t.exit, t.signal) {
                (Some(e), _, _) => e.clone(),
                (None, Some(c), _) => format!("exit {c}"),
                (None, None, Some(s)) => format!("killed by signal {s}"),
                _ => "failed".into(),
            };
            let on = if t.node.is_empty() {
                String::new()
            } else {
                format!(" on {}", t.node)
            };
            eprintln!("haul run: {}{on}: {how}", t.path);
        }
    };
    let summary = grid::run::run(&meta, &paths, &opts, &show).await?;
    if json {
        crate::jsondoc::print_report(&summary);
    }
    let outputs: usize = summary.tasks.iter().map(|t| t.outputs.len()).sum();
    eprintln!(
        "haul run: {} tasks on {} nodes ({} slots): {} succeeded, {} failed; {:.2} s; {:.1} ms per task on the node, {:.2} ms scheduling overhead per task{}",
        summary.tasks.len(),
        summary.nodes.iter().filter(|n| n.tasks > 0).count(),
        summary.slots,
        summary.succeeded,
        summary.failed,
        summary.seconds,
        summary.mean_task_ms,
        summary.overhead_ms_per_task,
        if outputs > 0 {
            format!("; {outputs} output files registered")
        } else {
            String::new()
        }
    );
    for n in &summary.nodes {
        if let Some(e) = &n.error {
            eprintln!("haul run: node {}: {e}", n.node);
        }
    }
    Ok(if summary.failed > 0 { 1 } else { 0 })
}
