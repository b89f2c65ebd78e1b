//! [`Log`]: one partition's log (see the crate docs for the model).

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fjord_record::batch::{self, BatchHeader};
use fjord_record::{Compression, Offset, RecordFrame, Records, TimestampType, BATCH_OVERHEAD};

use crate::checkpoint::sync_dir;
use crate::cleaner::{self, CleanStats, Cleaned, CleanerState, SwapHook, SwapStep, CLEANED_SUFFIX, SWAP_SUFFIX};
use crate::epoch::EpochCache;
use crate::error::IoContext;
use crate::index::{self, IndexBuilder};
use crate::producer_state::{ProducerInfo, ProducerState};
use crate::recovery::{self, remove_if_exists, Active, CLEAN_SHUTDOWN};
use crate::segment::{Segment, Slice, INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX};
use crate::{lock, Error, LogConfig, Result};

type SegmentMap = BTreeMap<Offset, Arc<Segment>>;

/// What an append wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendInfo {
    /// Offset of the first record appended.
    pub base_offset: Offset,
    /// Offset of the last record appended.
    pub last_offset: Offset,
    /// Largest batch max timestamp among the appended batches.
    pub max_timestamp: i64,
    /// Records appended (sum of the batches' record counts).
    pub record_count: u64,
    /// Bytes appended.
    pub bytes: usize,
    /// Batches appended.
    pub batch_count: usize,
    /// The append was a retry of an idempotent producer's batch already in the log:
    /// nothing was appended, and the offsets are those of the original batch (Kafka
    /// answers such a retry as a success with the original offsets).
    pub duplicate: bool,
}

/// A region of one segment file holding whole batches, usable by `sendfile(2)`:
/// `len` bytes at `position` of `file`. It stays readable even if the segment is
/// deleted meanwhile (the file is only unlinked after `file.delete.delay.ms`, and the
/// open descriptor keeps the data alive after that too).
#[derive(Debug, Clone)]
pub struct ReadSlice {
    /// The segment's `.log` file.
    pub file: Arc<File>,
    /// Byte position of the first batch.
    pub position: u64,
    /// Length in bytes (0 when there is nothing to return).
    pub len: usize,
    /// Base offset of the first batch returned (may be below the requested offset,
    /// since whole batches are returned); the requested offset when empty.
    pub first_offset: Offset,
    /// The offset to fetch next: after the last batch returned.
    pub next_offset: Offset,
}

impl ReadSlice {
    /// Whether the slice holds no batch.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies the bytes into memory.
    pub fn read_to_vec(&self) -> io::Result<Vec<u8>> {
        let mut buf = vec![0; self.len];
        self.file.read_exact_at(&mut buf, self.position)?;
        Ok(buf)
    }
}

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
}

