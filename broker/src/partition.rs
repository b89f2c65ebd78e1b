//! One partition replica on this broker: its log, its role in the partition (leader,
//! follower or neither, set by [`crate::replication::ReplicaManager::apply`]), and the
//! wake-ups of delayed fetches and of acks=all produces.
//!
//! # Invariants
//! - Only the leader appends with [`fjord_log::Log::append`], stamping its leader
//!   epoch; only a follower appends with `append_replicated`. Both happen under the
//!   replica state lock after checking the role, so a role change never interleaves
//!   with an append.
//! - The high watermark never goes down while this broker stays leader, and is never
//!   above the smallest log end offset of the ISR.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use fjord_log::{AppendInfo, Log, Offset};
use fjord_record::TopicPartition;
use tokio::sync::{watch, Notify};

use crate::codec::error_code;
use crate::replication::leader::{self, FollowerProgress};
use crate::replication::truncation::{truncation, Truncation};

/// What this broker is for a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Neither leader nor follower (no leader, or not assigned yet).
    None,
    /// The leader: takes produce requests and serves fetches.
    Leader,
    /// A follower replicating from `leader`.
    Follower { leader: i32 },
}

/// The replica's view of the partition state plus what the leader tracks.
#[derive(Debug)]
pub(crate) struct ReplicaState {
    pub(crate) role: Role,
    pub(crate) leader_epoch: i32,
    pub(crate) replicas: Vec<i32>,
    pub(crate) isr: Vec<i32>,
    pub(crate) controller_epoch: i32,
    /// Version of the partition state znode this state came from (the CAS token for
    /// ISR changes).
    pub(crate) state_version: i32,
    /// Leader: the log end offset when this epoch started (a follower joins the ISR
    /// only once it reached it).
    pub(crate) epoch_start_offset: Offset,
    /// Leader: each other replica's progress.
    pub(crate) followers: HashMap<i32, FollowerProgress>,
    /// Leader: the ISR being written to the store, while that write is in flight.
    /// Until the store has it, the high watermark counts the members of both (Kafka's
    /// maximal ISR, KIP-497): a follower named in the store's ISR can be elected, so
    /// nothing may count as committed that it does not have yet.
    pub(crate) isr_in_flight: Option<Vec<i32>>,
    /// Follower: the log has not yet been truncated against the leader's epochs.
    pub(crate) truncation_pending: bool,
}

impl ReplicaState {
    /// The ISR the high watermark must wait for: the adopted one plus any member of the
    /// one being written (an expansion counts at once, a shrink only once written).
    pub(crate) fn maximal_isr(&self) -> Vec<i32> {
        let mut isr = self.isr.clone();
        for &replica in self.isr_in_flight.iter().flatten() {
            if !isr.contains(&replica) {
                isr.push(replica);
            }
        }
        isr
    }
}

/// Why a produce or fetch was refused, as a Kafka error code.
pub(crate) type Refusal = i16;

/// One partition this broker holds a replica of.
#[derive(Debug)]
pub(crate) struct Partition {
    pub(crate) tp: TopicPartition,
    pub(crate) log: Arc<Log>,
    /// Delayed fetches waiting for an append. Weak, so a fetch that timed out leaves
    /// nothing alive behind; dead entries are pruned as the list grows.
    waiters: Mutex<Vec<Weak<Notify>>>,
    state: Mutex<ReplicaState>,
    /// Bumped whenever the high watermark, the ISR or the role changes; acks=all
    /// produces wait on it instead of polling.
    changed: watch::Sender<u64>,
}

