//! The replica manager: turns partition states from the metadata store into roles.
//!
//! The cluster view calls [`ReplicaManager::apply`] with every new state (leader,
//! leader epoch, ISR, znode version) of a partition this broker holds a replica of, in
//! order per partition, and [`ReplicaManager::remove`] when the replica goes away. The
//! broker then becomes:
//! - leader (leader == this broker, newer epoch): stops fetching the partition, records
//!   where its epoch starts, tracks each follower's log end offset from their fetches,
//!   advances the high watermark to the smallest log end offset of the ISR;
//! - follower (leader is another broker): stops leading;
//! - neither (no leader): stops both.
//!
//! Modules: `leader` (the high watermark and ISR rules, pure).

// The follower-side rules are used by the replica fetch handling (next commit).
#[allow(dead_code)]
pub(crate) mod leader;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use fjord_coord::registry::PartitionState;
use fjord_log::Log;
use fjord_record::TopicPartition;

use crate::partition::{Partition, Role};
use crate::replication::leader::FollowerProgress;

/// A state applied to a partition, kept until its log is opened.
#[derive(Debug, Clone)]
struct Applied {
    replicas: Vec<i32>,
    state: PartitionState,
    state_version: i32,
}

/// The replicas this broker holds and their roles.
pub(crate) struct ReplicaManager {
    broker_id: i32,
    partitions: RwLock<HashMap<TopicPartition, Arc<Partition>>>,
    /// States applied before the partition's log was opened; applied when it is.
    pending: Mutex<HashMap<TopicPartition, Applied>>,
}

impl ReplicaManager {
    pub(crate) fn new(broker_id: i32) -> Self {
        Self { broker_id, partitions: RwLock::new(HashMap::new()), pending: Mutex::new(HashMap::new()) }
    }

    /// This broker's id.
    pub(crate) fn broker_id(&self) -> i32 {
        self.broker_id
    }

    /// The replica of `tp` on `log`, created (with the last state applied to `tp`, if
    /// any) when this broker holds none yet.
    pub(crate) fn add_partition(&self, tp: &TopicPartition, log: Arc<Log>) -> Arc<Partition> {
        let partition = {
            let mut partitions = self.partitions.write().expect("invariant: partitions lock is never poisoned");
            if let Some(existing) = partitions.get(tp) {
                return existing.clone();
            }
            let partition = Arc::new(Partition::new(tp.clone(), log));
            partitions.insert(tp.clone(), partition.clone());
            partition
        };
        let pending = self.pending.lock().expect("invariant: pending lock is never poisoned").remove(tp);
        if let Some(applied) = pending {
            self.apply_to(&partition, &applied.replicas, &applied.state, applied.state_version);
        }
        partition
    }

    /// The replica of `tp`, if this broker holds one.
    pub(crate) fn get(&self, tp: &TopicPartition) -> Option<Arc<Partition>> {
        self.partitions.read().expect("invariant: partitions lock is never poisoned").get(tp).cloned()
    }

    /// Applies a partition state read from the store (znode version `state_version`) to
    /// this broker's replica of `tp`: become leader, follower or neither. Cheap; states
    /// older than the one applied last are ignored.
    pub(crate) fn apply(&self, tp: &TopicPartition, replicas: &[i32], state: &PartitionState, state_version: i32) {
        match self.get(tp) {
            Some(partition) => self.apply_to(&partition, replicas, state, state_version),
            None => {
                let applied = Applied { replicas: replicas.to_vec(), state: state.clone(), state_version };
                self.pending.lock().expect("invariant: pending lock is never poisoned").insert(tp.clone(), applied);
            }
        }
    }

    /// Forgets the replica of `tp` (unassigned or deleted): it stops leading and
    /// following. The log itself is the topic manager's to delete.
    pub(crate) fn remove(&self, tp: &TopicPartition) {
        self.pending.lock().expect("invariant: pending lock is never poisoned").remove(tp);
        let removed = self.partitions.write().expect("invariant: partitions lock is never poisoned").remove(tp);
        if let Some(partition) = removed {
            partition.state().role = Role::None;
            partition.notify_changed();
        }
    }

    fn apply_to(&self, partition: &Partition, replicas: &[i32], state: &PartitionState, state_version: i32) {
        let me = self.broker_id;
        let role = match state.leader {
            leader if leader == me => Role::Leader,
            leader if leader >= 0 && replicas.contains(&me) => Role::Follower { leader },
            _ => Role::None,
        };
        {
            let mut s = partition.state();
            if state.leader_epoch < s.leader_epoch
                || (state.leader_epoch == s.leader_epoch && state_version < s.state_version)
            {
                tracing::debug!(tp = %partition.tp, epoch = state.leader_epoch, state_version, "ignoring an older partition state");
                return;
            }
            let same_term = s.role == role && s.leader_epoch == state.leader_epoch;
            s.replicas = replicas.to_vec();
            s.isr = state.isr.clone();
            s.controller_epoch = state.controller_epoch;
            s.state_version = state_version;
            if !same_term {
                s.role = role;
                s.leader_epoch = state.leader_epoch;
                s.followers.clear();
                s.isr_change_in_flight = false;
                s.truncation_pending = false;
                match role {
                    Role::Leader => {
                        let now = Instant::now();
                        s.epoch_start_offset = partition.log.log_end_offset();
                        s.followers = replicas.iter().filter(|&&r| r != me).map(|&r| (r, FollowerProgress::new(now))).collect();
                    }
                    Role::Follower { .. } => s.truncation_pending = true,
                    Role::None => {}
                }
                tracing::info!(
                    tp = %partition.tp,
                    ?role,
                    leader_epoch = state.leader_epoch,
                    isr = ?state.isr,
                    log_end_offset = partition.log.log_end_offset(),
                    high_watermark = partition.log.high_watermark(),
                    "partition role"
                );
            }
        }
        // A new ISR (or leadership) may let the high watermark move; acks=all produces
        // re-check the role and the ISR either way.
        if !partition.maybe_advance_high_watermark() {
            partition.notify_changed();
        }
    }
}
