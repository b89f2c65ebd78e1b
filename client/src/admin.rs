//! Topic administration, client quotas and offset lookups.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use kafka_protocol::messages::alter_client_quotas_request::{EntityData, EntryData, OpData};
use kafka_protocol::messages::alter_partition_reassignments_request::{ReassignablePartition, ReassignableTopic};
use kafka_protocol::messages::alter_replica_log_dirs_request::{AlterReplicaLogDir, AlterReplicaLogDirTopic};
use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::delete_records_request::{DeleteRecordsPartition, DeleteRecordsTopic};
use kafka_protocol::messages::delete_records_response::DeleteRecordsPartitionResult;
use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
use kafka_protocol::messages::describe_client_quotas_request::ComponentData;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::describe_log_dirs_request::DescribableLogDirTopic;
use kafka_protocol::messages::incremental_alter_configs_request::{AlterConfigsResource, AlterableConfig};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::list_offsets_response::ListOffsetsPartitionResponse;
use kafka_protocol::messages::{
    AlterClientQuotasRequest, AlterPartitionReassignmentsRequest, AlterReplicaLogDirsRequest, BrokerId, CreatePartitionsRequest,
    CreateTopicsRequest, DeleteRecordsRequest, DeleteRecordsResponse, DeleteTopicsRequest, DescribeClientQuotasRequest,
    DescribeConfigsRequest, DescribeLogDirsRequest, IncrementalAlterConfigsRequest, ListOffsetsRequest, ListOffsetsResponse,
    ListPartitionReassignmentsRequest, TopicName,
};
use kafka_protocol::protocol::{Request, StrBytes};

use crate::consumer::IsolationLevel;

use crate::cluster::{ClientConfig, Cluster, TopicMetadata};
use crate::error::{Error, Result};

/// ConfigResource type of a topic in DescribeConfigs/IncrementalAlterConfigs.
const TOPIC_RESOURCE: i8 = 2;
/// DescribeConfigs / AlterConfigs resource type BROKER.
const BROKER_RESOURCE: i8 = 4;

/// What a config change applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigResource {
    Topic(String),
    /// One broker's dynamic configs (sent to that broker, as Kafka's admin client does).
    Broker(i32),
}

/// Which offset ListOffsets should find.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetSpec {
    /// The log start offset.
    Earliest,
    /// The log end offset.
    Latest,
    /// The first offset whose timestamp is at or after this (ms); the log end when none.
    Timestamp(i64),
}

impl OffsetSpec {
    fn wire(self) -> i64 {
        match self {
            OffsetSpec::Earliest => -2,
            OffsetSpec::Latest => -1,
            OffsetSpec::Timestamp(ts) => ts,
        }
    }
}

/// A partition reassignment in progress (ListPartitionReassignments).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionReassignment {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Every replica now: the target ones first, then the original ones not in the target.
    pub replicas: Vec<i32>,
    /// Replicas being added.
    pub adding: Vec<i32>,
    /// Replicas being removed.
    pub removing: Vec<i32>,
}

/// One log dir of a broker, as DescribeLogDirs lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogDirDescription {
    /// Its path (one of the broker's `log.dirs`, as the broker names it).
    pub path: String,
    /// Whether the dir is offline (failed with an I/O error); it then lists no replicas.
    pub offline: bool,
    /// The replicas in it (of the partitions asked for).
    pub replicas: Vec<ReplicaLogDir>,
}

/// One replica in a log dir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaLogDir {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Bytes on disk.
    pub size: i64,
    /// Whether this is the copy an AlterReplicaLogDirs move is writing into this dir (the
    /// replica still serves from its current dir until the move completes).
    pub is_future: bool,
}

/// What to create.
#[derive(Debug, Clone)]
pub struct NewTopic {
    /// Name.
    pub name: String,
    /// Partition count; -1 for the broker's `num.partitions`.
    pub partitions: i32,
    /// Replication factor; -1 for the broker's default.
    pub replication_factor: i16,
    /// Topic config overrides (`retention.ms`, `cleanup.policy`, ...).
    pub configs: BTreeMap<String, String>,
}

impl NewTopic {
    /// A topic with `partitions` partitions and the broker's default replication.
    pub fn new(name: impl Into<String>, partitions: i32) -> Self {
        Self { name: name.into(), partitions, replication_factor: -1, configs: BTreeMap::new() }
    }
}

/// One config entry of a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigEntry {
    /// Key.
    pub name: String,
    /// Value (`None` when sensitive or unset).
    pub value: Option<String>,
    /// Whether it is the broker's default rather than a topic override.
    pub is_default: bool,
    /// Where the value comes from, by Kafka's DescribeConfigs `config_source` name
    /// (`DYNAMIC_TOPIC_CONFIG`, `STATIC_BROKER_CONFIG`, `DEFAULT_CONFIG`, ...).
    pub source: &'static str,
}

