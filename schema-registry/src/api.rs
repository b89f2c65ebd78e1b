//! The REST service: Confluent Schema Registry's API (the Avro part), on axum.
//!
//! Responses carry `application/vnd.schemaregistry.v1+json`; request bodies may be sent as
//! that, `application/vnd.schemaregistry+json`, `application/json`,
//! `application/octet-stream` (all of which Confluent accepts) or without a content type.
//! Errors are Confluent's JSON, `{"error_code": N, "message": "..."}`, with its codes:
//!
//! | status | error_code | when |
//! |---|---|---|
//! | 404 | 40401 / 40402 / 40403 | subject / version / schema (or id) not found |
//! | 404 | 40404 / 40406 | subject / version already soft-deleted (use `?permanent=true`) |
//! | 404 | 40405 / 40407 | permanent delete of a subject / version not soft-deleted first |
//! | 404 | 40408 | the subject has no compatibility level of its own |
//! | 409 | 409 | incompatible schema (the message names the version, rule and path) |
//! | 422 | 42201 / 42202 / 42203 | invalid schema / version / compatibility level |
//! | 422 | 42201 | a schema beyond a limit (`max_schema_bytes`, `max_named_types`, `max_depth`, `max_fixed_size`; the message names it), or a check beyond its bound |
//! | 400, 413, 415 | same | malformed JSON body, body over `max_body_bytes`, wrong content type |
//! | 500 | 50001 | the metadata store failed |
//!
//! Endpoints: `GET /subjects`, `GET|POST|DELETE /subjects/{s}`, `GET|POST /subjects/{s}/versions`,
//! `GET|DELETE /subjects/{s}/versions/{v}`, `GET .../{v}/schema`, `GET .../{v}/referencedby`,
//! `GET /schemas/ids/{id}` (and `/schema`, `/versions`, `/subjects`), `GET /schemas/types`,
//! `GET|PUT|DELETE /config`, `GET|PUT|DELETE /config/{s}`,
//! `POST /compatibility/subjects/{s}/versions[/{v}]`. Lists take `deleted`, `deletedOnly`,
//! `subjectPrefix`, `offset` and `limit`; deletes take `permanent`; compatibility checks
//! take `verbose`.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use fjord_auth::http::{HttpSecurity, HttpSecurityConfig, Incoming, Peer};
use fjord_coord::Store;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::limit::ConcurrencyLimitLayer;

use crate::compat::CompatibilityLevel;
use crate::schema::{ParsedSchema, SchemaLimits};
use crate::store::{default_cpu_tasks, SchemaStore, SubjectVersion, VersionSpec};
use crate::{Error, Result};

/// The content type of every response.
pub const CONTENT_TYPE: &str = "application/vnd.schemaregistry.v1+json";

const ACCEPTED_CONTENT_TYPES: &[&str] =
    &[CONTENT_TYPE, "application/vnd.schemaregistry+json", "application/json", "application/octet-stream"];

/// Settings of one registry instance.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RegistryConfig {
    /// Largest request body accepted; larger ones get 413 before being parsed.
    pub max_body_bytes: usize,
    /// Requests served at once; more wait (unread) for a slot. With `max_body_bytes` this
    /// bounds the memory a burst of large requests can take.
    pub max_concurrent_requests: usize,
    /// Compatibility level in force until `PUT /config` stores one
    /// (Confluent's `schema.compatibility.level`).
    pub default_compatibility: CompatibilityLevel,
    /// Longest schema text accepted, in bytes ([`SchemaLimits::max_schema_bytes`]).
    pub max_schema_bytes: usize,
    /// Most named types in one schema ([`SchemaLimits::max_named_types`]).
    pub max_named_types: usize,
    /// Deepest nesting of a schema ([`SchemaLimits::max_depth`]).
    pub max_depth: usize,
    /// Largest `fixed` size ([`SchemaLimits::max_fixed_size`]).
    pub max_fixed_size: usize,
    /// Parses and compatibility checks running at once, each on a thread of the blocking
    /// pool; more wait for a turn. Default: half the cores, 1 to 4.
    pub cpu_tasks: usize,
    /// TLS, authentication and authorization (Confluent's and Kafka's key names, set with
    /// [`RegistryConfig::set`]; see the `auth` module for what each request needs).
    #[serde(skip)]
    pub security: HttpSecurityConfig,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        // Avro schemas are small; a few MiB leaves room for very large generated ones while
        // bounding what one request can make the server buffer.
        let limits = SchemaLimits::default();
        Self {
            max_body_bytes: 4 * 1024 * 1024,
            max_concurrent_requests: 256,
            default_compatibility: CompatibilityLevel::Backward,
            max_schema_bytes: limits.max_schema_bytes,
            max_named_types: limits.max_named_types,
            max_depth: limits.max_depth,
            max_fixed_size: limits.max_fixed_size,
            cpu_tasks: default_cpu_tasks(),
            security: HttpSecurityConfig::default(),
        }
    }
}

