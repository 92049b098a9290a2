//! Making replicas: planning which files need copies where (`plan`, pure), and running the
//! copies (`Executor`): parallel, direct node-to-node third-party transfers (the data never
//! passes through the metadata server), dispatched dynamically so that every node sends and
//! receives at most `per_node` sessions at once and a node that delivers faster gets more work
//! (the load balancing of seed 002 §4.2 and seed 004: one slow node does not set the pace).
//!
//! A replica counts only once its destination has verified it against the file's checksum
//! and reported it (the catalog marks it complete then); until then it is "writing" and a
//! failed copy's row is removed.

pub use crate::runs::{Origin, Progress, Refusal};
use crate::state::{Meta, NodeEntry};
use catalog::{Inode, Replica, ReplicaState};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use transfer::TransferError;
use transfer::client::{Peer, SinkRequest, SourceRequest};
use transfer::progress::{Counters, Event};
use wire::control::ListedFile;
use wire::error::ErrorKind;
use wire::grant::Operation;

/// What is wanted of a set of files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Want {
    /// Complete copies in total.
    pub copies: u32,
    /// Sites that must each hold one.
    pub sites: Vec<String>,
    /// Copies travel over private (TLS) streams. Those of files that arrived privately always
    /// do, whatever is wanted.
    pub private: bool,
}

impl Want {
    /// Parses the `haul.policy` attribute: `copies=2 sites=A,B protect=private`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut w = Want {
            copies: 1,
            sites: vec![],
            private: false,
        };
        for part in s.split_whitespace() {
            match part.split_once('=') {
                Some(("copies", v)) => {
                    w.copies = v
                        .parse()
                        .ok()
                        .filter(|c| *c >= 1 && *c <= 64)
                        .ok_or_else(|| format!("copies={v}: expected 1 to 64"))?
                }
                Some(("sites", v)) => {
                    w.sites = v
                        .split(',')
                        .filter(|s| !s.is_empty())
                        .map(String::from)
                        .collect()
                }
                Some(("protect", "private")) => w.private = true,
                Some(("protect", "clear")) => w.private = false,
                _ => {
                    return Err(format!(
                        "{part:?}: expected copies=N, sites=A,B or protect=clear|private"
                    ));
                }
            }
        }
        Ok(w)
    }

    pub fn format(&self) -> String {
        let mut s = format!("copies={}", self.copies);
        if !self.sites.is_empty() {
            s += &format!(" sites={}", self.sites.join(","));
        }
        if self.private {
            s += " protect=private";
        }
        s
    }

    /// Copies in total, counting that each listed site needs one.
    pub fn total(&self) -> u32 {
        self.copies.max(self.sites.len() as u32)
    }
}

/// A file and its replicas, as the planner sees it.
#[derive(Clone, Debug)]
pub struct FileState {
    pub path: String,
    pub inode: Inode,
    pub replicas: Vec<Replica>,
}

/// One replica to make.
#[derive(Clone, Debug)]
pub struct Task {
    pub path: String,
    pub inode: Inode,
    /// Nodes with a complete replica on a live node (sources).
    pub sources: Vec<String>,
    /// The destination must be at this site.
    pub site: Option<String>,
    /// Sites already holding a copy (extra copies prefer other sites).
    pub held_sites: Vec<String>,
    /// Nodes that must not receive it (they hold it or are receiving it).
    pub avoid: HashSet<String>,
    /// Attempts so far.
    pub tries: u32,
    /// Copy over private (TLS) streams.
    pub private: bool,
}

/// A plan: replicas to make, files already fine, files that cannot be served.
#[derive(Debug, Default)]
pub struct Plan {
    pub tasks: Vec<Task>,
    pub already: u64,
    pub refused: Vec<Refusal>,
    /// Replicas beyond what is wanted: `(inode, node)` that can go.
    pub surplus: Vec<(i64, String, String)>,
    /// Files with tasks only because copies they have are on draining nodes (counting those,
    /// they have what is wanted).
    pub moving: u64,
}