/// Kafka's name of a DescribeConfigs `config_source` code.
fn config_source_name(code: i8) -> &'static str {
    match code {
        1 => "DYNAMIC_TOPIC_CONFIG",
        2 => "DYNAMIC_BROKER_CONFIG",
        3 => "DYNAMIC_DEFAULT_BROKER_CONFIG",
        4 => "STATIC_BROKER_CONFIG",
        5 => "DEFAULT_CONFIG",
        6 => "DYNAMIC_BROKER_LOGGER_CONFIG",
        7 => "CLIENT_METRICS_CONFIG",
        8 => "GROUP_CONFIG",
        _ => "UNKNOWN",
    }
}

/// A user or client-id name in a client quota entity: one name, or the default
/// (`<default>` in Kafka's tools, a null name on the wire).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum QuotaName {
    /// The default for every user (or client id) without a quota of its own.
    Default,
    /// One user or client id.
    Named(String),
}

impl QuotaName {
    fn to_wire(&self) -> Option<StrBytes> {
        match self {
            QuotaName::Default => None,
            QuotaName::Named(name) => Some(StrBytes::from_string(name.clone())),
        }
    }

    fn from_wire(name: Option<&StrBytes>) -> Self {
        name.map_or(QuotaName::Default, |n| QuotaName::Named(n.to_string()))
    }
}

impl std::fmt::Display for QuotaName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QuotaName::Default => f.write_str("<default>"),
            QuotaName::Named(name) => f.write_str(name),
        }
    }
}

/// What a client quota is set on (Kafka's entity): a user, a client id, or both.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QuotaEntity {
    /// The `user` part.
    pub user: Option<QuotaName>,
    /// The `client-id` part.
    pub client_id: Option<QuotaName>,
}

impl QuotaEntity {
    fn parts(&self) -> impl Iterator<Item = (&'static str, &QuotaName)> {
        [("user", self.user.as_ref()), ("client-id", self.client_id.as_ref())].into_iter().filter_map(|(t, n)| Some((t, n?)))
    }
}

impl std::fmt::Display for QuotaEntity {
    /// As kafka-configs names it: `user 'alice', client-id '<default>'`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self.parts().map(|(t, n)| format!("{t} '{n}'")).collect();
        f.write_str(&parts.join(", "))
    }
}

/// The quotas of one entity (DescribeClientQuotas): key → value.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientQuota {
    /// Whom they apply to.
    pub entity: QuotaEntity,
    /// `producer_byte_rate`, `consumer_byte_rate`, `request_percentage` → value.
    pub values: BTreeMap<String, f64>,
}

/// Administration client.
pub struct Admin {
    pub(crate) cluster: Arc<Cluster>,
}

impl Admin {
    /// Connects to the cluster.
    pub async fn connect(config: ClientConfig) -> Result<Self> {
        let config = ClientConfig { allow_auto_create_topics: false, ..config };
        Ok(Self { cluster: Cluster::connect(config).await? })
    }

    /// Creates topics; fails on the first topic the broker refused.
    pub async fn create_topics(&self, topics: &[NewTopic]) -> Result<()> {
        let timeout = self.cluster.config().request_timeout.as_millis() as i32;
        let request = CreateTopicsRequest::default().with_timeout_ms(timeout).with_topics(
            topics
                .iter()
                .map(|t| {
                    CreatableTopic::default()
                        .with_name(topic_name(&t.name))
                        .with_num_partitions(t.partitions)
                        .with_replication_factor(t.replication_factor)
                        .with_configs(
                            t.configs
                                .iter()
                                .map(|(k, v)| {
                                    CreatableTopicConfig::default()
                                        .with_name(StrBytes::from_string(k.clone()))
                                        .with_value(Some(StrBytes::from_string(v.clone())))
                                })
                                .collect(),
                        )
                })
                .collect(),
        );
        let response = self.cluster.controller().await?.request(&request, 7).await?;
        for t in response.topics {
            Error::check_kafka(
                t.error_code,
                format!("create topic {}", t.name.0.as_str()),
                t.error_message.map(|m| m.to_string()),
            )?;
        }
        self.cluster.refresh(None).await?;
        Ok(())
    }

    /// Raises a topic's partition count to `count`, the new partitions placed by the
    /// broker (CreatePartitions).
    pub async fn create_partitions(&self, topic: &str, count: i32) -> Result<()> {
        let conn = self.cluster.controller().await?;
        let version = conn.version::<CreatePartitionsRequest>(3)?;
        let timeout = self.cluster.config().request_timeout.as_millis() as i32;
        let request =
            CreatePartitionsRequest::default().with_timeout_ms(timeout).with_topics(vec![CreatePartitionsTopic::default()
                .with_name(topic_name(topic))
                .with_count(count)
                .with_assignments(None)]);
        let response = conn.request_at(&request, version).await?;
        for r in response.results {
            Error::check_kafka(r.error_code, format!("add partitions to {topic}"), r.error_message.map(|m| m.to_string()))?;
        }
        self.cluster.refresh(Some(&[topic.to_string()])).await?;
        Ok(())
    }

