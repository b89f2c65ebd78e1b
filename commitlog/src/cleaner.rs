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

use std::collections::hash_map::DefaultHasher;
use std::fs::{self, File, OpenOptions};
use std::hash::Hasher;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fjord_record::batch::BatchHeader;
use fjord_record::{Compression, Offset, Records, TopicPartition, BATCH_OVERHEAD};

use crate::checkpoint::sync_dir;
use crate::error::IoContext;
use crate::index::{self, IndexBuilder, OffsetEntry, TimeEntry};
use crate::segment::{segment_path, Segment, Step, Walker, INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX};
use crate::{Error, Log, LogManager, Result};

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
            // Nothing new, but tombstones below the first dirty offset have expired:
            // one pass with an empty map drops them.
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
            let pass = Pass {
                map,
                map_end,
                now_ms,
                delete_retention: config.delete_retention,
                horizons: &state,
                tombstones_due: std::cell::Cell::new(None),
                aborted: &aborted,
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

/// The persisted cleaner state of one log (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct CleanerState {
    pub(crate) first_dirty: Offset,
    /// Tombstones below this offset were first cleaned longer than
    /// `delete.retention.ms` ago.
    expired_below: Offset,
    /// `(end, ms)`: offsets from the previous end up to `end` (exclusive) were first
    /// cleaned at `ms`. Sorted by `end`.
    horizons: Vec<(Offset, i64)>,
    /// When the oldest tombstone kept by the last pass expires.
    tombstones_due: Option<i64>,
    /// A swap failed after its commit point: the files are only consistent again
    /// after a reopen finishes it, so this log is not cleaned until then.
    failed: bool,
}

impl CleanerState {
    /// Reads `<dir>/cleaner-offset-checkpoint`; a missing or malformed file means
    /// "nothing is clean" (a malformed one is logged): the next clean redoes work,
    /// and tombstones only live longer.
    pub(crate) fn load(dir: &Path) -> Self {
        let path = dir.join(CLEANER_CHECKPOINT);
        let Ok(text) = fs::read_to_string(&path) else { return Self::default() };
        let parse = || -> Option<Self> {
            let mut lines = text.lines();
            if lines.next()? != "0" {
                return None;
            }
            let first_dirty = lines.next()?.parse().ok()?;
            let expired_below = lines.next()?.parse().ok()?;
            let tombstones_due = match lines.next()? {
                "-" => None,
                t => Some(t.parse().ok()?),
            };
            let n: usize = lines.next()?.parse().ok()?;
            let mut horizons = Vec::with_capacity(n.min(MAX_HORIZONS));
            for _ in 0..n {
                let (end, ms) = lines.next()?.split_once(' ')?;
                horizons.push((end.parse().ok()?, ms.parse().ok()?));
            }
            Some(Self { first_dirty, expired_below, horizons, tombstones_due, failed: false })
        };
        parse().unwrap_or_else(|| {
            tracing::warn!(path = %path.display(), "ignoring a malformed cleaner checkpoint");
            Self::default()
        })
    }

    /// Writes the checkpoint atomically (temp file, fsync, rename, fsync dir).
    fn save(&self, dir: &Path) -> Result<()> {
        let due = self.tombstones_due.map_or("-".to_owned(), |t| t.to_string());
        let mut text = format!("0\n{}\n{}\n{due}\n{}\n", self.first_dirty, self.expired_below, self.horizons.len());
        for (end, ms) in &self.horizons {
            text.push_str(&format!("{end} {ms}\n"));
        }
        let path = dir.join(CLEANER_CHECKPOINT);
        let tmp = dir.join(format!("{CLEANER_CHECKPOINT}.tmp"));
        let mut f = File::create(&tmp).at(&tmp)?;
        f.write_all(text.as_bytes()).at(&tmp)?;
        f.sync_all().at(&tmp)?;
        fs::rename(&tmp, &path).at(&path)?;
        sync_dir(dir)
    }

    /// When the cleaner first passed over `offset` (`None`: never, it is being
    /// cleaned for the first time now).
    fn first_cleaned_at(&self, offset: Offset) -> Option<i64> {
        if offset < self.expired_below {
            return Some(i64::MIN);
        }
        let i = self.horizons.partition_point(|(end, _)| *end <= offset);
        self.horizons.get(i).map(|(_, ms)| *ms)
    }

