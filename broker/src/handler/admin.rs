//! CreateTopics and DeleteTopics, and what the config APIs share (DescribeConfigs is
//! `describe_configs`).

use std::collections::BTreeMap;

use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::{
    CreateTopicsRequest, CreateTopicsResponse, DeleteTopicsRequest, DeleteTopicsResponse, ResponseKind, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use crate::codec::error_code;
use crate::connection::Session;
use crate::handler::Broker;
use crate::topics::{Layout, TopicError};
use fjord_auth::{Operation, Resource};

/// DescribeConfigs (and AlterConfigs) resource types.
pub(super) const RESOURCE_TOPIC: i8 = 2;
pub(super) const RESOURCE_BROKER: i8 = 4;
/// DescribeConfigs config types (v3+).
pub(super) const TYPE_STRING: i8 = 2;
pub(super) const TYPE_INT: i8 = 3;
pub(super) const TYPE_LONG: i8 = 5;
pub(super) const TYPE_DOUBLE: i8 = 6;
pub(super) const TYPE_LIST: i8 = 7;

impl Broker {
    pub(crate) async fn create_topics(&self, request: CreateTopicsRequest, version: i16, session: &Session) -> ResponseKind {
        let mut results = Vec::with_capacity(request.topics.len());
        for topic in request.topics {
            let name = topic.name.0.to_string();
            let mut result = CreatableTopicResult::default().with_name(topic.name.clone());
            if !self.may_create_topic(session, &name) {
                results.push(result.with_error_code(error_code::TOPIC_AUTHORIZATION_FAILED));
                continue;
            }
            let layout = if !topic.assignments.is_empty() {
                // Kafka: with an assignment, num_partitions and replication_factor are -1.
                if topic.num_partitions != -1 || topic.replication_factor != -1 {
                    results.push(result.with_error_code(error_code::INVALID_REQUEST).with_error_message(Some(
                        StrBytes::from_static_str("both a replica assignment and numPartitions or replicationFactor"),
                    )));
                    continue;
                }
                let mut assignments = topic.assignments;
                assignments.sort_by_key(|a| a.partition_index);
                if assignments.iter().enumerate().any(|(i, a)| a.partition_index != i as i32) {
                    results.push(
                        result
                            .with_error_code(error_code::INVALID_REPLICA_ASSIGNMENT)
                            .with_error_message(Some(StrBytes::from_static_str("partitions must be numbered 0..n, each once"))),
                    );
                    continue;
                }
                Layout::Manual(assignments.into_iter().map(|a| a.broker_ids.into_iter().map(|b| b.0).collect()).collect())
            } else {
                Layout::Spread {
                    partitions: if topic.num_partitions == -1 { self.config.num_partitions } else { topic.num_partitions },
                    replication_factor: if topic.replication_factor == -1 {
                        self.config.default_replication_factor
                    } else {
                        topic.replication_factor
                    },
                }
            };
            let overrides: BTreeMap<String, String> =
                topic.configs.into_iter().filter_map(|c| Some((c.name.to_string(), c.value?.to_string()))).collect();
            // validate_only checks the same limits and builds no assignment.
            // A validate_only answer has no id: no topic was made (Kafka: the nil id).
            let outcome = match request.validate_only {
                true => {
                    let counts = layout.counts();
                    self.topics.validate(&name, &layout, &overrides).await.map(|()| (counts, uuid::Uuid::nil()))
                }
                false => self.topics.create(&name, layout, overrides).await.map(|created| {
                    ((created.partition_count(), created.replicas.first().map_or(0, Vec::len) as i16), created.topic_id)
                }),
            };
            match outcome {
                Ok(((partitions, replication_factor), topic_id)) => {
                    if version >= 5 {
                        result = result.with_num_partitions(partitions).with_replication_factor(replication_factor);
                    }
                    // v7+ (KIP-516); the codec leaves it out of older versions.
                    result = result.with_topic_id(topic_id);
                }
                Err(e) => {
                    if let TopicError::Internal(e) = &e {
                        tracing::error!(topic = %name, error = %e, "creating topic failed");
                    }
                    result = result.with_error_code(e.code()).with_error_message(Some(StrBytes::from_string(e.to_string())));
                }
            }
            results.push(result);
        }
        ResponseKind::CreateTopics(CreateTopicsResponse::default().with_topics(results))
    }

    pub(crate) async fn delete_topics(&self, request: DeleteTopicsRequest, version: i16, session: &Session) -> ResponseKind {
        let nil = uuid::Uuid::nil();
        let named: Vec<(Option<TopicName>, uuid::Uuid)> = if version >= 6 {
            request.topics.into_iter().map(|t| (t.name, t.topic_id)).collect()
        } else {
            request.topic_names.into_iter().map(|n| (Some(n), nil)).collect()
        };
        let mut responses = Vec::with_capacity(named.len());
        for (name, id) in named {
            // v6 names a topic by name or by id (KIP-516), never both (Kafka:
            // INVALID_REQUEST). By id, the name is the view's; the delete checks the id
            // against the store, so a topic created again under that name is kept.
            let (name, expected_id, topic_id) = match (name, id.is_nil()) {
                (Some(name), true) => {
                    let id = self.topics.get(&name.0).map_or(nil, |t| t.topic_id);
                    (Some(name), None, id)
                }
                (None, false) => {
                    let topic = self.topics.view().topic_by_id(&id);
                    (topic.map(|t| TopicName(StrBytes::from_string(t.name.clone()))), Some(id), id)
                }
                (name, _) => {
                    responses.push(
                        DeletableTopicResult::default()
                            .with_name(name)
                            .with_topic_id(id)
                            .with_error_code(error_code::INVALID_REQUEST)
                            .with_error_message(Some(StrBytes::from_static_str("name the topic by name or by id, not both"))),
                    );
                    continue;
                }
            };
            let mut result = DeletableTopicResult::default().with_name(name.clone()).with_topic_id(topic_id);
            let outcome = match &name {
                Some(name) if !self.authorize(session, Operation::Delete, Resource::topic(&name.0)) => {
                    // By id, the name the client did not give is not told (Kafka).
                    if expected_id.is_some() {
                        result = result.with_name(None);
                    }
                    Err(TopicError::Unauthorized)
                }
                Some(name) => self.topics.delete(&name.0, expected_id).await,
                None => Err(TopicError::UnknownId),
            };
            responses.push(match outcome {
                Ok(()) => result,
                Err(e) => {
                    if let TopicError::Internal(e) = &e {
                        tracing::error!(topic = ?name, error = %e, "deleting topic failed");
                    }
                    let result = result.with_error_code(e.code());
                    if version >= 5 {
                        result.with_error_message(Some(StrBytes::from_string(e.to_string())))
                    } else {
                        result
                    }
                }
            });
        }
        ResponseKind::DeleteTopics(DeleteTopicsResponse::default().with_responses(responses))
    }

    /// Whether the client may `operation` (DescribeConfigs, AlterConfigs) the config
    /// resource: a topic's configs are the topic's, a broker's the cluster's; the error
    /// code to answer when not.
    pub(crate) fn authorize_config(&self, session: &Session, operation: Operation, kind: i8, name: &str) -> Result<(), i16> {
        match kind {
            RESOURCE_TOPIC if !self.authorize(session, operation, Resource::topic(name)) => {
                Err(error_code::TOPIC_AUTHORIZATION_FAILED)
            }
            RESOURCE_TOPIC => Ok(()),
            _ if !self.authorize(session, operation, Resource::cluster()) => Err(error_code::CLUSTER_AUTHORIZATION_FAILED),
            _ => Ok(()),
        }
    }
}
