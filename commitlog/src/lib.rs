//! One partition's log on disk: segments, indexes, recovery, retention, flush.
//!
//! A [`Log`] is an append-only sequence of Kafka RecordBatch v2 batches addressed
//! by logical offsets, stored byte for byte as they travel on the wire (compressed
//! batches stay compressed), split into segment files and deleted a whole segment
//! at a time. A [`LogManager`] holds the partitions of one log dir.
//!
//! # Layout
//! ```text
//! <log dir>/recovery-point-offset-checkpoint   per partition: offset flushed to disk   (LogManager)
//! <log dir>/replication-offset-checkpoint      per partition: high watermark           (LogManager)
//! <log dir>/<topic>-<partition>/
//!     00000000000000000000.log        batches, exactly as on the wire
//!     00000000000000000000.index      sparse (relative offset u32, position u32) every index.interval.bytes
//!     00000000000000000000.timeindex  (timestamp i64, relative offset u32) when the max timestamp grows
//!     leader-epoch-checkpoint         epoch -> start offset
//!     00000000000000000000.txnindex   aborted transactions whose ABORT marker is in the segment (`txn_index`)
//!     00000000000000000000.snapshot   producer state (idempotence, open transactions) as of that offset (`producer_state`)
//!     .clean-shutdown                 log end offset, written by close(): no recovery scan needed
//!     cleaner-offset-checkpoint       compacted logs: first dirty offset, tombstone ages (cleaner)
//!     *.cleaned, *.swap               a clean in progress (see [`cleaner`] for the swap protocol)
//!     *.deleted                       segments waiting for file.delete.delay.ms
//! ```
//! Modules: [`config`] (LogConfig), [`cleaner`] (log compaction), [`files`] (the bounded
//! cache of sealed segments' descriptors), `segment` (one segment and reads within it),
//! `index` (offset and time index), `recovery` (opening a directory), `log` (the
//! partition log), `manager` (the log dir), `log_dirs` (several log dirs, JBOD), `checkpoint` and `epoch` (text files).
//!
//! # Invariants
//! - Offsets only grow; the file name of a segment is the offset of its first
//!   batch; every segment but the last is sealed and never written again.
//! - Nothing is appended that failed validation (framing, magic, CRC-32C, record
//!   count); a failed append leaves the files byte for byte as they were.
//! - Readers never take the writer's lock: they load the log end offset, then an
//!   `Arc` snapshot of the segment list, then the log start offset, then a
//!   segment's published size, and read with positional I/O. The writer publishes
//!   in the opposite order.
//! - After a crash, everything after the recovery point is re-validated and a torn
//!   or corrupt tail is cut off; indexes are derived data, rebuilt when damaged.
//! - Below the recovery point nothing is cut: a batch that fails its CRC, framing or
//!   offset order there (found by a read, on open, or by [`Log::scrub`]) is the
//!   segment's damage, logged once and counted, and every read at or past it fails
//!   with [`Error::CorruptSegment`]: never served, never skipped. [`Log::repair`] and
//!   [`repair_partition`] are the explicit way out: they truncate at the damage and keep
//!   what they cut in a side directory (`repair`), never deleting it.
//! - Checkpoint files are checksummed; a damaged one is rebuilt from the log.
//! - Descriptors do not grow with the segment count ([`files`]).
//! - Compaction (`cleanup.policy=compact`, [`Cleaner`]) only rewrites sealed segments
//!   below the high watermark; kept records keep their offsets, and a cleaned set of
//!   segments replaces the old one through a crash-safe swap that opening a log
//!   finishes or rolls back.
#![warn(missing_docs)]

mod checkpoint;
pub mod cleaner;
pub mod config;
mod epoch;
mod error;
pub mod files;
mod index;
mod lock;
mod log;
mod log_dirs;
mod log_start;
mod manager;
pub mod partition_metadata;
mod producer_state;
mod recovery;
mod repair;
mod segment;
#[cfg(test)]
mod testing;
mod txn_index;

pub use cleaner::{CleanStats, Cleaner, CleanerConfig};
pub use config::{CleanupPolicy, CompressionType, LogConfig, MessageTimestampType, DEFAULT_MIN_SEGMENT_BYTES};
pub use error::{Error, Result};
pub use files::FileCache;
pub use fjord_record::{Offset, TopicPartition};
pub use log::{AppendInfo, Log, ReadSlice, RecordVisitor, TxnVerification, VerificationGuard};
pub use log_dirs::{choose_dir, FutureReplica, LogDirInfo, LogDirs, FUTURE_SUFFIX};
pub use manager::{
    delete_orphan, lock_log_dir, orphans, LogManager, Orphan, Unhealthy, LOCK_FILE, LOG_START_CHECKPOINT, ORPHAN_MARKER,
    RECOVERY_POINT_CHECKPOINT, REPLICATION_CHECKPOINT,
};
pub use producer_state::ProducerInfo;
pub use repair::{repair_partition, MovedAside, Repair, DAMAGED_MARKER, REPAIR_MANIFEST};
pub use txn_index::AbortedTxn;
