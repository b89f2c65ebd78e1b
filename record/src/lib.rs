//! The wire formats shared by the log, the broker and the clients: Kafka's RecordBatch
//! v2 ("magic 2"), exactly as it travels on the wire and lies on disk, and the walk
//! that checks a protocol message's structure before a codec decodes it.
//!
//! # Layout
//! - [`batch`]: a validated, zero-copy view of one batch header ([`BatchHeader`]),
//!   CRC-32C checking, and the in-place rewrite of the fields the broker owns
//!   (base offset, partition leader epoch), which the CRC deliberately does not cover.
//! - [`records`]: iteration over the records of an uncompressed batch (or of the
//!   records section that [`compression::records_body`] decompressed).
//! - [`builder`]: a fast batch builder (uncompressed, or compressed once at the end).
//! - [`control`]: transaction markers (COMMIT/ABORT control batches), built and read.
//! - [`compression`]: the gzip, snappy (xerial), lz4 (frame) and zstd codecs, bounded
//!   decompression, and the records section of a possibly compressed batch.
//! - [`varint`]: the zig-zag varints used inside records.
//! - [`walk`]: a structural walk over a Kafka message body, so that the broker (over
//!   requests) and the client (over answers) refuse a message whose array counts would
//!   make the codec crate's decoder abort the process on allocation.
//! - [`answers`]: the schemas of the answers a broker sends, walked with [`walk`]: one
//!   copy for the client's connections and the broker's connections to its peers.
//!
//! # Invariants
//! A batch that [`BatchHeader::parse`] accepted has a consistent length, magic 2 and a
//! CRC that matches its bytes; nothing in this crate ever hands out a byte range that
//! has not been checked that way.
#![warn(missing_docs)]

pub mod answers;
pub mod batch;
pub mod builder;
pub mod compression;
pub mod control;
pub mod records;
pub mod varint;
pub mod walk;

pub use batch::{BatchHeader, Compression, TimestampType, BATCH_OVERHEAD, NO_PRODUCER_ID};
pub use builder::BatchBuilder;
pub use records::{Header, Record, RecordFrame, Records};

use std::fmt;

/// The wall clock as record timestamps count it: milliseconds since the Unix epoch (0
/// for a clock set before 1970). The one clock helper of the crates above this one:
/// CreateTime and LogAppendTime stamps, retention, flush and expiry deadlines. Inline, as
/// the crate-local copies it replaced were: the producer calls it per record.
#[inline]
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// A partition of a topic: the unit of ordering, storage and replication.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicPartition {
    /// Topic name.
    pub topic: String,
    /// Partition number, starting at 0.
    pub partition: i32,
}

impl TopicPartition {
    /// Creates a topic-partition.
    pub fn new(topic: impl Into<String>, partition: i32) -> Self {
        Self { topic: topic.into(), partition }
    }

    /// The partition's directory name in a log dir: `<topic>-<partition>`.
    pub fn dir_name(&self) -> String {
        format!("{}-{}", self.topic, self.partition)
    }
}

impl fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.topic, self.partition)
    }
}

/// A logical offset: the position of a record in its partition, starting at 0.
/// Kafka's wire format carries offsets as signed 64-bit integers, so do we.
pub type Offset = i64;

/// Why a byte range is not a valid RecordBatch v2.
#[derive(Debug, thiserror::Error, PartialEq, Eq, Clone)]
#[non_exhaustive]
pub enum Error {
    /// Fewer bytes than a batch header, or than the length the header announces.
    #[error("truncated batch: need {needed} bytes, have {available}")]
    Truncated {
        /// Bytes the header (or the length field) requires.
        needed: usize,
        /// Bytes actually present.
        available: usize,
    },
    /// The batch length field is smaller than the fixed header or negative.
    #[error("invalid batch length {0}")]
    InvalidLength(i32),
    /// Not a v2 batch.
    #[error("unsupported magic byte {0} (only RecordBatch v2 is accepted)")]
    UnsupportedMagic(i8),
    /// The stored CRC-32C does not match the bytes.
    #[error("CRC mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    CrcMismatch {
        /// CRC in the header.
        stored: u32,
        /// CRC of the bytes.
        computed: u32,
    },
    /// The record count contradicts the header or the records themselves.
    #[error("record count {count} does not match the batch ({detail})")]
    RecordCountMismatch {
        /// Count in the header.
        count: i32,
        /// What it contradicts.
        detail: &'static str,
    },
    /// A record inside an uncompressed batch is malformed.
    #[error("malformed record at byte {position} of the batch: {detail}")]
    MalformedRecord {
        /// Byte position inside the batch.
        position: usize,
        /// What is wrong.
        detail: &'static str,
    },
    /// Compression codec bits hold a value Kafka does not define.
    #[error("unknown compression codec {0}")]
    UnknownCompression(u8),
    /// A codec failed to compress (only I/O into memory, so practically never).
    #[error("{codec:?} compression failed: {detail}")]
    Compression {
        /// The codec.
        codec: Compression,
        /// The codec's message.
        detail: String,
    },
    /// A compressed records section is corrupt.
    #[error("{codec:?} decompression failed: {detail}")]
    Decompression {
        /// The codec.
        codec: Compression,
        /// What went wrong.
        detail: String,
    },
    /// A compressed records section expands beyond the allowed size (a decompression
    /// bomb, or a batch larger than the limit allows); decompression stopped there.
    #[error("{codec:?} records expand beyond the limit of {limit} bytes")]
    DecompressedTooLarge {
        /// The codec.
        codec: Compression,
        /// The limit, in decompressed bytes.
        limit: usize,
    },
    /// The records inside a compressed batch do not walk (decompressed, they are not
    /// records of the batch's count and offsets).
    #[error("inside the {codec:?}-compressed records: {source}")]
    CompressedRecords {
        /// The codec.
        codec: Compression,
        /// What is wrong, with positions counted in the decompressed records section.
        source: Box<Error>,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn now_ms_is_the_unix_clock_in_milliseconds() {
        let unix_ms = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
        let (before, now, after) = (unix_ms(), now_ms(), unix_ms());
        assert!(before <= now && now <= after, "{before} <= {now} <= {after}");
    }
}
