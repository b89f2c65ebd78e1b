//! [`Log`]: one partition's log (see the crate docs for the model).
//!
//! This file owns the `Log` and its writer state, opening and closing, and the
//! offsets and settings readers ask for. The operations live beside it, one concern
//! a file, each an `impl Log` block over the same private state:
//! - `append`: leader and follower appends, rolling segments, index writes;
//! - `validate`: the checks an append passes before anything is written;
//! - `read`: reads by offset and by timestamp;
//! - `flush`: fsync and the flush policy;
//! - `truncate`: truncation (followers, repair);
//! - `retention`: retention, DeleteRecords and the delayed deletion of segment files;
//! - `compaction`: swapping a cleaned segment in (the cleaner itself is `crate::cleaner`);
//! - `scrub`: finding and repairing damaged batches;
//! - `txn`: transaction markers, the last stable offset, aborted transactions.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use fjord_record::{now_ms, Offset};

use crate::checkpoint::sync_dir;
use crate::cleaner::{CleanStats, CleanerState};
use crate::epoch::EpochCache;
use crate::error::IoContext;
use crate::producer_state::{ProducerInfo, ProducerState};
use crate::recovery::{self, Active, CLEAN_SHUTDOWN};
use crate::segment::{Segment, LOG_SUFFIX};
use crate::{lock, Error, LogConfig, Result};

mod append;
mod compaction;
mod flush;
mod read;
mod retention;
mod scrub;
mod truncate;
mod txn;
mod validate;

pub use append::AppendInfo;
pub use read::ReadSlice;
pub use txn::{TxnVerification, VerificationGuard};
pub use validate::RecordVisitor;

type SegmentMap = BTreeMap<Offset, Arc<Segment>>;

/// One partition's log: a directory of segments. `Send + Sync`; share it as
/// `Arc<Log>`. Appends, truncation, flush and retention serialize on one writer
/// lock; reads never take it.
#[derive(Debug)]
pub struct Log {
    dir: PathBuf,
    config: RwLock<LogConfig>,
    writer: Mutex<Writer>,
    /// The segments readers see; replaced whole (copy on write) by the writer.
    view: RwLock<Arc<SegmentMap>>,
    log_end_offset: AtomicI64,
    log_start_offset: AtomicI64,
    high_watermark: AtomicI64,
    recovery_point: AtomicI64,
    size_bytes: AtomicU64,
    last_flush_ms: AtomicI64,
    /// Compaction state; also serializes cleans of this log.
    pub(crate) cleaner: Mutex<CleanerState>,
    /// What the last clean did (for metrics).
    pub(crate) last_clean: Mutex<Option<CleanStats>>,
    /// Counts truncations: a clean that saw a truncation happen drops its output.
    pub(crate) truncations: AtomicU64,
    /// Lowest offset truncated to since the last clean started (`Offset::MAX`: none).
    pub(crate) truncated_below: AtomicI64,
    /// Where the scrubber goes on: (segment base offset, byte position).
    scrub_cursor: Mutex<(Offset, u64)>,
    /// Undecided transactions, for the last stable offset (see `txn`).
    unstable: Mutex<txn::Unstable>,
}

#[derive(Debug)]
struct Writer {
    segments: SegmentMap,
    active: Active,
    epochs: EpochCache,
    /// Idempotent producers: changed only together with the segments, under this lock.
    producers: ProducerState,
    /// Transactions being verified with their coordinator (see `txn`).
    verifications: txn::Verifications,
    unflushed_messages: u64,
    /// Segments sealed since the last flush: their files still need an fsync.
    unsynced: Vec<Arc<Segment>>,
    /// Segment files were created or renamed since the last flush.
    dir_dirty: bool,
    pending_deletes: Vec<(Instant, Vec<PathBuf>)>,
    closed: bool,
}

impl Log {
    /// Opens the partition directory `dir`, creating it when missing. Without a
    /// clean shutdown marker every segment is re-validated (see
    /// [`Log::open_with_recovery_point`] to skip the flushed part).
    pub fn open(dir: impl Into<PathBuf>, config: LogConfig) -> Result<Log> {
        Self::open_with_recovery_point(dir, config, 0)
    }

