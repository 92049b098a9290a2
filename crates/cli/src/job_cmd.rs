//! `haul submit`, `haul jobs` and `haul job show|cancel|retry|wait`: transfer jobs the
//! metadata server keeps and does node to node (see `meta::jobs` and `meta::jobrun`).

use crate::args::{JobCommand, JobIdArgs, JobsArgs, SubmitArgs};
use crate::grid_cmd::{connect, now_ms, rfc3339_ms, shown, target};
use grid::types as pb;
use serde_json::{Value, json};
use std::time::Duration;
use transfer::TransferError;
use wire::error::ErrorKind;

/// Pairs in one submission at most (the server's bound on a job).
const MAX_PAIRS: usize = 200_000;

/// `--deadline`: a duration from now (`12h`) or an RFC 3339 time.
fn deadline_ms(s: &str) -> Result<i64, TransferError> {
    crate::grid_cmd::time_arg(s, true, "--deadline", "12h, 3d")
}

/// The pairs of a list file: "SOURCE DESTINATION" per line, blank lines and # comments
/// skipped.
fn parse_list(text: &str, name: &str) -> Result<Vec<(String, String)>, TransferError> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut words = line.split_whitespace();
        match (words.next(), words.next(), words.next()) {
            (Some(s), Some(d), None) => out.push((s.to_string(), d.to_string())),
            _ => {
                return Err(TransferError::usage(format!(
                    "{name}:{}: expected \"SOURCE DESTINATION\" (two grid paths)",
                    n + 1
                )));
            }
        }
        if out.len() > MAX_PAIRS {
            return Err(TransferError::usage(format!(
                "{name}: more than {MAX_PAIRS} pairs; split it into several jobs"
            )));
        }
    }
    Ok(out)
}

/// Each pair's two ends: (server, path), the path keeping a trailing `/`.
type Ends = (
    (transfer::client::Peer, String),
    (transfer::client::Peer, String),
);

fn ends_of(pairs: &[(String, String)]) -> Result<Vec<Ends>, TransferError> {
    let keep_slash = |orig: &str, p: String| {
        if orig.ends_with('/') && !p.ends_with('/') {
            format!("{p}/")
        } else {
            p
        }
    };
    pairs
        .iter()
        .map(|(s, d)| {
            let (ms, sp) = target(s)?;
            let (md, dp) = target(d)?;
            Ok(((ms, keep_slash(s, sp)), (md, keep_slash(d, dp))))
        })
        .collect()
}

/// The metadata server of a submission: the one server on one side of every pair (the other
/// side, if it is another server, is a standalone endpoint). With two candidates (every pair
/// between the same two servers) the one that answers as a metadata server.
async fn submission_meta(
    ends: &[Ends],
    creds: &crate::args::CredArgs,
) -> Result<grid::MetaClient, TransferError> {
    let Some(first) = ends.first() else {
        return Err(TransferError::usage(
            "nothing to submit: give SRC DST pairs or -f LIST",
        ));
    };
    let mut candidates = vec![first.0.0.clone()];
    if first.1.0 != first.0.0 {
        candidates.push(first.1.0.clone());
    }
    candidates.retain(|c| ends.iter().all(|((a, _), (b, _))| a == c || b == c));
    if candidates.is_empty() {
        return Err(TransferError::usage(
            "every pair of a job has the same metadata server on one side (haul://META/path)",
        ));
    }
    let mut last = None;
    for c in &candidates {
        match connect(c, creds).await {
            Ok(m) => return Ok(m),
            Err(e) => last = Some(e),
        }
    }
    Err(last.expect("a candidate was tried"))
}