    /// Forgets what lies at or above `offset`, which a truncation removed (new
    /// records will take those offsets).
    fn truncated(&mut self, offset: Offset) {
        self.first_dirty = self.first_dirty.min(offset);
        self.expired_below = self.expired_below.min(offset);
        let mut kept: Vec<(Offset, i64)> = Vec::with_capacity(self.horizons.len());
        for &(end, ms) in &self.horizons {
            let end = end.min(offset);
            if end > self.expired_below && kept.last().is_none_or(|(e, _)| *e < end) {
                kept.push((end, ms));
            }
        }
        self.horizons = kept;
    }

    /// Records that a pass at `now_ms` cleaned everything below `end`, and forgets
    /// ages that no tombstone can still need.
    fn record_pass(&mut self, end: Offset, now_ms: i64, delete_retention: Duration) {
        self.first_dirty = end;
        if self.horizons.last().is_none_or(|(e, _)| *e < end) && end > self.expired_below {
            self.horizons.push((end, now_ms));
        }
        let retention = delete_retention.as_millis() as i64;
        while let Some(&(end, ms)) = self.horizons.first() {
            if ms.saturating_add(retention) > now_ms {
                break;
            }
            self.expired_below = end;
            self.horizons.remove(0);
        }
        while self.horizons.len() > MAX_HORIZONS {
            let (_, ms) = self.horizons.remove(0);
            self.horizons[0].1 = self.horizons[0].1.max(ms);
        }
    }
}

/// Key hash → latest offset, open addressing with linear probing, at most 75 % full.
#[derive(Debug)]
struct OffsetMap {
    /// `(hash, offset)`; offset -1 marks an empty slot.
    slots: Vec<([u64; 2], Offset)>,
    len: usize,
    max_entries: usize,
}

impl OffsetMap {
    fn slots_for(bytes: usize) -> usize {
        (bytes / SLOT_BYTES).max(16)
    }

    fn max_entries_for(bytes: usize) -> usize {
        Self::slots_for(bytes) * 3 / 4
    }

    fn new(bytes: usize) -> Self {
        let n = Self::slots_for(bytes);
        Self { slots: vec![([0, 0], -1); n], len: 0, max_entries: Self::max_entries_for(bytes) }
    }

    fn clear(&mut self) {
        if self.len > 0 {
            self.slots.fill(([0, 0], -1));
            self.len = 0;
        }
    }

    fn free(&self) -> usize {
        self.max_entries - self.len
    }

    fn slot(&self, hash: &[u64; 2]) -> usize {
        let n = self.slots.len();
        let mut i = (hash[0] % n as u64) as usize;
        loop {
            let (h, o) = &self.slots[i];
            if *o < 0 || h == hash {
                return i;
            }
            i = if i + 1 == n { 0 } else { i + 1 };
        }
    }

    /// Records `offset` for the key; callers go in offset order, so it is the latest.
    fn put(&mut self, hash: [u64; 2], offset: Offset) {
        let i = self.slot(&hash);
        if self.slots[i].1 < 0 {
            self.len += 1;
        }
        self.slots[i] = (hash, offset);
    }

    fn get(&self, hash: &[u64; 2]) -> Option<Offset> {
        let (_, o) = self.slots[self.slot(hash)];
        (o >= 0).then_some(o)
    }
}

/// A 128-bit key hash (two SipHash runs with different prefixes): with millions of
/// keys a collision, which would drop a live key, stays out of reach.
fn key_hash(key: &[u8]) -> [u64; 2] {
    let mut a = DefaultHasher::new();
    a.write_u8(0);
    a.write(key);
    let mut b = DefaultHasher::new();
    b.write_u8(1);
    b.write(key);
    [a.finish(), b.finish()]
}

/// Sleeps so that bytes counted stay under the configured rate.
struct Throttle {
    rate: Option<f64>,
    start: Instant,
    bytes: u64,
}

impl Throttle {
    fn new(rate: Option<f64>) -> Self {
        Self { rate, start: Instant::now(), bytes: 0 }
    }

