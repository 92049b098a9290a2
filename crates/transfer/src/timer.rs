//! Waiting for a deadline a sans-IO machine gave (`poll_timeout`): the drivers' session loops
//! sleep until it, or forever when there is none, instead of waking on a fixed tick.

use std::time::Instant;

/// Sleeps until `deadline`; forever without one.
pub async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}
