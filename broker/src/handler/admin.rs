//! CreateTopics, DeleteTopics and DescribeConfigs.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::Duration;

use fjord_log::LogConfig;
use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::describe_configs_response::{DescribeConfigsResourceResult, DescribeConfigsResult};
use kafka_protocol::messages::{
    CreateTopicsRequest, CreateTopicsResponse, DeleteTopicsRequest, DeleteTopicsResponse, DescribeConfigsRequest,
    DescribeConfigsResponse, ResponseKind, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use super::broker_configs;
use crate::codec::error_code;
use crate::connection::Session;
use crate::handler::Broker;
use crate::topics::{Layout, TopicError};
use fjord_auth::{Operation, Resource};

/// DescribeConfigs (and AlterConfigs) resource types.
pub(super) const RESOURCE_TOPIC: i8 = 2;
pub(super) const RESOURCE_BROKER: i8 = 4;
/// This broker's dynamic configs and the cluster default's (`/config/brokers/...`).
type DynamicConfigs = (BTreeMap<String, String>, BTreeMap<String, String>);
/// DescribeConfigs config sources.
const SOURCE_DYNAMIC_TOPIC: i8 = 1;
const SOURCE_DYNAMIC_BROKER: i8 = 2;
const SOURCE_DYNAMIC_DEFAULT_BROKER: i8 = 3;
const SOURCE_STATIC_BROKER: i8 = 4;
const SOURCE_DEFAULT: i8 = 5;
/// DescribeConfigs config types (v3+).
const TYPE_BOOLEAN: i8 = 1;
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
            let outcome = match request.validate_only {
                true => {
                    let counts = layout.counts();
                    self.topics.validate(&name, &layout, &overrides).await.map(|()| counts)
                }
                false => self
                    .topics
                    .create(&name, layout, overrides)
                    .await
                    .map(|created| (created.partition_count(), created.replicas.first().map_or(0, Vec::len) as i16)),
            };
            match outcome {
                Ok((partitions, replication_factor)) => {
                    if version >= 5 {
                        result = result.with_num_partitions(partitions).with_replication_factor(replication_factor);
                    }
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
        let names: Vec<Option<TopicName>> = if version >= 6 {
            request.topics.into_iter().map(|t| t.name).collect()
        } else {
            request.topic_names.into_iter().map(Some).collect()
        };
        let mut responses = Vec::with_capacity(names.len());
        for name in names {
            let result = DeletableTopicResult::default().with_name(name.clone());
            // v6 may name topics by id; this broker has no topic ids.
            let outcome = match &name {
                Some(name) if !self.authorize(session, Operation::Delete, Resource::topic(&name.0)) => {
                    Err(TopicError::Unauthorized)
                }
                Some(name) => self.topics.delete(&name.0).await,
                None => Err(TopicError::Unknown),
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

    pub(crate) async fn describe_configs(&self, request: DescribeConfigsRequest, session: &Session) -> ResponseKind {
        // The dynamic broker configs (this broker's and the cluster default), read once
        // and only when a broker resource is described.
        let dynamic = if request.resources.iter().any(|r| r.resource_type == RESOURCE_BROKER) {
            self.dynamic_broker_configs().await
        } else {
            Ok(Default::default())
        };
        let results = request
            .resources
            .into_iter()
            .map(|resource| {
                let result = DescribeConfigsResult::default()
                    .with_resource_type(resource.resource_type)
                    .with_resource_name(resource.resource_name.clone());
                let access =
                    self.authorize_config(session, Operation::DescribeConfigs, resource.resource_type, &resource.resource_name);
                if let Err(code) = access {
                    return result.with_error_code(code);
                }
                let entries: Vec<(Cow<'static, str>, String, i8, i8)> = match resource.resource_type {
                    RESOURCE_TOPIC => match self.topics.get(&resource.resource_name) {
                        Some(topic) => log_config_entries(&topic.config)
                            .into_iter()
                            .chain([("unclean.leader.election.enable", topic.unclean_leader_election.to_string(), TYPE_BOOLEAN)])
                            .map(|(name, value, config_type)| {
                                let source =
                                    if topic.overrides.contains_key(name) { SOURCE_DYNAMIC_TOPIC } else { SOURCE_DEFAULT };
                                (Cow::Borrowed(name), value, config_type, source)
                            })
                            .collect(),
                        None => return result.with_error_code(error_code::UNKNOWN_TOPIC_OR_PARTITION),
                    },
                    RESOURCE_BROKER => {
                        match (&dynamic, broker_configs::node_name(&resource.resource_name, self.config.broker_id)) {
                            (Ok((own, default)), Ok(node)) => {
                                let dynamic = |configs: &BTreeMap<String, String>, source| {
                                    configs
                                        .iter()
                                        .map(move |(k, v)| {
                                            (Cow::Owned(k.clone()), v.clone(), broker_configs::config_type(k), source)
                                        })
                                        .collect::<Vec<_>>()
                                };
                                if node == broker_configs::DEFAULT_RESOURCE {
                                    // Kafka describes only the cluster-wide dynamic configs here.
                                    dynamic(default, SOURCE_DYNAMIC_DEFAULT_BROKER)
                                } else {
                                    // This broker's own dynamic value wins over the default's.
                                    let mut entries = dynamic(own, SOURCE_DYNAMIC_BROKER);
                                    entries.extend(
                                        dynamic(default, SOURCE_DYNAMIC_DEFAULT_BROKER)
                                            .into_iter()
                                            .filter(|(k, ..)| !own.contains_key(k.as_ref())),
                                    );
                                    entries.extend(
                                        self.broker_entries().into_iter().map(|(k, v, t, s)| (Cow::Borrowed(k), v, t, s)),
                                    );
                                    entries
                                }
                            }
                            (Err(code), Ok(_)) => return result.with_error_code(*code),
                            (_, Err((code, message))) => {
                                return result.with_error_code(code).with_error_message(Some(StrBytes::from_string(message)))
                            }
                        }
                    }
                    _ => {
                        return result
                            .with_error_code(error_code::INVALID_REQUEST)
                            .with_error_message(Some(StrBytes::from_static_str("unknown resource")))
                    }
                };
                let wanted = resource.configuration_keys;
                let configs = entries
                    .into_iter()
                    .filter(|(name, ..)| wanted.as_ref().is_none_or(|keys| keys.iter().any(|k| k.as_str() == name.as_ref())))
                    .map(|(name, value, config_type, source)| {
                        DescribeConfigsResourceResult::default()
                            .with_name(match name {
                                Cow::Borrowed(name) => StrBytes::from_static_str(name),
                                Cow::Owned(name) => StrBytes::from_string(name),
                            })
                            .with_value(Some(StrBytes::from_string(value)))
                            .with_config_source(source)
                            .with_config_type(config_type)
                    })
                    .collect();
                result.with_configs(configs)
            })
            .collect();
        ResponseKind::DescribeConfigs(DescribeConfigsResponse::default().with_results(results))
    }

    /// This broker's dynamic configs and the cluster default's, from the metadata store;
    /// the error code to answer when it cannot be read.
    async fn dynamic_broker_configs(&self) -> Result<DynamicConfigs, i16> {
        let store = &**self.topics.store();
        let read = |node: String| async move { broker_configs::read(store, &node).await.map(|(configs, _)| configs) };
        let own = read(self.config.broker_id.to_string()).await;
        let default = read(broker_configs::DEFAULT_RESOURCE.to_owned()).await;
        match (own, default) {
            (Ok(own), Ok(default)) => Ok((own, default)),
            (Err(e), _) | (_, Err(e)) => {
                tracing::error!(error = %e, "reading the dynamic broker configs failed");
                Err(error_code::UNKNOWN_SERVER_ERROR)
            }
        }
    }

    fn broker_entries(&self) -> Vec<(&'static str, String, i8, i8)> {
        let c = &self.config;
        let mut entries = vec![
            ("broker.id", c.broker_id.to_string(), TYPE_INT, SOURCE_STATIC_BROKER),
            ("num.partitions", c.num_partitions.to_string(), TYPE_INT, SOURCE_STATIC_BROKER),
            ("default.replication.factor", c.default_replication_factor.to_string(), TYPE_INT, SOURCE_STATIC_BROKER),
            ("unclean.leader.election.enable", c.unclean_leader_election.to_string(), TYPE_BOOLEAN, SOURCE_STATIC_BROKER),
            ("controlled.shutdown.enable", c.controlled_shutdown.to_string(), TYPE_BOOLEAN, SOURCE_STATIC_BROKER),
            ("auto.leader.rebalance.enable", c.auto_leader_rebalance.to_string(), TYPE_BOOLEAN, SOURCE_STATIC_BROKER),
            (
                "leader.imbalance.check.interval.seconds",
                c.leader_imbalance_check_interval.as_secs().to_string(),
                TYPE_LONG,
                SOURCE_STATIC_BROKER,
            ),
            (
                "leader.imbalance.per.broker.percentage",
                c.leader_imbalance_per_broker_percentage.to_string(),
                TYPE_INT,
                SOURCE_STATIC_BROKER,
            ),
            ("auto.create.topics.enable", c.auto_create_topics.to_string(), TYPE_BOOLEAN, SOURCE_STATIC_BROKER),
            ("max.partitions.per.request", c.max_partitions_per_request.to_string(), TYPE_INT, SOURCE_STATIC_BROKER),
            (
                "max.partitions.per.broker",
                self.topics.limits().per_broker.to_string(),
                TYPE_INT,
                // Derived from the open-file limit unless set.
                if c.max_partitions_per_broker.is_some() { SOURCE_STATIC_BROKER } else { SOURCE_DEFAULT },
            ),
            ("socket.request.max.bytes", c.socket_request_max_bytes.to_string(), TYPE_INT, SOURCE_STATIC_BROKER),
            ("log.dirs", c.log_dir.display().to_string(), TYPE_STRING, SOURCE_STATIC_BROKER),
        ];
        entries.extend(
            log_config_entries(&c.log)
                .into_iter()
                .map(|(name, value, config_type)| (name, value, config_type, SOURCE_STATIC_BROKER)),
        );
        entries
    }
}

/// A topic's effective config under Kafka's names and value syntax ("none" is -1 for
/// retention, Long.MAX for flush and roll settings, as Kafka shows them).
fn log_config_entries(c: &LogConfig) -> Vec<(&'static str, String, i8)> {
    fn ms(d: Option<Duration>, none: i64) -> String {
        d.map_or(none, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)).to_string()
    }
    vec![
        ("cleanup.policy", c.cleanup_policy.as_str().to_owned(), TYPE_LIST),
        ("segment.bytes", c.segment_bytes.to_string(), TYPE_INT),
        ("segment.ms", ms(c.segment_ms, i64::MAX), TYPE_LONG),
        ("segment.index.bytes", c.segment_index_bytes.to_string(), TYPE_INT),
        ("index.interval.bytes", c.index_interval_bytes.to_string(), TYPE_INT),
        ("retention.ms", ms(c.retention_ms, -1), TYPE_LONG),
        ("retention.bytes", c.retention_bytes.map_or(-1, |b| b as i64).to_string(), TYPE_LONG),
        ("flush.messages", c.flush_messages.map_or(i64::MAX, |m| m as i64).to_string(), TYPE_LONG),
        ("flush.ms", ms(c.flush_ms, i64::MAX), TYPE_LONG),
        ("max.message.bytes", c.max_message_bytes.to_string(), TYPE_INT),
        ("file.delete.delay.ms", ms(Some(c.file_delete_delay), 0), TYPE_LONG),
        ("delete.retention.ms", ms(Some(c.delete_retention), 0), TYPE_LONG),
        ("min.cleanable.dirty.ratio", c.min_cleanable_dirty_ratio.to_string(), TYPE_DOUBLE),
        ("min.compaction.lag.ms", ms(Some(c.min_compaction_lag), 0), TYPE_LONG),
        ("min.insync.replicas", c.min_insync_replicas.to_string(), TYPE_INT),
        ("compression.type", c.compression_type.as_str().to_owned(), TYPE_STRING),
        ("message.timestamp.type", c.message_timestamp_type.as_str().to_owned(), TYPE_STRING),
        ("max.compaction.lag.ms", ms(c.max_compaction_lag, i64::MAX), TYPE_LONG),
    ]
}