    /// Starts moving each `(topic, partition)` to its replica list, or cancels its
    /// reassignment in progress (`None`), on the controller (AlterPartitionReassignments).
    /// Returns each partition's outcome; the replicas move afterwards
    /// ([`Admin::list_partition_reassignments`] shows them until done).
    pub async fn alter_partition_reassignments(
        &self,
        reassignments: &[(String, i32, Option<Vec<i32>>)],
    ) -> Result<Vec<((String, i32), Result<()>)>> {
        let mut topics: Vec<ReassignableTopic> = Vec::new();
        for (topic, partition, replicas) in reassignments {
            let partition = ReassignablePartition::default()
                .with_partition_index(*partition)
                .with_replicas(replicas.as_ref().map(|r| r.iter().map(|&b| BrokerId(b)).collect()));
            match topics.iter_mut().find(|t| t.name.0.as_str() == topic) {
                Some(t) => t.partitions.push(partition),
                None => topics.push(ReassignableTopic::default().with_name(topic_name(topic)).with_partitions(vec![partition])),
            }
        }
        let timeout = self.cluster.config().request_timeout.as_millis() as i32;
        let request = AlterPartitionReassignmentsRequest::default().with_timeout_ms(timeout).with_topics(topics);
        let response = self.cluster.controller().await?.request(&request, 0).await?;
        Error::check_kafka(response.error_code, "alter partition reassignments", response.error_message.map(|m| m.to_string()))?;
        Ok(response
            .responses
            .into_iter()
            .flat_map(|t| {
                let topic = t.name.0.to_string();
                t.partitions.into_iter().map(move |p| {
                    let context = format!("reassign {topic}-{}", p.partition_index);
                    let outcome = Error::check_kafka(p.error_code, context, p.error_message.map(|m| m.to_string()));
                    ((topic.clone(), p.partition_index), outcome)
                })
            })
            .collect())
    }

    /// Asks broker `broker` to move its replicas of each `(topic, partition)` into the
    /// log dir named beside it (AlterReplicaLogDirs). The broker answers at once and moves
    /// in the background: [`Admin::describe_log_dirs`] shows the replica in its new dir
    /// once done. Returns each partition's outcome (REPLICA_NOT_AVAILABLE while the broker
    /// holds no replica of it yet, e.g. early in a reassignment that adds it).
    pub async fn alter_replica_log_dirs(
        &self,
        broker: i32,
        replicas: &[(String, i32, String)],
    ) -> Result<Vec<((String, i32), Result<()>)>> {
        let mut dirs: Vec<AlterReplicaLogDir> = Vec::new();
        for (topic, partition, dir) in replicas {
            let entry = match dirs.iter_mut().position(|d| d.path.as_str() == dir) {
                Some(i) => &mut dirs[i],
                None => {
                    dirs.push(AlterReplicaLogDir::default().with_path(StrBytes::from_string(dir.clone())));
                    dirs.last_mut().expect("just pushed")
                }
            };
            match entry.topics.iter_mut().find(|t| t.name.0.as_str() == topic) {
                Some(t) => t.partitions.push(*partition),
                None => entry
                    .topics
                    .push(AlterReplicaLogDirTopic::default().with_name(topic_name(topic)).with_partitions(vec![*partition])),
            }
        }
        let request = AlterReplicaLogDirsRequest::default().with_dirs(dirs);
        let response = self.cluster.broker(broker).await?.request(&request, 2).await?;
        Ok(response
            .results
            .into_iter()
            .flat_map(|t| {
                let topic = t.topic_name.0.to_string();
                t.partitions.into_iter().map(move |p| {
                    let context =
                        format!("move the replica of {topic}-{} on broker {broker} to another log dir", p.partition_index);
                    let outcome = match Error::kafka(p.error_code, context, None) {
                        Some(e) => Err(e),
                        None => Ok(()),
                    };
                    ((topic.clone(), p.partition_index), outcome)
                })
            })
            .collect())
    }

