//! The one error type of the client.

use std::sync::Arc;
use std::time::Duration;

pub use kafka_protocol::error::ResponseError;

/// Everything the client can fail with. `Clone`, because one failed batch fails every
/// record future waiting on it.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// None of the bootstrap brokers answered within the connect timeout.
    #[error("no bootstrap broker reachable ({brokers}) within {timeout:?}: {last_error}")]
    BootstrapUnreachable {
        /// The bootstrap list as configured.
        brokers: String,
        /// The configured bound.
        timeout: Duration,
        /// What the last attempt failed with.
        last_error: String,
    },
    /// A TCP connection to a broker failed or broke.
    #[error("connection to {broker} failed: {source}")]
    Io {
        /// `host:port` of the broker.
        broker: String,
        /// The I/O error.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// Connecting to a broker took longer than the connect timeout.
    #[error("connecting to {broker} timed out after {timeout:?}")]
    ConnectTimeout {
        /// `host:port` of the broker.
        broker: String,
        /// The configured bound.
        timeout: Duration,
    },
    /// The broker did not answer a request within `request.timeout.ms`.
    #[error("{api} request to {broker} timed out after {timeout:?}")]
    RequestTimeout {
        /// `host:port` of the broker.
        broker: String,
        /// Request name.
        api: &'static str,
        /// The configured bound.
        timeout: Duration,
    },
    /// The broker answered with a Kafka error code.
    #[error("{context}: {code}{}", message.as_deref().map(|m| format!(" ({m})")).unwrap_or_default())]
    Kafka {
        /// The typed Kafka error code.
        code: ResponseError,
        /// What was being done (e.g. `produce to t-0`).
        context: String,
        /// The broker's error message, when it sent one.
        message: Option<String>,
    },
    /// A response could not be decoded or contradicts the request.
    #[error("protocol error from {broker}: {detail}")]
    Protocol {
        /// `host:port` of the broker.
        broker: String,
        /// What was wrong.
        detail: String,
    },
    /// The broker does not support a version of the API this client can speak.
    #[error("broker {broker} supports no usable version of {api} (client speaks {min}..={max})")]
    UnsupportedVersion {
        /// `host:port` of the broker.
        broker: String,
        /// Request name.
        api: &'static str,
        /// Lowest version the client speaks.
        min: i16,
        /// Highest version the client speaks.
        max: i16,
    },
    /// A record batch from the broker is malformed, or one could not be built.
    #[error("record batch: {0}")]
    Record(#[from] fjord_record::Error),
    /// One record is larger than `max.request.size` (or the topic's `max.message.bytes`).
    #[error("record of {size} bytes is larger than the limit of {max} bytes")]
    RecordTooLarge {
        /// Encoded size of the record batch holding only this record.
        size: usize,
        /// The limit.
        max: usize,
    },
    /// The producer's `buffer.memory` stayed full for longer than `max.block.ms`
    /// (or at once, when blocking is off).
    #[error("producer buffer of {buffer_memory} bytes is full (waited {waited:?})")]
    BufferFull {
        /// The configured buffer size.
        buffer_memory: usize,
        /// How long send waited for space.
        waited: Duration,
    },
    /// A record could not be delivered within `delivery.timeout.ms`.
    #[error("record not delivered within {0:?}")]
    DeliveryTimeout(Duration),
    /// The topic does not exist (and was not auto-created).
    #[error("unknown topic {0}")]
    UnknownTopic(String),
    /// The partition does not exist in the topic.
    #[error("topic {topic} has no partition {partition}")]
    UnknownPartition {
        /// Topic name.
        topic: String,
        /// The requested partition.
        partition: i32,
    },
    /// A record named a partition its topic's metadata still did not show after
    /// `max.block.ms` of refreshing it (a partition just added with CreatePartitions
    /// shows up within that time; one that does not exist never does).
    #[error(
        "topic {topic} has no partition {partition}: its metadata showed {partitions} partitions for {waited:?} (max.block.ms)"
    )]
    PartitionNotInMetadata {
        /// Topic name.
        topic: String,
        /// The requested partition.
        partition: i32,
        /// The topic's partition count in the last metadata fetched.
        partitions: i32,
        /// How long send waited for the partition to appear.
        waited: Duration,
    },
    /// The partition has no leader right now (election in progress, or all replicas down).
    #[error("no leader for {0}")]
    LeaderNotAvailable(String),
    /// The fetch position is outside the log and `auto.offset.reset` is `none`.
    #[error("offset {offset} is out of range for {partition}")]
    OffsetOutOfRange {
        /// `topic-partition`.
        partition: String,
        /// The position that was asked for.
        offset: i64,
    },
    /// The partition is not assigned to this consumer.
    #[error("partition {0} is not assigned to this consumer")]
    NotAssigned(String),
    /// The producer was closed before the record was sent.
    #[error("producer is closed")]
    ProducerClosed,
    /// A configuration value is invalid.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// A transactional producer call out of order (a send outside a transaction, a
    /// commit after a failed record, ...).
    #[error("transaction: {0}")]
    TransactionState(String),
    /// The TLS handshake with a broker failed (untrusted certificate, wrong name, a
    /// listener that does not speak TLS...).
    #[error("TLS handshake with {broker} failed: {reason}")]
    TlsHandshake {
        /// `host:port` of the broker.
        broker: String,
        /// What rustls reported.
        reason: String,
    },
    /// The broker refused our SASL credentials.
    #[error("authentication failed: {broker} refused {mechanism} credentials of user {username:?}: {message}")]
    AuthenticationFailed {
        /// `host:port` of the broker.
        broker: String,
        /// The SASL mechanism used.
        mechanism: &'static str,
        /// `sasl.username`.
        username: String,
        /// The broker's reason.
        message: String,
    },
    /// The broker does not offer the configured `sasl.mechanism`.
    #[error("broker {broker} does not support SASL mechanism {mechanism} (it offers: {enabled})")]
    UnsupportedSaslMechanism {
        /// `host:port` of the broker.
        broker: String,
        /// The configured mechanism.
        mechanism: &'static str,
        /// The mechanisms the broker offers, comma-separated.
        enabled: String,
    },
}