impl Partition {
    /// A replica with no role yet: it refuses produce and fetch until a state is applied.
    pub(crate) fn new(tp: TopicPartition, log: Arc<Log>) -> Self {
        let state = ReplicaState {
            role: Role::None,
            leader_epoch: -1,
            replicas: Vec::new(),
            isr: Vec::new(),
            controller_epoch: 0,
            state_version: -1,
            epoch_start_offset: 0,
            followers: HashMap::new(),
            isr_in_flight: None,
            truncation_pending: false,
        };
        Self { tp, log, waiters: Mutex::new(Vec::new()), state: Mutex::new(state), changed: watch::Sender::new(0) }
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, ReplicaState> {
        self.state.lock().expect("invariant: replica state lock is never poisoned")
    }

    /// Registers a delayed fetch; `waiter` is notified (once) at the next append or
    /// high watermark move.
    pub(crate) fn register_waiter(&self, waiter: &Arc<Notify>) {
        let mut waiters = self.waiters.lock().expect("invariant: waiter lock is never poisoned");
        if waiters.len() >= 64 {
            waiters.retain(|w| w.strong_count() > 0);
        }
        waiters.push(Arc::downgrade(waiter));
    }

    /// Wakes every delayed fetch registered on this partition.
    pub(crate) fn notify_appended(&self) {
        let waiters = std::mem::take(&mut *self.waiters.lock().expect("invariant: waiter lock is never poisoned"));
        for waiter in waiters.iter().filter_map(Weak::upgrade) {
            // notify_one stores a permit, so a fetch between registering and awaiting
            // does not miss this append.
            waiter.notify_one();
        }
    }

    /// Wakes acks=all produces (and delayed fetches) after a change of the high
    /// watermark, the ISR or the role.
    pub(crate) fn notify_changed(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
        self.notify_appended();
    }

    /// Checks a fetch's `current_leader_epoch` (-1: not given) against ours.
    pub(crate) fn check_leader_epoch(state: &ReplicaState, current_leader_epoch: i32) -> Result<(), Refusal> {
        match current_leader_epoch {
            -1 => Ok(()),
            e if e < state.leader_epoch => Err(error_code::FENCED_LEADER_EPOCH),
            e if e > state.leader_epoch => Err(error_code::UNKNOWN_LEADER_EPOCH),
            _ => Ok(()),
        }
    }

    /// Checks that this broker leads the partition (for produce, consumer fetches,
    /// ListOffsets and OffsetForLeaderEpoch), and the client's view of the epoch.
    pub(crate) fn check_leader(&self, current_leader_epoch: i32) -> Result<i32, Refusal> {
        let state = self.state();
        if state.role != Role::Leader {
            return Err(error_code::NOT_LEADER_OR_FOLLOWER);
        }
        Self::check_leader_epoch(&state, current_leader_epoch)?;
        Ok(state.leader_epoch)
    }

    /// Leader: the offset ListOffsets answers for "latest", the high watermark. A new
    /// leader learns the high watermark from its followers' fetches, so until it reaches
    /// the log end at the start of this epoch it may be below records already committed:
    /// then OFFSET_NOT_AVAILABLE (retriable), as Kafka answers, instead of an offset that
    /// would send a consumer back over committed records. With `read_committed`, the
    /// last stable offset (never above the high watermark).
    pub(crate) fn latest_offset(&self, read_committed: bool) -> Result<Offset, Refusal> {
        let state = self.state();
        let high_watermark = self.log.high_watermark();
        if high_watermark < state.epoch_start_offset {
            return Err(error_code::OFFSET_NOT_AVAILABLE);
        }
        Ok(if read_committed { self.log.last_stable_offset() } else { high_watermark })
    }

    /// Leader append of a produce request; also returns the leader epoch it was
    /// appended in. With acks=all, refuses with NOT_ENOUGH_REPLICAS (nothing appended)
    /// when the ISR is smaller than `min_isr`. `visit` sees every record as the log's
    /// validation walks it (see [`fjord_log::Log::append_visiting`]); `verification` says
    /// how a transactional batch that opens its producer's transaction is taken.
    pub(crate) fn append_as_leader(
        &self,
        records: &[u8],
        acks_all: bool,
        min_isr: usize,
        visit: Option<fjord_log::RecordVisitor<'_>>,
        verification: fjord_log::TxnVerification,
    ) -> Result<Result<(AppendInfo, i32), fjord_log::Error>, Refusal> {
        let appended = {
            let state = self.state();
            if state.role != Role::Leader {
                return Err(error_code::NOT_LEADER_OR_FOLLOWER);
            }
            if acks_all && state.isr.len() < min_isr {
                return Err(error_code::NOT_ENOUGH_REPLICAS);
            }
            // The topic's compression.type and message.timestamp.type, applied on the
            // leader only: followers copy the leader's bytes.
            let mut batches =
                crate::topic_config::append::apply(records, &self.log.config(), fjord_record::now_ms()).into_owned();
            self.log.append_visiting(&mut batches, state.leader_epoch, visit, verification).map(|info| (info, state.leader_epoch))
        };
        if appended.is_ok() {
            // A sole in-sync replica commits at once; otherwise followers will fetch it.
            if !self.maybe_advance_high_watermark() {
                self.notify_appended();
            }
        }
        Ok(appended)
    }

    /// Leader append of a transaction marker (WriteTxnMarkers) ending the transaction of
    /// `producer_id`; also returns the leader epoch it was appended in. The log checks the
    /// producer and coordinator epochs (see [`fjord_log::Log::append_marker`]). With
    /// `min_isr` set (Kafka writes markers with acks=all), refuses NOT_ENOUGH_REPLICAS when
    /// the ISR is smaller.
    pub(crate) fn append_marker_as_leader(
        &self,
        producer_id: i64,
        producer_epoch: i16,
        coordinator_epoch: i32,
        commit: bool,
        min_isr: usize,
    ) -> Result<Result<(AppendInfo, i32), fjord_log::Error>, Refusal> {
        let appended = {
            let state = self.state();
            if state.role != Role::Leader {
                return Err(error_code::NOT_LEADER_OR_FOLLOWER);
            }
            if state.isr.len() < min_isr {
                return Err(error_code::NOT_ENOUGH_REPLICAS);
            }
            self.log
                .append_marker(producer_id, producer_epoch, coordinator_epoch, commit, state.leader_epoch)
                .map(|info| (info, state.leader_epoch))
        };
        if appended.is_ok() && !self.maybe_advance_high_watermark() {
            // The last stable offset may have moved: read_committed fetches re-read.
            self.notify_appended();
        }
        Ok(appended)
    }

    /// Leader: recomputes the high watermark from the ISR's log end offsets; wakes
    /// waiters when it moved. Returns whether it moved.
    pub(crate) fn maybe_advance_high_watermark(&self) -> bool {
        let moved = {
            let state = self.state();
            if state.role != Role::Leader {
                return false;
            }
            let current = self.log.high_watermark();
            let isr = state.maximal_isr();
            match leader::high_watermark(self.log.log_end_offset(), &isr, &state.followers) {
                Some(hw) if hw > current => {
                    self.log.set_high_watermark(hw);
                    true
                }
                _ => false,
            }
        };
        if moved {
            self.notify_changed();
        }
        moved
    }

    /// Waits until the high watermark passes `last_offset`, appended in `leader_epoch`
    /// (the batch is on every ISR member), then checks the ISR still has `min_isr`
    /// members. Wakes on changes only. A new epoch, even led here again, fails the wait:
    /// the batch may have been truncated meanwhile.
    pub(crate) async fn wait_for_replication(
        &self,
        leader_epoch: i32,
        last_offset: Offset,
        min_isr: usize,
        timeout: Duration,
    ) -> Result<(), Refusal> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut changes = self.changed.subscribe();
        loop {
            {
                let state = self.state();
                if state.role != Role::Leader || state.leader_epoch != leader_epoch {
                    return Err(error_code::NOT_LEADER_OR_FOLLOWER);
                }
                if self.log.high_watermark() > last_offset {
                    return if state.isr.len() < min_isr { Err(error_code::NOT_ENOUGH_REPLICAS_AFTER_APPEND) } else { Ok(()) };
                }
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                // The sender lives as long as the partition; a closed channel cannot happen
                // while we hold `self`, but answer rather than spin if it did.
                Ok(Err(_)) | Err(_) => return Err(error_code::REQUEST_TIMED_OUT),
            }
        }
    }

