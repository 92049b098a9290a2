//! Transfer jobs, the users' side: `haul submit` hands source and destination pairs to the
//! metadata server, which keeps them in the catalog and does them itself, node to node
//! (`jobrun`), so that a job outlives the submitter's process and the server's restarts.
//! This module checks and expands a submission, and lists, shows, cancels and retries jobs.

use crate::auth::User;
use crate::error::{Error, Result};
use crate::jobspec::{
    DEFAULT_TRIES, EndpointPath, JobOptions, MAX_ACTIVE_JOBS, MAX_JOB_FILES, MAX_TRIES,
    MAX_WEBHOOK, exit_code,
};
use crate::perm::{self, Access};
use crate::state::Meta;
use api::meta as pb;
use catalog::{JobFilter, JobRecord, JobState, Kind, NewJob};
use transfer::delegation::{self as delegation, Grant};
use wire::error::ErrorKind;

/// A destination path: into `dst` when it names a directory (ends with `/` or is one, as
/// `user` may see it).
async fn destination_of(meta: &Meta, user: &User, src: &str, dst: &str) -> Result<String> {
    let into_dir = dst.ends_with('/')
        || matches!(meta.resolve(user, &catalog::normalize(dst)?).await, Ok(r) if r.entry().is_some_and(|i| i.kind == Kind::Dir));
    let dst = catalog::normalize(dst)?;
    if into_dir {
        let (_, name) = catalog::parent_and_name(src)?;
        Ok(catalog::join(&dst, &name))
    } else {
        Ok(dst)
    }
}

/// The delegation of a submission that names endpoints, checked: issued by the certificate
/// the user called with, valid now, covering `needs`. Returns what the catalog keeps (JSON of
/// the PEM chain and key).
fn checked_delegation(
    user: &User,
    (chain_pem, key_pem): (&str, &str),
    needs: &[Grant],
) -> Result<String> {
    if needs.is_empty() {
        return Ok(String::new());
    }
    if chain_pem.is_empty() || key_pem.is_empty() {
        return Err(Error::invalid(
            "a pair names a standalone endpoint: the job needs your delegation for it (haul submit makes one)",
        ));
    }
    if chain_pem.len() + key_pem.len() > 256 << 10 {
        return Err(Error::invalid("the delegation is over 256 KiB"));
    }
    let (scope, issuer) = transfer::delegation::verify_pem(chain_pem, std::time::SystemTime::now())
        .map_err(|e| Error::permission_denied(format!("delegation refused: {e}")))?;
    if user.cert != Some(transfer::certid::Fingerprint::of(issuer.as_ref())) {
        return Err(Error::permission_denied(
            "delegation refused: it was not issued by the certificate this submission came with",
        ));
    }
    for g in needs {
        if !scope.permits(std::slice::from_ref(&g.host), g.access, &g.path) {
            return Err(Error::permission_denied(format!(
                "delegation refused: it does not let the job {} {} at {}",
                g.access.name(),
                g.path,
                g.host
            )));
        }
    }
    Ok(serde_json::json!({"chain": chain_pem, "key": key_pem}).to_string())
}

/// What a pair's endpoint side needs of the job's delegation.
fn need(access: delegation::Access, e: &EndpointPath) -> Grant {
    Grant {
        access,
        host: e.host.clone(),
        path: e.path.clone(),
    }
}

/// `dir/name` at an endpoint.
fn endpoint_join(dir: &str, name: &str) -> String {
    catalog::join(if dir.is_empty() { "/" } else { dir }, name)
}

