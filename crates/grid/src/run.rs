//! `haul run`: file-affinity computing ("owner computes", seed 000). Runs a command once per
//! grid file on a node holding a replica of it, in parallel across the nodes. Each node gets
//! one control connection on which the client keeps its slots full; a file held by several
//! nodes goes to whichever frees a slot first (so fast nodes take more work), files only one
//! node holds are handed out first, and the tasks of a node that fails are run again on
//! another node holding the file.

use crate::client::{MetaClient, from_file_error};
use api::meta as pb;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use transfer::TransferError;
use transfer::client::{Peer, ServiceChannel};
use transfer::conn::ClientTls;
use wire::control::ListedFile;
use wire::node::{NodeRequest, NodeResponse, RunSpec, RunTask, TaskResult};

/// What to run and how.
#[derive(Clone, Default)]
pub struct RunOptions {
    /// Program and arguments with `{}`, `{name}`, `{path}`, `{out}` placeholders.
    pub argv: Vec<String>,
    /// Grid directory where the files tasks write to `{out}` are registered.
    pub output: Option<String>,
    /// Tasks at once per node.
    pub parallel: u32,
    /// Seconds a task may run (0: no limit).
    pub timeout_s: u32,
    /// Prefer replicas at this site.
    pub site: Option<String>,
    pub tls: Option<ClientTls>,
}

/// How one task ended.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct TaskReport {
    pub path: String,
    pub node: String,
    pub exit: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// Output bytes beyond what the node kept.
    pub truncated: u64,
    pub seconds: f64,
    /// Files registered in the grid: (path, size).
    pub outputs: Vec<(String, u64)>,
    /// Why it did not run or its outputs were not registered.
    pub error: Option<String>,
    /// Nodes it was started on.
    pub attempts: u32,
}

impl TaskReport {
    pub fn succeeded(&self) -> bool {
        self.error.is_none() && self.exit == Some(0)
    }
}

/// What one node did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct NodeReport {
    pub node: String,
    pub slots: u32,
    pub tasks: u64,
    /// Sum of its tasks' run times.
    pub busy_seconds: f64,
    /// Why it stopped taking tasks, if it failed.
    pub error: Option<String>,
}

/// The whole run.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RunSummary {
    pub tasks: Vec<TaskReport>,
    pub succeeded: u64,
    pub failed: u64,
    pub nodes: Vec<NodeReport>,
    pub seconds: f64,
    pub slots: u32,
    /// Mean time from a task's start to its exit, on the node.
    pub mean_task_ms: f64,
    /// Slot time not spent running tasks (scheduling, connections, results, the tail of the
    /// run), per task: `(seconds × min(slots, tasks) − Σ task time) / tasks`.
    pub overhead_ms_per_task: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Waiting,
    Running(usize),
    Done,
}

/// The scheduler's shared state.
struct Sched {
    state: Vec<State>,
    holders: Vec<Vec<usize>>,
    /// Nodes that failed a file (never given it again).
    failed: Vec<HashSet<usize>>,
    queues: Vec<VecDeque<usize>>,
    dead: Vec<bool>,
    /// Files not done yet.
    open: usize,
    reports: Vec<TaskReport>,
    /// Files finished, for the caller's progress output.
    done: tokio::sync::mpsc::UnboundedSender<usize>,
}

impl Sched {
    /// The next file for node `n`.
    fn pick(&mut self, n: usize) -> Option<usize> {
        while let Some(f) = self.queues[n].pop_front() {
            if self.state[f] == State::Waiting && !self.failed[f].contains(&n) {
                self.state[f] = State::Running(n);
                self.reports[f].attempts += 1;
                return Some(f);
            }
        }
        None
    }

    fn finish(&mut self, f: usize, report: TaskReport) {
        if self.state[f] != State::Done {
            self.state[f] = State::Done;
            self.open -= 1;
            let attempts = self.reports[f].attempts;
            self.reports[f] = TaskReport { attempts, ..report };
            let _ = self.done.send(f);
        }
    }