    fn account(&mut self, bytes: usize) {
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

type View = std::collections::BTreeMap<Offset, Arc<Segment>>;

/// Where cleaning must stop: the base of the active segment, of the segment holding
/// the last stable offset (records above the high watermark may still be truncated
/// away, and records of undecided transactions may still be aborted: neither may
/// shadow committed ones), or of the first segment whose largest timestamp is younger
/// than `min.compaction.lag.ms`, whichever is lowest.
fn cleanable_end(view: &View, now_ms: i64, lag: Duration, high_watermark: Offset) -> Offset {
    let active = *view.keys().next_back().expect("invariant: at least one segment");
    let by_hw = view.range(..=high_watermark).next_back().map_or(active, |(b, _)| *b);
    let end = active.min(by_hw);
    let horizon = now_ms.saturating_sub(lag.as_millis() as i64);
    view.range(..end).find(|(_, s)| !lag.is_zero() && s.max_timestamp() > horizon).map_or(end, |(b, _)| *b)
}

impl Log {
    /// `max.compaction.lag.ms`: whether dirty records below the cleanable end have
    /// waited longer than that, which makes the log due whatever its dirty ratio. Judged
    /// by the largest timestamp of the first dirty segment, so every record of it is
    /// that old (Kafka looks at the segment's first batch instead; this may clean one
    /// segment's time span later, never earlier).
    fn compaction_overdue(&self, now_ms: i64) -> bool {
        let config = self.config();
        let Some(lag) = config.max_compaction_lag else { return false };
        let first_dirty = crate::lock::mutex(&self.cleaner).first_dirty;
        let view = self.view();
        let end = cleanable_end(&view, now_ms, config.min_compaction_lag, self.last_stable_offset());
        let start = view.range(..=first_dirty).next_back().map_or(first_dirty, |(b, _)| *b);
        let horizon = now_ms.saturating_sub(i64::try_from(lag.as_millis()).unwrap_or(i64::MAX));
        view.range(start..end).next().is_some_and(|(_, s)| s.max_timestamp() <= horizon)
    }

    /// Dirty bytes / cleanable bytes, for a log with something dirty to clean.
    fn cleanable_ratio(&self, now_ms: i64) -> Option<f64> {
        let first_dirty = crate::lock::mutex(&self.cleaner).first_dirty;
        self.cleanable_ratio_with(first_dirty, now_ms)
    }

    fn cleanable_ratio_with(&self, first_dirty: Offset, now_ms: i64) -> Option<f64> {
        let view = self.view();
        let end = cleanable_end(&view, now_ms, self.config().min_compaction_lag, self.last_stable_offset());
        let (mut clean, mut dirty) = (0u64, 0u64);
        let bases: Vec<Offset> = view.range(..end).map(|(b, _)| *b).collect();
        for (i, base) in bases.iter().enumerate() {
            let next = bases.get(i + 1).copied().unwrap_or(end);
            let size = view[base].size();
            if next <= first_dirty {
                clean += size;
            } else {
                dirty += size;
            }
        }
        (dirty > 0).then(|| dirty as f64 / (clean + dirty) as f64)
    }
}

/// Reads dirty records from `first_dirty` into `map` until `clean_end` or until the
/// next batch might not fit; returns the offset where it stopped (a batch start).
fn build_map(
    view: &View,
    first_dirty: Offset,
    clean_end: Offset,
    map: &mut OffsetMap,
    aborted: &Aborted,
    throttle: &mut Throttle,
    stats: &mut CleanStats,
) -> Result<Offset> {
    let start = view.range(..=first_dirty).next_back().map_or(first_dirty, |(b, _)| *b);
    for (_, seg) in view.range(start..clean_end) {
        let path = seg.path(LOG_SUFFIX);
        let size = seg.size();
        let position = seg.find_batch(first_dirty, size)?.map_or(size, |(p, _)| p);
        let file = seg.log()?;
        let mut walk = Walker::new(&file, position, size);
        while let Some((header, bytes)) = next_batch(&mut walk, &path)? {
            throttle.account(bytes.len());
            stats.bytes_read += bytes.len() as u64;
            // Aborted records never shadow anything: they are dropped below.
            if header.last_offset() < first_dirty || header.is_control() || aborted.contains(&header) {
                continue;
            }
            if header.record_count.max(0) as usize > map.free() {
                return Ok(header.base_offset);
            }
            let body = records_body(&header, bytes, &path)?;
            for record in Records::new(&body, BATCH_OVERHEAD) {
                let record = record.map_err(|source| corrupt(&path, header.base_offset, source))?;
                let offset = header.base_offset + i64::from(record.offset_delta);
                if let (Some(key), true) = (record.key, offset >= first_dirty) {
                    map.put(key_hash(key), offset);
                }
            }
        }
    }
    Ok(clean_end)
}

/// The next batch of a walk, CRC-checked.
fn next_batch<'w>(walk: &'w mut Walker<'_>, path: &Path) -> Result<Option<(BatchHeader, &'w [u8])>> {
    match walk.step(false).at(path)? {
        Step::End => Ok(None),
        Step::Torn { position, reason } => Err(Error::CorruptSegment { path: path.to_path_buf(), position, source: reason }),
        Step::Batch { position, header } => {
            let bytes = walk.batch_bytes(position, header.size()).at(path)?;
            let header = BatchHeader::parse(bytes).map_err(|source| Error::CorruptSegment {
                path: path.to_path_buf(),
                position,
                source,
            })?;
            Ok(Some((header, bytes)))
        }
    }
}

fn corrupt(path: &Path, position: Offset, source: fjord_record::Error) -> Error {
    Error::CorruptSegment { path: path.to_path_buf(), position: position.max(0) as u64, source }
}

fn records_body<'a>(header: &BatchHeader, bytes: &'a [u8], path: &Path) -> Result<std::borrow::Cow<'a, [u8]>> {
    fjord_record::compression::records_body(header, bytes, MAX_DECOMPRESSED).map_err(|e| corrupt(path, header.base_offset, e))
}