    /// Broker `broker`'s log dirs, each with its replicas of `partitions`, or of every
    /// partition with an empty list (DescribeLogDirs).
    pub async fn describe_log_dirs(&self, broker: i32, partitions: &[(String, i32)]) -> Result<Vec<LogDirDescription>> {
        let topics = (!partitions.is_empty()).then(|| {
            let mut topics: Vec<DescribableLogDirTopic> = Vec::new();
            for (topic, partition) in partitions {
                match topics.iter_mut().find(|t| t.topic.0.as_str() == topic) {
                    Some(t) => t.partitions.push(*partition),
                    None => topics
                        .push(DescribableLogDirTopic::default().with_topic(topic_name(topic)).with_partitions(vec![*partition])),
                }
            }
            topics
        });
        let request = DescribeLogDirsRequest::default().with_topics(topics);
        let response = self.cluster.broker(broker).await?.request(&request, 4).await?;
        Error::check_kafka(response.error_code, format!("describe the log dirs of broker {broker}"), None)?;
        Ok(response
            .results
            .into_iter()
            .map(|dir| LogDirDescription {
                path: dir.log_dir.to_string(),
                offline: dir.error_code != 0,
                replicas: dir
                    .topics
                    .into_iter()
                    .flat_map(|t| {
                        let topic = t.name.0.to_string();
                        t.partitions.into_iter().map(move |p| ReplicaLogDir {
                            topic: topic.clone(),
                            partition: p.partition_index,
                            size: p.partition_size,
                            is_future: p.is_future_key,
                        })
                    })
                    .collect(),
            })
            .collect())
    }

    /// Every partition reassignment in progress (ListPartitionReassignments).
    pub async fn list_partition_reassignments(&self) -> Result<Vec<PartitionReassignment>> {
        let timeout = self.cluster.config().request_timeout.as_millis() as i32;
        let request = ListPartitionReassignmentsRequest::default().with_timeout_ms(timeout).with_topics(None);
        let response = self.cluster.controller().await?.request(&request, 0).await?;
        Error::check_kafka(response.error_code, "list partition reassignments", response.error_message.map(|m| m.to_string()))?;
        let ids = |v: Vec<BrokerId>| v.into_iter().map(|b| b.0).collect();
        Ok(response
            .topics
            .into_iter()
            .flat_map(|t| {
                let topic = t.name.0.to_string();
                t.partitions.into_iter().map(move |p| PartitionReassignment {
                    topic: topic.clone(),
                    partition: p.partition_index,
                    replicas: ids(p.replicas),
                    adding: ids(p.adding_replicas),
                    removing: ids(p.removing_replicas),
                })
            })
            .collect())
    }

    /// The client quotas whose entity has exactly the given parts (each a name or the
    /// default), as `kafka-configs --describe` shows one entity; every stored quota when
    /// neither part is given (DescribeClientQuotas).
    pub async fn describe_client_quotas(&self, entity: &QuotaEntity) -> Result<Vec<ClientQuota>> {
        let components = entity
            .parts()
            .map(|(entity_type, name)| {
                let (match_type, name) = match name {
                    QuotaName::Named(name) => (0, Some(StrBytes::from_string(name.clone()))),
                    QuotaName::Default => (1, None),
                };
                ComponentData::default()
                    .with_entity_type(StrBytes::from_static_str(entity_type))
                    .with_match_type(match_type)
                    .with_match(name)
            })
            .collect::<Vec<_>>();
        let strict = !components.is_empty();
        let request = DescribeClientQuotasRequest::default().with_components(components).with_strict(strict);
        let conn = self.cluster.controller().await?;
        let version = conn.version::<DescribeClientQuotasRequest>(1)?;
        let response = conn.request_at(&request, version).await?;
        Error::check_kafka(response.error_code, "describe client quotas", response.error_message.map(|m| m.to_string()))?;
        let mut quotas: Vec<ClientQuota> = response
            .entries
            .unwrap_or_default()
            .into_iter()
            .map(|entry| {
                let mut entity = QuotaEntity::default();
                for part in &entry.entity {
                    let name = QuotaName::from_wire(part.entity_name.as_ref());
                    match part.entity_type.as_str() {
                        "user" => entity.user = Some(name),
                        "client-id" => entity.client_id = Some(name),
                        _ => {}
                    }
                }
                let values = entry.values.into_iter().map(|v| (v.key.to_string(), v.value)).collect();
                ClientQuota { entity, values }
            })
            .collect();
        quotas.sort_by(|a, b| a.entity.cmp(&b.entity));
        Ok(quotas)
    }

    /// Sets the keys of `set` and removes those of `remove` on the quotas of `entity`
    /// (AlterClientQuotas); with `validate_only` the broker only checks them.
    pub async fn alter_client_quotas(
        &self,
        entity: &QuotaEntity,
        set: &BTreeMap<String, f64>,
        remove: &[String],
        validate_only: bool,
    ) -> Result<()> {
        let parts = entity
            .parts()
            .map(|(t, n)| EntityData::default().with_entity_type(StrBytes::from_static_str(t)).with_entity_name(n.to_wire()));
        let ops = set
            .iter()
            .map(|(key, value)| OpData::default().with_key(StrBytes::from_string(key.clone())).with_value(*value))
            .chain(remove.iter().map(|key| OpData::default().with_key(StrBytes::from_string(key.clone())).with_remove(true)));
        let request = AlterClientQuotasRequest::default()
            .with_entries(vec![EntryData::default().with_entity(parts.collect()).with_ops(ops.collect())])
            .with_validate_only(validate_only);
        let conn = self.cluster.controller().await?;
        let version = conn.version::<AlterClientQuotasRequest>(1)?;
        let response = conn.request_at(&request, version).await?;
        for entry in response.entries {
            let context = format!("alter the client quotas of {entity}");
            Error::check_kafka(entry.error_code, context, entry.error_message.map(|m| m.to_string()))?;
        }
        Ok(())
    }

