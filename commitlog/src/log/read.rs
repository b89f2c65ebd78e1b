//! Reads: whole batches by offset (as a file region for `sendfile(2)`, or copied),
//! and the offset of a timestamp (ListOffsets by time). Readers never take the
//! writer lock; they work on the published segment view.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use fjord_record::{Compression, Offset, Records, TimestampType, BATCH_OVERHEAD};

use super::Log;
use crate::error::IoContext;
use crate::lock;
use crate::segment::{Segment, Slice, LOG_SUFFIX};
use crate::{Error, Result};

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

/// How many times a read starts over on a newer segment list after a segment swap.
const MAX_READ_RETRIES: usize = 8;

impl Log {
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
        let empty = |seg: &Segment| -> Result<ReadSlice> {
            Ok(ReadSlice { file: seg.log()?, position: seg.size(), len: 0, first_offset: offset, next_offset: offset })
        };
        let mut retries = 0;
        loop {
            // The writer publishes a new segment before the log end that reaches into it,
            // and a new log start before the segment list without the deleted segments:
            // so load the log end, then the segments, then the log start.
            let log_end = self.log_end_offset();
            let view = self.view();
            let log_start = self.log_start_offset();
            if offset < log_start || offset > log_end {
                return Err(Error::OffsetOutOfRange { requested: offset, log_start, log_end });
            }
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
                // Raced with the cleaner: it swapped the segments this read held for a cleaned
                // one, which has the records at or after `offset` (the last batch of the log
                // is never cleaned away). Read again on the new list instead of answering
                // empty below the log end. The swap renames the old files before it
                // publishes the new list, under the writer lock: waiting for that lock (only
                // on this rare path) makes sure the new list is out. Each retry needs yet
                // another swap to fail.
                if retries < MAX_READ_RETRIES {
                    drop(lock::mutex(&self.writer));
                    if !Arc::ptr_eq(&view, &self.view()) {
                        retries += 1;
                        continue;
                    }
                }
            }
            let seg = view.values().next_back().expect("invariant: at least one segment");
            return empty(seg);
        }
    }

    /// [`Log::read`], copying the bytes into memory.
    pub fn read_bytes(&self, offset: Offset, max_bytes: usize, upper_bound: Option<Offset>, min_one: bool) -> Result<Vec<u8>> {
        let slice = self.read(offset, max_bytes, upper_bound, min_one)?;
        slice.read_to_vec().map_err(|source| Error::Io { path: self.dir.clone(), source })
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

    /// ListOffsets' max timestamp (-3, KIP-734): the offset and timestamp of the first
    /// record carrying the largest timestamp in the log; `None` for a log without
    /// records. As Kafka answers since KAFKA-16310: that record's own offset, not the
    /// last offset of its batch (a compressed batch is decompressed to find it, within
    /// `max_decompressed_bytes`; with LogAppendTime every record of the batch carries
    /// the batch's timestamp, so its first record is the answer).
    pub fn offset_of_max_timestamp(&self) -> Result<Option<(Offset, i64)>> {
        let view = self.view();
        // The first segment holding the largest timestamp (an empty one holds none).
        let Some(seg) = view.values().filter(|s| s.max_timestamp() != i64::MIN).reduce(|best, s| {
            if s.max_timestamp() > best.max_timestamp() {
                s
            } else {
                best
            }
        }) else {
            return Ok(None);
        };
        let max = seg.max_timestamp();
        let path = seg.path(LOG_SUFFIX);
        let size = seg.size();
        let Some((position, _)) = seg.find_batch(seg.base_offset, size)? else {
            return Ok(None);
        };
        let file = seg.log()?;
        let mut walk = crate::segment::Walker::new(&file, position, size);
        while let crate::segment::Step::Batch { position, header } = walk.step(false).at(&path)? {
            if header.max_timestamp != max {
                continue;
            }
            if header.timestamp_type() == TimestampType::LogAppendTime {
                return Ok(Some((header.base_offset, max)));
            }
            let bytes = walk.batch_bytes(position, header.size()).at(&path)?;
            let limit = self.config().max_decompressed_bytes();
            let body = fjord_record::compression::records_body(&header, bytes, limit)
                .map_err(|source| Error::CorruptSegment { path: path.clone(), position, source })?;
            let found = Records::new(&body, BATCH_OVERHEAD)
                .flatten()
                .find(|r| header.base_timestamp + r.timestamp_delta == max)
                .map_or(header.last_offset(), |r| header.base_offset + i64::from(r.offset_delta));
            return Ok(Some((found, max)));
        }
        Ok(None)
    }
}
