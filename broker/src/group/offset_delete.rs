//! OffsetDelete's group side: removing a group's committed offsets for some partitions,
//! from the cache and from the offset registry.
//!
//! Kafka's rules: a group that does not exist is GROUP_ID_NOT_FOUND; an Empty group loses
//! the offsets asked for; a consumer group with live members keeps the offsets of every
//! topic a member subscribes to (GROUP_SUBSCRIBED_TO_TOPIC, since they would only be
//! committed again, or worse, a member restarting would reset) and loses the others; a
//! group of another protocol type with members keeps everything (NON_EMPTY_GROUP). A group
//! left Empty without offsets no longer exists, as after DeleteGroups. Transactional
//! offsets of a deleted partition still pending (TxnOffsetCommit before the marker) go
//! too, as in Kafka's coordinator: the transaction's commit does not bring them back.

use fjord_coord::{paths, MetadataStore};
use kafka_protocol::error::ResponseError;

use super::registry::{group_node, group_root};
use super::state::GroupState;
use super::{GroupCoordinator, GroupEntry, Inner};

impl GroupCoordinator {
    /// Deletes the committed offsets of `partitions` (topic, partition) of `group_id`.
    /// `Ok` holds one error code per partition, in order (NONE also for a partition with
    /// nothing committed, as Kafka answers); `Err` is the group's error, and then nothing
    /// was deleted.
    pub(crate) async fn offset_delete(&self, group_id: &str, partitions: &[(String, i32)]) -> Result<Vec<i16>, ResponseError> {
        let entry = self.lookup(group_id).await?.ok_or(ResponseError::GroupIdNotFound)?;
        let mut entry = entry.lock().await;
        let group = &entry.group;
        let eligible: Vec<bool> = match group.state {
            GroupState::Empty => vec![true; partitions.len()],
            _ if group.protocol_type.as_deref() == Some("consumer") => {
                partitions.iter().map(|(topic, _)| !group.is_subscribed_to(topic)).collect()
            }
            _ => return Err(ResponseError::NonEmptyGroup),
        };
        let allowed: Vec<(String, i32)> =
            partitions.iter().zip(&eligible).filter(|(_, e)| **e).map(|(tp, _)| tp.clone()).collect();
        let mut removed = self.inner.remove_offsets(&mut entry, group_id, &allowed).await.into_iter();
        let codes = eligible
            .iter()
            .map(|&e| {
                if e {
                    removed.next().expect("one code per allowed partition")
                } else {
                    ResponseError::GroupSubscribedToTopic.code()
                }
            })
            .collect();
        Ok(codes)
    }
}