/// The pairs as the server takes them: grid paths on `meta`, `haul://host:port/path` at
/// endpoints; and the grants the job's delegation needs at those endpoints.
fn job_pairs(
    ends: Vec<Ends>,
    meta: &transfer::client::Peer,
) -> Result<(Vec<pb::JobPair>, Vec<transfer::delegation::Grant>), TransferError> {
    use transfer::delegation::{Access, Grant};
    let mut grants: Vec<Grant> = Vec::new();
    let mut add = |g: Grant| {
        if !grants.contains(&g) {
            grants.push(g);
        }
    };
    let mut out = Vec::with_capacity(ends.len());
    for ((sp, s), (dp, d)) in ends {
        let url = |p: &transfer::client::Peer, path: &str| {
            format!(
                "haul://{}/{}",
                transfer::conn::format_addr(&p.host, p.port),
                path.trim_start_matches('/')
            )
        };
        let source = if sp == *meta {
            s
        } else {
            let u = url(&sp, &s);
            add(Grant::to_url(Access::Read, &u).map_err(TransferError::usage)?);
            u
        };
        let destination = if dp == *meta {
            d
        } else {
            let u = url(&dp, &d);
            add(Grant::to_url(Access::Write, &u).map_err(TransferError::usage)?);
            u
        };
        if sp != *meta && dp != *meta {
            return Err(TransferError::usage(format!(
                "{source} -> {destination}: one side of each pair must be the job's metadata server"
            )));
        }
        out.push(pb::JobPair {
            source,
            destination,
        });
    }
    if grants.len() > transfer::delegation::MAX_GRANTS {
        return Err(TransferError::usage(format!(
            "the pairs name more than {} endpoint paths: submit a directory with -r",
            transfer::delegation::MAX_GRANTS
        )));
    }
    Ok((out, grants))
}

pub async fn submit(a: SubmitArgs) -> Result<u8, TransferError> {
    if !a.pairs.len().is_multiple_of(2) {
        return Err(TransferError::usage(
            "give sources and destinations in pairs: haul submit SRC DST [SRC DST ...]",
        ));
    }
    let mut pairs: Vec<(String, String)> = a
        .pairs
        .chunks(2)
        .map(|p| (p[0].clone(), p[1].clone()))
        .collect();
    if let Some(list) = &a.list {
        let name = list.display().to_string();
        let text = if name == "-" {
            std::io::read_to_string(std::io::stdin())
                .map_err(|e| TransferError::usage(format!("stdin: {e}")))?
        } else {
            std::fs::read_to_string(list).map_err(|e| {
                let kind = if e.kind() == std::io::ErrorKind::NotFound {
                    ErrorKind::NotFound
                } else {
                    ErrorKind::Invalid
                };
                TransferError::new(kind, format!("{name}: {e}"))
            })?
        };
        pairs.extend(parse_list(&text, &name)?);
    }
    let ends = ends_of(&pairs)?;
    let deadline = a.deadline.as_deref().map(deadline_ms).transpose()?;
    if deadline.is_some_and(|d| d <= now_ms()) {
        return Err(TransferError::usage("--deadline: that time has passed"));
    }
    let m = submission_meta(&ends, &a.creds).await?;
    let (pairs, grants) = job_pairs(ends, &m.addr)?;
    // Pairs with endpoints: the server acts there as you, with a delegation of exactly those
    // paths that lives until the deadline (at most --delegate-hours).
    let (delegation_chain, delegation_key) = if grants.is_empty() {
        (String::new(), String::new())
    } else {
        let mut life = Duration::from_secs(a.delegate_hours.clamp(1, 720) * 3600);
        if let Some(d) = deadline {
            life = life.min(Duration::from_millis(
                (d - now_ms()).max(60_000) as u64 + 600_000,
            ));
        }
        let scope = transfer::delegation::Scope { grants };
        let d = crate::pki::delegate(&a.creds, &scope, life)?;
        (d.chain_pem, d.key_pem)
    };
    let job = m
        .submit_job(pb::SubmitJobRequest {
            pairs,
            recursive: a.recursive,
            priority: a.priority,
            site: a.site.clone().unwrap_or_default(),
            overwrite: a.overwrite,
            max_tries: a.tries.unwrap_or(0),
            deadline_ms: deadline.unwrap_or(0),
            rate_bps: a.rate.unwrap_or(0),
            webhook: a.webhook.clone().unwrap_or_default(),
            delegation_chain,
            delegation_key,
        })
        .await?;
    if !a.json || !a.wait {
        if a.json {
            crate::jsondoc::print(json!({ "job": job_json(&job) }));
        } else {
            out!(
                "job {} submitted: {} ({}), priority {}{}",
                job.id,
                wire::units::count(job.files, "file", "files"),
                wire::units::format_bytes(job.bytes),
                job.priority,
                if job.files_failed > 0 {
                    format!(
                        "; {} refused (haul job show {} --state failed)",
                        job.files_failed, job.id
                    )
                } else {
                    String::new()
                }
            );
        }
    }
    if !a.wait {
        return Ok(0);
    }
    wait_for(&m, job.id, None, a.json).await
}

