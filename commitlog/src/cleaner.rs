//! Log compaction (`cleanup.policy=compact`): the [`Cleaner`] rewrites the sealed
//! segments of a log keeping, per key, only the record with the highest offset.
//!
//! # Model
//! - The log is split at the *first dirty offset* (persisted per partition in
//!   `cleaner-offset-checkpoint`): below it every key appears at most once (it was
//!   cleaned); from it to the *cleanable end* it is dirty. The cleanable end is the
//!   base of the active segment, of the segment holding the high watermark, or of
//!   the first segment whose largest timestamp is younger than
//!   `min.compaction.lag.ms`, whichever is lowest. The active segment is never touched.
//! - A pass fills an offset map (key hash → latest offset) from the dirty records,
//!   stopping at a batch boundary when the map is full, then rewrites every sealed
//!   segment below where the map stopped: a record is dropped when the map holds a
//!   later offset for its key, or when it is a tombstone first cleaned more than
//!   `delete.retention.ms` ago. Kept records keep their offsets (and their bytes):
//!   a batch keeps its base offset, last offset delta, producer fields and codec;
//!   only its record count, length and CRC change. Control batches (transaction
//!   markers) are kept; the records of aborted transactions (from the segments'
//!   `.txnindex`) go, and never enter the map, so they shadow nothing. The cleanable
//!   end is at most the last stable offset, so every transaction below it is decided.
//!   A marker whose transaction has no record left goes too, once it was first cleaned
//!   more than `delete.retention.ms` ago (Kafka's second pass; see `Pass::drop_marker`).
//!   When the dirty keys do not fit the map, several passes run.
//! - Consecutive cleaned segments are merged while their source sizes fit
//!   `segment.bytes`, so a compacted log does not keep one tiny file per old segment.
//!
//! # Crash-safe swap
//! ```text
//! 1. write <base>.{log,index,timeindex}.cleaned, fsync them and the directory
//! 2. rename the index files to .swap, then the .log to .swap   <- commit point
//! 3. rename the replaced segments to .deleted (deleted after file.delete.delay.ms)
//! 4. rename the .swap files to their final names, fsync the directory
//! ```
//! On open (`finish_interrupted_swaps`): `.cleaned` files and index `.swap` files
//! without a `<base>.log.swap` are an uncommitted clean and are removed; a
//! `<base>.log.swap` is committed: the segments it replaces (base offsets in
//! `(base, its next offset)`) are removed and it is installed, its indexes rebuilt
//! when their `.swap` is gone. Old segments above its next offset that a crash left
//! behind only hold records the clean dropped (superseded later in the log, or
//! expired tombstones) next to everything they held, so reads stay correct (every
//! latest value is there, offsets increase) and the next clean removes them; the
//! cleaner checkpoint is only written after a swap, so that clean redoes the range.
//!
//! Tombstone ages: the checkpoint also keeps, per range of offsets, when the
//! cleaner first passed over it; a tombstone goes once that is `delete.retention.ms`
//! old. Ranges older than that collapse into one "expired below" offset.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fjord_record::{Offset, TopicPartition};

use crate::{Error, Log, LogManager, Result};

mod offset_map;
mod plan;
mod rewrite;
mod state;
mod swap;

use offset_map::{build_map, OffsetMap};
use plan::{cleanable_end, group_segments};
pub(crate) use rewrite::Cleaned;
use rewrite::{clean_group, Aborted, Pass};
pub(crate) use state::CleanerState;
pub(crate) use swap::{finish_interrupted_swaps, remove_cleaned, suffixed};

/// The per-partition cleaner checkpoint.
pub(crate) const CLEANER_CHECKPOINT: &str = "cleaner-offset-checkpoint";
/// Suffix of cleaned files being written (step 1).
pub(crate) const CLEANED_SUFFIX: &str = ".cleaned";
/// Suffix of committed cleaned files not yet installed (steps 2–4).
pub(crate) const SWAP_SUFFIX: &str = ".swap";
/// Bytes one offset map slot takes: a 128-bit key hash and an offset.
const SLOT_BYTES: usize = 24;
/// At most this many tombstone age ranges are kept; older neighbours merge
/// (keeping the later time, so tombstones only ever stay longer).
const MAX_HORIZONS: usize = 256;
/// Decompressed records sections larger than this are refused (a corrupt batch).
pub(crate) const MAX_DECOMPRESSED: usize = 1 << 30;
/// Buffered output per cleaned segment.
const WRITE_BUFFER: usize = 1 << 20;