    /// Deletes topics.
    pub async fn delete_topics(&self, names: &[String]) -> Result<()> {
        let conn = self.cluster.controller().await?;
        let version = conn.version::<DeleteTopicsRequest>(6)?;
        let timeout = self.cluster.config().request_timeout.as_millis() as i32;
        let mut request = DeleteTopicsRequest::default().with_timeout_ms(timeout);
        // v6 names topics in `topics` (name or id); older versions in `topic_names`.
        if version >= 6 {
            request.topics = names.iter().map(|n| DeleteTopicState::default().with_name(Some(topic_name(n)))).collect();
        } else {
            request.topic_names = names.iter().map(|n| topic_name(n)).collect();
        }
        let response = conn.request_at(&request, version).await?;
        for r in response.responses {
            let name = r.name.map(|n| n.0.to_string()).unwrap_or_default();
            Error::check_kafka(r.error_code, format!("delete topic {name}"), r.error_message.map(|m| m.to_string()))?;
        }
        self.cluster.refresh(None).await?;
        Ok(())
    }

    /// The cluster as metadata describes it now: brokers, the controller and every topic.
    pub async fn metadata(&self) -> Result<Arc<crate::Metadata>> {
        self.cluster.refresh(None).await
    }

    /// Every topic, sorted by name.
    pub async fn list_topics(&self) -> Result<Vec<Arc<TopicMetadata>>> {
        let md = self.cluster.refresh(None).await?;
        let mut topics: Vec<_> = md.topics.values().cloned().collect();
        topics.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(topics)
    }

    /// One topic's partitions, leaders, replicas and ISR.
    pub async fn describe_topic(&self, name: &str) -> Result<Arc<TopicMetadata>> {
        self.cluster.refresh(Some(&[name.to_string()])).await?;
        self.cluster.metadata().topics.get(name).cloned().ok_or_else(|| Error::UnknownTopic(name.to_string()))
    }

    /// A topic's configuration as the broker sees it.
    pub async fn describe_configs(&self, topic: &str) -> Result<Vec<ConfigEntry>> {
        let mut all = self.describe_topics_configs(&[topic.to_string()], None).await?;
        all.pop().map(|(_, entries)| entries).unwrap_or_else(|| Ok(Vec::new()))
    }

    /// The configuration of several topics in one DescribeConfigs request, each topic's
    /// entries (or its own error) in the order asked; `keys` limits the entries returned
    /// (`None`: all of them).
    pub async fn describe_topics_configs(
        &self,
        topics: &[String],
        keys: Option<&[&str]>,
    ) -> Result<Vec<(String, Result<Vec<ConfigEntry>>)>> {
        let keys: Option<Vec<StrBytes>> = keys.map(|k| k.iter().map(|k| StrBytes::from_string(k.to_string())).collect());
        let request = DescribeConfigsRequest::default().with_resources(
            topics
                .iter()
                .map(|topic| {
                    DescribeConfigsResource::default()
                        .with_resource_type(TOPIC_RESOURCE)
                        .with_resource_name(StrBytes::from_string(topic.clone()))
                        .with_configuration_keys(keys.clone())
                })
                .collect(),
        );
        let response = self.cluster.any_broker().await?.request(&request, 4).await?;
        let mut out = Vec::with_capacity(response.results.len());
        for r in response.results {
            let topic = r.resource_name.to_string();
            if let Some(e) =
                Error::kafka(r.error_code, format!("describe configs of {topic}"), r.error_message.map(|m| m.to_string()))
            {
                out.push((topic, Err(e)));
                continue;
            }
            // config_source 5 = DEFAULT_CONFIG (v1+); v0 has is_default, decoded into the same field.
            let mut entries: Vec<ConfigEntry> = r
                .configs
                .into_iter()
                .map(|c| ConfigEntry {
                    name: c.name.to_string(),
                    value: c.value.map(|v| v.to_string()),
                    is_default: c.config_source == 5 || c.config_source == 4,
                    source: config_source_name(c.config_source),
                })
                .collect();
            entries.sort_by(|a, b| a.name.cmp(&b.name));
            out.push((topic, Ok(entries)));
        }
        Ok(out)
    }

