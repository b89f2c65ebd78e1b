//! DeleteRecords: moves partitions' log start offsets up on their leader
//! ([`fjord_log::Log::delete_records_before`]); consumers from the beginning and
//! ListOffsets earliest then start there.

use kafka_protocol::messages::delete_records_response::{DeleteRecordsPartitionResult, DeleteRecordsTopicResult};
use kafka_protocol::messages::{DeleteRecordsRequest, DeleteRecordsResponse, ResponseKind};

use fjord_auth::{Operation, Resource};

use crate::codec::error_code;
use crate::connection::Session;
use crate::handler::{log_error_code, Broker};

/// The offset that asks for everything below the high watermark to go.
const HIGH_WATERMARK: i64 = -1;

impl Broker {
    pub(crate) fn delete_records(&self, request: DeleteRecordsRequest, session: &Session) -> ResponseKind {
        let mut moved = false;
        let topics = request
            .topics
            .into_iter()
            .map(|t| {
                // Kafka: Delete on the topic.
                let allowed = self.authorize(session, Operation::Delete, Resource::topic(&t.name.0));
                let topic = self.topics.get(&t.name.0);
                let partitions = t
                    .partitions
                    .into_iter()
                    .map(|p| {
                        let result =
                            DeleteRecordsPartitionResult::default().with_partition_index(p.partition_index).with_low_watermark(-1);
                        let partition = match &topic {
                            _ if !allowed => Err(error_code::TOPIC_AUTHORIZATION_FAILED),
                            Some(topic) => self.replica(topic, p.partition_index),
                            None => Err(error_code::UNKNOWN_TOPIC_OR_PARTITION),
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
        // The new starts are durable before the client hears of them.
        if moved {
            if let Err(e) = self.topics.logs().checkpoint() {
                tracing::error!(error = %e, "writing the log start offset checkpoint failed");
            }
        }
        ResponseKind::DeleteRecords(DeleteRecordsResponse::default().with_topics(topics))
    }
}