/// Consecutive sealed segments below `map_end`, grouped so that each group's
/// source bytes fit `segment.bytes` and its offsets fit a relative index.
fn group_segments(view: &View, map_end: Offset, segment_bytes: u64) -> Vec<Vec<Arc<Segment>>> {
    let active = *view.keys().next_back().expect("invariant: at least one segment");
    let bases: Vec<Offset> = view.keys().copied().collect();
    let mut groups: Vec<Vec<Arc<Segment>>> = Vec::new();
    let mut size = 0u64;
    for (i, (&base, seg)) in view.range(..map_end.min(active)).enumerate() {
        let next_base = bases[i + 1];
        let fits = groups
            .last()
            .is_some_and(|g| size + seg.size() <= segment_bytes && next_base - g[0].base_offset <= i64::from(i32::MAX));
        if fits {
            size += seg.size();
            groups.last_mut().expect("checked above").push(seg.clone());
        } else {
            debug_assert!(next_base - base <= i64::from(i32::MAX), "a segment's offsets fit its index");
            size = seg.size();
            groups.push(vec![seg.clone()]);
        }
    }
    groups
}

/// What a pass keeps.
struct Pass<'a> {
    map: &'a OffsetMap,
    map_end: Offset,
    now_ms: i64,
    delete_retention: Duration,
    horizons: &'a CleanerState,
    /// Earliest expiry among the tombstones this pass kept.
    tombstones_due: std::cell::Cell<Option<i64>>,
    /// Aborted transactions: their records go.
    aborted: &'a Aborted,
}

/// The aborted transactions overlapping what a clean reads, by producer: a
/// transactional batch inside one of them holds aborted records.
#[derive(Debug, Default)]
struct Aborted(std::collections::HashMap<i64, Vec<(Offset, Offset)>>);

impl Aborted {
    fn load(log: &Log, from: Offset, to: Offset) -> Result<Self> {
        let mut by_producer: std::collections::HashMap<i64, Vec<(Offset, Offset)>> = std::collections::HashMap::new();
        for a in log.aborted_transactions(from, to)? {
            by_producer.entry(a.producer_id).or_default().push((a.first_offset, a.last_offset));
        }
        Ok(Self(by_producer))
    }

