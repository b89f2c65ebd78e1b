//! Committed offsets expire, as Kafka's `offsets.retention.minutes` (KIP-211, KIP-496):
//! a group that has had no members for the retention period loses its offsets, and
//! with them leaves the registry; offsets committed outside any membership (a tool, a
//! standalone consumer) go a retention period after their commit; a consumer group with
//! members keeps the offsets of every topic a member subscribes to, and loses the others
//! a retention period after their commit. An offset committed within the period never
//! goes, and a partition with a transactional offset pending keeps its offset.
//!
//! When a group emptied is in its registry node's data ([`Membership`]), written when
//! the group gains its first member and when its last one goes, so it survives the
//! coordinator: a new coordinator taking a group whose last record says it had members
//! counts it empty from then on, as Kafka's does once the members' sessions end there.
//!
//! The sweep runs every `offsets.retention.check.interval.ms` in a task of its own, over
//! every group of the registry this broker holds or nobody does. A group not in memory is
//! only read unless something of it is due; then it is taken (claimed, loaded) and
//! changed under its lock, as a request would, so a commit racing the sweep is never
//! lost. An emptied group leaves memory at the next idle eviction, which gives up its
//! registry nodes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fjord_coord::paths;
use fjord_record::now_ms;
use kafka_protocol::error::ResponseError;
use serde::{Deserialize, Serialize};

use super::offsets::CommittedOffset;
use super::registry::{group_id_of, group_root, set_or_create};
use super::state::Group;
use super::{Held, Inner, IDLE_EVICTION};

/// What the registry keeps of a group's membership, in `/consumers/<group>`'s data:
/// whether it had members, and since when (ms since the epoch). A group without it (one
/// that only ever had offsets committed, or was last changed by an older Fjord) expires
/// by its commit times alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Membership {
    pub(super) members: bool,
    pub(super) since_ms: i64,
}

/// The offsets of a group due to expire at `now_ms` (see the module's rules). `group` is
/// the group as this coordinator holds it (a group not in memory has no members).
pub(super) fn expired(
    offsets: &BTreeMap<(String, i32), CommittedOffset>,
    group: &Group,
    membership: Option<Membership>,
    retention: Duration,
    now_ms: i64,
) -> Vec<(String, i32)> {
    let retention_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
    let due = |from_ms: i64| from_ms.saturating_add(retention_ms) <= now_ms;
    let select = |keep: &dyn Fn(&(String, i32), &CommittedOffset) -> bool| {
        offsets.iter().filter(|(tp, c)| !keep(tp, c)).map(|(tp, _)| tp.clone()).collect()
    };
    if !group.members.is_empty() {
        // KIP-496: a live consumer group keeps what a member may be reading; any other
        // protocol's group keeps everything while it has members.
        if group.protocol_type.as_deref() != Some("consumer") {
            return Vec::new();
        }
        return select(&|(topic, _), c| group.is_subscribed_to(topic) || !due(c.commit_timestamp_ms));
    }
    match membership {
        Some(Membership { members: false, since_ms }) => select(&|_, c| !due(since_ms.max(c.commit_timestamp_ms))),
        // It had members when its coordinator last wrote: not empty for long enough yet.
        Some(Membership { members: true, .. }) => Vec::new(),
        None => select(&|_, c| !due(c.commit_timestamp_ms)),
    }
}

impl Inner {
    /// The group's [`Membership`] record; `None` when there is none (or it is unreadable:
    /// the group then expires by its commit times, as one without a record).
    pub(super) async fn read_membership(&self, group_id: &str) -> Result<Option<Membership>, ResponseError> {
        match self.store.get(&group_root(group_id)).await {
            Ok(Some((data, _))) if !data.is_empty() => Ok(serde_json::from_slice(&data)
                .inspect_err(|e| tracing::debug!(group = group_id, error = %e, "unreadable membership record"))
                .ok()),
            Ok(_) => Ok(None),
            Err(e) => {
                tracing::warn!(group = group_id, error = %e, "could not read a group's membership record");
                Err(ResponseError::CoordinatorNotAvailable)
            }
        }
    }

    /// Records that the group now has members or now has none. Called under the group's
    /// lock, so records land in the order of the changes. A failure is logged: it only
    /// moves the group's expiry (a record saying it has members makes the next sweep
    /// count it empty from then on).
    pub(super) async fn write_membership(&self, group_id: &str, members: bool) {
        let data = fjord_coord::registry::to_json(&Membership { members, since_ms: now_ms() });
        if let Err(e) = set_or_create(&*self.store, &group_root(group_id), &data).await {
            tracing::warn!(group = group_id, members, error = %e, "could not record a group's membership");
        }
    }