    /// Gives `f` back after node `n` failed it: another live holder gets it, or it fails.
    fn requeue(&mut self, f: usize, n: usize, why: &str) {
        if self.state[f] == State::Done {
            return;
        }
        self.failed[f].insert(n);
        self.state[f] = State::Waiting;
        let others: Vec<usize> = self.holders[f]
            .iter()
            .copied()
            .filter(|h| !self.dead[*h] && !self.failed[f].contains(h))
            .collect();
        if others.is_empty() {
            let path = self.reports[f].path.clone();
            self.finish(
                f,
                TaskReport {
                    path,
                    error: Some(format!(
                        "no other node holding a replica could run it (last: {why})"
                    )),
                    ..Default::default()
                },
            );
            return;
        }
        for h in others {
            self.queues[h].push_front(f);
        }
    }

    /// Node `n` is gone: its running tasks go elsewhere, files only it held fail.
    fn node_failed(&mut self, n: usize, name: &str, why: &str) {
        self.dead[n] = true;
        let mine: Vec<usize> = (0..self.state.len())
            .filter(|f| self.holders[*f].contains(&n) && self.state[*f] != State::Done)
            .collect();
        for f in mine {
            match self.state[f] {
                State::Running(m) if m == n => self.requeue(f, n, &format!("node {name}: {why}")),
                State::Waiting => {
                    let alive = self.holders[f]
                        .iter()
                        .any(|h| !self.dead[*h] && !self.failed[f].contains(h));
                    if !alive {
                        self.requeue(f, n, &format!("node {name}: {why}"));
                    }
                }
                _ => {}
            }
        }
    }
}

/// Runs `opts.argv` on every file below `paths`.
pub async fn run(
    meta: &MetaClient,
    paths: &[String],
    opts: &RunOptions,
    on_done: &(dyn Fn(&TaskReport) + Send + Sync),
) -> Result<RunSummary, TransferError> {
    let started = std::time::SystemTime::now();
    // Listed among the copies in progress: tasks as files.
    let counters = Arc::new(transfer::progress::Counters::default());
    let live = crate::live::start(
        meta,
        "run",
        &paths.join(" "),
        &opts.argv.join(" "),
        crate::live::from_counters(counters.clone()),
    );
    let counted = |r: &TaskReport| {
        use transfer::progress::Counters;
        if r.error.is_some() || r.exit != Some(0) {
            Counters::add(&counters.files_failed, 1)
        } else {
            Counters::add(&counters.files_done, 1)
        }
        on_done(r)
    };
    let result = run_unrecorded(meta, paths, opts, &counters, &counted).await;
    let live_ids = live.finish().await;
    if !matches!(&result, Err(e) if e.kind() == wire::error::ErrorKind::Invalid) {
        let (t, files) = run_record(paths, &opts.argv, started, &result);
        crate::history::send(meta, t, files, live_ids).await;
    }
    result
}

/// The record of a run of `argv` on `paths`.
fn run_record(
    paths: &[String],
    argv: &[String],
    started: std::time::SystemTime,
    result: &Result<RunSummary, TransferError>,
) -> (pb::Transfer, Vec<pb::TransferFile>) {
    let mut t = pb::Transfer {
        kind: "run".into(),
        source: paths.join(" "),
        destination: argv.join(" "),
        started_ms: crate::history::ms(started),
        ended_ms: crate::history::ms(std::time::SystemTime::now()),
        attempts: 1,
        ..Default::default()
    };
    let mut files = Vec::new();
    match result {
        Ok(s) => {
            t.files = s.tasks.len() as u64;
            t.files_failed = s.failed;
            t.summary = format!(
                "{} tasks on {} nodes, {} slots, {:.1} s",
                s.tasks.len(),
                s.nodes.len(),
                s.slots,
                s.seconds
            );
            for task in &s.tasks {
                let error = if task.succeeded() {
                    None
                } else {
                    Some(
                        task.error
                            .clone()
                            .unwrap_or_else(|| match (task.exit, task.signal) {
                                (_, Some(sig)) => format!("killed by signal {sig}"),
                                (Some(code), _) => format!("exited with {code}"),
                                _ => "did not run".into(),
                            }),
                    )
                };
                let out: u64 = task.outputs.iter().map(|(_, n)| n).sum();
                t.bytes += out;
                if t.error.is_empty()
                    && let Some(e) = &error
                {
                    t.error_kind = "partial".into();
                    t.error = format!("{}: {e}", task.path);
                }
                files.push(pb::TransferFile {
                    path: task.path.clone(),
                    node: task.node.clone(),
                    bytes: out,
                    error_kind: if error.is_some() {
                        "partial".into()
                    } else {
                        String::new()
                    },
                    error: error.unwrap_or_default(),
                    ..Default::default()
                });
            }
        }
        Err(e) => {
            let info = e.to_info();
            t.error_kind = info.kind.name().to_string();
            t.error = info.message.clone();
        }
    }
    (t, files)
}