impl Meta {
    /// Checks a submission, expands directories, and stores the job (files whose source
    /// cannot be read are stored failed, with the reason, so that the job says why).
    pub async fn submit_job(&self, user: &User, q: &pb::SubmitJobRequest) -> Result<pb::JobInfo> {
        if q.pairs.is_empty() {
            return Err(Error::invalid(
                "a job needs at least one source and destination",
            ));
        }
        if q.pairs.len() > MAX_JOB_FILES {
            return Err(Error::invalid(format!(
                "{} pairs: at most {MAX_JOB_FILES} files per job",
                q.pairs.len()
            )));
        }
        let priority = match q.priority {
            0 => 3,
            p @ 1..=3 => p,
            p @ 4..=5 if user.admin => p,
            p @ 4..=5 => {
                return Err(Error::permission_denied(format!(
                    "priority {p}: priorities above 3 are for administrators (they go before everybody's jobs)"
                )));
            }
            p => {
                return Err(Error::invalid(format!(
                    "priority {p}: use 1 (lowest) to 5 (highest)"
                )));
            }
        };
        let max_tries = match q.max_tries {
            0 => DEFAULT_TRIES,
            n if n <= MAX_TRIES => n,
            n => return Err(Error::invalid(format!("{n} tries: at most {MAX_TRIES}"))),
        };
        if !q.webhook.is_empty()
            && !self.settings.jobs.webhooks_to_private
            && crate::webhook::names_private_address(&q.webhook)
        {
            return Err(Error::invalid(format!(
                "webhook {:?}: a loopback, private or link-local address (the metadata server allows them with --job-webhooks-to-private)",
                crate::runs::bounded(&q.webhook, 80)
            )));
        }
        if !q.webhook.is_empty() {
            let ok = (q.webhook.starts_with("http://") || q.webhook.starts_with("https://"))
                && q.webhook.len() <= MAX_WEBHOOK
                && !q.webhook.chars().any(|c| c.is_control() || c == ' ');
            if !ok {
                return Err(Error::invalid(format!(
                    "webhook {:?}: give an http:// or https:// URL of at most {MAX_WEBHOOK} bytes",
                    crate::runs::bounded(&q.webhook, 80)
                )));
            }
        }
        if !q.site.is_empty() && !self.nodes().iter().any(|n| n.node.site == q.site) {
            return Err(Error::invalid(format!(
                "site {:?} has no storage node (see haul nodes)",
                crate::runs::bounded(&q.site, 80)
            )));
        }
        if q.deadline_ms < 0 {
            return Err(Error::invalid("the deadline must be a time after 1970"));
        }
        let active = self
            .catalog
            .jobs(&JobFilter {
                user: Some(user.name.clone()),
                active: true,
                limit: MAX_ACTIVE_JOBS as u32 + 1,
                ..Default::default()
            })
            .await?;
        if active.len() >= MAX_ACTIVE_JOBS {
            return Err(Error::new(
                ErrorKind::Busy,
                format!(
                    "{} has {MAX_ACTIVE_JOBS} jobs queued or running: wait for some to end",
                    user.name
                ),
            ));
        }
        // What the pairs need of the submitter's delegation.
        let mut needs = Vec::new();
        for pair in &q.pairs {
            let (src, dst) = (
                EndpointPath::parse(&pair.source).transpose()?,
                EndpointPath::parse(&pair.destination).transpose()?,
            );
            match (src, dst) {
                (Some(_), Some(_)) => {
                    return Err(Error::invalid(format!(
                        "{} -> {}: a job copies between the grid and an endpoint; between two endpoints use haul cp",
                        pair.source, pair.destination
                    )));
                }
                (Some(s), None) => needs.push(need(delegation::Access::Read, &s)),
                (None, Some(d)) => needs.push(need(delegation::Access::Write, &d)),
                (None, None) => {}
            }
        }
        let credential = checked_delegation(
            user,
            (q.delegation_chain.as_str(), q.delegation_key.as_str()),
            &needs,
        )?;
        let endpoint_grants: Vec<String> = needs.iter().map(Grant::line).collect();
        // (source, destination, size, error)
        let mut files: Vec<(String, String, u64, Option<Error>)> = Vec::new();
        // Endpoint sources as listed: (index in files, mtime ns, mode).
        let mut listed: Vec<(usize, i64, u32)> = Vec::new();
        for pair in &q.pairs {
            if let Some(Ok(from)) = EndpointPath::parse(&pair.source) {
                self.expand_endpoint_source(
                    user,
                    q,
                    &credential,
                    &from,
                    &pair.destination,
                    &mut files,
                    &mut listed,
                )
                .await?;
                continue;
            }
            // A grid source to an endpoint: destinations are the endpoint's.
            let to_endpoint = EndpointPath::parse(&pair.destination).and_then(|r| r.ok());
            let src = match catalog::normalize(&pair.source) {
                Ok(s) => s,
                Err(e) => {
                    files.push((
                        pair.source.clone(),
                        pair.destination.clone(),
                        0,
                        Some(e.into()),
                    ));
                    continue;
                }
            };
            let (r, e) = match self.existing(user, &src).await {
                Ok(x) => x,
                Err(e) => {
                    files.push((src, pair.destination.clone(), 0, Some(e)));
                    continue;
                }
            };
            let dst = match &to_endpoint {
                Some(to) if to.path.ends_with('/') || pair.destination.ends_with('/') => {
                    let (_, name) = catalog::parent_and_name(&r.norm)?;
                    to.url(&endpoint_join(&to.path, &name))
                }
                Some(to) => to.url(&to.path),
                None => destination_of(self, user, &r.norm, &pair.destination).await?,
            };
            if e.kind == Kind::File {
                let err = (!perm::allows(user, &e, Access::Read)).then(|| {
                    Error::permission_denied(format!(
                        "{}: permission denied ({} may not read this file)",
                        r.norm, user.name
                    ))
                });
                let err = err.or_else(|| {
                    (dst == r.norm).then(|| {
                        Error::invalid(format!("{dst}: source and destination are the same file"))
                    })
                });
                files.push((r.norm, dst, e.size, err));
                continue;
            }
            if !q.recursive {
                files.push((
                    r.norm.clone(),
                    dst,
                    0,
                    Some(Error::new(
                        ErrorKind::IsADirectory,
                        format!("{}: is a directory (submit with -r)", r.norm),
                    )),
                ));
                continue;
            }
            if dst == r.norm || dst.starts_with(&format!("{}/", r.norm.trim_end_matches('/'))) {
                return Err(Error::invalid(format!(
                    "{dst}: cannot copy {} into itself",
                    r.norm
                )));
            }
            let dirs = self.catalog.dirs_below(&r.norm).await?;
            let readable: std::collections::HashSet<i64> = dirs
                .iter()
                .filter(|(_, d)| {
                    perm::allows(user, d, Access::Read) && perm::allows(user, d, Access::Search)
                })
                .map(|(_, d)| d.id)
                .collect();
            for (dp, d) in &dirs {
                if !readable.contains(&d.id) {
                    files.push((
                        dp.clone(),
                        String::new(),
                        0,
                        Some(Error::permission_denied(format!(
                            "{dp}: permission denied ({} may not list this directory)",
                            user.name
                        ))),
                    ));
                }
            }
            let base = r.norm.trim_end_matches('/').len();
            for (fp, f) in self.catalog.files_below(&r.norm).await? {
                if files.len() > MAX_JOB_FILES {
                    break;
                }
                if !readable.contains(&f.parent) {
                    continue;
                }
                let rel = fp[base..].trim_start_matches('/');
                let to = catalog::join(&dst, rel);
                let err = (!perm::allows(user, &f, Access::Read)).then(|| {
                    Error::permission_denied(format!(
                        "{fp}: permission denied ({} may not read this file)",
                        user.name
                    ))
                });
                files.push((fp, to, f.size, err));
            }
        }
        if files.len() > MAX_JOB_FILES {
            return Err(Error::invalid(format!(
                "more than {MAX_JOB_FILES} files: split the data set into several jobs"
            )));
        }
        if files.is_empty() {
            return Err(Error::invalid("the sources hold no files"));
        }
        // Two files of one job to one destination: the later ones are refused.
        let mut seen = std::collections::HashSet::new();
        for (_, d, _, e) in files.iter_mut() {
            if e.is_none() && !d.is_empty() && !seen.insert(d.clone()) {
                *e = Some(Error::invalid(format!(
                    "{d}: another file of this job goes to the same destination"
                )));
            }
        }
        let options = JobOptions {
            site: q.site.clone(),
            overwrite: q.overwrite,
            max_tries,
            deadline_ms: q.deadline_ms,
            rate_bps: q.rate_bps,
            webhook: q.webhook.clone(),
            endpoint_grants,
        };
        let id = self
            .catalog
            .create_job(&NewJob {
                user: user.name.clone(),
                priority,
                options: serde_json::to_string(&options).expect("options serialize"),
                files: files
                    .iter()
                    .map(|(s, d, n, _)| (s.clone(), d.clone(), *n))
                    .collect(),
                // Stored failed in the same transaction: never run.
                listed,
                credential,
                refused: files
                    .iter()
                    .enumerate()
                    .filter_map(|(seq, (_, _, _, e))| {
                        e.as_ref()
                            .map(|e| (seq, e.kind.name().to_string(), e.message().to_string()))
                    })
                    .collect(),
            })
            .await?;
        let refused = files.iter().filter(|f| f.3.is_some()).count();
        tracing::info!(job = id, user = %user.name, files = files.len(), refused, "job submitted");
        self.jobs.wake.notify_one();
        self.job_info(self.catalog.job(id).await?).await
    }

