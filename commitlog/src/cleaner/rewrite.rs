//! Rewriting sealed segments: which records a pass keeps, the batches rebuilt
//! without the dropped ones, and the `.cleaned` files they are written to.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fjord_record::batch::BatchHeader;
use fjord_record::{Compression, Offset, Records, BATCH_OVERHEAD};

use super::offset_map::{key_hash, OffsetMap};
use super::swap::{remove_cleaned, suffixed};
use super::{CleanStats, CleanerState, SwapHook, Throttle, CLEANED_SUFFIX, MAX_DECOMPRESSED, WRITE_BUFFER};
use crate::checkpoint::sync_dir;
use crate::error::IoContext;
use crate::index::{self, IndexBuilder, OffsetEntry, TimeEntry};
use crate::segment::{Segment, Step, Walker, INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX};
use crate::{Error, Log, Result};

/// The next batch of a walk, CRC-checked.
pub(super) fn next_batch<'w>(walk: &'w mut Walker<'_>, path: &Path) -> Result<Option<(BatchHeader, &'w [u8])>> {
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

pub(super) fn corrupt(path: &Path, position: Offset, source: fjord_record::Error) -> Error {
    Error::CorruptSegment { path: path.to_path_buf(), position: position.max(0) as u64, source }
}

pub(super) fn records_body<'a>(header: &BatchHeader, bytes: &'a [u8], path: &Path) -> Result<std::borrow::Cow<'a, [u8]>> {
    fjord_record::compression::records_body(header, bytes, MAX_DECOMPRESSED).map_err(|e| corrupt(path, header.base_offset, e))
}

/// What a pass keeps.
pub(super) struct Pass<'a> {
    pub(super) map: &'a OffsetMap,
    pub(super) map_end: Offset,
    pub(super) now_ms: i64,
    pub(super) delete_retention: Duration,
    pub(super) horizons: &'a CleanerState,
    /// Earliest expiry among the tombstones this pass kept.
    pub(super) tombstones_due: std::cell::Cell<Option<i64>>,
    /// Aborted transactions: their records go.
    pub(super) aborted: &'a Aborted,
    /// Per producer, whether the transaction walked so far (since its previous marker)
    /// kept any record: its marker may go only when none did (see [`Pass::drop_marker`]).
    pub(super) txn_kept: std::cell::RefCell<std::collections::HashMap<i64, bool>>,
    /// Per producer, the offset of its last data batch in the log (producer state).
    pub(super) producer_last: &'a std::collections::HashMap<i64, Offset>,
}

/// The aborted transactions overlapping what a clean reads, by producer: a
/// transactional batch inside one of them holds aborted records.
#[derive(Debug, Default)]
pub(super) struct Aborted(std::collections::HashMap<i64, Vec<(Offset, Offset)>>);

impl Aborted {
    pub(super) fn load(log: &Log, from: Offset, to: Offset) -> Result<Self> {
        let mut by_producer: std::collections::HashMap<i64, Vec<(Offset, Offset)>> = std::collections::HashMap::new();
        for a in log.aborted_transactions(from, to)? {
            by_producer.entry(a.producer_id).or_default().push((a.first_offset, a.last_offset));
        }
        Ok(Self(by_producer))
    }

    pub(super) fn contains(&self, header: &BatchHeader) -> bool {
        header.is_transactional()
            && !header.is_control()
            && self.0.get(&header.producer_id).is_some_and(|ranges| {
                ranges.iter().any(|&(first, last)| first <= header.base_offset && header.base_offset <= last)
            })
    }
}

impl Pass<'_> {
    /// Whether the record at `offset` stays. Returns `(keep, expired tombstone)`.
    pub(super) fn keep(&self, offset: Offset, key: Option<&[u8]>, value: Option<&[u8]>) -> (bool, bool) {
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

impl Pass<'_> {
    /// Records that a data batch of `producer_id`'s transaction kept records (or not).
    fn txn_data(&self, producer_id: i64, kept: bool) {
        *self.txn_kept.borrow_mut().entry(producer_id).or_insert(false) |= kept;
    }

    /// Kafka's second pass over transaction markers: a marker goes once its transaction
    /// has no record left in the log (all aborted, or all superseded by later keys) and
    /// it was first cleaned more than `delete.retention.ms` ago, so a read_committed
    /// reader that saw the transaction's records had that long to see the marker too.
    /// Safe because a pass walks the log from its start in order: every data batch of the
    /// transaction came before its marker in this walk. A marker stays when it is its
    /// producer's last batch (no later data batch of it), so the producer's epoch is
    /// still in the log for the producer state rebuilt after a crash; and above the end
    /// of the pass. A marker kept for its age makes the log due again then.
    fn drop_marker(&self, header: &BatchHeader) -> bool {
        let kept_data = self.txn_kept.borrow_mut().remove(&header.producer_id).unwrap_or(false);
        if kept_data || header.base_offset >= self.map_end {
            return false;
        }
        if self.producer_last.get(&header.producer_id).is_none_or(|&last| last <= header.base_offset) {
            return false;
        }
        let first_cleaned = self.horizons.first_cleaned_at(header.base_offset).unwrap_or(self.now_ms);
        let due = first_cleaned.saturating_add(self.delete_retention.as_millis() as i64);
        if due <= self.now_ms {
            return true;
        }
        self.tombstones_due.set(Some(self.tombstones_due.get().map_or(due, |d| d.min(due))));
        false
    }
}

/// Rewrites one group into a cleaned segment and swaps it in. `Ok(false)` when the
/// group's segments changed meanwhile (the cleaned files are then removed).
pub(super) fn clean_group(
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
pub(super) fn write_cleaned(
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
                if pass.drop_marker(&header) {
                    stats.markers_removed += 1;
                } else {
                    out.push(&header, bytes, config.index_interval_bytes)?;
                }
                continue;
            }
            if header.base_offset < pass.map_end && pass.aborted.contains(&header) {
                // An aborted transaction's records: no reader may ever see them.
                stats.records_read += header.record_count.max(0) as u64;
                pass.txn_data(header.producer_id, false);
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
            if header.is_transactional() {
                pass.txn_data(header.producer_id, !kept.is_empty());
            }
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
pub(super) fn rebuild(
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

/// A cleaned segment being written as `.cleaned` files.
pub(super) struct CleanedWriter {
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
    pub(super) fn create(dir: &Path, base: Offset) -> Result<Self> {
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

    pub(super) fn push(&mut self, header: &BatchHeader, bytes: &[u8], interval: u32) -> Result<()> {
        let rel = (header.base_offset - self.base) as u32;
        let (o, t) = self.builder.on_batch(interval, rel, self.position as u32, header.max_timestamp, bytes.len() as u64);
        self.offsets.extend(o);
        self.times.extend(t);
        self.file.write_all(bytes).at(suffixed(&self.dir, self.base, LOG_SUFFIX, CLEANED_SUFFIX))?;
        self.position += bytes.len() as u64;
        Ok(())
    }

    /// Writes the indexes and fsyncs the three files.
    pub(super) fn finish(mut self) -> Result<Cleaned> {
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