/// Decides which replicas to make (and which are surplus) so that every file has `want`.
/// Only complete replicas on live nodes count. A replica on a draining node is a source and
/// keeps the file readable, but does not count towards `want`: a copy is made elsewhere (at the
/// draining node's site when it has another node that can take it, so a drain keeps the spread
/// over sites), and once it is complete the draining node's copy is the first surplus.
pub fn plan(files: &[FileState], nodes: &[NodeEntry], want: &Want, find_surplus: bool) -> Plan {
    let by_name: HashMap<&str, &NodeEntry> =
        nodes.iter().map(|n| (n.node.name.as_str(), n)).collect();
    // Nodes that may take a copy.
    let up: Vec<&NodeEntry> = nodes
        .iter()
        .filter(|n| n.node.up && n.node.drain_ms == 0)
        .collect();
    let draining = |node: &str| by_name.get(node).is_some_and(|n| n.node.drain_ms != 0);
    let mut out = Plan::default();
    for f in files {
        let good: Vec<&Replica> = f
            .replicas
            .iter()
            .filter(|r| {
                r.state == ReplicaState::Complete
                    && by_name.get(r.node.as_str()).is_some_and(|n| n.node.up)
            })
            .collect();
        if f.inode.size == 0 {
            // Empty files need no replica (one on a draining node can simply go).
            out.already += 1;
            if find_surplus {
                out.surplus.extend(
                    good.iter()
                        .filter(|r| draining(&r.node))
                        .map(|r| (f.inode.id, r.node.clone(), f.path.clone())),
                );
            }
            continue;
        }
        if good.is_empty() {
            out.refused.push(Refusal {
                path: f.path.clone(),
                reason: "no healthy replica to copy from (none complete on a live node)".into(),
                code: ErrorKind::Unavailable,
            });
            continue;
        }
        let staying: Vec<&Replica> = good
            .iter()
            .copied()
            .filter(|r| !draining(&r.node))
            .collect();
        let site_of = |node: &str| {
            by_name
                .get(node)
                .map(|n| n.node.site.clone())
                .unwrap_or_default()
        };
        let mut held_sites: Vec<String> = staying.iter().map(|r| site_of(&r.node)).collect();
        let busy: HashSet<String> = f
            .replicas
            .iter()
            .filter(|r| matches!(r.state, ReplicaState::Complete | ReplicaState::Writing))
            .map(|r| r.node.clone())
            .collect();
        let sources: Vec<String> = good.iter().map(|r| r.node.clone()).collect();
        let can_take = |site: &str| {
            up.iter()
                .any(|n| n.node.site == site && !busy.contains(&n.node.name))
        };
        let mut tasks = Vec::new();
        let mut refused = None;
        for s in &want.sites {
            if held_sites.contains(s) {
                continue;
            }
            if !can_take(s) {
                refused = Some(format!("no live node at site {s} can take a copy"));
                break;
            }
            tasks.push(Some(s.clone()));
            held_sites.push(s.clone());
        }
        let total = want.total() as usize;
        let have = staying.len() + tasks.len();
        if refused.is_none() && have < total {
            let eligible = up.iter().filter(|n| !busy.contains(&n.node.name)).count();
            let extra = total - have;
            if eligible < tasks.len() + extra {
                refused = Some(format!(
                    "{} copies asked, but only {} live nodes can hold one ({} already {})",
                    total,
                    eligible + staying.len(),
                    staying.len(),
                    if staying.len() == 1 { "does" } else { "do" }
                ));
            } else {
                // Replacements of copies on draining nodes go to those nodes' sites first.
                let mut leaving_sites: Vec<String> = good
                    .iter()
                    .filter(|r| draining(&r.node))
                    .map(|r| site_of(&r.node))
                    .filter(|s| !held_sites.contains(s) && can_take(s))
                    .collect();
                leaving_sites.dedup();
                for i in 0..extra {
                    tasks.push(leaving_sites.get(i).cloned());
                }
            }
        }
        if let Some(reason) = refused {
            out.refused.push(Refusal {
                path: f.path.clone(),
                reason,
                code: ErrorKind::NoSpace,
            });
            continue;
        }
        if tasks.is_empty() {
            out.already += 1;
            if find_surplus && good.len() > total {
                out.surplus.extend(surplus(f, &good, nodes, want));
            }
            continue;
        }
        let mut sites_with_leaving: Vec<String> = good.iter().map(|r| site_of(&r.node)).collect();
        sites_with_leaving.dedup();
        if good.len() >= total && want.sites.iter().all(|s| sites_with_leaving.contains(s)) {
            out.moving += 1;
        }
        for site in tasks {
            out.tasks.push(Task {
                path: f.path.clone(),
                inode: f.inode.clone(),
                sources: sources.clone(),
                site,
                held_sites: held_sites.clone(),
                avoid: busy.clone(),
                tries: 0,
                private: want.private || f.inode.private,
            });
        }
    }
    out
}

/// Replicas of `f` that can go while keeping `want`: those on draining nodes first, then the
/// fullest nodes'; never the last copy at a wanted site.
fn surplus(
    f: &FileState,
    good: &[&Replica],
    nodes: &[NodeEntry],
    want: &Want,
) -> Vec<(i64, String, String)> {
    let info = |name: &str| nodes.iter().find(|n| n.node.name == name);
    let mut keep: Vec<&Replica> = good.to_vec();
    keep.sort_by_key(|r| info(&r.node).map_or((false, 0), |n| (n.node.drain_ms == 0, n.node.free)));
    let mut out = Vec::new();
    let mut i = 0;
    while keep.len() > want.total() as usize && i < keep.len() {
        let r = keep[i];
        let site = info(&r.node)
            .map(|n| n.node.site.clone())
            .unwrap_or_default();
        let others_at_site = keep
            .iter()
            .filter(|o| o.node != r.node && info(&o.node).is_some_and(|n| n.node.site == site))
            .count();
        if want.sites.contains(&site) && others_at_site == 0 {
            i += 1;
            continue;
        }
        out.push((f.inode.id, r.node.clone(), f.path.clone()));
        keep.remove(i);
    }
    out
}

/// How a run goes.
#[derive(Clone)]
pub struct ExecOptions {
    /// Sessions a node sends (and, separately, receives) at once, not counting sessions
    /// that are ending (they give their slots back early, see `Ending`).
    pub per_node: u32,
    /// Files per session at most.
    pub batch_files: usize,
    /// Attempts per replica.
    pub max_tries: u32,
    /// What the copies are for, and for whom, in the transfer history.
    pub origin: Origin,
}

impl Default for ExecOptions {
    fn default() -> Self {
        Self {
            per_node: 2,
            batch_files: 500,
            max_tries: 3,
            origin: Origin::new("replicate", "system"),
        }
    }
}

struct SessionDone {
    src: String,
    dst: String,
    tasks: Vec<Task>,
    done: HashSet<i64>,
    failed: HashMap<i64, TransferError>,
    session_error: Option<TransferError>,
    bytes: u64,
    seconds: f64,
    /// The session gave its slots back before it ended.
    released: bool,
}

