//! Transfer jobs, the server's side: the task that works through every queued job, batch by
//! batch, node to node, and what it remembers while it runs.
//!
//! Each pass looks at the active jobs (in the catalog: a restart loses nothing), takes each
//! one's next runnable files as a batch (up to `batch_files`, files whose back-off has passed),
//! and launches batches while there are free sessions: at most `sessions` in all and
//! `link_sessions` per link (the batch's source site and destination site), the next batch
//! chosen by [`crate::fairshare`] (priority, then fair share between groups and users).
//!
//! A batch is done as the job's user would do it by hand: the sources are opened and the
//! destinations created with the user's permissions (`open_read`, `create_files`: pending,
//! invisible until verified), then each (source node, destination node) pair copies its
//! files in one third-party session driven with the server's own certificate and
//! capabilities. A file is done when its copy is committed (the destination node reported it
//! verified); otherwise its pending entry is dropped and it is queued again after a back-off
//! (`retry_delay` doubled per attempt, at most an hour) avoiding the nodes that failed, until
//! its tries or the job's deadline run out. Files already at the destination with the
//! source's checksum are done without a copy.
//!
//! Restarts: each file being copied is stored `running` with the inode id of its copy. At
//! start, a copy that was committed counts as done (it is not sent again); one that was not is
//! dropped and its file queued again.

use crate::auth::User;
use crate::error::Error;
use crate::fairshare::{Candidate, FairShare};
use crate::jobspec::{EndpointPath, JobOptions, JobSettings, back_off, retryable};
use crate::optimizer::{LinkTuner, TunerSettings};
use crate::state::{Meta, NodeEntry};
use api::meta as pb;
use catalog::{JobFile, JobRecord, JobState};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use transfer::TransferError;
use transfer::client::{Peer, SinkRequest, SourceRequest};
use transfer::progress::Event;
use wire::control::ListedFile;
use wire::error::ErrorKind;
use wire::grant::Operation;

/// The most bytes one batch carries (with `--job-batch-files` the most files).
const BATCH_BYTES: u64 = 1 << 30;

/// The most batches one job starts in one pass of the scheduler.
const MAX_BATCHES_A_PASS: u32 = 32;

/// Splits a job's runnable files (in order) into at most `most` batches of one route each
/// (node to node, or with one endpoint: its sessions are alike), of at most `per_batch`
/// files and [`BATCH_BYTES`] (one file at least: big files make several sessions, which the
/// link's optimizer can then count). Files of another route than the first wait for a
/// later pass.
fn batches_of(files: Vec<JobFile>, per_batch: usize, most: usize) -> Vec<Vec<JobFile>> {
    let Some(route) = files.first().map(route_of) else {
        return Vec::new();
    };
    let mut out: Vec<Vec<JobFile>> = Vec::new();
    let mut bytes = 0u64;
    for f in files.into_iter().filter(|f| route_of(f) == route) {
        let full = out.last().is_none_or(|b| {
            b.len() >= per_batch || (bytes + f.size > BATCH_BYTES && !b.is_empty())
        });
        if full {
            if out.len() >= most {
                break;
            }
            out.push(Vec::new());
            bytes = 0;
        }
        bytes += f.size;
        out.last_mut().expect("a batch").push(f);
    }
    out
}

/// A link: (source site, destination site or "*").
type Link = (String, String);

/// What a link's sessions moved, as they run (read and reset by the optimizer), and the
/// sessions the optimizer allows the link now.
#[derive(Debug, Default)]
struct LinkMeter {
    bytes: AtomicU64,
    /// Bytes sent again, and the bytes of the sessions that reported them (at their end).
    resent: AtomicU64,
    ended: AtomicU64,
    sessions: AtomicU32,
    /// Round trips the sessions that ended saw (µs, TCP_INFO): their lowest, and the highest
    /// smoothed one since the optimizer last looked (0: none).
    min_rtt_us: AtomicU32,
    srtt_us: AtomicU32,
}

/// The optimizer of every link jobs use, and what it remembers.
struct Links {
    tuner: TunerSettings,
    start: u32,
    links: HashMap<Link, (LinkTuner, Arc<LinkMeter>)>,
    /// The sessions each link's jobs could use at the last pass: those running and the
    /// batches waiting for it (a probe counts only while the link's work could fill it).
    demand: HashMap<Link, u32>,
}

/// Bytes a TCP retransmit stands for (one full segment on a 1500-byte MTU).
const SEGMENT: u64 = 1448;

impl Links {
    fn new(s: &JobSettings) -> Self {
        // With a fairness cap of K streams, at most K sessions (each with K / sessions
        // streams, so that together they never have more than K).
        let cap = s.link_streams.unwrap_or(u32::MAX).max(1);
        let max = s.max_link_sessions.max(s.link_sessions).clamp(1, cap);
        Self {
            tuner: TunerSettings {
                min_sessions: 1,
                max_sessions: max,
                ..Default::default()
            },
            start: s.link_sessions.clamp(1, max),
            links: HashMap::new(),
            demand: HashMap::new(),
        }
    }

    /// The link's optimizer, made (from what the catalog remembers of the link) if new.
    async fn get(&mut self, meta: &Meta, link: &Link) -> &mut (LinkTuner, Arc<LinkMeter>) {
        if !self.links.contains_key(link) {
            let learned = meta
                .catalog
                .link_tuning(&link.0, &link.1)
                .await
                .ok()
                .flatten()
                .map(|(n, _)| n);
            let t = LinkTuner::new(self.tuner, learned.unwrap_or(self.start), Instant::now());
            let m = Arc::new(LinkMeter::default());
            m.sessions.store(t.sessions(), Ordering::Relaxed);
            self.links.insert(link.clone(), (t, m));
        }
        self.links.get_mut(link).expect("inserted")
    }

    fn limit(&self, link: &Link) -> u32 {
        self.links
            .get(link)
            .map(|(t, _)| t.sessions())
            .unwrap_or(self.start)
    }

    /// Feeds each optimizer what its link moved; a probe that ended may change the link's
    /// sessions, which the catalog then remembers.
    async fn sample(&mut self, meta: &Meta, on_link: &HashMap<Link, u32>) {
        let now = Instant::now();
        for (link, (t, m)) in self.links.iter_mut() {
            let bytes = m.bytes.swap(0, Ordering::Relaxed);
            let resent = m.resent.swap(0, Ordering::Relaxed);
            let ended = m.ended.swap(0, Ordering::Relaxed);
            t.record(now, bytes, resent, ended);
            let srtt = m.srtt_us.swap(0, Ordering::Relaxed);
            if srtt > 0 {
                t.record_rtt(m.min_rtt_us.load(Ordering::Relaxed), srtt);
            }
            // Busy: the link's work could fill its sessions (a session between batches
            // does not make the probe idle).
            let running = on_link.get(link).copied().unwrap_or(0);
            let wanted = self.demand.get(link).copied().unwrap_or(0).max(running);
            let before = t.sessions();
            if let Some(r) = t.tick(now, wanted >= before) {
                m.sessions.store(t.sessions(), Ordering::Relaxed);
                tracing::debug!(
                    src_site = %link.0, dst_site = %link.1, sessions = r.sessions,
                    goodput_bps = r.goodput_bps, loss = r.loss, next = t.sessions(),
                    "job link probe"
                );
                if t.sessions() != before {
                    tracing::info!(
                        src_site = %link.0, dst_site = %link.1, from = before, to = t.sessions(),
                        goodput_bps = r.goodput_bps as u64, "job link sessions changed"
                    );
                }
                if let Err(e) = meta
                    .catalog
                    .set_link_tuning(&link.0, &link.1, t.sessions(), r.goodput_bps)
                    .await
                {
                    tracing::warn!(error = %e, "cannot remember what the optimizer learned");
                }
            }
        }
    }
}

