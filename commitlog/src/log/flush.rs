//! Durability: fsync of the sealed and active segments and the directory, the
//! recovery point it moves, and the `flush.messages` / `flush.ms` policy.

use std::fs::File;
use std::sync::atomic::Ordering;
use std::time::Duration;

use fjord_record::now_ms;

use super::{Log, Writer};
use crate::checkpoint::sync_dir;
use crate::error::IoContext;
use crate::segment::{INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX};
use crate::{lock, Result};

impl Log {
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

    pub(super) fn flush_locked(&self, w: &mut Writer) -> Result<()> {
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
            // Below the recovery point nothing rebuilds it: it must be on disk first.
            crate::txn_index::sync(&seg)?;
        }
        self.write_active_indexes(w, true)?;
        let a = &w.active;
        a.segment.log()?.sync_data().at(a.segment.path(LOG_SUFFIX))?;
        a.index_file.sync_data().at(a.segment.path(INDEX_SUFFIX))?;
        a.time_index_file.sync_data().at(a.segment.path(TIME_INDEX_SUFFIX))?;
        crate::txn_index::sync(&a.segment)?;
        if w.dir_dirty {
            sync_dir(&self.dir)?;
            w.dir_dirty = false;
        }
        w.unflushed_messages = 0;
        self.recovery_point.fetch_max(log_end, Ordering::AcqRel);
        self.last_flush_ms.store(now_ms(), Ordering::Release);
        Ok(())
    }

    /// Time since the last flush (for metrics).
    pub fn time_since_flush(&self) -> Duration {
        Duration::from_millis((now_ms() - self.last_flush_ms.load(Ordering::Acquire)).max(0) as u64)
    }
}