/// Broker-level cleaner settings (Kafka's `log.cleaner.*` names).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CleanerConfig {
    /// `log.cleaner.dedupe.buffer.size`: bytes of the offset map (24 bytes a key,
    /// filled to 75 %). Default 128 MiB (about 4 million keys per pass).
    pub dedupe_buffer_size: usize,
    /// `log.cleaner.io.max.bytes.per.second`: read plus written bytes per second;
    /// `None` (default) is unthrottled.
    pub io_max_bytes_per_second: Option<f64>,
    /// `log.cleaner.backoff.ms`: how often the broker should call
    /// [`Cleaner::clean_due`]. Default 15 s.
    pub backoff: Duration,
}

impl Default for CleanerConfig {
    fn default() -> Self {
        Self { dedupe_buffer_size: 128 << 20, io_max_bytes_per_second: None, backoff: Duration::from_secs(15) }
    }
}

impl CleanerConfig {
    /// The Kafka broker config names [`CleanerConfig::set`] understands.
    pub const KEYS: &'static [&'static str] =
        &["log.cleaner.dedupe.buffer.size", "log.cleaner.io.max.bytes.per.second", "log.cleaner.backoff.ms"];

    /// Sets one value by its Kafka broker config name. Bad keys or values are
    /// [`Error::InvalidConfig`] and change nothing.
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let bad = |reason| Error::InvalidConfig { key: key.to_owned(), value: value.to_owned(), reason };
        match key {
            "log.cleaner.dedupe.buffer.size" => {
                let v: usize = value.trim().parse().map_err(|_| bad("not a non-negative integer"))?;
                if v < SLOT_BYTES * 16 {
                    return Err(bad("must be at least 384 bytes"));
                }
                self.dedupe_buffer_size = v;
            }
            "log.cleaner.io.max.bytes.per.second" => {
                let v: f64 = value.trim().parse().map_err(|_| bad("not a number"))?;
                if v.is_nan() || v <= 0.0 {
                    return Err(bad("must be positive"));
                }
                // Kafka's default is Double.MAX_VALUE: unthrottled.
                self.io_max_bytes_per_second = (v < f64::MAX).then_some(v);
            }
            "log.cleaner.backoff.ms" => {
                let v: u64 = value.trim().parse().map_err(|_| bad("not a non-negative integer"))?;
                self.backoff = Duration::from_millis(v);
            }
            _ => return Err(bad("unknown cleaner config")),
        }
        Ok(())
    }
}

/// What one clean of one log did (also its status for logs and metrics).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CleanStats {
    /// Dirty bytes / cleanable bytes when the clean started.
    pub dirty_ratio: f64,
    /// First dirty offset when the clean started.
    pub first_dirty_before: Offset,
    /// First dirty offset after the clean (everything below is cleaned).
    pub first_dirty_after: Offset,
    /// Offset map fills (more than one when the dirty keys did not fit).
    pub passes: u32,
    /// Source segments rewritten.
    pub segments_cleaned: usize,
    /// Bytes read (map building and rewriting).
    pub bytes_read: u64,
    /// Bytes of the source segments that were rewritten.
    pub bytes_before: u64,
    /// Bytes of the cleaned segments that replaced them.
    pub bytes_after: u64,
    /// Records read while rewriting.
    pub records_read: u64,
    /// Records kept.
    pub records_kept: u64,
    /// Tombstones dropped because they were older than `delete.retention.ms`.
    pub tombstones_removed: u64,
    /// Transaction markers dropped: no record of their transaction was left, and they
    /// were first cleaned more than `delete.retention.ms` ago (Kafka's second pass).
    pub markers_removed: u64,
    /// Wall time spent, throttling included.
    pub elapsed: Duration,
    /// When the clean ran (the `now_ms` it was given).
    pub at_ms: i64,
}

