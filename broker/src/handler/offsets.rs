//! ListOffsets: earliest, latest, the first offset at or after a timestamp, or the
//! record with the largest timestamp. "Latest" is the high watermark, or with
//! `isolation_level=1` (read_committed) the last stable offset, where such a consumer's
//! data ends.

use kafka_protocol::messages::list_offsets_response::{ListOffsetsPartitionResponse, ListOffsetsTopicResponse};
use kafka_protocol::messages::{ListOffsetsRequest, ListOffsetsResponse, ResponseKind};

use crate::codec::error_code;
use crate::connection::Session;
use crate::handler::{log_error_code, Broker};
use fjord_auth::{Operation, Resource};

/// `timestamp` value asking for the offset the next record will get (the high watermark).
const LATEST: i64 = -1;
/// `timestamp` value asking for the log start offset.
const EARLIEST: i64 = -2;
/// `timestamp` value asking for the record with the largest timestamp (KIP-734, v7).
const MAX_TIMESTAMP: i64 = -3;

impl Broker {
    pub(crate) fn list_offsets(&self, request: ListOffsetsRequest, version: i16, session: &Session) -> ResponseKind {
        let read_committed = request.isolation_level == 1;
        let topics = request
            .topics
            .into_iter()
            .map(|t| {
                // Kafka: Describe on the topic.
                let allowed = self.authorize(session, Operation::Describe, Resource::topic(&t.name.0));
                let topic = self.topics.get(&t.name.0);
                let partitions = t
                    .partitions
                    .into_iter()
                    .map(|p| {
                        let mut response = ListOffsetsPartitionResponse::default()
                            .with_partition_index(p.partition_index)
                            .with_timestamp(-1)
                            .with_offset(-1);
                        let partition = match &topic {
                            _ if !allowed => Err(error_code::TOPIC_AUTHORIZATION_FAILED),
                            Some(topic) => self.replica(topic, p.partition_index),
                            None => Err(error_code::UNKNOWN_TOPIC_OR_PARTITION),
                        };
                        let partition = match partition {
                            Ok(partition) => partition,
                            Err(code) => return response.with_error_code(code),
                        };
                        // Offsets come from the leader only (followers' high watermarks lag).
                        let leader_epoch = match partition.check_leader(p.current_leader_epoch) {
                            Ok(epoch) => epoch,
                            Err(code) => return response.with_error_code(code),
                        };
                        if version >= 4 {
                            response = response.with_leader_epoch(leader_epoch);
                        }
                        let log = &partition.log;
                        match p.timestamp {
                            LATEST => match partition.latest_offset(read_committed) {
                                Ok(offset) => response.with_offset(offset),
                                Err(code) => response.with_error_code(code),
                            },
                            EARLIEST => response.with_offset(log.log_start_offset()),
                            ts if ts >= 0 => match log.offset_for_timestamp(ts) {
                                Ok(Some((offset, timestamp))) => response.with_offset(offset).with_timestamp(timestamp),
                                Ok(None) => response,
                                Err(e) => response.with_error_code(log_error_code(&e)),
                            },
                            MAX_TIMESTAMP => match log.offset_of_max_timestamp() {
                                Ok(Some((offset, timestamp))) => response.with_offset(offset).with_timestamp(timestamp),
                                Ok(None) => response,
                                Err(e) => response.with_error_code(log_error_code(&e)),
                            },
                            // Anything else negative (-4 and -5 ask for tiered storage).
                            _ => response.with_error_code(error_code::INVALID_REQUEST),
                        }
                    })
                    .collect();
                ListOffsetsTopicResponse::default().with_name(t.name).with_partitions(partitions)
            })
            .collect();
        ResponseKind::ListOffsets(ListOffsetsResponse::default().with_topics(topics))
    }
}