/// Runs replication tasks; returns when all are done or failed (or on cancel).
pub async fn execute(
    meta: Arc<Meta>,
    tasks: Vec<Task>,
    opts: ExecOptions,
    progress: Arc<Progress>,
    cancel: CancellationToken,
) {
    let total_bytes: u64 = tasks.iter().map(|t| t.inode.size).sum();
    let _live = meta.live.register(crate::runs::LiveRun {
        origin: opts.origin.clone(),
        started: Instant::now(),
        started_ms: catalog::now_ms(),
        progress: progress.clone(),
    });
    progress
        .copies_needed
        .fetch_add(tasks.len() as u64, Ordering::Relaxed);
    progress
        .bytes_needed
        .fetch_add(total_bytes, Ordering::Relaxed);
    // Largest files first, so that what is left at the end is small files in small
    // sessions that finish together: a big file started late would hold the link's last
    // seconds with one session's streams, too few (and with too small windows) to fill it.
    let mut tasks = tasks;
    tasks.sort_by_key(|t| std::cmp::Reverse(t.inode.size));
    // Bytes still queued per source node: each node can send only what it holds, so the run
    // ends when the fullest one is done, and those go first.
    let mut queued_by_src: HashMap<String, u64> = HashMap::new();
    for t in &tasks {
        account(&mut queued_by_src, t, true);
    }
    let mut queue: VecDeque<Task> = tasks.into();
    let mut send_busy: HashMap<String, u32> = HashMap::new();
    let mut recv_busy: HashMap<String, u32> = HashMap::new();
    // Per file: nodes receiving a copy right now.
    let mut inflight: HashMap<i64, HashSet<String>> = HashMap::new();
    // Bytes given to each node in this run, for balance.
    let mut given: HashMap<String, u64> = HashMap::new();
    let mut running = tokio::task::JoinSet::new();
    // Sessions about to finish give their slots back early (see `run_session`).
    let (release_tx, mut release_rx) = tokio::sync::mpsc::unbounded_channel::<(String, String)>();
    loop {
        if cancel.is_cancelled() {
            break;
        }
        // Form as many sessions as the slots allow.
        let nodes: HashMap<String, NodeEntry> = meta
            .nodes()
            .into_iter()
            .filter(|n| n.node.up && !n.key.is_empty())
            .map(|n| (n.node.name.clone(), n))
            .collect();
        let mut launched = false;
        while let Some((i, src, dst)) = next_launch(
            &queue,
            &queued_by_src,
            &nodes,
            &send_busy,
            &recv_busy,
            &inflight,
            &given,
            &meta,
            opts.per_node,
        ) {
            // Gather more tasks for the same pair, up to a share of what the source still has
            // queued: big sessions while much is left (fewer set-ups), small ones at the end
            // (no session is left running alone for long).
            let batch_bytes = batch_bytes(queued_by_src[&src], opts.per_node);
            let mut batch = vec![queue.remove(i).expect("index in range")];
            let mut bytes = batch[0].inode.size;
            let mut j = i;
            while j < queue.len() && batch.len() < opts.batch_files && bytes < batch_bytes {
                let u = &queue[j];
                let ok = u.sources.contains(&src)
                    && u.private == batch[0].private
                    && eligible_dst(u, &nodes[&dst], &inflight)
                    && !batch.iter().any(|b| b.inode.id == u.inode.id);
                if ok {
                    bytes += u.inode.size;
                    batch.push(queue.remove(j).expect("index in range"));
                } else {
                    j += 1;
                }
            }
            for b in &batch {
                account(&mut queued_by_src, b, false);
            }
            *send_busy.entry(src.clone()).or_default() += 1;
            *recv_busy.entry(dst.clone()).or_default() += 1;
            *given.entry(dst.clone()).or_default() += bytes;
            for b in &batch {
                inflight.entry(b.inode.id).or_default().insert(dst.clone());
            }
            progress.sessions.fetch_add(1, Ordering::Relaxed);
            let ctx = SessionContext {
                progress: progress.clone(),
                cancel: cancel.clone(),
                release: release_tx.clone(),
                origin: opts.origin.clone(),
            };
            let m = meta.clone();
            let (s, d) = (nodes[&src].clone(), nodes[&dst].clone());
            running.spawn(async move { run_session(m, s, d, batch, ctx).await });
            launched = true;
        }
        if running.is_empty() {
            if queue.is_empty() || !launched {
                // Nothing runs and nothing can start: what is left cannot be placed now.
                for t in queue.drain(..) {
                    progress.failures.lock().expect("failures").push(Refusal {
                        path: t.path.clone(),
                        reason: match &t.site {
                            Some(s) => format!("no live node at site {s} can take a copy now"),
                            None => "no live node can take another copy now".into(),
                        },
                        code: ErrorKind::NoSpace,
                    });
                }
                break;
            }
            continue;
        }
        let finished = tokio::select! {
            r = running.join_next() => r,
            Some((src, dst)) = release_rx.recv() => {
                free_slots(&mut send_busy, &mut recv_busy, &src, &dst);
                continue;
            }
            _ = cancel.cancelled() => break,
        };
        let Some(Ok(done)) = finished else { continue };
        progress.sessions.fetch_sub(1, Ordering::Relaxed);
        if !done.released {
            free_slots(&mut send_busy, &mut recv_busy, &done.src, &done.dst);
        }
        if done.seconds > 0.5 && done.bytes > 0 {
            meta.note_rate(&done.src, done.bytes as f64 / done.seconds);
        }
        {
            let mut n = progress.nodes.lock().expect("nodes");
            n.entry(done.src.clone()).or_default().0 += done.bytes;
            n.entry(done.dst.clone()).or_default().1 += done.bytes;
        }
        if let Some(e) = &done.session_error {
            meta.event(format!(
                "replication {} -> {} failed ({e}); its files go elsewhere",
                done.src, done.dst
            ));
        }
        for mut t in done.tasks {
            if let Some(set) = inflight.get_mut(&t.inode.id) {
                set.remove(&done.dst);
            }
            if done.done.contains(&t.inode.id) {
                progress.copies_made.fetch_add(1, Ordering::Relaxed);
                // Sibling tasks of the file must avoid this node now.
                for q in queue.iter_mut().filter(|q| q.inode.id == t.inode.id) {
                    q.avoid.insert(done.dst.clone());
                    q.sources.push(done.dst.clone());
                    *queued_by_src.entry(done.dst.clone()).or_default() += q.inode.size;
                }
                continue;
            }
            let err = done
                .failed
                .get(&t.inode.id)
                .cloned()
                .or(done.session_error.clone())
                .unwrap_or_else(|| TransferError::connect("not copied"));
            t.tries += 1;
            if err.kind() == wire::error::ErrorKind::SourceDamaged {
                // The source replica is bad: mark it and use another.
                let _ = meta
                    .catalog
                    .mark_replicas(&[(t.inode.id, done.src.clone())], ReplicaState::Damaged)
                    .await;
                t.sources.retain(|s| *s != done.src);
                meta.event_about(
                    format!("{}: replica on {} is damaged", t.path, done.src),
                    vec![t.path.clone()],
                );
            } else if done.session_error.is_some() {
                // Which end failed is unknown: avoid this pair's destination.
                t.avoid.insert(done.dst.clone());
            }
            if t.tries >= opts.max_tries || t.sources.is_empty() {
                progress.failures.lock().expect("failures").push(Refusal {
                    path: t.path.clone(),
                    reason: format!("copy failed {} times; last: {err}", t.tries),
                    code: ErrorKind::Unavailable,
                });
            } else {
                account(&mut queued_by_src, &t, true);
                queue.push_back(t);
            }
        }
    }
    // Cancelled: stop sessions; their unfinished replicas are dropped by run_session.
    running.abort_all();
    while running.join_next().await.is_some() {}
}

