//! Group commit of replica reports. A node tells the metadata server of every file it has
//! received and verified before the file's sender hears it is done. With one call per file,
//! a session across a long link was held to (file-op threads / round trip) files per second,
//! and the catalog paid one transaction per file. Here a report that finds a free call slot
//! goes at once (a lone file waits no longer than before), and reports that arrive while the
//! slots are busy wait and go together: one `ReplicasWritten` call and one catalog
//! transaction for up to [`MAX_GROUP`] files.
//!
//! The queue and its pump know nothing of gRPC: they take the call as a function, so the
//! grouping is tested here without a server.

use api::meta as pb;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{Notify, Semaphore};
use transfer::service::Settled;
use wire::error::{ErrorInfo, ErrorKind};

/// Reports one call carries at most (the metadata server refuses more). Each replica is one
/// savepoint of the catalog's transaction, and PostgreSQL keeps at most 64 subtransactions
/// of a transaction in its cache (more slow every other session's snapshots while it runs).
/// With 4 calls in flight this still reports 6,400 files/s across a 40 ms link.
pub const MAX_GROUP: usize = 64;

/// Calls in flight at once: enough that reports keep flowing while a group is answered, few
/// enough that reports wait and group under load.
pub const CALLS_IN_FLIGHT: usize = 4;

/// The outcome of one call: one result per report, in order, or the call's own failure.
pub type GroupResult = Result<Vec<Result<(), ErrorInfo>>, ErrorInfo>;

/// Sends one group of reports to the metadata server.
pub type SendGroup = Arc<
    dyn Fn(Vec<pb::WrittenReplica>) -> Pin<Box<dyn Future<Output = GroupResult> + Send>>
        + Send
        + Sync,
>;

/// A report waiting for its group's answer. Dropped unanswered (the node is stopping), it
/// tells its session so, which never waits forever.
struct Report {
    replica: pb::WrittenReplica,
    done: Option<Settled>,
}

impl Report {
    fn settle(mut self, r: Result<(), ErrorInfo>) {
        if let Some(done) = self.done.take() {
            done(r);
        }
    }
}

impl Drop for Report {
    fn drop(&mut self) {
        if let Some(done) = self.done.take() {
            done(Err(ErrorInfo::new(
                ErrorKind::Connect,
                "the node stopped before the metadata server confirmed the replica",
            )
            .retryable(true)));
        }
    }
}

/// The queue of reports waiting for a call slot.
pub struct Reporter {
    queue: Mutex<VecDeque<Report>>,
    wake: Notify,
    /// The pump has stopped (its runtime is shutting down): reports are settled at once.
    closed: AtomicBool,
}

/// Closes the reporter when its pump stops, however it stops (the runtime may drop it
/// mid-wait): what is queued then, and what comes later, is settled with an error rather than
/// left waiting for ever.
struct ClosesOnStop(std::sync::Weak<Reporter>);

impl Drop for ClosesOnStop {
    fn drop(&mut self) {
        if let Some(r) = self.0.upgrade() {
            r.closed.store(true, Ordering::SeqCst);
            let stranded: Vec<Report> = r.queue.lock().expect("report queue").drain(..).collect();
            drop(stranded);
        }
    }
}

impl Reporter {
    /// Starts the pump on the current runtime: it sends through `send`, at most
    /// `in_flight` calls at once, each of at most `max_group` reports.
    pub fn start(send: SendGroup, in_flight: usize, max_group: usize) -> Arc<Self> {
        let r = Arc::new(Self {
            queue: Mutex::new(VecDeque::new()),
            wake: Notify::new(),
            closed: AtomicBool::new(false),
        });
        // The guard is the pump's argument, not one of its locals: a task dropped before its
        // first poll (the runtime shutting down at once) drops it too.
        tokio::spawn(pump(
            ClosesOnStop(Arc::downgrade(&r)),
            send,
            Arc::new(Semaphore::new(in_flight.max(1))),
            max_group.max(1),
        ));
        r
    }

