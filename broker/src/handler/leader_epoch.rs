//! OffsetForLeaderEpoch (v2-v4; the codec crate, like Kafka 4, has no v0-v1): where a leader epoch ended in this leader's log, from
//! the leader epoch cache. Followers ask it before fetching from a new leader, to find
//! where their log diverges (see `crate::replication::truncation`).
//!
//! The answer is [`offset_for_leader_epoch`], a function of the request and of the two
//! things it needs from the broker (may the client describe a topic, which replica
//! serves a partition), so it is tested in memory below, without a broker or a socket;
//! the `Broker` method only supplies those two.

use std::sync::Arc;

use kafka_protocol::messages::offset_for_leader_epoch_response::{EpochEndOffset, OffsetForLeaderTopicResult};
use kafka_protocol::messages::{OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse, ResponseKind};

use crate::connection::Session;
use crate::handler::authorized_replica;
use crate::handler::Broker;
use crate::partition::{Partition, Refusal};
use crate::replication::truncation::UNDEFINED;
use fjord_auth::{Operation, Resource};

impl Broker {
    pub(crate) async fn offset_for_leader_epoch(
        &self,
        request: OffsetForLeaderEpochRequest,
        session: &mut Session,
    ) -> ResponseKind {
        // A replica id counts only on that broker's own connection, as for a replica Fetch
        // (Kafka: ClusterAction); anyone else's request is a client's, answered per topic
        // by Describe, or a replica id would let any client skip the check.
        let replica_id = request.replica_id.0;
        let follower = replica_id >= 0 && self.is_replica(session, replica_id).await;
        let session = &*session;
        // Kafka: Describe on the topic.
        let may_describe = |topic: &str| self.authorize(session, Operation::Describe, Resource::topic(topic));
        let replica = |topic: &str, partition: i32| self.replica_named(topic, partition);
        ResponseKind::OffsetForLeaderEpoch(offset_for_leader_epoch(request, follower, may_describe, replica))
    }
}

/// The OffsetForLeaderEpoch answer: per partition, the largest epoch at or below the one
/// asked for that the leader's log knows, and the offset where it ended. `may_describe`
/// says whether the client may see a topic; a `follower` (a verified broker, not merely a
/// request with a replica id) is not asked about: its truncation point is not a client's
/// read. `replica` is this broker's replica of a partition, or the error code to answer
/// instead.
pub(crate) fn offset_for_leader_epoch(
    request: OffsetForLeaderEpochRequest,
    follower: bool,
    may_describe: impl Fn(&str) -> bool,
    replica: impl Fn(&str, i32) -> Result<Arc<Partition>, Refusal>,
) -> OffsetForLeaderEpochResponse {
    let topics = request
        .topics
        .into_iter()
        .map(|t| {
            let allowed = follower || may_describe(&t.topic.0);
            let partitions = t
                .partitions
                .into_iter()
                .map(|p| {
                    let answer = EpochEndOffset::default()
                        .with_partition(p.partition)
                        .with_leader_epoch(UNDEFINED as i32)
                        .with_end_offset(UNDEFINED);
                    let partition = authorized_replica(allowed, || replica(&t.topic.0, p.partition));
                    let partition = match partition {
                        Ok(partition) => partition,
                        Err(code) => return answer.with_error_code(code),
                    };
                    // current_leader_epoch is -1 (not checked) before v2, as in Kafka.
                    if let Err(code) = partition.check_leader(p.current_leader_epoch) {
                        return answer.with_error_code(code);
                    }
                    match partition.log.end_offset_for_epoch(p.leader_epoch) {
                        Some((epoch, end)) => answer.with_leader_epoch(epoch).with_end_offset(end),
                        None => answer,
                    }
                })
                .collect();
            OffsetForLeaderTopicResult::default().with_topic(t.topic).with_partitions(partitions)
        })
        .collect();
    OffsetForLeaderEpochResponse::default().with_topics(topics)
}

#[cfg(test)]
mod tests {
    use fjord_coord::registry::PartitionState;
    use fjord_coord::Store;
    use fjord_log::{Log, LogConfig};
    use fjord_record::{BatchBuilder, TopicPartition};
    use kafka_protocol::messages::offset_for_leader_epoch_request::{OffsetForLeaderPartition, OffsetForLeaderTopic};
    use kafka_protocol::messages::{BrokerId, TopicName};
    use kafka_protocol::protocol::StrBytes;

    use super::*;
    use crate::codec::error_code;
    use crate::replication::{PeerConfig, ReplicaManager, ReplicationConfig};

    fn batch(records: usize) -> Vec<u8> {
        let mut builder = BatchBuilder::new(1_000);
        for _ in 0..records {
            builder.append(1_000, None, Some(b"v"), &[]);
        }
        builder.build_vec()
    }

