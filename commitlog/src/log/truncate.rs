//! Truncation: cutting the log back to an offset (a follower matching its leader, the
//! operator's repair) or emptying it to restart at an offset.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use fjord_record::Offset;

use super::{Log, Writer};
use crate::error::IoContext;
use crate::index::IndexBuilder;
use crate::recovery::{self, Active};
use crate::segment::LOG_SUFFIX;
use crate::{Error, Result};

impl Log {
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
        // The producer state and the aborted-transactions index of the kept segments
        // forget what was cut (replayed from a snapshot at or below the new end).
        let replayed = w.producers.reload(w.segments.values(), self.log_start_offset(), new_end, new_end)?;
        super::txn::rebuild_indexes(w.segments.values(), &replayed)?;
        self.reset_unstable(&w.producers);
        Ok(())
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
        self.reset_unstable(&w.producers);
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
}
