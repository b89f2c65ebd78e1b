//! DeleteRecords: moves partitions' log start offsets up on their leader
//! ([`fjord_log::Log::delete_records_before`]); consumers from the beginning and
//! ListOffsets earliest then start there.
//!
//! The answer is [`delete_records`], a function of the request and of the two things it
//! needs from the broker (may the client delete from a topic, which replica serves a
//! partition), tested in memory below without a broker or a socket; the `Broker` method
//! supplies those two and writes the checkpoint.

use std::sync::Arc;

use kafka_protocol::messages::delete_records_response::{DeleteRecordsPartitionResult, DeleteRecordsTopicResult};
use kafka_protocol::messages::{DeleteRecordsRequest, DeleteRecordsResponse, ResponseKind};

use fjord_auth::{Operation, Resource};

use crate::codec::error_code;
use crate::connection::Session;
use crate::handler::authorized_replica;
use crate::handler::{log_error_code, Broker};
use crate::partition::{Partition, Refusal};

/// The offset that asks for everything below the high watermark to go.
const HIGH_WATERMARK: i64 = -1;

impl Broker {
    pub(crate) fn delete_records(&self, request: DeleteRecordsRequest, session: &Session) -> ResponseKind {
        // Kafka: Delete on the topic.
        let may_delete = |topic: &str| self.authorize(session, Operation::Delete, Resource::topic(topic));
        let replica = |topic: &str, partition: i32| self.replica_named(topic, partition);
        let (response, moved) = delete_records(request, may_delete, replica);
        // The new starts are durable before the client hears of them.
        if moved {
            if let Err(e) = self.topics.logs().checkpoint() {
                tracing::error!(error = %e, "writing the log start offset checkpoint failed");
            }
        }
        ResponseKind::DeleteRecords(response)
    }
}

/// The DeleteRecords answer, and whether any partition's log start moved (then the
/// caller makes the new starts durable before answering). `may_delete` says whether
/// the client may delete from a topic; `replica` is this broker's replica of a
/// partition, or the error code to answer instead.
pub(crate) fn delete_records(
    request: DeleteRecordsRequest,
    may_delete: impl Fn(&str) -> bool,
    replica: impl Fn(&str, i32) -> Result<Arc<Partition>, Refusal>,
) -> (DeleteRecordsResponse, bool) {
    let mut moved = false;
    let topics = request
        .topics
        .into_iter()
        .map(|t| {
            let allowed = may_delete(&t.name.0);
            // Kafka: the coordinators' logs lose nothing to a client (an id whose state
            // went would be forgotten, its producers no longer fenced).
            let internal = crate::topics::is_internal(&t.name.0);
            let partitions = t
                .partitions
                .into_iter()
                .map(|p| {
                    let result =
                        DeleteRecordsPartitionResult::default().with_partition_index(p.partition_index).with_low_watermark(-1);
                    let partition = match authorized_replica(allowed, || replica(&t.name.0, p.partition_index)) {
                        Ok(_) if internal => Err(error_code::INVALID_TOPIC_EXCEPTION),
                        found => found,
                    };
                    let partition = match partition.and_then(|partition| partition.check_leader(-1).map(|_| partition)) {
                        Ok(partition) => partition,
                        Err(code) => return result.with_error_code(code),
                    };
                    let high_watermark = partition.log.high_watermark();
                    // Only committed records may go: the high watermark bounds the offset.
                    let offset = match p.offset {
                        HIGH_WATERMARK => high_watermark,
                        offset if (0..=high_watermark).contains(&offset) => offset,
                        _ => return result.with_error_code(error_code::OFFSET_OUT_OF_RANGE),
                    };
                    match partition.log.delete_records_before(offset) {
                        Ok(log_start) => {
                            moved = true;
                            result.with_low_watermark(log_start)
                        }
                        Err(e) => {
                            tracing::warn!(topic = %t.name.0, partition = p.partition_index, error = %e, "DeleteRecords failed");
                            result.with_error_code(log_error_code(&e))
                        }
                    }
                })
                .collect();
            DeleteRecordsTopicResult::default().with_name(t.name).with_partitions(partitions)
        })
        .collect();
    (DeleteRecordsResponse::default().with_topics(topics), moved)
}