    /// Sets topic config overrides (IncrementalAlterConfigs, operation SET).
    pub async fn alter_configs(&self, topic: &str, configs: &BTreeMap<String, String>) -> Result<()> {
        let request = IncrementalAlterConfigsRequest::default().with_resources(vec![AlterConfigsResource::default()
            .with_resource_type(TOPIC_RESOURCE)
            .with_resource_name(StrBytes::from_string(topic.to_string()))
            .with_configs(
                configs
                    .iter()
                    .map(|(k, v)| {
                        AlterableConfig::default()
                            .with_name(StrBytes::from_string(k.clone()))
                            .with_config_operation(0)
                            .with_value(Some(StrBytes::from_string(v.clone())))
                    })
                    .collect(),
            )]);
        let response = self.cluster.controller().await?.request(&request, 1).await?;
        for r in response.responses {
            Error::check_kafka(r.error_code, format!("alter configs of {topic}"), r.error_message.map(|m| m.to_string()))?;
        }
        Ok(())
    }

    /// Sets (`Some`) or deletes (`None`, back to the default) configs of a topic or a
    /// broker (IncrementalAlterConfigs, operations SET and DELETE).
    pub async fn incremental_alter_configs(&self, resource: &ConfigResource, changes: &[(String, Option<String>)]) -> Result<()> {
        let (kind, name, conn) = match resource {
            ConfigResource::Topic(topic) => (TOPIC_RESOURCE, topic.clone(), self.cluster.controller().await?),
            ConfigResource::Broker(id) => (BROKER_RESOURCE, id.to_string(), self.cluster.broker(*id).await?),
        };
        let configs = changes
            .iter()
            .map(|(key, value)| {
                AlterableConfig::default()
                    .with_name(StrBytes::from_string(key.clone()))
                    .with_config_operation(if value.is_some() { 0 } else { 1 })
                    .with_value(value.clone().map(StrBytes::from_string))
            })
            .collect();
        let request = IncrementalAlterConfigsRequest::default().with_resources(vec![AlterConfigsResource::default()
            .with_resource_type(kind)
            .with_resource_name(StrBytes::from_string(name.clone()))
            .with_configs(configs)]);
        let response = conn.request(&request, 1).await?;
        for r in response.responses {
            let context = match resource {
                ConfigResource::Topic(topic) => format!("alter configs of {topic}"),
                ConfigResource::Broker(id) => format!("alter configs of broker {id}"),
            };
            Error::check_kafka(r.error_code, context, r.error_message.map(|m| m.to_string()))?;
        }
        Ok(())
    }

    /// Deletes the records below an offset of each `(topic, partition, offset)`
    /// (DeleteRecords v2, asked of each partition's leader): the partition's log start
    /// moves up to `offset`, or to the high watermark when `offset` is -1, as Kafka's
    /// `deleteRecords`. One result per partition, in the order given: its new log start
    /// (low watermark), or the error its leader answered (OFFSET_OUT_OF_RANGE for an
    /// offset beyond the high watermark) or that finding its leader gave.
    pub async fn delete_records(&self, partitions: &[(String, i32, i64)]) -> Vec<Result<i64>> {
        let timeout_ms = i32::try_from(self.cluster.config().request_timeout.as_millis()).unwrap_or(i32::MAX);
        let request_for = |topics: Vec<(&str, Vec<usize>)>| {
            let topic_of = |(topic, indexes): (&str, Vec<usize>)| {
                let partition_of = |i: usize| {
                    let (_, partition, offset) = &partitions[i];
                    DeleteRecordsPartition::default().with_partition_index(*partition).with_offset(*offset)
                };
                DeleteRecordsTopic::default()
                    .with_name(topic_name(topic))
                    .with_partitions(indexes.into_iter().map(partition_of).collect())
            };
            DeleteRecordsRequest::default().with_timeout_ms(timeout_ms).with_topics(topics.into_iter().map(topic_of).collect())
        };
        let answers_in = |response: &DeleteRecordsResponse| {
            let answer_of = |p: &DeleteRecordsPartitionResult| (p.partition_index, p.error_code, p.low_watermark);
            PartitionAnswer::all_in(&response.topics, |t| (&t.name, t.partitions.as_slice()), answer_of)
        };
        let asked = partitions.iter().enumerate().map(|(i, (topic, partition, _))| (i, topic.as_str(), *partition)).collect();
        let answered =
            ask_each_leader(&self.cluster, asked, 2, request_for, answers_in, "delete records", "DeleteRecords result").await;
        let mut out: Vec<Option<Result<i64>>> = partitions.iter().map(|_| None).collect();
        for (i, result) in answered {
            out[i] = Some(result);
        }
        out.into_iter().map(|r| r.expect("invariant: every partition was answered")).collect()
    }