    /// Opens `dir` trusting everything below `recovery_point` (from the log dir's
    /// `recovery-point-offset-checkpoint`) and re-validating the rest.
    pub fn open_with_recovery_point(dir: impl Into<PathBuf>, config: LogConfig, recovery_point: Offset) -> Result<Log> {
        config.validate()?;
        let dir = dir.into();
        let loaded = recovery::load(&dir, &config, recovery_point)?;
        let (mut epochs, damaged) = EpochCache::load(&dir);
        if damaged {
            epochs.rebuild(epoch_starts(&loaded.segments)?)?;
        }
        let log_start = *loaded.segments.keys().next().expect("invariant: at least one segment");
        epochs.truncate_from_end(loaded.log_end_offset)?;
        epochs.truncate_from_start(log_start)?;
        let size: u64 = loaded.segments.values().map(|s| s.size()).sum();
        // The producer state replays at least the unflushed part, whose aborted-transactions
        // index may lack entries, and everything from a segment whose index is damaged.
        let mut replay_from = loaded.recovery_point;
        for seg in loaded.segments.values() {
            if crate::txn_index::entries_on_disk(seg)?.is_none() {
                tracing::warn!(dir = %dir.display(), segment = seg.base_offset, "rebuilding a damaged aborted-transactions index");
                replay_from = replay_from.min(seg.base_offset);
                break;
            }
        }
        let mut producers = ProducerState::new(&dir).limit(config.max_producers);
        let replayed = producers.reload(loaded.segments.values(), log_start, loaded.log_end_offset, replay_from)?;
        txn::rebuild_indexes(loaded.segments.values(), &replayed)?;
        let unstable = producers.open_transactions().map(|(first, _)| (first, None)).collect();
        let view = Arc::new(loaded.segments.clone());
        Ok(Log {
            log_end_offset: AtomicI64::new(loaded.log_end_offset),
            log_start_offset: AtomicI64::new(log_start),
            high_watermark: AtomicI64::new(log_start),
            recovery_point: AtomicI64::new(loaded.recovery_point),
            size_bytes: AtomicU64::new(size),
            last_flush_ms: AtomicI64::new(now_ms()),
            writer: Mutex::new(Writer {
                segments: loaded.segments,
                active: loaded.active,
                epochs,
                producers,
                verifications: txn::Verifications::default(),
                unflushed_messages: 0,
                unsynced: Vec::new(),
                dir_dirty: true,
                pending_deletes: Vec::new(),
                closed: false,
            }),
            view: RwLock::new(view),
            config: RwLock::new(config),
            cleaner: Mutex::new(CleanerState::load(&dir)),
            last_clean: Mutex::new(None),
            truncations: AtomicU64::new(0),
            truncated_below: AtomicI64::new(Offset::MAX),
            scrub_cursor: Mutex::new((Offset::MIN, 0)),
            unstable: Mutex::new(unstable),
            dir,
        })
    }