async fn run_unrecorded(
    meta: &MetaClient,
    paths: &[String],
    opts: &RunOptions,
    counters: &transfer::progress::Counters,
    on_done: &(dyn Fn(&TaskReport) + Send + Sync),
) -> Result<RunSummary, TransferError> {
    if opts.argv.is_empty() {
        return Err(TransferError::usage(
            "no command: haul run PATH... -- CMD [ARG...] ({} is the replica's path)",
        ));
    }
    let started = Instant::now();
    let reply = meta
        .open_read(pb::OpenReadRequest {
            paths: paths.to_vec(),
            client_site: opts.site.clone().unwrap_or_default(),
            recursive: true,
            run: true,
            output: opts.output.clone().unwrap_or_default(),
            ..Default::default()
        })
        .await?;
    if reply.files.is_empty() {
        return match reply.errors.first() {
            Some(e) => Err(from_file_error(e)),
            None => Err(TransferError::not_found(format!(
                "{}: no files to run on",
                paths.join(" ")
            ))),
        };
    }
    transfer::progress::Counters::set(&counters.total_files, reply.files.len() as u64);
    let nodes: Vec<pb::NodeAccess> = reply.nodes.clone();
    let index: HashMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.node.as_str(), i))
        .collect();
    let files = reply.files;
    let mut holders = Vec::with_capacity(files.len());
    for f in &files {
        let mut h: Vec<usize> = f
            .replicas
            .iter()
            .filter_map(|r| index.get(r.node.as_str()).copied())
            .collect();
        if h.is_empty() && f.size == 0 {
            // An empty file has no replica: any node can run it on an empty input.
            h = (0..nodes.len()).collect();
        }
        holders.push(h);
    }
    let mut queues: Vec<VecDeque<usize>> = vec![VecDeque::new(); nodes.len()];
    // Files few nodes hold first, so that nodes with a choice take the rest.
    let mut order: Vec<usize> = (0..files.len()).collect();
    order.sort_by_key(|f| holders[*f].len());
    for f in order {
        for &h in &holders[f] {
            queues[h].push_back(f);
        }
    }
    let mut reports: Vec<TaskReport> = files
        .iter()
        .map(|f| TaskReport {
            path: f.path.clone(),
            ..Default::default()
        })
        .collect();
    let mut open = files.len();
    let mut state = vec![State::Waiting; files.len()];
    for (f, h) in holders.iter().enumerate() {
        if h.is_empty() {
            state[f] = State::Done;
            open -= 1;
            reports[f].error = Some("no healthy replica on a live node".into());
        }
    }
    let (done, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
    for (f, st) in state.iter().enumerate() {
        if *st == State::Done {
            let _ = done.send(f);
        }
    }
    let sched = Arc::new(Mutex::new(Sched {
        done,
        state,
        failed: vec![HashSet::new(); files.len()],
        holders,
        queues,
        dead: vec![false; nodes.len()],
        open,
        reports,
    }));
    let wake = Arc::new(Notify::new());
    let files = Arc::new(files);
    let mut workers = tokio::task::JoinSet::new();
    for (n, access) in nodes.iter().enumerate() {
        let w = Worker {
            n,
            access: access.clone(),
            files: files.clone(),
            sched: sched.clone(),
            wake: wake.clone(),
            opts: opts.clone(),
        };
        workers.spawn(w.work());
    }
    // Results are reported as they arrive.
    let mut node_reports = Vec::new();
    let show = |f: usize| {
        let s = sched.lock().expect("sched lock");
        on_done(&s.reports[f]);
    };
    loop {
        tokio::select! {
            Some(f) = done_rx.recv() => show(f),
            r = workers.join_next() => match r {
                Some(Ok(nr)) => node_reports.push(nr),
                Some(Err(e)) => return Err(TransferError::local(format!("run worker failed: {e}"))),
                None => break,
            },
        }
    }
    while let Ok(f) = done_rx.try_recv() {
        show(f);
    }
    let s = sched.lock().expect("sched lock");
    let tasks = s.reports.clone();
    drop(s);
    let seconds = started.elapsed().as_secs_f64();
    let slots: u32 = node_reports.iter().map(|n| n.slots).sum();
    let busy: f64 = tasks.iter().map(|t| t.seconds).sum();
    let ran = tasks.iter().filter(|t| t.attempts > 0).count().max(1) as f64;
    node_reports.sort_by(|a, b| a.node.cmp(&b.node));
    Ok(RunSummary {
        succeeded: tasks.iter().filter(|t| t.succeeded()).count() as u64,
        failed: tasks.iter().filter(|t| !t.succeeded()).count() as u64,
        mean_task_ms: busy / ran * 1000.0,
        overhead_ms_per_task: ((seconds * (slots as f64).min(ran) - busy) / ran * 1000.0).max(0.0),
        tasks,
        nodes: node_reports,
        seconds,
        slots,
    })
}