impl Inner {
    /// Removes the committed offsets of `partitions` from the registry and then from
    /// `entry` (with any transactional offset of theirs still pending), and the offsets
    /// node of a topic left without any. One error code per partition, in order (NONE
    /// also for a partition with nothing committed).
    pub(super) async fn remove_offsets(&self, entry: &mut GroupEntry, group_id: &str, partitions: &[(String, i32)]) -> Vec<i16> {
        let store: &dyn MetadataStore = &*self.store;
        let node = group_node(group_id);
        let mut codes = Vec::with_capacity(partitions.len());
        for (topic, partition) in partitions {
            if let Err(e) = entry.drop_pending_offset(store, group_id, topic, *partition).await {
                tracing::warn!(group = group_id, topic, partition, error = %e, "pending transactional offset not dropped");
                codes.push(ResponseError::CoordinatorNotAvailable.code());
                continue;
            }
            // The registry first: an offset that stays there would come back with the
            // next load of the group.
            match store.delete(&paths::group_offset(&node, topic, *partition), None).await {
                Ok(()) | Err(fjord_coord::Error::NoNode { .. }) => {
                    entry.offsets.remove(&(topic.clone(), *partition));
                    codes.push(0);
                }
                Err(e) => {
                    tracing::warn!(group = group_id, topic, partition, error = %e, "offset delete failed");
                    codes.push(ResponseError::CoordinatorNotAvailable.code());
                }
            }
        }
        // A topic whose last committed partition went leaves no empty node behind.
        let mut emptied: Vec<&str> = partitions.iter().map(|(topic, _)| topic.as_str()).collect();
        emptied.sort_unstable();
        emptied.dedup();
        for topic in emptied {
            if entry.offsets.keys().any(|(t, _)| t == topic) {
                continue;
            }
            let path = format!("{}/offsets/{topic}", group_root(group_id));
            match store.delete(&path, None).await {
                Ok(()) | Err(fjord_coord::Error::NoNode { .. }) => {}
                Err(e) => tracing::debug!(group = group_id, topic, error = %e, "empty offsets node left in place"),
            }
        }
        codes
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use kafka_protocol::messages::*;
    use kafka_protocol::protocol::StrBytes;

    use super::*;
    use crate::group::state::subscription;
    use crate::group::{Endpoint, GroupConfig};

    fn group(name: &'static str) -> GroupId {
        GroupId(StrBytes::from_static_str(name))
    }

    async fn coordinator(dir: &std::path::Path) -> GroupCoordinator {
        let store = fjord_coord::open(None, dir).await.unwrap();
        let config = GroupConfig { initial_rebalance_delay_ms: 0, ..GroupConfig::default() };
        GroupCoordinator::new(store, Endpoint { broker_id: 0, listeners: Vec::new() }, config)
    }

    /// Commits offset 10 for each of `partitions` outside the group protocol (as an
    /// admin client or a consumer with manual assignment does).
    async fn commit(groups: &GroupCoordinator, group_id: &'static str, partitions: &[(&'static str, i32)]) {
        let topics = partitions
            .iter()
            .map(|&(topic, p)| {
                offset_commit_request::OffsetCommitRequestTopic::default()
                    .with_name(TopicName(StrBytes::from_static_str(topic)))
                    .with_partitions(vec![offset_commit_request::OffsetCommitRequestPartition::default()
                        .with_partition_index(p)
                        .with_committed_offset(10)])
            })
            .collect();
        let request = OffsetCommitRequest::default()
            .with_group_id(group(group_id))
            .with_generation_id_or_member_epoch(-1)
            .with_topics(topics);
        let ResponseKind::OffsetCommit(r) = groups.offset_commit(request, 8, |_, _| true).await else { panic!() };
        assert!(r.topics.iter().flat_map(|t| &t.partitions).all(|p| p.error_code == 0));
    }

    /// The committed offsets of `partitions`, -1 where none.
    async fn committed(groups: &GroupCoordinator, group_id: &'static str, partitions: &[(&'static str, i32)]) -> Vec<i64> {
        let topics = partitions
            .iter()
            .map(|&(topic, p)| {
                offset_fetch_request::OffsetFetchRequestTopics::default()
                    .with_name(TopicName(StrBytes::from_static_str(topic)))
                    .with_partition_indexes(vec![p])
            })
            .collect();
        let request = OffsetFetchRequest::default().with_groups(vec![offset_fetch_request::OffsetFetchRequestGroup::default()
            .with_group_id(group(group_id))
            .with_topics(Some(topics))]);
        let ResponseKind::OffsetFetch(r) = groups.offset_fetch(request, 8).await else { panic!() };
        r.groups[0].topics.iter().flat_map(|t| &t.partitions).map(|p| p.committed_offset).collect()
    }

    fn owned(partitions: &[(&str, i32)]) -> Vec<(String, i32)> {
        partitions.iter().map(|&(t, p)| (t.to_string(), p)).collect()
    }

    #[tokio::test]
    async fn an_empty_group_loses_the_offsets_asked_for_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let groups = coordinator(dir.path()).await;
        let all = [("a", 0), ("a", 1), ("b", 0)];
        commit(&groups, "g", &all).await;

        // Unknown group, empty group id: the group's error, and nothing changes.
        assert_eq!(groups.offset_delete("nobody", &owned(&[("a", 0)])).await, Err(ResponseError::GroupIdNotFound));
        assert_eq!(groups.offset_delete("", &owned(&[("a", 0)])).await, Err(ResponseError::InvalidGroupId));
        assert_eq!(committed(&groups, "g", &all).await, [10, 10, 10]);

        // A partition never committed is NONE too.
        let codes = groups.offset_delete("g", &owned(&[("a", 1), ("b", 7)])).await.unwrap();
        assert_eq!(codes, [0, 0]);
        assert_eq!(committed(&groups, "g", &all).await, [10, -1, 10]);

        // Deleted from the registry too: a coordinator started over it reads the rest.
        drop(groups);
        let groups = coordinator(dir.path()).await;
        assert_eq!(committed(&groups, "g", &all).await, [10, -1, 10]);

        // The last offsets gone, the group no longer exists.
        assert_eq!(groups.offset_delete("g", &owned(&[("a", 0), ("b", 0)])).await, Ok(vec![0, 0]));
        assert_eq!(groups.offset_delete("g", &owned(&[("a", 0)])).await, Err(ResponseError::GroupIdNotFound));
    }

    /// Producer 7 commits offset 50 of ("a", 0) and ("a", 1) in a transaction; OffsetDelete
    /// of ("a", 0) comes before the marker. The commit then applies ("a", 1) only: the
    /// deleted partition's pending offset went with the delete, here and in the store (a
    /// coordinator started over it agrees), as Kafka's coordinator drops it.
    #[tokio::test]
    async fn offset_delete_drops_pending_transactional_offsets_so_a_later_commit_does_not_restore_them() {
        let dir = tempfile::tempdir().unwrap();
        let groups = coordinator(dir.path()).await;
        let both = [("a", 0), ("a", 1)];
        commit(&groups, "g", &both).await;
        let request = TxnOffsetCommitRequest::default()
            .with_transactional_id(TransactionalId(StrBytes::from_static_str("tx")))
            .with_group_id(group("g"))
            .with_producer_id(ProducerId(7))
            .with_producer_epoch(0)
            .with_generation_id(-1)
            .with_topics(vec![txn_offset_commit_request::TxnOffsetCommitRequestTopic::default()
                .with_name(TopicName(StrBytes::from_static_str("a")))
                .with_partitions(
                    [0, 1]
                        .map(|p| {
                            txn_offset_commit_request::TxnOffsetCommitRequestPartition::default()
                                .with_partition_index(p)
                                .with_committed_offset(50)
                        })
                        .to_vec(),
                )]);
        let ResponseKind::TxnOffsetCommit(r) = groups.txn_offset_commit(request, 3, |_, _| true).await else { panic!() };
        assert!(r.topics.iter().flat_map(|t| &t.partitions).all(|p| p.error_code == 0), "{r:?}");

        assert_eq!(groups.offset_delete("g", &owned(&[("a", 0)])).await, Ok(vec![0]));
        assert_eq!(committed(&groups, "g", &both).await, [-1, 10]);
        // Restarted between the delete and the marker: the store has the same view.
        drop(groups);
        let groups = coordinator(dir.path()).await;
        groups.complete_txn_offsets(7, true).await.unwrap();
        assert_eq!(committed(&groups, "g", &both).await, [-1, 50], "the deleted partition's pending offset came back");
    }

    #[tokio::test]
    async fn a_live_consumer_group_keeps_the_offsets_of_subscribed_topics() {
        let dir = tempfile::tempdir().unwrap();
        let groups = coordinator(dir.path()).await;
        let all = [("subscribed", 0), ("other", 0)];
        commit(&groups, "g", &all).await;
        let join = JoinGroupRequest::default()
            .with_group_id(group("g"))
            .with_session_timeout_ms(30_000)
            .with_rebalance_timeout_ms(30_000)
            .with_protocol_type(StrBytes::from_static_str("consumer"))
            .with_protocols(vec![join_group_request::JoinGroupRequestProtocol::default()
                .with_name(StrBytes::from_static_str("range"))
                .with_metadata(subscription(&["subscribed"]))]);
        let ResponseKind::JoinGroup(joined) = groups.join_group(join, 3, "c", "h").await else { panic!() };
        assert_eq!(joined.error_code, 0);

        let codes = groups.offset_delete("g", &owned(&all)).await.unwrap();
        assert_eq!(codes, [ResponseError::GroupSubscribedToTopic.code(), 0]);
        assert_eq!(committed(&groups, "g", &all).await, [10, -1]);

        // Another protocol type with members: NON_EMPTY_GROUP, nothing deleted.
        commit(&groups, "h", &all).await;
        let join = JoinGroupRequest::default()
            .with_group_id(group("h"))
            .with_session_timeout_ms(30_000)
            .with_rebalance_timeout_ms(30_000)
            .with_protocol_type(StrBytes::from_static_str("connect"))
            .with_protocols(vec![join_group_request::JoinGroupRequestProtocol::default()
                .with_name(StrBytes::from_static_str("sessioned"))
                .with_metadata(Bytes::from_static(b"x"))]);
        let ResponseKind::JoinGroup(joined) = groups.join_group(join, 3, "c", "h").await else { panic!() };
        assert_eq!(joined.error_code, 0);
        assert_eq!(groups.offset_delete("h", &owned(&all)).await, Err(ResponseError::NonEmptyGroup));
        assert_eq!(committed(&groups, "h", &all).await, [10, 10]);
    }
}
