//! OffsetDelete (API key 47, KIP-496): deletes a group's committed offsets for some
//! partitions, e.g. of a topic the group stopped reading (`kafka-consumer-groups
//! --delete-offsets`, the admin clients' DeleteConsumerGroupOffsets).
//!
//! Checked as Kafka checks it: Delete on the group, else the whole request is
//! GROUP_AUTHORIZATION_FAILED; per topic Read, else TOPIC_AUTHORIZATION_FAILED for its
//! partitions; a partition the cluster does not have is UNKNOWN_TOPIC_OR_PARTITION. The
//! rest goes to the group ([`GroupCoordinator::offset_delete`]); a group error (unknown
//! group, NON_EMPTY_GROUP, NOT_COORDINATOR) is the whole answer, without partitions.
//!
//! [`offset_delete`] is a function of the request, those three checks and the group
//! coordinator, tested below on an in-memory coordinator without a broker or a socket.

use kafka_protocol::messages::offset_delete_response::{OffsetDeleteResponsePartition, OffsetDeleteResponseTopic};
use kafka_protocol::messages::{OffsetDeleteRequest, OffsetDeleteResponse, ResponseKind};

use fjord_auth::{Operation, Resource};

use crate::codec::error_code;
use crate::connection::Session;
use crate::group::GroupCoordinator;
use crate::handler::Broker;

impl Broker {
    pub(crate) async fn offset_delete(&self, request: OffsetDeleteRequest, session: &Session) -> ResponseKind {
        let may_delete_group = |group: &str| self.authorize(session, Operation::Delete, Resource::group(group));
        let may_read_topic = |topic: &str| self.authorize(session, Operation::Read, Resource::topic(topic));
        let known = |topic: &str, p: i32| self.topics.get(topic).is_some_and(|t| t.partition_replicas(p).is_some());
        ResponseKind::OffsetDelete(offset_delete(request, may_delete_group, may_read_topic, known, &self.groups).await)
    }
}

/// The OffsetDelete answer. `may_delete_group` and `may_read_topic` are the client's
/// permissions, `known` says which partitions the cluster has.
pub(crate) async fn offset_delete(
    request: OffsetDeleteRequest,
    may_delete_group: impl Fn(&str) -> bool,
    may_read_topic: impl Fn(&str) -> bool,
    known: impl Fn(&str, i32) -> bool,
    groups: &GroupCoordinator,
) -> OffsetDeleteResponse {
    if !may_delete_group(&request.group_id) {
        return OffsetDeleteResponse::default().with_error_code(error_code::GROUP_AUTHORIZATION_FAILED);
    }
    // Each partition's answer where it is decided here; the rest go to the group.
    let decided: Vec<Vec<Option<i16>>> = request
        .topics
        .iter()
        .map(|t| {
            let readable = may_read_topic(&t.name);
            t.partitions
                .iter()
                .map(|p| match (readable, known(&t.name, p.partition_index)) {
                    (false, _) => Some(error_code::TOPIC_AUTHORIZATION_FAILED),
                    (true, false) => Some(error_code::UNKNOWN_TOPIC_OR_PARTITION),
                    (true, true) => None,
                })
                .collect()
        })
        .collect();
    let asked: Vec<(String, i32)> = request
        .topics
        .iter()
        .zip(&decided)
        .flat_map(|(t, decided)| {
            t.partitions.iter().zip(decided).filter(|(_, d)| d.is_none()).map(|(p, _)| (t.name.to_string(), p.partition_index))
        })
        .collect();
    // Even with nothing left to delete the group is looked at: an unknown group is
    // GROUP_ID_NOT_FOUND whatever the partitions, as in Kafka.
    let mut answers = match groups.offset_delete(&request.group_id, &asked).await {
        Ok(codes) => codes.into_iter(),
        Err(e) => return OffsetDeleteResponse::default().with_error_code(e.code()),
    };
    let topics = request
        .topics
        .into_iter()
        .zip(decided)
        .map(|(t, decided)| {
            let partitions = t
                .partitions
                .iter()
                .zip(decided)
                .map(|(p, decided)| {
                    // `answers` has one code per undecided partition, in request order.
                    let code = decided.or_else(|| answers.next()).unwrap_or(error_code::UNKNOWN_SERVER_ERROR);
                    OffsetDeleteResponsePartition::default().with_partition_index(p.partition_index).with_error_code(code)
                })
                .collect();
            OffsetDeleteResponseTopic::default().with_name(t.name).with_partitions(partitions)
        })
        .collect();
    OffsetDeleteResponse::default().with_topics(topics)
}

#[cfg(test)]
mod tests {
    use kafka_protocol::error::ResponseError;
    use kafka_protocol::messages::offset_delete_request::{OffsetDeleteRequestPartition, OffsetDeleteRequestTopic};
    use kafka_protocol::messages::*;
    use kafka_protocol::protocol::StrBytes;

    use super::*;
    use crate::group::{Endpoint, GroupConfig};

