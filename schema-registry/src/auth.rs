//! Authentication and authorization of the REST API, as Confluent's Schema Registry
//! takes them (`authentication.method=BASIC`, `authentication.realm`), over the
//! brokers' users and ACLs: HTTP Basic is checked against the user's SCRAM credential in
//! the metadata store, a trusted client certificate names its principal, and with
//! `authorizer.enable` each request needs an ACL on a `Subject` resource (Kafka's ACL
//! model, `fjord acls add --subject`):
//!
//! | request | needs |
//! |---|---|
//! | `GET /subjects/{s}/...`, `POST /subjects/{s}` (lookup), `POST /compatibility/subjects/{s}/...`, `GET /config/{s}` | Describe on subject `s` |
//! | `POST /subjects/{s}/versions` (register) | Write on subject `s` |
//! | `DELETE /subjects/{s}[/versions/{v}]` | Delete on subject `s` |
//! | `PUT` / `DELETE /config/{s}` | Alter on subject `s` |
//! | `PUT` / `DELETE /config` (the global level) | Alter on the cluster |
//! | `GET /subjects` | authenticated; lists only subjects the caller may Describe |
//! | `GET /schemas/ids/{id}...`, `GET /config`, `GET /schemas/types`, `GET /` | authenticated |
//!
//! Write, Delete and Alter each imply Describe (Kafka's rule), so a writer can read what
//! it writes; a reader (Describe only) cannot register. Schemas by id are open to every
//! authenticated caller: every consumer's deserializer needs them, and an id reveals a
//! schema, not data.

use std::sync::Arc;

use axum::extract::connect_info::ConnectInfo;
use axum::extract::{FromRequestParts, MatchedPath, RawPathParams, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use fjord_auth::http::{HttpSecurity, Peer, Unauthenticated};
use fjord_auth::{Operation, Principal, Resource};

use crate::api::ApiError;

/// Who made a request, for handlers that filter by it.
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    pub(crate) principal: Principal,
    pub(crate) host: String,
    pub(crate) security: Arc<HttpSecurity>,
}

impl Caller {
    /// Whether this caller may `operation` the subject.
    pub(crate) fn may(&self, operation: Operation, subject: &str) -> bool {
        self.security.authorize(&self.principal, &self.host, operation, Resource::subject(subject))
    }
}

/// What a route needs, by method and route template.
fn needed(method: &Method, route: &str) -> Option<(Operation, bool)> {
    // (operation, on the subject (true) or on the cluster (false))
    let on_subject = route.starts_with("/subjects/{subject}")
        || route.starts_with("/compatibility/subjects/{subject}")
        || route == "/config/{subject}";
    match (method.as_str(), on_subject, route) {
        ("GET", true, _) => Some((Operation::Describe, true)),
        ("POST", true, "/subjects/{subject}/versions") => Some((Operation::Write, true)),
        ("POST", true, _) => Some((Operation::Describe, true)),
        ("DELETE", true, "/config/{subject}") | ("PUT", true, _) => Some((Operation::Alter, true)),
        ("DELETE", true, _) => Some((Operation::Delete, true)),
        ("PUT" | "DELETE", false, "/config") => Some((Operation::Alter, false)),
        _ => None,
    }
}

pub(crate) async fn guard(State(security): State<Arc<HttpSecurity>>, request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    let route = parts.extensions.get::<MatchedPath>().map(|m| m.as_str().to_owned()).unwrap_or_default();
    let peer = parts
        .extensions
        .get::<ConnectInfo<Peer>>()
        .map(|c| c.0.clone())
        .unwrap_or_else(|| Peer { addr: std::net::SocketAddr::from(([0, 0, 0, 0], 0)), certificate_principal: None });
    let authorization = parts.headers.get(header::AUTHORIZATION).map(|v| v.as_bytes().to_vec());
    let principal = match security.authenticate(authorization.as_deref(), &peer).await {
        Ok(p) => p,
        Err(Unauthenticated::Unavailable(why)) => {
            return ApiError::http(StatusCode::SERVICE_UNAVAILABLE, format!("credentials could not be checked: {why}"))
                .into_response()
        }
        Err(why) => return unauthorized(&security, &why),
    };
    let caller = Caller { principal, host: peer.host(), security: security.clone() };
    if let Some((operation, on_subject)) = needed(&parts.method, &route) {
        let params = RawPathParams::from_request_parts(&mut parts, &()).await.ok();
        let subject = params.as_ref().and_then(|p| p.iter().find(|(k, _)| *k == "subject").map(|(_, v)| v.to_owned()));
        let allowed = match (on_subject, &subject) {
            (true, Some(subject)) => caller.may(operation, subject),
            // A subject that does not decode (not UTF-8): the handler's own extractor
            // fails on it the same way and answers 400 without touching anything.
            (true, None) => true,
            (false, _) => security.authorize(&caller.principal, &caller.host, operation, Resource::cluster()),
        };
        if !allowed {
            let what = subject.map_or_else(|| "the global config".to_owned(), |s| format!("subject {s:?}"));
            let message = format!("{} is denied operation {operation} on {what}", caller.principal);
            return ApiError { status: StatusCode::FORBIDDEN, code: 40301, message }.into_response();
        }
    }
    parts.extensions.insert(caller);
    next.run(Request::from_parts(parts, body)).await
}

/// 401 as Confluent answers it, with the Basic challenge.
fn unauthorized(security: &HttpSecurity, why: &Unauthenticated) -> Response {
    let mut response =
        ApiError { status: StatusCode::UNAUTHORIZED, code: 40101, message: format!("Unauthorized: {why}") }.into_response();
    if let Ok(value) = HeaderValue::from_str(&security.www_authenticate()) {
        response.headers_mut().insert(header::WWW_AUTHENTICATE, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_needs_what_the_table_says() {
        let get = Method::GET;
        assert_eq!(needed(&get, "/subjects/{subject}/versions/{version}"), Some((Operation::Describe, true)));
        assert_eq!(needed(&Method::POST, "/subjects/{subject}/versions"), Some((Operation::Write, true)));
        assert_eq!(needed(&Method::POST, "/subjects/{subject}"), Some((Operation::Describe, true)));
        assert_eq!(needed(&Method::POST, "/compatibility/subjects/{subject}/versions"), Some((Operation::Describe, true)));
        assert_eq!(needed(&Method::DELETE, "/subjects/{subject}/versions/{version}"), Some((Operation::Delete, true)));
        assert_eq!(needed(&Method::DELETE, "/subjects/{subject}"), Some((Operation::Delete, true)));
        assert_eq!(needed(&Method::PUT, "/config/{subject}"), Some((Operation::Alter, true)));
        assert_eq!(needed(&Method::DELETE, "/config/{subject}"), Some((Operation::Alter, true)));
        assert_eq!(needed(&get, "/config/{subject}"), Some((Operation::Describe, true)));
        assert_eq!(needed(&Method::PUT, "/config"), Some((Operation::Alter, false)));
        for open in ["/subjects", "/schemas/ids/{id}", "/config", "/schemas/types", "/"] {
            assert_eq!(needed(&get, open), None, "{open}");
        }
    }
}