fn job_json(j: &pb::JobInfo) -> Value {
    let options: Value = serde_json::from_str(&j.options).unwrap_or(Value::Null);
    json!({
        "id": j.id,
        "user": j.user,
        "state": j.state,
        "priority": j.priority,
        "created": rfc3339_ms(j.created_ms),
        "created_ms": j.created_ms,
        "ended": (j.ended_ms > 0).then(|| rfc3339_ms(j.ended_ms)),
        "ended_ms": (j.ended_ms > 0).then_some(j.ended_ms),
        "files": j.files,
        "files_done": j.files_done,
        "files_failed": j.files_failed,
        "files_running": j.files_running,
        "files_cancelled": j.files_cancelled,
        "files_queued": queued(j),
        "bytes": j.bytes,
        "bytes_done": j.bytes_done,
        "exit_code": j.exit_code,
        "error": j.error,
        "options": options,
    })
}

fn link_json(l: &pb::JobLink) -> Value {
    json!({
        "src_site": l.src_site,
        "dst_site": l.dst_site,
        "sessions": l.sessions,
        "goodput_bps": l.goodput_bps,
        "updated": rfc3339_ms(l.updated_ms),
    })
}

fn queued(j: &pb::JobInfo) -> u64 {
    j.files
        .saturating_sub(j.files_done + j.files_failed)
        .saturating_sub(j.files_running + j.files_cancelled)
}

fn file_json(f: &pb::JobFileInfo) -> Value {
    json!({
        "seq": f.seq,
        "source": f.source,
        "destination": f.destination,
        "size": f.size,
        "state": f.state,
        "tries": f.tries,
        "node": f.node,
        "checksum": f.checksum,
        "next_try": (f.state == "queued" && f.next_ms > now_ms()).then(|| rfc3339_ms(f.next_ms)),
        "updated_ms": f.updated_ms,
        "error": (!f.error_kind.is_empty()).then(|| json!({
            "kind": f.error_kind,
            "exit_code": ErrorKind::from_name(&f.error_kind).map(transfer::error::exit_code_of),
            "message": f.error,
        })),
    })
}

fn progress(j: &pb::JobInfo) -> String {
    format!(
        "{}/{} files, {} of {}{}{}",
        j.files_done,
        j.files,
        wire::units::format_bytes(j.bytes_done),
        wire::units::format_bytes(j.bytes),
        if j.files_failed > 0 {
            format!(", {} failed", j.files_failed)
        } else {
            String::new()
        },
        if j.files_running > 0 {
            format!(", {} copying", j.files_running)
        } else {
            String::new()
        }
    )
}

fn meta_of(meta: &Option<String>) -> Result<transfer::client::Peer, TransferError> {
    crate::grid_cmd::meta_named(meta.as_deref())
}