/// How long the right to run jobs lasts without renewal, and how often it is renewed.
const LEASE: Duration = Duration::from_secs(30);
const RENEW_EVERY: Duration = Duration::from_secs(5);
/// How often files left `running` with no batch of this server behind them are settled.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// What a running batch holds: its job, its link and its files.
type Owned = HashMap<tokio::task::Id, (i64, Link, Vec<i64>)>;

/// Runs jobs until `stop`, while this server holds the catalog's job lease (several
/// metadata servers may share a PostgreSQL catalog: one runs the jobs).
pub async fn run(meta: Arc<Meta>, stop: CancellationToken) {
    let holder = format!("{:016x}", rand::random::<u64>());
    let settings = meta.settings.jobs.clone();
    let mut share = FairShare::new(settings.weights.clone());
    let mut tasks: tokio::task::JoinSet<()> = tokio::task::JoinSet::new();
    let mut owned: Owned = HashMap::new();
    let mut on_link: HashMap<Link, u32> = HashMap::new();
    let mut of_job: HashMap<i64, u32> = HashMap::new();
    let mut links = Links::new(&settings);
    let mut leading = false;
    let mut renewed: Option<Instant> = None;
    let mut swept = Instant::now();
    loop {
        if renewed.is_none_or(|t| t.elapsed() >= RENEW_EVERY) {
            let now = catalog::now_ms();
            match meta
                .catalog
                .take_job_lease(&holder, now, LEASE.as_millis() as i64)
                .await
            {
                Ok(true) => {
                    renewed = Some(Instant::now());
                    if !leading {
                        leading = true;
                        tracing::info!("running transfer jobs (this server holds the job lease)");
                        if let Err(e) = settle_orphans(&meta, &HashSet::new()).await {
                            tracing::warn!(error = %e, "cannot settle the files a previous run left running");
                        }
                        notify_owed(&meta).await;
                    }
                }
                Ok(false) => {
                    renewed = Some(Instant::now());
                    if leading {
                        tracing::warn!(
                            "another metadata server took the job lease: stopping this one's jobs"
                        );
                        leading = false;
                        meta.jobs.stop_all();
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot renew the job lease");
                    renewed = None;
                }
            }
        }
        if leading && (tasks.len() as u32) < settings.sessions {
            match pass(&meta, &settings, &mut share, &mut links, &on_link, &of_job).await {
                Ok(launches) => {
                    for (job, link, batch) in launches {
                        *on_link.entry(link.clone()).or_default() += 1;
                        *of_job.entry(job.id).or_default() += 1;
                        let (m, s) = (meta.clone(), stop.clone());
                        let meter = links.get(&meta, &link).await.1.clone();
                        let (id, seqs) = (job.id, batch.iter().map(|f| f.seq).collect());
                        let handle = tasks.spawn(async move {
                            run_batch(m, job, batch, meter, s).await;
                        });
                        owned.insert(handle.id(), (id, link, seqs));
                    }
                }
                Err(e) => tracing::warn!(error = %e, "job scheduler pass failed"),
            }
        }
        if leading && swept.elapsed() >= SWEEP_EVERY {
            swept = Instant::now();
            let mine: HashSet<(i64, i64)> = owned
                .values()
                .flat_map(|(j, _, seqs)| seqs.iter().map(move |s| (*j, *s)))
                .collect();
            if let Err(e) = settle_orphans(&meta, &mine).await {
                tracing::warn!(error = %e, "cannot settle files left running");
            }
            notify_owed(&meta).await;
        }
        // After the launches: a link whose session just ended has its next one by now (a
        // probe that ends while the link has less work than sessions is thrown away).
        links.sample(&meta, &on_link).await;
        tokio::select! {
            Some(r) = tasks.join_next_with_id(), if !tasks.is_empty() => {
                let (id, failed) = match r {
                    Ok((id, ())) => (id, None),
                    Err(e) => (e.id(), Some(e.to_string())),
                };
                if let Some((job, link, seqs)) = owned.remove(&id) {
                    if let Some(n) = on_link.get_mut(&link) { *n = n.saturating_sub(1); }
                    if let Some(n) = of_job.get_mut(&job) { *n = n.saturating_sub(1); }
                    if let Some(why) = failed {
                        // A batch that panicked left its files running: queue them again.
                        tracing::error!(job, error = %why, "a job batch failed");
                        let _ = requeue(&meta, job, &seqs).await;
                    }
                }
            }
            _ = meta.jobs.wake.notified() => {}
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = stop.cancelled() => {
                meta.jobs.stop_all();
                while tasks.join_next().await.is_some() {}
                return;
            }
        }
    }
}

/// Files of job `job` (`seqs`) still running with no batch behind them: queued again.
async fn requeue(meta: &Meta, job: i64, seqs: &[i64]) -> Result<(), catalog::CatalogError> {
    let mut files = Vec::new();
    for f in meta
        .catalog
        .job_files(job, Some(JobState::Running), 0, 100_000)
        .await?
    {
        if seqs.contains(&f.seq) {
            files.push(f);
        }
    }
    let mine: HashSet<(i64, i64)> = HashSet::new();
    settle(meta, files, &mine).await
}

/// Files left `running` that no batch of this server (`mine`) holds, by a server that
/// stopped or a batch that failed: done if their copy was committed, else queued again (the
/// pending copy dropped).
async fn settle_orphans(
    meta: &Meta,
    mine: &HashSet<(i64, i64)>,
) -> Result<(), catalog::CatalogError> {
    let running = meta.catalog.running_job_files().await?;
    settle(meta, running, mine).await
}

async fn settle(
    meta: &Meta,
    running: Vec<JobFile>,
    mine: &HashSet<(i64, i64)>,
) -> Result<(), catalog::CatalogError> {
    let mut updates = Vec::new();
    let (mut done, mut again) = (0, 0);
    for mut f in running {
        if mine.contains(&(f.job, f.seq)) {
            continue;
        }
        match committed_copy(meta, f.target).await {
            Some(i) => {
                f.state = JobState::Done.name().into();
                f.checksum = i.checksum;
                done += 1;
            }
            None => {
                if f.target != 0 {
                    let _ = meta.catalog.abort_pending(f.target).await;
                }
                f.state = JobState::Queued.name().into();
                f.target = 0;
                again += 1;
            }
        }
        updates.push(f);
    }
    if updates.is_empty() {
        return Ok(());
    }
    meta.catalog.update_job_files(&updates).await?;
    meta.event(format!(
        "jobs: of {} files left being copied with no copy running, {done} had arrived and {again} are queued again",
        done + again
    ));
    Ok(())
}

/// The committed copy with inode id `id`, if it is one (not pending, with a checksum).
async fn committed_copy(meta: &Meta, id: i64) -> Option<catalog::Inode> {
    if id == 0 {
        return None;
    }
    match meta.catalog.inode(id).await {
        Ok(i) if !i.pending && !i.checksum.is_empty() => Some(i),
        _ => None,
    }
}

/// One look at the active jobs: ends those with nothing left, fails what passed its deadline,
/// and chooses the batches to launch now.
async fn pass(
    meta: &Meta,
    s: &JobSettings,
    share: &mut FairShare,
    links: &mut Links,
    on_link: &HashMap<Link, u32>,
    of_job: &HashMap<i64, u32>,
) -> Result<Vec<(JobRecord, Link, Vec<JobFile>)>, catalog::CatalogError> {
    let now = catalog::now_ms();
    let busy: u32 = on_link.values().sum();
    let mut free = s.sessions.saturating_sub(busy);
    let mut candidates: Vec<(Candidate, JobRecord, Link, Vec<JobFile>)> = Vec::new();
    // Every job with work, for fair share (also those that cannot start a batch now).
    let mut with_work: Vec<Candidate> = Vec::new();
    let active = meta.catalog.active_jobs().await?;
    links.demand.clear();
    // A job cancelled (here or by another server) with copies still running: stop them.
    for (id, n) in of_job {
        if *n > 0 && !active.iter().any(|j| j.id == *id) {
            meta.jobs.cancel(*id);
        }
    }
    for j in active {
        let opts = match JobOptions::parse(&j.options) {
            Ok(o) if JobState::parse(&j.state).is_some() => o,
            Ok(_) | Err(_) => {
                corrupt(meta, &j).await;
                continue;
            }
        };
        let in_flight = of_job.get(&j.id).copied().unwrap_or(0);
        if opts.deadline_ms > 0 && now >= opts.deadline_ms {
            fail_queued(
                meta,
                &j,
                "deadline",
                "the job's deadline passed before it was copied",
            )
            .await?;
        }
        if in_flight == 0 && j.files_running == 0 && j.files_queued() == 0 {
            finish(meta, &j.id, &opts).await?;
            continue;
        }
        if free == 0 {
            continue;
        }
        let mut files = meta
            .catalog
            .runnable_job_files(j.id, now, s.batch_files.max(1))
            .await?;
        let Some(first) = files.first() else { continue };
        let link = link_of(meta, first, &opts).await;
        links.get(meta, &link).await;
        let user = meta.ids.user_named(&j.user);
        // A job may use all of its link (the optimizer's number of sessions), and may start
        // as many batches in one pass as it has room for: a pass runs when a batch ends, so
        // one batch a pass would keep the job at the sessions it first had.
        let room = links
            .limit(&link)
            .saturating_sub(in_flight)
            .min(free)
            .min(MAX_BATCHES_A_PASS);
        if room > 1 {
            files = meta
                .catalog
                .runnable_job_files(j.id, now, s.batch_files.max(1).saturating_mul(room))
                .await?;
        }
        let batches = batches_of(files, s.batch_files.max(1) as usize, room.max(1) as usize);
        // (A job at its link's limit wants at least the limit.)
        let wants = if room == 0 {
            in_flight
        } else {
            in_flight + batches.len() as u32
        };
        *links.demand.entry(link.clone()).or_default() += wants;
        let Some(b) = batches.first() else { continue };
        let c = Candidate {
            job: j.id,
            user: j.user.clone(),
            group: user.primary_group().to_string(),
            priority: j.priority,
            files: b.len() as u64,
        };
        with_work.push(c.clone());
        if room == 0 {
            continue;
        }
        for b in batches {
            let c = Candidate {
                files: b.len() as u64,
                ..c.clone()
            };
            candidates.push((c, j.clone(), link.clone(), b));
        }
    }
    share.activate(&with_work);
    let mut launches = Vec::new();
    let mut used: HashMap<Link, u32> = on_link.clone();
    while free > 0 {
        let open: Vec<Candidate> = candidates
            .iter()
            .filter(|(_, _, l, _)| used.get(l).copied().unwrap_or(0) < links.limit(l))
            .filter(|(_, _, l, _)| {
                endpoint_of(l).is_none_or(|e| endpoint_busy(&used, e) < s.endpoint_sessions)
            })
            .map(|(c, ..)| c.clone())
            .collect();
        let Some(pick) = share.pick(&open).cloned() else {
            break;
        };
        share.charge(&pick, pick.files);
        let at = candidates
            .iter()
            .position(|(c, ..)| c.job == pick.job)
            .expect("picked among candidates");
        let (_, j, link, files) = candidates.swap_remove(at);
        *used.entry(link.clone()).or_default() += 1;
        free -= 1;
        tracing::info!(
            job = j.id, user = %j.user, priority = j.priority, files = files.len(),
            src_site = %link.0, dst_site = %link.1, "job batch"
        );
        // Marked running (one more try each) before anything is copied, if still queued (a
        // cancel may have come meanwhile).
        let seqs: Vec<i64> = files.iter().map(|f| f.seq).collect();
        let claimed = match meta.catalog.claim_job_files(j.id, &seqs).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(job = j.id, error = %e, "cannot start a job batch");
                continue;
            }
        };
        let files: Vec<JobFile> = files
            .into_iter()
            .filter(|f| claimed.contains(&f.seq))
            .map(|mut f| {
                f.state = JobState::Running.name().into();
                f.tries += 1;
                f.target = 0;
                f
            })
            .collect();
        if files.is_empty() {
            continue;
        }
        launches.push((j, link, files));
    }
    Ok(launches)
}

