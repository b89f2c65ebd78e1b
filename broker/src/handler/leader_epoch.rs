//! OffsetForLeaderEpoch (v2-v4; the codec crate, like Kafka 4, has no v0-v1): where a leader epoch ended in this leader's log, from
//! the leader epoch cache. Followers ask it before fetching from a new leader, to find
//! where their log diverges (see `crate::replication::truncation`).

use kafka_protocol::messages::offset_for_leader_epoch_response::{EpochEndOffset, OffsetForLeaderTopicResult};
use kafka_protocol::messages::{OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse, ResponseKind};

use crate::codec::error_code;
use crate::connection::Session;
use crate::handler::Broker;
use crate::replication::truncation::UNDEFINED;
use fjord_auth::{Operation, Resource};

impl Broker {
    pub(crate) fn offset_for_leader_epoch(&self, request: OffsetForLeaderEpochRequest, session: &Session) -> ResponseKind {
        // Followers (replica id >= 0, v3+) ask for their truncation point: not a client's read.
        let follower = request.replica_id.0 >= 0;
        let topics = request
            .topics
            .into_iter()
            .map(|t| {
                // Kafka: Describe on the topic.
                let allowed = follower || self.authorize(session, Operation::Describe, Resource::topic(&t.topic.0));
                let topic = self.topics.get(&t.topic.0);
                let partitions = t
                    .partitions
                    .into_iter()
                    .map(|p| {
                        let answer = EpochEndOffset::default()
                            .with_partition(p.partition)
                            .with_leader_epoch(UNDEFINED as i32)
                            .with_end_offset(UNDEFINED);
                        let partition = match &topic {
                            _ if !allowed => Err(error_code::TOPIC_AUTHORIZATION_FAILED),
                            Some(topic) => self.replica(topic, p.partition),
                            None => Err(error_code::UNKNOWN_TOPIC_OR_PARTITION),
                        };
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
        ResponseKind::OffsetForLeaderEpoch(OffsetForLeaderEpochResponse::default().with_topics(topics))
    }
}