/// Bytes one session of a source takes: half of its slots' even share of what it still has
/// queued, between 16 MiB and 1 GiB; all of it when what would be left is under 16 MiB (a
/// session of a few small files is mostly set-up and end round trips).
fn batch_bytes(queued: u64, per_node: u32) -> u64 {
    const MIN: u64 = 16 << 20;
    let share = (queued / (per_node.max(1) as u64 * 2)).clamp(MIN, 1 << 30);
    if queued <= share + MIN {
        u64::MAX
    } else {
        share
    }
}

/// Sessions `node` runs now, in `busy` (sending or receiving).
fn sessions(busy: &HashMap<String, u32>, node: &str) -> u32 {
    *busy.get(node).unwrap_or(&0)
}

/// A session of `src` to `dst` ended (or is ending): its slots are free.
fn free_slots(
    send_busy: &mut HashMap<String, u32>,
    recv_busy: &mut HashMap<String, u32>,
    src: &str,
    dst: &str,
) {
    for (busy, node) in [(send_busy, src), (recv_busy, dst)] {
        if let Some(n) = busy.get_mut(node) {
            *n = n.saturating_sub(1);
        }
    }
}

/// Adds (or removes) a queued task's bytes to each of its sources.
fn account(by_src: &mut HashMap<String, u64>, t: &Task, add: bool) {
    for s in &t.sources {
        let b = by_src.entry(s.clone()).or_default();
        *b = if add {
            *b + t.inode.size
        } else {
            b.saturating_sub(t.inode.size)
        };
    }
}

/// The next session to start: `(queue index, source, destination)`. Sources with free slots
/// are tried fullest first; each starts with its first (largest) queued file that a
/// destination with a free slot can take.
#[allow(clippy::too_many_arguments)]
fn next_launch(
    queue: &VecDeque<Task>,
    queued_by_src: &HashMap<String, u64>,
    nodes: &HashMap<String, NodeEntry>,
    send_busy: &HashMap<String, u32>,
    recv_busy: &HashMap<String, u32>,
    inflight: &HashMap<i64, HashSet<String>>,
    given: &HashMap<String, u64>,
    meta: &Meta,
    per_node: u32,
) -> Option<(usize, String, String)> {
    let order = source_order(
        queued_by_src,
        |s| nodes.contains_key(s),
        send_busy,
        |s| meta.rate_of(s),
        per_node,
    );
    for src in order {
        for (i, t) in queue.iter().enumerate() {
            if !t.sources.contains(&src) {
                continue;
            }
            if let Some(dst) = choose_dst(t, nodes, recv_busy, inflight, given, meta, per_node) {
                return Some((i, src, dst));
            }
        }
    }
    None
}

/// Live sources with queued bytes and a free slot, fullest first; among equals, the fewest
/// sessions, then the best measured rate.
fn source_order(
    queued_by_src: &HashMap<String, u64>,
    live: impl Fn(&str) -> bool,
    send_busy: &HashMap<String, u32>,
    rate: impl Fn(&str) -> f64,
    per_node: u32,
) -> Vec<String> {
    let busy = |n: &str| sessions(send_busy, n);
    let mut order: Vec<(&String, u64)> = queued_by_src
        .iter()
        .filter(|(s, b)| **b > 0 && live(s) && busy(s) < per_node)
        .map(|(s, b)| (s, *b))
        .collect();
    order.sort_by(|a, b| {
        b.1.cmp(&a.1)
            .then(busy(a.0).cmp(&busy(b.0)))
            .then(rate(b.0).total_cmp(&rate(a.0)))
            .then(a.0.cmp(b.0))
    });
    order.into_iter().map(|(s, _)| s.clone()).collect()
}

fn eligible_dst(t: &Task, n: &NodeEntry, inflight: &HashMap<i64, HashSet<String>>) -> bool {
    n.node.drain_ms == 0
        && !t.avoid.contains(&n.node.name)
        && !t.sources.contains(&n.node.name)
        && t.site.as_ref().is_none_or(|s| *s == n.node.site)
        && !inflight
            .get(&t.inode.id)
            .is_some_and(|s| s.contains(&n.node.name))
        && n.node.free > t.inode.size + crate::placement::reserve(&n.view())
}

/// The best destination for `t` among nodes with free slots.
fn choose_dst(
    t: &Task,
    nodes: &HashMap<String, NodeEntry>,
    recv_busy: &HashMap<String, u32>,
    inflight: &HashMap<i64, HashSet<String>>,
    given: &HashMap<String, u64>,
    meta: &Meta,
    per_node: u32,
) -> Option<String> {
    let busy = |n: &NodeEntry| sessions(recv_busy, &n.node.name);
    let dst = nodes
        .values()
        .filter(|n| busy(n) < per_node && eligible_dst(t, n, inflight))
        .min_by(|a, b| {
            let new_site = |n: &NodeEntry| t.held_sites.contains(&n.node.site) as u8;
            // Prefer a site without a copy, then the node given the fewest bytes relative to
            // its rate, then the most free space.
            let load = |n: &NodeEntry| {
                *given.get(&n.node.name).unwrap_or(&0) as f64 / meta.rate_of(&n.node.name).max(1e6)
            };
            new_site(a)
                .cmp(&new_site(b))
                .then(busy(a).cmp(&busy(b)))
                .then(load(a).total_cmp(&load(b)))
                .then(b.node.free.cmp(&a.node.free))
                .then(a.node.name.cmp(&b.node.name))
        })?
        .node
        .name
        .clone();
    Some(dst)
}

/// The transfer log's facts of one replication session: the server directs a copy from
/// node `src` to node `dst`.
fn session_facts(
    opts: &transfer::client::CopyOptions,
    src: &NodeEntry,
    dst: &NodeEntry,
    files: usize,
) -> transfer::translog::SessionFacts {
    use transfer::translog::{Role, SessionFacts, new_guid};
    let mut f = SessionFacts::new(new_guid(), Role::ThirdParty, &opts.session);
    f.user = "replication".into();
    f.peer = dst.node.address.clone();
    f.peer_site = Some(dst.node.site.clone());
    f.source = Some(format!("node {} ({})", src.node.name, src.node.site));
    f.destination = Some(format!(
        "node {} ({}), {files} files",
        dst.node.name, dst.node.site
    ));
    f
}

