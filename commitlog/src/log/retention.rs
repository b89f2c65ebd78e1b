//! Removing data from the start of the log: retention by time and size, DeleteRecords,
//! idle producer ids, and the delayed unlinking of deleted segment files.

use std::sync::atomic::Ordering;
use std::time::Instant;

use fjord_record::Offset;

use super::{Log, Writer};
use crate::recovery::remove_if_exists;
use crate::segment::Segment;
use crate::{lock, Error, LogConfig, Result};

impl Log {
    /// Renames a segment's files to `*.deleted` and deletes them after
    /// `file.delete.delay.ms`, so readers holding it finish first.
    pub(super) fn schedule_delete(&self, w: &mut Writer, config: &LogConfig, seg: &Segment) -> Result<()> {
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
    pub(super) fn delete_expired(&self, w: &mut Writer, all: bool) -> Result<()> {
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

    /// Deletes whole sealed segments, oldest first, while `retention.ms` (by the
    /// segment's largest timestamp, against `now_ms`) or `retention.bytes` says so;
    /// the active segment always stays, and so does every segment from the one holding
    /// the first offset of the earliest open transaction (its records must stay readable
    /// until its marker decides them, and the producer state knows it from them). Returns
    /// how many segments were deleted. Also forgets idempotent producers idle for
    /// `producer.id.expiration.ms` (never one with an open transaction).
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
        let first_open = w.producers.open_transactions().next().map_or(Offset::MAX, |(first, _)| first);
        let mut size = self.size_bytes();
        let mut doomed = Vec::new();
        for (&base, seg) in &w.segments {
            if base == active_base {
                break;
            }
            // The segment ends where the next begins: it must end at or below `first_open`.
            if w.segments.range(base + 1..).next().is_some_and(|(&next, _)| next > first_open) {
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
        self.move_log_start(offset, true)
    }

    /// Moves the log start offset up to `offset` as the log dir's checkpoint recorded it,
    /// when the log opens: as [`Log::delete_records_before`], but no segment is deleted.
    /// A checkpoint alone never deletes data (#26): the segments wholly below `offset`
    /// stay on disk, unreadable, until DeleteRecords or retention removes them
    /// (normally there are none: DeleteRecords deleted them before the checkpoint was
    /// written). The caller decides whether to believe the checkpoint
    /// (`crate::log_start::decide`).
    pub(crate) fn restore_log_start(&self, offset: Offset) -> Result<Offset> {
        self.move_log_start(offset, false)
    }

    fn move_log_start(&self, offset: Offset, delete_segments: bool) -> Result<Offset> {
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
        let doomed: Vec<Offset> = if delete_segments {
            bases.windows(2).take_while(|pair| pair[1] <= offset).map(|pair| pair[0]).collect()
        } else {
            Vec::new()
        };
        // Readers check the start offset first, then look at the segments.
        self.log_start_offset.store(offset, Ordering::Release);
        let mut size = self.size_bytes();
        for base in &doomed {
            if let Some(seg) = w.segments.remove(base) {
                size = size.saturating_sub(seg.size());
                self.schedule_delete(&mut w, &config, &seg)?;
            }
        }
        if delete_segments {
            tracing::info!(dir = %self.dir.display(), log_start = offset, segments = doomed.len(), "deleted records below the new log start");
        }
        self.publish(&w);
        self.size_bytes.store(size, Ordering::Release);
        self.high_watermark.fetch_max(offset, Ordering::AcqRel);
        let w = &mut *w;
        w.unsynced.retain(|s| w.segments.contains_key(&s.base_offset));
        w.epochs.truncate_from_start(offset)?;
        w.producers.on_log_start(offset)?;
        Ok(offset)
    }
}
