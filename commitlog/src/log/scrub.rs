//! Damage: where the segments hold a batch that is not whole and valid, and the
//! scrubber that looks for it in the background. Repairs are in `crate::repair`.

use std::path::PathBuf;

use fjord_record::Offset;

use super::Log;
use crate::segment::LOG_SUFFIX;
use crate::{lock, Result};

impl Log {
    /// Damaged segments: the `.log` file and byte position of the first batch found
    /// not whole and valid (by a read, recovery or the scrubber). Reads at and past it
    /// fail with [`crate::Error::CorruptSegment`] until [`Log::truncate_to`] cuts it away.
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
}