pub async fn jobs(a: JobsArgs) -> Result<u8, TransferError> {
    let m = connect(&meta_of(&a.meta)?, &a.creds).await?;
    let reply = m
        .jobs(pb::JobsRequest {
            active: a.active,
            limit: a.limit,
            before_id: a.before.unwrap_or(0),
            all_users: a.all,
        })
        .await?;
    let list = reply.jobs;
    if a.json {
        crate::jsondoc::print(json!({
            "jobs": list.iter().map(job_json).collect::<Vec<_>>(),
            "links": reply.links.iter().map(link_json).collect::<Vec<_>>(),
        }));
        return Ok(0);
    }
    for l in &reply.links {
        eprintln!(
            "link {} -> {}: {}, {} measured ({})",
            shown(&l.src_site),
            shown(&l.dst_site),
            wire::units::count(l.sessions as u64, "session", "sessions"),
            wire::units::format_rate(l.goodput_bps),
            rfc3339_ms(l.updated_ms)
        );
    }
    if list.is_empty() {
        eprintln!("no jobs");
        return Ok(0);
    }
    out!(
        "{:>6}  {:<20}  {:<10} {:>3}  {:<9}  progress",
        "id",
        "created",
        "user",
        "pri",
        "state"
    );
    for j in &list {
        out!(
            "{:>6}  {:<20}  {:<10} {:>3}  {:<9}  {}",
            j.id,
            rfc3339_ms(j.created_ms),
            shown(&j.user),
            j.priority,
            j.state,
            progress(j)
        );
    }
    if list.len() as u32 == a.limit {
        let last = list.last().map(|j| j.id).unwrap_or(0);
        eprintln!("(the newest {}; older ones: --before {last})", a.limit);
    }
    Ok(0)
}

pub async fn job(c: JobCommand) -> Result<u8, TransferError> {
    match c {
        JobCommand::Show { job, state } => show(job, state.unwrap_or_default()).await,
        JobCommand::Cancel(a) => {
            let m = connect(&meta_of(&a.meta)?, &a.creds).await?;
            let j = m.cancel_job(a.id).await?;
            print_info(&j, a.json, "cancelled");
            Ok(0)
        }
        JobCommand::Retry(a) => {
            let m = connect(&meta_of(&a.meta)?, &a.creds).await?;
            let delegation = retry_delegation(&m, &a).await?;
            let j = m.retry_job(a.id, delegation).await?;
            print_info(&j, a.json, "queued again");
            Ok(0)
        }
        JobCommand::Wait { job, timeout } => {
            let m = connect(&meta_of(&job.meta)?, &job.creds).await?;
            wait_for(&m, job.id, timeout, job.json).await
        }
    }
}

/// A new delegation for retrying a job with standalone endpoints: the grants its options
/// list, living until its deadline (or a week). `None` for a job without endpoints.
async fn retry_delegation(
    m: &grid::MetaClient,
    a: &JobIdArgs,
) -> Result<Option<(String, String)>, TransferError> {
    let j = m
        .get_job(a.id, 0, 1, "")
        .await?
        .job
        .ok_or_else(|| TransferError::protocol("the metadata server sent no job"))?;
    let opts: Value = serde_json::from_str(&j.options).unwrap_or(Value::Null);
    let Some(lines) = opts["endpoint_grants"].as_array().filter(|g| !g.is_empty()) else {
        return Ok(None);
    };
    let grants = lines
        .iter()
        .map(|l| transfer::delegation::Grant::parse_line(l.as_str().unwrap_or_default()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            TransferError::protocol(format!("the job's endpoint grants do not parse: {e}"))
        })?;
    let scope = transfer::delegation::Scope { grants };
    let deadline = opts["deadline_ms"].as_i64().unwrap_or(0);
    let mut life = Duration::from_secs(7 * 24 * 3600);
    if deadline > now_ms() {
        life = life.min(Duration::from_millis(
            (deadline - now_ms()) as u64 + 600_000,
        ));
    }
    let d = crate::pki::delegate(&a.creds, &scope, life)?;
    Ok(Some((d.chain_pem, d.key_pem)))
}

fn print_info(j: &pb::JobInfo, json_out: bool, what: &str) {
    if json_out {
        crate::jsondoc::print(json!({ "job": job_json(j) }));
    } else {
        out!("job {} {what}: {} ({})", j.id, j.state, progress(j));
    }
}