/// An event of a replication session with the file's grid path in place of its id.
fn with_grid_path(ev: Event, paths: &HashMap<String, &str>) -> Event {
    let grid = |p: String| paths.get(&p).map(|s| s.to_string()).unwrap_or(p);
    match ev {
        Event::FileStarted { path } => Event::FileStarted { path: grid(path) },
        Event::FileDone {
            path,
            size,
            digests,
            skipped,
        } => Event::FileDone {
            path: grid(path),
            size,
            digests,
            skipped,
        },
        Event::FileFailed { path, error } => Event::FileFailed {
            path: grid(path),
            error,
        },
        other => other,
    }
}

/// A file for a node-to-node session: read as replica `locator` of its source node, written
/// as `name` at the destination. A copy records every checksum its file has (an upload with
/// `--checksum adler32,md5` has three): the session computes them all, and the destination
/// checks each against the file's.
pub(crate) fn listed_copy(
    session: &mut wire::control::SessionOptions,
    (locator, name): (i64, i64),
    size: u64,
    mtime_ns: i64,
    checksum: &str,
) -> ListedFile {
    let expect = wire::checksum::parse_digests(checksum).unwrap_or_default();
    for d in &expect {
        if !session.checksums.contains(&d.algorithm) {
            session.checksums.push(d.algorithm);
        }
    }
    ListedFile {
        locator: locator.to_string(),
        name: name.to_string(),
        size,
        mode: 0o600,
        mtime: wire::data::Timestamp::from_unix_ns(mtime_ns),
        expect,
    }
}

/// What a session shares with its run.
struct SessionContext {
    progress: Arc<Progress>,
    cancel: CancellationToken,
    release: tokio::sync::mpsc::UnboundedSender<(String, String)>,
    origin: Origin,
}

/// What the history keeps of a session: streams, TCP retransmits, plan and congestion control.
type SessionFigures = Option<(u32, u64, String)>;

async fn run_session(
    meta: Arc<Meta>,
    src: NodeEntry,
    dst: NodeEntry,
    tasks: Vec<Task>,
    ctx: SessionContext,
) -> SessionDone {
    let SessionContext {
        progress,
        cancel,
        release,
        origin,
    } = ctx;
    let started = Instant::now();
    let started_ms = catalog::now_ms();
    let mut figures: SessionFigures = None;
    let released = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ids: Vec<i64> = tasks.iter().map(|t| t.inode.id).collect();
    let mut out = SessionDone {
        src: src.node.name.clone(),
        dst: dst.node.name.clone(),
        tasks: Vec::new(),
        done: HashSet::new(),
        failed: HashMap::new(),
        session_error: None,
        bytes: 0,
        seconds: 0.0,
        released: false,
    };
    // Replicas the destination already has complete (made meanwhile) are never written over.
    let mut already: HashSet<i64> = HashSet::new();
    let r = async {
        let db = |e: catalog::CatalogError| TransferError::local(e.to_string());
        // A damaged or missing replica on the destination is replaced (repaired in place).
        let before = meta.catalog.replicas_of(&ids).await.map_err(db)?;
        let replace: Vec<i64> = ids
            .iter()
            .copied()
            .filter(|id| {
                before.get(id).is_some_and(|v| {
                    v.iter().any(|r| {
                        r.node == dst.node.name
                            && matches!(r.state, ReplicaState::Damaged | ReplicaState::Missing)
                    })
                })
            })
            .collect();
        let starts: Vec<(i64, String)> = ids.iter().map(|i| (*i, dst.node.name.clone())).collect();
        let lease = meta.settings.writing_lease;
        already = meta
            .catalog
            .start_replicas(&starts, catalog::now_ms() + lease.as_millis() as i64)
            .await
            .map_err(db)?
            .into_iter()
            .map(|(i, _)| i)
            .collect();
        let ids: Vec<i64> = ids
            .iter()
            .copied()
            .filter(|i| !already.contains(i))
            .collect();
        if ids.is_empty() {
            return Ok((None, HashSet::new(), HashMap::new(), 0, None));
        }
        let read = meta
            .own_grant(&src, Operation::Read, ids.clone())
            .map_err(|s| TransferError::connect(s.message().to_string()))?;
        let write = meta
            .own_grant_replacing(&dst, Operation::Write, ids.clone(), replace)
            .map_err(|s| TransferError::connect(s.message().to_string()))?;
        let mut opts = meta.copy_options().ok_or_else(|| {
            TransferError::usage("the metadata server has no client certificate")
        })?;
        // A session's files share their protection (see `execute`).
        let private = tasks.iter().any(|t| t.private);
        if private {
            opts.session.protect = wire::control::Protect::Private;
        }
        tracing::info!(
            src = %src.node.name, dst = %dst.node.name, files = ids.len(),
            protect = ?opts.session.protect, "replication session"
        );
        let files: Vec<ListedFile> = tasks
            .iter()
            .filter(|t| !already.contains(&t.inode.id))
            .map(|t| {
                let i = &t.inode;
                listed_copy(&mut opts.session, (i.id, i.id), i.size, i.mtime_ns, &i.checksum)
            })
            .collect();
        let mut recorder = meta.settings.transfer_log.clone().map(|log| {
            transfer::translog::Recorder::new(log, session_facts(&opts, &src, &dst, files.len()))
        });
        let counters = Arc::new(Counters::default());
        let (etx, mut erx) = tokio::sync::mpsc::unbounded_channel();
        let c = counters.clone();
        let p = progress.clone();
        let ticker_stop = CancellationToken::new();
        let ts = ticker_stop.clone();
        // This session holds its "writing" rows: renew their lease while it runs (other
        // metadata servers sharing the database expire only rows whose lease ended).
        let renewer = {
            let (m, stop) = (meta.clone(), ticker_stop.clone());
            let rows: Vec<(i64, String)> =
                ids.iter().map(|i| (*i, dst.node.name.clone())).collect();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = tokio::time::sleep(lease / 3) => {}
                        _ = stop.cancelled() => return,
                    }
                    let until = catalog::now_ms() + lease.as_millis() as i64;
                    if let Err(e) = m.catalog.renew_writing(&rows, until).await {
                        tracing::warn!(error = %e, "cannot renew the lease of replicas being written");
                    }
                }
            })
        };
        let (rel, pair) = (
            released.clone(),
            (src.node.name.clone(), dst.node.name.clone()),
        );
        let ticker = tokio::spawn(async move {
            let mut last = 0u64;
            let mut tick = tokio::time::interval(Duration::from_millis(250));
            let mut ending = Ending::default();
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = ts.cancelled() => {}
                }
                let now = Counters::get(&c.bytes_done);
                p.bytes_done
                    .fetch_add(now.saturating_sub(last), Ordering::Relaxed);
                last = last.max(now);
                let total = Counters::get(&c.total_bytes);
                if ending.nearly_done(Instant::now(), now, total)
                    && !rel.swap(true, Ordering::Relaxed)
                {
                    let _ = release.send(pair.clone());
                }
                if ts.is_cancelled() {
                    return last;
                }
            }
        });
        let result = transfer::client::third_party(
            &Peer::parse(&src.node.address)?,
            SourceRequest {
                files,
                grant: Some(wire::grant::SignedGrant {
                    token: read.token,
                    mac: read.mac,
                }),
                ..Default::default()
            },
            &Peer::parse(&dst.node.address)?,
            SinkRequest {
                grant: Some(wire::grant::SignedGrant {
                    token: write.token,
                    mac: write.mac,
                }),
                ..Default::default()
            },
            &opts,
            opts.session.clone(),
            transfer::client::AttemptContext {
                counters: counters.clone(),
                events: etx,
                cancel: cancel.clone(),
            },
        )
        .await;
        ticker_stop.cancel();
        let moved = ticker.await.unwrap_or(0);
        let _ = renewer.await;
        if let Ok(a) = &result {
            tracing::debug!(
                src = %src.node.name, dst = %dst.node.name, files = ids.len(), bytes = moved,
                streams = a.source.streams, seconds = started.elapsed().as_secs_f64(),
                sent = a.source.bytes_moved, resent = a.source.blocks_resent,
                retransmits = a.source.tcp_retransmits,
                plan = %a.plan, "replication session done"
            );
        }
        let mut done = HashSet::new();
        let mut failed = HashMap::new();
        // The transfer log names files by their grid paths (the nodes know only their ids).
        let paths: HashMap<String, &str> = tasks
            .iter()
            .map(|t| (t.inode.id.to_string(), t.path.as_str()))
            .collect();
        while let Ok(ev) = erx.try_recv() {
            if let Some(r) = recorder.as_mut() {
                r.on_event(&with_grid_path(ev.clone(), &paths));
            }
            match ev {
                Event::FileDone { path, .. } => {
                    if let Ok(id) = path.parse::<i64>() {
                        done.insert(id);
                    }
                }
                Event::FileFailed { path, error } => {
                    if let Ok(id) = path.parse::<i64>() {
                        failed.insert(id, TransferError::from(error));
                    }
                }
                _ => {}
            }
        }
        if let Some(r) = &recorder {
            r.finish(match &result {
                Ok(a) => Ok(transfer::translog::SessionStats {
                    bytes_moved: moved,
                    ..transfer::translog::SessionStats::from(&a.source)
                }),
                Err(e) => Err(e.to_info()),
            });
        }
        let figures: SessionFigures = result.as_ref().ok().map(|a| {
            (
                a.source.streams,
                a.source.tcp_retransmits,
                format!("plan: {}; congestion control: {}", a.plan, a.source.congestion),
            )
        });
        Ok::<_, TransferError>((result.err(), done, failed, moved, figures))
    }
    .await;
    match r {
        Ok((err, done, failed, moved, f)) => {
            figures = f;
            out.session_error = err;
            out.done = done;
            out.done.extend(already.iter().copied());
            out.failed = failed;
            out.bytes = moved;
        }
        Err(e) => {
            out.session_error = Some(e);
            out.done.extend(already.iter().copied());
        }
    }
    // What the destination did not confirm: the catalog may still have it complete (its
    // report raced the end of the session); otherwise drop the "writing" row.
    let states = meta.catalog.replicas_of(&ids).await.unwrap_or_default();
    for id in &ids {
        if out.done.contains(id) {
            continue;
        }
        let complete = states.get(id).is_some_and(|v| {
            v.iter()
                .any(|r| r.node == dst.node.name && r.state == ReplicaState::Complete)
        });
        if complete {
            out.done.insert(*id);
        } else {
            let _ = meta.catalog.remove_replica(*id, &dst.node.name).await;
        }
    }
    meta.metrics.replication(
        &src.node.site,
        &dst.node.site,
        out.bytes,
        out.done.len().saturating_sub(already.len()) as u64,
        out.failed.len() as u64,
        out.session_error.is_none(),
    );
    record_session(
        &meta, &origin, &src, &dst, &tasks, &already, &out, started_ms, figures,
    )
    .await;
    out.tasks = tasks;
    out.seconds = started.elapsed().as_secs_f64();
    out.released = released.load(Ordering::Relaxed);
    out
}

