//! The mirror's HTTP endpoint: `GET /metrics` (Prometheus text) and `GET /status` (JSON
//! [`Status`]), served by `fjord_metrics::endpoint` (the broker's too, so both take the
//! same `metrics.*` security keys: TLS, Basic), and [`fetch_status`], the client side
//! `fjord mirror status` uses.

use std::sync::Arc;

use fjord_metrics::endpoint::{Page, Pages, PROMETHEUS};

use crate::stats::{Stats, Status};
use crate::{Error, Result};

/// The mirror's pages, rendered from its counters on each request.
pub(crate) struct MirrorPages(pub(crate) Arc<Stats>);

impl Pages for MirrorPages {
    fn page(&self, path: &str) -> Option<Page> {
        match path {
            "/metrics" => Some(Page { content_type: PROMETHEUS, body: self.0.prometheus() }),
            // Serializing plain counters and strings cannot fail.
            "/status" => {
                Some(Page { content_type: "application/json", body: serde_json::to_string(&self.0.status()).unwrap_or_default() })
            }
            _ => None,
        }
    }

    fn not_found(&self) -> &'static str {
        "the mirror serves /metrics and /status"
    }
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