/// A job record that cannot be read is reported and ended, never run.
async fn corrupt(meta: &Meta, j: &JobRecord) {
    let why = format!(
        "corrupt job record (state {:?}, options {:?}): not run",
        crate::runs::bounded(&j.state, 40),
        crate::runs::bounded(&j.options, 200)
    );
    tracing::error!(job = j.id, "{why}");
    meta.event(format!("job {}: {why}", j.id));
    let _ = meta
        .catalog
        .set_job_state(j.id, JobState::Failed, &why)
        .await;
}

/// Fails every queued file of `j` with `kind` and `why`.
async fn fail_queued(
    meta: &Meta,
    j: &JobRecord,
    kind: &str,
    why: &str,
) -> Result<(), catalog::CatalogError> {
    loop {
        let queued = meta
            .catalog
            .job_files(j.id, Some(JobState::Queued), 0, 5000)
            .await?;
        if queued.is_empty() {
            return Ok(());
        }
        let failed: Vec<JobFile> = queued
            .into_iter()
            .map(|mut f| {
                f.state = JobState::Failed.name().into();
                f.error_kind = kind.into();
                f.error = format!("{}: {why}", f.source);
                f
            })
            .collect();
        meta.catalog.update_job_files(&failed).await?;
    }
}

/// Ends a job with nothing queued or running: done, or failed if a file failed.
async fn finish(meta: &Meta, id: &i64, opts: &JobOptions) -> Result<(), catalog::CatalogError> {
    let j = meta.catalog.job(*id).await?;
    let (state, error) = if j.files_failed > 0 {
        let first = meta
            .catalog
            .job_files(j.id, Some(JobState::Failed), 0, 1)
            .await?;
        let e = first.first().map(|f| f.error.clone()).unwrap_or_default();
        (
            JobState::Failed,
            format!(
                "{} of {} files failed; the first: {e}",
                j.files_failed, j.files
            ),
        )
    } else if j.files_cancelled > 0 {
        (JobState::Cancelled, "cancelled".to_string())
    } else {
        (JobState::Done, String::new())
    };
    meta.catalog.set_job_state(j.id, state, &error).await?;
    // The delegation lives as long as the job.
    meta.catalog.set_job_credential(j.id, "").await?;
    meta.jobs.ended(j.id);
    meta.event(format!(
        "job {} of {}: {} ({} of {} files, {} bytes)",
        j.id,
        j.user,
        state.name(),
        j.files_done,
        j.files,
        j.bytes_done
    ));
    let _ = opts;
    notify(meta, &meta.catalog.job(j.id).await?).await;
    Ok(())
}