    /// Leader: records a follower's fetch from `fetch_offset` (its log end offset).
    /// Returns the ISR to propose when the follower just caught up and is not in it, or
    /// when it is in it but fetches below the high watermark ([`leader::lost_committed`]).
    pub(crate) fn record_follower_fetch(&self, replica: i32, fetch_offset: Offset, now: Instant) -> Option<Vec<i32>> {
        let expand = {
            let mut state = self.state();
            if state.role != Role::Leader {
                return None;
            }
            let leo = self.log.log_end_offset();
            let progress = state.followers.get_mut(&replica)?;
            progress.on_fetch(fetch_offset, leo, now);
            let hw = self.log.high_watermark();
            if state.isr.contains(&replica) && leader::lost_committed(fetch_offset, hw) {
                if state.isr_in_flight.is_some() {
                    // Proposed again at its next fetch, once this write is done.
                    return None;
                }
                tracing::warn!(
                    tp = %self.tp, replica, fetch_offset, high_watermark = hw,
                    "an in-sync follower fetches below the high watermark (it cut its log short): it leaves the ISR until it has the committed records again"
                );
                return Some(state.isr.iter().copied().filter(|&r| r != replica).collect());
            }
            let caught_up = leader::may_join_isr(fetch_offset, hw, state.epoch_start_offset);
            (caught_up && !state.isr.contains(&replica) && state.isr_in_flight.is_none()).then(|| {
                let mut isr = state.isr.clone();
                isr.push(replica);
                isr
            })
        };
        self.maybe_advance_high_watermark();
        expand
    }

