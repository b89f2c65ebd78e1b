//! The leader epoch cache: which leader epoch started at which offset, persisted in
//! the partition directory's `leader-epoch-checkpoint` (`epoch start_offset` lines).
//!
//! Replication uses it to answer OffsetForLeaderEpoch: the end offset of an epoch is
//! the start offset of the next one (or the log end offset for the latest).

use std::path::{Path, PathBuf};

use fjord_record::Offset;

use crate::checkpoint;
use crate::{Error, Result};

pub(crate) const FILE_NAME: &str = "leader-epoch-checkpoint";

/// Epoch entries sorted by epoch and by start offset.
#[derive(Debug)]
pub(crate) struct EpochCache {
    path: PathBuf,
    entries: Vec<(i32, Offset)>,
}

impl EpochCache {
    /// Loads the checkpoint in `dir` (empty when missing). The flag says the file was
    /// damaged or unreadable: the caller then rebuilds the cache from the log
    /// ([`EpochCache::rebuild`]), so a bad file never stops the log from opening.
    pub(crate) fn load(dir: &Path) -> (Self, bool) {
        let path = dir.join(FILE_NAME);
        let parsed = checkpoint::read_lines(&path).and_then(|lines| {
            let bad = |line, detail| Error::MalformedCheckpoint { path: path.clone(), line, detail };
            let entries = lines
                .unwrap_or_default()
                .iter()
                .enumerate()
                .map(|(i, f)| match f.as_slice() {
                    [e, o] => {
                        Ok((e.parse().map_err(|_| bad(i + 3, "bad epoch"))?, o.parse().map_err(|_| bad(i + 3, "bad offset"))?))
                    }
                    _ => Err(bad(i + 3, "expected `epoch start_offset`")),
                })
                .collect::<Result<Vec<(i32, Offset)>>>()?;
            if !entries.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1) || entries.iter().any(|e| e.0 < 0 || e.1 < 0) {
                return Err(bad(3, "epochs and start offsets are not increasing"));
            }
            Ok(entries)
        });
        match parsed {
            Ok(entries) => (Self { path, entries }, false),
            Err(e) => {
                tracing::warn!(error = %e, "leader epoch checkpoint damaged or unreadable: rebuilding it from the log");
                (Self { path, entries: Vec::new() }, true)
            }
        }
    }

    /// Rebuilds the cache from the batch headers in the log (each batch carries the
    /// leader epoch it was appended in) and writes the checkpoint.
    pub(crate) fn rebuild(&mut self, batches: impl IntoIterator<Item = (i32, Offset)>) -> Result<()> {
        self.entries.clear();
        for (epoch, base_offset) in batches {
            if epoch >= 0 && self.latest_epoch().is_none_or(|e| epoch > e) {
                self.entries.push((epoch, base_offset));
            }
        }
        self.persist()
    }

    pub(crate) fn entries(&self) -> &[(i32, Offset)] {
        &self.entries
    }

    pub(crate) fn latest_epoch(&self) -> Option<i32> {
        self.entries.last().map(|e| e.0)
    }

    /// Records that `epoch` starts at `start_offset`, when it is newer than the latest.
    pub(crate) fn assign(&mut self, epoch: i32, start_offset: Offset) -> Result<()> {
        if epoch < 0 || self.latest_epoch().is_some_and(|e| e >= epoch) {
            return Ok(());
        }
        self.entries.push((epoch, start_offset));
        self.persist()
    }

    /// Drops epochs that start at or after `offset` (after a truncation).
    pub(crate) fn truncate_from_end(&mut self, offset: Offset) -> Result<()> {
        let before = self.entries.len();
        self.entries.retain(|e| e.1 < offset);
        if self.entries.len() != before {
            self.persist()?;
        }
        Ok(())
    }

    /// Forgets epochs that ended before the new log start offset; the one that covers
    /// it now starts there.
    pub(crate) fn truncate_from_start(&mut self, log_start: Offset) -> Result<()> {
        let covering = self.entries.iter().rposition(|e| e.1 <= log_start);
        let Some(i) = covering else { return Ok(()) };
        if i == 0 && self.entries[0].1 == log_start {
            return Ok(());
        }
        self.entries.drain(..i);
        self.entries[0].1 = log_start;
        self.persist()
    }

    /// Everything from `offset` on is gone and the log restarts there.
    pub(crate) fn clear(&mut self) -> Result<()> {
        if self.entries.is_empty() {
            return Ok(());
        }
        self.entries.clear();
        self.persist()
    }

    /// `(epoch, end offset)` for a follower asking about `epoch` (OffsetForLeaderEpoch):
    /// the largest known epoch `<= epoch` and the start of the epoch after it, or
    /// `log_end` when it is the latest. `None` when `epoch` predates every entry.
    pub(crate) fn end_offset_for(&self, epoch: i32, log_end: Offset) -> Option<(i32, Offset)> {
        let i = self.entries.iter().rposition(|e| e.0 <= epoch)?;
        let end = self.entries.get(i + 1).map_or(log_end, |next| next.1);
        Some((self.entries[i].0, end))
    }

    fn persist(&self) -> Result<()> {
        let lines: Vec<String> = self.entries.iter().map(|(e, o)| format!("{e} {o}")).collect();
        checkpoint::write_lines(&self.path, &lines)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_persist_truncate_and_answer_end_offsets() {
        let dir = tempfile::tempdir().unwrap();
        let (mut c, _) = EpochCache::load(dir.path());
        c.assign(0, 0).unwrap();
        c.assign(0, 5).unwrap(); // not newer: ignored
        c.assign(2, 10).unwrap();
        c.assign(5, 20).unwrap();
        assert!(std::fs::read_to_string(dir.path().join(FILE_NAME)).unwrap().starts_with("1\n3\n0 0\n2 10\n5 20\ncrc32c "));
        assert_eq!(c.end_offset_for(1, 30), Some((0, 10)));
        assert_eq!(c.end_offset_for(5, 30), Some((5, 30)));
        assert_eq!(c.end_offset_for(-1, 30), None);
        c.truncate_from_end(15).unwrap();
        assert_eq!(c.entries(), &[(0, 0), (2, 10)]);
        c.truncate_from_start(12).unwrap();
        assert_eq!(EpochCache::load(dir.path()).0.entries(), &[(2, 12)]);
        for garbage in [&b"garbage"[..], &[0xff, 0x00, 0x9c, 0x17], b"0\n1\n2 x\n", b"0\n2\n5 10\n2 20\n"] {
            std::fs::write(dir.path().join(FILE_NAME), garbage).unwrap();
            let (c, damaged) = EpochCache::load(dir.path());
            assert!(damaged && c.entries().is_empty(), "{garbage:?}");
        }
        let (mut c, _) = EpochCache::load(dir.path());
        c.rebuild([(1, 0), (1, 5), (3, 9), (-1, 12), (2, 14), (4, 20)]).unwrap();
        assert_eq!(EpochCache::load(dir.path()).0.entries(), &[(1, 0), (3, 9), (4, 20)]);
    }
}