    fn contains(&self, header: &BatchHeader) -> bool {
        header.is_transactional()
            && !header.is_control()
            && self.0.get(&header.producer_id).is_some_and(|ranges| {
                ranges.iter().any(|&(first, last)| first <= header.base_offset && header.base_offset <= last)
            })
    }
}

impl Pass<'_> {
    /// Whether the record at `offset` stays. Returns `(keep, expired tombstone)`.
    fn keep(&self, offset: Offset, key: Option<&[u8]>, value: Option<&[u8]>) -> (bool, bool) {
        let Some(key) = key else { return (true, false) };
        if offset >= self.map_end {
            return (true, false);
        }
        if self.map.get(&key_hash(key)).is_some_and(|latest| latest > offset) {
            return (false, false);
        }
        if value.is_none() {
            let first_cleaned = self.horizons.first_cleaned_at(offset).unwrap_or(self.now_ms);
            let due = first_cleaned.saturating_add(self.delete_retention.as_millis() as i64);
            if due <= self.now_ms {
                return (false, true);
            }
            self.tombstones_due.set(Some(self.tombstones_due.get().map_or(due, |d| d.min(due))));
        }
        (true, false)
    }
}

/// Rewrites one group into a cleaned segment and swaps it in. `Ok(false)` when the
/// group's segments changed meanwhile (the cleaned files are then removed).
fn clean_group(
    log: &Log,
    group: &[Arc<Segment>],
    truncations: u64,
    pass: &Pass<'_>,
    throttle: &mut Throttle,
    stats: &mut CleanStats,
    hook: &mut Option<SwapHook>,
) -> Result<bool> {
    let dir = log.dir();
    let base = group[0].base_offset;
    let config = log.config();
    let sizes: Vec<u64> = group.iter().map(|s| s.size()).collect();
    let written = match write_cleaned(group, &sizes, pass, &config, throttle, stats) {
        Ok(w) => w,
        Err(e) => {
            // Not committed: the old segments stay; drop the partial output.
            let _ = remove_cleaned(dir, base);
            return Err(e);
        }
    };
    throttle.account(written.size as usize);
    match log.install_cleaned(group, &sizes, truncations, written, hook) {
        Ok(true) => {
            stats.segments_cleaned += group.len();
            stats.bytes_after += written.size;
            Ok(true)
        }
        other => other,
    }
}

/// Writes the `.cleaned` files of one group: the records of `group` that `pass` keeps.
fn write_cleaned(
    group: &[Arc<Segment>],
    sizes: &[u64],
    pass: &Pass<'_>,
    config: &crate::LogConfig,
    throttle: &mut Throttle,
    stats: &mut CleanStats,
) -> Result<Cleaned> {
    let mut out = CleanedWriter::create(group[0].dir(), group[0].base_offset)?;
    let mut kept: Vec<(usize, usize)> = Vec::new();
    let mut scratch = Vec::new();
    for (seg, &size) in group.iter().zip(sizes) {
        let path = seg.path(LOG_SUFFIX);
        let file = seg.log()?;
        let mut walk = Walker::new(&file, 0, size);
        stats.bytes_before += size;
        while let Some((header, bytes)) = next_batch(&mut walk, &path)? {
            throttle.account(bytes.len());
            stats.bytes_read += bytes.len() as u64;
            if header.is_control() {
                out.push(&header, bytes, config.index_interval_bytes)?;
                continue;
            }
            if header.base_offset < pass.map_end && pass.aborted.contains(&header) {
                // An aborted transaction's records: no reader may ever see them.
                stats.records_read += header.record_count.max(0) as u64;
                continue;
            }
            let body = records_body(&header, bytes, &path)?;
            kept.clear();
            let mut records = Records::new(&body, 0).peekable();
            while let Some(record) = records.next() {
                let record = record.map_err(|source| corrupt(&path, header.base_offset, source))?;
                let end = match records.peek() {
                    Some(Ok(next)) => next.position,
                    _ => body.len(),
                };
                stats.records_read += 1;
                let offset = header.base_offset + i64::from(record.offset_delta);
                let (keep, expired) = pass.keep(offset, record.key, record.value);
                stats.tombstones_removed += u64::from(expired);
                if keep {
                    kept.push((record.position, end));
                }
            }
            stats.records_kept += kept.len() as u64;
            if kept.len() == header.record_count as usize {
                out.push(&header, bytes, config.index_interval_bytes)?;
            } else if !kept.is_empty() {
                rebuild(bytes, &header, &body, &kept, &mut scratch).map_err(|e| corrupt(&path, header.base_offset, e))?;
                out.push(&header, &scratch, config.index_interval_bytes)?;
            }
        }
    }
    out.finish()
}