    /// Lists an endpoint source with the submitter's delegation and adds its files, bound for
    /// the grid path `dst` (cp semantics, as for grid sources). An endpoint that cannot be
    /// reached or refuses is the pair's error, stored with it (the job is accepted).
    #[allow(clippy::too_many_arguments)]
    async fn expand_endpoint_source(
        &self,
        user: &User,
        q: &pb::SubmitJobRequest,
        credential: &str,
        from: &EndpointPath,
        dst: &str,
        files: &mut Vec<(String, String, u64, Option<Error>)>,
        listed: &mut Vec<(usize, i64, u32)>,
    ) -> Result<()> {
        let base = destination_of(self, user, &from.path, dst).await?;
        let refuse = |files: &mut Vec<_>, e: Error| {
            files.push((from.url(&from.path), base.clone(), 0, Some(e)));
        };
        if from.path == "/" {
            refuse(
                files,
                Error::invalid("copying an endpoint's whole root: name a directory below it"),
            );
            return Ok(());
        }
        let listing = async {
            let tls = crate::jobrun::job_tls(self, credential)?;
            transfer::client::list(
                &transfer::client::Peer::new(from.host.clone(), from.port),
                &from.path,
                q.recursive,
                Some(&tls),
            )
            .await
        }
        .await;
        let listing = match listing {
            Ok(l) => l,
            Err(e) => {
                refuse(
                    files,
                    Error::new(
                        e.kind(),
                        format!("{}: {}", from.url(&from.path), e.message()),
                    ),
                );
                return Ok(());
            }
        };
        let parent = from.path.rsplit_once('/').map(|(p, _)| p).unwrap_or("");
        for e in listing.entries {
            if files.len() > MAX_JOB_FILES {
                break;
            }
            let at = from.url(&endpoint_join(parent, &e.rel));
            if e.is_dir {
                if !q.recursive {
                    refuse(
                        files,
                        Error::new(
                            ErrorKind::IsADirectory,
                            format!("{at}: is a directory (submit with -r)"),
                        ),
                    );
                }
                continue;
            }
            // The top entry goes to `base`, the rest below it.
            let below = e.rel.split_once('/').map(|(_, r)| r).unwrap_or("");
            let to = if below.is_empty() {
                base.clone()
            } else {
                catalog::join(&base, below)
            };
            listed.push((files.len(), e.mtime.unix_ns(), e.mode));
            files.push((at, to, e.size, None));
        }
        for (rel, e) in listing.unsendable {
            files.push((
                from.url(&endpoint_join(parent, &rel)),
                String::new(),
                0,
                Some(Error::new(e.kind, e.message)),
            ));
        }
        Ok(())
    }