/// Keeps one node's slots full.
struct Worker {
    n: usize,
    access: pb::NodeAccess,
    files: Arc<Vec<pb::ReadSource>>,
    sched: Arc<Mutex<Sched>>,
    wake: Arc<Notify>,
    opts: RunOptions,
}

impl Worker {
    async fn work(self) -> NodeReport {
        let mut report = NodeReport {
            node: self.access.node.clone(),
            ..Default::default()
        };
        match self.drive(&mut report).await {
            Ok(()) => {}
            Err((e, inflight)) => {
                let why = e.to_string();
                tracing::debug!(node = %self.access.node, "run: {why}");
                let mut s = self.sched.lock().expect("sched lock");
                for f in inflight {
                    s.requeue(f, self.n, &format!("node {}: {why}", self.access.node));
                }
                s.node_failed(self.n, &self.access.node, &why);
                report.error = Some(why);
                drop(s);
                self.wake.notify_waiters();
            }
        }
        report
    }

    fn task(&self, f: usize) -> RunTask {
        let src = &self.files[f];
        let has_replica = src.replicas.iter().any(|r| r.node == self.access.node);
        RunTask {
            task: f as u64,
            file: ListedFile {
                locator: if has_replica {
                    src.id.to_string()
                } else {
                    String::new()
                },
                name: src.path.clone(),
                size: src.size,
                mode: src.mode,
                mtime: Default::default(),
                expect: Vec::new(),
            },
        }
    }

    async fn drive(&self, report: &mut NodeReport) -> Result<(), (TransferError, Vec<usize>)> {
        let peer = Peer::parse(&self.access.address).map_err(|e| (e, vec![]))?;
        let spec = RunSpec {
            argv: self.opts.argv.clone(),
            output: self.opts.output.clone().unwrap_or_default(),
            parallel: self.opts.parallel.max(1),
            timeout_s: self.opts.timeout_s,
            grant: crate::copy::cap(&self.access.capability),
        };
        let mut ch = start_run(&peer, spec, self.opts.tls.as_ref())
            .await
            .map_err(|e| (e, vec![]))?;
        report.slots = ch.slots;
        let mut inflight: HashSet<usize> = HashSet::new();
        loop {
            // Fill the node's slots.
            let mut picked = Vec::new();
            let finished;
            {
                let mut s = self.sched.lock().expect("sched lock");
                while inflight.len() + picked.len() < ch.slots as usize {
                    match s.pick(self.n) {
                        Some(f) => picked.push(f),
                        None => break,
                    }
                }
                finished = s.open == 0;
            }
            for f in picked {
                inflight.insert(f);
                let t = self.task(f);
                if let Err(e) = ch.channel.send(NodeRequest::Task(t).encode()).await {
                    return Err((e, inflight.into_iter().collect()));
                }
            }
            if inflight.is_empty() {
                if finished {
                    break;
                }
                // Other nodes may fail and give work back.
                let _ =
                    tokio::time::timeout(Duration::from_millis(200), self.wake.notified()).await;
                continue;
            }
            match ch.channel.recv_as(NodeResponse::decode).await {
                Ok(NodeResponse::TaskDone(r)) => {
                    let f = r.task as usize;
                    if !inflight.remove(&f) {
                        continue;
                    }
                    report.tasks += 1;
                    report.busy_seconds += r.micros as f64 / 1e6;
                    let mut s = self.sched.lock().expect("sched lock");
                    let node_side = r.error.as_ref().is_some_and(|e| e.retryable);
                    if node_side {
                        let why = r
                            .error
                            .as_ref()
                            .map(|e| e.message.clone())
                            .unwrap_or_default();
                        s.requeue(f, self.n, &why);
                    } else {
                        let rep = self.report(f, *r);
                        s.finish(f, rep);
                    }
                    drop(s);
                    self.wake.notify_waiters();
                }
                Ok(_) => {}
                Err(e) => return Err((e, inflight.into_iter().collect())),
            }
        }
        let _ = ch.channel.send(NodeRequest::RunEnd.encode()).await;
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            while let Ok(r) = ch.channel.recv().await {
                if matches!(NodeResponse::decode(&r), Ok(NodeResponse::RunDone)) {
                    break;
                }
            }
        })
        .await;
        Ok(())
    }

    fn report(&self, f: usize, r: TaskResult) -> TaskReport {
        TaskReport {
            path: self.files[f].path.clone(),
            node: self.access.node.clone(),
            exit: r.exit,
            signal: r.signal,
            stdout: String::from_utf8_lossy(&r.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&r.stderr).into_owned(),
            truncated: r.truncated,
            seconds: r.micros as f64 / 1e6,
            outputs: r.outputs,
            error: r.error.map(|e| e.message),
            attempts: 0,
        }
    }
}