    fn request(group: &'static str, asks: &[(&'static str, i32)]) -> OffsetDeleteRequest {
        let mut topics: Vec<OffsetDeleteRequestTopic> = Vec::new();
        for &(topic, p) in asks {
            let partition = OffsetDeleteRequestPartition::default().with_partition_index(p);
            match topics.iter_mut().find(|t| t.name.as_str() == topic) {
                Some(t) => t.partitions.push(partition),
                None => topics.push(
                    OffsetDeleteRequestTopic::default()
                        .with_name(TopicName(StrBytes::from_static_str(topic)))
                        .with_partitions(vec![partition]),
                ),
            }
        }
        OffsetDeleteRequest::default().with_group_id(GroupId(StrBytes::from_static_str(group))).with_topics(topics)
    }

    /// `(topic, partition, error code)` of each partition answered.
    fn answers(response: &OffsetDeleteResponse) -> Vec<(String, i32, i16)> {
        response
            .topics
            .iter()
            .flat_map(|t| t.partitions.iter().map(|p| (t.name.to_string(), p.partition_index, p.error_code)))
            .collect()
    }

    async fn committed(groups: &GroupCoordinator, asks: &[(&'static str, i32)]) -> Vec<i64> {
        let topics = asks
            .iter()
            .map(|&(topic, p)| {
                offset_fetch_request::OffsetFetchRequestTopics::default()
                    .with_name(TopicName(StrBytes::from_static_str(topic)))
                    .with_partition_indexes(vec![p])
            })
            .collect();
        let request = OffsetFetchRequest::default().with_groups(vec![offset_fetch_request::OffsetFetchRequestGroup::default()
            .with_group_id(GroupId(StrBytes::from_static_str("g")))
            .with_topics(Some(topics))]);
        let ResponseKind::OffsetFetch(r) = groups.offset_fetch(request, 8).await else { panic!() };
        r.groups[0].topics.iter().flat_map(|t| &t.partitions).map(|p| p.committed_offset).collect()
    }

    /// Without a broker or a socket: group `g` committed offsets for `t` 0 and 1 and
    /// `secret` 0; the cluster has `t` 0-1 and `secret` 0.
    #[tokio::test]
    async fn checks_permissions_and_partitions_before_the_group() {
        let dir = tempfile::tempdir().unwrap();
        let store = fjord_coord::open(None, dir.path()).await.unwrap();
        let groups = GroupCoordinator::new(store, Endpoint { broker_id: 0, listeners: Vec::new() }, GroupConfig::default());
        let all = [("t", 0), ("t", 1), ("secret", 0)];
        let commit = OffsetCommitRequest::default()
            .with_group_id(GroupId(StrBytes::from_static_str("g")))
            .with_generation_id_or_member_epoch(-1)
            .with_topics(
                all.iter()
                    .map(|&(topic, p)| {
                        offset_commit_request::OffsetCommitRequestTopic::default()
                            .with_name(TopicName(StrBytes::from_static_str(topic)))
                            .with_partitions(vec![offset_commit_request::OffsetCommitRequestPartition::default()
                                .with_partition_index(p)
                                .with_committed_offset(5)])
                    })
                    .collect(),
            );
        let ResponseKind::OffsetCommit(_) = groups.offset_commit(commit, 8, |_, _| true).await else { panic!() };
        let known = |topic: &str, p: i32| matches!((topic, p), ("t", 0 | 1) | ("secret", 0));
        let readable = |topic: &str| topic != "secret";

        // No Delete on the group: the whole request is refused, nothing goes.
        let response = offset_delete(request("g", &all), |_| false, |_| true, known, &groups).await;
        assert_eq!((response.error_code, response.topics.len()), (error_code::GROUP_AUTHORIZATION_FAILED, 0));
        // Unknown group: its error alone, whatever the partitions.
        let response = offset_delete(request("nobody", &[("t", 0), ("gone", 0)]), |_| true, readable, known, &groups).await;
        assert_eq!((response.error_code, response.topics.len()), (ResponseError::GroupIdNotFound.code(), 0));
        assert_eq!(committed(&groups, &all).await, [5, 5, 5]);

        // Per partition: unreadable topic, unknown partition, unknown topic, deleted.
        let asks = [("secret", 0), ("t", 9), ("gone", 0), ("t", 1)];
        let response = offset_delete(request("g", &asks), |_| true, readable, known, &groups).await;
        assert_eq!(response.error_code, 0);
        assert_eq!(
            answers(&response),
            [
                ("secret".to_string(), 0, error_code::TOPIC_AUTHORIZATION_FAILED),
                ("t".to_string(), 9, error_code::UNKNOWN_TOPIC_OR_PARTITION),
                ("t".to_string(), 1, error_code::NONE),
                ("gone".to_string(), 0, error_code::UNKNOWN_TOPIC_OR_PARTITION),
            ]
        );
        assert_eq!(committed(&groups, &all).await, [5, -1, 5], "only t-1 went");
    }
}
