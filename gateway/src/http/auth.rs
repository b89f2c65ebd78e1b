//! Authentication and authorization of the HTTP front, after routing (so the topic is the
//! percent-decoded one the handler uses) and inside CORS (so a browser's preflight, which
//! never carries credentials, is answered without them, and a 401 or 403 still carries
//! `Access-Control-Allow-Origin` for the page to read).
//!
//! | route | needs |
//! |---|---|
//! | `POST /topics/{t}`, `POST /topics/{t}/partitions/{p}`, `POST /v1/events/{t}`, `POST /v1/beacon/{t}` | Write on topic `t` (and on its dead-letter topic with `?on_invalid=dead_letter`) |
//! | `GET /v1/topics/{t}/partitions/{p}/records` | Read on topic `t` |
//! | `GET /topics/{t}` | Describe on topic `t` |
//! | `GET /topics` | authenticated; lists only topics the caller may Describe |
//! | `GET /metrics` | authenticated |
//! | `GET /healthz`, `GET /openapi.json` | nothing (load balancers, tooling) |
//!
//! The pull API is stateless (no group, no committed offsets), so only the topic's Read
//! applies, as for a Kafka Fetch without a group.
//!
//! Beacons: `navigator.sendBeacon` cannot set an `Authorization` header, so a beacon
//! without credentials is `User:ANONYMOUS`, and publishes only where the ACLs let
//! `User:ANONYMOUS` Write (typically a prefix of public event topics) and only from
//! origins CORS allows; otherwise it gets 401. A beacon with credentials (a client
//! certificate, or a same-origin page whose browser sends Basic) is that user.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::connect_info::ConnectInfo;
use axum::extract::{FromRequestParts, MatchedPath, RawPathParams, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;
use fjord_auth::http::{Peer, Unauthenticated};
use fjord_auth::{Operation, Principal, Resource};
use http_body_util::BodyExt;

use super::error_response;
use crate::service::Gateway;
use crate::Error;

/// Who made a request, for handlers that filter by it.
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    pub(crate) principal: Principal,
    pub(crate) host: String,
}

impl Caller {
    /// The scope of the caller's idempotency keys: its principal, so one principal's key
    /// never answers another's request. Anonymous callers share the empty scope, the one
    /// keys had before the gateway authenticated, so keys stored then still hold.
    pub(crate) fn key_scope(&self) -> String {
        if self.principal == Principal::anonymous() {
            String::new()
        } else {
            self.principal.to_string()
        }
    }

    /// Who the per-client limits count this request against: its principal, or its IP
    /// address when anonymous (so anonymous browsers do not share one allowance).
    pub(crate) fn limit_key(&self) -> String {
        if self.principal == Principal::anonymous() {
            format!("ip:{}", self.host)
        } else {
            self.principal.to_string()
        }
    }

    /// Whether this caller may `operation` the topic.
    pub(crate) fn may(&self, g: &Gateway, operation: Operation, topic: &str) -> bool {
        g.security.authorize(&self.principal, &self.host, operation, Resource::topic(topic))
    }
}

/// A peer for requests that came in without connection info (routers served directly
/// in unit tests): no address, no certificate.
pub(crate) fn unknown_peer() -> Peer {
    Peer { addr: std::net::SocketAddr::from(([0, 0, 0, 0], 0)), certificate_principal: None }
}

/// The gateway error for a failed authentication.
pub(crate) fn unauthenticated(g: &Gateway, why: Unauthenticated) -> Error {
    match why {
        Unauthenticated::Unavailable(reason) => Error::Unavailable(reason),
        why => Error::Unauthenticated { reason: why.to_string(), challenge: g.security.www_authenticate() },
    }
}

/// The gateway error for a denied operation.
pub(crate) fn forbidden(caller: &Caller, operation: Operation, topic: &str) -> Error {
    Error::Forbidden(format!("{} may not {operation} topic {topic:?}", caller.principal))
}