    /// The partition directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn lock_writer(&self) -> Result<std::sync::MutexGuard<'_, Writer>> {
        let w = lock::mutex(&self.writer);
        if w.closed {
            return Err(Error::Closed { dir: self.dir.clone() });
        }
        Ok(w)
    }

    fn publish(&self, w: &Writer) {
        *lock::write(&self.view) = Arc::new(w.segments.clone());
    }

    pub(crate) fn view(&self) -> Arc<SegmentMap> {
        lock::read(&self.view).clone()
    }

    /// The first offset in the log.
    pub fn log_start_offset(&self) -> Offset {
        self.log_start_offset.load(Ordering::Acquire)
    }

    /// The offset the next appended record gets.
    pub fn log_end_offset(&self) -> Offset {
        self.log_end_offset.load(Ordering::Acquire)
    }

    /// The high watermark (set by replication; reads for consumers stop there).
    pub fn high_watermark(&self) -> Offset {
        self.high_watermark.load(Ordering::Acquire)
    }

    /// Sets the high watermark, clamped to `[log start, log end]`.
    pub fn set_high_watermark(&self, offset: Offset) {
        let clamped = offset.min(self.log_end_offset()).max(self.log_start_offset());
        self.high_watermark.store(clamped, Ordering::Release);
    }

    /// Every offset below this one is fsynced.
    pub fn recovery_point(&self) -> Offset {
        self.recovery_point.load(Ordering::Acquire)
    }

    /// The current configuration.
    pub fn config(&self) -> LogConfig {
        *lock::read(&self.config)
    }

    /// Replaces the configuration (it applies from the next append or retention run).
    pub fn update_config(&self, config: LogConfig) -> Result<()> {
        config.validate()?;
        *lock::write(&self.config) = config;
        Ok(())
    }

    /// Bytes in all segments.
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes.load(Ordering::Acquire)
    }

    /// Number of segments (including the active one).
    pub fn segment_count(&self) -> usize {
        self.view().len()
    }

    /// `(epoch, start offset)` pairs of the leader epoch cache, oldest first.
    pub fn leader_epochs(&self) -> Vec<(i32, Offset)> {
        lock::mutex(&self.writer).epochs.entries().to_vec()
    }

    /// For OffsetForLeaderEpoch: the largest epoch `<= epoch` this log knows and the
    /// offset where it ended (the next epoch's start, or the log end offset).
    pub fn end_offset_for_epoch(&self, epoch: i32) -> Option<(i32, Offset)> {
        let w = lock::mutex(&self.writer);
        w.epochs.end_offset_for(epoch, self.log_end_offset())
    }

    /// The idempotent producers this log knows, by producer id.
    pub fn producers(&self) -> Vec<ProducerInfo> {
        lock::mutex(&self.writer).producers.info()
    }

    /// Flushes, snapshots the producer state, deletes pending `.deleted` files, and
    /// writes the clean shutdown marker so the next open needs no recovery scan. Later
    /// writes fail with [`Error::Closed`]; reads keep working.
    pub fn close(&self) -> Result<()> {
        let mut w = lock::mutex(&self.writer);
        if w.closed {
            return Ok(());
        }
        w.active.release_reserved().at(w.active.segment.path(LOG_SUFFIX))?;
        self.flush_locked(&mut w)?;
        w.producers.snapshot(self.log_end_offset())?;
        self.delete_expired(&mut w, true)?;
        let marker = self.dir.join(CLEAN_SHUTDOWN);
        let mut f = File::create(&marker).at(&marker)?;
        f.write_all(self.log_end_offset().to_string().as_bytes()).at(&marker)?;
        f.sync_all().at(&marker)?;
        sync_dir(&self.dir)?;
        w.closed = true;
        Ok(())
    }

    /// Closes the log and removes its directory.
    pub fn delete(&self) -> Result<()> {
        let mut w = lock::mutex(&self.writer);
        w.closed = true;
        w.pending_deletes.clear();
        fs::remove_dir_all(&self.dir).at(&self.dir)
    }

    /// What the last clean of this log did (`None` before the first one).
    pub fn last_clean(&self) -> Option<CleanStats> {
        *lock::mutex(&self.last_clean)
    }
}

#[cfg(test)]
mod tests;

/// `(leader epoch, base offset)` of every batch whose epoch differs from the one
/// before: what a damaged `leader-epoch-checkpoint` is rebuilt from. Reads only the
/// batch headers.
fn epoch_starts(segments: &SegmentMap) -> Result<Vec<(i32, Offset)>> {
    let mut out: Vec<(i32, Offset)> = Vec::new();
    for seg in segments.values() {
        let path = seg.path(LOG_SUFFIX);
        let file = seg.log()?;
        let mut walk = crate::segment::Walker::new(&file, 0, seg.size());
        while let crate::segment::Step::Batch { header, .. } = walk.step(false).at(&path)? {
            if out.last().is_none_or(|(e, _)| *e != header.partition_leader_epoch) {
                out.push((header.partition_leader_epoch, header.base_offset));
            }
        }
    }
    Ok(out)
}