    /// Offsets of partitions per `spec`, in the order asked.
    pub async fn list_offsets(&self, partitions: &[(String, i32, OffsetSpec)]) -> Result<Vec<i64>> {
        list_offsets(&self.cluster, partitions).await
    }

    /// [`Admin::list_offsets`] at an isolation level: with read_committed, the latest
    /// offset is the last stable offset.
    pub async fn list_offsets_at(&self, partitions: &[(String, i32, OffsetSpec)], isolation: IsolationLevel) -> Result<Vec<i64>> {
        list_offsets_at(&self.cluster, partitions, isolation).await
    }
}

fn topic_name(name: &str) -> TopicName {
    TopicName(StrBytes::from_string(name.to_string()))
}

/// ListOffsets for several partitions, each asked of its leader, in the order given.
/// A timestamp with no record at or after it gives the log end offset.
///
/// A leader that moved (NOT_LEADER_OR_FOLLOWER, a broker gone, no leader yet) is found
/// again: the metadata is refreshed and the partitions still unanswered are asked again
/// after `retry.backoff.ms`, as the producer and the consumer do, until
/// `request.timeout.ms` has passed since the call began; then the last error is returned.
pub(crate) async fn list_offsets(cluster: &Cluster, partitions: &[(String, i32, OffsetSpec)]) -> Result<Vec<i64>> {
    list_offsets_at(cluster, partitions, IsolationLevel::ReadUncommitted).await
}

/// [`list_offsets`] at an isolation level: with read_committed, the latest offset is the
/// last stable offset (the first offset of the earliest transaction not yet decided).
pub(crate) async fn list_offsets_at(
    cluster: &Cluster,
    partitions: &[(String, i32, OffsetSpec)],
    isolation: IsolationLevel,
) -> Result<Vec<i64>> {
    let deadline = Instant::now() + cluster.config().request_timeout;
    let mut out: Vec<Option<i64>> = vec![None; partitions.len()];
    loop {
        match ask_leaders(cluster, partitions, isolation, &mut out).await {
            Ok(()) => break,
            Err(e) if e.is_retriable() && Instant::now() < deadline => {
                tracing::debug!(error = %e, "list offsets failed; retrying");
                if e.needs_metadata_refresh() {
                    // A failed refresh leaves the old metadata: the retry fails again and
                    // is retried until the deadline.
                    if let Err(e) = cluster.refresh(None).await {
                        tracing::debug!(error = %e, "metadata refresh for list offsets failed");
                    }
                }
                tokio::time::sleep(cluster.config().retry_backoff).await;
            }
            Err(e) => return Err(e),
        }
    }
    let mut out: Vec<i64> = out.into_iter().map(|o| o.expect("invariant: ask_leaders answered every partition")).collect();
    let past_end: Vec<(String, i32, OffsetSpec)> = partitions
        .iter()
        .zip(&out)
        .filter(|((_, _, spec), offset)| **offset < 0 && matches!(spec, OffsetSpec::Timestamp(_)))
        .map(|((topic, partition, _), _)| (topic.clone(), *partition, OffsetSpec::Latest))
        .collect();
    if !past_end.is_empty() {
        let ends = Box::pin(list_offsets(cluster, &past_end)).await?;
        for ((topic, partition, _), end) in past_end.iter().zip(ends) {
            let i = partitions.iter().position(|(t, p, _)| t == topic && p == partition).expect("asked above");
            out[i] = end;
        }
    }
    Ok(out)
}

/// One round of ListOffsets: every partition without an answer in `out` is asked of the
/// leader the metadata names. Each leader is asked even when another failed, so a retry
/// asks only the partitions still unanswered; an error is returned per [`keep_worst`].
async fn ask_leaders(
    cluster: &Cluster,
    partitions: &[(String, i32, OffsetSpec)],
    isolation: IsolationLevel,
    out: &mut [Option<i64>],
) -> Result<()> {
    let request_for = |topics: Vec<(&str, Vec<usize>)>| {
        let topic_of = |(topic, indexes): (&str, Vec<usize>)| {
            let partition_of = |i: usize| {
                let (_, partition, spec) = &partitions[i];
                ListOffsetsPartition::default()
                    .with_partition_index(*partition)
                    .with_timestamp(spec.wire())
                    .with_current_leader_epoch(-1)
            };
            ListOffsetsTopic::default()
                .with_name(topic_name(topic))
                .with_partitions(indexes.into_iter().map(partition_of).collect())
        };
        ListOffsetsRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_isolation_level(isolation as i8)
            .with_topics(topics.into_iter().map(topic_of).collect())
    };
    let answers_in = |response: &ListOffsetsResponse| {
        let answer_of = |p: &ListOffsetsPartitionResponse| (p.partition_index, p.error_code, p.offset);
        PartitionAnswer::all_in(&response.topics, |t| (&t.name, t.partitions.as_slice()), answer_of)
    };
    let asked = partitions
        .iter()
        .enumerate()
        .filter(|(i, _)| out[*i].is_none())
        .map(|(i, (topic, partition, _))| (i, topic.as_str(), *partition))
        .collect();
    let mut error = None;
    for (i, result) in ask_each_leader(cluster, asked, 7, request_for, answers_in, "list offsets", "offset").await {
        match result {
            Ok(offset) => out[i] = Some(offset),
            // A partition that got an error keeps `None`, to be asked again.
            Err(e) => keep_worst(&mut error, e),
        }
    }
    error.map_or(Ok(()), Err)
}