impl RegistryConfig {
    /// Sets a security key by its name, as in a Confluent Schema Registry properties file:
    /// `ssl.keystore.location`, `ssl.truststore.location`, `ssl.client.auth` (or
    /// `ssl.client.authentication`), `ssl.principal.mapping.rules`,
    /// `ssl.handshake.timeout.ms`, `authentication.method` (`NONE`|`BASIC`),
    /// `authentication.realm`, `authentication.cache.ms`, `authorizer.enable`,
    /// `super.users`, `allow.everyone.if.no.acl.found`. An unknown key is an error.
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        match self.security.set(key, value) {
            Ok(true) => Ok(()),
            Ok(false) => Err(Error::Config(format!("{key}: unknown registry key"))),
            Err(reason) => Err(Error::Config(format!("{key}: {reason}"))),
        }
    }

    /// Rejects settings the service cannot run with.
    pub fn validate(&self) -> Result<()> {
        if self.max_body_bytes < 1024 {
            return Err(Error::Config(format!("max_body_bytes = {} is below 1024: no schema would fit", self.max_body_bytes)));
        }
        if self.max_concurrent_requests == 0 {
            return Err(Error::Config("max_concurrent_requests = 0 would serve nothing".into()));
        }
        for (key, value) in [
            ("max_schema_bytes", self.max_schema_bytes),
            ("max_named_types", self.max_named_types),
            ("max_depth", self.max_depth),
            ("cpu_tasks", self.cpu_tasks),
        ] {
            if value == 0 {
                return Err(Error::Config(format!("{key} = 0 would refuse every schema")));
            }
        }
        self.security.validate().map_err(|e| Error::Config(e.to_string()))?;
        Ok(())
    }

    /// The bounds on submitted schemas.
    pub fn schema_limits(&self) -> SchemaLimits {
        SchemaLimits {
            max_schema_bytes: self.max_schema_bytes,
            max_named_types: self.max_named_types,
            max_depth: self.max_depth,
            max_fixed_size: self.max_fixed_size,
        }
    }
}

type AppState = Arc<SchemaStore>;

/// The REST API over `store`, with its own id → schema cache. Several routers (instances)
/// may share one store.
pub fn router(config: &RegistryConfig, store: Store) -> Router {
    secured_router(config, store, HttpSecurity::open())
}

/// [`router`] behind `security` (authentication, and authorization per the `auth`
/// module's table).
pub fn secured_router(config: &RegistryConfig, store: Store, security: Arc<HttpSecurity>) -> Router {
    let state: AppState =
        Arc::new(SchemaStore::with_limits(store, config.default_compatibility, config.schema_limits(), config.cpu_tasks));
    Router::new()
        .route("/", get(|| async { reply(StatusCode::OK, &json!({})) }))
        .route("/subjects", get(list_subjects))
        .route("/subjects/{subject}", post(lookup_schema).delete(delete_subject))
        .route("/subjects/{subject}/versions", get(list_versions).post(register_schema))
        .route("/subjects/{subject}/versions/{version}", get(get_version).delete(delete_version))
        .route("/subjects/{subject}/versions/{version}/schema", get(get_version_schema))
        .route("/subjects/{subject}/versions/{version}/referencedby", get(get_referenced_by))
        .route("/schemas/ids/{id}", get(get_schema_by_id))
        .route("/schemas/ids/{id}/schema", get(get_raw_schema_by_id))
        .route("/schemas/ids/{id}/versions", get(get_versions_of_id))
        .route("/schemas/ids/{id}/subjects", get(get_subjects_of_id))
        .route("/schemas/types", get(|| async { reply(StatusCode::OK, &["AVRO"]) }))
        .route("/config", get(get_global_config).put(put_global_config).delete(delete_global_config))
        .route("/config/{subject}", get(get_subject_config).put(put_subject_config).delete(delete_subject_config))
        .route("/compatibility/subjects/{subject}/versions", post(check_all))
        .route("/compatibility/subjects/{subject}/versions/{version}", post(check_version))
        .route_layer(axum::middleware::from_fn_with_state(security, crate::auth::guard))
        .fallback(|| async { ApiError::http(StatusCode::NOT_FOUND, "HTTP 404 Not Found") })
        .method_not_allowed_fallback(|| async { ApiError::http(StatusCode::METHOD_NOT_ALLOWED, "HTTP 405 Method Not Allowed") })
        .layer(DefaultBodyLimit::max(config.max_body_bytes))
        .layer(ConcurrencyLimitLayer::new(config.max_concurrent_requests))
        .with_state(state)
}