#[derive(Debug)]
struct Writer {
    segments: SegmentMap,
    active: Active,
    epochs: EpochCache,
    /// Idempotent producers: changed only together with the segments, under this lock.
    producers: ProducerState,
    unflushed_messages: u64,
    /// Segments sealed since the last flush: their files still need an fsync.
    unsynced: Vec<Arc<Segment>>,
    /// Segment files were created or renamed since the last flush.
    dir_dirty: bool,
    pending_deletes: Vec<(Instant, Vec<PathBuf>)>,
    closed: bool,
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
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
        let mut producers = ProducerState::new(&dir);
        producers.reload(loaded.segments.values(), log_start, loaded.log_end_offset)?;
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
            dir,
        })
    }

    /// The partition directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Leader append: validates every batch in `batches` first (nothing is written
    /// if any fails), then assigns offsets from the log end offset by rewriting each
    /// batch's base offset and partition leader epoch in place (the CRC does not
    /// cover them), appends, indexes, rolls, and applies the flush policy.
    ///
    /// The validation of [`Log::append_replicated`], and also the records inside
    /// compressed batches, decompressed once into at most [`LogConfig::max_decompressed_bytes`]
    /// for the whole append (beyond: [`Error::DecompressedTooLarge`]); in a compacted
    /// log a record without a key is [`Error::MissingKey`] naming every such record,
    /// as Kafka refuses them.
    ///
    /// Batches of idempotent producers are checked against the producer state under
    /// the same lock as the append (see `producer_state`): a retry of a recent batch
    /// appends nothing and returns the original offsets with
    /// [`AppendInfo::duplicate`] set; a sequence gap is [`Error::OutOfOrderSequence`],
    /// an older producer epoch [`Error::InvalidProducerEpoch`].
    pub fn append(&self, batches: &mut [u8], leader_epoch: i32) -> Result<AppendInfo> {
        self.append_visiting(batches, leader_epoch, None)
    }

    /// [`Log::append`], showing `visit` every record of every batch as the validation
    /// walks it (control batches too, with their header), so a caller counts records
    /// without walking or decompressing them a second time. The validation's verdict
    /// comes after the visits: what the caller gathered holds only if this returns `Ok`.
    pub fn append_visiting(&self, batches: &mut [u8], leader_epoch: i32, visit: Option<RecordVisitor<'_>>) -> Result<AppendInfo> {
        let config = self.config();
        let mut headers = validate_leader(batches, &config, visit)?;
        let mut w = self.lock_writer()?;
        if let Some(original) = w.producers.check(&headers)? {
            return Ok(AppendInfo {
                base_offset: original.first_offset,
                last_offset: original.last_offset,
                max_timestamp: -1,
                record_count: 0,
                bytes: 0,
                batch_count: 0,
                duplicate: true,
            });
        }
        let mut next = self.log_end_offset();
        for (position, h) in &mut headers {
            let batch = &mut batches[*position..];
            batch::set_base_offset(batch, next);
            batch::set_partition_leader_epoch(batch, leader_epoch);
            h.base_offset = next;
            h.partition_leader_epoch = leader_epoch;
            next = h.next_offset();
        }
        self.append_validated(&mut w, &config, batches, &headers)
    }

    /// Follower append: keeps the offsets in the batches, which must start at or
    /// after the log end offset and increase. Validation as in [`Log::append`], but no
    /// producer checks: the leader made them; the producer state just follows.
    pub fn append_replicated(&self, batches: &[u8]) -> Result<AppendInfo> {
        let config = self.config();
        let headers = validate(batches, config.max_message_bytes)?;
        let mut w = self.lock_writer()?;
        let mut expected = self.log_end_offset();
        for (_, h) in &headers {
            if h.base_offset < expected {
                return Err(Error::NonMonotonicOffset { offset: h.base_offset, expected_at_least: expected });
            }
            expected = h.next_offset();
        }
        self.append_validated(&mut w, &config, batches, &headers)
    }

    fn lock_writer(&self) -> Result<std::sync::MutexGuard<'_, Writer>> {
        let w = lock::mutex(&self.writer);
        if w.closed {
            return Err(Error::Closed { dir: self.dir.clone() });
        }
        Ok(w)
    }

    fn append_validated(
        &self,
        w: &mut Writer,
        config: &LogConfig,
        batches: &[u8],
        headers: &[(usize, BatchHeader)],
    ) -> Result<AppendInfo> {
        let first = headers[0].1;
        let last = headers[headers.len() - 1].1;
        let max_timestamp = headers.iter().map(|(_, h)| h.max_timestamp).max().unwrap_or(i64::MIN);
        self.maybe_roll(w, config, &first, &last, batches.len() as u64, max_timestamp)?;
        let leo_before = self.log_end_offset();
        for (_, h) in headers {
            w.epochs.assign(h.partition_leader_epoch, h.base_offset)?;
        }
        let active = &mut w.active;
        let segment = active.segment.clone();
        let position = segment.size();
        if config.preallocate {
            active.reserve(position + batches.len() as u64, config.segment_bytes);
        }
        // Straight to the held file, the path formatted only on failure: per append, a
        // small one especially, both are measurable.
        if let Err(source) = active.log_file.write_all_at(batches, position) {
            // Leave the log byte for byte as it was (cut back to `position`, the segment's
            // size, which also forgets the reservation past it).
            let _ = active.release_reserved();
            let _ = w.epochs.truncate_from_end(leo_before);
            return Err(Error::Io { path: segment.path(LOG_SUFFIX), source });
        }
        let mut record_count = 0u64;
        for (at, h) in headers {
            let rel = (h.base_offset - segment.base_offset) as u32;
            let batch_position = (position + *at as u64) as u32;
            let (o, t) =
                active.builder.on_batch(config.index_interval_bytes, rel, batch_position, h.max_timestamp, h.size() as u64);
            if let Some(o) = o {
                segment.push_offset(o);
            }
            if let Some(t) = t {
                segment.push_time(t);
            }
            active.first_timestamp.get_or_insert(h.max_timestamp);
            record_count += h.record_count as u64;
        }
        segment.set_max_timestamp(active.builder.max_timestamp);
        w.producers.apply(headers);
        // Publish: bytes first, then the segment size, then the log end offset. The
        // bytes were validated above: they extend the segment's verified prefix.
        segment.appended(position, position + batches.len() as u64);
        self.size_bytes.fetch_add(batches.len() as u64, Ordering::AcqRel);
        self.log_end_offset.store(last.next_offset(), Ordering::Release);
        w.unflushed_messages += record_count;
        if config.flush_messages.is_some_and(|n| w.unflushed_messages >= n) {
            self.flush_locked(w)?;
        }
        Ok(AppendInfo {
            base_offset: first.base_offset,
            last_offset: last.last_offset(),
            max_timestamp,
            record_count,
            bytes: batches.len(),
            batch_count: headers.len(),
            duplicate: false,
        })
    }

    /// Rolls to a new segment when the append would not fit the active one
    /// (`segment.bytes`), its index is full (`segment.index.bytes`), it is older than
    /// `segment.ms` in record time, or the offsets would overflow its relative index.
    fn maybe_roll(
        &self,
        w: &mut Writer,
        config: &LogConfig,
        first: &BatchHeader,
        last: &BatchHeader,
        bytes: u64,
        max_timestamp: i64,
    ) -> Result<()> {
        let seg = &w.active.segment;
        let size = seg.size();
        if size == 0 {
            if first.base_offset != seg.base_offset {
                // A follower starting past our end: the segment must begin at its first offset.
                self.roll(w, first.base_offset)?;
            }
            return Ok(());
        }
        let (offsets, times) = seg.resident_len();
        let index_full =
            (offsets + 1) * 8 > config.segment_index_bytes as usize || (times + 1) * 12 > config.segment_index_bytes as usize;
        let too_old = match (config.roll_after(), w.active.first_timestamp) {
            (Some(ms), Some(first_ts)) => max_timestamp.saturating_sub(first_ts) > ms.as_millis() as i64,
            _ => false,
        };
        let overflow = last.last_offset() - seg.base_offset > i64::from(i32::MAX);
        if size + bytes > config.segment_bytes || index_full || too_old || overflow {
            self.roll(w, first.base_offset)?;
        }
        Ok(())
    }

    /// Seals the active segment and starts a new one at `base_offset`, with a
    /// producer state snapshot as of the log end (so recovery replays at most the
    /// new segment).
    fn roll(&self, w: &mut Writer, base_offset: Offset) -> Result<()> {
        self.write_active_indexes(w, true)?;
        w.producers.snapshot(self.log_end_offset())?;
        w.active.release_reserved().at(w.active.segment.path(LOG_SUFFIX))?;
        let old = w.active.segment.clone();
        old.seal();
        w.unsynced.push(old);
        let new = self.create_segment(base_offset)?;
        w.segments.insert(base_offset, new.clone());
        w.active = Active::install(new, Vec::new(), Vec::new(), IndexBuilder::default(), None, true)?;
        w.dir_dirty = true;
        self.publish(w);
        tracing::debug!(dir = %self.dir.display(), base_offset, "rolled a new segment");
        Ok(())
    }

    fn create_segment(&self, base_offset: Offset) -> Result<Arc<Segment>> {
        let path = crate::segment::segment_path(&self.dir, base_offset, LOG_SUFFIX);
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).at(&path)?;
        let segment = Arc::new(Segment::new(&self.dir, base_offset, 0, i64::MIN));
        segment.pin_file(file);
        Ok(segment)
    }

    /// Appends the resident index entries not yet in the active segment's files
    /// (with a final time entry when `final_time` is set, so the time index's last
    /// entry holds the segment's largest timestamp).
    fn write_active_indexes(&self, w: &mut Writer, final_time: bool) -> Result<()> {
        let a = &mut w.active;
        if final_time {
            if let Some(t) = a.builder.time_entry() {
                a.segment.push_time(t);
            }
        }
        let (offsets, times) = a.segment.resident_tail(a.index_written, a.times_written);
        if !offsets.is_empty() {
            a.index_file.write_all(&index::encode(&offsets)).at(a.segment.path(INDEX_SUFFIX))?;
            a.index_written += offsets.len();
        }
        if !times.is_empty() {
            a.time_index_file.write_all(&index::encode(&times)).at(a.segment.path(TIME_INDEX_SUFFIX))?;
            a.times_written += times.len();
        }
        Ok(())
    }

    fn publish(&self, w: &Writer) {
        *lock::write(&self.view) = Arc::new(w.segments.clone());
    }

    pub(crate) fn view(&self) -> Arc<SegmentMap> {
        lock::read(&self.view).clone()
    }

    /// Whole batches from the one containing `offset`, at most `max_bytes` of them,
    /// but at least one whole batch when `min_one` is set (KIP-74), never a batch
    /// whose last offset is `>= upper_bound` (the high watermark for consumers). One
    /// slice comes from one segment. `offset == log end` gives an empty slice;
    /// `offset` below the log start or above the log end is
    /// [`Error::OffsetOutOfRange`].
    ///
    /// Example: batches at offsets 0–9, 10–19 and 20–29, `read(15, 1 MiB, Some(25), _)`
    /// returns the batch 10–19 only (20–29 reaches the bound), `first_offset` 10 and
    /// `next_offset` 20.
    pub fn read(&self, offset: Offset, max_bytes: usize, upper_bound: Option<Offset>, min_one: bool) -> Result<ReadSlice> {
        // The writer publishes a new segment before the log end that reaches into it,
        // and a new log start before the segment list without the deleted segments:
        // so load the log end, then the segments, then the log start.
        let log_end = self.log_end_offset();
        let view = self.view();
        let log_start = self.log_start_offset();
        if offset < log_start || offset > log_end {
            return Err(Error::OffsetOutOfRange { requested: offset, log_start, log_end });
        }
        let empty = |seg: &Segment| -> Result<ReadSlice> {
            Ok(ReadSlice { file: seg.log()?, position: seg.size(), len: 0, first_offset: offset, next_offset: offset })
        };
        let floor = view.range(..=offset).next_back();
        let candidates = floor.into_iter().chain(view.range(offset + 1..));
        if offset < log_end && upper_bound.is_none_or(|u| offset < u) {
            for (_, seg) in candidates {
                match seg.read(offset, max_bytes, upper_bound, min_one) {
                    Ok(Some((file, Slice { position, len, first_offset, next_offset }))) => {
                        return Ok(ReadSlice { file, position, len, first_offset, next_offset })
                    }
                    Ok(None) => {}
                    // Deleted (retention, truncation) and unlinked while this read held
                    // the old segment list: the data moved away, as below.
                    Err(Error::Io { source, .. }) if seg.is_deleted() && source.kind() == io::ErrorKind::NotFound => break,
                    Err(e) => return Err(e),
                }
            }
            // Raced with retention or truncation: the data moved away under us.
            let log_start = self.log_start_offset();
            if offset < log_start {
                return Err(Error::OffsetOutOfRange { requested: offset, log_start, log_end: self.log_end_offset() });
            }
        }
        let seg = view.values().next_back().expect("invariant: at least one segment");
        empty(seg)
    }

    /// [`Log::read`], copying the bytes into memory.
    pub fn read_bytes(&self, offset: Offset, max_bytes: usize, upper_bound: Option<Offset>, min_one: bool) -> Result<Vec<u8>> {
        let slice = self.read(offset, max_bytes, upper_bound, min_one)?;
        slice.read_to_vec().map_err(|source| Error::Io { path: self.dir.clone(), source })
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

    /// fsyncs everything appended so far; the recovery point becomes the log end offset.
    pub fn flush(&self) -> Result<()> {
        let mut w = lock::mutex(&self.writer);
        if w.closed {
            return Ok(());
        }
        self.flush_locked(&mut w)
    }

    /// Flushes when `flush.ms` is set and the last flush is at least that old at
    /// `now_ms` (wall clock, ms). Returns whether it flushed.
    pub fn flush_if_due(&self, now_ms: i64) -> Result<bool> {
        let Some(interval) = self.config().flush_ms else {
            return Ok(false);
        };
        let due = now_ms - self.last_flush_ms.load(Ordering::Acquire) >= interval.as_millis() as i64;
        if due && self.log_end_offset() > self.recovery_point() {
            self.flush()?;
            self.last_flush_ms.store(now_ms, Ordering::Release);
            return Ok(true);
        }
        Ok(false)
    }

    fn flush_locked(&self, w: &mut Writer) -> Result<()> {
        let log_end = self.log_end_offset();
        for seg in std::mem::take(&mut w.unsynced) {
            seg.log()?.sync_data().at(seg.path(LOG_SUFFIX))?;
            for suffix in [INDEX_SUFFIX, TIME_INDEX_SUFFIX] {
                let path = seg.path(suffix);
                // The index is derived data: a missing file is rebuilt on open.
                if let Ok(f) = File::open(&path) {
                    f.sync_all().at(&path)?;
                }
            }
        }
        self.write_active_indexes(w, true)?;
        let a = &w.active;
        a.segment.log()?.sync_data().at(a.segment.path(LOG_SUFFIX))?;
        a.index_file.sync_data().at(a.segment.path(INDEX_SUFFIX))?;
        a.time_index_file.sync_data().at(a.segment.path(TIME_INDEX_SUFFIX))?;
        if w.dir_dirty {
            sync_dir(&self.dir)?;
            w.dir_dirty = false;
        }
        w.unflushed_messages = 0;
        self.recovery_point.fetch_max(log_end, Ordering::AcqRel);
        self.last_flush_ms.store(now_ms(), Ordering::Release);
        Ok(())
    }

    /// Drops everything at and after `offset`. When `offset` falls inside a batch,
    /// that whole batch goes too (the log end becomes its base offset), as in Kafka.
    /// Below the log start offset, the log is emptied and restarts at `offset`.
    pub fn truncate_to(&self, offset: Offset) -> Result<()> {
        let mut w = self.lock_writer()?;
        if offset >= self.log_end_offset() {
            return Ok(());
        }
        if offset <= self.log_start_offset() {
            return self.truncate_fully_locked(&mut w, offset);
        }
        let config = self.config();
        let keep = w.segments.range(..offset).next_back().map(|(_, s)| s.clone()).expect("invariant: offset > log start");
        let doomed: Vec<Offset> = w.segments.range(offset..).map(|(b, _)| *b).collect();
        for base in doomed {
            if let Some(seg) = w.segments.remove(&base) {
                self.schedule_delete(&mut w, &config, &seg)?;
            }
        }
        let log_path = keep.path(LOG_SUFFIX);
        let size = keep.size();
        // Damage before the cut point ends the kept data there (a repair, when asked
        // for at the damaged offset: see `Log::truncate_to`).
        let cut_batch = match keep.find_batch(offset, size) {
            Ok(found) => found,
            Err(Error::CorruptSegment { .. }) => None,
            Err(e) => return Err(e),
        };
        let cut = cut_batch.map_or(keep.damage_at().unwrap_or(size).min(size), |(p, _)| p);
        // The kept segment's entries below the cut stay; only the tail after the last
        // one is re-read. Without usable entries the whole segment is re-indexed.
        let entries = if Arc::ptr_eq(&keep, &w.active.segment) {
            Some(keep.resident_tail(0, 0))
        } else {
            recovery::read_index_files(&keep, size)
        };
        keep.log()?.set_len(cut).at(&log_path)?;
        let interval = config.index_interval_bytes;
        let resumed = match (entries, cut_batch) {
            (Some((mut offsets, mut times)), Some((_, header))) => {
                offsets.retain(|e| u64::from(e.position) < cut);
                times.retain(|t| keep.base_offset + i64::from(t.relative_offset) < header.base_offset);
                recovery::resume(&keep, offsets, times, cut, interval, false).at(&log_path)?
            }
            (Some((offsets, times)), None) => recovery::resume(&keep, offsets, times, cut, interval, false).at(&log_path)?,
            (None, _) => None,
        };
        let r = match resumed {
            Some(r) => r,
            None => {
                let s = recovery::scan(&*keep.log()?, keep.base_offset, cut, None, interval, false).at(&log_path)?;
                recovery::Resumed {
                    offsets: s.offsets,
                    times: s.times,
                    builder: s.builder,
                    next_offset: s.next_offset,
                    first_timestamp: s.first_timestamp,
                }
            }
        };
        keep.set_size(cut);
        keep.set_max_timestamp(r.builder.max_timestamp);
        let new_end = r.next_offset.unwrap_or(keep.base_offset);
        w.active = Active::install(keep, r.offsets, r.times, r.builder, r.first_timestamp, true)?;
        w.dir_dirty = true;
        self.finish_truncation(&mut w, new_end)?;
        let w = &mut *w;
        w.producers.reload(w.segments.values(), self.log_start_offset(), new_end)
    }

    /// Empties the log and restarts it at `offset` (a follower whose leader's log
    /// starts after this log's end).
    pub fn truncate_fully_and_start_at(&self, offset: Offset) -> Result<()> {
        let mut w = self.lock_writer()?;
        self.truncate_fully_locked(&mut w, offset)
    }

    fn truncate_fully_locked(&self, w: &mut Writer, offset: Offset) -> Result<()> {
        let config = self.config();
        let all = std::mem::take(&mut w.segments);
        for seg in all.values() {
            self.schedule_delete(w, &config, seg)?;
        }
        let new = self.create_segment(offset)?;
        w.segments.insert(offset, new.clone());
        w.active = Active::install(new, Vec::new(), Vec::new(), IndexBuilder::default(), None, true)?;
        w.dir_dirty = true;
        w.epochs.clear()?;
        w.producers.clear()?;
        self.log_start_offset.store(offset, Ordering::Release);
        self.high_watermark.store(offset, Ordering::Release);
        self.recovery_point.store(offset, Ordering::Release);
        self.finish_truncation(w, offset)
    }

    fn finish_truncation(&self, w: &mut Writer, new_end: Offset) -> Result<()> {
        self.truncations.fetch_add(1, Ordering::AcqRel);
        self.truncated_below.fetch_min(new_end, Ordering::AcqRel);
        w.unsynced.retain(|s| w.segments.contains_key(&s.base_offset));
        self.publish(w);
        self.log_end_offset.store(new_end, Ordering::Release);
        self.size_bytes.store(w.segments.values().map(|s| s.size()).sum(), Ordering::Release);
        self.high_watermark.fetch_min(new_end, Ordering::AcqRel);
        self.recovery_point.fetch_min(new_end, Ordering::AcqRel);
        w.epochs.truncate_from_end(new_end)
    }

    /// Renames a segment's files to `*.deleted` and deletes them after
    /// `file.delete.delay.ms`, so readers holding it finish first.
    fn schedule_delete(&self, w: &mut Writer, config: &LogConfig, seg: &Segment) -> Result<()> {
        let renamed = seg.rename_deleted()?;
        w.dir_dirty = true;
        if config.file_delete_delay.is_zero() {
            for p in &renamed {
                remove_if_exists(p)?;
            }
        } else {
            w.pending_deletes.push((Instant::now() + config.file_delete_delay, renamed));
        }
        Ok(())
    }

    /// Unlinks the `.deleted` files whose delay has passed (all of them with `all`).
    fn delete_expired(&self, w: &mut Writer, all: bool) -> Result<()> {
        let now = Instant::now();
        let (due, later): (Vec<_>, Vec<_>) = w.pending_deletes.drain(..).partition(|(at, _)| all || *at <= now);
        w.pending_deletes = later;
        for (_, paths) in due {
            for p in &paths {
                remove_if_exists(p)?;
            }
        }
        Ok(())
    }

    /// The first offset whose record timestamp is `>= ts`, with that record's
    /// timestamp (Kafka's ListOffsets by time). For a compressed batch or one with
    /// LogAppendTime: the batch's base offset and max timestamp. `None` when every
    /// record is older.
    pub fn offset_for_timestamp(&self, ts: i64) -> Result<Option<(Offset, i64)>> {
        let view = self.view();
        for seg in view.values() {
            if seg.max_timestamp() < ts {
                continue;
            }
            let path = seg.path(LOG_SUFFIX);
            let start =
                seg.time_floor_below(ts).at(&path)?.map_or(seg.base_offset, |t| seg.base_offset + i64::from(t.relative_offset));
            let size = seg.size();
            let Some((position, _)) = seg.find_batch(start, size)? else {
                continue;
            };
            let file = seg.log()?;
            let mut walk = crate::segment::Walker::new(&file, position, size);
            while let crate::segment::Step::Batch { position, header } = walk.step(false).at(&path)? {
                if header.max_timestamp < ts {
                    continue;
                }
                if header.compression() != Compression::None || header.timestamp_type() == TimestampType::LogAppendTime {
                    return Ok(Some((header.base_offset, header.max_timestamp)));
                }
                let bytes = walk.batch_bytes(position, header.size()).at(&path)?;
                for record in Records::new(&bytes[BATCH_OVERHEAD..], BATCH_OVERHEAD).flatten() {
                    let record_ts = header.base_timestamp + record.timestamp_delta;
                    if record_ts >= ts {
                        return Ok(Some((header.base_offset + i64::from(record.offset_delta), record_ts)));
                    }
                }
                return Ok(Some((header.base_offset, header.max_timestamp)));
            }
        }
        Ok(None)
    }

    /// Deletes whole sealed segments, oldest first, while `retention.ms` (by the
    /// segment's largest timestamp, against `now_ms`) or `retention.bytes` says so;
    /// the active segment always stays. Returns how many segments were deleted.
    /// Also forgets idempotent producers idle for `producer.id.expiration.ms`.
    pub fn apply_retention(&self, now_ms: i64) -> Result<usize> {
        let mut w = lock::mutex(&self.writer);
        self.delete_expired(&mut w, false)?;
        if w.closed {
            return Ok(0);
        }
        let config = self.config();
        let expired = w.producers.remove_expired(now_ms, config.producer_id_expiration.as_millis() as i64);
        if expired > 0 {
            tracing::debug!(dir = %self.dir.display(), producers = expired, "expired idle producer ids");
        }
        if !config.cleanup_policy.deletes() {
            return Ok(0);
        }
        let active_base = w.active.segment.base_offset;
        let mut size = self.size_bytes();
        let mut doomed = Vec::new();
        for (&base, seg) in &w.segments {
            if base == active_base {
                break;
            }
            let expired =
                config.retention_ms.is_some_and(|ms| seg.max_timestamp() < now_ms.saturating_sub(ms.as_millis() as i64));
            let oversize = config.retention_bytes.is_some_and(|limit| size.saturating_sub(seg.size()) >= limit);
            if !expired && !oversize {
                break;
            }
            size -= seg.size();
            doomed.push(base);
        }
        if doomed.is_empty() {
            return Ok(0);
        }
        for base in &doomed {
            if let Some(seg) = w.segments.remove(base) {
                tracing::info!(dir = %self.dir.display(), segment = base, "deleting a segment by retention");
                self.schedule_delete(&mut w, &config, &seg)?;
            }
        }
        // A start moved into a kept segment (DeleteRecords) stays where it is.
        let log_start = (*w.segments.keys().next().expect("invariant: the active segment stays")).max(self.log_start_offset());
        // Readers check the start offset first, then look at the segments.
        self.log_start_offset.store(log_start, Ordering::Release);
        self.publish(&w);
        self.size_bytes.store(size, Ordering::Release);
        self.high_watermark.fetch_max(log_start, Ordering::AcqRel);
        self.recovery_point.fetch_max(log_start, Ordering::AcqRel);
        w.unsynced.retain(|s| s.base_offset >= log_start);
        w.epochs.truncate_from_start(log_start)?;
        w.producers.on_log_start(log_start)?;
        Ok(doomed.len())
    }

    /// Moves the log start offset up to `offset` (Kafka's DeleteRecords): reads below it
    /// are out of range, ListOffsets earliest answers it, and every segment wholly below
    /// it is deleted (the one it falls in stays, its records below `offset` unreadable).
    /// At or below the current start nothing changes. Above the log end:
    /// [`Error::OffsetOutOfRange`]. Returns the log start offset afterwards. The new
    /// start survives a restart through the log dir's `log-start-offset-checkpoint`
    /// ([`crate::LogManager`]), which the caller writes.
    pub fn delete_records_before(&self, offset: Offset) -> Result<Offset> {
        let mut w = self.lock_writer()?;
        let log_start = self.log_start_offset();
        let log_end = self.log_end_offset();
        if offset > log_end {
            return Err(Error::OffsetOutOfRange { requested: offset, log_start, log_end });
        }
        if offset <= log_start {
            return Ok(log_start);
        }
        let config = self.config();
        // Segments whose successor starts at or below `offset` hold only records below it.
        let bases: Vec<Offset> = w.segments.keys().copied().collect();
        let doomed: Vec<Offset> = bases.windows(2).take_while(|pair| pair[1] <= offset).map(|pair| pair[0]).collect();
        // Readers check the start offset first, then look at the segments.
        self.log_start_offset.store(offset, Ordering::Release);
        let mut size = self.size_bytes();
        for base in &doomed {
            if let Some(seg) = w.segments.remove(base) {
                size = size.saturating_sub(seg.size());
                self.schedule_delete(&mut w, &config, &seg)?;
            }
        }
        tracing::info!(dir = %self.dir.display(), log_start = offset, segments = doomed.len(), "deleted records below the new log start");
        self.publish(&w);
        self.size_bytes.store(size, Ordering::Release);
        self.high_watermark.fetch_max(offset, Ordering::AcqRel);
        let w = &mut *w;
        w.unsynced.retain(|s| w.segments.contains_key(&s.base_offset));
        w.epochs.truncate_from_start(offset)?;
        w.producers.on_log_start(offset)?;
        Ok(offset)
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

    /// Replaces the sealed segments `group` (consecutive, the first at
    /// `cleaned.base`) with the cleaned segment written as `.cleaned` files, following
    /// the swap protocol of [`crate::cleaner`]. `Ok(false)`, with the cleaned files
    /// removed, when the group changed since the clean started (retention deleted a
    /// segment, a truncation happened: `truncations` is the count the clean saw).
    pub(crate) fn install_cleaned(
        &self,
        group: &[Arc<Segment>],
        sizes: &[u64],
        truncations: u64,
        cleaned: Cleaned,
        hook: &mut Option<SwapHook>,
    ) -> Result<bool> {
        let dir = self.dir.clone();
        let base = cleaned.base;
        let interrupted = |source: Error| Error::SwapInterrupted { dir: dir.clone(), source: Box::new(source) };
        // A hook error stands for a crash: the files stay exactly as they are.
        let mut step = |s: SwapStep| -> Result<()> {
            match hook {
                Some(h) => h(s).map_err(|e| interrupted(Error::Io { path: dir.clone(), source: e })),
                None => Ok(()),
            }
        };
        let mut w = lock::mutex(&self.writer);
        let unchanged = !w.closed
            && self.truncations.load(Ordering::Acquire) == truncations
            && group.iter().zip(sizes).all(|(s, &size)| {
                w.segments.get(&s.base_offset).is_some_and(|c| Arc::ptr_eq(c, s))
                    && !Arc::ptr_eq(s, &w.active.segment)
                    && s.size() == size
            });
        if !unchanged {
            drop(w);
            cleaner::remove_cleaned(&dir, base)?;
            return Ok(false);
        }
        // Readers of the old segments must never open the new files under the old names.
        for s in group {
            s.pin_indexes();
        }
        step(SwapStep::Commit)?;
        for suffix in [INDEX_SUFFIX, TIME_INDEX_SUFFIX, LOG_SUFFIX] {
            step(SwapStep::RenameToSwap(suffix))?;
            let from = cleaner::suffixed(&dir, base, suffix, CLEANED_SUFFIX);
            let to = cleaner::suffixed(&dir, base, suffix, SWAP_SUFFIX);
            if let Err(e) = fs::rename(&from, &to) {
                // Not committed (the .log rename is the commit): back to the old set.
                let _ = cleaner::remove_cleaned(&dir, base);
                return Err(Error::Io { path: to, source: e });
            }
        }
        let config = self.config();
        let committed = (|| -> Result<Arc<Segment>> {
            sync_dir(&dir)?;
            for s in group {
                step(SwapStep::DeleteOld(s.base_offset))?;
                self.schedule_delete(&mut w, &config, s)?;
            }
            for suffix in [INDEX_SUFFIX, TIME_INDEX_SUFFIX, LOG_SUFFIX] {
                step(SwapStep::Install(suffix))?;
                let to = crate::segment::segment_path(&dir, base, suffix);
                fs::rename(cleaner::suffixed(&dir, base, suffix, SWAP_SUFFIX), &to).at(&to)?;
            }
            sync_dir(&dir)?;
            Ok(Arc::new(Segment::new(&dir, base, cleaned.size, cleaned.max_timestamp)))
        })();
        let new = committed.map_err(|e| match e {
            e @ Error::SwapInterrupted { .. } => e,
            e => interrupted(e),
        })?;
        for s in group {
            w.segments.remove(&s.base_offset);
        }
        w.segments.insert(base, new);
        w.unsynced.retain(|s| !group.iter().any(|g| Arc::ptr_eq(g, s)));
        self.publish(&w);
        self.size_bytes.store(w.segments.values().map(|s| s.size()).sum(), Ordering::Release);
        Ok(true)
    }

    /// Damaged segments: the `.log` file and byte position of the first batch found
    /// not whole and valid (by a read, recovery or the scrubber). Reads at and past it
    /// fail with [`Error::CorruptSegment`] until [`Log::truncate_to`] cuts it away.
    pub fn damage(&self) -> Vec<(PathBuf, u64)> {
        self.view().values().filter_map(|s| Some((s.path(LOG_SUFFIX), s.damage_at()?))).collect()
    }

    /// Corrupt batches found in the current segments since the log was opened (each
    /// damaged segment counts once, and again only if damage is found further up).
    pub fn corrupt_batches(&self) -> u64 {
        self.view().values().map(|s| s.damage_reports()).sum()
    }

    /// The scrubber: CRC-checks up to `budget` bytes of the log, going on where the last
    /// call stopped and starting over after the last segment. Damage found is recorded
    /// as by reads (logged once, counted, reads fail at it). Returns the bytes checked
    /// and whether this call finished a pass over the whole log.
    pub fn scrub(&self, budget: u64) -> Result<(u64, bool)> {
        let mut cursor = lock::mutex(&self.scrub_cursor);
        let view = self.view();
        let mut checked = 0u64;
        for (&base, seg) in view.range(cursor.0..) {
            let from = if base == cursor.0 { cursor.1 } else { 0 };
            let size = seg.size();
            if from >= size {
                continue;
            }
            let file = match seg.log() {
                Ok(f) => f,
                // Deleted meanwhile: nothing left to check there.
                Err(_) if seg.is_deleted() => continue,
                Err(e) => return Err(e),
            };
            let reached = seg.scrub(&file, from, size, budget.saturating_sub(checked))?;
            checked += reached - from;
            if reached < size || checked >= budget {
                *cursor = (base, reached);
                return Ok((checked, false));
            }
            *cursor = (base, size);
        }
        *cursor = (Offset::MIN, 0);
        Ok((checked, true))
    }

    /// The operator's repair of damage (see [`Log::damage`]): scrubs the whole log,
    /// then truncates it after the last good batch before the first damage, dropping
    /// the damaged batch and everything after it (later segments too), as a follower
    /// truncates to its leader. Returns the new log end offset, `None` when nothing is
    /// damaged. On a follower, replication then fetches the dropped part again from
    /// the leader; on a single node it is gone, which is why this is never automatic.
    pub fn repair(&self) -> Result<Option<Offset>> {
        while !self.scrub(u64::MAX)?.1 {}
        let view = self.view();
        let Some((seg, at)) = view.values().find_map(|s| Some((s, s.damage_at()?))) else {
            return Ok(None);
        };
        let offset = seg.next_offset_before(at)?;
        tracing::warn!(
            dir = %self.dir.display(), segment = seg.base_offset, position = at, offset,
            "repair: truncating the log at its first damaged batch"
        );
        self.truncate_to(offset)?;
        Ok(Some(self.log_end_offset()))
    }

    /// Time since the last flush (for metrics).
    pub fn time_since_flush(&self) -> Duration {
        Duration::from_millis((now_ms() - self.last_flush_ms.load(Ordering::Acquire)).max(0) as u64)
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

/// An append holds at least one batch header and fits the `i32` positions of the index.
fn check_append_size(buf: &[u8]) -> Result<()> {
    if buf.is_empty() {
        let source = fjord_record::Error::Truncated { needed: BATCH_OVERHEAD, available: 0 };
        return Err(Error::InvalidBatch { position: 0, source });
    }
    if buf.len() > i32::MAX as usize {
        return Err(Error::MessageTooLarge { size: buf.len(), max: i32::MAX as usize });
    }
    Ok(())
}

/// Checks every batch of an append before anything is written: framing, magic, CRC,
/// records of uncompressed batches, a non-zero record count, and the size limit.
/// Returns each batch's position in `buf` and header.
fn validate(buf: &[u8], max_message_bytes: u32) -> Result<Vec<(usize, BatchHeader)>> {
    check_append_size(buf)?;
    let mut out = Vec::new();
    let mut position = 0;
    while position < buf.len() {
        let rest = &buf[position..];
        let invalid = |source| Error::InvalidBatch { position, source };
        let header = BatchHeader::parse_unchecked(rest).map_err(invalid)?;
        if header.size() > max_message_bytes as usize {
            return Err(Error::MessageTooLarge { size: header.size(), max: max_message_bytes as usize });
        }
        let header = BatchHeader::parse_validated(rest).map_err(invalid)?;
        if header.record_count == 0 {
            return Err(invalid(fjord_record::Error::RecordCountMismatch { count: 0, detail: "empty batch" }));
        }
        out.push((position, header));
        position += header.size();
    }
    Ok(out)
}

/// What [`Log::append_visiting`] shows a caller of each record: the batch's header (as
/// parsed; its offsets are not assigned yet) and the record's framing.
pub type RecordVisitor<'a> = &'a mut dyn FnMut(&BatchHeader, &RecordFrame<'_>);

/// [`validate`] for a leader's append, where the bytes come from a client: the records
/// of compressed batches are decompressed (all batches together into at most
/// [`LogConfig::max_decompressed_bytes`]) and walked like an uncompressed batch's, and
/// in a compacted log every record needs a key (control batches aside: the cleaner
/// could never tell which value is the latest). One walk per batch serves the framing
/// check, the key check and `visit`.
fn validate_leader(buf: &[u8], config: &LogConfig, mut visit: Option<RecordVisitor<'_>>) -> Result<Vec<(usize, BatchHeader)>> {
    let compacts = config.cleanup_policy.compacts();
    if visit.is_none() && !compacts && batch_headers(buf).all(|h| h.compression() == Compression::None) {
        // The common case needs nothing but the framing walk that CRC checking interleaves.
        return validate(buf, config.max_message_bytes);
    }
    check_append_size(buf)?;
    let limit = config.max_decompressed_bytes();
    let mut budget = limit;
    // KIP-467: the index of each keyless record among the append's records, and the
    // first batch holding one.
    let mut keyless: Vec<i32> = Vec::new();
    let mut first_keyless = None;
    let mut records_before = 0i32;
    let mut out = Vec::new();
    let mut position = 0;
    while position < buf.len() {
        let rest = &buf[position..];
        let invalid = |source| Error::InvalidBatch { position, source };
        let unchecked = BatchHeader::parse_unchecked(rest).map_err(invalid)?;
        if unchecked.size() > config.max_message_bytes as usize {
            return Err(Error::MessageTooLarge { size: unchecked.size(), max: config.max_message_bytes as usize });
        }
        let check_keys = compacts && !unchecked.is_control();
        let keyless_before = keyless.len();
        let walked = BatchHeader::parse_walked(rest, budget, |record| {
            if check_keys && !record.has_key {
                keyless.push(records_before.saturating_add(record.index));
            }
            if let Some(visit) = visit.as_mut() {
                visit(&unchecked, record);
            }
        });
        let (header, expanded) = match walked {
            Ok(walked) => walked,
            Err(fjord_record::Error::DecompressedTooLarge { codec, .. }) => {
                return Err(Error::DecompressedTooLarge { position, codec, limit })
            }
            Err(source) => return Err(invalid(source)),
        };
        budget -= expanded;
        if header.record_count == 0 {
            return Err(invalid(fjord_record::Error::RecordCountMismatch { count: 0, detail: "empty batch" }));
        }
        if keyless.len() > keyless_before && first_keyless.is_none() {
            first_keyless = Some(position);
        }
        records_before = records_before.saturating_add(header.record_count);
        out.push((position, header));
        position += header.size();
    }
    if let Some(position) = first_keyless {
        return Err(Error::MissingKey { position, record_indexes: keyless });
    }
    Ok(out)
}

/// The headers of the batches in `buf`, read without any check, until one does not parse:
/// enough to see which codecs an append holds before choosing how to validate it.
fn batch_headers(mut buf: &[u8]) -> impl Iterator<Item = BatchHeader> + '_ {
    std::iter::from_fn(move || {
        let header = BatchHeader::parse_unchecked(buf).ok()?;
        buf = buf.get(header.size()..).unwrap_or_default();
        Some(header)
    })
}