/// Tells the webhook of ended job `j` that it ended (unless a call is under way), and marks
/// it told once delivered or given up; a job without a webhook is marked at once. What a
/// stopped server had not told is told by the next (`unnotified_jobs`, at each sweep).
pub(crate) async fn notify(meta: &Meta, j: &JobRecord) {
    let webhook = JobOptions::parse(&j.options)
        .map(|o| o.webhook)
        .unwrap_or_default();
    if webhook.is_empty() {
        let _ = meta.catalog.set_job_notified(j.id).await;
        return;
    }
    let notifying = meta.jobs.notifying.clone();
    if !notifying.lock().expect("jobs lock").insert(j.id) {
        return;
    }
    let (catalog, id) = (meta.catalog.clone(), j.id);
    crate::webhook::post(
        webhook,
        crate::webhook::document(j, &j.error),
        meta.settings.jobs.webhooks_to_private,
        async move {
            if let Err(e) = catalog.set_job_notified(id).await {
                tracing::warn!(job = id, error = %e, "cannot record the job's notification");
            }
            notifying.lock().expect("jobs lock").remove(&id);
        },
    );
}

/// Ended jobs whose end was not told yet (a server stopped before): told now.
async fn notify_owed(meta: &Meta) {
    match meta.catalog.unnotified_jobs(100).await {
        Ok(jobs) => {
            for j in &jobs {
                notify(meta, j).await;
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot look for job notifications owed"),
    }
}

/// How a job's file is copied: node to node, or between the grid and a standalone endpoint
/// (host, port).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Route {
    Grid,
    FromEndpoint(String, u16),
    ToEndpoint(String, u16),
}

fn route_of(f: &JobFile) -> Route {
    if let Some(Ok(e)) = EndpointPath::parse(&f.source) {
        return Route::FromEndpoint(e.host, e.port);
    }
    if let Some(Ok(e)) = EndpointPath::parse(&f.destination) {
        return Route::ToEndpoint(e.host, e.port);
    }
    Route::Grid
}

/// How links name an endpoint.
fn endpoint_name(host: &str, port: u16) -> String {
    format!("haul://{}", transfer::conn::format_addr(host, port))
}

/// The endpoint a link has at one end, if it has one.
fn endpoint_of(link: &Link) -> Option<&str> {
    [&link.0, &link.1]
        .into_iter()
        .find(|x| x.starts_with("haul://"))
        .map(String::as_str)
}

/// Sessions running with endpoint `e`, over every link.
fn endpoint_busy(used: &HashMap<Link, u32>, e: &str) -> u32 {
    used.iter()
        .filter(|(l, _)| endpoint_of(l) == Some(e))
        .map(|(_, n)| *n)
        .sum()
}

/// The client TLS a job acts with at endpoints: the user's delegation it was submitted with
/// (`credential`, as the catalog keeps it), and the delegation's scope.
pub(crate) fn job_tls(
    meta: &Meta,
    credential: &str,
) -> Result<transfer::conn::ClientTls, TransferError> {
    job_delegation(meta, credential).map(|(t, _)| t)
}

fn job_delegation(
    meta: &Meta,
    credential: &str,
) -> Result<(transfer::conn::ClientTls, transfer::delegation::Scope), TransferError> {
    #[derive(serde::Deserialize)]
    struct Stored {
        chain: String,
        key: String,
    }
    let gone = || {
        TransferError::new(
            ErrorKind::PermissionDenied,
            "the job holds no delegation for the endpoint (it ends with the job: haul job retry signs a new one)",
        )
    };
    let stored: Stored = serde_json::from_str(credential).map_err(|_| gone())?;
    let (scope, _) = transfer::delegation::verify_pem(&stored.chain, std::time::SystemTime::now())
        .map_err(|e| {
            TransferError::new(
                ErrorKind::Authentication,
                format!("the job's delegation: {e} (haul job retry signs a new one)"),
            )
        })?;
    Ok((meta.delegated_tls(&stored.chain, &stored.key)?, scope))
}

/// The link a batch starting with `first` uses: the site of its source's best replica (or its
/// endpoint), and the job's destination site ("*" when the job names none; or its endpoint).
async fn link_of(meta: &Meta, first: &JobFile, opts: &JobOptions) -> Link {
    let dst = if opts.site.is_empty() {
        "*".to_string()
    } else {
        opts.site.clone()
    };
    let source = first.source.as_str();
    match route_of(first) {
        Route::FromEndpoint(h, p) => return (endpoint_name(&h, p), dst),
        Route::ToEndpoint(h, p) => {
            let src = source_site(meta, source).await;
            return (src, endpoint_name(&h, p));
        }
        Route::Grid => {}
    }
    (source_site(meta, source).await, dst)
}

/// The site of the best replica of grid file `source` ("?" when none is up).
async fn source_site(meta: &Meta, source: &str) -> String {
    async {
        let i = meta.catalog.lookup(source).await.ok()??;
        let reps = meta.catalog.replicas(i.id).await.ok()?;
        reps.iter()
            .filter(|r| r.state == catalog::ReplicaState::Complete)
            .filter_map(|r| meta.node(&r.node))
            .find(|n| n.node.up)
            .map(|n| n.node.site.clone())
    }
    .await
    .unwrap_or_else(|| "?".into())
}

/// What became of one file of a batch.
#[derive(Clone)]
enum Outcome {
    /// Committed at the destination: (inode id, checksum, node).
    Done(i64, String, String),
    Failed(ErrorKind, String),
    /// Stopped by a cancel or a shutdown.
    Stopped,
}

impl Outcome {
    fn failed(kind: ErrorKind, message: impl Into<String>) -> Self {
        Outcome::Failed(kind, message.into())
    }
}

/// Copies one batch of a job and writes each file's end.
async fn run_batch(
    meta: Arc<Meta>,
    job: JobRecord,
    files: Vec<JobFile>,
    meter: Arc<LinkMeter>,
    stop: CancellationToken,
) {
    let opts = JobOptions::parse(&job.options).unwrap_or_default();
    let token = meta.jobs.token(job.id);
    let user = meta.ids.user_named(&job.user);
    let outcomes = copy_batch(&meta, &job, &opts, &user, &files, &meter, &token).await;
    let cancelled = meta
        .catalog
        .job(job.id)
        .await
        .map(|j| j.state == JobState::Cancelled.name())
        .unwrap_or(false);
    let now = catalog::now_ms();
    let mut updates = Vec::with_capacity(files.len());
    for mut f in files {
        let outcome = outcomes
            .get(&f.seq)
            .cloned()
            .unwrap_or(Outcome::Failed(ErrorKind::Io, "not copied".into()));
        match outcome {
            Outcome::Done(id, checksum, node) => {
                f.state = JobState::Done.name().into();
                f.target = id;
                f.checksum = checksum;
                f.node = node;
                f.error_kind.clear();
                f.error.clear();
            }
            Outcome::Stopped if cancelled => {
                f.state = JobState::Cancelled.name().into();
                f.target = 0;
            }
            Outcome::Stopped => {
                // The server is stopping: this attempt does not count.
                f.state = JobState::Queued.name().into();
                f.tries = f.tries.saturating_sub(1);
                f.target = 0;
            }
            Outcome::Failed(kind, msg) => {
                f.target = 0;
                f.error_kind = kind.name().into();
                f.error = msg;
                let late = opts.deadline_ms > 0
                    && now + back_off(meta.settings.jobs.retry_delay, f.tries).as_millis() as i64
                        >= opts.deadline_ms;
                if cancelled {
                    f.state = JobState::Cancelled.name().into();
                } else if retryable(kind) && f.tries < opts.max_tries && !late {
                    f.state = JobState::Queued.name().into();
                    f.next_ms =
                        now + back_off(meta.settings.jobs.retry_delay, f.tries).as_millis() as i64;
                } else {
                    f.state = JobState::Failed.name().into();
                }
            }
        }
        updates.push(f);
    }
    if let Err(e) = meta.catalog.update_job_files(&updates).await {
        tracing::error!(job = job.id, error = %e, "cannot record the end of a job's batch");
    }
    if !stop.is_cancelled() {
        meta.jobs.wake.notify_one();
    }
}

/// One file being copied: its source as opened, and its new inode at the destination node.
struct Item {
    seq: i64,
    source: pb::ReadSource,
    /// The copy's inode id at a destination node; `-(seq + 1)` for a copy at an endpoint.
    target: i64,
    /// Its name in the session (what the destination reports it by).
    name: String,
}

/// The endpoint a batch's sessions have at one end: how to reach it as the job's user (the
/// delegation), and for a destination endpoint the directory (a grant of the delegation)
/// the session writes below.
struct EndpointSide {
    peer: Peer,
    tls: transfer::conn::ClientTls,
    sink_root: String,
}

/// Copies one batch by its route.
async fn copy_batch(
    meta: &Arc<Meta>,
    job: &JobRecord,
    opts: &JobOptions,
    user: &User,
    files: &[JobFile],
    meter: &Arc<LinkMeter>,
    token: &CancellationToken,
) -> HashMap<i64, Outcome> {
    let route = files.first().map(route_of).unwrap_or(Route::Grid);
    if route == Route::Grid {
        return copy_into_grid(meta, job, opts, user, files, None, meter, token).await;
    }
    let delegation = match meta.catalog.job_credential(job.id).await {
        Ok(c) => job_delegation(meta, &c),
        Err(e) => Err(TransferError::connect(e.to_string())),
    };
    let (tls, scope) = match delegation {
        Ok(d) => d,
        Err(e) => {
            return files
                .iter()
                .map(|f| (f.seq, Outcome::Failed(e.kind(), e.message().to_string())))
                .collect();
        }
    };
    match route {
        Route::FromEndpoint(host, port) => {
            let side = EndpointSide {
                peer: Peer::new(host, port),
                tls,
                sink_root: String::new(),
            };
            copy_into_grid(meta, job, opts, user, files, Some(&side), meter, token).await
        }
        Route::ToEndpoint(host, port) => {
            let peer = Peer::new(host, port);
            copy_to_endpoint(
                meta,
                job,
                opts,
                user,
                files,
                (peer, tls, scope),
                meter,
                token,
            )
            .await
        }
        Route::Grid => unreachable!("handled above"),
    }
}

/// The node a source is read from: its first replica on a node this file's attempts did not
/// fail on, else its first (it may be the one source there is).
fn source_node<'a>(src: &'a pb::ReadSource, avoid: &HashSet<String>) -> Option<&'a str> {
    src.replicas
        .iter()
        .find(|r| !avoid.contains(&r.node))
        .or_else(|| src.replicas.first())
        .map(|r| r.node.as_str())
}

