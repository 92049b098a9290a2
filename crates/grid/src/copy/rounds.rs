//! The copy loop every grid copy shares, written once: a copy runs in rounds; each round
//! plans data sessions for the files still to copy (which node, which capability), runs them
//! side by side (at most `max_sessions` at once, each with its own stall watch), and settles
//! what each did: files done, files to try again (on another node or replica), files failed.
//! What differs between an upload, a download and a copy within the grid is only how a round is
//! planned and settled: the [`Rounds`] each of them implements.
//!
//! Between rounds the rule of a standalone copy's attempts holds: work that goes to another
//! node (a failover, [`Tally::fail_over`]) goes at once; work tried again where it failed waits
//! the retry policy's back-off first (1 s, 2 s, ... by default), announced with its delay.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use transfer::TransferError;
use transfer::attempt::{self, StallWatch};
use transfer::client::{Attempt, AttemptContext, CopyReport, FileReport};
use transfer::progress::{Counters, Event, EventSender};
use wire::checksum::Digest;
use wire::error::ErrorKind as K;

use super::GridOptions;

/// One data session's worth of work and its outcome.
pub(super) struct SessionResult {
    pub node: String,
    pub result: Result<Attempt, TransferError>,
    /// Names (as announced) the destination confirmed, with their digests.
    pub done: HashMap<String, (u64, Vec<Digest>)>,
    /// Names that failed, with why.
    pub failed: HashMap<String, TransferError>,
    /// Names that failed because the node's disk is full (the upload places them elsewhere).
    pub no_space: HashSet<String>,
}

impl SessionResult {
    /// The session's error, when it failed as a whole.
    pub fn error(&self) -> Option<&TransferError> {
        self.result.as_ref().err()
    }

    /// The session failed because its node could not be reached or stopped answering: the
    /// node gets no more of this copy's files.
    pub fn node_unreachable(&self) -> bool {
        self.error()
            .is_some_and(|e| matches!(e.kind(), K::Connect | K::Unavailable | K::Stalled))
    }
}

/// One session a round planned: the node (or `from->to` pair) it talks to, the names the
/// session's events use for its files, and the work itself.
pub(super) struct Planned<J> {
    pub node: String,
    pub names: Vec<String>,
    pub job: J,
}

/// How one kind of grid copy plans and settles its rounds.
pub(super) trait Rounds {
    /// A file still to copy, carried from one round to the next.
    type File;
    /// One session's work.
    type Job;

    /// The copy's options.
    fn opts(&self) -> &GridOptions;

    /// Rounds at most: a file not done after them has failed.
    fn max_rounds(&self) -> u32 {
        self.opts().copy.retry.max_attempts.max(1)
    }

    /// Plans this round's sessions for `todo`. Files that cannot be planned are settled in
    /// `tally` here. An error ends the copy.
    async fn plan(
        &mut self,
        round: u32,
        todo: Vec<Self::File>,
        tally: &mut Tally,
    ) -> Result<Vec<Planned<Self::Job>>, TransferError>;

    /// Runs one planned session, with `node` (as planned).
    async fn run(
        &self,
        node: &str,
        job: &Self::Job,
        ctx: AttemptContext,
    ) -> Result<Attempt, TransferError>;

    /// Settles what one session did: files done into `tally`, files to try again into `todo`.
    fn settle(
        &mut self,
        round: u32,
        job: Self::Job,
        session: SessionResult,
        tally: &mut Tally,
        todo: &mut Vec<Self::File>,
    );

    /// After every session of a round is settled (e.g. unfinished uploads are aborted).
    async fn end_round(&mut self) {}

    /// Files still to do when the rounds ran out.
    fn give_up(&mut self, _rounds: u32, _left: Vec<Self::File>, _tally: &mut Tally) {}
}

