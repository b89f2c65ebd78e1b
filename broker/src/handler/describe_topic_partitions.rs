//! DescribeTopicPartitions (API 75, v0, KIP-966): Metadata's topic and partition answer,
//! paged. Kafka's admin client (3.8+) describes topics with it, so a topic with thousands
//! of partitions comes back in pages rather than one huge Metadata response.
//!
//! As Kafka serves it:
//! - no topics named means every topic the principal may Describe; named topics the
//!   principal may not Describe are answered TOPIC_AUTHORIZATION_FAILED with a zero topic
//!   id (after the others), and named topics that do not exist UNKNOWN_TOPIC_OR_PARTITION
//!   (INVALID_TOPIC_EXCEPTION for an invalid name). Nothing is auto-created.
//! - topics go in name order, starting at the cursor's topic (and its partition, when that
//!   topic may be described); a cursor naming a topic outside the named list is
//!   INVALID_REQUEST.
//! - at most `response_partition_limit` partitions (and never more than 2000, Kafka's
//!   `max.request.partition.size.limit` default) are answered; `next_cursor` then names
//!   the first partition left out (a topic's first partition when the previous topic filled
//!   the page exactly), and is null when nothing is left.
//! - each partition has Metadata's leader, leader epoch, replicas, ISR and offline
//!   replicas; eligible leader replicas and last known ELR are empty, since this cluster
//!   has no ELR (KIP-966's leader election from them is a KRaft controller feature).

use kafka_protocol::messages::describe_topic_partitions_response::{
    Cursor, DescribeTopicPartitionsResponsePartition, DescribeTopicPartitionsResponseTopic,
};
use kafka_protocol::messages::{DescribeTopicPartitionsRequest, DescribeTopicPartitionsResponse, ResponseKind, TopicName};
use kafka_protocol::protocol::StrBytes;

use crate::codec::error_code;
use crate::connection::Session;
use crate::handler::Broker;
use crate::topics::{is_internal, validate_topic_name};
use fjord_auth::{Operation, Resource};

/// Kafka's `max.request.partition.size.limit` default: the most partitions one response
/// holds, whatever the request asks for.
const MAX_PARTITIONS_PER_RESPONSE: i32 = 2000;

impl Broker {
    pub(crate) fn describe_topic_partitions(&self, request: DescribeTopicPartitionsRequest, session: &Session) -> ResponseKind {
        let describe = |name: &str| self.authorize(session, Operation::Describe, Resource::topic(name));
        let topic_response = |name: &str, code: i16| {
            DescribeTopicPartitionsResponseTopic::default()
                .with_name(Some(TopicName(StrBytes::from_string(name.to_owned()))))
                .with_error_code(code)
                .with_is_internal(is_internal(name))
        };
        let cursor = request.cursor.map(|c| (c.topic_name.0.to_string(), c.partition_index));
        let cursor_topic = cursor.as_ref().map_or("", |(topic, _)| topic.as_str());
        let all_topics = request.topics.is_empty();
        let mut names: Vec<String> = if all_topics {
            self.topics.list().iter().map(|t| t.name.clone()).collect()
        } else {
            request.topics.iter().map(|t| t.name.0.to_string()).collect()
        };
        // Topics before the cursor's were answered on earlier pages.
        names.retain(|name| name.as_str() >= cursor_topic);
        names.sort();
        names.dedup();
        if !all_topics && cursor.is_some() && !names.iter().any(|n| n == cursor_topic) {
            // Kafka rejects the request; its error response answers every named topic so.
            let topics = request.topics.iter().map(|t| topic_response(t.name.0.as_str(), error_code::INVALID_REQUEST)).collect();
            return ResponseKind::DescribeTopicPartitions(DescribeTopicPartitionsResponse::default().with_topics(topics));
        }
        let (authorized, unauthorized): (Vec<String>, Vec<String>) = names.into_iter().partition(|name| describe(name));
        // A cursor into a topic the principal may not describe starts that topic over.
        let first_partition = match &cursor {
            Some((topic, partition)) if describe(topic) => *partition,
            _ => 0,
        };

        let live = self.live_broker_ids(session.listener.name.as_str());
        let mut remaining = request.response_partition_limit.min(MAX_PARTITIONS_PER_RESPONSE);
        let mut topics = Vec::new();
        let mut next_cursor = None;
        for name in authorized {
            if remaining <= 0 {
                // The previous topic filled the page: this one starts the next.
                if remaining == 0 {
                    next_cursor = Some(Cursor::default().with_topic_name(TopicName(StrBytes::from_string(name))));
                }
                break;
            }
            let Some(topic) = self.topics.get(&name) else {
                // Listing every topic, one deleted meanwhile is left out (Kafka).
                if !all_topics {
                    let code = match validate_topic_name(&name) {
                        Ok(()) => error_code::UNKNOWN_TOPIC_OR_PARTITION,
                        Err(e) => e.code(),
                    };
                    topics.push(
                        topic_response(&name, code)
                            .with_topic_authorized_operations(self.authorized_operations(session, Resource::topic(&name))),
                    );
                }
                continue;
            };
            let start = if name == cursor_topic { first_partition.max(0) } else { 0 };
            let metadata = self.topic_metadata(&topic, &live);
            let mut page: Vec<DescribeTopicPartitionsResponsePartition> = Vec::new();
            for p in metadata.partitions.into_iter().skip(start as usize) {
                if page.len() as i32 == remaining {
                    next_cursor = Some(
                        Cursor::default()
                            .with_topic_name(TopicName(StrBytes::from_string(name.clone())))
                            .with_partition_index(p.partition_index),
                    );
                    break;
                }
                page.push(
                    DescribeTopicPartitionsResponsePartition::default()
                        .with_error_code(p.error_code)
                        .with_partition_index(p.partition_index)
                        .with_leader_id(p.leader_id)
                        .with_leader_epoch(p.leader_epoch)
                        .with_replica_nodes(p.replica_nodes)
                        .with_isr_nodes(p.isr_nodes)
                        .with_eligible_leader_replicas(Some(Vec::new()))
                        .with_last_known_elr(Some(Vec::new()))
                        .with_offline_replicas(p.offline_replicas),
                );
            }
            remaining -= page.len() as i32;
            topics.push(
                topic_response(&name, error_code::NONE)
                    .with_topic_id(topic.topic_id)
                    .with_partitions(page)
                    .with_topic_authorized_operations(self.authorized_operations(session, Resource::topic(&name))),
            );
            if next_cursor.is_some() {
                break;
            }
        }
        // Kafka says nothing more of a topic the principal may not describe: no topic id, not
        // internal, not whether it exists.
        topics.extend(
            unauthorized
                .iter()
                .filter(|_| !all_topics)
                .map(|name| topic_response(name, error_code::TOPIC_AUTHORIZATION_FAILED).with_is_internal(false)),
        );
        ResponseKind::DescribeTopicPartitions(
            DescribeTopicPartitionsResponse::default().with_topics(topics).with_next_cursor(next_cursor),
        )
    }
}
