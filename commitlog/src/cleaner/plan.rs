//! What a clean covers: where the cleanable range ends, how dirty a log is, and
//! which sealed segments are rewritten together.

use std::sync::Arc;
use std::time::Duration;

use fjord_record::Offset;

use crate::segment::Segment;
use crate::Log;

pub(super) type View = std::collections::BTreeMap<Offset, Arc<Segment>>;

/// Where cleaning must stop: the base of the active segment, of the segment holding
/// the last stable offset (records above the high watermark may still be truncated
/// away, and records of undecided transactions may still be aborted: neither may
/// shadow committed ones), or of the first segment whose largest timestamp is younger
/// than `min.compaction.lag.ms`, whichever is lowest.
pub(super) fn cleanable_end(view: &View, now_ms: i64, lag: Duration, high_watermark: Offset) -> Offset {
    let active = *view.keys().next_back().expect("invariant: at least one segment");
    let by_hw = view.range(..=high_watermark).next_back().map_or(active, |(b, _)| *b);
    let end = active.min(by_hw);
    let horizon = now_ms.saturating_sub(lag.as_millis() as i64);
    view.range(..end).find(|(_, s)| !lag.is_zero() && s.max_timestamp() > horizon).map_or(end, |(b, _)| *b)
}

impl Log {
    /// `max.compaction.lag.ms`: whether dirty records below the cleanable end have
    /// waited longer than that, which makes the log due whatever its dirty ratio. Judged
    /// by the largest timestamp of the first dirty segment, so every record of it is
    /// that old (Kafka looks at the segment's first batch instead; this may clean one
    /// segment's time span later, never earlier).
    pub(super) fn compaction_overdue(&self, now_ms: i64) -> bool {
        let config = self.config();
        let Some(lag) = config.max_compaction_lag else { return false };
        let first_dirty = crate::lock::mutex(&self.cleaner).first_dirty;
        let view = self.view();
        let end = cleanable_end(&view, now_ms, config.min_compaction_lag, self.last_stable_offset());
        let start = view.range(..=first_dirty).next_back().map_or(first_dirty, |(b, _)| *b);
        let horizon = now_ms.saturating_sub(i64::try_from(lag.as_millis()).unwrap_or(i64::MAX));
        view.range(start..end).next().is_some_and(|(_, s)| s.max_timestamp() <= horizon)
    }

    /// Dirty bytes / cleanable bytes, for a log with something dirty to clean.
    pub(super) fn cleanable_ratio(&self, now_ms: i64) -> Option<f64> {
        let first_dirty = crate::lock::mutex(&self.cleaner).first_dirty;
        self.cleanable_ratio_with(first_dirty, now_ms)
    }

    pub(super) fn cleanable_ratio_with(&self, first_dirty: Offset, now_ms: i64) -> Option<f64> {
        let view = self.view();
        let end = cleanable_end(&view, now_ms, self.config().min_compaction_lag, self.last_stable_offset());
        let (mut clean, mut dirty) = (0u64, 0u64);
        let bases: Vec<Offset> = view.range(..end).map(|(b, _)| *b).collect();
        for (i, base) in bases.iter().enumerate() {
            let next = bases.get(i + 1).copied().unwrap_or(end);
            let size = view[base].size();
            if next <= first_dirty {
                clean += size;
            } else {
                dirty += size;
            }
        }
        (dirty > 0).then(|| dirty as f64 / (clean + dirty) as f64)
    }
}

/// Consecutive sealed segments below `map_end`, grouped so that each group's
/// source bytes fit `segment.bytes` and its offsets fit a relative index.
pub(super) fn group_segments(view: &View, map_end: Offset, segment_bytes: u64) -> Vec<Vec<Arc<Segment>>> {
    let active = *view.keys().next_back().expect("invariant: at least one segment");
    let bases: Vec<Offset> = view.keys().copied().collect();
    let mut groups: Vec<Vec<Arc<Segment>>> = Vec::new();
    let mut size = 0u64;
    for (i, (&base, seg)) in view.range(..map_end.min(active)).enumerate() {
        let next_base = bases[i + 1];
        let fits = groups
            .last()
            .is_some_and(|g| size + seg.size() <= segment_bytes && next_base - g[0].base_offset <= i64::from(i32::MAX));
        if fits {
            size += seg.size();
            groups.last_mut().expect("checked above").push(seg.clone());
        } else {
            debug_assert!(next_base - base <= i64::from(i32::MAX), "a segment's offsets fit its index");
            size = seg.size();
            groups.push(vec![seg.clone()]);
        }
    }
    groups
}