    /// The API form of a job record, with the exit code its end gives.
    pub async fn job_info(&self, j: JobRecord) -> Result<pb::JobInfo> {
        let kind = if j.state == "failed" {
            self.catalog
                .job_files(j.id, Some(JobState::Failed), 0, 1)
                .await?
                .first()
                .map(|f| f.error_kind.clone())
                .unwrap_or_default()
        } else {
            String::new()
        };
        Ok(pb::JobInfo {
            id: j.id,
            exit_code: exit_code(&j.state, &kind),
            user: j.user,
            priority: j.priority,
            state: j.state,
            created_ms: j.created_ms,
            ended_ms: j.ended_ms,
            files: j.files,
            files_done: j.files_done,
            files_failed: j.files_failed,
            files_running: j.files_running,
            files_cancelled: j.files_cancelled,
            bytes: j.bytes,
            bytes_done: j.bytes_done,
            error: j.error,
            options: j.options,
        })
    }

    /// A job the caller may see: their own, or any for an administrator.
    async fn visible_job(&self, user: &User, id: i64) -> Result<JobRecord> {
        let j = self.catalog.job(id).await?;
        if j.user != user.name && !user.admin {
            // Another user's job is not even said to exist.
            return Err(Error::not_found(format!("job {id}: no such job")));
        }
        Ok(j)
    }

