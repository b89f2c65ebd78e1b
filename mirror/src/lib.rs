//! The mirror: an embedded consumer that copies topics from one or more online clusters
//! (sources) into an analytics cluster (target), as in the paper's deployment, with the
//! guarantees other mirrors lack: source offsets are committed only after the target
//! acknowledged (acks=all), so a crash duplicates at most the records after the last
//! commit and loses none; data deleted by source retention before it was copied is
//! reported as a [`Gap`] with its exact offsets; the lag of every source partition is on
//! `/metrics`. With [`MirrorConfig::exactly_once`] copies and positions commit in one
//! transaction on the target instead, so a crash leaves no duplicates either.
//!
//! ```no_run
//! # async fn f() -> fjord_mirror::Result<()> {
//! use fjord_mirror::{MirrorConfig, SourceConfig};
//! let sources = vec![SourceConfig::parse("dc1=10.0.0.1:9092")?, SourceConfig::parse("dc2=10.1.0.1:9092")?];
//! let config = MirrorConfig::new(sources, "10.2.0.1:9092", "events|clicks-.*");
//! fjord_mirror::run(config, None, tokio_util::sync::CancellationToken::new()).await
//! # }
//! ```
//!
//! # Layout
//! - [`config`]: [`MirrorConfig`], [`SourceConfig`], validation, target topic names.
//! - `source`: one task per source cluster: group member, copy loop, commits, gaps,
//!   retries with backoff.
//! - [`stats`]: shared state, Prometheus text and the JSON [`Status`].
//! - `http`: `GET /metrics` and `GET /status`; [`fetch_status`] reads the latter.
//!
//! # What the target gets
//! Each target topic is created (when missing) with its source topic's partition count
//! and non-default configs, and without limits on timestamps unless the source topic
//! sets them (`message.timestamp.after.max.ms` / `.before.max.ms`): the source checked
//! them when it took the records, and one refused copy would stop its source for good. A record keeps key, value, headers and timestamp, gains the
//! [`ORIGIN_HEADER`] (the source alias), and goes to the same partition number, so a key
//! stays on one partition and per-key order holds. A target topic with fewer partitions
//! than its source (the source grew, while the mirror ran or while it was stopped) grows
//! to the source's count, as MirrorMaker 2 does, unless
//! [`MirrorConfig::repartition_by_key`] spreads records over it by key hash instead; a
//! target spread so by an earlier run is refused without it, as growing it would move keys.
//! A record the target refuses for what it holds stops its source, or with
//! [`MirrorConfig::dead_letter_topic`] goes to that topic on the target instead (see
//! `source`).

pub mod config;
mod error;
mod http;
mod source;
pub mod stats;

use std::sync::Arc;

use fjord_audit::AuditCounter;
use fjord_client::ClientConfig;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

pub use config::{AuditConfig, MirrorConfig, SourceConfig};
pub use error::{Error, Result};
pub use http::fetch_status;
pub use stats::{Gap, PartitionStatus, SourceState, SourceStatus, Status};

use source::{run_source, Shared, Target};

/// Header naming the cluster a mirrored record came from (the source alias).
pub const ORIGIN_HEADER: &str = "fjord.origin";

/// Topic in the target cluster where every [`Gap`] is written (JSON, keyed by
/// `source/topic-partition`), next to `_audit`; `fjord audit report` lists them.
pub use fjord_audit::GAPS_TOPIC;

/// The audit tier name of the mirror.
pub const AUDIT_TIER: &str = "mirror";

/// Runs the mirror until `shutdown`: one task per source, the metrics endpoint on
/// `metrics` when given, and the audit publisher when configured. Returns an error for
/// a bad configuration (at start), an unreachable target (at start), or a target topic
/// with too few partitions; unreachable sources are retried instead.
pub async fn run(config: MirrorConfig, metrics: Option<TcpListener>, shutdown: CancellationToken) -> Result<()> {
    run_with_store(config, metrics, None, shutdown).await
}

/// [`run`], with the metadata store where the metrics endpoint's Basic authentication
/// (`metrics.authentication.method=BASIC`) reads the users: the target cluster's, whose
/// SCRAM users then scrape the mirror as they scrape the brokers.
pub async fn run_with_store(
    config: MirrorConfig,
    metrics: Option<TcpListener>,
    store: Option<fjord_coord::Store>,
    shutdown: CancellationToken,
) -> Result<()> {
    let topics = config.validate()?;
    tracing::info!(?config, "starting the mirror");
    let stats = Arc::new(stats::Stats::new(&config.sources));
    let target_client = ClientConfig { security: config.target_security.clone(), ..ClientConfig::new(&config.target) };
    let target = Target::connect(target_client.clone())
        .await
        .map_err(|error| Error::TargetUnreachable { target: config.target.clone(), error })?;
    // Cancelled at shutdown or when a source fails for good: everything stops.
    let stop = shutdown.child_token();
    // Tracked: its ACL watcher (when Basic is on) stops with the mirror.
    let endpoint = tokio_util::task::TaskTracker::new();
    if let Some(listener) = metrics {
        let pages = Arc::new(http::MirrorPages(stats.clone()));
        let security = config.metrics_security.clone();
        fjord_metrics::endpoint::serve(listener, security, store, pages, &endpoint, stop.clone())
            .await
            .map_err(Error::Metrics)?;
    }
    let (audit, publisher) = match &config.audit {
        Some(a) => {
            let host = config.host.clone().unwrap_or_else(host_name);
            let counter = Arc::new(
                AuditCounter::new(AUDIT_TIER, host, a.cluster.clone())
                    .with_window(a.window)
                    .map_err(|e| Error::InvalidConfig(e.to_string()))?,
            );
            // Its own token: the last counts are published after the sources stopped.
            let done = CancellationToken::new();
            let handle = counter.clone().spawn_publisher(target_client.clone(), a.interval, done.clone());
            (Some(counter), Some((handle, done)))
        }
        None => (None, None),
    };
    let host = config.host.clone().unwrap_or_else(host_name);
    let shared = Arc::new(Shared { config: config.clone(), topics, stats, target, audit, host, refused: Default::default() });
    let mut tasks = JoinSet::new();
    for source in config.sources {
        tasks.spawn(run_source(shared.clone(), source, stop.clone()));
    }
    let mut result = Ok(());
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                stop.cancel();
                if result.is_ok() {
                    result = Err(e);
                }
            }
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => stop.cancel(),
        }
    }
    stop.cancel();
    if let Some((handle, done)) = publisher {
        done.cancel();
        match handle.await {
            Ok(Err(e)) => tracing::warn!(error = %e, "the last audit publish failed"),
            Err(e) => tracing::warn!(error = %e, "the audit publisher stopped abnormally"),
            Ok(Ok(())) => {}
        }
    }
    endpoint.close();
    endpoint.wait().await;
    result
}

fn host_name() -> String {
    nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_else(|| "unknown".into())
}