/// A point of the segment swap, passed to a [`SwapHook`] before it happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SwapStep {
    /// The `.cleaned` files are written and fsynced; next: rename to `.swap`.
    Commit,
    /// Next: rename this file of the new segment from `.cleaned` to `.swap`.
    RenameToSwap(&'static str),
    /// Next: rename the replaced segment at this base offset to `.deleted`.
    DeleteOld(Offset),
    /// Next: rename this file of the new segment from `.swap` to its final name.
    Install(&'static str),
}

/// Fault injection for crash tests: called before each [`SwapStep`]; an error stops
/// the swap right there, leaving the files as a crash at that point would.
pub type SwapHook = Box<dyn FnMut(SwapStep) -> io::Result<()> + Send>;

/// Drives compaction of any number of logs with one offset map (allocated on first
/// use and reused, so memory stays at `dedupe_buffer_size`) and one I/O throttle.
pub struct Cleaner {
    config: CleanerConfig,
    map: Option<OffsetMap>,
    hook: Option<SwapHook>,
}

impl std::fmt::Debug for Cleaner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cleaner").field("config", &self.config).finish_non_exhaustive()
    }
}

impl Cleaner {
    /// A cleaner with `config`.
    pub fn new(config: CleanerConfig) -> Self {
        Self { config, map: None, hook: None }
    }

    /// Installs a fault-injection hook (see [`SwapHook`]).
    pub fn set_swap_hook(&mut self, hook: SwapHook) {
        self.hook = Some(hook);
    }

    /// How many keys one pass can deduplicate.
    pub fn map_capacity(&self) -> usize {
        OffsetMap::max_entries_for(self.config.dedupe_buffer_size)
    }

    /// The periodic task: cleans every compacted log of `logs` whose dirty ratio is
    /// at least its `min.cleanable.dirty.ratio` or whose oldest tombstone has
    /// expired, dirtiest first. Returns each log it cleaned with the outcome, for the
    /// caller to log; one log's failure does not keep the others from being cleaned.
    /// Blocking (file I/O, throttling sleeps): run it off the async runtime.
    pub fn clean_due(&mut self, logs: &LogManager, now_ms: i64) -> Vec<(TopicPartition, Result<CleanStats>)> {
        let mut due: Vec<(f64, TopicPartition, Arc<Log>)> = Vec::new();
        for tp in logs.partitions() {
            let Some(log) = logs.get(&tp) else { continue };
            let config = log.config();
            if !config.cleanup_policy.compacts() {
                continue;
            }
            let ratio = log.cleanable_ratio(now_ms).unwrap_or(0.0);
            let tombstones = crate::lock::mutex(&log.cleaner).tombstones_due.is_some_and(|t| t <= now_ms);
            let overdue = ratio > 0.0 && log.compaction_overdue(now_ms);
            if (ratio >= config.min_cleanable_dirty_ratio && ratio > 0.0) || tombstones || overdue {
                due.push((ratio, tp, log));
            }
        }
        due.sort_by(|a, b| b.0.total_cmp(&a.0));
        let mut out = Vec::new();
        for (_, tp, log) in due {
            let result = self.clean(&log, now_ms);
            out.push((tp, result));
        }
        out
    }