/// Runs `plan`'s rounds over `todo` until nothing is left to do, the rounds run out, or the
/// copy is cancelled (an error then), and reports the copy from `source` to `destination`.
pub(super) async fn run_rounds<P: Rounds>(
    plan: &mut P,
    mut todo: Vec<P::File>,
    runner: &Runner,
    mut tally: Tally,
    (source, destination): (String, String),
) -> Result<CopyReport, TransferError> {
    let max_rounds = plan.max_rounds();
    for round in 1..=max_rounds {
        if runner.cancel.is_cancelled() {
            return Err(TransferError::interrupted());
        }
        if todo.is_empty() {
            break;
        }
        tally.attempts = round;
        let sessions = plan
            .plan(round, std::mem::take(&mut todo), &mut tally)
            .await?;
        let results = {
            let plan = &*plan;
            run_bounded(
                sessions
                    .iter()
                    .enumerate()
                    .map(|(i, s)| async move {
                        let r = runner
                            .session(s.node.clone(), s.names.clone(), |ctx| {
                                plan.run(&s.node, &s.job, ctx)
                            })
                            .await;
                        (i, r)
                    })
                    .collect(),
                plan.opts().max_sessions,
            )
            .await
        };
        let mut sessions: Vec<Option<Planned<P::Job>>> = sessions.into_iter().map(Some).collect();
        // In the order the sessions ended.
        for (i, r) in results {
            let s = sessions[i].take().expect("each session settles once");
            if let Ok(a) = &r.result {
                tally.session(a);
            }
            plan.settle(round, s.job, r, &mut tally, &mut todo);
        }
        plan.end_round().await;
        if runner.cancel.is_cancelled() {
            return Err(TransferError::interrupted());
        }
        let failed_over = std::mem::take(&mut tally.failed_over);
        if !todo.is_empty() && round < max_rounds && !failed_over {
            // Tried again where it failed: after the back-off, as a standalone copy waits.
            let reason = tally
                .retry_reason
                .take()
                .or_else(|| tally.failed.values().next().map(|e| e.to_string()))
                .unwrap_or_else(|| "files to try again".into());
            let retry = &plan.opts().copy.retry;
            attempt::back_off(retry, round, reason, &runner.events, &runner.cancel).await?;
        }
    }
    if !todo.is_empty() {
        plan.give_up(max_rounds, todo, &mut tally);
    }
    tally.report(
        source,
        destination,
        plan.opts(),
        &runner.total,
        &runner.events,
    )
}

/// Runs sessions side by side, each with its own counters (summed into `total` for progress)
/// and its own stall watch, and collects what each did.
pub(super) struct Runner {
    total: Arc<Counters>,
    parts: Arc<Mutex<Vec<Arc<Counters>>>>,
    /// Bytes of sessions that have ended (their counters are dropped from `parts`).
    /// Ended sessions' bytes done, bytes sent and files done.
    settled: Arc<Mutex<(u64, u64, u64)>>,
    events: EventSender,
    cancel: CancellationToken,
    stall: Duration,
}