/// Serves the API on `listener` until `shutdown` is cancelled, then finishes in-flight
/// requests and returns. The production entry point of `fjord registry` and `fjord dev`.
pub async fn run(config: RegistryConfig, store: Store, listener: TcpListener, shutdown: CancellationToken) -> Result<()> {
    config.validate()?;
    let addr = listener.local_addr().map_err(Error::Serve)?;
    tracing::info!(%addr, ?config, "schema registry listening");
    // The ACL watcher (authorizer.enable) runs until shutdown and is waited for.
    let watchers = TaskTracker::new();
    let security = HttpSecurity::start(config.security.clone(), Some(store.clone()), &watchers, shutdown.clone())
        .await
        .map_err(|e| Error::Config(format!("security: {e}")))?;
    // Plain TCP or TLS (handshakes off the accept loop, each under a timeout).
    let incoming = Incoming::start(listener, security.clone(), shutdown.clone()).map_err(Error::Serve)?;
    let app = secured_router(&config, store, security).into_make_service_with_connect_info::<Peer>();
    let served = axum::serve(incoming, app).with_graceful_shutdown(shutdown.cancelled_owned()).await.map_err(Error::Serve);
    watchers.close();
    watchers.wait().await;
    served
}

// ---- responses and errors ---------------------------------------------------------------

fn reply<T: Serialize + ?Sized>(status: StatusCode, body: &T) -> Response {
    let bytes = serde_json::to_vec(body).expect("invariant: API documents always serialize");
    raw_reply(status, bytes)
}

fn raw_reply(status: StatusCode, bytes: Vec<u8>) -> Response {
    let mut response = (status, bytes).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
    response
}

/// An error as the API reports it.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) code: i32,
    pub(crate) message: String,
}

impl ApiError {
    /// Errors of the HTTP layer, whose Confluent error code is the status itself.
    pub(crate) fn http(status: StatusCode, message: impl Into<String>) -> Self {
        Self { status, code: i32::from(status.as_u16()), message: message.into() }
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        let (status, code) = match &e {
            Error::InvalidSchema(_) | Error::UnsupportedSchema(_) | Error::SchemaLimit { .. } | Error::CheckTooComplex { .. } => {
                (StatusCode::UNPROCESSABLE_ENTITY, 42201)
            }
            Error::InvalidVersion(_) => (StatusCode::UNPROCESSABLE_ENTITY, 42202),
            Error::InvalidCompatibilityLevel(_) => (StatusCode::UNPROCESSABLE_ENTITY, 42203),
            Error::SubjectNotFound(_) => (StatusCode::NOT_FOUND, 40401),
            Error::VersionNotFound { .. } => (StatusCode::NOT_FOUND, 40402),
            Error::SchemaNotFound | Error::UnknownId(_) => (StatusCode::NOT_FOUND, 40403),
            Error::SubjectSoftDeleted(_) => (StatusCode::NOT_FOUND, 40404),
            Error::SubjectNotSoftDeleted(_) => (StatusCode::NOT_FOUND, 40405),
            Error::VersionSoftDeleted { .. } => (StatusCode::NOT_FOUND, 40406),
            Error::VersionNotSoftDeleted { .. } => (StatusCode::NOT_FOUND, 40407),
            Error::SubjectConfigNotFound(_) => (StatusCode::NOT_FOUND, 40408),
            Error::Incompatible { .. } => (StatusCode::CONFLICT, 409),
            _ => {
                // The one place server-side failures are logged: the boundary that answers.
                tracing::error!(error = %e, "schema registry request failed");
                (StatusCode::INTERNAL_SERVER_ERROR, 50001)
            }
        };
        Self { status, code, message: e.to_string() }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        reply(self.status, &json!({ "error_code": self.code, "message": self.message }))
    }
}

type ApiResult = std::result::Result<Response, ApiError>;

// ---- request parsing --------------------------------------------------------------------