#[cfg(test)]
mod tests {
    use fjord_coord::registry::PartitionState;
    use fjord_coord::Store;
    use fjord_log::{Log, LogConfig};
    use fjord_record::{BatchBuilder, TopicPartition};
    use kafka_protocol::messages::delete_records_request::{DeleteRecordsPartition, DeleteRecordsTopic};
    use kafka_protocol::messages::TopicName;
    use kafka_protocol::protocol::StrBytes;

    use super::*;
    use crate::replication::{PeerConfig, ReplicaManager, ReplicationConfig};

    fn batch(records: usize) -> Vec<u8> {
        let mut builder = BatchBuilder::new(1_000);
        for _ in 0..records {
            builder.append(1_000, None, Some(b"v"), &[]);
        }
        builder.build_vec()
    }

    /// Deletes below `(partition, offset)` of topic `t`.
    fn request(asks: &[(i32, i64)]) -> DeleteRecordsRequest {
        let partitions = asks
            .iter()
            .map(|&(partition, offset)| DeleteRecordsPartition::default().with_partition_index(partition).with_offset(offset))
            .collect();
        DeleteRecordsRequest::default().with_topics(vec![DeleteRecordsTopic::default()
            .with_name(TopicName(StrBytes::from_static_str("t")))
            .with_partitions(partitions)])
    }

    /// `(error code, low watermark)` of each partition answered.
    fn answers(response: &DeleteRecordsResponse) -> Vec<(i16, i64)> {
        response.topics.iter().flat_map(|t| &t.partitions).map(|p| (p.error_code, p.low_watermark)).collect()
    }

    /// Without a broker or a socket: partition 0 of `t` led here, 10 records of which 6
    /// are committed (high watermark 6); partition 1 held here without a role; no
    /// partition 2.
    #[tokio::test]
    async fn moves_the_log_start_up_to_the_high_watermark_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let store: Store = Arc::new(fjord_coord::EmbeddedStore::open(&dir.path().join("meta")).unwrap());
        let manager = ReplicaManager::new(1, store, ReplicationConfig::default(), PeerConfig::plaintext("PLAINTEXT"));
        let led = TopicPartition::new("t", 0);
        let log = Arc::new(Log::open(dir.path().join("t-0"), LogConfig::default()).unwrap());
        for _ in 0..5 {
            log.append(&mut batch(2), 0).unwrap();
        }
        manager.add_partition(&led, log.clone());
        let state = PartitionState { leader: 1, leader_epoch: 0, isr: vec![1], controller_epoch: 0 };
        manager.apply(&led, &[1], &state, 0);
        log.set_high_watermark(6);
        let idle = TopicPartition::new("t", 1);
        manager.add_partition(&idle, Arc::new(Log::open(dir.path().join("t-1"), LogConfig::default()).unwrap()));
        let replica =
            |topic: &str, p: i32| manager.get(&TopicPartition::new(topic, p)).ok_or(error_code::UNKNOWN_TOPIC_OR_PARTITION);

        // Refused: not allowed, past the high watermark, negative, no role, no partition.
        let (denied, moved) = delete_records(request(&[(0, 2)]), |_| false, replica);
        assert_eq!(answers(&denied), [(error_code::TOPIC_AUTHORIZATION_FAILED, -1)]);
        assert!(!moved);
        let refused = [(0, 7), (0, -2), (1, 0), (2, 0)];
        let (response, moved) = delete_records(request(&refused), |_| true, replica);
        assert_eq!(
            answers(&response),
            [
                (error_code::OFFSET_OUT_OF_RANGE, -1),
                (error_code::OFFSET_OUT_OF_RANGE, -1),
                (error_code::NOT_LEADER_OR_FOLLOWER, -1),
                (error_code::UNKNOWN_TOPIC_OR_PARTITION, -1),
            ]
        );
        assert!(!moved);
        assert_eq!(log.log_start_offset(), 0, "nothing refused moved the start");

        // Accepted: an offset inside a batch, then -1 for the high watermark.
        let (response, moved) = delete_records(request(&[(0, 3)]), |_| true, replica);
        assert_eq!((answers(&response), moved), (vec![(error_code::NONE, 3)], true));
        let (response, moved) = delete_records(request(&[(0, HIGH_WATERMARK)]), |_| true, replica);
        assert_eq!((answers(&response), moved), (vec![(error_code::NONE, 6)], true));
        assert_eq!(log.log_start_offset(), 6);
    }
}