/// Puts a session that copied (or tried to copy) something into the transfer history, with
/// each file's outcome. Files the destination already had are not part of it.
#[allow(clippy::too_many_arguments)]
async fn record_session(
    meta: &Meta,
    origin: &Origin,
    src: &NodeEntry,
    dst: &NodeEntry,
    tasks: &[Task],
    already: &HashSet<i64>,
    out: &SessionDone,
    started_ms: i64,
    figures: SessionFigures,
) {
    let tried: Vec<&Task> = tasks
        .iter()
        .filter(|t| !already.contains(&t.inode.id))
        .collect();
    if tried.is_empty() {
        return;
    }
    let files: Vec<catalog::TransferFile> = tried
        .iter()
        .map(|t| {
            let ok = out.done.contains(&t.inode.id);
            let err = (!ok).then(|| {
                out.failed
                    .get(&t.inode.id)
                    .or(out.session_error.as_ref())
                    .map(|e| (e.kind().name().to_string(), e.to_string()))
                    .unwrap_or_else(|| ("cancelled".into(), "the copy did not finish".into()))
            });
            catalog::TransferFile {
                path: t.path.clone(),
                node: dst.node.name.clone(),
                bytes: if ok { t.inode.size } else { 0 },
                checksum: if ok {
                    t.inode.checksum.clone()
                } else {
                    String::new()
                },
                error_kind: err.as_ref().map(|e| e.0.clone()).unwrap_or_default(),
                error: err.map(|e| e.1).unwrap_or_default(),
            }
        })
        .collect();
    let (streams, retransmits, summary) = figures.unwrap_or_default();
    let rec = crate::history::OwnSession {
        kind: origin.kind.to_string(),
        user: origin.user.clone(),
        source: format!("{} ({})", src.node.name, src.node.site),
        destination: format!("{} ({})", dst.node.name, dst.node.site),
        src_site: src.node.site.clone(),
        dst_site: dst.node.site.clone(),
        started_ms,
        bytes_moved: out.bytes,
        streams,
        retransmits,
        summary,
    }
    .record(&files);
    meta.record_transfer(rec, &files).await;
}