    /// Queues a report; `done` is called once with its outcome, on a blocking thread.
    pub fn report(&self, replica: pb::WrittenReplica, done: Settled) {
        let report = Report {
            replica,
            done: Some(done),
        };
        {
            let mut q = self.queue.lock().expect("report queue");
            // (Checked under the lock the pump's end drains with: nothing is queued after.)
            if !self.closed.load(Ordering::SeqCst) {
                q.push_back(report);
                drop(q);
                self.wake.notify_one();
                return;
            }
        }
        drop(report);
    }

    fn take(&self, max: usize) -> Vec<Report> {
        let mut q = self.queue.lock().expect("report queue");
        let n = q.len().min(max);
        q.drain(..n).collect()
    }
}

/// Takes a call slot, then the reports waiting (at most `max_group`), and sends them; stops
/// when the reporter is gone.
async fn pump(closes: ClosesOnStop, send: SendGroup, slots: Arc<Semaphore>, max_group: usize) {
    let reporter = closes.0.clone();
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let group = loop {
            let Some(r) = reporter.upgrade() else {
                return;
            };
            let group = {
                let waiting = r.wake.notified();
                tokio::pin!(waiting);
                waiting.as_mut().enable();
                let group = r.take(max_group);
                if group.is_empty() {
                    // The reporter may go while nothing waits: look again now and then.
                    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), waiting).await;
                }
                group
            };
            if !group.is_empty() {
                break group;
            }
        };
        let send = send.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let replicas: Vec<pb::WrittenReplica> =
                group.iter().map(|r| r.replica.clone()).collect();
            let n = replicas.len();
            let answer = send(replicas).await;
            // The sessions' callbacks take locks and may remove files: off the runtime.
            let _ = tokio::task::spawn_blocking(move || settle(group, answer, n)).await;
        });
    }
}

fn settle(group: Vec<Report>, answer: GroupResult, sent: usize) {
    match answer {
        Ok(results) if results.len() == sent => {
            for (report, r) in group.into_iter().zip(results) {
                report.settle(r);
            }
        }
        Ok(results) => {
            let e = ErrorInfo::new(
                ErrorKind::Integrity,
                format!(
                    "the metadata server answered {} results for {sent} replica reports",
                    results.len()
                ),
            );
            for report in group {
                report.settle(Err(e.clone()));
            }
        }
        Err(e) => {
            for report in group {
                report.settle(Err(e.clone()));
            }
        }
    }
}