/// A copy of the batch `src` holding only the records `body[start..end]` of `kept`
/// (same base offset, last offset delta, timestamps, producer fields and codec),
/// with its length, count and CRC recomputed. Written to `out`.
fn rebuild(
    src: &[u8],
    header: &BatchHeader,
    body: &[u8],
    kept: &[(usize, usize)],
    out: &mut Vec<u8>,
) -> fjord_record::Result<()> {
    out.clear();
    out.extend_from_slice(&src[..BATCH_OVERHEAD]);
    match header.compression() {
        Compression::None => {
            for &(s, e) in kept {
                out.extend_from_slice(&body[s..e]);
            }
        }
        codec => {
            let mut raw = Vec::with_capacity(body.len());
            for &(s, e) in kept {
                raw.extend_from_slice(&body[s..e]);
            }
            fjord_record::compression::compress(codec, &raw, out)?;
        }
    }
    let batch_length = (out.len() - fjord_record::batch::LOG_OVERHEAD) as i32;
    out[8..12].copy_from_slice(&batch_length.to_be_bytes());
    out[57..61].copy_from_slice(&(kept.len() as i32).to_be_bytes());
    let crc = fjord_record::batch::crc32c(&out[21..]);
    out[17..21].copy_from_slice(&crc.to_be_bytes());
    Ok(())
}

/// `<dir>/<base>.<suffix><extra>`.
pub(crate) fn suffixed(dir: &Path, base: Offset, suffix: &str, extra: &str) -> PathBuf {
    let mut p = segment_path(dir, base, suffix).into_os_string();
    p.push(extra);
    PathBuf::from(p)
}

/// A cleaned segment being written as `.cleaned` files.
struct CleanedWriter {
    dir: PathBuf,
    base: Offset,
    file: BufWriter<File>,
    position: u64,
    builder: IndexBuilder,
    offsets: Vec<OffsetEntry>,
    times: Vec<TimeEntry>,
}

/// A finished cleaned segment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cleaned {
    pub(crate) base: Offset,
    pub(crate) size: u64,
    pub(crate) max_timestamp: i64,
}

impl CleanedWriter {
    fn create(dir: &Path, base: Offset) -> Result<Self> {
        let path = suffixed(dir, base, LOG_SUFFIX, CLEANED_SUFFIX);
        let file = OpenOptions::new().write(true).create(true).truncate(true).open(&path).at(&path)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            base,
            file: BufWriter::with_capacity(WRITE_BUFFER, file),
            position: 0,
            builder: IndexBuilder::default(),
            offsets: Vec::new(),
            times: Vec::new(),
        })
    }

    fn push(&mut self, header: &BatchHeader, bytes: &[u8], interval: u32) -> Result<()> {
        let rel = (header.base_offset - self.base) as u32;
        let (o, t) = self.builder.on_batch(interval, rel, self.position as u32, header.max_timestamp, bytes.len() as u64);
        self.offsets.extend(o);
        self.times.extend(t);
        self.file.write_all(bytes).at(suffixed(&self.dir, self.base, LOG_SUFFIX, CLEANED_SUFFIX))?;
        self.position += bytes.len() as u64;
        Ok(())
    }

    /// Writes the indexes and fsyncs the three files.
    fn finish(mut self) -> Result<Cleaned> {
        let log_path = suffixed(&self.dir, self.base, LOG_SUFFIX, CLEANED_SUFFIX);
        self.times.extend(self.builder.time_entry());
        let file = self.file.into_inner().map_err(|e| Error::Io { path: log_path.clone(), source: e.into_error() })?;
        file.sync_all().at(&log_path)?;
        for (suffix, bytes) in [(INDEX_SUFFIX, index::encode(&self.offsets)), (TIME_INDEX_SUFFIX, index::encode(&self.times))] {
            let path = suffixed(&self.dir, self.base, suffix, CLEANED_SUFFIX);
            let mut f = File::create(&path).at(&path)?;
            f.write_all(&bytes).at(&path)?;
            f.sync_all().at(&path)?;
        }
        sync_dir(&self.dir)?;
        Ok(Cleaned { base: self.base, size: self.position, max_timestamp: self.builder.max_timestamp })
    }
}

