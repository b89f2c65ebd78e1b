//! Where a follower truncates its log before fetching from a new leader (KIP-101 and
//! KIP-279), as a pure function of the leader's OffsetForLeaderEpoch answer.
//!
//! The follower asks the leader where its own latest epoch ended in the leader's log.
//! Everything the follower has beyond that point was written by a leader whose records
//! did not survive, so it goes. Example (the seed's case): the old leader has offsets
//! 0..100 of epoch 0 and a high watermark of 90; the new leader took over at 90 with
//! epoch 1 and wrote its own 90..100. Asked about epoch 0, the new leader answers
//! "epoch 0 ended at 90", and the old leader truncates to 90.

use fjord_log::Offset;

/// The leader's "no such epoch" answer.
pub(crate) const UNDEFINED: i64 = -1;

/// Where to truncate, and whether that is final or another round is needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Truncation {
    pub(crate) offset: Offset,
    /// false: the follower did not know the epoch the leader answered with; it truncated
    /// to where its own earlier epoch ended and must ask again about its new latest epoch.
    pub(crate) complete: bool,
}

/// `requested`: the follower's latest epoch (`None`: its epoch cache is empty).
/// `leader`: the answer (epoch, end offset), [`UNDEFINED`] when the leader knows no epoch
/// at or below the requested one. `local`: the follower's own
/// `end_offset_for_epoch(leader.0)`. `log_end`, `high_watermark`: the follower's.
pub(crate) fn truncation(
    requested: Option<i32>,
    leader: (i32, Offset),
    local: Option<(i32, Offset)>,
    log_end: Offset,
    high_watermark: Offset,
) -> Truncation {
    let (leader_epoch, leader_end) = leader;
    let done = |offset: Offset| Truncation { offset: offset.min(log_end), complete: true };
    let Some(requested) = requested else {
        // Nothing says which records are whose: keep only what was committed.
        return done(high_watermark);
    };
    if i64::from(leader_epoch) == UNDEFINED || leader_end == UNDEFINED {
        return done(high_watermark);
    }
    if leader_epoch == requested {
        return done(leader_end);
    }
    match local {
        Some((local_epoch, local_end)) if local_epoch == leader_epoch => done(local_end.min(leader_end)),
        Some((_, local_end)) => Truncation { offset: local_end.min(log_end), complete: false },
        // We hold no epoch that old: the leader's end of an earlier epoch is the bound.
        None => done(leader_end),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_old_leader_drops_what_the_new_leader_overwrote() {
        // Old leader: epoch 0 over 0..100, high watermark 90. New leader: epoch 0 until
        // 90, then epoch 1. Asked about epoch 0 it answers (0, 90).
        assert_eq!(truncation(Some(0), (0, 90), Some((0, 100)), 100, 90), Truncation { offset: 90, complete: true });
        // A follower that is behind keeps everything.
        assert_eq!(truncation(Some(0), (0, 90), Some((0, 50)), 50, 40), Truncation { offset: 50, complete: true });
    }

    #[test]
    fn an_epoch_the_follower_never_saw_takes_two_rounds() {
        // Follower epochs (0,0),(2,50), LEO 100; leader epochs (0,0),(1,40),(3,60).
        // Asked about 2, the leader answers with its largest epoch <= 2: (1, 60).
        // The follower knows no epoch 1: its largest <= 1 is 0, which ended at 50.
        let first = truncation(Some(2), (1, 60), Some((0, 50)), 100, 30);
        assert_eq!(first, Truncation { offset: 50, complete: false });
        // Now its latest epoch is 0; the leader says epoch 0 ended at 40.
        assert_eq!(truncation(Some(0), (0, 40), Some((0, 50)), 50, 30), Truncation { offset: 40, complete: true });
        // The follower's epoch 1 matches the leader's answer: the smaller end wins.
        assert_eq!(truncation(Some(2), (1, 60), Some((1, 45)), 100, 30), Truncation { offset: 45, complete: true });
    }

    #[test]
    fn unknown_epochs_fall_back_to_the_high_watermark() {
        assert_eq!(truncation(None, (3, 80), None, 100, 70), Truncation { offset: 70, complete: true });
        assert_eq!(truncation(Some(4), (-1, -1), None, 100, 70), Truncation { offset: 70, complete: true });
        assert_eq!(truncation(Some(4), (2, 80), None, 100, 70), Truncation { offset: 80, complete: true });
        assert_eq!(truncation(Some(4), (4, 150), Some((4, 100)), 100, 70), Truncation { offset: 100, complete: true });
    }
}