/// An open run on a storage node: `Task`s go out on `channel`, `TaskDone`s come back.
struct RunChannel {
    channel: ServiceChannel,
    slots: u32,
}

/// Opens a run of `spec` on `peer` (a storage node).
async fn start_run(
    peer: &Peer,
    spec: RunSpec,
    tls: Option<&transfer::conn::ClientTls>,
) -> Result<RunChannel, TransferError> {
    let mut channel = ServiceChannel::open(peer, tls).await?;
    channel
        .send(NodeRequest::Run(Box::new(spec)).encode())
        .await?;
    match channel.recv_as(NodeResponse::decode).await? {
        NodeResponse::RunReady { user, slots } => {
            tracing::debug!(node = %peer, %user, slots, "run open");
            Ok(RunChannel { channel, slots })
        }
        other => Err(TransferError::protocol(format!(
            "unexpected answer to a run: {other:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sched(holders: Vec<Vec<usize>>, nodes: usize) -> Sched {
        let n = holders.len();
        let mut queues = vec![VecDeque::new(); nodes];
        for (f, h) in holders.iter().enumerate() {
            for &x in h {
                queues[x].push_back(f);
            }
        }
        Sched {
            done: tokio::sync::mpsc::unbounded_channel().0,
            state: vec![State::Waiting; n],
            failed: vec![HashSet::new(); n],
            holders,
            queues,
            dead: vec![false; nodes],
            open: n,
            reports: (0..n)
                .map(|f| TaskReport {
                    path: format!("/f{f}"),
                    ..Default::default()
                })
                .collect(),
        }
    }

    #[test]
    fn a_file_runs_once_even_when_several_nodes_hold_it() {
        let mut s = sched(vec![vec![0, 1], vec![0, 1]], 2);
        assert_eq!(s.pick(0), Some(0));
        assert_eq!(s.pick(1), Some(1));
        assert_eq!(s.pick(0), None);
        assert_eq!(s.pick(1), None);
    }

    #[test]
    fn tasks_of_a_failed_node_move_to_another_holder() {
        let mut s = sched(vec![vec![0, 1], vec![0]], 2);
        assert_eq!(s.pick(0), Some(0));
        assert_eq!(s.pick(0), Some(1));
        s.requeue(0, 0, "lost");
        s.requeue(1, 0, "lost");
        s.node_failed(0, "n0", "lost");
        // File 0 has another holder; file 1 had none and fails with the reason.
        assert_eq!(s.pick(1), Some(0));
        assert_eq!(s.state[1], State::Done);
        assert!(s.reports[1].error.as_ref().unwrap().contains("lost"));
        assert_eq!(s.reports[0].attempts, 2);
        assert_eq!(s.open, 1);
    }

    #[test]
    fn a_dead_node_is_never_given_work_again() {
        let mut s = sched(vec![vec![0, 1]], 2);
        s.node_failed(1, "n1", "down");
        assert_eq!(s.pick(0), Some(0));
        s.requeue(0, 0, "replica missing");
        // Neither node may run it now.
        assert_eq!(s.state[0], State::Done);
    }
}
