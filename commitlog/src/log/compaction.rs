//! The log's side of compaction: swapping a cleaned segment in for the sealed segments
//! it replaces, under the writer lock, following the crash-safe swap protocol of
//! `crate::cleaner` (which reads the log and writes the cleaned files).

use std::fs;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::Log;
use crate::checkpoint::sync_dir;
use crate::cleaner::{self, Cleaned, SwapHook, SwapStep, CLEANED_SUFFIX, SWAP_SUFFIX};
use crate::error::IoContext;
use crate::segment::{Segment, INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX};
use crate::{lock, Error, Result};

impl Log {
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
        // The cleaned segment keeps the group's aborted transactions: the cleaner drops a
        // marker only once its transaction has no record left, and an entry whose
        // aborted records are gone is harmless.
        let mut aborted = Vec::new();
        for s in group {
            aborted.extend(crate::txn_index::read_all(s)?);
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
            let new = Arc::new(Segment::new(&dir, base, cleaned.size, cleaned.max_timestamp));
            crate::txn_index::rewrite(&new, &aborted)?;
            crate::txn_index::sync(&new)?;
            Ok(new)
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
}
