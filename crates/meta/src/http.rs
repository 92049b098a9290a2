//! The monitoring side of the metadata server over plain HTTP (bind it to a trusted
//! interface): the dashboard (`crate::dashboard`: `/`, `/transfers`, `/transfers/ID`, sign-in
//! at `/login`), `/api/status` as JSON, and `/metrics` in the Prometheus text format (see
//! [`crate::exposition`]). Read-only; nothing here changes the grid. `/api/status`, `/metrics`
//! and the public part of `/` need no sign-in and show only paths that anybody could list.

use crate::state::Meta;
use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use std::sync::Arc;
use tokio::net::TcpListener;

async fn api_status(State(meta): State<Arc<Meta>>) -> impl IntoResponse {
    axum::Json(crate::dashboard::status(&meta).await)
}

async fn metrics(State(meta): State<Arc<Meta>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, transfer::metrics::CONTENT_TYPE)],
        crate::exposition::exposition(&meta).await,
    )
}

/// Serves the dashboard until `stop`, on the hardened listener of `transfer::http`
/// (connection limits, header timeout, bounded connection lifetime).
pub async fn serve(
    meta: Arc<Meta>,
    listener: TcpListener,
    stop: tokio_util::sync::CancellationToken,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/", get(crate::dashboard::overview))
        .route("/transfers", get(crate::dashboard::transfers))
        .route("/transfers/{id}", get(crate::dashboard::transfer))
        .route("/login", get(crate::dashboard::login))
        .route("/logout", get(crate::dashboard::logout))
        .route(
            "/favicon.ico",
            get(|| async { axum::http::StatusCode::NO_CONTENT }),
        )
        .route("/api/status", get(api_status))
        .route("/metrics", get(metrics))
        .with_state(meta);
    transfer::http::serve(
        listener,
        hyper_util::service::TowerToHyperService::new(app),
        transfer::http::HttpLimits::default(),
        stop,
    )
    .await
}
