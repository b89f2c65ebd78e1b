//! Fjord's front door: HTTP (Kafka REST Proxy v2 produce, bulk NDJSON, stateless pull)
//! and gRPC (`fjord.v1.Publisher` / `Subscriber`) in front of the brokers, so web services
//! and backend producers publish events without a Kafka client.
//!
//! Events of all concurrent requests go through one shared producer, so many small
//! requests become few large produce requests (the batching that made the paper's producer
//! fast). A request is answered only once its events are acknowledged as it asked (`acks`,
//! default all), with their offsets.
//!
//! # Layout
//! - [`config`]: [`GatewayConfig`], every setting and its default.
//! - `error`: the crate's [`Error`] and its HTTP status / gRPC code mapping.
//! - [`backend`]: the [`Backend`] trait (publish a batch, stateless fetch, topic metadata)
//!   and [`KafkaBackend`], its implementation over `fjord-client`.
//! - `service`: what both fronts share: stamping, the bounded buffer, the registry.
//! - `avro`: JSON → Avro with field paths in errors, Confluent framing.
//! - `http` (+ `http/produce.rs`, `http/read.rs`): the axum routes; `openapi`: their
//!   OpenAPI document; `metrics`: the Prometheus text.
//! - `grpc`: the tonic services, health and reflection.
//! - `idempotency`: `Idempotency-Key` / `idempotency_key`, kept in the compacted topic
//!   `_gateway_idempotency` so it holds across restarts and gateways.
//! - `limits`: requests/s and bytes/s per client ([`ClientLimits`]).
//!
//! # Invariants
//! - A request is checked whole (parsing, base64, Avro, key fields, event sizes, topic
//!   and partitions) before its first event is handed to the producer: a refused request
//!   produced nothing.
//! - Memory is bounded: events accepted and not yet acknowledged never exceed
//!   `buffer_bytes`; past it requests are refused with 429 / RESOURCE_EXHAUSTED and a
//!   retry hint, never queued.
//! - Every event carries `fjord.host` and `fjord.created_ms` headers (the audit counts
//!   by them); the caller's own values win.
//! - No request waits on the brokers longer than `broker_timeout`: then it is 503 /
//!   UNAVAILABLE.
//! - With `audit_interval` set, the gateway tier's audit counter (`fjord-audit`) counts
//!   every acknowledged event by its `fjord.created_ms`, publishes to `_audit` every
//!   interval, and flushes once more when the gateway stops; dead letters are counted
//!   under their dead-letter topic by it, and under the topic they were meant for by the
//!   `dead_letter` tier.

pub mod backend;
pub mod config;
mod error;

mod atomic;
mod avro;
mod grpc;
mod http;
mod idempotency;
mod limits;
mod metrics;
mod openapi;
mod service;

use std::sync::Arc;

use fjord_auth::http::{HttpSecurity, Incoming, Peer};
use fjord_coord::Store;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use backend::{Backend, KafkaBackend};
pub use config::{ClientLimits, CorsConfig, GatewayConfig};
pub use error::{Error, Result};
pub use idempotency::TOPIC as IDEMPOTENCY_TOPIC;
pub use service::{CREATED_HEADER, HOST_HEADER};

/// Runs the gateway on already-bound listeners (HTTP and gRPC) until `shutdown` is
/// cancelled. Tests and `fjord dev` call exactly this. The brokers need not be up yet:
/// the gateway connects on first use and answers 503 until they are.
pub async fn run(config: GatewayConfig, http: TcpListener, grpc: TcpListener, shutdown: CancellationToken) -> Result<()> {
    run_with_store(config, None, http, grpc, shutdown).await
}

/// [`run`] with the metadata store, which Basic authentication (the users' SCRAM
/// credentials) and the authorizer (the ACLs) read: required when
/// `authentication.method=BASIC` or `authorizer.enable=true`.
pub async fn run_with_store(
    config: GatewayConfig,
    store: Option<Store>,
    http: TcpListener,
    grpc: TcpListener,
    shutdown: CancellationToken,
) -> Result<()> {
    let backend = Arc::new(KafkaBackend::new(config.clone()));
    serve_with_store(config, backend, store, http, grpc, shutdown).await
}

/// [`run`] over any [`Backend`].
pub async fn serve(
    config: GatewayConfig,
    backend: Arc<dyn Backend>,
    http: TcpListener,
    grpc: TcpListener,
    shutdown: CancellationToken,
) -> Result<()> {
    serve_with_store(config, backend, None, http, grpc, shutdown).await
}

/// [`run_with_store`] over any [`Backend`].
pub async fn serve_with_store(
    config: GatewayConfig,
    backend: Arc<dyn Backend>,
    store: Option<Store>,
    http: TcpListener,
    grpc: TcpListener,
    shutdown: CancellationToken,
) -> Result<()> {
    tracing::info!(?config, http = ?http.local_addr().ok(), grpc = ?grpc.local_addr().ok(), "gateway starting");
    let audit_publisher = config.audit_interval.map(|interval| (interval, config.client_config()));
    // The ACL watcher runs until the gateway stops, and is waited for.
    let watchers = TaskTracker::new();
    let security = HttpSecurity::start(config.security.clone(), store, &watchers, shutdown.clone())
        .await
        .map_err(|e| Error::Config(format!("security: {e}")))?;
    let mut gateway = service::Gateway::new(config, backend)?;
    gateway.security = security.clone();
    let gateway = Arc::new(gateway);
    // The publisher has its own token: it flushes after both servers stopped, so the
    // counts of the last requests are published too.
    let audit_stop = CancellationToken::new();
    let audit_tasks: Vec<_> = match audit_publisher {
        Some((interval, client)) => (gateway.audit.iter().chain(&gateway.dead_letter_audit))
            .map(|counter| counter.clone().spawn_publisher(client.clone(), interval, audit_stop.clone()))
            .collect(),
        None => Vec::new(),
    };
    // The web console (#23) at /ui/, with the gateway's authentication and ACLs.
    let console = fjord_console::Console::new(gateway.config.console_config(), security.clone());
    let http = Incoming::start(http, security, shutdown.clone()).map_err(|e| Error::Serve(format!("HTTP: {e}")))?;
    let app = http::router(gateway.clone()).merge(fjord_console::router(console));
    let http_shutdown = shutdown.clone();
    let http_server = async {
        let r = axum::serve(http, app.into_make_service_with_connect_info::<Peer>())
            .with_graceful_shutdown(http_shutdown.cancelled_owned())
            .await
            .map_err(|e| Error::Serve(format!("HTTP: {e}")));
        // If one server fails, stop the other rather than running half a gateway.
        shutdown.cancel();
        r
    };
    let grpc_server = async {
        let r = grpc::serve(gateway, grpc, shutdown.clone()).await;
        shutdown.cancel();
        r
    };
    let (http_result, grpc_result) = tokio::join!(http_server, grpc_server);
    audit_stop.cancel();
    for task in audit_tasks {
        match task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "final audit flush failed; the report will show these counts missing")
            }
            Err(e) => tracing::warn!(error = %e, "audit publisher panicked"),
        }
    }
    watchers.close();
    watchers.wait().await;
    http_result.and(grpc_result)
}