/// Removes a clean's `.cleaned` and `.swap` files of segment `base`.
pub(crate) fn remove_cleaned(dir: &Path, base: Offset) -> Result<()> {
    for suffix in [LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX] {
        for extra in [CLEANED_SUFFIX, SWAP_SUFFIX] {
            crate::recovery::remove_if_exists(&suffixed(dir, base, suffix, extra))?;
        }
    }
    Ok(())
}

/// Runs on open before segments are loaded: removes uncommitted cleans and
/// finishes committed swaps (see the module docs).
pub(crate) fn finish_interrupted_swaps(dir: &Path) -> Result<()> {
    let mut swaps = Vec::new();
    let mut index_swaps = Vec::new();
    let mut stale = Vec::new();
    let mut logs = Vec::new();
    for entry in fs::read_dir(dir).at(dir)? {
        let entry = entry.at(dir)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if name.ends_with(CLEANED_SUFFIX) {
            stale.push(path);
        } else if let Some(stem) = name.strip_suffix(SWAP_SUFFIX) {
            match parse_name(stem) {
                Some((base, LOG_SUFFIX)) => swaps.push(base),
                Some((base, _)) => index_swaps.push((base, path)),
                None => stale.push(path),
            }
        } else if let Some((base, LOG_SUFFIX)) = parse_name(&name) {
            logs.push(base);
        }
    }
    let mut changed = !stale.is_empty();
    for path in stale {
        tracing::warn!(path = %path.display(), "removing the output of an interrupted clean");
        crate::recovery::remove_if_exists(&path)?;
    }
    for &base in &swaps {
        let swap = suffixed(dir, base, LOG_SUFFIX, SWAP_SUFFIX);
        let file = File::open(&swap).at(&swap)?;
        let len = file.metadata().at(&swap)?.len();
        // The swap file was fsynced before its rename: its batches are whole.
        let mut next = base;
        let mut walk = Walker::new(&file, 0, len);
        while let Step::Batch { header, .. } = walk.step(false).at(&swap)? {
            next = header.next_offset();
        }
        for &old in logs.iter().filter(|&&b| b > base && b < next) {
            tracing::warn!(dir = %dir.display(), segment = old, "removing a segment replaced by an interrupted clean");
            for suffix in [LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX] {
                crate::recovery::remove_if_exists(&segment_path(dir, old, suffix))?;
            }
        }
        for suffix in [INDEX_SUFFIX, TIME_INDEX_SUFFIX] {
            let from = suffixed(dir, base, suffix, SWAP_SUFFIX);
            let to = segment_path(dir, base, suffix);
            if from.exists() {
                fs::rename(&from, &to).at(&to)?;
            } else {
                // Either the new index already, or the replaced segment's: rebuilt on load.
                crate::recovery::remove_if_exists(&to)?;
            }
        }
        fs::rename(&swap, segment_path(dir, base, LOG_SUFFIX)).at(&swap)?;
        tracing::warn!(dir = %dir.display(), segment = base, "finished an interrupted clean");
        changed = true;
    }
    // Index swaps without a log swap: the commit never happened.
    for (base, path) in index_swaps {
        if !swaps.contains(&base) {
            crate::recovery::remove_if_exists(&path)?;
            changed = true;
        }
    }
    if changed {
        sync_dir(dir)?;
    }
    Ok(())
}

/// `00000000000000000123.log` → `(123, "log")`.
fn parse_name(name: &str) -> Option<(Offset, &str)> {
    let (stem, suffix) = name.split_once('.')?;
    if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((stem.parse().ok()?, suffix))
}

#[cfg(test)]
mod tests;