impl Runner {
    pub fn new(
        total: Arc<Counters>,
        events: EventSender,
        cancel: CancellationToken,
        opts: &GridOptions,
    ) -> Self {
        let r = Self {
            total,
            parts: Arc::default(),
            settled: Arc::default(),
            events,
            cancel,
            stall: Duration::from_millis(opts.copy.session.stall_timeout_ms.max(1000)),
        };
        let (parts, settled, total, cancel) = (
            r.parts.clone(),
            r.settled.clone(),
            r.total.clone(),
            r.cancel.clone(),
        );
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = cancel.cancelled() => return,
                }
                sum_into(&parts, &settled, &total);
                if Arc::strong_count(&parts) == 1 {
                    return;
                }
            }
        });
        r
    }

    /// Runs one session: `run` gets fresh counters, an event channel and a cancel token.
    async fn session<F, Fut>(&self, node: String, names: Vec<String>, run: F) -> SessionResult
    where
        F: FnOnce(AttemptContext) -> Fut,
        Fut: std::future::Future<Output = Result<Attempt, TransferError>>,
    {
        let counters = Arc::new(Counters::default());
        self.parts.lock().expect("parts").push(counters.clone());
        let mut done = HashMap::new();
        let mut failed = HashMap::new();
        let mut no_space = HashSet::new();
        let watch = StallWatch {
            timeout: self.stall,
            progress: StallWatch::bytes_or_frames,
            subject: format!("node {node}: "),
        };
        let result = attempt::watched(counters.clone(), &self.cancel, &watch, run, |ev| {
            self.note(ev, &mut done, &mut failed, &mut no_space)
        })
        .await;
        // This session's bytes stay in the total.
        {
            let mut parts = self.parts.lock().expect("parts");
            parts.retain(|c| !Arc::ptr_eq(c, &counters));
            let mut s = self.settled.lock().expect("settled");
            s.0 += Counters::get(&counters.bytes_done);
            s.1 += Counters::get(&counters.bytes_sent);
            s.2 += Counters::get(&counters.files_done);
        }
        sum_into(&self.parts, &self.settled, &self.total);
        // Files the session did not report are failed with the session's error.
        if let Err(e) = &result {
            for n in names {
                if !done.contains_key(&n) && !failed.contains_key(&n) {
                    failed.insert(n, e.clone());
                }
            }
        }
        SessionResult {
            node,
            result,
            done,
            failed,
            no_space,
        }
    }

    fn note(
        &self,
        ev: Event,
        done: &mut HashMap<String, (u64, Vec<Digest>)>,
        failed: &mut HashMap<String, TransferError>,
        no_space: &mut HashSet<String>,
    ) {
        match ev {
            Event::FileDone {
                path,
                size,
                digests,
                ..
            } => {
                failed.remove(&path);
                done.insert(path, (size, digests));
            }
            Event::FileFailed { path, error } => {
                if !done.contains_key(&path) {
                    if error.kind == K::NoSpace {
                        no_space.insert(path.clone());
                    }
                    failed.insert(path, error.into());
                }
            }
            // Node sessions name files by their spool names; the grid's file records start
            // when the file's session reports it.
            Event::Plan { .. } | Event::FileStarted { .. } => {}
            other => {
                let _ = self.events.send(other);
            }
        }
    }
}

fn sum_into(parts: &Mutex<Vec<Arc<Counters>>>, settled: &Mutex<(u64, u64, u64)>, total: &Counters) {
    let parts = parts.lock().expect("parts");
    let s = *settled.lock().expect("settled");
    let (mut done, mut sent, mut act, mut streams, mut files) = (s.0, s.1, 0, 0, s.2);
    for c in parts.iter() {
        done += Counters::get(&c.bytes_done);
        files += Counters::get(&c.files_done);
        sent += Counters::get(&c.bytes_sent);
        act += Counters::get(&c.activity);
        streams += Counters::get(&c.streams);
    }
    Counters::set(&total.bytes_done, done);
    Counters::set(&total.bytes_sent, sent);
    // The streams of the sessions in progress (a session's share leaves with it), and the
    // files the sessions have done (for the live reports; the tally keeps the outcomes).
    Counters::set(&total.streams, streams);
    Counters::set(&total.files_done, files);
    Counters::add(&total.activity, act.min(1));
}
async fn run_bounded<T, Fut>(jobs: Vec<Fut>, limit: usize) -> Vec<T>
where
    Fut: std::future::Future<Output = T>,
{
    use std::pin::Pin;
    let mut pending: Vec<Pin<Box<Fut>>> = jobs.into_iter().map(Box::pin).collect();
    pending.reverse();
    let mut running = Vec::new();
    let mut out = Vec::new();
    loop {
        while running.len() < limit.max(1) {
            match pending.pop() {
                Some(j) => running.push(j),
                None => break,
            }
        }
        if running.is_empty() {
            return out;
        }
        let (r, _, rest) = futures_select_all(running).await;
        out.push(r);
        running = rest;
    }
}

