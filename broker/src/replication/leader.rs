//! The leader's rules, as pure functions: follower progress, the high watermark, and
//! who is in sync (Kafka's `Partition`/`Replica` logic, without the I/O).

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use fjord_log::Offset;

/// What the leader knows about one follower, from its fetches.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FollowerProgress {
    /// The follower's log end offset (its last fetch offset); `None` until it fetched
    /// in this leader epoch.
    pub(crate) log_end_offset: Option<Offset>,
    /// When the follower was last known to have everything the leader had.
    pub(crate) last_caught_up: Instant,
    /// The leader's log end offset at the follower's previous fetch, and when that was.
    previous_fetch: Option<(Offset, Instant)>,
}

impl FollowerProgress {
    /// A follower at the start of a leader epoch: progress unknown. Counted as caught up
    /// now, so an ISR member gets `replica.lag.time.max.ms` to show up (as Kafka does).
    pub(crate) fn new(now: Instant) -> Self {
        Self { log_end_offset: None, last_caught_up: now, previous_fetch: None }
    }

    /// A fetch from `fetch_offset` while the leader's log ends at `leader_leo`. The
    /// follower is caught up now if it asked for the log end; it was caught up at its
    /// previous fetch if it now asks for what the leader's log end was then (Kafka's
    /// `lastCaughtUpTimeMs` rule: a follower that keeps fetching as fast as the leader
    /// appends stays in sync even though it never sees the very end).
    pub(crate) fn on_fetch(&mut self, fetch_offset: Offset, leader_leo: Offset, now: Instant) {
        if fetch_offset >= leader_leo {
            self.last_caught_up = self.last_caught_up.max(now);
        } else if let Some((previous_leo, at)) = self.previous_fetch {
            if fetch_offset >= previous_leo {
                self.last_caught_up = self.last_caught_up.max(at);
            }
        }
        self.log_end_offset = Some(fetch_offset);
        self.previous_fetch = Some((leader_leo, now));
    }
}

/// The high watermark the ISR allows: the smallest log end offset among the leader
/// (`leader_leo`) and the other ISR members. `None` while an ISR member's progress is
/// unknown (it has not fetched in this epoch): the high watermark must wait for it.
pub(crate) fn high_watermark(leader_leo: Offset, isr: &[i32], followers: &HashMap<i32, FollowerProgress>) -> Option<Offset> {
    let mut hw = leader_leo;
    for replica in isr {
        if let Some(progress) = followers.get(replica) {
            hw = hw.min(progress.log_end_offset?);
        }
        // No entry: `replica` is the leader itself, or a replica no longer assigned whose
        // removal from the ISR is being written ([`unassigned_isr_members`]); the
        // controller elects only assigned replicas, so it can never lead with less.
    }
    Some(hw)
}

/// The leader's followers after the assignment became `replicas` during its term (a
/// reassignment: Kafka's controller sends LeaderAndIsr with the new replica list and the
/// same leader epoch). A replica added is tracked from an unknown position, so it joins
/// the ISR only through [`may_join_isr`] once its fetches show it has caught up; a
/// replica kept keeps its progress; a replica removed is forgotten (it leaves the ISR
/// through [`unassigned_isr_members`]). Returns whether the set changed.
///
/// ```text
/// followers {2: at 50, 3: at 40}, replicas [1, 3, 4], me 1  →  {3: at 40, 4: unknown}
/// ```
pub(crate) fn follow_assignment(followers: &mut HashMap<i32, FollowerProgress>, me: i32, replicas: &[i32], now: Instant) -> bool {
    let before = followers.len();
    followers.retain(|r, _| replicas.contains(r));
    let mut changed = followers.len() != before;
    for &replica in replicas.iter().filter(|&&r| r != me) {
        if let Entry::Vacant(entry) = followers.entry(replica) {
            entry.insert(FollowerProgress::new(now));
            changed = true;
        }
    }
    changed
}

/// The ISR members other than the leader `me` that are no longer among `replicas`: they
/// leave the ISR at once (Kafka's controller forces removed replicas out of it).
pub(crate) fn unassigned_isr_members(me: i32, isr: &[i32], replicas: &[i32]) -> Vec<i32> {
    isr.iter().copied().filter(|&r| r != me && !replicas.contains(&r)).collect()
}

/// Whether a follower fetching from `fetch_offset` may join the ISR: it has everything
/// below the high watermark, and everything of the leader's previous epochs (Kafka's
/// rule, so a member of the ISR can always become a leader without losing committed data).
pub(crate) fn may_join_isr(fetch_offset: Offset, high_watermark: Offset, epoch_start_offset: Offset) -> bool {
    fetch_offset >= high_watermark && fetch_offset >= epoch_start_offset
}

/// Whether an ISR member fetching from `fetch_offset` must leave the ISR at once: its
/// log ends below the high watermark, so it lacks records counted as committed (it cut
/// its log short: a repair of a damaged copy, or an unclean restart that lost unflushed
/// data). Elected now, it would lose them; waiting for `replica.lag.time.max.ms` leaves
/// that window open, and a follower that catches up fast would never leave at all.
/// It joins again through [`may_join_isr`] once it has them.
pub(crate) fn lost_committed(fetch_offset: Offset, high_watermark: Offset) -> bool {
    fetch_offset < high_watermark
}

