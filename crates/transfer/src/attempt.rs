//! One attempt of a copy under watch, and the pause before the next one: the two halves of the
//! retry loop that a standalone copy (`client::with_retries`, one session per attempt, resumed)
//! and a grid copy (`grid::copy::rounds`, rounds of sessions side by side, with failover)
//! share. Each decides what to try next in its own way; how an attempt is watched for a stall
//! and how the wait before trying again is announced and interrupted are written here once.

use crate::error::TransferError;
use crate::progress::{Counters, Event, EventSender};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use wire::retry::{RetryPolicy, StallDetector};

/// What one attempt of a copy reports to and is stopped by: the byte counters the progress
/// display and the report read, the channel of its events, and its cancellation.
#[derive(Clone)]
pub struct AttemptContext {
    pub counters: Arc<Counters>,
    pub events: EventSender,
    pub cancel: CancellationToken,
}

/// How an attempt is watched for a stall.
pub struct StallWatch {
    /// No progress for this long is a stall.
    pub timeout: Duration,
    /// What counts as progress, read from the attempt's counters (a sum that grows).
    pub progress: fn(&Counters) -> u64,
    /// Put before "no data moved for ..." in the stall's error (e.g. the node), or empty.
    pub subject: String,
}

impl StallWatch {
    /// Bytes written at the destination or sent by the source.
    pub fn bytes(c: &Counters) -> u64 {
        Counters::get(&c.bytes_done) + Counters::get(&c.bytes_sent)
    }

    /// Bytes, or any frame or acknowledgement on the data path (a grid session's files can
    /// take long to verify while their frames still flow).
    pub fn bytes_or_frames(c: &Counters) -> u64 {
        Self::bytes(c) + Counters::get(&c.activity)
    }

    fn stalled(&self) -> TransferError {
        TransferError::stalled(format!(
            "{}no data moved for {}",
            self.subject,
            humanize(self.timeout)
        ))
    }
}

/// Runs one attempt: `run` gets `counters`, a fresh event channel and a cancellation token
/// below `parent`. Each event the attempt sends is handed to `on_event` as it comes (and those
/// still queued when it ends). An attempt that makes no progress for the watch's timeout is
/// cancelled, waited for, and fails as stalled. Whatever the attempt left running (stream
/// openers, sessions) is cancelled when this returns.
pub async fn watched<F, Fut, T>(
    counters: Arc<Counters>,
    parent: &CancellationToken,
    watch: &StallWatch,
    run: F,
    mut on_event: impl FnMut(Event),
) -> Result<T, TransferError>
where
    F: FnOnce(AttemptContext) -> Fut,
    Fut: Future<Output = Result<T, TransferError>>,
{
    let (tx, mut rx) = mpsc::unbounded_channel();
    let cancel = parent.child_token();
    let fut = run(AttemptContext {
        counters: counters.clone(),
        events: tx,
        cancel: cancel.clone(),
    });
    tokio::pin!(fut);
    // The clock is tokio's (the same as std's, except in tests with paused time).
    let now = || tokio::time::Instant::now().into_std();
    let mut stall = StallDetector::new(watch.timeout, now());
    let result = loop {
        tokio::select! {
            r = &mut fut => break r,
            Some(ev) = rx.recv() => on_event(ev),
            _ = tokio::time::sleep_until(stall.poll_timeout().into()) => {
                if stall.observe(now(), (watch.progress)(&counters)) {
                    cancel.cancel();
                    let _ = (&mut fut).await;
                    break Err(watch.stalled());
                }
            }
        }
    };
    cancel.cancel();
    while let Ok(ev) = rx.try_recv() {
        on_event(ev);
    }
    result
}

/// Waits the retry policy's back-off before attempt `failed + 1` (`failed` attempts or rounds
/// have run), after telling the user why and for how long. Interrupted when `cancel` fires.
pub async fn back_off(
    retry: &RetryPolicy,
    failed: u32,
    reason: String,
    events: &EventSender,
    cancel: &CancellationToken,
) -> Result<(), TransferError> {
    let delay = retry.delay_before(failed).unwrap_or_default();
    let _ = events.send(Event::Retrying {
        attempt: failed + 1,
        delay_ms: delay.as_millis() as u64,
        reason,
    });
    tokio::select! {
        _ = tokio::time::sleep(delay) => Ok(()),
        _ = cancel.cancelled() => Err(TransferError::interrupted()),
    }
}

/// A duration as the user gave it: whole seconds as "N s", else "N ms".
pub fn humanize(d: Duration) -> String {
    if d.as_millis().is_multiple_of(1000) {
        format!("{} s", d.as_secs())
    } else {
        format!("{} ms", d.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watch(timeout_ms: u64) -> StallWatch {
        StallWatch {
            timeout: Duration::from_millis(timeout_ms),
            progress: StallWatch::bytes,
            subject: "node a: ".into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_attempt_that_moves_nothing_is_cancelled_as_stalled() {
        let cancel = CancellationToken::new();
        let counters = Arc::new(Counters::default());
        let r: Result<(), _> = watched(
            counters,
            &cancel,
            &watch(1000),
            |ctx| async move {
                // Runs until cancelled, as a session does.
                ctx.cancel.cancelled().await;
                Err(TransferError::interrupted())
            },
            |_| {},
        )
        .await;
        let e = r.unwrap_err();
        assert_eq!(e.kind(), wire::error::ErrorKind::Stalled);
        assert_eq!(e.to_string(), "node a: no data moved for 1 s");
        assert!(!cancel.is_cancelled(), "only the attempt is cancelled");
    }

    #[tokio::test(start_paused = true)]
    async fn progress_keeps_an_attempt_alive_and_every_event_is_handed_on() {
        let cancel = CancellationToken::new();
        let counters = Arc::new(Counters::default());
        let mut seen = Vec::new();
        let r = watched(
            counters,
            &cancel,
            &watch(1000),
            |ctx| async move {
                // 3 s in all, never 1 s without a byte.
                for i in 0..6u64 {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    Counters::add(&ctx.counters.bytes_sent, 10);
                    let _ = ctx.events.send(Event::FileRetry {
                        path: format!("f{i}"),
                        attempt: 1,
                        reason: String::new(),
                    });
                }
                Ok(7u32)
            },
            |ev| seen.push(ev),
        )
        .await;
        assert_eq!(r.unwrap(), 7);
        assert_eq!(seen.len(), 6, "events queued at the end are handed on too");
    }

    #[tokio::test(start_paused = true)]
    async fn back_off_announces_its_delay_and_stops_on_cancel() {
        let retry = RetryPolicy::default();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let cancel = CancellationToken::new();
        let start = tokio::time::Instant::now();
        back_off(&retry, 2, "lost".into(), &tx, &cancel)
            .await
            .unwrap();
        let waited = start.elapsed();
        let want = retry.delay_before(2).unwrap();
        assert_eq!(waited, want);
        match rx.try_recv().unwrap() {
            Event::Retrying {
                attempt,
                delay_ms,
                reason,
            } => {
                assert_eq!((attempt, reason.as_str()), (3, "lost"));
                assert_eq!(delay_ms, want.as_millis() as u64);
            }
            other => panic!("{other:?}"),
        }
        cancel.cancel();
        let e = back_off(&retry, 1, "x".into(), &tx, &cancel)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), wire::error::ErrorKind::Cancelled);
    }
}