/// `futures::future::select_all` without the dependency: polls every future, returns the
/// first that finishes and the others.
async fn futures_select_all<Fut: std::future::Future + ?Sized>(
    mut futs: Vec<std::pin::Pin<Box<Fut>>>,
) -> (Fut::Output, usize, Vec<std::pin::Pin<Box<Fut>>>) {
    std::future::poll_fn(move |cx| {
        for i in 0..futs.len() {
            if let std::task::Poll::Ready(v) = futs[i].as_mut().poll(cx) {
                let rest = std::mem::take(&mut futs)
                    .into_iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .map(|(_, f)| f)
                    .collect();
                return std::task::Poll::Ready((v, i, rest));
            }
        }
        std::task::Poll::Pending
    })
    .await
}

/// Bookkeeping of a grid copy and its report.
pub(super) struct Tally {
    pub started: Instant,
    pub files: u64,
    pub bytes: u64,
    pub done: BTreeMap<String, FileReport>,
    pub failed: BTreeMap<String, TransferError>,
    pub attempts: u32,
    pub streams: u32,
    pub retransmits: u64,
    /// Blocks sent with recorded CRCs, never read (see [`CopyReport::blocks_unread`]).
    pub blocks_unread: u64,
    /// Congestion control switches of every session.
    pub cc_decisions: Vec<wire::losscause::Decision>,
    pub plan: String,
    /// This round moved work to other nodes: the next one starts at once.
    failed_over: bool,
    /// Why the next round tries work again where it failed (else the first failure says).
    retry_reason: Option<String>,
}

impl Tally {
    pub fn new() -> Self {
        Self {
            started: Instant::now(),
            files: 0,
            bytes: 0,
            done: BTreeMap::new(),
            failed: BTreeMap::new(),
            attempts: 1,
            streams: 0,
            retransmits: 0,
            blocks_unread: 0,
            cc_decisions: Vec::new(),
            plan: String::new(),
            failed_over: false,
            retry_reason: None,
        }
    }

    /// Why the next round tries work again on the same nodes, for the user.
    pub fn retry_because(&mut self, reason: String) {
        self.retry_reason.get_or_insert(reason);
    }

    /// The next round works around a node (`reason` says which and why): it starts at once,
    /// and the user is told.
    pub fn fail_over(&mut self, events: &EventSender, round: u32, reason: String) {
        self.failed_over = true;
        let _ = events.send(Event::Retrying {
            attempt: round + 1,
            delay_ms: 0,
            reason,
        });
    }

    /// Sets the copy's size: `files` files, `bytes` bytes (also for the progress display).
    pub fn count(&mut self, files: u64, bytes: u64, counters: &Counters) {
        self.files = files;
        self.bytes = bytes;
        Counters::set(&counters.total_bytes, bytes);
        Counters::set(&counters.total_files, files);
    }

    /// `path` arrived (through `node`, when a node moved it).
    pub fn ok(
        &mut self,
        path: &str,
        node: Option<&str>,
        bytes: u64,
        digests: &[Digest],
        events: &EventSender,
    ) {
        self.failed.remove(path);
        self.done.insert(
            path.to_string(),
            FileReport {
                path: path.to_string(),
                bytes,
                checksums: digests
                    .iter()
                    .map(|d| (d.algorithm.to_string(), d.hex()))
                    .collect(),
                skipped: false,
                node: node.map(str::to_string),
            },
        );
        let _ = events.send(Event::FileDone {
            path: path.to_string(),
            size: bytes,
            digests: digests.to_vec(),
            skipped: false,
        });
    }

    pub fn fail(&mut self, path: &str, e: TransferError) {
        if !self.done.contains_key(path) {
            self.failed.insert(path.to_string(), e);
        }
    }

    pub fn session(&mut self, a: &Attempt) {
        self.streams = self.streams.max(a.source.streams.max(a.sink.streams));
        self.retransmits += a.source.tcp_retransmits;
        self.blocks_unread += a.blocks_unread;
        self.cc_decisions
            .extend(a.source.cc_decisions.iter().cloned());
        if self.plan.is_empty() {
            self.plan = a.plan.clone();
        }
    }