/// The ISR members other than the leader `me` that have not been caught up for more
/// than `lag` (`replica.lag.time.max.ms`).
pub(crate) fn out_of_sync(
    me: i32,
    isr: &[i32],
    followers: &HashMap<i32, FollowerProgress>,
    lag: Duration,
    now: Instant,
) -> Vec<i32> {
    isr.iter()
        .copied()
        .filter(|&r| r != me)
        .filter(|r| followers.get(r).is_some_and(|p| now.saturating_duration_since(p.last_caught_up) > lag))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    #[test]
    fn high_watermark_is_the_smallest_isr_log_end_and_waits_for_unknown_members() {
        let t = Instant::now();
        let mut followers = HashMap::from([(2, FollowerProgress::new(t)), (3, FollowerProgress::new(t))]);
        assert_eq!(high_watermark(100, &[1], &followers), Some(100), "sole replica commits its log end");
        assert_eq!(high_watermark(100, &[1, 2], &followers), None, "member 2 has not fetched yet");
        followers.get_mut(&2).unwrap().on_fetch(60, 100, t);
        assert_eq!(high_watermark(100, &[1, 2], &followers), Some(60));
        // 3 is not in the ISR: its progress does not hold the high watermark back.
        assert_eq!(high_watermark(100, &[1, 2], &followers), Some(60));
        followers.get_mut(&3).unwrap().on_fetch(10, 100, t);
        assert_eq!(high_watermark(100, &[1, 2, 3], &followers), Some(10));
    }

    #[test]
    fn a_follower_is_caught_up_when_it_reaches_the_log_end_of_its_previous_fetch() {
        let t = Instant::now();
        let mut p = FollowerProgress::new(t);
        p.on_fetch(0, 50, at(t, 100)); // behind, no previous fetch
        assert_eq!(p.last_caught_up, t);
        p.on_fetch(50, 80, at(t, 200)); // reached the log end of its previous fetch
        assert_eq!(p.last_caught_up, at(t, 100));
        p.on_fetch(80, 80, at(t, 300)); // at the log end
        assert_eq!(p.last_caught_up, at(t, 300));
        p.on_fetch(70, 200, at(t, 400)); // went back (truncated): not caught up
        assert_eq!(p.last_caught_up, at(t, 300));
    }

    #[test]
    fn a_reassignment_within_the_term_adds_and_drops_followers() {
        let t = Instant::now();
        let mut followers = HashMap::from([(2, FollowerProgress::new(t)), (3, FollowerProgress::new(t))]);
        followers.get_mut(&2).unwrap().on_fetch(50, 50, t);
        followers.get_mut(&3).unwrap().on_fetch(40, 50, t);
        assert!(!follow_assignment(&mut followers, 1, &[1, 2, 3], at(t, 10)), "same replicas: nothing changes");
        // {1, 2, 3} -> {1, 2, 3, 4}: 4 is tracked, from an unknown position.
        assert!(follow_assignment(&mut followers, 1, &[1, 2, 3, 4], at(t, 10)));
        assert_eq!(followers[&4].log_end_offset, None);
        assert_eq!(followers[&2].log_end_offset, Some(50), "a kept follower keeps its progress");
        assert_eq!(high_watermark(50, &[1, 2, 3, 4], &followers), None, "an unknown ISR member holds the high watermark");
        assert_eq!(high_watermark(50, &[1, 2, 3], &followers), Some(40), "4 is not in the ISR yet");
        followers.get_mut(&4).unwrap().on_fetch(40, 50, at(t, 20));
        assert!(may_join_isr(40, 40, 0), "4 reached the high watermark: it may join");
        // -> {1, 3, 4}: 2 is forgotten and must leave the ISR.
        assert!(follow_assignment(&mut followers, 1, &[1, 3, 4], at(t, 30)));
        assert_eq!(followers.keys().copied().collect::<std::collections::BTreeSet<_>>(), [3, 4].into());
        assert_eq!(unassigned_isr_members(1, &[1, 2, 3], &[1, 3, 4]), vec![2]);
        assert_eq!(unassigned_isr_members(1, &[1, 3], &[1, 3, 4]), Vec::<i32>::new());
        assert_eq!(unassigned_isr_members(1, &[1, 3], &[3, 4]), Vec::<i32>::new(), "the leader never proposes itself out");
    }

    #[test]
    fn lagging_followers_leave_and_caught_up_ones_join() {
        let t = Instant::now();
        let mut followers = HashMap::from([(2, FollowerProgress::new(t)), (3, FollowerProgress::new(t))]);
        let lag = Duration::from_millis(1_000);
        assert!(out_of_sync(1, &[1, 2, 3], &followers, lag, at(t, 1_000)).is_empty());
        followers.get_mut(&3).unwrap().on_fetch(10, 10, at(t, 900));
        assert_eq!(out_of_sync(1, &[1, 2, 3], &followers, lag, at(t, 1_001)), vec![2]);
        assert!(out_of_sync(1, &[1, 3], &followers, lag, at(t, 1_001)).is_empty(), "only ISR members leave");
        assert!(lost_committed(89, 90) && !lost_committed(90, 90) && !lost_committed(95, 90));
        assert!(may_join_isr(90, 90, 80));
        assert!(!may_join_isr(89, 90, 80), "below the high watermark");
        assert!(!may_join_isr(90, 90, 95), "misses records of an earlier epoch");
    }
}