pub(crate) async fn guard(State(g): State<Arc<Gateway>>, request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    let route = parts.extensions.get::<MatchedPath>().map(|m| m.as_str().to_owned()).unwrap_or_default();
    if matches!(route.as_str(), "/healthz" | "/openapi.json") {
        return next.run(Request::from_parts(parts, body)).await;
    }
    let peer = parts.extensions.get::<ConnectInfo<Peer>>().map_or_else(unknown_peer, |c| c.0.clone());
    let authorization = parts.headers.get(header::AUTHORIZATION).map(|v| v.as_bytes().to_vec());
    let principal = match g.security.authenticate(authorization.as_deref(), &peer).await {
        Ok(p) => p,
        // See the module docs: a beacon cannot send credentials.
        Err(Unauthenticated::Missing) if route == "/v1/beacon/{topic}" => Principal::anonymous(),
        Err(why) => return reject(&g, unauthenticated(&g, why)),
    };
    let caller = Caller { principal, host: peer.host() };
    // The data routes count against the caller's limits (see `limits`): refused before
    // the body is read; the body's bytes are charged as they arrive.
    let mut body = body;
    if g.limiter.enabled() && (route.starts_with("/topics") || route.starts_with("/v1/")) {
        let client = caller.limit_key();
        if let Err(e) = g.limiter.admit(&client) {
            g.metrics.record("http_limit", e.http_status(), 0, 0, std::time::Duration::ZERO);
            return error_response(&e);
        }
        let charged = g.clone();
        body = Body::new(body.map_frame(move |frame| {
            if let Some(data) = frame.data_ref() {
                charged.limiter.charge(&client, data.len());
            }
            frame
        }));
    }
    let params = RawPathParams::from_request_parts(&mut parts, &()).await.ok();
    let topic = params.as_ref().and_then(|p| p.iter().find(|(k, _)| *k == "topic").map(|(_, v)| v.to_owned()));
    let needed = match (parts.method.as_str(), route.as_str()) {
        ("POST", _) => Some(Operation::Write),
        ("GET", "/v1/topics/{topic}/partitions/{partition}/records") => Some(Operation::Read),
        ("GET", "/topics/{topic}") => Some(Operation::Describe),
        _ => None,
    };
    if let (Some(operation), Some(topic)) = (needed, topic.as_deref()) {
        let mut topics = vec![topic.to_owned()];
        // Parsed as the handler parses it, so no spelling of the option slips past.
        let query = axum::extract::Query::<std::collections::HashMap<String, String>>::try_from_uri(&parts.uri);
        let dead_letter = query.is_ok_and(|q| q.get("on_invalid").is_some_and(|v| v == "dead_letter"));
        if operation == Operation::Write && dead_letter {
            topics.push(g.config.dead_letter_topic.clone().unwrap_or_else(|| format!("{topic}.dlq")));
        }
        for topic in &topics {
            if !caller.may(&g, operation, topic) {
                if caller.principal == Principal::anonymous() && g.security.requires_credentials() {
                    return reject(&g, unauthenticated(&g, Unauthenticated::Missing));
                }
                return reject(&g, forbidden(&caller, operation, topic));
            }
        }
    }
    parts.extensions.insert(caller);
    next.run(Request::from_parts(parts, body)).await
}

fn reject(g: &Gateway, e: Error) -> Response {
    g.metrics.record("http_auth", e.http_status(), 0, 0, std::time::Duration::ZERO);
    error_response(&e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_and_idempotency_keys_are_per_principal_and_anonymous_callers_per_address() {
        let caller = |principal: Principal, host: &str| Caller { principal, host: host.into() };
        let alice = caller(Principal::user("alice"), "10.0.0.1");
        let alice_elsewhere = caller(Principal::user("alice"), "10.0.0.2");
        assert_eq!((alice.limit_key(), alice.key_scope()), ("User:alice".to_string(), "User:alice".to_string()));
        assert_eq!(alice.limit_key(), alice_elsewhere.limit_key(), "a principal is one client wherever it connects from");
        let anonymous = caller(Principal::anonymous(), "10.0.0.3");
        assert_eq!((anonymous.limit_key(), anonymous.key_scope()), ("ip:10.0.0.3".to_string(), String::new()));
        assert_ne!(anonymous.limit_key(), caller(Principal::anonymous(), "10.0.0.4").limit_key());
    }
}
