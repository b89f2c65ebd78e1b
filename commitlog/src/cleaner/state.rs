//! The persisted cleaner state of a log: its first dirty offset and the tombstone
//! ages, in `cleaner-offset-checkpoint`.

use std::fs;
use std::path::Path;
use std::time::Duration;

use fjord_record::Offset;

use super::{CLEANER_CHECKPOINT, MAX_HORIZONS};
use crate::checkpoint;
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
    /// and tombstones only live longer. The file is a checksummed checkpoint
    /// ([`crate::checkpoint`]: version 1, one `first_dirty expired_below due` line, then
    /// one `end ms` line per age range); the version 0 layout written before the
    /// checksum is still read. The checksum matters because a flipped digit in
    /// `expired_below` still parses and would delete tombstones before
    /// `delete.retention.ms`: a damaged file must cost only work, never records.
    pub(crate) fn load(dir: &Path) -> Self {
        let path = dir.join(CLEANER_CHECKPOINT);
        let Ok(text) = fs::read(&path) else { return Self::default() };
        let parsed = if text.starts_with(b"0\n") {
            std::str::from_utf8(&text).ok().and_then(Self::parse_version_0)
        } else {
            match checkpoint::read_lines(&path) {
                Ok(Some(lines)) => Self::parse_lines(&lines),
                Ok(None) => return Self::default(),
                Err(e) => {
                    tracing::warn!(error = %e, "ignoring a damaged cleaner checkpoint: the next clean redoes the log");
                    return Self::default();
                }
            }
        };
        parsed.unwrap_or_else(|| {
            tracing::warn!(path = %path.display(), "ignoring a malformed cleaner checkpoint: the next clean redoes the log");
            Self::default()
        })
    }

    /// The checksummed layout's entry lines.
    fn parse_lines(lines: &[Vec<String>]) -> Option<Self> {
        let (head, ranges) = lines.split_first()?;
        let [first_dirty, expired_below, due] = head.as_slice() else { return None };
        let tombstones_due = match due.as_str() {
            "-" => None,
            t => Some(t.parse().ok()?),
        };
        let mut horizons = Vec::with_capacity(ranges.len().min(MAX_HORIZONS));
        for range in ranges {
            let [end, ms] = range.as_slice() else { return None };
            horizons.push((end.parse().ok()?, ms.parse().ok()?));
        }
        Some(Self {
            first_dirty: first_dirty.parse().ok()?,
            expired_below: expired_below.parse().ok()?,
            horizons,
            tombstones_due,
            failed: false,
        })
    }

    /// The layout before the checksum: `0`, first dirty, expired below, due (`-` for
    /// none), the range count, then `end ms` lines.
    fn parse_version_0(text: &str) -> Option<Self> {
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
    }

    /// Writes the checkpoint atomically (temp file, fsync, rename, fsync dir), checksummed.
    pub(super) fn save(&self, dir: &Path) -> Result<()> {
        let due = self.tombstones_due.map_or("-".to_owned(), |t| t.to_string());
        let mut lines = vec![format!("{} {} {due}", self.first_dirty, self.expired_below)];
        lines.extend(self.horizons.iter().map(|(end, ms)| format!("{end} {ms}")));
        checkpoint::write_lines(&dir.join(CLEANER_CHECKPOINT), &lines)
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
