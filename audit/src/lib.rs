//! The audit: every tier of the pipeline counts the events it handled per topic and
//! fixed window of event creation time, publishes the counts to the `_audit` topic, and a
//! report compares the tiers window by window, so loss and duplication are measured, not
//! assumed.
//!
//! Audit records are JSON (one [`AuditRecord`] per Kafka record on `_audit`); counts are
//! deltas with a unique id, so a repeated publish is counted once. Windows are by the
//! event's `fjord.created_ms` header (stamped by the gateway), else its record timestamp,
//! so a late event lands in its own window and the grace period covers it.
//!
//! Embedding a tier:
//! ```no_run
//! # async fn f(client: fjord_client::ClientConfig, shutdown: tokio_util::sync::CancellationToken) {
//! use std::sync::Arc;
//! let counter = Arc::new(fjord_audit::AuditCounter::new("loader", "host-1", "analytics"));
//! let publisher = counter.clone().spawn_publisher(client, std::time::Duration::from_secs(30), shutdown);
//! counter.record("page-views", 1_796_010_000_000); // per event, once it is committed
//! // ... on shutdown the token is cancelled and the publisher flushes:
//! let _ = publisher.await;
//! # }
//! ```
//!
//! # Layout
//! - [`record`]: the [`AuditRecord`] and its JSON encoding, windows, creation time; the
//!   [`GapRecord`] of data known to be lost (`_mirror_gaps`).
//! - [`broker_tier`]: [`BrokerTier`], the brokers' tier as the broker's observer hook.
//! - [`counter`]: [`AuditCounter`], the embeddable counter and its periodic publisher;
//!   [`PendingCounts`] for tiers that count only committed data.
//! - [`report`]: [`collect`] reads `_audit` and [`compare`]s tiers into a [`Report`]
//!   with a [`Verdict`] per topic and window.
//! - [`render`](mod@render): text, JSON and self-contained HTML (inline SVG) output.
//! - [`time`]: UTC calendar arithmetic, formatting and parsing (the loader uses it too).

pub mod broker_tier;
pub mod counter;
mod error;
pub mod record;
pub mod render;
pub mod report;
pub mod time;

pub use broker_tier::BrokerTier;
pub use counter::{ensure_audit_topic, AuditCounter, PendingCounts};
pub use error::{Error, Result};
pub use record::{
    AuditRecord, GapRecord, AUDIT_TOPIC, BROKER_TIER, CREATED_HEADER, DEAD_LETTER_REASON_HEADER, DEAD_LETTER_TIER,
    DEAD_LETTER_TOPIC_HEADER, DEFAULT_WINDOW_MS, GAPS_TOPIC, READ_COMMITTED_SUFFIX,
};
pub use render::{render, Format};
pub use report::{collect, compare, Collected, Report, ReportConfig, Verdict, WindowRow};
