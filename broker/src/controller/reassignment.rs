//! Partition reassignment (Kafka's AlterPartitionReassignments / ListPartitionReassignments,
//! KIP-455, as its ZooKeeper controller runs it).
//!
//! # How a partition moves
//! 1. Start (the AlterPartitionReassignments handler, on the controller): the topic's
//!    assignment in `/brokers/topics/<t>` becomes the union of the target and the
//!    original replicas (target first), with `adding_replicas` and `removing_replicas`
//!    recording the difference. The added replicas see themselves assigned and start
//!    fetching; the leader tracks them within its term
//!    (`crate::replication::leader::follow_assignment`) and lets them into the ISR once
//!    caught up.
//! 2. Complete (every controller pass, [`advance`]): once every target replica is in the
//!    ISR (Kafka's rule), leadership moves to the first live target replica if the leader
//!    is not one (leader epoch + 1), the removed replicas leave the ISR (one state write),
//!    and only then the assignment becomes the target alone. A removed replica's broker
//!    then stops fetching and deletes its log, as for any replica reassigned away; no
//!    replica still assigned loses anything.
//! 3. Cancel (a null target): back to the original replicas (those not being added);
//!    the added ones are removed the same way, through step 2, so a leader that is an
//!    added replica hands over first.
//!
//! Both steps are compare-and-set writes; every pass re-reads everything, so a controller
//! that takes over mid-way finishes what its predecessor started.

use std::collections::{BTreeMap, BTreeSet};

use fjord_coord::registry::{read_json, to_json, PartitionState, TopicAssignment};
use fjord_coord::{paths, MetadataStore};

use super::{check_epoch, topic_assignments, write_state, Stop};

/// One partition's replicas, with the reassignment in progress if any (Kafka's
/// `ReplicaAssignment`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Replicas {
    /// Every replica: during a reassignment the target ones first, then the original
    /// ones not in the target.
    pub(crate) replicas: Vec<i32>,
    /// Replicas being added (in the target, not in the original).
    pub(crate) adding: Vec<i32>,
    /// Replicas being removed (in the original, not in the target).
    pub(crate) removing: Vec<i32>,
}

impl Replicas {
    /// Partition `partition` of `assignment`, if the topic has it.
    pub(crate) fn of(assignment: &TopicAssignment, partition: i32) -> Option<Replicas> {
        let key = partition.to_string();
        Some(Replicas {
            replicas: assignment.partitions.get(&key)?.clone(),
            adding: assignment.adding_replicas.get(&key).cloned().unwrap_or_default(),
            removing: assignment.removing_replicas.get(&key).cloned().unwrap_or_default(),
        })
    }

    /// Writes this into `assignment` as partition `partition` (no reassignment keys when
    /// none is in progress).
    pub(crate) fn store_in(&self, assignment: &mut TopicAssignment, partition: i32) {
        let key = partition.to_string();
        assignment.partitions.insert(key.clone(), self.replicas.clone());
        for (map, list) in [(&mut assignment.adding_replicas, &self.adding), (&mut assignment.removing_replicas, &self.removing)]
        {
            if list.is_empty() {
                map.remove(&key);
            } else {
                map.insert(key.clone(), list.clone());
            }
        }
    }

    pub(crate) fn in_progress(&self) -> bool {
        !self.adding.is_empty() || !self.removing.is_empty()
    }

    /// The replicas before the reassignment: those not being added.
    pub(crate) fn origin(&self) -> Vec<i32> {
        self.replicas.iter().copied().filter(|r| !self.adding.contains(r)).collect()
    }

    /// The replicas after the reassignment: those not being removed, in the target's order.
    pub(crate) fn target(&self) -> Vec<i32> {
        self.replicas.iter().copied().filter(|r| !self.removing.contains(r)).collect()
    }

    /// A reassignment to `target`, counted from the original replicas (a new target
    /// replaces one in progress, as in Kafka: a replica added by the old one and not in
    /// the new target is simply no longer assigned).
    ///
    /// ```text
    /// [1, 2, 3] to [2, 3, 4]  →  replicas [2, 3, 4, 1], adding [4], removing [1]
    /// ```
    pub(crate) fn reassign_to(&self, target: &[i32]) -> Replicas {
        let origin = self.origin();
        let mut replicas = target.to_vec();
        replicas.extend(origin.iter().copied().filter(|r| !target.contains(r)));
        let adding = replicas.iter().copied().filter(|r| !origin.contains(r)).collect();
        let removing = replicas.iter().copied().filter(|r| !target.contains(r)).collect();
        Replicas { replicas, adding, removing }
    }