/// The error a file's report gets from the metadata server's per-replica answer.
pub fn refused(e: &pb::FileError) -> ErrorInfo {
    let kind = match ErrorKind::from_name(&e.code) {
        Some(ErrorKind::NotFound) => ErrorKind::NotFound,
        Some(ErrorKind::Connect | ErrorKind::Unavailable) => ErrorKind::Connect,
        Some(ErrorKind::PermissionDenied | ErrorKind::Authentication | ErrorKind::Unmapped) => {
            ErrorKind::PermissionDenied
        }
        _ => ErrorKind::Integrity,
    };
    ErrorInfo::new(
        kind,
        format!("metadata server refused the replica: {}", e.message),
    )
    .retryable(kind == ErrorKind::Connect)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    fn replica(id: i64) -> pb::WrittenReplica {
        pb::WrittenReplica {
            id,
            size: id as u64,
            checksum: String::new(),
            mtime_ns: 0,
        }
    }

    /// Queues `n` reports and waits for all their outcomes (by id).
    async fn report_all(
        r: &Reporter,
        ids: std::ops::Range<i64>,
    ) -> Vec<(i64, Result<(), ErrorInfo>)> {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let n = ids.end - ids.start;
        for id in ids {
            let tx = tx.clone();
            r.report(replica(id), Box::new(move |res| drop(tx.send((id, res)))));
        }
        let mut out = Vec::new();
        for _ in 0..n {
            let got = tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await
                .expect("every report is settled")
                .unwrap();
            out.push(got);
        }
        out.sort_by_key(|(id, _)| *id);
        out
    }

    /// Reports that arrive while the only call slot is busy go together in the next call;
    /// each gets its own result (odd ids refused here), in order.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reports_waiting_for_a_slot_go_in_one_call_with_their_own_results() {
        let groups = Arc::new(Mutex::new(Vec::<Vec<i64>>::new()));
        let seen = groups.clone();
        let send: SendGroup = Arc::new(move |g: Vec<pb::WrittenReplica>| {
            seen.lock().unwrap().push(g.iter().map(|r| r.id).collect());
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                Ok(g.iter()
                    .map(|r| {
                        if r.id % 2 == 1 {
                            Err(ErrorInfo::new(ErrorKind::NotFound, format!("{}", r.id)))
                        } else {
                            Ok(())
                        }
                    })
                    .collect())
            })
        });
        let r = Reporter::start(send, 1, 8);
        let out = report_all(&r, 0..20).await;
        for (id, res) in &out {
            match res {
                Ok(()) => assert_eq!(id % 2, 0),
                Err(e) => {
                    assert_eq!(id % 2, 1);
                    assert_eq!(e.message, id.to_string());
                }
            }
        }
        let groups = groups.lock().unwrap().clone();
        // The first report found the slot free and went alone; the rest waited and went in
        // groups of at most 8, in the order they came.
        assert!(groups.len() <= 4, "{groups:?}");
        assert!(groups.iter().all(|g| g.len() <= 8), "{groups:?}");
        assert_eq!(groups.concat(), (0..20).collect::<Vec<_>>());
        assert!(groups.iter().skip(1).any(|g| g.len() > 1), "{groups:?}");
    }

    /// A failed call fails each of its reports with the call's error; an answer with the wrong
    /// number of results fails them all; later calls still go.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_or_malformed_call_fails_its_reports_and_the_next_goes() {
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let send: SendGroup = Arc::new(move |g: Vec<pb::WrittenReplica>| {
            let call = c.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                match call {
                    0 => Err(ErrorInfo::new(ErrorKind::Connect, "server away").retryable(true)),
                    1 => Ok(vec![]),
                    _ => Ok(g.iter().map(|_| Ok(())).collect()),
                }
            })
        });
        let r = Reporter::start(send, 1, MAX_GROUP);
        let first = report_all(&r, 0..1).await;
        let e = first[0].1.as_ref().unwrap_err();
        assert_eq!(e.kind, ErrorKind::Connect);
        assert!(e.retryable);
        let second = report_all(&r, 1..2).await;
        assert_eq!(second[0].1.as_ref().unwrap_err().kind, ErrorKind::Integrity);
        let third = report_all(&r, 2..5).await;
        assert!(third.iter().all(|(_, r)| r.is_ok()));
    }

    /// Once the pump has stopped (its runtime shut down), reports waiting in the queue and
    /// reports made later are settled with an error at once: none waits for ever.
    #[test]
    fn reports_after_the_pump_stopped_are_settled_at_once() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let send: SendGroup = Arc::new(|g: Vec<pb::WrittenReplica>| {
            Box::pin(async move { Ok(g.iter().map(|_| Ok(())).collect()) })
        });
        let r = rt.block_on(async { Reporter::start(send, 1, MAX_GROUP) });
        drop(rt);
        let (tx, rx) = std::sync::mpsc::channel();
        r.report(replica(1), Box::new(move |res| drop(tx.send(res))));
        let e = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("settled")
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Connect);
    }

    /// A report the node never sent (it stopped) still tells its session.
    #[test]
    fn a_dropped_report_tells_its_session() {
        let (tx, rx) = std::sync::mpsc::channel();
        drop(Report {
            replica: replica(1),
            done: Some(Box::new(move |r| drop(tx.send(r)))),
        });
        let e = rx.recv().unwrap().unwrap_err();
        assert_eq!(e.kind, ErrorKind::Connect);
    }

    #[test]
    fn refusals_keep_their_kind_for_the_sender() {
        let e = |code: &str| pb::FileError {
            path: String::new(),
            code: code.into(),
            message: "why".into(),
        };
        assert_eq!(refused(&e("not_found")).kind, ErrorKind::NotFound);
        assert_eq!(
            refused(&e("permission_denied")).kind,
            ErrorKind::PermissionDenied
        );
        let away = refused(&e("unavailable"));
        assert_eq!(away.kind, ErrorKind::Connect);
        assert!(away.retryable);
        assert_eq!(refused(&e("invalid")).kind, ErrorKind::Integrity);
        assert_eq!(refused(&e("garbage")).kind, ErrorKind::Integrity);
        assert!(refused(&e("invalid")).message.contains("why"));
    }
}
