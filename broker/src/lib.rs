//! Kafka-protocol broker: a single node that existing Kafka clients (kcat, librdkafka,
//! the Java and Python clients) talk to unchanged.
//!
//! The broker keeps no per-consumer state (a consumer carries its own offset) and no
//! cache of its own: a Fetch sends the segment bytes, exactly as they were produced, from
//! the page cache to the socket with sendfile(2).
//!
//! # Layout
//! - [`server`]: [`run`], the production entry point: log dir, metadata store,
//!   accept loop, periodic retention / flush / checkpoint tasks, the log cleaner
//!   (compaction of `cleanup.policy=compact` topics), clean shutdown.
//! - `connection`: one client connection: frames in, requests handled in order,
//!   responses (byte buffers and file regions) out.
//! - `codec`: request decoding with the `kafka-protocol` crate, response framing, the
//!   advertised API versions and the Kafka error codes.
//! - `fetch_response`: the hand-written Fetch response encoder that leaves the records
//!   as file regions for sendfile.
//! - `guard`: a structural walk of each request body before it is decoded, so that no
//!   claimed array length can make the decoder allocate beyond the frame's size.
//! - `handler`: one module per API (metadata, produce, fetch, offsets, admin, alter_configs,
//!   describe_log_dirs, ...).
//! - `cluster`: the metadata view (live brokers, topics, partition states) kept current
//!   by store watches; it opens the logs of this broker's replicas and hands their
//!   states to the replica manager.
//! - `controller`: controller election (`/controller`, `/controller_epoch`) and leader
//!   election / ISR cleanup when brokers come and go.
//! - `topics`: topics (from the view), their creation with a replica placement over the
//!   live brokers, deletion, and config reloads.
//! - `topic_id`: topic ids (KIP-516): made at creation, assigned once to topics stored
//!   without one, in Kafka's text form.
//! - `limits`: `max.partitions.per.request` and `max.partitions.per.broker` (by default
//!   from the open-file limit, which the broker raises at start), checked before a
//!   topic creation allocates anything.
//! - `metrics`: the Prometheus text on `metrics.listen`: partitions, the cleaner, requests
//!   and errors per API.
//! - `topic_config`: topic config changes (AlterConfigs) in the store, and the watch
//!   through which every broker applies them.
//! - `partition`: one replica of a partition: its log, its role, the wake-ups of delayed
//!   fetches and acks=all produces.
//! - `periodic`: the timer of every background loop (retention, flush, checkpoints,
//!   the cleaner, ISR expiry, group sessions).
//! - `replication`: the replica manager: leader / follower / neither from the partition
//!   states, the high watermark and the ISR.
//! - [`observer`]: the hook a binary watches the broker through (leader appends record
//!   by record, start, shutdown); the audit's broker tier (`audit.enable`) implements it
//!   in `fjord-audit`.
//! - `txn`: the transaction coordinator (`__transaction_state`, the state machine,
//!   markers to the partition leaders).
//! - [`config`]: [`BrokerConfig`], under Kafka's key names.
//! - [`listener`]: named listeners (`listeners`, `listener.security.protocol.map`,
//!   `advertised.listeners`, `inter.broker.listener.name`); `connection` serves each
//!   connection with its listener's security and the connection limits.
//! - [`tls`]: TLS for SSL and SASL_SSL listeners from PEM files (KIP-651), reloaded when
//!   they change; client certificate subjects as principals.
//!
//! # Invariants
//! - Requests on one connection are handled one after the other and answered in order,
//!   so batches produced on a connection are appended in the order they were sent.
//! - A fetch never returns records at or above the high watermark; with one replica the
//!   high watermark is the log end offset after every append.
//! - Client input never panics the broker: a frame that is not a Kafka request closes
//!   that one connection; a request the broker does not implement gets UNSUPPORTED_VERSION.

mod cluster;
mod codec;
pub mod config;
mod connection;
mod controller;
mod dynamic_config;
mod error;
mod fetch_response;
mod group;
mod guard;
mod handler;
mod limits;
pub mod listener;
mod metrics;
pub mod observer;
mod partition;
mod periodic;
mod quota;
mod replica_health;
mod replication;
mod request_memory;
mod response;
mod sasl;
pub mod server;
pub mod tls;
mod topic_config;
mod topic_id;
mod topics;
mod txn;

pub use config::{AuditConfig, BrokerConfig, Secret};
pub use error::{Error, Result};
pub use group::GroupConfig;
pub use listener::{ListenerConfig, Listeners, SecurityProtocol};
pub use quota::QuotaWindow;
pub use replication::ReplicationConfig;
pub use server::run;
pub use tls::{ClientAuth, SslConfig};
pub use txn::TxnConfig;
