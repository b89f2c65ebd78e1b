//! The crate's one error type.

use std::io;
use std::path::PathBuf;

use fjord_record::Offset;

/// Everything that can go wrong in the log. Each variant is a failure a caller may
/// handle differently (the broker maps them to Kafka error codes once, at its edge).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file operation failed.
    #[error("I/O error on {}: {source}", path.display())]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A batch in an append is malformed (framing, magic, CRC, record count, ...).
    /// Nothing was written.
    #[error("invalid record batch at byte {position} of the append: {source}")]
    InvalidBatch {
        /// Byte position of the bad batch inside the appended buffer.
        position: usize,
        /// What is wrong with it.
        #[source]
        source: fjord_record::Error,
    },
    /// A batch (or a whole append) is larger than `max.message.bytes` allows.
    /// Nothing was written.
    #[error("record batch of {size} bytes exceeds the limit of {max} bytes")]
    MessageTooLarge {
        /// Size of the offending batch or append.
        size: usize,
        /// The limit.
        max: usize,
    },
    /// A read asked for an offset outside `[log_start, log_end]`.
    #[error("offset {requested} is out of range [{log_start}, {log_end}]")]
    OffsetOutOfRange {
        /// The offset asked for.
        requested: Offset,
        /// Log start offset at the time of the request.
        log_start: Offset,
        /// Log end offset at the time of the request.
        log_end: Offset,
    },
    /// A configuration key is unknown or its value is invalid.
    #[error("invalid config {key}={value}: {reason}")]
    InvalidConfig {
        /// Kafka config name.
        key: String,
        /// The rejected value.
        value: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// `segment.bytes` is below the broker's floor ([`crate::LogConfig::min_segment_bytes`]).
    #[error(
        "invalid config segment.bytes={value}: below the floor of {min} bytes (broker key log.min.segment.bytes); \
         every segment costs three files, memory and a descriptor while read, so tiny segments exhaust them"
    )]
    SegmentBytesBelowFloor {
        /// The rejected value.
        value: u64,
        /// The floor.
        min: u64,
    },
    /// A replicated append carries offsets below the log end offset or out of order.
    /// Nothing was written.
    #[error("replicated batch at offset {offset} does not follow offset {expected_at_least}")]
    NonMonotonicOffset {
        /// Base offset of the offending batch.
        offset: Offset,
        /// The smallest base offset it could have had.
        expected_at_least: Offset,
    },
    /// A checkpoint file (recovery point, replication offsets, leader epochs) cannot be parsed.
    #[error("malformed checkpoint file {}: line {line}: {detail}", path.display())]
    MalformedCheckpoint {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        detail: &'static str,
    },
    /// A partition directory's `partition.metadata` (its topic id) does not parse: the
    /// partition is not served, and nothing in it is changed or deleted.
    #[error(
        "partition metadata file {} is damaged: {detail}; the partition stays offline and on disk as it is \
         (write Kafka's `version: 0` / `topic_id: <id>` text, or remove the file to adopt the topic's current id)",
        path.display()
    )]
    MalformedPartitionMetadata {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: &'static str,
    },
    /// The log was closed (or deleted) and takes no more writes.
    #[error("log {} is closed", dir.display())]
    Closed {
        /// The partition directory.
        dir: PathBuf,
    },
    /// Records without a key were appended to a compacted log (Kafka's
    /// INVALID_RECORD). Nothing was written.
    #[error(
        "record batch at byte {position} of the append has {} record(s) without a key (the first at index {}), which a compacted topic refuses",
        record_indexes.len(),
        record_indexes.first().copied().unwrap_or_default()
    )]
    MissingKey {
        /// Byte position of the first batch holding one inside the appended buffer.
        position: usize,
        /// Index of each keyless record among the append's records (counted across its
        /// batches, from 0), in order: what Kafka's produce response lists as
        /// `record_errors` (KIP-467), so a client fails only those records.
        record_indexes: Vec<i32>,
    },
    /// A producer's record, or a batch's max timestamp, lies further from the leader's
    /// clock than `message.timestamp.before.max.ms` / `.after.max.ms` allow (Kafka's
    /// INVALID_TIMESTAMP). Nothing was written.
    #[error(
        "record batch at byte {position} of the append has timestamp {timestamp}, outside [{min}, {max}]: \
         message.timestamp.before.max.ms and message.timestamp.after.max.ms around the broker's clock \
         ({} record(s) out of range)",
        record_indexes.len()
    )]
    TimestampOutOfRange {
        /// Byte position of the first batch holding one inside the appended buffer.
        position: usize,
        /// The first timestamp out of range.
        timestamp: i64,
        /// The earliest timestamp accepted.
        min: i64,
        /// The latest timestamp accepted.
        max: i64,
        /// Index of each record out of range among the append's records (counted across
        /// its batches, from 0), as for [`Error::MissingKey`]; empty when only a batch's
        /// max timestamp was.
        record_indexes: Vec<i32>,
    },
    /// The compressed batches of a leader's append expand beyond
    /// [`crate::LogConfig::max_decompressed_bytes`] (a decompression bomb, or records
    /// compressed far better than the limit allows). Decompression stopped at the
    /// limit; nothing was written.
    #[error(
        "the {codec:?}-compressed batch at byte {position} of the append expands its records beyond {limit} bytes \
         ({factor} x max.message.bytes)",
        factor = crate::config::DECOMPRESSION_FACTOR
    )]
    DecompressedTooLarge {
        /// Byte position of the batch inside the appended buffer.
        position: usize,
        /// Its codec.
        codec: fjord_record::Compression,
        /// The limit for the whole append, in decompressed bytes.
        limit: usize,
    },
    /// An idempotent producer's batch does not continue its sequence (Kafka's
    /// OUT_OF_ORDER_SEQUENCE_NUMBER): an earlier batch is missing. Nothing was written.
    #[error("producer {producer_id} (epoch {epoch}): expected sequence {expected}, got {found}")]
    OutOfOrderSequence {
        /// The producer id.
        producer_id: i64,
        /// The batch's producer epoch.
        epoch: i16,
        /// The sequence the next batch must start with.
        expected: i32,
        /// The batch's first sequence.
        found: i32,
    },
    /// An idempotent producer's batch carries an epoch older than the producer's
    /// current one (Kafka's INVALID_PRODUCER_EPOCH): a fenced zombie. Nothing was written.
    #[error("producer {producer_id}: epoch {epoch} is older than the current epoch {current}")]
    InvalidProducerEpoch {
        /// The producer id.
        producer_id: i64,
        /// The batch's epoch.
        epoch: i16,
        /// The producer's current epoch in this log.
        current: i16,
    },
    /// A producer with a transaction open in this log sent a batch outside it (Kafka's
    /// INVALID_TXN_STATE): its data would belong to no transaction. Nothing was written.
    #[error("producer {producer_id} has a transaction open since offset {first_offset} and sent a non-transactional batch")]
    InvalidTxnState {
        /// The producer id.
        producer_id: i64,
        /// First offset of its open transaction.
        first_offset: Offset,
    },
    /// A transactional batch that would open its producer's transaction in this log
    /// without the transaction coordinator having confirmed the partition is in that
    /// transaction (KIP-890; Kafka's INVALID_TXN_STATE): no marker would ever end it, and
    /// the last stable offset would stay behind it for good. Nothing was written.
    #[error("producer {producer_id}: the batch is not part of an ongoing transaction (the transaction coordinator did not confirm this partition is in it)")]
    TransactionNotVerified {
        /// The producer id.
        producer_id: i64,
    },
    /// A transaction marker from a coordinator older than the one that last wrote a
    /// marker for this producer (Kafka's TRANSACTION_COORDINATOR_FENCED). Nothing was written.
    #[error("producer {producer_id}: marker from coordinator epoch {coordinator_epoch}, older than {current}")]
    TransactionCoordinatorFenced {
        /// The producer id.
        producer_id: i64,
        /// The marker's coordinator epoch.
        coordinator_epoch: i32,
        /// The coordinator epoch of the last marker for this producer.
        current: i32,
    },
    /// A segment holds a batch that fails its CRC, framing or offset order (found by a
    /// read, recovery, the scrubber or the cleaner): the data at and after `position`
    /// in this segment is not served (Kafka's CORRUPT_MESSAGE).
    #[error("corrupt batch at byte {position} of {}: {source}", path.display())]
    CorruptSegment {
        /// The segment file.
        path: PathBuf,
        /// Byte position of the batch (or base offset of the batch for record errors).
        position: u64,
        /// What is wrong.
        #[source]
        source: fjord_record::Error,
    },
    /// One batch holds more keys than the cleaner's offset map
    /// (`log.cleaner.dedupe.buffer.size`) can take.
    #[error("cleaning {}: a batch holds more keys than the offset map's {capacity}", dir.display())]
    CleanerBufferTooSmall {
        /// The partition directory.
        dir: PathBuf,
        /// Keys the map holds.
        capacity: usize,
    },
    /// The log dir is locked by another broker or tool (its `.lock` file): stop that
    /// one first.
    #[error("the log dir {} is in use by a running broker or tool (its .lock is held)", path.display())]
    InUse {
        /// The log dir.
        path: PathBuf,
    },
    /// The same partition has a directory in two log dirs (`log.dirs`): the broker does
    /// not start, as nothing tells which copy is the one to serve. Nothing is changed.
    #[error(
        "partition {partition} is in two log dirs, {} and {}: the broker does not start; keep one copy \
         (move the other out of every log dir) and start again",
        first.display(),
        second.display()
    )]
    PartitionInTwoDirs {
        /// The partition.
        partition: String,
        /// Its directory in the first log dir listed.
        first: PathBuf,
        /// Its directory in the other.
        second: PathBuf,
    },
    /// The partition is (or may be) in a log dir that failed: it is not served, and not
    /// created anew elsewhere, as its data may still be in the failed directory.
    #[error("partition {partition} is not served: {reason}")]
    LogDirOffline {
        /// The partition.
        partition: String,
        /// Which directory failed, and why.
        reason: String,
    },
    /// A replica move to another log dir was cancelled (the broker stops) before its
    /// pause: the copy is deleted, and the partition stays and serves where it was.
    #[error("moving partition {partition} to another log dir was cancelled; it stays where it was")]
    MoveCancelled {
        /// The partition.
        partition: String,
    },
    /// A segment swap stopped after its commit point; reopening the log finishes it.
    #[error("segment swap in {} interrupted: {source}", dir.display())]
    SwapInterrupted {
        /// The partition directory.
        dir: PathBuf,
        /// Why it stopped.
        #[source]
        source: Box<Error>,
    },
    /// A segment's `.log` is not a readable regular file (a directory, a link to nothing,
    /// a device): the log is not opened and nothing in its directory is changed, as a
    /// log opened without that segment would be shorter than what was acknowledged.
    #[error(
        "segment {} is {found}, not a readable file: the log is not opened and nothing in its directory was changed; \
         restore the file (or move the partition directory aside)",
        path.display()
    )]
    UnreadableSegment {
        /// The segment's `.log` path.
        path: PathBuf,
        /// What is there instead.
        found: String,
    },
    /// An earlier swap was interrupted: this log is not cleaned again until reopened.
    #[error("the cleaner stopped on {} after an interrupted swap; reopen the log", dir.display())]
    CleanerStopped {
        /// The partition directory.
        dir: PathBuf,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Adds the path to an `io::Error`.
pub(crate) trait IoContext<T> {
    fn at(self, path: impl Into<PathBuf>) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn at(self, path: impl Into<PathBuf>) -> Result<T> {
        self.map_err(|source| Error::Io { path: path.into(), source })
    }
}