/// Opens the grid sources of `files` as `user` may read them; those refused are failed in
/// `out`.
async fn read_sources(
    meta: &Arc<Meta>,
    user: &User,
    files: &[JobFile],
    out: &mut HashMap<i64, Outcome>,
) -> HashMap<String, pb::ReadSource> {
    let read = meta
        .open_read(
            user,
            &pb::OpenReadRequest {
                paths: files.iter().map(|f| f.source.clone()).collect(),
                client_site: String::new(),
                // Every replica: a node that failed this job is only tried last (it may be
                // the one source there is).
                ..Default::default()
            },
        )
        .await;
    let read = match read {
        Ok(r) => r,
        Err(e) => {
            for f in files {
                out.insert(f.seq, Outcome::Failed(e.kind, e.message.clone()));
            }
            return HashMap::new();
        }
    };
    let refused: HashMap<&str, &pb::FileError> =
        read.errors.iter().map(|e| (e.path.as_str(), e)).collect();
    let sources: HashMap<String, pb::ReadSource> = read
        .files
        .iter()
        .map(|s| (s.path.clone(), s.clone()))
        .collect();
    for f in files {
        if !sources.contains_key(&f.source) {
            let e = refused
                .get(f.source.as_str())
                .map(|e| {
                    Error::new(
                        ErrorKind::from_name(&e.code).unwrap_or(ErrorKind::Io),
                        e.message.clone(),
                    )
                })
                .unwrap_or_else(|| Error::not_found(format!("{}: no such file", f.source)));
            out.insert(f.seq, Outcome::Failed(e.kind, e.message));
        }
    }
    sources
}

/// Copies a batch from the grid to a standalone endpoint, as the job's user: the sources
/// opened with the user's permissions, each node holding a replica pushing its files to the
/// endpoint, which admits the server on the user's delegation (and only below its grants).
/// Copies are made with resume: a file an earlier attempt completed (same size and mtime) is
/// not sent again.
#[allow(clippy::too_many_arguments)]
async fn copy_to_endpoint(
    meta: &Arc<Meta>,
    job: &JobRecord,
    opts: &JobOptions,
    user: &User,
    files: &[JobFile],
    (peer, tls, scope): (Peer, transfer::conn::ClientTls, transfer::delegation::Scope),
    meter: &Arc<LinkMeter>,
    token: &CancellationToken,
) -> HashMap<i64, Outcome> {
    use transfer::delegation::Access;
    let mut out: HashMap<i64, Outcome> = HashMap::new();
    let sources = read_sources(meta, user, files, &mut out).await;
    let avoid: HashSet<String> = files
        .iter()
        .flat_map(|f| meta.jobs.avoided(f.job, f.seq))
        .collect();
    let ep = endpoint_name(&peer.host, peer.port);
    // (node, the grant written below) -> files
    let mut groups: HashMap<(String, String), Vec<Item>> = HashMap::new();
    for f in files {
        let Some(src) = sources.get(&f.source) else {
            continue;
        };
        let Some(Ok(dest)) = EndpointPath::parse(&f.destination) else {
            out.insert(
                f.seq,
                Outcome::failed(
                    ErrorKind::Invalid,
                    format!("{}: not an endpoint path", f.destination),
                ),
            );
            continue;
        };
        // The narrowest write grant holding the destination: the session writes below it.
        let root = scope
            .grants
            .iter()
            .filter(|g| g.access == Access::Write && g.host.eq_ignore_ascii_case(&dest.host))
            .filter(|g| g.holds(&dest.path))
            .map(|g| g.path.clone())
            .max_by_key(|p| p.len());
        let Some(root) = root else {
            out.insert(
                f.seq,
                Outcome::failed(
                    ErrorKind::PermissionDenied,
                    format!("{}: outside the job's delegation", f.destination),
                ),
            );
            continue;
        };
        let Some(from) = source_node(src, &avoid) else {
            // An empty file has no replica.
            let why = if src.size == 0 {
                "an empty file: create it at the endpoint with haul cp"
            } else {
                "no healthy replica"
            };
            out.insert(
                f.seq,
                Outcome::Failed(ErrorKind::Unavailable, format!("{}: {why}", f.source)),
            );
            continue;
        };
        let below = dest.path[root.len()..].trim_start_matches('/');
        let name = if below.is_empty() {
            "_".to_string()
        } else {
            format!("_/{below}")
        };
        groups
            .entry((from.to_string(), root))
            .or_default()
            .push(Item {
                seq: f.seq,
                source: src.clone(),
                target: -(f.seq + 1),
                name,
            });
    }
    for ((node, root), items) in groups {
        let side = EndpointSide {
            peer: peer.clone(),
            tls: tls.clone(),
            sink_root: root,
        };
        let (done, failed, session_error) = if token.is_cancelled() {
            (
                HashSet::new(),
                HashMap::new(),
                Some(TransferError::interrupted()),
            )
        } else {
            copy_pair(
                meta,
                job,
                opts,
                &node,
                &ep,
                &items,
                Some(&side),
                meter,
                token,
            )
            .await
        };
        for it in items {
            if done.contains(&it.target) {
                out.insert(
                    it.seq,
                    Outcome::Done(0, it.source.checksum.clone(), ep.clone()),
                );
                continue;
            }
            if token.is_cancelled() {
                out.insert(it.seq, Outcome::Stopped);
                continue;
            }
            let e = failed
                .get(&it.target)
                .or(session_error.as_ref())
                .cloned()
                .unwrap_or_else(|| TransferError::connect("the copy did not finish"));
            if session_error.is_some() {
                meta.jobs.avoid_nodes(job.id, it.seq, &[&node]);
            }
            out.insert(
                it.seq,
                Outcome::Failed(
                    e.kind(),
                    format!(
                        "{} -> {ep}/{} ({node}): {}",
                        it.source.path,
                        it.name,
                        e.message()
                    ),
                ),
            );
        }
    }
    out
}

