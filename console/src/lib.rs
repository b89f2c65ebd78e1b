//! The web console: the cluster, topics and their messages, consumer groups and their lag,
//! schemas and the audit, in a browser. Server-rendered HTML (maud, which escapes every
//! interpolated value) with a little progressive JavaScript; every asset is compiled into
//! the binary, so it works offline. The gateway serves it at `/ui/`.
//!
//! # Layout
//! - [`Console`], [`ConsoleConfig`] and [`router`]: the axum routes, authentication and the
//!   same-origin check of forms.
//! - `brokers`: what the pages read from the brokers (`fjord-client` admin, group admin,
//!   consumer), each call bounded by [`ConsoleConfig::timeout`].
//! - `decode`: Avro (through the registry), JSON, text or hex, bounded in size.
//! - `layout`: the page shell, the embedded `assets/`, formatting helpers.
//! - `history`: produce/consume rates and each group's lag over the last minutes, sampled
//!   while the console is in use.
//! - `pages/`: one module per section: `overview`, `topics`, `groups`, `schemas`, `audit`,
//!   `mirror`, `loads`.
//! - `error`: the crate's [`Error`] and the error page.
//!
//! # Invariants
//! - Every user-controlled string (topic and group names, keys, values, headers, schema
//!   subjects and texts) reaches the page through maud's escaping; none is marked raw.
//! - A page whose data source fails (a broker down, the registry unreachable) still
//!   renders: the failure is a message on the page with a 4xx/5xx status, never a blank
//!   page, and no broker call waits longer than the timeout.
//! - Authentication is the gateway's: with Basic on, every console request needs the same
//!   credentials; with the authorizer on, every page and action is checked against the
//!   ACLs for the caller (Describe to see a topic or group, Read for its messages, Create,
//!   Delete, Read on the group to reset offsets, Read on `_audit` for the audit). The
//!   console reaches the brokers as the gateway's own identity.
//! - A state-changing request (a form post) must come from the console's own origin.

mod brokers;
mod decode;
mod error;
mod history;
mod layout;
mod pages;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use fjord_auth::http::{HttpSecurity, Peer, Unauthenticated};
use fjord_auth::{Operation, Principal, Resource};
use fjord_client::ClientConfig;
use fjord_schema_registry::RegistryClient;

pub use error::{Error, Result};

/// Console settings; the gateway derives them from its own.
#[derive(Debug, Clone)]
pub struct ConsoleConfig {
    /// How the console reaches the brokers (the gateway's bootstrap and identity).
    pub client: ClientConfig,
    /// Base URL of the schema registry; `None`: no Avro decoding and no schema pages.
    pub registry_url: Option<String>,
    /// Bound on every broker or registry call of one page.
    pub timeout: Duration,
    /// The audit's window length (as every tier's).
    pub audit_window: Duration,
    /// The mirror's metrics address (`HOST:PORT` or a URL; its `/status`), for the sources'
    /// state on `/ui/mirror`; without it the page shows what the brokers hold (the mirror's
    /// groups and `_mirror_gaps`).
    pub mirror_url: Option<String>,
    /// Consumer groups of mirrors besides the default `fjord-mirror` (`fjord mirror
    /// --group`); groups whose members are mirrors are found without it.
    pub mirror_groups: Vec<String>,
    /// Destinations of `fjord load` jobs (`file:///dir`, `hdfs://host:port/dir`), whose
    /// committed states and files `/ui/loads` shows: the loader keeps its offsets beside its
    /// data, not in the brokers.
    pub loads: Vec<String>,
}

impl ConsoleConfig {
    /// A console for the brokers at `bootstrap`, 10 s timeout, the audit's default window.
    pub fn new(bootstrap: &str) -> Self {
        Self {
            client: ClientConfig::new(bootstrap),
            registry_url: None,
            timeout: Duration::from_secs(10),
            audit_window: Duration::from_millis(fjord_audit::DEFAULT_WINDOW_MS as u64),
            mirror_url: None,
            mirror_groups: Vec::new(),
            loads: Vec::new(),
        }
    }
}

/// The console's state, shared by its routes.
pub struct Console {
    config: ConsoleConfig,
    security: Arc<HttpSecurity>,
    brokers: brokers::Brokers,
    /// Decodes Avro values; caches schemas by id.
    registry: Option<RegistryClient>,
    /// For the registry pages, which pass the caller's credentials on.
    http: reqwest::Client,
    /// Rates and lag over the last minutes.
    history: history::History,
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console").field("config", &self.config).finish_non_exhaustive()
    }
}

impl Console {
    /// A console over `config`, authenticating and authorizing with `security` (the
    /// gateway's). A registry URL the client refuses (not `http://`) disables decoding and
    /// is reported on the pages that need it.
    pub fn new(config: ConsoleConfig, security: Arc<HttpSecurity>) -> Arc<Self> {
        let registry = config.registry_url.as_deref().and_then(|url| match RegistryClient::new(url) {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(error = %e, "console: no Avro decoding");
                None
            }
        });
        let http = reqwest::Client::builder().timeout(config.timeout).build().unwrap_or_default();
        Arc::new(Self {
            brokers: brokers::Brokers::new(config.client.clone(), config.timeout),
            config,
            security,
            registry,
            http,
            history: Default::default(),
        })
    }
}

/// Who made a request, as the ACLs see them; handlers check each operation with it.
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    pub(crate) principal: Principal,
    pub(crate) host: String,
    /// The raw `Authorization` header, passed on to the schema registry so it applies the
    /// caller's own Subject ACLs.
    pub(crate) authorization: Option<axum::http::HeaderValue>,
}