    /// Asks about `(partition, current leader epoch, leader epoch)` of topic `t`.
    fn request(replica_id: i32, asks: &[(i32, i32, i32)]) -> OffsetForLeaderEpochRequest {
        let partitions = asks
            .iter()
            .map(|&(partition, current, epoch)| {
                OffsetForLeaderPartition::default()
                    .with_partition(partition)
                    .with_current_leader_epoch(current)
                    .with_leader_epoch(epoch)
            })
            .collect();
        OffsetForLeaderEpochRequest::default().with_replica_id(BrokerId(replica_id)).with_topics(vec![
            OffsetForLeaderTopic::default().with_topic(TopicName(StrBytes::from_static_str("t"))).with_partitions(partitions),
        ])
    }

    /// `(error code, leader epoch, end offset)` of each partition answered.
    fn answers(response: &OffsetForLeaderEpochResponse) -> Vec<(i16, i32, i64)> {
        response.topics.iter().flat_map(|t| &t.partitions).map(|p| (p.error_code, p.leader_epoch, p.end_offset)).collect()
    }

    /// Without a broker or a socket: partition 0 of `t` led here in epoch 4, its log
    /// holding 3 records of epoch 0 and 2 of epoch 2; partition 1 held here without a
    /// role; no partition 2.
    #[tokio::test]
    async fn answers_from_the_leader_epoch_cache_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let store: Store = Arc::new(fjord_coord::EmbeddedStore::open(&dir.path().join("meta")).unwrap());
        let manager = ReplicaManager::new(1, store, ReplicationConfig::default(), PeerConfig::plaintext("PLAINTEXT"));
        let led = TopicPartition::new("t", 0);
        let log = Arc::new(Log::open(dir.path().join("t-0"), LogConfig::default()).unwrap());
        log.append(&mut batch(3), 0).unwrap();
        log.append(&mut batch(2), 2).unwrap();
        let partition = manager.add_partition(&led, log);
        let state = PartitionState { leader: 1, leader_epoch: 4, isr: vec![1], controller_epoch: 0 };
        manager.apply(&led, &[1], &state, 0);
        let idle = TopicPartition::new("t", 1);
        let idle_log = Arc::new(Log::open(dir.path().join("t-1"), LogConfig::default()).unwrap());
        manager.add_partition(&idle, idle_log);
        let replica =
            |topic: &str, p: i32| manager.get(&TopicPartition::new(topic, p)).ok_or(error_code::UNKNOWN_TOPIC_OR_PARTITION);
        assert!(Arc::ptr_eq(&replica("t", 0).unwrap(), &partition));

        let asks = [(0, -1, 0), (0, -1, 1), (0, 4, 2), (0, 4, 3), (0, 3, 2), (0, 5, 2), (1, -1, 0), (2, -1, 0)];
        let response = offset_for_leader_epoch(request(-1, &asks), false, |_| true, replica);
        let undefined = (UNDEFINED as i32, UNDEFINED);
        assert_eq!(
            answers(&response),
            [
                (error_code::NONE, 0, 3), // epoch 0 ended where epoch 2 started
                (error_code::NONE, 0, 3), // epoch 1 never led: the largest epoch below it
                (error_code::NONE, 2, 5), // the latest epoch in the log ends at the log end
                (error_code::NONE, 2, 5),
                (error_code::FENCED_LEADER_EPOCH, undefined.0, undefined.1),
                (error_code::UNKNOWN_LEADER_EPOCH, undefined.0, undefined.1),
                (error_code::NOT_LEADER_OR_FOLLOWER, undefined.0, undefined.1),
                (error_code::UNKNOWN_TOPIC_OR_PARTITION, undefined.0, undefined.1),
            ]
        );

        // A client that may not describe the topic learns nothing, even naming a replica
        // id it could not prove; a verified follower is not asked.
        let denied = offset_for_leader_epoch(request(-1, &[(0, -1, 0)]), false, |_| false, replica);
        assert_eq!(answers(&denied), [(error_code::TOPIC_AUTHORIZATION_FAILED, undefined.0, undefined.1)]);
        let posing = offset_for_leader_epoch(request(2, &[(0, -1, 0)]), false, |_| false, replica);
        assert_eq!(answers(&posing), [(error_code::TOPIC_AUTHORIZATION_FAILED, undefined.0, undefined.1)]);
        let follower = offset_for_leader_epoch(request(2, &[(0, -1, 0)]), true, |_| false, replica);
        assert_eq!(answers(&follower), [(error_code::NONE, 0, 3)]);
    }
}