    /// The cancellation of the reassignment in progress (`None` without one): the target
    /// becomes the original replicas, and the added ones are removed as any removed
    /// replica is ([`complete`]), so an added replica that leads hands over first.
    /// A reassignment that only removes replicas is cancelled at once (nothing was added).
    pub(crate) fn cancel(&self) -> Option<Replicas> {
        self.in_progress().then(|| Replicas {
            replicas: self.replicas.clone(),
            adding: Vec::new(),
            removing: self.adding.clone(),
        })
    }
}

/// Why a reassignment of one partition is refused (nothing is changed for it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refused {
    /// No such topic or partition.
    UnknownPartition,
    /// An empty list, a broker named twice, a broker not registered (live).
    InvalidAssignment(String),
    /// A cancel of a partition without a reassignment in progress.
    NoReassignmentInProgress,
    /// A target with another replica count than the partition's, when the request
    /// (v1, KIP-860) does not allow that.
    ReplicationFactorChange,
}

/// The partition's replicas after a request for `target` (`None`: cancel), checked as
/// Kafka's controller checks it against the live brokers `live`.
pub(crate) fn requested(
    current: Option<&Replicas>,
    target: Option<&[i32]>,
    live: &BTreeSet<i32>,
    allow_replication_factor_change: bool,
) -> Result<Replicas, Refused> {
    let current = current.ok_or(Refused::UnknownPartition)?;
    if let Some(target) = target {
        if target.is_empty() {
            return Err(Refused::InvalidAssignment("empty replica list in the reassignment".into()));
        }
        if target.iter().collect::<BTreeSet<_>>().len() != target.len() {
            return Err(Refused::InvalidAssignment(format!("duplicate replica ids in the reassignment: {target:?}")));
        }
        let unknown: Vec<i32> = target.iter().copied().filter(|b| !live.contains(b)).collect();
        if !unknown.is_empty() {
            return Err(Refused::InvalidAssignment(format!("the reassignment names brokers that are not live: {unknown:?}")));
        }
    }
    match target {
        Some(target) => {
            if !allow_replication_factor_change && target.len() != current.origin().len() {
                return Err(Refused::ReplicationFactorChange);
            }
            Ok(current.reassign_to(target))
        }
        None => current.cancel().ok_or(Refused::NoReassignmentInProgress),
    }
}

/// The state that completes a reassignment to `target`, or `None` while it must wait:
/// every target replica must be in the ISR (Kafka's rule). The leader stays if it is a
/// live target replica, else the first live target replica leads (preferred order,
/// leader epoch + 1); the ISR keeps only target replicas. May equal `state` (nothing to
/// write). The controller epoch is the caller's to set.
pub(crate) fn complete(state: &PartitionState, target: &[i32], live: &BTreeSet<i32>) -> Option<PartitionState> {
    if !target.iter().all(|r| state.isr.contains(r)) {
        return None;
    }
    let isr: Vec<i32> = state.isr.iter().copied().filter(|r| target.contains(r)).collect();
    if target.contains(&state.leader) && live.contains(&state.leader) {
        return Some(PartitionState { isr, ..state.clone() });
    }
    let leader = target.iter().copied().find(|r| live.contains(r))?;
    Some(PartitionState { leader, leader_epoch: state.leader_epoch + 1, isr, controller_epoch: state.controller_epoch })
}