impl Caller {
    pub(crate) fn may(&self, c: &Console, operation: Operation, resource: Resource<'_>) -> bool {
        c.security.authorize(&self.principal, &self.host, operation, resource)
    }

    /// `Ok` when the caller may, else [`Error::Forbidden`].
    pub(crate) fn check(&self, c: &Console, operation: Operation, resource: Resource<'_>) -> Result<()> {
        if self.may(c, operation, resource) {
            return Ok(());
        }
        let kind = match resource.resource_type {
            fjord_auth::ResourceType::Topic => "topic",
            fjord_auth::ResourceType::Group => "group",
            fjord_auth::ResourceType::Cluster => "cluster",
            fjord_auth::ResourceType::Subject => "subject",
            _ => "resource",
        };
        Err(Error::Forbidden { principal: self.principal.to_string(), operation, kind, name: resource.name.to_string() })
    }
}

/// The console's routes, all under `/ui/` (`layout::BASE`); merge them into the serving
/// router (`nest` would serve the overview at `/ui` but not at `/ui/`). `/ui` redirects to
/// `/ui/`.
pub fn router(console: Arc<Console>) -> Router {
    Router::new()
        .route("/ui", get(|| async { axum::response::Redirect::permanent("/ui/") }))
        .route("/ui/", get(pages::overview::page))
        .route("/ui/topics", get(pages::topics::list).post(pages::topics::create))
        .route("/ui/topics/{topic}", get(pages::topics::topic))
        .route("/ui/topics/{topic}/delete", post(pages::topics::delete))
        .route("/ui/topics/{topic}/configs", post(pages::topics::alter_config))
        .route("/ui/groups", get(pages::groups::list))
        .route("/ui/groups/{group}", get(pages::groups::group))
        .route("/ui/groups/{group}/reset", post(pages::groups::reset))
        .route("/ui/groups/{group}/lag", get(pages::groups::lag_stream))
        .route("/ui/schemas", get(pages::schemas::list))
        .route("/ui/schemas/{subject}", get(pages::schemas::subject))
        .route("/ui/schemas/{subject}/check", post(pages::schemas::check))
        .route("/ui/rates", get(pages::overview::rates_stream))
        .route("/ui/audit", get(pages::audit::report))
        .route("/ui/mirror", get(pages::mirror::page))
        .route("/ui/loads", get(pages::loads::page))
        .route("/ui/assets/console.css", get(|| async { ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], layout::CSS) }))
        .route(
            "/ui/assets/console.js",
            get(|| async { ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], layout::JS) }),
        )
        .layer(axum::middleware::from_fn_with_state(console.clone(), guard))
        .with_state(console)
}

/// Authenticates every request as the gateway does, refuses cross-site form posts, and
/// sets headers that keep the pages from being framed or sniffed.
async fn guard(State(c): State<Arc<Console>>, mut request: Request, next: Next) -> Response {
    let peer = request
        .extensions()
        .get::<ConnectInfo<Peer>>()
        .map(|p| p.0.clone())
        .unwrap_or_else(|| Peer { addr: std::net::SocketAddr::from(([0, 0, 0, 0], 0)), certificate_principal: None });
    let authorization = request.headers().get(header::AUTHORIZATION).cloned();
    let principal = match c.security.authenticate(authorization.as_ref().map(|v| v.as_bytes()), &peer).await {
        Ok(p) => p,
        Err(Unauthenticated::Unavailable(why)) => return Error::AuthUnavailable(why).into_response(),
        Err(why) => {
            return Error::Unauthenticated { reason: why.to_string(), challenge: c.security.www_authenticate() }.into_response()
        }
    };
    if request.method() != Method::GET && request.method() != Method::HEAD {
        if let Err(e) = same_origin(request.headers()) {
            return e.into_response();
        }
    }
    request.extensions_mut().insert(Caller { principal, host: peer.host(), authorization });
    // The rates and lag history is sampled while someone uses the console.
    history::touch(&c);
    let mut response = next.run(request).await;
    let h = response.headers_mut();
    h.insert(header::X_CONTENT_TYPE_OPTIONS, header::HeaderValue::from_static("nosniff"));
    h.insert(header::X_FRAME_OPTIONS, header::HeaderValue::from_static("DENY"));
    // Only the console's own script and style; no inline script can run even if markup
    // were ever injected.
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        header::HeaderValue::from_static(
            "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; script-src 'self'; frame-ancestors 'none'",
        ),
    );
    response
}

/// A form post must come from a page of this console: browsers send `Origin` with every
/// POST, and a page elsewhere cannot forge it. Requests without `Origin` (curl, scripts)
/// are not a browser's cross-site request and pass.
fn same_origin(headers: &axum::http::HeaderMap) -> Result<()> {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|o| o.to_str().ok()) else { return Ok(()) };
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
    let origin_host = origin.split_once("://").map(|(_, rest)| rest).unwrap_or_default();
    if !host.is_empty() && origin_host.eq_ignore_ascii_case(host) {
        Ok(())
    } else {
        Err(Error::CrossSite { origin: origin.to_string() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderMap, HeaderValue};

    #[test]
    fn only_same_origin_posts_pass() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8082"));
        assert!(same_origin(&h).is_ok(), "no Origin: not a browser's cross-site post");
        h.insert(header::ORIGIN, HeaderValue::from_static("http://127.0.0.1:8082"));
        assert!(same_origin(&h).is_ok());
        h.insert(header::ORIGIN, HeaderValue::from_static("http://evil.example"));
        assert!(matches!(same_origin(&h), Err(Error::CrossSite { .. })));
        h.insert(header::ORIGIN, HeaderValue::from_static("null"));
        assert!(same_origin(&h).is_err(), "a sandboxed or file page");
    }
}