/// Tells when a session is close enough to its end that the next one of its nodes should start:
/// setting up a session (control connection, TLS, data connections, slow start) takes several
/// round trips across the WAN, and started this early it overlaps the end of this one instead
/// of leaving the link short of streams (GridFTP's pipelining, between sessions).
#[derive(Default)]
struct Ending {
    /// `(when, bytes done)` about a second ago, for the session's current rate.
    mark: Option<(Instant, u64)>,
    rate: f64,
}

impl Ending {
    /// What is left would take under `LEAD` at the session's current rate. (Measured on S5:
    /// 1.5 s left the last sessions starting too late to overlap the ends of the others.)
    const LEAD: Duration = Duration::from_millis(3000);

    fn nearly_done(&mut self, now: Instant, done: u64, total: u64) -> bool {
        match self.mark {
            Some((t, b)) if now.duration_since(t) >= Duration::from_secs(1) => {
                self.rate = done.saturating_sub(b) as f64 / now.duration_since(t).as_secs_f64();
                self.mark = Some((now, done));
            }
            None => self.mark = Some((now, done)),
            _ => {}
        }
        if total == 0 || self.rate <= 0.0 {
            return false;
        }
        let left = total.saturating_sub(done) as f64;
        left <= self.rate * Self::LEAD.as_secs_f64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use catalog::{Kind, Node};

    fn node(name: &str, site: &str, up: bool) -> NodeEntry {
        NodeEntry {
            cert: String::new(),
            node: Node {
                name: name.into(),
                site: site.into(),
                address: format!("{name}:1"),
                capacity: 100 << 30,
                free: 50 << 30,
                load: 0.0,
                heartbeat_ms: 0,
                registered_ms: 0,
                up,
                drain_ms: 0,
                drain_replicas: 0,
            },
            key: vec![1],
            rate: 0,
            sessions: 0,
        }
    }

    fn file(id: i64, on: &[(&str, ReplicaState)]) -> FileState {
        FileState {
            path: format!("/f{id}"),
            inode: Inode {
                id,
                parent: 1,
                name: format!("f{id}"),
                kind: Kind::File,
                owner: "a".into(),
                group: "a".into(),
                mode: 0o644,
                size: 100,
                mtime_ns: 0,
                checksum: "crc32c:00000001".into(),
                pending: false,
                private: false,
            },
            replicas: on
                .iter()
                .map(|(n, s)| Replica {
                    inode: id,
                    node: n.to_string(),
                    state: *s,
                    checksum: String::new(),
                    updated_ms: 0,
                    created_ms: 0,
                })
                .collect(),
        }
    }

    #[test]
    fn sessions_shrink_as_a_source_drains_and_take_a_small_rest_whole() {
        const MIB: u64 = 1 << 20;
        // Half of each of the 2 slots' share, within 16 MiB .. 1 GiB.
        assert_eq!(batch_bytes(512 * MIB, 2), 128 * MIB);
        assert_eq!(batch_bytes(100 << 30, 2), 1 << 30);
        assert_eq!(batch_bytes(40 * MIB, 2), 16 * MIB);
        // What would be left is under 16 MiB: all of it goes in this session.
        assert_eq!(batch_bytes(30 * MIB, 2), u64::MAX);
        assert_eq!(batch_bytes(MIB, 2), u64::MAX);
    }

    #[test]
    fn the_fullest_source_with_a_free_slot_goes_first() {
        let queued: HashMap<String, u64> = [("a0", 500), ("a1", 900), ("a2", 900), ("a3", 0)]
            .into_iter()
            .map(|(n, b)| (n.to_string(), b))
            .collect();
        let busy: HashMap<String, u32> = [("a1".to_string(), 1)].into();
        let rate = |n: &str| if n == "a2" { 2.0 } else { 1.0 };
        let order = source_order(&queued, |_| true, &busy, rate, 2);
        // a1 and a2 have as much left; a2 has fewer sessions. a3 has nothing queued.
        assert_eq!(order, ["a2", "a1", "a0"]);
        // A source with its slots full, or not live, is not offered.
        let busy: HashMap<String, u32> = [("a1".to_string(), 2)].into();
        let order = source_order(&queued, |n| n != "a2", &busy, rate, 2);
        assert_eq!(order, ["a0"]);
    }

    #[test]
    fn a_session_gives_its_slots_back_when_its_rest_takes_under_the_lead_time() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut e = Ending::default();
        // No rate measured yet: never early.
        assert!(!e.nearly_done(at(0), 0, 100_000_000));
        assert!(!e.nearly_done(at(500), 99_000_000, 100_000_000));
        // 10 MB/s measured over the first second; 40 MB left = 4 s: not yet.
        assert!(!e.nearly_done(at(1000), 10_000_000, 50_000_000));
        // A second later 15 MB/s, 40 MB left (under 3 s): now.
        assert!(e.nearly_done(at(2000), 25_000_000, 65_000_000));
        // Unknown total: never.
        let mut e = Ending::default();
        e.nearly_done(at(0), 0, 0);
        assert!(!e.nearly_done(at(1000), 1_000, 0));
    }

    fn nodes() -> Vec<NodeEntry> {
        vec![
            node("a1", "A", true),
            node("a2", "A", true),
            node("b1", "B", true),
            node("b2", "B", false),
        ]
    }

    #[test]
    fn policies_parse_and_print() {
        let w = Want::parse("copies=2 sites=A,B").unwrap();
        assert_eq!(
            w,
            Want {
                copies: 2,
                sites: vec!["A".into(), "B".into()],
                private: false,
            }
        );
        assert_eq!(Want::parse(&w.format()).unwrap(), w);
        assert!(Want::parse("copies=0").is_err());
        assert!(Want::parse("replicas=2").is_err());
        let p = Want::parse("copies=2 protect=private").unwrap();
        assert!(p.private);
        assert_eq!(Want::parse(&p.format()).unwrap(), p);
        assert!(Want::parse("protect=sometimes").is_err());
        assert_eq!(Want::parse("copies=1 sites=A,B,C").unwrap().total(), 3);
    }