async fn show(a: JobIdArgs, state: String) -> Result<u8, TransferError> {
    let m = connect(&meta_of(&a.meta)?, &a.creds).await?;
    const PAGE: u32 = 10_000;
    let first = m.get_job(a.id, 0, PAGE, &state).await?;
    let j = first
        .job
        .ok_or_else(|| TransferError::protocol("the metadata server sent no job"))?;
    let mut files = first.files;
    // Every file, in pages (by sequence number: a filtered page may skip some).
    while (files.len() as u32).is_multiple_of(PAGE) && !files.is_empty() {
        let next = files.last().map(|f| f.seq + 1).unwrap_or(0) as u64;
        let page = m.get_job(a.id, next, PAGE, &state).await?.files;
        if page.is_empty() {
            break;
        }
        files.extend(page);
    }
    if a.json {
        let mut doc = job_json(&j);
        doc["files_list"] = Value::Array(files.iter().map(file_json).collect());
        crate::jsondoc::print(json!({ "job": doc }));
        return Ok(0);
    }
    out!(
        "job {} of {}: {} ({})",
        j.id,
        shown(&j.user),
        j.state,
        progress(&j)
    );
    out!(
        "  created  {}{}",
        rfc3339_ms(j.created_ms),
        if j.ended_ms > 0 {
            format!(", ended {}", rfc3339_ms(j.ended_ms))
        } else {
            String::new()
        }
    );
    out!("  options  priority {}, {}", j.priority, shown(&j.options));
    if !j.error.is_empty() {
        out!("  error    {} (exit {})", shown(&j.error), j.exit_code);
    }
    for f in &files {
        let detail = match f.state.as_str() {
            "done" => f.node.clone(),
            "queued" if f.next_ms > now_ms() => format!(
                "try {} after {}: {}",
                f.tries + 1,
                rfc3339_ms(f.next_ms),
                shown(&f.error)
            ),
            _ if !f.error_kind.is_empty() => format!("{}: {}", f.error_kind, shown(&f.error)),
            _ => String::new(),
        };
        out!(
            "  {:<9} {} -> {} {} {}",
            f.state,
            shown(&f.source),
            shown(&f.destination),
            wire::units::format_bytes(f.size),
            detail
        );
    }
    Ok(0)
}

/// Polls the job until it ends; its exit code (8 when `timeout` passes first).
async fn wait_for(
    m: &grid::MetaClient,
    id: i64,
    timeout: Option<Duration>,
    json_out: bool,
) -> Result<u8, TransferError> {
    let started = std::time::Instant::now();
    let mut last = String::new();
    let mut pause = Duration::from_millis(250);
    loop {
        let j = m
            .get_job(id, 0, 1, "")
            .await?
            .job
            .ok_or_else(|| TransferError::protocol("the metadata server sent no job"))?;
        let ended = matches!(j.state.as_str(), "done" | "failed" | "cancelled");
        let now = format!("{} {}", j.state, progress(&j));
        if now != last && !json_out {
            eprintln!("job {id}: {now}");
            last = now;
        }
        if ended {
            if json_out {
                crate::jsondoc::print(json!({ "job": job_json(&j) }));
            } else if !j.error.is_empty() {
                eprintln!("job {id}: {}", shown(&j.error));
            }
            return Ok(j.exit_code.clamp(0, 255) as u8);
        }
        if timeout.is_some_and(|t| started.elapsed() >= t) {
            return Err(TransferError::new(
                ErrorKind::Stalled,
                format!(
                    "job {id} still {} after the --timeout; it goes on (haul job wait {id})",
                    j.state
                ),
            ));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_files_are_pairs() {
        let l = parse_list("# a list\n\n/a/x  /b/x\n  /a/y /b/\n", "l").unwrap();
        assert_eq!(
            l,
            vec![
                ("/a/x".into(), "/b/x".into()),
                ("/a/y".into(), "/b/".into())
            ]
        );
        let e = parse_list("/a /b\n/c\n", "l").unwrap_err();
        assert!(e.to_string().contains("l:2:"), "{e}");
        assert!(parse_list("/a /b /c", "l").is_err());
    }

    #[test]
    fn deadlines() {
        let d = deadline_ms("1h").unwrap();
        assert!((d - now_ms() - 3_600_000).abs() < 60_000);
        assert_eq!(
            deadline_ms("2026-12-01T06:00:00Z").unwrap(),
            1_796_104_800_000
        );
        assert!(deadline_ms("soon").is_err());
    }
}
