//! Appends: the leader's (offsets assigned here, idempotent producers checked) and a
//! follower's (offsets kept), rolling to a new segment, and writing the active
//! segment's index entries.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use fjord_record::batch::{self, BatchHeader};
use fjord_record::Offset;

use super::validate::{validate, validate_leader, RecordVisitor};
use super::{Log, Writer};
use crate::error::IoContext;
use crate::index::{self, IndexBuilder};
use crate::recovery::Active;
use crate::segment::{Segment, INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX};
use crate::{Error, LogConfig, Result};

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

impl Log {
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
        self.append_visiting(batches, leader_epoch, None, super::TxnVerification::Off)
    }

    /// [`Log::append`], showing `visit` every record of every batch as the validation
    /// walks it (control batches too, with their header), so a caller counts records
    /// without walking or decompressing them a second time. The validation's verdict
    /// comes after the visits: what the caller gathered holds only if this returns `Ok`.
    /// A producer's batches are taken as `verification` says (see [`super::TxnVerification`]);
    /// a retry of a batch already in the log is answered before that check, as in Kafka.
    pub fn append_visiting(
        &self,
        batches: &mut [u8],
        leader_epoch: i32,
        visit: Option<RecordVisitor<'_>>,
        verification: super::TxnVerification,
    ) -> Result<AppendInfo> {
        let config = self.config();
        let mut headers = validate_leader(batches, &config, super::now_ms(), visit)?;
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
        Self::check_verified(&w, &headers, verification)?;
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

    pub(super) fn append_validated(
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
        let producers = match self.prepare_producers(w, &segment, batches, headers) {
            Ok(update) => update,
            Err(e) => {
                let _ = w.epochs.truncate_from_end(leo_before);
                return Err(e);
            }
        };
        let active = &mut w.active;
        // Straight to the held file, the path formatted only on failure: per append, a
        // small one especially, both are measurable.
        if let Err(source) = active.log_file.write_all_at(batches, position) {
            // Leave the log byte for byte as it was (cut back to `position`, the segment's
            // size, which also forgets the reservation past it).
            let _ = active.release_reserved();
            let _ = w.epochs.truncate_from_end(leo_before);
            self.undo_producers(&segment, &producers);
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
        self.apply_producers(w, headers, producers);
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

    pub(super) fn create_segment(&self, base_offset: Offset) -> Result<Arc<Segment>> {
        let path = crate::segment::segment_path(&self.dir, base_offset, LOG_SUFFIX);
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).at(&path)?;
        let segment = Arc::new(Segment::new(&self.dir, base_offset, 0, i64::MIN));
        segment.pin_file(file);
        Ok(segment)
    }

    /// Appends the resident index entries not yet in the active segment's files
    /// (with a final time entry when `final_time` is set, so the time index's last
    /// entry holds the segment's largest timestamp).
    pub(super) fn write_active_indexes(&self, w: &mut Writer, final_time: bool) -> Result<()> {
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
}
