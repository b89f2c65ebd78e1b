//! Rust producer, consumer and admin client for Fjord and Kafka brokers, speaking the
//! Kafka wire protocol (codecs from the `kafka-protocol` crate; record batches built and
//! read with `fjord-record`, so a record is encoded once, straight into wire bytes).
//!
//! # Layout
//! - [`error`]: the crate's one [`Error`] enum; broker error codes stay typed
//!   ([`ResponseError`]).
//! - `connection`: one pipelined TCP connection per broker (requests in order, responses
//!   matched FIFO, coalesced writes).
//! - `guard`: a structural walk over each answer before it is decoded, so that a hostile
//!   or broken broker's answer is refused instead of aborting the process.
//! - [`security`]: `security.protocol`, `sasl.*`, `ssl.*`; each connection's TLS handshake
//!   and SASL exchange before its first request.
//! - [`cluster`]: bootstrap, the metadata cache and its refresh rules, the connection pool.
//! - [`partitioner`]: murmur2 (identical to the Java client and librdkafka
//!   `murmur2_random`) and the sticky choice for records without a key.
//! - [`producer`]: batching per partition (`batch.size`, `linger.ms`), compression, acks,
//!   retries, `max.in.flight` pipelining, bounded `buffer.memory`.
//! - [`consumer`]: assigned partitions, fetch by (offset, max bytes) with long poll and
//!   prefetch, seek/rewind, `auto.offset.reset`.
//! - [`admin`]: create/delete/list/describe topics, describe/alter configs, list offsets.
//! - [`audit`]: [`AuditHook`], the opt-in audit counting of acknowledged and consumed records.
//! - [`assignor`]: range (the paper's Algorithm 1), roundrobin, sticky, cooperative-sticky.
//! - [`group`]: the group consumer (join/sync/heartbeat, committed offsets, rebalances).
//! - [`transaction`]: the transaction coordinator's requests (the transactional producer's
//!   half) and [`TransactionAdmin`].
//!
//! # Guarantees
//! Records of one partition are stored and acknowledged in the order they were sent, each
//! once, with the idempotent producer (`enable.idempotence`, on by default) and up to 5
//! requests in flight; without idempotence a retry with `max.in.flight > 1` may reorder
//! or duplicate. Every `send` ends: success, or a typed error, within
//! `delivery.timeout.ms`.

pub mod admin;
pub mod assignor;
pub mod audit;
mod auth_admin;
pub mod cluster;
mod connection;
pub mod consumer;
pub mod error;
pub mod group;
mod guard;
pub mod partitioner;
pub mod producer;
pub mod security;
pub mod transaction;

pub use admin::{
    Admin, ClientQuota, ConfigEntry, ConfigResource, LogDirDescription, NewTopic, OffsetSpec, PartitionReassignment, QuotaEntity,
    QuotaName, ReplicaLogDir,
};
pub use audit::AuditHook;
pub use auth_admin::ScramUser;
pub use cluster::{ClientConfig, ConnectionProbe, Metadata, PartitionMetadata, TopicMetadata};
pub use consumer::{Consumer, ConsumerConfig, ConsumerRecord, IsolationLevel, OffsetReset, SeekTo};
pub use error::{Error, ResponseError, Result};
pub use fjord_record::{Compression, TopicPartition};
pub use group::{GroupAdmin, GroupConfig, GroupConsumer, GroupDescription, MemberDescription, Rebalance, RebalanceListener};
pub use producer::{Acks, DeliveryFuture, Producer, ProducerConfig, ProducerRecord, RecordMetadata};
pub use security::{parse_properties, SaslMechanism, SecurityConfig, SecurityProtocol};
pub use transaction::{HangingTransaction, ProducerDescription, TransactionAdmin, TransactionDescription, TransactionListing};

/// Largest records section a compressed batch may expand to (a guard against
/// decompression bombs; far above any batch a real producer writes).
pub(crate) const MAX_DECOMPRESSED_BATCH: usize = 256 * 1024 * 1024;