impl Error {
    /// The Kafka error code, when the broker sent one.
    pub fn code(&self) -> Option<ResponseError> {
        match self {
            Error::Kafka { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Whether trying again (after a metadata refresh and a backoff) may succeed.
    pub fn is_retriable(&self) -> bool {
        match self {
            Error::Io { .. } | Error::ConnectTimeout { .. } | Error::RequestTimeout { .. } => true,
            Error::LeaderNotAvailable(_) => true,
            Error::Kafka { code, .. } => code.is_retriable(),
            _ => false,
        }
    }

    /// Whether the client's view of the cluster is stale: leadership moved, the topic
    /// is new, or a connection broke.
    pub(crate) fn needs_metadata_refresh(&self) -> bool {
        match self {
            Error::Io { .. } | Error::ConnectTimeout { .. } | Error::RequestTimeout { .. } => true,
            Error::LeaderNotAvailable(_) | Error::UnknownTopic(_) => true,
            Error::Kafka { code, .. } => matches!(
                code,
                ResponseError::NotLeaderOrFollower
                    | ResponseError::UnknownTopicOrPartition
                    | ResponseError::LeaderNotAvailable
                    | ResponseError::FencedLeaderEpoch
                    | ResponseError::UnknownLeaderEpoch
                    // The replica's log dir failed (Kafka's KafkaStorageException is an
                    // InvalidMetadataException): leadership moves to another broker.
                    | ResponseError::KafkaStorageError
            ),
            _ => false,
        }
    }

    pub(crate) fn kafka(code: i16, context: impl Into<String>, message: Option<String>) -> Option<Self> {
        ResponseError::try_from_code(code).map(|code| Error::Kafka { code, context: context.into(), message })
    }

    /// [`Error::kafka`] as a `Result`, so that a call which fails on any error code in a
    /// response can use `?`.
    pub(crate) fn check_kafka(code: i16, context: impl Into<String>, message: Option<String>) -> Result<()> {
        Error::kafka(code, context, message).map_or(Ok(()), Err)
    }

    pub(crate) fn io(broker: &str, source: std::io::Error) -> Self {
        Error::Io { broker: broker.to_string(), source: Arc::new(source) }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_storage_error_is_retried_after_a_metadata_refresh() {
        // The leader's log dir failed: another broker becomes leader, which only fresh
        // metadata tells (before, the producer retried the failed broker until its timeout).
        let e = Error::kafka(56, "produce", None).unwrap();
        assert!(e.is_retriable() && e.needs_metadata_refresh());
        assert!(!Error::kafka(10, "produce", None).unwrap().needs_metadata_refresh(), "MESSAGE_TOO_LARGE");
    }
}
