//! The persisted cleaner state of a log: its first dirty offset and the tombstone
//! ages, in `cleaner-offset-checkpoint`.

use std::fs::{self, File};
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use fjord_record::Offset;

use super::{CLEANER_CHECKPOINT, MAX_HORIZONS};
use crate::checkpoint::sync_dir;
use crate::error::IoContext;
use crate::Result;

/// The persisted cleaner state of one log (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct CleanerState {
    pub(crate) first_dirty: Offset,
    /// Tombstones below this offset were first cleaned longer than
    /// `delete.retention.ms` ago.
    pub(super) expired_below: Offset,
    /// `(end, ms)`: offsets from the previous end up to `end` (exclusive) were first
    /// cleaned at `ms`. Sorted by `end`.
    pub(super) horizons: Vec<(Offset, i64)>,
    /// When the oldest tombstone kept by the last pass expires.
    pub(super) tombstones_due: Option<i64>,
    /// A swap failed after its commit point: the files are only consistent again
    /// after a reopen finishes it, so this log is not cleaned until then.
    pub(super) failed: bool,
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
    pub(super) fn save(&self, dir: &Path) -> Result<()> {
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
    pub(super) fn first_cleaned_at(&self, offset: Offset) -> Option<i64> {
        if offset < self.expired_below {
            return Some(i64::MIN);
        }
        let i = self.horizons.partition_point(|(end, _)| *end <= offset);
        self.horizons.get(i).map(|(_, ms)| *ms)
    }

    /// Forgets what lies at or above `offset`, which a truncation removed (new
    /// records will take those offsets).
    pub(super) fn truncated(&mut self, offset: Offset) {
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
    pub(super) fn record_pass(&mut self, end: Offset, now_ms: i64, delete_retention: Duration) {
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
