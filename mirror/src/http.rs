//! The mirror's HTTP endpoint: `GET /metrics` (Prometheus text) and `GET /status` (JSON
//! [`Status`]), and [`fetch_status`], the client side `fjord mirror status` uses.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::stats::{Stats, Status};
use crate::{Error, Result};

pub(crate) async fn serve(listener: TcpListener, stats: Arc<Stats>, shutdown: CancellationToken) -> Result<()> {
    let app = Router::new().route("/metrics", get(metrics)).route("/status", get(status)).with_state(stats);
    axum::serve(listener, app).with_graceful_shutdown(async move { shutdown.cancelled().await }).await.map_err(Error::Http)
}

async fn metrics(State(stats): State<Arc<Stats>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], stats.prometheus())
}

async fn status(State(stats): State<Arc<Stats>>) -> Json<Status> {
    Json(stats.status())
}

/// Reads the status of the mirror whose metrics endpoint listens on `addr` (`HOST:PORT`
/// or a URL).
pub async fn fetch_status(addr: &str) -> Result<Status> {
    let base = if addr.contains("://") { addr.trim_end_matches('/').to_string() } else { format!("http://{addr}") };
    let url = format!("{base}/status");
    let fail = |detail: String| Error::Status { url: url.clone(), detail };
    let response = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(10))
        .build()
        .map_err(|e| fail(e.to_string()))?
        .get(&url)
        .send()
        .await
        .map_err(|e| fail(format!("{e} (is `fjord mirror --metrics {addr}` running?)")))?;
    if !response.status().is_success() {
        return Err(fail(format!("HTTP {}", response.status())));
    }
    response.json().await.map_err(|e| fail(format!("not a mirror status: {e}")))
}