    /// The caller's jobs (an administrator's `all_users`: everybody's), newest first.
    pub async fn list_jobs(&self, user: &User, q: &pb::JobsRequest) -> Result<pb::JobsReply> {
        let f = JobFilter {
            user: (!(q.all_users && user.admin)).then(|| user.name.clone()),
            active: q.active,
            before_id: (q.before_id > 0).then_some(q.before_id),
            limit: q.limit.clamp(1, 1000),
        };
        let mut reply = pb::JobsReply::default();
        for j in self.catalog.jobs(&f).await? {
            reply.jobs.push(self.job_info(j).await?);
        }
        reply.links = self
            .catalog
            .link_tunings()
            .await?
            .into_iter()
            .map(
                |(src_site, dst_site, sessions, goodput_bps, updated_ms)| pb::JobLink {
                    src_site,
                    dst_site,
                    sessions,
                    goodput_bps,
                    updated_ms,
                },
            )
            .collect();
        Ok(reply)
    }

    /// One job and a page of its files (only those in `state` when given).
    pub async fn get_job(&self, user: &User, q: &pb::GetJobRequest) -> Result<pb::JobDetail> {
        let j = self.visible_job(user, q.id).await?;
        let state = match q.state.as_str() {
            "" => None,
            s => Some(JobState::parse(s).ok_or_else(|| {
                Error::invalid(format!(
                    "state {:?}: one of queued, running, done, failed, cancelled",
                    crate::runs::bounded(s, 40)
                ))
            })?),
        };
        let files = self
            .catalog
            .job_files(j.id, state, q.offset, q.limit.clamp(1, 10_000))
            .await?;
        Ok(pb::JobDetail {
            job: Some(self.job_info(j).await?),
            files: files
                .into_iter()
                .map(|f| pb::JobFileInfo {
                    seq: f.seq,
                    source: f.source,
                    destination: f.destination,
                    size: f.size,
                    state: f.state,
                    tries: f.tries,
                    node: f.node,
                    checksum: f.checksum,
                    error_kind: f.error_kind,
                    error: f.error,
                    next_ms: f.next_ms,
                    updated_ms: f.updated_ms,
                })
                .collect(),
        })
    }

    /// Cancels a job: queued files at once, copies in progress stopped (their unfinished
    /// files are dropped, never left under their final names).
    pub async fn cancel_job(&self, user: &User, id: i64) -> Result<pb::JobInfo> {
        self.visible_job(user, id).await?;
        self.catalog.cancel_job(id).await?;
        self.jobs.cancel(id);
        self.event(format!("job {id} cancelled by {}", user.name));
        // A cancelled job ends here: its webhook is told now.
        if let Ok(after) = self.catalog.job(id).await {
            crate::jobrun::notify(self, &after).await;
        }
        self.jobs.wake.notify_one();
        self.job_info(self.catalog.job(id).await?).await
    }

    /// Queues an ended job's failed and cancelled files again.
    pub async fn retry_job(&self, user: &User, q: &pb::RetryJobRequest) -> Result<pb::JobInfo> {
        let id = q.id;
        let j = self.visible_job(user, id).await?;
        // A job with endpoints acts there on a delegation, which ended with the job: a retry
        // brings a new one, checked as at submission (the job's own user only).
        let grants = JobOptions::parse(&j.options)
            .map(|o| o.endpoint_grants)
            .unwrap_or_default();
        let credential = if grants.is_empty() {
            None
        } else if !q.delegation_chain.is_empty() {
            if j.user != user.name {
                return Err(Error::permission_denied(format!(
                    "job {id} acts as {} at standalone endpoints: only they can retry it",
                    j.user
                )));
            }
            Some(checked_delegation(
                user,
                (q.delegation_chain.as_str(), q.delegation_key.as_str()),
                // (A line that does not parse is left out: its files fail on their own.)
                &grants
                    .iter()
                    .filter_map(|l| Grant::parse_line(l).ok())
                    .collect::<Vec<_>>(),
            )?)
        } else if self.catalog.job_credential(id).await?.is_empty() {
            return Err(Error::invalid(format!(
                "job {id} copies with standalone endpoints: its retry needs your new delegation (haul job retry makes one)"
            )));
        } else {
            None
        };
        let n = self.catalog.retry_job(id).await?;
        if let Some(c) = credential
            && n > 0
        {
            self.catalog.set_job_credential(id, &c).await?;
        }
        if n == 0 {
            return Err(Error::invalid(format!(
                "job {id}: every file is done; nothing to retry"
            )));
        }
        self.jobs.forget(id);
        self.jobs.wake.notify_one();
        self.job_info(self.catalog.job(id).await?).await
    }
}