/// Keeps the first error, unless a later one is not retriable: one partition that can
/// never be answered ends the call at once, however many others wait for a leader.
fn keep_worst(kept: &mut Option<Error>, e: Error) {
    if kept.as_ref().is_none_or(|k| k.is_retriable() && !e.is_retriable()) {
        *kept = Some(e);
    }
}

/// One partition's answer in a response that answers per topic and partition (DeleteRecords,
/// ListOffsets), for [`ask_each_leader`] to pick out.
struct PartitionAnswer<T> {
    topic: TopicName,
    partition: i32,
    error_code: i16,
    /// What the partition answered; meaningful only when `error_code` is 0.
    value: T,
}

impl<T> PartitionAnswer<T> {
    /// Every partition's answer in a response's `topics`: `open` gives a topic's name and
    /// partitions, `answer_of` a partition's (index, error code, value).
    fn all_in<Topic, Partition>(
        topics: &[Topic],
        open: impl Fn(&Topic) -> (&TopicName, &[Partition]),
        answer_of: impl Fn(&Partition) -> (i32, i16, T),
    ) -> Vec<Self> {
        let mut all = Vec::new();
        for topic in topics {
            let (name, partitions) = open(topic);
            for p in partitions {
                let (partition, error_code, value) = answer_of(p);
                all.push(PartitionAnswer { topic: name.clone(), partition, error_code, value });
            }
        }
        all
    }
}

/// Asks each leader once for all of its partitions in `asked` (`(index, topic, partition)`),
/// as Kafka's admin client does for requests that only a partition's leader can answer.
///
/// `request_for` builds one leader's request from its partitions grouped by topic (topics
/// in the order first asked, each with the indexes of its partitions); `answers_in` lists a
/// response's per-partition answers. `action` and `answer` name the request in errors
/// ("{action} of t-p" for an error code, "no {answer} for t-p" when the response leaves a
/// partition out).
///
/// One result per index: the partition's value, or the error its leader answered for it,
/// or the error that finding or asking its leader gave (each of a leader's partitions gets
/// a copy). Partitions whose leader could not be found come first, then each leader's in
/// the order asked.
async fn ask_each_leader<'a, R: Request, T: Clone>(
    cluster: &Cluster,
    asked: Vec<(usize, &'a str, i32)>,
    version: i16,
    request_for: impl Fn(Vec<(&'a str, Vec<usize>)>) -> R,
    answers_in: impl Fn(&R::Response) -> Vec<PartitionAnswer<T>>,
    action: &str,
    answer: &str,
) -> Vec<(usize, Result<T>)> {
    let mut out = Vec::with_capacity(asked.len());
    let mut by_leader: HashMap<i32, Vec<(usize, &'a str, i32)>> = HashMap::new();
    for (i, topic, partition) in asked {
        match cluster.leader(topic, partition).await {
            Ok(leader) => by_leader.entry(leader).or_default().push((i, topic, partition)),
            Err(e) => out.push((i, Err(e))),
        }
    }
    for (leader, led) in by_leader {
        let mut topics: Vec<(&str, Vec<usize>)> = Vec::new();
        for &(i, topic, _) in &led {
            match topics.iter_mut().find(|(t, _)| *t == topic) {
                Some((_, indexes)) => indexes.push(i),
                None => topics.push((topic, vec![i])),
            }
        }
        let request = request_for(topics);
        let response = match cluster.broker(leader).await {
            Ok(broker) => broker.request(&request, version).await,
            Err(e) => Err(e),
        };
        let answers = match response {
            Ok(response) => answers_in(&response),
            Err(e) => {
                // The leader could not be asked: each of its partitions gets the error.
                out.extend(led.iter().map(|&(i, _, _)| (i, Err(e.clone()))));
                continue;
            }
        };
        for (i, topic, partition) in led {
            let result = match answers.iter().find(|a| *a.topic.0 == *topic && a.partition == partition) {
                None => Err(Error::Protocol {
                    broker: format!("broker {leader}"),
                    detail: format!("no {answer} for {topic}-{partition}"),
                }),
                Some(found) => Error::check_kafka(found.error_code, format!("{action} of {topic}-{partition}"), None)
                    .map(|()| found.value.clone()),
            };
            out.push((i, result));
        }
    }
    out
}