    /// Leader: the ISR without the followers that have not caught up within `lag` and
    /// without the members no longer assigned (a reassignment dropped them), when that
    /// differs from the current ISR and no change is in flight.
    pub(crate) fn shrunk_isr(&self, me: i32, lag: Duration, now: Instant) -> Option<Vec<i32>> {
        let state = self.state();
        if state.role != Role::Leader || state.isr_in_flight.is_some() {
            return None;
        }
        let mut out = leader::out_of_sync(me, &state.isr, &state.followers, lag, now);
        out.extend(leader::unassigned_isr_members(me, &state.isr, &state.replicas));
        (!out.is_empty()).then(|| state.isr.iter().copied().filter(|r| !out.contains(r)).collect())
    }

    /// Follower: what the fetcher of `leader` should do next for this replica.
    pub(crate) fn next_follower_step(&self, leader: i32) -> FollowerStep {
        let state = self.state();
        if state.role != (Role::Follower { leader }) {
            return FollowerStep::Idle;
        }
        let epoch = state.leader_epoch;
        if state.truncation_pending {
            let latest_epoch = self.log.leader_epochs().last().map(|&(e, _)| e);
            FollowerStep::Truncate { leader_epoch: epoch, latest_epoch }
        } else {
            FollowerStep::Fetch {
                leader_epoch: epoch,
                fetch_offset: self.log.log_end_offset(),
                log_start_offset: self.log.log_start_offset(),
            }
        }
    }

    /// Follower: truncates after the leader's OffsetForLeaderEpoch answer, unless the
    /// role changed since the question was asked (then nothing happens).
    pub(crate) fn truncate_as_follower(
        &self,
        leader: i32,
        leader_epoch: i32,
        asked: Option<i32>,
        answer: (i32, Offset),
    ) -> Result<Option<Truncation>, fjord_log::Error> {
        let mut state = self.state();
        if state.role != (Role::Follower { leader }) || state.leader_epoch != leader_epoch || !state.truncation_pending {
            return Ok(None);
        }
        let local = self.log.end_offset_for_epoch(answer.0);
        let t = truncation(asked, answer, local, self.log.log_end_offset(), self.log.high_watermark());
        let before = self.log.log_end_offset();
        self.log.truncate_to(t.offset)?;
        state.truncation_pending = !t.complete;
        tracing::info!(tp = %self.tp, leader, leader_epoch, ?asked, ?answer, log_end_before = before, truncated_to = t.offset, complete = t.complete, "follower truncated");
        Ok(Some(t))
    }