    #[test]
    fn a_draining_nodes_copies_are_replaced_at_its_site_then_go_first() {
        let mut ns = nodes();
        ns[1].node.up = true;
        ns.push(node("b3", "B", true));
        ns[0].node.drain_ms = 1; // a1 drains
        let want = Want {
            copies: 2,
            sites: vec!["A".into(), "B".into()],
            private: false,
        };
        let c = ReplicaState::Complete;
        // The copy on a1 still serves as a source, but does not count: a replacement at A
        // (a2, the only other node there), never on a1 again.
        let files = vec![file(1, &[("a1", c), ("b1", c)])];
        let p = plan(&files, &ns, &want, true);
        assert_eq!(p.tasks.len(), 1, "{:?}", p.refused);
        assert_eq!(p.tasks[0].site.as_deref(), Some("A"));
        assert_eq!(p.tasks[0].sources, vec!["a1", "b1"]);
        assert!(p.surplus.is_empty(), "nothing goes before its replacement");
        // Replaced: the draining node's copy is surplus, although its node has the most room.
        ns[0].node.free = 99 << 30;
        let files = vec![file(1, &[("a1", c), ("a2", c), ("b1", c)])];
        let p = plan(&files, &ns, &want, true);
        assert!(p.tasks.is_empty());
        assert_eq!(p.surplus, vec![(1, "a1".into(), "/f1".into())]);
        // Without a policy's sites (a drain keeps the count): the replacement stays at the
        // draining node's site when it can.
        let one = Want {
            copies: 1,
            sites: vec![],
            private: false,
        };
        let p = plan(&[file(2, &[("a1", c)])], &ns, &one, true);
        assert_eq!(p.tasks.len(), 1);
        assert_eq!(p.tasks[0].site.as_deref(), Some("A"));
        // No other node can take it at A: anywhere else.
        ns[1].node.drain_ms = 1;
        let p = plan(&[file(2, &[("a1", c)])], &ns, &one, true);
        assert_eq!(p.tasks.len(), 1);
        assert_eq!(p.tasks[0].site, None);
        // A policy that wants a copy at A cannot be kept when A's only nodes drain: refused
        // (and the copies on them stay).
        let p = plan(&files, &ns, &want, true);
        assert!(p.tasks.is_empty() && p.surplus.is_empty());
        assert_eq!(p.refused.len(), 1);
        assert!(p.refused[0].reason.contains("site A"), "{:?}", p.refused);
    }

    #[test]
    fn sites_first_then_count() {
        let files = vec![file(1, &[("a1", ReplicaState::Complete)])];
        let p = plan(
            &files,
            &nodes(),
            &Want {
                copies: 2,
                sites: vec!["B".into()],
                private: false,
            },
            false,
        );
        assert_eq!(p.tasks.len(), 1);
        assert_eq!(p.tasks[0].site.as_deref(), Some("B"));
        assert_eq!(p.tasks[0].sources, vec!["a1"]);
        let p = plan(
            &files,
            &nodes(),
            &Want {
                copies: 3,
                sites: vec![],
                private: false,
            },
            false,
        );
        assert_eq!(p.tasks.len(), 2);
        assert!(p.tasks.iter().all(|t| t.avoid.contains("a1")));
    }

    /// Issue 11 C10: copies of a file that arrived privately are made privately whatever is
    /// asked; a private policy makes every copy private.
    #[test]
    fn files_that_arrived_privately_are_copied_privately() {
        let mut secret = file(1, &[("a1", ReplicaState::Complete)]);
        secret.inode.private = true;
        let open = file(2, &[("a1", ReplicaState::Complete)]);
        let want = |private| Want {
            copies: 2,
            sites: vec![],
            private,
        };
        let p = plan(
            &[secret.clone(), open.clone()],
            &nodes(),
            &want(false),
            false,
        );
        let by_id = |p: &Plan, id| p.tasks.iter().find(|t| t.inode.id == id).unwrap().private;
        assert!(by_id(&p, 1));
        assert!(!by_id(&p, 2));
        let p = plan(&[secret, open], &nodes(), &want(true), false);
        assert!(by_id(&p, 1) && by_id(&p, 2));
    }

    #[test]
    fn impossible_requests_are_refused_per_file() {
        let files = vec![file(1, &[("a1", ReplicaState::Complete)])];
        // b2 is down: only 3 live nodes.
        let p = plan(
            &files,
            &nodes(),
            &Want {
                copies: 4,
                sites: vec![],
                private: false,
            },
            false,
        );
        assert!(p.tasks.is_empty());
        assert!(
            p.refused[0].reason.contains("4 copies asked"),
            "{:?}",
            p.refused
        );
        let p = plan(
            &files,
            &nodes(),
            &Want {
                copies: 1,
                sites: vec!["C".into()],
                private: false,
            },
            false,
        );
        assert!(p.refused[0].reason.contains("site C"));
        // A replica on a down node does not count, and a damaged one is no source.
        let files = vec![file(
            2,
            &[
                ("b2", ReplicaState::Complete),
                ("a1", ReplicaState::Damaged),
            ],
        )];
        let p = plan(
            &files,
            &nodes(),
            &Want {
                copies: 2,
                sites: vec![],
                private: false,
            },
            false,
        );
        assert!(p.refused[0].reason.contains("no healthy replica"));
    }

    #[test]
    fn satisfied_files_and_surplus() {
        let files = vec![file(
            1,
            &[
                ("a1", ReplicaState::Complete),
                ("a2", ReplicaState::Complete),
                ("b1", ReplicaState::Complete),
            ],
        )];
        let p = plan(
            &files,
            &nodes(),
            &Want {
                copies: 2,
                sites: vec!["B".into()],
                private: false,
            },
            true,
        );
        assert_eq!(p.already, 1);
        assert_eq!(p.surplus.len(), 1);
        assert_ne!(p.surplus[0].1, "b1", "the only copy at a wanted site stays");
        // A writing replica is not a source but blocks its node.
        let files = vec![file(
            3,
            &[
                ("a1", ReplicaState::Complete),
                ("b1", ReplicaState::Writing),
            ],
        )];
        let p = plan(
            &files,
            &nodes(),
            &Want {
                copies: 2,
                sites: vec![],
                private: false,
            },
            false,
        );
        assert_eq!(p.tasks.len(), 1);
        assert!(p.tasks[0].avoid.contains("b1"));
    }
}