/// A JSON request body: content type checked, size bounded by [`DefaultBodyLimit`], parsed.
struct JsonBody<T>(T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> std::result::Result<Self, ApiError> {
        if let Some(value) = req.headers().get(header::CONTENT_TYPE) {
            let mime = value.to_str().unwrap_or("").split(';').next().unwrap_or("").trim().to_ascii_lowercase();
            if !ACCEPTED_CONTENT_TYPES.contains(&mime.as_str()) {
                return Err(ApiError::http(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    format!("unsupported content type {mime:?}; send {CONTENT_TYPE} or application/json"),
                ));
            }
        }
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::http(StatusCode::PAYLOAD_TOO_LARGE, "request body too large")
            } else {
                ApiError::http(StatusCode::BAD_REQUEST, rejection.body_text())
            }
        })?;
        serde_json::from_slice(&bytes)
            .map(JsonBody)
            .map_err(|e| ApiError::http(StatusCode::BAD_REQUEST, format!("malformed JSON request body: {e}")))
    }
}

/// `POST /subjects/{s}/versions`, `POST /subjects/{s}` and the compatibility endpoints.
#[derive(Deserialize)]
struct SchemaRequest {
    schema: Option<String>,
    #[serde(rename = "schemaType")]
    schema_type: Option<String>,
    references: Option<Vec<Value>>,
}

impl SchemaRequest {
    /// Checks the request and parses its schema (off the async workers, under the
    /// registry's limits).
    async fn parse(self, store: &SchemaStore) -> Result<ParsedSchema> {
        if let Some(t) = self.schema_type.as_deref().filter(|t| !t.eq_ignore_ascii_case("AVRO")) {
            return Err(Error::UnsupportedSchema(format!("schema type {t} is not supported; this registry serves AVRO")));
        }
        if self.references.as_ref().is_some_and(|r| !r.is_empty()) {
            return Err(Error::UnsupportedSchema("schema references are not supported".into()));
        }
        match self.schema {
            None => Err(Error::InvalidSchema("Empty schema".into())),
            Some(text) if text.is_empty() => Err(Error::InvalidSchema("Empty schema".into())),
            Some(text) => store.parse(text).await,
        }
    }
}

#[derive(Deserialize)]
struct ConfigRequest {
    compatibility: Option<String>,
    #[serde(rename = "compatibilityLevel")]
    compatibility_level: Option<String>,
}

impl ConfigRequest {
    fn level(&self) -> Result<CompatibilityLevel> {
        match self.compatibility.as_deref().or(self.compatibility_level.as_deref()) {
            Some(name) => name.parse(),
            None => Err(Error::InvalidCompatibilityLevel("missing \"compatibility\"".into())),
        }
    }
}

/// Path parameters whose rejection (e.g. invalid UTF-8 in a subject) is a Confluent error
/// document like every other error, not axum's plain text.
struct Params<T>(T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Params<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> std::result::Result<Self, ApiError> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(value)) => Ok(Self(value)),
            Err(rejection) => Err(ApiError::http(rejection.status(), rejection.body_text())),
        }
    }
}

/// Query flags; lenient by design (an unparsable query reads as no flags), as Confluent's are.
struct Flags(HashMap<String, String>);

impl<S: Send + Sync> FromRequestParts<S> for Flags {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> std::result::Result<Self, Self::Rejection> {
        Ok(Self(Query::<HashMap<String, String>>::from_request_parts(parts, state).await.map(|Query(q)| q).unwrap_or_default()))
    }
}