    /// Follower: appends what the leader sent for a fetch from `fetch_offset` and takes
    /// the leader's high watermark (never above our own log end, never backwards).
    /// Returns false when the role or the log changed since the fetch was sent (the
    /// answer is stale and dropped).
    pub(crate) fn append_as_follower(
        &self,
        leader: i32,
        leader_epoch: i32,
        fetch_offset: Offset,
        records: &[u8],
        leader_high_watermark: Offset,
    ) -> Result<bool, fjord_log::Error> {
        let state = self.state();
        if state.role != (Role::Follower { leader })
            || state.leader_epoch != leader_epoch
            || state.truncation_pending
            || self.log.log_end_offset() != fetch_offset
        {
            return Ok(false);
        }
        if !records.is_empty() {
            self.log.append_replicated(records)?;
        }
        if leader_high_watermark > self.log.high_watermark() {
            self.log.set_high_watermark(leader_high_watermark);
        }
        Ok(true)
    }

    /// Follower: when this replica's log is damaged, truncates it below the damage
    /// (moving the damaged bytes aside, see `fjord_log::Log::repair`) so that fetching
    /// from the log end brings the records again from the leader. Only while following
    /// `leader`: the state lock is held from the check to the truncation, so the replica
    /// cannot become leader with a log cut short by this. The caller has scrubbed the
    /// log (slow, so outside the lock). `Ok(None)` when there is nothing to do.
    pub(crate) fn heal_as_follower(&self, leader: i32, now_ms: u64) -> Result<Option<fjord_log::Repair>, fjord_log::Error> {
        let state = self.state();
        if state.role != (Role::Follower { leader }) || self.log.damage().is_empty() {
            return Ok(None);
        }
        let repair = self.log.repair_known_damage(now_ms)?;
        drop(state);
        if let Some(r) = &repair {
            tracing::warn!(
                tp = %self.tp, leader, segment = %r.segment.display(), position = r.position, reason = %r.reason,
                truncated_to = r.truncated_to, moved_aside_to = %r.side_dir.display(),
                "follower's log was damaged: truncated below the damage (the damaged bytes are kept aside); fetching the rest again from the leader"
            );
        }
        Ok(repair)
    }

    /// Follower: moves the log start up to the leader's (from its fetch response), as
    /// Kafka's follower does, so that records the leader deleted (DeleteRecords,
    /// retention) are gone here too and a new leader does not serve them again. Never
    /// past this log's end (the rest arrives with later fetches) and never backwards.
    /// Returns whether the start moved (then the caller checkpoints it).
    pub(crate) fn follow_log_start(&self, leader: i32, leader_log_start: Offset) -> Result<bool, fjord_log::Error> {
        let state = self.state();
        if state.role != (Role::Follower { leader }) {
            return Ok(false);
        }
        let target = leader_log_start.min(self.log.log_end_offset());
        if target <= self.log.log_start_offset() {
            return Ok(false);
        }
        self.log.delete_records_before(target)?;
        drop(state);
        tracing::debug!(tp = %self.tp, leader, log_start = target, "follower moved its log start up to the leader's");
        Ok(true)
    }

    /// Follower: the leader no longer has our fetch offset. Below its log start, the
    /// log restarts there (retention went past us); otherwise our log is ahead of the
    /// leader's and is truncated against its epochs again.
    pub(crate) fn follower_out_of_range(
        &self,
        leader: i32,
        leader_epoch: i32,
        fetch_offset: Offset,
        leader_log_start: Offset,
    ) -> Result<(), fjord_log::Error> {
        let mut state = self.state();
        if state.role != (Role::Follower { leader })
            || state.leader_epoch != leader_epoch
            || self.log.log_end_offset() != fetch_offset
        {
            return Ok(());
        }
        if fetch_offset < leader_log_start {
            tracing::warn!(tp = %self.tp, fetch_offset, leader_log_start, "follower is behind the leader's log start; restarting the log there");
            self.log.truncate_fully_and_start_at(leader_log_start)?;
        } else {
            tracing::warn!(tp = %self.tp, fetch_offset, "follower's log end is beyond the leader's; truncating again");
            state.truncation_pending = true;
        }
        Ok(())
    }
}

/// The next thing a follower's fetcher does for one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FollowerStep {
    /// Not following this leader (any more).
    Idle,
    /// Ask the leader where `latest_epoch` ended (OffsetForLeaderEpoch), then truncate.
    Truncate { leader_epoch: i32, latest_epoch: Option<i32> },
    /// Fetch from the log end.
    Fetch { leader_epoch: i32, fetch_offset: Offset, log_start_offset: Offset },
}