/// What an endpoint's listing says of the sources of `files` (listed at submission, or now
/// for those that were not: a pair the endpoint refused then and `retry` queued again).
async fn endpoint_sources(
    side: &EndpointSide,
    files: &[JobFile],
    out: &mut HashMap<i64, Outcome>,
) -> HashMap<String, pb::ReadSource> {
    let mut sources = HashMap::new();
    for f in files {
        let Some(Ok(at)) = EndpointPath::parse(&f.source) else {
            out.insert(
                f.seq,
                Outcome::failed(
                    ErrorKind::Invalid,
                    format!("{}: not an endpoint path", f.source),
                ),
            );
            continue;
        };
        let (mut size, mut mode, mut mtime_ns) = (f.size, f.src_mode, f.src_mtime_ns);
        if mode == 0 {
            match transfer::client::list(&side.peer, &at.path, false, Some(&side.tls)).await {
                Ok(l) => match l.entries.into_iter().find(|e| !e.is_dir) {
                    Some(e) => (size, mode, mtime_ns) = (e.size, e.mode, e.mtime.unix_ns()),
                    None => {
                        out.insert(
                            f.seq,
                            Outcome::failed(
                                ErrorKind::NotFound,
                                format!("{}: not a file", f.source),
                            ),
                        );
                        continue;
                    }
                },
                Err(e) => {
                    out.insert(
                        f.seq,
                        Outcome::Failed(e.kind(), format!("{}: {}", f.source, e.message())),
                    );
                    continue;
                }
            }
        }
        sources.insert(
            f.source.clone(),
            pb::ReadSource {
                path: f.source.clone(),
                size,
                mode,
                mtime_ns,
                ..Default::default()
            },
        );
    }
    sources
}

/// Copies a batch into the grid: from other grid files (node to node) or, with `origin`, from
/// a standalone endpoint (which pushes the files to the destination nodes).
#[allow(clippy::too_many_arguments)]
async fn copy_into_grid(
    meta: &Arc<Meta>,
    job: &JobRecord,
    opts: &JobOptions,
    user: &User,
    files: &[JobFile],
    origin: Option<&EndpointSide>,
    meter: &Arc<LinkMeter>,
    token: &CancellationToken,
) -> HashMap<i64, Outcome> {
    let mut out: HashMap<i64, Outcome> = HashMap::new();
    let fail = |out: &mut HashMap<i64, Outcome>, seq: i64, e: &Error| {
        out.insert(seq, Outcome::Failed(e.kind, e.message.clone()));
    };
    let avoid: HashSet<String> = files
        .iter()
        .flat_map(|f| meta.jobs.avoided(f.job, f.seq))
        .collect();
    // 1. The sources, as the user may read them (or as the endpoint listed them).
    let owned_sources = match origin {
        Some(side) => endpoint_sources(side, files, &mut out).await,
        None => read_sources(meta, user, files, &mut out).await,
    };
    let sources: HashMap<&str, &pb::ReadSource> =
        owned_sources.iter().map(|(k, v)| (k.as_str(), v)).collect();
    // 2. What is already there, and the directories the copies go in.
    let mut to_create: Vec<(&JobFile, &pb::ReadSource)> = Vec::new();
    let mut parents: HashMap<String, Option<Error>> = HashMap::new();
    for f in files {
        let Some(src) = sources.get(f.source.as_str()).copied() else {
            // Failed in step 1.
            continue;
        };
        // As the user sees it (search permission on the way), so a job tells nothing of
        // directories its user may not look into.
        let there = match meta.resolve(user, &f.destination).await {
            Ok(r) => r.entry().cloned(),
            Err(e) => {
                fail(&mut out, f.seq, &e);
                continue;
            }
        };
        match there {
            Some(i) if i.kind == catalog::Kind::File && !i.pending => {
                if i.size == src.size && !src.checksum.is_empty() && i.checksum == src.checksum {
                    out.insert(
                        f.seq,
                        Outcome::Done(i.id, i.checksum.clone(), String::new()),
                    );
                    continue;
                }
                if !opts.overwrite {
                    fail(
                        &mut out,
                        f.seq,
                        &Error::new(
                            ErrorKind::Exists,
                            format!(
                                "{}: exists and differs from {} (submit with --overwrite to replace it)",
                                f.destination, f.source
                            ),
                        ),
                    );
                    continue;
                }
            }
            Some(i) if i.kind == catalog::Kind::Dir => {
                fail(
                    &mut out,
                    f.seq,
                    &Error::new(
                        ErrorKind::IsADirectory,
                        format!("{}: is a directory", f.destination),
                    ),
                );
                continue;
            }
            _ => {}
        }
        if let Ok((parent, _)) = catalog::parent_and_name(&f.destination)
            && !parents.contains_key(&parent)
        {
            let r = meta.mkdir_as(user, &parent, 0o755, true).await.err();
            parents.insert(parent, r);
        }
        if let Some(Some(e)) = catalog::parent_and_name(&f.destination)
            .ok()
            .and_then(|(p, _)| parents.get(&p))
        {
            let e = Error::new(e.kind, format!("{}: {}", f.destination, e.message));
            fail(&mut out, f.seq, &e);
            continue;
        }
        to_create.push((f, src));
    }
    if to_create.is_empty() || token.is_cancelled() {
        for (f, _) in &to_create {
            out.insert(f.seq, Outcome::Stopped);
        }
        return out;
    }
    // 3. The copies, pending, placed as the user's uploads would be.
    let created = meta
        .create_files(
            user,
            &pb::CreateFilesRequest {
                files: to_create
                    .iter()
                    .map(|(f, s)| pb::NewFile {
                        path: f.destination.clone(),
                        size: s.size,
                        mode: s.mode,
                        mtime_ns: s.mtime_ns,
                        private: s.private,
                    })
                    .collect(),
                client_site: opts.site.clone(),
                overwrite: opts.overwrite,
                exclude_nodes: avoid.iter().cloned().collect(),
            },
        )
        .await;
    let created = match created {
        Ok(c) => c,
        Err(e) => {
            for (f, _) in &to_create {
                fail(&mut out, f.seq, &e);
            }
            return out;
        }
    };
    let by_dst: HashMap<&str, &(&JobFile, &pb::ReadSource)> = to_create
        .iter()
        .map(|x| (x.0.destination.as_str(), x))
        .collect();
    for e in &created.errors {
        if let Some((f, _)) = by_dst.get(e.path.as_str()) {
            let kind = ErrorKind::from_name(&e.code).unwrap_or(ErrorKind::Io);
            // No room or no node left once the failed ones are avoided: next time, every
            // node may be tried again.
            meta.jobs.forget_file(f.job, f.seq);
            out.insert(f.seq, Outcome::Failed(kind, e.message.clone()));
        }
    }
    for c in &created.created {
        // Empty files: visible at once, nothing to copy.
        if let Some((f, _)) = by_dst.get(c.path.as_str()) {
            out.insert(f.seq, Outcome::Done(c.id, String::new(), String::new()));
        }
    }
    // 4. One session per (source node, destination node).
    let mut pairs: HashMap<(String, String), Vec<Item>> = HashMap::new();
    let mut targets: Vec<JobFile> = Vec::new();
    for pl in &created.placements {
        for (id, path) in pl.ids.iter().zip(&pl.paths) {
            let Some((f, src)) = by_dst.get(path.as_str()) else {
                continue;
            };
            let from = match origin {
                Some(side) => Some(endpoint_name(&side.peer.host, side.peer.port)),
                None => source_node(src, &avoid).map(str::to_string),
            };
            let Some(from) = from else {
                let _ = meta.catalog.abort_pending(*id).await;
                out.insert(
                    f.seq,
                    Outcome::failed(
                        ErrorKind::Unavailable,
                        format!("{}: no healthy replica", f.source),
                    ),
                );
                continue;
            };
            let mut t = (*f).clone();
            t.target = *id;
            targets.push(t);
            pairs
                .entry((from, pl.node.clone()))
                .or_default()
                .push(Item {
                    seq: f.seq,
                    source: (*src).clone(),
                    target: *id,
                    name: id.to_string(),
                });
        }
    }
    // Their inode ids are stored first: a restart finds and settles them.
    if let Err(e) = meta.catalog.update_job_files(&targets).await {
        tracing::warn!(job = job.id, error = %e, "cannot record the copies a batch makes");
    }
    // One pair after the other: a batch is one session of its link at a time (what the
    // scheduler's limits and the optimizer count).
    for ((src, dst), items) in pairs {
        let (_, failed, session_error) = if token.is_cancelled() {
            (
                HashSet::new(),
                HashMap::new(),
                Some(TransferError::interrupted()),
            )
        } else {
            copy_pair(meta, job, opts, &src, &dst, &items, origin, meter, token).await
        };
        for it in items {
            // A committed copy was verified by its node against the source's checksums
            // (whether or not the session lived to say so).
            if let Some(i) = committed_copy(meta, it.target).await {
                out.insert(it.seq, Outcome::Done(it.target, i.checksum, dst.clone()));
                continue;
            }
            let _ = meta.catalog.abort_pending(it.target).await;
            if token.is_cancelled() {
                out.insert(it.seq, Outcome::Stopped);
                continue;
            }
            let e = failed
                .get(&it.target)
                .or(session_error.as_ref())
                .cloned()
                .unwrap_or_else(|| TransferError::connect("the copy did not finish"));
            if session_error.is_some() {
                // (An endpoint source is the only one there is: only its node is avoided.)
                if origin.is_some() {
                    meta.jobs.avoid_nodes(job.id, it.seq, &[&dst]);
                } else {
                    meta.jobs.avoid_nodes(job.id, it.seq, &[&src, &dst]);
                }
            }
            out.insert(
                it.seq,
                Outcome::Failed(
                    e.kind(),
                    format!(
                        "{} -> {} ({src} -> {dst}): {}",
                        it.source.path,
                        it.target,
                        e.message()
                    ),
                ),
            );
        }
    }
    out
}