impl std::ops::Deref for Flags {
    type Target = HashMap<String, String>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

/// `?name=true` (any case); absent or anything else is false.
fn flag(flags: &Flags, name: &str) -> bool {
    flags.get(name).is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

fn parse_id(id: &str) -> Result<i32> {
    id.parse().map_err(|_| Error::SchemaNotFound)
}

fn version_doc(v: &SubjectVersion) -> Value {
    json!({ "subject": v.subject, "version": v.version, "id": v.id, "schema": v.schema.text })
}

// ---- handlers ---------------------------------------------------------------------------

/// `?offset=N&limit=M` (limit -1 or absent: all), as Confluent pages its lists.
fn page<T>(items: Vec<T>, flags: &Flags) -> Vec<T> {
    let offset = flags.get("offset").and_then(|v| v.parse::<usize>().ok()).unwrap_or(0);
    let limit = flags.get("limit").and_then(|v| v.parse::<usize>().ok()).unwrap_or(usize::MAX);
    items.into_iter().skip(offset).take(limit).collect()
}

async fn list_subjects(
    State(s): State<AppState>,
    caller: Option<axum::Extension<crate::auth::Caller>>,
    flags: Flags,
) -> ApiResult {
    let deleted_only = flag(&flags, "deletedOnly");
    let mut subjects = s.subjects(deleted_only || flag(&flags, "deleted")).await?;
    // As Kafka's Metadata lists topics: only the subjects the caller may Describe.
    if let Some(axum::Extension(caller)) = &caller {
        subjects.retain(|subject| caller.may(fjord_auth::Operation::Describe, subject));
    }
    if deleted_only {
        let live = s.subjects(false).await?;
        subjects.retain(|subject| !live.contains(subject));
    }
    if let Some(prefix) = flags.get("subjectPrefix") {
        subjects.retain(|subject| subject.starts_with(prefix.as_str()));
    }
    Ok(reply(StatusCode::OK, &page(subjects, &flags)))
}

async fn list_versions(State(s): State<AppState>, Params(subject): Params<String>, flags: Flags) -> ApiResult {
    let deleted_only = flag(&flags, "deletedOnly");
    let mut versions = s.versions(&subject, deleted_only || flag(&flags, "deleted")).await?;
    if deleted_only {
        let live = s.versions(&subject, false).await.unwrap_or_default();
        versions.retain(|v| !live.contains(v));
    }
    Ok(reply(StatusCode::OK, &page(versions, &flags)))
}

async fn get_version(State(s): State<AppState>, Params((subject, version)): Params<(String, String)>, flags: Flags) -> ApiResult {
    let v = s.version(&subject, VersionSpec::parse(&version)?, flag(&flags, "deleted")).await?;
    Ok(reply(StatusCode::OK, &version_doc(&v)))
}

async fn get_version_schema(
    State(s): State<AppState>,
    Params((subject, version)): Params<(String, String)>,
    flags: Flags,
) -> ApiResult {
    let v = s.version(&subject, VersionSpec::parse(&version)?, flag(&flags, "deleted")).await?;
    Ok(raw_reply(StatusCode::OK, v.schema.text.clone().into_bytes()))
}

/// Schema references are not supported, so no version is ever referenced by another.
async fn get_referenced_by(State(s): State<AppState>, Params((subject, version)): Params<(String, String)>) -> ApiResult {
    s.version(&subject, VersionSpec::parse(&version)?, false).await?;
    Ok(reply(StatusCode::OK, &Vec::<i32>::new()))
}

async fn register_schema(
    State(s): State<AppState>,
    Params(subject): Params<String>,
    JsonBody(req): JsonBody<SchemaRequest>,
) -> ApiResult {
    let id = s.register(&subject, &req.parse(&s).await?).await?;
    Ok(reply(StatusCode::OK, &json!({ "id": id })))
}

async fn lookup_schema(
    State(s): State<AppState>,
    Params(subject): Params<String>,
    flags: Flags,
    JsonBody(req): JsonBody<SchemaRequest>,
) -> ApiResult {
    let v = s.lookup(&subject, &req.parse(&s).await?, flag(&flags, "deleted")).await?;
    Ok(reply(StatusCode::OK, &version_doc(&v)))
}

async fn delete_subject(State(s): State<AppState>, Params(subject): Params<String>, flags: Flags) -> ApiResult {
    Ok(reply(StatusCode::OK, &s.delete_subject(&subject, flag(&flags, "permanent")).await?))
}

async fn delete_version(
    State(s): State<AppState>,
    Params((subject, version)): Params<(String, String)>,
    flags: Flags,
) -> ApiResult {
    let v = s.delete_version(&subject, VersionSpec::parse(&version)?, flag(&flags, "permanent")).await?;
    Ok(reply(StatusCode::OK, &v))
}

async fn get_schema_by_id(State(s): State<AppState>, Params(id): Params<String>) -> ApiResult {
    let schema = s.schema_by_id(parse_id(&id)?).await?;
    Ok(reply(StatusCode::OK, &json!({ "schema": schema.text })))
}

async fn get_raw_schema_by_id(State(s): State<AppState>, Params(id): Params<String>) -> ApiResult {
    let schema = s.schema_by_id(parse_id(&id)?).await?;
    Ok(raw_reply(StatusCode::OK, schema.text.clone().into_bytes()))
}

async fn get_versions_of_id(State(s): State<AppState>, Params(id): Params<String>) -> ApiResult {
    let pairs = s.subject_versions_of_id(parse_id(&id)?).await?;
    let docs: Vec<Value> =
        pairs.into_iter().map(|(subject, version)| json!({ "subject": subject, "version": version })).collect();
    Ok(reply(StatusCode::OK, &docs))
}

async fn get_subjects_of_id(State(s): State<AppState>, Params(id): Params<String>) -> ApiResult {
    let mut subjects: Vec<String> =
        s.subject_versions_of_id(parse_id(&id)?).await?.into_iter().map(|(subject, _)| subject).collect();
    subjects.dedup();
    Ok(reply(StatusCode::OK, &subjects))
}

async fn get_global_config(State(s): State<AppState>) -> ApiResult {
    Ok(reply(StatusCode::OK, &json!({ "compatibilityLevel": s.global_level().await? })))
}

async fn put_global_config(State(s): State<AppState>, JsonBody(req): JsonBody<ConfigRequest>) -> ApiResult {
    let level = req.level()?;
    s.set_global_level(level).await?;
    Ok(reply(StatusCode::OK, &json!({ "compatibility": level })))
}

/// Back to the configured default; answers with the level that was in force.
async fn delete_global_config(State(s): State<AppState>) -> ApiResult {
    let previous = s.global_level().await?;
    s.reset_global_level().await?;
    Ok(reply(StatusCode::OK, &json!({ "compatibilityLevel": previous })))
}

async fn get_subject_config(State(s): State<AppState>, Params(subject): Params<String>, flags: Flags) -> ApiResult {
    let level = match s.subject_level(&subject).await? {
        Some(level) => level,
        None if flag(&flags, "defaultToGlobal") => s.global_level().await?,
        None => return Err(Error::SubjectConfigNotFound(subject).into()),
    };
    Ok(reply(StatusCode::OK, &json!({ "compatibilityLevel": level })))
}

async fn put_subject_config(
    State(s): State<AppState>,
    Params(subject): Params<String>,
    JsonBody(req): JsonBody<ConfigRequest>,
) -> ApiResult {
    let level = req.level()?;
    s.set_subject_level(&subject, level).await?;
    Ok(reply(StatusCode::OK, &json!({ "compatibility": level })))
}

async fn delete_subject_config(State(s): State<AppState>, Params(subject): Params<String>) -> ApiResult {
    let previous = s.delete_subject_level(&subject).await?;
    Ok(reply(StatusCode::OK, &json!({ "compatibilityLevel": previous })))
}

fn compatibility_doc(messages: Vec<String>, verbose: bool) -> Value {
    if verbose {
        json!({ "is_compatible": messages.is_empty(), "messages": messages })
    } else {
        json!({ "is_compatible": messages.is_empty() })
    }
}

async fn check_version(
    State(s): State<AppState>,
    Params((subject, version)): Params<(String, String)>,
    flags: Flags,
    JsonBody(req): JsonBody<SchemaRequest>,
) -> ApiResult {
    let spec = VersionSpec::parse(&version)?;
    let parsed = req.parse(&s).await?;
    let messages = s.check_compatibility(&subject, &parsed, Some(spec)).await?;
    Ok(reply(StatusCode::OK, &compatibility_doc(messages, flag(&flags, "verbose"))))
}

async fn check_all(
    State(s): State<AppState>,
    Params(subject): Params<String>,
    flags: Flags,
    JsonBody(req): JsonBody<SchemaRequest>,
) -> ApiResult {
    let messages = s.check_compatibility(&subject, &req.parse(&s).await?, None).await?;
    Ok(reply(StatusCode::OK, &compatibility_doc(messages, flag(&flags, "verbose"))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_validation() {
        RegistryConfig::default().validate().unwrap();
        let bad = [
            RegistryConfig { max_body_bytes: 10, ..RegistryConfig::default() },
            RegistryConfig { max_concurrent_requests: 0, ..RegistryConfig::default() },
            RegistryConfig { max_depth: 0, ..RegistryConfig::default() },
            RegistryConfig { cpu_tasks: 0, ..RegistryConfig::default() },
        ];
        for config in bad {
            assert!(matches!(config.validate(), Err(Error::Config(_))), "{config:?}");
        }
        let parsed: RegistryConfig = serde_json::from_str(r#"{"default_compatibility":"FULL_TRANSITIVE"}"#).unwrap();
        assert_eq!(parsed.default_compatibility, CompatibilityLevel::FullTransitive);
        assert_eq!(parsed.max_body_bytes, RegistryConfig::default().max_body_bytes);
        assert!(serde_json::from_str::<RegistryConfig>(r#"{"max_body_byte":1}"#).is_err(), "typos are refused");
    }
}