    /// One sweep over the registry's groups; returns how many offsets expired.
    pub(super) async fn expire_offsets(&self) -> usize {
        let nodes = match self.store.children(paths::CONSUMERS).await {
            Ok(nodes) => nodes,
            Err(fjord_coord::Error::NoNode { .. }) => return 0,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the group registry for offset expiry");
                return 0;
            }
        };
        let mut expired = 0;
        for node in nodes {
            let group_id = group_id_of(&node);
            match self.expire_group(&group_id).await {
                Ok(n) => expired += n,
                Err(e) => tracing::debug!(group = group_id, error = ?e, "offset expiry skipped the group"),
            }
        }
        if expired > 0 {
            self.offsets_expired.fetch_add(expired as u64, std::sync::atomic::Ordering::Relaxed);
            tracing::info!(expired, "committed offsets expired (offsets.retention.minutes)");
        }
        expired
    }

    /// The sweep task: one sweep, then it ends ([`Inner::expiring`] lets one run at a time).
    pub(super) async fn expire_offsets_task(self: Arc<Self>) {
        self.expire_offsets().await;
        self.expiring.store(false, std::sync::atomic::Ordering::Release);
    }

    /// Expires what is due of one group; returns how many offsets went.
    async fn expire_group(&self, group_id: &str) -> Result<usize, ResponseError> {
        let me = self.endpoint.broker_id;
        let retention = self.config.offsets_retention;
        // In memory: not marked used, so a sweep keeps no group in memory.
        let held = self.groups.lock().expect("groups lock").get(group_id).map(|h| h.entry.clone());
        let entry = match held {
            Some(entry) => entry,
            None => {
                // Reads only, unless something is due.
                let holder = self.holder(group_id).await?;
                if holder.is_some_and(|h| h != me) {
                    return Ok(0);
                }
                let offsets = self.load_offsets(group_id).await.map_err(|e| {
                    tracing::debug!(group = group_id, error = %e, "could not read committed offsets");
                    ResponseError::CoordinatorNotAvailable
                })?;
                let membership = self.read_membership(group_id).await?;
                let stale = membership.is_some_and(|m| m.members);
                if offsets.is_empty()
                    || (!stale && expired(&offsets, &Group::new(group_id), membership, retention, now_ms()).is_empty())
                {
                    return Ok(0);
                }
                if holder.is_none() && self.claim(group_id).await? != me {
                    return Ok(0);
                }
                // Read again now that this broker holds it, with any pending transactional
                // offsets: what goes is decided under the group's lock below.
                let (offsets, pending_txn) = self.load_group_offsets(group_id).await?;
                self.hold_for_sweep(group_id, offsets, pending_txn)
            }
        };
        let mut entry = entry.lock().await;
        if self.holder(group_id).await? != Some(me) {
            return Ok(0);
        }
        let membership = self.read_membership(group_id).await?;
        if entry.group.members.is_empty() && membership.is_some_and(|m| m.members) {
            // Its members were at another coordinator (or this one before a restart), and
            // are not here: empty from now on.
            self.write_membership(group_id, false).await;
            return Ok(0);
        }
        let mut due = expired(&entry.offsets, &entry.group, membership, retention, now_ms());
        due.retain(|(topic, p)| !entry.pending_txn.contains(topic, *p));
        if due.is_empty() {
            return Ok(0);
        }
        let codes = self.remove_offsets(&mut entry, group_id, &due).await;
        let removed = codes.iter().filter(|&&c| c == 0).count();
        tracing::debug!(group = group_id, removed, "committed offsets expired");
        Ok(removed)
    }

    /// Holds a group the sweep loaded, marked as idle long enough to leave memory at the
    /// next eviction unless a request takes it meanwhile.
    fn hold_for_sweep(
        &self,
        group_id: &str,
        offsets: BTreeMap<(String, i32), CommittedOffset>,
        pending_txn: super::txn_offsets::PendingPartitions,
    ) -> Arc<tokio::sync::Mutex<super::GroupEntry>> {
        let entry = self.hold(group_id, offsets, pending_txn);
        let idle_since = Instant::now().checked_sub(IDLE_EVICTION).unwrap_or_else(Instant::now);
        let mut groups = self.groups.lock().expect("groups lock");
        if let Some(Held { used, .. }) = groups.get_mut(group_id) {
            *used = (*used).min(idle_since);
        }
        entry
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);
    const NOW: i64 = 100 * 86_400_000;

    fn offsets(commits: &[(&str, i64)]) -> BTreeMap<(String, i32), CommittedOffset> {
        commits
            .iter()
            .map(|&(topic, at)| {
                let c = CommittedOffset { offset: 1, leader_epoch: -1, metadata: String::new(), commit_timestamp_ms: at };
                ((topic.to_string(), 0), c)
            })
            .collect()
    }

    fn days_ago(days: i64) -> i64 {
        NOW - days * 86_400_000
    }

    fn names(due: Vec<(String, i32)>) -> Vec<String> {
        due.into_iter().map(|(t, _)| t).collect()
    }

    #[test]
    fn a_group_without_a_membership_record_expires_by_commit_time() {
        let o = offsets(&[("old", days_ago(8)), ("new", days_ago(6))]);
        let due = expired(&o, &Group::new("g"), None, 7 * DAY, NOW);
        assert_eq!(names(due), ["old"]);
    }

    #[test]
    fn an_emptied_group_expires_a_retention_after_it_emptied() {
        let o = offsets(&[("a", days_ago(30)), ("b", days_ago(20))]);
        let emptied = |days| Some(Membership { members: false, since_ms: days_ago(days) });
        assert!(expired(&o, &Group::new("g"), emptied(6), 7 * DAY, NOW).is_empty(), "empty for 6 days of 7");
        assert_eq!(names(expired(&o, &Group::new("g"), emptied(7), 7 * DAY, NOW)), ["a", "b"]);
        // A commit after it emptied (a tool resetting offsets) keeps that offset longer.
        let o = offsets(&[("a", days_ago(30)), ("reset", days_ago(1))]);
        assert_eq!(names(expired(&o, &Group::new("g"), emptied(8), 7 * DAY, NOW)), ["a"]);
    }

    #[test]
    fn a_group_last_recorded_with_members_keeps_everything() {
        let o = offsets(&[("a", days_ago(300))]);
        let had_members = Some(Membership { members: true, since_ms: days_ago(300) });
        assert!(expired(&o, &Group::new("g"), had_members, 7 * DAY, NOW).is_empty());
    }

    mod with_a_store {
        use kafka_protocol::messages::*;
        use kafka_protocol::protocol::StrBytes;

        use crate::group::state::subscription;

        use crate::group::{Endpoint, GroupConfig, GroupCoordinator, IDLE_EVICTION};
        use std::time::{Duration, Instant};

        const RETENTION: Duration = Duration::from_millis(400);

        async fn coordinator(dir: &std::path::Path) -> GroupCoordinator {
            let store = fjord_coord::open(None, dir).await.unwrap();
            let config = GroupConfig {
                initial_rebalance_delay_ms: 0,
                offsets_retention: RETENTION,
                // The test sweeps by itself.
                offsets_retention_check_interval: Duration::from_secs(3600),
                ..GroupConfig::default()
            };
            GroupCoordinator::new(store, Endpoint { broker_id: 0, listeners: Vec::new() }, config)
        }

        fn group(name: &str) -> GroupId {
            GroupId(StrBytes::from_string(name.to_owned()))
        }

        async fn commit(groups: &GroupCoordinator, group_id: &str, topic: &'static str) {
            let request = OffsetCommitRequest::default()
                .with_group_id(group(group_id))
                .with_generation_id_or_member_epoch(-1)
                .with_topics(vec![offset_commit_request::OffsetCommitRequestTopic::default()
                    .with_name(TopicName(StrBytes::from_static_str(topic)))
                    .with_partitions(vec![
                        offset_commit_request::OffsetCommitRequestPartition::default().with_committed_offset(10)
                    ])]);
            let ResponseKind::OffsetCommit(r) = groups.offset_commit(request, 8, |_, _| true).await else { panic!() };
            assert_eq!(r.topics[0].partitions[0].error_code, 0);
        }

        async fn committed(groups: &GroupCoordinator, group_id: &str, topic: &'static str) -> i64 {
            let request =
                OffsetFetchRequest::default().with_groups(vec![offset_fetch_request::OffsetFetchRequestGroup::default()
                    .with_group_id(group(group_id))
                    .with_topics(Some(vec![offset_fetch_request::OffsetFetchRequestTopics::default()
                        .with_name(TopicName(StrBytes::from_static_str(topic)))
                        .with_partition_indexes(vec![0])]))]);
            let ResponseKind::OffsetFetch(r) = groups.offset_fetch(request, 8).await else { panic!() };
            r.groups[0].topics[0].partitions[0].committed_offset
        }

        /// A consumer joining `group_id` subscribed to `topics`; returns its member id.
        async fn join(groups: &GroupCoordinator, group_id: &str, topics: &[&'static str]) -> StrBytes {
            let join = JoinGroupRequest::default()
                .with_group_id(group(group_id))
                .with_session_timeout_ms(30_000)
                .with_protocol_type(StrBytes::from_static_str("consumer"))
                .with_protocols(vec![join_group_request::JoinGroupRequestProtocol::default()
                    .with_name(StrBytes::from_static_str("range"))
                    .with_metadata(subscription(topics))]);
            let joined = tokio::time::timeout(Duration::from_secs(10), groups.join_group(join, 0, "c", "h")).await.unwrap();
            let ResponseKind::JoinGroup(joined) = joined else { panic!() };
            assert_eq!(joined.error_code, 0);
            joined.member_id
        }

        async fn after_retention() {
            tokio::time::sleep(RETENTION + Duration::from_millis(100)).await;
        }

        /// The coordinator sweeps by itself every `offsets.retention.check.interval.ms`.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn the_coordinator_sweeps_on_its_own() {
            let dir = tempfile::tempdir().unwrap();
            let store = fjord_coord::open(None, dir.path()).await.unwrap();
            let config = GroupConfig {
                offsets_retention: RETENTION,
                offsets_retention_check_interval: Duration::from_millis(200),
                ..GroupConfig::default()
            };
            let groups = GroupCoordinator::new(store, Endpoint { broker_id: 0, listeners: Vec::new() }, config);
            let before_commit = Instant::now();
            commit(&groups, "solo", "a").await;
            while committed(&groups, "solo", "a").await != -1 {
                assert!(before_commit.elapsed() < Duration::from_secs(10), "the offset never expired");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // Milliseconds of the wall clock against the monotonic one: a little slack.
            assert!(before_commit.elapsed() + Duration::from_millis(5) >= RETENTION, "expired before its retention");
        }

        /// Kafka's rules end to end, over the real local store: a commit-only group loses
        /// its offsets a retention after its commit, and then leaves the registry; a live
        /// consumer keeps the offsets of the topics it subscribes to however old, and loses
        /// the others; a group that emptied keeps them a full retention from then, also
        /// across a new coordinator; a group whose record says it had members (its
        /// coordinator died with them) counts as empty from the first sweep that sees it.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn offsets_expire_a_retention_after_their_commit_or_their_group_emptied() {
            let dir = tempfile::tempdir().unwrap();
            let groups = coordinator(dir.path()).await;
            commit(&groups, "solo", "a").await;
            commit(&groups, "live", "a").await;
            commit(&groups, "live", "b").await;
            let member = join(&groups, "live", &["a"]).await;
            assert!(groups.inner.read_membership("live").await.unwrap().unwrap().members, "recorded at the join");
            assert_eq!(groups.inner.expire_offsets().await, 0, "nothing is a retention old yet");

            after_retention().await;
            assert_eq!(groups.inner.expire_offsets().await, 2);
            assert_eq!(groups.stats().offsets_expired, 2, "counted for /metrics");
            assert_eq!(committed(&groups, "solo", "a").await, -1);
            assert_eq!(committed(&groups, "live", "a").await, 10, "subscribed by a live member");
            assert_eq!(committed(&groups, "live", "b").await, -1, "no member subscribes to it");
            assert_eq!(groups.inner.store.get("/consumers/solo/offsets/a/0").await.unwrap(), None);
            // Without offsets or members the group leaves memory and the registry.
            let gone = groups.inner.evict_idle(Instant::now() + IDLE_EVICTION + Duration::from_secs(1));
            assert_eq!(gone, ["solo"]);
            groups.inner.release("solo").await;
            assert_eq!(groups.inner.store.get("/consumers/solo").await.unwrap(), None);

            // Emptied now: its old offset stays a full retention from here, also for a
            // coordinator started over the registry.
            let leave = LeaveGroupRequest::default().with_group_id(group("live")).with_member_id(member);
            let ResponseKind::LeaveGroup(left) = groups.leave_group(leave, 0).await else { panic!() };
            assert_eq!(left.error_code, 0);
            assert!(!groups.inner.read_membership("live").await.unwrap().unwrap().members, "recorded at the leave");
            assert_eq!(groups.inner.expire_offsets().await, 0);
            drop(groups);
            let groups = coordinator(dir.path()).await;
            assert_eq!(groups.inner.expire_offsets().await, 0);
            assert_eq!(committed(&groups, "live", "a").await, 10);
            after_retention().await;
            assert_eq!(groups.inner.expire_offsets().await, 1);
            assert_eq!(committed(&groups, "live", "a").await, -1);

            // Its coordinator went with members in it: empty from the first sweep here.
            commit(&groups, "moved", "a").await;
            groups.inner.write_membership("moved", true).await;
            drop(groups);
            let groups = coordinator(dir.path()).await;
            after_retention().await;
            assert_eq!(groups.inner.expire_offsets().await, 0);
            let membership = groups.inner.read_membership("moved").await.unwrap().unwrap();
            assert!(!membership.members);
            assert_eq!(committed(&groups, "moved", "a").await, 10);
            after_retention().await;
            assert_eq!(groups.inner.expire_offsets().await, 1);
            assert_eq!(committed(&groups, "moved", "a").await, -1);
        }
    }
}
