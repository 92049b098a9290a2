//! A client's copies and runs in progress, reported to the metadata server every few seconds
//! so that `haul transfers --live` and the dashboard list them with their progress, rate and
//! streams. Best effort, like the history: a server that does not answer costs the copy
//! nothing. A client that stops reporting (killed, or cut off) is dropped from the live list
//! by the server after 30 s and recorded in the history as abandoned.

use crate::client::MetaClient;
use api::meta as pb;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use transfer::progress::Counters;
use wire::error::ErrorKind;

/// The first report, after which a copy is listed: copies shorter than this are not.
const FIRST_REPORT: Duration = Duration::from_secs(1);
/// Between reports (the server drops a copy after 30 s without one).
const EVERY: Duration = Duration::from_secs(3);
/// How long one report may take, and the last one (the copy is over and waits for it).
const REPORT_TIMEOUT: Duration = Duration::from_secs(5);
const END_TIMEOUT: Duration = Duration::from_secs(2);

/// The figures of a report, read when it is sent.
pub type Figures = Box<dyn Fn() -> pb::LiveReport + Send + Sync>;

/// Figures from a transfer's counters.
pub fn from_counters(counters: Arc<Counters>) -> Figures {
    Box::new(move || pb::LiveReport {
        files_total: Counters::get(&counters.total_files),
        files_done: Counters::get(&counters.files_done),
        files_failed: Counters::get(&counters.files_failed),
        bytes_total: Counters::get(&counters.total_bytes),
        bytes_done: Counters::get(&counters.bytes_done),
        streams: Counters::get(&counters.streams).min(u32::MAX as u64) as u32,
        ..Default::default()
    })
}

/// Reports one copy until `finish`.
pub struct Reporter {
    stop: CancellationToken,
    /// Gives the ids the copy was listed under (a new one after the server forgot it).
    task: tokio::task::JoinHandle<Vec<i64>>,
}

/// Starts reporting a copy of `kind` from `source` to `destination`.
pub fn start(
    meta: &MetaClient,
    kind: &str,
    source: &str,
    destination: &str,
    figures: Figures,
) -> Reporter {
    let stop = CancellationToken::new();
    let (meta, s) = (meta.clone(), stop.clone());
    let (kind, source, destination) = (
        kind.to_string(),
        source.to_string(),
        destination.to_string(),
    );
    let task = tokio::spawn(async move {
        let mut id = 0i64;
        let mut ids = Vec::new();
        let report = |id: i64, ended: bool| pb::LiveReport {
            id,
            kind: kind.clone(),
            source: source.clone(),
            destination: destination.clone(),
            ended,
            ..figures()
        };
        let mut wait = FIRST_REPORT;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = s.cancelled() => break,
            }
            wait = EVERY;
            // The copy's end waits for a report in flight only when it may list the copy (the
            // first): its id is needed to take the copy off the list again.
            let request = report(id, false);
            let fut = tokio::time::timeout(REPORT_TIMEOUT, meta.report_live(request));
            tokio::pin!(fut);
            let sent = tokio::select! {
                r = &mut fut => r,
                _ = s.cancelled() => {
                    if id == 0
                        && let Ok(Ok(Ok(new))) = tokio::time::timeout(END_TIMEOUT, fut).await
                    {
                        id = new;
                        ids.push(new);
                    }
                    break;
                }
            };
            match sent {
                Ok(Ok(new)) => {
                    if new != id && ids.len() < 64 {
                        ids.push(new);
                    }
                    id = new;
                }
                // The server restarted (or dropped the copy as silent): list it anew.
                Ok(Err(e)) if e.kind() == ErrorKind::NotFound => {
                    id = 0;
                    wait = Duration::ZERO;
                }
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "the metadata server did not take a progress report")
                }
                Err(_) => tracing::debug!("a progress report to the metadata server timed out"),
            }
        }
        if id != 0 {
            let _ = tokio::time::timeout(END_TIMEOUT, meta.report_live(report(id, true))).await;
        }
        ids
    });
    Reporter { stop, task }
}

impl Reporter {
    /// Stops reporting and takes the copy off the live list; returns the ids it was listed
    /// under, for its history record.
    pub async fn finish(self) -> Vec<i64> {
        self.stop.cancel();
        self.task.await.unwrap_or_default()
    }
}