/// Copies `items` from node `src` to node `dst` in one third-party session. Returns the
/// copies the destination confirmed, the files that failed and the session's error.
#[allow(clippy::too_many_arguments)]
async fn copy_pair(
    meta: &Arc<Meta>,
    job: &JobRecord,
    opts: &JobOptions,
    src: &str,
    dst: &str,
    items: &[Item],
    endpoint: Option<&EndpointSide>,
    meter: &Arc<LinkMeter>,
    token: &CancellationToken,
) -> (
    HashSet<i64>,
    HashMap<i64, TransferError>,
    Option<TransferError>,
) {
    let started_ms = catalog::now_ms();
    let r = copy_pair_inner(meta, opts, src, dst, items, endpoint, meter, token).await;
    let (done, failed, err, moved, figures) = match r {
        Ok(x) => x,
        Err(e) => (
            HashSet::new(),
            HashMap::new(),
            Some(e),
            0,
            (0, 0, String::new()),
        ),
    };
    record(
        meta,
        job,
        src,
        dst,
        items,
        &done,
        &failed,
        err.as_ref(),
        started_ms,
        moved,
        figures,
    )
    .await;
    (done, failed, err)
}

/// Files done, files failed, the session's error, bytes moved, and its streams, TCP
/// retransmits and summary (plan, congestion control) for the history.
type PairResult = (
    HashSet<i64>,
    HashMap<i64, TransferError>,
    Option<TransferError>,
    u64,
    (u32, u64, String),
);