    /// Cleans `log` now, whatever its dirty ratio (a log whose `cleanup.policy` does
    /// not compact is left alone): passes until everything below the cleanable end
    /// is clean, plus one pass without new data when kept tombstones have expired.
    pub fn clean(&mut self, log: &Log, now_ms: i64) -> Result<CleanStats> {
        let started = Instant::now();
        let config = log.config();
        let mut stats = CleanStats { at_ms: now_ms, ..CleanStats::default() };
        if !config.cleanup_policy.compacts() {
            return Ok(stats);
        }
        let mut state = crate::lock::mutex(&log.cleaner);
        if state.failed {
            return Err(Error::CleanerStopped { dir: log.dir().to_path_buf() });
        }
        let truncated = log.truncated_below.swap(Offset::MAX, std::sync::atomic::Ordering::AcqRel);
        state.truncated(truncated.min(log.log_end_offset()));
        state.first_dirty = state.first_dirty.max(log.log_start_offset());
        stats.first_dirty_before = state.first_dirty;
        stats.first_dirty_after = state.first_dirty;
        stats.dirty_ratio = log.cleanable_ratio_with(state.first_dirty, now_ms).unwrap_or(0.0);
        let capacity = self.config.dedupe_buffer_size;
        let map = self.map.get_or_insert_with(|| OffsetMap::new(capacity));
        let mut throttle = Throttle::new(self.config.io_max_bytes_per_second);
        // The end is fixed when the clean starts: under steady appends, later passes
        // would otherwise chase an end that keeps moving.
        let target = cleanable_end(&log.view(), now_ms, config.min_compaction_lag, log.last_stable_offset());
        let mut tombstone_pass_done = false;
        loop {
            let view = log.view();
            let truncations = log.truncations.load(std::sync::atomic::Ordering::Acquire);
            let clean_end = target.min(cleanable_end(&view, now_ms, config.min_compaction_lag, log.last_stable_offset()));
            let dirty = clean_end > state.first_dirty;
            // Nothing new, but tombstones (or markers) below the first dirty offset have
            // expired: one pass with an empty map drops them.
            let tombstones = !dirty && !tombstone_pass_done && state.tombstones_due.is_some_and(|t| t <= now_ms);
            if !dirty && !tombstones {
                break;
            }
            map.clear();
            // Below the cleanable end every transaction is decided (it is at most the LSO).
            let aborted = Aborted::load(log, log.log_start_offset(), clean_end.max(state.first_dirty))?;
            let map_end = if dirty {
                let end = build_map(&view, state.first_dirty, clean_end, map, &aborted, &mut throttle, &mut stats)?;
                if end == state.first_dirty {
                    return Err(Error::CleanerBufferTooSmall { dir: log.dir().to_path_buf(), capacity: map.max_entries });
                }
                end
            } else {
                state.first_dirty
            };
            stats.passes += 1;
            let producer_last: std::collections::HashMap<i64, Offset> =
                log.producers().into_iter().map(|p| (p.producer_id, p.last_offset)).collect();
            let pass = Pass {
                map,
                map_end,
                now_ms,
                delete_retention: config.delete_retention,
                horizons: &state,
                tombstones_due: std::cell::Cell::new(None),
                aborted: &aborted,
                txn_kept: Default::default(),
                producer_last: &producer_last,
            };
            let groups = group_segments(&view, map_end, config.segment_bytes);
            let mut outcome = Ok(true);
            for group in groups {
                outcome = clean_group(log, &group, truncations, &pass, &mut throttle, &mut stats, &mut self.hook);
                if !matches!(outcome, Ok(true)) {
                    break;
                }
            }
            let tombstones_due = pass.tombstones_due.get();
            match outcome {
                Ok(true) => {}
                // Retention or truncation changed the segments meanwhile: next time.
                Ok(false) => break,
                Err(e) => {
                    state.failed = matches!(e, Error::SwapInterrupted { .. });
                    return Err(e);
                }
            }
            if dirty {
                state.record_pass(map_end, now_ms, config.delete_retention);
            }
            // Every pass rewrites everything below its end: it saw every kept tombstone.
            state.tombstones_due = tombstones_due;
            state.save(log.dir())?;
            stats.first_dirty_after = map_end;
            tombstone_pass_done = !dirty;
        }
        stats.elapsed = started.elapsed();
        drop(state);
        *crate::lock::mutex(&log.last_clean) = Some(stats);
        Ok(stats)
    }
}

/// Sleeps so that bytes counted stay under the configured rate.
pub(super) struct Throttle {
    rate: Option<f64>,
    start: Instant,
    bytes: u64,
}

impl Throttle {
    pub(super) fn new(rate: Option<f64>) -> Self {
        Self { rate, start: Instant::now(), bytes: 0 }
    }

    pub(super) fn account(&mut self, bytes: usize) {
        self.bytes += bytes as u64;
        if let Some(rate) = self.rate {
            let due = Duration::from_secs_f64(self.bytes as f64 / rate);
            let elapsed = self.start.elapsed();
            if due > elapsed {
                std::thread::sleep(due - elapsed);
            }
        }
    }
}

#[cfg(test)]
mod tests;