    /// Announces every failed file on `events` and builds the copy's report.
    pub fn report(
        self,
        src: String,
        dst: String,
        opts: &GridOptions,
        counters: &Counters,
        events: &EventSender,
    ) -> Result<CopyReport, TransferError> {
        for (p, e) in &self.failed {
            let _ = events.send(Event::FileFailed {
                path: p.clone(),
                error: e.to_info(),
            });
        }
        let seconds = self.started.elapsed().as_secs_f64();
        let failures = self
            .failed
            .iter()
            .map(|(p, e)| transfer::error::FileFailure {
                path: p.clone(),
                error: e.into(),
            })
            .collect();
        let first = self.failed.values().next().cloned();
        let moved = Counters::get(&counters.bytes_sent).max(Counters::get(&counters.bytes_done));
        let report = CopyReport {
            source: src,
            destination: dst,
            bytes_total: self.bytes,
            bytes_moved: moved,
            bytes_skipped: 0,
            // Every round's sessions add to the same counters.
            bytes_moved_total: moved,
            bytes_resent: moved.saturating_sub(self.bytes),
            attempt_list: Vec::new(),
            files: self.files,
            files_failed: self.failed.len() as u64,
            seconds,
            mbit_per_s: self.bytes as f64 * 8.0 / seconds.max(1e-9) / 1e6,
            streams: self.streams,
            attempts: self.attempts,
            retries: self.attempts - 1,
            blocks_resent: 0,
            streams_lost: 0,
            plan: self.plan,
            congestion: String::new(),
            cc_decisions: self.cc_decisions,
            protect: format!("{:?}", opts.copy.session.protect).to_lowercase(),
            tcp_retransmits: self.retransmits,
            zero_copy: None,
            checksums: opts
                .copy
                .session
                .checksums
                .iter()
                .map(|c| c.to_string())
                .collect(),
            file_list: self.done.into_values().collect(),
            failures,
            // Grid copies run many node sessions at once; no one session's evidence is the
            // copy's (not reported yet).
            bottleneck: None,
            first_failure: first.as_ref().map(|e| e.to_info()),
            blocks_unread: self.blocks_unread,
        };
        // Nothing copied at all: the first reason is the command's error.
        if report.files_failed > 0 && report.files_failed == report.files {
            return Err(first.expect("a failure"));
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    //! The round loop on its own, with a fake copy whose sessions fail or succeed by node.
    use super::*;
    use tokio::sync::mpsc;
    use transfer::client::CopyOptions;

    fn options(max_attempts: u32) -> GridOptions {
        GridOptions {
            copy: CopyOptions {
                recursive: false,
                range: None,
                session: Default::default(),
                retry: wire::retry::RetryPolicy {
                    max_attempts,
                    initial_delay: Duration::from_millis(30),
                    max_delay: Duration::from_millis(60),
                },
                tls: None,
                link_bps: 1_000_000_000,
                checkpoint_interval: Duration::from_secs(5),
                control_pool: None,
                peer_tls: Vec::new(),
                zero_copy: false,
                trace: None,
                receiver_evidence: false,
            },
            site: None,
            overwrite: false,
            max_sessions: 2,
            dest_is_name: false,
            source_crcs: None,
        }
    }

    /// Files are named by number; each has a list of nodes to try in turn. Sessions to a node
    /// in `down` fail as a whole (unreachable); others confirm every file they carry.
    struct Fake {
        opts: GridOptions,
        events: EventSender,
        down: HashSet<&'static str>,
        /// Failed sessions' files go back to the same node (no failing over).
        stubborn: bool,
        planned: Vec<usize>,
        ended_rounds: u32,
        gave_up: Vec<u32>,
    }

    /// A file: its name and the nodes it may go to, the one in use first.
    type FakeFile = (u32, Vec<&'static str>);

    impl Rounds for Fake {
        type File = FakeFile;
        type Job = (&'static str, Vec<FakeFile>);

        fn opts(&self) -> &GridOptions {
            &self.opts
        }

        async fn plan(
            &mut self,
            _round: u32,
            todo: Vec<FakeFile>,
            _tally: &mut Tally,
        ) -> Result<Vec<Planned<Self::Job>>, TransferError> {
            self.planned.push(todo.len());
            let mut by_node: BTreeMap<&'static str, Vec<FakeFile>> = BTreeMap::new();
            for f in todo {
                by_node.entry(f.1[0]).or_default().push(f);
            }
            Ok(by_node
                .into_iter()
                .map(|(node, files)| Planned {
                    node: node.to_string(),
                    names: files.iter().map(|f| f.0.to_string()).collect(),
                    job: (node, files),
                })
                .collect())
        }

        async fn run(
            &self,
            node: &str,
            job: &Self::Job,
            ctx: AttemptContext,
        ) -> Result<Attempt, TransferError> {
            assert_eq!(node, job.0, "the node a session was planned for");
            if self.down.contains(job.0) {
                return Err(TransferError::connect(format!("{} is down", job.0)));
            }
            for f in &job.1 {
                Counters::add(&ctx.counters.bytes_sent, 10);
                let _ = ctx.events.send(Event::FileDone {
                    path: f.0.to_string(),
                    size: 10,
                    digests: vec![],
                    skipped: false,
                });
            }
            Ok(Attempt::default())
        }

        fn settle(
            &mut self,
            round: u32,
            job: Self::Job,
            r: SessionResult,
            tally: &mut Tally,
            todo: &mut Vec<FakeFile>,
        ) {
            for (name, mut nodes) in job.1 {
                let path = name.to_string();
                if let Some((size, d)) = r.done.get(&path) {
                    tally.ok(&path, None, *size, d, &self.events);
                    continue;
                }
                let e = r.failed[&path].clone();
                tally.fail(&path, e);
                if self.stubborn {
                    todo.push((name, nodes));
                } else if r.node_unreachable() && nodes.len() > 1 {
                    nodes.remove(0);
                    todo.push((name, nodes));
                    tally.fail_over(&self.events, round, format!("{} failed", job.0));
                }
            }
        }

        async fn end_round(&mut self) {
            self.ended_rounds += 1;
        }

        fn give_up(&mut self, rounds: u32, left: Vec<FakeFile>, tally: &mut Tally) {
            self.gave_up.push(rounds);
            for (name, _) in left {
                tally.fail(&name.to_string(), TransferError::connect("gave up"));
            }
        }
    }

    fn fake(
        max_attempts: u32,
        down: &[&'static str],
        stubborn: bool,
    ) -> (Fake, Runner, Arc<Counters>) {
        let (plan, runner, counters, _rx) = fake_with_events(max_attempts, down, stubborn);
        (plan, runner, counters)
    }

    fn fake_with_events(
        max_attempts: u32,
        down: &[&'static str],
        stubborn: bool,
    ) -> (Fake, Runner, Arc<Counters>, mpsc::UnboundedReceiver<Event>) {
        let (events, rx) = mpsc::unbounded_channel();
        let counters = Arc::new(Counters::default());
        let opts = options(max_attempts);
        let runner = Runner::new(
            counters.clone(),
            events.clone(),
            CancellationToken::new(),
            &opts,
        );
        let plan = Fake {
            opts,
            events,
            down: down.iter().copied().collect(),
            stubborn,
            planned: vec![],
            ended_rounds: 0,
            gave_up: vec![],
        };
        (plan, runner, counters, rx)
    }

    /// The `Retrying` events a copy sent: (attempt, delay in ms).
    fn retries(rx: &mut mpsc::UnboundedReceiver<Event>) -> Vec<(u32, u64)> {
        let mut out = Vec::new();
        while let Ok(ev) = rx.try_recv() {
            if let Event::Retrying {
                attempt, delay_ms, ..
            } = ev
            {
                out.push((attempt, delay_ms));
            }
        }
        out
    }

    fn tally(files: u64, counters: &Counters) -> Tally {
        let mut t = Tally::new();
        t.count(files, files * 10, counters);
        t
    }

    /// Copies `todo` (`files` files of 10 bytes) with the fake's rounds.
    async fn copy(
        plan: &mut Fake,
        runner: &Runner,
        counters: &Counters,
        todo: Vec<FakeFile>,
        files: u64,
    ) -> Result<CopyReport, TransferError> {
        run_rounds(
            plan,
            todo,
            runner,
            tally(files, counters),
            ("s".into(), "d".into()),
        )
        .await
    }

    #[tokio::test]
    async fn files_of_a_failed_node_move_to_the_next_in_the_next_round() {
        let (mut plan, runner, counters) = fake(3, &["bad"], false);
        let todo = vec![
            (1, vec!["bad", "good"]),
            (2, vec!["good"]),
            (3, vec!["bad", "other"]),
        ];
        let report = copy(&mut plan, &runner, &counters, todo, 3).await.unwrap();
        assert_eq!(
            plan.planned,
            vec![3, 2],
            "round 2 carries the two files of the failed node"
        );
        assert_eq!(plan.ended_rounds, 2);
        assert!(plan.gave_up.is_empty());
        assert_eq!(
            (report.files, report.files_failed, report.attempts),
            (3, 0, 2)
        );
        let done: Vec<&str> = report.file_list.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(done, ["1", "2", "3"]);
        assert_eq!(Counters::get(&counters.bytes_sent), 30);
    }

    #[tokio::test]
    async fn files_left_when_the_rounds_run_out_fail_and_the_rest_is_reported() {
        let (mut plan, runner, counters) = fake(3, &["bad"], true);
        let todo = vec![(1, vec!["bad"]), (2, vec!["good"])];
        let report = copy(&mut plan, &runner, &counters, todo, 2).await.unwrap();
        assert_eq!(plan.planned, vec![2, 1, 1]);
        assert_eq!(plan.gave_up, vec![3]);
        assert_eq!((report.files_failed, report.attempts), (1, 3));
        assert_eq!(report.failures[0].path, "1");
    }

    /// Work that fails over goes at once; work tried again where it failed waits the retry
    /// policy's back-off (30 ms, then 60 ms here), announced with its delay.
    #[tokio::test]
    async fn a_failover_goes_at_once_and_a_retry_in_place_waits_the_back_off() {
        let (mut plan, runner, counters, mut rx) = fake_with_events(3, &["bad"], false);
        let todo = vec![(1, vec!["bad", "good"])];
        copy(&mut plan, &runner, &counters, todo, 1).await.unwrap();
        assert_eq!(retries(&mut rx), [(2, 0)]);

        let (mut plan, runner, counters, mut rx) = fake_with_events(3, &["bad"], true);
        let todo = vec![(1, vec!["bad"])];
        let started = Instant::now();
        let _ = copy(&mut plan, &runner, &counters, todo, 1).await;
        assert_eq!(retries(&mut rx), [(2, 30), (3, 60)]);
        assert!(
            started.elapsed() >= Duration::from_millis(90),
            "the back-off was waited"
        );
    }

    #[tokio::test]
    async fn nothing_copied_is_the_first_failure() {
        let (mut plan, runner, counters) = fake(2, &["bad"], false);
        let todo = vec![(1, vec!["bad"])];
        let e = copy(&mut plan, &runner, &counters, todo, 1)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), K::Connect);
        assert_eq!(plan.planned, vec![1]);
    }

    #[tokio::test]
    async fn a_cancelled_copy_is_interrupted_before_the_next_round() {
        let (mut plan, runner, counters) = fake(3, &[], false);
        runner.cancel.cancel();
        let todo = vec![(1, vec!["good"])];
        let e = copy(&mut plan, &runner, &counters, todo, 1)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), K::Cancelled);
        assert!(plan.planned.is_empty());
    }
}
