//! DescribeProducers (API key 61, KIP-664): the active producers of partitions, from
//! each partition's producer state ([`fjord_log::Log::producers`]): id, epoch, last
//! sequence, last timestamp, the coordinator epoch of its last transaction marker and
//! the first offset of its open transaction (-1 without one). Operators use it to find
//! a hanging transaction that holds a partition's last stable offset back.
//!
//! As Kafka: Read on the topic, else TOPIC_AUTHORIZATION_FAILED; a partition the
//! cluster does not have is UNKNOWN_TOPIC_OR_PARTITION; any replica answers (the leader
//! or a follower, whose state comes from the same batches), a broker without one
//! NOT_LEADER_OR_FOLLOWER.
//!
//! [`describe_producers`] is a function of the request and two narrow dependencies,
//! tested below without a broker.

use kafka_protocol::messages::describe_producers_response::{PartitionResponse, ProducerState, TopicResponse};
use kafka_protocol::messages::{DescribeProducersRequest, DescribeProducersResponse, ProducerId, ResponseKind};

use fjord_auth::{Operation, Resource};
use fjord_log::ProducerInfo;

use crate::codec::error_code;
use crate::connection::Session;
use crate::handler::Broker;

impl Broker {
    pub(crate) fn describe_producers(&self, request: DescribeProducersRequest, session: &Session) -> ResponseKind {
        let may_read = |topic: &str| self.authorize(session, Operation::Read, Resource::topic(topic));
        let producers = |topic: &str, partition: i32| self.replica_named(topic, partition).map(|replica| replica.log.producers());
        ResponseKind::DescribeProducers(describe_producers(request, may_read, producers))
    }
}

/// The DescribeProducers answer. `may_read` says whether the client may read a topic;
/// `producers` is the producer state of this broker's replica of a partition, or the
/// error code to answer instead.
pub(crate) fn describe_producers(
    request: DescribeProducersRequest,
    may_read: impl Fn(&str) -> bool,
    producers: impl Fn(&str, i32) -> Result<Vec<ProducerInfo>, i16>,
) -> DescribeProducersResponse {
    let topics = request
        .topics
        .into_iter()
        .map(|t| {
            let readable = may_read(&t.name);
            let partitions = t
                .partition_indexes
                .iter()
                .map(|&index| {
                    let answer = PartitionResponse::default().with_partition_index(index);
                    let found = match readable {
                        false => Err(error_code::TOPIC_AUTHORIZATION_FAILED),
                        true => producers(&t.name, index),
                    };
                    match found {
                        Ok(found) => answer.with_active_producers(found.iter().map(producer_state).collect()),
                        Err(code) => answer.with_error_code(code),
                    }
                })
                .collect();
            TopicResponse::default().with_name(t.name).with_partitions(partitions)
        })
        .collect();
    DescribeProducersResponse::default().with_topics(topics)
}

fn producer_state(p: &ProducerInfo) -> ProducerState {
    ProducerState::default()
        .with_producer_id(ProducerId(p.producer_id))
        .with_producer_epoch(i32::from(p.epoch))
        .with_last_sequence(p.last_sequence)
        .with_last_timestamp(p.last_timestamp)
        .with_coordinator_epoch(p.coordinator_epoch)
        .with_current_txn_start_offset(p.txn_start_offset.unwrap_or(-1))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use fjord_coord::registry::PartitionState;
    use fjord_coord::Store;
    use fjord_log::{Log, LogConfig};
    use fjord_record::{BatchBuilder, TopicPartition};
    use kafka_protocol::messages::describe_producers_request::TopicRequest;
    use kafka_protocol::messages::TopicName;
    use kafka_protocol::protocol::StrBytes;

    use super::*;
    use crate::replication::{PeerConfig, ReplicaManager, ReplicationConfig};

    fn request(topics: &[(&'static str, &[i32])]) -> DescribeProducersRequest {
        DescribeProducersRequest::default().with_topics(
            topics
                .iter()
                .map(|&(name, partitions)| {
                    TopicRequest::default()
                        .with_name(TopicName(StrBytes::from_static_str(name)))
                        .with_partition_indexes(partitions.to_vec())
                })
                .collect(),
        )
    }

    /// `(topic, partition, error, [(producer id, epoch, last sequence, txn start)])`.
    type Answer = (String, i32, i16, Vec<(i64, i32, i32, i64)>);

    fn answers(response: &DescribeProducersResponse) -> Vec<Answer> {
        response
            .topics
            .iter()
            .flat_map(|t| {
                t.partitions.iter().map(|p| {
                    let producers = p
                        .active_producers
                        .iter()
                        .map(|s| (s.producer_id.0, s.producer_epoch, s.last_sequence, s.current_txn_start_offset))
                        .collect();
                    (t.name.to_string(), p.partition_index, p.error_code, producers)
                })
            })
            .collect()
    }

    /// A batch of `records` from producer `id` at `epoch`, starting at `sequence`.
    fn batch(id: i64, epoch: i16, sequence: i32, records: usize, transactional: bool) -> Vec<u8> {
        let mut builder = BatchBuilder::new(1_000).producer(id, epoch, sequence);
        if transactional {
            builder = builder.transactional();
        }
        for _ in 0..records {
            builder.append(1_000, None, Some(b"v"), &[]);
        }
        builder.build_vec()
    }

    /// Without a broker or a socket: a real log (led by this replica manager) with an
    /// idempotent producer and a transactional one whose transaction is open.
    #[tokio::test]
    async fn reports_each_producers_state_and_kafkas_errors() {
        let dir = tempfile::tempdir().unwrap();
        let store: Store = Arc::new(fjord_coord::EmbeddedStore::open(&dir.path().join("meta")).unwrap());
        let manager = ReplicaManager::new(1, store, ReplicationConfig::default(), PeerConfig::plaintext("PLAINTEXT"));
        let tp = TopicPartition::new("t", 0);
        let log = Arc::new(Log::open(dir.path().join("t-0"), LogConfig::default()).unwrap());
        log.append(&mut batch(7, 2, 0, 3, false), 0).unwrap();
        log.append(&mut batch(7, 2, 3, 2, false), 0).unwrap();
        log.append(&mut batch(9, 0, 0, 1, true), 0).unwrap();
        manager.add_partition(&tp, log);
        manager.apply(&tp, &[1], &PartitionState { leader: 1, leader_epoch: 0, isr: vec![1], controller_epoch: 0 }, 0);
        let producers = |topic: &str, p: i32| match manager.get(&TopicPartition::new(topic, p)) {
            Some(replica) => Ok(replica.log.producers()),
            None => Err(error_code::UNKNOWN_TOPIC_OR_PARTITION),
        };

        let response = describe_producers(request(&[("t", &[0, 4]), ("u", &[0])]), |_| true, producers);
        assert_eq!(
            answers(&response),
            [
                ("t".to_string(), 0, 0, vec![(7, 2, 4, -1), (9, 0, 0, 5)]),
                ("t".to_string(), 4, error_code::UNKNOWN_TOPIC_OR_PARTITION, vec![]),
                ("u".to_string(), 0, error_code::UNKNOWN_TOPIC_OR_PARTITION, vec![]),
            ]
        );
        let denied = describe_producers(request(&[("t", &[0])]), |_| false, producers);
        assert_eq!(answers(&denied), [("t".to_string(), 0, error_code::TOPIC_AUTHORIZATION_FAILED, vec![])]);
    }
}
