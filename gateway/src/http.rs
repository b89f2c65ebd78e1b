//! The HTTP front (axum): routing, body limits, the error document, metrics per request.
//!
//! Every error answer is `{"error_code": N, "message": "...", "record_index": i}` with
//! the status of [`Error::http_status`]; a throttled request also gets `Retry-After`.

pub(crate) mod auth;
pub(crate) mod cors;
pub(crate) mod encoding;
#[cfg(test)]
mod fuzz;
pub(crate) mod produce;
pub(crate) mod read;

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use bytes::Bytes;
use serde_json::json;

use crate::service::Gateway;
use crate::{Error, Result};

/// The content type of Kafka REST Proxy v2 answers.
pub(crate) const V2_CONTENT_TYPE: &str = "application/vnd.kafka.v2+json";

/// A successful answer: its JSON, content type, and what it published (for metrics).
pub(crate) struct Answer {
    pub(crate) body: serde_json::Value,
    pub(crate) content_type: &'static str,
    pub(crate) events: usize,
    pub(crate) bytes: usize,
}

impl Answer {
    pub(crate) fn json(body: serde_json::Value) -> Self {
        Self { body, content_type: "application/json", events: 0, bytes: 0 }
    }
}

pub(crate) fn router(gateway: Arc<Gateway>) -> Router {
    Router::new()
        .route("/topics", get(read::list_topics))
        .route("/topics/{topic}", get(read::describe_topic).post(produce::v2_topic))
        .route("/topics/{topic}/partitions/{partition}", post(produce::v2_partition))
        .route("/v1/events/{topic}", post(produce::ndjson))
        .route("/v1/beacon/{topic}", post(produce::beacon))
        .route("/v1/topics/{topic}/partitions/{partition}/records", get(read::records))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .route_layer(axum::middleware::from_fn_with_state(gateway.clone(), auth::guard))
        // Bodies are read with our own limit (read_body), which answers 413 in our format.
        .layer(DefaultBodyLimit::disable())
        .layer(axum::middleware::from_fn_with_state(gateway.clone(), cors::cors))
        .with_state(gateway)
}

/// Runs a handler body, records its metrics and turns the outcome into a response.
pub(crate) async fn respond(
    gateway: &Gateway,
    api: &'static str,
    f: impl std::future::Future<Output = Result<Answer>>,
) -> Response {
    let start = Instant::now();
    let result = f.await;
    let (response, status, events, bytes) = match result {
        Ok(a) => {
            let mut r = (StatusCode::OK, axum::Json(a.body)).into_response();
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(a.content_type));
            (r, 200, a.events, a.bytes)
        }
        Err(e) => {
            let status = e.http_status();
            (error_response(&e), status, 0, 0)
        }
    };
    gateway.metrics.record(api, status, events, bytes, start.elapsed());
    response
}

pub(crate) fn error_response(e: &Error) -> Response {
    let status = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if status.is_server_error() {
        tracing::warn!(error = %e, "request failed");
    }
    let mut body = json!({ "error_code": e.error_code(), "message": e.to_string() });
    if let Some(i) = e.record_index() {
        body["record_index"] = json!(i);
    }
    let mut r = (status, axum::Json(body)).into_response();
    if let Error::Unauthenticated { challenge, .. } = e {
        if let Ok(value) = HeaderValue::from_str(challenge) {
            r.headers_mut().insert(header::WWW_AUTHENTICATE, value);
        }
    }
    if let Some(after) = e.retry_after() {
        // Retry-After is whole seconds; round up so a client never retries too early.
        let secs = after.as_millis().div_ceil(1000).max(1);
        r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs as u64));
    }
    r
}

/// Reads the body up to `max_body_bytes` and decodes its `Content-Encoding`; more than
/// the limit, as sent or decoded, is 413 without reading (or inflating) the rest.
pub(crate) async fn read_body(g: &Gateway, headers: &HeaderMap, body: Body) -> Result<Bytes> {
    let limit = g.config.max_body_bytes;
    // An unknown coding is refused before the body is read.
    let codings = encoding::codings(headers)?;
    let raw = read_raw_body(headers, body, limit).await?;
    encoding::decode(&g.decode_slots, raw, codings, limit).await
}

/// Reads the body up to `limit` bytes; more is 413 without reading the rest.
async fn read_raw_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes> {
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(Error::PayloadTooLarge { limit });
    }
    match axum::body::to_bytes(body, limit).await {
        Ok(b) => Ok(b),
        Err(e) => {
            let too_large = std::error::Error::source(&e).is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            if too_large {
                Err(Error::PayloadTooLarge { limit })
            } else {
                Err(Error::BadRequest { index: None, reason: format!("could not read the request body: {e}") })
            }
        }
    }
}

async fn healthz(State(g): State<Arc<Gateway>>) -> Response {
    respond(&g, "http_healthz", async { Ok(Answer::json(json!({ "status": "ok" }))) }).await
}

async fn metrics(State(g): State<Arc<Gateway>>) -> Response {
    let text = g.metrics.render(g.buffer_used(), g.config.buffer_bytes);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

async fn openapi() -> Response {
    axum::Json(crate::openapi::document()).into_response()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::service::tests::{gateway, MemoryBackend};
    use crate::GatewayConfig;

    /// Serves the router on a loopback port; returns its base URL.
    pub(crate) async fn serve(config: GatewayConfig) -> (String, Arc<Gateway>) {
        let g = gateway(MemoryBackend { partitions: 3, ..Default::default() }, config);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let app = router(g.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (url, g)
    }

    #[tokio::test]
    async fn health_metrics_openapi_and_body_limit() {
        let (url, _g) = serve(GatewayConfig { max_body_bytes: 2048, ..GatewayConfig::default() }).await;
        let http = reqwest::Client::new();
        let r = http.get(format!("{url}/healthz")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let r = http.get(format!("{url}/openapi.json")).send().await.unwrap();
        let doc: serde_json::Value = r.json().await.unwrap();
        assert!(doc["paths"]["/v1/events/{topic}"]["post"].is_object());
        let r = http.post(format!("{url}/v1/events/t")).body(vec![b'{'; 4096]).send().await.unwrap();
        assert_eq!(r.status(), 413);
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["error_code"], 41300);
        // A chunked body (no Content-Length) over the limit is cut off too.
        let chunks = futures::stream::iter((0..8).map(|_| Ok::<_, std::io::Error>(vec![b' '; 512])));
        let r = http.post(format!("{url}/v1/events/t")).body(reqwest::Body::wrap_stream(chunks)).send().await.unwrap();
        assert_eq!(r.status(), 413);
        let text = http.get(format!("{url}/metrics")).send().await.unwrap().text().await.unwrap();
        assert!(text.contains("fjord_gateway_requests_total{api=\"http_ndjson\",status=\"413\"} 2"), "{text}");
        assert!(text.contains("fjord_gateway_buffer_capacity_bytes"));
    }
}