#[allow(clippy::too_many_arguments)]
async fn copy_pair_inner(
    meta: &Arc<Meta>,
    opts: &JobOptions,
    src: &str,
    dst: &str,
    items: &[Item],
    endpoint: Option<&EndpointSide>,
    meter: &Arc<LinkMeter>,
    token: &CancellationToken,
) -> Result<PairResult, TransferError> {
    let node = |n: &str| -> Result<NodeEntry, TransferError> {
        meta.node(n)
            .ok_or_else(|| TransferError::connect(format!("node {n} is not registered")))
    };
    let own = |n: &NodeEntry, op, ids: Vec<i64>| {
        meta.own_grant(n, op, ids)
            .map(|c| wire::grant::SignedGrant {
                token: c.token,
                mac: c.mac,
            })
            .map_err(|e| TransferError::connect(e.message))
    };
    // Each end: an endpoint (reached on the user's delegation) or a node (with the server's
    // own capability for exactly these files).
    let at_endpoint = |n: &str| n.starts_with("haul://");
    let (from_peer, read) = match endpoint {
        Some(e) if at_endpoint(src) => (e.peer.clone(), None),
        _ => {
            let from = node(src)?;
            let ids = items.iter().map(|i| i.source.id).collect();
            (
                Peer::parse(&from.node.address)?,
                Some(own(&from, Operation::Read, ids)?),
            )
        }
    };
    let (to_peer, write) = match endpoint {
        Some(e) if at_endpoint(dst) => (e.peer.clone(), None),
        _ => {
            let to = node(dst)?;
            let ids = items.iter().map(|i| i.target).collect();
            (
                Peer::parse(&to.node.address)?,
                Some(own(&to, Operation::Write, ids)?),
            )
        }
    };
    let mut copy = meta
        .copy_options()
        .ok_or_else(|| TransferError::usage("the metadata server has no client certificate"))?;
    let mut session = copy.session.clone();
    session.shared_path = true;
    if items.iter().any(|i| i.source.private) {
        session.protect = wire::control::Protect::Private;
    }
    if opts.rate_bps > 0 {
        session.rate_bps = Some(opts.rate_bps);
    }
    if let Some(n) = meta.settings.jobs.link_streams {
        // The fairness cap: the link's sessions share its streams.
        let sessions = meter.sessions.load(Ordering::Relaxed).max(1);
        session.streams = Some((n / sessions).max(1));
        // A flow's share is a flow's share only between TCP-fair flows: BBR takes more than
        // its count against cubic (tuning.md), so a capped job runs cubic.
        session.congestion = Some("cubic".into());
    }
    let files: Vec<ListedFile> = items
        .iter()
        .map(|i| {
            let s = &i.source;
            if at_endpoint(src) {
                // Read where the endpoint listed it, relative to the user's root there.
                let locator = EndpointPath::parse(&s.path)
                    .and_then(|r| r.ok())
                    .map(|p| p.path.trim_start_matches('/').to_string())
                    .unwrap_or_default();
                return ListedFile {
                    locator,
                    name: i.name.clone(),
                    size: s.size,
                    mode: s.mode,
                    mtime: wire::data::Timestamp::from_unix_ns(s.mtime_ns),
                    expect: Vec::new(),
                };
            }
            let mut f = crate::replication::listed_copy(
                &mut session,
                (s.id, i.target),
                s.size,
                s.mtime_ns,
                &s.checksum,
            );
            f.name = i.name.clone();
            if at_endpoint(dst) {
                f.mode = s.mode & 0o7777;
            }
            f
        })
        .collect();
    let names: HashMap<&str, i64> = items.iter().map(|i| (i.name.as_str(), i.target)).collect();
    let sink = match endpoint {
        Some(e) if at_endpoint(dst) => {
            // What an earlier attempt completed (size and mtime) is not sent again.
            session.resume = true;
            SinkRequest {
                dest: e.sink_root.clone(),
                into_dir: Some(false),
                ..Default::default()
            }
        }
        _ => SinkRequest {
            grant: write,
            ..Default::default()
        },
    };
    if let Some(e) = endpoint {
        copy.peer_tls = vec![(e.peer.clone(), e.tls.clone())];
    }
    copy.session = session.clone();
    let counters = Arc::new(transfer::progress::Counters::default());
    let started = std::time::Instant::now();
    let (etx, mut erx) = tokio::sync::mpsc::unbounded_channel();
    // What the session moves counts for its link's optimizer as it goes.
    let stop_feed = CancellationToken::new();
    let feed = {
        let (c, m, stop) = (counters.clone(), meter.clone(), stop_feed.clone());
        tokio::spawn(async move {
            let mut last = 0u64;
            loop {
                let done = tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(500)) => false,
                    _ = stop.cancelled() => true,
                };
                let now = transfer::progress::Counters::get(&c.bytes_done);
                m.bytes
                    .fetch_add(now.saturating_sub(last), Ordering::Relaxed);
                last = last.max(now);
                if done {
                    return;
                }
            }
        })
    };
    let result = transfer::client::third_party(
        &from_peer,
        SourceRequest {
            files,
            grant: read,
            ..Default::default()
        },
        &to_peer,
        sink,
        &copy,
        session,
        transfer::client::AttemptContext {
            counters: counters.clone(),
            events: etx,
            cancel: token.clone(),
        },
    )
    .await;
    let mut done = HashSet::new();
    let mut failed = HashMap::new();
    while let Ok(ev) = erx.try_recv() {
        match ev {
            Event::FileDone { path, .. } => {
                if let Some(id) = names.get(path.as_str()) {
                    done.insert(*id);
                }
            }
            Event::FileFailed { path, error } => {
                if let Some(id) = names.get(path.as_str()) {
                    failed.insert(*id, TransferError::from(error));
                }
            }
            _ => {}
        }
    }
    stop_feed.cancel();
    let _ = feed.await;
    let moved = transfer::progress::Counters::get(&counters.bytes_done);
    let streams = result.as_ref().map(|a| a.source.streams).unwrap_or(0);
    let retransmits = result
        .as_ref()
        .map(|a| a.source.tcp_retransmits)
        .unwrap_or(0);
    let summary = result
        .as_ref()
        .map(|a| {
            format!(
                "plan: {}; congestion control: {}",
                a.plan, a.source.congestion
            )
        })
        .unwrap_or_default();
    if let Ok(a) = &result {
        meter.resent.fetch_add(
            a.source.tcp_retransmits.saturating_mul(SEGMENT),
            Ordering::Relaxed,
        );
        meter
            .ended
            .fetch_add(a.source.bytes_moved.max(1), Ordering::Relaxed);
        if let Some(e) = &a.source.send {
            if e.min_rtt_us > 0 {
                let _ = meter
                    .min_rtt_us
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |m| {
                        (m == 0 || e.min_rtt_us < m).then_some(e.min_rtt_us)
                    });
            }
            meter.srtt_us.fetch_max(e.srtt_us, Ordering::Relaxed);
        }
    }
    if result.is_ok() && !at_endpoint(src) {
        meta.note_rate(
            src,
            moved as f64 / started.elapsed().as_secs_f64().max(0.001),
        );
    }
    Ok((
        done,
        failed,
        result.err(),
        moved,
        (streams, retransmits, summary),
    ))
}

/// Puts a job's session into the transfer history (kind "job").
#[allow(clippy::too_many_arguments)]
async fn record(
    meta: &Meta,
    job: &JobRecord,
    src: &str,
    dst: &str,
    items: &[Item],
    done: &HashSet<i64>,
    failed: &HashMap<i64, TransferError>,
    err: Option<&TransferError>,
    started_ms: i64,
    moved: u64,
    (streams, retransmits, summary): (u32, u64, String),
) {
    let site = |n: &str| meta.node(n).map(|e| e.node.site).unwrap_or_default();
    let files: Vec<catalog::TransferFile> = items
        .iter()
        .map(|i| {
            let ok = done.contains(&i.target);
            let e = (!ok)
                .then(|| failed.get(&i.target).or(err).cloned())
                .flatten();
            catalog::TransferFile {
                path: i.source.path.clone(),
                node: dst.to_string(),
                bytes: if ok { i.source.size } else { 0 },
                checksum: if ok {
                    i.source.checksum.clone()
                } else {
                    String::new()
                },
                error_kind: e
                    .as_ref()
                    .map(|e| e.kind().name().to_string())
                    .unwrap_or_else(|| {
                        if ok {
                            String::new()
                        } else {
                            "cancelled".into()
                        }
                    }),
                error: e.map(|e| e.message().to_string()).unwrap_or_default(),
            }
        })
        .collect();
    let rec = crate::history::OwnSession {
        kind: "job".into(),
        user: job.user.clone(),
        source: format!("job {}: {src} ({})", job.id, site(src)),
        destination: format!("{dst} ({})", site(dst)),
        src_site: site(src),
        dst_site: site(dst),
        started_ms,
        bytes_moved: moved,
        streams,
        retransmits,
        summary,
    }
    .record(&files);
    meta.record_transfer(rec, &files).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(seq: i64, size: u64, dst: &str) -> JobFile {
        JobFile {
            seq,
            size,
            source: format!("/s/{seq}"),
            destination: dst.to_string(),
            ..Default::default()
        }
    }

    #[test]
    fn batches_split_by_count_bytes_and_route() {
        let files: Vec<JobFile> = (0..10).map(|i| file(i, 10, "/d")).collect();
        let b = batches_of(files.clone(), 3, 10);
        assert_eq!(b.iter().map(Vec::len).collect::<Vec<_>>(), [3, 3, 3, 1]);
        assert_eq!(batches_of(files.clone(), 3, 2).len(), 2);
        // A file over the byte bound is a batch of its own; never an empty batch.
        let big = vec![
            file(0, BATCH_BYTES + 1, "/d"),
            file(1, 1, "/d"),
            file(2, BATCH_BYTES, "/d"),
        ];
        let b = batches_of(big, 100, 10);
        assert_eq!(b.iter().map(Vec::len).collect::<Vec<_>>(), [1, 1, 1]);
        // Files of another route wait.
        let mixed = vec![
            file(0, 1, "/d"),
            file(1, 1, "haul://dtn:2811/x"),
            file(2, 1, "/d"),
        ];
        let b = batches_of(mixed, 100, 10);
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].iter().map(|f| f.seq).collect::<Vec<_>>(), [0, 2]);
        assert!(batches_of(Vec::new(), 3, 3).is_empty());
    }
}
