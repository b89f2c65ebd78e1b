//! CORS for browsers ([`CorsConfig`](crate::CorsConfig)): preflights are answered here,
//! requests from an origin that is not allowed (or not for the topic of the path) are
//! refused with 403 before any handler reads their body, and allowed ones get
//! `Access-Control-Allow-Origin` on their answer.
//!
//! Refusing on the server matters: a `sendBeacon` or a form post is a "simple" request
//! that the browser sends without a preflight, so CORS headers alone would keep the
//! page from reading the answer but not the events from being produced.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error_response;
use crate::service::Gateway;
use crate::Error;

pub(crate) async fn cors(State(g): State<Arc<Gateway>>, request: Request, next: Next) -> Response {
    let Some(origin) = request.headers().get(header::ORIGIN).cloned() else {
        return next.run(request).await;
    };
    let start = Instant::now();
    let preflight = request.method() == Method::OPTIONS && request.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    let origin_text = origin.to_str().unwrap_or("");
    // A same-origin request (a page served by the gateway itself) needs no CORS.
    if !preflight && is_same_origin(&request, origin_text) {
        return next.run(request).await;
    }
    let cors = &g.config.cors;
    if !cors.enabled() && !preflight {
        // CORS off: behave as before for simple requests; the browser will not let the
        // page read an answer without Access-Control-Allow-Origin.
        return next.run(request).await;
    }
    let refuse = |reason: String| {
        let e = Error::Forbidden(reason);
        g.metrics.record("http_cors", 403, 0, 0, start.elapsed());
        error_response(&e)
    };
    if !cors.allows(origin_text) {
        return refuse(format!("origin {origin_text:?} is not allowed (CORS)"));
    }
    if let Some(topic) = topic_of(request.uri().path()) {
        if !cors.allows_topic(origin_text, topic) {
            return refuse(format!("origin {origin_text:?} may not use topic {topic:?}"));
        }
    }
    if preflight {
        let method = request.headers().get(header::ACCESS_CONTROL_REQUEST_METHOD).and_then(|v| v.to_str().ok()).unwrap_or("");
        if !cors.allowed_methods.iter().any(|m| m.eq_ignore_ascii_case(method)) {
            return refuse(format!("method {method:?} is not allowed (CORS)"));
        }
        let asked = request.headers().get(header::ACCESS_CONTROL_REQUEST_HEADERS).and_then(|v| v.to_str().ok()).unwrap_or("");
        for h in asked.split(',').map(str::trim).filter(|h| !h.is_empty()) {
            if !cors.allowed_headers.iter().any(|a| a.eq_ignore_ascii_case(h)) {
                return refuse(format!("request header {h:?} is not allowed (CORS)"));
            }
        }
        g.metrics.record("http_cors", 204, 0, 0, start.elapsed());
        let mut r = StatusCode::NO_CONTENT.into_response();
        let h = r.headers_mut();
        allow_origin(h, origin);
        let join = |v: &[String]| HeaderValue::from_str(&v.join(", ")).ok();
        if let Some(v) = join(&cors.allowed_methods) {
            h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, v);
        }
        if let Some(v) = join(&cors.allowed_headers) {
            h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, v);
        }
        h.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from(cors.max_age.as_secs()));
        return r;
    }
    let mut r = next.run(request).await;
    allow_origin(r.headers_mut(), origin);
    r
}

/// The answer names the one origin that asked (never `*`), so it is valid for requests
/// with credentials (`sendBeacon` sends cookies) and caches must key on `Origin`.
fn allow_origin(h: &mut axum::http::HeaderMap, origin: HeaderValue) {
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    h.insert(header::ACCESS_CONTROL_ALLOW_CREDENTIALS, HeaderValue::from_static("true"));
    h.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, HeaderValue::from_static("retry-after"));
    h.append(header::VARY, HeaderValue::from_static("origin"));
}

fn is_same_origin(request: &Request, origin: &str) -> bool {
    let Some(host) = request.headers().get(header::HOST).and_then(|h| h.to_str().ok()) else {
        return false;
    };
    origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://")).is_some_and(|o| o.eq_ignore_ascii_case(host))
}

/// The topic a path names, for the per-origin allow-list: `/topics/{t}...`,
/// `/v1/events/{t}`, `/v1/beacon/{t}`, `/v1/topics/{t}/...`.
fn topic_of(path: &str) -> Option<&str> {
    let rest = ["/topics/", "/v1/events/", "/v1/beacon/", "/v1/topics/"].iter().find_map(|p| path.strip_prefix(p))?;
    rest.split('/').next().filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::tests::serve;
    use crate::{CorsConfig, GatewayConfig};

    #[test]
    fn topics_of_paths() {
        assert_eq!(topic_of("/v1/events/clicks"), Some("clicks"));
        assert_eq!(topic_of("/topics/t/partitions/1"), Some("t"));
        assert_eq!(topic_of("/v1/topics/t/partitions/0/records"), Some("t"));
        assert_eq!(topic_of("/healthz"), None);
    }

    #[tokio::test]
    async fn preflight_allowed_refused_and_topic_allow_list() {
        let cors = CorsConfig {
            allowed_origins: vec!["http://localhost:*".into(), "https://shop.example".into()],
            origin_topics: vec![("https://shop.example".into(), vec!["shop-*".into()])],
            ..CorsConfig::default()
        };
        let (url, g) = serve(GatewayConfig { cors, ..GatewayConfig::default() }).await;
        let http = reqwest::Client::new();
        let preflight = |origin: &'static str, path: &str, headers: &'static str| {
            http.request(reqwest::Method::OPTIONS, format!("{url}{path}"))
                .header("origin", origin)
                .header("access-control-request-method", "POST")
                .header("access-control-request-headers", headers)
                .send()
        };
        let r = preflight("http://localhost:5173", "/v1/events/t", "content-type, idempotency-key").await.unwrap();
        assert_eq!(r.status(), 204);
        assert_eq!(r.headers()["access-control-allow-origin"], "http://localhost:5173");
        assert_eq!(r.headers()["access-control-max-age"], "600");
        assert!(r.headers()["access-control-allow-methods"].to_str().unwrap().contains("POST"));
        assert_eq!(preflight("http://evil.example", "/v1/events/t", "content-type").await.unwrap().status(), 403);
        assert_eq!(preflight("http://localhost:1", "/v1/events/t", "x-secret").await.unwrap().status(), 403);
        assert_eq!(preflight("https://shop.example", "/v1/events/payments", "content-type").await.unwrap().status(), 403);
        assert_eq!(preflight("https://shop.example", "/v1/events/shop-cart", "content-type").await.unwrap().status(), 204);

        let post = |origin: Option<&'static str>, topic: &str| {
            let mut r = http.post(format!("{url}/v1/events/{topic}")).body("{\"a\":1}\n");
            if let Some(o) = origin {
                r = r.header("origin", o);
            }
            r.send()
        };
        let r = post(Some("http://localhost:9"), "t").await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["access-control-allow-origin"], "http://localhost:9");
        let r = post(Some("http://evil.example"), "t").await.unwrap();
        assert_eq!(r.status(), 403);
        assert_eq!(r.json::<serde_json::Value>().await.unwrap()["error_code"], 40300);
        assert_eq!(post(Some("https://shop.example"), "payments").await.unwrap().status(), 403);
        assert_eq!(post(None, "payments").await.unwrap().status(), 200, "no Origin: not a browser, not CORS");
        let topics = g.backend.topics().await.unwrap();
        assert_eq!(topics, vec!["payments".to_string(), "t".to_string()], "refused requests produced nothing");
    }
}