/// Starts (or cancels) the reassignments asked for `topic`'s `partitions` as the
/// controller of epoch `epoch`: checks each one, then writes the accepted ones in one
/// compare-and-set of the topic's assignment. Returns each partition's outcome.
pub(crate) async fn alter(
    store: &dyn MetadataStore,
    epoch: i32,
    topic: &str,
    partitions: &[(i32, Option<Vec<i32>>)],
    allow_replication_factor_change: bool,
) -> Result<Vec<(i32, Result<(), Refused>)>, Stop> {
    check_epoch(store, epoch).await?;
    let live: BTreeSet<i32> = store.children(paths::BROKER_IDS).await?.iter().filter_map(|id| id.parse().ok()).collect();
    let path = paths::topic(topic);
    loop {
        let stored = read_json::<TopicAssignment>(store, &path).await?;
        let mut outcomes = Vec::with_capacity(partitions.len());
        let mut updated = stored.as_ref().map(|(a, _)| a.clone());
        for (partition, target) in partitions {
            let current = stored.as_ref().and_then(|(a, _)| Replicas::of(a, *partition));
            let outcome = requested(current.as_ref(), target.as_deref(), &live, allow_replication_factor_change);
            if let (Ok(next), Some(assignment)) = (&outcome, updated.as_mut()) {
                next.store_in(assignment, *partition);
                tracing::info!(
                    partition = %format!("{topic}-{partition}"), replicas = ?next.replicas, adding = ?next.adding,
                    removing = ?next.removing, cancel = target.is_none(), "partition reassignment asked for"
                );
            }
            outcomes.push((*partition, outcome.map(|_| ())));
        }
        let (Some((original, stat)), Some(updated)) = (stored, updated) else { return Ok(outcomes) };
        if updated == original {
            return Ok(outcomes);
        }
        match store.set(&path, &to_json(&updated), Some(stat.version)).await {
            Ok(_) => return Ok(outcomes),
            Err(fjord_coord::Error::BadVersion { .. }) => continue,
            Err(fjord_coord::Error::NoNode { .. }) => {
                return Ok(partitions.iter().map(|(p, _)| (*p, Err(Refused::UnknownPartition))).collect())
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Every reassignment in progress: topic → partition → its replicas.
pub(crate) async fn in_progress(store: &dyn MetadataStore) -> Result<BTreeMap<String, BTreeMap<i32, Replicas>>, Stop> {
    let mut all = BTreeMap::new();
    for (topic, assignment) in topic_assignments(store).await? {
        let keys = assignment.adding_replicas.keys().chain(assignment.removing_replicas.keys());
        let partitions: BTreeMap<i32, Replicas> = keys
            .filter_map(|p| p.parse::<i32>().ok())
            .filter_map(|p| Some((p, Replicas::of(&assignment, p)?)))
            .filter(|(_, r)| r.in_progress())
            .collect();
        if !partitions.is_empty() {
            all.insert(topic, partitions);
        }
    }
    Ok(all)
}

/// What [`complete`] said for one partition.
enum Completion {
    /// The state already fits the target: only the assignment is left to write.
    Ready,
    /// A target replica is not in the ISR yet (or none is live).
    Wait,
}

/// The controller's reassignment step, every pass: completes each reassignment whose
/// target replicas are all in the ISR ([`complete`], then the assignment becomes the
/// target). Returns whether some reassignment is still waiting.
pub(crate) async fn advance(store: &dyn MetadataStore, epoch: i32, live: &BTreeSet<i32>) -> Result<bool, Stop> {
    let mut waiting = false;
    for (topic, partitions) in in_progress(store).await? {
        for (partition, replicas) in partitions {
            let target = replicas.target();
            let what = "controller completed a reassignment: leadership and ISR on the target replicas";
            let written = write_state(store, epoch, &topic, partition, what, |state| match complete(state, &target, live) {
                None => Err(Completion::Wait),
                Some(next) if (next.leader, next.leader_epoch, &next.isr) == (state.leader, state.leader_epoch, &state.isr) => {
                    Err(Completion::Ready)
                }
                Some(next) => Ok(next),
            })
            .await?;
            match written {
                None => {} // the state node is missing: the topic is being deleted
                Some(Err(Completion::Wait)) => waiting = true,
                Some(Ok(_) | Err(Completion::Ready)) => finish(store, &topic, partition, &replicas, &target).await?,
            }
        }
    }
    Ok(waiting)
}

/// The last write of a reassignment: the partition's replicas become `target`, unless
/// its reassignment changed meanwhile (a new request: the next pass decides again).
async fn finish(store: &dyn MetadataStore, topic: &str, partition: i32, started: &Replicas, target: &[i32]) -> Result<(), Stop> {
    let path = paths::topic(topic);
    loop {
        let Some((mut assignment, stat)) = read_json::<TopicAssignment>(store, &path).await? else { return Ok(()) };
        if Replicas::of(&assignment, partition).as_ref() != Some(started) {
            return Ok(());
        }
        Replicas { replicas: target.to_vec(), ..Replicas::default() }.store_in(&mut assignment, partition);
        match store.set(&path, &to_json(&assignment), Some(stat.version)).await {
            Ok(_) => {
                tracing::info!(partition = %format!("{topic}-{partition}"), replicas = ?target, removed = ?started.removing, "partition reassignment completed");
                return Ok(());
            }
            Err(fjord_coord::Error::BadVersion { .. }) => continue,
            Err(fjord_coord::Error::NoNode { .. }) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(ids: &[i32]) -> BTreeSet<i32> {
        ids.iter().copied().collect()
    }

    fn state(leader: i32, epoch: i32, isr: &[i32]) -> PartitionState {
        PartitionState { leader, leader_epoch: epoch, isr: isr.to_vec(), controller_epoch: 1 }
    }

    fn at_rest(replicas: &[i32]) -> Replicas {
        Replicas { replicas: replicas.to_vec(), ..Replicas::default() }
    }

    #[test]
    fn a_reassignment_adds_the_target_first_and_records_what_it_adds_and_removes() {
        let moving = at_rest(&[1, 2, 3]).reassign_to(&[2, 3, 4]);
        assert_eq!(moving, Replicas { replicas: vec![2, 3, 4, 1], adding: vec![4], removing: vec![1] });
        assert_eq!((moving.origin(), moving.target()), (vec![2, 3, 1], vec![2, 3, 4]));
        // A new target replaces the one in progress, counted from the original replicas.
        let again = moving.reassign_to(&[3, 5, 1]);
        assert_eq!(again, Replicas { replicas: vec![3, 5, 1, 2], adding: vec![5], removing: vec![2] });
        // Cancel: the added replica is removed; the original ones stay.
        let cancelled = moving.cancel().unwrap();
        assert_eq!(cancelled, Replicas { replicas: vec![2, 3, 4, 1], adding: vec![], removing: vec![4] });
        assert_eq!(cancelled.target(), vec![2, 3, 1]);
        assert_eq!(at_rest(&[1, 2]).cancel(), None);
        // To the same replicas: nothing in progress.
        assert!(!at_rest(&[1, 2, 3]).reassign_to(&[1, 2, 3]).in_progress());
    }

    #[test]
    fn bad_requests_are_refused_as_kafka_refuses_them() {
        let current = at_rest(&[1, 2, 3]);
        let brokers = live(&[1, 2, 3, 4]);
        let ask = |target: Option<&[i32]>| requested(Some(&current), target, &brokers, true);
        assert!(matches!(ask(Some(&[])), Err(Refused::InvalidAssignment(_))), "empty");
        assert!(matches!(ask(Some(&[2, 2, 4])), Err(Refused::InvalidAssignment(_))), "duplicate");
        assert!(matches!(ask(Some(&[2, 3, 9])), Err(Refused::InvalidAssignment(_))), "unknown broker");
        assert_eq!(ask(None), Err(Refused::NoReassignmentInProgress));
        assert_eq!(requested(None, Some(&[2, 3, 4]), &brokers, true), Err(Refused::UnknownPartition));
        assert_eq!(requested(Some(&current), Some(&[2, 3]), &brokers, false), Err(Refused::ReplicationFactorChange));
        assert_eq!(ask(Some(&[2, 3])).unwrap().removing, vec![1], "v0 may change the replica count");
        assert_eq!(ask(Some(&[2, 3, 4])).unwrap().adding, vec![4]);
    }

    #[test]
    fn a_reassignment_completes_once_every_target_replica_is_in_sync() {
        let target = [2, 3, 4];
        let all = live(&[1, 2, 3, 4]);
        assert_eq!(complete(&state(1, 5, &[1, 2, 3]), &target, &all), None, "4 is not in the ISR yet");
        // The leader is removed: the first live target replica leads, one epoch later.
        assert_eq!(complete(&state(1, 5, &[1, 2, 3, 4]), &target, &all), Some(state(2, 6, &[2, 3, 4])));
        assert_eq!(complete(&state(1, 5, &[1, 4, 3, 2]), &target, &live(&[1, 3, 4])), Some(state(3, 6, &[4, 3, 2])));
        // A target replica leads: it stays, same epoch; the removed one leaves the ISR.
        assert_eq!(complete(&state(3, 5, &[1, 2, 3, 4]), &target, &all), Some(state(3, 5, &[2, 3, 4])));
        assert_eq!(complete(&state(3, 5, &[3, 2, 4]), &target, &all), Some(state(3, 5, &[3, 2, 4])), "nothing to write");
        // No live target replica: wait.
        assert_eq!(complete(&state(1, 5, &[1, 2, 3, 4]), &target, &live(&[1])), None);
    }
}
